//! A failed webhook call in Go's words: client-go's for an HTTP status, Go's for a transport or
//! TLS failure.

use std::net::SocketAddr;

use serde_json::Value;

/// client-go's error for an HTTP status outside 200-206: a Status body's message, else
/// `NewGenericServerResponse`'s wording.
pub(super) fn status_error(code: u16, content_type: &str, body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body)
        && v.get("kind").and_then(Value::as_str) == Some("Status")
        && v.get("status").and_then(Value::as_str) != Some("Success")
    {
        return v
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
    }
    let server_message = if content_type.starts_with("text/") {
        let text = String::from_utf8_lossy(&body[..body.len().min(2048)]);
        text.trim().to_string()
    } else {
        "unknown".to_string()
    };
    match code {
        409 => "the server reported a conflict".into(),
        404 => "the server could not find the requested resource".into(),
        400 => "the server rejected our request for an unknown reason".into(),
        401 => "the server has asked for the client to provide credentials".into(),
        403 | 415 => server_message,
        406 if server_message.is_empty() || server_message == "unknown" => {
            "the server was unable to respond with a content type that the client supports".into()
        }
        406 => server_message,
        405 => "the server does not allow this method on the requested resource".into(),
        422 => "the server rejected our request due to an error in our request".into(),
        503 => "the server is currently unable to handle the request".into(),
        504 => "the server was unable to return a response in the time allotted, but may still be processing the request".into(),
        429 => "the server has received too many requests and has asked us to try again later".into(),
        c if c >= 500 => format!(
            "an error on the server ({server_message:?}) has prevented the request from succeeding"
        ),
        c => format!("the server responded with the status code {c} but did not return more information"),
    }
}

/// A transport failure in Go's words where they are known (`dial tcp ...: connect: connection
/// refused`, `tls: failed to verify certificate: x509: ...`), else the innermost error's text.
pub(super) fn transport_error(err: &kube::Error, addr: SocketAddr, server_name: &str) -> String {
    let mut innermost = err.to_string();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    for _ in 0..32 {
        let Some(e) = next else { break };
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return tls_error(tls, server_name);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    return format!("dial tcp {addr}: connect: connection refused");
                }
                std::io::ErrorKind::TimedOut => return "context deadline exceeded".into(),
                std::io::ErrorKind::UnexpectedEof => return "EOF".into(),
                std::io::ErrorKind::ConnectionReset => {
                    return format!("read tcp {addr}: read: connection reset by peer");
                }
                _ => {}
            }
            // An io::Error's source() skips the error it wraps (often another io::Error
            // around the rustls::Error): descend into that instead.
            if let Some(inner) = io.get_ref() {
                innermost = io.to_string();
                next = Some(inner);
                continue;
            }
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>()
            && h.is_incomplete_message()
        {
            return "EOF".into();
        }
        innermost = e.to_string();
        next = e.source();
    }
    innermost
}

pub(super) fn tls_error(err: &rustls::Error, server_name: &str) -> String {
    use rustls::CertificateError as C;
    let verify = |x509: String| format!("tls: failed to verify certificate: x509: {x509}");
    match err {
        rustls::Error::InvalidCertificate(cert) => match cert {
            // Go adds `(possibly because of ... while trying to verify candidate authority
            // certificate ...)` for a CA of the right name but the wrong key.
            C::UnknownIssuer | C::BadSignature => {
                verify("certificate signed by unknown authority".into())
            }
            C::NotValidForNameContext { presented, .. } => {
                // webpki lists names as `DnsName("x")` and `IpAddress(1.2.3.4)`; Go lists the
                // DNS names for a DNS host.
                let names: Vec<&str> = presented
                    .iter()
                    .filter_map(|p| p.strip_prefix("DnsName(\"")?.strip_suffix("\")"))
                    .collect();
                if names.is_empty() {
                    verify(format!(
                        "certificate is not valid for any names, but wanted to match {server_name}"
                    ))
                } else {
                    verify(format!(
                        "certificate is valid for {}, not {server_name}",
                        names.join(", ")
                    ))
                }
            }
            C::NotValidForName => verify(format!("certificate is not valid for {server_name}")),
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => {
                verify("certificate has expired or is not yet valid".into())
            }
            other => verify(format!("{other:?}")),
        },
        rustls::Error::AlertReceived(alert) => format!("remote error: tls: {alert:?}"),
        other => format!("tls: {other}"),
    }
}
