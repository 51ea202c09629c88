//! Keeping the served configuration current: the pair read from its Secret volume as one
//! version ([`load`]), and the reloader polling it by contents ([`spawn_reloader`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;

use super::client_auth::ClientAuth;
use super::config::build;
use super::{MIN_RELOAD_INTERVAL, TlsError};

/// Reads the certificate and key files (and, with `client`, the client CA file) and builds the
/// configuration the HTTPS listener serves (see [`server_config`]); hand the result to
/// [`spawn_reloader`] to keep it current.
///
/// Like the reloader, it reads the pair as one version of the volume: should a Secret update
/// land mid-read, it reads again (up to three times).
///
/// [`server_config`]: super::server_config
pub async fn load(
    cert: &Path,
    key: &Path,
    client: Option<&ClientAuth>,
) -> Result<RustlsConfig, TlsError> {
    let ca = client.map(|c| c.ca_file.as_path());
    let mut read = read_pair(cert, key, ca).await?;
    for _ in 0..2 {
        if read.consistent {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        read = read_pair(cert, key, ca).await?;
    }
    let config = read.snapshot.build(cert, key, client)?;
    Ok(RustlsConfig::from_config(Arc::new(config)))
}

/// Keeps `config` serving the current contents of `cert` and `key` (and, with `client`, of the
/// client CA file: a renewed CA is trusted, and a bad one never replaces a good one, like the
/// pair), polling them every
/// `interval` ([`DEFAULT_RELOAD_INTERVAL`] in the server; never less than
/// [`MIN_RELOAD_INTERVAL`]).
///
/// The files are compared by *contents*, not modification time: kubelet updates a Secret volume
/// by atomically swapping the `..data` symlink, so `tls.crt -> ..data/tls.crt` keeps its path and
/// its own mtime while its target changes. Reading the certificate, then the key, then the
/// certificate again, and skipping the poll when the two certificate reads differ, keeps a swap
/// in the middle of a poll from being mistaken for a mismatched pair.
///
/// A file that cannot be read (kubelet removes the old version's directory right after the swap)
/// is only reported when it is still unreadable at the next poll.
///
/// When the contents change, a new configuration is built; if it is good it replaces the served
/// one (new handshakes use it; established connections keep theirs) and `on_reload(Ok(()))` is
/// called; if it is not (half-written files, a key that does not match), the old configuration
/// keeps serving and `on_reload(Err(_))` is called — once per distinct content or read error, not
/// at every poll. An `Err` therefore does not mean the server lost its certificate: do not mark
/// the process unready on it. The reloader itself logs only at debug level: log and count the
/// outcomes in `on_reload`.
///
/// The baseline is read before this function returns (a blocking read of two small files) and
/// silently re-applied, so a change between [`load`] and this call is not missed and a change
/// made after it returns is always reported; spawn the reloader right after [`load`].
/// It runs until the returned handle is aborted (or the runtime shuts down); call it from within
/// a Tokio runtime, like `tokio::spawn`.
///
/// [`DEFAULT_RELOAD_INTERVAL`]: super::DEFAULT_RELOAD_INTERVAL
pub fn spawn_reloader(
    config: RustlsConfig,
    cert: PathBuf,
    key: PathBuf,
    client: Option<ClientAuth>,
    interval: Duration,
    on_reload: impl Fn(Result<(), TlsError>) + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let interval = interval.max(MIN_RELOAD_INTERVAL);
    let mut reloader = Reloader {
        config,
        cert,
        key,
        client,
        applied: None,
        read_failed: false,
        read_error: None,
        baseline: true,
    };
    reloader.baseline_now();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if let Some(outcome) = reloader.poll().await {
                on_reload(outcome);
            }
        }
    })
}

/// The contents of one consistent read of the pair.
#[derive(PartialEq, Eq)]
pub(super) struct Snapshot {
    pub(super) cert: Vec<u8>,
    pub(super) key: Vec<u8>,
    /// The client CA file's contents, when client certificates are verified.
    pub(super) ca: Option<Vec<u8>>,
}

