//! `remediate-second`: Cluster API's own test of remediation, on real etcd with the guard on.
//!
//! It follows `TestReconcileUnhealthyMachinesSequences`, "Remediates the second CP machine having
//! problems to come up" (cluster-api v1.14,
//! `controlplane/kubeadm/reconcilers/kubeadmcontrolplane/remediation_test.go`): a KCP with
//! `replicas: 3`, Machine m1 with a healthy etcd member that leads, and Machine m2, whose member
//! joined but whose Machine failed to come up, marked for remediation. KCP v1.14 remediates
//! first (`reconcileUnhealthyMachines`, before `scaleUpControlPlane` in `reconcile`): it deletes
//! m2, whose pre-terminate hook removes m2's member (1 voting, 1 healthy); then it scales up,
//! one Machine at a time, each joining with kubeadm v1.32's learner join (a learner, promoted
//! once in sync), until 3 replicas. No step of that order loses quorum.
//!
//! A guard that refuses KCP's deletion of m2 stops it for good: v1.14 ends a reconcile whose
//! remediation was refused and retries the same remediation next time, so it never scales up.
//! The simulated KCP plays it so ([`crate::kcp`]); the story then ends unconverged after its
//! bounded number of steps.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::show::etcd_says;
use super::steps::{drive, final_membership};
use super::wait::{HEALTHY, published};
use crate::engine::rollout::StepKind;
use crate::etcd::{EtcdCluster, EtcdError};
use crate::kcp::{KcpController, REMEDIATE_ANNOTATION, Step, Style};
use crate::timeline::Timeline;
use crate::world::{MACHINE_CONTROLLER, NAMESPACE, World, WorldError, kcp_controller};

/// The first Kubernetes minor whose `kubeadm join` always adds a learner (`EtcdLearnerMode` GA).
const LEARNER_JOIN_GA_MINOR: u32 = 32;

