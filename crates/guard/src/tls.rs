//! The webhook's serving TLS, with certificate hot reload.
//!
//! kube-apiserver only talks to a webhook over HTTPS, and the serving certificate is short-lived
//! (cert-manager renews it, or `quorumguard certs` rotates it): a webhook that keeps an old
//! certificate until it restarts starts failing admission — and with `failurePolicy: Fail`, blocks
//! the very changes needed to fix it. So the certificate is re-read from its Secret volume while
//! serving, and a bad new pair never replaces a good one.
//!
//! Every configuration is built on the `ring` provider explicitly: a second rustls provider
//! anywhere in the dependency tree makes the process-default `ServerConfig::builder()` panic at
//! run time, so nothing here relies on the process default.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use axum_server::tls_rustls::RustlsConfig;
use rustls::{
    InconsistentKeys, ServerConfig,
    crypto::ring,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    sign::{CertifiedKey, SingleCertAndKey},
    version::{TLS12, TLS13},
};

/// ALPN protocols offered, in order of preference: kube-apiserver speaks HTTP/2 to webhooks when
/// it can; HTTP/1.1 stays for curl, probes and older clients.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// How often the server polls the certificate files by default: well inside kubelet's Secret sync
/// period (about a minute), cheap (two small reads), and short enough that a renewed certificate
/// is served long before the old one expires.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// The shortest poll interval [`spawn_reloader`] accepts; shorter ones are raised to it, so a zero
/// interval cannot turn into a busy loop.
pub const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(10);

/// Why a certificate/key pair cannot be served. Every variant names the file at fault, because
/// the person reading it is usually looking at a Secret and needs to know which key of it to fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read (missing, permissions, a dangling `..data` symlink).
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not well-formed PEM (for example, half-written).
    #[error("{}: malformed PEM: {source}", path.display())]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate file holds no `CERTIFICATE` block.
    #[error(
        "{}: no certificate found: expected PEM `CERTIFICATE` blocks, the serving certificate \
         first, then any intermediates{hint}",
        path.display()
    )]
    NoCertificate { path: PathBuf, hint: &'static str },
    /// The key file holds no private key block this server can read.
    #[error(
        "{}: no private key found: expected a PEM `PRIVATE KEY` (PKCS#8), `RSA PRIVATE KEY` \
         (PKCS#1) or `EC PRIVATE KEY` (SEC1) block{hint}",
        path.display()
    )]
    NoKey { path: PathBuf, hint: &'static str },
    /// The private key is encrypted; the server has no passphrase to decrypt it with.
    #[error(
        "{}: the private key is encrypted; the webhook needs an unencrypted key (as cert-manager \
         and `quorumguard certs` write it)",
        path.display()
    )]
    EncryptedKey { path: PathBuf },
    /// The key block decodes but is not a key `ring` can sign with (unsupported algorithm or
    /// curve, or corrupt).
    #[error("{}: unusable private key: {source}", path.display())]
    InvalidKey {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    /// The first certificate in the file is not a valid X.509 certificate.
    #[error("{}: the serving certificate is not valid X.509: {source}", path.display())]
    InvalidCertificate {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    /// The key is not the one the serving certificate (the first in the file) was issued for.
    #[error(
        "{} does not match the certificate in {}: the first certificate in the file must be the \
         one issued for this key (a half-finished rotation, or files from different Secrets?)",
        key.display(),
        cert.display()
    )]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    /// The serving certificate's DER does not parse as X.509 (read for its validity period).
    #[error("{}: the serving certificate is not valid X.509: {detail}", path.display())]
    X509 { path: PathBuf, detail: String },
    /// rustls refused the configuration itself (should not happen with the ring provider).
    #[error("cannot build the TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

/// Builds the server configuration from PEM contents: TLS 1.3 and 1.2 only, the `ring` provider,
/// ALPN `h2` then `http/1.1`.
///
/// `cert_pem` may hold a chain (serving certificate first, then intermediates), as cert-manager
/// writes `tls.crt`; `key_pem` may be PKCS#8, PKCS#1 (RSA) or SEC1 (EC), the first key block is
/// used. The key is checked against the serving certificate, so a mismatched pair fails here and
/// not at the first handshake. Errors name the inputs `<certificate PEM>` and `<key PEM>`; use
/// [`load`] to have them name the files.
pub fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<ServerConfig, TlsError> {
    build(
        cert_pem,
        key_pem,
        Path::new("<certificate PEM>"),
        Path::new("<key PEM>"),
    )
}

