//! The etcd prober against a REAL etcd cluster on 127.0.0.1 with TLS (crates/testkit/src/etcd.rs;
//! 3.4.23 by default, 3.5.1 in CI's second pass: every test here passes on both;
//! `quorum_lost_shows_each_members_version_and_what_each_member_list_does` tells them apart): healthy, a frozen member, a killed member, a
//! removed member, learners, quorum loss, and client certificates accepted and refused.
//!
//! Clusters run one at a time (the support's slot), so the file takes the sum of its tests:
//! each starts 3 members in about a second, and membership changes wait for etcd's 5 s
//! peer-connectivity check.

use std::time::{Duration, Instant, SystemTime};

use quorumguard_engine::model::{
    Alarm, Cluster, ControlPlane, DEFAULT_KCP_CONTROLLER, EtcdSnapshot, EtcdState, EtcdTopology,
    Health, HealthCheck, HealthChecks, Kcp, Machine, Member, Policy, Requester,
};
use quorumguard_engine::quorum::Tally;
use quorumguard_engine::{ActionCode, Operation, Reason, decide, next_action};
use quorumguard_observe::etcd::certs::sign_client_cert;
use quorumguard_observe::etcd::{ClientTls, Probe, ProbeError, Prober, probe};
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair};
use testkit::etcd::EtcdCluster;

/// The deadline of the probes here, and what a probe may take beyond it (scheduling on a busy
/// 2-core machine; a bound, not a benchmark).
const DEADLINE: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_millis(500);
/// How long a test waits for etcd to settle after a fault (an election, a step-down).
const SETTLE: Duration = Duration::from_secs(10);

/// Probes once and checks the probe ended within the deadline plus the margin.
fn probe_once(rt: &tokio::runtime::Runtime, prober: &Prober, endpoints: &[String]) -> Probe {
    let started = Instant::now();
    let result = rt.block_on(prober.probe(endpoints, DEADLINE));
    let took = started.elapsed();
    assert!(
        took < DEADLINE + MARGIN,
        "the probe took {took:?}, more than {DEADLINE:?} + {MARGIN:?}: {result:?}"
    );
    match result {
        Ok(p) => p,
        Err(e) => panic!("probe failed: {e}"),
    }
}

