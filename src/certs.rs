//! Serving certificates for the webhook on clusters without cert-manager: a CA and a serving
//! certificate signed by it, for the webhook Service's DNS names.
//!
//! Nothing here but [`write_files`] does I/O: the clock comes in as `now` (Unix seconds), so
//! tests check validity periods exactly; only key generation draws on the system's randomness.
//! The CLI (`quorumguard certs`, in `cli::certs`) reads the files, prints, and patches the
//! caBundle through the API server.
//!
//! A CA, new or given with `--ca-cert/--ca-key`, is always loaded from PEM the same way: its
//! subject, subject key identifier, validity and basic constraints are read from the DER with a
//! minimal reader (rcgen can only do that with its `x509-parser` feature, which is not enabled),
//! and every issued certificate is checked to name exactly the CA's subject as its issuer.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use rcgen::string::{BmpString, Ia5String, PrintableString, TeletexString, UniversalString};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, PublicKeyData,
};
use serde_json::{Value, json};
use thiserror::Error;

/// The webhook Service the API server dials (`clientConfig.service.name`).
pub const DEFAULT_SERVICE: &str = "quorumguard-webhook";
/// The namespace quorumguard runs in.
pub const DEFAULT_NAMESPACE: &str = "quorumguard-system";
/// The Secret the Deployment mounts at /tls.
pub const DEFAULT_SECRET: &str = "quorumguard-webhook-tls";
/// The ValidatingWebhookConfiguration the manifests install.
pub const DEFAULT_WEBHOOK_CONFIGURATION: &str = "quorumguard";
/// Validity of a serving certificate unless `--days` says otherwise.
pub const DEFAULT_DAYS: u32 = 365;
/// Validity of a new CA: ten years, so renewing the serving certificate never needs a new
/// caBundle.
pub const CA_DAYS: u32 = 3650;
/// The longest serving certificate: no longer than a new CA.
pub const MAX_DAYS: u32 = CA_DAYS;
/// Certificates start this long before `now`, for clocks that are a little behind ours.
pub const BACKDATE_SECS: i64 = 3600;

/// File names in the output directory. `tls.crt`/`tls.key` are what `kubectl create secret tls`
/// and the Deployment's volume expect.
pub const CA_CERT_FILE: &str = "ca.crt";
pub const CA_KEY_FILE: &str = "ca.key";
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// The subject of a CA made here.
pub const CA_COMMON_NAME: &str = "quorumguard webhook CA";
pub const ORGANIZATION: &str = "quorumguard";

/// The annotation that makes cert-manager's cainjector own a webhook configuration's caBundle.
pub const INJECT_CA_ANNOTATION: &str = "cert-manager.io/inject-ca-from";

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
    #[error(
        "CA key: {0}. A PKCS#8 key (`-----BEGIN PRIVATE KEY-----`, ECDSA P-256/P-384, Ed25519 or \
         RSA) is needed; convert with `openssl pkcs8 -topk8 -nocrypt -in ca.key -out ca.pk8.key`"
    )]
    CaKey(String),
    #[error("CA key does not belong to the CA certificate (their public keys differ)")]
    CaKeyMismatch,
    #[error(
        "the CA expires at {ca}, before the serving certificate would ({leaf}): use a shorter \
         --days or a new CA"
    )]
    CaExpiresFirst { ca: String, leaf: String },
    #[error("{} already exist{}: pass --force to overwrite", list_paths(.0), if .0.len() == 1 { "s" } else { "" })]
    Exists(Vec<PathBuf>),
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode the caBundle: {0}")]
    Encode(String),
}

fn list_paths(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(", ")
}

fn rcgen_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> CertError {
    move |source| CertError::Rcgen { what, source }
}

/// The names the API server may use for the Service: `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc`,
/// `<svc>.<ns>.svc.cluster.local`, then each extra name (a DNS name, `*.` wildcard allowed, or
/// an IP address), without duplicates, in that order.
pub fn service_dns_names(
    service: &str,
    namespace: &str,
    extra: &[String],
) -> Result<Vec<String>, CertError> {
    check_label("--service", service)?;
    check_label("--namespace", namespace)?;
    let mut names = vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    for name in extra {
        check_extra_name(name)?;
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    Ok(names)
}

/// A DNS-1123 label, as Kubernetes requires of Service and Namespace names.
fn check_label(what: &'static str, name: &str) -> Result<(), CertError> {
    label_problem(name).map_or(Ok(()), |reason| {
        Err(CertError::InvalidName {
            what,
            name: name.to_string(),
            reason: reason.to_string(),
        })
    })
}

fn label_problem(label: &str) -> Option<&'static str> {
    if label.is_empty() {
        return Some("empty label");
    }
    if label.len() > 63 {
        return Some("a label is longer than 63 characters");
    }
    if !label
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some("only lowercase letters, digits and '-' are allowed");
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Some("a label must start and end with a letter or digit");
    }
    None
}

