//! Waiting for a state of a real cluster to show in a probe, bounded.

use std::time::{Duration, Instant};

use quorumguard_observe::etcd::{Probe, Prober};
use testkit::etcd::EtcdCluster;

/// Each probe's deadline.
const DEADLINE: Duration = Duration::from_secs(5);
/// How long a state a test waits for may take to show.
pub const SETTLE: Duration = Duration::from_secs(30);

/// Probes `cluster` (direct) every 200 ms until `done` holds, at most [`SETTLE`].
pub fn probe_until(
    rt: &tokio::runtime::Runtime,
    cluster: &EtcdCluster,
    what: &str,
    done: impl Fn(&Probe) -> bool,
) -> Probe {
    let prober = Prober::new(cluster.client_tls());
    let endpoints = cluster.endpoints();
    let started = Instant::now();
    loop {
        let p = rt.block_on(prober.probe(&endpoints, DEADLINE));
        if let Ok(p) = &p
            && done(p)
        {
            return p.clone();
        }
        assert!(
            started.elapsed() < SETTLE,
            "not {what} within {SETTLE:?}: {p:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
