//! The named cases (cluster-api #2651 and its neighbours), what counts as unhealthy, and the
//! stability of the reason strings.

use super::{assert_verdict, three_healthy};
use crate::testkit::*;
use crate::*;

#[test]
fn corrupt_and_unstarted_members_are_unhealthy_nospace_is_not() {
    // CORRUPT: that member's data is wrong; it counts as unhealthy.
    let mut c = three_healthy();
    add_machine(&mut c, "d");
    members_mut(&mut c)[2].alarms.push(Alarm::Corrupt);
    let v = delete(&c, "a", &human());
    assert_verdict(&v, false, Reason::WouldLoseQuorum);
    assert!(v.message.contains("alarm CORRUPT"), "{}", v.message);
    // NOSPACE stops every member's writes, but raft keeps its quorum and membership still
    // changes (docs/rules.md, what NOSPACE does): the same deletion keeps quorum (2 of 2), and
    // the warning and the next action say to free space. (KCP's deletion: a person's would
    // be held by the desired-replicas rule, d having no member.)
    members_mut(&mut c)[2].alarms = vec![Alarm::NoSpace];
    let v = delete(&c, "a", &kcp_controller());
    assert_verdict(&v, true, Reason::QuorumSafe);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("NOSPACE alarm: quorum holds")),
        "{:?}",
        v.warnings
    );
    assert_eq!(v.next_action.code, ActionCode::FreeSpace);
    assert!(!v.message.contains("snapshot"), "{}", v.message);
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

/// A NOSPACE alarm stops writes, not raft: no verdict, table or next action calls it quorum
/// loss, and none advises a snapshot restore (issue: a NOSPACE alarm on one member of two, or
/// on a single member, was denied `QuorumLost` with "restore etcd from a snapshot").
#[test]
fn nospace_is_never_quorum_loss() {
    // Two members, one raised NOSPACE.
    let mut c = cp(2, &[("a", healthy()), ("b", healthy())]);
    members_mut(&mut c)[1].alarms.push(Alarm::NoSpace);
    for v in [
        delete(&c, "b", &kcp_controller()),
        delete(&c, "a", &kcp_controller()),
        scale(&c, 3),
    ] {
        assert!(v.allowed, "{v:?}");
        assert_ne!(v.reason, Reason::QuorumLost);
        assert!(!v.message.contains("snapshot"), "{}", v.message);
        assert!(
            v.warnings.iter().any(|w| w.contains("NOSPACE alarm")),
            "{:?}",
            v.warnings
        );
        assert_eq!(v.next_action.code, ActionCode::FreeSpace);
        assert!(!v.next_action.message.contains("snapshot"));
    }
    // A single member with NOSPACE: it may grow (the scale-up is the single member's), its
    // deletion is refused as the last member's, never as a lost quorum.
    let mut c = cp(1, &[("a", healthy())]);
    members_mut(&mut c)[0].alarms.push(Alarm::NoSpace);
    assert_verdict(&scale(&c, 3), true, Reason::SingleMemberScaleUp);
    let v = delete(&c, "a", &kcp_controller());
    assert_verdict(&v, false, Reason::LastMember);
    assert_eq!(v.next_action.code, ActionCode::FreeSpace);
    assert!(!v.message.contains("snapshot"), "{}", v.message);
    c.kcp.version = Some("v1.32.0".into());
    assert_verdict(&scale(&c, 3), true, Reason::ScaleUpSafe);
}

/// Cluster API's `TestReconcileUnhealthyMachinesSequences` "Remediates the second CP machine
/// having problems to come up": m1 healthy (leader), m2's member up but its Machine marked for
/// remediation, replicas 3. KCP v1.14 deletes m2 (its hook removes the member: 1 of 1), then
/// scales up: no step loses quorum. The guard allows KCP's deletion, with learner joins and
/// with voting joins (the replacement comes after the deletion), and a person's with neither
/// (the desired-replicas rule, or a voting join that KCP may be adding meanwhile).
#[test]
fn kcp_remediates_the_second_machine_that_failed_to_come_up() {
    let mut c = cp(3, &[("m1", healthy()), ("m2", healthy())]);
    members_mut(&mut c)[0].is_leader = true;
    machine_mut(&mut c, "m2")
        .annotations
        .insert(ANNOTATION_REMEDIATE.into(), String::new());
    for version in ["v1.32.0", "v1.28.0"] {
        c.kcp.version = Some(version.into());
        let v = delete(&c, "m2", &kcp_controller());
        assert_verdict(&v, true, Reason::QuorumSafe);
        // The published action is not a wait for a scale-up that KCP never starts: KCP's
        // remediation goes through, then it scales.
        assert_ne!(v.next_action.code, ActionCode::CheckEtcdHealth, "{version}");
    }
    // With voting joins the allow says what the replacement's join costs.
    let v = delete(&c, "m2", &kcp_controller());
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("unavailable until the new one has started")),
        "{:?}",
        v.warnings
    );
    assert_verdict(&delete(&c, "m2", &human()), false, Reason::PendingJoin);
    c.kcp.version = Some("v1.32.0".into());
    assert_verdict(
        &delete(&c, "m2", &human()),
        false,
        Reason::BelowDesiredReplicas,
    );
}

