//! `preflight` online: choose the KubeadmControlPlanes, probe their etcd as `status` does (with
//! a progress line on a terminal), and predict each one's rollout.

use std::io::{IsTerminal, Write};

use anyhow::bail;

use super::{ControlPlanePreflight, PreflightArgs, PreflightReport};
use crate::check::Format;
use crate::status::mgmt::Scope;
pub(super) use crate::status::select::select_kcps as select;
use crate::status::select::{scope_of, scope_words, shown};
use crate::status::{connect, probe};
use quorumguard_engine::Policy;
use quorumguard_engine::rollout::{self, Preflight};
use quorumguard_observe::state::Key;

/// Lists, probes and predicts. Errors (exit 2): the API server, an unknown `--kcp`, no
/// KubeadmControlPlane in scope, `--steps` without exactly one control plane.
pub(super) async fn gather(
    args: &PreflightArgs,
    policy: &Policy,
    now: i64,
) -> anyhow::Result<(PreflightReport, Vec<Preflight>)> {
    let (mgmt, context_namespace) = connect(&args.probe).await?;
    let (scope, name) = scope_of(&args.select, context_namespace)?;
    let listed = mgmt.list_all(&scope).await?;
    let selected = select(&listed, name.as_deref(), &scope)?;
    if args.steps && selected.len() != 1 {
        bail!(steps_need_one(&selected, &scope));
    }
    let show_progress =
        args.output == Format::Text && selected.len() > 1 && std::io::stderr().is_terminal();
    let progress: Option<&(dyn Fn(usize, usize) + Sync)> = if show_progress {
        Some(&progress_line)
    } else {
        None
    };
    let probed = probe(&mgmt, listed, &selected, &args.probe, progress).await;
    if show_progress {
        // Clear the progress line before the report.
        eprint!("\r\x1b[2K");
    }
    let mut control_planes = Vec::with_capacity(selected.len());
    let mut predictions = Vec::with_capacity(selected.len());
    for (ns, name) in &selected {
        let cp = probed.control_plane(ns, name)?;
        let p = rollout::preflight(&cp, policy, now);
        let probe = probed.probe_out(&cp, &args.probe);
        control_planes.push(ControlPlanePreflight::new(&cp, &p, Some(probe)));
        predictions.push(p);
    }
    let mut report = PreflightReport::new(control_planes, probed.warnings);
    report.scope = scope_words(&scope);
    Ok((report, predictions))
}

/// `\r`-rewritten on stderr: `probing etcd: 12/40 clusters`. Counted in workload clusters, what
/// is probed (KubeadmControlPlanes without a Cluster, or with external etcd, are not).
fn progress_line(done: usize, of: usize) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\rprobing etcd: {done}/{of} clusters");
    let _ = err.flush();
}

/// The message for `--steps` without exactly one control plane selected.
pub(super) fn steps_need_one(selected: &[Key], scope: &Scope) -> String {
    if selected.is_empty() {
        return format!(
            "--steps shows the steps of one KubeadmControlPlane, and there is none in {}",
            scope_words(scope)
        );
    }
    format!(
        "--steps shows the steps of one KubeadmControlPlane, and {} are selected ({}): choose one \
         with --kcp NAME or --kcp NAMESPACE/NAME",
        selected.len(),
        shown(selected)
    )
}
