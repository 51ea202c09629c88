//! `preflight`: the rollout a version change would start, played step by step on a copy of one
//! control plane with KCP's own step function ([`crate::kcp::reconcile`]), so that before an
//! upgrade wave a human knows which control planes would finish, which would stick (at which
//! step, and why), and at which steps one more member failure would lose etcd quorum.
//!
//! The play, one step at a time, the first that can happen:
//! 1. A Machine being deleted finishes: KCP's pre-terminate hook removes its member when
//!    KCP's own check allows it (the voting members left, less the unhealthy ones, keep a
//!    quorum, and no learner is listed), and no other hook holds the deletion.
//! 2. A Machine without a node joins, as the control plane's kubeadm joins ([`crate::joins`]):
//!    `kubeadm join` adds its member as a learner, which is then promoted; or, without
//!    learner mode, as a voting member that counts at once and starts in a later step. Either
//!    way the Machine then has its node. etcd takes one learner at a time, and adds a member
//!    only while every voting member is connected, or since etcd 3.5.30, 3.6.11 and 3.7 a
//!    quorum of them and the new one (its strict reconfiguration check, by the members' etcd
//!    version, [`crate::etcd_version`]); a voting member also needs a quorum of started
//!    members once it is in. A Machine that was already there and is past `--join-grace` (no
//!    member) or `--learner-grace` (a learner) is taken as stopped, as the next action does.
//! 3. KCP reconciles ([`crate::kcp::reconcile`]): remediation, then scale up (a new Machine of
//!    the new version) or down (the victim's deletion, answered by the guard's own rules, as
//!    KCP's controller identity).
//!
//! When none can happen and the control plane has not converged, the rollout sticks there. No
//! I/O, no clock: the present is passed in.

use std::fmt;

use super::decide::admit_deletion;
use super::etcd_version::{AddRefusal, add_member_rule, member_add_refusal};
use super::joins::JoinStyle;
use super::kcp::{self, Hold, KcpMachine, KcpMove, KcpView, MemberFit};
use super::model::*;
use super::next_action::{ActionCode, NextAction, next_action};
use super::quorum::quorum;

/// KCP's own pre-terminate hook: it removes the member.
pub const KCP_PRE_TERMINATE_HOOK: &str =
    "pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup";
const PRE_TERMINATE_PREFIX: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/";
const PRE_DRAIN_PREFIX: &str = "pre-drain.delete.hook.machine.cluster.x-k8s.io/";

/// Stable reasons of a prediction: the metric's `reason` label (bounded) and the JSON's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReadyReason {
    /// Every step keeps a fault tolerance of at least 1, and the rollout finishes.
    Ready,
    /// etcd is external: a rollout does not change its membership.
    ExternalEtcd,
    /// A Machine's member is unhealthy (down, frozen, an alarm, never started): KCP's preflight
    /// holds every scale operation.
    MemberUnhealthy,
    /// A Machine's member is a learner nobody will promote.
    LearnerNotPromoted,
    /// etcd lists a member no Machine claims (an orphan, or a learner that never started).
    LeftoverMember,
    /// A Machine's deletion cannot finish.
    DeletionHeld,
    /// A Machine has no node, and its join will not finish.
    JoinStuck,
    /// The guard would deny a deletion KCP makes.
    WebhookDenies,
    /// A step at which one more member failure loses quorum.
    FaultToleranceZero,
    /// Cluster or KCP is being deleted: no rollout.
    Teardown,
    /// The member list or a member's health is unknown.
    EtcdUnknown,
}

impl ReadyReason {
    pub const ALL: [ReadyReason; 11] = [
        ReadyReason::Ready,
        ReadyReason::ExternalEtcd,
        ReadyReason::MemberUnhealthy,
        ReadyReason::LearnerNotPromoted,
        ReadyReason::LeftoverMember,
        ReadyReason::DeletionHeld,
        ReadyReason::JoinStuck,
        ReadyReason::WebhookDenies,
        ReadyReason::FaultToleranceZero,
        ReadyReason::Teardown,
        ReadyReason::EtcdUnknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReadyReason::Ready => "Ready",
            ReadyReason::ExternalEtcd => "ExternalEtcd",
            ReadyReason::MemberUnhealthy => "MemberUnhealthy",
            ReadyReason::LearnerNotPromoted => "LearnerNotPromoted",
            ReadyReason::LeftoverMember => "LeftoverMember",
            ReadyReason::DeletionHeld => "DeletionHeld",
            ReadyReason::JoinStuck => "JoinStuck",
            ReadyReason::WebhookDenies => "WebhookDenies",
            ReadyReason::FaultToleranceZero => "FaultToleranceZero",
            ReadyReason::Teardown => "Teardown",
            ReadyReason::EtcdUnknown => "EtcdUnknown",
        }
    }
}

impl fmt::Display for ReadyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Hold> for ReadyReason {
    /// The reason a rollout sticks on when KCP's preflight holds it this way.
    fn from(hold: Hold) -> Self {
        match hold {
            Hold::Deleting(_) => ReadyReason::DeletionHeld,
            Hold::NoNode(_) => ReadyReason::JoinStuck,
            Hold::Member(_, MemberFit::Learner) => ReadyReason::LearnerNotPromoted,
            Hold::Member(..) => ReadyReason::MemberUnhealthy,
            Hold::OrphanMembers(_) => ReadyReason::LeftoverMember,
        }
    }
}

/// The prediction for one control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// The rollout finishes and every step tolerates one more member failure.
    Ready,
    /// The rollout stops at step `at` of `of` (1-based: `at` is the step that cannot happen).
    WouldStick { at: usize, of: usize },
    /// The rollout finishes, but at step `at` of `of` one more member failure loses quorum (or a
    /// member is already down).
    Unsafe { at: usize, of: usize },
    /// Not enough is known to predict: the reason says what.
    CannotJudge,
}

impl Readiness {
    /// `READY`, `WOULD STICK`, `UNSAFE`, `CANNOT JUDGE`.
    pub fn label(&self) -> &'static str {
        match self {
            Readiness::Ready => "READY",
            Readiness::WouldStick { .. } => "WOULD STICK",
            Readiness::Unsafe { .. } => "UNSAFE",
            Readiness::CannotJudge => "CANNOT JUDGE",
        }
    }
}

