//! The status enricher's metrics, registered in the server's [`Metrics`] registry (so they share
//! the `quorumguard_` prefix and `/metrics`).
//!
//! Per-cluster series are removed when the cluster goes, so 1,000 clusters coming and going do
//! not leave stale series behind; likewise the per-KCP rollout prediction
//! ([`EnricherMetrics::observe_rollouts`]), which keeps exactly one `rollout_ready` series per KCP.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry, Unit};

use quorumguard_engine::quorum::{Tally, quorum};
use quorumguard_engine::rollout::{Preflight, Readiness, ReadyReason};
use quorumguard_telemetry::{DURATION_BUCKETS, Metrics};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    namespace: String,
    cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabels {
    namespace: String,
    cluster: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KcpLabels {
    namespace: String,
    kcp: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutLabels {
    namespace: String,
    kcp: String,
    verdict: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// How one KCP's publication ended, as counted in `status_writes_total{result}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteResult {
    /// The conditions were written.
    Written,
    /// Read, and nothing differed: no write.
    Unchanged,
    /// A write answered 409 Conflict (retried from a fresh read).
    Conflict,
    /// Reading or writing failed otherwise.
    Error,
    /// 32 conditions already: ours would not fit.
    NoRoom,
}

impl WriteResult {
    const ALL: [WriteResult; 5] = [
        WriteResult::Written,
        WriteResult::Unchanged,
        WriteResult::Conflict,
        WriteResult::Error,
        WriteResult::NoRoom,
    ];

    fn as_str(self) -> &'static str {
        match self {
            WriteResult::Written => "written",
            WriteResult::Unchanged => "unchanged",
            WriteResult::Conflict => "conflict",
            WriteResult::Error => "error",
            WriteResult::NoRoom => "no_room",
        }
    }
}

/// One cluster's figures after a sweep.
#[derive(Clone, Debug)]
pub struct ClusterFigures {
    pub namespace: String,
    pub cluster: String,
    /// How long its probe took (`None`: not probed this sweep).
    pub probe_duration: Option<Duration>,
    /// Whether the latest probe failed.
    pub probe_failed: bool,
    /// Voting members by health, and learners; `None` when the member list is unknown.
    pub tally: Option<Tally>,
    pub learners: usize,
}

/// The `verdict` label of `rollout_ready`: what [`quorumguard_engine::rollout::preflight`] predicts for
/// the rollout a `spec.version` change would start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RolloutVerdict {
    Ready,
    WouldStick,
    Unsafe,
    CannotJudge,
}

impl RolloutVerdict {
    pub const ALL: [RolloutVerdict; 4] = [
        RolloutVerdict::Ready,
        RolloutVerdict::WouldStick,
        RolloutVerdict::Unsafe,
        RolloutVerdict::CannotJudge,
    ];

    pub fn of(readiness: &Readiness) -> Self {
        match readiness {
            Readiness::Ready => RolloutVerdict::Ready,
            Readiness::WouldStick { .. } => RolloutVerdict::WouldStick,
            Readiness::Unsafe { .. } => RolloutVerdict::Unsafe,
            Readiness::CannotJudge => RolloutVerdict::CannotJudge,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RolloutVerdict::Ready => "ready",
            RolloutVerdict::WouldStick => "would_stick",
            RolloutVerdict::Unsafe => "unsafe",
            RolloutVerdict::CannotJudge => "cannot_judge",
        }
    }
}

/// One KCP's rollout prediction after a sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutFigures {
    pub namespace: String,
    pub kcp: String,
    pub verdict: RolloutVerdict,
    pub reason: ReadyReason,
    /// For `would_stick` and `unsafe`: the step (1-based) and the steps in all.
    pub step: Option<(usize, usize)>,
}

impl RolloutFigures {
    pub fn of(namespace: String, kcp: String, p: &Preflight) -> Self {
        let step = match p.readiness {
            Readiness::WouldStick { at, of } | Readiness::Unsafe { at, of } => Some((at, of)),
            Readiness::Ready | Readiness::CannotJudge => None,
        };
        RolloutFigures {
            namespace,
            kcp,
            verdict: RolloutVerdict::of(&p.readiness),
            reason: p.reason,
            step,
        }
    }
}

