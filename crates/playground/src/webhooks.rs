//! kube-apiserver's validating-webhook dispatch for the API-server stand-in: a
//! ValidatingWebhookConfiguration (the repo's own, [`MANIFEST`]) decides which writes are sent,
//! as AdmissionReview requests over real HTTPS, to the in-process `quorumguard serve`; its
//! answers become the stand-in's verdicts, worded as kube-apiserver words them. With
//! [`WebhookDispatcher::install`]ed, `kubectl delete machine X` against the stand-in reaches the
//! webhook and kubectl prints its denial (or its warning) exactly as with a real cluster.
//!
//! What it does, following kube-apiserver 1.32 (`k8s.io/apiserver/pkg/admission/plugin/webhook`):
//! - The configuration is parsed into k8s-openapi's `ValidatingWebhookConfiguration` and
//!   checked the way the API validates one where it matters here (see [`WebhookConfigError`]).
//!   Defaults: `failurePolicy: Fail`, `timeoutSeconds: 10`, rule `scope: "*"`, service port 443,
//!   path `/`.
//! - For every CREATE, UPDATE (incl. `/status` and `/scale`) and DELETE, each webhook in order is
//!   matched on its `namespaceSelector`, `objectSelector` and `rules` (operations incl. `*`;
//!   apiGroups, apiVersions; resources `*`, `r`, `r/sub`, `r/*`, `*/sub`, `*/*` as
//!   k8s.io/apiserver's `rules.Matcher` splits them, so `kubeadmcontrolplanes` does not match
//!   `kubeadmcontrolplanes/status`, while `r/*` matches `r` and all its subresources; scope).
//!   The object selector matches the new object or the old one (DELETE: the stored object only;
//!   for `/scale` the Scale, which has no labels).
//! - The matching webhooks are called in parallel, each with a fresh random (v4) uid, with the
//!   admission.k8s.io/v1 AdmissionReview body kube-apiserver sends (field for field as in
//!   tests/fixtures/admission-reviews/), `POST <path>?timeout=<n>s`, `Content-Type` and
//!   `Accept` as kube-apiserver sends them, `User-Agent: kube-apiserver-admission`, and `Host`
//!   the service's `<name>.<namespace>.svc:<port>`. The service resolves to
//!   [`WebhookTarget::addr`] (as a Service resolves to its endpoint) and TLS is verified against
//!   [`WebhookTarget::ca_pem`] (in the role of `clientConfig.caBundle`) for
//!   [`WebhookTarget::server_name`], the service's DNS name kube-apiserver verifies.
//! - userInfo: the stand-in's user with the groups kube-apiserver's impersonation gives (a
//!   service account's `system:serviceaccounts` and `system:serviceaccounts:<ns>`, then
//!   `system:authenticated`; `system:anonymous` is `system:unauthenticated`).
//! - Answers: allowed → allow, with the response's warnings passed to the client; denied →
//!   `admission webhook "<name>" denied the request: <status.message>` (or the reason, or
//!   `without explanation`), code `status.code` (403 when missing or below 400), reason and
//!   details as returned; a failed call (refused, TLS, timeout, HTTP status outside 200-206,
//!   undecodable body, missing response, uid or type mismatch) under `failurePolicy: Fail` →
//!   500 InternalError `Internal error occurred: failed calling webhook "<name>": failed to call
//!   webhook: Post "https://<service>.<ns>.svc:<port><path>?timeout=<n>s": <error>` (transport
//!   failures; an HTTP status or a bad body reads `failed to call webhook: <what client-go
//!   says>`, an invalid response `received invalid webhook response: ...`, as in Go), under
//!   `Ignore` → allow. Warnings are passed on whatever the verdict. With several refusals the
//!   first webhook's (in configuration order) is answered; kube-apiserver answers the first to
//!   arrive.
//! - Every call is kept (the last [`CALL_LOG`]) for [`WebhookDispatcher::calls`] and sent to
//!   [`WebhookDispatcher::subscribe`]rs as it completes.
//!
//! What it does NOT do (so a verdict here is only as good as these gaps allow):
//! - `matchConditions` are CEL and are NOT evaluated: every request that matches the rules and
//!   selectors is sent. For the repo's configuration that changes no verdict, only the number of
//!   calls: its conditions skip teardown identities and metadata-only KCP updates, and quorumguard
//!   itself allows both (`serve --teardown`; a KCP update without a spec change). A dead guard,
//!   however, blocks them here where a real cluster would not call it at all.
//! - The stand-in has no Namespace objects: `namespaceSelector` is evaluated against the one
//!   label every real namespace carries, `kubernetes.io/metadata.name=<namespace>` (which the
//!   repo's configuration uses); other namespace labels are never set.
//! - `matchPolicy` has no effect: the stand-in serves one version per resource, so there is no
//!   equivalent request to convert; `requestKind`/`requestResource` are the request's own.
//! - Only `clientConfig.service` (all webhooks the same service, one target), never
//!   `clientConfig.url`; only `admissionReviewVersions` whose first known version is v1; only
//!   `sideEffects` None or NoneOnDryRun (what admissionregistration/v1 allows), so a dry-run
//!   request is always sent.
//! - HTTP/1.1 only (kube's client stack), where kube-apiserver prefers h2; no
//!   `Accept-Encoding: gzip`; no retries; no client certificate; a timeout covers the whole call
//!   (kube-apiserver also cuts it at the request's own deadline).
//! - Error texts after `failed to call webhook:` copy Go's for the common failures (connection
//!   refused, unknown authority, wrong host name, expired certificate, timeout, HTTP status,
//!   decoding); others carry the Rust error's text.
//! - No audit annotations are recorded (the `reason` one is kept in [`WebhookCall::reason`]), no
//!   admission metrics.
//!
//! The parts, one file each under `webhooks/`:
//! - `selector.rs`: label selectors, evaluated as kube-apiserver evaluates them.
//! - `hook.rs`: one webhook of the configuration, checked, defaulted and matched against a write.
//! - `review.rs`: the AdmissionReview request sent, with its user's groups and its fresh uid.
//! - `answer.rs`: the webhook's answer, checked and worded as kube-apiserver words it.
//! - `failure.rs`: a failed call (HTTP status, transport, TLS) in Go's words.
//! - `dispatcher.rs`: [`WebhookDispatcher`]: the configuration, its target, the calls and their
//!   log.

