//! Crash safety (issue 7): `quorumguard serve` SIGKILLed at many points of the playground's
//! `upgrade-stuck` rollout and started again, on a real 3-member etcd (TLS, 127.0.0.1) with the
//! API-server stand-in calling the real HTTPS webhook per the repo's
//! ValidatingWebhookConfiguration.
//!
//! serve runs as a child process ([`ServeMode::Child`]) on fixed ports, with leader election on
//! its Lease (short timings: 3 s duration, 2 s renew deadline, 500 ms retry, so that a replacement
//! pod's takeover stays bounded) and a 500 ms probe interval. The rollout is the scenario's: a
//! KCP v0.3-style controller adds a voting member, removes the oldest member and loses leader
//! election before deleting its Machine (cluster-api #2651); restarted, it follows quorumguard's
//! NextAction. [`PLAN`] kills serve at 12 points, chosen by step number: while a step runs (the
//! step then sees the webhook dead: its Machine deletion is refused, or a scale-up or a
//! finished deletion happens unseen), and at delays from 0 to 600 ms after a step (during the
//! probe, the status write or nothing at all); plus once around a person's delete. Most restarts
//! keep the pod's name (kubelet restarting the container: the Lease is its own and renewed at
//! once); three come back under a new name (a replacement pod: it must wait for the dead
//! holder's Lease to expire).
//!
//! What it asserts:
//! 1. Every Machine deletion the webhook allowed was safe at that moment, judged here from etcd
//!    itself (etcdctl member list and endpoint health, not quorumguard's probe): with the members
//!    of every Machine already being deleted and of this one removed, the healthy voting members
//!    left still form a majority of the members left, and the Machines not being deleted still
//!    number at least `spec.replicas`. No review can have moved etcd between the admission and
//!    the check: the controller's step ends with the deletion, and nothing else changes etcd.
//!    Every review sent while serve was dead was refused (500, `failurePolicy: Fail`), and the
//!    person's delete of a healthy Machine in the stuck state never got through. A monitor
//!    thread asks etcd every ~200 ms throughout: etcd never lost quorum.
//! 2. After each restart the published conditions converge to the truth within two probe
//!    intervals of serve serving again. "Serving again" is the later of `/readyz` answering 200
//!    (certificate loaded, watch caches synced, listening) and the Lease naming the new process
//!    as holder with a `renewTime` after its spawn (it may write status): both polled every
//!    20 ms. "The truth" is [`truth`]: EtcdQuorum's status and reason and NextAction's reason and
//!    target, derived here from etcd's member list and health, the Machines and
//!    `spec.replicas`, by the rules docs/rules.md states for each reason (the states this rollout
//!    passes through; any other state fails the test rather than guess). Nothing else is
//!    published on the way: etcd and the Machines stand still while serve restarts, so any
//!    other conditions seen after the restart (polled every 20 ms) would be false.
//! 3. The rollout completes within [`MAX_STEPS`] controller steps and [`ROLLOUT_LIMIT`]: three
//!    new Machines at the new version, etcd's voting members exactly their nodes and all
//!    healthy, Healthy/None published.
//!
//! Run with `--nocapture` to see each kill point's figures.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quorumguard::etcd::endpoints::ETCD_ENDPOINTS_ANNOTATION;
use quorumguard::playground::apiserver::{cluster_resource, kcp_resource, machine_resource};
use quorumguard::playground::etcd::Etcdctl;
use quorumguard::playground::kcp::{KcpController, Step, Style};
use quorumguard::playground::timeline::{Sink, Timeline};
use quorumguard::playground::webhooks::WebhookCall;
use quorumguard::playground::world::{
    CLUSTER, ChildServe, Conditions, HUMAN, KCP, NAMESPACE, NEW_VERSION, OLD_VERSION,
    SERVE_IDENTITY, ServeMode, World, WorldOptions,
};
use serde_json::{Value, json};
use testkit::https::TempDir;

const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// At most this many controller steps (the rollout takes about 12, a few more when a deletion
/// is refused while serve is dead).
const MAX_STEPS: usize = 40;
/// And at most this long.
const ROLLOUT_LIMIT: Duration = Duration::from_secs(150);
/// How long a restarted serve may take to serve: a replacement pod waits out the Lease (3 s).
const SERVING_LIMIT: Duration = Duration::from_secs(20);

