//! The faults on a member's process: freeze (SIGSTOP), thaw (SIGCONT), kill (SIGKILL), and
//! whether it still runs.

use std::process::{Command, Stdio};

use super::{EtcdCluster, EtcdError};

impl EtcdCluster {
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

    /// Freezes member `i` (SIGSTOP): alive, its ports open, answering nothing. Returns once
    /// every thread of the process is stopped: `kill` returns when the signal is sent, and on a
    /// loaded machine a thread of etcd could still answer a request made just after.
    pub fn freeze(&mut self, i: usize) -> Result<(), EtcdError> {
        self.signal(i, "-STOP")?;
        if let Some(node) = self.nodes.get_mut(i) {
            node.frozen = true;
        }
        if let Some(pid) = self.pid(i) {
            wait_stopped(pid).map_err(|why| EtcdError::Signal {
                signal: "-STOP",
                pid,
                member: self.name(i).unwrap_or("?").to_string(),
                why,
            })?;
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
}

/// The states of the threads of process `pid` (`/proc/<pid>/task/*/stat`, the field after the
/// command's closing parenthesis); `None` where /proc cannot be read (not Linux).
fn thread_states(pid: u32) -> Option<Vec<char>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut states = Vec::new();
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        states.extend(state);
    }
    Some(states)
}

/// Waits (at most 5 s, every 2 ms) until every thread of `pid` is stopped (`T`), or has exited.
fn wait_stopped(pid: u32) -> Result<(), String> {
    let started = std::time::Instant::now();
    let mut last = Vec::new();
    for _ in 0..2500 {
        match thread_states(pid) {
            None => return Ok(()),
            Some(states) if states.iter().all(|&c| matches!(c, 'T' | 't' | 'Z' | 'X')) => {
                return Ok(());
            }
            Some(states) => last = states,
        }
        if started.elapsed() > std::time::Duration::from_secs(5) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    Err(format!(
        "its threads were not all stopped 5 s after SIGSTOP (states {last:?})"
    ))
}
