//! Machines, KubeadmControlPlanes, Clusters and Scales read from their [`ObjectParts`] into the
//! engine's model, with the names that place them (KCP, Cluster) and the KCP rollout check.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;

use super::fields::{
    any_owner, at, controller_owner, int_or_string, invalid, optional_str, wrong_kind,
};
use super::parts::lenient;
use super::{
    ANNOTATION_ETCD_ENDPOINTS, ANNOTATION_ETCD_TRANSPORT, ANNOTATION_PAUSED, ApiVersion, CapiError,
    GROUP_CLUSTER, GROUP_CONTROL_PLANE, KIND_CLUSTER, KIND_KCP, KIND_MACHINE, ObjectParts,
    ObjectRef, split_type,
};
use quorumguard_engine::autopilot::ANNOTATION_AUTOPILOT;
use quorumguard_engine::{
    Cluster, EtcdTopology, Kcp, LABEL_CLUSTER_NAME, LABEL_CONTROL_PLANE, LABEL_CONTROL_PLANE_NAME,
    Machine,
};

/// Machine condition a MachineHealthCheck sets False on a target it counts unhealthy (v1.14
/// `MachineHealthCheckSucceededCondition`; the v1beta1 condition has the same type).
pub const CONDITION_HEALTH_CHECK_SUCCEEDED: &str = "HealthCheckSucceeded";
/// Machine condition a MachineHealthCheck sets False on a target it passes on for remediation
/// (v1.14 `MachineOwnerRemediatedCondition`, `patchUnhealthyTargets`).
pub const CONDITION_OWNER_REMEDIATED: &str = "OwnerRemediated";

/// A Machine with what is needed to place it: the engine knows Machines only inside one
/// control plane, so the adapter keeps the KCP and Cluster it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapiMachine {
    pub object: ObjectRef,
    pub version: ApiVersion,
    pub machine: Machine,
    /// `spec.clusterName` (falls back to the cluster-name label).
    pub cluster_name: Option<String>,
    /// The KCP it belongs to: label `cluster.x-k8s.io/control-plane-name`, else the controller
    /// ownerReference of kind KubeadmControlPlane.
    pub control_plane_name: Option<String>,
    /// `status.addresses` of type InternalIP: where the direct etcd transport dials.
    pub internal_ips: Vec<String>,
    /// `metadata.labels`: what a MachineHealthCheck's selector matches.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Which object it is: the autopilot deletes only the Machine it proved memberless.
    pub identity: Identity,
}

/// `metadata.uid` and `metadata.resourceVersion` as cached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

impl Identity {
    fn of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Identity {
        Identity {
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
        }
    }
}

/// A KubeadmControlPlane with the Cluster it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapiKcp {
    pub object: ObjectRef,
    pub version: ApiVersion,
    pub kcp: Kcp,
    /// Label `cluster.x-k8s.io/cluster-name`, else an ownerReference of kind Cluster.
    pub cluster_name: Option<String>,
    /// `metadata.generation`: the published conditions' `observedGeneration`.
    pub generation: Option<i64>,
    /// `metadata.uid`: the KCP's Events name it, so `kubectl describe` finds them.
    pub uid: Option<String>,
    /// Annotation `quorumguard.io/autopilot`, as written (the engine reads it:
    /// `quorumguard_engine::autopilot::Mode::effective`).
    pub autopilot: Option<String>,
}

/// A Cluster with the control plane it points to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapiCluster {
    pub object: ObjectRef,
    pub version: ApiVersion,
    pub cluster: Cluster,
    /// `spec.controlPlaneRef.name` when that reference is a KubeadmControlPlane.
    pub control_plane_name: Option<String>,
    /// Annotation `quorumguard.io/etcd-endpoints`: etcd client URLs that override the Machines'
    /// addresses for the direct transport.
    pub etcd_endpoints: Option<String>,
    /// Annotation `quorumguard.io/etcd-transport`, as written (the prober parses it, so that a
    /// bad value is reported on the probe rather than hiding the Cluster).
    pub etcd_transport: Option<String>,
}

