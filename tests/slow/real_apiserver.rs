//! quorumguard against the real kube-apiserver (v1.32, `KUBEBUILDER_ASSETS`; see
//! `crates/testkit/src/envtest.rs`): the rendered `manifests/` applied as users apply them, `serve`
//! (the binary) running as the manifests' ServiceAccount through impersonation and registered
//! through the manifests' ValidatingWebhookConfiguration (clientConfig switched to a loopback
//! `url`), the Cluster API v1.14 CRDs, and real etcd 3.4 with TLS for the workload clusters.
//!
//! What the API-server stand-in cannot show and these tests do: the VWC and its CEL accepted and
//! evaluated, the RBAC sufficient (and each permission needed), status writes validated by the
//! CRD schema, Events as `kubectl describe` shows them, failurePolicy, dry-run and matchPolicy
//! as kube-apiserver applies them.
//!
//! Without `KUBEBUILDER_ASSETS` each test prints one line saying it is skipped, and passes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use testkit::envtest::{
    self, Envtest, SERVICE_ACCOUNT, Serve, api_for, must_create, must_replace, webhook_at,
};
use testkit::etcd::EtcdCluster;
use testkit::guard::{delete_review, review};
use testkit::https::{ClientCa, ClientCert, TempDir, TestPki};
use testkit::manifests::{manifests_dir, render};
use testkit::reviews::{KCP_CONTROLLER, NS};
use testkit::seed::{KCP, cluster_objects, direct_to};

/// The assets, or return from the test (after one line saying it is skipped).
macro_rules! assets_or_skip {
    ($test:literal) => {
        match envtest::assets($test) {
            Some(a) => a,
            None => return,
        }
    };
}

const MACHINES: &str = "machines";
const KCPS: &str = "kubeadmcontrolplanes";
const TEARDOWN: [&str; 3] = [
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:kube-controller-manager",
    "system:serviceaccount:kube-system:namespace-controller",
];
/// A person, as the API server names them to the webhook.
const ALICE: &str = "alice";
const BOB: &str = "bob";

/// The rendered objects of an install variant: `manifests/` (cert-manager) or
/// `manifests/no-cert-manager/`.
fn rendered(variant: &str) -> Vec<Value> {
    let dir = if variant.is_empty() {
        manifests_dir()
    } else {
        manifests_dir().join(variant)
    };
    render(&dir)
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the rendered manifests"))
}

/// Cert-manager's own kinds: their CRDs are cert-manager's, not on this server.
fn is_cert_manager(o: &Value) -> bool {
    o["apiVersion"]
        .as_str()
        .is_some_and(|v| v.starts_with("cert-manager.io/"))
}

fn machines(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &quorumguard::state::watch::api_resource(quorumguard::state::Kind::Machine),
    )
}

fn kcps(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &quorumguard::state::watch::api_resource(quorumguard::state::Kind::Kcp),
    )
}

/// `kubectl scale kcp` as the API sees it: a patch of the KCP's `scale` subresource.
async fn scale(
    api: &Api<DynamicObject>,
    replicas: i64,
) -> kube::Result<k8s_openapi::api::autoscaling::v1::Scale> {
    let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
    api.patch_scale(KCP, &PatchParams::default(), &patch).await
}

/// A merge patch of the KCP's `spec.replicas`.
async fn patch_replicas(api: &Api<DynamicObject>, replicas: i64) -> kube::Result<DynamicObject> {
    let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
    api.patch(KCP, &PatchParams::default(), &patch).await
}

/// A served version other than the storage one: `kind` through v1beta1, in [`NS`].
fn v1beta1(client: &Client, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = kube::api::GroupVersionKind::gvk(group, "v1beta1", kind);
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    Api::namespaced_with(client.clone(), NS, &ar)
}

fn dry_run() -> DeleteParams {
    DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    }
}

/// The message of an API refusal (panics on success or on another error).
fn refusal<T: std::fmt::Debug>(what: &str, result: kube::Result<T>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("{what}: expected the API server to refuse, got {other:?}"),
    }
}

/// A worker Machine of Cluster `test` (no control-plane label).
fn worker(name: &str) -> Value {
    let mut m = testkit::reviews::machine_named(name, name);
    m = testkit::reviews::stored(m);
    let labels = m["metadata"]["labels"].as_object_mut().expect("labels");
    labels.remove("cluster.x-k8s.io/control-plane");
    labels.remove("cluster.x-k8s.io/control-plane-name");
    m
}

/// Everything a test needs: the API server with the manifests applied, `serve` running as the
/// manifests' ServiceAccount and registered through the manifests' VWC.
struct World {
    env: Envtest,
    admin: Client,
    pki: TestPki,
    ca_pem: String,
    vwc: Value,
}

impl World {
    /// The API server, every object of `manifests/no-cert-manager/` applied (Namespace,
    /// ServiceAccount, RBAC, Deployment, Service, PDB, NetworkPolicy, VWC as rendered) and
    /// namespace [`NS`] for the workload clusters.
    async fn start(assets: &envtest::Assets) -> World {
        World::start_with(assets, &[]).await
    }

    /// [`World::start`] with `extra` kube-apiserver flags.
    async fn start_with(assets: &envtest::Assets, extra: &[String]) -> World {
        let env = Envtest::start_with(assets, extra).await;
        let admin = env.client().await;
        let objects = rendered("no-cert-manager");
        for o in &objects {
            must_create(&admin, o).await;
        }
        envtest::namespace(&admin, NS).await;
        let pki_dir = env.dir().join("pki");
        std::fs::create_dir_all(&pki_dir).expect("pki dir");
        let pki = TestPki::new(&pki_dir);
        let ca_pem = std::fs::read_to_string(pki_dir.join("ca.crt")).expect("ca.crt");
        let vwc = find(&objects, "ValidatingWebhookConfiguration").clone();
        World {
            env,
            admin,
            pki,
            ca_pem,
            vwc,
        }
    }

    /// The kubeconfig of the manifests' ServiceAccount (the admin impersonating it).
    fn sa_kubeconfig(&self) -> PathBuf {
        self.env.kubeconfig_as(SERVICE_ACCOUNT)
    }

    /// Starts `serve` as the ServiceAccount with `flags` and waits until it is ready.
    async fn serve(&self, name: &str, flags: &[&str]) -> Serve {
        let mut s = Serve::start(
            self.env.dir(),
            &self.pki,
            name,
            &self.sa_kubeconfig(),
            flags,
        );
        s.wait_ready().await;
        s
    }

    /// Points the manifests' VWC at `addr` (loopback `url` + caBundle) and waits until the API
    /// server calls it (a dry-run KCP spec change reaches `serve`, judged and recorded nowhere).
    async fn register(&self, serve: &Serve) {
        self.point_webhooks_at(serve.addr).await;
        self.wait_called(serve).await;
    }

    async fn point_webhooks_at(&self, addr: SocketAddr) {
        must_replace(&self.admin, &webhook_at(&self.vwc, addr, &self.ca_pem)).await;
    }

    /// Waits until a dry-run spec change of the KCP is judged by `serve`.
    async fn wait_called(&self, serve: &Serve) {
        let before = serve.review_count(KCPS).await;
        let api = kcps(&self.admin, NS);
        envtest::eventually("the webhook to be called", envtest::WAIT, || {
            let api = api.clone();
            async move {
                let pp = PatchParams {
                    dry_run: true,
                    ..PatchParams::default()
                };
                let _ = api
                    .patch(
                        KCP,
                        &pp,
                        &Patch::Merge(json!({"spec": {"version": "v1.99.0"}})),
                    )
                    .await;
                (serve.review_count(KCPS).await > before).then_some(())
            }
        })
        .await;
    }

    /// [`World::start`] with Cluster `test`, its KCP (3 replicas) and Machines test-cp-{a,b,c}
    /// (nodes cp-{a,b,c}), no etcd.
    async fn with_fixture_control_plane(assets: &envtest::Assets) -> World {
        let world = World::start(assets).await;
        let members: Vec<String> = ["cp-a", "cp-b", "cp-c"].map(String::from).to_vec();
        world.seed(json!({}), &members, None, 3).await;
        world
    }

    /// [`World::start`] with a real etcd cluster of `n` members (TLS, loopback) and Cluster
    /// `test` over it (direct transport, its CA Secret), its KCP (`replicas`) and one Machine
    /// `test-<member>` per member.
    async fn with_etcd(
        assets: &envtest::Assets,
        n: usize,
        replicas: i64,
    ) -> (World, EtcdCluster, Vec<String>) {
        let world = World::start(assets).await;
        let etcd = EtcdCluster::start(n);
        let members: Vec<String> = (0..n).map(|i| etcd.name(i).to_string()).collect();
        world
            .seed(direct_to(&etcd), &members, Some(&etcd.pki), replicas)
            .await;
        (world, etcd, members)
    }

    /// [`World::with_fixture_control_plane`] plus worker Machine `test-worker`, with `serve`
    /// (no etcd probes: every health is unknown, so a person is refused whenever the guard is
    /// asked) registered and called.
    async fn guarded_without_probes(assets: &envtest::Assets) -> (World, Serve) {
        let world = World::with_fixture_control_plane(assets).await;
        must_create(&world.admin, &worker("test-worker")).await;
        let serve = world.serve("quorumguard-0", &["--no-probe"]).await;
        world.register(&serve).await;
        (world, serve)
    }

    /// Seeds Cluster `test` with its KCP (`replicas`) and one control-plane Machine per member.
    async fn seed(
        &self,
        annotations: Value,
        members: &[String],
        ca: Option<&testkit::etcd::Pki>,
        replicas: i64,
    ) {
        let objects = cluster_objects(NS, "test", annotations, members, ca, |k| {
            k["spec"]["replicas"] = json!(replicas);
        });
        for o in &objects {
            must_create(&self.admin, o).await;
        }
    }
}

