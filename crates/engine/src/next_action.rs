//! ControlPlane -> the single next safe action, so a human looking at a KCP knows what to do.
//!
//! Every action that implies a Machine deletion is checked against the decision rules before it
//! is named: the guard never tells anyone to do what it would deny.

use std::fmt;

use super::judge::{Ask, Reason, Words, judge_delete, replicas};
use super::model::*;
use super::quorum::{self, Safety, Tally};
use super::remediation::{self, Coverage};

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

/// The fault tolerance advice must leave etcd with: what it has now, at most 1, and no more
/// than `desired` replicas would have (a one-replica control plane tolerates no failure).
pub(crate) fn kept_tolerance(now: Tally, desired: usize) -> i64 {
    quorum::tolerance(now.voting(), now.healthy)
        .min(1)
        .min(quorum::tolerance(desired, desired))
}

fn secs(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// Unix seconds as RFC 3339 (UTC). Absolute times, not ages: a published message that said
/// "4m ago" would be false a minute later, or rewritten every minute.
fn at(unix: i64) -> String {
    let t = u64::try_from(unix).unwrap_or(0);
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t))
        .to_string()
}

/// The clock of the next action: Machines' ages against the two grace periods.
struct Clock<'a> {
    policy: &'a Policy,
    now_unix: i64,
}

impl Clock<'_> {
    fn within(&self, m: &Machine, grace: std::time::Duration) -> bool {
        m.created_unix
            .is_some_and(|c| self.now_unix.saturating_sub(c) < secs(grace))
    }

    /// Created within `--join-grace`: may still get its member.
    fn joining(&self, m: &Machine) -> bool {
        self.within(m, self.policy.join_grace)
    }

    /// Created within `--learner-grace`: its learner may still be promoted by kubeadm.
    fn learning(&self, m: &Machine) -> bool {
        self.within(m, self.policy.learner_grace)
    }

    /// "created at T0; at T1, after --join-grace 10m," for a Machine: what bounds a wait.
    fn bound(&self, m: &Machine, grace: std::time::Duration, flag: &str) -> String {
        match m.created_unix {
            Some(c) => format!(
                "created at {}; at {}, after {flag} {},",
                at(c),
                at(c.saturating_add(secs(grace))),
                humantime::format_duration(grace)
            ),
            None => format!(
                "creation time unknown; after {flag} {},",
                humantime::format_duration(grace)
            ),
        }
    }

    /// "created at T0", or that it is not known.
    fn created(&self, m: &Machine) -> String {
        m.created_unix
            .map_or("of unknown creation time".into(), |c| {
                format!("created at {}", at(c))
            })
    }
}

/// The leader's raft index (the highest a voter reports when no leader is known).
fn leader_index(members: &[Member]) -> Option<u64> {
    members
        .iter()
        .find(|m| m.is_leader)
        .and_then(|m| m.raft_index)
        .or_else(|| {
            members
                .iter()
                .filter(|m| !m.is_learner)
                .filter_map(|m| m.raft_index)
                .max()
        })
}

/// Whether a learner has caught up enough for etcd to promote it: etcd promotes a learner
/// whose raft index is at least 90% of the leader's. Without both indexes it cannot be told:
/// etcd itself refuses a learner that is behind ("can only promote a learner member which is
/// in sync with leader"), harmlessly.
fn caught_up(l: &Member, members: &[Member]) -> bool {
    match (l.raft_index, leader_index(members)) {
        (Some(mine), Some(lead)) => u128::from(mine) * 10 >= u128::from(lead) * 9,
        _ => true,
    }
}

/// Promoting a healthy learner adds a healthy voter: safe iff the healthy members, it
/// included, form a quorum of the grown membership whatever the unknown members are.
pub(crate) fn promotion_safe(before: Tally) -> bool {
    before.healthy + 1 >= quorum::quorum(before.voting() + 1)
}

/// Whether removing member `o` is safe and keeps the fault tolerance advice must keep.
fn removable(o: &Member, members: &[Member], tally: Tally, keep: i64, stale: bool) -> bool {
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
    (quorum::removal(tally, removed) == Safety::Safe
        || quorum::unfit_voter_removal_safe(members, o, stale))
        && quorum::tolerance(after.voting(), after.healthy) >= keep
}

