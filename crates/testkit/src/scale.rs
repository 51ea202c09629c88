//! The scale run (issue 6, part 4): many KubeadmControlPlanes with their Machines in the
//! API-server stand-in, spread over a few real etcd clusters, and one `quorumguard serve` process
//! sweeping, publishing and answering reviews.
//!
//! - etcd: `etcd_clusters` real clusters of `members` members (TLS, loopback), the members named
//!   `cp-a`, `cp-b`, ... as kubeadm names them after their nodes. Workload cluster `i` points at
//!   etcd cluster `i % etcd_clusters` (several KCPs share one etcd, as node names are per
//!   workload cluster).
//! - The stand-in: per workload cluster a Cluster (direct transport with the endpoints
//!   annotation, or with `--transport port-forward` the port-forward transport and Secret
//!   `<cluster>-kubeconfig` for a workload stand-in per etcd cluster: [`Fleet`]), its
//!   KCP (replicas = members), one Machine per member on the node of that name, and Secret
//!   `<cluster>-etcd` with the etcd CA ([`super::seed::cluster`]). Cluster 0 is the fixtures'
//!   `test`, so the load generator's reviews get real decisions.
//! - The guard: the `quorumguard` binary as a child process (its RSS and CPU are its own), with
//!   a kubeconfig for the stand-in, status publishing on and no leader election (one replica).
//!
//! What is measured (see [`Figures`]): the first sweep-and-publish cycle (process start until
//! every KCP carries both conditions), the stand-in requests of a steady window (from then until
//! one more whole enricher cycle is over, as the guard's `quorumguard_sweep_seconds` count
//! tells), the guard's RSS and CPU, admission latency over h2 + TLS ([`super::load`]) in
//! slices of `slice`, each slice classed by whether a sweep read etcd CA Secrets while it ran,
//! and the rollout prediction of every KCP after the steady sweep (the guard's
//! `quorumguard_rollout_prediction_seconds`) against that sweep, with the verdicts it exported.

mod fleet;
mod measure;
mod table;

pub use fleet::{Fleet, Guard, cluster_name};
use measure::*;
pub use table::table;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use quorumguard::playground::apiserver::{ApiServer, kcp_resource};
use quorumguard::playground::etcd::{EtcdCluster, EtcdOptions};
use serde_json::json;

use super::https::{TempDir, TestPki, try_get_plain};
use super::load::{Options, Report, Target, drive_at, flags, quantile_ms};
use super::reviews::NS;
use super::seed;

/// The conditions quorumguard publishes.
const QUORUM: &str = "quorumguard.io/EtcdQuorum";
const NEXT_ACTION: &str = "quorumguard.io/NextAction";

/// How big a fleet and how to drive it.
#[derive(Clone, Debug)]
pub struct ScaleOptions {
    pub kcps: usize,
    pub etcd_clusters: usize,
    pub members: usize,
    /// The guard's `--probe-interval`.
    pub probe_interval: Duration,
    /// The guard's `--probe-concurrency`.
    pub probe_concurrency: usize,
    /// Reviews in flight, and the h2 connections they share.
    pub concurrency: usize,
    pub connections: usize,
    /// Length of one measured load slice.
    pub slice: Duration,
    /// Give up when the first cycle has not completed after this long.
    pub bound: Duration,
    /// Run the etcd processes at this `nice` (0–19). In a real fleet etcd runs on the workload
    /// clusters' machines; here its CPU competes with the guard's, and a positive value takes
    /// most of it out of the guard's way, to tell the two apart.
    pub etcd_nice: i32,
    /// How the guard reaches etcd: `direct` (the endpoints annotation) or `port-forward` (the
    /// production default: through each workload cluster's API server, here one stand-in per
    /// etcd cluster relaying `kube-system/etcd-<member>`, reached with the kubeconfig of Secret
    /// `<cluster>-kubeconfig`). The port-forward sessions the guard keeps count in its RSS.
    pub port_forward: bool,
}

impl ScaleOptions {
    /// The figure: 1,000 KCPs over 2 etcd clusters of 3, the guard's default interval
    /// and concurrency, reviews at a modest concurrency of 8.
    pub fn full() -> Self {
        ScaleOptions {
            kcps: 1000,
            etcd_clusters: 2,
            members: 3,
            probe_interval: Duration::from_secs(10),
            probe_concurrency: 16,
            concurrency: 8,
            connections: 2,
            slice: Duration::from_millis(500),
            bound: Duration::from_secs(600),
            etcd_nice: 0,
            port_forward: false,
        }
    }

