//! One KCP as one enricher cycle sees it ([`Snapshot`]): its control plane built once from the
//! caches and the latest probe, its next action worked out once, and its rollout prediction
//! made once from them; the rollout metric, the fingerprint and the conditions are all read
//! from it ([`snapshots`]).

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::fingerprint::fingerprint;
use crate::conditions::conditions_given;
use crate::metrics::RolloutFigures;
use quorumguard_engine::rollout::readiness_given;
use quorumguard_engine::{ControlPlane, NextAction, Policy, next_action};
use quorumguard_observe::state::{ClusterState, Key};

/// One KCP after a sweep, as the status writer and the metrics use it.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Namespace and name of the KCP.
    pub key: Key,
    /// The control plane as the caches and the latest probe show it.
    pub cp: ControlPlane,
    /// `next_action(cp, policy, now_unix)`.
    pub next: NextAction,
    /// The rollout prediction ([`readiness_given`]) for `quorumguard_rollout_ready`.
    pub rollout: RolloutFigures,
    /// `metadata.generation` of the KCP as cached.
    pub generation: Option<i64>,
    /// The error of the latest probe of its cluster, if it failed.
    pub probe_error: Option<String>,
    /// The present the next action and the prediction were worked out for.
    pub now_unix: i64,
}

impl Snapshot {
    /// KCP `key` as the caches show it at `now` (`now_unix`): `None` while the caches have not
    /// synced, when the KCP is gone, or while its cluster awaits its first probe (not probed yet
    /// is no failure: nothing is published or predicted for it).
    pub fn take(
        state: &ClusterState,
        policy: &Policy,
        now: Instant,
        now_unix: i64,
        key: Key,
    ) -> Option<Snapshot> {
        let (ns, kcp) = (&key.0, &key.1);
        if state.awaits_first_probe(ns, kcp) {
            return None;
        }
        let cp = state.control_plane(ns, kcp, now).ok()?;
        let next = next_action(&cp, policy, now_unix);
        let predicted = readiness_given(&cp, &next, policy, now_unix);
        let rollout = RolloutFigures::of(ns.clone(), kcp.clone(), &predicted);
        let probe_error = state.probe_error(ns, &cp.cluster.name);
        let generation = state.kcp_generation(ns, kcp);
        Some(Snapshot {
            key,
            cp,
            next,
            rollout,
            generation,
            probe_error,
            now_unix,
        })
    }

    /// The two conditions to publish.
    pub fn conditions(&self, policy: &Policy) -> [Condition; 2] {
        conditions_given(
            &self.cp,
            &self.next,
            policy,
            self.now_unix,
            self.generation,
            self.probe_error.as_deref(),
        )
    }

    /// The fingerprint the writer compares to skip reads and writes.
    pub fn fingerprint(&self, policy: &Policy) -> u64 {
        fingerprint(
            &self.cp,
            &self.next,
            policy,
            self.generation,
            self.probe_error.as_deref(),
            self.now_unix,
        )
    }
}

/// The snapshot of every KCP in the caches that has one ([`Snapshot::take`]), in the order of
/// their keys.
pub fn snapshots(state: &ClusterState, policy: &Policy, now_unix: i64) -> Vec<Snapshot> {
    let now = Instant::now();
    state
        .kcps()
        .into_iter()
        .filter_map(|key| Snapshot::take(state, policy, now, now_unix, key))
        .collect()
}

/// KCPs snapshotted between two yields of the enricher's runtime.
const SNAPSHOTS_PER_YIELD: usize = 32;

/// [`snapshots`], handing the enricher's runtime back every [`SNAPSHOTS_PER_YIELD`] KCPs. That
/// single-threaded runtime also drives the kept etcd connections, which the webhook's fresh
/// probes share: predicting the rollouts of 1,000 KCPs in one go (tenths of a second) would
/// hold up a review waiting for a fresh probe.
pub(super) async fn snapshots_yielding(
    state: &ClusterState,
    policy: &Policy,
    now_unix: i64,
) -> Vec<Snapshot> {
    let now = Instant::now();
    let mut out = Vec::new();
    for chunk in state.kcps().chunks(SNAPSHOTS_PER_YIELD) {
        out.extend(
            chunk
                .iter()
                .cloned()
                .filter_map(|key| Snapshot::take(state, policy, now, now_unix, key)),
        );
        tokio::task::yield_now().await;
    }
    out
}

/// The rollout prediction ([`readiness_given`]: `preflight` without its one-more-failure
/// column) of every KCP that has a snapshot, as of `now_unix`. A KCP whose cluster has not been
/// probed yet is left out, as the status writer leaves it (not probed yet is no failure); one
/// whose latest probe failed is `cannot_judge`.
pub fn rollouts(state: &ClusterState, policy: &Policy, now_unix: i64) -> Vec<RolloutFigures> {
    snapshots(state, policy, now_unix)
        .into_iter()
        .map(|s| s.rollout)
        .collect()
}