/// Who comes back after a kill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pod {
    /// The same pod's container, restarted by kubelet: same identity in the Lease.
    Same,
    /// A replacement pod: a new identity, which must wait for the dead holder's Lease.
    New,
}

/// When to SIGKILL serve around one controller step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    /// Not at this step.
    No,
    /// Before the step, restarted after it: the step runs against a dead webhook.
    During(Pod),
    /// This long after the step: mid-probe, mid-status-write, or idle.
    After(u64, Pod),
}

/// Kill points by controller step (1-based; steps beyond the plan are left alone). The steps
/// they fall on when the rollout goes as planned: 1 scale up; 2 remove the oldest member and
/// crash; 3 and 4 delete the stranded Machine (refused while dead, then allowed); 5 finish its
/// deletion; 6 scale up; 7 remove the next member, its deletion refused while dead; 8 delete it;
/// 9 finish; 10 scale up; 11 remove the last old member and delete its Machine; 12 finish.
const PLAN: [Kill; 12] = [
    Kill::During(Pod::Same),
    Kill::After(0, Pod::Same),
    Kill::During(Pod::New),
    Kill::After(150, Pod::Same),
    Kill::After(300, Pod::Same),
    Kill::After(450, Pod::New),
    Kill::During(Pod::Same),
    Kill::After(600, Pod::Same),
    Kill::No,
    Kill::After(50, Pod::New),
    Kill::After(250, Pod::Same),
    Kill::During(Pod::Same),
];

/// One etcd member as `etcdctl member list` shows it.
#[derive(Clone, Debug)]
struct Member {
    name: String,
    learner: bool,
    url: Option<String>,
}

/// etcd as etcdctl sees it: the members, and which of them answer `endpoint health`.
#[derive(Clone, Debug)]
struct Facts {
    members: Vec<Member>,
    healthy: BTreeSet<String>,
}

impl Facts {
    fn voting(&self) -> Vec<&Member> {
        self.members.iter().filter(|m| !m.learner).collect()
    }

    fn healthy_voting(&self) -> usize {
        self.voting()
            .iter()
            .filter(|m| self.healthy.contains(&m.name))
            .count()
    }

    fn has(&self, name: &str) -> bool {
        self.members.iter().any(|m| m.name == name)
    }

    fn quorate(&self) -> bool {
        self.healthy_voting() > self.voting().len() / 2
    }
}

/// Asks etcd (through `endpoints`) for its members, then each member for its health.
fn facts(ctl: &Etcdctl, endpoints: &[String]) -> Result<Facts, String> {
    let listed = ctl
        .run(endpoints, &["member", "list", "-w", "json"])
        .map_err(|e| e.to_string())?;
    let listed: Value = serde_json::from_str(&listed).map_err(|e| format!("{e}: {listed}"))?;
    let members: Vec<Member> = listed["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| Member {
            name: m["name"].as_str().unwrap_or("").to_string(),
            learner: m["isLearner"].as_bool().unwrap_or(false),
            url: m["clientURLs"][0].as_str().map(str::to_string),
        })
        .collect();
    let urls: Vec<String> = members.iter().filter_map(|m| m.url.clone()).collect();
    let mut healthy = BTreeSet::new();
    if !urls.is_empty() {
        // Exits 1 when a member is unhealthy; the JSON is on stdout either way.
        let out = ctl
            .output(&urls, &["endpoint", "health", "-w", "json"])
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let answers: Value = serde_json::from_str(&text).map_err(|e| {
            format!(
                "endpoint health: {e}: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        for a in answers.as_array().into_iter().flatten() {
            if a["health"].as_bool() == Some(true)
                && let Some(m) = members
                    .iter()
                    .find(|m| m.url.as_deref() == a["endpoint"].as_str())
            {
                healthy.insert(m.name.clone());
            }
        }
    }
    Ok(Facts { members, healthy })
}

/// The members' client URLs the playground keeps in the Cluster's annotation.
fn endpoints(world: &World) -> Vec<String> {
    world
        .api
        .get(&cluster_resource(), NAMESPACE, CLUSTER)
        .and_then(|c| {
            c["metadata"]["annotations"][ETCD_ENDPOINTS_ANNOTATION]
                .as_str()
                .map(|s| s.split(',').map(str::to_string).collect())
        })
        .unwrap_or_default()
}

async fn facts_now(world: &World, ctl: &Etcdctl) -> Facts {
    let (ctl, eps) = (ctl.clone(), endpoints(world));
    tokio::task::spawn_blocking(move || facts(&ctl, &eps))
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("asking etcd: {e}"))
}

