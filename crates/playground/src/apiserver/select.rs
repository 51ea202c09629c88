//! Label and field selectors, parsed the way kube-apiserver reads the `labelSelector` and
//! `fieldSelector` query parameters.

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equal(String, String),
    NotEqual(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector: every requirement must hold (they are ANDed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    /// Parses `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)` and `k notin (a,b)`, joined by
    /// commas. An empty string selects everything.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text)? {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(Self(requirements))
    }

    /// True when the labels of `object` (its `metadata.labels`) satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            Requirement::Equal(k, v) => label(k) == Some(v.as_str()),
            // Like Kubernetes: `!=` and `notin` also match objects without the label.
            Requirement::NotEqual(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::DoesNotExist(k) => label(k).is_none(),
        })
    }
}

/// Splits on commas that are not inside `( … )`.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    format!("unable to parse requirement: unbalanced ')' in {text:?}")
                })?;
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!(
            "unable to parse requirement: unbalanced '(' in {text:?}"
        ));
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    let bad = || format!("unable to parse requirement: {part:?}");
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(valid_key(key.trim(), part)?));
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Ok(Requirement::NotEqual(
            valid_key(key.trim(), part)?,
            value.trim().to_string(),
        ));
    }
    if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(Requirement::Equal(
            valid_key(key.trim(), part)?,
            value.trim().to_string(),
        ));
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words.as_slice() {
        let rest = rest.trim();
        let (negated, list) = if let Some(list) = rest.strip_prefix("notin") {
            (true, list)
        } else if let Some(list) = rest.strip_prefix("in") {
            (false, list)
        } else {
            return Err(bad());
        };
        let inner = list
            .trim()
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(bad)?;
        let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
        let key = valid_key(key, part)?;
        return Ok(if negated {
            Requirement::NotIn(key, values)
        } else {
            Requirement::In(key, values)
        });
    }
    Ok(Requirement::Exists(valid_key(part, part)?))
}

fn valid_key(key: &str, part: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!(
            "unable to parse requirement: invalid label key in {part:?}"
        ))
    }
}

/// A field selector. Like a CustomResourceDefinition without `selectableFields`, only
/// `metadata.name` and `metadata.namespace` are supported (with `=`, `==` and `!=`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            if field != "metadata.name" && field != "metadata.namespace" {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(Self(terms))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let pointer = if field == "metadata.name" {
                "/metadata/name"
            } else {
                "/metadata/namespace"
            };
            let actual = object
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or("");
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "m1", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selector_forms() {
        let o = obj(json!({"cluster.x-k8s.io/control-plane": "", "tier": "a"}));
        let yes = [
            "",
            "cluster.x-k8s.io/control-plane",
            "tier=a",
            "tier==a",
            "tier!=b",
            "missing!=x",
            "!missing",
            "tier in (a,b)",
            "tier notin (b, c)",
            "missing notin (a)",
            "cluster.x-k8s.io/control-plane=,tier in (a)",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        for s in [
            "tier=b",
            "!tier",
            "missing",
            "tier in (b)",
            "tier notin (a)",
            "tier,missing",
        ] {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        assert!(LabelSelector::parse("tier in (a").is_err());
        assert!(LabelSelector::parse("tier foo (a)").is_err());
    }

    #[test]
    fn field_selector_forms() {
        let o = obj(json!({}));
        assert!(
            FieldSelector::parse("metadata.name=m1")
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("metadata.name!=m2,metadata.namespace==ns")
                .unwrap()
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("metadata.name=m2")
                .unwrap()
                .matches(&o)
        );
        assert_eq!(
            FieldSelector::parse("spec.x=1").unwrap_err(),
            "field label not supported: spec.x"
        );
    }
}
