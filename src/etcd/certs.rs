//! A client certificate for a workload cluster's etcd, signed with that cluster's etcd CA (the
//! Secret `<cluster>-etcd`, keys `tls.crt`/`tls.key`), as KCP does for its own etcd client.
//!
//! Why sign our own instead of reusing one: etcd runs with `--client-cert-auth`, so any
//! certificate the etcd CA signed with the clientAuth usage is accepted, and a short-lived one
//! of our own leaks nothing of KCP's or the API server's identity.
//!
//! [`sign_client_cert`] is pure apart from drawing a new key from the system's randomness: the
//! clock comes in as `now`, nothing is read or written.
//!
//! A verifier (Go's `crypto/x509` in etcd, webpki in rustls) finds the issuer of a certificate by
//! comparing its issuer name with the CA's subject *byte for byte*. Cluster API writes the CA
//! with Go, whose names use PrintableString, while rcgen writes UTF8String by default. So the
//! CA's subject is read from its DER with a minimal reader (rcgen can only do that with its
//! `x509-parser` feature, which is not enabled here), re-encoded with the same string types, and
//! every certificate issued is checked to carry exactly the CA's subject as its issuer.
//!
//! Cluster API writes the CA key as PKCS#1 (`RSA PRIVATE KEY`); rcgen on the `ring` provider only
//! loads PKCS#8, so PKCS#1 RSA and SEC1 EC keys are wrapped into PKCS#8 first.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::string::{BmpString, Ia5String, PrintableString, TeletexString, UniversalString};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyIdMethod, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// The common name of quorumguard's etcd client certificates. etcd uses it as the user name
/// only when etcd auth is enabled, which kubeadm does not do.
pub const CLIENT_COMMON_NAME: &str = "quorumguard";
/// How long a client certificate is valid: short, as it is re-signed whenever the prober
/// starts, and capped at the CA's own expiry.
pub const CLIENT_CERT_VALIDITY: Duration = Duration::from_secs(365 * 86_400);
/// Certificates start this long before `now`, for etcd hosts whose clock is a little behind.
pub const CLIENT_CERT_BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Every message names the part of the Secret that is wrong (`tls.crt` or `tls.key`).
#[derive(Debug, Error)]
pub enum CertError {
    #[error("etcd CA certificate (tls.crt): {0}")]
    CaCertPem(String),
    #[error("etcd CA certificate (tls.crt) is not a valid X.509 certificate: {0}")]
    CaCertDer(String),
    #[error("etcd CA certificate (tls.crt) is not a CA (basicConstraints {0})")]
    NotCa(&'static str),
    #[error(
        "etcd CA certificate (tls.crt) may not sign certificates (its keyUsage lacks keyCertSign)"
    )]
    NotCertSigner,
    #[error("etcd CA certificate (tls.crt) {0}")]
    CaValidity(String),
    #[error("etcd CA key (tls.key): {0}")]
    CaKey(String),
    #[error("etcd CA key (tls.key) is not the key of the CA certificate (tls.crt)")]
    KeyMismatch,
    #[error("etcd CA certificate (tls.crt): {0}")]
    CaSubject(String),
    #[error("invalid client common name {name:?}: {reason}")]
    CommonName { name: String, reason: &'static str },
    #[error("the signed client certificate does not parse: {0}")]
    Issued(String),
    #[error("the clock is before 1970: cannot date a certificate")]
    Clock,
    #[error("cannot {what}: {source}")]
    Sign {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
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
/// but never past the CA's own expiry.
///
/// Accepted CA keys: PKCS#8 (`PRIVATE KEY`), PKCS#1 RSA (`RSA PRIVATE KEY`, Cluster API's) and
/// SEC1 EC (`EC PRIVATE KEY`). The CA must be a CA (basicConstraints cA), may not lack
/// keyCertSign, must not have expired, and the key must be its key.
pub fn sign_client_cert(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    common_name: &str,
    now: SystemTime,
) -> Result<ClientCert, CertError> {
    check_common_name(common_name)?;
    let now_secs = now
        .duration_since(UNIX_EPOCH)
        .map_err(|_| CertError::Clock)?
        .as_secs();
    let ca_der = CertificateDer::from_pem_slice(ca_cert_pem.as_bytes())
        .map_err(|e| CertError::CaCertPem(pem_problem("CERTIFICATE", &e)))?;
    let ca = x509::parse(&ca_der).map_err(CertError::CaCertDer)?;
    match ca.ca {
        None => return Err(CertError::NotCa("missing")),
        Some(false) => return Err(CertError::NotCa("cA is false")),
        Some(true) => {}
    }
    if ca.key_cert_sign == Some(false) {
        return Err(CertError::NotCertSigner);
    }
    if ca.not_after <= now_secs {
        return Err(CertError::CaValidity(format!(
            "expired at {} (Unix seconds), now is {now_secs}",
            ca.not_after
        )));
    }
    if ca.not_before > now_secs.saturating_add(CLIENT_CERT_BACKDATE.as_secs()) {
        return Err(CertError::CaValidity(format!(
            "is not valid before {} (Unix seconds), now is {now_secs}: is a clock wrong?",
            ca.not_before
        )));
    }
    let ca_key = load_key(ca_key_pem)?;
    if ca_key.public_key_raw() != ca.public_key {
        return Err(CertError::KeyMismatch);
    }

    let mut issuer_params = CertificateParams::default();
    issuer_params.distinguished_name =
        x509::distinguished_name(ca.subject_content).map_err(CertError::CaSubject)?;
    // An empty identifier identifies nothing: then leave the authority key identifier out.
    let key_id = ca.subject_key_id.clone().filter(|id| !id.is_empty());
    let has_key_id = key_id.is_some();
    if let Some(id) = key_id {
        issuer_params.key_identifier_method = KeyIdMethod::PreSpecified(id);
    }
    issuer_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let issuer = Issuer::new(issuer_params, ca_key);

    let not_before = now_secs.saturating_sub(CLIENT_CERT_BACKDATE.as_secs());
    let not_after = now_secs
        .saturating_add(CLIENT_CERT_VALIDITY.as_secs())
        .min(ca.not_after);
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(|source| CertError::Sign {
        what: "generate the client key",
        source,
    })?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    // An ECDSA key signs the handshake; it never enciphers keys.
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = has_key_id;
    set_validity(&mut params, not_before, not_after);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|source| CertError::Sign {
            what: "sign the client certificate",
            source,
        })?;
    let issued = x509::parse(cert.der()).map_err(CertError::Issued)?;
    if issued.issuer_der != ca.subject_der {
        return Err(CertError::CaSubject(
            "its subject name cannot be reproduced exactly as the issuer of a new certificate \
             (repeated attribute types or unusual string types)"
                .to_string(),
        ));
    }
    Ok(ClientCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_before: UNIX_EPOCH + Duration::from_secs(not_before),
        not_after: UNIX_EPOCH + Duration::from_secs(not_after),
    })
}

