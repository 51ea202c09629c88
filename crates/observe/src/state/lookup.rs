//! What readers ask of the caches: the control plane of a KCP for a review, the workload clusters
//! to probe, and a few figures of the cached objects.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{ClusterState, Key, Kind, copy_out};
use crate::capi::{CapiMachine, Identity, health_checks_of};
use quorumguard_engine::{Cluster, ControlPlane, EtcdState, HealthChecks};

/// One workload cluster whose etcd the prober should read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTarget {
    pub namespace: String,
    pub cluster: String,
    pub kcp: String,
    /// The Cluster's `quorumguard.io/etcd-endpoints` annotation, if set.
    pub endpoints_annotation: Option<String>,
    /// The Cluster's `quorumguard.io/etcd-transport` annotation, if set (not yet parsed).
    pub transport_annotation: Option<String>,
    /// InternalIPs of its control-plane Machines.
    pub internal_ips: Vec<String>,
    /// Node names (`status.nodeRef.name`) of its control-plane Machines, sorted: the port-forward
    /// transport asks pods `kube-system/etcd-<node>` for the member list.
    pub node_names: Vec<String>,
}

/// What the autopilot reads of a cached KCP ([`ClusterState::kcp_for_autopilot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KcpForAutopilot {
    /// Annotation `quorumguard.io/autopilot`, as written.
    pub annotation: Option<String>,
    /// `controlplane.cluster.x-k8s.io/<version>` as cached.
    pub api_version: String,
    pub uid: Option<String>,
}

/// Why no control plane could be built for a review.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The caches have not completed their first list: nothing can be said.
    NotSynced,
    /// Synced, and no such KubeadmControlPlane exists.
    NoSuchKcp,
}

