//! A test CA, a serving certificate for 127.0.0.1, and a small HTTPS client that speaks h2 (as
//! kube-apiserver does to webhooks) or HTTP/1.1, for tests of the running webhook.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Every network step of a test is bounded by this.
pub const STEP: Duration = Duration::from_secs(10);

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "quorumguard-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA and its serving certificate for `localhost` and 127.0.0.1, written as tls.crt (leaf +
/// CA chain) and tls.key.
pub struct TestPki {
    pub ca: CertificateDer<'static>,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl TestPki {
    pub fn new(dir: &Path) -> TestPki {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).expect("CA");
        let pki = TestPki {
            ca: ca.der().clone(),
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
            issuer: Issuer::new(params, ca_key),
        };
        pki.write_leaf("quorumguard-test");
        std::fs::write(dir.join("ca.crt"), ca.pem()).expect("write ca.crt");
        pki
    }

    /// Writes a new serving pair (a fresh key); returns the leaf DER.
    pub fn write_leaf(&self, cn: &str) -> CertificateDer<'static> {
        let now = std::time::SystemTime::now();
        let day = Duration::from_secs(86_400);
        self.write_leaf_valid(cn, now - day, now + 365 * day)
    }

    /// Writes a new serving pair (a fresh key) valid from `not_before` to `not_after`; returns
    /// the leaf DER.
    pub fn write_leaf_valid(
        &self,
        cn: &str,
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
    ) -> CertificateDer<'static> {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.issuer).expect("leaf");
        std::fs::write(&self.cert_file, cert.pem()).expect("write tls.crt");
        std::fs::write(&self.key_file, key.serialize_pem()).expect("write tls.key");
        cert.der().clone()
    }

    /// A client trusting the test CA, offering `alpn`.
    pub fn client(&self, alpn: &[&[u8]]) -> Arc<ClientConfig> {
        let mut store = RootCertStore::empty();
        store.add(self.ca.clone()).expect("root");
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(store)
                .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// Opens a TLS connection to `addr` (server name `localhost`).
pub async fn connect(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    tokio::time::timeout(STEP, async {
        let tcp = TcpStream::connect(addr).await?;
        // As kube-apiserver's Go client: Nagle off, so a request's frames are not held back
        // waiting for the server's delayed ACK (a 40 ms stall in the latency figures).
        tcp.set_nodelay(true)?;
        TlsConnector::from(config).connect(name, tcp).await
    })
    .await
    .map_err(|_| std::io::Error::other("TLS connect timed out"))?
}

/// The ALPN protocol the server chose.
pub fn alpn(stream: &TlsStream<TcpStream>) -> Option<Vec<u8>> {
    stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec)
}

/// One POST over a fresh connection: h2 when the server picks it, else HTTP/1.1.
pub async fn post(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (StatusCode, Bytes) {
    let request = Request::post(path)
        .header("content-type", content_type)
        .header("host", "localhost")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    send(addr, config, request)
        .await
        .unwrap_or_else(|e| panic!("POST https://{addr}{path}: {e}"))
}

/// Any request over a fresh connection (h2 when the server picks it, else HTTP/1.1), each step
/// bounded by [`STEP`]; an error instead of a panic when the server refuses or closes.
pub async fn send(
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, Bytes), String> {
    let stream = connect(addr, config)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let h2 = alpn(&stream).as_deref() == Some(b"h2");
    let response = tokio::time::timeout(STEP, async {
        if h2 {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .map_err(|e| format!("h2 handshake: {e}"))?;
            tokio::spawn(conn);
            sender.send_request(request).await
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("http1 handshake: {e}"))?;
            tokio::spawn(conn);
            sender.send_request(request).await
        }
        .map_err(|e| format!("response: {e}"))
    })
    .await
    .map_err(|_| "no response within the step bound".to_string())??;
    let status = response.status();
    let body = tokio::time::timeout(STEP, response.into_body().collect())
        .await
        .map_err(|_| "no body within the step bound".to_string())?
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, body))
}

/// GET over plain HTTP (the admin port).
pub async fn get_plain(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    try_get_plain(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// GET over plain HTTP; an error instead of a panic while the server may not be up yet.
pub async fn try_get_plain(addr: SocketAddr, path: &str) -> Result<(StatusCode, String), String> {
    let attempt = async {
        let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let request = Request::get(path)
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(STEP, attempt)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// A CA that issues client certificates (kube-apiserver's, in production), kept apart from the
/// serving CA as a cluster's front-proxy or webhook-client CA would be.
pub struct ClientCa {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A client certificate chain (leaf first, then any intermediates) and its key.
pub struct ClientCert {
    pub chain: Vec<CertificateDer<'static>>,
    pub chain_pem: String,
    pub key_pem: String,
}

impl ClientCa {
    pub fn new(cn: &str) -> ClientCa {
        let key = KeyPair::generate().expect("client CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let ca = params.self_signed(&key).expect("client CA");
        ClientCa {
            pem: ca.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A client-authentication certificate for common name `cn`, valid for a year from a day ago.
    pub fn issue(&self, cn: &str) -> ClientCert {
        let now = std::time::SystemTime::now();
        let day = Duration::from_secs(86_400);
        self.issue_with(cn, now - day, now + 365 * day, 0)
    }

    /// A client-authentication certificate for `cn`, valid from `not_before` to `not_after`,
    /// issued through a chain of `intermediates` intermediate CAs below this one.
    pub fn issue_with(
        &self,
        cn: &str,
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
        intermediates: usize,
    ) -> ClientCert {
        let mut above: Vec<rcgen::Certificate> = Vec::new();
        let mut owned: Option<Issuer<'static, KeyPair>> = None;
        for i in 0..intermediates {
            let key = KeyPair::generate().expect("intermediate key");
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, format!("intermediate {}", i + 1));
            let cert = params
                .signed_by(&key, owned.as_ref().unwrap_or(&self.issuer))
                .expect("intermediate");
            above.push(cert);
            owned = Some(Issuer::new(params, key));
        }
        let key = KeyPair::generate().expect("client key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let leaf = params
            .signed_by(&key, owned.as_ref().unwrap_or(&self.issuer))
            .expect("client certificate");
        let mut chain = vec![leaf.der().clone()];
        let mut chain_pem = leaf.pem();
        for cert in above.iter().rev() {
            chain.push(cert.der().clone());
            chain_pem.push_str(&cert.pem());
        }
        ClientCert {
            chain,
            chain_pem,
            key_pem: key.serialize_pem(),
        }
    }
}

impl TestPki {
    /// [`TestPki::client`], presenting `cert` when the server asks for a client certificate.
    pub fn client_with_cert(&self, alpn: &[&[u8]], cert: &ClientCert) -> Arc<ClientConfig> {
        let mut store = RootCertStore::empty();
        store.add(self.ca.clone()).expect("root");
        use rustls::pki_types::{PrivateKeyDer, pem::PemObject};
        let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).expect("client key");
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(store)
                .with_client_auth_cert(cert.chain.clone(), key)
                .expect("client certificate");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}
