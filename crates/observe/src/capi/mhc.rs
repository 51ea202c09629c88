//! MachineHealthChecks read from their JSON (a watch, a list, a dump), and which Machines of a
//! control plane each one targets.
//!
//! Cluster API v1.14 `core/reconcilers/machinehealthcheck/`: `getMachinesFromMHC` selects the
//! Machines of the MachineHealthCheck's namespace that match `spec.selector` plus the label
//! `cluster.x-k8s.io/cluster-name: <spec.clusterName>`; `getTargetsFromMHC` leaves out those
//! `shouldSkipRemediation` names (annotated `cluster.x-k8s.io/paused` or
//! `cluster.x-k8s.io/skip-remediation`). `isAllowedRemediation` reads
//! `spec.remediation.triggerIf` (v1beta1: `spec.maxUnhealthy`, `spec.unhealthyRange`) against
//! `status.expectedMachines - status.currentHealthy`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::fields::{at, check_type, invalid, json_type};
use super::{ApiVersion, CapiError, CapiMachine, GROUP_CLUSTER, ObjectRef};
use quorumguard_engine::{HealthCheck, HealthCheckCounts, LABEL_CLUSTER_NAME, Limit, Trigger};

/// Kind of a MachineHealthCheck.
pub const KIND_MHC: &str = "MachineHealthCheck";
/// Annotation that pauses a Cluster API object's reconciler (and leaves a Machine out of every
/// MachineHealthCheck's targets).
pub use quorumguard_engine::ANNOTATION_PAUSED;
/// Annotation that leaves a Machine out of every MachineHealthCheck's targets.
pub const ANNOTATION_SKIP_REMEDIATION: &str = "cluster.x-k8s.io/skip-remediation";

/// A MachineHealthCheck, reduced to what decides whether it passes a remediation on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapiHealthCheck {
    pub object: ObjectRef,
    pub version: ApiVersion,
    /// `spec.clusterName`.
    pub cluster_name: String,
    pub selector: Selector,
    pub paused: bool,
    pub trigger: Trigger,
    pub counts: Option<HealthCheckCounts>,
}

/// A `metav1.LabelSelector`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl Selector {
    /// `metav1.LabelSelectorAsSelector(..).Matches(labels)`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let got = labels.get(&r.key);
                match r.operator {
                    Operator::In => got.is_some_and(|v| r.values.contains(v)),
                    Operator::NotIn => got.is_none_or(|v| !r.values.contains(v)),
                    Operator::Exists => got.is_some(),
                    Operator::DoesNotExist => got.is_none(),
                }
            })
    }
}

impl CapiHealthCheck {
    /// Whether it targets Machine `m` (see the module's note).
    pub fn targets(&self, m: &CapiMachine) -> bool {
        m.object.namespace == self.object.namespace
            && m.labels.get(LABEL_CLUSTER_NAME) == Some(&self.cluster_name)
            && self.selector.matches(&m.labels)
            && !m.machine.annotations.contains_key(ANNOTATION_PAUSED)
            && !m
                .machine
                .annotations
                .contains_key(ANNOTATION_SKIP_REMEDIATION)
    }

    /// The engine's view of it for the control plane whose Machines are `machines`; `None`
    /// when it targets none of them.
    pub fn for_machines<'a>(
        &self,
        machines: impl IntoIterator<Item = &'a CapiMachine>,
    ) -> Option<HealthCheck> {
        let targets: Vec<String> = machines
            .into_iter()
            .filter(|m| self.targets(m))
            .map(|m| m.object.name.clone())
            .collect();
        (!targets.is_empty()).then(|| HealthCheck {
            name: self.object.name.clone(),
            targets,
            paused: self.paused,
            trigger: self.trigger,
            counts: self.counts,
        })
    }
}

