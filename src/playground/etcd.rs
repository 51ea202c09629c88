//! A real etcd cluster on 127.0.0.1 with TLS, for tests of the etcd prober.
//!
//! [`EtcdCluster::start`] makes a CA shaped like Cluster API's `<cluster>-etcd` Secret (RSA-2048
//! key in PKCS#1 PEM, subject `CN=etcd-ca` as a PrintableString, as Go writes them), server and
//! peer certificates for 127.0.0.1/localhost, and starts `n` `etcd` processes (`m1`..`mn`) with
//! client and peer certificate auth and fast raft timings. Fault helpers freeze, thaw, kill and
//! remove members and add learners; admin operations go through `etcdctl` from PATH.
//!
//! Safety: only 127.0.0.1; free ports come from binding port 0; every wait is bounded in time;
//! every process started here is killed on drop (also when a test panics, and then the tail of
//! every member's log is printed); the temp dir is removed unless `QG_KEEP_ETCD=1`.
//!
//! At most one cluster runs per test binary at a time (a global slot held by the cluster): the
//! machines are 2-core, and etcd's 500 ms election timeout must not be starved into spurious
//! elections by parallel tests.

use std::fs::{self, File};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use crate::etcd::{ClientTls, certs::sign_client_cert};
use rcgen::string::PrintableString;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// How long the cluster may take to become healthy.
pub const START_WAIT: Duration = Duration::from_secs(20);
/// How long a membership change may be refused ("unhealthy cluster": etcd wants its peers
/// connected for 5 s first) before giving up.
pub const RECONFIG_WAIT: Duration = Duration::from_secs(15);
/// How long a removed member may take to exit by itself.
pub const EXIT_WAIT: Duration = Duration::from_secs(15);
/// etcd's raft timings here (ms): fast, so elections and starts take a second, not ten.
const HEARTBEAT_MS: u32 = 50;
const ELECTION_MS: u32 = 500;

static SLOT: Mutex<()> = Mutex::new(());

/// The certificates of a test cluster.
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
}

