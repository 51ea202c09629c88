//! The field readers the parsers share: kind and version checks, paths, int-or-strings, owner
//! references, and the errors that name the object and the field.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;

use super::{ApiVersion, CapiError, ObjectRef, split_type};

/// Checks that `api_version` and `kind` name `kind` of `group` in a version whose paths are
/// known.
pub(super) fn check_type(
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

pub(super) fn wrong_kind(
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

pub(super) fn invalid(object: &ObjectRef, field: &'static str, problem: String) -> CapiError {
    CapiError::InvalidField {
        object: object.to_string(),
        field,
        problem,
    }
}

/// The value at a path; JSON null counts as absent (as it does for Kubernetes).
pub(super) fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(v, |cur, key| cur.get(key))
        .filter(|x| !x.is_null())
}

pub(super) fn optional_str(
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
pub(super) fn int_or_string(v: &Value) -> Option<u32> {
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

pub(super) fn controller_owner(meta: &ObjectMeta, group: &str, kind: &str) -> Option<String> {
    owners(meta, group, kind)
        .find(|o| o.controller == Some(true))
        .map(|o| o.name.clone())
}

pub(super) fn any_owner(meta: &ObjectMeta, group: &str, kind: &str) -> Option<String> {
    owners(meta, group, kind).next().map(|o| o.name.clone())
}

pub(super) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}
