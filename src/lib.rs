//! quorumguard keeps etcd quorum safe on Cluster API KubeadmControlPlane clusters.
//!
//! This package is the binary and a facade over the workspace's crates, so every path a test,
//! a bench or the fuzz targets used before the split still reads `quorumguard::...`:
//!
//! - `quorumguard-engine` ([`engine`]): the rules, pure and synchronous, no I/O;
//! - `quorumguard-guard` (everything else here: [`admission`], [`etcd`], [`status`], ...): the
//!   webhook, the prober, the status publisher, certificates and the production commands;
//! - `quorumguard-playground` ([`playground`], with the default `playground` feature): the
//!   playground and its API-server stand-in, never used by `serve`.
//!
//! Dependencies run one way: engine ← guard ← playground ← this package.

pub use quorumguard_guard::*;

#[cfg(feature = "playground")]
pub use quorumguard_playground as playground;

pub mod cli;
