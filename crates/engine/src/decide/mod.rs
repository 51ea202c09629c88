//! Operation -> Verdict: the judgement of an operation ([`judge`](mod@crate::judge)) with the
//! single next safe action ([`next_action`](mod@crate::next_action)), which a denial's message
//! ends with.
//!
//! This module owns the entry points ([`decide`], [`admit`], [`admit_deletion`]), the full
//! answer ([`Verdict`]) and the webhook's ([`Answer`]: whether it needs a fresh etcd probe).
//! It sits above both layers it combines: `decide` -> `next_action` -> `judge`, and `decide`
//! -> `judge`; neither of them reads this module.

mod answer;

pub use answer::{Answer, EtcdBasis};

use crate::judge::{Ask, Words, judge, judge_deletion};
pub use crate::judge::{Figures, Judgement, Operation, Reason};
use crate::model::*;
use crate::next_action::{NextAction, next_action};

/// The answer to one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub reason: Reason,
    /// Names the objects and the numbers, and for a denial the safe next step.
    pub message: String,
    pub warnings: Vec<String>,
    /// Absent when quorum did not enter the decision (unconditional allows, unknown etcd).
    pub figures: Option<Figures>,
    pub next_action: NextAction,
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
    let ask = Ask::new(cp, requester, policy, now_unix, Words::All);
    let mut j = judge(&ask, op);
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

/// [`decide`] for the webhook, on etcd from `etcd`: the same allowed, reason, message,
/// warnings and figures, and whether the answer needs a fresh probe of etcd ([`Answer`]). The
/// next action is worked out only for a denial, whose message ends with it: an admission
/// response carries no next action, and most reviews are allowed; working it out for every one
/// of them was a third of a decision's time (`cargo bench --bench core -- decision`).
pub fn admit(
    cp: &ControlPlane,
    op: &Operation,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
    etcd: EtcdBasis,
) -> Answer {
    let ask = Ask::new(cp, requester, policy, now_unix, Words::All);
    Answer::new(with_next_action_if_denied(judge(&ask, op), &ask), etcd)
}

/// [`admit`] of deleting `m`, a Machine the caller holds by reference: the webhook's decoded
/// review owns it, and an [`Operation`] would own a clone of it (its annotations too).
pub fn admit_deletion(
    cp: &ControlPlane,
    m: &Machine,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
    etcd: EtcdBasis,
) -> Answer {
    let ask = Ask::new(cp, requester, policy, now_unix, Words::All);
    Answer::new(
        with_next_action_if_denied(judge_deletion(&ask, m), &ask),
        etcd,
    )
}

fn with_next_action_if_denied(mut j: Judgement, ask: &Ask<'_>) -> Judgement {
    if !j.allowed {
        append_next_action(
            &mut j.message,
            &next_action(ask.cp, ask.policy, ask.now_unix),
        );
    }
    j
}

/// A denial reads: its first line says what is refused and why in short, the lines after it
/// the detail, and the last line the next safe action (kubectl shows the message as it is).
fn append_next_action(message: &mut String, next: &NextAction) {
    message.push_str("\nNext safe action: ");
    message.push_str(&next.message);
}