/// The enricher's metric families.
#[derive(Debug)]
pub struct EnricherMetrics {
    probe_duration: Family<ClusterLabels, Gauge<f64, AtomicU64>>,
    probe_seconds: Histogram,
    sweep_seconds: Histogram,
    sweeps_started: Counter,
    publish_seconds: Histogram,
    probe_failures: Family<ClusterLabels, Counter>,
    members: Family<MemberLabels, Gauge>,
    margin: Family<ClusterLabels, Gauge>,
    unprobed: Family<ClusterLabels, Gauge>,
    writes: Family<ResultLabels, Counter>,
    leader: Gauge,
    transitions: Counter,
    seen: Mutex<BTreeSet<(String, String)>>,
    rollout_ready: Family<RolloutLabels, Gauge>,
    rollout_step: Family<KcpLabels, Gauge>,
    rollout_steps: Family<KcpLabels, Gauge>,
    rollout_seconds: Histogram,
    /// The labels of each KCP's `rollout_ready` series now: the one to remove when the
    /// prediction changes or the KCP goes.
    rollouts: Mutex<BTreeMap<(String, String), (RolloutVerdict, ReadyReason)>>,
}

/// Sweeps and publications of a whole fleet: 0.1 s to 2 min.
const CYCLE_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0];

const MEMBER_STATES: [&str; 4] = ["healthy", "unhealthy", "unknown", "learner"];

/// A family as `/metrics` describes it: its name (the registry adds the `quorumguard_` prefix,
/// the unit's suffix, and `_total` to a counter), its help text and its unit.
struct Described {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
}

/// Registers `metric` in `reg` as `described` says.
fn add(reg: &mut Registry, described: &Described, metric: impl Metric) {
    match &described.unit {
        Some(unit) => reg.register_with_unit(described.name, described.help, unit.clone(), metric),
        None => reg.register(described.name, described.help, metric),
    }
}

// The families, in the order they are registered.
const ETCD_PROBE_DURATION: Described = Described {
    name: "etcd_probe_duration",
    help: "Duration of the latest etcd probe of each workload cluster",
    unit: Some(Unit::Seconds),
};
const ETCD_PROBE: Described = Described {
    name: "etcd_probe",
    help: "Durations of etcd probes, all clusters",
    unit: Some(Unit::Seconds),
};
const SWEEP: Described = Described {
    name: "sweep",
    help: "Durations of whole sweeps (every cluster probed), each recorded once its \
          publication is over: a sweep near --probe-interval means the fleet outgrows it",
    unit: Some(Unit::Seconds),
};
const SWEEPS_STARTED: Described = Described {
    name: "sweeps_started",
    help: "Sweeps started: ahead of sweep_seconds' count while a sweep or its publication \
          runs",
    unit: None,
};
const STATUS_PUBLISH: Described = Described {
    name: "status_publish",
    help: "Durations of the KCP status publication that follows each sweep",
    unit: Some(Unit::Seconds),
};
const ETCD_PROBE_FAILURES: Described = Described {
    name: "etcd_probe_failures",
    help: "etcd probes that failed (no member list: CA Secret, endpoints, deadline)",
    unit: None,
};
const ETCD_MEMBERS: Described = Described {
    name: "etcd_members",
    help: "etcd members of each workload cluster by state (healthy, unhealthy, unknown \
          voting members; learners)",
    unit: None,
};
const ETCD_QUORUM_MARGIN: Described = Described {
    name: "etcd_quorum_margin",
    help: "Healthy voting members minus quorum: how many more may fail (negative: quorum \
          lost)",
    unit: None,
};
const STATUS_WRITES: Described = Described {
    name: "status_writes",
    help: "KCP status publications by result (written, unchanged, conflict, error, no_room)",
    unit: None,
};
const ETCD_UNPROBED: Described = Described {
    name: "etcd_unprobed",
    help: "1 for each workload cluster known at start that was not probed yet when readiness \
          stopped waiting for the first sweep (--first-sweep-timeout); gone once probed",
    unit: None,
};
const LEADER: Described = Described {
    name: "leader",
    help: "1 while this replica holds the Lease and writes KCP status, else 0",
    unit: None,
};
const LEADER_TRANSITIONS: Described = Described {
    name: "leader_transitions",
    help: "Times this replica took or lost the Lease",
    unit: None,
};
const ROLLOUT_READY: Described = Described {
    name: "rollout_ready",
    help: "1 for each KCP, labelled with what the rollout a spec.version change would start \
          is predicted to do after the latest sweep (verdict: ready, would_stick, unsafe, \
          cannot_judge) and why (reason); one series per KCP",
    unit: None,
};
const ROLLOUT_STEP: Described = Described {
    name: "rollout_step",
    help: "The step (1-based) of the predicted rollout at which it would stick \
          (would_stick) or one more member failure loses quorum (unsafe); no series \
          otherwise",
    unit: None,
};
const ROLLOUT_STEPS: Described = Described {
    name: "rollout_steps",
    help: "The steps of the predicted rollout in all, beside rollout_step",
    unit: None,
};
const ROLLOUT_PREDICTION: Described = Described {
    name: "rollout_prediction",
    help: "Durations of predicting the rollout of every KCP after a sweep",
    unit: Some(Unit::Seconds),
};

