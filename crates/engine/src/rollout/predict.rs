//! The prediction: the play run on a copy of the control plane, judged (ready, would stick,
//! unsafe, cannot judge), with the one-more-failure column and what clears it.

use super::play::{End, Sim};
use super::report::{Counts, OneFailure, Preflight, Readiness, ReadyReason, RolloutStep};
use super::words::{margin, one_failure_sentence};
use crate::model::*;
use crate::next_action::{ActionCode, NextAction, next_action};

/// Predicts the rollout a version change would start on `cp`, as of `now_unix`, with what one
/// more member failure at each step would lead to.
pub fn preflight(cp: &ControlPlane, policy: &Policy, now_unix: i64) -> Preflight {
    predict(cp, policy, now_unix, true, None)
}

/// [`preflight`] without the one-more-failure column (each step's [`RolloutStep::one_failure`]
/// is `None`): the same readiness, reason and steps at a fraction of the cost, for a fleet's
/// every sweep (the failure column plays the rest of the rollout again after every step).
pub fn readiness(cp: &ControlPlane, policy: &Policy, now_unix: i64) -> Preflight {
    predict(cp, policy, now_unix, false, None)
}

/// [`readiness`] of a control plane whose own next action (`next_action(cp, policy, now_unix)`)
/// the caller has already worked out: the prediction reuses it rather than working it out
/// again (the status enricher's snapshot of each KCP, once per sweep).
pub fn readiness_given(
    cp: &ControlPlane,
    next: &NextAction,
    policy: &Policy,
    now_unix: i64,
) -> Preflight {
    predict(cp, policy, now_unix, false, Some(next))
}

/// `next`, when given, is `cp`'s own next action.
fn predict(
    cp: &ControlPlane,
    policy: &Policy,
    now_unix: i64,
    failures: bool,
    next: Option<&NextAction>,
) -> Preflight {
    let own = || {
        next.cloned()
            .unwrap_or_else(|| next_action(cp, policy, now_unix))
    };
    if let Some(p) = cannot_play(cp, policy, own) {
        return p;
    }
    let start = Counts::of(cp.members());
    let sim = Sim::new(cp, policy, now_unix);
    let (steps, end, last) = sim.clone().play(failures);
    let total = sim.ideal().play(false).0.len().max(steps.len());
    let (readiness, reason, why) = match end {
        End::Stuck { reason, why } => (
            Readiness::WouldStick {
                at: steps.len() + 1,
                of: total.max(steps.len() + 1),
            },
            reason,
            why,
        ),
        End::Finished => match unsafe_step(&start, &steps) {
            Some((at, why)) => (
                Readiness::Unsafe { at, of: total },
                ReadyReason::FaultToleranceZero,
                why,
            ),
            None => (
                Readiness::Ready,
                ReadyReason::Ready,
                format!(
                    "{} steps, each keeping a fault tolerance of at least 1 ({} voting members at the start, quorum {})",
                    steps.len(),
                    start.voting,
                    start.quorum
                ),
            ),
        },
    };
    let next_action = next_for(cp, &last, &readiness, &why, policy, now_unix, own);
    Preflight {
        readiness,
        reason,
        why,
        steps,
        total,
        start: Some(start),
        next_action,
    }
}

/// A control plane the play cannot start on: teardown, external etcd, unknown health.
/// `own` works out `cp`'s own next action.
fn cannot_play(
    cp: &ControlPlane,
    policy: &Policy,
    own: impl Fn() -> NextAction,
) -> Option<Preflight> {
    let judged = |readiness, reason, why: String, code| {
        Some(Preflight {
            readiness,
            reason,
            why: why.clone(),
            steps: Vec::new(),
            total: 0,
            start: None,
            next_action: plain(code, why),
        })
    };
    let kcp = cp.kcp_shown();
    if cp.cluster.deleting || cp.kcp.deleting {
        return judged(
            Readiness::CannotJudge,
            ReadyReason::Teardown,
            format!(
                "KubeadmControlPlane {kcp} or its Cluster is being deleted: there is no rollout to predict"
            ),
            ActionCode::WaitForTeardown,
        );
    }
    if cp.kcp.etcd == EtcdTopology::External {
        return judged(
            Readiness::Ready,
            ReadyReason::ExternalEtcd,
            format!(
                "KubeadmControlPlane {kcp} uses an external etcd: a rollout does not change its membership"
            ),
            ActionCode::None,
        );
    }
    let unknown = match &cp.etcd {
        EtcdState::Unknown { reason } => Some(format!("etcd's member list is unknown ({reason})")),
        EtcdState::Observed(s) => {
            let stale = s.age.is_some_and(|a| a > policy.max_health_age);
            s.members
                .iter()
                .find(|m| {
                    matches!(
                        crate::quorum::effective_ref(m, stale),
                        HealthRef::Unknown(_)
                    )
                })
                .map(|m| {
                    format!(
                        "the health of etcd member {} ({}) is unknown{}",
                        m.shown_name(),
                        m.id,
                        if stale { " (the probe is too old)" } else { "" }
                    )
                })
        }
    };
    unknown.map(|why| {
        let next = own();
        Preflight {
            readiness: Readiness::CannotJudge,
            reason: ReadyReason::EtcdUnknown,
            why: format!(
                "{why}: probe again (offline: add the endpoint status and health dumps) before predicting"
            ),
            steps: Vec::new(),
            total: 0,
            start: None,
            next_action: next,
        }
    })
}

