//! The workload kubeconfig the port-forward transport connects with: read from Cluster API's
//! Secret `<cluster>-kubeconfig`, and accepted only with inline credentials.

use std::time::Duration;

use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Secret;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use tower::{BoxError, ServiceBuilder};

use super::{PortForward, PortForwardError, kube_error};

/// The key of Secret `<cluster>-kubeconfig` that holds the kubeconfig (Cluster API's).
pub const KUBECONFIG_KEY: &str = "value";

/// The name of Secret holding a cluster's workload kubeconfig.
pub fn kubeconfig_secret_name(cluster: &str) -> String {
    format!("{cluster}-kubeconfig")
}

/// Reads the workload kubeconfig of Cluster `namespace/cluster` from Secret
/// `<cluster>-kubeconfig`, key `value`, within `deadline`.
pub async fn read_kubeconfig(
    client: &Client,
    namespace: &str,
    cluster: &str,
    deadline: Duration,
) -> Result<String, PortForwardError> {
    let name = kubeconfig_secret_name(cluster);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let read = |error: String| PortForwardError::KubeconfigRead {
        namespace: namespace.to_string(),
        cluster: cluster.to_string(),
        error,
    };
    let secret = match tokio::time::timeout(deadline, secrets.get_opt(&name)).await {
        Ok(Ok(Some(s))) => s,
        Ok(Ok(None)) => {
            return Err(PortForwardError::KubeconfigNotFound {
                namespace: namespace.to_string(),
                cluster: cluster.to_string(),
            });
        }
        Ok(Err(e)) => return Err(read(kube_error(&e))),
        Err(_) => {
            return Err(read(format!(
                "no answer within {}",
                humantime::format_duration(deadline)
            )));
        }
    };
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(KUBECONFIG_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .filter(|v| !v.trim().is_empty());
    value.ok_or_else(|| PortForwardError::KubeconfigNoValue {
        namespace: namespace.to_string(),
        cluster: cluster.to_string(),
    })
}

/// Refuses what a kubeconfig taken from a Secret must not make quorumguard do: run a command
/// (`exec`, `auth-provider`) or read its own files (`tokenFile`, certificate and key paths: a
/// kubeconfig naming quorumguard's service-account token file and a server of its own choosing
/// would leak that token). Cluster API writes inline data only, so nothing real is refused.
fn check_inline_only(kc: &Kubeconfig) -> Result<(), String> {
    for c in &kc.clusters {
        if let Some(cluster) = &c.cluster
            && cluster.certificate_authority.is_some()
        {
            return Err(format!(
                "cluster {:?} names a certificate-authority file; only inline data \
                 (certificate-authority-data) is accepted from a Secret",
                c.name
            ));
        }
    }
    for a in &kc.auth_infos {
        let Some(user) = &a.auth_info else { continue };
        let refused = [
            (user.exec.is_some(), "exec"),
            (user.auth_provider.is_some(), "auth-provider"),
            (user.token_file.is_some(), "tokenFile"),
            (user.client_certificate.is_some(), "client-certificate"),
            (user.client_key.is_some(), "client-key"),
        ];
        if let Some((_, what)) = refused.iter().find(|(set, _)| *set) {
            return Err(format!(
                "user {:?} uses {what}; only inline credentials (client-certificate-data, \
                 client-key-data, token) are accepted from a Secret",
                a.name
            ));
        }
    }
    Ok(())
}

impl PortForward {
    /// From the workload kubeconfig of Cluster `namespace/cluster` (the text of Secret
    /// `<cluster>-kubeconfig`, key `value`). Only inline credentials are accepted: a kubeconfig
    /// naming files, an exec plugin or an auth provider is refused, naming the field.
    pub async fn from_kubeconfig(
        yaml: &str,
        namespace: &str,
        cluster: &str,
    ) -> Result<Self, PortForwardError> {
        let invalid = |problem: String| PortForwardError::KubeconfigInvalid {
            namespace: namespace.to_string(),
            cluster: cluster.to_string(),
            problem,
        };
        let kc = Kubeconfig::from_yaml(yaml).map_err(|e| invalid(e.to_string()))?;
        check_inline_only(&kc).map_err(&invalid)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| invalid(e.to_string()))?;
        let server = config.cluster_url.to_string();
        let server = server.trim_end_matches('/').to_string();
        let client = nodelay_client(config).map_err(|e| invalid(kube_error(&e)))?;
        Ok(Self::new(client, server))
    }
}

/// A client of the workload API server whose connections send every write at once
/// (`TCP_NODELAY`), otherwise kube's own stack: the kubeconfig's TLS (and server name), its
/// credentials and its extra headers.
///
/// Why not `Client::try_from(config)`: kube dials with Nagle's algorithm on. A port-forward's
/// WebSocket carries the prober's gRPC calls, small writes that each wait for an answer; with
/// Nagle a write that follows another not yet acknowledged is held until the API server
/// acknowledges it, which its delayed-ACK timer may put off for 40 ms (Linux). That was most of
/// a fresh probe's time through port-forward (issue 39, docs/benchmarks.md). Go's net package,
/// which kube-apiserver and the kubelet are written with, turns Nagle off on every connection.
///
/// A kubeconfig with a `proxy-url` gets kube's own stack (which dials the proxy), Nagle and all.
fn nodelay_client(config: kube::Config) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(HttpClient::builder(TokioExecutor::new()).build(https));
    Ok(Client::new(service, config.default_namespace))
}
