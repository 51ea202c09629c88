//! The sweep: probe the etcd of every workload cluster with stacked etcd and put
//! the result where the webhook reads it ([`ClusterState::set_health`]). The loop that runs it every
//! `interval` is [`super::cycle::Cycle`]; what follows each sweep (publishing KCP status) is the
//! `quorumguard-status` crate's, above this one.
//!
//! Each replica sweeps on its own, so each webhook replica decides on fresh data. Clusters are
//! probed with bounded concurrency; each probe ends by its deadline whatever etcd does, so one
//! frozen cluster never delays the others past that. Probers (and their etcd clients, and for
//! the port-forward transport the workload API client and its loopback listeners) are kept per
//! cluster between sweeps, rebuilt when the cluster's etcd CA, its transport or its workload
//! kubeconfig changes, and dropped when the cluster is no longer probed. The Secrets they are
//! made from are read again only after a failed probe or [`SweepConfig::secret_refresh`]: at
//! 1,000 clusters and a 10 s interval, reading them every sweep was ~100 GETs a second, and an
//! API server slower than the probe deadline failed every probe.
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
use super::prober::{ClientTls, Probe, Prober};
use crate::state::{ClusterState, Key, ProbeTarget};
use quorumguard_engine::Confirmation;

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
    /// How long a cluster's etcd CA (and port-forward kubeconfig) Secret is trusted before it is
    /// read again. A failed probe also makes the next one read it, so a rotated CA costs at
    /// most one failed probe; in between, sweeps make no requests to the API server.
    pub secret_refresh: Duration,
    /// When a probe shows a change for the worse that no earlier probe confirms (or no leader),
    /// the cluster is probed again after etcd's election timeout before anything is believed
    /// (see [`quorumguard_engine::confirm`]).
    pub confirmation: Confirmation,
    /// The longest an admission review waits for a fresh probe of its cluster before an allow
    /// that rests on etcd (see [`super::fresh`]); the fresh probe's own deadline is three
    /// quarters of it.
    pub fresh_timeout: Duration,
    /// How long readiness waits for the first sweep (every workload cluster known then probed
    /// once) before the replica says ready anyway, logging and exporting the clusters still
    /// unprobed.
    pub first_sweep_timeout: Duration,
}

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig {
            interval: Duration::from_secs(10),
            deadline: Duration::from_secs(2),
            concurrency: 16,
            transport: TransportKind::default(),
            secret_refresh: Duration::from_secs(300),
            confirmation: Confirmation::default(),
            first_sweep_timeout: Duration::from_secs(60),
            fresh_timeout: Duration::from_secs(2),
        }
    }
}

/// A cluster's prober with what it was made from and when that was last read.
#[derive(Clone)]
struct Kept {
    /// Hash of the CA, the transport and, for port-forward, the kubeconfig.
    hash: u64,
    kind: TransportKind,
    prober: Arc<Prober>,
    /// When its Secrets were last read (and found unchanged, or made into this prober).
    read_at: Instant,
    /// Whether its latest probe succeeded: after a failure the Secrets are read again at once,
    /// so a rotated CA or a moved workload API server costs at most that one failed probe.
    last_ok: bool,
}

/// Per-cluster probers kept between sweeps (so etcd clients are reused and the Secrets they are
/// made from are not read on every sweep). Replacing or dropping a prober closes its
/// port-forward listeners (once in-flight probes, which hold it too, are done).
#[derive(Default)]
pub struct Probers {
    by_cluster: Mutex<HashMap<Key, Kept>>,
}

impl Probers {
    /// Drops the probers of clusters that are not among `targets` any more.
    fn retain(&self, targets: &[ProbeTarget]) {
        let keep: HashSet<(&str, &str)> = targets
            .iter()
            .map(|t| (t.namespace.as_str(), t.cluster.as_str()))
            .collect();
        let gone: Vec<Kept> = {
            let mut map = self.lock();
            let stale: Vec<Key> = map
                .keys()
                .filter(|(ns, c)| !keep.contains(&(ns.as_str(), c.as_str())))
                .cloned()
                .collect();
            stale.iter().filter_map(|k| map.remove(k)).collect()
        };
        // Dropped outside the lock: closing listeners is not the map's business.
        drop(gone);
    }

