//! The rules that need no etcd member list: etcd quorumguard does not guard, and a teardown.

use super::{ActionCode, NextAction};
use crate::model::{ControlPlane, EtcdTopology};

/// The rules tried first, in order, before etcd's member list is read.
pub(super) const RULES: &[fn(&ControlPlane) -> Option<NextAction>] = &[external_etcd, teardown];

/// External etcd: nothing for quorumguard to do.
fn external_etcd(cp: &ControlPlane) -> Option<NextAction> {
    let kcp = cp.kcp_shown();
    (cp.kcp.etcd == EtcdTopology::External).then(|| {
        NextAction::new(
            ActionCode::None,
            format!(
                "No action needed: KubeadmControlPlane {kcp} uses external etcd, which quorumguard does not guard"
            ),
        )
    })
}

/// The Cluster or the KCP is being deleted: let the teardown finish.
fn teardown(cp: &ControlPlane) -> Option<NextAction> {
    let (kcp, ns) = (cp.kcp_shown(), &cp.kcp.namespace);
    (cp.cluster.deleting || cp.kcp.deleting).then(|| {
        NextAction::new(
            ActionCode::WaitForTeardown,
            format!(
                "Let the teardown finish: {} is being deleted",
                if cp.cluster.deleting {
                    format!("Cluster {ns}/{}", cp.cluster.name)
                } else {
                    format!("KubeadmControlPlane {kcp}")
                }
            ),
        )
    })
}
