//! A lean gRPC channel to one etcd member: one TCP connection, TLS, HTTP/2, nothing else.
//!
//! Why not etcd-client's own `Client::connect`: it always builds tonic's *balanced* channel, even
//! for one endpoint, and that costs about 87 KiB per kept connection (measured, see
//! `cargo bench --bench prober`): a tower `Buffer` of 1,024 requests, the balancer's endpoint
//! queue, and a rustls `ClientConfig` with its own session cache built (and its PEM parsed) for
//! every endpoint. The status enricher keeps three connections per workload cluster between
//! sweeps, for every cluster, so that overhead is most of the guard's memory at 1,000 clusters.
//!
//! Here a member's channel is the HTTP/2 connection itself ([`Channel`]): TCP (no Nagle: gRPC
//! calls are small) → rustls with the cluster's one shared [`ClientConfig`] → hyper's HTTP/2
//! client. Requests get the origin (scheme and authority) that tonic's generated clients leave
//! out, as tonic's own channel does: etcd serves gRPC over TLS through Go's net/http2, which
//! refuses requests without `:scheme`. There is no reconnecting and no queue: the prober asks
//! [`Channel::is_closed`] before it reuses a kept channel, and dials a new one when the member
//! closed it (a restart), so a restarted member does not cost a failed probe.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::http2::{self, SendRequest};
use hyper::http::uri::{Authority, Scheme};
use hyper::http::{Request, Response, Uri};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use thiserror::Error;
use tokio::net::TcpStream;
use tokio::sync::SetOnce;
use tokio_rustls::TlsConnector;
use tonic::body::Body;
use tower::BoxError;

/// The ALPN protocol of gRPC over TLS. etcd (Go's net/http) speaks HTTP/2 only when it is
/// negotiated, so a server that does not is not an etcd client port.
const ALPN_H2: &[u8] = b"h2";
/// etcd's client port, for a URL without one.
const DEFAULT_PORT: u16 = 2379;
/// How long a failed request waits for its connection's own error, which says why the
/// connection ended (e.g. the TLS alert of a refused client certificate) where the request only
/// sees "connection closed". Both come from the same task: this is a moment, not a delay.
const REASON_WAIT: Duration = Duration::from_millis(100);

/// Why a member could not be dialled, or why a call on its connection failed. The text names
/// the address and the cause, as the prober reports it per endpoint.
#[derive(Debug, Error)]
pub enum ChannelError {
    #[error("bad etcd URL {url:?}: {problem}")]
    Url { url: String, problem: String },
    #[error("tcp connect error to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS handshake with {addr} (certificate checked for {name:?}): {source}")]
    Tls {
        addr: String,
        name: String,
        source: std::io::Error,
    },
    #[error(
        "TLS with {addr}: the server did not negotiate HTTP/2 (ALPN h2); is this an etcd client \
         port?"
    )]
    NotHttp2 { addr: String },
    #[error("HTTP/2 handshake with {addr}: {}", chain(.source))]
    Handshake { addr: String, source: hyper::Error },
    /// The connection ended: `reason` is the connection's own error when there is one (a TLS
    /// alert, a reset), and the request's otherwise.
    #[error("connection closed: {reason}")]
    Closed { reason: String },
    #[error("{}", chain(.0))]
    Request(hyper::Error),
}

/// An error and its causes, joined with ": ", leaving out a cause whose text is already said.
pub fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    append_causes(&mut text, e.source());
    text
}

