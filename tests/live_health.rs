//! The webhook deciding on live etcd health: a real 3-member etcd cluster with TLS on loopback,
//! the API-server stand-in holding the Cluster, KCP, Machines and the `<cluster>-etcd` CA Secret,
//! and `serve` with its prober sweeping (the direct transport, chosen in the sweep config since
//! the default is port-forward, via the Cluster's endpoints annotation; tests/etcd_portforward.rs
//! covers port-forward).
//! Freeze a member and a deletion that needs it is denied within a probe interval; thaw it and
//! the same request is allowed again.

mod support;

use std::time::{Duration, Instant};

use quorumguard::engine::{EtcdState, Health};
use quorumguard::server::{self, Running};
use serde_json::json;
use support::apiserver::ApiServer;
use support::etcd::EtcdCluster;
use support::https::{TempDir, TestPki};
use support::reviews::{KCP_CONTROLLER, NS, fixture};
use support::seed::{self, machine, wait_for};

async fn delete(running: &Running, pki: &TestPki, member: &str, user: &str) -> (bool, String) {
    let mut r = fixture("machine-delete-by-user.json");
    r["request"]["name"] = json!(format!("test-{member}"));
    r["request"]["userInfo"]["username"] = json!(user);
    r["request"]["oldObject"] = machine(member);
    support::guard::verdict(running, pki, "/validate/machines", &r).await
}

/// Healthy members the webhook's state holds for cluster `test`, once every member's health is
/// settled: healthy or unhealthy, none unknown or awaiting confirmation (a member seen unhealthy
/// by one probe is unknown until the next confirms it).
fn healthy_members(running: &Running) -> Option<usize> {
    match running
        .state
        .control_plane(NS, "test-controlplane", Instant::now())
        .ok()?
        .etcd
    {
        EtcdState::Observed(s) => s
            .members
            .iter()
            .all(|m| matches!(m.health, Health::Healthy | Health::Unhealthy(_)))
            .then(|| s.members.iter().filter(|m| m.health.is_healthy()).count()),
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
    let config = support::guard::serve_config(&pki, interval, Duration::from_millis(300), None);
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
