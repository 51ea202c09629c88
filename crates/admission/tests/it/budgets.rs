//! The budgets CI holds on the review path and on etcd (issue 39), counted, never timed; the
//! figures, and why each is what it is, are in crates/testkit/src/budgets.rs (docs/development.md,
//! "Budgets"):
//!
//! - heap allocations per review, through the webhook's router (the HTTP handler without the
//!   network: decode, decide, reserve, answer, metrics), counted by this binary's global
//!   allocator on the thread that runs the review;
//! - copies of cached objects per review (`quorumguard_observe::state::clones`);
//! - etcd requests per probe, per steady sweep and per review that takes a fresh probe, counted
//!   by a real 3-member etcd itself (`grpc_server_started_total`), and API requests per steady
//!   sweep and per fresh probe, counted by the API-server stand-in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{Request, header};
use quorumguard_admission::review::{self, Endpoint};
use quorumguard_admission::{ReviewReason, Webhook};
use quorumguard_engine::{EtcdState, Health, Policy, Reason};
use quorumguard_observe::etcd::fresh::FreshProbes;
use quorumguard_observe::etcd::sweep::{Probers, SweepConfig, sweep_once};
use quorumguard_observe::etcd::{Prober, TransportKind};
use quorumguard_observe::state::clones;
use quorumguard_telemetry::Metrics;
use serde_json::{Value, json};
use testkit::apiserver::ApiServer;
use testkit::budgets::{
    self, API_REQUESTS_PER_FRESH_PROBE, API_REQUESTS_PER_STEADY_SWEEP, CountingAllocator, Ledger,
    allocations_in, cached_copies_per_decision, etcd_requests_per_probe,
};
use testkit::etcd::{EtcdCluster, grpc_delta};
use testkit::reviews::{KCP_CONTROLLER, NS, fixture, with_managed_fields};
use testkit::seed;
use tower::ServiceExt;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Fresh webhooks each review kind is measured on (each warmed first): every one must hold.
const ROUNDS: usize = 5;

/// The fixture control plane's Machines (testkit::webhook::fixture_control_plane).
const MACHINES: u64 = 3;

/// One kind of review, as kube-apiserver sends it, and its budget.
struct Case {
    what: &'static str,
    path: &'static str,
    /// The review itself, and the same review as a dry run (the warm-up: the same verdict and
    /// metric labels, nothing reserved).
    body: Bytes,
    dry_run: Bytes,
    allowed: bool,
    allocations: u64,
}

/// Machine `test-cp-a`'s DELETE review by `user`, grown to 10 KB with managedFields.
fn machine_delete(user: &str, dry_run: bool) -> Bytes {
    let mut r = fixture("machine-delete-by-user.json");
    r["request"]["userInfo"]["username"] = json!(user);
    r["request"]["dryRun"] = json!(dry_run);
    Bytes::from(with_managed_fields(r, 10 * 1024))
}

/// A person's scale of the KCP from 3 to 5 replicas through `/scale`.
fn kcp_scale(dry_run: bool) -> Bytes {
    let mut r = fixture("kcp-scale-subresource-3-to-5.json");
    r["request"]["dryRun"] = json!(dry_run);
    Bytes::from(serde_json::to_vec(&r).expect("json"))
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            what: "10 KB Machine DELETE by a person",
            path: "/validate/machines",
            body: machine_delete("jane@example.com", false),
            dry_run: machine_delete("jane@example.com", true),
            allowed: false,
            allocations: budgets::REVIEW_ALLOCATIONS_MACHINE_DELETE_10K,
        },
        Case {
            what: "10 KB Machine DELETE by the KCP controller",
            path: "/validate/machines",
            body: machine_delete(KCP_CONTROLLER, false),
            dry_run: machine_delete(KCP_CONTROLLER, true),
            allowed: true,
            allocations: budgets::REVIEW_ALLOCATIONS_MACHINE_DELETE_10K_BY_KCP,
        },
        Case {
            what: "KCP scale 3 to 5 through /scale",
            path: "/validate/kubeadmcontrolplanes",
            body: kcp_scale(false),
            dry_run: kcp_scale(true),
            allowed: true,
            allocations: budgets::REVIEW_ALLOCATIONS_KCP_SCALE,
        },
    ]
}

fn request(path: &str, body: &Bytes) -> Request<Body> {
    Request::post(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.clone()))
        .expect("request")
}

