//! The Cluster API objects of the world as the playground makes them: the seeded Cluster, KCP,
//! control-plane Machines and etcd CA Secret, and a new Machine as KCP creates it.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::backend::Backend;
use super::{
    CLUSTER, KCP, KCP_PRE_TERMINATE_HOOK, MACHINE_FINALIZER, NAMESPACE, OLD_VERSION, WorldError,
};
use crate::apiserver::{cluster_resource, health_check_resource, kcp_resource, machine_resource};
use crate::etcd::EtcdCluster;
use quorumguard_observe::etcd::endpoints::{ETCD_ENDPOINTS_ANNOTATION, ETCD_TRANSPORT_ANNOTATION};

/// Stores `object` (of resource `ar`): into the stand-in's store as it is, or on the real server
/// created as the admin and its status then written through the status subresource (as a
/// controller would: create ignores it), waiting until the world's reads have seen it.
async fn store(
    backend: &Backend,
    ar: &ApiResource,
    what: &str,
    object: Value,
) -> Result<(), WorldError> {
    let real = match backend {
        Backend::StandIn(api) => {
            return api
                .insert(object)
                .map(|_| ())
                .map_err(|source| WorldError::Store {
                    what: what.to_string(),
                    source,
                });
        }
        Backend::Real(real) => real,
    };
    let failed = |source| WorldError::Api {
        what: format!("creating {what}"),
        source,
    };
    let api: Api<DynamicObject> = Api::namespaced_with(real.admin_client()?, NAMESPACE, ar);
    let mut object = object;
    let status = object.as_object_mut().and_then(|o| o.remove("status"));
    // The server sets these itself.
    if let Some(meta) = object["metadata"].as_object_mut() {
        meta.remove("creationTimestamp");
        meta.remove("generation");
    }
    let dynamic: DynamicObject =
        serde_json::from_value(object).map_err(|e| WorldError::Other(format!("{what}: {e}")))?;
    let mut written = api
        .create(&PostParams::default(), &dynamic)
        .await
        .map_err(failed)?;
    if let Some(status) = status.filter(|s| s.is_object() && ar.kind != "Secret") {
        written = api
            .patch_status(
                &dynamic.metadata.name.clone().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .map_err(failed)?;
    }
    backend.seen(ar, Some(&written.metadata)).await
}

/// How long ago the seeded objects were created: the control plane has been running for months,
/// so its Machines are not mistaken for ones still joining (quorumguard gives a Machine without
/// a member `--join-grace` before calling it broken).
const SEEDED_AGE_SECS: i64 = 90 * 24 * 3600;

/// Seeds the Cluster, the KCP (`replicas`, `version`), one Machine per member (`version`) and
/// the etcd CA Secret.
pub(super) async fn seed(
    api: &Backend,
    etcd: &EtcdCluster,
    names: &[String],
    replicas: usize,
    version: &str,
) -> Result<(), WorldError> {
    let created = k8s_openapi::jiff::Timestamp::from_second(crate::unix_now() - SEEDED_AGE_SECS)
        .map(|t| t.to_string())
        .map_err(|e| WorldError::Other(format!("a creation time: {e}")))?;
    let cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {
            "name": CLUSTER,
            "namespace": NAMESPACE,
            "creationTimestamp": created,
            "annotations": {
                ETCD_TRANSPORT_ANNOTATION: "direct",
                ETCD_ENDPOINTS_ANNOTATION: etcd.endpoints().join(","),
            },
        },
        "spec": {
            "controlPlaneRef": {
                "apiGroup": "controlplane.cluster.x-k8s.io",
                "kind": "KubeadmControlPlane",
                "name": KCP,
            },
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "DevCluster",
                "name": CLUSTER,
            },
        },
    });
    let what = format!("Cluster {NAMESPACE}/{CLUSTER}");
    store(api, &cluster_resource(), &what, cluster).await?;
    let kcp = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmControlPlane",
        "metadata": {
            "name": KCP,
            "namespace": NAMESPACE,
            "creationTimestamp": created,
            "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER},
            "generation": 1,
        },
        "spec": {
            "replicas": replicas,
            "version": version,
            "kubeadmConfigSpec": {"clusterConfiguration": {"etcd": {"local": {"dataDir": "/var/lib/etcd"}}}},
            "machineTemplate": {"spec": {"infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "DevMachineTemplate",
                "name": KCP,
            }}},
            "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}},
        },
    });
    let what = format!("KubeadmControlPlane {NAMESPACE}/{KCP}");
    store(api, &kcp_resource(), &what, kcp).await?;
    let kcp_uid = kcp_uid(api);
    for name in names {
        let mut machine = machine_object(name, version, &kcp_uid);
        machine["metadata"]["creationTimestamp"] = json!(created);
        machine["status"] = json!({"nodeRef": {"name": name}, "phase": "Running"});
        let what = format!("Machine {NAMESPACE}/{name}");
        store(api, &machine_resource(), &what, machine).await?;
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{CLUSTER}-etcd")),
            namespace: Some(NAMESPACE.into()),
            labels: Some(
                [(
                    "cluster.x-k8s.io/cluster-name".to_string(),
                    CLUSTER.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [
                ("tls.crt", &etcd.pki.ca_cert_pem),
                ("tls.key", &etcd.pki.ca_key_pem),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
            .collect(),
        ),
        ..Default::default()
    };
    let secret = serde_json::to_value(&secret).map_err(|e| WorldError::Other(e.to_string()))?;
    let what = format!("Secret {NAMESPACE}/{CLUSTER}-etcd");
    store(api, &ApiResource::erase::<Secret>(&()), &what, secret).await
}

/// The name of the MachineHealthCheck the playground seeds (or a story creates).
pub const HEALTH_CHECK: &str = "dev-cp-mhc";

/// A MachineHealthCheck for the control plane that remediates nothing on its own in the
/// playground's time (a node must be `Ready: Unknown` for an hour, a Machine without a node
/// an hour old): it passes on the remediate-machine annotation (docs/runbook.md has the
/// same one).
pub fn health_check_object() -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineHealthCheck",
        "metadata": {"name": HEALTH_CHECK, "namespace": NAMESPACE},
        "spec": {
            "clusterName": CLUSTER,
            "selector": {"matchLabels": {"cluster.x-k8s.io/control-plane": ""}},
            "checks": {
                "nodeStartupTimeoutSeconds": 3600,
                "unhealthyNodeConditions": [
                    {"type": "Ready", "status": "Unknown", "timeoutSeconds": 3600}
                ],
            },
        },
    })
}

