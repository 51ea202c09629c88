//! Cluster API objects (as JSON values) -> the engine's model.
//!
//! Objects reach quorumguard as untyped JSON: from `kubectl get -o yaml` dumps, and from
//! AdmissionReviews (`oldObject` of a Machine DELETE, `object`/`oldObject` of a KCP UPDATE).
//! Cluster API serves two versions whose field paths differ (v1beta2 is the storage version,
//! v1beta1 is deprecated but still served), so the paths are read per version here, once, and
//! nothing else in quorumguard needs to know them. Only the fields the rules read are parsed;
//! everything else is ignored, so objects from newer CAPI releases still parse.
//!
//! Every entry point goes through [`ObjectParts`]: the fields the rules read, deserialized in
//! one pass. A review deserializes it straight from the request bytes (managedFields, status
//! conditions and the rest are skipped by the parser, never built); a `&Value` from a watch or a
//! dump deserializes it from the value, after the checks only a value can fail.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::core::{ApiResource, DynamicResourceScope, Resource};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use thiserror::Error;

use crate::engine::{
    Cluster, EtcdTopology, Kcp, LABEL_CLUSTER_NAME, LABEL_CONTROL_PLANE, LABEL_CONTROL_PLANE_NAME,
    Machine,
};

/// API group of Machine and Cluster.
pub const GROUP_CLUSTER: &str = "cluster.x-k8s.io";
/// API group of KubeadmControlPlane.
pub const GROUP_CONTROL_PLANE: &str = "controlplane.cluster.x-k8s.io";
/// Kind of a control-plane Machine.
pub const KIND_MACHINE: &str = "Machine";
/// Kind of the control plane quorumguard protects.
pub const KIND_KCP: &str = "KubeadmControlPlane";
/// Kind of the owning Cluster.
pub const KIND_CLUSTER: &str = "Cluster";
/// Cluster annotation with etcd client URLs (comma-separated) for the direct transport.
pub const ANNOTATION_ETCD_ENDPOINTS: &str = "quorumguard.io/etcd-endpoints";
/// Cluster annotation choosing how this cluster's etcd is reached (`port-forward` or `direct`).
pub const ANNOTATION_ETCD_TRANSPORT: &str = "quorumguard.io/etcd-transport";

/// Errors name the object (kind namespace/name) and the field, so a human can find both.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CapiError {
    /// The value is not a Kubernetes object at all (not a map, or without kind).
    #[error("{object}: not a Kubernetes object: {problem}")]
    NotAnObject { object: String, problem: String },
    /// A Kubernetes object, but not the kind that was expected.
    #[error("{object}: expected a {expected}, found apiVersion {api_version:?} kind {kind:?}")]
    WrongKind {
        object: String,
        expected: &'static str,
        api_version: String,
        kind: String,
    },
    /// The right kind in a version whose field paths are not known here.
    #[error("{object}: apiVersion {found:?} is not supported (supported: {supported})")]
    UnsupportedVersion {
        object: String,
        found: String,
        supported: String,
    },
    #[error("{object}: field {field} is missing")]
    MissingField { object: String, field: &'static str },
    #[error("{object}: field {field} is invalid: {problem}")]
    InvalidField {
        object: String,
        field: &'static str,
        problem: String,
    },
}

/// The Cluster API versions whose field paths are known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiVersion {
    V1Beta1,
    V1Beta2,
}

impl ApiVersion {
    fn parse(version: &str) -> Option<ApiVersion> {
        match version {
            "v1beta1" => Some(ApiVersion::V1Beta1),
            "v1beta2" => Some(ApiVersion::V1Beta2),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1Beta1 => "v1beta1",
            ApiVersion::V1Beta2 => "v1beta2",
        }
    }
}

/// Kind, namespace and name of an object: what messages name and what objects are matched by.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

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

/// "Machine ns/name" for any value, with `?` for what is missing: used in every message.
pub fn describe(v: &Value) -> String {
    let s = |path: &[&str]| at(v, path).and_then(Value::as_str);
    described(
        at(v, &["kind"]).and_then(Value::as_str),
        s(&["metadata", "namespace"]),
        s(&["metadata", "name"]),
    )
}

fn described(kind: Option<&str>, namespace: Option<&str>, name: Option<&str>) -> String {
    format!(
        "{} {}/{}",
        kind.unwrap_or("object"),
        namespace.unwrap_or("?"),
        name.unwrap_or("?")
    )
}

