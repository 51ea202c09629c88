//! [`Report`]: what `check` and `status` print, as one stable JSON schema, built from a control
//! plane, the what-ifs' verdicts and the next action.

use serde::Serialize;

use super::WhatIf;
use quorumguard_engine::quorum::{Tally, quorum, tolerance};
use quorumguard_engine::remediation;
use quorumguard_engine::{
    ControlPlane, Coverage, EtcdState, EtcdTopology, Figures, Health, HealthChecks, Held, Machine,
    Member, NextAction, Requester, Verdict,
};

/// The output of `quorumguard check -o json`. Stable: fields are added, never renamed or
/// removed, and `schema` changes if that promise is ever broken. Every key is always present;
/// unknown values are `null`.
///
/// ```text
/// {
///   "schema": "quorumguard.io/check/v1",
///   "controlPlane": {
///     "kcp": "NAMESPACE/NAME", "cluster": "NAME", "replicas": 3, "version": "v1.33.1" | null,
///     "etcd": "Stacked" | "External", "maxSurge": 1, "deleting": false, "clusterDeleting": false,
///     "etcdLearnerMode": true | false | null,   // the kubeadm feature gate, where set
///     "joins": "Learner" | "Voting",            // how a new member joins (docs/rules.md)
///     "joinsBecause": "learner (kubeadm v1.32.0)",
///     "paused": false,                  // KCP annotation cluster.x-k8s.io/paused
///     "clusterPaused": false            // the Cluster's spec.paused (clusterctl move sets it)
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
///                  "member": "673ce451ecd2d8e9" | null,
///                  "remediation": {               // what annotating it remediate-machine does
///                    "coveredBy": ["kcp-mhc"] | null,   // MachineHealthChecks targeting it;
///                                                       //  null when they were not read
///                    "reachesKcp": true | false | null, // would KCP be asked to replace it now
///                    "held": null | "NoMachineHealthCheck" | "Paused" | "ShortCircuit"
///                            | "ControlPlanePaused",   // why not (first reason)
///                    "heldBy": "kcp-mhc" | null,        // the MachineHealthCheck that holds it
///                    "wouldCount": { "unhealthy": 2, "expected": 3 } | null,  // ShortCircuit
///                    "countedUnhealthy": false  // HealthCheckSucceeded or OwnerRemediated False
///                  } }],
///   "machinesWithoutMember": ["demo-control-plane-x7k2p"],
///   "quorum": { "members": 3, "voting": 3, "learners": 0, "healthy": 2, "unhealthy": 1,
///               "unknown": 0, "quorum": 2, "faultTolerance": 0, "hasQuorum": true },
///                                      // null when the member list is unknown
///   "machineHealthChecks": {           // the MachineHealthChecks covering its Machines
///     "known": true,                   // false when they were not read
///     "unknown": "the objects dump holds no MachineHealthCheck: ..." | null,   // why not
///     "checks": [{ "name": "kcp-mhc", "paused": false,
///                  "trigger": "unhealthyLessThanOrEqualTo 100%",
///                  "targets": ["demo-control-plane-x7k2p"],   // Machines of this control plane
///                  "lastCounted": { "unhealthy": 1, "expected": 3 } | null,  // its status
///                  "shortCircuited": false | null }],   // by that count; null before one
///     "summary": "MachineHealthCheck demo/kcp-mhc covers 3 of the Machines (...)",
///     "gap": "..." | null              // the summary when a Machine's remediation would not
///   },                                 //  reach KCP (none covers it, paused, short-circuited)
///   "etcdUnknown": "no member list: ..." | null,   // why, and what was seen instead
///   "memberAdd": "etcd 3.4.23 adds a member only while every voting member is connected (...)"
///                | null,              // by the voting members' etcd version; unknown = older rule
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
    /// The MachineHealthChecks that may pass a remediation of its Machines on to KCP.
    pub machine_health_checks: HealthChecksOut,
    /// `None` (null) when the member list is unknown: the live `status` when its probe failed,
    /// `check` when the member list dump holds etcdctl's failure (etcdctl 3.5 fails it without
    /// a leader); figures of an empty list would read as "quorum lost".
    pub quorum: Option<QuorumOut>,
    /// Why the member list is unknown, with what was seen instead; `None` (null) when it is
    /// known.
    pub etcd_unknown: Option<String>,
    /// Which check etcd makes before it adds a member, by the etcd version the voting members
    /// report ([`quorumguard_engine::etcd_version::add_member_rule`]); `None` (null) without a member
    /// list.
    pub member_add: Option<String>,
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
    pub etcd_learner_mode: Option<bool>,
    pub joins: &'static str,
    pub joins_because: String,
    /// Annotated `cluster.x-k8s.io/paused`: KCP reconciles nothing.
    pub paused: bool,
    /// The Cluster's `spec.paused`: KCP, its MachineHealthChecks and the Machine controller
    /// reconcile nothing.
    pub cluster_paused: bool,
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
    pub remediation: RemediationOut,
}

/// What annotating a Machine `cluster.x-k8s.io/remediate-machine` does now
/// ([`quorumguard_engine::remediation::coverage`]).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemediationOut {
    /// The MachineHealthChecks that target it; `None` (null) when they were not read.
    pub covered_by: Option<Vec<String>>,
    /// Whether a MachineHealthCheck would mark it for KCP to replace now, and KCP act on that;
    /// `None` (null) when the MachineHealthChecks were not read.
    pub reaches_kcp: Option<bool>,
    /// Why not: `NoMachineHealthCheck`, `Paused` (the MachineHealthCheck), `ShortCircuit`, or
    /// `ControlPlanePaused` (the Cluster or the KCP).
    pub held: Option<&'static str>,
    /// The MachineHealthCheck that holds it back (`Paused`, `ShortCircuit`).
    pub held_by: Option<String>,
    /// `ShortCircuit`: what it would count with this Machine marked.
    pub would_count: Option<CountsOut>,
    /// A MachineHealthCheck counted it unhealthy at its last reconcile (`HealthCheckSucceeded`
    /// or `OwnerRemediated` False).
    pub counted_unhealthy: bool,
}

