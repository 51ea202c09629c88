//! Helpers the certificate tests of this crate and of others (`quorumguard-cli`'s `certs`
//! command) share: a fixed clock, what a certificate says, a temporary directory. Compiled for
//! this crate's tests and with the `testkit` feature (a dev-dependency of the crates above).

use std::path::PathBuf;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use x509_parser::parse_x509_certificate;

use super::SECS_PER_DAY;

/// 2026-08-01T00:00:00Z.
pub const NOW: i64 = 1_785_542_400;
pub const DAY: i64 = SECS_PER_DAY;

/// What the tests check of a certificate, read with x509-parser.
#[derive(Debug)]
pub struct Facts {
    pub issuer: Vec<u8>,
    pub subject: Vec<u8>,
    pub cn: String,
    pub ca: Option<bool>,
    pub key_cert_sign: Option<bool>,
    /// (serverAuth, clientAuth).
    pub eku: Option<(bool, bool)>,
    pub not_before: i64,
    pub not_after: i64,
    pub public_key: Vec<u8>,
}

/// The first certificate in `pem`.
pub fn facts(pem: &str) -> Facts {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM certificate");
    let (_, c) = parse_x509_certificate(&der).expect("X.509 certificate");
    let cn = c.subject().iter_common_name().next().map(|cn| cn.as_str());
    let eku = c.extended_key_usage().unwrap();
    Facts {
        issuer: c.issuer().as_raw().to_vec(),
        subject: c.subject().as_raw().to_vec(),
        cn: cn.and_then(Result::ok).unwrap_or_default().to_string(),
        ca: c.basic_constraints().unwrap().map(|b| b.value.ca),
        key_cert_sign: c.key_usage().unwrap().map(|k| k.value.key_cert_sign()),
        eku: eku.map(|e| (e.value.server_auth, e.value.client_auth)),
        not_before: c.validity().not_before.timestamp(),
        not_after: c.validity().not_after.timestamp(),
        public_key: c.public_key().subject_public_key.data.to_vec(),
    }
}

/// A fresh directory under the system temp dir, removed by the guard.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("quorumguard-certs-unit-{tag}-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
