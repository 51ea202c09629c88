//! The AdmissionReview request: the body kube-apiserver sends, its user's groups, its uid.

use serde_json::{Value, json};

use crate::apiserver::{AdmissionAttempt, Operation};
use crate::webhooks::review::{groups_of, new_uid, review_request};

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/../../tests/fixtures/admission-reviews/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}
/// The attempt the stand-in makes for a fixture's request (with the fixture's options).
fn attempt_from_fixture(review: &Value) -> AdmissionAttempt {
    let r = &review["request"];
    let text = |v: &Value| v.as_str().map(str::to_string);
    let operation = match r["operation"].as_str() {
        Some("DELETE") => Operation::Delete,
        Some("CREATE") => Operation::Create,
        _ => Operation::Update,
    };
    let object = |v: &Value| Some(v.clone()).filter(|v| !v.is_null());
    AdmissionAttempt {
        operation,
        group: text(&r["resource"]["group"]).unwrap_or_default(),
        version: text(&r["resource"]["version"]).unwrap_or_default(),
        resource: text(&r["resource"]["resource"]).unwrap_or_default(),
        kind: text(&r["kind"]["kind"]).unwrap_or_default(),
        sub_resource: text(&r["subResource"]),
        namespace: text(&r["namespace"]),
        name: text(&r["name"]).unwrap_or_default(),
        object: object(&r["object"]),
        old_object: object(&r["oldObject"]),
        user: text(&r["userInfo"]["username"]).unwrap_or_default(),
        dry_run: r["dryRun"].as_bool().unwrap_or_default(),
        options: object(&r["options"]),
    }
}

#[test]
fn the_body_is_the_one_kube_apiserver_sends() {
    for file in [
        "machine-delete-by-user.json",
        "machine-delete-by-kcp-controller.json",
        "machine-delete-dry-run.json",
        "kcp-scale-subresource-3-to-5.json",
        "kcp-update-replicas-5-to-3.json",
        "kcp-update-version.json",
    ] {
        let want = fixture(file);
        let uid = want["request"]["uid"].as_str().expect("uid").to_string();
        let mut got = review_request(&attempt_from_fixture(&want), &uid);
        // Same keys, same values, but for the groups: the fixtures' users were impersonated
        // with `--as-group system:masters`, which the stand-in does not know.
        let (mut want_req, got_req) = (want["request"].clone(), &mut got["request"]);
        let want_keys: Vec<&String> = want_req.as_object().expect("request").keys().collect();
        let got_keys: Vec<&String> = got_req.as_object().expect("request").keys().collect();
        assert_eq!(
            {
                let mut k = want_keys.clone();
                k.sort();
                k
            },
            {
                let mut k = got_keys.clone();
                k.sort();
                k
            },
            "{file}"
        );
        let groups = got_req["userInfo"]["groups"].clone();
        assert_eq!(
            groups.as_array().and_then(|g| g.last()),
            Some(&json!("system:authenticated")),
            "{file}"
        );
        got_req["userInfo"] = want_req["userInfo"].clone();
        want_req["userInfo"] = got_req["userInfo"].clone();
        assert_eq!(got["request"], want_req, "{file}");
        assert_eq!(got["kind"], want["kind"]);
        assert_eq!(got["apiVersion"], want["apiVersion"]);
        assert_eq!(got.as_object().map(|o| o.len()), Some(3));
    }
    // The scale subresource: kind autoscaling/v1 Scale, resource the KCP's.
    let scale = review_request(
        &attempt_from_fixture(&fixture("kcp-scale-subresource-3-to-5.json")),
        "u",
    );
    assert_eq!(
        scale["request"]["kind"],
        json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
    );
    assert_eq!(scale["request"]["requestSubResource"], "scale");
}

#[test]
fn users_get_the_groups_impersonation_gives() {
    assert_eq!(groups_of("jane@example.com"), ["system:authenticated"]);
    assert_eq!(
        groups_of(
            "system:serviceaccount:capi-kubeadm-control-plane-system:capi-kubeadm-control-plane-manager"
        ),
        [
            "system:serviceaccounts",
            "system:serviceaccounts:capi-kubeadm-control-plane-system",
            "system:authenticated"
        ]
    );
    assert_eq!(groups_of("system:anonymous"), ["system:unauthenticated"]);
    assert_eq!(
        groups_of("system:kube-controller-manager"),
        ["system:authenticated"]
    );
}

#[test]
fn uids_are_fresh_version_4_uuids() {
    let uids: std::collections::BTreeSet<String> = (0..1000).map(|_| new_uid()).collect();
    assert_eq!(uids.len(), 1000);
    for uid in uids.iter().take(20) {
        let parts: Vec<usize> = uid.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{uid}");
        assert_eq!(&uid[14..15], "4", "{uid}");
        assert!(matches!(&uid[19..20], "8" | "9" | "a" | "b"), "{uid}");
    }
}
