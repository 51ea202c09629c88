//! `quorumguard status`: the live view of a control plane, from a kubeconfig for the management
//! cluster — the etcd member table, the quorum figures and the next safe action that KCP's own
//! status lacks. Also the kubectl plugin (`kubectl quorumguard status`).
//!
//! It reads what the webhook reads, the same way, once: Clusters, KubeadmControlPlanes and
//! control-plane Machines are listed (v1beta2) and converted by the watch's own conversion into a
//! [`ClusterState`], then one [`sweep_once`] probes each workload cluster's etcd exactly as
//! `serve` does. The report is `check`'s [`Report`] built from the resulting control plane, so the
//! JSON has `check`'s schema per control plane and the text reads like `check`'s. Nothing is
//! written anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use clap::Args;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use serde::Serialize;

use super::check::{self, Format, Report};
use crate::capi::{CapiCluster, CapiKcp, CapiMachine};
use crate::engine::{
    ActionCode, Confirmation, EtcdState, EtcdTopology, LABEL_CONTROL_PLANE, Policy, next_action,
};
use crate::etcd::sweep::{Probers, SweepConfig, sweep_once};
use crate::etcd::{ETCD_TRANSPORT_ANNOTATION, TransportKind};
use crate::state::{ClusterState, Key, Kind, Object, watch};
use crate::status::conditions;

/// The schema identifier of [`StatusReport`].
pub const SCHEMA: &str = "quorumguard.io/status/v1";

/// Clusters probed at once (the sweep's default): a CLI run over `-A` should not open hundreds of
/// etcd connections at the same time.
const PROBE_CONCURRENCY: usize = 16;

#[derive(Debug, Args)]
#[command(after_help = "\
Reads Clusters, KubeadmControlPlanes and control-plane Machines (cluster.x-k8s.io/v1beta2) from
the management cluster, probes each workload cluster's etcd once, as `quorumguard serve` does
(member list, alarms, every member's status and health in parallel under --probe-timeout, with a
client certificate signed by the etcd CA in Secret <cluster>-etcd; probed again an election
timeout later while a member seen unhealthy, a leader election or a changed member list awaits
confirmation), and prints the member table,
the quorum figures and the next safe action. It writes nothing. It needs get/list on clusters,
kubeadmcontrolplanes and machines, and get on Secrets <cluster>-etcd (and <cluster>-kubeconfig for
the port-forward transport).

As a kubectl plugin: put the binary (or a symlink to it) on PATH as `kubectl-quorumguard`, then
run `kubectl quorumguard status [CLUSTER]`.

Exit status: 0 when every control plane was probed and needs nothing (next action None; external
etcd is not probed and needs nothing), 1 when any needs an action or its etcd could not be probed
(the error is shown, not fatal), 2 on bad input: bad flags, an unusable kubeconfig, an API server
that cannot be reached or refuses, an unknown Cluster, or a Cluster without a KubeadmControlPlane.")]
pub struct StatusArgs {
    /// The Cluster whose KubeadmControlPlane to show. Without it: every KubeadmControlPlane in the
    /// namespace (all namespaces with -A).
    #[arg(value_name = "CLUSTER", conflicts_with = "all_namespaces")]
    pub cluster: Option<String>,
    /// Namespace of the Cluster API objects (default: the kubeconfig context's namespace, else
    /// "default", as kubectl does).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Every namespace (overrides --namespace, as in kubectl).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Kubeconfig of the management cluster (default: $KUBECONFIG, else ~/.kube/config, else the
    /// in-cluster service account).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Output format: `json` is `{"schema": "quorumguard.io/status/v1", "controlPlanes": [...]}`,
    /// each entry a `check -o json` report with `probe` and `conditions` added.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
    /// Deadline of one cluster's etcd probe (reading its CA Secret, then the member list and
    /// every member in parallel). A frozen or dead member shows as unhealthy with its error.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = super::duration)]
    pub probe_timeout: Duration,
    /// How to reach workload etcd when the Cluster has no `quorumguard.io/etcd-transport`
    /// annotation.
    #[arg(long, value_enum, default_value_t = TransportKind::default())]
    pub etcd_transport: TransportKind,
    /// etcd's --election-timeout in the workload clusters. A probe that sees a member unhealthy,
    /// or no leader, is confirmed by more probes this far apart before it is shown as such (as
    /// `serve` does; a leader election up to 5 election timeouts long shows as unknown health,
    /// not as lost quorum). 0s shows the first probe as it is.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = super::duration)]
    pub etcd_election_timeout: Duration,
    /// How long one request to the management cluster's API server may take.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::duration)]
    pub request_timeout: Duration,
}

