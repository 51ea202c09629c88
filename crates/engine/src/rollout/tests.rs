//! The prediction's tests: whole rollouts played on small control planes.

use super::*;
use crate::model::*;
use crate::next_action::ActionCode;
use crate::testkit::*;

/// The control planes of these tests join learners, as KCP's kubeadm does by default since
/// v1.29 (the playground's too); voting joins set v1.28 (`voting_joins_*`).
fn cp(replicas: u32, members: &[(&str, Health)]) -> ControlPlane {
    let mut c = crate::testkit::cp(replicas, members);
    c.kcp.version = Some("v1.32.0".into());
    c
}

fn three() -> ControlPlane {
    cp(
        3,
        &[("m1", healthy()), ("m2", healthy()), ("m3", healthy())],
    )
}

fn predict(c: &ControlPlane) -> Preflight {
    preflight(c, &Policy::default(), NOW)
}

fn kinds(p: &Preflight) -> Vec<&'static str> {
    p.steps.iter().map(|s| s.kind.as_str()).collect()
}

#[test]
fn a_healthy_three_member_control_plane_is_ready_in_fifteen_steps() {
    let p = predict(&three());
    assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
    assert_eq!(p.total, 15);
    assert_eq!(
        kinds(&p)[..5],
        ["create", "join", "promote", "delete", "removed"]
    );
    assert_eq!(p.steps[3].machine, "m1", "the oldest outdated goes first");
    assert!(
        p.steps[3]
            .webhook
            .as_deref()
            .is_some_and(|w| w.starts_with("allowed"))
    );
    let ft: Vec<i64> = p.steps.iter().map(|s| s.counts.fault_tolerance).collect();
    assert!(ft.iter().all(|f| *f >= 1), "{ft:?}");
    // The new Machines replaced the old ones.
    let removed: Vec<&str> = p
        .steps
        .iter()
        .filter(|s| s.kind == StepKind::Removed)
        .map(|s| s.machine.as_str())
        .collect();
    assert_eq!(removed, ["m1", "m2", "m3"]);
    let f = p.steps[2].one_failure.as_ref().expect("a member can fail");
    assert!(f.quorum_kept && f.sticks_at.is_some(), "{f:?}");
}

#[test]
fn a_member_down_sticks_at_the_first_step() {
    let c = cp(3, &[("m1", healthy()), ("m2", down()), ("m3", healthy())]);
    let p = predict(&c);
    assert_eq!(
        p.readiness,
        Readiness::WouldStick { at: 1, of: 15 },
        "{}",
        p.summary()
    );
    assert_eq!(p.reason, ReadyReason::MemberUnhealthy);
    assert!(p.why.contains("m2"), "{}", p.why);
    assert_eq!(
        p.next_action.code,
        ActionCode::RemediateMachine,
        "{:?}",
        p.next_action
    );
}

#[test]
fn one_and_two_replicas_finish_but_are_unsafe_from_the_start() {
    for c in [
        cp(1, &[("m1", healthy())]),
        cp(2, &[("m1", healthy()), ("m2", healthy())]),
    ] {
        let p = predict(&c);
        let n = 5 * c.machines.len();
        assert_eq!(
            p.readiness,
            Readiness::Unsafe { at: 1, of: n },
            "{}",
            p.summary()
        );
        assert_eq!(p.steps.len(), n);
        assert_eq!(p.reason, ReadyReason::FaultToleranceZero);
        assert!(
            p.next_action.message.contains("--replicas=3"),
            "{:?}",
            p.next_action
        );
    }
}

#[test]
fn max_surge_zero_on_three_replicas_is_unsafe_at_its_first_removal() {
    let mut c = three();
    c.kcp.max_surge = 0;
    let p = predict(&c);
    assert_eq!(
        kinds(&p)[..5],
        ["delete", "removed", "create", "join", "promote"]
    );
    assert_eq!(
        p.readiness,
        Readiness::Unsafe { at: 2, of: 15 },
        "{}",
        p.summary()
    );
    let f = p.steps[1].one_failure.as_ref().expect("a member can fail");
    assert!(!f.quorum_kept, "{f:?}");
}

