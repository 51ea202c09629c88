//! AdmissionReview (admission.k8s.io/v1) -> what is being asked, in engine terms; and the
//! verdict -> the AdmissionReview response kube-apiserver expects.
//!
//! A review is decoded in one pass over the body into an envelope of our own
//! ([`envelope`]: its strings borrowed from the body, what is never read skipped without being
//! built) whose objects are [`ObjectParts`](quorumguard_observe::capi::ObjectParts): only the fields the rules read are built, and
//! managedFields, status conditions and the rest are skipped by the parser. The response
//! ([`response`]) is serialized from borrowed parts, the same JSON as kube's
//! `AdmissionResponse`. `cargo bench --bench core -- review` measures both.

pub mod envelope;
pub mod response;

use kube::core::admission::Operation;
use serde_json::Value;

use envelope::{AdmissionRequest, Body};
use quorumguard_engine::Requester;
use quorumguard_observe::capi::{self, CapiKcp, CapiMachine};
pub use response::{ReviewResponse, respond};

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
    /// Valid JSON, but not an object at all (`null`, an array, a string...).
    #[error("the body is not an AdmissionReview: expected a JSON object, got {0}")]
    NotObject(&'static str),
    #[error(
        "AdmissionReview apiVersion {0:?} is not supported: register the webhook with admissionReviewVersions [v1]"
    )]
    Version(String),
    #[error(
        "the body's kind is {0:?}, not \"AdmissionReview\": send an admission.k8s.io/v1 AdmissionReview"
    )]
    Kind(String),
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
    /// The request's uid, echoed in the response.
    pub uid: String,
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

/// The only AdmissionReview version served.
const API_VERSION: &str = "admission.k8s.io/v1";
/// The only kind of body served.
const KIND: &str = "AdmissionReview";

/// Parses a body. Errors are the client's (HTTP 400); a kind this endpoint does not judge is
/// not an error but [`Subject::Unhandled`].
pub fn decode(endpoint: Endpoint, body: &[u8]) -> Result<Decoded, ReviewError> {
    let parsed: Body = serde_json::from_slice(body).map_err(|e| why_not(body, e))?;
    let api_version = parsed.api_version.unwrap_or_default();
    if api_version.as_str() != API_VERSION {
        return Err(ReviewError::Version(api_version.as_str().to_string()));
    }
    // The response echoes the request's kind: answering a "Foo" with a "Foo" (found by the
    // admission_review fuzz target) is not an AdmissionReview response.
    if parsed.kind.as_str() != KIND {
        return Err(ReviewError::Kind(parsed.kind.as_str().to_string()));
    }
    let request = parsed.request.ok_or(ReviewError::NoRequest)?;
    let subject = subject(endpoint, &request)?;
    let user = &request.user_info;
    Ok(Decoded {
        uid: request.uid.as_str().to_string(),
        namespace: request
            .namespace
            .as_ref()
            .map(|n| n.as_str().to_string())
            .unwrap_or_default(),
        name: request.name.as_str().to_string(),
        kind: format!(
            "{}/{}",
            request.kind.group.as_str(),
            request.kind.kind.as_str()
        ),
        operation: operation_str(&request.operation),
        requester: Requester {
            username: user
                .username
                .as_ref()
                .map(|u| u.as_str().to_string())
                .unwrap_or_default(),
            groups: user
                .groups
                .iter()
                .flatten()
                .map(|g| g.as_str().to_string())
                .collect(),
        },
        dry_run: request.dry_run,
        subject,
    })
}

/// Why a body did not deserialize, in the order a reader would want it named: not JSON at all,
/// then the wrong review version, then no request, and only then the shape. Only bodies that
/// fail get this second look.
fn why_not(body: &[u8], shape: serde_json::Error) -> ReviewError {
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return ReviewError::Json(e),
    };
    let got = match &value {
        Value::Object(_) => None,
        Value::Null => Some("null"),
        Value::Array(_) => Some("an array"),
        Value::String(_) => Some("a string"),
        Value::Number(_) => Some("a number"),
        Value::Bool(_) => Some("a boolean"),
    };
    if let Some(got) = got {
        return ReviewError::NotObject(got);
    }
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if api_version != API_VERSION {
        return ReviewError::Version(api_version.to_string());
    }
    if value.get("request").is_none_or(Value::is_null) {
        return ReviewError::NoRequest;
    }
    ReviewError::Shape(shape)
}

