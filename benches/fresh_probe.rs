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
//! Run: `cargo bench --bench fresh_probe` (needs `etcd`, `etcdctl` and `openssl`, as the tests
//! do). Settings: `-- --reviews 200` (`QG_FRESH_REVIEWS`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use quorumguard::engine::{Confirmation, EtcdState};
use quorumguard::etcd::TransportKind;
use quorumguard::etcd::sweep::SweepConfig;
use quorumguard::server::{self, Running};
use testkit::apiserver::ApiServer;
use testkit::etcd::EtcdCluster;
use testkit::guard::{MACHINES, delete_review, review};
use testkit::https::{TempDir, TestPki};
use testkit::reviews::{KCP_CONTROLLER, NS};
use testkit::seed::{self, secret};

/// etcd requests in one probe of 3 members: the member list, then each member's status and
/// linearizable read, and the alarm list (crates/observe/src/etcd/prober.rs).
const REQUESTS_PER_PROBE: u64 = 1 + 3 * 2 + 1;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reviews: usize = args
        .iter()
        .position(|a| a == "--reviews")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var("QG_FRESH_REVIEWS").ok())
        .map_or(Ok(200), |v| v.parse())
        .context("--reviews takes a whole number")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let etcd = EtcdCluster::start(3);
    println!(
        "fresh probes: 3 etcd members (TLS, loopback), {reviews} review pairs per transport, each review on a new h2 connection"
    );
    println!(
        "| transport | no probe p50 / p99 ms | fresh probe p50 / p99 ms | added p50 / p99 ms | 100 concurrent deletions: fresh probes (etcd requests) |"
    );
    println!("|---|---|---|---|---|");
    for transport in [TransportKind::Direct, TransportKind::PortForward] {
        let row = rt.block_on(measure(&etcd, transport, reviews))?;
        println!("{row}");
    }
    Ok(())
}

fn quantiles(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let at = |q: f64| {
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
        v[i].as_secs_f64() * 1000.0
    };
    (at(0.5), at(0.99))
}

async fn measure(etcd: &EtcdCluster, transport: TransportKind, reviews: usize) -> Result<String> {
    let mgmt = ApiServer::start().await?;
    let members: Vec<String> = (0..etcd.len()).map(|i| etcd.name(i).to_string()).collect();
    let workload = ApiServer::start().await?;
    let annotations = match transport {
        TransportKind::Direct => seed::direct_to(etcd),
        TransportKind::PortForward => {
            for i in 0..etcd.len() {
                let addr = etcd
                    .client_url(i)
                    .trim_start_matches("https://")
                    .parse()
                    .context("a loopback address")?;
                workload.forward_pod("kube-system", &format!("etcd-{}", etcd.name(i)), addr);
            }
            mgmt.insert(secret(
                NS,
                "test-kubeconfig",
                &[("value", &workload.kubeconfig_yaml())],
            ))?;
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
        ..SweepConfig::default()
    });
    let running = server::start(config, mgmt.client()?).await?;
    let ready = Instant::now() + Duration::from_secs(30);
    while healthy(&running) != 3 {
        if Instant::now() > ready {
            bail!("{transport:?}: 3 healthy members not probed within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tls = pki.client(&[b"h2"]);
    let cached = delete_review(&members[0], "jane@example.com", true, "cached");
    let probed = delete_review(&members[0], KCP_CONTROLLER, true, "probed");
    let send = |body: &Value, expect: &'static str| {
        let tls = tls.clone();
        let body = body.clone();
        let addr = running.addr;
        async move {
            let a = review(addr, tls, MACHINES, &body)
                .await
                .map_err(anyhow::Error::msg)?;
            if a.reason != expect {
                bail!("expected {expect}, answered {a:?}");
            }
            Ok::<_, anyhow::Error>(a.took)
        }
    };
    for _ in 0..20 {
        send(&cached, "BelowDesiredReplicas").await?;
        send(&probed, "QuorumSafe").await?;
    }
    let fresh = running
        .webhook
        .fresh_probes()
        .context("fresh probes")?
        .clone();
    let made = || fresh.probes_made("ok") + fresh.probes_made("failed");
    let before = made();
    let (mut plain, mut with_probe) = (Vec::new(), Vec::new());
    for _ in 0..reviews {
        plain.push(send(&cached, "BelowDesiredReplicas").await?);
        with_probe.push(send(&probed, "QuorumSafe").await?);
    }
    let sequential = made() - before;
    if sequential != reviews as u64 {
        bail!("{reviews} probed reviews one after another made {sequential} probes");
    }
    let before = made();
    let burst = futures::future::join_all((0..100).map(|_| send(&probed, "QuorumSafe"))).await;
    for r in burst {
        r?;
    }
    let burst_probes = made() - before;
    let (p50, p99) = quantiles(plain);
    let (f50, f99) = quantiles(with_probe);
    running.shutdown().await;
    Ok(format!(
        "| {} | {p50:.2} / {p99:.2} | {f50:.2} / {f99:.2} | {:.2} / {:.2} | {burst_probes} ({}) |",
        transport.as_str(),
        f50 - p50,
        f99 - p99,
        burst_probes * REQUESTS_PER_PROBE
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
