//! A real etcd cluster on 127.0.0.1 with TLS: the playground's etcd, and the etcd of the tests
//! of the prober, the sweep and the status enricher.
//!
//! [`EtcdCluster::start`] makes a CA shaped like Cluster API's `<cluster>-etcd` Secret (RSA-2048
//! key in PKCS#1 PEM, subject `CN=etcd-ca` as a PrintableString, as Go writes them), server and
//! peer certificates for 127.0.0.1/localhost, and starts `n` `etcd` processes (`m1`..`mn`) with
//! client and peer certificate auth and fast raft timings. Fault helpers freeze, thaw, kill and
//! remove members and add learners; admin operations go through `etcdctl` from PATH.
//!
//! Needs on PATH: `etcd` and `etcdctl` (Debian `etcd-server` and `etcd-client`; written against
//! etcd 3.4), `openssl` (the CA's RSA key: rcgen on ring signs with RSA but cannot generate
//! one), `timeout` (coreutils) and `kill`.
//!
//! Safety: only 127.0.0.1; free ports come from binding port 0; every wait is bounded in time;
//! every process started here is killed on drop; the cluster's directory (certificates, data,
//! one log per member) is removed on drop unless [`EtcdOptions::keep_dir`], and kept when the
//! cluster fails to start. Every failure is an [`EtcdError`] naming the member, its port and its
//! log where there is one, with the tail of the logs where they explain it.
//!
//! How many clusters may run at once is the caller's business: the tests run one per test
//! binary at a time (`tests/support/etcd.rs`), because etcd's 500 ms election timeout must not
//! be starved into spurious elections on a 2-core machine.

use std::fs::{self, File};
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use rcgen::string::PrintableString;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use quorumguard_guard::etcd::{ClientTls, certs::sign_client_cert};

/// How long the cluster may take to become healthy.
pub const START_WAIT: Duration = Duration::from_secs(20);
/// How long a membership change may be refused ("unhealthy cluster": etcd wants its peers
/// connected for 5 s first) before giving up.
pub const RECONFIG_WAIT: Duration = Duration::from_secs(15);
/// How long a removed member may take to exit by itself.
pub const EXIT_WAIT: Duration = Duration::from_secs(15);
/// The most members [`EtcdCluster::start_with`] starts.
pub const MAX_MEMBERS: usize = 7;
/// etcd's raft timings here (ms): fast, so elections and starts take a second, not ten.
const HEARTBEAT_MS: u32 = 50;
const ELECTION_MS: u32 = 500;
/// etcd's `--election-timeout` here, for the guard's `--etcd-election-timeout`.
pub const ELECTION_TIMEOUT: Duration = Duration::from_millis(ELECTION_MS as u64);
/// Attempts at starting the cluster when a port picked free was taken before etcd bound it.
const START_ATTEMPTS: usize = 3;
/// Lines of each member's log that [`EtcdCluster::logs`] and errors show.
const LOG_TAIL: usize = 15;

