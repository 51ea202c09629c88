//! Fresh probes for the webhook: an allow that rests on etcd health rests on answers etcd gave
//! after the request arrived.
//!
//! When the engine, on the cached record, allows an operation whose safety depends on etcd (a
//! deletion of a Machine that holds a voting member, a replica change) and so answers
//! [`Answer::ConfirmOnFreshProbe`](quorumguard_engine::Answer::ConfirmOnFreshProbe), the webhook
//! asks [`FreshProbes::probe`] for the cluster's etcd as it is now and judges again on it
//! ([`quorumguard_engine::fresh_view`]). What this module guarantees:
//!
//! - **Fresh**: a review is only ever given a probe that started after the review arrived (or one
//!   that had not started yet when the review joined it).
//! - **Single-flight**: reviews of the same cluster share probes. A review joins the newest
//!   probe that has not started yet or started after it arrived; otherwise it starts one. A new
//!   probe starts after the reviews already queued on the runtime have had their turn to join
//!   it (one yield), and, while another probe of the cluster is under way, no sooner than
//!   [`MIN_GAP`] after that one started: the reviews that arrive meanwhile share it, so a storm
//!   of reviews costs etcd at most one probe per [`MIN_GAP`] per cluster, and a review that
//!   comes alone does not wait.
//! - **Bounded**: a review waits at most [`SweepConfig::fresh_timeout`] from its arrival; the probe's
//!   own deadline is three quarters of that, so a member that does not answer is reported as
//!   such ("no answer within ...") before the review stops waiting. A review that stops waiting
//!   gets [`Fresh::TimedOut`], and the webhook decides as for unknown health: never on the
//!   cached record.
//! - **Recorded**: every fresh probe that succeeds is recorded like a sweep's
//!   ([`ClusterState::observe_probe`]: what is *published* keeps the confirmation rule), so a
//!   thawed member is seen by the next review, not only after the next sweep. A probe that fails
//!   is not recorded: the sweep's own probes, with their own deadline, say whether the cluster is
//!   unreachable.
//!
//! Probes run in tasks of their own, so a review that stops waiting never leaves a probe half
//! done, and they use the sweep's kept probers ([`Probers`]), so a fresh probe reuses the
//! enricher's etcd connections.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Client;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{counter::Counter, family::Family};
use tokio::sync::watch;

use super::sweep::{Probers, SweepConfig, probe_cluster};
use crate::state::{ClusterState, Key, ProbeTarget};
use quorumguard_engine::Member;
use quorumguard_telemetry::Metrics;

/// The least time between the starts of two fresh probes of one cluster that overlap.
pub const MIN_GAP: Duration = Duration::from_millis(50);

/// The deadline of one fresh probe for a review that waits `timeout`: three quarters of it,
/// so that a member that does not answer is known as such before the review stops waiting.
pub fn probe_deadline(timeout: Duration) -> Duration {
    timeout * 3 / 4
}

/// When a flight that is ready to start at `now` starts: `None` at once, `Some(at)` later.
///
/// While another probe of the cluster is under way (`overlapping`), no sooner than [`MIN_GAP`]
/// after the latest start (`last_start`): a storm of reviews is paced. Otherwise at once: a
/// review that comes alone does not wait. "At once" is not a sleep until `now`: tokio's timer
/// rounds a deadline up to its next millisecond tick and fires it when a worker next turns its
/// clock, which cost every lone fresh probe about a millisecond (`cargo bench --bench
/// fresh_probe`: added p50 5.55 against 4.49 ms direct, docs/benchmarks.md).
fn paced_start(last_start: Option<Instant>, overlapping: bool, now: Instant) -> Option<Instant> {
    match last_start {
        Some(last) if overlapping => Some(last + MIN_GAP).filter(|&at| at > now),
        _ => None,
    }
}

/// What a fresh probe gave a review.
#[derive(Clone, Debug)]
pub enum Fresh {
    /// The members as the probe saw them (before [`quorumguard_engine::fresh_view`]).
    Members(Vec<Member>),
    /// The probe failed (no member list): why.
    Failed(String),
    /// No answer within the review's wait.
    TimedOut(Duration),
}

