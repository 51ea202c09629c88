//! Tests of the two conditions and of merging them into a KCP's status.
use std::time::Duration;

use super::*;
use quorumguard_engine::Alarm;

use quorumguard_engine::testkit::{NOW, add_machine, down, healthy, members_mut};

/// Copied from the KCP v1beta2 CRD (`status.conditions[].reason.pattern`).
const CRD_REASON_PATTERN: &str = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$";

/// The engine kit's control plane (KCP `ns/kcp`, one Machine and voting member per entry, IDs
/// 1, 2, ...), with a 3 s old probe and the status fields the member table shows; the first
/// member leads.
fn cp(replicas: u32, members: &[(&str, Health)]) -> ControlPlane {
    let mut c = quorumguard_engine::testkit::cp(replicas, members);
    if let EtcdState::Observed(s) = &mut c.etcd {
        s.age = Some(Duration::from_secs(3));
    }
    for (i, m) in members_mut(&mut c).iter_mut().enumerate() {
        m.is_leader = i == 0;
        m.version = Some("3.5.16".into());
        m.db_size = Some(24 * 1024 * 1024);
        m.raft_index = Some(1234 + i as u64);
    }
    c
}

fn three_healthy() -> ControlPlane {
    cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())])
}

fn conds(c: &ControlPlane, probe_error: Option<&str>) -> [Condition; 2] {
    conditions(c, &Policy::default(), NOW, Some(7), probe_error)
}

fn assert_cond(c: &Condition, status: &str, reason: &str) {
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        (status, reason),
        "{}",
        c.message
    );
}

fn has_line(message: &str, line: &str) {
    assert!(
        message.lines().any(|l| l == line),
        "no line {line:?} in:\n{message}"
    );
}

#[test]
fn healthy_three() {
    let [q, n] = conds(&three_healthy(), None);
    assert_eq!(q.type_, CONDITION_ETCD_QUORUM);
    assert_cond(&q, "True", "Healthy");
    assert_eq!(q.observed_generation, Some(7));
    assert_eq!(q.last_transition_time, time_of(NOW));
    has_line(
        &q.message,
        "etcd of KubeadmControlPlane ns/kcp: 3 voting, 3 healthy, quorum 2, fault tolerance 1; joins: voting (kubeadm v1.28.0, EtcdLearnerMode off by default before v1.29)",
    );
    has_line(
        &q.message,
        "member a (id 1): voting, healthy, leader, version 3.5.16, db 24.0 MiB, raft index 1234, no alarms, Machine ns/a (node a)",
    );
    has_line(
        &q.message,
        "member c (id 3): voting, healthy, follower, version 3.5.16, db 24.0 MiB, raft index 1236, no alarms, Machine ns/c (node c)",
    );
    assert_eq!(q.message.lines().count(), 5, "{}", q.message);
    assert_eq!(n.type_, CONDITION_NEXT_ACTION);
    assert_cond(&n, "False", "None");
    assert!(n.message.contains("converged"), "{}", n.message);
}

#[test]
fn one_member_unhealthy() {
    let c = cp(3, &[("a", healthy()), ("b", down()), ("c", healthy())]);
    let [q, n] = conds(&c, None);
    assert_cond(&q, "False", "MembersUnhealthy");
    assert!(
        q.message
            .starts_with("member b (id 2) is unhealthy: context deadline exceeded\n")
    );
    has_line(
        &q.message,
        "etcd of KubeadmControlPlane ns/kcp: 3 voting, 2 healthy, quorum 2, fault tolerance 0; joins: voting (kubeadm v1.28.0, EtcdLearnerMode off by default before v1.29)",
    );
    has_line(
        &q.message,
        "member b (id 2): voting, unhealthy: context deadline exceeded, version 3.5.16, db 24.0 MiB, raft index 1235, no alarms, Machine ns/b (node b)",
    );
    assert_cond(&n, "True", "RemediateMachine");
    assert!(
        n.message
            .contains("kubectl annotate machine -n ns b cluster.x-k8s.io/remediate-machine"),
        "{}",
        n.message
    );
}

