//! What [`super::RealApi::start_with`] launches: the files the two processes read (the run's
//! certificates, the service-account key, the audit policy), and etcd and kube-apiserver
//! spawned with their flags on free loopback ports.

use std::path::{Path, PathBuf};

use rcgen::ExtendedKeyUsagePurpose;

use super::{Assets, Pair, Proc, RealApiError, free_port, pki};

/// The run's CA and admin certificate, and the paths of the files kube-apiserver is given.
pub(super) struct Files {
    pub(super) ca: pki::Ca,
    pub(super) admin: Pair,
    ca_file: String,
    cert_file: String,
    key_file: String,
    sa_private: String,
    sa_public: String,
    /// The audit policy.
    policy: String,
    /// Where kube-apiserver writes its audit log.
    pub(super) audit_log: PathBuf,
}

/// Writes `text` to `dir/name`; returns the path as text, for a flag.
pub(super) fn write_file(dir: &Path, name: &str, text: &str) -> Result<String, RealApiError> {
    let path = dir.join(name);
    match std::fs::write(&path, text) {
        Ok(()) => Ok(path.display().to_string()),
        Err(source) => Err(RealApiError::Write { path, source }),
    }
}

/// Makes `dir/etcd` (etcd's data), a CA for the run and the certificates it signs (the API
/// server's serving certificate, the admin's client certificate), a service-account key, and
/// an audit policy, and writes them into `dir`.
pub(super) fn write_files(dir: &Path) -> Result<Files, RealApiError> {
    let mkdir = |path: PathBuf| {
        std::fs::create_dir_all(&path).map_err(|source| RealApiError::Write { path, source })
    };
    mkdir(dir.join("etcd"))?;
    let write = |name: &str, text: &str| write_file(dir, name, text);
    let ca = pki::Ca::new()?;
    let serving = ca.loopback_server("kube-apiserver", &["kubernetes.default.svc"])?;
    let admin = ca.sign(
        "envtest-admin",
        &["system:masters"],
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    let sa_key = rcgen::KeyPair::generate().map_err(|e| RealApiError::Certs(e.to_string()))?;
    let ca_file = write("ca.crt", &ca.pem)?;
    let cert_file = write("apiserver.crt", &serving.0)?;
    let key_file = write("apiserver.key", &serving.1)?;
    let sa_private = write("sa.key", &sa_key.serialize_pem())?;
    let sa_public = write("sa.pub", &sa_key.public_key_pem())?;
    // Metadata for every request but the server's own loopback traffic.
    let policy = write(
        "audit-policy.yaml",
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: None\n  users: [\"system:apiserver\"]\n- level: Metadata\n",
    )?;
    let audit_log = dir.join("audit.log");
    Ok(Files {
        ca,
        admin,
        ca_file,
        cert_file,
        key_file,
        sa_private,
        sa_public,
        policy,
        audit_log,
    })
}

/// Spawns `program` with `args`, its output into `dir/log`.
fn spawn(program: &Path, args: &[String], dir: &Path, log: &str) -> Result<Proc, RealApiError> {
    Proc::spawn(program, args, &dir.join(log)).map_err(|source| RealApiError::Spawn {
        program: program.to_path_buf(),
        source,
    })
}

/// Spawns the API server's etcd (one member, plain HTTP, data in `dir/etcd`) on free ports:
/// the process, its client port and its client URL.
pub(super) fn spawn_etcd(assets: &Assets, dir: &Path) -> Result<(Proc, u16, String), RealApiError> {
    let etcd_port = free_port()?;
    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let peer_url = format!("http://127.0.0.1:{}", free_port()?);
    let etcd = spawn(
        &assets.etcd,
        &[
            "--name=envtest".to_string(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=envtest={peer_url}"),
            "--logger=zap".to_string(),
            "--log-outputs=stderr".to_string(),
        ],
        dir,
        "etcd.log",
    )?;
    Ok((etcd, etcd_port, etcd_url))
}

/// Spawns kube-apiserver on a free port over the etcd at `etcd_url`, with `files`, RBAC, the
/// admission webhooks and the audit log, and `extra` flags after the usual ones: the process
/// and its URL.
pub(super) fn spawn_apiserver(
    assets: &Assets,
    dir: &Path,
    etcd_url: &str,
    files: &Files,
    extra: &[String],
) -> Result<(Proc, String), RealApiError> {
    let port = free_port()?;
    let url = format!("https://127.0.0.1:{port}");
    let apiserver = spawn(
        &assets.kube_apiserver,
        &[
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
            "--advertise-address=127.0.0.1".to_string(),
            "--endpoint-reconciler-type=none".to_string(),
            format!("--cert-dir={}", dir.display()),
            format!("--tls-cert-file={}", files.cert_file),
            format!("--tls-private-key-file={}", files.key_file),
            format!("--client-ca-file={}", files.ca_file),
            "--authorization-mode=Node,RBAC".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", files.sa_public),
            format!("--service-account-signing-key-file={}", files.sa_private),
            "--service-cluster-ip-range=10.96.0.0/12".to_string(),
            "--enable-admission-plugins=NamespaceLifecycle,ValidatingAdmissionWebhook,\
             MutatingAdmissionWebhook"
                .to_string(),
            "--allow-privileged=true".to_string(),
            format!("--audit-policy-file={}", files.policy),
            format!("--audit-log-path={}", files.audit_log.display()),
            "--audit-log-format=json".to_string(),
        ]
        .into_iter()
        .chain(extra.iter().cloned())
        .collect::<Vec<_>>(),
        dir,
        "kube-apiserver.log",
    )?;
    Ok((apiserver, url))
}
