//! The confirmation's tests: sequences of probes judged one after another.

use super::*;
use crate::model::Health;
use crate::testkit::{leaderless, probed as member, silent, up};

const ET: Duration = Duration::from_secs(1);

fn c() -> Confirmation {
    Confirmation {
        election_timeout: ET,
    }
}

fn s(secs: f64) -> Duration {
    Duration::from_secs_f64(secs)
}

fn healths(j: &Judged) -> Vec<&'static str> {
    j.members
        .as_ref()
        .expect("a record")
        .iter()
        .map(|m| match &m.health {
            Health::Healthy => "up",
            Health::Unhealthy(_) => "down",
            Health::Unknown => "unknown",
            Health::Unconfirmed(_) => "unconfirmed",
        })
        .collect()
}

#[test]
fn a_leader_election_is_not_quorum_loss_until_it_lasts_the_window() {
    let mut b = Belief::default();
    let j = b.judge(vec![up(1, true), up(2, false), up(3, false)], s(0.0), &c());
    assert_eq!(healths(&j), ["up", "up", "up"]);
    assert_eq!(j.recheck_in, None);
    // The leader is removed: the two left answer, without a leader.
    let j = b.judge(vec![leaderless(2), leaderless(3)], s(1.0), &c());
    assert_eq!(
        j.members, None,
        "a changed member list waits for a second probe"
    );
    assert_eq!(j.recheck_in, Some(ET));
    let j = b.judge(vec![leaderless(2), leaderless(3)], s(2.0), &c());
    assert_eq!(healths(&j), ["unconfirmed", "unconfirmed"]);
    let why = match &j.members.as_ref().expect("record")[0].health {
        Health::Unconfirmed(w) => w.clone(),
        other => panic!("{other:?}"),
    };
    assert!(why.starts_with("leader election in progress"), "{why}");
    assert!(why.ends_with("etcdserver: no leader"), "{why}");
    assert_eq!(j.recheck_in, Some(ET));
    // A new leader: believed at once.
    let j = b.judge(vec![up(2, true), up(3, false)], s(3.0), &c());
    assert_eq!(healths(&j), ["up", "up"]);
    assert_eq!(j.recheck_in, None);
}

#[test]
fn no_leader_for_the_whole_window_is_quorum_lost() {
    let mut b = Belief::default();
    b.judge(vec![up(1, true), up(2, false), up(3, false)], s(0.0), &c());
    let probe = || vec![leaderless(1), silent(2), silent(3)];
    for t in [10.0, 11.0, 12.0, 13.0, 14.0] {
        let j = b.judge(probe(), s(t), &c());
        assert_eq!(j.recheck_in, Some(ET), "at {t}");
        assert_eq!(healths(&j)[0], "unconfirmed", "at {t}");
    }
    // The silent ones are confirmed down by the second probe; the one that answers stays
    // in the election until 5 s have passed without a leader.
    let j = b.judge(probe(), s(15.0), &c());
    assert_eq!(healths(&j), ["down", "down", "down"]);
    assert_eq!(j.recheck_in, None);
    // And stays so without a new confirmation.
    let j = b.judge(probe(), s(25.0), &c());
    assert_eq!(healths(&j), ["down", "down", "down"]);
    assert_eq!(j.recheck_in, None);
}

#[test]
fn a_change_for_the_worse_needs_a_probe_an_election_timeout_later() {
    let mut b = Belief::default();
    b.judge(vec![up(1, true), up(2, false), up(3, false)], s(0.0), &c());
    let frozen = || vec![up(1, true), up(2, false), silent(3)];
    let j = b.judge(frozen(), s(10.0), &c());
    assert_eq!(healths(&j), ["up", "up", "unconfirmed"]);
    assert_eq!(j.recheck_in, Some(ET));
    // Too soon to confirm.
    let j = b.judge(frozen(), s(10.5), &c());
    assert_eq!(healths(&j), ["up", "up", "unconfirmed"]);
    let j = b.judge(frozen(), s(11.0), &c());
    assert_eq!(healths(&j), ["up", "up", "down"]);
    assert_eq!(j.recheck_in, None);
    // Believed down, it needs no new confirmation; back up, it is believed at once.
    let j = b.judge(frozen(), s(20.0), &c());
    assert_eq!(healths(&j), ["up", "up", "down"]);
    let j = b.judge(vec![up(1, true), up(2, false), up(3, false)], s(30.0), &c());
    assert_eq!(healths(&j), ["up", "up", "up"]);
    // A blip between two healthy probes is never believed.
    let j = b.judge(frozen(), s(40.0), &c());
    assert_eq!(healths(&j), ["up", "up", "unconfirmed"]);
    let j = b.judge(vec![up(1, true), up(2, false), up(3, false)], s(41.0), &c());
    assert_eq!(healths(&j), ["up", "up", "up"]);
    let j = b.judge(frozen(), s(50.0), &c());
    assert_eq!(
        healths(&j),
        ["up", "up", "unconfirmed"],
        "the earlier blip is forgotten"
    );
}

