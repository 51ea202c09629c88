//! The process's Prometheus metrics ([`Metrics`]): the prefixed registry, the webhook's series,
//! and the Prometheus text they are exported in.

use std::sync::{Mutex, PoisonError};

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    endpoint: &'static str,
    operation: &'static str,
    allowed: bool,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: &'static str,
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
/// - `cache_synced{resource}` gauge, 1 once that resource's watch cache has synced, else 0;
/// - `client_certificate_refusals_total` counter — handshakes refused for their client
///   certificate (with `--client-ca-file`).
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
    client_cert_refusals: Counter,
    pub(super) ready: Gauge,
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
        let client_cert_refusals = Counter::default();
        registry.register(
            "client_certificate_refusals",
            "TLS handshakes on the webhook port refused for their client certificate (none, \
             another CA, expired, a name not allowed); only with --client-ca-file",
            client_cert_refusals.clone(),
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
            client_cert_refusals,
        }
    }

    /// Records one answered review: counts it and observes its duration in seconds.
    ///
    /// The labels are static strings (the endpoints, operations and reason codes are a closed
    /// set): looking a series up allocates nothing.
    pub fn observe_review(
        &self,
        endpoint: &'static str,
        operation: &'static str,
        allowed: bool,
        reason: &'static str,
        seconds: f64,
    ) {
        self.requests
            .get_or_create(&ReviewLabels {
                endpoint,
                operation,
                allowed,
                reason,
            })
            .inc();
        self.duration
            .get_or_create(&EndpointLabels { endpoint })
            .observe(seconds);
    }

    /// Counts a review as in flight until the returned guard is dropped, so early returns and
    /// panics (unwinding) cannot leave the gauge too high.
    pub fn in_flight(&self, endpoint: &'static str) -> InFlightGuard {
        let gauge = self
            .in_flight
            .get_or_create(&EndpointLabels { endpoint })
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

    /// Counts one handshake refused for its client certificate.
    pub fn client_certificate_refused(&self) {
        self.client_cert_refusals.inc();
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
}
