//! A simulated KubeadmControlPlane controller (with the bit of the Machine controller it needs),
//! acting on the playground's real etcd and, through the API-server stand-in, on its Machines.
//! It is not KCP: it follows KCP's algorithm closely enough to replay the stories quorumguard
//! exists for, one action per [`KcpController::step`], so the timeline shows each.
//!
//! Every Machine deletion it makes goes through the API server and so through quorumguard's
//! webhook, as the real controller's do; a denial leaves it blocked, as a real requeue would.
//!
//! Two styles:
//! - [`Style::V03`], KCP v0.3 (2020, cluster-api #2651): scale up with a voting member
//!   (`kubeadm join` before learner mode), then scale down by removing the old etcd member
//!   *first* and deleting its Machine after. [`KcpController::crash_after_member_removal`]
//!   loses leader election between the two, as in the issue.
//! - [`Style::Current`]: KCP of today, its decisions taken by the engine's own model of KCP
//!   ([`crate::engine::kcp::reconcile`], the step function `quorumguard preflight` plays a
//!   rollout with), fed from what is real: etcd's member list from the real etcd, each member's
//!   health from its process (frozen, stopped or never started: unhealthy), the Machines from
//!   the API server. One action per step, so a test can act between any two (`kcp/current.rs`):
//!   a deletion finishes (KCP's pre-terminate hook removes the member when KCP's check allows
//!   it), a new Machine's node joins (its member added as a learner and started; then promoted
//!   and the node set), or KCP reconciles (remediation, create a Machine, delete one through
//!   the webhook).
//!
//! What it does not do: drain nodes, wait for kubelets, version skew rules, KCP's status; its
//! health check asks the playground's process state (frozen or stopped members) instead of
//! probing etcd as KCP does.

mod current;

use std::sync::Arc;

use serde_json::json;

use super::engine::rollout::{ReadyReason, StepKind};
use super::etcd::EtcdError;
use super::timeline::Timeline;
use super::world::{
    KCP_PRE_TERMINATE_HOOK, MACHINE_CONTROLLER, MachineView, NAMESPACE, World, WorldError,
    kcp_controller,
};

/// The annotation a person sets to ask KCP to replace a Machine.
pub const REMEDIATE_ANNOTATION: &str = "cluster.x-k8s.io/remediate-machine";

/// Which KCP to imitate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    V03,
    Current,
}

/// What one step did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Did this.
    Acted(String),
    /// Cannot go on now, for this reason; a later step may.
    Blocked(String),
    /// Lost leader election after doing this: the controller has stopped.
    Crashed(String),
    /// Machines match the spec and every one is up to date.
    Converged,
}

/// The simulated controller.
pub struct KcpController {
    world: Arc<World>,
    timeline: Timeline,
    style: Style,
    /// Lose leader election right after the next etcd member removal (cluster-api #2651).
    pub crash_after_member_removal: bool,
    /// Read quorumguard's `NextAction` condition and carry out a `DeleteMachine` it names: what
    /// the restarted controller does in the `upgrade-stuck` story instead of staying stuck.
    pub follow_next_action: bool,
    /// Machine deletions the webhook refused.
    pub denials: Vec<String>,
    /// [`Style::Current`]: the Machines this controller created whose node is joining (their
    /// `kubeadm join` runs). A Machine without a node that is not here joins no further.
    joining: Vec<String>,
    /// [`Style::Current`]: every action carried out, with the Machine it was about.
    pub actions: Vec<(StepKind, String)>,
    /// [`Style::Current`]: why the last step was [`Step::Blocked`], as `preflight` names it.
    pub blocked: Option<(ReadyReason, String)>,
    /// Print the webhook calls of this controller's own deletions (a story's timeline); off
    /// where something else prints every call already (`--keep`).
    pub print_calls: bool,
}

impl KcpController {
    pub fn new(world: Arc<World>, timeline: Timeline, style: Style) -> Self {
        KcpController {
            world,
            timeline,
            style,
            crash_after_member_removal: false,
            follow_next_action: false,
            denials: Vec::new(),
            joining: Vec::new(),
            actions: Vec::new(),
            blocked: None,
            print_calls: true,
        }
    }

    /// One reconcile action.
    pub async fn step(&mut self) -> Result<Step, WorldError> {
        match self.style {
            Style::V03 => self.step_v03().await,
            Style::Current => self.step_current().await,
        }
    }

    /// The Machine quorumguard's `NextAction` condition says to delete, when following it.
    fn next_action_target(&self, machines: &[MachineView]) -> Option<String> {
        if !self.follow_next_action {
            return None;
        }
        let c = self.world.conditions();
        let target = c.action_target()?;
        (c.action() == "DeleteMachine" && machines.iter().any(|m| m.name == target))
            .then_some(target)
    }

    /// One reconcile action of KCP v0.3.
    async fn step_v03(&mut self) -> Result<Step, WorldError> {
        let machines = self.world.machines();
        // The Machine controller finishes deletions first: KCP waits for them.
        if let Some(m) = machines.iter().find(|m| m.deleting) {
            return self.finish_deletion(m).await;
        }
        if let Some(target) = self.next_action_target(&machines) {
            return self
                .delete(&target, "quorumguard's NextAction is DeleteMachine for it")
                .await;
        }
        // Only what a MachineHealthCheck marked: the annotation alone does nothing.
        if let Some(m) = machines
            .iter()
            .find(|m| m.has_annotation(REMEDIATE_ANNOTATION) && m.remediable)
        {
            let name = m.name.clone();
            return self
                .delete(&name, "remediation: it is annotated remediate-machine")
                .await;
        }
        let down = self.unhealthy_members().await?;
        if !down.is_empty() {
            return Ok(Step::Blocked(format!(
                "etcd member(s) {} not healthy: KCP's preflight checks hold every change",
                down.join(", ")
            )));
        }
        let (replicas, version) = self.world.kcp_spec();
        let outdated: Vec<&MachineView> =
            machines.iter().filter(|m| m.version != version).collect();
        let count = machines.len() as u64;
        if count < replicas || (count == replicas && !outdated.is_empty()) {
            return self.scale_up(&version).await;
        }
        if count > replicas {
            let victim = outdated.first().copied().or(machines.first());
            if let Some(victim) = victim {
                let victim = victim.name.clone();
                return self.scale_down(&victim).await;
            }
        }
        Ok(Step::Converged)
    }

