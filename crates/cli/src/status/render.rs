//! The human-readable text of a [`StatusReport`]: a summary table when there are several
//! control planes, then each as `check` prints it, with its probe and etcd condition.

use super::{ControlPlaneStatus, ProbeResult, StatusReport};
use crate::check;
use quorumguard_status::conditions;

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
                fig(|q| check::tolerance_cell(q.fault_tolerance)),
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

/// Where the probe's time went, each part to what took it: "member list read in 12 ms, then the
/// members in parallel, slowest m3 in 2001 ms (2013 ms in all)".
fn timing(p: &super::ProbeOut) -> String {
    let mut out = match p.member_list_ms {
        Some(ms) => format!("member list read in {ms} ms"),
        None => "member list read".to_string(),
    };
    if let (Some(name), Some(ms)) = (&p.slowest_member, p.slowest_member_ms) {
        out.push_str(&format!(
            ", then the members in parallel, slowest {name} in {ms} ms"
        ));
    }
    if let Some(ms) = p.took_ms {
        out.push_str(&format!(" ({ms} ms in all)"));
    }
    out
}

fn render_one(c: &ControlPlaneStatus) -> String {
    let r = &c.report;
    let mut out = check::render_header(r);
    out.push_str(&match c.probe.result {
        ProbeResult::Observed => format!(
            "etcd probe: {} (transport {})\n",
            timing(&c.probe),
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
