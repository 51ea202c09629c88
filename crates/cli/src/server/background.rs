//! The status enricher's thread: a runtime of its own on one OS thread at a lower priority
//! than the webhook's workers, so that sweeps do not queue reviews behind them.

use tokio::task::JoinHandle;

/// How much lower than the webhook the enricher thread runs (Linux `nice`, 0–19).
///
/// A sweep of a large fleet is seconds of CPU (TLS and gRPC with every member, the status
/// publication); on tokio's workers beside the webhook, reviews queued behind probe tasks and
/// their p99 grew 6–9x during sweeps at 1,000 clusters (`cargo bench --bench scale`). On a
/// thread of its own at a lower priority the kernel runs a review as soon as it arrives. Not
/// 19: probes have deadlines in wall-clock time, and a starved prober would call healthy members
/// unresponsive; at 10 the thread still gets about a tenth of a busy core.
pub const ENRICHER_NICE: i32 = 10;

/// Runs `make()`'s future on a runtime of its own, on one OS thread named `name` at
/// [`ENRICHER_NICE`]. The returned task stands for it: aborting (or dropping the runtime that
/// runs) the task stops the thread's future and its runtime, with every task it spawned (etcd
/// connections among them).
pub(super) fn spawn_background<F, M>(name: &str, make: M) -> JoinHandle<()>
where
    M: FnOnce() -> F + Send + 'static,
    F: std::future::Future<Output = ()> + 'static,
{
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let thread_name = name.to_string();
    let spawned = std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            lower_priority(&thread_name);
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(async move {
                    tokio::select! {
                        _ = make() => {}
                        _ = stop_rx => {}
                    }
                }),
                Err(e) => {
                    tracing::error!(thread = %thread_name, error = %e, "no runtime for the thread")
                }
            }
            let _ = done_tx.send(());
        });
    if let Err(e) = spawned {
        tracing::error!(thread = name, error = %e, "could not start the thread");
    }
    tokio::spawn(async move {
        let _stop = stop_tx;
        let _ = done_rx.await;
    })
}

/// Lowers the calling thread's priority by [`ENRICHER_NICE`] (Linux: `setpriority` on the
/// thread ID). Raising nice needs no privilege; if it fails anyway, the thread runs at the
/// process's priority and says so.
fn lower_priority(thread: &str) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions; setpriority only reads its arguments.
        let rc = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, ENRICHER_NICE)
        };
        if rc != 0 {
            tracing::warn!(
                thread, error = %std::io::Error::last_os_error(),
                "could not lower the thread's priority; sweeps compete with reviews for CPU"
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = thread;
}
