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

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::{Request, header};
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::Deserialize;
use serde_json::{Value, json};

use super::apiserver::{AdmissionAttempt, AdmissionVerdict, ApiServer, Operation};

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

/// A label selector in the form kube-apiserver evaluates (`LabelSelectorAsSelector`).
#[derive(Clone, Debug, Default)]
struct Selector(Vec<Requirement>);

#[derive(Clone, Debug)]
struct Requirement {
    key: String,
    op: SelectorOp,
}

#[derive(Clone, Debug)]
enum SelectorOp {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

impl Selector {
    /// `None` (the field left out) and `{}` select everything.
    fn parse(selector: Option<&LabelSelector>) -> Result<Self, String> {
        let Some(selector) = selector else {
            return Ok(Self::default());
        };
        let mut reqs = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            reqs.push(Requirement {
                key: key.clone(),
                op: SelectorOp::In(vec![value.clone()]),
            });
        }
        for expr in selector.match_expressions.iter().flatten() {
            let values = expr.values.clone().unwrap_or_default();
            let op = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!(
                        "{}: for 'in', 'notin' operators, values set can't be empty",
                        expr.key
                    ));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!(
                        "{}: values set must be empty for exists and does not exist",
                        expr.key
                    ));
                }
                "In" => SelectorOp::In(values),
                "NotIn" => SelectorOp::NotIn(values),
                "Exists" => SelectorOp::Exists,
                "DoesNotExist" => SelectorOp::DoesNotExist,
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            };
            reqs.push(Requirement {
                key: expr.key.clone(),
                op,
            });
        }
        Ok(Self(reqs))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| {
            let value = labels.get(&r.key);
            match &r.op {
                SelectorOp::In(values) => value.is_some_and(|v| values.contains(v)),
                SelectorOp::NotIn(values) => value.is_none_or(|v| !values.contains(v)),
                SelectorOp::Exists => value.is_some(),
                SelectorOp::DoesNotExist => value.is_none(),
            }
        })
    }
}

/// One webhook of the configuration, checked and with its defaults applied.
#[derive(Clone, Debug)]
struct Hook {
    name: String,
    rules: Vec<RuleWithOperations>,
    namespace_selector: Selector,
    object_selector: Selector,
    /// `failurePolicy: Ignore`.
    fail_open: bool,
    timeout: Duration,
    /// `<path>?timeout=<n>s`: what is sent.
    path_and_query: String,
    /// `https://<service>.<ns>.svc:<port><path>?timeout=<n>s`: what kube-apiserver names in
    /// its errors.
    url: String,
}

impl Hook {
    fn from_webhook(w: &ValidatingWebhook) -> Result<(Self, (String, String, i32)), String> {
        match first_known_version(&w.admission_review_versions) {
            Some("v1") => {}
            Some(v) => {
                return Err(format!(
                    "admissionReviewVersions picks {v}; only v1 is spoken here"
                ));
            }
            None => {
                return Err(
                    "admissionReviewVersions must include at least one of v1, v1beta1".into(),
                );
            }
        }
        if !matches!(w.side_effects.as_str(), "None" | "NoneOnDryRun") {
            return Err(format!(
                "sideEffects {:?}: must be None or NoneOnDryRun",
                w.side_effects
            ));
        }
        let fail_open = match w.failure_policy.as_deref() {
            None | Some("Fail") => false,
            Some("Ignore") => true,
            Some(other) => return Err(format!("failurePolicy {other:?}: must be Fail or Ignore")),
        };
        let seconds = w.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        if !(1..=30).contains(&seconds) {
            return Err(format!(
                "timeoutSeconds {seconds}: must be between 1 and 30 seconds"
            ));
        }
        if let Some(policy) = w.match_policy.as_deref()
            && !matches!(policy, "Exact" | "Equivalent")
        {
            return Err(format!(
                "matchPolicy {policy:?}: must be Exact or Equivalent"
            ));
        }
        for rule in w.rules.iter().flatten() {
            for op in rule.operations.iter().flatten() {
                if !matches!(
                    op.as_str(),
                    "*" | "CREATE" | "UPDATE" | "DELETE" | "CONNECT"
                ) {
                    return Err(format!("rules: unknown operation {op:?}"));
                }
            }
            if let Some(scope) = rule.scope.as_deref()
                && !matches!(scope, "*" | "Cluster" | "Namespaced")
            {
                return Err(format!("rules: unknown scope {scope:?}"));
            }
        }
        let config = &w.client_config;
        if config.url.is_some() {
            return Err("clientConfig.url is not supported: only clientConfig.service".into());
        }
        let Some(service) = &config.service else {
            return Err("clientConfig.service is required".into());
        };
        let port = service.port.unwrap_or(443);
        let path = service.path.clone().unwrap_or_else(|| "/".into());
        if !path.starts_with('/') {
            return Err(format!(
                "clientConfig.service.path {path:?} must start with /"
            ));
        }
        let path_and_query = format!("{path}?timeout={seconds}s");
        let url = format!(
            "https://{}.{}.svc:{port}{path_and_query}",
            service.name, service.namespace
        );
        let hook = Hook {
            name: w.name.clone(),
            rules: w.rules.clone().unwrap_or_default(),
            namespace_selector: Selector::parse(w.namespace_selector.as_ref())
                .map_err(|e| format!("namespaceSelector: {e}"))?,
            object_selector: Selector::parse(w.object_selector.as_ref())
                .map_err(|e| format!("objectSelector: {e}"))?,
            fail_open,
            timeout: Duration::from_secs(u64::from(seconds.unsigned_abs())),
            path_and_query,
            url,
        };
        let svc = (service.name.clone(), service.namespace.clone(), port);
        Ok((hook, svc))
    }