fn remove_member(o: &Member, message: String) -> NextAction {
    let cmd = format!("etcdctl member remove {}", o.id);
    NextAction::new(ActionCode::RemoveOrphanMember, message).with(o.id.to_string(), Some(cmd))
}

/// The command that frees space after a NOSPACE alarm (etcd's maintenance guide): compact the
/// history up to the current revision, defragment every member, disarm the alarm.
pub const FREE_SPACE_COMMAND: &str = "rev=$(etcdctl endpoint status -w json | grep -o '\"revision\":[0-9]*' | head -1 | cut -d: -f2) && etcdctl compact \"$rev\" && etcdctl defrag --cluster && etcdctl alarm disarm";

impl ActionCode {
    /// Whether the action is carried out, or its wait ended, by KCP, a MachineHealthCheck or
    /// the Machine controller: none of them acts on a paused Cluster or KCP (Cluster API v1.14
    /// `util/paused/paused.go` `EnsurePausedCondition`, called first by the KCP and
    /// MachineHealthCheck reconcilers; `annotations.IsPaused`). The etcdctl actions
    /// (`RemoveOrphanMember`, `PromoteLearner`, `FreeSpace`), etcd's own recovery and kubeadm's
    /// joins and promotions need none of them.
    fn needs_reconcilers(self) -> bool {
        matches!(
            self,
            ActionCode::WaitForTeardown
                | ActionCode::DeleteMachine
                | ActionCode::WaitForDeletion
                | ActionCode::RemediateMachine
                | ActionCode::EnableRemediation
                | ActionCode::WaitForRollout
        )
    }
}

/// The next safe action for a control plane. `now_unix` (Unix seconds) tells a joining Machine
/// from a broken one, and a learner catching up from a stalled one. On a paused control plane,
/// an action that KCP or a MachineHealthCheck would have to carry out becomes `Unpause`, which
/// names it as what follows the unpausing.
pub fn next_action(cp: &ControlPlane, policy: &Policy, now_unix: i64) -> NextAction {
    #[cfg(any(test, feature = "testkit"))]
    crate::testkit::asked_next_action(cp);
    let mut a = next_action_unpaused(cp, policy, now_unix);
    match cp.paused() {
        Some(paused) if a.code.needs_reconcilers() => unpause(cp, paused, a),
        // Still the action, but whatever its message says KCP does afterwards waits too.
        Some(paused) if a.code != ActionCode::None => {
            a.message.push_str(&format!(
                " Meanwhile {}: KCP and its MachineHealthChecks act on nothing until it is unpaused (`clusterctl move` pauses it on purpose while it moves the Cluster).",
                remediation::paused_words(cp, paused)
            ));
            a
        }
        _ => a,
    }
}

/// `Unpause`, with `then` (what KCP or a MachineHealthCheck would do) as what follows.
fn unpause(cp: &ControlPlane, paused: Paused, then: NextAction) -> NextAction {
    let ns = &cp.kcp.namespace;
    let what = remediation::paused_words(cp, paused);
    let cmd = match paused {
        Paused::Cluster | Paused::Both => format!(
            "kubectl patch cluster -n {ns} {} --type merge -p '{{\"spec\":{{\"paused\":false}}}}'",
            cp.cluster.name
        ),
        Paused::Kcp => format!(
            "kubectl annotate kubeadmcontrolplane -n {ns} {} {ANNOTATION_PAUSED}-",
            cp.kcp.name
        ),
    };
    let also = if paused == Paused::Both {
        format!(
            " (and the KubeadmControlPlane's annotation: `kubectl annotate kubeadmcontrolplane -n {ns} {} {ANNOTATION_PAUSED}-`)",
            cp.kcp.name
        )
    } else {
        String::new()
    };
    NextAction {
        code: ActionCode::Unpause,
        message: format!(
            "Unpause the control plane, unless `clusterctl move` is moving it: {what}, so KCP, its MachineHealthChecks and the Machine controller do nothing. `clusterctl move` pauses the Cluster on purpose and unpauses it on the target management cluster when done: unpause only when no move is in progress: `{cmd}`{also}. After that, {}: {}",
            then.code, then.message
        ),
        command: Some(cmd),
        target: then.target,
    }
}

