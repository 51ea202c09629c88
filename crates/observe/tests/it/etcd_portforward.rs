//! The port-forward etcd transport end to end: a real 3-member etcd cluster (3.4 or 3.5) with TLS on
//! loopback, reached the way KCP reaches it — through the workload cluster's API server, by
//! port-forward to pod `kube-system/etcd-<node>` port 2379.
//!
//! Two API-server stand-ins: the management one holds the Cluster, KCP and Machines (watched
//! into the state, as `serve` does), Secret `test-etcd` (the etcd CA) and Secret
//! `test-kubeconfig` (a kubeconfig for the second one); the workload one relays port-forwards of
//! pods `etcd-m1`..`etcd-m3` to the real members. The sweep is driven by hand (`sweep_once`), so
//! every step is deterministic; each wait is bounded in count and time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumguard_engine::{Confirmation, EtcdState, Health, Member};
use quorumguard_observe::etcd::TransportKind;
use quorumguard_observe::etcd::sweep::{Probers, SweepConfig, sweep_once};
use quorumguard_observe::state::{ClusterState, Kind, watch};
use quorumguard_playground::etcd::ELECTION_TIMEOUT;
use serde_json::{Value, json};
use testkit::apiserver::ApiServer;
use testkit::etcd::EtcdCluster;
use testkit::reviews::{NS, cluster_object, kcp_object, machine_named, stored};
use testkit::seed::{self, secret, wait_for};

const KCP: &str = "test-controlplane";
/// The probe deadline: the production default.
const DEADLINE: Duration = Duration::from_secs(2);
/// What a loaded 2-core machine may add to a deadline (scheduling, TLS, port-forward set-up).
const MARGIN: Duration = Duration::from_secs(3);

fn config(transport: TransportKind) -> SweepConfig {
    SweepConfig {
        interval: Duration::from_secs(60),
        deadline: DEADLINE,
        concurrency: 4,
        transport,
        // Read the Secrets on every sweep: a changed kubeconfig must be used by the next sweep.
        secret_refresh: Duration::ZERO,
        confirmation: Confirmation {
            election_timeout: ELECTION_TIMEOUT,
        },
        ..SweepConfig::default()
    }
}

/// Cluster `test` in `ns` over every member of `etcd`, with its KCP, Machines and CA Secret.
fn seed_cluster(api: &ApiServer, ns: &str, etcd: &EtcdCluster, annotations: Value) {
    let members: Vec<String> = (0..etcd.len()).map(|i| etcd.name(i).to_string()).collect();
    seed::cluster(
        api,
        ns,
        "test",
        annotations,
        &members,
        Some(&etcd.pki),
        |_| {},
    );
}

fn kubeconfig_secret(ns: &str, workload: &ApiServer) -> Value {
    secret(
        ns,
        "test-kubeconfig",
        &[("value", &workload.kubeconfig_yaml())],
    )
}

/// A workload API-server stand-in relaying `kube-system/etcd-<member>` to every member.
async fn workload_for(etcd: &EtcdCluster) -> ApiServer {
    testkit::etcd::workload_api(etcd)
        .await
        .expect("workload stand-in")
}

/// The state `serve` keeps, fed by the real watches against the management stand-in, once it
/// shows `targets` clusters to probe. The watch tasks end with the returned guard.
async fn watched_state(mgmt: &ApiServer, targets: usize) -> (Arc<ClusterState>, Watches) {
    let state = Arc::new(ClusterState::new());
    let client = mgmt.client().expect("client");
    let tasks = Kind::ALL
        .iter()
        .map(|&kind| tokio::spawn(watch::run(client.clone(), kind, state.clone(), |_| {})))
        .collect();
    let watches = Watches(tasks);
    wait_for("the watches to sync", Duration::from_secs(20), || {
        state.all_synced() && state.probe_targets().len() == targets
    })
    .await;
    (state, watches)
}

