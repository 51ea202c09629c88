//! How decisions word what they found: members and objects as messages name them, the members
//! that are not healthy, unknown health and the policy for it, the tolerance warning.

use std::fmt;

use super::*;

/// An allowed change that leaves etcd without fault tolerance says so.
pub(super) fn with_tolerance_warning(cp: &ControlPlane, mut j: Judgement) -> Judgement {
    if j.allowed
        && !j.reason.is_unconditional()
        && let Some(f) = j.figures
        && f.tolerance_after == 0
        && f.voting_after > 0
    {
        j.warnings.push(format!(
            "after this, etcd of KubeadmControlPlane {} has no fault tolerance (voting {}, healthy {}, quorum {}): one more member failure loses quorum",
            cp.kcp_shown(),
            f.voting_after,
            f.healthy_after,
            f.quorum_after
        ));
    }
    if j.allowed
        && !j.reason.is_unconditional()
        && j.reason != Reason::NoReplicaChange
        && cp
            .members()
            .iter()
            .any(|m| m.alarms.contains(&Alarm::NoSpace))
    {
        j.warnings.push(format!(
            "etcd of KubeadmControlPlane {} has a NOSPACE alarm: quorum holds, but every member refuses writes until space is freed, so a new Machine cannot join (its node cannot register) and a replacement member would receive the same data; free space first (compact, defragment every member, `etcdctl alarm disarm`)",
            cp.kcp_shown()
        ));
    }
    j
}

/// A message on one line: a warning is shown as one (kubectl prints `Warning: ...`).
pub(super) fn one_line(message: &str) -> String {
    message.replace('\n', " ")
}

pub(super) fn is_stale(cp: &ControlPlane, policy: &Policy) -> bool {
    match &cp.etcd {
        EtcdState::Observed(s) => s.age.is_some_and(|a| a > policy.max_health_age),
        EtcdState::Unknown { .. } => true,
    }
}

/// "name (id 3, learner, unhealthy: ...)": a member as messages name it.
pub(super) fn describe_member(m: &Member, stale: bool) -> MemberDesc<'_> {
    MemberDesc { m, stale }
}

/// [`describe_member`], written straight into the message.
pub(super) struct MemberDesc<'a> {
    m: &'a Member,
    stale: bool,
}

impl fmt::Display for MemberDesc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, stale) = (self.m, self.stale);
        write!(f, "{} (id {}", m.shown_name(), m.id)?;
        if m.is_learner {
            f.write_str(", learner")?;
        }
        match quorum::effective_ref(m, stale) {
            HealthRef::Healthy => f.write_str(", healthy"),
            HealthRef::Unhealthy(e) => write!(f, ", unhealthy: {e}"),
            HealthRef::Unknown(_) if stale && !m.health.eq(&Health::Unknown) => {
                f.write_str(", health stale")
            }
            HealthRef::Unknown(Some(why)) => write!(f, ", health unknown: {why}"),
            HealthRef::Unknown(None) => f.write_str(", health unknown"),
        }?;
        if m.alarms.contains(&Alarm::NoSpace) {
            f.write_str(", NOSPACE alarm")?;
        }
        f.write_str(")")
    }
}

/// " Not healthy: a (id 1, ...), b (...)." naming the voting members that are not known to be
/// healthy, or nothing when all are; written where a message shows it.
pub(super) fn not_healthy_list(cp: &ControlPlane, stale: bool) -> NotHealthy<'_> {
    NotHealthy { cp, stale }
}

pub(super) struct NotHealthy<'a> {
    cp: &'a ControlPlane,
    stale: bool,
}

impl fmt::Display for NotHealthy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stale = self.stale;
        let mut names = self
            .cp
            .members()
            .iter()
            .filter(|m| !m.is_learner && !quorum::effective_ref(m, stale).is_healthy());
        let Some(first) = names.next() else {
            return Ok(());
        };
        write!(f, " Not healthy: {}", describe_member(first, stale))?;
        for m in names {
            write!(f, ", {}", describe_member(m, stale))?;
        }
        f.write_str(".")
    }
}

/// The outcome when safety cannot be proven: deny, or allow with a warning, per policy.
pub(super) fn unknown_health(
    ask: &Ask<'_>,
    what: &dyn fmt::Display,
    detail: &dyn fmt::Display,
    figures: Option<Figures>,
) -> Judgement {
    let Ask {
        requester, policy, ..
    } = *ask;
    let fresher = if policy.offline {
        "Take the dumps again with the endpoint status and health included (`etcdctl endpoint status --cluster -w json`, `etcdctl endpoint health --cluster -w json`) and judge again"
    } else {
        "Wait for a fresh etcd probe"
    };
    let msg = format!(
        "cannot prove that {what} is safe: the health of the etcd members it depends on is not known.\n{detail} {fresher}, or check etcd with `etcdctl endpoint health --cluster`."
    );
    let mut j = match policy.on_unknown_health(requester) {
        OnUnknownHealth::Deny => Judgement::deny(Reason::HealthUnknown, msg),
        OnUnknownHealth::Allow => {
            let mut j = Judgement::allow(Reason::HealthUnknown, msg.clone());
            j.warnings.push(format!(
                "allowed without proof of safety (policy for {}): {}",
                requester.username,
                one_line(&msg)
            ));
            j
        }
    };
    j.figures = figures;
    j
}

pub(super) fn unknown_etcd_detail(cp: &ControlPlane) -> String {
    match &cp.etcd {
        EtcdState::Unknown { reason } => format!(
            "the etcd member list of KubeadmControlPlane {} is unknown ({reason}).",
            cp.kcp_shown()
        ),
        EtcdState::Observed(s) => format!(
            "the etcd health of KubeadmControlPlane {} is {}.",
            cp.kcp_shown(),
            match s.age {
                Some(a) => format!("{}s old", a.as_secs()),
                None => "not known".into(),
            }
        ),
    }
}

/// "Machine ns/name", "deleting Machine ns/name": an object as messages name it, written where
/// it is shown.
pub(super) struct Named<'a>(
    pub(super) &'static str,
    pub(super) &'a str,
    pub(super) &'a str,
);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)?;
        f.write_str(" ")?;
        NsName(self.1, self.2).fmt(f)
    }
}