/// The MachineHealthChecks among `checks` that target any of `machines`, as the engine sees
/// them, by name.
pub fn health_checks_of<'a>(
    checks: impl IntoIterator<Item = &'a CapiHealthCheck>,
    machines: &[&CapiMachine],
) -> Vec<HealthCheck> {
    let mut out: Vec<HealthCheck> = checks
        .into_iter()
        .filter_map(|hc| hc.for_machines(machines.iter().copied()))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether the value is a MachineHealthCheck (of any version).
pub fn is_health_check(v: &Value) -> bool {
    matches!(super::type_of(v), Some((GROUP_CLUSTER, _, KIND_MHC)))
}

/// Parses a MachineHealthCheck (v1beta2 or v1beta1).
pub fn parse_health_check(v: &Value) -> Result<CapiHealthCheck, CapiError> {
    let described = super::describe(v);
    let s = |path: &[&str]| at(v, path).and_then(Value::as_str);
    let version = check_type(
        described.clone(),
        s(&["apiVersion"]),
        s(&["kind"]),
        GROUP_CLUSTER,
        KIND_MHC,
    )?;
    let object = ObjectRef {
        kind: KIND_MHC.to_string(),
        namespace: s(&["metadata", "namespace"]).unwrap_or("").to_string(),
        name: s(&["metadata", "name"])
            .filter(|n| !n.is_empty())
            .ok_or_else(|| CapiError::MissingField {
                object: described.clone(),
                field: "metadata.name",
            })?
            .to_string(),
    };
    let cluster_name = s(&["spec", "clusterName"])
        .filter(|n| !n.is_empty())
        .ok_or_else(|| CapiError::MissingField {
            object: object.to_string(),
            field: "spec.clusterName",
        })?
        .to_string();
    let selector = selector(at(v, &["spec", "selector"]), &object)?;
    let paused = at(v, &["metadata", "annotations", ANNOTATION_PAUSED]).is_some();
    let (less, range, less_field, range_field) = match version {
        ApiVersion::V1Beta2 => (
            at(
                v,
                &[
                    "spec",
                    "remediation",
                    "triggerIf",
                    "unhealthyLessThanOrEqualTo",
                ],
            ),
            at(v, &["spec", "remediation", "triggerIf", "unhealthyInRange"]),
            "spec.remediation.triggerIf.unhealthyLessThanOrEqualTo",
            "spec.remediation.triggerIf.unhealthyInRange",
        ),
        ApiVersion::V1Beta1 => (
            at(v, &["spec", "maxUnhealthy"]),
            at(v, &["spec", "unhealthyRange"]),
            "spec.maxUnhealthy",
            "spec.unhealthyRange",
        ),
    };
    // The range takes precedence (`isAllowedRemediation`).
    let trigger = match range.and_then(Value::as_str).filter(|r| !r.is_empty()) {
        Some(r) => parse_range(r).ok_or_else(|| {
            invalid(
                &object,
                range_field,
                format!("expected \"[min-max]\", found {r:?}"),
            )
        })?,
        None => match less {
            None => Trigger::default(),
            Some(x) => Trigger::AtMost(limit(x).ok_or_else(|| {
                invalid(
                    &object,
                    less_field,
                    format!("expected a count or a percentage, found {x}"),
                )
            })?),
        },
    };
    let count = |f: &str| at(v, &["status", f]).and_then(Value::as_u64);
    let counts = match (count("expectedMachines"), count("currentHealthy")) {
        (Some(e), Some(h)) => {
            let expected = u32::try_from(e).unwrap_or(u32::MAX);
            let healthy = u32::try_from(h).unwrap_or(u32::MAX);
            Some(HealthCheckCounts {
                expected,
                unhealthy: expected.saturating_sub(healthy),
            })
        }
        _ => None,
    };
    Ok(CapiHealthCheck {
        object,
        version,
        cluster_name,
        selector,
        paused,
        trigger,
        counts,
    })
}

fn parse_range(r: &str) -> Option<Trigger> {
    let inner = r.strip_prefix('[')?.strip_suffix(']')?;
    let (min, max) = inner.split_once('-')?;
    let (min, max) = (min.parse::<u32>().ok()?, max.parse::<u32>().ok()?);
    (min <= max).then_some(Trigger::InRange { min, max })
}

fn limit(v: &Value) -> Option<Limit> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Limit::Count),
        Value::String(s) => match s.trim().strip_suffix('%') {
            Some(p) => p.trim().parse().ok().map(Limit::Percent),
            None => s.trim().parse().ok().map(Limit::Count),
        },
        _ => None,
    }
}