#[test]
fn alarms_and_multiline_errors_stay_on_one_line() {
    let mut c = three_healthy();
    members_mut(&mut c)[0].alarms = vec![Alarm::NoSpace];
    let [q, _] = conds(&c, None);
    assert_cond(&q, "False", "MembersUnhealthy");
    has_line(
        &q.message,
        "member a (id 1): voting, healthy, leader, version 3.5.16, db 24.0 MiB, raft index 1234, alarms NOSPACE, Machine ns/a (node a)",
    );
    assert!(
        q.message.starts_with("member a (id 1) raised a NOSPACE alarm: etcd refuses writes on every member until space is freed (quorum holds)"),
        "{}",
        q.message
    );
    // CORRUPT: that member's data is wrong, it is unhealthy.
    members_mut(&mut c)[0].alarms = vec![Alarm::Corrupt];
    let [q, _] = conds(&c, None);
    assert_cond(&q, "False", "MembersUnhealthy");
    has_line(
        &q.message,
        "member a (id 1): voting, unhealthy: alarm CORRUPT, leader, version 3.5.16, db 24.0 MiB, raft index 1234, alarms CORRUPT, Machine ns/a (node a)",
    );
    let mut c = three_healthy();
    members_mut(&mut c)[1].health = Health::Unhealthy("first\nsecond".into());
    let [q, _] = conds(&c, None);
    assert_cond(&q, "False", "MembersUnhealthy");
    assert!(
        q.message.contains("unhealthy: first second"),
        "{}",
        q.message
    );
    assert_eq!(q.message.lines().count(), 5, "{}", q.message);
}

/// A NOSPACE alarm on every member: etcd refuses writes, but it has not lost quorum (the members
/// serve reads and raft). The condition must not say "quorum lost" (which points at a restore
/// from a snapshot); the next action frees space.
#[test]
fn a_nospace_alarm_everywhere_is_not_quorum_lost() {
    let mut c = three_healthy();
    for m in members_mut(&mut c) {
        m.alarms = vec![Alarm::NoSpace];
    }
    let [q, n] = conds(&c, None);
    assert_cond(&q, "False", "MembersUnhealthy");
    assert!(!q.message.contains("lost quorum"), "{}", q.message);
    assert_cond(&n, "True", "FreeSpace");
    // Members truly down as well: quorum is lost, whatever the alarm.
    let mut c = cp(3, &[("a", down()), ("b", down()), ("c", healthy())]);
    members_mut(&mut c)[2].alarms = vec![Alarm::NoSpace];
    let [q, _] = conds(&c, None);
    assert_cond(&q, "False", "QuorumLost");
}

/// cluster-api #2651: KCP removed `old`'s member but never deleted the Machine.
#[test]
fn stuck_2651() {
    let mut c = three_healthy();
    add_machine(&mut c, "old");
    let [q, n] = conds(&c, None);
    assert_cond(&q, "False", "MembershipMismatch");
    assert!(q.message.starts_with("Machine ns/old has no etcd member\n"));
    has_line(&q.message, "Machine ns/old (node old): no etcd member");
    assert_cond(&n, "True", "DeleteMachine");
    assert!(
        n.message.contains("Run: kubectl delete machine -n ns old"),
        "{}",
        n.message
    );
}

#[test]
fn orphans_learners_and_unstarted_are_mismatches() {
    let mut c = three_healthy();
    let mut orphan = Member::new(0xdead, "gone");
    orphan.health = Health::Healthy;
    members_mut(&mut c).push(orphan);
    let [q, _] = conds(&c, None);
    assert_cond(&q, "False", "MembershipMismatch");
    assert!(q.message.contains("member gone (id dead) has no Machine"));
    has_line(
        &q.message,
        "member gone (id dead): voting, healthy, follower, version unknown, db size unknown, raft index unknown, no alarms, no Machine",
    );

    let mut c = three_healthy();
    add_machine(&mut c, "l");
    let mut learner = Member::new(9, "l");
    learner.health = Health::Healthy;
    learner.is_learner = true;
    members_mut(&mut c).push(learner);
    let [q, _] = conds(&c, None);
    assert_cond(&q, "False", "MembershipMismatch");
    assert!(q.message.contains(", 1 learner(s)"), "{}", q.message);
    assert!(q.message.contains("member l (id 9): learner, healthy"));

    // An added member that never started counts as unhealthy: that is what it is to quorum.
    let mut c = three_healthy();
    members_mut(&mut c).push(Member::new(0x63, ""));
    let [q, _] = conds(&c, None);
    assert_cond(&q, "False", "MembersUnhealthy");
    assert!(
        q.message.contains(
            "member (unstarted 63) (id 63): voting, unhealthy: member added but not started"
        ),
        "{}",
        q.message
    );
}