#[test]
fn a_leftover_unstarted_learner_sticks_at_the_first_step() {
    let mut c = three();
    add_member(&mut c, 9, "", healthy(), true);
    let p = predict(&c);
    assert_eq!(
        p.readiness,
        Readiness::WouldStick { at: 1, of: 15 },
        "{}",
        p.summary()
    );
    assert_eq!(p.reason, ReadyReason::LeftoverMember);
    assert_eq!(
        p.next_action.code,
        ActionCode::RemoveOrphanMember,
        "{:?}",
        p.next_action
    );
}

#[test]
fn a_learner_past_its_grace_sticks_and_a_young_one_is_promoted() {
    let mut c = three();
    add_machine(&mut c, "m4");
    add_member(&mut c, 4, "m4", healthy(), true);
    machine_mut(&mut c, "m4").node_name = None;
    let p = predict(&c);
    assert_eq!(p.reason, ReadyReason::LearnerNotPromoted, "{}", p.summary());
    assert_eq!(p.readiness, Readiness::WouldStick { at: 1, of: 17 });
    assert_eq!(
        p.next_action.code,
        ActionCode::PromoteLearner,
        "{:?}",
        p.next_action
    );
    machine_mut(&mut c, "m4").created_unix = Some(NOW - 30);
    let p = predict(&c);
    assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
    assert_eq!(kinds(&p)[..3], ["promote", "delete", "removed"]);
}

#[test]
fn four_machines_for_three_replicas_scale_down_first_and_finish() {
    let c = cp(
        3,
        &[
            ("m1", healthy()),
            ("m2", healthy()),
            ("m3", healthy()),
            ("m4", healthy()),
        ],
    );
    let p = predict(&c);
    assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
    assert_eq!(kinds(&p)[..3], ["delete", "removed", "create"]);
    assert_eq!(p.steps.len(), 17);
}

#[test]
fn a_machine_held_by_a_foreign_hook_sticks_and_kcps_own_finishes() {
    let mut c = cp(
        3,
        &[
            ("m1", healthy()),
            ("m2", healthy()),
            ("m3", healthy()),
            ("m4", healthy()),
        ],
    );
    let m = machine_mut(&mut c, "m4");
    m.deleting = true;
    m.annotations
        .insert(KCP_PRE_TERMINATE_HOOK.to_string(), String::new());
    let p = predict(&c);
    assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
    assert_eq!(p.steps[0].kind, StepKind::Removed);
    let m = machine_mut(&mut c, "m4");
    m.annotations.insert(
        "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup".into(),
        String::new(),
    );
    let p = predict(&c);
    // Once the deletion finishes: its removal, then fifteen steps.
    assert_eq!(
        p.readiness,
        Readiness::WouldStick { at: 1, of: 16 },
        "{}",
        p.summary()
    );
    assert_eq!(p.reason, ReadyReason::DeletionHeld);
    assert!(p.why.contains("backup"), "{}", p.why);
}

#[test]
fn five_replicas_with_one_down_stick_and_healthy_five_are_ready() {
    let names = ["m1", "m2", "m3", "m4", "m5"];
    let mut members: Vec<(&str, Health)> = names.iter().map(|n| (*n, healthy())).collect();
    let p = predict(&cp(5, &members));
    assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
    assert_eq!(p.total, 25);
    members[3].1 = down();
    let p = predict(&cp(5, &members));
    assert_eq!(
        p.readiness,
        Readiness::WouldStick { at: 1, of: 25 },
        "{}",
        p.summary()
    );
}

