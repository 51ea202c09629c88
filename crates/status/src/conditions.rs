//! The two conditions quorumguard publishes in a KubeadmControlPlane's `status.conditions`, and
//! the merge that tells the status writer whether a write is needed at all.
//!
//! Everything here is pure: no I/O, no clock. `now_unix` (Unix seconds) is passed in.
//!
//! KCP v1beta2 conditions are `metav1.Condition` in a list keyed by `type` with at most
//! [`MAX_CONDITIONS`] items; a message is at most [`MAX_MESSAGE_LEN`] characters and a reason must
//! match `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`. KCP preserves condition types it does not
//! own, so quorumguard's types carry its domain prefix.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use quorumguard_engine::quorum::{self, Tally};
use quorumguard_engine::{
    ActionCode, ControlPlane, EtcdSnapshot, EtcdState, EtcdTopology, Health, Machine, Member,
    NextAction, Policy, next_action,
};

/// Whether etcd has quorum with room for a failure, and the member table.
pub const CONDITION_ETCD_QUORUM: &str = "quorumguard.io/EtcdQuorum";
/// The single next safe action (`reason` is its [`ActionCode`]).
pub const CONDITION_NEXT_ACTION: &str = "quorumguard.io/NextAction";
/// `maxItems` of KCP `status.conditions`.
pub const MAX_CONDITIONS: usize = 32;
/// `maxLength` of a condition message. Messages are kept within this many *bytes*, which is never
/// more characters.
pub const MAX_MESSAGE_LEN: usize = 32768;

const TRUE: &str = "True";
const FALSE: &str = "False";
const UNKNOWN: &str = "Unknown";

const TRUNCATED_NOTE: &str =
    "\n[truncated: the full text exceeds the 32768-character limit of a condition message]";

/// Reasons of the `quorumguard.io/EtcdQuorum` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuorumReason {
    /// Quorum holds with fault tolerance >= 1; every member is healthy and matches a Machine.
    Healthy,
    /// Healthy and matched, but one more failure loses quorum (one or two voting members).
    NoFaultTolerance,
    /// A member is unhealthy (probe error, alarm, or added but never started).
    MembersUnhealthy,
    /// Members and Machines disagree: a Machine without a voting member, a member without a
    /// Machine, or a learner.
    MembershipMismatch,
    /// Fewer healthy voting members than a quorum, even counting unknown ones as healthy.
    QuorumLost,
    /// The member list or some health is unknown: the probe failed or is too old.
    ProbeFailed,
    /// External etcd: nothing stacked for quorumguard to observe.
    ExternalEtcd,
}

impl QuorumReason {
    pub const ALL: [QuorumReason; 7] = [
        QuorumReason::Healthy,
        QuorumReason::NoFaultTolerance,
        QuorumReason::MembersUnhealthy,
        QuorumReason::MembershipMismatch,
        QuorumReason::QuorumLost,
        QuorumReason::ProbeFailed,
        QuorumReason::ExternalEtcd,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            QuorumReason::Healthy => "Healthy",
            QuorumReason::NoFaultTolerance => "NoFaultTolerance",
            QuorumReason::MembersUnhealthy => "MembersUnhealthy",
            QuorumReason::MembershipMismatch => "MembershipMismatch",
            QuorumReason::QuorumLost => "QuorumLost",
            QuorumReason::ProbeFailed => "ProbeFailed",
            QuorumReason::ExternalEtcd => "ExternalEtcd",
        }
    }
}

/// The two conditions for one control plane: `[EtcdQuorum, NextAction]`, both stamped with
/// `now_unix` as their transition time ([`merge`] keeps the old one when the status is unchanged).
///
/// `probe_error` is the error of the latest probe, if it failed: the condition then says so, and
/// shows the last observed table (if any) as such.
pub fn conditions(
    cp: &ControlPlane,
    policy: &Policy,
    now_unix: i64,
    observed_generation: Option<i64>,
    probe_error: Option<&str>,
) -> [Condition; 2] {
    let action = next_action(cp, policy, now_unix);
    conditions_given(
        cp,
        &action,
        policy,
        now_unix,
        observed_generation,
        probe_error,
    )
}

