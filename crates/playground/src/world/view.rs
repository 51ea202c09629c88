//! The workload cluster's objects as the playground reads them: the KCP, the conditions
//! quorumguard published on it, and the control-plane Machines.

use serde_json::Value;

use super::{KCP, NAMESPACE, World};
use crate::apiserver::{health_check_resource, kcp_resource, machine_resource};
use crate::status::conditions::{CONDITION_ETCD_QUORUM, CONDITION_NEXT_ACTION};
use quorumguard_observe::capi::{self, CapiHealthCheck, CapiMachine};

/// One KCP condition as published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Both quorumguard conditions of the KCP, when published.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Conditions {
    pub quorum: Option<Published>,
    pub next_action: Option<Published>,
}

impl Conditions {
    /// The NextAction reason, or "" before the first publication.
    pub fn action(&self) -> &str {
        self.next_action.as_ref().map_or("", |c| c.reason.as_str())
    }

    /// The EtcdQuorum reason, or "".
    pub fn quorum_reason(&self) -> &str {
        self.quorum.as_ref().map_or("", |c| c.reason.as_str())
    }

    /// The Machine the NextAction names (its message starts with `Machine <ns>/<name>`).
    pub fn action_target(&self) -> Option<String> {
        let message = &self.next_action.as_ref()?.message;
        let prefix = format!("Machine {NAMESPACE}/");
        let rest = &message[message.find(&prefix)? + prefix.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
            .collect();
        (!name.is_empty()).then_some(name)
    }
}

/// A Machine as the playground's controllers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineView {
    pub name: String,
    pub version: String,
    pub deleting: bool,
    pub finalizers: Vec<String>,
    pub annotations: Vec<(String, String)>,
    pub created: String,
    /// `status.nodeRef.name`: by kubeadm's convention also its etcd member's name.
    pub node: Option<String>,
    /// A MachineHealthCheck targets it and would mark it for remediation if it were annotated
    /// remediate-machine ([`World::machines`]): only then does KCP act on the annotation.
    pub remediable: bool,
}

impl MachineView {
    pub fn has_annotation(&self, key: &str) -> bool {
        self.annotations.iter().any(|(k, _)| k == key)
    }
}

/// The simulated MachineHealthCheck reconciler's answer for Machine `name` (Cluster API v1.14
/// `core/reconcilers/machinehealthcheck/`): one that targets it (`getTargetsFromMHC`), is not
/// paused, and whose short-circuit (`isAllowedRemediation`) allows remediation with it marked.
/// It counts as unhealthy only the Machines annotated remediate-machine (`needsRemediation`):
/// the playground has no Nodes whose conditions it could read.
fn remediable(checks: &[CapiHealthCheck], machines: &[CapiMachine], name: &str) -> bool {
    let Some(m) = machines.iter().find(|m| m.object.name == name) else {
        return false;
    };
    let marked = |x: &CapiMachine| {
        x.machine
            .annotations
            .contains_key(crate::engine::model::ANNOTATION_REMEDIATE)
    };
    checks.iter().any(|hc| {
        let targets: Vec<&CapiMachine> = machines.iter().filter(|x| hc.targets(x)).collect();
        let expected = u32::try_from(targets.len()).unwrap_or(u32::MAX);
        let unhealthy = targets.iter().filter(|x| marked(x)).count() + usize::from(!marked(m));
        hc.targets(m)
            && !hc.paused
            && hc
                .trigger
                .allows(u32::try_from(unhealthy).unwrap_or(u32::MAX), expected)
    })
}

impl World {
    /// The KCP as stored.
    pub fn kcp(&self) -> Option<Value> {
        self.api.get(&kcp_resource(), NAMESPACE, KCP)
    }

    /// The KCP's `spec.replicas` and `spec.version`.
    pub fn kcp_spec(&self) -> (u64, String) {
        let kcp = self.kcp().unwrap_or_default();
        (
            kcp["spec"]["replicas"].as_u64().unwrap_or(0),
            kcp["spec"]["version"].as_str().unwrap_or("").to_string(),
        )
    }

    /// quorumguard's two conditions on the KCP.
    pub fn conditions(&self) -> Conditions {
        let kcp = self.kcp().unwrap_or_default();
        let mut out = Conditions::default();
        for c in kcp["status"]["conditions"].as_array().into_iter().flatten() {
            let published = Published {
                status: c["status"].as_str().unwrap_or("").to_string(),
                reason: c["reason"].as_str().unwrap_or("").to_string(),
                message: c["message"].as_str().unwrap_or("").to_string(),
            };
            match c["type"].as_str() {
                Some(CONDITION_ETCD_QUORUM) => out.quorum = Some(published),
                Some(CONDITION_NEXT_ACTION) => out.next_action = Some(published),
                _ => {}
            }
        }
        out
    }

    /// The MachineHealthChecks of the namespace, as the guard parses them (unreadable ones
    /// left out: the simulated reconciler cannot use them either).
    pub fn health_checks(&self) -> Vec<CapiHealthCheck> {
        self.api
            .list(&health_check_resource())
            .iter()
            .filter(|h| h["metadata"]["namespace"] == NAMESPACE)
            .filter_map(|h| capi::parse_health_check(h).ok())
            .collect()
    }

    /// The control-plane Machines, oldest first (then by name).
    pub fn machines(&self) -> Vec<MachineView> {
        let listed: Vec<Value> = self
            .api
            .list(&machine_resource())
            .into_iter()
            .filter(|m| m["metadata"]["namespace"] == NAMESPACE)
            .collect();
        let parsed: Vec<CapiMachine> = listed
            .iter()
            .filter_map(|m| capi::parse_machine(m).ok())
            .collect();
        let checks = self.health_checks();
        let mut out: Vec<MachineView> = listed
            .iter()
            .map(|m| {
                let meta = &m["metadata"];
                let name = meta["name"].as_str().unwrap_or("");
                MachineView {
                    name: meta["name"].as_str().unwrap_or("").to_string(),
                    version: m["spec"]["version"].as_str().unwrap_or("").to_string(),
                    deleting: !meta["deletionTimestamp"].is_null(),
                    finalizers: meta["finalizers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|f| f.as_str().map(str::to_string))
                        .collect(),
                    annotations: meta["annotations"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                        .collect(),
                    created: meta["creationTimestamp"].as_str().unwrap_or("").to_string(),
                    node: m["status"]["nodeRef"]["name"].as_str().map(str::to_string),
                    remediable: remediable(&checks, &parsed, name),
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
        out
    }
}
