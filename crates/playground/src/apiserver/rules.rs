//! The write rules of kube-apiserver's generic registry and of CRDs with the status (and
//! scale) subresource: what create and update do to an object before it is stored.

use serde_json::{Map, Value, json};

use super::resources::ResourceDef;
use super::status::ApiError;
use super::store::{Key, Store};

/// The current time as Kubernetes writes timestamps (RFC 3339, whole seconds, UTC).
pub fn now() -> String {
    let ts = k8s_openapi::jiff::Timestamp::now();
    match k8s_openapi::jiff::Timestamp::from_second(ts.as_second()) {
        Ok(whole) => whole.to_string(),
        Err(_) => ts.to_string(),
    }
}

pub fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    object
        .get("metadata")?
        .get(field)?
        .as_str()
        .filter(|s| !s.is_empty())
}

/// Sets `metadata.<field>` (a `null` value removes it), creating `metadata` if needed.
pub fn set_meta(object: &mut Value, field: &str, value: Value) {
    let Some(obj) = object.as_object_mut() else {
        return;
    };
    let meta = obj.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    if let Some(m) = meta.as_object_mut() {
        if value.is_null() {
            m.remove(field);
        } else {
            m.insert(field.to_string(), value);
        }
    }
}

pub fn finalizers(object: &Value) -> Vec<String> {
    let list = object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array);
    list.map(|l| {
        l.iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect()
    })
    .unwrap_or_default()
}

/// Sets the value at a JSON pointer such as `/spec/replicas`, creating objects on the way.
pub fn set_pointer(object: &mut Value, pointer: &str, value: Value) {
    let mut cur = object;
    let parts: Vec<&str> = pointer.split('/').skip(1).collect();
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let Some(map) = cur.as_object_mut() else {
            return;
        };
        if i + 1 == parts.len() {
            map.insert((*part).to_string(), value);
            return;
        }
        cur = map.entry((*part).to_string()).or_insert_with(|| json!({}));
    }
}

/// Checks `apiVersion` and `kind` of a request body against the resource.
pub fn check_type(def: &ResourceDef, object: &Value) -> Result<(), ApiError> {
    if !object.is_object() {
        return Err(ApiError::bad_request(
            "the request body is not a JSON object",
        ));
    }
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if kind.is_empty() {
        return Err(ApiError::bad_request(
            "Object 'Kind' is missing in the request body",
        ));
    }
    if kind != def.kind || api_version != def.api_version() {
        let msg = format!(
            "the API version in the data ({api_version}) and kind ({kind}) do not match the resource {} {}",
            def.api_version(),
            def.kind
        );
        return Err(ApiError::bad_request(msg));
    }
    Ok(())
}

fn check_namespace(object: &mut Value, namespace: Option<&str>) -> Result<(), ApiError> {
    match (meta_str(object, "namespace"), namespace) {
        (Some(given), Some(url)) if given != url => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        (_, Some(url)) => {
            set_meta(object, "namespace", json!(url));
            Ok(())
        }
        (_, None) => {
            set_meta(object, "namespace", Value::Null);
            Ok(())
        }
    }
}

/// Validates and completes an object to be created (generic registry `BeforeCreate` and the
/// CRD strategy: status dropped when the status subresource is on, generation 1).
pub fn prepare_create(
    store: &mut Store,
    res: usize,
    namespace: Option<&str>,
    mut object: Value,
) -> Result<(Key, Value), ApiError> {
    let def = store
        .defs
        .get(res)
        .cloned()
        .ok_or_else(ApiError::no_such_resource)?;
    check_type(&def, &object)?;
    check_namespace(&mut object, namespace)?;
    if meta_str(&object, "name").is_none() {
        let Some(prefix) = meta_str(&object, "generateName").map(str::to_string) else {
            return Err(ApiError::invalid(
                &def,
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            ));
        };
        let name = format!("{prefix}{}", suffix(store.next_serial()));
        set_meta(&mut object, "name", json!(name));
    }
    let name = meta_str(&object, "name").unwrap_or_default().to_string();
    if name.contains('/') || name.contains('%') {
        return Err(ApiError::invalid(
            &def,
            &name,
            "metadata.name",
            "Invalid value: may not contain '/' or '%'",
        ));
    }
    if meta_str(&object, "resourceVersion").is_some() {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let key = (res, namespace.unwrap_or("").to_string(), name.clone());
    if store.get(&key).is_some() {
        return Err(ApiError::already_exists(&def, &name));
    }
    let uid = store.new_uid();
    set_meta(&mut object, "uid", json!(uid));
    set_meta(&mut object, "creationTimestamp", json!(now()));
    for field in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
    ] {
        set_meta(&mut object, field, Value::Null);
    }
    set_meta(
        &mut object,
        "generation",
        if def.custom { json!(1) } else { Value::Null },
    );
    if def.status_subresource
        && let Some(map) = object.as_object_mut()
    {
        map.remove("status");
    }
    Ok((key, object))
}

