//! [`WebhookDispatcher`]: the configuration's webhooks, the target they are served at, each call
//! over HTTPS, the verdict answered to the stand-in, and the log of calls.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::http::{Request, header};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;

use super::answer::{Answered, Outcome, judge, read_answer};
use super::failure::{status_error, transport_error};
use super::hook::Hook;
use super::review::{new_uid, review_request};
use super::{
    CALL_LOG, MANIFEST, SUBSCRIBER_BUFFER, WebhookCall, WebhookConfigError, WebhookTarget,
};
use crate::apiserver::{AdmissionAttempt, AdmissionVerdict, ApiServer};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Calls the webhooks of one ValidatingWebhookConfiguration for the API-server stand-in.
pub struct WebhookDispatcher {
    /// The configuration's `metadata.name`: the stand-in's name for this hook.
    name: String,
    pub(super) hooks: Vec<Hook>,
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
        self.record(hook, a, uid, &answered, started.elapsed(), at);
        answered
    }

    /// Logs a call to `hook` about `a` and tells the subscribers.
    pub(super) fn record(
        &self,
        hook: &Hook,
        a: &AdmissionAttempt,
        uid: String,
        answered: &Answered,
        latency: Duration,
        at: SystemTime,
    ) {
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
    }

    /// POSTs the review and reads the answer, within the webhook's timeout.
    async fn exchange(&self, hook: &Hook, a: &AdmissionAttempt, uid: &str) -> Answered {
        let body = match serde_json::to_vec(&review_request(a, uid)) {
            Ok(b) => b,
            Err(e) => return failed(format!("failed to call webhook: {e}")),
        };
        let (code, content_type, body) = match self.post(hook, body).await {
            Ok(answer) => answer,
            Err(why) => return failed(why),
        };
        read_review_answer(&hook.name, code, &content_type, &body, uid)
    }

    /// POSTs `body` (an AdmissionReview) to `hook`'s path at the target, within its timeout:
    /// the answer's HTTP code, content type and body, or why there is none (as kube-apiserver
    /// words it).
    pub(super) async fn post(
        &self,
        hook: &Hook,
        body: Vec<u8>,
    ) -> Result<(u16, String, Bytes), String> {
        let (client, addr, server_name) = {
            let mut target = lock(&self.target);
            let client = target.client(hook.timeout);
            (client, target.spec.addr, target.spec.server_name.clone())
        };
        let post_failed =
            |err: String| format!("failed to call webhook: Post \"{}\": {err}", hook.url);
        let client = client.map_err(post_failed)?;
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
            .body(kube::client::Body::from(body))
            .map_err(|e| post_failed(e.to_string()))?;
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
        match tokio::time::timeout(hook.timeout, exchange).await {
            Err(_) => Err(post_failed("context deadline exceeded".into())),
            Ok(Err(e)) => Err(post_failed(transport_error(&e, addr, &server_name))),
            Ok(Ok(answer)) => Ok(answer),
        }
    }
}

/// A failed call: no verdict, no warnings.
fn failed(why: String) -> Answered {
    Answered {
        outcome: Outcome::Failed(why),
        warnings: Vec::new(),
        reason: None,
    }
}

/// The verdict of webhook `name` in an answer to the review `uid`, as kube-apiserver reads it.
pub(super) fn read_review_answer(
    name: &str,
    code: u16,
    content_type: &str,
    body: &Bytes,
    uid: &str,
) -> Answered {
    if !(200..=206).contains(&code) {
        return failed(format!(
            "failed to call webhook: {}",
            status_error(code, content_type, body)
        ));
    }
    match read_answer(body, uid) {
        Err(why) => failed(why),
        Ok(answer) => judge(name, answer),
    }
}