/// Reads the certificate and key files and builds the configuration the HTTPS listener serves
/// (see [`server_config`]); hand the result to [`spawn_reloader`] to keep it current.
///
/// Like the reloader, it reads the pair as one version of the volume: should a Secret update
/// land mid-read, it reads again (up to three times).
pub async fn load(cert: &Path, key: &Path) -> Result<RustlsConfig, TlsError> {
    let mut read = read_pair(cert, key).await?;
    for _ in 0..2 {
        if read.consistent {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        read = read_pair(cert, key).await?;
    }
    let config = build(&read.snapshot.cert, &read.snapshot.key, cert, key)?;
    Ok(RustlsConfig::from_config(Arc::new(config)))
}

/// Keeps `config` serving the current contents of `cert` and `key`, polling them every
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
pub fn spawn_reloader(
    config: RustlsConfig,
    cert: PathBuf,
    key: PathBuf,
    interval: Duration,
    on_reload: impl Fn(Result<(), TlsError>) + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let interval = interval.max(MIN_RELOAD_INTERVAL);
    let mut reloader = Reloader {
        config,
        cert,
        key,
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

/// Checks the validity of the pair the server would serve, every `interval` (at least
/// [`MIN_RELOAD_INTERVAL`]), and calls `report` with it when it or its problem changes (once at
/// start, then at expiry, at renewal, when the warning window opens...).
///
/// A certificate expires while it is served, with no file change for the reloader to notice, so
/// this is a clock-driven check of its own. Only a pair that builds (what [`spawn_reloader`]
/// would serve) is judged; an unreadable or rejected pair is the reloader's to report, and the
/// last good one's validity stands.
pub fn spawn_validity_watch(
    cert: PathBuf,
    key: PathBuf,
    interval: Duration,
    report: impl Fn(&Validity, Option<ValidityProblem>) + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let interval = interval.max(MIN_RELOAD_INTERVAL);
    tokio::spawn(async move {
        let mut last: Option<(Validity, Option<ValidityProblem>)> = None;
        // The pair last judged servable and its validity: an unchanged pair is not rebuilt, only
        // its validity judged again against the clock.
        let mut judged: Option<(Snapshot, Validity)> = None;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Ok(read) = read_pair(&cert, &key).await else {
                continue;
            };
            if !read.consistent {
                continue;
            }
            let validity = match &judged {
                Some((snapshot, validity)) if *snapshot == read.snapshot => *validity,
                _ => {
                    let snapshot = read.snapshot;
                    if build(&snapshot.cert, &snapshot.key, &cert, &key).is_err() {
                        continue;
                    }
                    let Ok(validity) = Validity::of_pem(&snapshot.cert, &cert) else {
                        continue;
                    };
                    judged = Some((snapshot, validity));
                    validity
                }
            };
            let now = crate::certs::unix_secs(std::time::SystemTime::now());
            let seen = (validity, validity.problem(now));
            if last != Some(seen) {
                report(&seen.0, seen.1);
                last = Some(seen);
            }
        }
    })
}

/// The contents of one consistent read of the pair.
#[derive(PartialEq, Eq)]
struct Snapshot {
    cert: Vec<u8>,
    key: Vec<u8>,
}

/// The reloader's memory between polls.
struct Reloader {
    config: RustlsConfig,
    cert: PathBuf,
    key: PathBuf,
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
        if let Ok(config) = build(&cert, &key, &self.cert, &self.key) {
            self.config.reload_from_config(Arc::new(config));
            self.applied = Some(Snapshot { cert, key });
            self.baseline = false;
        }
    }

    /// One poll: returns what to report, if anything.
    async fn poll(&mut self) -> Option<Result<(), TlsError>> {
        let baseline = std::mem::replace(&mut self.baseline, false);
        let snapshot = match read_pair(&self.cert, &self.key).await {
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
        let built = build(&snapshot.cert, &snapshot.key, &self.cert, &self.key);
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
struct PairRead {
    snapshot: Snapshot,
    /// False when the certificate changed while the pair was read: the key may belong to either
    /// version.
    consistent: bool,
}

/// Reads certificate, key, certificate again; the two certificate reads agree when no update
/// landed in between (a kubelet update swaps both files at once).
async fn read_pair(cert: &Path, key: &Path) -> Result<PairRead, TlsError> {
    let first = read(cert).await?;
    let key = read(key).await?;
    let cert = read(cert).await?;
    Ok(PairRead {
        consistent: first == cert,
        snapshot: Snapshot { cert, key },
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

/// [`server_config`] with the names errors should use for the two inputs.
fn build(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<ServerConfig, TlsError> {
    let chain = parse_chain(cert_pem, cert_path)?;
    let key = parse_key(key_pem, key_path)?;
    let provider = Arc::new(ring::default_provider());
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|source| TlsError::InvalidKey {
            path: key_path.to_owned(),
            source,
        })?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // `Unknown`: the key cannot tell its public half. Every ring key can, so this is not
        // reached; rustls itself accepts such keys, and so do we.
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(_)) => {
            return Err(TlsError::KeyMismatch {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
            });
        }
        Err(source) => {
            return Err(TlsError::InvalidCertificate {
                path: cert_path.to_owned(),
                source,
            });
        }
    }
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&TLS13, &TLS12])
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// How long before expiry the server starts warning: cert-manager renews at two thirds of the
/// lifetime (30 of 90 days left) and `quorumguard certs` is run by hand, so a week left means the
/// renewal has failed and someone has days, not minutes, to act.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

/// The validity period of the serving certificate (the first in the file), Unix seconds.
///
/// rustls serves whatever it is given; it is kube-apiserver that refuses an expired or
/// not-yet-valid certificate, and then every review fails and, with `failurePolicy: Fail`,
/// control-plane Machine deletions and KCP spec changes are refused. Refusing to serve would not
/// help (the webhook would be down all the same, and a renewed certificate could not be picked
/// up by the reloader), so the server keeps serving and says so loudly instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

/// What is wrong with a serving certificate's validity at a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValidityProblem {
    /// Past `not_after`: kube-apiserver refuses it.
    Expired,
    /// Before `not_before` (clock skew, or issued for the future): kube-apiserver refuses it.
    NotYetValid,
    /// Valid, but for less than [`EXPIRY_WARNING`].
    ExpiresSoon,
}

impl Validity {
    /// Reads the validity of the first certificate in `cert_pem`; `path` names the file in errors.
    pub fn of_pem(cert_pem: &[u8], path: &Path) -> Result<Validity, TlsError> {
        let chain = parse_chain(cert_pem, path)?;
        let leaf = chain.first().ok_or_else(|| TlsError::NoCertificate {
            path: path.to_owned(),
            hint: "",
        })?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(leaf.as_ref()).map_err(|e| TlsError::X509 {
                path: path.to_owned(),
                detail: e.to_string(),
            })?;
        Ok(Validity {
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
        })
    }

    /// The problem at `now` (Unix seconds), if any.
    pub fn problem(&self, now: i64) -> Option<ValidityProblem> {
        let warn = i64::try_from(EXPIRY_WARNING.as_secs()).unwrap_or(i64::MAX);
        if now > self.not_after {
            Some(ValidityProblem::Expired)
        } else if now < self.not_before {
            Some(ValidityProblem::NotYetValid)
        } else if self.not_after.saturating_sub(now) < warn {
            Some(ValidityProblem::ExpiresSoon)
        } else {
            None
        }
    }

    /// The message for an operator: what is wrong, what it breaks and what to do.
    pub fn describe(&self, problem: ValidityProblem, path: &Path, now: i64) -> String {
        use crate::certs::format_time;
        let consequence = "kube-apiserver refuses the webhook's TLS handshake, so every review \
             fails and, with failurePolicy Fail, control-plane Machine deletions and \
             KubeadmControlPlane spec changes are refused";
        let renew = "renew it: with cert-manager, `kubectl -n quorumguard-system describe \
             certificate quorumguard-webhook`; without, `quorumguard certs --out-dir DIR \
             --patch-webhook quorumguard` and update Secret quorumguard-webhook-tls (the new \
             pair is picked up without a restart)";
        let (cert, now_s) = (path.display(), format_time(now));
        match problem {
            ValidityProblem::Expired => format!(
                "serving certificate {cert} expired at {} (now {now_s}): {consequence}; {renew}",
                format_time(self.not_after)
            ),
            ValidityProblem::NotYetValid => format!(
                "serving certificate {cert} is not valid before {} (now {now_s}; is this node's \
                 clock or the issuer's wrong?): {consequence}; check the clocks, or {renew}",
                format_time(self.not_before)
            ),
            ValidityProblem::ExpiresSoon => format!(
                "serving certificate {cert} expires at {} (now {now_s}), in less than {} days: \
                 its renewal has not happened; once it expires {consequence}; {renew}",
                format_time(self.not_after),
                EXPIRY_WARNING.as_secs() / 86_400
            ),
        }
    }
}

/// All `CERTIFICATE` blocks, in file order (other blocks are skipped).
fn parse_chain(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        let hint = if is_blank(pem) {
            " (the file is empty)"
        } else if contains(pem, b"PRIVATE KEY-----") {
            " (the file holds a private key: are the certificate and key files swapped?)"
        } else {
            ""
        };
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
            hint,
        });
    }
    Ok(chain)
}

