//! Loopback ports for the processes the playground and the tests start (etcd members,
//! `quorumguard serve` children, kube-apiserver): picked free, then bound a moment later by the
//! process that is handed the number.
//!
//! Picked below Linux's ephemeral range (32768 and up by default): a port the kernel hands out
//! for `bind(0)` is one an outgoing connection may take too, between the pick and the child's
//! bind ("address in use"); the busy tests open many such connections. A port below that range
//! is taken only by a listener, and the start spot differs per call, so two pickers rarely meet.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// The range ports are picked from: below the ephemeral range, above the well-known ports.
pub const PORTS: std::ops::Range<u16> = 20000..32000;

/// A port on 127.0.0.1 that nothing listens on now: from [`PORTS`], starting at a spot that
/// differs per call (at most 200 tried), else one the kernel picks.
pub fn free_port() -> io::Result<u16> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let span = u64::from(PORTS.end - PORTS.start);
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::from(d.subsec_nanos()))
        .unwrap_or(0)
        .wrapping_add(u64::from(std::process::id()).wrapping_mul(7919))
        .wrapping_add(NEXT.fetch_add(101, Ordering::Relaxed));
    for i in 0..200 {
        let port = PORTS.start + ((seed + i * 37) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
}

/// [`free_port`] as an address on 127.0.0.1.
pub fn free_addr() -> io::Result<SocketAddr> {
    free_port().map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_below_the_ephemeral_range_and_different_ports() {
        let a = free_port().expect("a port");
        let b = free_port().expect("a port");
        assert!(PORTS.contains(&a) && PORTS.contains(&b), "{a} {b}");
        assert_ne!(a, b, "two calls in a row start at different spots");
        // Free: it binds.
        TcpListener::bind(("127.0.0.1", a)).expect("the picked port binds");
    }
}
