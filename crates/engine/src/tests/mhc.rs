//! MachineHealthCheck coverage in the next action: `RemediateMachine` only where a
//! MachineHealthCheck passes the remediation on to KCP (v1.14 `needsRemediation`,
//! `isAllowedRemediation`), `EnableRemediation` saying what is missing otherwise, and unknown
//! coverage never called "none".

use crate::testkit::*;
use crate::*;

/// Three Machines, `b`'s member down: KCP should replace `b`.
fn b_down() -> ControlPlane {
    cp(3, &[("a", healthy()), ("b", down()), ("c", healthy())])
}

fn only_check(c: &mut ControlPlane) -> &mut HealthCheck {
    match &mut c.health_checks {
        HealthChecks::Known(v) => v.first_mut().expect("testkit's MachineHealthCheck"),
        HealthChecks::Unknown { .. } => panic!("unknown"),
    }
}

#[test]
fn covered_and_allowed_is_remediate() {
    let c = b_down();
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemediateMachine, "{}", a.message);
    assert_eq!(a.target.as_deref(), Some("b"));
    assert!(matches!(coverage(&c, &c.machines[1]), Coverage::Remediates(h) if h.name == "kcp-mhc"));
}

#[test]
fn no_health_check_says_create_one() {
    let mut c = b_down();
    c.health_checks = HealthChecks::Known(Vec::new());
    let a = next(&c);
    assert_eq!(a.code, ActionCode::EnableRemediation, "{}", a.message);
    assert_eq!(a.target.as_deref(), Some("b"));
    assert_eq!(a.command, None);
    assert!(
        a.message
            .contains("no MachineHealthCheck covers Machine ns/b")
            && a.message.contains("Create a MachineHealthCheck")
            && a.message.contains("docs/runbook.md"),
        "{}",
        a.message
    );
    assert!(
        !a.message.contains("kubectl annotate machine -n"),
        "{}",
        a.message
    );
}

#[test]
fn a_check_that_covers_other_machines_only_is_none_for_this_one() {
    let mut c = b_down();
    only_check(&mut c).targets = vec!["a".into(), "c".into()];
    let a = next(&c);
    assert_eq!(a.code, ActionCode::EnableRemediation, "{}", a.message);
    let line = remediation::summary(&c);
    assert!(
        line.contains("covers 2 of the Machines") && line.contains("none covers b"),
        "{line}"
    );
}

#[test]
fn paused_check_says_unpause() {
    let mut c = b_down();
    only_check(&mut c).paused = true;
    let a = next(&c);
    assert_eq!(a.code, ActionCode::EnableRemediation, "{}", a.message);
    assert!(a.message.contains("is paused"), "{}", a.message);
    assert_eq!(
        a.command.as_deref(),
        Some("kubectl annotate machinehealthcheck -n ns kcp-mhc cluster.x-k8s.io/paused-")
    );
}

#[test]
fn short_circuit_at_most() {
    // 40% of 3 is 1 (rounded down, as getMaxUnhealthy does). One other Machine already counted
    // unhealthy: with b marked, 2 > 1.
    let mut c = b_down();
    let hc = only_check(&mut c);
    hc.trigger = Trigger::AtMost(Limit::Percent(40));
    hc.counts = Some(HealthCheckCounts {
        expected: 3,
        unhealthy: 1,
    });
    let a = next(&c);
    assert_eq!(a.code, ActionCode::EnableRemediation, "{}", a.message);
    assert!(
        a.message.contains("short-circuits")
            && a.message.contains("2 of its 3 Machines")
            && a.message.contains("unhealthyLessThanOrEqualTo 40%"),
        "{}",
        a.message
    );
    // Counted healthy so far: b marked makes 1, which 40% of 3 allows.
    only_check(&mut c).counts = Some(HealthCheckCounts {
        expected: 3,
        unhealthy: 0,
    });
    assert_eq!(next(&c).code, ActionCode::RemediateMachine);
}

#[test]
fn short_circuit_range() {
    let mut c = b_down();
    only_check(&mut c).trigger = Trigger::InRange { min: 2, max: 3 };
    let a = next(&c);
    assert_eq!(a.code, ActionCode::EnableRemediation, "{}", a.message);
    assert!(
        a.message.contains("unhealthyInRange [2-3]"),
        "{}",
        a.message
    );
    only_check(&mut c).trigger = Trigger::InRange { min: 1, max: 1 };
    assert_eq!(next(&c).code, ActionCode::RemediateMachine);
}