/// The output of `quorumguard status -o json`. Stable like `check`'s: fields are added, never
/// renamed or removed, and `schema` changes if that is ever broken.
///
/// ```text
/// {
///   "schema": "quorumguard.io/status/v1",
///   "controlPlanes": [{                 // sorted by namespace, then KCP name
///     ...every key of `quorumguard check -o json` (schema "quorumguard.io/check/v1"), with
///        "verdicts": [] and "quorum": null when the member list is unknown...,
///     "probe": {
///       "result": "Observed" | "Failed" | "NotProbed",  // NotProbed: external etcd
///       "error": "..." | null,        // why it failed, with what to do when that is known
///       "transport": "direct",        // "port-forward" | "direct": the Cluster's
///                                     //  quorumguard.io/etcd-transport, else the flag
///       "tookMs": 35 | null
///     },
///     "conditions": [ ... ]           // the quorumguard.io/EtcdQuorum and NextAction conditions
///   }],                               //  the status enricher would publish, as metav1.Condition
///   "warnings": ["..."]               // objects that could not be read, and the like
/// }
/// ```
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub schema: &'static str,
    /// Where was looked: `namespace NS` or `any namespace` (for the "nothing found" note).
    #[serde(skip)]
    pub scope: String,
    pub control_planes: Vec<ControlPlaneStatus>,
    pub warnings: Vec<String>,
}

/// One control plane: `check`'s report plus how its etcd was probed.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneStatus {
    #[serde(flatten)]
    pub report: Report,
    pub probe: ProbeOut,
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeOut {
    pub result: ProbeResult,
    pub error: Option<String>,
    pub transport: String,
    pub took_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ProbeResult {
    /// The member list was read; per-member health is in the table.
    Observed,
    /// No member list: the probe failed (or could not start), `error` says why.
    Failed,
    /// External etcd: nothing stacked to probe.
    NotProbed,
}

impl ControlPlaneStatus {
    /// Whether this control plane makes the exit status 1.
    fn needs_attention(&self) -> bool {
        self.probe.result == ProbeResult::Failed
            || self.report.next_action.code != ActionCode::None.as_str()
    }
}

/// Runs `status`. Errors are bad input or an unusable API server (exit 2).
pub fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(gather(args));
    // etcd clients may keep background tasks on a frozen member's connection: do not wait.
    runtime.shutdown_background();
    let report = result?;
    for w in &report.warnings {
        eprintln!("quorumguard: warning: {w}");
    }
    match args.output {
        Format::Text => {
            if report.control_planes.is_empty() {
                eprintln!("No KubeadmControlPlanes found in {}.", report.scope);
            }
            print!("{}", render_text(&report));
        }
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).context("cannot render the report as JSON")?
        ),
    }
    Ok(
        if report
            .control_planes
            .iter()
            .any(ControlPlaneStatus::needs_attention)
        {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        },
    )
}

/// The management cluster's client configuration, found as kubectl finds it.
async fn kube_config(args: &StatusArgs) -> anyhow::Result<kube::Config> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let context = match &args.context {
        Some(c) => format!(" (context {c:?})"),
        None => String::new(),
    };
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("using kubeconfig {}{context}", path.display()))?
        }
        // A context names an entry of a kubeconfig file: no in-cluster fallback then.
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("using $KUBECONFIG or ~/.kube/config{context}"))?,
        None => kube::Config::infer().await.context(
            "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, or write ~/.kube/config",
        )?,
    };
    config.read_timeout = Some(args.request_timeout);
    config.connect_timeout = Some(args.request_timeout.min(Duration::from_secs(10)));
    Ok(config)
}

