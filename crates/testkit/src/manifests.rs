//! The kustomize base in `manifests/` as `kubectl kustomize` renders it, for the tests that read
//! the manifests (`tests/it/manifests.rs`) and those that apply them to a real kube-apiserver
//! (`tests/slow/real_apiserver.rs`).
//!
//! Without `kubectl` (neither /usr/bin/kubectl nor one on PATH), the raw YAML files are read
//! instead, with the little of kustomize these manifests use applied by hand (resources,
//! components, the annotation patch, images); a message says so. Setting
//! `QUORUMGUARD_TEST_MANIFESTS_RAW=1` forces that path.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

const KUSTOMIZE_TIMEOUT: Duration = Duration::from_secs(60);

pub fn manifests_dir() -> PathBuf {
    crate::paths::repo_root().join("manifests")
}

/// Set to exercise the fallback on a machine that has kubectl.
pub const FORCE_RAW_ENV: &str = "QUORUMGUARD_TEST_MANIFESTS_RAW";

pub fn kubectl() -> Option<PathBuf> {
    if std::env::var_os(FORCE_RAW_ENV).is_some() {
        return None;
    }
    let usr = PathBuf::from("/usr/bin/kubectl");
    if usr.is_file() {
        return Some(usr);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
}

/// The objects of a kustomization, rendered by kubectl when there is one.
pub fn render(dir: &Path) -> Vec<Value> {
    match kubectl() {
        Some(kubectl) => kustomize(&kubectl, dir),
        None => {
            eprintln!(
                "manifests test: kubectl not found (/usr/bin/kubectl or on PATH): reading the raw \
                 YAML of {} instead of `kubectl kustomize`; install kubectl for the real render",
                dir.display()
            );
            fallback::render(dir)
        }
    }
}

/// `kubectl kustomize DIR`, output in a file (no pipe to fill), killed after a minute.
fn kustomize(kubectl: &Path, dir: &Path) -> Vec<Value> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let tmp = crate::paths::target_tmp();
    let out = tmp.join(format!("manifests-{}-{n}.yaml", std::process::id()));
    let err = tmp.join(format!("manifests-{}-{n}.err", std::process::id()));
    let mut child = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .expect("run kubectl kustomize");
    let deadline = Instant::now() + KUSTOMIZE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "kubectl kustomize {} took over {KUSTOMIZE_TIMEOUT:?}",
                dir.display()
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    let yaml = fs::read_to_string(&out).unwrap();
    let stderr = fs::read_to_string(&err).unwrap();
    let _ = fs::remove_file(out);
    let _ = fs::remove_file(err);
    assert!(
        status.success(),
        "kubectl kustomize {} failed:\n{stderr}",
        dir.display()
    );
    parse_yaml(&yaml)
}

/// The documents of a multi-document YAML text (empty ones dropped); invalid YAML fails the test.
pub fn parse_yaml(yaml: &str) -> Vec<Value> {
    quorumguard::playground::realapi::parse_yaml(yaml)
        .unwrap_or_else(|e| panic!("invalid YAML: {e}"))
}

/// The little of kustomize these manifests use, for machines without kubectl.
mod fallback {
    use super::*;

    pub fn render(dir: &Path) -> Vec<Value> {
        let mut objects = Vec::new();
        let mut images = Vec::new();
        collect(dir, &mut objects, &mut images);
        for image in images {
            let name = image["name"].as_str().unwrap_or_default();
            let new = format!(
                "{}:{}",
                image["newName"].as_str().unwrap_or(name),
                image["newTag"].as_str().unwrap_or("latest")
            );
            for o in objects.iter_mut().filter(|o| o["kind"] == "Deployment") {
                let containers = o["spec"]["template"]["spec"]["containers"].as_array_mut();
                for c in containers.into_iter().flatten() {
                    if c["image"] == name {
                        c["image"] = Value::String(new.clone());
                    }
                }
            }
        }
        objects
    }

    fn collect(dir: &Path, objects: &mut Vec<Value>, images: &mut Vec<Value>) {
        let text = fs::read_to_string(dir.join("kustomization.yaml"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let k = &parse_yaml(&text)[0];
        let entries = |key: &str| -> Vec<String> {
            k[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        for entry in entries("resources")
            .into_iter()
            .chain(entries("components"))
        {
            let path = dir.join(&entry);
            if path.is_dir() {
                collect(&path, objects, images);
            } else {
                let text = fs::read_to_string(&path).unwrap();
                objects.extend(parse_yaml(&text));
            }
        }
        images.extend(k["images"].as_array().cloned().unwrap_or_default());
        // Patches: only metadata.annotations are merged (what the cert-manager component does).
        for patch in k["patches"].as_array().cloned().unwrap_or_default() {
            let text = fs::read_to_string(dir.join(patch["path"].as_str().unwrap())).unwrap();
            let p = &parse_yaml(&text)[0];
            for o in objects.iter_mut() {
                if o["kind"] == p["kind"] && o["metadata"]["name"] == p["metadata"]["name"] {
                    let src = p["metadata"]["annotations"]
                        .as_object()
                        .cloned()
                        .unwrap_or_default();
                    let meta = o["metadata"].as_object_mut().unwrap();
                    let dst = meta
                        .entry("annotations")
                        .or_insert_with(|| Value::Object(Default::default()));
                    dst.as_object_mut().unwrap().extend(src);
                }
            }
        }
    }
}
