//! Deletions and scale-ups allowed but not yet visible in the cache.
//!
//! Between "allowed" and the Machine's deletionTimestamp reaching our watch there is a window in
//! which a second review would not see the first deletion. Two concurrent deletions of healthy
//! Machines of a healthy 3-member cluster would then both pass. A reservation closes the window:
//! the next review is judged as if the first deletion had happened.
//!
//! A scale-up is reserved the same way: a deletion judged right after an allowed 4 -> 5 must
//! count the fifth member that is about to join (it votes before it is healthy), or with one
//! member down both pass and the join leaves 2 healthy of 4 voting members.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::engine::{ControlPlane, Machine};
use crate::state::{ClusterState, Key};

struct Reserved {
    machine: Machine,
    until: Instant,
    /// Whether the cache held the Machine when it was reserved; if it did and now does not, the
    /// deletion has completed.
    seen_in_cache: bool,
}

/// Reservations per KCP.
pub struct Reservations {
    ttl: Duration,
    by_kcp: HashMap<Key, Vec<Reserved>>,
    /// KCP -> the largest spec.replicas allowed and not yet in the cache, until when.
    replicas: HashMap<Key, (u32, Instant)>,
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
        if let Some(&(to, until)) = self.replicas.get(kcp) {
            let cached = state.kcp_replicas(&kcp.0, &kcp.1).unwrap_or(0);
            if until <= now || cached >= to {
                self.replicas.remove(kcp);
            } else {
                cp.kcp.replicas = cp.kcp.replicas.max(to);
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

    /// Records an allowed change of `kcp`'s spec.replicas to `to`: until the cache shows at
    /// least `to`, reviews of its Machines are judged with it (the larger of the reserved
    /// values and the cached one, never a smaller one).
    pub fn reserve_replicas(&mut self, kcp: Key, to: u32, now: Instant) {
        let until = now + self.ttl;
        let entry = self.replicas.entry(kcp).or_insert((to, until));
        if to >= entry.0 {
            *entry = (to, until);
        }
    }

    /// How many reservations are held, for metrics and tests.
    pub fn len(&self) -> usize {
        self.by_kcp.values().map(Vec::len).sum::<usize>() + self.replicas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