/// The first private key block (PKCS#8, PKCS#1 or SEC1).
fn parse_key(pem: &[u8], path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    // `ENCRYPTED PRIVATE KEY` (PKCS#8) and OpenSSL's `Proc-Type: 4,ENCRYPTED` header.
    if contains(pem, b"ENCRYPTED") {
        return Err(TlsError::EncryptedKey {
            path: path.to_owned(),
        });
    }
    match PrivateKeyDer::pem_slice_iter(pem).next() {
        Some(Ok(key)) => Ok(key),
        Some(Err(source)) => Err(TlsError::Pem {
            path: path.to_owned(),
            source,
        }),
        None => {
            let hint = if is_blank(pem) {
                " (the file is empty)"
            } else if contains(pem, b"CERTIFICATE-----") {
                " (the file holds a certificate: are the certificate and key files swapped?)"
            } else {
                ""
            };
            Err(TlsError::NoKey {
                path: path.to_owned(),
                hint,
            })
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(u8::is_ascii_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    // Test-only keys, made with OpenSSL 3 (`genrsa -traditional`, `ecparam -genkey -noout`,
    // `pkey`): PKCS#1 and SEC1 are what cert-manager writes by default, and ring cannot generate
    // RSA keys, so they are fixed here rather than generated.
    const RSA_PKCS1: &str = "-----BEGIN RSA PRIVATE KEY-----
MIIEpAIBAAKCAQEAtauvsUx9AK2/4fUbgTxeFQ+3jZ9YEhBjLI6lTWSO1+p/eFC+
ODPpRcplGYfEjgE1w+84UMRZoyDGhAuhECSNk6JzH189DFZqcMF+WjVwrvRj8DU4
5oprhxx2XG/qPnq16dmyobmf5tSdRICRupS1/LZF/PUGsYVGuHXCB+Y8aCtQc+Yx
qoNSc/l+A/45OBUabQPqwddjjfXZfDpHY4w4PcUCmGi+Ifda6eIc01EN7hVqO5tq
llcKc7CKJbJx8yxJhFSklw3HnneY6eaCbOkTM40tB2z5Nw4xAM+vgvXcVJGB8uzg
B/sJwDzSRMimZyYX0kcTAKGMV4FPMl2wIpKX2QIDAQABAoIBAEgptQXf5K2O1vAa
DT1mLdb+4cILQBAY21QZK3dVENqahtzTcePgVvKGhWdBQ2XG/ETissN+Yz7Fp6VO
+0DuzCAPQNx+18CdWPWGHrsVjDeq00HY2kvVQwYt26Q3PlxoIPeNpoPQOMCXxwqt
aXWsWafS/XUQHYMJdkCSYisCHQ+hLaDAsgW9A1hs4WEfIvA20zl23EW5aCX7P1LT
prHlIczjz3EVAGqRr7Bki8tpbdJEMpGveHo6M5pjolxH7B8v+hfR8el7vs6e0tjV
mvifKbxF3sJeZC2K2HFkdsS5/NkiCzhVSkbrBvHLvCM3YjdG6e562QtVOFz5TXAv
+g/FMRMCgYEA2t7J0BPzyZX3eV5eGXDfT6OnJUZD2vBNHQDl9RiOuZxmSNLVyCNC
swI4I0n+OjzYYddYU2wm+HVZ5qeLmuBAZQvCjKmlJdZDhffuc/w8esKiXokjDcws
7MOZAqxEK14Ngq2vt+Rw8bWV6tABopp5k6cymNy8eZe8u6y2362KA9sCgYEA1H1f
qCgU8eS6I7PJPSnIO9LvUDQIf7UdKUhqMRakL79w3aqa8i8CNAMZHsDKC6KgBucp
A6/XyxrwGTg9cbhbBGsUB+nkPaFiCazbaEj0M791j+S9yV+SHm408BmzE7zstud/
XLfraUGclYpjGTsXldc9GHu360x0Uq6/h3zLe1sCgYEAx57c2A/qkJhb3vFHx9Jf
iiZL4z5D0yLKYkKYecONIRLZY2AQJXqrcdL7Wow49+rYu9wJrgR9Qqzdcvaq6HXR
pZdlOJ/dhTX33e80J8sNajWsm6ZeN05aRxNascpmXlto3SAGnSUYMgwZENHoO+LC
Mf4TssHYkNnpBA7RuA5yS3MCgYAgSjkKDaU5KP/cQwrWn43NAX3aWz3bYkNfLaDt
erpSgy38kVtgaCJWkw3zLWrGn9zfj6sc41DQjXRk8LXtnQ0/u6Hcnf9QGkESpVDm
JQfvAS41QpZQjpReyXKD9fPPkQsLtFwXU9+TLCRGWTQ79k3cOEwRd2N4fzLCCcoT
JbSqNwKBgQCnVub3w18EOJ11OWJY6bobfWuAG5pK3hE29/hAqwu3itbjqKOYxuJM
i+rVfsYlJbUyhqT5aejqY8pe0pbAJ5fhI5pIuGJQS6M0il/HrxYZ0Cy0DBqnMm+E
Kw8AAEEWRz8EF7E7ib2uTNckZ3atswF19Ho8Lqabryv0LB9+zrAUDQ==
-----END RSA PRIVATE KEY-----
";
    const RSA_PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQC1q6+xTH0Arb/h
9RuBPF4VD7eNn1gSEGMsjqVNZI7X6n94UL44M+lFymUZh8SOATXD7zhQxFmjIMaE
C6EQJI2TonMfXz0MVmpwwX5aNXCu9GPwNTjmimuHHHZcb+o+erXp2bKhuZ/m1J1E
gJG6lLX8tkX89QaxhUa4dcIH5jxoK1Bz5jGqg1Jz+X4D/jk4FRptA+rB12ON9dl8
OkdjjDg9xQKYaL4h91rp4hzTUQ3uFWo7m2qWVwpzsIolsnHzLEmEVKSXDceed5jp
5oJs6RMzjS0HbPk3DjEAz6+C9dxUkYHy7OAH+wnAPNJEyKZnJhfSRxMAoYxXgU8y
XbAikpfZAgMBAAECggEASCm1Bd/krY7W8BoNPWYt1v7hwgtAEBjbVBkrd1UQ2pqG
3NNx4+BW8oaFZ0FDZcb8ROKyw35jPsWnpU77QO7MIA9A3H7XwJ1Y9YYeuxWMN6rT
QdjaS9VDBi3bpDc+XGgg942mg9A4wJfHCq1pdaxZp9L9dRAdgwl2QJJiKwIdD6Et
oMCyBb0DWGzhYR8i8DbTOXbcRbloJfs/UtOmseUhzOPPcRUAapGvsGSLy2lt0kQy
ka94ejozmmOiXEfsHy/6F9Hx6Xu+zp7S2NWa+J8pvEXewl5kLYrYcWR2xLn82SIL
OFVKRusG8cu8IzdiN0bp7nrZC1U4XPlNcC/6D8UxEwKBgQDa3snQE/PJlfd5Xl4Z
cN9Po6clRkPa8E0dAOX1GI65nGZI0tXII0KzAjgjSf46PNhh11hTbCb4dVnmp4ua
4EBlC8KMqaUl1kOF9+5z/Dx6wqJeiSMNzCzsw5kCrEQrXg2Cra+35HDxtZXq0AGi
mnmTpzKY3Lx5l7y7rLbfrYoD2wKBgQDUfV+oKBTx5Lojs8k9Kcg70u9QNAh/tR0p
SGoxFqQvv3DdqpryLwI0AxkewMoLoqAG5ykDr9fLGvAZOD1xuFsEaxQH6eQ9oWIJ
rNtoSPQzv3WP5L3JX5IebjTwGbMTvOy2539ct+tpQZyVimMZOxeV1z0Ye7frTHRS
rr+HfMt7WwKBgQDHntzYD+qQmFve8UfH0l+KJkvjPkPTIspiQph5w40hEtljYBAl
eqtx0vtajDj36ti73AmuBH1CrN1y9qroddGll2U4n92FNffd7zQnyw1qNaybpl43
TlpHE1qxymZeW2jdIAadJRgyDBkQ0eg74sIx/hOywdiQ2ekEDtG4DnJLcwKBgCBK
OQoNpTko/9xDCtafjc0BfdpbPdtiQ18toO16ulKDLfyRW2BoIlaTDfMtasaf3N+P
qxzjUNCNdGTwte2dDT+7odyd/1AaQRKlUOYlB+8BLjVCllCOlF7JcoP188+RCwu0
XBdT35MsJEZZNDv2Tdw4TBF3Y3h/MsIJyhMltKo3AoGBAKdW5vfDXwQ4nXU5Yljp
uht9a4AbmkreETb3+ECrC7eK1uOoo5jG4kyL6tV+xiUltTKGpPlp6Opjyl7SlsAn
l+Ejmki4YlBLozSKX8evFhnQLLQMGqcyb4QrDwAAQRZHPwQXsTuJva5M1yRndq2z
AXX0ejwuppuvK/QsH37OsBQN
-----END PRIVATE KEY-----
";
    const EC_SEC1: &str = "-----BEGIN EC PRIVATE KEY-----
MHcCAQEEII7ooZ7WHSK+wvhh6MSHZdxvlxR4yMsDF9cv3oJQs8GioAoGCCqGSM49
AwEHoUQDQgAE/Fvw7xxmAlhXVPOQG0IlBNVZtsNcnUykBVsgvlhgutUhWfHW9hnw
opkVWyNkuEIHzqeFnyWw6iDMQPQ0fe9kTw==
-----END EC PRIVATE KEY-----
";
    const EC_PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgjuihntYdIr7C+GHo
xIdl3G+XFHjIywMX1y/eglCzwaKhRANCAAT8W/DvHGYCWFdU85AbQiUE1Vm2w1yd
TKQFWyC+WGC61SFZ8db2GfCimRVbI2S4QgfOp4WfJbDqIMxA9DR972RP
-----END PRIVATE KEY-----
";

    /// A self-signed certificate for the PKCS#8 key `key_pem`.
    fn cert_for(key_pem: &str) -> String {
        let key = KeyPair::from_pem(key_pem).expect("test key parses");
        CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("self-signed")
            .pem()
    }

    fn generated() -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("self-signed");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn accepts_pkcs8_pkcs1_and_sec1_keys() {
        let rsa_cert = cert_for(RSA_PKCS8);
        let ec_cert = cert_for(EC_PKCS8);
        for (cert, key, what) in [
            (&rsa_cert, RSA_PKCS8, "RSA PKCS#8"),
            (&rsa_cert, RSA_PKCS1, "RSA PKCS#1"),
            (&ec_cert, EC_PKCS8, "EC PKCS#8"),
            (&ec_cert, EC_SEC1, "EC SEC1"),
        ] {
            let config = server_config(cert.as_bytes(), key.as_bytes())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                config.alpn_protocols,
                vec![b"h2".to_vec(), b"http/1.1".to_vec()],
                "{what}"
            );
        }
    }

    #[test]
    fn a_chain_is_accepted_and_the_key_matched_against_its_first_certificate() {
        let (leaf, key) = generated();
        let (other, _) = generated();
        let chain = format!("{leaf}{other}");
        server_config(chain.as_bytes(), key.as_bytes()).expect("leaf first");
        let reversed = format!("{other}{leaf}");
        let err = server_config(reversed.as_bytes(), key.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
    }

    #[test]
    fn a_key_that_does_not_match_is_refused_naming_both_files() {
        let (cert, _) = generated();
        let (_, other_key) = generated();
        let err = build(
            cert.as_bytes(),
            other_key.as_bytes(),
            Path::new("/certs/tls.crt"),
            Path::new("/certs/tls.key"),
        )
        .unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("/certs/tls.key does not match"),
            "{message}"
        );
        assert!(message.contains("/certs/tls.crt"), "{message}");
    }

    #[test]
    fn missing_certificate_or_key_is_named_with_a_hint() {
        let (cert, key) = generated();
        let (crt, tls_key) = (Path::new("/s/tls.crt"), Path::new("/s/tls.key"));

        let err = build(b"", key.as_bytes(), crt, tls_key).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
        assert!(
            err.to_string().starts_with("/s/tls.crt: no certificate"),
            "{err}"
        );
        assert!(err.to_string().contains("empty"), "{err}");

        // The two files swapped.
        let err = build(key.as_bytes(), cert.as_bytes(), crt, tls_key).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
        assert!(err.to_string().contains("swapped"), "{err}");

        let err = build(cert.as_bytes(), cert.as_bytes(), crt, tls_key).unwrap_err();
        assert!(matches!(err, TlsError::NoKey { .. }), "{err}");
        assert!(
            err.to_string().starts_with("/s/tls.key: no private key"),
            "{err}"
        );
        assert!(err.to_string().contains("swapped"), "{err}");
    }

    #[test]
    fn encrypted_truncated_and_garbage_inputs_are_explained() {
        let (cert, key) = generated();

        let encrypted =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let err = server_config(cert.as_bytes(), encrypted.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::EncryptedKey { .. }), "{err}");

        // Half-written: the end marker never arrived.
        let truncated = &cert[..cert.len() / 2];
        let err = server_config(truncated.as_bytes(), key.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::Pem { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("<certificate PEM>: malformed PEM"),
            "{err}"
        );

        let garbage = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";
        let err = server_config(garbage.as_bytes(), key.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::InvalidCertificate { .. }), "{err}");

        let bad_key = "-----BEGIN PRIVATE KEY-----\naGVsbG8=\n-----END PRIVATE KEY-----\n";
        let err = server_config(cert.as_bytes(), bad_key.as_bytes()).unwrap_err();
        assert!(matches!(err, TlsError::InvalidKey { .. }), "{err}");
    }

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
        let config = load(&cert, &key).await.expect("load");
        let mut reloader = Reloader {
            config: config.clone(),
            cert: cert.clone(),
            key: key.clone(),
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
        let err = load(missing, Path::new("/nonexistent/quorumguard/tls.key"))
            .await
            .unwrap_err();
        assert!(matches!(err, TlsError::Read { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("cannot read /nonexistent/quorumguard/tls.crt"),
            "{err}"
        );
    }

    /// A self-signed pair valid from `not_before` to `not_after` (Unix seconds).
    fn valid_between(not_before: i64, not_after: i64) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.not_before =
            rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_before as u64);
        params.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_after as u64);
        let cert = params.self_signed(&key).expect("self-signed");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn validity_is_read_from_the_leaf_and_judged_against_now() {
        const NOW: i64 = 1_796_256_000; // 2026-12-03T00:00:00Z
        const DAY: i64 = 86_400;
        let (leaf, _) = valid_between(NOW - DAY, NOW + 90 * DAY);
        let (other, _) = valid_between(NOW - 10 * DAY, NOW - 5 * DAY);
        let chain = format!("{leaf}{other}");
        let v = Validity::of_pem(chain.as_bytes(), Path::new("tls.crt")).expect("parses");
        assert_eq!(
            (v.not_before, v.not_after),
            (NOW - DAY, NOW + 90 * DAY),
            "the leaf's"
        );
        assert_eq!(v.problem(NOW), None);
        assert_eq!(v.problem(v.not_after - 8 * DAY), None);
        assert_eq!(
            v.problem(v.not_after - 6 * DAY),
            Some(ValidityProblem::ExpiresSoon)
        );
        assert_eq!(v.problem(v.not_after), Some(ValidityProblem::ExpiresSoon));
        assert_eq!(v.problem(v.not_after + 1), Some(ValidityProblem::Expired));
        assert_eq!(
            v.problem(v.not_before - 1),
            Some(ValidityProblem::NotYetValid)
        );

        let path = Path::new("/tls/tls.crt");
        let expired = v.describe(ValidityProblem::Expired, path, v.not_after + DAY);
        for part in [
            "/tls/tls.crt expired at 2027-03-03T00:00:00Z (now 2027-03-04T00:00:00Z)",
            "failurePolicy Fail",
            "quorumguard certs",
            "describe certificate quorumguard-webhook",
        ] {
            assert!(expired.contains(part), "{part:?} in {expired}");
        }
        let early = v.describe(ValidityProblem::NotYetValid, path, NOW - 2 * DAY);
        assert!(
            early.contains("not valid before 2026-12-02T00:00:00Z"),
            "{early}"
        );
        assert!(early.contains("clock"), "{early}");
        let soon = v.describe(ValidityProblem::ExpiresSoon, path, v.not_after - DAY);
        assert!(soon.contains("in less than 7 days"), "{soon}");

        let err = Validity::of_pem(b"", Path::new("tls.crt")).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let err = Validity::of_pem(garbage.as_bytes(), Path::new("tls.crt")).unwrap_err();
        assert!(matches!(err, TlsError::X509 { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("tls.crt: the serving certificate is not valid X.509")
        );
    }

    type Report = (Validity, Option<ValidityProblem>);

    async fn next_report(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Report>) -> Report {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a report within 5 s")
            .expect("the watch is running")
    }

    #[tokio::test]
    async fn the_validity_watch_reports_once_per_change_and_ignores_a_rejected_pair() {
        let dir = std::env::temp_dir().join(format!("qg-validity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let now = crate::certs::unix_secs(std::time::SystemTime::now());
        let (expired, expired_key) = valid_between(now - 10 * 86_400, now - 86_400);
        std::fs::write(&cert, &expired).expect("write");
        std::fs::write(&key, &expired_key).expect("write");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let watch = spawn_validity_watch(
            cert.clone(),
            key.clone(),
            MIN_RELOAD_INTERVAL,
            move |v, p| {
                let _ = tx.send((*v, p));
            },
        );
        let (v, p) = next_report(&mut rx).await;
        assert_eq!(
            (v.not_after, p),
            (now - 86_400, Some(ValidityProblem::Expired))
        );
        // A renewed certificate with the old key: rejected by the reloader, so not judged.
        let (renewed, renewed_key) = valid_between(now - 86_400, now + 90 * 86_400);
        std::fs::write(&cert, &renewed).expect("write");
        tokio::time::sleep(MIN_RELOAD_INTERVAL * 10).await;
        assert!(
            rx.try_recv().is_err(),
            "a pair that does not build is not reported"
        );
        std::fs::write(&key, &renewed_key).expect("write");
        let (v, p) = next_report(&mut rx).await;
        assert_eq!((v.not_after, p), (now + 90 * 86_400, None));
        tokio::time::sleep(MIN_RELOAD_INTERVAL * 10).await;
        assert!(rx.try_recv().is_err(), "no change, no report");
        watch.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
