//! A real kube-apiserver on loopback, started the way controller-runtime's envtest starts it:
//! for `quorumguard playground --real-apiserver` and for the tests (crates/testkit/src/envtest.rs).
//!
//! [`RealApi::start`] runs, on loopback ports picked free:
//! - etcd (one member, plain HTTP: the API server's own storage, not a workload cluster's);
//! - kube-apiserver with certificates made for the run (a CA, a serving certificate for
//!   127.0.0.1, an admin client certificate in `system:masters`, a service-account signing key),
//!   RBAC, the admission webhooks, and an audit log of every request at Metadata level;
//! - the Cluster API CRDs (Cluster, Machine, KubeadmControlPlane) from a directory, established.
//!
//! The binaries come from a directory in setup-envtest's layout (`KUBEBUILDER_ASSETS`: it holds
//! `kube-apiserver` and `etcd`), or kube-apiserver from a path with etcd from that directory or
//! PATH ([`Assets`]). Both processes die with this process ([`crate::child`]) and are killed
//! when the [`RealApi`] is dropped.
//!
//! - `proc.rs`: a child process with its log.
//! - `pki.rs`: the run's CA and the certificates it signs.
//! - `launch.rs`: the files etcd and kube-apiserver read, and the two spawned with their flags.
//! - `crds.rs`: the CRDs: reading, creating, waiting until established.

mod crds;
mod launch;
mod pki;
mod proc;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::etcd;

pub use crds::{CRD_FILES, crd_files, install_crds, parse_yaml};
pub use pki::Pair;
pub use proc::{Proc, tail};

/// The envtest variable: a directory holding `kube-apiserver` and `etcd`.
pub const ASSETS_VAR: &str = "KUBEBUILDER_ASSETS";
/// Where the Cluster API CRDs are read from (the playground's `--capi-crds` default).
pub const CRDS_VAR: &str = "QUORUMGUARD_CAPI_CRDS";
/// How long etcd and then kube-apiserver may take to become ready (about 4 s idle; a loaded
/// 2-core machine is slower), and the CRDs to be established.
pub const START_WAIT: Duration = Duration::from_secs(90);

/// How to get the binaries, for the errors that say they are missing.
const HOW_TO_GET: &str = "setup-envtest (sigs.k8s.io/controller-runtime/tools/setup-envtest) \
     downloads both: `export KUBEBUILDER_ASSETS=$(setup-envtest use -p path)`; see \
     docs/development.md, \"Testing against a real kube-apiserver\"";

/// Why the real API server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RealApiError {
    /// A binary or the CRDs are not there: the message says which and how to get it.
    #[error("{0}")]
    Missing(String),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting {} : {source}", program.display())]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} exited before it was ready; its log ({}) ends:\n{log}", path.display())]
    Exited {
        what: String,
        path: PathBuf,
        log: String,
    },
    #[error("{what} was not ready within {bound:?} ({last}); its log ({}) ends:\n{log}", path.display())]
    NotReady {
        what: String,
        bound: Duration,
        last: String,
        path: PathBuf,
        log: String,
    },
    #[error("making the API server's certificates: {0}")]
    Certs(String),
    #[error("a client for the API server: {0}")]
    Client(String),
    #[error("installing the Cluster API CRDs from {}: {problem}", dir.display())]
    Crds { dir: PathBuf, problem: String },
    #[error("no free port on 127.0.0.1: {0}")]
    Port(#[source] std::io::Error),
}

/// Where the binaries are.
#[derive(Clone, Debug)]
pub struct Assets {
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
}

