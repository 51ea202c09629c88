//! The rule on learners: wait for one catching up, promote one nobody will, check one whose
//! health is unknown.

use super::{ActionCode, Ctx, NextAction};
use crate::model::{HealthRef, Member};
use crate::quorum::{self, Tally};

/// A learner not known unhealthy: wait for it, promote it, or check its health.
pub(super) fn learners(ctx: &Ctx) -> Option<NextAction> {
    let (cp, kcp, ns, clock, policy) = (ctx.cp, &ctx.kcp, ctx.ns, &ctx.clock, ctx.policy);
    let (members, memberless, tally, stale) = (ctx.members, &ctx.memberless, ctx.tally, ctx.stale);
    let learner_grace = &ctx.learner_grace;
    // Learners: one that is catching up (its Machine within --learner-grace) is waited for;
    // past that it is promoted when healthy and caught up, its Machine replaced when it is
    // behind (below). One known to be unhealthy is not catching up (its process failed while it
    // joined): its Machine is replaced below. One without a Machine is removed as an orphan,
    // unless a Machine without a member may still own it.
    for l in members.iter().filter(|m| m.is_learner && !m.is_unstarted()) {
        let h = quorum::effective_ref(l, stale);
        if matches!(h, HealthRef::Unhealthy(_)) {
            continue;
        }
        let owner = cp.machine_of(l).filter(|m| m.control_plane && !m.deleting);
        // The learner's Machine, or one without a member that may still own it (its nodeRef,
        // the member's name, not set yet), within --learner-grace: a wait with that end.
        let (machine, whose) = match owner {
            Some(o) => (Some(o).filter(|o| clock.learning(o)), "its Machine"),
            None => (
                memberless.iter().rev().copied().find(|m| clock.learning(m)),
                "no Machine is known to own it yet; it may be Machine",
            ),
        };
        if let Some(m) = machine {
            return Some(NextAction::new(
                ActionCode::WaitForLearner,
                format!(
                    "Wait for etcd member {} (id {}) of KubeadmControlPlane {kcp} to be promoted before changing membership: it is a learner catching up ({whose} {ns}/{}, {} it counts as stalled)",
                    l.display_name(),
                    l.id,
                    m.name,
                    clock.bound(m, policy.learner_grace, "--learner-grace")
                ),
            )
            .with(l.id.to_string(), None));
        }
        let Some(owner) = owner else {
            continue;
        };
        match h {
            HealthRef::Healthy if caught_up(l, members) && promotion_safe(tally) => {
                let cmd = format!("etcdctl member promote {}", l.id);
                return Some(NextAction::new(
                    ActionCode::PromoteLearner,
                    format!(
                        "Promote etcd member {} (id {}), a learner nobody will promote: its Machine {ns}/{} was {}, past --learner-grace {learner_grace}, so its join was interrupted after `member add`. It is healthy and has caught up, and becomes a healthy voter ({} healthy of {} voting members, quorum {}). etcd refuses if it has fallen behind again; then replace its Machine.",
                        l.display_name(),
                        l.id,
                        owner.name,
                        clock.created(owner),
                        tally.healthy + 1,
                        tally.voting() + 1,
                        quorum::quorum(tally.voting() + 1)
                    ),
                )
                .with(l.id.to_string(), Some(cmd)));
            }
            HealthRef::Unknown(_) => {
                return Some(NextAction::new(
                    ActionCode::CheckEtcdHealth,
                    format!(
                        "Check etcd member {} (id {}) of Machine {ns}/{} with `etcdctl endpoint status --cluster`: it is still a learner past --learner-grace {learner_grace}, and its health is unknown; it is promoted when healthy and caught up, its Machine replaced otherwise.",
                        l.display_name(),
                        l.id,
                        owner.name
                    ),
                )
                .with(l.id.to_string(), None));
            }
            _ => {}
        }
    }
    None
}

/// The leader's raft index (the highest a voter reports when no leader is known).
fn leader_index(members: &[Member]) -> Option<u64> {
    members
        .iter()
        .find(|m| m.is_leader)
        .and_then(|m| m.raft_index)
        .or_else(|| {
            members
                .iter()
                .filter(|m| !m.is_learner)
                .filter_map(|m| m.raft_index)
                .max()
        })
}

/// Whether a learner has caught up enough for etcd to promote it: etcd promotes a learner
/// whose raft index is at least 90% of the leader's. Without both indexes it cannot be told:
/// etcd itself refuses a learner that is behind ("can only promote a learner member which is
/// in sync with leader"), harmlessly.
pub(super) fn caught_up(l: &Member, members: &[Member]) -> bool {
    match (l.raft_index, leader_index(members)) {
        (Some(mine), Some(lead)) => u128::from(mine) * 10 >= u128::from(lead) * 9,
        _ => true,
    }
}

/// Promoting a healthy learner adds a healthy voter: safe iff the healthy members, it
/// included, form a quorum of the grown membership whatever the unknown members are.
fn promotion_safe(before: Tally) -> bool {
    before.healthy + 1 >= quorum::quorum(before.voting() + 1)
}