/// Probes until `done` holds (bounded by [`SETTLE`]); returns the last probe.
fn probe_until(
    rt: &tokio::runtime::Runtime,
    prober: &Prober,
    endpoints: &[String],
    what: &str,
    done: impl Fn(&Probe) -> bool,
) -> Probe {
    let started = Instant::now();
    loop {
        let p = probe_once(rt, prober, endpoints);
        if done(&p) {
            return p;
        }
        assert!(
            started.elapsed() < SETTLE,
            "not {what} within {SETTLE:?}: {}",
            show(&p)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn member<'a>(p: &'a Probe, name: &str) -> &'a Member {
    p.members
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no member {name:?} in {}", show(p)))
}

fn all_healthy(p: &Probe, names: &[&str]) -> bool {
    names.iter().all(|n| member(p, n).health == Health::Healthy)
        && p.members.iter().filter(|m| m.is_leader).count() == 1
}

fn unhealthy_text(m: &Member) -> &str {
    match &m.health {
        Health::Unhealthy(text) => text,
        other => panic!("{} should be unhealthy, is {other:?}", m.display_name()),
    }
}

fn show(p: &Probe) -> String {
    let mut s = format!(
        "took {:?}, member list from {}, warnings {:?}\n",
        p.took, p.member_list_from, p.warnings
    );
    for m in &p.members {
        s.push_str(&format!(
            "  {} {:>16} learner={} leader={} {:?} v={:?} term={:?} index={:?} alarms={:?}\n",
            m.display_name(),
            m.id.to_string(),
            m.is_learner,
            m.is_leader,
            m.health,
            m.version,
            m.raft_term,
            m.raft_index,
            m.alarms
        ));
    }
    s
}

/// A healthy probe of `cluster`, and the index of a member that is not the leader (faults are
/// injected into a follower so that no election muddles the result).
fn healthy_follower(
    rt: &tokio::runtime::Runtime,
    prober: &Prober,
    cluster: &EtcdCluster,
) -> (Probe, usize) {
    let names: Vec<String> = (0..cluster.len())
        .map(|i| cluster.name(i).to_string())
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let p = probe_until(rt, prober, &cluster.endpoints(), "all healthy", |p| {
        all_healthy(p, &names)
    });
    let follower = p
        .members
        .iter()
        .find(|m| !m.is_leader)
        .map(|m| cluster.index_of(&m.name))
        .expect("a follower");
    (p, follower)
}

#[test]
fn healthy_cluster_lists_every_member_with_one_leader() {
    let mut cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    let endpoints = cluster.endpoints();
    let (p, _) = healthy_follower(&rt, &prober, &cluster);
    eprintln!("{}", show(&p));

    let mut names: Vec<&str> = p.members.iter().map(|m| m.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["m1", "m2", "m3"]);
    let mut expected: Vec<(u64, String)> = cluster
        .member_list()
        .into_iter()
        .map(|(id, name, _)| (id, name))
        .collect();
    expected.sort();
    let mut got: Vec<(u64, String)> = p.members.iter().map(|m| (m.id.0, m.name.clone())).collect();
    got.sort();
    assert_eq!(got, expected, "IDs as etcdctl lists them");
    assert_eq!(p.members.iter().filter(|m| m.is_leader).count(), 1);
    for m in &p.members {
        assert_eq!(m.health, Health::Healthy, "{}", show(&p));
        assert!(!m.is_learner);
        assert_eq!(
            m.version.as_deref(),
            Some(testkit::etcd::version()),
            "{m:?}"
        );
        assert!(m.raft_index.is_some_and(|i| i > 0), "{m:?}");
        // etcd 3.4 and 3.5 both report what they applied.
        assert!(m.raft_applied_index.is_some_and(|a| a > 0), "{m:?}");
        assert!(m.raft_term.is_some_and(|t| t > 0), "{m:?}");
        assert!(m.db_size.is_some_and(|s| s > 0), "{m:?}");
        assert_eq!(
            m.client_urls,
            [cluster.client_url(cluster.index_of(&m.name))]
        );
        assert_eq!(m.peer_urls.len(), 1);
        assert!(m.alarms.is_empty());
    }
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert!(endpoints.contains(&p.member_list_from));

    // Clients are kept between probes, one per endpoint, and reused.
    assert_eq!(prober.cached_endpoints(), {
        let mut e = endpoints.clone();
        e.sort();
        e
    });
    let again = probe_once(&rt, &prober, &endpoints);
    assert!(all_healthy(&again, &["m1", "m2", "m3"]), "{}", show(&again));
    assert_eq!(prober.cached_endpoints().len(), 3);

    // The one-shot function works too.
    let once = rt
        .block_on(probe(&endpoints, &cluster.client_tls(), DEADLINE))
        .expect("probe");
    assert_eq!(once.members.len(), 3);
}

#[test]
fn frozen_member_is_unhealthy_and_the_probe_keeps_its_deadline() {
    let mut cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    let (_, frozen) = healthy_follower(&rt, &prober, &cluster);
    let frozen_name = cluster.name(frozen).to_string();
    let others: Vec<String> = (0..3)
        .filter(|&i| i != frozen)
        .map(|i| cluster.name(i).to_string())
        .collect();
    // The frozen member first: it must not hold up the member list either.
    let mut endpoints = vec![cluster.client_url(frozen)];
    endpoints.extend(
        (0..3)
            .filter(|&i| i != frozen)
            .map(|i| cluster.client_url(i)),
    );

    cluster.freeze(frozen);
    // First with the client cached from before the freeze (a connection that now hangs), then
    // with a new one (the TLS handshake hangs): both end by the deadline.
    for round in ["cached client", "new client"] {
        let p = probe_once(&rt, &prober, &endpoints);
        eprintln!("{round}: {}", show(&p));
        let m = member(&p, &frozen_name);
        let text = unhealthy_text(m);
        assert!(text.contains("no answer within 1s"), "{round}: {text}");
        assert!(!m.is_leader);
        for name in &others {
            assert_eq!(
                member(&p, name).health,
                Health::Healthy,
                "{round}: {}",
                show(&p)
            );
        }
        assert_ne!(p.member_list_from, cluster.client_url(frozen));
    }

    // All frozen: no member list. Endpoints are asked in turn, each after a head start of an
    // eighth of the deadline, and the search ends at half the deadline, naming every endpoint.
    for i in (0..3).filter(|&i| i != frozen) {
        cluster.freeze(i);
    }
    let started = Instant::now();
    let err = rt
        .block_on(prober.probe(&endpoints, DEADLINE))
        .expect_err("nobody answers");
    eprintln!("all frozen: {err}");
    assert!(
        started.elapsed() < DEADLINE / 2 + MARGIN,
        "{:?}",
        started.elapsed()
    );
    let ProbeError::MemberList { attempts } = &err else {
        panic!("{err}")
    };
    assert_eq!(attempts.len(), 3);
    for a in attempts {
        assert_eq!(a.error, "no answer within 500ms", "{a}");
    }

    for i in 0..3 {
        cluster.thaw(i);
    }
    let p = probe_until(&rt, &prober, &endpoints, "healthy after thaw", |p| {
        all_healthy(p, &["m1", "m2", "m3"])
    });
    assert_eq!(p.members.len(), 3);
}

#[test]
fn killed_member_is_unhealthy_with_the_connection_error() {
    let mut cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    let (_, killed) = healthy_follower(&rt, &prober, &cluster);
    let killed_name = cluster.name(killed).to_string();
    let mut endpoints = vec![cluster.client_url(killed)];
    endpoints.extend(
        (0..3)
            .filter(|&i| i != killed)
            .map(|i| cluster.client_url(i)),
    );

    cluster.kill(killed);
    let p = probe_once(&rt, &prober, &endpoints);
    eprintln!("{}", show(&p));
    let text = unhealthy_text(member(&p, &killed_name)).to_string();
    assert!(
        text.contains("Connection refused") || text.contains("connect"),
        "the connection error: {text}"
    );
    assert_eq!(p.members.len(), 3, "a dead member is still a member");
    for i in (0..3).filter(|&i| i != killed) {
        assert_eq!(
            member(&p, cluster.name(i)).health,
            Health::Healthy,
            "{}",
            show(&p)
        );
    }
    // The dead endpoint was asked first for the member list; the next one answered at once.
    assert_eq!(p.member_list_from, endpoints[1]);
    assert!(
        p.warnings
            .iter()
            .any(|w| w.starts_with(&format!("member list: {}: ", endpoints[0]))),
        "{:?}",
        p.warnings
    );
    assert!(
        p.took < DEADLINE / 2,
        "a refused connection fails fast: {:?}",
        p.took
    );
}

/// A kept connection to a member that restarted has been closed by etcd: the prober notices
/// that before using it and dials again, so the first probe after the restart already sees the
/// member healthy (no failed call, no warning).
#[test]
fn a_restarted_member_is_redialled_without_a_failed_probe() {
    let mut cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    let (_, restarted) = healthy_follower(&rt, &prober, &cluster);
    assert_eq!(
        prober.cached_endpoints().len(),
        3,
        "one client kept per member"
    );

    cluster.kill(restarted);
    cluster.start_member(restarted);
    cluster.wait_healthy((0..3).collect());
    let endpoints = cluster.endpoints();
    let p = probe_once(&rt, &prober, &endpoints);
    eprintln!("{}", show(&p));
    let names: Vec<&str> = (0..3).map(|i| cluster.name(i)).collect();
    assert!(all_healthy(&p, &names), "{}", show(&p));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    assert_eq!(prober.cached_endpoints().len(), 3);
}

#[test]
fn removed_member_is_gone_from_the_list() {
    let mut cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    let (_, removed) = healthy_follower(&rt, &prober, &cluster);
    let removed_name = cluster.name(removed).to_string();
    let endpoints = cluster.endpoints();

    assert!(
        cluster.remove_member(removed),
        "a removed member's process exits by itself"
    );
    let rest: Vec<String> = (0..3)
        .filter(|&i| i != removed)
        .map(|i| cluster.name(i).to_string())
        .collect();
    let p = probe_until(&rt, &prober, &endpoints, "two healthy members", |p| {
        p.members.len() == 2 && all_healthy(p, &[&rest[0], &rest[1]])
    });
    eprintln!("{}", show(&p));
    assert!(p.members.iter().all(|m| m.name != removed_name));
    // The removed member's endpoint is still passed; it cannot answer, another one did.
    assert_ne!(p.member_list_from, cluster.client_url(removed));

    // Once the caller stops passing the removed member's endpoint, its client is dropped.
    let removed_url = cluster.client_url(removed);
    let rest_endpoints: Vec<String> = endpoints
        .into_iter()
        .filter(|e| *e != removed_url)
        .collect();
    probe_once(&rt, &prober, &rest_endpoints);
    let mut expected = rest_endpoints.clone();
    expected.sort();
    assert_eq!(prober.cached_endpoints(), expected);
}

#[test]
fn learners_unstarted_and_started() {
    let mut cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    healthy_follower(&rt, &prober, &cluster);

    // Added, not started: no name, no client URLs; it stays in the list with unknown health.
    let learner = cluster.add_learner("m4");
    let p = probe_once(&rt, &prober, &cluster.endpoints()[..3]);
    eprintln!("unstarted: {}", show(&p));
    assert_eq!(p.members.len(), 4);
    let unstarted = p
        .members
        .iter()
        .find(|m| m.is_unstarted())
        .expect("an unstarted member");
    assert_eq!(unstarted.name, "");
    assert!(unstarted.client_urls.is_empty());
    assert!(unstarted.is_learner);
    assert_eq!(unstarted.health, Health::Unknown);
    assert!(matches!(unstarted.effective_health(), Health::Unhealthy(_)));
    assert!(all_healthy(&p, &["m1", "m2", "m3"]), "{}", show(&p));
    let unstarted_id = unstarted.id;

    // Started: a learner with a name; judged by its status (it refuses linearizable reads) and
    // it refuses the member list, so the next endpoint answers it.
    cluster.start_member(learner);
    let mut endpoints = vec![cluster.client_url(learner)];
    endpoints.extend(cluster.endpoints()[..3].iter().cloned());
    let p = probe_until(&rt, &prober, &endpoints, "the learner healthy", |p| {
        p.members
            .iter()
            .any(|m| m.name == "m4" && m.health == Health::Healthy)
    });
    eprintln!("started: {}", show(&p));
    let m4 = member(&p, "m4");
    assert_eq!(m4.id, unstarted_id);
    assert!(m4.is_learner);
    assert!(!m4.is_leader);
    assert_eq!(m4.client_urls, [cluster.client_url(learner)]);
    assert_eq!(m4.version.as_deref(), Some(testkit::etcd::version()));
    assert!(all_healthy(&p, &["m1", "m2", "m3"]), "{}", show(&p));
    assert_ne!(p.member_list_from, cluster.client_url(learner));
    let refused = format!("member list: {}: ", cluster.client_url(learner));
    let warning = p
        .warnings
        .iter()
        .find(|w| w.starts_with(&refused))
        .unwrap_or_else(|| panic!("the learner's refusal in {:?}", p.warnings));
    assert!(
        warning.contains("rpc not supported for learner"),
        "{warning}"
    );
}

/// Kills every member of a 3-member `cluster` but `survivor` and probes until the survivor's
/// status says "etcdserver: no leader": that probe, the endpoints, the survivor's name.
fn lose_quorum(
    rt: &tokio::runtime::Runtime,
    prober: &Prober,
    cluster: &mut EtcdCluster,
    survivor: usize,
) -> (Probe, Vec<String>, String) {
    let endpoints = cluster.endpoints();
    for i in (0..3).filter(|&i| i != survivor) {
        cluster.kill(i);
    }
    let name = cluster.name(survivor).to_string();
    let p = probe_until(
        rt,
        prober,
        &endpoints,
        "the survivor without leader",
        |p| matches!(&member(p, &name).health, Health::Unhealthy(t) if t.contains("no leader")),
    );
    (p, endpoints, name)
}

/// What etcd 3.4.23 and 3.5.1 really do with 2 of 3 members killed: the survivor still answers
/// the prober's member list (served locally, without quorum: etcd-client asks with
/// `linearizable: false`; on 3.5 etcdctl's own member list asks a linearizable one and fails,
/// where 3.4 answered it) and its status, with
/// `errors: ["etcdserver: no leader"]` once its election timeout has passed (until then it still
/// names the dead leader, and only its hanging read shows the trouble); its linearizable read
/// and the alarm list (which goes through raft) hang. So the probe succeeds, lists all three
/// members, and marks every one of them unhealthy — quickly, because neither hanging call is
/// waited for once the status has spoken.
#[test]
fn quorum_lost_on_etcd_3_4_lists_members_and_marks_the_survivor_unhealthy() {
    let mut cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    let (_, survivor) = healthy_follower(&rt, &prober, &cluster);
    // etcd still serves the prober's member list without quorum; the survivor's status says
    // "etcdserver: no leader" once its election timeout has passed.
    let (p, endpoints, survivor_name) = lose_quorum(&rt, &prober, &mut cluster, survivor);
    eprintln!("{}", show(&p));
    assert_eq!(p.members.len(), 3);
    assert!(
        p.members
            .iter()
            .all(|m| matches!(m.health, Health::Unhealthy(_)))
    );
    assert_eq!(
        unhealthy_text(member(&p, &survivor_name)),
        "etcdserver: no leader"
    );
    assert!(p.members.iter().all(|m| !m.is_leader));
    assert_eq!(p.member_list_from, cluster.client_url(survivor));
    // etcdctl's member list follows the version: 3.5's asks through raft (linearizable) and
    // times out without quorum; 3.4's is served by the member it asks.
    let by_etcdctl = cluster.etcdctl(&[cluster.client_url(survivor)], &["member", "list"]);
    match testkit::etcd::minor_version() {
        (3, 4) => assert!(
            by_etcdctl
                .as_ref()
                .is_ok_and(|out| out.lines().count() == 3),
            "etcd 3.4's etcdctl lists all three without quorum: {by_etcdctl:?}"
        ),
        _ => assert!(
            by_etcdctl
                .as_ref()
                .is_err_and(|e| e.contains("deadline exceeded")),
            "etcd {}'s etcdctl member list needs quorum: {by_etcdctl:?}",
            testkit::etcd::version()
        ),
    }
    // The status answers at once; the hanging read and alarm list are not waited for.
    assert!(p.took < DEADLINE / 2, "took {:?}", p.took);
    assert!(
        p.warnings
            .iter()
            .any(|w| w.contains("alarm list") && w.contains("no member has a leader")),
        "{:?}",
        p.warnings
    );

    // All down: no member list, and the error names every endpoint and its error.
    cluster.kill(survivor);
    let started = Instant::now();
    let err = rt
        .block_on(prober.probe(&endpoints, DEADLINE))
        .expect_err("nobody answers");
    eprintln!("all down: {err}");
    assert!(
        started.elapsed() < DEADLINE / 2,
        "refused connections fail fast"
    );
    let ProbeError::MemberList { attempts } = &err else {
        panic!("{err}")
    };
    let named: Vec<&str> = attempts.iter().map(|a| a.endpoint.as_str()).collect();
    assert_eq!(
        named,
        endpoints.iter().map(String::as_str).collect::<Vec<_>>()
    );
    for a in attempts {
        assert!(a.error.contains("Connection refused"), "{a}");
    }
}

#[test]
fn nospace_alarm_attaches_to_the_member_it_names() {
    // A 1 MiB backend quota fills after a few puts (written with etcdctl, never by the prober).
    let mut cluster = EtcdCluster::start_with_flags(3, &["--quota-backend-bytes=1048576"]);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    let endpoints = cluster.endpoints();
    healthy_follower(&rt, &prober, &cluster);
    let blob = "x".repeat(100_000);
    let mut refused = false;
    for i in 0..40 {
        if let Err(e) = cluster.etcdctl(&endpoints[..1], &["put", &format!("/blob/{i}"), &blob]) {
            assert!(e.contains("database space exceeded"), "{e}");
            refused = true;
            break;
        }
    }
    assert!(refused, "the quota was never reached");
    let listed = cluster.member_list();
    let p = probe_until(&rt, &prober, &endpoints, "a NOSPACE alarm", |p| {
        p.members.iter().any(|m| m.alarms.contains(&Alarm::NoSpace))
    });
    eprintln!("{}", show(&p));
    let alarmed: Vec<&Member> = p.members.iter().filter(|m| !m.alarms.is_empty()).collect();
    assert!(!alarmed.is_empty());
    for m in &alarmed {
        assert_eq!(m.alarms, [Alarm::NoSpace]);
        assert!(listed.iter().any(|(id, _, _)| *id == m.id.0));
        // NOSPACE stops writes, not raft: the member stays healthy for the quorum rules
        // (docs/rules.md, what NOSPACE does).
        assert_eq!(m.effective_health(), Health::Healthy);
    }
    // Every member repeats the alarm in its status errors; that does not make it unhealthy.
    for m in p.members.iter().filter(|m| m.alarms.is_empty()) {
        assert_eq!(m.health, Health::Healthy, "{}", show(&p));
    }
    assert_eq!(p.members.iter().filter(|m| m.is_leader).count(), 1);
}

/// What etcd answers to a write while a NOSPACE alarm stands (3.4 and 3.5 alike).
const NOSPACE_ERROR: &str = "etcdserver: mvcc: database space exceeded";

/// The engine's control plane for a probe: one KCP Machine per member, named after it (as
/// kubeadm names members after nodes), created an hour ago, the probe taken just now.
fn control_plane_of(p: &Probe, now_unix: i64) -> ControlPlane {
    let mut cp = ControlPlane {
        cluster: Cluster {
            name: "c1".into(),
            deleting: false,
            paused: false,
        },
        kcp: Kcp {
            name: "kcp".into(),
            namespace: "ns".into(),
            replicas: p.members.len() as u32,
            etcd: EtcdTopology::Stacked,
            max_surge: 1,
            deleting: false,
            version: Some("v1.32.0".into()),
            etcd_learner_mode: None,
            paused: false,
        },
        machines: p
            .members
            .iter()
            .map(|m| Machine {
                created_unix: Some(now_unix - 3600),
                ..Machine::new(m.name.clone())
            })
            .collect(),
        etcd: EtcdState::Observed(EtcdSnapshot {
            members: p.members.clone(),
            age: Some(Duration::ZERO),
        }),
        health_checks: HealthChecks::Known(Vec::new()),
    };
    // A MachineHealthCheck covers the control plane, so that a remediation can happen.
    cp.health_checks = HealthChecks::Known(vec![HealthCheck::covering("kcp-mhc", &cp.machines)]);
    cp
}

/// etcdctl's `endpoint status -w json` of one endpoint: its status.
fn status_json(cluster: &EtcdCluster, endpoint: &str) -> serde_json::Value {
    let out = cluster
        .etcdctl(
            &[endpoint.to_string()],
            &["endpoint", "status", "-w", "json"],
        )
        .unwrap_or_else(|e| panic!("endpoint status of {endpoint}: {e}"));
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    v[0]["Status"].clone()
}

/// The facts docs/rules.md ("What NOSPACE does") rests on, on real etcd: a NOSPACE alarm on
/// every member refuses writes, and nothing else. Reads, the leader and membership changes
/// work; quorumguard's probe sees every member answer, the alarm on each, and the engine says
/// `FreeSpace`, never lost quorum; compacting, defragmenting and disarming clears it.
///
/// The tally and the deletion's reason below need the engine to count NOSPACE as a write stop,
/// not as an unhealthy member (issue 36, item 8); the rest holds on etcd as it is.
#[test]
fn nospace_keeps_quorum_and_membership() {
    let started = Instant::now();
    // A 1 MiB backend quota fills after about ten 100 kB puts.
    let mut cluster = EtcdCluster::start_with_flags(3, &["--quota-backend-bytes=1048576"]);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    let endpoints = cluster.endpoints();
    let (_, follower) = healthy_follower(&rt, &prober, &cluster);

    // Fill through one member until etcd refuses; then a write through each member, which each
    // refuses (over its own quota, raising its own alarm, or under the alarm already raised:
    // which of the two depends on each member's backend size then, so the alarm is on one to
    // three members).
    let blob = "x".repeat(100_000);
    let mut refused = None;
    // Blobs /blob/0 .. /blob/{written - 1} were written. How many fit depends on how the
    // backend grew (a loaded machine commits each put on its own, and fills sooner).
    let mut written = 0u32;
    for i in 0..40 {
        if let Err(e) = cluster.etcdctl(&endpoints[..1], &["put", &format!("/blob/{i}"), &blob]) {
            refused = Some(e);
            break;
        }
        written = i + 1;
    }
    let refused = refused.expect("the quota was never reached");
    assert!(
        written >= 2,
        "NOSPACE after {written} blobs of 100 kB under a 1 MiB quota"
    );
    assert!(refused.contains(NOSPACE_ERROR), "{refused}");
    let more = "y".repeat(120_000);
    for ep in &endpoints {
        let e = cluster
            .etcdctl(std::slice::from_ref(ep), &["put", "/more", &more])
            .expect_err("a write under NOSPACE");
        assert!(e.contains(NOSPACE_ERROR), "{ep}: {e}");
    }
    let p = probe_until(&rt, &prober, &endpoints, "a NOSPACE alarm", |p| {
        p.members.iter().any(|m| m.alarms.contains(&Alarm::NoSpace))
    });
    eprintln!("{}", show(&p));

    // The probe: every member answers (status and a linearizable read), one leader, the
    // members that raised the alarm carry it, and no other alarm.
    assert_eq!(p.members.len(), 3);
    for m in &p.members {
        assert_eq!(m.health, Health::Healthy, "{}", show(&p));
        assert!(
            m.alarms.iter().all(|a| *a == Alarm::NoSpace),
            "{}",
            show(&p)
        );
    }
    assert_eq!(p.members.iter().filter(|m| m.is_leader).count(), 1);

    // etcd itself: writes refused everywhere, reads answered everywhere, linearizable (through
    // the leader: quorum) and serializable; a delete is allowed.
    for ep in &endpoints {
        let one = std::slice::from_ref(ep);
        let e = cluster
            .etcdctl(one, &["put", "/small", "v"])
            .expect_err("a small write under NOSPACE");
        assert!(e.contains(NOSPACE_ERROR), "{ep}: {e}");
        for consistency in ["l", "s"] {
            let c = format!("--consistency={consistency}");
            let got = cluster
                .etcdctl(one, &["get", "/blob/0", "--keys-only", &c])
                .unwrap_or_else(|e| panic!("{c} read from {ep} under NOSPACE: {e}"));
            assert_eq!(got.trim(), "/blob/0", "{ep} {c}");
        }
    }
    // Deleting is allowed: [/blob/1, /blob/9) is every blob but /blob/0 and /blob/9 (the space
    // FreeSpace will reclaim below), /blob/9x too.
    let deleted = cluster
        .etcdctl(&endpoints[..1], &["del", "/blob/1", "/blob/9"])
        .expect("a delete under NOSPACE");
    // Every blob written in [/blob/1, /blob/9), and perhaps the one whose put was refused: etcd
    // applies the put that crosses the quota and answers it with NOSPACE (quotaApplierV3.Put,
    // etcdserver/apply.go); only a put refused before it is proposed (the server's own check of
    // the quota) is not written. Seen: 7 written, 7 deleted, /blob/7 among them; 10 written, 9
    // deleted (/blob/1 .. /blob/8 and the refused /blob/10).
    // The range is of keys, compared as bytes: /blob/10 .. /blob/19 are in it too.
    let in_range = |i: u32| {
        let key = format!("/blob/{i}");
        key.as_str() >= "/blob/1" && key.as_str() < "/blob/9"
    };
    let written_in_range =
        u32::try_from((0..written).filter(|&i| in_range(i)).count()).expect("fewer than 40 blobs");
    let refused_in_range = u32::from(in_range(written));
    let n = deleted.trim().parse::<u32>().ok();
    assert!(
        n.is_some_and(|n| n >= written_in_range && n <= written_in_range + refused_in_range),
        "deleted {deleted} of the {written} blobs written (and /blob/{written}, refused)"
    );

    // The engine on that probe: free space; a quorum, not a lost one.
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let cp = control_plane_of(&p, now);
    let policy = Policy::default();
    let next = next_action(&cp, &policy, now);
    assert_eq!(next.code, ActionCode::FreeSpace, "{}", next.message);
    assert!(!next.message.contains("snapshot"), "{}", next.message);
    let tally = Tally::of(&p.members, false);
    assert!(
        !tally.quorum_lost(),
        "NOSPACE on every member is not quorum loss: {tally:?}"
    );
    let machine = cp
        .machine(cluster.name(follower))
        .expect("the follower's Machine")
        .clone();
    let verdict = decide(
        &cp,
        &Operation::DeleteMachine(machine),
        &Requester::new(DEFAULT_KCP_CONTROLLER),
        &policy,
        now,
    );
    assert_ne!(verdict.reason, Reason::QuorumLost, "{}", verdict.message);
    assert!(
        !verdict.message.contains("from a snapshot"),
        "{}",
        verdict.message
    );

    // Membership under NOSPACE: a follower leaves (what KCP's pre-terminate hook does)...
    let alarmed = cluster.member_id(follower);
    cluster
        .remove_and_stop(follower)
        .unwrap_or_else(|e| panic!("member remove under NOSPACE: {e}"));
    let listed = cluster.member_list();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(!listed.iter().any(|(id, _, _)| *id == alarmed));
    let rest: Vec<String> = endpoints
        .iter()
        .filter(|e| **e != endpoints[follower])
        .cloned()
        .collect();
    // ...and its alarm stays: etcd keeps refusing writes until it is disarmed.
    let alarms = cluster
        .etcdctl(&rest, &["alarm", "list"])
        .expect("alarm list");
    assert!(
        alarms.contains(&format!("memberID:{alarmed} alarm:NOSPACE")),
        "{alarms}"
    );
    // ...a learner joins (kubeadm's join), syncs and is promoted.
    let learner = cluster.add_learner("m4");
    cluster.start_member(learner);
    let learner_ep = cluster.client_url(learner);
    let status = status_json(&cluster, &learner_ep);
    assert_eq!(status["isLearner"], true, "{status}");
    let errors = status["errors"].to_string();
    assert!(errors.contains("alarm:NOSPACE"), "{status}");
    let got = cluster
        .etcdctl(
            std::slice::from_ref(&learner_ep),
            &["get", "/blob/0", "--keys-only", "--consistency=s"],
        )
        .expect("a serializable read from the learner");
    assert_eq!(got.trim(), "/blob/0", "the learner has the data");
    cluster
        .promote(learner)
        .unwrap_or_else(|e| panic!("member promote under NOSPACE: {e}"));
    let listed = cluster.member_list();
    assert_eq!(
        listed.iter().filter(|(_, _, learner)| !learner).count(),
        3,
        "{listed:?}"
    );
    let live: Vec<String> = rest.iter().cloned().chain([learner_ep]).collect();
    let p = probe_until(&rt, &prober, &live, "3 voting members, one leader", |p| {
        p.members.len() == 3
            && p.members
                .iter()
                .all(|m| m.health == Health::Healthy && !m.is_learner)
            && p.members.iter().filter(|m| m.is_leader).count() == 1
    });
    eprintln!("{}", show(&p));

    // FreeSpace, as the guard prints it: compact at the current revision, defragment every
    // member, disarm. Then writes work.
    let revision = status_json(&cluster, &live[0])["header"]["revision"]
        .as_u64()
        .expect("a revision");
    let rev = revision.to_string();
    cluster
        .etcdctl(&live[..1], &["compact", &rev])
        .expect("compact under NOSPACE");
    cluster
        .etcdctl(&live[..1], &["defrag", "--cluster"])
        .expect("defrag --cluster under NOSPACE");
    let e = cluster
        .etcdctl(&live[..1], &["put", "/small", "v"])
        .expect_err("still refused before the disarm");
    assert!(e.contains(NOSPACE_ERROR), "{e}");
    cluster
        .etcdctl(&live[..1], &["alarm", "disarm"])
        .expect("alarm disarm");
    let alarms = cluster
        .etcdctl(&live, &["alarm", "list"])
        .expect("alarm list");
    assert_eq!(alarms.trim(), "", "every alarm disarmed");
    cluster
        .etcdctl(&live, &["put", "/small", "v"])
        .expect("a write once space is freed and the alarm disarmed");
    eprintln!("took {:?}", started.elapsed());
}

#[test]
fn client_certificates_from_the_cluster_ca_are_accepted_and_others_refused() {
    let cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let endpoints = cluster.endpoints();

    // Signed by quorumguard with the cluster's CA (RSA PKCS#1, like Cluster API's): accepted.
    let ok = Prober::new(cluster.client_tls());
    let p = probe_once(&rt, &ok, &endpoints);
    assert_eq!(p.members.len(), 3);

    // A client certificate from another CA: etcd refuses the handshake.
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "etcd-ca");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let other_ca = params.self_signed(&key).expect("another CA").pem();
    let other = sign_client_cert(
        &other_ca,
        &key.serialize_pem(),
        "quorumguard",
        SystemTime::now(),
    )
    .expect("sign with the other CA");
    let tls = ClientTls::new(&cluster.pki.ca_cert_pem, other.cert_pem, other.key_pem)
        .expect("TLS material");
    let refused = Prober::new(tls);
    // TLS 1.3: etcd checks the client certificate after the handshake has completed on the
    // client's side, so its alert races the first request: about half the attempts report the
    // alert, the others only the connection closing (closed, broken pipe) with a hint. A few
    // probes (milliseconds each) show the alert.
    let mut errors = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let err = rt
            .block_on(refused.probe(&endpoints, DEADLINE))
            .expect_err("refused");
        assert!(started.elapsed() < DEADLINE + MARGIN);
        eprintln!("foreign client certificate: {err}");
        let ProbeError::MemberList { attempts } = &err else {
            panic!("{err}")
        };
        assert_eq!(attempts.len(), 3, "every endpoint is named: {err}");
        for a in attempts {
            assert!(endpoints.contains(&a.endpoint), "{a}");
            assert!(
                a.error.contains("received fatal alert: BadCertificate")
                    || a.error
                        .contains("is the client certificate signed by its CA?"),
                "{a}"
            );
        }
        errors.push(err.to_string());
        if errors.last().is_some_and(|e| e.contains("BadCertificate")) {
            break;
        }
    }
    assert!(
        errors
            .iter()
            .any(|e| e.contains("received fatal alert: BadCertificate")),
        "names the TLS problem: {errors:?}"
    );

    // Our certificate, but trusting another CA for etcd's serving certificate: we refuse etcd.
    let ours = sign_client_cert(
        &cluster.pki.ca_cert_pem,
        &cluster.pki.ca_key_pem,
        "quorumguard",
        SystemTime::now(),
    )
    .expect("sign");
    let wrong_trust = ClientTls::new(other_ca, ours.cert_pem, ours.key_pem).expect("TLS material");
    let err = rt
        .block_on(Prober::new(wrong_trust).probe(&endpoints, DEADLINE))
        .expect_err("server not trusted");
    eprintln!("untrusted server: {err}");
    let ProbeError::MemberList { attempts } = &err else {
        panic!("{err}")
    };
    assert_eq!(attempts.len(), 3);
    for a in attempts {
        assert!(
            a.error.contains("invalid peer certificate: UnknownIssuer"),
            "{a}"
        );
    }
}

