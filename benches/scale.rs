//! The scale benchmark (issue 6, part 4): 1,000 KubeadmControlPlanes with their Machines in the
//! API-server stand-in over 2 real 3-member etcd clusters, and one `quorumguard serve` process.
//! Prints the first sweep-and-publish cycle's time, the KCP status writes of a steady cycle
//! (target 0), the guard's RSS (target under 200 MiB) and admission latency while idle and
//! during sweeps (target: p99 within 1.5x of the idle p99). See crates/testkit/src/scale.rs.
//!
//! Run: `cargo bench --bench scale`. Settings: `-- --kcps 1000 --etcd-clusters 2 --members 3
//! --probe-interval 10s --probe-concurrency 16 --concurrency 8 --connections 2 --slice 500ms
//! --bound 10m --etcd-nice 0 --transport direct`; `--transport port-forward` reaches etcd as
//! `serve` does by default, through each workload API server; `-- --smoke` is 5 KCPs on one
//! single-member etcd with a 1 s interval (what tests/it/scale.rs runs).
//!
//! The guard is a child process (the `quorumguard` binary of the same profile), so the RSS and
//! CPU figures are its own; the stand-in, etcd and the load generator are elsewhere.

use anyhow::Result;

use testkit::scale::{ScaleOptions, run, table};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = ScaleOptions::from_args(&args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = std::time::Instant::now();
    let figures = rt.block_on(run(&opts, |step| {
        eprintln!("[{:>6.1} s] {step}", started.elapsed().as_secs_f64())
    }))?;
    print!("{}", table(&figures));
    let errors = figures.idle.errors + figures.sweeping.errors + figures.first.errors;
    if errors > 0 {
        anyhow::bail!("{errors} failed reviews");
    }
    Ok(())
}
