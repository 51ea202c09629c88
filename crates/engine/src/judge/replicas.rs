//! The rules for changing a KCP: `spec.replicas` up or down (worst removal order first) and
//! a change that starts a rollout.

use super::*;

pub(super) fn judge_update(ask: &Ask<'_>, from: u32, to: u32, starts_rollout: bool) -> Judgement {
    let Ask { cp, policy, .. } = *ask;
    let kcp = cp.kcp_shown();
    if cp.cluster.deleting {
        return Judgement::allow(
            Reason::ClusterDeleting,
            format!("Cluster {} is being deleted", cp.cluster.name),
        );
    }
    if cp.kcp.deleting {
        return Judgement::allow(
            Reason::ControlPlaneDeleting,
            format!("KubeadmControlPlane {kcp} is being deleted"),
        );
    }
    if from != to
        && let Some(why) = kcp_refuses(cp.kcp.etcd, to)
    {
        return Judgement::deny(
            Reason::KcpRefusesReplicas,
            format!(
                "KCP's own webhook refuses spec.replicas {to} for KubeadmControlPlane {kcp}: {why}.\nIt refuses that count whatever etcd's health, so the change cannot happen. With stacked etcd KCP accepts odd counts only (1, 3, 5, ...)."
            ),
        );
    }
    if cp.kcp.etcd == EtcdTopology::External {
        return Judgement::allow(
            Reason::ExternalEtcd,
            format!("KubeadmControlPlane {kcp} uses external etcd: no stacked member to protect"),
        );
    }
    let mut j = if from == to {
        Judgement::allow(
            Reason::NoReplicaChange,
            format!("spec.replicas of KubeadmControlPlane {kcp} is unchanged ({to})"),
        )
    } else if let EtcdState::Unknown { .. } = cp.etcd {
        unknown_health(
            ask,
            &format!("changing spec.replicas of KubeadmControlPlane {kcp} from {from} to {to}"),
            &unknown_etcd_detail(cp),
            None,
        )
    } else if to < from {
        judge_scale_down(ask, from, to)
    } else {
        judge_scale_up(ask, from, to)
    };
    if starts_rollout && j.allowed {
        if j.reason == Reason::NoReplicaChange {
            j.reason = Reason::RolloutAllowed;
            j.message = format!("the change to KubeadmControlPlane {kcp} starts a rollout");
        }
        if let Some(w) = rollout_warning(cp, policy) {
            j.warnings.push(w);
        }
    }
    j
}

/// Why KCP's own webhook refuses `spec.replicas` `to`, if it does: Cluster API v1.14
/// `controlplane/kubeadm/internal/webhooks/kubeadm_control_plane.go`
/// `validateKubeadmControlPlaneSpec` (run by `ValidateCreate` and `ValidateUpdate`, the scale
/// subresource included) refuses replicas "less than or equal to 0", and replicas that are
/// "an even number when etcd is stacked" (no `clusterConfiguration.etcd.external`).
pub(super) fn kcp_refuses(etcd: EtcdTopology, to: u32) -> Option<&'static str> {
    if to == 0 {
        Some("spec.replicas \"cannot be less than or equal to 0\"")
    } else if to.is_multiple_of(2) && etcd == EtcdTopology::Stacked {
        Some("spec.replicas \"cannot be an even number when etcd is stacked\"")
    } else {
        None
    }
}

