//! `quorumguard serve`: flags (each with an environment twin), logging, the Kubernetes client,
//! signals. Everything else is [`crate::server`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::server::StatusConfig;
use crate::server::autopilot::AutopilotArgs;
use crate::server::{self, ServeConfig};
use quorumguard_engine::{
    Confirmation, DEFAULT_KCP_CONTROLLER, DEFAULT_TEARDOWN, OnUnknownHealth, Policy,
};
use quorumguard_observe::etcd::TransportKind;
use quorumguard_observe::etcd::sweep::SweepConfig;
use quorumguard_pki::tls::ClientAuth;
use quorumguard_status::lease::LeaseConfig;
use quorumguard_status::publish::PublishConfig;
use quorumguard_telemetry::{self as telemetry, LogFormat};

/// What to do when etcd health cannot prove an operation safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum UnknownHealth {
    Deny,
    Allow,
}

impl From<UnknownHealth> for OnUnknownHealth {
    fn from(u: UnknownHealth) -> Self {
        match u {
            UnknownHealth::Deny => OnUnknownHealth::Deny,
            UnknownHealth::Allow => OnUnknownHealth::Allow,
        }
    }
}

#[derive(Debug, Args)]
#[command(after_help = "\
Every flag but --help and --version has an environment twin (shown as [env: ...]). The webhook
answers on --listen over HTTPS (TLS 1.2/1.3, h2 and http/1.1): POST /validate/machines and POST
/validate/kubeadmcontrolplanes. The admin port answers /livez, /readyz and /metrics over plain
HTTP. SIGTERM: report not-ready for --shutdown-delay, then finish in-flight reviews within
--shutdown-grace and exit.")]
pub struct ServeArgs {
    /// Address of the webhook's HTTPS listener.
    #[arg(long, env = "QUORUMGUARD_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Address of the plain-HTTP admin listener (/livez, /readyz, /metrics).
    #[arg(long, env = "QUORUMGUARD_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    pub admin_listen: SocketAddr,
    /// Serving certificate (PEM; may hold a chain: leaf first). Reloaded when it changes.
    #[arg(
        long,
        env = "QUORUMGUARD_TLS_CERT_FILE",
        default_value = "/tls/tls.crt"
    )]
    pub tls_cert_file: PathBuf,
    /// Serving key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "QUORUMGUARD_TLS_KEY_FILE", default_value = "/tls/tls.key")]
    pub tls_key_file: PathBuf,
    /// How often to look for a new certificate (kubelet swaps Secret volumes atomically).
    #[arg(long, env = "QUORUMGUARD_TLS_RELOAD_INTERVAL", default_value = "5s", value_parser = super::duration)]
    pub tls_reload_interval: Duration,
    /// Require a client certificate on the webhook port, verified against the CA certificate(s)
    /// in this PEM file (kube-apiserver's, presented through its AdmissionConfiguration
    /// kubeConfigFile). A connection without one, or with one from another CA, expired or naming
    /// no --client-name, gets no answer. Reloaded like the serving certificate. Needs
    /// --client-name. Default: any client may connect.
    #[arg(long, env = "QUORUMGUARD_CLIENT_CA_FILE", requires = "client_names")]
    pub client_ca_file: Option<PathBuf>,
    /// A client certificate's subject common name (or DNS subject alternative name) that may
    /// send reviews, matched exactly; repeat for more (environment: comma-separated). Only with
    /// --client-ca-file.
    #[arg(
        long = "client-name",
        env = "QUORUMGUARD_CLIENT_NAMES",
        value_delimiter = ',',
        requires = "client_ca_file"
    )]
    pub client_names: Vec<String>,
    /// Log format.
    #[arg(
        long,
        env = "QUORUMGUARD_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax, e.g. "info" or "quorumguard=debug,info").
    #[arg(long, env = "QUORUMGUARD_LOG", default_value = "info")]
    pub log: String,
    /// Kubeconfig for the management cluster (default: in-cluster, then $KUBECONFIG, then
    /// ~/.kube/config).
    #[arg(long, env = "QUORUMGUARD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Control-plane controllers: exempt from the desired-replicas rule, never from the
    /// quorum rule (repeatable; comma-separated in the environment).
    #[arg(long = "controller", env = "QUORUMGUARD_CONTROLLERS", value_delimiter = ',', default_value = DEFAULT_KCP_CONTROLLER)]
    pub controllers: Vec<String>,
    /// Teardown identities, never blocked (repeatable; comma-separated in the environment).
    #[arg(long = "teardown", env = "QUORUMGUARD_TEARDOWN", value_delimiter = ',', default_values_t = DEFAULT_TEARDOWN.map(String::from))]
    pub teardown: Vec<String>,
    /// When health cannot prove a human's operation safe.
    #[arg(
        long,
        env = "QUORUMGUARD_UNKNOWN_HEALTH_HUMANS",
        value_enum,
        default_value = "deny"
    )]
    pub unknown_health_humans: UnknownHealth,
    /// When health cannot prove a controller's operation safe (KCP checks etcd itself before
    /// removing a member).
    #[arg(
        long,
        env = "QUORUMGUARD_UNKNOWN_HEALTH_CONTROLLERS",
        value_enum,
        default_value = "allow"
    )]
    pub unknown_health_controllers: UnknownHealth,
    /// An etcd probe older than this counts as unknown health.
    #[arg(long, env = "QUORUMGUARD_MAX_HEALTH_AGE", default_value = "60s", value_parser = super::duration)]
    pub max_health_age: Duration,
    #[command(flatten)]
    pub grace: super::GraceArgs,
    /// How long an allowed deletion is held against later reviews if the cache never shows it.
    #[arg(long, env = "QUORUMGUARD_RESERVATION_TTL", default_value = "30s", value_parser = super::duration)]
    pub reservation_ttl: Duration,
    /// After SIGTERM, how long to report not-ready before refusing new connections.
    #[arg(long, env = "QUORUMGUARD_SHUTDOWN_DELAY", default_value = "5s", value_parser = super::duration)]
    pub shutdown_delay: Duration,
    /// How long in-flight reviews may take to finish during shutdown.
    #[arg(long, env = "QUORUMGUARD_SHUTDOWN_GRACE", default_value = "15s", value_parser = super::duration)]
    pub shutdown_grace: Duration,
    /// This replica's name, reported in Events.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Do not publish Kubernetes Events for denials and break-glass uses.
    #[arg(long, env = "QUORUMGUARD_NO_EVENTS")]
    pub no_events: bool,
    /// Time between two sweeps of every workload cluster's etcd (a Machine appearing or going
    /// triggers one sooner).
    #[arg(long, env = "QUORUMGUARD_PROBE_INTERVAL", default_value = "10s", value_parser = super::duration)]
    pub probe_interval: Duration,
    /// Deadline of one cluster's probe (member list, then every member in parallel).
    #[arg(long, env = "QUORUMGUARD_PROBE_TIMEOUT", default_value = "2s", value_parser = super::duration)]
    pub probe_timeout: Duration,
    /// The longest an admission review waits for a fresh probe of its cluster's etcd before it
    /// allows an operation whose safety rests on etcd health (a deletion of a Machine with a
    /// voting member, a replica change). The probe's own deadline is three quarters of it, so
    /// that a member that does not answer is seen as down in time; a probe that fails or runs out
    /// of time leaves the decision to the unknown-health policy. Between 100ms and 4s: the
    /// webhook's timeoutSeconds is 5.
    #[arg(long, env = "QUORUMGUARD_FRESH_PROBE_TIMEOUT", default_value = "2s", value_parser = super::duration)]
    pub fresh_probe_timeout: Duration,
    /// Clusters probed at once.
    #[arg(long, env = "QUORUMGUARD_PROBE_CONCURRENCY", default_value_t = 16)]
    pub probe_concurrency: usize,
    /// How to reach workload etcd when the Cluster has no `quorumguard.io/etcd-transport`
    /// annotation.
    #[arg(long, env = "QUORUMGUARD_ETCD_TRANSPORT", value_enum, default_value_t = TransportKind::default())]
    pub etcd_transport: TransportKind,
    /// How long a cluster's etcd CA Secret (and port-forward kubeconfig Secret) is used before it
    /// is read again; a failed probe makes the next one read it at once. 0s reads every sweep.
    #[arg(long, env = "QUORUMGUARD_ETCD_SECRET_REFRESH", default_value = "5m", value_parser = super::duration)]
    pub etcd_secret_refresh: Duration,
    /// etcd's --election-timeout in the workload clusters (kubeadm leaves etcd's default, 1s).
    /// A probe that sees a member worse than before is confirmed by another one this much later
    /// before anything is believed; members without a leader count as a leader election (health
    /// unknown) until no leader has been seen for 5 election timeouts, and only then as lost
    /// quorum. 0s believes every probe at once (not recommended: a leader election then reads
    /// as lost quorum).
    #[arg(long, env = "QUORUMGUARD_ETCD_ELECTION_TIMEOUT", default_value = "1s", value_parser = super::duration)]
    pub etcd_election_timeout: Duration,
    /// How long /readyz waits for the first etcd sweep (every workload cluster known at start
    /// probed once) before saying ready anyway; the clusters still unprobed are logged and
    /// exported as quorumguard_etcd_unprobed.
    #[arg(long, env = "QUORUMGUARD_FIRST_SWEEP_TIMEOUT", default_value = "60s", value_parser = super::duration)]
    pub first_sweep_timeout: Duration,
    /// Do not probe etcd (every decision that needs health is then HealthUnknown).
    #[arg(long, env = "QUORUMGUARD_NO_PROBE")]
    pub no_probe: bool,
    /// Do not publish the quorumguard.io/EtcdQuorum and quorumguard.io/NextAction conditions in
    /// KCP status (probes still feed the webhook).
    #[arg(long, env = "QUORUMGUARD_NO_STATUS")]
    pub no_status: bool,
    /// Re-publish figures that move on every probe (raft index, DB size) at most this often;
    /// anything else that changes is published after the next sweep.
    #[arg(long, env = "QUORUMGUARD_STATUS_REFRESH", default_value = "5m", value_parser = super::duration)]
    pub status_refresh: Duration,
    /// Write KCP status without holding the Lease. Only for a single replica: two replicas
    /// without a Lease would both write.
    #[arg(long, env = "QUORUMGUARD_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    /// Namespace of the leader-election Lease (the pod's own namespace in a cluster).
    #[arg(long, env = "POD_NAMESPACE", default_value = "quorumguard-system")]
    pub leader_election_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "QUORUMGUARD_LEADER_ELECTION_LEASE",
        default_value = "quorumguard"
    )]
    pub leader_election_lease: String,
    /// How long other replicas wait, after last seeing the Lease renewed, before taking over.
    #[arg(long, env = "QUORUMGUARD_LEASE_DURATION", default_value = "15s", value_parser = super::duration)]
    pub lease_duration: Duration,
    /// The holder stops writing when it has not renewed the Lease for this long (shorter than
    /// --lease-duration, so two writers never overlap).
    #[arg(long, env = "QUORUMGUARD_LEASE_RENEW_DEADLINE", default_value = "10s", value_parser = super::duration)]
    pub lease_renew_deadline: Duration,
    /// Time between two attempts to take or renew the Lease.
    #[arg(long, env = "QUORUMGUARD_LEASE_RETRY_PERIOD", default_value = "2s", value_parser = super::duration)]
    pub lease_retry_period: Duration,
    #[command(flatten)]
    pub autopilot: AutopilotArgs,
}

