//! A new replica does not judge before it has looked (issue 14, part 6): `/readyz` waits for the
//! first etcd sweep, so during a rollout of the guard itself the old replica keeps answering
//! until the new one knows every member's health. Real 3-member etcd (TLS, loopback), one member
//! frozen before `serve` starts; the API-server stand-in holds the Cluster and its Machines.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use quorumguard_cli::server::{self, Running, ServeConfig};
use quorumguard_engine::{EtcdState, Health};
use quorumguard_observe::etcd::sweep::SweepConfig;
use serde_json::json;
use testkit::apiserver::ApiServer;
use testkit::etcd::EtcdCluster;
use testkit::https::{TempDir, TestPki, try_get_plain};
use testkit::reviews::{NS, fixture};
use testkit::seed::{self, KCP, machine};

const READYZ_SWEEP: &str =
    "first etcd sweep not finished: workload clusters known at start not all probed yet";

/// The health the webhook's state holds for member `name` of cluster `test`.
fn health_of(running: &Running, name: &str) -> Option<Health> {
    match running
        .state
        .control_plane(NS, KCP, Instant::now())
        .ok()?
        .etcd
    {
        EtcdState::Observed(s) => s
            .members
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.health.clone()),
        EtcdState::Unknown { .. } => None,
    }
}

/// serve over `etcd` with `sweep` changed by `tweak`.
fn config(pki: &TestPki, tweak: impl FnOnce(&mut SweepConfig)) -> ServeConfig {
    let mut c = testkit::guard::serve_config(
        pki,
        Duration::from_millis(500),
        Duration::from_secs(30),
        None,
    );
    if let Some(s) = c.sweep.as_mut() {
        tweak(s);
    }
    c
}

/// Polls `/readyz` every 20 ms until it answers 200 (at most `bound`); returns the 503 bodies
/// seen before, and when it turned ready.
async fn until_ready(running: &Running, bound: Duration) -> (Vec<String>, Instant) {
    let started = Instant::now();
    let mut not_ready = Vec::new();
    for _ in 0..(bound.as_millis() / 20) {
        match try_get_plain(running.admin_addr, "/readyz").await {
            Ok((StatusCode::OK, _)) => return (not_ready, Instant::now()),
            Ok((_, body)) => {
                if not_ready.last() != Some(&body) {
                    not_ready.push(body);
                }
            }
            Err(_) => {}
        }
        assert!(
            started.elapsed() < bound,
            "not ready within {bound:?}: {not_ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not ready within {bound:?}: {not_ready:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_is_not_ready_until_its_first_probe_has_seen_the_cluster() {
    let mut etcd = EtcdCluster::start(3);
    let api = ApiServer::start().await.expect("stand-in");
    let members = seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |_| {});
    etcd.freeze(2);
    let dir = TempDir::new("ready");
    let pki = TestPki::new(dir.path());
    let running = server::start(config(&pki, |_| {}), api.client().expect("client"))
        .await
        .expect("start");
    let started = Instant::now();
    let (waited, ready_at) = until_ready(&running, Duration::from_secs(30)).await;
    // It waited for the sweep itself, not only for the caches: a 503 naming only the sweep.
    assert!(
        waited.iter().any(|b| b.trim() == READYZ_SWEEP),
        "no 503 for the sweep alone: {waited:?}"
    );
    // When it turned ready, its first probe had seen the frozen member (and confirmed it).
    let frozen = &members[2];
    let seen = health_of(&running, frozen);
    assert!(
        matches!(seen, Some(Health::Unhealthy(_))),
        "ready {:?} after start, with the frozen member's health {seen:?}",
        ready_at - started
    );
    // So a person's deletion of a healthy Machine is judged on that health: it would lose quorum
    // (not HealthUnknown, as a replica that had not looked would answer).
    let mut r = fixture("machine-delete-by-user.json");
    r["request"]["name"] = json!(format!("test-{}", members[0]));
    r["request"]["userInfo"]["username"] = json!("jane@example.com");
    r["request"]["oldObject"] = machine(&members[0]);
    assert_eq!(
        testkit::guard::verdict(&running, &pki, "/validate/machines", &r).await,
        (false, "WouldLoseQuorum".into())
    );
    println!(
        "ready {:?} after start (first sweep with a frozen member); 503 bodies: {waited:?}",
        ready_at - started
    );
    running.shutdown().await;
    etcd.thaw(2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_stops_waiting_after_the_first_sweep_timeout() {
    let mut etcd = EtcdCluster::start(3);
    let api = ApiServer::start().await.expect("stand-in");
    seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |_| {});
    etcd.freeze(2);
    let dir = TempDir::new("ready-timeout");
    let pki = TestPki::new(dir.path());
    // The first sweep takes the probe deadline (1 s) for the frozen member, twice (it is
    // confirmed): longer than this timeout.
    let timeout = Duration::from_millis(300);
    let running = server::start(
        config(&pki, |s| s.first_sweep_timeout = timeout),
        api.client().expect("client"),
    )
    .await
    .expect("start");
    let (_, ready_at) = until_ready(&running, Duration::from_secs(20)).await;
    let unprobed = format!("quorumguard_etcd_unprobed{{namespace=\"{NS}\",cluster=\"test\"}} 1");
    let (_, metrics) = try_get_plain(running.admin_addr, "/metrics")
        .await
        .expect("metrics");
    assert!(
        metrics.contains(&unprobed),
        "ready before the first sweep ended, the cluster is exported as unprobed: {metrics}"
    );
    assert!(
        health_of(&running, "m3").is_none_or(|h| !h.is_healthy()),
        "the frozen member is not taken for healthy"
    );
    // Once probed, the series goes.
    let deadline = ready_at + Duration::from_secs(15);
    for round in 0.. {
        let (_, metrics) = try_get_plain(running.admin_addr, "/metrics")
            .await
            .expect("metrics");
        if !metrics.contains("quorumguard_etcd_unprobed{") {
            break;
        }
        assert!(
            Instant::now() < deadline && round < 150,
            "still unprobed: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.shutdown().await;
    etcd.thaw(2);
}
