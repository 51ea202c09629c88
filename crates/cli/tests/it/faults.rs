//! Faults while the guard runs (issue 7, part 3): `serve` as in production (the webhook over
//! HTTPS, the prober sweeping a real 3-member etcd with TLS every 300 ms, the status publisher
//! writing to the API-server stand-in), with a fault injected *during* operation while a client
//! keeps sending reviews over h2.
//!
//! For every fault the tests check three things:
//! (a) every review sent meanwhile is answered before kube-apiserver's 10 s webhook timeout, and
//!     the verdict fits what the guard knows: when it cannot know etcd's state, a human's
//!     deletion is denied `HealthUnknown` (a controller's is allowed with that reason and a
//!     warning: the default policy);
//! (b) once the fault clears, the guard returns to the truth without a restart (conditions and
//!     verdicts);
//! (c) nothing is published from stale data as if fresh: while probes fail the condition says
//!     so, with the time of the last successful probe, and shows no member as healthy.
//!
//! Covered elsewhere and not repeated here: a real 409 race on the status write
//! (crates/status/tests/it/status_publish.rs), a Lease stolen between rounds and a holder that
//! cannot renew (crates/status/tests/it/status_publish.rs), a frozen member without the publisher
//! (crates/admission/tests/it/live_health.rs), prober behaviour per fault
//! (crates/observe/tests/it/etcd_prober.rs).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quorumguard_cli::server::{self, Running, StatusConfig};
use quorumguard_status::lease::LeaseConfig;
use quorumguard_status::publish::PublishConfig;
use rustls::ClientConfig;
use serde_json::{Value, json};
use testkit::apiserver::{ApiServer, kcp_resource};
use testkit::etcd::EtcdCluster;
use testkit::guard::{
    self, Answer, KCPS, MACHINES, WEBHOOK_TIMEOUT, delete_review, replicas_review,
};
use testkit::https::{TempDir, TestPki};
use testkit::reviews::{KCP_CONTROLLER, NS};
use testkit::seed::{self, KCP, wait_for};
use tokio::task::JoinHandle;

const INTERVAL: Duration = Duration::from_millis(300);
/// How long the guard uses the etcd CA Secret before reading it again (default 5 min).
const SECRET_REFRESH: Duration = Duration::from_secs(1);

/// The etcd CA Secret of the seeded cluster.
fn ca_secret_path() -> String {
    format!("/api/v1/namespaces/{NS}/secrets/test-etcd")
}
/// How long the guard may take to follow a change: many probe intervals and probe deadlines,
/// and well below the 60 s `max_health_age` (so HealthUnknown seen within it comes from knowing
/// that the probe failed, not from the snapshot ageing out).
const CONVERGE: Duration = Duration::from_secs(15);
const JANE: &str = "jane@example.com";
const QUORUM: &str = "quorumguard.io/EtcdQuorum";
const NEXT: &str = "quorumguard.io/NextAction";

fn status_path() -> String {
    format!(
        "/apis/controlplane.cluster.x-k8s.io/v1beta2/namespaces/{NS}/kubeadmcontrolplanes/{KCP}/status"
    )
}

fn status_config(identity: Option<&str>) -> StatusConfig {
    StatusConfig {
        publish: PublishConfig {
            refresh: Duration::from_secs(3600),
            request_timeout: Duration::from_secs(3),
            ..PublishConfig::default()
        },
        lease: identity.map(|id| LeaseConfig {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(200),
            ..LeaseConfig::new("quorumguard-system", "quorumguard", id)
        }),
    }
}

/// The guard over the fixture control plane `test` (one Machine per etcd member).
struct Guard {
    etcd: EtcdCluster,
    api: ApiServer,
    tls: Arc<ClientConfig>,
    running: Running,
    members: Vec<String>,
    _dir: TempDir,
}