fn check_common_name(name: &str) -> Result<(), CertError> {
    let reason = if name.is_empty() {
        Some("empty")
    } else if name.len() > 64 {
        Some("longer than 64 bytes (X.509 ub-common-name)")
    } else if name.chars().any(char::is_control) {
        Some("contains control characters")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(CertError::CommonName {
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Sets the validity period from Unix seconds (rcgen keeps whole seconds).
fn set_validity(params: &mut CertificateParams, not_before: u64, not_after: u64) {
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_before);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_after);
}

fn pem_problem(label: &str, e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("no `-----BEGIN {label}-----` block")
        }
        other => format!("bad PEM: {other:?}"),
    }
}

/// The CA key as rcgen wants it: PKCS#8, wrapping PKCS#1 and SEC1 keys first.
fn load_key(pem: &str) -> Result<KeyPair, CertError> {
    if pem.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") {
        return Err(CertError::CaKey("it is encrypted".to_string()));
    }
    let key = PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| CertError::CaKey(pem_problem("PRIVATE KEY", &e)))?;
    let pkcs8 = match &key {
        PrivateKeyDer::Pkcs8(k) => k.secret_pkcs8_der().to_vec(),
        PrivateKeyDer::Pkcs1(k) => pkcs8::from_pkcs1(k.secret_pkcs1_der()),
        PrivateKeyDer::Sec1(k) => {
            pkcs8::from_sec1(k.secret_sec1_der()).map_err(CertError::CaKey)?
        }
        _ => return Err(CertError::CaKey("unsupported key format".to_string())),
    };
    KeyPair::try_from(pkcs8.as_slice()).map_err(|e| {
        CertError::CaKey(format!(
            "not a usable RSA (2048 bits or more), ECDSA P-256/P-384 or Ed25519 key: {e}"
        ))
    })
}

