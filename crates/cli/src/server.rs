//! `quorumguard serve` as a library: the webhook over HTTPS, the admin endpoints over plain
//! HTTP, the watches that feed the caches, certificate reload and graceful shutdown.
//!
//! Tests start it in-process with [`start`]; the binary wraps it with flags and signals.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum_server::Handle;
use kube::Client;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use quorumguard_admission::{Webhook, events};
use quorumguard_engine::Policy;
use quorumguard_observe::etcd::fresh::FreshProbes;
use quorumguard_observe::etcd::sweep::{Probers, SweepConfig};
use quorumguard_observe::state::{ClusterState, Kind, watch};
use quorumguard_pki::tls;
use quorumguard_status::lease::{Elector, Leadership, LeaseConfig};
use quorumguard_status::metrics::EnricherMetrics;
use quorumguard_status::publish::{self, PublishConfig, Publisher};
use quorumguard_telemetry::{Metrics, Readiness, admin_router};

mod https;

use https::bounded;
pub use https::{FIRST_REQUEST_TIMEOUT, HEADER_READ_TIMEOUT, Handshakes, REQUEST_TIMEOUT, https};

/// Sets glibc's allocator up for serving: no fastbins (`M_MXFAST` 0). Call it first thing in
/// `main`, before any thread starts.
///
/// Under review load, small blocks are allocated on one runtime thread (h2 frames, a review's
/// strings) and freed on another, and every 10 KB body or TLS buffer allocated while fastbins
/// hold freed blocks makes glibc consolidate them all (`malloc_consolidate`, `unlink_chunk`:
/// 16% of the server's CPU in a `perf` profile of `cargo bench --bench webhook_load`). Without
/// fastbins, small blocks go through the per-thread cache and the ordinary bins. Measured in
/// docs/benchmarks.md ("The webhook under load").
pub fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_MXFAST, 0);
    }
}

/// Logs the serving certificate's validity when it changes: an error while kube-apiserver would
/// refuse it, a warning in the last days before expiry, info otherwise.
fn report_validity(validity: &tls::Validity, problem: Option<tls::ValidityProblem>, path: &Path) {
    let now = quorumguard_pki::certs::unix_secs(std::time::SystemTime::now());
    let not_after = quorumguard_pki::certs::format_time(validity.not_after);
    match problem {
        None => tracing::info!(%not_after, "serving certificate valid"),
        Some(p @ tls::ValidityProblem::ExpiresSoon) => {
            tracing::warn!(%not_after, "{}", validity.describe(p, path, now));
        }
        Some(p) => tracing::error!(%not_after, "{}", validity.describe(p, path, now)),
    }
}

/// Everything `serve` needs to know.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub tls_reload_interval: Duration,
    /// Require and verify a client certificate (kube-apiserver's) on the webhook port; `None`:
    /// any client may connect. Its CA file is reloaded with the serving pair.
    pub client_auth: Option<tls::ClientAuth>,
    pub policy: Policy,
    pub reservation_ttl: Duration,
    /// After SIGTERM, how long to report not-ready before refusing new connections, so that
    /// endpoints controllers and load balancers stop sending reviews first.
    pub shutdown_delay: Duration,
    /// How long in-flight reviews may take to finish once shutdown starts.
    pub shutdown_grace: Duration,
    /// This replica's name, for Events.
    pub pod_name: Option<String>,
    /// Publish Events for denials and break-glass uses.
    pub events: bool,
    /// Probe every workload cluster's etcd on a timer (`None`: health stays unknown, for tests
    /// that set it themselves).
    pub sweep: Option<SweepConfig>,
    /// Publish conditions into KCP status after each sweep (needs `sweep`). `None`: probe only.
    pub status: Option<StatusConfig>,
}

/// How the status enricher publishes.
#[derive(Clone, Debug, Default)]
pub struct StatusConfig {
    pub publish: PublishConfig,
    /// Write only while holding this Lease. `None`: this replica always writes (one replica,
    /// or tests).
    pub lease: Option<LeaseConfig>,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// `what`: which of the TLS files (the error names its path).
    #[error("loading {what}: {error}")]
    Tls {
        what: &'static str,
        error: tls::TlsError,
    },
    #[error("binding the admin address {addr}: {source}")]
    AdminBind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "the webhook server did not start listening on {0} (address in use, or no permission?)"
    )]
    Listen(SocketAddr),
}

