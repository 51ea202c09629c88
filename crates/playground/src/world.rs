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
//!
//! With [`WorldOptions::real_api`] the same world runs on a real kube-apiserver started for the
//! run ([`crate::realapi`]) instead of the stand-in: the objects are created through its API
//! (and so pass the CRDs' schemas), the repo's ValidatingWebhookConfiguration is registered
//! there and kube-apiserver itself calls the webhook, through a recording relay that logs each
//! call as the dispatcher logs its own ([`crate::webhooks::Relay`]).
//!
//! This file holds the names the world uses, its options, and [`World`] itself: starting it,
//! its timings, and stopping it. The rest, one file each under `world/`:
//! - `backend.rs`: the stand-in or the real server under one face: reads, clients acting as a
//!   user, waiting until a write is seen.
//! - `real.rs`: starting the real server, and its webhook registration and relay.
//! - `serve.rs`: quorumguard serve as the world runs it (in process or as a child): started,
//!   killed, restarted and waited for, and the Lease it holds.
//! - `child_serve.rs`: `quorumguard serve` as a child process: its flags, spawning it, waiting
//!   for it to listen, killing it.
//! - `files.rs`: the files the world writes: the webhook's certificates and the kubeconfigs.
//! - `objects.rs`: the Cluster API objects the stand-in is seeded with, and a Machine as KCP
//!   creates it.
//! - `view.rs`: the KCP, its published conditions and the Machines, as the playground reads them.
//! - `requests.rs`: the writes people and controllers make through the API (and so through the
//!   webhook).
//! - `members.rs`: the etcd cluster under the world: what it lists, and the Cluster's endpoints
//!   annotation kept current with it.
//! - `starts.rs`: starting states a test puts the world in before a rollout (a member frozen or
//!   killed, a leftover learner, a learner never promoted, a fourth Machine, a Machine stuck
//!   deleting), and the control plane as `quorumguard status` sees it (one listing, one probe).

mod backend;
mod child_serve;
mod files;
mod members;
mod objects;
mod real;
mod requests;
mod serve;
mod starts;
#[cfg(test)]
mod tests;
mod view;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::apiserver::{ApiServer, StoreError};
use super::etcd::{EtcdCluster, EtcdError, EtcdOptions};
use super::realapi::Assets;
use super::webhooks::{SERVICE_DNS_NAME, WebhookDispatcher, WebhookTarget};
use crate::engine::model::{DEFAULT_KCP_CONTROLLER, Policy};
use crate::server;
use crate::server::autopilot::AutopilotConfig;
use child_serve::ChildPlan;
use files::{WebhookCerts, webhook_certs};
use objects::{seed, seed_health_check};
use real::{real_webhooks, start_real};
use serve::{Serve, start_serve};

pub use backend::{Backend, RealBackend};
pub use serve::{
    LEASE_NAME, LEASE_NAMESPACE, LeaseView, SERVE_IDENTITY, SERVE_USER, ServeStart, Serving,
};
pub use starts::{FOREIGN_PRE_TERMINATE_HOOK, Start};
pub use view::{Conditions, MachineView, Published};

/// The namespace of the playground's workload cluster objects.
pub const NAMESPACE: &str = "default";
/// The Cluster.
pub const CLUSTER: &str = "demo";
/// The KubeadmControlPlane.
pub const KCP: &str = "demo-control-plane";
/// The Kubernetes version the control plane starts with.
pub const OLD_VERSION: &str = "v1.31.4";
/// The version `upgrade-stuck` rolls out, and the one `remediate-second` runs (kubeadm's learner
/// joins are GA from v1.32).
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

