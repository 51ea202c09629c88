//! One table per deletion rule (unconditional allows, break-glass, quorum, pending deletions and
//! joins, unknown health). Every expected value is worked out by hand from quorum(V) = V/2+1.

use std::time::Duration;

use super::{assert_verdict, three_healthy};
use crate::testkit::*;
use crate::*;

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
        // 2 healthy: remove one -> 1 of 1. spec.replicas is 2 (the table's), so KCP will
        // replace it, but only after this deletion has finished (it creates no Machine while
        // one is being deleted): the replacement cannot join before or between its steps. (A
        // person's deletion still counts it: `a_pending_join_counts_in_every_order`.)
        (
            &[("a", true), ("b", true)],
            "a",
            true,
            Reason::QuorumSafe,
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
    // With spec.replicas 3, KCP replaces them, but only once both deletions have finished
    // (KCP creates no Machine while one is being deleted): KCP's own deletion of b cannot be
    // overtaken by the replacement. A person's can (KCP may be scaling up meanwhile): with
    // voting joins, the first new member would join a single healthy member and vote before
    // it is healthy (1 of 2, quorum 2).
    c.kcp.replicas = 3;
    assert_verdict(
        &delete(&c, "b", &kcp_controller()),
        true,
        Reason::QuorumSafe,
    );
    let v = delete(&c, "b", &human());
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
    // A person's deletion: KCP may be adding the fifth member at the same moment.
    let v = delete(&c, "a", &human());
    assert_verdict(&v, false, Reason::PendingJoin);
    assert!(
        v.message.contains("fewer than spec.replicas 5"),
        "{}",
        v.message
    );
    assert!(
        v.message.contains("Joins here are voting (kubeadm v1.28.0"),
        "{}",
        v.message
    );
    // KCP's own deletion of a (a remediation): KCP remediates before it scales up and creates
    // no Machine while one is being deleted, so the fifth member comes after a has gone (and
    // its preflight then waits for d). Safe alone: 2 healthy of 3.
    assert_verdict(
        &delete(&c, "a", &kcp_controller()),
        true,
        Reason::QuorumSafe,
    );
    // With learner joins the fifth member does not vote before etcd promotes it in sync:
    // no join raises the quorum, for anyone.
    c.kcp.version = Some("v1.32.0".into());
    assert_verdict(
        &delete(&c, "a", &human()),
        false,
        Reason::BelowDesiredReplicas,
    );
    assert_verdict(
        &delete(&c, "a", &kcp_controller()),
        true,
        Reason::QuorumSafe,
    );
    c.kcp.version = Some("v1.28.0".into());
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
