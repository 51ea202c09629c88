//! Cluster API's own test tables as a conformance suite (issue 36, item 5).
//!
//! Each case below translates one case of KCP's unit tests (kubernetes-sigs/cluster-api, v1.14 /
//! main, `controlplane/kubeadm/reconcilers/kubeadmcontrolplane/`: `remediation_test.go`
//! `TestTargetEtcdClusterHealthy`, `TestReconcileUnhealthyMachines`,
//! `TestReconcileUnhealthyMachinesSequences`; `preflight_test.go` `TestPreflightChecks`) and is
//! named by the Go test function and case in the comment above it. The rule:
//! - KCP "safe" (it removes the member, remediates, or its preflight passes and it goes on): the
//!   guard allows KCP's operation (requester: KCP's service account);
//! - KCP "unsafe": the guard denies it; where the guard is stricter than KCP, the comment names
//!   the real order of KCP, kubeadm and etcd that loses quorum (or that quorum is lost already);
//! - where the guard is more lenient than KCP, KCP's own check holds it: the comment says so.
//!
//! How the Go fixtures read here:
//! - `getMachine(name, ...)` is a Machine whose node (and etcd member) is named after it;
//!   `etcdMembers(machines)` lists one voting member per Machine with a node. A Machine the Go
//!   test leaves out of `EtcdMembers` has no member here ([`M::NoMember`]); `withoutNodeRef()` is
//!   a Machine without a node ([`M::NoNode`]).
//! - `withHealthyEtcdMember()` / `withUnhealthyEtcdMember()` is what the probe says of the
//!   member: healthy / no answer. `withMachineHealthCheckFailed()` says nothing of the member
//!   (KCP leaves the member it removes out of its count); here the Machine is marked for
//!   remediation (`cluster.x-k8s.io/remediate-machine`), and its member is healthy (the Machine
//!   failed its health check for another reason: the harder case for a removal) unless the case
//!   says otherwise; where its member being down changes the verdict, that is a second case.
//! - The join style follows the KCP version of the Go test: `TestReconcileUnhealthyMachines*`
//!   use v1.19.1 (kubeadm before v1.27 has no EtcdLearnerMode: voting joins).
//!   `TestTargetEtcdClusterHealthy` and `TestPreflightChecks` set no version: both styles run,
//!   learner (v1.32.0) and voting (v1.19.1). Where the style changes the verdict, the case says
//!   what differs.
//! - A KCP that is not initialized (`ControlPlaneInitialized` false) has never answered through
//!   its workload API server: quorumguard's probe goes the same way, so etcd is unknown.

use super::assert_verdict;
use crate::testkit::*;
use crate::*;

/// How kubeadm joins a new member, by the KCP's `spec.version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    /// v1.32.0: EtcdLearnerMode is GA, every join adds a learner.
    Learner,
    /// v1.19.1, the version of KCP's remediation tests: no EtcdLearnerMode, a join adds a voting
    /// member.
    Voting,
}

use Style::{Learner, Voting};

const BOTH: [Style; 2] = [Learner, Voting];

/// One Go fixture Machine.
#[derive(Clone, Copy, Debug)]
enum M {
    /// Its member is listed, voting, and healthy (`withHealthyEtcdMember()`).
    Up,
    /// Its member is listed, voting, and does not answer (`withUnhealthyEtcdMember()`).
    Down,
    /// Its node is set but no member of its name is listed (left out of `EtcdMembers`).
    NoMember,
    /// No node yet (`withoutNodeRef()`), so no member either; created an hour ago.
    NoNode,
    /// No node yet, created a minute ago: still being provisioned (within `--join-grace`).
    Joining,
}

/// A control plane as a Go test builds it: one Machine per entry, oldest first, each with the
/// member the entry says (IDs 1, 2, ... in the order of the members).
fn go_cp(joins: Style, replicas: u32, machines: &[(&str, M)]) -> ControlPlane {
    let mut c = cp(replicas, &[]);
    c.kcp.version = Some(
        match joins {
            Learner => "v1.32.0",
            Voting => "v1.19.1",
        }
        .into(),
    );
    let mut id = 0;
    for (name, m) in machines {
        let i = add_machine(&mut c, name);
        match m {
            M::Up | M::Down => {
                id += 1;
                let h = if matches!(m, M::Up) {
                    healthy()
                } else {
                    down()
                };
                add_member(&mut c, id, name, h, false);
            }
            M::NoMember => {}
            M::NoNode => c.machines[i].node_name = None,
            M::Joining => {
                c.machines[i].node_name = None;
                c.machines[i].created_unix = Some(NOW - 60);
            }
        }
    }
    c
}

/// `withMachineHealthCheckFailed()`: KCP is to remediate this Machine.
fn mark(c: &mut ControlPlane, name: &str) {
    machine_mut(c, name)
        .annotations
        .insert(ANNOTATION_REMEDIATE.into(), String::new());
}

/// A KCP that is not initialized: no probe has reached its etcd.
fn not_initialized(c: &mut ControlPlane) {
    c.etcd = EtcdState::Unknown {
        reason: "the workload cluster's API server has never answered".into(),
    };
}

/// A KCP that is not initialized, with the one Machine `name`, deletes it to remediate it: the
/// guard allows, since no probe has reached etcd and the controllers' policy for unknown health
/// lets KCP's own checks decide.
fn kcp_remediates_uninitialized(j: Style, replicas: u32, name: &str) {
    let mut c = go_cp(j, replicas, &[(name, M::Up)]);
    mark(&mut c, name);
    not_initialized(&mut c);
    kcp_may_delete(&c, name, Reason::HealthUnknown);
}

/// A Machine created a minute ago: still joining (within `--join-grace`).
fn young(c: &mut ControlPlane, name: &str) {
    machine_mut(c, name).created_unix = Some(NOW - 60);
}

fn kcp_deletes(c: &ControlPlane, machine: &str) -> Verdict {
    delete(c, machine, &kcp_controller())
}

/// KCP's deletion of `machine` is allowed for `reason`.
fn kcp_may_delete(c: &ControlPlane, machine: &str, reason: Reason) -> Verdict {
    let v = kcp_deletes(c, machine);
    assert_verdict(&v, true, reason);
    v
}

/// KCP's deletion of `machine` is denied for `reason`, and the next action the guard publishes
/// is no wait: KCP v1.14 ends its reconcile on a refused remediation and retries the same one,
/// so nothing the guard could wait for happens (`remediation.go`: the Delete's error is
/// returned).
fn kcp_refused(c: &ControlPlane, machine: &str, reason: Reason) -> Verdict {
    let v = kcp_deletes(c, machine);
    assert_verdict(&v, false, reason);
    assert_no_dead_wait(&v);
    v
}

/// A refusal of the deletion of the last member has no end: nothing brought back makes KCP's
/// retry succeed, and the next action must not say it would. (KCP v1.14 does not even try with
/// one Machine: `reconcileUnhealthyMachines` skips a remediation while `Machines.Len() <= 1`.)
fn false_retry_promise(v: &Verdict) -> Option<String> {
    v.next_action
        .message
        .contains("KCP's retry succeeds")
        .then(|| {
            format!(
                "nothing brought back makes a deletion of the last member succeed: {}",
                v.next_action.message
            )
        })
}

fn assert_no_false_retry_promise(v: &Verdict) {
    if let Some(e) = false_retry_promise(v) {
        panic!("{e}");
    }
}

