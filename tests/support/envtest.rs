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
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Scope;
use kube::{Client, Config};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};
use serde_json::{Value, json};

use super::https::{TestPki, try_get_plain};

/// The envtest variable: a directory holding `kube-apiserver` and `etcd`.
pub const ASSETS_VAR: &str = "KUBEBUILDER_ASSETS";
/// When set, a missing [`ASSETS_VAR`] fails the test instead of skipping it (CI sets it).
pub const REQUIRE_VAR: &str = "QUORUMGUARD_REQUIRE_ENVTEST";
/// Overrides where the Cluster API CRDs are read from.
pub const CRDS_VAR: &str = "QUORUMGUARD_CAPI_CRDS";
/// Keep the API server's directory (certificates, logs, audit log) after the test.
pub const KEEP_VAR: &str = "QG_KEEP_ENVTEST";

/// How long etcd and then kube-apiserver may take to become ready (it takes about 4 s idle; a
/// loaded 2-core machine is slower).
pub const START_WAIT: Duration = Duration::from_secs(90);
/// How long `serve` may take to report ready. Generous: readiness may wait for its first etcd
/// sweep, and the machine is shared.
pub const READY_WAIT: Duration = Duration::from_secs(60);
/// Every other wait on the API server (an Event to appear, a condition to be published).
pub const WAIT: Duration = Duration::from_secs(30);

/// The manifests' ServiceAccount, as the API server names it.
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:quorumguard-system:quorumguard";

static SLOT: Mutex<()> = Mutex::new(());

/// Where the binaries are.
#[derive(Clone, Debug)]
pub struct Assets {
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
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
    let dir = PathBuf::from(dir);
    let assets = Assets {
        kube_apiserver: dir.join("kube-apiserver"),
        etcd: dir.join("etcd"),
    };
    for binary in [&assets.kube_apiserver, &assets.etcd] {
        let executable = fs::metadata(binary).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
        assert!(
            executable,
            "{ASSETS_VAR}={}: no executable {} there (it needs kube-apiserver and etcd)",
            dir.display(),
            binary.display()
        );
    }
    Some(assets)
}

