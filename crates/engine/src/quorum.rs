//! Quorum arithmetic: how many voting members must be healthy, and whether a change in membership
//! keeps that true whatever order it completes in and whatever the unknown members turn out to be.

use super::model::{Alarm, Health, HealthRef, Member, Unfit};

/// Votes needed for a majority of `voting` members.
pub fn quorum(voting: usize) -> usize {
    voting / 2 + 1
}

/// Healthy minus quorum: how many more members may fail before quorum is lost. Negative when
/// quorum is already lost.
pub fn tolerance(voting: usize, healthy: usize) -> i64 {
    healthy as i64 - quorum(voting) as i64
}

/// Fault tolerance as a reader should meet it: "fault tolerance N" while the healthy members
/// form a quorum, and otherwise how far they fall short, never a negative tolerance: "quorum
/// lost by N" when every member's health is known, "quorum not proven: N healthy short" when
/// some is unknown (those may be healthy).
pub fn tolerance_words(voting: usize, healthy: usize, unknown: usize) -> ToleranceWords {
    ToleranceWords {
        voting,
        healthy,
        unknown,
    }
}

/// [`tolerance_words`], written straight into the message that shows it.
#[derive(Clone, Copy, Debug)]
pub struct ToleranceWords {
    voting: usize,
    healthy: usize,
    unknown: usize,
}

impl std::fmt::Display for ToleranceWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = quorum(self.voting);
        if self.healthy >= q {
            return write!(f, "fault tolerance {}", self.healthy - q);
        }
        let short = q - self.healthy;
        if self.unknown == 0 {
            write!(f, "quorum lost by {short}")
        } else {
            write!(f, "quorum not proven: {short} healthy short")
        }
    }
}

/// Counts of voting members by health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub healthy: usize,
    pub unhealthy: usize,
    pub unknown: usize,
}

impl Tally {
    /// Tally of the voting members among `members` (learners do not vote).
    pub fn of<'a>(members: impl IntoIterator<Item = &'a Member>, stale: bool) -> Tally {
        let mut t = Tally::default();
        for m in members.into_iter().filter(|m| !m.is_learner) {
            t.count(effective_ref(m, stale));
        }
        t
    }

    pub fn add(&mut self, h: &Health) {
        self.count(HealthRef::from(h))
    }

    /// [`Tally::add`] of a borrowed health.
    pub fn count(&mut self, h: HealthRef<'_>) {
        match h {
            HealthRef::Healthy => self.healthy += 1,
            HealthRef::Unhealthy(_) => self.unhealthy += 1,
            HealthRef::Unknown(_) => self.unknown += 1,
        }
    }

    pub fn voting(&self) -> usize {
        self.healthy + self.unhealthy + self.unknown
    }

    /// Healthy members when every unknown one is counted as healthy (the best case).
    pub fn optimistic(&self) -> usize {
        self.healthy + self.unknown
    }

    /// Whether quorum holds for certain.
    pub fn has_quorum(&self) -> bool {
        self.healthy >= quorum(self.voting())
    }

    /// Whether quorum is lost for certain: even if every unknown member is healthy.
    pub fn quorum_lost(&self) -> bool {
        self.optimistic() < quorum(self.voting())
    }
}

/// Whether etcd has lost quorum for certain, as raft counts votes: fewer voting members up (or
/// of unknown health) than a quorum. A member whose only fault is a CORRUPT alarm still votes
/// (the alarm refuses its reads and writes, not raft's messages or membership changes), so it
/// counts as up here, though every removal counts it unhealthy (its data is wrong). This is
/// what `QuorumLost` and `RestoreQuorum` rest on: a snapshot restore is never advised while
/// raft has its quorum.
pub fn raft_quorum_lost(members: &[Member], stale: bool) -> bool {
    let mut voting = 0;
    let mut up = 0;
    for m in members.iter().filter(|m| !m.is_learner) {
        voting += 1;
        let counts_up = !matches!(effective_ref(m, stale), HealthRef::Unhealthy(_))
            || votes_while_unfit(m, stale);
        up += usize::from(counts_up);
    }
    up < quorum(voting)
}