/// `(group, version, kind)` of a value; the core group is "". `None` without apiVersion or kind.
pub fn type_of(v: &Value) -> Option<(&str, &str, &str)> {
    split_type(v.get("apiVersion")?.as_str()?, v.get("kind")?.as_str()?)
}

fn split_type<'a>(api_version: &'a str, kind: &'a str) -> Option<(&'a str, &'a str, &'a str)> {
    let (group, version) = match api_version.rsplit_once('/') {
        Some((g, ver)) => (g, ver),
        None => ("", api_version),
    };
    Some((group, version, kind))
}

/// Whether the value is a Cluster API Machine (of any version).
pub fn is_machine(v: &Value) -> bool {
    matches!(type_of(v), Some((GROUP_CLUSTER, _, KIND_MACHINE)))
}

/// Whether the value is a KubeadmControlPlane (of any version).
pub fn is_kcp(v: &Value) -> bool {
    matches!(type_of(v), Some((GROUP_CONTROL_PLANE, _, KIND_KCP)))
}

/// Whether the value is a Cluster API Cluster (of any version).
pub fn is_cluster(v: &Value) -> bool {
    matches!(type_of(v), Some((GROUP_CLUSTER, _, KIND_CLUSTER)))
}

/// A Machine as the engine sees it (the `oldObject` of a Machine DELETE, or a dumped Machine).
pub fn machine_from_value(v: &Value) -> Result<Machine, CapiError> {
    parse_machine(v).map(|m| m.machine)
}

/// A KubeadmControlPlane as the engine sees it.
pub fn kcp_from_value(v: &Value) -> Result<Kcp, CapiError> {
    parse_kcp(v).map(|k| k.kcp)
}

/// A Cluster as the engine sees it.
pub fn cluster_from_value(v: &Value) -> Result<Cluster, CapiError> {
    parse_cluster(v).map(|c| c.cluster)
}

/// Parses a Machine (v1beta1 or v1beta2) with its KCP and Cluster names.
pub fn parse_machine(v: &Value) -> Result<CapiMachine, CapiError> {
    machine_from_parts(&ObjectParts::from_value(v, GROUP_CLUSTER, KIND_MACHINE)?)
}

/// Parses a KubeadmControlPlane (v1beta1 or v1beta2) with its Cluster name.
pub fn parse_kcp(v: &Value) -> Result<CapiKcp, CapiError> {
    kcp_from_parts(&ObjectParts::from_value(v, GROUP_CONTROL_PLANE, KIND_KCP)?)
}

/// Parses a Cluster (v1beta1 or v1beta2).
pub fn parse_cluster(v: &Value) -> Result<CapiCluster, CapiError> {
    cluster_from_parts(&ObjectParts::from_value(v, GROUP_CLUSTER, KIND_CLUSTER)?)
}

/// The fields of a Kubernetes object that the rules read, for every kind quorumguard parses
/// (Machine, KubeadmControlPlane, Cluster, and the `autoscaling/v1` Scale of the KCP's scale
/// subresource). Deserializing skips everything else without building it.
///
/// `metadata` is a real `ObjectMeta` (so kube's typed `AdmissionRequest` can carry these parts as
/// its object, see [`Resource`]) holding only name, namespace, uid, resourceVersion, generation,
/// labels, annotations (but kubectl's last-applied copy), the two timestamps and
/// ownerReferences; managedFields, often most of an object's bytes, is skipped. Leaves the rules validate stay JSON values, so their messages quote
/// what was found; a `spec` or `status` that is not a map reads as empty, as the value-based paths
/// this replaced read it.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectParts {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    #[serde(default, deserialize_with = "lean_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "lenient")]
    spec: Spec,
    #[serde(default, deserialize_with = "lenient")]
    status: Status,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    /// Machine.
    cluster_name: Option<Value>,
    /// KubeadmControlPlane and Scale.
    replicas: Option<Value>,
    /// KubeadmControlPlane (a Machine's too, unread).
    version: Option<Value>,
    /// KubeadmControlPlane v1beta2: `rollout.strategy.rollingUpdate.maxSurge`.
    rollout: Option<Value>,
    /// KubeadmControlPlane v1beta1: `rolloutStrategy.rollingUpdate.maxSurge`.
    rollout_strategy: Option<Value>,
    /// KubeadmControlPlane: compared as text between old and new (see [`starts_rollout`]) and
    /// read for external etcd, never built.
    kubeadm_config_spec: Option<Box<RawValue>>,
    /// KubeadmControlPlane: compared as text between old and new.
    machine_template: Option<Box<RawValue>>,
    /// Cluster.
    control_plane_ref: Option<Value>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    node_ref: Option<Value>,
    addresses: Option<Value>,
}

