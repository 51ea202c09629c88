//! A **stand-in** for kube-apiserver: an in-memory server that speaks the Kubernetes REST
//! protocol over plain HTTP on 127.0.0.1, so that a real `kube::Client` (its whole stack:
//! request building, error decoding, watch streams, `kube::runtime::watcher`) can be tested
//! without a cluster, and so that the playground has an API server to point quorumguard and
//! `kubectl` at. It is not Kubernetes and proves nothing a real cluster would not.
//!
//! What it does:
//! - Serves the resources in [`default_resources`] (Cluster, Machine, KubeadmControlPlane as
//!   CRDs with the status subresource, KCP also with `/scale`; Secret, ConfigMap, core and
//!   events.k8s.io Events, Lease as built-ins), or any list given to [`ApiServer::start_with`].
//! - Discovery: `/version`, `/api`, `/apis`, `/apis/{group}`, `/api/v1`, `/apis/{group}/{version}`,
//!   in the legacy form and the aggregated (apidiscovery.k8s.io/v2) form.
//! - get, list (`labelSelector` with `=`, `==`, `!=`, `in`, `notin`, exists, `!exists`;
//!   `fieldSelector` on `metadata.name`/`metadata.namespace`; `limit`/`continue`), watch
//!   (ADDED/MODIFIED/DELETED/BOOKMARK/ERROR, replay after a `resourceVersion`, `sendInitialEvents`,
//!   `allowWatchBookmarks`, `timeoutSeconds`; a too old `resourceVersion` answers 200 and one
//!   ERROR event with a 410 Expired Status, as the watch cache does), create (`generateName`,
//!   409 AlreadyExists), update (409 Conflict on a stale `resourceVersion`), patch (merge and
//!   JSON patch; strategic merge refused with 415 for CRDs), delete (deletionTimestamp while
//!   finalizers remain, removal when the last one goes; `preconditions`), deletecollection,
//!   `dryRun=All`, the `/scale` subresource (autoscaling/v1 Scale), metadata-only answers
//!   (`Accept: …;as=PartialObjectMetadata[List]`). Status objects are shaped like the real
//!   server's.
//! - CRD status-subresource rules: creating drops `.status`; main-resource writes keep the
//!   stored `.status` and bump `metadata.generation` when anything but metadata changes;
//!   `/status` writes change only `.status` and leave generation alone; no-op writes get no new
//!   resourceVersion and no event. One global resourceVersion counter for all objects.
//! - Hooks on [`ApiServer`] (for tests and the playground): insert/modify/remove objects
//!   directly, read them, inject failures and delays per verb and path, add latency, drop every
//!   open watch, count requests, forget the watch history, and an admission hook called on
//!   CREATE, UPDATE and DELETE. The hook sees what a validating webhook would (the object, the
//!   old object, the user, dry run, and the request's Create/Update/DeleteOptions as
//!   kube-apiserver builds them) and may allow, allow with warnings (sent to the client as
//!   `Warning: 299 - "<text>"` headers, which kubectl prints as `Warning: <text>`; also on a
//!   refusal), or refuse with a Status. [`super::webhooks`] is such a hook: it calls real
//!   webhooks over HTTPS as a ValidatingWebhookConfiguration says.
//! - Port-forward to pods (`pods/{name}/portforward`, WebSocket, `v4.channel.k8s.io`), relayed to
//!   a TCP address the caller maps the pod to ([`ApiServer::forward_pod`]); an unmapped pod is 404
//!   NotFound. `portforward.rs` says what of the real protocol it does and does not do.
//!
//! What it does NOT do:
//! - No authentication or authorization: every request is allowed; the user is the
//!   `Impersonate-User` header when given, else `system:anonymous`. No TLS.
//! - No admission chain beyond the one hook; no mutating admission. Webhooks are called only
//!   when [`super::webhooks::WebhookDispatcher`] is installed as that hook (see its module
//!   documentation for what of kube-apiserver's webhook dispatch it does and does not do).
//!   Warning headers are not truncated or limited in count as kube-apiserver's are.
//! - No CRD schema: no validation, defaulting, pruning of unknown fields, or conversion
//!   (one version per resource); no built-in type validation (Secret data, Event fields, ...).
//! - No server-side apply (415), no strategic merge patch for lists or `$` directives (415),
//!   no `managedFields`.
//! - Field selectors only on `metadata.name` and `metadata.namespace`.
//! - Reads always see the latest state: `resourceVersion` on get/list is not honoured beyond
//!   refusing a future one (504) and an old `Exact` one (410); a `continue` token answers 410
//!   once its resource changed instead of serving a snapshot.
//! - No namespaces as objects (any namespace name works), no garbage collector (ownerReferences
//!   and `propagationPolicy` are ignored), no graceful deletion periods, no create-on-update.
//! - The watch history keeps the last 10,000 changes (or less after [`ApiServer::compact`]);
//!   watch channels are unbounded (no slow-watcher eviction).
//! - Request bodies are read as JSON whatever their Content-Type (except PATCH, which is
//!   dispatched on it); unknown query parameters are ignored.
//! - No protobuf, no table output, no server-side pagination limits, no rate limiting (unless
//!   injected), no HTTP/2, no exec/attach/logs; pods exist only as port-forward targets.
//!
//! The parts, one file each under `apiserver/`:
//! - `http.rs`: routing and the REST verbs.
//! - `writes.rs`: the writing verbs, each with the admission hook before it is applied.
//! - `watch.rs`: watch streams.
//! - `store.rs`: the objects, the resourceVersion counter, the change history and the open
//!   watches.
//! - `rules.rs`: the write rules of the generic registry and of CRDs with subresources.
//! - `select.rs`: label and field selectors.
//! - `status.rs`: `Status` failure objects.
//! - `resources.rs`: the resource types served and their discovery documents.
//! - `portforward.rs`: port-forward to pods.
//! - `admission.rs`: the admission hook: what it sees, what it answers, and how its answer
//!   reaches the client.
//! - `faults.rs`: the failures, delays and latency a test injects.

