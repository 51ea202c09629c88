//! The playground's truth check: every status quorumguard published during a story, held
//! against what etcd itself said around that moment.
//!
//! Two threads run beside a story. One reads the KCP's conditions every [`POLL`] and keeps each
//! change with the time it appeared and the Machines then stored. The other asks etcd through
//! etcdctl, never through quorumguard's prober: the member list, which members answer
//! `endpoint status` (alive) and which answer `endpoint health` (a linearizable read: healthy).
//! At the end, each published change is split into the claims it makes, and each claim must
//! match at least one of etcd's answers taken from [`Truth::lag`] before it appeared to
//! [`SLACK`] after: the guard publishes what its latest probe saw, a probe deadline and a
//! status write ago.
//!
//! The claims checked (the ones an operator acts on):
//! - quorum lost (`EtcdQuorum` `QuorumLost`, `NextAction` `RestoreQuorum`): fewer members alive
//!   than a majority of the voting members. Members that answer without a leader are alive: a
//!   leader election is not a lost quorum;
//! - a member unhealthy (`MembersUnhealthy` names it; `RemediateMachine` names its Machine):
//!   not in the member list, or not answering `endpoint health`;
//! - a Machine without a member (`MembershipMismatch`, `DeleteMachine`, `RemediateMachine`): no
//!   member of its node's name listed;
//! - a member without a Machine (`RemoveOrphanMember`): that member ID listed;
//! - every member healthy (`EtcdQuorum` True): every voting member listed answers
//!   `endpoint health`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::etcd::Etcdctl;
use super::world::{Conditions, MachineView, NAMESPACE, World};

/// How often the published conditions are read.
pub const POLL: Duration = Duration::from_millis(50);
/// How long each etcdctl call may wait for a member: a frozen one answers nothing.
const ETCDCTL_TIMEOUT: Duration = Duration::from_millis(600);
/// How long after a change appeared etcd's answers still count: the watcher's poll, and the
/// sample in flight then (one takes up to two etcdctl timeouts while a member is frozen or
/// leaving).
pub const SLACK: Duration = Duration::from_millis(1500);
/// Each thread stops after an hour even if never told to.
const MAX_ROUNDS: u32 = 72_000;

/// One member as etcd reported it in one sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenMember {
    pub id: u64,
    /// Empty while added but not started.
    pub name: String,
    pub learner: bool,
    /// Answered `endpoint status`.
    pub alive: bool,
    /// Answered `endpoint health` (a linearizable read went through).
    pub healthy: bool,
}

/// What etcd said at one moment.
#[derive(Clone, Debug)]
pub struct EtcdSample {
    pub at: Instant,
    pub members: Vec<SeenMember>,
}

/// A change of the published conditions, with the Machines stored when it was seen.
#[derive(Clone, Debug)]
pub struct Change {
    pub at: Instant,
    pub conditions: Conditions,
    pub machines: Vec<MachineView>,
}

/// One thing a published status says about etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    QuorumLost,
    /// The member of this name is unhealthy (or gone).
    Unhealthy(String),
    /// No member of this name (a Machine's node) is listed.
    NoMember(String),
    /// A member of this ID is listed (and, by the claim, belongs to no Machine).
    Listed(u64),
    /// Every voting member is healthy.
    AllHealthy,
}

impl Claim {
    /// Whether etcd's `members` at one moment bear the claim out.
    pub fn holds(&self, members: &[SeenMember]) -> bool {
        let voting: Vec<&SeenMember> = members.iter().filter(|m| !m.learner).collect();
        match self {
            Claim::QuorumLost => voting.iter().filter(|m| m.alive).count() < voting.len() / 2 + 1,
            Claim::Unhealthy(name) => members
                .iter()
                .find(|m| m.name == *name)
                .is_none_or(|m| !m.healthy),
            Claim::NoMember(name) => !members.iter().any(|m| m.name == *name),
            Claim::Listed(id) => members.iter().any(|m| m.id == *id),
            Claim::AllHealthy => !voting.is_empty() && voting.iter().all(|m| m.healthy),
        }
    }
}

