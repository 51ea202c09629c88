//! The guard's steps: the probe judged by the real `Belief::judge_against`, and every review
//! decided by the real engine (`admit_deletion`, `admit`) on the view the webhook would have,
//! exactly as `crates/admission/src/lib.rs` calls them: first on the cached record, then,
//! when the engine answers that its allow must be confirmed on a fresh probe
//! (`Answer::ConfirmOnFreshProbe`), again on a fresh probe of etcd read by the real
//! `fresh_view` (or `failed_view`); and a person following the real `next_action` of the
//! enricher's view.

use std::time::Duration;

use quorumguard::engine::{
    ANNOTATION_REMEDIATE, ActionCode, Answer, ControlPlane, DEFAULT_KCP_CONTROLLER, EtcdBasis,
    EtcdState, Health, Judgement, Member, Operation, Policy, Reason, Requester, admit,
    admit_deletion, failed_view, fresh_view, next_action,
};

use quorumguard::admission::reservations::ReplicaReservation;

use crate::model::steps::{Config, Say};
use crate::model::world::*;

/// The time between two probes (the sweep re-probes one election timeout later while anything
/// awaits confirmation), and the fixed instant every probe is judged at after rebasing.
const PROBE_EVERY: Duration = Duration::from_secs(1);
const JUDGED_AT: Duration = Duration::from_secs(6);

/// Whether a review may take the webhook's fresh probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fresh {
    /// As `serve` does (`explore`: the exploration's bounds apply to the probe's clock).
    Probe { explore: bool },
    /// Judged on the record alone, as the enricher's view is.
    RecordOnly,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Person,
    Kcp,
    /// quorumguard's autopilot, as its own identity: neither a control-plane controller nor a
    /// teardown identity, so the webhook judges it as it judges a person.
    Autopilot,
}

impl Who {
    fn requester(self) -> Requester {
        match self {
            Who::Person => Requester::new("alice"),
            Who::Kcp => Requester::new(DEFAULT_KCP_CONTROLLER),
            Who::Autopilot => {
                Requester::new("system:serviceaccount:quorumguard-system:quorumguard")
            }
        }
    }
}

impl Config {
    /// The guard takes the probe it would record now, one probe interval after the last, and
    /// records it (the real `Belief::judge_against`, given the record).
    pub(crate) fn probe(&self, n: &mut State, explore: bool, say: &mut Say) -> Option<()> {
        self.clock(n, explore)?;
        let probe = take_probe(n);
        say.line(|| {
            if probe.is_some() {
                "the guard probes etcd".into()
            } else {
                "the guard's probe fails: no member answers".into()
            }
        });
        self.record(n, probe, say);
        Some(())
    }

    /// Records a probe taken now (`None`: it failed) into the guard's record, as the sweep
    /// does: judged by the real `Belief::judge_against` against the record, so that while a
    /// changed member list awaits confirmation the record holds both lists.
    fn record(&self, n: &mut State, probe: Option<Vec<Member>>, say: &mut Say) {
        n.unprobed = 0;
        n.probes_since_lost = if n.has_quorum() {
            // Past the longest election, the count no longer matters.
            n.probes_since_lost
                .saturating_add(1)
                .min(self.bounds.election_probes + 1)
        } else {
            0
        };
        let Some(probe) = probe else {
            n.probe_failed = true;
            return;
        };
        let record = n.view.is_some().then(|| n.record_members());
        let listed = probe.len();
        let judged =
            n.belief
                .judge_against(probe, record.as_deref(), JUDGED_AT, &self.confirmation);
        if let Some(members) = judged.members {
            if members.len() != listed {
                say.line(|| {
                    "  (a changed member list: the record holds both lists until a second probe)"
                        .into()
                });
            }
            n.view = Some(State::record(&members));
            n.probe_failed = false;
        }
    }

