//! The admin endpoints (`/livez`, `/readyz`, `/metrics`) over [`Readiness`] and [`Metrics`]
//! ([`admin_router`]).

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

use super::{METRICS_CONTENT_TYPE, Metrics, Readiness};

#[derive(Clone)]
struct AdminState {
    readiness: Arc<Readiness>,
    metrics: Arc<Metrics>,
}

/// The admin endpoints, to be served over plain HTTP on their own port:
/// - `GET /livez`: 200 `ok` whenever the process answers (restart only a hung process);
/// - `GET /readyz`: 200 `ok`, or 503 with the [`Readiness::not_ready_reasons`], one per line;
/// - `GET /metrics`: 200, [`Metrics::encode`] as [`METRICS_CONTENT_TYPE`].
pub fn admin_router(readiness: Arc<Readiness>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { readiness, metrics })
}

async fn readyz(State(state): State<AdminState>) -> Response {
    let reasons = state.readiness.not_ready_reasons();
    if reasons.is_empty() {
        return (StatusCode::OK, "ok\n").into_response();
    }
    let mut body = String::new();
    for reason in reasons {
        body.push_str(reason);
        body.push('\n');
    }
    (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
}

async fn metrics_text(State(state): State<AdminState>) -> Response {
    state
        .metrics
        .ready
        .set(i64::from(state.readiness.is_ready()));
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        state.metrics.encode(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::{body::Body, http::Request};
    use tower::ServiceExt;

    async fn get_path(router: Router, path: &str) -> (StatusCode, Option<String>, String) {
        let response = router
            .oneshot(Request::get(path).body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().expect("ascii").to_owned());
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).expect("utf-8"),
        )
    }

    fn router() -> (Arc<Readiness>, Arc<Metrics>, Router) {
        let readiness = Arc::new(Readiness::new());
        let metrics = Arc::new(Metrics::new());
        let router = admin_router(readiness.clone(), metrics.clone());
        (readiness, metrics, router)
    }

    #[tokio::test]
    async fn livez_answers_ok_even_when_not_ready() {
        let (readiness, _, router) = router();
        assert!(!readiness.is_ready());
        let (status, _, body) = get_path(router, "/livez").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.trim(), "ok");
    }

    #[tokio::test]
    async fn readyz_lists_unmet_conditions_until_all_are_met() {
        let (readiness, _, router) = router();
        let (status, _, body) = get_path(router.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body.lines().collect::<Vec<_>>(),
            [
                "serving certificate not loaded",
                "watch caches not synced",
                "first etcd sweep not finished: workload clusters known at start not all probed yet",
                "not accepting admission requests"
            ]
        );

        readiness.set_cert_loaded(true);
        readiness.set_caches_synced(true);
        readiness.set_accepting(true);
        let (status, _, body) = get_path(router.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "first etcd sweep not finished: workload clusters known at start not all probed yet\n"
        );
        let (_, _, metrics) = get_path(router.clone(), "/metrics").await;
        assert!(metrics.contains("\nquorumguard_ready 0\n"), "{metrics}");

        readiness.set_swept(true);
        assert!(readiness.is_ready());
        assert!(readiness.not_ready_reasons().is_empty());
        let (status, _, body) = get_path(router.clone(), "/readyz").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body.trim(), "ok");
        let (_, _, metrics) = get_path(router.clone(), "/metrics").await;
        assert!(metrics.contains("\nquorumguard_ready 1\n"), "{metrics}");

        readiness.set_shutting_down(true);
        let (status, _, body) = get_path(router, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "shutting down\n");
    }

    #[tokio::test]
    async fn metrics_are_prometheus_text_with_the_documented_families_and_labels() {
        let (_, metrics, router) = router();
        metrics.observe_review(
            "/validate-machine",
            "DELETE",
            false,
            "WouldLoseQuorum",
            0.0007,
        );
        metrics.observe_review("/validate-machine", "DELETE", true, "QuorumSafe", 0.002);
        metrics.observe_review("/validate-machine", "DELETE", true, "QuorumSafe", 0.003);
        let guard = metrics.in_flight("/validate-kcp");
        metrics.cert_reload(true);
        metrics.set_cache_synced("machines", true);
        metrics.set_cache_synced("kubeadmcontrolplanes", false);

        let (status, content_type, body) = get_path(router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            content_type.as_deref(),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );

        for line in [
            "# TYPE quorumguard_admission_requests_total counter",
            "quorumguard_admission_requests_total{endpoint=\"/validate-machine\",operation=\"DELETE\",allowed=\"false\",reason=\"WouldLoseQuorum\"} 1",
            "quorumguard_admission_requests_total{endpoint=\"/validate-machine\",operation=\"DELETE\",allowed=\"true\",reason=\"QuorumSafe\"} 2",
            "# TYPE quorumguard_admission_duration_seconds histogram",
            "quorumguard_admission_duration_seconds_bucket{endpoint=\"/validate-machine\",le=\"0.0005\"} 0",
            "quorumguard_admission_duration_seconds_bucket{endpoint=\"/validate-machine\",le=\"0.001\"} 1",
            "quorumguard_admission_duration_seconds_bucket{endpoint=\"/validate-machine\",le=\"5\"} 3",
            "quorumguard_admission_duration_seconds_bucket{endpoint=\"/validate-machine\",le=\"+Inf\"} 3",
            "quorumguard_admission_duration_seconds_count{endpoint=\"/validate-machine\"} 3",
            "# TYPE quorumguard_admission_in_flight gauge",
            "quorumguard_admission_in_flight{endpoint=\"/validate-kcp\"} 1",
            "# TYPE quorumguard_certificate_reloads_total counter",
            "quorumguard_certificate_reloads_total{result=\"success\"} 1",
            "quorumguard_certificate_reloads_total{result=\"error\"} 0",
            "# TYPE quorumguard_cache_synced gauge",
            "quorumguard_cache_synced{resource=\"machines\"} 1",
            "quorumguard_cache_synced{resource=\"kubeadmcontrolplanes\"} 0",
        ] {
            assert!(
                body.lines().any(|l| l == line),
                "missing {line:?} in\n{body}"
            );
        }
        assert_prometheus_text(&body);

        drop(guard);
        assert!(
            metrics
                .encode()
                .lines()
                .any(|l| l == "quorumguard_admission_in_flight{endpoint=\"/validate-kcp\"} 0")
        );
    }

    /// A small check of the text format 0.0.4 grammar: every family has HELP then TYPE, every
    /// sample belongs to the family just declared, and every value is a number.
    fn assert_prometheus_text(body: &str) {
        let mut family: Option<(String, String)> = None;
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().expect("name");
                family = Some((name.to_owned(), String::new()));
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split(' ');
                let (name, kind) = (parts.next().expect("name"), parts.next().expect("type"));
                let declared = family.as_mut().expect("HELP before TYPE");
                assert_eq!(declared.0, name, "TYPE after the HELP of {}", declared.0);
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                declared.1 = kind.to_owned();
            } else {
                assert!(!line.starts_with('#'), "unexpected comment {line:?}");
                let (name, kind) = family.as_ref().expect("a sample after its TYPE");
                let sample = line.split(['{', ' ']).next().expect("sample name");
                let suffixes: &[&str] = match kind.as_str() {
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[""],
                };
                assert!(
                    suffixes.iter().any(|s| sample == format!("{name}{s}")),
                    "sample {sample} outside its family {name}"
                );
                let value = line.rsplit(' ').next().expect("value");
                assert!(value.parse::<f64>().is_ok(), "bad value in {line:?}");
            }
        }
        assert!(family.is_some(), "no metric families");
    }
}
