//! The writing verbs: create, update and patch (of the resource, `/status` and `/scale`),
//! delete and deletecollection, each with the admission hook before it is applied.

use axum::http::header;
use axum::response::Response;
use serde_json::{Value, json};

use super::Operation;
use super::http::{Call, WRITE_ATTEMPTS, ok};
use super::rules::{self, Part, meta_str, set_meta};
use super::status::{ApiError, delete_success};

pub async fn create(call: &Call) -> Result<Response, ApiError> {
    let body = call.body_json()?;
    let (key, object) = rules::prepare_create(
        &mut call.shared.store(),
        call.target.res,
        call.target.namespace.as_deref(),
        body,
    )?;
    let mut attempt = call.attempt(Operation::Create, Some(object.clone()), None);
    // Validating admission sees the name, generated or not (kube-apiserver's
    // AdmissionToValidateObjectFunc takes it from the object).
    attempt.name = key.2.clone();
    call.admit(attempt).await?;
    if call.dry_run() {
        return Ok(ok(201, &object));
    }
    let mut store = call.shared.store();
    if store.get(&key).is_some() {
        return Err(ApiError::already_exists(&call.def, &key.2));
    }
    Ok(ok(201, &store.commit_create(key, object)))
}

/// PUT and PATCH, on the resource or its `/status` or `/scale`: `candidate` turns the current
/// object (or its Scale view) into the written one.
pub async fn write(
    call: &Call,
    candidate: impl Fn(&Value) -> Result<Value, ApiError>,
) -> Result<Response, ApiError> {
    let (def, key, name) = (&call.def, call.key(), call.name());
    let is_scale = call.target.sub.as_deref() == Some("scale");
    let part = if call.target.sub.as_deref() == Some("status") {
        Part::Status
    } else {
        Part::Main
    };
    let view = |o: &Value| {
        if is_scale {
            rules::scale_view(def, o)
        } else {
            o.clone()
        }
    };
    let shown = |o: &Value| {
        if is_scale {
            rules::scale_view(def, o)
        } else {
            call.shown(o)
        }
    };
    for _ in 0..WRITE_ATTEMPTS {
        let (old, new) = {
            let store = call.shared.store();
            let old = store
                .get(&key)
                .cloned()
                .ok_or_else(|| ApiError::not_found(def, name))?;
            let written = candidate(&view(&old))?;
            let written = if is_scale {
                rules::from_scale(def, &old, &written, name)?
            } else {
                written
            };
            let new = rules::prepare_update(
                def,
                &old,
                written,
                part,
                call.target.namespace.as_deref(),
                name,
            )?;
            (old, new)
        };
        call.admit(call.attempt(Operation::Update, Some(view(&new)), Some(view(&old))))
            .await?;
        if call.dry_run() {
            return Ok(ok(200, &shown(&new)));
        }
        let mut store = call.shared.store();
        let current = store
            .get(&key)
            .ok_or_else(|| ApiError::not_found(def, name))?;
        if current.pointer("/metadata/resourceVersion") != old.pointer("/metadata/resourceVersion")
        {
            continue; // changed while admission ran: read it again
        }
        let stored = store.commit_update(&key, new);
        return Ok(ok(200, &shown(&stored)));
    }
    Err(ApiError::modified(def, name))
}

pub fn apply_patch(call: &Call, current: &Value) -> Result<Value, ApiError> {
    let content_type = call
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let unknown = || {
        ApiError::unsupported_media(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    };
    let mut doc = current.clone();
    match media {
        "application/merge-patch+json" => json_patch::merge(&mut doc, &call.body_json()?),
        "application/json-patch+json" => {
            let patch: json_patch::Patch = serde_json::from_slice(&call.body).map_err(|e| {
                ApiError::bad_request(format!("error decoding the JSON patch: {e}"))
            })?;
            json_patch::patch(&mut doc, &patch.0)
                .map_err(|e| ApiError::new(422, "Invalid", e.to_string(), None))?;
        }
        // CRDs have no strategic-merge schema: the real server refuses it.
        "application/strategic-merge-patch+json" if call.def.custom => return Err(unknown()),
        "application/strategic-merge-patch+json" => {
            let patch = call.body_json()?;
            if needs_strategy(&patch) {
                return Err(ApiError::unsupported_media(
                    "quorumguard API-server stand-in: strategic merge patch with lists or $-directives is not implemented",
                ));
            }
            // Without lists or directives a strategic merge patch is a JSON merge patch.
            json_patch::merge(&mut doc, &patch);
        }
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            return Err(ApiError::unsupported_media(
                "quorumguard API-server stand-in: server-side apply is not implemented",
            ));
        }
        _ => return Err(unknown()),
    }
    Ok(doc)
}

