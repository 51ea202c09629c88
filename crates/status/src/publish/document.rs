//! A KCP's `status.conditions` in the document the writer reads and writes: read strictly,
//! set without touching the rest of the status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// `status.conditions` of a KCP as read; absent means none. Anything else that does not parse is
/// an error: a writer that cannot read the list must not replace it.
pub(super) fn existing_conditions(data: &serde_json::Value) -> Result<Vec<Condition>, String> {
    match data.get("status").and_then(|s| s.get("conditions")) {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| e.to_string()),
    }
}

pub(super) fn set_conditions(data: &mut serde_json::Value, merged: &[Condition]) {
    let conditions = serde_json::to_value(merged).unwrap_or_default();
    match data.get_mut("status").and_then(|s| s.as_object_mut()) {
        Some(status) => {
            status.insert("conditions".into(), conditions);
        }
        None => {
            if let Some(obj) = data.as_object_mut() {
                obj.insert(
                    "status".into(),
                    serde_json::json!({ "conditions": conditions }),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_are_set_with_or_without_a_status() {
        let list = [Condition {
            type_: "quorumguard.io/EtcdQuorum".into(),
            status: "True".into(),
            reason: "Healthy".into(),
            message: "m".into(),
            observed_generation: Some(1),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }];
        let mut bare = serde_json::json!({"metadata": {"name": "k"}});
        set_conditions(&mut bare, &list);
        assert_eq!(existing_conditions(&bare).expect("parses").len(), 1);
        let mut with = serde_json::json!({"status": {"replicas": 3, "conditions": []}});
        set_conditions(&mut with, &list);
        assert_eq!(
            with["status"]["replicas"], 3,
            "the rest of the status stays"
        );
        assert_eq!(existing_conditions(&with).expect("parses"), list.to_vec());
        let broken = serde_json::json!({"status": {"conditions": {"not": "a list"}}});
        assert!(
            existing_conditions(&broken).is_err(),
            "unreadable: write nothing"
        );
    }
}
