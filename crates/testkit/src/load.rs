//! The webhook under load (issue 6, part 2): quorumguard's server and a floor server built from
//! the same stack, driven alike over h2 and TLS at a fixed concurrency for a fixed time.
//!
//! Both servers run in this process: quorumguard through `server::start` (watches of the
//! API-server stand-in, seeded with a Cluster, its KCP and three Machines, and a healthy etcd
//! snapshot, so every review gets a real decision), and the floor on the same axum +
//! axum-server rustls listener with the same certificate and the same h2, whose handler reads the
//! body and answers a fixed allow without parsing it. The difference between the two is what
//! quorumguard's own work costs.

mod bench;

pub use bench::{flags, options_from, table};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use axum_server::Handle;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use quorumguard::engine::Policy;
use quorumguard::playground::apiserver::ApiServer;
use quorumguard::server::{self, Running, ServeConfig};
use serde::Deserialize;
use serde_json::json;
use tokio::task::JoinHandle;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::https::{TempDir, TestPki, alpn};
use super::reviews::{
    NS, cluster_object, fixture, kcp_object, machine_named, stored, with_managed_fields,
};

/// How hard and how long to drive a server.
#[derive(Clone, Debug)]
pub struct Options {
    /// Requests in flight at any time (one worker each).
    pub concurrency: usize,
    /// h2 connections the workers share, like the connections of a replicated kube-apiserver.
    pub connections: usize,
    /// Driven but not measured, so connections, caches and allocators settle first.
    pub warmup: Duration,
    /// Measured.
    pub duration: Duration,
    /// Drive only this server (to profile it); both by default.
    pub only: Option<Target>,
    /// Floor then quorumguard, this many times: the machine is shared, so one pair can mislead.
    pub rounds: usize,
}

impl Options {
    /// The servers to drive, in order: the floor first.
    pub fn targets(&self) -> Vec<Target> {
        match self.only {
            Some(t) => vec![t],
            None => vec![Target::Floor, Target::FloorJson, Target::Quorumguard],
        }
    }
}

/// Which server to drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Floor,
    /// The floor, reading each body through serde_json first (tokenized, nothing built): what
    /// any serde_json-based webhook pays before it decides anything.
    FloorJson,
    Quorumguard,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Floor => "floor",
            Target::FloorJson => "floor+json",
            Target::Quorumguard => "quorumguard",
        }
    }
}

/// What one run measured.
#[derive(Debug)]
pub struct Report {
    pub target: Target,
    /// Responses completed inside the measured window.
    pub requests: u64,
    pub seconds: f64,
    /// Failed requests, non-200 answers and bodies that are not an allowed or denied
    /// AdmissionReview for the request (its uid echoed), over the whole run.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Verdicts seen in the window, by reason (the floor's fixed allow has none).
    pub verdicts: BTreeMap<String, u64>,
    /// Latencies of the measured requests, sorted, in nanoseconds.
    pub latencies: Vec<u64>,
    /// VmRSS of the whole process just before the run, and the highest sample during it, KiB.
    pub rss_rest_kib: u64,
    pub rss_peak_kib: u64,
    /// CPU time spent in the measured window by the threads named `servers` and `load` (the
    /// bench's two runtimes), ns: what a request costs whatever else the machine is doing.
    pub server_cpu_ns: u64,
    pub client_cpu_ns: u64,
}

impl Report {
    pub fn throughput(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    /// Server and client CPU per measured request, µs.
    pub fn cpu_us_per_request(&self) -> (f64, f64) {
        let per = |ns: u64| ns as f64 / 1e3 / self.requests.max(1) as f64;
        (per(self.server_cpu_ns), per(self.client_cpu_ns))
    }

    /// The latency at quantile `q` (0..=1), in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.latencies, q)
    }
}

/// The value at quantile `q` (0..=1) of `sorted` latencies in ns, in milliseconds (NaN when
/// empty).
pub fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1e6
}

/// One review of the mix: where it goes, its body, and the uid the answer must echo.
struct Review {
    path: &'static str,
    body: Bytes,
    uid: String,
}

