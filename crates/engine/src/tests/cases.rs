//! The named cases (cluster-api #2651 and its neighbours), what counts as unhealthy, and the
//! stability of the reason strings.

use super::{assert_verdict, three_healthy};
use crate::testkit::*;
use crate::*;

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
