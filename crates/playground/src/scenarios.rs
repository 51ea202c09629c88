//! The playground's scripted stories. Each runs against a fresh [`World`], prints a timeline and
//! checks its expectations: the webhook's verdicts (as the API server returned them, with the
//! reason the webhook gave), the conditions quorumguard published in the KCP's status, and the
//! final etcd membership. Nothing in the output is made up: every verdict is an HTTPS call to
//! the running webhook, every condition is read back from the KCP, every membership from etcd.
//!
//! This file holds the list of scenarios and [`run`]; the rest, one file each under
//! `scenarios/`:
//! - `stories.rs`: the stories themselves, step by step.
//! - `steps.rs`: the steps they share: settling, driving the KCP controller, a person's kubectl,
//!   the final membership check.
//! - `wait.rs`: waiting for quorumguard to publish what a step should lead to, as an
//!   expectation.
//! - `show.rs`: what the timeline shows: webhook calls, published conditions, etcd's members.

mod show;
mod steps;
mod stories;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use super::timeline::Timeline;
use super::truth::Truth;
use super::world::{World, WorldError};
use stories::{scale_with_member_down, unsafe_manual_delete, upgrade_stuck};

pub use show::{print_admissions, print_call, show_status, watch};

/// A story the playground can replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scenario {
    pub name: &'static str,
    /// One line for `--list`.
    pub summary: &'static str,
}

/// Every scenario, the default first.
pub const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "upgrade-stuck",
        summary: "cluster-api #2651: a KCP v0.3-style rollout loses leader election between removing an etcd member and deleting its Machine; quorumguard names the way out and the rollout completes",
    },
    Scenario {
        name: "unsafe-manual-delete",
        summary: "one etcd member is frozen (SIGSTOP); a person deleting a healthy Machine is denied and pointed at remediation, which is allowed and converges",
    },
    Scenario {
        name: "scale-with-member-down",
        summary: "scaling 3 -> 5 with one member down is denied; once the member is back it is allowed and KCP scales to 5",
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
