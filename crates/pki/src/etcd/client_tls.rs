//! The TLS material for one workload cluster's etcd ([`ClientTls`]): checked before any
//! connection, and built once into the rustls configuration every connection to its members
//! shares.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use thiserror::Error;

use crate::etcd::{self as certs, CertError};

/// How many TLS sessions a cluster's client configuration remembers for resumption: enough for
/// its members (a redial after a restart), far fewer than rustls' default of 256, whose cache
/// alone is 14 KiB per configuration.
const TLS_SESSIONS: usize = 8;

/// TLS material for etcd's client port: the CA that signed the serving certificates, and a
/// client certificate that CA accepts (etcd runs with `--client-cert-auth`).
///
/// Holds the rustls configuration built from it, once: every connection of the cluster (and
/// every clone) shares it, instead of parsing the PEM and building a configuration per member.
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: String,
    cert_pem: String,
    config: Arc<ClientConfig>,
}

impl fmt::Debug for ClientTls {
    /// Leaves the key out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

/// Why TLS material is unusable. Checked before any connection, so a bad Secret is reported as
/// such and not as a connection failure.
#[derive(Debug, Error)]
pub enum ClientTlsError {
    #[error("{what}: {problem}")]
    Pem { what: &'static str, problem: String },
    #[error(transparent)]
    Sign(#[from] CertError),
    #[error("etcd TLS material: {0} (does the client key belong to the client certificate?)")]
    Config(rustls::Error),
}

impl ClientTls {
    /// From PEM: the CA certificate(s) to verify etcd's serving certificate with, and the client
    /// certificate and its key.
    pub fn new(
        ca_pem: impl Into<String>,
        cert_pem: impl Into<String>,
        key_pem: impl Into<String>,
    ) -> Result<Self, ClientTlsError> {
        let (ca_pem, cert_pem, key_pem) = (ca_pem.into(), cert_pem.into(), key_pem.into());
        let pem = |what: &'static str| {
            move |e: rustls::pki_types::pem::Error| ClientTlsError::Pem {
                what,
                problem: match e {
                    rustls::pki_types::pem::Error::NoItemsFound => "no PEM block".to_string(),
                    other => format!("bad PEM: {other:?}"),
                },
            }
        };
        let cas = CertificateDer::pem_slice_iter(ca_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem("etcd CA certificate"))?;
        if cas.is_empty() {
            return Err(pem("etcd CA certificate")(
                rustls::pki_types::pem::Error::NoItemsFound,
            ));
        }
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem("etcd client certificate"))?;
        if certs.is_empty() {
            return Err(pem("etcd client certificate")(
                rustls::pki_types::pem::Error::NoItemsFound,
            ));
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(pem("etcd client key"))?;
        let mut roots = RootCertStore::empty();
        let (_, unusable) = roots.add_parsable_certificates(cas);
        if roots.is_empty() {
            return Err(ClientTlsError::Pem {
                what: "etcd CA certificate",
                problem: format!("none of its {unusable} certificate(s) can be used as a CA"),
            });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(ClientTlsError::Config)?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(ClientTlsError::Config)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS);
        Ok(ClientTls {
            ca_pem,
            cert_pem,
            config: Arc::new(config),
        })
    }

    /// From the etcd CA (Secret `<cluster>-etcd`): a new client certificate signed with it (see
    /// [`certs::sign_client_cert`]), trusting the same CA for the serving certificates.
    pub fn from_etcd_ca(
        ca_cert_pem: &str,
        ca_key_pem: &str,
        now: SystemTime,
    ) -> Result<Self, ClientTlsError> {
        let cert =
            certs::sign_client_cert(ca_cert_pem, ca_key_pem, certs::CLIENT_COMMON_NAME, now)?;
        Self::new(ca_cert_pem, cert.cert_pem, cert.key_pem)
    }

    /// The CA certificate(s), PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The client certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The rustls configuration every connection with this material uses.
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_material_is_checked_before_connecting() {
        let err = ClientTls::new("", "x", "y").unwrap_err();
        assert_eq!(err.to_string(), "etcd CA certificate: no PEM block");
    }
}