impl Guard {
    /// Starts etcd, the stand-in and `serve` (holding the Lease as `identity` when given), and
    /// waits for the first Healthy publication.
    async fn start(identity: Option<&str>) -> Guard {
        let etcd = EtcdCluster::start(3);
        let api = ApiServer::start().await.expect("stand-in");
        let members = seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |_| {});
        let dir = TempDir::new("faults");
        let pki = TestPki::new(dir.path());
        let client = match identity {
            Some(id) => kube::Client::try_from(api.kubeconfig_as(id)).expect("client"),
            None => api.client().expect("client"),
        };
        let mut config = guard::serve_config(
            &pki,
            INTERVAL,
            Duration::from_millis(300),
            Some(status_config(identity)),
        );
        if let Some(sweep) = config.sweep.as_mut() {
            // The etcd CA Secret is re-read every second (beside the probe), not every 5 min.
            sweep.secret_refresh = SECRET_REFRESH;
        }
        let running = server::start(config, client).await.expect("start");
        let g = Guard {
            etcd,
            api,
            tls: pki.client(&[b"h2"]),
            running,
            members,
            _dir: dir,
        };
        g.wait_published("Healthy", Some("None")).await;
        g
    }

    async fn send(&self, path: &str, body: &Value) -> Answer {
        guard::review(self.running.addr, self.tls.clone(), path, body)
            .await
            .unwrap_or_else(|e| panic!("review {path}: {e}"))
    }

    /// A DELETE review of member `i`'s Machine by `user`.
    async fn delete(&self, i: usize, user: &str) -> Answer {
        self.send(
            MACHINES,
            &delete_review(&self.members[i], user, false, "faults"),
        )
        .await
    }

    /// Waits until deleting member `i`'s Machine as `user` gets `(allowed, reason)`; returns how
    /// long that took.
    async fn wait_verdict(&self, i: usize, user: &str, allowed: bool, reason: &str) -> Duration {
        let started = Instant::now();
        let mut last = None;
        for _ in 0..300 {
            let a = self.delete(i, user).await;
            if a.allowed == allowed && a.reason == reason {
                return started.elapsed();
            }
            last = Some(a);
            if started.elapsed() > CONVERGE {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "deleting test-{} as {user} never got ({allowed}, {reason}) within {CONVERGE:?}; last: {last:#?}",
            self.members[i]
        );
    }

    fn kcp(&self) -> Value {
        self.api.get(&kcp_resource(), NS, KCP).expect("kcp")
    }

    fn condition(&self, type_: &str) -> Value {
        self.kcp()["status"]["conditions"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["type"] == type_).cloned())
            .unwrap_or(Value::Null)
    }

    /// Waits until EtcdQuorum has reason `quorum` (and NextAction `next`, when given); returns
    /// the EtcdQuorum condition.
    async fn wait_published(&self, quorum: &str, next: Option<&str>) -> Value {
        let deadline = Instant::now() + CONVERGE;
        for _ in 0..1000 {
            let q = self.condition(QUORUM);
            let n = self.condition(NEXT);
            if q["reason"] == quorum && next.is_none_or(|r| n["reason"] == r) {
                return q;
            }
            if Instant::now() > deadline {
                panic!(
                    "never published EtcdQuorum {quorum} / NextAction {next:?} within {CONVERGE:?}; last:\n{q:#}\n{n:#}"
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("gave up waiting for EtcdQuorum {quorum}");
    }

    fn status_writes(&self, user: Option<&str>) -> usize {
        let path = status_path();
        self.api
            .requests()
            .iter()
            .filter(|r| r.verb == "update" && r.path == path)
            .filter(|r| user.is_none_or(|u| r.user == u))
            .count()
    }

    /// Changes the KCP's `spec.replicas` in the stand-in, as a user's edit would.
    fn set_replicas(&self, n: i64) {
        self.api
            .modify(&kcp_resource(), NS, KCP, |k| {
                k["spec"]["replicas"] = json!(n);
                k["metadata"]["generation"] =
                    json!(k["metadata"]["generation"].as_i64().unwrap_or(1) + 1);
            })
            .expect("replicas");
    }

    /// Ends `load` (every review answered in time) and stops the guard.
    async fn stop(self, load: Load, during: &str) {
        let (sent, slowest) = load.finish().await;
        println!("{sent} reviews {during}, slowest answer {slowest:?}");
        self.running.shutdown().await;
    }

    /// A client sending reviews every 50 ms until [`Load::finish`].
    fn load(&self) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(load(
            self.running.addr,
            self.tls.clone(),
            self.members[0].clone(),
            stop.clone(),
        ));
        Load { stop, task }
    }
}

/// Reviews sent in the background while a fault is injected.
struct Load {
    stop: Arc<AtomicBool>,
    task: JoinHandle<Vec<Result<Answer, String>>>,
}

impl Load {
    /// Stops sending; asserts that every review got an answer before the webhook timeout.
    /// Returns how many were sent and the slowest answer.
    async fn finish(self) -> (usize, Duration) {
        self.stop.store(true, Ordering::SeqCst);
        let answers = self.task.await.expect("load task");
        let mut slowest = Duration::ZERO;
        for a in &answers {
            match a {
                Ok(a) => {
                    assert!(
                        a.took < WEBHOOK_TIMEOUT,
                        "answered after the webhook timeout: {a:?}"
                    );
                    slowest = slowest.max(a.took);
                }
                Err(e) => panic!("a review got no answer: {e}"),
            }
        }
        assert!(answers.len() >= 10, "only {} reviews sent", answers.len());
        (answers.len(), slowest)
    }
}

async fn load(
    addr: SocketAddr,
    tls: Arc<ClientConfig>,
    member: String,
    stop: Arc<AtomicBool>,
) -> Vec<Result<Answer, String>> {
    // One review every 50 ms, each in a task of its own, as kube-apiserver sends them: how many
    // are sent does not depend on how long each takes to answer (a review that rests on etcd
    // waits for a fresh probe, up to --fresh-probe-timeout, while etcd does not answer).
    let mut sent = Vec::new();
    for n in 0..10_000 {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let (path, body) = match n % 3 {
            0 => (
                MACHINES,
                delete_review(&member, KCP_CONTROLLER, false, "load"),
            ),
            1 => (MACHINES, delete_review(&member, JANE, true, "load")),
            _ => (KCPS, replicas_review(3, 2, JANE, true, "load")),
        };
        let tls = tls.clone();
        sent.push(tokio::spawn(async move {
            guard::review(addr, tls, path, &body).await
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut out = Vec::with_capacity(sent.len());
    for task in sent {
        out.push(
            task.await
                .unwrap_or_else(|e| Err(format!("review task: {e}"))),
        );
    }
    out
}

fn member_line<'a>(message: &'a str, member: &str) -> &'a str {
    message
        .lines()
        .find(|l| l.starts_with(&format!("member {member} ")))
        .unwrap_or_else(|| panic!("no line for member {member} in:\n{message}"))
}

/// A member frozen, killed, restarted and removed while sweeps run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_frozen_killed_restarted_removed_during_sweeps() {
    let mut g = Guard::start(None).await;
    let load = g.load();
    let c = g.members[2].clone();
    assert_eq!(g.delete(0, KCP_CONTROLLER).await.reason, "QuorumSafe");

    // Frozen: unhealthy within a few sweeps; removing a healthy member would lose quorum,
    // removing the frozen one is the way forward.
    g.etcd.freeze(2);
    let q = g
        .wait_published("MembersUnhealthy", Some("RemediateMachine"))
        .await;
    assert!(
        member_line(q["message"].as_str().expect("message"), &c).contains("unhealthy: "),
        "{q:#}"
    );
    g.wait_verdict(0, KCP_CONTROLLER, false, "WouldLoseQuorum")
        .await;
    let a = g.delete(2, KCP_CONTROLLER).await;
    assert_eq!(
        (a.allowed, a.reason.as_str()),
        (true, "QuorumSafe"),
        "{a:?}"
    );
    g.etcd.thaw(2);
    g.wait_published("Healthy", Some("None")).await;
    g.wait_verdict(0, KCP_CONTROLLER, true, "QuorumSafe").await;

    // Killed: connection refused instead of silence; same verdicts.
    g.etcd.kill(2);
    let q = g
        .wait_published("MembersUnhealthy", Some("RemediateMachine"))
        .await;
    assert!(
        member_line(q["message"].as_str().expect("message"), &c).contains("unhealthy: "),
        "{q:#}"
    );
    g.wait_verdict(0, KCP_CONTROLLER, false, "WouldLoseQuorum")
        .await;

    // Restarted from its data dir: the guard follows without a restart of its own.
    g.etcd.start_member(2);
    g.wait_published("Healthy", Some("None")).await;
    g.wait_verdict(0, KCP_CONTROLLER, true, "QuorumSafe").await;

    // Removed with etcdctl mid-sweep (its process exits): its Machine now has no member.
    assert!(!g.etcd.remove_member(2) || !g.etcd.is_running(2));
    let q = g.wait_published("MembershipMismatch", None).await;
    let message = q["message"].as_str().expect("message");
    assert!(
        message.contains(&format!("Machine {NS}/test-{c} has no etcd member")),
        "{message}"
    );
    assert!(
        !message
            .lines()
            .any(|l| l.starts_with(&format!("member {c} "))),
        "the removed member is not listed as if present: {message}"
    );
    g.wait_verdict(2, KCP_CONTROLLER, true, "MemberAbsent")
        .await;
    // Two voting members, both healthy, 3 Machines for 3 replicas: deleting m1's Machine would
    // have KCP's replacement join a single healthy member (1 of 2, quorum 2), so a human (who
    // may not go below the replicas either) is refused by the quorum rule first.
    g.wait_verdict(0, JANE, false, "PendingJoin").await;

    g.stop(load, "during member faults").await;
}

/// Every member unreachable: the guard does not decide on its last snapshot, says so in the
/// conditions, and comes back when etcd answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_members_unreachable_is_health_unknown_until_they_answer() {
    let mut g = Guard::start(None).await;
    let load = g.load();
    assert_eq!(g.delete(0, JANE).await.reason, "BelowDesiredReplicas");
    assert_eq!(g.delete(0, KCP_CONTROLLER).await.reason, "QuorumSafe");
    let before = quorumguard_observe::unix_now();

    for i in 0..3 {
        g.etcd.freeze(i);
    }
    // Within a few sweeps (long before the 60 s max_health_age would age the snapshot out).
    let took = g.wait_verdict(0, JANE, false, "HealthUnknown").await;
    println!("HealthUnknown {took:?} after every member froze");
    let a = g.delete(0, KCP_CONTROLLER).await;
    assert_eq!(a.reason, "HealthUnknown", "{a:?}");
    assert!(
        a.allowed,
        "the default policy allows controllers with a warning: {a:?}"
    );
    let s = g
        .send(KCPS, &replicas_review(3, 5, JANE, true, "scale"))
        .await;
    assert_eq!(
        (s.allowed, s.reason.as_str()),
        (false, "HealthUnknown"),
        "{s:?}"
    );

    // Published: Unknown, with the last successful probe's time, and no member shown healthy.
    let reads = g.api.request_count("get", &ca_secret_path());
    let q = g
        .wait_published("ProbeFailed", Some("CheckEtcdHealth"))
        .await;
    // A failed probe makes the next one read the CA Secret again (a rotated CA is picked up).
    wait_for("the CA Secret read after failed probes", CONVERGE, || {
        g.api.request_count("get", &ca_secret_path()) > reads
    })
    .await;
    assert_eq!(q["status"], "Unknown");
    let message = q["message"].as_str().expect("message");
    assert!(
        message.starts_with("the latest etcd probe failed: "),
        "{message}"
    );
    let at = message
        .split("last successful probe at ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no time of the last successful probe in:\n{message}"));
    let at: k8s_openapi::jiff::Timestamp = at.parse().expect("an RFC 3339 time");
    // Within a second of freezing (the last good probe came just before or at it).
    assert!(
        (before - 2..=quorumguard_observe::unix_now()).contains(&at.as_second()),
        "last successful probe at {at}, froze at {before}"
    );
    for m in &g.members {
        let line = member_line(message, m);
        assert!(line.contains("health unknown"), "{line}");
    }
    assert!(
        message.contains("3 voting, 0 healthy"),
        "no stale health counted: {message}"
    );

    // etcd answers again: back to the truth without a restart.
    for i in 0..3 {
        g.etcd.thaw(i);
    }
    let q = g.wait_published("Healthy", Some("None")).await;
    assert!(
        !q["message"]
            .as_str()
            .expect("message")
            .contains("probe failed"),
        "{q:#}"
    );
    g.wait_verdict(0, KCP_CONTROLLER, true, "QuorumSafe").await;
    g.wait_verdict(0, JANE, false, "BelowDesiredReplicas").await;

    g.stop(load, "while etcd was unreachable").await;
}