    /// The kept prober of cluster `key` (`(namespace, cluster)`), once a sweep made one: the
    /// autopilot acts over its transport and with its client certificate.
    pub fn prober(&self, key: &Key) -> Option<Arc<Prober>> {
        self.lock().get(key).map(|k| k.prober.clone())
    }

    fn get(&self, key: &Key) -> Option<Kept> {
        self.lock().get(key).cloned()
    }

    fn put(&self, key: Key, kept: Kept) {
        let old = self.lock().insert(key, kept);
        drop(old);
    }

    /// Records that the Secrets of `key` were read at `at` and still make prober `hash`.
    fn unchanged(&self, key: &Key, hash: u64, at: Instant) {
        if let Some(k) = self.lock().get_mut(key).filter(|k| k.hash == hash) {
            k.read_at = at;
        }
    }

    /// Records the outcome of a probe made with prober `hash`.
    fn probed(&self, key: &Key, hash: u64, ok: bool) {
        if let Some(k) = self.lock().get_mut(key).filter(|k| k.hash == hash) {
            k.last_ok = ok;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Kept>> {
        self.by_cluster.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a cluster's prober is made from, as read from the management cluster.
struct Material {
    ca_cert: String,
    ca_key: String,
    kubeconfig: Option<String>,
    hash: u64,
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

/// Reads the CA and (for port-forward) the kubeconfig at once, both bounded by `deadline`.
async fn read_material(
    client: &Client,
    t: &ProbeTarget,
    kind: TransportKind,
    deadline: Duration,
) -> Result<Material, String> {
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
    let (ca, kubeconfig) = futures::join!(etcd_ca(client, t, deadline), kubeconfig);
    let (ca_cert, ca_key) = ca?;
    let kubeconfig = kubeconfig?;
    let hash = hash(&ca_cert, &ca_key, kind, kubeconfig.as_deref());
    Ok(Material {
        ca_cert,
        ca_key,
        kubeconfig,
        hash,
    })
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

/// A prober made from `m`, kept for the cluster of `key` as read at `at`.
async fn build(
    probers: &Probers,
    key: &Key,
    t: &ProbeTarget,
    kind: TransportKind,
    m: &Material,
    at: Instant,
) -> Result<Kept, String> {
    let tls = ClientTls::from_etcd_ca(&m.ca_cert, &m.ca_key, SystemTime::now())
        .map_err(|e| format!("etcd CA of Cluster {}/{}: {e}", t.namespace, t.cluster))?;
    let transport = transport(kind, t, m.kubeconfig.as_deref()).await?;
    let kept = Kept {
        hash: m.hash,
        kind,
        prober: Arc::new(Prober::with_transport(tls, transport)),
        read_at: at,
        last_ok: true,
    };
    probers.put(key.clone(), kept.clone());
    Ok(kept)
}

/// One probe of cluster `t` with `prober`.
async fn probe_with(
    prober: &Prober,
    t: &ProbeTarget,
    kind: TransportKind,
    deadline: Duration,
) -> Result<Probe, String> {
    if kind == TransportKind::PortForward && t.node_names.is_empty() {
        return Err(format!(
            "Cluster {}/{}: no control-plane Machine has a node yet (status.nodeRef): no etcd \
             pod to port-forward to",
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

/// Probes cluster `t`, reading its Secrets only when they are due: no prober is kept for it,
/// the latest probe failed, or the last read is older than [`SweepConfig::secret_refresh`].
/// When a kept prober exists, the read runs beside the probe, so a slow API server never delays
/// or fails a probe; a changed Secret is used by the same sweep that reads it.
pub(crate) async fn probe_cluster(
    client: &Client,
    probers: &Probers,
    t: &ProbeTarget,
    cfg: &SweepConfig,
) -> Result<Probe, String> {
    let key = (t.namespace.clone(), t.cluster.clone());
    let deadline = cfg.deadline;
    let kind = TransportKind::for_cluster(t.transport_annotation.as_deref(), cfg.transport)
        .map_err(|e| format!("Cluster {}/{}: {e}", t.namespace, t.cluster))?;
    let now = Instant::now();
    let Some(kept) = probers.get(&key).filter(|k| k.kind == kind) else {
        let m = read_material(client, t, kind, deadline).await?;
        let kept = build(probers, &key, t, kind, &m, now).await?;
        return probe_kept(probers, &key, &kept, t, deadline).await;
    };
    if kept.last_ok && now.duration_since(kept.read_at) < cfg.secret_refresh {
        return probe_kept(probers, &key, &kept, t, deadline).await;
    }
    let (read, probe) = futures::join!(
        read_material(client, t, kind, deadline),
        probe_kept(probers, &key, &kept, t, deadline)
    );
    match read {
        Ok(m) if m.hash == kept.hash => {
            probers.unchanged(&key, kept.hash, now);
            probe
        }
        Ok(m) => {
            tracing::info!(
                namespace = %t.namespace, cluster = %t.cluster,
                "the etcd CA or workload kubeconfig Secret changed: probing with it"
            );
            match build(probers, &key, t, kind, &m, now).await {
                Ok(kept) => probe_kept(probers, &key, &kept, t, deadline).await,
                Err(e) => {
                    tracing::warn!(
                        namespace = %t.namespace, cluster = %t.cluster, error = %e,
                        "the changed etcd Secrets are unusable: probing with those read before"
                    );
                    probe.map_err(|p| format!("{p} (and the changed Secret is unusable: {e})"))
                }
            }
        }
        Err(e) => {
            tracing::warn!(
                namespace = %t.namespace, cluster = %t.cluster, error = %e,
                "re-reading the etcd Secrets failed: probing with those read before"
            );
            probe.map_err(|p| format!("{p} (and {e})"))
        }
    }
}

/// Probes with `kept`'s prober and records whether that succeeded (a failure makes the next
/// probe read the Secrets again).
async fn probe_kept(
    probers: &Probers,
    key: &Key,
    kept: &Kept,
    t: &ProbeTarget,
    deadline: Duration,
) -> Result<Probe, String> {
    let probe = probe_with(&kept.prober, t, kept.kind, deadline).await;
    probers.probed(key, kept.hash, probe.is_ok());
    probe
}

/// Probes one cluster and records the outcome in `state`; while the record awaits confirmation
/// of a change for the worse, probes again after etcd's election timeout (at most
/// [`Confirmation::max_probes`] probes in all), so that what the sweep leaves behind is
/// confirmed whenever etcd settles within the confirmation window.
async fn sweep_one(
    client: &Client,
    state: &ClusterState,
    probers: &Probers,
    t: ProbeTarget,
    cfg: &SweepConfig,
) {
    let probes = cfg.confirmation.max_probes();
    for probed in 1..=probes {
        let recheck = match probe_cluster(client, probers, &t, cfg).await {
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
                state.set_probe_timing(
                    &t.namespace,
                    &t.cluster,
                    crate::state::ProbeTiming {
                        member_list: probe.member_list_took,
                        slowest_member: probe.slowest_member.clone(),
                    },
                );
                state.observe_probe(
                    &t.namespace,
                    &t.cluster,
                    probe.members,
                    Instant::now(),
                    &cfg.confirmation,
                )
            }
            Err(e) => {
                tracing::warn!(namespace = %t.namespace, cluster = %t.cluster, error = %e, "etcd probe failed");
                state.set_probe_error(&t.namespace, &t.cluster, e);
                None
            }
        };
        let Some(wait) = recheck.filter(|_| probed < probes) else {
            return;
        };
        tracing::debug!(
            namespace = %t.namespace, cluster = %t.cluster, wait_ms = wait.as_millis() as u64,
            "etcd probe saw a change for the worse: probing again to confirm it"
        );
        tokio::time::sleep(wait).await;
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
    state.retain_beliefs(
        &targets
            .iter()
            .map(|t| (t.namespace.clone(), t.cluster.clone()))
            .collect(),
    );
    futures::stream::iter(targets)
        .for_each_concurrent(cfg.concurrency.max(1), |t| {
            sweep_one(client, state, probers, t, cfg)
        })
        .await;
}