struct Watches(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// The members the state holds for Cluster `test` in `ns`, or why it has none.
fn members(state: &ClusterState, ns: &str) -> Result<Vec<Member>, String> {
    match state
        .control_plane(ns, KCP, Instant::now())
        .map_err(|e| format!("{e:?}"))?
        .etcd
    {
        EtcdState::Observed(s) => Ok(s.members),
        EtcdState::Unknown { reason } => Err(reason),
    }
}

fn healthy(members: &[Member]) -> usize {
    members.iter().filter(|m| m.health.is_healthy()).count()
}

fn show(members: &Result<Vec<Member>, String>) -> String {
    match members {
        Ok(ms) => ms
            .iter()
            .map(|m| format!("{} {} leader={} {:?}", m.name, m.id, m.is_leader, m.health))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("no members: {e}"),
    }
}

/// Sweeps (bounded) until Cluster `test` in each of `namespaces` shows `want` healthy members.
async fn sweep_until_healthy(
    mgmt: &ApiServer,
    state: &ClusterState,
    cfg: &SweepConfig,
    probers: &Probers,
    namespaces: &[&str],
    want: usize,
) {
    let client = mgmt.client().expect("client");
    let mut last = String::new();
    for _ in 0..20 {
        sweep_once(&client, state, cfg, probers).await;
        let all = namespaces.iter().all(|ns| {
            let m = members(state, ns);
            last = format!("{ns}:\n{}", show(&m));
            m.is_ok_and(|m| healthy(&m) == want)
        });
        if all {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("never {want} healthy members; last sweep:\n{last}");
}

/// `etcdctl endpoint status`'s leader ID, as the members themselves report it.
fn etcdctl_leader(etcd: &EtcdCluster) -> u64 {
    let out = etcd
        .etcdctl(&etcd.endpoints(), &["endpoint", "status", "-w", "json"])
        .expect("endpoint status");
    let v: Value = serde_json::from_str(&out).expect("status JSON");
    let leaders: Vec<u64> = v
        .as_array()
        .expect("a list")
        .iter()
        .map(|e| e["Status"]["leader"].as_u64().expect("a leader ID"))
        .collect();
    assert!(
        leaders.windows(2).all(|w| w[0] == w[1]),
        "one leader: {leaders:?}"
    );
    leaders[0]
}

const PF_PATH: &str = "/api/v1/namespaces/kube-system/pods";

/// A management stand-in holding Cluster `test` without a transport annotation and its
/// kubeconfig Secret for a workload stand-in relaying to `etcd`, watched into the state: the
/// management and workload stand-ins, the state and its watches.
async fn unannotated_cluster(
    etcd: &EtcdCluster,
) -> (ApiServer, ApiServer, Arc<ClusterState>, Watches) {
    let mgmt = ApiServer::start().await.expect("management stand-in");
    let workload = workload_for(etcd).await;
    seed_cluster(&mgmt, NS, etcd, json!({}));
    mgmt.insert(kubeconfig_secret(NS, &workload))
        .expect("kubeconfig secret");
    let (state, watches) = watched_state(&mgmt, 1).await;
    (mgmt, workload, state, watches)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_probed_through_the_workload_api_server() {
    let mut etcd = EtcdCluster::start(3);
    // No transport annotation: the default transport, which is port-forward.
    let (mgmt, workload, state, _watches) = unannotated_cluster(&etcd).await;
    let cfg = config(TransportKind::default());
    assert_eq!(cfg.transport, TransportKind::PortForward);
    let probers = Probers::default();

    // (a) Every member healthy, the leader the one etcd names, IDs as etcd lists them.
    sweep_until_healthy(&mgmt, &state, &cfg, &probers, &[NS], 3).await;
    let seen = members(&state, NS).expect("members");
    assert_eq!(seen.len(), 3, "{}", show(&Ok(seen.clone())));
    let leader = etcdctl_leader(&etcd);
    let leaders: Vec<&Member> = seen.iter().filter(|m| m.is_leader).collect();
    assert_eq!(leaders.len(), 1, "{}", show(&Ok(seen.clone())));
    assert_eq!(leaders[0].id.0, leader, "the leader etcd names");
    for i in 0..3 {
        let name = etcd.name(i).to_string();
        let m = seen.iter().find(|m| m.name == name).expect("member");
        assert_eq!(m.id.0, etcd.member_id(i), "{name}'s ID");
        assert_eq!(m.version.as_deref(), Some(testkit::etcd::version()));
        // Every member was reached through its own pod's port-forward.
        assert!(
            workload.request_count("get", &format!("{PF_PATH}/etcd-{name}/portforward")) >= 1,
            "no port-forward to etcd-{name}: {:?}",
            workload.requests()
        );
    }
    assert!(
        mgmt.requests()
            .iter()
            .all(|r| !r.path.contains("portforward")),
        "nothing is port-forwarded on the management cluster"
    );

    // The etcd clients and their port-forwards are kept between sweeps.
    let opened = workload.port_forwards_total();
    sweep_once(&mgmt.client().expect("client"), &state, &cfg, &probers).await;
    assert_eq!(healthy(&members(&state, NS).expect("members")), 3);
    assert_eq!(
        workload.port_forwards_total(),
        opened,
        "a second sweep reuses the open port-forwards"
    );
    assert!(workload.open_port_forwards() >= 3);

    // A changed kubeconfig Secret (the workload API server moved): the next sweep goes through
    // the new server, and everything through the old one is closed.
    let moved = workload_for(&etcd).await;
    mgmt.insert(kubeconfig_secret(NS, &moved))
        .expect("kubeconfig secret");
    sweep_until_healthy(&mgmt, &state, &cfg, &probers, &[NS], 3).await;
    assert!(moved.port_forwards_total() >= 3, "through the new server");
    wait_for(
        "the old server's port-forwards to close",
        Duration::from_secs(10),
        || workload.open_port_forwards() == 0,
    )
    .await;

    // (b) A frozen follower: unhealthy with the timeout, the others healthy, and the sweep ends
    // by its deadline (plus a generous margin: the machine is small and may be busy).
    let now = members(&state, NS).expect("members");
    let follower = now
        .iter()
        .find(|m| !m.is_leader)
        .map(|m| etcd.index_of(&m.name))
        .expect("a follower");
    let frozen = etcd.name(follower).to_string();
    etcd.freeze(follower);
    let started = Instant::now();
    sweep_once(&mgmt.client().expect("client"), &state, &cfg, &probers).await;
    let took = started.elapsed();
    let after = members(&state, NS);
    etcd.thaw(follower);
    let after = after.unwrap_or_else(|e| panic!("no members with {frozen} frozen: {e}"));
    assert!(
        took < DEADLINE + MARGIN,
        "the sweep took {took:?} with {frozen} frozen (deadline {DEADLINE:?})"
    );
    let m = after
        .iter()
        .find(|m| m.name == frozen)
        .expect("frozen member");
    match &m.health {
        Health::Unhealthy(e) => assert!(e.contains("no answer within 2s"), "{e}"),
        other => panic!("{frozen} frozen but {other:?}"),
    }
    assert_eq!(healthy(&after), 2, "{}", show(&Ok(after.clone())));
    println!("sweep with {frozen} frozen took {took:?} (deadline {DEADLINE:?})");

    // Thawed: healthy again; then dropping the probers closes every port-forward.
    sweep_until_healthy(&mgmt, &state, &cfg, &probers, &[NS], 3).await;
    assert!(moved.open_port_forwards() >= 3);
    drop(probers);
    wait_for(
        "every port-forward to close with its prober",
        Duration::from_secs(10),
        || moved.open_port_forwards() == 0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_api_server_does_not_know_is_unhealthy_naming_the_pod() {
    let etcd = EtcdCluster::start(3);
    let mgmt = ApiServer::start().await.expect("management stand-in");
    let workload = workload_for(&etcd).await;
    // (c) The third member's pod is unknown to the workload API server: 404 NotFound.
    let gone = etcd.name(2).to_string();
    workload.unforward_pod("kube-system", &format!("etcd-{gone}"));
    seed_cluster(&mgmt, NS, &etcd, json!({}));
    mgmt.insert(kubeconfig_secret(NS, &workload))
        .expect("kubeconfig secret");
    let (state, _watches) = watched_state(&mgmt, 1).await;
    let cfg = config(TransportKind::PortForward);
    let probers = Probers::default();

    sweep_until_healthy(&mgmt, &state, &cfg, &probers, &[NS], 2).await;
    let seen = members(&state, NS).expect("members");
    assert_eq!(seen.len(), 3, "the member list still has {gone}");
    let m = seen.iter().find(|m| m.name == gone).expect("member");
    let expected = format!(
        "port-forward to kube-system/etcd-{gone} through {}: 404 NotFound: pods \"etcd-{gone}\" \
         not found",
        workload.url()
    );
    assert_eq!(m.health, Health::Unhealthy(expected));
    assert!(
        workload.request_count("get", &format!("{PF_PATH}/etcd-{gone}/portforward")) >= 1,
        "the port-forward was asked for"
    );
}

/// A pod whose port the kubelet cannot reach (nothing listens there): the kubelet's words come
/// back on the port-forward's error channel (channel 1, after the port it announces on it), and
/// the member is unhealthy in them, not in etcd-client's "connection closed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_port_the_kubelet_cannot_reach_is_unhealthy_in_the_kubelets_words() {
    let etcd = EtcdCluster::start(3);
    let workload = workload_for(&etcd).await;
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("its address")
    };
    let gone = etcd.name(2).to_string();
    workload.forward_pod("kube-system", &format!("etcd-{gone}"), closed);
    let (prober, endpoints) = port_forward_prober(&etcd, &workload, &workload.url()).await;

    let p = probe_until_healthy(&prober, &endpoints, 2).await;
    let m = p.members.iter().find(|m| m.name == gone).expect("listed");
    let expected = format!(
        "port-forward to kube-system/etcd-{gone} through {}: error forwarding port 2379 to pod \
         kube-system/etcd-{gone}: dial tcp {closed}: ",
        workload.url()
    );
    match &m.health {
        Health::Unhealthy(text) => assert!(text.starts_with(&expected), "{text}"),
        other => panic!("{gone} should be unhealthy, not {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_annotation_chooses_the_transport_per_cluster() {
    let etcd = EtcdCluster::start(3);
    let mgmt = ApiServer::start().await.expect("management stand-in");
    let workload = workload_for(&etcd).await;
    // (d) Two Clusters of the same etcd, side by side. `pf` is annotated port-forward: it has
    // no endpoints annotation and its Machines no addresses, so dialling directly would have
    // nothing to dial. `direct` is annotated direct with the endpoints: it has no kubeconfig
    // Secret, so port-forwarding would fail.
    let endpoints = etcd.endpoints().join(",");
    seed_cluster(
        &mgmt,
        "pf",
        &etcd,
        json!({"quorumguard.io/etcd-transport": "port-forward"}),
    );
    mgmt.insert(kubeconfig_secret("pf", &workload))
        .expect("kubeconfig secret");
    seed_cluster(
        &mgmt,
        "direct",
        &etcd,
        json!({"quorumguard.io/etcd-transport": "direct",
               "quorumguard.io/etcd-endpoints": endpoints}),
    );
    let (state, _watches) = watched_state(&mgmt, 2).await;
    let probers = Probers::default();

    // Whichever the default, each Cluster's annotation decides.
    for default in [TransportKind::Direct, TransportKind::PortForward] {
        let before = workload.port_forwards_total();
        sweep_until_healthy(
            &mgmt,
            &state,
            &config(default),
            &probers,
            &["pf", "direct"],
            3,
        )
        .await;
        for ns in ["pf", "direct"] {
            let seen = members(&state, ns).expect("members");
            assert_eq!(
                seen.iter().filter(|m| m.is_leader).count(),
                1,
                "{ns}: {}",
                show(&Ok(seen.clone()))
            );
        }
        assert!(
            mgmt.request_count("get", "/api/v1/namespaces/direct/secrets/test-kubeconfig") == 0,
            "the direct Cluster's kubeconfig is never read"
        );
        println!(
            "default {default:?}: {} new port-forwards",
            workload.port_forwards_total() - before
        );
    }
    assert!(
        workload.port_forwards_total() >= 3,
        "pf went through the API server"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_kubeconfig_says_what_to_do() {
    // (e) No etcd is reached here: the probe stops at the missing Secret.
    let mgmt = ApiServer::start().await.expect("management stand-in");
    mgmt.insert(cluster_object(json!({}))).expect("cluster");
    mgmt.insert(stored(kcp_object())).expect("kcp");
    mgmt.insert(stored(machine_named("test-m1", "m1")))
        .expect("machine");
    mgmt.insert(secret(
        NS,
        "test-etcd",
        &[
            (
                "tls.crt",
                include_str!("../../../pki/src/testdata/capi-etcd-ca.crt"),
            ),
            (
                "tls.key",
                include_str!("../../../pki/src/testdata/capi-etcd-ca.key"),
            ),
        ],
    ))
    .expect("CA secret");
    let (state, _watches) = watched_state(&mgmt, 1).await;
    let client = mgmt.client().expect("client");
    let probers = Probers::default();

    sweep_once(
        &client,
        &state,
        &config(TransportKind::PortForward),
        &probers,
    )
    .await;
    assert_eq!(
        members(&state, NS).expect_err("no probe"),
        "Cluster capi-test/test: Secret capi-test/test-kubeconfig not found: the port-forward \
         transport needs the workload kubeconfig; set quorumguard.io/etcd-transport: direct to \
         dial etcd directly"
    );

    // A Secret without the key Cluster API writes.
    mgmt.insert(secret(NS, "test-kubeconfig", &[("kubeconfig", "x")]))
        .expect("secret");
    sweep_once(
        &client,
        &state,
        &config(TransportKind::PortForward),
        &probers,
    )
    .await;
    assert_eq!(
        members(&state, NS).expect_err("no probe"),
        "Cluster capi-test/test: Secret capi-test/test-kubeconfig has no key `value` (Cluster \
         API keeps the workload kubeconfig there); set quorumguard.io/etcd-transport: direct to \
         dial etcd directly"
    );

    // An annotation naming no transport is reported as such, whatever the default.
    mgmt.insert(cluster_object(
        json!({"quorumguard.io/etcd-transport": "tunnel"}),
    ))
    .expect("cluster");
    wait_for(
        "the annotation in the cache",
        Duration::from_secs(10),
        || state.probe_targets()[0].transport_annotation.as_deref() == Some("tunnel"),
    )
    .await;
    sweep_once(&client, &state, &config(TransportKind::Direct), &probers).await;
    assert_eq!(
        members(&state, NS).expect_err("no probe"),
        "Cluster capi-test/test: annotation quorumguard.io/etcd-transport: \"tunnel\" is not a \
         transport: use port-forward or direct"
    );
}

/// A CA like the cluster's etcd CA, and a TLS server on 127.0.0.1 presenting a serving
/// certificate it signed for `sans` (h2, as etcd offers). The server completes handshakes and
/// then closes: it is not etcd, only a certificate to verify.
struct TlsServer {
    ca_cert_pem: String,
    ca_key_pem: String,
    addr: SocketAddr,
    /// Handshakes completed: the client accepted the certificate.
    handshakes: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    fn handshakes(&self) -> usize {
        self.handshakes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tls_server(sans: Vec<rcgen::SanType>) -> TlsServer {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
        IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "etcd-ca");
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert_pem = ca.self_signed(&ca_key).expect("self-sign").pem();
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("server key");
    let mut p = CertificateParams::default();
    p.subject_alt_names = sans;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = p.signed_by(&key, &issuer).expect("sign");

    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).expect("cert")],
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key"),
    )
    .expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let handshakes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = handshakes.clone();
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let done = done.clone();
            connections.spawn(async move {
                let accepted =
                    tokio::time::timeout(Duration::from_secs(5), acceptor.accept(tcp)).await;
                if matches!(accepted, Ok(Ok(_))) {
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    });
    TlsServer {
        ca_cert_pem,
        ca_key_pem,
        addr,
        handshakes,
        task,
    }
}

/// Why the member list failed at the one endpoint asked.
async fn member_list_error(prober: &quorumguard_observe::etcd::Prober, url: &str) -> String {
    match prober.probe(&[url.to_string()], DEADLINE).await {
        Err(quorumguard_observe::etcd::ProbeError::MemberList { attempts }) => {
            assert_eq!(attempts.len(), 1);
            attempts[0].error.clone()
        }
        other => panic!("not etcd, yet {other:?}"),
    }
}

/// Through a port-forward the member is dialled at a loopback address of ours, so the serving
/// certificate is verified for `localhost` — which kubeadm always puts in it — not for that
/// address. A certificate without `localhost` is refused even though it names 127.0.0.1; one
/// with only `localhost` passes the handshake (and then fails as the server is not etcd). The
/// direct transport verifies the URL's host as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forwarded_members_are_verified_as_localhost() {
    use quorumguard_observe::etcd::{ClientTls, PortForward, Prober, Transport};
    use rcgen::SanType;

    let ip_only = tls_server(vec![SanType::IpAddress([127, 0, 0, 1].into())]).await;
    let localhost_only = tls_server(vec![SanType::DnsName(
        "localhost".try_into().expect("name"),
    )])
    .await;
    let workload = ApiServer::start().await.expect("workload stand-in");
    workload.forward_pod("kube-system", "etcd-ip-only", ip_only.addr);
    workload.forward_pod("kube-system", "etcd-localhost", localhost_only.addr);

    let prober = |server: &TlsServer, transport: Transport| {
        let tls = ClientTls::from_etcd_ca(
            &server.ca_cert_pem,
            &server.ca_key_pem,
            std::time::SystemTime::now(),
        )
        .expect("client certificate");
        Prober::with_transport(tls, transport)
    };
    let port_forward = || async {
        Transport::port_forward(
            PortForward::from_kubeconfig(&workload.kubeconfig_yaml(), NS, "test")
                .await
                .expect("kubeconfig"),
        )
    };

    let p = prober(&ip_only, port_forward().await);
    let url = p
        .transport()
        .list_endpoints(None, &[], &["ip-only".to_string()])
        .expect("listener")
        .remove(0);
    let refused = member_list_error(&p, &url).await;
    assert!(
        refused.contains("invalid peer certificate") && refused.contains("localhost"),
        "{refused}"
    );
    assert_eq!(ip_only.handshakes(), 0);

    let p = prober(&localhost_only, port_forward().await);
    let url = p
        .transport()
        .list_endpoints(None, &[], &["localhost".to_string()])
        .expect("listener")
        .remove(0);
    let accepted = member_list_error(&p, &url).await;
    assert!(!accepted.contains("invalid peer certificate"), "{accepted}");
    assert!(localhost_only.handshakes() >= 1, "{accepted}");
    println!("port-forward, no localhost: {refused}\nport-forward, localhost: {accepted}");

    // Direct: the URL's host (127.0.0.1) is what the certificate must name.
    let direct = format!("https://{}", ip_only.addr);
    let accepted = member_list_error(&prober(&ip_only, Transport::Direct), &direct).await;
    assert!(!accepted.contains("invalid peer certificate"), "{accepted}");
    assert!(ip_only.handshakes() >= 1, "{accepted}");
    let direct = format!("https://{}", localhost_only.addr);
    let before = localhost_only.handshakes();
    let refused = member_list_error(&prober(&localhost_only, Transport::Direct), &direct).await;
    assert!(refused.contains("invalid peer certificate"), "{refused}");
    assert_eq!(localhost_only.handshakes(), before);
    assert!(
        workload.port_forwards_total() >= 2,
        "the first two went through the workload API server"
    );
}

/// A prober of `etcd` through the port-forward transport, reaching the workload API server at
/// `server` (the stand-in's own address, or a relay in front of it), and its endpoints (one
/// listener per member's pod).
async fn port_forward_prober(
    etcd: &EtcdCluster,
    workload: &ApiServer,
    server: &str,
) -> (quorumguard_observe::etcd::Prober, Vec<String>) {
    use quorumguard_observe::etcd::{PortForward, Prober, Transport};
    let yaml = workload.kubeconfig_yaml().replace(&workload.url(), server);
    let pf = PortForward::from_kubeconfig(&yaml, NS, "test")
        .await
        .expect("kubeconfig");
    let prober = Prober::with_transport(etcd.client_tls(), Transport::port_forward(pf));
    let names: Vec<String> = (0..etcd.len()).map(|i| etcd.name(i).to_string()).collect();
    let endpoints = prober
        .transport()
        .list_endpoints(None, &[], &names)
        .expect("listeners");
    (prober, endpoints)
}

/// Probes (at most 20 times, 250 ms apart) until `want` members are healthy.
async fn probe_until_healthy(
    prober: &quorumguard_observe::etcd::Prober,
    endpoints: &[String],
    want: usize,
) -> quorumguard_observe::etcd::Probe {
    let mut last = String::new();
    for _ in 0..20 {
        match prober.probe(endpoints, DEADLINE).await {
            Ok(p) if healthy(&p.members) == want => return p,
            Ok(p) => last = show(&Ok(p.members)),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("never {want} healthy members; last probe:\n{last}");
}

/// Issue 39: probes of one cluster keep its port-forward sessions (one WebSocket through the
/// workload API server per member, opened by the first probe): 20 more probes open none.
///
/// How long they take is the fresh-probe bench's to measure (`cargo bench --bench fresh_probe`,
/// docs/benchmarks.md), not this test's: a test never asserts a time. With Nagle's algorithm on
/// a socket of the relay (the loopback listener's, the WebSocket's to the API server), a write
/// that follows one not yet acknowledged waits for the peer's delayed ACK, 40 ms on Linux, and a
/// probe took 80-90 ms on loopback; the median printed here shows it (5 ms without).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_port_forwards_are_reused() {
    let etcd = EtcdCluster::start(3);
    let workload = workload_for(&etcd).await;
    let (prober, endpoints) = port_forward_prober(&etcd, &workload, &workload.url()).await;
    probe_until_healthy(&prober, &endpoints, 3).await;
    // Sessions of connections dropped by an early probe (none, as a rule) close on their own.
    wait_for("one session per member", Duration::from_secs(10), || {
        workload.open_port_forwards() == 3
    })
    .await;
    let opened = workload.port_forwards_total();

    let mut took = Vec::new();
    for _ in 0..20 {
        let p = prober.probe(&endpoints, DEADLINE).await.expect("probe");
        assert_eq!(healthy(&p.members), 3, "{}", show(&Ok(p.members.clone())));
        took.push(p.took);
    }
    assert_eq!(
        workload.port_forwards_total(),
        opened,
        "20 probes opened no port-forward session: they reuse the kept ones"
    );
    assert_eq!(workload.open_port_forwards(), 3);
    took.sort();
    println!(
        "20 probes on kept port-forwards: median {:?}, slowest {:?}",
        took[took.len() / 2],
        took[19]
    );
}

/// Issue 39: a kept port-forward does not make a stale answer look fresh. Across a WAN (a relay
/// adding 50 ms to every round trip between quorumguard and the workload API server), with every
/// member's session open and warm: a follower frozen (SIGSTOP) is unhealthy, not answering within
/// the deadline, and one killed is unhealthy; each probe ends within the deadline and the other
/// members stay healthy over their kept sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_port_forward_to_a_frozen_or_killed_member_reads_unhealthy_in_time() {
    let mut etcd = EtcdCluster::start(3);
    let workload = workload_for(&etcd).await;
    let relay = testkit::wan::DelayRelay::start(workload.addr(), Duration::from_millis(50))
        .await
        .expect("relay");
    let (prober, endpoints) = port_forward_prober(&etcd, &workload, &relay.url()).await;
    let warm = probe_until_healthy(&prober, &endpoints, 3).await;
    let followers: Vec<usize> = warm
        .members
        .iter()
        .filter(|m| !m.is_leader)
        .map(|m| etcd.index_of(&m.name))
        .collect();
    assert_eq!(followers.len(), 2, "{}", show(&Ok(warm.members.clone())));
    wait_for("one session per member", Duration::from_secs(10), || {
        workload.open_port_forwards() == 3
    })
    .await;

    let (frozen, killed) = (followers[0], followers[1]);
    let frozen_name = etcd.name(frozen).to_string();
    etcd.freeze(frozen);
    let p = prober.probe(&endpoints, DEADLINE).await;
    etcd.thaw(frozen);
    let why = unhealthy_in_time(p, &frozen_name, "frozen");
    assert!(why.contains("no answer within 2s"), "{why}");

    probe_until_healthy(&prober, &endpoints, 3).await;
    let killed_name = etcd.name(killed).to_string();
    etcd.kill(killed);
    unhealthy_in_time(
        prober.probe(&endpoints, DEADLINE).await,
        &killed_name,
        "killed",
    );
}

/// Checks that probe `p` ended within the deadline with member `name` (`what`: frozen, killed)
/// unhealthy and the 2 others healthy; returns why `name` is unhealthy.
fn unhealthy_in_time(
    p: Result<quorumguard_observe::etcd::Probe, quorumguard_observe::etcd::ProbeError>,
    name: &str,
    what: &str,
) -> String {
    let p = p.unwrap_or_else(|e| panic!("no member list with {name} {what}: {e}"));
    assert!(
        p.took < DEADLINE + MARGIN,
        "the probe took {:?} with {name} {what}",
        p.took
    );
    let m = p.members.iter().find(|m| m.name == name).expect("member");
    let Health::Unhealthy(why) = &m.health else {
        panic!(
            "{name} {what} behind a kept port-forward, yet {:?}",
            m.health
        );
    };
    assert_eq!(healthy(&p.members), 2, "{}", show(&Ok(p.members.clone())));
    println!("{name} {what}: probe took {:?}: {why}", p.took);
    why.clone()
}

/// Issue 39: fresh probes for admission reviews go through the sweep's kept probers, so through
/// the port-forward sessions the sweep opened: ten reviews' probes open none, and each asks etcd
/// (ten probes made, every member healthy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_probes_reuse_the_sweeps_port_forwards() {
    use quorumguard_observe::etcd::fresh::{Fresh, FreshProbes};
    let etcd = EtcdCluster::start(3);
    let (mgmt, workload, state, _watches) = unannotated_cluster(&etcd).await;
    let cfg = config(TransportKind::PortForward);
    let probers = Arc::new(Probers::default());
    sweep_until_healthy(&mgmt, &state, &cfg, &probers, &[NS], 3).await;
    let fresh = Arc::new(FreshProbes::new(
        mgmt.client().expect("client"),
        state.clone(),
        probers.clone(),
        &cfg,
        &quorumguard_telemetry::Metrics::new(),
    ));
    let target = state.probe_targets().remove(0);
    let opened = workload.port_forwards_total();
    for _ in 0..10 {
        match fresh.probe(target.clone(), Instant::now()).await {
            Fresh::Members(m) => assert_eq!(healthy(&m), 3, "{}", show(&Ok(m.clone()))),
            other => panic!("a fresh probe through the kept port-forwards: {other:?}"),
        }
    }
    assert_eq!(
        fresh.probes_made("ok"),
        10,
        "every review's probe asked etcd"
    );
    assert_eq!(
        workload.port_forwards_total(),
        opened,
        "fresh probes opened no port-forward session"
    );
}
