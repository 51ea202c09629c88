//! The proof of one step on the fresh probe: etcd as it is now has its quorum, a leader and
//! every voting member's health known; the next action on it is the published one; and the step
//! keeps quorum, counted before and after.

use super::{Act, Count, Kind, Proof, Refusal, Situation, Step, Why, agrees, free_space};
use crate::decide::EtcdBasis;
use crate::model::{EtcdState, HealthRef, Member};
use crate::next_action::rfc3339;
use crate::quorum::{self, Tally};

/// The step that carries out the published action of kind `kind`, proven on the fresh probe.
pub(super) fn check(s: &Situation<'_>, kind: Kind) -> Result<Act, Refusal> {
    let kcp = s.fresh.kcp_shown();
    let no = |why: Why, detail: String| Refusal {
        why,
        message: format!("Autopilot does not act on KubeadmControlPlane {kcp}: {detail}"),
        until_unix: None,
    };
    if s.fresh.paused().is_some() {
        return Err(no(
            Why::Paused,
            "the Cluster or the KubeadmControlPlane is paused (`clusterctl move` pauses it while it moves the Cluster). Next: it acts once it is unpaused.".into(),
        ));
    }
    if s.basis != EtcdBasis::FreshProbe {
        return Err(no(
            Why::NotFresh,
            "its view of etcd is the record of the last sweep, not a probe taken for this decision. Next: it probes etcd and decides again.".into(),
        ));
    }
    if let Some(f) = &s.book.in_flight {
        return Err(no(
            Why::InFlight,
            format!(
                "its earlier action ({}, started at {}) is not re-proven yet. Next: the next probe must show {}; then the autopilot decides again.",
                f.step,
                rfc3339(f.started_unix),
                f.proof.after
            ),
        ));
    }
    let members = match &s.fresh.etcd {
        EtcdState::Observed(snap) => snap.members.as_slice(),
        EtcdState::Unknown { reason } => {
            return Err(no(
                Why::HealthUnknown,
                format!(
                    "the fresh probe has no member list ({reason}). Next: it probes again at the next sweep; check that etcd answers."
                ),
            ));
        }
    };
    let now = etcd_now(members).map_err(|(why, d)| no(why, d))?;
    agrees(s)?;
    let act = match kind {
        Kind::PromoteLearner => promote(s, members, now),
        Kind::RemoveMember => remove(s, members, now),
        Kind::DeleteMachine => delete_machine(s, now),
        Kind::FreeSpace => free_space::next_step(s, members, now),
    };
    act.map_err(|(why, d)| no(why, d))
}

type Refused = (Why, String);

/// The voting members before any step, when etcd has its quorum, a leader and every voting
/// member's health known.
fn etcd_now(members: &[Member]) -> Result<Count, Refused> {
    let tally = Tally::of(members, false);
    let count = Count {
        voting: tally.voting(),
        healthy: tally.healthy,
    };
    if quorum::raft_quorum_lost(members, false) {
        return Err((
            Why::QuorumLost,
            format!(
                "etcd has lost its quorum ({count}). Next: restore quorum by hand (bring the members back, or restore from a snapshot); the autopilot never acts without quorum."
            ),
        ));
    }
    let led = members
        .iter()
        .any(|m| !m.is_learner && m.is_leader && m.effective_health_ref().is_healthy());
    if !led {
        return Err((
            Why::LeaderElection,
            format!(
                "no member reports itself a healthy leader: a leader election is in progress ({count} known healthy). Next: it decides again at the next sweep, after the election."
            ),
        ));
    }
    if tally.unknown > 0 {
        return Err((
            Why::HealthUnknown,
            format!(
                "the health of {} of {} voting members is unknown on the fresh probe. Next: it decides again at the next sweep; check them with `etcdctl endpoint health --cluster`.",
                tally.unknown, count.voting
            ),
        ));
    }
    if !count.keeps_quorum() {
        return Err((
            Why::QuorumLost,
            format!(
                "etcd has lost its quorum ({count}). Next: restore quorum by hand; the autopilot never acts without quorum."
            ),
        ));
    }
    Ok(count)
}

/// The member the published action names (its hex ID).
fn target<'a>(s: &Situation<'_>, members: &'a [Member]) -> Result<&'a Member, Refused> {
    let t = s.published.target.as_deref().unwrap_or_default();
    members.iter().find(|m| m.id.to_string() == t).ok_or((
        Why::NotProven,
        format!("etcd member {t}, which the published action names, is not in the fresh member list. Next: it decides again at the next sweep."),
    ))
}

