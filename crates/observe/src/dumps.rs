//! The dumps a support engineer gets -> one [`ControlPlane`], so `quorumguard check` can judge
//! a cluster it cannot reach with the same engine the webhook uses.
//!
//! Objects: what `kubectl get kubeadmcontrolplanes,machines,clusters,machinehealthchecks -n NS
//! -o yaml` prints (a
//! `v1` `List`), multi-document YAML, or JSON (a List or single objects), in v1beta2 or
//! v1beta1. etcd: the `etcdctl` outputs parsed in [`etcdctl`]. Dumps are taken as the present:
//! the snapshot has no age.

pub mod etcdctl;

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

/// The files of one `check`: objects and member list are required, the rest optional. A member
/// list dump that is empty or holds etcdctl's error (etcdctl 3.5 fails it without a leader)
/// leaves etcd's member list unknown, with what the endpoint status dump saw as the reason.
#[derive(Clone, Copy, Debug)]
pub struct DumpFiles<'a> {
    pub objects: &'a Path,
    pub member_list: &'a Path,
    pub endpoint_status: Option<&'a Path>,
    pub endpoint_health: Option<&'a Path>,
    pub alarms: Option<&'a Path>,
    /// `--kcp`: NAME or NAMESPACE/NAME.
    pub kcp: Option<&'a str>,
}

/// Everything `check` needs from the dumps.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub control_plane: ControlPlane,
    pub kcp: CapiKcp,
    /// Input problems that did not stop the check (ignored entries, assumptions).
    pub warnings: Vec<String>,
}

/// The contents of one `check`'s dumps, each with the name its errors give it.
#[derive(Clone, Copy, Debug)]
pub struct DumpTexts<'a> {
    /// (file name, text) of each dump.
    pub objects: (&'a str, &'a str),
    pub member_list: (&'a str, &'a str),
    pub endpoint_status: Option<(&'a str, &'a str)>,
    pub endpoint_health: Option<(&'a str, &'a str)>,
    pub alarms: Option<(&'a str, &'a str)>,
    /// `--kcp`: NAME or NAMESPACE/NAME.
    pub kcp: Option<&'a str>,
}

fn etcdctl_err(file: &str) -> impl FnOnce(EtcdctlError) -> DumpError + '_ {
    move |source| DumpError::Etcdctl {
        file: file.to_string(),
        source,
    }
}

/// Reads and combines the dump files into one control plane.
pub fn load(files: &DumpFiles) -> Result<Loaded, DumpError> {
    let name = |p: &Path| p.display().to_string();
    let read_named = |p: &Path| read(p).map(|text| (name(p), text));
    let read_opt = |p: Option<&Path>| p.map(read_named).transpose();
    let objects = read_named(files.objects)?;
    let member_list = read_named(files.member_list)?;
    let status = read_opt(files.endpoint_status)?;
    let health = read_opt(files.endpoint_health)?;
    let alarms = read_opt(files.alarms)?;
    fn pair(p: &(String, String)) -> (&str, &str) {
        (&p.0, &p.1)
    }
    assemble(&DumpTexts {
        objects: pair(&objects),
        member_list: pair(&member_list),
        endpoint_status: status.as_ref().map(pair),
        endpoint_health: health.as_ref().map(pair),
        alarms: alarms.as_ref().map(pair),
        kcp: files.kcp,
    })
}

