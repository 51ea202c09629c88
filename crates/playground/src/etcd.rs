//! A real etcd cluster on 127.0.0.1 with TLS: the playground's etcd, and the etcd of the tests
//! of the prober, the sweep and the status enricher.
//!
//! [`EtcdCluster::start`] makes a CA shaped like Cluster API's `<cluster>-etcd` Secret (RSA-2048
//! key in PKCS#1 PEM, subject `CN=etcd-ca` as a PrintableString, as Go writes them), server and
//! peer certificates for 127.0.0.1/localhost, and starts `n` `etcd` processes (`m1`..`mn`) with
//! client and peer certificate auth and fast raft timings. Fault helpers freeze, thaw, kill and
//! remove members and add learners; admin operations go through `etcdctl` from PATH.
//!
//! Needs `etcd` and `etcdctl`: from the directory [`BIN_DIR_VAR`] names when it is set (e.g.
//! etcd 3.5.1, which `scripts/deps.sh` installs), else on PATH (Debian `etcd-server` and
//! `etcd-client`, 3.4.23); [`program`] picks. Tested on both. Also on PATH: `openssl` (the
//! CA's RSA key: rcgen on ring signs with RSA but cannot generate one), `timeout` (coreutils)
//! and `kill`.
//!
//! Safety: only 127.0.0.1; free ports come from binding port 0; every wait is bounded in time;
//! every process started here is killed on drop; the cluster's directory (certificates, data,
//! one log per member) is removed on drop unless [`EtcdOptions::keep_dir`], and kept when the
//! cluster fails to start. Every failure is an [`EtcdError`] naming the member, its port and its
//! log where there is one, with the tail of the logs where they explain it.
//!
//! How many clusters may run at once is the caller's business: the tests run one per test
//! binary at a time (`crates/testkit/src/etcd.rs`), because etcd's 500 ms election timeout must not
//! be starved into spurious elections on a 2-core machine.
//!
//! This file holds the limits and timings, the errors, the options, and [`EtcdCluster`] with
//! its members and what can be read of them. The rest, one file each under `etcd/`:
//! - `start.rs`: starting the cluster and a member, and waiting until they answer.
//! - `faults.rs`: the faults on a member's process: freeze, thaw, kill.
//! - `membership.rs`: membership changes and the member list, through `etcdctl`.
//! - `etcdctl.rs`: [`Etcdctl`], the cluster's `etcdctl` with its CA and client certificate.
//! - `pki.rs`: [`Pki`], the cluster's CA and certificates.

mod etcdctl;
mod faults;
mod membership;
mod pki;
mod start;
#[cfg(test)]
mod tests;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, SystemTime};

use quorumguard_observe::etcd::ClientTls;

pub use etcdctl::Etcdctl;
pub use membership::ListedMember;
pub use pki::Pki;

/// The variable naming the directory of the `etcd` and `etcdctl` to run (and `etcdutl`, where
/// one is): every etcd cluster started here, every etcdctl run against one, and the real
/// kube-apiserver's storage etcd ([`crate::realapi::Assets`]). Unset or empty: `etcd` and
/// `etcdctl` on PATH. `scripts/deps.sh` installs etcd 3.5.1 and exports its directory as
/// `QUORUMGUARD_ETCD35_DIR`, so `QUORUMGUARD_ETCD_BIN_DIR=$QUORUMGUARD_ETCD35_DIR` runs on 3.5.
pub const BIN_DIR_VAR: &str = "QUORUMGUARD_ETCD_BIN_DIR";

/// The directory [`BIN_DIR_VAR`] names, when it is set and not empty (a relative one taken
/// from the current directory).
pub fn bin_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os(BIN_DIR_VAR).filter(|d| !d.is_empty())?);
    Some(std::path::absolute(&dir).unwrap_or(dir))
}

/// What to run for `tool` (`etcd`, `etcdctl`, `etcdutl`): `tool` in [`bin_dir`] when it is
/// set, else `tool` itself (found on PATH).
pub fn program(tool: &str) -> PathBuf {
    match bin_dir() {
        Some(dir) => dir.join(tool),
        None => PathBuf::from(tool),
    }
}

/// `etcd --version`'s version (`3.4.23`, `3.5.1`) of the etcd [`program`] picks.
pub fn etcd_version() -> Result<String, EtcdError> {
    let etcd = program("etcd");
    let out = std::process::Command::new(&etcd)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| EtcdError::Etcdctl(format!("running {} --version: {e}", etcd.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("etcd Version: "))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| EtcdError::Output {
            what: "etcd --version",
            why: format!("no \"etcd Version: \" line in {text:?}"),
        })
}

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
    #[error("{BIN_DIR_VAR}={}: no executable {tool} there (unset it for the etcd on PATH)", dir.display())]
    MissingInBinDir { tool: &'static str, dir: PathBuf },
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
    fn node(&self, i: usize) -> Result<&Node, EtcdError> {
        self.nodes
            .get(i)
            .ok_or_else(|| EtcdError::NoSuchMember(format!("#{i}")))
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
