//! The API-server stand-in (crates/playground/src/apiserver.rs) driven through a real
//! `kube::Client`:
//! if these pass, kube's request building, error decoding, watch streams and the runtime
//! watcher/reflector all work against it. Every wait is bounded in count and time.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference, Secret};
use k8s_openapi::api::events::v1::Event as EventV1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PostParams};
use kube::api::{Preconditions, WatchEvent, WatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use kube::runtime::{WatchStreamExt, events, reflector, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use testkit::apiserver::{AdmissionVerdict, Operation, kcp_resource, machine_resource};
use testkit::kit::{
    NS, WAIT, code_reason, create, eventually, json_patch, kcp, kcps, machine, machines, merge,
    patch, setup, status_of,
};

const MODIFIED: &str = "the object has been modified; please apply your changes to the latest \
                        version and try again";

fn names(objects: &[DynamicObject]) -> Vec<String> {
    objects.iter().map(ResourceExt::name_any).collect()
}

#[tokio::test]
async fn discovery_describes_capi_kinds_and_subresources() {
    let (_server, client) = setup().await;
    let legacy = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let aggregated = Discovery::new(client.clone())
        .run_aggregated()
        .await
        .expect("aggregated");
    let kcp = GroupVersionKind::gvk(
        "controlplane.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmControlPlane",
    );
    let lease = GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease");
    let secret = GroupVersionKind::gvk("", "v1", "Secret");
    for discovery in [legacy, aggregated] {
        let (ar, caps) = discovery.resolve_gvk(&kcp).expect("KCP is discovered");
        assert_eq!(
            (ar.plural.as_str(), &caps.scope),
            ("kubeadmcontrolplanes", &Scope::Namespaced)
        );
        assert!(caps.supports_operation("watch"));
        let subs: Vec<&str> = caps
            .subresources
            .iter()
            .map(|(s, _)| s.plural.as_str())
            .collect();
        assert_eq!(subs, ["status", "scale"]);
        assert!(
            discovery.resolve_gvk(&lease).is_some() && discovery.resolve_gvk(&secret).is_some()
        );
    }
    let version = client.apiserver_version().await.expect("/version");
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "33")
    );
}

#[tokio::test]
async fn create_get_and_list_with_label_selectors() {
    let (server, client) = setup().await;
    let api = machines(&client);
    let cp = json!({"cluster.x-k8s.io/control-plane": "", "cluster.x-k8s.io/cluster-name": "c1"});
    let created = create(&api, &machine("cp-1", cp.clone())).await;
    create(&api, &machine("cp-2", cp)).await;
    let worker = json!({"cluster.x-k8s.io/cluster-name": "c2", "pool": "a"});
    create(&api, &machine("worker-1", worker)).await;

    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.uid().is_some_and(|u| !u.is_empty()));
    assert!(created.metadata.creation_timestamp.is_some());
    let rv: u64 = created
        .resource_version()
        .and_then(|r| r.parse().ok())
        .expect("integer rv");
    assert!(rv <= server.resource_version());
    let got = api.get("cp-1").await.expect("get cp-1");
    assert_eq!(
        (got.uid(), &got.data["spec"]["clusterName"]),
        (created.uid(), &json!("c1"))
    );

    let cases = [
        ("cluster.x-k8s.io/control-plane", vec!["cp-1", "cp-2"]),
        ("!cluster.x-k8s.io/control-plane", vec!["worker-1"]),
        ("cluster.x-k8s.io/cluster-name=c1", vec!["cp-1", "cp-2"]),
        ("cluster.x-k8s.io/cluster-name!=c1", vec!["worker-1"]),
        ("cluster.x-k8s.io/cluster-name in (c2,c3)", vec!["worker-1"]),
        (
            "cluster.x-k8s.io/cluster-name notin (c2),pool!=b",
            vec!["cp-1", "cp-2"],
        ),
    ];
    for (selector, want) in cases {
        let list = api
            .list(&ListParams::default().labels(selector))
            .await
            .expect("list");
        assert_eq!(names(&list.items), want, "selector {selector}");
    }
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=cp-2"))
        .await;
    assert_eq!(names(&by_name.expect("list").items), ["cp-2"]);
    let bad = api.list(&ListParams::default().labels("a in (b")).await;
    assert_eq!(code_reason(bad), (400, "BadRequest".into()));

    // Pages of one, as the watcher asks for them with page_size.
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(1);
    for _ in 0..10 {
        let page = api.list(&lp).await.expect("a page");
        seen.extend(names(&page.items));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    assert_eq!(seen, ["cp-1", "cp-2", "worker-1"]);
    let meta = api.get_metadata("cp-1").await.expect("metadata only");
    assert_eq!(
        meta.types.map(|t| t.kind).as_deref(),
        Some("PartialObjectMetadata")
    );
    let metas = api
        .list_metadata(&ListParams::default().labels("pool"))
        .await;
    assert_eq!(
        metas.expect("list metadata").items[0]
            .metadata
            .name
            .as_deref(),
        Some("worker-1")
    );
    let all = Api::<DynamicObject>::all_with(client.clone(), &machine_resource());
    assert_eq!(
        all.list(&ListParams::default())
            .await
            .expect("list all")
            .items
            .len(),
        3
    );

    let dup = status_of(
        api.create(&PostParams::default(), &machine("cp-1", json!({})))
            .await,
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        dup.message,
        "machines.cluster.x-k8s.io \"cp-1\" already exists"
    );
}

