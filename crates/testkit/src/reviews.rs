//! The AdmissionReview fixtures kube-apiserver sent (tests/fixtures/admission-reviews/) and the
//! Cluster API objects in them, shaped for seeding the API-server stand-in.

use quorumguard::engine::{Health, Member};
use serde_json::{Value, json};

/// Namespace of every object in the fixtures.
pub const NS: &str = "capi-test";
/// The KCP controller's service account, as in the fixtures.
pub const KCP_CONTROLLER: &str =
    "system:serviceaccount:capi-kubeadm-control-plane-system:capi-kubeadm-control-plane-manager";

/// etcd members of the fixture control plane as a sweep records them: `cp-{x}` (the fixture
/// Machines' nodes) with IDs from 0x1000, each healthy or not ("context deadline exceeded").
pub fn members(health: &[(&str, bool)]) -> Vec<Member> {
    health
        .iter()
        .enumerate()
        .map(|(i, (x, up))| {
            let mut m = Member::new(0x1000 + i as u64, format!("cp-{x}"));
            m.health = if *up {
                Health::Healthy
            } else {
                Health::Unhealthy("context deadline exceeded".into())
            };
            m
        })
        .collect()
}

/// One fixture review, parsed.
pub fn fixture(name: &str) -> Value {
    let path = crate::paths::repo_root().join(format!("tests/fixtures/admission-reviews/{name}"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("read fixture")).expect("json")
}

/// An object as it is created: the fields the server sets dropped.
pub fn stored(mut v: Value) -> Value {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "managedFields",
        ] {
            m.remove(k);
        }
    }
    v
}

/// The fixture's control-plane Machine, renamed to `name` and running node `node`.
pub fn machine_named(name: &str, node: &str) -> Value {
    let mut m = fixture("machine-delete-by-user.json")["request"]["oldObject"].clone();
    m["metadata"]["name"] = json!(name);
    m["status"]["nodeRef"]["name"] = json!(node);
    m
}

/// The fixture's KubeadmControlPlane `test-controlplane` (replicas 3), at Kubernetes v1.28.0:
/// kubeadm joins voting members there (no EtcdLearnerMode by default before v1.29), the stricter
/// reading, which the webhook, fault and race tests on the stand-in exercise (a new member votes
/// before it is healthy: `PendingJoin`, `ScaleUpWouldLoseQuorum`). Learner joins (v1.32) are held
/// by the engine's tests, `check` on the v1.32 fixtures and the playground's stories on real etcd.
pub fn kcp_object() -> Value {
    let mut k = fixture("kcp-update-version.json")["request"]["oldObject"].clone();
    k["spec"]["version"] = json!("v1.28.0");
    k
}

/// Cluster `test`, pointing at the fixture's KCP, with these annotations.
pub fn cluster_object(annotations: Value) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "test", "namespace": NS, "annotations": annotations},
        "spec": {"controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                 "kind": "KubeadmControlPlane", "name": "test-controlplane"}},
    })
}

/// A review whose `oldObject` carries managedFields entries until the whole body is at least
/// `bytes` long: what a real Machine carries (the fixtures were captured with them stripped).
pub fn with_managed_fields(mut review: Value, bytes: usize) -> Vec<u8> {
    let entry = json!({
        "manager": "manager", "operation": "Update", "apiVersion": "cluster.x-k8s.io/v1beta2",
        "time": "2026-11-30T10:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:cluster.x-k8s.io/cluster-name": {},
            "f:cluster.x-k8s.io/control-plane": {}, "f:cluster.x-k8s.io/control-plane-name": {}}},
            "f:status": {"f:addresses": {}, "f:conditions": {}, "f:nodeRef": {}, "f:phase": {}}}
    });
    let mut fields = Vec::new();
    while serde_json::to_vec(&review)
        .map(|v| v.len())
        .unwrap_or(usize::MAX)
        < bytes
    {
        fields.push(entry.clone());
        review["request"]["oldObject"]["metadata"]["managedFields"] = json!(fields);
    }
    serde_json::to_vec(&review).unwrap_or_default()
}

/// kube-apiserver's Machine DELETE review by a person (`machine-delete-by-user.json`, Machine
/// `test-cp-a`), grown to 10 KB with the managedFields a real Machine carries.
pub fn machine_delete_10k() -> Vec<u8> {
    with_managed_fields(fixture("machine-delete-by-user.json"), 10 * 1024)
}
