//! The unit tests of `status`'s selection: which KubeadmControlPlanes a Cluster name selects.

use super::mgmt::{Listed, Scope};
use super::select::{Unselected, select, unknown_cluster};
use quorumguard_observe::capi::{self, CapiCluster, CapiKcp};
use quorumguard_observe::state::Key;
use serde_json::json;

fn cluster(ns: &str, name: &str, kcp: Option<&str>) -> CapiCluster {
    let spec = match kcp {
        Some(k) => json!({"controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                                              "kind": "KubeadmControlPlane", "name": k}}),
        None => json!({}),
    };
    capi::parse_cluster(&json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))
    .expect("cluster")
}

fn kcp(ns: &str, name: &str, cluster: &str) -> CapiKcp {
    capi::parse_kcp(&json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": {"replicas": 3, "version": "v1.33.0"},
    }))
    .expect("kcp")
}

fn listed() -> Listed {
    Listed {
        clusters: vec![
            cluster("a", "c1", Some("c1-cp")),
            cluster("a", "c2", None),
            cluster("a", "dangling", Some("gone")),
            cluster("a", "bare", None),
            cluster("b", "c3", Some("c3-cp")),
        ],
        kcps: vec![
            kcp("a", "c1-cp", "c1"),
            kcp("a", "c2-cp", "c2"),
            kcp("b", "c3-cp", "c3"),
        ],
        ..Default::default()
    }
}

fn ns(n: &str) -> Scope {
    Scope::Namespace(n.into())
}

fn err(r: Result<Vec<Key>, Unselected>) -> String {
    match r {
        Ok(v) => panic!("selected {v:?}"),
        Err(Unselected::Other(e)) => format!("{e:#}"),
        Err(Unselected::UnknownCluster {
            namespace,
            name,
            names,
        }) => unknown_cluster(&namespace, &name, &names, &[]),
    }
}

fn key(ns: &str, name: &str) -> Key {
    (ns.into(), name.into())
}

#[test]
fn a_cluster_selects_its_kcp_by_reference_or_by_label() {
    let l = listed();
    assert!(matches!(
        select(&l, Some("c1"), &ns("a")),
        Ok(v) if v == [key("a", "c1-cp")]
    ));
    assert!(matches!(
        select(&l, Some("c2"), &ns("a")),
        Ok(v) if v == [key("a", "c2-cp")]
    ));
    assert!(matches!(
        select(&l, None, &ns("a")),
        Ok(v) if v.len() == 3
    ));
    assert!(matches!(select(&l, None, &Scope::All), Ok(v) if v.len() == 3));
}

#[test]
fn what_cannot_be_selected_is_explained() {
    let l = listed();
    let e = err(select(&l, Some("dangling"), &ns("a")));
    assert!(
        e.contains("Cluster a/dangling refers to KubeadmControlPlane gone"),
        "{e}"
    );
    let e = err(select(&l, Some("bare"), &ns("a")));
    assert!(
        e.contains("Cluster a/bare has no KubeadmControlPlane"),
        "{e}"
    );
    let e = err(select(&l, Some("nope"), &ns("a")));
    assert!(
        e.contains(
            "no Cluster \"nope\" in namespace a; Clusters in namespace a: bare, c1, c2, dangling."
        ),
        "{e}"
    );
    let e = err(select(&l, Some("c1"), &ns("b")));
    assert!(e.contains("Clusters in namespace b: c3"), "{e}");
    let e = err(select(&l, Some("c1"), &Scope::All));
    assert!(e.contains("across all namespaces"), "{e}");
}

#[test]
fn clusters_elsewhere_are_named_up_to_a_limit() {
    let others: Vec<String> = (0..25).map(|i| format!("ns/c{i:02}")).collect();
    let m = unknown_cluster("x", "c", &[], &others);
    assert!(m.contains("there are no Clusters in namespace x"), "{m}");
    assert!(m.contains("ns/c00, ns/c01"), "{m}");
    assert!(m.contains("ns/c19 and 5 more"), "{m}");
    assert!(!m.contains("ns/c20"), "{m}");
}
