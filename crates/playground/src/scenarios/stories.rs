//! The stories: an upgrade stuck between removing an etcd member and deleting its Machine, an
//! unsafe manual delete with a member frozen, and a scale-up with a member down.

use std::sync::Arc;

use super::show::{etcd_says, print_admissions};
use super::steps::{drive, final_membership, human_delete, human_scale, last_message, settled};
use super::wait::{HEALTHY, published};
use crate::kcp::{KcpController, REMEDIATE_ANNOTATION, Step, Style};
use crate::timeline::Timeline;
use crate::world::{HUMAN, KCP, NEW_VERSION, OLD_VERSION, World, WorldError};

pub(super) async fn upgrade_stuck(world: &Arc<World>, tl: &Timeline) -> Result<(), WorldError> {
    let Some(_) = settled(world, tl).await? else {
        return Ok(());
    };
    let old: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    tl.event(
        "human",
        &format!(
            "upgrades Kubernetes from {OLD_VERSION} to {NEW_VERSION}:\nkubectl patch kcp {KCP} --type merge -p '{{\"spec\":{{\"version\":\"{NEW_VERSION}\"}}}}'"
        ),
    );
    let before = world.webhooks.call_count();
    let answer = world
        .patch_kcp_spec(serde_json::json!({ "version": NEW_VERSION }), HUMAN)
        .await?;
    print_admissions(world, tl, before);
    tl.check(
        "the upgrade is allowed: 3 healthy members can roll one at a time",
        answer.is_ok(),
        format!("{answer:?}"),
    );

    tl.event(
        "kcp",
        "a KCP v0.3-style controller rolls the control plane: add a Machine and its member, remove the oldest member, delete its Machine",
    );
    let mut kcp = KcpController::new(Arc::clone(world), tl.clone(), Style::V03);
    kcp.crash_after_member_removal = true;
    let crashed = drive(world, tl, &mut kcp, |s| matches!(s, Step::Crashed(_))).await?;
    if !tl.check(
        "the controller lost leader election right after removing an etcd member",
        crashed,
        "it never got there",
    ) {
        return Ok(());
    }
    etcd_says(world, tl).await;
    let stranded = old.first().cloned().unwrap_or_default();
    let stuck = (
        "MembershipMismatch",
        Some("DeleteMachine"),
        Some(stranded.as_str()),
    );
    if published(world, tl, stuck).await.is_none() {
        return Ok(());
    }

    // The deadlock today: a person deleting another, healthy Machine.
    if let Some(other) = old.get(1) {
        let (allowed, reason) = human_delete(world, tl, other).await?;
        tl.check(
            format!("deleting healthy Machine {other} by hand is denied"),
            !allowed,
            format!("allowed={allowed} reason={reason}"),
        );
    }

    tl.event(
        "kcp",
        "the controller restarts; KCP v0.3 would stay stuck (\"4 control plane nodes, but 3 etcd members\"): this one follows quorumguard's NextAction",
    );
    kcp.follow_next_action = true;
    let converged = drive(world, tl, &mut kcp, |s| *s == Step::Converged).await?;
    tl.check(
        "the rollout completes",
        converged,
        "the controller did not converge",
    );
    tl.check(
        "every Machine deletion by the controller was allowed",
        kcp.denials.is_empty(),
        format!("denied: {:?}", kcp.denials),
    );
    if published(world, tl, HEALTHY).await.is_none() {
        return Ok(());
    }
    let machines = world.machines();
    let fresh = machines
        .iter()
        .all(|m| m.version == NEW_VERSION && !old.contains(&m.name));
    tl.check(
        format!("3 new Machines at {NEW_VERSION}, none of the old ones left"),
        machines.len() == 3 && fresh,
        format!(
            "{:?}",
            machines
                .iter()
                .map(|m| format!("{} {}", m.name, m.version))
                .collect::<Vec<_>>()
        ),
    );
    final_membership(world, tl).await
}

