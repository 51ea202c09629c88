//! The port-forward transport: etcd members reached through the workload cluster's own API
//! server, as KCP reaches them — port-forward to pod `kube-system/etcd-<node>`, port 2379.
//!
//! Why this way: the management cluster usually has no route to the control-plane nodes' etcd
//! port (and should not need one), but it always reaches the workload API server: Cluster API
//! keeps that cluster's admin kubeconfig in Secret `<cluster>-kubeconfig` (key `value`).
//!
//! How: etcd-client dials URLs itself and cannot be handed a stream, so each etcd pod gets a
//! loopback listener (`127.0.0.1:0`) for as long as the probe uses it. Every TCP connection
//! accepted there opens one port-forward WebSocket (the request and upgrade of kube's
//! [`Api::portforward`], the protocol's framing in `relay`, with a small read buffer) and copies
//! bytes both ways; the prober dials `https://127.0.0.1:<local port>` as if it were the member.
//!
//! The listeners carry only the TLS stream between etcd-client and etcd, which etcd
//! authenticates end to end (`--client-cert-auth`): another process in quorumguard's network
//! namespace that connects to one gets a TCP path to etcd's port and nothing more — no
//! certificate, no Kubernetes credential.
//!
//! Lifecycle: a [`PortForward`] belongs to one [`Prober`] of one cluster. Its listeners go when
//! the prober stops using a pod ([`PortForward::retain`]) and all at once when it is dropped (the
//! sweep replaces the prober when the kubeconfig, the CA or the transport changes, and drops it
//! when the Cluster goes). Dropping a listener aborts its accept task, whose [`JoinSet`] aborts
//! every relay, each of which owns its WebSocket: no task, socket or stream outlives it.
//!
//! Errors: a failed port-forward (an unknown pod: 404; the API server unreachable; the kubelet
//! unable to reach the pod's port) is recorded on the listener before the accepted connection is
//! closed, so the prober can report it ([`PortForward::forward_error`]) instead of etcd-client's
//! "connection closed", which says nothing about why.
//!
//! The parts: `kubeconfig` (the workload kubeconfig: its Secret, and the inline credentials only
//! that are accepted from it) and `relay` (a pod's loopback listener, its accept loop, and the
//! relays through port-forward WebSockets); [`PortForward`], one listener per pod, is here.
//!
//! [`Api::portforward`]: kube::Api::portforward
//! [`JoinSet`]: tokio::task::JoinSet
//! [`Prober`]: super::Prober

mod kubeconfig;
mod relay;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use kube::Client;
use thiserror::Error;

use super::endpoints::{ETCD_CLIENT_PORT, ETCD_TRANSPORT_ANNOTATION};
use relay::Forward;

pub use kubeconfig::{KUBECONFIG_KEY, kubeconfig_secret_name, read_kubeconfig};

/// The namespace of kubeadm's static etcd pods.
pub const ETCD_POD_NAMESPACE: &str = "kube-system";

/// The static pod of kubeadm's stacked etcd member on node `node`: `etcd-<node>` (kubeadm names
/// the member after the node, so a member's name gives its pod too).
pub fn etcd_pod_name(node: &str) -> String {
    format!("etcd-{node}")
}

/// Why the port-forward transport cannot be set up for a cluster. Every message names the
/// object at fault and what to do.
#[derive(Debug, Error)]
pub enum PortForwardError {
    #[error(
        "Cluster {namespace}/{cluster}: Secret {namespace}/{cluster}-kubeconfig not found: the \
         port-forward transport needs the workload kubeconfig; set {ETCD_TRANSPORT_ANNOTATION}: \
         direct to dial etcd directly"
    )]
    KubeconfigNotFound { namespace: String, cluster: String },
    #[error(
        "Cluster {namespace}/{cluster}: reading Secret {namespace}/{cluster}-kubeconfig: {error}"
    )]
    KubeconfigRead {
        namespace: String,
        cluster: String,
        error: String,
    },
    #[error(
        "Cluster {namespace}/{cluster}: Secret {namespace}/{cluster}-kubeconfig has no key \
         `{KUBECONFIG_KEY}` (Cluster API keeps the workload kubeconfig there); set \
         {ETCD_TRANSPORT_ANNOTATION}: direct to dial etcd directly"
    )]
    KubeconfigNoValue { namespace: String, cluster: String },
    #[error(
        "Cluster {namespace}/{cluster}: Secret {namespace}/{cluster}-kubeconfig key \
         `{KUBECONFIG_KEY}` is not a usable kubeconfig: {problem}"
    )]
    KubeconfigInvalid {
        namespace: String,
        cluster: String,
        problem: String,
    },
    #[error("port-forward to {namespace}/{pod}: cannot listen on 127.0.0.1: {error}")]
    Listen {
        namespace: String,
        pod: String,
        error: String,
    },
}