/// A running test cluster. Index `i` is member `m{i+1}` (or the name given to a learner).
pub struct EtcdCluster {
    dir: PathBuf,
    token: String,
    /// Extra etcd flags for every member.
    flags: Vec<String>,
    pub pki: Pki,
    nodes: Vec<Node>,
    _slot: MutexGuard<'static, ()>,
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
        for tool in ["etcd", "etcdctl", "openssl", "timeout", "kill"] {
            assert!(
                Command::new("sh")
                    .args(["-c", &format!("command -v {tool}")])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success()),
                "{tool} is needed on PATH (Debian: etcd-server, etcd-client, openssl, coreutils)"
            );
        }
        // A port picked free may be taken by someone else before etcd binds it: try again.
        for attempt in 1..=3 {
            let mut cluster = Self::prepare(n, flags);
            for i in 0..n {
                cluster.spawn(i);
            }
            match cluster.wait_healthy_within((0..n).collect(), START_WAIT) {
                Ok(()) => return cluster,
                Err(e) if attempt < 3 && cluster.logs().contains("address already in use") => {
                    eprintln!("etcd test cluster: port clash, trying again ({e})");
                }
                Err(e) => panic!("etcd test cluster did not start: {e}\n{}", cluster.logs()),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    fn prepare(n: usize, flags: &[&str]) -> EtcdCluster {
        let slot = SLOT.lock().unwrap_or_else(|e| e.into_inner());
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
        let dir = std::env::temp_dir().join(format!("quorumguard-etcd-{tag}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("pki")).expect("create the temp dir");
        let pki = make_pki(&dir.join("pki"));
        let mut cluster = EtcdCluster {
            token: format!("qg-{tag}"),
            flags: flags.iter().map(|f| f.to_string()).collect(),
            pki,
            nodes: Vec::new(),
            dir,
            _slot: slot,
        };
        for i in 1..=n {
            let node = cluster.new_node(&format!("m{i}"));
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
        cluster
    }

    fn new_node(&self, name: &str) -> Node {
        Node {
            name: name.to_string(),
            client_port: free_port(),
            peer_port: free_port(),
            data_dir: self.dir.join(format!("data-{name}")),
            log: self.dir.join(format!("{name}.log")),
            child: None,
            initial_cluster: String::new(),
            initial_state: "new",
            frozen: false,
        }
    }

    fn spawn(&mut self, i: usize) {
        let pki = &self.pki;
        let node = &self.nodes[i];
        assert!(node.child.is_none(), "{} is running already", node.name);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&node.log)
            .expect("open the etcd log");
        let log2 = log.try_clone().expect("clone the log handle");
        let p = |path: &Path| path.display().to_string();
        let child = Command::new("etcd")
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
            .stderr(log2)
            .spawn()
            .expect("start etcd");
        self.nodes[i].child = Some(child);
    }

    /// The number of members started or added here (removed and killed ones included).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    pub fn index_of(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no member {name:?} here"))
    }

    /// Member `i`'s client URL.
    pub fn client_url(&self, i: usize) -> String {
        self.nodes[i].client_url()
    }

    /// Every member's client URL, running or not, in index order.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(Node::client_url).collect()
    }

    /// Client TLS for the prober: the cluster CA, and a client certificate quorumguard signs
    /// with it (as it does with a real cluster's `<cluster>-etcd` Secret).
    pub fn client_tls(&self) -> ClientTls {
        ClientTls::from_etcd_ca(
            &self.pki.ca_cert_pem,
            &self.pki.ca_key_pem,
            SystemTime::now(),
        )
        .expect("sign a client certificate with the test CA")
    }

    fn pid(&self, i: usize) -> u32 {
        self.nodes[i]
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("{} is not running", self.nodes[i].name))
            .id()
    }

    fn signal(&self, i: usize, signal: &str) {
        let pid = self.pid(i).to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Freezes member `i` (SIGSTOP): alive, its ports open, answering nothing.
    pub fn freeze(&mut self, i: usize) {
        self.signal(i, "-STOP");
        self.nodes[i].frozen = true;
    }

    /// Lets a frozen member run again (SIGCONT).
    pub fn thaw(&mut self, i: usize) {
        self.signal(i, "-CONT");
        self.nodes[i].frozen = false;
    }

    /// Kills member `i` (SIGKILL) and reaps it. Its data dir stays.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
        self.nodes[i].frozen = false;
    }

    /// Whether member `i`'s process is running (frozen counts as running).
    pub fn is_running(&mut self, i: usize) -> bool {
        match &mut self.nodes[i].child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Runs etcdctl (API v3, TLS) against `endpoints`, bounded by `timeout 20`.
    pub fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        let p = |path: &Path| path.display().to_string();
        let out: Output = Command::new("timeout")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("ETCDCTL_API", "3")
            .args(["20", "etcdctl"])
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .args(["--cacert", &p(&self.pki.ca_crt)])
            .args(["--cert", &p(&self.pki.client_crt)])
            .args(["--key", &p(&self.pki.client_key)])
            .args(["--dial-timeout=2s", "--command-timeout=3s"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run etcdctl");
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
            Err(format!(
                "etcdctl {} ({}): {}{}",
                shown.join(" "),
                out.status,
                stdout,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// The endpoints of running, unfrozen members (for admin commands).
    fn live_endpoints(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for i in 0..self.nodes.len() {
            if self.is_running(i) && !self.nodes[i].frozen {
                out.push(self.client_url(i));
            }
        }
        out
    }

    /// `etcdctl member list -w json`: (ID, name, is learner) per member.
    pub fn member_list(&mut self) -> Vec<(u64, String, bool)> {
        let eps = self.live_endpoints();
        let mut last = String::new();
        for ep in eps {
            match self.etcdctl(std::slice::from_ref(&ep), &["member", "list", "-w", "json"]) {
                Ok(out) => {
                    let v: serde_json::Value =
                        serde_json::from_str(&out).expect("member list JSON");
                    return v["members"]
                        .as_array()
                        .expect("members")
                        .iter()
                        .map(|m| {
                            (
                                m["ID"].as_u64().expect("a u64 ID"),
                                m["name"].as_str().unwrap_or("").to_string(),
                                m["isLearner"].as_bool().unwrap_or(false),
                            )
                        })
                        .collect();
                }
                Err(e) => last = e,
            }
        }
        panic!("no member answered the member list: {last}");
    }

    /// Member `i`'s ID, from the member list.
    pub fn member_id(&mut self, i: usize) -> u64 {
        let name = self.nodes[i].name.clone();
        self.member_list()
            .into_iter()
            .find(|(_, n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name} is not in the member list"))
            .0
    }

    /// A membership change through a live member, retried while etcd answers "unhealthy
    /// cluster" (its peers must have been connected for 5 s).
    fn member_change(&mut self, args: &[&str]) -> String {
        let started = Instant::now();
        loop {
            let eps = self.live_endpoints();
            match self.etcdctl(&eps[..1], args) {
                Ok(out) => return out,
                Err(e) if e.contains("unhealthy cluster") && started.elapsed() < RECONFIG_WAIT => {
                    sleep(Duration::from_millis(300));
                }
                Err(e) => panic!("{e}\n{}", self.logs()),
            }
        }
    }

    /// Removes member `i` with `etcdctl member remove`, then waits (bounded) for its process to
    /// exit by itself, as a removed etcd member does. Returns whether it did; if not, kills it.
    pub fn remove_member(&mut self, i: usize) -> bool {
        let id = format!("{:x}", self.member_id(i));
        self.member_change(&["member", "remove", &id]);
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
        exited
    }

    /// Adds a learner named `name` with `etcdctl member add --learner` and returns its index.
    /// It is not started: it has no name and no client URLs in the member list until
    /// [`EtcdCluster::start_member`].
    pub fn add_learner(&mut self, name: &str) -> usize {
        let mut node = self.new_node(name);
        let peer = format!("--peer-urls={}", node.peer_url());
        let out = self.member_change(&["member", "add", name, "--learner", &peer]);
        // etcdctl prints the --initial-cluster the new member must start with.
        node.initial_cluster = out
            .lines()
            .find_map(|l| l.strip_prefix("ETCD_INITIAL_CLUSTER="))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_else(|| panic!("no ETCD_INITIAL_CLUSTER in: {out}"));
        node.initial_state = "existing";
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    /// Starts a member added with [`EtcdCluster::add_learner`] and waits (bounded) until its
    /// status shows a leader and no errors (a learner refuses `endpoint health`).
    pub fn start_member(&mut self, i: usize) {
        self.spawn(i);
        let ep = [self.client_url(i)];
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < START_WAIT {
            match self.etcdctl(&ep, &["endpoint", "status", "-w", "json"]) {
                Ok(out) if out.contains("\"leader\":") && !out.contains("\"errors\"") => return,
                Ok(out) => last = out,
                Err(e) => last = e,
            }
            if !self.is_running(i) {
                break;
            }
            sleep(Duration::from_millis(200));
        }
        panic!(
            "{} did not come up: {last}\n{}",
            self.nodes[i].name,
            self.logs()
        );
    }

    /// Waits (bounded) until members `members` all answer `endpoint health`.
    pub fn wait_healthy(&mut self, members: Vec<usize>) {
        if let Err(e) = self.wait_healthy_within(members, START_WAIT) {
            panic!("{e}\n{}", self.logs());
        }
    }

    fn wait_healthy_within(&mut self, members: Vec<usize>, limit: Duration) -> Result<(), String> {
        let eps: Vec<String> = members.iter().map(|&i| self.client_url(i)).collect();
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < limit {
            for &i in &members {
                if !self.is_running(i) {
                    return Err(format!("{} exited", self.nodes[i].name));
                }
            }
            match self.etcdctl(&eps, &["endpoint", "health"]) {
                Ok(_) => return Ok(()),
                Err(e) => last = e,
            }
            sleep(Duration::from_millis(200));
        }
        Err(format!("not healthy within {limit:?}: {last}"))
    }

    /// The last lines of every member's log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let text = fs::read_to_string(&node.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
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
        if std::thread::panicking() {
            eprintln!(
                "etcd test cluster in {}:\n{}",
                self.dir.display(),
                self.logs()
            );
        }
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        if std::env::var_os("QG_KEEP_ETCD").is_some() {
            eprintln!("kept {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A port free on 127.0.0.1 right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// The CA (Cluster API-shaped), server and peer certificates, and etcdctl's client certificate.
fn make_pki(dir: &Path) -> Pki {
    // RSA key generation needs aws-lc in rcgen; ring only signs. Cluster API writes PKCS#1.
    let ca_key_file = dir.join("ca.key");
    let ca_pk8_file = dir.join("ca.pk8");
    run(Command::new("openssl")
        .args(["genrsa", "-traditional", "-out"])
        .arg(&ca_key_file)
        .arg("2048"));
    run(Command::new("openssl")
        .args(["pkcs8", "-topk8", "-nocrypt", "-in"])
        .arg(&ca_key_file)
        .arg("-out")
        .arg(&ca_pk8_file));
    let ca_key_pem = fs::read_to_string(&ca_key_file).expect("read ca.key");
    assert!(
        ca_key_pem.contains("BEGIN RSA PRIVATE KEY"),
        "a PKCS#1 CA key"
    );
    let ca_key =
        KeyPair::from_pem(&fs::read_to_string(&ca_pk8_file).expect("read ca.pk8")).expect("CA key");

    let now = SystemTime::now();
    let mut ca = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        DnValue::PrintableString(PrintableString::try_from("etcd-ca").expect("printable")),
    );
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    ca.not_before = (now - Duration::from_secs(3600)).into();
    ca.not_after = (now + Duration::from_secs(10 * 86_400)).into();
    let ca_cert_pem = ca.self_signed(&ca_key).expect("self-sign the CA").pem();
    let issuer = Issuer::new(ca, ca_key);

    let leaf = |cn: &str| {
        let key = KeyPair::generate().expect("leaf key");
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        p.distinguished_name = dn;
        p.subject_alt_names = vec![
            SanType::IpAddress([127, 0, 0, 1].into()),
            SanType::DnsName("localhost".try_into().expect("DNS name")),
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
        let cert = p.signed_by(&key, &issuer).expect("sign a leaf");
        (cert.pem(), key.serialize_pem())
    };
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        fs::write(&path, text).expect("write a certificate file");
        path
    };
    let (server_crt, server_key) = leaf("etcd-server");
    let (peer_crt, peer_key) = leaf("etcd-peer");
    let client = sign_client_cert(&ca_cert_pem, &ca_key_pem, "etcdctl", now)
        .expect("sign etcdctl's client certificate");
    Pki {
        ca_crt: write("ca.crt", &ca_cert_pem),
        server_crt: write("server.crt", &server_crt),
        server_key: write("server.key", &server_key),
        peer_crt: write("peer.crt", &peer_crt),
        peer_key: write("peer.key", &peer_key),
        client_crt: write("client.crt", &client.cert_pem),
        client_key: write("client.key", &client.key_pem),
        ca_cert_pem,
        ca_key_pem,
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run a command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