/// Both install variants are accepted by kube-apiserver as rendered, every field kept (the VWC's
/// CEL matchConditions compiled, its selectors, rules and policies stored as written); the
/// namespace the guard excludes carries the label its namespaceSelector matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_install_variants_are_accepted_as_rendered() {
    let assets = assets_or_skip!("both_install_variants_are_accepted_as_rendered");
    let env = Envtest::start(&assets).await;
    let admin = env.client().await;

    for (variant, first) in [("", true), ("no-cert-manager", false)] {
        let objects = rendered(variant);
        let mut skipped = Vec::new();
        for o in &objects {
            if is_cert_manager(o) {
                skipped.push(o["kind"].as_str().unwrap_or("?").to_string());
                continue;
            }
            if first {
                must_create(&admin, o).await;
            } else {
                must_replace(&admin, o).await;
            }
        }
        let expected_skips: &[&str] = if variant.is_empty() {
            &["Issuer", "Certificate"]
        } else {
            &[]
        };
        skipped.sort();
        let mut want: Vec<String> = expected_skips.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(
            skipped, want,
            "variant {variant:?}: only cert-manager's kinds are left out"
        );

        // What the server stored is what was rendered, field for field.
        let rendered_vwc = find(&objects, "ValidatingWebhookConfiguration");
        let stored = api_for(&admin, rendered_vwc)
            .await
            .get("quorumguard")
            .await
            .expect("the stored VWC");
        let stored = serde_json::to_value(&stored).expect("json");
        let stored_hooks = stored["webhooks"].as_array().expect("webhooks");
        let hooks = rendered_vwc["webhooks"].as_array().expect("webhooks");
        assert_eq!(stored_hooks.len(), hooks.len());
        for (want, got) in hooks.iter().zip(stored_hooks) {
            for (field, value) in want.as_object().expect("webhook") {
                assert_eq!(
                    &got[field], value,
                    "variant {variant:?}, webhook {}: {field} stored differently",
                    want["name"]
                );
            }
        }
        let annotations = &stored["metadata"]["annotations"];
        assert_eq!(
            annotations.get("cert-manager.io/inject-ca-from").is_some(),
            variant.is_empty(),
            "only the cert-manager variant asks cainjector for the caBundle"
        );
    }

    let ns = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .get("quorumguard-system")
        .await
        .expect("namespace");
    let labels = ns.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get("kubernetes.io/metadata.name")
            .map(String::as_str),
        Some("quorumguard-system"),
        "the namespaceSelector keys on the label kube-apiserver sets"
    );
}

/// The VWC sends the webhook exactly what it judges, on the real server: teardown identities
/// (matchConditions), metadata-only and status-only KCP updates (matchConditions and rules),
/// worker Machines (objectSelector) and the guard's own namespace (namespaceSelector) never
/// reach it (`serve`'s own review counter does not move), while `kubectl scale kcp` (the scale
/// subresource), a `spec.replicas` patch and a person's control-plane Machine delete do, and
/// are refused in the guard's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_is_called_for_exactly_what_it_judges() {
    let assets = assets_or_skip!("the_webhook_is_called_for_exactly_what_it_judges");
    let (world, serve) = World::guarded_without_probes(&assets).await;

    let admin = &world.admin;
    let m = machines(admin, NS);
    let k = kcps(admin, NS);

    // Never called.
    let machines_before = serve.review_count(MACHINES).await;
    let kcps_before = serve.review_count(KCPS).await;
    for user in TEARDOWN {
        let as_user = world.env.client_as(user).await;
        machines(&as_user, NS)
            .delete("test-cp-a", &dry_run())
            .await
            .unwrap_or_else(|e| panic!("{user} deletes a control-plane Machine: {e}"));
    }
    m.delete("test-worker", &DeleteParams::default())
        .await
        .expect("a worker Machine is deleted without the guard");
    // A control-plane Machine in the guard's own namespace (namespaceSelector).
    let mut own = testkit::reviews::stored(testkit::reviews::machine_named("own-cp", "own-cp"));
    own["metadata"]["namespace"] = json!("quorumguard-system");
    must_create(admin, &own).await;
    machines(admin, "quorumguard-system")
        .delete("own-cp", &DeleteParams::default())
        .await
        .expect("a Machine in quorumguard-system is deleted without the guard");
    // Metadata only: a label, then a finalizer added and removed (as KCP does in teardown).
    for patch in [
        json!({"metadata": {"labels": {"team": "a"}}}),
        json!({"metadata": {"finalizers": ["kubeadm.controlplane.cluster.x-k8s.io"]}}),
        json!({"metadata": {"finalizers": null}}),
    ] {
        k.patch(KCP, &PatchParams::default(), &Patch::Merge(patch.clone()))
            .await
            .unwrap_or_else(|e| panic!("metadata-only KCP update {patch}: {e}"));
    }
    // Status only (the guard's own writes go there).
    k.patch_status(
        KCP,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"replicas": 3}})),
    )
    .await
    .expect("a status-only KCP update");
    assert_eq!(
        serve.review_count(MACHINES).await,
        machines_before,
        "teardown identities, worker Machines and the guard's namespace never reach the webhook"
    );
    assert_eq!(
        serve.review_count(KCPS).await,
        kcps_before,
        "metadata-only and status-only KCP updates never reach the webhook"
    );

    // Called, and refused in the guard's words.
    let alice = world.env.client_as(ALICE).await;
    let message = refusal(
        "alice deletes a control-plane Machine",
        machines(&alice, NS)
            .delete("test-cp-a", &DeleteParams::default())
            .await,
    );
    assert!(
        message.contains("admission webhook \"machines.quorumguard.io\" denied the request"),
        "{message}"
    );
    let reviews = serve.reviews(MACHINES).await;
    assert_eq!(
        reviews.values().sum::<u64>(),
        machines_before + 1,
        "one review for one delete: {reviews:?}"
    );
    assert!(reviews.contains_key("HealthUnknown"), "{reviews:?}");

    let message = refusal(
        "alice scales the KCP (scale subresource)",
        scale(&kcps(&alice, NS), 5).await,
    );
    assert!(
        message.contains("admission webhook \"kubeadmcontrolplanes.quorumguard.io\" denied"),
        "{message}"
    );
    assert_eq!(serve.review_count(KCPS).await, kcps_before + 1);
    let message = refusal(
        "alice patches spec.replicas",
        patch_replicas(&kcps(&alice, NS), 5).await,
    );
    assert!(
        message.contains("kubeadmcontrolplanes.quorumguard.io"),
        "{message}"
    );
    assert_eq!(serve.review_count(KCPS).await, kcps_before + 2);
    // kubectl itself, when there is one: `kubectl scale kcp` goes through the scale subresource.
    if let Some(out) = world.env.kubectl(&[
        "scale",
        "kcp",
        "-n",
        NS,
        KCP,
        "--replicas=5",
        "--as",
        ALICE,
        "--as-group=system:masters",
    ]) {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "kubectl scale kcp was refused");
        assert!(
            stderr.contains("admission webhook \"kubeadmcontrolplanes.quorumguard.io\" denied"),
            "{stderr}"
        );
        assert_eq!(serve.review_count(KCPS).await, kcps_before + 3);
    }
    let replicas = k.get(KCP).await.expect("kcp").data["spec"]["replicas"].clone();
    assert_eq!(replicas, json!(3), "no refused change went through");
}

/// `serve` flags for a world with real etcd: direct transport, a sweep every second, a short
/// Lease (so a takeover is quick), Events on.
const SWEEPING: [&str; 5] = [
    "--etcd-transport=direct",
    "--probe-interval=1s",
    "--lease-duration=4s",
    "--lease-renew-deadline=3s",
    "--lease-retry-period=1s",
];

/// The KCP's `status.conditions`.
async fn conditions(client: &Client) -> Vec<Value> {
    let kcp = kcps(client, NS).get(KCP).await.expect("the KCP");
    kcp.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// (reason, message) of condition `type_`, if the KCP carries it.
fn condition(conditions: &[Value], type_: &str) -> Option<(String, String)> {
    conditions.iter().find(|c| c["type"] == type_).map(|c| {
        (
            c["reason"].as_str().unwrap_or_default().to_string(),
            c["message"].as_str().unwrap_or_default().to_string(),
        )
    })
}

const ETCD_QUORUM: &str = "quorumguard.io/EtcdQuorum";
const NEXT_ACTION: &str = "quorumguard.io/NextAction";

/// Waits until the KCP's conditions satisfy `done` (bounded by [`envtest::WAIT`]); returns them.
async fn conditions_when(
    client: &Client,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let done = &done;
    let found = envtest::poll(envtest::WAIT, || async move {
        let c = conditions(client).await;
        done(&c).then_some(c)
    })
    .await;
    match found {
        Some(c) => c,
        None => panic!(
            "timed out after {:?} waiting for {what}; the KCP's conditions: {:#?}",
            envtest::WAIT,
            conditions(client).await
        ),
    }
}

/// The events.k8s.io Events about `name` in [`NS`].
async fn events_about(client: &Client, name: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .expect("list Events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// What the ServiceAccount asked of the API server, from its audit log: (verb, group,
/// resource[/subresource], HTTP code) per request.
fn requests_of(env: &Envtest, user: &str) -> Vec<(String, String, String, i64)> {
    env.audit_events()
        .into_iter()
        .filter(|e| e["impersonatedUser"]["username"] == user || e["user"]["username"] == user)
        .map(|e| {
            let o = &e["objectRef"];
            let mut resource = o["resource"].as_str().unwrap_or_default().to_string();
            if let Some(sub) = o["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            (
                e["verb"].as_str().unwrap_or_default().to_string(),
                o["apiGroup"].as_str().unwrap_or_default().to_string(),
                resource,
                e["responseStatus"]["code"].as_i64().unwrap_or_default(),
            )
        })
        .collect()
}

/// A ClusterRole or Role with `verb` on `group`/`resource` taken away (everything else kept).
fn without(role: &Value, group: &str, resource: &str, verb: &str) -> Value {
    let mut role = role.clone();
    let has =
        |r: &Value, key: &str, v: &str| r[key].as_array().is_some_and(|a| a.iter().any(|x| x == v));
    let mut rules = Vec::new();
    let mut found = false;
    for rule in role["rules"].as_array().expect("rules") {
        if !(has(rule, "apiGroups", group)
            && has(rule, "resources", resource)
            && has(rule, "verbs", verb))
        {
            rules.push(rule.clone());
            continue;
        }
        found = true;
        let rest = |key: &str, drop: &str| -> Vec<Value> {
            rule[key]
                .as_array()
                .expect("list")
                .iter()
                .filter(|x| *x != drop)
                .cloned()
                .collect()
        };
        let others = rest("resources", resource);
        if !others.is_empty() {
            let mut r = rule.clone();
            r["resources"] = json!(others);
            rules.push(r);
        }
        let verbs = rest("verbs", verb);
        if !verbs.is_empty() {
            let mut r = rule.clone();
            r["resources"] = json!([resource]);
            r["verbs"] = json!(verbs);
            rules.push(r);
        }
    }
    assert!(found, "no rule grants {verb} on {group}/{resource}");
    role["rules"] = json!(rules);
    role
}

/// The first warning or error `serve` logged in `log` that names `needle`.
fn loud_line<'a>(log: &'a str, needle: &str) -> Option<&'a str> {
    log.lines().find(|line| {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            return false;
        };
        let loud = matches!(v["level"].as_str(), Some("WARN" | "ERROR"));
        loud && v.to_string().replace("\\\"", "\"").contains(needle)
    })
}

