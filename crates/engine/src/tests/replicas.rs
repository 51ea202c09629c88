//! One table per replicas rule (desired replicas on deletion, external etcd, replica changes,
//! rollouts). Every expected value is worked out by hand from quorum(V) = V/2+1.

use super::{assert_verdict, three_healthy};
use crate::testkit::*;
use crate::*;

#[test]
fn desired_replicas_rule() {
    // A human deleting a healthy machine of a healthy 3/3 control plane: quorum is fine but KCP
    // would be left below its desired replicas.
    let c = three_healthy();
    let v = delete(&c, "a", &human());
    assert_verdict(&v, false, Reason::BelowDesiredReplicas);
    assert!(v.message.contains(ANNOTATION_REMEDIATE), "{}", v.message);
    assert!(v.message.contains("spec.replicas 3"), "{}", v.message);
    // For 3 replicas remediation is the only advice: one replica would tolerate no failure.
    assert!(!v.message.contains("--replicas"), "{}", v.message);
    // For 5, shrinking to 3 keeps a failure's worth of room and may be suggested.
    let five = cp(
        5,
        &[
            ("a", healthy()),
            ("b", healthy()),
            ("c", healthy()),
            ("d", healthy()),
            ("e", healthy()),
        ],
    );
    let v = delete(&five, "a", &human());
    assert_verdict(&v, false, Reason::BelowDesiredReplicas);
    assert!(v.message.contains("--replicas=3`"), "{}", v.message);
    // The KCP controller is exempt.
    assert_verdict(
        &delete(&c, "a", &kcp_controller()),
        true,
        Reason::QuorumSafe,
    );
    // A machine that never joined (no node, no member) may go.
    let mut c = cp(3, &[("a", healthy()), ("b", healthy())]);
    let i = add_machine(&mut c, "new");
    c.machines[i].node_name = None;
    assert_verdict(&delete(&c, "new", &human()), true, Reason::MemberAbsent);
    // The #2651 state: four machines, but the old one's member is gone, so it does not make up
    // for a healthy one: a human deleting a healthy machine is denied, deleting the old one is
    // the next action.
    let mut c = three_healthy();
    add_machine(&mut c, "old");
    let v = delete(&c, "a", &human());
    assert_verdict(&v, false, Reason::BelowDesiredReplicas);
    assert!(
        v.message.contains("with 2 working control-plane Machines"),
        "{}",
        v.message
    );
    assert_eq!(v.next_action.code, ActionCode::DeleteMachine);
    // For people the desired-replicas rule overrides MemberAbsent: 3 Machines for 3 replicas, one
    // of them without a member (gone, not joining): deleting it would leave 2 working Machines.
    // The next action is remediation, which the denial names too.
    let mut c = cp(3, &[("a", healthy()), ("b", healthy())]);
    add_machine(&mut c, "gone");
    let v = delete(&c, "gone", &human());
    assert_verdict(&v, false, Reason::BelowDesiredReplicas);
    assert_eq!(v.next_action.code, ActionCode::RemediateMachine);
    assert_eq!(v.next_action.target.as_deref(), Some("gone"));
    assert!(
        v.message.contains(
            "\nNext safe action: Ask KCP to replace Machine ns/gone, which has no etcd member"
        ),
        "{}",
        v.message
    );
    // The KCP controller (exempt from the replicas rule) deletes it: its member is absent.
    assert_verdict(
        &delete(&c, "gone", &kcp_controller()),
        true,
        Reason::MemberAbsent,
    );
    // Four machines for three replicas: a human may delete one.
    let mut c = three_healthy();
    add_machine(&mut c, "d");
    add_member(&mut c, 4, "d", healthy(), false);
    assert_verdict(&delete(&c, "d", &human()), true, Reason::QuorumSafe);
}

#[test]
fn external_etcd_skips_quorum_not_replicas() {
    let mut c = cp(3, &[("a", healthy()), ("b", down()), ("c", down())]);
    c.kcp.etcd = EtcdTopology::External;
    assert_verdict(
        &delete(&c, "a", &kcp_controller()),
        true,
        Reason::ExternalEtcd,
    );
    assert_verdict(
        &delete(&c, "a", &human()),
        false,
        Reason::BelowDesiredReplicas,
    );
    assert_verdict(&scale(&c, 5), true, Reason::ExternalEtcd);
}

