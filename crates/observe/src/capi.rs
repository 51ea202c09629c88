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
//! one pass. A review deserializes it straight from the request bytes (managedFields, the
//! conditions' messages and the rest are skipped by the parser, never built); a `&Value` from a watch or a
//! dump deserializes it from the value, after the checks only a value can fail.
//!
//! - `parts`: [`ObjectParts`], the fields the rules read, deserialized in one pass;
//! - `objects`: Machines, KubeadmControlPlanes, Clusters and Scales read from those parts;
//! - `fields`: the shared field readers: type checks, paths, owner references, errors.
//!
//! This file keeps the kinds' names, the errors, the versions and the entry points from a value.

mod fields;
mod mhc;
mod objects;
mod parts;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
#[cfg(test)]
mod tests;

use std::fmt;

use serde_json::Value;
use thiserror::Error;

use quorumguard_engine::{Cluster, Kcp, Machine};

pub use mhc::{
    ANNOTATION_PAUSED, ANNOTATION_SKIP_REMEDIATION, CapiHealthCheck, KIND_MHC, Selector,
    health_checks_of, is_health_check, parse_health_check,
};
pub use objects::{
    CapiCluster, CapiKcp, CapiMachine, Identity, cluster_from_parts, kcp_from_parts,
    machine_from_parts, scale_replicas, starts_rollout,
};
pub use parts::ObjectParts;

use fields::at;

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