impl ServeArgs {
    pub fn config(&self) -> ServeConfig {
        ServeConfig {
            listen: self.listen,
            admin_listen: self.admin_listen,
            tls_cert: self.tls_cert_file.clone(),
            tls_key: self.tls_key_file.clone(),
            tls_reload_interval: self.tls_reload_interval,
            client_auth: self.client_ca_file.clone().map(|ca_file| ClientAuth {
                ca_file,
                names: self.client_names.clone(),
            }),
            policy: Policy {
                controllers: self.controllers.clone(),
                teardown: self.teardown.clone(),
                unknown_health_humans: self.unknown_health_humans.into(),
                unknown_health_controllers: self.unknown_health_controllers.into(),
                max_health_age: self.max_health_age,
                join_grace: self.grace.join_grace,
                learner_grace: self.grace.learner_grace,
                offline: false,
            },
            reservation_ttl: self.reservation_ttl,
            shutdown_delay: self.shutdown_delay,
            shutdown_grace: self.shutdown_grace,
            pod_name: self.pod_name.clone(),
            events: !self.no_events,
            sweep: (!self.no_probe).then_some(SweepConfig {
                interval: self.probe_interval,
                deadline: self.probe_timeout,
                concurrency: self.probe_concurrency,
                transport: self.etcd_transport,
                secret_refresh: self.etcd_secret_refresh,
                confirmation: Confirmation {
                    election_timeout: self.etcd_election_timeout,
                },
                first_sweep_timeout: self.first_sweep_timeout,
                fresh_timeout: self.fresh_probe_timeout,
            }),
            status: (!self.no_status).then(|| StatusConfig {
                publish: PublishConfig {
                    refresh: self.status_refresh,
                    ..PublishConfig::default()
                },
                lease: (!self.no_leader_election).then(|| LeaseConfig {
                    lease_duration: self.lease_duration,
                    renew_deadline: self.lease_renew_deadline,
                    retry_period: self.lease_retry_period,
                    ..LeaseConfig::new(
                        &self.leader_election_namespace,
                        &self.leader_election_lease,
                        &self.identity(),
                    )
                }),
            }),
            autopilot: self.autopilot.config(),
        }
    }