fn check_extra_name(name: &str) -> Result<(), CertError> {
    if name.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let invalid = |reason: &str| CertError::InvalidName {
        what: "--dns-name",
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.len() > 253 {
        return Err(invalid("longer than 253 characters"));
    }
    let rest = name.strip_prefix("*.").unwrap_or(name);
    for label in rest.split('.') {
        if let Some(reason) = label_problem(label) {
            return Err(invalid(reason));
        }
    }
    Ok(())
}

fn check_days(days: u32) -> Result<(), CertError> {
    if (1..=MAX_DAYS).contains(&days) {
        Ok(())
    } else {
        Err(CertError::InvalidDays(days))
    }
}

fn check_now(now: i64) -> Result<(), CertError> {
    if (MIN_NOW..=MAX_NOW).contains(&now) {
        Ok(())
    } else {
        Err(CertError::Clock(now))
    }
}

/// A CA able to sign serving certificates: its PEM, its key, and what signing needs of it.
pub struct CertificateAuthority {
    cert_pem: String,
    key_pem: String,
    subject_der: Vec<u8>,
    not_after: i64,
    has_key_id: bool,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertificateAuthority {
    /// Leaves the key out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("not_after", &format_time(self.not_after))
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A new CA: ECDSA P-256, valid [`CA_DAYS`] from `now` (less [`BACKDATE_SECS`]), allowed to
    /// sign end-entity certificates only (path length 0).
    pub fn generate(now: i64) -> Result<Self, CertError> {
        check_now(now)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(rcgen_err("generate the CA key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, ORGANIZATION);
        dn.push(DnType::CommonName, CA_COMMON_NAME);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(
            &mut params,
            now - BACKDATE_SECS,
            now + i64::from(CA_DAYS) * SECS_PER_DAY,
        );
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_err("sign the CA certificate"))?;
        // Through the same loader as a given CA, so that path is the one always exercised.
        Self::from_pem(&cert.pem(), &key.serialize_pem(), now)
    }

    /// Loads an existing CA. Checks that it is a CA, that it may sign certificates, that the key
    /// is its key, and that it is valid at `now`.
    pub fn from_pem(cert_pem: &str, key_pem: &str, now: i64) -> Result<Self, CertError> {
        check_now(now)?;
        let der = pem_certificate(cert_pem)?;
        let parsed = x509::parse(&der).map_err(CertError::CaCertDer)?;
        match parsed.ca {
            None => return Err(CertError::NotCa("missing")),
            Some(false) => return Err(CertError::NotCa("cA is false")),
            Some(true) => {}
        }
        if parsed.key_cert_sign == Some(false) {
            return Err(CertError::NotCertSigner);
        }
        if now < parsed.not_before {
            return Err(CertError::CaValidity(format!(
                "not valid before {}",
                format_time(parsed.not_before)
            )));
        }
        if now >= parsed.not_after {
            return Err(CertError::CaValidity(format!(
                "expired at {}",
                format_time(parsed.not_after)
            )));
        }
        let key = load_key(key_pem)?;
        if key.der_bytes() != parsed.public_key {
            return Err(CertError::CaKeyMismatch);
        }
        let mut params = CertificateParams::default();
        params.distinguished_name =
            x509::distinguished_name(parsed.subject_content).map_err(CertError::CaSubject)?;
        // An empty identifier identifies nothing: leave the authority key identifier out.
        let key_id = parsed.subject_key_id.filter(|id| !id.is_empty());
        let has_key_id = key_id.is_some();
        if let Some(id) = key_id {
            params.key_identifier_method = KeyIdMethod::PreSpecified(id);
        }
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        Ok(Self {
            cert_pem: certificate_pem(&der)?,
            key_pem: key_pem.to_string(),
            subject_der: parsed.subject_der.to_vec(),
            not_after: parsed.not_after,
            has_key_id,
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate (PEM, this certificate only).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key (PKCS#8 PEM).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// When the CA expires (Unix seconds).
    pub fn not_after(&self) -> i64 {
        self.not_after
    }

    /// A serving certificate for `names` (DNS names or IP addresses; the first `common_name`),
    /// valid `days` from `now`, with a new ECDSA P-256 key. Refused if the CA would expire first.
    pub fn issue(
        &self,
        common_name: &str,
        names: &[String],
        days: u32,
        now: i64,
    ) -> Result<ServingCert, CertError> {
        check_now(now)?;
        check_days(days)?;
        let not_after = now + i64::from(days) * SECS_PER_DAY;
        if not_after > self.not_after {
            return Err(CertError::CaExpiresFirst {
                ca: format_time(self.not_after),
                leaf: format_time(not_after),
            });
        }
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(rcgen_err("generate the serving key"))?;
        let mut params = CertificateParams::new(names.to_vec())
            .map_err(rcgen_err("use the names as subject alternative names"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, ORGANIZATION);
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        // ECDSA keys sign the handshake; they never encipher keys.
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = self.has_key_id;
        set_validity(&mut params, now - BACKDATE_SECS, not_after);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rcgen_err("sign the serving certificate"))?;
        // rcgen writes the issuer name from the parsed subject; a verifier matches it byte for
        // byte, so make sure it came out exactly the same.
        let issued = x509::parse(cert.der()).map_err(CertError::CaCertDer)?;
        if issued.issuer_der != self.subject_der.as_slice() {
            return Err(CertError::CaSubject(
                "its subject name cannot be reproduced exactly (unusual string types or \
                 attribute order): use a CA with a plain subject, or let quorumguard make one"
                    .to_string(),
            ));
        }
        Ok(ServingCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after,
        })
    }
}

/// A serving certificate and its key.
#[derive(Clone)]
pub struct ServingCert {
    /// This certificate only (PEM).
    pub cert_pem: String,
    /// PKCS#8 PEM.
    pub key_pem: String,
    /// Unix seconds.
    pub not_after: i64,
}

impl std::fmt::Debug for ServingCert {
    /// Leaves the key out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("not_after", &format_time(self.not_after))
            .finish_non_exhaustive()
    }
}

/// What `quorumguard certs` asks for.
#[derive(Clone, Debug)]
pub struct Request {
    pub service: String,
    pub namespace: String,
    pub extra_names: Vec<String>,
    pub days: u32,
    /// An existing CA (certificate PEM, key PEM); `None` makes a new one.
    pub ca: Option<(String, String)>,
}

/// Everything to write and print.
#[derive(Clone)]
pub struct Bundle {
    /// The CA certificate: `ca.crt`, and the caBundle.
    pub ca_cert_pem: String,
    /// The CA key, only when the CA is new (`ca.key`); a given CA's key stays where it is.
    pub new_ca_key_pem: Option<String>,
    /// The serving certificate followed by the CA certificate: `tls.crt`.
    pub chain_pem: String,
    /// `tls.key`.
    pub key_pem: String,
    pub dns_names: Vec<String>,
    pub not_after: i64,
    pub ca_not_after: i64,
}

impl std::fmt::Debug for Bundle {
    /// Leaves the keys out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bundle")
            .field("dns_names", &self.dns_names)
            .field("new_ca", &self.new_ca_key_pem.is_some())
            .field("not_after", &format_time(self.not_after))
            .field("ca_not_after", &format_time(self.ca_not_after))
            .finish_non_exhaustive()
    }
}

/// Makes (or loads) the CA and issues the serving certificate for the Service's names.
pub fn generate(req: &Request, now: i64) -> Result<Bundle, CertError> {
    check_days(req.days)?;
    let dns_names = service_dns_names(&req.service, &req.namespace, &req.extra_names)?;
    let (ca, new_ca) = match &req.ca {
        Some((cert, key)) => (CertificateAuthority::from_pem(cert, key, now)?, false),
        None => (CertificateAuthority::generate(now)?, true),
    };
    // `<svc>.<ns>.svc`, the name the API server dials; a CN is limited to 64 characters.
    let svc_name = format!("{}.{}.svc", req.service, req.namespace);
    let cn = if svc_name.len() <= 64 {
        svc_name.as_str()
    } else {
        req.service.as_str()
    };
    let leaf = ca.issue(cn, &dns_names, req.days, now)?;
    let mut chain_pem = leaf.cert_pem.clone();
    if !chain_pem.ends_with('\n') {
        chain_pem.push('\n');
    }
    chain_pem.push_str(ca.cert_pem());
    Ok(Bundle {
        ca_cert_pem: ca.cert_pem().to_string(),
        new_ca_key_pem: new_ca.then(|| ca.key_pem().to_string()),
        chain_pem,
        key_pem: leaf.key_pem,
        dns_names,
        not_after: leaf.not_after,
        ca_not_after: ca.not_after(),
    })
}

/// A file to write: its name in the output directory, contents and Unix mode.
#[derive(Clone)]
pub struct OutputFile {
    pub name: &'static str,
    pub contents: String,
    pub mode: u32,
}

impl std::fmt::Debug for OutputFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputFile")
            .field("name", &self.name)
            .field("mode", &format_args!("{:o}", self.mode))
            .finish_non_exhaustive()
    }
}

impl Bundle {
    /// `ca.crt`, `ca.key` (new CA only), `tls.crt`, `tls.key`: keys 0600, certificates 0644.
    pub fn files(&self) -> Vec<OutputFile> {
        let mut files = vec![OutputFile {
            name: CA_CERT_FILE,
            contents: self.ca_cert_pem.clone(),
            mode: 0o644,
        }];
        if let Some(key) = &self.new_ca_key_pem {
            files.push(OutputFile {
                name: CA_KEY_FILE,
                contents: key.clone(),
                mode: 0o600,
            });
        }
        files.push(OutputFile {
            name: CERT_FILE,
            contents: self.chain_pem.clone(),
            mode: 0o644,
        });
        files.push(OutputFile {
            name: KEY_FILE,
            contents: self.key_pem.clone(),
            mode: 0o600,
        });
        files
    }

    /// The `caBundle` value: base64 of the CA certificate's PEM.
    pub fn ca_bundle(&self) -> Result<String, CertError> {
        ca_bundle(&self.ca_cert_pem)
    }
}

/// Writes `files` into `dir` (created, 0700, if missing). Without `force`, nothing is written
/// if any of them exists. With `force`, each file is replaced atomically (written aside, then
/// renamed), so a key never exists with a wider mode or half-written. Returns the paths.
pub fn write_files(
    dir: &Path,
    files: &[OutputFile],
    force: bool,
) -> Result<Vec<PathBuf>, CertError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CertError::Io { path, source }
    };
    if !dir.is_dir() {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(io(dir))?;
    }
    let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f.name)).collect();
    if !force {
        let existing: Vec<PathBuf> = paths
            .iter()
            .filter(|p| fs::symlink_metadata(p).is_ok())
            .cloned()
            .collect();
        if !existing.is_empty() {
            return Err(CertError::Exists(existing));
        }
    }
    for (file, path) in files.iter().zip(&paths) {
        if force {
            let tmp = dir.join(format!(".{}.tmp-{}", file.name, std::process::id()));
            // A leftover from an interrupted run.
            let _ = fs::remove_file(&tmp);
            create_file(&tmp, file).map_err(io(&tmp))?;
            fs::rename(&tmp, path).map_err(|source| {
                let _ = fs::remove_file(&tmp);
                CertError::Io {
                    path: path.clone(),
                    source,
                }
            })?;
        } else {
            // create_new: if something appeared since the check above, refuse rather than
            // overwrite.
            create_file(path, file).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    CertError::Exists(vec![path.clone()])
                } else {
                    CertError::Io {
                        path: path.clone(),
                        source: e,
                    }
                }
            })?;
        }
    }
    Ok(paths)
}