fn rollout_labels(key: &(String, String), (v, r): (RolloutVerdict, ReadyReason)) -> RolloutLabels {
    RolloutLabels {
        namespace: key.0.clone(),
        kcp: key.1.clone(),
        verdict: v.as_str(),
        reason: r.as_str(),
    }
}

impl EnricherMetrics {
    /// Registers the families in `metrics`' registry.
    pub fn register(metrics: &Metrics) -> Self {
        let m = EnricherMetrics {
            probe_duration: Family::default(),
            probe_seconds: Histogram::new(DURATION_BUCKETS),
            sweep_seconds: Histogram::new(CYCLE_BUCKETS),
            sweeps_started: Counter::default(),
            publish_seconds: Histogram::new(CYCLE_BUCKETS),
            probe_failures: Family::default(),
            members: Family::default(),
            margin: Family::default(),
            unprobed: Family::default(),
            writes: Family::default(),
            leader: Gauge::default(),
            transitions: Counter::default(),
            seen: Mutex::new(BTreeSet::new()),
            rollout_ready: Family::default(),
            rollout_step: Family::default(),
            rollout_steps: Family::default(),
            rollout_seconds: Histogram::new(DURATION_BUCKETS),
            rollouts: Mutex::new(BTreeMap::new()),
        };
        for r in WriteResult::ALL {
            let _ = m.writes.get_or_create(&ResultLabels { result: r.as_str() });
        }
        metrics.with_registry(|reg| {
            add(reg, &ETCD_PROBE_DURATION, m.probe_duration.clone());
            add(reg, &ETCD_PROBE, m.probe_seconds.clone());
            add(reg, &SWEEP, m.sweep_seconds.clone());
            add(reg, &SWEEPS_STARTED, m.sweeps_started.clone());
            add(reg, &STATUS_PUBLISH, m.publish_seconds.clone());
            add(reg, &ETCD_PROBE_FAILURES, m.probe_failures.clone());
            add(reg, &ETCD_MEMBERS, m.members.clone());
            add(reg, &ETCD_QUORUM_MARGIN, m.margin.clone());
            add(reg, &STATUS_WRITES, m.writes.clone());
            add(reg, &ETCD_UNPROBED, m.unprobed.clone());
            add(reg, &LEADER, m.leader.clone());
            add(reg, &LEADER_TRANSITIONS, m.transitions.clone());
            add(reg, &ROLLOUT_READY, m.rollout_ready.clone());
            add(reg, &ROLLOUT_STEP, m.rollout_step.clone());
            add(reg, &ROLLOUT_STEPS, m.rollout_steps.clone());
            add(reg, &ROLLOUT_PREDICTION, m.rollout_seconds.clone());
        });
        m
    }

    /// Marks the clusters readiness stopped waiting for (see `etcd_unprobed`).
    pub fn set_unprobed(&self, clusters: &[(String, String)]) {
        for (namespace, cluster) in clusters {
            self.unprobed
                .get_or_create(&ClusterLabels {
                    namespace: namespace.clone(),
                    cluster: cluster.clone(),
                })
                .set(1);
        }
    }

    /// Records that a sweep begins.
    pub fn sweep_started(&self) {
        self.sweeps_started.inc();
    }

    /// Records one enricher cycle: how long its sweep took and, when this replica publishes, its
    /// publication.
    pub fn observe_cycle(&self, sweep: Duration, publish: Option<Duration>) {
        self.sweep_seconds.observe(sweep.as_secs_f64());
        if let Some(p) = publish {
            self.publish_seconds.observe(p.as_secs_f64());
        }
    }

