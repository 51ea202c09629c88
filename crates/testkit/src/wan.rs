//! A wide-area network's round trip on loopback, without root or netem: a TCP relay that holds
//! every byte for half the round trip in each direction before passing it on.
//!
//! Put between quorumguard and the workload API server (the kubeconfig's server is the relay's
//! address), it makes every round trip of the port-forward transport, from the TCP handshake
//! with the API server through the WebSocket upgrade to each etcd request inside the tunnel, cost
//! what it costs across a WAN. What it does not model: bandwidth, loss, jitter, and the TCP
//! handshake between quorumguard and the relay itself (local: the relay dials onward only when a
//! connection arrives, and that dial is delayed like the bytes are, see [`DelayRelay::start`]).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Bytes read at once, at most.
const CHUNK: usize = 64 * 1024;

/// A delaying relay on 127.0.0.1 to one address. Dropping it closes the listener and every
/// connection relayed.
pub struct DelayRelay {
    addr: SocketAddr,
    rtt: Duration,
    task: JoinHandle<()>,
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DelayRelay {
    /// Relays every connection made to [`Self::addr`] to `to`, adding `rtt` to each round trip:
    /// half of it to each direction. Connecting onward waits a full round trip first, as a TCP
    /// handshake across the WAN would.
    pub async fn start(to: SocketAddr, rtt: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((tcp, _)) => {
                            connections.spawn(relay(tcp, to, rtt));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(DelayRelay { addr, rtt, task })
    }

    /// Where to connect instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, for a kubeconfig's server.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The round trip it adds.
    pub fn rtt(&self) -> Duration {
        self.rtt
    }
}

async fn relay(client: TcpStream, to: SocketAddr, rtt: Duration) {
    tokio::time::sleep(rtt).await;
    let Ok(server) = TcpStream::connect(to).await else {
        return;
    };
    // The relay adds its delay and nothing else: no Nagle on either side.
    if client.set_nodelay(true).is_err() || server.set_nodelay(true).is_err() {
        return;
    }
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let one_way = rtt / 2;
    tokio::join!(
        pipe(client_read, server_write, one_way),
        pipe(server_read, client_write, one_way)
    );
}

/// Copies `from` to `to`, each chunk `delay` after it was read; shuts `to` down after the last.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    };
    let write = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server's round trip through the relay takes the added round trip (and not much
    /// more), and bytes arrive whole and in order.
    #[tokio::test]
    async fn a_round_trip_costs_the_added_rtt() {
        let echo = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let echo_addr = echo.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut tcp, _) = echo.accept().await.expect("accept");
            let mut buf = vec![0u8; 1024];
            loop {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tcp.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let rtt = Duration::from_millis(60);
        let relay = DelayRelay::start(echo_addr, rtt).await.expect("relay");
        let mut tcp = TcpStream::connect(relay.addr()).await.expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        for round in 0..3u8 {
            let sent = std::time::Instant::now();
            tcp.write_all(&[round; 100]).await.expect("write");
            let mut got = [0u8; 100];
            tcp.read_exact(&mut got).await.expect("read");
            let took = sent.elapsed();
            assert_eq!(got, [round; 100]);
            // The first round also waits for the relay's onward connection (one more RTT).
            let least = if round == 0 { rtt * 2 } else { rtt };
            assert!(
                took >= least && took < least + Duration::from_secs(1),
                "round {round}: {took:?}"
            );
        }
        drop(tcp);
        drop(relay);
        server.abort();
    }
}
