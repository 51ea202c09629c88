//! What a turn tells people ([`Report::events`]: the Events on the KCP) and the metrics
//! ([`AutopilotMetrics`]). Pure but for the metrics' counters.
//!
//! Every action, its result and every refusal of a step the autopilot would take is an Event
//! (the caller's Event publisher folds a repeat into a series). Not an Event: `off`, a next
//! action the autopilot does not carry out, and one `--autopilot-actions` leaves out: those are
//! the operator's choices, said once in the docs, not news at every sweep.

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use quorumguard_engine::autopilot::{Outcome, Step, Why};
use quorumguard_telemetry::Metrics;

use crate::pilot::{Did, Report};

/// One Event about the KCP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventNote {
    pub warning: bool,
    /// The Event's reason (a CamelCase code).
    pub reason: &'static str,
    pub note: String,
}

impl EventNote {
    /// Whether it records something the autopilot did (an action, its failure, or what the
    /// probe after it showed), rather than what it would do or why it waits: a record is never
    /// dropped by the Event publisher's limits.
    pub fn is_record(&self) -> bool {
        matches!(
            self.reason,
            "AutopilotActed"
                | "AutopilotActionFailed"
                | "AutopilotStepConfirmed"
                | "AutopilotStepNotConfirmed"
        )
    }

    fn normal(reason: &'static str, note: String) -> Self {
        EventNote {
            warning: false,
            reason,
            note,
        }
    }

    fn warning(reason: &'static str, note: String) -> Self {
        EventNote {
            warning: true,
            reason,
            note,
        }
    }
}

/// The step's label in the metrics: the etcd call or the deletion it is.
pub fn step_label(step: &Step) -> &'static str {
    match step {
        Step::Promote { .. } => "promote",
        Step::RemoveMember { .. } => "remove_member",
        Step::DeleteMachine { .. } => "delete_machine",
        Step::Compact => "compact",
        Step::Defragment { .. } => "defragment",
        Step::MoveLeader { .. } => "move_leader",
        Step::Disarm => "disarm",
    }
}

/// Every value of [`step_label`].
const STEP_LABELS: [&str; 7] = [
    "promote",
    "remove_member",
    "delete_machine",
    "compact",
    "defragment",
    "move_leader",
    "disarm",
];

/// Every `result` of `quorumguard_autopilot_actions_total`.
const ACTION_RESULTS: [&str; 4] = ["done", "failed", "dry_run", "fleet_busy"];

/// The refusals that are news ([`refusal_is_news`]), each a `reason` of
/// `quorumguard_autopilot_refusals_total`.
const NEWS: [Why; 14] = [
    Why::Paused,
    Why::NotFresh,
    Why::HealthUnknown,
    Why::QuorumLost,
    Why::LeaderElection,
    Why::InFlight,
    Why::Interval,
    Why::BackOff,
    Why::GaveUp,
    Why::Disagrees,
    Why::KcpChance,
    Why::NotProven,
    Why::Corrupt,
    Why::CompactionNotApplied,
];

/// Whether a refusal is about a step the autopilot would take (an Event), rather than the
/// operator's choice of what it does (none).
fn refusal_is_news(why: Why) -> bool {
    !matches!(
        why,
        Why::Off | Why::NotAnAutopilotAction | Why::ActionNotAllowed
    )
}

/// A wait with an end (the interval, the back-off, a step in flight, KCP's own chance, a
/// member catching up to the compaction) is normal; a refusal that needs a look is a warning.
fn refusal_is_wait(why: Why) -> bool {
    matches!(
        why,
        Why::Interval | Why::BackOff | Why::InFlight | Why::KcpChance | Why::CompactionNotApplied
    )
}

impl Report {
    /// The Events of this turn, in order: the outcome of the step in flight, then what the
    /// turn did.
    pub fn events(&self) -> Vec<EventNote> {
        let mut out = Vec::new();
        match &self.settled {
            Some(Outcome::Succeeded(m)) => {
                out.push(EventNote::normal("AutopilotStepConfirmed", m.clone()))
            }
            Some(Outcome::Failed(m)) => {
                out.push(EventNote::warning("AutopilotStepNotConfirmed", m.clone()))
            }
            Some(Outcome::UnderWay(_)) | None => {}
        }
        match &self.did {
            Did::Acted {
                message,
                result: Ok(_),
                ..
            } => out.push(EventNote::normal("AutopilotActed", message.clone())),
            Did::Acted {
                step,
                result: Err(e),
                ..
            } => out.push(EventNote::warning(
                "AutopilotActionFailed",
                format!("Autopilot could not {step}: {e}"),
            )),
            Did::DryRun { message, .. } => {
                out.push(EventNote::normal("AutopilotDryRun", message.clone()))
            }
            Did::FleetBusy { message, .. } => {
                out.push(EventNote::normal("AutopilotWaiting", message.clone()))
            }
            Did::Refused { why, message, .. } if refusal_is_news(*why) => {
                if refusal_is_wait(*why) {
                    out.push(EventNote::normal("AutopilotWaiting", message.clone()))
                } else {
                    out.push(EventNote::warning("AutopilotRefused", message.clone()))
                }
            }
            Did::Refused { .. } | Did::NotLeading { .. } => {}
        }
        out
    }

