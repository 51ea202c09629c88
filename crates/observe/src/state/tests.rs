//! Tests of [`ClusterState`]: the index the watches fill, the latest probe of a cluster, and the
//! control planes and probe targets read from them.

use super::*;
use crate::capi;
use quorumguard_engine::{EtcdState, Member};
use serde_json::json;
use std::time::Instant;

fn machine(name: &str, ip: &str) -> Object {
    Object::Machine(
        capi::parse_machine(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "labels": {
                "cluster.x-k8s.io/control-plane": "",
                "cluster.x-k8s.io/cluster-name": "c1",
                "cluster.x-k8s.io/control-plane-name": "kcp"}},
            "spec": {"clusterName": "c1"},
            "status": {"nodeRef": {"name": name},
                       "addresses": [{"type": "InternalIP", "address": ip}]}
        }))
        .expect("machine"),
    )
}

fn kcp() -> Object {
    Object::Kcp(
        capi::parse_kcp(&json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
            "kind": "KubeadmControlPlane",
            "metadata": {"name": "kcp", "namespace": "ns",
                         "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
            "spec": {"replicas": 3, "version": "v1.33.0"}
        }))
        .expect("kcp"),
    )
}

fn synced_state() -> ClusterState {
    let s = ClusterState::new();
    for kind in Kind::ALL {
        s.relist_start(kind);
    }
    s.apply(kcp());
    s.apply(machine("m1", "10.0.0.1"));
    s.apply(machine("m2", "10.0.0.2"));
    for kind in Kind::ALL {
        s.relist_done(kind);
    }
    s
}

