//! `quorumguard certs`, run as a user runs it: the built binary writes files into a temporary
//! directory, and OpenSSL, rustls and a stand-in API server judge the result.
//!
//! Needs the `openssl` command (Debian's `openssl`). Everything listens on 127.0.0.1 only, and
//! every wait is bounded.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_quorumguard");
/// The longest a single run of the binary may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
const IO_TIMEOUT: Duration = Duration::from_secs(10);

const SERVICE_NAMES: [&str; 4] = [
    "quorumguard-webhook",
    "quorumguard-webhook.quorumguard-system",
    "quorumguard-webhook.quorumguard-system.svc",
    "quorumguard-webhook.quorumguard-system.svc.cluster.local",
];

/// Environment the binary must not inherit: its own env twins and proxies (the stand-in API
/// server is on 127.0.0.1).
const SCRUB_ENV: [&str; 14] = [
    "QUORUMGUARD_CERTS_OUT_DIR",
    "QUORUMGUARD_CERTS_SERVICE",
    "QUORUMGUARD_CERTS_NAMESPACE",
    "QUORUMGUARD_CERTS_DNS_NAMES",
    "QUORUMGUARD_CERTS_DAYS",
    "QUORUMGUARD_CERTS_CA_CERT",
    "QUORUMGUARD_CERTS_CA_KEY",
    "QUORUMGUARD_CERTS_PATCH_WEBHOOK",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// A fresh directory under Cargo's per-target temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("certs_cli-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> Self {
        assert_eq!(self.code, Some(0), "quorumguard failed: {self:#?}");
        self
    }
}