/// The mix, in the proportions a management cluster sends: KCP's own Machine deletions and KCP
/// spec updates (rollouts, scaling, the scale subresource), and a human's dry run; Machines grown
/// to 10 KB with managedFields, as stored Machines are, KCPs as captured (7 KB with theirs).
/// Non-dry-run human deletions are left out: each denial publishes an Event, which would measure
/// the API-server stand-in rather than the webhook.
fn mix() -> Vec<Review> {
    let mut out = Vec::new();
    let mut add = |path: &'static str, file: &str, grow: bool, n: usize| {
        for i in 0..n {
            let mut r = fixture(file);
            let uid = format!("load-{}-{i}", file.trim_end_matches(".json"));
            r["request"]["uid"] = json!(uid);
            let body = if grow {
                with_managed_fields(r, 10 * 1024)
            } else {
                serde_json::to_vec(&r).unwrap_or_default()
            };
            out.push(Review {
                path,
                body: Bytes::from(body),
                uid,
            });
        }
    };
    const MACHINES: &str = "/validate/machines?timeout=5s";
    const KCPS: &str = "/validate/kubeadmcontrolplanes?timeout=5s";
    add(MACHINES, "machine-delete-by-kcp-controller.json", true, 4);
    add(MACHINES, "machine-delete-dry-run.json", true, 1);
    add(KCPS, "kcp-update-version.json", false, 2);
    add(KCPS, "kcp-update-replicas-5-to-3.json", false, 2);
    add(KCPS, "kcp-scale-subresource-3-to-5.json", false, 1);
    out
}

/// The two servers, the stand-in behind quorumguard, and the client's TLS settings.
pub struct Servers {
    pub quorumguard: SocketAddr,
    pub floor: SocketAddr,
    running: Option<Running>,
    floor_handle: Handle<SocketAddr>,
    floor_task: JoinHandle<std::io::Result<()>>,
    health: JoinHandle<()>,
    pki: TestPki,
    _api: ApiServer,
    _dir: TempDir,
}

/// Cluster `test`'s three Machines: `test-cp-{a,b,c}` on nodes `cp-{a,b,c}`.
const MACHINES: [&str; 3] = ["a", "b", "c"];

