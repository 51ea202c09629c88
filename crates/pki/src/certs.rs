//! The certificate authority behind quorumguard's certificates. A CA made here, or given as PEM,
//! issues the webhook's serving certificate (`quorumguard certs`, in `cli::certs`, on clusters
//! without cert-manager) and the etcd prober's client certificate (signed with a workload
//! cluster's etcd CA, from the Secret `<cluster>-etcd`).
//!
//! Nothing here does I/O: the clock comes in as `now` (Unix seconds), so tests check validity
//! periods exactly; only key generation draws on the system's randomness.
//!
//! A CA, new or given, is always loaded from PEM the same way ([`Ca::from_pem`]): x509-parser
//! reads what it is judged by (basic constraints, key usage, validity, public key), rcgen's
//! [`Issuer::from_ca_cert_der`] takes its subject and key identifier, and rustls' ring provider
//! reads its key (PKCS#8, PKCS#1 RSA as Cluster API writes it, or SEC1 EC). A verifier finds a
//! certificate's issuer by comparing names byte for byte, so every certificate issued is checked
//! to name exactly the CA's subject as its issuer.

use std::time::Duration;

use k8s_openapi::ByteString;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_ED25519,
    PKCS_RSA_SHA256, PublicKeyData, SignatureAlgorithm, SigningKey,
};
use rustls::SignatureScheme as S;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use thiserror::Error;
use x509_parser::prelude::{
    ASN1Time, FromDer, ParsedExtension, SubjectPublicKeyInfo, X509Error, parse_x509_certificate,
};

/// Validity of a new CA: ten years, so renewing the serving certificate never needs a new
/// caBundle.
pub const CA_DAYS: u32 = 3650;
/// The longest serving certificate: no longer than a new CA.
pub const MAX_DAYS: u32 = CA_DAYS;
/// Serving certificates and new CAs start this long before `now`, for clocks that are a little
/// behind ours.
pub const BACKDATE_SECS: i64 = 3600;
/// Client certificates start this long before `now`, for servers whose clock is a little behind.
pub const CLIENT_BACKDATE_SECS: i64 = 300;

/// The subject of a CA made here.
pub const CA_COMMON_NAME: &str = "quorumguard webhook CA";
pub const ORGANIZATION: &str = "quorumguard";

const SECS_PER_DAY: i64 = 86_400;
/// Earliest and latest `now` accepted: a clock outside is broken, and the arithmetic below
/// stays far from any overflow.
const MIN_NOW: i64 = 946_684_800; // 2000-01-01T00:00:00Z
const MAX_NOW: i64 = 32_503_680_000; // 3000-01-01T00:00:00Z

/// Every message says what is wrong and, where there is one, what to do.
#[derive(Debug, Error)]
pub enum CertError {
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        what: &'static str,
        name: String,
        reason: String,
    },
    #[error("--days must be between 1 and {MAX_DAYS}, got {0}")]
    InvalidDays(u32),
    #[error("the clock says {0} (Unix seconds): refusing to date certificates by it")]
    Clock(i64),
    #[error("cannot {what}: {source}")]
    Rcgen {
        what: &'static str,
        source: rcgen::Error,
    },
    #[error("CA certificate: not a PEM certificate: {0}")]
    CaCertPem(String),
    #[error("CA certificate: cannot read its DER: {0}")]
    CaCertDer(String),
    #[error("CA certificate: not a CA (basicConstraints {0})")]
    NotCa(&'static str),
    #[error("CA certificate: its keyUsage does not allow signing certificates (keyCertSign)")]
    NotCertSigner,
    #[error("CA certificate: {0}")]
    CaSubject(String),
    #[error("CA certificate: {0}")]
    CaValidity(String),
    #[error("CA key: {0}")]
    CaKey(String),
    #[error("CA key does not belong to the CA certificate (their public keys differ)")]
    CaKeyMismatch,
    #[error(
        "the CA expires at {ca}, before the certificate would ({leaf}): use a shorter \
         --days or a new CA"
    )]
    CaExpiresFirst { ca: String, leaf: String },
    #[error("cannot encode the caBundle: {0}")]
    Encode(String),
}

fn rcgen_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |source| CertError::Rcgen { what, source }
}

/// A client certificate's common name: what X.509 allows (1 to 64 bytes), printable.
fn check_common_name(name: &str) -> Result<(), CertError> {
    let reason = if name.is_empty() || name.len() > 64 {
        "must be 1 to 64 bytes long"
    } else if name.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(CertError::InvalidName {
        what: "common name",
        name: name.to_string(),
        reason: reason.to_string(),
    })
}

