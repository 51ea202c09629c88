//! Starting the cluster (the tools checked, its directory and certificates made, one `etcd`
//! process per member with its flags) and starting a member added later, each waited for
//! until it answers.

use std::fs::{self, File};
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use super::pki::make_pki;
use super::{
    ELECTION_MS, EtcdCluster, EtcdError, EtcdOptions, HEARTBEAT_MS, MAX_MEMBERS, Node,
    START_ATTEMPTS, START_WAIT, bin_dir, program,
};

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
        let bin_dir = bin_dir();
        for tool in ["etcd", "etcdctl"] {
            if let Some(dir) = &bin_dir
                && !crate::realapi::executable(&dir.join(tool))
            {
                return Err(EtcdError::MissingInBinDir {
                    tool,
                    dir: dir.clone(),
                });
            }
        }
        for (tool, package) in [
            ("etcd", "etcd-server"),
            ("etcdctl", "etcd-client"),
            ("openssl", "openssl"),
            ("timeout", "coreutils"),
            ("kill", "procps"),
        ] {
            if bin_dir.is_some() && tool.starts_with("etcd") {
                continue;
            }
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

    pub(super) fn new_node(&self, name: &str) -> Result<Node, EtcdError> {
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
        let mut command = Command::new(program("etcd"));
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
        let child = crate::child::spawn(command).map_err(spawn_error)?;
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

    /// Starts a member added with [`EtcdCluster::add_learner`] or [`EtcdCluster::add_member`],
    /// or restarts a killed one (from its data dir), and waits (at most
    /// [`START_WAIT`]) until its status shows a leader and no errors but alarms (a learner
    /// refuses `endpoint health`; a member of a cluster with a NOSPACE alarm lists it).
    pub fn start_member(&mut self, i: usize) -> Result<(), EtcdError> {
        self.spawn(i)?;
        let ep = [self.node(i)?.client_url()];
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < START_WAIT {
            match self.etcdctl(&ep, &["endpoint", "status", "-w", "json"]) {
                Ok(out) if has_leader_and_only_alarms(&out) => return Ok(()),
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
}

/// Whether `etcdctl endpoint status -w json` of one member shows a leader and no errors but
/// the alarms every member repeats (`memberID:<id> alarm:<TYPE> `): "etcdserver: no leader"
/// while it has not joined, none once it has.
pub(super) fn has_leader_and_only_alarms(out: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(out) else {
        return false;
    };
    let status = &v[0]["Status"];
    let leader = status["leader"].as_u64().is_some_and(|l| l != 0);
    let errors = status["errors"].as_array().map_or(&[][..], Vec::as_slice);
    leader
        && errors.iter().all(|e| {
            e.as_str()
                .is_some_and(|e| e.starts_with("memberID:") && e.contains(" alarm:"))
        })
}

/// A port on 127.0.0.1 for a member ([`crate::ports`]: below the ephemeral range, so that an
/// outgoing connection cannot take a member's port between the pick and etcd's bind; a member
/// added to a busy cluster waits seconds for etcd to accept it first).
fn free_port() -> Result<u16, EtcdError> {
    crate::ports::free_port().map_err(EtcdError::FreePort)
}
