//! The unit tests of [`crate::capi`]: parsing per kind and version, and the fixtures' reviews.

use super::testkit::review;
use super::*;
use quorumguard_engine::{ANNOTATION_DELETE_MACHINE, EtcdTopology};
use serde::Deserialize;
use serde_json::json;

fn parts(v: &Value) -> ObjectParts {
    ObjectParts::deserialize(v).expect("parts")
}

fn old_object(name: &str) -> Value {
    review(name)["request"]["oldObject"].clone()
}

fn v1beta2_machine() -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {
            "name": "demo-cp-abc12",
            "namespace": "demo",
            "creationTimestamp": "2025-01-02T03:04:05Z",
            "labels": {
                "cluster.x-k8s.io/cluster-name": "demo",
                "cluster.x-k8s.io/control-plane": "",
                "cluster.x-k8s.io/control-plane-name": "demo-cp"
            },
            "annotations": {"cluster.x-k8s.io/delete-machine": "yes"}
        },
        "spec": {"clusterName": "demo", "bootstrap": {}, "infrastructureRef": {}},
        "status": {"nodeRef": {"name": "node-1"}}
    })
}

#[test]
fn every_admission_review_old_object_parses() {
    let machine = |f: &str| parse_machine(&old_object(f)).expect("machine parses");
    for f in [
        "machine-delete-by-user.json",
        "machine-delete-by-kcp-controller.json",
        "machine-delete-dry-run.json",
    ] {
        let m = machine(f);
        assert_eq!(m.version, ApiVersion::V1Beta2, "{f}");
        assert!(m.machine.control_plane, "{f}");
        assert!(!m.machine.deleting, "{f}");
        assert_eq!(m.object.namespace, "capi-test", "{f}");
        assert_eq!(m.cluster_name.as_deref(), Some("test"), "{f}");
        assert_eq!(
            m.control_plane_name.as_deref(),
            Some("test-controlplane"),
            "{f}"
        );
        assert!(m.machine.created_unix.is_some(), "{f}");
        assert!(
            m.machine
                .annotation("pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup")
                .is_some(),
            "{f}"
        );
    }
    let by_user = machine("machine-delete-by-user.json");
    assert_eq!(by_user.machine.name, "test-cp-a");
    assert_eq!(by_user.machine.node_name.as_deref(), Some("cp-a"));
    // 2026-12-02T13:15:05Z
    assert_eq!(by_user.machine.created_unix, Some(1_796_217_305));

    for (f, replicas, version) in [
        ("kcp-update-replicas-5-to-3.json", 5, "v1.32.0"),
        ("kcp-update-version.json", 3, "v1.32.0"),
    ] {
        let k = parse_kcp(&old_object(f)).expect("kcp parses");
        assert_eq!(k.kcp.replicas, replicas, "{f}");
        assert_eq!(k.kcp.version.as_deref(), Some(version), "{f}");
        assert_eq!(k.kcp.etcd, EtcdTopology::Stacked, "{f}");
        assert_eq!(k.kcp.max_surge, 1, "{f}");
        assert_eq!(k.kcp.namespace, "capi-test", "{f}");
        assert_eq!(k.kcp.name, "test-controlplane", "{f}");
        assert_eq!(k.cluster_name.as_deref(), Some("test"), "{f}");
        assert!(!k.kcp.deleting, "{f}");
    }
    let new = review("kcp-update-replicas-5-to-3.json")["request"]["object"].clone();
    assert_eq!(kcp_from_value(&new).expect("new kcp").replicas, 3);

    // The scale subresource carries a Scale, not the KCP.
    let scale = old_object("kcp-scale-subresource-3-to-5.json");
    assert!(matches!(
        parse_kcp(&scale),
        Err(CapiError::WrongKind { .. })
    ));
    assert_eq!(scale_replicas(&parts(&scale)), Ok(3));
    let new = review("kcp-scale-subresource-3-to-5.json")["request"]["object"].clone();
    assert_eq!(scale_replicas(&parts(&new)), Ok(5));
}

