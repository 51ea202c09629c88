//! The model for stateright: the initial states, the four properties, the liveness
//! continuation, and the counterexample printer.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use quorumguard::engine::{ActionCode, Policy, next_action};
use quorumguard::status::conditions;
use stateright::{Model, Path, Property};

use crate::model::guard::{Fresh, Who};
use crate::model::predicts::CrossCheck;
use crate::model::steps::{Action, Config, Say};
use crate::model::world::*;

pub use crate::model::summary::summary;

/// Admitted operations keep quorum.
pub const SAFE: &str = "no admitted operation loses quorum";
/// The next action is one the guard allows.
pub const ADVICE: &str = "the published next action is one the guard allows";
/// The false-alarms rule.
pub const NO_FALSE_ALARM: &str = "nothing published claims quorum lost while it holds";
/// Liveness.
pub const RECOVERS: &str = "every state can still converge once failures stop";
/// No wait without an end.
pub const NO_IDLE_WAIT: &str = "no Wait* next action is published where nothing will move";

/// preflight's prediction: checked beside the exploration, reported after it.
pub const PREDICTS: &str = "preflight predicts the rollout the model plays";

/// The autopilot takes one step at a time (issue 38).
pub const ONE_AT_A_TIME: &str =
    "the autopilot takes no step while another of its steps is under way";
/// Liveness without a person (issue 38).
pub const WITHOUT_A_PERSON: &str =
    "with the autopilot, every state converges without a person once failures stop";

pub const PROPERTIES: [&str; 7] = [
    SAFE,
    ADVICE,
    NO_FALSE_ALARM,
    RECOVERS,
    NO_IDLE_WAIT,
    ONE_AT_A_TIME,
    WITHOUT_A_PERSON,
];

/// Who takes part in a continuation of the fair schedule, beside KCP, kubeadm, the Machine
/// controller, the guard and the autopilot (where the run has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// A person follows the published next action.
    Person,
    /// Nobody else.
    Others,
    /// Nobody else, and failures have stopped: the members that failed come back, and the
    /// MachineHealthCheck marks a Machine without a node past its nodeStartupTimeout (and,
    /// where nothing else moves, one whose etcd member is gone: `Checked::recovers_alone`).
    Autonomous,
}

/// Rounds the liveness continuation may take, and how many in a row may change nothing the
/// actors read before it counts as stuck (a confirmation takes two probes).
const ROUNDS: usize = 80;
const IDLE_ROUNDS: usize = 3;

pub struct Checked {
    pub cfg: Config,
    /// State hash -> whether the continuation from it converges.
    memo: Arc<Mutex<HashMap<u64, bool>>>,
    /// State hash -> whether a published wait there ends.
    waits: Arc<Mutex<HashMap<u64, bool>>>,
    /// State hash -> whether the continuation without a person converges.
    alone: Arc<Mutex<HashMap<u64, bool>>>,
    /// Compares `preflight`'s prediction with the model's play over the settled states
    /// (tests/slow/model/predicts.rs), when asked for.
    pub cross_check: Option<Arc<CrossCheck>>,
}

impl Checked {
    pub fn new(cfg: Config) -> Checked {
        Checked {
            cfg,
            memo: Arc::default(),
            waits: Arc::default(),
            alone: Arc::default(),
            cross_check: None,
        }
    }

    /// The same, with the cross-check of `preflight` against the model's play.
    pub fn cross_checked(cfg: Config) -> Checked {
        Checked {
            cross_check: Some(Arc::default()),
            ..Checked::new(cfg)
        }
    }

    /// The policy the published next action is worked out with (the planted
    /// `wait_without_grace` makes every Machine young for ever).
    fn policy(&self) -> Policy {
        let mut p = Policy::default();
        if self.cfg.bugs.wait_without_grace {
            p.join_grace = std::time::Duration::from_secs(u64::from(u32::MAX));
        }
        p
    }

    /// The next action code the enricher would publish on its view, under [`Checked::policy`].
    fn published_code(&self, s: &State) -> ActionCode {
        next_action(&s.enricher_view(), &self.policy(), NOW).code
    }