/// Combines the dumps' contents into one control plane: what [`load`] does once the files are
/// read, separate so that the fuzz targets and property tests can feed it any text.
pub fn assemble(texts: &DumpTexts) -> Result<Loaded, DumpError> {
    let (objects_file, objects_text) = texts.objects;
    let objs = parse_objects(objects_text, objects_file)?;
    let kcp = select_kcp(&objs, texts.kcp, objects_file)?.clone();
    let (ml_file, ml_text) = texts.member_list;
    // etcdctl 3.5 fails the member list without a leader: say what the rest of the dumps saw.
    let mut cluster_ids = Vec::new();
    let members = match etcdctl::failed_member_list(ml_text) {
        Some(failed) => Err(failed),
        None => {
            let (members, id) =
                etcdctl::parse_member_list_of_cluster(ml_text).map_err(etcdctl_err(ml_file))?;
            cluster_ids.extend(id.map(|id| (ml_file, id)));
            Ok(members)
        }
    };
    let status = match texts.endpoint_status {
        Some((f, t)) => {
            let status = etcdctl::parse_endpoint_status(t).map_err(etcdctl_err(f))?;
            cluster_ids.extend(status.iter().filter_map(|s| s.cluster_id.map(|id| (f, id))));
            Some(status)
        }
        None => None,
    };
    let health = match texts.endpoint_health {
        Some((f, t)) => Some(etcdctl::parse_endpoint_health(t).map_err(etcdctl_err(f))?),
        None => None,
    };
    let alarms = match texts.alarms {
        Some((f, t)) => {
            let (alarms, id) = etcdctl::parse_alarm_list_of_cluster(t).map_err(etcdctl_err(f))?;
            cluster_ids.extend(id.map(|id| (f, id)));
            alarms
        }
        None => Vec::new(),
    };
    one_etcd_cluster(&cluster_ids)?;
    let (etcd, mut warnings) = match members {
        Ok(members) => {
            let (snapshot, warnings) =
                etcdctl::snapshot(members, status.as_deref(), health.as_deref(), &alarms);
            (EtcdState::Observed(snapshot), warnings)
        }
        Err(failed) => (
            EtcdState::Unknown {
                reason: format!(
                    "no member list: {ml_file}: {failed} (etcdctl 3.5 and later get the member \
                     list only from a leader with its quorum; 3.4's came from the member asked); \
                     endpoint status: {}",
                    etcdctl::endpoints_seen(status.as_deref())
                ),
            },
            Vec::new(),
        ),
    };
    let (control_plane, more) = control_plane(&objs, &kcp, etcd);
    members_belong(&control_plane, &objs, ml_file, objects_file)?;
    warnings.extend(more);
    if !objs.ignored.is_empty() {
        warnings.push(format!(
            "{objects_file}: ignored objects of other kinds: {}",
            objs.ignored.join(", ")
        ));
    }
    Ok(Loaded {
        control_plane,
        kcp,
        warnings,
    })
}

/// Refuses etcd dumps that name different etcd clusters: `(file, header.cluster_id)` of the
/// member list, of each endpoint status entry and of the alarm list, in that order.
fn one_etcd_cluster(ids: &[(&str, u64)]) -> Result<(), DumpError> {
    let Some(&(first_file, first)) = ids.first() else {
        return Ok(());
    };
    match ids.iter().find(|(_, id)| *id != first) {
        Some(&(file, found)) => Err(DumpError::OtherEtcdCluster {
            file: file.to_string(),
            found,
            first_file: first_file.to_string(),
            first,
        }),
        None => Ok(()),
    }
}

/// Refuses a member list of which not one started member belongs to a Machine of the control
/// plane ([`ControlPlane::machine_of`], the engine's own match): the dumps are of different
/// clusters, or the wrong KCP was chosen, and every answer drawn from them would be about
/// nothing. External etcd has no members of Machines; a member list of unstarted members only,
/// or an unknown one, cannot tell.
fn members_belong(
    cp: &ControlPlane,
    objs: &Objects,
    ml_file: &str,
    objects_file: &str,
) -> Result<(), DumpError> {
    if cp.kcp.etcd == EtcdTopology::External {
        return Ok(());
    }
    let started: Vec<&Member> = cp.members().iter().filter(|m| !m.is_unstarted()).collect();
    if started.is_empty() || started.iter().any(|m| cp.machine_of(m).is_some()) {
        return Ok(());
    }
    let members = started
        .iter()
        .map(|m| m.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let machines = if cp.machines.is_empty() {
        "it has no Machines there".to_string()
    } else {
        format!(
            "its Machines are {}",
            cp.machines
                .iter()
                .map(|m| match &m.node_name {
                    Some(node) => format!("{} (node {node})", m.name),
                    None => format!("{} (no node yet)", m.name),
                })
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let hint = if objs.kcps.len() > 1 {
        " Or another KubeadmControlPlane of the objects is meant: choose it with --kcp".to_string()
    } else {
        String::new()
    };
    Err(DumpError::NoMemberMatches(Box::new(NoMemberMatches {
        member_list: ml_file.to_string(),
        objects: objects_file.to_string(),
        kcp: cp.kcp_ref(),
        members,
        machines,
        hint,
    })))
}

#[cfg(test)]
mod tests;
