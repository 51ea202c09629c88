//! The playground's scripted stories. Each runs against a fresh [`World`], prints a timeline and
//! checks its expectations: the webhook's verdicts (as the API server returned them, with the
//! reason the webhook gave), the conditions quorumguard published in the KCP's status, and the
//! final etcd membership. Nothing in the output is made up: every verdict is an HTTPS call to
//! the running webhook, every condition is read back from the KCP, every membership from etcd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::kcp::{KcpController, REMEDIATE_ANNOTATION, Step, Style};
use super::timeline::Timeline;
use super::truth::Truth;
use super::webhooks::WebhookCall;
use super::world::{Conditions, HUMAN, KCP, NEW_VERSION, OLD_VERSION, World, WorldError};

/// A story the playground can replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scenario {
    pub name: &'static str,
    /// One line for `--list`.
    pub summary: &'static str,
}

/// Every scenario, the default first.
pub const SCENARIOS: [Scenario; 3] = [
    Scenario {
        name: "upgrade-stuck",
        summary: "cluster-api #2651: a KCP v0.3-style rollout loses leader election between removing an etcd member and deleting its Machine; quorumguard names the way out and the rollout completes",
    },
    Scenario {
        name: "unsafe-manual-delete",
        summary: "one etcd member is frozen (SIGSTOP); a person deleting a healthy Machine is denied and pointed at remediation, which is allowed and converges",
    },
    Scenario {
        name: "scale-with-member-down",
        summary: "scaling 3 -> 5 with one member down is denied; once the member is back it is allowed and KCP scales to 5",
    },
];

/// The default scenario.
pub const DEFAULT_SCENARIO: &str = "upgrade-stuck";

/// The scenario named `name`.
pub fn find(name: &str) -> Option<Scenario> {
    SCENARIOS.iter().copied().find(|s| s.name == name)
}

/// How long to wait for quorumguard to publish what a step should lead to: a few probe
/// intervals plus the probe deadline, with room for a slow machine.
const STATUS_WAIT: Duration = Duration::from_secs(20);
/// At most this many controller steps per phase (a rollout of 3 takes about 12).
const MAX_STEPS: usize = 40;
/// And at most this long.
const PHASE_WAIT: Duration = Duration::from_secs(90);

/// Runs scenario `name` on `world`, recording expectations in `tl`; the last expectation is
/// that nothing quorumguard published during it was false ([`truth`]).
pub async fn run(world: Arc<World>, tl: &Timeline, name: &str) -> Result<(), WorldError> {
    let watcher = watch(Arc::clone(&world), tl.clone());
    let ctl = world.etcd(|e| e.etcdctl_handle()).await?;
    let seeds = {
        let world = Arc::clone(&world);
        move || world.etcd_endpoints()
    };
    let truth = Truth::start(Arc::clone(&world), ctl, seeds);
    let result = match name {
        "upgrade-stuck" => upgrade_stuck(&world, tl).await,
        "unsafe-manual-delete" => unsafe_manual_delete(&world, tl).await,
        "scale-with-member-down" => scale_with_member_down(&world, tl).await,
        other => Err(WorldError::Other(format!("no scenario named {other:?}"))),
    };
    watcher.abort();
    let lag = truth.lag();
    let verdict = tokio::task::spawn_blocking(move || truth.finish())
        .await
        .map_err(|e| WorldError::Join(e.to_string()))?;
    let mut detail = format!(
        "{} changes, {} etcd samples, {} changes without a sample within {lag:?} before them",
        verdict.changes, verdict.samples, verdict.unjudged
    );
    for f in verdict.false_claims.iter().take(5) {
        detail.push_str("\n  false: ");
        detail.push_str(f);
    }
    tl.check(
        format!(
            "every status published ({} changes) matched etcd's own view within {lag:?} of it",
            verdict.changes
        ),
        verdict.held(),
        detail,
    );
    result
}

