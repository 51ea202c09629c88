//! Port-forward, as the stand-in relays it: `GET /api/v1/namespaces/{ns}/pods/{name}/portforward
//! ?ports=N` upgraded to a WebSocket the way kube-apiserver (through the kubelet) serves it to a
//! client speaking the `v4.channel.k8s.io` subprotocol — which is what kube's `Api::portforward`
//! asks for (it offers `v5.channel.k8s.io, v4.channel.k8s.io`; for port-forward the real server
//! picks v4, as this one does).
//!
//! The protocol: binary frames, each prefixed by a channel byte. A port's data channel is `0`,
//! its error channel `1`; the server's first frame on each carries the port, 2 bytes
//! little-endian. Client frames on channel 0 are bytes for the pod. When the pod's port cannot
//! be reached, the error channel carries the kubelet's text and the connection closes.
//!
//! This is a **stand-in**: there are no pods and no kubelet. The caller maps a pod to a TCP address
//! on this machine ([`super::ApiServer::forward_pod`]) and every forwarded connection is dialled
//! there. Not done: more than one port per request (400), SPDY (only WebSocket), the base64
//! subprotocol, `portforward.k8s.io` tunnelling, authorization of the `pods/portforward`
//! subresource, and checking that the pod exists as an object (a mapped pod is one that exists).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, Request};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::resources::ResourceDef;
use super::status::ApiError;
use super::{Shared, lock};

/// The subprotocol kube-apiserver answers port-forward with.
pub const PROTOCOL: &str = "v4.channel.k8s.io";
/// How long dialling the pod's address may take (it is on this machine).
const DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes read from the pod per frame, at most.
const CHUNK: usize = 32 * 1024;

/// `(namespace, pod)` when `path` is a pod's port-forward subresource.
pub fn target(path: &str) -> Option<(String, String)> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name, "portforward"] => {
            Some(((*ns).to_string(), (*name).to_string()))
        }
        _ => None,
    }
}

fn pods() -> ResourceDef {
    ResourceDef::builtin("", "v1", "Pod", "pods")
}

fn error_response(err: &ApiError) -> Response {
    let mut response = Response::new(Body::from(err.body.to_string()));
    *response.status_mut() = StatusCode::from_u16(err.code).unwrap_or(StatusCode::BAD_REQUEST);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn header_has(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case(token))
}

/// Answers one port-forward request: the checks a real server makes, in its order (the pod,
/// the ports, the upgrade), then `101 Switching Protocols` and a relay task.
pub async fn handle(
    shared: Arc<Shared>,
    mut request: Request,
    namespace: String,
    pod: String,
) -> Response {
    let path = request.uri().path().to_string();
    // RBAC spells a WebSocket port-forward as `get` (and, since 1.30, `create` too) on
    // `pods/portforward`; the record keeps the HTTP method's verb.
    let verb = if request.method() == Method::POST {
        "create"
    } else {
        "get"
    };
    shared.record(verb, &path, request.uri().query().unwrap_or(""));
    let (delay, fail) = shared.take_faults(verb, &path);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(code) = fail {
        return error_response(&ApiError::injected(code, Some((&pods(), pod.as_str()))));
    }
    if request.method() != Method::GET && request.method() != Method::POST {
        return error_response(&ApiError::method_not_allowed());
    }
    let Some(addr) = lock(&shared.pods)
        .get(&(namespace.clone(), pod.clone()))
        .copied()
    else {
        return error_response(&ApiError::not_found(&pods(), &pod));
    };
    let params = Query::<Vec<(String, String)>>::try_from_uri(request.uri())
        .map(|q| q.0)
        .unwrap_or_default();
    let ports: Vec<&str> = params
        .iter()
        .filter(|(k, _)| k == "ports")
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    let port = match ports.as_slice() {
        [] => {
            return error_response(&ApiError::bad_request(
                "at least one port must be specified",
            ));
        }
        [p] => match p.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => {
                return error_response(&ApiError::bad_request(format!(
                    "invalid port {p:?}: must be between 1 and 65535"
                )));
            }
        },
        _ => {
            return error_response(&ApiError::bad_request(
                "the API-server stand-in forwards one port per request",
            ));
        }
    };
    let headers = request.headers();
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|k| k.to_str().ok())
        .map(str::to_string);
    let websocket = header_has(headers, header::CONNECTION, "upgrade")
        && header_has(headers, header::UPGRADE, "websocket")
        && header_has(headers, header::SEC_WEBSOCKET_VERSION, "13");
    let Some(key) = key.filter(|_| websocket) else {
        return error_response(&ApiError::bad_request("Upgrade request required"));
    };
    let offered: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    // No protocol asked: the real server's "" protocol (binary channels, as v4).
    let protocol = if offered.is_empty() {
        None
    } else if offered.iter().any(|p| p == PROTOCOL) {
        Some(PROTOCOL)
    } else {
        return error_response(&ApiError::bad_request(format!(
            "requested protocol(s) are not supported: {offered:?}; supports [\"{PROTOCOL}\"]"
        )));
    };

    let on_upgrade = hyper::upgrade::on(&mut request);
    let name = format!("{namespace}/{pod}");
    let counted = Opened::new(shared.clone());
    let mut kill = shared.kill.subscribe();
    tokio::spawn(async move {
        let _counted = counted;
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        tokio::select! {
            _ = relay(ws, addr, port, &name) => {}
            _ = kill.changed() => {}
        }
    });

    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    if let Some(p) = protocol {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
    }
    response
}