fn create_file(path: &Path, file: &OutputFile) -> std::io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, file.mode);
    let mut f = options.open(path)?;
    // The umask may have narrowed the mode; certificates should stay readable.
    #[cfg(unix)]
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(file.mode))?;
    f.write_all(file.contents.as_bytes())?;
    f.sync_all()
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

/// A JSON patch (RFC 6902) setting `clientConfig.caBundle` of every webhook, in the order the
/// configuration lists them. Each webhook's name is tested first, so the patch fails rather
/// than touch the wrong entry if the list changed since it was read.
pub fn ca_bundle_patch(webhook_names: &[String], ca_bundle: &str) -> Value {
    let mut ops = Vec::with_capacity(webhook_names.len() * 2);
    for (i, name) in webhook_names.iter().enumerate() {
        ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": name}));
        ops.push(json!({
            "op": "add",
            "path": format!("/webhooks/{i}/clientConfig/caBundle"),
            "value": ca_bundle,
        }));
    }
    Value::Array(ops)
}

/// The command that stores the serving certificate where the Deployment mounts it.
pub fn kubectl_create_secret(secret: &str, namespace: &str, cert: &Path, key: &Path) -> String {
    format!(
        "kubectl create secret tls {} -n {} --cert={} --key={}",
        shell_quote(secret),
        shell_quote(namespace),
        shell_quote(&cert.display().to_string()),
        shell_quote(&key.display().to_string()),
    )
}

/// Quotes for a POSIX shell when needed.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=:,+@%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// RFC 3339, UTC, seconds.
pub fn format_time(unix: i64) -> String {
    let days = unix.div_euclid(SECS_PER_DAY);
    let secs = unix.rem_euclid(SECS_PER_DAY);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    // d is in 1..=31 and m in 1..=12 by construction.
    (y, d_u32(m), d_u32(d))
}