    /// No wait without an end: when the published next action is a `Wait*`, the others
    /// (KCP, kubeadm, the Machine controller, the guard: every actor but the person) or the
    /// time passing (once, beyond both grace periods) change it. A wait that nothing ends is
    /// advice that leads nowhere.
    pub fn wait_ends(&self, s: &State) -> bool {
        if !is_wait(self.published_code(s)) {
            return true;
        }
        // Where etcd has lost quorum nothing moves but disaster recovery, as for RECOVERS: a
        // wait stuck there is excused (the guard, whose probes no member answers, cannot tell
        // that the deletion it waits for will not finish; docs/rules.md, "Model-checked").
        self.continuation(
            s,
            &self.waits,
            Schedule::Others,
            |cur| !is_wait(self.published_code(cur)),
            |cur| !cur.has_quorum(),
        )
    }

    /// A continuation of the fair schedule from `s` (with or without the person following
    /// the next action): true once `done`; when nothing moves, time passes once (beyond both
    /// grace periods), then `stuck` answers. Deterministic, so every state it passes through
    /// has the same answer: all are memoised in `memo`.
    fn continuation(
        &self,
        s: &State,
        memo: &Mutex<HashMap<u64, bool>>,
        schedule: Schedule,
        done: impl Fn(&State) -> bool,
        stuck: impl Fn(&State) -> bool,
    ) -> bool {
        let key = fingerprint(s);
        if let Some(v) = memo.lock().expect("memo").get(&key) {
            return *v;
        }
        let mut keys = vec![key];
        let mut cur = s.clone();
        let mut idle = 0;
        let mut waited = false;
        let mut result = false;
        for _ in 0..ROUNDS {
            if done(&cur) {
                result = true;
                break;
            }
            let k = fingerprint(&cur);
            if let Some(v) = memo.lock().expect("memo").get(&k) {
                result = *v;
                break;
            }
            keys.push(k);
            let next = self.round_of(&cur, schedule);
            idle = if moved(&cur, &next) { 0 } else { idle + 1 };
            cur = next;
            if idle >= IDLE_ROUNDS {
                // Nothing moves: wait out the grace periods once; then, without a person, a
                // MachineHealthCheck's Machine checks mark what they would; then give up.
                let next = match self
                    .cfg
                    .step(&cur, &Action::GraceExpires, false, &mut Say(None))
                {
                    Some(n) if !waited => {
                        waited = true;
                        Some(n)
                    }
                    _ => self.machine_checks(&cur, schedule),
                };
                match next {
                    Some(n) => {
                        cur = n;
                        idle = 0;
                    }
                    None => {
                        result = stuck(&cur);
                        break;
                    }
                }
            }
        }
        let mut memo = memo.lock().expect("memo");
        for k in keys {
            memo.insert(k, result);
        }
        result
    }

    /// The next action the enricher would publish on its view.
    pub fn published(s: &State) -> (ActionCode, Option<String>) {
        let a = next_action(&s.enricher_view(), &Policy::default(), NOW);
        (a.code, a.target)
    }

    /// The Machine deletion a published next action asks for, and whether the webhook would
    /// allow it right now: `None` when the action asks for no deletion.
    ///
    /// While the webhook holds a reservation the cache does not show yet (an allowed deletion
    /// or scale-up, for one watch event), the enricher cannot know it: the advice is then held
    /// to the view it was published from (docs/rules.md, "Model-checked", known limits).
    pub fn advice(&self, s: &State) -> Option<(ActionCode, String, bool)> {
        let (code, target) = Checked::published(s);
        let who = match code {
            ActionCode::DeleteMachine => Who::Person,
            // Creating the MachineHealthCheck leads to KCP remediating the Machine named.
            ActionCode::RemediateMachine | ActionCode::EnableRemediation => Who::Kcp,
            _ => return None,
        };
        let target = target?;
        let slot: u8 = target.strip_prefix('m')?.parse().ok()?;
        s.machine(slot).filter(|m| !m.deleting)?;
        let mut n = s.clone();
        if who == Who::Kcp {
            n.machine_mut(slot)?.remediate = true;
        }
        let (_, replicas, kept) = s.webhook_view(true);
        let outstanding = replicas.is_some() || !kept.is_empty();
        // The webhook probes afresh; when etcd changed since the record the advice was
        // published from (or the latest probe failed), the advice is held to that record.
        let fresh = if s.unprobed == 0 && !s.probe_failed && !s.unconfirmed_membership() {
            Fresh::Probe { explore: false }
        } else {
            Fresh::RecordOnly
        };
        let allowed = self
            .cfg
            .review_deletion(&mut n, slot, who, !outstanding, fresh, &mut Say(None))
            .unwrap_or(false);
        Some((code, target, allowed))
    }