#[test]
fn the_first_probe_confirms_nothing_bad_by_itself() {
    let mut b = Belief::default();
    let j = b.judge(vec![up(1, true), silent(2)], s(0.0), &c());
    assert_eq!(healths(&j), ["up", "unconfirmed"]);
    let j = b.judge(vec![up(1, true), silent(2)], s(1.0), &c());
    assert_eq!(healths(&j), ["up", "down"]);
}

#[test]
fn a_frozen_leader_is_an_election_then_a_confirmed_failure() {
    let mut b = Belief::default();
    b.judge(vec![up(1, true), up(2, false), up(3, false)], s(0.0), &c());
    // Followers still name the frozen leader; their reads time out.
    let followers_waiting = |id| {
        member(
            id,
            Health::Unhealthy("linearizable read failed: no answer within 2s".into()),
            true,
            false,
        )
    };
    let j = b.judge(
        vec![silent(1), followers_waiting(2), followers_waiting(3)],
        s(10.0),
        &c(),
    );
    assert_eq!(healths(&j), ["unconfirmed", "unconfirmed", "unconfirmed"]);
    // They elect member 2; member 1 is still frozen: now that is believed.
    let j = b.judge(vec![silent(1), up(2, true), up(3, false)], s(13.0), &c());
    assert_eq!(healths(&j), ["down", "up", "up"]);
}

#[test]
fn a_changed_member_list_is_confirmed_before_it_is_recorded() {
    let mut b = Belief::default();
    b.judge(vec![up(1, true), up(2, false), up(3, false)], s(0.0), &c());
    let j = b.judge(vec![up(1, true), up(2, false)], s(5.0), &c());
    assert_eq!(j.members, None);
    // A different change starts its own confirmation.
    let j = b.judge(vec![up(1, true), up(3, false)], s(6.0), &c());
    assert_eq!(j.members, None);
    let j = b.judge(vec![up(1, true), up(3, false)], s(7.0), &c());
    assert_eq!(healths(&j), ["up", "up"]);
    // Member 2 comes back (a new ID, in etcd): confirmed the same way.
    let j = b.judge(vec![up(1, true), up(3, false), up(4, false)], s(8.0), &c());
    assert_eq!(j.members, None);
    let j = b.judge(vec![up(1, true), up(3, false), up(4, false)], s(9.5), &c());
    assert_eq!(healths(&j), ["up", "up", "up"]);
}

#[test]
fn learners_and_unknown_health_are_taken_as_they_are() {
    let mut b = Belief::default();
    let mut learner = silent(4);
    learner.is_learner = true;
    let j = b.judge(
        vec![
            up(1, true),
            member(2, Health::Unknown, false, false),
            learner,
        ],
        s(0.0),
        &c(),
    );
    // The learner's failure is a finding for the worse like any other; unknown is unknown.
    assert_eq!(healths(&j), ["up", "unknown", "unconfirmed"]);
}

