//! Where the world's objects live: the API-server stand-in (the default) or a real
//! kube-apiserver (`--real-apiserver`), and what the world does on either: reads that answer at
//! once (the stand-in's store, or reflector stores of the real server's Clusters, KCPs and
//! Machines), clients acting as a user, and waiting until the reads have seen a write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

use super::{NAMESPACE, WorldError};
use crate::apiserver::{
    ApiServer, cluster_resource, health_check_resource, kcp_resource, machine_resource,
};
use crate::realapi::RealApi;
use crate::webhooks::Relay;

/// How long a write may take to reach the reflector stores.
const SEEN_WAIT: Duration = Duration::from_secs(15);

/// The API server the world runs on.
pub enum Backend {
    /// The in-memory stand-in ([`crate::apiserver`]).
    StandIn(ApiServer),
    /// A real kube-apiserver ([`crate::realapi`]).
    Real(Box<RealBackend>),
}

/// A real kube-apiserver and what the world keeps of it.
pub struct RealBackend {
    api: Mutex<RealApi>,
    url: String,
    mirrors: Vec<Mirror>,
    /// The recording pass-through kube-apiserver calls the webhooks at (set once serve runs).
    pub(super) relay: Mutex<Option<Relay>>,
}

/// One resource of the real server, mirrored by a reflector (namespace [`NAMESPACE`]).
struct Mirror {
    ar: ApiResource,
    store: Store<DynamicObject>,
    /// The highest resourceVersion the watch has delivered.
    seen: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

fn same(a: &ApiResource, b: &ApiResource) -> bool {
    a.group == b.group && a.plural == b.plural
}

/// A resourceVersion as the number etcd made it (kube-apiserver's are etcd revisions).
fn rv_of(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

impl Mirror {
    fn start(client: kube::Client, ar: ApiResource) -> Mirror {
        let writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
        let store = writer.as_reader();
        let api: Api<DynamicObject> = Api::namespaced_with(client, NAMESPACE, &ar);
        let seen = Arc::new(AtomicU64::new(0));
        let noted = Arc::clone(&seen);
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default()).default_backoff(),
        );
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let object = match &event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => o,
                    Ok(watcher::Event::InitApply(o)) => o,
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::debug!(error = %e, "watching the real API server");
                        continue;
                    }
                };
                if let Some(rv) = rv_of(&object.metadata) {
                    noted.fetch_max(rv, Ordering::SeqCst);
                }
            }
        });
        Mirror {
            ar,
            store,
            seen,
            task,
        }
    }
}

impl RealBackend {
    /// Mirrors the real server's Clusters, KCPs and Machines; waits (bounded) until the first
    /// lists are in.
    pub(super) async fn start(api: RealApi) -> Result<RealBackend, WorldError> {
        let client =
            kube::Client::try_from(api.admin_config().clone()).map_err(WorldError::Client)?;
        let mirrors: Vec<Mirror> = [
            cluster_resource(),
            kcp_resource(),
            machine_resource(),
            health_check_resource(),
        ]
        .into_iter()
        .map(|ar| Mirror::start(client.clone(), ar))
        .collect();
        for m in &mirrors {
            let ready = tokio::time::timeout(SEEN_WAIT, m.store.wait_until_ready()).await;
            if !matches!(ready, Ok(Ok(()))) {
                return Err(WorldError::Other(format!(
                    "the watch of {} on the real API server did not sync within {SEEN_WAIT:?}",
                    m.ar.plural
                )));
            }
        }
        Ok(RealBackend {
            url: api.url.clone(),
            api: Mutex::new(api),
            mirrors,
            relay: Mutex::new(None),
        })
    }

    fn mirror(&self, ar: &ApiResource) -> Option<&Mirror> {
        self.mirrors.iter().find(|m| same(&m.ar, ar))
    }

    /// Runs `f` on the real API server.
    pub fn with_api<T>(&self, f: impl FnOnce(&mut RealApi) -> T) -> T {
        f(&mut self.api.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The admin impersonating `user` in group `system:masters` ([`RealApi::config_as`]).
    pub fn config_as(&self, user: &str) -> kube::Config {
        self.with_api(|a| a.config_as(user))
    }

    /// A client acting as the admin.
    pub fn admin_client(&self) -> Result<kube::Client, WorldError> {
        kube::Client::try_from(self.with_api(|a| a.admin_config().clone()))
            .map_err(WorldError::Client)
    }

    /// Stops the relay, the watches, kube-apiserver and its etcd.
    pub(super) fn stop(&self) {
        if let Some(relay) = self
            .relay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            relay.stop();
        }
        for m in &self.mirrors {
            m.task.abort();
        }
        self.with_api(RealApi::stop);
    }
}

impl Backend {
    /// The object as last seen (the stand-in's store, or the real server's watch).
    pub fn get(&self, ar: &ApiResource, ns: &str, name: &str) -> Option<Value> {
        match self {
            Backend::StandIn(api) => api.get(ar, ns, name),
            Backend::Real(real) => {
                let key = ObjectRef::new_with(name, ar.clone()).within(ns);
                let object = real.mirror(ar)?.store.get(&key)?;
                serde_json::to_value(&*object).ok()
            }
        }
    }

    /// Every object of `ar` as last seen (on the real server: in [`NAMESPACE`]).
    pub fn list(&self, ar: &ApiResource) -> Vec<Value> {
        match self {
            Backend::StandIn(api) => api.list(ar),
            Backend::Real(real) => real
                .mirror(ar)
                .map(|m| m.store.state())
                .unwrap_or_default()
                .iter()
                .filter_map(|o| serde_json::to_value(&**o).ok())
                .collect(),
        }
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        match self {
            Backend::StandIn(api) => api.url(),
            Backend::Real(real) => real.url.clone(),
        }
    }

    /// The stand-in, when the world runs on it.
    pub fn stand_in(&self) -> Option<&ApiServer> {
        match self {
            Backend::StandIn(api) => Some(api),
            Backend::Real(_) => None,
        }
    }

    /// A client configuration acting as `user` (on the real server: the admin impersonating
    /// `user` in group `system:masters`, so the webhook sees the user and RBAC allows it).
    pub fn config_as(&self, user: &str) -> kube::Config {
        match self {
            Backend::StandIn(api) => api.kubeconfig_as(user),
            Backend::Real(real) => real.config_as(user),
        }
    }

    /// Waits (bounded) until the reads have seen a write of `ar` whose answer carried `written`
    /// (the object's metadata, or a subresource's, such as a Scale: its resourceVersion is the
    /// object's): from then on the world reads it, never the state before. At once on the
    /// stand-in, whose reads are its store, and when nothing was written (`None`).
    pub async fn seen(
        &self,
        ar: &ApiResource,
        written: Option<&ObjectMeta>,
    ) -> Result<(), WorldError> {
        let (Backend::Real(real), Some(rv)) = (self, written.and_then(rv_of)) else {
            return Ok(());
        };
        let Some(mirror) = real.mirror(ar) else {
            return Ok(());
        };
        let deadline = tokio::time::Instant::now() + SEEN_WAIT;
        while mirror.seen.load(Ordering::SeqCst) < rv {
            if tokio::time::Instant::now() >= deadline {
                return Err(WorldError::Other(format!(
                    "the watch of {} did not see resourceVersion {rv} within {SEEN_WAIT:?}",
                    ar.plural
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}
