//! Logs, metrics, readiness and the admin endpoints (`/livez`, `/readyz`, `/metrics`).
//!
//! They live in one place so every entry point reports the same way, and so `main` only wires
//! them: the admin router is plain HTTP on its own port, because kubelet probes and Prometheus
//! scrapes must keep working when the webhook's TLS certificate is the thing that is broken.

use std::{
    io::IsTerminal,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::{
    encoding::{EncodeLabelSet, prometheus_text},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

/// The prefix of every metric name (`quorumguard_…`), so our series are easy to find and never
/// collide with another exporter's in the same scrape.
pub const METRIC_PREFIX: &str = "quorumguard";

/// Upper bounds of the admission latency histogram, in seconds: a review is normally decided from
/// caches in well under a millisecond, and kube-apiserver gives up on a webhook after its timeout
/// (at most 30 s, 3–10 s in practice), so 0.5 ms .. 5 s covers everything worth telling apart.
pub const DURATION_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// The `Content-Type` of `/metrics`: prometheus-client's Prometheus text encoder
/// (`encoding::prometheus_text`) writes the Prometheus text format 0.0.4, the one every
/// Prometheus-compatible scraper understands, so that is what we declare.
pub const METRICS_CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// How logs are written: text for people at a terminal, JSON for log pipelines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured when stderr is a terminal).
    #[default]
    Text,
    /// One JSON object per line, event fields at the top level and the current span's fields
    /// (admission uid, kind, name, …) under `span`.
    Json,
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter does not parse (see `tracing_subscriber::EnvFilter` for the syntax).
    #[error("invalid log filter {filter:?}: {source}")]
    InvalidFilter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global tracing subscriber is already installed (logging initialised twice).
    #[error("cannot install the log subscriber: {0}")]
    AlreadyInitialized(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// Installs the process-wide log subscriber, writing to stderr (stdout stays free for command
/// output such as `quorumguard check`'s report). `filter` uses `EnvFilter` syntax, for example
/// `info` or `info,quorumguard=debug`; call this once, early in `main`.
pub fn init_logging(format: LogFormat, filter: &str) -> Result<(), TelemetryError> {
    let env_filter = tracing_subscriber::EnvFilter::try_new(filter).map_err(|source| {
        TelemetryError::InvalidFilter {
            filter: filter.to_owned(),
            source,
        }
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    installed.map_err(TelemetryError::AlreadyInitialized)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    endpoint: String,
    operation: String,
    allowed: bool,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The process's Prometheus metrics. Share it as `Arc<Metrics>`: every method takes `&self` and is
/// safe to call from any task.
///
/// Series, all prefixed `quorumguard_`:
/// - `admission_requests_total{endpoint,operation,allowed,reason}` counter — one per review;
/// - `admission_duration_seconds{endpoint}` histogram ([`DURATION_BUCKETS`]);
/// - `admission_in_flight{endpoint}` gauge — reviews being decided now;
/// - `certificate_reloads_total{result="success"|"error"}` counter (both present from the start);
/// - `serving_certificate_not_before_timestamp_seconds` / `..._not_after_...` gauges — the
///   validity of the certificate served now, for alerts long before kube-apiserver refuses it;
/// - `cache_synced{resource}` gauge, 1 once that resource's watch cache has synced, else 0.
///
/// More families (the status enricher's probe metrics, for example) are added through
/// [`Metrics::registry_mut`] while building, or [`Metrics::with_registry`] once shared; both hand
/// out the same prefixed registry, so a family registered as `etcd_probe_duration` with
/// [`Unit::Seconds`] is exported as `quorumguard_etcd_probe_duration_seconds`. Register counter
/// names without `_total`: the encoder adds it (and prometheus-client panics on it in debug).
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<ReviewLabels, Counter>,
    duration: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    in_flight: Family<EndpointLabels, Gauge>,
    cert_reloads: Family<ReloadLabels, Counter>,
    cert_not_before: Gauge,
    cert_not_after: Gauge,
    cache_synced: Family<ResourceLabels, Gauge>,
    ready: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers the webhook's metric families in a new registry.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(METRIC_PREFIX);
        let requests = Family::<ReviewLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission reviews answered, by endpoint, operation, verdict and reason",
            requests.clone(),
        );
        let duration = Family::<EndpointLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            duration_histogram,
        );
        registry.register_with_unit(
            "admission_duration",
            "Time to decide an admission review, from request received to response ready",
            Unit::Seconds,
            duration.clone(),
        );
        let in_flight = Family::<EndpointLabels, Gauge>::default();
        registry.register(
            "admission_in_flight",
            "Admission reviews being decided right now",
            in_flight.clone(),
        );
        let cert_reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "certificate_reloads",
            "Serving certificate changes seen on disk, by result (error: the old certificate is \
             still served)",
            cert_reloads.clone(),
        );
        // Both series exist from the start, so `increase(...[5m])` and alerts on errors work
        // before the first reload.
        for result in ["success", "error"] {
            let _ = cert_reloads.get_or_create(&ReloadLabels { result });
        }
        let cert_not_before = Gauge::default();
        registry.register_with_unit(
            "serving_certificate_not_before_timestamp",
            "Start of the validity of the serving certificate in use (Unix time)",
            Unit::Seconds,
            cert_not_before.clone(),
        );
        let cert_not_after = Gauge::default();
        registry.register_with_unit(
            "serving_certificate_not_after_timestamp",
            "Expiry of the serving certificate in use (Unix time): alert well before it, \
             kube-apiserver refuses an expired certificate",
            Unit::Seconds,
            cert_not_after.clone(),
        );
        let cache_synced = Family::<ResourceLabels, Gauge>::default();
        registry.register(
            "cache_synced",
            "1 when the watch cache of this resource has synced, 0 otherwise",
            cache_synced.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "ready",
            "1 when this replica answers /readyz with 200 (certificate loaded, caches synced, first \
             etcd sweep done, not shutting down), 0 otherwise",
            ready.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            ready,
            requests,
            duration,
            in_flight,
            cert_reloads,
            cert_not_before,
            cert_not_after,
            cache_synced,
        }
    }

    /// Records one answered review: counts it and observes its duration in seconds.
    pub fn observe_review(
        &self,
        endpoint: &str,
        operation: &str,
        allowed: bool,
        reason: &str,
        seconds: f64,
    ) {
        self.requests
            .get_or_create(&ReviewLabels {
                endpoint: endpoint.to_owned(),
                operation: operation.to_owned(),
                allowed,
                reason: reason.to_owned(),
            })
            .inc();
        self.duration
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.to_owned(),
            })
            .observe(seconds);
    }

    /// Counts a review as in flight until the returned guard is dropped, so early returns and
    /// panics (unwinding) cannot leave the gauge too high.
    pub fn in_flight(&self, endpoint: &str) -> InFlightGuard {
        let gauge = self
            .in_flight
            .get_or_create(&EndpointLabels {
                endpoint: endpoint.to_owned(),
            })
            .clone();
        gauge.inc();
        InFlightGuard { gauge }
    }

    /// Counts one certificate reload attempt (`ok`: the new certificate is served).
    pub fn cert_reload(&self, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.cert_reloads
            .get_or_create(&ReloadLabels { result })
            .inc();
    }

    /// Records the validity of the serving certificate now in use (Unix seconds).
    pub fn set_cert_validity(&self, not_before: i64, not_after: i64) {
        self.cert_not_before.set(not_before);
        self.cert_not_after.set(not_after);
    }

    /// Sets whether the watch cache of `resource` (e.g. `machines`) has synced.
    pub fn set_cache_synced(&self, resource: &str, synced: bool) {
        self.cache_synced
            .get_or_create(&ResourceLabels {
                resource: resource.to_owned(),
            })
            .set(i64::from(synced));
    }

    /// Registers more metric families while the `Metrics` is still owned (before it is shared).
    pub fn registry_mut(&mut self) -> &mut Registry {
        self.registry
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers more metric families once the `Metrics` is shared: `f` gets the registry under
    /// its lock (keep it short; `/metrics` waits for it).
    pub fn with_registry<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        let mut registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut registry)
    }

    /// The whole registry in the Prometheus text format ([`METRICS_CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let mut text = String::new();
        // Writing to a String cannot fail; a metric whose encoder fails still leaves the rest.
        if let Err(error) = prometheus_text::encode(&mut text, &registry) {
            tracing::error!(%error, "encoding metrics failed");
        }
        text
    }
}

