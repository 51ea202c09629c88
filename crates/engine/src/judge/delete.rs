//! The rules for deleting a control-plane Machine: etcd quorum after its member leaves, the
//! KCP's desired replicas, and voting members about to join while it goes.

use std::fmt;

use super::*;

/// The decision on deleting `m`, a Machine the caller holds by reference (no [`Operation`] to
/// build, so no Machine to clone). With `ask.words` [`Words::DenialsOnly`], only `allowed` may
/// be read of an allowed judgement.
pub(crate) fn judge_delete(ask: &Ask<'_>, m: &Machine) -> Judgement {
    let Ask {
        cp,
        requester,
        policy,
        ..
    } = *ask;
    let what = Named("Machine", &cp.kcp.namespace, &m.name);
    if !m.control_plane {
        return Judgement::allow(
            Reason::NotControlPlane,
            format!("{what} is not a control-plane Machine"),
        );
    }
    if m.deleting {
        return Judgement::allow(
            Reason::AlreadyDeleting,
            format!("{what} is already being deleted"),
        );
    }
    if cp.cluster.deleting {
        return Judgement::allow(
            Reason::ClusterDeleting,
            format!("Cluster {} is being deleted", cp.cluster.name),
        );
    }
    if cp.kcp.deleting {
        return Judgement::allow(
            Reason::ControlPlaneDeleting,
            format!("KubeadmControlPlane {} is being deleted", cp.kcp_shown()),
        );
    }
    if m.annotation(ANNOTATION_DELETE_FOR_MOVE).is_some() {
        return Judgement::allow(
            Reason::ClusterctlMove,
            format!("{what} is being moved by clusterctl ({ANNOTATION_DELETE_FOR_MOVE})"),
        );
    }
    if policy.is_teardown(requester) {
        return Judgement::allow(
            Reason::TeardownRequester,
            format!(
                "{} is a teardown identity; deletion of {what} is not blocked",
                requester.username
            ),
        );
    }
    let j = judge_delete_rules(ask, m);
    let break_glass = m.annotation(ANNOTATION_BREAK_GLASS).map(str::trim);
    match break_glass {
        Some(why) if !j.allowed && !why.is_empty() => {
            let mut out = Judgement::allow(
                Reason::BreakGlass,
                format!(
                    "{what}: break-glass annotation {ANNOTATION_BREAK_GLASS} ({why:?}) overrides the guard"
                ),
            );
            out.warnings.push(format!(
                "break-glass used on {what} ({why:?}); without it this would be denied ({}): {}",
                j.reason,
                one_line(&j.message)
            ));
            out.figures = j.figures;
            out
        }
        Some("") if !j.allowed => {
            let mut j = j;
            j.message.push_str(&format!(
                " The annotation {ANNOTATION_BREAK_GLASS} is present but empty: it needs a reason as its value to take effect."
            ));
            j
        }
        _ => j,
    }
}

/// The quorum rule, then the desired-replicas rule.
pub(super) fn judge_delete_rules(ask: &Ask<'_>, m: &Machine) -> Judgement {
    // The desired-replicas rule has its say only when quorum allows. Its numbers come first, so
    // that a quorum verdict it overrules is not worded for nothing.
    let shortfall = if ask.policy.is_controller(ask.requester) {
        None
    } else {
        replicas_shortfall(ask.cp, m)
    };
    let quorum_words = if shortfall.is_some() {
        Words::DenialsOnly
    } else {
        ask.words
    };
    let quorum_j = judge_delete_quorum(&ask.worded(quorum_words), m);
    match shortfall {
        Some(s) if quorum_j.allowed => s.denial(ask.cp, m).with_figures_opt(quorum_j.figures),
        _ => quorum_j,
    }
}

impl Judgement {
    fn with_figures_opt(mut self, f: Option<Figures>) -> Judgement {
        self.figures = f;
        self
    }
}

/// Deleting a Machine would leave fewer working control-plane Machines than spec.replicas.
pub(super) struct Shortfall {
    remaining: usize,
    desired: usize,
}

pub(super) fn replicas_shortfall(cp: &ControlPlane, m: &Machine) -> Option<Shortfall> {
    // A Machine whose node is up but whose member is gone (cluster-api #2651) is not a control
    // plane KCP can count on: it does not make up for the one being deleted.
    let observed = matches!(cp.etcd, EtcdState::Observed(_));
    let remaining = cp
        .machines
        .iter()
        .filter(|o| o.control_plane && !o.deleting && o.name != m.name)
        .filter(|o| !(observed && o.node_name.is_some() && cp.member_of(o).is_none()))
        .count();
    let desired = cp.kcp.replicas as usize;
    if remaining >= desired {
        return None;
    }
    let never_joined = m.node_name.is_none()
        && matches!(cp.etcd, EtcdState::Observed(_))
        && cp.member_of(m).is_none();
    if never_joined {
        return None;
    }
    Some(Shortfall { remaining, desired })
}

