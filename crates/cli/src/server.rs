//! `quorumguard serve` as a library: the webhook over HTTPS, the admin endpoints over plain
//! HTTP, the watches that feed the caches, certificate reload and graceful shutdown.
//!
//! Tests start it in-process with [`start`]; the binary wraps it with flags and signals.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;
use kube::Client;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use quorumguard_admission::events::EventSink;
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

pub mod autopilot;
mod background;
mod https;

use autopilot::{Autopilot, AutopilotConfig};
pub use background::ENRICHER_NICE;
use background::spawn_background;
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
    /// The autopilot (needs `sweep` and `status`). `None`: off.
    pub autopilot: Option<AutopilotConfig>,
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
///
/// The steps, in this order (each a method of `Starting` below): the caches and their watches;
/// the etcd sweep with the webhook's fresh probes, the Lease and the status publisher; the
/// serving certificate with its reload and validity watches; the webhook; the admin listener;
/// the webhook's HTTPS listener. Readiness says accepting only once the last one listens.
pub async fn start(config: ServeConfig, client: Client) -> Result<Running, ServerError> {
    let mut s = Starting::new(client);
    s.start_watches();
    let events = s.event_sink(&config);
    let enricher = s.start_enricher(&config, events.clone());
    let tls_config = s.load_tls(&config).await?;
    s.start_cert_watches(&config, &tls_config);
    let webhook = s.webhook(&config, enricher.fresh, events);
    let admin_addr = s.start_admin(&config).await?;
    let (addr, handle, server) = s.start_https(&config, &webhook, tls_config).await?;
    s.readiness.set_accepting(true);
    tracing::info!(%addr, %admin_addr, "quorumguard is serving");
    Ok(Running {
        addr,
        admin_addr,
        readiness: s.readiness,
        metrics: s.metrics,
        state: s.state,
        webhook,
        leadership: enricher.leadership,
        elector: enricher.elector,
        handle,
        config,
        server,
        tasks: s.tasks,
    })
}

/// What [`start`]'s steps share: the API client, the metrics, readiness, the caches, and the
/// background tasks started so far (stopped by [`Running::shutdown`]).
struct Starting {
    client: Client,
    metrics: Arc<Metrics>,
    readiness: Arc<Readiness>,
    state: Arc<ClusterState>,
    tasks: Vec<JoinHandle<()>>,
}

/// What [`Starting::start_enricher`] started that the rest of the server needs.
#[derive(Default)]
struct Enricher {
    /// The webhook's fresh probes, sharing the sweep's probers (`None`: etcd is not probed).
    fresh: Option<Arc<FreshProbes>>,
    /// Whether this replica writes KCP status (`None`: status publishing is off).
    leadership: Option<Leadership>,
    /// The Lease's elector, when status is written only while holding it.
    elector: Option<Arc<Elector>>,
}

impl Starting {
    /// Empty caches, fresh metrics, readiness with nothing done yet, no tasks.
    fn new(client: Client) -> Self {
        Starting {
            client,
            metrics: Arc::new(Metrics::new()),
            readiness: Arc::new(Readiness::default()),
            state: Arc::new(ClusterState::new()),
            tasks: Vec::new(),
        }
    }

    /// Starts a watch per watched kind, each feeding its cache and, once listed, marking it
    /// synced; readiness says the caches are synced once every kind a review needs is.
    fn start_watches(&mut self) {
        // MachineHealthChecks are watched too, but readiness waits only for the kinds a review
        // needs (Kind::ALL): a guard that may not list them still judges.
        for kind in Kind::WATCHED {
            self.metrics.set_cache_synced(kind.as_str(), false);
            let (c, s, m, r) = (
                self.client.clone(),
                self.state.clone(),
                self.metrics.clone(),
                self.readiness.clone(),
            );
            let synced_state = self.state.clone();
            self.tasks.push(tokio::spawn(async move {
                watch::run(c, kind, s, move |k| {
                    m.set_cache_synced(k.as_str(), true);
                    if synced_state.all_synced() {
                        r.set_caches_synced(true);
                    }
                })
                .await;
            }));
        }
    }

    /// With `config.sweep`: the fresh probes, the status publisher (and its Lease) when
    /// `config.status` asks for one, readiness's wait for the first sweep, and the enricher on
    /// its own thread. Without: readiness does not wait for a sweep.
    fn start_enricher(&mut self, config: &ServeConfig, events: Option<EventSink>) -> Enricher {
        let Some(cfg) = config.sweep.clone() else {
            // etcd is not probed: there is no sweep to wait for.
            self.readiness.set_swept(true);
            return Enricher::default();
        };
        // The sweep and the webhook's fresh probes share the kept probers (and so the etcd
        // connections).
        let probers = Arc::new(Probers::default());
        let fresh = Some(Arc::new(FreshProbes::new(
            self.client.clone(),
            self.state.clone(),
            probers.clone(),
            &cfg,
            &self.metrics,
        )));
        let enricher_metrics = Arc::new(EnricherMetrics::register(&self.metrics));
        let (leadership, elector, publisher) = match config.status.clone() {
            Some(status) => {
                let (l, elector, publisher) = self.start_status(config, status, &enricher_metrics);
                (Some(l), elector, Some(publisher))
            }
            None => (None, None, None),
        };
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        self.tasks.push(tokio::spawn(wait_first_sweep(
            first_rx,
            cfg.first_sweep_timeout,
            self.readiness.clone(),
            self.state.clone(),
            enricher_metrics.clone(),
        )));
        // The autopilot acts on the Lease holder only, so only with a status writer.
        let autopilot = match (&config.autopilot, &fresh, &leadership) {
            (Some(ap), Some(fresh), Some(l)) => Some(Autopilot::new(
                ap,
                config.policy.clone(),
                fresh.clone(),
                probers.clone(),
                self.client.clone(),
                l.clone(),
                events,
                &self.metrics,
            )),
            (Some(_), ..) => {
                tracing::error!(
                    "--autopilot needs etcd probing and status publishing: the autopilot is off"
                );
                None
            }
            _ => None,
        };
        let (c, s, policy) = (
            self.client.clone(),
            self.state.clone(),
            config.policy.clone(),
        );
        self.tasks
            .push(spawn_background("quorumguard-enricher", move || {
                publish::enrich(
                    c,
                    s,
                    cfg,
                    policy,
                    publisher,
                    enricher_metrics,
                    probers,
                    Some(first_tx),
                    autopilot,
                )
            }));
        Enricher {
            fresh,
            leadership,
            elector,
        }
    }