/// Refuses a validity outside `1..=MAX_DAYS` days (the `certs` command checks its `--days` with it
/// before it writes anything).
pub fn check_days(days: u32) -> Result<(), CertError> {
    let ok = (1..=MAX_DAYS).contains(&days);
    ok.then_some(()).ok_or(CertError::InvalidDays(days))
}

fn check_now(now: i64) -> Result<(), CertError> {
    let ok = (MIN_NOW..=MAX_NOW).contains(&now);
    ok.then_some(()).ok_or(CertError::Clock(now))
}

/// A CA able to sign serving and client certificates: its PEM, its key, and what signing needs
/// of it. Loaded once, it signs any number of certificates.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    /// The subject Name as encoded (tag, length, content): every issued certificate's issuer.
    subject: Vec<u8>,
    not_before: i64,
    not_after: i64,
    /// Whether the CA has a (non-empty) subject key identifier for issued certificates to name
    /// as their authority key identifier; without one they name none.
    has_key_id: bool,
    issuer: Issuer<'static, CaKey>,
}

impl std::fmt::Debug for Ca {
    /// Leaves the key out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("not_before", &format_time(self.not_before))
            .field("not_after", &format_time(self.not_after))
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// A new CA: ECDSA P-256, valid [`CA_DAYS`] from `now` (less [`BACKDATE_SECS`]), allowed to
    /// sign end-entity certificates only (path length 0).
    pub fn generate(now: i64) -> Result<Self, CertError> {
        check_now(now)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(rcgen_err("generate the CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(Some(ORGANIZATION), CA_COMMON_NAME);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let not_after = now + i64::from(CA_DAYS) * SECS_PER_DAY;
        set_validity(&mut params, now - BACKDATE_SECS, not_after);
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_err("sign the CA certificate"))?;
        // Through the same loader as a given CA, so that path is the one always exercised.
        Self::from_pem(&cert.pem(), &key.serialize_pem())
    }

    /// Loads a CA from its certificate (the first `CERTIFICATE` block; text and other blocks
    /// around it are ignored) and its unencrypted key: PKCS#8 (`PRIVATE KEY`: RSA, ECDSA
    /// P-256/P-384 or Ed25519), PKCS#1 RSA (`RSA PRIVATE KEY`, as Cluster API writes the etcd CA
    /// key) or SEC1 EC (`EC PRIVATE KEY`). Refuses a certificate that is not a CA (basic
    /// constraints), whose key usage forbids signing certificates, or a key that is not its key.
    /// Validity is checked when signing.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| CertError::CaCertPem(pem_problem("`-----BEGIN CERTIFICATE-----`", &e)))?;
        let (_, cert) =
            parse_x509_certificate(&der).map_err(|e| CertError::CaCertDer(e.to_string()))?;
        let bad = |e: X509Error| CertError::CaCertDer(e.to_string());
        match cert.basic_constraints().map_err(bad)? {
            None => return Err(CertError::NotCa("missing")),
            Some(bc) if !bc.value.ca => return Err(CertError::NotCa("cA is false")),
            Some(_) => {}
        }
        let key_usage = cert.key_usage().map_err(bad)?;
        if key_usage.is_some_and(|ku| !ku.value.key_cert_sign()) {
            return Err(CertError::NotCertSigner);
        }
        let key = CaKey::from_pem(key_pem)?;
        if key.public_key != cert.public_key().subject_public_key.data.as_ref() {
            return Err(CertError::CaKeyMismatch);
        }
        // An empty identifier identifies nothing: then issued certificates name none.
        let has_key_id = cert.iter_extensions().any(|ext| {
            matches!(ext.parsed_extension(), ParsedExtension::SubjectKeyIdentifier(id) if !id.0.is_empty())
        });
        let issuer = Issuer::from_ca_cert_der(&der, key).map_err(|e| {
            CertError::CaSubject(format!(
                "its subject name is not supported ({e}): it may have a multi-valued RDN or an \
                 unusual string type; use a CA with a plain subject"
            ))
        })?;
        Ok(Self {
            cert_pem: certificate_pem(&der)?,
            key_pem: key_pem.to_string(),
            subject: cert.subject().as_raw().to_vec(),
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            has_key_id,
            issuer,
        })
    }