#[test]
fn readiness_is_preflight_without_the_failure_column() {
    for c in [
        three(),
        cp(1, &[("m1", healthy())]),
        cp(3, &[("m1", healthy()), ("m2", down()), ("m3", healthy())]),
    ] {
        let full = predict(&c);
        let mut light = readiness(&c, &Policy::default(), NOW);
        assert!(light.steps.iter().all(|s| s.one_failure.is_none()));
        assert!(full.steps.iter().all(|s| s.one_failure.is_some()));
        for (l, f) in light.steps.iter_mut().zip(&full.steps) {
            l.one_failure = f.one_failure.clone();
        }
        assert_eq!(light, full);
    }
}

#[test]
fn a_member_down_keeps_etcd_from_adding_the_next_learner() {
    // One more failure right after KCP created the new Machine: quorum holds, but etcd's
    // strict reconfiguration check refuses the join's member add until m1 is back.
    let p = predict(&three());
    assert_eq!(p.steps[0].kind, StepKind::Create);
    let f = p.steps[0].one_failure.as_ref().expect("a member can fail");
    assert_eq!(f.member, "m1");
    assert!(f.quorum_kept, "{f:?}");
    assert_eq!(f.sticks_at, Some(2), "{f:?}");
    assert!(
        f.text.contains("every voting member is connected"),
        "{}",
        f.text
    );
}

fn with_etcd(mut c: ControlPlane, version: Option<&str>) -> ControlPlane {
    if let EtcdState::Observed(s) = &mut c.etcd {
        for m in &mut s.members {
            m.version = version.map(str::to_string);
        }
    }
    c
}

fn five() -> ControlPlane {
    let names = ["m1", "m2", "m3", "m4", "m5"];
    let members: Vec<(&str, Health)> = names.iter().map(|n| (*n, healthy())).collect();
    cp(5, &members)
}

#[test]
fn a_join_with_one_of_five_down_follows_the_etcd_version() {
    // One member fails right after KCP created the sixth Machine: 5 voting, 4 connected.
    // Before etcd PR #21641 the join's learner add is refused until the member is back;
    // with it (3.5.30, 3.6.11, 3.7) 4 >= quorum(6) = 4 lets the learner in.
    for (version, strict) in [
        (None, true),
        (Some("3.4.23"), true),
        (Some("3.5.1"), true),
        (Some("3.5.29"), true),
        (Some("3.6.10"), true),
        (Some("3.5.30"), false),
        (Some("3.6.11"), false),
        (Some("3.7.0"), false),
    ] {
        let p = predict(&with_etcd(five(), version));
        assert_eq!(
            p.readiness,
            Readiness::Ready,
            "{version:?}: {}",
            p.summary()
        );
        assert_eq!(p.steps[0].kind, StepKind::Create);
        let f = p.steps[0].one_failure.as_ref().expect("a member can fail");
        assert!(f.quorum_kept, "{version:?}: {f:?}");
        let at_join = f.sticks_at == Some(2);
        assert_eq!(at_join, strict, "{version:?}: {f:?}");
        if strict {
            assert!(
                f.text.contains("every voting member is connected"),
                "{}",
                f.text
            );
            let shown = version.map_or(
                "etcd (version unknown, taken as before 3.5.30) adds".to_string(),
                |v| format!("etcd {v} adds"),
            );
            assert!(f.text.contains(&shown), "{version:?}: {}", f.text);
        } else {
            assert!(
                !f.text.contains("cannot add its member"),
                "{version:?}: {}",
                f.text
            );
        }
    }
}

#[test]
fn with_21641_one_of_three_down_still_keeps_the_learner_out() {
    // etcd's own e2e test: "1 out of 3 members is down, reject adding member" (2 < quorum(4)).
    let p = predict(&with_etcd(three(), Some("3.6.11")));
    let f = p.steps[0].one_failure.as_ref().expect("a member can fail");
    assert_eq!(f.sticks_at, Some(2), "{f:?}");
    assert!(
        f.text
            .contains("etcd 3.6.11 adds a member only while a quorum"),
        "{}",
        f.text
    );
    assert!(f.text.contains("3 needed"), "{}", f.text);
}

