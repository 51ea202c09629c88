//! The AdmissionReview request envelope, borrowed from the body: every string the rules or the
//! answer read is a [`Str`] pointing into the request bytes (copied only when it holds a JSON
//! escape), and what is never read (`options`, `requestKind`, ...) is checked for its type and
//! skipped without being built (`userInfo.extra` is kept as borrowed strings).
//!
//! Why our own instead of kube's `AdmissionRequest`: kube's owns every string, builds
//! `options` as a `serde_json::Value` tree and `userInfo.extra` as a map of vectors, about forty
//! allocations per review that nothing reads (`cargo bench --bench core -- review`). The
//! envelope accepts exactly the bodies kube's type accepts (same required fields, same types,
//! same names in the messages: the structs are named after kube's), which the test
//! `the_envelope_accepts_what_kubes_request_accepts` checks against kube's type.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use kube::core::admission::Operation;
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};

use quorumguard_observe::capi::ObjectParts;

/// A JSON string borrowed from the body, or owned when it had to be unescaped.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Str<'a>(pub Cow<'a, str>);

impl Str<'_> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(s)))
            }
        }
        d.deserialize_string(V)
    }
}

/// The body as sent: kube's `AdmissionReview` without its `#[serde(flatten)]` type fields (they
/// make serde buffer the whole body into an intermediate tree first).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Body<'a> {
    #[serde(borrow)]
    pub api_version: Option<Str<'a>>,
    #[serde(borrow)]
    pub kind: Str<'a>,
    #[serde(borrow)]
    pub request: Option<AdmissionRequest<'a>>,
}

/// kube's `AdmissionRequest<ObjectParts>`, its strings borrowed.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest<'a> {
    #[serde(borrow)]
    pub uid: Str<'a>,
    #[serde(borrow)]
    pub kind: GroupVersionKind<'a>,
    #[serde(borrow)]
    pub resource: GroupVersionResource<'a>,
    #[serde(default, borrow)]
    pub sub_resource: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub request_kind: Option<GroupVersionKind<'a>>,
    #[serde(default, borrow)]
    pub request_resource: Option<GroupVersionResource<'a>>,
    #[serde(default, borrow)]
    pub request_sub_resource: Option<Str<'a>>,
    #[serde(default, borrow)]
    pub name: Str<'a>,
    #[serde(default, borrow)]
    pub namespace: Option<Str<'a>>,
    pub operation: Operation,
    #[serde(borrow)]
    pub user_info: UserInfo<'a>,
    pub object: Option<ObjectParts>,
    pub old_object: Option<ObjectParts>,
    #[serde(default)]
    pub dry_run: bool,
    /// Any JSON value (kube's `RawExtension`); never read.
    #[serde(default)]
    pub options: Option<IgnoredAny>,
}

#[derive(Deserialize)]
pub struct GroupVersionKind<'a> {
    #[serde(borrow)]
    pub group: Str<'a>,
    #[serde(borrow)]
    pub version: Str<'a>,
    #[serde(borrow)]
    pub kind: Str<'a>,
}

#[derive(Deserialize)]
pub struct GroupVersionResource<'a> {
    #[serde(borrow)]
    pub group: Str<'a>,
    #[serde(borrow)]
    pub version: Str<'a>,
    #[serde(borrow)]
    pub resource: Str<'a>,
    #[serde(default, rename = "apiVersion")]
    pub api_version: Option<IgnoredAny>,
}

/// `authentication.k8s.io/v1` UserInfo: the name and groups are read; `extra` must be a map of
/// string lists, as k8s-openapi's type requires. Only a map is a UserInfo
/// (serde's derived structs would take a sequence too), as k8s-openapi's own deserializer has it.
pub struct UserInfo<'a> {
    pub username: Option<Str<'a>>,
    pub groups: Option<Vec<Str<'a>>>,
}

#[derive(Deserialize)]
struct UserInfoFields<'a> {
    #[serde(default, borrow)]
    username: Option<Str<'a>>,
    #[serde(default, borrow)]
    #[allow(dead_code)]
    uid: Option<Str<'a>>,
    #[serde(default, borrow)]
    groups: Option<Vec<Str<'a>>>,
    #[serde(default, borrow)]
    #[allow(dead_code)]
    extra: Option<BTreeMap<Str<'a>, Vec<Str<'a>>>>,
}

