//! The answers read back: verdicts worded as kube-apiserver words them, invalid answers and
//! failed calls in Go's words.

use axum::body::Bytes;
use rustls::pki_types::ServerName;
use serde_json::{Value, json};

use super::MACHINES;
use crate::webhooks::SERVICE_DNS_NAME;
use crate::webhooks::answer::{Outcome, judge, read_answer};
use crate::webhooks::failure::{status_error, tls_error};

fn answer(response: Value) -> Bytes {
    Bytes::from(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
            .to_string(),
    )
}

fn verdict(response: Value) -> (Option<(u16, String, String)>, Vec<String>) {
    let body = answer(response);
    let a = judge(MACHINES, read_answer(&body, "u1").expect("valid"));
    let refusal = match a.outcome {
        Outcome::Denied {
            code,
            reason,
            message,
            ..
        } => Some((code, reason, message)),
        Outcome::Allowed { .. } => None,
        Outcome::Failed(f) => panic!("failed: {f}"),
    };
    (refusal, a.warnings)
}

#[test]
fn answers_are_worded_as_kube_apiserver_words_them() {
    let denied = "admission webhook \"machines.quorumguard.io\" denied the request";
    let (r, w) = verdict(json!({"uid": "u1", "allowed": true, "warnings": ["careful"]}));
    assert_eq!((r, w), (None, vec!["careful".to_string()]));
    let (r, _) = verdict(json!({"uid": "u1", "allowed": false,
        "status": {"code": 403, "reason": "WouldLoseQuorum", "message": "no quorum"}}));
    assert_eq!(
        r,
        Some((
            403,
            "WouldLoseQuorum".into(),
            format!("{denied}: no quorum")
        ))
    );
    let (r, _) =
        verdict(json!({"uid": "u1", "allowed": false, "status": {"code": 200, "reason": "Why"}}));
    assert_eq!(r, Some((403, "Why".into(), format!("{denied}: Why"))));
    let (r, _) = verdict(json!({"uid": "u1", "allowed": false}));
    assert_eq!(
        r,
        Some((403, String::new(), format!("{denied} without explanation")))
    );
    let (r, _) = verdict(json!({"uid": "u1", "allowed": false, "status": {"code": 422}}));
    assert_eq!(r.map(|r| r.0), Some(422));
}

#[test]
fn invalid_answers_are_call_failures() {
    let fail = |body: &str| read_answer(&Bytes::from(body.to_string()), "u1").err();
    assert_eq!(
        fail(&String::from_utf8_lossy(&answer(
            json!({"uid": "u2", "allowed": true})
        ))),
        Some("received invalid webhook response: expected response.uid=\"u1\", got \"u2\"".into())
    );
    assert_eq!(
        fail(r#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#),
        Some("received invalid webhook response: webhook response was absent".into())
    );
    assert_eq!(
        fail(r#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "response": {"uid": "u1", "allowed": true}}"#),
        Some("received invalid webhook response: expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got admission.k8s.io/v1beta1, Kind=AdmissionReview".into())
    );
    assert!(fail("<html>").is_some_and(|e| {
        e.starts_with("failed to call webhook: couldn't get version/kind; json parse error: ")
    }));
    assert_eq!(
        fail(r#"{"response": {}}"#),
        Some(r#"failed to call webhook: Object 'Kind' is missing in '{"response": {}}'"#.into())
    );
}

#[test]
fn http_failures_read_like_client_go() {
    assert_eq!(
        status_error(404, "text/plain; charset=utf-8", b"404 page not found\n"),
        "the server could not find the requested resource"
    );
    assert_eq!(
        status_error(500, "text/plain", b"boom\n"),
        "an error on the server (\"boom\") has prevented the request from succeeding"
    );
    assert_eq!(
        status_error(502, "application/octet-stream", b"\x00"),
        "an error on the server (\"unknown\") has prevented the request from succeeding"
    );
    assert_eq!(
        status_error(
            400,
            "application/json",
            br#"{"kind": "Status", "status": "Failure", "message": "bad review"}"#
        ),
        "bad review"
    );
    assert_eq!(
        status_error(302, "", b""),
        "the server responded with the status code 302 but did not return more information"
    );
}

#[test]
fn tls_failures_read_like_go() {
    use rustls::CertificateError as C;
    let unknown = rustls::Error::InvalidCertificate(C::UnknownIssuer);
    assert_eq!(
        tls_error(&unknown, SERVICE_DNS_NAME),
        "tls: failed to verify certificate: x509: certificate signed by unknown authority"
    );
    let name = rustls::Error::InvalidCertificate(C::NotValidForNameContext {
        expected: ServerName::try_from(SERVICE_DNS_NAME)
            .expect("name")
            .to_owned(),
        presented: vec![
            "DnsName(\"localhost\")".into(),
            "IpAddress(127.0.0.1)".into(),
        ],
    });
    assert_eq!(
        tls_error(&name, SERVICE_DNS_NAME),
        format!(
            "tls: failed to verify certificate: x509: certificate is valid for localhost, not {SERVICE_DNS_NAME}"
        )
    );
}