/// Keeps one review counted in `admission_in_flight` until dropped.
#[must_use = "the review stops being counted as in flight when the guard is dropped"]
#[derive(Debug)]
pub struct InFlightGuard {
    gauge: Gauge,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Whether this replica should receive admission reviews. kube-apiserver reaches the webhook
/// through a Service, so an unready replica is simply skipped: say "not ready" until the
/// certificate is loaded, the caches are synced (a review answered from empty caches would be
/// guessed) and the first etcd sweep has probed every workload cluster known then (a review
/// answered before would know no member's health: during a rollout of the guard itself the old
/// replica keeps answering until the new one has looked), and from the moment shutdown starts
/// (so the endpoint is removed before the listener closes). Each flag is an atomic: set them
/// from any task, no lock.
#[derive(Debug, Default)]
pub struct Readiness {
    cert_loaded: AtomicBool,
    caches_synced: AtomicBool,
    swept: AtomicBool,
    accepting: AtomicBool,
    shutting_down: AtomicBool,
}

impl Readiness {
    /// All flags false: not ready until the server says otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    /// The serving certificate has been loaded (a later failed reload keeps the old one served,
    /// so it does not clear this).
    pub fn set_cert_loaded(&self, loaded: bool) {
        self.cert_loaded.store(loaded, Ordering::SeqCst);
    }

