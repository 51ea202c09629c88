//! The etcd prober (issue 6, part 3): one probe of a real 3-member etcd cluster over TLS, healthy
//! and with one member frozen (SIGSTOP), repeated; prints min/median/max against the targets.
//!
//! Run: `cargo bench --bench prober` (needs `etcd`, `etcdctl` and `openssl` on PATH, as the
//! tests do; `scripts/test.sh` installs them). Settings: `-- --runs 20 --deadline 1s --probers
//! 300 --pf-probers 100`, or `QG_PROBER_RUNS`, `QG_PROBER_DEADLINE`, `QG_PROBER_PROBERS`,
//! `QG_PROBER_PF_PROBERS`.
//!
//! A probe is what the sweep does for each cluster: the member list, then every member's status
//! and health in parallel, all under one deadline. "Kept clients" is the sweep's steady state
//! (one client per member kept between sweeps); "new clients" is the first sweep after a start or
//! a CA change (every connection dialled and TLS-handshaken inside the probe). The frozen member
//! is a follower: freezing the leader also costs an election, which is etcd's time, not ours.
//!
//! Memory (issue 6, part 4): what one kept prober costs, as the sweep keeps one per workload
//! cluster between sweeps: `--probers` probers, each with its own TLS material signed with the
//! etcd CA (as the sweep makes per cluster) and its three kept connections, all to the same
//! cluster. Reported per prober: the growth of the process's RSS and of its live heap (counted by
//! this binary's allocator), after one probe each and again after a second.
//!
//! The same for the port-forward transport (issue 39): `--pf-probers` probers (default 100), each
//! with its own workload API client reaching the members through port-forward: its three
//! loopback listeners, three port-forward WebSockets through the workload API server and three TLS
//! connections to etcd inside them, kept between probes. The workload API-server stand-in runs on a
//! runtime of its own whose threads this binary's allocator does not count, so the live heap is
//! quorumguard's alone; the RSS is the process's, so it includes the stand-in's side of every
//! session (an upper bound).
//!
//! Costs of a new cluster (what the first sweep pays per workload cluster, before its first
//! probe), each the mean of `--costs` runs, one at a time: loading the etcd CA (Cluster API's
//! shape: RSA 2048, PKCS#1) and signing a client certificate with it, split into the load and
//! the signature; building the rustls configuration from it; and the CPU of the process for a
//! probe with new clients (3 TCP + TLS + HTTP/2 handshakes) against one with kept clients.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use quorumguard::certs::Ca;
use quorumguard::engine::Health;
use quorumguard::etcd::certs::{CLIENT_CERT_VALIDITY, CLIENT_COMMON_NAME};
use quorumguard::etcd::{ClientTls, PortForward, Probe, Prober, Transport};
use quorumguard::playground::apiserver::ApiServer;
use quorumguard::playground::etcd::EtcdCluster;

/// The system allocator, counting the bytes live: the heap a kept prober holds, without the
/// allocator's own slack that RSS includes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// Set on the threads of the workload API-server stand-in's runtime: what it allocates is the
    /// workload cluster's side, not quorumguard's.
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread's allocations count (a thread being torn down counts).
fn counted() -> bool {
    !UNCOUNTED.try_with(Cell::get).unwrap_or(false)
}

// SAFETY: every call is passed on unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counted() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counted() {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counted() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn rss_kib() -> f64 {
    testkit::load::rss_kib() as f64
}

fn live_kib() -> f64 {
    LIVE.load(Ordering::Relaxed) as f64 / 1024.0
}

/// Memory per kept prober: RSS and live heap growth, KiB, after one probe each and after two.
struct Memory {
    probers: usize,
    rss: [f64; 2],
    live: [f64; 2],
}

impl Memory {
    fn print(&self, title: &str) {
        println!("\n{title}");
        println!("{:<24} {:>12} {:>14}", "", "RSS KiB", "live heap KiB");
        for (i, when) in ["after 1 probe each", "after 2 probes each"]
            .iter()
            .enumerate()
        {
            println!("{when:<24} {:>12.1} {:>14.1}", self.rss[i], self.live[i]);
        }
    }
}

/// Probes through `n` kept probers twice (`probe(round, i)`, which makes prober `i` in round 0),
/// and measures what they hold after each round, per prober.
fn rounds(n: usize, mut probe: impl FnMut(usize, usize) -> Result<()>) -> Result<Memory> {
    let (rss0, live0) = (rss_kib(), live_kib());
    let mut after = [(0.0, 0.0); 2];
    for (round, after) in after.iter_mut().enumerate() {
        for i in 0..n {
            probe(round, i)?;
        }
        *after = (rss_kib() - rss0, live_kib() - live0);
    }
    let per = |v: f64| v / n as f64;
    Ok(Memory {
        probers: n,
        rss: [per(after[0].0), per(after[1].0)],
        live: [per(after[0].1), per(after[1].1)],
    })
}

