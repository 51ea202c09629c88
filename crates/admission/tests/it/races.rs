//! Races (issue 7, part 5): several client tasks at once send Machine DELETE reviews (different
//! Machines, dry runs and not, by the KCP controller and by a human), KCP `spec.replicas`
//! changes and `/scale` updates to one running guard over h2, as kube-apiserver does. The guard
//! probes a real etcd (TLS, loopback); its caches come from the API-server stand-in, and each
//! allowed deletion is applied there at once (a deletionTimestamp), as kube-apiserver would.
//!
//! The verdicts are then checked by an oracle of this file's own, not the engine's arithmetic:
//! with the members' true health (the test froze them), applying the allowed deletions in any
//! order (every subset is a prefix of some order) must keep a quorum of healthy voting members
//! and at least one member; and each allowed replica change, carried out by KCP one member at a
//! time after those deletions, in the worst order (healthy members first), must too.
//! Replica changes are not applied: they all start from the same object, so kube-apiserver
//! would let only one of them through; the oracle checks each.
//!
//! Rounds: 3 healthy members (two mixes), 3 with one frozen, 4 healthy, 4 with one frozen, and
//! 4 with one frozen where a scale-up to 5 is allowed first and the deletions race after it
//! (allowed scale-ups are carried out in the stand-in, as kube-apiserver would).
//! (5 members would need more etcd processes than the 2-core test machines run at once.)

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumguard_cli::server::{self, Running};
use quorumguard_engine::{EtcdState, Health};
use serde_json::json;
use testkit::apiserver::{ApiServer, kcp_resource, machine_resource};
use testkit::etcd::EtcdCluster;
use testkit::guard::{self, Answer, KCPS, MACHINES, delete_review, replicas_review};
use testkit::https::{TempDir, TestPki};
use testkit::reviews::{KCP_CONTROLLER, NS};
use testkit::seed::{self, KCP, wait_for};
use tokio::sync::Barrier;

const JANE: &str = "jane@example.com";
const ADMIN: &str = "admin";
/// Client tasks sending at once.
const CLIENTS: usize = 6;
/// Operations per round.
const OPS: usize = 30;

#[derive(Clone, Debug)]
enum Op {
    Delete {
        member: usize,
        user: &'static str,
        dry_run: bool,
    },
    Replicas {
        to: i64,
        user: &'static str,
        scale: bool,
    },
}

/// A small deterministic generator (xorshift64*), so that a failing round can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// `OPS` operations on an `n`-member control plane: mostly deletions.
fn mix(n: usize, seed: u64) -> Vec<Op> {
    let mut rng = Rng(seed);
    (0..OPS)
        .map(|_| {
            if rng.below(4) == 0 {
                let mut to = 1 + rng.below(n as u64 + 2) as i64;
                if to == n as i64 {
                    to += 1;
                }
                Op::Replicas {
                    to,
                    user: if rng.below(2) == 0 {
                        KCP_CONTROLLER
                    } else {
                        ADMIN
                    },
                    scale: rng.below(2) == 0,
                }
            } else {
                Op::Delete {
                    member: rng.below(n as u64) as usize,
                    user: if rng.below(3) == 0 {
                        JANE
                    } else {
                        KCP_CONTROLLER
                    },
                    dry_run: rng.below(4) == 0,
                }
            }
        })
        .collect()
}

/// The oracle's view of etcd: voting members and how many of them are healthy.
#[derive(Clone, Copy, Debug)]
struct Etcd {
    voting: usize,
    healthy: usize,
}

impl Etcd {
    fn quorate(self) -> bool {
        self.voting >= 1 && self.healthy > self.voting / 2
    }
}

/// `health[i]`: whether member `i` is healthy. `gone`: removed members.
fn after(health: &[bool], gone: &BTreeSet<usize>) -> Etcd {
    Etcd {
        voting: health.len() - gone.len(),
        healthy: (0..health.len())
            .filter(|i| health[*i] && !gone.contains(i))
            .count(),
    }
}

