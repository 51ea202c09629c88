//! The exhaustive search's state space and its oracle: the classes of members and Machines it
//! enumerates, the control plane built from them, and removal subsets checked directly
//! instead of reasoning about worst orders.

use std::collections::BTreeMap;

use crate::quorum::quorum;
use crate::testkit::*;
use crate::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum H {
    Up,
    Down,
    Unknown,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Owner {
    /// A Machine that is not being deleted.
    Active,
    /// A Machine with a deletionTimestamp.
    Deleting,
    /// No Machine at all.
    Orphan,
}

pub(super) const HEALTHS: [H; 3] = [H::Up, H::Down, H::Unknown];
pub(super) const OWNERS: [Owner; 3] = [Owner::Active, Owner::Deleting, Owner::Orphan];

/// Extra Machines that have no member.
#[derive(Clone, Copy, Debug)]
pub(super) enum Extra {
    None,
    /// Has a node, its member is gone (cluster-api #2651), created long ago.
    NodeNoMember,
    /// No node yet, created long ago.
    NeverJoined,
}

/// All multisets of `size` items over `classes` classes, as count vectors.
pub(super) fn multisets(classes: usize, size: usize) -> Vec<Vec<usize>> {
    fn go(i: usize, left: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if i + 1 == cur.len() {
            cur[i] = left;
            out.push(cur.clone());
            return;
        }
        for n in 0..=left {
            cur[i] = n;
            go(i + 1, left - n, cur, out);
        }
    }
    let mut out = Vec::new();
    go(0, size, &mut vec![0; classes], &mut out);
    out
}

/// Every set of `size` voting members up to order: the multisets over the (health, owner)
/// classes, each as its members.
pub(super) fn voting_sets(size: usize) -> Vec<Vec<V>> {
    let classes: Vec<(H, Owner)> = HEALTHS
        .iter()
        .flat_map(|h| OWNERS.iter().map(move |o| (*h, *o)))
        .collect();
    multisets(classes.len(), size)
        .into_iter()
        .map(|counts| {
            counts
                .iter()
                .zip(&classes)
                .flat_map(|(k, &(h, owner))| std::iter::repeat_n(V { h, owner }, *k))
                .collect()
        })
        .collect()
}

/// A voting member of the enumerated state, as the oracle sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct V {
    pub(super) h: H,
    pub(super) owner: Owner,
}

pub(super) fn build(
    voting: &[V],
    learners: &[Owner],
    extra: Extra,
    replicas: u32,
) -> (ControlPlane, BTreeMap<String, Option<V>>) {
    let mut c = cp(replicas, &[]);
    // machine name -> its voting member (None: learner or no member).
    let mut by_machine = BTreeMap::new();
    let mut id = 1;
    for v in voting {
        let name = format!("m{id}");
        let health = match v.h {
            H::Up => healthy(),
            H::Down => down(),
            H::Unknown => Health::Unknown,
        };
        add_member(&mut c, id, &name, health, false);
        if v.owner != Owner::Orphan {
            let i = add_machine(&mut c, &name);
            c.machines[i].deleting = v.owner == Owner::Deleting;
            by_machine.insert(name, Some(*v));
        }
        id += 1;
    }
    for owner in learners {
        let name = format!("l{id}");
        add_member(&mut c, id, &name, healthy(), true);
        if *owner != Owner::Orphan {
            let i = add_machine(&mut c, &name);
            c.machines[i].deleting = *owner == Owner::Deleting;
            by_machine.insert(name, None);
        }
        id += 1;
    }
    match extra {
        Extra::None => {}
        Extra::NodeNoMember => {
            add_machine(&mut c, "x-old");
            by_machine.insert("x-old".into(), None);
        }
        Extra::NeverJoined => {
            let i = add_machine(&mut c, "x-new");
            c.machines[i].node_name = None;
            by_machine.insert("x-new".into(), None);
        }
    }
    for m in &mut c.machines {
        m.created_unix = Some(NOW - 86_400);
    }
    (c, by_machine)
}

/// Health counts (up, down, unknown).
pub(super) type Counts = [usize; 3];

pub(super) fn counts<'a>(vs: impl Iterator<Item = &'a V>) -> Counts {
    let mut c = [0; 3];
    for v in vs {
        c[v.h as usize] += 1;
    }
    c
}

/// Every sub-multiset of `of`, by counts.
pub(super) fn subsets(of: Counts) -> impl Iterator<Item = Counts> {
    (0..=of[0])
        .flat_map(move |a| (0..=of[1]).flat_map(move |b| (0..=of[2]).map(move |c| [a, b, c])))
}

/// Whether removing exactly the members counted in `set` leaves too few healthy members for a
/// quorum of those left (removing every member always fails). `optimistic` counts unknown
/// members as healthy, else as unhealthy.
pub(super) fn fails(all: Counts, set: Counts, optimistic: bool) -> bool {
    let voting: usize = all.iter().sum();
    let n: usize = set.iter().sum();
    let healthy = |c: Counts| c[0] + if optimistic { c[2] } else { 0 };
    n >= voting || healthy(all) - healthy(set) < quorum(voting - n)
}

/// Oracle: removing the members counted in `r`, in any order, keeps quorum after every step:
/// no subset of them (every prefix of every order is one) fails.
pub(super) fn removal_ok(all: Counts, r: Counts, optimistic: bool) -> bool {
    subsets(r).all(|s| !fails(all, s, optimistic))
}

/// Oracle, in one world where every member's health is known (no unknown counts): removing
/// `me` adds a way to lose quorum to the `pending` removals and (when `join`) a newcomer that
/// votes before it is healthy, in any order: a subset of the removals, with or without the
/// newcomer, that fails together with `me` but not without it (the empty set without the
/// newcomer: `me` alone fails).
pub(super) fn new_risk(all: Counts, pending: Counts, me: Counts, join: bool) -> bool {
    subsets(pending).any(|s| {
        let n: usize = s.iter().sum();
        (0..=join as usize).any(|j| {
            fails_joined(all, add(s, me), j) && ((n == 0 && j == 0) || !fails_joined(all, s, j))
        })
    })
}

/// [`fails`] (pessimistic) with `j` unhealthy newcomers voting.
pub(super) fn fails_joined(all: Counts, set: Counts, j: usize) -> bool {
    let voting: usize = all.iter().sum();
    let n: usize = set.iter().sum();
    n >= voting || all[0] - set[0] < quorum(voting - n + j)
}

/// Every world the unknown members allow: each unknown member healthy or unhealthy, counted.
pub(super) fn worlds(all: Counts, pending: Counts, me: Counts) -> Vec<(Counts, Counts, Counts)> {
    let others = all[2] - pending[2] - me[2];
    let mut out = Vec::new();
    for pu in 0..=pending[2] {
        for ou in 0..=others {
            for mu in 0..=me[2] {
                let resolve = |c: Counts, up: usize| [c[0] + up, c[1] + c[2] - up, 0];
                out.push((
                    resolve(all, pu + ou + mu),
                    resolve(pending, pu),
                    resolve(me, mu),
                ));
            }
        }
    }
    out
}

/// (in some world there is new risk, in some world there is none)
pub(super) fn risk_cases(all: Counts, pending: Counts, me: Counts, join: bool) -> (bool, bool) {
    let w = worlds(all, pending, me);
    (
        w.iter().any(|(a, p, m)| new_risk(*a, *p, *m, join)),
        w.iter().any(|(a, p, m)| !new_risk(*a, *p, *m, join)),
    )
}

pub(super) fn add(a: Counts, b: Counts) -> Counts {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2]]
}