    /// Members listed in etcd whose process is frozen or stopped, or that never started.
    async fn unhealthy_members(&self) -> Result<Vec<String>, WorldError> {
        self.world
            .etcd(|e| -> Result<Vec<String>, EtcdError> {
                let mut down = Vec::new();
                for m in e.member_list()? {
                    match e.index_of(&m.name) {
                        Some(i) if e.is_running(i) && !e.is_frozen(i) => {}
                        _ if m.name.is_empty() => down.push(format!("{:x} (not started)", m.id)),
                        _ => down.push(m.name),
                    }
                }
                Ok(down)
            })
            .await?
            .map_err(WorldError::Etcd)
    }

    async fn scale_up(&mut self, version: &str) -> Result<Step, WorldError> {
        let name = self.world.new_machine_name();
        self.world.create_machine(&name, version).await?;
        self.timeline.event(
            "kcp",
            &format!("scale up: created Machine {name} ({version}); its node joins etcd"),
        );
        let member = name.clone();
        let _progress = self
            .timeline
            .progress(&format!("etcd member {name} joining"));
        // KCP v0.3 joins with a voting member (kubeadm before learner mode).
        self.world
            .etcd(move |e| -> Result<(), EtcdError> {
                let i = e.add_member(&member)?;
                e.start_member(i)
            })
            .await??;
        self.world.refresh_endpoints().await?;
        self.world.set_node(&name).await?;
        Ok(Step::Acted(format!(
            "etcd member {name} joined (voting); Machine {name} has its node"
        )))
    }

    async fn scale_down(&mut self, victim: &str) -> Result<Step, WorldError> {
        // KCP v0.3: the member first, then the Machine.
        self.remove_member(victim).await?;
        self.timeline.event(
            "kcp",
            &format!("scale down: removed etcd member {victim} (its etcd process stops)"),
        );
        if self.crash_after_member_removal {
            self.crash_after_member_removal = false;
            return Ok(Step::Crashed(format!(
                "lost leader election before deleting Machine {NAMESPACE}/{victim}: the controller stops"
            )));
        }
        self.delete(victim, "scale down: its etcd member is gone")
            .await
    }

    /// Removes `name`'s etcd member (if still listed) and stops its process.
    async fn remove_member(&self, name: &str) -> Result<bool, WorldError> {
        let member = name.to_string();
        let removed = self
            .world
            .etcd(move |e| -> Result<bool, EtcdError> {
                let Some(i) = e.index_of(&member) else {
                    return Ok(false);
                };
                let listed = e.member_list()?.iter().any(|m| m.name == member);
                if listed {
                    e.remove_and_stop(i)?;
                } else {
                    e.kill(i);
                }
                Ok(listed)
            })
            .await??;
        self.world.refresh_endpoints().await?;
        Ok(removed)
    }

    /// Deletes Machine `name` as the KCP controller, through the webhook.
    async fn delete(&mut self, name: &str, why: &str) -> Result<Step, WorldError> {
        Ok(match self.kcp_delete(name, why).await? {
            Ok(()) => Step::Acted(format!("Machine {NAMESPACE}/{name} is being deleted")),
            Err(refused) => Step::Blocked(refused),
        })
    }

    /// Deletes Machine `name` as the KCP controller, through the webhook: `Ok(Err)` says why
    /// the API server refused.
    async fn kcp_delete(
        &mut self,
        name: &str,
        why: &str,
    ) -> Result<Result<(), String>, WorldError> {
        self.timeline
            .event("kcp", &format!("delete Machine {NAMESPACE}/{name} ({why})"));
        let before = self.world.webhooks.call_count();
        let answer = self.world.delete_machine(name, kcp_controller()).await?;
        if self.print_calls {
            super::scenarios::print_admissions(&self.world, &self.timeline, before);
        }
        Ok(answer.map_err(|(code, message)| {
            self.denials.push(name.to_string());
            format!("deleting Machine {NAMESPACE}/{name} was refused ({code}): {message}")
        }))
    }

    /// The Machine controller's part of a deletion: KCP's pre-terminate hook removes the etcd
    /// member (if it is still there), the infrastructure goes (the etcd process stops), then the
    /// finalizer is removed and the Machine is gone.
    async fn finish_deletion(&mut self, m: &MachineView) -> Result<Step, WorldError> {
        let removed = self.remove_member(&m.name).await?;
        let mut metadata = json!({ "finalizers": null });
        if m.has_annotation(KCP_PRE_TERMINATE_HOOK) {
            metadata["annotations"] = json!({ KCP_PRE_TERMINATE_HOOK: null });
        }
        self.world
            .patch_machine_metadata(&m.name, metadata, MACHINE_CONTROLLER)
            .await?;
        Ok(Step::Acted(if removed {
            format!(
                "Machine {NAMESPACE}/{} deleted: KCP's pre-terminate hook removed its etcd member, the machine is gone",
                m.name
            )
        } else {
            format!(
                "Machine {NAMESPACE}/{} deleted: the machine is gone",
                m.name
            )
        }))
    }
}