    /// Records the figures of every cluster after a sweep; clusters no longer present lose their
    /// series.
    pub fn observe_sweep(&self, figures: &[ClusterFigures]) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let now: BTreeSet<(String, String)> = figures
            .iter()
            .map(|f| (f.namespace.clone(), f.cluster.clone()))
            .collect();
        for (namespace, cluster) in seen.difference(&now) {
            let l = ClusterLabels {
                namespace: namespace.clone(),
                cluster: cluster.clone(),
            };
            self.probe_duration.remove(&l);
            self.probe_failures.remove(&l);
            self.margin.remove(&l);
            self.unprobed.remove(&l);
            for state in MEMBER_STATES {
                self.members.remove(&MemberLabels {
                    namespace: namespace.clone(),
                    cluster: cluster.clone(),
                    state,
                });
            }
        }
        *seen = now;
        drop(seen);
        for f in figures {
            let l = ClusterLabels {
                namespace: f.namespace.clone(),
                cluster: f.cluster.clone(),
            };
            if let Some(d) = f.probe_duration {
                self.probe_duration.get_or_create(&l).set(d.as_secs_f64());
                self.probe_seconds.observe(d.as_secs_f64());
            }
            if f.probe_failed || f.tally.is_some() {
                self.unprobed.remove(&l);
            }
            let failures = self.probe_failures.get_or_create(&l);
            if f.probe_failed {
                failures.inc();
            }
            let counts = match &f.tally {
                Some(t) => {
                    self.margin
                        .get_or_create(&l)
                        .set(t.healthy as i64 - quorum(t.voting()) as i64);
                    [t.healthy, t.unhealthy, t.unknown, f.learners]
                }
                None => {
                    self.margin.remove(&l);
                    [0, 0, 0, 0]
                }
            };
            for (state, n) in MEMBER_STATES.into_iter().zip(counts) {
                self.members
                    .get_or_create(&MemberLabels {
                        namespace: f.namespace.clone(),
                        cluster: f.cluster.clone(),
                        state,
                    })
                    .set(n as i64);
            }
        }
    }

    /// Records the rollout prediction of every KCP after a sweep (`took`: how long predicting
    /// them all took). Each KCP keeps exactly one `rollout_ready` series: the one of its latest
    /// prediction; KCPs not in `figures` lose theirs.
    pub fn observe_rollouts(&self, figures: &[RolloutFigures], took: Duration) {
        self.rollout_seconds.observe(took.as_secs_f64());
        let mut shown = self.rollouts.lock().unwrap_or_else(|e| e.into_inner());
        let mut now = BTreeMap::new();
        for f in figures {
            let key = (f.namespace.clone(), f.kcp.clone());
            let labels = (f.verdict, f.reason);
            if let Some(old) = shown.remove(&key)
                && old != labels
            {
                self.rollout_ready.remove(&rollout_labels(&key, old));
            }
            self.rollout_ready
                .get_or_create(&rollout_labels(&key, labels))
                .set(1);
            self.set_rollout_step(&key, f.step);
            now.insert(key, labels);
        }
        // What is left was not predicted this time: the KCP is gone.
        for (key, labels) in std::mem::replace(&mut *shown, now) {
            self.rollout_ready.remove(&rollout_labels(&key, labels));
            self.set_rollout_step(&key, None);
        }
    }

    /// `rollout_step` and `rollout_steps` of KCP `key`: set to `step`, or removed.
    fn set_rollout_step(&self, key: &(String, String), step: Option<(usize, usize)>) {
        let kcp = KcpLabels {
            namespace: key.0.clone(),
            kcp: key.1.clone(),
        };
        match step {
            Some((at, of)) => {
                self.rollout_step.get_or_create(&kcp).set(at as i64);
                self.rollout_steps.get_or_create(&kcp).set(of as i64);
            }
            None => {
                self.rollout_step.remove(&kcp);
                self.rollout_steps.remove(&kcp);
            }
        }
    }

    /// Counts one publication outcome.
    pub fn write(&self, r: WriteResult) {
        self.writes
            .get_or_create(&ResultLabels { result: r.as_str() })
            .inc();
    }

    /// Records this replica taking (`true`) or losing the Lease.
    pub fn set_leader(&self, leader: bool) {
        if self.leader.set(i64::from(leader)) != i64::from(leader) {
            self.transitions.inc();
        }
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
