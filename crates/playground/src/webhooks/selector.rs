//! Label selectors (`namespaceSelector`, `objectSelector`), parsed and evaluated as
//! kube-apiserver evaluates them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A label selector in the form kube-apiserver evaluates (`LabelSelectorAsSelector`).
#[derive(Clone, Debug, Default)]
pub(super) struct Selector(Vec<Requirement>);

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
    pub(super) fn parse(selector: Option<&LabelSelector>) -> Result<Self, String> {
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

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
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
