//! Which of a probe's findings to believe: a change for the worse is believed only when a second
//! probe confirms it, and a cluster without a leader is an election until that lasts.
//!
//! A probe sees etcd through each member's endpoint at one moment, and some of what it sees for
//! the worse passes by itself within a second or two. A leader that goes away without handing
//! over leadership (a crash, a restart, its removal, a long pause) leaves the other members
//! without a leader until they elect a new one, about one election timeout; meanwhile no member
//! serves a linearizable read, so each of them looks unhealthy, and one probe shows "0 healthy of
//! 3: quorum lost". Advice built on that probe ("restore etcd from a snapshot", "remediate this
//! Machine") is an outage waiting for an operator to cause it. So, per cluster:
//!
//! - **A change for the better is believed at once**: a member seen healthy is healthy.
//! - **A change for the worse needs a confirming probe.** A member seen unhealthy that was not
//!   believed unhealthy before is shown as [`Health::Unconfirmed`] (the rules count it as
//!   unknown) until a probe at least one election timeout later sees it unhealthy again.
//! - **No leader is a leader election until it lasts.** When members answer their status but
//!   none reports itself a healthy leader, the members that answered are unknown ("leader
//!   election in progress") until no healthy leader has been seen for
//!   [`Confirmation::window`] (5 election timeouts: room for a first election and a split vote
//!   after it). Only then is quorum loss concluded. Members that did not answer at all follow
//!   the rule above.
//! - **A changed member list is confirmed too**: when the member IDs differ from those believed,
//!   the previous record stands until a probe an election timeout later lists the same IDs.
//!   Nothing is shown from the first list: a member that seems gone is what `DeleteMachine`
//!   and `RemediateMachine` advice is built on.
//! - Alarms (NOSPACE, CORRUPT) are etcd's replicated state, raised until someone disarms them:
//!   they are taken as the probe reports them.
//!
//! Everything the guard says and decides reads the record this makes: the webhook (an
//! unconfirmed member is unknown health, and the `HealthUnknown` policy applies), the published
//! conditions and the next action. The adapter (the guard's `etcd::sweep`) probes again after
//! [`Judged::recheck_in`], so a confirmation costs about one election timeout plus one probe.
//!
//! Pure: time is passed in as `at`, a monotonic instant measured from any fixed origin.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::model::{Health, Member, MemberId};

/// How much confirming a change costs, from etcd's election timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Confirmation {
    /// etcd's `--election-timeout` (its default is 1 s): how long a follower waits for the
    /// leader before it campaigns, so about how long an election takes; also the least time
    /// between a surprising probe and the one that confirms it. Zero turns confirmation off:
    /// every probe is believed as it is (how quorumguard behaved before it confirmed).
    pub election_timeout: Duration,
}

impl Default for Confirmation {
    fn default() -> Self {
        Confirmation {
            election_timeout: Duration::from_secs(1),
        }
    }
}

impl Confirmation {
    /// How many election timeouts without a healthy leader make a lost quorum.
    pub const WINDOW_ELECTIONS: u32 = 5;

    /// How long no member may report a healthy leader before quorum loss is concluded.
    pub fn window(&self) -> Duration {
        self.election_timeout * Self::WINDOW_ELECTIONS
    }

    /// Probes of one cluster that confirming can take at most, the first one included: one per
    /// election timeout through the window, and one to confirm what it ended with.
    pub fn max_probes(&self) -> usize {
        Self::WINDOW_ELECTIONS as usize + 2
    }

    fn enabled(&self) -> bool {
        !self.election_timeout.is_zero()
    }
}

/// What one cluster's probes have established so far. Empty before the first probe.
///
/// `Hash`, and [`Belief::rebase`], let a model checker keep beliefs in the states it explores
/// (tests/slow/model.rs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Belief {
    /// The member IDs of the record (`None` before the first probe).
    ids: Option<BTreeSet<MemberId>>,
    /// A member list that differs from `ids`, and when it was first seen.
    new_ids: Option<(BTreeSet<MemberId>, Duration)>,
    /// Members believed unhealthy (confirmed).
    unhealthy: BTreeSet<MemberId>,
    /// Members seen unhealthy but not confirmed yet, and since when.
    suspects: BTreeMap<MemberId, Duration>,
    /// Since when no member has reported itself a healthy leader while others answered.
    leaderless_since: Option<Duration>,
}