/// Where to list: one namespace, or all.
#[derive(Clone, Debug)]
enum Scope {
    Namespace(String),
    All,
}

/// What the three lists gave, converted.
#[derive(Default)]
struct Listed {
    clusters: Vec<CapiCluster>,
    kcps: Vec<CapiKcp>,
    machines: Vec<CapiMachine>,
    /// Cluster key -> its `quorumguard.io/etcd-transport` annotation, as written.
    transports: BTreeMap<Key, String>,
    warnings: Vec<String>,
}

/// Everything the API server is asked, with its URL for messages and a bound on each call.
struct Mgmt {
    client: Client,
    server: String,
    timeout: Duration,
}

impl Mgmt {
    /// Lists one kind (control-plane Machines only) in `scope`.
    async fn list(&self, kind: Kind, scope: &Scope) -> anyhow::Result<Vec<DynamicObject>> {
        let ar = watch::api_resource(kind);
        let (api, where_): (Api<DynamicObject>, String) = match scope {
            Scope::Namespace(ns) => (
                Api::namespaced_with(self.client.clone(), ns, &ar),
                format!("in namespace {ns}"),
            ),
            Scope::All => (
                Api::all_with(self.client.clone(), &ar),
                "in all namespaces".into(),
            ),
        };
        let mut lp = ListParams::default();
        if kind == Kind::Machine {
            lp = lp.labels(LABEL_CONTROL_PLANE);
        }
        let what = format!("listing {}.{}/{} {where_}", ar.plural, ar.group, ar.version);
        match tokio::time::timeout(self.timeout, api.list(&lp)).await {
            Ok(Ok(list)) => Ok(list.items),
            Ok(Err(e)) => Err(self.api_error(e, &what)),
            Err(_) => bail!(
                "{what}: the API server at {} did not answer within {:?} (--request-timeout)",
                self.server,
                self.timeout
            ),
        }
    }

    /// An API failure in words that say what to do.
    fn api_error(&self, e: kube::Error, what: &str) -> anyhow::Error {
        match &e {
            kube::Error::Api(s) if s.code == 404 => anyhow!(
                "{what}: the API server at {} does not serve it (404 {}): is this the management \
                 cluster, with Cluster API's v1beta2 CRDs installed?",
                self.server,
                s.reason
            ),
            kube::Error::Api(s) if s.code == 401 || s.code == 403 => anyhow!(
                "{what}: {} ({} {}): quorumguard status needs get and list on clusters, \
                 kubeadmcontrolplanes and machines, and get on Secrets <cluster>-etcd (and \
                 <cluster>-kubeconfig for the port-forward transport)",
                s.message,
                s.code,
                s.reason
            ),
            _ => anyhow::Error::new(e).context(format!(
                "{what}: cannot use the API server at {}",
                self.server
            )),
        }
    }

    /// Lists the three kinds and converts them as the watch does.
    async fn list_all(&self, scope: &Scope) -> anyhow::Result<Listed> {
        let (clusters, kcps, machines) = futures::try_join!(
            self.list(Kind::Cluster, scope),
            self.list(Kind::Kcp, scope),
            self.list(Kind::Machine, scope),
        )?;
        let mut out = Listed::default();
        for (kind, objects) in [
            (Kind::Cluster, clusters),
            (Kind::Kcp, kcps),
            (Kind::Machine, machines),
        ] {
            for o in objects {
                if kind == Kind::Cluster
                    && let Some(t) = o.annotations().get(ETCD_TRANSPORT_ANNOTATION)
                {
                    out.transports
                        .insert((o.namespace().unwrap_or_default(), o.name_any()), t.clone());
                }
                match watch::convert(kind, &o) {
                    Ok(Object::Cluster(c)) => out.clusters.push(c),
                    Ok(Object::Kcp(k)) => out.kcps.push(k),
                    Ok(Object::Machine(m)) => out.machines.push(m),
                    Err(e) => out.warnings.push(format!(
                        "ignoring {} {}/{}, which quorumguard cannot read: {e}",
                        kind.as_str(),
                        o.namespace().unwrap_or_default(),
                        o.name_any()
                    )),
                }
            }
        }
        Ok(out)
    }

