//! One line for a state of the model: what a counterexample prints after each step.

use crate::model::check::Checked;
use crate::model::world::*;

/// One line: etcd, the Machines and replicas, what the guard sees, the published action.
pub fn summary(s: &State) -> String {
    let members: Vec<String> = s
        .members
        .iter()
        .map(|m| {
            let mut w = name(m.slot);
            if m.learner {
                w.push_str(" learner");
            }
            w.push_str(match (m.started, m.up) {
                (false, _) => " not started",
                (true, true) => " up",
                (true, false) => " DOWN",
            });
            if s.leader == Some(m.slot) {
                w.push_str(" (leader)");
            }
            w
        })
        .collect();
    let machines: Vec<String> = s
        .machines
        .iter()
        .map(|m| {
            let mut w = name(m.slot);
            if m.version < s.version {
                w.push_str(" old");
            }
            if !m.node {
                w.push_str(if m.stalled {
                    " join-stopped"
                } else {
                    " joining"
                });
            }
            if m.remediate {
                w.push_str(" remediate");
            }
            if m.deleting {
                w.push_str(" DELETING");
            }
            w
        })
        .collect();
    let seen: Vec<String> = match &s.view {
        None => vec!["none".into()],
        Some(v) => v
            .iter()
            .map(|m| {
                let h = match (s.probe_failed, m.seen) {
                    (true, _) | (false, Seen::Unknown) => "?",
                    (false, Seen::Healthy) => "ok",
                    (false, Seen::Unhealthy) => "down",
                    (false, Seen::Unconfirmed) => "down?",
                };
                format!(
                    "{}{} {h}",
                    name(m.slot),
                    if m.learner { " learner" } else { "" }
                )
            })
            .collect(),
    };
    let mut guard = format!(
        "guard: cache lag {}, probe {}",
        s.cache_lag(),
        seen.join(", ")
    );
    if let Some(r) = s.reserved_replicas {
        guard.push_str(&format!(", reserved replicas {}", r.to));
        if let Some(then) = r.then {
            guard.push_str(&format!(" (until the cache shows {then})"));
        }
    }
    if !s.reserved.is_empty() {
        let r: Vec<String> = s.reserved.iter().map(|r| name(r.machine.slot)).collect();
        guard.push_str(&format!(", reserved deletions {}", r.join(" ")));
    }
    if !s.health_check {
        guard.push_str(", no MachineHealthCheck");
    }
    if let Some(f) = s.autopilot.as_ref().and_then(|b| b.in_flight.as_ref()) {
        guard.push_str(&format!(", autopilot: {} in flight", f.step));
    }
    let (code, target) = Checked::published(s);
    format!(
        "etcd [{}] | Machines [{}], replicas {}{} | {guard} | next action {code}{}",
        members.join(", "),
        machines.join(", "),
        s.replicas,
        if s.max_surge == 0 { ", maxSurge 0" } else { "" },
        target.map(|t| format!(" {t}")).unwrap_or_default()
    )
}