/// A minimal DER reader and writer: just what reading a CA certificate and wrapping a key need.
mod der {
    pub const SEQUENCE: u8 = 0x30;
    pub const INTEGER: u8 = 0x02;
    pub const OCTET_STRING: u8 = 0x04;
    pub const BIT_STRING: u8 = 0x03;
    pub const OID: u8 = 0x06;
    pub const BOOLEAN: u8 = 0x01;

    pub struct Tlv<'a> {
        pub tag: u8,
        pub content: &'a [u8],
        /// Tag, length and content, as they appear in the input.
        pub raw: &'a [u8],
    }

    pub struct Reader<'a> {
        rest: &'a [u8],
    }

    impl<'a> Reader<'a> {
        pub fn new(input: &'a [u8]) -> Self {
            Self { rest: input }
        }

        pub fn is_empty(&self) -> bool {
            self.rest.is_empty()
        }

        pub fn peek_tag(&self) -> Option<u8> {
            self.rest.first().copied()
        }

        pub fn read(&mut self, what: &str) -> Result<Tlv<'a>, String> {
            let input = self.rest;
            let fail = |why: &str| format!("{what}: {why}");
            let (&tag, after_tag) = input.split_first().ok_or_else(|| fail("missing"))?;
            if tag & 0x1f == 0x1f {
                return Err(fail("unsupported high tag number"));
            }
            let (&first, mut after_len) =
                after_tag.split_first().ok_or_else(|| fail("no length"))?;
            let len = if first < 0x80 {
                usize::from(first)
            } else {
                let n = usize::from(first & 0x7f);
                if n == 0 || n > 4 {
                    return Err(fail("unsupported length form"));
                }
                let bytes = after_len.get(..n).ok_or_else(|| fail("truncated length"))?;
                after_len = &after_len[n..];
                bytes
                    .iter()
                    .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
            };
            let content = after_len
                .get(..len)
                .ok_or_else(|| fail("truncated content"))?;
            let header = input.len() - after_len.len();
            let raw = &input[..header + len];
            self.rest = &after_len[len..];
            Ok(Tlv { tag, content, raw })
        }

        pub fn read_tag(&mut self, tag: u8, what: &str) -> Result<Tlv<'a>, String> {
            let tlv = self.read(what)?;
            if tlv.tag == tag {
                Ok(tlv)
            } else {
                Err(format!(
                    "{what}: expected tag {tag:#04x}, found {:#04x}",
                    tlv.tag
                ))
            }
        }
    }

    /// Object identifier content to its arcs.
    pub fn oid(content: &[u8]) -> Result<Vec<u64>, String> {
        let (&first, rest) = content.split_first().ok_or("empty OID")?;
        let mut arcs = vec![u64::from(first / 40), u64::from(first % 40)];
        let mut value: u64 = 0;
        for &b in rest {
            if value > u64::MAX >> 7 {
                return Err("OID arc too large".to_string());
            }
            value = (value << 7) | u64::from(b & 0x7f);
            if b & 0x80 == 0 {
                arcs.push(value);
                value = 0;
            }
        }
        if rest.last().is_some_and(|b| b & 0x80 != 0) {
            return Err("truncated OID".to_string());
        }
        Ok(arcs)
    }

    /// UTCTime (`YYMMDDHHMMSSZ`) or GeneralizedTime (`YYYYMMDDHHMMSSZ`) to Unix seconds.
    pub fn time(tlv: &Tlv<'_>) -> Result<u64, String> {
        let s = std::str::from_utf8(tlv.content).map_err(|_| "time is not ASCII")?;
        let digits = s.strip_suffix('Z').ok_or("time is not in UTC (Z)")?;
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad time {s:?}"));
        }
        let num = |r: std::ops::Range<usize>| -> Result<u64, String> {
            digits
                .get(r)
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| format!("bad time {s:?}"))
        };
        let (year, at) = match (tlv.tag, digits.len()) {
            (0x17, 12) => {
                let yy = num(0..2)?;
                (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
            }
            (0x18, 14) => (num(0..4)?, 4),
            _ => return Err(format!("unsupported time {s:?}")),
        };
        let (month, day) = (num(at..at + 2)?, num(at + 2..at + 4)?);
        let (h, m, sec) = (
            num(at + 4..at + 6)?,
            num(at + 6..at + 8)?,
            num(at + 8..at + 10)?,
        );
        if year < 1970
            || !(1..=12).contains(&month)
            || !(1..=31).contains(&day)
            || h > 23
            || m > 59
            || sec > 60
        {
            return Err(format!("bad or pre-1970 time {s:?}"));
        }
        Ok(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + sec)
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm), for
    /// years from 1970 on.
    fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
        let y = if m <= 2 { y - 1 } else { y };
        let era = y / 400;
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }

    /// One TLV, definite length.
    pub fn write(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = content.len();
        // Short form below 128; else the long form: 0x80 | byte count, then the bytes (at most
        // 8, so both casts are exact).
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes: Vec<u8> = len
                .to_be_bytes()
                .into_iter()
                .skip_while(|&b| b == 0)
                .collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend_from_slice(&bytes);
        }
        out.extend_from_slice(content);
        out
    }
}

