//! quorumguard keeps etcd quorum safe on Cluster API KubeadmControlPlane clusters.
//!
//! This package is the binary and a facade over the workspace's crates, so every path a test,
//! a bench or the fuzz targets used before the split still reads `quorumguard::...`: each crate
//! (or each of its modules) under the module name it had in the one guard crate.
//!
//! - `quorumguard-engine` ([`engine`]): the rules, pure and synchronous, no I/O;
//! - `quorumguard-pki` ([`certs`], [`tls`]; etcd's client certificates are [`etcd::certs`]):
//!   every certificate and TLS configuration;
//! - `quorumguard-telemetry` ([`telemetry`]): logs, metrics, readiness, the admin endpoints;
//! - `quorumguard-observe` ([`capi`], [`dumps`], [`state`], [`etcd`], [`unix_now`]): what the
//!   guard knows about the world: objects, dumps, the caches, reading etcd;
//! - `quorumguard-admission` ([`admission`]): the webhook;
//! - `quorumguard-status` ([`status`], [`lease`]): the KCP conditions and their Lease-gated writer;
//! - `quorumguard-cli` ([`cli`], [`server`]): every production command and `serve`'s assembly;
//! - `quorumguard-playground` ([`playground`], with the default `playground` feature): the
//!   playground and its API-server stand-in, never used by `serve`.
//!
//! Dependencies run one way (docs/architecture.md, tests/it/architecture.rs): engine ← pki,
//! telemetry ← observe ← admission, status ← cli ← playground ← this package.

pub use quorumguard_admission as admission;
pub use quorumguard_engine as engine;
pub use quorumguard_observe::{capi, dumps, etcd, state, unix_now};
pub use quorumguard_pki::{certs, tls};
pub use quorumguard_status as status;
pub use quorumguard_status::lease;
pub use quorumguard_telemetry as telemetry;

/// The fuzz targets' bodies (fuzz/): only under cargo-fuzz.
pub use quorumguard_cli::server;

#[cfg(feature = "playground")]
pub use quorumguard_playground as playground;

pub mod cli;
