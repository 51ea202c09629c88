//! The next safe action, one test per code.

use std::time::Duration;

use super::assert_verdict;
use crate::testkit::*;
use crate::*;

fn three_healthy() -> ControlPlane {
    cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())])
}

#[test]
fn converged_is_none() {
    let a = next(&three_healthy());
    assert_eq!(a.code, ActionCode::None);
    assert!(a.message.contains("fault tolerance 1"), "{}", a.message);
}

#[test]
fn external_and_teardown() {
    let mut c = three_healthy();
    c.kcp.etcd = EtcdTopology::External;
    assert_eq!(next(&c).code, ActionCode::None);
    let mut c = three_healthy();
    c.cluster.deleting = true;
    assert_eq!(next(&c).code, ActionCode::WaitForTeardown);
}

#[test]
fn unknown_etcd_and_stale_health() {
    let mut c = three_healthy();
    c.etcd = EtcdState::Unknown {
        reason: "no probe yet".into(),
    };
    let a = next(&c);
    assert_eq!(a.code, ActionCode::CheckEtcdHealth);
    assert!(a.message.contains("no probe yet"));
    let mut c = three_healthy();
    if let EtcdState::Observed(s) = &mut c.etcd {
        s.age = Some(Duration::from_secs(3600));
    }
    assert_eq!(next(&c).code, ActionCode::CheckEtcdHealth);
}

#[test]
fn quorum_lost_is_restore() {
    let c = cp(3, &[("a", healthy()), ("b", down()), ("c", down())]);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RestoreQuorum);
    assert!(a.message.contains("1 healthy of 3"), "{}", a.message);
}

#[test]
fn delete_machine_after_interrupted_step() {
    let mut c = three_healthy();
    add_machine(&mut c, "old");
    let a = next(&c);
    assert_eq!(a.code, ActionCode::DeleteMachine);
    assert_eq!(a.target.as_deref(), Some("old"));
    assert!(
        a.message.contains("4 Machines for 3 replicas"),
        "{}",
        a.message
    );
}

#[test]
fn wait_for_deletion() {
    let mut c = three_healthy();
    machine_mut(&mut c, "a").deleting = true;
    let a = next(&c);
    assert_eq!(a.code, ActionCode::WaitForDeletion);
    assert_eq!(a.target.as_deref(), Some("a"));
    // Stuck: the deleting machine's member cannot leave while c is down.
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    machine_mut(&mut c, "a").deleting = true;
    assert!(next(&c).message.contains("cannot leave safely"));
    assert_eq!(next(&c).code, ActionCode::CheckEtcdHealth);
}

#[test]
fn wait_for_join_and_learner() {
    // A new machine with no member yet: the wait says until when.
    let mut c = three_healthy();
    c.kcp.replicas = 4;
    let i = add_machine(&mut c, "d");
    c.machines[i].created_unix = Some(NOW - 30);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::WaitForJoin);
    assert!(
        a.message.contains(
            "(created at 2027-01-15T07:59:30Z; at 2027-01-15T08:09:30Z, after --join-grace 10m, without one it counts as failed"
        ),
        "{}",
        a.message
    );
    // The same machine long after: it is broken and should be replaced.
    c.machines[i].created_unix = Some(NOW - 7200);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemediateMachine);
    assert_eq!(a.target.as_deref(), Some("d"));
    // An unstarted member while a Machine without a member is young: joining.
    let mut c = three_healthy();
    c.kcp.replicas = 4;
    let i = add_machine(&mut c, "d");
    c.machines[i].node_name = None;
    c.machines[i].created_unix = Some(NOW - 240);
    add_member(&mut c, 99, "", Health::Unknown, false);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::WaitForJoin, "{}", a.message);
    assert!(
        a.message.contains(
            "has been added but has not started (Machine ns/d, the newest without an etcd member, was created at 2027-01-15T07:56:00Z; at 2027-01-15T08:06:00Z, after --join-grace 10m, the member counts as failed)"
        ),
        "{}",
        a.message
    );
    // A rollout step (maxSurge 1): a fourth, new Machine has its node but its member has not
    // joined yet. It is not the #2651 leftover: never tell anyone to delete it.
    let mut c = three_healthy();
    let i = add_machine(&mut c, "new");
    c.machines[i].created_unix = Some(NOW - 20);
    assert_eq!(next(&c).code, ActionCode::WaitForJoin);
    add_member(&mut c, 99, "", Health::Unknown, false);
    assert_eq!(next(&c).code, ActionCode::WaitForJoin);
    // A learner of a young Machine.
    let mut c = three_healthy();
    let i = add_machine(&mut c, "l");
    c.machines[i].created_unix = Some(NOW - 120);
    add_member(&mut c, 9, "l", healthy(), true);
    c.kcp.replicas = 4;
    let a = next(&c);
    assert_eq!(a.code, ActionCode::WaitForLearner);
    assert_eq!(a.target.as_deref(), Some("9"));
    assert!(
        a.message
            .contains("(its Machine ns/l, created at 2027-01-15T07:58:00Z; at 2027-01-15T08:13:00Z, after --learner-grace 15m, it counts as stalled)"),
        "{}",
        a.message
    );
    // Unknown health (a failure seen once, not confirmed): still waiting.
    members_mut(&mut c)[3].health = Health::Unconfirmed("seen once".into());
    assert_eq!(next(&c).code, ActionCode::WaitForLearner);
}