/// Counts a port-forward connection as open until dropped.
struct Opened(Arc<Shared>);

impl Opened {
    fn new(shared: Arc<Shared>) -> Self {
        shared.open_forwards.fetch_add(1, Ordering::SeqCst);
        shared.forwards_total.fetch_add(1, Ordering::SeqCst);
        Opened(shared)
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        self.0.open_forwards.fetch_sub(1, Ordering::SeqCst);
    }
}

fn frame(channel: u8, bytes: &[u8]) -> Message {
    let mut v = Vec::with_capacity(bytes.len() + 1);
    v.push(channel);
    v.extend_from_slice(bytes);
    Message::binary(v)
}

/// The kubelet's side: announce the port on both channels, dial the pod, then copy until either
/// side ends. A failed dial is reported on the error channel, as the kubelet reports it.
async fn relay<S>(ws: WebSocketStream<S>, addr: SocketAddr, port: u16, pod: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let port_bytes = port.to_le_bytes();
    if sink.send(frame(0, &port_bytes)).await.is_err()
        || sink.send(frame(1, &port_bytes)).await.is_err()
    {
        return;
    }
    let tcp = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(tcp)) => tcp,
        failed => {
            let why = match failed {
                Ok(Err(e)) => e.to_string(),
                _ => format!("i/o timeout after {DIAL_TIMEOUT:?}"),
            };
            let text = format!("error forwarding port {port} to pod {pod}: dial tcp {addr}: {why}");
            let _ = sink.send(frame(1, text.as_bytes())).await;
            let _ = sink.send(Message::Close(None)).await;
            return;
        }
    };
    // No Nagle, as the kubelet's dial (Go) to the pod.
    let _ = tcp.set_nodelay(true);
    let (mut from_pod, mut to_pod) = tcp.into_split();
    let upstream = async {
        while let Some(Ok(message)) = stream.next().await {
            let go_on = match message {
                Message::Binary(b) if b.first() == Some(&0) => {
                    to_pod.write_all(&b[1..]).await.is_ok()
                }
                Message::Close(_) => false,
                // Pings are answered by tungstenite; other channels carry nothing for the pod.
                _ => true,
            };
            if !go_on {
                break;
            }
        }
        let _ = to_pod.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from_pod.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink.send(frame(0, &buf[..n])).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    };
    // Either side ending ends the forward: the client closes the WebSocket when its local
    // connection ends, and a pod closing its port ends the stream, as with the kubelet.
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
}
