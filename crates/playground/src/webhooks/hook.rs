//! One webhook of the configuration: checked as the API validates it where it matters here,
//! with kube-apiserver's defaults applied, and matched against a write as `ShouldCallHook` and
//! `rules.Matcher` match it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{RuleWithOperations, ValidatingWebhook};
use serde_json::Value;

use super::DEFAULT_TIMEOUT_SECONDS;
use super::selector::Selector;
use crate::apiserver::{AdmissionAttempt, Operation};

/// One webhook of the configuration, checked and with its defaults applied.
#[derive(Clone, Debug)]
pub(super) struct Hook {
    pub(super) name: String,
    pub(super) rules: Vec<RuleWithOperations>,
    pub(super) namespace_selector: Selector,
    pub(super) object_selector: Selector,
    /// `failurePolicy: Ignore`.
    pub(super) fail_open: bool,
    pub(super) timeout: Duration,
    /// `<path>?timeout=<n>s`: what is sent.
    pub(super) path_and_query: String,
    /// `https://<service>.<ns>.svc:<port><path>?timeout=<n>s`: what kube-apiserver names in
    /// its errors.
    pub(super) url: String,
}

impl Hook {
    pub(super) fn from_webhook(
        w: &ValidatingWebhook,
    ) -> Result<(Self, (String, String, i32)), String> {
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
    pub(super) fn matches(&self, a: &AdmissionAttempt) -> bool {
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

pub(super) fn operation_name(op: Operation) -> &'static str {
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
