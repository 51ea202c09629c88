//! The autopilot's bookkeeping for one cluster: the step in flight, when it last acted, its
//! failures in a row, since when the published action has stood, and how far a `FreeSpace`
//! plan has come. The adapter keeps it (in memory of the Lease holder); the engine reads it to
//! decide and updates it from what the next probe shows ([`Book::settle`]).

use super::free_space::{Progress, compaction_bound};
use super::{Act, Kind, Proof, Refusal, Situation, Step, Why};
use crate::model::{Alarm, ControlPlane, EtcdState};
use crate::next_action::{ActionCode, NextAction, rfc3339};
use crate::quorum::Tally;

/// A step started and not re-proven yet.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InFlight {
    pub step: Step,
    pub proof: Proof,
    pub started_unix: i64,
}

/// The published next action and since when it has stood.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Seen {
    pub code: ActionCode,
    pub target: Option<String>,
    pub since_unix: i64,
}

/// What the probe after a step shows of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done, as the proof predicted.
    Succeeded(String),
    /// Not done, or not as predicted: the autopilot backs off.
    Failed(String),
    /// Not visible yet (a Machine draining); still in flight.
    UnderWay(String),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Book {
    pub in_flight: Option<InFlight>,
    pub last_action_unix: Option<i64>,
    /// Failures in a row (a success resets it).
    pub failures: u32,
    pub last_failure_unix: Option<i64>,
    /// The step that failed last.
    pub failed_step: Option<Step>,
    pub seen: Option<Seen>,
    pub free_space: Progress,
}

impl Book {
    /// Notes the published next action at a sweep: since when it has stood (KCP's chance is
    /// counted from there); a `FreeSpace` plan ends when the action is no longer `FreeSpace`.
    pub fn note_published(&mut self, published: &NextAction, now_unix: i64) {
        let same = self
            .seen
            .as_ref()
            .is_some_and(|s| s.code == published.code && s.target == published.target);
        if !same {
            // Another action: a step given up on is not this one.
            self.failed_step = None;
            self.seen = Some(Seen {
                code: published.code,
                target: published.target.clone(),
                since_unix: now_unix,
            });
        }
        if published.code != ActionCode::FreeSpace && self.in_flight.is_none() {
            self.free_space = Progress::default();
        }
    }

    /// The adapter carries `act` out now.
    pub fn started(&mut self, act: &Act, now_unix: i64) {
        self.in_flight = Some(InFlight {
            step: act.step.clone(),
            proof: act.proof,
            started_unix: now_unix,
        });
        self.last_action_unix = Some(now_unix);
    }

    /// The call that carried the step out failed (etcd or the API server refused it).
    pub fn call_failed(&mut self, error: &str, now_unix: i64) -> Outcome {
        let step = self.in_flight.as_ref().map(|f| f.step.to_string());
        self.fail(
            format!(
                "{} failed: {error}",
                step.unwrap_or_else(|| "the step".into())
            ),
            now_unix,
        )
    }

    fn fail(&mut self, why: String, now_unix: i64) -> Outcome {
        if let Some(f) = self.in_flight.take() {
            if f.step.kind() == Kind::FreeSpace {
                self.free_space.stopped = Some(format!("at \"{}\": {why}", f.step));
            }
            self.failed_step = Some(f.step);
        }
        self.failures = self.failures.saturating_add(1);
        self.last_failure_unix = Some(now_unix);
        Outcome::Failed(why)
    }

