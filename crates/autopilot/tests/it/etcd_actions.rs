//! Each etcd call an autopilot action is made of, on a real cluster, checked by what etcd says
//! afterwards (etcdctl's member list, a write, the members' status), and the NOSPACE recovery in
//! the order the autopilot follows: compact, defragment the followers, move the leadership,
//! defragment the former leader, disarm. Each call of the recovery is counted by etcd itself
//! (`grpc_server_started_total`), the figures in docs/autopilot.md.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use quorumguard_autopilot::{ActError, EtcdActor};
use quorumguard_engine::autopilot::free_space::compaction_bound;
use quorumguard_engine::model::{Alarm, Member, MemberId};
use quorumguard_observe::etcd::{Probe, Prober, Transport};

use crate::probe::{SETTLE, probe_until};
use testkit::etcd::{EtcdCluster, grpc_delta};

/// Each call's deadline: a defragmentation of a 1 MiB backend takes milliseconds; loaded CI
/// machines need the margin.
const DEADLINE: Duration = Duration::from_secs(5);

fn actor(cluster: &EtcdCluster) -> EtcdActor {
    EtcdActor::new(cluster.client_tls(), Transport::Direct, DEADLINE)
}

/// What etcd counted between `before` and now, as "Method n, ..." ([`grpc_delta`]).
fn counted(
    rt: &tokio::runtime::Runtime,
    cluster: &EtcdCluster,
    before: &BTreeMap<String, u64>,
) -> String {
    grpc_delta(before, &rt.block_on(cluster.grpc_requests())).1
}

fn leader(p: &Probe) -> &Member {
    p.members
        .iter()
        .find(|m| m.is_leader)
        .unwrap_or_else(|| panic!("no leader in {p:?}"))
}

fn named<'a>(p: &'a Probe, name: &str) -> &'a Member {
    p.members
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no member {name} in {p:?}"))
}