    /// The status publisher, writing while this replica leads: with `status.lease`, an elector
    /// started on that Lease; without, always.
    fn start_status(
        &mut self,
        config: &ServeConfig,
        status: StatusConfig,
        enricher_metrics: &Arc<EnricherMetrics>,
    ) -> (Leadership, Option<Arc<Elector>>, Arc<Publisher>) {
        let (l, elector) = match status.lease {
            Some(lease) => {
                let l = Leadership::new();
                let e = Arc::new(Elector::new(self.client.clone(), lease, l.clone()));
                let run = e.clone();
                self.tasks
                    .push(tokio::spawn(async move { run.run().await }));
                (l, Some(e))
            }
            None => (Leadership::always(), None),
        };
        let publisher = Arc::new(Publisher::new(
            self.client.clone(),
            self.state.clone(),
            config.policy.clone(),
            l.clone(),
            status.publish,
            enricher_metrics.clone(),
        ));
        (l, elector, publisher)
    }

    /// Loads the serving certificate and key (and the client CA), says whether the webhook port
    /// verifies clients, and marks the certificate loaded.
    async fn load_tls(&self, config: &ServeConfig) -> Result<RustlsConfig, ServerError> {
        let client_auth = config.client_auth.as_ref();
        let tls_config = tls::load(&config.tls_cert, &config.tls_key, client_auth)
            .await
            .map_err(|error| ServerError::Tls {
                what: tls_file_kind(&error, config),
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
        self.readiness.set_cert_loaded(true);
        Ok(tls_config)
    }

    /// Starts the certificate's reload into `tls_config` and the watch of its validity, each
    /// counted and logged.
    fn start_cert_watches(&mut self, config: &ServeConfig, tls_config: &RustlsConfig) {
        let reload_metrics = self.metrics.clone();
        let cert_path = config.tls_cert.clone();
        self.tasks.push(tls::spawn_reloader(
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

        let validity_metrics = self.metrics.clone();
        self.tasks.push(tls::spawn_validity_watch(
            config.tls_cert.clone(),
            config.tls_key.clone(),
            config.tls_reload_interval,
            move |validity, problem| {
                validity_metrics.set_cert_validity(validity.not_before, validity.not_after);
                report_validity(validity, problem, &cert_path);
            },
        ));
    }

    /// The Events publisher, when `config.events` asks for one (the webhook's and the
    /// autopilot's).
    fn event_sink(&self, config: &ServeConfig) -> Option<EventSink> {
        config.events.then(|| {
            let verified = config.client_auth.is_some();
            events::spawn(
                self.client.clone(),
                config.pod_name.clone(),
                256,
                &self.metrics,
                verified,
            )
        })
    }

    /// The webhook over the caches, with the Events publisher `sink` and the fresh probes when
    /// etcd is probed.
    fn webhook(
        &self,
        config: &ServeConfig,
        fresh: Option<Arc<FreshProbes>>,
        sink: Option<EventSink>,
    ) -> Arc<Webhook> {
        let mut webhook = Webhook::new(
            self.state.clone(),
            config.policy.clone(),
            self.metrics.clone(),
            sink,
            config.reservation_ttl,
        );
        if let Some(fresh) = fresh {
            webhook = webhook.with_fresh_probes(fresh);
        }
        Arc::new(webhook)
    }

    /// Binds the admin address and serves /livez, /readyz and /metrics there; returns the
    /// address bound.
    async fn start_admin(&mut self, config: &ServeConfig) -> Result<SocketAddr, ServerError> {
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
        let admin_app = admin_router(self.readiness.clone(), self.metrics.clone());
        self.tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(admin, admin_app).await {
                tracing::error!(error = %e, "admin server stopped");
            }
        }));
        Ok(admin_addr)
    }

    /// Serves the webhook over HTTPS on `config.listen` and waits until it listens: the address,
    /// the handle that shuts it down, and its task.
    async fn start_https(
        &self,
        config: &ServeConfig,
        webhook: &Arc<Webhook>,
        tls_config: RustlsConfig,
    ) -> Result<
        (
            SocketAddr,
            Handle<SocketAddr>,
            JoinHandle<std::io::Result<()>>,
        ),
        ServerError,
    > {
        let handle = Handle::new();
        let app = webhook
            .clone()
            .router()
            .layer(axum::middleware::from_fn(bounded));
        let server = tokio::spawn(
            https(config.listen, tls_config, Some(self.metrics.clone()))
                .handle(handle.clone())
                .serve(app.into_make_service()),
        );
        let Some(addr) = handle.listening().await else {
            return Err(ServerError::Listen(config.listen));
        };
        Ok((addr, handle, server))
    }
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