/// quorumguard's `--join-grace` on a real kube-apiserver. The server stamps the seeded Machines'
/// `creationTimestamp` itself (now, not months ago as the stand-in's seed says), so serve gives
/// a new Machine this long to get its etcd member, and the world waits until the seeded ones are
/// older before a story starts.
pub const REAL_JOIN_GRACE: Duration = Duration::from_secs(8);

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
    /// Run on a real kube-apiserver instead of the stand-in (`None`: the stand-in).
    pub real_api: Option<RealApiPlan>,
    /// etcd members, and as many Machines: 1 to [`MAX_SEEDED`] (default 3).
    pub members: usize,
    /// The KCP's `spec.replicas` (`None`: as many as [`WorldOptions::members`]).
    pub replicas: Option<usize>,
    /// The KCP's `spec.version` and the seeded Machines' (default [`OLD_VERSION`]).
    pub version: &'static str,
    /// Seed a MachineHealthCheck that covers the control-plane Machines (default true):
    /// without one the remediate-machine annotation does nothing, as in Cluster API.
    pub health_check: bool,
    /// quorumguard's autopilot (in-process serve only; `None`: off, the default).
    pub autopilot: Option<AutopilotConfig>,
    /// Extra flags for every etcd member (e.g. a small `--quota-backend-bytes`, so that a
    /// story can fill the database until etcd raises NOSPACE).
    pub etcd_flags: Vec<String>,
}

/// The most members (and Machines) a world starts with.
pub const MAX_SEEDED: usize = 5;

/// A real kube-apiserver to run the world on: its binaries and the Cluster API CRDs to install.
#[derive(Clone, Debug)]
pub struct RealApiPlan {
    pub assets: Assets,
    /// A directory of the CRDs' YAML files.
    pub crds: PathBuf,
}