/// Which TLS file a load error is about, in words: the serving certificate, its key, or the
/// client CA; the error itself names the path.
fn tls_file_kind(error: &tls::TlsError, config: &ServeConfig) -> &'static str {
    let path = error.path();
    let is = |p: &std::path::Path| path == Some(p);
    if let Some(auth) = &config.client_auth
        && is(&auth.ca_file)
    {
        "the client CA"
    } else if is(&config.tls_key) {
        "the serving key"
    } else if is(&config.tls_cert) {
        "the serving certificate"
    } else {
        "the serving certificate and key"
    }
}

/// A running server.
pub struct Running {
    /// Where the webhook answers (HTTPS).
    pub addr: SocketAddr,
    /// Where /livez, /readyz and /metrics answer (HTTP).
    pub admin_addr: SocketAddr,
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
    pub state: Arc<ClusterState>,
    pub webhook: Arc<Webhook>,
    /// Whether this replica writes KCP status (`None`: status publishing is off).
    pub leadership: Option<Leadership>,
    elector: Option<Arc<Elector>>,
    handle: Handle<SocketAddr>,
    config: ServeConfig,
    server: JoinHandle<std::io::Result<()>>,
    tasks: Vec<JoinHandle<()>>,
}

/// Starts the watches, the webhook and the admin server. Returns once both listen.
pub async fn start(config: ServeConfig, client: Client) -> Result<Running, ServerError> {
    let metrics = Arc::new(Metrics::new());
    let readiness = Arc::new(Readiness::default());
    let state = Arc::new(ClusterState::new());
    let mut tasks = Vec::new();

    // MachineHealthChecks are watched too, but readiness waits only for the kinds a review
    // needs (Kind::ALL): a guard that may not list them still judges.
    for kind in Kind::WATCHED {
        metrics.set_cache_synced(kind.as_str(), false);
        let (c, s, m, r) = (
            client.clone(),
            state.clone(),
            metrics.clone(),
            readiness.clone(),
        );
        let synced_state = state.clone();
        tasks.push(tokio::spawn(async move {
            watch::run(c, kind, s, move |k| {
                m.set_cache_synced(k.as_str(), true);
                if synced_state.all_synced() {
                    r.set_caches_synced(true);
                }
            })
            .await;
        }));
    }

    let mut leadership = None;
    let mut elector = None;
    let mut fresh = None;
    if let Some(cfg) = config.sweep.clone() {
        // The sweep and the webhook's fresh probes share the kept probers (and so the etcd
        // connections).
        let probers = Arc::new(Probers::default());
        fresh = Some(Arc::new(FreshProbes::new(
            client.clone(),
            state.clone(),
            probers.clone(),
            &cfg,
            &metrics,
        )));
        let enricher_metrics = Arc::new(EnricherMetrics::register(&metrics));
        let mut publisher = None;
        if let Some(status) = config.status.clone() {
            let l = match status.lease {
                Some(lease) => {
                    let l = Leadership::new();
                    let e = Arc::new(Elector::new(client.clone(), lease, l.clone()));
                    let run = e.clone();
                    tasks.push(tokio::spawn(async move { run.run().await }));
                    elector = Some(e);
                    l
                }
                None => Leadership::always(),
            };
            leadership = Some(l.clone());
            publisher = Some(Arc::new(Publisher::new(
                client.clone(),
                state.clone(),
                config.policy.clone(),
                l,
                status.publish,
                enricher_metrics.clone(),
            )));
        }
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        tasks.push(tokio::spawn(wait_first_sweep(
            first_rx,
            cfg.first_sweep_timeout,
            readiness.clone(),
            state.clone(),
            enricher_metrics.clone(),
        )));
        let (c, s, policy) = (client.clone(), state.clone(), config.policy.clone());
        tasks.push(spawn_background("quorumguard-enricher", move || {
            publish::enrich(
                c,
                s,
                cfg,
                policy,
                publisher,
                enricher_metrics,
                probers,
                Some(first_tx),
            )
        }));
    } else {
        // etcd is not probed: there is no sweep to wait for.
        readiness.set_swept(true);
    }

    let client_auth = config.client_auth.as_ref();
    let tls_config = tls::load(&config.tls_cert, &config.tls_key, client_auth)
        .await
        .map_err(|error| ServerError::Tls {
            what: tls_file_kind(&error, &config),
            error,
        })?;
    match client_auth {
        Some(auth) => tracing::info!(
            client_ca = %auth.ca_file.display(),
            client_names = %auth.names.join(", "),
            "the webhook port requires a client certificate from this CA naming one of these clients"
        ),
        None => tracing::info!(
            "the webhook port does not verify client certificates: anything that can connect can send a review (see --client-ca-file)"
        ),
    }
    readiness.set_cert_loaded(true);
    let reload_metrics = metrics.clone();
    let cert_path = config.tls_cert.clone();
    tasks.push(tls::spawn_reloader(
        tls_config.clone(),
        config.tls_cert.clone(),
        config.tls_key.clone(),
        config.client_auth.clone(),
        config.tls_reload_interval,
        move |result| match result {
            Ok(()) => {
                reload_metrics.cert_reload(true);
                tracing::info!("serving certificate reloaded");
            }
            Err(e) => {
                reload_metrics.cert_reload(false);
                tracing::error!(error = %e, "serving certificate not reloaded; still serving the previous one");
            }
        },
    ));

    let validity_metrics = metrics.clone();
    tasks.push(tls::spawn_validity_watch(
        config.tls_cert.clone(),
        config.tls_key.clone(),
        config.tls_reload_interval,
        move |validity, problem| {
            validity_metrics.set_cert_validity(validity.not_before, validity.not_after);
            report_validity(validity, problem, &cert_path);
        },
    ));

    let sink = config.events.then(|| {
        let verified = config.client_auth.is_some();
        events::spawn(
            client.clone(),
            config.pod_name.clone(),
            256,
            &metrics,
            verified,
        )
    });
    let mut webhook = Webhook::new(
        state.clone(),
        config.policy.clone(),
        metrics.clone(),
        sink,
        config.reservation_ttl,
    );
    if let Some(fresh) = fresh {
        webhook = webhook.with_fresh_probes(fresh);
    }
    let webhook = Arc::new(webhook);

    let admin = TcpListener::bind(config.admin_listen)
        .await
        .map_err(|source| ServerError::AdminBind {
            addr: config.admin_listen,
            source,
        })?;
    let admin_addr = admin
        .local_addr()
        .map_err(|source| ServerError::AdminBind {
            addr: config.admin_listen,
            source,
        })?;
    let admin_app = admin_router(readiness.clone(), metrics.clone());
    tasks.push(tokio::spawn(async move {
        if let Err(e) = axum::serve(admin, admin_app).await {
            tracing::error!(error = %e, "admin server stopped");
        }
    }));

    let handle = Handle::new();
    let app = webhook
        .clone()
        .router()
        .layer(axum::middleware::from_fn(bounded));
    let server = tokio::spawn(
        https(config.listen, tls_config, Some(metrics.clone()))
            .handle(handle.clone())
            .serve(app.into_make_service()),
    );
    let Some(addr) = handle.listening().await else {
        return Err(ServerError::Listen(config.listen));
    };
    readiness.set_accepting(true);
    tracing::info!(%addr, %admin_addr, "quorumguard is serving");
    Ok(Running {
        addr,
        admin_addr,
        readiness,
        metrics,
        state,
        webhook,
        leadership,
        elector,
        handle,
        config,
        server,
        tasks,
    })
}

