//! [`super::Style::Current`]: KCP of today. Its decisions are the engine's model of KCP
//! ([`kcp::reconcile`], the step function `quorumguard preflight` plays a rollout with), fed
//! from what is real, and carried out one action per step, in the order `preflight` plays them:
//! 1. a Machine being deleted finishes: the Machine controller runs KCP's pre-terminate hook,
//!    which removes the member from the real etcd only when KCP's check allows it (the voting
//!    members left, less the unhealthy ones, keep a quorum, and no learner is listed); a
//!    deletion held by another hook (a foreign pre-terminate hook, any pre-drain hook) waits;
//! 2. a Machine this controller created and that has no node joins one step: its member is
//!    added to the real etcd as a learner and started (etcd may refuse: its words are the
//!    reason), then the learner is promoted and the Machine has its node. A Machine without a
//!    node that this controller did not create has no join running: it stays as it is;
//! 3. KCP reconciles: remediation, then create a Machine or delete one (through the webhook,
//!    as KCP's controller).
//!
//! What is real here: etcd's member list (etcdctl against the real members), each member's
//! health from its process (frozen, stopped, never started: unhealthy; a learner: a learner),
//! the Machines as the API server holds them (outdated: `spec.version` is not the KCP's; a
//! node: `status.nodeRef`; deleting; the remediate-machine and delete-machine annotations).

use serde_json::json;

use super::{KcpController, Step};
use crate::engine::kcp::{self, Hold, KcpMachine, KcpMove, KcpView, MemberFit};
use crate::engine::model::{ANNOTATION_DELETE_MACHINE, ANNOTATION_REMEDIATE};
use crate::engine::quorum::quorum;
use crate::engine::rollout::{ReadyReason, StepKind};
use crate::etcd::{EtcdCluster, EtcdError};
use crate::world::{
    KCP_PRE_TERMINATE_HOOK, MACHINE_CONTROLLER, MachineView, NAMESPACE, World, WorldError,
};

const PRE_TERMINATE_PREFIX: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/";
const PRE_DRAIN_PREFIX: &str = "pre-drain.delete.hook.machine.cluster.x-k8s.io/";

/// One etcd member as etcd lists it, with its process's state.
#[derive(Clone, Debug)]
struct Listed {
    id: u64,
    /// Empty while it has never started.
    name: String,
    learner: bool,
    /// Its process runs and is not frozen.
    up: bool,
}

impl Listed {
    fn shown(&self) -> String {
        if self.name.is_empty() {
            format!("(unstarted {:x})", self.id)
        } else {
            self.name.clone()
        }
    }
}

/// What the controller reads of the world for one step.
struct Seen {
    /// Oldest first.
    machines: Vec<MachineView>,
    members: Vec<Listed>,
    replicas: u32,
    max_surge: u32,
}

impl Seen {
    /// The member of Machine `m`: the one named after its node (kubeadm's convention), or
    /// after the Machine while it has no node.
    fn member_of(&self, m: &MachineView) -> Option<usize> {
        let name = m.node.as_deref().unwrap_or(&m.name);
        self.members
            .iter()
            .position(|x| !x.name.is_empty() && x.name == name)
    }

    fn fit(&self, m: &MachineView) -> MemberFit {
        match self.member_of(m).map(|i| &self.members[i]) {
            None => MemberFit::Missing,
            Some(x) if x.learner => MemberFit::Learner,
            Some(x) if !x.up => MemberFit::Unhealthy,
            Some(_) => MemberFit::Healthy,
        }
    }

    /// Members no Machine claims, and members that never started.
    fn orphans(&self) -> Vec<&Listed> {
        self.members
            .iter()
            .filter(|x| {
                x.name.is_empty()
                    || !self
                        .machines
                        .iter()
                        .any(|m| m.node.as_deref().unwrap_or(&m.name) == x.name)
            })
            .collect()
    }

