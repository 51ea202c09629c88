//! `quorumguard serve` as a child process of the world: the same flags and ports every time,
//! spawned, waited for until it listens, and killed (also when dropped).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use super::files::WebhookCerts;
use super::serve::{ServeStart, http_status};
use super::{ChildServe, WorldError, WorldOptions};

/// How long a child `serve` may take to listen after it was spawned.
const CHILD_START_WAIT: Duration = Duration::from_secs(30);

/// How to start `serve` as a child process: the same flags and ports every time.
pub(super) struct ChildPlan {
    exe: PathBuf,
    dir: PathBuf,
    args: Vec<String>,
    pub(super) addr: SocketAddr,
    pub(super) admin_addr: SocketAddr,
    /// Processes started so far, for their log files' names.
    started: Mutex<usize>,
}

/// A free port on 127.0.0.1 (bound and released: the child binds it a moment later), below the
/// ephemeral range ([`crate::ports`]).
fn free_addr() -> Result<SocketAddr, WorldError> {
    crate::ports::free_addr()
        .map_err(|e| WorldError::Child(format!("finding a free port on 127.0.0.1: {e}")))
}

impl ChildPlan {
    /// `serve`'s flags for the world: what [`serve_config`](super::serve::serve_config) sets
    /// in-process, plus the Lease.
    pub(super) fn new(
        spec: &ChildServe,
        options: &WorldOptions,
        certs: &WebhookCerts,
        kubeconfig: &Path,
    ) -> Result<Self, WorldError> {
        let (addr, admin_addr) = (free_addr()?, free_addr()?);
        let d = |d: Duration| humantime::format_duration(d).to_string();
        let args = vec![
            format!("--listen={addr}"),
            format!("--admin-listen={admin_addr}"),
            format!("--tls-cert-file={}", certs.cert_file.display()),
            format!("--tls-key-file={}", certs.key_file.display()),
            "--tls-reload-interval=60s".into(),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--log=info".into(),
            "--etcd-transport=direct".into(),
            format!("--probe-interval={}", d(options.probe_interval)),
            format!("--probe-timeout={}", d(options.probe_deadline)),
            format!("--etcd-election-timeout={}", d(options.election_timeout)),
            "--probe-concurrency=4".into(),
            "--reservation-ttl=30s".into(),
            "--shutdown-delay=0s".into(),
            "--shutdown-grace=1s".into(),
            format!("--lease-duration={}", d(spec.lease_duration)),
            format!("--lease-renew-deadline={}", d(spec.lease_renew_deadline)),
            format!("--lease-retry-period={}", d(spec.lease_retry_period)),
        ];
        Ok(ChildPlan {
            exe: spec.exe.clone(),
            dir: options.dir.clone(),
            args,
            addr,
            admin_addr,
            started: Mutex::new(0),
        })
    }

    /// Spawns `serve` as `identity`, its output to `serve-<n>.log` in the world's directory.
    pub(super) fn spawn(&self, identity: &str) -> Result<ServeProcess, WorldError> {
        let n = {
            let mut started = self.started.lock().unwrap_or_else(PoisonError::into_inner);
            *started += 1;
            *started
        };
        let log = self.dir.join(format!("serve-{n}.log"));
        let out = std::fs::File::create(&log).map_err(|source| WorldError::Write {
            path: log.clone(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| WorldError::Write {
            path: log.clone(),
            source,
        })?;
        let mut command = Command::new(&self.exe);
        command
            .arg("serve")
            .args(&self.args)
            .arg(format!("--pod-name={identity}"))
            // Nothing from the caller's environment (QUORUMGUARD_* twins of the flags).
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = crate::child::spawn(command).map_err(|e| {
            WorldError::Child(format!("spawning {} serve: {e}", self.exe.display()))
        })?;
        Ok(ServeProcess {
            start: ServeStart {
                pid: child.id(),
                identity: identity.to_string(),
                spawned: SystemTime::now(),
                log,
            },
            child,
        })
    }

    /// Waits (at most [`CHILD_START_WAIT`]) until the admin port answers `/livez` and the
    /// webhook port accepts connections, as [`crate::server::start`] returns once both listen.
    pub(super) async fn wait_listening(
        &self,
        mut p: ServeProcess,
    ) -> Result<ServeProcess, WorldError> {
        let started = Instant::now();
        for _ in 0..(CHILD_START_WAIT.as_millis() / 20) {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(WorldError::Child(format!(
                    "serve (pid {}) exited with {status} before listening; its log {}:\n{}",
                    p.start.pid,
                    p.start.log.display(),
                    tail(&p.start.log)
                )));
            }
            if http_status(self.admin_addr, "/livez").await == Some(200)
                && tokio::net::TcpStream::connect(self.addr).await.is_ok()
            {
                return Ok(p);
            }
            if started.elapsed() > CHILD_START_WAIT {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = p.kill();
        Err(WorldError::Child(format!(
            "serve (pid {}) did not listen on {} and {} within {CHILD_START_WAIT:?}; its log {}:\n{}",
            p.start.pid,
            self.addr,
            self.admin_addr,
            p.start.log.display(),
            tail(&p.start.log)
        )))
    }
}

/// The last lines of a log, for errors.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A child `serve`; killed when dropped, so none outlives its world.
pub(super) struct ServeProcess {
    pub(super) child: Child,
    pub(super) start: ServeStart,
}

impl ServeProcess {
    /// SIGKILL (what `Child::kill` sends on Unix), then reaps it.
    pub(super) fn kill(&mut self) -> Result<(), WorldError> {
        if let Ok(Some(_)) = self.child.try_wait() {
            return Ok(());
        }
        self.child.kill().map_err(|e| {
            WorldError::Child(format!("SIGKILL to serve (pid {}): {e}", self.start.pid))
        })?;
        self.child.wait().map(|_| ()).map_err(|e| {
            WorldError::Child(format!("waiting for serve (pid {}): {e}", self.start.pid))
        })
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}