fn d_u32(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// Sets the validity period from Unix seconds. Callers keep both within a few thousand years
/// of [`MIN_NOW`], so the additions cannot overflow rcgen's date type.
fn set_validity(params: &mut CertificateParams, not_before: i64, not_after: i64) {
    let unix = |secs: i64| Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + unix(not_before);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + unix(not_after);
}

fn load_key(key_pem: &str) -> Result<KeyPair, CertError> {
    for (label, hint) in [
        ("EC PRIVATE KEY", "it is a SEC1 EC key"),
        ("RSA PRIVATE KEY", "it is a PKCS#1 RSA key"),
        ("ENCRYPTED PRIVATE KEY", "it is encrypted"),
    ] {
        if key_pem.contains(&format!("-----BEGIN {label}-----")) {
            return Err(CertError::CaKey(hint.to_string()));
        }
    }
    if !key_pem.contains("-----BEGIN PRIVATE KEY-----") {
        return Err(CertError::CaKey(
            "no `-----BEGIN PRIVATE KEY-----` block".to_string(),
        ));
    }
    KeyPair::from_pem(key_pem).map_err(|e| CertError::CaKey(e.to_string()))
}

/// The DER of the first `CERTIFICATE` block.
fn pem_certificate(pem: &str) -> Result<Vec<u8>, CertError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem
        .find(BEGIN)
        .ok_or_else(|| CertError::CaCertPem(format!("no `{BEGIN}` block")))?;
    let body = &pem[start + BEGIN.len()..];
    let end = body
        .find(END)
        .ok_or_else(|| CertError::CaCertPem(format!("no `{END}` after `{BEGIN}`")))?;
    let b64: String = body[..end].chars().filter(|c| !c.is_whitespace()).collect();
    serde_json::from_value::<ByteString>(Value::String(b64))
        .map(|b| b.0)
        .map_err(|e| CertError::CaCertPem(format!("bad base64: {e}")))
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

/// A minimal DER reader for what a CA needs: no general ASN.1, just the certificate fields
/// used above. Errors are short descriptions.
mod der {
    pub struct Tlv<'a> {
        pub tag: u8,
        pub content: &'a [u8],
        /// Tag, length and content.
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

        pub fn read(&mut self) -> Result<Tlv<'a>, String> {
            let input = self.rest;
            let (&tag, after_tag) = input.split_first().ok_or("unexpected end of data")?;
            if tag & 0x1f == 0x1f {
                return Err(format!("unsupported high tag number form (tag {tag:#04x})"));
            }
            let (&first, mut after_len) = after_tag.split_first().ok_or("missing length")?;
            let len = if first < 0x80 {
                usize::from(first)
            } else {
                let n = usize::from(first & 0x7f);
                if n == 0 || n > 4 {
                    return Err("unsupported length form".to_string());
                }
                let bytes = after_len.get(..n).ok_or("truncated length")?;
                after_len = &after_len[n..];
                bytes
                    .iter()
                    .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
            };
            let content = after_len.get(..len).ok_or("truncated content")?;
            let header = input.len() - after_len.len();
            let raw = &input[..header + len];
            self.rest = &after_len[len..];
            Ok(Tlv { tag, content, raw })
        }

        pub fn read_tag(&mut self, tag: u8, what: &str) -> Result<Tlv<'a>, String> {
            let tlv = self.read().map_err(|e| format!("{what}: {e}"))?;
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
    pub fn time(tlv: &Tlv<'_>) -> Result<i64, String> {
        let s = std::str::from_utf8(tlv.content).map_err(|_| "time is not ASCII")?;
        let digits = s.strip_suffix('Z').ok_or("time is not in UTC (Z)")?;
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad time {s:?}"));
        }
        let num = |r: std::ops::Range<usize>| -> Result<u32, String> {
            digits
                .get(r)
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| format!("bad time {s:?}"))
        };
        let (year, rest) = match (tlv.tag, digits.len()) {
            (0x17, 12) => {
                let yy = i64::from(num(0..2)?);
                (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
            }
            (0x18, 14) => (i64::from(num(0..4)?), 4),
            _ => return Err(format!("unsupported time {s:?}")),
        };
        let (month, day) = (num(rest..rest + 2)?, num(rest + 2..rest + 4)?);
        let (h, m, sec) = (
            num(rest + 4..rest + 6)?,
            num(rest + 6..rest + 8)?,
            num(rest + 8..rest + 10)?,
        );
        if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
            return Err(format!("bad time {s:?}"));
        }
        let days = super::days_from_civil(year, month, day);
        Ok(days * 86_400 + i64::from(h * 3600 + m * 60 + sec))
    }
}

/// The fields of an X.509 certificate a CA is judged by.
mod x509 {
    use super::der::{self, Reader};
    use super::{
        BmpString, DistinguishedName, DnType, DnValue, Ia5String, PrintableString, TeletexString,
        UniversalString,
    };

    const OID_BASIC_CONSTRAINTS: &[u64] = &[2, 5, 29, 19];
    const OID_KEY_USAGE: &[u64] = &[2, 5, 29, 15];
    const OID_SUBJECT_KEY_ID: &[u64] = &[2, 5, 29, 14];

