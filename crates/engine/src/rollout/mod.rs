//! `preflight`: the rollout a version change would start, played step by step on a copy of one
//! control plane with KCP's own step function ([`crate::kcp::reconcile`]), so that before an
//! upgrade wave a human knows which control planes would finish, which would stick (at which
//! step, and why), and at which steps one more member failure would lose etcd quorum.
//!
//! The play, one step at a time, the first that can happen:
//! 1. A Machine being deleted finishes: KCP's pre-terminate hook removes its member when
//!    KCP's own check allows it (the voting members left, less the unhealthy ones, keep a
//!    quorum, and no learner is listed), and no other hook holds the deletion.
//! 2. A Machine without a node joins, as the control plane's kubeadm joins ([`crate::joins`]):
//!    `kubeadm join` adds its member as a learner, which is then promoted; or, without
//!    learner mode, as a voting member that counts at once and starts in a later step. Either
//!    way the Machine then has its node. etcd takes one learner at a time, and adds a member
//!    only while every voting member is connected, or since etcd 3.5.30, 3.6.11 and 3.7 a
//!    quorum of them and the new one (its strict reconfiguration check, by the members' etcd
//!    version, [`crate::etcd_version`]); a voting member also needs a quorum of started
//!    members once it is in. A Machine that was already there and is past `--join-grace` (no
//!    member) or `--learner-grace` (a learner) is taken as stopped, as the next action does.
//! 3. KCP reconciles ([`crate::kcp::reconcile`]): remediation, then scale up (a new Machine of
//!    the new version) or down (the victim's deletion, answered by the guard's own rules, as
//!    KCP's controller identity).
//!
//! When none can happen and the control plane has not converged, the rollout sticks there. No
//! I/O, no clock: the present is passed in.
//!
//! Its rooms: `report` holds what a prediction says ([`Preflight`] and its parts), `predict`
//! makes it (the readiness, the one-more-failure column, what clears it), `play` is the
//! control plane as the play changes it (`Sim`) with KCP's and the deletions' steps, `join`
//! its join step as kubeadm and etcd allow it, and `words` the sentences that name why a
//! rollout sticks or is unsafe. The tests are in `tests`.

mod join;
mod play;
mod predict;
mod report;
#[cfg(test)]
mod tests;
mod words;

pub use predict::{preflight, readiness, readiness_given};
pub use report::{Counts, OneFailure, Preflight, Readiness, ReadyReason, RolloutStep, StepKind};

/// KCP's own pre-terminate hook: it removes the member.
pub const KCP_PRE_TERMINATE_HOOK: &str =
    "pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup";
