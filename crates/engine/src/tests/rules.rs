//! One table per rule. Every expected value is worked out by hand from quorum(V) = V/2+1.

use std::time::Duration;

use crate::testkit::*;
use crate::*;

fn assert_verdict(v: &Verdict, allowed: bool, reason: Reason) {
    assert_eq!(
        (v.allowed, v.reason),
        (allowed, reason),
        "verdict was {v:#?}"
    );
    if !allowed {
        assert!(
            v.message.contains("Next safe action:"),
            "a denial must say what to do next: {}",
            v.message
        );
    }
}

fn three_healthy() -> ControlPlane {
    cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())])
}

#[test]
fn unconditional_allows() {
    let who = human();
    // Not a control-plane machine.
    let mut c = three_healthy();
    machine_mut(&mut c, "a").control_plane = false;
    assert_verdict(&delete(&c, "a", &who), true, Reason::NotControlPlane);
    // Already deleting.
    let mut c = three_healthy();
    machine_mut(&mut c, "a").deleting = true;
    assert_verdict(&delete(&c, "a", &who), true, Reason::AlreadyDeleting);
    // Cluster and KCP being deleted: KCP deletes every machine at once.
    let mut c = cp(3, &[("a", healthy()), ("b", down()), ("c", down())]);
    c.cluster.deleting = true;
    assert_verdict(&delete(&c, "a", &who), true, Reason::ClusterDeleting);
    c.cluster.deleting = false;
    c.kcp.deleting = true;
    assert_verdict(&delete(&c, "a", &who), true, Reason::ControlPlaneDeleting);
    // clusterctl move.
    let mut c = three_healthy();
    machine_mut(&mut c, "a")
        .annotations
        .insert(ANNOTATION_DELETE_FOR_MOVE.into(), "".into());
    assert_verdict(&delete(&c, "a", &who), true, Reason::ClusterctlMove);
    // Teardown identities, even when quorum would be lost.
    let c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    for t in DEFAULT_TEARDOWN {
        assert_verdict(
            &delete(&c, "a", &Requester::new(t)),
            true,
            Reason::TeardownRequester,
        );
    }
}

#[test]
fn break_glass_needs_a_reason_and_warns() {
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    machine_mut(&mut c, "a")
        .annotations
        .insert(ANNOTATION_BREAK_GLASS.into(), "  ".into());
    let v = delete(&c, "a", &human());
    assert_verdict(&v, false, Reason::WouldLoseQuorum);
    assert!(v.message.contains("needs a reason"), "{}", v.message);

    machine_mut(&mut c, "a")
        .annotations
        .insert(ANNOTATION_BREAK_GLASS.into(), "INC-42 node is gone".into());
    let v = delete(&c, "a", &human());
    assert_verdict(&v, true, Reason::BreakGlass);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("INC-42") && w.contains("WouldLoseQuorum")),
        "{:?}",
        v.warnings
    );
    // A break-glass annotation on a safe deletion changes nothing.
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
    machine_mut(&mut c, "a")
        .annotations
        .insert(ANNOTATION_BREAK_GLASS.into(), "why not".into());
    assert_verdict(
        &delete(&c, "a", &kcp_controller()),
        true,
        Reason::QuorumSafe,
    );
}

