//! Security properties of the running server, as SECURITY.md states them:
//! - TLS 1.3 and 1.2 only, AEAD suites with forward secrecy only, as another TLS implementation
//!   (the `openssl s_client` CLI) sees them;
//! - no admission review is answered over plain HTTP, on the webhook port or the admin port;
//! - an expired or not-yet-valid serving certificate is still served (kube-apiserver refuses it,
//!   and a verifying client here does too), logged as an error naming the file and the times,
//!   exported as metrics, and replaced without a restart once renewed;
//! - identities are matched exactly: a user that merely looks like the KCP controller or a
//!   teardown identity, anonymous users and `system:masters` are judged as any person;
//! - the contents of the Secrets quorumguard reads (the etcd CA and its key) and its own keys
//!   never reach its logs (captured here at TRACE for every crate) or its metrics.
//! - 1,000 forged allowed deletions hold at most one reservation per Machine of the control
//!   plane (plus the newest), whatever Machines they name.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use quorumguard_playground::world::{World, WorldOptions};
use serde_json::{Value, json};
use testkit::https::{STEP, TempDir, TestPki, get_plain, send};
use testkit::logs::{capture, logged};
use testkit::reviews::{KCP_CONTROLLER, fixture, machine_named};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Polls `probe` every 50 ms until it returns `Some`, for at most `bound`.
async fn within<T>(bound: Duration, what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `openssl s_client` against `addr` with `args`: (handshake completed, everything it printed).
fn s_client(addr: SocketAddr, ca: &Path, args: &[String]) -> (bool, String) {
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-servername",
            "localhost",
        ])
        .arg("-CAfile")
        .arg(ca)
        .args(["-verify_return_error", "-brief"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl on PATH (scripts/deps.sh installs it)");
    // Closing stdin makes s_client end the session right after the handshake.
    drop(child.stdin.take());
    let deadline = Instant::now() + STEP;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("openssl s_client {args:?} did not finish within {STEP:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // -brief prints the negotiated protocol only once the handshake has completed.
    (text.contains("Protocol version:"), text)
}

#[tokio::test]
async fn only_tls_1_3_and_1_2_with_aead_forward_secret_suites_are_negotiated() {
    let api = testkit::guard::standin().await;
    let dir = TempDir::new("security-tls");
    let pki = TestPki::new(dir.path());
    let running = testkit::guard::start(testkit::guard::config(&pki, STEP), &api).await;
    let (addr, ca) = (running.addr, dir.path().join("ca.crt"));

    let check = |args: &[&str]| {
        let (ca, args) = (
            ca.clone(),
            args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        );
        async move {
            tokio::task::spawn_blocking(move || s_client(addr, &ca, &args))
                .await
                .expect("join")
        }
    };
    let (ok, out) = check(&["-tls1_3"]).await;
    assert!(ok && out.contains("Protocol version: TLSv1.3"), "{out}");
    let (ok, out) = check(&["-tls1_2"]).await;
    assert!(ok && out.contains("Protocol version: TLSv1.2"), "{out}");

    // Old protocol versions, offered by a client willing to use them (SECLEVEL=0), are refused
    // by the server (rustls answers with a handshake_failure alert), not merely left unoffered by
    // the client.
    for version in ["-tls1_1", "-tls1"] {
        let (ok, out) = check(&[version, "-cipher", "DEFAULT:@SECLEVEL=0"]).await;
        assert!(!ok, "{version} was negotiated: {out}");
        assert!(
            out.contains("alert handshake failure") && out.contains("SSL alert number 40"),
            "{version}: the server's alert: {out}"
        );
    }

    // TLS 1.2: of every suite this OpenSSL knows (at SECLEVEL 0: CBC, RSA key exchange, CCM,
    // ARIA, CAMELLIA, PSK...), exactly the ECDHE + AEAD ones for the ECDSA serving key are
    // negotiated; every other one is refused by the server with a handshake_failure alert.
    let listed = Command::new("openssl")
        .args(["ciphers", "-v", "ALL:COMPLEMENTOFALL:@SECLEVEL=0"])
        .output()
        .expect("openssl ciphers");
    let suites: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let (name, version) = (cols.next()?, cols.next()?);
            (version != "TLSv1.3").then(|| name.to_owned())
        })
        .collect();
    assert!(suites.len() > 20, "OpenSSL lists {} suites", suites.len());
    let (mut accepted, mut tried) = (Vec::new(), 0);
    for suite in &suites {
        let cipher = format!("{suite}:@SECLEVEL=0");
        let (ok, out) = check(&["-tls1_2", "-cipher", &cipher]).await;
        // PSK and SRP suites need credentials the client does not have: never offered.
        if out.contains("no ciphers available") {
            continue;
        }
        tried += 1;
        if ok {
            assert!(
                out.contains(&format!("Ciphersuite: {suite}")),
                "{suite}: {out}"
            );
            accepted.push(suite.as_str());
        } else {
            assert!(
                out.contains("SSL alert number 40"),
                "{suite}: the server's alert: {out}"
            );
        }
    }
    accepted.sort_unstable();
    assert_eq!(
        accepted,
        [
            "ECDHE-ECDSA-AES128-GCM-SHA256",
            "ECDHE-ECDSA-AES256-GCM-SHA384",
            "ECDHE-ECDSA-CHACHA20-POLY1305",
        ],
        "of {tried} TLS 1.2 suites offered"
    );
    assert!(tried > 20, "only {tried} suites could be offered");
    running.shutdown().await;
}

