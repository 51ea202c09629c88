//! The steps the stories share: waiting for the first healthy status, driving the KCP
//! controller, a person's `kubectl delete` and `kubectl scale`, and the final membership check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::show::{etcd_says, print_admissions};
use super::wait::{HEALTHY, published};
use crate::kcp::{KcpController, Step};
use crate::timeline::Timeline;
use crate::world::{Conditions, HUMAN, KCP, World, WorldError};

/// At most this many controller steps per phase (a rollout of 3 takes about 12).
const MAX_STEPS: usize = 40;
/// And at most this long.
const PHASE_WAIT: Duration = Duration::from_secs(90);

/// Waits for the first Healthy/None publication and shows the table and etcd's member list.
pub(super) async fn settled(
    world: &Arc<World>,
    tl: &Timeline,
) -> Result<Option<Conditions>, WorldError> {
    let c = published(world, tl, HEALTHY).await;
    if c.is_some() {
        etcd_says(world, tl).await;
    }
    Ok(c)
}

/// Checks that etcd's members are exactly the Machines' nodes, all running.
pub(super) async fn final_membership(world: &Arc<World>, tl: &Timeline) -> Result<(), WorldError> {
    etcd_says(world, tl).await;
    let mut machines: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    machines.sort();
    let (mut members, down) = world
        .etcd(
            |e| -> Result<(Vec<String>, Vec<String>), crate::etcd::EtcdError> {
                let mut names = Vec::new();
                let mut down = Vec::new();
                for m in e.member_list()? {
                    let up = e
                        .index_of(&m.name)
                        .is_some_and(|i| e.is_running(i) && !e.is_frozen(i));
                    if !up || m.learner {
                        down.push(m.name.clone());
                    }
                    names.push(m.name);
                }
                Ok((names, down))
            },
        )
        .await??;
    members.sort();
    tl.check(
        format!(
            "etcd's voting members are exactly the {} Machines' nodes, all running",
            machines.len()
        ),
        members == machines && down.is_empty(),
        format!("members {members:?}, machines {machines:?}, not running or learners {down:?}"),
    );
    Ok(())
}

/// Steps the controller until `done` holds for a step (true), or it gives up (false): after
/// [`MAX_STEPS`] steps or [`PHASE_WAIT`]. Between actions it waits two probe intervals, so
/// quorumguard's view (and the timeline) follows each one.
pub(super) async fn drive(
    world: &Arc<World>,
    tl: &Timeline,
    kcp: &mut KcpController,
    done: impl Fn(&Step) -> bool,
) -> Result<bool, WorldError> {
    let started = Instant::now();
    let mut last_blocked = String::new();
    for _ in 0..MAX_STEPS {
        if started.elapsed() > PHASE_WAIT {
            break;
        }
        let step = kcp.step().await?;
        match &step {
            Step::Acted(what) => tl.event("kcp", what),
            Step::Crashed(what) => tl.event("kcp", what),
            Step::Blocked(why) if *why != last_blocked => {
                tl.event("kcp", &format!("waiting: {why}"));
                last_blocked = why.clone();
            }
            Step::Blocked(_) | Step::Converged => {}
        }
        if done(&step) {
            return Ok(true);
        }
        if matches!(step, Step::Crashed(_) | Step::Converged) {
            return Ok(false);
        }
        tokio::time::sleep(world.settle_time()).await;
    }
    Ok(false)
}

/// `kubectl delete machine NAME` by a person: (allowed, the webhook's reason).
pub(super) async fn human_delete(
    world: &Arc<World>,
    tl: &Timeline,
    name: &str,
) -> Result<(bool, String), WorldError> {
    tl.event("human", &format!("kubectl delete machine {name}"));
    let before = world.webhooks.call_count();
    let answer = world.delete_machine(name, HUMAN).await?;
    print_admissions(world, tl, before);
    Ok((answer.is_ok(), last_reason(world)))
}

/// `kubectl scale kcp --replicas N` by a person: (allowed, the webhook's reason).
pub(super) async fn human_scale(
    world: &Arc<World>,
    tl: &Timeline,
    replicas: i32,
) -> Result<(bool, String), WorldError> {
    tl.event(
        "human",
        &format!("kubectl scale kcp {KCP} --replicas {replicas}"),
    );
    let before = world.webhooks.call_count();
    let answer = world.scale_kcp(replicas, HUMAN).await?;
    print_admissions(world, tl, before);
    Ok((answer.is_ok(), last_reason(world)))
}

fn last_reason(world: &World) -> String {
    world
        .webhooks
        .calls()
        .last()
        .and_then(|c| c.reason.clone())
        .unwrap_or_default()
}

pub(super) fn last_message(world: &World) -> String {
    world
        .webhooks
        .calls()
        .last()
        .and_then(|c| c.message.clone())
        .unwrap_or_default()
}
