//! A paused Cluster or KCP: an action KCP or a MachineHealthCheck must carry out becomes
//! `Unpause`; any other action says that what follows it waits too.

use super::{ActionCode, NextAction};
use crate::model::{ANNOTATION_PAUSED, ControlPlane, Paused};
use crate::remediation;

impl ActionCode {
    /// Whether the action is carried out, or its wait ended, by KCP, a MachineHealthCheck or
    /// the Machine controller: none of them acts on a paused Cluster or KCP (Cluster API v1.14
    /// `util/paused/paused.go` `EnsurePausedCondition`, called first by the KCP and
    /// MachineHealthCheck reconcilers; `annotations.IsPaused`). The etcdctl actions
    /// (`RemoveOrphanMember`, `PromoteLearner`, `FreeSpace`), etcd's own recovery and kubeadm's
    /// joins and promotions need none of them.
    fn needs_reconcilers(self) -> bool {
        matches!(
            self,
            ActionCode::WaitForTeardown
                | ActionCode::DeleteMachine
                | ActionCode::WaitForDeletion
                | ActionCode::RemediateMachine
                | ActionCode::EnableRemediation
                | ActionCode::WaitForRollout
        )
    }
}

/// The action `a`, found as if nothing were paused, as it stands on `cp`, which may be paused.
pub(super) fn when_paused(cp: &ControlPlane, mut a: NextAction) -> NextAction {
    match cp.paused() {
        Some(paused) if a.code.needs_reconcilers() => unpause(cp, paused, a),
        // Still the action, but whatever its message says KCP does afterwards waits too.
        Some(paused) if a.code != ActionCode::None => {
            a.message.push_str(&format!(
                " Meanwhile {}: KCP and its MachineHealthChecks act on nothing until it is unpaused (`clusterctl move` pauses it on purpose while it moves the Cluster).",
                remediation::paused_words(cp, paused)
            ));
            a
        }
        _ => a,
    }
}

/// `Unpause`, with `then` (what KCP or a MachineHealthCheck would do) as what follows.
fn unpause(cp: &ControlPlane, paused: Paused, then: NextAction) -> NextAction {
    let ns = &cp.kcp.namespace;
    let what = remediation::paused_words(cp, paused);
    let cmd = match paused {
        Paused::Cluster | Paused::Both => format!(
            "kubectl patch cluster -n {ns} {} --type merge -p '{{\"spec\":{{\"paused\":false}}}}'",
            cp.cluster.name
        ),
        Paused::Kcp => format!(
            "kubectl annotate kubeadmcontrolplane -n {ns} {} {ANNOTATION_PAUSED}-",
            cp.kcp.name
        ),
    };
    let also = if paused == Paused::Both {
        format!(
            " (and the KubeadmControlPlane's annotation: `kubectl annotate kubeadmcontrolplane -n {ns} {} {ANNOTATION_PAUSED}-`)",
            cp.kcp.name
        )
    } else {
        String::new()
    };
    NextAction {
        code: ActionCode::Unpause,
        message: format!(
            "Unpause the control plane, unless `clusterctl move` is moving it: {what}, so KCP, its MachineHealthChecks and the Machine controller do nothing. `clusterctl move` pauses the Cluster on purpose and unpauses it on the target management cluster when done: unpause only when no move is in progress: `{cmd}`{also}. After that, {}: {}",
            then.code, then.message
        ),
        command: Some(cmd),
        target: then.target,
    }
}
