//! The serving certificate for the webhook Service: its DNS names (checked as Kubernetes names),
//! the CA made or reused, and the [`Bundle`] of PEMs to write and print.

use std::net::IpAddr;

use super::files::OutputFile;
use super::{
    CA_CERT_FILE, CA_KEY_FILE, CERT_FILE, CLIENT_CA_CERT_FILE, CLIENT_CA_KEY_FILE,
    CLIENT_CERT_FILE, CLIENT_KEY_FILE, KEY_FILE,
};
use quorumguard_pki::certs::{self, Ca, CertError, format_time};

/// How to give `--ca-key` as PKCS#8.
const PKCS8_HINT: &str = "A PKCS#8 key (`-----BEGIN PRIVATE KEY-----`, ECDSA P-256/P-384, \
     Ed25519 or RSA) is needed; convert with `openssl pkcs8 -topk8 -nocrypt -in ca.key -out \
     ca.pk8.key`";

// The serving certificate for the webhook Service, and where it goes.

/// The names the API server may use for the Service: `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc`,
/// `<svc>.<ns>.svc.cluster.local`, then each extra name (a DNS name, `*.` wildcard allowed, or
/// an IP address), without duplicates, in that order.
pub(super) fn service_dns_names(
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

/// What `quorumguard certs` asks for.
#[derive(Clone, Debug)]
pub(super) struct Request {
    pub(super) service: String,
    pub(super) namespace: String,
    pub(super) extra_names: Vec<String>,
    pub(super) days: u32,
    /// An existing CA (certificate PEM, key PEM); `None` makes a new one.
    pub(super) ca: Option<(String, String)>,
}

/// Everything to write and print.
#[derive(Clone)]
pub(super) struct Bundle {
    /// The CA certificate: `ca.crt`, and the caBundle.
    pub(super) ca_cert_pem: String,
    /// The CA key, only when the CA is new (`ca.key`); a given CA's key stays where it is.
    pub(super) new_ca_key_pem: Option<String>,
    /// The serving certificate followed by the CA certificate: `tls.crt`.
    pub(super) chain_pem: String,
    /// `tls.key`.
    pub(super) key_pem: String,
    pub(super) dns_names: Vec<String>,
    pub(super) not_after: i64,
    pub(super) ca_not_after: i64,
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
pub(super) fn generate(req: &Request, now: i64) -> Result<Bundle, CertError> {
    certs::check_days(req.days)?;
    let dns_names = service_dns_names(&req.service, &req.namespace, &req.extra_names)?;
    let (ca, new_ca) = load_ca(req.ca.as_ref(), now)?;
    // `<svc>.<ns>.svc`, the name the API server dials; a CN is limited to 64 characters.
    let svc_name = format!("{}.{}.svc", req.service, req.namespace);
    let cn = if svc_name.len() <= 64 {
        svc_name.as_str()
    } else {
        req.service.as_str()
    };
    let leaf = ca.issue(cn, &dns_names, req.days, now)?;
    let chain_pem = chain(&leaf.cert_pem, ca.cert_pem());
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

/// The certificate followed by the CA's: what `tls.crt` and `client.crt` hold.
fn chain(leaf_pem: &str, ca_pem: &str) -> String {
    let mut chain = leaf_pem.to_string();
    if !chain.ends_with('\n') {
        chain.push('\n');
    }
    chain.push_str(ca_pem);
    chain
}

/// The CA given as (certificate PEM, key PEM), or a new one (`true`) when none is given.
fn load_ca(given: Option<&(String, String)>, now: i64) -> Result<(Ca, bool), CertError> {
    match given {
        Some((cert, key)) => {
            // The certificate's problems come first; then a key that is not PKCS#8 gets the
            // hint to convert it, even one the library could read.
            let ca = Ca::from_pem(cert, key);
            if matches!(
                ca,
                Ok(_) | Err(CertError::CaKey(_) | CertError::CaKeyMismatch)
            ) {
                require_pkcs8(key)?;
            }
            Ok((ca?, false))
        }
        None => Ok((Ca::generate(now)?, true)),
    }
}

/// The command asks for a PKCS#8 CA key, as its help says, and tells how to convert another
/// (the library reads PKCS#1 and SEC1 keys too).
fn require_pkcs8(pem: &str) -> Result<(), CertError> {
    let problem = [
        ("EC PRIVATE KEY", "it is a SEC1 EC key"),
        ("RSA PRIVATE KEY", "it is a PKCS#1 RSA key"),
        ("ENCRYPTED PRIVATE KEY", "it is encrypted"),
    ]
    .into_iter()
    .find(|(label, _)| pem.contains(&format!("-----BEGIN {label}-----")))
    .map(|(_, problem)| problem)
    .or((!pem.contains("-----BEGIN PRIVATE KEY-----"))
        .then_some("no `-----BEGIN PRIVATE KEY-----` block"));
    problem.map_or(Ok(()), |p| {
        Err(CertError::CaKey(format!("{p}. {PKCS8_HINT}")))
    })
}

impl Bundle {
    /// `ca.crt`, `ca.key` (new CA only), `tls.crt`, `tls.key`: keys 0600, certificates 0644.
    pub(super) fn files(&self) -> Vec<OutputFile> {
        pem_files(
            [CA_CERT_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE],
            &self.ca_cert_pem,
            self.new_ca_key_pem.as_deref(),
            &self.chain_pem,
            &self.key_pem,
        )
    }

    /// The `caBundle` value: base64 of the CA certificate's PEM.
    pub(super) fn ca_bundle(&self) -> Result<String, CertError> {
        certs::ca_bundle(&self.ca_cert_pem)
    }
}

// kube-apiserver's client certificate, for `serve --client-ca-file/--client-name`.

/// What `quorumguard certs --client NAME` asks for.
#[derive(Clone, Debug)]
pub(super) struct ClientRequest {
    /// The certificate's common name: what `serve --client-name` is given.
    pub(super) name: String,
    pub(super) days: u32,
    /// An existing client CA (certificate PEM, key PEM); `None` makes a new one.
    pub(super) ca: Option<(String, String)>,
}

/// The client CA and kube-apiserver's client certificate, to write.
#[derive(Clone)]
pub(super) struct ClientBundle {
    /// `client-ca.crt`: what serve's `--client-ca-file` reads.
    pub(super) ca_cert_pem: String,
    /// `client-ca.key`, only when the CA is new.
    pub(super) new_ca_key_pem: Option<String>,
    /// The client certificate followed by the CA certificate: `client.crt`.
    pub(super) chain_pem: String,
    /// `client.key`.
    pub(super) key_pem: String,
    pub(super) not_after: i64,
    pub(super) ca_not_after: i64,
}

impl std::fmt::Debug for ClientBundle {
    /// Leaves the keys out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBundle")
            .field("new_ca", &self.new_ca_key_pem.is_some())
            .field("not_after", &format_time(self.not_after))
            .field("ca_not_after", &format_time(self.ca_not_after))
            .finish_non_exhaustive()
    }
}

/// Makes (or loads) the client CA and issues a client certificate (extended key usage
/// clientAuth only) with the subject `CN=<name>`. Refused if the CA would expire first.
pub(super) fn generate_client(req: &ClientRequest, now: i64) -> Result<ClientBundle, CertError> {
    certs::check_days(req.days)?;
    let (ca, new_ca) = load_ca(req.ca.as_ref(), now)?;
    let validity = u64::from(req.days) * SECS_PER_DAY;
    let wanted = now.saturating_add(i64::try_from(validity).unwrap_or(i64::MAX));
    if wanted > ca.not_after() {
        return Err(CertError::CaExpiresFirst {
            ca: format_time(ca.not_after()),
            leaf: format_time(wanted),
        });
    }
    let leaf = ca.sign_client(&req.name, std::time::Duration::from_secs(validity), now)?;
    let chain_pem = chain(&leaf.cert_pem, ca.cert_pem());
    Ok(ClientBundle {
        ca_cert_pem: ca.cert_pem().to_string(),
        new_ca_key_pem: new_ca.then(|| ca.key_pem().to_string()),
        chain_pem,
        key_pem: leaf.key_pem,
        not_after: leaf.not_after,
        ca_not_after: ca.not_after(),
    })
}

/// Seconds in a day, for `--days`.
const SECS_PER_DAY: u64 = 86_400;

impl ClientBundle {
    /// `client-ca.crt`, `client-ca.key` (new CA only), `client.crt`, `client.key`: keys 0600,
    /// certificates 0644.
    pub(super) fn files(&self) -> Vec<OutputFile> {
        pem_files(
            [
                CLIENT_CA_CERT_FILE,
                CLIENT_CA_KEY_FILE,
                CLIENT_CERT_FILE,
                CLIENT_KEY_FILE,
            ],
            &self.ca_cert_pem,
            self.new_ca_key_pem.as_deref(),
            &self.chain_pem,
            &self.key_pem,
        )
    }
}

/// The files named `[ca cert, ca key, chain, key]`: the CA key only when given (a new CA);
/// keys 0600, certificates 0644.
fn pem_files(
    names: [&'static str; 4],
    ca_cert: &str,
    new_ca_key: Option<&str>,
    chain: &str,
    key: &str,
) -> Vec<OutputFile> {
    let [ca_cert_name, ca_key_name, chain_name, key_name] = names;
    let file = |name, contents: &str, mode| OutputFile {
        name,
        contents: contents.to_string(),
        mode,
    };
    let mut files = vec![file(ca_cert_name, ca_cert, 0o644)];
    if let Some(ca_key) = new_ca_key {
        files.push(file(ca_key_name, ca_key, 0o600));
    }
    files.push(file(chain_name, chain, 0o644));
    files.push(file(key_name, key, 0o600));
    files
}
