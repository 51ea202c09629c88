//! Tests of [`ClusterState`]: the index the watches fill, the latest probe of a cluster, and the
//! control planes and probe targets read from them.

use super::*;
use crate::capi;
use crate::engine::{EtcdState, Member};
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
fn a_failed_probe_makes_the_last_snapshot_health_unknown() {
    use crate::engine::{Alarm, Health};
    let s = synced_state();
    let mut m = Member::new(1, "m1");
    m.health = Health::Healthy;
    m.is_leader = true;
    let mut full = Member::new(2, "m2");
    full.health = Health::Healthy;
    full.alarms.push(Alarm::NoSpace);
    let taken = Instant::now();
    s.set_health("ns", "c1", vec![m, full], taken);
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
            assert_eq!(ids, [1, 2], "the member list stays");
            for m in &snap.members {
                assert_eq!(m.health, Health::Unknown, "{m:?}");
                assert!(m.alarms.is_empty() && !m.is_leader, "{m:?}");
            }
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
