//! The loopback listener of one etcd pod: its accept loop, and one relay per accepted connection
//! through one port-forward WebSocket, recording why a forward failed.

use std::fmt;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::Portforwarder;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use super::{PortForward, kube_error};

/// How long opening one port-forward may take. Longer than a probe's deadline on purpose: the
/// probe gives up on its own, and a relay that is still opening ends when its connection does.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections relayed at once per pod, at most (the prober keeps one, plus reconnects).
const MAX_CONNECTIONS: usize = 16;
/// After a failed accept (out of file descriptors, say), wait this long before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// One loopback listener relaying to one etcd pod. Dropping it stops accepting and ends every
/// relay it started.
pub(super) struct Forward {
    pub(super) url: String,
    pub(super) pod: Arc<PodForward>,
    task: JoinHandle<()>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What every relay of one pod shares.
pub(super) struct PodForward {
    api: Api<Pod>,
    namespace: String,
    name: String,
    port: u16,
    /// The workload API server, for messages.
    server: String,
    /// The latest failure to forward, and when.
    pub(super) last_error: Mutex<Option<(Instant, String)>>,
}

impl PodForward {
    fn record(&self, error: impl fmt::Display) {
        let text = format!(
            "port-forward to {}/{} through {}: {error}",
            self.namespace, self.name, self.server
        );
        tracing::debug!(error = %text, "etcd port-forward failed");
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), text));
    }
}

impl PortForward {
    /// A listener on 127.0.0.1 and its accept task (on the current Tokio runtime).
    pub(super) fn listen(&self, pod: &str) -> Result<Forward, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "no Tokio runtime to run the listener on".to_string())?;
        let std_listener =
            std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let local = std_listener.local_addr().map_err(|e| e.to_string())?;
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(std_listener).map_err(|e| e.to_string())?
        };
        let shared = Arc::new(PodForward {
            api: Api::namespaced(self.client.clone(), &self.namespace),
            namespace: self.namespace.clone(),
            name: pod.to_string(),
            port: self.port,
            server: self.server.clone(),
            last_error: Mutex::new(None),
        });
        let task = runtime.spawn(accept_loop(listener, shared.clone()));
        Ok(Forward {
            url: local_url(local),
            pod: shared,
            task,
        })
    }
}

fn local_url(addr: SocketAddr) -> String {
    format!("https://{addr}")
}

/// Accepts connections until aborted; each one is relayed by a task of `relays`, which goes
/// (aborting them all) with this task.
async fn accept_loop(listener: TcpListener, pod: Arc<PodForward>) {
    let mut relays = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) if relays.len() < MAX_CONNECTIONS => {
                    // The prober's gRPC calls are small writes answered at once: with Nagle's
                    // algorithm, a second write waits for the prober to acknowledge the first,
                    // up to its delayed-ACK timer (40 ms on Linux) per call. See `nodelay`.
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(error = %e, "TCP_NODELAY on a port-forward connection");
                    }
                    relays.spawn(relay(tcp, pod.clone()));
                }
                Ok((tcp, _)) => {
                    pod.record(format!("more than {MAX_CONNECTIONS} connections at once"));
                    drop(tcp);
                }
                Err(e) => {
                    pod.record(format!("accepting on the local listener: {e}"));
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = relays.join_next(), if !relays.is_empty() => {}
        }
    }
}

/// Aborts the port-forward's WebSocket task when the relay ends or is aborted.
struct AbortOnDrop(Portforwarder);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Relays one local connection through one port-forward WebSocket until either side ends, or
/// the kubelet reports an error for the port (recorded, then the connection is closed).
async fn relay(mut tcp: TcpStream, pod: Arc<PodForward>) {
    let ports = [pod.port];
    let opened = tokio::time::timeout(OPEN_TIMEOUT, pod.api.portforward(&pod.name, &ports));
    let mut forwarder = match opened.await {
        Ok(Ok(f)) => AbortOnDrop(f),
        Ok(Err(e)) => return pod.record(kube_error(&e)),
        Err(_) => {
            return pod.record(format!(
                "no answer within {}",
                humantime::format_duration(OPEN_TIMEOUT)
            ));
        }
    };
    let (Some(mut stream), Some(error)) = (
        forwarder.0.take_stream(pod.port),
        forwarder.0.take_error(pod.port),
    ) else {
        return pod.record(format!("port {} was not forwarded", pod.port));
    };
    let mut error = pin!(error);
    let mut copy = pin!(tokio::io::copy_bidirectional(&mut tcp, &mut stream));
    let mut error_channel_open = true;
    loop {
        tokio::select! {
            // The error first: kube delivers it before it closes the data stream, so it is
            // recorded before the prober sees its connection end.
            biased;
            message = &mut error, if error_channel_open => match message {
                Some(text) => return pod.record(text),
                None => error_channel_open = false,
            },
            _ = &mut copy => return,
        }
    }
}