#[test]
fn machine_addresses_and_cluster_endpoints_annotation() {
    let mut v = v1beta2_machine();
    v["status"]["addresses"] = json!([
        {"type": "Hostname", "address": "node-1"},
        {"type": "InternalIP", "address": "10.0.0.5"},
        {"type": "ExternalIP", "address": "203.0.113.9"},
        {"type": "InternalIP", "address": ""}
    ]);
    let m = parse_machine(&v).expect("parses");
    assert_eq!(m.internal_ips, ["10.0.0.5"]);
    assert!(
        parse_machine(&v1beta2_machine())
            .expect("parses")
            .internal_ips
            .is_empty()
    );
    let c = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "demo", "namespace": "demo",
            "annotations": {ANNOTATION_ETCD_ENDPOINTS: "https://127.0.0.1:2379,https://127.0.0.1:3379"}},
        "spec": {}
    });
    let c = parse_cluster(&c).expect("cluster");
    assert_eq!(
        c.etcd_endpoints.as_deref(),
        Some("https://127.0.0.1:2379,https://127.0.0.1:3379")
    );
    assert_eq!(c.etcd_transport, None);
    let c = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "demo", "namespace": "demo",
            "annotations": {ANNOTATION_ETCD_TRANSPORT: "direct"}},
        "spec": {}
    });
    let c = parse_cluster(&c).expect("cluster");
    assert_eq!(c.etcd_transport.as_deref(), Some("direct"));
    assert_eq!(
        ANNOTATION_ETCD_TRANSPORT,
        crate::etcd::ETCD_TRANSPORT_ANNOTATION
    );
}

#[test]
fn v1beta2_machine_fields() {
    let m = parse_machine(&v1beta2_machine()).expect("parses");
    assert_eq!(m.object.to_string(), "Machine demo/demo-cp-abc12");
    assert_eq!(m.machine.name, "demo-cp-abc12");
    assert_eq!(m.machine.node_name.as_deref(), Some("node-1"));
    assert_eq!(m.machine.annotation(ANNOTATION_DELETE_MACHINE), Some("yes"));
    assert_eq!(m.machine.created_unix, Some(1_735_787_045));
    assert_eq!(m.control_plane_name.as_deref(), Some("demo-cp"));
}

#[test]
fn v1beta1_machine_full_node_ref_and_owner_fallback() {
    let v = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1",
        "kind": "Machine",
        "metadata": {
            "name": "m1", "namespace": "ns",
            "deletionTimestamp": "2025-01-02T03:04:05Z",
            "labels": {"cluster.x-k8s.io/control-plane": ""},
            "ownerReferences": [
                {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet", "name": "ms", "uid": "1", "controller": false},
                {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlane", "name": "kcp1", "uid": "2", "controller": true}
            ]
        },
        "spec": {"clusterName": "c1"},
        "status": {"nodeRef": {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "x"}}
    });
    let m = parse_machine(&v).expect("parses");
    assert_eq!(m.version, ApiVersion::V1Beta1);
    assert_eq!(m.machine.node_name.as_deref(), Some("n1"));
    assert!(m.machine.deleting);
    assert!(m.machine.control_plane);
    assert_eq!(m.control_plane_name.as_deref(), Some("kcp1"));
    assert_eq!(m.cluster_name.as_deref(), Some("c1"));
}

#[test]
fn machine_without_node_ref_or_labels() {
    let mut v = v1beta2_machine();
    v["status"] = json!({});
    v["metadata"]["labels"] = json!({});
    let m = parse_machine(&v).expect("parses");
    assert_eq!(m.machine.node_name, None);
    assert!(!m.machine.control_plane);
    assert_eq!(m.control_plane_name, None);
    assert_eq!(m.cluster_name.as_deref(), Some("demo"));
}

#[test]
fn machine_errors_name_object_and_field() {
    let mut v = v1beta2_machine();
    v["status"]["nodeRef"]["name"] = json!(7);
    let e = parse_machine(&v).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Machine demo/demo-cp-abc12: field status.nodeRef.name is invalid: expected a string, found 7"
    );

    let mut v = v1beta2_machine();
    v["metadata"].as_object_mut().unwrap().remove("namespace");
    let e = parse_machine(&v).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Machine ?/demo-cp-abc12: field metadata.namespace is missing"
    );

    let mut v = v1beta2_machine();
    v["apiVersion"] = json!("cluster.x-k8s.io/v1alpha3");
    assert!(matches!(
        parse_machine(&v),
        Err(CapiError::UnsupportedVersion { .. })
    ));

    let mut v = v1beta2_machine();
    v["kind"] = json!("MachineSet");
    let e = parse_machine(&v).unwrap_err();
    assert!(matches!(e, CapiError::WrongKind { .. }), "{e}");
    assert!(e.to_string().contains("MachineSet"), "{e}");

    assert!(matches!(
        parse_machine(&json!([1])),
        Err(CapiError::NotAnObject { .. })
    ));
    assert!(matches!(
        parse_machine(&json!({"members": []})),
        Err(CapiError::NotAnObject { .. })
    ));
    let mut v = v1beta2_machine();
    v["metadata"]["labels"] = json!("nope");
    assert!(matches!(
        parse_machine(&v),
        Err(CapiError::InvalidField {
            field: "metadata",
            ..
        })
    ));
}