impl Snapshot {
    /// The server configuration of these contents ([`build`]), verifying clients as `client`
    /// says with this snapshot's CA; `cert` and `key` name the files in errors.
    fn build(
        &self,
        cert: &Path,
        key: &Path,
        client: Option<&ClientAuth>,
    ) -> Result<rustls::ServerConfig, TlsError> {
        let client = self.ca.as_deref().zip(client);
        build(&self.cert, &self.key, cert, key, client)
    }
}

/// The reloader's memory between polls.
struct Reloader {
    config: RustlsConfig,
    cert: PathBuf,
    key: PathBuf,
    client: Option<ClientAuth>,
    /// The contents last tried (served if they were good; reported if they were not).
    applied: Option<Snapshot>,
    /// The previous poll could not read the files (one failure is not reported: it may be a swap).
    read_failed: bool,
    /// The last read error reported, so a missing file is reported once, not every poll.
    read_error: Option<String>,
    /// True until the first poll: a good pair read then is the baseline, applied without a report.
    baseline: bool,
}

impl Reloader {
    /// Reads and applies the baseline synchronously, without a report. Leaves `baseline` set
    /// (for the first poll to retry) if the files are mid-swap or unusable right now.
    fn baseline_now(&mut self) {
        let read = |p: &Path| std::fs::read(p).ok();
        let (Some(first), Some(key), Some(cert)) =
            (read(&self.cert), read(&self.key), read(&self.cert))
        else {
            return;
        };
        if first != cert {
            return;
        }
        let ca = match &self.client {
            Some(client) => match read(&client.ca_file) {
                Some(ca) => Some(ca),
                None => return,
            },
            None => None,
        };
        let snapshot = Snapshot { cert, key, ca };
        let built = snapshot.build(&self.cert, &self.key, self.client.as_ref());
        if let Ok(config) = built {
            self.config.reload_from_config(Arc::new(config));
            self.applied = Some(snapshot);
            self.baseline = false;
        }
    }

    /// One poll: returns what to report, if anything.
    async fn poll(&mut self) -> Option<Result<(), TlsError>> {
        let baseline = std::mem::replace(&mut self.baseline, false);
        let ca = self.client.as_ref().map(|c| c.ca_file.as_path());
        let snapshot = match read_pair(&self.cert, &self.key, ca).await {
            Ok(read) if read.consistent => read.snapshot,
            // Mid-swap: the next poll sees the settled state.
            Ok(_) => return None,
            Err(error) => {
                if !std::mem::replace(&mut self.read_failed, true) {
                    tracing::debug!(%error, "cannot read the serving certificate; retrying at the next poll");
                    return None;
                }
                let message = error.to_string();
                if self.read_error.as_deref() == Some(message.as_str()) {
                    return None;
                }
                tracing::debug!(%error, "cannot read the serving certificate; still serving the previous one");
                self.read_error = Some(message);
                return Some(Err(error));
            }
        };
        self.read_failed = false;
        if self.read_error.take().is_some() {
            tracing::debug!(cert = %self.cert.display(), key = %self.key.display(), "certificate files readable again");
        }
        if self.applied.as_ref() == Some(&snapshot) {
            return None;
        }
        let built = snapshot.build(&self.cert, &self.key, self.client.as_ref());
        self.applied = Some(snapshot);
        match built {
            Ok(config) => {
                self.config.reload_from_config(Arc::new(config));
                if baseline {
                    return None;
                }
                tracing::debug!(cert = %self.cert.display(), key = %self.key.display(), "serving a new certificate");
                Some(Ok(()))
            }
            Err(error) => {
                tracing::debug!(%error, "new certificate rejected; still serving the previous one");
                Some(Err(error))
            }
        }
    }
}

/// One read of the pair.
pub(super) struct PairRead {
    pub(super) snapshot: Snapshot,
    /// False when the certificate changed while the pair was read: the key may belong to either
    /// version.
    pub(super) consistent: bool,
}

