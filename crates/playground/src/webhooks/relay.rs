//! The recording pass-through between a real kube-apiserver and `quorumguard serve`: on the
//! real API server (`--real-apiserver`) kube-apiserver itself matches the
//! ValidatingWebhookConfiguration (CEL matchConditions, objectSelector) and calls this relay;
//! the relay forwards each review unchanged to `serve`, hands `serve`'s answer back unchanged,
//! and logs the call as the dispatcher logs its own, so the timeline's admission lines say what
//! `serve` answered.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::WebhookDispatcher;
use super::dispatcher::read_review_answer;
use crate::apiserver::{AdmissionAttempt, Operation};

/// The relay, listening on 127.0.0.1 with HTTPS.
pub struct Relay {
    /// Where kube-apiserver calls it.
    pub addr: SocketAddr,
    handle: axum_server::Handle<SocketAddr>,
}

impl Relay {
    /// Serves the relay for `dispatcher`'s webhooks with the serving certificate and key given
    /// (PEM), on a free loopback port.
    pub fn start(
        dispatcher: Arc<WebhookDispatcher>,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<Relay, String> {
        let tls = crate::tls::server_config(cert_pem.as_bytes(), key_pem.as_bytes())
            .map_err(|e| format!("the relay's certificate: {e}"))?;
        let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls));
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("a port for the relay: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("the relay's port: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("the relay's socket: {e}"))?;
        let server = axum_server::from_tcp_rustls(listener, tls)
            .map_err(|e| format!("the relay's socket: {e}"))?;
        let handle = axum_server::Handle::new();
        let app = axum::Router::new()
            .fallback(axum::routing::post(relay))
            .with_state(dispatcher);
        let serving = server.handle(handle.clone()).serve(app.into_make_service());
        tokio::spawn(async move {
            if let Err(e) = serving.await {
                tracing::error!(error = %e, "the webhook relay stopped");
            }
        });
        Ok(Relay { addr, handle })
    }

    /// Stops listening.
    pub fn stop(&self) {
        self.handle.shutdown();
    }
}

/// One review: forwarded, answered with `serve`'s answer, logged.
async fn relay(
    State(dispatcher): State<Arc<WebhookDispatcher>>,
    uri: Uri,
    body: Bytes,
) -> Response {
    let path = uri.path();
    let Some(hook) = dispatcher
        .hooks
        .iter()
        .find(|h| h.path_and_query.split('?').next() == Some(path))
    else {
        return (StatusCode::NOT_FOUND, format!("no webhook serves {path}")).into_response();
    };
    let review: Value = serde_json::from_slice(&body).unwrap_or_default();
    let request = &review["request"];
    let uid = request["uid"].as_str().unwrap_or("").to_string();
    let at = SystemTime::now();
    let started = Instant::now();
    let forwarded = dispatcher.post(hook, body.to_vec()).await;
    let latency = started.elapsed();
    let (response, answered) = match forwarded {
        Ok((code, content_type, answer)) => {
            let answered = read_review_answer(&hook.name, code, &content_type, &answer, &uid);
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
            let response = (status, [(header::CONTENT_TYPE, content_type)], answer).into_response();
            (response, answered)
        }
        Err(why) => {
            let answered = read_review_answer(
                &hook.name,
                502,
                "text/plain",
                &Bytes::from(why.clone()),
                &uid,
            );
            ((StatusCode::BAD_GATEWAY, why).into_response(), answered)
        }
    };
    if let Some(attempt) = attempt(request) {
        dispatcher.record(hook, &attempt, uid, &answered, latency, at);
    }
    response
}

/// The AdmissionReview `request` as the dispatcher's attempt (`None`: not a review).
fn attempt(r: &Value) -> Option<AdmissionAttempt> {
    let operation = match r["operation"].as_str()? {
        "CREATE" => Operation::Create,
        "UPDATE" => Operation::Update,
        "DELETE" => Operation::Delete,
        _ => return None,
    };
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let present = |v: &Value| (!v.is_null()).then(|| v.clone());
    Some(AdmissionAttempt {
        operation,
        group: text(&r["resource"]["group"]),
        version: text(&r["resource"]["version"]),
        resource: text(&r["resource"]["resource"]),
        kind: text(&r["kind"]["kind"]),
        sub_resource: r["subResource"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        namespace: r["namespace"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        name: text(&r["name"]),
        object: present(&r["object"]),
        old_object: present(&r["oldObject"]),
        user: text(&r["userInfo"]["username"]),
        dry_run: r["dryRun"].as_bool().unwrap_or(false),
        options: present(&r["options"]),
    })
}
