//! `quorumguard preflight`: before an upgrade wave, which control planes' rollouts would finish,
//! which would stick (at which step, and why), and at which steps one more member failure would
//! lose etcd quorum. Also the kubectl plugin (`kubectl quorumguard preflight`).
//!
//! The prediction is the engine's ([`rollout::preflight`]): it plays the rollout a version
//! change would start on a copy of the control plane with KCP's own step function. This command
//! only gathers the control planes and prints:
//! - online (the default), exactly as `status` does: the management cluster's Clusters,
//!   KubeadmControlPlanes and control-plane Machines are listed and each workload cluster's etcd
//!   is probed once (`status`'s own probe);
//! - offline, from `check`'s dumps ([`DumpArgs`], the same flags): what a user sent.
//!
//! This file holds the arguments, `run` and the exit status; its children:
//! - `online`: choosing the KubeadmControlPlanes and probing them, with a progress line;
//! - `report`: the JSON report ([`PreflightReport`], schema [`SCHEMA`]);
//! - `render`: the text: one line per control plane, or the table of steps of one.

mod online;
mod render;
mod report;
#[cfg(test)]
mod tests;

use std::process::ExitCode;

use clap::Args;

use super::check::{DumpArgs, Format};
use super::status::{ProbeArgs, SelectArgs};
use quorumguard_engine::rollout::{self, Preflight, Readiness};

pub use render::{render_fleet, render_steps};
pub use report::{
    ControlPlanePreflight, CountsOut, OneFailureOut, PreflightReport, SCHEMA, StepOut,
};

#[derive(Debug, Args)]
// The dumps are optional here (offline when given) but go together as in `check`; the
// management cluster's kubeconfig means nothing offline.
#[command(
    mut_arg("objects", |a| a.required(false).requires("member_list")),
    mut_arg("member_list", |a| a.required(false).requires("objects")),
    mut_arg("endpoint_status", |a| a.requires("objects")),
    mut_arg("endpoint_health", |a| a.requires("objects")),
    mut_arg("alarms", |a| a.requires("objects")),
    mut_arg("kubeconfig", |a| a.conflicts_with("DumpArgs")),
    mut_arg("context", |a| a.conflicts_with("DumpArgs")),
    mut_arg("namespace", |a| a.conflicts_with("DumpArgs")),
    mut_arg("all_namespaces", |a| a.conflicts_with("DumpArgs")),
    mut_arg("kcp", |a| {
        a.help(
            "The KubeadmControlPlane to predict (NAME or NAMESPACE/NAME). Online, default: every \
             one in the namespace (every namespace with -A); none there is an error. Offline: \
             needed when the objects hold several",
        )
    })
)]
#[command(after_help = "\
Plays, for each KubeadmControlPlane, the rollout a change of spec.version would start, step by
step as KCP carries it out (maxSurge 1: create a Machine, its member joins as a learner and is
promoted, then the oldest outdated Machine is deleted and KCP's pre-terminate hook removes its
member; maxSurge 0: delete first), with KCP's remediation and preflight rules and quorumguard's
own answer to every deletion KCP makes. Each control plane gets one line:
  NAMESPACE/NAME  READY: ...                    the rollout finishes, fault tolerance >= 1 throughout
  NAMESPACE/NAME  WOULD STICK at step k/n: ...  step k cannot happen, and why
  NAMESPACE/NAME  UNSAFE at step k/n: ...       it finishes, but after step k one more member
                                                failure loses quorum (or a member is already down)
  NAMESPACE/NAME  CANNOT JUDGE: ...             etcd could not be probed, a member's health is
                                                unknown, or the control plane is being deleted
and under it `next:`, the action that clears it (for READY: how to start the rollout).
--steps prints one control plane's steps: etcd's figures after each, the guard's answer to each
deletion, and what one more failed member right there would lead to.

Online (the default) it reads the management cluster and probes each workload cluster's etcd once,
exactly as `quorumguard status` does (same flags, same permissions: get/list on clusters,
kubeadmcontrolplanes and machines, get on Secrets <cluster>-etcd); it writes nothing. Offline,
with --objects and --member-list (and the other dumps, exactly as `quorumguard check` takes them),
it judges the one control plane the dumps hold; without --endpoint-status and --endpoint-health
every member's health is unknown, and the answer is CANNOT JUDGE.

As a kubectl plugin: put the binary (or a symlink to it) on PATH as `kubectl-quorumguard`, then
run `kubectl quorumguard preflight`.

Exit status: 0 when every control plane is READY (external etcd counts as READY), 1 when any would
stick or is unsafe and every one could be judged, 2 when any could not be judged (CANNOT JUDGE,
said on its line) or on bad input: bad flags, unreadable dumps or dumps of different clusters,
an unusable kubeconfig, an API server that cannot be reached or refuses, an unknown --kcp, or no
KubeadmControlPlane in the namespace (the kubeconfig context's by default, as `status`; every
namespace with -A).")]
pub struct PreflightArgs {
    #[command(flatten)]
    pub select: SelectArgs,
    /// Print the table of steps of the one KubeadmControlPlane selected (with --kcp, or -n when
    /// the namespace has one).
    #[arg(long)]
    pub steps: bool,
    /// Output format: `json` is `{"schema": "quorumguard.io/preflight/v1", "controlPlanes":
    /// [...]}`, each with its steps (--steps changes only the text).
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Text, env = "QUORUMGUARD_OUTPUT")]
    pub output: Format,
    /// The present, for the join and learner grace of new Machines (RFC 3339; default: the
    /// clock). Makes the output reproducible.
    #[arg(long, value_name = "RFC3339", value_parser = super::check::parse_time)]
    pub now: Option<i64>,
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Offline: judge the control plane of these dumps instead of the management cluster's.
    #[command(flatten)]
    pub dumps: Option<DumpArgs>,
    #[command(flatten)]
    pub grace: super::GraceArgs,
}

/// The exit status a set of predictions makes: 2 when any cannot be judged, else 1 when any
/// would stick or is unsafe, else 0 (every one READY; none at all is READY too).
pub fn exit_code<'a>(predictions: impl IntoIterator<Item = &'a Preflight>) -> u8 {
    let mut code = 0;
    for p in predictions {
        match p.readiness {
            Readiness::CannotJudge => return 2,
            Readiness::WouldStick { .. } | Readiness::Unsafe { .. } => code = 1,
            Readiness::Ready => {}
        }
    }
    code
}

/// Runs `preflight`. Errors are bad input or an unusable API server (exit 2).
pub fn run(args: &PreflightArgs) -> anyhow::Result<ExitCode> {
    let now = match args.now {
        Some(n) => n,
        None => super::now_unix()?,
    };
    let policy = args.grace.policy();
    let (report, predictions) = match &args.dumps {
        Some(dumps) => {
            let loaded = dumps.load(args.select.kcp.as_deref())?;
            let offline = quorumguard_engine::Policy {
                offline: true,
                ..policy.clone()
            };
            let p = rollout::preflight(&loaded.control_plane, &offline, now);
            let one = ControlPlanePreflight::new(&loaded.control_plane, &p, None);
            (PreflightReport::new(vec![one], loaded.warnings), vec![p])
        }
        None => super::block_on(online::gather(args, &policy, now))?,
    };
    super::print_report(
        args.output,
        &report.warnings,
        || {
            if args.steps {
                render_steps(&report)
            } else {
                render_fleet(&report)
            }
        },
        &report,
    )?;
    Ok(ExitCode::from(exit_code(&predictions)))
}