fn selector(v: Option<&Value>, object: &ObjectRef) -> Result<Selector, CapiError> {
    const FIELD: &str = "spec.selector";
    let Some(v) = v else {
        return Ok(Selector::default());
    };
    let bad = |what: String| invalid(object, FIELD, what);
    let mut out = Selector::default();
    if let Some(ml) = at(v, &["matchLabels"]) {
        let map = ml.as_object().ok_or_else(|| {
            bad(format!(
                "matchLabels: expected a map, found {}",
                json_type(ml)
            ))
        })?;
        for (k, val) in map {
            let val = val
                .as_str()
                .ok_or_else(|| bad(format!("matchLabels.{k}: expected a string")))?;
            out.match_labels.insert(k.clone(), val.to_string());
        }
    }
    if let Some(me) = at(v, &["matchExpressions"]) {
        let list = me.as_array().ok_or_else(|| {
            bad(format!(
                "matchExpressions: expected a list, found {}",
                json_type(me)
            ))
        })?;
        for e in list {
            let key = at(e, &["key"]).and_then(Value::as_str).unwrap_or("");
            let operator = match at(e, &["operator"]).and_then(Value::as_str) {
                Some("In") => Operator::In,
                Some("NotIn") => Operator::NotIn,
                Some("Exists") => Operator::Exists,
                Some("DoesNotExist") => Operator::DoesNotExist,
                other => {
                    return Err(bad(format!(
                        "matchExpressions: operator {other:?} is not In, NotIn, Exists or DoesNotExist"
                    )));
                }
            };
            let values = at(e, &["values"])
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            out.match_expressions.push(Requirement {
                key: key.to_string(),
                operator,
                values,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::capi::parse_machine;

    fn machine(name: &str, cluster: &str, annotations: Value) -> CapiMachine {
        parse_machine(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": {
                "name": name, "namespace": "ns",
                "labels": {
                    "cluster.x-k8s.io/cluster-name": cluster,
                    "cluster.x-k8s.io/control-plane": "",
                    "cluster.x-k8s.io/control-plane-name": "kcp",
                },
                "annotations": annotations,
            },
            "spec": {"clusterName": cluster},
        }))
        .expect("machine")
    }

    fn v1beta2(spec: Value, status: Value) -> CapiHealthCheck {
        parse_health_check(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "MachineHealthCheck",
            "metadata": {"name": "cp-mhc", "namespace": "ns"},
            "spec": spec,
            "status": status,
        }))
        .expect("mhc")
    }

    #[test]
    fn v1beta2_trigger_counts_and_targets() {
        let hc = v1beta2(
            json!({
                "clusterName": "c",
                "selector": {"matchLabels": {"cluster.x-k8s.io/control-plane": ""}},
                "remediation": {"triggerIf": {"unhealthyLessThanOrEqualTo": "40%"}},
            }),
            json!({"expectedMachines": 3, "currentHealthy": 2}),
        );
        assert_eq!(hc.trigger, Trigger::AtMost(Limit::Percent(40)));
        assert_eq!(
            hc.counts,
            Some(HealthCheckCounts {
                expected: 3,
                unhealthy: 1
            })
        );
        let a = machine("a", "c", json!({}));
        let other = machine("b", "other", json!({}));
        let skipped = machine("s", "c", json!({ANNOTATION_SKIP_REMEDIATION: ""}));
        let paused = machine("p", "c", json!({ANNOTATION_PAUSED: ""}));
        assert!(hc.targets(&a));
        assert!(!hc.targets(&other), "another cluster's Machine");
        assert!(!hc.targets(&skipped));
        assert!(!hc.targets(&paused));
        let checks = health_checks_of([&hc], &[&a, &other, &skipped]);
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].targets, vec!["a".to_string()]);
        // The range takes precedence; a selector that takes workers only covers none.
        let hc = v1beta2(
            json!({
                "clusterName": "c",
                "selector": {"matchExpressions": [
                    {"key": "cluster.x-k8s.io/control-plane", "operator": "DoesNotExist"}
                ]},
                "remediation": {"triggerIf": {"unhealthyLessThanOrEqualTo": 1, "unhealthyInRange": "[1-2]"}},
            }),
            json!({}),
        );
        assert_eq!(hc.trigger, Trigger::InRange { min: 1, max: 2 });
        assert_eq!(hc.counts, None);
        assert!(!hc.targets(&a));
        assert!(health_checks_of([&hc], &[&a]).is_empty());
    }

    #[test]
    fn v1beta1_fields_and_pause() {
        let hc = parse_health_check(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1",
            "kind": "MachineHealthCheck",
            "metadata": {"name": "m", "namespace": "ns", "annotations": {ANNOTATION_PAUSED: ""}},
            "spec": {"clusterName": "c", "selector": {}, "maxUnhealthy": 2},
        }))
        .expect("mhc");
        assert!(hc.paused);
        assert_eq!(hc.trigger, Trigger::AtMost(Limit::Count(2)));
        let bad = parse_health_check(&json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "MachineHealthCheck",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"clusterName": "c", "remediation": {"triggerIf": {"unhealthyInRange": "[3-1]"}}},
        }))
        .expect_err("a range whose max is below its min");
        assert!(
            bad.to_string()
                .contains("spec.remediation.triggerIf.unhealthyInRange"),
            "{bad}"
        );
    }
}
