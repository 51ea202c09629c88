//! Leader election on a `coordination.k8s.io/v1` Lease: only the holder writes KCP status.
//!
//! Every replica probes etcd and answers reviews; only one may publish conditions, or two
//! replicas with slightly different probes would flip a KCP's status back and forth.
//!
//! The algorithm is client-go's `leaderelection` with a `LeaseLock`: read the Lease, and take it
//! (or renew it) with an update that carries the read `resourceVersion`, so of two replicas racing
//! for it exactly one wins and the other gets 409 Conflict. A holder that has not renewed within
//! `lease_duration` *as observed locally* (the time this replica last saw the Lease change, not
//! the holder's `renewTime`, so clock skew between nodes does not matter) may be replaced.
//!
//! Why not a crate: `kube-leader-election` is built for an older kube, and `kube-lease-manager`
//! takes the Lease through server-side apply field ownership and releases or forces it with
//! unconditioned patches; a holder there learns that it lost only at its next sync. Here the
//! holder counts itself leader only until `renew_deadline` after the start of its last
//! successful renewal, which is shorter than `lease_duration`: it stops writing before any other
//! replica may take over, even when the API server stops answering. The RBAC in
//! `manifests/core/rbac.yaml` (get, create, update on leases) is exactly what this needs.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use quorumguard_engine::autopilot::ANNOTATION_AUTOPILOT;
use tokio::sync::watch;

/// Where the Lease lives, who we are, and the timing (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity in `spec.holderIdentity` (the pod name in a cluster).
    pub identity: String,
    /// How long others wait, after last seeing the Lease change, before taking it over.
    pub lease_duration: Duration,
    /// How long after the start of its last successful renewal the holder still counts itself
    /// leader. Shorter than `lease_duration`, so leadership never overlaps.
    pub renew_deadline: Duration,
    /// Time between two attempts to take or renew the Lease.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// The defaults, for a Lease `namespace/name` held as `identity`.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        LeaseConfig {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Why a Lease could not be taken or renewed this round.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("reading Lease {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("writing Lease {namespace}/{name}: {source}")]
    Write {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("Lease {namespace}/{name}: no answer from the API server within {after:?}")]
    Timeout {
        namespace: String,
        name: String,
        after: Duration,
    },
}

impl LeaseError {
    /// An answer of the API server refusing the request (not a timeout or a broken
    /// connection, which the next attempt may not meet again).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            LeaseError::Read {
                source: kube::Error::Api(_),
                ..
            } | LeaseError::Write {
                source: kube::Error::Api(_),
                ..
            }
        )
    }
}

/// Whether this replica leads now. Cheap to clone and to ask; the elector updates it.
#[derive(Clone, Debug)]
pub struct Leadership {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Leader until this instant; `None`: not leader.
    until: Mutex<Option<Instant>>,
    /// `true` while leader; receivers see takeovers and losses.
    tx: watch::Sender<bool>,
    /// The Lease's annotation `quorumguard.io/autopilot` as last read (the autopilot's live kill
    /// switch: `Some` of anything but `on` holds every action back).
    autopilot: Mutex<Option<String>>,
}

impl Leadership {
    /// Not leader until an elector says so.
    pub fn new() -> Self {
        let (tx, _) = watch::channel(false);
        Leadership {
            inner: Arc::new(Shared {
                until: Mutex::new(None),
                tx,
                autopilot: Mutex::new(None),
            }),
        }
    }

    /// Leader forever: for a single replica run without leader election.
    pub fn always() -> Self {
        let l = Self::new();
        let now = Instant::now();
        let forever = [100 * 365 * 86_400, 365 * 86_400, 86_400]
            .into_iter()
            .find_map(|secs| now.checked_add(Duration::from_secs(secs)))
            .unwrap_or(now);
        l.hold_until(forever);
        l
    }

    /// Whether this replica may write now. Turns false on its own once the renewal deadline
    /// passes, without waiting for the elector to notice.
    pub fn is_leader(&self) -> bool {
        self.until().is_some_and(|u| Instant::now() < u)
    }

    /// When leadership ends unless renewed (`None`: not leader). Writers bound their requests by it.
    pub fn until(&self) -> Option<Instant> {
        *self
            .inner
            .until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The Lease's annotation [`ANNOTATION_AUTOPILOT`] as the elector last read it (`None`
    /// without one, or without an elector): the fleet-wide kill switch of the autopilot, read
    /// at every renewal (every `retry_period`), so `kubectl annotate lease ...
    /// quorumguard.io/autopilot=off` stops every action from the next sweep on.
    pub fn autopilot_annotation(&self) -> Option<String> {
        self.inner
            .autopilot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_autopilot_annotation(&self, value: Option<&String>) {
        let mut a = self
            .inner
            .autopilot
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if a.as_ref() != value {
            a.clone_from(&value.cloned());
        }
    }

    /// Changes of leadership: `true` on taking over, `false` on losing it.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.inner.tx.subscribe()
    }

    fn hold_until(&self, until: Instant) {
        *self
            .inner
            .until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(until);
        self.inner
            .tx
            .send_if_modified(|v| !std::mem::replace(v, true));
    }

    fn lose(&self) {
        *self
            .inner
            .until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.inner
            .tx
            .send_if_modified(|v| std::mem::replace(v, false));
    }
}

impl Default for Leadership {
    fn default() -> Self {
        Self::new()
    }
}

/// What this replica last saw of the Lease, and when it saw it change.
struct Observed {
    spec: LeaseSpec,
    at: Instant,
}

/// Takes and renews the Lease; [`Leadership`] tells the rest of the process.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    leadership: Leadership,
    observed: Mutex<Option<Observed>>,
}