    /// Says what is wrong when a probe failed because of the `<cluster>-etcd` Secret: missing or
    /// unreadable. `None` when the Secret is readable (the probe's own error then stands).
    async fn explain_secret(&self, namespace: &str, cluster: &str) -> Option<String> {
        let name = format!("{cluster}-etcd");
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(self.timeout, secrets.get_opt(&name)).await {
            Ok(Ok(None)) => Some(format!(
                "Secret {namespace}/{name} not found: the etcd prober needs the cluster's etcd CA \
                 from it (keys tls.crt and tls.key) to sign its client certificate, as KCP does. \
                 Cluster API creates it with the cluster: check that Cluster {namespace}/{cluster} \
                 is managed from this management cluster"
            )),
            Ok(Err(kube::Error::Api(s))) if s.code == 401 || s.code == 403 => Some(format!(
                "cannot read Secret {namespace}/{name} ({} {}): the etcd prober needs get on it \
                 for the cluster's etcd CA",
                s.code, s.reason
            )),
            _ => None,
        }
    }
}

/// Why [`select`] found nothing to show.
enum Unselected {
    /// No Cluster of that name (nor a KCP naming it) in the namespace: `names` are the Clusters
    /// that are there, for the message.
    UnknownCluster {
        namespace: String,
        name: String,
        names: Vec<String>,
    },
    Other(anyhow::Error),
}