    /// Seconds: 5 KCPs on one single-member etcd, a 1 s interval.
    pub fn smoke() -> Self {
        ScaleOptions {
            kcps: 5,
            etcd_clusters: 1,
            members: 1,
            probe_interval: Duration::from_secs(1),
            probe_concurrency: 16,
            concurrency: 4,
            connections: 1,
            slice: Duration::from_millis(250),
            bound: Duration::from_secs(60),
            etcd_nice: 0,
            port_forward: false,
        }
    }

    /// `full()` (or `smoke()` with `--smoke`) changed by `--kcps N --etcd-clusters N --members N
    /// --probe-interval 10s --probe-concurrency N --concurrency N --connections N --slice 500ms
    /// --bound 10m --etcd-nice 0 --transport direct|port-forward` (also as `--key=value`).
    pub fn from_args(args: &[String]) -> Result<Self> {
        let mut o = if args.iter().any(|a| a == "--smoke") {
            Self::smoke()
        } else {
            Self::full()
        };
        for (key, value) in flags(args, &["bench", "smoke"])? {
            let d = || humantime::parse_duration(&value);
            match key {
                "kcps" => o.kcps = value.parse()?,
                "etcd-clusters" => o.etcd_clusters = value.parse()?,
                "members" => o.members = value.parse()?,
                "probe-interval" => o.probe_interval = d()?,
                "probe-concurrency" => o.probe_concurrency = value.parse()?,
                "concurrency" => o.concurrency = value.parse()?,
                "connections" => o.connections = value.parse()?,
                "slice" => o.slice = d()?,
                "bound" => o.bound = d()?,
                "etcd-nice" => o.etcd_nice = value.parse()?,
                "transport" => {
                    o.port_forward = match value.as_str() {
                        "direct" => false,
                        "port-forward" => true,
                        other => bail!("--transport direct or port-forward, not {other:?}"),
                    }
                }
                _ => bail!("unknown flag --{key}"),
            }
        }
        if o.kcps == 0 || o.etcd_clusters == 0 || !(1..=5).contains(&o.members) {
            bail!("--kcps and --etcd-clusters at least 1, --members 1 to 5");
        }
        if !(0..=19).contains(&o.etcd_nice) {
            bail!("--etcd-nice 0 to 19");
        }
        Ok(o)
    }
}

/// Admission latencies of one class of slices.
#[derive(Debug, Default)]
pub struct Latencies {
    pub slices: usize,
    pub requests: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub verdicts: BTreeMap<String, u64>,
    /// Sorted, ns.
    pub latencies: Vec<u64>,
}

impl Latencies {
    fn add(&mut self, r: Report) {
        self.slices += 1;
        self.requests += r.requests;
        self.errors += r.errors;
        if self.first_error.is_none() {
            self.first_error = r.first_error;
        }
        for (k, v) in r.verdicts {
            *self.verdicts.entry(k).or_default() += v;
        }
        self.latencies.extend(r.latencies);
        self.latencies.sort_unstable();
    }

    /// The latency at quantile `q`, ms (NaN without requests).
    pub fn quantile_ms(&self, q: f64) -> f64 {
        quantile_ms(&self.latencies, q)
    }
}