#[test]
fn quorum_rule_table() {
    let ctl = kcp_controller();
    // (members, machine to delete, expected allowed, reason, voting', healthy', quorum', tolerance')
    type Row = (
        &'static [(&'static str, bool)],
        &'static str,
        bool,
        Reason,
        usize,
        usize,
        usize,
        i64,
    );
    let rows: &[Row] = &[
        // 3 healthy: remove one -> 2 of 2, quorum 2, tolerance 0.
        (
            &[("a", true), ("b", true), ("c", true)],
            "a",
            true,
            Reason::QuorumSafe,
            2,
            2,
            2,
            0,
        ),
        // 3 with c down, remove healthy a -> 1 healthy of 2, quorum 2: lost.
        (
            &[("a", true), ("b", true), ("c", false)],
            "a",
            false,
            Reason::WouldLoseQuorum,
            2,
            1,
            2,
            -1,
        ),
        // 3 with c down, remove c -> 2 of 2: safe.
        (
            &[("a", true), ("b", true), ("c", false)],
            "c",
            true,
            Reason::QuorumSafe,
            2,
            2,
            2,
            0,
        ),
        // 5 healthy: remove one -> 4 of 4, quorum 3, tolerance 1.
        (
            &[
                ("a", true),
                ("b", true),
                ("c", true),
                ("d", true),
                ("e", true),
            ],
            "a",
            true,
            Reason::QuorumSafe,
            4,
            4,
            3,
            1,
        ),
        // 5 with two down: remove healthy -> 2 of 4, quorum 3: lost.
        (
            &[
                ("a", true),
                ("b", true),
                ("c", true),
                ("d", false),
                ("e", false),
            ],
            "a",
            false,
            Reason::WouldLoseQuorum,
            4,
            2,
            3,
            -1,
        ),
        // 5 with two down: remove a down one -> 3 of 4, quorum 3: safe, tolerance 0.
        (
            &[
                ("a", true),
                ("b", true),
                ("c", true),
                ("d", false),
                ("e", false),
            ],
            "d",
            true,
            Reason::QuorumSafe,
            4,
            3,
            3,
            0,
        ),
        // 2 healthy: remove one -> 1 of 1; but spec.replicas is 2 (the table's), so KCP's
        // replacement would then join 1 healthy member: 1 of 2, quorum 2.
        (
            &[("a", true), ("b", true)],
            "a",
            false,
            Reason::PendingJoin,
            1,
            1,
            1,
            0,
        ),
        // 1 member: never remove the last one.
        (&[("a", true)], "a", false, Reason::LastMember, 0, 0, 1, -1),
        // 3 with two down: quorum is lost already.
        (
            &[("a", true), ("b", false), ("c", false)],
            "b",
            false,
            Reason::QuorumLost,
            2,
            1,
            2,
            -1,
        ),
    ];
    for (members, target, allowed, reason, v2, h2, q2, t2) in rows {
        let m: Vec<(&str, Health)> = members
            .iter()
            .map(|(n, h)| (*n, if *h { healthy() } else { down() }))
            .collect();
        let c = cp(members.len() as u32, &m);
        let v = delete(&c, target, &ctl);
        assert_verdict(&v, *allowed, *reason);
        let f = v.figures.expect("figures");
        assert_eq!(
            (
                f.voting_after,
                f.healthy_after,
                f.quorum_after,
                f.tolerance_after
            ),
            (*v2, *h2, *q2, *t2),
            "{members:?} delete {target}"
        );
        // Every message names the object and the numbers.
        assert!(v.message.contains(&format!("ns/{target}")), "{}", v.message);
        assert!(
            v.message.contains(&format!("voting {}", f.voting)),
            "{}",
            v.message
        );
    }
}

#[test]
fn fault_tolerance_zero_warns() {
    let v = delete(&three_healthy(), "a", &kcp_controller());
    assert_verdict(&v, true, Reason::QuorumSafe);
    assert!(
        v.warnings.iter().any(|w| w.contains("no fault tolerance")),
        "{:?}",
        v.warnings
    );
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
    let v = delete(&c, "a", &kcp_controller());
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
}

#[test]
fn member_absent_and_learner() {
    // A machine whose member was removed already (the #2651 state).
    let mut c = three_healthy();
    add_machine(&mut c, "old");
    let v = delete(&c, "old", &human());
    assert_verdict(&v, true, Reason::MemberAbsent);
    // Even when quorum is lost, a machine without a member can go.
    let mut c = cp(3, &[("a", healthy()), ("b", down()), ("c", down())]);
    add_machine(&mut c, "old");
    assert_verdict(&delete(&c, "old", &human()), true, Reason::MemberAbsent);
    // A learner does not vote.
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    add_machine(&mut c, "l");
    add_member(&mut c, 9, "l", healthy(), true);
    assert_verdict(&delete(&c, "l", &human()), true, Reason::LearnerMember);
}

