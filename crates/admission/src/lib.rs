//! The validating admission webhook: HTTP in, the engine's verdict out.
//!
//! A review is first decided by the engine from the caches and the record of the latest etcd
//! probes. Denials, unconditional allows and allows that do not rest on etcd (external etcd, no
//! replica change) are answered from that at once, in microseconds. An allow that rests on
//! etcd, the engine answers [`Answer::ConfirmOnFreshProbe`]: the webhook asks again on a fresh
//! probe of the cluster's etcd, taken after the request arrived
//! ([`quorumguard_observe::etcd::fresh`]), so that an allow that depends on etcd health rests
//! on answers etcd gave after the request arrived. The engine says which answers need a probe;
//! the webhook only takes it. That wait is bounded by `--fresh-probe-timeout`, well inside the
//! webhook's `timeoutSeconds`; a probe that fails or runs out of time leaves the decision to the
//! unknown-health policy, never to the cached record. Nothing waits on the API server. Events are handed to a bounded queue and
//! published in the background.
//!
//! This crate is the webhook and nothing else: decode, decide (through the engine), answer
//! ([`Outcome`], its reason one [`ReviewReason`]), reserve, record Events. It may depend on `quorumguard-engine`, `quorumguard-observe` (the
//! caches, the record of probes, fresh probes) and `quorumguard-telemetry`; only the command
//! line (`quorumguard-cli`) depends on it (tests/it/architecture.rs).

pub mod events;
pub mod outcome;
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

use events::{EventSink, Notice};
pub use outcome::{Outcome, ReviewReason};
use quorumguard_engine::{
    Answer, ControlPlane, EtcdBasis, EtcdSnapshot, EtcdState, Judgement, Machine, Member,
    Operation, Policy, Reason, Requester, admit, admit_deletion, failed_view, fresh_view,
};
use quorumguard_observe::etcd::fresh::{Fresh, FreshProbes};
use quorumguard_observe::state::{ClusterState, Lookup, ProbeTarget};
use quorumguard_telemetry::Metrics;
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
    /// Fresh etcd probes before allows that rest on etcd (`None`: etcd is not probed, as in
    /// tests that set the record themselves; the record is all there is).
    fresh: Option<Arc<FreshProbes>>,
}

/// Which pass of a review [`Webhook::decide`] makes.
enum Pass {
    /// On the caches and the record, and final: no fresh probe follows (no prober, or the
    /// caller is synchronous).
    Only,
    /// On the caches and the record, for a review that arrived at this instant: an answer the
    /// engine gives only on a fresh probe ([`Answer::ConfirmOnFreshProbe`]) asks for one.
    First(Instant),
    /// On a fresh probe: etcd as the decision counts it.
    Fresh(EtcdState),
}

/// What [`Webhook::decide`] concluded.
struct Step {
    /// The answer; only provisional when `probe` is set (nothing reserved or published).
    outcome: Outcome,
    /// Under [`Pass::First`], the engine's [`Answer::ConfirmOnFreshProbe`]: probe this cluster
    /// afresh, judge the probe against this record, and decide again.
    probe: Option<(ProbeTarget, Vec<Member>)>,
}