#[test]
fn a_refused_remediation_sticks_kcp_where_it_is() {
    let mut c = cp(3, &[("m1", healthy()), ("m2", down()), ("m3", healthy())]);
    machine_mut(&mut c, "m1")
        .annotations
        .insert(ANNOTATION_REMEDIATE.into(), String::new());
    let p = predict(&c);
    assert_eq!(
        p.readiness,
        Readiness::WouldStick { at: 1, of: 15 },
        "{}",
        p.summary()
    );
    assert_eq!(p.reason, ReadyReason::WebhookDenies, "{}", p.summary());
    assert!(
        p.why.contains("m1") && p.why.contains("retries"),
        "{}",
        p.why
    );
}

#[test]
fn unknown_health_cannot_be_judged() {
    let c = cp(
        3,
        &[
            ("m1", healthy()),
            ("m2", Health::Unknown),
            ("m3", healthy()),
        ],
    );
    let p = predict(&c);
    assert_eq!(p.readiness, Readiness::CannotJudge);
    assert_eq!(p.reason, ReadyReason::EtcdUnknown);
    let mut c = three();
    c.etcd = EtcdState::Unknown {
        reason: "connection refused".into(),
    };
    assert_eq!(predict(&c).readiness, Readiness::CannotJudge);
}

#[test]
fn a_healthy_rollouts_one_failure_column_names_a_member_that_is_not_leaving() {
    let p = predict(&three());
    let at_delete = &p.steps[3];
    assert_eq!(at_delete.kind, StepKind::Delete);
    let f = at_delete.one_failure.as_ref().expect("a member can fail");
    assert_ne!(f.member, "m1", "m1 is leaving");
    assert!(f.quorum_kept, "{f:?}");
    let last = p.steps.last().expect("steps");
    let f = last.one_failure.as_ref().expect("a member can fail");
    assert_eq!(f.sticks_at, None, "the rollout is done: {f:?}");
}

/// kubeadm v1.28 without the `EtcdLearnerMode` gate: voting joins.
fn voting(members: &[(&str, Health)]) -> ControlPlane {
    let mut c = cp(members.len() as u32, members);
    c.kcp.version = Some("v1.28.0".into());
    c
}

fn three_voting() -> ControlPlane {
    voting(&[("m1", healthy()), ("m2", healthy()), ("m3", healthy())])
}

#[test]
fn voting_joins_count_at_once_and_start_in_a_later_step() {
    for etcd in ["3.4.23", "3.5.30"] {
        let p = predict(&with_etcd(three_voting(), Some(etcd)));
        assert_eq!(
            kinds(&p)[..5],
            ["create", "join", "start", "delete", "removed"]
        );
        assert_eq!(
            p.steps[1].counts,
            Counts {
                voting: 4,
                healthy: 3,
                learners: 0,
                quorum: 3,
                fault_tolerance: 0
            }
        );
        // Every voting join of a 3-member control plane passes through fault tolerance 0.
        assert_eq!(
            p.readiness,
            Readiness::Unsafe { at: 2, of: 15 },
            "{}",
            p.summary()
        );
        assert!(p.why.contains("added and not started yet"), "{}", p.why);
        // One more failure in that window loses quorum until the new member starts.
        let f = p.steps[1].one_failure.as_ref().expect("a member can fail");
        assert!(!f.quorum_kept, "{f:?}");
        assert!(
            f.text.contains(
                "until the voting member added for Machine kcp-new1 starts or m1 is back"
            ),
            "{}",
            f.text
        );
        assert_eq!(p.steps.len(), 15);
    }
}