    /// What the published conditions claim of quorum: lost or not.
    pub fn claims_quorum_lost(s: &State) -> bool {
        let [quorum, action] = conditions(
            &s.enricher_view(),
            &Policy::default(),
            NOW,
            None,
            s.probe_failed.then_some("the probe failed"),
        );
        quorum.reason == "QuorumLost" || action.reason == ActionCode::RestoreQuorum.as_str()
    }

    /// A claim of quorum loss needs a probe that found quorum truly lost, at most one leader
    /// election ago.
    pub fn no_false_alarm(&self, s: &State) -> bool {
        !Checked::claims_quorum_lost(s) || s.probes_since_lost <= self.cfg.bounds.election_probes
    }

    /// Converged: as many Machines as replicas, all up to date, each with a healthy voting
    /// member and nothing else in etcd, nothing deleting or half done, a leader. (A
    /// remediate-machine annotation KCP cannot honour on a healthy Machine, the last one for
    /// instance, may stay.)
    pub fn converged(s: &State) -> bool {
        s.kcp_deletes_next.is_none()
            && s.leader.is_some()
            && s.machines.len() == usize::from(s.replicas)
            && s.members.len() == s.machines.len()
            && s.machines.iter().all(|m| {
                !m.deleting
                    && m.node
                    && m.version == s.version
                    && s.member(m.slot)
                        .is_some_and(|x| !x.learner && x.started && x.up)
            })
    }

    /// Liveness: from `s`, with no more failures, one fair schedule (every actor in turn; the
    /// person follows the published next action) converges. A state without quorum that
    /// cannot move is excused: only disaster recovery helps, which the model leaves out.
    pub fn recovers(&self, s: &State) -> bool {
        self.continuation(s, &self.memo, Schedule::Person, Checked::converged, |cur| {
            !cur.has_quorum()
        })
    }

    /// Liveness without a person: from `s`, once failures stop, KCP, kubeadm, the Machine
    /// controller, the MachineHealthCheck and the autopilot alone converge (runs without an
    /// autopilot: not asked). A state without quorum that cannot move is excused, as above.
    ///
    /// Given a MachineHealthCheck that checks the Machine's `EtcdMemberHealthy` condition
    /// (`Bounds::mhc_checks_etcd_member`): one class of states needs it or a person. A Machine
    /// whose node is up and whose etcd member is gone (KCP v0.3 removed the member and lost
    /// leadership before deleting the Machine, cluster-api #2651), once there are no more
    /// Machines than replicas (another Machine went meanwhile): KCP's preflight holds every
    /// scale-up and rollout on the missing member, and the published next action is
    /// `RemediateMachine`, which is none of the autopilot's four actions (issue 38: it deletes
    /// the #2651 Machine only while there are more Machines than replicas). An MHC that checks
    /// only Nodes never marks it (its node is Ready); one that checks that condition does
    /// (`joins::etcd_member_condition`), and then KCP remediates it. So where the continuation
    /// stops, that MHC marks every such Machine and the continuation goes on: the state must
    /// still converge. Without that check (`mhc_checks_etcd_member: false`) the class fails
    /// the property (`an_mhc_checking_only_nodes_leaves_the_2651_machine_to_a_person`).
    pub fn recovers_alone(&self, s: &State) -> bool {
        s.autopilot.is_none()
            || self.continuation(
                s,
                &self.alone,
                Schedule::Autonomous,
                Checked::converged,
                |cur| !cur.has_quorum(),
            )
    }

