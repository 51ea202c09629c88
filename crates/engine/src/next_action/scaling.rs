//! The rules on the number of Machines: a new Machine joining, KCP scaling, and convergence.

use super::{ActionCode, Ctx, NextAction};
use crate::judge::replicas;
use crate::quorum;

/// A new Machine without its member, within `--join-grace`: wait for it to join.
pub(super) fn joining_machine(ctx: &Ctx) -> Option<NextAction> {
    let (ns, clock, policy) = (ctx.ns, &ctx.clock, ctx.policy);
    let m = ctx.memberless.iter().find(|m| clock.joining(m))?;
    Some(
        NextAction::new(
            ActionCode::WaitForJoin,
            format!(
                "Wait for Machine {ns}/{} to join: it is new and has no etcd member yet ({} without one it counts as failed and is replaced)",
                m.name,
                clock.bound(m, policy.join_grace, "--join-grace"),
            ),
        )
        .with(m.name.clone(), None),
    )
}

/// Machines and spec.replicas differ (every member healthy): KCP is scaling or rolling out.
pub(super) fn scaling(ctx: &Ctx) -> Option<NextAction> {
    let (kcp, active, desired, join_grace) = (&ctx.kcp, &ctx.active, ctx.desired, &ctx.join_grace);
    (active.len() != desired).then(|| {
        NextAction::new(
            ActionCode::WaitForRollout,
            format!(
                "Wait for KCP to finish scaling: KubeadmControlPlane {kcp} has {} Machines for {} (it adds or removes one Machine at a time, each new one within --join-grace {join_grace})",
                active.len(),
                replicas(desired)
            ),
        )
    })
}

/// When no rule applies: converged and healthy, nothing to do.
pub(super) fn converged(ctx: &Ctx) -> NextAction {
    let (kcp, active, tally) = (&ctx.kcp, &ctx.active, ctx.tally);
    NextAction::new(
        ActionCode::None,
        format!(
            "No action needed: KubeadmControlPlane {kcp} is converged: {} Machines, {} voting members, all healthy, {}",
            active.len(),
            tally.voting(),
            quorum::tolerance_words(tally.voting(), tally.healthy, tally.unknown)
        ),
    )
}
