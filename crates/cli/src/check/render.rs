//! The human-readable text of a [`Report`]: its header, member table, quorum line, verdicts
//! and next action, as `check` prints them and `status` reuses.

use super::Report;

/// Sizes as etcd operators read them.
pub(super) fn human_bytes(n: u64) -> String {
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

/// A fault tolerance in a table cell: the number while quorum holds, `lost by N` (N healthy
/// members short of a quorum) otherwise, never a negative number.
pub(crate) fn tolerance_cell(ft: i64) -> String {
    if ft >= 0 {
        ft.to_string()
    } else {
        format!("lost by {}", ft.unsigned_abs())
    }
}

/// A message of several lines under a heading: every line indented by `indent`.
pub(crate) fn indented(message: &str, indent: &str) -> String {
    message.lines().map(|l| format!("{indent}{l}\n")).collect()
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".into())
}

/// The human-readable report: [`render_header`], why etcd's member list is unknown when it is,
/// [`render_members`], [`render_quorum`], the
/// verdicts, [`render_next_action`]. `status` prints the same parts, so both read alike.
pub fn render_text(r: &Report) -> String {
    let mut out = render_header(r);
    // `status` prints its probe's error instead, just above its member table.
    if let Some(why) = &r.etcd_unknown {
        out.push_str(&format!("\netcd: {why}\n"));
    }
    out.push_str(&render_members(r));
    out.push_str(&render_quorum(r, false));
    for v in &r.verdicts {
        out.push_str(&format!(
            "\nWhat if {} (as {}): {} ({})\n{}",
            v.what_if,
            v.requester,
            if v.allowed { "ALLOWED" } else { "DENIED" },
            v.reason,
            indented(&v.message, "  ")
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
        "KubeadmControlPlane {} (Cluster {}): replicas {}, version {}, {} etcd, maxSurge {}, joins: {}{}{}{}{}\n",
        cp.kcp,
        cp.cluster,
        cp.replicas,
        cp.version.as_deref().unwrap_or("-"),
        cp.etcd.to_lowercase(),
        cp.max_surge,
        cp.joins_because,
        if cp.deleting { ", DELETING" } else { "" },
        if cp.cluster_deleting {
            ", Cluster DELETING"
        } else {
            ""
        },
        if cp.paused { ", PAUSED" } else { "" },
        if cp.cluster_paused {
            ", Cluster PAUSED"
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
/// of every member (learners included) leads, and `Member add: ...` (etcd's rule for adding a
/// member, by its version) follows. `Quorum: unknown` without a member list.
pub fn render_quorum(r: &Report, members: bool) -> String {
    let Some(q) = &r.quorum else {
        return "\nQuorum: unknown (no etcd member list)\n".to_string();
    };
    let member_add = match &r.member_add {
        Some(rule) => format!("Member add: {rule}\n"),
        None => String::new(),
    };
    format!(
        "\nQuorum: {}voting {}, healthy {}, quorum {}, {} (unhealthy {}, unknown {}, learners {}){}\n{member_add}",
        if members {
            format!("members {}, ", q.members)
        } else {
            String::new()
        },
        q.voting,
        q.healthy,
        q.quorum,
        quorumguard_engine::quorum::tolerance_words(q.voting, q.healthy, q.unknown),
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
        "\nNext action: {}\n{}",
        r.next_action.code,
        indented(&r.next_action.message, "  ")
    )
}
