//! Client-certificate authentication on the webhook port (`--client-ca-file`, `--client-name`),
//! as SECURITY.md states it:
//! - a certificate from the client CA naming an allowed client is answered (directly issued, or
//!   through a short chain of intermediates);
//! - no certificate, an expired one, one from another CA, one naming another client, and one
//!   behind a chain of 10 intermediates are each refused in the TLS handshake: no HTTP answer,
//!   no review counted; each refusal logged once, naming the subject (never a key) and counted;
//! - the client CA file is reloaded like the serving pair: a new CA is trusted without a
//!   restart, and the old one's certificates are then refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use quorumguard_pki::tls::ClientAuth;
use rustls::ClientConfig;
use testkit::guard::{MACHINES, delete_review, review};
use testkit::https::{ClientCa, ClientCert, STEP, TempDir, TestPki, get_plain};
use testkit::logs::{capture, logged};

/// The log lines that report a refused handshake and contain `needle`.
fn refusals(needle: &str) -> Vec<String> {
    logged()
        .lines()
        .filter(|l| l.contains("TLS handshake refused") && l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// The value of the metric line `name value` on the admin port (0 when absent).
async fn metric(admin: SocketAddr, name: &str) -> f64 {
    let (_, text) = get_plain(admin, "/metrics").await;
    text.lines()
        .filter_map(|l| l.strip_prefix(name))
        .filter_map(|rest| rest.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum()
}

/// Polls `probe` every 50 ms until it holds, for at most `bound`.
async fn eventually(bound: Duration, what: &str, mut probe: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !probe() {
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The names the webhook accepts in these tests.
const ALLOWED: [&str; 4] = [
    "kube-apiserver",
    "kube-apiserver-expired",
    "kube-apiserver-other-ca",
    "kube-apiserver-deep",
];

/// One review by a client configured with `tls`: `Ok(allowed)` when answered, the error else.
async fn ask(addr: SocketAddr, tls: Arc<ClientConfig>, uid: &str) -> Result<bool, String> {
    let body = delete_review("cp-a", "jane@example.com", true, uid);
    review(addr, tls, MACHINES, &body).await.map(|a| a.allowed)
}

#[tokio::test]
async fn only_certificates_from_the_client_ca_naming_an_allowed_client_are_answered() {
    let _capture = capture();
    let api = testkit::guard::standin().await;
    let dir = TempDir::new("client-auth");
    let pki = TestPki::new(dir.path());
    let client_ca = ClientCa::new("quorumguard-test-client-ca");
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, &client_ca.pem).expect("write client CA");
    let mut config = testkit::guard::config(&pki, Duration::from_millis(100));
    config.client_auth = Some(ClientAuth {
        ca_file: ca_file.clone(),
        names: ALLOWED.iter().map(|n| (*n).to_owned()).collect(),
    });
    let running = testkit::guard::start(config, &api).await;
    let (addr, admin) = (running.addr, running.admin_addr);
    let h2: &[&[u8]] = &[b"h2"];

    // Accepted: kube-apiserver's certificate, issued directly or through two intermediates.
    let good = client_ca.issue("kube-apiserver");
    let answered = ask(addr, pki.client_with_cert(h2, &good), "good").await;
    assert!(answered.is_ok(), "{answered:?}");
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let chained = client_ca.issue_with("kube-apiserver", now - day, now + day, 2);
    let answered = ask(addr, pki.client_with_cert(h2, &chained), "chained").await;
    assert!(answered.is_ok(), "a chain of 2 intermediates: {answered:?}");
    let counted = "quorumguard_admission_requests_total";
    assert_eq!(metric(admin, counted).await, 2.0);

    // Refused, each in the handshake, each logged once naming its subject.
    let expired = client_ca.issue_with("kube-apiserver-expired", now - 30 * day, now - day, 0);
    let other_ca = ClientCa::new("someone-elses-ca").issue("kube-apiserver-other-ca");
    let wrong_name = client_ca.issue("not-kube-apiserver");
    let deep = client_ca.issue_with("kube-apiserver-deep", now - day, now + day, 10);
    let cases: [(&str, Option<&ClientCert>, &str, &str); 5] = [
        (
            "no certificate",
            None,
            "no client certificate presented",
            "",
        ),
        (
            "expired",
            Some(&expired),
            "CN=kube-apiserver-expired",
            "expired at",
        ),
        (
            "another CA",
            Some(&other_ca),
            "CN=kube-apiserver-other-ca",
            "not issued by a trusted CA",
        ),
        (
            "a name not allowed",
            Some(&wrong_name),
            "CN=not-kube-apiserver",
            "names none of the allowed clients",
        ),
        (
            "10 intermediates",
            Some(&deep),
            "CN=kube-apiserver-deep",
            "longer than the 6 intermediate",
        ),
    ];
    for (i, (case, cert, subject, why)) in cases.iter().enumerate() {
        let tls = match cert {
            Some(cert) => pki.client_with_cert(h2, cert),
            None => pki.client(h2),
        };
        let before = refusals(subject).len();
        let refused = ask(addr, tls, case).await;
        assert!(refused.is_err(), "{case}: answered {refused:?}");
        eventually(STEP, &format!("{case}: the refusal is logged"), || {
            refusals(subject).len() > before
        })
        .await;
        // Logged once: give a second line the time to appear, then count.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let lines = refusals(subject);
        assert_eq!(lines.len(), before + 1, "{case}: {lines:#?}");
        let line = lines.last().map(String::as_str).unwrap_or_default();
        assert!(line.contains(why), "{case}: {why:?} in {line}");
        assert!(line.contains("\"peer\":\"127.0.0.1:"), "{case}: {line}");
        assert!(line.contains("\"WARN\""), "{case}: {line}");
        assert_eq!(
            metric(admin, "quorumguard_client_certificate_refusals_total").await,
            (i + 1) as f64,
            "{case}"
        );
    }
    assert_eq!(
        metric(admin, counted).await,
        2.0,
        "no refused client's review was read or counted"
    );

    // Never a key: no line of any client key's PEM body is logged.
    let everything = logged();
    for cert in [&good, &chained, &expired, &other_ca, &wrong_name, &deep] {
        for line in cert.key_pem.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!everything.contains(line), "a key line was logged: {line}");
        }
    }

    // The client CA is reloaded: a new CA is trusted, and the old CA's certificates refused.
    let new_ca = ClientCa::new("quorumguard-test-client-ca-2");
    std::fs::write(&ca_file, &new_ca.pem).expect("rewrite client CA");
    let renewed = new_ca.issue("kube-apiserver");
    let deadline = Instant::now() + STEP;
    while ask(addr, pki.client_with_cert(h2, &renewed), "renewed")
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the new client CA is not trusted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let old = ask(addr, pki.client_with_cert(h2, &good), "old").await;
    assert!(old.is_err(), "the replaced CA's certificate: {old:?}");

    // A bad CA file never replaces a good one.
    std::fs::write(&ca_file, "not a certificate\n").expect("break client CA");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = ask(addr, pki.client_with_cert(h2, &renewed), "still").await;
    assert!(still.is_ok(), "after a bad CA file: {still:?}");
    running.shutdown().await;
}

#[tokio::test]
async fn without_a_client_ca_any_client_is_answered_as_before() {
    let api = testkit::guard::standin().await;
    let dir = TempDir::new("client-auth-off");
    let pki = TestPki::new(dir.path());
    let running = testkit::guard::start(
        testkit::guard::config(&pki, Duration::from_millis(100)),
        &api,
    )
    .await;
    let h2: &[&[u8]] = &[b"h2"];
    let stranger = ClientCa::new("anyone").issue("anyone");
    for (case, tls) in [
        ("no certificate", pki.client(h2)),
        ("any certificate", pki.client_with_cert(h2, &stranger)),
    ] {
        let answered = ask(running.addr, tls, case).await;
        assert!(answered.is_ok(), "{case}: {answered:?}");
    }
    running.shutdown().await;
}
