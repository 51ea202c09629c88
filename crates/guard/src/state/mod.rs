//! The per-cluster view the webhook decides on: Cluster API objects kept current by watches, and
//! the latest etcd health snapshot per cluster.
//!
//! Objects are converted to engine types as they arrive, and indexed by KubeadmControlPlane, so a
//! review costs a few map look-ups and clones — never an API call or a scan of every Machine.

pub mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::capi::{CapiCluster, CapiKcp, CapiMachine};
use crate::engine::{Belief, Cluster, Confirmation, ControlPlane, EtcdSnapshot, EtcdState, Member};

/// `(namespace, name)`.
pub type Key = (String, String);

/// Which of the watched kinds an event or a sync flag is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Cluster,
    Kcp,
    Machine,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Cluster, Kind::Kcp, Kind::Machine];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Cluster => "clusters",
            Kind::Kcp => "kubeadmcontrolplanes",
            Kind::Machine => "machines",
        }
    }

    fn index(self) -> usize {
        match self {
            Kind::Cluster => 0,
            Kind::Kcp => 1,
            Kind::Machine => 2,
        }
    }
}

/// One watched object, already converted.
#[derive(Clone, Debug)]
pub enum Object {
    Cluster(CapiCluster),
    Kcp(CapiKcp),
    Machine(CapiMachine),
}

impl Object {
    fn kind(&self) -> Kind {
        match self {
            Object::Cluster(_) => Kind::Cluster,
            Object::Kcp(_) => Kind::Kcp,
            Object::Machine(_) => Kind::Machine,
        }
    }
}

#[derive(Default)]
struct Index {
    clusters: HashMap<Key, CapiCluster>,
    kcps: HashMap<Key, CapiKcp>,
    machines: HashMap<Key, CapiMachine>,
    /// KCP key -> names of its Machines.
    by_kcp: HashMap<Key, BTreeSet<String>>,
    /// Objects of a relist in progress, per kind; swapped in at InitDone.
    relist: [Option<Vec<Object>>; 3],
}

fn key_of(o: &Object) -> Key {
    let r = match o {
        Object::Cluster(c) => &c.object,
        Object::Kcp(k) => &k.object,
        Object::Machine(m) => &m.object,
    };
    (r.namespace.clone(), r.name.clone())
}

impl Index {
    fn upsert(&mut self, o: Object) {
        let key = key_of(&o);
        match o {
            Object::Cluster(c) => {
                self.clusters.insert(key, c);
            }
            Object::Kcp(k) => {
                self.kcps.insert(key, k);
            }
            Object::Machine(m) => {
                self.unlink_machine(&key);
                if let Some(kcp) = &m.control_plane_name {
                    self.by_kcp
                        .entry((key.0.clone(), kcp.clone()))
                        .or_default()
                        .insert(key.1.clone());
                }
                self.machines.insert(key, m);
            }
        }
    }

    fn unlink_machine(&mut self, key: &Key) {
        if let Some(old) = self.machines.get(key)
            && let Some(kcp) = &old.control_plane_name
        {
            let k = (key.0.clone(), kcp.clone());
            if let Some(set) = self.by_kcp.get_mut(&k) {
                set.remove(&key.1);
                if set.is_empty() {
                    self.by_kcp.remove(&k);
                }
            }
        }
    }

    fn remove(&mut self, kind: Kind, key: &Key) {
        match kind {
            Kind::Cluster => {
                self.clusters.remove(key);
            }
            Kind::Kcp => {
                self.kcps.remove(key);
            }
            Kind::Machine => {
                self.unlink_machine(key);
                self.machines.remove(key);
            }
        }
    }

    /// The Cluster of KCP `key`: its cluster-name label, else that of one of its Machines.
    fn cluster_of(&self, key: &Key, k: &CapiKcp) -> Option<String> {
        k.cluster_name.clone().or_else(|| {
            self.by_kcp
                .get(key)
                .into_iter()
                .flatten()
                .filter_map(|m| self.machines.get(&(key.0.clone(), m.clone())))
                .find_map(|m| m.cluster_name.clone())
        })
    }

    fn replace_all(&mut self, kind: Kind, objects: Vec<Object>) {
        match kind {
            Kind::Cluster => self.clusters.clear(),
            Kind::Kcp => self.kcps.clear(),
            Kind::Machine => {
                self.machines.clear();
                self.by_kcp.clear();
            }
        }
        for o in objects {
            self.upsert(o);
        }
    }
}

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

