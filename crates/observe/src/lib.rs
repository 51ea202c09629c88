//! What quorumguard knows about the world, and how it learns it: read, never decided.
//!
//! - [`capi`], [`dumps`]: Cluster API objects (from a watch, a review or a `kubectl` dump) and
//!   `etcdctl` dumps, read into the engine's model;
//! - [`state`]: the watch cache of Machines and KCPs, and the record of the latest etcd probes
//!   the webhook and the status writer decide on;
//! - [`etcd`]: reading a workload cluster's etcd: the transports (direct, port-forward), the
//!   prober, the sweep that probes every cluster on a timer, and the fresh probes a review asks
//!   for.
//!
//! It may depend on `quorumguard-engine` (the model it reads into), `quorumguard-pki` (etcd client
//! certificates) and `quorumguard-telemetry` (the fresh probes' metrics), and on nothing above it:
//! the webhook (`quorumguard-admission`) and the status writer (`quorumguard-status`) read it,
//! never the other way round (tests/it/architecture.rs). It must not decide anything itself: every
//! verdict, condition and next action comes from the engine.

pub mod capi;
pub mod dumps;
pub mod etcd;
pub mod state;

/// Seconds since the Unix epoch, for the engine's `now_unix` inputs (the engine itself never
/// reads a clock). A clock before 1970 reads as 0.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
