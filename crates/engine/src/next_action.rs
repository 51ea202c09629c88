//! ControlPlane -> the single next safe action, so a human looking at a KCP knows what to do.
//!
//! Every action that implies a Machine deletion is checked against the decision rules before it
//! is named: the guard never tells anyone to do what it would deny.

use std::fmt;

use super::decide::{Words, judge_delete};
use super::model::*;
use super::quorum::{self, Safety, Tally};

/// Stable codes of the next action (the `reason` of the NextAction condition).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ActionCode {
    /// Converged and healthy, or nothing for quorumguard to do.
    None,
    /// Cluster or KCP is being deleted: let the teardown finish.
    WaitForTeardown,
    /// The member list is unknown or health is stale: look at etcd.
    CheckEtcdHealth,
    /// Quorum is lost: only disaster recovery helps.
    RestoreQuorum,
    /// A Machine whose member is already gone (cluster-api #2651): delete the Machine.
    DeleteMachine,
    /// A Machine is being deleted: wait for KCP to finish it.
    WaitForDeletion,
    /// A member or Machine is joining: wait for it.
    WaitForJoin,
    /// A learner is catching up: wait for its promotion.
    WaitForLearner,
    /// A member with no Machine: remove it from etcd.
    RemoveOrphanMember,
    /// A Machine whose member is unhealthy (or missing): let KCP replace it.
    RemediateMachine,
    /// Machines and spec.replicas differ: KCP is scaling or rolling out.
    WaitForRollout,
}

impl ActionCode {
    /// Every code, for documentation and exhaustive tests (the status tests check it is
    /// complete).
    pub const ALL: [ActionCode; 11] = [
        ActionCode::None,
        ActionCode::WaitForTeardown,
        ActionCode::CheckEtcdHealth,
        ActionCode::RestoreQuorum,
        ActionCode::DeleteMachine,
        ActionCode::WaitForDeletion,
        ActionCode::WaitForJoin,
        ActionCode::WaitForLearner,
        ActionCode::RemoveOrphanMember,
        ActionCode::RemediateMachine,
        ActionCode::WaitForRollout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ActionCode::None => "None",
            ActionCode::WaitForTeardown => "WaitForTeardown",
            ActionCode::CheckEtcdHealth => "CheckEtcdHealth",
            ActionCode::RestoreQuorum => "RestoreQuorum",
            ActionCode::DeleteMachine => "DeleteMachine",
            ActionCode::WaitForDeletion => "WaitForDeletion",
            ActionCode::WaitForJoin => "WaitForJoin",
            ActionCode::WaitForLearner => "WaitForLearner",
            ActionCode::RemoveOrphanMember => "RemoveOrphanMember",
            ActionCode::RemediateMachine => "RemediateMachine",
            ActionCode::WaitForRollout => "WaitForRollout",
        }
    }
}

impl fmt::Display for ActionCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The one thing to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NextAction {
    pub code: ActionCode,
    /// What to do and why, naming the objects; includes the command when there is one.
    pub message: String,
    /// The kubectl or etcdctl command that carries the action out, where one fits.
    pub command: Option<String>,
    /// The Machine or member (hex ID) the action is about.
    pub target: Option<String>,
}

impl NextAction {
    fn new(code: ActionCode, message: String) -> NextAction {
        NextAction {
            code,
            message,
            command: None,
            target: None,
        }
    }

    fn with(mut self, target: String, command: Option<String>) -> NextAction {
        if let Some(c) = &command {
            self.message.push_str(" Run: ");
            self.message.push_str(c);
        }
        self.target = Some(target);
        self.command = command;
        self
    }
}

/// Machines in the order a human would handle them: oldest first, then by name.
fn by_age<'a>(machines: impl Iterator<Item = &'a Machine>) -> Vec<&'a Machine> {
    let mut v: Vec<&Machine> = machines.collect();
    v.sort_by(|a, b| age_order(a, b));
    v
}

fn age_order(a: &Machine, b: &Machine) -> std::cmp::Ordering {
    (a.created_unix.unwrap_or(i64::MAX), &a.name)
        .cmp(&(b.created_unix.unwrap_or(i64::MAX), &b.name))
}

fn controller(policy: &Policy) -> Requester {
    Requester::new(policy.controllers.first().cloned().unwrap_or_default())
}

/// A requester that is neither a controller nor a teardown identity: a person at kubectl.
pub(crate) fn human() -> Requester {
    Requester::new("quorumguard:next-action")
}

/// Whether deleting `m` would be allowed (only the answer: no message is written for it).
fn allowed(cp: &ControlPlane, m: &Machine, r: &Requester, policy: &Policy, now_unix: i64) -> bool {
    judge_delete(cp, m, r, policy, now_unix, Words::DenialsOnly).allowed
}

/// What is wrong with a Machine KCP should replace.
enum Problem<'a> {
    NoMember,
    Unhealthy(Unfit<'a>),
}

