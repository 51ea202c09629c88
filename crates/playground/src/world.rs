//! The playground's world: a real etcd cluster, the API-server stand-in holding one workload
//! cluster's Cluster API objects, and `quorumguard serve` (webhook, prober, status publisher)
//! in this process, wired together the way they are in a management cluster.
//!
//! - etcd: 3 members on 127.0.0.1 with client and peer TLS, named after their nodes as kubeadm
//!   names stacked members.
//! - The stand-in: Cluster `default/demo`, KubeadmControlPlane `demo-control-plane` (replicas 3,
//!   stacked etcd), one control-plane Machine per member (node name == member name, finalizer
//!   `machine.cluster.x-k8s.io`, KCP's pre-terminate hook annotation), and Secret `demo-etcd`
//!   with the etcd CA, from which quorumguard signs its own client certificate as KCP does.
//! - quorumguard: [`crate::server::start`] with the direct etcd transport (or, with
//!   [`ServeMode::Child`], the `quorumguard serve` binary as a child process that a test can
//!   SIGKILL and restart: see [`World::kill_serve`]). The Cluster's
//!   `quorumguard.io/etcd-endpoints` annotation lists the members' client URLs: the playground
//!   keeps it current as members come and go, standing in for the Machines' addresses (every
//!   member listens on 127.0.0.1 on its own port, so the default `<InternalIP>:2379` cannot work).
//! - The stand-in calls the webhook over HTTPS as kube-apiserver would, from the
//!   ValidatingWebhookConfiguration in `manifests/` ([`super::webhooks`]), with a serving
//!   certificate issued for the Service's DNS name by a CA made for this run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::apiserver::{ApiServer, StoreError, cluster_resource, kcp_resource, machine_resource};
use super::etcd::{EtcdCluster, EtcdError, EtcdOptions};
use super::webhooks::{SERVICE_DNS_NAME, WebhookDispatcher, WebhookTarget};
use crate::certs::Ca;
use crate::engine::model::DEFAULT_KCP_CONTROLLER;
use crate::engine::{Confirmation, Policy};
use crate::server::{self, Running, ServeConfig, StatusConfig};
use crate::status::conditions::{CONDITION_ETCD_QUORUM, CONDITION_NEXT_ACTION};
use crate::status::publish::PublishConfig;
use quorumguard_guard::etcd::TransportKind;
use quorumguard_guard::etcd::endpoints::{ETCD_ENDPOINTS_ANNOTATION, ETCD_TRANSPORT_ANNOTATION};
use quorumguard_guard::etcd::sweep::SweepConfig;

/// The namespace of the playground's workload cluster objects.
pub const NAMESPACE: &str = "default";
/// The Cluster.
pub const CLUSTER: &str = "demo";
/// The KubeadmControlPlane.
pub const KCP: &str = "demo-control-plane";
/// The Kubernetes version the control plane starts with.
pub const OLD_VERSION: &str = "v1.31.4";
/// The version `upgrade-stuck` rolls out.
pub const NEW_VERSION: &str = "v1.32.0";
/// The person at kubectl (kubeadm's admin user).
pub const HUMAN: &str = "kubernetes-admin";
/// Who the playground's kubeconfig acts as, so that kubectl requests are judged as a person's.
pub const KUBECONFIG_USER: &str = HUMAN;
/// The Machine finalizer Cluster API's Machine controller owns.
pub const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
/// KCP's pre-terminate hook: the Machine controller waits for KCP to remove the etcd member.
pub const KCP_PRE_TERMINATE_HOOK: &str =
    "pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup";

/// Cluster API's Machine controller (it owns the Machine finalizer and sets the node).
pub const MACHINE_CONTROLLER: &str = "system:serviceaccount:capi-system:capi-manager";

/// The KCP controller's identity, as the webhook sees it.
pub fn kcp_controller() -> &'static str {
    DEFAULT_KCP_CONTROLLER
}

