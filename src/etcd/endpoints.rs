//! Where to reach a workload cluster's etcd.
//!
//! Two questions: which endpoints to ask for the member list ([`endpoints_for`]), and which
//! endpoint to dial for one member's status and health ([`Transport::member_endpoint`]). Only the
//! direct transport exists today; port-forwarding through the workload API server (as KCP does)
//! is meant to become a second [`Transport`] variant without changing the prober.

use std::net::IpAddr;

use crate::engine::model::Member;

/// Cluster annotation overriding the etcd endpoints: comma-separated URLs. For clusters whose
/// Machine addresses are not reachable from the management cluster (a NAT, a load balancer in
/// front of etcd) or are not in the serving certificates.
pub const ETCD_ENDPOINTS_ANNOTATION: &str = "quorumguard.io/etcd-endpoints";

/// The port etcd serves clients on in kubeadm's stacked etcd.
pub const ETCD_CLIENT_PORT: u16 = 2379;

/// Cluster annotation choosing the transport for one cluster (`port-forward` or `direct`),
/// overriding the `--etcd-transport` flag.
pub const ETCD_TRANSPORT_ANNOTATION: &str = "quorumguard.io/etcd-transport";

/// Which way to reach a cluster's etcd: chosen by flag, overridable per Cluster by
/// [`ETCD_TRANSPORT_ANNOTATION`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum TransportKind {
    /// Through the workload cluster's API server to pod `kube-system/etcd-<node>`, as KCP does.
    PortForward,
    /// To the endpoints annotation, else each control-plane Machine's InternalIP, port 2379.
    #[default]
    Direct,
}

/// How the prober reaches etcd members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// Dial the URLs as they are: the endpoints from [`endpoints_for`] for the member list, and
    /// each member's first advertised client URL for its status and health. Needs routes from
    /// the management cluster to the control-plane nodes; the serving certificates name the node
    /// IPs (kubeadm puts them in), so the host name is verified as usual.
    #[default]
    Direct,
    // Later: `PortForward { .. }` — through the workload cluster's API server to pod
    // `kube-system/etcd-<member name>` port 2379, as KCP does. Its `member_endpoint` maps a member
    // (by name) to a local forwarded address, and it verifies the serving certificate against
    // the CA without the host name.
}

impl Transport {
    /// The endpoint to dial for one member, or `None` when this transport cannot reach it (a
    /// member added but not started has no client URLs yet).
    pub fn member_endpoint(&self, member: &Member) -> Option<String> {
        match self {
            Transport::Direct => member.client_urls.first().map(|u| normalize_url(u)),
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
        assert_eq!(Transport::Direct.member_endpoint(&m), None);
        m.client_urls = ips(&["https://10.0.0.5:2379/", "https://127.0.0.1:2379"]);
        assert_eq!(
            Transport::default().member_endpoint(&m).as_deref(),
            Some("https://10.0.0.5:2379")
        );
    }
}
