//! Reading a workload cluster's etcd — never writing to it.
//!
//! - [`channel`]: the lean gRPC channel to one member (TCP, TLS with the cluster's one shared
//!   configuration, HTTP/2) under each kept etcd client: a few KiB instead of tonic's balanced
//!   channel, as the enricher keeps three per workload cluster.
//! - [`certs`]: a client certificate signed with the cluster's etcd CA, as KCP does.
//! - [`endpoints`]: where to reach etcd ([`Transport`], [`endpoints_for`]).
//! - [`portforward`]: the port-forward transport, through the workload cluster's API server to
//!   pod `kube-system/etcd-<node>` as KCP does ([`PortForward`]).
//! - [`prober`]: one probe = the member list, the alarms, and every member's status and health,
//!   asked in parallel under one deadline, turned into the engine's [`Member`]s.
//! - [`sweep`]: probe every cluster once and hand the results to the webhook's state.
//! - [`cycle`]: the loop that sweeps on a timer (and on Machine changes), with what follows each
//!   sweep handed in by the caller (the status enricher).
//!
//! [`Member`]: quorumguard_engine::model::Member

/// Client certificates for etcd, signed with the cluster's etcd CA: the `quorumguard-pki` crate's
/// [`quorumguard_pki::etcd`], under the name this module has always had.
pub use quorumguard_pki::etcd as certs;
pub mod channel;
pub mod cycle;
pub mod endpoints;
pub mod fresh;
pub mod portforward;
pub mod prober;
pub mod sweep;

pub use certs::{CertError, ClientCert, sign_client_cert};
pub use channel::ChannelError;
pub use endpoints::{
    ETCD_ENDPOINTS_ANNOTATION, ETCD_TRANSPORT_ANNOTATION, PORT_FORWARD_TLS_NAME, Transport,
    TransportKind, UnknownTransport, endpoints_for,
};
pub use portforward::{PortForward, PortForwardError};
pub use prober::{ClientTls, ClientTlsError, Probe, ProbeError, Prober, probe};
