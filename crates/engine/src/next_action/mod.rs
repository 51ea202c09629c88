//! ControlPlane -> the single next safe action, so a human looking at a KCP knows what to do.
//!
//! Every action that implies a Machine deletion is checked against the decision rules before it
//! is named: the guard never tells anyone to do what it would deny.
//!
//! The action is the answer of the first rule that applies, in the order of `RULES`: the
//! order is the semantics (a rule may rely on every earlier one not applying). Each rule is a
//! function of its own, grouped by topic in this module's files, and reads a `Ctx` computed
//! once from the control plane.

use std::fmt;

use super::judge::{Ask, Words, judge_delete};
use super::model::*;
use super::quorum::{self, Tally};
use super::remediation::{self, Coverage};

mod clock;
mod deletions;
mod etcd;
mod learners;
mod members;
mod paused;
mod remediate;
mod scaling;
mod teardown;

use clock::Clock;
pub(crate) use clock::at as rfc3339;
pub use etcd::FREE_SPACE_COMMAND;

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
    /// A NOSPACE alarm: the database reached its quota and the cluster refuses writes. A new
    /// member would receive the same data: compact, defragment, then disarm the alarm.
    FreeSpace,
    /// A Machine whose member is already gone (cluster-api #2651): delete the Machine.
    DeleteMachine,
    /// A Machine is being deleted: wait for KCP to finish it.
    WaitForDeletion,
    /// A member or Machine is joining: wait for it.
    WaitForJoin,
    /// A learner is catching up: wait for its promotion.
    WaitForLearner,
    /// A learner past `--learner-grace`, healthy and caught up, that nobody promoted (the join
    /// was interrupted after `member add`): promote it with etcdctl.
    PromoteLearner,
    /// A member with no Machine: remove it from etcd.
    RemoveOrphanMember,
    /// A Machine whose member is unhealthy (or missing): let KCP replace it.
    RemediateMachine,
    /// A Machine KCP should replace, but no MachineHealthCheck would pass its remediation on to
    /// KCP (none covers it, or the one that does is paused or short-circuited): fix that first.
    EnableRemediation,
    /// Machines and spec.replicas differ: KCP is scaling or rolling out.
    WaitForRollout,
    /// The next step needs KCP or a MachineHealthCheck to act, but the Cluster (`spec.paused`)
    /// or the KCP (annotation `cluster.x-k8s.io/paused`) is paused, so neither does anything:
    /// unpause it, unless `clusterctl move` paused it and is still moving it.
    Unpause,
}

impl ActionCode {
    /// Every code, for documentation and exhaustive tests (the status tests check it is
    /// complete).
    pub const ALL: [ActionCode; 15] = [
        ActionCode::None,
        ActionCode::WaitForTeardown,
        ActionCode::CheckEtcdHealth,
        ActionCode::RestoreQuorum,
        ActionCode::FreeSpace,
        ActionCode::DeleteMachine,
        ActionCode::WaitForDeletion,
        ActionCode::WaitForJoin,
        ActionCode::WaitForLearner,
        ActionCode::PromoteLearner,
        ActionCode::RemoveOrphanMember,
        ActionCode::RemediateMachine,
        ActionCode::EnableRemediation,
        ActionCode::WaitForRollout,
        ActionCode::Unpause,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ActionCode::None => "None",
            ActionCode::WaitForTeardown => "WaitForTeardown",
            ActionCode::CheckEtcdHealth => "CheckEtcdHealth",
            ActionCode::RestoreQuorum => "RestoreQuorum",
            ActionCode::FreeSpace => "FreeSpace",
            ActionCode::DeleteMachine => "DeleteMachine",
            ActionCode::WaitForDeletion => "WaitForDeletion",
            ActionCode::WaitForJoin => "WaitForJoin",
            ActionCode::WaitForLearner => "WaitForLearner",
            ActionCode::PromoteLearner => "PromoteLearner",
            ActionCode::RemoveOrphanMember => "RemoveOrphanMember",
            ActionCode::RemediateMachine => "RemediateMachine",
            ActionCode::EnableRemediation => "EnableRemediation",
            ActionCode::WaitForRollout => "WaitForRollout",
            ActionCode::Unpause => "Unpause",
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
        self.target = Some(target);
        match command {
            Some(c) => self.with_command(c),
            None => self,
        }
    }

    /// Appends " Run: COMMAND" to the message and sets the command.
    fn with_command(mut self, cmd: String) -> NextAction {
        self.message.push_str(" Run: ");
        self.message.push_str(&cmd);
        self.command = Some(cmd);
        self
    }
}

