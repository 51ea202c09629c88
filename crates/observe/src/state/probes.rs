//! The etcd side of the state: the latest probe of each workload cluster, why the latest failed,
//! how long it took, and what the probes have established.

use std::time::{Duration, Instant};

use super::{ClusterState, Key};
use quorumguard_engine::{Confirmation, EtcdSnapshot, EtcdState, Member};

/// The latest etcd probe of one workload cluster.
#[derive(Clone, Debug)]
pub struct HealthEntry {
    pub members: Vec<Member>,
    pub taken: Instant,
    /// `taken` as Unix seconds, for messages that name the time of the last successful probe.
    pub taken_unix: i64,
}

/// Where the time of one probe went: the member list first, then every member asked in
/// parallel (see `crate::etcd::prober`), so the slowest member accounts for the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeTiming {
    pub member_list: Duration,
    /// The member whose status and health took longest, and how long.
    pub slowest_member: Option<(String, Duration)>,
}

/// When this state was made: beliefs are judged at times measured from it.
pub(super) struct Origin(Instant);

impl Default for Origin {
    fn default() -> Self {
        Origin(Instant::now())
    }
}

impl ClusterState {
    /// Records a probe of the etcd of Cluster `namespace/name` as it is: every finding believed.
    /// The sweep records through [`ClusterState::observe_probe`] instead.
    pub fn set_health(&self, namespace: &str, cluster: &str, members: Vec<Member>, taken: Instant) {
        let key = (namespace.to_string(), cluster.to_string());
        let ago = i64::try_from(Instant::now().saturating_duration_since(taken).as_secs())
            .unwrap_or(i64::MAX);
        let taken_unix = crate::unix_now().saturating_sub(ago);
        self.probe_errors
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        self.health
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                key,
                HealthEntry {
                    members,
                    taken,
                    taken_unix,
                },
            );
    }

    /// Records a probe of the etcd of Cluster `namespace/name` as far as it is believed (see
    /// [`quorumguard_engine::confirm`]): findings for the worse that no earlier probe confirms are
    /// recorded as unconfirmed, and a changed member list only once a second probe lists it
    /// too. Returns when to probe again to confirm what is pending, if anything is.
    pub fn observe_probe(
        &self,
        namespace: &str,
        cluster: &str,
        members: Vec<Member>,
        taken: Instant,
        confirmation: &Confirmation,
    ) -> Option<Duration> {
        let key = (namespace.to_string(), cluster.to_string());
        let at = taken.saturating_duration_since(self.origin.0);
        // The sweep's probes and the webhook's fresh ones (crate::etcd::fresh) both land here,
        // and either may finish after a later one: a probe older than the record is dropped.
        // Judged against the record in place (the health lock is read while the belief is
        // judged, and released before the record is written).
        let judged = {
            let mut beliefs = self.beliefs.lock().unwrap_or_else(|e| e.into_inner());
            let health = self.health.read().unwrap_or_else(|e| e.into_inner());
            let record = health.get(&key);
            if record.is_some_and(|h| h.taken > taken) {
                return None;
            }
            beliefs.entry(key).or_default().judge_against(
                members,
                record.map(|h| h.members.as_slice()),
                at,
                confirmation,
            )
        };
        if let Some(members) = judged.members {
            self.set_health(namespace, cluster, members, taken);
        }
        judged.recheck_in
    }

    /// The members recorded for Cluster `namespace/name` from its latest successful probe, as
    /// far as they are believed (empty before the first): what a fresh probe is judged
    /// against ([`quorumguard_engine::fresh_view`]).
    pub fn recorded_members(&self, namespace: &str, cluster: &str) -> Vec<Member> {
        self.health
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_string(), cluster.to_string()))
            .map(|h| super::copy_out(&h.members))
            .unwrap_or_default()
    }

    /// Forgets what the probes of clusters not in `keep` established (they are not probed any
    /// more).
    pub fn retain_beliefs(&self, keep: &std::collections::HashSet<Key>) {
        self.beliefs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| keep.contains(k));
    }

    /// Records that a probe of Cluster `namespace/name` failed. The last good snapshot stays for
    /// its member list, but from now until a probe succeeds its health counts as unknown (see
    /// [`ClusterState::control_plane`]): etcd may have changed since, unseen.
    pub fn set_probe_error(&self, namespace: &str, cluster: &str, error: String) {
        self.probe_errors
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert((namespace.to_string(), cluster.to_string()), error);
    }

    /// Records how long the latest probe of Cluster `namespace/name` took (for the metrics).
    pub fn set_probe_duration(&self, namespace: &str, cluster: &str, took: Duration) {
        self.probe_took
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert((namespace.to_string(), cluster.to_string()), took);
    }

    /// Records where the time of the latest probe of Cluster `namespace/name` went (for
    /// `status`).
    pub fn set_probe_timing(&self, namespace: &str, cluster: &str, timing: ProbeTiming) {
        self.probe_timing
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert((namespace.to_string(), cluster.to_string()), timing);
    }

    /// Where the time of the latest probe of Cluster `namespace/name` went.
    pub fn probe_timing(&self, namespace: &str, cluster: &str) -> Option<ProbeTiming> {
        self.probe_timing
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_string(), cluster.to_string()))
            .cloned()
    }

    /// How long the latest probe of Cluster `namespace/name` took.
    pub fn probe_duration(&self, namespace: &str, cluster: &str) -> Option<Duration> {
        self.probe_took
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_string(), cluster.to_string()))
            .copied()
    }

    /// Why the latest probe of Cluster `namespace/name` failed, if it did, with the time of the
    /// last successful probe when there was one: whoever reads the last observed members must
    /// be able to tell how old they are.
    pub fn probe_error(&self, namespace: &str, cluster: &str) -> Option<String> {
        let key = (namespace.to_string(), cluster.to_string());
        let error = self
            .probe_errors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned()?;
        let last = self
            .health
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .map(|h| h.taken_unix);
        Some(
            match last.and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t).ok()) {
                Some(t) => format!("{error} (last successful probe at {t})"),
                None => error,
            },
        )
    }

    /// Whether KCP `namespace/name` has stacked etcd in a known Cluster that this replica has
    /// not probed yet (neither a snapshot nor an error recorded). Its etcd state reads "no etcd
    /// probe of this cluster yet", which is no failure: it only means the KCP reached the caches
    /// after the sweep in progress took its targets (at startup, or a new cluster), and the status
    /// writer waits for the next sweep rather than publish ProbeFailed.
    pub fn awaits_first_probe(&self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        let cluster = {
            let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
            let Some(k) = idx.kcps.get(&key) else {
                return false;
            };
            if k.kcp.etcd != quorumguard_engine::EtcdTopology::Stacked {
                return false;
            }
            match idx.cluster_of(&key, k) {
                Some(c) => (namespace.to_string(), c),
                None => return false,
            }
        };
        let probed = self
            .health
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&cluster)
            || self
                .probe_errors
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&cluster);
        !probed
    }

    /// The workload clusters to probe that have been probed neither successfully nor with a
    /// recorded failure, as `(namespace, cluster)`.
    pub fn unprobed_clusters(&self) -> Vec<Key> {
        let targets = self.probe_targets();
        let health = self.health.read().unwrap_or_else(|e| e.into_inner());
        let errors = self.probe_errors.read().unwrap_or_else(|e| e.into_inner());
        targets
            .into_iter()
            .map(|t| (t.namespace, t.cluster))
            .filter(|k| !health.contains_key(k) && !errors.contains_key(k))
            .collect()
    }

    /// etcd of cluster `key` (namespace, name) as the record has it at `now`.
    pub(super) fn etcd_state(&self, key: &Key, now: Instant) -> EtcdState {
        let failed = self
            .probe_errors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned();
        if let Some(h) = self
            .health
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            // The latest probe failed: the members are the last ones seen, but nothing is known
            // of their health now. Decisions and next actions must not take the last
            // snapshot's health (or alarms, or leader) as current until a probe succeeds, except
            // bad news: a member confirmed unhealthy stays so until a probe sees it healthy.
            let members = if failed.is_some() {
                quorumguard_engine::failed_view(&h.members)
            } else {
                super::copy_out(&h.members)
            };
            return EtcdState::Observed(EtcdSnapshot {
                members,
                age: Some(now.saturating_duration_since(h.taken)),
            });
        }
        let reason = failed.unwrap_or_else(|| "no etcd probe of this cluster yet".to_string());
        EtcdState::Unknown { reason }
    }
}