#[tokio::test]
async fn admission_is_never_answered_over_plain_http() {
    let api = testkit::guard::standin().await;
    let dir = TempDir::new("security-plain");
    let pki = TestPki::new(dir.path());
    let running = testkit::guard::start(testkit::guard::config(&pki, STEP), &api).await;
    let review = serde_json::to_vec(&fixture("machine-delete-by-user.json")).expect("json");

    // The webhook port speaks TLS only: a plain HTTP request gets no HTTP answer (at most a
    // TLS alert record) and the connection is closed.
    let mut tcp = TcpStream::connect(running.addr).await.expect("connect");
    let head = format!(
        "POST /validate/machines HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        review.len()
    );
    tcp.write_all(head.as_bytes()).await.expect("write");
    tcp.write_all(&review).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(STEP, tcp.read_to_end(&mut answer))
        .await
        .expect("closed within the step bound")
        .ok();
    assert!(
        !String::from_utf8_lossy(&answer).contains("HTTP/"),
        "plain HTTP answered on the webhook port: {}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        answer.is_empty() || answer[0] == 0x15,
        "only a TLS alert record may come back: {answer:?}"
    );

    // The admin port is plain HTTP and serves probes and metrics only: no admission path.
    for path in ["/validate/machines", "/validate/kubeadmcontrolplanes"] {
        let request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(review.clone())))
            .expect("request");
        let (status, body) = plain(running.admin_addr, request).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "POST {path} on the admin port: {body}"
        );
    }
    let (status, _) = get_plain(running.admin_addr, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    running.shutdown().await;
}

/// One request over plain HTTP/1.1.
async fn plain(addr: SocketAddr, request: Request<Full<Bytes>>) -> (StatusCode, String) {
    use http_body_util::BodyExt;
    use hyper_util::rt::TokioIo;
    let attempt = async {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let response = sender.send_request(request).await.expect("response");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(STEP, attempt)
        .await
        .expect("answered within the step bound")
}

/// The value of a metric line `name value` in the admin port's /metrics.
async fn metric(admin: SocketAddr, name: &str) -> Option<f64> {
    let (_, text) = get_plain(admin, "/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn unix(t: SystemTime) -> i64 {
    quorumguard_pki::certs::unix_secs(t)
}

/// Starts the webhook with a serving certificate valid from `not_before` to `not_after`, checks
/// that a verifying client (as kube-apiserver is) refuses it with `refusal`, that the server
/// logs `logged` and exports the validity, then renews the certificate and checks that reviews
/// are answered again without a restart.
async fn served_certificate_outside_validity(
    tag: &str,
    not_before: SystemTime,
    not_after: SystemTime,
    refusal: &str,
    logged_phrase: &str,
) {
    let _capture = capture();
    let api = testkit::guard::standin().await;
    let dir = TempDir::new(tag);
    let pki = TestPki::new(dir.path());
    pki.write_leaf_valid("quorumguard-test", not_before, not_after);
    let reload = Duration::from_millis(100);
    let running = testkit::guard::start(testkit::guard::config(&pki, reload), &api).await;

    let review = serde_json::to_vec(&fixture("machine-delete-by-user.json")).expect("json");
    let request = || {
        Request::post("/validate/machines")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(review.clone())))
            .expect("request")
    };
    let err = send(running.addr, pki.client(&[b"h2"]), request())
        .await
        .expect_err("a verifying client refuses the certificate");
    assert!(err.contains(refusal), "{err}");

    let cert_file = pki.cert_file.display().to_string();
    let line = within(STEP, "the validity problem is logged", async || {
        logged()
            .lines()
            .find(|l| l.contains(&cert_file) && l.contains(logged_phrase))
            .map(str::to_owned)
    })
    .await;
    let entry: Value = serde_json::from_str(&line).expect("a JSON log line");
    assert_eq!(entry["level"], "ERROR", "{line}");
    let message = entry["fields"]["message"].as_str().unwrap_or_default();
    for part in ["failurePolicy Fail", "quorumguard certs", "(now "] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    let exported = metric(
        running.admin_addr,
        "quorumguard_serving_certificate_not_after_timestamp_seconds",
    )
    .await;
    assert_eq!(exported, Some(unix(not_after) as f64));
    let exported = metric(
        running.admin_addr,
        "quorumguard_serving_certificate_not_before_timestamp_seconds",
    )
    .await;
    assert_eq!(exported, Some(unix(not_before) as f64));

    // Renewed: answered again, the metric follows, an info line says it is valid.
    let renewed_until = SystemTime::now() + Duration::from_secs(90 * 86_400);
    pki.write_leaf_valid(
        "quorumguard-renewed",
        SystemTime::now() - Duration::from_secs(3600),
        renewed_until,
    );
    let (status, body) = within(STEP, "answered after renewal", async || {
        send(running.addr, pki.client(&[b"h2"]), request())
            .await
            .ok()
    })
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    within(STEP, "the metric follows the renewal", async || {
        let v = metric(
            running.admin_addr,
            "quorumguard_serving_certificate_not_after_timestamp_seconds",
        )
        .await?;
        (v == unix(renewed_until) as f64).then_some(())
    })
    .await;
    running.shutdown().await;
}