/// The message for a Cluster that is not there: what is there instead, in the namespace, and
/// elsewhere (`elsewhere`, `namespace/name`, when the namespace has none and listing everywhere
/// was allowed).
fn unknown_cluster(namespace: &str, name: &str, names: &[String], elsewhere: &[String]) -> String {
    const SHOWN: usize = 20;
    let existing = if names.is_empty() {
        format!("there are no Clusters in namespace {namespace}")
    } else {
        format!("Clusters in namespace {namespace}: {}", names.join(", "))
    };
    let others = if elsewhere.is_empty() {
        String::new()
    } else {
        let more = elsewhere.len().saturating_sub(SHOWN);
        format!(
            "; Clusters in other namespaces: {}{}",
            elsewhere[..elsewhere.len().min(SHOWN)].join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    };
    format!(
        "no Cluster {name:?} in namespace {namespace}; {existing}{others}. Choose one, another \
         namespace with -n NAMESPACE, or list every control plane with -A"
    )
}

/// The KCPs to show, chosen from what was listed.
fn select(listed: &Listed, cluster: Option<&str>, scope: &Scope) -> Result<Vec<Key>, Unselected> {
    let key = |k: &CapiKcp| (k.object.namespace.clone(), k.object.name.clone());
    let Some(name) = cluster else {
        let mut all: Vec<Key> = listed.kcps.iter().map(key).collect();
        all.sort();
        return Ok(all);
    };
    let Scope::Namespace(ns) = scope else {
        return Err(Unselected::Other(anyhow!(
            "a Cluster cannot be looked up by name across all namespaces: drop -A, or drop the name"
        )));
    };
    let found = listed
        .clusters
        .iter()
        .find(|c| c.object.namespace == *ns && c.object.name == name);
    let by_label: Vec<&CapiKcp> = listed
        .kcps
        .iter()
        .filter(|k| k.object.namespace == *ns && k.cluster_name.as_deref() == Some(name))
        .collect();
    if let Some(c) = found
        && let Some(kcp) = &c.control_plane_name
    {
        return match listed
            .kcps
            .iter()
            .find(|k| k.object.namespace == *ns && k.object.name == *kcp)
        {
            Some(k) => Ok(vec![key(k)]),
            None => Err(Unselected::Other(anyhow!(
                "Cluster {ns}/{name} refers to KubeadmControlPlane {kcp} (spec.controlPlaneRef), \
                 which does not exist in namespace {ns}: `kubectl get kubeadmcontrolplanes -n {ns}` \
                 shows what does"
            ))),
        };
    }
    if !by_label.is_empty() {
        let mut v: Vec<Key> = by_label.into_iter().map(key).collect();
        v.sort();
        return Ok(v);
    }
    if found.is_some() {
        return Err(Unselected::Other(anyhow!(
            "Cluster {ns}/{name} has no KubeadmControlPlane: its spec.controlPlaneRef names none \
             and no KubeadmControlPlane in {ns} carries label cluster.x-k8s.io/cluster-name={name}. \
             quorumguard guards KubeadmControlPlane control planes only"
        )));
    }
    let mut names: Vec<String> = listed
        .clusters
        .iter()
        .filter(|c| c.object.namespace == *ns)
        .map(|c| c.object.name.clone())
        .collect();
    names.sort();
    Err(Unselected::UnknownCluster {
        namespace: ns.clone(),
        name: name.to_string(),
        names,
    })
}

/// `namespace/name` of every Cluster anywhere, for the message about an unknown Cluster when
/// the namespace has none. Best effort: listing everywhere may be forbidden.
async fn clusters_elsewhere(mgmt: &Mgmt) -> Option<Vec<String>> {
    let objects = mgmt.list(Kind::Cluster, &Scope::All).await.ok()?;
    let mut v: Vec<String> = objects
        .iter()
        .map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
        .collect();
    v.sort();
    Some(v)
}

/// Lists, probes and reports.
async fn gather(args: &StatusArgs) -> anyhow::Result<StatusReport> {
    let config = kube_config(args).await?;
    let server = config.cluster_url.to_string();
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let scope = if args.all_namespaces {
        Scope::All
    } else {
        Scope::Namespace(namespace.clone())
    };
    let client = Client::try_from(config)
        .with_context(|| format!("building a client for the API server at {server}"))?;
    let mgmt = Mgmt {
        client,
        server,
        timeout: args.request_timeout,
    };
    let listed = mgmt.list_all(&scope).await?;
    let selected = match select(&listed, args.cluster.as_deref(), &scope) {
        Ok(s) => s,
        Err(Unselected::Other(e)) => return Err(e),
        Err(Unselected::UnknownCluster {
            namespace,
            name,
            names,
        }) => {
            let elsewhere = if names.is_empty() {
                clusters_elsewhere(&mgmt).await.unwrap_or_default()
            } else {
                Vec::new()
            };
            bail!(unknown_cluster(&namespace, &name, &names, &elsewhere));
        }
    };
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

    let targets = state.probe_targets();
    let cfg = SweepConfig {
        deadline: args.probe_timeout,
        concurrency: PROBE_CONCURRENCY,
        transport: args.etcd_transport,
        confirmation: Confirmation {
            election_timeout: args.etcd_election_timeout,
        },
        ..Default::default()
    };
    // Each probe ends by its deadline (reading the Secret, then etcd), and a cluster is probed
    // at most `max_probes` times an election timeout apart while a finding is confirmed: this
    // outer bound only guards against a bug there, so that the command always ends.
    let waves = u32::try_from(targets.len().div_ceil(PROBE_CONCURRENCY)).unwrap_or(u32::MAX);
    let probes = u32::try_from(cfg.confirmation.max_probes()).unwrap_or(u32::MAX);
    let per_cluster = (args.probe_timeout * 2 + Duration::from_secs(5))
        + (args.probe_timeout + args.etcd_election_timeout).saturating_mul(probes);
    let bound = per_cluster.saturating_mul(waves.max(1));
    if tokio::time::timeout(
        bound,
        sweep_once(&mgmt.client, &state, &cfg, &Probers::default()),
    )
    .await
    .is_err()
    {
        warnings.push(format!(
            "the etcd probes did not finish within {bound:?}; clusters not probed by then are shown as unknown"
        ));
    }
    // A failed probe whose CA Secret is missing or unreadable: say that, and what to do.
    let failed = targets
        .iter()
        .filter(|t| state.probe_error(&t.namespace, &t.cluster).is_some());
    let explained = futures::future::join_all(failed.map(|t| {
        let mgmt = &mgmt;
        async move { (t, mgmt.explain_secret(&t.namespace, &t.cluster).await) }
    }))
    .await;
    for (t, why) in explained {
        if let Some(why) = why {
            state.set_probe_error(&t.namespace, &t.cluster, why);
        }
    }

    let policy = Policy::default();
    let now = Instant::now();
    let now_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .context("the system clock is before 1970")?;
    let mut control_planes = Vec::with_capacity(selected.len());
    for (ns, name) in &selected {
        let cp = state.control_plane(ns, name, now).map_err(|e| {
            anyhow!("KubeadmControlPlane {ns}/{name} vanished from the listed objects ({e:?})")
        })?;
        let cluster = cp.cluster.name.clone();
        let probe_error = state.probe_error(ns, &cluster);
        let next = next_action(&cp, &policy, now_unix);
        let conds = conditions(
            &cp,
            &policy,
            now_unix,
            state.kcp_generation(ns, name),
            probe_error.as_deref(),
        );
        let probe = ProbeOut {
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
                let annotation = listed.transports.get(&(ns.clone(), cluster.clone()));
                match TransportKind::for_cluster(
                    annotation.map(String::as_str),
                    args.etcd_transport,
                ) {
                    Ok(kind) => kind.as_str().to_string(),
                    Err(_) => annotation.cloned().unwrap_or_default(),
                }
            },
            took_ms: state
                .probe_duration(ns, &cluster)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
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
        warnings,
    })
}

