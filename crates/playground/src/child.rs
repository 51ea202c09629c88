//! Child processes (etcd members, a child `serve`) that die with the process that started
//! them, even when it is killed with SIGKILL and no destructor runs.
//!
//! Linux's `PR_SET_PDEATHSIG` sends the child a signal when its parent *thread* ends, not the
//! process: a child spawned from a tokio worker or a blocking-pool thread (which exit when
//! idle) would be killed while still wanted. So every child is spawned from one thread that
//! lives as long as the process ([`spawn`] hands the command to it and waits for the result).
//! Owners still kill their children by PID on drop; this only covers the case where no drop
//! runs (a test binary or the playground killed outright, a CI timeout).

use std::io;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};

type Request = (Command, mpsc::Sender<io::Result<Child>>);

/// The spawning thread's inbox (the thread runs until the process exits).
fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        let started = std::thread::Builder::new()
            .name("quorumguard-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(spawn_here(&mut command));
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "no spawner thread: children will not die with this process");
        }
        Mutex::new(tx)
    })
}

/// Spawns `command` on the calling thread, with the kernel told to SIGKILL it when this
/// thread ends (Linux; elsewhere a plain spawn).
fn spawn_here(command: &mut Command) -> io::Result<Child> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe and only reads its arguments.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    command.spawn()
}

/// Spawns `command` so that it dies with this process (see the module documentation).
pub fn spawn(command: Command) -> io::Result<Child> {
    let (tx, rx) = mpsc::channel();
    let sent = spawner()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((command, tx));
    match sent {
        Ok(()) => rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the spawner thread is gone"))),
        // No spawner thread: spawn here rather than not at all.
        Err(mpsc::SendError((mut command, _))) => spawn_here(&mut command),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_spawned_from_a_thread_that_ends_keeps_running() {
        // The thread asking ends at once; the child must not die with it.
        let child = std::thread::spawn(|| {
            let mut c = Command::new("sleep");
            c.arg("5");
            spawn(c).expect("spawn sleep")
        })
        .join()
        .expect("thread");
        let mut child = child;
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "the child outlived the thread that asked for it"
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}