/// Why the playground could not be set up or an operation on it failed.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    #[error("the API-server stand-in: {0}")]
    ApiServer(#[source] std::io::Error),
    #[error("storing {what} in the API-server stand-in: {source}")]
    Store {
        what: String,
        #[source]
        source: StoreError,
    },
    #[error("a Kubernetes client for the stand-in: {0}")]
    Client(#[source] kube::Error),
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("making the webhook's certificates: {0}")]
    Certs(String),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting quorumguard serve: {0}")]
    Serve(#[source] server::ServerError),
    #[error("quorumguard serve as a child process: {0}")]
    Child(String),
    #[error("the webhook configuration in manifests/: {0}")]
    Webhooks(String),
    #[error("an etcd operation did not finish: {0}")]
    Join(String),
    #[error("{0}")]
    Other(String),
}

/// How to set the world up.
#[derive(Clone, Debug)]
pub struct WorldOptions {
    /// Where certificates, the kubeconfig and etcd's data and logs go.
    pub dir: PathBuf,
    /// quorumguard's probe interval: how fast the published status follows etcd.
    pub probe_interval: Duration,
    /// The per-probe deadline: how long a frozen member may keep a probe waiting.
    pub probe_deadline: Duration,
    /// quorumguard's `--etcd-election-timeout`: etcd's own here, 500 ms; zero believes every
    /// probe at once (for measuring what confirming costs).
    pub election_timeout: Duration,
    /// Where quorumguard runs: in this process (the default) or as a child process.
    pub serve: ServeMode,
}

impl WorldOptions {
    pub fn new(dir: PathBuf) -> Self {
        WorldOptions {
            dir,
            probe_interval: Duration::from_millis(500),
            probe_deadline: Duration::from_secs(1),
            election_timeout: super::etcd::ELECTION_TIMEOUT,
            serve: ServeMode::InProcess,
        }
    }
}

/// How the world runs `quorumguard serve`.
#[derive(Clone, Debug, Default)]
pub enum ServeMode {
    /// In this process with [`crate::server::start`], without leader election: the
    /// playground's default (one process to start and stop).
    #[default]
    InProcess,
    /// The binary as a child process, so that a test can SIGKILL it ([`World::kill_serve`]) and
    /// start it again ([`World::restart_serve`]) as kubelet restarts a crashed container: on
    /// fixed ports (the dispatcher keeps calling the same address, as a Service keeps its
    /// name), with the direct etcd transport and leader election on the Lease `serve` uses by
    /// default ([`LEASE_NAMESPACE`]/[`LEASE_NAME`]), as in a cluster.
    Child(ChildServe),
}

/// The child process's binary and Lease timings.
#[derive(Clone, Debug)]
pub struct ChildServe {
    /// The quorumguard binary (tests: `env!("CARGO_BIN_EXE_quorumguard")`).
    pub exe: PathBuf,
    /// `--lease-duration`: how long a replica with another identity waits before taking over
    /// the Lease of a dead holder.
    pub lease_duration: Duration,
    /// `--lease-renew-deadline`.
    pub lease_renew_deadline: Duration,
    /// `--lease-retry-period`.
    pub lease_retry_period: Duration,
}

impl ChildServe {
    /// `exe` with serve's Lease defaults (15 s, 10 s, 2 s).
    pub fn new(exe: PathBuf) -> Self {
        ChildServe {
            exe,
            lease_duration: Duration::from_secs(15),
            lease_renew_deadline: Duration::from_secs(10),
            lease_retry_period: Duration::from_secs(2),
        }
    }
}

/// The namespace of the Lease a child `serve` holds (serve's default, `POD_NAMESPACE`).
pub const LEASE_NAMESPACE: &str = "quorumguard-system";
/// The Lease's name (serve's `--leader-election-lease` default).
pub const LEASE_NAME: &str = "quorumguard";
/// The identity (`--pod-name`) of the child `serve` unless [`World::restart_serve`] is given
/// another: a container restarted by kubelet keeps its pod's name.
pub const SERVE_IDENTITY: &str = "quorumguard-playground";
/// Who the child `serve` acts as towards the stand-in: the service account of the manifests.
pub const SERVE_USER: &str = "system:serviceaccount:quorumguard-system:quorumguard";
/// How long a child `serve` may take to listen after it was spawned.
const CHILD_START_WAIT: Duration = Duration::from_secs(30);

/// A `serve` child process started by [`World::restart_serve`] (or by [`World::start`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeStart {
    pub pid: u32,
    /// Its `--pod-name`: its identity in the Lease.
    pub identity: String,
    /// When it was spawned (wall clock, to compare with the Lease's `renewTime`).
    pub spawned: SystemTime,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
}

/// What [`World::wait_serving`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Serving {
    /// When `/readyz` first answered 200.
    pub ready: Instant,
    /// When the Lease was first seen held and renewed by this process (child mode; in-process
    /// quorumguard writes without a Lease, so this is `ready`).
    pub leading: Instant,
}

impl Serving {
    /// The later of the two: from then on it answers reviews from synced caches and may
    /// write KCP status.
    pub fn since(&self) -> Instant {
        self.ready.max(self.leading)
    }
}

/// One KCP condition as published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Both quorumguard conditions of the KCP, when published.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Conditions {
    pub quorum: Option<Published>,
    pub next_action: Option<Published>,
}

impl Conditions {
    /// The NextAction reason, or "" before the first publication.
    pub fn action(&self) -> &str {
        self.next_action.as_ref().map_or("", |c| c.reason.as_str())
    }

    /// The EtcdQuorum reason, or "".
    pub fn quorum_reason(&self) -> &str {
        self.quorum.as_ref().map_or("", |c| c.reason.as_str())
    }

    /// The Machine the NextAction names (its message starts with `Machine <ns>/<name>`).
    pub fn action_target(&self) -> Option<String> {
        let message = &self.next_action.as_ref()?.message;
        let prefix = format!("Machine {NAMESPACE}/");
        let rest = &message[message.find(&prefix)? + prefix.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
            .collect();
        (!name.is_empty()).then_some(name)
    }
}

/// A Machine as the playground's controllers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineView {
    pub name: String,
    pub version: String,
    pub deleting: bool,
    pub finalizers: Vec<String>,
    pub annotations: Vec<(String, String)>,
    pub created: String,
    /// `status.nodeRef.name`: by kubeadm's convention also its etcd member's name.
    pub node: Option<String>,
}

