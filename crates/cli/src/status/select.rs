//! Choosing the KubeadmControlPlanes to show from what was listed (`status` and `preflight`
//! alike), and the messages for a Cluster that is not there or has no KubeadmControlPlane, and
//! for a selection that matched none.

use anyhow::{anyhow, bail};
use kube::ResourceExt;

use super::SelectArgs;
use super::mgmt::{Listed, Mgmt, Scope};
use quorumguard_observe::capi::CapiKcp;
use quorumguard_observe::state::{Key, Kind};

/// Why [`select`] found nothing to show.
pub(super) enum Unselected {
    /// No Cluster of that name (nor a KCP naming it) in the namespace: `names` are the Clusters
    /// that are there, for the message.
    UnknownCluster {
        namespace: String,
        name: String,
        names: Vec<String>,
    },
    Other(anyhow::Error),
}

/// The message for a Cluster that is not there: what is there instead, in the namespace, and
/// elsewhere (`elsewhere`, `namespace/name`, when the namespace has none and listing everywhere
/// was allowed).
pub(super) fn unknown_cluster(
    namespace: &str,
    name: &str,
    names: &[String],
    elsewhere: &[String],
) -> String {
    const SHOWN: usize = 20;
    let existing = if names.is_empty() {
        format!("there are no Clusters in namespace {namespace}")
    } else {
        format!("Clusters in namespace {namespace}: {}", names.join(", "))
    };
    let others = if elsewhere.is_empty() {
        String::new()
    } else {
        let more = elsewhere.len().saturating_sub(SHOWN);
        format!(
            "; Clusters in other namespaces: {}{}",
            elsewhere[..elsewhere.len().min(SHOWN)].join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    };
    format!(
        "no Cluster {name:?} in namespace {namespace}; {existing}{others}. Choose one, another \
         namespace with -n NAMESPACE, or list every control plane with -A"
    )
}

/// The KCPs to show, chosen from what was listed.
pub(super) fn select(
    listed: &Listed,
    cluster: Option<&str>,
    scope: &Scope,
) -> Result<Vec<Key>, Unselected> {
    let key = |k: &CapiKcp| (k.object.namespace.clone(), k.object.name.clone());
    let Some(name) = cluster else {
        let mut all: Vec<Key> = listed.kcps.iter().map(key).collect();
        all.sort();
        return Ok(all);
    };
    let Scope::Namespace(ns) = scope else {
        return Err(Unselected::Other(anyhow!(
            "a Cluster cannot be looked up by name across all namespaces: drop -A, or drop the name"
        )));
    };
    let found = listed
        .clusters
        .iter()
        .find(|c| c.object.namespace == *ns && c.object.name == name);
    let by_label: Vec<&CapiKcp> = listed
        .kcps
        .iter()
        .filter(|k| k.object.namespace == *ns && k.cluster_name.as_deref() == Some(name))
        .collect();
    if let Some(c) = found
        && let Some(kcp) = &c.control_plane_name
    {
        return match listed
            .kcps
            .iter()
            .find(|k| k.object.namespace == *ns && k.object.name == *kcp)
        {
            Some(k) => Ok(vec![key(k)]),
            None => Err(Unselected::Other(anyhow!(
                "Cluster {ns}/{name} refers to KubeadmControlPlane {kcp} (spec.controlPlaneRef), \
                 which does not exist in namespace {ns}: `kubectl get kubeadmcontrolplanes -n {ns}` \
                 shows what does"
            ))),
        };
    }
    if !by_label.is_empty() {
        let mut v: Vec<Key> = by_label.into_iter().map(key).collect();
        v.sort();
        return Ok(v);
    }
    if found.is_some() {
        return Err(Unselected::Other(anyhow!(
            "Cluster {ns}/{name} has no KubeadmControlPlane: its spec.controlPlaneRef names none \
             and no KubeadmControlPlane in {ns} carries label cluster.x-k8s.io/cluster-name={name}. \
             quorumguard guards KubeadmControlPlane control planes only"
        )));
    }
    let mut names: Vec<String> = listed
        .clusters
        .iter()
        .filter(|c| c.object.namespace == *ns)
        .map(|c| c.object.name.clone())
        .collect();
    names.sort();
    Err(Unselected::UnknownCluster {
        namespace: ns.clone(),
        name: name.to_string(),
        names,
    })
}

/// The KubeadmControlPlanes `status` shows: the one of Cluster `cluster`, else those named `kcp`,
/// else every one in scope; none is an error.
pub(super) async fn choose(
    mgmt: &Mgmt,
    listed: &Listed,
    cluster: Option<&str>,
    kcp: Option<&str>,
    scope: &Scope,
) -> anyhow::Result<Vec<Key>> {
    let Some(cluster) = cluster else {
        return select_kcps(listed, kcp, scope);
    };
    match select(listed, Some(cluster), scope) {
        Ok(s) => Ok(s),
        Err(Unselected::Other(e)) => Err(e),
        Err(Unselected::UnknownCluster {
            namespace,
            name,
            names,
        }) => {
            let elsewhere = if names.is_empty() {
                clusters_elsewhere(mgmt).await.unwrap_or_default()
            } else {
                Vec::new()
            };
            bail!(unknown_cluster(&namespace, &name, &names, &elsewhere));
        }
    }
}

/// `namespace/name` of every Cluster anywhere, for the message about an unknown Cluster when
/// the namespace has none. Best effort: listing everywhere may be forbidden.
pub(super) async fn clusters_elsewhere(mgmt: &Mgmt) -> Option<Vec<String>> {
    let objects = mgmt.list(Kind::Cluster, &Scope::All).await.ok()?;
    let mut v: Vec<String> = objects
        .iter()
        .map(|o| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()))
        .collect();
    v.sort();
    Some(v)
}