/// Runs the binary with output captured in files (no pipe can fill up), killed after
/// [`RUN_TIMEOUT`].
fn quorumguard(args: &[&str], env: &[(&str, &str)]) -> Run {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let stdout_path = out_dir.join(format!("certs_cli-{}-{n}.stdout", std::process::id()));
    let stderr_path = out_dir.join(format!("certs_cli-{}-{n}.stderr", std::process::id()));
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(fs::File::create(&stderr_path).expect("stderr file"));
    for var in SCRUB_ENV {
        cmd.env_remove(var);
    }
    cmd.env("NO_PROXY", "127.0.0.1").envs(env.iter().copied());
    let mut child = cmd.spawn().expect("spawn quorumguard");
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for quorumguard") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("quorumguard {args:?} did not finish within {RUN_TIMEOUT:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let run = Run {
        code: status.code(),
        stdout: fs::read_to_string(&stdout_path).unwrap_or_default(),
        stderr: fs::read_to_string(&stderr_path).unwrap_or_default(),
    };
    let _ = fs::remove_file(stdout_path);
    let _ = fs::remove_file(stderr_path);
    run
}

fn certs(out: &Path, extra: &[&str]) -> Run {
    let out = out.to_str().expect("UTF-8 path");
    let mut args = vec!["certs", "--out-dir", out];
    args.extend_from_slice(extra);
    quorumguard(&args, &[])
}

/// Runs `openssl`; returns (success, stdout + stderr).
fn openssl(args: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the openssl command is needed (apt-get install openssl)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn openssl_ok(args: &[&str]) -> String {
    let (ok, text) = openssl(args);
    assert!(ok, "openssl {args:?} failed:\n{text}");
    text
}

fn s(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path)
        .expect("file exists")
        .permissions()
        .mode()
        & 0o777
}

fn decode_base64(b64: &str) -> Vec<u8> {
    serde_json::from_value::<ByteString>(Value::String(b64.trim().to_string()))
        .expect("valid base64")
        .0
}

fn subject_alt_names(cert: &Path) -> String {
    openssl_ok(&["x509", "-in", s(cert), "-noout", "-ext", "subjectAltName"])
}

#[test]
fn certs_writes_a_ca_and_a_chain_that_openssl_accepts() {
    let tmp = TempDir::new("basic");
    let out = tmp.path("out");
    let run = certs(&out, &[]).ok();
    assert!(
        run.stdout.is_empty(),
        "stdout is only for the caBundle: {run:#?}"
    );

    for (name, want) in [
        ("ca.crt", 0o644),
        ("ca.key", 0o600),
        ("tls.crt", 0o644),
        ("tls.key", 0o600),
    ] {
        assert_eq!(mode(&out.join(name)), want, "{name}");
    }
    assert_eq!(mode(&out), 0o700);

    let (ca, chain, key) = (out.join("ca.crt"), out.join("tls.crt"), out.join("tls.key"));
    let text = openssl_ok(&["verify", "-CAfile", s(&ca), s(&chain)]);
    assert!(text.contains(": OK"), "{text}");
    // tls.crt is a chain: the leaf, then exactly the CA.
    let chain_pem = fs::read_to_string(&chain).unwrap();
    let ca_pem = fs::read_to_string(&ca).unwrap();
    assert_eq!(chain_pem.matches("-----BEGIN CERTIFICATE-----").count(), 2);
    assert!(chain_pem.ends_with(&ca_pem));
    // The key is the leaf's key.
    let cert_pub = openssl_ok(&["x509", "-in", s(&chain), "-noout", "-pubkey"]);
    let key_pub = openssl_ok(&["pkey", "-in", s(&key), "-pubout"]);
    assert_eq!(cert_pub, key_pub);
    assert!(
        fs::read_to_string(&key)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----")
    );

    let sans = subject_alt_names(&chain);
    for name in SERVICE_NAMES {
        assert!(
            sans.contains(&format!("DNS:{name},")) || sans.contains(&format!("DNS:{name}\n")),
            "{name} in {sans}"
        );
    }
    let leaf = openssl_ok(&["x509", "-in", s(&chain), "-noout", "-text"]);
    assert!(leaf.contains("ASN1 OID: prime256v1"), "{leaf}");
    assert!(leaf.contains("TLS Web Server Authentication"), "{leaf}");
    assert!(leaf.contains("CA:FALSE"), "{leaf}");
    let ca_text = openssl_ok(&["x509", "-in", s(&ca), "-noout", "-text"]);
    assert!(ca_text.contains("CA:TRUE"), "{ca_text}");
    assert!(ca_text.contains("Certificate Sign"), "{ca_text}");
    assert!(ca_text.contains("ASN1 OID: prime256v1"), "{ca_text}");

    // Validity: the leaf 365 days, the CA 10 years.
    let day = 86_400;
    let valid_for = |cert: &Path, secs: i64| {
        openssl(&[
            "x509",
            "-in",
            s(cert),
            "-noout",
            "-checkend",
            &secs.to_string(),
        ])
        .0
    };
    assert!(valid_for(&chain, 364 * day));
    assert!(!valid_for(&chain, 366 * day));
    assert!(valid_for(&ca, 3649 * day));
    assert!(!valid_for(&ca, 3651 * day));

    // What to run next, with the files just written.
    let secret = format!(
        "kubectl create secret tls quorumguard-webhook-tls -n quorumguard-system --cert={} --key={}",
        chain.display(),
        key.display()
    );
    assert!(run.stderr.contains(&secret), "{}", run.stderr);
    assert!(run.stderr.contains("--patch-webhook"), "{}", run.stderr);
}

#[test]
fn certs_refuses_to_overwrite_without_force() {
    let tmp = TempDir::new("force");
    let out = tmp.path("out");
    certs(&out, &[]).ok();
    let before: Vec<Vec<u8>> = ["ca.crt", "ca.key", "tls.crt", "tls.key"]
        .iter()
        .map(|f| fs::read(out.join(f)).unwrap())
        .collect();

    let run = certs(&out, &[]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("already exist"), "{}", run.stderr);
    assert!(run.stderr.contains("--force"), "{}", run.stderr);
    assert!(run.stderr.contains("tls.key"), "{}", run.stderr);
    for (f, old) in ["ca.crt", "ca.key", "tls.crt", "tls.key"]
        .iter()
        .zip(&before)
    {
        assert_eq!(&fs::read(out.join(f)).unwrap(), old, "{f} untouched");
    }

    // With --force: everything new, key modes restored even if someone opened them up.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(out.join("tls.key"), fs::Permissions::from_mode(0o644)).unwrap();
    certs(&out, &["--force"]).ok();
    for (f, old) in ["ca.crt", "ca.key", "tls.crt", "tls.key"]
        .iter()
        .zip(&before)
    {
        assert_ne!(&fs::read(out.join(f)).unwrap(), old, "{f} replaced");
    }
    assert_eq!(mode(&out.join("tls.key")), 0o600);
    assert_eq!(mode(&out.join("ca.key")), 0o600);
    openssl_ok(&[
        "verify",
        "-CAfile",
        s(&out.join("ca.crt")),
        s(&out.join("tls.crt")),
    ]);
}

#[test]
fn print_ca_bundle_is_the_base64_of_ca_crt() {
    let tmp = TempDir::new("bundle");
    let out = tmp.path("out");
    let run = certs(&out, &["--print-ca-bundle"]).ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "exactly one line on stdout: {run:#?}");
    assert_eq!(
        decode_base64(lines[0]),
        fs::read(out.join("ca.crt")).unwrap()
    );
}