/// The latest etcd probe of one workload cluster.
#[derive(Clone, Debug)]
pub struct HealthEntry {
    pub members: Vec<Member>,
    pub taken: Instant,
    /// `taken` as Unix seconds, for messages that name the time of the last successful probe.
    pub taken_unix: i64,
}

/// What a review reads. Shared by the watch tasks (writers) and the webhook (reader).
#[derive(Default)]
pub struct ClusterState {
    index: RwLock<Index>,
    synced: [AtomicBool; 3],
    /// Cluster key -> latest probe. Filled by the etcd prober.
    health: RwLock<HashMap<Key, HealthEntry>>,
    /// Cluster key -> why the last probe failed, when it did.
    probe_errors: RwLock<HashMap<Key, String>>,
    /// Cluster key -> how long its latest probe took.
    probe_took: RwLock<HashMap<Key, Duration>>,
    /// Notified when a control-plane Machine appears or goes: the prober sweeps soon after.
    machines_changed: tokio::sync::Notify,
    /// Cluster key -> what its probes have established ([`ClusterState::observe_probe`]).
    beliefs: Mutex<HashMap<Key, Belief>>,
    /// The origin of the monotonic times the beliefs are judged at.
    origin: Origin,
}

/// When this state was made: beliefs are judged at times measured from it.
struct Origin(Instant);

impl Default for Origin {
    fn default() -> Self {
        Origin(Instant::now())
    }
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
    pub fn new() -> Self {
        Self::default()
    }

    /// An object was added or changed (or listed, during a relist).
    pub fn apply(&self, o: Object) {
        let kind = o.kind();
        let mut idx = self.write_index();
        let new_machine = kind == Kind::Machine && !idx.machines.contains_key(&key_of(&o));
        match &mut idx.relist[kind.index()] {
            Some(buf) => buf.push(o),
            None => idx.upsert(o),
        }
        drop(idx);
        if new_machine {
            self.machines_changed.notify_one();
        }
    }

    /// Wakes when a control-plane Machine appears or goes.
    pub fn machines_changed(&self) -> &tokio::sync::Notify {
        &self.machines_changed
    }