impl fmt::Display for Problem<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NoMember => f.write_str("has no etcd member"),
            Problem::Unhealthy(e) => write!(f, "has an unhealthy etcd member ({e})"),
        }
    }
}

/// The fault tolerance advice must leave etcd with: what it has now, at most 1, and no more
/// than `desired` replicas would have (a one-replica control plane tolerates no failure).
pub(crate) fn kept_tolerance(now: Tally, desired: usize) -> i64 {
    quorum::tolerance(now.voting(), now.healthy)
        .min(1)
        .min(quorum::tolerance(desired, desired))
}

/// The next safe action for a control plane. `now_unix` (Unix seconds) tells a joining Machine
/// from a broken one.
pub fn next_action(cp: &ControlPlane, policy: &Policy, now_unix: i64) -> NextAction {
    let kcp = cp.kcp_shown();
    let ns = &cp.kcp.namespace;
    if cp.kcp.etcd == EtcdTopology::External {
        return NextAction::new(
            ActionCode::None,
            format!("KubeadmControlPlane {kcp} uses external etcd: nothing for quorumguard to do"),
        );
    }
    if cp.cluster.deleting || cp.kcp.deleting {
        return NextAction::new(
            ActionCode::WaitForTeardown,
            format!(
                "{} is being deleted: let the teardown finish",
                if cp.cluster.deleting {
                    format!("Cluster {ns}/{}", cp.cluster.name)
                } else {
                    format!("KubeadmControlPlane {kcp}")
                }
            ),
        );
    }
    let snapshot = match &cp.etcd {
        EtcdState::Unknown { reason } => {
            return NextAction::new(
                ActionCode::CheckEtcdHealth,
                format!(
                    "the etcd member list of KubeadmControlPlane {kcp} is unknown ({reason}): check that etcd answers, e.g. `etcdctl member list` on a control-plane node"
                ),
            );
        }
        EtcdState::Observed(s) => s,
    };
    let stale = snapshot.age.is_some_and(|a| a > policy.max_health_age);
    let members = &snapshot.members;
    let tally = Tally::of(members, stale);
    if tally.quorum_lost() {
        return NextAction::new(
            ActionCode::RestoreQuorum,
            format!(
                "etcd of KubeadmControlPlane {kcp} has lost quorum: {} healthy of {} voting members, quorum {}. Membership cannot change without quorum: bring the stopped members back if their data is intact, otherwise restore etcd from a snapshot (https://etcd.io/docs/v3.4/op-guide/recovery/). Do not delete Machines that still hold members.",
                tally.healthy,
                tally.voting(),
                quorum::quorum(tally.voting())
            ),
        );
    }
    let active: Vec<&Machine> = by_age(
        cp.machines
            .iter()
            .filter(|m| m.control_plane && !m.deleting),
    );
    let desired = cp.kcp.replicas as usize;
    let young = |m: &Machine| {
        m.created_unix
            .is_some_and(|c| now_unix.saturating_sub(c) < policy.join_grace.as_secs() as i64)
    };

    // Joining: an added member that has not started, or a young Machine without its member.
    if let Some(u) = members.iter().find(|m| m.is_unstarted()) {
        return NextAction::new(
            ActionCode::WaitForJoin,
            format!(
                "etcd member {} of KubeadmControlPlane {kcp} has been added but has not started: wait for it to join",
                u.id
            ),
        )
        .with(u.id.to_string(), None);
    }
    if let Some(m) = active
        .iter()
        .find(|m| cp.member_of(m).is_none() && young(m))
    {
        return NextAction::new(
            ActionCode::WaitForJoin,
            format!(
                "Machine {ns}/{} is new and has no etcd member yet: wait for it to join",
                m.name
            ),
        )
        .with(m.name.clone(), None);
    }
    // cluster-api #2651: a Machine whose member is gone while there are more Machines than
    // replicas: the Machine is what is left of a scale-down or rollout step.
    if active.len() > desired {
        for m in &active {
            if m.node_name.is_some()
                && cp.member_of(m).is_none()
                && allowed(cp, m, &human(), policy, now_unix)
            {
                let cmd = format!("kubectl delete machine -n {ns} {}", m.name);
                return NextAction::new(
                    ActionCode::DeleteMachine,
                    format!(
                        "Machine {ns}/{} has a node but its etcd member is already gone, and KubeadmControlPlane {kcp} has {} Machines for {desired} replicas: delete the Machine to finish the interrupted step.",
                        m.name,
                        active.len()
                    ),
                )
                .with(m.name.clone(), Some(cmd));
            }
        }
    }

    // A deletion in flight blocks KCP's other work until it completes.
    if let Some(m) = cp
        .machines
        .iter()
        .filter(|m| m.deleting)
        .min_by(|a, b| age_order(a, b))
    {
        let mut msg = format!(
            "Machine {ns}/{} is being deleted: wait for KCP to remove its etcd member and finish the deletion.",
            m.name
        );
        if let Some(member) = cp.member_of(m).filter(|x| !x.is_learner) {
            let mut removed = Tally::default();
            removed.count(quorum::effective_ref(member, stale));
            if quorum::removal(tally, removed) != Safety::Safe {
                msg.push_str(&format!(
                    " Its member {} cannot leave safely now ({} healthy of {} voting members): make the other members healthy first.",
                    member.display_name(),
                    tally.healthy,
                    tally.voting()
                ));
            }
        }
        return NextAction::new(ActionCode::WaitForDeletion, msg).with(m.name.clone(), None);
    }

    // A learner known to be unhealthy is not catching up (its process failed while it
    // joined): waiting for it would wait for ever. Its Machine is replaced below, or, without
    // a Machine, it is removed as an orphan.
    if let Some(l) = members.iter().find(|m| {
        m.is_learner && !matches!(quorum::effective_ref(m, stale), HealthRef::Unhealthy(_))
    }) {
        return NextAction::new(
            ActionCode::WaitForLearner,
            format!(
                "etcd member {} (id {}) of KubeadmControlPlane {kcp} is a learner: wait for it to catch up and be promoted before changing membership",
                l.display_name(),
                l.id
            ),
        )
        .with(l.id.to_string(), None);
    }

    // A member no Machine accounts for: remove it, unhealthy ones first, if that is safe and
    // keeps the fault tolerance etcd has (up to the one spec.replicas asks for): with 2
    // Machines of 3 replicas and a healthy orphan, KCP adds the third Machine first.
    let mut orphans: Vec<&Member> = members
        .iter()
        .filter(|m| cp.machine_of(m).is_none())
        .collect();
    orphans.sort_by_key(|m| quorum::effective_ref(m, stale).is_healthy());
    let keep = kept_tolerance(tally, desired);
    for o in orphans {
        let mut removed = Tally::default();
        // A learner does not vote: removing it changes no count.
        if !o.is_learner {
            removed.count(quorum::effective_ref(o, stale));
        }
        let after = Tally {
            healthy: tally.healthy - removed.healthy,
            unhealthy: tally.unhealthy - removed.unhealthy,
            unknown: tally.unknown - removed.unknown,
        };
        if quorum::removal(tally, removed) == Safety::Safe
            && quorum::tolerance(after.voting(), after.healthy) >= keep
        {
            let cmd = format!("etcdctl member remove {}", o.id);
            return NextAction::new(
                ActionCode::RemoveOrphanMember,
                format!(
                    "etcd member {} (id {}) of KubeadmControlPlane {kcp} belongs to no Machine: remove it from etcd.",
                    o.display_name(),
                    o.id
                ),
            )
            .with(o.id.to_string(), Some(cmd));
        }
    }

    // A Machine whose member is unhealthy, or that never got one: KCP replaces it.
    let mut ctl = None;
    for m in &active {
        let problem = match cp.member_of(m) {
            None => Some(Problem::NoMember),
            Some(x) => match quorum::effective_ref(x, stale) {
                HealthRef::Unhealthy(e) => Some(Problem::Unhealthy(e)),
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
            let cmd = format!(
                "kubectl annotate machine -n {ns} {} {ANNOTATION_REMEDIATE}=\"\"",
                m.name
            );
            return NextAction::new(
                ActionCode::RemediateMachine,
                format!(
                    "Machine {ns}/{} {problem}: ask KCP to replace it (remediation keeps etcd quorum: {} healthy of {} voting members, quorum {}).",
                    m.name,
                    tally.healthy,
                    tally.voting(),
                    quorum::quorum(tally.voting())
                ),
            )
            .with(m.name.clone(), Some(cmd));
        }
    }

    if tally.unknown > 0 || tally.unhealthy > 0 {
        return NextAction::new(
            ActionCode::CheckEtcdHealth,
            format!(
                "etcd of KubeadmControlPlane {kcp}: {} of {} voting members are known healthy (quorum {}); {} unknown, {} unhealthy. Check them: `etcdctl endpoint health --cluster`",
                tally.healthy,
                tally.voting(),
                quorum::quorum(tally.voting()),
                tally.unknown,
                tally.unhealthy
            ),
        );
    }
    if active.len() != desired {
        return NextAction::new(
            ActionCode::WaitForRollout,
            format!(
                "KubeadmControlPlane {kcp} has {} Machines for {desired} replicas: KCP is scaling; wait for it",
                active.len()
            ),
        );
    }
    NextAction::new(
        ActionCode::None,
        format!(
            "KubeadmControlPlane {kcp} is converged: {} Machines, {} voting members, all healthy, fault tolerance {}",
            active.len(),
            tally.voting(),
            quorum::tolerance(tally.voting(), tally.healthy)
        ),
    )
}
