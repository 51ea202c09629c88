//! `quorumguard check`: judge a control plane offline, from the dumps a support engineer gets.
//!
//! Answers the two questions of cluster-api #2651 without access to the cluster: "would etcd
//! stay healthy after this change?" (each `--what-if`) and "what is the single next safe
//! action?". It asks the same engine the admission webhook asks, so the answers agree.

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::dumps::{self, DumpFiles};
use crate::engine::quorum::{Tally, quorum, tolerance};
use crate::engine::{
    ControlPlane, EtcdState, EtcdTopology, Figures, Health, Member, NextAction, Operation, Policy,
    Requester, Verdict, decide, next_action,
};

/// Who `check` asks as when `--as` is not given: the admin user kubeadm's kubeconfig names, a
/// human (humans are held to the desired-replicas rule, controllers are not).
pub const DEFAULT_REQUESTER: &str = "kubernetes-admin";

#[derive(Debug, Args)]
#[command(after_help = "\
Collect the inputs with:
  kubectl get kubeadmcontrolplanes,machines,clusters -n NAMESPACE -o yaml > objects.yaml
  etcdctl member list -w json > member-list.json
  etcdctl endpoint status --cluster -w json > endpoint-status.json
  etcdctl endpoint health --cluster -w json > endpoint-health.json
  etcdctl alarm list > alarms.txt

Exit status: 0 when every what-if is allowed (or none is given), 1 when any is denied,
2 on bad input.")]
pub struct CheckArgs {
    /// Cluster API objects: `kubectl get kubeadmcontrolplanes,machines,clusters -o yaml` (a
    /// List), multi-document YAML, or JSON; v1beta2 or v1beta1.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_OBJECTS")]
    pub objects: PathBuf,
    /// `etcdctl member list -w json`.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_MEMBER_LIST")]
    pub member_list: PathBuf,
    /// `etcdctl endpoint status --cluster -w json`: leader, version, DB size, raft index, errors.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_ENDPOINT_STATUS")]
    pub endpoint_status: Option<PathBuf>,
    /// `etcdctl endpoint health --cluster -w json`. Without status and health, every member's
    /// health is unknown and only what needs no proof is allowed.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_ENDPOINT_HEALTH")]
    pub endpoint_health: Option<PathBuf>,
    /// `etcdctl alarm list` (plain text); NOSPACE and CORRUPT make a member unhealthy.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_ALARMS")]
    pub alarms: Option<PathBuf>,
    /// The KubeadmControlPlane to judge (NAME or NAMESPACE/NAME) when the objects hold several.
    #[arg(long, value_name = "NAME", env = "QUORUMGUARD_KCP")]
    pub kcp: Option<String>,
    /// Who asks for the what-ifs (admission userInfo.username). The KCP controller's service
    /// account is judged as a controller, teardown identities are always allowed.
    #[arg(long = "as", value_name = "USER", default_value = DEFAULT_REQUESTER)]
    pub as_user: String,
    /// Groups of the requester (repeatable).
    #[arg(long = "as-group", value_name = "GROUP")]
    pub as_groups: Vec<String>,
    /// An operation to judge, each on its own against the dumped state (repeatable):
    /// 'delete machine/NAME' or 'scale kcp/NAME N'.
    #[arg(long = "what-if", value_name = "OPERATION", value_parser = parse_what_if)]
    pub what_if: Vec<WhatIf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text, env = "QUORUMGUARD_OUTPUT")]
    pub output: Format,
    /// The present, for the join grace of new Machines (RFC 3339; default: the clock). Makes
    /// the output reproducible.
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub now: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// A hypothetical operation, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WhatIf {
    DeleteMachine { name: String },
    ScaleKcp { name: String, replicas: u32 },
}

impl WhatIf {
    /// Every what-if worth asking of `cp`: delete each Machine, and scale the KCP to every
    /// replica count from 0 to two above the current one (at most 9). What the fuzz targets and
    /// property tests put to [`analyse`], so both exercise every kind of verdict.
    pub fn all_for(cp: &ControlPlane) -> Vec<WhatIf> {
        let deletions = cp.machines.iter().map(|m| WhatIf::DeleteMachine {
            name: m.name.clone(),
        });
        let top = cp.kcp.replicas.saturating_add(2).min(9);
        let scales = (0..=top).map(|replicas| WhatIf::ScaleKcp {
            name: cp.kcp.name.clone(),
            replicas,
        });
        deletions.chain(scales).collect()
    }
}