/// [`conditions`] of a control plane whose next action (`next_action(cp, policy, now_unix)`)
/// the caller has already worked out: the status writer's snapshot of each KCP.
pub fn conditions_given(
    cp: &ControlPlane,
    action: &NextAction,
    policy: &Policy,
    now_unix: i64,
    observed_generation: Option<i64>,
    probe_error: Option<&str>,
) -> [Condition; 2] {
    let time = time_of(now_unix);
    let observed_generation = observed_generation.filter(|g| *g >= 0);
    let (status, reason, message) = etcd_quorum(cp, policy, probe_error);
    let action_status = if action.code == ActionCode::None {
        FALSE
    } else {
        TRUE
    };
    [
        Condition {
            type_: CONDITION_ETCD_QUORUM.to_string(),
            status: status.to_string(),
            reason: reason.as_str().to_string(),
            message: bounded(message),
            observed_generation,
            last_transition_time: time.clone(),
        },
        Condition {
            type_: CONDITION_NEXT_ACTION.to_string(),
            status: action_status.to_string(),
            reason: action.code.as_str().to_string(),
            message: bounded(action.message.clone()),
            observed_generation,
            last_transition_time: time,
        },
    ]
}

/// `existing` with `new` merged in, or `None` when nothing needs writing.
///
/// A condition of the same type is replaced in place when its status, reason, message or
/// observedGeneration differ; its `lastTransitionTime` is kept unless the status changed.
/// Every other condition stays untouched and in its place; ours that are new go at the end.
/// When adding ours would exceed [`MAX_CONDITIONS`], nothing is added and the answer is `None`
/// ([`lacks_room`] tells that case apart, for the caller to log).
pub fn merge(existing: &[Condition], new: [Condition; 2], now_unix: i64) -> Option<Vec<Condition>> {
    if lacks_room(existing, &new) {
        return None;
    }
    let mut out = existing.to_vec();
    let mut changed = false;
    for c in new {
        match out.iter_mut().find(|e| e.type_ == c.type_) {
            Some(old) => {
                if old.status == c.status
                    && old.reason == c.reason
                    && old.message == c.message
                    && old.observed_generation == c.observed_generation
                {
                    continue;
                }
                let last_transition_time = if old.status == c.status {
                    old.last_transition_time.clone()
                } else {
                    time_of(now_unix)
                };
                *old = Condition {
                    last_transition_time,
                    ..c
                };
                changed = true;
            }
            None => {
                out.push(Condition {
                    last_transition_time: time_of(now_unix),
                    ..c
                });
                changed = true;
            }
        }
    }
    changed.then_some(out)
}

/// Whether adding the types of `new` missing from `existing` would exceed [`MAX_CONDITIONS`].
pub fn lacks_room(existing: &[Condition], new: &[Condition]) -> bool {
    let missing = new
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            !existing.iter().any(|e| e.type_ == c.type_)
                && !new[..*i].iter().any(|p| p.type_ == c.type_)
        })
        .count();
    existing.len() + missing > MAX_CONDITIONS
}

fn time_of(now_unix: i64) -> Time {
    let clamped = if now_unix < 0 {
        Timestamp::UNIX_EPOCH
    } else {
        Timestamp::MAX
    };
    Time(Timestamp::from_second(now_unix).unwrap_or(clamped))
}

