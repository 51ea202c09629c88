//! Gathering a [`StatusReport`]: list the chosen control planes into a [`ClusterState`], probe
//! their etcd with one [`sweep_once`], and build `check`'s report for each.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use kube::Client;

use super::mgmt::{Listed, Mgmt, Scope, kube_config};
use super::select::{choose, scope_of};
use super::{
    ControlPlaneStatus, ProbeArgs, ProbeOut, ProbeResult, SCHEMA, StatusArgs, StatusReport,
};
use crate::check::Report;
use quorumguard_engine::{Confirmation, ControlPlane, EtcdState, EtcdTopology, next_action};
use quorumguard_observe::etcd::TransportKind;
use quorumguard_observe::etcd::sweep::{Probers, SweepConfig, sweep_once};
use quorumguard_observe::state::{ClusterState, Key, Kind, Object};
use quorumguard_status::conditions;

/// Lists, probes and reports.
pub(super) async fn gather(args: &StatusArgs) -> anyhow::Result<StatusReport> {
    let (mgmt, context_namespace) = connect(&args.probe).await?;
    let (scope, kcp) = scope_of(&args.select, context_namespace)?;
    if let (Some(cluster), Some(kcp)) = (&args.cluster, &kcp) {
        bail!("name the control plane once: Cluster {cluster:?} or --kcp {kcp:?}, not both");
    }
    let listed = mgmt.list_all(&scope).await?;
    let selected = choose(
        &mgmt,
        &listed,
        args.cluster.as_deref(),
        kcp.as_deref(),
        &scope,
    )
    .await?;
    let probed = probe(&mgmt, listed, &selected, &args.probe, None).await;
    let policy = args.grace.policy();
    let now_unix = crate::now_unix()?;
    let state = &probed.state;
    let mut control_planes = Vec::with_capacity(selected.len());
    for (ns, name) in &selected {
        let cp = probed.control_plane(ns, name)?;
        let probe_error = state.probe_error(ns, &cp.cluster.name);
        let next = next_action(&cp, &policy, now_unix);
        let conds = conditions(
            &cp,
            &policy,
            now_unix,
            state.kcp_generation(ns, name),
            probe_error.as_deref(),
        );
        let probe = probed.probe_out(&cp, &args.probe);
        control_planes.push(ControlPlaneStatus {
            report: Report::new(&cp, Vec::new(), &next, Vec::new()),
            probe,
            conditions: conds.to_vec(),
        });
    }
    Ok(StatusReport {
        schema: SCHEMA,
        scope: match scope {
            Scope::Namespace(ns) => format!("namespace {ns}"),
            Scope::All => "any namespace".into(),
        },
        control_planes,
        warnings: probed.warnings,
    })
}

/// The management cluster's client, and the namespace its kubeconfig context names (else
/// "default"), as kubectl takes it.
pub(crate) async fn connect(args: &ProbeArgs) -> anyhow::Result<(Mgmt, String)> {
    let config = kube_config(args).await?;
    let server = config.cluster_url.to_string();
    let namespace = config.default_namespace.clone();
    let client = Client::try_from(config)
        .with_context(|| format!("building a client for the API server at {server}"))?;
    let mgmt = Mgmt {
        client,
        server,
        timeout: args.request_timeout,
    };
    Ok((mgmt, namespace))
}

/// What one probe of the chosen control planes found: the caches with their objects and the
/// probes' outcomes, and what could not be read.
pub(crate) struct Probed {
    pub(crate) state: ClusterState,
    pub(crate) listed: Listed,
    pub(crate) warnings: Vec<String>,
    now: Instant,
}

impl Probed {
    /// The control plane of KCP `ns/name` as the lists and the probe saw it.
    pub(crate) fn control_plane(&self, ns: &str, name: &str) -> anyhow::Result<ControlPlane> {
        self.state.control_plane(ns, name, self.now).map_err(|e| {
            anyhow!("KubeadmControlPlane {ns}/{name} vanished from the listed objects ({e:?})")
        })
    }

    /// How the etcd of `cp` was probed, for the reports.
    pub(crate) fn probe_out(&self, cp: &ControlPlane, args: &ProbeArgs) -> ProbeOut {
        let ns = &cp.kcp.namespace;
        let cluster = &cp.cluster.name;
        let probe_error = self.state.probe_error(ns, cluster);
        let timing = self.state.probe_timing(ns, cluster);
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        ProbeOut {
            result: match (&cp.etcd, cp.kcp.etcd) {
                (_, EtcdTopology::External) => ProbeResult::NotProbed,
                (EtcdState::Observed(_), _) => ProbeResult::Observed,
                (EtcdState::Unknown { .. }, _) => ProbeResult::Failed,
            },
            error: match (&cp.etcd, cp.kcp.etcd) {
                (_, EtcdTopology::External) => None,
                (EtcdState::Unknown { reason }, _) => Some(probe_error.unwrap_or(reason.clone())),
                (EtcdState::Observed(_), _) => None,
            },
            transport: {
                let annotation = self.listed.transports.get(&(ns.clone(), cluster.clone()));
                match TransportKind::for_cluster(
                    annotation.map(String::as_str),
                    args.etcd_transport,
                ) {
                    Ok(kind) => kind.as_str().to_string(),
                    Err(_) => annotation.cloned().unwrap_or_default(),
                }
            },
            took_ms: self.state.probe_duration(ns, cluster).map(ms),
            member_list_ms: timing.as_ref().map(|t| ms(t.member_list)),
            slowest_member: timing
                .as_ref()
                .and_then(|t| t.slowest_member.as_ref())
                .map(|(name, _)| name.clone()),
            slowest_member_ms: timing
                .as_ref()
                .and_then(|t| t.slowest_member.as_ref())
                .map(|(_, d)| ms(*d)),
        }
    }
}

