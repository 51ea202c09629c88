//! The index of the watched objects: each kind by `(namespace, name)`, the Machines of each
//! KubeadmControlPlane, and a relist in progress per kind.

use std::collections::{BTreeSet, HashMap};

use super::{Key, Kind, Object};
use crate::capi::{CapiCluster, CapiHealthCheck, CapiKcp, CapiMachine};

#[derive(Default)]
pub(super) struct Index {
    pub(super) clusters: HashMap<Key, CapiCluster>,
    pub(super) kcps: HashMap<Key, CapiKcp>,
    pub(super) machines: HashMap<Key, CapiMachine>,
    pub(super) health_checks: HashMap<Key, CapiHealthCheck>,
    /// KCP key -> names of its Machines.
    pub(super) by_kcp: HashMap<Key, BTreeSet<String>>,
    /// Objects of a relist in progress, per kind; swapped in at InitDone.
    pub(super) relist: [Option<Vec<Object>>; 4],
}

pub(super) fn key_of(o: &Object) -> Key {
    let r = match o {
        Object::Cluster(c) => &c.object,
        Object::Kcp(k) => &k.object,
        Object::Machine(m) => &m.object,
        Object::HealthCheck(h) => &h.object,
    };
    (r.namespace.clone(), r.name.clone())
}

impl Index {
    pub(super) fn upsert(&mut self, o: Object) {
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
            Object::HealthCheck(h) => {
                self.health_checks.insert(key, h);
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

    pub(super) fn remove(&mut self, kind: Kind, key: &Key) {
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
            Kind::HealthCheck => {
                self.health_checks.remove(key);
            }
        }
    }

    /// The Cluster of KCP `key`: its cluster-name label, else that of one of its Machines.
    pub(super) fn cluster_of(&self, key: &Key, k: &CapiKcp) -> Option<String> {
        k.cluster_name.clone().or_else(|| {
            self.by_kcp
                .get(key)
                .into_iter()
                .flatten()
                .filter_map(|m| self.machines.get(&(key.0.clone(), m.clone())))
                .find_map(|m| m.cluster_name.clone())
        })
    }

    pub(super) fn replace_all(&mut self, kind: Kind, objects: Vec<Object>) {
        match kind {
            Kind::Cluster => self.clusters.clear(),
            Kind::Kcp => self.kcps.clear(),
            Kind::Machine => {
                self.machines.clear();
                self.by_kcp.clear();
            }
            Kind::HealthCheck => self.health_checks.clear(),
        }
        for o in objects {
            self.upsert(o);
        }
    }
}