#[test]
fn service_namespace_extra_names_and_days_are_honoured() {
    let tmp = TempDir::new("names");
    let out = tmp.path("out");
    certs(
        &out,
        &[
            "--service",
            "guard",
            "--namespace",
            "ops",
            "--dns-name",
            "guard.example.com",
            "--dns-name",
            "10.1.2.3",
            "--days",
            "30",
            "--secret-name",
            "my-tls",
        ],
    )
    .ok();
    let sans = subject_alt_names(&out.join("tls.crt"));
    for name in [
        "guard",
        "guard.ops",
        "guard.ops.svc",
        "guard.ops.svc.cluster.local",
        "guard.example.com",
    ] {
        assert!(sans.contains(&format!("DNS:{name}")), "{name} in {sans}");
    }
    assert!(sans.contains("IP Address:10.1.2.3"), "{sans}");
    assert!(!sans.contains("quorumguard"), "{sans}");
    let chain = out.join("tls.crt");
    assert!(
        openssl(&[
            "x509",
            "-in",
            s(&chain),
            "-noout",
            "-checkend",
            &(29 * 86_400).to_string()
        ])
        .0
    );
    assert!(
        !openssl(&[
            "x509",
            "-in",
            s(&chain),
            "-noout",
            "-checkend",
            &(31 * 86_400).to_string()
        ])
        .0
    );

    // The env twins work too (comma-separated names).
    let out2 = tmp.path("env");
    quorumguard(
        &["certs"],
        &[
            ("QUORUMGUARD_CERTS_OUT_DIR", s(&out2)),
            ("QUORUMGUARD_CERTS_DNS_NAMES", "a.example.com,b.example.com"),
            ("QUORUMGUARD_CERTS_DAYS", "7"),
        ],
    )
    .ok();
    let sans = subject_alt_names(&out2.join("tls.crt"));
    assert!(
        sans.contains("DNS:a.example.com") && sans.contains("DNS:b.example.com"),
        "{sans}"
    );
    assert!(
        sans.contains("DNS:quorumguard-webhook.quorumguard-system.svc"),
        "{sans}"
    );

    // Bad input is refused before anything is written.
    for args in [
        &["--days", "0"][..],
        &["--days", "3651"],
        &["--dns-name", "Bad_Name"],
        &["--service", "UPPER"],
        &["--ca-cert", "/nonexistent/ca.crt"],
    ] {
        let bad = tmp.path("bad");
        let run = certs(&bad, args);
        assert_eq!(run.code, Some(2), "{args:?}: {run:#?}");
        assert!(!bad.join("tls.key").exists(), "{args:?}");
    }
}

#[test]
fn a_given_ca_signs_the_new_certificate_and_the_ca_bundle_stays() {
    let tmp = TempDir::new("reuse");
    let first = tmp.path("first");
    let run1 = certs(&first, &["--print-ca-bundle"]).ok();
    let second = tmp.path("second");
    let (ca, ca_key) = (first.join("ca.crt"), first.join("ca.key"));
    let run2 = certs(
        &second,
        &[
            "--ca-cert",
            s(&ca),
            "--ca-key",
            s(&ca_key),
            "--print-ca-bundle",
        ],
    )
    .ok();
    assert_eq!(run1.stdout, run2.stdout, "same caBundle");
    assert_eq!(
        fs::read(&ca).unwrap(),
        fs::read(second.join("ca.crt")).unwrap()
    );
    assert!(
        !second.join("ca.key").exists(),
        "a given CA key is not copied"
    );
    openssl_ok(&["verify", "-CAfile", s(&ca), s(&second.join("tls.crt"))]);
    assert_ne!(
        fs::read(first.join("tls.key")).unwrap(),
        fs::read(second.join("tls.key")).unwrap()
    );

    // Renewing in place: the CA read from the directory it is written back to.
    certs(
        &first,
        &["--ca-cert", s(&ca), "--ca-key", s(&ca_key), "--force"],
    )
    .ok();
    openssl_ok(&["verify", "-CAfile", s(&ca), s(&first.join("tls.crt"))]);

    // --ca-cert and --ca-key go together.
    let run = certs(&tmp.path("x"), &["--ca-cert", s(&ca)]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("--ca-key"), "{}", run.stderr);

    // The wrong key, or a serving certificate as CA, are refused and nothing is written.
    let other = tmp.path("other");
    certs(&other, &[]).ok();
    let run = certs(
        &tmp.path("mismatch"),
        &["--ca-cert", s(&ca), "--ca-key", s(&other.join("ca.key"))],
    );
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("does not belong"), "{}", run.stderr);
    assert!(!tmp.path("mismatch").exists());
    let run = certs(
        &tmp.path("leaf"),
        &[
            "--ca-cert",
            s(&first.join("tls.crt")),
            "--ca-key",
            s(&first.join("tls.key")),
        ],
    );
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("not a CA"), "{}", run.stderr);
}