/// Why the allowed set is unsafe, if it is.
fn unsafe_order(
    health: &[bool],
    deleted: &BTreeSet<usize>,
    by_kcp: &BTreeSet<usize>,
    replicas: &[(i64, String)],
) -> Option<String> {
    let d: Vec<usize> = deleted.iter().copied().collect();
    for gone in subsets(&d) {
        let e = after(health, &gone);
        if !e.quorate() {
            return Some(format!(
                "deleting the Machines of members {gone:?} leaves {e:?}"
            ));
        }
    }
    let base = after(health, deleted);
    for (to, who) in replicas {
        let to = *to as usize;
        let mut e = base;
        if to < e.voting {
            // KCP removes one member at a time; the worst case takes healthy ones first.
            for _ in to..e.voting {
                e.healthy = e.healthy.saturating_sub(1);
                e.voting -= 1;
                if !e.quorate() {
                    return Some(format!(
                        "after deleting {deleted:?}, scaling to {to} ({who}) reaches {e:?}"
                    ));
                }
            }
        } else if to > health.len() {
            // KCP adds one member at a time, and the first one votes before it is healthy; it
            // may come after any of the people's deletions, but after every deletion of KCP's
            // own (KCP creates no Machine while one is being deleted, and remediates before it
            // scales up: docs/rules.md, pending joins). A single member may still grow (the
            // docs/rules.md's SingleMemberScaleUp: it is the only way).
            for gone in subsets(&d).into_iter().filter(|g| by_kcp.is_subset(g)) {
                let mut e = after(health, &gone);
                if e.voting == 1 && e.healthy == 1 {
                    continue;
                }
                e.voting += 1;
                if !e.quorate() {
                    return Some(format!(
                        "after deleting {gone:?}, scaling to {to} ({who}) adds a member to reach {e:?}"
                    ));
                }
            }
        }
    }
    None
}

/// Every subset of `d`: the deletions done by some point of some order.
fn subsets(d: &[usize]) -> Vec<BTreeSet<usize>> {
    (0u32..(1 << d.len()))
        .map(|bits| {
            (0..d.len())
                .filter(|j| bits & (1 << j) != 0)
                .map(|j| d[j])
                .collect()
        })
        .collect()
}

/// Healthy members the guard's state holds for cluster `test`, once probed without error and
/// every member's health is settled.
fn healthy_members(running: &Running) -> Option<usize> {
    if running.state.probe_error(NS, "test").is_some() {
        return None;
    }
    match running
        .state
        .control_plane(NS, KCP, Instant::now())
        .ok()?
        .etcd
    {
        // Settled: no member unknown or awaiting confirmation (a frozen member is unknown
        // until a second probe confirms it).
        EtcdState::Observed(s) => s
            .members
            .iter()
            .all(|m| matches!(m.health, Health::Healthy | Health::Unhealthy(_)))
            .then(|| s.members.iter().filter(|m| m.health.is_healthy()).count()),
        EtcdState::Unknown { .. } => None,
    }
}

