//! Operation -> Verdict: whether a Machine deletion or a KCP change keeps etcd quorum and the
//! KCP's desired replicas, and what to tell the person who asked.
//!
//! This module owns the entry points ([`decide`], [`admit`], [`admit_deletion`]) and the
//! question ([`Operation`]); its children own the rest:
//! - [`verdict`]: the answer's types, the stable [`Reason`] codes and the quorum [`Figures`];
//! - `delete`: the rules for deleting a control-plane Machine (quorum, desired replicas,
//!   members about to join);
//! - `replicas`: the rules for changing `spec.replicas` or starting a rollout;
//! - `words`: how members, objects and unknown health are named in messages.

mod delete;
mod replicas;
pub mod verdict;
mod words;

use super::joins::JoinStyle;
use super::model::*;
use super::next_action::{NextAction, next_action};
use super::quorum::{self, Safety, Tally, quorum};
pub(crate) use delete::judge_delete;
use delete::*;
use replicas::*;
pub use verdict::{Figures, Judgement, Reason, Verdict};
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

/// Decides one operation. `now_unix` is the present as Unix seconds (for the next action's
/// join grace); the snapshot's own age decides whether its health is stale.
pub fn decide(
    cp: &ControlPlane,
    op: &Operation,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
) -> Verdict {
    let mut j = judge(cp, op, requester, policy, now_unix);
    let next = next_action(cp, policy, now_unix);
    if !j.allowed {
        append_next_action(&mut j.message, &next);
    }
    Verdict {
        allowed: j.allowed,
        reason: j.reason,
        message: j.message,
        warnings: j.warnings,
        figures: j.figures,
        next_action: next,
    }
}

/// [`decide`] for the webhook: the same allowed, reason, message, warnings and figures, but the
/// next action is worked out only for a denial, whose message ends with it. An admission
/// response carries no next action, and most reviews are allowed: working it out for every
/// one of them was a third of a decision's time (`cargo bench --bench core -- decision`).
pub fn admit(
    cp: &ControlPlane,
    op: &Operation,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
) -> Judgement {
    let j = match op {
        Operation::DeleteMachine(m) => return admit_deletion(cp, m, requester, policy, now_unix),
        Operation::UpdateKcp { .. } => judge(cp, op, requester, policy, now_unix),
    };
    with_next_action_if_denied(j, cp, policy, now_unix)
}

/// [`admit`] of deleting `m`, a Machine the caller holds by reference: the webhook's decoded
/// review owns it, and an [`Operation`] would own a clone of it (its annotations too).
pub fn admit_deletion(
    cp: &ControlPlane,
    m: &Machine,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
) -> Judgement {
    let j = with_tolerance_warning(
        cp,
        judge_delete(cp, m, requester, policy, now_unix, Words::All),
    );
    with_next_action_if_denied(j, cp, policy, now_unix)
}

fn with_next_action_if_denied(
    mut j: Judgement,
    cp: &ControlPlane,
    policy: &Policy,
    now_unix: i64,
) -> Judgement {
    if !j.allowed {
        append_next_action(&mut j.message, &next_action(cp, policy, now_unix));
    }
    j
}

/// A denial reads: its first line says what is refused and why in short, the lines after it
/// the detail, and the last line the next safe action (kubectl shows the message as it is).
fn append_next_action(message: &mut String, next: &NextAction) {
    message.push_str("\nNext safe action: ");
    message.push_str(&next.message);
}

/// Which messages a judgement needs. `next_action` asks only whether a deletion would be
/// allowed, and a quorum verdict that the desired-replicas rule then overrules is never shown:
/// an allowed judgement's message and warnings are not written for either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Words {
    All,
    DenialsOnly,
}

/// The decision without the next action (which itself asks this function). `now_unix` tells a
/// Machine still joining from one that never will.
pub(crate) fn judge(
    cp: &ControlPlane,
    op: &Operation,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
) -> Judgement {
    match op {
        Operation::DeleteMachine(m) => with_tolerance_warning(
            cp,
            judge_delete(cp, m, requester, policy, now_unix, Words::All),
        ),
        Operation::UpdateKcp {
            replicas_from,
            replicas_to,
            starts_rollout,
        } => with_tolerance_warning(
            cp,
            judge_update(
                cp,
                *replicas_from,
                *replicas_to,
                *starts_rollout,
                requester,
                policy,
            ),
        ),
    }
}
