//! The AdmissionReview request kube-apiserver sends a webhook: its body, its user's groups and
//! its fresh uid.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::hook::operation_name;
use crate::apiserver::AdmissionAttempt;

/// The groups kube-apiserver's impersonation filter gives `user` when no group is asked for.
pub(super) fn groups_of(user: &str) -> Vec<String> {
    if user == "system:anonymous" {
        return vec!["system:unauthenticated".into()];
    }
    let mut groups = Vec::new();
    if let Some(rest) = user.strip_prefix("system:serviceaccount:")
        && let Some((namespace, name)) = rest.split_once(':')
        && !namespace.is_empty()
        && !name.is_empty()
        && !name.contains(':')
    {
        groups.push("system:serviceaccounts".to_string());
        groups.push(format!("system:serviceaccounts:{namespace}"));
    }
    groups.push("system:authenticated".into());
    groups
}

/// The admission.k8s.io/v1 AdmissionReview kube-apiserver sends for `a` with this `uid` (Go's
/// `omitempty`: no `subResource`/`requestSubResource`/`namespace` keys when empty; `object`
/// and `oldObject` always, null when absent).
pub fn review_request(a: &AdmissionAttempt, uid: &str) -> Value {
    let kind = if a.sub_resource.as_deref() == Some("scale") {
        json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
    } else {
        json!({"group": a.group, "version": a.version, "kind": a.kind})
    };
    let resource = json!({"group": a.group, "version": a.version, "resource": a.resource});
    let mut request = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": a.name,
        "operation": operation_name(a.operation),
        "userInfo": {"username": a.user, "groups": groups_of(&a.user)},
        "object": a.object.clone().unwrap_or(Value::Null),
        "oldObject": a.old_object.clone().unwrap_or(Value::Null),
        "dryRun": a.dry_run,
    });
    if let Some(sub) = a.sub_resource.as_deref().filter(|s| !s.is_empty()) {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    if let Some(ns) = a.namespace.as_deref().filter(|n| !n.is_empty()) {
        request["namespace"] = json!(ns);
    }
    if let Some(options) = &a.options {
        request["options"] = options.clone();
    }
    json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
}

/// A fresh random (version 4) UUID, as kube-apiserver gives every webhook call; from the time
/// and a counter if the system's randomness fails.
pub(super) fn new_uid() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut b = [0u8; 16];
    let random = rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut b);
    if random.is_err() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        b[..8].copy_from_slice(&nanos.to_be_bytes());
        b[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}