/// A CA made by OpenSSL (its own subject encoding, SHA-1 key identifiers, RSA or EC).
fn openssl_ca(dir: &Path, name: &str, newkey: &[&str], extra: &[&str]) -> (PathBuf, PathBuf) {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let mut args = vec!["req", "-x509", "-nodes", "-days", "90", "-subj"];
    args.push("/C=DE/ST=Berlin/O=Example Ops/OU=Platform/CN=Example Root CA");
    args.extend_from_slice(newkey);
    args.extend_from_slice(&["-keyout", s(&key), "-out", s(&cert)]);
    args.extend_from_slice(&[
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    args.extend_from_slice(extra);
    openssl_ok(&args);
    (cert, key)
}

#[test]
fn a_ca_made_by_openssl_can_be_used() {
    let tmp = TempDir::new("openssl-ca");
    for (name, newkey, extra) in [
        (
            "ec",
            &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"][..],
            &[][..],
        ),
        ("rsa", &["-newkey", "rsa:2048"], &[]),
        (
            "noskid",
            &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"],
            &[
                "-addext",
                "subjectKeyIdentifier=none",
                "-addext",
                "authorityKeyIdentifier=none",
            ],
        ),
    ] {
        let (cert, key) = openssl_ca(&tmp.0, name, newkey, extra);
        let out = tmp.path(&format!("out-{name}"));
        let run = certs(
            &out,
            &["--ca-cert", s(&cert), "--ca-key", s(&key), "--days", "30"],
        );
        assert_eq!(run.code, Some(0), "{name}: {run:#?}");
        let text = openssl_ok(&["verify", "-CAfile", s(&cert), s(&out.join("tls.crt"))]);
        assert!(text.contains(": OK"), "{name}: {text}");
        // Outliving the CA (90 days) is refused.
        let run = certs(
            &tmp.path(&format!("long-{name}")),
            &["--ca-cert", s(&cert), "--ca-key", s(&key), "--days", "365"],
        );
        assert_eq!(run.code, Some(2), "{name}: {run:#?}");
        assert!(
            run.stderr.contains("before the certificate would"),
            "{}",
            run.stderr
        );
    }

    // A SEC1 key ("EC PRIVATE KEY") gets a conversion hint, and the hint works.
    let sec1 = tmp.path("sec1.key");
    openssl_ok(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        s(&sec1),
    ]);
    let cert = tmp.path("sec1.crt");
    openssl_ok(&[
        "req",
        "-x509",
        "-key",
        s(&sec1),
        "-days",
        "90",
        "-subj",
        "/CN=SEC1 CA",
        "-out",
        s(&cert),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
    ]);
    let run = certs(
        &tmp.path("sec1-out"),
        &["--ca-cert", s(&cert), "--ca-key", s(&sec1), "--days", "30"],
    );
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(
        run.stderr.contains("openssl pkcs8 -topk8 -nocrypt"),
        "{}",
        run.stderr
    );
    let pk8 = tmp.path("sec1.pk8.key");
    openssl_ok(&[
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        s(&sec1),
        "-out",
        s(&pk8),
    ]);
    certs(
        &tmp.path("sec1-out"),
        &["--ca-cert", s(&cert), "--ca-key", s(&pk8), "--days", "30"],
    )
    .ok();
    openssl_ok(&[
        "verify",
        "-CAfile",
        s(&cert),
        s(&tmp.path("sec1-out").join("tls.crt")),
    ]);
}

/// Accepts one connection, giving up after `timeout` (so the server thread always ends).
fn accept_within(listener: &TcpListener, timeout: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((tcp, _)) => {
                tcp.set_nonblocking(false).map_err(|e| e.to_string())?;
                return Ok(tcp);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(format!("no connection within {timeout:?}"));
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// One TLS handshake over 127.0.0.1 between a rustls server holding tls.crt/tls.key and a
/// rustls client trusting only ca.crt and dialing `server_name`. Returns what the client saw:
/// the number of certificates the server sent, or the client's error.
fn handshake(dir: &Path, server_name: &str) -> Result<usize, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("tls.crt"))
        .expect("read tls.crt")
        .collect::<Result<_, _>>()
        .expect("parse tls.crt");
    let key = PrivateKeyDer::from_pem_file(dir.join("tls.key")).expect("parse tls.key");
    let server_config = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("rustls accepts tls.crt and tls.key");
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(dir.join("ca.crt")).expect("parse ca.crt"))
        .expect("ca.crt is a usable trust anchor");
    let client_config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    exchange(
        Arc::new(server_config),
        Arc::new(client_config),
        server_name,
    )
}

/// One exchange over 127.0.0.1 between a rustls server and client with these configurations,
/// the client dialing `server_name`. Returns the number of certificates the server sent, or
/// the client's error (with the server's, when it has one).
fn exchange(
    server_config: Arc<ServerConfig>,
    client_config: Arc<ClientConfig>,
    server_name: &str,
) -> Result<usize, String> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    listener
        .set_nonblocking(true)
        .expect("non-blocking listener");
    let addr = listener.local_addr().expect("local addr");
    let server = thread::spawn(move || -> Result<(), String> {
        let mut tcp = accept_within(&listener, IO_TIMEOUT)?;
        tcp.set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        tcp.set_write_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut conn = ServerConnection::new(server_config).map_err(|e| e.to_string())?;
        let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
        let mut buf = [0u8; 5];
        tls.read_exact(&mut buf).map_err(|e| e.to_string())?;
        if &buf != b"hello" {
            return Err(format!("server read {buf:?}"));
        }
        tls.write_all(b"world").map_err(|e| e.to_string())?;
        tls.flush().map_err(|e| e.to_string())?;
        conn.send_close_notify();
        let _ = conn.write_tls(&mut tcp);
        Ok(())
    });

    let client = (|| -> Result<usize, String> {
        let mut tcp = TcpStream::connect_timeout(&addr, IO_TIMEOUT).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        tcp.set_write_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
        let mut conn = ClientConnection::new(client_config, name).map_err(|e| e.to_string())?;
        let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
        tls.write_all(b"hello").map_err(|e| e.to_string())?;
        let mut buf = [0u8; 5];
        tls.read_exact(&mut buf).map_err(|e| e.to_string())?;
        if &buf != b"world" {
            return Err(format!("client read {buf:?}"));
        }
        Ok(conn.peer_certificates().map_or(0, <[_]>::len))
    })();
    // The server side ends by itself: with the exchange done, or with the client's alert or
    // hang-up, and at worst after IO_TIMEOUT.
    let served = server.join().expect("server thread");
    match (client, served) {
        (Ok(n), served) => served.map(|()| n).map_err(|e| format!("server: {e}")),
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(server)) => Err(format!("{e} (server: {server})")),
    }
}