/// Why the cluster, or an operation on it, failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("`{tool}` is needed on PATH (Debian: {package})")]
    MissingTool {
        tool: &'static str,
        package: &'static str,
    },
    #[error("an etcd cluster here has 1 to {MAX_MEMBERS} members, not {0}")]
    MemberCount(usize),
    #[error("{names} member names given for {members} members: give one name per member, or none")]
    NameCount { names: usize, members: usize },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("making the etcd certificates: {0}")]
    Pki(String),
    #[error("finding a free port on 127.0.0.1: {0}")]
    FreePort(#[source] io::Error),
    #[error(
        "starting etcd member {member} (client port {client_port}, peer port {peer_port}, log {}): {source}",
        log.display()
    )]
    Spawn {
        member: String,
        client_port: u16,
        peer_port: u16,
        log: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("etcd member {member} (client port {client_port}) exited; its log {}:\n{tail}", log.display())]
    Exited {
        member: String,
        client_port: u16,
        log: PathBuf,
        tail: String,
    },
    #[error("etcd members {members} not healthy within {waited:?}: {last}\n{tail}")]
    NotHealthy {
        /// Each member waited for, with its client port and log.
        members: String,
        waited: Duration,
        /// etcdctl's last answer.
        last: String,
        /// The last lines of every member's log.
        tail: String,
    },
    #[error("etcd member {member} (client port {client_port}, log {}) did not come up within {waited:?}: {last}\n{tail}", log.display())]
    MemberStart {
        member: String,
        client_port: u16,
        log: PathBuf,
        waited: Duration,
        last: String,
        tail: String,
    },
    #[error("no etcd member {0} here")]
    NoSuchMember(String),
    #[error("etcd member {0} is not running")]
    NotRunning(String),
    #[error("etcd member {0} is running already")]
    AlreadyRunning(String),
    #[error("kill {signal} {pid} (etcd member {member}): {why}")]
    Signal {
        signal: &'static str,
        pid: u32,
        member: String,
        why: String,
    },
    /// etcdctl failed: the command (long arguments shortened), its exit status and output.
    #[error("{0}")]
    Etcdctl(String),
    #[error("unexpected output of etcdctl {what}: {why}")]
    Output { what: &'static str, why: String },
    #[error("no running etcd member answered {what}: {last}")]
    NoAnswer { what: &'static str, last: String },
    #[error("{error}\n{tail}")]
    MemberChange { error: String, tail: String },
}

/// How to start a cluster.
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    /// Members to start (`m1`..`mn`), 1 to [`MAX_MEMBERS`].
    pub members: usize,
    /// Extra `etcd` flags for every member (e.g. a tiny `--quota-backend-bytes` to raise a
    /// NOSPACE alarm).
    pub flags: Vec<String>,
    /// Where the cluster's own directory is made (default: the system temp dir).
    pub parent_dir: Option<PathBuf>,
    /// Leave the cluster's directory (certificates, data, logs) in place when it is dropped.
    pub keep_dir: bool,
    /// Member names, one per member (empty: `m1`..`mn`). The playground names members like
    /// kubeadm does, after their nodes.
    pub names: Vec<String>,
}

impl EtcdOptions {
    /// `members` members, no extra flags, in the temp dir, removed on drop.
    pub fn new(members: usize) -> Self {
        Self {
            members,
            ..Self::default()
        }
    }
}

/// The certificates of a cluster.
pub struct Pki {
    /// The etcd CA, as in Secret `<cluster>-etcd` (`tls.crt`, `tls.key`).
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    ca_crt: PathBuf,
    server_crt: PathBuf,
    server_key: PathBuf,
    peer_crt: PathBuf,
    peer_key: PathBuf,
    /// etcdctl's client certificate (signed with quorumguard's own signer).
    client_crt: PathBuf,
    client_key: PathBuf,
}

/// etcdctl (API v3) with a cluster's CA and client certificate: [`EtcdCluster::etcdctl_handle`].
#[derive(Clone, Debug)]
pub struct Etcdctl {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// etcdctl's `--command-timeout`: how long it waits for one member (3 s by default).
    command_timeout: Duration,
}

impl Etcdctl {
    /// The same etcdctl waiting at most `timeout` for a member (and for dialling it): a
    /// monitor that must look often cannot wait 3 s for a frozen member.
    pub fn with_timeout(mut self, timeout: Duration) -> Etcdctl {
        self.command_timeout = timeout;
        self
    }

    /// Runs etcdctl against `endpoints`, bounded by `timeout 20`, whatever its exit status
    /// (`endpoint health` exits 1 when a member is unhealthy, with its JSON still on stdout).
    pub fn output(&self, endpoints: &[String], args: &[&str]) -> Result<Output, EtcdError> {
        let p = |path: &Path| path.display().to_string();
        Command::new("timeout")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("ETCDCTL_API", "3")
            .args(["20", "etcdctl"])
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .args(["--cacert", &p(&self.ca)])
            .args(["--cert", &p(&self.cert)])
            .args(["--key", &p(&self.key)])
            .arg(format!(
                "--dial-timeout={}ms",
                self.command_timeout.min(Duration::from_secs(2)).as_millis()
            ))
            .arg(format!(
                "--command-timeout={}ms",
                self.command_timeout.as_millis()
            ))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| EtcdError::Etcdctl(format!("running etcdctl: {e}")))
    }

    /// Runs etcdctl against `endpoints`; its stdout, or an error with the command (long
    /// arguments shortened), its exit status and output.
    pub fn run(&self, endpoints: &[String], args: &[&str]) -> Result<String, EtcdError> {
        let out = self.output(endpoints, args)?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            // Long arguments (a value to put) shortened, so a failure stays readable.
            let shown: Vec<String> = args
                .iter()
                .map(|a| match a.char_indices().nth(60) {
                    Some((i, _)) => format!("{}...", &a[..i]),
                    None => a.to_string(),
                })
                .collect();
            Err(EtcdError::Etcdctl(format!(
                "etcdctl {} ({}): {}{}",
                shown.join(" "),
                out.status,
                stdout,
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }
}

/// One member of [`EtcdCluster::member_list`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedMember {
    pub id: u64,
    /// Empty for a member added but not started yet.
    pub name: String,
    pub learner: bool,
}

struct Node {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// `--initial-cluster` and `--initial-cluster-state` it starts with.
    initial_cluster: String,
    initial_state: &'static str,
    frozen: bool,
}

impl Node {
    fn client_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.peer_port)
    }

    /// `m1 (client port 2379, log /tmp/.../m1.log)`
    fn describe(&self) -> String {
        format!(
            "{} (client port {}, log {})",
            self.name,
            self.client_port,
            self.log.display()
        )
    }
}