/// A warning when the rollout's first step (add one with maxSurge 1, delete one with maxSurge
/// 0) would not be safe now: KCP will wait until it is.
pub(super) fn rollout_warning(cp: &ControlPlane, policy: &Policy) -> Option<String> {
    let stale = is_stale(cp, policy);
    let before = Tally::of(cp.members(), stale);
    if matches!(cp.etcd, EtcdState::Unknown { .. }) {
        return Some(format!(
            "the rollout of KubeadmControlPlane {} starts while etcd health is unknown; quorumguard cannot say whether its first step is safe",
            cp.kcp_shown()
        ));
    }
    if cp.kcp.max_surge >= 1 && cp.join_style() == JoinStyle::Learner {
        // A learner join cannot lose quorum (see `judge_scale_up_learner`); what holds the
        // rollout is KCP's preflight, which waits for every member to be healthy.
        return (before.healthy < before.voting()).then(|| {
            format!(
                "the rollout of KubeadmControlPlane {} starts by adding a member (maxSurge 1; joins here are {}: a learner cannot lose quorum), and KCP adds it only once every etcd member is healthy (voting {}, healthy {}): it will not make progress until then.{}",
                cp.kcp_shown(),
                cp.joins(),
                before.voting(),
                before.healthy,
                not_healthy_list(cp, stale)
            )
        });
    }
    let (step, safety) = if cp.kcp.max_surge >= 1 {
        (
            "adding a new member (maxSurge 1)".to_string(),
            if before.voting() == 1 {
                Safety::Safe
            } else {
                quorum::addition(before)
            },
        )
    } else {
        let one_healthy = Tally {
            healthy: 1,
            ..Tally::default()
        };
        (
            "removing a member first (maxSurge 0)".to_string(),
            quorum::removal(before, one_healthy),
        )
    };
    (safety != Safety::Safe).then(|| {
        format!(
            "the rollout of KubeadmControlPlane {} starts with {step}, which is not safe right now (voting {}, healthy {}, quorum {}); KCP will not make progress until etcd is healthy.{}",
            cp.kcp_shown(),
            before.voting(),
            before.healthy,
            quorum(before.voting()),
            not_healthy_list(cp, stale)
        )
    })
}

/// How the health of a member is counted when picking the worst removal order.
pub(super) fn worst_first_rank(h: HealthRef<'_>) -> u8 {
    match h {
        HealthRef::Healthy => 0,
        HealthRef::Unknown(_) => 1,
        HealthRef::Unhealthy(_) => 2,
    }
}

pub(super) fn judge_scale_down(ask: &Ask<'_>, from: u32, to: u32) -> Judgement {
    let Ask { cp, policy, .. } = *ask;
    let kcp = cp.kcp_shown();
    let what = format!(
        "scaling KubeadmControlPlane {kcp} from {from} to {}",
        super::replicas(to)
    );
    let stale = is_stale(cp, policy);
    let before = Tally::of(cp.members(), stale);
    let active: Vec<&Machine> = cp
        .machines
        .iter()
        .filter(|m| m.control_plane && !m.deleting)
        .collect();
    let k = active.len().saturating_sub(to as usize);
    // KCP removes machines annotated delete-machine first; assume the worst for the rest.
    let mut candidates: Vec<(bool, u8, &Machine, Option<&Member>)> = active
        .iter()
        .map(|m| {
            let member = cp.member_of(m).filter(|x| !x.is_learner);
            let rank = member.map_or(3, |x| worst_first_rank(quorum::effective_ref(x, stale)));
            (
                m.annotation(ANNOTATION_DELETE_MACHINE).is_none(),
                rank,
                *m,
                member,
            )
        })
        .collect();
    candidates.sort_by(|a, b| (a.0, a.1, &a.2.name).cmp(&(b.0, b.1, &b.2.name)));
    let mut removed = Tally::default();
    let mut removed_names = Vec::new();
    for (_, _, m, member) in candidates.iter().take(k) {
        if let Some(x) = member {
            removed.count(quorum::effective_ref(x, stale));
        }
        removed_names.push(m.name.clone());
    }
    // Members of Machines already being deleted leave as well.
    let leaving = leaving_tally(cp, stale);
    removed.healthy += leaving.healthy;
    removed.unhealthy += leaving.unhealthy;
    removed.unknown += leaving.unknown;
    let after = minus(before, removed);
    let figures = Figures::new(before, after);
    let problems = not_healthy_list(cp, stale);
    if quorum::raft_quorum_lost(cp.members(), stale) {
        return Judgement::deny(
            Reason::QuorumLost,
            format!(
                "{what} is refused: etcd has lost quorum.\n{}.{problems} Restore quorum first (restore etcd from a snapshot).",
                figures.shown()
            ),
        )
        .with_figures(figures);
    }
    let quorum_of_target = quorum(to as usize);
    let safety = match quorum::removal(before, removed) {
        Safety::Safe if after.healthy >= quorum_of_target => Safety::Safe,
        Safety::Safe | Safety::Unknown if after.optimistic() >= quorum_of_target => Safety::Unknown,
        _ => Safety::Unsafe,
    };
    let which = match removed_names.as_slice() {
        [] => "no Machine".to_string(),
        [one] => format!("Machine {one}"),
        many => format!("Machines {}", many.join(", ")),
    };
    match safety {
        Safety::Safe => Judgement::allow(
            Reason::ScaleDownSafe,
            format!(
                "{what} keeps etcd quorum even in the worst case (KCP removes {which}); {}",
                figures.shown()
            ),
        )
        .with_figures(figures),
        Safety::Unsafe => Judgement::deny(
            Reason::ScaleDownWouldLoseQuorum,
            format!(
                "{what} could lose etcd quorum.\nIn the worst case KCP removes {which}, leaving {} healthy of {} voting members, quorum {} (and {quorum_of_target} for {}); {}.{problems} Make the unhealthy members healthy or remediate them first, or annotate the Machines to remove with {ANNOTATION_DELETE_MACHINE}.",
                after.healthy,
                after.voting(),
                quorum(after.voting()),
                super::replicas(to),
                figures.shown()
            ),
        )
        .with_figures(figures),
        Safety::Unknown => unknown_health(
            ask,
            &what,
            &format!("{}.{problems}", figures.shown()),
            Some(figures),
        ),
    }
}

