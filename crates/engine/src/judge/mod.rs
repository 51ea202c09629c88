//! Operation -> Judgement: whether a Machine deletion or a KCP change keeps etcd quorum and the
//! KCP's desired replicas, and what to tell the person who asked, without the next action.
//!
//! The engine's lower layer of decisions: both [`decide`](mod@crate::decide) (which adds the
//! next safe action to a judgement) and [`next_action`](mod@crate::next_action) (which names
//! an action only when this layer would allow the deletion it implies) read it, and it reads
//! neither: the dependency goes one way, `decide` -> `next_action` -> `judge`, and `decide` ->
//! `judge`.
//!
//! This module owns the question ([`Operation`]) and `judge`; its children own the rest:
//! - [`verdict`]: the answer's types, the stable [`Reason`] codes and the quorum [`Figures`];
//! - `delete`: the rules for deleting a control-plane Machine (the unconditional allows,
//!   desired replicas, members about to join), and `removal` its quorum rule;
//! - `replicas`: the rules for changing `spec.replicas` or starting a rollout;
//! - `words`: how members, objects and unknown health are named in messages.

mod delete;
mod removal;
mod replicas;
pub mod verdict;
mod words;

use std::fmt;

use crate::joins::JoinStyle;
use crate::model::*;
use crate::quorum::{self, Safety, Tally, quorum};
pub(crate) use delete::judge_delete;
use delete::*;
use removal::*;
use replicas::*;
pub use verdict::{Figures, Judgement, Reason};
use words::*;

/// What someone asks to do to a control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Delete this Machine. The value is the Machine as the request carries it; it stands in for
    /// the cached one of the same name (the cache may lag behind).
    DeleteMachine(Machine),
    /// Change the KCP: `spec.replicas` from -> to (equal when unchanged), and whether the change
    /// starts a rollout (version, kubeadmConfigSpec or machineTemplate changed).
    UpdateKcp {
        replicas_from: u32,
        replicas_to: u32,
        starts_rollout: bool,
    },
}

/// What every rule reads besides the operation itself: the control plane asked about, who
/// asks, the policy, the present as Unix seconds (it tells a Machine still joining from one
/// that never will; the snapshot's own age decides whether its health is stale), and which
/// messages the answer needs. An entry point builds it once, and each rule passes it on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask<'a> {
    pub(crate) cp: &'a ControlPlane,
    pub(crate) requester: &'a Requester,
    pub(crate) policy: &'a Policy,
    pub(crate) now_unix: i64,
    pub(crate) words: Words,
}

impl<'a> Ask<'a> {
    pub(crate) fn new(
        cp: &'a ControlPlane,
        requester: &'a Requester,
        policy: &'a Policy,
        now_unix: i64,
        words: Words,
    ) -> Self {
        Ask {
            cp,
            requester,
            policy,
            now_unix,
            words,
        }
    }

    /// The same question, its answer needing `words`.
    pub(crate) fn worded(self, words: Words) -> Self {
        Ask { words, ..self }
    }
}

/// Which messages a judgement needs. `next_action` asks only whether a deletion would be
/// allowed, and a quorum verdict that the desired-replicas rule then overrules is never shown:
/// an allowed judgement's message and warnings are not written for either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Words {
    All,
    DenialsOnly,
}

/// The decision without the next action (which itself asks this function), worded as
/// `ask.words` says.
pub(crate) fn judge(ask: &Ask<'_>, op: &Operation) -> Judgement {
    match op {
        Operation::DeleteMachine(m) => judge_deletion(ask, m),
        Operation::UpdateKcp {
            replicas_from,
            replicas_to,
            starts_rollout,
        } => with_tolerance_warning(
            ask.cp,
            judge_update(ask, *replicas_from, *replicas_to, *starts_rollout),
        ),
    }
}

/// [`judge`] of deleting `m`, a Machine the caller holds by reference (an [`Operation`] would
/// own a clone of it).
pub(crate) fn judge_deletion(ask: &Ask<'_>, m: &Machine) -> Judgement {
    with_tolerance_warning(ask.cp, judge_delete(ask, m))
}

/// A replica count as words read it: "1 replica", "3 replicas".
pub(crate) fn replicas(n: impl fmt::Display) -> String {
    let n = n.to_string();
    if n == "1" {
        "1 replica".to_string()
    } else {
        format!("{n} replicas")
    }
}