    /// Where the continuation without a person stops: a MachineHealthCheck that checks the
    /// Machine's `EtcdMemberHealthy` condition (`Bounds::mhc_checks_etcd_member`) marks every
    /// Machine whose node is up and whose etcd member is gone. Only while there are no more
    /// Machines (not being deleted) than replicas: with more, deleting that Machine is the
    /// autopilot's own action (or KCP's, picking it again), which the MHC must not stand in
    /// for. `None` when it marks nothing,
    /// with a person in the schedule (who follows the next action instead), or when the run's
    /// MHC checks only Nodes.
    fn machine_checks(&self, s: &State, schedule: Schedule) -> Option<State> {
        if schedule != Schedule::Autonomous || !self.cfg.bounds.mhc_checks_etcd_member {
            return None;
        }
        if s.machines.iter().filter(|m| !m.deleting).count() > usize::from(s.replicas) {
            return None;
        }
        let mut cur = s.clone();
        let slots: Vec<u8> = cur.machines.iter().map(|m| m.slot).collect();
        for slot in slots {
            let mark = Action::EtcdMemberCondition(slot);
            if let Some(n) = self.cfg.step(&cur, &mark, false, &mut Say(None)) {
                cur = n;
            }
        }
        (cur != *s).then_some(cur)
    }

    /// One round of the fair schedule, every actor in turn, with or without the person
    /// following the next action.
    fn round_of(&self, s: &State, schedule: Schedule) -> State {
        let mut cur = s.clone();
        let run = |cur: &mut State, a: Action| {
            if let Some(n) = self.cfg.step(cur, &a, false, &mut Say(None)) {
                *cur = n;
            }
        };
        if schedule == Schedule::Autonomous {
            let slots: Vec<u8> = cur.members.iter().map(|m| m.slot).collect();
            for slot in slots {
                run(&mut cur, Action::Recover(slot));
            }
            let slots: Vec<u8> = cur.machines.iter().map(|m| m.slot).collect();
            for slot in slots {
                run(&mut cur, Action::NodeStartupTimeout(slot));
            }
        }
        sync_all(self, &mut cur);
        run(&mut cur, Action::ElectionEnds);
        run(&mut cur, Action::Probe);
        for slot in cur.deleting() {
            run(&mut cur, Action::FinishDeletion(slot));
        }
        let joining: Vec<u8> = cur
            .machines
            .iter()
            .filter(|m| !m.node)
            .map(|m| m.slot)
            .collect();
        for slot in joining {
            run(&mut cur, Action::Join(slot));
        }
        run(&mut cur, Action::Kcp);
        sync_all(self, &mut cur);
        run(&mut cur, Action::Probe);
        run(&mut cur, Action::Autopilot);
        if schedule == Schedule::Person && !self.cfg.bugs.ignore_next_action {
            run(&mut cur, Action::Follow);
        }
        cur
    }

    /// The path, step by step, each step with what the guard answered and the state after it.
    pub fn explain(&self, path: &Path<State, Action>) -> String {
        let steps = path.clone().into_vec();
        let mut out = format!("  0. start: {}\n", summary(&steps[0].0));
        for (i, (s, a)) in steps.iter().enumerate() {
            let Some(a) = a else { continue };
            let mut say = Say(Some(Vec::new()));
            let next = self.cfg.step(s, a, true, &mut say);
            let lines = say.0.unwrap_or_default();
            out.push_str(&format!("{:3}. {}\n", i + 1, lines.join("\n     ")));
            if let Some(n) = next {
                out.push_str(&format!("     -> {}\n", summary(&n)));
            }
        }
        let last = path.last_state();
        if let Some(why) = &last.lost_by {
            out.push_str(&format!("  quorum lost by: {why}\n"));
        }
        if let Some(why) = &last.ap_overlap {
            out.push_str(&format!(
                "  the autopilot took a step while another was under way: {why}\n"
            ));
        }
        if let Some((code, target, false)) = self.advice(last) {
            out.push_str(&format!(
                "  published next action {code} {target}, which the guard denies\n"
            ));
        }
        let schedule = if !self.wait_ends(last) {
            Some(Schedule::Others)
        } else if !self.recovers(last) {
            Some(Schedule::Person)
        } else if !self.recovers_alone(last) {
            Some(Schedule::Autonomous)
        } else {
            None
        };
        if let Some(schedule) = schedule {
            // Where the fair schedule from there stops (the person following the next action
            // unless a wait is judged, or the run is without a person), and what KCP's
            // reconcile does there.
            let mut cur = last.clone();
            for _ in 0..ROUNDS {
                let next = self.round_of(&cur, schedule);
                if moved(&cur, &next) {
                    cur = next;
                } else if let Some(n) = self.machine_checks(&next, schedule) {
                    cur = n;
                } else {
                    break;
                }
            }
            let mut say = Say(Some(Vec::new()));
            let changes = self.cfg.step(&cur, &Action::Kcp, false, &mut say).is_some();
            let lines = say.0.unwrap_or_default();
            out.push_str(&format!(
                "  from there, {} it stops at: {}\n  KCP's reconcile there: {}{}\n",
                match schedule {
                    Schedule::Others => "without the person,",
                    Schedule::Person => "with the person following the next action,",
                    Schedule::Autonomous => "without a person, failures stopped,",
                },
                summary(&cur),
                if lines.is_empty() {
                    "nothing to do".to_string()
                } else {
                    lines.join("; ")
                },
                if changes { "" } else { " (nothing changes)" }
            ));
        }
        if !self.no_false_alarm(last) {
            out.push_str(&format!(
                "  published: quorum lost; etcd truly has {} healthy of {} voting members\n",
                last.healthy(),
                last.voting()
            ));
        }
        out
    }
}

