//! The sweep: probe the etcd of every workload cluster with stacked etcd and put
//! the result where the webhook reads it ([`ClusterState::set_health`]). The loop that runs it every
//! `interval` (and publishes KCP status after it) is [`crate::status::publish::enrich`].
//!
//! Each replica sweeps on its own, so each webhook replica decides on fresh data. Clusters are
//! probed with bounded concurrency; each probe ends by its deadline whatever etcd does, so one
//! frozen cluster never delays the others past that. Probers (and their etcd clients, and for
//! the port-forward transport the workload API client and its loopback listeners) are kept per
//! cluster between sweeps, rebuilt when the cluster's etcd CA, its transport or its workload
//! kubeconfig changes, and dropped when the cluster is no longer probed.
//!
//! The transport of a cluster is its [`ETCD_TRANSPORT_ANNOTATION`] when set, else
//! [`SweepConfig::transport`].
//!
//! [`ETCD_TRANSPORT_ANNOTATION`]: super::endpoints::ETCD_TRANSPORT_ANNOTATION

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use super::endpoints::{Transport, TransportKind};
use super::portforward::{self, PortForward};
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
/// what they were made from: the CA, the transport and, for port-forward, the kubeconfig.
/// Replacing or dropping a prober closes its port-forward listeners (once in-flight probes,
/// which hold it too, are done).
#[derive(Default)]
pub struct Probers {
    by_cluster: Mutex<HashMap<Key, (u64, Arc<Prober>)>>,
}

impl Probers {
    /// Drops the probers of clusters that are not among `targets` any more.
    fn retain(&self, targets: &[ProbeTarget]) {
        let keep: HashSet<(&str, &str)> = targets
            .iter()
            .map(|t| (t.namespace.as_str(), t.cluster.as_str()))
            .collect();
        let gone: Vec<Arc<Prober>> = {
            let mut map = self.by_cluster.lock().unwrap_or_else(|e| e.into_inner());
            let stale: Vec<Key> = map
                .keys()
                .filter(|(ns, c)| !keep.contains(&(ns.as_str(), c.as_str())))
                .cloned()
                .collect();
            stale
                .iter()
                .filter_map(|k| map.remove(k).map(|(_, p)| p))
                .collect()
        };
        // Dropped outside the lock: closing listeners is not the map's business.
        drop(gone);
    }

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

fn hash(ca_cert: &str, ca_key: &str, kind: TransportKind, kubeconfig: Option<&str>) -> u64 {
    let mut h = DefaultHasher::new();
    ca_cert.hash(&mut h);
    ca_key.hash(&mut h);
    kind.hash(&mut h);
    kubeconfig.hash(&mut h);
    h.finish()
}

/// The transport of kind `kind` for cluster `t`: for port-forward, a client of the workload API
/// server from `kubeconfig`.
async fn transport(
    kind: TransportKind,
    t: &ProbeTarget,
    kubeconfig: Option<&str>,
) -> Result<Transport, String> {
    match (kind, kubeconfig) {
        (TransportKind::Direct, _) => Ok(Transport::Direct),
        (TransportKind::PortForward, Some(yaml)) => {
            PortForward::from_kubeconfig(yaml, &t.namespace, &t.cluster)
                .await
                .map(Transport::port_forward)
                .map_err(|e| e.to_string())
        }
        (TransportKind::PortForward, None) => Err(format!(
            "Cluster {}/{}: no workload kubeconfig read for the port-forward transport",
            t.namespace, t.cluster
        )),
    }
}

/// Probes one cluster and records the outcome in `state`.
async fn sweep_one(
    client: &Client,
    state: &ClusterState,
    probers: &Probers,
    t: ProbeTarget,
    cfg: &SweepConfig,
) {
    let key = (t.namespace.clone(), t.cluster.clone());
    let deadline = cfg.deadline;
    let outcome: Result<_, String> = async {
        let kind = TransportKind::for_cluster(t.transport_annotation.as_deref(), cfg.transport)
            .map_err(|e| format!("Cluster {}/{}: {e}", t.namespace, t.cluster))?;
        // The CA and (for port-forward) the kubeconfig, read at once: both bounded by the
        // deadline.
        let kubeconfig = async {
            match kind {
                TransportKind::PortForward => {
                    portforward::read_kubeconfig(client, &t.namespace, &t.cluster, deadline)
                        .await
                        .map(Some)
                        .map_err(|e| e.to_string())
                }
                TransportKind::Direct => Ok(None),
            }
        };
        let (ca, kubeconfig) = futures::join!(etcd_ca(client, &t, deadline), kubeconfig);
        let (ca_cert, ca_key) = ca?;
        let kubeconfig = kubeconfig?;
        let h = hash(&ca_cert, &ca_key, kind, kubeconfig.as_deref());
        let prober = match probers.get(&key, h) {
            Some(p) => p,
            None => {
                let tls =
                    ClientTls::from_etcd_ca(&ca_cert, &ca_key, SystemTime::now()).map_err(|e| {
                        format!("etcd CA of Cluster {}/{}: {e}", t.namespace, t.cluster)
                    })?;
                let transport = transport(kind, &t, kubeconfig.as_deref()).await?;
                let p = Arc::new(Prober::with_transport(tls, transport));
                probers.put(key.clone(), h, p.clone());
                p
            }
        };
        if kind == TransportKind::PortForward && t.node_names.is_empty() {
            return Err(format!(
                "Cluster {}/{}: no control-plane Machine has a node yet (status.nodeRef): no \
                 etcd pod to port-forward to",
                t.namespace, t.cluster
            ));
        }
        let endpoints = prober
            .transport()
            .list_endpoints(
                t.endpoints_annotation.as_deref(),
                &t.internal_ips,
                &t.node_names,
            )
            .map_err(|e| e.to_string())?;
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
            state.set_probe_duration(&t.namespace, &t.cluster, probe.took);
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
    probers.retain(&targets);
    futures::stream::iter(targets)
        .for_each_concurrent(cfg.concurrency.max(1), |t| {
            sweep_one(client, state, probers, t, cfg)
        })
        .await;
}
