//! Bad input over the wire (issue 7): the running webhook (in-process, HTTPS on 127.0.0.1, fed
//! by the API-server stand-in) gets wrong methods, paths and content types, malformed and
//! hostile bodies, a client dripping its headers, garbage instead of TLS and many idle
//! connections. Each is answered with the right status and a message naming the problem, or the
//! connection is closed, within a bound; after each the server still judges a good Machine
//! DELETE review correctly.
//!
//! Memory is read from /proc/self/status (VmRSS) of the whole test process: the server runs in
//! it, and so do the clients and whichever other tests of this file run at the same time, so the
//! bound is generous on purpose.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use quorumguard_cli::server::Running;
use serde_json::{Value, json};
use testkit::apiserver::ApiServer;
use testkit::https::{TempDir, TestPki, connect, post, send};
use testkit::reviews::{NS, fixture, machine_named};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every outcome asserted here must arrive within this.
const BOUND: Duration = Duration::from_secs(5);
/// How much the test process's resident memory may grow over a hostile case.
const RSS_GROWTH: u64 = 200 * 1024 * 1024;

struct World {
    _api: ApiServer,
    running: Running,
    pki: TestPki,
    _dir: TempDir,
}

/// A server whose caches hold Cluster `test`, its KCP (replicas 3) and Machines test-cp-{a,b,c},
/// all three etcd members healthy.
async fn world() -> World {
    let api = testkit::guard::standin().await;
    let dir = TempDir::new("bad-input");
    let pki = TestPki::new(dir.path());
    let config = testkit::guard::config(&pki, Duration::from_secs(5));
    let running = testkit::guard::start(config, &api).await;
    World {
        _api: api,
        running,
        pki,
        _dir: dir,
    }
}

impl World {
    fn addr(&self) -> SocketAddr {
        self.running.addr
    }

