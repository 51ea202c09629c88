//! The webhook's answer: a [`Judgement`] and the etcd probe it needs, if any.
//!
//! An allow that rests on etcd health rests on answers etcd gave after the request arrived
//! (docs/rules.md, "Fresh truth"). Which judgements rest on etcd is the engine's rule, here:
//! the webhook asks on the etcd it has ([`EtcdBasis`]), probes when the answer says so, and
//! asks again on the fresh probe. It never reads a reason to decide that itself.

use super::Judgement;
use crate::judge::Reason;

/// Where the etcd state a decision reads comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EtcdBasis {
    /// The record of the latest probes, which may be older than the request.
    Record,
    /// A probe taken for this decision, after the request arrived (or, when none could be had
    /// in time, what the record's bad news leaves: [`crate::failed_view`]).
    FreshProbe,
}

/// The engine's answer to one review.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The answer, as it is.
    Final(Judgement),
    /// An allow that rests on etcd's health or member list, judged on the [`EtcdBasis::Record`]:
    /// not an answer yet. Ask again on a [`EtcdBasis::FreshProbe`] and answer that. Where no
    /// probe can be taken at all (no prober, no address for the cluster's etcd), this
    /// judgement is all there is.
    ConfirmOnFreshProbe(Judgement),
    /// A denial that rests on etcd's health, judged on the [`EtcdBasis::Record`]: the answer,
    /// and etcd is worth probing in the background, so that the next review sees a recovery.
    DeniedRefreshInBackground(Judgement),
}

impl Answer {
    /// `j`, judged on etcd from `basis`, as the webhook must treat it.
    pub(super) fn new(j: Judgement, basis: EtcdBasis) -> Answer {
        match basis {
            EtcdBasis::FreshProbe => Answer::Final(j),
            EtcdBasis::Record if j.allowed && allow_rests_on_etcd(j.reason) => {
                Answer::ConfirmOnFreshProbe(j)
            }
            EtcdBasis::Record if !j.allowed && denial_rests_on_etcd(j.reason) => {
                Answer::DeniedRefreshInBackground(j)
            }
            EtcdBasis::Record => Answer::Final(j),
        }
    }

    /// The judgement, whatever the answer asks for.
    pub fn judgement(&self) -> &Judgement {
        match self {
            Answer::Final(j)
            | Answer::ConfirmOnFreshProbe(j)
            | Answer::DeniedRefreshInBackground(j) => j,
        }
    }

    /// The judgement, whatever the answer asks for.
    pub fn into_judgement(self) -> Judgement {
        match self {
            Answer::Final(j)
            | Answer::ConfirmOnFreshProbe(j)
            | Answer::DeniedRefreshInBackground(j) => j,
        }
    }
}

/// Whether an *allow* for `r` rests on etcd's health or member list, so that it must be taken
/// from a fresh probe, not from the record of the last sweep: the quorum rule's allows (a
/// deletion of a Machine that holds a voting member, a replica change), the unknown-health
/// policy's, and `MemberAbsent`: that the Machine has no member is the record's member list
/// too, and a member that joined or started since the last probe is there now (the record
/// shows it unnamed, not started, or not at all). Unconditional allows, `NoReplicaChange` and
/// `RolloutAllowed` (allowed whatever etcd says) do not.
fn allow_rests_on_etcd(r: Reason) -> bool {
    matches!(
        r,
        Reason::MemberAbsent
            | Reason::LearnerMember
            | Reason::QuorumSafe
            | Reason::ScaleDownSafe
            | Reason::ScaleUpSafe
            | Reason::SingleMemberScaleUp
            | Reason::HealthUnknown
            | Reason::PendingDeletions
    )
}

/// Whether a *denial* for `r` rests on etcd's health (a member believed down, or health
/// unknown), so that a fresh probe may turn it into an allow once etcd recovers.
fn denial_rests_on_etcd(r: Reason) -> bool {
    matches!(
        r,
        Reason::WouldLoseQuorum
            | Reason::QuorumLost
            | Reason::PendingDeletions
            | Reason::PendingJoin
            | Reason::HealthUnknown
            | Reason::ScaleDownWouldLoseQuorum
            | Reason::ScaleUpWouldLoseQuorum
    )
}
