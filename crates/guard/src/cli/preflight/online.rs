//! `preflight` online: choose the KubeadmControlPlanes, probe their etcd as `status` does (with
//! a progress line on a terminal), and predict each one's rollout.

use std::io::{IsTerminal, Write};

use anyhow::bail;

use super::{ControlPlanePreflight, PreflightArgs, PreflightReport};
use crate::cli::check::Format;
use crate::cli::status::mgmt::{Listed, Scope};
use crate::cli::status::{connect, probe};
use crate::engine::Policy;
use crate::engine::rollout::{self, Preflight};
use crate::state::Key;

/// Lists, probes and predicts. Errors (exit 2): the API server, an unknown `--kcp`, `--steps`
/// without exactly one control plane.
pub(super) async fn gather(
    args: &PreflightArgs,
    policy: &Policy,
    now: i64,
) -> anyhow::Result<(PreflightReport, Vec<Preflight>)> {
    let (mgmt, _) = connect(&args.probe).await?;
    let (namespace, name) = match args.kcp.as_deref().and_then(|k| k.split_once('/')) {
        Some((ns, name)) => (Some(ns.to_string()), Some(name.to_string())),
        None => (args.namespace.clone(), args.kcp.clone()),
    };
    if let (Some(a), Some(b)) = (&args.namespace, &namespace)
        && a != b
    {
        bail!(
            "--kcp {} names namespace {b}, -n says {a}",
            args.kcp.as_deref().unwrap_or("")
        );
    }
    let scope = match &namespace {
        Some(ns) => Scope::Namespace(ns.clone()),
        None => Scope::All,
    };
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

fn scope_words(scope: &Scope) -> String {
    match scope {
        Scope::Namespace(ns) => format!("namespace {ns}"),
        Scope::All => "any namespace".into(),
    }
}

/// The KubeadmControlPlanes in scope named `name` (all of them without a name), sorted.
pub(super) fn select(
    listed: &Listed,
    name: Option<&str>,
    scope: &Scope,
) -> anyhow::Result<Vec<Key>> {
    let mut all: Vec<Key> = listed
        .kcps
        .iter()
        .map(|k| (k.object.namespace.clone(), k.object.name.clone()))
        .collect();
    all.sort();
    let Some(name) = name else {
        return Ok(all);
    };
    let chosen: Vec<Key> = all.iter().filter(|(_, n)| n == name).cloned().collect();
    if chosen.is_empty() {
        let there = if all.is_empty() {
            "there are none".to_string()
        } else {
            format!("there are: {}", shown(&all))
        };
        bail!(
            "no KubeadmControlPlane {name:?} in {}; {there}",
            scope_words(scope)
        );
    }
    Ok(chosen)
}

/// `ns/name, ns/name, ...`, at most 20, then how many more.
fn shown(keys: &[Key]) -> String {
    const SHOWN: usize = 20;
    let mut s: Vec<String> = keys
        .iter()
        .take(SHOWN)
        .map(|(ns, n)| format!("{ns}/{n}"))
        .collect();
    if keys.len() > SHOWN {
        s.push(format!("and {} more", keys.len() - SHOWN));
    }
    s.join(", ")
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
