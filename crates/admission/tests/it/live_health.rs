//! The webhook deciding on live etcd health: a real 3-member etcd cluster with TLS on loopback,
//! the API-server stand-in holding the Cluster, KCP, Machines and the `<cluster>-etcd` CA Secret,
//! and `serve` with its prober sweeping (the direct transport, chosen in the sweep config since
//! the default is port-forward, via the Cluster's endpoints annotation;
//! crates/observe/tests/it/etcd_portforward.rs covers port-forward).
//! Freeze a member and a deletion that needs it is denied within a probe interval; thaw it and
//! the same request is allowed again.

use std::time::{Duration, Instant};

use quorumguard_cli::server::{self, Running};
use quorumguard_engine::{EtcdState, Health};
use serde_json::json;
use testkit::apiserver::ApiServer;
use testkit::etcd::EtcdCluster;
use testkit::guard::{Answer, KCPS, MACHINES};
use testkit::https::{TempDir, TestPki};
use testkit::reviews::{KCP_CONTROLLER, NS, fixture};
use testkit::seed::{self, machine, wait_for};

async fn delete(running: &Running, pki: &TestPki, member: &str, user: &str) -> (bool, String) {
    let mut r = fixture("machine-delete-by-user.json");
    r["request"]["name"] = json!(format!("test-{member}"));
    r["request"]["userInfo"]["username"] = json!(user);
    r["request"]["oldObject"] = machine(member);
    testkit::guard::verdict(running, pki, "/validate/machines", &r).await
}

/// Healthy members the webhook's state holds for cluster `test`, once every member's health is
/// settled: healthy or unhealthy, none unknown or awaiting confirmation (a member seen unhealthy
/// by one probe is unknown until the next confirms it).
fn healthy_members(running: &Running) -> Option<usize> {
    let members = observed(running)?;
    members
        .iter()
        .all(|m| matches!(m.health, Health::Healthy | Health::Unhealthy(_)))
        .then(|| members.iter().filter(|m| m.health.is_healthy()).count())
}

/// The members the webhook's state holds for cluster `test`, if it has a member list.
fn observed(running: &Running) -> Option<Vec<quorumguard_engine::Member>> {
    match running
        .state
        .control_plane(NS, "test-controlplane", Instant::now())
        .ok()?
        .etcd
    {
        EtcdState::Observed(s) => Some(s.members),
        EtcdState::Unknown { .. } => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_follow_live_etcd_health() {
    let mut etcd = EtcdCluster::start(3);
    let api = ApiServer::start().await.expect("stand-in");
    let members = seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |_| {});

    let dir = TempDir::new("live");
    let pki = TestPki::new(dir.path());
    let interval = Duration::from_millis(500);
    // Deletions allowed here are never carried out (no KCP acts on them): let their
    // reservations lapse quickly so each step is judged on etcd health alone.
    let config = testkit::guard::serve_config(&pki, interval, Duration::from_millis(300), None);
    let running = server::start(config, api.client().expect("client"))
        .await
        .expect("start");
    wait_for("3 healthy members probed", Duration::from_secs(20), || {
        healthy_members(&running) == Some(3)
    })
    .await;

    let (a, c) = (members[0].as_str(), members[2].as_str());
    // Healthy: the KCP controller may remove a member; a human is held to the replicas.
    assert_eq!(
        delete(&running, &pki, a, KCP_CONTROLLER).await,
        (true, "QuorumSafe".into())
    );
    assert_eq!(
        delete(&running, &pki, a, "jane@example.com").await,
        (false, "BelowDesiredReplicas".into())
    );

    // Freeze c: within a probe interval (plus the probe deadline, and the confirming probe an
    // election timeout later) the guard knows.
    tokio::time::sleep(Duration::from_millis(400)).await;
    etcd.freeze(2);
    let frozen_at = Instant::now();
    wait_for(
        "the frozen member seen unhealthy",
        interval * 2 + Duration::from_secs(2),
        || healthy_members(&running) == Some(2),
    )
    .await;
    let seen_after = frozen_at.elapsed();
    assert_eq!(
        delete(&running, &pki, a, KCP_CONTROLLER).await,
        (false, "WouldLoseQuorum".into()),
        "removing a healthy member while {c} is frozen would lose quorum"
    );
    assert_eq!(
        delete(&running, &pki, a, "jane@example.com").await,
        (false, "WouldLoseQuorum".into())
    );
    // Removing the frozen member's Machine is the way forward, and is allowed.
    assert_eq!(
        delete(&running, &pki, c, KCP_CONTROLLER).await,
        (true, "QuorumSafe".into())
    );

    // Thaw: allowed again once a sweep sees it.
    etcd.thaw(2);
    wait_for(
        "the member healthy again",
        interval * 2 + Duration::from_secs(5),
        || healthy_members(&running) == Some(3),
    )
    .await;
    // The allowed deletion of c's Machine above was reserved for 300 ms (the TTL above): judged
    // on health alone, the next step waits for that to lapse (with c pending, deleting a too
    // would have KCP's replacements join a single member: PendingJoin).
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        delete(&running, &pki, a, KCP_CONTROLLER).await,
        (true, "QuorumSafe".into()),
        "allowed again after thaw"
    );
    println!("frozen member seen unhealthy after {seen_after:?} (probe interval {interval:?})");
    running.shutdown().await;
}