/// What kind of step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// KCP creates a Machine of the new version.
    Create,
    /// The new Machine's join adds its member as a learner.
    Join,
    /// The learner is promoted: it votes, and its Machine has its node.
    Promote,
    /// A voting member added by a join (kubeadm without learner mode) starts and catches up;
    /// its Machine has its node.
    Start,
    /// KCP deletes a Machine (scale-down or remediation); the guard answers.
    Delete,
    /// The deletion finishes: KCP's pre-terminate hook removed the member, the Machine is gone.
    Removed,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Create => "create",
            StepKind::Join => "join",
            StepKind::Promote => "promote",
            StepKind::Start => "start",
            StepKind::Delete => "delete",
            StepKind::Removed => "removed",
        }
    }
}

/// etcd's figures after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub voting: usize,
    pub healthy: usize,
    pub learners: usize,
    pub quorum: usize,
    /// Healthy minus quorum: 0 means one more failure loses quorum.
    pub fault_tolerance: i64,
}

impl Counts {
    fn of(members: &[Member]) -> Counts {
        let voting = members.iter().filter(|m| !m.is_learner).count();
        let healthy = members
            .iter()
            .filter(|m| !m.is_learner && m.effective_health_ref().is_healthy())
            .count();
        let learners = members.iter().filter(|m| m.is_learner).count();
        Counts {
            voting,
            healthy,
            learners,
            quorum: quorum(voting),
            fault_tolerance: healthy as i64 - quorum(voting) as i64,
        }
    }
}

/// What one more member failure right after a step leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OneFailure {
    /// The member that fails: the first healthy voting member by name that is not leaving.
    pub member: String,
    pub quorum_kept: bool,
    /// The rollout, played on from there with that member down: `None` when it still
    /// finishes, else the step (counted from the start) where it sticks.
    pub sticks_at: Option<usize>,
    /// The sentence for the table.
    pub text: String,
}

/// One step of the rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutStep {
    /// 1-based.
    pub index: usize,
    pub kind: StepKind,
    /// The Machine the step is about.
    pub machine: String,
    /// What happens, in words.
    pub action: String,
    /// After the step.
    pub counts: Counts,
    /// The guard's answer to the step's deletion (a [`StepKind::Delete`] step): `allowed` or
    /// `denied`, the reason code and the message.
    pub webhook: Option<String>,
    /// One more member failure right after this step (`None` when no voting member is
    /// healthy to fail).
    pub one_failure: Option<OneFailure>,
}

/// The prediction for one control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preflight {
    pub readiness: Readiness,
    pub reason: ReadyReason,
    /// Why, in words, naming the objects and the numbers.
    pub why: String,
    /// The steps that happen (a rollout that sticks stops before its step `at`).
    pub steps: Vec<RolloutStep>,
    /// The steps the rollout takes when nothing holds it.
    pub total: usize,
    /// etcd's figures before the first step.
    pub start: Option<Counts>,
    /// What clears it (for READY: how to start the rollout).
    pub next_action: NextAction,
}

impl Preflight {
    /// `READY`, `WOULD STICK at step k/n: why`, `UNSAFE at step k/n: why`, `CANNOT JUDGE: why`.
    pub fn summary(&self) -> String {
        match &self.readiness {
            Readiness::Ready => format!("READY: {}", self.why),
            Readiness::WouldStick { at, of } => {
                format!("WOULD STICK at step {at}/{of}: {}", self.why)
            }
            Readiness::Unsafe { at, of } => format!("UNSAFE at step {at}/{of}: {}", self.why),
            Readiness::CannotJudge => format!("CANNOT JUDGE: {}", self.why),
        }
    }
}

/// A step that happened: its kind, its Machine, its words and the guard's answer.
type Happened = (StepKind, String, String, Option<String>);
/// Why nothing can happen.
type Stuck = (ReadyReason, String);
/// The next step, `None` when converged.
type Played = Result<Option<Happened>, Stuck>;

/// Where the play ended.
#[derive(Clone, Debug)]
enum End {
    Finished,
    Stuck { reason: ReadyReason, why: String },
}

/// The control plane as the play changes it.
#[derive(Clone, Debug)]
struct Sim<'p> {
    cp: ControlPlane,
    /// Machines created by the play (of the new version); the others are outdated.
    new: Vec<String>,
    policy: &'p Policy,
    now: i64,
    created: usize,
    /// Voting joins the play started: the Machine and the member `kubeadm join` added, which
    /// etcd lists without a name until its process starts.
    starting: Vec<(String, MemberId)>,
}

/// Predicts the rollout a version change would start on `cp`, as of `now_unix`, with what one
/// more member failure at each step would lead to.
pub fn preflight(cp: &ControlPlane, policy: &Policy, now_unix: i64) -> Preflight {
    predict(cp, policy, now_unix, true)
}

/// [`preflight`] without the one-more-failure column (each step's [`RolloutStep::one_failure`]
/// is `None`): the same readiness, reason and steps at a fraction of the cost, for a fleet's
/// every sweep (the failure column plays the rest of the rollout again after every step).
pub fn readiness(cp: &ControlPlane, policy: &Policy, now_unix: i64) -> Preflight {
    predict(cp, policy, now_unix, false)
}