impl MachineView {
    pub fn has_annotation(&self, key: &str) -> bool {
        self.annotations.iter().any(|(k, _)| k == key)
    }
}

/// The running world. [`World::shutdown`] stops it; dropping it also stops every etcd process.
pub struct World {
    pub api: ApiServer,
    pub webhooks: Arc<WebhookDispatcher>,
    pub dir: PathBuf,
    /// The CA the webhook's serving certificate chains to (the VWC's caBundle).
    pub webhook_ca_pem: String,
    etcd: Arc<Mutex<EtcdCluster>>,
    server: Mutex<Option<Serve>>,
    /// How to start `serve` again (child mode only).
    child: Option<ChildPlan>,
    /// Names handed out to new Machines, in order.
    next_name: Mutex<usize>,
    probe_interval: Duration,
    probe_deadline: Duration,
}

/// Suffixes for Machine names: kube-style random-looking, but the same every run so the
/// timeline can be compared between runs.
const SUFFIXES: [&str; 12] = [
    "7xk2p", "m4q8z", "r9t5v", "b2w6n", "h8j3c", "q5d7f", "z6n4k", "p3v9x", "t7m2g", "w4c8s",
    "k9f5b", "n2x7q",
];

impl World {
    /// Starts etcd (blocking work, on a blocking thread), the stand-in and quorumguard, and
    /// seeds the objects. `step` is told what is being started, for a progress display.
    pub async fn start(
        options: WorldOptions,
        step: impl Fn(&str) + Send + Sync,
    ) -> Result<World, WorldError> {
        std::fs::create_dir_all(&options.dir).map_err(|source| WorldError::Write {
            path: options.dir.clone(),
            source,
        })?;
        let names: Vec<String> = SUFFIXES[..3].iter().map(|s| format!("{KCP}-{s}")).collect();
        step("starting etcd: 3 members with TLS on 127.0.0.1");
        let etcd_options = EtcdOptions {
            parent_dir: Some(options.dir.clone()),
            names: names.clone(),
            ..EtcdOptions::new(3)
        };
        let etcd = tokio::task::spawn_blocking(move || EtcdCluster::start_with(etcd_options))
            .await
            .map_err(|e| WorldError::Join(e.to_string()))??;

        step("starting the API-server stand-in");
        let api = ApiServer::start().await.map_err(WorldError::ApiServer)?;
        seed(&api, &etcd, &names)?;

        step("starting quorumguard serve (webhook, prober, status publisher)");
        let certs = webhook_certs(&options.dir)?;
        let kubeconfig = options.dir.join("kubeconfig");
        write_kubeconfig(&api, &kubeconfig, KUBECONFIG_USER)?;
        let (serve, child, addr) = match &options.serve {
            ServeMode::InProcess => {
                let config = serve_config(&options, &certs);
                let client = api.client().map_err(WorldError::Client)?;
                let running = server::start(config, client)
                    .await
                    .map_err(WorldError::Serve)?;
                let addr = running.addr;
                (Serve::InProcess(Box::new(running)), None, addr)
            }
            ServeMode::Child(spec) => {
                let serve_kubeconfig = options.dir.join("serve-kubeconfig");
                write_kubeconfig(&api, &serve_kubeconfig, SERVE_USER)?;
                let plan = ChildPlan::new(spec, &options, &certs, &serve_kubeconfig)?;
                let process = plan.spawn(SERVE_IDENTITY)?;
                let process = plan.wait_listening(process).await?;
                let addr = plan.addr;
                (Serve::Child(process), Some(plan), addr)
            }
        };
        let target = WebhookTarget {
            addr,
            ca_pem: certs.ca_pem.clone(),
            server_name: SERVICE_DNS_NAME.to_string(),
        };
        let webhooks = Arc::new(
            WebhookDispatcher::for_repo_manifest(target)
                .map_err(|e| WorldError::Webhooks(e.to_string()))?,
        );
        Arc::clone(&webhooks).install(&api);
        Ok(World {
            api,
            webhooks,
            dir: options.dir,
            webhook_ca_pem: certs.ca_pem,
            etcd: Arc::new(Mutex::new(etcd)),
            server: Mutex::new(Some(serve)),
            child,
            next_name: Mutex::new(3),
            probe_interval: options.probe_interval,
            probe_deadline: options.probe_deadline,
        })
    }

    /// The running quorumguard's webhook and admin addresses (`None` once shut down, or while
    /// a child `serve` is killed).
    pub fn server_addrs(&self) -> Option<(SocketAddr, SocketAddr)> {
        let server = self.serve_slot();
        match (server.as_ref()?, &self.child) {
            (Serve::InProcess(r), _) => Some((r.addr, r.admin_addr)),
            (Serve::Child(_), Some(plan)) => Some((plan.addr, plan.admin_addr)),
            (Serve::Child(_), None) => None,
        }
    }

