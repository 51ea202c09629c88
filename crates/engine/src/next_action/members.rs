//! The rules on members no Machine accounts for: added but never started, or orphans.

use super::{ActionCode, Ctx, NextAction};
use crate::model::Member;
use crate::quorum::{self, Safety, Tally};

/// A member added but never started: wait while a Machine may join with it, else remove it.
pub(super) fn unstarted_members(ctx: &Ctx) -> Option<NextAction> {
    let (kcp, ns, clock, policy) = (&ctx.kcp, ctx.ns, &ctx.clock, ctx.policy);
    let (members, memberless, tally, keep, stale) =
        (ctx.members, &ctx.memberless, ctx.tally, ctx.keep, ctx.stale);
    let join_grace = &ctx.join_grace;
    // An added member that has not started: joining while a Machine without a member is within
    // --join-grace (the newest such Machine bounds the wait); after that its join failed and
    // it only blocks (cluster-api #13221, #13667, #5509): remove it first, then the failed
    // Machine is replaced (below).
    for u in members.iter().filter(|m| m.is_unstarted()) {
        if let Some(m) = memberless.iter().rev().find(|m| clock.joining(m)) {
            return Some(NextAction::new(
                ActionCode::WaitForJoin,
                format!(
                    "Wait for etcd member {} of KubeadmControlPlane {kcp} to join: it has been added but has not started (Machine {ns}/{}, the newest without an etcd member, was {} the member counts as failed)",
                    u.id,
                    m.name,
                    clock.bound(m, policy.join_grace, "--join-grace"),
                ),
            )
            .with(u.id.to_string(), None));
        }
        if removable(u, members, tally, keep, stale) {
            let failed = memberless.first();
            let why = match failed {
                Some(m) => format!(
                    "Machine {ns}/{}, which has no etcd member, was {}, past --join-grace {join_grace}: its join failed",
                    m.name,
                    clock.created(m)
                ),
                None => format!(
                    "no Machine without an etcd member was created within --join-grace {join_grace}"
                ),
            };
            let blocks = if u.is_learner {
                "while it stays, etcd refuses every further learner (\"too many learner members in cluster\"), so every KCP scale-up and rollout sticks (cluster-api #13221, #13667)".to_string()
            } else {
                format!(
                    "it votes but cannot: with it etcd has {} and KCP counts it as an unhealthy member, which blocks its scale-ups, rollouts and remediation (cluster-api #5509)",
                    quorum::tolerance_words(tally.voting(), tally.healthy, tally.unknown)
                )
            };
            let then = failed.map_or(String::new(), |m| {
                format!(
                    " Then Machine {ns}/{}, whose join failed, is replaced.",
                    m.name
                )
            });
            return Some(remove_member(
                u,
                format!(
                    "Remove etcd member {} of KubeadmControlPlane {kcp} from etcd: it was added but never started{}, and no Machine is joining ({why}). Removing a member that never started changes no healthy count; {blocks}.{then}",
                    u.id,
                    if u.is_learner { " (a learner)" } else { "" },
                ),
            ));
        }
    }
    None
}

/// A member no Machine accounts for, whose removal is safe: remove it.
pub(super) fn orphan_member(ctx: &Ctx) -> Option<NextAction> {
    ctx.orphan_removal()
}

impl Ctx<'_> {
    /// The first orphan (unhealthy ones first) whose removal is safe and keeps the fault
    /// tolerance etcd has (up to the one spec.replicas asks for): with 2 Machines of 3
    /// replicas and a healthy orphan, KCP adds the third Machine first.
    pub(super) fn orphan_removal(&self) -> Option<NextAction> {
        let kcp = &self.kcp;
        self.orphans
            .iter()
            .find(|o| removable(o, self.members, self.tally, self.keep, self.stale))
            .map(|o| {
                remove_member(
                    o,
                    format!(
                        "Remove etcd member {} (id {}) of KubeadmControlPlane {kcp} from etcd: it belongs to no Machine.",
                        o.display_name(),
                        o.id
                    ),
                )
            })
    }
}

/// Whether removing member `o` is safe and keeps the fault tolerance advice must keep.
fn removable(o: &Member, members: &[Member], tally: Tally, keep: i64, stale: bool) -> bool {
    let mut removed = Tally::default();
    // A learner does not vote: removing it changes no count.
    if !o.is_learner {
        removed.count(quorum::effective_ref(o, stale));
    }
    let after = Tally {
        healthy: tally.healthy - removed.healthy,
        unhealthy: tally.unhealthy - removed.unhealthy,
        unknown: tally.unknown - removed.unknown,
    };
    (quorum::removal(tally, removed) == Safety::Safe
        || quorum::unfit_voter_removal_safe(members, o, stale))
        && quorum::tolerance(after.voting(), after.healthy) >= keep
}

fn remove_member(o: &Member, message: String) -> NextAction {
    let cmd = format!("etcdctl member remove {}", o.id);
    NextAction::new(ActionCode::RemoveOrphanMember, message).with(o.id.to_string(), Some(cmd))
}