/// With learner joins a scale-up with a member down cannot lose quorum: allowed, and the
/// warning says what holds it (KCP's preflight, etcd's strict reconfiguration check), never
/// "would lose quorum". With voting joins the first new member votes before it is healthy.
#[test]
fn a_scale_up_with_a_member_down_follows_the_join_style() {
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    let v = scale(&c, 5);
    assert_verdict(&v, false, Reason::ScaleUpWouldLoseQuorum);
    c.kcp.version = Some("v1.32.0".into());
    let v = scale(&c, 5);
    assert_verdict(&v, true, Reason::ScaleUpSafe);
    assert!(
        v.message.contains("learner (kubeadm v1.32.0)"),
        "{}",
        v.message
    );
    assert!(!v.message.contains("would lose"), "{}", v.message);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("until every etcd member is healthy")),
        "{:?}",
        v.warnings
    );
    // Quorum lost: no member can be added at all.
    members_mut(&mut c)[1].health = down();
    assert_verdict(&scale(&c, 5), false, Reason::QuorumLost);
    // v1.29 with the gate switched off joins voting members again.
    members_mut(&mut c)[1].health = healthy();
    c.kcp.version = Some("v1.30.2".into());
    c.kcp.etcd_learner_mode = Some(false);
    assert_verdict(&scale(&c, 5), false, Reason::ScaleUpWouldLoseQuorum);
}

/// A remediation the guard refuses holds Cluster API v1.14's KCP (it retries the same one and
/// does nothing else): the next action names what unblocks it, never a wait.
#[test]
fn a_refused_remediation_names_the_way_out() {
    // m2 healthy and marked for remediation, m3 down: KCP's deletion of m2 would leave 1
    // healthy of 2.
    let mut c = cp(3, &[("m1", healthy()), ("m2", healthy()), ("m3", down())]);
    machine_mut(&mut c, "m2")
        .annotations
        .insert(ANNOTATION_REMEDIATE.into(), String::new());
    let v = delete(&c, "m2", &kcp_controller());
    assert_verdict(&v, false, Reason::WouldLoseQuorum);
    let n = next(&c);
    assert_eq!(n.code, ActionCode::CheckEtcdHealth, "{}", n.message);
    assert!(
        n.message.contains("KCP is remediating Machine ns/m2"),
        "{}",
        n.message
    );
    assert!(n.message.contains("m3"), "{}", n.message);
    assert_eq!(
        n.command.as_deref(),
        Some("kubectl annotate machine -n ns m2 cluster.x-k8s.io/remediate-machine-")
    );
    // Marked too, the down m3 is KCP's first pick (the sickest first), and its deletion is
    // allowed: no way out needed.
    machine_mut(&mut c, "m3")
        .annotations
        .insert(ANNOTATION_REMEDIATE.into(), String::new());
    assert_ne!(next(&c).code, ActionCode::CheckEtcdHealth);
}

/// A CORRUPT member still votes (the alarm refuses its reads and writes, not raft): with one
/// healthy member and one corrupt one, quorum holds as raft counts it, so nothing says
/// `QuorumLost` or advises a snapshot restore, and removing the corrupt member (1 healthy of 1
/// after) is allowed: it is the way out.
#[test]
fn a_corrupt_member_of_two_is_removable_not_a_lost_quorum() {
    let mut c = cp(2, &[("a", healthy()), ("b", healthy())]);
    members_mut(&mut c)[1].alarms.push(Alarm::Corrupt);
    let v = delete(&c, "b", &kcp_controller());
    assert_verdict(&v, true, Reason::QuorumSafe);
    // Removing the healthy one would leave only the corrupt member.
    let v = delete(&c, "a", &kcp_controller());
    assert_verdict(&v, false, Reason::WouldLoseQuorum);
    assert!(!v.message.contains("snapshot"), "{}", v.message);
    assert_ne!(
        v.next_action.code,
        ActionCode::RestoreQuorum,
        "{}",
        v.next_action.message
    );
    // The corrupt member down as well: raft has lost its quorum (1 of 2).
    members_mut(&mut c)[1].health = down();
    assert_verdict(
        &delete(&c, "b", &kcp_controller()),
        false,
        Reason::QuorumLost,
    );
}
