//! One reconcile of the KubeadmControlPlane controller, as pure code: what KCP does next with a
//! control plane, given what it reads of its Machines and their etcd members.
//!
//! This is the one model of KCP that quorumguard has. `preflight` ([`crate::rollout`]) plays a
//! rollout with it, step by step; the protocol model check (`tests/slow/model/`) explores every
//! interleaving of it with joins, failures, the guard and people; the playground's simulated KCP
//! (`crates/playground/src/kcp.rs`) carries out its moves on a real etcd through the real
//! webhook. So the model check verifies what `preflight` predicts, and the playground shows it on
//! real etcd.
//!
//! What it follows, from Cluster API v1.14 (`controlplane/kubeadm/internal/controllers/`:
//! `controller.go`, `scale.go`, `remediation.go`, `upgrade.go`):
//! - A Machine being deleted holds everything: KCP waits for the deletion to finish.
//! - Remediation comes first: a Machine marked for remediation (the
//!   `cluster.x-k8s.io/remediate-machine` annotation) is deleted, the sickest first; see
//!   [`Reconcile::remediate`] for what a refusal does.
//! - Scaling: fewer Machines than `spec.replicas` scales up; more scales down. A rollout (some
//!   Machine outdated) with `rollingUpdate.maxSurge` 1 scales up to replicas + 1 first, then down;
//!   with maxSurge 0 it scales down first, then up.
//! - The scale-down victim: an outdated Machine annotated `cluster.x-k8s.io/delete-machine`,
//!   then any so annotated, then the oldest outdated, then the oldest.
//! - Preflight before any scale operation: every Machine has its node, and its etcd member is
//!   healthy, voting and started; the scale-down victim is left out of that check, as KCP does.
//!   A member that no Machine claims holds it too (KCP's etcd health check marks the cluster
//!   unhealthy; see docs/kcp-model.md for where this differs from v1.14's code).
//!
//! What it leaves out: failure domains (KCP spreads Machines over them; the victim here is the
//! oldest), in-place updates, the remediation retry period and `maxRetry`, the control-plane
//! components' pod conditions (API server, controller manager, scheduler, etcd pod) and the
//! certificate-expiry rollout. docs/kcp-model.md lists them.

/// What KCP's etcd health check says of one Machine's member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemberFit {
    /// Started, voting, healthy.
    Healthy,
    /// No member of the Machine's name in etcd's member list.
    Missing,
    /// Listed but not healthy: down, frozen, an alarm, or never started.
    Unhealthy,
    /// Still a learner (not promoted).
    Learner,
}

/// One control-plane Machine as KCP's reconcile reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KcpMachine {
    /// The caller's handle for it. Lower keys are older Machines.
    pub key: u32,
    /// Its version differs from the KCP's: a rollout replaces it.
    pub outdated: bool,
    /// `status.nodeRef` is set.
    pub node: bool,
    pub deleting: bool,
    /// Marked for remediation (`cluster.x-k8s.io/remediate-machine`).
    pub remediate: bool,
    /// Annotated `cluster.x-k8s.io/delete-machine`: preferred by a scale-down.
    pub delete_first: bool,
    pub member: MemberFit,
}

/// What KCP reads of one control plane.
#[derive(Clone, Copy, Debug)]
pub struct KcpView<'a> {
    pub replicas: u32,
    /// `spec.rollout.strategy.rollingUpdate.maxSurge`: 1 adds before deleting, 0 deletes first.
    pub max_surge: u32,
    /// Oldest first.
    pub machines: &'a [KcpMachine],
    /// etcd members that no Machine claims (an orphan, or a join that never registered).
    pub orphan_members: u32,
}

/// Why KCP's preflight holds a scale operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hold {
    /// A Machine is being deleted: KCP waits for the deletion to finish.
    Deleting(u32),
    /// A Machine has no node yet (it is joining, or its join stopped).
    NoNode(u32),
    /// A Machine's etcd member is not healthy, voting and started.
    Member(u32, MemberFit),
    /// etcd lists members that no Machine claims.
    OrphanMembers(u32),
}

