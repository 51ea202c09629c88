//! A workload cluster's objects in the API-server stand-in, as Cluster API stores them: a
//! Cluster, its KubeadmControlPlane (replicas 3, from the fixtures), one control-plane Machine per
//! etcd member (its node named like the member, as kubeadm names members) and Secret
//! `<cluster>-etcd` with the etcd CA.

use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};

use super::apiserver::ApiServer;
use super::etcd::{EtcdCluster, Pki};
use super::reviews::{NS, cluster_object, kcp_object, machine_named, stored};

/// Name of the fixture KCP of Cluster `test`.
pub const KCP: &str = "test-controlplane";

/// The Machine `test-<member>` of member `member` in the fixture namespace.
pub fn machine(member: &str) -> Value {
    machine_named(&format!("test-{member}"), member)
}

/// A Secret `namespace/name` with these keys.
pub fn secret(namespace: &str, name: &str, data: &[(&str, &str)]) -> Value {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    serde_json::to_value(&secret).expect("secret json")
}

/// Secret `<cluster>-etcd` in `namespace` holding the CA of `pki` (keys tls.crt, tls.key).
pub fn etcd_ca_secret(namespace: &str, cluster: &str, pki: &Pki) -> Value {
    let mut s = secret(
        namespace,
        &format!("{cluster}-etcd"),
        &[("tls.crt", &pki.ca_cert_pem), ("tls.key", &pki.ca_key_pem)],
    );
    s["type"] = json!("kubernetes.io/tls");
    s
}

/// Seeds Cluster `cluster` in `namespace` (with `annotations`), its KCP
/// `<cluster>-controlplane` (changed by `kcp`), one Machine `<cluster>-<member>` per member and,
/// when `ca` is given, Secret `<cluster>-etcd` with that CA.
pub fn cluster(
    api: &ApiServer,
    namespace: &str,
    cluster: &str,
    annotations: Value,
    members: &[String],
    ca: Option<&Pki>,
    kcp: impl FnOnce(&mut Value),
) {
    for object in cluster_objects(namespace, cluster, annotations, members, ca, kcp) {
        api.insert(object).expect("seed an object");
    }
}

/// The objects [`cluster`] seeds, in that order (a Machine's `status.nodeRef` included: a real
/// API server takes it through the status subresource only).
pub fn cluster_objects(
    namespace: &str,
    cluster: &str,
    annotations: Value,
    members: &[String],
    ca: Option<&Pki>,
    kcp: impl FnOnce(&mut Value),
) -> Vec<Value> {
    let kcp_name = format!("{cluster}-controlplane");
    let mut c = cluster_object(annotations);
    c["metadata"]["namespace"] = json!(namespace);
    c["metadata"]["name"] = json!(cluster);
    c["spec"]["controlPlaneRef"]["name"] = json!(kcp_name);
    let mut k = stored(kcp_object());
    k["metadata"]["namespace"] = json!(namespace);
    k["metadata"]["name"] = json!(kcp_name);
    k["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!(cluster);
    kcp(&mut k);
    let mut objects = vec![c, k];
    for m in members {
        let mut machine = stored(machine_named(&format!("{cluster}-{m}"), m));
        machine["metadata"]["namespace"] = json!(namespace);
        machine["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!(cluster);
        machine["metadata"]["labels"]["cluster.x-k8s.io/control-plane-name"] = json!(kcp_name);
        machine["spec"]["clusterName"] = json!(cluster);
        objects.push(machine);
    }
    if let Some(pki) = ca {
        objects.push(etcd_ca_secret(namespace, cluster, pki));
    }
    objects.push(health_check(namespace, cluster, &kcp_name));
    objects
}

/// A MachineHealthCheck over the control-plane Machines of KCP `kcp_name`, as a real
/// management cluster has for remediation to happen (docs/rules.md): without one the next
/// action asks for it (`EnableRemediation`) instead of a remediation. It acts on nothing by
/// itself (an hour's timeouts), like the playground's.
pub fn health_check(namespace: &str, cluster: &str, kcp_name: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineHealthCheck",
        "metadata": {"name": format!("{cluster}-cp-mhc"), "namespace": namespace},
        "spec": {
            "clusterName": cluster,
            "selector": {"matchLabels": {"cluster.x-k8s.io/control-plane-name": kcp_name}},
            "checks": {
                "nodeStartupTimeoutSeconds": 3600,
                "unhealthyNodeConditions": [
                    {"type": "Ready", "status": "Unknown", "timeoutSeconds": 3600}
                ],
            },
        },
    })
}

/// Cluster `test` in the fixture namespace over every member of `etcd`, with its CA Secret.
/// Returns the member names.
pub fn control_plane(
    api: &ApiServer,
    etcd: &EtcdCluster,
    annotations: Value,
    kcp: impl FnOnce(&mut Value),
) -> Vec<String> {
    let members: Vec<String> = (0..etcd.len()).map(|i| etcd.name(i).to_string()).collect();
    cluster(api, NS, "test", annotations, &members, Some(&etcd.pki), kcp);
    members
}

/// The Cluster annotations for the direct transport to `etcd`'s members.
pub fn direct_to(etcd: &EtcdCluster) -> Value {
    json!({
        "quorumguard.io/etcd-endpoints": etcd.endpoints().join(","),
        "quorumguard.io/etcd-transport": "direct",
    })
}

/// Waits until `done` holds, polling every 25 ms; fails the test after `bound` (and after 2,000
/// polls at most, so the loop is bounded in count as well as time).
pub async fn wait_for(what: &str, bound: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    for _ in 0..2000 {
        if done() {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("gave up waiting for {what}");
}
