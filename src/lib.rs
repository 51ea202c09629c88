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
pub mod lease;
pub mod playground;
pub mod server;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod tls;
