//! The API-server stand-in calling quorumguard's admission webhook as kube-apiserver would:
//! driven by the repo's ValidatingWebhookConfiguration, over real HTTPS (verified for the
//! service name `quorumguard-webhook.quorumguard-system.svc` against the CA that signed the
//! serving certificate) to a real `quorumguard serve` on loopback, with real `kube::Client`s
//! (and `kubectl` when it is on PATH) as the users.
//!
//! etcd health is injected into the server's state (as in crates/admission/tests/it/webhook.rs);
//! no sweep runs.

use std::future::Future;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::core::{DynamicObject, Status};
use quorumguard_cli::server::{self, Running, ServeConfig};
use quorumguard_engine::Policy;
use quorumguard_pki::certs::Ca;
use quorumguard_playground::apiserver::{AdmissionVerdict, Operation};
use quorumguard_playground::webhooks::{
    MANIFEST, SERVICE_DNS_NAME, WebhookCall, WebhookDispatcher, WebhookTarget, review_request,
};
use serde_json::json;
use testkit::apiserver::{ApiServer, kcp_resource, machine_resource};
use testkit::https::{STEP, TempDir};
use testkit::reviews::{KCP_CONTROLLER, NS, fixture, machine_named, stored};
use testkit::seed::{self, KCP, wait_for};

const MACHINES: &str = "machines.quorumguard.io";
const KCPS: &str = "kubeadmcontrolplanes.quorumguard.io";
const JANE: &str = "jane@example.com";
const DENIED: &str = "admission webhook \"machines.quorumguard.io\" denied the request: ";

/// Awaits `f` for at most [`STEP`].
async fn bounded<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {STEP:?}"))
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

/// A CA and, in `dir`, a serving pair for the webhook's service name, as cert-manager would
/// issue it for the Service.
fn serving_pki(dir: &TempDir) -> Ca {
    let ca = Ca::generate(now()).expect("CA");
    let names = [
        "quorumguard-webhook".to_string(),
        "quorumguard-webhook.quorumguard-system".to_string(),
        SERVICE_DNS_NAME.to_string(),
    ];
    let leaf = ca
        .issue("quorumguard-webhook", &names, 1, now())
        .expect("serving certificate");
    std::fs::write(dir.path().join("tls.crt"), &leaf.cert_pem).expect("tls.crt");
    std::fs::write(dir.path().join("tls.key"), &leaf.key_pem).expect("tls.key");
    ca
}

struct World {
    api: ApiServer,
    running: Option<Running>,
    dispatcher: Arc<WebhookDispatcher>,
    ca: Ca,
    dir: TempDir,
}

impl World {
    fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    /// etcd health of cluster `test`: members cp-{x}, healthy or not.
    fn health(&self, members: &[(&str, bool)]) {
        self.running().state.set_health(
            NS,
            "test",
            testkit::reviews::members(members),
            Instant::now(),
        );
    }

    fn target(&self) -> WebhookTarget {
        WebhookTarget {
            addr: self.running().addr,
            ca_pem: self.ca.cert_pem().to_string(),
            server_name: SERVICE_DNS_NAME.into(),
        }
    }

    fn client_as(&self, user: &str) -> kube::Client {
        kube::Client::try_from(self.api.kubeconfig_as(user)).expect("client")
    }

    fn machines(&self, user: &str, namespace: &str) -> kube::Api<DynamicObject> {
        kube::Api::namespaced_with(self.client_as(user), namespace, &machine_resource())
    }

    fn kcps(&self, user: &str) -> kube::Api<DynamicObject> {
        kube::Api::namespaced_with(self.client_as(user), NS, &kcp_resource())
    }

    /// Deletes Machine `namespace/name` as `user`: Ok, or the API's Status.
    async fn delete(&self, user: &str, namespace: &str, name: &str) -> Result<(), Box<Status>> {
        let machines = self.machines(user, namespace);
        match bounded("delete", machines.delete(name, &DeleteParams::background())).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) => Err(status),
            Err(other) => panic!("delete {namespace}/{name}: {other}"),
        }
    }

    fn exists(&self, namespace: &str, name: &str) -> bool {
        self.api.get(&machine_resource(), namespace, name).is_some()
    }

    fn calls(&self) -> Vec<WebhookCall> {
        self.dispatcher.calls()
    }
}

