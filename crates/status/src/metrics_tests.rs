//! Tests of the enricher's per-KCP rollout series: computed from the caches and the latest probe
//! as a sweep leaves them, exactly one `rollout_ready` series per KCP, replaced when the
//! prediction changes and removed when the KCP goes.

use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::publish::rollouts;
use quorumguard_engine::{Health, Member, Policy};
use quorumguard_observe::capi;
use quorumguard_observe::state::{ClusterState, Kind, Object};

fn kcp(name: &str, cluster: &str) -> Object {
    Object::Kcp(
        capi::parse_kcp(&json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
            "kind": "KubeadmControlPlane",
            "metadata": {"name": name, "namespace": "ns",
                         "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "spec": {"replicas": 3, "version": "v1.33.0"}
        }))
        .expect("kcp"),
    )
}

fn machine(name: &str, kcp: &str, cluster: &str) -> Object {
    Object::Machine(
        capi::parse_machine(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": "ns", "labels": {
                "cluster.x-k8s.io/control-plane": "",
                "cluster.x-k8s.io/cluster-name": cluster,
                "cluster.x-k8s.io/control-plane-name": kcp}},
            "spec": {"clusterName": cluster},
            "status": {"nodeRef": {"name": name}}
        }))
        .expect("machine"),
    )
}

/// KCP `ns/kcp` (Cluster `c1`, Machines `m1`..`m3`) and KCP `ns/later` (Cluster `c2`, never
/// probed), synced.
fn fleet() -> ClusterState {
    let s = ClusterState::new();
    for kind in Kind::ALL {
        s.relist_start(kind);
    }
    s.apply(kcp("kcp", "c1"));
    s.apply(kcp("later", "c2"));
    for m in ["m1", "m2", "m3"] {
        s.apply(machine(m, "kcp", "c1"));
    }
    s.apply(machine("n1", "later", "c2"));
    for kind in Kind::ALL {
        s.relist_done(kind);
    }
    s
}

/// A probe of `c1`: members `m1`..`m3`, healthy but those in `down`.
fn probe(s: &ClusterState, down: &[&str]) {
    let members = ["m1", "m2", "m3"]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut m = Member::new(i as u64 + 1, *name);
            m.is_leader = i == 0;
            m.health = if down.contains(name) {
                Health::Unhealthy("no answer within 1s".into())
            } else {
                Health::Healthy
            };
            m
        })
        .collect();
    s.set_health("ns", "c1", members, Instant::now());
}

/// One enricher round's prediction, recorded; the exported `rollout_*` lines.
fn sweep(s: &ClusterState, m: &EnricherMetrics, metrics: &Metrics) -> Vec<String> {
    let predicted = rollouts(s, &Policy::default(), quorumguard_observe::unix_now());
    m.observe_rollouts(&predicted, Duration::from_micros(50));
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("quorumguard_rollout_") && !l.contains("prediction"))
        .map(String::from)
        .collect()
}

#[test]
fn one_rollout_series_per_kcp_flips_when_a_member_goes_down_and_goes_with_the_kcp() {
    let s = fleet();
    let metrics = Metrics::new();
    let m = EnricherMetrics::register(&metrics);

    // Healthy: ready. KCP `later` awaits its first probe: no series (not probed is no verdict).
    probe(&s, &[]);
    assert_eq!(
        sweep(&s, &m, &metrics),
        [r#"quorumguard_rollout_ready{namespace="ns",kcp="kcp",verdict="ready",reason="Ready"} 1"#]
    );

    // A member down: KCP's preflight would hold the first step. The ready series is gone, the
    // step is exported.
    probe(&s, &["m3"]);
    let lines = sweep(&s, &m, &metrics);
    assert_eq!(
        lines,
        [
            r#"quorumguard_rollout_ready{namespace="ns",kcp="kcp",verdict="would_stick",reason="MemberUnhealthy"} 1"#,
            r#"quorumguard_rollout_step{namespace="ns",kcp="kcp"} 1"#,
            &lines[2],
        ],
        "{lines:#?}"
    );
    assert!(
        lines[2].starts_with(r#"quorumguard_rollout_steps{namespace="ns",kcp="kcp"} "#),
        "{lines:#?}"
    );

    // The same again: the same single series.
    assert_eq!(sweep(&s, &m, &metrics), lines);

    // The probe fails: the health is unknown, so is the rollout.
    s.set_probe_error("ns", "c1", "no answer within 1s".into());
    assert_eq!(
        sweep(&s, &m, &metrics),
        [
            r#"quorumguard_rollout_ready{namespace="ns",kcp="kcp",verdict="cannot_judge",reason="EtcdUnknown"} 1"#
        ]
    );

    // Back to healthy, then the KCP goes: its series go with it.
    probe(&s, &[]);
    assert_eq!(sweep(&s, &m, &metrics).len(), 1);
    s.delete(Kind::Kcp, "ns", "kcp");
    assert_eq!(sweep(&s, &m, &metrics), Vec::<String>::new());
    assert!(
        metrics
            .encode()
            .contains("quorumguard_rollout_prediction_seconds_count 6"),
        "{}",
        metrics.encode()
    );
}

#[test]
fn every_verdict_and_reason_is_a_label_value_of_its_own() {
    let verdicts: BTreeSet<&str> = RolloutVerdict::ALL.iter().map(|v| v.as_str()).collect();
    assert_eq!(verdicts.len(), RolloutVerdict::ALL.len());
    let reasons: BTreeSet<&str> = ReadyReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(reasons.len(), ReadyReason::ALL.len());
    for r in reasons {
        assert!(r.chars().all(|c| c.is_ascii_alphanumeric()), "{r}");
    }
}

/// A cycle's work for one KCP: its snapshot (with the rollout prediction), then what the writer
/// reads from it (fingerprint, conditions). The next action of the control plane the caches
/// show is worked out once in all, whatever the prediction says (ready, would stick, cannot
/// judge); only the play's simulated control planes are asked about besides.
#[test]
fn a_cycle_works_out_each_kcps_next_action_once() {
    use crate::publish::snapshots;
    use quorumguard_engine::testkit::next_actions_asked;

    let s = fleet();
    let policy = Policy::default();
    for what in ["healthy", "a member down", "the probe failed"] {
        match what {
            "healthy" => probe(&s, &[]),
            "a member down" => probe(&s, &["m3"]),
            _ => s.set_probe_error("ns", "c1", "no answer within 1s".into()),
        }
        let (taken, asked) = next_actions_asked(|| {
            let taken = snapshots(&s, &policy, quorumguard_observe::unix_now());
            for snapshot in &taken {
                let _ = snapshot.fingerprint(&policy);
                let _ = snapshot.conditions(&policy);
            }
            taken
        });
        // KCP `later` awaits its first probe: no snapshot.
        assert_eq!(taken.len(), 1, "{what}");
        let once = asked.iter().filter(|cp| **cp == taken[0].cp).count();
        assert_eq!(once, 1, "{what}: asked {} times", once);
    }
}