#[tokio::test]
async fn create_drops_status_and_missing_objects_are_404() {
    let (_server, client) = setup().await;
    let api = kcps(&client);
    let created = create(&api, &kcp("cp", 3)).await;
    assert!(
        created.data.get("status").is_none(),
        "status is not settable on create"
    );

    let missing = status_of(api.get("nope").await);
    assert_eq!((missing.code, missing.reason.as_str()), (404, "NotFound"));
    let msg = "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io \"nope\" not found";
    assert_eq!(missing.message, msg);
    let d = missing.details.expect("details");
    let group = "controlplane.cluster.x-k8s.io";
    assert_eq!(
        (d.name.as_str(), d.group.as_str(), d.kind.as_str()),
        ("nope", group, "kubeadmcontrolplanes")
    );
    assert!(api.get_opt("nope").await.expect("get_opt").is_none());
    let pp = Default::default();
    assert_eq!(
        code_reason(api.patch("nope", &pp, &merge(json!({}))).await).0,
        404
    );
    assert_eq!(
        code_reason(api.delete("nope", &DeleteParams::default()).await).0,
        404
    );
}

#[tokio::test]
async fn merge_and_json_patches() {
    let (_server, client) = setup().await;
    let api = machines(&client);
    create(&api, &machine("m1", json!({"a": "1"}))).await;

    let labels =
        json!({"metadata": {"labels": {"a": null, "b": "2"}}, "spec": {"clusterName": "c9"}});
    let merged = patch(&api, "m1", &merge(labels)).await;
    assert_eq!(merged.labels().get("b").map(String::as_str), Some("2"));
    assert!(!merged.labels().contains_key("a"));
    assert_eq!(merged.data["spec"]["clusterName"], "c9");
    assert_eq!(
        merged.metadata.generation,
        Some(2),
        "a spec change bumps generation"
    );

    let ops = json_patch(json!([
        {"op": "test", "path": "/spec/clusterName", "value": "c9"},
        {"op": "replace", "path": "/spec/clusterName", "value": "c10"},
        {"op": "add", "path": "/metadata/annotations", "value": {"cluster.x-k8s.io/delete-machine": ""}},
    ]));
    let pp = Default::default();
    let patched = api.patch("m1", &pp, &ops).await.expect("JSON patch");
    assert_eq!(patched.data["spec"]["clusterName"], "c10");
    assert!(
        patched
            .annotations()
            .contains_key("cluster.x-k8s.io/delete-machine")
    );
    let failing = json_patch(json!([{"op": "test", "path": "/spec/clusterName", "value": "x"}]));
    assert_eq!(
        code_reason(api.patch("m1", &pp, &failing).await),
        (422, "Invalid".into())
    );

    // CRDs have no strategic merge: the real server answers 415.
    let smp = Patch::Strategic(json!({"metadata": {"labels": {"c": "3"}}}));
    let refused = code_reason(api.patch("m1", &pp, &smp).await);
    assert_eq!(refused, (415, "UnsupportedMediaType".into()));
    // A merge patch carrying a stale resourceVersion is a conflict.
    let stale = merge(json!({"metadata": {"resourceVersion": "1"}, "spec": {"clusterName": "x"}}));
    assert_eq!(
        code_reason(api.patch("m1", &pp, &stale).await),
        (409, "Conflict".into())
    );

    // Built-ins take a strategic merge patch (without lists it is a merge patch).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("c1-etcd".into()),
            ..Default::default()
        },
        data: Some([("tls.crt".to_string(), ByteString(b"crt".to_vec()))].into()),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    let smp =
        Patch::Strategic(json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "c1"}}}));
    let labelled = secrets
        .patch("c1-etcd", &pp, &smp)
        .await
        .expect("strategic merge on a Secret");
    assert_eq!(labelled.labels()["cluster.x-k8s.io/cluster-name"], "c1");
    assert_eq!(labelled.data.expect("data")["tls.crt"].0, b"crt");
}

