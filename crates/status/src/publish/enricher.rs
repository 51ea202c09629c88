//! The status enricher ([`enrich`]): after each sweep of the replica's [`Cycle`], snapshot every
//! KCP, record metrics, publish when leading; and the figures of every probed cluster the metrics are made of
//! ([`figures`]).

use std::sync::Arc;
use std::time::Instant;

use kube::Client;

use super::snapshot::{Snapshot, snapshots_yielding};
use super::{Publisher, Summary};
use crate::metrics::{ClusterFigures, EnricherMetrics};
use quorumguard_engine::quorum::Tally;
use quorumguard_engine::{EtcdState, Policy};
use quorumguard_observe::etcd::cycle::{AfterSweep, Cycle, Round};
use quorumguard_observe::etcd::sweep::{Probers, SweepConfig};
use quorumguard_observe::state::ClusterState;

/// The figures of every probed cluster, for the metrics.
pub fn figures(state: &ClusterState) -> Vec<ClusterFigures> {
    let now = Instant::now();
    state
        .probe_targets()
        .into_iter()
        .map(|t| {
            let probe_failed = state.probe_error(&t.namespace, &t.cluster).is_some();
            let (tally, learners) = match state.control_plane(&t.namespace, &t.kcp, now) {
                Ok(cp) => match &cp.etcd {
                    EtcdState::Observed(s) if !probe_failed => (
                        Some(Tally::of(&s.members, false)),
                        s.members.iter().filter(|m| m.is_learner).count(),
                    ),
                    _ => (None, 0),
                },
                Err(_) => (None, 0),
            };
            ClusterFigures {
                probe_duration: state.probe_duration(&t.namespace, &t.cluster),
                namespace: t.namespace,
                cluster: t.cluster,
                probe_failed,
                tally,
                learners,
            }
        })
        .collect()
}

/// Hands the pages of memory freed during a cycle back to the OS.
///
/// A cycle allocates and frees a lot in bursts (TLS handshakes and client certificates for new
/// clusters, the status documents of every KCP it publishes); glibc keeps those pages in its
/// arenas, so the guard's RSS stayed at the first cycle's peak. `malloc_trim` returns the free
/// pages (madvise), which the scale bench shows as RSS at rest; it costs about a millisecond
/// per cycle.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only releases memory malloc holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Work done after a sweep's snapshots are taken and before they are published, on the replica
/// that writes status only (the Lease holder): the autopilot's turns. It may change what is
/// published (a dry run's words in the next action).
#[allow(async_fn_in_trait)] // used generically inside the workspace, never as `dyn` or Send-bounded
pub trait BeforePublish {
    async fn before_publish(&mut self, state: &ClusterState, snapshots: &mut [Snapshot]);
}

/// Nothing between the snapshots and their publication.
impl BeforePublish for () {
    async fn before_publish(&mut self, _: &ClusterState, _: &mut [Snapshot]) {}
}

/// The hook when there is one.
impl<H: BeforePublish> BeforePublish for Option<H> {
    async fn before_publish(&mut self, state: &ClusterState, snapshots: &mut [Snapshot]) {
        if let Some(h) = self {
            h.before_publish(state, snapshots).await;
        }
    }
}

/// The status enricher: the replica's sweep loop ([`Cycle`], which owns the schedule) with,
/// after each sweep, the metrics and, when leading, the publication; a change of leadership
/// starts the next round at once. `first_sweep` is told when the first sweep after the caches
/// synced is done (readiness waits for it). `probers` are shared with the webhook's fresh probes
/// ([`quorumguard_observe::etcd::fresh`]). After each sweep every KCP is snapshotted once
/// ([`super::Snapshot`]) under `policy` (the webhook's): its rollout prediction for
/// `quorumguard_rollout_ready`, its fingerprint and its conditions are read from that one
/// snapshot. `hook` runs between the snapshots and their publication while this replica writes
/// status ([`BeforePublish`]).
#[allow(clippy::too_many_arguments)]
pub async fn enrich<H: BeforePublish>(
    client: Client,
    state: Arc<ClusterState>,
    sweep: SweepConfig,
    policy: Policy,
    publisher: Option<Arc<Publisher>>,
    metrics: Arc<EnricherMetrics>,
    probers: Arc<Probers>,
    first_sweep: Option<tokio::sync::oneshot::Sender<()>>,
    hook: H,
) {
    let leadership = publisher.as_ref().map(|p| p.leadership().subscribe());
    let cycle = Cycle {
        client,
        state,
        sweep,
        probers,
        first_sweep,
    };
    cycle
        .run(Enricher {
            policy,
            publisher,
            metrics,
            leadership,
            hook,
        })
        .await;
}

/// What the enricher does after each sweep of the [`Cycle`].
struct Enricher<H> {
    policy: Policy,
    publisher: Option<Arc<Publisher>>,
    metrics: Arc<EnricherMetrics>,
    /// The Lease's leadership, while its elector runs.
    leadership: Option<tokio::sync::watch::Receiver<bool>>,
    hook: H,
}

impl<H: BeforePublish> AfterSweep for Enricher<H> {
    fn sweep_starting(&mut self) {
        self.metrics.sweep_started();
    }

    async fn after(&mut self, state: &ClusterState, round: Round) {
        let metrics = &self.metrics;
        metrics.observe_sweep(&figures(state));
        let mut snapshots = Vec::new();
        if round.synced {
            let predicting = Instant::now();
            snapshots =
                snapshots_yielding(state, &self.policy, quorumguard_observe::unix_now()).await;
            let predicted: Vec<_> = snapshots.iter().map(|s| s.rollout.clone()).collect();
            metrics.observe_rollouts(&predicted, predicting.elapsed());
        }
        let mut published = None;
        if let Some(p) = &self.publisher {
            metrics.set_leader(p.leadership().is_leader());
            let s = if round.synced {
                if p.leadership().is_leader() {
                    self.hook.before_publish(state, &mut snapshots).await;
                }
                let publish_started = Instant::now();
                let s = p.publish_all(&snapshots).await;
                published = Some(publish_started.elapsed());
                s
            } else {
                Summary::default()
            };
            if s != Summary::default() {
                tracing::debug!(
                    written = s.written,
                    unchanged = s.unchanged,
                    conflicts = s.conflicts,
                    errors = s.errors,
                    "published KCP status"
                );
            }
        }
        drop(snapshots);
        if round.synced {
            metrics.observe_cycle(round.swept, published);
            release_freed_memory();
        }
    }

    /// Taking over: publish at once (the next round snapshots everything again); losing: the
    /// next round skips publishing and updates the metric. When the elector is gone, never
    /// again.
    async fn woken(&mut self) {
        match self.leadership.as_mut() {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    self.leadership = None;
                }
            }
            None => std::future::pending().await,
        }
    }
}
