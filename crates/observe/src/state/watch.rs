//! Watches that keep [`ClusterState`] current: Clusters, KubeadmControlPlanes and control-plane
//! Machines (label selector `cluster.x-k8s.io/control-plane`), at the served v1beta2 version.
//!
//! kube's watcher handles relists, resourceVersion bookkeeping and 410 Gone; each event is
//! converted to engine types here, so a review never parses a cached object again.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use super::{ClusterState, Kind, Object};
use crate::capi;
use quorumguard_engine::LABEL_CONTROL_PLANE;

/// The API resource of a watched kind (v1beta2, the storage version).
pub fn api_resource(kind: Kind) -> ApiResource {
    let (group, k) = match kind {
        Kind::Cluster => ("cluster.x-k8s.io", "Cluster"),
        Kind::Kcp => ("controlplane.cluster.x-k8s.io", "KubeadmControlPlane"),
        Kind::Machine => ("cluster.x-k8s.io", "Machine"),
        Kind::HealthCheck => ("cluster.x-k8s.io", "MachineHealthCheck"),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1beta2", k), kind.as_str())
}

/// A listed or watched object of `kind`, converted to what [`ClusterState`] holds. Shared with
/// `quorumguard status`, which lists once instead of watching, so both read objects alike.
pub fn convert(kind: Kind, o: &DynamicObject) -> Result<Object, String> {
    let v = serde_json::to_value(o).map_err(|e| e.to_string())?;
    match kind {
        Kind::Cluster => capi::parse_cluster(&v).map(Object::Cluster),
        Kind::Kcp => capi::parse_kcp(&v).map(Object::Kcp),
        Kind::Machine => capi::parse_machine(&v).map(Object::Machine),
        Kind::HealthCheck => capi::parse_health_check(&v).map(Object::HealthCheck),
    }
    .map_err(|e| e.to_string())
}

/// Runs the watch of one kind until the stream ends (it does not: kube's watcher retries with
/// backoff). `on_sync` is called after every completed (re)list.
pub async fn run(client: Client, kind: Kind, state: Arc<ClusterState>, on_sync: impl Fn(Kind)) {
    let api: Api<DynamicObject> = Api::all_with(client, &api_resource(kind));
    let mut config = watcher::Config::default();
    if kind == Kind::Machine {
        config = config.labels(LABEL_CONTROL_PLANE);
    }
    let mut stream = watcher(api, config).default_backoff().boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => state.relist_start(kind),
            Ok(watcher::Event::InitApply(o) | watcher::Event::Apply(o)) => {
                match convert(kind, &o) {
                    Ok(obj) => state.apply(obj),
                    Err(e) => tracing::warn!(
                        kind = kind.as_str(),
                        namespace = o.namespace().unwrap_or_default(),
                        name = o.name_any(),
                        error = %e,
                        "ignoring an object quorumguard cannot read"
                    ),
                }
            }
            Ok(watcher::Event::Delete(o)) => {
                state.delete(kind, &o.namespace().unwrap_or_default(), &o.name_any())
            }
            Ok(watcher::Event::InitDone) => {
                state.relist_done(kind);
                on_sync(kind);
                tracing::info!(kind = kind.as_str(), "cache synced");
            }
            Err(e) => {
                if kind == Kind::HealthCheck && !state.is_synced(kind) {
                    state.set_health_check_error(Some(format!(
                        "listing MachineHealthChecks failed: {e}"
                    )));
                }
                tracing::warn!(kind = kind.as_str(), error = %e, "watch failed; retrying")
            }
        }
    }
}