/// Reads certificate, key, the client CA (if any), certificate again; the two certificate reads
/// agree when no update landed in between (a kubelet update swaps both files at once).
pub(super) async fn read_pair(
    cert: &Path,
    key: &Path,
    ca: Option<&Path>,
) -> Result<PairRead, TlsError> {
    let first = read(cert).await?;
    let key = read(key).await?;
    let ca = match ca {
        Some(path) => Some(read(path).await?),
        None => None,
    };
    let cert = read(cert).await?;
    Ok(PairRead {
        consistent: first == cert,
        snapshot: Snapshot { cert, key, ca },
    })
}

async fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::fixtures::generated;

    /// A directory removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let path = std::env::temp_dir()
                .join(format!("quorumguard-tls-unit-{}-{tag}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).expect("scratch dir");
            Scratch(path)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[tokio::test]
    async fn the_reloader_reports_each_change_once_and_read_errors_only_when_they_persist() {
        let dir = Scratch::new("reloader");
        let (cert, key) = (dir.0.join("tls.crt"), dir.0.join("tls.key"));
        let (old_cert, old_key) = generated();
        let (new_cert, new_key) = generated();
        std::fs::write(&cert, &old_cert).expect("write");
        std::fs::write(&key, &old_key).expect("write");
        let config = load(&cert, &key, None).await.expect("load");
        let mut reloader = Reloader {
            config: config.clone(),
            cert: cert.clone(),
            key: key.clone(),
            client: None,
            applied: None,
            read_failed: false,
            read_error: None,
            baseline: true,
        };
        let served = |c: &RustlsConfig| Arc::as_ptr(&c.get_inner());
        assert!(reloader.poll().await.is_none(), "the baseline is silent");
        assert!(reloader.poll().await.is_none(), "nothing changed");
        let baseline = served(&config);

        // A missing file is reported when it is still missing at the next poll, then not again.
        std::fs::remove_file(&key).expect("remove");
        assert!(
            reloader.poll().await.is_none(),
            "one failed read may be a swap"
        );
        let outcome = reloader.poll().await;
        assert!(
            matches!(outcome, Some(Err(TlsError::Read { .. }))),
            "{outcome:?}"
        );
        assert!(
            reloader.poll().await.is_none(),
            "the same error is not repeated"
        );
        std::fs::write(&key, &old_key).expect("write");
        assert!(
            reloader.poll().await.is_none(),
            "back to the served contents"
        );

        // A non-atomic writer: half the certificate, then all of it, then the key.
        std::fs::write(&cert, &new_cert[..new_cert.len() / 2]).expect("write");
        let outcome = reloader.poll().await;
        assert!(
            matches!(outcome, Some(Err(TlsError::Pem { .. }))),
            "{outcome:?}"
        );
        assert!(
            reloader.poll().await.is_none(),
            "the same bad contents are not retried"
        );
        std::fs::write(&cert, &new_cert).expect("write");
        let outcome = reloader.poll().await;
        assert!(
            matches!(outcome, Some(Err(TlsError::KeyMismatch { .. }))),
            "{outcome:?}"
        );
        assert_eq!(served(&config), baseline, "still serving the old pair");
        std::fs::write(&key, &new_key).expect("write");
        let outcome = reloader.poll().await;
        assert!(matches!(outcome, Some(Ok(()))), "{outcome:?}");
        assert_ne!(served(&config), baseline, "the new pair is served");
        assert!(reloader.poll().await.is_none());
    }

    #[tokio::test]
    async fn load_names_a_missing_file() {
        let missing = Path::new("/nonexistent/quorumguard/tls.crt");
        let err = load(missing, Path::new("/nonexistent/quorumguard/tls.key"), None)
            .await
            .unwrap_err();
        assert!(matches!(err, TlsError::Read { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("cannot read /nonexistent/quorumguard/tls.crt"),
            "{err}"
        );
    }
}
