//! The running webhook over real HTTPS (h2, as kube-apiserver speaks to webhooks), fed by real
//! watches of the API-server stand-in, answering AdmissionReview bodies shaped exactly like
//! those kube-apiserver 1.32 sent (tests/fixtures/admission-reviews/).
//!
//! etcd health is injected into the state directly here: the prober that fills it from real
//! etcd is the status enricher's (issue 4). Everything else runs as in production.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumguard_cli::server::{self, Running, ServeConfig};
use quorumguard_engine::Policy;
use serde_json::{Value, json};
use testkit::apiserver::{ApiServer, kcp_resource};
use testkit::https::{STEP, TempDir, TestPki, get_plain, post};
use testkit::reviews::{
    KCP_CONTROLLER, NS, cluster_object, fixture, kcp_object, machine_named, stored,
};

/// The fixture KCP's name.
const KCP: &str = "test-controlplane";

/// The fixture Machine renamed to `test-cp-{x}` with node `cp-{x}`.
fn machine_object(x: &str) -> Value {
    machine_named(&format!("test-cp-{x}"), &format!("cp-{x}"))
}

struct World {
    api: ApiServer,
    running: Option<Running>,
    pki: TestPki,
    _dir: TempDir,
}

impl World {
    fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    /// Sets etcd health of cluster `test`: members cp-{x}, healthy or not.
    fn health(&self, members: &[(&str, bool)]) {
        self.running().state.set_health(
            NS,
            "test",
            testkit::reviews::members(members),
            Instant::now(),
        );
    }

    /// Sends a review body to `path` over h2; returns the HTTP status and the parsed body.
    async fn review(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, bytes) = post(
            self.running().addr,
            self.pki.client(&[b"h2"]),
            path,
            "application/json",
            serde_json::to_vec(body).expect("json"),
        )
        .await;
        let v = serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status.as_u16(), v)
    }

    async fn delete(&self, x: &str, user: &str) -> Value {
        let mut r = fixture("machine-delete-by-user.json");
        r["request"]["uid"] = json!(format!("uid-delete-{x}-{user}"));
        r["request"]["name"] = json!(format!("test-cp-{x}"));
        r["request"]["userInfo"]["username"] = json!(user);
        r["request"]["oldObject"] = machine_object(x);
        let (code, v) = self.review("/validate/machines", &r).await;
        assert_eq!(code, 200, "{v}");
        v["response"].clone()
    }
}

async fn world(machines: &[&str]) -> World {
    let api = ApiServer::start().await.expect("stand-in");
    api.insert(cluster_object(json!({}))).expect("cluster");
    api.insert(stored(kcp_object())).expect("kcp");
    api.insert(testkit::seed::health_check(NS, "test", "test-controlplane"))
        .expect("machine health check");
    for x in machines {
        api.insert(stored(machine_object(x))).expect("machine");
    }
    start(api, Policy::default()).await
}

async fn start(api: ApiServer, policy: Policy) -> World {
    let dir = TempDir::new("webhook");
    let pki = TestPki::new(dir.path());
    let config = test_config(&pki, policy);
    let client = api.client().expect("client");
    let running = server::start(config, client).await.expect("server starts");
    let w = World {
        api,
        running: Some(running),
        pki,
        _dir: dir,
    };
    eventually("caches synced", || w.running().state.all_synced()).await;
    w
}