/// What one scale run measured.
#[derive(Debug)]
pub struct Figures {
    pub options: ScaleOptions,
    /// Objects seeded in the stand-in.
    pub objects: usize,
    /// Guard process start until /readyz: caches synced and the first sweep done (every workload
    /// cluster probed once), so this is how long a restarted replica is blind.
    pub ready_after: Duration,
    /// Guard process start until every KCP carries both conditions.
    pub first_cycle: Duration,
    /// KCP status writes until then.
    pub first_cycle_writes: usize,
    /// Enricher cycles (sweep, then publication) in the first cycle, and their sweep and
    /// publication times in all (the guard's `quorumguard_sweep_seconds` and
    /// `quorumguard_status_publish_seconds`).
    pub first_cycles: u64,
    pub first_sweeps: Duration,
    pub first_publish: Duration,
    /// The steady window: from the end of the first cycle until two more enricher cycles are
    /// over (so one whole cycle ran inside it).
    pub steady_window: Duration,
    /// The last enricher cycle of the steady window: its sweep, its publication, and the rollout
    /// prediction of every KCP from what that sweep probed (`rollout::preflight` over the
    /// control planes the guard builds from its caches and the sweep's probes).
    pub steady_sweep: Duration,
    pub steady_publish: Duration,
    pub steady_prediction: Duration,
    /// KCP status writes (update or patch) in the steady window.
    pub steady_writes: usize,
    /// KCP status reads in the steady window.
    pub steady_status_reads: usize,
    /// Every request the guard made to the stand-in in the steady window, by verb and kind.
    pub steady_requests: BTreeMap<String, usize>,
    /// The guard's VmRSS at the end of the steady window, the highest sampled, and VmHWM, KiB.
    pub rss_rest_kib: u64,
    pub rss_sampled_peak_kib: u64,
    pub rss_hwm_kib: u64,
    /// The guard's CPU time (user + system) in the first cycle and in the steady window: sweeps,
    /// publication and the reviews of the load generator together.
    pub cpu_first_cycle: Duration,
    pub cpu_steady: Duration,
    /// Admission latency: slices of the first cycle, steady slices in which a sweep read CA
    /// Secrets, and steady slices in which none did.
    pub first: Latencies,
    pub sweeping: Latencies,
    pub idle: Latencies,
    /// EtcdQuorum reasons published at the end, with their counts.
    pub quorum_reasons: BTreeMap<String, usize>,
    /// `quorumguard_rollout_ready` at the end of the steady window: series by `verdict reason`.
    pub rollout_verdicts: BTreeMap<String, usize>,
    /// `quorumguard preflight -o json` over every KCP once `serve` has stopped: listing, one
    /// probe of every cluster (as many at once as serve's `--probe-concurrency`), every
    /// prediction with its step table.
    pub cli_preflight: Duration,
    /// The same with `--probe-concurrency` four times serve's.
    pub cli_preflight_wide: Duration,
    /// Its control planes by `readiness reason`.
    pub cli_readiness: BTreeMap<String, usize>,
}

/// Phases the load task tells apart.
const FIRST: u8 = 0;
const STEADY: u8 = 1;

/// One measured slice: the phase it ran in, whether a sweep read Secrets meanwhile.
struct Slice {
    phase: u8,
    sweeping: bool,
    report: Report,
}

