//! The bodies of the cargo-fuzz targets in `fuzz/`, kept in this dev-only crate so that `cargo
//! test` replays every committed corpus entry (and every crash found, as a regression input)
//! without cargo-fuzz: see the tests at the end, which read `fuzz/corpus/<target>/`. The
//! webhook they judge reviews with is the tests' and benchmarks' seeded one
//! ([`crate::webhook::seeded`]).
//!
//! A target body panics exactly when the code under test misbehaves: a panic inside it, or an
//! answer that is not well formed (asserted here).

use serde_json::{Value, json};

use quorumguard::admission::Webhook;
use quorumguard::admission::review::{self, Endpoint};
use quorumguard::dumps::{self, DumpTexts, etcdctl};
use quorumguard::engine::{DEFAULT_KCP_CONTROLLER, Health, Member, Requester};
use quorumguard_cli::check::{self, WhatIf};

/// Namespace, Cluster and KCP of the AdmissionReview fixtures (tests/fixtures/admission-reviews/).
const REVIEW_NS: &str = "capi-test";
const REVIEW_CLUSTER: &str = "test";
const REVIEW_KCP: &str = "test-controlplane";

/// The objects and etcd dumps of a healthy 3-member control plane (tests/fixtures/).
const OBJECTS: &str = include_str!("../../../tests/fixtures/objects/healthy.yaml");
const MEMBER_LIST: &str = include_str!("../../../tests/fixtures/etcd/healthy/member-list.json");
const ENDPOINT_STATUS: &str =
    include_str!("../../../tests/fixtures/etcd/healthy/endpoint-status.json");
const ENDPOINT_HEALTH: &str =
    include_str!("../../../tests/fixtures/etcd/healthy/endpoint-health.json");

/// A control-plane Machine of the review fixtures' KCP.
fn review_machine(name: &str, node: Option<&str>) -> Value {
    let mut m = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "namespace": REVIEW_NS, "uid": format!("uid-{name}"),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"cluster.x-k8s.io/cluster-name": REVIEW_CLUSTER,
                "cluster.x-k8s.io/control-plane": "",
                "cluster.x-k8s.io/control-plane-name": REVIEW_KCP}},
        "spec": {"clusterName": REVIEW_CLUSTER},
        "status": {},
    });
    if let Some(node) = node {
        m["status"]["nodeRef"] = json!({"name": node});
    }
    m
}

/// The webhook's caches holding the review fixtures' control plane: KCP `test-controlplane`
/// (3 replicas) with Machines `test-cp-a`..`test-cp-c` on nodes `cp-a`..`cp-c` and `test-cp-d`
/// without a node; members `cp-a` and `cp-b` healthy, `cp-c` unhealthy, and a learner `cp-e`.
/// Built fresh for every input so that reservations never carry from one input to the next.
fn review_webhook() -> Webhook {
    let cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": REVIEW_CLUSTER, "namespace": REVIEW_NS},
        "spec": {"controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                 "kind": "KubeadmControlPlane", "name": REVIEW_KCP}},
    });
    let kcp = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "KubeadmControlPlane",
        "metadata": {"name": REVIEW_KCP, "namespace": REVIEW_NS,
            "labels": {"cluster.x-k8s.io/cluster-name": REVIEW_CLUSTER}},
        "spec": {"replicas": 3, "version": "v1.33.1"},
    });
    let mut objects = vec![cluster, kcp];
    for (name, node) in [
        ("test-cp-a", Some("cp-a")),
        ("test-cp-b", Some("cp-b")),
        ("test-cp-c", Some("cp-c")),
        ("test-cp-d", None),
    ] {
        objects.push(review_machine(name, node));
    }
    let member = |id: u64, name: &str, health: Health, learner: bool| {
        let mut m = Member::new(id, name);
        m.health = health;
        m.is_learner = learner;
        m
    };
    let members = vec![
        member(0x1001, "cp-a", Health::Healthy, false),
        member(0x1002, "cp-b", Health::Healthy, false),
        member(0x1003, "cp-c", Health::Unhealthy("timeout".into()), false),
        member(0x1005, "cp-e", Health::Healthy, true),
    ];
    crate::webhook::seeded(&objects, REVIEW_NS, REVIEW_CLUSTER, members)
}