/// Sends `request` through `router` on this thread; the answer, the heap allocations and the
/// copies of cached objects that made it.
fn send(
    rt: &tokio::runtime::Runtime,
    router: &axum::Router,
    request: Request<Body>,
) -> (Value, u64, u64) {
    let service = router.clone();
    let copies = clones::made();
    let (response, allocations) = allocations_in(|| rt.block_on(service.oneshot(request)));
    let copies = clones::made() - copies;
    let response = response.unwrap_or_else(|never| match never {});
    assert_eq!(response.status(), 200);
    let bytes = rt
        .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
        .expect("body");
    let answer: Value = serde_json::from_slice(&bytes).expect("a review");
    (answer["response"].clone(), allocations, copies)
}

#[test]
fn budget_reviews_allocations_and_copies_of_cached_objects() {
    // The whole review runs on this thread (a current-thread runtime), so the allocator's and
    // the caches' per-thread counts are the review's alone. The JSON log line of each review is
    // left out: no subscriber here, whatever another test of this binary installs.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let _quiet = tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default());
    let mut ledger = Ledger::default();
    for case in cases() {
        let mut measured = Vec::new();
        for _ in 0..ROUNDS {
            let router = Arc::new(testkit::webhook::fixture_control_plane()).router();
            for _ in 0..2 {
                let (warm, _, _) = send(&rt, &router, request(case.path, &case.dry_run));
                assert_eq!(warm["allowed"], case.allowed, "{}: {warm:#}", case.what);
            }
            let req = request(case.path, &case.body);
            let (answer, allocations, copies) = send(&rt, &router, req);
            assert_eq!(answer["allowed"], case.allowed, "{}: {answer:#}", case.what);
            assert!(
                allocations > 0,
                "no allocation counted: is CountingAllocator this binary's global allocator?"
            );
            assert!(
                copies > 0,
                "{}: no copy of a cached object counted",
                case.what
            );
            measured.push((allocations, copies));
        }
        let (least, most) = measured
            .iter()
            .fold((u64::MAX, 0), |(l, m), x| (l.min(x.0), m.max(x.0)));
        let copies = measured.iter().map(|m| m.1).max().unwrap_or(0);
        ledger.hold(
            &format!(
                "heap allocations of a {} (worst of {ROUNDS} webhooks; least {least})",
                case.what
            ),
            most,
            case.allocations,
        );
        ledger.hold(
            &format!("copies of cached objects in a {}", case.what),
            copies,
            cached_copies_per_decision(MACHINES),
        );
    }
    ledger.settle();
}

/// The stand-in's requests after the first `from`, as `verb path`.
fn requests_since(api: &ApiServer, from: usize) -> Vec<String> {
    api.requests()[from..]
        .iter()
        .map(|r| format!("{} {}", r.verb, r.path))
        .collect()
}

/// The objects of cluster `test` the caches hold (its Cluster, KCP and Machines), as seeded.
fn cached_objects(etcd: &EtcdCluster, members: &[String]) -> Vec<Value> {
    seed::cluster_objects(NS, "test", seed::direct_to(etcd), members, None, |_| {})
        .into_iter()
        .filter(|o| {
            matches!(
                o["kind"].as_str(),
                Some("Cluster" | "KubeadmControlPlane" | "Machine")
            )
        })
        .collect()
}