/// Appends `source` and its own causes to `text`, each after ": ", leaving out a cause whose
/// text is already said.
pub(crate) fn append_causes(text: &mut String, mut source: Option<&(dyn StdError + 'static)>) {
    while let Some(cause) = source {
        let part = cause.to_string();
        // tonic wraps causes in a bare "transport error", which says nothing more.
        if !part.is_empty() && part != "transport error" && !text.contains(&part) {
            let _ = write!(text, ": {part}");
        }
        source = cause.source();
    }
}

/// The gRPC channel of one etcd member: a clone shares the connection. Dropping every clone
/// closes it.
#[derive(Clone)]
pub struct Channel {
    send: SendRequest<Body>,
    scheme: Scheme,
    authority: Authority,
    /// Why the connection ended, set once by the task driving it.
    ended: Arc<SetOnce<String>>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("authority", &self.authority)
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

impl Channel {
    /// Dials `url` (`https://host:port`, or `host:port`) and makes the TLS and HTTP/2
    /// handshakes. The serving certificate is checked for `server_name` when given (the
    /// port-forward transport dials a loopback listener, see [`super::PORT_FORWARD_TLS_NAME`]),
    /// else for the URL's host. Not bounded in time: the caller's deadline is.
    pub async fn connect(
        url: &str,
        tls: Arc<ClientConfig>,
        server_name: Option<&str>,
    ) -> Result<Channel, ChannelError> {
        let bad = |problem: &str| ChannelError::Url {
            url: url.to_string(),
            problem: problem.to_string(),
        };
        let full = if url.contains("://") {
            url.to_string()
        } else {
            format!("https://{url}")
        };
        let uri: Uri = full.parse().map_err(|e| bad(&format!("{e}")))?;
        if uri.scheme() != Some(&Scheme::HTTPS) {
            return Err(bad("etcd's client port is reached over TLS: use https://"));
        }
        let authority = uri.authority().cloned().ok_or_else(|| bad("no host"))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(DEFAULT_PORT);
        let addr = format!("{}:{port}", authority.host());

        let tcp =
            TcpStream::connect((host, port))
                .await
                .map_err(|source| ChannelError::Connect {
                    addr: addr.clone(),
                    source,
                })?;
        // Small request, small answer: do not wait to fill a segment.
        tcp.set_nodelay(true)
            .map_err(|source| ChannelError::Connect {
                addr: addr.clone(),
                source,
            })?;
        let name = server_name.unwrap_or(host).to_string();
        let server = ServerName::try_from(name.clone()).map_err(|e| {
            bad(&format!(
                "{name:?} is not a name to check a certificate for: {e}"
            ))
        })?;
        let tls_stream = TlsConnector::from(tls)
            .connect(server, tcp)
            .await
            .map_err(|source| ChannelError::Tls {
                addr: addr.clone(),
                name,
                source,
            })?;
        if tls_stream.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
            return Err(ChannelError::NotHttp2 { addr });
        }
        let (send, connection) = http2::handshake(TokioExecutor::new(), TokioIo::new(tls_stream))
            .await
            .map_err(|source| ChannelError::Handshake {
                addr: addr.clone(),
                source,
            })?;
        let ended = Arc::new(SetOnce::new());
        let reason = ended.clone();
        // Drives the connection until etcd closes it or every clone of the channel is dropped.
        tokio::spawn(async move {
            let why = match connection.await {
                Ok(()) => format!("{addr} closed the connection"),
                Err(e) => format!("{addr}: {}", chain(&e)),
            };
            let _ = reason.set(why);
        });
        Ok(Channel {
            send,
            scheme: Scheme::HTTPS,
            authority,
            ended,
        })
    }

    /// Whether the connection has ended (the member closed it, e.g. it restarted, or it
    /// failed): a closed channel fails every call, so the prober dials a new one instead.
    pub fn is_closed(&self) -> bool {
        self.send.is_closed() || self.ended.initialized()
    }

    /// The error of a failed request: the connection's own reason when it ended (waiting a
    /// moment for it, see [`REASON_WAIT`]), else the request's error.
    async fn failure(ended: Arc<SetOnce<String>>, error: hyper::Error) -> ChannelError {
        let connection_gone =
            error.is_closed() || error.is_canceled() || error.is_incomplete_message();
        if !connection_gone && ended.get().is_none() {
            return ChannelError::Request(error);
        }
        match tokio::time::timeout(REASON_WAIT, ended.wait()).await {
            Ok(reason) => ChannelError::Closed {
                reason: reason.clone(),
            },
            Err(_) => ChannelError::Request(error),
        }
    }
}

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

impl tower::Service<Request<Body>> for Channel {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    /// Always ready: HTTP/2 multiplexes, and a closed connection is reported by the call itself
    /// (with its reason) rather than as a generic "service not ready".
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let (mut head, body) = request.into_parts();
        let mut uri = head.uri.into_parts();
        uri.scheme = Some(self.scheme.clone());
        uri.authority = Some(self.authority.clone());
        let ended = self.ended.clone();
        let uri = match Uri::from_parts(uri) {
            Ok(uri) => uri,
            Err(e) => return Box::pin(async move { Err(e.into()) }),
        };
        head.uri = uri;
        let sent = self.send.send_request(Request::from_parts(head, body));
        Box::pin(async move {
            match sent.await {
                Ok(response) => Ok(response.map(Body::new)),
                Err(e) => Err(Box::new(Channel::failure(ended, e).await) as BoxError),
            }
        })
    }
}
