//! What a prediction says: the readiness, its reason, the steps with etcd's figures after
//! each, and the one-more-failure column.

use std::fmt;

use crate::kcp::{Hold, MemberFit};
use crate::model::*;
use crate::next_action::NextAction;
use crate::quorum::quorum;

/// Stable reasons of a prediction: the metric's `reason` label (bounded) and the JSON's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReadyReason {
    /// Every step keeps a fault tolerance of at least 1, and the rollout finishes.
    Ready,
    /// etcd is external: a rollout does not change its membership.
    ExternalEtcd,
    /// A Machine's member is unhealthy (down, frozen, an alarm, never started): KCP's preflight
    /// holds every scale operation.
    MemberUnhealthy,
    /// A Machine's member is a learner nobody will promote.
    LearnerNotPromoted,
    /// etcd lists a member no Machine claims (an orphan, or a learner that never started).
    LeftoverMember,
    /// A Machine's deletion cannot finish.
    DeletionHeld,
    /// A Machine has no node, and its join will not finish.
    JoinStuck,
    /// The guard would deny a deletion KCP makes.
    WebhookDenies,
    /// A step at which one more member failure loses quorum.
    FaultToleranceZero,
    /// Cluster or KCP is being deleted: no rollout.
    Teardown,
    /// The member list or a member's health is unknown.
    EtcdUnknown,
}

impl ReadyReason {
    pub const ALL: [ReadyReason; 11] = [
        ReadyReason::Ready,
        ReadyReason::ExternalEtcd,
        ReadyReason::MemberUnhealthy,
        ReadyReason::LearnerNotPromoted,
        ReadyReason::LeftoverMember,
        ReadyReason::DeletionHeld,
        ReadyReason::JoinStuck,
        ReadyReason::WebhookDenies,
        ReadyReason::FaultToleranceZero,
        ReadyReason::Teardown,
        ReadyReason::EtcdUnknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReadyReason::Ready => "Ready",
            ReadyReason::ExternalEtcd => "ExternalEtcd",
            ReadyReason::MemberUnhealthy => "MemberUnhealthy",
            ReadyReason::LearnerNotPromoted => "LearnerNotPromoted",
            ReadyReason::LeftoverMember => "LeftoverMember",
            ReadyReason::DeletionHeld => "DeletionHeld",
            ReadyReason::JoinStuck => "JoinStuck",
            ReadyReason::WebhookDenies => "WebhookDenies",
            ReadyReason::FaultToleranceZero => "FaultToleranceZero",
            ReadyReason::Teardown => "Teardown",
            ReadyReason::EtcdUnknown => "EtcdUnknown",
        }
    }
}

impl fmt::Display for ReadyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Hold> for ReadyReason {
    /// The reason a rollout sticks on when KCP's preflight holds it this way.
    fn from(hold: Hold) -> Self {
        match hold {
            Hold::Deleting(_) => ReadyReason::DeletionHeld,
            Hold::NoNode(_) => ReadyReason::JoinStuck,
            Hold::Member(_, MemberFit::Learner) => ReadyReason::LearnerNotPromoted,
            Hold::Member(..) => ReadyReason::MemberUnhealthy,
            Hold::OrphanMembers(_) => ReadyReason::LeftoverMember,
        }
    }
}

/// The prediction for one control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// The rollout finishes and every step tolerates one more member failure.
    Ready,
    /// The rollout stops at step `at` of `of` (1-based: `at` is the step that cannot happen).
    WouldStick { at: usize, of: usize },
    /// The rollout finishes, but at step `at` of `of` one more member failure loses quorum (or a
    /// member is already down).
    Unsafe { at: usize, of: usize },
    /// Not enough is known to predict: the reason says what.
    CannotJudge,
}