    /// Re-proves the step in flight on `fresh`, a probe taken after it: `None` when nothing is
    /// in flight.
    pub fn settle(
        &mut self,
        fresh: &ControlPlane,
        interval: std::time::Duration,
        now_unix: i64,
    ) -> Option<Outcome> {
        let f = self.in_flight.clone()?;
        let members = match &fresh.etcd {
            EtcdState::Observed(s) => s.members.as_slice(),
            EtcdState::Unknown { .. } => &[],
        };
        let tally = Tally::of(members, false);
        let by_id = |id| members.iter().find(|m| m.id == id);
        let shown = match &f.step {
            Step::Promote { member, .. } => by_id(*member).is_some_and(|m| !m.is_learner),
            Step::RemoveMember { member, .. } => by_id(*member).is_none(),
            Step::DeleteMachine { machine } => match fresh.machine(machine) {
                None => true,
                Some(m) if m.deleting => {
                    return Some(Outcome::UnderWay(format!(
                        "Machine {machine} is being deleted (KCP drains its node)"
                    )));
                }
                Some(_) => false,
            },
            Step::MoveLeader { to, .. } => by_id(*to).is_some_and(|m| m.is_leader),
            Step::Disarm => !members.iter().any(|m| m.alarms.contains(&Alarm::NoSpace)),
            Step::Compact | Step::Defragment { .. } => true,
        };
        // The step's own member (promoted, defragmented) healthy, and etcd with its quorum and
        // every voting member's health known. A member another actor took away meanwhile is
        // not the step's failure; a quorum lost is, until shown otherwise.
        let own = match &f.step {
            Step::Promote { member, .. } | Step::Defragment { member, .. } => {
                by_id(*member).is_some_and(|m| m.effective_health_ref().is_healthy())
            }
            _ => true,
        };
        let count = super::Count {
            voting: tally.voting(),
            healthy: tally.healthy,
        };
        let healthy_enough = tally.unknown == 0 && count.keeps_quorum() && own;
        if shown && healthy_enough {
            self.in_flight = None;
            self.failures = 0;
            self.failed_step = None;
            if f.step == Step::Compact {
                self.free_space.compaction_index = compaction_bound(members);
            }
            self.free_space.done(&f.step);
            return Some(Outcome::Succeeded(format!(
                "{} done: {} healthy of {} voting members",
                f.step,
                tally.healthy,
                tally.voting()
            )));
        }
        let waited = now_unix.saturating_sub(f.started_unix)
            >= i64::try_from(interval.as_secs()).unwrap_or(i64::MAX);
        let seen = format!(
            "the probe after it shows {} healthy of {} voting members ({} unknown), predicted {}",
            tally.healthy,
            tally.voting(),
            tally.unknown,
            f.proof.after
        );
        if !waited && shown {
            return Some(Outcome::UnderWay(seen));
        }
        if !waited {
            return Some(Outcome::UnderWay(format!(
                "{} not visible yet; {seen}",
                f.step
            )));
        }
        Some(self.fail(
            format!(
                "{} not re-proven within --autopilot-interval: {seen}",
                f.step
            ),
            now_unix,
        ))
    }

    /// What of the bookkeeping holds `step` back now: giving up, the back-off, the interval,
    /// KCP's chance.
    pub(super) fn wait(&self, s: &Situation<'_>, step: &Step) -> Option<Refusal> {
        let kcp = s.fresh.kcp_shown();
        let set = s.settings;
        let until = |why: Why, at: i64, detail: String| {
            (s.now_unix < at).then(|| Refusal {
                why,
                message: format!(
                    "Autopilot waits on KubeadmControlPlane {kcp} until {}: {detail}",
                    rfc3339(at)
                ),
                until_unix: Some(at),
            })
        };
        let same_failed = self
            .failed_step
            .as_ref()
            .is_some_and(|f| f.kind() == step.kind());
        if same_failed && self.failures >= set.give_up_after {
            return Some(Refusal {
                why: Why::GaveUp,
                message: format!(
                    "Autopilot has stopped trying on KubeadmControlPlane {kcp}: {} failed {} times in a row. Next, by hand: {}",
                    step, self.failures, s.published.message
                ),
                until_unix: None,
            });
        }
        if let (Some(failed_at), true) = (self.last_failure_unix, self.failures > 0) {
            let factor = 1u32 << (self.failures - 1).min(16);
            let back = set.back_off.saturating_mul(factor).min(set.max_back_off);
            let at = failed_at.saturating_add(secs(back));
            let detail = format!(
                "{} failures in a row, the last at {}; back-off {}. Next: it proves {step} again then.",
                self.failures,
                rfc3339(failed_at),
                humantime::format_duration(back)
            );
            if let Some(r) = until(Why::BackOff, at, detail) {
                return Some(r);
            }
        }
        let plan_under_way = step.kind() == Kind::FreeSpace && self.free_space.under_way();
        if let (Some(last), false) = (self.last_action_unix, plan_under_way) {
            let at = last.saturating_add(secs(set.interval));
            let detail = format!(
                "it acted last at {}, and acts at most once per --autopilot-interval {}. Next: {step}.",
                rfc3339(last),
                humantime::format_duration(set.interval)
            );
            if let Some(r) = until(Why::Interval, at, detail) {
                return Some(r);
            }
        }
        if let Step::RemoveMember { member, name } = step {
            let since = self
                .seen
                .as_ref()
                .filter(|x| x.code == s.published.code && x.target == s.published.target)
                .map_or(s.now_unix, |x| x.since_unix);
            let at = since.saturating_add(secs(set.kcp_chance));
            let detail = format!(
                "KCP gets its chance to remove etcd member {name} (id {member}) itself first (cluster-api #13685, `reconcileEtcdMembers`), {} from {}. Next: {step}.",
                humantime::format_duration(set.kcp_chance),
                rfc3339(since)
            );
            if let Some(r) = until(Why::KcpChance, at, detail) {
                return Some(r);
            }
        }
        None
    }
}

fn secs(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}