impl fmt::Display for WhatIf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WhatIf::DeleteMachine { name } => write!(f, "delete machine/{name}"),
            WhatIf::ScaleKcp { name, replicas } => write!(f, "scale kcp/{name} {replicas}"),
        }
    }
}

const MACHINE_RESOURCES: [&str; 4] = [
    "machine",
    "machines",
    "machine.cluster.x-k8s.io",
    "machines.cluster.x-k8s.io",
];
const KCP_RESOURCES: [&str; 5] = [
    "kcp",
    "kubeadmcontrolplane",
    "kubeadmcontrolplanes",
    "kubeadmcontrolplane.controlplane.cluster.x-k8s.io",
    "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io",
];

/// Parses `delete machine/NAME` and `scale kcp/NAME N` (also `--replicas=N`, as kubectl says).
pub fn parse_what_if(s: &str) -> Result<WhatIf, String> {
    let usage = "expected 'delete machine/NAME' or 'scale kcp/NAME N'";
    let words: Vec<&str> = s.split_whitespace().collect();
    let target = |w: &str, resources: &[&str]| -> Option<String> {
        let (res, name) = w.split_once('/')?;
        (resources.contains(&res.to_ascii_lowercase().as_str()) && !name.is_empty())
            .then(|| name.to_string())
    };
    match words.as_slice() {
        ["delete", t] => target(t, &MACHINE_RESOURCES)
            .map(|name| WhatIf::DeleteMachine { name })
            .ok_or_else(|| format!("{s:?}: {usage}")),
        ["scale", t, n] => {
            let name = target(t, &KCP_RESOURCES).ok_or_else(|| format!("{s:?}: {usage}"))?;
            let n = n.strip_prefix("--replicas=").unwrap_or(n);
            let replicas = n
                .parse::<u32>()
                .map_err(|_| format!("{s:?}: replicas {n:?} is not a non-negative integer"))?;
            Ok(WhatIf::ScaleKcp { name, replicas })
        }
        _ => Err(format!("{s:?}: {usage}")),
    }
}

fn parse_time(s: &str) -> Result<i64, String> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second())
        .map_err(|e| format!("{s:?} is not an RFC 3339 time: {e}"))
}

