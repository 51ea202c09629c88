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
//!
//! The parts: `snapshot` (each KCP as one cycle sees it, [`Snapshot`]: its control plane, next
//! action and rollout prediction, each worked out once per cycle and read by the metrics, the
//! fingerprint and the conditions), `document` (our conditions in the KCP's status document),
//! `fingerprint` (what was published, without what moves on every probe) and `enricher` (the
//! enricher's loop, [`enrich`], and the metrics' [`figures`]); [`Publisher`] and its
//! read-merge-write are here.

mod document;
mod enricher;
mod fingerprint;
mod snapshot;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};

use super::conditions::{lacks_room, merge};
use super::metrics::{EnricherMetrics, WriteResult};
use crate::lease::Leadership;
use document::{existing_conditions, set_conditions};
use quorumguard_engine::Policy;
use quorumguard_observe::state::{ClusterState, Key, Kind, watch::api_resource};

pub use enricher::{BeforePublish, enrich, figures};
pub use snapshot::{Snapshot, rollouts, snapshots};

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

    /// Publishes every KCP of `snapshots` (one cycle's, [`snapshots`], in the order of their
    /// keys), `concurrency` at a time. A KCP the caches hold without a snapshot (its cluster
    /// awaits its first probe) counts as skipped.
    pub async fn publish_all(&self, snapshots: &[Snapshot]) -> Summary {
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
        let unsnapshotted = kcps
            .iter()
            .filter(|k| snapshots.binary_search_by(|s| s.key.cmp(k)).is_err())
            .count();
        let outcomes: Vec<_> = futures::stream::iter(snapshots)
            .map(|snapshot| async move {
                let r = self.publish(snapshot).await;
                if let Err(e) = &r {
                    let (ns, name) = &snapshot.key;
                    tracing::warn!(namespace = %ns, kcp = %name, error = %e, "publishing KCP status failed");
                }
                r
            })
            .buffer_unordered(self.cfg.concurrency.max(1))
            .collect()
            .await;
        let mut s = Summary {
            skipped: unsnapshotted,
            ..Summary::default()
        };
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

    /// Publishes one KCP's conditions, if this replica leads and something changed: from a
    /// snapshot taken now.
    pub async fn publish_one(&self, namespace: &str, name: &str) -> Result<Outcome, PublishError> {
        if !self.leadership.is_leader() {
            return Ok(Outcome::NotLeader);
        }
        let key = (namespace.to_string(), name.to_string());
        let now_unix = quorumguard_observe::unix_now();
        match Snapshot::take(&self.state, &self.policy, Instant::now(), now_unix, key) {
            Some(snapshot) => self.publish(&snapshot).await,
            None => Ok(Outcome::NotReady),
        }
    }

    /// Publishes the conditions of `snapshot`'s KCP, if this replica leads, the KCP is still in
    /// the caches and something changed.
    async fn publish(&self, snapshot: &Snapshot) -> Result<Outcome, PublishError> {
        if !self.leadership.is_leader() {
            return Ok(Outcome::NotLeader);
        }
        let (namespace, name) = (snapshot.key.0.as_str(), snapshot.key.1.as_str());
        if self.state.kcp_replicas(namespace, name).is_none() {
            // Gone since the snapshot was taken.
            return Ok(Outcome::NotReady);
        }
        let fingerprint = snapshot.fingerprint(&self.policy);
        if let Some(w) = self.lock().get(&snapshot.key)
            && w.fingerprint == fingerprint
            && w.at.elapsed() < self.cfg.refresh
        {
            self.count(WriteResult::Unchanged);
            return Ok(Outcome::Unchanged);
        }
        let new = snapshot.conditions(&self.policy);
        let result = self
            .write(namespace, name, new, snapshot.now_unix, fingerprint)
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