/// A generateName suffix: five characters from the alphabet Kubernetes uses.
fn suffix(mut n: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut out = String::new();
    for _ in 0..5 {
        let i = usize::try_from(n % 27).unwrap_or(0);
        out.push(char::from(ALPHABET[i]));
        n /= 27;
    }
    out
}

/// Which part of an object a write may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The main resource: everything but `.status` when the status subresource is on.
    Main,
    /// The `/status` subresource: only `.status`.
    Status,
}

/// Validates an update of `old` to `candidate` and returns the object to store (with `old`'s
/// resourceVersion; the commit gives it a new one).
pub fn prepare_update(
    def: &ResourceDef,
    old: &Value,
    mut candidate: Value,
    part: Part,
    namespace: Option<&str>,
    name: &str,
) -> Result<Value, ApiError> {
    check_type(def, &candidate)?;
    let given = meta_str(&candidate, "name").unwrap_or("");
    if given != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({given}) does not match the name on the URL ({name})"
        )));
    }
    check_namespace(&mut candidate, namespace)?;
    if let Some(rv) = meta_str(&candidate, "resourceVersion")
        && Some(rv) != meta_str(old, "resourceVersion")
    {
        return Err(ApiError::modified(def, name));
    }
    let old_uid = meta_str(old, "uid").unwrap_or("");
    if let Some(uid) = meta_str(&candidate, "uid")
        && uid != old_uid
    {
        let why = format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
        );
        return Err(ApiError::conflict(def, name, &why));
    }
    let mut new = match part {
        Part::Main => {
            let mut new = candidate;
            for field in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                set_meta(
                    &mut new,
                    field,
                    old.pointer(&format!("/metadata/{field}"))
                        .cloned()
                        .unwrap_or(Value::Null),
                );
            }
            set_meta(&mut new, "selfLink", Value::Null);
            set_meta(&mut new, "managedFields", Value::Null);
            if def.status_subresource {
                copy_field(&mut new, old, "status");
            }
            new
        }
        Part::Status => {
            let mut new = old.clone();
            copy_field(&mut new, &candidate, "status");
            new
        }
    };
    set_meta(
        &mut new,
        "resourceVersion",
        old["metadata"]["resourceVersion"].clone(),
    );
    if meta_str(old, "deletionTimestamp").is_some() {
        let before = finalizers(old);
        let added: Vec<String> = finalizers(&new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let why = format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
            );
            return Err(ApiError::invalid(def, name, "metadata.finalizers", &why));
        }
    }
    if def.custom && spec_part(def, &new) != spec_part(def, old) {
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        set_meta(&mut new, "generation", json!(generation + 1));
    }
    Ok(new)
}

/// Sets `to.<field>` to `from.<field>`, or removes it when `from` has none.
fn copy_field(to: &mut Value, from: &Value, field: &str) {
    let value = from.get(field).cloned();
    if let Some(map) = to.as_object_mut() {
        match value {
            Some(v) => map.insert(field.to_string(), v),
            None => map.remove(field),
        };
    }
}

/// The object without `metadata` (and without `status` under the status subresource): a
/// change here bumps `metadata.generation`.
fn spec_part(def: &ResourceDef, object: &Value) -> Map<String, Value> {
    let mut map = object.as_object().cloned().unwrap_or_default();
    map.remove("metadata");
    if def.status_subresource {
        map.remove("status");
    }
    map
}

/// The `autoscaling/v1` Scale view of an object with a scale subresource.
pub fn scale_view(def: &ResourceDef, object: &Value) -> Value {
    let Some(scale) = &def.scale else {
        return Value::Null;
    };
    let replicas = |p: &str| object.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let mut metadata = json!({});
    for field in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = object.pointer(&format!("/metadata/{field}")) {
            metadata[field] = v.clone();
        }
    }
    let mut status = json!({"replicas": replicas(&scale.status_replicas)});
    if let Some(sel) = scale
        .label_selector
        .as_deref()
        .and_then(|p| object.pointer(p))
        .and_then(Value::as_str)
    {
        status["selector"] = json!(sel);
    }
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": metadata,
        "spec": {"replicas": replicas(&scale.spec_replicas)}, "status": status,
    })
}

/// Turns a written Scale into the main-resource candidate it stands for.
pub fn from_scale(
    def: &ResourceDef,
    old: &Value,
    scale: &Value,
    name: &str,
) -> Result<Value, ApiError> {
    let Some(sdef) = &def.scale else {
        return Err(ApiError::no_such_resource());
    };
    if scale.get("kind").and_then(Value::as_str) != Some("Scale") {
        return Err(ApiError::bad_request(
            "the body of a scale request must be an autoscaling/v1 Scale",
        ));
    }
    let given = meta_str(scale, "name").unwrap_or("");
    if given != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({given}) does not match the name on the URL ({name})"
        )));
    }
    let replicas = scale
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let mut candidate = old.clone();
    set_pointer(&mut candidate, &sdef.spec_replicas, json!(replicas));
    let rv = scale
        .pointer("/metadata/resourceVersion")
        .cloned()
        .unwrap_or(Value::Null);
    set_meta(&mut candidate, "resourceVersion", rv);
    Ok(candidate)
}