async fn upgrade_stuck(world: &Arc<World>, tl: &Timeline) -> Result<(), WorldError> {
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

async fn unsafe_manual_delete(world: &Arc<World>, tl: &Timeline) -> Result<(), WorldError> {
    let Some(_) = settled(world, tl).await? else {
        return Ok(());
    };
    let names: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    let (Some(healthy), Some(frozen)) = (names.first().cloned(), names.get(2).cloned()) else {
        return Err(WorldError::Other(format!(
            "expected 3 Machines, found {names:?}"
        )));
    };
    tl.event(
        "fault",
        &format!("SIGSTOP etcd member {frozen}: alive, its ports open, answering nothing"),
    );
    let member = frozen.clone();
    world
        .etcd(move |e| match e.index_of(&member) {
            Some(i) => e.freeze(i),
            None => Err(super::etcd::EtcdError::NoSuchMember(member)),
        })
        .await??;
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

    tl.event(
        "human",
        &format!("kubectl annotate machine {frozen} {REMEDIATE_ANNOTATION}=\"\"\n(the safe path the NextAction names)"),
    );
    world
        .patch_machine_metadata(
            &frozen,
            serde_json::json!({ "annotations": { REMEDIATE_ANNOTATION: "" } }),
            HUMAN,
        )
        .await?;
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

async fn scale_with_member_down(world: &Arc<World>, tl: &Timeline) -> Result<(), WorldError> {
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

    let (allowed, reason) = human_scale(world, tl, 5).await?;
    tl.check(
        "scaling 3 -> 5 with a member down is denied",
        !allowed,
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
                None => Err(super::etcd::EtcdError::NoSuchMember(member)),
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
        "scaling 3 -> 5 with every member healthy is allowed",
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

/// Waits for the first Healthy/None publication and shows the table and etcd's member list.
async fn settled(world: &Arc<World>, tl: &Timeline) -> Result<Option<Conditions>, WorldError> {
    let c = published(world, tl, HEALTHY).await;
    if c.is_some() {
        etcd_says(world, tl).await;
    }
    Ok(c)
}

/// Checks that etcd's members are exactly the Machines' nodes, all running.
async fn final_membership(world: &Arc<World>, tl: &Timeline) -> Result<(), WorldError> {
    etcd_says(world, tl).await;
    let mut machines: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    machines.sort();
    let (mut members, down) = world
        .etcd(
            |e| -> Result<(Vec<String>, Vec<String>), super::etcd::EtcdError> {
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
async fn drive(
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
async fn human_delete(
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
async fn human_scale(
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

fn last_message(world: &World) -> String {
    world
        .webhooks
        .calls()
        .last()
        .and_then(|c| c.message.clone())
        .unwrap_or_default()
}

/// Prints the webhook calls numbered above `before` (the dispatcher's `call_count()` before the
/// request) with [`print_call`], or that there was none.
pub fn print_admissions(world: &World, tl: &Timeline, before: u64) {
    let calls = world.webhooks.calls_since(before);
    if calls.is_empty() {
        tl.event(
            "admission",
            "the API server did not call the webhook for this request",
        );
        return;
    }
    for call in &calls {
        print_call(tl, call);
    }
}

/// Prints one webhook call: who asked what, the verdict, the reason and the message, as the API
/// server got them.
pub fn print_call(tl: &Timeline, call: &WebhookCall) {
    let what = match &call.sub_resource {
        Some(sub) => format!("{}/{}", call.resource, sub),
        None => call.resource.clone(),
    };
    let verdict = if call.allowed { "ALLOWED" } else { "DENIED" };
    let reason = call.reason.as_deref().unwrap_or("no reason given");
    let mut text = format!(
        "{} {what} {}/{} by {} -> {verdict} ({reason}) by webhook {} in {:.1} ms",
        format!("{:?}", call.operation).to_uppercase(),
        call.namespace.as_deref().unwrap_or(""),
        call.name,
        call.user,
        call.webhook,
        call.latency.as_secs_f64() * 1000.0
    );
    if let Some(message) = call.message.as_deref().filter(|m| !m.is_empty()) {
        text.push('\n');
        text.push_str(message);
    }
    for w in &call.warnings {
        text.push_str(&format!("\nWarning: {w}"));
    }
    tl.event("admission", &text);
}

/// Prints the member table of the EtcdQuorum condition (its message after the summary line,
/// which the status watcher shows).
fn print_table(tl: &Timeline, c: &Conditions) {
    if let Some(q) = &c.quorum {
        let table: Vec<&str> = q.message.lines().skip(1).collect();
        if !table.is_empty() {
            tl.event("status", &table.join("\n"));
        }
    }
}

async fn etcd_says(world: &World, tl: &Timeline) {
    match world.etcd_says().await {
        Ok(text) => tl.event("etcd", &format!("member list: {text}")),
        Err(e) => tl.event("etcd", &format!("member list failed: {e}")),
    }
}

/// What a scenario waits to see published: the EtcdQuorum reason, and the NextAction reason and
/// the Machine it names when they matter.
type Expected<'a> = (&'a str, Option<&'a str>, Option<&'a str>);

/// The converged state.
const HEALTHY: Expected<'static> = ("Healthy", Some("None"), None);

/// Waits (at most [`STATUS_WAIT`]) until the published conditions are as `expected`, records
/// that as an expectation, and shows the member table.
async fn published(
    world: &Arc<World>,
    tl: &Timeline,
    expected: Expected<'_>,
) -> Option<Conditions> {
    let (quorum, action, target) = expected;
    let mut what = format!("quorumguard publishes EtcdQuorum {quorum}");
    if let Some(a) = action {
        what.push_str(&format!(" and NextAction {a}"));
    }
    if let Some(t) = target {
        what.push_str(&format!(" for {t}"));
    }
    let c = wait_status(world, tl, &what, |c| {
        c.quorum_reason() == quorum
            && action.is_none_or(|a| c.action() == a)
            && target.is_none_or(|t| c.action_target().as_deref() == Some(t))
    })
    .await?;
    print_table(tl, &c);
    Some(c)
}

/// Waits (at most [`STATUS_WAIT`]) until the published conditions satisfy `ok`, and records
/// that as an expectation.
async fn wait_status(
    world: &Arc<World>,
    tl: &Timeline,
    what: &str,
    ok: impl Fn(&Conditions) -> bool,
) -> Option<Conditions> {
    let started = Instant::now();
    let _progress = tl.progress(&format!("waiting: {what}"));
    // Bounded by time and by count (100 ms apart).
    for _ in 0..(STATUS_WAIT.as_millis() / 100) {
        let c = world.conditions();
        show_status(tl, &c);
        if ok(&c) {
            drop(_progress);
            tl.check(what, true, "");
            return Some(c);
        }
        if started.elapsed() > STATUS_WAIT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let c = world.conditions();
    tl.check(
        what,
        false,
        format!(
            "after {:?}: EtcdQuorum {} / NextAction {}: {}",
            STATUS_WAIT,
            c.quorum_reason(),
            c.action(),
            c.next_action.as_ref().map_or("", |a| a.message.as_str())
        ),
    );
    None
}

/// Prints the published conditions if they changed since last shown: the reasons, the figures
/// line and the action's message (the member table is left to [`print_table`]; raft index and DB
/// size change with every probe).
pub fn show_status(tl: &Timeline, c: &Conditions) {
    let Some(q) = &c.quorum else {
        return;
    };
    let mut text = format!(
        "EtcdQuorum={} {}: {}",
        q.status,
        q.reason,
        q.message.lines().next().unwrap_or("")
    );
    if let Some(a) = &c.next_action {
        text.push_str(&format!("\nNextAction {}: {}", a.reason, a.message));
    }
    tl.event_if_changed("status", &text);
}

/// Shows each change of the published conditions as it appears in the KCP.
pub fn watch(world: Arc<World>, tl: Timeline) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Bounded: aborted by `run`, and ends on its own after an hour.
        for _ in 0..36_000usize {
            show_status(&tl, &world.conditions());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}