impl NextAction {
    /// A remediation whose MachineHealthChecks were not read: says so, since the annotation
    /// works only through one. Said before the command, so that the message still ends with
    /// "Run: <command>" and a reader copying the command takes nothing else.
    fn unless_known(mut self, cp: &ControlPlane, m: &Machine) -> NextAction {
        if let Coverage::Unknown(reason) = remediation::coverage(cp, m) {
            let note = format!(
                " Whether a MachineHealthCheck covers Machine {}/{} is not known ({reason}): the annotation takes effect only through one (`kubectl get machinehealthchecks -n {}`).",
                cp.kcp.namespace, m.name, cp.kcp.namespace
            );
            let at = self.message.rfind(" Run: ").unwrap_or(self.message.len());
            self.message.insert_str(at, &note);
        }
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
    judge_delete(&Ask::new(cp, r, policy, now_unix, Words::DenialsOnly), m).allowed
}

/// The fault tolerance advice must leave etcd with: what it has now, at most 1, and no more
/// than `desired` replicas would have (a one-replica control plane tolerates no failure).
pub(crate) fn kept_tolerance(now: Tally, desired: usize) -> i64 {
    quorum::tolerance(now.voting(), now.healthy)
        .min(1)
        .min(quorum::tolerance(desired, desired))
}

/// What every rule past the member list reads, computed once from a control plane whose etcd
/// member list is known.
struct Ctx<'a> {
    cp: &'a ControlPlane,
    policy: &'a Policy,
    now_unix: i64,
    /// The KubeadmControlPlane as messages name it (namespace/name).
    kcp: NsName<'a>,
    ns: &'a str,
    /// Whether the member health is older than `--max-health-age`.
    stale: bool,
    members: &'a [Member],
    tally: Tally,
    /// Control-plane Machines not being deleted, oldest first.
    active: Vec<&'a Machine>,
    /// spec.replicas.
    desired: usize,
    clock: Clock<'a>,
    /// The fault tolerance advice must keep ([`kept_tolerance`]).
    keep: i64,
    join_grace: humantime::FormattedDuration,
    learner_grace: humantime::FormattedDuration,
    /// Active Machines without a (started) member, oldest first: joining, or failed to join.
    memberless: Vec<&'a Machine>,
    /// Members no Machine accounts for, those not known healthy first.
    orphans: Vec<&'a Member>,
}

impl<'a> Ctx<'a> {
    fn new(
        cp: &'a ControlPlane,
        snapshot: &'a EtcdSnapshot,
        policy: &'a Policy,
        now_unix: i64,
    ) -> Ctx<'a> {
        let stale = snapshot.age.is_some_and(|a| a > policy.max_health_age);
        let members = &snapshot.members;
        let tally = Tally::of(members, stale);
        let active: Vec<&Machine> = by_age(
            cp.machines
                .iter()
                .filter(|m| m.control_plane && !m.deleting),
        );
        let desired = cp.kcp.replicas as usize;
        let memberless: Vec<&Machine> = active
            .iter()
            .copied()
            .filter(|m| cp.member_of(m).is_none())
            .collect();
        let mut orphans: Vec<&Member> = members
            .iter()
            .filter(|m| cp.machine_of(m).is_none())
            .collect();
        orphans.sort_by_key(|m| quorum::effective_ref(m, stale).is_healthy());
        Ctx {
            cp,
            policy,
            now_unix,
            kcp: NsName(&cp.kcp.namespace, &cp.kcp.name),
            ns: &cp.kcp.namespace,
            stale,
            members,
            tally,
            active,
            desired,
            clock: Clock { policy, now_unix },
            keep: kept_tolerance(tally, desired),
            join_grace: humantime::format_duration(policy.join_grace),
            learner_grace: humantime::format_duration(policy.learner_grace),
            memberless,
            orphans,
        }
    }

    /// Whether `r` deleting `m` would be allowed now.
    fn allowed(&self, m: &Machine, r: &Requester) -> bool {
        allowed(self.cp, m, r, self.policy, self.now_unix)
    }
}

/// A rule: the action when it applies.
type Rule = fn(&Ctx) -> Option<NextAction>;

/// The rules that read etcd's member list, in the order they are tried: the first that applies
/// names the action; when none does, the control plane is [`scaling::converged`]. Before
/// them, [`next_action`] tries the rules that need no member list ([`teardown`]) and names a
/// member list that is unknown ([`etcd::unknown_members`]).
const RULES: &[Rule] = &[
    etcd::free_space,
    etcd::quorum_lost,
    members::unstarted_members,
    scaling::joining_machine,
    deletions::leftover_machine,
    deletions::deletion_in_flight,
    learners::learners,
    members::orphan_member,
    remediate::refused_remediation,
    remediate::remediate,
    etcd::health_unknown,
    scaling::scaling,
];

/// The next safe action for a control plane. `now_unix` (Unix seconds) tells a joining Machine
/// from a broken one, and a learner catching up from a stalled one. On a paused control plane,
/// an action that KCP or a MachineHealthCheck would have to carry out becomes `Unpause`, which
/// names it as what follows the unpausing.
pub fn next_action(cp: &ControlPlane, policy: &Policy, now_unix: i64) -> NextAction {
    #[cfg(any(test, feature = "testkit"))]
    crate::testkit::asked_next_action(cp);
    paused::when_paused(cp, next_action_unpaused(cp, policy, now_unix))
}

fn next_action_unpaused(cp: &ControlPlane, policy: &Policy, now_unix: i64) -> NextAction {
    if let Some(a) = teardown::RULES.iter().find_map(|rule| rule(cp)) {
        return a;
    }
    let snapshot = match &cp.etcd {
        EtcdState::Unknown { reason } => return etcd::unknown_members(cp, reason),
        EtcdState::Observed(s) => s,
    };
    let ctx = Ctx::new(cp, snapshot, policy, now_unix);
    RULES
        .iter()
        .find_map(|rule| rule(&ctx))
        .unwrap_or_else(|| scaling::converged(&ctx))
}
