//! A child process of the real API server's (kube-apiserver, its etcd, or a test's `serve`):
//! output appended to a log file, dying with this process, killed and reaped when dropped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `program` with `args`, stdout and stderr appended to `log`, stdin closed, dying
    /// with this process ([`crate::child`]).
    pub fn spawn(program: &Path, args: &[String], log: &Path) -> std::io::Result<Proc> {
        let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = crate::child::spawn(command)?;
        Ok(Proc {
            child: Some(child),
            log: log.to_path_buf(),
        })
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
