//! The AdmissionReview response, serialized straight from borrowed parts: the same JSON, byte for
//! byte, as kube's `AdmissionResponse` inside its `AdmissionReview` (the test
//! `the_response_is_kubes_byte_for_byte` compares them), without cloning the uid, the message
//! and the warnings into kube's owned types and a `HashMap` of audit annotations first.

use serde::Serialize;

use super::{API_VERSION, AUDIT_REASON, KIND};

/// An `admission.k8s.io/v1` AdmissionReview carrying a response.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewResponse<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: Response<'a>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Response<'a> {
    uid: &'a str,
    allowed: bool,
    status: Status<'a>,
    audit_annotations: Audit<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<&'a [String]>,
}

/// kube's `Status`: empty for an allowed review.
#[derive(Debug, Default, Serialize)]
struct Status<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

/// The one audit annotation, the reason code.
#[derive(Debug)]
struct Audit<'a>(&'a str);

impl Serialize for Audit<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(AUDIT_REASON, self.0)?;
        m.end()
    }
}

/// The response: a denial is `allowed: false` with status code 403, the reason code as status
/// reason, and the message; warnings and the reason as audit annotation either way.
pub fn respond<'a>(
    uid: &'a str,
    allowed: bool,
    reason: &'a str,
    message: &'a str,
    warnings: &'a [String],
) -> ReviewResponse<'a> {
    let status = if allowed {
        Status::default()
    } else {
        Status {
            code: Some(403),
            message: Some(message).filter(|m| !m.is_empty()),
            reason: Some(reason).filter(|r| !r.is_empty()),
        }
    };
    ReviewResponse {
        api_version: API_VERSION,
        kind: KIND,
        response: Response {
            uid,
            allowed,
            status,
            audit_annotations: Audit(reason),
            warnings: Some(warnings).filter(|w| !w.is_empty()),
        },
    }
}

impl ReviewResponse<'_> {
    /// The JSON body.
    pub fn to_vec(&self) -> Vec<u8> {
        // Serializing these types into a Vec cannot fail: no maps with non-string keys, no
        // floats, no I/O.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::DynamicObject;
    use kube::core::admission::{AdmissionRequest, AdmissionResponse};
    use serde_json::json;

    /// What the webhook answered before this module: kube's response to kube's request.
    fn kubes(uid: &str, allowed: bool, reason: &str, message: &str, warnings: &[String]) -> String {
        let req: AdmissionRequest<DynamicObject> = serde_json::from_value(json!({
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "X"},
            "resource": {"group": "", "version": "v1", "resource": "xs"},
            "operation": "DELETE", "userInfo": {},
        }))
        .expect("request");
        let mut req = req;
        req.types.api_version = API_VERSION.into();
        req.types.kind = KIND.into();
        let mut resp = AdmissionResponse::from(&req);
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
        serde_json::to_string(&resp.into_review()).expect("json")
    }

    #[test]
    fn the_response_is_kubes_byte_for_byte() {
        let w = ["one \"quoted\"".to_string(), "two\n".to_string()];
        for (allowed, reason, message, warnings) in [
            (true, "QuorumSafe", "safe", &[][..]),
            (true, "NotHandled", "quorumguard does not judge X", &w[..1]),
            (
                false,
                "WouldLoseQuorum",
                "deleting m would leave 1 of 3",
                &w[..],
            ),
            (false, "HealthUnknown", "", &[][..]),
            (false, "", "no reason", &[][..]),
        ] {
            let uid = "4883631f-6421-4d52-b375-083f7d1f4811";
            let ours = String::from_utf8(respond(uid, allowed, reason, message, warnings).to_vec())
                .expect("utf-8");
            assert_eq!(
                ours,
                kubes(uid, allowed, reason, message, warnings),
                "{reason}"
            );
        }
    }
}
