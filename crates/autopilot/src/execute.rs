//! Carrying out one step the engine proved safe ([`quorumguard_engine::autopilot::Step`]): which
//! etcd calls it is, on which members of the fresh probe ([`plan`], pure), and making them
//! ([`execute`]).
//!
//! Which member each call goes to ([`crate::etcd`] says why): a membership change, the
//! compaction and a disarm go to the leader of the fresh probe (any voting member would forward
//! them; the leader saves the hop and is, by the proof, healthy); a defragmentation to the member
//! it defragments; MoveLeader to the member that leads now. A step the fresh probe cannot place
//! (no leader, the member gone) is not attempted: the engine decides again on the next probe.

use quorumguard_engine::autopilot::Step;
use quorumguard_engine::{Alarm, ControlPlane, EtcdState, Member, MemberId};
use thiserror::Error;

use crate::etcd::{ActError, Call, EtcdActor};
use crate::machines::{DeleteError, Deleted, MachineRef, delete_machine};

/// One etcd call of a step: what, to which member, about which member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned<'a> {
    pub call: Call,
    pub via: &'a Member,
    pub about: Option<MemberId>,
}

/// What a step is, in calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan<'a> {
    /// These etcd calls, in order; the first failure ends the step.
    Etcd(Vec<Planned<'a>>),
    /// The Machine deletion of the #2651 state.
    DeleteMachine(&'a str),
}

/// Why a step was not carried out, or not to its end.
#[derive(Debug, Error)]
pub enum ExecError {
    #[error(
        "KubeadmControlPlane {kcp}: {step} was not attempted: {why}; the autopilot decides again \
         on the next probe"
    )]
    NotPlaceable {
        kcp: String,
        step: String,
        why: String,
    },
    #[error("KubeadmControlPlane {kcp}: {step}: {error}")]
    Etcd {
        kcp: String,
        step: String,
        /// The calls that succeeded before this one.
        done: usize,
        error: ActError,
    },
    #[error("KubeadmControlPlane {kcp}: {step}: {error}")]
    Machine {
        kcp: String,
        step: String,
        error: DeleteError,
    },
}

/// The calls of `step` on the members of `fresh` (the probe it was proven on).
pub fn plan<'a>(step: &'a Step, fresh: &'a ControlPlane) -> Result<Plan<'a>, String> {
    let members: &[Member] = match &fresh.etcd {
        EtcdState::Observed(s) => &s.members,
        EtcdState::Unknown { reason } => return Err(format!("no member list ({reason})")),
    };
    let find = |id: MemberId| {
        members
            .iter()
            .find(|m| m.id == id)
            .ok_or_else(|| format!("member {id} is not in the fresh member list"))
    };
    let leader = || {
        members
            .iter()
            .find(|m| m.is_leader && !m.is_learner)
            .ok_or_else(|| "the fresh probe shows no leader".to_string())
    };
    let one = |call, via, about| Plan::Etcd(vec![Planned { call, via, about }]);
    Ok(match step {
        Step::Promote { member, .. } => {
            let learner = find(*member)?;
            if !learner.is_learner {
                return Err(format!("member {member} is not a learner any more"));
            }
            one(Call::Promote, leader()?, Some(*member))
        }
        Step::RemoveMember { member, .. } => {
            find(*member)?;
            one(Call::Remove, leader()?, Some(*member))
        }
        Step::Compact => one(Call::Compact, leader()?, None),
        Step::Defragment { member, .. } => one(Call::Defragment, find(*member)?, None),
        Step::MoveLeader { from, to } => {
            let now = leader()?;
            if now.id != *from {
                return Err(format!(
                    "member {from} does not lead any more ({} does)",
                    now.id
                ));
            }
            find(*to)?;
            one(Call::MoveLeader, now, Some(*to))
        }
        Step::Disarm => {
            let via = leader()?;
            let alarmed: Vec<Planned<'_>> = members
                .iter()
                .filter(|m| m.alarms.contains(&Alarm::NoSpace))
                .map(|m| Planned {
                    call: Call::DisarmNospace,
                    via,
                    about: Some(m.id),
                })
                .collect();
            if alarmed.is_empty() {
                return Err("no member has a NOSPACE alarm".into());
            }
            Plan::Etcd(alarmed)
        }
        Step::DeleteMachine { machine } => Plan::DeleteMachine(machine),
    })
}

/// What a carried-out step did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    /// Every etcd call of the step succeeded (how many).
    Etcd(usize),
    Machine(Deleted),
}

/// Carries out `step`, proven on `fresh`: its etcd calls through `actor`, or the deletion of
/// `machine` (the cached object the proof named, with its UID and resourceVersion) through
/// `kube`.
pub async fn execute(
    step: &Step,
    fresh: &ControlPlane,
    actor: &EtcdActor,
    kube: &kube::Client,
    machine: Option<&MachineRef>,
) -> Result<Done, ExecError> {
    let kcp = fresh.kcp_shown().to_string();
    let not_placeable = |why: String| ExecError::NotPlaceable {
        kcp: kcp.clone(),
        step: step.to_string(),
        why,
    };
    match plan(step, fresh).map_err(not_placeable)? {
        Plan::DeleteMachine(name) => {
            let Some(machine) = machine.filter(|m| m.name == name) else {
                return Err(not_placeable(format!(
                    "Machine {name} is not in the cache (deleted already, or not watched yet)"
                )));
            };
            delete_machine(kube, machine)
                .await
                .map(Done::Machine)
                .map_err(|error| ExecError::Machine {
                    kcp: kcp.clone(),
                    step: step.to_string(),
                    error,
                })
        }
        Plan::Etcd(calls) => {
            for (done, c) in calls.iter().enumerate() {
                let result = match (c.call, c.about) {
                    (Call::Promote, Some(id)) => actor.promote(c.via, id).await,
                    (Call::Remove, Some(id)) => actor.remove(c.via, id).await,
                    (Call::Compact, _) => actor.compact(c.via).await.map(drop),
                    (Call::Defragment, _) => actor.defragment(c.via).await,
                    (Call::MoveLeader, Some(to)) => actor.move_leader(c.via, to).await,
                    (Call::DisarmNospace, Some(id)) => actor.disarm_nospace(c.via, id).await,
                    (Call::Status, _) => actor.status(c.via).await.map(drop),
                    (call, None) => {
                        return Err(not_placeable(format!("{call} names no member")));
                    }
                };
                result.map_err(|error| ExecError::Etcd {
                    kcp: kcp.clone(),
                    step: step.to_string(),
                    done,
                    error,
                })?;
            }
            Ok(Done::Etcd(calls.len()))
        }
    }
}

#[cfg(test)]
mod tests;
