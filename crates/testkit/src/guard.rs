//! The guard running as `serve` runs it, for tests that drive it over the wire: its
//! configuration (with short probe intervals for faults and races, or webhook-only), a stand-in
//! seeded with the fixture control plane, and the reviews kube-apiserver would send it, built
//! from the fixtures and sent over h2.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::Request;
use hyper::body::Bytes;
use quorumguard::engine::{Confirmation, Policy};
use quorumguard::etcd::{TransportKind, sweep::SweepConfig};
use quorumguard::playground::etcd::ELECTION_TIMEOUT;
use quorumguard::server::{self, Running, ServeConfig, StatusConfig};
use rustls::ClientConfig;
use serde_json::{Value, json};

use super::apiserver::ApiServer;
use super::https::{STEP, TestPki, send};
use super::reviews::{NS, cluster_object, fixture, kcp_object, machine_named, members, stored};
use super::seed::machine;

/// kube-apiserver's default (and maximum) webhook timeout: every review must be answered
/// before it.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// `serve` on loopback with the direct etcd transport, sweeping every `interval` (each probe
/// bounded by 1 s), publishing status when `status` is given.
pub fn serve_config(
    pki: &TestPki,
    interval: Duration,
    reservation_ttl: Duration,
    status: Option<StatusConfig>,
) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        admin_listen: "127.0.0.1:0".parse().expect("addr"),
        tls_cert: pki.cert_file.clone(),
        tls_key: pki.key_file.clone(),
        tls_reload_interval: Duration::from_secs(1),
        client_auth: None,
        policy: Policy::default(),
        reservation_ttl,
        shutdown_delay: Duration::from_millis(10),
        shutdown_grace: Duration::from_secs(1),
        pod_name: None,
        events: false,
        sweep: Some(SweepConfig {
            interval,
            deadline: Duration::from_secs(1),
            concurrency: 4,
            transport: TransportKind::Direct,
            confirmation: Confirmation {
                election_timeout: ELECTION_TIMEOUT,
            },
            ..SweepConfig::default()
        }),
        status,
        autopilot: None,
    }
}

/// The DELETE review of Machine `test-<member>` (fixture control plane) by `user`.
pub fn delete_review(member: &str, user: &str, dry_run: bool, uid: &str) -> Value {
    let mut r = fixture("machine-delete-by-user.json");
    r["request"]["uid"] = json!(uid);
    r["request"]["name"] = json!(format!("test-{member}"));
    r["request"]["userInfo"]["username"] = json!(user);
    r["request"]["oldObject"] = machine(member);
    r["request"]["dryRun"] = json!(dry_run);
    if dry_run {
        r["request"]["options"]["dryRun"] = json!(["All"]);
    }
    r
}

/// The UPDATE review of the fixture KCP changing `spec.replicas` from `from` to `to` by `user`:
/// through the `/scale` subresource (as `kubectl scale` does) or the KCP itself.
pub fn replicas_review(from: i64, to: i64, user: &str, scale: bool, uid: &str) -> Value {
    let mut r = if scale {
        fixture("kcp-scale-subresource-3-to-5.json")
    } else {
        fixture("kcp-update-replicas-5-to-3.json")
    };
    r["request"]["uid"] = json!(uid);
    r["request"]["userInfo"]["username"] = json!(user);
    r["request"]["oldObject"]["spec"]["replicas"] = json!(from);
    r["request"]["object"]["spec"]["replicas"] = json!(to);
    // The KCP at the stand-in's version (`reviews::kcp_object`: v1.28.0, voting joins), so that
    // a review of the KCP itself and one of its scale subresource (judged on the cached KCP)
    // read the same join style.
    if !scale {
        for o in ["oldObject", "object"] {
            r["request"][o]["spec"]["version"] = json!("v1.28.0");
        }
    }
    r
}

/// What the webhook answered, and how long it took.
#[derive(Clone, Debug)]
pub struct Answer {
    pub allowed: bool,
    pub reason: String,
    pub message: String,
    pub took: Duration,
}

/// Sends one review over a fresh h2 connection to the webhook at `addr`. An error when the
/// webhook does not answer 200 with a review (each step bounded by [`super::https::STEP`]).
pub async fn review(
    addr: SocketAddr,
    tls: Arc<ClientConfig>,
    path: &str,
    body: &Value,
) -> Result<Answer, String> {
    let started = Instant::now();
    let request = Request::post(path)
        .header("content-type", "application/json")
        .header("host", "localhost")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(body).map_err(|e| e.to_string())?,
        )))
        .map_err(|e| e.to_string())?;
    let (code, bytes) = send(addr, tls, request).await?;
    let took = started.elapsed();
    if code.as_u16() != 200 {
        return Err(format!(
            "{code}: {}",
            String::from_utf8_lossy(&bytes).trim_end()
        ));
    }
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    let response = &v["response"];
    Ok(Answer {
        allowed: response["allowed"].as_bool().ok_or("no allowed")?,
        reason: response["auditAnnotations"]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        message: response["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        took,
    })
}

/// A webhook-only configuration (no sweep, no status, no events) on loopback ports chosen by the
/// system, serving `pki`'s pair, re-read every `reload`.
pub fn config(pki: &TestPki, reload: Duration) -> ServeConfig {
    ServeConfig {
        tls_reload_interval: reload,
        client_auth: None,
        reservation_ttl: Duration::from_secs(30),
        shutdown_delay: Duration::from_millis(100),
        shutdown_grace: Duration::from_secs(2),
        sweep: None,
        ..serve_config(pki, Duration::from_secs(10), Duration::from_secs(30), None)
    }
}

/// A stand-in holding Cluster `test`, its KCP (replicas 3) and Machines test-cp-{a,b,c}.
pub async fn standin() -> ApiServer {
    let api = ApiServer::start().await.expect("stand-in");
    api.insert(cluster_object(json!({}))).expect("cluster");
    api.insert(stored(kcp_object())).expect("kcp");
    api.insert(super::seed::health_check(NS, "test", "test-controlplane"))
        .expect("machine health check");
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

/// [`review`] of `body` at `path`, for tests where anything but a verdict is a failure:
/// (allowed, the reason in `auditAnnotations`).
pub async fn verdict(running: &Running, pki: &TestPki, path: &str, body: &Value) -> (bool, String) {
    match review(running.addr, pki.client(&[b"h2"]), path, body).await {
        Ok(a) if !a.reason.is_empty() => (a.allowed, a.reason),
        Ok(a) => panic!("a verdict without a reason: {a:?}"),
        Err(e) => panic!("POST {path}: {e}"),
    }
}

/// Path of the Machine webhook.
pub const MACHINES: &str = "/validate/machines";
/// Path of the KCP webhook.
pub const KCPS: &str = "/validate/kubeadmcontrolplanes";
