//! The webhook's HTTPS listener: rustls, `TCP_NODELAY`, connections and requests bounded in
//! time, and each handshake refused for its client certificate logged and counted.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum_server::Server;
use axum_server::accept::NoDelayAcceptor;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};

use quorumguard_pki::tls;
use quorumguard_telemetry::Metrics;

/// How long a connection may go, after its TLS handshake, without a complete first request
/// (h2 and HTTP/1.1): a client that connects and sends nothing, or drips its headers, is closed
/// rather than held open forever. axum-server bounds the handshake itself (10 s).
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/1.1: how long the headers of a later request on a kept-alive connection may take (and so
/// how long such a connection may sit idle). hyper's own default, which axum-server turns off.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a request may take once its headers are in: reading the body and answering. An
/// answer takes microseconds, so this bounds a client that drips its body.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers 408 to a request that does not finish within [`REQUEST_TIMEOUT`].
pub(super) async fn bounded(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!(
                "quorumguard: the request body did not arrive within {} s\n",
                REQUEST_TIMEOUT.as_secs()
            ),
        )
            .into_response(),
    }
}

/// The webhook's HTTPS listener: rustls with `tls`, h2 and http/1.1, and `TCP_NODELAY` on every
/// accepted connection. Without it, a response written in more than one segment waits for the
/// client's delayed ACK (40 ms on Linux) under Nagle's algorithm: under concurrent h2 load that
/// put a 40 ms floor under the p99. kube-apiserver's Go client sets it on its side too.
/// Connections are bounded in time as well: [`FIRST_REQUEST_TIMEOUT`] and, for HTTP/1.1,
/// [`HEADER_READ_TIMEOUT`] (axum-server turns hyper's default off). A handshake refused for its
/// client certificate (when `tls` verifies them) is logged and counted ([`Handshakes`]).
pub fn https(
    addr: SocketAddr,
    tls: RustlsConfig,
    metrics: Option<Arc<Metrics>>,
) -> Server<SocketAddr, Handshakes<RustlsAcceptor<NoDelayAcceptor>>> {
    let mut server = Server::bind(addr)
        .acceptor(Handshakes {
            inner: RustlsAcceptor::new(tls).acceptor(NoDelayAcceptor::new()),
            metrics,
        })
        .first_request_timeout(FIRST_REQUEST_TIMEOUT);
    server
        .http_builder()
        .http1()
        .header_read_timeout(HEADER_READ_TIMEOUT);
    server
}

/// The TLS acceptor, with each handshake refused for its client certificate logged once (the
/// peer's address, the certificate's subject and why) and counted in
/// `quorumguard_client_certificate_refusals_total`. Other handshake failures (a port scan, a
/// client offering no common version) stay at debug level, as before.
#[derive(Clone)]
pub struct Handshakes<A> {
    inner: A,
    metrics: Option<Arc<Metrics>>,
}

type Accepted<T, U> =
    std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<(T, U)>> + Send + 'static>>;

impl<A, S> axum_server::accept::Accept<tokio::net::TcpStream, S> for Handshakes<A>
where
    A: axum_server::accept::Accept<tokio::net::TcpStream, S>,
    A::Future: Send + 'static,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = Accepted<A::Stream, A::Service>;

    fn accept(&self, stream: tokio::net::TcpStream, service: S) -> Self::Future {
        let peer = stream.peer_addr().ok();
        let metrics = self.metrics.clone();
        let accepted = self.inner.accept(stream, service);
        Box::pin(async move {
            accepted
                .await
                .inspect_err(|error| match tls::refusal(error) {
                    Some(why) => {
                        if let Some(m) = &metrics {
                            m.client_certificate_refused();
                        }
                        tracing::warn!(
                            peer = %peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string()),
                            "TLS handshake refused, no review read: {why}"
                        );
                    }
                    None => tracing::debug!(error = %error, "TLS handshake failed"),
                })
        })
    }
}