/// Target `admission_review`: any body at either endpoint is decoded, judged against the
/// fixture control plane and answered, the way the HTTP handler does. A body that decodes gets
/// a well-formed admission.k8s.io/v1 response echoing its uid; one that does not gets an error
/// with a message (HTTP 400).
pub fn admission_review(data: &[u8]) {
    for endpoint in [Endpoint::Machines, Endpoint::KubeadmControlPlanes] {
        let decoded = match review::decode(endpoint, data) {
            Ok(d) => d,
            Err(e) => {
                assert!(!e.to_string().is_empty(), "an error without a message");
                continue;
            }
        };
        let webhook = review_webhook();
        let outcome = webhook.judge(&decoded);
        let (allowed, reason) = (outcome.allowed, outcome.reason.as_str());
        assert!(!outcome.message.is_empty(), "{reason}: empty message");
        let body = match serde_json::to_vec(&outcome.response(&decoded.uid)) {
            Ok(b) => b,
            Err(e) => panic!("the response does not serialize: {e}"),
        };
        let v: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => panic!("the response is not JSON: {e}"),
        };
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1", "{v}");
        assert_eq!(v["kind"], "AdmissionReview", "{v}");
        let resp = &v["response"];
        assert_eq!(resp["uid"], decoded.uid.as_str(), "{v}");
        assert_eq!(resp["allowed"], allowed, "{v}");
        assert_eq!(resp["auditAnnotations"]["reason"], reason, "{v}");
        if !allowed {
            assert_eq!(resp["status"]["code"], 403, "{v}");
            assert_eq!(resp["status"]["reason"], reason, "{v}");
        }
    }
}

/// `check`'s analysis of loaded dumps, as a human and as the KCP controller, rendered as text
/// and as JSON.
fn check_all(loaded: dumps::Loaded) {
    let whats = WhatIf::all_for(&loaded.control_plane);
    for who in ["kubernetes-admin", DEFAULT_KCP_CONTROLLER] {
        let requester = Requester::new(who);
        let report = match check::analyse(loaded.clone(), &whats, &requester, 1_800_000_000) {
            Ok(r) => r,
            Err(e) => panic!("a what-if built from the dump is refused: {e:#}"),
        };
        assert_eq!(report.verdicts.len(), whats.len());
        assert!(!check::render_text(&report).is_empty());
        if let Err(e) = serde_json::to_string(&report) {
            panic!("the report does not serialize: {e}");
        }
    }
}

/// Target `etcdctl`: the input holds up to four etcdctl outputs separated by NUL bytes (member
/// list, endpoint status, endpoint health, alarm list). Each part goes through every parser;
/// then the parts are combined with the objects of a healthy control plane and analysed as
/// `quorumguard check` would. Errors are fine; panics are not.
pub fn etcdctl(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parts: Vec<&str> = text.splitn(4, '\0').collect();
    for part in &parts {
        let _ = etcdctl::parse_member_list(part);
        let _ = etcdctl::parse_endpoint_status(part);
        let _ = etcdctl::parse_endpoint_health(part);
        let _ = etcdctl::parse_alarm_list(part);
    }
    let part = |i: usize| parts.get(i).map(|t| ("dump", *t));
    let texts = DumpTexts {
        objects: ("objects.yaml", OBJECTS),
        member_list: ("member-list.json", parts[0]),
        endpoint_status: part(1),
        endpoint_health: part(2),
        alarms: part(3),
        kcp: None,
    };
    if let Ok(loaded) = dumps::assemble(&texts) {
        check_all(loaded);
    }
}

/// Target `object_dump`: the input is a kubectl dump (YAML or JSON), combined with the etcd
/// dumps of a healthy 3-member cluster and analysed as `quorumguard check` would, for the only
/// KCP and for each KCP by name.
pub fn object_dump(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(objects) = dumps::parse_objects(text, "objects.yaml") else {
        return;
    };
    let mut names: Vec<Option<String>> = vec![None];
    names.extend(
        objects
            .kcps
            .iter()
            .map(|k| Some(format!("{}/{}", k.object.namespace, k.object.name))),
    );
    for kcp in names.iter().take(4) {
        let texts = DumpTexts {
            objects: ("objects.yaml", text),
            member_list: ("member-list.json", MEMBER_LIST),
            endpoint_status: Some(("endpoint-status.json", ENDPOINT_STATUS)),
            endpoint_health: Some(("endpoint-health.json", ENDPOINT_HEALTH)),
            alarms: None,
            kcp: kcp.as_deref(),
        };
        if let Ok(loaded) = dumps::assemble(&texts) {
            check_all(loaded);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// Every committed corpus entry of `target` (fuzz/corpus/<target>/), by file name.
    fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/corpus")
            .join(target);
        let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| {
                let path = e.expect("dir entry").path();
                let bytes = std::fs::read(&path).expect("corpus file");
                (path.display().to_string(), bytes)
            })
            .collect();
        out.sort();
        assert!(!out.is_empty(), "{}: empty corpus", dir.display());
        out
    }

    /// Replays a corpus; a panic names the input that caused it.
    fn replay(target: &str, body: fn(&[u8])) {
        for (name, bytes) in corpus(target) {
            if std::panic::catch_unwind(|| body(&bytes)).is_err() {
                panic!("{target}: corpus entry {name} panics");
            }
        }
    }

    #[test]
    fn admission_review_corpus() {
        replay("admission_review", super::admission_review);
    }

    #[test]
    fn etcdctl_corpus() {
        replay("etcdctl", super::etcdctl);
    }

    #[test]
    fn object_dump_corpus() {
        replay("object_dump", super::object_dump);
    }
}