/// The API-server stand-in failing: 500 and 409 on status writes, slow answers, slower than the
/// probe deadline, and dropped watch connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apiserver_errors_slowness_and_dropped_watches() {
    let mut g = Guard::start(None).await;
    let load = g.load();
    let status = status_path();

    // 500 on every status write: verdicts follow etcd all the same; the KCP keeps its last
    // conditions (nothing newer could be written) and gets the truth once writes succeed.
    g.api.fail_next(Some("update"), &status, 100_000, 500);
    let writes = g.status_writes(None);
    g.etcd.freeze(2);
    g.wait_verdict(0, KCP_CONTROLLER, false, "WouldLoseQuorum")
        .await;
    wait_for("failed write attempts", CONVERGE, || {
        g.status_writes(None) >= writes + 2
    })
    .await;
    assert_eq!(g.condition(QUORUM)["reason"], "Healthy");
    g.api.clear_faults();
    g.wait_published("MembersUnhealthy", Some("RemediateMachine"))
        .await;

    // 409 on seven writes in a row: a round gives up after five attempts, the next succeeds.
    let writes = g.status_writes(None);
    g.api.fail_next(Some("update"), &status, 7, 409);
    g.etcd.thaw(2);
    g.wait_published("Healthy", Some("None")).await;
    assert!(
        g.status_writes(None) >= writes + 8,
        "seven conflicts, then the write"
    );

    // Slow: every request takes 600 ms (the probe deadline is 1 s). Slower, not wrong.
    g.api.set_latency(Duration::from_millis(600));
    g.etcd.freeze(2);
    g.wait_published("MembersUnhealthy", Some("RemediateMachine"))
        .await;
    g.wait_verdict(0, KCP_CONTROLLER, false, "WouldLoseQuorum")
        .await;
    g.api.set_latency(Duration::ZERO);
    g.etcd.thaw(2);
    g.wait_published("Healthy", Some("None")).await;

    // Slower than the probe deadline (1 s): every re-read of the etcd CA Secret (due each second
    // here) times out, and the probes go on beside it with the CA read before. Verdicts follow
    // etcd, never HealthUnknown. (Until 2026-12-03 the Secret was read before every probe, and
    // this turned every probe into HealthUnknown.)
    let reads = g.api.request_count("get", &ca_secret_path());
    g.api.set_latency(Duration::from_millis(1200));
    g.etcd.freeze(2);
    g.wait_verdict(0, KCP_CONTROLLER, false, "WouldLoseQuorum")
        .await;
    g.etcd.thaw(2);
    g.wait_verdict(0, KCP_CONTROLLER, true, "QuorumSafe").await;
    wait_for("a timed-out re-read of the CA Secret", CONVERGE, || {
        g.api.request_count("get", &ca_secret_path()) > reads
    })
    .await;
    tokio::time::sleep(SECRET_REFRESH * 2).await;
    let a = g.delete(0, JANE).await;
    assert_eq!(a.reason, "BelowDesiredReplicas", "{a:?}");
    g.api.set_latency(Duration::ZERO);
    g.wait_published("Healthy", Some("None")).await;

    // Watches dropped, and the KCP changed while they reconnect: decisions follow the change.
    g.api.drop_watches();
    g.set_replicas(2);
    g.wait_verdict(0, JANE, true, "QuorumSafe").await;
    g.api.drop_watches();
    g.set_replicas(3);
    g.wait_verdict(0, JANE, false, "BelowDesiredReplicas").await;
    wait_for("the watches reopened", CONVERGE, || {
        g.api.open_watches() >= 3
    })
    .await;

    g.stop(load, "during API server faults").await;
}

