//! What a fresh probe costs a review (issue 27): `serve` against a real 3-member etcd over TLS on
//! loopback and the API-server stand-in, with the direct transport and with the port-forward
//! transport (through a second stand-in acting as the workload API server, as KCP reaches etcd).
//!
//! For each transport it sends, one after another, `--reviews` pairs of reviews (each on a new
//! h2 connection, as kube-apiserver's reviews may come): one that needs no probe (a person's
//! deletion denied `BelowDesiredReplicas`, decided on the caches) and one that triggers a fresh
//! probe (the KCP controller's dry-run deletion of a healthy Machine, `QuorumSafe`). It prints
//! p50/p99 of each and the difference: the latency a fresh probe adds. Then a burst of 100
//! concurrent deletions of one cluster: how many fresh probes (and so etcd requests) it caused.
//!
//! Each row also says how many port-forward sessions (WebSockets through the workload API
//! server) the measured reviews opened, and how a review is answered while a follower is frozen
//! (SIGSTOP): denied `WouldLoseQuorum` on the fresh probe, within `--fresh-probe-timeout`.
//!
//! Where a probe's time goes (issue 39): the prober alone on the same etcd and stand-in, per
//! path. Dialling one member (for port-forward: a port-forward WebSocket through the workload API
//! server, then TLS and HTTP/2 with etcd inside it), the first probe of a new prober (every
//! connection set up inside it), and `--steps` probes on its kept connections: how long each
//! took, the member list and the slowest member (asked in parallel after it), and how many
//! port-forward sessions they opened.
//!
//! A WAN between quorumguard and the workload API server (issue 39): `--rtt 0,25,50,150` adds, per
//! round trip (milliseconds), a port-forward row through a delaying relay on loopback
//! ([`testkit::wan::DelayRelay`]: no root, no netem), to both tables.
//!
//! Run: `cargo bench --bench fresh_probe` (needs `etcd`, `etcdctl` and `openssl`, as the tests
//! do). Settings: `-- --reviews 200` (`QG_FRESH_REVIEWS`), `--steps 50` (`QG_FRESH_STEPS`),
//! `--rtt 0,25,50,150` (`QG_FRESH_RTT`, none by default).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use quorumguard::engine::{Confirmation, EtcdState};
use quorumguard::etcd::channel::Channel;
use quorumguard::etcd::sweep::SweepConfig;
use quorumguard::etcd::{PortForward, Prober, Transport, TransportKind};
use quorumguard::server::{self, Running};
use testkit::apiserver::ApiServer;
use testkit::etcd::EtcdCluster;
use testkit::guard::{MACHINES, delete_review, review};
use testkit::https::{TempDir, TestPki};
use testkit::reviews::{KCP_CONTROLLER, NS};
use testkit::seed::{self, secret};
use testkit::wan::DelayRelay;

/// etcd requests in one probe of 3 members: the member list, then each member's status and
/// linearizable read, and the alarm list (crates/observe/src/etcd/prober.rs).
const REQUESTS_PER_PROBE: u64 = 1 + 3 * 2 + 1;
/// `serve`'s default `--fresh-probe-timeout` (the probe's own deadline is three quarters of it).
const FRESH_TIMEOUT: Duration = Duration::from_secs(2);

/// A setting from `--name VALUE`, else the environment variable, else `default`.
fn setting(args: &[String], name: &str, env: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(env).ok())
        .unwrap_or_else(|| default.to_string())
}

/// How the guard reaches etcd in one row: directly, or through the workload API server with a
/// round trip added in front of it (`None`: none, no relay).
#[derive(Clone, Copy)]
enum Path {
    Direct,
    PortForward(Option<Duration>),
}

impl Path {
    fn kind(self) -> TransportKind {
        match self {
            Path::Direct => TransportKind::Direct,
            Path::PortForward(_) => TransportKind::PortForward,
        }
    }