pub(super) async fn remediate_second(world: &Arc<World>, tl: &Timeline) -> Result<(), WorldError> {
    let names: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    let (replicas, version) = world.kcp_spec();
    let [m1, m2] = names.as_slice() else {
        return Err(WorldError::Other(format!(
            "remediate-second starts from 2 Machines for 3 replicas (Scenario::options), not {names:?}"
        )));
    };
    let (m1, m2) = (m1.clone(), m2.clone());
    if replicas != 3 {
        return Err(WorldError::Other(format!(
            "remediate-second starts from a KCP with 3 replicas, not {replicas}"
        )));
    }
    // Two voting members: quorum 2, no fault tolerance.
    if published(world, tl, ("NoFaultTolerance", None, None))
        .await
        .is_none()
    {
        return Ok(());
    }
    etcd_says(world, tl).await;
    let before = lead(world, &m1).await?;
    tl.event(
        "etcd",
        &if before == m1 {
            format!("{m1} leads (as the Go test's EtcdLeader)")
        } else {
            format!("move-leader: {m1} leads, not {before} (as the Go test's EtcdLeader)")
        },
    );

    tl.event(
        "mhc",
        &format!(
            "Machine {NAMESPACE}/{m2} failed to come up (its member joined etcd, the node never got ready): the MachineHealthCheck marks it for remediation ({REMEDIATE_ANNOTATION})"
        ),
    );
    world
        .patch_machine_metadata(
            &m2,
            json!({ "annotations": { REMEDIATE_ANNOTATION: "" } }),
            MACHINE_CONTROLLER,
        )
        .await?;
    // What quorumguard makes of it before KCP acts (shown, not expected: the story is KCP's).
    tokio::time::sleep(world.settle_time()).await;

    tl.event(
        "kcp",
        &format!(
            "KCP (v1.14's order, kubeadm {version}) reconciles: remediation first, and a refused remediation ends the reconcile; then scale up, each new node joining etcd as a learner"
        ),
    );
    let mut kcp = KcpController::new(Arc::clone(world), tl.clone(), Style::Current);
    let converged = drive(world, tl, &mut kcp, |s| *s == Step::Converged).await?;

    let calls = world.webhooks.calls();
    let remediation: Vec<_> = calls
        .iter()
        .filter(|c| c.resource == "machines" && c.user == kcp_controller() && c.name == m2)
        .collect();
    let first = remediation.first();
    tl.check(
        format!("KCP's deletion of {m2} (its remediation) is allowed"),
        first.is_some_and(|c| c.allowed),
        match first {
            None => "KCP never asked".to_string(),
            Some(c) => format!(
                "{} ({}), asked {} time(s): {}",
                if c.allowed { "allowed" } else { "denied" },
                c.reason.as_deref().unwrap_or("no reason"),
                remediation.len(),
                c.message.as_deref().unwrap_or("")
            ),
        },
    );
    if !tl.check(
        format!("KCP converges: {m2} remediated, then scaled up to 3"),
        converged && kcp.denials.is_empty(),
        format!(
            "converged={converged}, refused {} time(s): {:?}; blocked: {}",
            kcp.denials.len(),
            kcp.denials.first(),
            kcp.blocked.as_ref().map_or("", |(_, why)| why.as_str())
        ),
    ) {
        return Ok(());
    }
    let created: Vec<&String> = kcp
        .actions
        .iter()
        .filter(|(k, _)| *k == StepKind::Create)
        .map(|(_, m)| m)
        .collect();
    let joined = |kind: StepKind, m: &String| kcp.actions.iter().any(|(k, x)| *k == kind && x == m);
    let minor = crate::engine::joins::minor_of(&version);
    tl.check(
        format!(
            "each new Machine joined as a learner and was promoted (kubeadm {version}: learner joins from v1.{LEARNER_JOIN_GA_MINOR})"
        ),
        created.len() == 2
            && created
                .iter()
                .all(|m| joined(StepKind::Join, m) && joined(StepKind::Promote, m))
            && minor.is_some_and(|m| m >= LEARNER_JOIN_GA_MINOR),
        format!("created {created:?}, actions {:?}", kcp.actions),
    );
    if published(world, tl, HEALTHY).await.is_none() {
        return Ok(());
    }
    let now: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    tl.check(
        format!("3 Machines: {m1} stayed, {m2} is gone"),
        now.len() == 3 && now.contains(&m1) && !now.contains(&m2),
        format!("{now:?}"),
    );
    final_membership(world, tl).await
}

/// Makes `name`'s member etcd's leader (`etcdctl move-leader`) unless it leads already; returns
/// who led before.
async fn lead(world: &World, name: &str) -> Result<String, WorldError> {
    let target = name.to_string();
    world
        .etcd(move |e| -> Result<String, EtcdError> {
            let i = e
                .index_of(&target)
                .ok_or_else(|| EtcdError::NoSuchMember(target.clone()))?;
            let id = e.member_id(i)?;
            let leader = leader_id(e)?;
            let before = e
                .member_list()?
                .into_iter()
                .find(|m| m.id == leader)
                .map_or_else(|| format!("{leader:x}"), |m| m.name);
            if leader != id {
                e.etcdctl(&e.endpoints(), &["move-leader", &format!("{id:x}")])?;
            }
            Ok(before)
        })
        .await?
        .map_err(WorldError::Etcd)
}

/// The leader's member ID as the members' `endpoint status` says (asked at most 10 times, 300 ms
/// apart, while none names one).
fn leader_id(e: &EtcdCluster) -> Result<u64, EtcdError> {
    let mut last = String::new();
    for _ in 0..10 {
        let out = e.etcdctl(&e.endpoints(), &["endpoint", "status", "-w", "json"])?;
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|err| EtcdError::Output {
            what: "endpoint status",
            why: format!("not JSON ({err}): {out}"),
        })?;
        let leader = v
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["Status"]["leader"].as_u64())
            .find(|l| *l != 0);
        if let Some(l) = leader {
            return Ok(l);
        }
        last = out;
        std::thread::sleep(Duration::from_millis(300));
    }
    Err(EtcdError::Output {
        what: "endpoint status",
        why: format!("no member names a leader: {last}"),
    })
}