/// The human-readable view: with several control planes, a summary table first; then each
/// control plane as `check` prints it (header, member table, quorum, next action), with the
/// probe's outcome and the etcd condition's summary under the header.
pub fn render_text(r: &StatusReport) -> String {
    let mut out = String::new();
    if r.control_planes.len() > 1 {
        out.push_str(&summary(r));
    }
    for (i, cps) in r.control_planes.iter().enumerate() {
        if i > 0 || r.control_planes.len() > 1 {
            out.push_str("\n---\n\n");
        }
        out.push_str(&render_one(cps));
    }
    out
}

fn summary(r: &StatusReport) -> String {
    let rows: Vec<Vec<String>> = r
        .control_planes
        .iter()
        .map(|c| {
            let (ns, kcp) = c
                .report
                .control_plane
                .kcp
                .split_once('/')
                .unwrap_or(("", c.report.control_plane.kcp.as_str()));
            let q = c.report.quorum.as_ref();
            let fig = |f: fn(&check::QuorumOut) -> String| q.map(f).unwrap_or_else(|| "?".into());
            vec![
                ns.to_string(),
                c.report.control_plane.cluster.clone(),
                kcp.to_string(),
                match c.probe.result {
                    ProbeResult::Observed => "observed",
                    ProbeResult::Failed => "FAILED",
                    ProbeResult::NotProbed => "external",
                }
                .to_string(),
                fig(|q| q.members.to_string()),
                fig(|q| q.healthy.to_string()),
                fig(|q| q.quorum.to_string()),
                fig(|q| q.fault_tolerance.to_string()),
                c.report.next_action.code.to_string(),
            ]
        })
        .collect();
    check::table(
        &[
            "NAMESPACE",
            "CLUSTER",
            "KUBEADMCONTROLPLANE",
            "ETCD",
            "MEMBERS",
            "HEALTHY",
            "QUORUM",
            "TOLERANCE",
            "NEXT ACTION",
        ],
        &rows,
    )
}

