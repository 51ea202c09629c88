//! Which calls each step is, on which members: the part of carrying out a step that needs no
//! etcd (the calls themselves are tested on real etcd in `tests/it/etcd_actions.rs`).

use quorumguard_engine::autopilot::Step;
use quorumguard_engine::testkit::{add_member, cp, healthy, members_mut};
use quorumguard_engine::{Alarm, ControlPlane, EtcdState, MemberId};

use super::{Plan, plan};
use crate::etcd::Call;

/// Three healthy members a, b, c (ids 1-3), b leading.
fn three() -> ControlPlane {
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
    members_mut(&mut c)[1].is_leader = true;
    c
}

/// The plan's calls as (call, via id, about id).
fn calls(step: &Step, c: &ControlPlane) -> Vec<(Call, u64, Option<u64>)> {
    match plan(step, c).unwrap_or_else(|e| panic!("{step}: {e}")) {
        Plan::Etcd(calls) => calls
            .iter()
            .map(|p| (p.call, p.via.id.0, p.about.map(|m| m.0)))
            .collect(),
        Plan::DeleteMachine(m) => panic!("{step}: deletes Machine {m}"),
    }
}

#[test]
fn membership_changes_and_compaction_go_to_the_leader() {
    let mut c = three();
    add_member(&mut c, 4, "d", healthy(), true);
    let promote = Step::Promote {
        member: MemberId(4),
        name: "d".into(),
    };
    assert_eq!(calls(&promote, &c), [(Call::Promote, 2, Some(4))]);
    let remove = Step::RemoveMember {
        member: MemberId(4),
        name: "d".into(),
    };
    assert_eq!(calls(&remove, &c), [(Call::Remove, 2, Some(4))]);
    assert_eq!(calls(&Step::Compact, &c), [(Call::Compact, 2, None)]);
}

#[test]
fn a_defragmentation_goes_to_its_member_and_move_leader_to_the_leader() {
    let c = three();
    let defrag = Step::Defragment {
        member: MemberId(3),
        name: "c".into(),
        db_size: None,
    };
    assert_eq!(calls(&defrag, &c), [(Call::Defragment, 3, None)]);
    let moved = Step::MoveLeader {
        from: MemberId(2),
        to: MemberId(1),
    };
    assert_eq!(calls(&moved, &c), [(Call::MoveLeader, 2, Some(1))]);
}

#[test]
fn a_disarm_is_one_call_per_alarmed_member() {
    let mut c = three();
    members_mut(&mut c)[0].alarms.push(Alarm::NoSpace);
    members_mut(&mut c)[2].alarms.push(Alarm::NoSpace);
    assert_eq!(
        calls(&Step::Disarm, &c),
        [
            (Call::DisarmNospace, 2, Some(1)),
            (Call::DisarmNospace, 2, Some(3))
        ]
    );
}

#[test]
fn a_step_the_fresh_probe_cannot_place_is_not_planned() {
    let mut c = three();
    // The leadership moved since the step was decided.
    let moved = Step::MoveLeader {
        from: MemberId(1),
        to: MemberId(3),
    };
    let err = plan(&moved, &c).expect_err("1 does not lead");
    assert!(err.contains("does not lead"), "{err}");
    // A learner promoted meanwhile (by kubeadm).
    let promote = Step::Promote {
        member: MemberId(3),
        name: "c".into(),
    };
    assert!(
        plan(&promote, &c)
            .expect_err("voting")
            .contains("not a learner")
    );
    // A member gone.
    let defrag = Step::Defragment {
        member: MemberId(9),
        name: "z".into(),
        db_size: None,
    };
    assert!(
        plan(&defrag, &c)
            .expect_err("gone")
            .contains("not in the fresh")
    );
    // No leader: nothing cluster-wide is sent.
    members_mut(&mut c)[1].is_leader = false;
    assert!(
        plan(&Step::Compact, &c)
            .expect_err("no leader")
            .contains("no leader")
    );
    // Nothing to disarm.
    members_mut(&mut c)[1].is_leader = true;
    assert!(
        plan(&Step::Disarm, &c)
            .expect_err("no alarm")
            .contains("NOSPACE")
    );
    // No member list at all.
    c.etcd = EtcdState::Unknown {
        reason: "probe failed".into(),
    };
    assert!(
        plan(&Step::Compact, &c)
            .expect_err("unknown")
            .contains("probe failed")
    );
}

#[test]
fn the_2651_step_is_the_machine_deletion() {
    let c = three();
    let step = Step::DeleteMachine {
        machine: "a".into(),
    };
    assert_eq!(plan(&step, &c).expect("planned"), Plan::DeleteMachine("a"));
}
