//! Verifying kube-apiserver's client certificate (opt-in): the chain against a CA file with
//! rustls' own [`WebPkiClientVerifier`], then the certificate's name against the names allowed.
//!
//! Without it, anything that can open a TCP connection to the webhook port can send a review.
//! With it, a handshake without a certificate, or with one that does not chain to the CA, is out
//! of its validity period, or names no allowed subject, fails: the connection gets a TLS alert
//! and no HTTP answer, so no review is read, judged, counted or recorded. Each refusal is logged
//! once by the listener ([`refusal`]), naming the certificate's subject (never a key: the server
//! never holds the client's).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error, OtherError, RootCertStore,
    SignatureScheme,
    client::danger::HandshakeSignatureValid,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, UnixTime},
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};

use super::TlsError;
use super::config::parse_chain;

/// Which client certificates the webhook port accepts: those that chain to a CA in `ca_file`
/// (PEM, one or more `CERTIFICATE` blocks; re-read with the serving pair) and whose subject
/// common name or one of whose DNS subject alternative names is exactly one of `names`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientAuth {
    pub ca_file: PathBuf,
    pub names: Vec<String>,
}

/// Why a presented client certificate was refused: carried inside the rustls error from the
/// verifier to the listener, which logs it with the peer's address.
#[derive(Debug, thiserror::Error)]
#[error("client certificate {subject} refused: {reason}")]
pub struct ClientCertRefused {
    /// The end-entity certificate's subject, with its DNS names (`CN=x (DNS: a, b)`).
    pub subject: String,
    /// What is wrong, and what to do about it.
    pub reason: String,
}

/// The verifier for `auth`, from the CA file's contents `ca_pem`.
pub(super) fn verifier(
    ca_pem: &[u8],
    auth: &ClientAuth,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let path = auth.ca_file.as_path();
    let mut roots = RootCertStore::empty();
    for ca in parse_chain(ca_pem, path)? {
        roots.add(ca).map_err(|source| TlsError::ClientCa {
            path: path.to_owned(),
            detail: source.to_string(),
        })?;
    }
    let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|source| TlsError::ClientCa {
            path: path.to_owned(),
            detail: source.to_string(),
        })?;
    Ok(Arc::new(NamedClients {
        inner,
        names: auth.names.clone(),
        ca_file: auth.ca_file.clone(),
    }))
}

/// rustls' WebPKI client verifier, then a check of the certificate's names.
struct NamedClients {
    inner: Arc<dyn ClientCertVerifier>,
    names: Vec<String>,
    ca_file: PathBuf,
}

impl fmt::Debug for NamedClients {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedClients")
            .field("ca_file", &self.ca_file)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl ClientCertVerifier for NamedClients {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let names = Names::of(end_entity);
        let refuse = |reason: String| {
            Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
                ClientCertRefused {
                    subject: names.to_string(),
                    reason,
                },
            ))))
        };
        if let Err(error) = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
        {
            return Err(refuse(format!(
                "{} (verified against the CA in {}, with {} intermediate certificate(s) \
                 presented; issue kube-apiserver's client certificate from that CA, for client \
                 authentication, and check its validity period)",
                describe(&error),
                self.ca_file.display(),
                intermediates.len()
            )));
        }
        if names.matches(&self.names) {
            return Ok(ClientCertVerified::assertion());
        }
        Err(refuse(format!(
            "it chains to the CA in {} but names none of the allowed clients ({}): add its \
             common name with --client-name, or issue kube-apiserver's certificate for one of them",
            self.ca_file.display(),
            self.names.join(", ")
        )))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The names a client certificate carries: its subject, the subject's common names and its DNS
/// subject alternative names.
struct Names {
    subject: String,
    common: Vec<String>,
    dns: Vec<String>,
}

impl Names {
    fn of(cert: &CertificateDer<'_>) -> Names {
        let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
            return Names {
                subject: "<not valid X.509>".to_owned(),
                common: Vec::new(),
                dns: Vec::new(),
            };
        };
        let common = parsed
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
            .collect();
        let dns = parsed
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|name| match name {
                        x509_parser::extensions::GeneralName::DNSName(dns) => {
                            Some((*dns).to_owned())
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Names {
            subject: format!("\"{}\"", parsed.subject()),
            common,
            dns,
        }
    }

    /// Exactly equal, byte for byte, to one of `allowed`.
    fn matches(&self, allowed: &[String]) -> bool {
        self.common
            .iter()
            .chain(&self.dns)
            .any(|name| allowed.iter().any(|a| a == name))
    }
}

impl fmt::Display for Names {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.subject)?;
        if !self.dns.is_empty() {
            write!(f, " (DNS names {})", self.dns.join(", "))?;
        }
        Ok(())
    }
}

/// A verification error in words.
fn describe(error: &Error) -> String {
    match error {
        Error::InvalidCertificate(CertificateError::ExpiredContext { time, not_after }) => {
            format!(
                "expired at {} (now {})",
                crate::certs::format_time(secs(not_after)),
                crate::certs::format_time(secs(time))
            )
        }
        Error::InvalidCertificate(CertificateError::NotValidYetContext { time, not_before }) => {
            format!(
                "not valid before {} (now {})",
                crate::certs::format_time(secs(not_before)),
                crate::certs::format_time(secs(time))
            )
        }
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "not issued by a trusted CA".to_owned()
        }
        Error::InvalidCertificate(CertificateError::BadSignature) => {
            "its signature does not verify with the trusted CA of its issuer's name (a look-alike \
             CA, or a CA that was replaced)"
                .to_owned()
        }
        Error::InvalidCertificate(CertificateError::Other(other))
            if other.0.to_string().contains("MaximumPathDepthExceeded") =>
        {
            "its chain is longer than the 6 intermediate certificates a verifier accepts".to_owned()
        }
        other => other.to_string(),
    }
}

fn secs(time: &UnixTime) -> i64 {
    i64::try_from(time.as_secs()).unwrap_or(i64::MAX)
}

/// The refusal inside a failed handshake's error, if it was a client certificate's: the
/// listener logs it. `None` for handshake failures of other kinds.
pub fn refusal(error: &std::io::Error) -> Option<String> {
    let rustls_error = error.get_ref()?.downcast_ref::<Error>()?;
    match rustls_error {
        Error::NoCertificatesPresented => Some(
            "no client certificate presented: the webhook port requires kube-apiserver's client \
             certificate (--client-ca-file); give kube-apiserver an AdmissionConfiguration whose \
             kubeConfigFile presents it for this webhook"
                .to_owned(),
        ),
        Error::InvalidCertificate(CertificateError::Other(other)) => other
            .0
            .downcast_ref::<ClientCertRefused>()
            .map(ToString::to_string),
        _ => None,
    }
}
