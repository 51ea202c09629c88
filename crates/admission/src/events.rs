//! Kubernetes Events for every denial and every break-glass use, so that `kubectl describe`
//! shows who was refused (or overrode the guard) and what they were told.
//!
//! The webhook hands a [`Notice`] to a bounded queue and answers at once; one background task
//! publishes. A full queue drops the notice and counts it: an Event is never worth delaying a
//! review.
//!
//! Each distinct note is its own Event. The note names the requester and carries the message
//! they got, so two people refused on the same Machine, or one person told two different
//! things, are two Events; the same requester told the same thing again is a repeat, counted
//! in that Event's series (`kubectl describe` shows `(x2 over 40s)`).
//!
//! This is why the publisher is ours and not kube-runtime's `Recorder`. The Recorder folds
//! every Event with the same regarding object, reason, action, type, reporter and related
//! object into a series of the first one, and a series keeps the first note (kube-apiserver
//! refuses to change the note, action, reason, type, regarding or related of an existing
//! Event). On a real cluster, jane's, the KCP controller's and an admin's denials of one
//! Machine became one Event "x4" carrying jane's message. Its cache key has no room for the
//! note: it could be split only by smuggling a digest of the note into `action` (a
//! machine-readable verb, immutable, read by tools) or into an invented `related` object.
//! Publishing events.k8s.io/v1 ourselves is a create and a one-field patch, and it also lets
//! the cache be bounded in size (the Recorder's is bounded only by age), lets a repeat patch
//! only the series (the Recorder re-sends the whole Event), and recovers when the Event it would
//! count has gone (deleted, or expired by the API server's `--event-ttl`): a new one is created
//! instead of failing until the cache entry ages out.
//!
//! What is published, as kube-apiserver 1.32 validates an events.k8s.io/v1 Event: `eventTime`,
//! `type` Warning, `reason` (the reason code), `action` (`Delete` or `Update`, at most 128
//! characters), the note (at most 1 kB: longer ones are cut with a mark, keeping the requester,
//! who comes first), `regarding` (the Machine or KCP, with its uid so `kubectl describe` finds
//! it), `reportingController` `quorumguard` and `reportingInstance` the pod name. The name is
//! `<object>.<hex nanoseconds>`, as client-go names Events. A repeat is a JSON merge patch of
//! `series` alone (`count` from 2, `lastObservedTime`).
//!
//! The cache that makes repeats into series remembers an Event for 6 minutes after its last
//! observation (kube-runtime's window, and client-go's for events.k8s.io) and at most
//! [`CACHE_ENTRIES`] Events (client-go's core/v1 correlator keeps an LRU of 4096; ours holds each
//! note, up to 1 kB, so it is smaller: about 1.5 MB at most): when full, the Event observed longest ago is forgotten, and its next repeat is a new Event. Each
//! replica keeps its own: a repeat answered by the other replica is that replica's Event (its
//! `reportingInstance` tells them apart).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{counter::Counter, family::Family};
use serde_json::json;
use tokio::sync::mpsc;

use quorumguard_telemetry::Metrics;

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
    /// Names the requester first, then what they were told.
    pub note: String,
    /// The user the review names, for the per-requester limit.
    pub requester: String,
    /// A record of something done (an autopilot action and its outcome): never dropped for a
    /// limit, only when the queue is full. What causes these paces them (the autopilot acts at
    /// most once per cluster per interval).
    pub audit: bool,
}

/// The sending side, held by the webhook.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Notice>,
    dropped: Arc<AtomicU64>,
    /// Notices dropped, by why: `requester_limit`, `object_limit`, `queue_full`.
    dropped_by: Family<DropLabels, Counter>,
    limits: Arc<Mutex<Limits>>,
    sender_verified: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    reason: &'static str,
}

