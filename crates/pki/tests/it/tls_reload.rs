//! The webhook's TLS over real HTTPS on 127.0.0.1: protocol versions, ALPN, certificate chains,
//! and hot reload through a kubelet-style Secret volume (a `..data` symlink swapped atomically,
//! so the `tls.crt`/`tls.key` paths never change while their contents do).
//!
//! Every wait is bounded in attempts and in time; nothing listens beyond 127.0.0.1.

use std::{
    io::{Read, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Router, routing::get};
use axum_server::{Handle, tls_rustls::RustlsConfig};
use http_body_util::{BodyExt, Empty};
use hyper::{Request, StatusCode, body::Bytes};
use hyper_util::rt::{TokioExecutor, TokioIo};
use quorumguard_pki::tls::{self, TlsError};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use rustls::{
    ClientConfig, ProtocolVersion, RootCertStore, SupportedProtocolVersion,
    pki_types::{CertificateDer, ServerName},
    version::{TLS12, TLS13},
};
use tokio::{net::TcpStream, task::JoinHandle, time::timeout};
use tokio_rustls::{TlsConnector, client::TlsStream};

/// The longest any single network step or wait may take.
const STEP: Duration = Duration::from_secs(5);
/// The reloader's poll interval in these tests.
const POLL: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// Certificates

/// A certificate authority that can issue CA and leaf certificates.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
    pem: String,
}

fn ca_params(name: &str, path_len: Option<u8>) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(match path_len {
        Some(n) => BasicConstraints::Constrained(n),
        None => BasicConstraints::Unconstrained,
    });
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

