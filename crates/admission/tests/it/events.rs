//! Events name each requester and the message they got (issue 14, part 2).
//!
//! The running guard judges reviews shaped as kube-apiserver sends them and publishes its Events
//! to the API-server stand-in. An admission hook on the stand-in sees every events.k8s.io/v1
//! write (the Event as it would be stored, and the one it replaces) and refuses what
//! kube-apiserver 1.32 would refuse (its `ValidateEventCreate`/`ValidateEventUpdate`: required
//! fields, the 128-character limits of action, reason and reportingInstance, the 1024-byte note,
//! a series count of at least 2, and on update the fields that cannot change: note, action,
//! reason, type, regarding, related, eventTime, the reporter). The stand-in's request log gives
//! the verbs and paths: each Event is one create, each repeat one patch of that Event.
//!
//! On a real kube-apiserver, kube-runtime's Recorder folded every denial of one Machine with one
//! reason into a series of the first Event, keeping the first requester's note. These tests
//! fail on that publisher: one Event "x4" naming jane about the Machine, one "x3" about the KCP,
//! one "x2" for two break-glass uses.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quorumguard_cli::server::Running;
use serde_json::{Value, json};
use testkit::apiserver::{AdmissionAttempt, AdmissionVerdict, ApiServer, Operation};
use testkit::guard::{self, KCPS, MACHINES, delete_review, replicas_review, review};
use testkit::https::{STEP, TempDir, TestPki};
use testkit::reviews::{KCP_CONTROLLER, NS, members};

const JANE: &str = "jane@example.com";
const ADMIN: &str = "kubernetes-admin";
/// Where the guard creates its Events.
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/capi-test/events";

/// One Event write as kube-apiserver's admission would see it.
#[derive(Clone, Debug)]
struct Write {
    operation: Operation,
    object: Value,
    old: Option<Value>,
}

