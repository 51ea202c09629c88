//! Choosing the KubeadmControlPlanes to show from what was listed, and the messages for a
//! Cluster that is not there or has no KubeadmControlPlane.

use anyhow::anyhow;
use kube::ResourceExt;

use super::mgmt::{Listed, Mgmt, Scope};
use crate::capi::CapiKcp;
use crate::state::{Key, Kind};

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
