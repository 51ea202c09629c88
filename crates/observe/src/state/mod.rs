//! The per-cluster view the webhook decides on: Cluster API objects kept current by watches, and
//! the latest etcd health snapshot per cluster.
//!
//! Objects are converted to engine types as they arrive, and indexed by KubeadmControlPlane, so a
//! review costs a few map look-ups and clones — never an API call or a scan of every Machine.
//!
//! The parts: [`watch`] (the watches that fill the state), `index` (the watched objects, indexed
//! by KubeadmControlPlane), `probes` (the latest etcd probe of each cluster and what the probes
//! have established) and `lookup` (what a review, the prober and the status writer read:
//! [`ClusterState::control_plane`], [`ClusterState::probe_targets`], ...); [`ClusterState`] and
//! the watch events it takes are here.

mod index;
mod lookup;
mod probes;
pub mod watch;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use crate::capi::{CapiCluster, CapiHealthCheck, CapiKcp, CapiMachine};
use index::{Index, key_of};
use probes::Origin;
use quorumguard_engine::Belief;

pub use lookup::{KcpForAutopilot, Lookup, ProbeTarget};
pub use probes::{HealthEntry, ProbeTiming};

/// `(namespace, name)`.
pub type Key = (String, String);

/// Which of the watched kinds an event or a sync flag is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Cluster,
    Kcp,
    Machine,
    /// MachineHealthChecks: read for the next action (whether a remediation can happen), never
    /// needed by a review, so not in [`Kind::ALL`]: a guard that may not list them still judges.
    HealthCheck,
}

impl Kind {
    /// The kinds every review needs: the caches are synced when these are.
    pub const ALL: [Kind; 3] = [Kind::Cluster, Kind::Kcp, Kind::Machine];
    /// Every watched kind.
    pub const WATCHED: [Kind; 4] = [Kind::Cluster, Kind::Kcp, Kind::Machine, Kind::HealthCheck];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Cluster => "clusters",
            Kind::Kcp => "kubeadmcontrolplanes",
            Kind::Machine => "machines",
            Kind::HealthCheck => "machinehealthchecks",
        }
    }

    fn index(self) -> usize {
        match self {
            Kind::Cluster => 0,
            Kind::Kcp => 1,
            Kind::Machine => 2,
            Kind::HealthCheck => 3,
        }
    }
}

/// One watched object, already converted.
#[derive(Clone, Debug)]
pub enum Object {
    Cluster(CapiCluster),
    Kcp(CapiKcp),
    Machine(CapiMachine),
    HealthCheck(CapiHealthCheck),
}

impl Object {
    fn kind(&self) -> Kind {
        match self {
            Object::Cluster(_) => Kind::Cluster,
            Object::Kcp(_) => Kind::Kcp,
            Object::Machine(_) => Kind::Machine,
            Object::HealthCheck(_) => Kind::HealthCheck,
        }
    }
}

/// What a review reads. Shared by the watch tasks (writers) and the webhook (reader).
#[derive(Default)]
pub struct ClusterState {
    index: RwLock<Index>,
    synced: [AtomicBool; 4],
    /// Why MachineHealthChecks cannot be listed (the watch's last error), until they are.
    health_check_error: RwLock<Option<String>>,
    /// Cluster key -> latest probe. Filled by the etcd prober.
    health: RwLock<HashMap<Key, HealthEntry>>,
    /// Cluster key -> why the last probe failed, when it did.
    probe_errors: RwLock<HashMap<Key, String>>,
    /// Cluster key -> how long its latest probe took.
    probe_took: RwLock<HashMap<Key, Duration>>,
    /// Cluster key -> where the time of its latest probe went.
    probe_timing: RwLock<HashMap<Key, ProbeTiming>>,
    /// Notified when a control-plane Machine appears or goes: the prober sweeps soon after.
    machines_changed: tokio::sync::Notify,
    /// Cluster key -> what its probes have established ([`ClusterState::observe_probe`]).
    beliefs: Mutex<HashMap<Key, Belief>>,
    /// The origin of the monotonic times the beliefs are judged at.
    origin: Origin,
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
        if kind == Kind::HealthCheck {
            self.set_health_check_error(None);
        }
    }

    /// Why MachineHealthChecks cannot be read (a failed list or watch), or `None` once they are.
    pub fn set_health_check_error(&self, e: Option<String>) {
        *self
            .health_check_error
            .write()
            .unwrap_or_else(|e| e.into_inner()) = e;
    }

    pub fn is_synced(&self, kind: Kind) -> bool {
        self.synced[kind.index()].load(Ordering::SeqCst)
    }

    pub fn all_synced(&self) -> bool {
        Kind::ALL.iter().all(|k| self.is_synced(*k))
    }

    fn write_index(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        // A panic while holding the lock leaves the index consistent per operation: keep going.
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// A copy of a cached object for a reader: a Cluster, a KubeadmControlPlane, a Machine, or the
/// member list of a recorded probe, copied into what a review, the prober or the status writer
/// is handed. Every such copy out of the caches is made here, so that the tests can count the
/// copies a review makes (`clones`, with the `testkit` feature) and hold it to its budget
/// (crates/testkit/src/budgets.rs). Without the feature this is `clone`, nothing more.
fn copy_out<T: Clone>(cached: &T) -> T {
    #[cfg(feature = "testkit")]
    clones::count();
    cached.clone()
}

/// How many cached objects this thread has copied out of the caches (`copy_out`), for the
/// tests' budget of copies per review: a review decided on one thread (synchronously, or on a
/// current-thread runtime) is counted whole, and tests running at once on other threads do not
/// disturb the count. Only with the `testkit` feature (the tests'); the product counts nothing.
#[cfg(feature = "testkit")]
pub mod clones {
    use std::cell::Cell;

    thread_local! {
        static MADE: Cell<u64> = const { Cell::new(0) };
    }

    pub(super) fn count() {
        MADE.with(|n| n.set(n.get() + 1));
    }

    /// Copies of cached objects made on this thread so far.
    pub fn made() -> u64 {
        MADE.with(Cell::get)
    }
}

#[cfg(test)]
mod tests;