impl Shortfall {
    fn denial(&self, cp: &ControlPlane, m: &Machine) -> Judgement {
        let Shortfall { remaining, desired } = *self;
        let ns = &cp.kcp.namespace;
        let mut message = format!(
            "deleting Machine {ns}/{} would leave KubeadmControlPlane {} with {remaining} working control-plane Machines, fewer than its spec.replicas {desired}.\nWorking: with an etcd member, or still joining. KCP would have to create a replacement while this deletion is still pending. To replace this Machine safely, annotate it and let KCP do it: `kubectl annotate machine -n {ns} {} {ANNOTATION_REMEDIATE}=\"\"`",
            m.name,
            cp.kcp_shown(),
            m.name,
        );
        if let Some(to) = shrink_target(desired) {
            let tolerance = quorum::tolerance(to, to);
            message.push_str(&format!(
                "; to shrink the control plane, lower spec.replicas instead (KCP removes one Machine at a time; {to} members still tolerate {tolerance} failure{}): `kubectl scale kcp -n {ns} {} --replicas={to}`",
                if tolerance == 1 { "" } else { "s" },
                cp.kcp.name,
            ));
        }
        message.push('.');
        Judgement::deny(Reason::BelowDesiredReplicas, message)
    }
}

/// The smaller control plane a message may suggest instead of deleting a Machine of one with
/// `desired` replicas: two fewer (KCP's own webhook refuses even replica counts for stacked
/// etcd), and only while that keeps fault tolerance (3 members or more). Advice must never take
/// fault tolerance away: for 3 replicas (or 1) none is suggested, and remediation is the way.
pub(crate) fn shrink_target(desired: usize) -> Option<usize> {
    (desired >= 5).then(|| desired - 2)
}

/// Why a new voting member is about to join, which a deletion must be safe with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Joining {
    /// This Machine is new (within the join grace) and has no member yet.
    Machine(String),
    /// Without the Machine being deleted, fewer Machines than spec.replicas: KCP adds one.
    Replicas { machines: usize, replicas: u32 },
}

impl fmt::Display for Joining {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Joining::Machine(name) => {
                write!(f, "Machine {name} is new and has no etcd member yet")
            }
            Joining::Replicas { machines, replicas } => write!(
                f,
                "the other Machines number {machines}, fewer than spec.replicas {replicas}, so KCP adds one"
            ),
        }
    }
}

/// A voting member about to join the etcd of `ask.cp` while `m` is deleted: a young Machine without
/// a member (within `--join-grace`), or, for a person's deletion, fewer Machines than
/// spec.replicas without `m` (a scale-up admitted, or a replacement for `m`). A join already
/// under way is in the member list (an unstarted member, a learner) and counted there; KCP adds
/// one member at a time.
///
/// None where no join can raise the quorum while `m`'s member leaves:
/// - learner joins ([`crate::joins`]): a learner does not vote, and etcd promotes it only once it
///   is in sync, so a promotion adds a healthy voter (H+1 of V+1 never has less fault tolerance
///   than H of V);
/// - the KCP controller's own deletion and the replacement it would make for it: KCP creates no
///   Machine while one is being deleted (Cluster API v1.14 `controller.go` `reconcile`: a
///   deleting Machine ends the reconcile before `reconcileUnhealthyMachines` and the scale
///   operations; `scale.go` `preflightChecks` waits on deleting Machines too), and it remediates
///   before it scales up, so the replacement comes after this deletion, never before or between
///   its steps. A Machine it already created (young, without a member) still counts.
pub(super) fn pending_join(ask: &Ask<'_>, m: &Machine) -> Option<Joining> {
    let Ask {
        cp,
        requester,
        policy,
        now_unix,
        ..
    } = *ask;
    if cp.join_style() == JoinStyle::Learner {
        return None;
    }
    if cp
        .members()
        .iter()
        .any(|x| x.is_unstarted() || x.is_learner)
    {
        return None;
    }
    let others: Vec<&Machine> = cp
        .machines
        .iter()
        .filter(|o| o.control_plane && !o.deleting && o.name != m.name)
        .collect();
    let grace = i64::try_from(policy.join_grace.as_secs()).unwrap_or(i64::MAX);
    if let Some(o) = others.iter().find(|o| {
        cp.member_of(o).is_none()
            && o.created_unix
                .is_some_and(|c| now_unix.saturating_sub(c) < grace)
    }) {
        return Some(Joining::Machine(o.name.clone()));
    }
    if policy.is_controller(requester) {
        return None;
    }
    (others.len() < cp.kcp.replicas as usize).then_some(Joining::Replicas {
        machines: others.len(),
        replicas: cp.kcp.replicas,
    })
}

/// The voting members of Machines being deleted, tallied.
pub(super) fn leaving_tally(cp: &ControlPlane, stale: bool) -> Tally {
    Tally::of(
        cp.machines
            .iter()
            .filter(|m| m.deleting)
            .filter_map(|m| cp.member_of(m))
            .filter(|x| !x.is_learner),
        stale,
    )
}

/// The membership left after removing `removed` (worst case: the pessimistic view).
pub(super) fn minus(before: Tally, removed: Tally) -> Tally {
    Tally {
        healthy: before.healthy.saturating_sub(removed.healthy),
        unhealthy: before.unhealthy.saturating_sub(removed.unhealthy),
        unknown: before.unknown.saturating_sub(removed.unknown),
    }
}