impl Model for Checked {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let b = &self.cfg.bounds;
        let left = Left {
            failures: b.failures,
            probe_failures: b.probe_failures,
            crashes: b.crashes,
            person: b.person,
            rollouts: b.rollouts,
            new_machines: b.new_machines,
            leftovers: b.leftovers,
        };
        let mut out = Vec::new();
        for style in &b.styles {
            for etcd in &b.etcds {
                for n in &b.sizes {
                    for surge in &b.max_surges {
                        for covered in &b.health_check {
                            let mut s = State::converged(*style, *etcd, *n, *surge, left);
                            s.health_check = *covered;
                            if b.autopilot {
                                s.autopilot = Some(Default::default());
                            }
                            out.push(s);
                        }
                    }
                }
            }
        }
        out
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        self.cfg.actions(s, out);
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        self.cfg.step(s, &a, true, &mut Say(None))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(SAFE, |_, s: &State| s.lost_by.is_none()),
            Property::always(ADVICE, |m, s| !matches!(m.advice(s), Some((_, _, false)))),
            Property::always(NO_FALSE_ALARM, |m, s| m.no_false_alarm(s)),
            Property::always(RECOVERS, |m, s| m.recovers(s)),
            Property::always(NO_IDLE_WAIT, |m, s| m.wait_ends(s)),
            Property::always(ONE_AT_A_TIME, |_, s: &State| s.ap_overlap.is_none()),
            Property::always(WITHOUT_A_PERSON, |m, s| m.recovers_alone(s)),
            // Never fails here: the mismatches are collected and reported after the run.
            Property::always(PREDICTS, |m, s| {
                if let Some(x) = &m.cross_check {
                    x.check(&m.cfg, s);
                }
                true
            }),
        ]
    }
}

fn sync_all(m: &Checked, s: &mut State) {
    let mut actions = Vec::new();
    m.cfg.actions(s, &mut actions);
    for a in actions {
        if matches!(a, Action::SyncMachine(_) | Action::SyncKcp)
            && let Some(n) = m.cfg.step(s, &a, false, &mut Say(None))
        {
            *s = n;
        }
    }
}

/// Whether anything an actor reads changed (not the belief's clock, not the ghosts).
fn moved(a: &State, b: &State) -> bool {
    let key = |s: &State| {
        (
            s.machines.clone(),
            (s.replicas, s.version),
            s.members.clone(),
            s.leader,
            s.kcp_deletes_next,
            s.cache_machines.clone(),
            (s.cache_replicas, s.cache_version),
            s.view.clone(),
            s.probe_failed,
            (s.reserved_replicas, s.reserved.clone()),
            s.autopilot.as_ref().map(|b| b.in_flight.clone()),
        )
    };
    key(a) != key(b)
}

fn is_wait(code: ActionCode) -> bool {
    matches!(
        code,
        ActionCode::WaitForTeardown
            | ActionCode::WaitForDeletion
            | ActionCode::WaitForJoin
            | ActionCode::WaitForLearner
            | ActionCode::WaitForRollout
    )
}

fn fingerprint(s: &State) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}
