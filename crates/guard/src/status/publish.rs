//! The status writer: puts the two quorumguard conditions into each KCP's `status.conditions`.
//!
//! Optimistic concurrency, as every Kubernetes controller: read the KCP, change only our two
//! conditions ([`merge`]), write the status subresource with the read `resourceVersion`, and on
//! 409 Conflict start again from a fresh read. Nothing else in the status is touched, and nothing
//! is written when nothing changed.
//!
//! Two things keep the API server quiet in a steady state (the goal: zero requests per KCP per
//! sweep when nothing happens):
//! - the member table carries each member's raft index and DB size, which move on every probe.
//!   Those alone never cause a write: the writer remembers a fingerprint of what it last wrote
//!   *without* them and re-publishes them only every `refresh` (default 5 min);
//! - when the fingerprint is unchanged and younger than `refresh`, the KCP is not even read.
//!
//! Only the holder of the Lease writes ([`Leadership`]); the check is made right before each
//! write, and each write is bounded by the end of leadership. A replica taking over forgets its
//! fingerprints, so it reads and re-publishes every KCP.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};

use super::conditions::{conditions, lacks_room, merge};
use super::metrics::{ClusterFigures, EnricherMetrics, WriteResult};
use crate::engine::quorum::Tally;
use crate::engine::{ControlPlane, EtcdState, Policy};
use crate::etcd::sweep::{Probers, SweepConfig, sweep_once};
use crate::lease::Leadership;
use crate::state::{ClusterState, Key, Kind, Lookup, watch::api_resource};

/// How the writer behaves.
#[derive(Clone, Debug)]
pub struct PublishConfig {
    /// Re-publish volatile figures (raft index, DB size) at most this often when nothing else
    /// changed.
    pub refresh: Duration,
    /// Reads and writes per KCP per round before giving up on conflicts.
    pub max_attempts: usize,
    /// Deadline of one read or write.
    pub request_timeout: Duration,
    /// KCPs published at once.
    pub concurrency: usize,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            refresh: Duration::from_secs(300),
            max_attempts: 5,
            request_timeout: Duration::from_secs(10),
            concurrency: 8,
        }
    }
}

/// Why one KCP's conditions could not be published this round.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("reading KubeadmControlPlane {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "writing the status of KubeadmControlPlane {namespace}/{name}: {source}; the conditions \
         are published again after the next sweep"
    )]
    Write {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "KubeadmControlPlane {namespace}/{name}: status.conditions is not a list of conditions \
         ({reason}); quorumguard writes nothing rather than overwrite it"
    )]
    Unreadable {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error(
        "KubeadmControlPlane {namespace}/{name}: {attempts} writes in a row answered 409 \
         Conflict; the next sweep tries again"
    )]
    Conflicts {
        namespace: String,
        name: String,
        attempts: usize,
    },
    #[error("KubeadmControlPlane {namespace}/{name}: no answer within {after:?}")]
    Timeout {
        namespace: String,
        name: String,
        after: Duration,
    },
}

/// How one KCP's publication ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Written, after this many attempts (more than one: conflicts).
    Written { attempts: usize },
    /// Read and compared, or known to match: nothing written.
    Unchanged,
    /// This replica does not hold the Lease (or lost it before writing).
    NotLeader,
    /// The caches have not synced, the KCP is gone, or its etcd has not been probed yet.
    NotReady,
    /// 32 conditions already and ours are not among them.
    NoRoom,
}

/// What one round did, in counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub written: usize,
    pub unchanged: usize,
    pub skipped: usize,
    pub conflicts: usize,
    pub errors: usize,
}

/// What the writer last wrote (or found in place) for one KCP.
#[derive(Clone, Copy, Debug)]
struct Written {
    fingerprint: u64,
    at: Instant,
}

/// Publishes conditions for every KCP in the caches. One per process.
pub struct Publisher {
    client: Client,
    state: Arc<ClusterState>,
    policy: Policy,
    leadership: Leadership,
    cfg: PublishConfig,
    metrics: Arc<EnricherMetrics>,
    written: Mutex<HashMap<Key, Written>>,
    /// Whether the previous round ran as leader: a round that finds it newly leading forgets.
    was_leader: AtomicBool,
}

