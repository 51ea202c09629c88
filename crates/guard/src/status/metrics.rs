//! The status enricher's metrics, registered in the server's [`Metrics`] registry (so they share
//! the `quorumguard_` prefix and `/metrics`).
//!
//! Per-cluster series are removed when the cluster goes, so 1,000 clusters coming and going do
//! not leave stale series behind.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Unit;

use crate::engine::quorum::{Tally, quorum};
use crate::telemetry::{DURATION_BUCKETS, Metrics};

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
}

/// Sweeps and publications of a whole fleet: 0.1 s to 2 min.
const CYCLE_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0];

const MEMBER_STATES: [&str; 4] = ["healthy", "unhealthy", "unknown", "learner"];

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
        };
        for r in WriteResult::ALL {
            let _ = m.writes.get_or_create(&ResultLabels { result: r.as_str() });
        }
        metrics.with_registry(|reg| {
            reg.register_with_unit(
                "etcd_probe_duration",
                "Duration of the latest etcd probe of each workload cluster",
                Unit::Seconds,
                m.probe_duration.clone(),
            );
            reg.register_with_unit(
                "etcd_probe",
                "Durations of etcd probes, all clusters",
                Unit::Seconds,
                m.probe_seconds.clone(),
            );
            reg.register_with_unit(
                "sweep",
                "Durations of whole sweeps (every cluster probed), each recorded once its \
                 publication is over: a sweep near --probe-interval means the fleet outgrows it",
                Unit::Seconds,
                m.sweep_seconds.clone(),
            );
            reg.register(
                "sweeps_started",
                "Sweeps started: ahead of sweep_seconds' count while a sweep or its publication \
                 runs",
                m.sweeps_started.clone(),
            );
            reg.register_with_unit(
                "status_publish",
                "Durations of the KCP status publication that follows each sweep",
                Unit::Seconds,
                m.publish_seconds.clone(),
            );
            reg.register(
                "etcd_probe_failures",
                "etcd probes that failed (no member list: CA Secret, endpoints, deadline)",
                m.probe_failures.clone(),
            );
            reg.register(
                "etcd_members",
                "etcd members of each workload cluster by state (healthy, unhealthy, unknown \
                 voting members; learners)",
                m.members.clone(),
            );
            reg.register(
                "etcd_quorum_margin",
                "Healthy voting members minus quorum: how many more may fail (negative: quorum \
                 lost)",
                m.margin.clone(),
            );
            reg.register(
                "status_writes",
                "KCP status publications by result (written, unchanged, conflict, error, no_room)",
                m.writes.clone(),
            );
            reg.register(
                "etcd_unprobed",
                "1 for each workload cluster known at start that was not probed yet when readiness \
                 stopped waiting for the first sweep (--first-sweep-timeout); gone once probed",
                m.unprobed.clone(),
            );
            reg.register(
                "leader",
                "1 while this replica holds the Lease and writes KCP status, else 0",
                m.leader.clone(),
            );
            reg.register(
                "leader_transitions",
                "Times this replica took or lost the Lease",
                m.transitions.clone(),
            );
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