fn next_action_unpaused(cp: &ControlPlane, policy: &Policy, now_unix: i64) -> NextAction {
    let kcp = cp.kcp_shown();
    let ns = &cp.kcp.namespace;
    if cp.kcp.etcd == EtcdTopology::External {
        return NextAction::new(
            ActionCode::None,
            format!(
                "No action needed: KubeadmControlPlane {kcp} uses external etcd, which quorumguard does not guard"
            ),
        );
    }
    if cp.cluster.deleting || cp.kcp.deleting {
        return NextAction::new(
            ActionCode::WaitForTeardown,
            format!(
                "Let the teardown finish: {} is being deleted",
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
                    "Check that etcd answers, e.g. `etcdctl member list` on a control-plane node: the etcd member list of KubeadmControlPlane {kcp} is unknown ({reason})"
                ),
            );
        }
        EtcdState::Observed(s) => s,
    };
    let stale = snapshot.age.is_some_and(|a| a > policy.max_health_age);
    let members = &snapshot.members;
    let tally = Tally::of(members, stale);
    if let Some(a) = free_space(cp, members, stale) {
        return a;
    }
    if quorum::raft_quorum_lost(members, stale) {
        return NextAction::new(
            ActionCode::RestoreQuorum,
            format!(
                "Restore quorum: etcd of KubeadmControlPlane {kcp} has lost it ({} healthy of {} voting members, quorum {}), and membership cannot change without it. Bring the stopped members back if their data is intact, otherwise restore etcd from a snapshot (https://etcd.io/docs/v3.4/op-guide/recovery/). Do not delete Machines that still hold members.",
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
    let clock = Clock { policy, now_unix };
    let keep = kept_tolerance(tally, desired);
    let join_grace = humantime::format_duration(policy.join_grace);
    let learner_grace = humantime::format_duration(policy.learner_grace);
    // Machines without a (started) member, oldest first: joining, or failed to join.
    let memberless: Vec<&Machine> = active
        .iter()
        .copied()
        .filter(|m| cp.member_of(m).is_none())
        .collect();

    // An added member that has not started: joining while a Machine without a member is within
    // --join-grace (the newest such Machine bounds the wait); after that its join failed and
    // it only blocks (cluster-api #13221, #13667, #5509): remove it first, then the failed
    // Machine is replaced (below).
    for u in members.iter().filter(|m| m.is_unstarted()) {
        if let Some(m) = memberless.iter().rev().find(|m| clock.joining(m)) {
            return NextAction::new(
                ActionCode::WaitForJoin,
                format!(
                    "Wait for etcd member {} of KubeadmControlPlane {kcp} to join: it has been added but has not started (Machine {ns}/{}, the newest without an etcd member, was {} the member counts as failed)",
                    u.id,
                    m.name,
                    clock.bound(m, policy.join_grace, "--join-grace"),
                ),
            )
            .with(u.id.to_string(), None);
        }
        if removable(u, members, tally, keep, stale) {
            let failed = memberless.first();
            let why = match failed {
                Some(m) => format!(
                    "Machine {ns}/{}, which has no etcd member, was {}, past --join-grace {join_grace}: its join failed",
                    m.name,
                    clock.created(m)
                ),
                None => format!(
                    "no Machine without an etcd member was created within --join-grace {join_grace}"
                ),
            };
            let blocks = if u.is_learner {
                "while it stays, etcd refuses every further learner (\"too many learner members in cluster\"), so every KCP scale-up and rollout sticks (cluster-api #13221, #13667)".to_string()
            } else {
                format!(
                    "it votes but cannot: with it etcd has {} and KCP counts it as an unhealthy member, which blocks its scale-ups, rollouts and remediation (cluster-api #5509)",
                    quorum::tolerance_words(tally.voting(), tally.healthy, tally.unknown)
                )
            };
            let then = failed.map_or(String::new(), |m| {
                format!(
                    " Then Machine {ns}/{}, whose join failed, is replaced.",
                    m.name
                )
            });
            return remove_member(
                u,
                format!(
                    "Remove etcd member {} of KubeadmControlPlane {kcp} from etcd: it was added but never started{}, and no Machine is joining ({why}). Removing a member that never started changes no healthy count; {blocks}.{then}",
                    u.id,
                    if u.is_learner { " (a learner)" } else { "" },
                ),
            );
        }
    }
    // A new Machine without its member: joining until --join-grace.
    if let Some(m) = memberless.iter().find(|m| clock.joining(m)) {
        return NextAction::new(
            ActionCode::WaitForJoin,
            format!(
                "Wait for Machine {ns}/{} to join: it is new and has no etcd member yet ({} without one it counts as failed and is replaced)",
                m.name,
                clock.bound(m, policy.join_grace, "--join-grace"),
            ),
        )
        .with(m.name.clone(), None);
    }
    // cluster-api #2651: a Machine whose member is gone while there are more Machines than
    // replicas: the Machine is what is left of a scale-down or rollout step.
    if active.len() > desired {
        for m in &memberless {
            if m.node_name.is_some() && allowed(cp, m, &human(), policy, now_unix) {
                let cmd = format!("kubectl delete machine -n {ns} {}", m.name);
                return NextAction::new(
                    ActionCode::DeleteMachine,
                    format!(
                        "Delete Machine {ns}/{} to finish the interrupted step: it has a node but its etcd member is already gone, and KubeadmControlPlane {kcp} has {} Machines for {}.",
                        m.name,
                        active.len(),
                        replicas(desired)
                    ),
                )
                .with(m.name.clone(), Some(cmd));
            }
        }
    }

    // A member no Machine accounts for: remove it, unhealthy ones first, if that is safe and
    // keeps the fault tolerance etcd has (up to the one spec.replicas asks for): with 2
    // Machines of 3 replicas and a healthy orphan, KCP adds the third Machine first.
    let mut orphans: Vec<&Member> = members
        .iter()
        .filter(|m| cp.machine_of(m).is_none())
        .collect();
    orphans.sort_by_key(|m| quorum::effective_ref(m, stale).is_healthy());
    let orphan_removal = || {
        orphans
            .iter()
            .find(|o| removable(o, members, tally, keep, stale))
            .map(|o| {
                remove_member(
                    o,
                    format!(
                        "Remove etcd member {} (id {}) of KubeadmControlPlane {kcp} from etcd: it belongs to no Machine.",
                        o.display_name(),
                        o.id
                    ),
                )
            })
    };

    // A deletion in flight blocks KCP's other work until it completes.
    if let Some(m) = cp
        .machines
        .iter()
        .filter(|m| m.deleting)
        .min_by(|a, b| age_order(a, b))
    {
        let stuck = cp.member_of(m).filter(|x| !x.is_learner).filter(|member| {
            let mut removed = Tally::default();
            removed.count(quorum::effective_ref(member, stale));
            quorum::removal(tally, removed) != Safety::Safe
        });
        let Some(member) = stuck else {
            if cp.member_of(m).is_none() {
                return NextAction::new(
                    ActionCode::WaitForDeletion,
                    format!(
                        "Wait for KCP to finish deleting Machine {ns}/{}: its etcd member is already gone, so KCP drains the node and deletes the Machine.",
                        m.name
                    ),
                )
                .with(m.name.clone(), None);
            }
            return NextAction::new(
                ActionCode::WaitForDeletion,
                format!(
                    "Wait for KCP to finish deleting Machine {ns}/{}: it drains the node, removes the etcd member and deletes the Machine (its member can leave safely: {} healthy of {} voting members).",
                    m.name,
                    tally.healthy,
                    tally.voting()
                ),
            )
            .with(m.name.clone(), None);
        };
        // Its member cannot leave, and KCP replaces nothing while a deletion is pending: the
        // wait has no end. Removing an unhealthy orphan may free it; else the unhealthy
        // members must come back.
        if let Some(a) = orphan_removal() {
            return a;
        }
        let down = not_healthy_names(members, stale)
            .unwrap_or_else(|| "the members not known healthy".to_string());
        return NextAction::new(
            ActionCode::CheckEtcdHealth,
            format!(
                "Bring back etcd on {} (its static pod and kubelet on the node), then KCP finishes the deletion by itself: Machine {ns}/{} is being deleted, but its member {} cannot leave safely ({} healthy of {} voting members, quorum {}), and KCP replaces no Machine while a deletion is pending, so nothing moves until the other members are healthy. Check them: `etcdctl endpoint health --cluster`",
                down,
                m.name,
                member.display_name(),
                tally.healthy,
                tally.voting(),
                quorum::quorum(tally.voting()),
            ),
        )
        .with(m.name.clone(), None);
    }

    // Learners: one that is catching up (its Machine within --learner-grace) is waited for;
    // past that it is promoted when healthy and caught up, its Machine replaced when it is
    // behind (below). One known to be unhealthy is not catching up (its process failed while it
    // joined): its Machine is replaced below. One without a Machine is removed as an orphan,
    // unless a Machine without a member may still own it.
    for l in members.iter().filter(|m| m.is_learner && !m.is_unstarted()) {
        let h = quorum::effective_ref(l, stale);
        if matches!(h, HealthRef::Unhealthy(_)) {
            continue;
        }
        let owner = cp.machine_of(l).filter(|m| m.control_plane && !m.deleting);
        // The learner's Machine, or one without a member that may still own it (its nodeRef,
        // the member's name, not set yet), within --learner-grace: a wait with that end.
        let (machine, whose) = match owner {
            Some(o) => (Some(o).filter(|o| clock.learning(o)), "its Machine"),
            None => (
                memberless.iter().rev().copied().find(|m| clock.learning(m)),
                "no Machine is known to own it yet; it may be Machine",
            ),
        };
        if let Some(m) = machine {
            return NextAction::new(
                ActionCode::WaitForLearner,
                format!(
                    "Wait for etcd member {} (id {}) of KubeadmControlPlane {kcp} to be promoted before changing membership: it is a learner catching up ({whose} {ns}/{}, {} it counts as stalled)",
                    l.display_name(),
                    l.id,
                    m.name,
                    clock.bound(m, policy.learner_grace, "--learner-grace")
                ),
            )
            .with(l.id.to_string(), None);
        }
        let Some(owner) = owner else {
            continue;
        };
        match h {
            HealthRef::Healthy if caught_up(l, members) && promotion_safe(tally) => {
                let cmd = format!("etcdctl member promote {}", l.id);
                return NextAction::new(
                    ActionCode::PromoteLearner,
                    format!(
                        "Promote etcd member {} (id {}), a learner nobody will promote: its Machine {ns}/{} was {}, past --learner-grace {learner_grace}, so its join was interrupted after `member add`. It is healthy and has caught up, and becomes a healthy voter ({} healthy of {} voting members, quorum {}). etcd refuses if it has fallen behind again; then replace its Machine.",
                        l.display_name(),
                        l.id,
                        owner.name,
                        clock.created(owner),
                        tally.healthy + 1,
                        tally.voting() + 1,
                        quorum::quorum(tally.voting() + 1)
                    ),
                )
                .with(l.id.to_string(), Some(cmd));
            }
            HealthRef::Unknown(_) => {
                return NextAction::new(
                    ActionCode::CheckEtcdHealth,
                    format!(
                        "Check etcd member {} (id {}) of Machine {ns}/{} with `etcdctl endpoint status --cluster`: it is still a learner past --learner-grace {learner_grace}, and its health is unknown; it is promoted when healthy and caught up, its Machine replaced otherwise.",
                        l.display_name(),
                        l.id,
                        owner.name
                    ),
                )
                .with(l.id.to_string(), None);
            }
            _ => {}
        }
    }

    if let Some(a) = orphan_removal() {
        return a;
    }

    // KCP remediates before anything else, and Cluster API v1.14 ends its reconcile when the
    // API server refuses a remediation's deletion (`remediation.go` returns the error), then
    // tries the same one again: a remediation the guard refuses holds KCP for ever. Name what
    // unblocks it, never a wait.
    if let Some(a) = refused_remediation(cp, &active, tally, stale, policy, now_unix) {
        return a;
    }

    // A Machine whose member is unhealthy, a stalled learner, or that never got a member: KCP
    // replaces it, if a MachineHealthCheck passes the remediation on. The first such Machine
    // that none would pass on is named only when no other can be replaced.
    let mut ctl = None;
    let mut unremediable = None;
    for m in &active {
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
            return NextAction::new(
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
            .unless_known(cp, m);
        }
    }
    if let Some((m, problem, (missing, cmd))) = unremediable {
        return NextAction::new(
            ActionCode::EnableRemediation,
            format!(
                "Machine {ns}/{} {problem}: KCP should replace it, but {missing}",
                m.name
            ),
        )
        .with(m.name.clone(), cmd);
    }

    if tally.unknown > 0 || tally.unhealthy > 0 {
        return NextAction::new(
            ActionCode::CheckEtcdHealth,
            format!(
                "Check the etcd members of KubeadmControlPlane {kcp} with `etcdctl endpoint health --cluster`: {} of {} voting members are known healthy (quorum {}); {} unknown, {} unhealthy.",
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
                "Wait for KCP to finish scaling: KubeadmControlPlane {kcp} has {} Machines for {} (it adds or removes one Machine at a time, each new one within --join-grace {join_grace})",
                active.len(),
                replicas(desired)
            ),
        );
    }
    NextAction::new(
        ActionCode::None,
        format!(
            "No action needed: KubeadmControlPlane {kcp} is converged: {} Machines, {} voting members, all healthy, {}",
            active.len(),
            tally.voting(),
            quorum::tolerance_words(tally.voting(), tally.healthy, tally.unknown)
        ),
    )
}

/// "a, b": the voting members not known healthy, as a sentence names them; `None` when every
/// one is healthy.
fn not_healthy_names(members: &[Member], stale: bool) -> Option<String> {
    let down: Vec<String> = members
        .iter()
        .filter(|x| !x.is_learner && !quorum::effective_ref(x, stale).is_healthy())
        .map(|x| x.display_name())
        .collect();
    (!down.is_empty()).then(|| down.join(", "))
}

/// The Machine KCP remediates next, when the guard refuses KCP's deletion of it for a reason
/// that has no end of its own: what unblocks KCP. KCP picks among the Machines marked for
/// remediation the sickest first, then the oldest ([`crate::kcp::reconcile`]). A refusal
/// that waits for a join (`PendingJoin`: voting joins, a new Machine joining) ends with that
/// join or with `--join-grace`, and is left to the waits below.
fn refused_remediation(
    cp: &ControlPlane,
    active: &[&Machine],
    tally: Tally,
    stale: bool,
    policy: &Policy,
    now_unix: i64,
) -> Option<NextAction> {
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

/// A NOSPACE alarm: the whole cluster refuses writes until space is freed and the alarm
/// disarmed, and a new member would receive the same data. A NOSPACE alarm does not make a
/// member unhealthy (raft keeps its quorum: [`Member::effective_health`]), so this is named
/// whenever quorum holds; if it is lost, restoring quorum comes first.
fn free_space(cp: &ControlPlane, members: &[Member], stale: bool) -> Option<NextAction> {
    let raised: Vec<&Member> = members
        .iter()
        .filter(|m| m.alarms.contains(&Alarm::NoSpace))
        .collect();
    let first = raised.first()?;
    if quorum::raft_quorum_lost(members, stale) {
        return None;
    }
    let names: Vec<String> = raised
        .iter()
        .map(|m| format!("{} (id {})", m.display_name(), m.id))
        .collect();
    Some(
        NextAction::new(
            ActionCode::FreeSpace,
            format!(
                "Free space in etcd of KubeadmControlPlane {}, which has a NOSPACE alarm (raised by {}): its database reached the space quota, and the whole cluster serves only reads and deletes, so the workload API server cannot write. Replacing a Machine does not help: a new member receives the same data and hits the same quota. Instead, compact the history, defragment every member, then disarm the alarm; if the database is still close to the quota after that, raise --quota-backend-bytes on every member (kubeadm: etcd.local.extraArgs) first.",
                cp.kcp_shown(),
                names.join(", ")
            ),
        )
        .with(first.id.to_string(), Some(FREE_SPACE_COMMAND.to_string())),
    )
}