    /// What runs now (`None`: shut down, or a child `serve` killed).
    fn serve_slot(&self) -> std::sync::MutexGuard<'_, Option<Serve>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The running child `serve` (`None`: in-process mode, shut down, or killed).
    pub fn serve_process(&self) -> Option<ServeStart> {
        let server = self.serve_slot();
        match server.as_ref()? {
            Serve::Child(p) => Some(p.start.clone()),
            Serve::InProcess(_) => None,
        }
    }

    /// SIGKILLs the child `serve` and waits for it to be gone: no graceful shutdown, no Lease
    /// release, whatever it was doing (a probe, a status write, a review) cut short. Until
    /// [`World::restart_serve`], the stand-in's webhook calls fail as they would against a
    /// Service without endpoints, and are answered by the configuration's `failurePolicy`.
    pub fn kill_serve(&self) -> Result<ServeStart, WorldError> {
        if self.child.is_none() {
            return Err(WorldError::Child(
                "quorumguard runs in this process: start the world with ServeMode::Child to kill it".into(),
            ));
        }
        let taken = self.serve_slot().take();
        match taken {
            Some(Serve::Child(mut p)) => {
                p.kill()?;
                Ok(p.start.clone())
            }
            Some(other) => {
                *self.serve_slot() = Some(other);
                Err(WorldError::Child(
                    "quorumguard does not run as a child".into(),
                ))
            }
            None => Err(WorldError::Child("quorumguard serve is not running".into())),
        }
    }

    /// Starts the child `serve` again on the same ports, as `identity` (`None`:
    /// [`SERVE_IDENTITY`], the same pod's container restarted; another name: a replacement pod,
    /// which must wait for the dead holder's Lease to expire). Returns once it listens; it is
    /// ready to review and to write status only after [`World::wait_serving`].
    pub async fn restart_serve(&self, identity: Option<&str>) -> Result<ServeStart, WorldError> {
        let Some(plan) = &self.child else {
            return Err(WorldError::Child(
                "quorumguard runs in this process: start the world with ServeMode::Child to restart it".into(),
            ));
        };
        if self.serve_process().is_some() {
            return Err(WorldError::Child(
                "quorumguard serve is still running: kill it first".into(),
            ));
        }
        let process = plan.spawn(identity.unwrap_or(SERVE_IDENTITY))?;
        let process = plan.wait_listening(process).await?;
        let start = process.start.clone();
        *self.serve_slot() = Some(Serve::Child(process));
        Ok(start)
    }