/// A control-plane Machine as stored.
#[derive(Clone, Debug)]
struct MachineFacts {
    name: String,
    created: String,
    deleting: bool,
    node: Option<String>,
    version: String,
}

fn machines(world: &World) -> Vec<MachineFacts> {
    let mut out: Vec<MachineFacts> = world
        .api
        .list(&machine_resource())
        .iter()
        .filter(|m| m["metadata"]["namespace"] == NAMESPACE)
        .map(|m| MachineFacts {
            name: m["metadata"]["name"].as_str().unwrap_or("").into(),
            created: m["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or("")
                .into(),
            deleting: !m["metadata"]["deletionTimestamp"].is_null(),
            node: m["status"]["nodeRef"]["name"].as_str().map(str::to_string),
            version: m["spec"]["version"].as_str().unwrap_or("").into(),
        })
        .collect();
    // Oldest first, then by name: the order quorumguard names Machines in.
    out.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
    out
}

fn replicas(world: &World) -> usize {
    world
        .api
        .get(&kcp_resource(), NAMESPACE, KCP)
        .and_then(|k| k["spec"]["replicas"].as_u64())
        .unwrap_or(0) as usize
}

/// What quorumguard should publish: EtcdQuorum status and reason, NextAction reason and the
/// Machine it names.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Expected {
    status: &'static str,
    quorum: &'static str,
    action: &'static str,
    target: Option<String>,
}

impl Expected {
    fn matches(&self, c: &Conditions) -> bool {
        c.quorum.as_ref().map(|q| q.status.as_str()) == Some(self.status)
            && c.quorum_reason() == self.quorum
            && c.action() == self.action
            && (self.target.is_none() || c.action_target() == self.target)
    }
}

/// The truth for the states this rollout passes through, from the definitions in docs/rules.md:
/// - a Machine (not being deleted) with a node but no etcd member, while there are more Machines
///   than replicas, is what an interrupted scale-down left: EtcdQuorum False/MembershipMismatch,
///   NextAction DeleteMachine naming the oldest such Machine;
/// - otherwise, every member healthy and matching a Machine: EtcdQuorum True/Healthy when one
///   more member may fail (healthy voting members above a majority), and NextAction
///   WaitForDeletion (the oldest Machine being deleted), WaitForRollout (Machines and replicas
///   differ) or None.
///
/// Any other state (quorum lost, an unhealthy member, a learner, a member without a Machine, a
/// Machine without a node) is not one this rollout should reach: `Err` says which.
fn truth(facts: &Facts, machines: &[MachineFacts], replicas: usize) -> Result<Expected, String> {
    let voting = facts.voting().len();
    if !facts.quorate() {
        return Err(format!("etcd lost quorum: {facts:?}"));
    }
    if facts.healthy_voting() != voting || facts.members.iter().any(|m| m.learner) {
        return Err(format!("an unhealthy member or a learner: {facts:?}"));
    }
    if let Some(m) = facts.members.iter().find(|m| {
        !machines
            .iter()
            .any(|x| x.node.as_deref() == Some(m.name.as_str()))
    }) {
        return Err(format!("member {} has no Machine: {machines:?}", m.name));
    }
    if let Some(m) = machines.iter().find(|m| m.node.is_none()) {
        return Err(format!("Machine {} has no node", m.name));
    }
    let active: Vec<&MachineFacts> = machines.iter().filter(|m| !m.deleting).collect();
    let stranded = active
        .iter()
        .find(|m| !facts.has(m.node.as_deref().unwrap_or_default()));
    if let Some(m) = stranded {
        if active.len() <= replicas {
            return Err(format!(
                "Machine {} has no member and there are not more Machines than replicas",
                m.name
            ));
        }
        return Ok(Expected {
            status: "False",
            quorum: "MembershipMismatch",
            action: "DeleteMachine",
            target: Some(m.name.clone()),
        });
    }
    // Fault tolerance >= 1: one more healthy member than a majority.
    let (status, quorum) = if voting - (voting / 2 + 1) >= 1 {
        ("True", "Healthy")
    } else {
        ("False", "NoFaultTolerance")
    };
    let (action, target) = if let Some(d) = machines.iter().find(|m| m.deleting) {
        ("WaitForDeletion", Some(d.name.clone()))
    } else if active.len() != replicas {
        ("WaitForRollout", None)
    } else {
        ("None", None)
    };
    Ok(Expected {
        status,
        quorum,
        action,
        target,
    })
}

