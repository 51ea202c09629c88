//! Shared by the benchmarks, and by their smoke tests (tests/webhook_load.rs, tests/scale.rs,
//! which include this directory by path). Each user takes part of it, so unused items are expected.
#![allow(dead_code, unused_imports)]

#[path = "../../tests/support/etcd.rs"]
pub mod etcd;
#[path = "../../tests/support/https.rs"]
pub mod https;
pub mod load;
#[path = "../../tests/support/reviews.rs"]
pub mod reviews;
pub mod scale;
#[path = "../../tests/support/seed.rs"]
pub mod seed;

/// The API-server stand-in lives in the library (the playground serves it).
pub use quorumguard::playground::apiserver;

use serde_json::{Value, json};

/// A review whose `oldObject` carries managedFields entries until the whole body is at least
/// `bytes` long: what a real Machine carries (the fixtures were captured with them stripped).
pub fn with_managed_fields(mut review: Value, bytes: usize) -> Vec<u8> {
    let entry = json!({
        "manager": "manager", "operation": "Update", "apiVersion": "cluster.x-k8s.io/v1beta2",
        "time": "2026-11-30T10:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:cluster.x-k8s.io/cluster-name": {},
            "f:cluster.x-k8s.io/control-plane": {}, "f:cluster.x-k8s.io/control-plane-name": {}}},
            "f:status": {"f:addresses": {}, "f:conditions": {}, "f:nodeRef": {}, "f:phase": {}}}
    });
    let mut fields = Vec::new();
    while serde_json::to_vec(&review)
        .map(|v| v.len())
        .unwrap_or(usize::MAX)
        < bytes
    {
        fields.push(entry.clone());
        review["request"]["oldObject"]["metadata"]["managedFields"] = json!(fields);
    }
    serde_json::to_vec(&review).unwrap_or_default()
}