/// Where to list, and the KubeadmControlPlane name asked for (`--kcp`), from the selection flags
/// and the namespace of the kubeconfig's context (kubectl's default): `--kcp NAMESPACE/NAME`
/// names its namespace, else `-n`, else `-A` for every namespace, else the context's.
pub(crate) fn scope_of(
    select: &SelectArgs,
    context_namespace: String,
) -> anyhow::Result<(Scope, Option<String>)> {
    let (kcp_namespace, name) = match select.kcp.as_deref() {
        None => (None, None),
        Some(k) => {
            let (ns, name) = match k.split_once('/') {
                Some((ns, name)) => (Some(ns), name),
                None => (None, k),
            };
            if name.is_empty() || ns.is_some_and(str::is_empty) || name.contains('/') {
                bail!("--kcp {k:?}: expected NAME or NAMESPACE/NAME");
            }
            (ns, Some(name.to_string()))
        }
    };
    if let (Some(n), Some(k)) = (&select.namespace, kcp_namespace)
        && n != k
    {
        bail!(
            "--kcp {} names namespace {k}, -n says {n}",
            select.kcp.as_deref().unwrap_or("")
        );
    }
    let scope = match (kcp_namespace, &select.namespace) {
        (Some(ns), _) => Scope::Namespace(ns.to_string()),
        (None, _) if select.all_namespaces => Scope::All,
        (None, Some(ns)) => Scope::Namespace(ns.clone()),
        (None, None) => Scope::Namespace(context_namespace),
    };
    Ok((scope, name))
}

pub(crate) fn scope_words(scope: &Scope) -> String {
    match scope {
        Scope::Namespace(ns) => format!("namespace {ns}"),
        Scope::All => "any namespace".into(),
    }
}

/// The KubeadmControlPlanes in scope named `name` (all of them without a name), sorted. None is
/// an error: a gate that matched nothing must not pass for one that found nothing wrong.
pub(crate) fn select_kcps(
    listed: &Listed,
    name: Option<&str>,
    scope: &Scope,
) -> anyhow::Result<Vec<Key>> {
    let mut all: Vec<Key> = listed
        .kcps
        .iter()
        .map(|k| (k.object.namespace.clone(), k.object.name.clone()))
        .collect();
    all.sort();
    let Some(name) = name else {
        if all.is_empty() {
            bail!(none_matched(scope));
        }
        return Ok(all);
    };
    let chosen: Vec<Key> = all.iter().filter(|(_, n)| n == name).cloned().collect();
    if chosen.is_empty() {
        let there = if all.is_empty() {
            "there are none".to_string()
        } else {
            format!("there are: {}", shown(&all))
        };
        bail!(
            "no KubeadmControlPlane {name:?} in {}; {there}",
            scope_words(scope)
        );
    }
    Ok(chosen)
}

/// The message for a scope without a KubeadmControlPlane.
pub(crate) fn none_matched(scope: &Scope) -> String {
    match scope {
        Scope::Namespace(ns) => format!(
            "no KubeadmControlPlane matched: there is none in namespace {ns}. Choose the namespace \
             with -n NAMESPACE, or every namespace with -A"
        ),
        Scope::All => "no KubeadmControlPlane matched: there is none in any namespace (is the \
                       kubeconfig's cluster the management cluster?)"
            .to_string(),
    }
}

/// `ns/name, ns/name, ...`, at most 20, then how many more.
pub(crate) fn shown(keys: &[Key]) -> String {
    const SHOWN: usize = 20;
    let mut s: Vec<String> = keys
        .iter()
        .take(SHOWN)
        .map(|(ns, n)| format!("{ns}/{n}"))
        .collect();
    if keys.len() > SHOWN {
        s.push(format!("and {} more", keys.len() - SHOWN));
    }
    s.join(", ")
}
