//! The rules on Machine deletions: what is left of an interrupted step, and a deletion in
//! flight.

use super::etcd::not_healthy_names;
use super::{ActionCode, Ctx, NextAction, age_order, human};
use crate::judge::replicas;
use crate::quorum::{self, Safety, Tally};

/// More Machines than replicas and one whose member is gone (cluster-api #2651): delete it.
pub(super) fn leftover_machine(ctx: &Ctx) -> Option<NextAction> {
    let (kcp, ns, active, desired) = (&ctx.kcp, ctx.ns, &ctx.active, ctx.desired);
    let memberless = &ctx.memberless;
    // cluster-api #2651: a Machine whose member is gone while there are more Machines than
    // replicas: the Machine is what is left of a scale-down or rollout step.
    if active.len() > desired {
        for m in memberless {
            if m.node_name.is_some() && ctx.allowed(m, &human()) {
                let cmd = format!("kubectl delete machine -n {ns} {}", m.name);
                return Some(NextAction::new(
                    ActionCode::DeleteMachine,
                    format!(
                        "Delete Machine {ns}/{} to finish the interrupted step: it has a node but its etcd member is already gone, and KubeadmControlPlane {kcp} has {} Machines for {}.",
                        m.name,
                        active.len(),
                        replicas(desired)
                    ),
                )
                .with(m.name.clone(), Some(cmd)));
            }
        }
    }
    None
}

/// A Machine is being deleted: wait for KCP, or bring back what its member's leaving needs.
pub(super) fn deletion_in_flight(ctx: &Ctx) -> Option<NextAction> {
    let (cp, ns, members, tally, stale) = (ctx.cp, ctx.ns, ctx.members, ctx.tally, ctx.stale);
    // A deletion in flight blocks KCP's other work until it completes.
    let m = cp
        .machines
        .iter()
        .filter(|m| m.deleting)
        .min_by(|a, b| age_order(a, b))?;
    let stuck = cp.member_of(m).filter(|x| !x.is_learner).filter(|member| {
        let mut removed = Tally::default();
        removed.count(quorum::effective_ref(member, stale));
        quorum::removal(tally, removed) != Safety::Safe
    });
    let Some(member) = stuck else {
        if cp.member_of(m).is_none() {
            return Some(NextAction::new(
                    ActionCode::WaitForDeletion,
                    format!(
                        "Wait for KCP to finish deleting Machine {ns}/{}: its etcd member is already gone, so KCP drains the node and deletes the Machine.",
                        m.name
                    ),
                )
                .with(m.name.clone(), None));
        }
        return Some(NextAction::new(
                ActionCode::WaitForDeletion,
                format!(
                    "Wait for KCP to finish deleting Machine {ns}/{}: it drains the node, removes the etcd member and deletes the Machine (its member can leave safely: {} healthy of {} voting members).",
                    m.name,
                    tally.healthy,
                    tally.voting()
                ),
            )
            .with(m.name.clone(), None));
    };
    // Its member cannot leave, and KCP replaces nothing while a deletion is pending: the
    // wait has no end. Removing an unhealthy orphan may free it; else the unhealthy
    // members must come back.
    if let Some(a) = ctx.orphan_removal() {
        return Some(a);
    }
    let down = not_healthy_names(members, stale)
        .unwrap_or_else(|| "the members not known healthy".to_string());
    Some(NextAction::new(
            ActionCode::CheckEtcdHealth,
            format!(
                "Bring back etcd on {} (its static pod and kubelet on the node), then KCP finishes the deletion by itself: Machine {ns}/{} is being deleted, but its member {} cannot leave safely ({} healthy of {} voting members, quorum {}), and KCP replaces no Machine while a deletion is pending, so nothing moves until the other members are healthy. Check them: `etcdctl endpoint health --cluster`",
                down,
                m.name,
                member.display_name(),
                tally.healthy,
                tally.voting(),
                quorum::quorum(tally.voting()),
            ),
        )
        .with(m.name.clone(), None))
}
