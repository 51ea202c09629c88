//! The webhook as tests of the wire see it: `quorumguard serve` in-process on 127.0.0.1 (HTTPS
//! with a test certificate, admin port over HTTP), its caches fed by the API-server stand-in
//! seeded with the fixture control plane, etcd health set as a sweep would set it.

use std::time::{Duration, Instant};

use quorumguard::engine::Policy;
use quorumguard::server::{self, Running, ServeConfig};
use serde_json::json;

use super::apiserver::ApiServer;
use super::https::{STEP, TestPki};
use super::reviews::{NS, cluster_object, kcp_object, machine_named, members, stored};

/// A webhook-only configuration (no sweep, no status, no events) on loopback ports chosen by the
/// system, serving `pki`'s pair, re-read every `reload`.
pub fn config(pki: &TestPki, reload: Duration) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        tls_cert: pki.cert_file.clone(),
        tls_key: pki.key_file.clone(),
        tls_reload_interval: reload,
        policy: Policy::default(),
        reservation_ttl: Duration::from_secs(30),
        shutdown_delay: Duration::from_millis(100),
        shutdown_grace: Duration::from_secs(2),
        pod_name: None,
        events: false,
        sweep: None,
        status: None,
    }
}

/// A stand-in holding Cluster `test`, its KCP (replicas 3) and Machines test-cp-{a,b,c}.
pub async fn standin() -> ApiServer {
    let api = ApiServer::start().await.expect("stand-in");
    api.insert(cluster_object(json!({}))).expect("cluster");
    api.insert(stored(kcp_object())).expect("kcp");
    for x in ["a", "b", "c"] {
        let machine = machine_named(&format!("test-cp-{x}"), &format!("cp-{x}"));
        api.insert(stored(machine)).expect("machine");
    }
    api
}

/// Starts the server against `api`, waits (bounded) for its caches to sync, and records the three
/// etcd members cp-{a,b,c} as healthy.
pub async fn start(config: ServeConfig, api: &ApiServer) -> Running {
    let running = server::start(config, api.client().expect("client"))
        .await
        .expect("server starts");
    let deadline = Instant::now() + STEP;
    while !running.state.all_synced() {
        assert!(
            Instant::now() < deadline,
            "caches did not sync within {STEP:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let healthy = members(&[("a", true), ("b", true), ("c", true)]);
    running
        .state
        .set_health(NS, "test", healthy, Instant::now());
    running
}

/// POSTs `review` to `path` of the running webhook over h2 and returns its verdict: (allowed,
/// the reason in `auditAnnotations`). Panics unless the answer is a 200 with a review.
pub async fn verdict(
    running: &Running,
    pki: &TestPki,
    path: &str,
    review: &serde_json::Value,
) -> (bool, String) {
    let (code, body) = super::https::post(
        running.addr,
        pki.client(&[b"h2"]),
        path,
        "application/json",
        serde_json::to_vec(review).expect("json"),
    )
    .await;
    let v: serde_json::Value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("not a review ({e}): {}", String::from_utf8_lossy(&body)));
    assert_eq!(code.as_u16(), 200, "{v}");
    let allowed = v["response"]["allowed"].as_bool();
    let reason = v["response"]["auditAnnotations"]["reason"].as_str();
    match (allowed, reason) {
        (Some(allowed), Some(reason)) => (allowed, reason.to_owned()),
        _ => panic!("a verdict has `allowed` and a reason: {v}"),
    }
}