/// A refusal whose next action waits: KCP retries the refused remediation and does nothing
/// else, so the wait never ends.
fn dead_wait(v: &Verdict) -> Option<String> {
    use ActionCode::*;
    matches!(
        v.next_action.code,
        WaitForRollout | WaitForDeletion | WaitForJoin | WaitForLearner
    )
    .then(|| {
        format!(
            "KCP's remediation is refused ({:?}) and the next action waits ({:?}: {}): KCP retries the remediation and does nothing else, so the wait never ends",
            v.reason, v.next_action.code, v.next_action.message
        )
    })
}

fn assert_no_dead_wait(v: &Verdict) {
    if let Some(e) = dead_wait(v) {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// TestTargetEtcdClusterHealthy: removing the member of m1 (KCP's remediation and its
// pre-terminate hook), and adding one member (KCP's scale-up after a remediation). The Go test
// sets no KCP version: every case runs with learner and voting joins. spec.replicas is the
// number of Machines (the Go test sets none, except where said).
// ---------------------------------------------------------------------------------------------

/// A fixture in one line: `name:S` per Machine, oldest first, S one of `U` ([`M::Up`]), `D`
/// ([`M::Down`]), `-` ([`M::NoMember`]), `N` ([`M::NoNode`]), `J` ([`M::Joining`]).
fn fixture(spec: &str) -> Vec<(&str, M)> {
    spec.split_whitespace()
        .map(|e| {
            let (name, s) = e.rsplit_once(':').expect("name:state");
            let m = match s {
                "U" => M::Up,
                "D" => M::Down,
                "-" => M::NoMember,
                "N" => M::NoNode,
                "J" => M::Joining,
                _ => panic!("unknown state {s:?} in {e:?}"),
            };
            (name, m)
        })
        .collect()
}

/// One row of a table: the Go case by its exact name, the fixture (see [`fixture`]),
/// spec.replicas (the number of Machines where `None`), and the verdict expected with learner
/// joins and with voting joins: allowed or not, and the reason.
struct Row {
    go: &'static str,
    machines: &'static str,
    replicas: Option<u32>,
    learner: (bool, Reason),
    voting: (bool, Reason),
}

const SAFE: (bool, Reason) = (true, Reason::QuorumSafe);

/// Runs every row in both join styles, `verdict` giving the guard's verdict on the row's
/// operation, and reports every row that differs at once (with the Go case's name). A denial
/// also passes [`assert_no_dead_wait`]; a denial of the last member makes no false promise
/// ([`assert_no_false_retry_promise`]); a denial for a lost quorum names restoring it.
fn run_table(rows: &[Row], verdict: impl Fn(&ControlPlane) -> Verdict) {
    let mut wrong = Vec::new();
    for row in rows {
        let machines = fixture(row.machines);
        let replicas = row.replicas.unwrap_or(machines.len() as u32);
        for (j, (allowed, reason)) in [(Learner, row.learner), (Voting, row.voting)] {
            let c = go_cp(j, replicas, &machines);
            let v = verdict(&c);
            let problem = if (v.allowed, v.reason) != (allowed, reason) {
                Some(format!(
                    "want {}{reason:?}, got {}{:?}: {}",
                    if allowed { "allowed " } else { "denied " },
                    if v.allowed { "allowed " } else { "denied " },
                    v.reason,
                    v.message
                ))
            } else if !allowed && !v.message.contains("Next safe action:") {
                Some(format!("a denial must say what to do next: {}", v.message))
            } else if allowed {
                None
            } else {
                match v.reason {
                    Reason::LastMember => false_retry_promise(&v),
                    Reason::QuorumLost if v.next_action.code != ActionCode::RestoreQuorum => {
                        Some(format!("quorum lost, next action {:?}", v.next_action.code))
                    }
                    _ => None,
                }
                .or_else(|| dead_wait(&v))
            };
            if let Some(p) = problem {
                wrong.push(format!("{j:?} \"{}\": {p}", row.go));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of the Go cases differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// KCP deletes the oldest Machine (m1 of the Go fixtures), which is marked for remediation.
fn kcp_remediates_oldest(c: &ControlPlane) -> Verdict {
    let mut c = c.clone();
    let m1 = c.machines[0].name.clone();
    mark(&mut c, &m1);
    kcp_deletes(&c, &m1)
}

/// TestTargetEtcdClusterHealthy's removals (`addEtcdMember` false, `etcdMemberToBeDeleted` m1's).
/// Where m1's own member is down the Go case does not say (KCP leaves the member it removes out
/// of its count); a second row, named "... (m1's member down)", runs it where that changes the
/// verdict.
#[test]
fn target_etcd_cluster_healthy_removals() {
    run_table(
        &[
            // KCP unsafe; the guard denies: m1 holds the last member (or, down, quorum is lost).
            Row {
                go: "Can't safely remove a member from a CP with one Machine",
                machines: "m1-mhc-unhealthy:U",
                replicas: None,
                learner: (false, Reason::LastMember),
                voting: (false, Reason::LastMember),
            },
            Row {
                go: "Can't safely remove a member from a CP with one Machine (m1's member down)",
                machines: "m1-mhc-unhealthy:D",
                replicas: None,
                learner: (false, Reason::QuorumLost),
                voting: (false, Reason::QuorumLost),
            },
            // KCP safe; the guard allows (1 healthy of 1 after). Before issue 36 it denied
            // `PendingJoin`: it counted the replacement KCP makes for m1 as a voting member
            // joining before m1's member left (1 healthy of 2). KCP creates no Machine while m1
            // is deleting, and remediates before it scales up: the replacement comes after.
            Row {
                go: "Can safely remove a member from a CP with two Machines without additional etcd member failures",
                machines: "m1-mhc-unhealthy:U m2-etcd-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // Stricter than KCP: two voting members with one down have lost quorum already (1
            // healthy of 2, quorum 2); etcd commits no `member remove`, so KCP's pre-terminate
            // hook could not remove m1's member either, and deleting m1's Machine throws away
            // the member whose return would restore quorum.
            Row {
                go: "Can safely remove a member from a CP with two Machines without additional etcd member failures (m1's member down)",
                machines: "m1-mhc-unhealthy:D m2-etcd-healthy:U",
                replicas: None,
                learner: (false, Reason::QuorumLost),
                voting: (false, Reason::QuorumLost),
            },
            // KCP safe; the guard allows: no member to remove.
            Row {
                go: "Can safely remove a member from a CP with two Machines when the etcd member being remediated is missing",
                machines: "m1-mhc-unhealthy:- m2-etcd-healthy:U",
                replicas: None,
                learner: (true, Reason::MemberAbsent),
                voting: (true, Reason::MemberAbsent),
            },
            // KCP unsafe; the guard denies: 1 healthy of 2, quorum lost already.
            Row {
                go: "Can't safely remove a member from a CP with two Machines with one additional etcd member failure",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:D",
                replicas: None,
                learner: (false, Reason::QuorumLost),
                voting: (false, Reason::QuorumLost),
            },
            // KCP safe; the guard allows (2 healthy of 2 after; with a voting newcomer 2 of 3).
            Row {
                go: "Can safely remove a member from a CP with three Machines without additional etcd member failures",
                machines: "m1-mhc-unhealthy:U m2-etcd-healthy:U m3-etcd-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            Row {
                go: "Can safely remove a member from a CP with three Machines without additional etcd member failures (m1's member down)",
                machines: "m1-mhc-unhealthy:D m2-etcd-healthy:U m3-etcd-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP safe; the guard allows: no member to remove.
            Row {
                go: "Can safely remove a member from a CP with three Machines when the etcd member being remediated is missing",
                machines: "m1-mhc-unhealthy:- m2-etcd-healthy:U m3-etcd-healthy:U",
                replicas: None,
                learner: (true, Reason::MemberAbsent),
                voting: (true, Reason::MemberAbsent),
            },
            // KCP unsafe; the guard denies (1 healthy of 2 after; m1 down: 1 of 3 now).
            Row {
                go: "Can't safely remove a member from a CP with three Machines with one additional etcd member failure",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:D m3-etcd-healthy:U",
                replicas: None,
                learner: (false, Reason::WouldLoseQuorum),
                voting: (false, Reason::WouldLoseQuorum),
            },
            Row {
                go: "Can't safely remove a member from a CP with three Machines with one additional etcd member failure (m1's member down)",
                machines: "m1-mhc-unhealthy:D m2-etcd-unhealthy:D m3-etcd-healthy:U",
                replicas: None,
                learner: (false, Reason::QuorumLost),
                voting: (false, Reason::QuorumLost),
            },
            // KCP safe (the target etcd is m3 alone, healthy); the guard allows. Before issue
            // 36 it denied `PendingJoin` (a voting replacement counted before m1 left: 1 healthy
            // of 2), an order KCP never takes; the replacement joins after: 1 of 1, then a
            // learner promoted in sync or a voting member that starts.
            Row {
                go: "Can safely remove a member from a CP with three Machines when another etcd member is missing",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:- m3-etcd-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP safe; the guard allows: no member to remove.
            Row {
                go: "Can safely remove a member from a CP with three Machines when the etcd member being remediated is missing and another etcd member is missing",
                machines: "m1-mhc-unhealthy:- m2-etcd-unhealthy:- m3-etcd-healthy:U",
                replicas: None,
                learner: (true, Reason::MemberAbsent),
                voting: (true, Reason::MemberAbsent),
            },
            // KCP safe; the guard allows (3 healthy of 4 after).
            Row {
                go: "Can safely remove a member from a CP with five Machines with less than 2 additional etcd member failures",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:D m3-etcd-healthy:U m4-etcd-healthy:U m5-etcd-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP safe (target: 3 voting, 2 healthy); the guard allows. Before issue 36 it
            // denied `PendingJoin` (a voting replacement before m1 left: 2 of 4).
            Row {
                go: "Can safely remove a member from a CP with five Machines with missing members but quorum",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:- m3-etcd-unhealthy:D m4-etcd-healthy:U m5-etcd-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // Stricter than KCP: 2 healthy of 4 voting members have lost quorum already
            // (quorum 3), and etcd commits no member removal.
            Row {
                go: "Can safely remove a member from a CP with five Machines with missing members but quorum (m1's member down)",
                machines: "m1-mhc-unhealthy:D m2-etcd-unhealthy:- m3-etcd-unhealthy:D m4-etcd-healthy:U m5-etcd-healthy:U",
                replicas: None,
                learner: (false, Reason::QuorumLost),
                voting: (false, Reason::QuorumLost),
            },
            // KCP unsafe; the guard denies (2 healthy of 4 after).
            Row {
                go: "Can't safely remove a member from a CP with five Machines with 2 additional etcd member failures",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:D m3-etcd-unhealthy:D m4-etcd-healthy:U m5-etcd-healthy:U",
                replicas: None,
                learner: (false, Reason::WouldLoseQuorum),
                voting: (false, Reason::WouldLoseQuorum),
            },
            // KCP safe; the guard allows (4 healthy of 6 after).
            Row {
                go: "Can safely remove a member from a CP with seven Machines with less than 3 additional etcd member failures",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:D m3-etcd-unhealthy:D m4-etcd-healthy:U m5-etcd-healthy:U m6-etcd-healthy:U m7-etcd-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP safe (target: 5 voting, 3 healthy); the guard allows. Before issue 36 it
            // denied `PendingJoin` (a voting replacement before m1 left: 3 of 6).
            Row {
                go: "Can safely remove a member from a CP with seven Machines with missing members but quorum",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:- m3-etcd-unhealthy:D m4-etcd-unhealthy:D m5-etcd-healthy:U m6-etcd-healthy:U m7-etcd-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP unsafe (the Go case sets spec.replicas 5); the guard denies (3 healthy of 6
            // after, quorum 4).
            Row {
                go: "Can't safely remove a member from a CP with seven Machines with 3 additional etcd member failures",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:D m3-etcd-unhealthy:D m4-etcd-unhealthy:D m5-etcd-healthy:U m6-etcd-healthy:U m7-etcd-healthy:U",
                replicas: Some(5),
                learner: (false, Reason::WouldLoseQuorum),
                voting: (false, Reason::WouldLoseQuorum),
            },
        ],
        kcp_remediates_oldest,
    );
}

// TestTargetEtcdClusterHealthy "Can safely remove a member from a CP with three Machines when
// another etcd member is missing", as a person's deletion: that keeps the protection in voting
// style, since KCP may be adding a third member at that moment (2 Machines with members for 3
// replicas) and a voting member counted before it has started leaves 1 healthy of 2. In learner
// style no join can lose quorum, and the desired-replicas rule refuses a person's deletion that
// leaves fewer working Machines than spec.replicas.
#[test]
fn target_remove_another_member_missing_by_a_person() {
    for (j, reason) in [
        (Voting, Reason::PendingJoin),
        (Learner, Reason::BelowDesiredReplicas),
    ] {
        let c = go_cp(
            j,
            3,
            &fixture("m1-mhc-unhealthy:U m2-etcd-unhealthy:- m3-etcd-healthy:U"),
        );
        assert_verdict(&delete(&c, "m1-mhc-unhealthy", &human()), false, reason);
    }
}

/// A person raises spec.replicas so that KCP adds a member: the guard's counterpart of
/// `targetEtcdClusterHealthy(addEtcdMember=true)`, the check before KCP adds a member. KCP's own
/// webhook refuses even counts with stacked etcd (`validateKubeadmControlPlaneSpec`), so the
/// scale goes to the next odd count; KCP adds one member at a time, and the guard judges the
/// first, as KCP's check does.
fn add_one(c: &ControlPlane) -> Verdict {
    let r = c.kcp.replicas;
    scale(c, r + if r.is_multiple_of(2) { 1 } else { 2 })
}

const SCALE_UP: (bool, Reason) = (true, Reason::ScaleUpSafe);

/// TestTargetEtcdClusterHealthy's additions (`addEtcdMember` true): the guard's verdict on a
/// scale-up by one.
#[test]
fn target_etcd_cluster_healthy_additions() {
    run_table(
        &[
            // KCP safe; the guard allows. Voting joins: a single member can only grow by one.
            Row {
                go: "Can safely add a member to a CP with one Machine",
                machines: "m1-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: (true, Reason::SingleMemberScaleUp),
            },
            // KCP unsafe; the guard denies: the only member is down, no quorum.
            Row {
                go: "Can't safely add a member to a CP with one Machine with unhealthy etcd member",
                machines: "m1-unhealthy:D",
                replicas: None,
                learner: (false, Reason::QuorumLost),
                voting: (false, Reason::QuorumLost),
            },
            // KCP safe; the guard allows.
            Row {
                go: "Can safely add a member to a CP with two Machine",
                machines: "m1-healthy:U m2-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: SCALE_UP,
            },
            // KCP safe; the guard allows (one member, which can only grow by one).
            Row {
                go: "Can safely add a member to a CP with two Machine when one member is missing",
                machines: "m1-healthy:U m2-unhealthy:-",
                replicas: None,
                learner: SCALE_UP,
                voting: (true, Reason::SingleMemberScaleUp),
            },
            // KCP unsafe; the guard denies: 1 healthy of 2, quorum lost.
            Row {
                go: "Can't safely add a member to a CP with two Machine with one additional etcd member failure",
                machines: "m1-healthy:U m2-unhealthy:D",
                replicas: None,
                learner: (false, Reason::QuorumLost),
                voting: (false, Reason::QuorumLost),
            },
            // KCP safe; the guard allows.
            Row {
                go: "Can safely add a member to a CP with three Machine",
                machines: "m1-healthy:U m2-healthy:U m3-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: SCALE_UP,
            },
            // KCP safe; the guard allows (2 healthy of 2; a voting newcomer: 2 of 3).
            Row {
                go: "Can safely add a member to a CP with three Machine with one member is missing",
                machines: "m1-healthy:U m2-unhealthy:- m3-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: SCALE_UP,
            },
            // KCP unsafe. Voting joins: the guard denies (the newcomer votes before it has
            // started: 2 healthy of 4, quorum 3). Learner joins: the guard allows, more
            // leniently than KCP: a learner does not vote and etcd promotes it only in sync, so
            // no step of the join loses quorum; KCP's own preflight holds the scale-up until
            // every member is healthy, and etcd's strict reconfiguration check refuses the
            // `member add` while a voting member is disconnected.
            Row {
                go: "Can't safely add a member to a CP with three Machine with one additional etcd member failure",
                machines: "m1-healthy:U m2-unhealthy:D m3-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: (false, Reason::ScaleUpWouldLoseQuorum),
            },
            // KCP safe; the guard allows.
            Row {
                go: "Can safely add a member to a CP with four Machine",
                machines: "m1-healthy:U m2-healthy:U m3-healthy:U m4-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: SCALE_UP,
            },
            // KCP safe; the guard allows (3 of 3; a voting newcomer: 3 of 4).
            Row {
                go: "Can safely add a member to a CP with four Machine with one member is missing",
                machines: "m1-healthy:U m2-unhealthy:- m3-healthy:U m4-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: SCALE_UP,
            },
            // KCP safe; the guard allows (3 healthy of 4; a voting newcomer: 3 of 5, quorum 3).
            Row {
                go: "Can safely add a member to a CP with four Machine with one additional etcd member failure",
                machines: "m1-healthy:U m2-unhealthy:D m3-healthy:U m4-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: SCALE_UP,
            },
            // KCP unsafe; the guard denies: 2 healthy of 4, quorum lost.
            Row {
                go: "Can't safely add a member to a CP with four Machine with two additional etcd member failure",
                machines: "m1-healthy:U m2-unhealthy:D m3-unhealthy:D m4-healthy:U",
                replicas: None,
                learner: (false, Reason::QuorumLost),
                voting: (false, Reason::QuorumLost),
            },
            // KCP safe; the guard allows.
            Row {
                go: "Can safely add a member to a CP with five Machine",
                machines: "m1-healthy:U m2-healthy:U m3-healthy:U m4-healthy:U m5-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: SCALE_UP,
            },
            // KCP unsafe. Voting joins: the guard denies (3 healthy of 6, quorum 4). Learner
            // joins: the guard allows, more leniently than KCP, as for three Machines above.
            Row {
                go: "Can't safely add a member to a CP with five Machine with two additional etcd member failure",
                machines: "m1-healthy:U m2-unhealthy:D m3-unhealthy:D m4-healthy:U m5-healthy:U",
                replicas: None,
                learner: SCALE_UP,
                voting: (false, Reason::ScaleUpWouldLoseQuorum),
            },
        ],
        add_one,
    );
}

// TestTargetEtcdClusterHealthy "Can safely add a member to a CP without Machines": KCP safe.
// The guard reviews no Machine creation, so KCP's first Machine is never held; with no Machine
// no probe has reached etcd, and the next action says to look at etcd, no wait.
#[test]
fn target_add_no_machines() {
    for j in BOTH {
        let mut c = go_cp(j, 1, &[]);
        not_initialized(&mut c);
        assert_eq!(next(&c).code, ActionCode::CheckEtcdHealth);
    }
}

// TestTargetEtcdClusterHealthy "Can safely add a member to a CP with one Machine", the words:
// with voting joins etcd is unavailable until the second member has started (the guard warns);
// with learner joins the one voter keeps quorum throughout (the learner is promoted only in
// sync), so there is no such warning.
#[test]
fn target_add_one_machine_warnings() {
    let unavailable = |j| {
        let v = add_one(&go_cp(j, 1, &fixture("m1-healthy:U")));
        v.warnings.iter().any(|w| w.contains("unavailable"))
    };
    assert!(unavailable(Voting));
    assert!(!unavailable(Learner));
}

// TestTargetEtcdClusterHealthy "Can't safely add a member to a CP with three Machine with one
// additional etcd member failure", the words of the learner scale-up the guard allows: what
// holds it (KCP's preflight, etcd's strict reconfiguration check), and no "lose quorum".
#[test]
fn target_add_three_machines_one_failure_warnings() {
    let c = go_cp(
        Learner,
        3,
        &fixture("m1-healthy:U m2-unhealthy:D m3-healthy:U"),
    );
    let v = add_one(&c);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("every etcd member is healthy")),
        "the allowed learner scale-up says what holds it: {:#?}",
        v.warnings
    );
    assert!(
        !v.warnings.iter().any(|w| w.contains("lose quorum")),
        "a learner join cannot lose quorum: {:#?}",
        v.warnings
    );
}

// TestTargetEtcdClusterHealthy "Can't safely add a member to a CP with a learner etcd member":
// KCP unsafe (any learner). The Go fixture's only member is a learner, which etcd never has (a
// learner joins a cluster with a voter); the state it stands for is a join under way: m1 votes,
// the learner is the new Machine m2's, catching up. The guard allows the scale-up (no quorum
// changes), more leniently than KCP: KCP's preflight waits for the learner's promotion, and etcd
// takes one learner at a time. The guard's next action waits for that promotion, which has an
// end (kubeadm promotes it in sync, or `--learner-grace` passes).
#[test]
fn target_add_with_learner() {
    for j in BOTH {
        let mut c = go_cp(j, 2, &[("m1-healthy", M::Up), ("m2-joining", M::NoMember)]);
        young(&mut c, "m2-joining");
        add_member(&mut c, 2, "m2-joining", healthy(), true);
        let v = add_one(&c);
        assert!(v.allowed, "{v:#?}");
        assert_eq!(v.next_action.code, ActionCode::WaitForLearner);
    }
}

/// The Go fixture of the learner, starting-up and alarm cases: m1 (marked for remediation) with
/// its member, m2 with none of its own name, and a second member as the case sets it.
fn m1_and_member(j: Style, member: Member) -> ControlPlane {
    let mut c = go_cp(j, 2, &fixture("m1-mhc-unhealthy:U m2-etcd-healthy:-"));
    members_mut(&mut c).push(member);
    mark(&mut c, "m1-mhc-unhealthy");
    c
}

/// Member 2: `name` (empty: not started), healthy unless unnamed, a learner or not, with
/// `alarms`.
fn member2(name: &str, learner: bool, alarms: &[Alarm]) -> Member {
    let mut m = Member::new(2, name);
    m.health = if name.is_empty() {
        Health::Unknown
    } else {
        healthy()
    };
    m.is_learner = learner;
    m.alarms = alarms.to_vec();
    m
}

// TestTargetEtcdClusterHealthy "Can't safely remove a member from a CP with a learner etcd
// member": KCP unsafe; the guard denies: m2's member is a learner, so m1 holds the last voting
// member.
#[test]
fn target_remove_with_learner() {
    for j in BOTH {
        let c = m1_and_member(j, member2("m2-etcd-healthy", true, &[]));
        kcp_refused(&c, "m1-mhc-unhealthy", Reason::LastMember);
    }
}

// TestTargetEtcdClusterHealthy "Can't safely remove a member from a CP with an etcd member
// starting up": KCP unsafe; the guard denies. Learner joins: the nameless member is an unstarted
// learner, so m1 holds the last voting member. Voting joins: it is an unstarted voting member, so
// etcd has 1 healthy of 2 voting members: quorum is lost until it starts.
#[test]
fn target_remove_with_member_starting() {
    for (j, reason) in [(Learner, Reason::LastMember), (Voting, Reason::QuorumLost)] {
        let c = m1_and_member(j, member2("", j == Learner, &[]));
        kcp_refused(&c, "m1-mhc-unhealthy", reason);
    }
}

// TestTargetEtcdClusterHealthy "Consider alarms from members not being removed when computing
// target etcd cluster status": KCP unsafe (member "foo", without a Machine, has a NOSPACE alarm,
// which KCP counts as unhealthy). The guard allows, more leniently than KCP: NOSPACE stops
// writes, not raft, and `member remove` still commits (docs/rules.md, what NOSPACE does), so
// foo alone stays 1 healthy of 1; KCP's own check holds the remediation. The next action frees
// the space.
#[test]
fn target_remove_with_nospace_elsewhere() {
    for j in BOTH {
        let c = m1_and_member(j, member2("foo", false, &[Alarm::NoSpace]));
        let v = kcp_may_delete(&c, "m1-mhc-unhealthy", Reason::QuorumSafe);
        assert_eq!(v.next_action.code, ActionCode::FreeSpace);
    }
}

// TestTargetEtcdClusterHealthy "Can safely remove a member when it doesn't have a corresponding
// machine and it has no alarm": KCP safe; the guard allows (foo answers healthy: 1 of 1 after).
#[test]
fn target_remove_with_machineless_member() {
    for j in BOTH {
        let c = m1_and_member(j, member2("foo", false, &[]));
        kcp_may_delete(&c, "m1-mhc-unhealthy", Reason::QuorumSafe);
    }
}

// TestTargetEtcdClusterHealthy "Ignore alarms from external members being removed when
// computing target etcd cluster status": KCP safe to remove member "bar" (no Machine, CORRUPT
// alarm): m1 is left, healthy. The guard's counterpart is its advice for a member no Machine
// accounts for: remove it. A CORRUPT alarm says bar's data is wrong, not that raft lost it: bar
// still votes, so m1 and bar hold quorum and `member remove bar` commits (etcd applies
// membership changes outside the alarm's write block), leaving 1 healthy of 1. So quorum is not
// lost, and the next action is to remove bar, not to restore from a snapshot.
#[test]
fn target_remove_machineless_corrupt_member() {
    for j in BOTH {
        let c = m1_and_member(j, member2("bar", false, &[Alarm::Corrupt]));
        let a = next(&c);
        assert_eq!(
            (a.code, a.target.as_deref()),
            (ActionCode::RemoveOrphanMember, Some("2")),
            "{}",
            a.message
        );
    }
}

// ---------------------------------------------------------------------------------------------
// TestReconcileUnhealthyMachines: KCP's remediation, KCP v1.19.1 (voting joins). Where the Go
// case ends with the Machine deleted, KCP's deletion must be allowed; where KCP skips the
// remediation for a reason of its own (retry limits, topology, a deletion or a provisioning in
// flight), the guard need not deny, and says what is true of etcd.
// ---------------------------------------------------------------------------------------------

// TestReconcileUnhealthyMachines "It cleans up stuck remediation on previously unhealthy
// machines": m1 passes its health check again, so KCP remediates nothing. The guard publishes
// no remediation either: a healthy one-Machine control plane of one replica is converged.
#[test]
fn reconcile_cleans_up_stuck_remediation() {
    let c = go_cp(Voting, 1, &[("m1-unhealthy", M::Up)]);
    assert_eq!(next(&c).code, ActionCode::None);
}

// TestReconcileUnhealthyMachines "Remediation does not happen if there are no unhealthy
// machines" (the Go fixture has no Machine; its point is that nothing is marked): with every
// Machine healthy and none marked, the guard publishes no remediation.
#[test]
fn reconcile_no_unhealthy_machines() {
    let c = go_cp(Voting, 3, &[("m1", M::Up), ("m2", M::Up), ("m3", M::Up)]);
    assert_eq!(next(&c).code, ActionCode::None);
}

// TestReconcileUnhealthyMachines "reconcileUnhealthyMachines return early if another
// remediation is in progress": KCP waits for its own replacement (its annotation, which the
// guard does not read). When KCP does delete m1 (a KCP not initialized, one Machine), the guard
// allows: no probe has reached etcd, and KCP's own checks run (the controllers' policy for
// unknown health).
#[test]
fn reconcile_another_remediation_in_progress() {
    kcp_remediates_uninitialized(Voting, 1, "m1-unhealthy");
}

// TestReconcileUnhealthyMachines "RemediationInProgressAnnotation is cleaned up when stale and
// there are no machines to be remediated": m1 healthy, not deleted; the guard publishes no
// remediation.
#[test]
fn reconcile_stale_annotation_no_machines_to_remediate() {
    let c = go_cp(Voting, 1, &[("m1-healthy", M::Up)]);
    assert_eq!(next(&c).code, ActionCode::None);
}

// TestReconcileUnhealthyMachines "remediation in progress is ignored when stale": KCP (not
// initialized) deletes m1; the guard allows (etcd unknown, KCP's policy).
#[test]
fn reconcile_stale_remediation_in_progress_ignored() {
    kcp_remediates_uninitialized(Voting, 1, "m1-unhealthy");
}

// The same one-Machine remediation where the probe does reach a member: the guard is stricter
// than KCP, which skips its etcd checks only because it believes the control plane never
// initialized. A member that answers holds etcd's only copy of the data; KCP's deletion of m1
// takes it (the last member goes with its Machine). The next action is no wait.
#[test]
fn reconcile_one_machine_with_a_member_is_the_last_member() {
    let mut c = go_cp(Voting, 1, &[("m1-unhealthy", M::Up)]);
    mark(&mut c, "m1-unhealthy");
    let v = kcp_refused(&c, "m1-unhealthy", Reason::LastMember);
    assert_no_false_retry_promise(&v);
}

// TestReconcileUnhealthyMachines "reconcileUnhealthyMachines return early if the machine to be
// remediated is already being deleted": a Machine already being deleted is not deleted again;
// the guard allows a repeated delete.
#[test]
fn reconcile_machine_already_deleting() {
    let mut c = go_cp(Voting, 1, &[("m1-unhealthy-deleting", M::Up)]);
    mark(&mut c, "m1-unhealthy-deleting");
    machine_mut(&mut c, "m1-unhealthy-deleting").deleting = true;
    kcp_may_delete(&c, "m1-unhealthy-deleting", Reason::AlreadyDeleting);
}

// TestReconcileUnhealthyMachines "Remediation does not happen if desired replicas <= 1": KCP
// unsafe (one Machine); the guard denies: m1 holds the last member. The next action is no wait,
// and it does not promise that bringing members back makes KCP's retry succeed.
#[test]
fn reconcile_desired_replicas_one() {
    let mut c = go_cp(Voting, 1, &[("m1-unhealthy", M::Up)]);
    mark(&mut c, "m1-unhealthy");
    let v = kcp_refused(&c, "m1-unhealthy", Reason::LastMember);
    assert_no_false_retry_promise(&v);
}

// TestReconcileUnhealthyMachines "Remediation does not happen if there is another machine being
// deleted (not the one to be remediated)": KCP waits for m3's deletion. The guard's next action
// is that wait, which ends (m3's member can leave: 2 healthy of 2 after).
#[test]
fn reconcile_another_machine_deleting() {
    let mut c = go_cp(
        Voting,
        3,
        &[
            ("m1-unhealthy", M::Up),
            ("m2-healthy", M::Up),
            ("m3-deleting", M::Up),
        ],
    );
    mark(&mut c, "m1-unhealthy");
    machine_mut(&mut c, "m3-deleting").deleting = true;
    let a = next(&c);
    assert_eq!(
        (a.code, a.target.as_deref()),
        (ActionCode::WaitForDeletion, Some("m3-deleting"))
    );
}

// TestReconcileUnhealthyMachines "Remediation does not happen if there is an healthy machine
// being provisioned": KCP waits for m3 to be provisioned. Voting joins (the Go test's v1.19.1):
// the guard denies KCP's deletion too: m3's kubeadm join adds a voting member, unhealthy until
// it starts, and if it is added after m1's member left, 1 healthy of 2. The next action waits for
// m3's join, which ends (the join, or `--join-grace`). Learner joins: the guard allows, more
// leniently than KCP, whose own check holds it (m3's learner never votes before it is in sync).
#[test]
fn reconcile_machine_provisioning() {
    for j in BOTH {
        let mut c = go_cp(
            j,
            3,
            &[
                ("m1-unhealthy", M::Up),
                ("m2-healthy", M::Up),
                ("m3-healthy", M::NoNode),
            ],
        );
        young(&mut c, "m3-healthy");
        mark(&mut c, "m1-unhealthy");
        let v = kcp_deletes(&c, "m1-unhealthy");
        match j {
            Voting => assert_verdict(&v, false, Reason::PendingJoin),
            Learner => assert_verdict(&v, true, Reason::QuorumSafe),
        }
        assert_eq!(v.next_action.code, ActionCode::WaitForJoin);
    }
}

/// TestReconcileUnhealthyMachines' cases where KCP remediates m1 (the oldest Machine), or would
/// but for a reason of its own: the guard's verdict on KCP's deletion of m1. The Go test's KCP
/// is v1.19.1 (voting joins); learner joins run too, with the same verdicts.
#[test]
fn reconcile_unhealthy_machines_remediations() {
    const M3: &str = "m1-unhealthy:U m2-healthy:U m3-healthy:U";
    run_table(
        &[
            // KCP holds for a reason the guard does not see (the Cluster's topology version);
            // when KCP goes on, the guard allows its deletion (2 healthy of 2 after).
            Row {
                go: "reconcileUnhealthyMachines return early if there is a pending topology upgrade",
                machines: M3,
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP's own retry limits hold it; etcd would allow it, and so does the guard.
            Row {
                go: "Remediation does not happen if MaxRetry is reached",
                machines: M3,
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP deletes m1; the guard allows.
            Row {
                go: "Retry history is ignored if min healthy period is expired, default min healthy period",
                machines: M3,
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            Row {
                go: "Retry history is ignored if min healthy period is expired",
                machines: M3,
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP's retry period holds it; the guard would allow the deletion.
            Row {
                go: "Remediation does not happen if RetryPeriodSeconds is not yet passed",
                machines: M3,
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP waits for m4 to be provisioned. The guard allows KCP's deletion, more
            // leniently than KCP (3 healthy of 3 after m1 left; a voting m4 added before it has
            // started: 3 of 4, quorum 3).
            Row {
                go: "Remediation does not happen if there is an healthy machine being provisioned - 4 CP (during 3 CP rolling upgrade)",
                machines: "m1-unhealthy:U m2-healthy:U m3-healthy:U m4-healthy:J",
                replicas: Some(3),
                learner: SAFE,
                voting: SAFE,
            },
            // KCP unsafe; the guard denies (1 healthy of 2 after; m1 down: 1 of 3, quorum lost
            // already), and its next action names what unblocks KCP, no wait.
            Row {
                go: "Remediation does not happen if there is at least one additional unhealthy etcd member on a 3 machine CP",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:D m3-etcd-healthy:U",
                replicas: None,
                learner: (false, Reason::WouldLoseQuorum),
                voting: (false, Reason::WouldLoseQuorum),
            },
            Row {
                go: "Remediation does not happen if there is at least one additional unhealthy etcd member on a 3 machine CP (m1's member down)",
                machines: "m1-mhc-unhealthy:D m2-etcd-unhealthy:D m3-etcd-healthy:U",
                replicas: None,
                learner: (false, Reason::QuorumLost),
                voting: (false, Reason::QuorumLost),
            },
            // KCP unsafe; the guard denies (2 healthy of 4 after).
            Row {
                go: "Remediation does not happen if there are at least two additional unhealthy etcd member on a 5 machine CP",
                machines: "m1-mhc-unhealthy:U m2-etcd-unhealthy:D m3-etcd-unhealthy:D m4-etcd-healthy:U m5-etcd-healthy:U",
                replicas: None,
                learner: (false, Reason::WouldLoseQuorum),
                voting: (false, Reason::WouldLoseQuorum),
            },
            // KCP safe; the guard allows. Before issue 36 it denied `PendingJoin`: it counted
            // the replacement KCP makes for m1 as joining before m1's member left (1 healthy of
            // 2), while KCP creates it only after m1's deletion has finished.
            Row {
                go: "Remediation deletes unhealthy machine - 2 CP (during 1 CP rolling upgrade)",
                machines: "m1-unhealthy:U m2-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP safe; the guard allows.
            Row {
                go: "Remediation deletes unhealthy machine - 3 CP",
                machines: M3,
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP safe; the guard allows (m1 never got a member).
            Row {
                go: "Remediation deletes unhealthy machine failed to provision - 3 CP",
                machines: "m1-unhealthy:N m2-healthy:U m3-healthy:U",
                replicas: None,
                learner: (true, Reason::MemberAbsent),
                voting: (true, Reason::MemberAbsent),
            },
            // KCP safe (spec.replicas 4, as the Go case); the guard allows.
            Row {
                go: "Remediation deletes unhealthy machine - 4 CP (during 3 CP rolling upgrade)",
                machines: "m1-unhealthy:U m2-healthy:U m3-healthy:U m4-healthy:U",
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
            // KCP safe; the guard allows (m1 never got a member).
            Row {
                go: "Remediation deletes unhealthy machine failed to provision - 4 CP (during 3 CP rolling upgrade)",
                machines: "m1-unhealthy:N m2-healthy:U m3-healthy:U m4-healthy:U",
                replicas: None,
                learner: (true, Reason::MemberAbsent),
                voting: (true, Reason::MemberAbsent),
            },
            // KCP (spec.replicas 1, as the Go case) deletes m1, then its replacement m5 (with
            // m2 and m3 healthy); the guard allows both: KCP is exempt from the
            // desired-replicas rule, and 2 healthy of 2 are left.
            Row {
                go: "Subsequent remediation of the same machine increase retry count - 3 CP",
                machines: M3,
                replicas: Some(1),
                learner: SAFE,
                voting: SAFE,
            },
            Row {
                go: "Subsequent remediation of the same machine increase retry count - 3 CP (m5, the replacement)",
                machines: "m5-unhealthy:U m2-healthy:U m3-healthy:U",
                replicas: Some(1),
                learner: SAFE,
                voting: SAFE,
            },
            // KCP safe; the guard allows.
            Row {
                go: "Remediation happens when the CP is at intermediate steps of an upgrade sequence",
                machines: M3,
                replicas: None,
                learner: SAFE,
                voting: SAFE,
            },
        ],
        kcp_remediates_oldest,
    );
}

// TestReconcileUnhealthyMachines "Remediation deletes unhealthy machine - 1 CP not initialized":
// KCP deletes m1; the guard allows (etcd unknown: KCP's policy).
#[test]
fn reconcile_deletes_one_not_initialized() {
    kcp_remediates_uninitialized(Voting, 1, "m1-unhealthy");
}

// TestReconcileUnhealthyMachines "Subsequent remediation of the same machine increase retry
// count - 1 CP not initialized": KCP deletes m1, then each replacement m2, m3 in turn; the
// guard allows each.
#[test]
fn reconcile_subsequent_remediation_one_not_initialized() {
    for name in ["m1-unhealthy", "m2-unhealthy", "m3-unhealthy"] {
        kcp_remediates_uninitialized(Voting, 1, name);
    }
}

// ---------------------------------------------------------------------------------------------
// TestReconcileUnhealthyMachinesSequences: KCP v1.19.1 in the Go test (voting joins); issue 36
// met the second sequence on v1.32 (learner joins): both styles run.
// ---------------------------------------------------------------------------------------------

// TestReconcileUnhealthyMachinesSequences "Remediates the first CP machine having problems to
// come up": a KCP not initialized deletes m1, then its replacement m2; then m3 comes up healthy.
// The guard allows each deletion (no probe has reached etcd: KCP's policy).
#[test]
fn sequence_first_machine_fails_to_come_up() {
    for j in BOTH {
        for name in ["m1-unhealthy", "m2-unhealthy"] {
            kcp_remediates_uninitialized(j, 3, name);
        }
    }
}

// TestReconcileUnhealthyMachinesSequences "Remediates the second CP machine having problems to
// come up": spec.replicas 3; m1 healthy (the leader), m2's member up but its Machine marked for
// remediation. KCP v1.14 remediates first: it deletes m2, its pre-terminate hook removes m2's
// member (1 voting, 1 healthy), then it scales up, and the new Machine's join adds a learner
// (v1.32) promoted in sync, or a voting member (v1.19) that counts from `member add`, after m2's
// member has gone. No step loses quorum. Before issue 36 the guard denied `PendingJoin` and
// published `WaitForRollout`, a wait for a scale-up KCP never makes while its remediation is
// refused.
#[test]
fn sequence_second_machine_fails_to_come_up() {
    for j in BOTH {
        // Step 1: KCP deletes m2.
        let mut c = go_cp(j, 3, &[("m1-healthy", M::Up), ("m2-unhealthy", M::Up)]);
        members_mut(&mut c)[0].is_leader = true;
        mark(&mut c, "m2-unhealthy");
        let v = kcp_may_delete(&c, "m2-unhealthy", Reason::QuorumSafe);
        let f = v.figures.expect("figures");
        assert_eq!((f.voting_after, f.healthy_after), (1, 1));
        // Step 2: m2 is deleting; its member can leave (1 healthy of 1 after): KCP's hook
        // removes it, and the guard waits for that.
        machine_mut(&mut c, "m2-unhealthy").deleting = true;
        let a = next(&c);
        assert_eq!(
            (a.code, a.target.as_deref()),
            (ActionCode::WaitForDeletion, Some("m2-unhealthy")),
            "{}",
            a.message
        );
        // Step 3: m2 and its member are gone: KCP scales up (1 Machine for 3 replicas).
        c.machines.retain(|m| m.name != "m2-unhealthy");
        members_mut(&mut c).retain(|m| m.name != "m2-unhealthy");
        assert_eq!(next(&c).code, ActionCode::WaitForRollout);
        // Step 4: m3 joins; in learner style its member is a learner catching up.
        add_machine(&mut c, "m3-unhealthy");
        young(&mut c, "m3-unhealthy");
        let wait = match j {
            Learner => {
                add_member(&mut c, 3, "m3-unhealthy", healthy(), true);
                ActionCode::WaitForLearner
            }
            Voting => ActionCode::WaitForJoin,
        };
        assert_eq!(next(&c).code, wait);
        // Step 5 (the Go test's "retry 2"): m3 is marked too. Learner style: its learner never
        // caught up, and its deletion changes no quorum. Voting style: its member started and
        // stopped: 1 healthy of 2 voting members, quorum is lost already, and etcd commits no
        // member removal, so KCP's hook could not remove it either; the guard is stricter
        // than KCP's check (which leaves m3 out) and says to restore quorum.
        mark(&mut c, "m3-unhealthy");
        match j {
            Learner => {
                members_mut(&mut c)[1].health = down();
                kcp_may_delete(&c, "m3-unhealthy", Reason::LearnerMember);
            }
            Voting => {
                add_member(&mut c, 3, "m3-unhealthy", down(), false);
                let v = kcp_refused(&c, "m3-unhealthy", Reason::QuorumLost);
                assert_eq!(v.next_action.code, ActionCode::RestoreQuorum);
            }
        }
    }
}

// TestReconcileUnhealthyMachinesSequences "Remediates only one CP machine in case of multiple
// failures": m1 healthy, m2 and m3 (members healthy) marked. KCP deletes m2 (the oldest marked);
// the guard allows. After m2 has gone KCP does not remediate m3 (its remediation is in
// progress until the replacement exists): it scales up, and the guard's next action waits for
// that scale-up, which KCP does make.
#[test]
fn sequence_only_one_of_multiple_failures() {
    for j in BOTH {
        let mut c = go_cp(
            j,
            3,
            &[
                ("m1-healthy", M::Up),
                ("m2-unhealthy", M::Up),
                ("m3-unhealthy", M::Up),
            ],
        );
        mark(&mut c, "m2-unhealthy");
        mark(&mut c, "m3-unhealthy");
        kcp_may_delete(&c, "m2-unhealthy", Reason::QuorumSafe);
        c.machines.retain(|m| m.name != "m2-unhealthy");
        members_mut(&mut c).retain(|m| m.name != "m2-unhealthy");
        assert_eq!(next(&c).code, ActionCode::WaitForRollout);
    }
}

// ---------------------------------------------------------------------------------------------
// TestPreflightChecks: KCP's preflight before a scale operation. The guard reviews no Machine
// creation; its counterparts are the verdict on a person's change of spec.replicas (which starts
// KCP's scale-up) and the next action it publishes, which must not wait for a scale-up the
// preflight holds for an etcd reason. Preflight holds for reasons the guard does not see
// (topology, certificates, pod conditions): there the guard is more lenient, and KCP's own
// preflight holds. The Go fixtures set no KCP version: both styles run.
// ---------------------------------------------------------------------------------------------

/// One Machine, its member healthy, spec.replicas 1.
fn one_healthy(j: Style) -> ControlPlane {
    go_cp(j, 1, &[("machine-1", M::Up)])
}

/// Raising spec.replicas from 1 to 3 is allowed (what KCP's preflight then does is its own).
fn scale_up_allowed(c: &ControlPlane) {
    let v = scale(c, 3);
    assert!(v.allowed, "{v:#?}");
}

// TestPreflightChecks "control plane without machines (not initialized) should pass": KCP
// creates its first Machine, which the guard does not review; with no Machine no probe has
// reached etcd, and the next action says to look at etcd, no wait.
#[test]
fn preflight_no_machines() {
    for j in BOTH {
        let mut c = go_cp(j, 1, &[]);
        not_initialized(&mut c);
        assert_eq!(next(&c).code, ActionCode::CheckEtcdHealth);
    }
}

// TestPreflightChecks "control plane with a pending upgrade should requeue": KCP holds for the
// Cluster's topology version, which the guard does not see; etcd allows the scale-up.
#[test]
fn preflight_pending_upgrade() {
    for j in BOTH {
        scale_up_allowed(&one_healthy(j));
    }
}

// TestPreflightChecks "control plane with a pending upgrade, but not yet at the current step of
// the upgrade plan, should requeue": as above.
#[test]
fn preflight_pending_upgrade_not_at_step() {
    for j in BOTH {
        scale_up_allowed(&one_healthy(j));
    }
}

// TestPreflightChecks "control plane with a deleting machine should requeue": KCP waits for the
// deletion; so does the guard's next action, a wait that ends (the deleting Machine's member can
// leave: 2 healthy of 2 after). A person's scale-up is allowed (the newcomer is safe even after
// the deleting member has left).
#[test]
fn preflight_deleting_machine() {
    for j in BOTH {
        let mut c = go_cp(
            j,
            3,
            &[
                ("machine-1", M::Up),
                ("machine-2", M::Up),
                ("machine-3", M::Up),
            ],
        );
        machine_mut(&mut c, "machine-1").deleting = true;
        assert_eq!(next(&c).code, ActionCode::WaitForDeletion);
        let v = scale(&c, 5);
        assert!(v.allowed, "{v:#?}");
    }
}

// TestPreflightChecks "control plane without certificates should requeue if scale up": KCP
// holds for its certificates, which the guard does not see; etcd allows the scale-up.
#[test]
fn preflight_no_certificates_scale_up() {
    for j in BOTH {
        scale_up_allowed(&one_healthy(j));
    }
}

// TestPreflightChecks "control plane without certificates should pass if not scale up": KCP
// goes on (a rollout here); the guard allows the change that starts it.
#[test]
fn preflight_no_certificates_not_scale_up() {
    for j in BOTH {
        let c = one_healthy(j);
        let v = decide(
            &c,
            &Operation::UpdateKcp {
                replicas_from: 1,
                replicas_to: 1,
                starts_rollout: true,
            },
            &human(),
            &Policy::default(),
            NOW,
        );
        assert_verdict(&v, true, Reason::RolloutAllowed);
    }
}

// TestPreflightChecks "control plane without a nodeRef should requeue": KCP waits for
// machine-1's node. The guard's next action waits for that join, which ends (the join, or
// `--join-grace`).
#[test]
fn preflight_no_node_ref() {
    for j in BOTH {
        let mut c = go_cp(
            j,
            3,
            &[
                ("machine-0", M::Up),
                ("machine-2", M::Up),
                ("machine-1", M::NoNode),
            ],
        );
        young(&mut c, "machine-1");
        let a = next(&c);
        assert_eq!(
            (a.code, a.target.as_deref()),
            (ActionCode::WaitForJoin, Some("machine-1"))
        );
    }
}

// TestPreflightChecks "control plane with an unhealthy machine condition should requeue" (the
// API server pod): KCP holds for a pod condition the guard does not see; etcd allows the
// scale-up.
#[test]
fn preflight_unhealthy_api_server() {
    for j in BOTH {
        scale_up_allowed(&one_healthy(j));
    }
}

// TestPreflightChecks "control plane with an unhealthy machine condition should requeue" (the
// etcd member): KCP holds; the guard denies the scale-up (its only member is down: no quorum)
// and its next action restores quorum, no wait.
#[test]
fn preflight_unhealthy_etcd_member() {
    for j in BOTH {
        let c = go_cp(j, 1, &[("machine-1", M::Down)]);
        assert_verdict(&scale(&c, 3), false, Reason::QuorumLost);
        assert_eq!(next(&c).code, ActionCode::RestoreQuorum);
    }
}

// TestPreflightChecks "control plane where target etcd cluster and k8s control plane will be
// healthy state should pass when scaling up after remediation, no matter of failures on other
// machines": after a remediation (2 Machines for 3 replicas, members healthy) KCP scales up; the
// guard's next action waits for that scale-up, which KCP makes.
#[test]
fn preflight_scale_up_after_remediation() {
    for j in BOTH {
        let c = go_cp(j, 3, &[("machine-1", M::Up), ("machine-2", M::Up)]);
        assert_eq!(next(&c).code, ActionCode::WaitForRollout);
    }
}

// TestPreflightChecks "requeue control plane where target k8s control plane will be unhealthy
// when scaling up after remediation": KCP holds for pod conditions the guard does not see; the
// guard's next action waits for the scale-up, which KCP makes once the pods recover.
#[test]
fn preflight_scale_up_after_remediation_k8s_unhealthy() {
    for j in BOTH {
        let c = go_cp(j, 3, &[("machine-1", M::Up), ("machine-2", M::Up)]);
        assert_eq!(next(&c).code, ActionCode::WaitForRollout);
    }
}

// TestPreflightChecks "requeue control plane where target etcd cluster will be unhealthy when
// scaling up after remediation" (3 Machines of a 4-replica rollout, machine-2's member down):
// KCP holds the scale-up. The guard's next action is no wait for it: it names machine-2's
// replacement. A person's scale-up: voting joins, denied (2 healthy of 4 once the newcomer is
// added, quorum 3); learner joins, allowed more leniently than KCP (a learner cannot lose quorum;
// KCP's preflight and etcd's strict reconfiguration check hold the join).
#[test]
fn preflight_scale_up_after_remediation_etcd_unhealthy() {
    for j in BOTH {
        let c = go_cp(
            j,
            4,
            &[
                ("machine-1", M::Up),
                ("machine-2", M::Down),
                ("machine-3", M::Up),
            ],
        );
        let a = next(&c);
        assert_eq!(
            (a.code, a.target.as_deref()),
            (ActionCode::RemediateMachine, Some("machine-2")),
            "{}",
            a.message
        );
        let v = scale(&c, 5);
        match j {
            Voting => assert_verdict(&v, false, Reason::ScaleUpWouldLoseQuorum),
            Learner => assert_verdict(&v, true, Reason::ScaleUpSafe),
        }
    }
}

// TestPreflightChecks "control plane with an healthy machine and an healthy kcp condition should
// pass": KCP goes on; the guard allows the scale-up and has nothing to do.
#[test]
fn preflight_healthy() {
    for j in BOTH {
        let c = one_healthy(j);
        scale_up_allowed(&c);
        assert_eq!(next(&c).code, ActionCode::None);
    }
}

// TestPreflightChecks "control plane with a pending upgrade, but already at the current step of
// the upgrade plan, should pass": as above.
#[test]
fn preflight_pending_upgrade_at_step() {
    for j in BOTH {
        let c = one_healthy(j);
        scale_up_allowed(&c);
        assert_eq!(next(&c).code, ActionCode::None);
    }
}
