//! Where to reach a workload cluster's etcd.
//!
//! Two questions: which endpoints to ask for the member list ([`Transport::list_endpoints`]),
//! and which endpoint to dial for one member's status and health
//! ([`Transport::member_endpoint`]). The prober asks a [`Transport`] both and never needs to know
//! which one it has.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use super::portforward::{PortForward, PortForwardError};
use quorumguard_engine::model::Member;

/// Cluster annotation overriding the etcd endpoints: comma-separated URLs. For clusters whose
/// Machine addresses are not reachable from the management cluster (a NAT, a load balancer in
/// front of etcd) or are not in the serving certificates. Direct transport only.
pub const ETCD_ENDPOINTS_ANNOTATION: &str = "quorumguard.io/etcd-endpoints";

/// The port etcd serves clients on in kubeadm's stacked etcd.
pub const ETCD_CLIENT_PORT: u16 = 2379;

/// Cluster annotation choosing the transport for one cluster (`port-forward` or `direct`),
/// overriding the `--etcd-transport` flag.
pub const ETCD_TRANSPORT_ANNOTATION: &str = "quorumguard.io/etcd-transport";

/// The host name the port-forward transport verifies etcd's serving certificate against.
///
/// Why a fixed name: through a port-forward the member is dialled at a loopback listener of
/// ours, whose address says nothing about which member it is, so the URL's host is not what to
/// verify. KCP verifies the chain only. Checking a name as well is a little stronger and costs
/// nothing as long as every real serving certificate carries it, and kubeadm's etcd serving
/// certificate always does: its SANs are the node name and `localhost`, plus the IPs of the
/// advertise address, `127.0.0.1` and `::1` (`etcd.serverCertSANs` can only add to them). Seen
/// from inside the pod, which is where a port-forward lands, the member *is* `localhost:2379`.
/// The chain is verified against the cluster's etcd CA as for the direct transport (tonic's
/// rustls verifier, the same as for every other etcd connection: no custom verifier to get
/// wrong), and which member answered is checked separately: a status whose header names
/// another member than the one listed is reported as such.
pub const PORT_FORWARD_TLS_NAME: &str = "localhost";

/// Which way to reach a cluster's etcd: chosen by flag, overridable per Cluster by
/// [`ETCD_TRANSPORT_ANNOTATION`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum TransportKind {
    /// Through the workload cluster's API server to pod `kube-system/etcd-<node>`, as KCP does:
    /// needs only the `<cluster>-kubeconfig` Secret, no route to the nodes.
    #[default]
    PortForward,
    /// To the endpoints annotation, else each control-plane Machine's InternalIP, port 2379.
    Direct,
}

impl TransportKind {
    /// The transport a Cluster's [`ETCD_TRANSPORT_ANNOTATION`] asks for (`port-forward` or
    /// `direct`, any case), `default` without one; an unknown value is an error that names the
    /// annotation and the accepted values.
    pub fn for_cluster(
        annotation: Option<&str>,
        default: TransportKind,
    ) -> Result<Self, UnknownTransport> {
        let Some(value) = annotation.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(default);
        };
        <TransportKind as clap::ValueEnum>::from_str(value, true).map_err(|_| UnknownTransport {
            value: value.to_string(),
        })
    }

    /// `port-forward` or `direct`, as the flag and the annotation spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::PortForward => "port-forward",
            TransportKind::Direct => "direct",
        }
    }
}

/// A [`ETCD_TRANSPORT_ANNOTATION`] value that names no transport.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "annotation {ETCD_TRANSPORT_ANNOTATION}: {value:?} is not a transport: use port-forward or \
     direct"
)]
pub struct UnknownTransport {
    pub value: String,
}

/// How the prober reaches etcd members.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum Transport {
    /// Dial the URLs as they are: the endpoints from [`endpoints_for`] for the member list, and
    /// each member's first advertised client URL for its status and health. Needs routes from
    /// the management cluster to the control-plane nodes; the serving certificates name the node
    /// IPs (kubeadm puts them in), so the host name is verified as usual.
    #[default]
    Direct,
    /// Through the workload cluster's API server to pod `kube-system/etcd-<name>` port 2379, as
    /// KCP does: the member list from the pods of the control-plane Machines' nodes, each member
    /// from the pod named after it. Each pod is dialled at a loopback listener of the
    /// [`PortForward`]; the serving certificate is verified for [`PORT_FORWARD_TLS_NAME`].
    PortForward(Arc<PortForward>),
}

