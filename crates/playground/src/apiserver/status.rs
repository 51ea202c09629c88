//! `Status` failure objects shaped like kube-apiserver's (k8s.io/apimachinery `errors`).

use serde_json::{Value, json};

use super::resources::ResourceDef;

/// An API failure: the HTTP code and the `Status` body to send.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub body: Value,
}

/// The `reason` kube-apiserver uses for an HTTP code.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// `details` naming one object of a resource (group omitted for the core group, as Go's
/// `omitempty` does).
fn details(def: &ResourceDef, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": def.plural});
    if !def.group.is_empty() {
        d["group"] = json!(def.group);
    }
    d
}

impl ApiError {
    pub fn new(
        code: u16,
        reason: &str,
        message: impl Into<String>,
        details: Option<Value>,
    ) -> Self {
        let mut body = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message.into(), "reason": reason, "code": code,
        });
        if let Some(d) = details {
            body["details"] = d;
        }
        Self { code, body }
    }

    pub fn not_found(def: &ResourceDef, name: &str) -> Self {
        let msg = format!("{} \"{name}\" not found", def.qualified());
        Self::new(404, "NotFound", msg, Some(details(def, name)))
    }

    /// A path that names no served resource.
    pub fn no_such_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Some(json!({})),
        )
    }

    pub fn already_exists(def: &ResourceDef, name: &str) -> Self {
        let msg = format!("{} \"{name}\" already exists", def.qualified());
        Self::new(409, "AlreadyExists", msg, Some(details(def, name)))
    }

    /// `Operation cannot be fulfilled on <resource> "<name>": <why>` (409 Conflict).
    pub fn conflict(def: &ResourceDef, name: &str, why: &str) -> Self {
        let msg = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            def.qualified()
        );
        Self::new(409, "Conflict", msg, Some(details(def, name)))
    }

    /// The optimistic-concurrency conflict, word for word.
    pub fn modified(def: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            def,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn invalid(def: &ResourceDef, name: &str, field: &str, why: &str) -> Self {
        let kind = &def.kind;
        // The qualified kind, as Go's GroupKind.String() spells it: `Machine.cluster.x-k8s.io`.
        let qualified = if def.group.is_empty() {
            kind.clone()
        } else {
            format!("{kind}.{}", def.group)
        };
        let msg = format!("{qualified} \"{name}\" is invalid: {field}: {why}");
        let mut d = json!({"name": name, "kind": kind, "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}]});
        if !def.group.is_empty() {
            d["group"] = json!(def.group);
        }
        Self::new(422, "Invalid", msg, Some(d))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message, None)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        let d = json!({"causes": [{"message": message}]});
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
            Some(d),
        )
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            Some(json!({})),
        )
    }

    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message, Some(json!({})))
    }

    /// 410 Expired, as sent for a too old resourceVersion or continue token.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message, None)
    }

    /// A failure injected with [`super::ApiServer::fail_next`], shaped like the real failure for that code.
    pub fn injected(code: u16, target: Option<(&ResourceDef, &str)>) -> Self {
        match (code, target) {
            (409, Some((def, name))) => Self::modified(def, name),
            (404, Some((def, name))) => Self::not_found(def, name),
            (500, _) => Self::internal("injected into the API-server stand-in"),
            _ => Self::new(
                code,
                reason_for(code),
                format!("injected into the API-server stand-in (HTTP {code})"),
                None,
            ),
        }
    }
}

/// `Status` Success answered for an immediate DELETE of a built-in or custom resource.
pub fn delete_success(def: &ResourceDef, name: &str, uid: &str) -> Value {
    let mut d = details(def, name);
    d["uid"] = json!(uid);
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d})
}
