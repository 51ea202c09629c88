//! Kubernetes Events for every denial and every break-glass use, so `kubectl describe machine`
//! shows who was refused and why.
//!
//! The webhook hands a [`Notice`] to a bounded queue and answers at once; one background task
//! publishes (events.k8s.io/v1, through kube's Recorder, which also folds repeats into a series).
//! A full queue drops the notice and counts it: an Event is never worth delaying a review.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

/// One Event to publish about an object.
#[derive(Clone, Debug)]
pub struct Notice {
    pub kind: String,
    pub api_version: String,
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub warning: bool,
    pub reason: String,
    pub action: String,
    pub note: String,
}

/// The sending side, held by the webhook.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Notice>,
    dropped: Arc<AtomicU64>,
}

/// Events are at most 1 kB of note; longer ones are cut with a mark.
const MAX_NOTE: usize = 1000;

fn cut(mut s: String) -> String {
    if s.len() > MAX_NOTE {
        let mut end = MAX_NOTE - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

impl EventSink {
    /// Queues a notice; never waits.
    pub fn send(&self, n: Notice) {
        if self.tx.try_send(n).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Notices dropped because the queue was full or the publisher gone.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Starts the publisher. `instance` is the pod name (several replicas publish).
pub fn spawn(client: Client, instance: Option<String>, capacity: usize) -> EventSink {
    let (tx, mut rx) = mpsc::channel::<Notice>(capacity);
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "quorumguard".into(),
            instance,
        },
    );
    tokio::spawn(async move {
        while let Some(n) = rx.recv().await {
            let reference = ObjectReference {
                api_version: Some(n.api_version.clone()),
                kind: Some(n.kind.clone()),
                namespace: Some(n.namespace.clone()),
                name: Some(n.name.clone()),
                uid: n.uid.clone(),
                ..Default::default()
            };
            let ev = Event {
                type_: if n.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: n.reason.clone(),
                note: Some(cut(n.note.clone())),
                action: n.action.clone(),
                secondary: None,
            };
            match tokio::time::timeout(Duration::from_secs(5), recorder.publish(&ev, &reference))
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(object = %format!("{} {}/{}", n.kind, n.namespace, n.name), error = %e, "could not publish an Event")
                }
                Err(_) => {
                    tracing::warn!(object = %format!("{} {}/{}", n.kind, n.namespace, n.name), "publishing an Event timed out")
                }
            }
        }
    });
    EventSink {
        tx,
        dropped: Arc::new(AtomicU64::new(0)),
    }
}
