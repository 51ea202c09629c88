//! Logs, metrics, readiness and the admin endpoints (`/livez`, `/readyz`, `/metrics`).
//!
//! They live in one place so every entry point reports the same way, and so `main` only wires
//! them: the admin router is plain HTTP on its own port, because kubelet probes and Prometheus
//! scrapes must keep working when the webhook's TLS certificate is the thing that is broken.
//!
//! The parts: `logging` (the log subscriber, [`init_logging`]), `metrics` (the Prometheus
//! registry and the webhook's series, [`Metrics`]), `readiness` ([`Readiness`]) and `admin` (the
//! admin endpoints over them, [`admin_router`]).
//!
//! It may depend on no other quorumguard crate (tests/it/architecture.rs): the series it registers
//! are named here, and the crates that record them depend on it.

mod admin;
mod logging;
mod metrics;
mod readiness;

pub use admin::admin_router;
pub use logging::{LogFormat, LogGuard, TelemetryError, init_logging, init_logging_to};
pub use metrics::{DURATION_BUCKETS, InFlightGuard, METRIC_PREFIX, METRICS_CONTENT_TYPE, Metrics};
pub use readiness::Readiness;
