//! `?watch=true`: a chunked stream of newline-delimited JSON watch events.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};

use super::Shared;
use super::http::{Params, Target};
use super::status::ApiError;
use super::store::{Filter, WatchStart, bookmark, event, partial};

/// kube-apiserver closes a watch without `timeoutSeconds` after 30 to 60 minutes.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Opens a watch on `target` (a collection) as `params` ask.
pub fn start(
    shared: &Arc<Shared>,
    target: &Target,
    filter: Filter,
    params: &Params,
    partial: bool,
) -> Result<Response, ApiError> {
    let bookmarks = params.flag("allowWatchBookmarks");
    let rv = params.get("resourceVersion").unwrap_or("");
    let start = if params.flag("sendInitialEvents") {
        if !bookmarks {
            return Err(invalid_options(
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
        if params.get("resourceVersionMatch") != Some("NotOlderThan") {
            return Err(invalid_options(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        WatchStart::InitialEvents
    } else if rv.is_empty() || rv == "0" {
        WatchStart::Current
    } else {
        let n = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?;
        WatchStart::After(n)
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let (tx, rx) = mpsc::unbounded_channel();
    let error = shared.store().subscribe(filter, tx.clone(), start).err();
    shared.open_watches.fetch_add(1, Ordering::SeqCst);
    let every = shared.bookmark_every();
    let now = Instant::now();
    let state = WatchState {
        rx,
        tx,
        shared: Arc::clone(shared),
        res: target.res,
        kill: shared.kill.subscribe(),
        deadline: now + timeout,
        bookmarks,
        every,
        next_bookmark: now + every,
        error,
        partial,
        done: false,
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        let item = s.next_item().await?;
        Some((item, s))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::internal(e.to_string()))
}

fn invalid_options(why: &str) -> ApiError {
    ApiError::new(
        422,
        "Invalid",
        format!("ListOptions.meta.k8s.io \"\" is invalid: {why}"),
        None,
    )
}

struct WatchState {
    rx: mpsc::UnboundedReceiver<Value>,
    /// Bookmarks are queued behind the events already sent to this watch, under the store
    /// lock, so a bookmark never claims a resourceVersion whose events are still to come.
    tx: mpsc::UnboundedSender<Value>,
    shared: Arc<Shared>,
    res: usize,
    kill: watch::Receiver<u64>,
    deadline: Instant,
    bookmarks: bool,
    every: Duration,
    next_bookmark: Instant,
    error: Option<Value>,
    /// Send objects as PartialObjectMetadata (`watch_metadata`).
    partial: bool,
    done: bool,
}

impl Drop for WatchState {
    fn drop(&mut self) {
        self.shared.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

fn line(value: &Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

impl WatchState {
    fn shown(&self, mut ev: Value) -> Value {
        if self.partial && ev["type"] != "ERROR" {
            ev["object"] = partial(&ev["object"]);
        }
        ev
    }

    /// The next chunk; `None` ends the response cleanly, an `Err` aborts the connection.
    async fn next_item(&mut self) -> Option<Result<Bytes, std::io::Error>> {
        if self.done {
            return None;
        }
        if let Some(status) = self.error.take() {
            // Like the watch cache: a watch that cannot start answers 200 and one ERROR event.
            self.done = true;
            return Some(Ok(line(&event("ERROR", &status))));
        }
        loop {
            tokio::select! {
                biased;
                _ = self.kill.changed() => {
                    self.done = true;
                    let err = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "watch dropped (ApiServer::drop_watches)");
                    return Some(Err(err));
                }
                ev = self.rx.recv() => return ev.map(|v| Ok(line(&self.shown(v)))),
                () = sleep_until(self.deadline) => return None,
                () = sleep_until(self.next_bookmark), if self.bookmarks => {
                    self.next_bookmark = Instant::now() + self.every;
                    let store = self.shared.store();
                    if let Some(def) = store.defs.get(self.res) {
                        let _ = self.tx.send(bookmark(def, store.rv, false));
                    }
                }
            }
        }
    }
}
