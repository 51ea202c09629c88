//! A client certificate for a workload cluster's etcd, signed with that cluster's etcd CA (the
//! Secret `<cluster>-etcd`, keys `tls.crt`/`tls.key`), as KCP does for its own etcd client.
//!
//! Why sign our own instead of reusing one: etcd runs with `--client-cert-auth`, so any
//! certificate the etcd CA signed with the clientAuth usage is accepted, and a short-lived one
//! of our own leaks nothing of KCP's or the API server's identity.
//!
//! The signing is [`crate::certs::Ca`]'s: it loads Cluster API's CA key (PKCS#1 RSA) as well as
//! PKCS#8 and SEC1 keys, and checks that every certificate it issues names the CA's subject as
//! its issuer byte for byte, as etcd (Go's `crypto/x509`) matches it — Cluster API's subjects
//! are PrintableStrings. This module adds etcd's defaults and names the part of the Secret at
//! fault.
//!
//! `client_tls`: the TLS material for one cluster's etcd ([`ClientTls`]), checked before any
//! connection and built once into the rustls configuration every connection shares.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;

use crate::certs::{self, Ca};

mod client_tls;

pub use client_tls::{ClientTls, ClientTlsError};

/// The common name of quorumguard's etcd client certificates. etcd uses it as the user name
/// only when etcd auth is enabled, which kubeadm does not do.
pub const CLIENT_COMMON_NAME: &str = "quorumguard";
/// How long a client certificate is valid: short, as it is re-signed whenever the prober
/// starts, and capped at the CA's own expiry.
pub const CLIENT_CERT_VALIDITY: Duration = Duration::from_secs(365 * 86_400);
/// Certificates start this long before `now`, for etcd hosts whose clock is a little behind.
pub const CLIENT_CERT_BACKDATE: Duration =
    Duration::from_secs(certs::CLIENT_BACKDATE_SECS.unsigned_abs());

/// Why no client certificate could be signed: [`certs::CertError`], its message prefixed with
/// the key of the Secret at fault (`tls.crt` or `tls.key`) where there is one.
#[derive(Debug, Error)]
#[error("{}{}", secret_key(.0), .0)]
pub struct CertError(pub certs::CertError);

impl From<certs::CertError> for CertError {
    fn from(e: certs::CertError) -> Self {
        Self(e)
    }
}

/// `"tls.crt: "`, `"tls.key: "` or nothing.
fn secret_key(e: &certs::CertError) -> &'static str {
    use certs::CertError::*;
    match e {
        CaCertPem(_) | CaCertDer(_) | NotCa(_) | NotCertSigner | CaSubject(_) | CaValidity(_) => {
            "tls.crt: "
        }
        CaKey(_) | CaKeyMismatch => "tls.key: ",
        _ => "",
    }
}

