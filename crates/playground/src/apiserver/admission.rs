//! The admission hook: what it sees ([`AdmissionAttempt`]), what it may answer
//! ([`AdmissionVerdict`]), setting it, and its answer turned into warnings and a refusal as
//! kube-apiserver words them.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use super::status::ApiError;
use super::{ApiServer, Shared, lock};

/// The operation an admission hook is asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// What an admission hook sees: like an AdmissionReview request.
#[derive(Clone, Debug)]
pub struct AdmissionAttempt {
    pub operation: Operation,
    pub group: String,
    pub version: String,
    /// The plural resource name, e.g. `machines`.
    pub resource: String,
    /// The kind of `object`: the resource's kind, or `Scale` for the `/scale` subresource.
    pub kind: String,
    pub sub_resource: Option<String>,
    pub namespace: Option<String>,
    pub name: String,
    /// The object after the change (None for DELETE).
    pub object: Option<Value>,
    /// The object before the change (None for CREATE).
    pub old_object: Option<Value>,
    /// The `Impersonate-User` header, or `system:anonymous`.
    pub user: String,
    pub dry_run: bool,
    /// The request's options as kube-apiserver hands them to admission (`apiVersion`
    /// `meta.k8s.io/v1`): for DELETE the DeleteOptions body (or, without a body, the query's
    /// `dryRun`, `gracePeriodSeconds`, `propagationPolicy`, `orphanDependents`); for CREATE and
    /// UPDATE (incl. PATCH) CreateOptions/UpdateOptions from the query's `dryRun`,
    /// `fieldManager` and `fieldValidation`.
    pub options: Option<Value>,
}

/// An admission hook's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmissionVerdict {
    Allow,
    /// Allow, and send each text to the client as a `Warning: 299 - "<text>"` header (once per
    /// text, as kube-apiserver deduplicates them).
    AllowWithWarnings(Vec<String>),
    /// Refuse: answered like a webhook denial (`admission webhook "<hook>" denied the request:
    /// <message>`), with `code` (403 when below 400) and `reason` (may be empty).
    Deny {
        code: u16,
        reason: String,
        message: String,
    },
    /// Refuse with exactly this Status (no prefix added: the hook formats the message, as a
    /// webhook dispatcher serving several webhooks must), and send `warnings` too. `code` below
    /// 400 becomes 403; an empty `reason` is left out, as Go's `omitempty` does.
    Reject {
        code: u16,
        reason: String,
        message: String,
        /// The Status `details`, if any.
        details: Option<Value>,
        warnings: Vec<String>,
    },
}

impl AdmissionVerdict {
    pub fn deny(message: impl Into<String>) -> Self {
        Self::Deny {
            code: 403,
            reason: String::new(),
            message: message.into(),
        }
    }
}

pub(super) type Hook =
    Arc<dyn Fn(AdmissionAttempt) -> BoxFuture<'static, AdmissionVerdict> + Send + Sync>;

impl Shared {
    /// Runs the admission hook: the warnings for the client (whatever the outcome), and whether
    /// the request may go on.
    pub(super) async fn admit(
        &self,
        attempt: AdmissionAttempt,
    ) -> (Vec<String>, Result<(), ApiError>) {
        let hook = lock(&self.hook).clone();
        let Some((name, hook)) = hook else {
            return (Vec::new(), Ok(()));
        };
        let status = |code: u16, reason: &str, message: String, details: Option<Value>| {
            let code = if code < 400 { 403 } else { code };
            let mut err = ApiError::new(code, reason, message, details);
            if reason.is_empty()
                && let Some(map) = err.body.as_object_mut()
            {
                map.remove("reason");
            }
            err
        };
        match hook(attempt).await {
            AdmissionVerdict::Allow => (Vec::new(), Ok(())),
            AdmissionVerdict::AllowWithWarnings(warnings) => (warnings, Ok(())),
            AdmissionVerdict::Deny {
                code,
                reason,
                message,
            } => {
                let denied = format!("admission webhook \"{name}\" denied the request");
                let message = if message.is_empty() {
                    format!("{denied} without explanation")
                } else {
                    format!("{denied}: {message}")
                };
                (Vec::new(), Err(status(code, &reason, message, None)))
            }
            AdmissionVerdict::Reject {
                code,
                reason,
                message,
                details,
                warnings,
            } => (warnings, Err(status(code, &reason, message, details))),
        }
    }
}

impl ApiServer {
    /// Calls `hook` on every CREATE, UPDATE (incl. subresources) and DELETE before it is
    /// applied; a [`AdmissionVerdict::Deny`] is answered as webhook `name` denying it. Replaces
    /// an earlier hook.
    pub fn set_admission_hook(
        &self,
        name: &str,
        hook: impl Fn(&AdmissionAttempt) -> AdmissionVerdict + Send + Sync + 'static,
    ) {
        self.set_admission_hook_async(name, move |attempt| {
            let verdict = hook(&attempt);
            Box::pin(async move { verdict })
        });
    }

    /// Like [`Self::set_admission_hook`] for a hook that awaits (e.g. calls a webhook).
    pub fn set_admission_hook_async(
        &self,
        name: &str,
        hook: impl Fn(AdmissionAttempt) -> BoxFuture<'static, AdmissionVerdict> + Send + Sync + 'static,
    ) {
        *lock(&self.shared.hook) = Some((name.to_string(), Arc::new(hook)));
    }

    pub fn clear_admission_hook(&self) {
        *lock(&self.shared.hook) = None;
    }
}
