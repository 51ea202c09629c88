//! [`Etcdctl`]: `etcdctl` (API v3) with the cluster's CA and client certificate, bounded in
//! time, from the cluster or detached from it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::{EtcdCluster, EtcdError};

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
            .arg("20")
            .arg(super::program("etcdctl"))
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

impl EtcdCluster {
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
}
