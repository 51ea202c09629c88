//! quorumguard keeps etcd quorum safe on Cluster API KubeadmControlPlane clusters.
//!
//! The [`engine`] is a pure core; everything else adapts the outside world to it.

pub mod admission;
pub mod capi;
pub mod certs;
pub mod cli;
pub mod dumps;
pub mod engine;
pub mod etcd;
/// The fuzz targets' bodies (fuzz/): only in tests and under cargo-fuzz.
#[cfg(any(test, fuzzing))]
pub mod fuzz_targets;
pub mod lease;
pub mod playground;
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