#[tokio::test]
async fn replace_status_with_stale_resource_version_is_a_conflict() {
    let (_server, client) = setup().await;
    let api = kcps(&client);
    let created = create(&api, &kcp("cp", 3)).await;
    let mut first = created.clone();
    first.data["status"] =
        json!({"conditions": [{"type": "quorumguard.io/EtcdQuorum", "status": "True"}]});
    let pp = PostParams::default();
    let written = api
        .replace_status("cp", &pp, &first)
        .await
        .expect("first status write");
    assert_ne!(written.resource_version(), created.resource_version());

    // `first` still carries the old resourceVersion.
    first.data["status"] = json!({"conditions": []});
    let conflict = status_of(api.replace_status("cp", &pp, &first).await);
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    let resource = "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io";
    let want = format!("Operation cannot be fulfilled on {resource} \"cp\": {MODIFIED}");
    assert_eq!(conflict.message, want);
    let d = conflict.details.expect("details");
    let group = "controlplane.cluster.x-k8s.io";
    assert_eq!(
        (d.name.as_str(), d.group.as_str(), d.kind.as_str()),
        ("cp", group, "kubeadmcontrolplanes")
    );
    let stored = api.get("cp").await.expect("get");
    assert_eq!(
        stored.data["status"]["conditions"][0]["type"],
        "quorumguard.io/EtcdQuorum"
    );
}

#[tokio::test]
async fn status_writes_leave_spec_metadata_and_generation_alone() {
    let (_server, client) = setup().await;
    let api = kcps(&client);
    let created = create(&api, &kcp("cp", 3)).await;
    let body = json!({
        "metadata": {"labels": {"sneaky": "yes"}}, "spec": {"replicas": 5}, "status": {"readyReplicas": 3},
    });
    let pp = Default::default();
    let patched = api
        .patch_status("cp", &pp, &merge(body.clone()))
        .await
        .expect("patch status");
    assert_eq!(patched.data["status"]["readyReplicas"], 3);
    assert_eq!(
        patched.data["spec"]["replicas"], 3,
        "spec ignored on /status"
    );
    assert!(
        !patched.labels().contains_key("sneaky"),
        "metadata ignored on /status"
    );
    assert_eq!(patched.metadata.generation, created.metadata.generation);
    assert_ne!(patched.resource_version(), created.resource_version());

    // The same status again is a no-op: no new resourceVersion.
    let again = api
        .patch_status("cp", &pp, &merge(body))
        .await
        .expect("patch again");
    assert_eq!(again.resource_version(), patched.resource_version());
}

