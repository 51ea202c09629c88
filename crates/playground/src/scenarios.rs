//! The playground's scripted stories. Each runs against a fresh [`World`], prints a timeline and
//! checks its expectations: the webhook's verdicts (as the API server returned them, with the
//! reason the webhook gave), the conditions quorumguard published in the KCP's status, and the
//! final etcd membership. Nothing in the output is made up: every verdict is an HTTPS call to
//! the running webhook, every condition is read back from the KCP, every membership from etcd.
//!
//! This file holds the list of scenarios, the control plane each starts from, and [`run`]; the
//! rest, one file each under `scenarios/`:
//! - `stories.rs`: the stories themselves, step by step.
//! - `remediate.rs`: `remediate-second`, Cluster API's own remediation of a second Machine that
//!   failed to come up.
//! - `steps.rs`: the steps they share: settling, driving the KCP controller, a person's kubectl,
//!   the final membership check.
//! - `wait.rs`: waiting for quorumguard to publish what a step should lead to, as an
//!   expectation.
//! - `show.rs`: what the timeline shows: webhook calls, published conditions, etcd's members.

mod remediate;
mod show;
mod steps;
mod stories;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use super::timeline::Timeline;
use super::truth::Truth;
use super::world::{NEW_VERSION, OLD_VERSION, World, WorldError, WorldOptions};
use remediate::remediate_second;
use stories::{remediate_without_mhc, scale_with_member_down, unsafe_manual_delete, upgrade_stuck};

pub use show::{print_admissions, print_call, show_status, watch};

/// A story the playground can replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scenario {
    pub name: &'static str,
    /// One line for `--list`.
    pub summary: &'static str,
    /// The control plane it starts from.
    pub start: Seeded,
}

/// The control plane a world is seeded with for a scenario: etcd members (one Machine each),
/// the KCP's `spec.replicas` and the version of the KCP and its Machines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seeded {
    pub members: usize,
    pub replicas: usize,
    pub version: &'static str,
    /// A MachineHealthCheck covers the control plane.
    pub health_check: bool,
}

/// Three healthy members, three Machines, three replicas, at [`OLD_VERSION`].
pub const THREE: Seeded = Seeded {
    members: 3,
    replicas: 3,
    version: OLD_VERSION,
    health_check: true,
};

impl Scenario {
    /// `options` with the world this scenario starts from.
    pub fn options(&self, options: WorldOptions) -> WorldOptions {
        WorldOptions {
            members: self.start.members,
            replicas: Some(self.start.replicas),
            version: self.start.version,
            health_check: self.start.health_check,
            ..options
        }
    }
}

/// Every scenario, the default first.
pub const SCENARIOS: [Scenario; 5] = [
    Scenario {
        name: "upgrade-stuck",
        summary: "cluster-api #2651: a KCP v0.3-style rollout loses leader election between removing an etcd member and deleting its Machine; quorumguard names the way out and the rollout completes",
        start: THREE,
    },
    Scenario {
        name: "unsafe-manual-delete",
        summary: "one etcd member is frozen (SIGSTOP); a person deleting a healthy Machine is denied and pointed at remediation, which is allowed and converges",
        start: THREE,
    },
    Scenario {
        name: "scale-with-member-down",
        summary: "scaling 3 -> 5 with one member down is allowed (v1.31 joins learners, which cannot lose quorum) with a warning that KCP waits for the member; once it is back KCP scales to 5",
        start: THREE,
    },
    Scenario {
        name: "remediate-second",
        summary: "cluster-api's TestReconcileUnhealthyMachinesSequences: the second Machine of a 3-replica v1.32 control plane failed to come up; KCP remediates it (its deletion allowed), then scales up with learner joins to 3 healthy members",
        start: Seeded {
            members: 2,
            replicas: 3,
            version: NEW_VERSION,
            health_check: true,
        },
    },
    Scenario {
        name: "remediate-without-mhc",
        summary: "one etcd member is frozen, and no MachineHealthCheck covers the control plane: the next action says to create one (annotating alone does nothing: KCP remediates only what a MachineHealthCheck marks); once it exists, KCP remediates the Machine",
        start: Seeded {
            health_check: false,
            ..THREE
        },
    },
];

/// The default scenario.
pub const DEFAULT_SCENARIO: &str = "upgrade-stuck";

/// The scenario named `name`.
pub fn find(name: &str) -> Option<Scenario> {
    SCENARIOS.iter().copied().find(|s| s.name == name)
}

/// Runs scenario `name` on `world`, recording expectations in `tl`; the last expectation is
/// that nothing quorumguard published during it was false ([`truth`](super::truth)).
pub async fn run(world: Arc<World>, tl: &Timeline, name: &str) -> Result<(), WorldError> {
    let watcher = watch(Arc::clone(&world), tl.clone());
    let ctl = world.etcd(|e| e.etcdctl_handle()).await?;
    let seeds = {
        let world = Arc::clone(&world);
        move || world.etcd_endpoints()
    };
    let truth = Truth::start(Arc::clone(&world), ctl, seeds);
    if world.api.stand_in().is_none() {
        truth.first_sample(Duration::from_secs(5)).await;
    }
    let result = match name {
        "upgrade-stuck" => upgrade_stuck(&world, tl).await,
        "unsafe-manual-delete" => unsafe_manual_delete(&world, tl).await,
        "scale-with-member-down" => scale_with_member_down(&world, tl).await,
        "remediate-second" => remediate_second(&world, tl).await,
        "remediate-without-mhc" => remediate_without_mhc(&world, tl).await,
        other => Err(WorldError::Other(format!("no scenario named {other:?}"))),
    };
    watcher.abort();
    let lag = truth.lag();
    let verdict = tokio::task::spawn_blocking(move || truth.finish())
        .await
        .map_err(|e| WorldError::Join(e.to_string()))?;
    let mut detail = format!(
        "{} changes, {} etcd samples, {} changes without a sample within {lag:?} before them",
        verdict.changes, verdict.samples, verdict.unjudged
    );
    for f in verdict.false_claims.iter().take(5) {
        detail.push_str("\n  false: ");
        detail.push_str(f);
    }
    tl.check(
        format!(
            "every status published ({} changes) matched etcd's own view within {lag:?} of it",
            verdict.changes
        ),
        verdict.held(),
        detail,
    );
    result
}