pub(super) fn judge_scale_up(ask: &Ask<'_>, from: u32, to: u32) -> Judgement {
    let Ask { cp, policy, .. } = *ask;
    if cp.join_style() == JoinStyle::Learner {
        return judge_scale_up_learner(cp, from, to, policy);
    }
    let kcp = cp.kcp_shown();
    let what = format!(
        "scaling KubeadmControlPlane {kcp} from {from} to {}",
        super::replicas(to)
    );
    let stale = is_stale(cp, policy);
    let before = Tally::of(cp.members(), stale);
    let after = Tally {
        unhealthy: before.unhealthy + 1,
        ..before
    };
    let figures = Figures::new(before, after);
    let problems = not_healthy_list(cp, stale);
    if quorum::raft_quorum_lost(cp.members(), stale) {
        return Judgement::deny(
            Reason::QuorumLost,
            format!(
                "{what} is refused: etcd has lost quorum.\n{}.{problems} A new member cannot join; restore quorum first (restore etcd from a snapshot).",
                figures.shown()
            ),
        )
        .with_figures(figures);
    }
    // Members of Machines already being deleted may leave before the new member joins (KCP
    // waits for deletions to finish before it scales): the addition must also be safe after
    // the healthy (or unknown) ones among them have gone, the worst order. Unhealthy ones
    // leaving only help, and a single member left may still grow, as below.
    let leaving = leaving_tally(cp, stale);
    let worst = minus(
        before,
        Tally {
            unhealthy: 0,
            ..leaving
        },
    );
    let after_leaving = quorum::addition(worst);
    if after_leaving != Safety::Safe
        && !(worst.voting() == 1 && worst.healthy == 1)
        && quorum::addition(before) == Safety::Safe
    {
        let figures = Figures::new(
            worst,
            Tally {
                unhealthy: worst.unhealthy + 1,
                ..worst
            },
        );
        let detail = format!(
            "{what} could lose etcd quorum while the first new member joins.\nOnce the members of the Machines being deleted ({} healthy, {} unknown) have left: {}.{problems}",
            leaving.healthy,
            leaving.unknown,
            figures.shown()
        );
        return match after_leaving {
            Safety::Unknown => unknown_health(ask, &what, &detail, Some(figures)),
            _ => Judgement::deny(
                Reason::ScaleUpWouldLoseQuorum,
                format!("{detail} Wait for those deletions to finish, then scale."),
            )
            .with_figures(figures),
        };
    }
    if before.voting() == 1 && before.healthy == 1 {
        let mut j = Judgement::allow(
            Reason::SingleMemberScaleUp,
            format!(
                "{what}: a single-member etcd can only grow by adding a member; {}",
                figures.shown()
            ),
        )
        .with_figures(figures);
        j.warnings.push(format!(
            "while the second member of KubeadmControlPlane {kcp} joins, etcd needs both members: it is unavailable until the join completes"
        ));
        return j;
    }
    match quorum::addition(before) {
        Safety::Safe => Judgement::allow(
            Reason::ScaleUpSafe,
            format!(
                "{what}: the new member joins while quorum holds; {}",
                figures.shown()
            ),
        )
        .with_figures(figures),
        Safety::Unsafe => Judgement::deny(
            Reason::ScaleUpWouldLoseQuorum,
            format!(
                "{what} would lose etcd quorum while the first new member joins.\nIt counts as a voting member before it is healthy; {}.{problems} Make every member healthy (or remediate the unhealthy one) first, then scale.",
                figures.shown()
            ),
        )
        .with_figures(figures),
        Safety::Unknown => unknown_health(
            ask,
            &what,
            &format!("{}.{problems}", figures.shown()),
            Some(figures),
        ),
    }
}