    /// This replica's name in the Lease: the pod name, else the host name, else the process id.
    fn identity(&self) -> String {
        self.pod_name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("quorumguard-{}", std::process::id()))
    }

    /// Rejects lease timings that would let two replicas write at once.
    fn check(&self) -> anyhow::Result<()> {
        self.autopilot.check(self.no_probe, self.no_status)?;
        let ordered = self.lease_retry_period < self.lease_renew_deadline
            && self.lease_renew_deadline < self.lease_duration;
        let fresh = self.fresh_probe_timeout;
        if fresh < Duration::from_millis(100) || fresh > Duration::from_secs(4) {
            anyhow::bail!(
                "--fresh-probe-timeout {} is out of range: it must be between 100ms (time for a probe of three members) and 4s (the webhook's timeoutSeconds is 5, and kube-apiserver refuses the request when the webhook does not answer in time)",
                humantime::format_duration(fresh)
            );
        }
        if let Some(empty) = self
            .client_names
            .iter()
            .find(|n| n.trim().is_empty() || n.trim() != n.as_str())
        {
            anyhow::bail!(
                "--client-name {empty:?}: a client name is matched byte for byte against the certificate's common name or DNS names; give it without blanks or surrounding spaces"
            );
        }
        if !self.no_leader_election && !ordered {
            anyhow::bail!(
                "lease timings must satisfy --lease-retry-period ({}) < --lease-renew-deadline ({}) < --lease-duration ({}): otherwise a replica could still write after another took over",
                humantime::format_duration(self.lease_retry_period),
                humantime::format_duration(self.lease_renew_deadline),
                humantime::format_duration(self.lease_duration),
            );
        }
        Ok(())
    }
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration (in-cluster, $KUBECONFIG or ~/.kube/config)")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received"),
                _ = int.recv() => tracing::info!("SIGINT received"),
            }
        }
        _ => {
            tracing::error!("cannot install signal handlers; waiting for Ctrl-C");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    args.check()?;
    crate::server::tune_malloc();
    // Held to the end: dropping it writes out the last lines.
    let _logs =
        telemetry::init_logging(args.log_format, &args.log).context("setting up logging")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let client = client(args.kubeconfig.as_ref()).await?;
        let running = server::start(args.config(), client).await?;
        terminated().await;
        running.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn args(extra: &[&str]) -> ServeArgs {
        let mut argv = vec!["serve", "--tls-cert-file", "c", "--tls-key-file", "k"];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).expect("parses").serve
    }

    #[test]
    fn the_fresh_probe_wait_stays_inside_the_webhook_timeout() {
        let a = args(&[]);
        assert_eq!(a.fresh_probe_timeout, Duration::from_secs(2));
        assert!(a.check().is_ok());
        assert_eq!(
            a.config().sweep.expect("sweep").fresh_timeout,
            Duration::from_secs(2)
        );
        for bad in ["5s", "50ms"] {
            let e = args(&["--fresh-probe-timeout", bad])
                .check()
                .expect_err(bad)
                .to_string();
            assert!(
                e.contains("--fresh-probe-timeout") && e.contains("timeoutSeconds is 5"),
                "{e}"
            );
        }
        assert!(args(&["--fresh-probe-timeout", "4s"]).check().is_ok());
    }
}
