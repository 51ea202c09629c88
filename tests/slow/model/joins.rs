//! The steps of kubeadm, the Machine controller, the MachineHealthCheck and etcd's leader: a
//! new node's `kubeadm join`, the pre-terminate hook and the Machine's going, a Machine marked
//! for remediation past its nodeStartupTimeout, and an election after the leader left.

use crate::model::steps::Say;
use crate::model::world::*;

/// A new node's `kubeadm join`, one step at a time. v0.3: the member is added voting (it
/// counts before it has started), then starts. Current: added as a learner, then promoted.
/// Adding and promoting need quorum. The Machine gets its node when the member has joined.
pub(crate) fn join(n: &mut State, slot: u8, say: &mut Say) -> Option<()> {
    n.machine(slot)
        .filter(|m| !m.node && !m.deleting && !m.stalled)?;
    // A watch delivers a new Machine in milliseconds, a node takes minutes to boot and join:
    // the guard's cache has the Machine before its member appears.
    n.cached(slot)?;
    let learner = n.style == Style::Current;
    match n.member(slot).copied() {
        // Its member was added and removed since: kubeadm does not add another.
        None if n.machine(slot)?.member_added => return None,
        None => {
            if !n.may_add_member() {
                return None;
            }
            n.machine_mut(slot)?.member_added = true;
            n.members.push(Mem {
                slot,
                learner,
                started: learner,
                up: true,
            });
            n.members.sort_by_key(|m| m.slot);
            say.line(|| {
                format!(
                    "the node of {} joins etcd: member added{}",
                    name(slot),
                    if learner {
                        " as a learner"
                    } else {
                        " (voting, not started yet)"
                    }
                )
            });
        }
        Some(m) if !m.up => return None,
        Some(m) if !m.started => {
            n.member_mut(slot)?.started = true;
            n.machine_mut(slot)?.node = true;
            say.line(|| {
                format!(
                    "etcd member {} starts; Machine {0} has its node",
                    name(slot)
                )
            });
        }
        Some(m) if m.learner => {
            if !n.has_quorum() {
                return None;
            }
            n.member_mut(slot)?.learner = false;
            n.machine_mut(slot)?.node = true;
            say.line(|| {
                format!(
                    "learner {} is promoted; Machine {0} has its node",
                    name(slot)
                )
            });
        }
        Some(_) => n.machine_mut(slot)?.node = true,
    }
    Some(())
}

/// The Machine controller finishes a deletion: KCP's pre-terminate hook removes the member
/// (which needs quorum), the machine is gone, and so is the Machine. The hook finds the member
/// by its name: one that never started has none and stays behind (cluster-api #13221).
pub(crate) fn finish_deletion(n: &mut State, slot: u8, say: &mut Say) -> Option<()> {
    n.machine(slot).filter(|m| m.deleting)?;
    let member = n.member(slot).is_some_and(|m| m.started);
    if member {
        if !n.has_quorum() {
            return None;
        }
        n.members.retain(|m| m.slot != slot);
    }
    n.machines.retain(|m| m.slot != slot);
    say.line(|| {
        format!(
            "Machine {} is deleted{}",
            name(slot),
            if member {
                ": the pre-terminate hook removed its etcd member"
            } else {
                ""
            }
        )
    });
    Some(())
}

/// A leader that is gone starts an election; without quorum there is no leader.
pub(crate) fn settle_leader(n: &mut State) {
    if let Some(l) = n.leader {
        let leads = n.member(l).is_some_and(|m| !m.learner && m.started && m.up);
        if !leads {
            n.leader = None;
            n.election_probes = 0;
        }
    }
    if !n.has_quorum() {
        n.leader = None;
        n.election_probes = 0;
    }
}

/// The MachineHealthCheck marks Machine `m{slot}`, which has had no node past its
/// `nodeStartupTimeout` (Cluster API v1.14 `needsRemediation`, default 600 s), for remediation.
pub(crate) fn node_startup_timeout(n: &mut State, slot: u8, say: &mut Say) -> Option<()> {
    if !n.health_check {
        return None;
    }
    let m = n
        .machine_mut(slot)
        .filter(|m| !m.node && !m.young && !m.deleting && !m.remediate)?;
    m.remediate = true;
    say.line(|| {
        format!(
            "the MachineHealthCheck marks Machine {}, without a node past its nodeStartupTimeout",
            name(slot)
        )
    });
    Some(())
}

/// A MachineHealthCheck that also checks Machine conditions marks Machine `m{slot}`, whose node
/// is up and whose etcd member is gone, for remediation: KCP sets its `EtcdMemberHealthy`
/// condition False, "Etcd doesn't have an etcd member for Node" (Cluster API v1.14
/// `compareMachinesAndMembers` in controlplane/kubeadm/pkg/workload_cluster_conditions.go), and
/// an MHC with that condition in `checks.unhealthyMachineConditions` marks the Machine once it
/// has been False past its timeout (`machineChecks` in
/// core/reconcilers/machinehealthcheck/machinehealthcheck_targets.go). Only with
/// `Bounds::mhc_checks_etcd_member`: the MHC Cluster API's book gives for KCP checks only the
/// Node's `Ready` condition, which stays True here, and so marks nothing.
pub(crate) fn etcd_member_condition(n: &mut State, slot: u8, say: &mut Say) -> Option<()> {
    if !n.health_check || n.member(slot).is_some() {
        return None;
    }
    let m = n
        .machine_mut(slot)
        .filter(|m| m.node && !m.deleting && !m.remediate)?;
    m.remediate = true;
    say.line(|| {
        format!(
            "the MachineHealthCheck marks Machine {}, whose EtcdMemberHealthy condition is False (its node has no etcd member)",
            name(slot)
        )
    });
    Some(())
}