impl Transport {
    /// The port-forward transport over `pf`.
    pub fn port_forward(pf: PortForward) -> Self {
        Transport::PortForward(Arc::new(pf))
    }

    pub fn kind(&self) -> TransportKind {
        match self {
            Transport::Direct => TransportKind::Direct,
            Transport::PortForward(_) => TransportKind::PortForward,
        }
    }

    /// The endpoints to ask for the member list. Direct: [`endpoints_for`] the endpoints
    /// annotation and the Machines' InternalIPs. Port-forward: the pod `etcd-<node>` of each of
    /// `node_names` (the control-plane Machines' `status.nodeRef.name`), in order; the other two
    /// are not used.
    pub fn list_endpoints(
        &self,
        endpoints_annotation: Option<&str>,
        machine_internal_ips: &[String],
        node_names: &[String],
    ) -> Result<Vec<String>, PortForwardError> {
        match self {
            Transport::Direct => Ok(endpoints_for(endpoints_annotation, machine_internal_ips)),
            Transport::PortForward(pf) => {
                let mut out = Vec::with_capacity(node_names.len());
                for node in node_names
                    .iter()
                    .map(|n| n.trim())
                    .filter(|n| !n.is_empty())
                {
                    let url = pf.endpoint_for_node(node)?;
                    if !out.contains(&url) {
                        out.push(url);
                    }
                }
                Ok(out)
            }
        }
    }

    /// The endpoint to dial for one member, `Ok(None)` when this transport cannot reach it (a
    /// member added but not started has no client URLs and no name yet).
    pub fn member_endpoint(&self, member: &Member) -> Result<Option<String>, PortForwardError> {
        match self {
            Transport::Direct => Ok(member.client_urls.first().map(|u| normalize_url(u))),
            Transport::PortForward(_) if member.name.is_empty() => Ok(None),
            Transport::PortForward(pf) => pf.endpoint_for_node(&member.name).map(Some),
        }
    }

    /// The host name to verify serving certificates for, when it is not the URL's.
    pub fn tls_name(&self) -> Option<&'static str> {
        match self {
            Transport::Direct => None,
            Transport::PortForward(_) => Some(PORT_FORWARD_TLS_NAME),
        }
    }

    /// Why the transport itself failed for `url` at or after `since`, when it knows better than
    /// the etcd client (a port-forward refused by the API server or the kubelet).
    pub fn forward_error(&self, url: &str, since: Instant) -> Option<String> {
        match self {
            Transport::Direct => None,
            Transport::PortForward(pf) => pf.forward_error(url, since),
        }
    }

    /// Releases what the transport keeps for endpoints not in `used` (port-forward listeners).
    pub fn retain(&self, used: &HashSet<&str>) {
        if let Transport::PortForward(pf) = self {
            pf.retain(used);
        }
    }
}

/// The endpoints to ask for the member list: the Cluster's [`ETCD_ENDPOINTS_ANNOTATION`] when it
/// names at least one URL, else `https://<ip>:2379` for each control-plane Machine InternalIP.
///
/// URLs without a scheme get `https://`; blanks, duplicates and addresses that are not IP
/// addresses are dropped (an InternalIP is always an IP). Order is kept: the prober asks them in
/// turn.
pub fn endpoints_for(
    cluster_annotation: Option<&str>,
    machine_internal_ips: &[String],
) -> Vec<String> {
    let from_annotation: Vec<String> = cluster_annotation
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(normalize_url)
        .collect();
    if !from_annotation.is_empty() {
        return dedup(from_annotation);
    }
    dedup(
        machine_internal_ips
            .iter()
            .filter_map(|ip| match ip.trim().parse::<IpAddr>() {
                Ok(IpAddr::V4(v4)) => Some(format!("https://{v4}:{ETCD_CLIENT_PORT}")),
                Ok(IpAddr::V6(v6)) => Some(format!("https://[{v6}]:{ETCD_CLIENT_PORT}")),
                Err(_) => None,
            })
            .collect(),
    )
}

/// Drops repeats, keeping the first of each.
fn dedup(urls: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(urls.len());
    for url in urls {
        if !out.contains(&url) {
            out.push(url);
        }
    }
    out
}