impl Readiness {
    /// `READY`, `WOULD STICK`, `UNSAFE`, `CANNOT JUDGE`.
    pub fn label(&self) -> &'static str {
        match self {
            Readiness::Ready => "READY",
            Readiness::WouldStick { .. } => "WOULD STICK",
            Readiness::Unsafe { .. } => "UNSAFE",
            Readiness::CannotJudge => "CANNOT JUDGE",
        }
    }
}

/// What kind of step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// KCP creates a Machine of the new version.
    Create,
    /// The new Machine's join adds its member as a learner.
    Join,
    /// The learner is promoted: it votes, and its Machine has its node.
    Promote,
    /// A voting member added by a join (kubeadm without learner mode) starts and catches up;
    /// its Machine has its node.
    Start,
    /// KCP deletes a Machine (scale-down or remediation); the guard answers.
    Delete,
    /// The deletion finishes: KCP's pre-terminate hook removed the member, the Machine is gone.
    Removed,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Create => "create",
            StepKind::Join => "join",
            StepKind::Promote => "promote",
            StepKind::Start => "start",
            StepKind::Delete => "delete",
            StepKind::Removed => "removed",
        }
    }
}

/// etcd's figures after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub voting: usize,
    pub healthy: usize,
    pub learners: usize,
    pub quorum: usize,
    /// Healthy minus quorum: 0 means one more failure loses quorum.
    pub fault_tolerance: i64,
}

impl Counts {
    pub(super) fn of(members: &[Member]) -> Counts {
        let voting = members.iter().filter(|m| !m.is_learner).count();
        let healthy = members
            .iter()
            .filter(|m| !m.is_learner && m.effective_health_ref().is_healthy())
            .count();
        let learners = members.iter().filter(|m| m.is_learner).count();
        Counts {
            voting,
            healthy,
            learners,
            quorum: quorum(voting),
            fault_tolerance: healthy as i64 - quorum(voting) as i64,
        }
    }
}

/// What one more member failure right after a step leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OneFailure {
    /// The member that fails: the first healthy voting member by name that is not leaving.
    pub member: String,
    pub quorum_kept: bool,
    /// The rollout, played on from there with that member down: `None` when it still
    /// finishes, else the step (counted from the start) where it sticks.
    pub sticks_at: Option<usize>,
    /// The sentence for the table.
    pub text: String,
}

/// One step of the rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutStep {
    /// 1-based.
    pub index: usize,
    pub kind: StepKind,
    /// The Machine the step is about.
    pub machine: String,
    /// What happens, in words.
    pub action: String,
    /// After the step.
    pub counts: Counts,
    /// The guard's answer to the step's deletion (a [`StepKind::Delete`] step): `allowed` or
    /// `denied`, the reason code and the message.
    pub webhook: Option<String>,
    /// One more member failure right after this step (`None` when no voting member is
    /// healthy to fail).
    pub one_failure: Option<OneFailure>,
}

/// The prediction for one control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preflight {
    pub readiness: Readiness,
    pub reason: ReadyReason,
    /// Why, in words, naming the objects and the numbers.
    pub why: String,
    /// The steps that happen (a rollout that sticks stops before its step `at`).
    pub steps: Vec<RolloutStep>,
    /// The steps the rollout takes when nothing holds it.
    pub total: usize,
    /// etcd's figures before the first step.
    pub start: Option<Counts>,
    /// What clears it (for READY: how to start the rollout).
    pub next_action: NextAction,
}

impl Preflight {
    /// `READY`, `WOULD STICK at step k/n: why`, `UNSAFE at step k/n: why`, `CANNOT JUDGE: why`.
    pub fn summary(&self) -> String {
        match &self.readiness {
            Readiness::Ready => format!("READY: {}", self.why),
            Readiness::WouldStick { at, of } => {
                format!("WOULD STICK at step {at}/{of}: {}", self.why)
            }
            Readiness::Unsafe { at, of } => format!("UNSAFE at step {at}/{of}: {}", self.why),
            Readiness::CannotJudge => format!("CANNOT JUDGE: {}", self.why),
        }
    }
}
