//! AdmissionReview (admission.k8s.io/v1) -> what is being asked, in engine terms; and the
//! verdict -> the AdmissionReview response kube-apiserver expects.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::Value;

use crate::capi::{self, CapiKcp, CapiMachine};
use crate::engine::Requester;

/// Audit annotation key for the reason code. kube-apiserver prefixes it with the webhook's name
/// (`machines.quorumguard.io/reason`), so the key itself carries no domain.
pub const AUDIT_REASON: &str = "reason";

/// Why a body is not a review we can answer: HTTP 400 with this message.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("the body is not an AdmissionReview: {0}")]
    Shape(serde_json::Error),
    #[error(
        "AdmissionReview apiVersion {0:?} is not supported: register the webhook with admissionReviewVersions [v1]"
    )]
    Version(String),
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("{0}")]
    Object(String),
}

/// What a review asks, after decoding.
#[derive(Clone, Debug)]
pub enum Subject {
    /// DELETE of a Machine: the stored Machine from `oldObject`.
    MachineDelete {
        machine: CapiMachine,
        uid: Option<String>,
    },
    /// UPDATE of a KubeadmControlPlane or of its `scale` subresource.
    KcpUpdate {
        kcp: String,
        from: u32,
        to: u32,
        starts_rollout: bool,
        /// The KCP as the request carries it (absent for the scale subresource).
        object: Option<CapiKcp>,
        uid: Option<String>,
    },
    /// A kind or operation this endpoint does not judge: allowed with a warning.
    Unhandled(String),
}

/// A decoded review.
#[derive(Clone, Debug)]
pub struct Decoded {
    pub request: AdmissionRequest<DynamicObject>,
    pub namespace: String,
    pub name: String,
    pub kind: String,
    pub operation: &'static str,
    pub requester: Requester,
    pub dry_run: bool,
    pub subject: Subject,
}

pub fn operation_str(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Which endpoint a review arrived at: each judges its own kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Machines,
    KubeadmControlPlanes,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Machines => "machines",
            Endpoint::KubeadmControlPlanes => "kubeadmcontrolplanes",
        }
    }
}

/// Parses a body. Errors are the client's (HTTP 400); a kind this endpoint does not judge is
/// not an error but [`Subject::Unhandled`].
pub fn decode(endpoint: Endpoint, body: &[u8]) -> Result<Decoded, ReviewError> {
    let value: Value = serde_json::from_slice(body).map_err(ReviewError::Json)?;
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if api_version != "admission.k8s.io/v1" {
        return Err(ReviewError::Version(api_version.to_string()));
    }
    if value.get("request").is_none_or(Value::is_null) {
        return Err(ReviewError::NoRequest);
    }
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_value(value).map_err(ReviewError::Shape)?;
    let request: AdmissionRequest<DynamicObject> =
        review.try_into().map_err(|_| ReviewError::NoRequest)?;
    let subject = subject(endpoint, &request)?;
    Ok(Decoded {
        namespace: request.namespace.clone().unwrap_or_default(),
        name: request.name.clone(),
        kind: format!("{}/{}", request.kind.group, request.kind.kind),
        operation: operation_str(&request.operation),
        requester: Requester {
            username: request.user_info.username.clone().unwrap_or_default(),
            groups: request.user_info.groups.clone().unwrap_or_default(),
        },
        dry_run: request.dry_run,
        subject,
        request,
    })
}

fn to_value(o: &DynamicObject) -> Result<Value, ReviewError> {
    serde_json::to_value(o).map_err(|e| ReviewError::Object(e.to_string()))
}

fn uid_of(v: &Value) -> Option<String> {
    v.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn subject(
    endpoint: Endpoint,
    req: &AdmissionRequest<DynamicObject>,
) -> Result<Subject, ReviewError> {
    let what = format!(
        "{} {} of {}/{} {}/{}",
        operation_str(&req.operation),
        req.sub_resource
            .as_deref()
            .map(|s| format!("(subresource {s})"))
            .unwrap_or_default(),
        req.kind.group,
        req.kind.kind,
        req.namespace.as_deref().unwrap_or(""),
        req.name
    );
    match (endpoint, &req.operation) {
        (Endpoint::Machines, Operation::Delete)
            if req.kind.group == capi::GROUP_CLUSTER && req.kind.kind == "Machine" =>
        {
            let old = req.old_object.as_ref().ok_or_else(|| {
                ReviewError::Object(format!("{what}: a DELETE review must carry oldObject"))
            })?;
            let v = to_value(old)?;
            let machine =
                capi::parse_machine(&v).map_err(|e| ReviewError::Object(e.to_string()))?;
            Ok(Subject::MachineDelete {
                machine,
                uid: uid_of(&v),
            })
        }
        (Endpoint::KubeadmControlPlanes, Operation::Update)
            if req.resource.resource == "kubeadmcontrolplanes" =>
        {
            let (new, old) = match (&req.object, &req.old_object) {
                (Some(n), Some(o)) => (to_value(n)?, to_value(o)?),
                _ => {
                    return Err(ReviewError::Object(format!(
                        "{what}: an UPDATE review must carry object and oldObject"
                    )));
                }
            };
            let bad = |e: capi::CapiError| ReviewError::Object(e.to_string());
            if req.sub_resource.as_deref() == Some("scale") {
                return Ok(Subject::KcpUpdate {
                    kcp: req.name.clone(),
                    from: capi::scale_replicas(&old).map_err(bad)?,
                    to: capi::scale_replicas(&new).map_err(bad)?,
                    starts_rollout: false,
                    object: None,
                    uid: uid_of(&new),
                });
            }
            if req.sub_resource.is_some() {
                return Ok(Subject::Unhandled(what));
            }
            let old_kcp = capi::parse_kcp(&old).map_err(bad)?;
            let new_kcp = capi::parse_kcp(&new).map_err(bad)?;
            let changed = |path: &str| old.pointer(path) != new.pointer(path);
            Ok(Subject::KcpUpdate {
                kcp: req.name.clone(),
                from: old_kcp.kcp.replicas,
                to: new_kcp.kcp.replicas,
                starts_rollout: changed("/spec/version")
                    || changed("/spec/kubeadmConfigSpec")
                    || changed("/spec/machineTemplate"),
                object: Some(new_kcp),
                uid: uid_of(&new),
            })
        }
        _ => Ok(Subject::Unhandled(what)),
    }
}

/// The response: a denial is `allowed: false` with status code 403, the reason code as status
/// reason, and the message; warnings and the reason as audit annotation either way.
pub fn respond(
    req: &AdmissionRequest<DynamicObject>,
    allowed: bool,
    reason: &str,
    message: &str,
    warnings: &[String],
) -> AdmissionReview<DynamicObject> {
    let mut resp = AdmissionResponse::from(req);
    if !allowed {
        resp = resp.deny(message);
        resp.result.code = 403;
        resp.result.reason = reason.to_string();
    }
    if !warnings.is_empty() {
        resp.warnings = Some(warnings.to_vec());
    }
    resp.audit_annotations
        .insert(AUDIT_REASON.to_string(), reason.to_string());
    resp.into_review()
}