    /// KCP's view, fed from the real objects and members.
    fn view(&self, version: &str) -> Vec<KcpMachine> {
        self.machines
            .iter()
            .enumerate()
            .map(|(i, m)| KcpMachine {
                key: i as u32,
                outdated: m.version != version,
                node: m.node.is_some(),
                deleting: m.deleting,
                // KCP remediates only what a MachineHealthCheck marked: the annotation alone
                // does nothing.
                remediate: m.has_annotation(ANNOTATION_REMEDIATE) && m.remediable,
                delete_first: m.has_annotation(ANNOTATION_DELETE_MACHINE),
                member: self.fit(m),
            })
            .collect()
    }

    /// (voting, healthy voting) among `members`.
    fn votes<'a>(members: impl Iterator<Item = &'a Listed>) -> (usize, usize) {
        members
            .filter(|x| !x.learner)
            .fold((0, 0), |(v, h), x| (v + 1, h + usize::from(x.up)))
    }

    fn has_quorum(&self) -> bool {
        let (voting, healthy) = Self::votes(self.members.iter());
        voting > 0 && healthy >= quorum(voting)
    }
}

/// What one step came to.
enum Move {
    Acted(StepKind, String, String),
    Held(ReadyReason, String),
    Converged,
}

/// etcd's member list with each member's process state.
fn listed(e: &mut EtcdCluster) -> Result<Vec<Listed>, EtcdError> {
    let members = e.member_list()?;
    Ok(members
        .into_iter()
        .map(|m| {
            let up = !m.name.is_empty()
                && e.index_of(&m.name)
                    .is_some_and(|i| e.is_running(i) && !e.is_frozen(i));
            Listed {
                id: m.id,
                name: m.name,
                learner: m.learner,
                up,
            }
        })
        .collect())
}

/// `spec.rollout.strategy.rollingUpdate.maxSurge` (1 when not set, as KCP defaults it).
fn max_surge(world: &World) -> u32 {
    world
        .kcp()
        .and_then(|k| k["spec"]["rollout"]["strategy"]["rollingUpdate"]["maxSurge"].as_u64())
        .map_or(1, |s| s.min(1) as u32)
}

impl KcpController {
    /// One action of KCP of today.
    pub(super) async fn step_current(&mut self) -> Result<Step, WorldError> {
        self.blocked = None;
        let moved = match self.see().await? {
            Ok(seen) => self.next_move(&seen).await?,
            Err(e) => Move::Held(
                ReadyReason::EtcdUnknown,
                format!("etcd's member list cannot be read: {e}"),
            ),
        };
        Ok(match moved {
            Move::Acted(kind, machine, words) => {
                self.actions.push((kind, machine));
                Step::Acted(words)
            }
            Move::Held(reason, why) => {
                self.blocked = Some((reason, why.clone()));
                Step::Blocked(why)
            }
            Move::Converged => Step::Converged,
        })
    }

    async fn see(&self) -> Result<Result<Seen, EtcdError>, WorldError> {
        let machines = self.world.machines();
        let (replicas, _) = self.world.kcp_spec();
        let members = self.world.etcd(listed).await?;
        Ok(members.map(|members| Seen {
            machines,
            members,
            replicas: replicas as u32,
            max_surge: max_surge(&self.world),
        }))
    }

    async fn next_move(&mut self, seen: &Seen) -> Result<Move, WorldError> {
        if let Some(m) = seen.machines.iter().find(|m| m.deleting) {
            return self.finish(seen, m).await;
        }
        if let Some(target) = self.next_action_target(&seen.machines) {
            let why = "quorumguard's NextAction is DeleteMachine for it";
            return Ok(match self.kcp_delete(&target, why).await? {
                Ok(()) => deleting(&target, why),
                Err(refused) => Move::Held(ReadyReason::WebhookDenies, refused),
            });
        }
        let held = match self.join(seen).await? {
            Move::Converged => None,
            Move::Held(reason, why) => Some((reason, why)),
            acted => return Ok(acted),
        };
        self.reconcile(seen, held).await
    }