/// The Cluster API CRDs: `QUORUMGUARD_CAPI_CRDS`, else `shared/capi-crds` beside the repository
/// (a worktree beside the main clone finds the same one).
pub fn capi_crds_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(CRDS_VAR) {
        return PathBuf::from(dir);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
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
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Proc {
    name: String,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `program` with `args`, stdout and stderr appended to `log`, stdin closed, dying
    /// with the test process ([`quorumguard::playground::child`]).
    pub fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> Proc {
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let err = out.try_clone().expect("clone the log file");
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = quorumguard::playground::child::spawn(command)
            .unwrap_or_else(|e| panic!("start {name} ({}): {e}", program.display()));
        Proc {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process still runs (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last `n` lines of the log.
    pub fn tail(&self, n: usize) -> String {
        tail(&self.log, n)
    }

    /// The whole log.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A CA that signs the API server's serving certificate and its clients' certificates.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new() -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, "envtest-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("CA");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate and its key (PEM): for a client (CN = user, O = groups) or a server.
    fn sign(
        &self,
        cn: &str,
        groups: &[&str],
        sans: Vec<SanType>,
        usage: ExtendedKeyUsagePurpose,
    ) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![usage];
        let now = std::time::SystemTime::now();
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = (now + Duration::from_secs(2 * 86_400)).into();
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        (cert.pem(), key.serialize_pem())
    }
}

fn b64(bytes: &[u8]) -> Value {
    // k8s-openapi's ByteString serializes as base64: no base64 crate needed.
    serde_json::to_value(ByteString(bytes.to_vec())).expect("base64")
}

/// A running etcd + kube-apiserver with the Cluster API CRDs installed.
pub struct Envtest {
    // Dropped in this order: the API server, its etcd, then the directory, then the slot.
    apiserver: Proc,
    etcd: Proc,
    dir: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    ca: Ca,
    admin: (String, String),
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
        let slot = SLOT.lock().unwrap_or_else(PoisonError::into_inner);
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "quorumguard-envtest-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("etcd")).expect("create the envtest directory");

        let ca = Ca::new();
        let serving = ca.sign(
            "kube-apiserver",
            &[],
            vec![
                SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
                SanType::DnsName("localhost".try_into().expect("dns name")),
                SanType::DnsName("kubernetes.default.svc".try_into().expect("dns name")),
            ],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let admin = ca.sign(
            "envtest-admin",
            &["system:masters"],
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let sa_key = KeyPair::generate().expect("service-account key");
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            path.display().to_string()
        };
        let ca_file = write("ca.crt", &ca.pem);
        let cert_file = write("apiserver.crt", &serving.0);
        let key_file = write("apiserver.key", &serving.1);
        let sa_private = write("sa.key", &sa_key.serialize_pem());
        let sa_public = write("sa.pub", &sa_key.public_key_pem());
        // Metadata for every request but the server's own loopback traffic.
        let policy = write(
            "audit-policy.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             - level: None\n  users: [\"system:apiserver\"]\n- level: Metadata\n",
        );
        let audit_log = dir.join("audit.log");

        let etcd_port = free_port();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{}", free_port());
        let etcd = Proc::spawn(
            "etcd",
            &assets.etcd,
            &[
                "--name=envtest".to_string(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=envtest={peer_url}"),
                "--logger=zap".to_string(),
                "--log-outputs=stderr".to_string(),
            ],
            &dir.join("etcd.log"),
        );
        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let apiserver = Proc::spawn(
            "kube-apiserver",
            &assets.kube_apiserver,
            &[
                format!("--etcd-servers={etcd_url}"),
                "--bind-address=127.0.0.1".to_string(),
                format!("--secure-port={port}"),
                "--advertise-address=127.0.0.1".to_string(),
                "--endpoint-reconciler-type=none".to_string(),
                format!("--cert-dir={}", dir.display()),
                format!("--tls-cert-file={cert_file}"),
                format!("--tls-private-key-file={key_file}"),
                format!("--client-ca-file={ca_file}"),
                "--authorization-mode=Node,RBAC".to_string(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
                format!("--service-account-key-file={sa_public}"),
                format!("--service-account-signing-key-file={sa_private}"),
                "--service-cluster-ip-range=10.96.0.0/12".to_string(),
                "--enable-admission-plugins=NamespaceLifecycle,ValidatingAdmissionWebhook,\
                 MutatingAdmissionWebhook"
                    .to_string(),
                "--allow-privileged=true".to_string(),
                format!("--audit-policy-file={policy}"),
                format!("--audit-log-path={}", audit_log.display()),
                "--audit-log-format=json".to_string(),
            ],
            &dir.join("kube-apiserver.log"),
        );
        let mut env = Envtest {
            apiserver,
            etcd,
            dir: dir.clone(),
            url,
            ca,
            admin,
            admin_kubeconfig: dir.join("admin.kubeconfig"),
            audit_log,
            _slot: slot,
        };
        fs::write(&env.admin_kubeconfig, env.kubeconfig_text(None)).expect("write kubeconfig");
        env.wait_etcd(etcd_port).await;
        env.wait_ready().await;
        env.install_crds().await;
        env
    }

    async fn wait_etcd(&mut self, port: u16) {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        wait_up(&mut self.etcd, "envtest etcd", START_WAIT, || async move {
            match try_get_plain(addr, "/health").await {
                Ok((code, body)) if code.is_success() && body.contains("true") => Ok(()),
                Ok((code, body)) => Err(format!("{code}: {}", body.trim())),
                Err(e) => Err(e),
            }
        })
        .await;
    }

    async fn wait_ready(&mut self) {
        let client = self.client().await;
        wait_up(&mut self.apiserver, "kube-apiserver", START_WAIT, || {
            let client = client.clone();
            async move {
                let request = hyper::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                match tokio::time::timeout(Duration::from_secs(5), client.request_text(request))
                    .await
                {
                    Ok(Ok(body)) if body.trim() == "ok" => Ok(()),
                    Ok(Ok(body)) => Err(body),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("no answer within 5 s".to_string()),
                }
            }
        })
        .await;
    }

    /// Creates the Cluster API CRDs and waits until each is established.
    async fn install_crds(&self) {
        let dir = capi_crds_dir();
        let client = self.client().await;
        let crds = crd_api(&client);
        let mut names = Vec::new();
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no CRD files in {}", dir.display());
        for file in files {
            let text = fs::read_to_string(&file).expect("read a CRD");
            for crd in super::manifests::parse_yaml(&text) {
                let object: DynamicObject = serde_json::from_value(crd).expect("a CRD object");
                let name = object.metadata.name.clone().expect("CRD name");
                crds.create(&PostParams::default(), &object)
                    .await
                    .unwrap_or_else(|e| panic!("create CRD {name}: {e}"));
                names.push(name);
            }
        }
        for name in names {
            self.eventually(&format!("CRD {name} established"), START_WAIT, || {
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
        }
    }

    /// The envtest's directory (certificates, logs, audit log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA that signed the API server's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca.pem
    }

    /// A kubeconfig for the admin, acting as `as_user` (impersonation) when given.
    fn kubeconfig_text(&self, as_user: Option<&str>) -> String {
        let mut user = json!({
            "client-certificate-data": b64(self.admin.0.as_bytes()),
            "client-key-data": b64(self.admin.1.as_bytes()),
        });
        if let Some(u) = as_user {
            user["as"] = json!(u);
        }
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "envtest", "cluster": {
                "server": self.url,
                "certificate-authority-data": b64(self.ca.pem.as_bytes()),
            }}],
            "users": [{"name": "envtest", "user": user}],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "envtest"}}],
            "current-context": "envtest",
        });
        serde_yaml::to_string(&config).expect("kubeconfig YAML")
    }

    /// Writes a kubeconfig acting as `user` through impersonation (the admin's certificate with
    /// `as: user`; for a service account the API server adds its groups) and returns its path.
    pub fn kubeconfig_as(&self, user: &str) -> PathBuf {
        let file = self
            .dir
            .join(format!("{}.kubeconfig", user.replace([':', '/'], "_")));
        fs::write(&file, self.kubeconfig_text(Some(user))).expect("write kubeconfig");
        file
    }

    /// A client for `kubeconfig`.
    pub async fn client_from(kubeconfig: &Path) -> Client {
        let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        Client::try_from(config).expect("client")
    }

    /// A client acting as the admin (`system:masters`).
    pub async fn client(&self) -> Client {
        Self::client_from(&self.admin_kubeconfig).await
    }

    /// A client acting as `user` (impersonated by the admin) in group `system:masters`: the
    /// webhook sees the user's name, and RBAC lets it do whatever a test asks (a person with
    /// the rights to delete Machines, a controller with its own).
    pub async fn client_as(&self, user: &str) -> Client {
        let kc = Kubeconfig::read_from(&self.admin_kubeconfig).expect("read kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        config.auth_info.impersonate = Some(user.to_string());
        config.auth_info.impersonate_groups = Some(vec!["system:masters".to_string()]);
        Client::try_from(config).expect("client")
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
pub async fn poll<T, F, Fut>(bound: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + bound;
    for _ in 0..1_000 {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Polls `probe` every 100 ms until it answers `Ok`, for at most `bound`; fails the test with
/// the last answer and the tail of `proc`'s log when the time is up or the process exits.
async fn wait_up<F, Fut>(proc: &mut Proc, what: &str, bound: Duration, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + bound;
    let mut last = String::new();
    for _ in 0..2_000 {
        match probe().await {
            Ok(()) => return,
            Err(e) => last = e,
        }
        assert!(
            proc.is_running(),
            "{what} exited before it was ready:\n{}",
            proc.tail(40)
        );
        assert!(
            Instant::now() < deadline,
            "{what} not ready within {bound:?} ({last}):\n{}",
            proc.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} never became ready ({last})");
}

impl Drop for Envtest {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kube-apiserver log (last lines), in {}:\n{}",
                self.dir.display(),
                self.apiserver.tail(25)
            );
        }
        self.apiserver.kill();
        self.etcd.kill();
        if std::env::var_os(KEEP_VAR).is_some() {
            eprintln!("kept {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn crd_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "customresourcedefinitions");
    Api::all_with(client.clone(), &ar)
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

/// The rendered ValidatingWebhookConfiguration with every webhook's `clientConfig` pointed at
/// `addr` over loopback (`url` with the same path, and `caBundle`), as the manual run
/// did: kube-apiserver then calls it directly, no Service needed.
pub fn webhook_at(vwc: &Value, addr: SocketAddr, ca_pem: &str) -> Value {
    let mut vwc = vwc.clone();
    for w in vwc["webhooks"].as_array_mut().expect("webhooks") {
        let path = w["clientConfig"]["service"]["path"]
            .as_str()
            .expect("clientConfig.service.path")
            .to_string();
        w["clientConfig"] = json!({
            "url": format!("https://{addr}{path}"),
            "caBundle": b64(ca_pem.as_bytes()),
        });
    }
    vwc
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
        let proc = Proc::spawn(
            &format!("serve {name}"),
            Path::new(env!("CARGO_BIN_EXE_quorumguard")),
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
        self.proc = Proc::spawn(
            &format!("serve {}", self.name),
            Path::new(env!("CARGO_BIN_EXE_quorumguard")),
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