/// What KCP does after its remediation (or instead of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KcpMove {
    /// Machines match `spec.replicas` and none is outdated.
    Converged,
    /// A scale operation is due, and the preflight holds it.
    Wait(Hold),
    /// Create a Machine (of the KCP's version).
    ScaleUp,
    /// Delete this Machine.
    ScaleDown(u32),
}

/// One reconcile: the remediation to try first, then the move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reconcile {
    /// Delete this Machine to remediate it. When the deletion is refused by the API server (the
    /// guard's denial), v1.14 ends its reconcile with the error and tries the same remediation
    /// next time, so nothing else moves: `preflight` and the model check play it so. When
    /// KCP's own checks hold a remediation back it goes on with [`Reconcile::then`]; of those
    /// checks only "more than one Machine" is here (docs/kcp-model.md).
    pub remediate: Option<u32>,
    pub then: KcpMove,
}

/// KCP's next reconcile of `v`.
pub fn reconcile(v: &KcpView<'_>) -> Reconcile {
    if let Some(m) = v.machines.iter().find(|m| m.deleting) {
        return Reconcile {
            remediate: None,
            then: KcpMove::Wait(Hold::Deleting(m.key)),
        };
    }
    // The sickest first: a Machine whose member is not healthy before one merely annotated.
    // None with one Machine or none: v1.14's `reconcileUnhealthyMachines` (remediation.go)
    // skips remediation while `controlPlane.Machines.Len() <= 1` and goes on to scale.
    let remediate = v
        .machines
        .iter()
        .filter(|m| m.remediate && v.machines.len() > 1)
        .min_by_key(|m| (m.member == MemberFit::Healthy, m.key))
        .map(|m| m.key);
    Reconcile {
        remediate,
        then: scale(v),
    }
}

/// The scale operation due, with its preflight.
fn scale(v: &KcpView<'_>) -> KcpMove {
    let count = v.machines.len();
    let replicas = v.replicas as usize;
    let outdated = v.machines.iter().any(|m| m.outdated);
    let surge = v.max_surge.min(1) as usize;
    if count < replicas || (outdated && count < replicas + surge) {
        return match preflight(v, None) {
            Some(hold) => KcpMove::Wait(hold),
            None => KcpMove::ScaleUp,
        };
    }
    if count > replicas || (outdated && count == replicas && surge == 0) {
        let Some(victim) = victim(v.machines) else {
            return KcpMove::Converged;
        };
        return match preflight(v, Some(victim)) {
            Some(hold) => KcpMove::Wait(hold),
            None => KcpMove::ScaleDown(victim),
        };
    }
    KcpMove::Converged
}

/// The Machine a scale-down deletes.
pub fn victim(machines: &[KcpMachine]) -> Option<u32> {
    let pick = |f: &dyn Fn(&KcpMachine) -> bool| machines.iter().find(|m| f(m)).map(|m| m.key);
    pick(&|m| m.outdated && m.delete_first)
        .or_else(|| pick(&|m| m.delete_first))
        .or_else(|| pick(&|m| m.outdated))
        .or_else(|| machines.first().map(|m| m.key))
}