    /// An object is gone.
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let mut idx = self.write_index();
        if let Some(buf) = &mut idx.relist[kind.index()] {
            buf.retain(|o| key_of(o) != key);
        }
        idx.remove(kind, &key);
        drop(idx);
        if kind == Kind::Machine {
            self.machines_changed.notify_one();
        }
    }

    /// A relist of `kind` starts: objects until [`ClusterState::relist_done`] replace the kind.
    pub fn relist_start(&self, kind: Kind) {
        self.write_index().relist[kind.index()] = Some(Vec::new());
    }

    /// The relist of `kind` is complete: swap it in atomically.
    pub fn relist_done(&self, kind: Kind) {
        let mut idx = self.write_index();
        let objects = idx.relist[kind.index()].take().unwrap_or_default();
        idx.replace_all(kind, objects);
        drop(idx);
        self.synced[kind.index()].store(true, Ordering::SeqCst);
    }

    pub fn is_synced(&self, kind: Kind) -> bool {
        self.synced[kind.index()].load(Ordering::SeqCst)
    }

    pub fn all_synced(&self) -> bool {
        Kind::ALL.iter().all(|k| self.is_synced(*k))
    }

    /// Records a probe of the etcd of Cluster `namespace/name` as it is: every finding believed.
    /// The sweep records through [`ClusterState::observe_probe`] instead.
    pub fn set_health(&self, namespace: &str, cluster: &str, members: Vec<Member>, taken: Instant) {
        let key = (namespace.to_string(), cluster.to_string());
        let ago = i64::try_from(Instant::now().saturating_duration_since(taken).as_secs())
            .unwrap_or(i64::MAX);
        let taken_unix = crate::unix_now().saturating_sub(ago);
        self.probe_errors
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        self.health
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                key,
                HealthEntry {
                    members,
                    taken,
                    taken_unix,
                },
            );
    }

    /// Records a probe of the etcd of Cluster `namespace/name` as far as it is believed (see
    /// [`crate::engine::confirm`]): findings for the worse that no earlier probe confirms are
    /// recorded as unconfirmed, and a changed member list only once a second probe lists it
    /// too. Returns when to probe again to confirm what is pending, if anything is.
    pub fn observe_probe(
        &self,
        namespace: &str,
        cluster: &str,
        members: Vec<Member>,
        taken: Instant,
        confirmation: &Confirmation,
    ) -> Option<Duration> {
        let key = (namespace.to_string(), cluster.to_string());
        let at = taken.saturating_duration_since(self.origin.0);
        let judged = self
            .beliefs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key)
            .or_default()
            .judge(members, at, confirmation);
        if let Some(members) = judged.members {
            self.set_health(namespace, cluster, members, taken);
        }
        judged.recheck_in
    }

    /// Forgets what the probes of clusters not in `keep` established (they are not probed any
    /// more).
    pub fn retain_beliefs(&self, keep: &std::collections::HashSet<Key>) {
        self.beliefs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| keep.contains(k));
    }

    /// Records that a probe of Cluster `namespace/name` failed. The last good snapshot stays for
    /// its member list, but from now until a probe succeeds its health counts as unknown (see
    /// [`ClusterState::control_plane`]): etcd may have changed since, unseen.
    pub fn set_probe_error(&self, namespace: &str, cluster: &str, error: String) {
        self.probe_errors
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert((namespace.to_string(), cluster.to_string()), error);
    }

    /// Records how long the latest probe of Cluster `namespace/name` took (for the metrics).
    pub fn set_probe_duration(&self, namespace: &str, cluster: &str, took: Duration) {
        self.probe_took
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert((namespace.to_string(), cluster.to_string()), took);
    }

    /// How long the latest probe of Cluster `namespace/name` took.
    pub fn probe_duration(&self, namespace: &str, cluster: &str) -> Option<Duration> {
        self.probe_took
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_string(), cluster.to_string()))
            .copied()
    }

    /// Why the latest probe of Cluster `namespace/name` failed, if it did, with the time of the
    /// last successful probe when there was one: whoever reads the last observed members must
    /// be able to tell how old they are.
    pub fn probe_error(&self, namespace: &str, cluster: &str) -> Option<String> {
        let key = (namespace.to_string(), cluster.to_string());
        let error = self
            .probe_errors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()?;
        let last = self
            .health
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .map(|h| h.taken_unix);
        Some(
            match last.and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t).ok()) {
                Some(t) => format!("{error} (last successful probe at {t})"),
                None => error,
            },
        )
    }

    /// Whether KCP `namespace/name` has stacked etcd in a known Cluster that this replica has
    /// not probed yet (neither a snapshot nor an error recorded). Its etcd state reads "no etcd
    /// probe of this cluster yet", which is no failure: it only means the KCP reached the caches
    /// after the sweep in progress took its targets (at startup, or a new cluster), and the status
    /// writer waits for the next sweep rather than publish ProbeFailed.
    pub fn awaits_first_probe(&self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        let cluster = {
            let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
            let Some(k) = idx.kcps.get(&key) else {
                return false;
            };
            if k.kcp.etcd != crate::engine::EtcdTopology::Stacked {
                return false;
            }
            match idx.cluster_of(&key, k) {
                Some(c) => (namespace.to_string(), c),
                None => return false,
            }
        };
        let probed = self
            .health
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&cluster)
            || self
                .probe_errors
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&cluster);
        !probed
    }

    /// The workload clusters to probe that have been probed neither successfully nor with a
    /// recorded failure, as `(namespace, cluster)`.
    pub fn unprobed_clusters(&self) -> Vec<Key> {
        let targets = self.probe_targets();
        let health = self.health.read().unwrap_or_else(|e| e.into_inner());
        let errors = self.probe_errors.read().unwrap_or_else(|e| e.into_inner());
        targets
            .into_iter()
            .map(|t| (t.namespace, t.cluster))
            .filter(|k| !health.contains_key(k) && !errors.contains_key(k))
            .collect()
    }

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

    fn etcd_state(&self, namespace: &str, cluster: &str, now: Instant) -> EtcdState {
        let key = (namespace.to_string(), cluster.to_string());
        let failed = self
            .probe_errors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(h) = self
            .health
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            let mut members = h.members.clone();
            if failed.is_some() {
                // The latest probe failed: the members are the last ones seen, but nothing is
                // known of their health now. Decisions and next actions must not take the last
                // snapshot's health (or alarms, or leader) as current until a probe succeeds.
                for m in &mut members {
                    m.health = crate::engine::Health::Unknown;
                    m.alarms.clear();
                    m.is_leader = false;
                }
            }
            return EtcdState::Observed(EtcdSnapshot {
                members,
                age: Some(now.saturating_duration_since(h.taken)),
            });
        }
        let reason = failed.unwrap_or_else(|| "no etcd probe of this cluster yet".to_string());
        EtcdState::Unknown { reason }
    }

    /// The control plane of KCP `namespace/name` as the caches and the latest probe see it.
    pub fn control_plane(
        &self,
        namespace: &str,
        kcp: &str,
        now: Instant,
    ) -> Result<ControlPlane, Lookup> {
        let key = (namespace.to_string(), kcp.to_string());
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        let Some(k) = idx.kcps.get(&key) else {
            return Err(if self.all_synced() {
                Lookup::NoSuchKcp
            } else {
                Lookup::NotSynced
            });
        };
        let machines: Vec<_> = idx
            .by_kcp
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|m| idx.machines.get(&(namespace.to_string(), m.clone())))
            .map(|m| m.machine.clone())
            .collect();
        let cluster_name = idx.cluster_of(&key, k);
        let cluster = match &cluster_name {
            Some(name) => idx
                .clusters
                .get(&(namespace.to_string(), name.clone()))
                .map(|c| c.cluster.clone())
                .unwrap_or(Cluster {
                    name: name.clone(),
                    deleting: false,
                }),
            None => Cluster {
                name: "(unknown)".into(),
                deleting: false,
            },
        };
        let kcp_model = k.kcp.clone();
        drop(idx);
        let etcd = match &cluster_name {
            Some(c) => self.etcd_state(namespace, c, now),
            None => EtcdState::Unknown {
                reason: "the KubeadmControlPlane names no Cluster".into(),
            },
        };
        Ok(ControlPlane {
            cluster,
            kcp: kcp_model,
            machines,
            etcd,
        })
    }

    /// What the etcd prober needs for each cluster with stacked etcd: one entry per Cluster,
    /// with its etcd annotations and the InternalIPs and node names of its control-plane
    /// Machines.
    pub fn probe_targets(&self) -> Vec<ProbeTarget> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        let mut out: BTreeMap<Key, ProbeTarget> = BTreeMap::new();
        for (key, k) in &idx.kcps {
            if k.kcp.etcd != crate::engine::EtcdTopology::Stacked {
                continue;
            }
            let machines: Vec<&CapiMachine> = idx
                .by_kcp
                .get(key)
                .into_iter()
                .flatten()
                .filter_map(|m| idx.machines.get(&(key.0.clone(), m.clone())))
                .collect();
            let Some(cluster) = idx.cluster_of(key, k) else {
                continue;
            };
            let ckey = (key.0.clone(), cluster.clone());
            let capi_cluster = idx.clusters.get(&ckey);
            let annotation = capi_cluster.and_then(|c| c.etcd_endpoints.clone());
            let transport_annotation = capi_cluster.and_then(|c| c.etcd_transport.clone());
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
            out.entry(ckey).or_insert(ProbeTarget {
                namespace: key.0.clone(),
                cluster,
                kcp: key.1.clone(),
                endpoints_annotation: annotation,
                transport_annotation,
                internal_ips: ips,
                node_names: nodes,
            });
        }
        out.into_values().collect()
    }

    /// Every KCP the caches hold, as `(namespace, name)`.
    pub fn kcps(&self) -> Vec<Key> {
        let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<Key> = idx.kcps.keys().cloned().collect();
        v.sort();
        v
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

    fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        // A panic while holding the lock leaves the index consistent per operation: keep going.
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi;
    use serde_json::json;

    fn machine(name: &str, ip: &str) -> Object {
        Object::Machine(
            capi::parse_machine(&json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": name, "namespace": "ns", "labels": {
                    "cluster.x-k8s.io/control-plane": "",
                    "cluster.x-k8s.io/cluster-name": "c1",
                    "cluster.x-k8s.io/control-plane-name": "kcp"}},
                "spec": {"clusterName": "c1"},
                "status": {"nodeRef": {"name": name},
                           "addresses": [{"type": "InternalIP", "address": ip}]}
            }))
            .expect("machine"),
        )
    }

    fn kcp() -> Object {
        Object::Kcp(
            capi::parse_kcp(&json!({
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
                "kind": "KubeadmControlPlane",
                "metadata": {"name": "kcp", "namespace": "ns",
                             "labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
                "spec": {"replicas": 3, "version": "v1.33.0"}
            }))
            .expect("kcp"),
        )
    }

    fn synced_state() -> ClusterState {
        let s = ClusterState::new();
        for kind in Kind::ALL {
            s.relist_start(kind);
        }
        s.apply(kcp());
        s.apply(machine("m1", "10.0.0.1"));
        s.apply(machine("m2", "10.0.0.2"));
        for kind in Kind::ALL {
            s.relist_done(kind);
        }
        s
    }

    #[test]
    fn control_plane_from_the_index_and_health() {
        let s = ClusterState::new();
        assert_eq!(
            s.control_plane("ns", "kcp", Instant::now()),
            Err(Lookup::NotSynced)
        );
        let s = synced_state();
        assert_eq!(
            s.control_plane("ns", "other", Instant::now()),
            Err(Lookup::NoSuchKcp)
        );
        let cp = s.control_plane("ns", "kcp", Instant::now()).expect("cp");
        assert_eq!(cp.machines.len(), 2);
        assert_eq!(cp.cluster.name, "c1");
        assert!(matches!(cp.etcd, EtcdState::Unknown { .. }));
        s.set_probe_error("ns", "c1", "connection refused".into());
        match s
            .control_plane("ns", "kcp", Instant::now())
            .expect("cp")
            .etcd
        {
            EtcdState::Unknown { reason } => assert_eq!(reason, "connection refused"),
            other => panic!("{other:?}"),
        }
        let taken = Instant::now();
        s.set_health("ns", "c1", vec![Member::new(1, "m1")], taken);
        match s.control_plane("ns", "kcp", taken).expect("cp").etcd {
            EtcdState::Observed(snap) => {
                assert_eq!(snap.members.len(), 1);
                assert_eq!(snap.age, Some(std::time::Duration::ZERO));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failed_probe_makes_the_last_snapshot_health_unknown() {
        use crate::engine::{Alarm, Health};
        let s = synced_state();
        let mut m = Member::new(1, "m1");
        m.health = Health::Healthy;
        m.is_leader = true;
        let mut full = Member::new(2, "m2");
        full.health = Health::Healthy;
        full.alarms.push(Alarm::NoSpace);
        let taken = Instant::now();
        s.set_health("ns", "c1", vec![m, full], taken);
        assert_eq!(s.probe_error("ns", "c1"), None);
        s.set_probe_error("ns", "c1", "no answer within 1s".into());
        let error = s.probe_error("ns", "c1").expect("error");
        assert!(
            error.starts_with("no answer within 1s (last successful probe at 20"),
            "{error}"
        );
        match s.control_plane("ns", "kcp", taken).expect("cp").etcd {
            EtcdState::Observed(snap) => {
                let ids: Vec<u64> = snap.members.iter().map(|m| m.id.0).collect();
                assert_eq!(ids, [1, 2], "the member list stays");
                for m in &snap.members {
                    assert_eq!(m.health, Health::Unknown, "{m:?}");
                    assert!(m.alarms.is_empty() && !m.is_leader, "{m:?}");
                }
            }
            other => panic!("{other:?}"),
        }
        // The next good probe is taken as it is.
        let mut back = Member::new(1, "m1");
        back.health = Health::Healthy;
        s.set_health("ns", "c1", vec![back], Instant::now());
        assert_eq!(s.probe_error("ns", "c1"), None);
        match s
            .control_plane("ns", "kcp", Instant::now())
            .expect("cp")
            .etcd
        {
            EtcdState::Observed(snap) => assert_eq!(snap.members[0].health, Health::Healthy),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn relist_replaces_and_deletes_remove() {
        let s = synced_state();
        // A relist that no longer holds m2 drops it; a delete drops m1.
        s.relist_start(Kind::Machine);
        s.apply(machine("m1", "10.0.0.1"));
        // During the relist the old view still answers.
        assert_eq!(s.machine_deleting("ns", "m2"), Some(false));
        s.relist_done(Kind::Machine);
        assert_eq!(s.machine_deleting("ns", "m2"), None);
        s.delete(Kind::Machine, "ns", "m1");
        let cp = s.control_plane("ns", "kcp", Instant::now()).expect("cp");
        assert!(cp.machines.is_empty());
    }

    #[test]
    fn probe_targets_one_per_cluster_with_addresses() {
        let s = synced_state();
        let t = s.probe_targets();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].cluster, "c1");
        assert_eq!(t[0].kcp, "kcp");
        assert_eq!(t[0].internal_ips, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(t[0].node_names, ["m1", "m2"]);
        assert_eq!(t[0].endpoints_annotation, None);
        assert_eq!(t[0].transport_annotation, None);
    }
}
