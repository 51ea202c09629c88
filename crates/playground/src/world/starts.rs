//! Starting states: what a test does to the seeded control plane before it starts a rollout,
//! each on the real etcd and through the API; and the control plane as `quorumguard status`
//! sees it (the objects listed into a [`ClusterState`], one [`sweep_once`] probing the real
//! etcd), from which `preflight` predicts.

use std::time::{Duration, Instant};

use super::objects::old_machine;
use super::{KCP, NAMESPACE, SERVE_USER, World, WorldError, kcp_controller};
use crate::apiserver::{cluster_resource, kcp_resource, machine_resource};
use crate::engine::model::{ControlPlane, LABEL_CONTROL_PLANE};
use crate::engine::{Confirmation, EtcdState};
use crate::etcd::{ELECTION_TIMEOUT, EtcdError};
use quorumguard_observe::capi::{parse_cluster, parse_kcp, parse_machine};
use quorumguard_observe::etcd::TransportKind;
use quorumguard_observe::etcd::sweep::{Probers, SweepConfig, sweep_once};
use quorumguard_observe::state::{ClusterState, Kind, Object};

/// A hook of someone else's that holds a Machine's deletion (a backup, say).
pub const FOREIGN_PRE_TERMINATE_HOOK: &str =
    "pre-terminate.delete.hook.machine.cluster.x-k8s.io/backup";

/// How old the Machines a start adds are: younger than the seeded ones (so never KCP's
/// oldest), older than quorumguard's join and learner graces.
const ADDED_AGE_SECS: i64 = 24 * 3600;

/// What is done to the seeded control plane (its members all healthy) before a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Nothing.
    Healthy,
    /// The last seeded member's process is frozen (SIGSTOP).
    MemberFrozen,
    /// The last seeded member's process is killed.
    MemberKilled,
    /// A learner added with `member add --learner` and never started, no Machine for it.
    LeftoverLearner,
    /// A fourth Machine (created a day ago, no node) whose member is a running learner that
    /// nobody promotes: its join stopped.
    LearnerNotPromoted,
    /// A fourth Machine with its node and a healthy voting member, for 3 replicas.
    FourForThree,
    /// A fourth Machine as in [`Start::FourForThree`], held by another pre-terminate hook
    /// ([`FOREIGN_PRE_TERMINATE_HOOK`]) and deleted: it has a deletionTimestamp and stays.
    StuckDeleting,
}

impl World {
    /// Puts the world in `start`. Returns the Machine or member it is about, if any.
    pub async fn apply_start(&self, start: Start) -> Result<Option<String>, WorldError> {
        let last = self
            .machines()
            .iter()
            .map(|m| m.name.clone())
            .max()
            .ok_or_else(|| WorldError::Other("no Machine to start from".into()))?;
        match start {
            Start::Healthy => Ok(None),
            Start::MemberFrozen => {
                self.freeze_member(&last).await?;
                Ok(Some(last))
            }
            Start::MemberKilled => {
                self.kill_member(&last).await?;
                Ok(Some(last))
            }
            Start::LeftoverLearner => {
                self.etcd(|e| e.add_learner("leftover-learner").map(|_| ()))
                    .await??;
                Ok(Some("leftover-learner".into()))
            }
            Start::LearnerNotPromoted => {
                let name = self.new_machine_name();
                self.add_member(&name, false).await?;
                old_machine(&self.api, &name, ADDED_AGE_SECS, false, &[]).await?;
                Ok(Some(name))
            }
            Start::FourForThree => {
                let name = self.new_machine_name();
                self.add_member(&name, true).await?;
                old_machine(&self.api, &name, ADDED_AGE_SECS, true, &[]).await?;
                Ok(Some(name))
            }
            Start::StuckDeleting => {
                let name = self.new_machine_name();
                self.add_member(&name, true).await?;
                let hooks = [FOREIGN_PRE_TERMINATE_HOOK];
                old_machine(&self.api, &name, ADDED_AGE_SECS, true, &hooks).await?;
                self.delete_until_allowed(&name).await?;
                Ok(Some(name))
            }
        }
    }

    /// Adds member `name` as a learner and starts it; with `promote`, promotes it.
    async fn add_member(&self, name: &str, promote: bool) -> Result<(), WorldError> {
        let member = name.to_string();
        self.etcd(move |e| -> Result<(), EtcdError> {
            let i = e.add_learner(&member)?;
            e.start_member(i)?;
            if promote {
                e.promote(i)?;
            }
            Ok(())
        })
        .await??;
        self.refresh_endpoints().await
    }