    /// The CA certificate (PEM, this certificate only).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key, as given.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// When the CA expires (Unix seconds).
    pub fn not_after(&self) -> i64 {
        self.not_after
    }

    /// A serving certificate for `names` (DNS names or IP addresses) with the subject
    /// `O=quorumguard, CN=<common_name>`, valid `days` from `now` (less [`BACKDATE_SECS`]), with
    /// a new ECDSA P-256 key. Refused if the CA would expire first.
    pub fn issue(
        &self,
        common_name: &str,
        names: &[String],
        days: u32,
        now: i64,
    ) -> Result<IssuedCert, CertError> {
        check_days(days)?;
        self.check_valid_at(now)?;
        let not_after = now + i64::from(days) * SECS_PER_DAY;
        if not_after > self.not_after {
            return Err(CertError::CaExpiresFirst {
                ca: format_time(self.not_after),
                leaf: format_time(not_after),
            });
        }
        let mut params = CertificateParams::new(names.to_vec())
            .map_err(rcgen_err("use the names as subject alternative names"))?;
        params.distinguished_name = name(Some(ORGANIZATION), common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, now - BACKDATE_SECS, not_after)
    }

    /// A client certificate (extended key usage clientAuth only) with the subject
    /// `CN=<common_name>` and a new ECDSA P-256 key, valid from [`CLIENT_BACKDATE_SECS`] before
    /// `now` (Unix seconds) for `validity`, cut short at the CA's own expiry. Refused if the CA
    /// is not valid at `now`.
    pub fn sign_client(
        &self,
        common_name: &str,
        validity: Duration,
        now: i64,
    ) -> Result<IssuedCert, CertError> {
        check_common_name(common_name)?;
        self.check_valid_at(now)?;
        let validity = i64::try_from(validity.as_secs()).unwrap_or(i64::MAX);
        let not_after = now.saturating_add(validity).min(self.not_after);
        let mut params = CertificateParams::default();
        params.distinguished_name = name(None, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, now - CLIENT_BACKDATE_SECS, not_after)
    }

    fn check_valid_at(&self, now: i64) -> Result<(), CertError> {
        check_now(now)?;
        if now < self.not_before {
            let when = format_time(self.not_before);
            return Err(CertError::CaValidity(format!("not valid before {when}")));
        }
        if now >= self.not_after {
            let when = format_time(self.not_after);
            return Err(CertError::CaValidity(format!("expired at {when}")));
        }
        Ok(())
    }

    /// Signs an end-entity certificate for a new ECDSA P-256 key.
    fn sign(
        &self,
        mut params: CertificateParams,
        not_before: i64,
        not_after: i64,
    ) -> Result<IssuedCert, CertError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(rcgen_err("generate a certificate key"))?;
        params.is_ca = IsCa::ExplicitNoCa;
        // ECDSA keys sign the handshake; they never encipher keys.
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = self.has_key_id;
        set_validity(&mut params, not_before, not_after);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rcgen_err("sign the certificate"))?;
        // rcgen writes the issuer name from the parsed subject; a verifier matches it byte for
        // byte, so make sure it came out exactly the same.
        let (_, issued) =
            parse_x509_certificate(cert.der()).map_err(|e| CertError::CaCertDer(e.to_string()))?;
        if issued.issuer().as_raw() != self.subject {
            return Err(CertError::CaSubject(
                "its subject name cannot be reproduced exactly (unusual string types or \
                 attribute order): use a CA with a plain subject, or let quorumguard make one"
                    .to_string(),
            ));
        }
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_before,
            not_after,
        })
    }
}

/// A certificate issued by a [`Ca`], and its new key.
#[derive(Clone)]
pub struct IssuedCert {
    /// This certificate only (PEM).
    pub cert_pem: String,
    /// Its new ECDSA P-256 key (PKCS#8 PEM).
    pub key_pem: String,
    /// Unix seconds.
    pub not_before: i64,
    /// Unix seconds.
    pub not_after: i64,
}

impl std::fmt::Debug for IssuedCert {
    /// Leaves the key out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("not_before", &format_time(self.not_before))
            .field("not_after", &format_time(self.not_after))
            .finish_non_exhaustive()
    }
}

/// A CA's key as rcgen's signer. rcgen on ring reads PKCS#8 keys only; rustls' ring provider
/// also reads PKCS#1 RSA and SEC1 EC keys.
struct CaKey {
    signer: Box<dyn rustls::sign::Signer>,
    /// The subjectPublicKey bits (for EC the point, for RSA the PKCS#1 public key).
    public_key: Vec<u8>,
    alg: &'static SignatureAlgorithm,
}