fn promote(s: &Situation<'_>, members: &[Member], before: Count) -> Result<Act, Refused> {
    let l = target(s, members)?;
    let name = l.display_name();
    let not = |d: String| (Why::NotProven, format!("learner {name} (id {}) {d}", l.id));
    if !l.is_learner || l.is_unstarted() || !l.effective_health_ref().is_healthy() {
        return Err(not(
            "is not a started, healthy learner on the fresh probe. Next: it decides again at the next sweep.".into(),
        ));
    }
    let owner = s.fresh.machine_of(l).ok_or_else(|| {
        not("belongs to no Machine: a learner no Machine owns is removed, not promoted. Next: it decides again at the next sweep.".into())
    })?;
    let grace = i64::try_from(s.policy.learner_grace.as_secs()).unwrap_or(i64::MAX);
    let past = owner
        .created_unix
        .is_some_and(|c| s.now_unix.saturating_sub(c) >= grace);
    if !past {
        return Err(not(format!(
            "of Machine {} is within --learner-grace {}: kubeadm's own promotion may still come. Next: it waits for the grace to pass.",
            owner.name,
            humantime::format_duration(s.policy.learner_grace)
        )));
    }
    let lead = members
        .iter()
        .find(|m| m.is_leader)
        .and_then(|m| m.raft_index);
    let (Some(mine), Some(lead)) = (l.raft_index, lead) else {
        return Err(not(
            "cannot be shown in sync: the fresh probe lacks its raft index or the leader's. Next: promote it by hand if `etcdctl endpoint status --cluster` shows it caught up, or it decides again at the next sweep.".into(),
        ));
    };
    let behind = lead.saturating_sub(mine);
    let in_sync = u128::from(mine) * 10 >= u128::from(lead) * 9;
    if !in_sync || behind > s.settings.max_learner_lag {
        return Err(not(format!(
            "is behind its leader: raft index {mine} of the leader's {lead}, {behind} entries behind (etcd needs 90 %, the autopilot at most {} entries). Next: it decides again at the next sweep; a learner that does not catch up has its Machine replaced.",
            s.settings.max_learner_lag
        )));
    }
    let after = Count {
        voting: before.voting + 1,
        healthy: before.healthy + 1,
    };
    if !after.keeps_quorum() {
        return Err(not(format!(
            "would leave {after}. Next: bring the unhealthy members back."
        )));
    }
    let step = Step::Promote {
        member: l.id,
        name: name.clone(),
    };
    let message = format!(
        "Autopilot promotes learner {name} (id {}) of Machine {}/{} (KubeadmControlPlane {}), still a learner past --learner-grace {}, healthy and in sync (raft index {mine} of the leader's {lead}, {behind} behind): before {before}; after {after}. Next: the next probe must show it a healthy voting member.",
        l.id,
        s.fresh.kcp.namespace,
        owner.name,
        s.fresh.kcp_shown(),
        humantime::format_duration(s.policy.learner_grace)
    );
    Ok(act(step, before, after, message))
}

fn remove(s: &Situation<'_>, members: &[Member], before: Count) -> Result<Act, Refused> {
    let m = target(s, members)?;
    let name = m.display_name();
    if let Some(owner) = s.fresh.machine_of(m) {
        return Err((
            Why::NotProven,
            format!(
                "etcd member {name} (id {}) belongs to Machine {}/{} on the fresh probe: the autopilot removes only members no Machine claims. Next: it decides again at the next sweep.",
                m.id, s.fresh.kcp.namespace, owner.name
            ),
        ));
    }
    let healthy = m.effective_health_ref().is_healthy();
    let after = if m.is_learner {
        before
    } else {
        Count {
            voting: before.voting - 1,
            healthy: before.healthy - usize::from(healthy),
        }
    };
    if !after.keeps_quorum() {
        return Err((
            Why::NotProven,
            format!(
                "removing etcd member {name} (id {}) would leave {after} (before: {before}). Next: bring the unhealthy members back first.",
                m.id
            ),
        ));
    }
    let what = match (m.is_unstarted(), m.is_learner, m.effective_health_ref()) {
        (true, _, _) => "never started",
        (false, true, _) => "a learner no Machine owns",
        (false, false, HealthRef::Healthy) => "healthy, but no Machine claims it",
        _ => "unhealthy, and no Machine claims it",
    };
    let step = Step::RemoveMember {
        member: m.id,
        name: name.clone(),
    };
    let message = format!(
        "Autopilot removes etcd member {name} (id {}) of KubeadmControlPlane {}, {what}, after --join-grace {} and KCP's chance of {} to remove it itself: before {before}; after {after}. Next: the next probe must show it gone.",
        m.id,
        s.fresh.kcp_shown(),
        humantime::format_duration(s.policy.join_grace),
        humantime::format_duration(s.settings.kcp_chance)
    );
    Ok(act(step, before, after, message))
}

fn delete_machine(s: &Situation<'_>, now: Count) -> Result<Act, Refused> {
    let ns = &s.fresh.kcp.namespace;
    let t = s.published.target.as_deref().unwrap_or_default();
    let Some(m) = s.fresh.machine(t).filter(|m| !m.deleting) else {
        return Err((
            Why::NotProven,
            format!(
                "Machine {ns}/{t} is gone or being deleted already. Next: nothing for the autopilot; it decides again at the next sweep."
            ),
        ));
    };
    if let Some(member) = s.fresh.member_of(m) {
        let h = if member.effective_health_ref().is_healthy() {
            "healthy"
        } else {
            "not healthy"
        };
        return Err((
            Why::NotProven,
            format!(
                "Machine {ns}/{t} holds etcd member {} ({h}) on the fresh probe: deleting it would remediate a member, which the autopilot never does. Next: it decides again at the next sweep.",
                member.display_name()
            ),
        ));
    }
    let step = Step::DeleteMachine {
        machine: m.name.clone(),
    };
    let message = format!(
        "Autopilot deletes Machine {ns}/{t}, left over by an interrupted step (cluster-api #2651): its etcd member is gone on the fresh probe and KubeadmControlPlane {} has more Machines than replicas; the webhook judges the deletion as it judges anyone's. etcd is untouched: before {now}; after {now}. Next: the Machine is gone once KCP drains its node.",
        s.fresh.kcp_shown()
    );
    Ok(act(step, now, now, message))
}

pub(super) fn act(step: Step, before: Count, after: Count, message: String) -> Act {
    Act {
        step,
        proof: Proof { before, after },
        message,
    }
}
