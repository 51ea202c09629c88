//! `quorumguard check`: judge a control plane offline, from the dumps a support engineer gets.
//!
//! Answers the two questions of cluster-api #2651 without access to the cluster: "would etcd
//! stay healthy after this change?" (each `--what-if`) and "what is the single next safe
//! action?". It asks the same engine the admission webhook asks, so the answers agree.

//!
//! This file holds the arguments, the what-ifs and the analysis; its children:
//! - `report`: [`Report`], the stable JSON schema `check` and `status` share;
//! - `render`: the human-readable text of a report ([`render_text`] and its parts).

#[cfg(test)]
mod field_cases;
mod render;
mod report;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use clap::{Args, ValueEnum};

use quorumguard_engine::{ControlPlane, Operation, Policy, Requester, decide, next_action};
use quorumguard_observe::dumps::{self, DumpFiles};

pub use render::{render_header, render_members, render_next_action, render_quorum, render_text};
pub(crate) use render::{table, tolerance_cell};
pub use report::{
    ControlPlaneOut, CountsOut, FiguresOut, HealthCheckOut, HealthChecksOut, MachineOut, MemberOut,
    NextActionOut, QuorumOut, RemediationOut, Report, SCHEMA, VerdictOut,
};

/// Who `check` asks as when `--as` is not given: the admin user kubeadm's kubeconfig names, a
/// human (humans are held to the desired-replicas rule, controllers are not).
pub const DEFAULT_REQUESTER: &str = "kubernetes-admin";

#[derive(Debug, Args)]
#[command(after_help = "\
Collect the inputs with:
  kubectl get kubeadmcontrolplanes,machines,clusters,machinehealthchecks -n NAMESPACE -o yaml > objects.yaml
  etcdctl member list -w json > member-list.json
  etcdctl endpoint status --cluster -w json > endpoint-status.json
  etcdctl endpoint health --cluster -w json > endpoint-health.json
  etcdctl alarm list > alarms.txt

Exit status: 0 when every what-if is allowed (or none is given), 1 when any is denied,
2 on bad input.")]
pub struct CheckArgs {
    #[command(flatten)]
    pub dumps: DumpArgs,
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
    /// The present, for the join and learner grace of new Machines (RFC 3339; default: the
    /// clock). Makes the output reproducible.
    #[arg(long, value_name = "RFC3339", value_parser = parse_time)]
    pub now: Option<i64>,
    #[command(flatten)]
    pub grace: super::GraceArgs,
}

/// The dumps a control plane is judged from: `check`'s and `preflight`'s offline input, the
/// same flags for both.
#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Cluster API objects: `kubectl get kubeadmcontrolplanes,machines,clusters,machinehealthchecks
    /// -o yaml` (a List), multi-document YAML, or JSON; v1beta2 or v1beta1.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_OBJECTS")]
    pub objects: PathBuf,
    /// `etcdctl member list -w json`. Empty, or etcdctl's error, when etcdctl failed (etcdctl
    /// 3.5 fails it without a leader): the member list is then unknown, and the endpoint status
    /// says what was seen instead.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_MEMBER_LIST")]
    pub member_list: PathBuf,
    /// `etcdctl endpoint status --cluster -w json`: leader, version, DB size, raft index, errors.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_ENDPOINT_STATUS")]
    pub endpoint_status: Option<PathBuf>,
    /// `etcdctl endpoint health --cluster -w json`. Without status and health, every member's
    /// health is unknown and only what needs no proof is allowed.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_ENDPOINT_HEALTH")]
    pub endpoint_health: Option<PathBuf>,
    /// `etcdctl alarm list`, plain text or `-w json`; NOSPACE and CORRUPT make a member unhealthy.
    #[arg(long, value_name = "FILE", env = "QUORUMGUARD_ALARMS")]
    pub alarms: Option<PathBuf>,
}

impl DumpArgs {
    /// Reads and parses the dumps into the control plane `kcp` (NAME or NAMESPACE/NAME; needed
    /// when the objects hold several).
    pub fn load(&self, kcp: Option<&str>) -> anyhow::Result<dumps::Loaded> {
        Ok(dumps::load(&DumpFiles {
            objects: &self.objects,
            member_list: &self.member_list,
            endpoint_status: self.endpoint_status.as_deref(),
            endpoint_health: self.endpoint_health.as_deref(),
            alarms: self.alarms.as_deref(),
            kcp,
        })?)
    }
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

pub(crate) fn parse_time(s: &str) -> Result<i64, String> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second())
        .map_err(|e| format!("{s:?} is not an RFC 3339 time: {e}"))
}

/// Runs `check`: prints the report on stdout, input warnings on stderr. Errors are bad input.
pub fn run(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let report = evaluate(args)?;
    super::print_report(
        args.output,
        &report.warnings,
        || render_text(&report),
        &report,
    )?;
    Ok(if report.verdicts.iter().all(|v| v.allowed) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Loads the dumps, judges every what-if and the next action.
pub fn evaluate(args: &CheckArgs) -> anyhow::Result<Report> {
    let loaded = args.dumps.load(args.kcp.as_deref())?;
    let requester = Requester {
        username: args.as_user.clone(),
        groups: args.as_groups.clone(),
    };
    let now = match args.now {
        Some(n) => n,
        None => super::now_unix()?,
    };
    analyse_with(loaded, &args.what_if, &requester, &args.grace.policy(), now)
}

/// Judges every what-if and the next action on loaded dumps: the analysis of [`evaluate`]
/// without the files, so that the fuzz targets and property tests reach it with any input.
pub fn analyse(
    loaded: dumps::Loaded,
    what_ifs: &[WhatIf],
    requester: &Requester,
    now: i64,
) -> anyhow::Result<Report> {
    analyse_with(loaded, what_ifs, requester, &Policy::default(), now)
}

/// [`analyse`] under `policy` (`--join-grace`, `--learner-grace`).
pub fn analyse_with(
    loaded: dumps::Loaded,
    what_ifs: &[WhatIf],
    requester: &Requester,
    policy: &Policy,
    now: i64,
) -> anyhow::Result<Report> {
    let cp = loaded.control_plane;
    // Dumps, not a live etcd: advice names new dumps, never a probe `check` cannot take.
    let policy = &Policy {
        offline: true,
        ..policy.clone()
    };
    let mut verdicts = Vec::new();
    for w in what_ifs {
        let op = operation(&cp, w)?;
        let v = decide(&cp, &op, requester, policy, now);
        verdicts.push(VerdictOut::new(w, requester, v));
    }
    let next = next_action(&cp, policy, now);
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