    /// The webhook's fresh probe, taken when the engine's first answer (on the cached record)
    /// is `Answer::ConfirmOnFreshProbe`, as `serve` does: a probe of
    /// etcd as it is in this step, read by the real `fresh_view` against the record (by
    /// `failed_view` when no member answers), and recorded like any probe. Returns etcd as the
    /// second decision sees it.
    ///
    /// The step is atomic: probe, second decision, answer. That covers a member failing
    /// between the fresh probe and the answer: the answer changes nothing in etcd, and the
    /// decision is already fixed by the probe, so "probe, failure, answer" reaches the same
    /// state as "probe and answer, then failure", and the failure steps may come at any later
    /// step. What remains is an operation allowed on the fresh probe and a member failing
    /// before it is carried out; `Action::Fail` marks the deletions under way then as
    /// unproven (docs/rules.md, "Model-checked").
    fn fresh_probe(&self, n: &mut State, explore: bool, say: &mut Say) -> EtcdState {
        let probe = take_probe(n);
        let record = n.record_members();
        let members = match &probe {
            Some(p) => fresh_view(p.clone(), &record),
            None => failed_view(&record),
        };
        let failed = probe.is_none();
        // Recorded one probe interval after the last, like any probe; not recorded while an
        // election has used up its bound of probes (that would be a probe the bound leaves
        // out; the decision still uses it).
        let recorded = self.clock(n, explore).is_some();
        say.line(|| {
            format!(
                "  the guard probes etcd afresh{}{}",
                if failed { ": no member answers" } else { "" },
                if recorded { "" } else { " (not recorded)" }
            )
        });
        if recorded {
            self.record(n, probe, say);
        }
        observed(members)
    }

    /// Time passes by one probe interval: an election under way takes at most
    /// `election_probes` of them.
    pub(crate) fn clock(&self, n: &mut State, explore: bool) -> Option<()> {
        if n.leader.is_none() && n.has_quorum() {
            if explore && n.election_probes >= self.bounds.election_probes {
                return None;
            }
            n.election_probes = n.election_probes.saturating_add(1);
        }
        n.belief.rebase(PROBE_EVERY);
        Some(())
    }

    /// A Machine deletion through the webhook. `None` when refused and nothing changed.
    pub(crate) fn delete(
        &self,
        n: &mut State,
        slot: u8,
        who: Who,
        explore: bool,
        say: &mut Say,
    ) -> Option<()> {
        self.review_deletion(n, slot, who, true, Fresh::Probe { explore }, say)
            .map(|_| ())
    }

    /// Whether the webhook allows deleting Machine `m{slot}`: `Some(true)` allowed (and
    /// done), `Some(false)` refused but the review changed the guard's state (dropped
    /// reservations, recorded its fresh probe), `None` refused. `reservations` false judges
    /// on the enricher's view, as if the webhook held none.
    pub fn review_deletion(
        &self,
        n: &mut State,
        slot: u8,
        who: Who,
        reservations: bool,
        fresh: Fresh,
        say: &mut Say,
    ) -> Option<bool> {
        let machine = *n.machine(slot)?;
        let reservations =
            reservations && !self.bugs.no_reservations && !self.bugs.blind_to_pending;
        let (mut cp, replicas, kept) = n.webhook_view(reservations);
        if self.bugs.blind_to_pending {
            let me = name(slot);
            cp.machines
                .iter_mut()
                .filter(|m| m.name != me)
                .for_each(|m| m.deleting = false);
        }
        let policy = Policy::default();
        let decide = |cp: &ControlPlane, etcd: EtcdBasis| {
            let judge = |who: Who| {
                admit_deletion(
                    cp,
                    &engine_machine(&machine),
                    &who.requester(),
                    &policy,
                    NOW,
                    etcd,
                )
            };
            let a = judge(who);
            // The planted `pending_join_for_kcp`: KCP's deletion is held `PendingJoin` where a
            // person's is (the replacement counted as a join), and only then.
            if self.bugs.pending_join_for_kcp && who == Who::Kcp && a.judgement().allowed {
                let as_person = judge(Who::Person);
                if as_person.judgement().reason == Reason::PendingJoin {
                    return as_person;
                }
            }
            a
        };
        let reserved_changed = (n.reserved_replicas, &n.reserved) != (replicas, &kept);
        let (mut j, probed) = self.answer(n, &mut cp, fresh, say, decide);
        let changed = reserved_changed || probed;
        if self.bugs.deny_memberless && j.reason == Reason::MemberAbsent {
            j.allowed = false;
        }
        (n.reserved_replicas, n.reserved) = (replicas, kept);
        say.line(|| verdict(&j));
        if !j.allowed {
            return changed.then_some(false);
        }
        if reservations && (!j.reason.is_unconditional() || j.reason == Reason::BreakGlass) {
            let seen_in_cache = n.cached(slot).is_some();
            n.reserved.retain(|r| r.machine.slot != slot);
            n.reserved.push(Reserved {
                machine,
                seen_in_cache,
            });
        }
        // Allowed without proof: by the unknown-health policy, when not even the fresh probe
        // could tell. Nothing else is excused: an allow that rests on etcd rests on etcd as
        // it is in this step.
        if j.reason == Reason::HealthUnknown {
            n.unproven.push(slot);
        }
        n.machine_mut(slot)?.deleting = true;
        Some(true)
    }