/// Readiness waits for the enricher's first sweep (every workload cluster known then probed
/// once, with a result or a recorded failure), at most `timeout`; after it the replica says
/// ready anyway, and logs and exports (`quorumguard_etcd_unprobed`) the clusters still
/// unprobed. A cluster it knows nothing of is judged with unknown health meanwhile.
async fn wait_first_sweep(
    done: tokio::sync::oneshot::Receiver<()>,
    timeout: Duration,
    readiness: Arc<Readiness>,
    state: Arc<ClusterState>,
    metrics: Arc<EnricherMetrics>,
) {
    let started = std::time::Instant::now();
    match tokio::time::timeout(timeout, done).await {
        Ok(_) => tracing::info!(
            took_ms = started.elapsed().as_millis() as u64,
            "first etcd sweep done: every workload cluster known at start probed once"
        ),
        Err(_) => {
            let unprobed = state.unprobed_clusters();
            let shown: Vec<String> = unprobed
                .iter()
                .take(20)
                .map(|(ns, c)| format!("{ns}/{c}"))
                .collect();
            tracing::warn!(
                unprobed = unprobed.len(),
                clusters = %shown.join(", "),
                timeout_s = timeout.as_secs_f64(),
                "the first etcd sweep did not finish within --first-sweep-timeout: ready anyway; reviews of the clusters not probed yet are judged with unknown health until they are"
            );
            metrics.set_unprobed(&unprobed);
        }
    }
    readiness.set_swept(true);
}

