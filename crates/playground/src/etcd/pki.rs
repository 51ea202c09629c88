//! [`Pki`]: the cluster's CA, shaped like Cluster API's `<cluster>-etcd` Secret, its server and
//! peer certificates, and etcdctl's client certificate.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use rcgen::string::PrintableString;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, DnValue,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::EtcdError;
use quorumguard_pki::etcd::sign_client_cert;

/// The certificates of a cluster.
pub struct Pki {
    /// The etcd CA, as in Secret `<cluster>-etcd` (`tls.crt`, `tls.key`).
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub(super) ca_crt: PathBuf,
    pub(super) server_crt: PathBuf,
    pub(super) server_key: PathBuf,
    pub(super) peer_crt: PathBuf,
    pub(super) peer_key: PathBuf,
    /// etcdctl's client certificate (signed with quorumguard's own signer).
    pub(super) client_crt: PathBuf,
    pub(super) client_key: PathBuf,
}

/// The CA (Cluster API-shaped), server and peer certificates, and etcdctl's client certificate.
pub(super) fn make_pki(dir: &Path) -> Result<Pki, EtcdError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| EtcdError::Pki(format!("{what}: {e}"));
    // RSA key generation needs aws-lc in rcgen; ring only signs. Cluster API writes PKCS#1.
    let ca_key_file = dir.join("ca.key");
    let ca_pk8_file = dir.join("ca.pk8");
    run(Command::new("openssl")
        .args(["genrsa", "-traditional", "-out"])
        .arg(&ca_key_file)
        .arg("2048"))?;
    run(Command::new("openssl")
        .args(["pkcs8", "-topk8", "-nocrypt", "-in"])
        .arg(&ca_key_file)
        .arg("-out")
        .arg(&ca_pk8_file))?;
    let ca_key_pem = read(&ca_key_file)?;
    if !ca_key_pem.contains("BEGIN RSA PRIVATE KEY") {
        return Err(EtcdError::Pki(format!(
            "openssl genrsa -traditional wrote no PKCS#1 key to {}",
            ca_key_file.display()
        )));
    }
    let ca_key =
        KeyPair::from_pem(&read(&ca_pk8_file)?).map_err(|e| failed("reading the CA key", &e))?;

    let now = SystemTime::now();
    let mut ca = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    let ca_name = PrintableString::try_from("etcd-ca").map_err(|e| failed("the CA's name", &e))?;
    dn.push(DnType::CommonName, DnValue::PrintableString(ca_name));
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    ca.not_before = (now - Duration::from_secs(3600)).into();
    ca.not_after = (now + Duration::from_secs(10 * 86_400)).into();
    let ca_cert_pem = ca
        .self_signed(&ca_key)
        .map_err(|e| failed("self-signing the CA", &e))?
        .pem();
    let issuer = Issuer::new(ca, ca_key);

    let localhost: rcgen::string::Ia5String = "localhost"
        .try_into()
        .map_err(|e| failed("the DNS name localhost", &e))?;
    let leaf = |cn: &str| -> Result<(String, String), EtcdError> {
        let key = KeyPair::generate().map_err(|e| failed("generating a key", &e))?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        p.distinguished_name = dn;
        p.subject_alt_names = vec![
            SanType::IpAddress([127, 0, 0, 1].into()),
            SanType::DnsName(localhost.clone()),
        ];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // etcd 3.4's gRPC gateway dials its own client port with the server certificate.
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.use_authority_key_identifier_extension = true;
        p.not_before = (now - Duration::from_secs(3600)).into();
        p.not_after = (now + Duration::from_secs(10 * 86_400)).into();
        let cert = p
            .signed_by(&key, &issuer)
            .map_err(|e| failed(&format!("signing the {cn} certificate"), &e))?;
        Ok((cert.pem(), key.serialize_pem()))
    };
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        fs::write(&path, text).map_err(|source| EtcdError::Io {
            what: "writing",
            path: path.clone(),
            source,
        })?;
        Ok::<_, EtcdError>(path)
    };
    let (server_crt, server_key) = leaf("etcd-server")?;
    let (peer_crt, peer_key) = leaf("etcd-peer")?;
    let client = sign_client_cert(&ca_cert_pem, &ca_key_pem, "etcdctl", now)
        .map_err(|e| failed("signing etcdctl's client certificate", &e))?;
    Ok(Pki {
        ca_crt: write("ca.crt", &ca_cert_pem)?,
        server_crt: write("server.crt", &server_crt)?,
        server_key: write("server.key", &server_key)?,
        peer_crt: write("peer.crt", &peer_crt)?,
        peer_key: write("peer.key", &peer_key)?,
        client_crt: write("client.crt", &client.cert_pem)?,
        client_key: write("client.key", &client.key_pem)?,
        ca_cert_pem,
        ca_key_pem,
    })
}

fn read(path: &Path) -> Result<String, EtcdError> {
    fs::read_to_string(path).map_err(|source| EtcdError::Io {
        what: "reading",
        path: path.to_path_buf(),
        source,
    })
}

/// Runs a command to its end; its failure, with stderr, is an error.
fn run(cmd: &mut Command) -> Result<(), EtcdError> {
    let out = cmd
        .output()
        .map_err(|e| EtcdError::Pki(format!("{cmd:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(EtcdError::Pki(format!(
            "{cmd:?} ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}