/// `serve` running as the manifests' ServiceAccount (the admin impersonating it, with the
/// manifests' ClusterRole, Role and bindings applied) does all its work on the real server —
/// watches, reading the etcd CA Secret to probe, status writes, Events, the Lease — and the
/// audit log shows no request of it refused. With any one of those permissions taken away, the
/// same run fails loudly: a warning naming the verb and resource the API server refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_as_the_service_account_has_the_permissions_it_needs() {
    let assets = assets_or_skip!("serve_as_the_service_account_has_the_permissions_it_needs");
    let (world, _etcd, members) = World::with_etcd(&assets, 1, 1).await;
    let mut serve = world.serve("quorumguard-0", &SWEEPING).await;
    world.register(&serve).await;
    let admin = &world.admin;

    // Probed (the etcd CA Secret was read) and published (status read and written).
    let published = conditions_when(admin, "EtcdQuorum from a successful probe", |c| {
        condition(c, ETCD_QUORUM).is_some_and(|(reason, _)| reason != "ProbeFailed")
    })
    .await;
    assert!(condition(&published, NEXT_ACTION).is_some());
    // An Event for a refusal (the only member: LastMember).
    let alice = world.env.client_as(ALICE).await;
    let machine = format!("test-{}", members[0]);
    refusal(
        "alice deletes the only control-plane Machine",
        machines(&alice, NS)
            .delete(&machine, &DeleteParams::default())
            .await,
    );
    let events = envtest::eventually("the refusal's Event", envtest::WAIT, || async {
        let e = events_about(admin, &machine).await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(
        events[0].reporting_controller.as_deref(),
        Some("quorumguard")
    );
    assert_eq!(
        events[0].reporting_instance.as_deref(),
        Some("quorumguard-0")
    );
    // The Lease.
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        admin.clone(),
        "quorumguard-system",
    )
    .get("quorumguard")
    .await
    .expect("the Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("quorumguard-0")
    );

    // The server's view: every kind of request it made, answered 2xx; none refused. A
    // successful `get leases` is the holder's first renewal (its first get found no Lease and
    // created one): on a loaded machine it may come after everything else, so the audit log is
    // read again until every kind is there (`envtest::poll`, at most `envtest::WAIT`).
    let expected = [
        ("list", "machines"),
        ("watch", "machines"),
        ("list", "clusters"),
        ("watch", "clusters"),
        ("list", "kubeadmcontrolplanes"),
        ("watch", "kubeadmcontrolplanes"),
        ("get", "secrets"),
        ("get", "kubeadmcontrolplanes/status"),
        ("update", "kubeadmcontrolplanes/status"),
        ("create", "events"),
        ("get", "leases"),
        ("create", "leases"),
    ];
    let done = |requests: &[(String, String, String, i64)], verb: &str, resource: &str| {
        requests
            .iter()
            .any(|(v, _, r, code)| v == verb && r == resource && (200..300).contains(code))
    };
    let all_there = |requests: &[(String, String, String, i64)]| {
        expected.iter().all(|(v, r)| done(requests, v, r))
    };
    let requests = envtest::poll(envtest::WAIT, || async {
        let requests = requests_of(&world.env, SERVICE_ACCOUNT);
        all_there(&requests).then_some(requests)
    })
    .await
    .unwrap_or_else(|| requests_of(&world.env, SERVICE_ACCOUNT));
    for (verb, resource) in expected {
        assert!(
            done(&requests, verb, resource),
            "the ServiceAccount did {verb} {resource} successfully: {requests:?}"
        );
    }
    let refused: Vec<_> = requests.iter().filter(|r| r.3 == 403).collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    assert!(
        !serve.log().to_lowercase().contains("forbidden"),
        "serve logged a refusal:\n{}",
        serve.log()
    );

    // Each permission taken away in turn: the same run, and a loud warning naming it.
    let objects = rendered("no-cert-manager");
    let cluster_role = find(&objects, "ClusterRole").clone();
    let role = find(&objects, "Role").clone();
    let k = kcps(admin, NS);
    for (kind, group, resource, verb) in [
        ("ClusterRole", "cluster.x-k8s.io", "machines", "watch"),
        ("ClusterRole", "cluster.x-k8s.io", "clusters", "list"),
        (
            "ClusterRole",
            "controlplane.cluster.x-k8s.io",
            "kubeadmcontrolplanes",
            "list",
        ),
        (
            "ClusterRole",
            "controlplane.cluster.x-k8s.io",
            "kubeadmcontrolplanes/status",
            "update",
        ),
        ("ClusterRole", "", "secrets", "get"),
        ("ClusterRole", "events.k8s.io", "events", "create"),
        ("Role", "coordination.k8s.io", "leases", "update"),
    ] {
        let original = if kind == "Role" { &role } else { &cluster_role };
        serve.kill();
        must_replace(admin, &without(original, group, resource, verb)).await;
        // Nothing of ours left in the status: the restarted replica has something to write.
        k.patch_status(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": []}})),
        )
        .await
        .expect("clear the conditions");
        let from = serve.log().len();
        serve.restart();
        let group_text = if group.is_empty() {
            String::new()
        } else {
            format!(" in API group \"{group}\"")
        };
        let needle = format!("cannot {verb} resource \"{resource}\"{group_text}");
        envtest::eventually(&format!("a warning naming {needle}"), envtest::WAIT, || {
            let (alice, machine, serve, needle) = (&alice, &machine, &serve, &needle);
            async move {
                if resource == "events" {
                    // Events are written for refusals: ask for one.
                    let _ = machines(alice, NS)
                        .delete(machine, &DeleteParams::default())
                        .await;
                }
                let log = serve.log();
                loud_line(&log[from.min(log.len())..], needle).map(|_| ())
            }
        })
        .await;
        must_replace(admin, original).await;
    }
}

/// `count` conditions of another controller's, as KCP or a third party writes them.
fn foreign_conditions(count: usize) -> Vec<Value> {
    (0..count)
        .map(|i| {
            json!({
                "type": format!("example.com/Check{i}"),
                "status": "True",
                "reason": "Fine",
                "message": format!("check {i} is fine"),
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            })
        })
        .collect()
}