impl Ca {
    fn root(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let params = ca_params(name, None);
        let cert = params.self_signed(&key).expect("self-signed CA");
        Ca {
            der: cert.der().clone(),
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn intermediate(&self, name: &str) -> Ca {
        let key = KeyPair::generate().expect("intermediate key");
        let params = ca_params(name, Some(0));
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("intermediate signed");
        Ca {
            der: cert.der().clone(),
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A serving certificate for `localhost` and 127.0.0.1, with its own key.
    fn leaf(&self, common_name: &str, serial: u64) -> Leaf {
        let key = KeyPair::generate().expect("leaf key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.issuer).expect("leaf signed");
        Leaf {
            der: cert.der().clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

struct Leaf {
    der: CertificateDer<'static>,
    cert_pem: String,
    key_pem: String,
}

// ---------------------------------------------------------------------------------------------
// A Secret volume as kubelet lays it out

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "quorumguard-tls-{}-{tag}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir");
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `dir/..<timestamp>/{tls.crt,tls.key}`, `dir/..data -> ..<timestamp>`,
/// `dir/tls.crt -> ..data/tls.crt`, `dir/tls.key -> ..data/tls.key`.
struct SecretVolume {
    dir: TempDir,
    generation: u32,
}

impl SecretVolume {
    fn new(tag: &str, cert_pem: &str, key_pem: &str) -> SecretVolume {
        let volume = SecretVolume {
            dir: TempDir::new(tag),
            generation: 1,
        };
        let data = volume.write_generation(cert_pem, key_pem);
        let root = &volume.dir.0;
        std::os::unix::fs::symlink(&data, root.join("..data")).expect("..data");
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(Path::new("..data").join(name), root.join(name))
                .expect("user-visible symlink");
        }
        volume
    }

    fn cert(&self) -> PathBuf {
        self.dir.0.join("tls.crt")
    }

    fn key(&self) -> PathBuf {
        self.dir.0.join("tls.key")
    }

    fn generation_dir(&self) -> String {
        format!("..2026_12_02_00_00_00.{}", self.generation)
    }

    fn write_generation(&self, cert_pem: &str, key_pem: &str) -> String {
        let name = self.generation_dir();
        let path = self.dir.0.join(&name);
        std::fs::create_dir(&path).expect("generation dir");
        std::fs::write(path.join("tls.crt"), cert_pem).expect("tls.crt");
        std::fs::write(path.join("tls.key"), key_pem).expect("tls.key");
        name
    }

    /// What kubelet's AtomicWriter does: write the new payload into a new timestamped directory,
    /// point a fresh `..data_tmp` symlink at it, rename that over `..data` (atomic), then remove
    /// the old directory. `tls.crt` and `tls.key` themselves are never touched.
    fn update(&mut self, cert_pem: &str, key_pem: &str) {
        let old = self.generation_dir();
        self.generation += 1;
        let new = self.write_generation(cert_pem, key_pem);
        let root = &self.dir.0;
        std::os::unix::fs::symlink(&new, root.join("..data_tmp")).expect("..data_tmp");
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).expect("swap ..data");
        std::fs::remove_dir_all(root.join(old)).expect("remove old generation");
        assert_eq!(
            std::fs::read_link(root.join("tls.crt")).expect("tls.crt link"),
            Path::new("..data/tls.crt"),
            "the user-visible path is unchanged"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Server and client

struct Server {
    addr: SocketAddr,
    handle: Handle<SocketAddr>,
    reports: Reports,
    reloader: Option<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(reloader) = self.reloader.take() {
            reloader.abort();
        }
        self.handle.shutdown();
    }
}

/// What the reloader reported, in order.
#[derive(Clone, Default)]
struct Reports(Arc<Mutex<Vec<Result<(), TlsError>>>>);

impl Reports {
    fn push(&self, outcome: Result<(), TlsError>) {
        self.0.lock().expect("reports").push(outcome);
    }

    /// `"ok"` or the error's variant and message, for readable assertions.
    fn summary(&self) -> Vec<String> {
        self.0
            .lock()
            .expect("reports")
            .iter()
            .map(|r| match r {
                Ok(()) => "ok".to_owned(),
                Err(e) => format!("err: {e:?}"),
            })
            .collect()
    }

    fn len(&self) -> usize {
        self.0.lock().expect("reports").len()
    }

    /// Waits (bounded) until at least `n` outcomes were reported.
    async fn wait_for(&self, n: usize) -> bool {
        let deadline = Instant::now() + STEP;
        for _ in 0..200 {
            if self.len() >= n {
                return true;
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        self.len() >= n
    }
}

async fn serve(config: RustlsConfig) -> Server {
    let handle = Handle::<SocketAddr>::new();
    let app = Router::new().route("/", get(|| async { "hello" }));
    let server = axum_server::bind_rustls(SocketAddr::from(([127, 0, 0, 1], 0)), config)
        .handle(handle.clone());
    tokio::spawn(async move {
        let _ = server.serve(app.into_make_service()).await;
    });
    let addr = timeout(STEP, handle.listening())
        .await
        .expect("server listening in time")
        .expect("server bound");
    Server {
        addr,
        handle,
        reports: Reports::default(),
        reloader: None,
    }
}

/// Serves the volume's pair, reloading every [`POLL`].
async fn serve_volume(volume: &SecretVolume) -> Server {
    let config = tls::load(&volume.cert(), &volume.key(), None)
        .await
        .expect("initial pair loads");
    let mut server = serve(config.clone()).await;
    let reports = server.reports.clone();
    server.reloader = Some(tls::spawn_reloader(
        config,
        volume.cert(),
        volume.key(),
        None,
        POLL,
        move |outcome| reports.push(outcome),
    ));
    server
}

fn client(
    roots: &[&CertificateDer<'static>],
    versions: &[&'static SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<ClientConfig> {
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add((*root).clone()).expect("root");
    }
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .expect("client versions")
            .with_root_certificates(store)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A client trusting `root`, TLS 1.2 and 1.3, offering h2 and http/1.1.
fn default_client(root: &CertificateDer<'static>) -> Arc<ClientConfig> {
    client(&[root], &[&TLS13, &TLS12], &[b"h2", b"http/1.1"])
}

async fn connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from("localhost").expect("server name");
    timeout(STEP, async {
        let tcp = TcpStream::connect(addr).await?;
        TlsConnector::from(config).connect(name, tcp).await
    })
    .await
    .map_err(|_| std::io::Error::other("TLS connect timed out"))?
}

fn leaf_of(stream: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .expect("server sent a certificate")
        .clone()
}

/// Connects until the server presents `want`; bounded by [`STEP`] and 100 attempts.
async fn wait_for_leaf(
    addr: SocketAddr,
    config: &Arc<ClientConfig>,
    want: &CertificateDer<'_>,
) -> bool {
    let deadline = Instant::now() + STEP;
    for _ in 0..100 {
        if let Ok(stream) = connect(addr, config.clone()).await
            && leaf_of(&stream) == *want
        {
            return true;
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

type H2 = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

async fn h2_connection(stream: TlsStream<TcpStream>) -> H2 {
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(connection);
    sender
}

async fn h2_get(sender: &mut H2) -> (StatusCode, String) {
    let request = Request::get("https://localhost/")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let response = timeout(STEP, sender.send_request(request))
        .await
        .expect("h2 response in time")
        .expect("h2 response");
    let status = response.status();
    let body = timeout(STEP, response.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn h1_get(stream: TlsStream<TcpStream>) -> (StatusCode, String) {
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("http/1.1 handshake");
    tokio::spawn(connection);
    let request = Request::get("/")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let response = timeout(STEP, sender.send_request(request))
        .await
        .expect("http/1.1 response in time")
        .expect("http/1.1 response");
    let status = response.status();
    let body = timeout(STEP, response.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_negotiates_h2_and_http11_still_works() {
    let ca = Ca::root("test root");
    let leaf = ca.leaf("quorumguard", 1);
    let config = RustlsConfig::from_config(Arc::new(
        tls::server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).expect("config"),
    ));
    let server = serve(config).await;

    // A client offering both (as kube-apiserver does) gets h2.
    let stream = connect(server.addr, default_client(&ca.der))
        .await
        .expect("connect");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let mut h2 = h2_connection(stream).await;
    assert_eq!(h2_get(&mut h2).await, (StatusCode::OK, "hello".to_owned()));

    // A client offering only http/1.1 gets it.
    let stream = connect(
        server.addr,
        client(&[&ca.der], &[&TLS13, &TLS12], &[b"http/1.1"]),
    )
    .await
    .expect("connect");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(h1_get(stream).await, (StatusCode::OK, "hello".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_and_tls13_work_and_tls11_is_refused() {
    let ca = Ca::root("test root");
    let leaf = ca.leaf("quorumguard", 1);
    let config = RustlsConfig::from_config(Arc::new(
        tls::server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).expect("config"),
    ));
    let server = serve(config).await;

    for (version, expected) in [
        (&TLS12, ProtocolVersion::TLSv1_2),
        (&TLS13, ProtocolVersion::TLSv1_3),
    ] {
        let stream = connect(server.addr, client(&[&ca.der], &[version], &[b"h2"]))
            .await
            .unwrap_or_else(|e| panic!("{expected:?} handshake: {e}"));
        assert_eq!(stream.get_ref().1.protocol_version(), Some(expected));
        let mut h2 = h2_connection(stream).await;
        assert_eq!(h2_get(&mut h2).await.0, StatusCode::OK, "{expected:?}");
    }

    // rustls cannot speak TLS 1.1, so send a TLS 1.1 ClientHello by hand: the server must answer
    // with a fatal `protocol_version` alert, never a ServerHello.
    let answer = tokio::task::spawn_blocking(move || raw_tls11_client_hello(server.addr))
        .await
        .expect("raw client");
    assert!(answer.len() >= 7, "an alert record, got {answer:02x?}");
    assert_eq!(answer[0], 0x15, "alert record, got {answer:02x?}");
    assert_eq!(answer[5], 2, "fatal alert, got {answer:02x?}");
    assert_eq!(answer[6], 70, "protocol_version alert, got {answer:02x?}");
}

/// Sends a minimal TLS 1.1 ClientHello and returns the first bytes the server answers with. It
/// carries `signature_algorithms` (without it rustls refuses earlier, with `handshake_failure`,
/// as it would a strict TLS 1.1 client) but no `supported_versions`, so the refusal seen is the
/// version check itself.
fn raw_tls11_client_hello(addr: SocketAddr) -> Vec<u8> {
    let mut hello = vec![0x03, 0x02]; // client_version TLS 1.1
    hello.extend_from_slice(&[0x5a; 32]); // random
    hello.push(0); // empty session id
    hello.extend_from_slice(&[0x00, 0x06, 0xc0, 0x09, 0xc0, 0x13, 0x00, 0x2f]); // CBC-SHA suites
    hello.extend_from_slice(&[0x01, 0x00]); // null compression
    // extensions: signature_algorithms = ecdsa_secp256r1_sha256, rsa_pkcs1_sha256
    hello.extend_from_slice(&[
        0x00, 0x0a, 0x00, 0x0d, 0x00, 0x06, 0x00, 0x04, 0x04, 0x03, 0x04, 0x01,
    ]);
    let mut handshake = vec![0x01, 0x00, 0x00, u8::try_from(hello.len()).expect("short")];
    handshake.extend_from_slice(&hello);
    let mut record = vec![
        0x16,
        0x03,
        0x01,
        0x00,
        u8::try_from(handshake.len()).expect("short"),
    ];
    record.extend_from_slice(&handshake);

    let mut stream = std::net::TcpStream::connect_timeout(&addr, STEP).expect("tcp connect");
    stream.set_read_timeout(Some(STEP)).expect("read timeout");
    stream.set_write_timeout(Some(STEP)).expect("write timeout");
    stream.write_all(&record).expect("send ClientHello");
    let mut answer = Vec::new();
    let mut buf = [0u8; 512];
    for _ in 0..16 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
        if answer.len() >= 7 {
            break;
        }
    }
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_symlink_swap_is_served_and_reported_once() {
    let ca = Ca::root("test root");
    let first = ca.leaf("quorumguard-1", 1);
    let second = ca.leaf("quorumguard-2", 2);
    let mut volume = SecretVolume::new("swap", &first.cert_pem, &first.key_pem);
    let server = serve_volume(&volume).await;
    let client = default_client(&ca.der);

    let before = connect(server.addr, client.clone()).await.expect("connect");
    assert_eq!(leaf_of(&before), first.der);
    let mut established = h2_connection(before).await;

    // The baseline read is silent.
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(server.reports.summary(), Vec::<String>::new());

    volume.update(&second.cert_pem, &second.key_pem);
    assert!(
        wait_for_leaf(server.addr, &client, &second.der).await,
        "new connections see the new certificate within {STEP:?}"
    );
    assert!(server.reports.wait_for(1).await);
    // A few more polls: the unchanged contents are not reloaded or reported again.
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(server.reports.summary(), ["ok"]);

    // A connection made before the swap keeps working.
    assert_eq!(h2_get(&mut established).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_pair_keeps_the_old_certificate_and_reports_the_error() {
    let ca = Ca::root("test root");
    let first = ca.leaf("quorumguard-1", 1);
    let second = ca.leaf("quorumguard-2", 2);
    let stranger = ca.leaf("someone-else", 3);
    let mut volume = SecretVolume::new("broken", &first.cert_pem, &first.key_pem);
    let server = serve_volume(&volume).await;
    let client = default_client(&ca.der);

    // The new certificate with a key that is not its own.
    volume.update(&second.cert_pem, &stranger.key_pem);
    assert!(server.reports.wait_for(1).await, "the error is reported");
    {
        let reports = server.reports.0.lock().expect("reports");
        match &reports[..] {
            [Err(TlsError::KeyMismatch { cert, key })] => {
                assert_eq!(cert, &volume.cert());
                assert_eq!(key, &volume.key());
            }
            other => panic!("expected one KeyMismatch, got {other:?}"),
        }
    }
    let stream = connect(server.addr, client.clone()).await.expect("connect");
    assert_eq!(
        leaf_of(&stream),
        first.der,
        "still serving the old certificate"
    );
    let mut h2 = h2_connection(stream).await;
    assert_eq!(h2_get(&mut h2).await.0, StatusCode::OK);

    // Reported once, not at every poll.
    tokio::time::sleep(POLL * 3).await;
    assert_eq!(server.reports.len(), 1, "{:?}", server.reports.summary());

    // Fixing the Secret heals it.
    volume.update(&second.cert_pem, &second.key_pem);
    assert!(wait_for_leaf(server.addr, &client, &second.der).await);
    assert!(server.reports.wait_for(2).await);
    assert_eq!(server.reports.summary()[1], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_with_an_intermediate_verifies_against_the_root_alone() {
    let root = Ca::root("test root");
    let intermediate = root.intermediate("test intermediate");
    let leaf = intermediate.leaf("quorumguard", 1);
    // What cert-manager writes into tls.crt: the leaf, then the intermediate.
    let chain = format!("{}{}", leaf.cert_pem, intermediate.pem);
    let volume = SecretVolume::new("chain", &chain, &leaf.key_pem);
    let server = serve_volume(&volume).await;

    let stream = connect(server.addr, default_client(&root.der))
        .await
        .expect("the root alone verifies leaf + intermediate");
    let presented = stream.get_ref().1.peer_certificates().expect("chain");
    assert_eq!(presented, [leaf.der.clone(), intermediate.der.clone()]);
    let mut h2 = h2_connection(stream).await;
    assert_eq!(h2_get(&mut h2).await.0, StatusCode::OK);

    // Control: without the intermediate, the same client cannot verify the leaf.
    let alone = RustlsConfig::from_config(Arc::new(
        tls::server_config(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).expect("config"),
    ));
    let bare = serve(alone).await;
    let err = connect(bare.addr, default_client(&root.der))
        .await
        .expect_err("no path to the root without the intermediate");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
}
