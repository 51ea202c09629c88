//! One `check`'s set of dump files -> a [`ControlPlane`]: each etcdctl dump parsed, then held
//! to the objects (one etcd cluster, members that belong to the chosen control plane's
//! Machines), so a dump of another cluster is refused rather than judged.

use super::*;
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
