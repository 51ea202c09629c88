//! The tests' etcd: [`quorumguard::playground::etcd::EtcdCluster`] (a real etcd cluster on
//! 127.0.0.1 with TLS; see there), with what only tests want on top:
//!
//! - At most one cluster runs per test process (one binary) at a time, and at most
//!   [`SLOTS`] on the machine, whichever test processes start them (a [`Slot`] held by the
//!   cluster: this process's, then one of the machine's lock files): the machines are 2-core,
//!   and etcd's 500 ms election timeout must not be starved into spurious elections by parallel
//!   tests. For the same reason, 1 to 4 members, and a test that keeps the cores busy holds a
//!   slot too ([`busy`]).
//! - Every failure fails the test: the methods below are the library's, panicking with its
//!   error (which names the member, its port and its log) instead of returning it. The rest of
//!   the library's methods are reached through `Deref`.
//! - When a test panics, the tail of every member's log is printed; `QG_KEEP_ETCD=1` keeps the
//!   cluster's directory.
//! - Which etcd: `QUORUMGUARD_ETCD_BIN_DIR`'s `etcd` and `etcdctl` when it is set (e.g. etcd
//!   3.5.1 from `scripts/deps.sh`), else PATH's (Debian's 3.4.23): the library's
//!   [`quorumguard::playground::etcd::program`]. [`version`] is its version, for tests whose
//!   expectation follows it.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::Request;
use hyper::body::Bytes;

use quorumguard::etcd::ClientTls;
use quorumguard::playground::etcd as lib;
pub use quorumguard::playground::etcd::{
    EXIT_WAIT, EtcdError, EtcdOptions, ListedMember, Pki, RECONFIG_WAIT, START_WAIT,
};

/// How many etcd clusters (or busy computations) the machine runs at once across every test
/// process: `QUORUMGUARD_TEST_SLOTS`, else 2 (one per core: what the 2-core CI machine held
/// before the slots were shared, when each of the two lanes had a slot of its own).
pub const SLOTS: usize = 2;

/// How long a test waits for a slot before it fails saying so (the whole suite's slowest lane
/// is ~10 minutes: a wait this long means a slot is held by a process that hangs).
const SLOT_WAIT: Duration = Duration::from_secs(40 * 60);

/// One of the machine's slots: an exclusive `flock` on one of the lock files in
/// `$TMPDIR/quorumguard-test-slots/`, released when dropped or when its process ends however it
/// ends (the kernel drops the lock with the file), so a crashed test never keeps a slot.
#[must_use = "the slot is released when dropped"]
pub struct Slot {
    // Dropped in this order: the machine's slot, then this process's.
    _file: File,
    _in_process: MutexGuard<'static, ()>,
}

/// One slot per test process as well: the tests of one binary run at once, and two etcd
/// clusters (or a cluster and a busy computation) of one binary at once starved the playground's
/// stories and the real API server's Lease renewals on 2 cores (CI's runs of 2026-12-07 failed
/// the truth check of two stories and a Lease test with the slow lane running two at once).
static IN_PROCESS: Mutex<()> = Mutex::new(());

fn slot_count() -> usize {
    std::env::var("QUORUMGUARD_TEST_SLOTS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(SLOTS)
}

fn slot_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("quorumguard-test-slots");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}

/// Takes a free slot, waiting (polling every 100 ms, at most [`SLOT_WAIT`]) while every one is
/// held.
fn take_slot() -> Slot {
    let in_process = IN_PROCESS.lock().unwrap_or_else(PoisonError::into_inner);
    let dir = slot_dir();
    let n = slot_count();
    let started = Instant::now();
    loop {
        for i in 0..n {
            let path = dir.join(format!("slot-{i}"));
            let file = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
            // SAFETY: flock on a file descriptor this function owns; no memory is shared.
            let taken =
                unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
            if taken {
                return Slot {
                    _file: file,
                    _in_process: in_process,
                };
            }
        }
        assert!(
            started.elapsed() < SLOT_WAIT,
            "waited {SLOT_WAIT:?} for one of the {n} test slots in {}: is a test process hanging?",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The version of the etcd the tests run (`3.4.23`, `3.5.1`): what every member's status
/// reports. Panics when `etcd --version` cannot say.
pub fn version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| lib::etcd_version().unwrap_or_else(|e| panic!("etcd's version: {e}")))
}

/// `(major, minor)` of [`version`]: `(3, 4)`, `(3, 5)`.
pub fn minor_version() -> (u32, u32) {
    let v = version();
    let mut parts = v.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => panic!("etcd's version {v:?} is not MAJOR.MINOR.PATCH"),
    }
}

