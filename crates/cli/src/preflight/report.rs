//! [`PreflightReport`]: what `preflight -o json` prints, one stable schema for the online and
//! the offline run.

use serde::Serialize;

use crate::check::NextActionOut;
use crate::status::ProbeOut;
use quorumguard_engine::ControlPlane;
use quorumguard_engine::rollout::{Counts, OneFailure, Preflight, Readiness, RolloutStep};

/// The schema identifier of [`PreflightReport`].
pub const SCHEMA: &str = "quorumguard.io/preflight/v1";

/// The output of `quorumguard preflight -o json`. Stable like `check`'s and `status`'s: fields
/// are added, never renamed or removed, and `schema` changes if that is ever broken. Every key
/// is always present; unknown values are `null`.
///
/// ```text
/// {
///   "schema": "quorumguard.io/preflight/v1",
///   "controlPlanes": [{                      // sorted by namespace, then KCP name
///     "kcp": "NAMESPACE/NAME", "cluster": "NAME",
///     "readiness": "Ready" | "WouldStick" | "Unsafe" | "CannotJudge",
///     "at": 1 | null, "of": 15 | null,       // WouldStick, Unsafe: step `at` of `of`
///     "reason": "MemberUnhealthy",           // stable code (docs/preflight.md)
///     "why": "...",
///     "summary": "WOULD STICK at step 1/15: ...",   // the text line
///     "total": 15,                           // steps the rollout takes when nothing holds it
///     "start": { "voting": 3, "healthy": 3, "learners": 0, "quorum": 2,
///                "faultTolerance": 1 } | null,      // null: not played (CannotJudge, external)
///     "steps": [{
///       "index": 1, "kind": "create" | "join" | "promote" | "start" | "delete" | "removed",
///       "machine": "NAME", "action": "...",
///       "counts": { ...as "start", after the step... },
///       "webhook": "allowed (ControllerSafe)" | null,   // delete steps: the guard's answer
///       "oneFailure": { "member": "NAME", "quorumKept": true,
///                       "sticksAt": 5 | null, "text": "..." } | null
///     }],
///     "nextAction": { "code": "RemediateMachine", "message": "...",
///                     "command": "..." | null, "target": "..." | null },
///     "probe": { ...as in `status -o json`... } | null   // null offline
///   }],
///   "warnings": ["..."]
/// }
/// ```
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreflightReport {
    pub schema: &'static str,
    /// Where was looked, for the "nothing found" note.
    #[serde(skip)]
    pub scope: String,
    pub control_planes: Vec<ControlPlanePreflight>,
    pub warnings: Vec<String>,
}

impl PreflightReport {
    pub fn new(control_planes: Vec<ControlPlanePreflight>, warnings: Vec<String>) -> Self {
        PreflightReport {
            schema: SCHEMA,
            scope: "the dumps".into(),
            control_planes,
            warnings,
        }
    }
}

/// One control plane's prediction.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlanePreflight {
    pub kcp: String,
    pub cluster: String,
    pub readiness: &'static str,
    pub at: Option<usize>,
    pub of: Option<usize>,
    pub reason: &'static str,
    pub why: String,
    pub summary: String,
    pub total: usize,
    pub start: Option<CountsOut>,
    pub steps: Vec<StepOut>,
    pub next_action: NextActionOut,
    pub probe: Option<ProbeOut>,
}

impl ControlPlanePreflight {
    pub fn new(cp: &ControlPlane, p: &Preflight, probe: Option<ProbeOut>) -> Self {
        let (readiness, at, of) = match p.readiness {
            Readiness::Ready => ("Ready", None, None),
            Readiness::WouldStick { at, of } => ("WouldStick", Some(at), Some(of)),
            Readiness::Unsafe { at, of } => ("Unsafe", Some(at), Some(of)),
            Readiness::CannotJudge => ("CannotJudge", None, None),
        };
        ControlPlanePreflight {
            kcp: cp.kcp_ref(),
            cluster: cp.cluster.name.clone(),
            readiness,
            at,
            of,
            reason: p.reason.as_str(),
            why: p.why.clone(),
            summary: p.summary(),
            total: p.total,
            start: p.start.map(CountsOut::from),
            steps: p.steps.iter().map(StepOut::from).collect(),
            next_action: NextActionOut::from(&p.next_action),
            probe,
        }
    }
}

/// etcd's figures before the first step or after one.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CountsOut {
    pub voting: usize,
    pub healthy: usize,
    pub learners: usize,
    pub quorum: usize,
    pub fault_tolerance: i64,
}

impl From<Counts> for CountsOut {
    fn from(c: Counts) -> Self {
        CountsOut {
            voting: c.voting,
            healthy: c.healthy,
            learners: c.learners,
            quorum: c.quorum,
            fault_tolerance: c.fault_tolerance,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepOut {
    pub index: usize,
    pub kind: &'static str,
    pub machine: String,
    pub action: String,
    pub counts: CountsOut,
    pub webhook: Option<String>,
    pub one_failure: Option<OneFailureOut>,
}

impl From<&RolloutStep> for StepOut {
    fn from(s: &RolloutStep) -> Self {
        StepOut {
            index: s.index,
            kind: s.kind.as_str(),
            machine: s.machine.clone(),
            action: s.action.clone(),
            counts: s.counts.into(),
            webhook: s.webhook.clone(),
            one_failure: s.one_failure.as_ref().map(OneFailureOut::from),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OneFailureOut {
    pub member: String,
    pub quorum_kept: bool,
    pub sticks_at: Option<usize>,
    pub text: String,
}

impl From<&OneFailure> for OneFailureOut {
    fn from(f: &OneFailure) -> Self {
        OneFailureOut {
            member: f.member.clone(),
            quorum_kept: f.quorum_kept,
            sticks_at: f.sticks_at,
            text: f.text.clone(),
        }
    }
}