/// How much lower than the webhook the enricher thread runs (Linux `nice`, 0–19).
///
/// A sweep of a large fleet is seconds of CPU (TLS and gRPC with every member, the status
/// publication); on tokio's workers beside the webhook, reviews queued behind probe tasks and
/// their p99 grew 6–9x during sweeps at 1,000 clusters (`cargo bench --bench scale`). On a
/// thread of its own at a lower priority the kernel runs a review as soon as it arrives. Not
/// 19: probes have deadlines in wall-clock time, and a starved prober would call healthy members
/// unresponsive; at 10 the thread still gets about a tenth of a busy core.
pub const ENRICHER_NICE: i32 = 10;

/// Runs `make()`'s future on a runtime of its own, on one OS thread named `name` at
/// [`ENRICHER_NICE`]. The returned task stands for it: aborting (or dropping the runtime that
/// runs) the task stops the thread's future and its runtime, with every task it spawned (etcd
/// connections among them).
fn spawn_background<F, M>(name: &str, make: M) -> JoinHandle<()>
where
    M: FnOnce() -> F + Send + 'static,
    F: std::future::Future<Output = ()> + 'static,
{
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let thread_name = name.to_string();
    let spawned = std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            lower_priority(&thread_name);
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(async move {
                    tokio::select! {
                        _ = make() => {}
                        _ = stop_rx => {}
                    }
                }),
                Err(e) => {
                    tracing::error!(thread = %thread_name, error = %e, "no runtime for the thread")
                }
            }
            let _ = done_tx.send(());
        });
    if let Err(e) = spawned {
        tracing::error!(thread = name, error = %e, "could not start the thread");
    }
    tokio::spawn(async move {
        let _stop = stop_tx;
        let _ = done_rx.await;
    })
}

/// Lowers the calling thread's priority by [`ENRICHER_NICE`] (Linux: `setpriority` on the
/// thread ID). Raising nice needs no privilege; if it fails anyway, the thread runs at the
/// process's priority and says so.
fn lower_priority(thread: &str) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions; setpriority only reads its arguments.
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, ENRICHER_NICE)
        };
        if rc != 0 {
            tracing::warn!(
                thread, error = %std::io::Error::last_os_error(),
                "could not lower the thread's priority; sweeps compete with reviews for CPU"
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = thread;
}

impl Running {
    /// Graceful shutdown: report not-ready, wait `shutdown_delay` so no new reviews are routed
    /// here, stop accepting, let in-flight reviews finish within `shutdown_grace`, then stop the
    /// background tasks.
    pub async fn shutdown(self) {
        self.readiness.set_shutting_down(true);
        tracing::info!(
            delay = ?self.config.shutdown_delay,
            grace = ?self.config.shutdown_grace,
            "shutting down"
        );
        tokio::time::sleep(self.config.shutdown_delay).await;
        self.readiness.set_accepting(false);
        self.handle
            .graceful_shutdown(Some(self.config.shutdown_grace));
        let wait = self.config.shutdown_grace + Duration::from_secs(1);
        match tokio::time::timeout(wait, self.server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::error!(error = %e, "webhook server failed"),
            Ok(Err(e)) => tracing::error!(error = %e, "webhook server task failed"),
            Err(_) => tracing::warn!("in-flight reviews did not finish within the grace period"),
        }
        for t in self.tasks {
            t.abort();
        }
        // Hand the Lease over now rather than after its duration.
        if let Some(e) = &self.elector
            && let Err(err) = e.release().await
        {
            tracing::warn!(error = %err, "could not release the lease; another replica takes over when it expires");
        }
        tracing::info!("stopped");
    }
}