#[tokio::test]
async fn spec_writes_bump_generation_and_ignore_status() {
    let (server, client) = setup().await;
    let api = kcps(&client);
    create(&api, &kcp("cp", 3)).await;
    let by_controller = server.modify(&kcp_resource(), NS, "cp", |o| {
        o["status"] = json!({"replicas": 3})
    });
    by_controller.expect("a controller writes status");

    let mut current = api.get("cp").await.expect("get");
    current.data["spec"]["replicas"] = json!(5);
    current.data["status"] = json!({"replicas": 42});
    let replaced = api
        .replace("cp", &PostParams::default(), &current)
        .await
        .expect("replace");
    assert_eq!(replaced.data["spec"]["replicas"], 5);
    assert_eq!(
        replaced.data["status"],
        json!({"replicas": 3}),
        "status ignored on the resource"
    );
    assert_eq!(replaced.metadata.generation, Some(2));
    let relabelled = patch(
        &api,
        "cp",
        &merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await;
    assert_eq!(
        relabelled.metadata.generation,
        Some(2),
        "metadata changes keep generation"
    );

    let scale = api.get_scale("cp").await.expect("get scale");
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(5));
    assert_eq!(scale.status.map(|s| s.replicas), Some(3));
    let seven = merge(json!({"spec": {"replicas": 7}}));
    let scaled = api
        .patch_scale("cp", &Default::default(), &seven)
        .await
        .expect("patch scale");
    assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(7));
    let after = api.get("cp").await.expect("get");
    assert_eq!(after.data["spec"]["replicas"], 7);
    assert_eq!(after.metadata.generation, Some(3));
}

#[tokio::test]
async fn delete_honours_finalizers_preconditions_and_dry_run() {
    let (_server, client) = setup().await;
    let api = machines(&client);
    let mut m = machine("m1", json!({}));
    m.metadata.finalizers = Some(vec!["machine.cluster.x-k8s.io".into()]);
    create(&api, &m).await;
    let pending = api
        .delete("m1", &DeleteParams::default())
        .await
        .expect("delete");
    let pending = pending
        .left()
        .expect("still there while a finalizer remains");
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert!(api.get_opt("m1").await.expect("get").is_some());

    let pp = Default::default();
    let add = merge(json!({"metadata": {"finalizers": ["machine.cluster.x-k8s.io", "new"]}}));
    assert_eq!(code_reason(api.patch("m1", &pp, &add).await).0, 422);
    patch(
        &api,
        "m1",
        &merge(json!({"metadata": {"finalizers": null}})),
    )
    .await;
    assert!(
        api.get_opt("m1").await.expect("get").is_none(),
        "gone with its last finalizer"
    );

    create(&api, &machine("m2", json!({}))).await;
    let dry = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    assert!(api.delete("m2", &dry).await.expect("dry run").is_right());
    assert!(
        api.get_opt("m2").await.expect("get").is_some(),
        "dry run keeps the object"
    );
    let other_uid = Preconditions {
        uid: Some("someone-else".into()),
        resource_version: None,
    };
    let guarded = DeleteParams::default().preconditions(other_uid);
    assert_eq!(
        code_reason(api.delete("m2", &guarded).await),
        (409, "Conflict".into())
    );
    let done = api
        .delete("m2", &DeleteParams::default())
        .await
        .expect("delete");
    let status = done.right().expect("a Status for an immediate delete");
    assert_eq!(status.details.map(|d| d.name).as_deref(), Some("m2"));
    for name in ["m3", "m4"] {
        create(&api, &machine(name, json!({"batch": "1"}))).await;
    }
    let lp = ListParams::default().labels("batch=1");
    let gone = api.delete_collection(&DeleteParams::default(), &lp).await;
    assert_eq!(
        names(
            &gone
                .expect("deletecollection")
                .left()
                .expect("a list")
                .items
        ),
        ["m3", "m4"]
    );
    assert!(api.list(&lp).await.expect("list").items.is_empty());
}