/// `https://` for a URL without a scheme (etcd-client would otherwise pick by the TLS options),
/// and no trailing slash, so that the same endpoint is always the same cache key.
fn normalize_url(url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    if url.contains("://") {
        url.to_string()
    } else {
        format!("https://{url}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn machine_ips_become_https_urls_on_2379() {
        assert_eq!(
            endpoints_for(
                None,
                &ips(&["10.0.0.5", " 10.0.0.6 ", "fd00::7", "10.0.0.5"])
            ),
            [
                "https://10.0.0.5:2379",
                "https://10.0.0.6:2379",
                "https://[fd00::7]:2379"
            ]
        );
    }

    #[test]
    fn non_ip_addresses_are_dropped() {
        assert_eq!(
            endpoints_for(None, &ips(&["", "node-1.example", "10.0.0.1"])),
            ["https://10.0.0.1:2379"]
        );
        assert!(endpoints_for(None, &[]).is_empty());
    }

    #[test]
    fn the_annotation_wins() {
        assert_eq!(
            endpoints_for(
                Some(" https://etcd.example:2379/ ,,10.1.1.1:32379, https://etcd.example:2379"),
                &ips(&["10.0.0.5"])
            ),
            ["https://etcd.example:2379", "https://10.1.1.1:32379"]
        );
    }

    #[test]
    fn an_empty_annotation_falls_back_to_machine_ips() {
        for annotation in ["", " , ", ","] {
            assert_eq!(
                endpoints_for(Some(annotation), &ips(&["10.0.0.5"])),
                ["https://10.0.0.5:2379"]
            );
        }
    }

    #[test]
    fn direct_transport_dials_the_first_client_url() {
        let mut m = Member::new(1, "m1");
        assert_eq!(Transport::Direct.member_endpoint(&m).expect("direct"), None);
        m.client_urls = ips(&["https://10.0.0.5:2379/", "https://127.0.0.1:2379"]);
        assert_eq!(
            Transport::default()
                .member_endpoint(&m)
                .expect("direct")
                .as_deref(),
            Some("https://10.0.0.5:2379")
        );
        assert_eq!(Transport::Direct.tls_name(), None);
        assert_eq!(
            Transport::Direct
                .list_endpoints(Some("https://a:2379"), &ips(&["10.0.0.5"]), &ips(&["n1"]))
                .expect("direct"),
            ["https://a:2379"]
        );
    }

    #[test]
    fn the_annotation_chooses_the_transport() {
        use TransportKind::*;
        assert_eq!(TransportKind::default(), PortForward);
        assert_eq!(TransportKind::for_cluster(None, Direct), Ok(Direct));
        assert_eq!(TransportKind::for_cluster(Some(" "), Direct), Ok(Direct));
        assert_eq!(
            TransportKind::for_cluster(Some("port-forward"), Direct),
            Ok(PortForward)
        );
        assert_eq!(
            TransportKind::for_cluster(Some(" Direct "), PortForward),
            Ok(Direct)
        );
        assert_eq!(
            TransportKind::for_cluster(Some("ssh"), Direct)
                .expect_err("unknown")
                .to_string(),
            "annotation quorumguard.io/etcd-transport: \"ssh\" is not a transport: use \
             port-forward or direct"
        );
        assert_eq!(PortForward.as_str(), "port-forward");
        assert_eq!(Direct.as_str(), "direct");
    }

    #[tokio::test]
    async fn port_forward_reaches_pods_named_after_nodes_and_members() {
        // The server is never contacted here: listeners are made, nothing dials them.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let t = Transport::port_forward(PortForward::new(client, "http://127.0.0.1:9"));
        assert_eq!(t.tls_name(), Some("localhost"));
        let listed = t
            .list_endpoints(
                Some("https://ignored:2379"),
                &ips(&["10.0.0.5"]),
                &ips(&["n1", "", "n2", "n1"]),
            )
            .expect("listeners");
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().all(|u| u.starts_with("https://127.0.0.1:")));
        // A member is reached at the pod named after it: the same listener as its node's.
        let mut m = Member::new(1, "n2");
        m.client_urls = ips(&["https://10.0.0.6:2379"]);
        assert_eq!(
            t.member_endpoint(&m).expect("listener").as_ref(),
            Some(&listed[1])
        );
        // An unstarted member has no name, so no pod.
        assert_eq!(t.member_endpoint(&Member::new(2, "")).expect("none"), None);
        let Transport::PortForward(pf) = &t else {
            panic!("port-forward")
        };
        assert_eq!(pf.pods(), ["etcd-n1", "etcd-n2"]);
        t.retain(&HashSet::from([listed[0].as_str()]));
        assert_eq!(pf.pods(), ["etcd-n1"]);
    }
}