/// Puts the `selected` control planes of what was listed into a [`ClusterState`] and probes
/// their etcd with one [`sweep_once`], as `serve`'s sweep does. `progress` is told (probed,
/// of) every few hundred milliseconds while the probes run.
pub(crate) async fn probe(
    mgmt: &Mgmt,
    listed: Listed,
    selected: &[Key],
    args: &ProbeArgs,
    progress: Option<&(dyn Fn(usize, usize) + Sync)>,
) -> Probed {
    let mut warnings = listed.warnings.clone();
    // Only the chosen control planes go into the state, so the sweep probes only their etcd.
    let wanted: BTreeSet<&Key> = selected.iter().collect();
    let state = ClusterState::new();
    for kind in Kind::ALL {
        state.relist_start(kind);
    }
    for c in &listed.clusters {
        state.apply(Object::Cluster(c.clone()));
    }
    for k in &listed.kcps {
        if wanted.contains(&(k.object.namespace.clone(), k.object.name.clone())) {
            state.apply(Object::Kcp(k.clone()));
        }
    }
    for m in &listed.machines {
        if let Some(kcp) = &m.control_plane_name
            && wanted.contains(&(m.object.namespace.clone(), kcp.clone()))
        {
            state.apply(Object::Machine(m.clone()));
        }
    }
    for kind in Kind::ALL {
        state.relist_done(kind);
    }
    match &listed.health_checks_error {
        Some(e) => state.set_health_check_error(Some(e.clone())),
        None => {
            state.relist_start(Kind::HealthCheck);
            for h in &listed.health_checks {
                state.apply(Object::HealthCheck(h.clone()));
            }
            state.relist_done(Kind::HealthCheck);
        }
    }

    let targets = state.probe_targets();
    let cfg = SweepConfig {
        deadline: args.probe_timeout,
        concurrency: usize::from(args.probe_concurrency),
        transport: args.etcd_transport,
        confirmation: Confirmation {
            election_timeout: args.etcd_election_timeout,
        },
        ..Default::default()
    };
    // Each probe ends by its deadline (reading the Secret, then etcd), and a cluster is probed
    // at most `max_probes` times an election timeout apart while a finding is confirmed: this
    // outer bound only guards against a bug there, so that the command always ends.
    let waves = u32::try_from(
        targets
            .len()
            .div_ceil(usize::from(args.probe_concurrency.max(1))),
    )
    .unwrap_or(u32::MAX);
    let probes = u32::try_from(cfg.confirmation.max_probes()).unwrap_or(u32::MAX);
    let per_cluster = (args.probe_timeout * 2 + Duration::from_secs(5))
        + (args.probe_timeout + args.etcd_election_timeout).saturating_mul(probes);
    let bound = per_cluster.saturating_mul(waves.max(1));
    let probers = Probers::default();
    let sweep = tokio::time::timeout(bound, sweep_once(&mgmt.client, &state, &cfg, &probers));
    let finished = match progress {
        None => sweep.await.is_ok(),
        Some(tell) => {
            tokio::pin!(sweep);
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tokio::select! {
                    done = &mut sweep => break done.is_ok(),
                    _ = tick.tick() => {
                        let left = state.unprobed_clusters().len();
                        tell(targets.len().saturating_sub(left), targets.len());
                    }
                }
            }
        }
    };
    if !finished {
        warnings.push(format!(
            "the etcd probes did not finish within {bound:?}; clusters not probed by then are shown as unknown"
        ));
    }
    // A failed probe whose CA Secret is missing or unreadable: say that, and what to do.
    let failed = targets
        .iter()
        .filter(|t| state.probe_error(&t.namespace, &t.cluster).is_some());
    let explained = futures::future::join_all(
        failed.map(|t| async move { (t, mgmt.explain_secret(&t.namespace, &t.cluster).await) }),
    )
    .await;
    for (t, why) in explained {
        if let Some(why) = why {
            state.set_probe_error(&t.namespace, &t.cluster, why);
        }
    }
    if let Some(tell) = progress {
        tell(targets.len(), targets.len());
    }
    Probed {
        state,
        listed,
        warnings,
        now: Instant::now(),
    }
}
