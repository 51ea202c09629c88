//! The real kube-apiserver for tests, started the way controller-runtime's envtest starts it: a
//! directory named by `KUBEBUILDER_ASSETS` holds `kube-apiserver` and `etcd` (setup-envtest's
//! directory works as is; `.ci/run` unpacks `../shared/envtest/` and links Debian's etcd).
//!
//! [`Envtest::start`] runs, on loopback ports picked free:
//! - etcd (one member, plain HTTP: the API server's own storage, not a workload cluster's);
//! - kube-apiserver with certificates of its own (a CA, a serving certificate for 127.0.0.1, an
//!   admin client certificate in `system:masters`, a service-account signing key), RBAC, the
//!   admission webhooks, and an audit log of every request (so a test can prove that nothing
//!   was refused with 403);
//! - the Cluster API v1.14 CRDs (Cluster, Machine, KubeadmControlPlane) from
//!   `../shared/capi-crds/` beside the repository (or `QUORUMGUARD_CAPI_CRDS`), established.
//!
//! Every process is killed by its PID when its owner is dropped, also when a test panics, and
//! the kernel kills it if the test process itself dies (`PR_SET_PDEATHSIG`, through
//! [`quorumguard::playground::child`], as the workload etcd members are): a timeout killing the
//! test binary leaves nothing behind.
//!
//! One API server runs per test binary at a time (a global slot, like the etcd slot): the
//! machines are 2-core.
//!
//! Without `KUBEBUILDER_ASSETS`, [`assets`] prints one line saying the test is skipped and why,
//! and the test returns (passes). With `QUORUMGUARD_REQUIRE_ENVTEST` set (CI sets it), a missing
//! `KUBEBUILDER_ASSETS` fails the test instead.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use quorumguard::playground::realapi::{self, RealApi};
use serde_json::{Value, json};

use super::https::{TestPki, try_get_plain};

pub use quorumguard::playground::realapi::{Assets, START_WAIT, webhook_at};

/// The envtest variable: a directory holding `kube-apiserver` and `etcd`.
pub const ASSETS_VAR: &str = "KUBEBUILDER_ASSETS";
/// When set, a missing [`ASSETS_VAR`] fails the test instead of skipping it (CI sets it).
pub const REQUIRE_VAR: &str = "QUORUMGUARD_REQUIRE_ENVTEST";
/// Overrides where the Cluster API CRDs are read from.
pub const CRDS_VAR: &str = "QUORUMGUARD_CAPI_CRDS";
/// Keep the API server's directory (certificates, logs, audit log) after the test.
pub const KEEP_VAR: &str = "QG_KEEP_ENVTEST";

/// How long `serve` may take to report ready. Generous: readiness may wait for its first etcd
/// sweep, and the machine is shared.
pub const READY_WAIT: Duration = Duration::from_secs(60);
/// Every other wait on the API server (an Event to appear, a condition to be published).
pub const WAIT: Duration = Duration::from_secs(30);

/// The manifests' ServiceAccount, as the API server names it.
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:quorumguard-system:quorumguard";

static SLOT: Mutex<()> = Mutex::new(());

/// The one-API-server-at-a-time slot, for a test that starts one through the playground.
pub fn slot() -> MutexGuard<'static, ()> {
    SLOT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The assets named by `KUBEBUILDER_ASSETS`; `None` (after printing one line saying that `test`
/// is skipped and why) when it is not set. A set variable naming a directory without the
/// binaries fails the test: a misconfiguration must not pass as a skip.
pub fn assets(test: &str) -> Option<Assets> {
    let Some(dir) = std::env::var_os(ASSETS_VAR).filter(|d| !d.is_empty()) else {
        assert!(
            std::env::var_os(REQUIRE_VAR).is_none(),
            "{test}: {REQUIRE_VAR} is set but {ASSETS_VAR} is not: the real-apiserver tests \
             must not be skipped here"
        );
        // Straight to stderr: libtest captures print!/eprint! of passing tests, and this line
        // is for the person running the suite.
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: {ASSETS_VAR} is not set (a directory with kube-apiserver and etcd; \
             see docs/development.md, \"Testing against a real kube-apiserver\")"
        );
        return None;
    };
    let assets = Assets::in_dir(Path::new(&dir))
        .unwrap_or_else(|e| panic!("{ASSETS_VAR}={}: {e}", Path::new(&dir).display()));
    Some(assets)
}

/// The Cluster API CRDs: `QUORUMGUARD_CAPI_CRDS`, else `shared/capi-crds` beside the repository
/// (a worktree beside the main clone finds the same one).
pub fn capi_crds_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(CRDS_VAR) {
        return PathBuf::from(dir);
    }
    let root = crate::paths::repo_root();
    let beside = root.join("../shared/capi-crds");
    assert!(
        beside.is_dir(),
        "the Cluster API CRDs are not at {} and {CRDS_VAR} is not set: point it at a directory \
         with cluster-api's cluster.x-k8s.io_{{clusters,machines}}.yaml and \
         controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml (v1.14)",
        beside.display()
    );
    beside.canonicalize().unwrap_or(beside)
}