/// Whether `m` is unfit only by a CORRUPT alarm while its endpoint answers: it still votes.
pub fn votes_while_unfit(m: &Member, stale: bool) -> bool {
    !m.is_learner
        && matches!(
            effective_ref(m, stale),
            HealthRef::Unhealthy(Unfit::Alarm(Alarm::Corrupt))
        )
        && !matches!(HealthRef::from(&m.health), HealthRef::Unhealthy(_))
}

/// Removing `m` alone, a member that still votes though its data is wrong (a CORRUPT alarm):
/// raft commits the removal while it has its quorum (counting `m` up, see
/// [`raft_quorum_lost`]), and the members left must be a healthy quorum. The tally counts `m`
/// unhealthy and would call this removal unsafe whenever the healthy members alone are not a
/// quorum of the members with it (1 healthy + 1 corrupt), though it is the way out.
pub fn unfit_voter_removal_safe(members: &[Member], m: &Member, stale: bool) -> bool {
    if !votes_while_unfit(m, stale) || raft_quorum_lost(members, stale) {
        return false;
    }
    let after = Tally::of(members.iter().filter(|x| x.id != m.id), stale);
    after.voting() > 0 && after.healthy >= quorum(after.voting())
}

/// A member's health as the rules read it: a stale probe proves nothing healthy, but a member
/// the record holds unhealthy stays unhealthy until a probe sees it healthy (bad news is not
/// forgotten because the record grew old).
pub fn effective(m: &Member, stale: bool) -> Health {
    effective_ref(m, stale).to_health()
}

/// [`effective`] without copying the error text (what every tally and decision reads).
pub fn effective_ref(m: &Member, stale: bool) -> HealthRef<'_> {
    match m.effective_health_ref() {
        HealthRef::Healthy if stale => HealthRef::Unknown(None),
        h => h,
    }
}

/// The answer to "is this safe?" when some health is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Safety {
    /// Safe for every value the unknown members may have.
    Safe,
    /// Unsafe even if every unknown member is healthy.
    Unsafe,
    /// Safe only if some unknown members are healthy: cannot be proven either way.
    Unknown,
}

impl Safety {
    fn from_cases(pessimistic: bool, optimistic: bool) -> Safety {
        match (pessimistic, optimistic) {
            (true, _) => Safety::Safe,
            (false, false) => Safety::Unsafe,
            (false, true) => Safety::Unknown,
        }
    }
}

/// Removing the `removed` voting members from a membership tallied `before`, in any order:
/// safe iff after every prefix of the removals (worst case: the healthy members leave first) the
/// healthy members left still form a quorum of the members left. Removing every member is never
/// safe.
pub fn removal(before: Tally, removed: Tally) -> Safety {
    let check = |healthy: usize, removed_healthy: usize| {
        let voting = before.voting();
        let n = removed.voting();
        if n >= voting {
            return false;
        }
        (1..=n).all(|k| healthy.saturating_sub(k.min(removed_healthy)) >= quorum(voting - k))
            && healthy >= quorum(voting)
    };
    Safety::from_cases(
        check(before.healthy, removed.healthy),
        check(before.optimistic(), removed.optimistic()),
    )
}

/// Adding one voting member, which counts as unhealthy until it has joined: safe iff the healthy
/// members form a quorum of the grown membership.
pub fn addition(before: Tally) -> Safety {
    let q = quorum(before.voting() + 1);
    Safety::from_cases(before.healthy >= q, before.optimistic() >= q)
}

