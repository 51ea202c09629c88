//! The rules on remediation: a remediation the guard refuses KCP, and a Machine KCP should
//! replace.

use std::fmt;

use super::learners::caught_up;
use super::{ActionCode, Ctx, NextAction, allowed, controller, etcd::not_healthy_names};
use crate::judge::{Ask, Reason, Words, judge_delete};
use crate::model::{ANNOTATION_REMEDIATE, HealthRef, Machine, Member, Unfit};
use crate::quorum;
use crate::remediation;

/// What is wrong with a Machine KCP should replace.
enum Problem<'a> {
    NoMember,
    Unhealthy(Unfit<'a>),
    /// A learner past `--learner-grace` that has not caught up with the leader.
    StalledLearner(&'a Member),
}

impl fmt::Display for Problem<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NoMember => f.write_str("has no etcd member"),
            Problem::Unhealthy(e) => write!(f, "has an unhealthy etcd member ({e})"),
            Problem::StalledLearner(l) => write!(
                f,
                "has an etcd learner ({}, id {}) that is past --learner-grace and has not caught up with the leader (its raft index is below 90% of the leader's, so etcd refuses to promote it)",
                l.shown_name(),
                l.id,
            ),
        }
    }
}

/// KCP remediates a Machine whose deletion the guard refuses for good: what unblocks KCP.
///
/// Cluster API v1.14 remediates before anything else, ends its reconcile when the API server
/// refuses a remediation's deletion (`remediation.go` returns the error), then tries the same
/// one again: a remediation the guard refuses holds KCP for ever. Name what unblocks it, never
/// a wait. KCP picks among the Machines marked for remediation the sickest first, then the
/// oldest ([`crate::kcp::reconcile`]). A refusal that waits for a join (`PendingJoin`: voting
/// joins, a new Machine joining) ends with that join or with `--join-grace`, and is left to
/// the waits after this rule.
pub(super) fn refused_remediation(ctx: &Ctx) -> Option<NextAction> {
    let (cp, active, tally, stale) = (ctx.cp, &ctx.active, ctx.tally, ctx.stale);
    let (policy, now_unix) = (ctx.policy, ctx.now_unix);
    let kcp_healthy = |m: &Machine| {
        cp.member_of(m).is_some_and(|x| {
            !x.is_learner && x.alarms.is_empty() && quorum::effective_ref(x, stale).is_healthy()
        })
    };
    // v1.14 remediates nothing with a single Machine (`remediation.go`
    // `reconcileUnhealthyMachines`: `Machines.Len() <= 1` goes on to scale).
    if cp.machines.len() <= 1 {
        return None;
    }
    // KCP remediates only what a MachineHealthCheck marked: an annotation none passes on holds
    // nothing.
    let m = active
        .iter()
        .copied()
        .filter(|m| m.annotation(ANNOTATION_REMEDIATE).is_some())
        .filter(|m| remediation::may_remediate(cp, m))
        .min_by_key(|m| kcp_healthy(m))?;
    let j = judge_delete(
        &Ask::new(cp, &controller(policy), policy, now_unix, Words::All),
        m,
    );
    if j.allowed || j.reason == Reason::PendingJoin {
        return None;
    }
    let ns = &cp.kcp.namespace;
    let first = match not_healthy_names(cp.members(), stale) {
        Some(down) => format!(
            "Bring back etcd on {down} (then KCP's retry succeeds), or take the remediation request of Machine {ns}/{} back so that KCP can go on",
            m.name
        ),
        None => format!(
            "Take the remediation request of Machine {ns}/{} back so that KCP can go on",
            m.name
        ),
    };
    let cmd = format!(
        "kubectl annotate machine -n {ns} {} {ANNOTATION_REMEDIATE}-",
        m.name
    );
    // A sicker Machine KCP may replace instead: marked, it is KCP's first pick.
    let ctl = controller(policy);
    let sicker = active
        .iter()
        .filter(|o| o.name != m.name && o.annotation(ANNOTATION_REMEDIATE).is_none())
        .filter(|o| remediation::may_remediate(cp, o))
        .find(|o| {
            cp.member_of(o).is_some_and(|x| {
                matches!(quorum::effective_ref(x, stale), HealthRef::Unhealthy(_))
            }) && allowed(cp, o, &ctl, policy, now_unix)
        })
        .map_or(String::new(), |o| {
            format!(
                " Or ask KCP to replace Machine {ns}/{} first, whose member is unhealthy (KCP takes the sickest Machine first): `kubectl annotate machine -n {ns} {} {ANNOTATION_REMEDIATE}=\"\"`.",
                o.name, o.name
            )
        });
    Some(
        NextAction::new(
            ActionCode::CheckEtcdHealth,
            format!(
                "{first}: `{cmd}`. KCP is remediating Machine {ns}/{} and quorumguard refuses that deletion ({}: {} healthy of {} voting members, quorum {}); KCP retries it and does nothing else until it succeeds.{sicker}",
                m.name,
                j.reason,
                tally.healthy,
                tally.voting(),
                quorum::quorum(tally.voting()),
            ),
        )
        .with(m.name.clone(), Some(cmd)),
    )
}

/// A Machine KCP should replace and may delete: ask KCP to replace it (or enable remediation).
pub(super) fn remediate(ctx: &Ctx) -> Option<NextAction> {
    let (cp, ns, clock, policy, now_unix) = (ctx.cp, ctx.ns, &ctx.clock, ctx.policy, ctx.now_unix);
    let (active, members, tally, stale) = (&ctx.active, ctx.members, ctx.tally, ctx.stale);
    // A Machine whose member is unhealthy, a stalled learner, or that never got a member: KCP
    // replaces it, if a MachineHealthCheck passes the remediation on. The first such Machine
    // that none would pass on is named only when no other can be replaced.
    let mut ctl = None;
    let mut unremediable = None;
    for m in active {
        let problem = match cp.member_of(m) {
            None => Some(Problem::NoMember),
            Some(x) => match quorum::effective_ref(x, stale) {
                HealthRef::Unhealthy(e) => Some(Problem::Unhealthy(e)),
                HealthRef::Healthy
                    if x.is_learner && !clock.learning(m) && !caught_up(x, members) =>
                {
                    Some(Problem::StalledLearner(x))
                }
                _ => None,
            },
        };
        if let Some(problem) = problem
            && allowed(
                cp,
                m,
                ctl.get_or_insert_with(|| controller(policy)),
                policy,
                now_unix,
            )
        {
            if let Some(missing) = remediation::missing(cp, m) {
                unremediable.get_or_insert((*m, problem, missing));
                continue;
            }
            let cmd = format!(
                "kubectl annotate machine -n {ns} {} {ANNOTATION_REMEDIATE}=\"\"",
                m.name
            );
            return Some(NextAction::new(
                ActionCode::RemediateMachine,
                format!(
                    "Ask KCP to replace Machine {ns}/{}, which {problem} (remediation keeps etcd quorum: {} healthy of {} voting members, quorum {}).",
                    m.name,
                    tally.healthy,
                    tally.voting(),
                    quorum::quorum(tally.voting())
                ),
            )
            .with(m.name.clone(), Some(cmd))
            .unless_known(cp, m));
        }
    }
    if let Some((m, problem, (missing, cmd))) = unremediable {
        return Some(
            NextAction::new(
                ActionCode::EnableRemediation,
                format!(
                    "Machine {ns}/{} {problem}: KCP should replace it, but {missing}",
                    m.name
                ),
            )
            .with(m.name.clone(), cmd),
        );
    }
    None
}