/// The server's settings for tests: loopback ports, fast reload, short shutdown.
fn test_config(pki: &TestPki, policy: Policy) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        tls_cert: pki.cert_file.clone(),
        tls_key: pki.key_file.clone(),
        tls_reload_interval: Duration::from_millis(100),
        client_auth: None,
        policy,
        reservation_ttl: Duration::from_secs(30),
        shutdown_delay: Duration::from_millis(200),
        shutdown_grace: Duration::from_secs(5),
        pod_name: Some("quorumguard-test".into()),
        events: true,
        // These tests set etcd health themselves; live_health.rs probes real etcd.
        sweep: None,
        status: None,
        autopilot: None,
    }
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + STEP;
    for _ in 0..500 {
        if done() {
            return;
        }
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

fn verdict(resp: &Value) -> (bool, String) {
    (
        resp["allowed"].as_bool().expect("allowed"),
        resp["auditAnnotations"]["reason"]
            .as_str()
            .expect("reason annotation")
            .to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_delete_rules_over_https() {
    let w = world(&["a", "b", "c"]).await;
    w.health(&[("a", true), ("b", true), ("c", false)]);

    // A human deleting a healthy Machine while cp-c is down: quorum would be lost.
    let r = w.delete("a", "jane@example.com").await;
    assert_eq!(verdict(&r), (false, "WouldLoseQuorum".into()), "{r}");
    assert_eq!(r["status"]["code"], 403);
    assert_eq!(r["status"]["reason"], "WouldLoseQuorum");
    let msg = r["status"]["message"].as_str().expect("message");
    for needle in [
        "capi-test/test-cp-a",
        "voting 3",
        "healthy 2",
        "cp-c",
        "Ask KCP to replace Machine capi-test/test-cp-c",
    ] {
        assert!(msg.contains(needle), "{needle} missing: {msg}");
    }
    assert!(msg.contains("cluster.x-k8s.io/remediate-machine"), "{msg}");
    // The KCP controller removing the unhealthy member's Machine: allowed (remediation).
    let r = w.delete("c", KCP_CONTROLLER).await;
    assert_eq!(verdict(&r), (true, "QuorumSafe".into()), "{r}");
    assert!(
        r["warnings"].as_array().is_some(),
        "tolerance 0 warning: {r}"
    );

    // All healthy, cp-c's deletion still pending (reserved): deleting cp-b too would have KCP's
    // replacements join a single healthy member (1 of 2), so the quorum rule refuses it first,
    // naming the deletion to wait for.
    w.health(&[("a", true), ("b", true), ("c", true)]);
    let r = w.delete("b", "jane@example.com").await;
    assert_eq!(verdict(&r), (false, "PendingJoin".into()), "{r}");
    let msg = r["status"]["message"].as_str().expect("message");
    assert!(msg.contains("Machine test-cp-c"), "{msg}");

    // All healthy and nothing pending: a human is held to the desired replicas.
    let w = world(&["a", "b", "c"]).await;
    w.health(&[("a", true), ("b", true), ("c", true)]);
    let r = w.delete("b", "jane@example.com").await;
    assert_eq!(verdict(&r), (false, "BelowDesiredReplicas".into()), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixtures_as_sent_by_kube_apiserver() {
    let w = world(&["a", "b", "c"]).await;
    w.health(&[("a", true), ("b", true), ("c", true)]);

    // The exact bodies, uid echoed.
    for (file, path, allowed, reason) in [
        (
            "machine-delete-by-user.json",
            "/validate/machines",
            false,
            "BelowDesiredReplicas",
        ),
        (
            "machine-delete-by-kcp-controller.json",
            "/validate/machines",
            true,
            "QuorumSafe",
        ),
        (
            "kcp-update-replicas-5-to-3.json",
            "/validate/kubeadmcontrolplanes",
            true,
            "ScaleDownSafe",
        ),
        (
            "kcp-update-version.json",
            "/validate/kubeadmcontrolplanes",
            true,
            "RolloutAllowed",
        ),
        (
            "kcp-scale-subresource-3-to-5.json",
            "/validate/kubeadmcontrolplanes",
            true,
            "ScaleUpSafe",
        ),
    ] {
        let body = fixture(file);
        let (code, v) = w.review(path, &body).await;
        assert_eq!(code, 200, "{file}: {v}");
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1", "{file}");
        assert_eq!(v["kind"], "AdmissionReview", "{file}");
        assert_eq!(
            v["response"]["uid"], body["request"]["uid"],
            "{file}: uid echo"
        );
        assert_eq!(
            verdict(&v["response"]),
            (allowed, reason.to_string()),
            "{file}: {v}"
        );
    }

    // With cp-c down, the scale subresource 3 -> 5 is refused.
    w.health(&[("a", true), ("b", true), ("c", false)]);
    let (_, v) = w
        .review(
            "/validate/kubeadmcontrolplanes",
            &fixture("kcp-scale-subresource-3-to-5.json"),
        )
        .await;
    assert_eq!(
        verdict(&v["response"]),
        (false, "ScaleUpWouldLoseQuorum".into()),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1beta1_machine_is_judged_like_v1beta2() {
    let w = world(&["a", "b", "c"]).await;
    w.health(&[("a", true), ("b", true), ("c", false)]);
    let mut r = fixture("machine-delete-by-user.json");
    r["request"]["kind"]["version"] = json!("v1beta1");
    r["request"]["resource"]["version"] = json!("v1beta1");
    let old = &mut r["request"]["oldObject"];
    old["apiVersion"] = json!("cluster.x-k8s.io/v1beta1");
    old["status"]["nodeRef"] = json!({"apiVersion": "v1", "kind": "Node", "name": "cp-a"});
    let (code, v) = w.review("/validate/machines", &r).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        verdict(&v["response"]),
        (false, "WouldLoseQuorum".into()),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_same_verdict_no_side_effects() {
    let w = world(&["a", "b", "c", "d"]).await;
    w.health(&[("a", true), ("b", true), ("c", true), ("d", true)]);
    // Four machines for three replicas: a human may delete one. Dry run first.
    let mut r = fixture("machine-delete-dry-run.json");
    r["request"]["userInfo"]["username"] = json!("jane@example.com");
    let (_, v) = w.review("/validate/machines", &r).await;
    assert_eq!(verdict(&v["response"]), (true, "QuorumSafe".into()), "{v}");
    assert_eq!(
        w.running().webhook.reservations(),
        0,
        "dry run reserves nothing"
    );
    // The same request for real reserves the deletion...
    let resp = w.delete("a", "jane@example.com").await;
    assert_eq!(verdict(&resp), (true, "QuorumSafe".into()), "{resp}");
    assert_eq!(w.running().webhook.reservations(), 1);
    // ...so a second human deletion is judged as if the first had happened.
    let resp = w.delete("b", "jane@example.com").await;
    assert_eq!(
        verdict(&resp),
        (false, "BelowDesiredReplicas".into()),
        "{resp}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_scale_up_is_counted_by_the_next_deletion() {
    // 4 members, d down (the fixture KCP says 3 replicas; v1.28: voting joins). The
    // scale-up-then-delete race: 4 -> 5 is allowed (3 healthy of 5), and then a person's
    // deletion of healthy a must count the fifth member, which votes before it is healthy (2
    // healthy of 4), even before the cache shows spec.replicas 5.
    let w = world(&["a", "b", "c", "d"]).await;
    w.health(&[("a", true), ("b", true), ("c", true), ("d", false)]);
    let delete_a = |dry_run: bool| {
        let mut r = fixture("machine-delete-dry-run.json");
        r["request"]["uid"] = json!(format!("uid-a-{dry_run}"));
        r["request"]["name"] = json!("test-cp-a");
        r["request"]["userInfo"]["username"] = json!(KCP_CONTROLLER);
        r["request"]["oldObject"] = machine_object("a");
        r["request"]["dryRun"] = json!(dry_run);
        r
    };
    let scale = |dry_run: bool| {
        let mut r =
            testkit::guard::replicas_review(4, 5, "admin", true, &format!("uid-s-{dry_run}"));
        r["request"]["dryRun"] = json!(dry_run);
        r
    };
    let (_, v) = w.review("/validate/machines", &delete_a(true)).await;
    assert_eq!(verdict(&v["response"]), (true, "QuorumSafe".into()), "{v}");
    // A dry-run scale-up reserves nothing.
    let (_, v) = w
        .review("/validate/kubeadmcontrolplanes", &scale(true))
        .await;
    assert_eq!(verdict(&v["response"]), (true, "ScaleUpSafe".into()), "{v}");
    assert_eq!(w.running().webhook.reservations(), 0);
    let (_, v) = w.review("/validate/machines", &delete_a(true)).await;
    assert_eq!(verdict(&v["response"]), (true, "QuorumSafe".into()), "{v}");
    // The real one does.
    let (_, v) = w
        .review("/validate/kubeadmcontrolplanes", &scale(false))
        .await;
    assert_eq!(verdict(&v["response"]), (true, "ScaleUpSafe".into()), "{v}");
    assert_eq!(w.running().webhook.reservations(), 1);
    // A person's deletion of a counts the fifth member (KCP may be adding it at this moment).
    let mut by_person = delete_a(true);
    by_person["request"]["userInfo"]["username"] = json!("jane@example.com");
    let (_, v) = w.review("/validate/machines", &by_person).await;
    let (allowed, reason) = verdict(&v["response"]);
    assert_eq!((allowed, reason.as_str()), (false, "PendingJoin"), "{v}");
    let message = v["response"]["status"]["message"].as_str().unwrap_or("");
    assert!(message.contains("spec.replicas 5"), "{message}");
    // KCP's own deletion of a (a remediation) does not: KCP remediates before it scales up and
    // creates no Machine while one is being deleted, so the fifth member comes after a has gone
    // (issue 36); its removal alone keeps 2 healthy of 3.
    let (_, v) = w.review("/validate/machines", &delete_a(true)).await;
    assert_eq!(verdict(&v["response"]), (true, "QuorumSafe".into()), "{v}");
    // Removing the down member stays the way forward.
    let mut r = delete_a(true);
    r["request"]["name"] = json!("test-cp-d");
    r["request"]["oldObject"] = machine_object("d");
    let (_, v) = w.review("/validate/machines", &r).await;
    assert_eq!(verdict(&v["response"]), (true, "QuorumSafe".into()), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_scale_down_ends_an_earlier_scale_ups_reservation_once_the_cache_shows_it() {
    // The model check's finding (docs/rules.md, "What the checker found"): a person scales up,
    // then down before the cache has shown the scale-up. KCP's scale-down deletions were judged
    // against the reserved replicas (PendingJoin) until --reservation-ttl, since the cache never
    // shows that many. Here 2 Machines, both healthy: 2 -> 3, then 3 -> 1.
    let w = world(&["a", "b"]).await;
    w.health(&[("a", true), ("b", true)]);
    let set_replicas = |n: i64| {
        w.api
            .modify(&kcp_resource(), NS, KCP, |k| {
                k["spec"]["replicas"] = json!(n)
            })
            .expect("spec.replicas");
    };
    set_replicas(2);
    eventually("the cache shows spec.replicas 2", || {
        w.running().state.kcp_replicas(NS, KCP) == Some(2)
    })
    .await;
    let scale = |from: i64, to: i64| {
        testkit::guard::replicas_review(from, to, "admin", true, &format!("uid-{from}-{to}"))
    };
    let (_, v) = w
        .review("/validate/kubeadmcontrolplanes", &scale(2, 3))
        .await;
    assert_eq!(verdict(&v["response"]), (true, "ScaleUpSafe".into()), "{v}");
    assert_eq!(w.running().webhook.reservations(), 1);
    let (_, v) = w
        .review("/validate/kubeadmcontrolplanes", &scale(3, 1))
        .await;
    assert_eq!(
        verdict(&v["response"]),
        (true, "ScaleDownSafe".into()),
        "{v}"
    );
    // Until the cache shows the scale-down, the scale-up's reservation stands: the API server
    // may still refuse the scale-down after this allow, and spec.replicas stay 3.
    assert_eq!(w.running().webhook.reservations(), 1);
    set_replicas(1);
    eventually("the cache shows spec.replicas 1", || {
        w.running().state.kcp_replicas(NS, KCP) == Some(1)
    })
    .await;
    // KCP's scale-down deletion is judged against 1 replica: no member is about to join.
    let mut r = fixture("machine-delete-dry-run.json");
    r["request"]["uid"] = json!("uid-a");
    r["request"]["name"] = json!("test-cp-a");
    r["request"]["userInfo"]["username"] = json!(KCP_CONTROLLER);
    r["request"]["oldObject"] = machine_object("a");
    let (_, v) = w.review("/validate/machines", &r).await;
    assert_eq!(verdict(&v["response"]), (true, "QuorumSafe".into()), "{v}");
    assert_eq!(w.running().webhook.reservations(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deletions_at_most_one_allowed() {
    // Mid-rollout: 4 machines and members for 3 replicas, all healthy. Humans race to delete
    // three different Machines: one may go; after it, the others would leave fewer than 3.
    let w = Arc::new(world(&["a", "b", "c", "d"]).await);
    w.health(&[("a", true), ("b", true), ("c", true), ("d", true)]);
    let mut tasks = Vec::new();
    for x in ["a", "b", "c", "a", "b", "c"] {
        let w = w.clone();
        tasks.push(tokio::spawn(async move {
            w.delete(x, "jane@example.com").await
        }));
    }
    let mut allowed = std::collections::BTreeSet::new();
    for t in tasks {
        let r = t.await.expect("task");
        if r["allowed"] == true {
            allowed.insert(r["uid"].as_str().expect("uid").to_string());
        }
    }
    assert_eq!(
        allowed.len(),
        1,
        "exactly one Machine may be deleted: {allowed:?}"
    );

    // Quorum, not replicas: 4 members with d down; the KCP controller races to delete a and
    // b. Either alone keeps quorum (2 healthy of 3); both would leave 1 healthy of 2.
    let w = Arc::new(world(&["a", "b", "c", "d"]).await);
    w.health(&[("a", true), ("b", true), ("c", true), ("d", false)]);
    let (ra, rb) = tokio::join!(w.delete("a", KCP_CONTROLLER), w.delete("b", KCP_CONTROLLER));
    let outcomes = [verdict(&ra), verdict(&rb)];
    assert_eq!(
        outcomes.iter().filter(|(a, _)| *a).count(),
        1,
        "one of two: {outcomes:?}"
    );
    assert!(
        outcomes.contains(&(false, "PendingDeletions".into())),
        "{outcomes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_bodies_are_400() {
    let w = world(&["a", "b", "c"]).await;
    let addr = w.running().addr;
    let send = |ct: &'static str, body: Vec<u8>| {
        post(addr, w.pki.client(&[b"h2"]), "/validate/machines", ct, body)
    };
    let (code, body) = send("application/json", b"{not json".to_vec()).await;
    assert_eq!(code, 400);
    assert!(String::from_utf8_lossy(&body).contains("not valid JSON"));
    let (code, body) = send(
        "application/json",
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
    )
    .await;
    assert_eq!(code, 400);
    assert!(String::from_utf8_lossy(&body).contains("no request"));
    let mut v1beta1 = fixture("machine-delete-by-user.json");
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let (code, body) = send(
        "application/json",
        serde_json::to_vec(&v1beta1).expect("json"),
    )
    .await;
    assert_eq!(code, 400);
    assert!(String::from_utf8_lossy(&body).contains("admissionReviewVersions"));
    let mut no_old = fixture("machine-delete-by-user.json");
    no_old["request"]["oldObject"] = Value::Null;
    let (code, body) = send(
        "application/json",
        serde_json::to_vec(&no_old).expect("json"),
    )
    .await;
    assert_eq!(code, 400);
    assert!(
        String::from_utf8_lossy(&body).contains("oldObject"),
        "{body:?}"
    );
    let (code, _) = send("text/plain", b"{}".to_vec()).await;
    assert_eq!(code, 415);
    // 8 MiB: refused before parsing.
    let big = vec![b' '; 8 * 1024 * 1024];
    let (code, body) = send("application/json", big).await;
    assert_eq!(code, 400);
    assert!(String::from_utf8_lossy(&body).contains("7 MiB"), "{body:?}");
    // A kind this endpoint does not judge: allowed, with a warning, never a 500.
    let mut pod = fixture("machine-delete-by-user.json");
    pod["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    let (code, v) = w.review("/validate/machines", &pod).await;
    assert_eq!(code, 200);
    assert_eq!(v["response"]["allowed"], true);
    assert!(
        v["response"]["warnings"][0]
            .as_str()
            .expect("warning")
            .contains("does not judge")
    );
    // The server still answers good requests.
    w.health(&[("a", true), ("b", true), ("c", true)]);
    let r = w.delete("a", KCP_CONTROLLER).await;
    assert_eq!(r["allowed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_flows_from_watch_into_decisions() {
    let w = world(&["a", "b", "c"]).await;
    w.health(&[("a", true), ("b", true), ("c", true), ("d", true)]);
    // Three machines for three replicas: a human may not delete one.
    assert_eq!(
        verdict(&w.delete("a", "jane@example.com").await),
        (false, "BelowDesiredReplicas".into())
    );
    // A fourth Machine appears through the API: the watch brings it, and the same request is
    // now allowed.
    w.api.insert(stored(machine_object("d"))).expect("insert d");
    eventually("machine d in the cache", || {
        w.running()
            .state
            .machine_deleting(NS, "test-cp-d")
            .is_some()
    })
    .await;
    assert_eq!(
        verdict(&w.delete("a", "jane@example.com").await),
        (true, "QuorumSafe".into())
    );
    // A denial is recorded as an Event on the Machine.
    w.health(&[("a", true), ("b", true), ("c", false), ("d", true)]);
    let r = w.delete("b", KCP_CONTROLLER).await;
    assert_eq!(r["allowed"], false, "{r}");
    let events = kube::api::ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&());
    eventually("a denial Event", || {
        w.api
            .list(&events)
            .iter()
            .any(|e| e["regarding"]["name"] == "test-cp-b" && e["type"] == "Warning")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_cache_sync_and_shutdown() {
    let api = ApiServer::start().await.expect("stand-in");
    api.insert(cluster_object(json!({}))).expect("cluster");
    // Hold the Machine list back so the caches cannot sync yet.
    api.delay_next(
        Some("list"),
        "/apis/cluster.x-k8s.io/v1beta2/machines",
        1,
        Duration::from_secs(2),
    );
    let dir = TempDir::new("ready");
    let pki = TestPki::new(dir.path());
    let config = ServeConfig {
        shutdown_delay: Duration::from_millis(500),
        events: false,
        ..test_config(&pki, Policy::default())
    };
    let running = server::start(config, api.client().expect("client"))
        .await
        .expect("start");
    let admin = running.admin_addr;
    let (code, body) = get_plain(admin, "/readyz").await;
    assert_eq!(code.as_u16(), 503, "{body}");
    assert!(body.contains("cache"), "{body}");
    // A review before the caches sync cannot be proven safe: a human is refused, saying why.
    let (code, bytes) = post(
        running.addr,
        pki.client(&[b"h2"]),
        "/validate/machines",
        "application/json",
        serde_json::to_vec(&fixture("machine-delete-by-user.json")).expect("json"),
    )
    .await;
    assert_eq!(code.as_u16(), 200);
    let v: Value = serde_json::from_slice(&bytes).expect("review");
    assert_eq!(
        verdict(&v["response"]),
        (false, "HealthUnknown".into()),
        "{v}"
    );
    assert!(
        v["response"]["status"]["message"]
            .as_str()
            .expect("message")
            .contains("not synced"),
        "{v}"
    );
    assert_eq!(get_plain(admin, "/livez").await.0.as_u16(), 200);
    let deadline = Instant::now() + STEP;
    loop {
        if get_plain(admin, "/readyz").await.0.as_u16() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (code, metrics) = get_plain(admin, "/metrics").await;
    assert_eq!(code.as_u16(), 200);
    assert!(metrics.contains("quorumguard_cache_synced"), "{metrics}");
    // Shutdown: not ready at once, then the listener closes.
    let readiness = running.readiness.clone();
    let addr = running.addr;
    let stop = tokio::spawn(running.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!readiness.is_ready(), "not ready while shutting down");
    tokio::time::timeout(STEP, stop)
        .await
        .expect("shutdown in time")
        .expect("task");
    assert!(
        testkit::https::connect(addr, pki.client(&[b"h2"]))
            .await
            .is_err(),
        "no new connections after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_a_review_in_flight() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut w = world(&["a", "b", "c"]).await;
    w.health(&[("a", true), ("b", true), ("c", true)]);
    let addr = w.running().addr;
    let body = serde_json::to_vec(&fixture("machine-delete-by-kcp-controller.json")).expect("json");
    let mut stream = testkit::https::connect(addr, w.pki.client(&[b"http/1.1"]))
        .await
        .expect("connect");
    let head = format!(
        "POST /validate/machines?timeout=5s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let (first, rest) = body.split_at(body.len() / 2);
    stream.write_all(first).await.expect("first half");
    stream.flush().await.expect("flush");
    // SIGTERM's path: shutdown starts while the review is half sent.
    let running = w.running.take().expect("running");
    let readiness = running.readiness.clone();
    let stop = tokio::spawn(running.shutdown());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!readiness.is_ready());
    stream.write_all(rest).await.expect("second half");
    stream.flush().await.expect("flush");
    let mut response = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = Instant::now() + STEP;
    while !String::from_utf8_lossy(&response).contains("\"uid\"") {
        assert!(
            Instant::now() < deadline,
            "no response to the in-flight review"
        );
        match tokio::time::timeout(STEP, stream.read(&mut buf)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => response.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("read: {e}"),
            Err(_) => panic!("read timed out"),
        }
    }
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("QuorumSafe"), "{text}");
    drop(stream);
    tokio::time::timeout(STEP, stop)
        .await
        .expect("shutdown within the grace period")
        .expect("task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_glass_is_allowed_with_a_warning_and_an_event() {
    let w = world(&["a", "b", "c"]).await;
    w.health(&[("a", true), ("b", true), ("c", false)]);
    let mut r = fixture("machine-delete-by-user.json");
    r["request"]["oldObject"]["metadata"]["annotations"]["quorumguard.io/allow-unsafe-delete"] =
        json!("INC-7: node a is being replaced by hand");
    let (_, v) = w.review("/validate/machines", &r).await;
    assert_eq!(verdict(&v["response"]), (true, "BreakGlass".into()), "{v}");
    let warning = v["response"]["warnings"][0].as_str().expect("warning");
    assert!(
        warning.contains("INC-7") && warning.contains("WouldLoseQuorum"),
        "{warning}"
    );
    let events = kube::api::ApiResource::erase::<k8s_openapi::api::events::v1::Event>(&());
    eventually("a BreakGlass Event", || {
        w.api
            .list(&events)
            .iter()
            .any(|e| e["regarding"]["name"] == "test-cp-a" && e["reason"] == "BreakGlass")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_server_picks_up_a_new_certificate() {
    let w = world(&["a", "b", "c"]).await;
    let addr = w.running().addr;
    let leaf = |stream: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>| {
        stream.get_ref().1.peer_certificates().expect("certs")[0].clone()
    };
    let before = leaf(
        &testkit::https::connect(addr, w.pki.client(&[b"h2"]))
            .await
            .expect("tls"),
    );
    let new = w.pki.write_leaf("quorumguard-renewed");
    assert_ne!(before, new);
    let deadline = Instant::now() + STEP;
    loop {
        let now = leaf(
            &testkit::https::connect(addr, w.pki.client(&[b"h2"]))
                .await
                .expect("tls"),
        );
        if now == new {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The reload is counted right after the new config is in place.
    let deadline = Instant::now() + STEP;
    loop {
        let (_, metrics) = get_plain(w.running().admin_addr, "/metrics").await;
        if metrics.contains("quorumguard_certificate_reloads_total{result=\"success\"} 1") {
            break;
        }
        assert!(Instant::now() < deadline, "reload never counted: {metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
