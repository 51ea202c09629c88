//! What confirming a change for the worse costs: the time from SIGSTOP of an etcd member to
//! `EtcdQuorum MembersUnhealthy` in the KCP's status, with every probe believed at once (the
//! guard before it confirmed: `--etcd-election-timeout 0s`) and confirmed by a second probe an
//! election timeout later (etcd's own, 500 ms in the playground's etcd), in one run.
//!
//! The playground's world: a real 3-member etcd with TLS on 127.0.0.1, the API-server stand-in,
//! `serve` in-process with the direct transport and status publishing. Each round waits for
//! Healthy, waits a pseudo-random part of the probe interval (so the freeze lands anywhere in
//! the sweep cycle), freezes a follower, and polls the KCP's conditions every 10 ms.
//!
//! ```text
//! cargo bench --bench detection -- [--rounds 8] [--interval 2s] [--deadline 1s]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use quorumguard::playground::etcd::ELECTION_TIMEOUT;
use quorumguard::playground::world::{World, WorldOptions};
use serde_json::Value;

struct Options {
    rounds: usize,
    interval: Duration,
    deadline: Duration,
}

fn options() -> Result<Options> {
    let mut o = Options {
        rounds: 8,
        interval: Duration::from_secs(2),
        deadline: Duration::from_secs(1),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = || {
            args.get(i + 1)
                .with_context(|| format!("{} needs a value", args[i]))
        };
        match args[i].as_str() {
            "--rounds" => o.rounds = value()?.parse().context("--rounds")?,
            "--interval" => o.interval = humantime::parse_duration(value()?)?,
            "--deadline" => o.deadline = humantime::parse_duration(value()?)?,
            // cargo bench passes --bench.
            "--bench" => {
                i += 1;
                continue;
            }
            other => bail!("unknown argument {other}"),
        }
        i += 2;
    }
    Ok(o)
}

/// Polls the published conditions every 10 ms until `reason` is EtcdQuorum's (at most `bound`).
async fn until_quorum(world: &World, reason: &str, bound: Duration) -> Result<Duration> {
    let started = Instant::now();
    for _ in 0..(bound.as_millis() / 10) {
        if world.conditions().quorum_reason() == reason {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!(
        "EtcdQuorum {reason} not published within {bound:?} (it says {})",
        world.conditions().quorum_reason()
    )
}

/// The index of a member that is not the leader.
async fn follower(world: &World) -> Result<usize> {
    world
        .etcd(|e| -> Result<usize> {
            for i in 0..e.len() {
                let url = e.client_url(i).context("member URL")?;
                let out = e.etcdctl(&[url], &["endpoint", "status", "-w", "json"])?;
                let v: Value = serde_json::from_str(&out)?;
                let s = &v[0]["Status"];
                if s["header"]["member_id"] != s["leader"] {
                    return Ok(i);
                }
            }
            bail!("no follower found")
        })
        .await?
}

async fn measure(o: &Options, election_timeout: Duration) -> Result<Vec<Duration>> {
    let dir = std::env::temp_dir().join(format!(
        "quorumguard-detection-{}-{}",
        std::process::id(),
        election_timeout.as_millis()
    ));
    let options = WorldOptions {
        probe_interval: o.interval,
        probe_deadline: o.deadline,
        election_timeout,
        ..WorldOptions::new(dir.clone())
    };
    let world = Arc::new(World::start(options, |_| {}).await?);
    let bound = o.interval * 4 + o.deadline * 4 + Duration::from_secs(10);
    let mut out = Vec::new();
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    for round in 0..o.rounds {
        until_quorum(&world, "Healthy", Duration::from_secs(60)).await?;
        // xorshift: a phase in [0, interval), the same every run.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let phase = o.interval.mul_f64((seed % 1000) as f64 / 1000.0);
        tokio::time::sleep(phase).await;
        let i = follower(&world).await?;
        world.etcd(move |e| e.freeze(i)).await??;
        let latency = until_quorum(&world, "MembersUnhealthy", bound).await;
        world.etcd(move |e| e.thaw(i)).await??;
        let latency = latency.with_context(|| format!("round {round}"))?;
        eprintln!(
            "  election timeout {:?}: round {round}: {:.0} ms",
            election_timeout,
            latency.as_secs_f64() * 1000.0
        );
        out.push(latency);
    }
    world.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

fn summary(v: &[Duration]) -> (f64, f64, f64) {
    let ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    let mean = ms.iter().sum::<f64>() / ms.len().max(1) as f64;
    let min = ms.iter().copied().fold(f64::INFINITY, f64::min);
    let max = ms.iter().copied().fold(0.0, f64::max);
    (mean, min, max)
}

fn main() -> Result<()> {
    let o = options()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        eprintln!(
            "SIGSTOP of a follower -> EtcdQuorum MembersUnhealthy published: {} rounds each, probe interval {:?}, deadline {:?}",
            o.rounds, o.interval, o.deadline
        );
        let before = measure(&o, Duration::ZERO).await?;
        let after = measure(&o, ELECTION_TIMEOUT).await?;
        let (bm, bmin, bmax) = summary(&before);
        let (am, amin, amax) = summary(&after);
        println!("| guard | mean ms | min ms | max ms |");
        println!("|---|---|---|---|");
        println!("| every probe believed (--etcd-election-timeout 0s) | {bm:.0} | {bmin:.0} | {bmax:.0} |");
        println!(
            "| confirmed ({:?}) | {am:.0} | {amin:.0} | {amax:.0} |",
            ELECTION_TIMEOUT
        );
        println!(
            "confirming adds {:.0} ms on average ({:.2}x); bound: one election timeout plus one probe deadline",
            am - bm,
            am / bm
        );
        Ok(())
    })
}
