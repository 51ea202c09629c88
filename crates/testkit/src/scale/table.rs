//! The table the scale bench prints from its [`Figures`].

use super::*;

/// The table the bench prints.
pub fn table(f: &Figures) -> String {
    let o = &f.options;
    let mib = |k: u64| k as f64 / 1024.0;
    let mut out = format!(
        "scale: {} KCPs ({} objects in the stand-in) over {} etcd cluster(s) of {} member(s); \
         one guard process, --probe-interval {:?}, --probe-concurrency {}; reviews at \
         concurrency {} over {} h2 connection(s), slices of {:?}; etcd at nice {}; etcd reached \
         {}\n\n",
        o.kcps,
        f.objects,
        o.etcd_clusters,
        o.members,
        o.probe_interval,
        o.probe_concurrency,
        o.concurrency,
        o.connections,
        o.slice,
        o.etcd_nice,
        if o.port_forward {
            "through port-forward (one workload API-server stand-in per etcd cluster)"
        } else {
            "directly"
        }
    );
    let target = |met: bool| if met { "met" } else { "MISSED" };
    out += &format!("{:<44} {:>12}  target\n", "figure", "value");
    out += &format!(
        "{:<44} {:>10.2} s\n",
        "process start -> ready (first sweep done)",
        f.ready_after.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>10.2} s\n",
        "first sweep-and-publish cycle (all KCPs)",
        f.first_cycle.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>12}\n",
        "  KCP status writes in it", f.first_cycle_writes
    );
    out += &format!(
        "  in it: {} enricher cycle(s), sweeps {:.2} s, publication {:.2} s in all\n",
        f.first_cycles,
        f.first_sweeps.as_secs_f64(),
        f.first_publish.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>12}  0: {}\n",
        "KCP status writes, steady window",
        f.steady_writes,
        target(f.steady_writes == 0)
    );
    out += &format!(
        "{:<44} {:>12}\n",
        "KCP status reads, steady window", f.steady_status_reads
    );
    out += &format!(
        "{:<44} {:>10.2} s\n",
        "  steady window",
        f.steady_window.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>10.2} s  < interval: {}\n",
        "steady sweep (all clusters probed)",
        f.steady_sweep.as_secs_f64(),
        target(f.steady_sweep < o.probe_interval)
    );
    out += &format!(
        "{:<44} {:>10.2} s\n",
        "  its publication (nothing to write)",
        f.steady_publish.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>10.2} ms\n",
        "  rollout prediction, every KCP, after it",
        f.steady_prediction.as_secs_f64() * 1000.0
    );
    out += &format!(
        "{:<44} {:>12.4}\n",
        "  prediction / steady sweep",
        f.steady_prediction.as_secs_f64() / f.steady_sweep.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>10.2} s\n",
        "quorumguard preflight, every KCP (the CLI)",
        f.cli_preflight.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>12.2}\n",
        "  preflight CLI / steady sweep",
        f.cli_preflight.as_secs_f64() / f.steady_sweep.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>10.2} s\n",
        "  with --probe-concurrency 4x serve's",
        f.cli_preflight_wide.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>12.2}\n",
        "  preflight CLI (4x) / steady sweep",
        f.cli_preflight_wide.as_secs_f64() / f.steady_sweep.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>12.2}\n",
        "  preflight CLI / first (cold) sweep",
        f.cli_preflight.as_secs_f64() / f.first_sweeps.as_secs_f64()
    );
    out += &format!("  its answers: {}\n", counted(&f.cli_readiness));
    out += &format!(
        "  stand-in requests, steady window: {}\n",
        counted(&f.steady_requests)
    );
    out += &format!(
        "{:<44} {:>8.1} MiB  < 200 MiB: {}\n",
        "guard RSS at rest (end of steady window)",
        mib(f.rss_rest_kib),
        target(f.rss_rest_kib < 200 * 1024)
    );
    out += &format!(
        "{:<44} {:>8.1} MiB  < 200 MiB: {}\n",
        "guard RSS peak (VmHWM)",
        mib(f.rss_hwm_kib),
        target(f.rss_hwm_kib < 200 * 1024)
    );
    out += &format!(
        "{:<44} {:>10.2} s\n",
        "guard CPU, first cycle (with reviews)",
        f.cpu_first_cycle.as_secs_f64()
    );
    out += &format!(
        "{:<44} {:>10.2} s\n",
        "guard CPU, steady window (with reviews)",
        f.cpu_steady.as_secs_f64()
    );
    out += &format!(
        "\n{:<34} {:>7} {:>9} {:>9} {:>9} {:>7}\n",
        "admission latency", "slices", "requests", "p50 ms", "p99 ms", "errors"
    );
    for (name, l) in [
        ("idle (steady, no sweep)", &f.idle),
        ("during a steady sweep", &f.sweeping),
        ("during the first cycle", &f.first),
    ] {
        out += &format!(
            "{:<34} {:>7} {:>9} {:>9.3} {:>9.3} {:>7}\n",
            name,
            l.slices,
            l.requests,
            l.quantile_ms(0.5),
            l.quantile_ms(0.99),
            l.errors
        );
    }
    let idle = f.idle.quantile_ms(0.99);
    for (name, l) in [("steady sweep", &f.sweeping), ("first cycle", &f.first)] {
        let ratio = l.quantile_ms(0.99) / idle;
        out += &format!(
            "p99 {name} / idle p99: {ratio:.2} (target <= 1.50: {})\n",
            target(ratio <= 1.5)
        );
    }
    out += &format!("EtcdQuorum published: {}\n", counted(&f.quorum_reasons));
    out += &format!(
        "quorumguard_rollout_ready series: {}\n",
        counted(&f.rollout_verdicts)
    );
    for (name, l) in [
        ("idle", &f.idle),
        ("sweep", &f.sweeping),
        ("first", &f.first),
    ] {
        if let Some(e) = &l.first_error {
            out += &format!("{name}: first error: {e}\n");
        }
    }
    out
}