#[test]
fn a_rebased_belief_judges_as_the_original_at_the_later_time() {
    // The same probes judged on a real clock, and on a clock that stays at `at` with the
    // belief rebased by the time between probes, give the same records.
    let at = c().window() + ET;
    let probes: Vec<(f64, Vec<Member>)> = vec![
        (0.0, vec![up(1, true), up(2, false), up(3, false)]),
        (10.0, vec![up(1, true), up(2, false), silent(3)]),
        (10.5, vec![leaderless(1), leaderless(2), silent(3)]),
        (11.5, vec![leaderless(1), leaderless(2), silent(3)]),
        (13.0, vec![leaderless(1), leaderless(2)]),
        (14.0, vec![leaderless(1), leaderless(2)]),
        (17.0, vec![leaderless(1), leaderless(2)]),
        (18.0, vec![up(1, true), leaderless(2)]),
    ];
    let (mut real, mut rebased) = (Belief::default(), Belief::default());
    let mut last = 0.0;
    for (t, probe) in probes {
        rebased.rebase(s(t - last));
        last = t;
        let a = real.judge(probe.clone(), s(t), &c());
        let b = rebased.judge(probe, at, &c());
        assert_eq!(a, b, "at {t}");
    }
    // Times older than `at` stop at zero.
    rebased.rebase(s(1000.0));
    assert_eq!(rebased.leaderless_since, None);
    assert!(rebased.suspects.values().all(|t| t.is_zero()));
}

#[test]
fn a_zero_election_timeout_believes_every_probe() {
    let off = Confirmation {
        election_timeout: Duration::ZERO,
    };
    let mut b = Belief::default();
    b.judge(vec![up(1, true), up(2, false), up(3, false)], s(0.0), &off);
    let j = b.judge(vec![leaderless(1), leaderless(2)], s(1.0), &off);
    assert_eq!(healths(&j), ["down", "down"]);
    assert_eq!(j.recheck_in, None);
}

#[test]
fn a_removed_member_never_counts_healthy_while_its_removal_awaits_confirmation() {
    let mut b = Belief::default();
    let j = b.judge_against(
        vec![up(1, true), up(2, false), up(3, false)],
        None,
        s(0.0),
        &c(),
    );
    let record = j.members.expect("a record");
    // Member 3 is removed; member 4 is added (a voting member, not started yet).
    let mut added = Member::new(4, "");
    added.health = Health::Unhealthy("not started".into());
    let j = b.judge_against(
        vec![up(1, true), up(2, false), added.clone()],
        Some(&record),
        s(1.0),
        &c(),
    );
    assert_eq!(j.recheck_in, Some(ET));
    let members = j.members.expect("both lists, at once");
    let ids: Vec<u64> = members.iter().map(|m| m.id.0).collect();
    assert_eq!(ids, [1, 2, 4, 3]);
    assert_eq!(
        healths_of(&members),
        ["up", "up", "unconfirmed", "unconfirmed"]
    );
    assert!(!members[2].is_learner, "a new member counts as voting");
    // Confirmed an election timeout later: the newest list alone.
    let j = b.judge_against(
        vec![up(1, true), up(2, false), added],
        Some(&members),
        s(2.0),
        &c(),
    );
    assert_eq!(j.members.expect("a record").len(), 3);
}

#[test]
fn a_removed_member_known_down_does_not_make_both_lists_claim_a_quorum_loss() {
    let mut b = Belief::default();
    b.judge(vec![up(1, true), up(2, false), silent(3)], s(0.0), &c());
    let j = b.judge(vec![up(1, true), up(2, false), silent(3)], s(1.0), &c());
    assert_eq!(healths(&j), ["up", "up", "down"]);
    let record = j.members.expect("a record");
    // Member 3 is removed and member 4 added, not started: etcd has 2 healthy of 3
    // voting, quorum holds. Counted down, member 3 would make it 2 healthy of 4.
    let mut added = Member::new(4, "");
    added.health = Health::Unhealthy("not started".into());
    let j = b.judge_against(
        vec![up(1, true), up(2, false), added],
        Some(&record),
        s(2.0),
        &c(),
    );
    let members = j.members.expect("both lists");
    let ids: Vec<u64> = members.iter().map(|m| m.id.0).collect();
    assert_eq!(ids, [1, 2, 4, 3]);
    assert_eq!(
        healths_of(&members),
        ["up", "up", "unconfirmed", "unconfirmed"]
    );
    // Confirmed; then member 4 (never started) is removed and member 5 added, not
    // started: 2 healthy of 3 voting again. Member 4 is left out of both lists.
    let j = b.judge_against(
        members.iter().filter(|m| m.id.0 != 3).cloned().collect(),
        Some(&members),
        s(3.0),
        &c(),
    );
    let record = j.members.expect("a record");
    let mut added = Member::new(5, "");
    added.health = Health::Unhealthy("not started".into());
    let j = b.judge_against(
        vec![up(1, true), up(2, false), added],
        Some(&record),
        s(4.0),
        &c(),
    );
    let ids: Vec<u64> = j
        .members
        .expect("both lists")
        .iter()
        .map(|m| m.id.0)
        .collect();
    assert_eq!(ids, [1, 2, 5]);
}