#[test]
fn pending_deletions_worst_order() {
    // Mid-rollout: 4 members, d down, a deleting (healthy). Deleting b (healthy) alone leaves 2
    // healthy of 3 (quorum 2), and so does a leaving; but both leaving leaves 1 healthy of 2.
    let mut c = cp(
        3,
        &[
            ("a", healthy()),
            ("b", healthy()),
            ("c", healthy()),
            ("d", down()),
        ],
    );
    machine_mut(&mut c, "a").deleting = true;
    let v = delete(&c, "b", &kcp_controller());
    assert_verdict(&v, false, Reason::PendingDeletions);
    assert!(
        v.message.contains("Machine a"),
        "must name the deletion to wait for: {}",
        v.message
    );
    assert_eq!(v.next_action.code, ActionCode::WaitForDeletion);
    // Deleting d (down) instead adds no risk: 3 healthy of 3, then 2 of 2.
    assert_verdict(
        &delete(&c, "d", &kcp_controller()),
        true,
        Reason::QuorumSafe,
    );
    // 3 healthy, a deleting: deleting b too leaves 1 of 1 in the worst case, and while scaling
    // down to 1 replica that is allowed.
    let mut c = three_healthy();
    c.kcp.replicas = 1;
    machine_mut(&mut c, "a").deleting = true;
    assert_verdict(
        &delete(&c, "b", &kcp_controller()),
        true,
        Reason::QuorumSafe,
    );
    // With spec.replicas 3, KCP replaces them: its first new member would join a single
    // healthy member and vote before it is healthy (1 of 2, quorum 2). Deleting b now adds
    // that risk; after a's replacement has joined it would not.
    c.kcp.replicas = 3;
    let v = delete(&c, "b", &kcp_controller());
    assert_verdict(&v, false, Reason::PendingJoin);
    assert!(
        v.message.contains("Machine a"),
        "names the deletion to wait for: {}",
        v.message
    );
}

#[test]
fn a_pending_join_counts_in_every_order() {
    // The scale-up-then-delete race: 4 members, d down; 4 -> 5 was allowed (3 healthy of 5
    // is a quorum). KCP's deletion of healthy a is safe alone (2 of 3), but the fifth member
    // may join first and vote before it is healthy: 2 healthy of 4, quorum 3.
    let mut c = cp(
        5,
        &[
            ("a", healthy()),
            ("b", healthy()),
            ("c", healthy()),
            ("d", down()),
        ],
    );
    let v = delete(&c, "a", &kcp_controller());
    assert_verdict(&v, false, Reason::PendingJoin);
    assert!(
        v.message.contains("fewer than spec.replicas 5"),
        "{}",
        v.message
    );
    assert!(
        v.message.contains("voting 4, healthy 2, quorum 3"),
        "{}",
        v.message
    );
    // Removing the down member is the way: 3 healthy of 4 with the newcomer in.
    assert_verdict(
        &delete(&c, "d", &kcp_controller()),
        true,
        Reason::QuorumSafe,
    );
    // A Machine created within the join grace and without a member is a join too.
    c.kcp.replicas = 4;
    let i = add_machine(&mut c, "new");
    c.machines[i].node_name = None;
    c.machines[i].created_unix = Some(NOW - 60);
    let v = delete(&c, "a", &kcp_controller());
    assert_verdict(&v, false, Reason::PendingJoin);
    assert!(v.message.contains("Machine new is new"), "{}", v.message);
    // Past the grace it is not joining any more (and replicas are met): a's removal is judged
    // alone.
    c.machines[i].created_unix = Some(NOW - 86_400);
    assert_verdict(
        &delete(&c, "a", &kcp_controller()),
        true,
        Reason::QuorumSafe,
    );
    // A join under way is in the member list already (unstarted): not counted twice.
    c.machines[i].created_unix = Some(NOW - 60);
    add_member(&mut c, 9, "", Health::Unknown, false);
    assert_verdict(
        &delete(&c, "a", &kcp_controller()),
        false,
        Reason::WouldLoseQuorum,
    );
}

#[test]
fn unhealthy_member_is_the_way_out_of_unsafe_pending_deletions() {
    // a was admitted for deletion while all were healthy; then c went down. a cannot leave
    // safely now (1 healthy of 2), and KCP is stuck. Removing c (down) adds no risk: every
    // order that loses quorum with it loses quorum without it. It is allowed, with a warning.
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    machine_mut(&mut c, "a").deleting = true;
    let v = delete(&c, "c", &kcp_controller());
    assert_verdict(&v, true, Reason::QuorumSafe);
    assert!(
        v.warnings.iter().any(|w| w.contains("way out")),
        "{:?}",
        v.warnings
    );
    // Removing healthy b instead would add risk.
    assert_verdict(
        &delete(&c, "b", &kcp_controller()),
        false,
        Reason::WouldLoseQuorum,
    );
}