/// A kube error as a human reads it: an API server's Status as `<code> <reason>: <message>`,
/// anything else with its causes.
pub(crate) fn kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => {
            let mut text = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                let part = cause.to_string();
                if !part.is_empty() && !text.contains(&part) {
                    text.push_str(": ");
                    text.push_str(&part);
                }
                source = cause.source();
            }
            text
        }
    }
}

/// Reaches a workload cluster's etcd pods through its API server's port-forward subresource.
/// One per cluster (see the module comment for the lifecycle).
pub struct PortForward {
    client: Client,
    server: String,
    namespace: String,
    port: u16,
    /// Pod name -> its listener.
    forwards: Mutex<HashMap<String, Forward>>,
}

impl fmt::Debug for PortForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortForward")
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .field("port", &self.port)
            .field("pods", &self.pods())
            .finish_non_exhaustive()
    }
}

impl PortForward {
    /// Port-forwards through `client` (the workload cluster's API server at `server`, named in
    /// messages) to etcd pods in `kube-system`, port 2379.
    pub fn new(client: Client, server: impl Into<String>) -> Self {
        PortForward {
            client,
            server: server.into(),
            namespace: ETCD_POD_NAMESPACE.to_string(),
            port: ETCD_CLIENT_PORT,
            forwards: Mutex::new(HashMap::new()),
        }
    }

    /// The workload API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The pods a listener is kept for, sorted.
    pub fn pods(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().keys().cloned().collect();
        v.sort();
        v
    }

    /// The local URL reaching pod `etcd-<node>` (a member's name is its node's): an existing
    /// listener's, or a new one's.
    pub fn endpoint_for_node(&self, node: &str) -> Result<String, PortForwardError> {
        self.endpoint_for_pod(&etcd_pod_name(node))
    }

    /// The local URL reaching pod `pod` in `kube-system`, port 2379.
    pub fn endpoint_for_pod(&self, pod: &str) -> Result<String, PortForwardError> {
        let mut forwards = self.lock();
        if let Some(f) = forwards.get(pod) {
            return Ok(f.url.clone());
        }
        let forward = self.listen(pod).map_err(|error| PortForwardError::Listen {
            namespace: self.namespace.clone(),
            pod: pod.to_string(),
            error,
        })?;
        let url = forward.url.clone();
        forwards.insert(pod.to_string(), forward);
        Ok(url)
    }

    /// The latest port-forward failure behind local URL `url`, if it happened at or after
    /// `since` (so a failure from an earlier probe is not blamed for this one).
    pub fn forward_error(&self, url: &str, since: Instant) -> Option<String> {
        let forwards = self.lock();
        let f = forwards.values().find(|f| f.url == url)?;
        let last = f.pod.last_error.lock().unwrap_or_else(|e| e.into_inner());
        last.as_ref()
            .filter(|(at, _)| *at >= since)
            .map(|(_, text)| text.clone())
    }