#[test]
fn no_fault_tolerance() {
    let [q, n] = conds(&cp(1, &[("a", healthy())]), None);
    assert_cond(&q, "False", "NoFaultTolerance");
    has_line(
        &q.message,
        "etcd of KubeadmControlPlane ns/kcp: 1 voting, 1 healthy, quorum 1, fault tolerance 0; joins: voting (kubeadm v1.28.0, EtcdLearnerMode off by default before v1.29)",
    );
    assert_cond(&n, "False", "None");
}

#[test]
fn quorum_lost() {
    let c = cp(3, &[("a", healthy()), ("b", down()), ("c", down())]);
    let [q, n] = conds(&c, None);
    assert_cond(&q, "False", "QuorumLost");
    assert!(
        q.message
            .starts_with("etcd has lost quorum: 1 healthy of 3 voting members, quorum 2\n")
    );
    assert!(q.message.contains("fault tolerance none (quorum lost)"));
    assert_cond(&n, "True", "RestoreQuorum");
}

#[test]
fn etcd_unknown_with_probe_error() {
    let mut c = three_healthy();
    let err = "dial tcp 10.0.0.1:2379: connect: connection refused";
    c.etcd = EtcdState::Unknown { reason: err.into() };
    let [q, n] = conds(&c, Some(err));
    assert_cond(&q, "Unknown", "ProbeFailed");
    assert!(q.message.contains(err), "{}", q.message);
    assert_eq!(q.message.matches(err).count(), 1, "{}", q.message);
    has_line(&q.message, "Machine ns/a (node a): etcd member unknown");
    assert_cond(&n, "True", "CheckEtcdHealth");

    // A failed probe after an earlier good one: the last table, marked as such.
    let [q, _] = conds(&three_healthy(), Some("timed out"));
    assert_cond(&q, "Unknown", "ProbeFailed");
    assert!(
        q.message
            .starts_with("the latest etcd probe failed: timed out. Last observed membership:\n")
    );
    assert!(q.message.contains("member a (id 1): voting, healthy"));
}

#[test]
fn stale_probe_is_unknown() {
    let mut c = three_healthy();
    if let EtcdState::Observed(s) = &mut c.etcd {
        s.age = Some(Duration::from_secs(600));
    }
    let [q, _] = conds(&c, None);
    assert_cond(&q, "Unknown", "ProbeFailed");
    assert!(q.message.contains("older than 60s"), "{}", q.message);
    assert!(
        q.message
            .contains("3 voting, 0 healthy, quorum 2, fault tolerance unknown, 3 unknown"),
        "{}",
        q.message
    );
}

#[test]
fn external_etcd() {
    let mut c = three_healthy();
    c.kcp.etcd = EtcdTopology::External;
    let [q, n] = conds(&c, None);
    assert_cond(&q, "Unknown", "ExternalEtcd");
    assert_cond(&n, "False", "None");
}

/// A matcher for exactly the CRD's reason pattern shape `^[F]([M]*[L])?$`: the classes are
/// read from the copied pattern, so a change of the CRD's classes is caught by updating it.
fn matches_reason_pattern(pattern: &str, s: &str) -> bool {
    fn class(spec: &str) -> impl Fn(char) -> bool + '_ {
        move |c| {
            let b: Vec<char> = spec.chars().collect();
            let mut i = 0;
            while i < b.len() {
                if i + 2 < b.len() && b[i + 1] == '-' {
                    if (b[i]..=b[i + 2]).contains(&c) {
                        return true;
                    }
                    i += 3;
                } else {
                    if b[i] == c {
                        return true;
                    }
                    i += 1;
                }
            }
            false
        }
    }
    let rest = pattern.strip_prefix("^[").expect("shape");
    let (first, rest) = rest.split_once("](").expect("shape");
    let rest = rest.strip_prefix('[').expect("shape");
    let (middle, rest) = rest.split_once("]*[").expect("shape");
    let (last, rest) = rest.split_once(']').expect("shape");
    assert_eq!(rest, ")?$", "unexpected pattern shape");
    let (first, middle, last) = (class(first), class(middle), class(last));
    let chars: Vec<char> = s.chars().collect();
    match chars.as_slice() {
        [] => false,
        [f] => first(*f),
        [f, mid @ .., l] => first(*f) && mid.iter().all(|c| middle(*c)) && last(*l),
    }
}

