//! `preflight`'s prediction against what happened: a rollout started on the playground, the
//! simulated KCP ([`Style::Current`], the engine's own model of KCP fed from the real etcd and
//! the API server) stepped until it converges or makes no progress, and what it did set beside
//! what [`crate::engine::rollout::preflight`] said it would do. Used by the tests
//! (`tests/slow/playground/prediction.rs`, `tests/slow/playground_real.rs`).
//!
//! Every wait here is bounded in count and in time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::engine::rollout::{Preflight, Readiness, ReadyReason, StepKind, preflight};
use crate::etcd::EtcdError;
use crate::kcp::{KcpController, Step, Style};
use crate::timeline::{Sink, Timeline};
use crate::world::{HUMAN, NEW_VERSION, Start, World, WorldError};

/// Consecutive blocked steps after which the rollout counts as stuck.
pub const STUCK_AFTER: usize = 8;
/// The pause after a blocked step (KCP requeues; quorumguard probes again meanwhile).
pub const BLOCKED_PAUSE: Duration = Duration::from_millis(750);
/// The most steps one rollout may take, blocked ones included.
pub const MAX_STEPS: usize = 160;
/// The longest one rollout may take.
pub const ROLLOUT_WAIT: Duration = Duration::from_secs(420);

/// How a rollout on the playground ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Machines match the spec, every one up to date.
    Converged,
    /// [`STUCK_AFTER`] steps in a row were blocked, the last for this reason.
    Stuck(ReadyReason, String),
    /// Neither within [`MAX_STEPS`] steps or [`ROLLOUT_WAIT`].
    NoEnd(String),
}

/// What the simulated KCP did.
#[derive(Clone, Debug)]
pub struct Happened {
    /// Its actions, in order, with the Machine each was about.
    pub actions: Vec<(StepKind, String)>,
    pub ended: Ended,
    pub took: Duration,
}

