//! The play: the control plane as a rollout changes it, one step at a time (a deletion
//! finishes, a Machine joins, KCP reconciles), each step the first that can happen.

use super::KCP_PRE_TERMINATE_HOOK;
use super::report::{Counts, ReadyReason, RolloutStep, StepKind};
use crate::decide::{EtcdBasis, admit_deletion};
use crate::kcp::{self, KcpMachine, KcpMove, KcpView, MemberFit};
use crate::model::*;
use crate::quorum::quorum;

const PRE_TERMINATE_PREFIX: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/";
const PRE_DRAIN_PREFIX: &str = "pre-drain.delete.hook.machine.cluster.x-k8s.io/";

/// A step that happened: its kind, its Machine, its words and the guard's answer.
pub(super) type Happened = (StepKind, String, String, Option<String>);
/// Why nothing can happen.
pub(super) type Stuck = (ReadyReason, String);
/// The next step, `None` when converged.
pub(super) type Played = Result<Option<Happened>, Stuck>;

/// Where the play ended.
#[derive(Clone, Debug)]
pub(super) enum End {
    Finished,
    Stuck { reason: ReadyReason, why: String },
}

/// The control plane as the play changes it.
#[derive(Clone, Debug)]
pub(super) struct Sim<'p> {
    pub(super) cp: ControlPlane,
    /// Machines created by the play (of the new version); the others are outdated.
    pub(super) new: Vec<String>,
    pub(super) policy: &'p Policy,
    pub(super) now: i64,
    pub(super) created: usize,
    /// Voting joins the play started: the Machine and the member `kubeadm join` added, which
    /// etcd lists without a name until its process starts.
    pub(super) starting: Vec<(String, MemberId)>,
}

impl<'p> Sim<'p> {
    pub(super) fn new(cp: &ControlPlane, policy: &'p Policy, now: i64) -> Self {
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
    /// claimed by a Machine, every Machine joined, and no hook but KCP's on a deletion. Its
    /// play counts the steps a rollout takes.
    pub(super) fn ideal(&self) -> Sim<'p> {
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

    pub(super) fn members(&self) -> &[Member] {
        self.cp.members()
    }

    pub(super) fn members_mut(&mut self) -> &mut Vec<Member> {
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

    pub(super) fn member_index(&self, machine: &Machine) -> Option<usize> {
        let name = machine.node_name.as_deref().unwrap_or(&machine.name);
        self.members()
            .iter()
            .position(|m| !m.is_unstarted() && m.name == name)
    }

    pub(super) fn is_new(&self, machine: &Machine) -> bool {
        self.new.contains(&machine.name)
    }

    pub(super) fn age_past(&self, machine: &Machine, grace: std::time::Duration) -> bool {
        machine
            .created_unix
            .is_none_or(|c| self.now.saturating_sub(c) > grace.as_secs() as i64)
    }

    pub(super) fn has_quorum(&self) -> bool {
        let c = Counts::of(self.members());
        c.healthy >= c.quorum
    }

    /// KCP's view of the control plane.
    pub(super) fn view(&self) -> (Vec<KcpMachine>, u32) {
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
    pub(super) fn play(mut self, failures: bool) -> (Vec<RolloutStep>, End, ControlPlane) {
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

    /// The next step: `Ok(None)` when converged, `Err` when stuck.
    pub(super) fn step(&mut self) -> Played {
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
    pub(super) fn finish_deletion(&mut self) -> Played {
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

    /// KCP's reconcile: remediation, then scale up or down.
    pub(super) fn reconcile(&mut self, held: Option<(ReadyReason, String)>) -> Played {
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
    pub(super) fn delete(&mut self, pos: usize, why: &str) -> Result<Happened, Stuck> {
        let m = self.cp.machines[pos].clone();
        let requester = Requester::new(
            self.policy
                .controllers
                .first()
                .map_or(DEFAULT_KCP_CONTROLLER, String::as_str),
        );
        // The play's etcd is the present, as the webhook's fresh probe would show it.
        let j = admit_deletion(
            &self.cp,
            &m,
            &requester,
            self.policy,
            self.now,
            EtcdBasis::FreshProbe,
        )
        .into_judgement();
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
}