    /// kube-apiserver's `ShouldCallHook` without matchConditions: namespace selector, object
    /// selector, then the rules.
    fn matches(&self, a: &AdmissionAttempt) -> bool {
        let namespace_ok = match &a.namespace {
            // Cluster-scoped (other than namespaces themselves) is never exempted.
            None => true,
            Some(ns) => {
                self.namespace_selector.is_empty() || {
                    let labels =
                        BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.clone())]);
                    self.namespace_selector.matches(&labels)
                }
            }
        };
        let object_ok = self.object_selector.is_empty()
            || [&a.object, &a.old_object]
                .into_iter()
                .flatten()
                .any(|o| self.object_selector.matches(&labels_of(o)));
        namespace_ok && object_ok && self.rules.iter().any(|r| rule_matches(r, a))
    }
}

/// The first version kube-apiserver knows in `admissionReviewVersions`: the one it sends.
fn first_known_version(versions: &[String]) -> Option<&str> {
    versions
        .iter()
        .map(String::as_str)
        .find(|v| matches!(*v, "v1" | "v1beta1"))
}

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn operation_name(op: Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
    }
}

/// k8s.io/apiserver `rules.Matcher`: scope, operation, group, version, resource.
fn rule_matches(rule: &RuleWithOperations, a: &AdmissionAttempt) -> bool {
    let any = |list: &Option<Vec<String>>, value: &str| {
        list.iter().flatten().any(|x| x == "*" || x == value)
    };
    let is_namespace = a.group.is_empty() && a.resource == "namespaces";
    let scope = match rule.scope.as_deref() {
        None | Some("*") => true,
        Some("Namespaced") => !is_namespace && a.namespace.is_some(),
        Some("Cluster") => is_namespace || a.namespace.is_none(),
        Some(_) => false,
    };
    let sub = a.sub_resource.as_deref().unwrap_or("");
    let resource = rule.resources.iter().flatten().any(|r| {
        let (res, rsub) = r.split_once('/').unwrap_or((r.as_str(), ""));
        (res == "*" || res == a.resource) && (rsub == "*" || rsub == sub)
    });
    scope
        && any(&rule.operations, operation_name(a.operation))
        && any(&rule.api_groups, &a.group)
        && any(&rule.api_versions, &a.version)
        && resource
}

/// The groups kube-apiserver's impersonation filter gives `user` when no group is asked for.
fn groups_of(user: &str) -> Vec<String> {
    if user == "system:anonymous" {
        return vec!["system:unauthenticated".into()];
    }
    let mut groups = Vec::new();
    if let Some(rest) = user.strip_prefix("system:serviceaccount:")
        && let Some((namespace, name)) = rest.split_once(':')
        && !namespace.is_empty()
        && !name.is_empty()
        && !name.contains(':')
    {
        groups.push("system:serviceaccounts".to_string());
        groups.push(format!("system:serviceaccounts:{namespace}"));
    }
    groups.push("system:authenticated".into());
    groups
}

/// The admission.k8s.io/v1 AdmissionReview kube-apiserver sends for `a` with this `uid` (Go's
/// `omitempty`: no `subResource`/`requestSubResource`/`namespace` keys when empty; `object`
/// and `oldObject` always, null when absent).
pub fn review_request(a: &AdmissionAttempt, uid: &str) -> Value {
    let kind = if a.sub_resource.as_deref() == Some("scale") {
        json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
    } else {
        json!({"group": a.group, "version": a.version, "kind": a.kind})
    };
    let resource = json!({"group": a.group, "version": a.version, "resource": a.resource});
    let mut request = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": a.name,
        "operation": operation_name(a.operation),
        "userInfo": {"username": a.user, "groups": groups_of(&a.user)},
        "object": a.object.clone().unwrap_or(Value::Null),
        "oldObject": a.old_object.clone().unwrap_or(Value::Null),
        "dryRun": a.dry_run,
    });
    if let Some(sub) = a.sub_resource.as_deref().filter(|s| !s.is_empty()) {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    if let Some(ns) = a.namespace.as_deref().filter(|n| !n.is_empty()) {
        request["namespace"] = json!(ns);
    }
    if let Some(options) = &a.options {
        request["options"] = options.clone();
    }
    json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
}