/// Whether `path` is an executable file.
pub fn executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Assets {
    /// `kube-apiserver` and `etcd` in `dir` (setup-envtest's layout); the etcd from
    /// `QUORUMGUARD_ETCD_BIN_DIR` instead when that is set ([`etcd::bin_dir`]), as every etcd
    /// the playground and the tests start.
    pub fn in_dir(dir: &Path) -> Result<Assets, RealApiError> {
        let etcd = etcd::bin_dir()
            .unwrap_or_else(|| dir.to_path_buf())
            .join("etcd");
        Assets::in_dir_with(&dir.join("kube-apiserver"), &etcd)
    }

    /// These two, when both are executable files.
    fn in_dir_with(kube_apiserver: &Path, etcd: &Path) -> Result<Assets, RealApiError> {
        for binary in [kube_apiserver, etcd] {
            if !executable(binary) {
                return Err(RealApiError::Missing(format!(
                    "no executable {} (kube-apiserver and etcd come from {ASSETS_VAR} or \
                     --kube-apiserver, etcd from {} when that is set); {HOW_TO_GET}",
                    binary.display(),
                    etcd::BIN_DIR_VAR
                )));
            }
        }
        Ok(Assets {
            kube_apiserver: kube_apiserver.to_path_buf(),
            etcd: etcd.to_path_buf(),
        })
    }

    /// The binaries for the playground: `kube_apiserver` when given (its storage etcd from
    /// `QUORUMGUARD_ETCD_BIN_DIR`, else `KUBEBUILDER_ASSETS`, else PATH), else both from
    /// `KUBEBUILDER_ASSETS` (its etcd from `QUORUMGUARD_ETCD_BIN_DIR` when that is set).
    pub fn find(kube_apiserver: Option<&Path>) -> Result<Assets, RealApiError> {
        let assets_dir = std::env::var_os(ASSETS_VAR)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        let Some(kube_apiserver) = kube_apiserver else {
            let Some(dir) = assets_dir else {
                return Err(RealApiError::Missing(format!(
                    "a real kube-apiserver: {ASSETS_VAR} is not set (a directory with \
                     kube-apiserver and etcd) and no --kube-apiserver PATH was given; {HOW_TO_GET}"
                )));
            };
            return Assets::in_dir(&dir);
        };
        if !executable(kube_apiserver) {
            return Err(RealApiError::Missing(format!(
                "--kube-apiserver {}: not an executable file; {HOW_TO_GET}",
                kube_apiserver.display()
            )));
        }
        if let Some(dir) = etcd::bin_dir() {
            return Assets::in_dir_with(kube_apiserver, &dir.join("etcd"));
        }
        let etcd = assets_dir
            .map(|d| d.join("etcd"))
            .filter(|p| executable(p))
            .or_else(|| on_path("etcd"))
            .ok_or_else(|| {
                RealApiError::Missing(format!(
                    "an etcd for kube-apiserver's storage: none in {}, {ASSETS_VAR} or on PATH \
                     (Debian: apt-get install etcd-server); {HOW_TO_GET}",
                    etcd::BIN_DIR_VAR
                ))
            })?;
        Ok(Assets {
            kube_apiserver: kube_apiserver.to_path_buf(),
            etcd,
        })
    }
}

/// `name` found on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

/// A port free on 127.0.0.1 right now.
pub fn free_port() -> Result<u16, RealApiError> {
    crate::ports::free_port().map_err(RealApiError::Port)
}

/// Base64 as JSON (k8s-openapi's ByteString serializes so: no base64 crate needed).
pub fn b64(bytes: &[u8]) -> Value {
    serde_json::to_value(ByteString(bytes.to_vec())).unwrap_or(Value::Null)
}

/// `vwc` (a ValidatingWebhookConfiguration as JSON) with every webhook's `clientConfig` pointed
/// at `addr` over loopback (`url` with the service's path, and `caBundle`): kube-apiserver then
/// calls it directly, no Service needed.
pub fn webhook_at(vwc: &Value, addr: SocketAddr, ca_pem: &str) -> Value {
    let mut vwc = vwc.clone();
    for w in vwc["webhooks"].as_array_mut().into_iter().flatten() {
        let path = w["clientConfig"]["service"]["path"]
            .as_str()
            .unwrap_or("/")
            .to_string();
        w["clientConfig"] = json!({
            "url": format!("https://{addr}{path}"),
            "caBundle": b64(ca_pem.as_bytes()),
        });
    }
    vwc
}