impl Publisher {
    pub fn new(
        client: Client,
        state: Arc<ClusterState>,
        policy: Policy,
        leadership: Leadership,
        cfg: PublishConfig,
        metrics: Arc<EnricherMetrics>,
    ) -> Self {
        Publisher {
            client,
            state,
            policy,
            leadership,
            cfg,
            metrics,
            written: Mutex::new(HashMap::new()),
            was_leader: AtomicBool::new(false),
        }
    }

    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// Forgets what was written, so the next round reads and re-publishes every KCP (on taking
    /// the Lease: another replica's writes may differ from ours).
    fn forget(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Written>> {
        self.written.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, r: WriteResult) {
        self.metrics.write(r);
    }

    /// Publishes every KCP the caches hold, `concurrency` at a time.
    pub async fn publish_all(&self) -> Summary {
        if !self.leadership.is_leader() {
            self.was_leader.store(false, Ordering::Relaxed);
            return Summary::default();
        }
        if !self.was_leader.swap(true, Ordering::Relaxed) {
            // Just took over: what we remember from an earlier term may be outdated.
            self.forget();
        }
        let kcps = self.state.kcps();
        {
            // KCPs that are gone need no fingerprint.
            let mut w = self.lock();
            w.retain(|k, _| kcps.binary_search(k).is_ok());
        }
        let outcomes: Vec<_> = futures::stream::iter(kcps)
            .map(|(ns, name)| async move {
                let r = self.publish_one(&ns, &name).await;
                if let Err(e) = &r {
                    tracing::warn!(namespace = %ns, kcp = %name, error = %e, "publishing KCP status failed");
                }
                r
            })
            .buffer_unordered(self.cfg.concurrency.max(1))
            .collect()
            .await;
        let mut s = Summary::default();
        for o in outcomes {
            match o {
                Ok(Outcome::Written { attempts }) => {
                    s.written += 1;
                    s.conflicts += attempts - 1;
                }
                Ok(Outcome::Unchanged) => s.unchanged += 1,
                Ok(Outcome::NotLeader | Outcome::NotReady | Outcome::NoRoom) => s.skipped += 1,
                Err(PublishError::Conflicts { attempts, .. }) => {
                    s.conflicts += attempts;
                    s.errors += 1;
                }
                Err(_) => s.errors += 1,
            }
        }
        s
    }

    /// Publishes one KCP's conditions, if this replica leads and something changed.
    pub async fn publish_one(&self, namespace: &str, name: &str) -> Result<Outcome, PublishError> {
        if !self.leadership.is_leader() {
            return Ok(Outcome::NotLeader);
        }
        let key = (namespace.to_string(), name.to_string());
        let cp = match self.state.control_plane(namespace, name, Instant::now()) {
            Ok(cp) => cp,
            Err(Lookup::NotSynced | Lookup::NoSuchKcp) => return Ok(Outcome::NotReady),
        };
        if self.state.awaits_first_probe(namespace, name) {
            // Not probed yet is not a failure: publish after the first probe, not ProbeFailed.
            return Ok(Outcome::NotReady);
        }
        let probe_error = self.state.probe_error(namespace, &cp.cluster.name);
        let generation = self.state.kcp_generation(namespace, name);
        let now_unix = crate::unix_now();
        let fingerprint = fingerprint(
            &cp,
            &self.policy,
            generation,
            probe_error.as_deref(),
            now_unix,
        );
        if let Some(w) = self.lock().get(&key)
            && w.fingerprint == fingerprint
            && w.at.elapsed() < self.cfg.refresh
        {
            self.count(WriteResult::Unchanged);
            return Ok(Outcome::Unchanged);
        }
        let new = conditions(
            &cp,
            &self.policy,
            now_unix,
            generation,
            probe_error.as_deref(),
        );
        let result = self
            .write(namespace, name, new, now_unix, fingerprint)
            .await;
        if result.is_err() {
            self.count(WriteResult::Error);
        }
        result
    }

    /// Read, merge, write; again from a fresh read on 409 Conflict.
    async fn write(
        &self,
        namespace: &str,
        name: &str,
        new: [Condition; 2],
        now_unix: i64,
        fingerprint: u64,
    ) -> Result<Outcome, PublishError> {
        let key = (namespace.to_string(), name.to_string());
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &api_resource(Kind::Kcp));
        for attempt in 1..=self.cfg.max_attempts.max(1) {
            let mut kcp = self
                .bounded(namespace, name, api.get_status(name))
                .await?
                .map_err(|source| PublishError::Read {
                    namespace: namespace.into(),
                    name: name.into(),
                    source,
                })?;
            let existing =
                existing_conditions(&kcp.data).map_err(|reason| PublishError::Unreadable {
                    namespace: namespace.into(),
                    name: name.into(),
                    reason,
                })?;
            let Some(merged) = merge(&existing, new.clone(), now_unix) else {
                if lacks_room(&existing, &new) {
                    tracing::warn!(
                        namespace,
                        kcp = name,
                        "status.conditions already holds 32 items: quorumguard's conditions do not fit and are not published"
                    );
                    self.count(WriteResult::NoRoom);
                    return Ok(Outcome::NoRoom);
                }
                self.remember(key, fingerprint);
                self.count(WriteResult::Unchanged);
                return Ok(Outcome::Unchanged);
            };
            set_conditions(&mut kcp.data, &merged);
            let Some(until) = self.leadership.until().filter(|u| Instant::now() < *u) else {
                return Ok(Outcome::NotLeader);
            };
            // The write may not outlive leadership: past `until` another replica may lead.
            let budget = until
                .saturating_duration_since(Instant::now())
                .min(self.cfg.request_timeout);
            let pp = PostParams::default();
            let write = api.replace_status(name, &pp, &kcp);
            let written =
                tokio::time::timeout(budget, write)
                    .await
                    .map_err(|_| PublishError::Timeout {
                        namespace: namespace.into(),
                        name: name.into(),
                        after: budget,
                    })?;
            match written {
                Ok(_) => {
                    self.remember(key, fingerprint);
                    self.count(WriteResult::Written);
                    tracing::debug!(namespace, kcp = name, attempt, "KCP status written");
                    return Ok(Outcome::Written { attempts: attempt });
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    self.count(WriteResult::Conflict);
                    tracing::debug!(
                        namespace,
                        kcp = name,
                        attempt,
                        "409 Conflict writing KCP status: reading again"
                    );
                }
                Err(source) => {
                    return Err(PublishError::Write {
                        namespace: namespace.into(),
                        name: name.into(),
                        source,
                    });
                }
            }
        }
        Err(PublishError::Conflicts {
            namespace: namespace.into(),
            name: name.into(),
            attempts: self.cfg.max_attempts.max(1),
        })
    }