#[test]
fn the_learner_gate_on_v1_28_plays_learner_joins() {
    let mut c = three_voting();
    c.kcp.etcd_learner_mode = Some(true);
    let p = predict(&c);
    assert_eq!(kinds(&p)[..3], ["create", "join", "promote"]);
    assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
}

/// [`readiness_given`] with the control plane's own next action is [`readiness`], and the
/// prediction never works that next action out again: only the play's simulated control planes
/// are asked about.
#[test]
fn readiness_given_the_next_action_is_readiness_without_asking_again() {
    let policy = Policy::default();
    let one_down = cp(3, &[("m1", healthy()), ("m2", down()), ("m3", healthy())]);
    let unknown = cp(
        3,
        &[
            ("m1", healthy()),
            ("m2", Health::Unknown),
            ("m3", healthy()),
        ],
    );
    let mut probe_failed = three();
    probe_failed.etcd = EtcdState::Unknown {
        reason: "connection refused".into(),
    };
    let mut stalled_learner = three();
    add_machine(&mut stalled_learner, "m4");
    add_member(&mut stalled_learner, 4, "m4", healthy(), true);
    let mut young_learner = stalled_learner.clone();
    machine_mut(&mut young_learner, "m4").created_unix = Some(NOW - 30);
    let mut leftover = three();
    add_member(&mut leftover, 9, "", healthy(), true);
    let mut no_surge = three();
    no_surge.kcp.max_surge = 0;
    let mut paused = one_down.clone();
    paused.cluster.paused = true;
    let mut deleting = three();
    deleting.kcp.deleting = true;
    let mut external = three();
    external.kcp.etcd = EtcdTopology::External;
    let mut held = cp(
        3,
        &[
            ("m1", healthy()),
            ("m2", healthy()),
            ("m3", healthy()),
            ("m4", healthy()),
        ],
    );
    let m = machine_mut(&mut held, "m4");
    m.deleting = true;
    m.annotations.insert(
        "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup".into(),
        String::new(),
    );
    let mut hooked = three();
    machine_mut(&mut hooked, "m1").annotations.insert(
        "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup".into(),
        String::new(),
    );
    let mut refused = one_down.clone();
    machine_mut(&mut refused, "m1")
        .annotations
        .insert(ANNOTATION_REMEDIATE.into(), String::new());
    for (what, c) in [
        ("healthy", three()),
        ("a member down", one_down),
        ("a member's health unknown", unknown),
        ("the probe failed", probe_failed),
        ("a stalled learner", stalled_learner),
        ("a young learner", young_learner),
        ("a leftover learner", leftover),
        ("maxSurge 0", no_surge),
        ("paused with a member down", paused),
        ("being deleted", deleting),
        ("external etcd", external),
        ("a deletion held by a foreign hook", held),
        ("a refused remediation", refused),
        ("a foreign hook on the first Machine to go", hooked),
        ("one replica", cp(1, &[("m1", healthy())])),
        ("voting joins", three_voting()),
    ] {
        let next = crate::next_action::next_action(&c, &policy, NOW);
        let (given, asked) = next_actions_asked(|| readiness_given(&c, &next, &policy, NOW));
        assert_eq!(given, readiness(&c, &policy, NOW), "{what}");
        // A deletion the webhook denies at the first step is judged on the present itself,
        // and the denial's words end with its next action (`admit_deletion`): that one is
        // worked out again, by the play, not by the prediction.
        if what == "a foreign hook on the first Machine to go" {
            // Stuck past the first step, on nothing the present needs done: the stuck state's
            // own next action is what clears it, not the present's.
            assert_eq!(next.code, ActionCode::None);
            assert_eq!(given.readiness, Readiness::WouldStick { at: 5, of: 15 });
            assert_eq!(given.next_action.code, ActionCode::WaitForDeletion);
        }
        let again = usize::from(what == "a refused remediation");
        assert_eq!(
            asked.iter().filter(|a| **a == c).count(),
            again,
            "{what}: the given next action was worked out again"
        );
    }
}