// A current-thread runtime: the fresh probe a review takes runs on this thread too, so the
// copies of cached objects it makes are counted with the review's.
#[tokio::test]
async fn budget_etcd_and_api_requests_per_probe_sweep_and_fresh_probe() {
    let etcd = EtcdCluster::start(3);
    let api = ApiServer::start().await.expect("stand-in");
    let members = seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |_| {});
    let n = members.len() as u64;
    let mut ledger = Ledger::default();

    // One probe, by a prober of its own: its clients dialled by a first probe.
    let prober = Prober::new(etcd.client_tls());
    let endpoints = etcd.endpoints();
    let deadline = Duration::from_secs(1);
    prober.probe(&endpoints, deadline).await.expect("probe");
    const PROBES: u64 = 3;
    let before = etcd.grpc_requests().await;
    for _ in 0..PROBES {
        let p = prober.probe(&endpoints, deadline).await.expect("probe");
        assert_eq!(p.members.len(), members.len());
        assert!(
            p.members.iter().all(|m| m.health == Health::Healthy),
            "{p:?}"
        );
    }
    let (requests, by_method) = grpc_delta(&before, &etcd.grpc_requests().await);
    ledger.hold(
        &format!("etcd requests of {PROBES} probes of {n} members ({by_method})"),
        requests,
        PROBES * etcd_requests_per_probe(n),
    );

    // Steady sweeps: the first reads the CA Secret and dials; the next ones ask etcd only.
    let state = testkit::webhook::cached(&cached_objects(&etcd, &members));
    let client = api.client().expect("client");
    let sweep = SweepConfig {
        deadline,
        transport: TransportKind::Direct,
        ..SweepConfig::default()
    };
    let probers = Arc::new(Probers::default());
    sweep_once(&client, &state, &sweep, &probers).await;
    match state
        .control_plane(NS, seed::KCP, Instant::now())
        .map(|cp| cp.etcd)
    {
        Ok(EtcdState::Observed(s)) => assert!(
            s.members.len() == members.len() && s.members.iter().all(|m| m.health.is_healthy()),
            "{s:?}"
        ),
        other => panic!("no member list recorded by the sweep: {other:?}"),
    }
    const SWEEPS: u64 = 3;
    let before = etcd.grpc_requests().await;
    let api_before = api.requests().len();
    for _ in 0..SWEEPS {
        sweep_once(&client, &state, &sweep, &probers).await;
    }
    let (requests, by_method) = grpc_delta(&before, &etcd.grpc_requests().await);
    let api_requests = requests_since(&api, api_before);
    ledger.hold(
        &format!("etcd requests of {SWEEPS} steady sweeps of one cluster ({by_method})"),
        requests,
        SWEEPS * etcd_requests_per_probe(n),
    );
    ledger.hold(
        &format!("API requests of {SWEEPS} steady sweeps ({api_requests:?})"),
        api_requests.len() as u64,
        SWEEPS * API_REQUESTS_PER_STEADY_SWEEP,
    );

    // Reviews that take a fresh probe, one after another: the KCP controller's dry-run deletion
    // of a healthy Machine, allowed (QuorumSafe) only on a probe taken after it arrived.
    let metrics = Arc::new(Metrics::new());
    let fresh = Arc::new(FreshProbes::new(
        client.clone(),
        state.clone(),
        probers.clone(),
        &sweep,
        &metrics,
    ));
    let webhook = Webhook::new(
        state.clone(),
        Policy::default(),
        metrics,
        None,
        Duration::from_secs(30),
    )
    .with_fresh_probes(fresh.clone());
    const REVIEWS: u64 = 3;
    let before = etcd.grpc_requests().await;
    let api_before = api.requests().len();
    let probes_before = fresh.probes_made("ok");
    let copies_before = clones::made();
    for i in 0..REVIEWS {
        let body = testkit::guard::delete_review(
            &members[0],
            KCP_CONTROLLER,
            true,
            &format!("budget-fresh-{i}"),
        );
        let bytes = serde_json::to_vec(&body).expect("json");
        let d = review::decode(Endpoint::Machines, &bytes).expect("decodes");
        let outcome = webhook.review(&d, Instant::now()).await;
        assert!(outcome.allowed, "{}", outcome.message);
        assert_eq!(outcome.reason, ReviewReason::Engine(Reason::QuorumSafe));
    }
    let copies = clones::made() - copies_before;
    let probes = fresh.probes_made("ok") - probes_before;
    assert_eq!(
        probes, REVIEWS,
        "one fresh probe per review, one after another"
    );
    let (requests, by_method) = grpc_delta(&before, &etcd.grpc_requests().await);
    let api_requests = requests_since(&api, api_before);
    ledger.hold(
        &format!("etcd requests of {REVIEWS} reviews with a fresh probe ({by_method})"),
        requests,
        REVIEWS * etcd_requests_per_probe(n),
    );
    ledger.hold(
        &format!("API requests of {REVIEWS} fresh probes ({api_requests:?})"),
        api_requests.len() as u64,
        REVIEWS * API_REQUESTS_PER_FRESH_PROBE,
    );
    // Two decisions each: on the record, then on the fresh probe.
    ledger.hold(
        &format!("copies of cached objects in {REVIEWS} reviews with a fresh probe"),
        copies,
        REVIEWS * 2 * cached_copies_per_decision(n),
    );
    ledger.settle();
}