    pub struct Parsed<'a> {
        /// The whole issuer Name (tag, length, content), as signed.
        pub issuer_der: &'a [u8],
        /// The whole subject Name, and its content.
        pub subject_der: &'a [u8],
        pub subject_content: &'a [u8],
        pub not_before: i64,
        pub not_after: i64,
        /// The subjectPublicKey bits (for EC the point, for RSA the PKCS#1 key).
        pub public_key: &'a [u8],
        /// basicConstraints cA; `None` without the extension.
        pub ca: Option<bool>,
        /// keyUsage keyCertSign; `None` without the extension.
        pub key_cert_sign: Option<bool>,
        pub subject_key_id: Option<Vec<u8>>,
    }

    pub fn parse(der: &[u8]) -> Result<Parsed<'_>, String> {
        let mut top = Reader::new(der);
        let cert = top.read_tag(0x30, "Certificate")?;
        let mut cert = Reader::new(cert.content);
        let tbs = cert.read_tag(0x30, "tbsCertificate")?;
        let mut tbs = Reader::new(tbs.content);
        if tbs.peek_tag() == Some(0xa0) {
            tbs.read()?; // version
        }
        tbs.read_tag(0x02, "serialNumber")?;
        tbs.read_tag(0x30, "signature")?;
        let issuer = tbs.read_tag(0x30, "issuer")?;
        let validity = tbs.read_tag(0x30, "validity")?;
        let mut validity = Reader::new(validity.content);
        let not_before = der::time(&validity.read()?)?;
        let not_after = der::time(&validity.read()?)?;
        let subject = tbs.read_tag(0x30, "subject")?;
        let spki = tbs.read_tag(0x30, "subjectPublicKeyInfo")?;
        let mut spki = Reader::new(spki.content);
        spki.read_tag(0x30, "algorithm")?;
        let bits = spki.read_tag(0x03, "subjectPublicKey")?;
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
            let field = tbs.read()?;
            if field.tag != 0xa3 {
                continue; // issuerUniqueID, subjectUniqueID
            }
            let exts = Reader::new(field.content).read_tag(0x30, "extensions")?;
            let mut exts = Reader::new(exts.content);
            while !exts.is_empty() {
                let ext = exts.read_tag(0x30, "extension")?;
                let mut ext = Reader::new(ext.content);
                let oid = der::oid(ext.read_tag(0x06, "extnID")?.content)?;
                if ext.peek_tag() == Some(0x01) {
                    ext.read()?; // critical
                }
                let value = ext.read_tag(0x04, "extnValue")?.content;
                if oid == OID_BASIC_CONSTRAINTS {
                    let seq = Reader::new(value).read_tag(0x30, "basicConstraints")?;
                    let mut seq = Reader::new(seq.content);
                    let ca = if seq.peek_tag() == Some(0x01) {
                        seq.read()?.content.first().is_some_and(|&b| b != 0)
                    } else {
                        false
                    };
                    parsed.ca = Some(ca);
                } else if oid == OID_KEY_USAGE {
                    let bits = Reader::new(value).read_tag(0x03, "keyUsage")?;
                    // Bit 5 (keyCertSign) of the first byte after the unused-bits count.
                    let first = bits.content.get(1).copied().unwrap_or(0);
                    parsed.key_cert_sign = Some(first & 0x04 != 0);
                } else if oid == OID_SUBJECT_KEY_ID {
                    let id = Reader::new(value).read_tag(0x04, "subjectKeyIdentifier")?;
                    parsed.subject_key_id = Some(id.content.to_vec());
                }
            }
        }
        Ok(parsed)
    }

    /// A Name's content as rcgen's DistinguishedName, one attribute per RDN, each type once
    /// (what rcgen can write back).
    pub fn distinguished_name(content: &[u8]) -> Result<DistinguishedName, String> {
        let mut dn = DistinguishedName::new();
        let mut rdns = Reader::new(content);
        while !rdns.is_empty() {
            let set = rdns.read_tag(0x31, "subject RDN")?;
            let mut set = Reader::new(set.content);
            let atv = set.read_tag(0x30, "subject attribute")?;
            if !set.is_empty() {
                return Err("its subject has a multi-valued RDN, which is not supported".into());
            }
            let mut atv = Reader::new(atv.content);
            let ty = DnType::from_oid(&der::oid(atv.read_tag(0x06, "attribute type")?.content)?);
            let value = atv.read()?;
            let text = || {
                std::str::from_utf8(value.content)
                    .map(str::to_string)
                    .map_err(|_| "its subject has a non-UTF-8 string".to_string())
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

    use std::sync::atomic::{AtomicUsize, Ordering};

    /// 2026-08-01T00:00:00Z.
    const NOW: i64 = 1_785_542_400;
    const DAY: i64 = SECS_PER_DAY;

    fn request() -> Request {
        Request {
            service: DEFAULT_SERVICE.to_string(),
            namespace: DEFAULT_NAMESPACE.to_string(),
            extra_names: vec![],
            days: DEFAULT_DAYS,
            ca: None,
        }
    }

    /// A fresh directory under the system temp dir, removed by the guard.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "quorumguard-certs-unit-{tag}-{}-{n}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn pem_der(pem: &str) -> Vec<u8> {
        pem_certificate(pem).expect("PEM certificate")
    }

    fn leaf_of(bundle: &Bundle) -> String {
        let end = "-----END CERTIFICATE-----\n";
        let i = bundle.chain_pem.find(end).expect("a certificate") + end.len();
        bundle.chain_pem[..i].to_string()
    }

    #[test]
    fn service_names_cover_every_form_the_api_server_may_dial() {
        let names = service_dns_names("quorumguard-webhook", "quorumguard-system", &[]).unwrap();
        assert_eq!(
            names,
            [
                "quorumguard-webhook",
                "quorumguard-webhook.quorumguard-system",
                "quorumguard-webhook.quorumguard-system.svc",
                "quorumguard-webhook.quorumguard-system.svc.cluster.local",
            ]
        );
        let extra = vec![
            "webhook.example.com".to_string(),
            "*.apps.example.com".to_string(),
            "10.0.0.7".to_string(),
            "fd00::7".to_string(),
            "webhook.example.com".to_string(),
            "svc.ns".to_string(),
        ];
        let names = service_dns_names("svc", "ns", &extra).unwrap();
        assert_eq!(
            names[4..],
            [
                "webhook.example.com",
                "*.apps.example.com",
                "10.0.0.7",
                "fd00::7"
            ],
            "extras keep their order, without duplicates"
        );
    }

    #[test]
    fn bad_names_are_refused_with_the_flag_named() {
        for (svc, ns, extra, flag) in [
            ("Webhook", "ns", "", "--service"),
            ("-svc", "ns", "", "--service"),
            ("", "ns", "", "--service"),
            ("svc", "ns_1", "", "--namespace"),
            ("svc", &"n".repeat(64), "", "--namespace"),
            ("svc", "ns", "bad..name", "--dns-name"),
            ("svc", "ns", "UPPER.example.com", "--dns-name"),
            ("svc", "ns", "a.*.example.com", "--dns-name"),
            ("svc", "ns", "space name", "--dns-name"),
        ] {
            let extra: Vec<String> = (!extra.is_empty())
                .then(|| extra.to_string())
                .into_iter()
                .collect();
            let err = service_dns_names(svc, ns, &extra).unwrap_err();
            assert!(
                matches!(&err, CertError::InvalidName { what, .. } if *what == flag),
                "{svc} {ns} {extra:?}: {err}"
            );
        }
        let long = format!("{}.com", vec!["a".repeat(63); 4].join("."));
        assert!(service_dns_names("svc", "ns", &[long]).is_err());
    }

    #[test]
    fn generate_makes_a_new_ca_and_a_chain_with_exact_validity() {
        let bundle = generate(&request(), NOW).unwrap();
        let ca_der = pem_der(&bundle.ca_cert_pem);
        let ca = x509::parse(&ca_der).unwrap();
        assert_eq!(ca.ca, Some(true));
        assert_eq!(ca.key_cert_sign, Some(true));
        assert_eq!(ca.not_before, NOW - BACKDATE_SECS);
        assert_eq!(ca.not_after, NOW + 3650 * DAY);
        assert_eq!(ca.issuer_der, ca.subject_der, "self-signed");
        assert_eq!(bundle.ca_not_after, NOW + 3650 * DAY);

        let leaf_der = pem_der(&leaf_of(&bundle));
        let leaf = x509::parse(&leaf_der).unwrap();
        assert_eq!(leaf.ca, Some(false));
        assert_eq!(leaf.key_cert_sign, Some(false));
        assert_eq!(leaf.not_before, NOW - BACKDATE_SECS);
        assert_eq!(leaf.not_after, NOW + 365 * DAY);
        assert_eq!(bundle.not_after, NOW + 365 * DAY);
        assert_eq!(leaf.issuer_der, ca.subject_der);
        assert_ne!(leaf.public_key, ca.public_key);

        // tls.crt is the leaf, then the CA.
        assert_eq!(bundle.chain_pem.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(bundle.chain_pem.ends_with(&bundle.ca_cert_pem));
        // Both keys are PKCS#8 and usable.
        let ca_key = bundle.new_ca_key_pem.as_deref().expect("new CA key");
        assert_eq!(
            KeyPair::from_pem(ca_key).unwrap().der_bytes(),
            ca.public_key
        );
        assert_eq!(
            KeyPair::from_pem(&bundle.key_pem).unwrap().der_bytes(),
            leaf.public_key
        );
        let names: Vec<&str> = bundle.dns_names.iter().map(String::as_str).collect();
        assert_eq!(names[2], "quorumguard-webhook.quorumguard-system.svc");
    }

    #[test]
    fn the_common_name_is_the_service_name_unless_too_long() {
        let cn_of = |req: &Request| {
            let bundle = generate(req, NOW).unwrap();
            let der = pem_der(&leaf_of(&bundle));
            let parsed = x509::parse(&der).unwrap();
            let dn = x509::distinguished_name(parsed.subject_content).unwrap();
            match dn.get(&DnType::CommonName) {
                Some(DnValue::Utf8String(cn)) => cn.clone(),
                other => panic!("CN {other:?}"),
            }
        };
        assert_eq!(
            cn_of(&request()),
            "quorumguard-webhook.quorumguard-system.svc"
        );
        let long = Request {
            service: "guard".to_string(),
            namespace: "n".repeat(60),
            ..request()
        };
        assert_eq!(cn_of(&long), "guard");
    }

    #[test]
    fn days_bound_the_serving_certificate() {
        for days in [1, 30, 3650] {
            let bundle = generate(&Request { days, ..request() }, NOW).unwrap();
            assert_eq!(bundle.not_after, NOW + i64::from(days) * DAY);
        }
        for days in [0, 3651] {
            let err = generate(&Request { days, ..request() }, NOW).unwrap_err();
            assert!(
                matches!(err, CertError::InvalidDays(d) if d == days),
                "{err}"
            );
        }
    }

    #[test]
    fn a_given_ca_is_reused_and_keeps_the_ca_bundle() {
        let first = generate(&request(), NOW).unwrap();
        let ca_key = first.new_ca_key_pem.clone().unwrap();
        let later = NOW + 300 * DAY;
        let second = generate(
            &Request {
                ca: Some((first.ca_cert_pem.clone(), ca_key)),
                ..request()
            },
            later,
        )
        .unwrap();
        assert_eq!(second.ca_cert_pem, first.ca_cert_pem);
        assert_eq!(second.ca_bundle().unwrap(), first.ca_bundle().unwrap());
        assert!(
            second.new_ca_key_pem.is_none(),
            "a given CA key is not rewritten"
        );
        let ca_der = pem_der(&first.ca_cert_pem);
        let ca = x509::parse(&ca_der).unwrap();
        let leaf_der = pem_der(&leaf_of(&second));
        let leaf = x509::parse(&leaf_der).unwrap();
        assert_eq!(leaf.issuer_der, ca.subject_der);
        assert_eq!(leaf.not_after, later + 365 * DAY);
        assert_ne!(leaf_of(&second), leaf_of(&first));
        let files: Vec<&str> = second.files().iter().map(|f| f.name).collect();
        assert_eq!(files, [CA_CERT_FILE, CERT_FILE, KEY_FILE]);
    }

    #[test]
    fn a_foreign_ca_subject_with_other_string_types_is_reproduced_exactly() {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CountryName,
            DnValue::PrintableString(PrintableString::try_from("DE").unwrap()),
        );
        dn.push(DnType::OrganizationName, "Kräftig GmbH");
        dn.push(
            DnType::CustomDnType(vec![1, 2, 840, 113_549, 1, 9, 1]),
            DnValue::Ia5String(Ia5String::try_from("ops@example.com").unwrap()),
        );
        dn.push(DnType::CommonName, "Platform CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        set_validity(&mut params, NOW - DAY, NOW + 1000 * DAY);
        let cert = params.self_signed(&key).unwrap();
        let ca = CertificateAuthority::from_pem(&cert.pem(), &key.serialize_pem(), NOW).unwrap();
        let names = vec!["a.b.svc".to_string()];
        let leaf = ca.issue("a.b.svc", &names, 30, NOW).unwrap();
        let leaf_der = pem_der(&leaf.cert_pem);
        let parsed = x509::parse(&leaf_der).unwrap();
        let ca_parsed = x509::parse(cert.der()).unwrap();
        assert_eq!(parsed.issuer_der, ca_parsed.subject_der);
    }

    #[test]
    fn a_ca_without_key_usage_or_with_an_empty_key_id_is_still_usable() {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_identifier_method = KeyIdMethod::PreSpecified(vec![]);
        set_validity(&mut params, NOW - DAY, NOW + 1000 * DAY);
        let cert = params.self_signed(&key).unwrap();
        let ca = CertificateAuthority::from_pem(&cert.pem(), &key.serialize_pem(), NOW).unwrap();
        ca.issue("x", &["x".to_string()], 30, NOW).unwrap();
    }

    #[test]
    fn a_wrong_or_unusable_ca_is_refused_with_the_reason() {
        let a = generate(&request(), NOW).unwrap();
        let b = generate(&request(), NOW).unwrap();
        let a_key = a.new_ca_key_pem.clone().unwrap();
        let b_key = b.new_ca_key_pem.clone().unwrap();

        let err = CertificateAuthority::from_pem(&a.ca_cert_pem, &b_key, NOW).unwrap_err();
        assert!(matches!(err, CertError::CaKeyMismatch), "{err}");

        // A serving certificate is not a CA.
        let err = CertificateAuthority::from_pem(&leaf_of(&a), &a.key_pem, NOW).unwrap_err();
        assert!(matches!(err, CertError::NotCa(_)), "{err}");
        // A self-signed certificate without basicConstraints is not a CA either.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let plain = CertificateParams::new(vec!["x".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let err =
            CertificateAuthority::from_pem(&plain.pem(), &key.serialize_pem(), NOW).unwrap_err();
        assert!(matches!(err, CertError::NotCa("missing")), "{err}");

        // Expired, and not yet valid.
        let err =
            CertificateAuthority::from_pem(&a.ca_cert_pem, &a_key, NOW + 3651 * DAY).unwrap_err();
        assert!(
            matches!(err, CertError::CaValidity(ref m) if m.contains("expired")),
            "{err}"
        );
        let err =
            CertificateAuthority::from_pem(&a.ca_cert_pem, &a_key, NOW - 2 * DAY).unwrap_err();
        assert!(
            matches!(err, CertError::CaValidity(ref m) if m.contains("before")),
            "{err}"
        );

        // The CA would expire before the serving certificate.
        let err = generate(
            &Request {
                ca: Some((a.ca_cert_pem.clone(), a_key.clone())),
                ..request()
            },
            NOW + 3600 * DAY,
        )
        .unwrap_err();
        assert!(matches!(err, CertError::CaExpiresFirst { .. }), "{err}");
        assert!(err.to_string().contains("--days"), "{err}");

        // Key formats ring cannot read get a conversion hint.
        for label in ["EC PRIVATE KEY", "RSA PRIVATE KEY", "ENCRYPTED PRIVATE KEY"] {
            let key = format!("-----BEGIN {label}-----\nAAAA\n-----END {label}-----\n");
            let err = CertificateAuthority::from_pem(&a.ca_cert_pem, &key, NOW).unwrap_err();
            assert!(matches!(err, CertError::CaKey(_)), "{err}");
            assert!(err.to_string().contains("openssl pkcs8 -topk8"), "{err}");
        }
        let err = CertificateAuthority::from_pem(&a.ca_cert_pem, "garbage", NOW).unwrap_err();
        assert!(matches!(err, CertError::CaKey(_)), "{err}");

        // Not a certificate at all, or a broken one.
        let err = CertificateAuthority::from_pem(&a_key, &a_key, NOW).unwrap_err();
        assert!(matches!(err, CertError::CaCertPem(_)), "{err}");
        let mut der = pem_der(&a.ca_cert_pem);
        der.truncate(der.len() / 2);
        let truncated = certificate_pem(&der).unwrap();
        let err = CertificateAuthority::from_pem(&truncated, &a_key, NOW).unwrap_err();
        assert!(matches!(err, CertError::CaCertDer(_)), "{err}");
    }

    #[test]
    fn the_ca_pem_is_cleaned_of_surrounding_text() {
        let a = generate(&request(), NOW).unwrap();
        let key = a.new_ca_key_pem.clone().unwrap();
        let noisy = format!("Certificate:\n  Data: ...\n{}{key}", a.ca_cert_pem);
        let ca = CertificateAuthority::from_pem(&noisy, &key, NOW).unwrap();
        assert_eq!(ca.cert_pem(), a.ca_cert_pem);
    }

    #[test]
    fn a_broken_clock_is_refused() {
        for now in [0, MIN_NOW - 1, MAX_NOW + 1] {
            let err = generate(&request(), now).unwrap_err();
            assert!(matches!(err, CertError::Clock(n) if n == now), "{err}");
        }
    }

    #[test]
    fn ca_bundle_is_kubernetes_base64_of_the_pem() {
        let bundle = generate(&request(), NOW).unwrap();
        let b64 = bundle.ca_bundle().unwrap();
        assert!(!b64.contains('\n'));
        let decoded: ByteString = serde_json::from_value(Value::String(b64)).unwrap();
        assert_eq!(decoded.0, bundle.ca_cert_pem.as_bytes());
        assert_eq!(ca_bundle("hi\n").unwrap(), "aGkK");
    }

    #[test]
    fn the_patch_sets_every_webhook_and_checks_each_name() {
        let names = vec![
            "machines.quorumguard.io".to_string(),
            "kcp.quorumguard.io".to_string(),
        ];
        let patch = ca_bundle_patch(&names, "Q0E=");
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/webhooks/0/name", "value": "machines.quorumguard.io"},
                {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="},
                {"op": "test", "path": "/webhooks/1/name", "value": "kcp.quorumguard.io"},
                {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "Q0E="},
            ])
        );
        let mut vwc = json!({"webhooks": [
            {"name": "machines.quorumguard.io", "clientConfig": {"caBundle": "b2xk"}},
            {"name": "kcp.quorumguard.io", "clientConfig": {"service": {"name": "s"}}},
        ]});
        let p: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
        json_patch::patch(&mut vwc, &p).unwrap();
        assert_eq!(vwc["webhooks"][0]["clientConfig"]["caBundle"], "Q0E=");
        assert_eq!(vwc["webhooks"][1]["clientConfig"]["caBundle"], "Q0E=");
        assert_eq!(vwc["webhooks"][1]["clientConfig"]["service"]["name"], "s");
        // Reordered since it was read: the patch fails instead of mixing them up.
        let mut reordered = json!({"webhooks": [
            {"name": "kcp.quorumguard.io", "clientConfig": {}},
            {"name": "machines.quorumguard.io", "clientConfig": {}},
        ]});
        assert!(json_patch::patch(&mut reordered, &p).is_err());
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[cfg(unix)]
    #[test]
    fn files_are_written_with_key_modes_and_never_overwritten_without_force() {
        let tmp = TempDir::new("write");
        let dir = tmp.0.join("out");
        let bundle = generate(&request(), NOW).unwrap();
        let paths = write_files(&dir, &bundle.files(), false).unwrap();
        let names: Vec<String> = paths
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [CA_CERT_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE]);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(CA_CERT_FILE)), 0o644);
        assert_eq!(mode(&dir.join(CA_KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.join(CERT_FILE)), 0o644);
        assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
        assert_eq!(
            fs::read_to_string(dir.join(CERT_FILE)).unwrap(),
            bundle.chain_pem
        );
        assert_eq!(
            fs::read_to_string(dir.join(KEY_FILE)).unwrap(),
            bundle.key_pem
        );

        // Only one file in the way: nothing at all is written, and the message names it.
        let other = generate(&request(), NOW).unwrap();
        let dir2 = tmp.0.join("out2");
        fs::create_dir_all(&dir2).unwrap();
        fs::write(dir2.join(KEY_FILE), "keep me").unwrap();
        let err = write_files(&dir2, &other.files(), false).unwrap_err();
        assert!(
            matches!(&err, CertError::Exists(p) if p == &[dir2.join(KEY_FILE)]),
            "{err}"
        );
        assert!(err.to_string().contains("--force"), "{err}");
        assert_eq!(fs::read_to_string(dir2.join(KEY_FILE)).unwrap(), "keep me");
        assert!(!dir2.join(CA_CERT_FILE).exists());

        // Without force the first run's files stay; with force they are replaced, and a key
        // that had been opened up gets its 0600 back.
        assert!(matches!(
            write_files(&dir, &other.files(), false),
            Err(CertError::Exists(p)) if p.len() == 4
        ));
        assert_eq!(
            fs::read_to_string(dir.join(KEY_FILE)).unwrap(),
            bundle.key_pem
        );
        fs::set_permissions(
            dir.join(KEY_FILE),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
        write_files(&dir, &other.files(), true).unwrap();
        assert_eq!(
            fs::read_to_string(dir.join(KEY_FILE)).unwrap(),
            other.key_pem
        );
        assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "no temporary files left behind");

        // --force replaces a symlink rather than writing through it.
        let target = tmp.0.join("elsewhere");
        fs::write(&target, "not a key").unwrap();
        fs::remove_file(dir.join(KEY_FILE)).unwrap();
        std::os::unix::fs::symlink(&target, dir.join(KEY_FILE)).unwrap();
        write_files(&dir, &other.files(), true).unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "not a key");
        assert!(
            !fs::symlink_metadata(dir.join(KEY_FILE))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn debug_output_never_shows_a_key() {
        let bundle = generate(&request(), NOW).unwrap();
        let ca = CertificateAuthority::generate(NOW).unwrap();
        let leaf = ca.issue("x", &["x".to_string()], 1, NOW).unwrap();
        for shown in [
            format!("{bundle:?}"),
            format!("{ca:?}"),
            format!("{leaf:?}"),
            format!("{:?}", bundle.files()),
        ] {
            assert!(!shown.contains("PRIVATE KEY"), "{shown}");
        }
    }

    #[test]
    fn kubectl_command_and_quoting() {
        assert_eq!(
            kubectl_create_secret(
                "quorumguard-webhook-tls",
                "quorumguard-system",
                Path::new("/tmp/qg/tls.crt"),
                Path::new("/tmp/my certs/tls.key"),
            ),
            "kubectl create secret tls quorumguard-webhook-tls -n quorumguard-system \
             --cert=/tmp/qg/tls.crt --key='/tmp/my certs/tls.key'"
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn calendar_arithmetic_matches_known_dates() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_time(NOW), "2026-08-01T00:00:00Z");
        assert_eq!(format_time(4_102_444_799), "2099-12-31T23:59:59Z");
        assert_eq!(format_time(-1), "1969-12-31T23:59:59Z");
        // Round trip over every day from 1950 to 2200.
        let (start, end) = (days_from_civil(1950, 1, 1), days_from_civil(2200, 1, 1));
        assert_eq!(end - start, 91_311);
        for day in start..end {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }

    #[test]
    fn der_times_follow_rfc_5280() {
        let time = |tag: u8, s: &str| {
            der::time(&der::Tlv {
                tag,
                content: s.as_bytes(),
                raw: &[],
            })
        };
        assert_eq!(time(0x17, "700101000000Z"), Ok(0));
        assert_eq!(
            time(0x17, "491231235959Z"),
            Ok(2_524_607_999),
            "YY < 50 is 20YY"
        );
        assert_eq!(
            time(0x17, "500101000000Z"),
            Ok(-631_152_000),
            "YY >= 50 is 19YY"
        );
        assert_eq!(time(0x18, "20500101000000Z"), Ok(2_524_608_000));
        for (tag, bad) in [
            (0x17, "700101000000"),
            (0x17, "7001010000Z"),
            (0x18, "700101000000Z"),
            (0x17, "701301000000Z"),
            (0x17, "70010100000aZ"),
            (0x04, "700101000000Z"),
        ] {
            assert!(time(tag, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn der_reader_handles_long_lengths_and_refuses_truncation() {
        let mut long = vec![0x04, 0x82, 0x01, 0x00];
        long.extend(std::iter::repeat_n(7u8, 256));
        let mut r = der::Reader::new(&long);
        let tlv = r.read().unwrap();
        assert_eq!(
            (tlv.tag, tlv.content.len(), tlv.raw.len()),
            (0x04, 256, 260)
        );
        assert!(r.is_empty());
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x05, 0x01],
            &[0x30, 0x80],
            &[0x30, 0x85, 1, 1, 1, 1, 1],
            &[0x1f, 0x01, 0x00],
        ] {
            assert!(der::Reader::new(bad).read().is_err(), "{bad:?}");
        }
        assert_eq!(der::oid(&[0x55, 0x1d, 0x13]), Ok(vec![2, 5, 29, 19]));
        assert_eq!(
            der::oid(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01]),
            Ok(vec![1, 2, 840, 113_549, 1, 9, 1])
        );
        assert!(der::oid(&[0x2a, 0x86]).is_err());
        assert!(der::oid(&[]).is_err());
    }
}
