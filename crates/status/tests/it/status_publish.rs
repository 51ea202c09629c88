//! The status enricher publishing into KCP status, end to end: a real 3-member etcd cluster with
//! TLS on loopback, the API-server stand-in holding the Cluster, KCP, Machines and CA Secret, and
//! `serve` sweeping and publishing (direct transport).
//!
//! Shown here: the two conditions written with the member table; KCP's own conditions untouched;
//! the rollout prediction's one series per KCP, ready, then would_stick while a member is frozen,
//! then ready again; no request at all while nothing changes (the budget of a steady sweep); a
//! real 409 (the KCP changed between our read and our write) answered by a fresh read that keeps
//! the other writer's change; and with a Lease, only the holder writes, a holder that loses the
//! Lease stops at once, and another replica takes over and re-publishes.

use std::time::{Duration, Instant};

use quorumguard_cli::server::{self, Running, ServeConfig, StatusConfig};
use quorumguard_status::lease::LeaseConfig;
use quorumguard_status::publish::PublishConfig;
use serde_json::{Value, json};
use testkit::apiserver::{ApiServer, kcp_resource};
use testkit::budgets::{API_REQUESTS_PER_STEADY_SWEEP, Ledger};
use testkit::etcd::EtcdCluster;
use testkit::https::{TempDir, TestPki, try_get_plain};
use testkit::reviews::NS;
use testkit::seed::{self, KCP, wait_for};

const INTERVAL: Duration = Duration::from_millis(400);

fn status_path() -> String {
    format!(
        "/apis/controlplane.cluster.x-k8s.io/v1beta2/namespaces/{NS}/kubeadmcontrolplanes/{KCP}/status"
    )
}

fn config(pki: &TestPki, status: StatusConfig) -> ServeConfig {
    testkit::guard::serve_config(pki, INTERVAL, Duration::from_millis(300), Some(status))
}

/// `serve` sweeping and publishing without a Lease; volatile figures are not re-published within
/// a test.
async fn start_publishing(api: &ApiServer, pki: &TestPki) -> Running {
    start_publishing_with(api, pki, |_| {}).await
}

async fn start_publishing_with(
    api: &ApiServer,
    pki: &TestPki,
    tweak: impl FnOnce(&mut ServeConfig),
) -> Running {
    let status = StatusConfig {
        publish: PublishConfig {
            refresh: Duration::from_secs(3600),
            ..PublishConfig::default()
        },
        lease: None,
    };
    let mut cfg = config(pki, status);
    tweak(&mut cfg);
    server::start(cfg, api.client().expect("client"))
        .await
        .expect("start")
}

/// KCP conditions of KCP's own, as its controller writes them.
fn kcp_own_conditions() -> Value {
    json!([
        {"type": "Available", "status": "True", "reason": "Available", "message": "",
         "observedGeneration": 1, "lastTransitionTime": "2026-11-30T10:00:00Z"},
        {"type": "EtcdClusterHealthy", "status": "True", "reason": "Healthy", "message": "",
         "observedGeneration": 1, "lastTransitionTime": "2026-11-30T10:00:00Z"},
        {"type": "RollingOut", "status": "False", "reason": "NotRollingOut", "message": "",
         "observedGeneration": 1, "lastTransitionTime": "2026-11-30T10:00:00Z"},
    ])
}

fn kcp(api: &ApiServer) -> Value {
    api.get(&kcp_resource(), NS, KCP).expect("kcp")
}

