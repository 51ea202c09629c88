//! What a fresh probe, taken for one admission decision, says: bad news counts at once.
//!
//! The webhook allows an operation whose safety depends on etcd health only on answers etcd
//! gave after the request arrived (the guard's `etcd::fresh`). For that decision the probe is
//! read differently from the published record ([`super::confirm`]):
//!
//! - **A member that does not answer, while a majority of the voting members does, is down** for
//!   this decision, not unknown. Not answering when the others answer is evidence, not lack of
//!   data; a denial built on it says so ("did not answer just now"). What is *published* keeps
//!   the confirmation rule, so the false alarms of leader elections stay away from conditions.
//! - **A member that answers unhealthy while a healthy leader is seen is down.**
//! - **A leader election stays unknown**: members that answer their status while no member
//!   reports itself a healthy leader are unknown (the election decides within about one election
//!   timeout), and so, when fewer than a majority answer, are the silent ones: the guard cannot
//!   tell a dead member from a cut-off one then.
//! - **Bad news is not forgotten**: a member the record holds confirmed unhealthy stays
//!   unhealthy until a probe sees it healthy; a fresh probe that cannot tell (an election, too
//!   few answers) does not turn it into unknown. The same holds when the fresh probe fails:
//!   [`failed_view`].
//! - **The member list is the fresh probe's**: a member removed since the record was taken is
//!   gone, a member added since counts (a new voting member is not healthy until it answers).
//!
//! Pure: the adapter passes the probe and the record it holds.

use super::model::{Alarm, Health, HealthRef, Member};
use super::quorum::quorum;

/// How a member's status answer shows in a probe: a member whose status call came back has a
/// raft term.
fn answered(m: &Member) -> bool {
    m.raft_term.is_some()
}

/// Whether the record holds `m` confirmed unhealthy (the record's `Unhealthy` is confirmed:
/// an unconfirmed finding is recorded as [`Health::Unconfirmed`]). Unstarted members are left to
/// the probe: that they have not started is what the member list says now.
fn confirmed_down<'a>(record: &'a [Member], m: &Member) -> Option<&'a str> {
    record
        .iter()
        .find(|r| r.id == m.id && !r.is_unstarted())
        .and_then(|r| match &r.health {
            Health::Unhealthy(e) => Some(e.as_str()),
            _ => None,
        })
}

/// The members as one admission decision must count them, from a fresh probe `probe` (its member
/// list and each member's answer, as the prober reports them) and the guard's `record` of the
/// earlier probes (empty when there is none).
pub fn fresh_view(probe: Vec<Member>, record: &[Member]) -> Vec<Member> {
    let voting = probe.iter().filter(|m| !m.is_learner).count();
    let answering = probe
        .iter()
        .filter(|m| !m.is_learner && answered(m))
        .count();
    let majority = voting > 0 && answering >= quorum(voting);
    let led = probe
        .iter()
        .any(|m| m.is_leader && m.health == Health::Healthy);
    probe
        .into_iter()
        .map(|mut m| {
            m.health = match std::mem::replace(&mut m.health, Health::Unknown) {
                Health::Healthy => Health::Healthy,
                Health::Unhealthy(e) | Health::Unconfirmed(e) => {
                    judge_bad(&m, e, majority, led, record)
                }
                Health::Unknown => match confirmed_down(record, &m) {
                    Some(was) => Health::Unhealthy(still_down(was)),
                    None => Health::Unknown,
                },
            };
            m
        })
        .collect()
}

fn judge_bad(m: &Member, e: String, majority: bool, led: bool, record: &[Member]) -> Health {
    if m.is_unstarted() || (!answered(m) && majority) || (answered(m) && led) {
        return Health::Unhealthy(if answered(m) {
            format!("answered unhealthy just now: {e}")
        } else {
            format!("did not answer just now: {e}")
        });
    }
    if let Some(was) = confirmed_down(record, m) {
        return Health::Unhealthy(still_down(was));
    }
    Health::Unconfirmed(if answered(m) {
        format!(
            "leader election in progress: it answers, but no member reports a healthy leader just now; the probe saw: {e}"
        )
    } else {
        format!(
            "did not answer just now, and too few members answered to tell it from a cut-off probe: {e}"
        )
    })
}

fn still_down(was: &str) -> String {
    if was.starts_with("down since an earlier probe") {
        was.to_string()
    } else {
        format!("down since an earlier probe, not seen healthy since: {was}")
    }
}