impl ClusterState {
    /// `spec.replicas` of KCP `namespace/name` as cached.
    pub fn kcp_replicas(&self, namespace: &str, name: &str) -> Option<u32> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        idx.kcps
            .get(&(namespace.to_string(), name.to_string()))
            .map(|k| k.kcp.replicas)
    }

    /// `metadata.generation` of KCP `namespace/name` as cached.
    pub fn kcp_generation(&self, namespace: &str, name: &str) -> Option<i64> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        idx.kcps
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|k| k.generation)
    }

    /// The control plane of KCP `namespace/name` as the caches and the latest probe see it.
    pub fn control_plane(
        &self,
        namespace: &str,
        kcp: &str,
        now: Instant,
    ) -> Result<ControlPlane, Lookup> {
        self.control_plane_of(&(namespace.to_string(), kcp.to_string()), now)
    }

    /// [`ClusterState::control_plane`] of the KCP `key` (namespace, name). Every look-up after
    /// the KCP's (its Machines, its Cluster, the record of its etcd) reuses one key of the same
    /// namespace, the name swapped in place: a review looks up a control plane on every
    /// request, and a key of two new Strings per look-up was 10 allocations of a 3-Machine one.
    pub fn control_plane_of(&self, key: &Key, now: Instant) -> Result<ControlPlane, Lookup> {
        let namespace = key.0.as_str();
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        let Some(k) = idx.kcps.get(key) else {
            return Err(if self.all_synced() {
                Lookup::NoSuchKcp
            } else {
                Lookup::NotSynced
            });
        };
        let mut other: Key = (key.0.clone(), String::new());
        let capi_machines: Vec<&CapiMachine> = idx
            .by_kcp
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|m| {
                other.1.clone_from(m);
                idx.machines.get(&other)
            })
            .collect();
        let machines: Vec<_> = capi_machines.iter().map(|m| copy_out(&m.machine)).collect();
        let health_checks = if self.is_synced(Kind::HealthCheck) {
            HealthChecks::Known(health_checks_of(
                idx.health_checks
                    .values()
                    .filter(|h| h.object.namespace == namespace),
                &capi_machines,
            ))
        } else {
            HealthChecks::Unknown {
                reason: self
                    .health_check_error
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
                    .unwrap_or_else(|| "MachineHealthChecks have not been listed yet".into()),
            }
        };
        let cluster_name = idx.cluster_of(key, k);
        let cluster = match &cluster_name {
            Some(name) => {
                other.1.clone_from(name);
                idx.clusters
                    .get(&other)
                    .map(|c| copy_out(&c.cluster))
                    .unwrap_or(Cluster {
                        name: name.clone(),
                        deleting: false,
                        paused: false,
                    })
            }
            None => Cluster {
                name: "(unknown)".into(),
                deleting: false,
                paused: false,
            },
        };
        let kcp_model = copy_out(&k.kcp);
        drop(idx);
        let etcd = match cluster_name {
            Some(c) => {
                other.1 = c;
                self.etcd_state(&other, now)
            }
            None => EtcdState::Unknown {
                reason: "the KubeadmControlPlane names no Cluster".into(),
            },
        };
        Ok(ControlPlane {
            cluster,
            kcp: kcp_model,
            machines,
            etcd,
            health_checks,
        })
    }

    /// What the etcd prober needs for each cluster with stacked etcd: one entry per Cluster,
    /// with its etcd annotations and the InternalIPs and node names of its control-plane
    /// Machines.
    pub fn probe_targets(&self) -> Vec<ProbeTarget> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        let mut out: BTreeMap<Key, ProbeTarget> = BTreeMap::new();
        for (key, k) in &idx.kcps {
            if let Some(t) = target_of(&idx, key, k) {
                out.entry((t.namespace.clone(), t.cluster.clone()))
                    .or_insert(t);
            }
        }
        out.into_values().collect()
    }

    /// The probe target of the cluster of KCP `namespace/kcp`, when it has stacked etcd in a
    /// known Cluster: what the webhook probes afresh before an allow that rests on etcd.
    pub fn probe_target(&self, namespace: &str, kcp: &str) -> Option<ProbeTarget> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        let key = (namespace.to_string(), kcp.to_string());
        let k = idx.kcps.get(&key)?;
        target_of(&idx, &key, k)
    }
    /// Every KCP the caches hold, as `(namespace, name)`.
    pub fn kcps(&self) -> Vec<Key> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<Key> = idx.kcps.keys().cloned().collect();
        v.sort();
        v
    }

    /// What the autopilot reads of KCP `namespace/name` as cached: its annotation
    /// `quorumguard.io/autopilot` and the object that carries it (kind, API version, UID) for
    /// its Events; `None` when the KCP is not cached.
    pub fn kcp_for_autopilot(&self, namespace: &str, name: &str) -> Option<KcpForAutopilot> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        idx.kcps
            .get(&(namespace.to_string(), name.to_string()))
            .map(|k| KcpForAutopilot {
                annotation: k.autopilot.clone(),
                api_version: format!(
                    "{}/{}",
                    crate::capi::GROUP_CONTROL_PLANE,
                    k.version.as_str()
                ),
                uid: k.uid.clone(),
            })
    }

    /// `metadata.uid` and `metadata.resourceVersion` of Machine `namespace/name` as cached.
    pub fn machine_identity(&self, namespace: &str, name: &str) -> Option<Identity> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        idx.machines
            .get(&(namespace.to_string(), name.to_string()))
            .map(|m| m.identity.clone())
    }

    /// Whether a Machine is in the cache, and whether it shows a deletionTimestamp.
    pub fn machine_deleting(&self, namespace: &str, name: &str) -> Option<bool> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        idx.machines
            .get(&(namespace.to_string(), name.to_string()))
            .map(|m| m.machine.deleting)
    }

    /// Counts of cached objects by kind, for logs and metrics.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        BTreeMap::from([
            (Kind::Cluster.as_str(), idx.clusters.len()),
            (Kind::Kcp.as_str(), idx.kcps.len()),
            (Kind::Machine.as_str(), idx.machines.len()),
        ])
    }
}

/// The probe target of KCP `key` (`k`): its Cluster, that Cluster's etcd annotations and the
/// InternalIPs and node names of its control-plane Machines. `None` without stacked etcd or a
/// Cluster.
fn target_of(
    idx: &super::index::Index,
    key: &Key,
    k: &crate::capi::CapiKcp,
) -> Option<ProbeTarget> {
    if k.kcp.etcd != quorumguard_engine::EtcdTopology::Stacked {
        return None;
    }
    let machines: Vec<&CapiMachine> = idx
        .by_kcp
        .get(key)
        .into_iter()
        .flatten()
        .filter_map(|m| idx.machines.get(&(key.0.clone(), m.clone())))
        .collect();
    let cluster = idx.cluster_of(key, k)?;
    let capi_cluster = idx.clusters.get(&(key.0.clone(), cluster.clone()));
    let mut ips: Vec<String> = machines
        .iter()
        .flat_map(|m| m.internal_ips.iter().cloned())
        .collect();
    ips.sort();
    ips.dedup();
    let mut nodes: Vec<String> = machines
        .iter()
        .filter_map(|m| m.machine.node_name.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    Some(ProbeTarget {
        namespace: key.0.clone(),
        cluster,
        kcp: key.1.clone(),
        endpoints_annotation: capi_cluster.and_then(|c| c.etcd_endpoints.clone()),
        transport_annotation: capi_cluster.and_then(|c| c.etcd_transport.clone()),
        internal_ips: ips,
        node_names: nodes,
    })
}