/// A client certificate of its own, signed with the cluster's etcd CA, as the sweep makes per
/// cluster.
fn signed_tls(cluster: &EtcdCluster) -> Result<ClientTls> {
    Ok(ClientTls::from_etcd_ca(
        &cluster.pki.ca_cert_pem,
        &cluster.pki.ca_key_pem,
        SystemTime::now(),
    )?)
}

/// One probe through `prober`, which must keep a client per member.
fn probe_kept(
    rt: &tokio::runtime::Runtime,
    prober: &Prober,
    endpoints: &[String],
    deadline: Duration,
    what: &str,
) -> Result<()> {
    let p = rt
        .block_on(prober.probe(endpoints, deadline))
        .with_context(|| what.to_string())?;
    if p.members.len() != 3 || prober.cached_endpoints().len() != 3 {
        bail!("{what}: the prober does not keep 3 clients: {p:?}");
    }
    Ok(())
}

/// Makes `n` probers as the sweep does (one per cluster, each with its own client certificate
/// signed with the etcd CA), probes through each twice, and measures what they hold.
fn memory(
    rt: &tokio::runtime::Runtime,
    cluster: &EtcdCluster,
    n: usize,
    deadline: Duration,
) -> Result<Memory> {
    let endpoints = cluster.endpoints();
    let mut kept = Vec::with_capacity(n);
    rounds(n, |round, i| {
        if round == 0 {
            kept.push(Prober::new(signed_tls(cluster)?));
        }
        let what = format!("prober {i}, probe {}", round + 1);
        probe_kept(rt, &kept[i], &endpoints, deadline, &what)
    })
}

/// [`memory`] for the port-forward transport (see the module's documentation): `n` probers, each
/// with its own workload API client, through a stand-in whose allocations are not counted.
fn memory_port_forward(
    rt: &tokio::runtime::Runtime,
    cluster: &EtcdCluster,
    n: usize,
    deadline: Duration,
) -> Result<Memory> {
    let standin = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .on_thread_start(|| UNCOUNTED.with(|c| c.set(true)))
        .build()?;
    let workload = standin.block_on(ApiServer::start())?;
    let mut names = Vec::new();
    for i in 0..cluster.len() {
        let name = cluster.name(i).context("member name")?.to_string();
        let url = cluster.client_url(i).context("member URL")?;
        let addr = url.trim_start_matches("https://").parse()?;
        workload.forward_pod("kube-system", &format!("etcd-{name}"), addr);
        names.push(name);
    }
    let yaml = workload.kubeconfig_yaml();
    // The loopback listeners are made (and their accept tasks spawned) on quorumguard's runtime.
    let _entered = rt.enter();
    let mut kept: Vec<(Prober, Vec<String>)> = Vec::with_capacity(n);
    let memory = rounds(n, |round, i| {
        if round == 0 {
            let pf = rt.block_on(PortForward::from_kubeconfig(&yaml, "ns", &format!("c{i}")))?;
            let prober = Prober::with_transport(signed_tls(cluster)?, Transport::port_forward(pf));
            let endpoints = prober.transport().list_endpoints(None, &[], &names)?;
            kept.push((prober, endpoints));
        }
        let (prober, endpoints) = &kept[i];
        let what = format!("port-forward prober {i}, probe {}", round + 1);
        probe_kept(rt, prober, endpoints, deadline, &what)
    })?;
    if workload.open_port_forwards() != 3 * n {
        bail!(
            "{n} port-forward probers keep {} sessions open, not {}",
            workload.open_port_forwards(),
            3 * n
        );
    }
    drop(kept);
    Ok(memory)
}