    /// Waits (at most `limit`) until quorumguard serves: `/readyz` answers 200 (certificate
    /// loaded, watch caches synced, listening) and, for a child `serve`, the Lease names it as
    /// holder with a `renewTime` after it was spawned (it may write KCP status). Polls every
    /// 20 ms, so the instants are that precise.
    pub async fn wait_serving(&self, limit: Duration) -> Result<Serving, WorldError> {
        let started = Instant::now();
        let (mut ready, mut leading) = (None, None);
        let process = self.serve_process();
        for _ in 0..(limit.as_millis() / 20 + 1) {
            let Some((_, admin)) = self.server_addrs() else {
                return Err(WorldError::Child("quorumguard serve is not running".into()));
            };
            if ready.is_none() && http_status(admin, "/readyz").await == Some(200) {
                ready = Some(Instant::now());
            }
            if leading.is_none() {
                let leads = match &process {
                    None => true,
                    Some(p) => self.lease().is_some_and(|l| {
                        l.holder == p.identity && l.renewed.is_some_and(|t| t >= p.spawned)
                    }),
                };
                if leads {
                    leading = Some(Instant::now());
                }
            }
            if let (Some(ready), Some(leading)) = (ready, leading) {
                return Ok(Serving { ready, leading });
            }
            if started.elapsed() > limit {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(WorldError::Child(format!(
            "quorumguard was not serving within {limit:?}: ready={}, holds the Lease={}; Lease {LEASE_NAMESPACE}/{LEASE_NAME}: {:?}",
            ready.is_some(),
            leading.is_some(),
            self.lease()
        )))
    }

    /// The leader-election Lease as stored (`None`: not created yet).
    pub fn lease(&self) -> Option<LeaseView> {
        let lease = self.api.get(
            &ApiResource::erase::<Lease>(&()),
            LEASE_NAMESPACE,
            LEASE_NAME,
        )?;
        let spec = &lease["spec"];
        let renewed = spec["renewTime"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(SystemTime::from);
        Some(LeaseView {
            holder: spec["holderIdentity"].as_str().unwrap_or("").to_string(),
            renewed,
            transitions: spec["leaseTransitions"].as_i64().unwrap_or(0),
        })
    }

    /// How long before a published status etcd may have been as it says (the truth check): the
    /// probe that saw it took up to the probe deadline, the sweep it ended ran up to a probe
    /// interval before the write, and a loaded machine adds a second.
    pub fn truth_lag(&self) -> Duration {
        self.probe_deadline + self.probe_interval + Duration::from_secs(1)
    }

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

    /// How long to let quorumguard catch up with a change: two probe intervals.
    pub fn settle_time(&self) -> Duration {
        self.probe_interval * 2
    }

    /// The kubeconfig written for kubectl (acting as [`KUBECONFIG_USER`]).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
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

    /// A client acting as `user`.
    pub fn client_as(&self, user: &str) -> Result<kube::Client, WorldError> {
        kube::Client::try_from(self.api.kubeconfig_as(user)).map_err(WorldError::Client)
    }

    /// The next Machine name (`demo-control-plane-<suffix>`).
    pub fn new_machine_name(&self) -> String {
        let mut next = self
            .next_name
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let i = *next;
        *next += 1;
        match SUFFIXES.get(i) {
            Some(s) => format!("{KCP}-{s}"),
            None => format!("{KCP}-x{i}"),
        }
    }

    /// The KCP as stored.
    pub fn kcp(&self) -> Option<Value> {
        self.api.get(&kcp_resource(), NAMESPACE, KCP)
    }

    /// The KCP's `spec.replicas` and `spec.version`.
    pub fn kcp_spec(&self) -> (u64, String) {
        let kcp = self.kcp().unwrap_or_default();
        (
            kcp["spec"]["replicas"].as_u64().unwrap_or(0),
            kcp["spec"]["version"].as_str().unwrap_or("").to_string(),
        )
    }

    /// quorumguard's two conditions on the KCP.
    pub fn conditions(&self) -> Conditions {
        let kcp = self.kcp().unwrap_or_default();
        let mut out = Conditions::default();
        for c in kcp["status"]["conditions"].as_array().into_iter().flatten() {
            let published = Published {
                status: c["status"].as_str().unwrap_or("").to_string(),
                reason: c["reason"].as_str().unwrap_or("").to_string(),
                message: c["message"].as_str().unwrap_or("").to_string(),
            };
            match c["type"].as_str() {
                Some(CONDITION_ETCD_QUORUM) => out.quorum = Some(published),
                Some(CONDITION_NEXT_ACTION) => out.next_action = Some(published),
                _ => {}
            }
        }
        out
    }

    /// The control-plane Machines, oldest first (then by name).
    pub fn machines(&self) -> Vec<MachineView> {
        let mut out: Vec<MachineView> = self
            .api
            .list(&machine_resource())
            .iter()
            .filter(|m| m["metadata"]["namespace"] == NAMESPACE)
            .map(|m| {
                let meta = &m["metadata"];
                MachineView {
                    name: meta["name"].as_str().unwrap_or("").to_string(),
                    version: m["spec"]["version"].as_str().unwrap_or("").to_string(),
                    deleting: !meta["deletionTimestamp"].is_null(),
                    finalizers: meta["finalizers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|f| f.as_str().map(str::to_string))
                        .collect(),
                    annotations: meta["annotations"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                        .collect(),
                    created: meta["creationTimestamp"].as_str().unwrap_or("").to_string(),
                    node: m["status"]["nodeRef"]["name"].as_str().map(str::to_string),
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
        out
    }

    /// Creates a control-plane Machine `name` as KCP does: no node yet ([`World::set_node`]
    /// gives it one once its member has joined).
    pub async fn create_machine(&self, name: &str, version: &str) -> Result<(), WorldError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client_as(kcp_controller())?,
            NAMESPACE,
            &machine_resource(),
        );
        let object: DynamicObject =
            serde_json::from_value(machine_object(name, version, &kcp_uid(&self.api))).map_err(
                |e| WorldError::Other(format!("building Machine {NAMESPACE}/{name}: {e}")),
            )?;
        api.create(&Default::default(), &object)
            .await
            .map(|_| ())
            .map_err(|source| WorldError::Api {
                what: format!("creating Machine {NAMESPACE}/{name}"),
                source,
            })
    }

    /// Sets Machine `name`'s node to its own name (node == member name), as the Machine
    /// controller does once the node has joined.
    pub async fn set_node(&self, name: &str) -> Result<(), WorldError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client_as(MACHINE_CONTROLLER)?,
            NAMESPACE,
            &machine_resource(),
        );
        let status = json!({"status": {"nodeRef": {"name": name}, "phase": "Running"}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .map(|_| ())
            .map_err(|source| WorldError::Api {
                what: format!("setting Machine {NAMESPACE}/{name}'s node"),
                source,
            })
    }

    /// Deletes Machine `name` as `user` through the API (and so through the webhook). `Ok(Err)`
    /// is the API server's refusal: its HTTP code and message.
    pub async fn delete_machine(&self, name: &str, user: &str) -> Answer {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client_as(user)?, NAMESPACE, &machine_resource());
        answer(api.delete(name, &DeleteParams::background()).await, || {
            format!("deleting Machine {NAMESPACE}/{name}")
        })
    }

    /// Merge-patches the KCP's spec as `user` (through the webhook); `Ok(Err)` as for
    /// [`World::delete_machine`].
    pub async fn patch_kcp_spec(&self, spec: Value, user: &str) -> Answer {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client_as(user)?, NAMESPACE, &kcp_resource());
        let patch = Patch::Merge(json!({ "spec": spec }));
        answer(
            api.patch(KCP, &PatchParams::default(), &patch).await,
            || format!("updating KubeadmControlPlane {NAMESPACE}/{KCP}"),
        )
    }

    /// `kubectl scale kcp --replicas N` as `user`: an update of the `scale` subresource.
    pub async fn scale_kcp(&self, replicas: i32, user: &str) -> Answer {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client_as(user)?, NAMESPACE, &kcp_resource());
        let patch = Patch::Merge(json!({ "spec": { "replicas": replicas } }));
        answer(
            api.patch_scale(KCP, &PatchParams::default(), &patch).await,
            || format!("scaling KubeadmControlPlane {NAMESPACE}/{KCP}"),
        )
    }

    /// Merge-patches Machine `name`'s metadata as `user` (annotations, finalizers).
    pub async fn patch_machine_metadata(
        &self,
        name: &str,
        metadata: Value,
        user: &str,
    ) -> Result<(), WorldError> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client_as(user)?, NAMESPACE, &machine_resource());
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await
        .map(|_| ())
        .map_err(|source| WorldError::Api {
            what: format!("updating Machine {NAMESPACE}/{name}"),
            source,
        })
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
        set_endpoints(&self.api, &urls.join(","))
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

    /// Stops quorumguard, then every etcd process. Etcd operations in flight finish first
    /// (each is bounded).
    pub async fn shutdown(&self) {
        let running = self.serve_slot().take();
        match running {
            Some(Serve::InProcess(running)) => running.shutdown().await,
            // A test harness: no need for serve's graceful shutdown.
            Some(Serve::Child(mut p)) => {
                if let Err(e) = p.kill() {
                    tracing::warn!(error = %e, "stopping quorumguard serve");
                }
            }
            None => {}
        }
        self.api.clear_admission_hook();
        let _ = self
            .etcd(|e| {
                for i in 0..e.len() {
                    e.kill(i);
                }
            })
            .await;
    }
}

/// What the API server said to a request a person or controller makes: `Ok(Err((code,
/// message)))` when it refused (a webhook's denial among others), `Err` when it could not be asked.
type Answer = Result<Result<(), (u16, String)>, WorldError>;

fn answer<T>(result: Result<T, kube::Error>, what: impl FnOnce() -> String) -> Answer {
    match result {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(status)) => Ok(Err((status.code, status.message))),
        Err(source) => Err(WorldError::Api {
            what: what(),
            source,
        }),
    }
}

/// The webhook's CA and serving certificate (for the Service DNS name), written to `dir`.
struct WebhookCerts {
    ca_pem: String,
    cert_file: PathBuf,
    key_file: PathBuf,
}

fn webhook_certs(dir: &Path) -> Result<WebhookCerts, WorldError> {
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

fn serve_config(options: &WorldOptions, certs: &WebhookCerts) -> ServeConfig {
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    ServeConfig {
        listen: loopback,
        admin_listen: loopback,
        tls_cert: certs.cert_file.clone(),
        tls_key: certs.key_file.clone(),
        tls_reload_interval: Duration::from_secs(60),
        policy: Policy::default(),
        reservation_ttl: Duration::from_secs(30),
        shutdown_delay: Duration::ZERO,
        shutdown_grace: Duration::from_secs(1),
        pod_name: Some("quorumguard-playground".into()),
        events: true,
        sweep: Some(SweepConfig {
            interval: options.probe_interval,
            deadline: options.probe_deadline,
            concurrency: 4,
            transport: TransportKind::Direct,
            confirmation: Confirmation {
                election_timeout: options.election_timeout,
            },
            ..SweepConfig::default()
        }),
        status: Some(StatusConfig {
            publish: PublishConfig::default(),
            lease: None,
        }),
    }
}

/// Writes a kubeconfig for the stand-in whose user acts as `user` (kubectl and kube send it as
/// `Impersonate-User`, which the stand-in takes as the requesting user): [`KUBECONFIG_USER`]
/// for people, [`SERVE_USER`] for a child `serve`.
fn write_kubeconfig(api: &ApiServer, path: &Path, user: &str) -> Result<(), WorldError> {
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

/// The leader-election Lease, as [`World::lease`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// `spec.holderIdentity` ("" when released).
    pub holder: String,
    /// `spec.renewTime`.
    pub renewed: Option<SystemTime>,
    /// `spec.leaseTransitions`: how often another identity took it over.
    pub transitions: i64,
}

/// The running quorumguard.
enum Serve {
    InProcess(Box<Running>),
    Child(ServeProcess),
}

/// How to start `serve` as a child process: the same flags and ports every time.
struct ChildPlan {
    exe: PathBuf,
    dir: PathBuf,
    args: Vec<String>,
    addr: SocketAddr,
    admin_addr: SocketAddr,
    /// Processes started so far, for their log files' names.
    started: Mutex<usize>,
}

/// A free port on 127.0.0.1 (bound and released: the child binds it a moment later).
fn free_addr() -> Result<SocketAddr, WorldError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| WorldError::Child(format!("finding a free port on 127.0.0.1: {e}")))
}