fn subject(endpoint: Endpoint, req: &AdmissionRequest) -> Result<Subject, ReviewError> {
    let sub_resource = req.sub_resource.as_ref().map(|s| s.as_str());
    let (group, kind) = (req.kind.group.as_str(), req.kind.kind.as_str());
    // Only messages need it: built when one is.
    let what = || {
        format!(
            "{} {} of {}/{} {}/{}",
            operation_str(&req.operation),
            sub_resource
                .map(|s| format!("(subresource {s})"))
                .unwrap_or_default(),
            group,
            kind,
            req.namespace.as_ref().map_or("", |n| n.as_str()),
            req.name.as_str()
        )
    };
    let bad = |e: capi::CapiError| ReviewError::Object(e.to_string());
    match (endpoint, &req.operation) {
        (Endpoint::Machines, Operation::Delete)
            if group == capi::GROUP_CLUSTER && kind == "Machine" =>
        {
            let old = req.old_object.as_ref().ok_or_else(|| {
                ReviewError::Object(format!("{}: a DELETE review must carry oldObject", what()))
            })?;
            Ok(Subject::MachineDelete {
                machine: capi::machine_from_parts(old).map_err(bad)?,
                uid: old.metadata.uid.clone(),
            })
        }
        (Endpoint::KubeadmControlPlanes, Operation::Update)
            if req.resource.resource.as_str() == "kubeadmcontrolplanes" =>
        {
            let (Some(new), Some(old)) = (&req.object, &req.old_object) else {
                return Err(ReviewError::Object(format!(
                    "{}: an UPDATE review must carry object and oldObject",
                    what()
                )));
            };
            if sub_resource == Some("scale") {
                return Ok(Subject::KcpUpdate {
                    kcp: req.name.as_str().to_string(),
                    from: capi::scale_replicas(old).map_err(bad)?,
                    to: capi::scale_replicas(new).map_err(bad)?,
                    starts_rollout: false,
                    object: None,
                    uid: new.metadata.uid.clone(),
                });
            }
            if sub_resource.is_some() {
                return Ok(Subject::Unhandled(what()));
            }
            let old_kcp = capi::kcp_from_parts(old).map_err(bad)?;
            let new_kcp = capi::kcp_from_parts(new).map_err(bad)?;
            Ok(Subject::KcpUpdate {
                kcp: req.name.as_str().to_string(),
                from: old_kcp.kcp.replicas,
                to: new_kcp.kcp.replicas,
                starts_rollout: capi::starts_rollout(old, new),
                object: Some(new_kcp),
                uid: new.metadata.uid.clone(),
            })
        }
        _ => Ok(Subject::Unhandled(what())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorumguard_observe::capi::testkit::review as fixture;
    use serde_json::json;

    fn decode_value(endpoint: Endpoint, v: &Value) -> Result<Decoded, ReviewError> {
        decode(endpoint, &serde_json::to_vec(v).expect("json"))
    }

    #[test]
    fn admission_fixtures_decode_to_their_subjects() {
        let d = decode_value(Endpoint::Machines, &fixture("machine-delete-by-user.json"))
            .expect("decodes");
        assert_eq!(d.uid, "4883631f-6421-4d52-b375-083f7d1f4811");
        assert_eq!(
            (d.namespace.as_str(), d.name.as_str()),
            ("capi-test", "test-cp-a")
        );
        assert_eq!(d.kind, "cluster.x-k8s.io/Machine");
        assert_eq!(d.operation, "DELETE");
        assert_eq!(d.requester.username, "jane@example.com");
        assert_eq!(
            d.requester.groups,
            ["system:masters", "system:authenticated"]
        );
        assert!(!d.dry_run);
        let Subject::MachineDelete { machine, uid } = &d.subject else {
            panic!("{:?}", d.subject)
        };
        assert_eq!(uid.as_deref(), Some("a696fd65-8278-4c72-9152-b118b6376ba1"));
        assert_eq!(machine.machine.node_name.as_deref(), Some("cp-a"));
        assert_eq!(
            machine.control_plane_name.as_deref(),
            Some("test-controlplane")
        );
        assert_eq!(machine.machine.created_unix, Some(1_796_217_305));
        // kubectl's last-applied copy is skipped; the hooks the rules read are kept.
        assert_eq!(
            machine.machine.annotations.keys().collect::<Vec<_>>(),
            ["pre-terminate.delete.hook.machine.cluster.x-k8s.io/kcp-cleanup"]
        );

        let d = decode_value(Endpoint::Machines, &fixture("machine-delete-dry-run.json"))
            .expect("decodes");
        assert!(d.dry_run);

        for (file, from, to, rollout) in [
            ("kcp-update-replicas-5-to-3.json", 5, 3, false),
            ("kcp-update-version.json", 3, 3, true),
        ] {
            let d = decode_value(Endpoint::KubeadmControlPlanes, &fixture(file))
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            let Subject::KcpUpdate {
                kcp,
                from: f,
                to: t,
                starts_rollout,
                object,
                uid,
            } = &d.subject
            else {
                panic!("{file}: {:?}", d.subject)
            };
            assert_eq!(kcp, "test-controlplane", "{file}");
            assert_eq!((*f, *t, *starts_rollout), (from, to, rollout), "{file}");
            assert_eq!(object.as_ref().map(|k| k.kcp.replicas), Some(to), "{file}");
            assert!(uid.is_some(), "{file}");
        }

        let d = decode_value(
            Endpoint::KubeadmControlPlanes,
            &fixture("kcp-scale-subresource-3-to-5.json"),
        )
        .expect("decodes");
        let Subject::KcpUpdate {
            from, to, object, ..
        } = &d.subject
        else {
            panic!("{:?}", d.subject)
        };
        assert_eq!((*from, *to, object.is_none()), (3, 5, true));

        // The wrong endpoint for the kind: not judged, not an error.
        let d = decode_value(
            Endpoint::KubeadmControlPlanes,
            &fixture("machine-delete-by-user.json"),
        )
        .expect("decodes");
        assert!(
            matches!(&d.subject, Subject::Unhandled(w) if w == "DELETE  of cluster.x-k8s.io/Machine capi-test/test-cp-a"),
            "{:?}",
            d.subject
        );
    }

    #[test]
    fn admission_errors_are_named_in_the_old_order() {
        let err = |body: &[u8]| match decode(Endpoint::Machines, body) {
            Ok(_) => panic!("decoded: {}", String::from_utf8_lossy(body)),
            Err(e) => e,
        };
        assert!(matches!(err(b"{not json"), ReviewError::Json(_)));
        // A shape error before a syntax error is still "not JSON".
        assert!(matches!(
            err(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":5}, nope"#),
            ReviewError::Json(_)
        ));
        let mut v1beta1 = fixture("machine-delete-by-user.json");
        v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
        let e = err(&serde_json::to_vec(&v1beta1).expect("json"));
        assert!(
            e.to_string().contains("admissionReviewVersions [v1]"),
            "{e}"
        );
        // ... also when its request would not have decoded.
        v1beta1["request"]["uid"] = json!(5);
        let e = err(&serde_json::to_vec(&v1beta1).expect("json"));
        assert!(matches!(e, ReviewError::Version(ref v) if v == "admission.k8s.io/v1beta1"));
        assert!(matches!(
            err(br#"{"kind":"AdmissionReview","request":{}}"#),
            ReviewError::Version(ref v) if v.is_empty()
        ));
        for body in [
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.as_slice(),
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}"#,
        ] {
            assert!(matches!(err(body), ReviewError::NoRequest));
        }
        for (body, got) in [
            (b"null".as_slice(), "null"),
            (b"[1, 2]", "an array"),
            (b"\"AdmissionReview\"", "a string"),
            (b"7", "a number"),
            (b"true", "a boolean"),
        ] {
            let e = err(body);
            assert!(matches!(e, ReviewError::NotObject(g) if g == got), "{e}");
            assert_eq!(
                e.to_string(),
                format!("the body is not an AdmissionReview: expected a JSON object, got {got}")
            );
        }
        // Found by the admission_review fuzz target: any kind was accepted, and echoed back.
        let mut other_kind = fixture("machine-delete-by-user.json");
        other_kind["kind"] = json!("AdmhssionReview");
        let e = err(&serde_json::to_vec(&other_kind).expect("json"));
        assert!(
            matches!(e, ReviewError::Kind(ref k) if k == "AdmhssionReview"),
            "{e}"
        );
        assert!(e.to_string().contains("not \"AdmissionReview\""), "{e}");
        let mut shape = fixture("machine-delete-by-user.json");
        shape["request"]["uid"] = json!(5);
        assert!(matches!(
            err(&serde_json::to_vec(&shape).expect("json")),
            ReviewError::Shape(_)
        ));
        let mut no_old = fixture("machine-delete-by-user.json");
        no_old["request"]["oldObject"] = Value::Null;
        let e = err(&serde_json::to_vec(&no_old).expect("json"));
        assert_eq!(
            e.to_string(),
            "DELETE  of cluster.x-k8s.io/Machine capi-test/test-cp-a: a DELETE review must carry oldObject"
        );
        let mut bad_node = fixture("machine-delete-by-user.json");
        bad_node["request"]["oldObject"]["status"]["nodeRef"]["name"] = json!(7);
        let e = err(&serde_json::to_vec(&bad_node).expect("json"));
        assert_eq!(
            e.to_string(),
            "Machine capi-test/test-cp-a: field status.nodeRef.name is invalid: expected a string, found 7"
        );
    }

    #[test]
    fn admission_skips_what_it_does_not_read() {
        // managedFields is never read, so its shape does not matter; a status that is not a map
        // reads as empty, as it always did.
        let mut r = fixture("machine-delete-by-user.json");
        r["request"]["oldObject"]["metadata"]["managedFields"] = json!("not a list");
        r["request"]["oldObject"]["status"] = json!(["odd"]);
        let d = decode_value(Endpoint::Machines, &r).expect("decodes");
        let Subject::MachineDelete { machine, .. } = &d.subject else {
            panic!("{:?}", d.subject)
        };
        assert_eq!(machine.machine.node_name, None);
    }

    #[test]
    fn admission_rollout_is_a_change_of_value_not_of_formatting() {
        let base = fixture("kcp-update-replicas-5-to-3.json");
        let rollout = |change: &dyn Fn(&mut Value)| {
            let mut r = base.clone();
            change(&mut r["request"]["object"]["spec"]);
            match decode_value(Endpoint::KubeadmControlPlanes, &r)
                .expect("decodes")
                .subject
            {
                Subject::KcpUpdate { starts_rollout, .. } => starts_rollout,
                other => panic!("{other:?}"),
            }
        };
        assert!(!rollout(&|_| {}));
        // The same kubeadm config in other whitespace: the texts differ, the values do not.
        let mut r = base.clone();
        let spec = r["request"]["object"]["spec"]["kubeadmConfigSpec"].take();
        r["request"]["object"]["spec"]["kubeadmConfigSpec"] = json!("KCS");
        let body = serde_json::to_string(&r).expect("json").replace(
            "\"KCS\"",
            &serde_json::to_string_pretty(&spec).expect("json"),
        );
        let d = decode(Endpoint::KubeadmControlPlanes, body.as_bytes()).expect("decodes");
        assert!(matches!(
            d.subject,
            Subject::KcpUpdate {
                starts_rollout: false,
                ..
            }
        ));
        assert!(rollout(
            &|s| s["machineTemplate"]["spec"]["extra"] = json!(1)
        ));
        assert!(rollout(&|s| {
            s["kubeadmConfigSpec"]["clusterConfiguration"]["apiServer"] = json!({"x": 1})
        }));
        assert!(rollout(&|s| s["version"] = json!("v1.33.0")));
        assert!(rollout(&|s| {
            s.as_object_mut().expect("spec").remove("machineTemplate");
        }));
    }

    #[test]
    fn admission_response_echoes_uid_and_review_type() {
        let d = decode_value(Endpoint::Machines, &fixture("machine-delete-by-user.json"))
            .expect("decodes");
        let w = ["w".to_string()];
        let r = respond(&d.uid, false, "WouldLoseQuorum", "no", &w);
        let v: Value = serde_json::from_slice(&r.to_vec()).expect("json");
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(v["response"]["uid"], "4883631f-6421-4d52-b375-083f7d1f4811");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["code"], 403);
        assert_eq!(v["response"]["status"]["reason"], "WouldLoseQuorum");
        assert_eq!(v["response"]["status"]["message"], "no");
        assert_eq!(v["response"]["warnings"], json!(["w"]));
        assert_eq!(
            v["response"]["auditAnnotations"]["reason"],
            "WouldLoseQuorum"
        );
    }
}