impl WorldOptions {
    pub fn new(dir: PathBuf) -> Self {
        WorldOptions {
            dir,
            probe_interval: Duration::from_millis(500),
            probe_deadline: Duration::from_secs(1),
            election_timeout: super::etcd::ELECTION_TIMEOUT,
            serve: ServeMode::InProcess,
            real_api: None,
            members: 3,
            replicas: None,
            version: OLD_VERSION,
            health_check: true,
            autopilot: None,
            etcd_flags: Vec::new(),
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

/// The running world. [`World::shutdown`] stops it; dropping it also stops every etcd process.
pub struct World {
    /// The API server: the stand-in or a real kube-apiserver.
    pub api: Backend,
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
    /// The policy `serve` runs with (the webhook's and the prober's).
    policy: Policy,
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
        let (etcd, names) = start_etcd(&options, &step).await?;
        let api = start_api(&options, &step).await?;
        let n = options.members;
        let replicas = options.replicas.unwrap_or(n);
        seed(&api, &etcd, &names, replicas, options.version).await?;
        if options.health_check {
            seed_health_check(&api).await?;
        }
        let seeded = tokio::time::Instant::now();

        step("starting quorumguard serve (webhook, prober, status publisher)");
        let certs = webhook_certs(&options.dir)?;
        let started = start_serve(&options, &api, &certs).await?;
        let webhooks = install_webhooks(&api, started.addr, &certs, seeded).await?;
        Ok(World {
            api,
            webhooks,
            dir: options.dir,
            webhook_ca_pem: certs.ca_pem,
            etcd: Arc::new(Mutex::new(etcd)),
            server: Mutex::new(Some(started.serve)),
            child: started.child,
            next_name: Mutex::new(n),
            policy: started.policy,
            probe_interval: options.probe_interval,
            probe_deadline: options.probe_deadline,
        })
    }
    /// How long before a published status etcd may have been as it says (the truth check): the
    /// probe that saw it took up to the probe deadline, the sweep it ended ran up to a probe
    /// interval before the write, and a loaded machine adds a second.
    pub fn truth_lag(&self) -> Duration {
        self.probe_deadline + self.probe_interval + Duration::from_secs(1)
    }

    /// The policy quorumguard serve runs with here.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The per-probe deadline quorumguard serve runs with here.
    pub fn probe_deadline(&self) -> Duration {
        self.probe_deadline
    }

    /// How long to let quorumguard catch up with a change: two probe intervals.
    pub fn settle_time(&self) -> Duration {
        self.probe_interval * 2
    }

    /// The kubeconfig written for kubectl (acting as [`KUBECONFIG_USER`]).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// A client acting as `user`.
    pub fn client_as(&self, user: &str) -> Result<kube::Client, WorldError> {
        kube::Client::try_from(self.api.config_as(user)).map_err(WorldError::Client)
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
        match &self.api {
            Backend::StandIn(api) => api.clear_admission_hook(),
            Backend::Real(real) => real.stop(),
        }
        let _ = self
            .etcd(|e| {
                for i in 0..e.len() {
                    e.kill(i);
                }
            })
            .await;
    }
}

/// Creates the world's directory and starts its etcd cluster (on a blocking thread), its
/// members named after their Machines; returns it with those names.
async fn start_etcd(
    options: &WorldOptions,
    step: &(impl Fn(&str) + Send + Sync),
) -> Result<(EtcdCluster, Vec<String>), WorldError> {
    std::fs::create_dir_all(&options.dir).map_err(|source| WorldError::Write {
        path: options.dir.clone(),
        source,
    })?;
    let n = options.members;
    if !(1..=MAX_SEEDED).contains(&n) {
        return Err(WorldError::Other(format!(
            "a world starts with 1 to {MAX_SEEDED} members, not {n}"
        )));
    }
    let names: Vec<String> = SUFFIXES[..n].iter().map(|s| format!("{KCP}-{s}")).collect();
    // Which etcd: QUORUMGUARD_ETCD_BIN_DIR's, else PATH's (crate::etcd::program).
    let version = crate::etcd::etcd_version()
        .map(|v| format!(" {v}"))
        .unwrap_or_default();
    step(&format!(
        "starting etcd{version}: {n} member{} with TLS on 127.0.0.1",
        if n == 1 { "" } else { "s" }
    ));
    let etcd_options = EtcdOptions {
        parent_dir: Some(options.dir.clone()),
        names: names.clone(),
        flags: options.etcd_flags.clone(),
        ..EtcdOptions::new(n)
    };
    let etcd = tokio::task::spawn_blocking(move || EtcdCluster::start_with(etcd_options))
        .await
        .map_err(|e| WorldError::Join(e.to_string()))??;
    Ok((etcd, names))
}

/// Starts the API server the options ask for: the stand-in, or a real kube-apiserver with the
/// Cluster API CRDs (in-process serve only).
async fn start_api(
    options: &WorldOptions,
    step: &(impl Fn(&str) + Send + Sync),
) -> Result<Backend, WorldError> {
    match &options.real_api {
        None => {
            step("starting the API-server stand-in");
            Ok(Backend::StandIn(
                ApiServer::start().await.map_err(WorldError::ApiServer)?,
            ))
        }
        Some(plan) => {
            if matches!(options.serve, ServeMode::Child(_)) {
                return Err(WorldError::Other(
                    "a real kube-apiserver runs quorumguard serve in process only".into(),
                ));
            }
            step("starting a real kube-apiserver and its etcd, installing the Cluster API CRDs");
            start_real(plan, &options.dir).await
        }
    }
}

/// Points the repo's ValidatingWebhookConfiguration at `addr` and installs it: in the stand-in's
/// dispatcher, or registered on the real server (which then waits until the Machines seeded at
/// `seeded` are older than [`REAL_JOIN_GRACE`]).
async fn install_webhooks(
    api: &Backend,
    addr: SocketAddr,
    certs: &WebhookCerts,
    seeded: tokio::time::Instant,
) -> Result<Arc<WebhookDispatcher>, WorldError> {
    let target = WebhookTarget {
        addr,
        ca_pem: certs.ca_pem.clone(),
        server_name: SERVICE_DNS_NAME.to_string(),
    };
    let webhooks = Arc::new(
        WebhookDispatcher::for_repo_manifest(target)
            .map_err(|e| WorldError::Webhooks(e.to_string()))?,
    );
    match api {
        Backend::StandIn(standin) => Arc::clone(&webhooks).install(standin),
        Backend::Real(real) => {
            real_webhooks(real, &webhooks).await?;
            // The seeded Machines must not count as new ones still joining.
            tokio::time::sleep_until(seeded + REAL_JOIN_GRACE + Duration::from_secs(1)).await;
        }
    }
    Ok(webhooks)
}