/// A fresh random (version 4) UUID, as kube-apiserver gives every webhook call; from the time
/// and a counter if the system's randomness fails.
fn new_uid() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut b = [0u8; 16];
    let random = rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut b);
    if random.is_err() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        b[..8].copy_from_slice(&nanos.to_be_bytes());
        b[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The response part of an AdmissionReview, as kube-apiserver reads it (unknown fields
/// ignored; `patch` is ignored for validating webhooks).
#[derive(Deserialize)]
struct ReviewAnswer {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    response: Option<AnswerBody>,
}

#[derive(Deserialize)]
struct AnswerBody {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    allowed: bool,
    status: Option<kube::core::Status>,
    #[serde(rename = "auditAnnotations")]
    audit_annotations: Option<BTreeMap<String, String>>,
    warnings: Option<Vec<String>>,
}

/// What one call came to.
enum Outcome {
    Allowed {
        message: Option<String>,
    },
    Denied {
        code: u16,
        reason: String,
        message: String,
        details: Option<Value>,
        status_message: Option<String>,
    },
    /// The text after `failed calling webhook "<name>": `.
    Failed(String),
}

struct Answered {
    outcome: Outcome,
    warnings: Vec<String>,
    reason: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Calls the webhooks of one ValidatingWebhookConfiguration for the API-server stand-in.
pub struct WebhookDispatcher {
    /// The configuration's `metadata.name`: the stand-in's name for this hook.
    name: String,
    hooks: Vec<Hook>,
    target: Mutex<Target>,
    calls: Mutex<VecDeque<WebhookCall>>,
    /// Calls made so far (the last one's `seq`).
    count: AtomicU64,
    events: tokio::sync::broadcast::Sender<WebhookCall>,
}

/// The target with its CA decoded, and the clients built for it (one per timeout).
struct Target {
    spec: WebhookTarget,
    roots: Vec<Vec<u8>>,
    clients: Vec<(Duration, kube::Client)>,
}

impl Target {
    fn new(spec: WebhookTarget) -> Result<Self, WebhookConfigError> {
        let roots = CertificateDer::pem_slice_iter(spec.ca_pem.as_bytes())
            .map(|c| c.map(|c| c.as_ref().to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| WebhookConfigError::CaBundle(e.to_string()))?;
        if roots.is_empty() {
            return Err(WebhookConfigError::CaBundle("no PEM certificate".into()));
        }
        if ServerName::try_from(spec.server_name.as_str()).is_err() {
            return Err(WebhookConfigError::ServerName(spec.server_name.clone()));
        }
        Ok(Self {
            spec,
            roots,
            clients: Vec::new(),
        })
    }

    /// A client for calls with this timeout (built once; needs a Tokio runtime).
    fn client(&mut self, timeout: Duration) -> Result<kube::Client, String> {
        if let Some((_, c)) = self.clients.iter().find(|(t, _)| *t == timeout) {
            return Ok(c.clone());
        }
        let uri = format!("https://{}", self.spec.addr)
            .parse()
            .map_err(|e| format!("the target address: {e}"))?;
        let mut config = kube::Config::new(uri);
        config.root_cert = Some(self.roots.clone());
        config.tls_server_name = Some(self.spec.server_name.clone());
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        config.reset_reader_on_write = true;
        // kube-apiserver does not retry a webhook call.
        config.default_retry = false;
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        self.clients.push((timeout, client.clone()));
        Ok(client)
    }
}

impl WebhookDispatcher {
    /// Reads a ValidatingWebhookConfiguration (YAML or JSON) whose service is served at
    /// `target`.
    pub fn from_manifest(yaml: &str, target: WebhookTarget) -> Result<Self, WebhookConfigError> {
        let vwc: ValidatingWebhookConfiguration = serde_yaml::from_str(yaml)?;
        let webhooks = vwc.webhooks.unwrap_or_default();
        if webhooks.is_empty() {
            return Err(WebhookConfigError::NoWebhooks);
        }
        let mut hooks: Vec<Hook> = Vec::new();
        let mut service = None;
        for w in &webhooks {
            let invalid = |problem: String| WebhookConfigError::Invalid {
                webhook: w.name.clone(),
                problem,
            };
            if w.name.is_empty() || hooks.iter().any(|h| h.name == w.name) {
                return Err(invalid("names must be present and unique".into()));
            }
            let (hook, svc) = Hook::from_webhook(w).map_err(invalid)?;
            match &service {
                None => service = Some(svc),
                Some(first) if *first == svc => {}
                Some(first) => {
                    return Err(invalid(format!(
                        "service {}/{}:{} differs from {}/{}:{}: one target serves all webhooks",
                        svc.1, svc.0, svc.2, first.1, first.0, first.2
                    )));
                }
            }
            hooks.push(hook);
        }
        Ok(Self {
            name: vwc.metadata.name.unwrap_or_else(|| "webhooks".into()),
            hooks,
            target: Mutex::new(Target::new(target)?),
            calls: Mutex::new(VecDeque::new()),
            count: AtomicU64::new(0),
            events: tokio::sync::broadcast::channel(SUBSCRIBER_BUFFER).0,
        })
    }

    /// [`MANIFEST`] served at `target`.
    pub fn for_repo_manifest(target: WebhookTarget) -> Result<Self, WebhookConfigError> {
        Self::from_manifest(MANIFEST, target)
    }

    /// The configuration's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The webhooks' names, in order.
    pub fn webhook_names(&self) -> Vec<String> {
        self.hooks.iter().map(|h| h.name.clone()).collect()
    }

    pub fn target(&self) -> WebhookTarget {
        lock(&self.target).spec.clone()
    }

    /// Points the service at another endpoint or CA (a restarted `serve`, a rotated CA).
    pub fn set_target(&self, target: WebhookTarget) -> Result<(), WebhookConfigError> {
        *lock(&self.target) = Target::new(target)?;
        Ok(())
    }

    /// Makes this the stand-in's admission hook (replacing any other).
    pub fn install(self: Arc<Self>, api: &ApiServer) {
        let name = self.name.clone();
        api.set_admission_hook_async(&name, move |attempt| {
            let me = Arc::clone(&self);
            Box::pin(async move { me.admit(attempt).await })
        });
    }

    /// The names of the webhooks `attempt` would be sent to.
    pub fn matching(&self, attempt: &AdmissionAttempt) -> Vec<String> {
        self.hooks
            .iter()
            .filter(|h| h.matches(attempt))
            .map(|h| h.name.clone())
            .collect()
    }

    /// Every call so far (the last [`CALL_LOG`]), oldest first.
    pub fn calls(&self) -> Vec<WebhookCall> {
        lock(&self.calls).iter().cloned().collect()
    }

    /// The calls numbered above `seq` that are still kept, oldest first (`calls_since(0)` is
    /// [`Self::calls`]).
    pub fn calls_since(&self, seq: u64) -> Vec<WebhookCall> {
        lock(&self.calls)
            .iter()
            .filter(|c| c.seq > seq)
            .cloned()
            .collect()
    }

    /// How many calls were made so far (the `seq` of the latest).
    pub fn call_count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Each call as it completes (a receiver that falls 256 calls behind loses the oldest).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<WebhookCall> {
        self.events.subscribe()
    }

    /// Sends `attempt` to every matching webhook, in parallel, and answers as kube-apiserver
    /// would.
    pub async fn admit(&self, attempt: AdmissionAttempt) -> AdmissionVerdict {
        let hooks: Vec<&Hook> = self.hooks.iter().filter(|h| h.matches(&attempt)).collect();
        if hooks.is_empty() {
            return AdmissionVerdict::Allow;
        }
        let calls = hooks.iter().map(|h| self.call(h, &attempt));
        let answers = futures::future::join_all(calls).await;
        let mut warnings: Vec<String> = Vec::new();
        let mut refusal = None;
        for (hook, answer) in hooks.iter().zip(answers) {
            for w in answer.warnings {
                if !w.is_empty() && !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
            if refusal.is_some() {
                continue;
            }
            refusal = match answer.outcome {
                Outcome::Allowed { .. } => None,
                Outcome::Failed(_) if hook.fail_open => None,
                Outcome::Failed(why) => {
                    let err = format!("failed calling webhook \"{}\": {why}", hook.name);
                    Some((
                        500,
                        "InternalError".to_string(),
                        format!("Internal error occurred: {err}"),
                        Some(json!({"causes": [{"message": err}]})),
                    ))
                }
                Outcome::Denied {
                    code,
                    reason,
                    message,
                    details,
                    ..
                } => Some((code, reason, message, details)),
            };
        }
        match refusal {
            Some((code, reason, message, details)) => AdmissionVerdict::Reject {
                code,
                reason,
                message,
                details,
                warnings,
            },
            None if warnings.is_empty() => AdmissionVerdict::Allow,
            None => AdmissionVerdict::AllowWithWarnings(warnings),
        }
    }

    /// One call, logged.
    async fn call(&self, hook: &Hook, a: &AdmissionAttempt) -> Answered {
        let uid = new_uid();
        let at = SystemTime::now();
        let started = Instant::now();
        let answered = self.exchange(hook, a, &uid).await;
        let latency = started.elapsed();
        let (allowed, code, message, error) = match &answered.outcome {
            Outcome::Allowed { message } => (true, 200, message.clone(), None),
            Outcome::Denied {
                code,
                status_message,
                ..
            } => (false, *code, status_message.clone(), None),
            Outcome::Failed(why) => {
                let text = format!("failed calling webhook \"{}\": {why}", hook.name);
                let code = if hook.fail_open { 200 } else { 500 };
                (hook.fail_open, code, Some(text), Some(why.clone()))
            }
        };
        let mut record = WebhookCall {
            seq: 0,
            webhook: hook.name.clone(),
            uid,
            operation: a.operation,
            resource: a.resource.clone(),
            sub_resource: a.sub_resource.clone(),
            kind: a.kind.clone(),
            namespace: a.namespace.clone(),
            name: a.name.clone(),
            user: a.user.clone(),
            dry_run: a.dry_run,
            allowed,
            code,
            message,
            warnings: answered.warnings.clone(),
            reason: answered.reason.clone(),
            error,
            latency,
            at,
        };
        tracing::debug!(
            webhook = %record.webhook, uid = %record.uid, resource = %record.resource,
            name = %record.name, allowed, code, latency_ms = latency.as_millis() as u64,
            "webhook called"
        );
        {
            let mut calls = lock(&self.calls);
            // Numbered under the lock, so that the log is in `seq` order.
            record.seq = self.count.fetch_add(1, Ordering::SeqCst) + 1;
            if calls.len() >= CALL_LOG {
                calls.pop_front();
            }
            calls.push_back(record.clone());
        }
        // No subscriber is fine.
        let _ = self.events.send(record);
        answered
    }

    /// POSTs the review and reads the answer, within the webhook's timeout.
    async fn exchange(&self, hook: &Hook, a: &AdmissionAttempt, uid: &str) -> Answered {
        let failed = |why: String| Answered {
            outcome: Outcome::Failed(why),
            warnings: Vec::new(),
            reason: None,
        };
        let (client, addr, server_name) = {
            let mut target = lock(&self.target);
            let client = target.client(hook.timeout);
            (client, target.spec.addr, target.spec.server_name.clone())
        };
        let post_failed = |err: String| {
            failed(format!(
                "failed to call webhook: Post \"{}\": {err}",
                hook.url
            ))
        };
        let client = match client {
            Ok(c) => c,
            Err(e) => return post_failed(e),
        };
        let body = match serde_json::to_vec(&review_request(a, uid)) {
            Ok(b) => b,
            Err(e) => return failed(format!("failed to call webhook: {e}")),
        };
        let host = hook
            .url
            .trim_start_matches("https://")
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let request = Request::post(hook.path_and_query.as_str())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, */*")
            .header(header::USER_AGENT, "kube-apiserver-admission")
            .header(header::HOST, host)
            .body(kube::client::Body::from(body));
        let request = match request {
            Ok(r) => r,
            Err(e) => return post_failed(e.to_string()),
        };
        let exchange = async {
            let response = client.send(request).await?;
            let code = response.status().as_u16();
            let content_type = response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let body = response.into_body().collect_bytes().await?;
            Ok::<_, kube::Error>((code, content_type, body))
        };
        let (code, content_type, body) = match tokio::time::timeout(hook.timeout, exchange).await {
            Err(_) => return post_failed("context deadline exceeded".into()),
            Ok(Err(e)) => return post_failed(transport_error(&e, addr, &server_name)),
            Ok(Ok(answer)) => answer,
        };
        if !(200..=206).contains(&code) {
            return failed(format!(
                "failed to call webhook: {}",
                status_error(code, &content_type, &body)
            ));
        }
        match read_answer(&body, uid) {
            Err(why) => failed(why),
            Ok(answer) => judge(&hook.name, answer),
        }
    }
}

/// The AdmissionResponse, checked as kube-apiserver's `VerifyAdmissionResponse` does.
fn read_answer(body: &Bytes, uid: &str) -> Result<AnswerBody, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        format!("failed to call webhook: couldn't get version/kind; json parse error: {e}")
    })?;
    if value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        return Err(format!(
            "failed to call webhook: Object 'Kind' is missing in '{}'",
            String::from_utf8_lossy(body)
        ));
    }
    let answer: ReviewAnswer =
        serde_json::from_value(value).map_err(|e| format!("failed to call webhook: {e}"))?;
    let invalid = |why: String| format!("received invalid webhook response: {why}");
    let Some(response) = answer.response else {
        return Err(invalid("webhook response was absent".into()));
    };
    if response.uid != uid {
        return Err(invalid(format!(
            "expected response.uid={uid:?}, got {:?}",
            response.uid
        )));
    }
    if answer.api_version != "admission.k8s.io/v1" || answer.kind != "AdmissionReview" {
        let (group, version) = answer
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", answer.api_version.as_str()));
        return Err(invalid(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {group}/{version}, Kind={}",
            answer.kind
        )));
    }
    Ok(response)
}

/// An allow, or the denial as k8s.io/apiserver `ToStatusErr` words it.
fn judge(webhook: &str, r: AnswerBody) -> Answered {
    let warnings = r.warnings.unwrap_or_default();
    let reason = r
        .audit_annotations
        .as_ref()
        .and_then(|a| a.get("reason"))
        .cloned();
    let status = r.status.unwrap_or_default();
    let status_message = Some(status.message.clone()).filter(|m| !m.is_empty());
    let outcome = if r.allowed {
        Outcome::Allowed {
            message: status_message,
        }
    } else {
        let denied = format!("admission webhook \"{webhook}\" denied the request");
        let message = if !status.message.is_empty() {
            format!("{denied}: {}", status.message)
        } else if !status.reason.is_empty() {
            format!("{denied}: {}", status.reason)
        } else {
            format!("{denied} without explanation")
        };
        Outcome::Denied {
            code: if status.code < 400 { 403 } else { status.code },
            reason: status.reason.clone(),
            message,
            details: status
                .details
                .as_ref()
                .and_then(|d| serde_json::to_value(d).ok()),
            status_message,
        }
    };
    Answered {
        outcome,
        warnings,
        reason,
    }
}

/// client-go's error for an HTTP status outside 200-206: a Status body's message, else
/// `NewGenericServerResponse`'s wording.
fn status_error(code: u16, content_type: &str, body: &[u8]) -> String {
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
fn transport_error(err: &kube::Error, addr: SocketAddr, server_name: &str) -> String {
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

fn tls_error(err: &rustls::Error, server_name: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    const MACHINES: &str = "machines.quorumguard.io";
    const KCPS: &str = "kubeadmcontrolplanes.quorumguard.io";

    /// A self-signed CA certificate, only so that a target parses.
    fn ca_pem() -> String {
        crate::certs::Ca::generate(1_800_000_000)
            .expect("CA")
            .cert_pem()
            .to_string()
    }

    fn target() -> WebhookTarget {
        WebhookTarget {
            addr: "127.0.0.1:9".parse().expect("addr"),
            ca_pem: ca_pem(),
            server_name: SERVICE_DNS_NAME.into(),
        }
    }

    fn repo() -> WebhookDispatcher {
        WebhookDispatcher::for_repo_manifest(target()).expect("the repo's manifest")
    }

    fn fixture(name: &str) -> Value {
        let path = format!(
            "{}/../../tests/fixtures/admission-reviews/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
    }

    fn machine(namespace: &str, labels: Value) -> Value {
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
               "metadata": {"name": "m", "namespace": namespace, "labels": labels}})
    }

    fn control_plane() -> Value {
        json!({"cluster.x-k8s.io/control-plane": "", "cluster.x-k8s.io/cluster-name": "test"})
    }

    fn attempt(op: Operation, group: &str, resource: &str, sub: Option<&str>) -> AdmissionAttempt {
        AdmissionAttempt {
            operation: op,
            group: group.into(),
            version: "v1beta2".into(),
            resource: resource.into(),
            kind: "Thing".into(),
            sub_resource: sub.map(str::to_string),
            namespace: Some("capi-test".into()),
            name: "m".into(),
            object: None,
            old_object: None,
            user: "jane@example.com".into(),
            dry_run: false,
            options: None,
        }
    }

    fn machine_delete(namespace: &str, labels: Value) -> AdmissionAttempt {
        let mut a = attempt(Operation::Delete, "cluster.x-k8s.io", "machines", None);
        a.namespace = Some(namespace.into());
        a.old_object = Some(machine(namespace, labels));
        a
    }

    fn kcp_update(sub: Option<&str>) -> AdmissionAttempt {
        let mut a = attempt(
            Operation::Update,
            "controlplane.cluster.x-k8s.io",
            "kubeadmcontrolplanes",
            sub,
        );
        a.object = Some(json!({"metadata": {"name": "m"}, "spec": {"replicas": 5}}));
        a.old_object = Some(json!({"metadata": {"name": "m"}, "spec": {"replicas": 3}}));
        a
    }

    /// A one-webhook configuration with these rules and selectors (YAML fragments).
    fn custom(rules: &str, extra: &str) -> WebhookDispatcher {
        let yaml = format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: custom}}
webhooks:
  - name: custom.example.io
    admissionReviewVersions: ["v1"]
    sideEffects: None
    clientConfig: {{service: {{name: svc, namespace: ns, path: /x}}}}
    rules: {rules}
{extra}
"#
        );
        WebhookDispatcher::from_manifest(&yaml, target()).expect("custom configuration")
    }

    fn sent(d: &WebhookDispatcher, a: &AdmissionAttempt) -> bool {
        !d.matching(a).is_empty()
    }

    #[test]
    fn the_repo_manifest_parses_with_its_settings() {
        let d = repo();
        assert_eq!(d.name(), "quorumguard");
        assert_eq!(d.webhook_names(), [MACHINES, KCPS]);
        let urls: Vec<_> = d.hooks.iter().map(|h| h.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "https://quorumguard-webhook.quorumguard-system.svc:443/validate/machines?timeout=5s",
                "https://quorumguard-webhook.quorumguard-system.svc:443/validate/kubeadmcontrolplanes?timeout=5s",
            ]
        );
        assert!(d.hooks.iter().all(|h| !h.fail_open));
        assert!(d.hooks.iter().all(|h| h.timeout == Duration::from_secs(5)));
    }

    #[test]
    fn the_repo_manifest_sends_control_plane_deletes_and_kcp_spec_updates_only() {
        let d = repo();
        assert_eq!(
            d.matching(&machine_delete("capi-test", control_plane())),
            [MACHINES]
        );
        // A worker Machine has no control-plane label: never sent.
        let worker = json!({"cluster.x-k8s.io/cluster-name": "test"});
        assert!(d.matching(&machine_delete("capi-test", worker)).is_empty());
        // The guard's own namespace is never guarded.
        assert!(
            d.matching(&machine_delete("quorumguard-system", control_plane()))
                .is_empty()
        );
        // Only DELETE of Machines.
        let mut update = machine_delete("capi-test", control_plane());
        update.operation = Operation::Update;
        update.object = update.old_object.clone();
        assert!(d.matching(&update).is_empty());
        let mut create = machine_delete("capi-test", control_plane());
        create.operation = Operation::Create;
        create.object = create.old_object.take();
        assert!(d.matching(&create).is_empty());
        // The KCP: the resource and /scale, never /status; only UPDATE.
        assert_eq!(d.matching(&kcp_update(None)), [KCPS]);
        assert_eq!(d.matching(&kcp_update(Some("scale"))), [KCPS]);
        assert!(d.matching(&kcp_update(Some("status"))).is_empty());
        let mut kcp_delete = kcp_update(None);
        kcp_delete.operation = Operation::Delete;
        assert!(d.matching(&kcp_delete).is_empty());
        let mut kcp_elsewhere = kcp_update(Some("scale"));
        kcp_elsewhere.namespace = Some("quorumguard-system".into());
        assert!(d.matching(&kcp_elsewhere).is_empty());
    }

    #[test]
    fn the_object_selector_reads_the_old_object_on_delete_and_either_on_update() {
        let d = custom(
            r#"[{operations: ["*"], apiGroups: ["*"], apiVersions: ["*"], resources: ["*"]}]"#,
            "    objectSelector: {matchLabels: {tier: cp}}",
        );
        let cp = json!({"tier": "cp"});
        // DELETE: object is absent, the stored object's labels decide.
        assert!(sent(&d, &machine_delete("capi-test", cp.clone())));
        assert!(!sent(&d, &machine_delete("capi-test", json!({}))));
        // UPDATE: either the old or the new object may match (a label removed or added).
        let mut a = attempt(Operation::Update, "cluster.x-k8s.io", "machines", None);
        a.old_object = Some(machine("capi-test", cp.clone()));
        a.object = Some(machine("capi-test", json!({})));
        assert!(sent(&d, &a));
        std::mem::swap(&mut a.object, &mut a.old_object);
        assert!(sent(&d, &a));
        a.old_object = Some(machine("capi-test", json!({"tier": "worker"})));
        a.object = Some(machine("capi-test", json!({})));
        assert!(!sent(&d, &a));
        // CREATE: the new object only.
        let mut c = attempt(Operation::Create, "cluster.x-k8s.io", "machines", None);
        c.object = Some(machine("capi-test", cp));
        assert!(sent(&d, &c));
    }

    #[test]
    fn resources_and_subresources_match_as_the_apiserver_splits_them() {
        let rules = |resources: &str| {
            custom(
                &format!(
                    r#"[{{operations: ["UPDATE"], apiGroups: ["cluster.x-k8s.io"], apiVersions: ["v1beta2"], resources: {resources}}}]"#
                ),
                "",
            )
        };
        let main = attempt(Operation::Update, "cluster.x-k8s.io", "machines", None);
        let status = attempt(
            Operation::Update,
            "cluster.x-k8s.io",
            "machines",
            Some("status"),
        );
        let scale = attempt(
            Operation::Update,
            "cluster.x-k8s.io",
            "machines",
            Some("scale"),
        );
        let other = attempt(Operation::Update, "cluster.x-k8s.io", "clusters", None);
        let cases = [
            (r#"["machines"]"#, [true, false, false, false]),
            (r#"["*"]"#, [true, false, false, true]),
            (r#"["*/*"]"#, [true, true, true, true]),
            // As k8s.io/apiserver's matcher has it, `r/*` includes `r` itself.
            (r#"["machines/*"]"#, [true, true, true, false]),
            (r#"["*/status"]"#, [false, true, false, false]),
            (
                r#"["machines", "machines/scale"]"#,
                [true, false, true, false],
            ),
        ];
        for (resources, want) in cases {
            let d = rules(resources);
            let got = [&main, &status, &scale, &other].map(|a| sent(&d, a));
            assert_eq!(got, want, "{resources}");
        }
        // Group and version must match too.
        let d = rules(r#"["*/*"]"#);
        let mut core = main.clone();
        core.group = String::new();
        assert!(!sent(&d, &core));
        let mut v1 = main.clone();
        v1.version = "v1beta1".into();
        assert!(!sent(&d, &v1));
    }

    #[test]
    fn operations_and_scope() {
        let d = custom(
            r#"[{operations: ["*"], apiGroups: ["*"], apiVersions: ["*"], resources: ["*"], scope: Cluster}]"#,
            "",
        );
        let mut a = attempt(Operation::Create, "cluster.x-k8s.io", "machines", None);
        assert!(!sent(&d, &a), "namespaced request, Cluster scope");
        a.namespace = None;
        assert!(sent(&d, &a));
        for op in [Operation::Update, Operation::Delete] {
            a.operation = op;
            assert!(sent(&d, &a), "{op:?} under *");
        }
        let d = custom(
            r#"[{operations: ["CREATE"], apiGroups: [""], apiVersions: ["*"], resources: ["*"], scope: Namespaced}]"#,
            "",
        );
        let mut ns = attempt(Operation::Create, "", "namespaces", None);
        ns.namespace = Some("capi-test".into());
        assert!(!sent(&d, &ns), "a Namespace is cluster-scoped");
        let mut secret = attempt(Operation::Create, "", "secrets", None);
        assert!(sent(&d, &secret));
        secret.operation = Operation::Delete;
        assert!(!sent(&d, &secret));
    }

    #[test]
    fn selector_operators() {
        let d = custom(
            r#"[{operations: ["*"], apiGroups: ["*"], apiVersions: ["*"], resources: ["*"]}]"#,
            r#"    objectSelector:
      matchLabels: {a: "1"}
      matchExpressions:
        - {key: b, operator: In, values: ["x", "y"]}
        - {key: c, operator: NotIn, values: ["no"]}
        - {key: d, operator: Exists}
        - {key: e, operator: DoesNotExist}
    namespaceSelector:
      matchExpressions:
        - {key: kubernetes.io/metadata.name, operator: In, values: ["capi-test"]}"#,
        );
        let with = |labels: Value| sent(&d, &machine_delete("capi-test", labels));
        assert!(with(json!({"a": "1", "b": "y", "d": ""})));
        assert!(with(json!({"a": "1", "b": "x", "c": "yes", "d": "z"})));
        assert!(!with(json!({"a": "2", "b": "x", "d": ""})), "matchLabels");
        assert!(!with(json!({"a": "1", "b": "z", "d": ""})), "In");
        assert!(!with(json!({"a": "1", "d": ""})), "In needs the label");
        assert!(
            !with(json!({"a": "1", "b": "x", "c": "no", "d": ""})),
            "NotIn"
        );
        assert!(!with(json!({"a": "1", "b": "x"})), "Exists");
        assert!(
            !with(json!({"a": "1", "b": "x", "d": "", "e": ""})),
            "DoesNotExist"
        );
        // The namespace selector sees kubernetes.io/metadata.name only.
        let labels = json!({"a": "1", "b": "y", "d": ""});
        assert!(!sent(&d, &machine_delete("default", labels.clone())));
        // A cluster-scoped request is never exempted by a namespace selector.
        let mut cluster_scoped = machine_delete("capi-test", labels);
        cluster_scoped.namespace = None;
        assert!(sent(&d, &cluster_scoped));
    }

    #[test]
    fn configurations_this_dispatcher_cannot_honour_are_refused() {
        let base = MANIFEST.to_string();
        let bad = [
            (
                base.replace(
                    "        name: quorumguard-webhook\n        namespace: quorumguard-system\n        path: /validate/machines",
                    "        name: elsewhere\n        namespace: quorumguard-system\n        path: /validate/machines",
                ),
                "one target serves all webhooks",
            ),
            (
                base.replacen("sideEffects: NoneOnDryRun", "sideEffects: Some", 1),
                "sideEffects",
            ),
            (
                base.replacen(
                    "admissionReviewVersions: [\"v1\"]",
                    "admissionReviewVersions: [\"v1beta1\", \"v1\"]",
                    1,
                ),
                "only v1",
            ),
            (
                base.replacen("failurePolicy: Fail", "failurePolicy: Maybe", 1),
                "failurePolicy",
            ),
            (
                base.replacen("timeoutSeconds: 5", "timeoutSeconds: 31", 1),
                "timeoutSeconds",
            ),
            (
                base.replacen("operator: Exists", "operator: Exists\n          values: [x]", 1),
                "objectSelector",
            ),
            (
                base.replacen(
                    "    clientConfig:\n      service:",
                    "    clientConfig:\n      url: https://example.com/x\n      service:",
                    1,
                ),
                "clientConfig.url",
            ),
            (
                base.replacen(
                    "- name: kubeadmcontrolplanes.quorumguard.io",
                    "- name: machines.quorumguard.io",
                    1,
                ),
                "unique",
            ),
        ];
        for (yaml, needle) in bad {
            assert_ne!(yaml, base, "{needle}: the edit applied");
            let err = WebhookDispatcher::from_manifest(&yaml, target())
                .err()
                .unwrap_or_else(|| panic!("{needle}: accepted"));
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
        let mut no_ca = target();
        no_ca.ca_pem = "not a certificate".into();
        assert!(matches!(
            WebhookDispatcher::for_repo_manifest(no_ca),
            Err(WebhookConfigError::CaBundle(_))
        ));
        assert!(matches!(
            WebhookDispatcher::from_manifest("kind: ConfigMap\napiVersion: v1\n", target()),
            Err(WebhookConfigError::Parse(_))
        ));
    }

    /// The attempt the stand-in makes for a fixture's request (with the fixture's options).
    fn attempt_from_fixture(review: &Value) -> AdmissionAttempt {
        let r = &review["request"];
        let text = |v: &Value| v.as_str().map(str::to_string);
        let operation = match r["operation"].as_str() {
            Some("DELETE") => Operation::Delete,
            Some("CREATE") => Operation::Create,
            _ => Operation::Update,
        };
        let object = |v: &Value| Some(v.clone()).filter(|v| !v.is_null());
        AdmissionAttempt {
            operation,
            group: text(&r["resource"]["group"]).unwrap_or_default(),
            version: text(&r["resource"]["version"]).unwrap_or_default(),
            resource: text(&r["resource"]["resource"]).unwrap_or_default(),
            kind: text(&r["kind"]["kind"]).unwrap_or_default(),
            sub_resource: text(&r["subResource"]),
            namespace: text(&r["namespace"]),
            name: text(&r["name"]).unwrap_or_default(),
            object: object(&r["object"]),
            old_object: object(&r["oldObject"]),
            user: text(&r["userInfo"]["username"]).unwrap_or_default(),
            dry_run: r["dryRun"].as_bool().unwrap_or_default(),
            options: object(&r["options"]),
        }
    }

    #[test]
    fn the_body_is_the_one_kube_apiserver_sends() {
        for file in [
            "machine-delete-by-user.json",
            "machine-delete-by-kcp-controller.json",
            "machine-delete-dry-run.json",
            "kcp-scale-subresource-3-to-5.json",
            "kcp-update-replicas-5-to-3.json",
            "kcp-update-version.json",
        ] {
            let want = fixture(file);
            let uid = want["request"]["uid"].as_str().expect("uid").to_string();
            let mut got = review_request(&attempt_from_fixture(&want), &uid);
            // Same keys, same values, but for the groups: the fixtures' users were impersonated
            // with `--as-group system:masters`, which the stand-in does not know.
            let (mut want_req, got_req) = (want["request"].clone(), &mut got["request"]);
            let want_keys: Vec<&String> = want_req.as_object().expect("request").keys().collect();
            let got_keys: Vec<&String> = got_req.as_object().expect("request").keys().collect();
            assert_eq!(
                {
                    let mut k = want_keys.clone();
                    k.sort();
                    k
                },
                {
                    let mut k = got_keys.clone();
                    k.sort();
                    k
                },
                "{file}"
            );
            let groups = got_req["userInfo"]["groups"].clone();
            assert_eq!(
                groups.as_array().and_then(|g| g.last()),
                Some(&json!("system:authenticated")),
                "{file}"
            );
            got_req["userInfo"] = want_req["userInfo"].clone();
            want_req["userInfo"] = got_req["userInfo"].clone();
            assert_eq!(got["request"], want_req, "{file}");
            assert_eq!(got["kind"], want["kind"]);
            assert_eq!(got["apiVersion"], want["apiVersion"]);
            assert_eq!(got.as_object().map(|o| o.len()), Some(3));
        }
        // The scale subresource: kind autoscaling/v1 Scale, resource the KCP's.
        let scale = review_request(
            &attempt_from_fixture(&fixture("kcp-scale-subresource-3-to-5.json")),
            "u",
        );
        assert_eq!(
            scale["request"]["kind"],
            json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
        );
        assert_eq!(scale["request"]["requestSubResource"], "scale");
    }

    #[test]
    fn users_get_the_groups_impersonation_gives() {
        assert_eq!(groups_of("jane@example.com"), ["system:authenticated"]);
        assert_eq!(
            groups_of(
                "system:serviceaccount:capi-kubeadm-control-plane-system:capi-kubeadm-control-plane-manager"
            ),
            [
                "system:serviceaccounts",
                "system:serviceaccounts:capi-kubeadm-control-plane-system",
                "system:authenticated"
            ]
        );
        assert_eq!(groups_of("system:anonymous"), ["system:unauthenticated"]);
        assert_eq!(
            groups_of("system:kube-controller-manager"),
            ["system:authenticated"]
        );
    }

    #[test]
    fn uids_are_fresh_version_4_uuids() {
        let uids: std::collections::BTreeSet<String> = (0..1000).map(|_| new_uid()).collect();
        assert_eq!(uids.len(), 1000);
        for uid in uids.iter().take(20) {
            let parts: Vec<usize> = uid.split('-').map(str::len).collect();
            assert_eq!(parts, [8, 4, 4, 4, 12], "{uid}");
            assert_eq!(&uid[14..15], "4", "{uid}");
            assert!(matches!(&uid[19..20], "8" | "9" | "a" | "b"), "{uid}");
        }
    }

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
        let (r, _) = verdict(
            json!({"uid": "u1", "allowed": false, "status": {"code": 200, "reason": "Why"}}),
        );
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
            Some(
                "received invalid webhook response: expected response.uid=\"u1\", got \"u2\""
                    .into()
            )
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
            Some(
                r#"failed to call webhook: Object 'Kind' is missing in '{"response": {}}'"#.into()
            )
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
}
