//! The resource types the stand-in serves, and the discovery documents that describe them.

use serde_json::{Value, json};

/// Where a `/scale` subresource reads and writes its numbers (like a CRD's `subresources.scale`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleDef {
    /// JSON pointer of the desired replicas, e.g. `/spec/replicas`.
    pub spec_replicas: String,
    /// JSON pointer of the observed replicas, e.g. `/status/replicas`.
    pub status_replicas: String,
    /// JSON pointer of the label selector string, e.g. `/status/selector`.
    pub label_selector: Option<String>,
}

/// One served resource type (one version of it: the stand-in does no conversion).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    /// `/status` subresource enabled: main-resource writes keep the stored status and
    /// `/status` writes change only `.status` (CRD semantics).
    pub status_subresource: bool,
    pub scale: Option<ScaleDef>,
    /// A CustomResourceDefinition rather than a built-in type: `metadata.generation` is kept,
    /// strategic merge patch is refused with 415, list items carry `kind`/`apiVersion`.
    pub custom: bool,
    /// Short names and categories, as discovery lists them (`kubectl get kcp`, `kubectl get
    /// cluster-api`).
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
}

impl ResourceDef {
    /// A namespaced custom resource with a `/status` subresource.
    pub fn custom(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_ascii_lowercase(),
            namespaced: true,
            status_subresource: true,
            scale: None,
            custom: true,
            short_names: Vec::new(),
            categories: Vec::new(),
        }
    }

    /// With these short names and categories (as the CRD's `names` has them).
    pub fn named(mut self, short_names: &[&str], categories: &[&str]) -> Self {
        self.short_names = short_names.iter().map(|s| s.to_string()).collect();
        self.categories = categories.iter().map(|s| s.to_string()).collect();
        self
    }

    /// A namespaced built-in type without subresources.
    pub fn builtin(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        Self {
            status_subresource: false,
            custom: false,
            ..Self::custom(group, version, kind, plural)
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` (or `plural` for the core group), as error messages spell it.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn verbs() -> Value {
        json!([
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ])
    }

    fn scope(&self) -> &'static str {
        if self.namespaced {
            "Namespaced"
        } else {
            "Cluster"
        }
    }

    /// Entries of an `APIResourceList` (the resource and its subresources).
    fn legacy_entries(&self) -> Vec<Value> {
        let mut main = json!({
            "name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
            "kind": self.kind, "verbs": Self::verbs(),
        });
        self.add_names(&mut main);
        let mut out = vec![main];
        if self.status_subresource {
            out.push(json!({
                "name": format!("{}/status", self.plural), "singularName": "",
                "namespaced": self.namespaced, "kind": self.kind, "verbs": ["get", "patch", "update"],
            }));
        }
        if self.scale.is_some() {
            out.push(json!({
                "name": format!("{}/scale", self.plural), "singularName": "",
                "namespaced": self.namespaced, "group": "autoscaling", "version": "v1",
                "kind": "Scale", "verbs": ["get", "patch", "update"],
            }));
        }
        out
    }

    /// An `APIResourceDiscovery` (aggregated discovery, apidiscovery.k8s.io/v2).
    fn aggregated_entry(&self) -> Value {
        let mut subresources = Vec::new();
        if self.status_subresource {
            subresources.push(json!({
                "subresource": "status",
                "responseKind": {"group": self.group, "version": self.version, "kind": self.kind},
                "verbs": ["get", "patch", "update"],
            }));
        }
        if self.scale.is_some() {
            subresources.push(json!({
                "subresource": "scale",
                "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
                "verbs": ["get", "patch", "update"],
            }));
        }
        let mut entry = json!({
            "resource": self.plural,
            "responseKind": {"group": self.group, "version": self.version, "kind": self.kind},
            "scope": self.scope(), "singularResource": self.singular, "verbs": Self::verbs(),
            "subresources": subresources,
        });
        self.add_names(&mut entry);
        entry
    }

    /// `shortNames` and `categories`, left out when empty as the real server does.
    fn add_names(&self, entry: &mut Value) {
        if !self.short_names.is_empty() {
            entry["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            entry["categories"] = json!(self.categories);
        }
    }
}

/// What the stand-in serves unless told otherwise: the Cluster API kinds quorumguard watches
/// (as CRDs with the status subresource, KCP also with scale) and the built-ins it uses.
pub fn default_resources() -> Vec<ResourceDef> {
    let capi = "cluster.x-k8s.io";
    // Short names and categories as in the Cluster API v1.14 CRDs.
    let mut kcp = ResourceDef::custom(
        "controlplane.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmControlPlane",
        "kubeadmcontrolplanes",
    )
    .named(&["kcp"], &["cluster-api"]);
    kcp.scale = Some(ScaleDef {
        spec_replicas: "/spec/replicas".into(),
        status_replicas: "/status/replicas".into(),
        label_selector: Some("/status/selector".into()),
    });
    vec![
        ResourceDef::custom(capi, "v1beta2", "Cluster", "clusters")
            .named(&["cl"], &["cluster-api"]),
        ResourceDef::custom(capi, "v1beta2", "Machine", "machines")
            .named(&["ma"], &["cluster-api"]),
        ResourceDef::custom(capi, "v1beta2", "MachineHealthCheck", "machinehealthchecks")
            .named(&["mhc", "mhcs"], &["cluster-api"]),
        kcp,
        ResourceDef::builtin("", "v1", "Secret", "secrets"),
        ResourceDef::builtin("", "v1", "ConfigMap", "configmaps"),
        ResourceDef::builtin("", "v1", "Event", "events"),
        ResourceDef::builtin("events.k8s.io", "v1", "Event", "events"),
        ResourceDef::builtin("coordination.k8s.io", "v1", "Lease", "leases"),
    ]
}

/// The non-core groups in first-seen order, each with its versions.
fn groups(defs: &[ResourceDef]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for d in defs.iter().filter(|d| !d.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == d.group) {
            Some((_, versions)) if !versions.contains(&d.version) => {
                versions.push(d.version.clone())
            }
            Some(_) => {}
            None => out.push((d.group.clone(), vec![d.version.clone()])),
        }
    }
    out
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let gv = |v: &String| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    json!({
        "name": group,
        "versions": versions.iter().map(gv).collect::<Vec<_>>(),
        "preferredVersion": versions.first().map(gv).unwrap_or(Value::Null),
    })
}

/// `GET /api` (APIVersions).
pub fn core_versions(addr: &str) -> Value {
    json!({
        "kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}],
    })
}

/// `GET /apis` (APIGroupList).
pub fn group_list(defs: &[ResourceDef]) -> Value {
    let groups: Vec<Value> = groups(defs)
        .iter()
        .map(|(g, vs)| group_entry(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `GET /apis/{group}` (APIGroup), if the group is served.
pub fn group(defs: &[ResourceDef], name: &str) -> Option<Value> {
    let (g, vs) = groups(defs).into_iter().find(|(g, _)| g == name)?;
    let mut entry = group_entry(&g, &vs);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Some(entry)
}

/// `GET /api/v1` or `GET /apis/{group}/{version}` (APIResourceList), if served.
pub fn resource_list(defs: &[ResourceDef], group: &str, version: &str) -> Option<Value> {
    let matching: Vec<&ResourceDef> = defs
        .iter()
        .filter(|d| d.group == group && d.version == version)
        .collect();
    if matching.is_empty() {
        return None;
    }
    let resources: Vec<Value> = matching.iter().flat_map(|d| d.legacy_entries()).collect();
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// Aggregated discovery (`APIGroupDiscoveryList`) for `/api` (`core == true`) or `/apis`.
pub fn aggregated(defs: &[ResourceDef], core: bool) -> Value {
    let group_names: Vec<(String, Vec<String>)> = if core {
        vec![(String::new(), vec!["v1".to_string()])]
    } else {
        groups(defs)
    };
    let items: Vec<Value> = group_names
        .iter()
        .map(|(g, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| {
                    let resources: Vec<Value> = defs
                        .iter()
                        .filter(|d| d.group == *g && d.version == *v)
                        .map(ResourceDef::aggregated_entry)
                        .collect();
                    json!({"version": v, "freshness": "Current", "resources": resources})
                })
                .collect();
            let metadata = if g.is_empty() {
                json!({})
            } else {
                json!({"name": g})
            };
            json!({"metadata": metadata, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// The Content-Type of an aggregated discovery answer.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