mod admission;
mod faults;
mod http;
mod portforward;
mod resources;
mod rules;
mod select;
mod status;
mod store;
mod watch;
mod writes;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::serve::ListenerExt;
use kube::core::ApiResource;
use serde_json::{Value, json};

use admission::Hook;
pub use admission::{AdmissionAttempt, AdmissionVerdict, Operation};
use faults::Fault;
pub use resources::{ResourceDef, ScaleDef, default_resources};
use rules::meta_str;
use store::{Key, Store};

/// One request as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    pub path: String,
    pub query: String,
    /// The `Impersonate-User` header, else `system:anonymous` (see [`ApiServer::kubeconfig_as`]).
    pub user: String,
}

/// State shared by the handle and the request handlers.
struct Shared {
    addr: SocketAddr,
    /// `http://<addr>`, parsed once so that a client configuration cannot fail.
    uri: axum::http::Uri,
    store: Mutex<Store>,
    faults: Mutex<Vec<Fault>>,
    latency: Mutex<Duration>,
    requests: Mutex<Vec<RequestRecord>>,
    hook: Mutex<Option<(String, Hook)>>,
    bookmark_every: Mutex<Duration>,
    /// Bumped to make every open watch abort its connection.
    kill: tokio::sync::watch::Sender<u64>,
    open_watches: AtomicUsize,
    /// `(namespace, pod)` -> where its forwarded port is really served.
    pods: Mutex<HashMap<(String, String), SocketAddr>>,
    /// Port-forward connections relaying now, and ever upgraded.
    open_forwards: AtomicUsize,
    forwards_total: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    fn bookmark_every(&self) -> Duration {
        *lock(&self.bookmark_every)
    }

    fn record(&self, verb: &str, path: &str, query: &str) {
        self.record_as(verb, path, query, "system:anonymous");
    }

    fn record_as(&self, verb: &str, path: &str, query: &str, user: &str) {
        let record = RequestRecord {
            verb: verb.into(),
            path: path.into(),
            query: query.into(),
            user: user.into(),
        };
        lock(&self.requests).push(record);
    }
}

/// Why a direct operation on the store ([`ApiServer::insert`], [`ApiServer::modify`]) failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// `resource` is a kind (from an object) or a plural (from an `ApiResource`).
    #[error("{api_version} {resource} is not served")]
    NotServed {
        api_version: String,
        resource: String,
    },
    #[error("metadata.{0} is required")]
    MissingField(&'static str),
    #[error("{namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
}