#[test]
fn a_confirmed_down_member_stays_down_through_an_election() {
    let mut b = Belief::default();
    b.judge(vec![up(1, true), up(2, false), silent(3)], s(0.0), &c());
    let j = b.judge(vec![up(1, true), up(2, false), silent(3)], s(1.0), &c());
    assert_eq!(healths(&j), ["up", "up", "down"]);
    // The leader goes; member 3 answers again but cannot read: it stays down, the others
    // are in the election.
    let j = b.judge(vec![silent(1), leaderless(2), leaderless(3)], s(2.0), &c());
    assert_eq!(healths(&j), ["unconfirmed", "unconfirmed", "down"]);
    // Seen healthy, it is healthy.
    let j = b.judge(vec![up(1, false), up(2, true), up(3, false)], s(3.0), &c());
    assert_eq!(healths(&j), ["up", "up", "up"]);
}

fn healths_of(v: &[Member]) -> Vec<&'static str> {
    healths(&Judged {
        members: Some(v.to_vec()),
        recheck_in: None,
    })
}

#[test]
fn a_learner_that_answers_during_an_election_waits_for_it_too() {
    let mut b = Belief::default();
    let mut learner = up(4, false);
    learner.is_learner = true;
    b.judge(
        vec![up(1, true), up(2, false), up(3, false), learner.clone()],
        s(0.0),
        &c(),
    );
    learner.health = Health::Unhealthy("etcdserver: no leader".into());
    // The leader is frozen: the others, the learner included, answer without a leader, for
    // longer than one election timeout but less than the window.
    for t in [1.0, 2.0, 3.0] {
        let j = b.judge(
            vec![silent(1), leaderless(2), leaderless(3), learner.clone()],
            s(t),
            &c(),
        );
        assert_eq!(healths(&j)[3], "unconfirmed", "at {t}");
    }
    learner.health = Health::Healthy;
    let j = b.judge(
        vec![silent(1), up(2, true), up(3, false), learner],
        s(4.0),
        &c(),
    );
    assert_eq!(healths(&j), ["down", "up", "up", "up"]);
}

/// The model check's counterexample (docs/rules.md, "What the checker found", elections of
/// 3 probes): a learner joins, its leader fails, and the learner answers "no leader" like the
/// voters. Two probes of that election do not confirm it down, and once promoted (the model
/// promotes during the election) it does not make the record claim a quorum loss while 3 of
/// 4 voting members are up.
#[test]
fn a_learner_that_joined_just_before_an_election_is_not_confirmed_down_by_it_nor_once_promoted() {
    let mut b = Belief::default();
    let learner = |health: Health, is_learner: bool| {
        let mut m = member(4, health, true, false);
        m.is_learner = is_learner;
        m
    };
    b.judge(vec![up(1, true), up(2, false), up(3, false)], s(0.0), &c());
    // The learner is added: a changed member list, confirmed by the next probe.
    let j = b.judge(
        vec![
            up(1, true),
            up(2, false),
            up(3, false),
            learner(Health::Healthy, true),
        ],
        s(1.0),
        &c(),
    );
    assert_eq!(j.members, None);
    // The leader fails: the others, the learner included, answer without a leader.
    let no_leader = || Health::Unhealthy("etcdserver: no leader".into());
    let electing = |is_learner| {
        vec![
            silent(1),
            leaderless(2),
            leaderless(3),
            learner(no_leader(), is_learner),
        ]
    };
    for t in [2.0, 3.0] {
        let j = b.judge(electing(true), s(t), &c());
        assert_eq!(healths(&j)[3], "unconfirmed", "at {t}");
    }
    // Promoted, still without a leader: a voting member in the election, not a confirmed
    // failure; the record does not claim quorum lost (etcd has 3 of 4 up).
    let j = b.judge(electing(false), s(4.0), &c());
    assert_eq!(
        healths(&j),
        ["down", "unconfirmed", "unconfirmed", "unconfirmed"]
    );
    let members = j.members.expect("a record");
    assert!(!crate::quorum::Tally::of(&members, false).quorum_lost());
    assert!(!b.is_confirmed_unhealthy(MemberId(4)));
}
