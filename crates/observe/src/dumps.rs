//! The dumps a support engineer gets -> one [`ControlPlane`], so `quorumguard check` can judge
//! a cluster it cannot reach with the same engine the webhook uses.
//!
//! Objects: what `kubectl get kubeadmcontrolplanes,machines,clusters,machinehealthchecks -n NS
//! -o yaml` prints (a
//! `v1` `List`), multi-document YAML, or JSON (a List or single objects), in v1beta2 or
//! v1beta1. etcd: the `etcdctl` outputs parsed in [`etcdctl`]. Dumps are taken as the present:
//! the snapshot has no age.

pub mod etcdctl;
mod load;

pub use load::{DumpFiles, DumpTexts, Loaded, assemble, load};

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use crate::capi::{self, CapiCluster, CapiError, CapiHealthCheck, CapiKcp, CapiMachine};
use etcdctl::EtcdctlError;
use quorumguard_engine::{
    Cluster, ControlPlane, EtcdState, EtcdTopology, HealthChecks, LABEL_CONTROL_PLANE, Member,
};

/// The command whose output `--objects` expects, for messages.
pub const KUBECTL_GET: &str =
    "kubectl get kubeadmcontrolplanes,machines,clusters,machinehealthchecks -n NAMESPACE -o yaml";

/// Every message names the file and what is wrong with it.
#[derive(Debug, Error)]
pub enum DumpError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: not valid JSON: {source}")]
    Json {
        file: String,
        source: serde_json::Error,
    },
    #[error("{file}: not valid YAML (document {doc}): {source}")]
    Yaml {
        file: String,
        doc: usize,
        source: serde_yaml::Error,
    },
    #[error(
        "{file}: {what} is not a Kubernetes object ({problem}); expected the output of `{KUBECTL_GET}`"
    )]
    NotAnObject {
        file: String,
        what: String,
        problem: String,
    },
    #[error("{file}: {source}")]
    Object { file: String, source: CapiError },
    #[error("{file}: {source}")]
    Etcdctl { file: String, source: EtcdctlError },
    #[error(
        "{file}: no KubeadmControlPlane found (found {found}); expected the output of `{KUBECTL_GET}`"
    )]
    NoKcp { file: String, found: String },
    #[error("{file}: no KubeadmControlPlane {name:?}; found: {choices}")]
    KcpNotFound {
        file: String,
        name: String,
        choices: String,
    },
    #[error("{file}: {count} KubeadmControlPlanes found ({choices}): choose one with --kcp NAME")]
    AmbiguousKcp {
        file: String,
        count: usize,
        choices: String,
    },
    /// Two etcd dumps name different etcd clusters (`header.cluster_id`).
    #[error(
        "{file} comes from etcd cluster {found:x}, {first_file} from etcd cluster {first:x}: \
         the dumps are of different etcd clusters; take them again from the same one"
    )]
    OtherEtcdCluster {
        file: String,
        found: u64,
        first_file: String,
        first: u64,
    },
    /// Not one etcd member of the member list belongs to a Machine of the chosen KCP (boxed:
    /// the largest variant by far, and every `Result` of this module carries it).
    #[error("{0}")]
    NoMemberMatches(Box<NoMemberMatches>),
}

/// What [`DumpError::NoMemberMatches`] names.
#[derive(Debug, Error)]
#[error(
    "no etcd member in {member_list} belongs to a Machine of KubeadmControlPlane {kcp} in \
     {objects}: the members are {members}; {machines}. A member belongs to the Machine whose \
     node (status.nodeRef.name, else the Machine's name) has the member's name: are the dumps \
     of the same cluster?{hint}"
)]
pub struct NoMemberMatches {
    pub member_list: String,
    pub objects: String,
    pub kcp: String,
    pub members: String,
    pub machines: String,
    pub hint: String,
}

/// The Cluster API objects of one dump, parsed; other kinds are named in `ignored`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Objects {
    pub kcps: Vec<CapiKcp>,
    pub machines: Vec<CapiMachine>,
    pub clusters: Vec<CapiCluster>,
    pub health_checks: Vec<CapiHealthCheck>,
    /// "Kind namespace/name" of objects that are not a KCP, Machine, Cluster or
    /// MachineHealthCheck.
    pub ignored: Vec<String>,
}