type Answer = Arc<Result<Vec<Member>, String>>;

/// One probe of one cluster, shared by the reviews that wait on it.
struct Flight {
    id: u64,
    /// When it started asking etcd; `None` while it waits for its turn.
    started: Option<Instant>,
    answer: watch::Receiver<Option<Answer>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// One cluster's probes, and when the latest of them starts (for [`MIN_GAP`]: only read while
/// another of them is under way, so it may go when the last one ends).
#[derive(Default)]
struct Slot {
    flights: Vec<Flight>,
    last_start: Option<Instant>,
}

/// The fresh probes of every cluster, and who waits on them.
pub struct FreshProbes {
    client: Client,
    state: Arc<ClusterState>,
    probers: Arc<Probers>,
    /// The sweep's settings (transport, how long Secrets are trusted, the confirmation rule a
    /// recorded probe is judged by) with the fresh probe's deadline.
    sweep: SweepConfig,
    /// The longest a review waits.
    timeout: Duration,
    /// The probes of each cluster under way or waiting to start; a cluster's entry goes with its
    /// last probe.
    flights: Mutex<HashMap<Key, Slot>>,
    next_id: AtomicU64,
    probes: Family<ResultLabels, Counter>,
    waits: Family<ResultLabels, Counter>,
}

impl FreshProbes {
    /// Fresh probes through `probers` (the enricher's), recorded in `state`; their metrics are
    /// registered in `metrics`: `quorumguard_fresh_probes_total{result}` (probes made: ok,
    /// failed) and `quorumguard_fresh_probe_waits_total{result}` (reviews that waited: started,
    /// joined, timeout).
    pub fn new(
        client: Client,
        state: Arc<ClusterState>,
        probers: Arc<Probers>,
        sweep: &SweepConfig,
        metrics: &Metrics,
    ) -> Self {
        let probes = Family::<ResultLabels, Counter>::default();
        let waits = Family::<ResultLabels, Counter>::default();
        metrics.with_registry(|r| {
            r.register(
                "fresh_probes",
                "Fresh etcd probes made for admission reviews, by result (ok, failed)",
                probes.clone(),
            );
            r.register(
                "fresh_probe_waits",
                "Admission reviews that waited for a fresh etcd probe: started one, joined one, \
                 or stopped waiting at --fresh-probe-timeout (timeout)",
                waits.clone(),
            );
        });
        for result in ["ok", "failed"] {
            let _ = probes.get_or_create(&ResultLabels { result });
        }
        for result in ["started", "joined", "timeout"] {
            let _ = waits.get_or_create(&ResultLabels { result });
        }
        let timeout = sweep.fresh_timeout;
        let mut sweep = sweep.clone();
        sweep.deadline = probe_deadline(timeout);
        FreshProbes {
            client,
            state,
            probers,
            sweep,
            timeout,
            flights: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            probes,
            waits,
        }
    }

    /// The longest a review waits.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How many fresh probes have been made, by result (`ok`, `failed`).
    pub fn probes_made(&self, result: &'static str) -> u64 {
        self.probes.get_or_create(&ResultLabels { result }).get()
    }

    /// etcd of cluster `target` as answered after `arrived`: joins a probe that qualifies or
    /// starts one, and waits for it until `arrived` + [`SweepConfig::fresh_timeout`].
    pub async fn probe(self: &Arc<Self>, target: ProbeTarget, arrived: Instant) -> Fresh {
        let (mut answer, started) = self.flight(target, arrived);
        self.count_wait(if started { "started" } else { "joined" });
        let until = arrived + self.timeout;
        let waited = tokio::time::timeout_at(
            until.into(),
            answer.wait_for(|a: &Option<Answer>| a.is_some()),
        )
        .await;
        let answer: Option<Answer> = match waited {
            Ok(Ok(a)) => (*a).clone(),
            Ok(Err(_)) => None,
            Err(_) => {
                self.count_wait("timeout");
                return Fresh::TimedOut(self.timeout);
            }
        };
        match answer.as_deref() {
            Some(Ok(members)) => Fresh::Members(members.clone()),
            Some(Err(e)) => Fresh::Failed(e.clone()),
            None => Fresh::Failed("the fresh probe ended without an answer".into()),
        }
    }