/// Runs `check`: prints the report on stdout, input warnings on stderr. Errors are bad input.
pub fn run(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let report = evaluate(args)?;
    for w in &report.warnings {
        eprintln!("quorumguard: warning: {w}");
    }
    match args.output {
        Format::Text => print!("{}", render_text(&report)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).context("cannot render the report as JSON")?
        ),
    }
    Ok(if report.verdicts.iter().all(|v| v.allowed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Loads the dumps, judges every what-if and the next action.
pub fn evaluate(args: &CheckArgs) -> anyhow::Result<Report> {
    let loaded = dumps::load(&DumpFiles {
        objects: &args.objects,
        member_list: &args.member_list,
        endpoint_status: args.endpoint_status.as_deref(),
        endpoint_health: args.endpoint_health.as_deref(),
        alarms: args.alarms.as_deref(),
        kcp: args.kcp.as_deref(),
    })?;
    let requester = Requester {
        username: args.as_user.clone(),
        groups: args.as_groups.clone(),
    };
    let now = match args.now {
        Some(n) => n,
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .context("the system clock is before 1970")?,
    };
    analyse(loaded, &args.what_if, &requester, now)
}

/// Judges every what-if and the next action on loaded dumps: the analysis of [`evaluate`]
/// without the files, so that the fuzz targets and property tests reach it with any input.
pub fn analyse(
    loaded: dumps::Loaded,
    what_ifs: &[WhatIf],
    requester: &Requester,
    now: i64,
) -> anyhow::Result<Report> {
    let cp = loaded.control_plane;
    let policy = Policy::default();
    let mut verdicts = Vec::new();
    for w in what_ifs {
        let op = operation(&cp, w)?;
        let v = decide(&cp, &op, requester, &policy, now);
        verdicts.push(VerdictOut::new(w, requester, v));
    }
    let next = next_action(&cp, &policy, now);
    Ok(Report::new(&cp, verdicts, &next, loaded.warnings))
}

/// The engine operation of a what-if, checked against the dumped objects.
fn operation(cp: &ControlPlane, w: &WhatIf) -> anyhow::Result<Operation> {
    match w {
        WhatIf::DeleteMachine { name } => match cp.machine(name) {
            Some(m) => Ok(Operation::DeleteMachine(m.clone())),
            None => bail!(
                "--what-if '{w}': no Machine {name:?} in KubeadmControlPlane {} (its Machines: {})",
                cp.kcp_ref(),
                if cp.machines.is_empty() {
                    "none".to_string()
                } else {
                    cp.machines
                        .iter()
                        .map(|m| m.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        },
        WhatIf::ScaleKcp { name, replicas } => {
            if *name != cp.kcp.name {
                bail!(
                    "--what-if '{w}': the objects are judged for KubeadmControlPlane {}, not {name:?} (choose another with --kcp)",
                    cp.kcp_ref()
                );
            }
            Ok(Operation::UpdateKcp {
                replicas_from: cp.kcp.replicas,
                replicas_to: *replicas,
                starts_rollout: false,
            })
        }
    }
}

/// The output of `quorumguard check -o json`. Stable: fields are added, never renamed or
/// removed, and `schema` changes if that promise is ever broken. Every key is always present;
/// unknown values are `null`.
///
/// ```text
/// {
///   "schema": "quorumguard.io/check/v1",
///   "controlPlane": {
///     "kcp": "NAMESPACE/NAME", "cluster": "NAME", "replicas": 3, "version": "v1.33.1" | null,
///     "etcd": "Stacked" | "External", "maxSurge": 1, "deleting": false, "clusterDeleting": false
///   },
///   "members": [{                      // as in the member list, with what status/health said
///     "name": "cp-node-1",             // "" when the member was added but has not started
///     "id": "673ce451ecd2d8e9",        // hex, as etcdctl prints it
///     "voting": true, "learner": false, "unstarted": false,
///     "health": "Healthy" | "Unhealthy" | "Unknown",   // as the quorum rules see it (alarms,
///     "error": "context deadline exceeded" | null,     //  unstarted members count)
///     "leader": true, "version": "3.4.23" | null, "dbSize": 24576 | null,
///     "raftTerm": 2 | null, "raftIndex": 28 | null,
///     "alarms": ["NOSPACE"], "clientUrls": ["https://..."],
///     "machine": "demo-control-plane-x7k2p" | null
///   }],
///   "machines": [{ "name": "...", "node": "cp-node-1" | null, "deleting": false,
///                  "member": "673ce451ecd2d8e9" | null }],
///   "machinesWithoutMember": ["demo-control-plane-x7k2p"],
///   "quorum": { "members": 3, "voting": 3, "learners": 0, "healthy": 2, "unhealthy": 1,
///               "unknown": 0, "quorum": 2, "faultTolerance": 0, "hasQuorum": true },
///                                      // null only in `status`, when etcd was not observed
///   "verdicts": [{                     // one per --what-if, in order
///     "whatIf": "delete machine/NAME" | "scale kcp/NAME N", "as": "kubernetes-admin",
///     "allowed": false, "reason": "WouldLoseQuorum",   // stable reason codes
///     "message": "...", "warnings": ["..."],
///     "figures": { "voting", "healthy", "unknown", "quorum", "faultTolerance",
///                  "votingAfter", "healthyAfter", "quorumAfter", "faultToleranceAfter" } | null
///   }],
///   "nextAction": { "code": "RemediateMachine", "message": "...",
///                   "command": "kubectl annotate ..." | null, "target": "NAME" | "hex id" | null },
///   "warnings": ["..."]                // input problems that did not stop the check
/// }
/// ```
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub schema: &'static str,
    pub control_plane: ControlPlaneOut,
    pub members: Vec<MemberOut>,
    pub machines: Vec<MachineOut>,
    pub machines_without_member: Vec<String>,
    /// `None` (null) when the member list is unknown: `check` always has one (the dump), the
    /// live `status` may not (its probe failed), and figures of an empty list would read as
    /// "quorum lost".
    pub quorum: Option<QuorumOut>,
    pub verdicts: Vec<VerdictOut>,
    pub next_action: NextActionOut,
    pub warnings: Vec<String>,
}

/// The schema identifier of [`Report`].
pub const SCHEMA: &str = "quorumguard.io/check/v1";

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneOut {
    pub kcp: String,
    pub cluster: String,
    pub replicas: u32,
    pub version: Option<String>,
    pub etcd: &'static str,
    pub max_surge: u32,
    pub deleting: bool,
    pub cluster_deleting: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberOut {
    pub name: String,
    pub id: String,
    pub voting: bool,
    pub learner: bool,
    pub unstarted: bool,
    pub health: &'static str,
    pub error: Option<String>,
    pub leader: bool,
    pub version: Option<String>,
    pub db_size: Option<u64>,
    pub raft_term: Option<u64>,
    pub raft_index: Option<u64>,
    pub alarms: Vec<String>,
    pub client_urls: Vec<String>,
    pub machine: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineOut {
    pub name: String,
    pub node: Option<String>,
    pub deleting: bool,
    pub member: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuorumOut {
    /// Every member, voting or learner: the rows of the member table.
    pub members: usize,
    pub voting: usize,
    pub learners: usize,
    pub healthy: usize,
    pub unhealthy: usize,
    pub unknown: usize,
    pub quorum: usize,
    pub fault_tolerance: i64,
    pub has_quorum: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictOut {
    pub what_if: String,
    #[serde(rename = "as")]
    pub requester: String,
    pub allowed: bool,
    pub reason: &'static str,
    pub message: String,
    pub warnings: Vec<String>,
    pub figures: Option<FiguresOut>,
}

impl VerdictOut {
    fn new(w: &WhatIf, r: &Requester, v: Verdict) -> VerdictOut {
        VerdictOut {
            what_if: w.to_string(),
            requester: r.username.clone(),
            allowed: v.allowed,
            reason: v.reason.as_str(),
            message: v.message,
            warnings: v.warnings,
            figures: v.figures.map(FiguresOut::from),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FiguresOut {
    pub voting: usize,
    pub healthy: usize,
    pub unknown: usize,
    pub quorum: usize,
    pub fault_tolerance: i64,
    pub voting_after: usize,
    pub healthy_after: usize,
    pub quorum_after: usize,
    pub fault_tolerance_after: i64,
}

impl From<Figures> for FiguresOut {
    fn from(f: Figures) -> FiguresOut {
        FiguresOut {
            voting: f.voting,
            healthy: f.healthy,
            unknown: f.unknown,
            quorum: f.quorum,
            fault_tolerance: f.tolerance,
            voting_after: f.voting_after,
            healthy_after: f.healthy_after,
            quorum_after: f.quorum_after,
            fault_tolerance_after: f.tolerance_after,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NextActionOut {
    pub code: &'static str,
    pub message: String,
    pub command: Option<String>,
    pub target: Option<String>,
}

impl Report {
    /// The report of `cp` with these verdicts and next action. `status` builds its per-control-
    /// plane reports here too (with no verdicts), so both commands share one schema.
    pub(crate) fn new(
        cp: &ControlPlane,
        verdicts: Vec<VerdictOut>,
        next: &NextAction,
        warnings: Vec<String>,
    ) -> Report {
        let members = cp.members();
        let tally = Tally::of(members, false);
        // By name, as humans look members up; unstarted ones (no name yet) last.
        let mut sorted: Vec<&Member> = members.iter().collect();
        sorted.sort_by(|a, b| {
            (a.is_unstarted(), &a.name, a.id).cmp(&(b.is_unstarted(), &b.name, b.id))
        });
        let members_out = sorted
            .into_iter()
            .map(|m| {
                let health = m.effective_health();
                MemberOut {
                    name: m.name.clone(),
                    id: m.id.to_string(),
                    voting: !m.is_learner,
                    learner: m.is_learner,
                    unstarted: m.is_unstarted(),
                    health: match health {
                        Health::Healthy => "Healthy",
                        Health::Unhealthy(_) => "Unhealthy",
                        Health::Unknown | Health::Unconfirmed(_) => "Unknown",
                    },
                    error: match health {
                        Health::Unhealthy(e) | Health::Unconfirmed(e) => Some(e),
                        _ => None,
                    },
                    leader: m.is_leader,
                    version: m.version.clone(),
                    db_size: m.db_size,
                    raft_term: m.raft_term,
                    raft_index: m.raft_index,
                    alarms: m.alarms.iter().map(ToString::to_string).collect(),
                    client_urls: m.client_urls.clone(),
                    machine: cp.machine_of(m).map(|x| x.name.clone()),
                }
            })
            .collect();
        let machines: Vec<MachineOut> = cp
            .machines
            .iter()
            .map(|m| MachineOut {
                name: m.name.clone(),
                node: m.node_name.clone(),
                deleting: m.deleting,
                member: cp.member_of(m).map(|x| x.id.to_string()),
            })
            .collect();
        let without = machines
            .iter()
            .filter(|m| m.member.is_none())
            .map(|m| m.name.clone())
            .collect();
        let etcd_unknown = matches!(cp.etcd, EtcdState::Unknown { .. });
        Report {
            schema: SCHEMA,
            control_plane: ControlPlaneOut {
                kcp: cp.kcp_ref(),
                cluster: cp.cluster.name.clone(),
                replicas: cp.kcp.replicas,
                version: cp.kcp.version.clone(),
                etcd: match cp.kcp.etcd {
                    EtcdTopology::Stacked => "Stacked",
                    EtcdTopology::External => "External",
                },
                max_surge: cp.kcp.max_surge,
                deleting: cp.kcp.deleting,
                cluster_deleting: cp.cluster.deleting,
            },
            members: members_out,
            machines,
            machines_without_member: if etcd_unknown { Vec::new() } else { without },
            quorum: (!etcd_unknown).then(|| QuorumOut {
                members: members.len(),
                voting: tally.voting(),
                learners: members.iter().filter(|m| m.is_learner).count(),
                healthy: tally.healthy,
                unhealthy: tally.unhealthy,
                unknown: tally.unknown,
                quorum: quorum(tally.voting()),
                fault_tolerance: tolerance(tally.voting(), tally.healthy),
                has_quorum: tally.has_quorum(),
            }),
            verdicts,
            next_action: NextActionOut {
                code: next.code.as_str(),
                message: next.message.clone(),
                command: next.command.clone(),
                target: next.target.clone(),
            },
            warnings,
        }
    }
}

/// Sizes as etcd operators read them.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// Left-aligned columns, two spaces apart.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".into())
}

/// The human-readable report: [`render_header`], [`render_members`], [`render_quorum`], the
/// verdicts, [`render_next_action`]. `status` prints the same parts, so both read alike.
pub fn render_text(r: &Report) -> String {
    let mut out = render_header(r);
    out.push_str(&render_members(r));
    out.push_str(&render_quorum(r, false));
    for v in &r.verdicts {
        out.push_str(&format!(
            "\nWhat if {} (as {}): {} ({})\n  {}\n",
            v.what_if,
            v.requester,
            if v.allowed { "ALLOWED" } else { "DENIED" },
            v.reason,
            v.message
        ));
        for w in &v.warnings {
            out.push_str(&format!("  warning: {w}\n"));
        }
    }
    out.push_str(&render_next_action(r));
    out
}

/// `KubeadmControlPlane ns/name (Cluster c): replicas ..., maxSurge ...`, one line.
pub fn render_header(r: &Report) -> String {
    let cp = &r.control_plane;
    format!(
        "KubeadmControlPlane {} (Cluster {}): replicas {}, version {}, {} etcd, maxSurge {}{}{}\n",
        cp.kcp,
        cp.cluster,
        cp.replicas,
        cp.version.as_deref().unwrap_or("-"),
        cp.etcd.to_lowercase(),
        cp.max_surge,
        if cp.deleting { ", DELETING" } else { "" },
        if cp.cluster_deleting {
            ", Cluster DELETING"
        } else {
            ""
        },
    )
}

/// The member table, then the Machines without a member. When the member list is unknown
/// (`quorum` is `None`) there is no table to show: it says so and lists the Machines.
pub fn render_members(r: &Report) -> String {
    if r.quorum.is_none() {
        let mut out = "\netcd members: unknown\n".to_string();
        if r.machines.is_empty() {
            out.push_str("\nMachines: none\n");
        } else {
            out.push_str("\nMachines (etcd member unknown):\n");
            for m in &r.machines {
                out.push_str(&format!("  {}\n", machine_note(&m.name, m.node.as_deref())));
            }
        }
        return out;
    }
    let mut out = "\netcd members:\n".to_string();
    let rows: Vec<Vec<String>> = r
        .members
        .iter()
        .map(|m| {
            vec![
                if m.unstarted {
                    "(unstarted)".to_string()
                } else {
                    m.name.clone()
                },
                m.id.clone(),
                if m.learner { "learner" } else { "voting" }.to_string(),
                match &m.error {
                    Some(e) => format!("unhealthy: {e}"),
                    None => m.health.to_lowercase(),
                },
                if m.leader { "leader" } else { "" }.to_string(),
                or_dash(m.version.clone()),
                or_dash(m.db_size.map(human_bytes)),
                or_dash(m.raft_index.map(|i| i.to_string())),
                if m.alarms.is_empty() {
                    "-".to_string()
                } else {
                    m.alarms.join(",")
                },
                m.machine.clone().unwrap_or_else(|| "no Machine".into()),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "NAME",
            "ID",
            "ROLE",
            "HEALTH",
            "LEADER",
            "VERSION",
            "DB SIZE",
            "RAFT INDEX",
            "ALARMS",
            "MACHINE",
        ],
        &rows,
    ));
    if r.machines_without_member.is_empty() {
        out.push_str("\nMachines without an etcd member: none\n");
    } else {
        out.push_str("\nMachines without an etcd member:\n");
        for name in &r.machines_without_member {
            let node = r
                .machines
                .iter()
                .find(|m| &m.name == name)
                .and_then(|m| m.node.as_deref());
            out.push_str(&format!("  {}\n", machine_note(name, node)));
        }
    }
    out
}

fn machine_note(name: &str, node: Option<&str>) -> String {
    match node {
        Some(n) => format!("{name} (node {n})"),
        None => format!("{name} (no node yet)"),
    }
}

/// `Quorum: voting 3, healthy 2, quorum 2, fault tolerance 0 (...)`; with `members`, the count
/// of every member (learners included) leads. `Quorum: unknown` without a member list.
pub fn render_quorum(r: &Report, members: bool) -> String {
    let Some(q) = &r.quorum else {
        return "\nQuorum: unknown (no etcd member list)\n".to_string();
    };
    format!(
        "\nQuorum: {}voting {}, healthy {}, quorum {}, fault tolerance {} (unhealthy {}, unknown {}, learners {}){}\n",
        if members {
            format!("members {}, ", q.members)
        } else {
            String::new()
        },
        q.voting,
        q.healthy,
        q.quorum,
        q.fault_tolerance,
        q.unhealthy,
        q.unknown,
        q.learners,
        if q.has_quorum {
            ""
        } else if q.healthy + q.unknown < q.quorum {
            " -- QUORUM LOST"
        } else {
            " -- quorum not proven"
        }
    )
}

/// `Next action: CODE` and its message (which ends with `Run: <command>` when there is one).
pub fn render_next_action(r: &Report) -> String {
    format!(
        "\nNext action: {}\n  {}\n",
        r.next_action.code, r.next_action.message
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_if_forms() {
        assert_eq!(
            parse_what_if("delete machine/m-1"),
            Ok(WhatIf::DeleteMachine { name: "m-1".into() })
        );
        assert_eq!(
            parse_what_if("  delete   machines.cluster.x-k8s.io/m-1 "),
            Ok(WhatIf::DeleteMachine { name: "m-1".into() })
        );
        assert_eq!(
            parse_what_if("scale kcp/k 5"),
            Ok(WhatIf::ScaleKcp {
                name: "k".into(),
                replicas: 5
            })
        );
        assert_eq!(
            parse_what_if("scale kubeadmcontrolplanes/k --replicas=1"),
            Ok(WhatIf::ScaleKcp {
                name: "k".into(),
                replicas: 1
            })
        );
        for bad in [
            "",
            "delete machine/",
            "delete pod/x",
            "scale kcp/k",
            "scale kcp/k -1",
            "scale machine/k 3",
            "drain machine/x",
        ] {
            assert!(parse_what_if(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            WhatIf::ScaleKcp {
                name: "k".into(),
                replicas: 5
            }
            .to_string(),
            "scale kcp/k 5"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(24576), "24.0 KiB");
        assert_eq!(human_bytes(2_240_512), "2.1 MiB");
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("2025-01-02T03:04:05Z"), Ok(1_735_787_045));
        assert!(parse_time("yesterday").is_err());
    }
}