#[test]
fn reasons_match_the_crd_pattern() {
    let p = CRD_REASON_PATTERN;
    // The matcher itself.
    assert!(matches_reason_pattern(p, "A"));
    assert!(matches_reason_pattern(p, "Foo_Bar,Baz:1"));
    for bad in ["", "1A", "A:", "A,", "A-B", "A B", "Ä"] {
        assert!(!matches_reason_pattern(p, bad), "{bad:?}");
    }
    let codes = ActionCode::ALL;
    // Fails to compile when a code is added, so ActionCode::ALL is kept complete.
    let _ = |c: ActionCode| match c {
        ActionCode::None
        | ActionCode::WaitForTeardown
        | ActionCode::CheckEtcdHealth
        | ActionCode::RestoreQuorum
        | ActionCode::FreeSpace
        | ActionCode::DeleteMachine
        | ActionCode::WaitForDeletion
        | ActionCode::WaitForJoin
        | ActionCode::WaitForLearner
        | ActionCode::PromoteLearner
        | ActionCode::RemoveOrphanMember
        | ActionCode::RemediateMachine
        | ActionCode::EnableRemediation
        | ActionCode::WaitForRollout
        | ActionCode::Unpause => (),
    };
    let reasons = QuorumReason::ALL
        .iter()
        .map(|r| r.as_str())
        .chain(codes.iter().map(|c| c.as_str()));
    for r in reasons {
        assert!(matches_reason_pattern(p, r), "{r}");
        assert!(r.len() <= 1024);
    }
}

#[test]
fn condition_types_are_valid() {
    // `prefix/Name`: prefix a lowercase DNS subdomain, Name alphanumeric plus -_. inside;
    // at most 316 characters.
    for t in [CONDITION_ETCD_QUORUM, CONDITION_NEXT_ACTION] {
        let (prefix, name) = t.split_once('/').expect("prefixed");
        assert!(t.len() <= 316);
        assert!(prefix.split('.').all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        }));
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric()), "{name}");
    }
}

fn foreign(t: &str) -> Condition {
    Condition {
        type_: t.into(),
        status: "True".into(),
        reason: "Because".into(),
        message: format!("owned by someone else: {t}"),
        observed_generation: Some(3),
        last_transition_time: time_of(NOW - 10_000),
    }
}

#[test]
fn merge_keeps_foreign_conditions_in_place() {
    let [q, n] = conds(&three_healthy(), None);
    let mut old_q = q.clone();
    old_q.status = "False".into();
    old_q.reason = "MembersUnhealthy".into();
    old_q.last_transition_time = time_of(NOW - 500);
    let existing = vec![
        foreign("Available"),
        old_q,
        foreign("EtcdClusterAvailable"),
        foreign("example.com/Other"),
    ];
    let merged = merge(&existing, [q.clone(), n.clone()], NOW).expect("changed");
    let types: Vec<&str> = merged.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        [
            "Available",
            CONDITION_ETCD_QUORUM,
            "EtcdClusterAvailable",
            "example.com/Other",
            CONDITION_NEXT_ACTION
        ]
    );
    assert_eq!(merged[0], existing[0]);
    assert_eq!(merged[2], existing[2]);
    assert_eq!(merged[3], existing[3]);
    assert_eq!(merged[1], q);
    // Status changed: the transition is now.
    assert_eq!(merged[1].last_transition_time, time_of(NOW));
    assert_eq!(merged[4], n);
}

#[test]
fn merge_returns_none_when_nothing_changed() {
    let [q, n] = conds(&three_healthy(), None);
    let first = merge(&[foreign("Available")], [q, n], NOW).expect("added");
    // A later, identical computation writes nothing.
    let again = conditions(
        &three_healthy(),
        &Policy::default(),
        NOW + 30,
        Some(7),
        None,
    );
    assert_eq!(merge(&first, again, NOW + 30), None);
    // A new generation alone is a change.
    let newer = conditions(
        &three_healthy(),
        &Policy::default(),
        NOW + 30,
        Some(8),
        None,
    );
    let merged = merge(&first, newer, NOW + 30).expect("generation changed");
    assert_eq!(merged[1].observed_generation, Some(8));
    assert_eq!(merged[1].last_transition_time, time_of(NOW));
}