    /// The Machine controller finishes the deletion of `m`, if it can.
    async fn finish(&mut self, seen: &Seen, m: &MachineView) -> Result<Move, WorldError> {
        let name = m.name.clone();
        let hook = m.annotations.iter().map(|(k, _)| k).find(|k| {
            (k.starts_with(PRE_TERMINATE_PREFIX) && k.as_str() != KCP_PRE_TERMINATE_HOOK)
                || k.starts_with(PRE_DRAIN_PREFIX)
        });
        if let Some(hook) = hook {
            return Ok(Move::Held(
                ReadyReason::DeletionHeld,
                format!(
                    "Machine {NAMESPACE}/{name} is being deleted and hook {hook} (not KCP's) holds it: the Machine controller waits for that hook"
                ),
            ));
        }
        let member = seen.member_of(m);
        if let Some(i) = member {
            // KCP's pre-terminate hook: its check before it removes the member.
            let rest = || {
                seen.members
                    .iter()
                    .enumerate()
                    .filter(move |(j, _)| *j != i)
                    .map(|(_, x)| x)
            };
            if let Some(l) = rest().find(|x| x.learner || x.name.is_empty()) {
                return Ok(Move::Held(
                    ReadyReason::LeftoverMember,
                    format!(
                        "KCP's pre-terminate hook does not remove the member of Machine {NAMESPACE}/{name} while learner {} ({:x}) is listed",
                        l.shown(),
                        l.id
                    ),
                ));
            }
            let (voting, healthy) = Seen::votes(rest());
            if voting == 0 || healthy < quorum(voting) || !seen.has_quorum() {
                return Ok(Move::Held(
                    ReadyReason::DeletionHeld,
                    format!(
                        "KCP's pre-terminate hook does not remove the member of Machine {NAMESPACE}/{name}: {healthy} healthy of {voting} voting members would be left (quorum {})",
                        quorum(voting)
                    ),
                ));
            }
        }
        let removal = name.clone();
        let listed = member.is_some();
        let removed = self
            .world
            .etcd(move |e| -> Result<(), EtcdError> {
                let Some(i) = e.index_of(&removal) else {
                    return Ok(());
                };
                if listed {
                    e.remove_and_stop(i)
                } else {
                    // No member: the machine goes, and whatever runs on it.
                    e.kill(i);
                    Ok(())
                }
            })
            .await?;
        if let Err(e) = removed {
            return Ok(Move::Held(
                ReadyReason::DeletionHeld,
                format!(
                    "KCP's pre-terminate hook could not remove the member of Machine {NAMESPACE}/{name}: etcd says: {}",
                    etcd_words(&e.to_string())
                ),
            ));
        }
        self.world.refresh_endpoints().await?;
        let mut metadata = json!({ "finalizers": null });
        if m.has_annotation(KCP_PRE_TERMINATE_HOOK) {
            metadata["annotations"] = json!({ KCP_PRE_TERMINATE_HOOK: null });
        }
        self.world
            .patch_machine_metadata(&name, metadata, MACHINE_CONTROLLER)
            .await?;
        // Its last finalizer gone, the API server removes it: wait (bounded) until the world's
        // reads (a real server's watch) no longer show it, so the next step does not finish it
        // again.
        for _ in 0..300 {
            if !self.world.machines().iter().any(|x| x.name == name) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.joining.retain(|j| *j != name);
        let words = if listed {
            format!(
                "Machine {NAMESPACE}/{name} deleted: KCP's pre-terminate hook removed its etcd member, the machine is gone"
            )
        } else {
            format!("Machine {NAMESPACE}/{name} (no etcd member) deleted: the machine is gone")
        };
        Ok(Move::Acted(StepKind::Removed, name, words))
    }

    /// The first Machine without a node joins one step, if its join runs and etcd lets it.
    /// [`Move::Converged`] when no Machine is joining.
    async fn join(&mut self, seen: &Seen) -> Result<Move, WorldError> {
        let Some(m) = seen
            .machines
            .iter()
            .find(|m| m.node.is_none() && !m.deleting)
        else {
            return Ok(Move::Converged);
        };
        let name = m.name.clone();
        let member = seen.member_of(m).map(|i| seen.members[i].clone());
        if !self.joining.contains(&name) {
            return Ok(Move::Held(
                match &member {
                    Some(x) if x.learner => ReadyReason::LearnerNotPromoted,
                    _ => ReadyReason::JoinStuck,
                },
                match &member {
                    Some(x) if x.learner => format!(
                        "etcd member {name} of Machine {NAMESPACE}/{name} is a learner and its join is not running: nobody promotes it"
                    ),
                    _ => format!(
                        "Machine {NAMESPACE}/{name} has no node and its join is not running"
                    ),
                },
            ));
        }
        match member {
            None => {
                let joining = name.clone();
                let _progress = self
                    .timeline
                    .progress(&format!("etcd member {name} joining as a learner"));
                // etcd's answer to the add; then whether the new member came up in time. Once
                // added, its process runs: the join happened, and a member slow to come up (its
                // peers busy or frozen) is the promotion's business.
                let added = self
                    .world
                    .etcd(move |e| -> Result<Result<(), EtcdError>, EtcdError> {
                        let i = e.add_learner(&joining)?;
                        Ok(e.start_member(i))
                    })
                    .await?;
                let slow = match added {
                    Ok(Ok(())) => String::new(),
                    Ok(Err(e)) => format!(
                        " (it has not come up yet: {})",
                        e.to_string().lines().next().unwrap_or_default()
                    ),
                    Err(e) => return Ok(refused_join(&name, &e)),
                };
                self.world.refresh_endpoints().await?;
                Ok(Move::Acted(
                    StepKind::Join,
                    name.clone(),
                    format!("the node of Machine {NAMESPACE}/{name} joins etcd as a learner{slow}"),
                ))
            }
            Some(x) => {
                if x.learner {
                    if !x.up {
                        return Ok(Move::Held(
                            ReadyReason::MemberUnhealthy,
                            format!(
                                "learner {name} of Machine {NAMESPACE}/{name} cannot be promoted: its process is not running"
                            ),
                        ));
                    }
                    let promoted = name.clone();
                    let answer = self
                        .world
                        .etcd(move |e| match e.index_of(&promoted) {
                            Some(i) => e.promote(i),
                            None => Err(EtcdError::NoSuchMember(promoted)),
                        })
                        .await?;
                    if let Err(e) = answer {
                        return Ok(Move::Held(
                            ReadyReason::MemberUnhealthy,
                            format!(
                                "learner {name} of Machine {NAMESPACE}/{name} cannot be promoted: etcd says: {}",
                                etcd_words(&e.to_string())
                            ),
                        ));
                    }
                }
                self.world.set_node(&name).await?;
                self.joining.retain(|j| *j != name);
                Ok(Move::Acted(
                    StepKind::Promote,
                    name.clone(),
                    format!(
                        "learner {name} is promoted to a voting member; Machine {NAMESPACE}/{name} has its node"
                    ),
                ))
            }
        }
    }

    /// KCP's reconcile: remediation, then scale up or down.
    async fn reconcile(
        &mut self,
        seen: &Seen,
        held: Option<(ReadyReason, String)>,
    ) -> Result<Move, WorldError> {
        let (_, version) = self.world.kcp_spec();
        let machines = seen.view(&version);
        let r = kcp::reconcile(&KcpView {
            replicas: seen.replicas,
            max_surge: seen.max_surge,
            machines: &machines,
            orphan_members: seen.orphans().len() as u32,
        });
        let name = |key: u32| seen.machines[key as usize].name.clone();
        if let Some(key) = r.remediate {
            let victim = name(key);
            let why = "remediation: it is annotated remediate-machine";
            // A refused remediation ends the reconcile (v1.14 returns the error and tries the
            // same remediation next time), as `kcp::Reconcile::remediate` says.
            return Ok(match self.kcp_delete(&victim, why).await? {
                Ok(()) => deleting(&victim, why),
                Err(e) => Move::Held(ReadyReason::WebhookDenies, e),
            });
        }
        Ok(match r.then {
            KcpMove::Converged => match held {
                Some((reason, why)) => Move::Held(reason, why),
                None => Move::Converged,
            },
            KcpMove::ScaleUp => {
                let created = self.world.new_machine_name();
                self.world.create_machine(&created, &version).await?;
                self.joining.push(created.clone());
                let words = format!(
                    "KCP scales up: created Machine {NAMESPACE}/{created} ({version}); its node joins"
                );
                // Not printed here: whoever steps the controller prints what it did.
                Move::Acted(StepKind::Create, created, words)
            }
            KcpMove::ScaleDown(key) => {
                let victim = name(key);
                let why = if machines[key as usize].outdated {
                    "scale down: the oldest outdated Machine"
                } else {
                    "scale down"
                };
                match self.kcp_delete(&victim, why).await? {
                    Ok(()) => deleting(&victim, why),
                    Err(e) => Move::Held(ReadyReason::WebhookDenies, e),
                }
            }
            KcpMove::Wait(hold) => {
                let (reason, why) = held.unwrap_or_else(|| hold_words(seen, hold));
                Move::Held(reason, why)
            }
        })
    }
}

/// etcd refused to add a joining Machine's member: its words, and `preflight`'s name for it.
fn refused_join(name: &str, e: &EtcdError) -> Move {
    let text = e.to_string();
    let reason = if text.contains("too many learner") {
        ReadyReason::LeftoverMember
    } else {
        ReadyReason::MemberUnhealthy
    };
    Move::Held(
        reason,
        format!(
            "the join of Machine {NAMESPACE}/{name} cannot add its member: etcd says: {}",
            etcd_words(&text)
        ),
    )
}

/// etcd's own words in an etcdctl failure: its `Error:` line (etcdctl prints its JSON log
/// lines before it), else the first line.
fn etcd_words(text: &str) -> String {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Error: "))
        .or_else(|| text.lines().next())
        .unwrap_or_default()
        .to_string()
}

fn deleting(name: &str, why: &str) -> Move {
    Move::Acted(
        StepKind::Delete,
        name.to_string(),
        format!("Machine {NAMESPACE}/{name} is being deleted ({why})"),
    )
}

/// Why KCP's preflight holds, in words, with `preflight`'s name for it.
fn hold_words(seen: &Seen, hold: Hold) -> (ReadyReason, String) {
    let words = hold_sentence(seen, hold);
    (ReadyReason::from(hold), words)
}

/// [`hold_words`]'s sentence.
fn hold_sentence(seen: &Seen, hold: Hold) -> String {
    let name = |key: u32| {
        seen.machines
            .get(key as usize)
            .map_or_else(String::new, |m| m.name.clone())
    };
    match hold {
        Hold::Deleting(k) => format!(
            "Machine {NAMESPACE}/{} is being deleted: KCP waits for the deletion",
            name(k)
        ),
        Hold::NoNode(k) => format!(
            "Machine {NAMESPACE}/{} has no node: KCP's preflight waits for it",
            name(k)
        ),
        Hold::Member(k, MemberFit::Learner) => format!(
            "the etcd member of Machine {NAMESPACE}/{} is a learner: KCP's preflight waits for its promotion",
            name(k)
        ),
        Hold::Member(k, fit) => format!(
            "the etcd member of Machine {NAMESPACE}/{} is {}: KCP's preflight holds every scale operation",
            name(k),
            if fit == MemberFit::Missing {
                "missing"
            } else {
                "not healthy (its process is frozen or down)"
            }
        ),
        Hold::OrphanMembers(_) => format!(
            "etcd lists member(s) no Machine claims: {}: KCP's etcd check fails while they are listed",
            seen.orphans()
                .iter()
                .map(|x| format!(
                    "{} ({:x}{})",
                    x.shown(),
                    x.id,
                    if x.learner { ", a learner" } else { "" }
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