/// Status, reason and message of the EtcdQuorum condition.
fn etcd_quorum(
    cp: &ControlPlane,
    policy: &Policy,
    probe_error: Option<&str>,
) -> (&'static str, QuorumReason, String) {
    let kcp = cp.kcp_ref();
    if cp.kcp.etcd == EtcdTopology::External {
        return (
            UNKNOWN,
            QuorumReason::ExternalEtcd,
            format!(
                "KubeadmControlPlane {kcp} uses external etcd: quorumguard does not observe it"
            ),
        );
    }
    let snapshot = match &cp.etcd {
        EtcdState::Unknown { reason } => {
            let mut msg = format!(
                "the etcd member list of KubeadmControlPlane {kcp} is unknown: {}",
                one_line(reason)
            );
            if let Some(e) = probe_error.filter(|e| *e != reason) {
                msg.push_str(&format!("; latest probe error: {}", one_line(e)));
            }
            for m in sorted_machines(cp) {
                msg.push_str(&format!("\n{}: etcd member unknown", machine_label(cp, m)));
            }
            return (UNKNOWN, QuorumReason::ProbeFailed, msg);
        }
        EtcdState::Observed(s) => s,
    };
    let stale = snapshot.age.is_some_and(|a| a > policy.max_health_age);
    let tally = Tally::of(&snapshot.members, stale);
    let findings = Findings::of(cp, &snapshot.members, stale);
    let voting = tally.voting();
    let q = quorum::quorum(voting);
    let ft = quorum::tolerance(voting, tally.healthy);

    let (status, reason, summary) = if let Some(e) = probe_error {
        (
            UNKNOWN,
            QuorumReason::ProbeFailed,
            format!(
                "the latest etcd probe failed: {}. Last observed membership:",
                one_line(e)
            ),
        )
    } else if tally.quorum_lost() {
        (
            FALSE,
            QuorumReason::QuorumLost,
            format!(
                "etcd has lost quorum: {} healthy of {voting} voting members, quorum {q}",
                tally.healthy
            ),
        )
    } else if !findings.unhealthy.is_empty() {
        (
            FALSE,
            QuorumReason::MembersUnhealthy,
            findings.unhealthy.join("; "),
        )
    } else if !findings.mismatch.is_empty() {
        (
            FALSE,
            QuorumReason::MembershipMismatch,
            findings.mismatch.join("; "),
        )
    } else if stale {
        (
            UNKNOWN,
            QuorumReason::ProbeFailed,
            format!(
                "the latest etcd probe is older than {}s: member health is unknown",
                policy.max_health_age.as_secs()
            ),
        )
    } else if !findings.unknown.is_empty() {
        (
            UNKNOWN,
            QuorumReason::ProbeFailed,
            findings.unknown.join("; "),
        )
    } else if ft < 1 {
        (
            FALSE,
            QuorumReason::NoFaultTolerance,
            format!(
                "all {voting} voting members are healthy, but losing one more loses quorum: run an odd number of at least 3"
            ),
        )
    } else {
        (
            TRUE,
            QuorumReason::Healthy,
            format!(
                "etcd has quorum with fault tolerance {ft}; every member is healthy and matches a Machine"
            ),
        )
    };
    let message = format!("{summary}\n{}", table(cp, snapshot, &tally, stale));
    (status, reason, message)
}

/// What keeps a quorate etcd from being healthy, one sentence per member or Machine.
#[derive(Default)]
struct Findings {
    unhealthy: Vec<String>,
    mismatch: Vec<String>,
    unknown: Vec<String>,
}

impl Findings {
    fn of(cp: &ControlPlane, members: &[Member], stale: bool) -> Findings {
        let mut f = Findings::default();
        for m in sorted_members(members) {
            let name = m.display_name();
            match quorum::effective(m, stale) {
                Health::Unhealthy(e) => f.unhealthy.push(format!(
                    "member {name} (id {}) is unhealthy: {}",
                    m.id,
                    one_line(&e)
                )),
                Health::Unknown => f
                    .unknown
                    .push(format!("health of member {name} (id {}) is unknown", m.id)),
                Health::Unconfirmed(why) => f.unknown.push(format!(
                    "health of member {name} (id {}) is unknown: {}",
                    m.id,
                    one_line(&why)
                )),
                Health::Healthy => {}
            }
            // NOSPACE makes no member unhealthy (raft keeps its quorum), but the cluster
            // refuses every write until space is freed: not a healthy etcd.
            if m.alarms.contains(&quorumguard_engine::Alarm::NoSpace) {
                f.unhealthy.push(format!(
                    "member {name} (id {}) raised a NOSPACE alarm: etcd refuses writes on every member until space is freed (quorum holds)",
                    m.id
                ));
            }
            if m.is_unstarted() {
                f.mismatch.push(format!(
                    "member {} has been added but has not started",
                    m.id
                ));
                continue;
            }
            if m.is_learner {
                f.mismatch
                    .push(format!("member {name} (id {}) is a learner", m.id));
            }
            if cp.machine_of(m).is_none() {
                f.mismatch
                    .push(format!("member {name} (id {}) has no Machine", m.id));
            }
        }
        for m in sorted_machines(cp) {
            if m.control_plane && !m.deleting && cp.member_of(m).is_none() {
                f.mismatch.push(format!(
                    "Machine {}/{} has no etcd member",
                    cp.kcp.namespace, m.name
                ));
            }
        }
        f
    }
}