#[test]
fn rustls_completes_a_handshake_with_the_generated_chain() {
    let tmp = TempDir::new("rustls");
    let out = tmp.path("out");
    certs(&out, &["--dns-name", "localhost"]).ok();
    for name in SERVICE_NAMES.iter().chain(&["localhost"]) {
        assert_eq!(
            handshake(&out, name),
            Ok(2),
            "leaf and CA sent, dialing {name}"
        );
    }
    // A name the certificate does not carry, and a CA it was not signed by, fail.
    let err = handshake(&out, "other.quorumguard-system.svc").unwrap_err();
    assert!(
        err.contains("NotValidForName") || err.contains("not valid for"),
        "{err}"
    );
    let other = tmp.path("other");
    certs(&other, &[]).ok();
    fs::copy(other.join("ca.crt"), out.join("ca.crt")).unwrap();
    let err = handshake(&out, SERVICE_NAMES[2]).unwrap_err();
    assert!(
        err.contains("UnknownIssuer") || err.contains("invalid peer certificate"),
        "{err}"
    );
}

#[test]
fn help_documents_every_flag() {
    let run = quorumguard(&["certs", "--help"], &[]).ok();
    for flag in [
        "--out-dir",
        "--force",
        "--service",
        "--namespace",
        "--dns-name",
        "--days",
        "--ca-cert",
        "--ca-key",
        "--secret-name",
        "--print-ca-bundle",
        "--patch-webhook",
        "--kubeconfig",
        "--context",
        "--client",
        "client-ca.crt",
        "client.key",
        "QUORUMGUARD_CERTS_OUT_DIR",
        "[default: quorumguard-webhook]",
        "[default: quorumguard-system]",
        "[default: 365]",
        "tls.crt",
        "ca.key",
    ] {
        assert!(
            run.stdout.contains(flag),
            "{flag} in --help:\n{}",
            run.stdout
        );
    }
}

/// A stand-in for the API server, just enough for `--patch-webhook`: GET and PATCH (JSON patch)
/// of ValidatingWebhookConfigurations, over plain HTTP on 127.0.0.1. Records each request.
struct StandIn {
    addr: std::net::SocketAddr,
    objects: Arc<Mutex<serde_json::Map<String, Value>>>,
    requests: Arc<Mutex<Vec<Recorded>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

/// One request the stand-in saw.
#[derive(Clone, Debug)]
struct Recorded {
    /// `METHOD /path`.
    line: String,
    content_type: String,
    authorization: String,
    body: String,
}

const VWC_PATH: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/";

impl StandIn {
    fn start(objects: Vec<Value>) -> Self {
        use axum::body::Bytes;
        use axum::http::{HeaderMap, Method, StatusCode, Uri, header};

        let objects: serde_json::Map<String, Value> = objects
            .into_iter()
            .map(|o| (o["metadata"]["name"].as_str().unwrap().to_string(), o))
            .collect();
        let objects = Arc::new(Mutex::new(objects));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (objs, reqs) = (objects.clone(), requests.clone());
        let handler = move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (objs, reqs) = (objs.clone(), reqs.clone());
            async move {
                let text = |h: header::HeaderName| {
                    headers
                        .get(h)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                reqs.lock().unwrap().push(Recorded {
                    line: format!("{method} {}", uri.path()),
                    content_type: text(header::CONTENT_TYPE),
                    authorization: text(header::AUTHORIZATION),
                    body: String::from_utf8_lossy(&body).into_owned(),
                });
                let json = |code: StatusCode, v: Value| {
                    (
                        code,
                        [(header::CONTENT_TYPE, "application/json")],
                        v.to_string(),
                    )
                };
                let Some(name) = uri.path().strip_prefix(VWC_PATH) else {
                    return json(
                        StatusCode::NOT_FOUND,
                        status(404, "NotFound", "no such path"),
                    );
                };
                let mut objs = objs.lock().unwrap();
                let Some(obj) = objs.get_mut(name) else {
                    let msg = format!("validatingwebhookconfigurations \"{name}\" not found");
                    return json(StatusCode::NOT_FOUND, status(404, "NotFound", &msg));
                };
                match method {
                    Method::GET => json(StatusCode::OK, obj.clone()),
                    Method::PATCH if name == "readonly" => {
                        let msg = "validatingwebhookconfigurations.admissionregistration.k8s.io \
                                   \"readonly\" is forbidden: User cannot patch resource";
                        json(StatusCode::FORBIDDEN, status(403, "Forbidden", msg))
                    }
                    Method::PATCH => {
                        let patch: json_patch::Patch = match serde_json::from_slice(&body) {
                            Ok(p) => p,
                            Err(e) => {
                                return json(
                                    StatusCode::BAD_REQUEST,
                                    status(400, "BadRequest", &e.to_string()),
                                );
                            }
                        };
                        let mut updated = obj.clone();
                        if let Err(e) = json_patch::patch(&mut updated, &patch) {
                            return json(
                                StatusCode::UNPROCESSABLE_ENTITY,
                                status(422, "Invalid", &e.to_string()),
                            );
                        }
                        *obj = updated.clone();
                        json(StatusCode::OK, updated)
                    }
                    _ => json(
                        StatusCode::METHOD_NOT_ALLOWED,
                        status(405, "MethodNotAllowed", ""),
                    ),
                }
            }
        };
        let thread = thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("tokio runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let app = axum::Router::new().fallback(handler);
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("serve");
            });
        });
        Self {
            addr,
            objects,
            requests,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: standin\n  context:\n    cluster: standin\n    user: standin\n\
             current-context: standin\nusers:\n- name: standin\n  user:\n    token: standin-token\n",
            self.addr
        );
        fs::write(&path, text).unwrap();
        path
    }

    fn object(&self, name: &str) -> Value {
        self.objects.lock().unwrap()[name].clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn webhook_configuration(name: &str, annotations: Value) -> Value {
    let webhook = |hook: &str, path: &str| {
        json!({
            "name": hook,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "NoneOnDryRun",
            "clientConfig": {"service": {"name": "quorumguard-webhook",
                "namespace": "quorumguard-system", "path": path, "port": 443}},
        })
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "resourceVersion": "7", "annotations": annotations},
        "webhooks": [
            webhook("machines.quorumguard.io", "/validate/machines"),
            webhook("kubeadmcontrolplanes.quorumguard.io", "/validate/kubeadmcontrolplanes"),
        ],
    })
}