/// A running cluster. Index `i` is the i-th member started or added (`m{i+1}` unless named in
/// [`EtcdOptions::names`]); a removed member keeps its index.
pub struct EtcdCluster {
    dir: PathBuf,
    token: String,
    /// Extra etcd flags for every member.
    flags: Vec<String>,
    keep_dir: bool,
    pub pki: Pki,
    nodes: Vec<Node>,
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one answers `endpoint health`.
    pub fn start(n: usize) -> Result<EtcdCluster, EtcdError> {
        Self::start_with(EtcdOptions::new(n))
    }

    /// [`EtcdCluster::start`] with extra `etcd` flags for every member.
    pub fn start_with_flags(n: usize, flags: &[&str]) -> Result<EtcdCluster, EtcdError> {
        Self::start_with(EtcdOptions {
            flags: flags.iter().map(|f| f.to_string()).collect(),
            ..EtcdOptions::new(n)
        })
    }

    /// Starts a cluster as `options` say and waits (at most [`START_WAIT`]) until every member
    /// answers `endpoint health`. On failure every process started is stopped again and the
    /// cluster's directory is left for inspection (the error names the logs in it).
    pub fn start_with(options: EtcdOptions) -> Result<EtcdCluster, EtcdError> {
        let n = options.members;
        if !(1..=MAX_MEMBERS).contains(&n) {
            return Err(EtcdError::MemberCount(n));
        }
        if !options.names.is_empty() && options.names.len() != n {
            return Err(EtcdError::NameCount {
                names: options.names.len(),
                members: n,
            });
        }
        for (tool, package) in [
            ("etcd", "etcd-server"),
            ("etcdctl", "etcd-client"),
            ("openssl", "openssl"),
            ("timeout", "coreutils"),
            ("kill", "procps"),
        ] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !found {
                return Err(EtcdError::MissingTool { tool, package });
            }
        }
        // A port picked free may be taken by someone else before etcd binds it: try again.
        let mut attempt = 1;
        loop {
            let mut cluster = Self::prepare(&options)?;
            let started = (0..n).try_for_each(|i| cluster.spawn(i)).and_then(|()| {
                cluster.wait_healthy_within(&(0..n).collect::<Vec<_>>(), START_WAIT)
            });
            match started {
                Ok(()) => return Ok(cluster),
                Err(e)
                    if attempt < START_ATTEMPTS
                        && cluster.logs().contains("address already in use") =>
                {
                    tracing::warn!(error = %e, attempt, "etcd cluster: port clash, trying again");
                    attempt += 1;
                }
                Err(e) => {
                    cluster.keep_dir = true;
                    return Err(e);
                }
            }
        }
    }

    fn prepare(options: &EtcdOptions) -> Result<EtcdCluster, EtcdError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tag = format!(
            "{}-{}-{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let parent = options
            .parent_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        let dir = parent.join(format!("quorumguard-etcd-{tag}"));
        let _ = fs::remove_dir_all(&dir);
        let pki_dir = dir.join("pki");
        fs::create_dir_all(&pki_dir).map_err(|source| EtcdError::Io {
            what: "creating",
            path: pki_dir.clone(),
            source,
        })?;
        // A failure here leaves the directory, like any failed start.
        let pki = make_pki(&pki_dir)?;
        // From here on, dropping the cluster cleans up.
        let mut cluster = EtcdCluster {
            token: format!("qg-{tag}"),
            flags: options.flags.clone(),
            keep_dir: options.keep_dir,
            pki,
            nodes: Vec::new(),
            dir,
        };
        for i in 1..=options.members {
            let name = match options.names.get(i - 1) {
                Some(name) => name.clone(),
                None => format!("m{i}"),
            };
            let node = cluster.new_node(&name)?;
            cluster.nodes.push(node);
        }
        let initial = cluster
            .nodes
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        for node in &mut cluster.nodes {
            node.initial_cluster = initial.clone();
        }
        Ok(cluster)
    }

    fn new_node(&self, name: &str) -> Result<Node, EtcdError> {
        Ok(Node {
            name: name.to_string(),
            client_port: free_port()?,
            peer_port: free_port()?,
            data_dir: self.dir.join(format!("data-{name}")),
            log: self.dir.join(format!("{name}.log")),
            child: None,
            initial_cluster: String::new(),
            initial_state: "new",
            frozen: false,
        })
    }

    fn node(&self, i: usize) -> Result<&Node, EtcdError> {
        self.nodes
            .get(i)
            .ok_or_else(|| EtcdError::NoSuchMember(format!("#{i}")))
    }

    fn spawn(&mut self, i: usize) -> Result<(), EtcdError> {
        let pki = &self.pki;
        let node = self.node(i)?;
        if node.child.is_some() {
            return Err(EtcdError::AlreadyRunning(node.name.clone()));
        }
        let spawn_error = |source: io::Error| EtcdError::Spawn {
            member: node.name.clone(),
            client_port: node.client_port,
            peer_port: node.peer_port,
            log: node.log.clone(),
            source,
        };
        let log = File::options()
            .create(true)
            .append(true)
            .open(&node.log)
            .map_err(spawn_error)?;
        let log2 = log.try_clone().map_err(spawn_error)?;
        let p = |path: &Path| path.display().to_string();
        let mut command = Command::new("etcd");
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .args(["--name", &node.name])
            .args(["--data-dir", &p(&node.data_dir)])
            .args(["--listen-client-urls", &node.client_url()])
            .args(["--advertise-client-urls", &node.client_url()])
            .args(["--listen-peer-urls", &node.peer_url()])
            .args(["--initial-advertise-peer-urls", &node.peer_url()])
            .args(["--initial-cluster", &node.initial_cluster])
            .args(["--initial-cluster-state", node.initial_state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--cert-file", &p(&pki.server_crt)])
            .args(["--key-file", &p(&pki.server_key)])
            .arg("--client-cert-auth")
            .args(["--trusted-ca-file", &p(&pki.ca_crt)])
            .args(["--peer-cert-file", &p(&pki.peer_crt)])
            .args(["--peer-key-file", &p(&pki.peer_key)])
            .arg("--peer-client-cert-auth")
            .args(["--peer-trusted-ca-file", &p(&pki.ca_crt)])
            .arg(format!("--heartbeat-interval={HEARTBEAT_MS}"))
            .arg(format!("--election-timeout={ELECTION_MS}"))
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(&self.flags)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = super::child::spawn(command).map_err(spawn_error)?;
        match self.nodes.get_mut(i) {
            Some(node) => node.child = Some(child),
            // Cannot happen (the node was found above), but never leave a process unowned.
            None => {
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        Ok(())
    }

    /// The cluster's directory: `pki/`, `data-<member>/` and `<member>.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The number of members started or added here (removed and killed ones included).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Member `i`'s name.
    pub fn name(&self, i: usize) -> Option<&str> {
        self.nodes.get(i).map(|n| n.name.as_str())
    }

    /// The index of the member named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Member `i`'s client URL.
    pub fn client_url(&self, i: usize) -> Option<String> {
        self.nodes.get(i).map(Node::client_url)
    }

    /// Every member's client URL, running or not, in index order.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(Node::client_url).collect()
    }

    /// Member `i`'s log file.
    pub fn log_path(&self, i: usize) -> Option<&Path> {
        self.nodes.get(i).map(|n| n.log.as_path())
    }

    /// Client TLS for the prober: the cluster CA, and a client certificate quorumguard signs
    /// with it (as it does with a real cluster's `<cluster>-etcd` Secret).
    pub fn client_tls(&self) -> Result<ClientTls, EtcdError> {
        ClientTls::from_etcd_ca(
            &self.pki.ca_cert_pem,
            &self.pki.ca_key_pem,
            SystemTime::now(),
        )
        .map_err(|e| EtcdError::Pki(format!("signing a client certificate with the CA: {e}")))
    }

    fn signal(&self, i: usize, signal: &'static str) -> Result<(), EtcdError> {
        let node = self.node(i)?;
        let pid = node
            .child
            .as_ref()
            .ok_or_else(|| EtcdError::NotRunning(node.name.clone()))?
            .id();
        let failed = |why: String| EtcdError::Signal {
            signal,
            pid,
            member: node.name.clone(),
            why,
        };
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .map_err(|e| failed(e.to_string()))?;
        if status.success() {
            Ok(())
        } else {
            Err(failed(status.to_string()))
        }
    }

    /// Freezes member `i` (SIGSTOP): alive, its ports open, answering nothing.
    pub fn freeze(&mut self, i: usize) -> Result<(), EtcdError> {
        self.signal(i, "-STOP")?;
        if let Some(node) = self.nodes.get_mut(i) {
            node.frozen = true;
        }
        Ok(())
    }

    /// Lets a frozen member run again (SIGCONT).
    pub fn thaw(&mut self, i: usize) -> Result<(), EtcdError> {
        self.signal(i, "-CONT")?;
        if let Some(node) = self.nodes.get_mut(i) {
            node.frozen = false;
        }
        Ok(())
    }

    /// Kills member `i` (SIGKILL) and reaps it, if it runs. Its data dir stays.
    pub fn kill(&mut self, i: usize) {
        let Some(node) = self.nodes.get_mut(i) else {
            return;
        };
        if let Some(mut child) = node.child.take() {
            // A frozen process dies of SIGKILL too; SIGCONT first spares it a stopped state.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
        node.frozen = false;
    }

    /// Whether member `i`'s process is running (frozen counts as running).
    pub fn is_running(&mut self, i: usize) -> bool {
        match self.nodes.get_mut(i).and_then(|n| n.child.as_mut()) {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Runs etcdctl (API v3, TLS) against `endpoints`, bounded by `timeout 20`; its stdout.
    pub fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> Result<String, EtcdError> {
        self.etcdctl_handle().run(endpoints, args)
    }

    /// etcdctl with this cluster's CA and client certificate, detached from the cluster: a
    /// monitor can ask etcd from another thread while the cluster itself is busy (a membership
    /// change holds it for seconds, which is exactly when a monitor must keep looking).
    pub fn etcdctl_handle(&self) -> Etcdctl {
        Etcdctl {
            ca: self.pki.ca_crt.clone(),
            cert: self.pki.client_crt.clone(),
            key: self.pki.client_key.clone(),
            command_timeout: Duration::from_secs(3),
        }
    }

    /// The endpoints of running, unfrozen members (for admin commands).
    fn live_endpoints(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for node in &mut self.nodes {
            let running = node
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
            if running && !node.frozen {
                out.push(node.client_url());
            }
        }
        out
    }

    /// `etcdctl member list -w json`, asked of each running, unfrozen member until one answers.
    pub fn member_list(&mut self) -> Result<Vec<ListedMember>, EtcdError> {
        let what = "member list";
        let mut last = String::from("no member is running");
        for ep in self.live_endpoints() {
            match self.etcdctl(std::slice::from_ref(&ep), &["member", "list", "-w", "json"]) {
                Ok(out) => return parse_member_list(&out),
                Err(e) => last = e.to_string(),
            }
        }
        Err(EtcdError::NoAnswer { what, last })
    }

    /// Member `i`'s ID, from the member list.
    pub fn member_id(&mut self, i: usize) -> Result<u64, EtcdError> {
        let name = self.node(i)?.name.clone();
        self.member_list()?
            .into_iter()
            .find(|m| m.name == name)
            .map(|m| m.id)
            .ok_or(EtcdError::NoSuchMember(name))
    }

    /// A membership change through a live member other than `not_via` (a member being removed
    /// stops as the removal applies, and may not answer it: "etcdserver: server stopped"),
    /// retried while etcd answers "unhealthy cluster" (its peers must have been connected for
    /// 5 s).
    fn member_change(
        &mut self,
        args: &[&str],
        not_via: Option<usize>,
    ) -> Result<String, EtcdError> {
        let started = Instant::now();
        let avoid = not_via.and_then(|i| self.client_url(i));
        loop {
            let live = self.live_endpoints();
            let others: Vec<String> = live
                .iter()
                .filter(|e| Some(*e) != avoid.as_ref())
                .cloned()
                .collect();
            let eps = if others.is_empty() { live } else { others };
            let Some(first) = eps.first() else {
                return Err(EtcdError::NoAnswer {
                    what: "a membership change",
                    last: "no member is running".into(),
                });
            };
            match self.etcdctl(std::slice::from_ref(first), args) {
                Ok(out) => return Ok(out),
                Err(e)
                    if e.to_string().contains("unhealthy cluster")
                        && started.elapsed() < RECONFIG_WAIT =>
                {
                    sleep(Duration::from_millis(300));
                }
                Err(e) => {
                    return Err(EtcdError::MemberChange {
                        error: e.to_string(),
                        tail: self.logs(),
                    });
                }
            }
        }
    }

    /// Removes member `i` with `etcdctl member remove`, then waits (at most [`EXIT_WAIT`]) for
    /// its process to exit by itself, as a removed etcd member does. Returns whether it did;
    /// if not, kills it.
    pub fn remove_member(&mut self, i: usize) -> Result<bool, EtcdError> {
        let id = format!("{:x}", self.member_id(i)?);
        self.member_change(&["member", "remove", &id], Some(i))?;
        let started = Instant::now();
        let mut exited = false;
        while started.elapsed() < EXIT_WAIT {
            if !self.is_running(i) {
                exited = true;
                break;
            }
            sleep(Duration::from_millis(100));
        }
        self.kill(i);
        Ok(exited)
    }

    /// Adds a learner named `name` with `etcdctl member add --learner` and returns its index.
    /// It is not started: it has no name and no client URLs in the member list until
    /// [`EtcdCluster::start_member`].
    pub fn add_learner(&mut self, name: &str) -> Result<usize, EtcdError> {
        self.add(name, true)
    }

    /// Adds a voting member named `name` (`etcdctl member add`, as kubeadm did before learner
    /// mode) and returns its index. From this moment it counts towards the quorum while it has
    /// not started: [`EtcdCluster::start_member`] it soon.
    pub fn add_member(&mut self, name: &str) -> Result<usize, EtcdError> {
        self.add(name, false)
    }

    fn add(&mut self, name: &str, learner: bool) -> Result<usize, EtcdError> {
        let mut node = self.new_node(name)?;
        let peer = format!("--peer-urls={}", node.peer_url());
        let mut args = vec!["member", "add", name, &peer];
        if learner {
            args.push("--learner");
        }
        let out = self.member_change(&args, None)?;
        // etcdctl prints the --initial-cluster the new member must start with.
        node.initial_cluster = out
            .lines()
            .find_map(|l| l.strip_prefix("ETCD_INITIAL_CLUSTER="))
            .map(|v| v.trim_matches('"').to_string())
            .ok_or_else(|| EtcdError::Output {
                what: "member add",
                why: format!("no ETCD_INITIAL_CLUSTER in: {out}"),
            })?;
        node.initial_state = "existing";
        self.nodes.push(node);
        Ok(self.nodes.len() - 1)
    }

    /// Promotes learner `i` to a voting member (`etcdctl member promote`), retried while etcd
    /// says the learner is not in sync yet (at most [`RECONFIG_WAIT`]).
    pub fn promote(&mut self, i: usize) -> Result<(), EtcdError> {
        let id = format!("{:x}", self.member_id(i)?);
        let started = Instant::now();
        loop {
            match self.member_change(&["member", "promote", &id], None) {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.to_string().contains("in sync with leader")
                        && started.elapsed() < RECONFIG_WAIT =>
                {
                    sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Removes member `i` from the member list and kills its process at once, frozen or not:
    /// what deleting a Machine does after KCP removed its member (the VM goes away).
    pub fn remove_and_stop(&mut self, i: usize) -> Result<(), EtcdError> {
        let id = format!("{:x}", self.member_id(i)?);
        self.member_change(&["member", "remove", &id], Some(i))?;
        self.kill(i);
        Ok(())
    }

    /// Member `i`'s process ID, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes
            .get(i)?
            .child
            .as_ref()
            .map(std::process::Child::id)
    }

    /// Whether member `i` is frozen.
    pub fn is_frozen(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| n.frozen)
    }

    /// Starts a member added with [`EtcdCluster::add_learner`] or [`EtcdCluster::add_member`],
    /// or restarts a killed one (from its data dir), and waits (at most
    /// [`START_WAIT`]) until its status shows a leader and no errors (a learner refuses
    /// `endpoint health`).
    pub fn start_member(&mut self, i: usize) -> Result<(), EtcdError> {
        self.spawn(i)?;
        let ep = [self.node(i)?.client_url()];
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < START_WAIT {
            match self.etcdctl(&ep, &["endpoint", "status", "-w", "json"]) {
                Ok(out) if out.contains("\"leader\":") && !out.contains("\"errors\"") => {
                    return Ok(());
                }
                Ok(out) => last = out,
                Err(e) => last = e.to_string(),
            }
            if !self.is_running(i) {
                break;
            }
            sleep(Duration::from_millis(200));
        }
        let node = self.node(i)?;
        Err(EtcdError::MemberStart {
            member: node.name.clone(),
            client_port: node.client_port,
            log: node.log.clone(),
            waited: started.elapsed(),
            last,
            tail: self.logs(),
        })
    }

    /// Waits (at most [`START_WAIT`]) until members `members` all answer `endpoint health`.
    pub fn wait_healthy(&mut self, members: &[usize]) -> Result<(), EtcdError> {
        self.wait_healthy_within(members, START_WAIT)
    }

    fn wait_healthy_within(&mut self, members: &[usize], limit: Duration) -> Result<(), EtcdError> {
        let mut eps = Vec::new();
        let mut who = Vec::new();
        for &i in members {
            let node = self.node(i)?;
            eps.push(node.client_url());
            who.push(node.describe());
        }
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < limit {
            for &i in members {
                if !self.is_running(i) {
                    let node = self.node(i)?;
                    return Err(EtcdError::Exited {
                        member: node.name.clone(),
                        client_port: node.client_port,
                        log: node.log.clone(),
                        tail: self.logs(),
                    });
                }
            }
            match self.etcdctl(&eps, &["endpoint", "health"]) {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            sleep(Duration::from_millis(200));
        }
        Err(EtcdError::NotHealthy {
            members: who.join(", "),
            waited: limit,
            last,
            tail: self.logs(),
        })
    }

    /// The last lines of every member's log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let text = fs::read_to_string(&node.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
            out.push_str(&format!(
                "--- {} ({}) last lines:\n",
                node.name,
                node.log.display()
            ));
            for l in tail {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        if self.keep_dir {
            tracing::info!(dir = %self.dir.display(), "etcd cluster stopped; its directory is kept");
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn parse_member_list(out: &str) -> Result<Vec<ListedMember>, EtcdError> {
    let bad = |why: String| EtcdError::Output {
        what: "member list",
        why,
    };
    let v: serde_json::Value =
        serde_json::from_str(out).map_err(|e| bad(format!("not JSON ({e}): {out}")))?;
    let members = v["members"]
        .as_array()
        .ok_or_else(|| bad(format!("no members: {out}")))?;
    members
        .iter()
        .map(|m| {
            let id = m["ID"]
                .as_u64()
                .ok_or_else(|| bad(format!("a member without a u64 ID: {m}")))?;
            Ok(ListedMember {
                id,
                name: m["name"].as_str().unwrap_or("").to_string(),
                learner: m["isLearner"].as_bool().unwrap_or(false),
            })
        })
        .collect()
}

/// A port free on 127.0.0.1 right now.
fn free_port() -> Result<u16, EtcdError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(EtcdError::FreePort)
}

/// The CA (Cluster API-shaped), server and peer certificates, and etcdctl's client certificate.
fn make_pki(dir: &Path) -> Result<Pki, EtcdError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| EtcdError::Pki(format!("{what}: {e}"));
    // RSA key generation needs aws-lc in rcgen; ring only signs. Cluster API writes PKCS#1.
    let ca_key_file = dir.join("ca.key");
    let ca_pk8_file = dir.join("ca.pk8");
    run(Command::new("openssl")
        .args(["genrsa", "-traditional", "-out"])
        .arg(&ca_key_file)
        .arg("2048"))?;
    run(Command::new("openssl")
        .args(["pkcs8", "-topk8", "-nocrypt", "-in"])
        .arg(&ca_key_file)
        .arg("-out")
        .arg(&ca_pk8_file))?;
    let ca_key_pem = read(&ca_key_file)?;
    if !ca_key_pem.contains("BEGIN RSA PRIVATE KEY") {
        return Err(EtcdError::Pki(format!(
            "openssl genrsa -traditional wrote no PKCS#1 key to {}",
            ca_key_file.display()
        )));
    }
    let ca_key =
        KeyPair::from_pem(&read(&ca_pk8_file)?).map_err(|e| failed("reading the CA key", &e))?;

    let now = SystemTime::now();
    let mut ca = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    let ca_name = PrintableString::try_from("etcd-ca").map_err(|e| failed("the CA's name", &e))?;
    dn.push(DnType::CommonName, DnValue::PrintableString(ca_name));
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    ca.not_before = (now - Duration::from_secs(3600)).into();
    ca.not_after = (now + Duration::from_secs(10 * 86_400)).into();
    let ca_cert_pem = ca
        .self_signed(&ca_key)
        .map_err(|e| failed("self-signing the CA", &e))?
        .pem();
    let issuer = Issuer::new(ca, ca_key);

    let localhost: rcgen::string::Ia5String = "localhost"
        .try_into()
        .map_err(|e| failed("the DNS name localhost", &e))?;
    let leaf = |cn: &str| -> Result<(String, String), EtcdError> {
        let key = KeyPair::generate().map_err(|e| failed("generating a key", &e))?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        p.distinguished_name = dn;
        p.subject_alt_names = vec![
            SanType::IpAddress([127, 0, 0, 1].into()),
            SanType::DnsName(localhost.clone()),
        ];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // etcd 3.4's gRPC gateway dials its own client port with the server certificate.
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.use_authority_key_identifier_extension = true;
        p.not_before = (now - Duration::from_secs(3600)).into();
        p.not_after = (now + Duration::from_secs(10 * 86_400)).into();
        let cert = p
            .signed_by(&key, &issuer)
            .map_err(|e| failed(&format!("signing the {cn} certificate"), &e))?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        fs::write(&path, text).map_err(|source| EtcdError::Io {
            what: "writing",
            path: path.clone(),
            source,
        })?;
        Ok::<_, EtcdError>(path)
    };
    let (server_crt, server_key) = leaf("etcd-server")?;
    let (peer_crt, peer_key) = leaf("etcd-peer")?;
    let client = sign_client_cert(&ca_cert_pem, &ca_key_pem, "etcdctl", now)
        .map_err(|e| failed("signing etcdctl's client certificate", &e))?;
    Ok(Pki {
        ca_crt: write("ca.crt", &ca_cert_pem)?,
        server_crt: write("server.crt", &server_crt)?,
        server_key: write("server.key", &server_key)?,
        peer_crt: write("peer.crt", &peer_crt)?,
        peer_key: write("peer.key", &peer_key)?,
        client_crt: write("client.crt", &client.cert_pem)?,
        client_key: write("client.key", &client.key_pem)?,
        ca_cert_pem,
        ca_key_pem,
    })
}

fn read(path: &Path) -> Result<String, EtcdError> {
    fs::read_to_string(path).map_err(|source| EtcdError::Io {
        what: "reading",
        path: path.to_path_buf(),
        source,
    })
}

/// Runs a command to its end; its failure, with stderr, is an error.
fn run(cmd: &mut Command) -> Result<(), EtcdError> {
    let out = cmd
        .output()
        .map_err(|e| EtcdError::Pki(format!("{cmd:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(EtcdError::Pki(format!(
            "{cmd:?} ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_member_count_is_checked_first() {
        assert!(matches!(
            EtcdCluster::start(0),
            Err(EtcdError::MemberCount(0))
        ));
        assert!(matches!(
            EtcdCluster::start(MAX_MEMBERS + 1),
            Err(EtcdError::MemberCount(n)) if n == MAX_MEMBERS + 1
        ));
    }

    /// Needs `etcd` on PATH, like the integration tests; the member exits at once.
    #[test]
    fn a_member_that_cannot_start_is_named_with_its_port_and_log() {
        let err = match EtcdCluster::start_with_flags(1, &["--no-such-flag"]) {
            Err(e) => e,
            Ok(_) => panic!("etcd accepted --no-such-flag"),
        };
        let text = err.to_string();
        let EtcdError::Exited {
            member,
            client_port,
            log,
            tail,
        } = err
        else {
            panic!("expected Exited, got: {text}");
        };
        assert_eq!(member, "m1");
        assert!(
            text.contains(&format!("client port {client_port}")),
            "{text}"
        );
        assert!(text.contains(&log.display().to_string()), "{text}");
        assert!(tail.contains("--- m1 ("), "{tail}");
        // A failed start leaves its directory, with the log the error names.
        let logged = fs::read_to_string(&log).unwrap_or_default();
        assert!(
            logged.contains("no-such-flag"),
            "{}: {logged}",
            log.display()
        );
        if let Some(dir) = log.parent() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}