/// What every path is told after quorum loss, on whichever etcd runs (3.4.23 and 3.5.1 seen):
/// each member's version is read from its own status; etcd-client asks for the member list
/// with `linearizable: false`, which the survivor answers from its own view on 3.4 and 3.5 alike,
/// so the probe still lists the three members, the survivor "etcdserver: no leader"; etcdctl of
/// the same release fails the member list from 3.5 on (it asks for a linearizable one) and
/// answers it on 3.4.
#[test]
fn quorum_lost_shows_each_members_version_and_what_each_member_list_does() {
    let version = testkit::etcd::version().to_string();
    let parsed = quorumguard_engine::etcd_version::EtcdVersion::parse(&version)
        .unwrap_or_else(|| panic!("etcd version {version:?}"));
    let mut cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let prober = Prober::new(cluster.client_tls());
    let (healthy, survivor) = healthy_follower(&rt, &prober, &cluster);
    for m in &healthy.members {
        assert_eq!(
            m.version.as_deref(),
            Some(version.as_str()),
            "{}",
            show(&healthy)
        );
    }
    let (p, _, survivor_name) = lose_quorum(&rt, &prober, &mut cluster, survivor);
    eprintln!("etcd {version}, quorum lost:\n{}", show(&p));
    assert_eq!(p.members.len(), 3, "{}", show(&p));
    assert_eq!(p.member_list_from, cluster.client_url(survivor));
    assert_eq!(
        member(&p, &survivor_name).version.as_deref(),
        Some(version.as_str())
    );
    assert!(p.members.iter().all(|m| !m.is_leader));

    // etcdctl of the same release, against the survivor alone.
    let own = [cluster.client_url(survivor)];
    let listed = cluster.etcdctl(&own, &["member", "list", "-w", "json"]);
    eprintln!("etcdctl {version} member list: {listed:?}");
    if parsed.minor >= 5 {
        let e = listed.expect_err("etcdctl 3.5 asks for a linearizable member list");
        assert!(e.contains("context deadline exceeded"), "{e}");
        // Its output, as a member list dump taken with `2>&1` holds it, reads as a failure, in
        // etcdctl's words. Two are seen on 3.5.1: its own deadline running out first, or the
        // survivor's wait for a ReadIndex ending first (etcd logs "waiting for ReadIndex response
        // took too long" and answers with gRPC code Unknown).
        let said = quorumguard_observe::dumps::etcdctl::failed_member_list(&e);
        assert!(
            matches!(
                said.as_deref(),
                Some(
                    "etcdctl failed: \"context deadline exceeded\""
                        | "etcdctl failed: \"rpc error: code = Unknown desc = context deadline exceeded\""
                )
            ),
            "{said:?} from {e}"
        );
    } else {
        let text = listed.expect("etcdctl 3.4 lists members without a leader");
        assert_eq!(text.matches("\"ID\"").count(), 3, "{text}");
    }
}