/// A running etcd + kube-apiserver with the Cluster API CRDs installed.
pub struct RealApi {
    // Dropped in this order: the API server, then its etcd.
    apiserver: Proc,
    etcd: Proc,
    dir: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    ca: pki::Ca,
    admin: Pair,
    /// A kubeconfig acting as the admin (`system:masters`), for kubectl and clients.
    pub admin_kubeconfig: PathBuf,
    /// The admin's client configuration, read from [`Self::admin_kubeconfig`] once.
    admin_config: Config,
    /// The API server's audit log (JSON lines, one per request at Metadata level).
    pub audit_log: PathBuf,
}

impl RealApi {
    /// Starts etcd and kube-apiserver from `assets` with their files in `dir`, and installs the
    /// CRDs of `crds`; waits (bounded by [`START_WAIT`] each) until the server is ready and the
    /// CRDs are established.
    pub async fn start(assets: &Assets, crds: &Path, dir: &Path) -> Result<RealApi, RealApiError> {
        Self::start_with(assets, crds, dir, &[]).await
    }

    /// [`RealApi::start`] with `extra` kube-apiserver flags after the usual ones (for example
    /// `--admission-control-config-file`, whose files must exist before it starts).
    pub async fn start_with(
        assets: &Assets,
        crds: &Path,
        dir: &Path,
        extra: &[String],
    ) -> Result<RealApi, RealApiError> {
        // Before anything starts: a missing CRD directory is a missing prerequisite.
        crd_files(crds)?;
        let files = launch::write_files(dir)?;
        let (etcd, etcd_port, etcd_url) = launch::spawn_etcd(assets, dir)?;
        let (apiserver, url) = launch::spawn_apiserver(assets, dir, &etcd_url, &files, extra)?;
        let text = kubeconfig_yaml(&url, &files.ca.pem, &files.admin, None)?;
        let admin_kubeconfig = PathBuf::from(launch::write_file(dir, "admin.kubeconfig", &text)?);
        let admin_config = Self::config_from(&admin_kubeconfig).await?;
        let mut api = RealApi {
            apiserver,
            etcd,
            dir: dir.to_path_buf(),
            url,
            ca: files.ca,
            admin: files.admin,
            admin_kubeconfig,
            admin_config,
            audit_log: files.audit_log,
        };
        wait_up(&mut api.etcd, "kube-apiserver's etcd", START_WAIT, || {
            etcd_healthy(etcd_port)
        })
        .await?;
        let client = api.client()?;
        wait_up(&mut api.apiserver, "kube-apiserver", START_WAIT, || {
            apiserver_ready(client.clone())
        })
        .await?;
        install_crds(&client, crds, START_WAIT).await?;
        Ok(api)
    }