/// The status writer on the real server, in the cases that stress KCP's CRD schema
/// (`status.conditions`: at most 32 items, a message at most 32768 characters, a reason
/// matching `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`): with 30 conditions of others it
/// writes its two (32 in all, the others untouched and in place); with 31 it writes nothing and
/// fails nothing; a member table far over the limit is cut to fit and accepted; and every reason
/// code it can publish, each EtcdQuorum reason and each NextAction code, is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_pass_the_kcp_crd_schema() {
    use quorumguard::engine::{ActionCode, Health, Member, Policy};
    use quorumguard::lease::Leadership;
    use quorumguard::state::{ClusterState, Kind, watch};
    use quorumguard::status::conditions::QuorumReason;
    use quorumguard::status::metrics::EnricherMetrics;
    use quorumguard::status::publish::{Outcome, PublishConfig, Publisher};
    use std::sync::Arc;

    let assets = assets_or_skip!("status_writes_pass_the_kcp_crd_schema");
    let world = World::with_fixture_control_plane(&assets).await;
    let admin = &world.admin;
    let k = kcps(admin, NS);
    // The status writer of `serve`, as the ServiceAccount, fed by its own watches.
    let sa = Envtest::client_from(&world.sa_kubeconfig()).await;
    let state = Arc::new(ClusterState::new());
    let watches: Vec<_> = Kind::ALL
        .into_iter()
        .map(|kind| tokio::spawn(watch::run(sa.clone(), kind, state.clone(), |_| {})))
        .collect();
    envtest::eventually("the caches to sync", envtest::WAIT, || {
        let synced = state.all_synced();
        async move { synced.then_some(()) }
    })
    .await;
    // A fresh writer remembers nothing it wrote: it reads and compares every time.
    let new_publisher = || {
        Publisher::new(
            sa.clone(),
            state.clone(),
            Policy::default(),
            Leadership::always(),
            PublishConfig::default(),
            Arc::new(EnricherMetrics::register(
                &quorumguard::telemetry::Metrics::new(),
            )),
        )
    };
    let publisher = new_publisher();
    let healthy: Vec<Member> = testkit::reviews::members(&[("a", true), ("b", true), ("c", true)]);
    let set_conditions = |conditions: Vec<Value>| {
        let k = k.clone();
        async move {
            k.patch_status(
                KCP,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"conditions": conditions}})),
            )
            .await
            .expect("write conditions as the admin")
        }
    };

    // 30 of others: ours make 32, the others stay as they were, in place.
    set_conditions(foreign_conditions(30)).await;
    state.set_health(NS, "test", healthy.clone(), std::time::Instant::now());
    let outcome = publisher.publish_one(NS, KCP).await;
    assert!(
        matches!(outcome, Ok(Outcome::Written { .. })),
        "with 30 conditions present: {outcome:?}"
    );
    let now = conditions(admin).await;
    assert_eq!(now.len(), 32);
    let theirs: Vec<Value> = now[..30]
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.as_object_mut()
                .expect("condition")
                .remove("observedGeneration");
            c
        })
        .collect();
    assert_eq!(
        theirs,
        foreign_conditions(30),
        "the others' conditions are untouched"
    );
    assert_eq!(now[30]["type"], ETCD_QUORUM);
    assert_eq!(now[31]["type"], NEXT_ACTION);

    // 31 of others: no room, nothing written, no error.
    set_conditions(foreign_conditions(31)).await;
    let publisher = new_publisher();
    let outcome = publisher.publish_one(NS, KCP).await;
    assert!(
        matches!(outcome, Ok(Outcome::NoRoom)),
        "with 31 present: {outcome:?}"
    );
    assert_eq!(conditions(admin).await.len(), 31);

    // A member table far over 32768 characters (multi-byte errors, so bytes and characters
    // differ): cut to fit, and the server takes it.
    set_conditions(Vec::new()).await;
    let error = "context deadline exceeded — étcd ñode unreachable ".repeat(8);
    let many: Vec<Member> = (0..150u64)
        .map(|i| {
            let mut m = Member::new(0x2000 + i, format!("member-{i:03}"));
            m.health = Health::Unhealthy(error.clone());
            m
        })
        .chain(healthy.clone())
        .collect();
    state.set_health(NS, "test", many, std::time::Instant::now());
    let outcome = publisher.publish_one(NS, KCP).await;
    assert!(
        matches!(outcome, Ok(Outcome::Written { .. })),
        "a long member table: {outcome:?}"
    );
    let (_, message) = condition(&conditions(admin).await, ETCD_QUORUM).expect("EtcdQuorum");
    let chars = message.chars().count();
    assert!(
        (30_000..=32_768).contains(&chars),
        "the message is cut near the limit: {chars} characters"
    );

    // Every reason code, as the guard writes it (read, replace the two, write the status).
    let quorum = QuorumReason::ALL.map(|r| r.as_str());
    let actions = ActionCode::ALL.map(|c| c.as_str());
    for i in 0..quorum.len().max(actions.len()) {
        let (q, a) = (quorum[i % quorum.len()], actions[i % actions.len()]);
        let ours = json!([
            {"type": ETCD_QUORUM, "status": "False", "reason": q,
             "message": format!("reason {q}"), "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": NEXT_ACTION, "status": "True", "reason": a,
             "message": format!("action {a}"), "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]);
        let api = kcps(&sa, NS);
        let mut kcp = api.get_status(KCP).await.expect("read the KCP status");
        kcp.data["status"]["conditions"] = ours;
        api.replace_status(KCP, &Default::default(), &kcp)
            .await
            .unwrap_or_else(|e| panic!("reasons {q} and {a}: {e}"));
        let now = conditions(admin).await;
        assert_eq!(
            condition(&now, ETCD_QUORUM).map(|c| c.0).as_deref(),
            Some(q)
        );
        assert_eq!(
            condition(&now, NEXT_ACTION).map(|c| c.0).as_deref(),
            Some(a)
        );
    }
    for w in watches {
        w.abort();
    }
}

/// Whether an API refusal came from the guard's verdict (not from failing to call it).
fn denied_by_guard(message: &str) -> bool {
    message.contains("admission webhook \"machines.quorumguard.io\" denied the request")
        || message.contains(
            "admission webhook \"kubeadmcontrolplanes.quorumguard.io\" denied the request",
        )
}

/// `client` deletes Machine `name` (in [`NS`]) and the guard refuses it (`what` says who
/// does what, for the failure message).
async fn guard_refuses_deleting(client: &Client, name: &str, what: &str) {
    let message = refusal(
        what,
        machines(client, NS)
            .delete(name, &DeleteParams::default())
            .await,
    );
    assert!(denied_by_guard(&message), "{what}: {message}");
}

/// How many times an Event says it happened (1, or its series' count).
fn occurrences(e: &k8s_openapi::api::events::v1::Event) -> i32 {
    e.series.as_ref().map_or(1, |s| s.count.max(1))
}

/// `kubectl describe machine` (or the Events API it reads) shows who was refused and why, one
/// Event per requester and message: alice refused twice and bob once on the same Machine are
/// two Events, alice's counting two occurrences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_show_each_requester_refused() {
    let assets = assets_or_skip!("events_show_each_requester_refused");
    let (world, _serve) = World::guarded_without_probes(&assets).await;
    let admin = &world.admin;

    for user in [ALICE, ALICE, BOB] {
        let client = world.env.client_as(user).await;
        let message = refusal(
            &format!("{user} deletes a control-plane Machine"),
            machines(&client, NS)
                .delete("test-cp-a", &DeleteParams::default())
                .await,
        );
        assert!(denied_by_guard(&message), "{message}");
    }
    let events = envtest::eventually("three refusals in Events", envtest::WAIT, || async {
        let e = events_about(admin, "test-cp-a").await;
        (e.iter().map(occurrences).sum::<i32>() >= 3).then_some(e)
    })
    .await;
    let machine_uid = machines(admin, NS)
        .get("test-cp-a")
        .await
        .expect("the Machine")
        .metadata
        .uid;
    let mut seen: Vec<(String, i32)> = events
        .iter()
        .map(|e| {
            assert_eq!(e.type_.as_deref(), Some("Warning"));
            assert_eq!(e.reason.as_deref(), Some("HealthUnknown"));
            assert_eq!(e.reporting_controller.as_deref(), Some("quorumguard"));
            let regarding = e.regarding.as_ref().expect("regarding");
            assert_eq!(regarding.kind.as_deref(), Some("Machine"));
            assert_eq!(
                regarding.uid, machine_uid,
                "kubectl describe finds it by uid"
            );
            let note = e.note.clone().unwrap_or_default();
            let who = [ALICE, BOB]
                .into_iter()
                .find(|u| note.contains(u))
                .unwrap_or_else(|| panic!("the note names the requester: {note}"));
            (who.to_string(), occurrences(e))
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![(ALICE.to_string(), 2), (BOB.to_string(), 1)],
        "one Event per requester and message: {events:#?}"
    );
    // What a person sees.
    if let Some(out) = world
        .env
        .kubectl(&["describe", "machine", "-n", NS, "test-cp-a"])
    {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for who in [ALICE, BOB] {
            assert!(
                text.lines()
                    .any(|l| l.contains("HealthUnknown") && l.contains(who)),
                "kubectl describe machine shows {who}'s refusal:\n{text}"
            );
        }
    }
}

/// failurePolicy Fail on the real server: with `serve` killed, a control-plane Machine delete
/// and a KCP replicas change are refused (for a person and for KCP's controller alike), while a
/// worker Machine delete, a metadata-only KCP update and a teardown identity's delete go
/// through; after a restart the guard is ready and judging again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_serve_down_only_what_it_guards_is_refused() {
    let assets = assets_or_skip!("with_serve_down_only_what_it_guards_is_refused");
    let (world, mut serve) = World::guarded_without_probes(&assets).await;
    let admin = &world.admin;
    let alice = world.env.client_as(ALICE).await;
    let kcp_controller = world.env.client_as(KCP_CONTROLLER).await;

    serve.kill();
    for (who, client) in [(ALICE, &alice), (KCP_CONTROLLER, &kcp_controller)] {
        let message = refusal(
            &format!("{who} deletes a control-plane Machine while serve is down"),
            machines(client, NS)
                .delete("test-cp-a", &DeleteParams::default())
                .await,
        );
        assert!(
            message.contains("failed calling webhook \"machines.quorumguard.io\""),
            "{message}"
        );
    }
    let message = refusal(
        "alice scales the KCP while serve is down",
        scale(&kcps(&alice, NS), 5).await,
    );
    assert!(
        message.contains("failed calling webhook \"kubeadmcontrolplanes.quorumguard.io\""),
        "{message}"
    );
    machines(&alice, NS)
        .delete("test-worker", &DeleteParams::default())
        .await
        .expect("a worker Machine is deleted while serve is down");
    kcps(&alice, NS)
        .patch(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
        )
        .await
        .expect("a metadata-only KCP update while serve is down");
    let gc = world.env.client_as(TEARDOWN[0]).await;
    machines(&gc, NS)
        .delete("test-cp-b", &dry_run())
        .await
        .expect("the garbage collector's delete while serve is down");
    machines(admin, NS)
        .get("test-cp-a")
        .await
        .expect("the control-plane Machine is still there");

    serve.restart();
    serve.wait_ready().await;
    guard_refuses_deleting(
        &alice,
        "test-cp-a",
        "alice deletes a control-plane Machine after the restart",
    )
    .await;
    assert_eq!(serve.review_count(MACHINES).await, 1);
}

/// `kubectl delete --dry-run=server` is judged like the real thing and records nothing: no
/// reservation (a second dry run that a reservation would refuse is allowed) and no Event (the
/// only Event is a later real refusal's, counted once). Real etcd, 2 members, KCP replicas 1
/// with two Machines: a person may delete either one, but not both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_is_judged_and_records_nothing() {
    let assets = assets_or_skip!("a_dry_run_is_judged_and_records_nothing");
    let (world, _etcd, members) = World::with_etcd(&assets, 2, 1).await;
    let serve = world.serve("quorumguard-0", &SWEEPING).await;
    world.register(&serve).await;
    let admin = &world.admin;
    conditions_when(admin, "a probe of both members", |c| {
        condition(c, ETCD_QUORUM).is_some_and(|(reason, _)| reason != "ProbeFailed")
    })
    .await;
    let alice = machines(&world.env.client_as(ALICE).await, NS);
    let (first, second) = (
        format!("test-{}", members[0]),
        format!("test-{}", members[1]),
    );
    let before = serve.review_count(MACHINES).await;

    alice
        .delete(&first, &dry_run())
        .await
        .expect("a dry run of one delete is allowed");
    alice
        .delete(&second, &dry_run())
        .await
        .expect("a dry run of the other is allowed too: the first reserved nothing");
    machines(admin, NS)
        .get(&first)
        .await
        .expect("a dry run deletes nothing");
    alice
        .delete(&first, &DeleteParams::default())
        .await
        .expect("the real delete of one is allowed");
    let message = refusal(
        "a dry run of the other, after the real delete",
        alice.delete(&second, &dry_run()).await,
    );
    assert!(denied_by_guard(&message), "{message}");
    // The real refusal is bob's, so its Event is told apart from one a dry run might leave.
    let bob = machines(&world.env.client_as(BOB).await, NS);
    let message = refusal(
        "bob's real delete of the other",
        bob.delete(&second, &DeleteParams::default()).await,
    );
    assert!(denied_by_guard(&message), "{message}");
    assert_eq!(
        serve.review_count(MACHINES).await,
        before + 5,
        "every dry run was judged"
    );
    // Events are published in order: once bob's is there, one for alice's dry run would be.
    let events = envtest::eventually("bob's refusal's Event", envtest::WAIT, || async {
        let e = events_about(admin, &second).await;
        e.iter()
            .any(|e| e.note.as_deref().is_some_and(|n| n.contains(BOB)))
            .then_some(e)
    })
    .await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(
        occurrences(&events[0]),
        1,
        "the dry run counted: {events:#?}"
    );
    assert!(events_about(admin, &first).await.is_empty());
}