/// Runs the whole measurement. `dir` holds etcd, certificates, the kubeconfig and the log.
pub async fn run(o: &ScaleOptions, progress: impl Fn(&str)) -> Result<Figures> {
    let dir = TempDir::new("scale");
    progress(&format!(
        "starting {} etcd cluster(s) of {} member(s) and seeding {} KCPs",
        o.etcd_clusters, o.members, o.kcps
    ));
    let fleet = Fleet::start(o, dir.path().to_path_buf()).await?;
    let api = fleet.api.clone();
    let pki = Arc::new(TestPki::new(dir.path()));
    progress(&format!(
        "{} objects seeded; starting quorumguard serve",
        fleet.objects
    ));
    let before = requests_by_class(&api);
    let started = Instant::now();
    let mut guard = Guard::start(&api, &pki, dir.path(), o)?;
    let pid = guard.pid();

    // Ready: caches synced.
    let ready_after = loop {
        guard.alive()?;
        if matches!(try_get_plain(guard.admin, "/readyz").await, Ok((code, _)) if code == 200) {
            break started.elapsed();
        }
        if started.elapsed() > o.bound {
            bail!("quorumguard was not ready within {:?}", o.bound);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    progress(&format!(
        "ready after {ready_after:?}; first cycle under load"
    ));

    // Reviews in slices until told to stop, from now on.
    let phase = Arc::new(AtomicU8::new(FIRST));
    let stop = Arc::new(AtomicBool::new(false));
    let slice_opts = Options {
        concurrency: o.concurrency,
        connections: o.connections,
        warmup: Duration::ZERO,
        duration: o.slice,
        only: None,
        rounds: 1,
    };
    let load = {
        let (phase, stop) = (phase.clone(), stop.clone());
        let (addr, admin, pki) = (guard.addr, guard.admin, pki.clone());
        tokio::spawn(async move {
            let mut slices = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let (p, (started, ended)) = (phase.load(Ordering::SeqCst), sweeps(admin).await);
                let report = drive_at(addr, &pki, Target::Quorumguard, &slice_opts).await;
                // Running at the start, or started during the slice.
                let sweeping = started > ended || sweeps(admin).await.0 > started;
                if phase.load(Ordering::SeqCst) != p {
                    continue; // straddles the end of the first cycle: neither
                }
                slices.push(Slice {
                    phase: p,
                    sweeping,
                    report: report?,
                });
            }
            anyhow::Ok(slices)
        })
    };

    // The first cycle: until every KCP has both conditions.
    let mut rss_peak = 0;
    let first_cycle = loop {
        guard.alive()?;
        rss_peak = rss_peak.max(proc_kib(pid, "VmRSS:"));
        if published(&api).1 == 0 {
            break started.elapsed();
        }
        if started.elapsed() > o.bound {
            stop.store(true, Ordering::SeqCst);
            let (_, missing) = published(&api);
            bail!(
                "{missing} KCPs still without conditions after {:?}; the guard's log:\n{}",
                o.bound,
                guard.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let cpu_first_cycle = proc_cpu(pid);
    phase.store(STEADY, Ordering::SeqCst);
    let at_first = requests_by_class(&api);
    progress(&format!(
        "first cycle done after {first_cycle:?}; steady window"
    ));

    // The steady window: until two more enricher cycles are over, so that one whole cycle
    // (sweep, then publication) ran inside it.
    let at_p = cycles(guard.admin).await;
    let steady_started = Instant::now();
    let steady_bound = o.probe_interval * 3 + o.bound;
    let (mut last, mut steady) = (at_p, (Duration::ZERO, Duration::ZERO, Duration::ZERO));
    loop {
        guard.alive()?;
        rss_peak = rss_peak.max(proc_kib(pid, "VmRSS:"));
        let now = cycles(guard.admin).await;
        if now.count > last.count {
            steady = (
                now.sweep - last.sweep,
                now.publish - last.publish,
                now.prediction.saturating_sub(last.prediction),
            );
            last = now;
        }
        if now.count >= at_p.count + 2 {
            break;
        }
        if steady_started.elapsed() > steady_bound {
            bail!(
                "{} enricher cycles within {steady_bound:?} of the first cycle's end; the guard's log:\n{}",
                now.count - at_p.count,
                guard.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let steady_window = steady_started.elapsed();
    let at_end = requests_by_class(&api);
    let rss_rest_kib = proc_kib(pid, "VmRSS:");
    let rss_hwm_kib = proc_kib(pid, "VmHWM:");
    let cpu_steady = proc_cpu(pid).saturating_sub(cpu_first_cycle);
    let rollout_verdicts = rollout_verdicts(guard.admin).await;
    stop.store(true, Ordering::SeqCst);
    let slices = load.await??;
    let (quorum_reasons, _) = published(&api);
    drop(guard);
    progress("quorumguard preflight over every KCP, as an operator runs it");
    let kubeconfig = dir.path().join("kubeconfig");
    let (cli_preflight, cli_readiness) =
        run_preflight_cli(&kubeconfig, o.probe_concurrency).await?;
    let (cli_preflight_wide, _) = run_preflight_cli(&kubeconfig, o.probe_concurrency * 4).await?;

    let mut figures = Figures {
        options: o.clone(),
        objects: fleet.objects,
        ready_after,
        first_cycle,
        first_cycle_writes: status_writes(&at_first) - status_writes(&before),
        first_cycles: at_p.count,
        first_sweeps: at_p.sweep,
        first_publish: at_p.publish,
        steady_window,
        steady_sweep: steady.0,
        steady_publish: steady.1,
        steady_prediction: steady.2,
        steady_writes: status_writes(&at_end) - status_writes(&at_first),
        steady_status_reads: count(&at_end, "get kcp status") - count(&at_first, "get kcp status"),
        steady_requests: at_end
            .iter()
            .map(|(k, v)| (k.clone(), v - count(&at_first, k)))
            .filter(|(_, v)| *v > 0)
            .collect(),
        rss_rest_kib,
        rss_sampled_peak_kib: rss_peak,
        rss_hwm_kib,
        cpu_first_cycle,
        cpu_steady,
        first: Latencies::default(),
        sweeping: Latencies::default(),
        idle: Latencies::default(),
        quorum_reasons,
        rollout_verdicts,
        cli_preflight,
        cli_preflight_wide,
        cli_readiness,
    };
    for s in slices {
        match (s.phase, s.sweeping) {
            (FIRST, _) => figures.first.add(s.report),
            (_, true) => figures.sweeping.add(s.report),
            (_, false) => figures.idle.add(s.report),
        }
    }
    Ok(figures)
}