    fn name(self) -> String {
        match self {
            Path::Direct => "direct".into(),
            Path::PortForward(None) => "port-forward".into(),
            Path::PortForward(Some(rtt)) => format!("port-forward, +{} ms RTT", rtt.as_millis()),
        }
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reviews: usize = setting(&args, "--reviews", "QG_FRESH_REVIEWS", "200")
        .parse()
        .context("--reviews takes a whole number")?;
    let steps: usize = setting(&args, "--steps", "QG_FRESH_STEPS", "50")
        .parse()
        .context("--steps takes a whole number")?;
    let rtts: Vec<Duration> = setting(&args, "--rtt", "QG_FRESH_RTT", "")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|ms| ms.parse().map(Duration::from_millis))
        .collect::<Result<_, _>>()
        .context("--rtt takes round trips in milliseconds, comma-separated")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut etcd = EtcdCluster::start(3);
    let mut paths = vec![Path::Direct, Path::PortForward(None)];
    paths.extend(rtts.iter().map(|&rtt| Path::PortForward(Some(rtt))));
    println!(
        "load average at the start: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "fresh probes: 3 etcd members (TLS, loopback), {reviews} review pairs per row, each review on a new h2 connection; --fresh-probe-timeout {} (probe deadline {})",
        humantime::format_duration(FRESH_TIMEOUT),
        humantime::format_duration(FRESH_TIMEOUT * 3 / 4)
    );
    println!(
        "| transport | no probe p50 / p99 ms | fresh probe p50 / p99 ms | added p50 / p99 ms | probed reviews not answered QuorumSafe | port-forward sessions opened | 100 concurrent deletions: fresh probes (etcd requests) | a follower frozen: answer, ms |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &path in &paths {
        let row = rt.block_on(measure(&mut etcd, path, reviews))?;
        println!("{row}");
    }
    println!();
    println!(
        "where a probe's time goes: the prober alone, {steps} probes on kept connections per row"
    );
    println!(
        "| transport | dial one member p50 ms | first probe ms (member list) | kept: probe p50 / p99 ms | kept: member list p50 ms | kept: slowest member p50 ms | kept: port-forward sessions opened |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &path in &paths {
        let row = rt.block_on(probe_steps(&etcd, path, steps))?;
        println!("{row}");
    }
    println!(
        "load average at the end: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    Ok(())
}

fn quantiles(mut v: Vec<Duration>) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort();
    let at = |q: f64| {
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
        v[i].as_secs_f64() * 1000.0
    };
    (at(0.5), at(0.99))
}

/// A workload API-server stand-in relaying `kube-system/etcd-<member>` to every member, and the
/// relay that delays the way to it, if any.
async fn workload(etcd: &EtcdCluster, rtt: Option<Duration>) -> Result<Workload> {
    let api = testkit::etcd::workload_api(etcd).await?;
    let relay = match rtt {
        Some(rtt) => Some(DelayRelay::start(api.addr(), rtt).await?),
        None => None,
    };
    Ok(Workload { api, relay })
}

struct Workload {
    api: ApiServer,
    relay: Option<DelayRelay>,
}

impl Workload {
    /// The kubeconfig quorumguard reaches the workload API server with: through the relay when
    /// there is one.
    fn kubeconfig(&self) -> String {
        let yaml = self.api.kubeconfig_yaml();
        match &self.relay {
            Some(relay) => yaml.replace(&self.api.url(), &relay.url()),
            None => yaml,
        }
    }
}