    fn remember(&self, key: Key, fingerprint: u64) {
        self.lock().insert(
            key,
            Written {
                fingerprint,
                at: Instant::now(),
            },
        );
    }

    async fn bounded<T>(
        &self,
        namespace: &str,
        name: &str,
        f: impl Future<Output = T>,
    ) -> Result<T, PublishError> {
        tokio::time::timeout(self.cfg.request_timeout, f)
            .await
            .map_err(|_| PublishError::Timeout {
                namespace: namespace.into(),
                name: name.into(),
                after: self.cfg.request_timeout,
            })
    }
}

/// `status.conditions` of a KCP as read; absent means none. Anything else that does not parse is
/// an error: a writer that cannot read the list must not replace it.
fn existing_conditions(data: &serde_json::Value) -> Result<Vec<Condition>, String> {
    match data.get("status").and_then(|s| s.get("conditions")) {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| e.to_string()),
    }
}

fn set_conditions(data: &mut serde_json::Value, merged: &[Condition]) {
    let conditions = serde_json::to_value(merged).unwrap_or_default();
    match data.get_mut("status").and_then(|s| s.as_object_mut()) {
        Some(status) => {
            status.insert("conditions".into(), conditions);
        }
        None => {
            if let Some(obj) = data.as_object_mut() {
                obj.insert(
                    "status".into(),
                    serde_json::json!({ "conditions": conditions }),
                );
            }
        }
    }
}

