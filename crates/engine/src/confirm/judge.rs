//! The judgement of one probe: whether its member list is believed, whether the cluster is in
//! a leader election or has lost its quorum, and, member by member, which finding for the worse
//! is believed.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Belief, CONFIRMED_UNHEALTHY, Confirmation, Judged};
use crate::model::{Health, Member, MemberId};

/// Where a probe finds the cluster's leadership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Election {
    /// A member reports itself a healthy leader, or no voting member answered.
    None,
    /// Members answered and none reports a healthy leader, for less than
    /// [`Confirmation::window`]: the election decides.
    InProgress,
    /// No healthy leader for the whole window: quorum is lost.
    Lost,
}

impl Belief {
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
        if let Some(since) = self.list_awaiting(&ids, at, et) {
            let members = match (record, &self.ids) {
                (Some(r), Some(believed)) => Some(self.both_lists(probe, r, believed, et)),
                _ => None,
            };
            self.new_ids = Some((ids, since));
            return Judged {
                members,
                recheck_in: Some(et),
            };
        }
        self.new_ids = None;
        self.unhealthy.retain(|id| ids.contains(id));
        self.suspects.retain(|id, _| ids.contains(id));
        self.ids = Some(ids);

        let election = self.election(&probe, at, c);
        let mut pending = false;
        for m in &mut probe {
            pending |= self.judge_member(m, election, at, c);
        }
        Judged {
            members: Some(probe),
            recheck_in: pending.then_some(et),
        }
    }

    /// When the probe lists other members (`ids`) than believed and has not done so for one
    /// election timeout `et`: since when it has, the change awaiting confirmation. `None`: the
    /// list is believed.
    fn list_awaiting(
        &self,
        ids: &BTreeSet<MemberId>,
        at: Duration,
        et: Duration,
    ) -> Option<Duration> {
        match &self.ids {
            Some(believed) if believed != ids => {
                let since = match &self.new_ids {
                    Some((seen, since)) if seen == ids => *since,
                    _ => at,
                };
                (at.saturating_sub(since) < et).then_some(since)
            }
            _ => None,
        }
    }

    /// Whether the probe at `at` shows a leader election, and for how long there has been one.
    fn election(&mut self, probe: &[Member], at: Duration, c: &Confirmation) -> Election {
        let led = probe
            .iter()
            .any(|m| m.is_leader && m.health == Health::Healthy);
        let electing = !led && probe.iter().any(|m| !m.is_learner && answered(m));
        if !electing {
            self.leaderless_since = None;
            return Election::None;
        }
        let since = *self.leaderless_since.get_or_insert(at);
        if at.saturating_sub(since) < c.window() {
            Election::InProgress
        } else {
            Election::Lost
        }
    }

    /// Judges member `m` of the probe at `at`, updating the belief and, for a finding for the
    /// worse not yet believed, its health. Returns whether it awaits a confirming probe.
    fn judge_member(
        &mut self,
        m: &mut Member,
        election: Election,
        at: Duration,
        c: &Confirmation,
    ) -> bool {
        let et = c.election_timeout;
        let error = match &m.health {
            Health::Unhealthy(e) => e.clone(),
            Health::Healthy => {
                self.unhealthy.remove(&m.id);
                self.suspects.remove(&m.id);
                return false;
            }
            Health::Unknown | Health::Unconfirmed(_) => {
                self.suspects.remove(&m.id);
                if self.unhealthy.contains(&m.id) {
                    m.health = Health::Unhealthy(CONFIRMED_UNHEALTHY.into());
                }
                return false;
            }
        };
        if self.unhealthy.contains(&m.id) {
            // Confirmed down: it stays down until a probe sees it healthy, whatever an
            // election makes of the others.
            return false;
        }
        // A learner that answers is in the same election as the voters: it has no leader
        // to follow either.
        if election == Election::InProgress && answered(m) {
            // Alive, without a leader to serve its read: the election decides.
            m.health = Health::Unconfirmed(format!(
                "leader election in progress: no member reports a healthy leader (quorum loss is concluded only after {} without one); the probe saw: {error}",
                humantime::format_duration(c.window())
            ));
            return true;
        }
        if election == Election::Lost {
            // No leader for the whole window: quorum is lost, and this is what it looks
            // like.
            self.suspects.remove(&m.id);
            self.unhealthy.insert(m.id);
            return false;
        }
        let since = *self.suspects.entry(m.id).or_insert(at);
        if at.saturating_sub(since) >= et {
            self.suspects.remove(&m.id);
            self.unhealthy.insert(m.id);
            return false;
        }
        m.health = Health::Unconfirmed(format!(
            "{error} (seen by one probe: believed when a probe at least {} later sees it too)",
            humantime::format_duration(et)
        ));
        true
    }
}

/// Whether member `m` answered its status (it reports a raft term).
fn answered(m: &Member) -> bool {
    m.raft_term.is_some()
}