/// A scale-up where joins add learners ([`crate::joins`]): a learner does not vote, and etcd
/// promotes it only once it is in sync, as a healthy voter, so no step of the join can lose
/// quorum (H+1 of V+1 tolerates as many failures as H of V, or one more). Refused only when
/// etcd has lost quorum, where no member can be added at all. With a member not known healthy
/// the scale-up is allowed and says what holds it: KCP's preflight waits for every member to
/// be healthy (Cluster API v1.14 `scale.go` `preflightChecks`), and etcd's strict
/// reconfiguration check refuses to add a member while the leader is not connected to every
/// voting member (etcd `mayAddMember`; docs/rules.md has the versions).
fn judge_scale_up_learner(cp: &ControlPlane, from: u32, to: u32, policy: &Policy) -> Judgement {
    let kcp = cp.kcp_shown();
    let what = format!(
        "scaling KubeadmControlPlane {kcp} from {from} to {}",
        super::replicas(to)
    );
    let stale = is_stale(cp, policy);
    let before = Tally::of(cp.members(), stale);
    let figures = Figures::new(before, before);
    let problems = not_healthy_list(cp, stale);
    let joins = cp.joins();
    if quorum::raft_quorum_lost(cp.members(), stale) {
        return Judgement::deny(
            Reason::QuorumLost,
            format!(
                "{what} is refused: etcd has lost quorum.\n{}.{problems} etcd adds no member without quorum; restore quorum first (bring the stopped members back if their data is intact, otherwise restore etcd from a snapshot).",
                figures.shown()
            ),
        )
        .with_figures(figures);
    }
    let mut j = Judgement::allow(
        Reason::ScaleUpSafe,
        format!(
            "{what}: joins here are {joins}: a learner does not vote until etcd promotes it in sync, so the join cannot lose quorum; {}",
            figures.shown()
        ),
    )
    .with_figures(figures);
    if before.healthy < before.voting() {
        j.warnings.push(format!(
            "KCP will not add the new Machine of KubeadmControlPlane {kcp} until every etcd member is healthy (its preflight), and etcd refuses to add a member while a voting member is disconnected (its strict reconfiguration check): the scale-up waits until the members not known healthy are back or remediated.{problems}"
        ));
    }
    j
}