/// CPU time of this process (user + system, all threads).
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The mean wall time of `n` calls of `f`, µs.
fn mean_us<T>(n: usize, mut f: impl FnMut() -> Result<T>) -> Result<f64> {
    let started = Instant::now();
    for _ in 0..n {
        f()?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// What a new cluster costs before its first probe (see the module's documentation), µs.
struct Costs {
    runs: usize,
    ca_load: f64,
    sign: f64,
    load_and_sign: f64,
    tls_config: f64,
    probe_new_wall: f64,
    probe_kept_wall: f64,
    probe_new_cpu: f64,
    probe_kept_cpu: f64,
}

fn costs(
    rt: &tokio::runtime::Runtime,
    cluster: &EtcdCluster,
    runs: usize,
    deadline: Duration,
) -> Result<Costs> {
    let (ca_pem, key_pem) = (&cluster.pki.ca_cert_pem, &cluster.pki.ca_key_pem);
    let now = quorumguard::certs::unix_secs(SystemTime::now());
    let ca = Ca::from_pem(ca_pem, key_pem)?;
    let cert = ca.sign_client(CLIENT_COMMON_NAME, CLIENT_CERT_VALIDITY, now)?;
    let endpoints = cluster.endpoints();
    let configure = || {
        ClientTls::new(
            ca_pem.as_str(),
            cert.cert_pem.as_str(),
            cert.key_pem.as_str(),
        )
    };
    let tls = configure()?;
    let kept = Prober::new(tls.clone());
    rt.block_on(kept.probe(&endpoints, deadline))?;
    // Wall and process CPU per probe, µs.
    let probe = |new: bool| -> Result<(f64, f64)> {
        let (cpu, started) = (process_cpu(), Instant::now());
        for _ in 0..runs {
            let fresh = new.then(|| Prober::new(tls.clone()));
            rt.block_on(fresh.as_ref().unwrap_or(&kept).probe(&endpoints, deadline))?;
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / runs as f64;
        Ok((per(started.elapsed()), per(process_cpu() - cpu)))
    };
    let (probe_new_wall, probe_new_cpu) = probe(true)?;
    let (probe_kept_wall, probe_kept_cpu) = probe(false)?;
    Ok(Costs {
        runs,
        ca_load: mean_us(runs, || Ok(Ca::from_pem(ca_pem, key_pem)?))?,
        sign: mean_us(runs, || {
            Ok(ca.sign_client(CLIENT_COMMON_NAME, CLIENT_CERT_VALIDITY, now)?)
        })?,
        load_and_sign: mean_us(runs, || {
            Ok(ClientTls::from_etcd_ca(ca_pem, key_pem, SystemTime::now())?)
        })?,
        tls_config: mean_us(runs, || Ok(configure()?))?,
        probe_new_wall,
        probe_kept_wall,
        probe_new_cpu,
        probe_kept_cpu,
    })
}

/// What one scenario measured, sorted, in milliseconds.
struct Row {
    scenario: &'static str,
    millis: Vec<f64>,
    target: Duration,
    /// A probe that did not show the expected health (a wrong answer, not a slow one).
    wrong: usize,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let setting = |name: &str| -> Option<String> {
        args.iter()
            .position(|a| a == &format!("--{name}"))
            .and_then(|i| args.get(i + 1).cloned())
            .or_else(|| std::env::var(format!("QG_PROBER_{}", name.to_uppercase())).ok())
    };
    let runs: usize = setting("runs").map_or(Ok(20), |v| v.parse())?;
    let probers: usize = setting("probers").map_or(Ok(300), |v| v.parse())?;
    let pf_probers: usize = setting("pf-probers").map_or(Ok(100), |v| v.parse())?;
    let cost_runs: usize = setting("costs").map_or(Ok(200), |v| v.parse())?;
    let deadline = setting("deadline").map_or(Ok(Duration::from_secs(1)), |v| {
        humantime::parse_duration(&v)
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    let mut cluster = EtcdCluster::start(3).context("starting a 3-member etcd cluster")?;
    let tls = cluster.client_tls()?;
    let endpoints = cluster.endpoints();
    let names: Vec<String> = (0..3)
        .filter_map(|i| cluster.name(i).map(str::to_string))
        .collect();
    let kept = Prober::new(tls.clone());
    let healthy = |p: &Probe, expect: &[&str]| {
        p.members.len() == 3
            && p.members
                .iter()
                .all(|m| (m.health == Health::Healthy) == expect.contains(&m.name.as_str()))
    };
    let all: Vec<&str> = names.iter().map(String::as_str).collect();

    // Settle: every member healthy through the kept prober.
    let settle = || -> Result<Probe> {
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(p) = rt.block_on(kept.probe(&endpoints, deadline))
                && healthy(&p, &all)
            {
                return Ok(p);
            }
            if Instant::now() > until {
                bail!("the cluster did not become healthy within 15 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let first = settle()?;
    let follower = first
        .members
        .iter()
        .find(|m| !m.is_leader)
        .and_then(|m| cluster.index_of(&m.name))
        .context("no follower")?;

    let healthy_target = Duration::from_millis(50);
    let frozen_target = deadline + Duration::from_millis(100);
    let measure = |scenario, target, new_client: bool, expect: &[&str]| -> Row {
        let mut row = Row {
            scenario,
            millis: Vec::new(),
            target,
            wrong: 0,
        };
        for _ in 0..runs {
            let fresh;
            let prober = if new_client {
                fresh = Prober::new(tls.clone());
                &fresh
            } else {
                &kept
            };
            let started = Instant::now();
            let result = rt.block_on(prober.probe(&endpoints, deadline));
            row.millis.push(started.elapsed().as_secs_f64() * 1e3);
            if !result.is_ok_and(|p| healthy(&p, expect)) {
                row.wrong += 1;
            }
            // Between sweeps, as the sweep's interval would; short, for a short bench.
            std::thread::sleep(Duration::from_millis(50));
        }
        row.millis.sort_by(f64::total_cmp);
        row
    };
    let mut rows = vec![
        measure("healthy, kept clients", healthy_target, false, &all),
        measure("healthy, new clients", healthy_target, true, &all),
    ];
    cluster.freeze(follower)?;
    let up: Vec<&str> = all
        .iter()
        .copied()
        .filter(|n| Some(*n) != cluster.name(follower))
        .collect();
    rows.push(measure("1 frozen, kept clients", frozen_target, false, &up));
    rows.push(measure("1 frozen, new clients", frozen_target, true, &up));
    cluster.thaw(follower)?;
    // Memory last, once every member is healthy again, so that its 900 connections do not
    // disturb the timings.
    settle()?;
    let cost = costs(&rt, &cluster, cost_runs, deadline)?;
    let mem = memory(&rt, &cluster, probers, deadline)?;
    let pf_mem = memory_port_forward(&rt, &cluster, pf_probers, deadline)?;

    println!(
        "etcd prober: 3-member etcd {} over TLS on 127.0.0.1, {runs} probes each, deadline {}\n",
        etcd_version(),
        humantime::format_duration(deadline)
    );
    println!(
        "{:<24} {:>9} {:>9} {:>9} {:>10} {:>7}  result",
        "scenario", "min ms", "median ms", "max ms", "target ms", "wrong"
    );
    let mut missed = false;
    for r in &rows {
        let max = r.millis.last().copied().unwrap_or(f64::NAN);
        let target = r.target.as_secs_f64() * 1e3;
        let met = max <= target && r.wrong == 0;
        missed |= !met;
        println!(
            "{:<24} {:>9.1} {:>9.1} {:>9.1} {:>10.0} {:>7}  {} (max/target {:.2})",
            r.scenario,
            r.millis.first().copied().unwrap_or(f64::NAN),
            r.millis[r.millis.len() / 2],
            max,
            target,
            r.wrong,
            if met { "met" } else { "missed" },
            max / target
        );
    }
    println!(
        "\ntargets: healthy probe under 50 ms; with a frozen member, within the deadline + 100 ms"
    );
    if missed {
        println!("(a target was missed: see the max column)");
    }
    mem.print(&format!(
        "memory per kept prober (3 TLS connections, its own client certificate), {} probers:",
        mem.probers
    ));
    pf_mem.print(&format!(
        "memory per kept port-forward prober (its workload API client, 3 loopback listeners, 3 port-forward WebSockets, 3 TLS connections inside them), {} probers; RSS includes the stand-in's side, the live heap is quorumguard's:",
        pf_mem.probers
    ));
    println!(
        "\nwhat a new cluster costs before its first probe, mean of {} runs one at a time (µs):",
        cost.runs
    );
    for (what, us) in [
        ("load the etcd CA (RSA 2048, PKCS#1)", cost.ca_load),
        ("sign a client certificate (P-256 key)", cost.sign),
        (
            "load, sign and configure TLS (from_etcd_ca)",
            cost.load_and_sign,
        ),
        ("TLS configuration alone (ClientTls::new)", cost.tls_config),
        ("probe, new clients: wall", cost.probe_new_wall),
        ("probe, new clients: process CPU", cost.probe_new_cpu),
        ("probe, kept clients: wall", cost.probe_kept_wall),
        ("probe, kept clients: process CPU", cost.probe_kept_cpu),
    ] {
        println!("{what:<44} {us:>10.0}");
    }
    Ok(())
}

/// The version of the etcd the cluster runs (`QUORUMGUARD_ETCD_BIN_DIR`'s, else PATH's), for
/// the report.
fn etcd_version() -> String {
    quorumguard::playground::etcd::etcd_version().unwrap_or_else(|e| format!("? ({e})"))
}