/// Stores [`health_check_object`].
pub(super) async fn seed_health_check(api: &Backend) -> Result<(), WorldError> {
    let what = format!("MachineHealthCheck {NAMESPACE}/{HEALTH_CHECK}");
    store(api, &health_check_resource(), &what, health_check_object()).await
}

impl super::World {
    /// A person creates the seeded MachineHealthCheck, `health_check_object` (`kubectl apply -f`).
    pub async fn create_health_check(&self) -> Result<(), WorldError> {
        seed_health_check(&self.api).await
    }
}

/// Stores a control-plane Machine of the old version as if created `age_secs` ago (on a real
/// kube-apiserver: now, the server stamps it), with extra annotations and, with `node`, its
/// node set.
pub(super) async fn old_machine(
    api: &Backend,
    name: &str,
    age_secs: i64,
    node: bool,
    annotations: &[&str],
) -> Result<(), WorldError> {
    let created = k8s_openapi::jiff::Timestamp::from_second(crate::unix_now() - age_secs)
        .map(|t| t.to_string())
        .map_err(|e| WorldError::Other(format!("a creation time: {e}")))?;
    let mut machine = machine_object(name, OLD_VERSION, &kcp_uid(api));
    machine["metadata"]["creationTimestamp"] = json!(created);
    for a in annotations {
        machine["metadata"]["annotations"][*a] = json!("");
    }
    machine["status"] = if node {
        json!({"nodeRef": {"name": name}, "phase": "Running"})
    } else {
        json!({"phase": "Provisioned"})
    };
    let what = format!("Machine {NAMESPACE}/{name}");
    store(api, &machine_resource(), &what, machine).await
}

/// The stored KCP's uid, for the Machines' owner reference.
pub(super) fn kcp_uid(api: &Backend) -> String {
    api.get(&kcp_resource(), NAMESPACE, KCP)
        .and_then(|k| k["metadata"]["uid"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A control-plane Machine of the KCP, as KCP creates it (no status).
pub(super) fn machine_object(name: &str, version: &str, kcp_uid: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {
                "cluster.x-k8s.io/cluster-name": CLUSTER,
                "cluster.x-k8s.io/control-plane": "",
                "cluster.x-k8s.io/control-plane-name": KCP,
            },
            "annotations": {KCP_PRE_TERMINATE_HOOK: ""},
            "finalizers": [MACHINE_FINALIZER],
            "ownerReferences": [{
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
                "kind": "KubeadmControlPlane",
                "name": KCP,
                "uid": kcp_uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "clusterName": CLUSTER,
            "version": version,
            "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
            "infrastructureRef": {
                "apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "DevMachine",
                "name": name,
            },
        },
    })
}