/// What to record of one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judged {
    /// The probe's members, each finding for the worse not yet confirmed shown as
    /// [`Health::Unconfirmed`]; `None`: keep the previous record (the member list changed, and
    /// the change awaits confirmation).
    pub members: Option<Vec<Member>>,
    /// When to probe again to confirm what is pending; `None` when nothing is.
    pub recheck_in: Option<Duration>,
}

impl Belief {
    /// Moves every time this belief holds `by` earlier, stopping at zero: judging the result at
    /// `at` is judging this belief at `at + by`, except that whatever was older than `at` then
    /// counts as exactly `at` old. Once `at` is at least [`Confirmation::window`], no judgement
    /// tells those apart, so a caller can judge every probe at the same `at`, rebasing by the
    /// time between probes first, and keep a belief whose times stay bounded.
    pub fn rebase(&mut self, by: Duration) {
        let back = |t: &mut Duration| *t = t.saturating_sub(by);
        if let Some((_, since)) = &mut self.new_ids {
            back(since);
        }
        self.suspects.values_mut().for_each(back);
        if let Some(since) = &mut self.leaderless_since {
            back(since);
        }
    }

    /// Judges a successful probe taken at `at` against what earlier probes established, and
    /// updates the belief. Without the record the earlier probes left, a changed member list is
    /// not recorded until confirmed ([`Judged::members`] `None`); [`Belief::judge_against`]
    /// records it at once, as far as it is believed.
    pub fn judge(&mut self, probe: Vec<Member>, at: Duration, c: &Confirmation) -> Judged {
        self.judge_against(probe, None, at, c)
    }

    /// Whether a probe has confirmed member `id` unhealthy (it stays so until a probe sees it
    /// healthy).
    pub fn is_confirmed_unhealthy(&self, id: MemberId) -> bool {
        self.unhealthy.contains(&id)
    }

    /// [`Belief::judge`], given `record`, the members recorded from the earlier probes. When the
    /// member list changed and the change awaits confirmation, the record becomes both lists
    /// together: a member missing from the newest list is kept but never counted healthy
    /// ([`Health::Unconfirmed`]: its removal awaits confirmation), and a member new in it
    /// counts as it is listed (a voting member, or a learner) and not healthy until confirmed.
    /// Counting one more voting member that is not healthy never makes an unsafe operation look
    /// safe (it raises the quorum, not the healthy count), and no member that seems gone is
    /// shown gone before a second probe lists it so.
    pub fn judge_against(
        &mut self,
        mut probe: Vec<Member>,
        record: Option<&[Member]>,
        at: Duration,
        c: &Confirmation,
    ) -> Judged {
        if !c.enabled() {
            *self = Belief::default();
            return Judged {
                members: Some(probe),
                recheck_in: None,
            };
        }
        let et = c.election_timeout;
        let ids: BTreeSet<MemberId> = probe.iter().map(|m| m.id).collect();
        match &self.ids {
            Some(believed) if *believed != ids => {
                let since = match &self.new_ids {
                    Some((seen, since)) if *seen == ids => *since,
                    _ => at,
                };
                if at.saturating_sub(since) < et {
                    let members = record.map(|r| self.both_lists(probe, r, believed, et));
                    self.new_ids = Some((ids, since));
                    return Judged {
                        members,
                        recheck_in: Some(et),
                    };
                }
            }
            _ => {}
        }
        self.new_ids = None;
        self.unhealthy.retain(|id| ids.contains(id));
        self.suspects.retain(|id, _| ids.contains(id));
        self.ids = Some(ids);

        let answered = |m: &Member| m.raft_term.is_some();
        let led = probe
            .iter()
            .any(|m| m.is_leader && m.health == Health::Healthy);
        let electing = !led && probe.iter().any(|m| !m.is_learner && answered(m));
        let electing_unconfirmed = if electing {
            let since = *self.leaderless_since.get_or_insert(at);
            at.saturating_sub(since) < c.window()
        } else {
            self.leaderless_since = None;
            false
        };

        let mut pending = false;
        for m in &mut probe {
            let error = match &m.health {
                Health::Unhealthy(e) => e.clone(),
                Health::Healthy => {
                    self.unhealthy.remove(&m.id);
                    self.suspects.remove(&m.id);
                    continue;
                }
                Health::Unknown | Health::Unconfirmed(_) => {
                    self.suspects.remove(&m.id);
                    if self.unhealthy.contains(&m.id) {
                        m.health = Health::Unhealthy(
                            "confirmed unhealthy by an earlier probe, not seen healthy since"
                                .into(),
                        );
                    }
                    continue;
                }
            };
            if self.unhealthy.contains(&m.id) {
                // Confirmed down: it stays down until a probe sees it healthy, whatever an
                // election makes of the others.
                continue;
            }
            // A learner that answers is in the same election as the voters: it has no leader
            // to follow either.
            if electing_unconfirmed && answered(m) {
                // Alive, without a leader to serve its read: the election decides.
                m.health = Health::Unconfirmed(format!(
                    "leader election in progress: no member reports a healthy leader (quorum loss is concluded only after {} without one); the probe saw: {error}",
                    humantime::format_duration(c.window())
                ));
                pending = true;
                continue;
            }
            if electing && !electing_unconfirmed {
                // No leader for the whole window: quorum is lost, and this is what it looks
                // like.
                self.suspects.remove(&m.id);
                self.unhealthy.insert(m.id);
                continue;
            }
            let since = *self.suspects.entry(m.id).or_insert(at);
            if at.saturating_sub(since) >= et {
                self.suspects.remove(&m.id);
                self.unhealthy.insert(m.id);
                continue;
            }
            m.health = Health::Unconfirmed(format!(
                "{error} (seen by one probe: believed when a probe at least {} later sees it too)",
                humantime::format_duration(et)
            ));
            pending = true;
        }
        Judged {
            members: Some(probe),
            recheck_in: pending.then_some(et),
        }
    }
}