    /// A request with this method, path, content type and body, over h2 or HTTP/1.1.
    async fn call(
        &self,
        alpn: &[u8],
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<(StatusCode, String), String> {
        let mut b = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost");
        if let Some(ct) = content_type {
            b = b.header("content-type", ct);
        }
        let request = b.body(Full::new(Bytes::from(body))).expect("request");
        let (status, bytes) =
            tokio::time::timeout(BOUND, send(self.addr(), self.pki.client(&[alpn]), request))
                .await
                .map_err(|_| format!("no answer within {BOUND:?}"))??;
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// POSTs `body` as JSON to /validate/machines over h2.
    async fn machines(&self, body: Vec<u8>) -> (StatusCode, String) {
        self.call(
            b"h2",
            Method::POST,
            "/validate/machines",
            Some("application/json"),
            body,
        )
        .await
        .unwrap_or_else(|e| panic!("POST /validate/machines: {e}"))
    }

    /// The server still judges a good review: a human deleting one of three healthy Machines
    /// of a KCP with three replicas is refused (a refusal reserves nothing, so it repeats).
    async fn still_serves(&self, after: &str) {
        let mut r = fixture("machine-delete-by-user.json");
        r["request"]["uid"] = json!("uid-good-review");
        r["request"]["name"] = json!("test-cp-a");
        r["request"]["userInfo"]["username"] = json!("jane@example.com");
        r["request"]["oldObject"] = machine_named("test-cp-a", "cp-a");
        let (status, bytes) = tokio::time::timeout(
            BOUND,
            post(
                self.addr(),
                self.pki.client(&[b"h2"]),
                "/validate/machines",
                "application/json",
                serde_json::to_vec(&r).expect("json"),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("after {after}: no answer to a good review within {BOUND:?}"));
        let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "after {after}: not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        });
        assert_eq!(status, StatusCode::OK, "after {after}: {v}");
        assert_eq!(
            v["response"]["uid"], "uid-good-review",
            "after {after}: {v}"
        );
        assert_eq!(v["response"]["allowed"], false, "after {after}: {v}");
        assert_eq!(
            v["response"]["auditAnnotations"]["reason"], "BelowDesiredReplicas",
            "after {after}: {v}"
        );
    }
}

/// The fixture Machine DELETE review by a human, as a JSON value to break.
fn good_review() -> Value {
    let mut r = fixture("machine-delete-by-user.json");
    r["request"]["userInfo"]["username"] = json!("jane@example.com");
    r
}

fn assert_400(case: &str, (status, body): &(StatusCode, String), needles: &[&str]) {
    assert_eq!(*status, StatusCode::BAD_REQUEST, "{case}: {body}");
    for n in needles {
        assert!(body.contains(n), "{case}: {n:?} missing from {body:?}");
    }
}

/// Resident memory of this whole test process (server, clients and any concurrent test).
fn vm_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in kB");
    kb * 1024
}

fn assert_rss_bounded(case: &str, before: u64) {
    let after = vm_rss_bytes();
    let growth = after.saturating_sub(before);
    assert!(
        growth < RSS_GROWTH,
        "{case}: the test process grew by {} MiB ({} -> {} MiB)",
        growth / 1024 / 1024,
        before / 1024 / 1024,
        after / 1024 / 1024
    );
}

/// Reads until the peer closes (EOF or an error such as a reset), for at most `within`.
/// Returns whether it closed.
async fn closed_within<R: tokio::io::AsyncRead + Unpin>(r: &mut R, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        // Bounded: a peer that keeps talking for 1,000 reads is not closing.
        for _ in 0..1_000 {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
        false
    })
    .await
    .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_paths_and_content_types() {
    let w = world().await;
    w.still_serves("start").await;
    let body = serde_json::to_vec(&good_review()).expect("json");

    for alpn in [&b"h2"[..], b"http/1.1"] {
        let proto = String::from_utf8_lossy(alpn).into_owned();
        for method in [Method::GET, Method::PUT, Method::DELETE] {
            let case = format!("{method} /validate/machines over {proto}");
            let got = w
                .call(
                    alpn,
                    method,
                    "/validate/machines",
                    Some("application/json"),
                    body.clone(),
                )
                .await
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(got.0, StatusCode::METHOD_NOT_ALLOWED, "{case}: {got:?}");
            w.still_serves(&case).await;
        }
        for path in ["/", "/validate", "/validate/pods", "/validate/machines/x"] {
            let case = format!("POST {path} over {proto}");
            let got = w
                .call(
                    alpn,
                    Method::POST,
                    path,
                    Some("application/json"),
                    body.clone(),
                )
                .await
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(got.0, StatusCode::NOT_FOUND, "{case}: {got:?}");
            w.still_serves(&case).await;
        }
        for ct in [
            "text/plain",
            "application/yaml",
            "application/x-www-form-urlencoded",
            "application/jsonx",
        ] {
            let case = format!("Content-Type {ct} over {proto}");
            let (status, msg) = w
                .call(
                    alpn,
                    Method::POST,
                    "/validate/machines",
                    Some(ct),
                    body.clone(),
                )
                .await
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{case}: {msg}");
            assert!(msg.contains("application/json"), "{case}: {msg}");
            w.still_serves(&case).await;
        }
    }
    // Parameters and case do not matter; no Content-Type at all is taken as JSON.
    for ct in [
        Some("application/json; charset=utf-8"),
        Some("Application/JSON"),
        None,
    ] {
        let got = w
            .call(b"h2", Method::POST, "/validate/machines", ct, body.clone())
            .await
            .expect("answer");
        assert_eq!(got.0, StatusCode::OK, "{ct:?}: {got:?}");
    }
    w.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_reviews_are_400_naming_the_problem() {
    let w = world().await;
    w.still_serves("start").await;
    let with = |edit: &dyn Fn(&mut Value)| {
        let mut r = good_review();
        edit(&mut r);
        serde_json::to_vec(&r).expect("json")
    };
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        ("empty body", Vec::new(), &["not valid JSON", "EOF"]),
        (
            "invalid JSON",
            b"{\"apiVersion\": \"admission.k8s.io/v1\",".to_vec(),
            &["not valid JSON"],
        ),
        (
            "JSON null",
            b"null".to_vec(),
            &["not an AdmissionReview", "expected a JSON object, got null"],
        ),
        (
            "a JSON array",
            b"[1, 2, 3]".to_vec(),
            &[
                "not an AdmissionReview",
                "expected a JSON object, got an array",
            ],
        ),
        (
            "request is a string",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":"x"}"#
                .to_vec(),
            &["not an AdmissionReview"],
        ),
        (
            "request without uid or kind",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}"#
                .to_vec(),
            &["not an AdmissionReview"],
        ),
        (
            "AdmissionReview v1beta1",
            with(&|r| r["apiVersion"] = json!("admission.k8s.io/v1beta1")),
            &["admission.k8s.io/v1beta1", "admissionReviewVersions [v1]"],
        ),
        (
            "missing request",
            with(&|r| {
                r.as_object_mut().expect("object").remove("request");
            }),
            &["has no request"],
        ),
        (
            "request null",
            with(&|r| r["request"] = Value::Null),
            &["has no request"],
        ),
        (
            "DELETE without oldObject",
            with(&|r| {
                r["request"]
                    .as_object_mut()
                    .expect("request")
                    .remove("oldObject");
            }),
            &["must carry oldObject"],
        ),
        (
            "a Machine review whose oldObject is a Pod",
            with(&|r| {
                r["request"]["oldObject"] = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "test-cp-a", "namespace": NS}});
            }),
            &["Pod"],
        ),
        (
            "invalid UTF-8 in a string",
            {
                let s = serde_json::to_string(&good_review()).expect("json");
                let at = s.find("jane@example.com").expect("username");
                let mut b = s.into_bytes();
                b[at] = 0xff;
                b[at + 1] = 0xfe;
                b
            },
            &["not valid JSON", "invalid unicode code point"],
        ),
        (
            "invalid UTF-8 outside strings",
            vec![0xc3, 0x28, 0xa0, 0xa1, 0xff],
            &["not valid JSON"],
        ),
    ];
    for (case, body, needles) in cases {
        let got = w.machines(body).await;
        assert_400(case, &got, needles);
        w.still_serves(case).await;
    }

    // A review of a kind the machines endpoint does not judge: allowed, with a warning.
    let pod = with(&|r| {
        r["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
        r["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "pods"});
        r["request"]["oldObject"] = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": NS}});
    });
    let (status, body) = w.machines(pod).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["response"]["allowed"], true, "{v}");
    assert!(
        v["response"]["warnings"][0]
            .as_str()
            .is_some_and(|m| m.contains("does not judge") && m.contains("Pod")),
        "{v}"
    );
    w.still_serves("a Pod review").await;

    // A number beyond f64 in a field the guard does not read is skipped unconverted by the
    // one-pass decoder, as Go's encoding/json skips unknown fields: the review is judged as
    // usual. (Out of range where it is read, in spec.replicas, is a 400: below.)
    let ignored = serde_json::to_string(&good_review())
        .expect("json")
        .replacen("{", "{\"huge\":1e400,", 1)
        .into_bytes();
    let (status, body) = w.machines(ignored).await;
    assert_eq!(status, StatusCode::OK, "1e400 in an unread field: {body}");
    assert!(
        body.contains("BelowDesiredReplicas"),
        "judged as usual: {body}"
    );
    w.still_serves("1e400 in an unread field").await;

    // Replicas out of range in a KCP UPDATE: -1, 2^32, 2^64 (beyond u64), 1.5, 1e400.
    for replicas in ["-1", "4294967296", "18446744073709551616", "1.5", "1e400"] {
        let review = serde_json::to_string(&fixture("kcp-update-replicas-5-to-3.json"))
            .expect("json")
            .replacen("\"replicas\":3", &format!("\"replicas\":{replicas}"), 1);
        assert!(review.contains(&format!("\"replicas\":{replicas}")), "edit");
        let got = w
            .call(
                b"h2",
                Method::POST,
                "/validate/kubeadmcontrolplanes",
                Some("application/json"),
                review.into_bytes(),
            )
            .await
            .expect("answer");
        let needles: &[&str] = if replicas == "1e400" {
            &["number out of range"]
        } else {
            &["spec.replicas", "non-negative integer"]
        };
        assert_400(&format!("replicas {replicas}"), &got, needles);
        w.still_serves(&format!("replicas {replicas}")).await;
    }
    w.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_deeply_nested_bodies() {
    let w = world().await;
    w.still_serves("start").await;

    // 8 MiB: over the 7 MiB limit, refused before parsing.
    let before = vm_rss_bytes();
    for round in 0..3 {
        let mut body = b"{\"apiVersion\":\"admission.k8s.io/v1\",\"pad\":\"".to_vec();
        body.resize(8 * 1024 * 1024 - 2, b'x');
        body.extend_from_slice(b"\"}");
        let got = w.machines(body).await;
        assert_400(
            "an 8 MiB body",
            &got,
            &["cannot read the request body", "at most 7 MiB"],
        );
        w.still_serves(&format!("an 8 MiB body (round {round})"))
            .await;
    }
    assert_rss_bounded("three 8 MiB bodies", before);

    // Just under the limit is read and parsed (and then judged on its merits).
    let mut r = good_review();
    r["request"]["oldObject"]["metadata"]["annotations"]["pad"] =
        json!("y".repeat(6 * 1024 * 1024));
    let (status, body) = w.machines(serde_json::to_vec(&r).expect("json")).await;
    assert_eq!(status, StatusCode::OK, "a 6 MiB review: {body}");

    // 10,000 levels of nesting: serde_json's recursion limit, not a stack overflow.
    for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
        let case = format!("10,000 levels of {open}");
        let body = format!(
            "{{\"apiVersion\":\"admission.k8s.io/v1\",\"request\":{}1{}}}",
            open.repeat(10_000),
            close.repeat(10_000)
        );
        let got = w.machines(body.into_bytes()).await;
        assert_400(&case, &got, &["not valid JSON", "recursion limit"]);
        w.still_serves(&case).await;
    }
    w.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_instead_of_a_tls_client_hello_is_closed() {
    let w = world().await;
    for (case, garbage) in [
        (
            "plain HTTP",
            b"POST /validate/machines HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
        ),
        ("zeros", vec![0u8; 4096]),
        (
            "a TLS record header with a huge length",
            vec![0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3],
        ),
    ] {
        let mut tcp = tokio::time::timeout(BOUND, TcpStream::connect(w.addr()))
            .await
            .expect("connect in time")
            .expect("connect");
        // The server may close (and reset) before all is written: that is an answer too.
        let _ = tcp.write_all(&garbage).await;
        assert!(
            closed_within(&mut tcp, BOUND).await,
            "{case}: the server kept the connection open"
        );
        w.still_serves(case).await;
    }
    w.running.shutdown().await;
}

/// How long the server lets a connection go without a complete first request.
const FIRST_REQUEST: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_dripping_its_request_one_byte_a_second_is_cut_off() {
    let w = world().await;
    let http1 = b"POST /validate/machines HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}".to_vec();
    // The h2 connection preface, then (never reached) more.
    let h2 = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0".to_vec();
    let drip = |alpn: &'static [u8], bytes: Vec<u8>| {
        let (addr, config) = (w.addr(), w.pki.client(&[alpn]));
        async move {
            let tls = connect(addr, config).await.expect("TLS handshake");
            let (mut rd, mut wr) = tokio::io::split(tls);
            let started = Instant::now();
            let writer = async {
                // Bounded by the request's length: about 100 s at one byte a second.
                for b in &bytes {
                    if wr.write_all(&[*b]).await.is_err() || wr.flush().await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                std::future::pending::<()>().await;
            };
            let closed = tokio::select! {
                c = closed_within(&mut rd, FIRST_REQUEST + BOUND) => c,
                _ = writer => unreachable!("the writer never ends"),
            };
            (closed, started.elapsed())
        }
    };
    let ((h1_closed, h1_after), (h2_closed, h2_after), ()) =
        tokio::join!(drip(b"http/1.1", http1), drip(b"h2", h2), async {
            // Good reviews are answered while the two drip.
            tokio::time::sleep(Duration::from_secs(2)).await;
            w.still_serves("two clients started dripping").await;
        });
    assert!(
        h1_closed,
        "HTTP/1.1: still open after {h1_after:?} of one byte a second"
    );
    assert!(
        h2_closed,
        "h2: still open after {h2_after:?} of one byte a second"
    );
    w.still_serves("two dripping clients").await;
    w.running.shutdown().await;
}

/// The soft limit on open files of this process.
fn open_files_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .expect("/proc/self/limits")
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_connections_do_not_stop_good_reviews() {
    let w = world().await;
    // Each idle connection costs two descriptors here (client and server side are both in
    // this process); leave room for the rest of the test and any test running alongside.
    let limit = open_files_limit();
    let n = 1_000.min(limit.saturating_sub(512) / 2) as usize;
    assert!(
        n >= 200,
        "the open files limit ({limit}) leaves room for only {n} connections: raise `ulimit -n`"
    );
    let before = vm_rss_bytes();
    let started = Instant::now();
    // Half finish the TLS handshake and send nothing; half open TCP and send nothing.
    let mut tls = Vec::new();
    let mut tcp = Vec::new();
    for i in 0..n {
        if i % 2 == 0 {
            tls.push(
                connect(w.addr(), w.pki.client(&[b"h2"]))
                    .await
                    .unwrap_or_else(|e| panic!("idle TLS connection {i}: {e}")),
            );
        } else {
            tcp.push(
                tokio::time::timeout(BOUND, TcpStream::connect(w.addr()))
                    .await
                    .expect("connect in time")
                    .unwrap_or_else(|e| panic!("idle TCP connection {i}: {e}")),
            );
        }
    }
    let opened = started.elapsed();
    w.still_serves(&format!("{n} idle connections opened in {opened:?}"))
        .await;
    assert_rss_bounded(&format!("{n} idle connections"), before);

    // The server lets none of them stay forever: TCP alone is cut by the TLS handshake
    // timeout, TLS without a request by the first-request timeout.
    let bound = FIRST_REQUEST + BOUND;
    let tls_closed = futures::future::join_all(tls.iter_mut().map(|s| closed_within(s, bound)));
    let tcp_closed = futures::future::join_all(tcp.iter_mut().map(|s| closed_within(s, bound)));
    let (tls_closed, tcp_closed) = tokio::join!(tls_closed, tcp_closed);
    let open_tls = tls_closed.iter().filter(|c| !**c).count();
    let open_tcp = tcp_closed.iter().filter(|c| !**c).count();
    assert_eq!(
        (open_tls, open_tcp),
        (0, 0),
        "idle connections still open {bound:?} after the last was opened (TLS, TCP)"
    );
    w.still_serves("the idle connections were closed").await;
    w.running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_dripping_its_body_one_byte_a_second_is_cut_off() {
    let w = world().await;
    let tls = connect(w.addr(), w.pki.client(&[b"http/1.1"]))
        .await
        .expect("TLS handshake");
    let (mut rd, mut wr) = tokio::io::split(tls);
    let started = Instant::now();
    let writer = async {
        wr.write_all(b"POST /validate/machines HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
            .await
            .expect("headers");
        wr.flush().await.expect("flush");
        // Bounded by the announced length: 100 s at one byte a second.
        for _ in 0..100 {
            if wr.write_all(b" ").await.is_err() || wr.flush().await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        std::future::pending::<()>().await;
    };
    let mut answer = Vec::new();
    let closed = tokio::select! {
        r = tokio::time::timeout(FIRST_REQUEST + BOUND, rd.read_to_end(&mut answer)) => r.is_ok(),
        _ = writer => unreachable!("the writer never ends"),
    };
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        closed,
        "still open after {:?} of a body at one byte a second; answered {answer:?}",
        started.elapsed()
    );
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains("did not arrive within"),
        "{answer:?}"
    );
    w.still_serves("a dripping body").await;
    w.running.shutdown().await;
}