fn kcp(version: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("controlplane.cluster.x-k8s.io/{version}"),
        "kind": "KubeadmControlPlane",
        "metadata": {"name": "k", "namespace": "ns", "labels": {"cluster.x-k8s.io/cluster-name": "c"}},
        "spec": spec
    })
}

#[test]
fn kcp_defaults() {
    let k = parse_kcp(&kcp("v1beta2", json!({"version": "v1.33.0"}))).expect("parses");
    assert_eq!(k.kcp.replicas, 1);
    assert_eq!(k.kcp.max_surge, 1);
    assert_eq!(k.kcp.etcd, EtcdTopology::Stacked);
    assert_eq!(k.cluster_name.as_deref(), Some("c"));
}

#[test]
fn kcp_max_surge_per_version() {
    let v2 = json!({"replicas": 3, "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0}}}});
    assert_eq!(
        kcp_from_value(&kcp("v1beta2", v2.clone()))
            .unwrap()
            .max_surge,
        0
    );
    // The v1beta2 path means nothing in v1beta1, and the other way round.
    assert_eq!(kcp_from_value(&kcp("v1beta1", v2)).unwrap().max_surge, 1);
    let v1 = json!({"replicas": 3, "rolloutStrategy": {"rollingUpdate": {"maxSurge": "0"}}});
    assert_eq!(
        kcp_from_value(&kcp("v1beta1", v1.clone()))
            .unwrap()
            .max_surge,
        0
    );
    assert_eq!(kcp_from_value(&kcp("v1beta2", v1)).unwrap().max_surge, 1);
    let s = json!({"rolloutStrategy": {"rollingUpdate": {"maxSurge": "1"}}});
    assert_eq!(kcp_from_value(&kcp("v1beta1", s)).unwrap().max_surge, 1);
    let bad = json!({"rolloutStrategy": {"rollingUpdate": {"maxSurge": "50%"}}});
    let e = kcp_from_value(&kcp("v1beta1", bad)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "KubeadmControlPlane ns/k: field spec.rolloutStrategy.rollingUpdate.maxSurge is invalid: expected an absolute number (0 or 1), found \"50%\""
    );
}

#[test]
fn kcp_external_etcd_deleting_and_bad_replicas() {
    let mut v = kcp(
        "v1beta2",
        json!({"replicas": 3, "kubeadmConfigSpec": {"clusterConfiguration": {"etcd": {"external": {"endpoints": ["https://e:2379"]}}}}}),
    );
    v["metadata"]["deletionTimestamp"] = json!("2025-01-02T03:04:05Z");
    let k = kcp_from_value(&v).unwrap();
    assert_eq!(k.etcd, EtcdTopology::External);
    assert!(k.deleting);

    let e = kcp_from_value(&kcp("v1beta2", json!({"replicas": -1}))).unwrap_err();
    assert!(e.to_string().contains("spec.replicas"), "{e}");
    let e = kcp_from_value(&kcp("v1beta2", json!({"replicas": "3"}))).unwrap_err();
    assert!(e.to_string().contains("spec.replicas"), "{e}");
}

#[test]
fn kcp_etcd_learner_mode_gate_where_set() {
    let gate = |g: serde_json::Value| {
        kcp_from_value(&kcp(
            "v1beta2",
            json!({"replicas": 3, "version": "v1.30.1", "kubeadmConfigSpec": {"clusterConfiguration": {"featureGates": g}}}),
        ))
        .unwrap()
        .etcd_learner_mode
    };
    assert_eq!(gate(json!({"EtcdLearnerMode": false})), Some(false));
    assert_eq!(
        gate(json!({"EtcdLearnerMode": true, "Other": true})),
        Some(true)
    );
    assert_eq!(gate(json!({"Other": true})), None);
    assert_eq!(gate(json!({"EtcdLearnerMode": "yes"})), None);
    assert_eq!(gate(json!(null)), None);
    let k = kcp_from_value(&kcp("v1beta2", json!({"replicas": 3}))).unwrap();
    assert_eq!(k.etcd_learner_mode, None);
    assert_eq!(k.etcd, EtcdTopology::Stacked);
}

#[test]
fn kcp_cluster_from_owner_reference() {
    let mut v = kcp("v1beta2", json!({}));
    v["metadata"]["labels"] = json!({});
    v["metadata"]["ownerReferences"] = json!([{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "owner", "uid": "u"}]);
    assert_eq!(
        parse_kcp(&v).unwrap().cluster_name.as_deref(),
        Some("owner")
    );
}

#[test]
fn cluster_both_versions() {
    let v2 = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": "k"}}
    });
    let c = parse_cluster(&v2).unwrap();
    assert_eq!(c.control_plane_name.as_deref(), Some("k"));
    assert!(!c.cluster.deleting);
    let v1 = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "c", "namespace": "ns", "deletionTimestamp": "2025-01-02T03:04:05Z"},
        "spec": {"controlPlaneRef": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlane", "name": "k", "namespace": "ns"}}
    });
    let c = parse_cluster(&v1).unwrap();
    assert_eq!(c.control_plane_name.as_deref(), Some("k"));
    assert!(cluster_from_value(&v1).unwrap().deleting);
}