#[test]
fn health_unknown_policy() {
    // Stale probe: health unknown.
    let mut c = three_healthy();
    c.etcd = EtcdState::Observed(EtcdSnapshot {
        members: c.members().to_vec(),
        age: Some(Duration::from_secs(600)),
    });
    // Four machines and members for three replicas: the replicas rule passes.
    add_machine(&mut c, "d");
    add_member(&mut c, 4, "d", healthy(), false);
    let v = delete(&c, "a", &human());
    assert_verdict(&v, false, Reason::HealthUnknown);
    assert!(v.message.contains("cannot prove"), "{}", v.message);
    let v = delete(&c, "a", &kcp_controller());
    assert_verdict(&v, true, Reason::HealthUnknown);
    assert!(!v.warnings.is_empty());
    // Policy reversed.
    let p = Policy {
        unknown_health_humans: OnUnknownHealth::Allow,
        unknown_health_controllers: OnUnknownHealth::Deny,
        ..Policy::default()
    };
    let m = c.machine("a").expect("a").clone();
    let op = Operation::DeleteMachine(m);
    assert!(decide(&c, &op, &human(), &p, NOW).allowed);
    assert!(!decide(&c, &op, &kcp_controller(), &p, NOW).allowed);
    // No member list at all.
    c.etcd = EtcdState::Unknown {
        reason: "probe failed: connection refused".into(),
    };
    let v = delete(&c, "a", &human());
    assert_verdict(&v, false, Reason::HealthUnknown);
    assert!(v.message.contains("connection refused"), "{}", v.message);
    // One unknown member among healthy ones: safe only if it is healthy -> unknown.
    let mut c = cp(
        3,
        &[("a", healthy()), ("b", healthy()), ("c", Health::Unknown)],
    );
    c.kcp.replicas = 2; // so that the replicas rule passes and only quorum decides.
    assert_verdict(&delete(&c, "a", &human()), false, Reason::HealthUnknown);
    // Removing the unknown member itself is safe whatever it is.
    assert_verdict(&delete(&c, "c", &human()), true, Reason::QuorumSafe);
}

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
    assert!(v.message.contains("leave 2 working"), "{}", v.message);
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
        v.message
            .contains("Next safe action: Machine ns/gone has no etcd member"),
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

#[test]
fn alarms_and_unstarted_members_are_unhealthy() {
    let mut c = three_healthy();
    add_machine(&mut c, "d");
    members_mut(&mut c)[2].alarms.push(Alarm::NoSpace);
    let v = delete(&c, "a", &human());
    assert_verdict(&v, false, Reason::WouldLoseQuorum);
    assert!(v.message.contains("alarm NOSPACE"), "{}", v.message);
    // An added member that has not started votes and is unhealthy: 3 healthy + 1 unstarted,
    // deleting a healthy one leaves 2 of 3, quorum 2: safe; with 2 healthy it is not.
    let mut c = three_healthy();
    add_member(&mut c, 7, "", Health::Unknown, false);
    add_machine(&mut c, "d");
    let f = delete(&c, "a", &human()).figures.expect("figures");
    assert_eq!(
        (f.voting, f.healthy, f.voting_after, f.healthy_after),
        (4, 3, 3, 2)
    );
}

/// Named case (a): cluster-api #2651.
#[test]
fn named_case_a_stuck_upgrade() {
    let mut c = cp(
        3,
        &[("new1", healthy()), ("b", healthy()), ("c", healthy())],
    );
    let i = add_machine(&mut c, "old");
    c.machines[i].created_unix = Some(NOW - 86_400);
    let v = delete(&c, "old", &human());
    assert_verdict(&v, true, Reason::MemberAbsent);
    assert_eq!(v.next_action.code, ActionCode::DeleteMachine);
    assert_eq!(v.next_action.target.as_deref(), Some("old"));
    assert_eq!(
        v.next_action.command.as_deref(),
        Some("kubectl delete machine -n ns old")
    );
}

/// Named case (b): a human deleting a healthy machine while another member is down.
#[test]
fn named_case_b_member_down() {
    let c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    let v = delete(&c, "a", &human());
    assert_verdict(&v, false, Reason::WouldLoseQuorum);
    assert!(
        v.message
            .contains("c (id 3, unhealthy: context deadline exceeded)"),
        "{}",
        v.message
    );
    assert_eq!(v.next_action.code, ActionCode::RemediateMachine);
    assert_eq!(v.next_action.target.as_deref(), Some("c"));
}

/// Named case (c): scaling 3 -> 5 with a member down.
#[test]
fn named_case_c_scale_up_with_member_down() {
    let c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    let v = scale(&c, 5);
    assert_verdict(&v, false, Reason::ScaleUpWouldLoseQuorum);
    let f = v.figures.expect("figures");
    assert_eq!((f.voting_after, f.healthy_after, f.quorum_after), (4, 2, 3));
}

#[test]
fn reason_strings_are_stable_and_unique() {
    let mut seen = std::collections::BTreeSet::new();
    for r in Reason::ALL {
        assert_eq!(format!("{r:?}"), r.as_str());
        assert!(seen.insert(r.as_str()));
    }
}
