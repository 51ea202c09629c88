//! Helpers for tests that drive the API-server stand-in through a real `kube::Client`:
//! Cluster API object builders, short forms of the `kube::Api` calls, bounded waiting.

use std::fmt::Debug;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, Status};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::apiserver::{ApiServer, kcp_resource, machine_resource};

/// The namespace the helpers use.
pub const NS: &str = "default";
/// The longest any single wait may take.
pub const WAIT: Duration = Duration::from_secs(10);

/// A fresh stand-in and a client for it.
pub async fn setup() -> (ApiServer, Client) {
    let server = ApiServer::start().await.expect("start the stand-in");
    let client = server.client().expect("a kube::Client for the stand-in");
    (server, client)
}

pub fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a valid object")
}

/// A v1beta2 Machine in [`NS`] with these labels.
pub fn machine(name: &str, labels: Value) -> DynamicObject {
    object(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"clusterName": "c1", "bootstrap": {"dataSecretName": format!("{name}-bootstrap")}},
    }))
}

/// A v1beta2 KubeadmControlPlane in [`NS`] (with a status that create must drop).
pub fn kcp(name: &str, replicas: i64) -> DynamicObject {
    object(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": replicas, "version": "v1.33.0"},
        "status": {"replicas": 99},
    }))
}

pub fn api(client: &Client, ar: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), NS, ar)
}

pub fn machines(client: &Client) -> Api<DynamicObject> {
    api(client, &machine_resource())
}

pub fn kcps(client: &Client) -> Api<DynamicObject> {
    api(client, &kcp_resource())
}

/// Creates `object`, panicking on failure.
pub async fn create(api: &Api<DynamicObject>, object: &DynamicObject) -> DynamicObject {
    let what = object.name_any();
    api.create(&PostParams::default(), object)
        .await
        .unwrap_or_else(|e| panic!("create {what}: {e}"))
}

/// A merge patch.
pub fn merge(value: Value) -> Patch<Value> {
    Patch::Merge(value)
}

/// Patches `name`, panicking on failure.
pub async fn patch(api: &Api<DynamicObject>, name: &str, patch: &Patch<Value>) -> DynamicObject {
    api.patch(name, &PatchParams::default(), patch)
        .await
        .unwrap_or_else(|e| panic!("patch {name}: {e}"))
}

/// A JSON patch (RFC 6902) from its JSON form.
pub fn json_patch(ops: Value) -> Patch<()> {
    Patch::Json(serde_json::from_value(ops).expect("a JSON patch"))
}

/// The API failure inside a kube error.
pub fn status_of<T: Debug>(result: kube::Result<T>) -> Box<Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The HTTP code and reason of an API failure.
pub fn code_reason<T: Debug>(result: kube::Result<T>) -> (u16, String) {
    let status = status_of(result);
    (status.code, status.reason)
}

/// Polls `done` every 20 ms until it holds, for at most [`WAIT`].
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    for _ in 0..1_000 {
        if done() {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}