/// The figures line, one line per member, then one line per Machine without a member.
fn table(cp: &ControlPlane, snapshot: &EtcdSnapshot, tally: &Tally, stale: bool) -> String {
    let voting = tally.voting();
    let ft = quorum::tolerance(voting, tally.healthy);
    let learners = snapshot.members.iter().filter(|m| m.is_learner).count();
    let mut out = format!(
        "etcd of KubeadmControlPlane {}: {voting} voting, {} healthy, quorum {}, fault tolerance {}",
        cp.kcp_ref(),
        tally.healthy,
        quorum::quorum(voting),
        if tally.quorum_lost() {
            "none (quorum lost)".to_string()
        } else if !tally.has_quorum() {
            "unknown".to_string()
        } else if tally.unknown > 0 {
            format!("at least {ft}")
        } else {
            ft.to_string()
        },
    );
    if learners > 0 {
        out.push_str(&format!(", {learners} learner(s)"));
    }
    if tally.unknown > 0 {
        out.push_str(&format!(", {} unknown", tally.unknown));
    }
    if stale {
        out.push_str(" (probe too old: health shown as last seen)");
    }
    out.push_str(&format!("; joins: {}", cp.joins()));
    for m in sorted_members(&snapshot.members) {
        out.push('\n');
        out.push_str(&member_line(cp, m));
    }
    for m in sorted_machines(cp) {
        if cp.member_of(m).is_none() {
            out.push_str(&format!("\n{}: no etcd member", machine_label(cp, m)));
        }
    }
    // A remediation that would not reach KCP: the table says so.
    if let Some(gap) = quorumguard_engine::remediation::gap(cp) {
        out.push('\n');
        out.push_str(&one_line(&gap));
    }
    out
}

fn member_line(cp: &ControlPlane, m: &Member) -> String {
    let mut fields: Vec<String> = Vec::with_capacity(9);
    fields.push(if m.is_learner { "learner" } else { "voting" }.to_string());
    let health = m.effective_health();
    fields.push(match &health {
        Health::Healthy => "healthy".to_string(),
        Health::Unhealthy(e) => format!("unhealthy: {}", one_line(e)),
        Health::Unknown => "health unknown".to_string(),
        Health::Unconfirmed(why) => format!("health unknown: {}", one_line(why)),
    });
    if m.is_leader {
        fields.push("leader".to_string());
    } else if health.is_healthy() {
        fields.push("follower".to_string());
    }
    fields.push(match &m.version {
        Some(v) => format!("version {}", one_line(v)),
        None => "version unknown".to_string(),
    });
    fields.push(match m.db_size {
        Some(b) => format!("db {}", human_bytes(b)),
        None => "db size unknown".to_string(),
    });
    fields.push(match m.raft_index {
        Some(i) => format!("raft index {i}"),
        None => "raft index unknown".to_string(),
    });
    fields.push(if m.alarms.is_empty() {
        "no alarms".to_string()
    } else {
        let alarms: Vec<String> = m.alarms.iter().map(|a| one_line(&a.to_string())).collect();
        format!("alarms {}", alarms.join(","))
    });
    fields.push(match cp.machine_of(m) {
        Some(machine) => machine_label(cp, machine),
        None => "no Machine".to_string(),
    });
    format!(
        "member {} (id {}): {}",
        one_line(&m.display_name()),
        m.id,
        fields.join(", ")
    )
}

/// `Machine ns/name (node n, deleting)`.
fn machine_label(cp: &ControlPlane, m: &Machine) -> String {
    let mut notes = vec![match &m.node_name {
        Some(n) => format!("node {}", one_line(n)),
        None => "no node yet".to_string(),
    }];
    if m.deleting {
        notes.push("deleting".to_string());
    }
    format!(
        "Machine {}/{} ({})",
        cp.kcp.namespace,
        m.name,
        notes.join(", ")
    )
}

/// Members by name then ID, so the message does not change with the order a probe lists them.
fn sorted_members(members: &[Member]) -> Vec<&Member> {
    let mut v: Vec<&Member> = members.iter().collect();
    v.sort_by(|a, b| (&a.name, a.id).cmp(&(&b.name, b.id)));
    v
}

fn sorted_machines(cp: &ControlPlane) -> Vec<&Machine> {
    let mut v: Vec<&Machine> = cp.machines.iter().collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// Control characters (newlines in an error text) would break the one-line-per-member table.
fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `s` within [`MAX_MESSAGE_LEN`] bytes: cut at a line (else a char) boundary, with a note.
fn bounded(mut s: String) -> String {
    if s.len() <= MAX_MESSAGE_LEN {
        return s;
    }
    let mut cut = MAX_MESSAGE_LEN - TRUNCATED_NOTE.len();
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    if let Some(nl) = s[..cut].rfind('\n').filter(|nl| *nl > 0) {
        cut = nl;
    }
    s.truncate(cut);
    s.push_str(TRUNCATED_NOTE);
    s
}

#[cfg(test)]
#[path = "conditions_tests.rs"]
mod tests;