    /// `(action, result)` for `quorumguard_autopilot_actions_total`, when the turn acted, said
    /// what it would do, or settled a step.
    pub fn counted(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        match &self.did {
            Did::Acted { step, result, .. } => out.push((
                step_label(step),
                if result.is_ok() { "done" } else { "failed" },
            )),
            Did::DryRun { step, .. } => out.push((step_label(step), "dry_run")),
            Did::FleetBusy { step, .. } => out.push((step_label(step), "fleet_busy")),
            Did::Refused { .. } | Did::NotLeading { .. } => {}
        }
        out
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SettledLabels {
    result: &'static str,
}

/// The autopilot's metrics, in the server's registry.
pub struct AutopilotMetrics {
    actions: Family<ActionLabels, Counter>,
    refusals: Family<RefusalLabels, Counter>,
    settled: Family<SettledLabels, Counter>,
    last_action: Gauge<i64, AtomicI64>,
}

impl AutopilotMetrics {
    /// `quorumguard_autopilot_actions_total{action,result}` (result: done, failed, dry_run,
    /// fleet_busy), `quorumguard_autopilot_refusals_total{reason}` (the engine's reason, for
    /// refusals that are news), `quorumguard_autopilot_steps_settled_total{result}`
    /// (confirmed, not_confirmed: what the probe after a step showed) and
    /// `quorumguard_autopilot_last_action_timestamp_seconds` (0 before the first action; the
    /// time since it is `time() - ` that).
    pub fn register(metrics: &Metrics) -> Self {
        let m = AutopilotMetrics {
            actions: Family::default(),
            refusals: Family::default(),
            settled: Family::default(),
            last_action: Gauge::default(),
        };
        metrics.with_registry(|r| {
            r.register(
                "autopilot_actions",
                "Autopilot steps by action and result: done, failed (etcd or the API server \
                 refused or did not answer), dry_run (said, not done), fleet_busy (proven, \
                 left for the next sweep: too many clusters acting)",
                m.actions.clone(),
            );
            r.register(
                "autopilot_refusals",
                "Autopilot refusals of a step it would take, by the engine's reason",
                m.refusals.clone(),
            );
            r.register(
                "autopilot_steps_settled",
                "Autopilot steps as the probe after them showed them: confirmed, not_confirmed",
                m.settled.clone(),
            );
            r.register(
                "autopilot_last_action_timestamp_seconds",
                "When the autopilot last carried out a step (Unix seconds; 0: never)",
                m.last_action.clone(),
            );
        });
        // Every series an alert or a dashboard reads exists from the start, at 0: an increase
        // from nothing is no increase to Prometheus.
        for result in ["confirmed", "not_confirmed"] {
            let _ = m.settled.get_or_create(&SettledLabels { result });
        }
        for action in STEP_LABELS {
            for result in ACTION_RESULTS {
                let _ = m.actions.get_or_create(&ActionLabels { action, result });
            }
        }
        for why in NEWS {
            let _ = m.refusals.get_or_create(&RefusalLabels {
                reason: format!("{why:?}"),
            });
        }
        m
    }

    /// Counts one turn's report, made at `now_unix`.
    pub fn observe(&self, report: &Report, now_unix: i64) {
        for (action, result) in report.counted() {
            self.actions
                .get_or_create(&ActionLabels { action, result })
                .inc();
        }
        if let Did::Acted { .. } = report.did {
            self.last_action.set(now_unix);
        }
        if let Did::Refused { why, .. } = &report.did
            && refusal_is_news(*why)
        {
            self.refusals
                .get_or_create(&RefusalLabels {
                    reason: format!("{why:?}"),
                })
                .inc();
        }
        match &report.settled {
            Some(Outcome::Succeeded(_)) => self.count_settled("confirmed"),
            Some(Outcome::Failed(_)) => self.count_settled("not_confirmed"),
            _ => {}
        }
    }

    fn count_settled(&self, result: &'static str) {
        self.settled.get_or_create(&SettledLabels { result }).inc();
    }

    /// The last action's time, for tests and status (0: never).
    pub fn last_action_unix(&self) -> i64 {
        self.last_action.get()
    }
}

#[cfg(test)]
mod tests;