impl Objects {
    fn found(&self) -> String {
        let mut parts = vec![
            format!("{} Machines", self.machines.len()),
            format!("{} Clusters", self.clusters.len()),
        ];
        if !self.ignored.is_empty() {
            parts.push(format!("other objects: {}", self.ignored.join(", ")));
        }
        parts.join(", ")
    }
}

/// Reads a file, naming it in the error.
pub fn read(path: &Path) -> Result<String, DumpError> {
    std::fs::read_to_string(path).map_err(|source| DumpError::Read {
        file: path.display().to_string(),
        source,
    })
}

/// Parses a kubectl dump: JSON when it starts with `{` or `[`, otherwise (multi-document) YAML.
/// `file` names the source in errors.
pub fn parse_objects(text: &str, file: &str) -> Result<Objects, DumpError> {
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    let docs: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // A stream of JSON values (kubectl prints one per object with some flags).
        serde_json::Deserializer::from_str(trimmed)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|source| DumpError::Json {
                file: file.to_string(),
                source,
            })?
    } else {
        let mut docs = Vec::new();
        for (i, doc) in serde_yaml::Deserializer::from_str(trimmed).enumerate() {
            let v = Value::deserialize(doc).map_err(|source| DumpError::Yaml {
                file: file.to_string(),
                doc: i + 1,
                source,
            })?;
            docs.push(v);
        }
        docs
    };
    let mut objects = Objects::default();
    for (d, doc) in docs.iter().enumerate() {
        let what = if docs.len() > 1 {
            format!("document {}", d + 1)
        } else {
            "the document".to_string()
        };
        add_document(&mut objects, doc, &what, file)?;
    }
    Ok(objects)
}

fn add_document(
    objects: &mut Objects,
    doc: &Value,
    what: &str,
    file: &str,
) -> Result<(), DumpError> {
    let items: Vec<(String, &Value)> = match doc {
        // An empty YAML document (a trailing `---`).
        Value::Null => return Ok(()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("item {} of {what}", i + 1), v))
            .collect(),
        Value::Object(map) => {
            let is_list = map
                .get("kind")
                .and_then(Value::as_str)
                .is_some_and(|k| k.ends_with("List"));
            match map.get("items") {
                Some(Value::Array(items)) if is_list => items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (format!("item {} of {what}", i + 1), v))
                    .collect(),
                Some(Value::Null) if is_list => return Ok(()),
                _ => vec![(what.to_string(), doc)],
            }
        }
        other => {
            return Err(DumpError::NotAnObject {
                file: file.to_string(),
                what: what.to_string(),
                problem: format!("found {}", short(other)),
            });
        }
    };
    for (what, item) in items {
        add_object(objects, item, &what, file)?;
    }
    Ok(())
}

fn add_object(objects: &mut Objects, v: &Value, what: &str, file: &str) -> Result<(), DumpError> {
    let object_err = |source| DumpError::Object {
        file: file.to_string(),
        source,
    };
    if capi::type_of(v).is_none() {
        return Err(DumpError::NotAnObject {
            file: file.to_string(),
            what: what.to_string(),
            problem: if v.is_object() {
                "no apiVersion or kind".to_string()
            } else {
                format!("found {}", short(v))
            },
        });
    }
    if capi::is_kcp(v) {
        objects.kcps.push(capi::parse_kcp(v).map_err(object_err)?);
    } else if capi::is_machine(v) {
        objects
            .machines
            .push(capi::parse_machine(v).map_err(object_err)?);
    } else if capi::is_cluster(v) {
        objects
            .clusters
            .push(capi::parse_cluster(v).map_err(object_err)?);
    } else if capi::is_health_check(v) {
        objects
            .health_checks
            .push(capi::parse_health_check(v).map_err(object_err)?);
    } else {
        objects.ignored.push(capi::describe(v));
    }
    Ok(())
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}...", s.chars().take(60).collect::<String>())
    } else {
        s
    }
}

