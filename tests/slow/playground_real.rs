//! The playground on a real kube-apiserver (`quorumguard playground --real-apiserver`): the
//! default story (`upgrade-stuck`, cluster-api #2651) with the same expectations as on the
//! stand-in, and then what the real server itself holds: the KCP's conditions read back through
//! its API, the person's Machine delete refused (403) in its audit log, every admission call
//! the timeline shows made by kube-apiserver through the recording relay.
//!
//! Then `preflight`'s prediction against what the simulated KCP did, for two starting states
//! (healthy, a member frozen), as tests/slow/playground/prediction.rs does on the stand-in.
//!
//! Skipped (one printed line) without `KUBEBUILDER_ASSETS`, required with
//! `QUORUMGUARD_REQUIRE_ENVTEST` (crates/testkit/src/envtest.rs). Also: asking for the real server
//! without its binaries fails at once with exit status 2 and says what is missing.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use kube::api::{Api, DynamicObject};
use quorumguard::playground::apiserver::kcp_resource;
use quorumguard::playground::prediction::check_prediction;
use quorumguard::playground::realapi::Assets;
use quorumguard::playground::scenarios;
use quorumguard::playground::timeline::{Sink, Timeline};
use quorumguard::playground::world::{
    HUMAN, KCP, NAMESPACE, NEW_VERSION, RealApiPlan, Start, World, WorldOptions, kcp_controller,
};
use serde_json::Value;
use testkit::envtest::{self, capi_crds_dir};
use testkit::https::TempDir;

/// The playground's world on a real kube-apiserver with `assets`, in `dir`.
async fn real_world(assets: Assets, dir: &TempDir) -> Arc<World> {
    let options = WorldOptions {
        real_api: Some(RealApiPlan {
            assets,
            crds: capi_crds_dir(),
        }),
        ..WorldOptions::new(dir.path().to_path_buf())
    };
    Arc::new(
        World::start(options, |_| {})
            .await
            .expect("the playground starts on the real API server"),
    )
}

#[test]
fn upgrade_stuck_on_a_real_apiserver() {
    let Some(assets) = envtest::assets("upgrade_stuck_on_a_real_apiserver") else {
        return;
    };
    // The API server's slot before the etcd slot, as every test that holds both takes them
    // (real_apiserver's with_etcd): one order, no deadlock between two tests in this binary.
    let _apiserver = envtest::slot();
    let _etcd = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new("pg-real");
        let started = Instant::now();
        let world = real_world(assets, &dir).await;
        assert!(world.api.stand_in().is_none());
        let before = world.webhooks.call_count();
        let tl = Timeline::new(Sink::Memory);
        scenarios::run(Arc::clone(&world), &tl, "upgrade-stuck")
            .await
            .unwrap_or_else(|e| panic!("upgrade-stuck: {e}\n{}", tl.text()));
        println!("{}", tl.text());
        println!(
            "start and story took {:.1}s",
            started.elapsed().as_secs_f64()
        );
        let failed: Vec<_> = tl.checks().into_iter().filter(|c| !c.ok).collect();
        assert!(
            failed.is_empty() && tl.all_held(),
            "expectations failed: {failed:#?}"
        );

        // The calls kube-apiserver made, as serve answered them.
        let calls = world.webhooks.calls_since(before);
        let human: Vec<_> = calls
            .iter()
            .filter(|c| c.user == HUMAN && c.resource == "machines")
            .collect();
        assert_eq!(human.len(), 1, "one manual delete: {calls:#?}");
        assert!(!human[0].allowed && human[0].code == 403, "{:?}", human[0]);
        let controller: Vec<_> = calls
            .iter()
            .filter(|c| c.user == kcp_controller() && c.resource == "machines")
            .collect();
        assert_eq!(
            controller.len(),
            3,
            "the three old Machines deleted: {calls:#?}"
        );
        assert!(controller.iter().all(|c| c.allowed), "{controller:?}");

        // What the real server stores: the KCP's conditions, read through its API.
        let real = match &world.api {
            quorumguard::playground::world::Backend::Real(real) => real,
            _ => unreachable!("checked above"),
        };
        let kcps: Api<DynamicObject> = Api::namespaced_with(
            real.admin_client().expect("client"),
            NAMESPACE,
            &kcp_resource(),
        );
        let kcp = kcps.get(KCP).await.expect("the KCP");
        assert_eq!(kcp.data["spec"]["version"], NEW_VERSION);
        let condition = |t: &str| -> Value {
            kcp.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == t)
                .cloned()
                .unwrap_or_else(|| panic!("no {t} condition on the stored KCP: {:#}", kcp.data))
        };
        assert_eq!(condition("quorumguard.io/EtcdQuorum")["reason"], "Healthy");
        assert_eq!(condition("quorumguard.io/NextAction")["reason"], "None");

        // kube-apiserver's own record: the person's delete refused with 403.
        let audit = real
            .with_api(|r| std::fs::read_to_string(&r.audit_log))
            .expect("audit log");
        let refused = audit
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| {
                e["verb"] == "delete"
                    && e["objectRef"]["resource"] == "machines"
                    && e["impersonatedUser"]["username"] == HUMAN
                    && e["responseStatus"]["code"] == 403
            })
            .count();
        assert!(
            refused >= 1,
            "no refused delete by {HUMAN} in the audit log"
        );
        world.shutdown().await;
    });
}

#[test]
fn real_apiserver_without_its_binaries_says_what_is_missing() {
    let out = Command::new(env!("CARGO_BIN_EXE_quorumguard"))
        .args(["playground", "--real-apiserver"])
        .env_remove("KUBEBUILDER_ASSETS")
        .output()
        .expect("run quorumguard");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("KUBEBUILDER_ASSETS is not set") && stderr.contains("setup-envtest"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing started: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `preflight`'s prediction against what the simulated KCP did, on the real kube-apiserver
/// (the objects pass the CRDs' schemas, kube-apiserver calls the webhook, the server stamps the
/// Machines' creation times): as tests/slow/playground/prediction.rs does on the stand-in.
fn prediction_on_a_real_apiserver(test: &str, start: Start) {
    let Some(assets) = envtest::assets(test) else {
        return;
    };
    // The API server's slot before the etcd slot, as every test that holds both takes them
    // (real_apiserver's with_etcd): one order, no deadlock between two tests in this binary.
    let _apiserver = envtest::slot();
    let _etcd = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new("pg-real-predict");
        let world = real_world(assets, &dir).await;
        if let Err(e) = check_prediction(&world, test, start).await {
            panic!("{e}");
        }
    });
}

#[test]
fn prediction_healthy_on_a_real_apiserver() {
    prediction_on_a_real_apiserver("prediction_healthy_on_a_real_apiserver", Start::Healthy);
}

#[test]
fn prediction_member_frozen_on_a_real_apiserver() {
    prediction_on_a_real_apiserver(
        "prediction_member_frozen_on_a_real_apiserver",
        Start::MemberFrozen,
    );
}