    /// Deletes Machine `name` as KCP's controller, asking again (at most 20 times, 500 ms
    /// apart) while the webhook refuses: quorumguard may not have probed its new member yet.
    async fn delete_until_allowed(&self, name: &str) -> Result<(), WorldError> {
        let mut last = String::new();
        for _ in 0..20 {
            match self.delete_machine(name, kcp_controller()).await? {
                Ok(()) => return Ok(()),
                Err((code, message)) => last = format!("{code}: {message}"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(WorldError::Other(format!(
            "deleting Machine {NAMESPACE}/{name} was refused: {last}"
        )))
    }

    /// Freezes etcd member `name` (SIGSTOP).
    pub async fn freeze_member(&self, name: &str) -> Result<(), WorldError> {
        self.signal_member(name, EtcdSignal::Freeze).await
    }

    /// Thaws etcd member `name` (SIGCONT).
    pub async fn thaw_member(&self, name: &str) -> Result<(), WorldError> {
        self.signal_member(name, EtcdSignal::Thaw).await
    }

    /// Kills etcd member `name`'s process.
    pub async fn kill_member(&self, name: &str) -> Result<(), WorldError> {
        self.signal_member(name, EtcdSignal::Kill).await
    }

    async fn signal_member(&self, name: &str, signal: EtcdSignal) -> Result<(), WorldError> {
        let member = name.to_string();
        self.etcd(move |e| {
            let i = e.index_of(&member).ok_or(EtcdError::NoSuchMember(member))?;
            match signal {
                EtcdSignal::Freeze => e.freeze(i),
                EtcdSignal::Thaw => e.thaw(i),
                EtcdSignal::Kill => {
                    e.kill(i);
                    Ok(())
                }
            }
        })
        .await?
        .map_err(WorldError::Etcd)
    }

    /// The KCP's control plane as `quorumguard status` sees it: the Cluster, the KCP and its
    /// control-plane Machines listed into a fresh [`ClusterState`] (converted as the watch
    /// converts them), and one [`sweep_once`] over the real etcd (direct transport, the world's
    /// probe deadline, etcd's election timeout for confirming), bounded in time.
    pub async fn control_plane_as_status_sees_it(&self) -> Result<ControlPlane, WorldError> {
        let state = ClusterState::new();
        for kind in Kind::ALL {
            state.relist_start(kind);
        }
        let unreadable = |what: &str, e: String| WorldError::Other(format!("{what}: {e}"));
        for v in self.api.list(&cluster_resource()) {
            let c = parse_cluster(&v).map_err(|e| unreadable("a Cluster", e.to_string()))?;
            state.apply(Object::Cluster(c));
        }
        for v in self.api.list(&kcp_resource()) {
            let k = parse_kcp(&v).map_err(|e| unreadable("a KCP", e.to_string()))?;
            state.apply(Object::Kcp(k));
        }
        let machines = self.api.list(&machine_resource());
        let control_plane = machines
            .iter()
            .filter(|m| !m["metadata"]["labels"][LABEL_CONTROL_PLANE].is_null());
        for v in control_plane {
            let m = parse_machine(v).map_err(|e| unreadable("a Machine", e.to_string()))?;
            state.apply(Object::Machine(m));
        }
        for kind in Kind::ALL {
            state.relist_done(kind);
        }
        let cfg = SweepConfig {
            deadline: self.probe_deadline,
            concurrency: 1,
            transport: TransportKind::Direct,
            confirmation: Confirmation {
                election_timeout: ELECTION_TIMEOUT,
            },
            ..SweepConfig::default()
        };
        let client = self.client_as(SERVE_USER)?;
        let bound = self.probe_deadline * 8 + Duration::from_secs(10);
        tokio::time::timeout(
            bound,
            sweep_once(&client, &state, &cfg, &Probers::default()),
        )
        .await
        .map_err(|_| WorldError::Other(format!("the etcd probe did not end within {bound:?}")))?;
        let cp = state
            .control_plane(NAMESPACE, KCP, Instant::now())
            .map_err(|e| WorldError::Other(format!("KubeadmControlPlane {KCP}: {e:?}")))?;
        if let EtcdState::Unknown { reason } = &cp.etcd {
            tracing::warn!(%reason, "the status probe could not read etcd");
        }
        Ok(cp)
    }
}

#[derive(Clone, Copy, Debug)]
enum EtcdSignal {
    Freeze,
    Thaw,
    Kill,
}
