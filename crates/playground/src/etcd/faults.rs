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
}