#[tokio::test]
async fn an_expired_certificate_is_served_refused_by_clients_logged_and_replaced_live() {
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    served_certificate_outside_validity(
        "security-expired",
        now - 30 * day,
        now - day,
        "expired",
        "expired at",
    )
    .await;
}

#[tokio::test]
async fn a_not_yet_valid_certificate_is_served_refused_by_clients_logged_and_replaced_live() {
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    served_certificate_outside_validity(
        "security-future",
        now + day,
        now + 90 * day,
        "not valid yet",
        "is not valid before",
    )
    .await;
}

#[tokio::test]
async fn identities_are_matched_exactly_and_groups_grant_nothing() {
    let api = testkit::guard::standin().await;
    let dir = TempDir::new("security-users");
    let pki = TestPki::new(dir.path());
    let running = testkit::guard::start(testkit::guard::config(&pki, STEP), &api).await;

    // A deletion that only the KCP controller may make (it takes the control plane below its 3
    // desired replicas) and that only a teardown identity may make unconditionally. Dry runs, so
    // an allowed one reserves nothing and every case sees the same control plane.
    let judge = async |username: &str, groups: Value| -> (bool, String) {
        let mut r = fixture("machine-delete-by-user.json");
        r["request"]["uid"] = json!(format!("uid-{}", username.len()));
        r["request"]["name"] = json!("test-cp-a");
        r["request"]["dryRun"] = json!(true);
        r["request"]["userInfo"] = json!({"username": username, "groups": groups});
        r["request"]["oldObject"] = machine_named("test-cp-a", "cp-a");
        testkit::guard::verdict(&running, &pki, "/validate/machines", &r).await
    };
    let gc = "system:serviceaccount:kube-system:generic-garbage-collector";
    let people = [
        ("jane@example.com", json!(["system:authenticated"])),
        ("system:anonymous", json!(["system:unauthenticated"])),
        ("admin", json!(["system:masters", "system:authenticated"])),
        (
            &*KCP_CONTROLLER.to_uppercase(),
            json!(["system:serviceaccounts"]),
        ),
        (
            &*format!("{KCP_CONTROLLER} "),
            json!(["system:serviceaccounts"]),
        ),
        (
            "system:serviceaccount:default:capi-kubeadm-control-plane-manager",
            json!(["system:serviceaccounts"]),
        ),
        (&*format!("{gc}2"), json!(["system:serviceaccounts"])),
        ("system:kube-controller-manager:x", json!([])),
    ];
    for (user, groups) in people {
        let (allowed, reason) = judge(user, groups).await;
        assert!(!allowed, "{user:?} was let through as {reason}");
        assert_eq!(reason, "BelowDesiredReplicas", "{user:?}");
    }
    let (allowed, reason) = judge(KCP_CONTROLLER, json!(["system:serviceaccounts"])).await;
    assert!(allowed, "the KCP controller itself: {reason}");
    let (allowed, reason) = judge(gc, json!(["system:serviceaccounts"])).await;
    assert!(allowed && reason == "TeardownRequester", "{reason}");
    running.shutdown().await;
}