#[test]
fn already_marked_is_counted_once() {
    // b is annotated: the MachineHealthCheck counts it already (1 of 3), which 1 allows.
    let mut c = b_down();
    machine_mut(&mut c, "b")
        .annotations
        .insert(ANNOTATION_REMEDIATE.into(), String::new());
    let hc = only_check(&mut c);
    hc.trigger = Trigger::AtMost(Limit::Count(1));
    hc.counts = Some(HealthCheckCounts {
        expected: 3,
        unhealthy: 1,
    });
    assert!(matches!(
        coverage(&c, &c.machines[1]),
        Coverage::Remediates(_)
    ));
}

#[test]
fn a_second_check_that_allows_is_enough() {
    let mut c = b_down();
    only_check(&mut c).paused = true;
    if let HealthChecks::Known(v) = &mut c.health_checks {
        v.push(HealthCheck {
            name: "cp-only".into(),
            targets: vec!["b".into()],
            paused: false,
            trigger: Trigger::default(),
            counts: None,
        });
    }
    assert_eq!(next(&c).code, ActionCode::RemediateMachine);
}

#[test]
fn unknown_coverage_is_not_none() {
    let mut c = b_down();
    c.health_checks = HealthChecks::Unknown {
        reason: "machinehealthchecks is forbidden".into(),
    };
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemediateMachine, "{}", a.message);
    assert!(
        a.message
            .contains("is not known (machinehealthchecks is forbidden)")
            && !a.message.contains("no MachineHealthCheck"),
        "{}",
        a.message
    );
    // The command ends the message: copying it takes nothing else.
    let command = a.command.as_deref().expect("a command");
    assert!(
        a.message.ends_with(&format!(" Run: {command}")),
        "{}",
        a.message
    );
    let line = remediation::summary(&c);
    assert!(
        line.contains("not known") && !line.contains("no MachineHealthCheck"),
        "{line}"
    );
}

#[test]
fn a_covered_machine_goes_before_an_uncovered_older_one() {
    // Five Machines, a and b down (quorum holds); a is older but no MachineHealthCheck covers
    // it: b is named, since its remediation can happen.
    let mut c = cp(
        5,
        &[
            ("a", down()),
            ("b", down()),
            ("c", healthy()),
            ("d", healthy()),
            ("e", healthy()),
        ],
    );
    only_check(&mut c).targets.retain(|t| t != "a");
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemediateMachine, "{}", a.message);
    assert_eq!(a.target.as_deref(), Some("b"));
}

#[test]
fn an_annotation_no_check_passes_on_holds_nothing() {
    // b annotated, its deletion refused (a is down too): with a MachineHealthCheck KCP is stuck
    // on it; without one KCP is not remediating at all, so that is not named.
    let mut c = cp(3, &[("a", down()), ("b", healthy()), ("c", healthy())]);
    machine_mut(&mut c, "b")
        .annotations
        .insert(ANNOTATION_REMEDIATE.into(), String::new());
    let a = next(&c);
    assert!(
        a.message.contains("KCP is remediating Machine ns/b"),
        "{}",
        a.message
    );
    c.health_checks = HealthChecks::Known(Vec::new());
    let a = next(&c);
    assert!(!a.message.contains("KCP is remediating"), "{}", a.message);
    assert_eq!(a.code, ActionCode::EnableRemediation, "{}", a.message);
    assert_eq!(a.target.as_deref(), Some("a"));
}

#[test]
fn limits_round_down() {
    assert_eq!(Limit::Percent(40).of(3), 1);
    assert_eq!(Limit::Percent(100).of(3), 3);
    assert_eq!(Limit::Percent(34).of(3), 1);
    assert_eq!(Limit::Percent(33).of(3), 0);
    assert_eq!(Limit::Count(2).of(3), 2);
    assert!(Trigger::default().allows(3, 3));
    assert!(!Trigger::AtMost(Limit::Count(1)).allows(2, 3));
    assert!(Trigger::InRange { min: 1, max: 2 }.allows(2, 5));
    assert!(!Trigger::InRange { min: 1, max: 2 }.allows(0, 5));
}

#[test]
fn counted_unhealthy_by_its_condition_is_counted_once() {
    // The MachineHealthCheck counted b unhealthy at its last reconcile (HealthCheckSucceeded
    // False on b): its 1 of 3 holds b already, and marking b adds nothing, which 1 allows. Counted
    // twice, 2 > 1 would be a short-circuit that does not happen.
    let mut c = b_down();
    machine_mut(&mut c, "b").health_check_failed = true;
    let hc = only_check(&mut c);
    hc.trigger = Trigger::AtMost(Limit::Count(1));
    hc.counts = Some(HealthCheckCounts {
        expected: 3,
        unhealthy: 1,
    });
    assert!(
        matches!(coverage(&c, &c.machines[1]), Coverage::Remediates(_)),
        "{:?}",
        coverage(&c, &c.machines[1])
    );
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemediateMachine, "{}", a.message);
    // Another Machine counted unhealthy (a, not b): b marked makes 2 of 3, which 1 does not allow.
    machine_mut(&mut c, "b").health_check_failed = false;
    machine_mut(&mut c, "a").health_check_failed = true;
    assert!(matches!(
        coverage(&c, &c.machines[1]),
        Coverage::Blocked(
            _,
            Held::ShortCircuit {
                unhealthy: 2,
                expected: 3
            }
        )
    ));
}

