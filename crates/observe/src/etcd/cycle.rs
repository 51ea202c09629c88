//! The cycle that owns the sweep loop ([`Cycle::run`]): sweep every cluster once the caches
//! have synced, hand over to what follows a sweep ([`AfterSweep`]: the status enricher's
//! snapshots, metrics and publication), then wait for the interval, a Machine appearing or
//! going, or a wake-up of the follower's own (the status writer's change of leadership);
//! forever.
//!
//! Each replica runs one, so each webhook replica decides on fresh data; what follows a sweep is
//! the caller's (the `quorumguard-status` crate above this one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;

use super::sweep::{Probers, SweepConfig, sweep_once};
use crate::state::ClusterState;

/// Sweeps that a Machine change triggers start at most this often.
pub const MIN_GAP: Duration = Duration::from_secs(1);

/// One round of the cycle, as the follower sees it.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    /// When the round started (its sweep, if any, started then).
    pub started: Instant,
    /// How long the sweep took (zero when it was skipped).
    pub swept: Duration,
    /// Whether every cache had synced: only then was there a sweep. Before that, a KCP seen
    /// before its Cluster would be probed without the Cluster's endpoints annotation (a failed
    /// probe), and one not probed yet would look unprobed: after a restart, publishing then
    /// replaced the truth a KCP showed with the guard's own ignorance for a probe interval.
    pub synced: bool,
}

/// What follows each sweep of a [`Cycle`].
#[allow(async_fn_in_trait)] // used generically inside the workspace, never as `dyn` or Send-bounded
pub trait AfterSweep {
    /// Just before a sweep starts (skipped rounds call nothing).
    fn sweep_starting(&mut self) {}
    /// After each round, swept or not.
    async fn after(&mut self, state: &ClusterState, round: Round);
    /// Resolves when the next round should start at once (before the interval): the default
    /// never does. Called anew for every wait.
    async fn woken(&mut self) {
        std::future::pending::<()>().await
    }
}

/// The sweep loop of one replica.
pub struct Cycle {
    pub client: Client,
    pub state: Arc<ClusterState>,
    pub sweep: SweepConfig,
    /// Shared with the webhook's fresh probes ([`super::fresh`]).
    pub probers: Arc<Probers>,
    /// Told when the first sweep after the caches synced is done (readiness waits for it).
    pub first_sweep: Option<tokio::sync::oneshot::Sender<()>>,
}

/// What ended a wait.
enum Wake {
    Timer,
    Machines,
    Follower,
}

impl Cycle {
    /// Runs for ever: a round, `after`, then the wait.
    pub async fn run<A: AfterSweep>(mut self, mut after: A) {
        loop {
            let started = Instant::now();
            let synced = self.state.all_synced();
            if synced {
                after.sweep_starting();
                sweep_once(&self.client, &self.state, &self.sweep, &self.probers).await;
                if let Some(done) = self.first_sweep.take() {
                    let _ = done.send(());
                }
            }
            let round = Round {
                started,
                swept: started.elapsed(),
                synced,
            };
            after.after(&self.state, round).await;
            let rest = self.sweep.interval.saturating_sub(started.elapsed());
            let woke = tokio::select! {
                _ = tokio::time::sleep(rest) => Wake::Timer,
                _ = self.state.machines_changed().notified() => Wake::Machines,
                _ = after.woken() => Wake::Follower,
            };
            match woke {
                Wake::Timer | Wake::Follower => {}
                // Never later than the timer would have swept: with a probe interval under
                // MIN_GAP, a Machine change (the caches' first sync after a restart among them)
                // used to hold the next sweep back to MIN_GAP.
                Wake::Machines => {
                    let gap = MIN_GAP.min(self.sweep.interval);
                    tokio::time::sleep(gap.saturating_sub(started.elapsed())).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Counts its rounds; wakes the cycle at once while `wake_left` lasts.
    struct Counting {
        rounds: Arc<Mutex<Vec<Round>>>,
        wake_left: usize,
    }

    impl AfterSweep for Counting {
        async fn after(&mut self, _state: &ClusterState, round: Round) {
            self.rounds.lock().expect("lock").push(round);
        }
        async fn woken(&mut self) {
            if self.wake_left == 0 {
                return std::future::pending().await;
            }
            self.wake_left -= 1;
        }
    }

    /// Rounds of a cycle over caches that never sync (no sweep, so no etcd or API server is
    /// asked), with an interval of an hour, in `within`.
    async fn rounds_within(wake_left: usize, within: Duration) -> Vec<Round> {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("uri"));
        let cycle = Cycle {
            client: Client::try_from(config).expect("client"),
            state: Arc::new(ClusterState::new()),
            sweep: SweepConfig {
                interval: Duration::from_secs(3600),
                ..SweepConfig::default()
            },
            probers: Arc::new(Probers::default()),
            first_sweep: None,
        };
        let rounds = Arc::new(Mutex::new(Vec::new()));
        let after = Counting {
            rounds: Arc::clone(&rounds),
            wake_left,
        };
        let _ = tokio::time::timeout(within, cycle.run(after)).await;
        rounds.lock().expect("lock").clone()
    }

    #[tokio::test]
    async fn a_round_follows_each_wake_up_and_waits_for_the_interval_otherwise() {
        let quiet = rounds_within(0, Duration::from_millis(300)).await;
        assert_eq!(quiet.len(), 1, "one round, then the hour's wait: {quiet:?}");
        assert!(!quiet[0].synced, "unsynced caches: no sweep");
        let woken = rounds_within(3, Duration::from_millis(300)).await;
        assert_eq!(
            woken.len(),
            4,
            "the first round and one per wake-up: {woken:?}"
        );
    }
}
