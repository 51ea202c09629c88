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
//!
//! Its rooms: this module holds the types and the belief's bookkeeping, `judge` the judgement
//! of one probe (member by member, and the leader election), `lists` the record while a
//! changed member list awaits confirmation, `tests` the tests.
//!
//! [`Health::Unconfirmed`]: crate::model::Health::Unconfirmed

mod judge;
mod lists;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::model::{Member, MemberId};

/// The health of a member a probe confirmed unhealthy, and that no probe has seen healthy since.
const CONFIRMED_UNHEALTHY: &str = "confirmed unhealthy by an earlier probe, not seen healthy since";

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
    ///
    /// [`Health::Unconfirmed`]: crate::model::Health::Unconfirmed
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
}