fn plain(code: ActionCode, message: String) -> NextAction {
    NextAction {
        code,
        message,
        command: None,
        target: None,
    }
}

/// The first step at which one more failure loses quorum, or a voting member is already down:
/// step 1 (with words saying so) when that is already true before the first step.
fn unsafe_step(start: &Counts, steps: &[RolloutStep]) -> Option<(usize, String)> {
    let bad = |c: &Counts| c.fault_tolerance < 1 || c.healthy < c.voting;
    if bad(start) {
        return Some((
            1,
            format!("already before the first step: {}", margin(start)),
        ));
    }
    steps.iter().find(|s| bad(&s.counts)).map(|s| {
        (
            s.index,
            format!("after \"{}\": {}", s.action, margin(&s.counts)),
        )
    })
}

/// What clears the prediction.
fn next_for(
    cp: &ControlPlane,
    last: &ControlPlane,
    readiness: &Readiness,
    why: &str,
    policy: &Policy,
    now: i64,
    own: impl FnOnce() -> NextAction,
) -> NextAction {
    let kcp = cp.kcp_shown();
    let ns = &cp.kcp.namespace;
    let name = &cp.kcp.name;
    match readiness {
        Readiness::Ready => {
            let command = format!(
                "kubectl patch kcp -n {ns} {name} --type merge -p '{{\"spec\":{{\"version\":\"<new version>\"}}}}'"
            );
            NextAction {
                code: ActionCode::None,
                message: format!(
                    "Nothing holds the rollout of KubeadmControlPlane {kcp}: start it (`{command}`)."
                ),
                command: Some(command),
                target: None,
            }
        }
        Readiness::Unsafe { .. } if cp.kcp.replicas < 3 => {
            let command = format!("kubectl scale kcp -n {ns} {name} --replicas=3");
            NextAction {
                code: ActionCode::None,
                message: format!(
                    "KubeadmControlPlane {kcp} has {}: a member failure during the rollout loses quorum. Scale it to 3 first (`{command}`), wait for the new members, then roll out.",
                    crate::judge::replicas(cp.kcp.replicas)
                ),
                command: Some(command),
                target: None,
            }
        }
        Readiness::Unsafe { .. } if cp.kcp.max_surge == 0 => {
            let command = format!(
                "kubectl patch kcp -n {ns} {name} --type merge -p '{{\"spec\":{{\"rollout\":{{\"strategy\":{{\"rollingUpdate\":{{\"maxSurge\":1}}}}}}}}}}'"
            );
            NextAction {
                code: ActionCode::None,
                message: format!(
                    "KubeadmControlPlane {kcp} deletes before it adds (maxSurge 0): set maxSurge to 1 so that each new member joins before an old one leaves (`{command}`)."
                ),
                command: Some(command),
                target: None,
            }
        }
        _ => {
            // The present's own next action when it names one, else the stuck state's.
            let start = own();
            // Stuck before the first step: the stuck state is the present.
            let stuck = if last == cp {
                start.clone()
            } else {
                next_action(last, policy, now)
            };
            let useful =
                |a: &NextAction| a.code != ActionCode::None && a.code != ActionCode::WaitForRollout;
            if useful(&start) {
                start
            } else if useful(&stuck) {
                stuck
            } else {
                plain(
                    ActionCode::None,
                    format!("Clear this before the rollout of KubeadmControlPlane {kcp}: {why}."),
                )
            }
        }
    }
}

impl Sim<'_> {
    /// One more failure after step `index`: the first healthy voting member by name whose
    /// Machine is not being deleted fails; the rollout is played on from there.
    pub(super) fn one_failure(&self, index: usize) -> Option<OneFailure> {
        let leaving: Vec<&str> = self
            .cp
            .machines
            .iter()
            .filter(|m| m.deleting)
            .map(|m| m.node_name.as_deref().unwrap_or(&m.name))
            .collect();
        let mut candidates: Vec<&Member> = self
            .members()
            .iter()
            .filter(|m| !m.is_learner && m.effective_health_ref().is_healthy())
            .filter(|m| !leaving.contains(&m.name.as_str()))
            .collect();
        candidates.sort_by(|a, b| a.name.cmp(&b.name));
        let victim = candidates.first()?.name.clone();
        let mut after = self.clone();
        for m in after.members_mut() {
            if m.name == victim {
                m.health = Health::Unhealthy("down".into());
            }
        }
        let c = Counts::of(after.members());
        let quorum_kept = c.healthy >= c.quorum;
        let (rest, end, _) = after.play(false);
        let sticks_at = match &end {
            End::Finished => None,
            End::Stuck { .. } => Some(index + rest.len() + 1),
        };
        // A voting member added and not started yet counts against the quorum, and its start
        // gives it back: a failure in that window loses quorum only until it starts.
        let restored_by = (!quorum_kept)
            .then(|| self.starting.first())
            .flatten()
            .filter(|_| c.healthy + self.starting.len() >= c.quorum)
            .map(|(machine, _)| machine.clone());
        let text = one_failure_sentence(
            &victim,
            &c,
            restored_by.as_deref(),
            &end,
            index + rest.len() + 1,
        );
        Some(OneFailure {
            member: victim,
            quorum_kept,
            sticks_at: if quorum_kept || restored_by.is_some() {
                sticks_at
            } else {
                Some(index + 1)
            },
            text,
        })
    }
}