#[tokio::test]
async fn admission_hook_sees_the_user_and_can_deny() {
    let (server, client) = setup().await;
    let kcp_user = "system:serviceaccount:capi-kubeadm-control-plane-system:\
                    capi-kubeadm-control-plane-manager";
    server.set_admission_hook("quorumguard.test", move |attempt| {
        let deleting = attempt.operation == Operation::Delete && attempt.resource == "machines";
        if deleting && attempt.user != kcp_user && !attempt.dry_run {
            AdmissionVerdict::deny(format!("{} may not delete {}", attempt.user, attempt.name))
        } else {
            AdmissionVerdict::Allow
        }
    });
    let api = machines(&client);
    create(&api, &machine("m1", json!({}))).await;
    let denied = status_of(api.delete("m1", &DeleteParams::default()).await);
    assert_eq!(denied.code, 403);
    let want = "admission webhook \"quorumguard.test\" denied the request: \
                system:anonymous may not delete m1";
    assert_eq!(denied.message, want);
    assert!(api.get_opt("m1").await.expect("get").is_some());

    let as_kcp = Client::try_from(server.kubeconfig_as(kcp_user)).expect("client");
    machines(&as_kcp)
        .delete("m1", &DeleteParams::default())
        .await
        .expect("KCP may delete");
    assert!(api.get_opt("m1").await.expect("get").is_none());
}

#[tokio::test]
async fn injected_faults_surface_as_errors_and_requests_are_counted() {
    let (server, client) = setup().await;
    let api = kcps(&client);
    create(&api, &kcp("cp", 3)).await;
    let list =
        "/apis/controlplane.cluster.x-k8s.io/v1beta2/namespaces/default/kubeadmcontrolplanes";
    let path = format!("{list}/cp");
    server.fail_next(Some("get"), &path, 1, 500);
    assert_eq!(
        code_reason(api.get("cp").await),
        (500, "InternalError".into())
    );
    api.get("cp").await.expect("the fault was used up");
    assert_eq!(
        (
            server.request_count("get", &path),
            server.request_count("create", list)
        ),
        (2, 1)
    );

    server.fail_next(None, &format!("{path}/status"), 1, 409);
    let write = api
        .patch_status("cp", &Default::default(), &merge(json!({"status": {}})))
        .await;
    assert_eq!(code_reason(write), (409, "Conflict".into()));

    server.delay_next(Some("get"), &path, 1, Duration::from_millis(300));
    let started = std::time::Instant::now();
    api.get("cp").await.expect("slow get");
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn lease_create_and_replace_conflict() {
    let (_server, client) = setup().await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let holder = |who: &str| LeaseSpec {
        holder_identity: Some(who.into()),
        lease_duration_seconds: Some(15),
        ..Default::default()
    };
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("quorumguard".into()),
            ..Default::default()
        },
        spec: Some(holder("pod-a")),
    };
    let pp = PostParams::default();
    let created = leases.create(&pp, &lease).await.expect("create lease");
    assert_eq!(
        created.metadata.generation, None,
        "built-ins keep no generation"
    );
    assert_eq!(
        code_reason(leases.create(&pp, &lease).await),
        (409, "AlreadyExists".into())
    );

    let take = Lease {
        spec: Some(holder("pod-b")),
        ..created.clone()
    };
    let taken = leases
        .replace("quorumguard", &pp, &take)
        .await
        .expect("take over");
    assert_eq!(
        taken.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("pod-b")
    );

    // Another candidate still holding the first version loses.
    let late = Lease {
        spec: Some(holder("pod-c")),
        ..created
    };
    let conflict = status_of(leases.replace("quorumguard", &pp, &late).await);
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    let want = format!(
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"quorumguard\": {MODIFIED}"
    );
    assert_eq!(conflict.message, want);
}