fn condition(kcp: &Value, type_: &str) -> Option<Value> {
    kcp["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

fn reason(api: &ApiServer, type_: &str) -> Option<String> {
    condition(&kcp(api), type_).and_then(|c| c["reason"].as_str().map(str::to_string))
}

fn status_writes(api: &ApiServer, user: Option<&str>) -> usize {
    let path = status_path();
    api.requests()
        .iter()
        .filter(|r| r.verb == "update" && r.path == path)
        .filter(|r| user.is_none_or(|u| r.user == u))
        .count()
}

async fn metric(running: &Running, line_prefix: &str) -> f64 {
    let (code, body) = try_get_plain(running.admin_addr, "/metrics")
        .await
        .expect("metrics");
    assert_eq!(code, 200);
    body.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no metric {line_prefix} in:\n{body}"))
}

/// The `quorumguard_rollout_ready` series of the fixture KCP (the whole lines).
async fn rollout_series(running: &Running) -> Vec<String> {
    let (code, body) = try_get_plain(running.admin_addr, "/metrics")
        .await
        .expect("metrics");
    assert_eq!(code, 200);
    let prefix = format!("quorumguard_rollout_ready{{namespace=\"{NS}\",kcp=\"{KCP}\",");
    body.lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| l[prefix.len()..].to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_member_table_and_next_action() {
    let mut etcd = EtcdCluster::start(3);
    let api = ApiServer::start().await.expect("stand-in");
    // KCP v1.32 (learner joins): the readiness published for a healthy control plane is READY
    // (voting joins pass fault tolerance 0 at each join).
    let members = seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |k| {
        k["status"] = json!({"conditions": kcp_own_conditions()});
        k["spec"]["version"] = json!("v1.32.0");
    });
    let generation = kcp(&api)["metadata"]["generation"].clone();

    let dir = TempDir::new("publish");
    let pki = TestPki::new(dir.path());
    let running = start_publishing(&api, &pki).await;

    wait_for("EtcdQuorum Healthy", Duration::from_secs(20), || {
        reason(&api, "quorumguard.io/EtcdQuorum").as_deref() == Some("Healthy")
    })
    .await;
    let k = kcp(&api);
    let quorum = condition(&k, "quorumguard.io/EtcdQuorum").expect("EtcdQuorum");
    assert_eq!(quorum["status"], "True");
    assert_eq!(quorum["observedGeneration"], generation);
    let message = quorum["message"].as_str().expect("message");
    assert!(
        message.contains("3 voting, 3 healthy, quorum 2, fault tolerance 1"),
        "{message}"
    );
    for m in &members {
        let line = message
            .lines()
            .find(|l| l.starts_with(&format!("member {m} ")))
            .unwrap_or_else(|| panic!("no line for member {m} in:\n{message}"));
        assert!(line.contains("voting, healthy"), "{line}");
        assert!(line.contains(&format!("Machine {NS}/test-{m}")), "{line}");
        assert!(line.contains("version 3."), "{line}");
        assert!(line.contains("raft index "), "{line}");
    }
    assert_eq!(message.matches(", leader,").count(), 1, "{message}");
    let next = condition(&k, "quorumguard.io/NextAction").expect("NextAction");
    assert_eq!(
        (next["status"].as_str(), next["reason"].as_str()),
        (Some("False"), Some("None"))
    );
    // The rollout prediction of the same sweep (made before its publication): ready, one series.
    assert_eq!(
        rollout_series(&running).await,
        [r#"verdict="ready",reason="Ready"} 1"#]
    );

    // KCP's own conditions: untouched, in place, ours after them.
    let conditions = k["status"]["conditions"].as_array().expect("list");
    assert_eq!(conditions.len(), 5);
    assert_eq!(Value::Array(conditions[..3].to_vec()), kcp_own_conditions());

    // Steady state: nothing changes, so no write and not even a read of the KCP, nor of the
    // etcd CA Secret (read again only after a failed probe or --etcd-secret-refresh): no API
    // request at all over several sweeps and what follows each (the budget of a steady sweep,
    // crates/testkit/src/budgets.rs).
    let writes = status_writes(&api, None);
    let reads = api.request_count("get", &status_path());
    let secret = format!("/api/v1/namespaces/{NS}/secrets/test-etcd");
    let secret_reads = api.request_count("get", &secret);
    assert!(secret_reads >= 1, "the CA was read to make the prober");
    let requests = api.requests().len();
    let sweeps = metric(&running, "quorumguard_sweep_seconds_count").await;
    const STEADY_SWEEPS: f64 = 3.0;
    let mut swept = 0.0;
    for _ in 0..40 {
        tokio::time::sleep(INTERVAL / 2).await;
        swept = metric(&running, "quorumguard_sweep_seconds_count").await - sweeps;
        if swept >= STEADY_SWEEPS {
            break;
        }
    }
    assert!(
        swept >= STEADY_SWEEPS,
        "only {swept} sweeps in {:?}",
        INTERVAL * 20
    );
    let during: Vec<String> = api.requests()[requests..]
        .iter()
        .map(|r| format!("{} {}", r.verb, r.path))
        .collect();
    let mut ledger = Ledger::default();
    ledger.hold(
        &format!("API requests of {swept} steady sweeps and what follows them ({during:?})"),
        during.len() as u64,
        swept as u64 * API_REQUESTS_PER_STEADY_SWEEP,
    );
    ledger.settle();
    assert_eq!(
        api.request_count("get", &secret),
        secret_reads,
        "no read of the CA Secret while probes succeed"
    );
    assert_eq!(
        status_writes(&api, None),
        writes,
        "no write while nothing changed"
    );
    assert_eq!(
        api.request_count("get", &status_path()),
        reads,
        "no read while nothing changed"
    );

    // A real conflict: the next status write waits, and meanwhile KCP's controller changes the
    // object. The stale write gets 409; the writer reads again and keeps the other change.
    api.delay_next(
        Some("update"),
        &status_path(),
        1,
        Duration::from_millis(600),
    );
    etcd.freeze(2);
    let before = status_writes(&api, None);
    wait_for("the delayed status write", Duration::from_secs(10), || {
        status_writes(&api, None) > before
    })
    .await;
    api.modify(&kcp_resource(), NS, KCP, |k| {
        let list = k["status"]["conditions"].as_array_mut().expect("list");
        list.insert(
            0,
            json!({"type": "MachinesReady", "status": "False", "reason": "NotReady",
                   "message": "written while quorumguard's write was in flight",
                   "lastTransitionTime": "2026-12-01T00:00:00Z"}),
        );
    })
    .expect("modify");
    wait_for(
        "EtcdQuorum MembersUnhealthy",
        Duration::from_secs(10),
        || reason(&api, "quorumguard.io/EtcdQuorum").as_deref() == Some("MembersUnhealthy"),
    )
    .await;
    let k = kcp(&api);
    assert!(
        condition(&k, "MachinesReady").is_some(),
        "the concurrent writer's condition survived: {k:#}"
    );
    assert_eq!(k["status"]["conditions"].as_array().expect("list").len(), 6);
    let frozen = etcd.name(2).to_string();
    let quorum = condition(&k, "quorumguard.io/EtcdQuorum").expect("EtcdQuorum");
    assert_eq!(quorum["status"], "False");
    let message = quorum["message"].as_str().expect("message");
    assert!(message.contains(&format!("member {frozen} ")), "{message}");
    assert!(message.contains("2 healthy"), "{message}");
    let next = condition(&k, "quorumguard.io/NextAction").expect("NextAction");
    assert_eq!(next["status"], "True");
    assert_eq!(next["reason"], "RemediateMachine", "{next:#}");
    assert!(
        next["message"]
            .as_str()
            .expect("message")
            .contains(&format!("test-{frozen}")),
        "{next:#}"
    );
    assert!(
        metric(
            &running,
            "quorumguard_status_writes_total{result=\"conflict\"}"
        )
        .await
            >= 1.0
    );
    assert!(
        metric(
            &running,
            "quorumguard_status_writes_total{result=\"written\"}"
        )
        .await
            >= 2.0
    );
    assert_eq!(
        metric(&running, &format!("quorumguard_etcd_members{{namespace=\"{NS}\",cluster=\"test\",state=\"unhealthy\"}}")).await,
        1.0
    );
    assert_eq!(
        metric(
            &running,
            &format!("quorumguard_etcd_quorum_margin{{namespace=\"{NS}\",cluster=\"test\"}}")
        )
        .await,
        0.0
    );
    // A member down: KCP's preflight would hold the rollout's first step. The ready series is
    // gone; one series says why.
    assert_eq!(
        rollout_series(&running).await,
        [r#"verdict="would_stick",reason="MemberUnhealthy"} 1"#]
    );
    assert_eq!(
        metric(
            &running,
            &format!("quorumguard_rollout_step{{namespace=\"{NS}\",kcp=\"{KCP}\"}}")
        )
        .await,
        1.0
    );

    etcd.thaw(2);
    wait_for("EtcdQuorum Healthy again", Duration::from_secs(15), || {
        reason(&api, "quorumguard.io/EtcdQuorum").as_deref() == Some("Healthy")
    })
    .await;
    assert_eq!(
        reason(&api, "quorumguard.io/NextAction").as_deref(),
        Some("None")
    );
    assert_eq!(
        rollout_series(&running).await,
        [r#"verdict="ready",reason="Ready"} 1"#]
    );
    running.shutdown().await;
}

fn lease_config(identity: &str) -> StatusConfig {
    StatusConfig {
        publish: PublishConfig {
            refresh: Duration::from_secs(3600),
            ..PublishConfig::default()
        },
        lease: Some(LeaseConfig {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(200),
            ..LeaseConfig::new("quorumguard-system", "quorumguard", identity)
        }),
    }
}

async fn start_replica(api: &ApiServer, pki: &TestPki, identity: &str) -> Running {
    let client = kube::Client::try_from(api.kubeconfig_as(identity)).expect("client");
    server::start(config(pki, lease_config(identity)), client)
        .await
        .expect("start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_writes() {
    let mut etcd = EtcdCluster::start(3);
    let api = ApiServer::start().await.expect("stand-in");
    seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |_| {});
    let dir = TempDir::new("lease");
    let pki = TestPki::new(dir.path());

    let a = start_replica(&api, &pki, "replica-a").await;
    let leads = |r: &Running| r.leadership.as_ref().is_some_and(|l| l.is_leader());
    wait_for("replica-a leads", Duration::from_secs(10), || leads(&a)).await;
    let b = start_replica(&api, &pki, "replica-b").await;
    wait_for("EtcdQuorum Healthy", Duration::from_secs(20), || {
        reason(&api, "quorumguard.io/EtcdQuorum").as_deref() == Some("Healthy")
    })
    .await;
    // b probes (its webhook decides on fresh data) but does not write.
    wait_for("replica-b probed", Duration::from_secs(10), || {
        b.state.probe_duration(NS, "test").is_some()
    })
    .await;
    assert!(!leads(&b));
    assert!(status_writes(&api, Some("replica-a")) >= 1);
    assert_eq!(status_writes(&api, Some("replica-b")), 0);
    // The gauge follows within a sweep.
    for _ in 0..100 {
        if metric(&a, "quorumguard_leader ").await == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric(&a, "quorumguard_leader ").await, 1.0);
    assert_eq!(metric(&b, "quorumguard_leader ").await, 0.0);

    // Someone else takes the Lease: a sees it at its next renewal and stops writing at once,
    // although its probes now see a frozen member.
    let leases = kube::api::ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&());
    api.modify(&leases, "quorumguard-system", "quorumguard", |l| {
        l["spec"]["holderIdentity"] = json!("intruder");
        l["spec"]["renewTime"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
    })
    .expect("steal lease");
    wait_for("replica-a loses the lease", Duration::from_secs(5), || {
        !leads(&a)
    })
    .await;
    let a_writes = status_writes(&api, Some("replica-a"));
    etcd.freeze(2);
    wait_for(
        "replica-a sees the frozen member",
        Duration::from_secs(10),
        || {
            a.state.probe_error(NS, "test").is_none()
                && a.state
                    .control_plane(NS, KCP, Instant::now())
                    .ok()
                    .is_some_and(|cp| match cp.etcd {
                        quorumguard_engine::EtcdState::Observed(s) => {
                            s.members.iter().any(|m| !m.health.is_healthy())
                        }
                        _ => false,
                    })
        },
    )
    .await;
    tokio::time::sleep(INTERVAL * 2).await;
    assert_eq!(
        status_writes(&api, Some("replica-a")),
        a_writes,
        "a replica without the Lease writes nothing"
    );
    assert_eq!(
        reason(&api, "quorumguard.io/EtcdQuorum").as_deref(),
        Some("Healthy")
    );

    // a goes away; once the intruder's Lease expires, b takes over and publishes what it sees.
    a.shutdown().await;
    wait_for("replica-b leads", Duration::from_secs(10), || leads(&b)).await;
    wait_for(
        "b publishes MembersUnhealthy",
        Duration::from_secs(10),
        || reason(&api, "quorumguard.io/EtcdQuorum").as_deref() == Some("MembersUnhealthy"),
    )
    .await;
    assert!(status_writes(&api, Some("replica-b")) >= 1);
    assert_eq!(status_writes(&api, Some("replica-a")), a_writes);
    let lease = api
        .get(&leases, "quorumguard-system", "quorumguard")
        .expect("lease");
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert!(
        lease["spec"]["leaseTransitions"]
            .as_i64()
            .expect("transitions")
            >= 1
    );
    etcd.thaw(2);
    b.shutdown().await;
    // b released the Lease on shutdown: no holder.
    let lease = api
        .get(&leases, "quorumguard-system", "quorumguard")
        .expect("lease");
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease:#}");
}

/// An elector running as `replica-a` on Lease quorumguard-system/quorumguard (3 s, 2 s, 200 ms):
/// its client, its leadership and its task.
fn elector_as_replica_a(
    api: &ApiServer,
) -> (
    kube::Client,
    quorumguard_status::lease::Leadership,
    tokio::task::JoinHandle<()>,
) {
    use quorumguard_status::lease::{Elector, Leadership};
    let client = kube::Client::try_from(api.kubeconfig_as("replica-a")).expect("client");
    let leadership = Leadership::new();
    let cfg = LeaseConfig {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
        ..LeaseConfig::new("quorumguard-system", "quorumguard", "replica-a")
    };
    let elector = std::sync::Arc::new(Elector::new(client.clone(), cfg, leadership.clone()));
    let task = tokio::spawn(async move { elector.run().await });
    (client, leadership, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_cannot_renew_stops_before_the_lease_expires() {
    let api = ApiServer::start().await.expect("stand-in");
    let (client, leadership, task) = elector_as_replica_a(&api);
    drop(client);
    let mut changes = leadership.subscribe();
    wait_for("leading", Duration::from_secs(5), || leadership.is_leader()).await;

    // The API server stops answering Lease requests (500 on every one from now on).
    let path = "/apis/coordination.k8s.io/v1/namespaces/quorumguard-system/leases/quorumguard";
    api.fail_next(None, path, 10_000, 500);
    let cut = Instant::now();
    wait_for("leadership lost", Duration::from_secs(5), || {
        !leadership.is_leader()
    })
    .await;
    let lost_after = cut.elapsed();
    // Lost no later than the renew deadline after the last success (which was before `cut`),
    // and so before anyone else may take over (lease duration 3 s after *their* last view).
    assert!(
        lost_after < Duration::from_secs(3),
        "still leading {lost_after:?} after the cut"
    );
    // The elector also tells subscribers.
    let told = tokio::time::timeout(Duration::from_secs(3), async {
        while *changes.borrow_and_update() {
            if changes.changed().await.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(told.is_ok(), "subscribers hear of the loss");
    task.abort();
}

/// The published conditions of the moment, as `(EtcdQuorum reason, NextAction reason, NextAction
/// message, EtcdQuorum message)`.
fn published(api: &ApiServer) -> (String, String, String, String) {
    let k = kcp(api);
    let field = |t: &str, f: &str| {
        condition(&k, t)
            .and_then(|c| c[f].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    (
        field("quorumguard.io/EtcdQuorum", "reason"),
        field("quorumguard.io/NextAction", "reason"),
        field("quorumguard.io/NextAction", "message"),
        field("quorumguard.io/EtcdQuorum", "message"),
    )
}

async fn wait_published(api: &ApiServer, quorum: &str, next: &str) -> (String, String) {
    let mut last = None;
    for _ in 0..600 {
        let p = published(api);
        if p.0 == quorum && p.1 == next {
            return (p.2, p.3);
        }
        last = Some(p);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("never published EtcdQuorum {quorum} / NextAction {next}; last: {last:#?}");
}

/// Membership changes made with etcdctl on a live cluster show in the published conditions:
/// a killed member, a member removed while its Machine remains (#2651), a learner, an orphan
/// (the orphan with replicas lowered to 1 so that removing it is the way to match).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_reach_the_published_next_action() {
    let mut etcd = EtcdCluster::start(3);
    let api = ApiServer::start().await.expect("stand-in");
    let members = seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |_| {});
    let dir = TempDir::new("membership");
    let pki = TestPki::new(dir.path());
    let status = StatusConfig {
        publish: PublishConfig::default(),
        lease: None,
    };
    let running = server::start(config(&pki, status), api.client().expect("client"))
        .await
        .expect("start");
    wait_published(&api, "Healthy", "None").await;
    let set_replicas = |n: i64| {
        api.modify(&kcp_resource(), NS, KCP, |k| {
            k["spec"]["replicas"] = json!(n);
            k["metadata"]["generation"] =
                json!(k["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
        })
        .expect("replicas");
    };

    // Killed: unhealthy with the connection error; replace it through KCP remediation.
    etcd.kill(2);
    let (next, table) = wait_published(&api, "MembersUnhealthy", "RemediateMachine").await;
    assert!(next.contains(&format!("test-{}", members[2])), "{next}");
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("member {} ", members[2])))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains("unhealthy: "), "{line}");

    // #2651: KCP removed the member (scaling down to 2) and lost leader election before deleting
    // the Machine. The next action is deleting exactly that Machine.
    assert!(!etcd.remove_member(2) || !etcd.is_running(2));
    // The Machine is months old (a young one without a member is still joining).
    api.modify(
        &seed_machine_resource(),
        NS,
        &format!("test-{}", members[2]),
        |m| {
            m["metadata"]["creationTimestamp"] = json!("2026-06-01T00:00:00Z");
        },
    )
    .expect("age the Machine");
    set_replicas(2);
    let (next, _) = wait_published(&api, "MembershipMismatch", "DeleteMachine").await;
    assert!(next.contains(&format!("test-{}", members[2])), "{next}");
    assert!(next.contains("kubectl delete machine"), "{next}");
    api.remove(
        &seed_machine_resource(),
        NS,
        &format!("test-{}", members[2]),
    );
    wait_published(&api, "NoFaultTolerance", "None").await;

    // A learner joining for a new Machine: wait for it to catch up and be promoted.
    set_replicas(3);
    let learner = etcd.add_learner("m4");
    etcd.start_member(learner);
    api.insert(testkit::reviews::stored(seed::machine("m4")))
        .expect("machine m4");
    let (next, table) = wait_published(&api, "MembershipMismatch", "WaitForLearner").await;
    assert!(
        table.contains("member m4 ") && table.contains("learner"),
        "{table}"
    );
    assert!(next.contains("m4"), "{next}");

    // An orphan: the Machine of a healthy voting member goes, the member stays.
    api.remove(
        &seed_machine_resource(),
        NS,
        &format!("test-{}", members[1]),
    );
    let orphan = format!("member {} ", members[1]);
    let mut seen = None;
    for _ in 0..600 {
        let p = published(&api);
        if p.3
            .lines()
            .any(|l| l.starts_with(&orphan) && l.ends_with("no Machine"))
        {
            seen = Some(p);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (quorum, next, message, _) = seen.expect("the orphan member published");
    assert_eq!(quorum, "MembershipMismatch");
    // While a learner catches up, no membership change is the next step.
    assert_eq!(next, "WaitForLearner", "{message}");

    // Without the learner (removed with etcdctl, its Machine gone), the orphan is what to fix.
    etcd.remove_member(learner);
    api.remove(&seed_machine_resource(), NS, "test-m4");
    set_replicas(1);
    let (next, _) = wait_published(&api, "MembershipMismatch", "RemoveOrphanMember").await;
    assert!(next.contains("member remove"), "{next}");
    running.shutdown().await;
}

fn seed_machine_resource() -> kube::api::ApiResource {
    testkit::apiserver::machine_resource()
}

/// A cluster that reaches the caches while a sweep is under way (at startup, or newly created)
/// is not probed by that sweep. The writer publishes nothing for it until its first probe:
/// "no etcd probe yet" is not ProbeFailed. Its first and only write is the Healthy one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_not_yet_probed_gets_no_probe_failed() {
    let etcd = EtcdCluster::start(1);
    let api = ApiServer::start().await.expect("stand-in");
    // One member, so one replica: the published reason is NoFaultTolerance, as it should be.
    let one_replica = |k: &mut Value| k["spec"]["replicas"] = json!(1);
    let members = seed::control_plane(&api, &etcd, seed::direct_to(&etcd), one_replica);
    let dir = TempDir::new("first-probe");
    let pki = TestPki::new(dir.path());
    // Every sweep reads the CA Secret (not only after a failure or the refresh period), so that
    // holding that read holds the sweep.
    let running = start_publishing_with(&api, &pki, |cfg| {
        if let Some(sweep) = cfg.sweep.as_mut() {
            sweep.secret_refresh = Duration::ZERO;
        }
    })
    .await;
    wait_for("cluster test published", Duration::from_secs(20), || {
        reason(&api, "quorumguard.io/EtcdQuorum").is_some()
    })
    .await;
    let expected = reason(&api, "quorumguard.io/EtcdQuorum");
    assert_ne!(expected.as_deref(), Some("ProbeFailed"));

    // Hold the next sweep on cluster `test`'s CA Secret, and create cluster `late` (on the same
    // etcd) meanwhile: the sweep took its targets before `late` existed, the publication after
    // it sees `late`'s KCP.
    let secret = format!("/api/v1/namespaces/{NS}/secrets/test-etcd");
    let reads = api.request_count("get", &secret);
    api.delay_next(Some("get"), &secret, 1, Duration::from_millis(1500));
    wait_for("the held sweep", Duration::from_secs(5), || {
        api.request_count("get", &secret) > reads
    })
    .await;
    seed::cluster(
        &api,
        NS,
        "late",
        seed::direct_to(&etcd),
        &members,
        Some(&etcd.pki),
        one_replica,
    );
    let late = format!(
        "/apis/controlplane.cluster.x-k8s.io/v1beta2/namespaces/{NS}/kubeadmcontrolplanes/late-controlplane/status"
    );
    let late_quorum = || {
        api.get(&kcp_resource(), NS, "late-controlplane")
            .and_then(|k| condition(&k, "quorumguard.io/EtcdQuorum"))
            .and_then(|c| c["reason"].as_str().map(str::to_string))
    };
    wait_for("late's first publication", Duration::from_secs(10), || {
        late_quorum().is_some()
    })
    .await;
    assert_eq!(
        late_quorum(),
        expected,
        "late's first publication follows a probe"
    );
    tokio::time::sleep(INTERVAL * 2).await;
    let writes = api
        .requests()
        .iter()
        .filter(|r| r.verb == "update" && r.path == late)
        .count();
    assert_eq!(writes, 1, "one write, after the first probe of `late`");
    running.shutdown().await;
}

/// The autopilot's kill switch: the Lease's annotation `quorumguard.io/autopilot`, read by the
/// holder at every renewal, kept by its renewals (they replace the Lease as read), and gone when
/// it is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_reads_the_leases_autopilot_annotation_at_every_renewal() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, Patch, PatchParams};
    let api = ApiServer::start().await.expect("stand-in");
    let (client, leadership, task) = elector_as_replica_a(&api);
    wait_for("leading", Duration::from_secs(5), || leadership.is_leader()).await;
    assert_eq!(leadership.autopilot_annotation(), None);

    let leases: Api<Lease> = Api::namespaced(client, "quorumguard-system");
    let annotate = |value: serde_json::Value| {
        let leases = leases.clone();
        async move {
            leases
                .patch(
                    "quorumguard",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({
                        "metadata": {"annotations": {"quorumguard.io/autopilot": value}}
                    })),
                )
                .await
                .expect("annotating the Lease");
        }
    };
    annotate(serde_json::json!("off")).await;
    wait_for("the annotation read", Duration::from_secs(5), || {
        leadership.autopilot_annotation().as_deref() == Some("off")
    })
    .await;
    // Renewals keep it: five more rounds, and the Lease still carries it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lease = leases.get("quorumguard").await.expect("lease");
    assert_eq!(
        lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("quorumguard.io/autopilot"))
            .map(String::as_str),
        Some("off"),
        "a renewal dropped the annotation: {lease:?}"
    );
    assert!(leadership.is_leader());
    annotate(serde_json::Value::Null).await;
    wait_for("the annotation gone", Duration::from_secs(5), || {
        leadership.autopilot_annotation().is_none()
    })
    .await;
    task.abort();
}
