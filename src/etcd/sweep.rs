//! The sweep: every `interval`, probe the etcd of every workload cluster with stacked etcd and put
//! the result where the webhook reads it ([`ClusterState::set_health`]).
//!
//! Each replica sweeps on its own, so each webhook replica decides on fresh data. Clusters are
//! probed with bounded concurrency; each probe ends by its deadline whatever etcd does, so one
//! frozen cluster never delays the others past that. Probers (and their etcd clients) are kept
//! per cluster between sweeps and rebuilt when the cluster's etcd CA changes.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use super::endpoints::{TransportKind, endpoints_for};
use super::prober::{ClientTls, Prober};
use crate::state::{ClusterState, Key, ProbeTarget};

/// How often and how hard to probe.
#[derive(Clone, Debug)]
pub struct SweepConfig {
    /// Time between the starts of two sweeps.
    pub interval: Duration,
    /// Per-probe deadline (the member list, then every member in parallel).
    pub deadline: Duration,
    /// Clusters probed at once.
    pub concurrency: usize,
    /// The transport for clusters without an [`ETCD_TRANSPORT_ANNOTATION`].
    ///
    /// [`ETCD_TRANSPORT_ANNOTATION`]: super::endpoints::ETCD_TRANSPORT_ANNOTATION
    pub transport: TransportKind,
}

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig {
            interval: Duration::from_secs(10),
            deadline: Duration::from_secs(2),
            concurrency: 16,
            transport: TransportKind::default(),
        }
    }
}

/// Per-cluster probers kept between sweeps (so etcd clients are reused), keyed by the hash of
/// the CA they were made from.
#[derive(Default)]
pub struct Probers {
    by_cluster: Mutex<HashMap<Key, (u64, Arc<Prober>)>>,
}

impl Probers {
    fn get(&self, key: &Key, ca_hash: u64) -> Option<Arc<Prober>> {
        let map = self.by_cluster.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key)
            .filter(|(h, _)| *h == ca_hash)
            .map(|(_, p)| p.clone())
    }

    fn put(&self, key: Key, ca_hash: u64, p: Arc<Prober>) {
        self.by_cluster
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (ca_hash, p));
    }
}

/// Reads the etcd CA of a cluster from Secret `<cluster>-etcd` (keys tls.crt, tls.key).
async fn etcd_ca(
    client: &Client,
    t: &ProbeTarget,
    deadline: Duration,
) -> Result<(String, String), String> {
    let name = format!("{}-etcd", t.cluster);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &t.namespace);
    let secret = match tokio::time::timeout(deadline, secrets.get(&name)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("reading Secret {}/{name}: {e}", t.namespace)),
        Err(_) => {
            return Err(format!(
                "reading Secret {}/{name}: no answer within {deadline:?}",
                t.namespace
            ));
        }
    };
    let field = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| format!("Secret {}/{name} has no key {k}", t.namespace))
    };
    Ok((field("tls.crt")?, field("tls.key")?))
}

fn hash(a: &str, b: &str) -> u64 {
    let mut h = DefaultHasher::new();
    a.hash(&mut h);
    b.hash(&mut h);
    h.finish()
}

/// Probes one cluster and records the outcome in `state`.
async fn sweep_one(
    client: &Client,
    state: &ClusterState,
    probers: &Probers,
    t: ProbeTarget,
    deadline: Duration,
) {
    let key = (t.namespace.clone(), t.cluster.clone());
    let outcome: Result<_, String> = async {
        let (ca_cert, ca_key) = etcd_ca(client, &t, deadline).await?;
        let h = hash(&ca_cert, &ca_key);
        let prober = match probers.get(&key, h) {
            Some(p) => p,
            None => {
                let tls =
                    ClientTls::from_etcd_ca(&ca_cert, &ca_key, SystemTime::now()).map_err(|e| {
                        format!("etcd CA of Cluster {}/{}: {e}", t.namespace, t.cluster)
                    })?;
                let p = Arc::new(Prober::new(tls));
                probers.put(key.clone(), h, p.clone());
                p
            }
        };
        let endpoints = endpoints_for(t.endpoints_annotation.as_deref(), &t.internal_ips);
        prober
            .probe(&endpoints, deadline)
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    match outcome {
        Ok(probe) => {
            tracing::debug!(
                namespace = %t.namespace, cluster = %t.cluster,
                members = probe.members.len(), took_ms = probe.took.as_millis() as u64,
                "etcd probed"
            );
            for w in &probe.warnings {
                tracing::info!(namespace = %t.namespace, cluster = %t.cluster, warning = %w, "etcd probe");
            }
            state.set_health(&t.namespace, &t.cluster, probe.members, Instant::now());
        }
        Err(e) => {
            tracing::warn!(namespace = %t.namespace, cluster = %t.cluster, error = %e, "etcd probe failed");
            state.set_probe_error(&t.namespace, &t.cluster, e);
        }
    }
}

/// One sweep over every probe target, `concurrency` at a time.
pub async fn sweep_once(
    client: &Client,
    state: &ClusterState,
    cfg: &SweepConfig,
    probers: &Probers,
) {
    let targets = state.probe_targets();
    futures::stream::iter(targets)
        .for_each_concurrent(cfg.concurrency.max(1), |t| {
            sweep_one(client, state, probers, t, cfg.deadline)
        })
        .await;
}

/// Sweeps that a Machine change triggers start at most this often.
const MIN_GAP: Duration = Duration::from_secs(1);

/// Sweeps forever: every `interval`, and soon (at most once a second) after a control-plane
/// Machine appears or goes.
pub async fn run(client: Client, state: Arc<ClusterState>, cfg: SweepConfig) {
    let probers = Probers::default();
    loop {
        let started = Instant::now();
        sweep_once(&client, &state, &cfg, &probers).await;
        let rest = cfg.interval.saturating_sub(started.elapsed());
        tokio::select! {
            _ = tokio::time::sleep(rest) => {}
            _ = state.machines_changed().notified() => {
                tokio::time::sleep(MIN_GAP.saturating_sub(started.elapsed())).await;
            }
        }
    }
}