/// Whether the allowed deletion of Machine `name` was safe with etcd as `facts` and the
/// Machines as `machines` (stored after the deletion: `name` is marked deleting), see the
/// module doc. `Err` says why not.
fn deletion_safe(
    name: &str,
    facts: &Facts,
    machines: &[MachineFacts],
    replicas: usize,
) -> Result<(), String> {
    let leaving: BTreeSet<&str> = machines
        .iter()
        .filter(|m| m.deleting || m.name == name)
        .filter_map(|m| m.node.as_deref())
        .collect();
    let left: Vec<&Member> = facts
        .voting()
        .into_iter()
        .filter(|m| !leaving.contains(m.name.as_str()))
        .collect();
    let healthy_left = left
        .iter()
        .filter(|m| facts.healthy.contains(&m.name))
        .count();
    if left.is_empty() || healthy_left <= left.len() / 2 {
        return Err(format!(
            "deleting Machine {name}: with the members of {leaving:?} gone, {healthy_left} healthy of {} voting members are left: no majority ({facts:?})",
            left.len()
        ));
    }
    let staying = machines
        .iter()
        .filter(|m| !m.deleting && m.name != name)
        .count();
    if staying < replicas {
        return Err(format!(
            "deleting Machine {name}: {staying} Machines would stay for {replicas} replicas"
        ));
    }
    Ok(())
}

/// One monitor sample: etcd quorate or not (or could not be asked), and when.
#[derive(Clone, Debug)]
struct Sample {
    at: Duration,
    result: Result<(usize, usize), String>,
}