#[test]
fn replica_change_table() {
    let five_two_down = || {
        cp(
            5,
            &[
                ("a", healthy()),
                ("b", healthy()),
                ("c", healthy()),
                ("d", down()),
                ("e", down()),
            ],
        )
    };
    // 3 -> 5 with one down: the first new member makes quorum 3 of 4 with 2 healthy.
    let c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    assert_verdict(&scale(&c, 5), false, Reason::ScaleUpWouldLoseQuorum);
    // 4 -> 5 with one down: 3 healthy >= quorum(5) = 3; but while the Machine of a healthy
    // member is being deleted, once it has gone the new member makes 2 healthy of 4.
    let mut c = cp(
        4,
        &[
            ("a", healthy()),
            ("b", healthy()),
            ("c", healthy()),
            ("d", down()),
        ],
    );
    assert_verdict(&scale(&c, 5), true, Reason::ScaleUpSafe);
    machine_mut(&mut c, "a").deleting = true;
    let v = scale(&c, 5);
    assert_verdict(&v, false, Reason::ScaleUpWouldLoseQuorum);
    assert!(
        v.message.contains("Machines being deleted"),
        "{}",
        v.message
    );
    // The down member's Machine being deleted instead: it leaving only helps.
    machine_mut(&mut c, "a").deleting = false;
    machine_mut(&mut c, "d").deleting = true;
    assert_verdict(&scale(&c, 5), true, Reason::ScaleUpSafe);
    // Two of three healthy being deleted: one member is left, which may still grow.
    let mut c = three_healthy();
    machine_mut(&mut c, "a").deleting = true;
    machine_mut(&mut c, "b").deleting = true;
    assert_verdict(&scale(&c, 5), true, Reason::ScaleUpSafe);
    // 3 -> 5 healthy: 3 healthy >= quorum(4) = 3.
    assert_verdict(&scale(&three_healthy(), 5), true, Reason::ScaleUpSafe);
    // 1 -> 3: a single member can only grow this way.
    let v = scale(&cp(1, &[("a", healthy())]), 3);
    assert_verdict(&v, true, Reason::SingleMemberScaleUp);
    assert!(!v.warnings.is_empty());
    // 5 -> 3 healthy: worst case removes two healthy: 3 of 3.
    let c = cp(
        5,
        &[
            ("a", healthy()),
            ("b", healthy()),
            ("c", healthy()),
            ("d", healthy()),
            ("e", healthy()),
        ],
    );
    assert_verdict(&scale(&c, 3), true, Reason::ScaleDownSafe);
    // 5 -> 3 with two down: worst case removes two healthy: 1 healthy of 3, quorum 2.
    let v = scale(&five_two_down(), 3);
    assert_verdict(&v, false, Reason::ScaleDownWouldLoseQuorum);
    let f = v.figures.expect("figures");
    assert_eq!((f.voting_after, f.healthy_after), (3, 1));
    // ...unless the down ones are annotated for deletion: KCP removes those first.
    let mut c = five_two_down();
    for n in ["d", "e"] {
        machine_mut(&mut c, n)
            .annotations
            .insert(ANNOTATION_DELETE_MACHINE.into(), "".into());
    }
    assert_verdict(&scale(&c, 3), true, Reason::ScaleDownSafe);
    // 3 -> 1 healthy: 1 of 1 left.
    assert_verdict(&scale(&three_healthy(), 1), true, Reason::ScaleDownSafe);
    // Quorum lost: no replica change helps.
    let c = cp(3, &[("a", healthy()), ("b", down()), ("c", down())]);
    assert_verdict(&scale(&c, 5), false, Reason::QuorumLost);
    assert_verdict(&scale(&c, 1), false, Reason::QuorumLost);
    // Unchanged.
    assert_verdict(&scale(&three_healthy(), 3), true, Reason::NoReplicaChange);
    // Being deleted.
    let mut c = cp(3, &[("a", healthy()), ("b", down()), ("c", down())]);
    c.kcp.deleting = true;
    assert_verdict(&scale(&c, 1), true, Reason::ControlPlaneDeleting);
}

#[test]
fn rollout_warns_when_first_step_unsafe() {
    let update = |c: &ControlPlane| {
        decide(
            c,
            &Operation::UpdateKcp {
                replicas_from: 3,
                replicas_to: 3,
                starts_rollout: true,
            },
            &human(),
            &Policy::default(),
            NOW,
        )
    };
    let v = update(&three_healthy());
    assert_verdict(&v, true, Reason::RolloutAllowed);
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    let v = update(&c);
    assert_verdict(&v, true, Reason::RolloutAllowed);
    assert!(
        v.warnings.iter().any(|w| w.contains("maxSurge 1")),
        "{:?}",
        v.warnings
    );
    c.kcp.max_surge = 0;
    let v = update(&c);
    assert!(
        v.warnings.iter().any(|w| w.contains("maxSurge 0")),
        "{:?}",
        v.warnings
    );
    // maxSurge 0 on a healthy 3: removing one first leaves 2 of 2: safe, no warning.
    let mut c = three_healthy();
    c.kcp.max_surge = 0;
    assert!(update(&c).warnings.is_empty());
}