impl Elector {
    pub fn new(client: Client, cfg: LeaseConfig, leadership: Leadership) -> Self {
        Elector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            leadership,
            observed: Mutex::new(None),
        }
    }

    /// Tries to take or renew the Lease every `retry_period`, forever. Leadership is lost when
    /// another replica holds the Lease, or when no renewal has succeeded within `renew_deadline`.
    pub async fn run(&self) {
        loop {
            let started = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    let was = self.leadership.is_leader();
                    self.leadership
                        .hold_until(started + self.cfg.renew_deadline);
                    if !was {
                        tracing::info!(lease = %self.lease_name(), identity = %self.cfg.identity, "took the lease: this replica now writes KCP status");
                    }
                }
                Ok(false) => {
                    if self.leadership.until().is_some() {
                        tracing::warn!(lease = %self.lease_name(), "another replica holds the lease: this replica stops writing KCP status");
                    }
                    self.leadership.lose();
                }
                // The API server refused (403 without the Role's get, create or update on
                // leases; 404 without the namespace): a misconfiguration that keeps this
                // replica from ever writing KCP status, so say it at every attempt.
                Err(e) if e.is_refusal() => {
                    tracing::warn!(lease = %self.lease_name(), error = %e, "the API server refused the lease: this replica cannot take or renew it and does not write KCP status");
                }
                Err(e) => {
                    tracing::debug!(lease = %self.lease_name(), error = %e, "lease attempt failed");
                }
            }
            // No successful renewal within the renew deadline: `is_leader` already says no;
            // tell the subscribers too.
            if self.leadership.until().is_some_and(|u| Instant::now() >= u) {
                tracing::warn!(lease = %self.lease_name(), "could not renew the lease in time: this replica stops writing KCP status");
                self.leadership.lose();
            }
            tokio::time::sleep(self.cfg.retry_period.saturating_sub(started.elapsed())).await;
        }
    }

    /// Gives the Lease up (on shutdown), so another replica takes over at once instead of after
    /// `lease_duration`. Only when this replica holds it; each request is bounded by the renew
    /// deadline.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let was_leader = self.leadership.until().is_some();
        self.leadership.lose();
        if !was_leader {
            return Ok(());
        }
        let lease = self.bounded(self.read()).await??;
        let Some(mut lease) = lease else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        // client-go's release: no holder, a one-second duration, a fresh renewTime.
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.bounded(self.replace(&lease)).await??;
        tracing::info!(lease = %self.lease_name(), "released the lease");
        Ok(())
    }

    fn lease_name(&self) -> String {
        format!("{}/{}", self.cfg.namespace, self.cfg.name)
    }

    async fn bounded<T>(&self, f: impl Future<Output = T>) -> Result<T, LeaseError> {
        let after = self.cfg.renew_deadline.min(self.cfg.lease_duration);
        tokio::time::timeout(after, f)
            .await
            .map_err(|_| LeaseError::Timeout {
                namespace: self.cfg.namespace.clone(),
                name: self.cfg.name.clone(),
                after,
            })
    }

    async fn read(&self) -> Result<Option<Lease>, LeaseError> {
        self.api
            .get_opt(&self.cfg.name)
            .await
            .map_err(|source| LeaseError::Read {
                namespace: self.cfg.namespace.clone(),
                name: self.cfg.name.clone(),
                source,
            })
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, LeaseError> {
        self.api
            .replace(&self.cfg.name, &PostParams::default(), lease)
            .await
            .map_err(|source| self.write_error(source))
    }

    fn write_error(&self, source: kube::Error) -> LeaseError {
        LeaseError::Write {
            namespace: self.cfg.namespace.clone(),
            name: self.cfg.name.clone(),
            source,
        }
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// One round: `Ok(true)` when this replica holds the Lease afterwards, `Ok(false)` when
    /// another live replica does or won the race.
    async fn try_acquire_or_renew(&self) -> Result<bool, LeaseError> {
        let now = MicroTime(Timestamp::now());
        let Some(mut lease) = self.bounded(self.read()).await?? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(self.duration_secs()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self
                .bounded(self.api.create(&PostParams::default(), &lease))
                .await?
            {
                Ok(created) => {
                    self.observe(created.spec.unwrap_or_default());
                    Ok(true)
                }
                // Another replica created it first.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(self.write_error(e)),
            };
        };
        self.leadership.set_autopilot_annotation(
            lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_AUTOPILOT)),
        );
        let spec = lease.spec.clone().unwrap_or_default();
        let observed_at = self.observe(spec.clone());
        let holder = spec.holder_identity.as_deref().unwrap_or("");
        let ours = holder == self.cfg.identity;
        let duration = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
        );
        if !holder.is_empty() && !ours && observed_at.elapsed() < duration {
            return Ok(false);
        }
        let new = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !ours {
            new.acquire_time = Some(now.clone());
            new.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            tracing::debug!(lease = %self.lease_name(), previous = %holder, "taking over the lease");
        }
        new.holder_identity = Some(self.cfg.identity.clone());
        new.lease_duration_seconds = Some(self.duration_secs());
        new.renew_time = Some(now);
        match self.bounded(self.replace(&lease)).await? {
            Ok(written) => {
                self.observe(written.spec.unwrap_or_default());
                Ok(true)
            }
            Err(LeaseError::Write {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Records the Lease as seen now; returns when it was last seen to change.
    fn observe(&self, spec: LeaseSpec) -> Instant {
        let mut o = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        match &*o {
            Some(prev) if prev.spec == spec => prev.at,
            _ => {
                let at = Instant::now();
                *o = Some(Observed { spec, at });
                at
            }
        }
    }
}
