//! The answer to an operation: the verdict and the judgement, the stable reason codes whose
//! strings are API, and the quorum figures before and after.

use std::fmt;

use super::*;

/// Stable reason codes. Their string form is part of the API (audit annotations, JSON output,
/// metrics labels): never rename one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    // Always allowed.
    NotControlPlane,
    AlreadyDeleting,
    ClusterDeleting,
    ControlPlaneDeleting,
    ClusterctlMove,
    TeardownRequester,
    BreakGlass,
    ExternalEtcd,
    // Allowed because the rules hold.
    MemberAbsent,
    LearnerMember,
    QuorumSafe,
    NoReplicaChange,
    ScaleDownSafe,
    ScaleUpSafe,
    SingleMemberScaleUp,
    RolloutAllowed,
    // Denied (or allowed with a warning, for HealthUnknown under a permissive policy).
    WouldLoseQuorum,
    LastMember,
    PendingDeletions,
    PendingJoin,
    QuorumLost,
    HealthUnknown,
    BelowDesiredReplicas,
    ScaleDownWouldLoseQuorum,
    ScaleUpWouldLoseQuorum,
    /// A replica count KCP's own webhook refuses: 0 or less, or even with stacked etcd.
    KcpRefusesReplicas,
}

impl Reason {
    /// Every reason, for documentation and exhaustive tests.
    pub const ALL: [Reason; 26] = [
        Reason::NotControlPlane,
        Reason::AlreadyDeleting,
        Reason::ClusterDeleting,
        Reason::ControlPlaneDeleting,
        Reason::ClusterctlMove,
        Reason::TeardownRequester,
        Reason::BreakGlass,
        Reason::ExternalEtcd,
        Reason::MemberAbsent,
        Reason::LearnerMember,
        Reason::QuorumSafe,
        Reason::NoReplicaChange,
        Reason::ScaleDownSafe,
        Reason::ScaleUpSafe,
        Reason::SingleMemberScaleUp,
        Reason::RolloutAllowed,
        Reason::WouldLoseQuorum,
        Reason::LastMember,
        Reason::PendingDeletions,
        Reason::PendingJoin,
        Reason::QuorumLost,
        Reason::HealthUnknown,
        Reason::BelowDesiredReplicas,
        Reason::ScaleDownWouldLoseQuorum,
        Reason::ScaleUpWouldLoseQuorum,
        Reason::KcpRefusesReplicas,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotControlPlane => "NotControlPlane",
            Reason::AlreadyDeleting => "AlreadyDeleting",
            Reason::ClusterDeleting => "ClusterDeleting",
            Reason::ControlPlaneDeleting => "ControlPlaneDeleting",
            Reason::ClusterctlMove => "ClusterctlMove",
            Reason::TeardownRequester => "TeardownRequester",
            Reason::BreakGlass => "BreakGlass",
            Reason::ExternalEtcd => "ExternalEtcd",
            Reason::MemberAbsent => "MemberAbsent",
            Reason::LearnerMember => "LearnerMember",
            Reason::QuorumSafe => "QuorumSafe",
            Reason::NoReplicaChange => "NoReplicaChange",
            Reason::ScaleDownSafe => "ScaleDownSafe",
            Reason::ScaleUpSafe => "ScaleUpSafe",
            Reason::SingleMemberScaleUp => "SingleMemberScaleUp",
            Reason::RolloutAllowed => "RolloutAllowed",
            Reason::WouldLoseQuorum => "WouldLoseQuorum",
            Reason::LastMember => "LastMember",
            Reason::PendingDeletions => "PendingDeletions",
            Reason::PendingJoin => "PendingJoin",
            Reason::QuorumLost => "QuorumLost",
            Reason::HealthUnknown => "HealthUnknown",
            Reason::BelowDesiredReplicas => "BelowDesiredReplicas",
            Reason::ScaleDownWouldLoseQuorum => "ScaleDownWouldLoseQuorum",
            Reason::ScaleUpWouldLoseQuorum => "ScaleUpWouldLoseQuorum",
            Reason::KcpRefusesReplicas => "KcpRefusesReplicas",
        }
    }

    /// Reasons that allow without looking at quorum at all (teardown, moves, break-glass...).
    pub fn is_unconditional(self) -> bool {
        matches!(
            self,
            Reason::NotControlPlane
                | Reason::AlreadyDeleting
                | Reason::ClusterDeleting
                | Reason::ControlPlaneDeleting
                | Reason::ClusterctlMove
                | Reason::TeardownRequester
                | Reason::BreakGlass
                | Reason::ExternalEtcd
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The quorum figures before and after an operation. `healthy` counts only members known to be
/// healthy; `unknown` those whose health is unknown or stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    pub voting: usize,
    pub healthy: usize,
    pub unknown: usize,
    pub quorum: usize,
    pub tolerance: i64,
    pub voting_after: usize,
    pub healthy_after: usize,
    pub quorum_after: usize,
    pub tolerance_after: i64,
}

impl Figures {
    pub(super) fn new(before: Tally, after: Tally) -> Figures {
        Figures {
            voting: before.voting(),
            healthy: before.healthy,
            unknown: before.unknown,
            quorum: quorum(before.voting()),
            tolerance: quorum::tolerance(before.voting(), before.healthy),
            voting_after: after.voting(),
            healthy_after: after.healthy,
            quorum_after: quorum(after.voting()),
            tolerance_after: quorum::tolerance(after.voting(), after.healthy),
        }
    }

    /// "now voting 3, healthy 2, quorum 2, fault tolerance 0; after: voting 2, healthy 1, quorum 2, quorum lost by 1"
    pub fn sentence(&self) -> String {
        self.shown().to_string()
    }

    /// [`Figures::sentence`], written straight into the message that quotes it.
    pub fn shown(&self) -> impl fmt::Display + '_ {
        Sentence(self)
    }
}

pub(super) struct Sentence<'a>(&'a Figures);

impl fmt::Display for Sentence<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        write!(f, "now voting {}, healthy {}", s.voting, s.healthy)?;
        if s.unknown > 0 {
            write!(f, ", health unknown {}", s.unknown)?;
        }
        // The members of unknown health left after the change: those before, less the ones it
        // removes (at most all of them).
        let unknown_after = s
            .unknown
            .min(s.voting_after.saturating_sub(s.healthy_after));
        write!(
            f,
            ", quorum {}, {}; after: voting {}, healthy {}, quorum {}, {}",
            s.quorum,
            quorum::tolerance_words(s.voting, s.healthy, s.unknown),
            s.voting_after,
            s.healthy_after,
            s.quorum_after,
            quorum::tolerance_words(s.voting_after, s.healthy_after, unknown_after)
        )
    }
}

/// A verdict without the next action: what the webhook answers with ([`crate::admit`]), and
/// what `next_action` itself evaluates with. A denial's message still ends with the next safe
/// action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    pub allowed: bool,
    pub reason: Reason,
    pub message: String,
    pub warnings: Vec<String>,
    pub figures: Option<Figures>,
}

impl Judgement {
    pub(super) fn allow(reason: Reason, message: String) -> Judgement {
        Judgement {
            allowed: true,
            reason,
            message,
            warnings: Vec::new(),
            figures: None,
        }
    }

    pub(super) fn deny(reason: Reason, message: String) -> Judgement {
        Judgement {
            allowed: false,
            reason,
            message,
            warnings: Vec::new(),
            figures: None,
        }
    }

    pub(super) fn with_figures(mut self, f: Figures) -> Judgement {
        self.figures = Some(f);
        self
    }
}