#[test]
fn no_wait_without_an_end() {
    // cluster-api #2651's rollout step, long after: the unstarted member of the fourth Machine
    // never started. Was WaitForJoin for ever; the member is removed first (it changes no
    // healthy count), then the Machine whose join failed is dealt with.
    let mut c = three_healthy();
    let i = add_machine(&mut c, "new");
    c.machines[i].created_unix = Some(NOW - 7200);
    add_member(&mut c, 0x99, "", Health::Unknown, false);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemoveOrphanMember, "{}", a.message);
    assert_eq!(a.command.as_deref(), Some("etcdctl member remove 99"));
    assert!(a.message.contains("Then Machine ns/new"), "{}", a.message);
    members_mut(&mut c).pop();
    assert_eq!(next(&c).code, ActionCode::DeleteMachine);
    // A learner of an old Machine, healthy and caught up: promoted.
    let mut c = three_healthy();
    add_machine(&mut c, "l");
    add_member(&mut c, 9, "l", healthy(), true);
    c.kcp.replicas = 4;
    let a = next(&c);
    assert_eq!(a.code, ActionCode::PromoteLearner, "{}", a.message);
    assert_eq!(a.command.as_deref(), Some("etcdctl member promote 9"));
    // ...behind the leader: its Machine is replaced (KCP's deletion of it is allowed).
    for (i, m) in members_mut(&mut c).iter_mut().enumerate() {
        m.raft_index = Some(if i == 3 { 10 } else { 1000 });
        m.is_leader = i == 0;
    }
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemediateMachine, "{}", a.message);
    assert_eq!(a.target.as_deref(), Some("l"));
    assert!(a.message.contains("not caught up"), "{}", a.message);
    // ...of unknown health: looked at, not waited for.
    members_mut(&mut c)[3].health = Health::Unknown;
    assert_eq!(next(&c).code, ActionCode::CheckEtcdHealth);
    // A healthy learner no Machine owns, no Machine joining: removed.
    let mut c = three_healthy();
    add_member(&mut c, 9, "gone", healthy(), true);
    assert_eq!(next(&c).code, ActionCode::RemoveOrphanMember);
    // NOSPACE: free space, not a new Machine; CORRUPT stays remediation.
    let mut c = three_healthy();
    members_mut(&mut c)[1].alarms.push(Alarm::NoSpace);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::FreeSpace, "{}", a.message);
    assert_eq!(a.target.as_deref(), Some("2"));
    assert!(
        a.command
            .as_deref()
            .unwrap()
            .contains("etcdctl alarm disarm")
    );
    // Raised by every member: still space, not a lost quorum.
    for m in members_mut(&mut c) {
        m.alarms = vec![Alarm::NoSpace];
    }
    assert_eq!(next(&c).code, ActionCode::FreeSpace);
    let mut c = three_healthy();
    members_mut(&mut c)[1].alarms.push(Alarm::Corrupt);
    assert_eq!(next(&c).code, ActionCode::RemediateMachine);
    // A deletion whose member cannot leave: not a wait (nothing moves by itself).
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    machine_mut(&mut c, "a").deleting = true;
    let a = next(&c);
    assert_eq!(a.code, ActionCode::CheckEtcdHealth, "{}", a.message);
    assert!(a.message.contains("Bring back etcd on c"), "{}", a.message);
}

#[test]
fn a_failed_learner_is_replaced_not_waited_for() {
    // Found by the model check (tests/slow/model.rs): a learner whose process failed while it
    // joined never catches up, and KCP's preflight holds every change meanwhile. Waiting for
    // it was a deadlock; its Machine is remediated instead.
    let mut c = three_healthy();
    c.kcp.replicas = 4;
    add_machine(&mut c, "l");
    machine_mut(&mut c, "l").node_name = None;
    add_member(&mut c, 9, "l", down(), true);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemediateMachine, "{}", a.message);
    assert_eq!(a.target.as_deref(), Some("l"));
    // ...and KCP's deletion of it is allowed: a learner does not vote.
    assert_verdict(
        &delete(&c, "l", &kcp_controller()),
        true,
        Reason::LearnerMember,
    );
    // A failed learner no Machine accounts for is removed from etcd.
    let mut c = three_healthy();
    add_member(&mut c, 9, "gone", down(), true);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemoveOrphanMember, "{}", a.message);
    assert_eq!(a.target.as_deref(), Some("9"));
}

#[test]
fn orphan_member() {
    let mut c = three_healthy();
    add_member(&mut c, 0xdead, "gone", down(), false);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemoveOrphanMember);
    assert_eq!(a.command.as_deref(), Some("etcdctl member remove dead"));
    // A healthy orphan whose removal would cost quorum is not named: 2 healthy + 1 down +
    // healthy orphan: removing it leaves 2 healthy of 3, quorum 2: safe, so it is named.
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    add_member(&mut c, 0xbeef, "gone", healthy(), false);
    assert_eq!(next(&c).code, ActionCode::RemoveOrphanMember);
}

#[test]
fn remediate_unhealthy_member() {
    let c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    let a = next(&c);
    assert_eq!(a.code, ActionCode::RemediateMachine);
    assert_eq!(
        a.command.as_deref(),
        Some("kubectl annotate machine -n ns c cluster.x-k8s.io/remediate-machine=\"\"")
    );
}

#[test]
fn scaling_is_wait_for_rollout() {
    let mut c = three_healthy();
    c.kcp.replicas = 5;
    assert_eq!(next(&c).code, ActionCode::WaitForRollout);
}