impl From<Outcome> for Step {
    fn from(outcome: Outcome) -> Self {
        Step {
            outcome,
            probe: None,
        }
    }
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
            fresh: None,
        }
    }

    /// This webhook, deciding every allow that rests on etcd on a fresh probe from `fresh`.
    pub fn with_fresh_probes(mut self, fresh: Arc<FreshProbes>) -> Self {
        self.fresh = Some(fresh);
        self
    }

    /// The fresh probes this webhook takes, if any.
    pub fn fresh_probes(&self) -> Option<&Arc<FreshProbes>> {
        self.fresh.as_ref()
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

    /// Decides a decoded review on the caches and the record of the latest probes alone:
    /// synchronous and quick, it never waits. What `serve` answers is [`Webhook::review`], which
    /// takes a fresh probe where an allow rests on etcd.
    pub fn judge(&self, d: &Decoded) -> Outcome {
        self.decide(d, Pass::Only).outcome
    }

    /// Decides a decoded review that arrived at `arrived`: on the caches and the record; then,
    /// when that would allow an operation whose safety rests on etcd, again on a fresh probe of
    /// the cluster's etcd taken after `arrived` (or, if none can be had within
    /// `--fresh-probe-timeout`, as for unknown health).
    pub async fn review(&self, d: &Decoded, arrived: Instant) -> Outcome {
        let Some(fresh) = &self.fresh else {
            return self.judge(d);
        };
        let first = self.decide(d, Pass::First(arrived));
        let Some((target, record)) = first.probe else {
            return first.outcome;
        };
        let etcd = match fresh.probe(target, arrived).await {
            Fresh::Members(probe) => EtcdState::Observed(EtcdSnapshot {
                members: fresh_view(probe, &record),
                age: Some(Duration::ZERO),
            }),
            Fresh::Failed(e) => {
                tracing::info!(uid = %d.uid, error = %e, "fresh etcd probe failed: deciding as for unknown health");
                unknown_now(&record, format!("the fresh etcd probe failed: {e}"))
            }
            Fresh::TimedOut(t) => {
                tracing::info!(uid = %d.uid, timeout_ms = t.as_millis() as u64, "no fresh etcd probe in time: deciding as for unknown health");
                unknown_now(
                    &record,
                    format!(
                        "no fresh etcd probe answered within --fresh-probe-timeout {}",
                        humantime::format_duration(t)
                    ),
                )
            }
        };
        self.decide(d, Pass::Fresh(etcd)).outcome
    }

    /// One decision of review `d`: the engine answers; the webhook reserves, publishes and
    /// probes as that answer says. Under [`Pass::First`], an answer the engine gives only on a
    /// fresh probe is not final: nothing is reserved or published, and [`Step::probe`] asks
    /// for the probe; a denial the engine wants etcd probed after has the cluster probed in
    /// the background, so that the next review sees a recovery.
    fn decide(&self, d: &Decoded, pass: Pass) -> Step {
        let (kcp_name, question) = match Question::of(d) {
            Ok(q) => q,
            Err(outcome) => return outcome.into(),
        };
        let now = Instant::now();
        let key = (d.namespace.clone(), kcp_name);
        // A review that may reserve (a Machine deletion or a replica change, not a dry run)
        // decides under the lock, so that the next review sees its reservation; the others
        // decide after releasing it: under concurrent load, a lock held through every decision
        // made the server threads wait on each other.
        let mut reservations = self.reservations.lock().unwrap_or_else(|e| e.into_inner());
        let mut cp = match self.state.control_plane_of(&key, now) {
            Ok(cp) => cp,
            Err(Lookup::NoSuchKcp) => return Outcome::unguarded(d).into(),
            Err(Lookup::NotSynced) => {
                return Outcome::not_synced(d, &self.policy, &self.state).into();
            }
        };
        if let Subject::KcpUpdate {
            object: Some(k), ..
        } = &d.subject
        {
            // The request's KCP is fresher than the cache (deletionTimestamp, topology).
            cp.kcp = k.kcp.clone();
        }
        let (etcd, arrived) = match pass {
            Pass::Only => (EtcdBasis::Record, None),
            Pass::First(arrived) => (EtcdBasis::Record, Some(arrived)),
            Pass::Fresh(etcd) => {
                cp.etcd = etcd;
                (EtcdBasis::FreshProbe, None)
            }
        };
        reservations.apply(&key, &mut cp, now, &self.state);
        let mut reservations = (!d.dry_run && question.reserves()).then_some(reservations);
        let answer = question.admit(&cp, &d.requester, &self.policy, etcd);
        let probe_target = || self.state.probe_target(&key.0, &key.1);
        let (verdict, refresh) = match answer {
            Answer::ConfirmOnFreshProbe(j) if arrived.is_some() => match probe_target() {
                Some(target) => {
                    return Step {
                        outcome: Outcome::judged(j),
                        probe: Some((target, record_of(cp.etcd))),
                    };
                }
                None => (j, false),
            },
            Answer::DeniedRefreshInBackground(j) => (j, true),
            answer => (answer.into_judgement(), false),
        };
        if let Some(reservations) = reservations.as_mut().filter(|_| verdict.allowed) {
            question.reserve(reservations, &key, &verdict, now, &self.state);
        }
        drop(reservations);
        if refresh
            && let (Some(fresh), Some(arrived)) = (&self.fresh, arrived)
            && let Some(target) = probe_target()
        {
            fresh.refresh(target, arrived);
        }
        if !d.dry_run && (!verdict.allowed || verdict.reason == Reason::BreakGlass) {
            self.notify(d, &verdict);
        }
        Outcome::judged(verdict).into()
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
            audit: false,
        });
    }
}