/// cluster-api #2651 end to end on the real API server with real etcd (4 members with TLS, a
/// rollout's 4 Machines for 3 replicas): the oldest member is removed while its Machine stays;
/// the guard publishes MembershipMismatch and DeleteMachine for it; a person's delete of a
/// healthy Machine is refused, naming that way out; KCP's delete of the memberless Machine is
/// allowed; the conditions end Healthy / None and etcd's members are the 3 Machines' nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_2651_story_ends_healthy() {
    let assets = assets_or_skip!("the_2651_story_ends_healthy");
    let (world, mut etcd, members) = World::with_etcd(&assets, 4, 3).await;
    // The real server stamps every Machine with its creation time, so these are seconds old,
    // and the guard takes a Machine without a member for one still joining (WaitForJoin) for
    // `--join-grace`. In #2651 the stranded Machine is the rollout's oldest: let seconds count
    // as old. 8 s is usually longer than the setup, so the member is removed while the Machine
    // is still "joining" and the guard must re-publish once it is not (time alone changes the
    // next action).
    let mut flags = SWEEPING.to_vec();
    flags.push("--join-grace=8s");
    let serve = world.serve("quorumguard-0", &flags).await;
    world.register(&serve).await;
    let admin = &world.admin;
    let reason_is = |q: &'static str, a: &'static str| {
        move |c: &[Value]| {
            condition(c, ETCD_QUORUM).is_some_and(|(r, _)| r == q)
                && condition(c, NEXT_ACTION).is_some_and(|(r, _)| r == a)
        }
    };
    conditions_when(
        admin,
        "Healthy / WaitForRollout",
        reason_is("Healthy", "WaitForRollout"),
    )
    .await;

    // KCP removed the oldest member, then lost leader election before deleting its Machine.
    assert!(etcd.remove_member(0), "a removed member's etcd exits");
    let stuck = conditions_when(
        admin,
        "MembershipMismatch / DeleteMachine",
        reason_is("MembershipMismatch", "DeleteMachine"),
    )
    .await;
    let stranded = format!("test-{}", members[0]);
    let (_, action) = condition(&stuck, NEXT_ACTION).expect("NextAction");
    assert!(
        action.contains(&format!("kubectl delete machine -n {NS} {stranded}")),
        "{action}"
    );

    // A person deletes a healthy Machine: refused, told the way out.
    let alice = machines(&world.env.client_as(ALICE).await, NS);
    let healthy = format!("test-{}", members[1]);
    let message = refusal(
        "alice deletes a healthy Machine",
        alice.delete(&healthy, &DeleteParams::default()).await,
    );
    assert!(denied_by_guard(&message), "{message}");
    assert!(message.contains(&stranded), "names the way out: {message}");
    assert!(
        serve
            .reviews(MACHINES)
            .await
            .contains_key("BelowDesiredReplicas")
    );

    // KCP's controller finishes the interrupted step.
    machines(&world.env.client_as(KCP_CONTROLLER).await, NS)
        .delete(&stranded, &DeleteParams::default())
        .await
        .expect("KCP deletes the memberless Machine");
    assert!(serve.reviews(MACHINES).await.contains_key("MemberAbsent"));
    conditions_when(admin, "Healthy / None", reason_is("Healthy", "None")).await;
    let mut left: Vec<String> = etcd.member_list().into_iter().map(|m| m.1).collect();
    left.sort();
    assert_eq!(left, members[1..].to_vec());
    machines(admin, NS)
        .get(&healthy)
        .await
        .expect("the healthy Machine is still there");
}

/// The Lease holder's `quorumguard_leader` and written-status count.
async fn leader_and_writes(serve: &Serve) -> (f64, f64) {
    let metrics = serve.metrics().await;
    let leader = envtest::samples(&metrics, "quorumguard_leader")
        .first()
        .map_or(0.0, |s| s.1);
    let written = envtest::samples(&metrics, "quorumguard_status_writes_total")
        .into_iter()
        .filter(|(l, _)| l.get("result").map(String::as_str) == Some("written"))
        .map(|s| s.1)
        .sum();
    (leader, written)
}

/// Who holds the Lease, and how many times it changed hands.
async fn lease_holder(client: &Client) -> (Option<String>, i32) {
    let lease = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        client.clone(),
        "quorumguard-system",
    )
    .get_opt("quorumguard")
    .await
    .expect("read the Lease");
    let spec = lease.and_then(|l| l.spec).unwrap_or_default();
    (spec.holder_identity, spec.lease_transitions.unwrap_or(0))
}

/// Two `serve` replicas on the real server: only the Lease holder writes KCP status; killed
/// (SIGKILL: no release), the other takes the Lease once it has expired — not before the
/// lease duration less one retry period, and within the duration plus two retry periods (and
/// 10 s of slack for a loaded 2-core machine) — and re-publishes the conditions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_takes_over_the_lease_and_republishes() {
    let assets = assets_or_skip!("a_second_replica_takes_over_the_lease_and_republishes");
    let (world, _etcd, _) = World::with_etcd(&assets, 1, 1).await;
    let mut replicas = [
        world.serve("quorumguard-0", &SWEEPING).await,
        world.serve("quorumguard-1", &SWEEPING).await,
    ];
    let admin = &world.admin;
    conditions_when(admin, "the conditions", |c| {
        condition(c, ETCD_QUORUM).is_some()
    })
    .await;
    let (holder, transitions) = lease_holder(admin).await;
    let holder = holder.expect("a holder");
    let h = replicas
        .iter()
        .position(|r| r.name == holder)
        .expect("the holder is one of the replicas");
    let o = 1 - h;
    let (leader, written) = leader_and_writes(&replicas[h]).await;
    assert_eq!(leader, 1.0);
    assert!(written >= 1.0, "the holder wrote");
    assert_eq!(
        leader_and_writes(&replicas[o]).await,
        (0.0, 0.0),
        "the other replica neither leads nor writes"
    );

    replicas[h].kill();
    let killed = std::time::Instant::now();
    // Nothing of ours left: the taker must publish again.
    kcps(admin, NS)
        .patch_status(
            KCP,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": []}})),
        )
        .await
        .expect("clear the conditions");
    let other = replicas[o].name.clone();
    envtest::eventually("the other replica to take the Lease", envtest::WAIT, || {
        let other = other.clone();
        async move { (lease_holder(admin).await.0.as_deref() == Some(other.as_str())).then_some(()) }
    })
    .await;
    let took = killed.elapsed();
    let (duration, retry) = (Duration::from_secs(4), Duration::from_secs(1));
    assert!(
        took >= duration - retry,
        "taken over after {took:?}: before the Lease could have expired"
    );
    assert!(
        took <= duration + 2 * retry + Duration::from_secs(10),
        "taken over after {took:?}"
    );
    assert_eq!(lease_holder(admin).await.1, transitions + 1);
    conditions_when(admin, "the conditions again", |c| {
        condition(c, ETCD_QUORUM).is_some()
    })
    .await;
    let (leader, written) = leader_and_writes(&replicas[o]).await;
    assert_eq!(leader, 1.0);
    assert!(written >= 1.0, "the new holder wrote");
}

