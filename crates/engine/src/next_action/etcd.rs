//! The rules on etcd as a whole: its member list unknown, a NOSPACE alarm, quorum lost, members
//! not known healthy.

use super::{ActionCode, Ctx, NextAction};
use crate::model::{Alarm, ControlPlane, Member};
use crate::quorum;

/// The member list is unknown: look at etcd (no rule past this one can be tried).
pub(super) fn unknown_members(cp: &ControlPlane, reason: &str) -> NextAction {
    let kcp = cp.kcp_shown();
    NextAction::new(
        ActionCode::CheckEtcdHealth,
        format!(
            "Check that etcd answers, e.g. `etcdctl member list` on a control-plane node: the etcd member list of KubeadmControlPlane {kcp} is unknown ({reason})"
        ),
    )
}

/// The command that frees space after a NOSPACE alarm (etcd's maintenance guide): compact the
/// history up to the current revision, defragment every member, disarm the alarm.
pub const FREE_SPACE_COMMAND: &str = "rev=$(etcdctl endpoint status -w json | grep -o '\"revision\":[0-9]*' | head -1 | cut -d: -f2) && etcdctl compact \"$rev\" && etcdctl defrag --cluster && etcdctl alarm disarm";

/// A member raised a NOSPACE alarm and quorum holds: free space.
///
/// A NOSPACE alarm: the whole cluster refuses writes until space is freed and the alarm
/// disarmed, and a new member would receive the same data. A NOSPACE alarm does not make a
/// member unhealthy (raft keeps its quorum: [`Member::effective_health`]), so this is named
/// whenever quorum holds; if it is lost, restoring quorum comes first.
pub(super) fn free_space(ctx: &Ctx) -> Option<NextAction> {
    let (cp, members, stale) = (ctx.cp, ctx.members, ctx.stale);
    let raised: Vec<&Member> = members
        .iter()
        .filter(|m| m.alarms.contains(&Alarm::NoSpace))
        .collect();
    let first = raised.first()?;
    if quorum::raft_quorum_lost(members, stale) {
        return None;
    }
    let names: Vec<String> = raised
        .iter()
        .map(|m| format!("{} (id {})", m.display_name(), m.id))
        .collect();
    Some(
        NextAction::new(
            ActionCode::FreeSpace,
            format!(
                "Free space in etcd of KubeadmControlPlane {}, which has a NOSPACE alarm (raised by {}): its database reached the space quota, and the whole cluster serves only reads and deletes, so the workload API server cannot write. Replacing a Machine does not help: a new member receives the same data and hits the same quota. Instead, compact the history, defragment every member, then disarm the alarm; if the database is still close to the quota after that, raise --quota-backend-bytes on every member (kubeadm: etcd.local.extraArgs) first.",
                cp.kcp_shown(),
                names.join(", ")
            ),
        )
        .with(first.id.to_string(), Some(FREE_SPACE_COMMAND.to_string())),
    )
}

/// Quorum is lost: only bringing members back or disaster recovery helps.
pub(super) fn quorum_lost(ctx: &Ctx) -> Option<NextAction> {
    let (kcp, tally) = (&ctx.kcp, ctx.tally);
    quorum::raft_quorum_lost(ctx.members, ctx.stale).then(|| {
        NextAction::new(
            ActionCode::RestoreQuorum,
            format!(
                "Restore quorum: etcd of KubeadmControlPlane {kcp} has lost it ({} healthy of {} voting members, quorum {}), and membership cannot change without it. Bring the stopped members back if their data is intact, otherwise restore etcd from a snapshot (https://etcd.io/docs/v3.4/op-guide/recovery/). Do not delete Machines that still hold members.",
                tally.healthy,
                tally.voting(),
                quorum::quorum(tally.voting())
            ),
        )
    })
}

/// Some voting member is not known healthy, and nothing earlier applied: check them.
pub(super) fn health_unknown(ctx: &Ctx) -> Option<NextAction> {
    let (kcp, tally) = (&ctx.kcp, ctx.tally);
    (tally.unknown > 0 || tally.unhealthy > 0).then(|| {
        NextAction::new(
            ActionCode::CheckEtcdHealth,
            format!(
                "Check the etcd members of KubeadmControlPlane {kcp} with `etcdctl endpoint health --cluster`: {} of {} voting members are known healthy (quorum {}); {} unknown, {} unhealthy.",
                tally.healthy,
                tally.voting(),
                quorum::quorum(tally.voting()),
                tally.unknown,
                tally.unhealthy
            ),
        )
    })
}

/// "a, b": the voting members not known healthy, as a sentence names them; `None` when every
/// one is healthy.
pub(super) fn not_healthy_names(members: &[Member], stale: bool) -> Option<String> {
    let down: Vec<String> = members
        .iter()
        .filter(|x| !x.is_learner && !quorum::effective_ref(x, stale).is_healthy())
        .map(|x| x.display_name())
        .collect();
    (!down.is_empty()).then(|| down.join(", "))
}
