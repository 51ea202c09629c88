//! The status enricher's loop ([`enrich`]): sweep, snapshot every KCP, record metrics, publish
//! when leading, wait; and the figures of every probed cluster the metrics are made of
//! ([`figures`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;

use super::snapshot::snapshots_yielding;
use super::{Publisher, Summary};
use crate::metrics::{ClusterFigures, EnricherMetrics};
use quorumguard_engine::quorum::Tally;
use quorumguard_engine::{EtcdState, Policy};
use quorumguard_observe::etcd::sweep::{Probers, SweepConfig, sweep_once};
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

/// Sweeps that a Machine change triggers start at most this often.
const MIN_GAP: Duration = Duration::from_secs(1);

/// The status enricher: sweep, record metrics, publish (when leading), wait for the interval, a
/// Machine appearing or going, or a change of leadership; forever. `first_sweep` is told when
/// the first sweep after the caches synced is done (readiness waits for it). `probers` are
/// shared with the webhook's fresh probes ([`quorumguard_observe::etcd::fresh`]). After each sweep every KCP is
/// snapshotted once ([`super::Snapshot`]) under `policy` (the webhook's): its rollout
/// prediction for `quorumguard_rollout_ready`, its fingerprint and its conditions are read from
/// that one snapshot.
#[allow(clippy::too_many_arguments)]
pub async fn enrich(
    client: Client,
    state: Arc<ClusterState>,
    sweep: SweepConfig,
    policy: Policy,
    publisher: Option<Arc<Publisher>>,
    metrics: Arc<EnricherMetrics>,
    probers: Arc<Probers>,
    mut first_sweep: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let mut leadership = publisher.as_ref().map(|p| p.leadership().subscribe());
    loop {
        let started = Instant::now();
        // Sweep and publish only once every cache has synced. Before that, a KCP seen before its
        // Cluster would be probed without the Cluster's endpoints annotation (a failed probe),
        // and a KCP not probed yet would be published as ProbeFailed ("no etcd probe of this
        // cluster yet"): after a restart, that replaced the truth the KCP showed with the
        // guard's own ignorance for a probe interval (tests/it/crash_safety.rs saw it).
        let synced = state.all_synced();
        if synced {
            metrics.sweep_started();
            sweep_once(&client, &state, &sweep, &probers).await;
            if let Some(done) = first_sweep.take() {
                let _ = done.send(());
            }
        }
        let swept = started.elapsed();
        metrics.observe_sweep(&figures(&state));
        let mut snapshots = Vec::new();
        if synced {
            let predicting = Instant::now();
            snapshots = snapshots_yielding(&state, &policy, quorumguard_observe::unix_now()).await;
            let predicted: Vec<_> = snapshots.iter().map(|s| s.rollout.clone()).collect();
            metrics.observe_rollouts(&predicted, predicting.elapsed());
        }
        let mut published = None;
        if let Some(p) = &publisher {
            metrics.set_leader(p.leadership().is_leader());
            let s = if synced {
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
        if synced {
            metrics.observe_cycle(swept, published);
            release_freed_memory();
        }
        let rest = sweep.interval.saturating_sub(started.elapsed());
        let woke = {
            let leader_changed = async {
                match leadership.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(rest) => Wake::Timer,
                _ = state.machines_changed().notified() => Wake::Machines,
                ok = leader_changed => if ok { Wake::Leadership } else { Wake::ElectorGone },
            }
        };
        match woke {
            Wake::Timer => {}
            // Never later than the timer would have swept: with a probe interval under
            // MIN_GAP, a Machine change (the caches' first sync after a restart among them)
            // used to hold the next sweep back to MIN_GAP.
            Wake::Machines => {
                let gap = MIN_GAP.min(sweep.interval);
                tokio::time::sleep(gap.saturating_sub(started.elapsed())).await;
            }
            // Taking over: publish at once (the next round snapshots everything again);
            // losing: the next round skips publishing and updates the metric.
            Wake::Leadership => {}
            Wake::ElectorGone => leadership = None,
        }
    }
}

enum Wake {
    Timer,
    Machines,
    Leadership,
    ElectorGone,
}