    /// Has cluster `target` probed afresh without waiting for it (after a denial that rests on
    /// etcd health, so that a recovery is seen by the next review): joins a probe that
    /// qualifies, else starts one.
    pub fn refresh(self: &Arc<Self>, target: ProbeTarget, arrived: Instant) {
        let _ = self.flight(target, arrived);
    }

    fn count_wait(&self, result: &'static str) {
        self.waits.get_or_create(&ResultLabels { result }).inc();
    }

    /// The flight a review arriving at `arrived` waits on, and whether it started it.
    fn flight(
        self: &Arc<Self>,
        target: ProbeTarget,
        arrived: Instant,
    ) -> (watch::Receiver<Option<Answer>>, bool) {
        let key = (target.namespace.clone(), target.cluster.clone());
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        let of_cluster = &mut flights.entry(key.clone()).or_default().flights;
        if let Some(f) = of_cluster
            .iter()
            .rev()
            .find(|f| f.started.is_none_or(|s| s >= arrived))
        {
            return (f.answer.clone(), false);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(None);
        of_cluster.push(Flight {
            id,
            started: None,
            answer: rx.clone(),
        });
        drop(flights);
        let me = self.clone();
        tokio::spawn(async move { me.fly(key, id, target, tx).await });
        (rx, true)
    }

    /// One flight: waits its turn, probes, records, answers, leaves.
    async fn fly(
        self: Arc<Self>,
        key: Key,
        id: u64,
        target: ProbeTarget,
        tx: watch::Sender<Option<Answer>>,
    ) {
        // Reviews that arrived with the one that started this flight are queued on the runtime
        // behind it: let them join before it starts.
        tokio::task::yield_now().await;
        let paced = {
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            let slot = flights.entry(key.clone()).or_default();
            let now = Instant::now();
            let overlapping = slot
                .flights
                .iter()
                .any(|f| f.id != id && f.started.is_some());
            let paced = paced_start(slot.last_start, overlapping, now);
            slot.last_start = Some(paced.unwrap_or(now));
            paced
        };
        if let Some(at) = paced {
            tokio::time::sleep_until(at.into()).await;
        }
        {
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(f) = flights
                .get_mut(&key)
                .and_then(|slot| slot.flights.iter_mut().find(|f| f.id == id))
            {
                f.started = Some(Instant::now());
            }
        }
        let result = probe_cluster(&self.client, &self.probers, &target, &self.sweep).await;
        let answer = match result {
            Ok(p) => {
                self.probes
                    .get_or_create(&ResultLabels { result: "ok" })
                    .inc();
                self.state.observe_probe(
                    &target.namespace,
                    &target.cluster,
                    p.members.clone(),
                    Instant::now(),
                    &self.sweep.confirmation,
                );
                Ok(p.members)
            }
            Err(e) => {
                self.probes
                    .get_or_create(&ResultLabels { result: "failed" })
                    .inc();
                tracing::info!(
                    namespace = %target.namespace, cluster = %target.cluster, error = %e,
                    "fresh etcd probe for an admission review failed"
                );
                Err(e)
            }
        };
        let _ = tx.send(Some(Arc::new(answer)));
        let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = flights.get_mut(&key) {
            slot.flights.retain(|f| f.id != id);
            if slot.flights.is_empty() {
                flights.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_probe_starts_at_once_without_a_timer() {
        let now = Instant::now();
        assert_eq!(paced_start(None, false, now), None);
        // A probe of this cluster ended: its start no longer paces the next one.
        assert_eq!(paced_start(Some(now), false, now), None);
    }

    #[test]
    fn a_probe_beside_another_starts_min_gap_after_it() {
        let now = Instant::now();
        let last = now - Duration::from_millis(10);
        assert_eq!(paced_start(Some(last), true, now), Some(last + MIN_GAP));
        // The gap has passed already: at once, not a sleep until a moment gone by.
        let long_ago = now - MIN_GAP * 2;
        assert_eq!(paced_start(Some(long_ago), true, now), None);
        assert_eq!(paced_start(Some(now - MIN_GAP), true, now), None);
    }
}
