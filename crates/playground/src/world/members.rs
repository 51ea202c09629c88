//! The etcd cluster under the world: operations on it, what it lists now, and the Cluster's
//! endpoints annotation kept current with its members.

use std::sync::{Arc, PoisonError};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use super::backend::Backend;
use super::{CLUSTER, NAMESPACE, World, WorldError};
use crate::apiserver::cluster_resource;
use crate::etcd::{EtcdCluster, EtcdError};
use quorumguard_observe::etcd::endpoints::ETCD_ENDPOINTS_ANNOTATION;

impl World {
    /// The etcd client URLs the playground keeps in the Cluster's endpoints annotation.
    pub fn etcd_endpoints(&self) -> Vec<String> {
        self.api
            .get(&cluster_resource(), NAMESPACE, CLUSTER)
            .and_then(|c| {
                c["metadata"]["annotations"][ETCD_ENDPOINTS_ANNOTATION]
                    .as_str()
                    .map(|s| s.split(',').map(str::to_string).collect())
            })
            .unwrap_or_default()
    }

    /// Runs `f` on the etcd cluster on a blocking thread (etcd operations wait on processes).
    pub async fn etcd<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut EtcdCluster) -> T + Send + 'static,
    ) -> Result<T, WorldError> {
        let etcd = Arc::clone(&self.etcd);
        tokio::task::spawn_blocking(move || {
            let mut etcd = etcd.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut etcd)
        })
        .await
        .map_err(|e| WorldError::Join(e.to_string()))
    }

    /// Points the Cluster's endpoints annotation at the members etcd lists now (standing in for
    /// the Machines' addresses, see the module doc).
    pub async fn refresh_endpoints(&self) -> Result<(), WorldError> {
        let urls = self
            .etcd(|e| -> Result<Vec<String>, EtcdError> {
                let listed = e.member_list()?;
                Ok(listed
                    .iter()
                    .filter_map(|m| e.index_of(&m.name).and_then(|i| e.client_url(i)))
                    .collect())
            })
            .await??;
        if urls.is_empty() {
            return Ok(());
        }
        set_endpoints(&self.api, &urls.join(",")).await
    }

    /// The member list etcd reports now, as `name (learner)` / `(unstarted)`, and which
    /// processes are frozen or stopped: what `etcdctl member list` says, for the timeline.
    pub async fn etcd_says(&self) -> Result<String, WorldError> {
        self.etcd(|e| -> Result<String, EtcdError> {
            let listed = e.member_list()?;
            let mut parts = Vec::new();
            for m in &listed {
                let mut s = if m.name.is_empty() {
                    format!("{:x} (added, not started)", m.id)
                } else {
                    m.name.clone()
                };
                if m.learner {
                    s.push_str(" (learner)");
                }
                if let Some(i) = e.index_of(&m.name) {
                    if e.is_frozen(i) {
                        s.push_str(" (frozen: SIGSTOP)");
                    } else if !e.is_running(i) {
                        s.push_str(" (process down)");
                    }
                }
                parts.push(s);
            }
            Ok(format!("{} members: {}", listed.len(), parts.join(", ")))
        })
        .await?
        .map_err(WorldError::Etcd)
    }
}

async fn set_endpoints(backend: &Backend, urls: &str) -> Result<(), WorldError> {
    let what = format!("Cluster {NAMESPACE}/{CLUSTER}");
    let real = match backend {
        Backend::StandIn(api) => {
            let urls = urls.to_string();
            return api
                .modify(&cluster_resource(), NAMESPACE, CLUSTER, move |c| {
                    c["metadata"]["annotations"][ETCD_ENDPOINTS_ANNOTATION] = json!(urls);
                })
                .map(|_| ())
                .map_err(|source| WorldError::Store { what, source });
        }
        Backend::Real(real) => real,
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(real.admin_client()?, NAMESPACE, &cluster_resource());
    let patch = json!({"metadata": {"annotations": {ETCD_ENDPOINTS_ANNOTATION: urls}}});
    let written = api
        .patch(CLUSTER, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(|source| WorldError::Api { what, source })?;
    backend
        .seen(&cluster_resource(), Some(&written.metadata))
        .await
}
