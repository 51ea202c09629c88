//! Every step of every actor, each atomic: the KCP controller (both styles), a new node's
//! `kubeadm join`, the Machine controller with KCP's pre-terminate hook, etcd and its failures,
//! the guard (watch cache, probe, webhook) and a person.
//!
//! The guard's own steps, which call the real engine, are in `guard.rs`.

use quorumguard::engine::Confirmation;
use quorumguard::engine::kcp::{self, Hold, KcpMachine, KcpMove, KcpView, MemberFit};

use crate::model::guard::{Fresh, Who, follow_etcdctl};
use crate::model::joins::{
    etcd_member_condition, finish_deletion, join, node_startup_timeout, settle_leader,
};

use crate::model::world::*;

pub use crate::model::bounds::{Bounds, Bugs};

#[derive(Clone, Debug)]
pub struct Config {
    pub bounds: Bounds,
    pub bugs: Bugs,
    pub confirmation: Confirmation,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// One reconcile of the KCP controller.
    Kcp,
    /// KCP loses leadership with a step half done, and restarts (v0.3: after removing a
    /// member, before deleting its Machine; current: after picking a Machine to delete).
    KcpCrash,
    /// The new node of Machine `m{slot}` joins etcd, one step.
    Join(u8),
    /// The Machine controller finishes a deletion: KCP's pre-terminate hook removes the
    /// member, the machine goes.
    FinishDeletion(u8),
    Fail(u8),
    Recover(u8),
    ElectionEnds,
    /// Time passes beyond `--join-grace`: no Machine is young any more.
    GraceExpires,
    /// The watch delivers the current state of Machine `m{slot}` to the guard's cache.
    SyncMachine(u8),
    SyncKcp,
    Probe,
    ProbeFails,
    /// A person deletes Machine `m{slot}` (kubectl delete machine).
    Delete(u8),
    /// A person sets spec.replicas (kubectl scale kcp).
    Scale(u8),
    /// A person changes the KCP's version: a rollout.
    Rollout,
    /// A person does what the published next action says.
    Follow,
    /// The `kubeadm join` of Machine `m{slot}` stops for good where it is (no member yet, a
    /// voting member not started, a learner not promoted).
    JoinStops(u8),
    /// The `kubeadm join` of Machine `m{slot}` adds its member, then stops before the member
    /// starts (current KCP: an unstarted learner, cluster-api #13221).
    JoinStopsAfterAdd(u8),
    /// Older KCP: Machine `m{slot}`, being deleted, goes without its member being removed; the
    /// member's process went with its machine.
    MachineGoesMemberStays(u8),
    /// The autopilot's sweep of the cluster: re-prove its step in flight, or take the
    /// published next action on its own fresh probe.
    Autopilot,
    /// Only where failures have stopped (the liveness continuation without a person): the
    /// MachineHealthCheck marks Machine `m{slot}`, which has had no node for longer than its
    /// `nodeStartupTimeout` (Cluster API v1.14 `needsRemediation` in
    /// core/reconcilers/machinehealthcheck/machinehealthcheck_targets.go; default 600 s,
    /// `--join-grace`'s default too), for remediation.
    NodeStartupTimeout(u8),
    /// Only where the liveness continuation without a person stops otherwise, and only with
    /// `Bounds::mhc_checks_etcd_member`: a MachineHealthCheck that checks the Machine's
    /// `EtcdMemberHealthy` condition marks Machine `m{slot}`, whose node is up and whose etcd
    /// member is gone, for remediation (`joins::etcd_member_condition`).
    EtcdMemberCondition(u8),
}

/// The words of a step, written only when asked for (printing a counterexample).
pub struct Say(pub Option<Vec<String>>);

impl Say {
    pub fn line(&mut self, f: impl FnOnce() -> String) {
        if let Some(lines) = &mut self.0 {
            lines.push(f());
        }
    }
}