/// What holds a scale operation, leaving the scale-down victim out of the per-Machine checks.
fn preflight(v: &KcpView<'_>, except: Option<u32>) -> Option<Hold> {
    let checked = v.machines.iter().filter(|m| Some(m.key) != except);
    for m in checked {
        if !m.node {
            return Some(Hold::NoNode(m.key));
        }
        if m.member != MemberFit::Healthy {
            return Some(Hold::Member(m.key, m.member));
        }
    }
    (v.orphan_members > 0).then_some(Hold::OrphanMembers(v.orphan_members))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(key: u32, outdated: bool) -> KcpMachine {
        KcpMachine {
            key,
            outdated,
            node: true,
            deleting: false,
            remediate: false,
            delete_first: false,
            member: MemberFit::Healthy,
        }
    }

    fn view(replicas: u32, max_surge: u32, machines: &[KcpMachine]) -> Reconcile {
        reconcile(&KcpView {
            replicas,
            max_surge,
            machines,
            orphan_members: 0,
        })
    }

    #[test]
    fn a_rollout_with_max_surge_one_adds_before_it_deletes() {
        let ms = [m(0, true), m(1, true), m(2, true)];
        assert_eq!(view(3, 1, &ms).then, KcpMove::ScaleUp);
        let ms = [m(0, true), m(1, true), m(2, true), m(3, false)];
        assert_eq!(view(3, 1, &ms).then, KcpMove::ScaleDown(0));
        let ms = [m(1, true), m(2, false), m(3, false)];
        assert_eq!(view(3, 1, &ms).then, KcpMove::ScaleUp);
        let ms = [m(2, false), m(3, false), m(4, false)];
        assert_eq!(view(3, 1, &ms).then, KcpMove::Converged);
    }

    #[test]
    fn a_rollout_with_max_surge_zero_deletes_before_it_adds() {
        let ms = [m(0, true), m(1, true), m(2, true)];
        assert_eq!(view(3, 0, &ms).then, KcpMove::ScaleDown(0));
        let ms = [m(1, true), m(2, true)];
        assert_eq!(view(3, 0, &ms).then, KcpMove::ScaleUp);
    }

    #[test]
    fn the_preflight_holds_on_a_sick_member_but_not_the_victims() {
        let mut ms = [m(0, true), m(1, true), m(2, true)];
        ms[1].member = MemberFit::Unhealthy;
        assert_eq!(
            view(3, 1, &ms).then,
            KcpMove::Wait(Hold::Member(1, MemberFit::Unhealthy))
        );
        // Four Machines for three replicas: the victim (the oldest outdated) may be sick.
        let mut ms = [m(0, true), m(1, true), m(2, true), m(3, true)];
        ms[0].member = MemberFit::Unhealthy;
        assert_eq!(view(3, 1, &ms).then, KcpMove::ScaleDown(0));
        ms[0].member = MemberFit::Healthy;
        ms[3].node = false;
        assert_eq!(view(3, 1, &ms).then, KcpMove::Wait(Hold::NoNode(3)));
    }

    #[test]
    fn a_deletion_holds_everything_and_remediation_comes_first() {
        let mut ms = [m(0, false), m(1, false), m(2, false)];
        ms[2].deleting = true;
        let r = view(3, 1, &ms);
        assert_eq!(r.then, KcpMove::Wait(Hold::Deleting(2)));
        assert_eq!(r.remediate, None);
        let mut ms = [m(0, false), m(1, false), m(2, false)];
        ms[0].remediate = true;
        ms[2].remediate = true;
        ms[2].member = MemberFit::Missing;
        let r = view(3, 1, &ms);
        assert_eq!(r.remediate, Some(2));
        assert_eq!(r.then, KcpMove::Converged);
    }

    #[test]
    fn one_machine_is_not_remediated_kcp_scales_instead() {
        // v1.14 remediation.go: "the number of current replicas is less or equal to 1.
        // Skipping remediation", and the reconcile goes on to scale.
        let mut ms = [m(0, false)];
        ms[0].remediate = true;
        let r = view(3, 1, &ms);
        assert_eq!(r.remediate, None);
        assert_eq!(r.then, KcpMove::ScaleUp);
    }

    #[test]
    fn the_victim_prefers_the_delete_machine_annotation() {
        let mut ms = [m(0, true), m(1, false), m(2, true), m(3, false)];
        assert_eq!(victim(&ms), Some(0));
        ms[3].delete_first = true;
        assert_eq!(victim(&ms), Some(3));
        ms[2].delete_first = true;
        assert_eq!(victim(&ms), Some(2));
    }

    #[test]
    fn orphan_members_hold_a_scale_operation() {
        let ms = [m(0, true), m(1, true), m(2, true)];
        let r = reconcile(&KcpView {
            replicas: 3,
            max_surge: 1,
            machines: &ms,
            orphan_members: 1,
        });
        assert_eq!(r.then, KcpMove::Wait(Hold::OrphanMembers(1)));
    }
}
