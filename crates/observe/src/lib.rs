//! quorumguard's service: everything that adapts the outside world to the [`engine`]'s rules.
//!
//! - [`admission`]: the validating webhook (HTTPS, AdmissionReview in, verdict out, Events);
//! - [`state`]: the watch cache of Machines and KCPs the webhook decides on;
//! - [`etcd`]: the prober that asks each workload cluster's etcd who its members are;
//! - [`status`]: the KCP conditions it publishes, and [`lease`], who publishes them;
//! - [`capi`], [`dumps`]: Cluster API objects and kubectl/etcdctl dumps read into the model;
//! - [`certs`], [`tls`]: the serving certificate and its reload; [`telemetry`]: logs, metrics;
//! - [`server`] puts them together for `quorumguard serve`; [`cli`] is the production command line.
//!
//! It must not decide anything itself: every verdict, condition and next action comes from
//! [`engine`] (re-exported here from the `quorumguard-engine` crate), so `check`, `status`, the
//! webhook and the enricher agree. It never depends on the playground.

pub mod admission;
pub mod capi;
pub mod certs;
pub mod cli;
pub mod dumps;
/// The rules (the `quorumguard-engine` crate), under the name every module here uses.
pub use quorumguard_engine as engine;
pub mod etcd;
/// The fuzz targets' bodies (fuzz/): only in tests and under cargo-fuzz.
#[cfg(any(test, fuzzing))]
pub mod fuzz_targets;
pub mod lease;
pub mod server;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod tls;

/// Seconds since the Unix epoch, for the engine's `now_unix` inputs (the engine itself never
/// reads a clock). A clock before 1970 reads as 0.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