    /// Every watch cache the decisions read from has synced.
    pub fn set_caches_synced(&self, synced: bool) {
        self.caches_synced.store(synced, Ordering::SeqCst);
    }

    /// The first etcd sweep after the caches synced is done (or readiness stopped waiting for
    /// it, or etcd is not probed at all).
    pub fn set_swept(&self, swept: bool) {
        self.swept.store(swept, Ordering::SeqCst);
    }

    /// The HTTPS listener is bound and serving.
    pub fn set_accepting(&self, accepting: bool) {
        self.accepting.store(accepting, Ordering::SeqCst);
    }

    /// Graceful shutdown has begun: stop getting new reviews while in-flight ones finish.
    pub fn set_shutting_down(&self, shutting_down: bool) {
        self.shutting_down.store(shutting_down, Ordering::SeqCst);
    }

    /// Ready: certificate loaded, caches synced, first sweep done, accepting, and not shutting
    /// down.
    pub fn is_ready(&self) -> bool {
        self.not_ready_reasons().is_empty()
    }

    /// Why the replica is not ready, one short phrase per unmet condition (empty when ready);
    /// `/readyz` lists them so `kubectl describe pod` shows the cause.
    pub fn not_ready_reasons(&self) -> Vec<&'static str> {
        let mut reasons = Vec::new();
        if !self.cert_loaded.load(Ordering::SeqCst) {
            reasons.push("serving certificate not loaded");
        }
        if !self.caches_synced.load(Ordering::SeqCst) {
            reasons.push("watch caches not synced");
        }
        if !self.swept.load(Ordering::SeqCst) {
            reasons.push("first etcd sweep not finished: workload clusters known at start not all probed yet");
        }
        if !self.accepting.load(Ordering::SeqCst) {
            reasons.push("not accepting admission requests");
        }
        if self.shutting_down.load(Ordering::SeqCst) {
            reasons.push("shutting down");
        }
        reasons
    }
}

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

    #[test]
    fn more_families_can_be_registered_before_and_after_sharing() {
        let mut metrics = Metrics::new();
        let probes = Family::<ResourceLabels, Counter>::default();
        metrics
            .registry_mut()
            .register("etcd_probes", "Probes sent", probes.clone());
        let metrics = Arc::new(metrics);
        let sweep = Gauge::<i64>::default();
        metrics.with_registry(|r| {
            r.register_with_unit("last_sweep", "Last sweep", Unit::Seconds, sweep.clone())
        });
        probes
            .get_or_create(&ResourceLabels {
                resource: "member-1".to_owned(),
            })
            .inc();
        sweep.set(7);
        let text = metrics.encode();
        assert!(
            text.contains("# TYPE quorumguard_etcd_probes_total counter"),
            "{text}"
        );
        assert!(
            text.contains("quorumguard_etcd_probes_total{resource=\"member-1\"} 1"),
            "{text}"
        );
        assert!(text.contains("quorumguard_last_sweep_seconds 7"), "{text}");
    }

    #[test]
    fn an_invalid_log_filter_is_reported() {
        let err = init_logging(LogFormat::Json, "info,=[[").unwrap_err();
        assert!(matches!(err, TelemetryError::InvalidFilter { .. }), "{err}");
    }
}