impl Servers {
    /// Starts the stand-in, quorumguard and the floor; returns once quorumguard's caches synced.
    pub async fn start() -> Result<Servers> {
        let api = ApiServer::start().await.context("API-server stand-in")?;
        api.insert(cluster_object(json!({})))
            .map_err(|e| anyhow!("{e:?}"))?;
        api.insert(stored(kcp_object()))
            .map_err(|e| anyhow!("{e:?}"))?;
        for x in MACHINES {
            api.insert(stored(machine_named(
                &format!("test-cp-{x}"),
                &format!("cp-{x}"),
            )))
            .map_err(|e| anyhow!("{e:?}"))?;
        }
        let dir = TempDir::new("load");
        let pki = TestPki::new(dir.path());
        let config = ServeConfig {
            listen: "127.0.0.1:0".parse()?,
            admin_listen: "127.0.0.1:0".parse()?,
            tls_cert: pki.cert_file.clone(),
            tls_key: pki.key_file.clone(),
            tls_reload_interval: Duration::from_secs(5),
            client_auth: None,
            policy: Policy::default(),
            reservation_ttl: Duration::from_secs(30),
            shutdown_delay: Duration::ZERO,
            shutdown_grace: Duration::from_secs(2),
            pod_name: Some("quorumguard-load".into()),
            events: true,
            // Health is set below, as a sweep would set it; the prober has its own benchmark.
            sweep: None,
            status: None,
            autopilot: None,
        };
        let running = server::start(config, api.client()?).await?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !running.state.all_synced() {
            if Instant::now() > deadline {
                bail!("quorumguard's caches did not sync within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A healthy three-member snapshot, kept fresher than --max-health-age.
        let state = running.state.clone();
        let health = tokio::spawn(async move {
            loop {
                let healthy: Vec<(&str, bool)> = MACHINES.iter().map(|x| (*x, true)).collect();
                let members = super::reviews::members(&healthy);
                state.set_health(NS, "test", members, Instant::now());
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });

        let tls = quorumguard::tls::load(&pki.cert_file, &pki.key_file, None).await?;
        let allow: Bytes = Bytes::from_static(FLOOR_ANSWER.as_bytes());
        let answer = move |body: Bytes| {
            let allow = allow.clone();
            async move {
                drop(body);
                ([("content-type", "application/json")], allow)
            }
        };
        let tokenize = {
            let answer = answer.clone();
            move |body: Bytes| {
                let read = serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok();
                let answer = answer.clone();
                async move {
                    if !read {
                        return Err(axum::http::StatusCode::BAD_REQUEST);
                    }
                    Ok(answer(body).await)
                }
            }
        };
        let app = Router::new()
            .route("/validate/machines", post(answer.clone()))
            .route("/validate/kubeadmcontrolplanes", post(answer))
            .route("/json/validate/machines", post(tokenize.clone()))
            .route("/json/validate/kubeadmcontrolplanes", post(tokenize));
        let floor_handle = Handle::new();
        let floor_task = tokio::spawn(
            server::https("127.0.0.1:0".parse()?, tls, None)
                .handle(floor_handle.clone())
                .serve(app.into_make_service()),
        );
        let floor = floor_handle
            .listening()
            .await
            .ok_or_else(|| anyhow!("the floor server did not start"))?;
        Ok(Servers {
            quorumguard: running.addr,
            floor,
            running: Some(running),
            floor_handle,
            floor_task,
            health,
            pki,
            _api: api,
            _dir: dir,
        })
    }

    /// Drives `target` with the mix; see [`Options`].
    pub async fn drive(&self, target: Target, opts: &Options) -> Result<Report> {
        let addr = match target {
            Target::Floor | Target::FloorJson => self.floor,
            Target::Quorumguard => self.quorumguard,
        };
        drive_at(addr, &self.pki, target, opts).await
    }

    /// Stops both servers.
    pub async fn shutdown(mut self) {
        self.health.abort();
        self.floor_handle
            .graceful_shutdown(Some(Duration::from_secs(1)));
        let _ = tokio::time::timeout(Duration::from_secs(3), &mut self.floor_task).await;
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
    }
}

/// Drives the server at `addr` (serving a certificate of `pki`) with the mix: connections
/// first, then `opts.warmup` unmeasured and `opts.duration` measured. Quorumguard's answers must
/// echo each review's uid. The RSS and CPU figures are this process's (see [`Report`]).
pub async fn drive_at(
    addr: SocketAddr,
    pki: &TestPki,
    target: Target,
    opts: &Options,
) -> Result<Report> {
    let mut senders = Vec::new();
    for _ in 0..opts.connections.max(1) {
        senders.push(h2_connection(addr, pki).await?);
    }
    let mix = Arc::new(mix());
    let rss_rest_kib = rss_kib();
    let start = Instant::now();
    let measure_from = start + opts.warmup;
    let end = measure_from + opts.duration;
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        tokio::time::sleep_until(measure_from.into()).await;
        let cpu_from = (cpu_ns("servers"), cpu_ns("load"));
        while Instant::now() < end {
            peak = peak.max(rss_kib());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cpu = (
            cpu_ns("servers").saturating_sub(cpu_from.0),
            cpu_ns("load").saturating_sub(cpu_from.1),
        );
        (peak.max(rss_kib()), cpu)
    });
    let mut workers = Vec::new();
    for w in 0..opts.concurrency.max(1) {
        let sender = senders[w % senders.len()].clone();
        let mix = mix.clone();
        workers.push(tokio::spawn(worker(
            w,
            sender,
            mix,
            target,
            measure_from,
            end,
        )));
    }
    let mut report = Report {
        target,
        requests: 0,
        seconds: opts.duration.as_secs_f64(),
        errors: 0,
        first_error: None,
        verdicts: BTreeMap::new(),
        latencies: Vec::new(),
        rss_rest_kib,
        rss_peak_kib: 0,
        server_cpu_ns: 0,
        client_cpu_ns: 0,
    };
    for w in workers {
        let tally = w.await?;
        report.requests += tally.latencies.len() as u64;
        report.errors += tally.errors;
        if report.first_error.is_none() {
            report.first_error = tally.first_error;
        }
        for (k, v) in tally.verdicts {
            *report.verdicts.entry(k).or_default() += v;
        }
        report.latencies.extend(tally.latencies);
    }
    report.latencies.sort_unstable();
    let (peak, (server_cpu, client_cpu)) = sampler.await?;
    report.rss_peak_kib = peak;
    report.server_cpu_ns = server_cpu;
    report.client_cpu_ns = client_cpu;
    Ok(report)
}

/// The floor's answer: an allowed review, fixed.
const FLOOR_ANSWER: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":true,"status":{"metadata":{},"code":200},"auditAnnotations":{"reason":"Floor"}}}"#;

/// An h2 connection over TLS to `addr`: ALPN h2 and `TCP_NODELAY`, as kube-apiserver's Go client
/// dials a webhook.
async fn h2_connection(addr: SocketAddr, pki: &TestPki) -> Result<SendRequest<Full<Bytes>>> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let stream = TlsConnector::from(pki.client(&[b"h2"]))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    if alpn(&stream).as_deref() != Some(b"h2") {
        bail!("{addr} did not agree to h2");
    }
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await?;
    tokio::spawn(conn);
    Ok(sender)
}

#[derive(Default)]
struct Tally {
    latencies: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
    verdicts: BTreeMap<String, u64>,
}

/// What the client checks of an answer.
#[derive(Deserialize)]
struct Answer {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    response: AnswerResponse,
}

#[derive(Deserialize)]
struct AnswerResponse {
    uid: String,
    allowed: bool,
    #[serde(rename = "auditAnnotations", default)]
    audit: BTreeMap<String, String>,
}

/// One request at a time until `end`; the requests that start at or after `measure_from` and
/// finish by `end` are measured.
async fn worker(
    w: usize,
    mut sender: SendRequest<Full<Bytes>>,
    mix: Arc<Vec<Review>>,
    target: Target,
    measure_from: Instant,
    end: Instant,
) -> Tally {
    let mut tally = Tally::default();
    let mut i = w;
    loop {
        let started = Instant::now();
        if started >= end {
            break;
        }
        let review = &mix[i % mix.len()];
        i += 1;
        let outcome = exchange(&mut sender, review, target).await;
        let done = Instant::now();
        match outcome {
            Ok(reason) => {
                if started >= measure_from && done <= end {
                    tally.latencies.push((done - started).as_nanos() as u64);
                    *tally.verdicts.entry(reason).or_default() += 1;
                }
            }
            Err(e) => {
                tally.errors += 1;
                tally.first_error.get_or_insert(e.to_string());
                // A broken connection fails fast: do not spin on it.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    tally
}

/// Sends one review and checks the answer; returns "allowed/Reason" or "denied/Reason".
async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    review: &Review,
    target: Target,
) -> Result<String> {
    let request = Request::post(match target {
        Target::FloorJson => format!("/json{}", review.path),
        _ => review.path.to_string(),
    })
    .header("content-type", "application/json")
    .header("accept", "application/json, */*")
    .header("user-agent", "kube-apiserver-admission")
    .body(Full::new(review.body.clone()))?;
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if status != 200 {
        bail!("HTTP {status}: {}", String::from_utf8_lossy(&body));
    }
    let answer: Answer = serde_json::from_slice(&body)
        .with_context(|| format!("not a review: {}", String::from_utf8_lossy(&body)))?;
    if answer.api_version != "admission.k8s.io/v1" || answer.kind != "AdmissionReview" {
        bail!(
            "not an admission.k8s.io/v1 AdmissionReview: {}",
            String::from_utf8_lossy(&body)
        );
    }
    if target == Target::Quorumguard && answer.response.uid != review.uid {
        bail!(
            "uid {:?} answered for {:?}",
            answer.response.uid,
            review.uid
        );
    }
    let reason = answer
        .response
        .audit
        .get("reason")
        .map_or("-", String::as_str);
    Ok(format!(
        "{}/{reason}",
        if answer.response.allowed {
            "allowed"
        } else {
            "denied"
        }
    ))
}

/// The whole process's resident set (VmRSS), KiB; 0 where /proc is not there.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time of this process's threads whose name starts with `prefix`, ns (Linux schedstat; 0
/// elsewhere).
pub fn cpu_ns(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A run short enough for CI: it shows the generator and both servers work, nothing more.
pub fn smoke() -> Options {
    Options {
        concurrency: 4,
        connections: 1,
        warmup: Duration::ZERO,
        duration: Duration::from_secs(1),
        only: None,
        rounds: 1,
    }
}