/// What the hook recorded: every events.k8s.io/v1 write, and every refusal with its reason.
#[derive(Default)]
struct Seen {
    writes: Vec<Write>,
    refused: Vec<String>,
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

/// What kube-apiserver 1.32 would refuse in this events.k8s.io/v1 write, if anything.
fn invalid(a: &AdmissionAttempt) -> Option<String> {
    let e = a.object.as_ref()?;
    let s = |field: &str| e[field].as_str().unwrap_or("");
    let mut why = Vec::new();
    for (field, limit) in [
        ("action", 128),
        ("reason", 128),
        ("reportingInstance", 128),
        ("reportingController", 253),
    ] {
        if s(field).is_empty() {
            why.push(format!("{field}: Required value"));
        }
        if s(field).len() > limit {
            why.push(format!("{field}: can have at most {limit} characters"));
        }
    }
    if s("note").len() > 1024 {
        why.push("note: can have at most 1024 characters".into());
    }
    if !matches!(s("type"), "Normal" | "Warning") {
        why.push(format!("type: has invalid value: {}", s("type")));
    }
    if s("eventTime").is_empty() {
        why.push("eventTime: Required value".into());
    }
    if e["regarding"]["namespace"] != e["metadata"]["namespace"] {
        why.push("regarding.namespace: does not match event.namespace".into());
    }
    let name = e["metadata"]["name"].as_str().unwrap_or("");
    let dns = name.len() <= 253
        && !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if !dns {
        why.push(format!("metadata.name: Invalid value: {name:?}"));
    }
    for legacy in [
        "deprecatedCount",
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
    ] {
        if !e[legacy].is_null() {
            why.push(format!("{legacy}: needs to be unset"));
        }
    }
    let series_changed = a
        .old_object
        .as_ref()
        .is_none_or(|o| o["series"] != e["series"]);
    if series_changed && !e["series"].is_null() {
        if e["series"]["count"].as_i64().unwrap_or(0) < 2 {
            why.push("series.count: should be at least 2".into());
        }
        if e["series"]["lastObservedTime"].as_str().is_none() {
            why.push("series.lastObservedTime: Required value".into());
        }
    }
    if let Some(old) = &a.old_object {
        for field in [
            "regarding",
            "reason",
            "note",
            "type",
            "eventTime",
            "action",
            "related",
            "reportingController",
            "reportingInstance",
        ] {
            if old[field] != e[field] {
                why.push(format!("{field}: field is immutable"));
            }
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Records every Event write on `api` and refuses the ones kube-apiserver would.
fn watch_events(api: &ApiServer) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let kept = seen.clone();
    api.set_admission_hook("events.test", move |a| {
        if a.group != "events.k8s.io" || a.resource != "events" {
            return AdmissionVerdict::Allow;
        }
        let mut seen = lock(&kept);
        if let Some(why) = invalid(a) {
            seen.refused.push(why.clone());
            return AdmissionVerdict::deny(why);
        }
        if a.operation != Operation::Delete && !a.dry_run {
            seen.writes.push(Write {
                operation: a.operation,
                object: a.object.clone().unwrap_or_default(),
                old: a.old_object.clone(),
            });
        }
        AdmissionVerdict::Allow
    });
    seen
}

struct Guard {
    api: ApiServer,
    running: Running,
    pki: TestPki,
    seen: Arc<Mutex<Seen>>,
    _dir: TempDir,
}

impl Guard {
    async fn start() -> Guard {
        let api = guard::standin().await;
        let seen = watch_events(&api);
        let dir = TempDir::new("events");
        let pki = TestPki::new(dir.path());
        let config = quorumguard_cli::server::ServeConfig {
            pod_name: Some("quorumguard-test".into()),
            events: true,
            ..guard::config(&pki, Duration::from_secs(5))
        };
        let running = guard::start(config, &api).await;
        Guard {
            api,
            running,
            pki,
            seen,
            _dir: dir,
        }
    }

    /// Records etcd health of cluster `test`: members cp-{x}.
    fn health(&self, up: &[(&str, bool)]) {
        self.running
            .state
            .set_health(NS, "test", members(up), Instant::now());
    }

    /// Sends a review that must be denied with `reason`; returns the message it got.
    async fn denied(&self, path: &str, body: &Value, reason: &str) -> String {
        let a = review(self.running.addr, self.pki.client(&[b"h2"]), path, body)
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        assert_eq!((a.allowed, a.reason.as_str()), (false, reason), "{a:?}");
        a.message
    }

    /// Waits (bounded) until `n` Event writes were seen or one was refused; returns them.
    async fn writes(&self, n: usize) -> Vec<Write> {
        let deadline = Instant::now() + STEP;
        for _ in 0..1000 {
            {
                let seen = lock(&self.seen);
                assert!(seen.refused.is_empty(), "refused: {:?}", seen.refused);
                if seen.writes.len() >= n || Instant::now() > deadline {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Anything more would have come by now: the publisher has nothing else queued.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let seen = lock(&self.seen);
        assert!(seen.refused.is_empty(), "refused: {:?}", seen.refused);
        seen.writes.clone()
    }

    /// The stored Events about `kind` `name`, by note.
    fn events_about(&self, kind: &str, name: &str) -> Vec<Value> {
        let ar = kube::api::ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&());
        let mut events: Vec<Value> = self
            .api
            .list(&ar)
            .into_iter()
            .filter(|e| e["regarding"]["kind"] == kind && e["regarding"]["name"] == name)
            .collect();
        events.sort_by(|a, b| a["note"].as_str().cmp(&b["note"].as_str()));
        events
    }

    /// (verb, path) of every Event write request received, in order.
    fn event_requests(&self) -> Vec<(String, String)> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.path.starts_with(EVENTS) && r.verb != "list" && r.verb != "get")
            .map(|r| (r.verb, r.path))
            .collect()
    }
}

/// Whether `note` carries `message`: whole, or up to the 1 kB cut (marked `...`).
fn carries(note: &str, message: &str) -> bool {
    if note.contains(message) {
        return true;
    }
    let Some(shown) = note.strip_suffix("...") else {
        return false;
    };
    let head: String = message.chars().take(40).collect();
    shown
        .find(&head)
        .is_some_and(|at| message.starts_with(&shown[at..]))
}

/// The one stored Event whose note names `user` and carries `message`; fails listing them all.
fn event_of<'a>(events: &'a [Value], user: &str, message: &str) -> &'a Value {
    let found: Vec<&Value> = events
        .iter()
        .filter(|e| {
            let note = e["note"].as_str().unwrap_or("");
            note.contains(user) && carries(note, message)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one Event naming {user} with the message {message:?}; the Events:\n{}",
        shown(events)
    );
    found[0]
}

fn shown(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "  {} {} x{} {}: {}",
                e["metadata"]["name"].as_str().unwrap_or("?"),
                e["reason"].as_str().unwrap_or("?"),
                e["series"]["count"].as_i64().unwrap_or(1),
                e["action"].as_str().unwrap_or("?"),
                e["note"].as_str().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn count(e: &Value) -> i64 {
    e["series"]["count"].as_i64().unwrap_or(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_requester_denied_on_one_machine_has_an_event_with_their_message() {
    let g = Guard::start().await;
    // cp-c is down: deleting test-cp-a would leave 1 healthy of 2, no quorum.
    g.health(&[("a", true), ("b", true), ("c", false)]);
    let delete = |user: &str, n: usize| delete_review("cp-a", user, false, &format!("uid-{n}"));
    let to_jane = g
        .denied(MACHINES, &delete(JANE, 1), "WouldLoseQuorum")
        .await;
    let to_kcp = g
        .denied(MACHINES, &delete(KCP_CONTROLLER, 2), "WouldLoseQuorum")
        .await;
    // Then cp-b is the one down: the admin gets the same reason with another message.
    g.health(&[("a", true), ("b", false), ("c", true)]);
    let to_admin = g
        .denied(MACHINES, &delete(ADMIN, 3), "WouldLoseQuorum")
        .await;
    assert_ne!(to_admin, to_jane, "the admin's message differs");
    // cp-c down again: jane asks again and gets her first message again.
    g.health(&[("a", true), ("b", true), ("c", false)]);
    let again = g
        .denied(MACHINES, &delete(JANE, 4), "WouldLoseQuorum")
        .await;
    assert_eq!(again, to_jane, "jane's repeat gets the same message");

    let writes = g.writes(4).await;
    let events = g.events_about("Machine", "test-cp-a");
    println!("Events about Machine test-cp-a:\n{}", shown(&events));
    assert_eq!(
        events.len(),
        3,
        "one Event per requester:\n{}",
        shown(&events)
    );
    let jane = event_of(&events, JANE, &to_jane);
    let kcp = event_of(&events, KCP_CONTROLLER, &to_kcp);
    let admin = event_of(&events, ADMIN, &to_admin);
    assert_eq!(
        (count(jane), count(kcp), count(admin)),
        (2, 1, 1),
        "jane's repeat is a series of her Event:\n{}",
        shown(&events)
    );
    for e in [jane, kcp, admin] {
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["reason"], "WouldLoseQuorum");
        assert_eq!(e["reportingController"], "quorumguard");
        assert_eq!(e["reportingInstance"], "quorumguard-test");
        assert_eq!(e["regarding"]["apiVersion"], "cluster.x-k8s.io/v1beta2");
        assert_eq!(e["regarding"]["namespace"], NS);
    }
    // The requests: one create per Event, then one patch of jane's for her repeat.
    let jane_path = format!(
        "{EVENTS}/{}",
        jane["metadata"]["name"].as_str().unwrap_or("")
    );
    assert_eq!(
        g.event_requests(),
        vec![
            ("create".to_string(), EVENTS.to_string()),
            ("create".to_string(), EVENTS.to_string()),
            ("create".to_string(), EVENTS.to_string()),
            ("patch".to_string(), jane_path),
        ]
    );
    let ops: Vec<Operation> = writes.iter().map(|w| w.operation).collect();
    assert_eq!(
        ops,
        [
            Operation::Create,
            Operation::Create,
            Operation::Create,
            Operation::Update
        ]
    );
    // The patch changed nothing but the series.
    let patch = &writes[3];
    let mut before = patch.old.clone().unwrap_or_default();
    let mut after = patch.object.clone();
    for v in [&mut before, &mut after] {
        if let Some(o) = v.as_object_mut() {
            o.remove("series");
            o.remove("metadata");
        }
    }
    assert_eq!(before, after, "a repeat only counts");
    assert!(patch.object["series"]["lastObservedTime"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_different_kcp_denials_are_two_events() {
    let g = Guard::start().await;
    // cp-b and cp-c are down: etcd has lost quorum, and no member can be added (the KCP is
    // v1.32: joins add learners, so one member down alone would not refuse a scale-up).
    g.health(&[("a", true), ("b", false), ("c", false)]);
    let by_scale = replicas_review(3, 5, JANE, true, "uid-scale");
    let by_patch = replicas_review(3, 7, JANE, false, "uid-patch");
    let to_scale = g.denied(KCPS, &by_scale, "QuorumLost").await;
    let to_patch = g.denied(KCPS, &by_patch, "QuorumLost").await;
    assert_ne!(to_scale, to_patch);
    // The KCP controller, refused the same scale-up: its own Event.
    let by_controller = replicas_review(3, 5, KCP_CONTROLLER, false, "uid-ctl");
    let to_controller = g.denied(KCPS, &by_controller, "QuorumLost").await;
    let writes = g.writes(3).await;
    let events = g.events_about("KubeadmControlPlane", "test-controlplane");
    println!("Events about KCP test-controlplane:\n{}", shown(&events));
    assert_eq!(events.len(), 3, "{}", shown(&events));
    for (user, message) in [
        (JANE, &to_scale),
        (JANE, &to_patch),
        (KCP_CONTROLLER, &to_controller),
    ] {
        let e = event_of(&events, user, message);
        assert_eq!(count(e), 1, "{}", shown(&events));
        assert_eq!(e["regarding"]["kind"], "KubeadmControlPlane");
    }
    assert!(writes.iter().all(|w| w.operation == Operation::Create));
    assert_eq!(g.event_requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_glass_by_two_people_is_two_events() {
    let g = Guard::start().await;
    g.health(&[("a", true), ("b", true), ("c", false)]);
    let glass = |user: &str, why: &str, uid: &str| {
        let mut r = delete_review("cp-a", user, false, uid);
        r["request"]["oldObject"]["metadata"]["annotations"]["quorumguard.io/allow-unsafe-delete"] =
            json!(why);
        r
    };
    for (user, why, uid) in [
        (JANE, "INC-7: node a is being replaced by hand", "uid-1"),
        (ADMIN, "INC-8: the disk of node a is gone", "uid-2"),
    ] {
        let a = review(
            g.running.addr,
            g.pki.client(&[b"h2"]),
            MACHINES,
            &glass(user, why, uid),
        )
        .await
        .expect("review");
        assert_eq!(
            (a.allowed, a.reason.as_str()),
            (true, "BreakGlass"),
            "{a:?}"
        );
    }
    g.writes(2).await;
    let events = g.events_about("Machine", "test-cp-a");
    println!("Events about Machine test-cp-a:\n{}", shown(&events));
    assert_eq!(events.len(), 2, "{}", shown(&events));
    event_of(&events, JANE, "INC-7");
    event_of(&events, ADMIN, "INC-8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_whose_event_has_gone_is_a_new_event() {
    let g = Guard::start().await;
    g.health(&[("a", true), ("b", true), ("c", false)]);
    let delete = |n: usize| delete_review("cp-a", JANE, false, &format!("uid-{n}"));
    let told = g.denied(MACHINES, &delete(1), "WouldLoseQuorum").await;
    g.writes(1).await;
    let first = g.events_about("Machine", "test-cp-a");
    assert_eq!(first.len(), 1, "{}", shown(&first));
    let name = first[0]["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    // Deleted, or expired by kube-apiserver's --event-ttl.
    let ar = kube::api::ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&());
    assert!(g.api.remove(&ar, NS, &name).is_some(), "remove {name}");
    assert_eq!(
        g.denied(MACHINES, &delete(2), "WouldLoseQuorum").await,
        told
    );
    g.writes(2).await;
    let events = g.events_about("Machine", "test-cp-a");
    assert_eq!(events.len(), 1, "{}", shown(&events));
    let e = event_of(&events, JANE, &told);
    assert_ne!(e["metadata"]["name"], name.as_str(), "a new Event");
    assert_eq!(count(e), 1);
    assert_eq!(
        g.event_requests(),
        vec![
            ("create".to_string(), EVENTS.to_string()),
            ("patch".to_string(), format!("{EVENTS}/{name}")),
            ("create".to_string(), EVENTS.to_string()),
        ]
    );
}

/// The value of `quorumguard_events_dropped_total{reason="<reason>"}` on the admin port.
async fn dropped(g: &Guard, reason: &str) -> f64 {
    let (_, text) = testkit::https::get_plain(g.running.admin_addr, "/metrics").await;
    let series = format!("quorumguard_events_dropped_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series}in /metrics"))
}

/// A flood of forged denials cannot flood etcd with Events: 200 reviews about one Machine
/// from 200 made-up users, then 100 from one user about it; the object's limit (10 at once)
/// holds, every other notice is counted as dropped, and each Event's note says the user is only
/// the one the review names (client certificates are not verified here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_denials_is_limited_per_object_and_counted() {
    let g = Guard::start().await;
    g.health(&[("a", true), ("b", true), ("c", false)]);
    for i in 0..200 {
        let body = delete_review(
            "cp-a",
            &format!("user-{i}@example.com"),
            false,
            &format!("f{i}"),
        );
        g.denied(MACHINES, &body, "WouldLoseQuorum").await;
    }
    for i in 0..100 {
        let body = delete_review("cp-a", JANE, false, &format!("j{i}"));
        g.denied(MACHINES, &body, "WouldLoseQuorum").await;
    }
    let writes = g.writes(10).await;
    assert!(writes.len() <= 10, "{} Event writes", writes.len());
    let events = g.events_about("Machine", "test-cp-a");
    assert!(
        !events.is_empty() && events.len() <= 10,
        "{}",
        shown(&events)
    );
    for e in &events {
        let note = e["note"].as_str().unwrap_or_default();
        assert!(
            note.contains("(review names user ") && note.contains("not authenticated)"),
            "{note}"
        );
    }
    let limited = dropped(&g, "object_limit").await + dropped(&g, "requester_limit").await;
    assert!(limited >= 290.0, "dropped over a limit: {limited}");
    assert_eq!(dropped(&g, "queue_full").await, 0.0);
}