impl Config {
    /// The actions worth trying in `s` (each may still turn out impossible).
    pub fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let b = &self.bounds;
        out.push(Action::Kcp);
        if s.kcp_deletes_next.is_some() && s.left.crashes > 0 {
            out.push(Action::KcpCrash);
        }
        for m in &s.machines {
            if !m.node && !m.deleting && !m.stalled {
                out.push(Action::Join(m.slot));
                if s.left.leftovers > 0 {
                    out.push(Action::JoinStops(m.slot));
                    if s.member(m.slot).is_none() {
                        out.push(Action::JoinStopsAfterAdd(m.slot));
                    }
                }
            }
            if m.deleting {
                out.push(Action::FinishDeletion(m.slot));
                if s.left.leftovers > 0 && s.member(m.slot).is_some() {
                    out.push(Action::MachineGoesMemberStays(m.slot));
                }
            }
        }
        for m in &s.members {
            if m.started && m.up && s.left.failures > 0 {
                out.push(Action::Fail(m.slot));
            }
            if m.started && !m.up {
                out.push(Action::Recover(m.slot));
            }
        }
        out.push(Action::ElectionEnds);
        if s.machines.iter().any(|m| m.young) {
            out.push(Action::GraceExpires);
        }
        let mut slots: Vec<u8> = s.machines.iter().map(|m| m.slot).collect();
        slots.extend(s.cache_machines.iter().map(|m| m.slot));
        slots.sort_unstable();
        slots.dedup();
        for slot in slots {
            if s.machine(slot) != s.cached(slot) {
                out.push(Action::SyncMachine(slot));
            }
        }
        if (s.replicas, s.version) != s.kcp_cached() {
            out.push(Action::SyncKcp);
        }
        out.push(Action::Probe);
        if s.left.probe_failures > 0 {
            out.push(Action::ProbeFails);
        }
        if s.left.person > 0 {
            for m in &s.machines {
                if !m.deleting {
                    out.push(Action::Delete(m.slot));
                }
            }
            for to in [1, 3, 5] {
                // KCP's own webhook rejects fewer than 3 replicas with maxSurge 0.
                if to <= b.max_replicas && to != s.replicas && (s.max_surge > 0 || to >= 3) {
                    out.push(Action::Scale(to));
                }
            }
            if s.left.rollouts > 0 {
                out.push(Action::Rollout);
            }
        }
        if !self.bugs.ignore_next_action {
            out.push(Action::Follow);
        }
        if s.autopilot.is_some() {
            out.push(Action::Autopilot);
        }
    }

    /// The state after `a`, or `None` when `a` cannot happen (or changes nothing). With
    /// `explore` false (the liveness continuation) the budgets and lag bounds do not apply.
    pub fn step(&self, s: &State, a: &Action, explore: bool, say: &mut Say) -> Option<State> {
        let mut n = self.act(s, a, explore, say)?;
        if !matches!(a, Action::Probe) && (n.members != s.members || n.leader != s.leader) {
            n.unprobed = n.unprobed.saturating_add(1);
        }
        if s.has_quorum() && !n.has_quorum() && n.lost_by.is_none() {
            let excused = match a {
                Action::Fail(_) => true,
                Action::FinishDeletion(slot) => s.unproven.contains(slot),
                // SingleMemberScaleUp: a single member can only grow this way, and the guard
                // says so in a warning. Otherwise a voting member joins only Machines KCP made
                // with every member healthy: a member down now failed since.
                Action::Join(_) | Action::JoinStopsAfterAdd(_) => {
                    let removed = usize::from(s.removed_since_failure);
                    let failed = s.members.iter().any(|m| m.started && !m.up);
                    s.voting() == 1
                        || (failed && s.healthy() + removed < quorum(s.voting() + removed + 1))
                }
                // A person's `etcdctl member remove` of the orphan the published next action
                // names: no webhook sees it, and the advice rests on the record, which may not
                // show a member that failed since.
                Action::Follow => s.unseen_failure(),
                // Its member's process goes with the machine: a failure, not an admission.
                Action::MachineGoesMemberStays(_) => true,
                _ => false,
            };
            if !excused {
                let mut why = Say(Some(Vec::new()));
                self.act(s, a, false, &mut why);
                n.lost_by = Some(why.0.unwrap_or_default().join("; "));
            }
        }
        let deleting = n.deleting();
        n.unproven.retain(|slot| deleting.contains(slot));
        // A removal counts against a later join unless the deletion behind it was unproven
        // (then the join's loss is that deletion's, already excused).
        let unproven = matches!(a, Action::FinishDeletion(slot) if s.unproven.contains(slot));
        let healthy_removed = s
            .members
            .iter()
            .filter(|m| !m.learner && m.started && m.up && n.member(m.slot).is_none())
            .filter(|_| !unproven)
            .count();
        if n.members.iter().any(|m| m.started && !m.up) {
            n.removed_since_failure = n
                .removed_since_failure
                .saturating_add(u8::try_from(healthy_removed).unwrap_or(u8::MAX));
        }
        n.unproven.sort_unstable();
        n.unproven.dedup();
        if explore && (n.cache_lag() > self.bounds.cache_lag || n.unprobed > self.bounds.probe_lag)
        {
            return None;
        }
        (n != *s).then_some(n)
    }

    /// The action itself, and the leader it leaves.
    fn act(&self, s: &State, a: &Action, explore: bool, say: &mut Say) -> Option<State> {
        let mut n = s.clone();
        match a {
            Action::Kcp => self.kcp(&mut n, explore, say)?,
            Action::KcpCrash => {
                let slot = n.kcp_deletes_next.take()?;
                n.left.crashes = n.left.crashes.checked_sub(1)?;
                say.line(|| {
                    format!(
                        "KCP loses leader election before deleting Machine {}: restarted, it has forgotten it",
                        name(slot)
                    )
                });
            }
            Action::Join(slot) => join(&mut n, *slot, say)?,
            Action::FinishDeletion(slot) => finish_deletion(&mut n, *slot, say)?,
            Action::Fail(slot) => {
                let m = n.member_mut(*slot).filter(|m| m.started && m.up)?;
                m.up = false;
                n.left.failures = n.left.failures.checked_sub(1)?;
                let deleting = n.deleting();
                n.unproven.extend(deleting);
                // Removals before this failure were judged without it: a join they leave
                // short of quorum now is this failure's doing.
                n.removed_since_failure = 0;
                say.line(|| format!("etcd member {} fails", name(*slot)));
            }
            Action::Recover(slot) => {
                // A member whose machine is gone does not come back.
                n.machine(*slot)?;
                let m = n.member_mut(*slot).filter(|m| m.started && !m.up)?;
                m.up = true;
                say.line(|| format!("etcd member {} comes back", name(*slot)));
            }
            Action::ElectionEnds => {
                if n.leader.is_some() || !n.has_quorum() {
                    return None;
                }
                let leader = n
                    .members
                    .iter()
                    .find(|m| !m.learner && m.started && m.up)?
                    .slot;
                n.leader = Some(leader);
                n.election_probes = 0;
                say.line(|| format!("etcd elects {} leader", name(leader)));
            }
            Action::GraceExpires => {
                // Ten minutes are sixty probe intervals: the record has caught up with etcd's
                // member list by then (unless the probes fail).
                if !n.probe_failed && (n.unprobed > 0 || n.unconfirmed_membership()) {
                    return None;
                }
                for m in n
                    .machines
                    .iter_mut()
                    .chain(n.cache_machines.iter_mut())
                    .chain(n.reserved.iter_mut().map(|r| &mut r.machine))
                {
                    m.young = false;
                }
                say.line(|| {
                    "time passes: no Machine is within --join-grace or --learner-grace".into()
                });
            }
            Action::SyncMachine(slot) => {
                let now = s.machine(*slot).copied();
                n.cache_machines.retain(|m| m.slot != *slot);
                n.cache_machines.extend(now);
                n.cache_machines.sort_by_key(|m| m.slot);
                say.line(|| format!("the guard's cache receives Machine {}", name(*slot)));
            }
            Action::SyncKcp => {
                (n.cache_replicas, n.cache_version) = (n.replicas, n.version);
                say.line(|| "the guard's cache receives the KCP".into());
            }
            Action::Probe => self.probe(&mut n, explore, say)?,
            Action::ProbeFails => {
                self.clock(&mut n, explore)?;
                n.left.probe_failures = n.left.probe_failures.checked_sub(1)?;
                n.probe_failed = true;
                say.line(|| "the guard's probe fails".into());
            }
            Action::Delete(slot) => {
                n.left.person = n.left.person.checked_sub(1)?;
                n.machine(*slot).filter(|m| !m.deleting)?;
                say.line(|| format!("a person deletes Machine {}", name(*slot)));
                self.delete(&mut n, *slot, Who::Person, explore, say)?;
            }
            Action::Scale(to) => {
                n.left.person = n.left.person.checked_sub(1)?;
                say.line(|| format!("a person scales the KCP to {to} replicas"));
                self.update(&mut n, *to, false, explore, say)?;
            }
            Action::Rollout => {
                n.left.person = n.left.person.checked_sub(1)?;
                n.left.rollouts = n.left.rollouts.checked_sub(1)?;
                say.line(|| {
                    format!(
                        "a person sets the KCP's version to {}",
                        kcp_version(s.style, s.version + 1)
                    )
                });
                self.update(&mut n, s.replicas, true, explore, say)?;
            }
            Action::Follow => self
                .follow(&mut n, explore, say)
                .or_else(|| follow_etcdctl(&mut n, say))?,
            Action::JoinStops(slot) => {
                n.left.leftovers = n.left.leftovers.checked_sub(1)?;
                let m = n
                    .machine_mut(*slot)
                    .filter(|m| !m.node && !m.deleting && !m.stalled)?;
                m.stalled = true;
                say.line(|| format!("the join of Machine {} stops for good", name(*slot)));
            }
            Action::JoinStopsAfterAdd(slot) => {
                n.left.leftovers = n.left.leftovers.checked_sub(1)?;
                n.machine(*slot)
                    .filter(|m| !m.node && !m.deleting && !m.stalled)?;
                if n.member(*slot).is_some() || !n.may_add_member() {
                    return None;
                }
                let learner = n.style == Style::Current;
                n.members.push(Mem {
                    slot: *slot,
                    learner,
                    started: false,
                    up: true,
                });
                n.members.sort_by_key(|m| m.slot);
                let m = n.machine_mut(*slot)?;
                m.stalled = true;
                m.member_added = true;
                say.line(|| {
                    format!(
                        "the node of {} adds its etcd member{}, then its join stops for good: the member never starts",
                        name(*slot),
                        if learner { " as a learner" } else { " (voting)" }
                    )
                });
            }
            Action::Autopilot => self.autopilot(&mut n, explore, say)?,
            Action::NodeStartupTimeout(slot) => node_startup_timeout(&mut n, *slot, say)?,
            Action::EtcdMemberCondition(slot) => etcd_member_condition(&mut n, *slot, say)?,
            Action::MachineGoesMemberStays(slot) => {
                n.left.leftovers = n.left.leftovers.checked_sub(1)?;
                n.machine(*slot).filter(|m| m.deleting)?;
                n.machines.retain(|m| m.slot != *slot);
                if let Some(m) = n.member_mut(*slot) {
                    m.up = !m.started && m.up;
                }
                say.line(|| {
                    format!(
                        "older KCP: Machine {} is deleted, its etcd member is not removed",
                        name(*slot)
                    )
                });
            }
        }
        settle_leader(&mut n);
        Some(n)
    }

    /// One reconcile of the KCP controller. What it decides is the engine's `kcp::reconcile`
    /// on the truth as KCP reads it (`State::kcp_machines`): wait for a deletion, remediate,
    /// then scale up, roll out or scale down by one Machine behind its preflight
    /// (docs/kcp-model.md). What is the model's own: every deletion goes through the guard as
    /// the KCP controller; a scale-down takes two steps, so KCP may lose leadership between
    /// them (cluster-api #2651): current KCP picks the Machine, then deletes it; v0.3 removes
    /// its member first (which needs quorum), then deletes it; and the exploration lets KCP
    /// create at most `new_machines` Machines. Level-triggered: it reads the truth, and
    /// remembers only the Machine it deletes next.
    fn kcp(&self, n: &mut State, explore: bool, say: &mut Say) -> Option<()> {
        let (machines, orphan_members) = n.kcp_machines();
        let view = KcpView {
            replicas: u32::from(n.replicas),
            max_surge: u32::from(n.max_surge),
            machines: &machines,
            orphan_members,
        };
        let r = kcp::reconcile(&view);
        if let KcpMove::Wait(Hold::Deleting(_)) = r.then {
            return None;
        }
        if let Some(slot) = n.kcp_deletes_next {
            if n.machine(slot).is_none() {
                n.kcp_deletes_next = None;
                return Some(());
            }
            say.line(|| format!("KCP deletes Machine {}", name(slot)));
            // Refused or not, the next reconcile reads afresh.
            n.kcp_deletes_next = None;
            self.review_deletion(n, slot, Who::Kcp, true, Fresh::Probe { explore }, say);
            return Some(());
        }
        // Remediation first. A deletion the API server refuses (the guard's denial) ends the
        // reconcile with the error, and the next reconcile tries the same remediation again
        // (Cluster API v1.14, `controlplane/kubeadm/reconcilers/kubeadmcontrolplane/`:
        // `reconcileUnhealthyMachines` in remediation.go returns "failed to delete unhealthy
        // machine", and `reconcile` in kubeadmcontrolplane_controller.go returns before the
        // scale operations). A refusal that changed the guard's state (its fresh probe, the
        // reservations it dropped) is a step; one that changed nothing is no step.
        if let Some(key) = r.remediate {
            let slot = u8::try_from(key).ok()?;
            say.line(|| format!("KCP remediates Machine {}: deletes it", name(slot)));
            return self
                .review_deletion(n, slot, Who::Kcp, true, Fresh::Probe { explore }, say)
                .map(|_| ());
        }
        let then = if self.bugs.kcp_skips_preflight {
            without_health_preflight(&view, r.then)
        } else {
            r.then
        };
        match then {
            KcpMove::Converged | KcpMove::Wait(_) => None,
            KcpMove::ScaleUp => {
                if explore && n.left.new_machines == 0 {
                    return None;
                }
                if explore {
                    n.left.new_machines -= 1;
                }
                let slot = n.next_slot;
                n.next_slot += 1;
                n.machines.push(Mach {
                    slot,
                    version: n.version,
                    node: false,
                    young: true,
                    stalled: false,
                    member_added: false,
                    deleting: false,
                    remediate: false,
                });
                say.line(|| format!("KCP scales up: creates Machine {}", name(slot)));
                Some(())
            }
            KcpMove::ScaleDown(key) => {
                let victim = u8::try_from(key).ok()?;
                match n.style {
                    Style::Current => {
                        // Deciding and deleting are two steps: others may act on what KCP read.
                        n.kcp_deletes_next = Some(victim);
                        say.line(|| {
                            format!("KCP scales down: picks Machine {} to delete", name(victim))
                        });
                        Some(())
                    }
                    Style::V03 => {
                        if !n.has_quorum() {
                            return None;
                        }
                        n.members.retain(|m| m.slot != victim);
                        n.kcp_deletes_next = Some(victim);
                        say.line(|| {
                            format!(
                                "KCP v0.3 scales down: removes etcd member {} (the Machine next)",
                                name(victim)
                            )
                        });
                        Some(())
                    }
                }
            }
        }
    }
}

/// The planted `kcp_skips_preflight`: KCP's preflight does not see a member that is unhealthy
/// or a learner when it scales up (its other checks, and a scale-down's, stay).
fn without_health_preflight(view: &KcpView<'_>, then: KcpMove) -> KcpMove {
    let blind: Vec<KcpMachine> = view
        .machines
        .iter()
        .map(|m| KcpMachine {
            member: match m.member {
                MemberFit::Unhealthy | MemberFit::Learner => MemberFit::Healthy,
                fit => fit,
            },
            ..*m
        })
        .collect();
    let blind = kcp::reconcile(&KcpView {
        machines: &blind,
        ..*view
    });
    if blind.then == KcpMove::ScaleUp {
        KcpMove::ScaleUp
    } else {
        then
    }
}
