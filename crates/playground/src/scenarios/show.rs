//! What the timeline shows: each webhook call as the API server got it, the published
//! conditions as they change, and etcd's member list.

use std::sync::Arc;
use std::time::Duration;

use crate::timeline::Timeline;
use crate::webhooks::WebhookCall;
use crate::world::{Conditions, World};

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
pub(super) fn print_table(tl: &Timeline, c: &Conditions) {
    if let Some(q) = &c.quorum {
        let table: Vec<&str> = q.message.lines().skip(1).collect();
        if !table.is_empty() {
            tl.event("status", &table.join("\n"));
        }
    }
}

pub(super) async fn etcd_says(world: &World, tl: &Timeline) {
    match world.etcd_says().await {
        Ok(text) => tl.event("etcd", &format!("member list: {text}")),
        Err(e) => tl.event("etcd", &format!("member list failed: {e}")),
    }
}

/// Prints the published conditions if they changed since last shown: the reasons, the figures
/// line and the action's message (the member table is left to `print_table`; raft index and DB
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