/// A Machine from its parts (see [`parse_machine`](super::parse_machine)).
pub fn machine_from_parts(p: &ObjectParts) -> Result<CapiMachine, CapiError> {
    let (version, object) = p.header(GROUP_CLUSTER, KIND_MACHINE)?;
    let meta = &p.metadata;
    let labels = meta.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k));
    // v1beta2: nodeRef {name} (name required); v1beta1: a full ObjectReference (name optional).
    let node_name = match &p.status.node_ref {
        None => None,
        Some(r) => match r.get("name") {
            None | Some(Value::Null) => None,
            Some(Value::String(n)) if n.is_empty() => None,
            Some(Value::String(n)) => Some(n.clone()),
            Some(other) => {
                return Err(invalid(
                    &object,
                    "status.nodeRef.name",
                    format!("expected a string, found {other}"),
                ));
            }
        },
    };
    let cluster_name = optional_str(p.spec.cluster_name.as_ref(), &object, "spec.clusterName")?
        .or_else(|| label(LABEL_CLUSTER_NAME).cloned());
    let control_plane_name = label(LABEL_CONTROL_PLANE_NAME)
        .filter(|n| !n.is_empty())
        .cloned()
        .or_else(|| controller_owner(meta, GROUP_CONTROL_PLANE, KIND_KCP));
    let machine = Machine {
        name: object.name.clone(),
        node_name,
        deleting: meta.deletion_timestamp.is_some(),
        control_plane: label(LABEL_CONTROL_PLANE).is_some(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        created_unix: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        health_check_failed: p.status.conditions.iter().any(|c| {
            matches!(
                c.kind.as_deref(),
                Some(CONDITION_HEALTH_CHECK_SUCCEEDED | CONDITION_OWNER_REMEDIATED)
            ) && c.status.as_deref() == Some("False")
        }),
    };
    // Both versions: status.addresses[] {type, address}.
    let internal_ips = p
        .status
        .addresses
        .as_ref()
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|x| x.get("type").and_then(Value::as_str) == Some("InternalIP"))
                .filter_map(|x| x.get("address").and_then(Value::as_str))
                .filter(|ip| !ip.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Ok(CapiMachine {
        object,
        version,
        machine,
        cluster_name,
        control_plane_name,
        internal_ips,
        labels: labels.cloned().unwrap_or_default(),
        identity: Identity::of(meta),
    })
}

/// A KubeadmControlPlane from its parts (see [`parse_kcp`](super::parse_kcp)).
pub fn kcp_from_parts(p: &ObjectParts) -> Result<CapiKcp, CapiError> {
    let (version, object) = p.header(GROUP_CONTROL_PLANE, KIND_KCP)?;
    let meta = &p.metadata;
    // The CRD defaults replicas to 1 when absent.
    let replicas = match &p.spec.replicas {
        None => 1,
        Some(r) => r
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                invalid(
                    &object,
                    "spec.replicas",
                    format!("expected a non-negative integer, found {r}"),
                )
            })?,
    };
    let kcp_version = optional_str(p.spec.version.as_ref(), &object, "spec.version")?;
    let kubeadm = p.spec.kubeadm_config_spec.as_deref().map(kubeadm_etcd);
    let etcd = if kubeadm.as_ref().is_some_and(|k| k.external) {
        EtcdTopology::External
    } else {
        EtcdTopology::Stacked
    };
    let etcd_learner_mode = kubeadm.and_then(|k| k.learner_mode);
    let (surge_root, surge_path, surge_field): (_, &[&str], &'static str) = match version {
        ApiVersion::V1Beta2 => (
            &p.spec.rollout,
            &["strategy", "rollingUpdate", "maxSurge"],
            "spec.rollout.strategy.rollingUpdate.maxSurge",
        ),
        ApiVersion::V1Beta1 => (
            &p.spec.rollout_strategy,
            &["rollingUpdate", "maxSurge"],
            "spec.rolloutStrategy.rollingUpdate.maxSurge",
        ),
    };
    // int-or-string; CAPI allows only the absolute numbers 1 and 0, and defaults to 1.
    let max_surge = match surge_root.as_ref().and_then(|r| at(r, surge_path)) {
        None => 1,
        Some(s) => int_or_string(s).ok_or_else(|| {
            invalid(
                &object,
                surge_field,
                format!("expected an absolute number (0 or 1), found {s}"),
            )
        })?,
    };
    let cluster_name = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_CLUSTER_NAME))
        .filter(|n| !n.is_empty())
        .cloned()
        .or_else(|| any_owner(meta, GROUP_CLUSTER, KIND_CLUSTER));
    let kcp = Kcp {
        name: object.name.clone(),
        namespace: object.namespace.clone(),
        replicas,
        etcd,
        max_surge,
        deleting: meta.deletion_timestamp.is_some(),
        version: kcp_version,
        etcd_learner_mode,
        paused: meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ANNOTATION_PAUSED)),
    };
    Ok(CapiKcp {
        object,
        version,
        kcp,
        cluster_name,
        generation: meta.generation,
        uid: meta.uid.clone(),
        autopilot: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_AUTOPILOT))
            .cloned(),
    })
}

/// What the rules read of `spec.kubeadmConfigSpec.clusterConfiguration`.
struct KubeadmEtcd {
    /// `etcd.external` is set (not null).
    external: bool,
    /// `featureGates.EtcdLearnerMode`, where set: with `spec.version` it decides whether a
    /// join adds a learner or a voting member (`quorumguard_engine::joins`).
    learner_mode: Option<bool>,
}