/// A workload API-server stand-in relaying `kube-system/etcd-<member>` to every member of `etcd`
/// (as kube-apiserver, through the kubelet, forwards a port of kubeadm's static etcd pod): what
/// the port-forward transport reaches etcd through.
pub async fn workload_api(etcd: &lib::EtcdCluster) -> anyhow::Result<crate::apiserver::ApiServer> {
    use anyhow::Context;
    let api = crate::apiserver::ApiServer::start()
        .await
        .context("a workload API-server stand-in")?;
    for i in 0..etcd.len() {
        let (Some(url), Some(member)) = (etcd.client_url(i), etcd.name(i)) else {
            anyhow::bail!("etcd member {i} has no client URL or name");
        };
        let addr: SocketAddr = url
            .trim_start_matches("https://")
            .parse()
            .with_context(|| format!("{url}: a loopback address"))?;
        api.forward_pod("kube-system", &format!("etcd-{member}"), addr);
    }
    Ok(api)
}

/// etcd requests by method between two readings of [`EtcdCluster::grpc_requests`]: how many in
/// all, and as "Method n, ..." (methods with none left out).
pub fn grpc_delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> (u64, String) {
    let mut total = 0;
    let mut by_method = Vec::new();
    for (method, n) in after {
        let d = n - before.get(method).copied().unwrap_or(0);
        if d > 0 {
            total += d;
            by_method.push(format!("{method} {d}"));
        }
    }
    (total, by_method.join(", "))
}

/// A runtime like the binary's, for tests that drive etcd from async code: two workers, as on
/// the 2-core CI machine (the etcd slot is taken outside it: it is a blocking lock).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A slot, for tests that start etcd through the library (the playground's world): hold it
/// while that cluster runs.
pub fn slot() -> Slot {
    take_slot()
}

/// For a test that keeps the cores busy (a model check, thousands of property cases, a cargo
/// build): it holds a slot while it computes, so it shares the machine with at most one etcd
/// cluster and starves no cluster's election timeout (the tests of one binary run at once).
pub fn busy() -> Slot {
    slot()
}

/// A running test cluster. Index `i` is member `m{i+1}` (or the name given to a learner).
pub struct EtcdCluster {
    // Dropped first (every member killed), then the slot is released.
    inner: lib::EtcdCluster,
    _slot: Slot,
}

impl Deref for EtcdCluster {
    type Target = lib::EtcdCluster;

    fn deref(&self) -> &lib::EtcdCluster {
        &self.inner
    }
}

impl DerefMut for EtcdCluster {
    fn deref_mut(&mut self) -> &mut lib::EtcdCluster {
        &mut self.inner
    }
}

impl EtcdCluster {
    /// Starts `n` (1..=4) members and waits until every one answers `endpoint health`.
    pub fn start(n: usize) -> EtcdCluster {
        Self::start_with_flags(n, &[])
    }

    /// [`EtcdCluster::start`] with extra `etcd` flags for every member (e.g. a tiny
    /// `--quota-backend-bytes` to raise a NOSPACE alarm).
    pub fn start_with_flags(n: usize, flags: &[&str]) -> EtcdCluster {
        assert!(
            (1..=4).contains(&n),
            "1 to 4 members (2-core machines), not {n}"
        );
        let slot = take_slot();
        let options = EtcdOptions {
            flags: flags.iter().map(|f| f.to_string()).collect(),
            keep_dir: std::env::var_os("QG_KEEP_ETCD").is_some(),
            ..EtcdOptions::new(n)
        };
        let inner = lib::EtcdCluster::start_with(options)
            .unwrap_or_else(|e| panic!("etcd test cluster did not start: {e}"));
        EtcdCluster { inner, _slot: slot }
    }

    pub fn name(&self, i: usize) -> &str {
        self.inner
            .name(i)
            .unwrap_or_else(|| panic!("no member #{i} here"))
    }

    pub fn index_of(&self, name: &str) -> usize {
        self.inner
            .index_of(name)
            .unwrap_or_else(|| panic!("no member {name:?} here"))
    }

    /// Member `i`'s client URL.
    pub fn client_url(&self, i: usize) -> String {
        self.inner
            .client_url(i)
            .unwrap_or_else(|| panic!("no member #{i} here"))
    }

    /// Client TLS for the prober: the cluster CA, and a client certificate quorumguard signs
    /// with it (as it does with a real cluster's `<cluster>-etcd` Secret).
    pub fn client_tls(&self) -> ClientTls {
        self.inner
            .client_tls()
            .expect("sign a client certificate with the test CA")
    }