/// PKCS#1 and SEC1 private keys wrapped as PKCS#8 PrivateKeyInfo (RFC 5208, RFC 5915 §3).
mod pkcs8 {
    use super::der::{self, Reader};

    /// rsaEncryption, 1.2.840.113549.1.1.1.
    const RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    /// id-ecPublicKey, 1.2.840.10045.2.1.
    const EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

    fn wrap(algorithm: Vec<u8>, key: &[u8]) -> Vec<u8> {
        let mut body = der::write(der::INTEGER, &[0]);
        body.extend(der::write(der::SEQUENCE, &algorithm));
        body.extend(der::write(der::OCTET_STRING, key));
        der::write(der::SEQUENCE, &body)
    }

    pub fn from_pkcs1(key: &[u8]) -> Vec<u8> {
        let mut alg = der::write(der::OID, RSA_ENCRYPTION);
        alg.extend([0x05, 0x00]); // NULL parameters
        wrap(alg, key)
    }

    /// The curve comes from the SEC1 key's own `[0] parameters`, which Go and OpenSSL write.
    pub fn from_sec1(key: &[u8]) -> Result<Vec<u8>, String> {
        let seq = Reader::new(key).read_tag(der::SEQUENCE, "EC private key")?;
        let mut fields = Reader::new(seq.content);
        fields.read_tag(der::INTEGER, "EC private key version")?;
        fields.read_tag(der::OCTET_STRING, "EC private key")?;
        let mut curve = None;
        while !fields.is_empty() {
            let field = fields.read("EC private key field")?;
            if field.tag == 0xa0 {
                curve = Some(Reader::new(field.content).read_tag(der::OID, "EC curve")?);
            }
        }
        let curve = curve.ok_or("the EC key does not name its curve (no SEC1 parameters)")?;
        let mut alg = der::write(der::OID, EC_PUBLIC_KEY);
        alg.extend_from_slice(curve.raw);
        Ok(wrap(alg, key))
    }
}

/// The fields of an X.509 certificate a CA is judged by.
mod x509 {
    use super::der::{self, Reader};
    use super::{
        BmpString, DistinguishedName, DnType, DnValue, Ia5String, PrintableString, TeletexString,
        UniversalString,
    };

    const BASIC_CONSTRAINTS: &[u64] = &[2, 5, 29, 19];
    const KEY_USAGE: &[u64] = &[2, 5, 29, 15];
    const SUBJECT_KEY_ID: &[u64] = &[2, 5, 29, 14];