#[test]
fn control_plane_from_the_index_and_health() {
    let s = ClusterState::new();
    assert_eq!(
        s.control_plane("ns", "kcp", Instant::now()),
        Err(Lookup::NotSynced)
    );
    let s = synced_state();
    assert_eq!(
        s.control_plane("ns", "other", Instant::now()),
        Err(Lookup::NoSuchKcp)
    );
    let cp = s.control_plane("ns", "kcp", Instant::now()).expect("cp");
    assert_eq!(cp.machines.len(), 2);
    assert_eq!(cp.cluster.name, "c1");
    assert!(matches!(cp.etcd, EtcdState::Unknown { .. }));
    s.set_probe_error("ns", "c1", "connection refused".into());
    match s
        .control_plane("ns", "kcp", Instant::now())
        .expect("cp")
        .etcd
    {
        EtcdState::Unknown { reason } => assert_eq!(reason, "connection refused"),
        other => panic!("{other:?}"),
    }
    let taken = Instant::now();
    s.set_health("ns", "c1", vec![Member::new(1, "m1")], taken);
    match s.control_plane("ns", "kcp", taken).expect("cp").etcd {
        EtcdState::Observed(snap) => {
            assert_eq!(snap.members.len(), 1);
            assert_eq!(snap.age, Some(std::time::Duration::ZERO));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_failed_probe_makes_the_last_snapshot_health_unknown_but_keeps_bad_news() {
    use quorumguard_engine::{Alarm, Health};
    let s = synced_state();
    let mut m = Member::new(1, "m1");
    m.health = Health::Healthy;
    m.is_leader = true;
    let mut full = Member::new(2, "m2");
    full.health = Health::Healthy;
    full.alarms.push(Alarm::Corrupt);
    let mut space = Member::new(3, "m3");
    space.health = Health::Healthy;
    space.alarms.push(Alarm::NoSpace);
    let taken = Instant::now();
    s.set_health("ns", "c1", vec![m, full, space], taken);
    assert_eq!(s.probe_error("ns", "c1"), None);
    s.set_probe_error("ns", "c1", "no answer within 1s".into());
    let error = s.probe_error("ns", "c1").expect("error");
    assert!(
        error.starts_with("no answer within 1s (last successful probe at 20"),
        "{error}"
    );
    match s.control_plane("ns", "kcp", taken).expect("cp").etcd {
        EtcdState::Observed(snap) => {
            let ids: Vec<u64> = snap.members.iter().map(|m| m.id.0).collect();
            assert_eq!(ids, [1, 2, 3], "the member list stays");
            assert!(snap.members.iter().all(|m| !m.is_leader));
            // Health seen healthy is not known now...
            assert_eq!(snap.members[0].health, Health::Unknown);
            // ...but a member seen down (here: a CORRUPT alarm, etcd's replicated state) stays
            // down until a probe sees it healthy (issue 27: a failed probe does not turn bad
            // news into unknown).
            assert_eq!(snap.members[1].alarms, [Alarm::Corrupt]);
            assert!(!snap.members[1].effective_health().is_healthy());
            assert_ne!(snap.members[1].effective_health(), Health::Unknown);
            // A NOSPACE alarm makes no member unhealthy (raft keeps its quorum): its health is
            // unknown now, and the alarm stands (space is not freed by itself).
            assert_eq!(snap.members[2].alarms, [Alarm::NoSpace]);
            assert_eq!(snap.members[2].effective_health(), Health::Unknown);
        }
        other => panic!("{other:?}"),
    }
    // The next good probe is taken as it is.
    let mut back = Member::new(1, "m1");
    back.health = Health::Healthy;
    s.set_health("ns", "c1", vec![back], Instant::now());
    assert_eq!(s.probe_error("ns", "c1"), None);
    match s
        .control_plane("ns", "kcp", Instant::now())
        .expect("cp")
        .etcd
    {
        EtcdState::Observed(snap) => assert_eq!(snap.members[0].health, Health::Healthy),
        other => panic!("{other:?}"),
    }
}

#[test]
fn relist_replaces_and_deletes_remove() {
    let s = synced_state();
    // A relist that no longer holds m2 drops it; a delete drops m1.
    s.relist_start(Kind::Machine);
    s.apply(machine("m1", "10.0.0.1"));
    // During the relist the old view still answers.
    assert_eq!(s.machine_deleting("ns", "m2"), Some(false));
    s.relist_done(Kind::Machine);
    assert_eq!(s.machine_deleting("ns", "m2"), None);
    s.delete(Kind::Machine, "ns", "m1");
    let cp = s.control_plane("ns", "kcp", Instant::now()).expect("cp");
    assert!(cp.machines.is_empty());
}

#[test]
fn probe_targets_one_per_cluster_with_addresses() {
    let s = synced_state();
    let t = s.probe_targets();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].cluster, "c1");
    assert_eq!(t[0].kcp, "kcp");
    assert_eq!(t[0].internal_ips, ["10.0.0.1", "10.0.0.2"]);
    assert_eq!(t[0].node_names, ["m1", "m2"]);
    assert_eq!(t[0].endpoints_annotation, None);
    assert_eq!(t[0].transport_annotation, None);
}

#[test]
fn a_member_confirmed_down_stays_down_through_a_failed_probe() {
    use quorumguard_engine::{Confirmation, Health};
    let s = synced_state();
    let c = Confirmation::default();
    let t0 = Instant::now();
    let probe = |second: Health| {
        let mut a = Member::new(1, "m1");
        a.health = Health::Healthy;
        a.is_leader = true;
        a.raft_term = Some(2);
        let mut b = Member::new(2, "m2");
        b.health = second;
        vec![a, b]
    };
    let down = || Health::Unhealthy("no answer within 1s".into());
    s.observe_probe("ns", "c1", probe(down()), t0, &c);
    s.observe_probe("ns", "c1", probe(down()), t0 + c.election_timeout, &c);
    let health = |s: &ClusterState| match s
        .control_plane("ns", "kcp", Instant::now())
        .expect("cp")
        .etcd
    {
        EtcdState::Observed(snap) => snap
            .members
            .iter()
            .map(|m| m.health.clone())
            .collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert!(matches!(health(&s)[1], Health::Unhealthy(_)), "confirmed");
    s.set_probe_error("ns", "c1", "no endpoint answered".into());
    let after = health(&s);
    assert_eq!(after[0], Health::Unknown);
    match &after[1] {
        Health::Unhealthy(e) => assert!(e.contains("not seen healthy since"), "{e}"),
        other => panic!("a failed probe turned a member confirmed down into {other:?}"),
    }
}

#[test]
fn a_removed_member_never_counts_healthy_while_its_removal_awaits_confirmation() {
    use quorumguard_engine::{Confirmation, Health};
    let s = synced_state();
    let c = Confirmation::default();
    let t0 = Instant::now();
    let up = |id: u64, leader: bool| {
        let mut m = Member::new(id, format!("m{id}"));
        m.health = Health::Healthy;
        m.is_leader = leader;
        m.raft_term = Some(2);
        m
    };
    s.observe_probe(
        "ns",
        "c1",
        vec![up(1, true), up(2, false), up(3, false)],
        t0,
        &c,
    );
    // Member 3 removed, member 4 added (voting, not started): one probe sees it.
    let added = Member::new(4, "");
    let recheck = s.observe_probe(
        "ns",
        "c1",
        vec![up(1, true), up(2, false), added],
        t0 + std::time::Duration::from_millis(100),
        &c,
    );
    assert_eq!(
        recheck,
        Some(c.election_timeout),
        "the change is confirmed later"
    );
    let members = s.recorded_members("ns", "c1");
    let by_id = |id: u64| members.iter().find(|m| m.id.0 == id).expect("listed");
    assert!(!by_id(3).effective_health().is_healthy(), "{:?}", by_id(3));
    assert!(!by_id(4).effective_health().is_healthy() && !by_id(4).is_learner);
    assert!(by_id(1).effective_health().is_healthy());
    // A probe older than the record is not recorded over it.
    assert_eq!(s.observe_probe("ns", "c1", vec![up(1, true)], t0, &c), None);
    assert_eq!(s.recorded_members("ns", "c1").len(), 4);
}