/// The metadata fields [`ObjectParts`] keeps.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "annotations")]
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    owner_references: Option<Vec<OwnerReference>>,
}

fn lean_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = LeanMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        labels: m.labels,
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        owner_references: m.owner_references,
        ..ObjectMeta::default()
    })
}

/// kubectl's copy of the object as last applied: often the largest annotation, and never read.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Annotations without [`LAST_APPLIED`], whose value is skipped rather than unescaped and kept
/// (and cloned with every Machine).
fn annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Annotations;
    impl<'de> Visitor<'de> for Annotations {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of strings")
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if key == LAST_APPLIED {
                    map.next_value::<IgnoredAny>()?;
                } else {
                    let value = map.next_value()?;
                    out.insert(key, value);
                }
            }
            Ok(Some(out))
        }
    }
    d.deserialize_any(Annotations)
}

/// A map deserialized as `T`; any other value is skipped and reads as `T::default()`.
fn lenient<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    struct MapOrDefault<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for MapOrDefault<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(T::default())
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<T, E> {
            Ok(T::default())
        }
        fn visit_none<E: de::Error>(self) -> Result<T, E> {
            Ok(T::default())
        }
    }
    d.deserialize_any(MapOrDefault(PhantomData))
}

/// So that kube's typed `AdmissionRequest<ObjectParts>` can carry the objects of a review: like
/// `DynamicObject`, the type is known at run time only.
impl Resource for ObjectParts {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl ObjectParts {
    /// The parts of a value expected to be of `kind` in `group`. What only a value can get wrong
    /// is checked first, in this order: not a map, no apiVersion or kind, the wrong kind or
    /// version, no metadata; metadata that does not deserialize is an invalid `metadata` field.
    pub fn from_value(
        v: &Value,
        group: &'static str,
        kind: &'static str,
    ) -> Result<ObjectParts, CapiError> {
        let object = describe(v);
        if !v.is_object() {
            return Err(CapiError::NotAnObject {
                object,
                problem: format!("expected a map, found {}", json_type(v)),
            });
        }
        let s = |k: &str| v.get(k).and_then(Value::as_str);
        check_type(object.clone(), s("apiVersion"), s("kind"), group, kind)?;
        if v.get("metadata").is_none_or(Value::is_null) {
            return Err(CapiError::MissingField {
                object,
                field: "metadata",
            });
        }
        ObjectParts::deserialize(v).map_err(|e| CapiError::InvalidField {
            object,
            field: "metadata",
            problem: e.to_string(),
        })
    }

    /// "Machine ns/name", with `?` for what is missing.
    pub fn describe(&self) -> String {
        described(
            self.kind.as_deref(),
            self.metadata.namespace.as_deref(),
            self.metadata.name.as_deref(),
        )
    }

    /// Checks apiVersion and kind; the object's version and reference.
    fn header(
        &self,
        group: &'static str,
        kind: &'static str,
    ) -> Result<(ApiVersion, ObjectRef), CapiError> {
        let object = self.describe();
        let version = check_type(
            object.clone(),
            self.api_version.as_deref(),
            self.kind.as_deref(),
            group,
            kind,
        )?;
        let required = |v: &Option<String>, field| {
            v.clone()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| CapiError::MissingField {
                    object: object.clone(),
                    field,
                })
        };
        let name = required(&self.metadata.name, "metadata.name")?;
        let namespace = required(&self.metadata.namespace, "metadata.namespace")?;
        Ok((
            version,
            ObjectRef {
                kind: kind.to_string(),
                namespace,
                name,
            },
        ))
    }
}

/// A Machine from its parts (see [`parse_machine`]).
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
    })
}