/// A paused Cluster or KCP: KCP and the MachineHealthChecks do nothing (v1.14
/// `EnsurePausedCondition`), so an action they would carry out becomes `Unpause`, which names it
/// as what follows; decisions stay what quorum says.
#[test]
fn paused_control_plane_says_unpause_before_remediation() {
    let mut c = b_down();
    let before = next(&c);
    assert_eq!(before.code, ActionCode::RemediateMachine);
    let deny_before = delete(&c, "a", &human());
    let b_before = delete(&c, "b", &kcp_controller());
    assert!(b_before.allowed, "{}", b_before.message);
    c.cluster.paused = true;
    let a = next(&c);
    assert_eq!(a.code, ActionCode::Unpause, "{}", a.message);
    assert_eq!(a.target.as_deref(), Some("b"));
    assert_eq!(
        a.command.as_deref(),
        Some(r#"kubectl patch cluster -n ns test --type merge -p '{"spec":{"paused":false}}'"#)
    );
    assert!(
        a.message
            .contains("Cluster ns/test is paused (spec.paused: true)")
            && a.message.contains("clusterctl move")
            && a.message
                .contains("unpause only when no move is in progress")
            && a.message
                .contains(&format!("After that, RemediateMachine: {}", before.message)),
        "{}",
        a.message
    );
    // The decisions do not change: denials are about quorum (their next action follows).
    let deny = delete(&c, "a", &human());
    assert_eq!(
        (deny.allowed, deny.reason, deny.figures),
        (deny_before.allowed, deny_before.reason, deny_before.figures)
    );
    assert_eq!(deny.next_action.code, ActionCode::Unpause);
    let b = delete(&c, "b", &kcp_controller());
    assert_eq!((b.allowed, b.reason), (b_before.allowed, b_before.reason));

    c.cluster.paused = false;
    c.kcp.paused = true;
    let a = next(&c);
    assert_eq!(a.code, ActionCode::Unpause, "{}", a.message);
    assert_eq!(
        a.command.as_deref(),
        Some("kubectl annotate kubeadmcontrolplane -n ns kcp cluster.x-k8s.io/paused-")
    );
    c.cluster.paused = true;
    let a = next(&c);
    assert!(
        a.message.contains("and KubeadmControlPlane ns/kcp carries annotation")
            && a.message.contains(
                "(and the KubeadmControlPlane's annotation: `kubectl annotate kubeadmcontrolplane -n ns kcp cluster.x-k8s.io/paused-`)"
            ),
        "{}",
        a.message
    );
}

#[test]
fn paused_control_plane_keeps_actions_that_need_no_reconciler() {
    // An orphan member: etcdctl removes it whatever KCP does.
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
    add_member(&mut c, 9, "stray", down(), false);
    let before = next(&c);
    assert_eq!(
        before.code,
        ActionCode::RemoveOrphanMember,
        "{}",
        before.message
    );
    c.cluster.paused = true;
    let a = next(&c);
    assert_eq!(
        (a.code, &a.command, &a.target),
        (before.code, &before.command, &before.target)
    );
    assert_eq!(
        a.message.strip_prefix(before.message.as_str()),
        Some(
            " Meanwhile Cluster ns/test is paused (spec.paused: true): KCP and its MachineHealthChecks act on nothing until it is unpaused (`clusterctl move` pauses it on purpose while it moves the Cluster)."
        ),
        "{}",
        a.message
    );
    // Converged: nothing to do, paused or not.
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
    assert_eq!(remediation::gap(&c), None);
    c.kcp.paused = true;
    assert_eq!(next(&c).code, ActionCode::None);
    // The member table tells that no remediation reaches KCP now.
    let gap = remediation::gap(&c).expect("a paused control plane is a gap");
    assert!(
        gap.ends_with("KubeadmControlPlane ns/kcp carries annotation cluster.x-k8s.io/paused: KCP and its MachineHealthChecks act on nothing until it is unpaused"),
        "{gap}"
    );
    // A deletion in flight waits for KCP: paused, it waits for nothing.
    machine_mut(&mut c, "a").deleting = true;
    c.kcp.paused = false;
    assert_eq!(next(&c).code, ActionCode::WaitForDeletion);
    c.kcp.paused = true;
    assert_eq!(next(&c).code, ActionCode::Unpause);
}