/// How many Events one requester may cause: [`PER_REQUESTER_BURST`] at once, then one per
/// [`PER_REQUESTER_EVERY`] (30 a minute). A person retrying a refused `kubectl delete`, or KCP's
/// controller refused on a few control planes, stays well inside it.
pub const PER_REQUESTER_BURST: u32 = 30;
pub const PER_REQUESTER_EVERY: Duration = Duration::from_secs(2);
/// How many Events one object (Machine or KCP) may get: [`PER_OBJECT_BURST`] at once, then one
/// per [`PER_OBJECT_EVERY`] (6 a minute), whoever the requesters are.
pub const PER_OBJECT_BURST: u32 = 10;
pub const PER_OBJECT_EVERY: Duration = Duration::from_secs(10);
/// The most requesters, and the most objects, whose limits are remembered; when full, the ones
/// back at their full burst are forgotten, and if none is, a notice from a new one is dropped.
pub const LIMITER_ENTRIES: usize = 4096;

/// A token bucket per key: `burst` tokens, one more every `every`.
struct Buckets {
    burst: f64,
    every: Duration,
    tokens: HashMap<String, (f64, Instant)>,
}

impl Buckets {
    fn new(burst: u32, every: Duration) -> Buckets {
        Buckets {
            burst: f64::from(burst.max(1)),
            every: every.max(Duration::from_millis(1)),
            tokens: HashMap::new(),
        }
    }

    /// The tokens `key` has at `now`.
    fn level(&self, key: &str, now: Instant) -> f64 {
        match self.tokens.get(key) {
            Some(&(tokens, at)) => {
                let refilled =
                    now.saturating_duration_since(at).as_secs_f64() / self.every.as_secs_f64();
                (tokens + refilled).min(self.burst)
            }
            None => self.burst,
        }
    }

    /// Whether `key` has a token at `now` and there is room to remember it.
    fn allows(&mut self, key: &str, now: Instant) -> bool {
        if self.level(key, now) < 1.0 {
            return false;
        }
        if !self.tokens.contains_key(key) && self.tokens.len() >= LIMITER_ENTRIES {
            let (burst, every) = (self.burst, self.every);
            self.tokens.retain(|_, &mut (tokens, at)| {
                tokens + now.saturating_duration_since(at).as_secs_f64() / every.as_secs_f64()
                    < burst
            });
        }
        self.tokens.contains_key(key) || self.tokens.len() < LIMITER_ENTRIES
    }

    fn take(&mut self, key: &str, now: Instant) {
        let level = self.level(key, now);
        self.tokens.insert(key.to_owned(), (level - 1.0, now));
    }
}

/// The per-requester and per-object limits. Pure: the caller passes the time.
struct Limits {
    requesters: Buckets,
    objects: Buckets,
}

impl Limits {
    fn new() -> Limits {
        Limits {
            requesters: Buckets::new(PER_REQUESTER_BURST, PER_REQUESTER_EVERY),
            objects: Buckets::new(PER_OBJECT_BURST, PER_OBJECT_EVERY),
        }
    }

    /// `Ok` and a token taken from both, or the limit that refuses it.
    fn admit(&mut self, n: &Notice, now: Instant) -> Result<(), &'static str> {
        if n.audit {
            return Ok(());
        }
        let object = format!("{} {}/{}", n.kind, n.namespace, n.name);
        if !self.requesters.allows(&n.requester, now) {
            return Err("requester_limit");
        }
        if !self.objects.allows(&object, now) {
            return Err("object_limit");
        }
        self.requesters.take(&n.requester, now);
        self.objects.take(&object, now);
        Ok(())
    }
}

/// Events are at most 1 kB of note; longer ones are cut with a mark.
const MAX_NOTE: usize = 1000;
/// How long after its last observation a repeat still counts in an Event's series.
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// The most Events the series cache remembers.
pub const CACHE_ENTRIES: usize = 1024;
/// Deadline of one create or patch.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// kube-apiserver's limit for an object name (a DNS subdomain).
const MAX_NAME: usize = 253;
/// `reportingController` of every Event.
const CONTROLLER: &str = "quorumguard";

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
    /// Queues a notice unless its requester or its object is over its limit; never waits.
    pub fn send(&self, n: Notice) {
        let admitted = self
            .limits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(&n, Instant::now());
        let dropped = match admitted {
            Err(reason) => reason,
            Ok(()) if self.tx.try_send(n).is_err() => "queue_full",
            Ok(()) => return,
        };
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.dropped_by
            .get_or_create(&DropLabels { reason: dropped })
            .inc();
    }

    /// Notices dropped: over a limit, the queue full or the publisher gone.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Whether kube-apiserver's client certificate is verified (`--client-ca-file`): only then
    /// is the user a review names known to be the one kube-apiserver authenticated.
    pub fn sender_verified(&self) -> bool {
        self.sender_verified
    }
}

