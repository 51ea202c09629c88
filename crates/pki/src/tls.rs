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
//!
//! The parts: `config` builds the server configuration from PEM ([`server_config`]); `reload`
//! reads the pair from its files and keeps the served configuration current ([`load`],
//! [`spawn_reloader`]); `validity` reads and judges the serving certificate's validity period and
//! watches it while it is served ([`Validity`], [`spawn_validity_watch`]). The constants and
//! [`TlsError`] are here.

mod client_auth;
mod config;
mod reload;
mod validity;

use std::{path::PathBuf, time::Duration};

pub use client_auth::{ClientAuth, ClientCertRefused, refusal};
pub use config::server_config;
pub use reload::{load, spawn_reloader};
pub use validity::{EXPIRY_WARNING, Validity, ValidityProblem, spawn_validity_watch};

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
    /// The client CA file (`--client-ca-file`) holds a certificate that cannot be a trust anchor,
    /// or none rustls can build a verifier from.
    #[error(
        "{}: cannot verify client certificates with it: {detail} (expected the PEM CA \
         certificate that issued kube-apiserver's client certificate)",
        path.display()
    )]
    ClientCa { path: PathBuf, detail: String },
    /// rustls refused the configuration itself (should not happen with the ring provider).
    #[error("cannot build the TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

impl TlsError {
    /// The file the error is about, `None` when it is about no one file (a key that does not
    /// match its certificate is about both).
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            TlsError::Read { path, .. }
            | TlsError::Pem { path, .. }
            | TlsError::NoCertificate { path, .. }
            | TlsError::NoKey { path, .. }
            | TlsError::EncryptedKey { path }
            | TlsError::InvalidKey { path, .. }
            | TlsError::InvalidCertificate { path, .. }
            | TlsError::X509 { path, .. }
            | TlsError::ClientCa { path, .. } => Some(path),
            TlsError::KeyMismatch { .. } | TlsError::Config(_) => None,
        }
    }
}

/// What the children's tests share: a freshly generated self-signed pair.
#[cfg(test)]
mod fixtures {
    use rcgen::{CertificateParams, KeyPair};

    pub(super) fn generated() -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("self-signed");
        (cert.pem(), key.serialize_pem())
    }
}
