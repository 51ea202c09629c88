//! The text of a [`PreflightReport`]: one line per control plane and its next action, or the
//! table of one control plane's steps.

use super::{ControlPlanePreflight, CountsOut, PreflightReport};
use crate::check::table;

/// One line per control plane, `NAMESPACE/NAME  <summary>`, names padded to one width, each
/// followed by an indented `next: <next action>`.
pub fn render_fleet(r: &PreflightReport) -> String {
    let width = r
        .control_planes
        .iter()
        .map(|c| c.kcp.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for c in &r.control_planes {
        out.push_str(&format!("{:<width$}  {}\n", c.kcp, c.summary));
        out.push_str(&format!("  next: {}\n", c.next_action.message));
    }
    out
}

/// Each control plane (`preflight --steps` selects one): its line, the table of its steps, a
/// legend, and its next action.
pub fn render_steps(r: &PreflightReport) -> String {
    let mut out = String::new();
    for (i, c) in r.control_planes.iter().enumerate() {
        if i > 0 {
            out.push_str("\n---\n\n");
        }
        out.push_str(&steps_of(c));
    }
    out
}

fn steps_of(c: &ControlPlanePreflight) -> String {
    let mut out = format!(
        "KubeadmControlPlane {} (Cluster {}): {}\n",
        c.kcp, c.cluster, c.summary
    );
    if let Some(p) = &c.probe
        && let Some(e) = &p.error
    {
        out.push_str(&format!(
            "etcd probe: FAILED (transport {}): {e}\n",
            p.transport
        ));
    }
    match c.start {
        None => out.push_str("\nNo steps: the rollout was not played.\n"),
        Some(start) => {
            out.push('\n');
            out.push_str(&steps_table(c, start));
            out.push_str(
                "\nV/H/L: voting, healthy voting and learner members after the step; FT: fault \
                 tolerance (healthy - quorum), 0 = one more failure loses quorum, \"lost by N\" = N healthy \
                 members short of a quorum.\n",
            );
        }
    }
    out.push_str(&format!("\nnext: {}\n", c.next_action.message));
    out
}

fn steps_table(c: &ControlPlanePreflight, start: CountsOut) -> String {
    let figures = |k: &CountsOut| {
        vec![
            format!("{}/{}/{}", k.voting, k.healthy, k.learners),
            k.quorum.to_string(),
            crate::check::tolerance_cell(k.fault_tolerance),
        ]
    };
    let dash = || "-".to_string();
    let mut rows = Vec::with_capacity(c.steps.len() + 2);
    let mut first = vec!["0".to_string(), "(before the rollout)".to_string()];
    first.extend(figures(&start));
    first.extend([dash(), dash()]);
    rows.push(first);
    for s in &c.steps {
        let mut row = vec![s.index.to_string(), s.action.clone()];
        row.extend(figures(&s.counts));
        row.push(s.webhook.clone().unwrap_or_else(dash));
        row.push(s.one_failure.as_ref().map_or_else(
            || "no healthy voting member left to fail".into(),
            |f| f.text.clone(),
        ));
        rows.push(row);
    }
    if c.readiness == "WouldStick"
        && let Some(at) = c.at
    {
        rows.push(vec![
            at.to_string(),
            format!("STICKS: {} (above)", c.reason),
            dash(),
            dash(),
            dash(),
            dash(),
            dash(),
        ]);
    }
    table(
        &[
            "#",
            "ACTION",
            "V/H/L",
            "QUORUM",
            "FT",
            "WEBHOOK",
            "IF ONE MORE MEMBER FAILS HERE",
        ],
        &rows,
    )
}