/// What a review asks of the engine. A deletion borrows the decoded Machine: an
/// [`Operation`] would own a clone of it, annotations and all, on every review.
enum Question<'a> {
    Delete(&'a Machine),
    Update(Operation),
}

impl<'a> Question<'a> {
    /// The KCP review `d` is about and what it asks of the engine, or the answer when there
    /// is nothing to ask (a kind not judged, a Machine of no control plane).
    fn of(d: &'a Decoded) -> Result<(String, Question<'a>), Outcome> {
        match &d.subject {
            Subject::Unhandled(what) => Err(Outcome::not_handled(what)),
            Subject::MachineDelete { machine, .. } => match &machine.control_plane_name {
                Some(kcp) => Ok((kcp.clone(), Question::Delete(&machine.machine))),
                None => Err(Outcome::unguarded(d)),
            },
            Subject::KcpUpdate {
                kcp,
                from,
                to,
                starts_rollout,
                ..
            } => Ok((
                kcp.clone(),
                Question::Update(Operation::UpdateKcp {
                    replicas_from: *from,
                    replicas_to: *to,
                    starts_rollout: *starts_rollout,
                }),
            )),
        }
    }

    /// Whether an allow of it may be reserved: a Machine deletion or a replica change.
    fn reserves(&self) -> bool {
        match self {
            Question::Delete(_) => true,
            Question::Update(Operation::UpdateKcp {
                replicas_from,
                replicas_to,
                ..
            }) => replicas_to != replicas_from,
            Question::Update(_) => false,
        }
    }

    /// The engine's answer on `cp`, whose etcd comes from `etcd`.
    fn admit(
        &self,
        cp: &ControlPlane,
        requester: &Requester,
        policy: &Policy,
        etcd: EtcdBasis,
    ) -> Answer {
        let now_unix = quorumguard_observe::unix_now();
        match self {
            Question::Delete(m) => admit_deletion(cp, m, requester, policy, now_unix, etcd),
            Question::Update(op) => admit(cp, op, requester, policy, now_unix, etcd),
        }
    }

    /// Reserves what `verdict` allowed, so that the reviews after it count it.
    fn reserve(
        &self,
        reservations: &mut Reservations,
        key: &(String, String),
        verdict: &Judgement,
        now: Instant,
        state: &ClusterState,
    ) {
        match self {
            Question::Delete(m)
                if !verdict.reason.is_unconditional() || verdict.reason == Reason::BreakGlass =>
            {
                reservations.reserve(key.clone(), (*m).clone(), now, state);
            }
            // A scale-up is reserved too: deletions judged next must count its new member. A
            // change to fewer replicas, however it was allowed, ends such a reservation once
            // the cache shows it.
            Question::Update(Operation::UpdateKcp {
                replicas_from,
                replicas_to,
                ..
            }) if replicas_to < replicas_from || !verdict.reason.is_unconditional() => {
                reservations.reserve_replicas(key.clone(), *replicas_from, *replicas_to, now);
            }
            _ => {}
        }
    }
}

/// The record's member list, which a fresh probe is judged against (none without a record).
fn record_of(etcd: EtcdState) -> Vec<Member> {
    match etcd {
        EtcdState::Observed(s) => s.members,
        EtcdState::Unknown { .. } => Vec::new(),
    }
}