#[test]
fn patch_webhook_sets_the_ca_bundle_of_every_webhook() {
    let tmp = TempDir::new("patch");
    let server = StandIn::start(vec![
        webhook_configuration("quorumguard", json!({})),
        webhook_configuration("readonly", json!({})),
        webhook_configuration(
            "injected",
            json!({"cert-manager.io/inject-ca-from": "quorumguard-system/quorumguard-webhook"}),
        ),
    ]);
    let kubeconfig = server.kubeconfig(&tmp.0);
    let out = tmp.path("out");
    let run = certs(
        &out,
        &[
            "--print-ca-bundle",
            "--patch-webhook",
            "quorumguard",
            "--kubeconfig",
            s(&kubeconfig),
        ],
    )
    .ok();
    let bundle = run.stdout.trim();
    assert_eq!(decode_base64(bundle), fs::read(out.join("ca.crt")).unwrap());
    let vwc = server.object("quorumguard");
    for webhook in vwc["webhooks"].as_array().unwrap() {
        assert_eq!(webhook["clientConfig"]["caBundle"], bundle, "{webhook}");
        assert_eq!(
            webhook["clientConfig"]["service"]["port"], 443,
            "the rest is kept"
        );
    }
    assert!(
        run.stderr
            .contains("machines.quorumguard.io, kubeadmcontrolplanes.quorumguard.io"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("cainjector"), "{}", run.stderr);
    {
        let requests = server.requests.lock().unwrap();
        let patch = requests
            .iter()
            .find(|r| r.line.starts_with("PATCH "))
            .expect("a PATCH request");
        assert_eq!(patch.line, format!("PATCH {VWC_PATH}quorumguard"));
        assert_eq!(patch.content_type, "application/json-patch+json");
        assert_eq!(
            patch.authorization, "Bearer standin-token",
            "the kubeconfig's credentials"
        );
        let ops: Value = serde_json::from_str(&patch.body).unwrap();
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/webhooks/0/name", "value": "machines.quorumguard.io"})
        );
        assert_eq!(ops.as_array().unwrap().len(), 4);
    }

    // cert-manager owns this one: patched, with a warning that cainjector will overwrite it.
    let run = certs(
        &tmp.path("out2"),
        &[
            "--patch-webhook",
            "injected",
            "--kubeconfig",
            s(&kubeconfig),
        ],
    )
    .ok();
    assert!(
        run.stderr.contains("cainjector will overwrite"),
        "{}",
        run.stderr
    );

    // A configuration that does not exist: exit 2, what to do, and nothing written.
    let run = certs(
        &tmp.path("out3"),
        &["--patch-webhook", "missing", "--kubeconfig", s(&kubeconfig)],
    );
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(
        run.stderr
            .contains("ValidatingWebhookConfiguration missing not found"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("kubectl apply -k"), "{}", run.stderr);
    assert!(!tmp.path("out3").exists());

    // The patch itself refused (RBAC): exit 2; the files are there, and the message says how to
    // try again with the same CA.
    let out4 = tmp.path("out4");
    let run = certs(
        &out4,
        &[
            "--patch-webhook",
            "readonly",
            "--kubeconfig",
            s(&kubeconfig),
        ],
    );
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("forbidden"), "{}", run.stderr);
    let again = format!(
        "quorumguard certs --out-dir {} --ca-cert {} --ca-key {} --force --patch-webhook readonly",
        out4.display(),
        out4.join("ca.crt").display(),
        out4.join("ca.key").display()
    );
    assert!(run.stderr.contains(&again), "{again} in {}", run.stderr);
    assert!(out4.join("tls.key").exists());
    assert!(
        server.object("readonly")["webhooks"][0]["clientConfig"]
            .get("caBundle")
            .is_none()
    );
}