    /// The directory of its files (certificates, logs, audit log, etcd's data).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA that signed the API server's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca.pem
    }

    /// A serving certificate for 127.0.0.1 (and `dns`) signed by [`Self::ca_pem`], for a
    /// webhook kube-apiserver calls on loopback.
    pub fn loopback_server_cert(&self, cn: &str, dns: &[&str]) -> Result<Pair, RealApiError> {
        self.ca.loopback_server(cn, dns)
    }

    /// The last `n` lines of kube-apiserver's log.
    pub fn apiserver_log_tail(&self, n: usize) -> String {
        self.apiserver.tail(n)
    }

    /// The PIDs of kube-apiserver and its etcd (while they run).
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        (self.apiserver.pid(), self.etcd.pid())
    }

    /// A kubeconfig for the admin, acting as `as_user` (impersonation) when given.
    pub fn kubeconfig_text(&self, as_user: Option<&str>) -> Result<String, RealApiError> {
        kubeconfig_yaml(&self.url, &self.ca.pem, &self.admin, as_user)
    }

    /// Writes a kubeconfig acting as `user` through impersonation (the admin's certificate with
    /// `as: user`; for a service account the API server adds its groups) and returns its path.
    pub fn kubeconfig_as(&self, user: &str) -> Result<PathBuf, RealApiError> {
        let path = self
            .dir
            .join(format!("{}.kubeconfig", user.replace([':', '/'], "_")));
        let text = self.kubeconfig_text(Some(user))?;
        std::fs::write(&path, text).map_err(|source| RealApiError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    /// The client configuration of `kubeconfig`.
    pub async fn config_from(kubeconfig: &Path) -> Result<Config, RealApiError> {
        let kc =
            Kubeconfig::read_from(kubeconfig).map_err(|e| RealApiError::Client(e.to_string()))?;
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| RealApiError::Client(e.to_string()))
    }

    /// The admin's client configuration (`system:masters`).
    pub fn admin_config(&self) -> &Config {
        &self.admin_config
    }

    /// A client acting as the admin (`system:masters`).
    pub fn client(&self) -> Result<Client, RealApiError> {
        Client::try_from(self.admin_config.clone()).map_err(|e| RealApiError::Client(e.to_string()))
    }

    /// The admin's configuration acting as `user` (impersonated) in group `system:masters`: the
    /// webhook sees the user's name, and RBAC lets it do what the story asks.
    pub fn config_as(&self, user: &str) -> Config {
        let mut config = self.admin_config.clone();
        config.auth_info.impersonate = Some(user.to_string());
        config.auth_info.impersonate_groups = Some(vec!["system:masters".to_string()]);
        config
    }

    /// Kills kube-apiserver, then its etcd (also done on drop).
    pub fn stop(&mut self) {
        self.apiserver.kill();
        self.etcd.kill();
    }
}

/// A kubeconfig for the server at `url` (its CA `ca_pem`) with the client certificate `admin`,
/// acting as `as_user` (impersonation) when given.
fn kubeconfig_yaml(
    url: &str,
    ca_pem: &str,
    admin: &Pair,
    as_user: Option<&str>,
) -> Result<String, RealApiError> {
    let mut user = json!({
        "client-certificate-data": b64(admin.0.as_bytes()),
        "client-key-data": b64(admin.1.as_bytes()),
    });
    if let Some(u) = as_user {
        user["as"] = json!(u);
    }
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {
            "server": url,
            "certificate-authority-data": b64(ca_pem.as_bytes()),
        }}],
        "users": [{"name": "envtest", "user": user}],
        "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "envtest"}}],
        "current-context": "envtest",
    });
    serde_yaml::to_string(&config).map_err(|e| RealApiError::Client(e.to_string()))
}

/// `Ok` when etcd on `port` answers `/health` with `"health":"true"`.
async fn etcd_healthy(port: u16) -> Result<(), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let request =
            format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        Ok::<_, std::io::Error>(text)
    };
    match tokio::time::timeout(Duration::from_secs(2), exchange).await {
        Ok(Ok(text)) if text.contains("\"health\":\"true\"") => Ok(()),
        Ok(Ok(text)) => Err(text.lines().last().unwrap_or_default().to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 2 s".to_string()),
    }
}

/// `Ok` when kube-apiserver's `/readyz` says `ok`.
async fn apiserver_ready(client: Client) -> Result<(), String> {
    let request = axum::http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
        Ok(Ok(body)) if body.trim() == "ok" => Ok(()),
        Ok(Ok(body)) => Err(body),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 5 s".to_string()),
    }
}

/// Polls `probe` every 100 ms until it answers `Ok`, for at most `bound`; an error with the
/// last answer and the tail of `proc`'s log when the time is up or the process exits.
pub async fn wait_up<F, Fut>(
    proc: &mut Proc,
    what: &str,
    bound: Duration,
    mut probe: F,
) -> Result<(), RealApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + bound;
    loop {
        let last = match probe().await {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if !proc.is_running() {
            return Err(RealApiError::Exited {
                what: what.to_string(),
                path: proc.log.clone(),
                log: proc.tail(40),
            });
        }
        if Instant::now() >= deadline {
            return Err(RealApiError::NotReady {
                what: what.to_string(),
                bound,
                last,
                path: proc.log.clone(),
                log: proc.tail(40),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
