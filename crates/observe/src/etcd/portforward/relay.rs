//! The loopback listener of one etcd pod: its accept loop, and one relay per accepted connection
//! through one port-forward WebSocket, recording why a forward failed.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::{Client, Resource};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use super::{PortForward, kube_error};

/// How long opening one port-forward may take. Longer than a probe's deadline on purpose: the
/// probe gives up on its own, and a relay that is still opening ends when its connection does.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections relayed at once per pod, at most (the prober keeps one, plus reconnects).
const MAX_CONNECTIONS: usize = 16;
/// After a failed accept (out of file descriptors, say), wait this long before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// What one read of the prober's connection may take: one WebSocket message (as much as tokio's
/// `copy_bidirectional` read at once when it relayed them).
const READ_CHUNK: usize = 8 * 1024;
/// tungstenite's read buffer per port-forward WebSocket: how much one read from the workload API
/// server takes in, and the capacity it keeps between reads (tungstenite's default: 128 KiB).
/// It bounds no message: a longer frame is read whole into room reserved for it (tungstenite
/// 0.30, `FrameCodec::read_frame`), and several shorter ones are taken in by one read. What the
/// prober receives through a session is small: etcd's answers to a status, a linearizable read of
/// key `health` (as `etcdctl endpoint health`; nothing is stored there), and on the endpoint that
/// answers the list a member list (about a hundred bytes per member: under 1 KiB for 7) and an
/// alarm list, each in TLS records of about its size; no range of keys is ever read. The largest
/// are the TLS handshake's flights (etcd's certificate chain, a few KiB) when a connection is set
/// up. 4 KiB takes in one probe's answers on a session in a read or two.
const WS_READ_BUFFER: usize = 4 * 1024;
/// The port-forward protocol's channels of the one port forwarded.
const DATA_CHANNEL: u8 = 0;
const ERROR_CHANNEL: u8 = 1;

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
    client: Client,
    /// The pods' path on the API server (`/api/v1/namespaces/<namespace>/pods`).
    pods: String,
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

    /// Opens one port-forward WebSocket to the pod's port: kube's request and upgrade (as
    /// [`kube::Api::portforward`] makes them), the stream then taken back from kube's tungstenite
    /// (which has read nothing from it yet) and framed again with [`ws_config`].
    async fn open(&self) -> Result<WebSocketStream<TokioIo<Upgraded>>, kube::Error> {
        let request = kube::core::Request::new(&self.pods)
            .portforward(&self.name, &[self.port])
            .map_err(kube::Error::BuildRequest)?;
        let kube_framed = self.client.connect(request).await?.into_stream();
        Ok(WebSocketStream::from_raw_socket(
            kube_framed.into_inner(),
            Role::Client,
            Some(ws_config()),
        )
        .await)
    }
}

/// The WebSocket settings of a port-forward session: tungstenite's defaults but the read buffer
/// ([`WS_READ_BUFFER`]). The write side keeps no buffer of that size: tungstenite reserves what a
/// message needs, and each message is flushed as it is sent.
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default().read_buffer_size(WS_READ_BUFFER)
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
            client: self.client.clone(),
            pods: Pod::url_path(&(), Some(&self.namespace)),
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

/// Relays one local connection through one port-forward WebSocket until either side ends, or
/// the kubelet reports an error for the port (recorded, then the connection is closed).
///
/// The WebSocket is kube's ([`kube::Client::connect`]: the request, its headers and the
/// upgrade, as [`kube::Api::portforward`] makes them), framed here rather than by kube's
/// `Portforwarder`, which can only be made from a WebSocket kube configured itself: tungstenite's
/// default read buffer, 128 KiB per session, three sessions per cluster, kept for as long as the
/// prober keeps its connections. See [`ws_config`] for the buffer this one reads into.
async fn relay(mut tcp: TcpStream, pod: Arc<PodForward>) {
    let opened = tokio::time::timeout(OPEN_TIMEOUT, pod.open());
    let mut ws = match opened.await {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => return pod.record(kube_error(&e)),
        Err(_) => {
            return pod.record(format!(
                "no answer within {}",
                humantime::format_duration(OPEN_TIMEOUT)
            ));
        }
    };
    // kube-apiserver's port-forward protocol (`v4.channel.k8s.io`, as kube's `Portforwarder`
    // speaks it): every message starts with its channel, 0 the port's data and 1 its error;
    // the first message on each channel from the server is the port number (2 bytes, little
    // endian), and what the client sends goes on channel 0.
    let mut initialised = [false; 2];
    loop {
        tokio::select! {
            message = ws.next() => {
                let bytes = match message {
                    Some(Ok(Message::Binary(bytes))) => bytes,
                    Some(Ok(Message::Close(_))) | None => return,
                    // Pings are answered by tungstenite; anything else carries no data.
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, pod = %pod.name, "port-forward WebSocket");
                        return;
                    }
                };
                // A message with no byte after its channel carries nothing (kube skips them too).
                let Some((&channel, body)) = bytes.split_first().filter(|(_, b)| !b.is_empty())
                else {
                    continue;
                };
                let Some(seen) = initialised.get_mut(usize::from(channel)) else {
                    return pod.record(format!("the API server sent on channel {channel}, not 0 or 1"));
                };
                if !*seen {
                    if body != pod.port.to_le_bytes() {
                        return pod.record(format!(
                            "the API server's first message on channel {channel} is not port {}",
                            pod.port
                        ));
                    }
                    *seen = true;
                } else if channel == ERROR_CHANNEL {
                    return pod.record(String::from_utf8_lossy(body));
                } else if tcp.write_all(body).await.is_err() {
                    return;
                }
            }
            readable = tcp.readable() => {
                if readable.is_err() {
                    return;
                }
                // A buffer per read, not one kept per connection: an idle session holds none.
                let mut frame = Vec::with_capacity(1 + READ_CHUNK);
                frame.push(DATA_CHANNEL);
                match tcp.try_read_buf(&mut frame) {
                    Ok(0) => {
                        // The prober closed its connection: so does the session.
                        let _ = ws.close(None).await;
                        return;
                    }
                    Ok(_) => {
                        if ws.send(Message::binary(frame)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
        }
    }
}