/// What would be published at `now_unix`, minus the figures that move on every probe (raft
/// index, DB size) and the transition time. The time counts: a Machine without a member is
/// joining while it is younger than `--join-grace` and broken after, and that alone changes
/// the next action.
fn fingerprint(
    cp: &ControlPlane,
    policy: &Policy,
    generation: Option<i64>,
    probe_error: Option<&str>,
    now_unix: i64,
) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut steady = cp.clone();
    if let EtcdState::Observed(s) = &mut steady.etcd {
        for m in &mut s.members {
            m.raft_index = None;
            m.db_size = None;
        }
    }
    let mut h = DefaultHasher::new();
    for c in conditions(&steady, policy, now_unix, generation, probe_error) {
        (
            c.type_,
            c.status,
            c.reason,
            c.message,
            c.observed_generation,
        )
            .hash(&mut h);
    }
    h.finish()
}

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
/// the first sweep after the caches synced is done (readiness waits for it).
pub async fn enrich(
    client: Client,
    state: Arc<ClusterState>,
    sweep: SweepConfig,
    publisher: Option<Arc<Publisher>>,
    metrics: Arc<EnricherMetrics>,
    mut first_sweep: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let probers = Probers::default();
    let mut leadership = publisher.as_ref().map(|p| p.leadership().subscribe());
    loop {
        let started = Instant::now();
        // Sweep and publish only once every cache has synced. Before that, a KCP seen before its
        // Cluster would be probed without the Cluster's endpoints annotation (a failed probe),
        // and a KCP not probed yet would be published as ProbeFailed ("no etcd probe of this
        // cluster yet"): after a restart, that replaced the truth the KCP showed with the
        // guard's own ignorance for a probe interval (tests/crash_safety.rs saw it).
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
        let mut published = None;
        if let Some(p) = &publisher {
            metrics.set_leader(p.leadership().is_leader());
            let s = if synced {
                let publish_started = Instant::now();
                let s = p.publish_all().await;
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
            // Taking over: publish at once (publish_all re-reads everything); losing: the
            // next round skips publishing and updates the metric.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::testkit::{NOW, add_machine, cp, down, healthy, members_mut};

    fn print(c: &ControlPlane) -> u64 {
        fingerprint(c, &Policy::default(), Some(1), None, NOW)
    }

    #[test]
    fn fingerprint_ignores_what_moves_on_every_probe() {
        let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
        let before = print(&c);
        for (i, m) in members_mut(&mut c).iter_mut().enumerate() {
            m.raft_index = Some(1000 + i as u64);
            m.db_size = Some(1 << 20);
        }
        assert_eq!(
            print(&c),
            before,
            "raft index and DB size alone publish nothing"
        );
        members_mut(&mut c)[2].health = down();
        assert_ne!(print(&c), before, "a member going down is published");
    }

    #[test]
    fn fingerprint_follows_generation_and_probe_errors() {
        let c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
        let p = Policy::default();
        let base = fingerprint(&c, &p, Some(1), None, NOW);
        assert_ne!(fingerprint(&c, &p, Some(2), None, NOW), base);
        assert_ne!(
            fingerprint(&c, &p, Some(1), Some("deadline exceeded"), NOW),
            base
        );
    }

    #[test]
    fn fingerprint_follows_a_machine_outgrowing_the_join_grace() {
        // A fourth Machine without a member: joining while young (WaitForJoin), broken once
        // older than the join grace (RemediateMachine). Nothing else changes, yet the next
        // action does: it must be published.
        let mut c = cp(4, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
        let i = add_machine(&mut c, "d");
        c.machines[i].created_unix = Some(NOW - 30);
        let p = Policy::default();
        let young = fingerprint(&c, &p, Some(1), None, NOW);
        assert_eq!(fingerprint(&c, &p, Some(1), None, NOW + 1), young);
        let grace = p.join_grace.as_secs() as i64;
        assert_ne!(
            fingerprint(&c, &p, Some(1), None, NOW + grace),
            young,
            "past the join grace the next action changes"
        );
    }

    #[test]
    fn conditions_are_set_with_or_without_a_status() {
        let list = [Condition {
            type_: "quorumguard.io/EtcdQuorum".into(),
            status: "True".into(),
            reason: "Healthy".into(),
            message: "m".into(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }];
        let mut bare = serde_json::json!({"metadata": {"name": "k"}});
        set_conditions(&mut bare, &list);
        assert_eq!(existing_conditions(&bare).expect("parses").len(), 1);
        let mut with = serde_json::json!({"status": {"replicas": 3, "conditions": []}});
        set_conditions(&mut with, &list);
        assert_eq!(
            with["status"]["replicas"], 3,
            "the rest of the status stays"
        );
        assert_eq!(existing_conditions(&with).expect("parses"), list.to_vec());
        let broken = serde_json::json!({"status": {"conditions": {"not": "a list"}}});
        assert!(
            existing_conditions(&broken).is_err(),
            "unreadable: write nothing"
        );
    }
}