fn predict(cp: &ControlPlane, policy: &Policy, now_unix: i64, failures: bool) -> Preflight {
    if let Some(p) = cannot_play(cp, policy, now_unix) {
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
    let next_action = next_for(cp, &last, &readiness, &why, policy, now_unix);
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
fn cannot_play(cp: &ControlPlane, policy: &Policy, now: i64) -> Option<Preflight> {
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
                        super::quorum::effective_ref(m, stale),
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
        let next = next_action(cp, policy, now);
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
    let say = |c: &Counts| {
        let not_healthy = c.voting - c.healthy;
        if c.fault_tolerance < 0 {
            format!(
                "quorum lost: {} healthy of {} voting members, {} needed; etcd takes no writes until {} more {} healthy",
                c.healthy,
                c.voting,
                c.quorum,
                -c.fault_tolerance,
                if c.fault_tolerance == -1 { "is" } else { "are" }
            )
        } else if c.healthy < c.voting {
            format!(
                "{} of {} voting members healthy (quorum {}): {not_healthy} {} not (down, or added and not started yet), and one more failure {}",
                c.healthy,
                c.voting,
                c.quorum,
                if not_healthy == 1 { "is" } else { "are" },
                if c.fault_tolerance < 1 {
                    "loses quorum"
                } else {
                    "leaves no margin"
                }
            )
        } else {
            format!(
                "fault tolerance 0 ({} healthy of {} voting members, quorum {}): one more member failure loses quorum",
                c.healthy, c.voting, c.quorum
            )
        }
    };
    if bad(start) {
        return Some((1, format!("already before the first step: {}", say(start))));
    }
    steps.iter().find(|s| bad(&s.counts)).map(|s| {
        (
            s.index,
            format!("after \"{}\": {}", s.action, say(&s.counts)),
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
                    "KubeadmControlPlane {kcp} has {} replicas: a member failure during the rollout loses quorum. Scale it to 3 first (`{command}`), wait for the new members, then roll out.",
                    cp.kcp.replicas
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
            // The stuck state's own next action when it names one, else the present's.
            let stuck = next_action(last, policy, now);
            let start = next_action(cp, policy, now);
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

impl<'p> Sim<'p> {
    fn new(cp: &ControlPlane, policy: &'p Policy, now: i64) -> Self {
        let mut cp = cp.clone();
        // Oldest first: KCP's victim is the oldest outdated Machine.
        cp.machines.retain(|m| m.control_plane);
        cp.machines
            .sort_by(|a, b| (a.created_unix, &a.name).cmp(&(b.created_unix, &b.name)));
        Sim {
            cp,
            new: Vec::new(),
            policy,
            now,
            created: 0,
            starting: Vec::new(),
        }
    }

    /// The same control plane with nothing to hold a rollout: every member healthy, voting and
    /// claimed by a Machine, every Machine joined, and no hook but KCP's on a deletion. Its play counts the steps
    /// a rollout takes.
    fn ideal(&self) -> Sim<'p> {
        let mut s = self.clone();
        let names: Vec<String> =
            s.cp.machines
                .iter()
                .map(|m| m.node_name.clone().unwrap_or_else(|| m.name.clone()))
                .collect();
        for m in &mut s.cp.machines {
            m.node_name.get_or_insert_with(|| m.name.clone());
            m.annotations.clear();
            m.created_unix = Some(self.now - 86_400);
        }
        let mut members: Vec<Member> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut m = Member::new(i as u64 + 1, n.clone());
                m.health = Health::Healthy;
                m
            })
            .collect();
        if members.is_empty() {
            members.push(Member::new(1, "none"));
        }
        s.cp.etcd = EtcdState::Observed(EtcdSnapshot { members, age: None });
        s
    }

    fn members(&self) -> &[Member] {
        self.cp.members()
    }

    fn members_mut(&mut self) -> &mut Vec<Member> {
        if let EtcdState::Unknown { .. } = self.cp.etcd {
            self.cp.etcd = EtcdState::Observed(EtcdSnapshot {
                members: Vec::new(),
                age: None,
            });
        }
        match &mut self.cp.etcd {
            EtcdState::Observed(s) => &mut s.members,
            EtcdState::Unknown { .. } => unreachable!("set just above"),
        }
    }

    fn member_index(&self, machine: &Machine) -> Option<usize> {
        let name = machine.node_name.as_deref().unwrap_or(&machine.name);
        self.members()
            .iter()
            .position(|m| !m.is_unstarted() && m.name == name)
    }

    fn is_new(&self, machine: &Machine) -> bool {
        self.new.contains(&machine.name)
    }

    fn age_past(&self, machine: &Machine, grace: std::time::Duration) -> bool {
        machine
            .created_unix
            .is_none_or(|c| self.now.saturating_sub(c) > grace.as_secs() as i64)
    }

    fn has_quorum(&self) -> bool {
        let c = Counts::of(self.members());
        c.healthy >= c.quorum
    }

    /// KCP's view of the control plane.
    fn view(&self) -> (Vec<KcpMachine>, u32) {
        let machines = self
            .cp
            .machines
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let member = match self.member_index(m).map(|i| &self.members()[i]) {
                    None => MemberFit::Missing,
                    Some(x) if x.is_learner => MemberFit::Learner,
                    // KCP's etcd check marks a member with any alarm unhealthy (v1.14
                    // `updateManagedEtcdConditions`), NOSPACE included, though raft is fine.
                    Some(x) if !x.effective_health_ref().is_healthy() || !x.alarms.is_empty() => {
                        MemberFit::Unhealthy
                    }
                    Some(_) => MemberFit::Healthy,
                };
                KcpMachine {
                    key: i as u32,
                    outdated: !self.is_new(m),
                    node: m.node_name.is_some(),
                    deleting: m.deleting,
                    remediate: m.annotation(ANNOTATION_REMEDIATE).is_some(),
                    delete_first: m.annotation(ANNOTATION_DELETE_MACHINE).is_some(),
                    member,
                }
            })
            .collect();
        let orphans = self
            .members()
            .iter()
            .filter(|x| x.is_unstarted() || self.cp.machine_of(x).is_none())
            .count();
        (machines, orphans as u32)
    }

    /// Plays until the control plane converges or nothing can happen. With `failures`, each
    /// step also says what one more member failure there would lead to. Returns the steps,
    /// how it ended, and the control plane as it ended.
    fn play(mut self, failures: bool) -> (Vec<RolloutStep>, End, ControlPlane) {
        let mut steps: Vec<RolloutStep> = Vec::new();
        let limit = 8 * (self.cp.machines.len() + self.cp.kcp.replicas as usize) + 16;
        let end = loop {
            if steps.len() >= limit {
                break End::Stuck {
                    reason: ReadyReason::JoinStuck,
                    why: format!("no end after {limit} steps: KCP keeps acting without converging"),
                };
            }
            match self.step() {
                Ok(Some((kind, machine, action, webhook))) => {
                    let index = steps.len() + 1;
                    let one_failure = failures.then(|| self.one_failure(index)).flatten();
                    steps.push(RolloutStep {
                        index,
                        kind,
                        machine,
                        action,
                        counts: Counts::of(self.members()),
                        webhook,
                        one_failure,
                    });
                }
                Ok(None) => break End::Finished,
                Err((reason, why)) => break End::Stuck { reason, why },
            }
        };
        (steps, end, self.cp)
    }

    /// One more failure after step `index`: the first healthy voting member by name whose
    /// Machine is not being deleted fails; the rollout is played on from there.
    fn one_failure(&self, index: usize) -> Option<OneFailure> {
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
        let sticks_at = match end {
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
        let then = match &end {
            End::Finished => "the rollout still finishes".to_string(),
            End::Stuck { why, .. } => {
                format!(
                    "the rollout sticks at step {}: {why}",
                    index + rest.len() + 1
                )
            }
        };
        let text = match (quorum_kept, &restored_by) {
            (true, _) => format!(
                "{victim} fails: quorum kept ({} of {} voting healthy, quorum {}); {then}",
                c.healthy, c.voting, c.quorum
            ),
            (false, Some(machine)) => format!(
                "{victim} fails: QUORUM LOST ({} of {} voting healthy, quorum {}): etcd refuses writes until the voting member added for Machine {machine} starts or {victim} is back; then {then}",
                c.healthy, c.voting, c.quorum
            ),
            (false, None) => format!(
                "{victim} fails: QUORUM LOST ({} of {} voting healthy, quorum {}): etcd refuses writes until {victim} is back, and the rollout stops",
                c.healthy, c.voting, c.quorum
            ),
        };
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

    /// The next step: `Ok(None)` when converged, `Err` when stuck.
    fn step(&mut self) -> Played {
        let mut held: Option<(ReadyReason, String)> = None;
        if let Some(r) = self.finish_deletion()? {
            return Ok(Some(r));
        }
        match self.join() {
            Ok(Some(r)) => return Ok(Some(r)),
            Ok(None) => {}
            Err(e) => held = Some(e),
        }
        self.reconcile(held)
    }

    /// A deleting Machine's deletion finishes, if it can.
    fn finish_deletion(&mut self) -> Played {
        let Some(pos) = self.cp.machines.iter().position(|m| m.deleting) else {
            return Ok(None);
        };
        let m = self.cp.machines[pos].clone();
        let ns = &self.cp.kcp.namespace;
        let hook = m.annotations.keys().find(|k| {
            (k.starts_with(PRE_TERMINATE_PREFIX) && k.as_str() != KCP_PRE_TERMINATE_HOOK)
                || k.starts_with(PRE_DRAIN_PREFIX)
        });
        if let Some(hook) = hook {
            return Err((
                ReadyReason::DeletionHeld,
                format!(
                    "Machine {ns}/{} is being deleted and hook {hook} (not KCP's) holds its deletion; KCP's preflight waits for every deletion to finish",
                    m.name
                ),
            ));
        }
        let member = self.member_index(&m);
        if let Some(i) = member {
            // KCP's check before it removes a member: the voting members left, less the
            // unhealthy ones, keep a quorum, and no learner is listed.
            let rest: Vec<&Member> = self
                .members()
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, x)| x)
                .collect();
            let learner = rest.iter().find(|x| x.is_learner || x.is_unstarted());
            let voting = rest.iter().filter(|x| !x.is_learner).count();
            let healthy = rest
                .iter()
                .filter(|x| !x.is_learner && x.effective_health_ref().is_healthy())
                .count();
            if let Some(l) = learner {
                return Err((
                    ReadyReason::LeftoverMember,
                    format!(
                        "Machine {ns}/{} is being deleted, and KCP's pre-terminate hook will not remove its member while learner {} ({}) is listed",
                        m.name,
                        l.shown_name(),
                        l.id
                    ),
                ));
            }
            if voting == 0 || healthy < quorum(voting) || !self.has_quorum() {
                return Err((
                    ReadyReason::DeletionHeld,
                    format!(
                        "Machine {ns}/{} is being deleted, and KCP's pre-terminate hook will not remove its member: {healthy} healthy of {voting} voting members would be left (quorum {})",
                        m.name,
                        quorum(voting)
                    ),
                ));
            }
            self.members_mut().remove(i);
        }
        self.cp.machines.remove(pos);
        let action = if member.is_some() {
            format!(
                "KCP's pre-terminate hook removes the etcd member of Machine {}; the Machine is gone",
                m.name
            )
        } else {
            format!("Machine {} (no etcd member) is gone", m.name)
        };
        Ok(Some((StepKind::Removed, m.name, action, None)))
    }

    /// A Machine without a node joins one step, if it can.
    fn join(&mut self) -> Played {
        let ns = self.cp.kcp.namespace.clone();
        let Some(pos) = self
            .cp
            .machines
            .iter()
            .position(|m| m.node_name.is_none() && !m.deleting)
        else {
            return Ok(None);
        };
        let m = self.cp.machines[pos].clone();
        let fresh = self.is_new(&m);
        if let Some(&(_, id)) = self.starting.iter().find(|(n, _)| *n == m.name) {
            return self.start_voting(pos, id);
        }
        let learner_join = self.cp.join_style() == JoinStyle::Learner;
        match self.member_index(&m) {
            None => {
                if !fresh && self.age_past(&m, self.policy.join_grace) {
                    return Err((
                        ReadyReason::JoinStuck,
                        format!(
                            "Machine {ns}/{} has no node and no etcd member past --join-grace {}s: its join stopped, and KCP's preflight waits for every Machine's node",
                            m.name,
                            self.policy.join_grace.as_secs()
                        ),
                    ));
                }
                if let Some(l) = self.members().iter().find(|x| x.is_learner && learner_join) {
                    return Err((
                        ReadyReason::LeftoverMember,
                        format!(
                            "the join of Machine {ns}/{} cannot add its member: etcd takes one learner at a time, and learner {} ({}) is listed (cluster-api #13221)",
                            m.name,
                            l.shown_name(),
                            l.id
                        ),
                    ));
                }
                // etcd's strict reconfiguration check (on by default) adds a member, learners
                // too, only while enough voting members are connected to the member asked:
                // every one of them before etcd PR #21641, a quorum of them and the new one
                // since (3.5.30, 3.6.11, 3.7): the version rule of [`etcd_version`]. A healthy
                // voting member stands for a connected one.
                let rule = add_member_rule(self.members());
                let c = Counts::of(self.members());
                let started = self
                    .members()
                    .iter()
                    .filter(|x| !x.is_learner && !x.is_unstarted())
                    .count();
                let refusal =
                    member_add_refusal(rule.rule, c.voting, started, c.healthy, learner_join);
                if let Some(AddRefusal::NotEnoughStarted { started, needed }) = refusal {
                    return Err((
                        ReadyReason::MemberUnhealthy,
                        format!(
                            "the join of Machine {ns}/{} cannot add its member as a voting member: etcd's strict reconfiguration check needs {needed} started voting members once it is in, and {started} of {} have started",
                            m.name, c.voting
                        ),
                    ));
                }
                if let Some(AddRefusal::NotConnected { needed, .. }) = refusal {
                    let down: Vec<String> = self
                        .members()
                        .iter()
                        .filter(|x| !x.is_learner && !x.effective_health_ref().is_healthy())
                        .map(|x| format!("{} ({})", x.shown_name(), x.id))
                        .collect();
                    return Err((
                        ReadyReason::MemberUnhealthy,
                        format!(
                            "the join of Machine {ns}/{} cannot add its member: {}, and {} {} not healthy ({} healthy of {} voting, {needed} needed)",
                            m.name,
                            rule.describe(),
                            down.join(", "),
                            if down.len() == 1 { "is" } else { "are" },
                            c.healthy,
                            c.voting
                        ),
                    ));
                }
                let id = self.members().iter().map(|x| x.id.0).max().unwrap_or(0) + 1;
                if !learner_join {
                    // kubeadm without learner mode (cmd/kubeadm/app/phases/etcd/local.go,
                    // CreateStackedEtcdStaticPodManifestFile: `AddMember`, not
                    // `AddMemberAsLearner`): the member votes from `member add`, and etcd lists
                    // it without a name until its process starts: the quorum counts it at once.
                    let mut added = Member::new(id, "");
                    added.health = Health::Unhealthy("added, not started".to_string());
                    self.members_mut().push(added);
                    self.starting.push((m.name.clone(), MemberId(id)));
                    let action = format!(
                        "the node of Machine {} joins etcd as a voting member (added, not started yet)",
                        m.name
                    );
                    return Ok(Some((StepKind::Join, m.name, action, None)));
                }
                let mut learner = Member::new(id, m.name.clone());
                learner.is_learner = true;
                learner.health = Health::Healthy;
                self.members_mut().push(learner);
                let action = format!("the node of Machine {} joins etcd as a learner", m.name);
                Ok(Some((StepKind::Join, m.name, action, None)))
            }
            Some(i) => {
                let x = self.members()[i].clone();
                if x.is_learner {
                    if !fresh && self.age_past(&m, self.policy.learner_grace) {
                        return Err((
                            ReadyReason::LearnerNotPromoted,
                            format!(
                                "etcd member {} of Machine {ns}/{} is still a learner past --learner-grace {}s: nobody will promote it, and KCP's preflight waits for it",
                                x.name,
                                m.name,
                                self.policy.learner_grace.as_secs()
                            ),
                        ));
                    }
                    if !x.effective_health_ref().is_healthy() || !self.has_quorum() {
                        return Err((
                            ReadyReason::MemberUnhealthy,
                            format!(
                                "learner {} of Machine {ns}/{} cannot be promoted: it is not healthy or etcd has no quorum",
                                x.name, m.name
                            ),
                        ));
                    }
                    self.members_mut()[i].is_learner = false;
                }
                self.cp.machines[pos].node_name = Some(x.name.clone());
                let action = format!(
                    "learner {} is promoted to a voting member; Machine {} has its node",
                    x.name, m.name
                );
                Ok(Some((StepKind::Promote, m.name, action, None)))
            }
        }
    }

    /// The voting member a Machine's join added starts: it needs etcd's quorum to catch up and
    /// publish its name, then the Machine has its node.
    fn start_voting(&mut self, pos: usize, id: MemberId) -> Played {
        let ns = self.cp.kcp.namespace.clone();
        let name = self.cp.machines[pos].name.clone();
        // It catches up from a leader, which needs a quorum of voters up, itself included
        // (etcd's one-member case: the second member restores the quorum the add took away).
        let c = Counts::of(self.members());
        if c.healthy + 1 < c.quorum {
            return Err((
                ReadyReason::MemberUnhealthy,
                format!(
                    "the voting member added for Machine {ns}/{name} cannot start: with it, {} of {} voting members are healthy, {} needed for a leader to catch it up",
                    c.healthy + 1,
                    c.voting,
                    c.quorum
                ),
            ));
        }
        let Some(i) = self.members().iter().position(|x| x.id == id) else {
            // The member was removed under the join (not a step the play takes): the join
            // stays stopped.
            return Err((
                ReadyReason::JoinStuck,
                format!("the member added for Machine {ns}/{name} is gone: its join stopped"),
            ));
        };
        let member = &mut self.members_mut()[i];
        member.name = name.clone();
        member.health = Health::Healthy;
        self.cp.machines[pos].node_name = Some(name.clone());
        self.starting.retain(|(n, _)| *n != name);
        let action =
            format!("voting member {name} starts and catches up; Machine {name} has its node");
        Ok(Some((StepKind::Start, name, action, None)))
    }

    /// KCP's reconcile: remediation, then scale up or down.
    fn reconcile(&mut self, held: Option<(ReadyReason, String)>) -> Played {
        let (machines, orphans) = self.view();
        let r = kcp::reconcile(&KcpView {
            replicas: self.cp.kcp.replicas,
            max_surge: self.cp.kcp.max_surge,
            machines: &machines,
            orphan_members: orphans,
        });
        if let Some(key) = r.remediate {
            // A deletion the API server refuses ends v1.14's reconcile with the error, and the
            // next one tries the same remediation again: nothing else moves.
            return self
                .delete(key as usize, "remediation: it is marked remediate-machine")
                .map(Some)
                .map_err(|(reason, why)| {
                    (
                        reason,
                        format!("{why} KCP retries the remediation and does nothing else until it is allowed."),
                    )
                });
        }
        match r.then {
            KcpMove::Converged => match held {
                Some(e) => Err(e),
                None => Ok(None),
            },
            KcpMove::ScaleUp => {
                self.created += 1;
                let name = format!("{}-new{}", self.cp.kcp.name, self.created);
                let mut m = Machine::new(name.clone());
                m.node_name = None;
                m.created_unix = Some(self.now);
                self.cp.machines.push(m);
                self.new.push(name.clone());
                let action = format!("KCP scales up: creates Machine {name} of the new version");
                Ok(Some((StepKind::Create, name, action, None)))
            }
            KcpMove::ScaleDown(key) => {
                let why = if self.is_new(&self.cp.machines[key as usize]) {
                    "scale-down"
                } else {
                    "scale-down: the oldest outdated Machine"
                };
                self.delete(key as usize, why).map(Some)
            }
            KcpMove::Wait(hold) => Err(held.unwrap_or_else(|| self.hold_words(hold))),
        }
    }

    /// KCP deletes Machine `pos`, answered by the guard's rules as KCP's controller.
    fn delete(&mut self, pos: usize, why: &str) -> Result<Happened, Stuck> {
        let m = self.cp.machines[pos].clone();
        let requester = Requester::new(
            self.policy
                .controllers
                .first()
                .map_or(DEFAULT_KCP_CONTROLLER, String::as_str),
        );
        let j = admit_deletion(&self.cp, &m, &requester, self.policy, self.now);
        if !j.allowed {
            return Err((
                ReadyReason::WebhookDenies,
                format!(
                    "the guard denies KCP's deletion of Machine {} ({why}): {}",
                    m.name, j.message
                ),
            ));
        }
        self.cp.machines[pos].deleting = true;
        let action = format!("KCP deletes Machine {} ({why})", m.name);
        let answer = format!("allowed ({})", j.reason.as_str());
        Ok((StepKind::Delete, m.name, action, Some(answer)))
    }

    /// Why KCP's preflight holds, in words.
    fn hold_words(&self, hold: Hold) -> (ReadyReason, String) {
        (ReadyReason::from(hold), self.hold_sentence(hold))
    }

    /// [`Sim::hold_words`]'s sentence.
    fn hold_sentence(&self, hold: Hold) -> String {
        let ns = &self.cp.kcp.namespace;
        let name = |key: u32| {
            self.cp
                .machines
                .get(key as usize)
                .map_or_else(String::new, |m| m.name.clone())
        };
        match hold {
            Hold::Deleting(k) => format!(
                "Machine {ns}/{} is being deleted and its deletion cannot finish; KCP waits for it",
                name(k)
            ),
            Hold::NoNode(k) => format!(
                "Machine {ns}/{} has no node; KCP's preflight waits for it",
                name(k)
            ),
            Hold::Member(k, fit) => {
                let m = &self.cp.machines[k as usize];
                let shown = self
                    .member_index(m)
                    .map(|i| {
                        let x = &self.members()[i];
                        match x.effective_health_ref() {
                            HealthRef::Unhealthy(why) => format!("{} ({why})", x.shown_name()),
                            _ => format!("{}", x.shown_name()),
                        }
                    })
                    .unwrap_or_default();
                match fit {
                    MemberFit::Learner => format!(
                        "the etcd member of Machine {ns}/{} is a learner; KCP's preflight waits for its promotion",
                        m.name
                    ),
                    MemberFit::Missing => format!(
                        "Machine {ns}/{} has no etcd member; KCP's preflight holds every scale operation",
                        m.name
                    ),
                    _ => format!(
                        "etcd member {shown} of Machine {ns}/{} is not healthy; KCP's preflight holds every scale operation until it is",
                        m.name
                    ),
                }
            }
            Hold::OrphanMembers(_) => {
                let orphans: Vec<String> = self
                    .members()
                    .iter()
                    .filter(|x| x.is_unstarted() || self.cp.machine_of(x).is_none())
                    .map(|x| {
                        format!(
                            "{} ({}{})",
                            x.shown_name(),
                            x.id,
                            if x.is_learner { ", a learner" } else { "" }
                        )
                    })
                    .collect();
                format!(
                    "etcd lists member(s) no Machine claims: {}; KCP's etcd check fails while they are listed, and etcd takes one learner at a time",
                    orphans.join(", ")
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;

    /// The control planes of these tests join learners, as KCP's kubeadm does by default since
    /// v1.29 (the playground's too); voting joins set v1.28 (`voting_joins_*`).
    fn cp(replicas: u32, members: &[(&str, Health)]) -> ControlPlane {
        let mut c = crate::testkit::cp(replicas, members);
        c.kcp.version = Some("v1.32.0".into());
        c
    }

    fn three() -> ControlPlane {
        cp(
            3,
            &[("m1", healthy()), ("m2", healthy()), ("m3", healthy())],
        )
    }

    fn predict(c: &ControlPlane) -> Preflight {
        preflight(c, &Policy::default(), NOW)
    }

    fn kinds(p: &Preflight) -> Vec<&'static str> {
        p.steps.iter().map(|s| s.kind.as_str()).collect()
    }

    #[test]
    fn a_healthy_three_member_control_plane_is_ready_in_fifteen_steps() {
        let p = predict(&three());
        assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
        assert_eq!(p.total, 15);
        assert_eq!(
            kinds(&p)[..5],
            ["create", "join", "promote", "delete", "removed"]
        );
        assert_eq!(p.steps[3].machine, "m1", "the oldest outdated goes first");
        assert!(
            p.steps[3]
                .webhook
                .as_deref()
                .is_some_and(|w| w.starts_with("allowed"))
        );
        let ft: Vec<i64> = p.steps.iter().map(|s| s.counts.fault_tolerance).collect();
        assert!(ft.iter().all(|f| *f >= 1), "{ft:?}");
        // The new Machines replaced the old ones.
        let removed: Vec<&str> = p
            .steps
            .iter()
            .filter(|s| s.kind == StepKind::Removed)
            .map(|s| s.machine.as_str())
            .collect();
        assert_eq!(removed, ["m1", "m2", "m3"]);
        let f = p.steps[2].one_failure.as_ref().expect("a member can fail");
        assert!(f.quorum_kept && f.sticks_at.is_some(), "{f:?}");
    }

    #[test]
    fn a_member_down_sticks_at_the_first_step() {
        let c = cp(3, &[("m1", healthy()), ("m2", down()), ("m3", healthy())]);
        let p = predict(&c);
        assert_eq!(
            p.readiness,
            Readiness::WouldStick { at: 1, of: 15 },
            "{}",
            p.summary()
        );
        assert_eq!(p.reason, ReadyReason::MemberUnhealthy);
        assert!(p.why.contains("m2"), "{}", p.why);
        assert_eq!(
            p.next_action.code,
            ActionCode::RemediateMachine,
            "{:?}",
            p.next_action
        );
    }

    #[test]
    fn one_and_two_replicas_finish_but_are_unsafe_from_the_start() {
        for c in [
            cp(1, &[("m1", healthy())]),
            cp(2, &[("m1", healthy()), ("m2", healthy())]),
        ] {
            let p = predict(&c);
            let n = 5 * c.machines.len();
            assert_eq!(
                p.readiness,
                Readiness::Unsafe { at: 1, of: n },
                "{}",
                p.summary()
            );
            assert_eq!(p.steps.len(), n);
            assert_eq!(p.reason, ReadyReason::FaultToleranceZero);
            assert!(
                p.next_action.message.contains("--replicas=3"),
                "{:?}",
                p.next_action
            );
        }
    }

    #[test]
    fn max_surge_zero_on_three_replicas_is_unsafe_at_its_first_removal() {
        let mut c = three();
        c.kcp.max_surge = 0;
        let p = predict(&c);
        assert_eq!(
            kinds(&p)[..5],
            ["delete", "removed", "create", "join", "promote"]
        );
        assert_eq!(
            p.readiness,
            Readiness::Unsafe { at: 2, of: 15 },
            "{}",
            p.summary()
        );
        let f = p.steps[1].one_failure.as_ref().expect("a member can fail");
        assert!(!f.quorum_kept, "{f:?}");
    }

    #[test]
    fn a_leftover_unstarted_learner_sticks_at_the_first_step() {
        let mut c = three();
        add_member(&mut c, 9, "", healthy(), true);
        let p = predict(&c);
        assert_eq!(
            p.readiness,
            Readiness::WouldStick { at: 1, of: 15 },
            "{}",
            p.summary()
        );
        assert_eq!(p.reason, ReadyReason::LeftoverMember);
        assert_eq!(
            p.next_action.code,
            ActionCode::RemoveOrphanMember,
            "{:?}",
            p.next_action
        );
    }

    #[test]
    fn a_learner_past_its_grace_sticks_and_a_young_one_is_promoted() {
        let mut c = three();
        add_machine(&mut c, "m4");
        add_member(&mut c, 4, "m4", healthy(), true);
        machine_mut(&mut c, "m4").node_name = None;
        let p = predict(&c);
        assert_eq!(p.reason, ReadyReason::LearnerNotPromoted, "{}", p.summary());
        assert_eq!(p.readiness, Readiness::WouldStick { at: 1, of: 17 });
        assert_eq!(
            p.next_action.code,
            ActionCode::PromoteLearner,
            "{:?}",
            p.next_action
        );
        machine_mut(&mut c, "m4").created_unix = Some(NOW - 30);
        let p = predict(&c);
        assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
        assert_eq!(kinds(&p)[..3], ["promote", "delete", "removed"]);
    }

    #[test]
    fn four_machines_for_three_replicas_scale_down_first_and_finish() {
        let c = cp(
            3,
            &[
                ("m1", healthy()),
                ("m2", healthy()),
                ("m3", healthy()),
                ("m4", healthy()),
            ],
        );
        let p = predict(&c);
        assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
        assert_eq!(kinds(&p)[..3], ["delete", "removed", "create"]);
        assert_eq!(p.steps.len(), 17);
    }

    #[test]
    fn a_machine_held_by_a_foreign_hook_sticks_and_kcps_own_finishes() {
        let mut c = cp(
            3,
            &[
                ("m1", healthy()),
                ("m2", healthy()),
                ("m3", healthy()),
                ("m4", healthy()),
            ],
        );
        let m = machine_mut(&mut c, "m4");
        m.deleting = true;
        m.annotations
            .insert(KCP_PRE_TERMINATE_HOOK.to_string(), String::new());
        let p = predict(&c);
        assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
        assert_eq!(p.steps[0].kind, StepKind::Removed);
        let m = machine_mut(&mut c, "m4");
        m.annotations.insert(
            "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup".into(),
            String::new(),
        );
        let p = predict(&c);
        // Once the deletion finishes: its removal, then fifteen steps.
        assert_eq!(
            p.readiness,
            Readiness::WouldStick { at: 1, of: 16 },
            "{}",
            p.summary()
        );
        assert_eq!(p.reason, ReadyReason::DeletionHeld);
        assert!(p.why.contains("backup"), "{}", p.why);
    }

    #[test]
    fn five_replicas_with_one_down_stick_and_healthy_five_are_ready() {
        let names = ["m1", "m2", "m3", "m4", "m5"];
        let mut members: Vec<(&str, Health)> = names.iter().map(|n| (*n, healthy())).collect();
        let p = predict(&cp(5, &members));
        assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
        assert_eq!(p.total, 25);
        members[3].1 = down();
        let p = predict(&cp(5, &members));
        assert_eq!(
            p.readiness,
            Readiness::WouldStick { at: 1, of: 25 },
            "{}",
            p.summary()
        );
    }

    #[test]
    fn readiness_is_preflight_without_the_failure_column() {
        for c in [
            three(),
            cp(1, &[("m1", healthy())]),
            cp(3, &[("m1", healthy()), ("m2", down()), ("m3", healthy())]),
        ] {
            let full = predict(&c);
            let mut light = readiness(&c, &Policy::default(), NOW);
            assert!(light.steps.iter().all(|s| s.one_failure.is_none()));
            assert!(full.steps.iter().all(|s| s.one_failure.is_some()));
            for (l, f) in light.steps.iter_mut().zip(&full.steps) {
                l.one_failure = f.one_failure.clone();
            }
            assert_eq!(light, full);
        }
    }

    #[test]
    fn a_member_down_keeps_etcd_from_adding_the_next_learner() {
        // One more failure right after KCP created the new Machine: quorum holds, but etcd's
        // strict reconfiguration check refuses the join's member add until m1 is back.
        let p = predict(&three());
        assert_eq!(p.steps[0].kind, StepKind::Create);
        let f = p.steps[0].one_failure.as_ref().expect("a member can fail");
        assert_eq!(f.member, "m1");
        assert!(f.quorum_kept, "{f:?}");
        assert_eq!(f.sticks_at, Some(2), "{f:?}");
        assert!(
            f.text.contains("every voting member is connected"),
            "{}",
            f.text
        );
    }

    fn with_etcd(mut c: ControlPlane, version: Option<&str>) -> ControlPlane {
        if let EtcdState::Observed(s) = &mut c.etcd {
            for m in &mut s.members {
                m.version = version.map(str::to_string);
            }
        }
        c
    }

    fn five() -> ControlPlane {
        let names = ["m1", "m2", "m3", "m4", "m5"];
        let members: Vec<(&str, Health)> = names.iter().map(|n| (*n, healthy())).collect();
        cp(5, &members)
    }

    #[test]
    fn a_join_with_one_of_five_down_follows_the_etcd_version() {
        // One member fails right after KCP created the sixth Machine: 5 voting, 4 connected.
        // Before etcd PR #21641 the join's learner add is refused until the member is back;
        // with it (3.5.30, 3.6.11, 3.7) 4 >= quorum(6) = 4 lets the learner in.
        for (version, strict) in [
            (None, true),
            (Some("3.4.23"), true),
            (Some("3.5.1"), true),
            (Some("3.5.29"), true),
            (Some("3.6.10"), true),
            (Some("3.5.30"), false),
            (Some("3.6.11"), false),
            (Some("3.7.0"), false),
        ] {
            let p = predict(&with_etcd(five(), version));
            assert_eq!(
                p.readiness,
                Readiness::Ready,
                "{version:?}: {}",
                p.summary()
            );
            assert_eq!(p.steps[0].kind, StepKind::Create);
            let f = p.steps[0].one_failure.as_ref().expect("a member can fail");
            assert!(f.quorum_kept, "{version:?}: {f:?}");
            let at_join = f.sticks_at == Some(2);
            assert_eq!(at_join, strict, "{version:?}: {f:?}");
            if strict {
                assert!(
                    f.text.contains("every voting member is connected"),
                    "{}",
                    f.text
                );
                let shown = version.map_or(
                    "etcd (version unknown, taken as before 3.5.30) adds".to_string(),
                    |v| format!("etcd {v} adds"),
                );
                assert!(f.text.contains(&shown), "{version:?}: {}", f.text);
            } else {
                assert!(
                    !f.text.contains("cannot add its member"),
                    "{version:?}: {}",
                    f.text
                );
            }
        }
    }

    #[test]
    fn with_21641_one_of_three_down_still_keeps_the_learner_out() {
        // etcd's own e2e test: "1 out of 3 members is down, reject adding member" (2 < quorum(4)).
        let p = predict(&with_etcd(three(), Some("3.6.11")));
        let f = p.steps[0].one_failure.as_ref().expect("a member can fail");
        assert_eq!(f.sticks_at, Some(2), "{f:?}");
        assert!(
            f.text
                .contains("etcd 3.6.11 adds a member only while a quorum"),
            "{}",
            f.text
        );
        assert!(f.text.contains("3 needed"), "{}", f.text);
    }

    #[test]
    fn a_refused_remediation_sticks_kcp_where_it_is() {
        let mut c = cp(3, &[("m1", healthy()), ("m2", down()), ("m3", healthy())]);
        machine_mut(&mut c, "m1")
            .annotations
            .insert(ANNOTATION_REMEDIATE.into(), String::new());
        let p = predict(&c);
        assert_eq!(
            p.readiness,
            Readiness::WouldStick { at: 1, of: 15 },
            "{}",
            p.summary()
        );
        assert_eq!(p.reason, ReadyReason::WebhookDenies, "{}", p.summary());
        assert!(
            p.why.contains("m1") && p.why.contains("retries"),
            "{}",
            p.why
        );
    }

    #[test]
    fn unknown_health_cannot_be_judged() {
        let c = cp(
            3,
            &[
                ("m1", healthy()),
                ("m2", Health::Unknown),
                ("m3", healthy()),
            ],
        );
        let p = predict(&c);
        assert_eq!(p.readiness, Readiness::CannotJudge);
        assert_eq!(p.reason, ReadyReason::EtcdUnknown);
        let mut c = three();
        c.etcd = EtcdState::Unknown {
            reason: "connection refused".into(),
        };
        assert_eq!(predict(&c).readiness, Readiness::CannotJudge);
    }

    #[test]
    fn a_healthy_rollouts_one_failure_column_names_a_member_that_is_not_leaving() {
        let p = predict(&three());
        let at_delete = &p.steps[3];
        assert_eq!(at_delete.kind, StepKind::Delete);
        let f = at_delete.one_failure.as_ref().expect("a member can fail");
        assert_ne!(f.member, "m1", "m1 is leaving");
        assert!(f.quorum_kept, "{f:?}");
        let last = p.steps.last().expect("steps");
        let f = last.one_failure.as_ref().expect("a member can fail");
        assert_eq!(f.sticks_at, None, "the rollout is done: {f:?}");
    }

    /// kubeadm v1.28 without the `EtcdLearnerMode` gate: voting joins.
    fn voting(members: &[(&str, Health)]) -> ControlPlane {
        let mut c = cp(members.len() as u32, members);
        c.kcp.version = Some("v1.28.0".into());
        c
    }

    fn three_voting() -> ControlPlane {
        voting(&[("m1", healthy()), ("m2", healthy()), ("m3", healthy())])
    }

    #[test]
    fn voting_joins_count_at_once_and_start_in_a_later_step() {
        for etcd in ["3.4.23", "3.5.30"] {
            let p = predict(&with_etcd(three_voting(), Some(etcd)));
            assert_eq!(
                kinds(&p)[..5],
                ["create", "join", "start", "delete", "removed"]
            );
            assert_eq!(
                p.steps[1].counts,
                Counts {
                    voting: 4,
                    healthy: 3,
                    learners: 0,
                    quorum: 3,
                    fault_tolerance: 0
                }
            );
            // Every voting join of a 3-member control plane passes through fault tolerance 0.
            assert_eq!(
                p.readiness,
                Readiness::Unsafe { at: 2, of: 15 },
                "{}",
                p.summary()
            );
            assert!(p.why.contains("added and not started yet"), "{}", p.why);
            // One more failure in that window loses quorum until the new member starts.
            let f = p.steps[1].one_failure.as_ref().expect("a member can fail");
            assert!(!f.quorum_kept, "{f:?}");
            assert!(
                f.text.contains(
                    "until the voting member added for Machine kcp-new1 starts or m1 is back"
                ),
                "{}",
                f.text
            );
            assert_eq!(p.steps.len(), 15);
        }
    }

    #[test]
    fn the_learner_gate_on_v1_28_plays_learner_joins() {
        let mut c = three_voting();
        c.kcp.etcd_learner_mode = Some(true);
        let p = predict(&c);
        assert_eq!(kinds(&p)[..3], ["create", "join", "promote"]);
        assert_eq!(p.readiness, Readiness::Ready, "{}", p.summary());
    }
}