/// A KubeadmControlPlane from its parts (see [`parse_kcp`]).
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
    let etcd = if p
        .spec
        .kubeadm_config_spec
        .as_deref()
        .is_some_and(external_etcd)
    {
        EtcdTopology::External
    } else {
        EtcdTopology::Stacked
    };
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
    };
    Ok(CapiKcp {
        object,
        version,
        kcp,
        cluster_name,
        generation: meta.generation,
    })
}

/// Whether `spec.kubeadmConfigSpec.clusterConfiguration.etcd.external` is set (not null).
fn external_etcd(kubeadm_config_spec: &RawValue) -> bool {
    #[derive(Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct KubeadmConfigSpec {
        #[serde(default, deserialize_with = "lenient")]
        cluster_configuration: ClusterConfiguration,
    }
    #[derive(Default, Deserialize)]
    struct ClusterConfiguration {
        #[serde(default, deserialize_with = "lenient")]
        etcd: Etcd,
    }
    #[derive(Default, Deserialize)]
    struct Etcd {
        external: Option<IgnoredAny>,
    }
    let mut d = serde_json::Deserializer::from_str(kubeadm_config_spec.get());
    lenient::<_, KubeadmConfigSpec>(&mut d)
        .is_ok_and(|k| k.cluster_configuration.etcd.external.is_some())
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

/// A Cluster from its parts (see [`parse_cluster`]).
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

/// Checks that `api_version` and `kind` name `kind` of `group` in a version whose paths are
/// known.
fn check_type(
    object: String,
    api_version: Option<&str>,
    found_kind: Option<&str>,
    group: &'static str,
    kind: &'static str,
) -> Result<ApiVersion, CapiError> {
    let Some((g, version, k)) = api_version
        .zip(found_kind)
        .and_then(|(a, k)| split_type(a, k))
    else {
        return Err(CapiError::NotAnObject {
            object,
            problem: "apiVersion or kind is missing".into(),
        });
    };
    if g != group || k != kind {
        return Err(wrong_kind(object, api_version, found_kind, kind));
    }
    ApiVersion::parse(version).ok_or_else(|| CapiError::UnsupportedVersion {
        object,
        found: format!("{g}/{version}"),
        supported: format!("{group}/v1beta2, {group}/v1beta1"),
    })
}

fn wrong_kind(
    object: String,
    api_version: Option<&str>,
    kind: Option<&str>,
    expected: &'static str,
) -> CapiError {
    CapiError::WrongKind {
        object,
        expected,
        api_version: api_version.unwrap_or("").to_string(),
        kind: kind.unwrap_or("").to_string(),
    }
}

fn invalid(object: &ObjectRef, field: &'static str, problem: String) -> CapiError {
    CapiError::InvalidField {
        object: object.to_string(),
        field,
        problem,
    }
}

/// The value at a path; JSON null counts as absent (as it does for Kubernetes).
fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(v, |cur, key| cur.get(key))
        .filter(|x| !x.is_null())
}

fn optional_str(
    v: Option<&Value>,
    object: &ObjectRef,
    field: &'static str,
) -> Result<Option<String>, CapiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(
            object,
            field,
            format!("expected a string, found {other}"),
        )),
    }
}

/// An int-or-string holding an absolute number: 1, "1", 0, "0". Percentages are refused.
fn int_or_string(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::String(s) => s.trim().parse::<u32>().ok(),
        _ => None,
    }
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

fn owners<'a>(
    meta: &'a ObjectMeta,
    group: &'a str,
    kind: &'a str,
) -> impl Iterator<Item = &'a OwnerReference> + 'a {
    meta.owner_references
        .iter()
        .flatten()
        .filter(move |o| o.kind == kind && group_of(&o.api_version) == group && !o.name.is_empty())
}

fn controller_owner(meta: &ObjectMeta, group: &str, kind: &str) -> Option<String> {
    owners(meta, group, kind)
        .find(|o| o.controller == Some(true))
        .map(|o| o.name.clone())
}

fn any_owner(meta: &ObjectMeta, group: &str, kind: &str) -> Option<String> {
    owners(meta, group, kind).next().map(|o| o.name.clone())
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::ANNOTATION_DELETE_MACHINE;
    use serde_json::json;

    /// One review of tests/fixtures/admission-reviews/, parsed.
    pub(crate) fn review(name: &str) -> Value {
        let path = format!(
            "{}/../../tests/fixtures/admission-reviews/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).expect("fixture readable");
        serde_json::from_str(&text).expect("fixture is JSON")
    }

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
}