#[tokio::test]
async fn events_secrets_and_a_kubeconfig_file() {
    let (server, client) = setup().await;
    let file = std::env::temp_dir().join(format!("qg-standin-{}.yaml", server.addr().port()));
    server.write_kubeconfig(&file).expect("write kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&file).expect("read kubeconfig");
    let _ = std::fs::remove_file(&file);
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .expect("config");
    let from_file = Client::try_from(config).expect("client from the file");

    let reporter = events::Reporter {
        controller: "quorumguard".into(),
        instance: Some("t".into()),
    };
    let recorder = events::Recorder::new(from_file, reporter);
    let regarding = ObjectReference {
        api_version: Some("controlplane.cluster.x-k8s.io/v1beta2".into()),
        kind: Some("KubeadmControlPlane".into()),
        name: Some("cp".into()),
        namespace: Some(NS.into()),
        ..Default::default()
    };
    let event = events::Event {
        type_: events::EventType::Warning,
        reason: "QuorumAtRisk".into(),
        note: Some("1 of 3 members unhealthy".into()),
        action: "Check".into(),
        secondary: None,
    };
    recorder
        .publish(&event, &regarding)
        .await
        .expect("publish an event");
    recorder
        .publish(&event, &regarding)
        .await
        .expect("publish it again (a series)");
    let v1_events: Api<EventV1> = Api::namespaced(client.clone(), NS);
    let listed = v1_events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items;
    assert_eq!(listed.len(), 1, "the repeat patches the event");
    assert_eq!(listed[0].reason.as_deref(), Some("QuorumAtRisk"));

    let core_events: Api<CoreEvent> = Api::namespaced(client.clone(), NS);
    let core = CoreEvent {
        metadata: ObjectMeta {
            generate_name: Some("cp.".into()),
            ..Default::default()
        },
        involved_object: regarding,
        reason: Some("QuorumAtRisk".into()),
        ..Default::default()
    };
    let made = core_events
        .create(&PostParams::default(), &core)
        .await
        .expect("core event");
    assert!(made.name_any().starts_with("cp.") && made.name_any().len() == 8);

    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let missing = status_of(secrets.get("c1-kubeconfig").await);
    assert_eq!(missing.message, "secrets \"c1-kubeconfig\" not found");
    let meta = json!({"name": "c1-kubeconfig", "namespace": NS});
    let secret =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"value": "YWJj"}});
    server.insert(secret).expect("insert a secret");
    let read = secrets.get("c1-kubeconfig").await.expect("read the secret");
    assert_eq!(read.data.expect("data")["value"].0, b"abc");
}