async fn measure(etcd: &mut EtcdCluster, path: Path, reviews: usize) -> Result<String> {
    let transport = path.kind();
    let mgmt = ApiServer::start().await?;
    let members: Vec<String> = (0..etcd.len()).map(|i| etcd.name(i).to_string()).collect();
    let workload = match path {
        Path::Direct => None,
        Path::PortForward(rtt) => Some(workload(etcd, rtt).await?),
    };
    let annotations = match &workload {
        None => seed::direct_to(etcd),
        Some(w) => {
            mgmt.insert(secret(NS, "test-kubeconfig", &[("value", &w.kubeconfig())]))?;
            json!({ "quorumguard.io/etcd-transport": "port-forward" })
        }
    };
    seed::cluster(
        &mgmt,
        NS,
        "test",
        annotations,
        &members,
        Some(&etcd.pki),
        |_| {},
    );
    let dir = TempDir::new("fresh-bench");
    let pki = TestPki::new(dir.path());
    let mut config = testkit::guard::serve_config(
        &pki,
        Duration::from_secs(10),
        Duration::from_millis(300),
        None,
    );
    config.sweep = Some(SweepConfig {
        transport,
        confirmation: Confirmation::default(),
        fresh_timeout: FRESH_TIMEOUT,
        ..SweepConfig::default()
    });
    let running = server::start(config, mgmt.client()?).await?;
    let ready = Instant::now() + Duration::from_secs(30);
    while healthy(&running) != 3 {
        if Instant::now() > ready {
            bail!("{}: 3 healthy members not probed within 30 s", path.name());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tls = pki.client(&[b"h2"]);
    let cached = delete_review(&members[0], "jane@example.com", true, "cached");
    let probed = delete_review(&members[0], KCP_CONTROLLER, true, "probed");
    let send = |body: &Value| {
        let tls = tls.clone();
        let body = body.clone();
        let addr = running.addr;
        async move {
            let a = review(addr, tls, MACHINES, &body)
                .await
                .map_err(anyhow::Error::msg)?;
            Ok::<_, anyhow::Error>((a.took, a.reason))
        }
    };
    for _ in 0..20 {
        send(&cached).await?;
        send(&probed).await?;
    }
    let fresh = running
        .webhook
        .fresh_probes()
        .context("fresh probes")?
        .clone();
    let made = || fresh.probes_made("ok") + fresh.probes_made("failed");
    let sessions = || workload.as_ref().map(|w| w.api.port_forwards_total());
    let (before, sessions_before) = (made(), sessions());
    let (mut plain, mut with_probe, mut late) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reviews {
        let (took, reason) = send(&cached).await?;
        if reason != "BelowDesiredReplicas" {
            bail!("a person's deletion answered {reason}");
        }
        plain.push(took);
        let (took, reason) = send(&probed).await?;
        if reason != "QuorumSafe" {
            late.push(reason);
        }
        with_probe.push(took);
    }
    let sequential = made() - before;
    if late.is_empty() && sequential != reviews as u64 {
        bail!("{reviews} probed reviews one after another made {sequential} probes");
    }
    let opened = match (sessions(), sessions_before) {
        (Some(after), Some(before)) => (after - before).to_string(),
        _ => "-".to_string(),
    };
    let before = made();
    let burst = futures::future::join_all((0..100).map(|_| send(&probed))).await;
    for r in burst {
        r?;
    }
    let burst_probes = made() - before;
    let frozen = frozen_follower(etcd, &running, || send(&probed)).await;
    let frozen = match frozen {
        Ok((reason, took)) => format!("{reason}, {:.0}", took.as_secs_f64() * 1000.0),
        Err(e) => format!("{e:#}"),
    };
    let (p50, p99) = quantiles(plain);
    let (f50, f99) = quantiles(with_probe);
    running.shutdown().await;
    let late = if late.is_empty() {
        "0".to_string()
    } else {
        format!("{} ({})", late.len(), late[0])
    };
    Ok(format!(
        "| {} | {p50:.2} / {p99:.2} | {f50:.2} / {f99:.2} | {:.2} / {:.2} | {late} | {opened} | {burst_probes} ({}) | {frozen} |",
        path.name(),
        f50 - p50,
        f99 - p99,
        burst_probes * REQUESTS_PER_PROBE
    ))
}

/// Freezes a follower other than the member whose deletion `probed` asks for, sends it, thaws
/// the follower and waits (bounded) until the guard sees 3 healthy members again: the answer and
/// how long it took.
async fn frozen_follower<F, Fut>(
    etcd: &mut EtcdCluster,
    running: &Running,
    probed: F,
) -> Result<(String, Duration)>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(Duration, String)>>,
{
    let leader = match running
        .state
        .control_plane(NS, seed::KCP, Instant::now())
        .map(|cp| cp.etcd)
    {
        Ok(EtcdState::Observed(s)) => s
            .members
            .iter()
            .find(|m| m.is_leader)
            .map(|m| etcd.index_of(&m.name)),
        _ => None,
    };
    let follower = (1..etcd.len())
        .find(|&i| Some(i) != leader)
        .context("a follower")?;
    etcd.freeze(follower);
    let answer = probed().await;
    etcd.thaw(follower);
    let ready = Instant::now() + Duration::from_secs(30);
    while healthy(running) != 3 {
        if Instant::now() > ready {
            bail!("3 healthy members not seen again within 30 s of the thaw");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A review that rests on etcd has the cluster probed afresh.
        let _ = probed().await;
    }
    let (took, reason) = answer?;
    Ok((reason, took))
}

/// The prober alone over `path`: one member dialled, a new prober's first probe, then `steps`
/// probes on its kept connections.
async fn probe_steps(etcd: &EtcdCluster, path: Path, steps: usize) -> Result<String> {
    let tls = etcd.client_tls();
    let deadline = FRESH_TIMEOUT * 3 / 4;
    let names: Vec<String> = (0..etcd.len()).map(|i| etcd.name(i).to_string()).collect();
    let (workload, prober) = match path {
        Path::Direct => (None, Prober::new(tls.clone())),
        Path::PortForward(rtt) => {
            let w = workload(etcd, rtt).await?;
            let pf = PortForward::from_kubeconfig(&w.kubeconfig(), NS, "test").await?;
            let prober = Prober::with_transport(tls.clone(), Transport::port_forward(pf));
            (Some(w), prober)
        }
    };
    let endpoints = match path {
        Path::Direct => etcd.endpoints(),
        Path::PortForward(_) => prober.transport().list_endpoints(None, &[], &names)?,
    };
    let mut dials = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let channel =
            Channel::connect(&endpoints[0], tls.config(), prober.transport().tls_name()).await?;
        dials.push(started.elapsed());
        drop(channel);
    }
    let first = prober.probe(&endpoints, deadline).await?;
    let sessions = || workload.as_ref().map(|w| w.api.port_forwards_total());
    let sessions_before = sessions();
    let (mut took, mut list, mut slowest) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..steps {
        let p = prober.probe(&endpoints, deadline).await?;
        if p.members.iter().filter(|m| m.health.is_healthy()).count() != 3 {
            bail!(
                "{}: a probe on kept connections saw {:?}",
                path.name(),
                p.members
            );
        }
        took.push(p.took);
        list.push(p.member_list_took);
        slowest.push(p.slowest_member.map(|(_, d)| d).unwrap_or_default());
    }
    let opened = match (sessions(), sessions_before) {
        (Some(after), Some(before)) => (after - before).to_string(),
        _ => "-".to_string(),
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (d50, _) = quantiles(dials);
    let (t50, t99) = quantiles(took);
    let (l50, _) = quantiles(list);
    let (s50, _) = quantiles(slowest);
    Ok(format!(
        "| {} | {d50:.2} | {:.1} ({:.1}) | {t50:.2} / {t99:.2} | {l50:.2} | {s50:.2} | {opened} |",
        path.name(),
        ms(first.took),
        ms(first.member_list_took),
    ))
}

fn healthy(running: &Running) -> usize {
    match running
        .state
        .control_plane(NS, seed::KCP, Instant::now())
        .map(|cp| cp.etcd)
    {
        Ok(EtcdState::Observed(s)) => s.members.iter().filter(|m| m.health.is_healthy()).count(),
        _ => 0,
    }
}
