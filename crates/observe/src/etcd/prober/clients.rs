//! The clients a [`Prober`] keeps, one per endpoint: dialled under the probe's deadline, replaced
//! when their connection has ended, dropped after a failed call; and what a failed call says.

use std::collections::HashMap;
use std::future::Future;
use std::sync::MutexGuard;

use etcd_client::Client;
use tokio::time::{Instant, timeout_at};
use tower::util::BoxCloneSyncService;

use super::Prober;
use crate::etcd::channel::{Channel, append_causes, chain};

/// A kept client and the one connection under it (see [`crate::etcd::channel`]).
pub(super) struct Kept {
    client: Client,
    channel: Channel,
}

impl Prober {
    /// What to report for a failed call to `url`: the transport's own failure since `since`
    /// when there is one (it is the cause: etcd-client only saw the connection close), else
    /// etcd-client's `error`.
    pub(super) fn explain(&self, url: &str, since: Instant, error: String) -> String {
        self.transport
            .forward_error(url, since.into_std())
            .unwrap_or(error)
    }

    /// The kept client of `url`, or a new one (dialled by `until`). A kept client whose
    /// connection has ended (the member restarted, or closed it) is replaced before use, so the
    /// restart does not cost this probe a failed call.
    pub(super) async fn client(
        &self,
        url: &str,
        until: Instant,
        timeout_text: &str,
    ) -> Result<Client, String> {
        {
            let mut clients = self.lock();
            match clients.get(url) {
                Some(kept) if !kept.channel.is_closed() => return Ok(kept.client.clone()),
                Some(_) => {
                    clients.remove(url);
                }
                None => {}
            }
        }
        let connect = Channel::connect(url, self.tls.config(), self.transport.tls_name());
        let channel = match timeout_at(until, connect).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => return Err(chain(&e)),
            Err(_) => return Err(timeout_text.to_string()),
        };
        let raw = etcd_client::Channel::Custom(BoxCloneSyncService::new(channel.clone()));
        let client = call(until, timeout_text, Client::from_channel(raw, None)).await?;
        let mut clients = self.lock();
        let kept = clients
            .entry(url.to_string())
            .or_insert_with(|| Box::new(Kept { client, channel }));
        Ok(kept.client.clone())
    }

    pub(super) fn evict(&self, url: &str) {
        self.lock().remove(url);
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<String, Box<Kept>>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Awaits `fut` until `until`; errors become text.
pub(super) async fn call<T>(
    until: Instant,
    timeout_text: &str,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match timeout_at(until, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err(timeout_text.to_string()),
    }
}

/// An etcd-client error as a human reads it: etcd's own message (e.g. "etcdserver: no
/// leader") or the transport's, followed by its causes (e.g. "Connection refused", the TLS
/// alert), without repeating what is already said.
fn describe(e: &etcd_client::Error) -> String {
    let mut text = match e {
        etcd_client::Error::GRpcStatus(s) if !s.message().is_empty() => s.message().to_string(),
        etcd_client::Error::GRpcStatus(s) => format!("gRPC status {:?}", s.code()),
        other => other.to_string(),
    };
    // etcd_client::Error does not expose its cause through `source()`: start from the inner
    // error, where tonic keeps the cause (e.g. the I/O error behind "tcp connect error").
    let source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
        etcd_client::Error::TransportError(t) => std::error::Error::source(t),
        etcd_client::Error::IoError(io) => std::error::Error::source(io),
        _ => None,
    };
    append_causes(&mut text, source);
    text
}

/// Says what an abrupt close on a new connection usually means. Over TLS 1.3 etcd checks the
/// client certificate after the client has finished its handshake, so a refused certificate
/// shows up as the alert ("BadCertificate") only when it wins the race with the first request;
/// otherwise the client sees only the connection closing.
pub(super) fn with_hint(error: String) -> String {
    let abrupt = ["connection closed", "broken pipe", "connection reset"]
        .iter()
        .any(|s| error.contains(s));
    if abrupt {
        format!("{error} (etcd closed the connection: is the client certificate signed by its CA?)")
    } else {
        error
    }
}
