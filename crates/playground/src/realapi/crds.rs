//! The Cluster API CRDs on the real API server: where they are read from, creating them, and
//! waiting until each is established.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde::Deserialize;
use serde_json::Value;

use super::{CRDS_VAR, RealApiError, poll};

/// The files the CRD directory must hold (cluster-api v1.14's), for the error that says what
/// is missing.
pub const CRD_FILES: &str = "cluster.x-k8s.io_clusters.yaml, cluster.x-k8s.io_machines.yaml and \
     controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml (cluster-api v1.14's config/crd/bases)";

/// The YAML files in `dir`, sorted; an error saying what is missing and how to get it when there
/// are none.
pub fn crd_files(dir: &Path) -> Result<Vec<PathBuf>, RealApiError> {
    let missing = |problem: String| {
        RealApiError::Missing(format!(
            "the Cluster API CRDs: {problem}; pass --capi-crds DIR or set {CRDS_VAR} to a directory \
         holding {CRD_FILES}"
        ))
    };
    let entries = std::fs::read_dir(dir)
        .map_err(|e| missing(format!("cannot read {}: {e}", dir.display())))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(missing(format!("no .yaml files in {}", dir.display())));
    }
    Ok(files)
}

/// The documents of a multi-document YAML text (empty ones dropped).
pub fn parse_yaml(yaml: &str) -> Result<Vec<Value>, serde_yaml::Error> {
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v = Value::deserialize(doc)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn crd_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "customresourcedefinitions"),
    )
}

/// Creates every CRD in `dir`'s YAML files and waits (bounded by `bound`) until each is
/// established.
pub async fn install_crds(
    client: &Client,
    dir: &Path,
    bound: Duration,
) -> Result<(), RealApiError> {
    let failed = |problem: String| RealApiError::Crds {
        dir: dir.to_path_buf(),
        problem,
    };
    let crds = crd_api(client);
    let mut names = Vec::new();
    for file in crd_files(dir)? {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| failed(format!("read {}: {e}", file.display())))?;
        let docs = parse_yaml(&text).map_err(|e| failed(format!("{}: {e}", file.display())))?;
        for crd in docs {
            let object: DynamicObject = serde_json::from_value(crd)
                .map_err(|e| failed(format!("{}: not an object: {e}", file.display())))?;
            let name = object.metadata.name.clone().unwrap_or_default();
            crds.create(&PostParams::default(), &object)
                .await
                .map_err(|e| failed(format!("create CRD {name}: {e}")))?;
            names.push(name);
        }
    }
    for name in names {
        let established = poll(bound, || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let crd = crds.get(&name).await.ok()?;
                let conditions = crd.data["status"]["conditions"].as_array()?.clone();
                conditions
                    .iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
                    .then_some(())
            }
        })
        .await;
        if established.is_none() {
            return Err(failed(format!(
                "CRD {name} not established within {bound:?}"
            )));
        }
    }
    Ok(())
}