    pub struct Parsed<'a> {
        /// The whole issuer Name (tag, length, content), as signed.
        pub issuer_der: &'a [u8],
        /// The whole subject Name.
        pub subject_der: &'a [u8],
        pub subject_content: &'a [u8],
        pub not_before: u64,
        pub not_after: u64,
        /// The subjectPublicKey bits: for EC the point, for RSA the PKCS#1 public key.
        pub public_key: &'a [u8],
        /// basicConstraints cA; `None` without the extension.
        pub ca: Option<bool>,
        /// keyUsage keyCertSign; `None` without the extension.
        pub key_cert_sign: Option<bool>,
        pub subject_key_id: Option<Vec<u8>>,
    }

    pub fn parse(input: &[u8]) -> Result<Parsed<'_>, String> {
        let cert = Reader::new(input).read_tag(der::SEQUENCE, "Certificate")?;
        let tbs = Reader::new(cert.content).read_tag(der::SEQUENCE, "tbsCertificate")?;
        let mut tbs = Reader::new(tbs.content);
        if tbs.peek_tag() == Some(0xa0) {
            tbs.read("version")?;
        }
        tbs.read_tag(der::INTEGER, "serialNumber")?;
        tbs.read_tag(der::SEQUENCE, "signature")?;
        let issuer = tbs.read_tag(der::SEQUENCE, "issuer")?;
        let validity = tbs.read_tag(der::SEQUENCE, "validity")?;
        let mut validity = Reader::new(validity.content);
        let not_before = der::time(&validity.read("notBefore")?)?;
        let not_after = der::time(&validity.read("notAfter")?)?;
        let subject = tbs.read_tag(der::SEQUENCE, "subject")?;
        let spki = tbs.read_tag(der::SEQUENCE, "subjectPublicKeyInfo")?;
        let mut spki = Reader::new(spki.content);
        spki.read_tag(der::SEQUENCE, "algorithm")?;
        let bits = spki.read_tag(der::BIT_STRING, "subjectPublicKey")?;
        let public_key = bits.content.get(1..).ok_or("empty subjectPublicKey")?;
        let mut parsed = Parsed {
            issuer_der: issuer.raw,
            subject_der: subject.raw,
            subject_content: subject.content,
            not_before,
            not_after,
            public_key,
            ca: None,
            key_cert_sign: None,
            subject_key_id: None,
        };
        while !tbs.is_empty() {
            let field = tbs.read("tbsCertificate field")?;
            if field.tag != 0xa3 {
                continue; // issuerUniqueID, subjectUniqueID
            }
            let exts = Reader::new(field.content).read_tag(der::SEQUENCE, "extensions")?;
            let mut exts = Reader::new(exts.content);
            while !exts.is_empty() {
                let ext = exts.read_tag(der::SEQUENCE, "extension")?;
                let mut ext = Reader::new(ext.content);
                let oid = der::oid(ext.read_tag(der::OID, "extnID")?.content)?;
                if ext.peek_tag() == Some(der::BOOLEAN) {
                    ext.read("critical")?;
                }
                let value = ext.read_tag(der::OCTET_STRING, "extnValue")?.content;
                if oid == BASIC_CONSTRAINTS {
                    let seq = Reader::new(value).read_tag(der::SEQUENCE, "basicConstraints")?;
                    let mut seq = Reader::new(seq.content);
                    let ca = seq.peek_tag() == Some(der::BOOLEAN)
                        && seq.read("cA")?.content.first().is_some_and(|&b| b != 0);
                    parsed.ca = Some(ca);
                } else if oid == KEY_USAGE {
                    let bits = Reader::new(value).read_tag(der::BIT_STRING, "keyUsage")?;
                    // keyCertSign is bit 5: 0x04 of the first byte after the unused-bits count.
                    let first = bits.content.get(1).copied().unwrap_or(0);
                    parsed.key_cert_sign = Some(first & 0x04 != 0);
                } else if oid == SUBJECT_KEY_ID {
                    let id =
                        Reader::new(value).read_tag(der::OCTET_STRING, "subjectKeyIdentifier")?;
                    parsed.subject_key_id = Some(id.content.to_vec());
                }
            }
        }
        Ok(parsed)
    }

    /// A Name's content as rcgen's DistinguishedName with the same string types, one attribute
    /// per RDN and each type once (what rcgen can write back).
    pub fn distinguished_name(content: &[u8]) -> Result<DistinguishedName, String> {
        let mut dn = DistinguishedName::new();
        let mut rdns = Reader::new(content);
        while !rdns.is_empty() {
            let set = rdns.read_tag(0x31, "subject RDN")?;
            let mut set = Reader::new(set.content);
            let atv = set.read_tag(der::SEQUENCE, "subject attribute")?;
            if !set.is_empty() {
                return Err("its subject has a multi-valued RDN, which is not supported".into());
            }
            let mut atv = Reader::new(atv.content);
            let ty = DnType::from_oid(&der::oid(
                atv.read_tag(der::OID, "attribute type")?.content,
            )?);
            let value = atv.read("attribute value")?;
            let text = || {
                std::str::from_utf8(value.content)
                    .map(str::to_string)
                    .map_err(|_| "its subject has a string that is not UTF-8".to_string())
            };
            let bad = |e: rcgen::Error| format!("its subject has an invalid string: {e}");
            let value = match value.tag {
                0x0c => DnValue::Utf8String(text()?),
                0x13 => DnValue::PrintableString(PrintableString::try_from(text()?).map_err(bad)?),
                0x16 => DnValue::Ia5String(Ia5String::try_from(text()?).map_err(bad)?),
                0x14 => DnValue::TeletexString(TeletexString::try_from(text()?).map_err(bad)?),
                0x1e => DnValue::BmpString(
                    BmpString::from_utf16be(value.content.to_vec()).map_err(bad)?,
                ),
                0x1c => DnValue::UniversalString(
                    UniversalString::from_utf32be(value.content.to_vec()).map_err(bad)?,
                ),
                tag => {
                    return Err(format!(
                        "its subject has an unsupported string type {tag:#04x}"
                    ));
                }
            };
            if dn.get(&ty).is_some() {
                return Err("its subject repeats an attribute type, which is not supported".into());
            }
            dn.push(ty, value);
        }
        Ok(dn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use rcgen::BasicConstraints;
    use rustls::pki_types::UnixTime;
    use rustls::server::WebPkiClientVerifier;
    use rustls::{CertificateError, RootCertStore};

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
        let cert = sign_client_cert(CAPI_CA_CRT, CAPI_CA_KEY, CLIENT_COMMON_NAME, at(NOW)).unwrap();
        verify(CAPI_CA_CRT, &cert.cert_pem, NOW).unwrap();
        let der = CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap();
        let leaf = x509::parse(&der).unwrap();
        let ca_der = CertificateDer::from_pem_slice(CAPI_CA_CRT.as_bytes()).unwrap();
        let ca = x509::parse(&ca_der).unwrap();
        assert_eq!(
            leaf.issuer_der, ca.subject_der,
            "issuer must be the CA subject, byte for byte"
        );
        assert_eq!(leaf.ca, Some(false));
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
        let cert = sign_client_cert(CAPI_CA_CRT, CAPI_CA_KEY, CLIENT_COMMON_NAME, at(NOW)).unwrap();
        assert_eq!(cert.not_before, at(NOW - 300));
        assert_eq!(cert.not_after, at(NOW + 365 * DAY));
        let der = CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap();
        let leaf = x509::parse(&der).unwrap();
        assert_eq!(
            (leaf.not_before, leaf.not_after),
            (NOW - 300, NOW + 365 * DAY)
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
    fn refuses_expired_or_future_cas() {
        let (crt, key) = rcgen_ca(cn("ca"));
        let err = sign_client_cert(&crt, &key, "x", at(NOW + 3651 * DAY)).unwrap_err();
        assert!(matches!(err, CertError::CaValidity(_)), "{err}");
        assert!(err.to_string().contains("expired"), "{err}");
        let err = sign_client_cert(&crt, &key, "x", at(NOW - 2 * DAY)).unwrap_err();
        assert!(err.to_string().contains("not valid before"), "{err}");
        // Within the backdate window a brand-new CA is fine (clocks a little apart).
        sign_client_cert(&crt, &key, "x", at(NOW - DAY - 60)).unwrap();
    }

    #[test]
    fn refuses_a_key_that_is_not_the_cas() {
        let err = sign_client_cert(CAPI_CA_CRT, SEC1_CA_KEY, "x", at(NOW)).unwrap_err();
        assert!(matches!(err, CertError::KeyMismatch), "{err}");
        assert!(err.to_string().contains("tls.key"), "{err}");
    }

    #[test]
    fn refuses_a_leaf_certificate_as_ca() {
        let leaf = sign_client_cert(CAPI_CA_CRT, CAPI_CA_KEY, "x", at(NOW)).unwrap();
        let err = sign_client_cert(&leaf.cert_pem, &leaf.key_pem, "x", at(NOW)).unwrap_err();
        assert!(matches!(err, CertError::NotCa("cA is false")), "{err}");

        // No basicConstraints at all.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = cn("not a CA");
        set_validity(&mut params, NOW - DAY, NOW + DAY);
        let crt = params.self_signed(&key).unwrap().pem();
        let err = sign_client_cert(&crt, &key.serialize_pem(), "x", at(NOW)).unwrap_err();
        assert!(matches!(err, CertError::NotCa("missing")), "{err}");
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
        assert!(matches!(err, CertError::NotCertSigner), "{err}");
    }

    #[test]
    fn refuses_bad_pem_and_names_the_part() {
        let err = sign_client_cert("", CAPI_CA_KEY, "x", at(NOW)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "etcd CA certificate (tls.crt): no `-----BEGIN CERTIFICATE-----` block"
        );
        let err = sign_client_cert(CAPI_CA_CRT, CAPI_CA_CRT, "x", at(NOW)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "etcd CA key (tls.key): no `-----BEGIN PRIVATE KEY-----` block"
        );
        let encrypted =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let err = sign_client_cert(CAPI_CA_CRT, encrypted, "x", at(NOW)).unwrap_err();
        assert_eq!(err.to_string(), "etcd CA key (tls.key): it is encrypted");
        let garbage = "-----BEGIN CERTIFICATE-----\nMAMCAQA=\n-----END CERTIFICATE-----\n";
        let err = sign_client_cert(garbage, CAPI_CA_KEY, "x", at(NOW)).unwrap_err();
        assert!(matches!(err, CertError::CaCertDer(_)), "{err}");
    }

    #[test]
    fn refuses_bad_common_names() {
        for name in ["", "a\nb", &"x".repeat(65)] {
            let err = sign_client_cert(CAPI_CA_CRT, CAPI_CA_KEY, name, at(NOW)).unwrap_err();
            assert!(matches!(err, CertError::CommonName { .. }), "{err}");
        }
    }

    #[test]
    fn refuses_subjects_rcgen_cannot_reproduce() {
        // Two OU attributes: rcgen keeps one of each type, so the issuer would differ.
        let ou = |s: &str| {
            let mut atv = der::write(der::OID, &[0x55, 0x04, 0x0b]);
            atv.extend(der::write(0x0c, s.as_bytes()));
            der::write(0x31, &der::write(der::SEQUENCE, &atv))
        };
        let mut content = ou("a");
        content.extend(ou("b"));
        let err = x509::distinguished_name(&content).unwrap_err();
        assert!(err.contains("repeats an attribute type"), "{err}");
    }

    #[test]
    fn der_times_and_lengths() {
        let t = |tag: u8, s: &str| {
            let raw = der::write(tag, s.as_bytes());
            let tlv = der::Reader::new(&raw).read("t").unwrap();
            der::time(&tlv)
        };
        assert_eq!(t(0x17, "700101000000Z"), Ok(0));
        assert_eq!(t(0x17, "270601000000Z"), Ok(NOW));
        assert_eq!(t(0x18, "20270601000000Z"), Ok(NOW));
        assert_eq!(t(0x18, "20000229120000Z"), Ok(951_825_600));
        assert!(t(0x17, "270601000000+0100").is_err());
        assert!(t(0x17, "271301000000Z").is_err());
        let long = vec![7u8; 300];
        let raw = der::write(der::OCTET_STRING, &long);
        assert_eq!(&raw[..4], &[0x04, 0x82, 0x01, 0x2c]);
        let tlv = der::Reader::new(&raw).read("x").unwrap();
        assert_eq!(tlv.content, long.as_slice());
        assert!(der::Reader::new(&raw[..100]).read("x").is_err());
    }
}