impl ChildPlan {
    /// `serve`'s flags for the world: what [`serve_config`] sets in-process, plus the Lease.
    fn new(
        spec: &ChildServe,
        options: &WorldOptions,
        certs: &WebhookCerts,
        kubeconfig: &Path,
    ) -> Result<Self, WorldError> {
        let (addr, admin_addr) = (free_addr()?, free_addr()?);
        let d = |d: Duration| humantime::format_duration(d).to_string();
        let args = vec![
            format!("--listen={addr}"),
            format!("--admin-listen={admin_addr}"),
            format!("--tls-cert-file={}", certs.cert_file.display()),
            format!("--tls-key-file={}", certs.key_file.display()),
            "--tls-reload-interval=60s".into(),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--log=info".into(),
            "--etcd-transport=direct".into(),
            format!("--probe-interval={}", d(options.probe_interval)),
            format!("--probe-timeout={}", d(options.probe_deadline)),
            format!("--etcd-election-timeout={}", d(options.election_timeout)),
            "--probe-concurrency=4".into(),
            "--reservation-ttl=30s".into(),
            "--shutdown-delay=0s".into(),
            "--shutdown-grace=1s".into(),
            format!("--lease-duration={}", d(spec.lease_duration)),
            format!("--lease-renew-deadline={}", d(spec.lease_renew_deadline)),
            format!("--lease-retry-period={}", d(spec.lease_retry_period)),
        ];
        Ok(ChildPlan {
            exe: spec.exe.clone(),
            dir: options.dir.clone(),
            args,
            addr,
            admin_addr,
            started: Mutex::new(0),
        })
    }