impl<'de: 'a, 'a> Deserialize<'de> for UserInfo<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UserInfo<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("UserInfo")
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<Self::Value, A::Error> {
                let f = UserInfoFields::deserialize(de::value::MapAccessDeserializer::new(m))?;
                Ok(UserInfo {
                    username: f.username,
                    groups: f.groups,
                })
            }
        }
        // As a struct, so that serde_json reports a wrong type where k8s-openapi's does.
        d.deserialize_struct("UserInfo", &["extra", "groups", "uid", "username"], V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::admission::AdmissionRequest as KubeRequest;
    use quorumguard_observe::capi::testkit::review as fixture;
    use serde_json::{Value, json};

    /// Every field of the request, and some inside it, set to every kind of JSON value or removed:
    /// the envelope accepts a request exactly when kube's `AdmissionRequest` (what the webhook
    /// decoded before) does, and when both refuse, they say the same.
    #[test]
    fn the_envelope_accepts_what_kubes_request_accepts() {
        let values = [
            None,
            Some(Value::Null),
            Some(json!(5)),
            Some(json!(-1.5)),
            Some(json!(true)),
            Some(json!("x")),
            Some(json!("esc\"aped")),
            Some(json!([])),
            Some(json!(["a", "b"])),
            Some(json!([1])),
            Some(json!({})),
            Some(json!({"a": ["b"]})),
            Some(json!({"a": "b"})),
            Some(json!({"group": "g", "version": "v", "kind": "K", "resource": "r"})),
        ];
        let paths: &[&[&str]] = &[
            &["uid"],
            &["kind"],
            &["kind", "group"],
            &["kind", "kind"],
            &["resource"],
            &["resource", "resource"],
            &["resource", "apiVersion"],
            &["subResource"],
            &["requestKind"],
            &["requestKind", "version"],
            &["requestResource"],
            &["requestSubResource"],
            &["name"],
            &["namespace"],
            &["operation"],
            &["userInfo"],
            &["userInfo", "username"],
            &["userInfo", "uid"],
            &["userInfo", "groups"],
            &["userInfo", "extra"],
            &["object"],
            &["oldObject"],
            &["dryRun"],
            &["options"],
            &["unknownField"],
        ];
        let mut compared = 0;
        for file in [
            "machine-delete-by-user.json",
            "kcp-update-replicas-5-to-3.json",
            "kcp-scale-subresource-3-to-5.json",
        ] {
            let base = fixture(file)["request"].clone();
            for path in paths {
                for value in &values {
                    let mut r = base.clone();
                    let (last, parents) = path.split_last().expect("path");
                    let mut at = &mut r;
                    for p in parents {
                        at = &mut at[*p];
                    }
                    let Some(map) = at.as_object_mut() else {
                        continue;
                    };
                    match value {
                        None => {
                            map.remove(*last);
                        }
                        Some(v) => {
                            map.insert(last.to_string(), v.clone());
                        }
                    }
                    let body = serde_json::to_vec(&r).expect("json");
                    let kubes = serde_json::from_slice::<KubeRequest<ObjectParts>>(&body)
                        .map(|_| ())
                        .map_err(|e| e.to_string());
                    let ours = serde_json::from_slice::<AdmissionRequest>(&body)
                        .map(|_| ())
                        .map_err(|e| e.to_string());
                    assert_eq!(ours, kubes, "{file}: {path:?} = {value:?}");
                    compared += 1;
                }
            }
        }
        assert!(compared > 900, "{compared}");
    }

    #[test]
    fn strings_are_borrowed_unless_escaped() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"","version":"v1","kind":"K"},"resource":{"group":"","version":"v1","resource":"ks"},"name":"a\"b","operation":"DELETE","userInfo":{"username":"jane"}}}"#;
        let b: Body = serde_json::from_slice(body).expect("decodes");
        let r = b.request.expect("request");
        assert!(matches!(r.uid.0, Cow::Borrowed("u1")));
        assert!(matches!(r.name.0, Cow::Owned(ref s) if s == "a\"b"));
        assert_eq!(r.user_info.username.map(|u| u.0), Some("jane".into()));
    }
}