/// A port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    realapi::free_port().expect("a free port on 127.0.0.1")
}

/// A child process killed (SIGKILL) and reaped when dropped: the playground's.
pub use quorumguard::playground::realapi::{Proc, tail};

/// [`Proc::spawn`], failing the test when it cannot start.
pub fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> Proc {
    Proc::spawn(program, args, log)
        .unwrap_or_else(|e| panic!("start {name} ({}): {e}", program.display()))
}

/// A running etcd + kube-apiserver with the Cluster API CRDs installed: the playground's
/// [`RealApi`], one at a time, its directory removed afterwards.
pub struct Envtest {
    api: RealApi,
    dir: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// A kubeconfig acting as the admin (`system:masters`), for kubectl and clients.
    pub admin_kubeconfig: PathBuf,
    /// The API server's audit log (JSON lines, one per request at Metadata level).
    pub audit_log: PathBuf,
    _slot: MutexGuard<'static, ()>,
}

impl Envtest {
    /// Starts etcd and kube-apiserver from `assets` and installs the Cluster API CRDs; waits
    /// (bounded by [`START_WAIT`]) until the server is ready and the CRDs are established.
    pub async fn start(assets: &Assets) -> Envtest {
        Self::start_with(assets, &[]).await
    }

    /// [`Envtest::start`] with `extra` kube-apiserver flags.
    #[expect(
        clippy::await_holding_lock,
        reason = "the slot is held on purpose for the server's whole life: one at a time"
    )]
    pub async fn start_with(assets: &Assets, extra: &[String]) -> Envtest {
        let slot = slot();
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "quorumguard-envtest-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        let api = RealApi::start_with(assets, &capi_crds_dir(), &dir, extra)
            .await
            .unwrap_or_else(|e| panic!("starting the real API server: {e}"));
        Envtest {
            url: api.url.clone(),
            admin_kubeconfig: api.admin_kubeconfig.clone(),
            audit_log: api.audit_log.clone(),
            api,
            dir,
            _slot: slot,
        }
    }

    /// The envtest's directory (certificates, logs, audit log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA that signed the API server's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        self.api.ca_pem()
    }

    /// Writes a kubeconfig acting as `user` through impersonation (the admin's certificate with
    /// `as: user`; for a service account the API server adds its groups) and returns its path.
    pub fn kubeconfig_as(&self, user: &str) -> PathBuf {
        self.api
            .kubeconfig_as(user)
            .unwrap_or_else(|e| panic!("kubeconfig as {user}: {e}"))
    }

    /// A client for `kubeconfig`.
    pub async fn client_from(kubeconfig: &Path) -> Client {
        let config = RealApi::config_from(kubeconfig)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
        Client::try_from(config).expect("client")
    }

    /// A client acting as the admin (`system:masters`).
    pub async fn client(&self) -> Client {
        self.api
            .client()
            .unwrap_or_else(|e| panic!("a client as the admin: {e}"))
    }

    /// A client acting as `user` (impersonated by the admin) in group `system:masters`: the
    /// webhook sees the user's name, and RBAC lets it do whatever a test asks (a person with
    /// the rights to delete Machines, a controller with its own).
    pub async fn client_as(&self, user: &str) -> Client {
        Client::try_from(self.api.config_as(user)).expect("client")
    }

    /// Runs kubectl (found as [`super::manifests::kubectl`] finds it) against this server as
    /// the admin, bounded by 60 s. `None` when there is no kubectl.
    pub fn kubectl(&self, args: &[&str]) -> Option<Output> {
        let kubectl = super::manifests::kubectl()?;
        let out = self.dir.join("kubectl.out");
        let err = self.dir.join("kubectl.err");
        let mut child = Command::new(kubectl)
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .arg(format!(
                "--cache-dir={}",
                self.dir.join("kubectl-cache").display()
            ))
            .args(args)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).expect("kubectl stdout"))
            .stderr(fs::File::create(&err).expect("kubectl stderr"))
            .spawn()
            .expect("run kubectl");
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().expect("kubectl status") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("kubectl {args:?} took over 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Some(Output {
            status,
            stdout: fs::read(&out).unwrap_or_default(),
            stderr: fs::read(&err).unwrap_or_default(),
        })
    }

    /// The audit log's events (Metadata level; ResponseComplete and Panic stages).
    pub fn audit_events(&self) -> Vec<Value> {
        fs::read_to_string(&self.audit_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Polls `probe` every 100 ms until it yields, for at most `bound` (and 1,000 polls).
    pub async fn eventually<T, F, Fut>(&self, what: &str, bound: Duration, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        eventually(what, bound, &mut probe).await
    }
}

/// Polls `probe` every 100 ms until it yields, for at most `bound` (and 1,000 polls).
pub async fn eventually<T, F, Fut>(what: &str, bound: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll(bound, probe)
        .await
        .unwrap_or_else(|| panic!("timed out after {bound:?} waiting for {what}"))
}

/// Polls `probe` every 100 ms until it yields, for at most `bound` (and 1,000 polls); `None`
/// when it never did.
pub async fn poll<T, F, Fut>(bound: Duration, probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    realapi::poll(bound, probe).await
}

/// Polls `probe` every 100 ms until it answers `Ok`, for at most `bound`; fails the test with
/// the last answer and the tail of `proc`'s log when the time is up or the process exits.
async fn wait_up<F, Fut>(proc: &mut Proc, what: &str, bound: Duration, probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    if let Err(e) = realapi::wait_up(proc, what, bound, probe).await {
        panic!("{e}");
    }
}

impl Drop for Envtest {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kube-apiserver log (last lines), in {}:\n{}",
                self.dir.display(),
                self.api.apiserver_log_tail(25)
            );
        }
        self.api.stop();
        if std::env::var_os(KEEP_VAR).is_some() {
            eprintln!("kept {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The API for `object`'s kind (found by discovery), in its namespace when it has one.
pub async fn api_for(client: &Client, object: &Value) -> Api<DynamicObject> {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discover {api_version} {kind}: {e}"));
    match (caps.scope, object["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &ar),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &ar),
    }
}

fn describe(object: &Value) -> String {
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().unwrap_or(""),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Creates `object`; a status it carries is then written through the status subresource (as a
/// controller would), since create ignores it.
pub async fn create(client: &Client, object: &Value) -> kube::Result<DynamicObject> {
    let api = api_for(client, object).await;
    let dynamic: DynamicObject = serde_json::from_value(object.clone()).expect("an object");
    let created = api.create(&PostParams::default(), &dynamic).await?;
    match object.get("status") {
        Some(status) if status.is_object() && object["kind"] != "Namespace" => {
            let name = object["metadata"]["name"].as_str().expect("name");
            api.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
        }
        _ => Ok(created),
    }
}

/// [`create`], failing the test with the API's answer.
pub async fn must_create(client: &Client, object: &Value) -> DynamicObject {
    create(client, object)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", describe(object)))
}

/// Replaces `object` (it must exist), failing the test with the API's answer.
pub async fn must_replace(client: &Client, object: &Value) -> DynamicObject {
    let api = api_for(client, object).await;
    let name = object["metadata"]["name"].as_str().expect("name");
    let current = api
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get {}: {e}", describe(object)));
    let mut dynamic: DynamicObject = serde_json::from_value(object.clone()).expect("an object");
    dynamic.metadata.resource_version = current.metadata.resource_version;
    api.replace(name, &PostParams::default(), &dynamic)
        .await
        .unwrap_or_else(|e| panic!("replace {}: {e}", describe(object)))
}

/// Creates namespace `name`.
pub async fn namespace(client: &Client, name: &str) {
    must_create(
        client,
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .await;
}

/// `quorumguard serve` as a child process: the binary users run, against the real API server.
pub struct Serve {
    proc: Proc,
    /// Its name: the `--pod-name` (Events' reporting instance, the Lease identity).
    pub name: String,
    /// The webhook's HTTPS address.
    pub addr: SocketAddr,
    /// /livez, /readyz, /metrics.
    pub admin: SocketAddr,
    args: Vec<String>,
}

impl Serve {
    /// Starts `quorumguard serve` named `name` with `kubeconfig`, serving `pki`'s pair on
    /// loopback ports picked free, JSON logs at info, plus `extra` flags. Does not wait.
    pub fn start(
        dir: &Path,
        pki: &TestPki,
        name: &str,
        kubeconfig: &Path,
        extra: &[&str],
    ) -> Serve {
        let addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        Self::start_on(addr, dir, pki, name, kubeconfig, extra)
    }

    /// [`Serve::start`] with the webhook at `addr` (known before kube-apiserver starts, for
    /// its AdmissionConfiguration).
    pub fn start_on(
        addr: SocketAddr,
        dir: &Path,
        pki: &TestPki,
        name: &str,
        kubeconfig: &Path,
        extra: &[&str],
    ) -> Serve {
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let mut args = vec![
            "serve".to_string(),
            format!("--listen={addr}"),
            format!("--admin-listen={admin}"),
            format!("--tls-cert-file={}", pki.cert_file.display()),
            format!("--tls-key-file={}", pki.key_file.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--pod-name={name}"),
            "--log-format=json".to_string(),
            "--shutdown-delay=0s".to_string(),
            "--shutdown-grace=1s".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = dir.join(format!("serve-{name}.log"));
        let proc = spawn(
            &format!("serve {name}"),
            &crate::paths::quorumguard_bin(),
            &args,
            &log,
        );
        Serve {
            proc,
            name: name.to_string(),
            addr,
            admin,
            args,
        }
    }

    /// SIGKILL: a crash, no Lease release, no graceful shutdown.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Starts it again with the same ports and flags (after [`Serve::kill`]).
    pub fn restart(&mut self) {
        self.proc.kill();
        let _ = writeln!(
            fs::OpenOptions::new()
                .append(true)
                .open(&self.proc.log)
                .expect("serve log"),
            "--- restarted by the test ---"
        );
        self.proc = spawn(
            &format!("serve {}", self.name),
            &crate::paths::quorumguard_bin(),
            &self.args,
            &self.proc.log,
        );
    }

    pub fn is_running(&mut self) -> bool {
        self.proc.is_running()
    }

    /// Its log so far (JSON lines).
    pub fn log(&self) -> String {
        self.proc.log_text()
    }

    /// Waits (bounded by [`READY_WAIT`]) until `/readyz` answers 200; fails with the log tail
    /// if the process exits first.
    pub async fn wait_ready(&mut self) {
        let admin = self.admin;
        let what = format!("serve {}", self.name);
        wait_up(&mut self.proc, &what, READY_WAIT, || async move {
            match try_get_plain(admin, "/readyz").await {
                Ok((code, _)) if code.is_success() => Ok(()),
                Ok((code, body)) => Err(format!("{code}: {}", body.trim())),
                Err(e) => Err(e),
            }
        })
        .await;
    }

    /// Its `/metrics` text.
    pub async fn metrics(&self) -> String {
        let (code, body) = try_get_plain(self.admin, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("GET /metrics of serve {}: {e}", self.name));
        assert!(code.is_success(), "/metrics answered {code}");
        body
    }

    /// Reviews answered at `endpoint` (`machines` or `kubeadmcontrolplanes`), by verdict reason.
    pub async fn reviews(&self, endpoint: &str) -> BTreeMap<String, u64> {
        let mut by_reason = BTreeMap::new();
        for (labels, v) in samples(
            &self.metrics().await,
            "quorumguard_admission_requests_total",
        ) {
            if labels.get("endpoint").map(String::as_str) == Some(endpoint) {
                let reason = labels.get("reason").cloned().unwrap_or_default();
                *by_reason.entry(reason).or_default() += v as u64;
            }
        }
        by_reason
    }

    /// Every review answered at `endpoint`.
    pub async fn review_count(&self, endpoint: &str) -> u64 {
        self.reviews(endpoint).await.values().sum()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "serve {} log (last lines):\n{}",
                self.name,
                self.proc.tail(20)
            );
        }
    }
}

/// The samples of metric `name` in Prometheus text: (labels, value) per line.
pub fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once('}') {
                Some((l, v)) => (l, v),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let labels = labels
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect();
        out.push((labels, value));
    }
    out
}
