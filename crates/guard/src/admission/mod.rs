//! The validating admission webhook: HTTP in, the engine's verdict out.
//!
//! A review is decided from the caches and the latest etcd snapshot only: nothing in the request
//! path waits on etcd or the API server, so every answer comes back in microseconds and the
//! webhook's timeout never adds to an operator's outage. Events are handed to a bounded queue and
//! published in the background.

pub mod events;
pub mod reservations;
pub mod review;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use crate::engine::{
    ANNOTATION_BREAK_GLASS, Judgement, Machine, OnUnknownHealth, Operation, Policy, Reason, admit,
    admit_deletion,
};
use crate::state::{ClusterState, Lookup};
use crate::telemetry::Metrics;
use events::{EventSink, Notice};
use reservations::Reservations;
use review::{Decoded, Endpoint, Subject};

/// kube-apiserver's own limit for a webhook request body is 3 MiB of object plus the review;
/// controller-runtime accepts 7 MiB. Larger bodies are refused before parsing.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// What the webhook shares between requests.
pub struct Webhook {
    pub state: Arc<ClusterState>,
    pub policy: Policy,
    pub metrics: Arc<Metrics>,
    pub events: Option<EventSink>,
    reservations: Mutex<Reservations>,
}

/// The outcome of one review, for the log line, the metrics and the response.
pub struct Outcome {
    pub allowed: bool,
    /// The reason code (a [`Reason`] or one of the webhook's own: `NotHandled`, ...).
    pub reason: &'static str,
    /// The engine's answer ([`admit`]: a denial's message ends with the next safe action).
    pub verdict: Option<Judgement>,
}

impl Webhook {
    pub fn new(
        state: Arc<ClusterState>,
        policy: Policy,
        metrics: Arc<Metrics>,
        events: Option<EventSink>,
        reservation_ttl: Duration,
    ) -> Self {
        Webhook {
            state,
            policy,
            metrics,
            events,
            reservations: Mutex::new(Reservations::new(reservation_ttl)),
        }
    }