/// A running stand-in. Dropping it stops the server and aborts its open watches.
pub struct ApiServer {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.kill.send_modify(|epoch| *epoch += 1);
        self.task.abort();
    }
}

impl ApiServer {
    /// Starts a server for [`default_resources`] on 127.0.0.1 and a free port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(default_resources()).await
    }

    /// Starts a server for the given resource types.
    pub async fn start_with(defs: Vec<ResourceDef>) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let uri = format!("http://{addr}")
            .parse()
            .map_err(std::io::Error::other)?;
        let shared = Arc::new(Shared {
            addr,
            uri,
            store: Mutex::new(Store::new(defs)),
            faults: Mutex::new(Vec::new()),
            latency: Mutex::new(Duration::ZERO),
            requests: Mutex::new(Vec::new()),
            hook: Mutex::new(None),
            bookmark_every: Mutex::new(Duration::from_secs(60)),
            kill: tokio::sync::watch::Sender::new(0),
            open_watches: AtomicUsize::new(0),
            pods: Mutex::new(HashMap::new()),
            open_forwards: AtomicUsize::new(0),
            forwards_total: AtomicUsize::new(0),
        });
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(Arc::clone(&shared));
        let task = tokio::spawn(async move {
            // Ends only when the listener fails or the task is aborted.
            // No Nagle, as kube-apiserver (Go's net package turns it off on every connection):
            // a port-forward relays small writes that each wait for an answer.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { shared, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// A client configuration for this server (namespace `default`).
    pub fn kubeconfig(&self) -> kube::Config {
        let mut config = kube::Config::new(self.shared.uri.clone());
        config.default_namespace = "default".into();
        config
    }

    /// Like [`Self::kubeconfig`], acting as `user` (sent as the `Impersonate-User` header,
    /// which the admission hook sees as the requesting user).
    pub fn kubeconfig_as(&self, user: &str) -> kube::Config {
        let mut config = self.kubeconfig();
        config.auth_info.impersonate = Some(user.to_string());
        config
    }

    /// A kubeconfig file's text for this server (context `standin`, namespace `default`).
    pub fn kubeconfig_yaml(&self) -> String {
        let doc = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin", "preferences": {},
            "clusters": [{"name": "standin", "cluster": {"server": self.url()}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "standin", "namespace": "default"}}],
            "users": [{"name": "standin", "user": {}}],
        });
        serde_yaml::to_string(&doc).unwrap_or_default()
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    /// A `kube::Client` for this server.
    pub fn client(&self) -> kube::Result<kube::Client> {
        kube::Client::try_from(self.kubeconfig())
    }

    fn res(&self, ar: &ApiResource) -> Result<usize, StoreError> {
        self.shared
            .store()
            .def_index(&ar.group, &ar.version, &ar.plural)
            .ok_or_else(|| StoreError::NotServed {
                api_version: ar.api_version.clone(),
                resource: ar.plural.clone(),
            })
    }

    /// Stores `object` as is (its type from `apiVersion`/`kind`), like a controller with no
    /// rules in the way: keeps `.status`, no admission. Replaces an existing object.
    pub fn insert(&self, object: Value) -> Result<Value, StoreError> {
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
        let mut store = self.shared.store();
        let res = store
            .def_by_type(api_version, kind)
            .ok_or_else(|| StoreError::NotServed {
                api_version: api_version.to_string(),
                resource: kind.to_string(),
            })?;
        let name = meta_str(&object, "name")
            .ok_or(StoreError::MissingField("name"))?
            .to_string();
        let namespaced = store.defs.get(res).is_some_and(|d| d.namespaced);
        let ns = if namespaced {
            meta_str(&object, "namespace").ok_or(StoreError::MissingField("namespace"))?
        } else {
            ""
        };
        let key: Key = (res, ns.to_string(), name);
        Ok(store.put_direct(key, object))
    }

    /// Changes a stored object in place (no admission, no subresource rules); emits MODIFIED.
    pub fn modify(
        &self,
        ar: &ApiResource,
        ns: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Result<Value, StoreError> {
        let key = (self.res(ar)?, ns.to_string(), name.to_string());
        let mut store = self.shared.store();
        let mut object = store
            .get(&key)
            .cloned()
            .ok_or_else(|| StoreError::NotFound {
                namespace: ns.to_string(),
                name: name.to_string(),
            })?;
        change(&mut object);
        Ok(store.commit_update(&key, object))
    }

    /// Removes an object at once, finalizers or not; emits DELETED.
    pub fn remove(&self, ar: &ApiResource, ns: &str, name: &str) -> Option<Value> {
        let key = (self.res(ar).ok()?, ns.to_string(), name.to_string());
        self.shared.store().commit_delete(&key)
    }

    pub fn get(&self, ar: &ApiResource, ns: &str, name: &str) -> Option<Value> {
        let key = (self.res(ar).ok()?, ns.to_string(), name.to_string());
        self.shared.store().get(&key).cloned()
    }

    /// Every stored object of a resource, all namespaces, in key order.
    pub fn list(&self, ar: &ApiResource) -> Vec<Value> {
        let Ok(res) = self.res(ar) else {
            return Vec::new();
        };
        self.shared.store().list(
            &store::Filter {
                res,
                ..Default::default()
            },
            None,
        )
    }

    /// The latest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().rv
    }

    /// Forgets the change history: a watch from any earlier resourceVersion gets 410 Expired.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// How often open watches that allow bookmarks get one (default 60 s, like the real server).
    pub fn set_bookmark_interval(&self, every: Duration) {
        *lock(&self.shared.bookmark_every) = every;
    }

    /// Aborts the connection of every open watch (no clean end of the chunked body).
    pub fn drop_watches(&self) {
        self.shared.kill.send_modify(|epoch| *epoch += 1);
    }

    /// How many watch responses are streaming now.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.requests).clone()
    }

    /// How many requests had this verb and exactly this path.
    pub fn request_count(&self, verb: &str, path: &str) -> usize {
        lock(&self.shared.requests)
            .iter()
            .filter(|r| r.verb == verb && r.path == path)
            .count()
    }

    /// Port-forwards to pod `namespace/name` are relayed to `addr` (whatever port is asked: a
    /// pod here has one). Replaces an earlier mapping.
    pub fn forward_pod(&self, namespace: &str, name: &str, addr: SocketAddr) {
        lock(&self.shared.pods).insert((namespace.to_string(), name.to_string()), addr);
    }

    /// Forgets pod `namespace/name`: port-forwards to it answer 404 NotFound again. Relays
    /// already open stay.
    pub fn unforward_pod(&self, namespace: &str, name: &str) {
        lock(&self.shared.pods).remove(&(namespace.to_string(), name.to_string()));
    }

    /// Port-forward connections relaying now.
    pub fn open_port_forwards(&self) -> usize {
        self.shared.open_forwards.load(Ordering::SeqCst)
    }

    /// Port-forward connections upgraded so far.
    pub fn port_forwards_total(&self) -> usize {
        self.shared.forwards_total.load(Ordering::SeqCst)
    }
}

fn v1beta2(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(group, "v1beta2", kind),
        plural,
    )
}

/// `cluster.x-k8s.io/v1beta2` Cluster.
pub fn cluster_resource() -> ApiResource {
    v1beta2("cluster.x-k8s.io", "Cluster", "clusters")
}

/// `cluster.x-k8s.io/v1beta2` Machine.
pub fn machine_resource() -> ApiResource {
    v1beta2("cluster.x-k8s.io", "Machine", "machines")
}

/// `cluster.x-k8s.io/v1beta2` MachineHealthCheck.
pub fn health_check_resource() -> ApiResource {
    v1beta2(
        "cluster.x-k8s.io",
        "MachineHealthCheck",
        "machinehealthchecks",
    )
}

/// `controlplane.cluster.x-k8s.io/v1beta2` KubeadmControlPlane.
pub fn kcp_resource() -> ApiResource {
    v1beta2(
        "controlplane.cluster.x-k8s.io",
        "KubeadmControlPlane",
        "kubeadmcontrolplanes",
    )
}
