//! `quorumguard status`: the live view of a control plane, from a kubeconfig for the management
//! cluster — the etcd member table, the quorum figures and the next safe action that KCP's own
//! status lacks. Also the kubectl plugin (`kubectl quorumguard status`).
//!
//! It reads what the webhook reads, the same way, once: Clusters, KubeadmControlPlanes and
//! control-plane Machines are listed (v1beta2) and converted by the watch's own conversion into a
//! [`ClusterState`](quorumguard_observe::state::ClusterState), then one
//! [`sweep_once`](quorumguard_observe::etcd::sweep::sweep_once) probes each workload cluster's etcd exactly as
//! `serve` does. The report is `check`'s [`Report`] built from the resulting control plane, so the
//! JSON has `check`'s schema per control plane and the text reads like `check`'s. Nothing is
//! written anywhere.
//!
//! This file holds the arguments, the JSON report's types and `run`; its children:
//! - `mgmt`: the management cluster's client configuration and what is asked of it;
//! - `select`: which KubeadmControlPlanes to show, and why none when none;
//! - `gather`: listing, probing once and building the report;
//! - `render`: the text view ([`render_text`]).

mod gather;
pub(super) mod mgmt;
mod render;
pub(super) mod select;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Serialize;

use super::check::{Format, Report};
use quorumguard_engine::ActionCode;
use quorumguard_observe::etcd::TransportKind;

use gather::gather;
pub(super) use gather::{connect, probe};
pub use render::render_text;

/// The schema identifier of [`StatusReport`].
pub const SCHEMA: &str = "quorumguard.io/status/v1";

/// Clusters probed at once by default (the sweep's default): a CLI run over `-A` should not open
/// hundreds of etcd connections at the same time unless asked to (`--probe-concurrency`).
const PROBE_CONCURRENCY: u16 = 16;

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
that cannot be reached or refuses, an unknown Cluster or --kcp, a Cluster without a
KubeadmControlPlane, or no KubeadmControlPlane in the namespace.")]
pub struct StatusArgs {
    /// The Cluster whose KubeadmControlPlane to show, in the namespace (another way to name it
    /// than --kcp, kept from before --kcp).
    #[arg(value_name = "CLUSTER", conflicts_with = "all_namespaces")]
    pub cluster: Option<String>,
    #[command(flatten)]
    pub select: SelectArgs,
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Output format: `json` is `{"schema": "quorumguard.io/status/v1", "controlPlanes": [...]}`,
    /// each entry a `check -o json` report with `probe` and `conditions` added.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text, env = "QUORUMGUARD_OUTPUT")]
    pub output: Format,
    #[command(flatten)]
    pub grace: super::GraceArgs,
}

/// Which KubeadmControlPlanes: `status`'s and `preflight`'s flags alike (`check` names the one of
/// its dumps with the same --kcp).
#[derive(Debug, Args)]
pub struct SelectArgs {
    /// The KubeadmControlPlane (NAME or NAMESPACE/NAME). Default: every one in the namespace
    /// (every namespace with -A); none there is an error.
    #[arg(long, value_name = "NAME", env = "QUORUMGUARD_KCP")]
    pub kcp: Option<String>,
    /// Namespace of the Cluster API objects (default: the kubeconfig context's namespace, else
    /// "default", as kubectl does).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Every namespace (overrides --namespace, as in kubectl).
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

/// How the management cluster is reached and each workload cluster's etcd probed: `status`'s
/// and `preflight`'s flags alike.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Kubeconfig of the management cluster (default: $KUBECONFIG, else ~/.kube/config, else the
    /// in-cluster service account).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Deadline of one cluster's etcd probe (reading its CA Secret, then the member list and
    /// every member in parallel). A frozen or dead member shows as unhealthy with its error.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = super::duration)]
    pub probe_timeout: Duration,
    /// Workload clusters probed at once. A fleet's first probe opens a TLS connection per member
    /// and reads each cluster's etcd CA Secret: more at once finishes sooner, at the cost of
    /// more connections open together.
    #[arg(long, value_name = "N", default_value_t = PROBE_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub probe_concurrency: u16,
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
///       "tookMs": 35 | null,          // the whole probe
///       "memberListMs": 12 | null,    // of it, the member list
///       "slowestMember": "m3" | null, // then every member in parallel: the slowest one
///       "slowestMemberMs": 23 | null
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
    pub member_list_ms: Option<u64>,
    pub slowest_member: Option<String>,
    pub slowest_member_ms: Option<u64>,
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
    let report = super::block_on(gather(args))?;
    super::print_report(
        args.output,
        &report.warnings,
        || render_text(&report),
        &report,
    )?;
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