/// True when a strategic merge patch holds a list or a `$` directive.
fn needs_strategy(patch: &Value) -> bool {
    match patch {
        Value::Array(_) => true,
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k.starts_with('$') || needs_strategy(v)),
        _ => false,
    }
}

/// DELETE of one object: immediate removal, or a deletionTimestamp while finalizers remain.
/// Returns the HTTP code and body.
pub async fn delete(call: &Call, name: &str) -> Result<(u16, Value), ApiError> {
    let def = &call.def;
    let key = (
        call.target.res,
        call.target.namespace.clone().unwrap_or_default(),
        name.to_string(),
    );
    let options: Value = if call.body.is_empty() {
        json!({})
    } else {
        call.body_json()?
    };
    let dry_run = call.dry_run()
        || options["dryRun"]
            .as_array()
            .is_some_and(|d| d.iter().any(|v| v == "All"));
    let admission_options = delete_options(call, &options);
    for _ in 0..WRITE_ATTEMPTS {
        let old = call
            .shared
            .store()
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(def, name))?;
        for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            let wanted = options
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str);
            let actual = meta_str(&old, field).unwrap_or("");
            if let Some(wanted) = wanted.filter(|w| *w != actual) {
                let why = format!(
                    "Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {actual}"
                );
                return Err(ApiError::conflict(def, name, &why));
            }
        }
        let mut attempt = call.attempt(Operation::Delete, None, Some(old.clone()));
        attempt.name = name.to_string();
        attempt.dry_run = dry_run;
        attempt.options = Some(admission_options.clone());
        call.admit(attempt).await?;
        let uid = meta_str(&old, "uid").unwrap_or("").to_string();
        let finalizers = !rules::finalizers(&old).is_empty();
        let mut marked = old.clone();
        if finalizers && meta_str(&old, "deletionTimestamp").is_none() {
            set_meta(&mut marked, "deletionTimestamp", json!(rules::now()));
            set_meta(&mut marked, "deletionGracePeriodSeconds", json!(0));
        }
        if dry_run {
            return Ok(if finalizers {
                (200, marked)
            } else {
                (200, delete_success(def, name, &uid))
            });
        }
        let mut store = call.shared.store();
        let current = store
            .get(&key)
            .ok_or_else(|| ApiError::not_found(def, name))?;
        if current.pointer("/metadata/resourceVersion") != old.pointer("/metadata/resourceVersion")
        {
            continue;
        }
        if finalizers {
            return Ok((200, store.commit_update(&key, marked)));
        }
        store.commit_delete(&key);
        return Ok((200, delete_success(def, name, &uid)));
    }
    Err(ApiError::modified(def, name))
}

/// The DeleteOptions kube-apiserver hands to admission: the body's (only the fields
/// DeleteOptions has), or without a body the query's; `apiVersion` always `meta.k8s.io/v1`.
fn delete_options(call: &Call, body: &Value) -> Value {
    const FIELDS: [&str; 6] = [
        "gracePeriodSeconds",
        "preconditions",
        "orphanDependents",
        "propagationPolicy",
        "dryRun",
        "ignoreStoreReadErrorWithClusterBreakingPotential",
    ];
    let mut options = json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"});
    if !call.body.is_empty() {
        for field in FIELDS {
            // Go's `omitempty`: no null and no empty list.
            let present = |v: &&Value| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty());
            if let Some(v) = body.get(field).filter(present) {
                options[field] = v.clone();
            }
        }
        return options;
    }
    let params = &call.params;
    let dry_run = params.all("dryRun");
    if !dry_run.is_empty() {
        options["dryRun"] = json!(dry_run);
    }
    if let Some(secs) = params
        .get("gracePeriodSeconds")
        .and_then(|v| v.parse::<i64>().ok())
    {
        options["gracePeriodSeconds"] = json!(secs);
    }
    if let Some(policy) = params.get("propagationPolicy").filter(|v| !v.is_empty()) {
        options["propagationPolicy"] = json!(policy);
    }
    if let Some(orphan) = params.get("orphanDependents") {
        options["orphanDependents"] = json!(orphan == "true");
    }
    options
}

/// DELETE of a collection: each selected object as one DELETE; answers the list of them.
pub async fn delete_collection(call: &Call) -> Result<Response, ApiError> {
    let filter = call.filter()?;
    let selected = call.shared.store().list(&filter, None);
    let mut items = Vec::new();
    for object in selected {
        let name = meta_str(&object, "name").unwrap_or("").to_string();
        match delete(call, &name).await {
            Ok((_, body)) if body.get("kind").and_then(Value::as_str) == Some("Status") => {
                items.push(object)
            }
            Ok((_, body)) => items.push(body),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let rv = call.shared.store().rv.to_string();
    let body = json!({"kind": format!("{}List", call.def.kind), "apiVersion": call.def.api_version(), "metadata": {"resourceVersion": rv}, "items": items});
    Ok(ok(200, &body))
}