/// The claims of one published status. `machines` gives each Machine's node (its member's
/// name).
pub fn claims(c: &Conditions, machines: &[MachineView]) -> Vec<Claim> {
    let node_of = |machine: &str| {
        machines
            .iter()
            .find(|m| m.name == machine)
            .map(|m| m.node.clone().unwrap_or_else(|| m.name.clone()))
    };
    let mut out = Vec::new();
    if let Some(q) = &c.quorum {
        let summary = q.message.lines().next().unwrap_or("");
        match q.reason.as_str() {
            "QuorumLost" => out.push(Claim::QuorumLost),
            "Healthy" | "NoFaultTolerance" => out.push(Claim::AllHealthy),
            "MembersUnhealthy" => {
                for part in summary.split("; ") {
                    // "member NAME (id HEX) is unhealthy: ..."; unstarted members show as
                    // "(unstarted ID)" and are in the member list without a name.
                    if let Some(rest) = part.strip_prefix("member ")
                        && let Some((name, _)) = rest.split_once(" (id ")
                        && part.contains(") is unhealthy")
                        && !name.starts_with('(')
                    {
                        out.push(Claim::Unhealthy(name.to_string()));
                    }
                }
            }
            "MembershipMismatch" => {
                let prefix = format!("Machine {NAMESPACE}/");
                for part in summary.split("; ") {
                    if let Some(machine) = part
                        .strip_prefix(&prefix)
                        .and_then(|r| r.strip_suffix(" has no etcd member"))
                        && let Some(node) = node_of(machine)
                    {
                        out.push(Claim::NoMember(node));
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(a) = &c.next_action {
        let target = c.action_target().and_then(|m| node_of(&m));
        match (a.reason.as_str(), target) {
            ("RestoreQuorum", _) => out.push(Claim::QuorumLost),
            ("DeleteMachine", Some(node)) => out.push(Claim::NoMember(node)),
            ("RemediateMachine", Some(node)) if a.message.contains(" has no etcd member") => {
                out.push(Claim::NoMember(node))
            }
            ("RemediateMachine", Some(node)) => out.push(Claim::Unhealthy(node)),
            ("RemoveOrphanMember", _) => {
                // "etcd member NAME (id HEX) of ..."
                if let Some(id) = a
                    .message
                    .split_once("(id ")
                    .and_then(|(_, r)| r.split_once(')'))
                    .and_then(|(hex, _)| u64::from_str_radix(hex, 16).ok())
                {
                    out.push(Claim::Listed(id));
                }
            }
            _ => {}
        }
    }
    out
}

/// What one published change says that etcd did not bear out, one line per false claim.
pub fn false_claims(change: &Change, samples: &[EtcdSample], lag: Duration) -> Vec<String> {
    let near: Vec<&EtcdSample> = samples.iter().filter(|s| near(change, s, lag)).collect();
    if near.is_empty() {
        // Nothing to hold it against (etcd did not answer etcdctl): not judged.
        return Vec::new();
    }
    claims(&change.conditions, &change.machines)
        .into_iter()
        .filter(|claim| !near.iter().any(|s| claim.holds(&s.members)))
        .map(|claim| {
            let c = &change.conditions;
            format!(
                "{claim:?} in EtcdQuorum {} / NextAction {} ({}), while etcd said {:?}",
                c.quorum_reason(),
                c.action(),
                c.quorum
                    .as_ref()
                    .map_or("", |q| q.message.lines().next().unwrap_or("")),
                near.iter().map(|s| shown(&s.members)).collect::<Vec<_>>()
            )
        })
        .collect()
}

/// Whether sample `s` was taken from `lag` before `change` appeared to [`SLACK`] after.
fn near(change: &Change, s: &EtcdSample, lag: Duration) -> bool {
    let from = change.at.checked_sub(lag).unwrap_or(change.at);
    s.at >= from && s.at <= change.at + SLACK
}

fn shown(members: &[SeenMember]) -> String {
    members
        .iter()
        .map(|m| {
            format!(
                "{}{}",
                if m.name.is_empty() {
                    format!("{:x}", m.id)
                } else {
                    m.name.clone()
                },
                match (m.alive, m.healthy) {
                    (_, true) => "",
                    (true, false) => " (alive, not healthy)",
                    (false, false) => " (down)",
                }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A member list: each member with its first client URL.
type Listed = Vec<(SeenMember, Option<String>)>;

/// etcd's member list and each member's answers. The list is asked of every seed at once and
/// the answer most of them give is taken: a member just removed may still answer with the list
/// it had, itself in it, until it stops.
pub fn sample(ctl: &Etcdctl, seeds: &[String]) -> Result<Vec<SeenMember>, String> {
    let answers: Vec<Result<Listed, String>> = std::thread::scope(|s| {
        let asks: Vec<_> = seeds
            .iter()
            .map(|seed| s.spawn(move || member_list(ctl, seed)))
            .collect();
        asks.into_iter()
            .map(|a| {
                a.join()
                    .unwrap_or_else(|_| Err("etcdctl thread panicked".into()))
            })
            .collect()
    });
    let mut votes: Vec<(Listed, usize)> = Vec::new();
    let mut last = "no endpoint to ask".to_string();
    for answer in answers {
        match answer {
            Ok(list) => match votes.iter_mut().find(|(l, _)| *l == list) {
                Some((_, n)) => *n += 1,
                None => votes.push((list, 1)),
            },
            Err(e) => last = e,
        }
    }
    let mut members = votes
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(l, _)| l)
        .ok_or(last)?;
    let urls: Vec<String> = members.iter().filter_map(|(_, u)| u.clone()).collect();
    if !urls.is_empty() {
        // Both at once: each waits for a frozen member until its timeout. Either exits 1 when
        // a member does not answer, with the others' JSON still on stdout.
        let (status, health) = std::thread::scope(|s| {
            let status = s.spawn(|| answered(ctl, &urls, "status", |_| true));
            let health = answered(ctl, &urls, "health", |a| {
                a["health"].as_bool() == Some(true)
            });
            (status.join().unwrap_or_default(), health)
        });
        for (m, url) in &mut members {
            if let Some(url) = url {
                m.alive = status.contains(url);
                m.healthy = health.contains(url);
            }
        }
    }
    Ok(members.into_iter().map(|(m, _)| m).collect())
}

/// `member list` as `seed` answers it: each member with its first client URL, sorted by ID.
fn member_list(ctl: &Etcdctl, seed: &str) -> Result<Listed, String> {
    let out = ctl
        .run(&[seed.to_string()], &["member", "list", "-w", "json"])
        .map_err(|e| e.to_string())?;
    let listed: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
    let mut members: Vec<(SeenMember, Option<String>)> = listed["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                SeenMember {
                    id: m["ID"].as_u64().unwrap_or(0),
                    name: m["name"].as_str().unwrap_or("").to_string(),
                    learner: m["isLearner"].as_bool().unwrap_or(false),
                    alive: false,
                    healthy: false,
                },
                m["clientURLs"][0].as_str().map(str::to_string),
            )
        })
        .collect();
    members.sort_by_key(|(m, _)| m.id);
    Ok(members)
}

/// The endpoints of `urls` whose `endpoint <what> -w json` entry passes `ok`.
fn answered(
    ctl: &Etcdctl,
    urls: &[String],
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Vec<String> {
    let Ok(out) = ctl.output(urls, &["endpoint", what, "-w", "json"]) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let Ok(answers) = serde_json::from_str::<Value>(&text) else {
        return Vec::new();
    };
    answers
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| ok(a))
        .filter_map(|a| {
            a["endpoint"]
                .as_str()
                .or_else(|| a["Endpoint"].as_str())
                .map(str::to_string)
        })
        .collect()
}

/// The recording threads of one story.
pub struct Truth {
    lag: Duration,
    stop: Arc<AtomicBool>,
    changes: Arc<Mutex<Vec<Change>>>,
    samples: Arc<Mutex<Vec<EtcdSample>>>,
    threads: Vec<JoinHandle<()>>,
}

/// The outcome: how much was checked, and what was false.
#[derive(Clone, Debug)]
pub struct Verdict {
    pub changes: usize,
    pub samples: usize,
    /// Changes with no answer of etcd near them (etcdctl failed throughout): not judged.
    pub unjudged: usize,
    pub false_claims: Vec<String>,
}

impl Verdict {
    /// Nothing false, and enough judged for that to mean something: at least one change, and
    /// at most a quarter of them without an answer of etcd near them.
    pub fn held(&self) -> bool {
        self.false_claims.is_empty() && self.changes > 0 && self.unjudged * 4 <= self.changes
    }
}

impl Truth {
    /// Starts recording `world`. `seeds` gives the etcd endpoints to ask for the member list
    /// (they change as members come and go).
    pub fn start(
        world: Arc<World>,
        ctl: Etcdctl,
        seeds: impl Fn() -> Vec<String> + Send + 'static,
    ) -> Truth {
        let lag = world.truth_lag();
        let stop = Arc::new(AtomicBool::new(false));
        let changes = Arc::new(Mutex::new(Vec::new()));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let watcher = {
            let (stop, changes) = (stop.clone(), changes.clone());
            std::thread::spawn(move || {
                let mut last = Conditions::default();
                for _ in 0..MAX_ROUNDS {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let c = world.conditions();
                    if c != last && c.quorum.is_some() {
                        lock(&changes).push(Change {
                            at: Instant::now(),
                            conditions: c.clone(),
                            machines: world.machines(),
                        });
                        last = c;
                    }
                    std::thread::sleep(POLL);
                }
            })
        };
        let sampler = {
            let (stop, samples) = (stop.clone(), samples.clone());
            let ctl = ctl.with_timeout(ETCDCTL_TIMEOUT);
            std::thread::spawn(move || {
                for _ in 0..MAX_ROUNDS {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(members) = sample(&ctl, &seeds()) {
                        // Timed when the member list and the answers are in: what they say
                        // was true no later than this.
                        let at = Instant::now();
                        lock(&samples).push(EtcdSample { at, members });
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Truth {
            lag,
            stop,
            changes,
            samples,
            threads: vec![watcher, sampler],
        }
    }

    /// Waits (at most `bound`) until etcd has answered once: else a story on a real API server
    /// (ready well after the first status) may act before etcd was ever sampled.
    pub async fn first_sample(&self, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        while lock(&self.samples).is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How far back etcd's answers count for a change (see the module documentation).
    pub fn lag(&self) -> Duration {
        self.lag
    }

    /// Stops recording and checks every change.
    pub fn finish(mut self) -> Verdict {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let changes = lock(&self.changes).clone();
        let samples = lock(&self.samples).clone();
        let false_claims = changes
            .iter()
            .flat_map(|c| false_claims(c, &samples, self.lag))
            .collect();
        let unjudged = changes
            .iter()
            .filter(|c| !samples.iter().any(|s| near(c, s, self.lag)))
            .count();
        Verdict {
            changes: changes.len(),
            samples: samples.len(),
            unjudged,
            false_claims,
        }
    }
}

impl Drop for Truth {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::Published;

    fn member(id: u64, name: &str, alive: bool, healthy: bool) -> SeenMember {
        SeenMember {
            id,
            name: name.into(),
            learner: false,
            alive,
            healthy,
        }
    }

    fn published(status: &str, reason: &str, message: &str) -> Option<Published> {
        Some(Published {
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
        })
    }

    fn machine(name: &str) -> MachineView {
        MachineView {
            name: name.into(),
            version: "v1".into(),
            deleting: false,
            finalizers: Vec::new(),
            annotations: Vec::new(),
            created: String::new(),
            node: Some(name.into()),
            remediable: true,
        }
    }

    #[test]
    fn a_leader_election_is_not_a_lost_quorum() {
        // Every member alive, none healthy: an election.
        let electing = [member(1, "a", true, false), member(2, "b", true, false)];
        assert!(!Claim::QuorumLost.holds(&electing));
        let lost = [
            member(1, "a", true, false),
            member(2, "b", false, false),
            member(3, "c", false, false),
        ];
        assert!(Claim::QuorumLost.holds(&lost));
    }

    #[test]
    fn claims_are_read_from_the_published_words() {
        let c = Conditions {
            quorum: published(
                "False",
                "MembersUnhealthy",
                "member a (id 1) is unhealthy: no answer within 1s; member (unstarted 5) (id 5) is unhealthy: member added but not started\ntable",
            ),
            next_action: published(
                "True",
                "RemediateMachine",
                &format!("Machine {NAMESPACE}/a has an unhealthy etcd member (x): ask KCP"),
            ),
        };
        assert_eq!(
            claims(&c, &[machine("a")]),
            [Claim::Unhealthy("a".into()), Claim::Unhealthy("a".into())]
        );
        let c = Conditions {
            quorum: published(
                "False",
                "MembershipMismatch",
                &format!("Machine {NAMESPACE}/old has no etcd member\ntable"),
            ),
            next_action: published(
                "True",
                "DeleteMachine",
                &format!("Machine {NAMESPACE}/old has a node but its etcd member is already gone"),
            ),
        };
        assert_eq!(
            claims(&c, &[machine("old")]),
            [Claim::NoMember("old".into()), Claim::NoMember("old".into())]
        );
        let c = Conditions {
            quorum: published("False", "QuorumLost", "etcd has lost quorum"),
            next_action: published("True", "RestoreQuorum", "restore"),
        };
        assert_eq!(claims(&c, &[]), [Claim::QuorumLost, Claim::QuorumLost]);
    }

    #[test]
    fn a_claim_must_hold_in_some_sample_near_it() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let samples = vec![
            EtcdSample {
                at: at(0),
                members: vec![member(1, "a", true, true), member(2, "b", true, true)],
            },
            EtcdSample {
                at: at(5000),
                members: vec![member(1, "a", true, true), member(2, "b", false, false)],
            },
        ];
        let change = |ms, reason: &str, message: &str| Change {
            at: at(ms),
            conditions: Conditions {
                quorum: published("False", reason, message),
                next_action: None,
            },
            machines: Vec::new(),
        };
        let lag = Duration::from_secs(2);
        // b was down at 5 s: a claim at 6 s holds; one at 1 s does not (only the 0 s sample is
        // near it, and b was healthy then).
        let claim = "member b (id 2) is unhealthy: no answer";
        assert!(false_claims(&change(6000, "MembersUnhealthy", claim), &samples, lag).is_empty());
        let wrong = false_claims(&change(1000, "MembersUnhealthy", claim), &samples, lag);
        assert_eq!(wrong.len(), 1, "{wrong:?}");
        assert!(wrong[0].starts_with("Unhealthy(\"b\")"), "{wrong:?}");
        // Quorum lost, with a and b alive: false.
        let lost = false_claims(&change(500, "QuorumLost", "lost"), &samples, lag);
        assert_eq!(lost.len(), 1);
        // Nothing sampled near it: not judged.
        assert!(false_claims(&change(3000, "QuorumLost", "lost"), &samples, lag).is_empty());
    }
}
