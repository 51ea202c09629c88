//! [`ObjectParts`]: the fields of an object the rules read, deserialized in one pass (from
//! request bytes or from a value), with kubectl's last-applied copy and managedFields skipped.

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

use super::fields::{check_type, json_type};
use super::{ApiVersion, CapiError, ObjectRef, describe, described};

/// The `visit_*` methods of a visitor that reads every scalar but a string as `$default` (maps,
/// lists and strings are each visitor's own).
macro_rules! scalars_as {
    ($default:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($default)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok($default)
        }
    };
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
    pub(super) spec: Spec,
    #[serde(default, deserialize_with = "lenient")]
    pub(super) status: Status,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Spec {
    /// Machine.
    pub(super) cluster_name: Option<Value>,
    /// KubeadmControlPlane and Scale.
    pub(super) replicas: Option<Value>,
    /// KubeadmControlPlane (a Machine's too, unread).
    pub(super) version: Option<Value>,
    /// KubeadmControlPlane v1beta2: `rollout.strategy.rollingUpdate.maxSurge`.
    pub(super) rollout: Option<Value>,
    /// KubeadmControlPlane v1beta1: `rolloutStrategy.rollingUpdate.maxSurge`.
    pub(super) rollout_strategy: Option<Value>,
    /// KubeadmControlPlane: compared as text between old and new (see
    /// [`starts_rollout`](super::starts_rollout)) and read for external etcd, never built.
    pub(super) kubeadm_config_spec: Option<Box<RawValue>>,
    /// KubeadmControlPlane: compared as text between old and new.
    pub(super) machine_template: Option<Box<RawValue>>,
    /// Cluster.
    pub(super) control_plane_ref: Option<Value>,
    /// Cluster: `spec.paused` (both versions).
    pub(super) paused: Option<Value>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Status {
    pub(super) node_ref: Option<Value>,
    pub(super) addresses: Option<Value>,
    /// Machine: type and status of each condition, the rest skipped (v1beta2
    /// `metav1.Condition`s; v1beta1's Cluster API conditions carry the same two fields). Any
    /// other shape reads as no conditions.
    #[serde(default, deserialize_with = "conditions")]
    pub(super) conditions: Vec<Condition>,
}

/// The type and status of one condition (JSON strings; anything else is `None`).
#[derive(Clone, Debug, Default, Deserialize)]
pub(super) struct Condition {
    #[serde(rename = "type", default, deserialize_with = "string")]
    pub(super) kind: Option<String>,
    #[serde(default, deserialize_with = "string")]
    pub(super) status: Option<String>,
}

/// A string, or `None` for any other value (skipped without building it).
fn string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Str;
    impl<'de> Visitor<'de> for Str {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        scalars_as!(None);
    }
    d.deserialize_any(Str)
}

/// A list of conditions: each a map read as [`Condition`] (anything else in the list reads as
/// an empty one); anything but a list reads as none.
fn conditions<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Condition>, D::Error> {
    struct Each(Condition);
    impl<'de> Deserialize<'de> for Each {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            lenient(d).map(Each)
        }
    }
    struct List;
    impl<'de> Visitor<'de> for List {
        type Value = Vec<Condition>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(Each(c)) = seq.next_element()? {
                out.push(c);
            }
            Ok(out)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Vec::new())
        }
        scalars_as!(Vec::new());
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
    }
    d.deserialize_any(List)
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
pub(super) fn lenient<'de, D, T>(d: D) -> Result<T, D::Error>
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
        scalars_as!(T::default());
        fn visit_str<E: de::Error>(self, _: &str) -> Result<T, E> {
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
    pub(super) fn header(
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