/// Waits (at most 20 s) until quorumguard has published its EtcdQuorum condition: its watches
/// and its prober run, so the webhook judges from a probed etcd.
pub async fn wait_published(world: &World) -> Result<(), WorldError> {
    for _ in 0..80 {
        if !world.conditions().quorum_reason().is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(WorldError::Other(
        "quorumguard published nothing within 20s".into(),
    ))
}

/// What `preflight` predicts for the world as it is now, from the control plane as
/// `quorumguard status` sees it, with the policy serve runs with.
pub async fn predict(world: &World) -> Result<Preflight, WorldError> {
    let cp = world.control_plane_as_status_sees_it().await?;
    Ok(preflight(&cp, world.policy(), crate::unix_now()))
}

/// Puts `world` in `start`, lets quorumguard see it, predicts, then starts the rollout and lets
/// the simulated KCP roll it out: the prediction and what happened.
pub async fn predict_and_roll_out(
    world: &Arc<World>,
    start: Start,
) -> Result<(Preflight, Happened), WorldError> {
    wait_published(world).await?;
    world.apply_start(start).await?;
    tokio::time::sleep(world.settle_time()).await;
    let p = predict(world).await?;
    start_rollout(world).await?;
    let mut kcp = controller(world);
    let happened = roll_out(&mut kcp).await?;
    Ok((p, happened))
}

/// [`predict_and_roll_out`] for the starting state `name`, the prediction and what happened
/// printed side by side, the world shut down; then [`compare`]'s verdict (an error also when
/// the world failed).
pub async fn check_prediction(world: &Arc<World>, name: &str, start: Start) -> Result<(), String> {
    let started = Instant::now();
    let played = predict_and_roll_out(world, start).await;
    world.shutdown().await;
    let (p, happened) = played.map_err(|e| format!("{name}: {e}"))?;
    println!(
        "{name} ({start:?}):\n{}took {:.1}s in all",
        side_by_side(&p, &happened),
        started.elapsed().as_secs_f64()
    );
    compare(&p, &happened)
        .map_err(|both| format!("{name}: the prediction and what happened differ:\n{both}"))
}

/// A person starts the rollout: `spec.version` set to [`NEW_VERSION`] through the API (and
/// so through the webhook).
pub async fn start_rollout(world: &World) -> Result<(), WorldError> {
    world
        .patch_kcp_spec(json!({ "version": NEW_VERSION }), HUMAN)
        .await?
        .map_err(|(code, message)| {
            WorldError::Other(format!(
                "the version change was refused ({code}): {message}"
            ))
        })
}

/// A simulated KCP of today for `world`, its timeline kept in memory.
pub fn controller(world: &Arc<World>) -> KcpController {
    KcpController::new(
        Arc::clone(world),
        Timeline::new(Sink::Memory),
        Style::Current,
    )
}

/// Steps `kcp` until it converges, or [`STUCK_AFTER`] steps in a row are blocked, or the
/// bounds run out.
pub async fn roll_out(kcp: &mut KcpController) -> Result<Happened, WorldError> {
    let started = Instant::now();
    let first = kcp.actions.len();
    let mut blocked = 0;
    let mut ended = Ended::NoEnd(format!(
        "neither converged nor stuck within {MAX_STEPS} steps or {ROLLOUT_WAIT:?}"
    ));
    for _ in 0..MAX_STEPS {
        if started.elapsed() > ROLLOUT_WAIT {
            break;
        }
        match kcp.step().await? {
            Step::Acted(_) => blocked = 0,
            Step::Converged => {
                ended = Ended::Converged;
                break;
            }
            Step::Crashed(what) => {
                ended = Ended::NoEnd(format!("the controller crashed: {what}"));
                break;
            }
            Step::Blocked(why) => {
                blocked += 1;
                if blocked >= STUCK_AFTER {
                    let (reason, why) = kcp
                        .blocked
                        .clone()
                        .unwrap_or((ReadyReason::EtcdUnknown, why));
                    ended = Ended::Stuck(reason, why);
                    break;
                }
                tokio::time::sleep(BLOCKED_PAUSE).await;
            }
        }
    }
    Ok(Happened {
        actions: kcp.actions[first..].to_vec(),
        ended,
        took: started.elapsed(),
    })
}

/// The real name of each Machine the prediction made up: its k-th created Machine is the
/// k-th the controller created.
pub fn real_names(p: &Preflight, actions: &[(StepKind, String)]) -> BTreeMap<String, String> {
    let predicted = p.steps.iter().filter(|s| s.kind == StepKind::Create);
    let created = actions.iter().filter(|(k, _)| *k == StepKind::Create);
    predicted
        .zip(created)
        .map(|(s, (_, real))| (s.machine.clone(), real.clone()))
        .collect()
}

/// What the prediction says the rollout does: the steps that happen, and how it ends.
fn expected(p: &Preflight) -> Result<(usize, Ended), String> {
    match p.readiness {
        Readiness::Ready | Readiness::Unsafe { .. } => Ok((p.steps.len(), Ended::Converged)),
        Readiness::WouldStick { at, .. } => Ok((at - 1, Ended::Stuck(p.reason, p.why.clone()))),
        Readiness::CannotJudge => Err(format!("the prediction cannot judge: {}", p.why)),
    }
}

/// Checks that what happened is what `p` predicted: the same actions (kind and Machine, the
/// made-up names of new Machines mapped to the real ones), as many, and the same end (converged,
/// or stuck for the same reason). The error shows both side by side.
pub fn compare(p: &Preflight, h: &Happened) -> Result<(), String> {
    let (count, end) = expected(p).map_err(|e| format!("{e}\n{}", side_by_side(p, h)))?;
    let names = real_names(p, &h.actions);
    let real = |n: &str| names.get(n).cloned().unwrap_or_else(|| n.to_string());
    let same_steps = h.actions.len() == count
        && p.steps
            .iter()
            .zip(&h.actions)
            .all(|(s, (kind, machine))| s.kind == *kind && real(&s.machine) == *machine);
    let same_end = match (&end, &h.ended) {
        (Ended::Converged, Ended::Converged) => true,
        (Ended::Stuck(a, _), Ended::Stuck(b, _)) => a == b,
        _ => false,
    };
    if same_steps && same_end {
        Ok(())
    } else {
        Err(side_by_side(p, h))
    }
}

/// The prediction's steps and the actions carried out, row by row, then both ends.
pub fn side_by_side(p: &Preflight, h: &Happened) -> String {
    let names = real_names(p, &h.actions);
    let mut out = format!("prediction: {}\n", p.summary());
    let _ = writeln!(
        out,
        "{:>3}  {:<48} | {:<48}",
        "#", "predicted", "carried out"
    );
    let rows = p.steps.len().max(h.actions.len());
    for i in 0..rows {
        let left = p.steps.get(i).map_or(String::new(), |s| {
            let m = names.get(&s.machine).unwrap_or(&s.machine);
            format!("{} {m}", s.kind.as_str())
        });
        let right = h
            .actions
            .get(i)
            .map_or(String::new(), |(k, m)| format!("{} {m}", k.as_str()));
        let mark = if left == right { " " } else { "*" };
        let _ = writeln!(out, "{:>3}{mark} {left:<48} | {right:<48}", i + 1);
    }
    let predicted_end = match expected(p) {
        Ok((n, Ended::Stuck(r, _))) => format!("stuck at step {} ({r})", n + 1),
        Ok((n, _)) => format!("finishes after {n} steps"),
        Err(e) => e,
    };
    let happened_end = match &h.ended {
        Ended::Converged => format!("converged after {} actions", h.actions.len()),
        Ended::Stuck(r, why) => format!("stuck at step {} ({r}): {why}", h.actions.len() + 1),
        Ended::NoEnd(why) => why.clone(),
    };
    let _ = writeln!(out, "end: predicted {predicted_end}");
    let _ = writeln!(
        out,
        "end: happened {happened_end} ({:.1}s)",
        h.took.as_secs_f64()
    );
    out
}

/// Whether etcd keeps quorum with `frozen` frozen: a linearizable put, then a linearizable get,
/// through a running voting member other than `frozen`, asked up to 4 times (a frozen leader
/// costs an election first). Each call waits at most 2 s.
pub async fn quorum_kept(world: &World, frozen: &str) -> Result<bool, WorldError> {
    let frozen = frozen.to_string();
    let (etcdctl, endpoints) = world
        .etcd(move |e| -> Result<_, EtcdError> {
            let mut endpoints = Vec::new();
            for m in e.member_list()? {
                if m.learner || m.name.is_empty() || m.name == frozen {
                    continue;
                }
                if let Some(i) = e.index_of(&m.name)
                    && e.is_running(i)
                    && !e.is_frozen(i)
                    && let Some(url) = e.client_url(i)
                {
                    endpoints.push(url);
                }
            }
            Ok((
                e.etcdctl_handle().with_timeout(Duration::from_secs(2)),
                endpoints,
            ))
        })
        .await??;
    if endpoints.is_empty() {
        return Ok(false);
    }
    tokio::task::spawn_blocking(move || {
        for attempt in 0..4 {
            let ep = [endpoints[attempt % endpoints.len()].clone()];
            let put = etcdctl.run(&ep, &["put", "quorumguard-failure-halfway", "1"]);
            let get = put.and_then(|_| {
                etcdctl.run(
                    &ep,
                    &["get", "quorumguard-failure-halfway", "--consistency=l"],
                )
            });
            if get.is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        false
    })
    .await
    .map_err(|e| WorldError::Join(e.to_string()))
}

/// Waits (at most 30 s) until every listed member is started, running and unfrozen, and
/// every voting one answers `endpoint health`.
pub async fn wait_healthy(world: &World) -> Result<(), WorldError> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(30) {
        let answer = world
            .etcd(|e| -> Result<(), EtcdError> {
                let mut endpoints = Vec::new();
                for m in e.member_list()? {
                    let i = e
                        .index_of(&m.name)
                        .filter(|i| !m.name.is_empty() && e.is_running(*i) && !e.is_frozen(*i))
                        .ok_or_else(|| EtcdError::NotRunning(m.name.clone()))?;
                    // A learner answers no linearizable read: running is all it can show.
                    if !m.learner {
                        endpoints.extend(e.client_url(i));
                    }
                }
                e.etcdctl(&endpoints, &["endpoint", "health"]).map(|_| ())
            })
            .await?;
        match answer {
            Ok(()) => return Ok(()),
            Err(e) => last = e.to_string().lines().last().unwrap_or_default().to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(WorldError::Other(format!(
        "etcd not healthy within 30s: {last}"
    )))
}