pub(super) async fn unsafe_manual_delete(
    world: &Arc<World>,
    tl: &Timeline,
) -> Result<(), WorldError> {
    let Some(_) = settled(world, tl).await? else {
        return Ok(());
    };
    let names: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    let (Some(healthy), Some(frozen)) = (names.first().cloned(), names.get(2).cloned()) else {
        return Err(WorldError::Other(format!(
            "expected 3 Machines, found {names:?}"
        )));
    };
    freeze(world, tl, &frozen).await?;
    let remediate = (
        "MembersUnhealthy",
        Some("RemediateMachine"),
        Some(frozen.as_str()),
    );
    if published(world, tl, remediate).await.is_none() {
        return Ok(());
    }

    let (allowed, reason) = human_delete(world, tl, &healthy).await?;
    let message = last_message(world);
    tl.check(
        format!("deleting healthy Machine {healthy} is denied (WouldLoseQuorum)"),
        !allowed && reason == "WouldLoseQuorum",
        format!("allowed={allowed} reason={reason}"),
    );
    tl.check(
        format!("the denial names the frozen member {frozen} and the safe path"),
        message.contains(&frozen) && message.contains(REMEDIATE_ANNOTATION),
        message.clone(),
    );

    annotate_remediate(world, tl, &frozen, "the safe path the NextAction names").await?;
    let mut kcp = KcpController::new(Arc::clone(world), tl.clone(), Style::Current);
    let converged = drive(world, tl, &mut kcp, |s| *s == Step::Converged).await?;
    tl.check(
        format!("KCP remediates {frozen}: its deletion is allowed and a replacement joins"),
        converged && kcp.denials.is_empty(),
        format!("converged={converged} denied={:?}", kcp.denials),
    );
    if published(world, tl, HEALTHY).await.is_none() {
        return Ok(());
    }
    tl.check(
        format!("{frozen} is gone and {healthy} stayed"),
        world.machines().iter().all(|m| m.name != frozen)
            && world.machines().iter().any(|m| m.name == healthy),
        format!(
            "{:?}",
            world.machines().iter().map(|m| &m.name).collect::<Vec<_>>()
        ),
    );
    final_membership(world, tl).await
}

pub(super) async fn scale_with_member_down(
    world: &Arc<World>,
    tl: &Timeline,
) -> Result<(), WorldError> {
    let Some(_) = settled(world, tl).await? else {
        return Ok(());
    };
    let names: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    let Some(down) = names.get(2).cloned() else {
        return Err(WorldError::Other(format!(
            "expected 3 Machines, found {names:?}"
        )));
    };
    tl.event(
        "fault",
        &format!("kill etcd member {down} (its node is down)"),
    );
    let member = down.clone();
    world
        .etcd(move |e| {
            if let Some(i) = e.index_of(&member) {
                e.kill(i);
            }
        })
        .await?;
    if published(world, tl, ("MembersUnhealthy", None, None))
        .await
        .is_none()
    {
        return Ok(());
    }

    // The KCP is v1.31: kubeadm joins learners, which cannot lose quorum, so the scale-up is
    // allowed (with a warning that KCP's preflight and etcd hold the join until the member is
    // back); with voting joins (before v1.29) it is denied `ScaleUpWouldLoseQuorum` (engine
    // tests, `check`'s named case (c)). KCP is not driven until the member is back.
    let (allowed, reason) = human_scale(world, tl, 5).await?;
    tl.check(
        "scaling 3 -> 5 with a member down is allowed: joins add learners (kubeadm v1.31)",
        allowed && reason == "ScaleUpSafe",
        format!("allowed={allowed} reason={reason}"),
    );

    tl.event(
        "fault",
        &format!("restart etcd member {down} (its node is back)"),
    );
    let member = down.clone();
    {
        let _progress = tl.progress(&format!("etcd member {down} restarting"));
        world
            .etcd(move |e| match e.index_of(&member) {
                Some(i) => e.start_member(i),
                None => Err(crate::etcd::EtcdError::NoSuchMember(member)),
            })
            .await??;
    }
    if published(world, tl, ("Healthy", None, None))
        .await
        .is_none()
    {
        return Ok(());
    }
    let (allowed, reason) = human_scale(world, tl, 5).await?;
    tl.check(
        "spec.replicas 5 stays allowed with every member healthy",
        allowed,
        format!("allowed={allowed} reason={reason}"),
    );
    let mut kcp = KcpController::new(Arc::clone(world), tl.clone(), Style::Current);
    let converged = drive(world, tl, &mut kcp, |s| *s == Step::Converged).await?;
    tl.check(
        "KCP scales to 5 Machines",
        converged && world.machines().len() == 5,
        format!("converged={converged} machines={}", world.machines().len()),
    );
    if published(world, tl, HEALTHY).await.is_none() {
        return Ok(());
    }
    final_membership(world, tl).await
}