#[test]
fn patch_webhook_fails_cleanly_when_the_api_server_is_unreachable() {
    let tmp = TempDir::new("unreachable");
    // A port that was free a moment ago: connection refused.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = tmp.path("kubeconfig");
    fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
             users:\n- name: u\n  user: {{}}\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let run = certs(
        &tmp.path("out"),
        &[
            "--patch-webhook",
            "quorumguard",
            "--kubeconfig",
            s(&kubeconfig),
        ],
    );
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(
        run.stderr
            .contains("cannot read ValidatingWebhookConfiguration quorumguard"),
        "{}",
        run.stderr
    );
    assert!(!tmp.path("out").exists(), "nothing written");
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "bounded by the patch timeout"
    );
}

// kube-apiserver's client certificate: `quorumguard certs --client NAME`.

const CLIENT_FILES: [&str; 4] = ["client-ca.crt", "client-ca.key", "client.crt", "client.key"];

#[test]
fn client_writes_a_client_ca_and_a_client_auth_certificate() {
    let tmp = TempDir::new("client");
    let out = tmp.path("out");
    let run = certs(&out, &["--client", "kube-apiserver"]).ok();
    assert_eq!(run.stdout, "", "nothing on stdout");
    for f in CLIENT_FILES {
        assert!(out.join(f).is_file(), "{f} written");
    }
    for f in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(
            !out.join(f).exists(),
            "{f} is the serving pair's: not written"
        );
    }
    assert_eq!(mode(&out.join("client.key")), 0o600);
    assert_eq!(mode(&out.join("client-ca.key")), 0o600);
    assert_eq!(mode(&out.join("client.crt")), 0o644);
    assert_eq!(mode(&out.join("client-ca.crt")), 0o644);

    let text = openssl_ok(&["x509", "-in", s(&out.join("client.crt")), "-noout", "-text"]);
    assert!(
        text.contains("CN = kube-apiserver") || text.contains("CN=kube-apiserver"),
        "{text}"
    );
    assert!(text.contains("TLS Web Client Authentication"), "{text}");
    assert!(!text.contains("TLS Web Server Authentication"), "{text}");
    // client.crt is the leaf then the CA, and it verifies for client use.
    assert_eq!(
        fs::read_to_string(out.join("client.crt"))
            .unwrap()
            .matches("BEGIN CERTIFICATE")
            .count(),
        2
    );
    openssl_ok(&[
        "verify",
        "-purpose",
        "sslclient",
        "-CAfile",
        s(&out.join("client-ca.crt")),
        s(&out.join("client.crt")),
    ]);

    // What to do next: the Secret serve reads the CA from, and serve's flags.
    let ca = fs::canonicalize(out.join("client-ca.crt")).unwrap();
    for needle in [
        format!(
            "kubectl -n quorumguard-system create secret generic quorumguard-client-ca \
             --from-file=ca.crt={}",
            ca.display()
        ),
        "--client-ca-file=/client-ca/ca.crt".to_owned(),
        "--client-name=kube-apiserver".to_owned(),
        "--ca-cert".to_owned(),
    ] {
        assert!(run.stderr.contains(&needle), "{needle} in:\n{}", run.stderr);
    }
}

#[test]
fn client_refuses_to_overwrite_without_force() {
    let tmp = TempDir::new("client-force");
    let out = tmp.path("out");
    certs(&out, &["--client", "kube-apiserver"]).ok();
    let before: Vec<Vec<u8>> = CLIENT_FILES
        .iter()
        .map(|f| fs::read(out.join(f)).unwrap())
        .collect();

    let run = certs(&out, &["--client", "kube-apiserver"]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("already exist"), "{}", run.stderr);
    assert!(run.stderr.contains("--force"), "{}", run.stderr);
    assert!(run.stderr.contains("client.key"), "{}", run.stderr);
    for (f, old) in CLIENT_FILES.iter().zip(&before) {
        assert_eq!(&fs::read(out.join(f)).unwrap(), old, "{f} untouched");
    }

    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(out.join("client.key"), fs::Permissions::from_mode(0o644)).unwrap();
    certs(&out, &["--client", "kube-apiserver", "--force"]).ok();
    for (f, old) in CLIENT_FILES.iter().zip(&before) {
        assert_ne!(&fs::read(out.join(f)).unwrap(), old, "{f} replaced");
    }
    assert_eq!(mode(&out.join("client.key")), 0o600);
    assert_eq!(mode(&out.join("client-ca.key")), 0o600);
}

#[test]
fn client_refuses_the_serving_pairs_flags() {
    let tmp = TempDir::new("client-conflicts");
    let out = tmp.path("out");
    for (flag, extra) in [
        ("--patch-webhook", &["--patch-webhook", "quorumguard"][..]),
        ("--print-ca-bundle", &["--print-ca-bundle"][..]),
        ("--dns-name", &["--dns-name", "webhook.example.com"][..]),
        ("--secret-name", &["--secret-name", "other"][..]),
    ] {
        let mut args = vec!["--client", "kube-apiserver"];
        args.extend_from_slice(extra);
        let run = certs(&out, &args);
        assert_eq!(run.code, Some(2), "{flag}: {run:#?}");
        assert!(
            run.stderr.contains("--client") && run.stderr.contains(flag),
            "the error names --client and {flag}:\n{}",
            run.stderr
        );
        assert!(!out.exists(), "{flag}: nothing written");
    }
}