    /// The webhook's answer, as `crates/admission/src/lib.rs` asks for it: the engine's
    /// (`decide`) on the record, and when it asks to be confirmed on a fresh probe, on a fresh
    /// probe taken now. Returns the judgement and whether a fresh probe was taken.
    fn answer(
        &self,
        n: &mut State,
        cp: &mut ControlPlane,
        fresh: Fresh,
        say: &mut Say,
        decide: impl Fn(&ControlPlane, EtcdBasis) -> Answer,
    ) -> (Judgement, bool) {
        let first = decide(cp, EtcdBasis::Record);
        match self.probes_afresh(&first, fresh) {
            Some(explore) => {
                say.line(|| verdict(first.judgement()) + " on its record");
                cp.etcd = self.fresh_probe(n, explore, say);
                (decide(cp, EtcdBasis::FreshProbe).into_judgement(), true)
            }
            None => (first.into_judgement(), false),
        }
    }

    /// Whether the webhook probes afresh before answering `a` (`Some(explore)`): when the
    /// engine asks for it, unless the planted bug skips the fresh probe.
    fn probes_afresh(&self, a: &Answer, fresh: Fresh) -> Option<bool> {
        match (fresh, a) {
            (Fresh::Probe { explore }, Answer::ConfirmOnFreshProbe(_))
                if !self.bugs.no_fresh_probe =>
            {
                Some(explore)
            }
            _ => None,
        }
    }

    /// A KCP update through the webhook: spec.replicas to `to` (the scale subresource), or a
    /// version change (the KCP itself).
    pub(crate) fn update(
        &self,
        n: &mut State,
        to: u8,
        rollout: bool,
        explore: bool,
        say: &mut Say,
    ) -> Option<()> {
        let reservations = !self.bugs.no_reservations;
        let (mut cp, replicas, kept) = n.webhook_view(reservations);
        if rollout {
            cp.kcp.replicas = u32::from(to);
            cp.kcp.version = Some(kcp_version(n.style, n.version + 1));
        }
        let op = Operation::UpdateKcp {
            replicas_from: u32::from(n.replicas),
            replicas_to: u32::from(to),
            starts_rollout: rollout,
        };
        let decide = |cp: &ControlPlane, etcd: EtcdBasis| {
            admit(
                cp,
                &op,
                &Who::Person.requester(),
                &Policy::default(),
                NOW,
                etcd,
            )
        };
        let reserved_changed = (n.reserved_replicas, &n.reserved) != (replicas, &kept);
        let (j, probed) = self.answer(n, &mut cp, Fresh::Probe { explore }, say, decide);
        let changed = reserved_changed || probed;
        (n.reserved_replicas, n.reserved) = (replicas, kept);
        say.line(|| verdict(&j));
        if !j.allowed {
            return changed.then_some(());
        }
        // As the webhook reserves (crates/admission/src/lib.rs): a scale-up unless allowed
        // unconditionally; a change to fewer replicas however it was allowed.
        if reservations && to != n.replicas && (to < n.replicas || !j.reason.is_unconditional()) {
            n.reserved_replicas = ReplicaReservation::after(
                n.reserved_replicas,
                u32::from(n.replicas),
                u32::from(to),
            );
        }
        n.replicas = to;
        if rollout {
            n.version += 1;
        }
        Some(())
    }

