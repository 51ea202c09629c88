//! Deletions and scale-ups allowed but not yet visible in the cache.
//!
//! Between "allowed" and the Machine's deletionTimestamp reaching our watch there is a window in
//! which a second review would not see the first deletion. Two concurrent deletions of healthy
//! Machines of a healthy 3-member cluster would then both pass. A reservation closes the window:
//! the next review is judged as if the first deletion had happened.
//!
//! A scale-up is reserved the same way: a deletion judged right after an allowed 4 -> 5 must
//! count the fifth member that is about to join (it votes before it is healthy), or with one
//! member down both pass and the join leaves 2 healthy of 4 voting members. The reservation ends
//! when the cache shows that many replicas, or shows a later allowed change to fewer
//! ([`ReplicaReservation`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use quorumguard_engine::{ControlPlane, Machine};
use quorumguard_observe::state::{ClusterState, Key};

struct Reserved {
    machine: Machine,
    until: Instant,
    /// Whether the cache held the Machine when it was reserved; if it did and now does not, the
    /// deletion has completed.
    seen_in_cache: bool,
}

/// A KCP's spec.replicas as reviews count it while the cache may not show an allowed change
/// yet. Pure, so that the model check (tests/model) keeps the same reservations.
///
/// An allowed scale-up to `to` is reserved: a deletion reviewed next counts the members about to
/// join, until the cache shows `to` or more. A later allowed change to fewer replicas than
/// reserved (a scale-down, or a smaller scale-up after one) does not lower the reservation at
/// once: the API server may still refuse that change after the webhook allowed it (another
/// webhook, a conflict), and spec.replicas would stay at `to`. It ends the reservation once the
/// cache shows its value: the cache shows that change then, or a later one. Before this rule a
/// scale-up's reservation outlived a scale-down the cache showed (3 -> 5, then 5 -> 1 before the
/// cache saw 5: KCP's scale-down deletions were judged against 5, `PendingJoin`, until
/// `--reservation-ttl`).
///
/// One order is left to the TTL's side of safety: the later change returns to the value the
/// cache still shows from before the scale-up (3 -> 5 -> 3 while the cache shows 3). The
/// reservation ends at once then, as if the cache showed the change; if the API server refuses
/// it after the allow, reviews count 3 replicas until the cache shows 5 (one watch event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplicaReservation {
    /// The largest spec.replicas allowed since the reservation began.
    pub to: u32,
    /// The value of the latest allowed change, when it is fewer than `to`.
    pub then: Option<u32>,
}

impl ReplicaReservation {
    /// The reservation after an allowed change of spec.replicas from `from` to `to` (`from !=
    /// to`), given the one held before (`None`: none). A scale-up reserves; a change to fewer
    /// replicas than reserved is recorded as the reservation's end; a scale-down with nothing
    /// reserved above it reserves nothing.
    pub fn after(held: Option<Self>, from: u32, to: u32) -> Option<Self> {
        match held {
            Some(r) if to < r.to => Some(ReplicaReservation {
                to: r.to,
                then: Some(to),
            }),
            _ if to > from => Some(ReplicaReservation { to, then: None }),
            held => held,
        }
    }

    /// The spec.replicas reviews count while the cache shows `cached`, or `None` when the cache
    /// shows what was reserved (`to` or more) or the latest change (`then`): the reservation
    /// ends.
    pub fn holds(&self, cached: u32) -> Option<u32> {
        (cached < self.to && self.then != Some(cached)).then_some(self.to)
    }
}

/// Reservations per KCP.
pub struct Reservations {
    ttl: Duration,
    by_kcp: HashMap<Key, Vec<Reserved>>,
    /// KCP -> the reserved spec.replicas, until when.
    replicas: HashMap<Key, (ReplicaReservation, Instant)>,
}

impl Reservations {
    /// `ttl` bounds how long a reservation outlives a deletion the cache never shows (a request
    /// the API server rejected after we allowed it, for instance).
    pub fn new(ttl: Duration) -> Self {
        Reservations {
            ttl,
            by_kcp: HashMap::new(),
            replicas: HashMap::new(),
        }
    }