/// Picks the KCP: the one named by `--kcp` (NAME or NAMESPACE/NAME), or the only one.
pub fn select_kcp<'a>(
    objects: &'a Objects,
    name: Option<&str>,
    file: &str,
) -> Result<&'a CapiKcp, DumpError> {
    let choices = || {
        objects
            .kcps
            .iter()
            .map(|k| format!("{}/{}", k.object.namespace, k.object.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if objects.kcps.is_empty() {
        return Err(DumpError::NoKcp {
            file: file.to_string(),
            found: objects.found(),
        });
    }
    let candidates: Vec<&CapiKcp> = match name {
        None => objects.kcps.iter().collect(),
        Some(n) => {
            let (ns, n) = match n.split_once('/') {
                Some((ns, n)) => (Some(ns), n),
                None => (None, n),
            };
            let found: Vec<&CapiKcp> = objects
                .kcps
                .iter()
                .filter(|k| k.object.name == n && ns.is_none_or(|ns| k.object.namespace == ns))
                .collect();
            if found.is_empty() {
                return Err(DumpError::KcpNotFound {
                    file: file.to_string(),
                    name: name.unwrap_or_default().to_string(),
                    choices: choices(),
                });
            }
            found
        }
    };
    match candidates.as_slice() {
        [one] => Ok(one),
        many => Err(DumpError::AmbiguousKcp {
            file: file.to_string(),
            count: many.len(),
            choices: many
                .iter()
                .map(|k| format!("{}/{}", k.object.namespace, k.object.name))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// Assembles the control plane of `kcp`: its Machines (by the control-plane-name label or the
/// controller ownerReference), its Cluster, and the etcd state. Returns warnings about what
/// was left out or assumed.
pub fn control_plane(
    objects: &Objects,
    kcp: &CapiKcp,
    etcd: EtcdState,
) -> (ControlPlane, Vec<String>) {
    let mut warnings = Vec::new();
    let ns = &kcp.object.namespace;
    let mut seen = BTreeSet::new();
    let mut machines = Vec::new();
    let mut capi_machines = Vec::new();
    for m in objects
        .machines
        .iter()
        .filter(|m| &m.object.namespace == ns)
    {
        match m.control_plane_name.as_deref() {
            Some(n) if n == kcp.object.name => {
                if seen.insert(m.machine.name.clone()) {
                    machines.push(m.machine.clone());
                    capi_machines.push(m);
                } else {
                    warnings.push(format!(
                        "{} appears more than once: the first one is used",
                        m.object
                    ));
                }
            }
            None if m.machine.control_plane => warnings.push(format!(
                "{} has the {LABEL_CONTROL_PLANE} label but names no KubeadmControlPlane: ignored",
                m.object
            )),
            _ => {}
        }
    }
    let cluster_name = kcp
        .cluster_name
        .clone()
        .or_else(|| {
            objects
                .machines
                .iter()
                .filter(|m| &m.object.namespace == ns)
                .filter(|m| m.control_plane_name.as_deref() == Some(&kcp.object.name))
                .find_map(|m| m.cluster_name.clone())
        })
        .or_else(|| {
            objects
                .clusters
                .iter()
                .find(|c| {
                    &c.object.namespace == ns
                        && c.control_plane_name.as_deref() == Some(&kcp.object.name)
                })
                .map(|c| c.object.name.clone())
        });
    let cluster = match cluster_name {
        Some(name) => match objects
            .clusters
            .iter()
            .find(|c| &c.object.namespace == ns && c.object.name == name)
        {
            Some(c) => c.cluster.clone(),
            None => {
                warnings.push(format!(
                    "no Cluster {ns}/{name} in the objects: assuming it is neither being deleted nor paused"
                ));
                Cluster {
                    name,
                    deleting: false,
                    paused: false,
                }
            }
        },
        None => {
            warnings.push(format!(
                "{} names no Cluster (no {} label) and no Machine or Cluster points to one: assuming it is neither being deleted nor paused",
                kcp.object,
                quorumguard_engine::LABEL_CLUSTER_NAME
            ));
            Cluster {
                name: "(unknown)".into(),
                deleting: false,
                paused: false,
            }
        }
    };
    // A dump says nothing of the MachineHealthChecks it does not hold: none may exist, or they
    // were not dumped.
    let health_checks = if objects.health_checks.is_empty() {
        HealthChecks::Unknown {
            reason: format!(
                "the objects dump holds no MachineHealthCheck: none exists, or they were not dumped (`kubectl get machinehealthchecks -n {ns} -o yaml`)"
            ),
        }
    } else {
        HealthChecks::Known(capi::health_checks_of(
            objects
                .health_checks
                .iter()
                .filter(|h| &h.object.namespace == ns),
            &capi_machines,
        ))
    };
    (
        ControlPlane {
            cluster,
            kcp: kcp.kcp.clone(),
            machines,
            etcd,
            health_checks,
        },
        warnings,
    )
}

#[cfg(test)]
mod tests;