#[test]
fn client_renewal_with_the_given_ca_keeps_the_ca() {
    let tmp = TempDir::new("client-renew");
    let out = tmp.path("out");
    certs(&out, &["--client", "kube-apiserver"]).ok();
    let ca_before = fs::read(out.join("client-ca.crt")).unwrap();
    let ca_key_before = fs::read(out.join("client-ca.key")).unwrap();
    let cert_before = fs::read(out.join("client.crt")).unwrap();
    let key_before = fs::read(out.join("client.key")).unwrap();

    // The CA's files are read before anything is replaced, so it may renew in place.
    let ca_cert = out.join("client-ca.crt");
    let ca_key = out.join("client-ca.key");
    let run = certs(
        &out,
        &[
            "--client",
            "kube-apiserver",
            "--ca-cert",
            s(&ca_cert),
            "--ca-key",
            s(&ca_key),
            "--force",
            "--days",
            "30",
        ],
    )
    .ok();
    assert!(run.stderr.contains("the given client CA"), "{}", run.stderr);
    assert_eq!(fs::read(out.join("client-ca.crt")).unwrap(), ca_before);
    assert_eq!(fs::read(out.join("client-ca.key")).unwrap(), ca_key_before);
    assert_ne!(fs::read(out.join("client.crt")).unwrap(), cert_before);
    assert_ne!(fs::read(out.join("client.key")).unwrap(), key_before);
    openssl_ok(&[
        "verify",
        "-purpose",
        "sslclient",
        "-CAfile",
        s(&ca_cert),
        s(&out.join("client.crt")),
    ]);

    // Into a fresh directory with the given CA: its key is not copied there.
    let other = tmp.path("other");
    certs(
        &other,
        &[
            "--client",
            "kube-apiserver",
            "--ca-cert",
            s(&ca_cert),
            "--ca-key",
            s(&ca_key),
        ],
    )
    .ok();
    assert_eq!(fs::read(other.join("client-ca.crt")).unwrap(), ca_before);
    assert!(!other.join("client-ca.key").exists());
}

/// One TLS handshake between the webhook's server configuration, built as `serve` builds it
/// (`quorumguard::tls::load` with `--client-ca-file CA --client-name NAME`) from a serving pair
/// in `serving`, and a rustls client presenting `client.crt`/`client.key` from `client`.
/// `Ok(())` when both sides finish an exchange, the error otherwise.
fn client_handshake(
    serving: &Path,
    ca_file: &Path,
    name: &str,
    client: &Path,
) -> Result<(), String> {
    let auth = quorumguard::tls::ClientAuth {
        ca_file: ca_file.to_path_buf(),
        names: vec![name.to_owned()],
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let loaded = runtime
        .block_on(quorumguard::tls::load(
            &serving.join("tls.crt"),
            &serving.join("tls.key"),
            Some(&auth),
        ))
        .expect("serve accepts the serving pair and the client CA");
    let server_config: Arc<ServerConfig> = loaded.get_inner();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(serving.join("ca.crt")).expect("parse ca.crt"))
        .expect("ca.crt is a usable trust anchor");
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(client.join("client.crt"))
            .expect("read client.crt")
            .collect::<Result<_, _>>()
            .expect("parse client.crt");
    let key = PrivateKeyDer::from_pem_file(client.join("client.key")).expect("parse client.key");
    let client_config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("rustls accepts client.crt and client.key");
    exchange(server_config, Arc::new(client_config), SERVICE_NAMES[2]).map(|_| ())
}

#[test]
fn the_issued_client_certificate_is_accepted_by_the_webhooks_client_verifier() {
    let tmp = TempDir::new("client-verify");
    let serving = tmp.path("serving");
    certs(&serving, &[]).ok();
    let client = tmp.path("client");
    certs(&client, &["--client", "kube-apiserver"]).ok();
    let ca_file = client.join("client-ca.crt");
    assert_eq!(
        client_handshake(&serving, &ca_file, "kube-apiserver", &client),
        Ok(())
    );

    // Issued by the same CA for another name: refused by a webhook allowing kube-apiserver.
    let other = tmp.path("other-name");
    let ca_key = client.join("client-ca.key");
    certs(
        &other,
        &[
            "--client",
            "not-the-apiserver",
            "--ca-cert",
            s(&ca_file),
            "--ca-key",
            s(&ca_key),
        ],
    )
    .ok();
    let err = client_handshake(&serving, &ca_file, "kube-apiserver", &other).unwrap_err();
    assert!(err.contains("not-the-apiserver"), "{err}");
    // ... and accepted by one that allows that name.
    assert_eq!(
        client_handshake(&serving, &ca_file, "not-the-apiserver", &other),
        Ok(())
    );

    // Named kube-apiserver but from another client CA: refused.
    let stranger = tmp.path("other-ca");
    certs(&stranger, &["--client", "kube-apiserver"]).ok();
    assert!(client_handshake(&serving, &ca_file, "kube-apiserver", &stranger).is_err());
}