/// Which member of `etcd` leads, as the guard's record saw it.
fn leader(running: &Running, etcd: &EtcdCluster) -> Option<usize> {
    observed(running)?
        .iter()
        .find(|m| m.is_leader)
        .map(|m| etcd.index_of(&m.name))
}

/// One review at `path`, answered in full.
async fn answer(running: &Running, pki: &TestPki, path: &str, body: &serde_json::Value) -> Answer {
    testkit::guard::review(running.addr, pki.client(&[b"h2"]), path, body)
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

/// `serve` over `etcd` (direct transport) with its default 10 s probe interval, once its first
/// sweep has seen 3 healthy members: after that, its record is up to 10 s old. Reservations
/// lapse after 300 ms (nothing carries out the deletions allowed here).
async fn default_interval_guard(
    etcd: &EtcdCluster,
    tag: &str,
) -> (ApiServer, Vec<String>, TestPki, TempDir, Running) {
    let api = ApiServer::start().await.expect("stand-in");
    let members = seed::control_plane(&api, etcd, seed::direct_to(etcd), |_| {});
    let dir = TempDir::new(tag);
    let pki = TestPki::new(dir.path());
    let config = testkit::guard::serve_config(
        &pki,
        Duration::from_secs(10),
        Duration::from_millis(300),
        None,
    );
    let running = server::start(config, api.client().expect("client"))
        .await
        .expect("start");
    wait_for("3 healthy members probed", Duration::from_secs(20), || {
        healthy_members(&running) == Some(3)
    })
    .await;
    (api, members, pki, dir, running)
}

/// Issue 27: with `serve`'s default 10 s probe interval, a member frozen a fraction of a second
/// ago is already counted: every quorum-losing deletion and replica change, by a person and by
/// the KCP controller, is denied from 0.3 s after the freeze on (not allowed on the record of
/// the last sweep, nor let through as unknown health), and saying why; once the member is
/// thawed, the same deletion of a now-safe Machine is allowed again within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_rests_on_answers_etcd_gave_after_the_request_arrived() {
    let mut etcd = EtcdCluster::start(3);
    let (_api, members, pki, _dir, running) = default_interval_guard(&etcd, "fresh").await;
    let lead = leader(&running, &etcd).expect("a leader in the record");
    // Freeze a follower; keep one healthy follower and the leader.
    let frozen = (0..3).find(|i| *i != lead).expect("a follower");
    let healthy = (0..3)
        .find(|i| *i != lead && *i != frozen)
        .expect("another follower");
    let (h, f) = (members[healthy].clone(), members[frozen].clone());

    let delete =
        |who: &'static str, uid: &'static str| testkit::guard::delete_review(&h, who, true, uid);
    let person = "jane@example.com";
    // Healthy: the KCP controller may remove a member (dry run: nothing reserved).
    let a = answer(&running, &pki, MACHINES, &delete(KCP_CONTROLLER, "u0")).await;
    assert_eq!(
        (a.allowed, a.reason.as_str()),
        (true, "QuorumSafe"),
        "{a:?}"
    );

    etcd.freeze(frozen);
    let frozen_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Every quorum-losing operation, in turn, until 9 s after the freeze (before the next
    // sweep): each is denied, on the fresh probe, for the reason that fits it.
    let operations: [(&str, serde_json::Value, &str); 4] = [
        (MACHINES, delete(KCP_CONTROLLER, "u1"), "WouldLoseQuorum"),
        (MACHINES, delete(person, "u2"), "WouldLoseQuorum"),
        (
            KCPS,
            testkit::guard::replicas_review(3, 5, person, true, "u3"),
            "ScaleUpWouldLoseQuorum",
        ),
        (
            KCPS,
            testkit::guard::replicas_review(3, 1, person, false, "u4"),
            "ScaleDownWouldLoseQuorum",
        ),
    ];
    let mut asked = 0;
    let mut first = None;
    for round in 0..40 {
        if round > 0 && frozen_at.elapsed() >= Duration::from_secs(9) {
            break;
        }
        let (path, body, reason) = &operations[round % operations.len()];
        let sent = frozen_at.elapsed();
        let a = answer(&running, &pki, path, body).await;
        if first.is_none() {
            // The first, by the KCP controller 0.3 s after the freeze, finds the record healthy:
            // it is decided on a fresh probe, and says so.
            assert!(
                a.message.contains(&format!("{f} (id"))
                    && a.message.contains("did not answer just now"),
                "{a:?}"
            );
            first = Some((sent, a.took));
        }
        // The KCP controller's HealthUnknown policy is to allow: it must get the quorum
        // reason. A person's request may also be refused at once as HealthUnknown while the
        // record holds the member as seen down by one probe (a denial is not probed).
        let by_controller = body["request"]["userInfo"]["username"] == KCP_CONTROLLER;
        assert!(
            !a.allowed && (a.reason == *reason || (!by_controller && a.reason == "HealthUnknown")),
            "{:.1} s after freezing {f}: {path} {} answered {a:?}",
            sent.as_secs_f64(),
            body["request"]["userInfo"]["username"]
        );
        assert!(a.message.contains(&f), "the denial names {f}: {a:?}");
        assert!(
            a.took < Duration::from_secs(5),
            "inside the webhook's timeoutSeconds"
        );
        asked += 1;
    }
    assert!(asked >= 4, "every operation asked at least once");
    let probed = running
        .webhook
        .fresh_probes()
        .expect("fresh probes")
        .probes_made("ok");
    assert!(probed >= 1, "the first denial rested on a fresh probe");
    // Thaw: the same deletion (of a now-safe Machine) is allowed again within a second.
    etcd.thaw(frozen);
    let thawed = Instant::now();
    let mut allowed = None;
    for i in 0..20 {
        let a = answer(&running, &pki, MACHINES, &delete(KCP_CONTROLLER, "u6")).await;
        if a.allowed {
            allowed = Some((i, a));
            break;
        }
        if thawed.elapsed() > Duration::from_secs(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (tries, a) = allowed.unwrap_or_else(|| {
        panic!(
            "not allowed again within a second of the thaw ({:?})",
            thawed.elapsed()
        )
    });
    assert_eq!(a.reason, "QuorumSafe", "{a:?}");
    let (sent, took) = first.expect("asked");
    println!(
        "first review {:.0} ms after the freeze answered in {:.0} ms; {asked} denials; allowed again after {tries} denials, {:.0} ms after the thaw",
        sent.as_secs_f64() * 1000.0,
        took.as_secs_f64() * 1000.0,
        thawed.elapsed().as_secs_f64() * 1000.0
    );
    running.shutdown().await;
}

/// Issue 27: a burst of concurrent reviews of one cluster shares fresh probes (single-flight):
/// 100 concurrent deletions cost a handful of probes at most, not 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reviews_share_one_fresh_probe() {
    let etcd = EtcdCluster::start(3);
    let (_api, members, pki, _dir, running) = default_interval_guard(&etcd, "burst").await;
    let fresh = running.webhook.fresh_probes().expect("fresh").clone();
    let before = fresh.probes_made("ok") + fresh.probes_made("failed");
    let tls = pki.client(&[b"h2"]);
    let body = testkit::guard::delete_review(&members[0], KCP_CONTROLLER, true, "burst");
    let answers = futures::future::join_all(
        (0..100).map(|_| testkit::guard::review(running.addr, tls.clone(), MACHINES, &body)),
    )
    .await;
    let after = fresh.probes_made("ok") + fresh.probes_made("failed");
    for a in &answers {
        let a = a.as_ref().expect("answered");
        assert_eq!(
            (a.allowed, a.reason.as_str()),
            (true, "QuorumSafe"),
            "{a:?}"
        );
    }
    let probes = after - before;
    println!("100 concurrent deletions: {probes} fresh probes");
    assert!(
        (1..=5).contains(&probes),
        "100 concurrent reviews made {probes} fresh probes"
    );
    running.shutdown().await;
}