#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CountsOut {
    pub unhealthy: u32,
    pub expected: u32,
}

/// The MachineHealthChecks of a control plane, as [`quorumguard_engine::remediation`] reads them.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthChecksOut {
    pub known: bool,
    /// Why they are not known; `None` (null) when they are.
    pub unknown: Option<String>,
    pub checks: Vec<HealthCheckOut>,
    /// [`quorumguard_engine::remediation::summary`]: the line the text output prints.
    pub summary: String,
    /// [`quorumguard_engine::remediation::gap`]: the summary when some Machine's remediation would
    /// not reach KCP; `None` (null) otherwise, and when that is not known.
    pub gap: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckOut {
    pub name: String,
    pub paused: bool,
    pub trigger: String,
    /// The Machines of this control plane it targets.
    pub targets: Vec<String>,
    /// Its `status` count; `None` (null) before its first reconcile.
    pub last_counted: Option<CountsOut>,
    /// Whether that count short-circuits it; `None` (null) before its first count.
    pub short_circuited: Option<bool>,
}

impl HealthChecksOut {
    fn new(cp: &ControlPlane) -> HealthChecksOut {
        let (known, unknown, checks) = match &cp.health_checks {
            HealthChecks::Unknown { reason } => (false, Some(reason.clone()), Vec::new()),
            HealthChecks::Known(v) => (
                true,
                None,
                v.iter()
                    .map(|hc| HealthCheckOut {
                        name: hc.name.clone(),
                        paused: hc.paused,
                        trigger: hc.trigger.to_string(),
                        targets: hc.targets.clone(),
                        last_counted: hc.counts.map(|c| CountsOut {
                            unhealthy: c.unhealthy,
                            expected: c.expected,
                        }),
                        short_circuited: hc
                            .counts
                            .map(|c| !hc.trigger.allows(c.unhealthy, c.expected)),
                    })
                    .collect(),
            ),
        };
        HealthChecksOut {
            known,
            unknown,
            checks,
            summary: remediation::summary(cp),
            gap: remediation::gap(cp),
        }
    }
}

impl RemediationOut {
    fn new(cp: &ControlPlane, m: &Machine) -> RemediationOut {
        let covered_by = match &cp.health_checks {
            HealthChecks::Unknown { .. } => None,
            HealthChecks::Known(v) => Some(
                v.iter()
                    .filter(|hc| hc.targets(m))
                    .map(|hc| hc.name.clone())
                    .collect(),
            ),
        };
        let paused = cp.paused().is_some();
        let (reaches_kcp, held, held_by, would_count) = match remediation::coverage(cp, m) {
            Coverage::Unknown(_) => (None, None, None, None),
            Coverage::None => (Some(false), Some("NoMachineHealthCheck"), None, None),
            Coverage::Blocked(hc, Held::Paused) => {
                (Some(false), Some("Paused"), Some(hc.name.clone()), None)
            }
            Coverage::Blocked(
                hc,
                Held::ShortCircuit {
                    unhealthy,
                    expected,
                },
            ) => (
                Some(false),
                Some("ShortCircuit"),
                Some(hc.name.clone()),
                Some(CountsOut {
                    unhealthy,
                    expected,
                }),
            ),
            Coverage::Remediates(_) if paused => {
                (Some(false), Some("ControlPlanePaused"), None, None)
            }
            Coverage::Remediates(_) => (Some(true), None, None, None),
        };
        RemediationOut {
            covered_by,
            reaches_kcp,
            held,
            held_by,
            would_count,
            counted_unhealthy: m.health_check_failed,
        }
    }
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
    pub(super) fn new(w: &WhatIf, r: &Requester, v: Verdict) -> VerdictOut {
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

impl From<&NextAction> for NextActionOut {
    fn from(next: &NextAction) -> Self {
        NextActionOut {
            code: next.code.as_str(),
            message: next.message.clone(),
            command: next.command.clone(),
            target: next.target.clone(),
        }
    }
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
                remediation: RemediationOut::new(cp, m),
            })
            .collect();
        let without = machines
            .iter()
            .filter(|m| m.member.is_none())
            .map(|m| m.name.clone())
            .collect();
        let etcd_unknown = match &cp.etcd {
            EtcdState::Unknown { reason } => Some(reason.clone()),
            EtcdState::Observed(_) => None,
        };
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
                etcd_learner_mode: cp.kcp.etcd_learner_mode,
                joins: match cp.join_style() {
                    quorumguard_engine::JoinStyle::Learner => "Learner",
                    quorumguard_engine::JoinStyle::Voting => "Voting",
                },
                joins_because: cp.joins().to_string(),
                paused: cp.kcp.paused,
                cluster_paused: cp.cluster.paused,
            },
            members: members_out,
            machines,
            machines_without_member: if etcd_unknown.is_some() {
                Vec::new()
            } else {
                without
            },
            quorum: etcd_unknown.is_none().then(|| QuorumOut {
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
            member_add: etcd_unknown
                .is_none()
                .then(|| quorumguard_engine::etcd_version::add_member_rule(members).describe()),
            machine_health_checks: HealthChecksOut::new(cp),
            etcd_unknown,
            verdicts,
            next_action: NextActionOut::from(next),
            warnings,
        }
    }
}