/// Asks etcd every ~200 ms until `stop`, from its own thread (etcdctl, no lock on the cluster:
/// it keeps looking while a membership change is under way). Bounded: at most 3000 samples.
fn monitor(
    ctl: Etcdctl,
    world: Arc<World>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Sample>> {
    let started = Instant::now();
    std::thread::spawn(move || {
        let mut samples = Vec::new();
        for _ in 0..3000 {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let result =
                facts(&ctl, &endpoints(&world)).map(|f| (f.healthy_voting(), f.voting().len()));
            samples.push(Sample {
                at: started.elapsed(),
                result,
            });
            std::thread::sleep(Duration::from_millis(200));
        }
        samples
    })
}

/// What one kill point measured.
#[derive(Debug)]
struct Restart {
    step: usize,
    kill: Kill,
    identity: String,
    /// The published conditions did not match the truth when serve was serving again.
    stale: bool,
    /// Spawn to serving again.
    to_serving: Duration,
    /// Serving again to the truth published.
    to_truth: Duration,
    expected: Expected,
    /// Conditions published after the restart that were neither the old ones nor the truth.
    detours: Vec<String>,
}

struct Run {
    world: Arc<World>,
    ctl: Etcdctl,
    restarts: Vec<Restart>,
    /// (first, last) webhook call numbers made while serve was dead.
    dead_calls: Vec<(u64, u64)>,
    new_pods: usize,
    identity: String,
    probe_interval: Duration,
}

impl Run {
    fn kill(&mut self) -> u64 {
        let killed = self.world.kill_serve().expect("SIGKILL serve");
        assert_eq!(killed.identity, self.identity);
        self.world.webhooks.call_count()
    }

    /// Restarts serve (as `pod` says), waits for it to serve, then for the truth to be
    /// published: at most two probe intervals after serving.
    async fn restart(&mut self, step: usize, kill: Kill, pod: Pod, dead_since: u64) {
        let last_dead = self.world.webhooks.call_count();
        if last_dead > dead_since {
            self.dead_calls.push((dead_since + 1, last_dead));
        }
        if pod == Pod::New {
            self.new_pods += 1;
            self.identity = format!("{SERVE_IDENTITY}-{}", self.new_pods + 1);
        }
        let before = self.world.conditions();
        let facts = facts_now(&self.world, &self.ctl).await;
        let expected = truth(&facts, &machines(&self.world), replicas(&self.world))
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        let spawned = Instant::now();
        self.world
            .restart_serve(Some(&self.identity))
            .await
            .expect("restart serve");
        let serving = self
            .world
            .wait_serving(SERVING_LIMIT)
            .await
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        let since = serving.since();
        let stale = !expected.matches(&before);
        let deadline = since + self.probe_interval * 2;
        let mut detours = Vec::new();
        let mut published = self.world.conditions();
        // Bounded: 20 ms apart, until twice the deadline (to report how late it was).
        for _ in 0..200 {
            published = self.world.conditions();
            if expected.matches(&published) {
                break;
            }
            let seen = format!("{}/{}", published.quorum_reason(), published.action());
            if published != before && !detours.contains(&seen) {
                detours.push(seen);
            }
            if Instant::now() > deadline + self.probe_interval * 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let converged = Instant::now();
        assert!(
            expected.matches(&published),
            "step {step} ({kill:?}): the truth {expected:?} was not published after the restart; published: {published:?}"
        );
        // Nothing false on the way: etcd and the Machines stand still while serve restarts, so
        // anything published after the restart other than the truth is false.
        assert!(
            detours.is_empty(),
            "step {step} ({kill:?}): after the restart, before the truth {expected:?}, serve published {detours:?}"
        );
        let to_truth = converged.saturating_duration_since(since);
        assert!(
            converged <= deadline,
            "step {step} ({kill:?}): the truth {expected:?} was published {to_truth:?} after serve served again, more than two probe intervals ({:?})",
            self.probe_interval * 2
        );
        self.restarts.push(Restart {
            step,
            kill,
            identity: self.identity.clone(),
            stale,
            to_serving: since.saturating_duration_since(spawned),
            to_truth,
            expected,
            detours,
        });
    }

    /// Checks every Machine deletion allowed since call `before` against etcd as it is now.
    async fn check_deletions(&self, before: u64, what: &str) {
        let allowed: Vec<WebhookCall> = self
            .world
            .webhooks
            .calls_since(before)
            .into_iter()
            .filter(|c| c.resource == "machines" && c.allowed)
            .collect();
        if allowed.is_empty() {
            return;
        }
        let facts = facts_now(&self.world, &self.ctl).await;
        let (machines, replicas) = (machines(&self.world), replicas(&self.world));
        for call in allowed {
            deletion_safe(&call.name, &facts, &machines, replicas)
                .unwrap_or_else(|e| panic!("{what}: the webhook allowed an unsafe deletion: {e}"));
        }
    }
}

async fn wait_for(world: &World, expected: &Expected, limit: Duration) -> Conditions {
    let started = Instant::now();
    let mut c = world.conditions();
    for _ in 0..(limit.as_millis() / 50) {
        c = world.conditions();
        if expected.matches(&c) || started.elapsed() > limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c
}

#[test]
fn sigkilled_serve_never_allows_an_unsafe_deletion_and_the_rollout_completes() {
    let _slot = testkit::etcd::slot();
    let dir = TempDir::new("crash");
    let path = dir.path().to_path_buf();
    // CRASH_SAFETY_KEEP=1: serve's logs (serve-<n>.log), etcd's and the kubeconfigs stay.
    let _dir = match std::env::var_os("CRASH_SAFETY_KEEP") {
        Some(_) => {
            println!("keeping {}", path.display());
            std::mem::forget(dir);
            None
        }
        None => Some(dir),
    };
    testkit::etcd::runtime().block_on(async {
        let serve = ChildServe {
            lease_duration: Duration::from_secs(3),
            lease_renew_deadline: Duration::from_secs(2),
            lease_retry_period: Duration::from_millis(500),
            ..ChildServe::new(env!("CARGO_BIN_EXE_quorumguard").into())
        };
        let options = WorldOptions {
            probe_interval: PROBE_INTERVAL,
            serve: ServeMode::Child(serve),
            ..WorldOptions::new(path.clone())
        };
        let started = Instant::now();
        let world = Arc::new(World::start(options, |_| {}).await.expect("the world starts"));
        let ctl = world
            .etcd(|e| e.etcdctl_handle())
            .await
            .expect("etcdctl");
        let healthy = Expected {
            status: "True",
            quorum: "Healthy",
            action: "None",
            target: None,
        };
        world.wait_serving(SERVING_LIMIT).await.expect("serving");
        let c = wait_for(&world, &healthy, Duration::from_secs(20)).await;
        assert!(healthy.matches(&c), "the first publication: {c:?}");
        let old: Vec<String> = machines(&world).into_iter().map(|m| m.name).collect();

        let stop = Arc::new(AtomicBool::new(false));
        let monitor = monitor(ctl.clone(), Arc::clone(&world), Arc::clone(&stop));
        let mut run = Run {
            world: Arc::clone(&world),
            ctl: ctl.clone(),
            restarts: Vec::new(),
            dead_calls: Vec::new(),
            new_pods: 0,
            identity: SERVE_IDENTITY.to_string(),
            probe_interval: PROBE_INTERVAL,
        };

        // The upgrade, first against a dead guard: refused (failurePolicy Fail), then allowed.
        let dead_since = run.kill();
        let refused = world
            .patch_kcp_spec(json!({ "version": NEW_VERSION }), HUMAN)
            .await
            .expect("ask");
        assert!(
            matches!(&refused, Err((500, m)) if m.contains("failed calling webhook")),
            "the upgrade with the guard dead: {refused:?}"
        );
        assert_eq!(world.kcp_spec().1, OLD_VERSION);
        run.restart(0, Kill::During(Pod::Same), Pod::Same, dead_since)
            .await;
        let allowed = world
            .patch_kcp_spec(json!({ "version": NEW_VERSION }), HUMAN)
            .await
            .expect("ask");
        assert_eq!(allowed, Ok(()), "the upgrade with the guard back");

        let tl = Timeline::new(Sink::Memory);
        let mut kcp = KcpController::new(Arc::clone(&world), tl.clone(), Style::V03);
        kcp.crash_after_member_removal = true;
        let mut human_tries = Vec::new();
        let mut converged = false;
        let rollout = Instant::now();
        let mut steps = 0;
        while steps < MAX_STEPS && rollout.elapsed() < ROLLOUT_LIMIT {
            steps += 1;
            let kill = PLAN.get(steps - 1).copied().unwrap_or(Kill::No);
            let dead_since = match kill {
                Kill::During(_) => Some(run.kill()),
                _ => None,
            };
            let before = world.webhooks.call_count();
            let step = kcp
                .step()
                .await
                .unwrap_or_else(|e| panic!("step {steps}: {e}\n{}", tl.text()));
            tl.event("test", &format!("step {steps} ({kill:?}): {step:?}"));
            run.check_deletions(before, &format!("step {steps} {step:?}"))
                .await;
            match kill {
                Kill::During(pod) => {
                    run.restart(steps, kill, pod, dead_since.unwrap_or(before))
                        .await
                }
                Kill::After(ms, pod) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    let dead_since = run.kill();
                    run.restart(steps, kill, pod, dead_since).await;
                }
                Kill::No => tokio::time::sleep(world.settle_time()).await,
            }
            match step {
                Step::Converged => {
                    converged = true;
                    break;
                }
                Step::Crashed(_) => {
                    // The stuck state: a person deleting another, healthy old Machine, with the
                    // guard dead (refused) and alive (denied).
                    let other = old.get(1).cloned().expect("3 old Machines");
                    let dead_since = run.kill();
                    let before = world.webhooks.call_count();
                    human_tries.push(world.delete_machine(&other, HUMAN).await.expect("ask"));
                    run.restart(steps, Kill::During(Pod::Same), Pod::Same, dead_since)
                        .await;
                    human_tries.push(world.delete_machine(&other, HUMAN).await.expect("ask"));
                    run.check_deletions(before, "a person's delete").await;
                    kcp.follow_next_action = true;
                }
                _ => {}
            }
        }
        stop.store(true, Ordering::SeqCst);
        let samples = monitor.join().expect("monitor");
        let text = tl.text();
        println!("{text}");

        // 1. Safety (the allowed deletions were checked as they happened).
        assert_eq!(human_tries.len(), 2, "the stuck state was reached:\n{text}");
        assert!(
            matches!(&human_tries[0], Err((500, _))),
            "a person's delete with the guard dead: {:?}",
            human_tries[0]
        );
        assert!(
            matches!(&human_tries[1], Err((403, _))),
            "a person's delete of a healthy Machine in the stuck state: {:?}",
            human_tries[1]
        );
        let calls = world.webhooks.calls();
        let mut dead = 0;
        for &(first, last) in &run.dead_calls {
            for c in calls.iter().filter(|c| (first..=last).contains(&c.seq)) {
                dead += 1;
                assert!(
                    !c.allowed && c.code == 500 && c.error.is_some(),
                    "a review sent while serve was dead: {c:?}"
                );
            }
        }
        assert!(dead >= 3, "reviews were sent to a dead guard: {dead}");
        let lost: Vec<&Sample> = samples
            .iter()
            .filter(|s| matches!(s.result, Ok((h, v)) if h <= v / 2))
            .collect();
        let unanswered = samples.iter().filter(|s| s.result.is_err()).count();
        assert!(
            lost.is_empty(),
            "etcd lost quorum at {:?}: {lost:?}",
            lost.iter().map(|s| s.at).collect::<Vec<_>>()
        );
        assert!(
            samples.len() >= 20 && unanswered * 10 <= samples.len(),
            "the monitor looked {} times, {unanswered} without an answer: {:?}",
            samples.len(),
            samples.iter().filter(|s| s.result.is_err()).take(5).collect::<Vec<_>>()
        );

        // 2. Convergence was checked at each restart; enough of them found stale conditions.
        let kill_points = run.restarts.len();
        let stale = run.restarts.iter().filter(|r| r.stale).count();
        assert!(kill_points >= 12, "{kill_points} kill points");
        // At least the three steps run against a dead serve (1, 7, 12) changed what it had
        // published; kills after a step find it stale or not depending on timing.
        assert!(
            stale >= 3,
            "restarts that had to correct the conditions: {stale}"
        );
        let lease = world.lease().expect("the Lease");
        assert_eq!(lease.holder, run.identity);
        assert_eq!(
            lease.transitions as usize, run.new_pods,
            "only a new pod takes the Lease over; a restarted container keeps it"
        );

        // 3. The rollout completed.
        assert!(converged, "the rollout did not complete in {steps} steps:\n{text}");
        let final_machines = machines(&world);
        assert_eq!(final_machines.len(), 3, "{final_machines:?}");
        assert!(
            final_machines
                .iter()
                .all(|m| m.version == NEW_VERSION && !old.contains(&m.name) && !m.deleting),
            "{final_machines:?}"
        );
        let facts = facts_now(&world, &ctl).await;
        let mut members: Vec<String> = facts.members.iter().map(|m| m.name.clone()).collect();
        members.sort();
        let mut nodes: Vec<String> = final_machines.iter().filter_map(|m| m.node.clone()).collect();
        nodes.sort();
        assert_eq!(members, nodes);
        assert_eq!(facts.healthy_voting(), 3, "{facts:?}");
        let c = wait_for(&world, &healthy, PROBE_INTERVAL * 2).await;
        assert!(healthy.matches(&c), "{c:?}");

        println!("kill points (step, kill, identity, stale at restart, spawn->serving, serving->truth, truth, detours):");
        for r in &run.restarts {
            println!(
                "  {:>2} {:<22} {:<28} stale={:<5} {:>6.0} ms {:>6.0} ms  {}/{} {} {:?}",
                r.step,
                format!("{:?}", r.kill),
                r.identity,
                r.stale,
                r.to_serving.as_secs_f64() * 1000.0,
                r.to_truth.as_secs_f64() * 1000.0,
                r.expected.quorum,
                r.expected.action,
                r.expected.target.as_deref().unwrap_or(""),
                r.detours
            );
        }
        let worst = run.restarts.iter().map(|r| r.to_truth).max().unwrap_or_default();
        println!(
            "{kill_points} kill points, {stale} with stale conditions; worst serving->truth {:.0} ms (bound {:.0} ms); {dead} reviews refused while dead; {} monitor samples, {unanswered} unanswered; {steps} steps; took {:.1}s",
            worst.as_secs_f64() * 1000.0,
            (PROBE_INTERVAL * 2).as_secs_f64() * 1000.0,
            samples.len(),
            started.elapsed().as_secs_f64()
        );
        world.shutdown().await;
    });
}