    /// Keeps the listeners whose URL is in `used`; the others are closed with their relays.
    pub fn retain(&self, used: &HashSet<&str>) {
        let gone: Vec<Forward> = {
            let mut forwards = self.lock();
            let drop: Vec<String> = forwards
                .iter()
                .filter(|(_, f)| !used.contains(f.url.as_str()))
                .map(|(pod, _)| pod.clone())
                .collect();
            drop.iter().filter_map(|p| forwards.remove(p)).collect()
        };
        drop(gone);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Forward>> {
        self.forwards.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::time::Duration;
    use tokio::net::TcpStream;

    /// Inline credentials; the server is port 9 on loopback, where nothing listens, so a
    /// connection attempt is refused at once and nothing leaves the machine.
    const INLINE: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: w
  cluster:
    server: https://127.0.0.1:9
contexts:
- name: w
  context: {cluster: w, user: admin}
current-context: w
users:
- name: admin
  user:
    token: abc
"#;

    #[test]
    fn names_follow_kubeadm_and_cluster_api() {
        assert_eq!(etcd_pod_name("cp-0"), "etcd-cp-0");
        assert_eq!(kubeconfig_secret_name("demo"), "demo-kubeconfig");
    }

    #[tokio::test]
    async fn inline_kubeconfigs_are_accepted() {
        let pf = PortForward::from_kubeconfig(INLINE, "ns", "c")
            .await
            .expect("inline kubeconfig");
        assert_eq!(pf.server(), "https://127.0.0.1:9");
        assert!(pf.pods().is_empty());
    }

    #[tokio::test]
    async fn kubeconfigs_that_run_commands_or_read_files_are_refused() {
        for (field, value) in [
            (
                "tokenFile",
                "/var/run/secrets/kubernetes.io/serviceaccount/token",
            ),
            ("client-certificate", "/etc/passwd"),
            (
                "exec",
                "{apiVersion: client.authentication.k8s.io/v1, command: sh}",
            ),
        ] {
            let yaml = INLINE.replace("token: abc", &format!("{field}: {value}"));
            let err = PortForward::from_kubeconfig(&yaml, "ns", "c")
                .await
                .expect_err(field);
            let text = err.to_string();
            assert!(
                text.starts_with("Cluster ns/c: Secret ns/c-kubeconfig key `value` is not a usable kubeconfig: user \"admin\" uses"),
                "{text}"
            );
        }
        let yaml = INLINE.replace(
            "server: https://127.0.0.1:9",
            "server: https://127.0.0.1:9\n    certificate-authority: /etc/ca.crt",
        );
        let err = PortForward::from_kubeconfig(&yaml, "ns", "c")
            .await
            .expect_err("CA file");
        assert!(
            err.to_string().contains("certificate-authority file"),
            "{err}"
        );
        let err = PortForward::from_kubeconfig("not: [a kubeconfig", "ns", "c")
            .await
            .expect_err("garbage");
        assert!(
            err.to_string().contains("is not a usable kubeconfig"),
            "{err}"
        );
    }

    #[test]
    fn the_missing_secret_says_what_to_do() {
        let e = PortForwardError::KubeconfigNotFound {
            namespace: "ns".into(),
            cluster: "c".into(),
        };
        assert_eq!(
            e.to_string(),
            "Cluster ns/c: Secret ns/c-kubeconfig not found: the port-forward transport needs \
             the workload kubeconfig; set quorumguard.io/etcd-transport: direct to dial etcd \
             directly"
        );
    }

    #[tokio::test]
    async fn listeners_are_kept_per_pod_and_closed_when_unused_or_dropped() {
        let pf = PortForward::from_kubeconfig(INLINE, "ns", "c")
            .await
            .expect("kubeconfig");
        let a = pf.endpoint_for_node("a").expect("listener a");
        let b = pf.endpoint_for_pod("etcd-b").expect("listener b");
        assert_ne!(a, b);
        assert_eq!(
            pf.endpoint_for_node("a").expect("again"),
            a,
            "one listener per pod"
        );
        assert_eq!(pf.pods(), ["etcd-a", "etcd-b"]);
        let addr =
            |url: &str| -> SocketAddr { url.trim_start_matches("https://").parse().expect("addr") };
        assert!(TcpStream::connect(addr(&a)).await.is_ok(), "a listens");

        pf.retain(&HashSet::from([a.as_str()]));
        assert_eq!(pf.pods(), ["etcd-a"]);
        assert!(closed(addr(&b)).await, "b's listener is closed once unused");
        drop(pf);
        assert!(
            closed(addr(&a)).await,
            "a's listener is closed with its PortForward"
        );
    }

    /// Whether connecting to `addr` is refused within a bounded wait (an aborted task drops
    /// its listener the next time the runtime gets to it).
    async fn closed(addr: SocketAddr) -> bool {
        for _ in 0..100 {
            if TcpStream::connect(addr).await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }
}