/// What makes two notices the same Event: the object, the verdict and the note as published
/// (which names the requester and carries their message).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    api_version: String,
    kind: String,
    namespace: String,
    name: String,
    uid: Option<String>,
    warning: bool,
    reason: String,
    action: String,
    note: String,
}

impl Key {
    fn of(n: Notice) -> Key {
        Key {
            api_version: n.api_version,
            kind: n.kind,
            namespace: n.namespace,
            name: n.name,
            uid: n.uid,
            warning: n.warning,
            reason: n.reason,
            action: n.action,
            note: cut(n.note),
        }
    }

    /// `Kind namespace/name`, for log lines.
    fn object(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// An Event published lately.
#[derive(Clone, Debug)]
struct Published {
    /// Its name, to patch it.
    event: String,
    /// Observations so far, the first included.
    count: i32,
    last: Instant,
}

/// What to do with a notice.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// Nothing like it lately: a new Event.
    Create,
    /// A repeat of Event `event`: count it as observation `count`.
    Count { event: String, count: i32 },
}

/// The Events published in the last [`SERIES_WINDOW`], at most `capacity` of them. Pure: the
/// caller passes the time.
struct Series {
    entries: HashMap<Key, Published>,
    capacity: usize,
    window: Duration,
}

impl Series {
    fn new(capacity: usize, window: Duration) -> Series {
        Series {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            window,
        }
    }

    fn step(&self, key: &Key, now: Instant) -> Step {
        match self.entries.get(key) {
            Some(p) if now.saturating_duration_since(p.last) < self.window => Step::Count {
                event: p.event.clone(),
                count: p.count.saturating_add(1),
            },
            _ => Step::Create,
        }
    }

    /// Event `event` was created for `key` (replacing any earlier one).
    fn created(&mut self, key: Key, event: String, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.make_room(now);
        }
        self.entries.insert(
            key,
            Published {
                event,
                count: 1,
                last: now,
            },
        );
    }

    /// The repeat was counted: the Event now says `count`.
    fn counted(&mut self, key: &Key, count: i32, now: Instant) {
        if let Some(p) = self.entries.get_mut(key) {
            p.count = count;
            p.last = now;
        }
    }

    /// Forgets the aged entries; if none had aged, the one observed longest ago.
    fn make_room(&mut self, now: Instant) {
        let window = self.window;
        self.entries
            .retain(|_, p| now.saturating_duration_since(p.last) < window);
        if self.entries.len() >= self.capacity {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, p)| p.last)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// `<object>.<hex nanoseconds>` (client-go's form), the object's name shortened if needed to
/// stay a valid name.
fn event_name(object: &str, nanos: u128) -> String {
    let suffix = format!(".{nanos:x}");
    let mut base = object.to_string();
    if base.len() + suffix.len() > MAX_NAME {
        let mut end = MAX_NAME - suffix.len();
        while !base.is_char_boundary(end) {
            end -= 1;
        }
        base.truncate(end);
        // A DNS subdomain's labels end with a letter or digit.
        while base.ends_with(['.', '-']) {
            base.pop();
        }
    }
    if base.is_empty() {
        base = CONTROLLER.into();
    }
    base + &suffix
}

/// The Event to create for `key`, first observed at `now`.
fn new_event(key: &Key, instance: &str, now: SystemTime) -> Event {
    let nanos = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(&key.name, nanos)),
            namespace: Some(key.namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(timestamp(now))),
        type_: Some(if key.warning { "Warning" } else { "Normal" }.into()),
        reason: Some(key.reason.clone()),
        action: Some(key.action.clone()),
        note: Some(key.note.clone()),
        regarding: Some(ObjectReference {
            api_version: Some(key.api_version.clone()),
            kind: Some(key.kind.clone()),
            namespace: Some(key.namespace.clone()),
            name: Some(key.name.clone()),
            uid: key.uid.clone(),
            ..Default::default()
        }),
        reporting_controller: Some(CONTROLLER.into()),
        reporting_instance: Some(instance.into()),
        ..Default::default()
    }
}