#[tokio::test]
async fn raw_watch_replays_filters_bookmarks_and_expires() {
    let (server, client) = setup().await;
    server.set_bookmark_interval(Duration::from_millis(100));
    let api = machines(&client);
    let start = server.resource_version().to_string();
    create(&api, &machine("m1", json!({"role": "cp"}))).await;
    patch(
        &api,
        "m1",
        &merge(json!({"metadata": {"labels": {"role": "worker"}}})),
    )
    .await;

    let wp = WatchParams::default().labels("role=cp").timeout(2);
    let stream = api.watch(&wp, &start).await.expect("watch");
    let events = tokio::time::timeout(WAIT, stream.take(3).collect::<Vec<_>>()).await;
    let kinds: Vec<&str> = events
        .expect("3 events in time")
        .iter()
        .map(|e| match e {
            Ok(WatchEvent::Added(_)) => "ADDED",
            Ok(WatchEvent::Deleted(_)) => "DELETED",
            Ok(WatchEvent::Bookmark(_)) => "BOOKMARK",
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    // Replayed from `start`: added, then it stopped matching the selector; then a bookmark.
    assert_eq!(kinds, ["ADDED", "DELETED", "BOOKMARK"]);

    // timeoutSeconds ends the stream cleanly.
    let stream = api
        .watch(&WatchParams::default().timeout(1), "0")
        .await
        .expect("watch");
    let all = tokio::time::timeout(WAIT, stream.collect::<Vec<_>>())
        .await
        .expect("ends in time");
    assert!(matches!(all.first(), Some(Ok(WatchEvent::Added(_)))));

    server.compact();
    let stream = api
        .watch(&WatchParams::default(), &start)
        .await
        .expect("watch");
    match tokio::time::timeout(WAIT, stream.boxed().next())
        .await
        .expect("in time")
    {
        Some(Ok(WatchEvent::Error(e))) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Expired, got {other:?}"),
    }
}

#[tokio::test]
async fn watcher_and_reflector_follow_changes_and_survive_dropped_watches() {
    let (server, client) = setup().await;
    let api = machines(&client);
    create(&api, &machine("m0", json!({"cp": "1"}))).await;

    let writer = reflector::store::Writer::<DynamicObject>::new(machine_resource());
    let reader = writer.as_reader();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stream = watcher(api.clone(), watcher::Config::default().labels("cp"));
    let task = tokio::spawn(
        stream
            .default_backoff()
            .reflect(writer)
            .for_each(move |event| {
                let label = match &event {
                    Ok(watcher::Event::Apply(o)) => format!("apply {}", o.name_any()),
                    Ok(watcher::Event::Delete(o)) => format!("delete {}", o.name_any()),
                    Ok(watcher::Event::InitApply(o)) => format!("init {}", o.name_any()),
                    Ok(_) => String::new(),
                    Err(e) => format!("error {e}"),
                };
                let _ = seen_tx.send(label);
                async {}
            }),
    );
    let ready = tokio::time::timeout(WAIT, reader.wait_until_ready()).await;
    ready.expect("ready in time").expect("ready");
    let cached = || {
        let mut n: Vec<String> = reader.state().iter().map(|o| o.name_any()).collect();
        n.sort();
        n
    };
    assert_eq!(cached(), ["m0"]);

    create(&api, &machine("m1", json!({"cp": "1"}))).await;
    create(&api, &machine("other", json!({}))).await;
    patch(
        &api,
        "m1",
        &merge(json!({"metadata": {"labels": {"cp": "2"}}})),
    )
    .await;
    api.delete("m0", &DeleteParams::default())
        .await
        .expect("delete m0");
    let m1_relabelled = || {
        let m1 = reader.state().into_iter().find(|o| o.name_any() == "m1");
        m1.is_some_and(|o| o.labels().get("cp").map(String::as_str) == Some("2"))
    };
    eventually("m1 modified and m0 deleted", || {
        cached() == ["m1"] && m1_relabelled()
    })
    .await;

    let path = "/apis/cluster.x-k8s.io/v1beta2/namespaces/default/machines";
    let watches_before = server.request_count("watch", path);
    server.drop_watches();
    let labels = json!({"cp": "1"});
    let m2 = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                    "metadata": {"name": "m2", "namespace": NS, "labels": labels}});
    server.insert(m2).expect("a change while the watch is down");
    eventually("the reflector to see m2 after the drop", || {
        cached() == ["m1", "m2"]
    })
    .await;
    assert!(
        server.request_count("watch", path) > watches_before,
        "the watcher watched again"
    );

    // A watch that comes back after its resourceVersion was compacted away: a change the
    // watcher does not select moves the resourceVersion on, the history is forgotten, then
    // the connection drops. The re-watch gets 410 Expired and the watcher lists again.
    let lists_before = server.request_count("list", path);
    let unseen = server.modify(&machine_resource(), NS, "other", |o| {
        o["spec"]["x"] = json!(1)
    });
    unseen.expect("modify an object the watcher does not select");
    server.compact();
    server.drop_watches();
    eventually("a re-list after 410", || {
        server.request_count("list", path) > lists_before
    })
    .await;
    api.delete("m2", &DeleteParams::default())
        .await
        .expect("delete m2");
    eventually("the reflector to drop m2", || cached() == ["m1"]).await;

    task.abort();
    let mut seen = Vec::new();
    while let Ok(label) = seen_rx.try_recv() {
        seen.push(label);
    }
    let expired = seen
        .iter()
        .any(|l| l.starts_with("error") && l.contains("too old resource"));
    assert!(expired, "the watcher saw 410 Expired: {seen:?}");
    for want in [
        "init m0",
        "apply m1",
        "delete m0",
        "apply m2",
        "init m2",
        "delete m2",
    ] {
        assert!(
            seen.iter().any(|l| l == want),
            "{want} missing from {seen:?}"
        );
    }
}