fn render_one(c: &ControlPlaneStatus) -> String {
    let r = &c.report;
    let mut out = check::render_header(r);
    let took = c
        .probe
        .took_ms
        .map(|ms| format!(" in {ms} ms"))
        .unwrap_or_default();
    out.push_str(&match c.probe.result {
        ProbeResult::Observed => format!(
            "etcd probe: member list read{took} (transport {})\n",
            c.probe.transport
        ),
        ProbeResult::Failed => format!(
            "etcd probe: FAILED (transport {}): {}\n",
            c.probe.transport,
            c.probe.error.as_deref().unwrap_or("unknown error")
        ),
        ProbeResult::NotProbed => "etcd probe: not probed (external etcd)\n".to_string(),
    });
    if let Some(q) = c
        .conditions
        .iter()
        .find(|x| x.type_ == conditions::CONDITION_ETCD_QUORUM)
    {
        // After a failed probe its summary repeats the probe's error, shown just above.
        let summary = match c.probe.result {
            ProbeResult::Failed => String::new(),
            _ => format!(": {}", q.message.lines().next().unwrap_or("")),
        };
        out.push_str(&format!(
            "etcd condition: {} ({}){summary}\n",
            q.status, q.reason
        ));
    }
    out.push_str(&check::render_members(r));
    out.push_str(&check::render_quorum(r, true));
    out.push_str(&check::render_next_action(r));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi;
    use serde_json::json;

    fn cluster(ns: &str, name: &str, kcp: Option<&str>) -> CapiCluster {
        let spec = match kcp {
            Some(k) => json!({"controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                                                  "kind": "KubeadmControlPlane", "name": k}}),
            None => json!({}),
        };
        capi::parse_cluster(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": name, "namespace": ns}, "spec": spec,
        }))
        .expect("cluster")
    }

    fn kcp(ns: &str, name: &str, cluster: &str) -> CapiKcp {
        capi::parse_kcp(&json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "spec": {"replicas": 3, "version": "v1.33.0"},
        }))
        .expect("kcp")
    }

    fn listed() -> Listed {
        Listed {
            clusters: vec![
                cluster("a", "c1", Some("c1-cp")),
                cluster("a", "c2", None),
                cluster("a", "dangling", Some("gone")),
                cluster("a", "bare", None),
                cluster("b", "c3", Some("c3-cp")),
            ],
            kcps: vec![
                kcp("a", "c1-cp", "c1"),
                kcp("a", "c2-cp", "c2"),
                kcp("b", "c3-cp", "c3"),
            ],
            ..Default::default()
        }
    }

    fn ns(n: &str) -> Scope {
        Scope::Namespace(n.into())
    }

    fn err(r: Result<Vec<Key>, Unselected>) -> String {
        match r {
            Ok(v) => panic!("selected {v:?}"),
            Err(Unselected::Other(e)) => format!("{e:#}"),
            Err(Unselected::UnknownCluster {
                namespace,
                name,
                names,
            }) => unknown_cluster(&namespace, &name, &names, &[]),
        }
    }

    fn key(ns: &str, name: &str) -> Key {
        (ns.into(), name.into())
    }

    #[test]
    fn a_cluster_selects_its_kcp_by_reference_or_by_label() {
        let l = listed();
        assert!(matches!(
            select(&l, Some("c1"), &ns("a")),
            Ok(v) if v == [key("a", "c1-cp")]
        ));
        assert!(matches!(
            select(&l, Some("c2"), &ns("a")),
            Ok(v) if v == [key("a", "c2-cp")]
        ));
        assert!(matches!(
            select(&l, None, &ns("a")),
            Ok(v) if v.len() == 3
        ));
        assert!(matches!(select(&l, None, &Scope::All), Ok(v) if v.len() == 3));
    }

    #[test]
    fn what_cannot_be_selected_is_explained() {
        let l = listed();
        let e = err(select(&l, Some("dangling"), &ns("a")));
        assert!(
            e.contains("Cluster a/dangling refers to KubeadmControlPlane gone"),
            "{e}"
        );
        let e = err(select(&l, Some("bare"), &ns("a")));
        assert!(
            e.contains("Cluster a/bare has no KubeadmControlPlane"),
            "{e}"
        );
        let e = err(select(&l, Some("nope"), &ns("a")));
        assert!(
            e.contains("no Cluster \"nope\" in namespace a; Clusters in namespace a: bare, c1, c2, dangling."),
            "{e}"
        );
        let e = err(select(&l, Some("c1"), &ns("b")));
        assert!(e.contains("Clusters in namespace b: c3"), "{e}");
        let e = err(select(&l, Some("c1"), &Scope::All));
        assert!(e.contains("across all namespaces"), "{e}");
    }

    #[test]
    fn clusters_elsewhere_are_named_up_to_a_limit() {
        let others: Vec<String> = (0..25).map(|i| format!("ns/c{i:02}")).collect();
        let m = unknown_cluster("x", "c", &[], &others);
        assert!(m.contains("there are no Clusters in namespace x"), "{m}");
        assert!(m.contains("ns/c00, ns/c01"), "{m}");
        assert!(m.contains("ns/c19 and 5 more"), "{m}");
        assert!(!m.contains("ns/c20"), "{m}");
    }
}