/// etcd as a decision must count it when no fresh probe could be had (`why`): the record's
/// member list with only its bad news ([`failed_view`]), every other member's health unknown
/// for that reason; without a record, no member list at all. Never the record's health as it
/// was: that would be an allow on an old record.
fn unknown_now(record: &[Member], why: String) -> EtcdState {
    if record.is_empty() {
        return EtcdState::Unknown { reason: why };
    }
    let members = failed_view(record)
        .into_iter()
        .map(|mut m| {
            if m.health == quorumguard_engine::Health::Unknown {
                m.health = quorumguard_engine::Health::Unconfirmed(why.clone());
            }
            m
        })
        .collect();
    EtcdState::Observed(EtcdSnapshot {
        members,
        age: Some(Duration::ZERO),
    })
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

/// A request that is no AdmissionReview the webhook can read, in the metrics.
fn count_bad_request(w: &Webhook, endpoint: Endpoint) {
    let reason = ReviewReason::BadRequest.as_str();
    w.metrics
        .observe_review(endpoint.as_str(), "", true, reason, 0.0);
}

async fn handle(w: Arc<Webhook>, endpoint: Endpoint, req: Request) -> Response {
    let started = Instant::now();
    let _in_flight = w.metrics.in_flight(endpoint.as_str());
    let (parts, body) = req.into_parts();
    if !is_json(&parts.headers) {
        count_bad_request(&w, endpoint);
        return bad_request(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "quorumguard: Content-Type must be application/json (an admission.k8s.io/v1 AdmissionReview)".into(),
        );
    }
    let bytes = match axum::body::to_bytes(Body::new(body), MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            count_bad_request(&w, endpoint);
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
            count_bad_request(&w, endpoint);
            return bad_request(StatusCode::BAD_REQUEST, format!("quorumguard: {e}"));
        }
    };
    let outcome = w.review(&decoded, started).await;
    let body = outcome.response(&decoded.uid).to_vec();
    let seconds = started.elapsed().as_secs_f64();
    w.metrics.observe_review(
        endpoint.as_str(),
        decoded.operation,
        outcome.allowed,
        outcome.reason.as_str(),
        seconds,
    );
    // Strings recorded as `&str`, not with `%` (Display): the JSON line is the same, byte for
    // byte, without a `format!` (an allocation and the formatting machinery) per field.
    tracing::info!(
        uid = decoded.uid.as_str(),
        kind = decoded.kind.as_str(),
        namespace = decoded.namespace.as_str(),
        name = decoded.name.as_str(),
        operation = decoded.operation,
        user = decoded.requester.username.as_str(),
        dry_run = decoded.dry_run,
        allowed = outcome.allowed,
        reason = outcome.reason.as_str(),
        duration_ms = seconds * 1000.0,
        "admission review"
    );
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(body),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_record_a_failed_fresh_probe_leaves_no_member_list() {
        // Not an empty member list: the engine would read it as "the Machine has no member"
        // (MemberAbsent), an allow without proof.
        match unknown_now(&[], "the fresh etcd probe failed: refused".into()) {
            EtcdState::Unknown { reason } => assert!(reason.contains("refused")),
            other => panic!("{other:?}"),
        }
        let mut up = Member::new(1, "a");
        up.health = quorumguard_engine::Health::Healthy;
        let mut down = Member::new(2, "b");
        down.health = quorumguard_engine::Health::Unhealthy("no answer within 1s".into());
        match unknown_now(&[up, down], "no fresh etcd probe answered".into()) {
            EtcdState::Observed(s) => {
                assert_eq!(
                    s.members[0].health,
                    quorumguard_engine::Health::Unconfirmed("no fresh etcd probe answered".into())
                );
                assert!(matches!(
                    s.members[1].health,
                    quorumguard_engine::Health::Unhealthy(_)
                ));
            }
            other => panic!("{other:?}"),
        }
    }
}