    /// Spawns `serve` as `identity`, its output to `serve-<n>.log` in the world's directory.
    fn spawn(&self, identity: &str) -> Result<ServeProcess, WorldError> {
        let n = {
            let mut started = self.started.lock().unwrap_or_else(PoisonError::into_inner);
            *started += 1;
            *started
        };
        let log = self.dir.join(format!("serve-{n}.log"));
        let out = std::fs::File::create(&log).map_err(|source| WorldError::Write {
            path: log.clone(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| WorldError::Write {
            path: log.clone(),
            source,
        })?;
        let mut command = Command::new(&self.exe);
        command
            .arg("serve")
            .args(&self.args)
            .arg(format!("--pod-name={identity}"))
            // Nothing from the caller's environment (QUORUMGUARD_* twins of the flags).
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = super::child::spawn(command).map_err(|e| {
            WorldError::Child(format!("spawning {} serve: {e}", self.exe.display()))
        })?;
        Ok(ServeProcess {
            start: ServeStart {
                pid: child.id(),
                identity: identity.to_string(),
                spawned: SystemTime::now(),
                log,
            },
            child,
        })
    }

    /// Waits (at most [`CHILD_START_WAIT`]) until the admin port answers `/livez` and the
    /// webhook port accepts connections, as [`crate::server::start`] returns once both listen.
    async fn wait_listening(&self, mut p: ServeProcess) -> Result<ServeProcess, WorldError> {
        let started = Instant::now();
        for _ in 0..(CHILD_START_WAIT.as_millis() / 20) {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(WorldError::Child(format!(
                    "serve (pid {}) exited with {status} before listening; its log {}:\n{}",
                    p.start.pid,
                    p.start.log.display(),
                    tail(&p.start.log)
                )));
            }
            if http_status(self.admin_addr, "/livez").await == Some(200)
                && tokio::net::TcpStream::connect(self.addr).await.is_ok()
            {
                return Ok(p);
            }
            if started.elapsed() > CHILD_START_WAIT {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = p.kill();
        Err(WorldError::Child(format!(
            "serve (pid {}) did not listen on {} and {} within {CHILD_START_WAIT:?}; its log {}:\n{}",
            p.start.pid,
            self.addr,
            self.admin_addr,
            p.start.log.display(),
            tail(&p.start.log)
        )))
    }
}

/// The last lines of a log, for errors.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A child `serve`; killed when dropped, so none outlives its world.
struct ServeProcess {
    child: Child,
    start: ServeStart,
}

impl ServeProcess {
    /// SIGKILL (what `Child::kill` sends on Unix), then reaps it.
    fn kill(&mut self) -> Result<(), WorldError> {
        if let Ok(Some(_)) = self.child.try_wait() {
            return Ok(());
        }
        self.child.kill().map_err(|e| {
            WorldError::Child(format!("SIGKILL to serve (pid {}): {e}", self.start.pid))
        })?;
        self.child.wait().map(|_| ()).map_err(|e| {
            WorldError::Child(format!("waiting for serve (pid {}): {e}", self.start.pid))
        })
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// The HTTP status of `GET path` on a plain-HTTP admin port (`None`: no answer within 1 s).
async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        // "HTTP/1.1 200"
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(1), exchange)
        .await
        .ok()
        .flatten()
}

fn store(api: &ApiServer, what: &str, object: Value) -> Result<(), WorldError> {
    api.insert(object)
        .map(|_| ())
        .map_err(|source| WorldError::Store {
            what: what.to_string(),
            source,
        })
}

fn set_endpoints(api: &ApiServer, urls: &str) -> Result<(), WorldError> {
    let urls = urls.to_string();
    api.modify(&cluster_resource(), NAMESPACE, CLUSTER, move |c| {
        c["metadata"]["annotations"][ETCD_ENDPOINTS_ANNOTATION] = json!(urls);
    })
    .map(|_| ())
    .map_err(|source| WorldError::Store {
        what: format!("Cluster {NAMESPACE}/{CLUSTER}"),
        source,
    })
}

/// How long ago the seeded objects were created: the control plane has been running for months,
/// so its Machines are not mistaken for ones still joining (quorumguard gives a Machine without
/// a member `--join-grace` before calling it broken).
const SEEDED_AGE_SECS: i64 = 90 * 24 * 3600;

/// Seeds the Cluster, the KCP, one Machine per member and the etcd CA Secret.
fn seed(api: &ApiServer, etcd: &EtcdCluster, names: &[String]) -> Result<(), WorldError> {
    let created = k8s_openapi::jiff::Timestamp::from_second(crate::unix_now() - SEEDED_AGE_SECS)
        .map(|t| t.to_string())
        .map_err(|e| WorldError::Other(format!("a creation time: {e}")))?;
    let cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {
            "name": CLUSTER,
            "namespace": NAMESPACE,
            "creationTimestamp": created,
            "annotations": {
                ETCD_TRANSPORT_ANNOTATION: "direct",
                ETCD_ENDPOINTS_ANNOTATION: etcd.endpoints().join(","),
            },
        },
        "spec": {
            "controlPlaneRef": {
                "apiGroup": "controlplane.cluster.x-k8s.io",
                "kind": "KubeadmControlPlane",
                "name": KCP,
            },
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "DevCluster",
                "name": CLUSTER,
            },
        },
    });
    store(api, &format!("Cluster {NAMESPACE}/{CLUSTER}"), cluster)?;
    let kcp = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmControlPlane",
        "metadata": {
            "name": KCP,
            "namespace": NAMESPACE,
            "creationTimestamp": created,
            "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER},
            "generation": 1,
        },
        "spec": {
            "replicas": 3,
            "version": OLD_VERSION,
            "kubeadmConfigSpec": {"clusterConfiguration": {"etcd": {"local": {"dataDir": "/var/lib/etcd"}}}},
            "machineTemplate": {"spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "DevMachineTemplate",
                "name": KCP,
            }}},
            "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}},
        },
    });
    store(api, &format!("KubeadmControlPlane {NAMESPACE}/{KCP}"), kcp)?;
    let kcp_uid = kcp_uid(api);
    for name in names {
        let mut machine = machine_object(name, OLD_VERSION, &kcp_uid);
        machine["metadata"]["creationTimestamp"] = json!(created);
        machine["status"] = json!({"nodeRef": {"name": name}, "phase": "Running"});
        store(api, &format!("Machine {NAMESPACE}/{name}"), machine)?;
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{CLUSTER}-etcd")),
            namespace: Some(NAMESPACE.into()),
            labels: Some(
                [(
                    "cluster.x-k8s.io/cluster-name".to_string(),
                    CLUSTER.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [
                ("tls.crt", &etcd.pki.ca_cert_pem),
                ("tls.key", &etcd.pki.ca_key_pem),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect(),
        ),
        ..Default::default()
    };
    let secret = serde_json::to_value(&secret).map_err(|e| WorldError::Other(e.to_string()))?;
    store(api, &format!("Secret {NAMESPACE}/{CLUSTER}-etcd"), secret)
}

/// The stored KCP's uid, for the Machines' owner reference.
fn kcp_uid(api: &ApiServer) -> String {
    api.get(&kcp_resource(), NAMESPACE, KCP)
        .and_then(|k| k["metadata"]["uid"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A control-plane Machine of the KCP, as KCP creates it (no status).
fn machine_object(name: &str, version: &str, kcp_uid: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {
                "cluster.x-k8s.io/cluster-name": CLUSTER,
                "cluster.x-k8s.io/control-plane": "",
                "cluster.x-k8s.io/control-plane-name": KCP,
            },
            "annotations": {KCP_PRE_TERMINATE_HOOK: ""},
            "finalizers": [MACHINE_FINALIZER],
            "ownerReferences": [{
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
                "kind": "KubeadmControlPlane",
                "name": KCP,
                "uid": kcp_uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "clusterName": CLUSTER,
            "version": version,
            "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "DevMachine",
                "name": name,
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_action_names_its_machine() {
        let c = Conditions {
            quorum: None,
            next_action: Some(Published {
                status: "True".into(),
                reason: "DeleteMachine".into(),
                message: "Machine default/demo-control-plane-7xk2p has a node but its etcd member is already gone. Run: kubectl delete machine -n default demo-control-plane-7xk2p".into(),
            }),
        };
        assert_eq!(c.action(), "DeleteMachine");
        assert_eq!(
            c.action_target().as_deref(),
            Some("demo-control-plane-7xk2p")
        );
        assert_eq!(Conditions::default().action_target(), None);
    }
}