fn kubeadm_etcd(kubeadm_config_spec: &RawValue) -> KubeadmEtcd {
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct KubeadmConfigSpec {
        #[serde(default, deserialize_with = "lenient")]
        cluster_configuration: ClusterConfiguration,
    }
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ClusterConfiguration {
        #[serde(default, deserialize_with = "lenient")]
        etcd: Etcd,
        #[serde(default, deserialize_with = "lenient")]
        feature_gates: FeatureGates,
    }
    #[derive(Default, Deserialize)]
    struct Etcd {
        external: Option<IgnoredAny>,
    }
    #[derive(Default, Deserialize)]
    struct FeatureGates {
        /// A bool as kubeadm reads it; anything else is as if unset.
        #[serde(rename = "EtcdLearnerMode", default)]
        etcd_learner_mode: Option<Value>,
    }
    let mut d = serde_json::Deserializer::from_str(kubeadm_config_spec.get());
    match lenient::<_, KubeadmConfigSpec>(&mut d) {
        Ok(k) => KubeadmEtcd {
            external: k.cluster_configuration.etcd.external.is_some(),
            learner_mode: k
                .cluster_configuration
                .feature_gates
                .etcd_learner_mode
                .and_then(|v| v.as_bool()),
        },
        Err(_) => KubeadmEtcd {
            external: false,
            learner_mode: None,
        },
    }
}

/// Whether a KCP UPDATE from `old` to `new` makes KCP roll out new Machines: it changes the
/// version, the kubeadm config or the machine template. The two subtrees are compared as the
/// text they arrived as (kube-apiserver writes both objects alike), and only when the texts
/// differ, as JSON values, so that formatting alone is never a change.
pub fn starts_rollout(old: &ObjectParts, new: &ObjectParts) -> bool {
    fn differ(a: &Option<Box<RawValue>>, b: &Option<Box<RawValue>>) -> bool {
        match (a, b) {
            (None, None) => false,
            (Some(a), Some(b)) if a.get() == b.get() => false,
            (Some(a), Some(b)) => {
                let value = |r: &RawValue| serde_json::from_str::<Value>(r.get()).ok();
                let (a, b) = (value(a), value(b));
                a.is_none() || a != b
            }
            _ => true,
        }
    }
    let (o, n) = (&old.spec, &new.spec);
    o.version != n.version
        || differ(&o.kubeadm_config_spec, &n.kubeadm_config_spec)
        || differ(&o.machine_template, &n.machine_template)
}

/// A Cluster from its parts (see [`parse_cluster`](super::parse_cluster)).
pub fn cluster_from_parts(p: &ObjectParts) -> Result<CapiCluster, CapiError> {
    let (version, object) = p.header(GROUP_CLUSTER, KIND_CLUSTER)?;
    let meta = &p.metadata;
    // Both versions carry kind and name in spec.controlPlaneRef (v1beta2 apiGroup, v1beta1
    // apiVersion beside them).
    let control_plane_name = match &p.spec.control_plane_ref {
        Some(r) if r.get("kind").and_then(Value::as_str) == Some(KIND_KCP) => r
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string),
        _ => None,
    };
    let cluster = Cluster {
        name: object.name.clone(),
        deleting: meta.deletion_timestamp.is_some(),
        // Both versions: `spec.paused`, a bool (`ptr.Deref(cluster.Spec.Paused, false)`).
        paused: p.spec.paused.as_ref().and_then(Value::as_bool) == Some(true),
    };
    let annotation = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .filter(|e| !e.trim().is_empty())
            .cloned()
    };
    Ok(CapiCluster {
        object,
        version,
        cluster,
        control_plane_name,
        etcd_endpoints: annotation(ANNOTATION_ETCD_ENDPOINTS),
        etcd_transport: annotation(ANNOTATION_ETCD_TRANSPORT),
    })
}

/// `spec.replicas` of an `autoscaling/v1` Scale: what a KCP scale-subresource UPDATE carries
/// in `object` (new) and `oldObject` (old) instead of the KCP itself.
pub fn scale_replicas(p: &ObjectParts) -> Result<u32, CapiError> {
    let object = p.describe();
    let type_of = p
        .api_version
        .as_deref()
        .zip(p.kind.as_deref())
        .and_then(|(a, k)| split_type(a, k));
    if !matches!(type_of, Some(("autoscaling", _, "Scale"))) {
        return Err(wrong_kind(
            object,
            p.api_version.as_deref(),
            p.kind.as_deref(),
            "autoscaling/v1 Scale",
        ));
    }
    match &p.spec.replicas {
        // Scale.spec.replicas is omitted when zero.
        None => Ok(0),
        Some(r) => r
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| CapiError::InvalidField {
                object,
                field: "spec.replicas",
                problem: format!("expected a non-negative integer, found {r}"),
            }),
    }
}