#[tokio::test]
async fn secret_contents_and_keys_never_reach_the_logs_or_metrics() {
    let _capture = capture();
    let dir = TempDir::new("security-secrets");
    let world = World::start(WorldOptions::new(dir.path().join("world")), |_| {})
        .await
        .expect("the playground world starts");
    let healthy = within(
        Duration::from_secs(30),
        "EtcdQuorum Healthy published",
        async || {
            let c = world.conditions();
            (c.quorum_reason() == "Healthy").then_some(c)
        },
    )
    .await;
    assert_eq!(healthy.action(), "None");
    // The guard did read the etcd CA Secret (so its contents were in its hands).
    let secret_reads = world
        .api
        .stand_in()
        .expect("the playground runs on the stand-in")
        .requests()
        .iter()
        .filter(|r| r.verb == "get" && r.path.contains("/secrets/"))
        .count();
    assert!(secret_reads >= 1, "the etcd CA Secret was never read");

    // What must never appear: the Secret's values as stored (base64), decoded, and each line of
    // each PEM body; the webhook's own private key file the same way.
    let secret_ar = kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&());
    let secret = world
        .api
        .get(&secret_ar, "default", "demo-etcd")
        .expect("Secret default/demo-etcd");
    let typed: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(secret.clone()).expect("a Secret");
    let mut needles = Vec::new();
    for (key, value) in typed.data.unwrap_or_default() {
        if let Some(stored) = secret["data"][&key].as_str() {
            needles.push(stored.to_owned());
        }
        if key.ends_with(".key") {
            needles.extend(pem_body_lines(&String::from_utf8_lossy(&value.0)));
        }
    }
    for entry in walk(&world.dir) {
        if entry.extension().is_some_and(|e| e == "key") {
            let pem = std::fs::read_to_string(&entry).expect("read key");
            needles.extend(pem_body_lines(&pem));
        }
    }
    assert!(
        needles.len() >= 4,
        "keys found to look for: {}",
        needles.len()
    );

    let (_, admin) = world.server_addrs().expect("serve is running");
    let (_, metrics) = get_plain(admin, "/metrics").await;
    world.shutdown().await;
    let logs = logged();
    assert!(
        logs.contains("quorumguard") && logs.lines().count() > 100,
        "the capture saw the guard at work ({} lines)",
        logs.lines().count()
    );
    for needle in &needles {
        assert!(
            !logs.contains(needle.as_str()),
            "secret material in the logs: {needle}"
        );
        assert!(
            !metrics.contains(needle.as_str()),
            "secret material in /metrics: {needle}"
        );
    }
}

/// The base64 lines of a PEM body (each long enough to be unmistakable).
fn pem_body_lines(pem: &str) -> Vec<String> {
    pem.lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 32)
        .map(str::to_owned)
        .collect()
}

/// Every file under `dir`, recursively (bounded by the tree the world wrote).
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// What a flood of forged allowed deletions can hold: 1,000 reviews of the fixture control
/// plane (3 healthy members) as if from the KCP controller, half naming its real Machines and
/// half Machines that do not exist, with and without the break-glass annotation. The
/// reservations they leave stay within what the quorum arithmetic allows.
#[tokio::test]
async fn a_thousand_forged_allowed_deletions_hold_a_bounded_number_of_reservations() {
    let api = testkit::guard::standin().await;
    let dir = TempDir::new("security-forged-deletions");
    let pki = TestPki::new(dir.path());
    let running =
        testkit::guard::start(testkit::guard::config(&pki, Duration::from_secs(60)), &api).await;
    let tls = pki.client(&[b"h2"]);
    let started = Instant::now();
    let (mut allowed, mut most) = (0, 0);
    for i in 0..1000usize {
        let member = match i % 4 {
            0 | 1 => ["cp-a", "cp-b", "cp-c"][i % 3].to_owned(),
            _ => format!("forged-{i}"),
        };
        let mut body =
            testkit::guard::delete_review(&member, KCP_CONTROLLER, false, &format!("f{i}"));
        if i % 4 == 3 {
            body["request"]["oldObject"]["metadata"]["annotations"]["quorumguard.io/allow-unsafe-delete"] =
                json!("forged");
        }
        let answer =
            testkit::guard::review(running.addr, tls.clone(), testkit::guard::MACHINES, &body)
                .await
                .unwrap_or_else(|e| panic!("review {i}: {e}"));
        allowed += usize::from(answer.allowed);
        most = most.max(running.webhook.reservations());
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "1,000 reviews took over 2 minutes"
        );
    }
    assert!(
        allowed >= 500,
        "the forged deletions were allowed: {allowed}"
    );
    // At most one reservation per Machine of the control plane (3), plus the one the last review
    // made before the next review prunes what does not exist. Before that pruning, the Machines
    // that do not exist held one reservation each: 501 here.
    assert!(most <= 4, "at most 4 reservations at a time, saw {most}");
    running.shutdown().await;
}