/// The members one admission decision must count when the fresh probe failed or ran out of
/// time: the record's member list, every member's health unknown except those the record holds
/// confirmed unhealthy (and those not started), which stay unhealthy. Never the record's
/// health as it was: that would be an allow on an old record.
pub fn failed_view(record: &[Member]) -> Vec<Member> {
    record
        .iter()
        .map(|r| {
            let mut m = r.clone();
            m.is_leader = false;
            match (&r.health, r.effective_health_ref()) {
                (Health::Unhealthy(e), _) => m.health = Health::Unhealthy(still_down(e)),
                // Not started, or an alarm: what the record's member list says stands.
                (_, HealthRef::Unhealthy(_)) => {}
                _ => {
                    m.health = Health::Unknown;
                    // A NOSPACE alarm is etcd's replicated state and space is not freed by
                    // itself: it stands until a probe sees it disarmed (it makes no member
                    // unhealthy, so it is kept here rather than above).
                    m.alarms.retain(|a| *a == Alarm::NoSpace);
                }
            }
            m
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{leaderless, silent, up};

    fn kinds(v: &[Member]) -> Vec<&'static str> {
        v.iter()
            .map(|m| match &m.effective_health_ref() {
                HealthRef::Healthy => "up",
                HealthRef::Unhealthy(_) => "down",
                HealthRef::Unknown(_) => "unknown",
            })
            .collect()
    }

    #[test]
    fn a_silent_member_among_answering_ones_is_down_at_once() {
        let v = fresh_view(vec![up(1, true), up(2, false), silent(3)], &[]);
        assert_eq!(kinds(&v), ["up", "up", "down"]);
        match &v[2].health {
            Health::Unhealthy(e) => assert!(e.starts_with("did not answer just now"), "{e}"),
            h => panic!("{h:?}"),
        }
    }

    #[test]
    fn a_frozen_leader_is_down_and_the_followers_wait_for_their_election() {
        // The followers answer their status (still naming the frozen leader) but cannot serve
        // a read: an election is coming. The silent one is down: a majority answered.
        let v = fresh_view(vec![silent(1), leaderless(2), leaderless(3)], &[]);
        assert_eq!(kinds(&v), ["down", "unknown", "unknown"]);
    }

    #[test]
    fn without_a_majority_answering_the_silent_are_unknown() {
        let v = fresh_view(vec![leaderless(1), silent(2), silent(3)], &[]);
        assert_eq!(kinds(&v), ["unknown", "unknown", "unknown"]);
    }

    #[test]
    fn an_answering_unhealthy_member_with_a_leader_is_down() {
        let mut sick = up(3, false);
        sick.health = Health::Unhealthy("etcdserver: request timed out".into());
        let v = fresh_view(vec![up(1, true), up(2, false), sick], &[]);
        assert_eq!(kinds(&v), ["up", "up", "down"]);
    }

    #[test]
    fn confirmed_down_stays_down_until_seen_healthy() {
        let mut was = up(1, false);
        was.health = Health::Unhealthy("no answer within 2s".into());
        let record = vec![was, up(2, true), up(3, false)];
        // An election: nobody is healthy, member 1 answers now but the record had it down.
        let v = fresh_view(vec![leaderless(1), leaderless(2), silent(3)], &record);
        assert_eq!(kinds(&v), ["down", "unknown", "down"]);
        // Too few answers: still down, the others unknown.
        let v = fresh_view(vec![silent(1), silent(2), leaderless(3)], &record);
        assert_eq!(kinds(&v), ["down", "unknown", "unknown"]);
        // Seen healthy: healthy.
        let v = fresh_view(vec![up(1, false), up(2, true), up(3, false)], &record);
        assert_eq!(kinds(&v), ["up", "up", "up"]);
        // A failed probe keeps it down and forgets the rest's health.
        assert_eq!(kinds(&failed_view(&record)), ["down", "unknown", "unknown"]);
    }

    #[test]
    fn the_member_list_is_the_fresh_one() {
        let record = vec![up(1, true), up(2, false), up(3, false)];
        let mut added = Member::new(4, "");
        added.health = Health::Unhealthy("member added but not started".into());
        let v = fresh_view(vec![up(1, true), up(2, false), added], &record);
        assert_eq!(v.len(), 3);
        assert_eq!(kinds(&v), ["up", "up", "down"]);
    }

    #[test]
    fn learners_do_not_count_towards_the_majority() {
        let mut l = silent(4);
        l.is_learner = true;
        // 3 voting, 1 answers: no majority, though 2 of 4 members are silent.
        let v = fresh_view(vec![up(1, false), silent(2), silent(3), l], &[]);
        assert_eq!(kinds(&v), ["up", "unknown", "unknown", "unknown"]);
    }
}
