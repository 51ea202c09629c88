//! Whether a Machine's remediation can happen: which MachineHealthCheck covers it, and whether
//! that one would pass a remediation on to KCP now.
//!
//! Cluster API v1.14 (`core/reconcilers/machinehealthcheck/`): the MachineHealthCheck
//! reconciler (`reconcile`) takes its targets (`getTargetsFromMHC`: its selector plus its
//! `spec.clusterName`, less Machines annotated paused or skip-remediation), counts the unhealthy
//! ones (`needsRemediation`: a Machine annotated `cluster.x-k8s.io/remediate-machine` is
//! unhealthy at once), and only when `isAllowedRemediation` allows it marks them
//! (`patchUnhealthyTargets`: condition `OwnerRemediated` false). KCP replaces the Machines so
//! marked. A short-circuited MachineHealthCheck marks nothing; a paused one does not reconcile
//! (`paused.EnsurePausedCondition`).

use std::fmt;

use crate::model::{
    ANNOTATION_PAUSED, ANNOTATION_REMEDIATE, ControlPlane, HealthCheck, HealthChecks, Limit,
    Machine, Paused, Trigger,
};

/// Whether remediating a Machine (annotating it `cluster.x-k8s.io/remediate-machine`) leads to
/// KCP replacing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage<'a> {
    /// The MachineHealthChecks were not read: the reason why.
    Unknown(&'a str),
    /// No MachineHealthCheck targets the Machine: the annotation does nothing.
    None,
    /// This MachineHealthCheck targets it and would mark it.
    Remediates(&'a HealthCheck),
    /// Every MachineHealthCheck that targets it holds back; the first and why.
    Blocked(&'a HealthCheck, Held),
}

/// Why a MachineHealthCheck marks nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Annotated `cluster.x-k8s.io/paused`.
    Paused,
    /// Its short-circuit: with the Machine marked it would count `unhealthy` of `expected`
    /// targets unhealthy, which its trigger does not allow.
    ShortCircuit { unhealthy: u32, expected: u32 },
}

impl Limit {
    /// The limit as a number of Machines out of `expected`.
    pub fn of(self, expected: u32) -> u32 {
        match self {
            Limit::Count(n) => n,
            Limit::Percent(p) => {
                u32::try_from(u64::from(p) * u64::from(expected) / 100).unwrap_or(u32::MAX)
            }
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Count(n) => write!(f, "{n}"),
            Limit::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Trigger {
    /// `isAllowedRemediation`: whether `unhealthy` of `expected` targets allow remediation.
    pub fn allows(self, unhealthy: u32, expected: u32) -> bool {
        match self {
            Trigger::AtMost(limit) => unhealthy <= limit.of(expected),
            Trigger::InRange { min, max } => (min..=max).contains(&unhealthy),
        }
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::AtMost(limit) => write!(f, "unhealthyLessThanOrEqualTo {limit}"),
            Trigger::InRange { min, max } => write!(f, "unhealthyInRange [{min}-{max}]"),
        }
    }
}

impl HealthCheck {
    pub fn targets(&self, m: &Machine) -> bool {
        self.targets.contains(&m.name)
    }

    /// What it would count with `m` marked for remediation: its last count, plus `m` unless `m`
    /// is counted already: annotated for remediation, or counted unhealthy at the last
    /// reconcile ([`Machine::health_check_failed`]: `HealthCheckSucceeded` or `OwnerRemediated`
    /// False; its `status.currentHealthy` left it out, so `expectedMachines - currentHealthy`,
    /// what `unhealthyMachineCount` compares, holds it already). Before its first count: its
    /// targets here, and those counted.
    fn counted_with(&self, cp: &ControlPlane, m: &Machine) -> (u32, u32) {
        let marked =
            |x: &Machine| x.health_check_failed || x.annotation(ANNOTATION_REMEDIATE).is_some();
        let extra = u32::from(!marked(m));
        match self.counts {
            Some(c) => (
                c.unhealthy.saturating_add(extra).min(c.expected),
                c.expected,
            ),
            None => {
                let targets = cp.machines.iter().filter(|x| self.targets(x));
                let (n, u) =
                    targets.fold((0u32, 0u32), |(n, u), x| (n + 1, u + u32::from(marked(x))));
                (u.saturating_add(extra).min(n), n)
            }
        }
    }

    fn held(&self, cp: &ControlPlane, m: &Machine) -> Option<Held> {
        if self.paused {
            return Some(Held::Paused);
        }
        let (unhealthy, expected) = self.counted_with(cp, m);
        (!self.trigger.allows(unhealthy, expected)).then_some(Held::ShortCircuit {
            unhealthy,
            expected,
        })
    }
}

/// Whether remediating `m` leads to KCP replacing it.
pub fn coverage<'a>(cp: &'a ControlPlane, m: &Machine) -> Coverage<'a> {
    let checks = match &cp.health_checks {
        HealthChecks::Unknown { reason } => return Coverage::Unknown(reason),
        HealthChecks::Known(c) => c,
    };
    let mut first_held = None;
    for hc in checks.iter().filter(|hc| hc.targets(m)) {
        match hc.held(cp, m) {
            None => return Coverage::Remediates(hc),
            Some(why) => {
                first_held.get_or_insert((hc, why));
            }
        }
    }
    match first_held {
        Some((hc, why)) => Coverage::Blocked(hc, why),
        None => Coverage::None,
    }
}

/// Whether KCP can be remediating `m` now: a MachineHealthCheck passes it on, or that is not
/// known (then the guard assumes it may).
pub fn may_remediate(cp: &ControlPlane, m: &Machine) -> bool {
    matches!(
        coverage(cp, m),
        Coverage::Remediates(_) | Coverage::Unknown(_)
    )
}

/// The sentence that says why remediating `m` does nothing now, and what to do about it (`None`
/// when it would be remediated, or when that is not known).
pub fn missing(cp: &ControlPlane, m: &Machine) -> Option<(String, Option<String>)> {
    let ns = &cp.kcp.namespace;
    match coverage(cp, m) {
        Coverage::Remediates(_) | Coverage::Unknown(_) => None,
        Coverage::None => Some((
            format!(
                "no MachineHealthCheck covers Machine {ns}/{}, so the remediate-machine annotation does nothing: KCP replaces only Machines a MachineHealthCheck marks. Create a MachineHealthCheck whose selector takes the control-plane Machines of Cluster {ns}/{} (e.g. `cluster.x-k8s.io/control-plane: \"\"`; an example that remediates nothing on its own is in docs/runbook.md), then annotate the Machine.",
                m.name, cp.cluster.name
            ),
            None,
        )),
        Coverage::Blocked(hc, Held::Paused) => Some((
            format!(
                "MachineHealthCheck {ns}/{} covers Machine {ns}/{} but is paused (annotation cluster.x-k8s.io/paused), so it marks nothing for KCP to replace: unpause it, then annotate the Machine.",
                hc.name, m.name
            ),
            Some(format!(
                "kubectl annotate machinehealthcheck -n {ns} {} cluster.x-k8s.io/paused-",
                hc.name
            )),
        )),
        Coverage::Blocked(
            hc,
            Held::ShortCircuit {
                unhealthy,
                expected,
            },
        ) => Some((
            format!(
                "MachineHealthCheck {ns}/{} covers Machine {ns}/{} but short-circuits: with it marked, {unhealthy} of its {expected} Machines count as unhealthy, and its {} does not allow remediation then, so it marks nothing for KCP to replace. Change spec.remediation.triggerIf of {} (or bring the other unhealthy Machines back), then annotate the Machine.",
                hc.name, m.name, hc.trigger, hc.name
            ),
            None,
        )),
    }
}

/// One line for the member table: what covers the control plane's Machines.
pub fn summary(cp: &ControlPlane) -> String {
    let ns = &cp.kcp.namespace;
    let checks = match &cp.health_checks {
        HealthChecks::Unknown { reason } => {
            return format!("MachineHealthChecks: not known ({reason})");
        }
        HealthChecks::Known(c) => c,
    };
    let machines: Vec<&Machine> = cp.machines.iter().filter(|m| m.control_plane).collect();
    let uncovered: Vec<&str> = machines
        .iter()
        .filter(|m| !checks.iter().any(|hc| hc.targets(m)))
        .map(|m| m.name.as_str())
        .collect();
    let mut parts: Vec<String> = checks
        .iter()
        .map(|hc| {
            let mut s = format!(
                "MachineHealthCheck {ns}/{} covers {} of the Machines ({})",
                hc.name,
                machines.iter().filter(|m| hc.targets(m)).count(),
                hc.trigger
            );
            if hc.paused {
                s.push_str(", paused");
            }
            if let Some(c) = hc.counts {
                s.push_str(&format!(
                    ", last counted {} of {} unhealthy{}",
                    c.unhealthy,
                    c.expected,
                    if hc.trigger.allows(c.unhealthy, c.expected) {
                        ""
                    } else {
                        ": short-circuited"
                    }
                ));
            }
            s
        })
        .collect();
    if checks.is_empty() {
        parts.push(
            "no MachineHealthCheck covers the Machines: remediate-machine annotations do nothing"
                .to_string(),
        );
    } else if !uncovered.is_empty() {
        parts.push(format!(
            "none covers {}: remediate-machine annotations on them do nothing",
            uncovered.join(", ")
        ));
    }
    if let Some(p) = cp.paused() {
        parts.push(format!(
            "{}: KCP and its MachineHealthChecks act on nothing until it is unpaused",
            paused_words(cp, p)
        ));
    }
    parts.join("; ")
}

/// "Cluster ns/c is paused (spec.paused: true)", or what else pauses the control plane.
pub fn paused_words(cp: &ControlPlane, p: Paused) -> String {
    let ns = &cp.kcp.namespace;
    let cluster = format!(
        "Cluster {ns}/{} is paused (spec.paused: true)",
        cp.cluster.name
    );
    let kcp = format!(
        "KubeadmControlPlane {} carries annotation {ANNOTATION_PAUSED}",
        cp.kcp_shown()
    );
    match p {
        Paused::Cluster => cluster,
        Paused::Kcp => kcp,
        Paused::Both => format!("{cluster} and {kcp}"),
    }
}

/// [`summary`], when it tells of a gap: a control-plane Machine that a remediation would not
/// reach KCP for (no MachineHealthCheck covers it, or the ones that do are paused or
/// short-circuited), or a paused control plane. `None` when every Machine is covered, and when
/// that is not known (the next action's message says so where it matters).
pub fn gap(cp: &ControlPlane) -> Option<String> {
    let blocked = cp.paused().is_some()
        || cp
            .machines
            .iter()
            .filter(|m| m.control_plane && !m.deleting)
            .any(|m| matches!(coverage(cp, m), Coverage::None | Coverage::Blocked(..)));
    blocked.then(|| summary(cp))
}