/// One round: a fresh guard over `etcd` (with the members in `frozen` frozen), the `first` ops
/// sent one after another, then `ops` sent by [`CLIENTS`] tasks at once. Allowed deletions and
/// scale-ups are carried out in the stand-in as kube-apiserver would. Returns the answers.
async fn round(
    name: &str,
    etcd: &mut EtcdCluster,
    frozen: &[usize],
    first: Vec<Op>,
    ops: Vec<Op>,
) -> Vec<(Op, Answer)> {
    let n = etcd.len();
    let api = Arc::new(ApiServer::start().await.expect("stand-in"));
    let members = seed::control_plane(&api, etcd, seed::direct_to(etcd), |k| {
        k["spec"]["replicas"] = json!(n);
    });
    let dir = TempDir::new("races");
    let pki = TestPki::new(dir.path());
    // Allowed deletions are applied to the stand-in at once, so a reservation ends when the
    // cache shows the deletion, long before this TTL.
    let config = guard::serve_config(
        &pki,
        Duration::from_millis(300),
        Duration::from_secs(30),
        None,
    );
    let running = server::start(config, api.client().expect("client"))
        .await
        .expect("start");
    for i in frozen {
        etcd.freeze(*i);
    }
    let healthy = n - frozen.len();
    wait_for(
        &format!("{name}: {healthy} healthy members probed"),
        Duration::from_secs(20),
        || healthy_members(&running) == Some(healthy),
    )
    .await;

    let tls = pki.client(&[b"h2"]);
    let members = Arc::new(members);
    let addr = running.addr;
    let mut answers = Vec::new();
    for (i, op) in first.into_iter().enumerate() {
        let a = send(addr, &tls, &api, &members, &format!("first-{i}"), &op).await;
        answers.push((op, a));
    }
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let mine: Vec<(usize, Op)> = ops
            .iter()
            .cloned()
            .enumerate()
            .filter(|(i, _)| i % CLIENTS == c)
            .collect();
        let (barrier, tls, api, members) =
            (barrier.clone(), tls.clone(), api.clone(), members.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut out = Vec::new();
            for (i, op) in mine {
                let a = send(addr, &tls, &api, &members, &format!("op-{i}"), &op).await;
                out.push((op, a));
            }
            out
        }));
    }
    for t in tasks {
        answers.extend(t.await.expect("client task"));
    }
    running.shutdown().await;
    for i in frozen {
        etcd.thaw(*i);
    }
    answers
}

/// Sends `op` to the webhook at `addr`; when allowed (and not a dry run), carries it out in the
/// stand-in as kube-apiserver would: a deletion marks the Machine deleting (it has a
/// finalizer), a scale-up raises spec.replicas (the largest allowed wins).
async fn send(
    addr: std::net::SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    api: &ApiServer,
    members: &[String],
    uid: &str,
    op: &Op,
) -> Answer {
    let (path, body) = match op {
        Op::Delete {
            member,
            user,
            dry_run,
        } => (
            MACHINES,
            delete_review(&members[*member], user, *dry_run, uid),
        ),
        Op::Replicas { to, user, scale } => (
            KCPS,
            replicas_review(members.len() as i64, *to, user, *scale, uid),
        ),
    };
    let a = guard::review(addr, tls.clone(), path, &body)
        .await
        .unwrap_or_else(|e| panic!("op {uid} {op:?}: {e}"));
    if !a.allowed {
        return a;
    }
    match op {
        Op::Delete {
            member,
            dry_run: false,
            ..
        } => {
            api.modify(
                &machine_resource(),
                NS,
                &format!("test-{}", members[*member]),
                |m| {
                    m["metadata"]["finalizers"] = json!(["machine.cluster.x-k8s.io"]);
                    m["metadata"]["deletionTimestamp"] =
                        json!(k8s_openapi::jiff::Timestamp::now().to_string());
                },
            )
            .expect("mark the Machine deleted");
        }
        Op::Replicas { to, .. } if *to > members.len() as i64 => {
            api.modify(&kcp_resource(), NS, KCP, |k| {
                let now = k["spec"]["replicas"].as_i64().unwrap_or(0);
                k["spec"]["replicas"] = json!(now.max(*to));
            })
            .expect("raise spec.replicas");
        }
        _ => {}
    }
    a
}

/// Checks one round's allowed set with the oracle; returns a one-line summary.
fn check(name: &str, health: &[bool], answers: &[(Op, Answer)]) -> String {
    let mut deleted = BTreeSet::new();
    let mut by_kcp = BTreeSet::new();
    let mut replicas = Vec::new();
    let mut dry_allowed = 0;
    for (op, a) in answers {
        if !a.allowed {
            continue;
        }
        match op {
            Op::Delete {
                member,
                user,
                dry_run: false,
            } => {
                // A Machine already deleting is allowed again (AlreadyDeleting): one removal.
                deleted.insert(*member);
                if *user == KCP_CONTROLLER {
                    by_kcp.insert(*member);
                }
            }
            Op::Delete { dry_run: true, .. } => dry_allowed += 1,
            Op::Replicas { to, user, .. } => replicas.push((*to, format!("{user}: {}", a.reason))),
        }
    }
    let log: Vec<String> = answers
        .iter()
        .map(|(op, a)| format!("{op:?} -> {} {}", a.allowed, a.reason))
        .collect();
    if let Some(why) = unsafe_order(health, &deleted, &by_kcp, &replicas) {
        panic!(
            "{name}: the allowed operations are not safe in every order: {why}\n{}",
            log.join("\n")
        );
    }
    format!(
        "{name}: {} ops, deletions allowed {deleted:?}, dry runs allowed {dry_allowed}, replica changes allowed {:?}",
        answers.len(),
        replicas.iter().map(|r| r.0).collect::<Vec<_>>()
    )
}

