//! The files the world writes for others: the webhook's CA and serving certificate, and the
//! kubeconfigs for kubectl and a child `serve`.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::{NAMESPACE, WorldError};
use crate::apiserver::ApiServer;
use crate::certs::Ca;
use crate::webhooks::SERVICE_DNS_NAME;

/// The webhook's CA and serving certificate (for the Service DNS name), written to `dir`.
pub(super) struct WebhookCerts {
    pub(super) ca_pem: String,
    pub(super) cert_file: PathBuf,
    pub(super) key_file: PathBuf,
}

pub(super) fn webhook_certs(dir: &Path) -> Result<WebhookCerts, WorldError> {
    let now = crate::unix_now();
    let ca = Ca::generate(now).map_err(|e| WorldError::Certs(e.to_string()))?;
    let names = vec![
        SERVICE_DNS_NAME.to_string(),
        "quorumguard-webhook.quorumguard-system.svc.cluster.local".to_string(),
    ];
    let issued = ca
        .issue("quorumguard-webhook", &names, 1, now)
        .map_err(|e| WorldError::Certs(e.to_string()))?;
    let certs = dir.join("webhook-tls");
    std::fs::create_dir_all(&certs).map_err(|source| WorldError::Write {
        path: certs.clone(),
        source,
    })?;
    let write = |name: &str, text: &str| -> Result<PathBuf, WorldError> {
        let path = certs.join(name);
        std::fs::write(&path, text).map_err(|source| WorldError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    };
    write("ca.crt", ca.cert_pem())?;
    Ok(WebhookCerts {
        ca_pem: ca.cert_pem().to_string(),
        cert_file: write("tls.crt", &issued.cert_pem)?,
        key_file: write("tls.key", &issued.key_pem)?,
    })
}

/// Writes a kubeconfig for the stand-in whose user acts as `user` (kubectl and kube send it as
/// `Impersonate-User`, which the stand-in takes as the requesting user):
/// [`KUBECONFIG_USER`](super::KUBECONFIG_USER) for people, [`SERVE_USER`](super::SERVE_USER) for
/// a child `serve`.
pub(super) fn write_kubeconfig(api: &ApiServer, path: &Path, user: &str) -> Result<(), WorldError> {
    let doc = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "quorumguard-playground",
        "preferences": {},
        "clusters": [{"name": "playground", "cluster": {"server": api.url()}}],
        "contexts": [{"name": "quorumguard-playground",
            "context": {"cluster": "playground", "user": user, "namespace": NAMESPACE}}],
        "users": [{"name": user, "user": {"as": user}}],
    });
    let text = serde_yaml::to_string(&doc).map_err(|e| WorldError::Other(e.to_string()))?;
    std::fs::write(path, text).map_err(|source| WorldError::Write {
        path: path.to_path_buf(),
        source,
    })
}