    /// The gRPC requests the members have received so far, by method (`MemberList`, `Status`,
    /// `Range`, `Alarm`, ...): etcd's own `grpc_server_started_total`, summed over the members,
    /// read from each member's `/metrics` on its client URL (TLS with a client certificate, as
    /// the prober connects; reading it is HTTP, not gRPC, so it counts nothing itself). What the
    /// etcd request budgets count ([`crate::budgets`]): etcd's count, not the prober's. A member
    /// added and never started (no process) received nothing and is skipped. Panics when a
    /// member does not answer (a frozen one).
    pub async fn grpc_requests(&self) -> BTreeMap<String, u64> {
        let tls = self.client_tls().config();
        let mut out = BTreeMap::new();
        for i in 0..self.len() {
            if self.inner.pid(i).is_none() {
                continue;
            }
            let url = self.client_url(i);
            let addr: SocketAddr = url
                .trim_start_matches("https://")
                .parse()
                .unwrap_or_else(|e| panic!("member #{i}'s client URL {url}: {e}"));
            // An absolute URI: etcd's HTTP/2 server refuses a request without `:scheme`.
            let request = Request::get(format!("https://localhost:{}/metrics", addr.port()))
                .body(Full::new(Bytes::new()))
                .expect("request");
            let (status, body) = crate::https::send(addr, tls.clone(), request)
                .await
                .unwrap_or_else(|e| panic!("GET {url}/metrics: {e}"));
            assert!(status.is_success(), "GET {url}/metrics answered {status}");
            for line in String::from_utf8_lossy(&body).lines() {
                let Some((labels, value)) = line
                    .strip_prefix("grpc_server_started_total{")
                    .and_then(|l| l.split_once("} "))
                else {
                    continue;
                };
                let method = labels
                    .split("grpc_method=\"")
                    .nth(1)
                    .and_then(|m| m.split('"').next())
                    .unwrap_or("?");
                let n: f64 = value
                    .trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{url}/metrics: {line:?}: {e}"));
                *out.entry(method.to_string()).or_insert(0) += n as u64;
            }
        }
        out
    }

    /// Freezes member `i` (SIGSTOP): alive, its ports open, answering nothing.
    pub fn freeze(&mut self, i: usize) {
        self.inner.freeze(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Lets a frozen member run again (SIGCONT).
    pub fn thaw(&mut self, i: usize) {
        self.inner.thaw(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Runs etcdctl (API v3, TLS) against `endpoints`, bounded by `timeout 20`.
    pub fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        self.inner
            .etcdctl(endpoints, args)
            .map_err(|e| e.to_string())
    }

    /// `etcdctl member list -w json`: (ID, name, is learner) per member.
    pub fn member_list(&mut self) -> Vec<(u64, String, bool)> {
        let members = self.inner.member_list().unwrap_or_else(|e| panic!("{e}"));
        members
            .into_iter()
            .map(|m| (m.id, m.name, m.learner))
            .collect()
    }

    /// Member `i`'s ID, from the member list.
    pub fn member_id(&mut self, i: usize) -> u64 {
        self.inner.member_id(i).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Removes member `i` with `etcdctl member remove`, then waits (bounded) for its process to
    /// exit by itself, as a removed etcd member does. Returns whether it did; if not, kills it.
    pub fn remove_member(&mut self, i: usize) -> bool {
        self.inner
            .remove_member(i)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Adds a learner named `name` with `etcdctl member add --learner` and returns its index.
    /// It is not started: it has no name and no client URLs in the member list until
    /// [`EtcdCluster::start_member`].
    pub fn add_learner(&mut self, name: &str) -> usize {
        self.inner
            .add_learner(name)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Adds a voting member named `name` with `etcdctl member add` and returns its index. It
    /// counts towards the quorum at once, and has not started: [`EtcdCluster::start_member`] it.
    pub fn add_member(&mut self, name: &str) -> usize {
        self.inner
            .add_member(name)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a member added with [`EtcdCluster::add_learner`] and waits (bounded) until its
    /// status shows a leader and no errors (a learner refuses `endpoint health`).
    pub fn start_member(&mut self, i: usize) {
        self.inner.start_member(i).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits (bounded) until members `members` all answer `endpoint health`.
    pub fn wait_healthy(&mut self, members: Vec<usize>) {
        self.inner
            .wait_healthy(&members)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "etcd test cluster in {}:\n{}",
                self.inner.dir().display(),
                self.inner.logs()
            );
        }
        if std::env::var_os("QG_KEEP_ETCD").is_some() {
            eprintln!("kept {}", self.inner.dir().display());
        }
    }
}