    /// A person does what the published next action says: delete the Machine it names,
    /// annotate one for remediation, or remove an orphan member with etcdctl.
    pub(crate) fn follow(&self, n: &mut State, explore: bool, say: &mut Say) -> Option<()> {
        let action = next_action(&n.enricher_view(), &Policy::default(), NOW);
        let target = action.target.clone().unwrap_or_default();
        let slot_of_machine = || target.strip_prefix('m')?.parse::<u8>().ok();
        match action.code {
            ActionCode::DeleteMachine => {
                let slot = slot_of_machine()?;
                n.machine(slot).filter(|m| !m.deleting)?;
                say.line(|| format!("a person follows the next action: deletes Machine {target}"));
                self.delete(n, slot, Who::Person, explore, say)
            }
            ActionCode::RemediateMachine => {
                let slot = slot_of_machine()?;
                let m = n
                    .machine_mut(slot)
                    .filter(|m| !m.deleting && !m.remediate)?;
                m.remediate = true;
                say.line(|| {
                    format!("a person follows the next action: annotates Machine {target} remediate-machine")
                });
                Some(())
            }
            // No MachineHealthCheck would pass the remediation on: the person creates one for
            // the control plane (the one the next action points to), then the next action names
            // the annotation.
            ActionCode::EnableRemediation if !n.health_check => {
                n.health_check = true;
                say.line(|| {
                    format!("a person follows the next action: creates a MachineHealthCheck covering the control plane (for Machine {target})")
                });
                Some(())
            }
            // KCP retries a remediation the guard refuses and does nothing else (v1.14): the
            // next action names taking the request back, with the command.
            ActionCode::CheckEtcdHealth
                if action
                    .command
                    .as_deref()
                    .is_some_and(|c| c.ends_with(&format!("{ANNOTATION_REMEDIATE}-"))) =>
            {
                let slot = slot_of_machine()?;
                let m = n.machine_mut(slot).filter(|m| m.remediate)?;
                m.remediate = false;
                say.line(|| {
                    format!("a person follows the next action: removes Machine {target}'s remediate-machine annotation")
                });
                Some(())
            }
            ActionCode::RemoveOrphanMember => {
                let id = u64::from_str_radix(&target, 16).ok()?;
                let slot = u8::try_from(id.checked_sub(1)?).ok()?;
                n.member(slot)?;
                if !n.has_quorum() {
                    return None;
                }
                n.members.retain(|m| m.slot != slot);
                say.line(|| {
                    format!("a person follows the next action: etcdctl member remove {target}")
                });
                Some(())
            }
            _ => None,
        }
    }
}

/// etcd as a probe taken now sees it (each member's status and health, as the prober reports
/// them), or `None` when no started voting member answers the member list.
pub(crate) fn take_probe(n: &State) -> Option<Vec<Member>> {
    if !n.members.iter().any(|m| m.started && m.up && !m.learner) {
        return None;
    }
    let probe = n
        .members
        .iter()
        .map(|m| {
            let mut x = Member::new(
                u64::from(m.slot) + 1,
                if m.started {
                    name(m.slot)
                } else {
                    String::new()
                },
            );
            x.is_learner = m.learner;
            x.version = m.started.then(|| n.etcd_version().to_string());
            x.health = if !m.started {
                Health::Unhealthy("not started".into())
            } else if !m.up {
                Health::Unhealthy("no answer within 2s".into())
            } else if n.leader.is_some() {
                x.raft_term = Some(2);
                x.is_leader = n.leader == Some(m.slot);
                Health::Healthy
            } else {
                x.raft_term = Some(2);
                Health::Unhealthy("etcdserver: no leader".into())
            };
            x
        })
        .collect();
    Some(probe)
}

pub(crate) fn verdict(j: &Judgement) -> String {
    format!(
        "  the guard {} it ({})",
        if j.allowed { "allows" } else { "denies" },
        j.reason
    )
}

/// A person carries out a published next action that is an etcdctl command the guard's own
/// follower (guard.rs) does not: `etcdctl member promote ID`. etcd promotes only a learner that
/// runs (and has caught up), with quorum. The Machine's node registered before its etcd join
/// (kubeadm's order), so it has its node once the member votes.
pub(crate) fn follow_etcdctl(n: &mut State, say: &mut Say) -> Option<()> {
    let action = quorumguard::engine::next_action(
        &n.enricher_view(),
        &quorumguard::engine::Policy::default(),
        NOW,
    );
    if action.code != quorumguard::engine::ActionCode::PromoteLearner {
        return None;
    }
    let target = action.target?;
    let id = u64::from_str_radix(&target, 16).ok()?;
    let slot = u8::try_from(id.checked_sub(1)?).ok()?;
    n.member(slot).filter(|m| m.learner && m.started && m.up)?;
    if !n.has_quorum() {
        return None;
    }
    n.member_mut(slot)?.learner = false;
    if let Some(m) = n.machine_mut(slot) {
        m.node = true;
    }
    say.line(|| format!("a person follows the next action: etcdctl member promote {target}"));
    Some(())
}