/// `matchPolicy: Equivalent`: requests through the other served version (v1beta1) of Machine
/// and KubeadmControlPlane are judged too — a delete, a `spec.replicas` patch and the scale
/// subresource — and read right (the guard finds the Machine's control plane: HealthUnknown,
/// not NoControlPlane). With the rules narrowed to v1beta2 the manifests' matchPolicy still
/// sends them (converted); a v1beta1 worker delete is still not sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_through_v1beta1_are_judged() {
    let assets = assets_or_skip!("requests_through_v1beta1_are_judged");
    let (world, serve) = World::guarded_without_probes(&assets).await;
    let alice = world.env.client_as(ALICE).await;
    let machines_v1beta1 = v1beta1(&alice, "cluster.x-k8s.io", "Machine", "machines");
    let kcps_v1beta1 = v1beta1(
        &alice,
        "controlplane.cluster.x-k8s.io",
        "KubeadmControlPlane",
        "kubeadmcontrolplanes",
    );
    let narrowed = {
        let mut vwc = world.vwc.clone();
        for w in vwc["webhooks"].as_array_mut().expect("webhooks") {
            w["rules"][0]["apiVersions"] = json!(["v1beta2"]);
        }
        vwc
    };
    for (registration, vwc) in [
        ("as rendered", &world.vwc),
        ("narrowed to v1beta2", &narrowed),
    ] {
        must_replace(&world.admin, &webhook_at(vwc, serve.addr, &world.ca_pem)).await;
        world.wait_called(&serve).await;
        let (m, k) = (
            serve.review_count(MACHINES).await,
            serve.review_count(KCPS).await,
        );
        let message = refusal(
            "alice deletes a control-plane Machine through v1beta1",
            machines_v1beta1
                .delete("test-cp-a", &DeleteParams::default())
                .await,
        );
        assert!(denied_by_guard(&message), "{registration}: {message}");
        let reviews = serve.reviews(MACHINES).await;
        assert_eq!(reviews.values().sum::<u64>(), m + 1, "{registration}");
        assert!(
            !reviews.contains_key("NoControlPlane"),
            "{registration}: {reviews:?}"
        );
        for (what, result) in [
            (
                "spec.replicas",
                patch_replicas(&kcps_v1beta1, 5).await.map(|_| ()),
            ),
            ("scale", scale(&kcps_v1beta1, 5).await.map(|_| ())),
        ] {
            let message = refusal(&format!("{registration}: v1beta1 {what}"), result);
            assert!(denied_by_guard(&message), "{registration}: {message}");
        }
        assert_eq!(serve.review_count(KCPS).await, k + 2, "{registration}");
    }
    machines_v1beta1
        .delete("test-worker", &DeleteParams::default())
        .await
        .expect("a worker Machine through v1beta1");
    let reviews = serve.reviews(MACHINES).await;
    assert!(!reviews.contains_key("NotControlPlane"), "{reviews:?}");
}

/// The files kube-apiserver needs to present a client certificate to the webhook at `addr`, as
/// SECURITY.md describes them: the certificate and key, a kubeconfig whose user entry is named
/// for the webhook (for a `url` webhook, its `host:port`; for the Service,
/// `quorumguard-webhook.quorumguard-system.svc`), and the AdmissionConfiguration pointing
/// ValidatingAdmissionWebhook at it. Returns the `--admission-control-config-file` flag.
fn admission_configuration(dir: &Path, addr: SocketAddr, cert: &ClientCert) -> String {
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path.display().to_string()
    };
    let crt = write("webhook-client.crt", &cert.chain_pem);
    let key = write("webhook-client.key", &cert.key_pem);
    let kubeconfig = write(
        "webhook-kubeconfig.yaml",
        &format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: \"{addr}\"\n  user:\n    \
             client-certificate: {crt}\n    client-key: {key}\n"
        ),
    );
    let config = write(
        "admission-configuration.yaml",
        &format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
             - name: ValidatingAdmissionWebhook\n  configuration:\n    \
             apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    \
             kubeConfigFile: {kubeconfig}\n"
        ),
    );
    format!("--admission-control-config-file={config}")
}

/// The fixture control plane on a kube-apiserver that presents a client certificate (CN
/// `kube-apiserver`, from its own client CA) to the webhook, and `serve` (no probes: a person is
/// refused) registered; with `authenticate`, `serve` requires that certificate. Then: the API
/// server's reviews are judged as before, and reviews forged by a client that presents no
/// certificate, or one from another CA with the same name, are sent directly.
/// Returns (the world, serve, whether each forged review was answered).
async fn forged_reviews_beside_a_real_apiserver(
    assets: &envtest::Assets,
    authenticate: bool,
) -> (World, Serve, [bool; 2]) {
    let files = TempDir::new("admission-configuration");
    let addr: SocketAddr = ([127, 0, 0, 1], envtest::free_port()).into();
    let client_ca = ClientCa::new("kube-apiserver webhook client CA");
    let ca_file = files.path().join("client-ca.crt");
    std::fs::write(&ca_file, &client_ca.pem).expect("client CA");
    let flag = admission_configuration(files.path(), addr, &client_ca.issue("kube-apiserver"));
    let world = World::start_with(assets, &[flag]).await;
    let members: Vec<String> = ["cp-a", "cp-b", "cp-c"].map(String::from).to_vec();
    world.seed(json!({}), &members, None, 3).await;
    let ca_flag = format!("--client-ca-file={}", ca_file.display());
    let mut flags = vec!["--no-probe"];
    if authenticate {
        flags.extend([ca_flag.as_str(), "--client-name=kube-apiserver"]);
    }
    let mut serve = Serve::start_on(
        addr,
        world.env.dir(),
        &world.pki,
        "quorumguard-0",
        &world.sa_kubeconfig(),
        &flags,
    );
    serve.wait_ready().await;
    // kube-apiserver's own reviews are answered (a dry-run KCP change reaches serve).
    world.register(&serve).await;

    // Judged as before: a person refused; a teardown identity allowed (by the VWC's
    // matchConditions, without a review).
    let alice = world.env.client_as(ALICE).await;
    guard_refuses_deleting(&alice, "test-cp-a", "alice deletes a control-plane Machine").await;
    let teardown = world.env.client_as(TEARDOWN[0]).await;
    machines(&teardown, NS)
        .delete("test-cp-b", &dry_run())
        .await
        .expect("a teardown identity's deletion is allowed");
    envtest::eventually("alice's refusal in Events", envtest::WAIT, || async {
        let e = events_about(&world.admin, "test-cp-a").await;
        e.iter()
            .any(|e| e.note.as_deref().unwrap_or_default().contains(ALICE))
            .then_some(())
    })
    .await;

    // Forged: mallory "refused" on test-cp-c, sent without kube-apiserver.
    let impostor = ClientCa::new("kube-apiserver webhook client CA").issue("kube-apiserver");
    let h2: &[&[u8]] = &[b"h2"];
    let mut answered = [false; 2];
    for (i, tls) in [
        world.pki.client(h2),
        world.pki.client_with_cert(h2, &impostor),
    ]
    .into_iter()
    .enumerate()
    {
        let forged = delete_review("cp-c", MALLORY, false, &format!("forged-review-{i}"));
        answered[i] = review(serve.addr, tls, "/validate/machines", &forged)
            .await
            .is_ok();
    }
    (world, serve, answered)
}

/// The requester a forged review names.
const MALLORY: &str = "mallory@example.com";

/// Whether any Event about `name` names mallory.
async fn mallory_in_events(admin: &Client, name: &str) -> bool {
    events_about(admin, name)
        .await
        .iter()
        .any(|e| e.note.as_deref().unwrap_or_default().contains(MALLORY))
}

/// With `--client-ca-file`, kube-apiserver (presenting its certificate through the
/// AdmissionConfiguration's kubeConfigFile) is answered and judged as before, while reviews sent
/// directly without that certificate, or with a look-alike from another CA, are refused in the
/// TLS handshake: no Event, no review counted or logged (so nothing was judged or reserved), and
/// each refusal logged once and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_client_certificates_only_kube_apiserver_is_answered() {
    let assets = assets_or_skip!("with_client_certificates_only_kube_apiserver_is_answered");
    let (world, serve, answered) = forged_reviews_beside_a_real_apiserver(&assets, true).await;
    assert_eq!(
        answered,
        [false, false],
        "forged reviews are refused at TLS"
    );
    let machine_reviews = serve.reviews(MACHINES).await;
    // alice's deletion (the teardown identity's is not sent: the VWC's matchConditions): nothing
    // else was judged.
    assert_eq!(
        machine_reviews.values().sum::<u64>(),
        1,
        "{machine_reviews:?}"
    );
    let log = serve.log();
    assert!(!log.contains("forged-review-"), "a forged review was read");
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("TLS handshake refused"))
        .collect();
    assert_eq!(refusals.len(), 2, "{refusals:#?}");
    assert!(
        refusals[0].contains("no client certificate presented"),
        "{}",
        refusals[0]
    );
    assert!(
        refusals[1].contains("CN=kube-apiserver") && refusals[1].contains("look-alike CA"),
        "{}",
        refusals[1]
    );
    let counted = envtest::samples(
        &serve.metrics().await,
        "quorumguard_client_certificate_refusals_total",
    );
    assert_eq!(counted.first().map(|(_, v)| *v), Some(2.0), "{counted:?}");
    // Events are written in the background: give one the time it would take, then look.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!mallory_in_events(&world.admin, "test-cp-c").await);
    // Only kube-apiserver can send reviews: the note names alice as the requester.
    let notes: Vec<String> = events_about(&world.admin, "test-cp-a")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect();
    let by_alice = format!("denied DELETE by {ALICE}: ");
    assert!(notes.iter().any(|n| n.starts_with(&by_alice)), "{notes:?}");
}

/// Without `--client-ca-file` the same forged reviews are answered, judged and recorded, as
/// before (and the Event says the requester is only what the review names).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_client_certificates_forged_reviews_are_answered_as_before() {
    let assets =
        assets_or_skip!("without_client_certificates_forged_reviews_are_answered_as_before");
    let (world, serve, answered) = forged_reviews_beside_a_real_apiserver(&assets, false).await;
    assert_eq!(
        answered,
        [true, true],
        "without authentication anyone is answered"
    );
    assert_eq!(
        serve.review_count(MACHINES).await,
        3,
        "alice's and the two forged"
    );
    envtest::eventually(
        "mallory's forged refusal in Events",
        envtest::WAIT,
        || async {
            mallory_in_events(&world.admin, "test-cp-c")
                .await
                .then_some(())
        },
    )
    .await;
    // Not mistakable for kube-apiserver's record: the note says whom the review names.
    let expected = format!("(review names user {MALLORY}; its sender is not authenticated)");
    for e in events_about(&world.admin, "test-cp-c").await {
        let note = e.note.unwrap_or_default();
        assert!(note.contains(&expected), "{note}");
    }
}

