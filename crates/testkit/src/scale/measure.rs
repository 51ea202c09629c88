//! What the scale run reads off the guard and the stand-in: the guard process's RSS and CPU
//! (`/proc`; its nice value is set here too), the stand-in's requests by class, the guard's own
//! metrics (enricher cycles, sweeps, rollout verdicts), and `quorumguard preflight` run against
//! the fleet.

use super::*;

/// A field of /proc/`pid`/status, KiB (0 where there is no /proc).
pub(super) fn proc_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// User + system CPU time of process `pid` (clock ticks of 10 ms, as Linux reports them).
pub(super) fn proc_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command may hold spaces: fields are counted after its closing parenthesis.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// The kind and verb of a stand-in request, e.g. `get secrets`, `update kcp status`.
pub(super) fn request_class(verb: &str, path: &str) -> String {
    let what = if path.contains("/kubeadmcontrolplanes/") && path.ends_with("/status") {
        "kcp status"
    } else if path.contains("/secrets") {
        "secrets"
    } else if path.contains("/leases") {
        "leases"
    } else if path.contains("/events") {
        "events"
    } else if path.contains("/kubeadmcontrolplanes") {
        "kcps"
    } else if path.contains("/machines") {
        "machines"
    } else if path.contains("/clusters") {
        "clusters"
    } else {
        "other"
    };
    format!("{verb} {what}")
}

/// Requests the stand-in has seen, by class.
pub(super) fn requests_by_class(api: &ApiServer) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in api.requests() {
        *out.entry(request_class(&r.verb, &r.path)).or_default() += 1;
    }
    out
}

pub(super) fn count(by: &BTreeMap<String, usize>, class: &str) -> usize {
    by.get(class).copied().unwrap_or(0)
}

/// KCP status writes so far (the writer uses update; patch counted too).
pub(super) fn status_writes(by: &BTreeMap<String, usize>) -> usize {
    count(by, "update kcp status") + count(by, "patch kcp status")
}

/// The EtcdQuorum reason of every KCP that has both conditions, and how many KCPs lack them.
pub(super) fn published(api: &ApiServer) -> (BTreeMap<String, usize>, usize) {
    let mut reasons = BTreeMap::new();
    let mut missing = 0;
    for k in api.list(&kcp_resource()) {
        let list = k["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let find = |t: &str| list.iter().find(|c| c["type"] == t).cloned();
        match (find(QUORUM), find(NEXT_ACTION)) {
            (Some(q), Some(_)) => {
                *reasons
                    .entry(q["reason"].as_str().unwrap_or("").to_string())
                    .or_default() += 1
            }
            _ => missing += 1,
        }
    }
    (reasons, missing)
}

/// The guard's enricher cycles so far, from its metrics.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Cycles {
    pub(super) count: u64,
    pub(super) sweep: Duration,
    pub(super) publish: Duration,
    /// Predicting every KCP's rollout after each sweep (counted once the cycle's sweep is over,
    /// before `count` moves).
    pub(super) prediction: Duration,
}

/// The guard's /metrics as a lookup of unlabelled values (0 for a missing one, or when the guard
/// does not answer).
pub(super) async fn metrics(admin: SocketAddr) -> impl Fn(&str) -> f64 {
    let body = try_get_plain(admin, "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default();
    move |name: &str| {
        body.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    }
}

/// Reads [`Cycles`] from the guard's /metrics (zero when it does not answer).
pub(super) async fn cycles(admin: SocketAddr) -> Cycles {
    let value = metrics(admin).await;
    Cycles {
        count: value("quorumguard_sweep_seconds_count") as u64,
        sweep: Duration::from_secs_f64(value("quorumguard_sweep_seconds_sum")),
        publish: Duration::from_secs_f64(value("quorumguard_status_publish_seconds_sum")),
        prediction: Duration::from_secs_f64(value("quorumguard_rollout_prediction_seconds_sum")),
    }
}

/// Runs `quorumguard preflight -o json` on the fleet (direct etcd transport, as `serve` ran) and
/// times it; its control planes counted by `readiness reason`. Exit status 0 and 1 are both
/// predictions; 2 is an error here.
pub(super) async fn run_preflight_cli(
    kubeconfig: &std::path::Path,
    concurrency: usize,
) -> Result<(Duration, BTreeMap<String, usize>)> {
    let kubeconfig = kubeconfig.to_path_buf();
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(crate::paths::quorumguard_bin())
            .args(["preflight", "-A", "-o", "json", "--etcd-transport=direct"])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--probe-concurrency={concurrency}"))
            .stdin(Stdio::null())
            .output()
    })
    .await??;
    let took = started.elapsed();
    if !matches!(out.status.code(), Some(0 | 1)) {
        bail!(
            "quorumguard preflight exited {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .context("quorumguard preflight -o json printed no JSON")?;
    let mut counted = BTreeMap::new();
    for cp in report["controlPlanes"].as_array().into_iter().flatten() {
        let key = format!(
            "{} {}",
            cp["readiness"].as_str().unwrap_or("?"),
            cp["reason"].as_str().unwrap_or("?")
        );
        *counted.entry(key).or_insert(0) += 1;
    }
    Ok((took, counted))
}

/// The guard's `quorumguard_rollout_ready` series, counted by `verdict reason`.
pub(super) async fn rollout_verdicts(admin: SocketAddr) -> BTreeMap<String, usize> {
    let body = try_get_plain(admin, "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in body.lines() {
        let Some(labels) = line.strip_prefix("quorumguard_rollout_ready{") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|v| v.split('"').next())
                .unwrap_or("?")
                .to_string()
        };
        *out.entry(format!("{} {}", label("verdict"), label("reason")))
            .or_default() += 1;
    }
    out
}

/// The guard's sweeps started and enricher cycles ended so far: a sweep (or its publication) is
/// running when the first is ahead.
pub(super) async fn sweeps(admin: SocketAddr) -> (u64, u64) {
    let value = metrics(admin).await;
    (
        value("quorumguard_sweeps_started_total") as u64,
        value("quorumguard_sweep_seconds_count") as u64,
    )
}

/// `key count, key count, ...`.
pub(super) fn counted(counts: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    parts.join(", ")
}

/// Sets the `nice` of process `pid` (0 leaves it alone).
pub(super) fn renice(pid: u32, nice: i32) -> Result<()> {
    if nice == 0 {
        return Ok(());
    }
    // SAFETY: setpriority only reads its arguments.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, nice) };
    if rc != 0 {
        bail!(
            "setpriority({pid}, {nice}): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