    /// The axum router with both review endpoints.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/validate/machines", post(machines))
            .route("/validate/kubeadmcontrolplanes", post(kcps))
            .with_state(self)
    }

    /// How many deletions and scale-ups are reserved right now.
    pub fn reservations(&self) -> usize {
        self.reservations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Decides a decoded review. Synchronous and quick: it reads the caches, never waits.
    pub fn judge(&self, d: &Decoded) -> Outcome {
        let now = Instant::now();
        let now_unix = crate::unix_now();
        let (kcp_name, ask) = match &d.subject {
            Subject::Unhandled(_) => {
                return Outcome {
                    allowed: true,
                    reason: "NotHandled",
                    verdict: None,
                };
            }
            Subject::MachineDelete { machine, .. } => {
                let Some(kcp) = machine.control_plane_name.clone() else {
                    return unguarded();
                };
                (kcp, Ask::Delete(&machine.machine))
            }
            Subject::KcpUpdate {
                kcp,
                from,
                to,
                starts_rollout,
                ..
            } => (
                kcp.clone(),
                Ask::Update(Operation::UpdateKcp {
                    replicas_from: *from,
                    replicas_to: *to,
                    starts_rollout: *starts_rollout,
                }),
            ),
        };
        let key = (d.namespace.clone(), kcp_name);
        // One decision at a time: a reservation must be visible to the next review. The lock
        // covers reading the caches and the reservations; only a review that may reserve (a
        // Machine deletion, not a dry run) also decides under it, so that the next review sees
        // its reservation. The others decide after releasing it: under concurrent load, a lock
        // held through every decision made the server threads wait on each other.
        let mut reservations = self.reservations.lock().unwrap_or_else(|e| e.into_inner());
        let mut cp = match self.state.control_plane(&key.0, &key.1, now) {
            Ok(cp) => cp,
            Err(Lookup::NoSuchKcp) => return unguarded(),
            Err(Lookup::NotSynced) => return self.not_synced(d),
        };
        if let Subject::KcpUpdate {
            object: Some(k), ..
        } = &d.subject
        {
            // The request's KCP is fresher than the cache (deletionTimestamp, topology).
            cp.kcp = k.kcp.clone();
        }
        reservations.apply(&key, &mut cp, now, &self.state);
        let verdict = match ask {
            Ask::Delete(m) if !d.dry_run => {
                let verdict = admit_deletion(&cp, m, &d.requester, &self.policy, now_unix);
                let reserves =
                    !verdict.reason.is_unconditional() || verdict.reason == Reason::BreakGlass;
                if verdict.allowed && reserves {
                    reservations.reserve(key, m.clone(), now, &self.state);
                }
                drop(reservations);
                verdict
            }
            Ask::Delete(m) => {
                drop(reservations);
                admit_deletion(&cp, m, &d.requester, &self.policy, now_unix)
            }
            // A scale-up is reserved too (deletions judged next must count its new member), so
            // it is decided under the lock like a deletion.
            Ask::Update(
                op @ Operation::UpdateKcp {
                    replicas_from,
                    replicas_to,
                    ..
                },
            ) if !d.dry_run && replicas_to > replicas_from => {
                let verdict = admit(&cp, &op, &d.requester, &self.policy, now_unix);
                if verdict.allowed && !verdict.reason.is_unconditional() {
                    reservations.reserve_replicas(key, replicas_to, now);
                }
                drop(reservations);
                verdict
            }
            Ask::Update(op) => {
                drop(reservations);
                admit(&cp, &op, &d.requester, &self.policy, now_unix)
            }
        };
        if !d.dry_run && (!verdict.allowed || verdict.reason == Reason::BreakGlass) {
            self.notify(d, &verdict);
        }
        Outcome {
            allowed: verdict.allowed,
            reason: verdict.reason.as_str(),
            verdict: Some(verdict),
        }
    }

    /// The caches are not synced: nothing can be proven. Same policy as unknown health.
    fn not_synced(&self, d: &Decoded) -> Outcome {
        Outcome {
            allowed: self.policy.on_unknown_health(&d.requester) == OnUnknownHealth::Allow,
            reason: Reason::HealthUnknown.as_str(),
            verdict: None,
        }
    }

    fn notify(&self, d: &Decoded, v: &Judgement) {
        let Some(sink) = &self.events else { return };
        let (kind, api_version, uid) = match &d.subject {
            Subject::MachineDelete { uid, .. } => ("Machine", "cluster.x-k8s.io/v1beta2", uid),
            Subject::KcpUpdate { uid, .. } => (
                "KubeadmControlPlane",
                "controlplane.cluster.x-k8s.io/v1beta2",
                uid,
            ),
            Subject::Unhandled(_) => return,
        };
        // The requester comes first: a note is cut at 1 kB, and a break-glass reason (the
        // annotation's value, in the message) may be long. Unless kube-apiserver's client
        // certificate is verified, anyone could have sent the review: the note says the user is
        // the one the review names, not one kube-apiserver vouched for.
        let user = &d.requester.username;
        let by = if sink.sender_verified() {
            format!("by {user}")
        } else {
            format!("(review names user {user}; its sender is not authenticated)")
        };
        let note = if v.reason == Reason::BreakGlass {
            format!(
                "allowed {} {by}: {}; {}",
                d.operation,
                v.message,
                v.warnings.join("; ")
            )
        } else {
            format!("denied {} {by}: {}", d.operation, v.message)
        };
        sink.send(Notice {
            kind: kind.into(),
            api_version: api_version.into(),
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            uid: uid.clone(),
            warning: true,
            reason: v.reason.as_str().into(),
            action: if d.operation == "DELETE" {
                "Delete".into()
            } else {
                "Update".into()
            },
            note,
            requester: user.clone(),
        });
    }
}

/// What a review asks of the engine. A deletion borrows the decoded Machine: an
/// [`Operation`] would own a clone of it, annotations and all, on every review.
enum Ask<'a> {
    Delete(&'a Machine),
    Update(Operation),
}

/// No KCP guards this object: allowed, said in a warning.
fn unguarded() -> Outcome {
    Outcome {
        allowed: true,
        reason: "NoControlPlane",
        verdict: None,
    }
}