#[test]
fn a_started_learner_is_promoted() {
    let mut cluster = EtcdCluster::start(3);
    let l = cluster.add_learner("l1");
    cluster.start_member(l);
    let rt = testkit::etcd::runtime();
    let p = probe_until(&rt, &cluster, "the learner started and healthy", |p| {
        p.members
            .iter()
            .any(|m| m.name == "l1" && m.is_learner && m.health.is_healthy())
    });
    let learner = named(&p, "l1").id;
    // etcd promotes a learner only once it is in sync with the leader: right after it started
    // it may not be yet, and etcd says so; the autopilot acts on the next probe then.
    let started = Instant::now();
    loop {
        let before = rt.block_on(cluster.grpc_requests());
        match rt.block_on(actor(&cluster).promote(leader(&p), learner)) {
            Ok(()) => {
                assert_eq!(counted(&rt, &cluster, &before), "MemberPromote 1");
                break;
            }
            Err(ActError::Refused { error, .. }) if error.contains("in sync") => {
                assert!(started.elapsed() < SETTLE, "never in sync: {error}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("{e}"),
        }
    }
    let listed = cluster.member_list();
    let promoted = listed
        .iter()
        .find(|(id, _, _)| *id == learner.0)
        .unwrap_or_else(|| panic!("{learner} not listed: {listed:?}"));
    assert!(
        !promoted.2,
        "still a learner after the promotion: {listed:?}"
    );
}

#[test]
fn a_member_added_that_never_started_is_removed() {
    let mut cluster = EtcdCluster::start(3);
    cluster.add_member("m4");
    let rt = testkit::etcd::runtime();
    let p = probe_until(&rt, &cluster, "the unstarted member listed", |p| {
        p.members.len() == 4 && p.members.iter().any(|m| m.name.is_empty())
    });
    let unstarted = p
        .members
        .iter()
        .find(|m| m.name.is_empty())
        .expect("the unstarted member");
    // It has no client URL: nothing can be sent to it, and the error says why.
    let err = rt
        .block_on(actor(&cluster).status(unstarted))
        .expect_err("an unstarted member answers nothing");
    assert!(
        matches!(err, ActError::Unreachable { .. }) && err.to_string().contains("never started"),
        "{err}"
    );
    let before = rt.block_on(cluster.grpc_requests());
    rt.block_on(actor(&cluster).remove(leader(&p), unstarted.id))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counted(&rt, &cluster, &before), "MemberRemove 1");
    let listed = cluster.member_list();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(
        !listed.iter().any(|(id, _, _)| *id == unstarted.id.0),
        "{listed:?}"
    );
}

/// A 1 MiB quota filled by the history of one key (as an API server that stopped compacting
/// fills it): NOSPACE, then the autopilot's order brings every member under the quota and etcd
/// takes writes again. Nothing is deleted: compaction drops old revisions only.
#[test]
fn nospace_is_cleared_in_the_autopilots_order() {
    const QUOTA: u64 = 1_048_576;
    let cluster = EtcdCluster::start_with_flags(3, &["--quota-backend-bytes=1048576"]);
    let endpoints = cluster.endpoints();
    let mut refused = false;
    for i in 0..60 {
        let value = format!("{i}{}", "x".repeat(100_000));
        if let Err(e) = cluster.etcdctl(&endpoints[..1], &["put", "/history", &value]) {
            assert!(e.contains("database space exceeded"), "{e}");
            refused = true;
            break;
        }
    }
    assert!(refused, "the quota was never reached");
    let rt = testkit::etcd::runtime();
    let p = probe_until(&rt, &cluster, "a NOSPACE alarm", |p| {
        p.members.iter().any(|m| m.alarms.contains(&Alarm::NoSpace))
    });
    let actor = actor(&cluster);
    let before: Vec<u64> = p
        .members
        .iter()
        .map(|m| rt.block_on(actor.status(m)).expect("status").db_size)
        .collect();
    // etcd refuses a write that would take the backend past the quota: the largest member is
    // within one value (100 kB) of it.
    assert!(
        before.iter().any(|s| s + 100_000 > QUOTA),
        "no member at its quota: {before:?}"
    );

    // 1. Compact the history (once, cluster-wide).
    let old_leader = leader(&p).clone();
    let before = rt.block_on(cluster.grpc_requests());
    let revision = rt
        .block_on(actor.compact(&old_leader))
        .unwrap_or_else(|e| panic!("{e}"));
    // The current revision from the leader's status, then the compaction up to it.
    assert_eq!(counted(&rt, &cluster, &before), "Compact 1, Status 1");
    assert!(revision > 1, "{revision}");
    // Each member compacts its own backend when it applies the compaction, after the call has
    // returned (seen on a loaded machine: a follower defragmented at once still held 0.8 MiB).
    // The autopilot's evidence (`compaction_bound`): the highest raft index a probe after the
    // compaction shows is at or past the compaction's entry, so a member whose applied index has
    // reached it has compacted. Wait for that on the probes, then ask etcd itself, once per
    // member and without waiting: a read of the first revision from the member's own store
    // (serializable) is answered "compacted".
    let after = probe_until(&rt, &cluster, "a probe after the compaction", |_| true);
    let bound = compaction_bound(&after.members).expect("raft indexes");
    probe_until(&rt, &cluster, "every member applied the compaction", |p| {
        p.members
            .iter()
            .all(|m| m.raft_applied_index.is_some_and(|a| a >= bound))
    });
    for m in &p.members {
        let ep = m.client_urls.first().expect("a client URL").clone();
        let read = cluster.etcdctl(
            std::slice::from_ref(&ep),
            &["get", "/history", "--rev=1", "--consistency=s"],
        );
        assert!(
            read.as_ref().is_err_and(|e| e.contains("compacted")),
            "{} has applied entry {bound} and answers revision 1: {read:?}",
            m.name
        );
    }
    // 2. Defragment each follower, its status (a health check) after each.
    let followers: Vec<&Member> = p.members.iter().filter(|m| !m.is_leader).collect();
    for f in &followers {
        let before = rt.block_on(cluster.grpc_requests());
        rt.block_on(actor.defragment(f))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(counted(&rt, &cluster, &before), "Defragment 1");
        let s = rt
            .block_on(actor.status(f))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(s.db_size < QUOTA / 2, "{} after defrag: {s:?}", f.name);
        assert_ne!(s.leader, 0, "{} has no leader after defrag: {s:?}", f.name);
    }
    // 3. Move the leadership to a defragmented follower, so the former leader's defragmentation
    //    (which blocks the member it runs on) stalls no leader.
    let to = followers[0].id;
    let before = rt.block_on(cluster.grpc_requests());
    rt.block_on(actor.move_leader(&old_leader, to))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(counted(&rt, &cluster, &before), "MoveLeader 1");
    let p2 = probe_until(&rt, &cluster, "the new leader", |p| {
        p.members.iter().any(|m| m.is_leader && m.id == to)
    });
    // 4. Defragment the former leader.
    rt.block_on(actor.defragment(&old_leader))
        .unwrap_or_else(|e| panic!("{e}"));
    for m in &p2.members {
        let s = rt
            .block_on(actor.status(m))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(s.db_size < QUOTA / 2, "{} is still large: {s:?}", m.name);
    }
    // Still refused until the alarm is disarmed: the space is back, the alarm stands.
    let still = cluster.etcdctl(&endpoints[..1], &["put", "/after", "1"]);
    assert!(
        still
            .as_ref()
            .is_err_and(|e| e.contains("database space exceeded")),
        "{still:?}"
    );
    // 5. Disarm every member's NOSPACE alarm.
    let alarmed: Vec<MemberId> = p
        .members
        .iter()
        .filter(|m| m.alarms.contains(&Alarm::NoSpace))
        .map(|m| m.id)
        .collect();
    assert!(!alarmed.is_empty());
    let via = leader(&p2).clone();
    for id in alarmed {
        let before = rt.block_on(cluster.grpc_requests());
        rt.block_on(actor.disarm_nospace(&via, id))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(counted(&rt, &cluster, &before), "Alarm 1");
    }
    cluster
        .etcdctl(&endpoints[..1], &["put", "/after", "1"])
        .unwrap_or_else(|e| panic!("a write after the recovery: {e}"));
    probe_until(&rt, &cluster, "no alarm left", |p| {
        p.members.iter().all(|m| m.alarms.is_empty())
    });
}

/// A call to a frozen member ends within its deadline and says that etcd may have applied it.
#[test]
fn a_call_to_a_frozen_member_ends_within_its_deadline_and_says_so() {
    let mut cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let p = probe_until(&rt, &cluster, "healthy", |p| {
        p.members.iter().all(|m| m.health.is_healthy())
    });
    let follower = p
        .members
        .iter()
        .find(|m| !m.is_leader)
        .expect("a follower")
        .clone();
    let i = cluster.index_of(&follower.name);
    cluster.freeze(i);
    let started = Instant::now();
    let err = rt
        .block_on(actor(&cluster).defragment(&follower))
        .expect_err("a frozen member answers nothing");
    let took = started.elapsed();
    cluster.thaw(i);
    assert!(took < DEADLINE + Duration::from_secs(2), "took {took:?}");
    let text = err.to_string();
    assert!(matches!(err, ActError::Timeout { .. }), "{text}");
    assert!(
        text.contains(&follower.name) && text.contains("probe again"),
        "{text}"
    );
}

/// The same calls through the workload API server (port-forward to pod `etcd-<member>`, the
/// production default transport): each member's own status, a defragmentation of one of them,
/// and a member that has no pod failing with the port-forward's own error.
#[test]
fn calls_reach_each_member_through_port_forward() {
    use quorumguard_observe::etcd::PortForward;
    use testkit::apiserver::ApiServer;

    let cluster = EtcdCluster::start(3);
    let rt = testkit::etcd::runtime();
    let (transport, _workload) = rt.block_on(async {
        let workload = ApiServer::start().await.expect("workload stand-in");
        for i in 0..cluster.len() {
            let addr = cluster
                .client_url(i)
                .trim_start_matches("https://")
                .parse()
                .expect("a loopback address");
            workload.forward_pod("kube-system", &format!("etcd-{}", cluster.name(i)), addr);
        }
        let client = workload
            .client()
            .expect("a client of the workload stand-in");
        let pf = PortForward::new(client, workload.url());
        (Transport::port_forward(pf), workload)
    });
    let names: Vec<String> = (0..cluster.len())
        .map(|i| cluster.name(i).to_string())
        .collect();
    // The loopback listeners run on the runtime.
    let _in_runtime = rt.enter();
    let endpoints = transport
        .list_endpoints(None, &[], &names)
        .expect("a listener per pod");
    let prober = Prober::with_transport(cluster.client_tls(), transport.clone());
    let p = rt
        .block_on(prober.probe(&endpoints, DEADLINE))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.members.len(), 3, "{p:?}");
    let actor = EtcdActor::new(cluster.client_tls(), transport, DEADLINE);
    for m in &p.members {
        let s = rt
            .block_on(actor.status(m))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.id, m.id, "{} answered as another member: {s:?}", m.name);
    }
    let follower = p.members.iter().find(|m| !m.is_leader).expect("a follower");
    rt.block_on(actor.defragment(follower))
        .unwrap_or_else(|e| panic!("{e}"));
    // A member whose pod the workload API server does not know: its 404, not "connection
    // closed".
    let mut ghost = follower.clone();
    ghost.name = "ghost".into();
    let err = rt
        .block_on(actor.status(&ghost))
        .expect_err("no pod etcd-ghost");
    assert!(err.to_string().contains("etcd-ghost"), "{err}");
}
