//! The webhook under load (issue 6, part 2): quorumguard and a floor server of the same stack
//! (and the floor reading each body with serde_json, `floor+json`: the bound of any webhook
//! that reads its reviews with serde_json), in this process, each driven over h2 + TLS at a
//! fixed concurrency for a fixed time with the same mix of Machine DELETE and KCP UPDATE
//! reviews; prints throughput, latency quantiles, the ratios against the targets and the
//! process's RSS. See crates/testkit/src/load.rs.
//!
//! Run: `cargo bench --bench webhook_load` (concurrency 64 over 3 connections, 2 s warm-up,
//! 10 s measured). Settings: `-- --concurrency N --connections N --duration 10s --warmup 2s`,
//! or the environment `QG_LOAD_CONCURRENCY`, `QG_LOAD_CONNECTIONS`, `QG_LOAD_DURATION`,
//! `QG_LOAD_WARMUP`; `-- --rounds N` (`QG_LOAD_ROUNDS`) repeats floor, floor+json,
//! quorumguard and reports the median ratios; `-- --only floor|floor+json|quorumguard` drives
//! one, to profile it;
//! `-- --smoke` (or `QG_LOAD_SMOKE=1`) is 1 s at concurrency 4. quorumguard logs as `serve` does
//! by default (JSON, level info: one line per review, through serve's writer thread), into
//! `/dev/null`; `-- --log text` logs text, `-- --log off` not at all.
//!
//! The servers and the generator get a runtime each (two worker threads, the machine's cores),
//! as a webhook and kube-apiserver are separate processes.

use anyhow::Result;

use quorumguard::telemetry::{LogFormat, init_logging_to};
use testkit::load::{Servers, options_from, table};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = options_from(&args)?;
    // As `serve` does, before any thread starts (`QG_LOAD_GLIBC_DEFAULTS=1`: glibc's defaults).
    if std::env::var_os("QG_LOAD_GLIBC_DEFAULTS").is_none() {
        quorumguard::server::tune_malloc();
    }
    // `--log json|text|off`: log as `quorumguard serve` does (one line per review), into
    // /dev/null; json by default.
    let log = args
        .iter()
        .position(|a| a == "--log")
        .and_then(|i| args.get(i + 1))
        .map_or("json", String::as_str);
    let format = match log {
        "off" => None,
        "json" => Some(LogFormat::Json),
        "text" => Some(LogFormat::Text),
        other => anyhow::bail!("--log {other}: choose json, text or off"),
    };
    let _logs = match format {
        Some(f) => Some(init_logging_to(
            f,
            "info",
            std::fs::File::create("/dev/null")?,
        )?),
        None => None,
    };
    let servers_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("servers")
        .enable_all()
        .build()?;
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("load")
        .enable_all()
        .build()?;
    let servers = servers_rt.block_on(Servers::start())?;
    let mut rounds = Vec::new();
    for _ in 0..opts.rounds.max(1) {
        let mut reports = Vec::new();
        for target in opts.targets() {
            reports.push(client_rt.block_on(servers.drive(target, &opts))?);
        }
        rounds.push(reports);
    }
    print!("{}", table(&opts, &rounds));
    servers_rt.block_on(servers.shutdown());
    let errors: u64 = rounds.iter().flatten().map(|r| r.errors).sum();
    if errors > 0 {
        anyhow::bail!("{errors} failed requests");
    }
    Ok(())
}