/// A client certificate and its new key.
#[derive(Clone)]
pub struct ClientCert {
    /// This certificate only (PEM).
    pub cert_pem: String,
    /// The new ECDSA P-256 key (PKCS#8 PEM).
    pub key_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl fmt::Debug for ClientCert {
    /// Leaves the key out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCert")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Signs a client certificate (ECDSA P-256, clientAuth, subject `CN=<common_name>`) with the etcd
/// CA given as PEM, valid from `now` − [`CLIENT_CERT_BACKDATE`] for [`CLIENT_CERT_VALIDITY`],
/// but never past the CA's own expiry. See [`Ca::from_pem`] and [`Ca::sign_client`] for the
/// keys accepted and the CAs refused.
pub fn sign_client_cert(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    common_name: &str,
    now: SystemTime,
) -> Result<ClientCert, CertError> {
    let issued = Ca::from_pem(ca_cert_pem, ca_key_pem)?.sign_client(
        common_name,
        CLIENT_CERT_VALIDITY,
        crate::certs::unix_secs(now),
    )?;
    Ok(ClientCert {
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem,
        not_before: system_time(issued.not_before),
        not_after: system_time(issued.not_after),
    })
}

/// [`Ca`] issues nothing dated before 2000, so the clamp at 1970 never applies.
fn system_time(unix: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(u64::try_from(unix).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use rcgen::string::PrintableString;
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue, IsCa, KeyPair,
        KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
    };
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, UnixTime};
    use rustls::server::WebPkiClientVerifier;
    use rustls::{CertificateError, RootCertStore};

    use crate::certs::CertError as E;
    use crate::certs::testkit::facts;

    const CAPI_CA_CRT: &str = include_str!("testdata/capi-etcd-ca.crt");
    const CAPI_CA_KEY: &str = include_str!("testdata/capi-etcd-ca.key");
    const SEC1_CA_CRT: &str = include_str!("testdata/sec1-ec-ca.crt");
    const SEC1_CA_KEY: &str = include_str!("testdata/sec1-ec-ca.key");

    /// 2027-06-01T00:00:00Z: inside the validity of the test CAs (2026-12-02 + 100 years).
    const NOW: u64 = 1_811_808_000;
    const DAY: u64 = 86_400;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// Verifies `cert` as a TLS client certificate against `ca` at `now`, with webpki (which,
    /// like Go, matches the issuer name byte for byte and checks the clientAuth usage).
    fn verify(ca_pem: &str, cert_pem: &str, now: u64) -> Result<(), rustls::Error> {
        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        verifier
            .verify_client_cert(
                &leaf,
                &[],
                UnixTime::since_unix_epoch(Duration::from_secs(now)),
            )
            .map(|_| ())
    }

    fn set_validity(params: &mut CertificateParams, not_before: u64, not_after: u64) {
        params.not_before = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_before);
        params.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_after);
    }

    fn rcgen_ca(dn: DistinguishedName) -> (String, String) {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, NOW - DAY, NOW + 3650 * DAY);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn cn(name: &str) -> DistinguishedName {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        dn
    }

    #[test]
    fn signs_with_a_cluster_api_shaped_ca_rsa_pkcs1_and_printable_string_subject() {
        assert!(CAPI_CA_KEY.contains("BEGIN RSA PRIVATE KEY"));
        let ca = facts(CAPI_CA_CRT);
        let printable_cn = [&[0x13, 0x07][..], b"etcd-ca"].concat();
        assert!(
            ca.subject.windows(9).any(|w| w == printable_cn),
            "the test CA's subject is CN=etcd-ca as a PrintableString"
        );
        let cert = sign_client_cert(CAPI_CA_CRT, CAPI_CA_KEY, CLIENT_COMMON_NAME, at(NOW)).unwrap();
        verify(CAPI_CA_CRT, &cert.cert_pem, NOW).unwrap();
        let leaf = facts(&cert.cert_pem);
        assert_eq!(
            leaf.issuer, ca.subject,
            "issuer must be the CA subject, byte for byte"
        );
        assert_eq!(leaf.ca, Some(false));
        assert_eq!(leaf.eku, Some((false, true)), "clientAuth only");
        assert_eq!(leaf.cn, CLIENT_COMMON_NAME);
        assert!(cert.key_pem.contains("BEGIN PRIVATE KEY"));
        // The key is a usable P-256 key.
        let key = KeyPair::from_pem(&cert.key_pem).unwrap();
        assert_eq!(key.algorithm(), &PKCS_ECDSA_P256_SHA256);
        assert_eq!(key.public_key_raw(), leaf.public_key);
    }

    #[test]
    fn signs_with_a_sec1_ec_ca_with_a_utf8_two_attribute_subject() {
        assert!(SEC1_CA_KEY.contains("BEGIN EC PRIVATE KEY"));
        let cert = sign_client_cert(SEC1_CA_CRT, SEC1_CA_KEY, "probe", at(NOW)).unwrap();
        verify(SEC1_CA_CRT, &cert.cert_pem, NOW).unwrap();
    }

    #[test]
    fn signs_with_a_pkcs8_ca_and_rcgen_subjects_of_either_string_type() {
        let (crt, key) = rcgen_ca(cn("plain CA"));
        let cert = sign_client_cert(&crt, &key, CLIENT_COMMON_NAME, at(NOW)).unwrap();
        verify(&crt, &cert.cert_pem, NOW).unwrap();

        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "k8s");
        dn.push(
            DnType::CommonName,
            DnValue::PrintableString(PrintableString::try_from("etcd-ca").unwrap()),
        );
        let (crt, key) = rcgen_ca(dn);
        let cert = sign_client_cert(&crt, &key, CLIENT_COMMON_NAME, at(NOW)).unwrap();
        verify(&crt, &cert.cert_pem, NOW).unwrap();
    }

    #[test]
    fn validity_is_backdated_one_year_and_capped_at_the_ca_expiry() {
        assert_eq!(CLIENT_CERT_BACKDATE, Duration::from_secs(300));
        let cert = sign_client_cert(CAPI_CA_CRT, CAPI_CA_KEY, CLIENT_COMMON_NAME, at(NOW)).unwrap();
        assert_eq!(cert.not_before, at(NOW - 300));
        assert_eq!(cert.not_after, at(NOW + 365 * DAY));
        let leaf = facts(&cert.cert_pem);
        assert_eq!(
            (leaf.not_before, leaf.not_after),
            (NOW as i64 - 300, (NOW + 365 * DAY) as i64)
        );
        // Valid just after signing on a host whose clock is 4 minutes behind; not after a year.
        verify(CAPI_CA_CRT, &cert.cert_pem, NOW - 240).unwrap();
        assert!(matches!(
            verify(CAPI_CA_CRT, &cert.cert_pem, NOW + 366 * DAY),
            Err(rustls::Error::InvalidCertificate(CertificateError::Expired))
                | Err(rustls::Error::InvalidCertificate(
                    CertificateError::ExpiredContext { .. }
                ))
        ));

        // A CA with 10 days left: the client certificate ends with it.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = cn("short CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        set_validity(&mut params, NOW - DAY, NOW + 10 * DAY);
        let crt = params.self_signed(&key).unwrap().pem();
        let cert = sign_client_cert(&crt, &key.serialize_pem(), "x", at(NOW)).unwrap();
        assert_eq!(cert.not_after, at(NOW + 10 * DAY));
    }

    #[test]
    fn a_certificate_from_another_ca_does_not_verify() {
        let (other, other_key) = rcgen_ca(cn("etcd-ca"));
        let cert = sign_client_cert(&other, &other_key, CLIENT_COMMON_NAME, at(NOW)).unwrap();
        assert!(verify(CAPI_CA_CRT, &cert.cert_pem, NOW).is_err());
    }

    #[test]
    fn refuses_expired_or_future_cas_and_broken_clocks() {
        let (crt, key) = rcgen_ca(cn("ca"));
        let err = sign_client_cert(&crt, &key, "x", at(NOW + 3651 * DAY)).unwrap_err();
        assert!(matches!(err.0, E::CaValidity(_)), "{err}");
        assert!(err.to_string().contains("expired"), "{err}");
        let err = sign_client_cert(&crt, &key, "x", at(NOW - 2 * DAY)).unwrap_err();
        assert!(err.to_string().contains("not valid before"), "{err}");
        assert!(err.to_string().starts_with("tls.crt: "), "{err}");
        sign_client_cert(&crt, &key, "x", at(NOW - DAY)).unwrap();
        let err = sign_client_cert(&crt, &key, "x", UNIX_EPOCH - Duration::from_secs(1));
        assert!(matches!(err, Err(CertError(E::Clock(-1)))), "{err:?}");
    }

    #[test]
    fn refuses_a_key_that_is_not_the_cas() {
        let err = sign_client_cert(CAPI_CA_CRT, SEC1_CA_KEY, "x", at(NOW)).unwrap_err();
        assert!(matches!(err.0, E::CaKeyMismatch), "{err}");
        assert!(err.to_string().contains("tls.key"), "{err}");
    }

    #[test]
    fn refuses_a_leaf_certificate_as_ca() {
        let leaf = sign_client_cert(CAPI_CA_CRT, CAPI_CA_KEY, "x", at(NOW)).unwrap();
        let err = sign_client_cert(&leaf.cert_pem, &leaf.key_pem, "x", at(NOW)).unwrap_err();
        assert!(matches!(err.0, E::NotCa("cA is false")), "{err}");

        // No basicConstraints at all.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = cn("not a CA");
        set_validity(&mut params, NOW - DAY, NOW + DAY);
        let crt = params.self_signed(&key).unwrap().pem();
        let err = sign_client_cert(&crt, &key.serialize_pem(), "x", at(NOW)).unwrap_err();
        assert!(matches!(err.0, E::NotCa("missing")), "{err}");
    }

    #[test]
    fn refuses_a_ca_without_key_cert_sign() {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = cn("ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        set_validity(&mut params, NOW - DAY, NOW + DAY);
        let crt = params.self_signed(&key).unwrap().pem();
        let err = sign_client_cert(&crt, &key.serialize_pem(), "x", at(NOW)).unwrap_err();
        assert!(matches!(err.0, E::NotCertSigner), "{err}");
    }

    #[test]
    fn refuses_bad_pem_and_names_the_part() {
        let err = sign_client_cert("", CAPI_CA_KEY, "x", at(NOW)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tls.crt: CA certificate: not a PEM certificate: \
             no `-----BEGIN CERTIFICATE-----` block"
        );
        let err = sign_client_cert(CAPI_CA_CRT, CAPI_CA_CRT, "x", at(NOW)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tls.key: CA key: no `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY` block"
        );
        let encrypted =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let err = sign_client_cert(CAPI_CA_CRT, encrypted, "x", at(NOW)).unwrap_err();
        assert_eq!(err.to_string(), "tls.key: CA key: it is encrypted");
        let garbage = "-----BEGIN CERTIFICATE-----\nMAMCAQA=\n-----END CERTIFICATE-----\n";
        let err = sign_client_cert(garbage, CAPI_CA_KEY, "x", at(NOW)).unwrap_err();
        assert!(matches!(err.0, E::CaCertDer(_)), "{err}");
        assert!(err.to_string().starts_with("tls.crt: "), "{err}");
    }

    #[test]
    fn refuses_bad_common_names() {
        for name in ["", "a\nb", &"x".repeat(65)] {
            let err = sign_client_cert(CAPI_CA_CRT, CAPI_CA_KEY, name, at(NOW)).unwrap_err();
            assert!(matches!(err.0, E::InvalidName { .. }), "{err}");
            assert!(err.to_string().starts_with("invalid common name"), "{err}");
        }
    }
}