/// Cluster `test` (KCP replicas 3, control-plane Machines test-cp-{a,b,c} on nodes cp-{a,b,c}),
/// a worker Machine `test-worker`, a control-plane-labelled Machine in `quorumguard-system`,
/// `serve` with a certificate for the service name, and the repo's configuration installed.
async fn world() -> World {
    let api = ApiServer::start().await.expect("stand-in");
    let members: Vec<String> = ["cp-a", "cp-b", "cp-c"].map(String::from).to_vec();
    seed::cluster(&api, NS, "test", json!({}), &members, None, |_| {});
    let mut worker = stored(machine_named("test-worker", "worker-1"));
    if let Some(labels) = worker["metadata"]["labels"].as_object_mut() {
        labels.remove("cluster.x-k8s.io/control-plane");
        labels.remove("cluster.x-k8s.io/control-plane-name");
    }
    api.insert(worker).expect("worker");
    let mut guarded_elsewhere = stored(machine_named("guard-cp", "guard-node"));
    guarded_elsewhere["metadata"]["namespace"] = json!("quorumguard-system");
    api.insert(guarded_elsewhere)
        .expect("machine in quorumguard-system");

    let dir = TempDir::new("pg-webhooks");
    let ca = serving_pki(&dir);
    let config = ServeConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        tls_cert: dir.path().join("tls.crt"),
        tls_key: dir.path().join("tls.key"),
        tls_reload_interval: Duration::from_secs(1),
        client_auth: None,
        policy: Policy::default(),
        reservation_ttl: Duration::from_secs(30),
        shutdown_delay: Duration::from_millis(50),
        shutdown_grace: Duration::from_secs(2),
        pod_name: Some("quorumguard-test".into()),
        events: false,
        // Health stays unknown until a test sets it.
        sweep: None,
        status: None,
        autopilot: None,
    };
    let running = server::start(config, api.client().expect("client"))
        .await
        .expect("serve starts");
    wait_for("caches synced", STEP, || running.state.all_synced()).await;
    let target = WebhookTarget {
        addr: running.addr,
        ca_pem: ca.cert_pem().to_string(),
        server_name: SERVICE_DNS_NAME.into(),
    };
    let dispatcher = Arc::new(WebhookDispatcher::for_repo_manifest(target).expect("dispatcher"));
    Arc::clone(&dispatcher).install(&api);
    World {
        api,
        running: Some(running),
        dispatcher,
        ca,
        dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_human_deleting_a_control_plane_machine_is_refused_by_the_webhook() {
    let w = world().await;
    let mut events = w.dispatcher.subscribe();
    w.health(&[("a", true), ("b", true), ("c", true)]);

    let status = w.delete(JANE, NS, "test-cp-a").await.expect_err("denied");
    assert_eq!(status.code, 403, "{status:?}");
    assert_eq!(status.reason, "BelowDesiredReplicas", "{status:?}");
    assert!(status.message.starts_with(DENIED), "{}", status.message);
    assert!(w.exists(NS, "test-cp-a"), "still there");

    let calls = w.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let c = &calls[0];
    assert_eq!(
        (c.webhook.as_str(), c.operation, c.resource.as_str()),
        (MACHINES, Operation::Delete, "machines")
    );
    assert_eq!(
        (c.namespace.as_deref(), c.name.as_str(), c.user.as_str()),
        (Some(NS), "test-cp-a", JANE)
    );
    assert_eq!((c.allowed, c.code), (false, 403));
    assert_eq!(c.reason.as_deref(), Some("BelowDesiredReplicas"));
    assert_eq!(
        c.message.as_deref(),
        status.message.strip_prefix(DENIED),
        "the webhook's own message, unprefixed"
    );
    assert!(c.latency < Duration::from_secs(5));
    let seen = bounded("the call event", events.recv())
        .await
        .expect("event");
    assert_eq!(&seen, c);

    // The KCP controller removing a member while all are healthy: allowed.
    w.delete(KCP_CONTROLLER, NS, "test-cp-a")
        .await
        .expect("the KCP controller may scale in");
    assert!(!w.exists(NS, "test-cp-a"));
    let last = w.calls().pop().expect("a second call");
    assert_eq!(
        (last.user.as_str(), last.allowed, last.reason.as_deref()),
        (KCP_CONTROLLER, true, Some("QuorumSafe"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_health_the_guard_answers_on_unknown_health() {
    let w = world().await;
    // No sweep and no health set: the guard knows nothing about etcd. Humans are refused,
    // the KCP controller is let through (Policy::default()).
    let status = w.delete(JANE, NS, "test-cp-b").await.expect_err("denied");
    assert_eq!(
        (status.code, status.reason.as_str()),
        (403, "HealthUnknown")
    );
    assert!(status.message.starts_with(DENIED), "{}", status.message);
    w.delete(KCP_CONTROLLER, NS, "test-cp-b")
        .await
        .expect("the controller is allowed on unknown health");
    let calls = w.calls();
    let verdicts: Vec<_> = calls
        .iter()
        .map(|c| (c.user.as_str(), c.allowed, c.reason.as_deref()))
        .collect();
    assert_eq!(
        verdicts,
        [
            (JANE, false, Some("HealthUnknown")),
            (KCP_CONTROLLER, true, Some("HealthUnknown"))
        ]
    );
    println!("controller on unknown health: {:?}", calls[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_what_the_configuration_names_reaches_the_webhook() {
    let w = world().await;
    w.health(&[("a", true), ("b", true), ("c", true)]);

    // A worker Machine has no control-plane label: never sent, deleted at once.
    w.delete(JANE, NS, "test-worker")
        .await
        .expect("worker delete");
    assert!(!w.exists(NS, "test-worker"));
    // The guard's own namespace is exempt.
    w.delete(JANE, "quorumguard-system", "guard-cp")
        .await
        .expect("delete in quorumguard-system");
    // Machine updates are not registered.
    let (machines, kcps) = (w.machines(JANE, NS), w.kcps(JANE));
    let pp = PatchParams::default();
    let labels = Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}}));
    bounded("machine patch", machines.patch("test-cp-c", &pp, &labels))
        .await
        .expect("patch");
    // KCP status writes never pass the guard.
    let status = Patch::Merge(json!({"status": {"replicas": 3}}));
    bounded("status patch", kcps.patch_status(KCP, &pp, &status))
        .await
        .expect("status patch");
    assert!(w.calls().is_empty(), "{:#?}", w.calls());

    // The scale subresource does, with the Scale as the object.
    let five = Patch::Merge(json!({"spec": {"replicas": 5}}));
    let scaled = bounded("scale patch", kcps.patch_scale(KCP, &pp, &five)).await;
    let calls = w.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let c = &calls[0];
    assert_eq!(
        (
            c.webhook.as_str(),
            c.operation,
            c.kind.as_str(),
            c.sub_resource.as_deref()
        ),
        (KCPS, Operation::Update, "Scale", Some("scale"))
    );
    assert_eq!(scaled.is_ok(), c.allowed, "{scaled:?} vs {c:?}");
    println!(
        "scale 3 -> 5: allowed {} ({:?}) {:?}",
        c.allowed, c.reason, c.message
    );
    // So does a spec update of the KCP itself.
    let version = Patch::Merge(json!({"spec": {"version": "v1.33.1"}}));
    let _ = bounded("spec patch", kcps.patch(KCP, &pp, &version)).await;
    let last = w.calls().pop().expect("the spec update");
    assert_eq!(
        (last.webhook.as_str(), last.kind.as_str(), last.sub_resource),
        (KCPS, "KubeadmControlPlane", None)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_webhook_fails_closed_and_an_ignore_policy_fails_open() {
    let mut w = world().await;
    let addr = w.running().addr;
    w.running.take().expect("running").shutdown().await;

    let status = w.delete(JANE, NS, "test-cp-a").await.expect_err("refused");
    let cause = format!(
        "failed calling webhook \"machines.quorumguard.io\": failed to call webhook: Post \
         \"https://quorumguard-webhook.quorumguard-system.svc:443/validate/machines?timeout=5s\": \
         dial tcp {addr}: connect: connection refused"
    );
    assert_eq!(status.code, 500, "{status:?}");
    assert_eq!(status.reason, "InternalError");
    assert_eq!(status.message, format!("Internal error occurred: {cause}"));
    let causes = status.details.as_ref().map(|d| d.causes.clone());
    assert_eq!(
        causes.and_then(|c| c.first().map(|c| c.message.clone())),
        Some(cause.clone())
    );
    assert!(w.exists(NS, "test-cp-a"));
    let c = w.calls().pop().expect("the failed call");
    assert_eq!((c.allowed, c.code), (false, 500));
    assert_eq!(c.message.as_deref(), Some(cause.as_str()));
    // Nothing else is affected: the worker is not guarded.
    w.delete(JANE, NS, "test-worker").await.expect("worker");

    // The same configuration with failurePolicy Ignore lets the delete through.
    let ignore = MANIFEST.replace("failurePolicy: Fail", "failurePolicy: Ignore");
    let target = WebhookTarget {
        addr,
        ca_pem: w.ca.cert_pem().to_string(),
        server_name: SERVICE_DNS_NAME.into(),
    };
    let open = Arc::new(WebhookDispatcher::from_manifest(&ignore, target).expect("Ignore"));
    Arc::clone(&open).install(&w.api);
    w.dispatcher = open;
    w.delete(JANE, NS, "test-cp-a").await.expect("failing open");
    assert!(!w.exists(NS, "test-cp-a"));
    let c = w.calls().pop().expect("the ignored failure");
    assert!(c.allowed && c.error.is_some(), "{c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_never_answers_times_out() {
    let w = world().await;
    // Accepts connections and says nothing: not even the TLS handshake completes.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..16 {
            match silent.accept().await {
                Ok((s, _)) => held.push(s),
                Err(_) => break,
            }
        }
        held
    });
    let one_second = MANIFEST.replace("timeoutSeconds: 5", "timeoutSeconds: 1");
    let mut target = w.target();
    target.addr = silent_addr;
    let d = Arc::new(WebhookDispatcher::from_manifest(&one_second, target).expect("dispatcher"));
    Arc::clone(&d).install(&w.api);

    let started = Instant::now();
    let status = w.delete(JANE, NS, "test-cp-a").await.expect_err("refused");
    let took = started.elapsed();
    assert_eq!(status.code, 500, "{status:?}");
    assert_eq!(
        status.message,
        "Internal error occurred: failed calling webhook \"machines.quorumguard.io\": failed to \
         call webhook: Post \"https://quorumguard-webhook.quorumguard-system.svc:443/validate/machines?timeout=1s\": \
         context deadline exceeded"
    );
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(4),
        "{took:?}"
    );
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_for_the_service_name_against_the_ca_bundle() {
    let w = world().await;
    async fn refused(w: &World, target: WebhookTarget) -> String {
        let d = Arc::new(WebhookDispatcher::for_repo_manifest(target).expect("dispatcher"));
        Arc::clone(&d).install(&w.api);
        let status = w.delete(JANE, NS, "test-cp-a").await.expect_err("refused");
        assert_eq!(status.code, 500, "{status:?}");
        status.message
    }
    let prefix = "Internal error occurred: failed calling webhook \"machines.quorumguard.io\": \
                  failed to call webhook: Post \
                  \"https://quorumguard-webhook.quorumguard-system.svc:443/validate/machines?timeout=5s\": ";

    let mut other_ca = w.target();
    other_ca.ca_pem = Ca::generate(now()).expect("CA").cert_pem().to_string();
    assert_eq!(
        refused(&w, other_ca).await,
        format!(
            "{prefix}tls: failed to verify certificate: x509: certificate signed by unknown authority"
        )
    );

    let mut other_name = w.target();
    other_name.server_name = "elsewhere.quorumguard-system.svc".into();
    assert_eq!(
        refused(&w, other_name).await,
        format!(
            "{prefix}tls: failed to verify certificate: x509: certificate is valid for \
             quorumguard-webhook, quorumguard-webhook.quorumguard-system, {SERVICE_DNS_NAME}, \
             not elsewhere.quorumguard-system.svc"
        )
    );
    assert!(w.exists(NS, "test-cp-a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_error_from_the_webhook_is_a_failed_call() {
    let w = world().await;
    // The real server, but a path it does not serve: 404, an empty body.
    let wrong = MANIFEST.replace("path: /validate/machines", "path: /validate/nothing");
    let d = Arc::new(WebhookDispatcher::from_manifest(&wrong, w.target()).expect("dispatcher"));
    Arc::clone(&d).install(&w.api);
    let status = w.delete(JANE, NS, "test-cp-a").await.expect_err("refused");
    assert_eq!(status.code, 500, "{status:?}");
    assert_eq!(
        status.message,
        "Internal error occurred: failed calling webhook \"machines.quorumguard.io\": failed to \
         call webhook: the server could not find the requested resource"
    );
    let c = d.calls().pop().expect("the call");
    assert_eq!(
        c.error.as_deref(),
        Some("failed to call webhook: the server could not find the requested resource")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_glass_is_allowed_and_its_warning_reaches_the_client() {
    let w = world().await;
    w.health(&[("a", true), ("b", true), ("c", false)]);
    w.api
        .modify(&machine_resource(), NS, "test-cp-a", |m| {
            m["metadata"]["annotations"]["quorumguard.io/allow-unsafe-delete"] =
                json!("INC-7: node a is being replaced by hand");
        })
        .expect("annotate");
    // kube::Client does not surface warnings: send the DELETE raw and read the headers.
    let request = axum::http::Request::delete(format!(
        "/apis/cluster.x-k8s.io/v1beta2/namespaces/{NS}/machines/test-cp-a"
    ))
    .header("content-type", "application/json")
    .body(kube::client::Body::from(
        br#"{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}"#.to_vec(),
    ))
    .expect("request");
    let response = bounded("delete", w.client_as(JANE).send(request))
        .await
        .expect("response");
    assert_eq!(response.status().as_u16(), 200);
    let warnings: Vec<String> = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let header = &warnings[0];
    assert!(
        header.starts_with("299 - \"") && header.ends_with('"'),
        "{header}"
    );
    assert!(
        header.contains("INC-7") && header.contains("WouldLoseQuorum"),
        "{header}"
    );
    assert!(!w.exists(NS, "test-cp-a"));
    let c = w.calls().pop().expect("the call");
    assert_eq!(
        (c.allowed, c.reason.as_deref(), c.warnings.len()),
        (true, Some("BreakGlass"), 1)
    );
    assert!(
        header.contains(&c.warnings[0].replace('"', "\\\"")),
        "{header} vs {:?}",
        c.warnings
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stand_in_hands_the_webhook_what_kube_apiserver_would() {
    // No webhook here: a capturing hook, and the body the dispatcher would build from it.
    let api = ApiServer::start().await.expect("stand-in");
    let members: Vec<String> = ["cp-a", "cp-b", "cp-c"].map(String::from).to_vec();
    seed::cluster(&api, NS, "test", json!({}), &members, None, |_| {});
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    api.set_admission_hook("capture", move |a| {
        sink.lock().expect("lock").push(a.clone());
        AdmissionVerdict::Allow
    });
    let client = kube::Client::try_from(api.kubeconfig_as(JANE)).expect("client");
    let machines =
        kube::Api::<DynamicObject>::namespaced_with(client.clone(), NS, &machine_resource());
    let kcps = kube::Api::<DynamicObject>::namespaced_with(client, NS, &kcp_resource());
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::background()
    };
    bounded("dry-run delete", machines.delete("test-cp-a", &dry_run))
        .await
        .expect("dry run");
    bounded(
        "delete",
        machines.delete("test-cp-a", &DeleteParams::background()),
    )
    .await
    .expect("delete");
    let five = Patch::Merge(json!({"spec": {"replicas": 5}}));
    bounded(
        "scale",
        kcps.patch_scale(KCP, &PatchParams::default(), &five),
    )
    .await
    .expect("scale");
    // kubectl patch: a merge patch with its field manager.
    let params = PatchParams {
        field_manager: Some("kubectl-patch".into()),
        ..PatchParams::default()
    };
    let three = Patch::Merge(json!({"spec": {"replicas": 3}}));
    bounded("patch", kcps.patch(KCP, &params, &three))
        .await
        .expect("patch");

    let attempts = seen.lock().expect("lock").clone();
    assert_eq!(attempts.len(), 4, "{attempts:#?}");
    // Every field but the uid, the user's groups and the stored objects (the fixtures' carry
    // managedFields and other resourceVersions) must be the fixture's.
    let compare = |i: usize, file: &str| {
        let want = fixture(file)["request"].clone();
        let got = review_request(&attempts[i], "uid")["request"].clone();
        for key in [
            "kind",
            "resource",
            "subResource",
            "requestKind",
            "requestResource",
            "requestSubResource",
            "namespace",
            "operation",
            "dryRun",
            "options",
        ] {
            assert_eq!(got.get(key), want.get(key), "{file}: {key}");
        }
        assert_eq!(got["userInfo"]["username"], JANE);
        assert_eq!(got["userInfo"]["groups"], json!(["system:authenticated"]));
        let mut keys: Vec<_> = got.as_object().expect("request").keys().cloned().collect();
        let mut want_keys: Vec<_> = want.as_object().expect("request").keys().cloned().collect();
        keys.sort();
        want_keys.sort();
        assert_eq!(keys, want_keys, "{file}");
        got
    };
    let dry = compare(0, "machine-delete-dry-run.json");
    assert!(dry["object"].is_null() && dry["oldObject"]["metadata"]["name"] == "test-cp-a");
    compare(1, "machine-delete-by-user.json");
    let scale = compare(2, "kcp-scale-subresource-3-to-5.json");
    assert_eq!(
        (
            &scale["object"]["spec"]["replicas"],
            &scale["oldObject"]["spec"]["replicas"]
        ),
        (&json!(5), &json!(3))
    );
    assert_eq!(scale["object"]["kind"], "Scale");
    compare(3, "kcp-update-replicas-5-to-3.json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_reach_the_client_as_status_and_warning_headers() {
    let api = ApiServer::start().await.expect("stand-in");
    let members: Vec<String> = ["cp-a"].map(String::from).to_vec();
    seed::cluster(&api, NS, "test", json!({}), &members, None, |_| {});
    api.set_admission_hook("unused-name", |_| AdmissionVerdict::Reject {
        code: 200,
        reason: String::new(),
        message: "verbatim: no prefix added".into(),
        details: Some(json!({"causes": [{"message": "why"}]})),
        warnings: vec![
            "say \"no\" \\ twice".into(),
            "say \"no\" \\ twice".into(),
            "second".into(),
        ],
    });
    let request = axum::http::Request::delete(format!(
        "/apis/cluster.x-k8s.io/v1beta2/namespaces/{NS}/machines/test-cp-a"
    ))
    .body(kube::client::Body::empty())
    .expect("request");
    let client = api.client().expect("client");
    let response = bounded("delete", client.send(request))
        .await
        .expect("response");
    // A code below 400 is a 403, as kube-apiserver makes it.
    assert_eq!(response.status().as_u16(), 403);
    let warnings: Vec<String> = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    assert_eq!(
        warnings,
        [r#"299 - "say \"no\" \\ twice""#, r#"299 - "second""#]
    );
    let body = bounded("body", response.into_body().collect_bytes())
        .await
        .expect("body");
    let status: serde_json::Value = serde_json::from_slice(&body).expect("Status");
    assert_eq!(status["message"], "verbatim: no prefix added");
    assert_eq!(status["code"], 403);
    assert!(status.get("reason").is_none(), "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "why");
    assert!(api.get(&machine_resource(), NS, "test-cp-a").is_some());
}

/// Runs kubectl (bounded by its own `--request-timeout` and by [`STEP`] here).
async fn kubectl(w: &World, args: &[&str]) -> Option<Output> {
    let kubeconfig = w.dir.path().join("kubeconfig");
    w.api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let cache = w.dir.path().join("kube-cache");
    let mut command = Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cache-dir")
        .arg(&cache)
        .args(["--request-timeout", "10s"])
        .args(args)
        .env_remove("KUBECONFIG");
    let run = tokio::task::spawn_blocking(move || command.output());
    match bounded("kubectl", run).await.expect("kubectl task") {
        Ok(output) => Some(output),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("running kubectl: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_prints_the_denial_and_the_warning() {
    let w = world().await;
    w.health(&[("a", true), ("b", true), ("c", false)]);
    let delete_a = ["-n", NS, "--as", JANE, "delete", "machine", "test-cp-a"];
    let Some(out) = kubectl(&w, &delete_a).await else {
        println!("SKIPPED: kubectl is not on PATH");
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("kubectl {}: {stderr}", delete_a.join(" "));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!("Error from server (WouldLoseQuorum): {DENIED}")),
        "{stderr}"
    );
    assert!(w.exists(NS, "test-cp-a"));

    // --dry-run=server reaches the webhook as a dry run, and gets the same answer.
    let mut dry = delete_a.to_vec();
    dry.push("--dry-run=server");
    let out = kubectl(&w, &dry).await.expect("kubectl");
    assert_eq!(out.status.code(), Some(1));
    assert!(w.calls().pop().is_some_and(|c| c.dry_run && !c.allowed));

    // Break-glass: allowed, and kubectl prints the webhook's warning.
    w.api
        .modify(&machine_resource(), NS, "test-cp-a", |m| {
            m["metadata"]["annotations"]["quorumguard.io/allow-unsafe-delete"] =
                json!("INC-7: node a is being replaced by hand");
        })
        .expect("annotate");
    let out = kubectl(&w, &delete_a).await.expect("kubectl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("kubectl (break-glass): {stderr}{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let warning = w.calls().pop().expect("call").warnings[0].clone();
    assert!(
        stderr.contains(&format!("Warning: {warning}")),
        "{stderr} lacks {warning}"
    );
    assert!(
        stdout.contains("test-cp-a") && stdout.contains("deleted"),
        "{stdout}"
    );
    assert!(!w.exists(NS, "test-cp-a"));
}
