//! Every certificate and TLS configuration quorumguard makes or reads, in one place.
//!
//! - [`certs`]: the CA behind `quorumguard certs`, the webhook's serving and client
//!   certificates, and the certificate facts (validity, names) the commands report;
//! - [`tls`]: the webhook's serving TLS configuration, its client authentication and its reload
//!   from disk;
//! - [`etcd`]: client certificates for a workload cluster's etcd, signed with that cluster's etcd
//!   CA as KCP does, and the rustls client configuration built from them ([`etcd::ClientTls`]).
//!
//! It may depend on no other quorumguard crate (tests/it/architecture.rs holds it to that): it knows
//! certificates, not Cluster API, etcd's members or the engine's rules.

pub mod certs;
pub mod etcd;
pub mod tls;
