//! The unit tests of [`crate::dumps`]: kubectl dumps in every format, and choosing the KCP.

use super::*;

fn objects_fixture(name: &str) -> String {
    let path = format!(
        "{}/../../tests/fixtures/objects/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).expect("fixture readable")
}

#[test]
fn kubectl_list_v1beta2() {
    let o = parse_objects(&objects_fixture("healthy.yaml"), "healthy.yaml").unwrap();
    assert_eq!(o.kcps.len(), 1);
    assert_eq!(o.machines.len(), 3);
    assert_eq!(o.clusters.len(), 1);
    let k = select_kcp(&o, None, "f").unwrap();
    let (cp, warnings) = control_plane(&o, k, EtcdState::Unknown { reason: "t".into() });
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(cp.kcp.replicas, 3);
    assert_eq!(cp.machines.len(), 3);
    assert_eq!(cp.cluster.name, "demo");
    assert!(cp.machines.iter().all(|m| {
        m.node_name
            .as_deref()
            .is_some_and(|n| n.starts_with("cp-node-"))
    }));
}

#[test]
fn v1beta1_list_equals_v1beta2_list() {
    let v2 = parse_objects(&objects_fixture("healthy.yaml"), "a").unwrap();
    let v1 = parse_objects(&objects_fixture("healthy-v1beta1.yaml"), "b").unwrap();
    let cp = |o: &Objects| {
        control_plane(
            o,
            select_kcp(o, None, "f").unwrap(),
            EtcdState::Unknown { reason: "t".into() },
        )
        .0
    };
    assert_eq!(cp(&v1), cp(&v2));
}

#[test]
fn multi_document_equals_list() {
    let list = parse_objects(&objects_fixture("rollout.yaml"), "a").unwrap();
    let multi = parse_objects(&objects_fixture("rollout-multidoc.yaml"), "b").unwrap();
    assert_eq!(list.kcps, multi.kcps);
    assert_eq!(list.machines, multi.machines);
    assert_eq!(list.clusters, multi.clusters);
    assert_eq!(list.machines.len(), 4);
}

#[test]
fn json_list_and_json_stream() {
    let yaml: Value = serde_yaml::from_str(&objects_fixture("rollout.yaml")).unwrap();
    let list = parse_objects(&yaml.to_string(), "x.json").unwrap();
    assert_eq!(list.machines.len(), 4);
    let items = yaml["items"].as_array().unwrap();
    let stream: String = items.iter().map(|i| format!("{i}\n")).collect();
    let s = parse_objects(&stream, "x.json").unwrap();
    assert_eq!(s.machines, list.machines);
    let single = parse_objects(&items[0].to_string(), "x.json").unwrap();
    assert_eq!(
        single.clusters.len() + single.kcps.len() + single.machines.len(),
        1
    );
}

#[test]
fn bad_inputs_name_the_file_and_the_problem() {
    let e = parse_objects("kind: [unclosed", "bad.yaml").unwrap_err();
    assert!(matches!(e, DumpError::Yaml { .. }), "{e}");
    assert!(e.to_string().starts_with("bad.yaml: not valid YAML"), "{e}");
    let e = parse_objects("{\"kind\": ", "bad.json").unwrap_err();
    assert!(e.to_string().starts_with("bad.json: not valid JSON"), "{e}");
    let e = parse_objects("just some words", "words.txt").unwrap_err();
    assert!(matches!(e, DumpError::NotAnObject { .. }), "{e}");
    let e = parse_objects(r#"{"header":{},"members":[]}"#, "ml.json").unwrap_err();
    assert!(e.to_string().contains("no apiVersion or kind"), "{e}");
    let o = parse_objects(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: n}\n",
        "d.yaml",
    )
    .unwrap();
    let e = select_kcp(&o, None, "d.yaml").unwrap_err();
    assert!(matches!(e, DumpError::NoKcp { .. }), "{e}");
    assert!(e.to_string().contains("Deployment n/d"), "{e}");
    let e = parse_objects(
        "apiVersion: cluster.x-k8s.io/v1beta2\nkind: Machine\nmetadata: {name: m}\n",
        "m.yaml",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "m.yaml: Machine ?/m: field metadata.namespace is missing"
    );
}

#[test]
fn choosing_among_several_kcps() {
    let mut text = objects_fixture("healthy.yaml");
    text.push_str("\n---\n");
    text.push_str(&objects_fixture("healthy.yaml").replace("namespace: demo", "namespace: other"));
    let o = parse_objects(&text, "two.yaml").unwrap();
    let e = select_kcp(&o, None, "two.yaml").unwrap_err();
    assert!(matches!(e, DumpError::AmbiguousKcp { count: 2, .. }), "{e}");
    assert!(
        e.to_string()
            .contains("demo/demo-control-plane, other/demo-control-plane"),
        "{e}"
    );
    let e = select_kcp(&o, Some("demo-control-plane"), "two.yaml").unwrap_err();
    assert!(matches!(e, DumpError::AmbiguousKcp { .. }), "{e}");
    let k = select_kcp(&o, Some("other/demo-control-plane"), "two.yaml").unwrap();
    assert_eq!(k.object.namespace, "other");
    let e = select_kcp(&o, Some("nope"), "two.yaml").unwrap_err();
    assert!(matches!(e, DumpError::KcpNotFound { .. }), "{e}");
    let (cp, _) = control_plane(&o, k, EtcdState::Unknown { reason: "t".into() });
    assert_eq!(cp.machines.len(), 3);
    assert_eq!(cp.kcp.namespace, "other");
}

/// A dump with a MachineHealthCheck: the control plane knows which one covers its Machines; a
/// dump without one says it does not know (never "none").
#[test]
fn machine_health_checks_in_the_dump() {
    let o = parse_objects(&objects_fixture("healthy.yaml"), "healthy.yaml").unwrap();
    let k = select_kcp(&o, None, "f").unwrap();
    let (cp, _) = control_plane(&o, k, EtcdState::Unknown { reason: "t".into() });
    match &cp.health_checks {
        HealthChecks::Unknown { reason } => {
            assert!(reason.contains("holds no MachineHealthCheck"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let mhc = "apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineHealthCheck
metadata: {name: demo-cp, namespace: demo}
spec:
  clusterName: demo
  selector: {matchLabels: {cluster.x-k8s.io/control-plane: ''}}
  remediation: {triggerIf: {unhealthyLessThanOrEqualTo: 1}}
";
    let text = format!("{}\n---\n{mhc}", objects_fixture("healthy.yaml"));
    let o = parse_objects(&text, "with-mhc.yaml").unwrap();
    assert_eq!(o.health_checks.len(), 1);
    let k = select_kcp(&o, None, "f").unwrap();
    let (cp, _) = control_plane(&o, k, EtcdState::Unknown { reason: "t".into() });
    let HealthChecks::Known(checks) = &cp.health_checks else {
        panic!("{:?}", cp.health_checks);
    };
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].name, "demo-cp");
    assert_eq!(checks[0].targets.len(), 3, "{checks:?}");
}