/// Cluster API's core controllers (the Cluster and Machine controllers), as clusterctl installs
/// them.
const CAPI_CONTROLLER: &str = "system:serviceaccount:capi-system:capi-controller-manager";
/// KCP's pre-terminate hook: on every Machine KCP creates or syncs (Cluster API >= v1.8.2).
const KCP_HOOK: &str = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup";
/// The finalizers of Cluster API v1.14 (`ClusterFinalizer`, `KubeadmControlPlaneFinalizer`,
/// `MachineFinalizer`).
const CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
const KCP_FINALIZER: &str = "kubeadm.controlplane.cluster.x-k8s.io";
const MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";

fn clusters(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &quorumguard::state::watch::api_resource(quorumguard::state::Kind::Cluster),
    )
}

/// A merge patch of `name`'s metadata through `api`, failing the test when refused.
async fn patch_metadata(api: &Api<DynamicObject>, name: &str, metadata: Value) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": metadata })),
    )
    .await
    .unwrap_or_else(|e| panic!("patch {name}'s metadata with {metadata}: {e}"));
}

/// Whether `name` is gone from `api`.
async fn gone(api: &Api<DynamicObject>, name: &str) -> bool {
    matches!(api.get_opt(name).await, Ok(None))
}

/// The VWC as rendered without the Machine webhook's match condition `name` (the same VWC
/// when it has none of that name: `tests/it/manifests.rs` holds the names).
fn without_match_condition(vwc: &Value, name: &str) -> Value {
    let mut vwc = vwc.clone();
    let hook = vwc["webhooks"]
        .as_array_mut()
        .expect("webhooks")
        .iter_mut()
        .find(|w| w["name"] == "machines.quorumguard.io")
        .expect("the Machine webhook");
    let conditions = hook["matchConditions"]
        .as_array_mut()
        .expect("matchConditions");
    conditions.retain(|c| c["name"] != name);
    vwc
}

/// The finalizers Cluster API's controllers put on Cluster `test`, its KCP and its Machines,
/// and KCP's pre-terminate hook on each control-plane Machine (the fixture has it already; set
/// here so the teardown below does not rest on a fixture's detail).
async fn as_cluster_api_keeps_them(world: &World, control_plane: &[String], worker: Option<&str>) {
    let admin = &world.admin;
    patch_metadata(
        &clusters(admin, NS),
        "test",
        json!({"finalizers": [CLUSTER_FINALIZER]}),
    )
    .await;
    patch_metadata(
        &kcps(admin, NS),
        KCP,
        json!({"finalizers": [KCP_FINALIZER]}),
    )
    .await;
    for m in control_plane {
        patch_metadata(
            &machines(admin, NS),
            m,
            json!({"finalizers": [MACHINE_FINALIZER], "annotations": {KCP_HOOK: ""}}),
        )
        .await;
    }
    if let Some(w) = worker {
        patch_metadata(
            &machines(admin, NS),
            w,
            json!({"finalizers": [MACHINE_FINALIZER]}),
        )
        .await;
    }
}

/// The start of a Cluster's teardown as Cluster API v1.14 takes it, up to KCP's turn: a person
/// deletes Cluster `test` (its finalizer holds it); the Cluster controller deletes its worker
/// Machines and waits for them (the Machine controller removes their finalizer), then deletes
/// the KubeadmControlPlane (`core/reconcilers/cluster/cluster_controller.go`, `reconcileDelete`:
/// descendants first, then the control plane object).
async fn teardown_until_kcp(world: &World, worker: Option<&str>) {
    let capi = world.env.client_as(CAPI_CONTROLLER).await;
    clusters(&world.admin, NS)
        .delete("test", &DeleteParams::default())
        .await
        .expect("a person deletes the Cluster");
    if let Some(w) = worker {
        machines(&capi, NS)
            .delete(w, &DeleteParams::default())
            .await
            .expect("the Cluster controller deletes a worker Machine");
        patch_metadata(&machines(&capi, NS), w, json!({"finalizers": null})).await;
        assert!(
            gone(&machines(&capi, NS), w).await,
            "the worker Machine is gone"
        );
    }
    kcps(&capi, NS)
        .delete(KCP, &DeleteParams::default())
        .await
        .expect("the Cluster controller deletes the KubeadmControlPlane");
    let kcp = kcps(&world.admin, NS).get(KCP).await.expect("the KCP");
    assert!(
        kcp.metadata.deletion_timestamp.is_some(),
        "KCP's finalizer holds it"
    );
}

/// KCP's `reconcileDelete` for one Machine (Cluster API v1.14,
/// `controlplane/kubeadm/reconcilers/kubeadmcontrolplane/kubeadmcontrolplane_controller.go`):
/// `removePreTerminateHookAnnotationFromMachine` (a patch), then `Client.Delete`. Returns the
/// deletion's result.
async fn kcp_tears_down(kcp: &Client, machine: &str) -> kube::Result<()> {
    patch_metadata(
        &machines(kcp, NS),
        machine,
        json!({"annotations": {KCP_HOOK: null}}),
    )
    .await;
    machines(kcp, NS)
        .delete(machine, &DeleteParams::default())
        .await
        .map(|_| ())
}

/// KCP's `reconcileDelete` for every Machine at once, as KCP issues them; each must go through
/// (`when` says in which state, for the failure message).
async fn kcp_tears_down_all(kcp: &Client, control_plane: &[String], when: &str) {
    let deletions = control_plane.iter().map(|m| kcp_tears_down(kcp, m));
    for (m, result) in control_plane
        .iter()
        .zip(futures::future::join_all(deletions).await)
    {
        result.unwrap_or_else(|e| panic!("KCP's teardown deletion of {m}, {when}: {e}"));
    }
}

/// `result`, a deletion of Machine `machine`, was refused for want of the guard (`failed calling
/// webhook`), and the Machine is not being deleted; returns it.
async fn refused_and_not_started<T: std::fmt::Debug>(
    world: &World,
    what: &str,
    result: kube::Result<T>,
    machine: &str,
) -> DynamicObject {
    let message = refusal(what, result);
    assert!(
        message.contains("failed calling webhook \"machines.quorumguard.io\""),
        "{what}: {message}"
    );
    let m = machines(&world.admin, NS)
        .get(machine)
        .await
        .unwrap_or_else(|e| panic!("{what}: {machine}: {e}"));
    assert!(
        m.metadata.deletion_timestamp.is_none(),
        "{what}: the refused deletion did not start"
    );
    m
}

/// `client` deletes Machine `name` and the API server refuses it for want of the guard
/// (`failed calling webhook`, failurePolicy Fail); `what` says who does what.
async fn refused_without_the_guard(client: &Client, name: &str, what: &str) {
    let message = refusal(
        what,
        machines(client, NS)
            .delete(name, &DeleteParams::default())
            .await,
    );
    assert!(
        message.contains("failed calling webhook \"machines.quorumguard.io\""),
        "{what}: {message}"
    );
}

/// The rest of the teardown once KCP's deletions went through: the Machine controller removes
/// each Machine's finalizer (its `reconcileDelete`, with no pre-terminate hook left to wait
/// for), KCP removes its own once no Machine is left, the Cluster controller its own once the
/// control plane is gone. Every object of Cluster `test` is then gone.
async fn teardown_finishes(world: &World, control_plane: &[String]) {
    let capi = world.env.client_as(CAPI_CONTROLLER).await;
    let kcp = world.env.client_as(KCP_CONTROLLER).await;
    for m in control_plane {
        let machine = machines(&world.admin, NS)
            .get(m)
            .await
            .expect("the Machine");
        assert!(
            machine.metadata.deletion_timestamp.is_some(),
            "{m} is being deleted"
        );
        patch_metadata(&machines(&capi, NS), m, json!({"finalizers": null})).await;
    }
    patch_metadata(&kcps(&kcp, NS), KCP, json!({"finalizers": null})).await;
    patch_metadata(&clusters(&capi, NS), "test", json!({"finalizers": null})).await;
    for m in control_plane {
        assert!(gone(&machines(&world.admin, NS), m).await, "{m} is gone");
    }
    assert!(gone(&kcps(&world.admin, NS), KCP).await, "the KCP is gone");
    assert!(
        gone(&clusters(&world.admin, NS), "test").await,
        "the Cluster is gone"
    );
}

