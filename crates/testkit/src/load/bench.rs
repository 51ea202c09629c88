//! The load bench's face: its table of rounds and its command line (`cargo bench --bench
//! webhook_load -- ...`).

use super::*;

/// The table the bench prints: one row per server and round, each round's ratios against the
/// targets, and their medians over the rounds.
pub fn table(opts: &Options, rounds: &[Vec<Report>]) -> String {
    let mut out = format!(
        "webhook under load: concurrency {} over {} h2 connection(s) (TLS 1.3, ALPN h2), {:?} measured after {:?} warm-up, {} round(s)\n\n",
        opts.concurrency,
        opts.connections,
        opts.duration,
        opts.warmup,
        rounds.len()
    );
    out += &format!(
        "{:<5} {:<12} {:>9} {:>9} {:>9} {:>9} {:>7} {:>10} {:>10}\n",
        "round",
        "server",
        "req/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "RSS rest",
        "RSS peak"
    );
    let mut ratios = Vec::new();
    let mut json_ratios: Vec<(f64, f64)> = Vec::new();
    for (i, reports) in rounds.iter().enumerate() {
        for r in reports {
            let (server_cpu, client_cpu) = r.cpu_us_per_request();
            out += &format!(
                "{:<5} {:<12} {:>9.0} {:>9.3} {:>9.3} {:>9.3} {:>7} {:>6} MiB {:>6} MiB {:>5.0} + {:<5.0}\n",
                i + 1,
                r.target.as_str(),
                r.throughput(),
                r.quantile_ms(0.5),
                r.quantile_ms(0.99),
                r.quantile_ms(0.999),
                r.errors,
                r.rss_rest_kib / 1024,
                r.rss_peak_kib / 1024,
                server_cpu,
                client_cpu,
            );
        }
        let find = |t| reports.iter().find(|r| r.target == t);
        if let (Some(floor), Some(qg)) = (find(Target::Floor), find(Target::Quorumguard)) {
            ratios.push((
                qg.throughput() / floor.throughput(),
                qg.quantile_ms(0.99) / floor.quantile_ms(0.99),
            ));
            if let Some(json) = find(Target::FloorJson) {
                json_ratios.push((
                    json.throughput() / floor.throughput(),
                    qg.throughput() / json.throughput(),
                ));
            }
        }
    }
    if !ratios.is_empty() {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        // One pair's figure of every round, listed.
        let each_of = |pairs: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
            pairs
                .iter()
                .map(|r| format!("{:.2}", f(r)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let each = |f| each_of(&ratios, f);
        let tput = median(ratios.iter().map(|r| r.0).collect());
        let p99 = median(ratios.iter().map(|r| r.1).collect());
        out += &format!(
            "\nthroughput quorumguard/floor: median {tput:.2} (rounds: {}; target >= 0.80: {})\n",
            each(|r| r.0),
            if tput >= 0.8 { "met" } else { "missed" }
        );
        out += &format!(
            "p99 quorumguard/floor:        median {p99:.2} (rounds: {}; target <= 1.30: {})\n",
            each(|r| r.1),
            if p99 <= 1.3 { "met" } else { "missed" }
        );
        if !json_ratios.is_empty() {
            let rounds = |f| each_of(&json_ratios, f);
            out += &format!(
                "throughput floor+json/floor:  rounds {} (the bound of a serde_json reader)\n",
                rounds(|r| r.0)
            );
            out += &format!(
                "throughput quorumguard/floor+json: rounds {}\n",
                rounds(|r| r.1)
            );
        }
    }
    out += "RSS is the whole process's: both servers, the API-server stand-in and the load generator.\n";
    out += "CPU µs/req: the server runtime's threads + the load generator's, in the measured window.\n";
    for r in rounds
        .iter()
        .flatten()
        .filter(|r| r.target == Target::Quorumguard)
        .take(1)
    {
        out += "quorumguard's verdicts (round 1):";
        for (k, v) in &r.verdicts {
            out += &format!(" {k} {v};");
        }
        out.push('\n');
    }
    for r in rounds.iter().flatten() {
        if let Some(e) = &r.first_error {
            out += &format!("{} first error: {e}\n", r.target.as_str());
        }
    }
    out
}

/// The settings from the command line (`cargo bench --bench webhook_load -- ...`) and the
/// environment; flags win. `--smoke` is 1 s at concurrency 4 with no warm-up.
pub fn options_from(args: &[String]) -> Result<Options> {
    let env = |k: &str| std::env::var(k).ok();
    let mut opts = Options {
        concurrency: 64,
        connections: 3,
        warmup: Duration::from_secs(2),
        duration: Duration::from_secs(10),
        only: None,
        rounds: 1,
    };
    let set = |key: &str, value: &str, opts: &mut Options| -> Result<()> {
        match key {
            "concurrency" => opts.concurrency = value.parse()?,
            "connections" => opts.connections = value.parse()?,
            "warmup" => opts.warmup = humantime::parse_duration(value)?,
            "duration" => opts.duration = humantime::parse_duration(value)?,
            "rounds" => opts.rounds = value.parse()?,
            "only" => {
                opts.only = Some(match value {
                    "floor" => Target::Floor,
                    "floor+json" => Target::FloorJson,
                    "quorumguard" => Target::Quorumguard,
                    _ => bail!("--only floor, --only floor+json or --only quorumguard"),
                })
            }
            _ => bail!("unknown setting {key}"),
        }
        Ok(())
    };
    if env("QG_LOAD_SMOKE").is_some() || args.iter().any(|a| a == "--smoke") {
        opts = smoke();
    }
    for key in [
        "concurrency",
        "connections",
        "warmup",
        "duration",
        "only",
        "rounds",
    ] {
        if let Some(v) = env(&format!("QG_LOAD_{}", key.to_uppercase())) {
            set(key, &v, &mut opts)?;
        }
    }
    for (key, value) in flags(args, &["bench", "smoke"])? {
        // `--log` is read by the bench's main.
        if key != "log" {
            set(key, &value, &mut opts)?;
        }
    }
    Ok(opts)
}

/// The `--key value` and `--key=value` pairs of a bench's command line, without the `switches`
/// (flags without a value; cargo bench appends `--bench`). Other words are skipped.
pub fn flags<'a>(args: &'a [String], switches: &[&str]) -> Result<Vec<(&'a str, String)>> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(key) = a.strip_prefix("--") else {
            continue;
        };
        if switches.contains(&key) {
            continue;
        }
        out.push(match key.split_once('=') {
            Some((k, v)) => (k, v.to_string()),
            None => (
                key,
                it.next()
                    .cloned()
                    .ok_or_else(|| anyhow!("--{key} needs a value"))?,
            ),
        });
    }
    Ok(out)
}
