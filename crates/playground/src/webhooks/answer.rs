//! A webhook's answer: the AdmissionReview response read and checked as kube-apiserver reads
//! it, and its verdict worded as kube-apiserver words it.

use std::collections::BTreeMap;

use axum::body::Bytes;
use serde::Deserialize;
use serde_json::Value;

/// The response part of an AdmissionReview, as kube-apiserver reads it (unknown fields
/// ignored; `patch` is ignored for validating webhooks).
#[derive(Deserialize)]
struct ReviewAnswer {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    response: Option<AnswerBody>,
}

#[derive(Deserialize)]
pub(super) struct AnswerBody {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    allowed: bool,
    status: Option<kube::core::Status>,
    #[serde(rename = "auditAnnotations")]
    audit_annotations: Option<BTreeMap<String, String>>,
    warnings: Option<Vec<String>>,
}

/// What one call came to.
pub(super) enum Outcome {
    Allowed {
        message: Option<String>,
    },
    Denied {
        code: u16,
        reason: String,
        message: String,
        details: Option<Value>,
        status_message: Option<String>,
    },
    /// The text after `failed calling webhook "<name>": `.
    Failed(String),
}

pub(super) struct Answered {
    pub(super) outcome: Outcome,
    pub(super) warnings: Vec<String>,
    pub(super) reason: Option<String>,
}

/// The AdmissionResponse, checked as kube-apiserver's `VerifyAdmissionResponse` does.
pub(super) fn read_answer(body: &Bytes, uid: &str) -> Result<AnswerBody, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        format!("failed to call webhook: couldn't get version/kind; json parse error: {e}")
    })?;
    if value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        return Err(format!(
            "failed to call webhook: Object 'Kind' is missing in '{}'",
            String::from_utf8_lossy(body)
        ));
    }
    let answer: ReviewAnswer =
        serde_json::from_value(value).map_err(|e| format!("failed to call webhook: {e}"))?;
    let invalid = |why: String| format!("received invalid webhook response: {why}");
    let Some(response) = answer.response else {
        return Err(invalid("webhook response was absent".into()));
    };
    if response.uid != uid {
        return Err(invalid(format!(
            "expected response.uid={uid:?}, got {:?}",
            response.uid
        )));
    }
    if answer.api_version != "admission.k8s.io/v1" || answer.kind != "AdmissionReview" {
        let (group, version) = answer
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", answer.api_version.as_str()));
        return Err(invalid(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {group}/{version}, Kind={}",
            answer.kind
        )));
    }
    Ok(response)
}

/// An allow, or the denial as k8s.io/apiserver `ToStatusErr` words it.
pub(super) fn judge(webhook: &str, r: AnswerBody) -> Answered {
    let warnings = r.warnings.unwrap_or_default();
    let reason = r
        .audit_annotations
        .as_ref()
        .and_then(|a| a.get("reason"))
        .cloned();
    let status = r.status.unwrap_or_default();
    let status_message = Some(status.message.clone()).filter(|m| !m.is_empty());
    let outcome = if r.allowed {
        Outcome::Allowed {
            message: status_message,
        }
    } else {
        let denied = format!("admission webhook \"{webhook}\" denied the request");
        let message = if !status.message.is_empty() {
            format!("{denied}: {}", status.message)
        } else if !status.reason.is_empty() {
            format!("{denied}: {}", status.reason)
        } else {
            format!("{denied} without explanation")
        };
        Outcome::Denied {
            code: if status.code < 400 { 403 } else { status.code },
            reason: status.reason.clone(),
            message,
            details: status
                .details
                .as_ref()
                .and_then(|d| serde_json::to_value(d).ok()),
            status_message,
        }
    };
    Answered {
        outcome,
        warnings,
        reason,
    }
}