/// A Cluster's deletion with the guard down (`serve` killed, `failurePolicy: Fail`), Cluster
/// API's controllers played by the test as its finalizers require: with the Machine webhook's
/// match conditions as they were before `not-kcp-teardown` (only the garbage collector,
/// kube-controller-manager and the namespace controller skipped), KCP's teardown deletion of
/// its Machines is refused (`failed calling webhook`), so the KCP and the Cluster stay until
/// the guard returns: the stall. With the VWC as rendered, the teardown completes: every
/// Machine, the KCP and the Cluster are gone. The door stays shut meanwhile: a person's
/// deletion of a control-plane Machine and KCP's deletion of one that still carries its
/// pre-terminate hook (a scale-down, a rollout, a remediation) are refused while the guard is
/// down, with either VWC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_deleted_with_the_guard_down() {
    let assets = assets_or_skip!("a_cluster_is_deleted_with_the_guard_down");
    let (world, mut serve) = World::guarded_without_probes(&assets).await;
    let control_plane: Vec<String> = ["test-cp-a", "test-cp-b", "test-cp-c"]
        .map(String::from)
        .to_vec();
    as_cluster_api_keeps_them(&world, &control_plane, Some("test-worker")).await;
    let alice = world.env.client_as(ALICE).await;
    let kcp = world.env.client_as(KCP_CONTROLLER).await;
    let before = without_match_condition(&world.vwc, "not-kcp-teardown");

    serve.kill();
    for (name, vwc) in [("as rendered", &world.vwc), ("before", &before)] {
        must_replace(&world.admin, &webhook_at(vwc, serve.addr, &world.ca_pem)).await;
        for (who, client) in [(ALICE, &alice), (KCP_CONTROLLER, &kcp)] {
            refused_without_the_guard(
                client,
                "test-cp-a",
                &format!("{name}: {who} deletes a control-plane Machine with KCP's hook"),
            )
            .await;
        }
    }

    teardown_until_kcp(&world, Some("test-worker")).await;
    // The VWC before: KCP's teardown is refused while the guard is down.
    refused_and_not_started(
        &world,
        "KCP's teardown deletion, the guard down, the VWC before",
        kcp_tears_down(&kcp, "test-cp-a").await,
        "test-cp-a",
    )
    .await;
    // A person still cannot use the hook's absence: only KCP's identity is skipped.
    refused_without_the_guard(
        &alice,
        "test-cp-a",
        "alice deletes the Machine KCP took the hook from",
    )
    .await;

    // As rendered: the same deletions, all at once as KCP issues them, go through.
    must_replace(
        &world.admin,
        &webhook_at(&world.vwc, serve.addr, &world.ca_pem),
    )
    .await;
    refused_without_the_guard(
        &alice,
        "test-cp-a",
        "as rendered: alice deletes the Machine KCP took the hook from",
    )
    .await;
    kcp_tears_down_all(&kcp, &control_plane, "the guard down").await;
    teardown_finishes(&world, &control_plane).await;
    assert!(!serve.is_running(), "the guard stayed down throughout");
}

/// What `clusterctl move` does to a Machine on the source management cluster (Cluster API
/// v1.14, `cmd/clusterctl/client/cluster/mover.go`, `deleteSourceObject`, after
/// `setClusterPause` paused the Cluster): a JSON patch that adds `metadata.annotations` as
/// `{"clusterctl.cluster.x-k8s.io/delete-for-move": ""}` (an `add` of an existing member
/// replaces it: every other annotation, KCP's pre-terminate hook included, is gone), then the
/// deletion, then a merge patch emptying the finalizers. Up to v1.9 the finalizers went before
/// the deletion (`strip_first`). Returns the deletion's result.
async fn clusterctl_moves_away(
    client: &Client,
    machine: &str,
    strip_first: bool,
) -> kube::Result<()> {
    let api = machines(client, NS);
    api.patch(
        machine,
        &PatchParams::default(),
        &testkit::kit::json_patch(json!([{"op": "add", "path": "/metadata/annotations",
            "value": {quorumguard::engine::ANNOTATION_DELETE_FOR_MOVE: ""}}])),
    )
    .await
    .unwrap_or_else(|e| panic!("annotate {machine} delete-for-move: {e}"));
    let strip = json!({"finalizers": []});
    if strip_first {
        patch_metadata(&api, machine, strip.clone()).await;
    }
    api.delete(machine, &DeleteParams::default()).await?;
    if !strip_first {
        patch_metadata(&api, machine, strip).await;
    }
    Ok(())
}

/// `clusterctl move` with the guard down (`serve` killed, `failurePolicy: Fail`), Cluster API's
/// finalizers on the Machines and the Cluster paused as clusterctl pauses it: the deletion of a
/// control-plane Machine annotated `clusterctl.cluster.x-k8s.io/delete-for-move` whose
/// finalizers are gone passes (match condition `not-clusterctl-move`: such a deletion completes
/// at once, and no controller drains its node or removes its etcd member), and the Machine is
/// gone. An ordinary deletion of a control-plane Machine is still refused, and so are the
/// annotation without the finalizers gone and the finalizers gone without the annotation.
/// clusterctl v1.10 and later deletes before it strips the finalizers: that deletion reaches the
/// guard, so with the guard down it is refused; with the guard up it is allowed
/// (`ClusterctlMove`) and the move goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusterctl_move_with_the_guard_down_and_up() {
    let assets = assets_or_skip!("a_clusterctl_move_with_the_guard_down_and_up");
    let (world, mut serve) = World::guarded_without_probes(&assets).await;
    let control_plane: Vec<String> = ["test-cp-a", "test-cp-b", "test-cp-c"]
        .map(String::from)
        .to_vec();
    as_cluster_api_keeps_them(&world, &control_plane, None).await;
    // clusterctl runs as the person at the keyboard.
    let alice = world.env.client_as(ALICE).await;
    clusters(&world.admin, NS)
        .patch(
            "test",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await
        .expect("clusterctl pauses the Cluster");

    serve.kill();
    must_replace(
        &world.admin,
        &webhook_at(&world.vwc, serve.addr, &world.ca_pem),
    )
    .await;
    refused_without_the_guard(&alice, "test-cp-a", "alice deletes a control-plane Machine").await;

    // The order of clusterctl up to v1.9: annotate, strip the finalizers, delete. It passes.
    clusterctl_moves_away(&alice, "test-cp-b", true)
        .await
        .unwrap_or_else(|e| {
            panic!("clusterctl (v1.9 order) deletes test-cp-b, the guard down: {e}")
        });
    assert!(
        gone(&machines(&world.admin, NS), "test-cp-b").await,
        "test-cp-b is gone"
    );

    // Only both together: the finalizers gone without the annotation, or the annotation with
    // the finalizers, still reach the (dead) guard.
    patch_metadata(
        &machines(&alice, NS),
        "test-cp-c",
        json!({"finalizers": []}),
    )
    .await;
    refused_without_the_guard(
        &alice,
        "test-cp-c",
        "alice deletes a control-plane Machine without finalizers, not annotated for a move",
    )
    .await;
    let a = refused_and_not_started(
        &world,
        "clusterctl (v1.10+ order: delete, then strip the finalizers) deletes test-cp-a, the guard down",
        clusterctl_moves_away(&alice, "test-cp-a", false).await,
        "test-cp-a",
    )
    .await;
    assert_eq!(
        a.metadata
            .annotations
            .as_ref()
            .map(|a| a.keys().cloned().collect::<Vec<_>>()),
        Some(vec![
            quorumguard::engine::ANNOTATION_DELETE_FOR_MOVE.to_string()
        ]),
        "clusterctl's patch replaced the annotations"
    );

    // The guard up again: the same deletion reaches it and is allowed as ClusterctlMove (its
    // health unknown, a person's ordinary deletion is refused by the guard itself).
    let serve = world.serve("quorumguard-1", &["--no-probe"]).await;
    world.register(&serve).await;
    guard_refuses_deleting(&alice, "test-cp-c", "alice deletes test-cp-c, the guard up").await;
    let before = serve.reviews(MACHINES).await;
    machines(&alice, NS)
        .delete("test-cp-a", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("clusterctl deletes test-cp-a, the guard up: {e}"));
    patch_metadata(
        &machines(&alice, NS),
        "test-cp-a",
        json!({"finalizers": []}),
    )
    .await;
    assert!(
        gone(&machines(&world.admin, NS), "test-cp-a").await,
        "test-cp-a is gone"
    );
    let after = serve.reviews(MACHINES).await;
    assert_eq!(
        after.get("ClusterctlMove").copied().unwrap_or(0)
            - before.get("ClusterctlMove").copied().unwrap_or(0),
        1,
        "the deletion reached the guard and was allowed as ClusterctlMove: {after:?}"
    );
}

/// The guard up, judging KCP's teardown (the VWC without `not-kcp-teardown`, so that every
/// deletion reaches it), on real etcd with 3 healthy members: a person's deletion of a
/// control-plane Machine is refused; once the Cluster and its KubeadmControlPlane are being
/// deleted (the guard publishes `WaitForTeardown`: its caches show it), KCP's deletion of all
/// three Machines at once — which would lose quorum in any other state — is allowed, each as
/// `ClusterDeleting` (the Cluster's deletionTimestamp comes first, as in Cluster API), and the
/// teardown completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_allows_kcp_to_delete_its_machines_in_teardown() {
    let assets = assets_or_skip!("the_guard_allows_kcp_to_delete_its_machines_in_teardown");
    let (world, _etcd, members) = World::with_etcd(&assets, 3, 3).await;
    let serve = world.serve("quorumguard-0", &SWEEPING).await;
    let judged = without_match_condition(&world.vwc, "not-kcp-teardown");
    must_replace(
        &world.admin,
        &webhook_at(&judged, serve.addr, &world.ca_pem),
    )
    .await;
    world.wait_called(&serve).await;
    let admin = &world.admin;
    conditions_when(admin, "Healthy", |c| {
        condition(c, ETCD_QUORUM).is_some_and(|(reason, _)| reason == "Healthy")
    })
    .await;
    let control_plane: Vec<String> = members.iter().map(|m| format!("test-{m}")).collect();
    as_cluster_api_keeps_them(&world, &control_plane, None).await;
    let alice = world.env.client_as(ALICE).await;
    guard_refuses_deleting(
        &alice,
        &control_plane[0],
        "alice deletes a control-plane Machine before the teardown",
    )
    .await;

    teardown_until_kcp(&world, None).await;
    conditions_when(admin, "WaitForTeardown", |c| {
        condition(c, NEXT_ACTION).is_some_and(|(reason, _)| reason == "WaitForTeardown")
    })
    .await;
    let before = serve.reviews(MACHINES).await;
    let kcp = world.env.client_as(KCP_CONTROLLER).await;
    kcp_tears_down_all(&kcp, &control_plane, "the guard up").await;
    let after = serve.reviews(MACHINES).await;
    let judged: std::collections::BTreeMap<&str, u64> = after
        .iter()
        .map(|(reason, n)| {
            (
                reason.as_str(),
                n - before.get(reason).copied().unwrap_or(0),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(
        judged,
        [("ClusterDeleting", 3)].into_iter().collect(),
        "each of KCP's teardown deletions reached the guard and was allowed as ClusterDeleting"
    );
    teardown_finishes(&world, &control_plane).await;
}