/// A round of a [`mix`]: its name, the members frozen during it, the mix's seed.
type Round<'a> = (&'a str, &'a [usize], u64);

/// Rounds of [`mix`]es over `etcd`, each `(name, frozen members, seed)`, checked by the
/// oracle; the members are thawed and healthy again after each.
async fn mixed_rounds(etcd: &mut EtcdCluster, rounds: &[Round<'_>]) -> Vec<String> {
    let n = etcd.len();
    let mut out = Vec::new();
    for (name, frozen, seed) in rounds {
        let health: Vec<bool> = (0..n).map(|i| !frozen.contains(&i)).collect();
        let answers = round(name, etcd, frozen, Vec::new(), mix(n, *seed)).await;
        out.push(check(name, &health, &answers));
        etcd.wait_healthy((0..n).collect());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deletions_and_replica_changes_are_safe_in_any_order() {
    let started = Instant::now();
    let mut summaries = Vec::new();

    let mut etcd = EtcdCluster::start(3);
    // Healthy, deletions only, by the controller. By the rules of docs/rules.md (removals in any order,
    // healthy members first) two would keep quorum (3 -> 2 -> 1), but with spec.replicas 3 KCP
    // then replaces them, and its first new member would join a single healthy one (1 of 2,
    // quorum 2): exactly one may pass.
    let only_deletes: Vec<Op> = (0..OPS)
        .map(|i| Op::Delete {
            member: i % 3,
            user: KCP_CONTROLLER,
            dry_run: i % 5 == 4,
        })
        .collect();
    let answers = round(
        "3 healthy, deletions",
        &mut etcd,
        &[],
        Vec::new(),
        only_deletes,
    )
    .await;
    summaries.push(check("3 healthy, deletions", &[true; 3], &answers));
    let allowed: BTreeSet<String> = answers
        .iter()
        .filter(|(op, a)| a.allowed && matches!(op, Op::Delete { dry_run: false, .. }))
        .map(|(op, _)| format!("{op:?}"))
        .collect();
    let members_allowed: BTreeSet<usize> = answers
        .iter()
        .filter_map(|(op, a)| match op {
            Op::Delete {
                member,
                dry_run: false,
                ..
            } if a.allowed => Some(*member),
            _ => None,
        })
        .collect();
    // KCP's own deletions: the first is reserved, the second leaves 1 healthy of 1 in every
    // order (KCP's replacements come only after both, as it creates no Machine while one is
    // being deleted: issue 36), the third would remove the last member. Before issue 36 the
    // replacement was counted as a join that could come between them, and only one went.
    assert_eq!(
        members_allowed.len(),
        2,
        "two Machines of a healthy 3-member control plane may go by KCP's hand, never three; not {allowed:?}"
    );

    let rounds: [(usize, &[Round]); 2] = [
        (
            3,
            &[
                ("3 healthy, mixed", &[], 7),
                ("3 with one frozen, mixed", &[2], 11),
            ],
        ),
        (
            4,
            &[
                ("4 healthy, mixed", &[], 13),
                ("4 with one frozen, mixed", &[3], 17),
            ],
        ),
    ];
    let mut etcd = Some(etcd);
    for (n, rounds) in rounds {
        // One cluster at a time: the old one goes before the next starts.
        let mut cluster = match etcd.take() {
            Some(c) if c.len() == n => c,
            other => {
                drop(other);
                EtcdCluster::start(n)
            }
        };
        summaries.extend(mixed_rounds(&mut cluster, rounds).await);
        etcd = Some(cluster);
    }
    // The scale-up-then-delete order: 4 members, one frozen; 4 -> 5 first (allowed: 3 healthy
    // of 5), then the controller and a person race to delete every Machine. A healthy one's
    // deletion would leave 2 healthy of 4 voting members once the fifth member is in.
    let mut cluster = match etcd.take() {
        Some(c) if c.len() == 4 => c,
        other => {
            drop(other);
            EtcdCluster::start(4)
        }
    };
    let scale_up = vec![Op::Replicas {
        to: 5,
        user: ADMIN,
        scale: true,
    }];
    let deletions: Vec<Op> = (0..OPS)
        .map(|i| Op::Delete {
            member: i % 4,
            user: if i % 3 == 0 { JANE } else { KCP_CONTROLLER },
            dry_run: i % 7 == 6,
        })
        .collect();
    let name = "4 with one frozen, scale-up then deletions";
    let answers = round(name, &mut cluster, &[3], scale_up, deletions).await;
    assert!(
        answers[0].1.allowed,
        "the scale-up 4 -> 5 with 3 healthy is allowed: {:?}",
        answers[0].1
    );
    summaries.push(check(name, &[true, true, true, false], &answers));
    drop(cluster);
    for s in &summaries {
        println!("{s}");
    }
    println!("all rounds in {:?}", started.elapsed());
}

#[test]
fn the_oracle_rejects_what_it_must() {
    let healthy3 = [true; 3];
    let one_down = [true, true, false];
    let set = |v: &[usize]| v.iter().copied().collect::<BTreeSet<usize>>();
    let to = |n: i64| vec![(n, "test".to_string())];
    // Removals in any order, the model of docs/rules.md: 3 healthy, two removed leaves 1 of 1.
    assert!(unsafe_order(&healthy3, &set(&[0]), &BTreeSet::new(), &[]).is_none());
    assert!(unsafe_order(&healthy3, &set(&[0, 1]), &BTreeSet::new(), &[]).is_none());
    assert!(unsafe_order(&healthy3, &set(&[0, 1, 2]), &BTreeSet::new(), &[]).is_some());
    // One frozen: removing a healthy one leaves 1 healthy of 2; the frozen one, 2 of 2.
    assert!(unsafe_order(&one_down, &set(&[0]), &BTreeSet::new(), &[]).is_some());
    assert!(unsafe_order(&one_down, &set(&[2]), &BTreeSet::new(), &[]).is_none());
    // 4 with one frozen: removing two healthy ones, one of them first, leaves 2 healthy of 3,
    // then 1 of 2.
    assert!(
        unsafe_order(
            &[true, true, true, false],
            &set(&[0, 1]),
            &BTreeSet::new(),
            &[]
        )
        .is_some()
    );
    // Scaling down to 2 with one frozen: KCP may remove a healthy member first.
    assert!(unsafe_order(&one_down, &set(&[]), &BTreeSet::new(), &to(2)).is_some());
    // ... unless the frozen one is being deleted already.
    assert!(unsafe_order(&one_down, &set(&[2]), &BTreeSet::new(), &to(2)).is_none());
    // Scaling up: the new member votes before it is healthy: 2 healthy of 4.
    assert!(unsafe_order(&one_down, &set(&[]), &BTreeSet::new(), &to(4)).is_some());
    // 4 with one frozen, a healthy one's Machine deleted: then 2 healthy of 4 again.
    let four_one_down = [true, true, true, false];
    assert!(unsafe_order(&four_one_down, &set(&[]), &BTreeSet::new(), &to(5)).is_none());
    assert!(unsafe_order(&four_one_down, &set(&[0]), &BTreeSet::new(), &to(5)).is_some());
    // From a single member left, growing is the only way.
    assert!(unsafe_order(&healthy3, &set(&[0, 1]), &BTreeSet::new(), &to(4)).is_none());
    assert!(unsafe_order(&healthy3, &set(&[]), &BTreeSet::new(), &to(1)).is_none());
}