/// The messages for outcomes without an engine verdict.
fn plain_message(d: &Decoded, o: &Outcome, state: &ClusterState) -> String {
    match (&d.subject, o.reason) {
        (Subject::Unhandled(what), _) => {
            format!("quorumguard does not judge {what}; allowed")
        }
        (_, "NoControlPlane") => format!(
            "{} {}/{} belongs to no KubeadmControlPlane quorumguard knows; not guarded",
            d.kind, d.namespace, d.name
        ),
        _ => format!(
            "quorumguard's caches have not synced yet ({}): it cannot prove that {} of {}/{} is safe. Retry in a few seconds; in an emergency set the annotation {ANNOTATION_BREAK_GLASS}=<reason> on the Machine, or delete the ValidatingWebhookConfiguration quorumguard.",
            crate::state::Kind::ALL
                .iter()
                .filter(|k| !state.is_synced(**k))
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            d.operation,
            d.namespace,
            d.name
        ),
    }
}

async fn machines(State(w): State<Arc<Webhook>>, req: Request) -> Response {
    handle(w, Endpoint::Machines, req).await
}

async fn kcps(State(w): State<Arc<Webhook>>, req: Request) -> Response {
    handle(w, Endpoint::KubeadmControlPlanes, req).await
}

fn bad_request(code: StatusCode, message: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message + "\n",
    )
        .into_response()
}

fn is_json(headers: &HeaderMap) -> bool {
    match headers.get(header::CONTENT_TYPE) {
        None => true,
        Some(v) => v
            .to_str()
            .map(|s| {
                let mime = s.split(';').next().unwrap_or("").trim();
                mime.eq_ignore_ascii_case("application/json")
            })
            .unwrap_or(false),
    }
}

async fn handle(w: Arc<Webhook>, endpoint: Endpoint, req: Request) -> Response {
    let started = Instant::now();
    let _in_flight = w.metrics.in_flight(endpoint.as_str());
    let (parts, body) = req.into_parts();
    if !is_json(&parts.headers) {
        w.metrics
            .observe_review(endpoint.as_str(), "", true, "BadRequest", 0.0);
        return bad_request(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "quorumguard: Content-Type must be application/json (an admission.k8s.io/v1 AdmissionReview)".into(),
        );
    }
    let bytes = match axum::body::to_bytes(Body::new(body), MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            w.metrics
                .observe_review(endpoint.as_str(), "", true, "BadRequest", 0.0);
            return bad_request(
                StatusCode::BAD_REQUEST,
                format!(
                    "quorumguard: cannot read the request body (at most {} MiB): {e}",
                    MAX_BODY_BYTES / 1024 / 1024
                ),
            );
        }
    };
    let decoded = match review::decode(endpoint, &bytes) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(endpoint = endpoint.as_str(), error = %e, "malformed admission review");
            w.metrics
                .observe_review(endpoint.as_str(), "", true, "BadRequest", 0.0);
            return bad_request(StatusCode::BAD_REQUEST, format!("quorumguard: {e}"));
        }
    };
    let outcome = w.judge(&decoded);
    let body = match &outcome.verdict {
        Some(v) => review::respond(
            &decoded.uid,
            v.allowed,
            v.reason.as_str(),
            &v.message,
            &v.warnings,
        )
        .to_vec(),
        None => {
            let message = plain_message(&decoded, &outcome, &w.state);
            let warnings = if outcome.allowed {
                vec![message.clone()]
            } else {
                Vec::new()
            };
            review::respond(
                &decoded.uid,
                outcome.allowed,
                outcome.reason,
                &message,
                &warnings,
            )
            .to_vec()
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    w.metrics.observe_review(
        endpoint.as_str(),
        decoded.operation,
        outcome.allowed,
        outcome.reason,
        seconds,
    );
    tracing::info!(
        uid = %decoded.uid,
        kind = %decoded.kind,
        namespace = %decoded.namespace,
        name = %decoded.name,
        operation = decoded.operation,
        user = %decoded.requester.username,
        dry_run = decoded.dry_run,
        allowed = outcome.allowed,
        reason = %outcome.reason,
        duration_ms = seconds * 1000.0,
        "admission review"
    );
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(body),
    )
        .into_response()
}