/// The merge patch that counts observation `count` (at least 2) at `now`.
fn series_patch(count: i32, now: SystemTime) -> serde_json::Value {
    let series = EventSeries {
        count,
        last_observed_time: MicroTime(timestamp(now)),
    };
    json!({ "series": series })
}

fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Publishes notices, one at a time, keeping series.
struct Publisher {
    client: Client,
    instance: String,
    series: Series,
}

impl Publisher {
    async fn publish(&mut self, n: Notice) {
        let key = Key::of(n);
        let now = Instant::now();
        match self.series.step(&key, now) {
            Step::Create => self.create(key, now).await,
            Step::Count { event, count } => {
                let api: Api<Event> = Api::namespaced(self.client.clone(), &key.namespace);
                let patch = Patch::Merge(series_patch(count, SystemTime::now()));
                let done = tokio::time::timeout(
                    WRITE_TIMEOUT,
                    api.patch(&event, &PatchParams::default(), &patch),
                )
                .await;
                match done {
                    Ok(Ok(_)) => self.series.counted(&key, count, now),
                    // The Event has gone (deleted, or expired by --event-ttl): a new one.
                    Ok(Err(kube::Error::Api(e))) if e.code == 404 => self.create(key, now).await,
                    Ok(Err(e)) => tracing::warn!(
                        object = %key.object(), event = %event, error = %e,
                        "could not count a repeat in an Event's series"
                    ),
                    Err(_) => tracing::warn!(
                        object = %key.object(), event = %event,
                        "counting a repeat in an Event's series timed out"
                    ),
                }
            }
        }
    }

    async fn create(&mut self, key: Key, now: Instant) {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &key.namespace);
        let event = new_event(&key, &self.instance, SystemTime::now());
        let done =
            tokio::time::timeout(WRITE_TIMEOUT, api.create(&PostParams::default(), &event)).await;
        match done {
            Ok(Ok(made)) => self.series.created(key, made.name_any(), now),
            Ok(Err(e)) => tracing::warn!(
                object = %key.object(), event = %event.name_any(), error = %e,
                "could not publish an Event"
            ),
            Err(_) => tracing::warn!(
                object = %key.object(), event = %event.name_any(),
                "publishing an Event timed out"
            ),
        }
    }
}

/// Starts the publisher. `instance` is the pod name (several replicas publish); without it,
/// `quorumguard`. Dropped notices are counted in `metrics` as
/// `quorumguard_events_dropped_total{reason}`; `sender_verified` says whether reviews come
/// only from a client that presented kube-apiserver's certificate.
pub fn spawn(
    client: Client,
    instance: Option<String>,
    capacity: usize,
    metrics: &Metrics,
    sender_verified: bool,
) -> EventSink {
    let dropped_by = Family::<DropLabels, Counter>::default();
    metrics.with_registry(|r| {
        r.register(
            "events_dropped",
            "Events not written, by reason: requester_limit (over 30 a minute from one \
             requester), object_limit (over 6 a minute about one object), queue_full",
            dropped_by.clone(),
        )
    });
    for reason in ["requester_limit", "object_limit", "queue_full"] {
        let _ = dropped_by.get_or_create(&DropLabels { reason });
    }
    let (tx, mut rx) = mpsc::channel::<Notice>(capacity);
    let instance = instance
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| CONTROLLER.into());
    let mut publisher = Publisher {
        client,
        instance,
        series: Series::new(CACHE_ENTRIES, SERIES_WINDOW),
    };
    tokio::spawn(async move {
        while let Some(n) = rx.recv().await {
            publisher.publish(n).await;
        }
    });
    EventSink {
        tx,
        dropped: Arc::new(AtomicU64::new(0)),
        dropped_by,
        limits: Arc::new(Mutex::new(Limits::new())),
        sender_verified,
    }
}

#[cfg(test)]
mod tests;
