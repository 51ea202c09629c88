//! Waiting (bounded) for quorumguard to publish what a step should lead to, recorded as an
//! expectation on the timeline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::show::{print_table, show_status};
use crate::timeline::Timeline;
use crate::world::{Conditions, World};

/// How long to wait for quorumguard to publish what a step should lead to: a few probe
/// intervals plus the probe deadline, with room for a slow machine.
const STATUS_WAIT: Duration = Duration::from_secs(20);

/// What a scenario waits to see published: the EtcdQuorum reason, and the NextAction reason and
/// the Machine it names when they matter.
type Expected<'a> = (&'a str, Option<&'a str>, Option<&'a str>);

/// The converged state.
pub(super) const HEALTHY: Expected<'static> = ("Healthy", Some("None"), None);

/// Waits (at most [`STATUS_WAIT`]) until the published conditions are as `expected`, records
/// that as an expectation, and shows the member table.
pub(super) async fn published(
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