mod answer;
mod dispatcher;
mod failure;
mod hook;
mod relay;
mod review;
mod selector;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use super::apiserver::Operation;

pub use dispatcher::WebhookDispatcher;
pub use relay::Relay;
pub use review::review_request;

/// The repo's ValidatingWebhookConfiguration, as `kubectl apply -k manifests/` installs it.
pub const MANIFEST: &str =
    include_str!("../../../manifests/core/validatingwebhookconfiguration.yaml");

/// The DNS name kube-apiserver verifies the webhook's certificate for with [`MANIFEST`]: its
/// service `quorumguard-webhook` in `quorumguard-system`.
pub const SERVICE_DNS_NAME: &str = "quorumguard-webhook.quorumguard-system.svc";

/// How many calls [`WebhookDispatcher::calls`] keeps (the oldest go first).
pub const CALL_LOG: usize = 1000;

/// How many calls a [`WebhookDispatcher::subscribe`]r may fall behind before it misses some.
const SUBSCRIBER_BUFFER: usize = 256;

/// kube-apiserver's default `timeoutSeconds`.
const DEFAULT_TIMEOUT_SECONDS: i32 = 10;

/// Where the configuration's service really is, and how to trust it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookTarget {
    /// Where `clientConfig.service` resolves to: the in-process `quorumguard serve`.
    pub addr: SocketAddr,
    /// The CA certificate(s) (PEM) the serving certificate must chain to: the caBundle.
    pub ca_pem: String,
    /// The name the serving certificate must hold (for [`MANIFEST`]: [`SERVICE_DNS_NAME`]).
    pub server_name: String,
}

/// Why a configuration or target cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WebhookConfigError {
    #[error("not a ValidatingWebhookConfiguration: {0}")]
    Parse(#[from] serde_yaml::Error),
    #[error("the ValidatingWebhookConfiguration has no webhooks")]
    NoWebhooks,
    #[error("webhook {webhook:?}: {problem}")]
    Invalid { webhook: String, problem: String },
    #[error("the target's CA bundle holds no usable certificate: {0}")]
    CaBundle(String),
    #[error("the target's server name {0:?} is not a valid DNS name or IP address")]
    ServerName(String),
}

/// One webhook call, for tests and the playground's timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookCall {
    /// This dispatcher's call number, from 1: stable where positions in the bounded
    /// [`WebhookDispatcher::calls`] are not.
    pub seq: u64,
    /// The webhook's name, e.g. `machines.quorumguard.io`.
    pub webhook: String,
    /// The review's uid.
    pub uid: String,
    pub operation: Operation,
    /// The plural resource, e.g. `machines`.
    pub resource: String,
    pub sub_resource: Option<String>,
    /// The kind of the reviewed object: the resource's, or `Scale` for `/scale`.
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub user: String,
    pub dry_run: bool,
    /// Whether this webhook let the request through (a failed call under `Ignore` does).
    pub allowed: bool,
    /// The HTTP code this webhook's verdict means for the client: 200 when allowed, else the
    /// denial's code or 500 for a failed call.
    pub code: u16,
    /// The webhook's `response.status.message` (as it sent it, without kube-apiserver's
    /// prefix), or for a failed call the whole `failed calling webhook ...` text.
    pub message: Option<String>,
    pub warnings: Vec<String>,
    /// `response.auditAnnotations["reason"]` (quorumguard's reason code).
    pub reason: Option<String>,
    /// Why the call failed (the text after `failed calling webhook "<name>": `), if it did.
    pub error: Option<String>,
    /// From sending the request to having the verdict.
    pub latency: Duration,
    /// When the call started.
    pub at: SystemTime,
}