/// The Lease taken by another holder between the publisher's read of the KCP and its write:
/// the write is not made; the replica takes the Lease back once the other holder's expires,
/// and publishes what is true then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lost_between_read_and_write() {
    let mut g = Guard::start(Some("replica-a")).await;
    let load = g.load();
    let leads = |g: &Guard| g.running.leadership.as_ref().is_some_and(|l| l.is_leader());
    assert!(leads(&g));

    let status = status_path();
    g.api
        .delay_next(Some("get"), &status, 1, Duration::from_millis(1500));
    let reads = g.api.request_count("get", &status);
    g.etcd.freeze(2);
    wait_for("the publisher's read of the KCP", CONVERGE, || {
        g.api.request_count("get", &status) > reads
    })
    .await;
    let leases = kube::api::ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&());
    g.api
        .modify(&leases, "quorumguard-system", "quorumguard", |l| {
            l["spec"]["holderIdentity"] = json!("intruder");
            l["spec"]["renewTime"] = json!(k8s_openapi::jiff::Timestamp::now().to_string());
        })
        .expect("take the Lease");
    wait_for("replica-a sees the loss", Duration::from_secs(3), || {
        !leads(&g)
    })
    .await;
    let writes = g.status_writes(Some("replica-a"));
    // The delayed read returns and the round ends meanwhile.
    tokio::time::sleep(Duration::from_millis(1500) + INTERVAL * 2).await;
    assert_eq!(
        g.status_writes(Some("replica-a")),
        writes,
        "no write after the Lease was lost"
    );
    assert_eq!(g.condition(QUORUM)["reason"], "Healthy");
    // The webhook does not depend on the Lease.
    g.wait_verdict(0, KCP_CONTROLLER, false, "WouldLoseQuorum")
        .await;

    // The intruder never renews: after its lease duration replica-a takes over and publishes.
    g.wait_published("MembersUnhealthy", Some("RemediateMachine"))
        .await;
    assert!(leads(&g));
    let lease = g
        .api
        .get(&leases, "quorumguard-system", "quorumguard")
        .expect("lease");
    assert_eq!(lease["spec"]["holderIdentity"], "replica-a");
    g.etcd.thaw(2);
    g.wait_published("Healthy", Some("None")).await;

    g.stop(load, "while the Lease changed hands").await;
}