/// The signature scheme used for each kind of CA key, in rustls' and rcgen's terms.
static SCHEMES: [(S, &SignatureAlgorithm); 4] = [
    (S::ECDSA_NISTP256_SHA256, &PKCS_ECDSA_P256_SHA256),
    (S::ECDSA_NISTP384_SHA384, &PKCS_ECDSA_P384_SHA384),
    (S::ED25519, &PKCS_ED25519),
    (S::RSA_PKCS1_SHA256, &PKCS_RSA_SHA256),
];

impl CaKey {
    fn from_pem(pem: &str) -> Result<Self, CertError> {
        if pem.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
            return Err(CertError::CaKey("it is encrypted".to_string()));
        }
        let der = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| {
            CertError::CaKey(pem_problem(
                "`PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`",
                &e,
            ))
        })?;
        let unusable = |why: String| {
            CertError::CaKey(format!(
                "not a usable RSA (2048 bits or more), ECDSA P-256/P-384 or Ed25519 key: {why}"
            ))
        };
        let key = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| unusable(e.to_string()))?;
        let (signer, alg) = SCHEMES
            .iter()
            .find_map(|&(scheme, alg)| Some((key.choose_scheme(&[scheme])?, alg)))
            .ok_or_else(|| unusable(format!("{:?} is not supported", key.algorithm())))?;
        let spki = key
            .public_key()
            .ok_or_else(|| unusable("no public key".to_string()))?;
        let (_, spki) =
            SubjectPublicKeyInfo::from_der(&spki).map_err(|e| unusable(e.to_string()))?;
        Ok(Self {
            signer,
            public_key: spki.subject_public_key.data.to_vec(),
            alg,
        })
    }
}

impl PublicKeyData for CaKey {
    fn der_bytes(&self) -> &[u8] {
        &self.public_key
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.alg
    }
}

impl SigningKey for CaKey {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        self.signer
            .sign(msg)
            .map_err(|_| rcgen::Error::RemoteKeyError)
    }
}

fn pem_problem(missing: &str, e: &pem::Error) -> String {
    match e {
        pem::Error::NoItemsFound => format!("no {missing} block"),
        other => other.to_string(),
    }
}

/// `O=<organization>, CN=<common_name>`, or just the CN.
fn name(organization: Option<&str>, common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

/// The `caBundle` of a webhook's clientConfig: base64 of the PEM, exactly as Kubernetes
/// encodes the bytes field.
pub fn ca_bundle(ca_cert_pem: &str) -> Result<String, CertError> {
    base64(ca_cert_pem.as_bytes())
}

/// Standard base64 with padding, through k8s-openapi's `ByteString` (Kubernetes' `[]byte`).
fn base64(bytes: &[u8]) -> Result<String, CertError> {
    match serde_json::to_value(ByteString(bytes.to_vec())) {
        Ok(Value::String(s)) => Ok(s),
        Ok(other) => Err(CertError::Encode(format!("unexpected value {other}"))),
        Err(e) => Err(CertError::Encode(e.to_string())),
    }
}

/// Unix seconds, negative before 1970 (which [`Ca::sign_client`] refuses as a broken clock).
pub fn unix_secs(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// RFC 3339, UTC, seconds; Unix seconds where that is out of range.
pub fn format_time(unix: i64) -> String {
    match ASN1Time::from_timestamp(unix) {
        Ok(t) => {
            let t = t.to_datetime();
            format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second()
            )
        }
        Err(_) => format!("{unix} (Unix seconds)"),
    }
}

/// Sets the validity period from Unix seconds. Callers keep both within a few thousand years
/// of [`MIN_NOW`], so the additions cannot overflow rcgen's date type.
fn set_validity(params: &mut CertificateParams, not_before: i64, not_after: i64) {
    let unix = |secs: i64| Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + unix(not_before);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + unix(not_after);
}

/// The CA as a single clean PEM block: drops other blocks and text around it (a key, the
/// `openssl x509 -text` dump), so `ca.crt` and the caBundle hold exactly the CA certificate.
fn certificate_pem(der: &[u8]) -> Result<String, CertError> {
    let b64 = base64(der)?;
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    Ok(out)
}

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
#[cfg(test)]
mod tests;