/// Whether deleting one more member (`me`) while the `pending` members are already on their way
/// out, and a new member may join (`joining`), adds a way to lose quorum: some set of pending
/// removals, with or without the join, that completed together with `me` leaves too few healthy
/// members, where the same set without `me` would not. `me` alone must be safe too. Removals
/// (and a join) that already fail without `me` are not its risk: refusing it would not prevent
/// them, and would block the way out.
///
/// A joining member votes before it is healthy (see [`addition`]), and KCP adds one member at a
/// time, waiting for it to be healthy: at most one unhealthy newcomer counts at any moment. It
/// may come before, between or after the removals.
///
/// Unknown members are tried as healthy and as unhealthy in every combination.
pub fn added_risk<'a>(
    before: Tally,
    pending: Tally,
    me: impl Into<HealthRef<'a>>,
    joining: bool,
) -> Safety {
    let me = me.into();
    let me_unknown = matches!(me, HealthRef::Unknown(_)) as usize;
    let others_unknown = before.unknown - pending.unknown - me_unknown;
    let voting = before.voting();
    let n_pending = pending.voting();
    let joins = joining as usize;
    let (mut some_risky, mut some_safe) = (false, false);
    for pending_up in 0..=pending.unknown {
        for others_up in 0..=others_unknown {
            for me_up in 0..=me_unknown {
                let me_healthy = match me {
                    HealthRef::Healthy => 1,
                    HealthRef::Unknown(_) => me_up,
                    HealthRef::Unhealthy(_) => 0,
                };
                let healthy = before.healthy + pending_up + others_up + me_up;
                let p_healthy = pending.healthy + pending_up;
                // `n` of the members gone (`removed_healthy` of them healthy), `j` newcomers in.
                let fails = |n: usize, removed_healthy: usize, j: usize| {
                    n >= voting || healthy - removed_healthy < quorum(voting - n + j)
                };
                let risky = (0..=joins).any(|j| {
                    (0..=n_pending).any(|k| {
                        let lo = k.saturating_sub(n_pending - p_healthy);
                        (lo..=k.min(p_healthy)).any(|sh| {
                            fails(k + 1, sh + me_healthy, j)
                                && ((k == 0 && j == 0) || !fails(k, sh, j))
                        })
                    })
                });
                some_risky |= risky;
                some_safe |= !risky;
            }
        }
    }
    Safety::from_cases(!some_risky, some_safe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(healthy: usize, unhealthy: usize, unknown: usize) -> Tally {
        Tally {
            healthy,
            unhealthy,
            unknown,
        }
    }

    #[test]
    fn a_stale_record_hides_health_but_not_a_member_known_down() {
        let mut up = Member::new(1, "a");
        up.health = Health::Healthy;
        let mut down = Member::new(2, "b");
        down.health = Health::Unhealthy("no answer within 2s".into());
        assert_eq!(effective(&up, true), Health::Unknown);
        assert_eq!(effective(&up, false), Health::Healthy);
        assert!(matches!(effective(&down, true), Health::Unhealthy(_)));
        assert_eq!(Tally::of([&up, &down], true), t(0, 1, 1));
    }

    #[test]
    fn quorum_table() {
        // Worked by hand: V/2+1.
        let expected = [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)];
        for (v, q) in expected {
            assert_eq!(quorum(v), q, "quorum({v})");
        }
        assert_eq!(tolerance(3, 3), 1);
        assert_eq!(tolerance(3, 2), 0);
        assert_eq!(tolerance(3, 1), -1);
        assert_eq!(tolerance(5, 5), 2);
        // Never a negative tolerance in words.
        assert_eq!(tolerance_words(3, 3, 0).to_string(), "fault tolerance 1");
        assert_eq!(tolerance_words(3, 2, 0).to_string(), "fault tolerance 0");
        assert_eq!(tolerance_words(3, 1, 0).to_string(), "quorum lost by 1");
        assert_eq!(tolerance_words(3, 0, 0).to_string(), "quorum lost by 2");
        assert_eq!(
            tolerance_words(3, 1, 2).to_string(),
            "quorum not proven: 1 healthy short"
        );
        assert_eq!(tolerance_words(0, 0, 0).to_string(), "quorum lost by 1");
    }

    #[test]
    fn removal_table() {
        // 3 healthy, remove a healthy one: 2 left of 2, quorum 2: safe.
        assert_eq!(removal(t(3, 0, 0), t(1, 0, 0)), Safety::Safe);
        // 2 healthy + 1 down, remove a healthy one: 1 healthy of 2, quorum 2: unsafe.
        assert_eq!(removal(t(2, 1, 0), t(1, 0, 0)), Safety::Unsafe);
        // 2 healthy + 1 down, remove the down one: 2 of 2: safe.
        assert_eq!(removal(t(2, 1, 0), t(0, 1, 0)), Safety::Safe);
        // 5 healthy, remove two healthy: 3 of 3, quorum 2: safe.
        assert_eq!(removal(t(5, 0, 0), t(2, 0, 0)), Safety::Safe);
        // 4 healthy + 1 down, remove the down one and a healthy one, worst order healthy first:
        // 3 healthy of 4 (quorum 3) then 3 of 3: safe.
        assert_eq!(removal(t(4, 1, 0), t(1, 1, 0)), Safety::Safe);
        // 3 healthy + 2 down, remove one down and one healthy: healthy first leaves 2 of 4
        // (quorum 3): unsafe, although the final 2 of 3 would be fine.
        assert_eq!(removal(t(3, 2, 0), t(1, 1, 0)), Safety::Unsafe);
        // Removing the last member is never safe.
        assert_eq!(removal(t(1, 0, 0), t(1, 0, 0)), Safety::Unsafe);
        // 2 healthy + 1 unknown, remove a healthy one: safe only if the unknown one is healthy.
        assert_eq!(removal(t(2, 0, 1), t(1, 0, 0)), Safety::Unknown);
        // Removing the unknown one itself: 2 healthy of 2: safe whatever it was.
        assert_eq!(removal(t(2, 0, 1), t(0, 0, 1)), Safety::Safe);
        // Quorum already lost: nothing is safe.
        assert_eq!(removal(t(1, 2, 0), t(0, 1, 0)), Safety::Unsafe);
    }

    #[test]
    fn addition_table() {
        // 3 healthy + 1 new: quorum 3 of 4 with 3 healthy: safe.
        assert_eq!(addition(t(3, 0, 0)), Safety::Safe);
        // 2 healthy + 1 down + 1 new: quorum 3 with 2 healthy: outage.
        assert_eq!(addition(t(2, 1, 0)), Safety::Unsafe);
        // 1 member + 1 new: quorum 2 with 1 healthy: unsafe (the caller makes the exception).
        assert_eq!(addition(t(1, 0, 0)), Safety::Unsafe);
        assert_eq!(addition(t(2, 0, 1)), Safety::Unknown);
        assert_eq!(addition(t(5, 0, 0)), Safety::Safe);
    }

    #[test]
    fn added_risk_table() {
        let up = Health::Healthy;
        let dn = Health::Unhealthy("x".into());
        // 3 healthy, one pending: a second healthy removal leaves 1 of 1: no new risk.
        assert_eq!(added_risk(t(3, 0, 0), t(1, 0, 0), &up, false), Safety::Safe);
        // 4 members, 1 down, one healthy pending: both healthy gone leaves 1 of 2: new risk.
        assert_eq!(
            added_risk(t(3, 1, 0), t(1, 0, 0), &up, false),
            Safety::Unsafe
        );
        // 3 members, 1 down, one healthy pending (already unsafe alone): removing the down one
        // adds nothing that was not already there.
        assert_eq!(added_risk(t(2, 1, 0), t(1, 0, 0), &dn, false), Safety::Safe);
        // ...but removing the other healthy one does.
        assert_eq!(
            added_risk(t(2, 1, 0), t(1, 0, 0), &up, false),
            Safety::Unsafe
        );
        // 2 healthy + 1 unknown, nothing pending, remove a healthy one: depends on the unknown.
        assert_eq!(
            added_risk(t(2, 0, 1), t(0, 0, 0), &up, false),
            Safety::Unknown
        );
        // The scale-up-then-delete race: 4 members, 1 down, a fifth joining. Removing a healthy
        // one is safe alone (2 of 3), but with the newcomer in before it is healthy: 2 of 4.
        assert_eq!(added_risk(t(3, 1, 0), t(0, 0, 0), &up, false), Safety::Safe);
        assert_eq!(
            added_risk(t(3, 1, 0), t(0, 0, 0), &up, true),
            Safety::Unsafe
        );
        // Removing the down one with a newcomer on its way: 3 of 4.
        assert_eq!(added_risk(t(3, 1, 0), t(0, 0, 0), &dn, true), Safety::Safe);
        // 3 healthy, a replacement joining after this deletion (KCP's delete-first rollout):
        // 2 healthy of 3 at worst.
        assert_eq!(added_risk(t(3, 0, 0), t(0, 0, 0), &up, true), Safety::Safe);
        // A join that is unsafe on its own (2 of 3 healthy, a fourth voting) is not this
        // removal's risk... but removing the down member alongside is still fine, and a healthy
        // one still is not.
        assert_eq!(added_risk(t(2, 1, 0), t(0, 0, 0), &dn, true), Safety::Safe);
        assert_eq!(
            added_risk(t(2, 1, 0), t(0, 0, 0), &up, true),
            Safety::Unsafe
        );
    }
}
