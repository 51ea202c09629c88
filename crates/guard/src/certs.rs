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
        "the CA expires at {ca}, before the serving certificate would ({leaf}): use a shorter \
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

pub(crate) fn check_days(days: u32) -> Result<(), CertError> {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use std::path::{Path, PathBuf};
    use std::time::{SystemTime, UNIX_EPOCH};

    /// 2026-08-01T00:00:00Z.
    pub(crate) const NOW: i64 = 1_785_542_400;
    pub(crate) const DAY: i64 = SECS_PER_DAY;

    /// Asserts that `$result` is an error matching `$pattern`, and returns it.
    macro_rules! refused {
        ($result:expr, $pattern:pat $(if $guard:expr)?) => {{
            let err = $result.unwrap_err();
            assert!(matches!(err, $pattern $(if $guard)?), "{err}");
            err
        }};
    }

    /// What the tests check of a certificate, read with x509-parser.
    #[derive(Debug)]
    pub(crate) struct Facts {
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
    pub(crate) fn facts(pem: &str) -> Facts {
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
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> Self {
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

    /// Runs `openssl <args>` (split at spaces) in `dir`: whether it succeeded, and its output.
    fn openssl(dir: &Path, args: &str) -> (bool, String) {
        let out = std::process::Command::new("openssl")
            .args(args.split(' '))
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("the openssl command is needed (apt-get install openssl)");
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text.into_owned())
    }

    fn self_signed(params: &mut CertificateParams, key: &KeyPair) -> String {
        set_validity(params, NOW - DAY, NOW + 1000 * DAY);
        params.self_signed(key).unwrap().pem()
    }

    fn ca_params(key_usages: Vec<KeyUsagePurpose>) -> CertificateParams {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = key_usages;
        params
    }

    #[test]
    fn a_new_ca_and_its_serving_certificates_have_exact_validity_and_usages() {
        let ca = Ca::generate(NOW).unwrap();
        let ca_facts = facts(ca.cert_pem());
        assert_eq!(ca_facts.ca, Some(true));
        assert_eq!(ca_facts.key_cert_sign, Some(true));
        assert_eq!(ca_facts.not_before, NOW - BACKDATE_SECS);
        assert_eq!(ca_facts.not_after, NOW + 3650 * DAY);
        assert_eq!(ca_facts.issuer, ca_facts.subject, "self-signed");
        assert_eq!(ca.not_after(), NOW + 3650 * DAY);

        let names = ["a.b.svc".to_string(), "10.0.0.7".to_string()];
        let leaf = ca.issue("a.b.svc", &names, 365, NOW).unwrap();
        let leaf_facts = facts(&leaf.cert_pem);
        assert_eq!(leaf_facts.ca, Some(false));
        assert_eq!(leaf_facts.key_cert_sign, Some(false));
        assert_eq!(leaf_facts.eku, Some((true, false)), "serverAuth only");
        assert_eq!(leaf_facts.not_before, NOW - BACKDATE_SECS);
        assert_eq!(leaf_facts.not_after, NOW + 365 * DAY);
        assert_eq!(leaf.not_after, NOW + 365 * DAY);
        assert_eq!(leaf_facts.issuer, ca_facts.subject);
        assert_eq!(leaf_facts.cn, "a.b.svc");
        assert_ne!(leaf_facts.public_key, ca_facts.public_key);
        // Both keys are PKCS#8 and usable.
        let key = |pem: &str| KeyPair::from_pem(pem).unwrap().der_bytes().to_vec();
        assert_eq!(key(ca.key_pem()), ca_facts.public_key);
        assert_eq!(key(&leaf.key_pem), leaf_facts.public_key);
    }

    #[test]
    fn a_foreign_ca_subject_with_other_string_types_is_reproduced_exactly() {
        use rcgen::DnValue::{Ia5String, PrintableString};
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = ca_params(vec![KeyUsagePurpose::KeyCertSign]);
        let dn = &mut params.distinguished_name;
        *dn = DistinguishedName::new();
        dn.push(
            DnType::CountryName,
            PrintableString("DE".try_into().unwrap()),
        );
        dn.push(DnType::OrganizationName, "Kräftig GmbH");
        let email = DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]);
        dn.push(email, Ia5String("ops@example.com".try_into().unwrap()));
        dn.push(DnType::CommonName, "Platform CA");
        let cert = self_signed(&mut params, &key);
        let ca = Ca::from_pem(&cert, &key.serialize_pem()).unwrap();
        let leaf = ca.issue("a.b.svc", &["a.b.svc".to_string()], 30, NOW);
        assert_eq!(facts(&leaf.unwrap().cert_pem).issuer, facts(&cert).subject);
        let client = ca.sign_client("x", Duration::from_secs(60), NOW).unwrap();
        assert_eq!(facts(&client.cert_pem).issuer, facts(&cert).subject);
    }

    #[test]
    fn a_ca_without_key_usage_or_with_an_empty_key_id_is_still_usable() {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = ca_params(vec![]);
        params.key_identifier_method = rcgen::KeyIdMethod::PreSpecified(vec![]);
        let ca = Ca::from_pem(&self_signed(&mut params, &key), &key.serialize_pem()).unwrap();
        ca.issue("x", &["x".to_string()], 30, NOW).unwrap();
    }

    #[test]
    fn a_wrong_or_unusable_ca_is_refused_with_the_reason() {
        let (a, b) = (Ca::generate(NOW).unwrap(), Ca::generate(NOW).unwrap());
        let (a_cert, a_key) = (a.cert_pem(), a.key_pem());
        refused!(Ca::from_pem(a_cert, b.key_pem()), CertError::CaKeyMismatch);

        // A serving certificate is not a CA, nor is a self-signed certificate without
        // basicConstraints; a CA whose keyUsage lacks keyCertSign may not sign certificates.
        let leaf = a.issue("x", &["x".to_string()], 30, NOW).unwrap();
        refused!(
            Ca::from_pem(&leaf.cert_pem, &leaf.key_pem),
            CertError::NotCa(_)
        );
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut plain = CertificateParams::new(vec!["x".to_string()]).unwrap();
        let plain = self_signed(&mut plain, &key);
        refused!(
            Ca::from_pem(&plain, &key.serialize_pem()),
            CertError::NotCa("missing")
        );
        let signer = self_signed(
            &mut ca_params(vec![KeyUsagePurpose::DigitalSignature]),
            &key,
        );
        refused!(
            Ca::from_pem(&signer, &key.serialize_pem()),
            CertError::NotCertSigner
        );

        // Expired, not yet valid, or expiring before the serving certificate.
        let names = ["x".to_string()];
        let expired = a.issue("x", &names, 1, NOW + 3651 * DAY);
        refused!(expired, CertError::CaValidity(ref m) if m.contains("expired"));
        let early = a.issue("x", &names, 1, NOW - 2 * DAY);
        refused!(early, CertError::CaValidity(ref m) if m.contains("before"));
        let err = refused!(
            a.issue("x", &names, 365, NOW + 3600 * DAY),
            CertError::CaExpiresFirst { .. }
        );
        assert!(err.to_string().contains("--days"), "{err}");

        // Encrypted, broken or missing keys.
        for label in ["EC PRIVATE KEY", "RSA PRIVATE KEY", "ENCRYPTED PRIVATE KEY"] {
            let key = format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
            refused!(Ca::from_pem(a_cert, &key), CertError::CaKey(_));
        }
        for key in ["garbage", a_cert] {
            refused!(Ca::from_pem(a_cert, key), CertError::CaKey(_));
        }

        // Not a certificate at all, or a broken one.
        refused!(Ca::from_pem(a_key, a_key), CertError::CaCertPem(_));
        let mut der = CertificateDer::from_pem_slice(a_cert.as_bytes())
            .unwrap()
            .to_vec();
        der.truncate(der.len() / 2);
        let truncated = certificate_pem(&der).unwrap();
        refused!(Ca::from_pem(&truncated, a_key), CertError::CaCertDer(_));
    }

    #[test]
    fn the_ca_pem_is_cleaned_of_surrounding_text() {
        let a = Ca::generate(NOW).unwrap();
        let noisy = format!("Certificate:\n  Data: ...\n{}{}", a.cert_pem(), a.key_pem());
        let ca = Ca::from_pem(&noisy, a.key_pem()).unwrap();
        assert_eq!(ca.cert_pem(), a.cert_pem());
    }

    #[test]
    fn a_broken_clock_is_refused() {
        let ca = Ca::generate(NOW).unwrap();
        for now in [0, MIN_NOW - 1, MAX_NOW + 1] {
            refused!(Ca::generate(now), CertError::Clock(n) if n == now);
            refused!(ca.issue("x", &[], 1, now), CertError::Clock(n) if n == now);
            let client = ca.sign_client("x", Duration::from_secs(60), now);
            refused!(client, CertError::Clock(n) if n == now);
        }
    }

    #[test]
    fn a_client_certificate_is_for_client_auth_and_verifies() {
        let ca = Ca::generate(NOW).unwrap();
        let week = Duration::from_secs(7 * 86_400);
        let client = ca.sign_client("quorumguard", week, NOW).unwrap();
        let c = facts(&client.cert_pem);
        assert_eq!(c.cn, "quorumguard");
        assert_eq!(c.issuer, facts(ca.cert_pem()).subject);
        assert_eq!((c.ca, c.eku), (Some(false), Some((false, true))));
        assert_eq!(
            (c.not_before, c.not_after),
            (NOW - CLIENT_BACKDATE_SECS, NOW + 7 * DAY)
        );
        assert_eq!(
            (client.not_before, client.not_after),
            (c.not_before, c.not_after)
        );
        let key = KeyPair::from_pem(&client.key_pem).unwrap();
        assert_eq!(key.der_bytes(), c.public_key);

        let tmp = TempDir::new("client");
        std::fs::create_dir_all(&tmp.0).unwrap();
        std::fs::write(tmp.0.join("ca.crt"), ca.cert_pem()).unwrap();
        std::fs::write(tmp.0.join("client.crt"), &client.cert_pem).unwrap();
        let verify = |purpose| {
            let args = format!("verify -attime {NOW} -CAfile ca.crt -purpose {purpose} client.crt");
            openssl(&tmp.0, &args)
        };
        let (ok, out) = verify("sslclient");
        assert!(ok && out.contains("client.crt: OK"), "{out}");
        assert!(!verify("sslserver").0, "not a serving certificate");

        // Never valid past the CA; refused once the CA has expired; the name is checked.
        let long = ca.sign_client("x", Duration::MAX, NOW).unwrap();
        assert_eq!(long.not_after, ca.not_after());
        refused!(
            ca.sign_client("x", week, ca.not_after()),
            CertError::CaValidity(_)
        );
        for cn in ["", &"n".repeat(65), "a\nb"] {
            refused!(ca.sign_client(cn, week, NOW), CertError::InvalidName { .. });
        }
    }

    /// The etcd prober's case: a CA made elsewhere, its key in any of the usual formats
    /// (Cluster API writes PKCS#1 RSA).
    #[test]
    fn client_certificates_verify_with_openssl_cas_of_every_key_format() {
        let tmp = TempDir::new("openssl-ca");
        std::fs::create_dir_all(&tmp.0).unwrap();
        let no_key_ids = " -addext subjectKeyIdentifier=none -addext authorityKeyIdentifier=none";
        for keygen in [
            "genrsa -traditional -out pkcs1.key 2048",
            "ecparam -name prime256v1 -genkey -noout -out sec1.key",
            "genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-384 -out p384.key",
            "genpkey -algorithm ed25519 -out ed25519.key",
            "genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out noskid.key",
        ] {
            let name = keygen
                .split(' ')
                .find_map(|w| w.strip_suffix(".key"))
                .unwrap();
            let extra = if name == "noskid" { no_key_ids } else { "" };
            let ok = |(ok, out): (bool, String)| assert!(ok, "{name}: {out}");
            ok(openssl(&tmp.0, keygen));
            let req = format!(
                "req -x509 -key {name}.key -days 9 -subj /C=DE/O=Example/CN=etcd-ca \
                 -addext basicConstraints=critical,CA:TRUE -out {name}.crt{extra}"
            );
            ok(openssl(&tmp.0, &req));
            let read = |ext: &str| std::fs::read_to_string(tmp.0.join(format!("{name}.{ext}")));
            let (cert_pem, key_pem) = (read("crt").unwrap(), read("key").unwrap());
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs();

            let ca = Ca::from_pem(&cert_pem, &key_pem).unwrap();
            let client = ca.sign_client("quorumguard", Duration::from_secs(60), now as i64);
            std::fs::write(tmp.0.join("client.crt"), client.unwrap().cert_pem).unwrap();
            let verify = format!("verify -purpose sslclient -CAfile {name}.crt client.crt");
            let (ok, out) = openssl(&tmp.0, &verify);
            assert!(ok && out.contains("client.crt: OK"), "{name}: {out}");
        }
    }

    /// rcgen keeps one value per attribute type and one attribute per RDN: such a subject
    /// cannot be reproduced as an issuer name, which is found out before anything is issued.
    #[test]
    fn a_subject_that_cannot_be_reproduced_is_refused() {
        let tmp = TempDir::new("subjects");
        std::fs::create_dir_all(&tmp.0).unwrap();
        for (name, subject) in [("repeated", "/O=A/O=B/CN=x"), ("multi", "/O=A+CN=x")] {
            let req = format!(
                "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout {name}.key \
                 -days 9 -multivalue-rdn -subj {subject} -out {name}.crt \
                 -addext basicConstraints=critical,CA:TRUE"
            );
            let (ok, out) = openssl(&tmp.0, &req);
            assert!(ok, "{out}");
            let read = |ext: &str| std::fs::read_to_string(tmp.0.join(format!("{name}.{ext}")));
            let ca = Ca::from_pem(&read("crt").unwrap(), &read("key").unwrap());
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let client = ca.and_then(|ca| ca.sign_client("x", Duration::from_secs(60), now as i64));
            refused!(client, CertError::CaSubject(_));
        }
    }

    #[test]
    fn ca_bundle_is_kubernetes_base64_of_the_pem() {
        let ca = Ca::generate(NOW).unwrap();
        let b64 = ca_bundle(ca.cert_pem()).unwrap();
        assert!(!b64.contains('\n'));
        let decoded: ByteString = serde_json::from_value(Value::String(b64)).unwrap();
        assert_eq!(decoded.0, ca.cert_pem().as_bytes());
        assert_eq!(ca_bundle("hi\n").unwrap(), "aGkK");
    }

    #[test]
    fn debug_output_never_shows_a_key() {
        let ca = Ca::generate(NOW).unwrap();
        let leaf = ca.issue("x", &["x".to_string()], 1, NOW).unwrap();
        let client = ca.sign_client("x", Duration::from_secs(60), NOW).unwrap();
        for shown in [format!("{ca:?}"), format!("{leaf:?} {client:?}")] {
            assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        }
    }

    #[test]
    fn times_are_rfc_3339_in_utc() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_time(NOW), "2026-08-01T00:00:00Z");
        assert_eq!(format_time(4_102_444_799), "2099-12-31T23:59:59Z");
        assert_eq!(format_time(-1), "1969-12-31T23:59:59Z");
        assert!(format_time(i64::MAX).ends_with("(Unix seconds)"));
    }

    #[test]
    fn a_ca_can_be_shared_between_tasks() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Ca>();
    }
}