#[test]
fn kinds_are_told_apart_by_group() {
    let other = json!({"apiVersion": "machine.openshift.io/v1beta1", "kind": "Machine"});
    assert!(!is_machine(&other));
    assert!(is_machine(&v1beta2_machine()));
    assert!(is_kcp(&kcp("v1beta1", json!({}))));
    assert!(!is_cluster(&kcp("v1beta1", json!({}))));
    assert_eq!(
        type_of(&json!({"apiVersion": "v1", "kind": "List"})),
        Some(("", "v1", "List"))
    );
}

/// A MachineHealthCheck's last count shows on the Machine: `HealthCheckSucceeded` or
/// `OwnerRemediated` False (v1.14 `needsRemediation`, `patchUnhealthyTargets`). Conditions of
/// any other shape read as none, from a value and from request bytes alike.
#[test]
fn machine_health_check_conditions() {
    let with = |conditions: Value| {
        let mut v = v1beta2_machine();
        v["status"]["conditions"] = conditions;
        let from_value = parse_machine(&v)
            .expect("parses")
            .machine
            .health_check_failed;
        let bytes = serde_json::to_string(&v).expect("JSON");
        let p: ObjectParts = serde_json::from_str(&bytes).expect("parts from bytes");
        let from_bytes = machine_from_parts(&p)
            .expect("parses")
            .machine
            .health_check_failed;
        assert_eq!(from_value, from_bytes, "{v}");
        from_value
    };
    let cond = |t: &str, s: &str| json!({"type": t, "status": s, "reason": "R", "message": "m\n  * x", "lastTransitionTime": "2025-01-02T03:04:05Z"});
    assert!(with(json!([
        cond("Ready", "True"),
        cond("HealthCheckSucceeded", "False")
    ])));
    assert!(with(json!([cond("OwnerRemediated", "False")])));
    assert!(!with(json!([
        cond("HealthCheckSucceeded", "True"),
        cond("OwnerRemediated", "True")
    ])));
    assert!(!with(json!([cond("HealthCheckSucceeded", "Unknown")])));
    assert!(!with(json!([cond("NodeHealthy", "False")])));
    assert!(!with(json!([])));
    // Shapes no API server would store: no error, no condition.
    assert!(!with(json!("HealthCheckSucceeded")));
    assert!(!with(
        json!({"type": "HealthCheckSucceeded", "status": "False"})
    ));
    assert!(with(
        json!([7, null, "x", [1], {"type": 1, "status": false}, cond("HealthCheckSucceeded", "False")])
    ));
    assert!(!with(
        json!([{"type": ["HealthCheckSucceeded"], "status": "False"}])
    ));
    // v1beta1 Machines: status.conditions are Cluster API's v1beta1 conditions, same type.
    let mut v1 = v1beta2_machine();
    v1["apiVersion"] = json!("cluster.x-k8s.io/v1beta1");
    v1["status"]["conditions"] = json!([{"type": "HealthCheckSucceeded", "status": "False", "severity": "Warning", "reason": "UnhealthyNode"}]);
    assert!(
        parse_machine(&v1)
            .expect("parses")
            .machine
            .health_check_failed
    );
}

/// What pauses KCP and the MachineHealthChecks: the Cluster's `spec.paused`, the KCP's
/// `cluster.x-k8s.io/paused` annotation (v1.14 `annotations.IsPaused`).
#[test]
fn paused_cluster_and_kcp() {
    let mut k = kcp("v1beta2", json!({"version": "v1.33.0"}));
    assert!(!parse_kcp(&k).unwrap().kcp.paused);
    k["metadata"]["annotations"] = json!({ANNOTATION_PAUSED: ""});
    assert!(parse_kcp(&k).unwrap().kcp.paused);
    for version in ["v1beta1", "v1beta2"] {
        let cluster = |spec: Value| {
            json!({
                "apiVersion": format!("cluster.x-k8s.io/{version}"), "kind": "Cluster",
                "metadata": {"name": "c", "namespace": "ns"}, "spec": spec
            })
        };
        assert!(
            parse_cluster(&cluster(json!({"paused": true})))
                .unwrap()
                .cluster
                .paused
        );
        assert!(
            !parse_cluster(&cluster(json!({"paused": false})))
                .unwrap()
                .cluster
                .paused
        );
        assert!(!parse_cluster(&cluster(json!({}))).unwrap().cluster.paused);
    }
}