impl Belief {
    /// The record while a changed member list awaits confirmation: `probe`'s members, each new
    /// one not healthy, each one that stays judged as usual without updating the belief, and
    /// the members of `record` that `probe` no longer lists, never healthy.
    fn both_lists(
        &self,
        probe: Vec<Member>,
        record: &[Member],
        believed: &BTreeSet<MemberId>,
        et: Duration,
    ) -> Vec<Member> {
        let et = humantime::format_duration(et);
        let listed: BTreeSet<MemberId> = probe.iter().map(|m| m.id).collect();
        let mut out: Vec<Member> = probe
            .into_iter()
            .map(|mut m| {
                let why = match &m.health {
                    _ if !believed.contains(&m.id) => Some(format!(
                        "new in etcd's member list: not counted healthy until a probe at least {et} later lists it too"
                    )),
                    Health::Healthy => None,
                    Health::Unhealthy(_) | Health::Unknown | Health::Unconfirmed(_)
                        if self.unhealthy.contains(&m.id) =>
                    {
                        m.health = Health::Unhealthy(
                            "confirmed unhealthy by an earlier probe, not seen healthy since"
                                .into(),
                        );
                        None
                    }
                    Health::Unhealthy(e) => Some(format!(
                        "{e} (seen by one probe: believed when a probe at least {et} later sees it too)"
                    )),
                    Health::Unknown | Health::Unconfirmed(_) => None,
                };
                if let Some(why) = why {
                    m.health = Health::Unconfirmed(why);
                }
                m
            })
            .collect();
        // A missing member is unknown, never unhealthy, whatever the record held: counted
        // unhealthy it would raise the quorum of both lists together past what either list
        // has, and the record would claim a quorum loss that neither list shows (a removed
        // member known down, and a new member not started yet). A missing member that never
        // started counts unhealthy by its empty name alone, so it is left out: it held no
        // data and matches no Machine.
        let missing = |r: &&Member| !listed.contains(&r.id) && !r.is_unstarted();
        out.extend(record.iter().filter(missing).map(|r| {
            let mut m = r.clone();
            m.is_leader = false;
            m.health = Health::Unconfirmed(format!(
                "missing from etcd's latest member list: its removal is believed when a probe at least {et} later lists the same members"
            ));
            m
        }));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn a_learner_that_joined_just_before_an_election_is_not_confirmed_down_by_it_nor_once_promoted()
    {
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
}