    /// Drops what the cache now shows or what has expired, and marks the remaining reserved
    /// Machines of `kcp` as deleting in `cp`.
    pub fn apply(&mut self, kcp: &Key, cp: &mut ControlPlane, now: Instant, state: &ClusterState) {
        if let Some(&(r, until)) = self.replicas.get(kcp) {
            let cached = state.kcp_replicas(&kcp.0, &kcp.1).unwrap_or(0);
            match r.holds(cached).filter(|_| until > now) {
                Some(to) => cp.kcp.replicas = cp.kcp.replicas.max(to),
                None => {
                    self.replicas.remove(kcp);
                }
            }
        }
        let Some(list) = self.by_kcp.get_mut(kcp) else {
            return;
        };
        list.retain(|r| {
            if r.until <= now {
                return false;
            }
            match state.machine_deleting(&kcp.0, &r.machine.name) {
                Some(true) => false,
                Some(false) => true,
                None => !r.seen_in_cache,
            }
        });
        // A Machine the cache does not hold (not there yet, or named only in a forged review)
        // matters only through its etcd member: keep it when that member exists and no cached
        // Machine, nor an earlier such reservation, owns it. So a control plane holds at most
        // one reservation per cached Machine plus one per member no Machine owns, however many
        // reviews name Machines that do not exist.
        let mut claimed = HashSet::new();
        list.retain(|r| {
            if cp.machine(&r.machine.name).is_some() {
                return true;
            }
            match cp.member_of(&r.machine) {
                Some(member) => cp.machine_of(member).is_none() && claimed.insert(member.id),
                None => false,
            }
        });
        for r in list.iter() {
            match cp.machines.iter_mut().find(|m| m.name == r.machine.name) {
                Some(m) => m.deleting = true,
                None => {
                    let mut m = r.machine.clone();
                    m.deleting = true;
                    cp.machines.push(m);
                }
            }
        }
        if list.is_empty() {
            self.by_kcp.remove(kcp);
        }
    }

    /// Records an allowed deletion of `machine` of `kcp`.
    pub fn reserve(&mut self, kcp: Key, machine: Machine, now: Instant, state: &ClusterState) {
        let seen_in_cache = state.machine_deleting(&kcp.0, &machine.name).is_some();
        let list = self.by_kcp.entry(kcp).or_default();
        list.retain(|r| r.machine.name != machine.name);
        list.push(Reserved {
            machine,
            until: now + self.ttl,
            seen_in_cache,
        });
    }

    /// Records an allowed change of `kcp`'s spec.replicas from `from` to `to`
    /// ([`ReplicaReservation::after`]): until the cache shows what it reserves, reviews of its
    /// Machines are judged with the larger of the reserved value and the cached one. A scale-up
    /// starts the TTL afresh; a change to fewer replicas only ends the reservation sooner.
    pub fn reserve_replicas(&mut self, kcp: Key, from: u32, to: u32, now: Instant) {
        let held = self.replicas.get(&kcp).copied();
        let Some(r) = ReplicaReservation::after(held.map(|(r, _)| r), from, to) else {
            return;
        };
        let until = match held {
            Some((_, until)) if to < from => until,
            _ => now + self.ttl,
        };
        self.replicas.insert(kcp, (r, until));
    }

    /// How many reservations are held, for metrics and tests.
    pub fn len(&self) -> usize {
        self.by_kcp.values().map(Vec::len).sum::<usize>() + self.replicas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::ReplicaReservation as R;

    /// The reservation after each allowed change of a sequence, from none.
    fn after(changes: &[(u32, u32)]) -> Option<R> {
        changes
            .iter()
            .fold(None, |held, &(from, to)| R::after(held, from, to))
    }

    #[test]
    fn a_scale_down_ends_the_scale_ups_reservation_when_the_cache_shows_it() {
        let r = after(&[(3, 5), (5, 1)]).expect("reserved");
        // The cache still shows 3: the scale-down may yet be refused after the allow.
        assert_eq!(r.holds(3), Some(5));
        // It shows the scale-down, or the scale-up: the reservation ends.
        assert_eq!(r.holds(1), None);
        assert_eq!(r.holds(5), None);
    }

    #[test]
    fn a_scale_up_alone_holds_until_the_cache_shows_it() {
        let r = after(&[(3, 5)]).expect("reserved");
        assert_eq!(
            (r.holds(3), r.holds(4), r.holds(5)),
            (Some(5), Some(5), None)
        );
        // A larger one raises it, and the TTL starts afresh (Reservations::reserve_replicas).
        let r = after(&[(3, 4), (4, 5)]).expect("reserved");
        assert_eq!((r.holds(4), r.holds(5)), (Some(5), None));
        // Nothing reserved, a scale-down reserves nothing.
        assert_eq!(after(&[(5, 3)]), None);
    }

    #[test]
    fn only_the_latest_smaller_change_ends_it() {
        // 3 -> 5, 5 -> 1, 1 -> 3: the cache showing the scale-down (1) is not the end any more.
        let r = after(&[(3, 5), (5, 1), (1, 3)]).expect("reserved");
        assert_eq!(r.then, Some(3));
        assert_eq!((r.holds(1), r.holds(3)), (Some(5), None));
        // Back to the value the cache shows from before the scale-up: it ends at once (the
        // order left to the TTL's side, see ReplicaReservation).
        let r = after(&[(3, 5), (5, 3)]).expect("reserved");
        assert_eq!(r.holds(3), None);
    }
}