/// A member frozen with no MachineHealthCheck for the control plane: the next action says to
/// create one; the remediate-machine annotation alone does nothing (Cluster API v1.14: the
/// MachineHealthCheck reconciler reads it, `needsRemediation`, and KCP replaces only what a
/// MachineHealthCheck marked); once the person creates one, KCP remediates the Machine.
pub(super) async fn remediate_without_mhc(
    world: &Arc<World>,
    tl: &Timeline,
) -> Result<(), WorldError> {
    let Some(_) = settled(world, tl).await? else {
        return Ok(());
    };
    tl.check(
        "no MachineHealthCheck exists",
        world.health_checks().is_empty(),
        format!("{:?}", world.health_checks()),
    );
    let names: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    let Some(frozen) = names.get(2).cloned() else {
        return Err(WorldError::Other(format!(
            "expected 3 Machines, found {names:?}"
        )));
    };
    freeze(world, tl, &frozen).await?;
    let enable = (
        "MembersUnhealthy",
        Some("EnableRemediation"),
        Some(frozen.as_str()),
    );
    let Some(c) = published(world, tl, enable).await else {
        return Ok(());
    };
    let message = c.next_action.map(|p| p.message).unwrap_or_default();
    tl.check(
        "the next action says no MachineHealthCheck covers the Machine and to create one",
        message.contains("no MachineHealthCheck covers")
            && message.contains("Create a MachineHealthCheck"),
        message.clone(),
    );

    annotate_remediate(
        world,
        tl,
        &frozen,
        "annotating without a MachineHealthCheck",
    )
    .await?;
    let mut kcp = KcpController::new(Arc::clone(world), tl.clone(), Style::Current);
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.push(kcp.step().await?);
    }
    let still = world
        .machines()
        .into_iter()
        .any(|m| m.name == frozen && !m.deleting);
    tl.check(
        format!("KCP does nothing with the annotation alone: {frozen} stays, not deleting"),
        still && kcp.denials.is_empty(),
        format!("steps {steps:?}, denials {:?}", kcp.denials),
    );
    if published(world, tl, enable).await.is_none() {
        return Ok(());
    }

    tl.event(
        "human",
        "kubectl apply -f mhc.yaml\n(the MachineHealthCheck of docs/runbook.md: it covers the control-plane Machines and remediates nothing on its own)",
    );
    world.create_health_check().await?;
    let remediate = (
        "MembersUnhealthy",
        Some("RemediateMachine"),
        Some(frozen.as_str()),
    );
    if published(world, tl, remediate).await.is_none() {
        return Ok(());
    }
    let converged = drive(world, tl, &mut kcp, |s| *s == Step::Converged).await?;
    tl.check(
        format!("with the MachineHealthCheck, KCP remediates {frozen}: its deletion is allowed and a replacement joins"),
        converged && kcp.denials.is_empty() && world.machines().iter().all(|m| m.name != frozen),
        format!("converged={converged} denied={:?}", kcp.denials),
    );
    if published(world, tl, HEALTHY).await.is_none() {
        return Ok(());
    }
    final_membership(world, tl).await
}

/// SIGSTOP etcd member `name`: alive, its ports open, answering nothing.
async fn freeze(world: &Arc<World>, tl: &Timeline, name: &str) -> Result<(), WorldError> {
    tl.event(
        "fault",
        &format!("SIGSTOP etcd member {name}: alive, its ports open, answering nothing"),
    );
    let member = name.to_string();
    world
        .etcd(move |e| match e.index_of(&member) {
            Some(i) => e.freeze(i),
            None => Err(crate::etcd::EtcdError::NoSuchMember(member)),
        })
        .await?
        .map_err(WorldError::from)
}

/// A person annotates Machine `name` remediate-machine (`why` says why, in the timeline).
async fn annotate_remediate(
    world: &Arc<World>,
    tl: &Timeline,
    name: &str,
    why: &str,
) -> Result<(), WorldError> {
    tl.event(
        "human",
        &format!("kubectl annotate machine {name} {REMEDIATE_ANNOTATION}=\"\"\n({why})"),
    );
    world
        .patch_machine_metadata(
            name,
            serde_json::json!({ "annotations": { REMEDIATE_ANNOTATION: "" } }),
            HUMAN,
        )
        .await?;
    Ok(())
}
