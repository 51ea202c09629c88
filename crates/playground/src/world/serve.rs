//! quorumguard serve as the world runs it: started in this process or as a child process that
//! can be killed, restarted and waited for, the Lease a child holds, and the in-process
//! configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::PoisonError;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ApiResource;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::child_serve::{ChildPlan, ServeProcess};
use super::files::{WebhookCerts, write_kubeconfig};
use super::{
    Backend, KUBECONFIG_USER, REAL_JOIN_GRACE, ServeMode, World, WorldError, WorldOptions,
};
use crate::engine::{Confirmation, Policy};
use crate::server::{self, Running, ServeConfig, StatusConfig};
use crate::status::publish::PublishConfig;
use quorumguard_observe::etcd::TransportKind;
use quorumguard_observe::etcd::sweep::SweepConfig;

/// The namespace of the Lease a child `serve` holds (serve's default, `POD_NAMESPACE`).
pub const LEASE_NAMESPACE: &str = "quorumguard-system";
/// The Lease's name (serve's `--leader-election-lease` default).
pub const LEASE_NAME: &str = "quorumguard";
/// The identity (`--pod-name`) of the child `serve` unless [`World::restart_serve`] is given
/// another: a container restarted by kubelet keeps its pod's name.
pub const SERVE_IDENTITY: &str = "quorumguard-playground";
/// Who the child `serve` acts as towards the stand-in: the service account of the manifests.
pub const SERVE_USER: &str = "system:serviceaccount:quorumguard-system:quorumguard";

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

impl World {
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
    pub(super) fn serve_slot(&self) -> std::sync::MutexGuard<'_, Option<Serve>> {
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
}

pub(super) fn serve_config(options: &WorldOptions, certs: &WebhookCerts) -> ServeConfig {
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    ServeConfig {
        listen: loopback,
        admin_listen: loopback,
        tls_cert: certs.cert_file.clone(),
        tls_key: certs.key_file.clone(),
        tls_reload_interval: Duration::from_secs(60),
        client_auth: None,
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
        autopilot: options.autopilot.clone(),
    }
}

/// quorumguard serve as [`start_serve`] started it.
pub(super) struct Started {
    pub(super) serve: Serve,
    /// How to start it again (child mode only).
    pub(super) child: Option<ChildPlan>,
    /// Where its webhook answers.
    pub(super) addr: SocketAddr,
    /// The policy it runs with.
    pub(super) policy: Policy,
}

/// Starts quorumguard serve as the options ask, writing the kubeconfigs it and kubectl use: in
/// this process over the stand-in, in this process over the real server (with
/// [`REAL_JOIN_GRACE`]), or as a child process over the stand-in.
pub(super) async fn start_serve(
    options: &WorldOptions,
    api: &Backend,
    certs: &WebhookCerts,
) -> Result<Started, WorldError> {
    let kubeconfig = options.dir.join("kubeconfig");
    let mut policy = serve_config(options, certs).policy;
    let (serve, child, addr) = match (&options.serve, api) {
        (ServeMode::InProcess, Backend::StandIn(standin)) => {
            write_kubeconfig(standin, &kubeconfig, KUBECONFIG_USER)?;
            let client = standin.client().map_err(WorldError::Client)?;
            let running = server::start(serve_config(options, certs), client)
                .await
                .map_err(WorldError::Serve)?;
            let addr = running.addr;
            (Serve::InProcess(Box::new(running)), None, addr)
        }
        (ServeMode::InProcess, Backend::Real(real)) => {
            // kubectl acts as the admin (system:masters) on the real server.
            let text = real
                .with_api(|r| r.kubeconfig_text(None))
                .map_err(|e| WorldError::Other(e.to_string()))?;
            std::fs::write(&kubeconfig, text).map_err(|source| WorldError::Write {
                path: kubeconfig.clone(),
                source,
            })?;
            let mut config = serve_config(options, certs);
            config.policy.join_grace = REAL_JOIN_GRACE;
            policy = config.policy.clone();
            let running = server::start(config, real.admin_client()?)
                .await
                .map_err(WorldError::Serve)?;
            let addr = running.addr;
            (Serve::InProcess(Box::new(running)), None, addr)
        }
        (ServeMode::Child(spec), api) => {
            let Backend::StandIn(standin) = api else {
                return Err(WorldError::Other("unreachable: checked above".into()));
            };
            write_kubeconfig(standin, &kubeconfig, KUBECONFIG_USER)?;
            let serve_kubeconfig = options.dir.join("serve-kubeconfig");
            write_kubeconfig(standin, &serve_kubeconfig, SERVE_USER)?;
            let plan = ChildPlan::new(spec, options, certs, &serve_kubeconfig)?;
            let process = plan.spawn(SERVE_IDENTITY)?;
            let process = plan.wait_listening(process).await?;
            let addr = plan.addr;
            (Serve::Child(process), Some(plan), addr)
        }
    };
    Ok(Started {
        serve,
        child,
        addr,
        policy,
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
pub(super) enum Serve {
    InProcess(Box<Running>),
    Child(ServeProcess),
}

/// The HTTP status of `GET path` on a plain-HTTP admin port (`None`: no answer within 1 s).
pub(super) async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
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