#[test]
fn merge_keeps_transition_time_when_only_the_message_changes() {
    let first = merge(&[], conds(&three_healthy(), None), NOW).expect("added");
    let mut c = three_healthy();
    members_mut(&mut c)[0].raft_index = Some(99_999);
    let later = conditions(&c, &Policy::default(), NOW + 60, Some(7), None);
    let merged = merge(&first, later, NOW + 60).expect("message changed");
    assert_ne!(merged[0].message, first[0].message);
    assert_eq!(merged[0].last_transition_time, time_of(NOW));
    assert_eq!(merged[1], first[1]);
    // A status change moves it.
    let c = cp(3, &[("a", healthy()), ("b", down()), ("c", healthy())]);
    let later = conditions(&c, &Policy::default(), NOW + 120, Some(7), None);
    let merged = merge(&first, later, NOW + 120).expect("status changed");
    assert_eq!(merged[0].last_transition_time, time_of(NOW + 120));
    assert_eq!(merged[1].last_transition_time, time_of(NOW + 120));
}

#[test]
fn merge_never_exceeds_32_conditions() {
    let many = |n: usize| -> Vec<Condition> {
        (0..n)
            .map(|i| foreign(&format!("example.com/C{i}")))
            .collect()
    };
    let new = || conds(&three_healthy(), None);
    // 31 + 2 > 32: nothing is added, and the caller can tell why.
    assert!(lacks_room(&many(31), &new()));
    assert_eq!(merge(&many(31), new(), NOW), None);
    assert!(!lacks_room(&many(30), &new()));
    let full = merge(&many(30), new(), NOW).expect("fits");
    assert_eq!(full.len(), MAX_CONDITIONS);
    // Ours already in a full list: still updated in place.
    let c = cp(3, &[("a", healthy()), ("b", down()), ("c", healthy())]);
    let updated = merge(&full, conds(&c, None), NOW + 1).expect("changed");
    assert_eq!(updated.len(), MAX_CONDITIONS);
    assert_eq!(updated[30].reason, "MembersUnhealthy");
    // One of ours present, 32 in all: the other does not fit.
    let mut one = many(31);
    one.push(new()[0].clone());
    assert_eq!(merge(&one, new(), NOW), None);
    assert!(lacks_room(&one, &new()));
}

#[test]
fn message_length_is_bounded() {
    // 40 members with long, multi-byte error texts.
    let names: Vec<String> = (0..40).map(|i| format!("member-{i:02}")).collect();
    let entries: Vec<(&str, Health)> = names
        .iter()
        .map(|n| (n.as_str(), Health::Unhealthy("é".repeat(500))))
        .collect();
    let c = cp(40, &entries);
    let [q, n] = conds(&c, None);
    assert!(q.message.len() <= MAX_MESSAGE_LEN, "{}", q.message.len());
    assert!(q.message.chars().count() <= MAX_MESSAGE_LEN);
    assert!(q.message.ends_with(TRUNCATED_NOTE));
    assert!(q.message.len() > MAX_MESSAGE_LEN / 2);
    assert!(n.message.len() <= MAX_MESSAGE_LEN);

    // One line longer than the limit: cut inside it, at a char boundary.
    let s = bounded("é".repeat(MAX_MESSAGE_LEN));
    assert!(s.len() <= MAX_MESSAGE_LEN);
    assert!(s.ends_with(TRUNCATED_NOTE));
    assert!(s.starts_with("éé"));
    // Short messages are untouched.
    assert_eq!(bounded("x\ny".into()), "x\ny");
}

#[test]
fn human_units() {
    assert_eq!(human_bytes(0), "0 B");
    assert_eq!(human_bytes(1023), "1023 B");
    assert_eq!(human_bytes(1536), "1.5 KiB");
    assert_eq!(human_bytes(2 * 1024 * 1024 * 1024), "2.0 GiB");
    assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
}

/// The member table says when a remediation would not reach KCP, and the next action asks for a
/// MachineHealthCheck; a covered control plane gets no such line.
#[test]
fn the_member_table_says_no_machine_health_check_covers_the_machines() {
    let mut c = cp(3, &[("a", healthy()), ("b", down()), ("c", healthy())]);
    let [q, n] = conds(&c, None);
    assert!(!q.message.contains("MachineHealthCheck"), "{}", q.message);
    assert_cond(&n, "True", "RemediateMachine");
    c.health_checks = quorumguard_engine::HealthChecks::Known(Vec::new());
    let [q, n] = conds(&c, None);
    has_line(
        &q.message,
        "no MachineHealthCheck covers the Machines: remediate-machine annotations do nothing",
    );
    assert_cond(&n, "True", "EnableRemediation");
    assert!(
        n.message.contains("Create a MachineHealthCheck"),
        "{}",
        n.message
    );
}
