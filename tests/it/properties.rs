//! Property tests (issue 7): random control planes and operations against an independent
//! quorum oracle, random AdmissionReviews through the whole review path, and random dumps
//! through `quorumguard check`'s parsing and analysis.
//!
//! The oracle is written from docs/rules.md, member by member: it enumerates every
//! health the unknown members may have and every set of removals, where the engine reasons on
//! counts and worst orders. Every allowed verdict must be one the rules permit: its reason's
//! condition holds, and a verdict that claims quorum safety is safe in every world.
//!
//! Case counts keep the file well under a minute in the dev profile; `PROPTEST_CASES=N` runs N
//! cases of every property instead. A failure is shrunk and its seed saved in
//! tests/it/properties.proptest-regressions, which is committed so that it is replayed first.

use std::collections::BTreeMap;
use std::time::Duration;

// `::testkit`: the engine (glob-imported below) has a `testkit` module of its own.
use ::testkit::reviews::{NS, cluster_object, fixture, kcp_object, machine_named, members};
use proptest::prelude::*;
use proptest::test_runner::Config;
use quorumguard::admission::Webhook;
use quorumguard::admission::review::{self, Endpoint};
use quorumguard::cli::check::{self, WhatIf};
use quorumguard::dumps::{self, DumpTexts, etcdctl};
use quorumguard::engine::*;
use serde_json::{Value, json};

/// `cases` cases, unless PROPTEST_CASES says otherwise.
fn config(cases: u32) -> Config {
    let mut c = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    c
}

// ---------------------------------------------------------------------------------------------
// Random control planes and operations, against the oracle.

const NOW: i64 = 1_800_000_000;
const TEARDOWN: &str = "system:kube-controller-manager";

/// One etcd member and the Machine it belongs to, if any.
#[derive(Clone, Debug)]
struct MemberSpec {
    learner: bool,
    /// 0 healthy, 1 unhealthy, 2 unknown.
    health: u8,
    unstarted: bool,
    /// 0 none, 1 NOSPACE, 2 CORRUPT, 3 another alarm.
    alarm: u8,
    machine: Option<MachineSpec>,
}

#[derive(Clone, Debug)]
struct MachineSpec {
    deleting: bool,
    control_plane: bool,
    /// The nodeRef names the member (else unset: the Machine is named after the member).
    node_ref: bool,
    delete_machine: bool,
    /// The break-glass annotation: absent, empty, blank or with a reason.
    break_glass: Option<&'static str>,
    move_annotation: bool,
    young: bool,
}

/// A Machine without a member.
#[derive(Clone, Debug)]
struct ExtraSpec {
    node: bool,
    machine: MachineSpec,
}

#[derive(Clone, Debug)]
struct World {
    members: Vec<MemberSpec>,
    extras: Vec<ExtraSpec>,
    replicas: u32,
    external: bool,
    kcp_deleting: bool,
    cluster_deleting: bool,
    max_surge: u32,
    /// 0 observed now, 1 observed and stale, 2 dump (no age), 3 member list unknown.
    etcd: u8,
}

fn machine_spec() -> impl Strategy<Value = MachineSpec> {
    (
        prop::bool::weighted(0.25),
        prop::bool::weighted(0.95),
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.2),
        prop::sample::select(vec![
            None,
            None,
            None,
            None,
            Some(""),
            Some("  "),
            Some("why"),
        ]),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.2),
    )
        .prop_map(
            |(deleting, control_plane, node_ref, delete_machine, break_glass, mv, young)| {
                MachineSpec {
                    deleting,
                    control_plane,
                    node_ref,
                    delete_machine,
                    break_glass,
                    move_annotation: mv,
                    young,
                }
            },
        )
}

fn member_spec() -> impl Strategy<Value = MemberSpec> {
    (
        prop::bool::weighted(0.15),
        prop::sample::select(vec![0u8, 0, 0, 1, 2]),
        prop::bool::weighted(0.05),
        prop::sample::select(vec![0u8, 0, 0, 0, 0, 0, 1, 2, 3]),
        prop::option::weighted(0.9, machine_spec()),
    )
        .prop_map(|(learner, health, unstarted, alarm, machine)| MemberSpec {
            learner,
            health,
            unstarted,
            alarm,
            machine,
        })
}

fn world() -> impl Strategy<Value = World> {
    (
        prop::collection::vec(member_spec(), 0..=7),
        prop::collection::vec(
            (any::<bool>(), machine_spec()).prop_map(|(node, machine)| ExtraSpec { node, machine }),
            0..=2,
        ),
        0u32..=7,
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.05),
        0u32..=1,
        prop::sample::select(vec![0u8, 0, 0, 0, 1, 2, 3]),
    )
        .prop_map(
            |(members, extras, replicas, external, kcp_deleting, cluster_deleting, surge, etcd)| {
                World {
                    members,
                    extras,
                    replicas,
                    external,
                    kcp_deleting,
                    cluster_deleting,
                    max_surge: surge,
                    etcd,
                }
            },
        )
}

fn machine_of_spec(name: &str, node: Option<String>, s: &MachineSpec) -> Machine {
    let mut m = Machine::new(name);
    m.node_name = node;
    m.deleting = s.deleting;
    m.control_plane = s.control_plane;
    m.created_unix = Some(if s.young { NOW - 30 } else { NOW - 86_400 });
    if s.delete_machine {
        m.annotations
            .insert(ANNOTATION_DELETE_MACHINE.into(), String::new());
    }
    if let Some(why) = s.break_glass {
        m.annotations
            .insert(ANNOTATION_BREAK_GLASS.into(), why.to_string());
    }
    if s.move_annotation {
        m.annotations
            .insert(ANNOTATION_DELETE_FOR_MOVE.into(), String::new());
    }
    m
}

/// The engine's control plane of a world. Member and Machine names are unique.
fn build(w: &World) -> ControlPlane {
    let mut etcd_members = Vec::new();
    let mut machines = Vec::new();
    for (i, s) in w.members.iter().enumerate() {
        let name = format!("node-{i}");
        let mut m = Member::new(0x100 + i as u64, if s.unstarted { "" } else { &name });
        m.is_learner = s.learner;
        m.health = match s.health {
            0 => Health::Healthy,
            1 => Health::Unhealthy("context deadline exceeded".into()),
            _ => Health::Unknown,
        };
        match s.alarm {
            1 => m.alarms.push(Alarm::NoSpace),
            2 => m.alarms.push(Alarm::Corrupt),
            3 => m.alarms.push(Alarm::Other("SOMETHING".into())),
            _ => {}
        }
        etcd_members.push(m);
        if let Some(ms) = &s.machine {
            // With a nodeRef the Machine has its own name; without, it is named as the member.
            let (mname, node) = if ms.node_ref {
                (format!("machine-{i}"), Some(name.clone()))
            } else {
                (name.clone(), None)
            };
            machines.push(machine_of_spec(&mname, node, ms));
        }
    }
    for (i, e) in w.extras.iter().enumerate() {
        let node = e.node.then(|| format!("gone-{i}"));
        machines.push(machine_of_spec(&format!("extra-{i}"), node, &e.machine));
    }
    let etcd = match w.etcd {
        3 => EtcdState::Unknown {
            reason: "no probe yet".into(),
        },
        e => EtcdState::Observed(EtcdSnapshot {
            members: etcd_members,
            age: match e {
                0 => Some(Duration::from_secs(3)),
                1 => Some(Duration::from_secs(600)),
                _ => None,
            },
        }),
    };
    ControlPlane {
        cluster: Cluster {
            name: "c".into(),
            deleting: w.cluster_deleting,
            paused: false,
        },
        kcp: Kcp {
            name: "kcp".into(),
            namespace: "ns".into(),
            replicas: w.replicas,
            etcd: if w.external {
                EtcdTopology::External
            } else {
                EtcdTopology::Stacked
            },
            max_surge: w.max_surge,
            deleting: w.kcp_deleting,
            version: Some("v1.33.1".into()),
            etcd_learner_mode: None,
            paused: false,
        },
        health_checks: HealthChecks::Known(vec![HealthCheck::covering("kcp-mhc", &machines)]),
        machines,
        etcd,
    }
}

/// A member's health as the rules read it (docs/rules.md, "Counting"): unstarted or with a
/// CORRUPT alarm is down (a NOSPACE alarm stops writes, not raft: it changes nothing here); a
/// stale probe proves nothing. `None` is unknown.
fn oracle_health(m: &Member, stale: bool) -> Option<bool> {
    if m.name.is_empty() {
        return Some(false);
    }
    if stale {
        return None;
    }
    if m.alarms.iter().any(|a| matches!(a, Alarm::Corrupt)) {
        return Some(false);
    }
    match m.health {
        Health::Healthy => Some(true),
        Health::Unhealthy(_) => Some(false),
        Health::Unknown | Health::Unconfirmed(_) => None,
    }
}

/// A probe older than the policy's limit, or none: health proves nothing.
fn is_stale(cp: &ControlPlane, policy: &Policy) -> bool {
    match &cp.etcd {
        EtcdState::Observed(s) => s.age.is_some_and(|a| a > policy.max_health_age),
        EtcdState::Unknown { .. } => true,
    }
}

/// The oracle's view: voting members with their health (None unknown), by member ID.
struct Voters {
    health: BTreeMap<u64, Option<bool>>,
}

impl Voters {
    fn of(cp: &ControlPlane, stale: bool) -> Voters {
        Voters {
            health: cp
                .members()
                .iter()
                .filter(|m| !m.is_learner)
                .map(|m| (m.id.0, oracle_health(m, stale)))
                .collect(),
        }
    }

    /// As raft counts votes (what a lost quorum means): a member whose only fault is a CORRUPT
    /// alarm still votes (docs/rules.md).
    fn raft_of(cp: &ControlPlane, stale: bool) -> Voters {
        Voters {
            health: cp
                .members()
                .iter()
                .filter(|m| !m.is_learner)
                .map(|m| {
                    let corrupt =
                        !m.name.is_empty() && m.alarms.iter().any(|a| matches!(a, Alarm::Corrupt));
                    let h = match (&m.health, corrupt, stale) {
                        (Health::Unhealthy(_), true, _) => Some(false),
                        (_, true, true) => None,
                        (Health::Healthy, true, false) => Some(true),
                        (_, true, false) => None,
                        _ => oracle_health(m, stale),
                    };
                    (m.id.0, h)
                })
                .collect(),
        }
    }

    /// The world where every unknown member is up (`true`) or down.
    fn assuming(&self, up: bool) -> BTreeMap<u64, bool> {
        self.health
            .iter()
            .map(|(id, h)| (*id, h.unwrap_or(up)))
            .collect()
    }

    fn unknown(&self) -> Vec<u64> {
        self.health
            .iter()
            .filter(|(_, h)| h.is_none())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Every world: each unknown member up or down.
    fn worlds(&self) -> Vec<BTreeMap<u64, bool>> {
        let unknown = self.unknown();
        (0..1u32 << unknown.len())
            .map(|bits| {
                self.health
                    .iter()
                    .map(|(id, h)| {
                        let up = match h {
                            Some(up) => *up,
                            None => {
                                let i = unknown.iter().position(|u| u == id).unwrap_or(0);
                                bits & (1 << i) != 0
                            }
                        };
                        (*id, up)
                    })
                    .collect()
            })
            .collect()
    }
}

/// Votes needed out of `n` (etcd's quorum).
fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// Whether removing the members `gone` loses quorum in `world` (removing all of them does),
/// with `joined` newcomers voting and not yet healthy.
fn fails(world: &BTreeMap<u64, bool>, gone: &[u64], joined: usize) -> bool {
    let left: Vec<bool> = world
        .iter()
        .filter(|(id, _)| !gone.contains(id))
        .map(|(_, up)| *up)
        .collect();
    left.is_empty() || left.iter().filter(|u| **u).count() < majority(left.len() + joined)
}

fn subsets(of: &[u64]) -> Vec<Vec<u64>> {
    (0..1u32 << of.len())
        .map(|bits| {
            of.iter()
                .enumerate()
                .filter(|(i, _)| bits & (1 << i) != 0)
                .map(|(_, id)| *id)
                .collect()
        })
        .collect()
}

/// The member a Machine owns: started, named as its node (or as the Machine without one).
fn member_of<'a>(cp: &'a ControlPlane, m: &Machine) -> Option<&'a Member> {
    let name = m.node_name.as_deref().unwrap_or(&m.name);
    cp.members()
        .iter()
        .find(|x| !x.name.is_empty() && x.name == name)
}

/// Deleting `me` is safe in `world`: no set of the pending removals, with or without a member
/// joining (`join`: one newcomer that votes before it is healthy), loses quorum together with
/// it unless it already does without it (the empty set without a newcomer: `me` alone keeps
/// quorum, i.e. the healthy members left reach the quorum of the voting members left).
fn delete_safe_in(world: &BTreeMap<u64, bool>, me: u64, pending: &[u64], join: bool) -> bool {
    subsets(pending).iter().all(|s| {
        (0..=join as usize).all(|j| {
            let mut with = s.clone();
            with.push(me);
            !fails(world, &with, j) || ((!s.is_empty() || j > 0) && fails(world, s, j))
        })
    })
}

/// A voting member about to join while `m` is deleted (docs/rules.md, "Pending joins"): none is under way already (an
/// unstarted member or a learner), and another control-plane Machine not being deleted has no
/// member and was created within the join grace, or those Machines are fewer than
/// spec.replicas (KCP adds one).
fn joining(cp: &ControlPlane, m: &Machine, who: &Requester, policy: &Policy) -> bool {
    if learner_joins(cp) {
        return false;
    }
    if cp
        .members()
        .iter()
        .any(|x| x.name.is_empty() || x.is_learner)
    {
        return false;
    }
    let others: Vec<&Machine> = cp
        .machines
        .iter()
        .filter(|o| o.control_plane && !o.deleting && o.name != m.name)
        .collect();
    let grace = policy.join_grace.as_secs() as i64;
    others
        .iter()
        .any(|o| member_of(cp, o).is_none() && o.created_unix.is_some_and(|c| NOW - c < grace))
        // KCP's own deletion comes before the replacement it makes for it (docs/rules.md).
        || (!policy.is_controller(who) && others.len() < cp.kcp.replicas as usize)
}

/// Whether kubeadm joins learners (docs/rules.md, how members join): from v1.29 with the gate
/// unset, which is what these control planes carry; written here apart from the engine's.
fn learner_joins(cp: &ControlPlane) -> bool {
    let minor = cp
        .kcp
        .version
        .as_deref()
        .and_then(|v| v.strip_prefix("v1."))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    cp.kcp.etcd_learner_mode.is_none() && minor.is_some_and(|m| m >= 29)
}

/// The desired-replicas rule for humans (docs/rules.md): the Machines not being deleted, minus this
/// one and minus those with a node but no member, are at least spec.replicas; or this one
/// never joined.
fn desired_replicas_hold(cp: &ControlPlane, m: &Machine) -> bool {
    let observed = matches!(cp.etcd, EtcdState::Observed(_));
    let remaining = cp
        .machines
        .iter()
        .filter(|o| o.control_plane && !o.deleting && o.name != m.name)
        .filter(|o| !(observed && o.node_name.is_some() && member_of(cp, o).is_none()))
        .count();
    let never_joined = m.node_name.is_none() && observed && member_of(cp, m).is_none();
    remaining >= cp.kcp.replicas as usize || never_joined
}

/// Checks an allowed Machine deletion against the rules; `Err` says what is wrong.
fn check_delete(
    cp: &ControlPlane,
    m: &Machine,
    who: &Requester,
    policy: &Policy,
    v: &Verdict,
) -> Result<(), String> {
    let bg = m
        .annotation(ANNOTATION_BREAK_GLASS)
        .is_some_and(|s| !s.trim().is_empty());
    let stale = is_stale(cp, policy);
    let ok = |cond: bool, what: &str| if cond { Ok(()) } else { Err(what.to_string()) };
    let controller = policy.is_controller(who);
    let human_rule = || {
        ok(
            controller || desired_replicas_hold(cp, m),
            "desired replicas",
        )
    };
    match v.reason {
        Reason::NotControlPlane => ok(!m.control_plane, "has the label"),
        Reason::AlreadyDeleting => ok(m.deleting, "not deleting"),
        Reason::ClusterDeleting => ok(cp.cluster.deleting, "cluster not deleting"),
        Reason::ControlPlaneDeleting => ok(cp.kcp.deleting, "kcp not deleting"),
        Reason::ClusterctlMove => ok(
            m.annotation(ANNOTATION_DELETE_FOR_MOVE).is_some(),
            "no move annotation",
        ),
        Reason::TeardownRequester => ok(policy.is_teardown(who), "not teardown"),
        Reason::BreakGlass => ok(bg, "no break-glass reason"),
        Reason::ExternalEtcd => ok(cp.kcp.etcd == EtcdTopology::External, "stacked"),
        Reason::MemberAbsent => {
            ok(
                matches!(cp.etcd, EtcdState::Observed(_)) && member_of(cp, m).is_none(),
                "has a member",
            )?;
            human_rule()
        }
        Reason::LearnerMember => {
            ok(
                member_of(cp, m).is_some_and(|x| x.is_learner),
                "not a learner",
            )?;
            human_rule()
        }
        Reason::QuorumSafe | Reason::HealthUnknown => {
            if v.reason == Reason::HealthUnknown {
                ok(
                    policy.on_unknown_health(who) == OnUnknownHealth::Allow,
                    "policy denies",
                )?;
            }
            let Some(me) = member_of(cp, m) else {
                return ok(
                    v.reason == Reason::HealthUnknown
                        && matches!(cp.etcd, EtcdState::Unknown { .. }),
                    "no member",
                );
            };
            ok(!me.is_learner, "learner")?;
            let voters = Voters::of(cp, stale);
            let pending: Vec<u64> = cp
                .machines
                .iter()
                .filter(|o| o.deleting && o.name != m.name)
                .filter_map(|o| member_of(cp, o))
                .filter(|p| !p.is_learner && p.id != me.id)
                .map(|p| p.id.0)
                .collect();
            let join = joining(cp, m, who, policy);
            let safe: Vec<bool> = voters
                .worlds()
                .iter()
                .map(|w| delete_safe_in(w, me.id.0, &pending, join))
                .collect();
            // Quorum lost even if every unknown member is healthy: recovery needs every member.
            ok(
                !fails(&Voters::raft_of(cp, stale).assuming(true), &[], 0),
                "quorum already lost",
            )?;
            if v.reason == Reason::QuorumSafe {
                ok(safe.iter().all(|s| *s), "unsafe in some world")?;
            } else {
                ok(safe.iter().any(|s| *s), "unsafe in every world")?;
            }
            human_rule()
        }
        r => Err(format!("{r} is not a reason to allow a deletion")),
    }
}

/// Checks an allowed replica change against the rules.
fn check_update(
    cp: &ControlPlane,
    from: u32,
    to: u32,
    rollout: bool,
    who: &Requester,
    policy: &Policy,
    v: &Verdict,
) -> Result<(), String> {
    let ok = |cond: bool, what: &str| if cond { Ok(()) } else { Err(what.to_string()) };
    let stale = is_stale(cp, policy);
    let voters = Voters::of(cp, stale);
    // Scaling is monotone in health: the world with every unknown member down is the worst.
    let (worst, best) = (voters.assuming(false), voters.assuming(true));
    // Scale down: KCP removes Machines annotated delete-machine first, any others after; with
    // the pending deletions, every subset (every prefix of every order) keeps quorum, and the
    // healthy members left reach the quorum of the new size.
    let down_safe = |world: &BTreeMap<u64, bool>| -> bool {
        let active: Vec<&Machine> = cp
            .machines
            .iter()
            .filter(|m| m.control_plane && !m.deleting)
            .collect();
        let k = active.len().saturating_sub(to as usize);
        let (marked, rest): (Vec<&Machine>, Vec<&Machine>) = active
            .iter()
            .partition(|m| m.annotation(ANNOTATION_DELETE_MACHINE).is_some());
        let voter = |m: &Machine| member_of(cp, m).filter(|x| !x.is_learner).map(|x| x.id.0);
        let pending: Vec<u64> = cp
            .machines
            .iter()
            .filter(|m| m.deleting)
            .filter_map(voter)
            .collect();
        let choose = |from: &[&Machine], n: usize| -> Vec<Vec<u64>> {
            let idx: Vec<u64> = (0..from.len() as u64).collect();
            subsets(&idx)
                .into_iter()
                .filter(|s| s.len() == n)
                .map(|s| s.iter().filter_map(|i| voter(from[*i as usize])).collect())
                .collect()
        };
        let choices: Vec<Vec<u64>> = if k <= marked.len() {
            choose(&marked, k)
        } else {
            let all_marked: Vec<u64> = marked.iter().filter_map(|m| voter(m)).collect();
            choose(&rest, k - marked.len())
                .into_iter()
                .map(|c| [all_marked.clone(), c].concat())
                .collect()
        };
        choices.iter().all(|c| {
            let removed = [c.clone(), pending.clone()].concat();
            let left_healthy = world
                .iter()
                .filter(|(id, up)| **up && !removed.contains(id))
                .count();
            subsets(&removed).iter().all(|s| !fails(world, s, 0))
                && left_healthy >= majority(to as usize)
        })
    };
    // A voting join counts before it is healthy; a learner never votes before it is in sync,
    // so with learner joins a scale-up needs only quorum now (etcd adds no member without it).
    let up_safe = |world: &BTreeMap<u64, bool>| -> bool {
        let healthy = world.values().filter(|u| **u).count();
        if learner_joins(cp) {
            !fails(&Voters::raft_of(cp, stale).assuming(true), &[], 0)
        } else {
            healthy >= majority(world.len() + 1)
        }
    };
    match v.reason {
        Reason::ClusterDeleting => ok(cp.cluster.deleting, "cluster not deleting"),
        Reason::ControlPlaneDeleting => ok(cp.kcp.deleting, "kcp not deleting"),
        Reason::ExternalEtcd => ok(cp.kcp.etcd == EtcdTopology::External, "stacked"),
        Reason::NoReplicaChange => ok(from == to, "replicas change"),
        Reason::RolloutAllowed => ok(from == to && rollout, "not a plain rollout"),
        Reason::ScaleDownSafe => ok(to < from && down_safe(&worst), "scale down unsafe"),
        Reason::ScaleUpSafe => ok(to > from && up_safe(&worst), "scale up unsafe"),
        Reason::SingleMemberScaleUp => ok(
            to > from && worst.len() == 1 && worst.values().all(|u| *u),
            "not a single healthy member",
        ),
        Reason::HealthUnknown => {
            ok(
                policy.on_unknown_health(who) == OnUnknownHealth::Allow,
                "policy denies",
            )?;
            if matches!(cp.etcd, EtcdState::Unknown { .. }) {
                return Ok(());
            }
            ok(
                if to < from {
                    down_safe(&best)
                } else {
                    up_safe(&best)
                },
                "unsafe even if every unknown member is healthy",
            )
        }
        r => Err(format!("{r} is not a reason to allow a replica change")),
    }
}

fn requester() -> impl Strategy<Value = Requester> {
    prop::sample::select(vec!["kubernetes-admin", DEFAULT_KCP_CONTROLLER, TEARDOWN])
        .prop_map(Requester::new)
}

fn policy() -> impl Strategy<Value = Policy> {
    (any::<bool>(), any::<bool>()).prop_map(|(humans, controllers)| {
        let on = |allow| {
            if allow {
                OnUnknownHealth::Allow
            } else {
                OnUnknownHealth::Deny
            }
        };
        Policy {
            unknown_health_humans: on(humans),
            unknown_health_controllers: on(controllers),
            ..Policy::default()
        }
    })
}

proptest! {
    #![proptest_config(config(5000))]

    /// Every allowed Machine deletion is one the rules permit, for every Machine of a random
    /// control plane (and one the caches do not know), by a human, the KCP controller or a
    /// teardown identity; the next action never panics either.
    #[test]
    fn allowed_deletions_keep_quorum(w in world(), who in requester(), policy in policy()) {
        let _busy = ::testkit::etcd::busy();
        let cp = build(&w);
        let mut targets = cp.machines.clone();
        targets.push(Machine::new("not-cached"));
        for m in &targets {
            let v = decide(&cp, &Operation::DeleteMachine(m.clone()), &who, &policy, NOW);
            prop_assert!(!v.message.is_empty());
            if v.allowed {
                if let Err(e) = check_delete(&cp, m, &who, &policy, &v) {
                    prop_assert!(false, "delete {} allowed ({}): {e}\n{}\n{cp:#?}", m.name, v.reason, v.message);
                }
            } else {
                prop_assert!(v.message.contains("Next safe action"), "{}", v.message);
            }
        }
        let _ = next_action(&cp, &policy, NOW);
    }

    /// Every allowed replica change R -> R' is one the rules permit.
    #[test]
    fn allowed_replica_changes_keep_quorum(
        w in world(),
        from in 0u32..=8,
        to in 0u32..=9,
        rollout in any::<bool>(),
        who in requester(),
        policy in policy(),
    ) {
        let _busy = ::testkit::etcd::busy();
        let cp = build(&w);
        let op = Operation::UpdateKcp { replicas_from: from, replicas_to: to, starts_rollout: rollout };
        let v = decide(&cp, &op, &who, &policy, NOW);
        prop_assert!(!v.message.is_empty());
        if v.allowed
            && let Err(e) = check_update(&cp, from, to, rollout, &who, &policy, &v)
        {
            prop_assert!(false, "{from} -> {to} allowed ({}): {e}\n{}\n{cp:#?}", v.reason, v.message);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random AdmissionReviews through decode -> judge -> respond.

/// The webhook's caches holding the fixtures' control plane: KCP `test-controlplane` with
/// Machines `test-cp-{a,b,c}` on nodes `cp-{a,b,c}`; members `cp-a`, `cp-b` healthy, `cp-c`
/// down. Fresh for each case, so reservations never carry over.
fn webhook() -> Webhook {
    let mut objects = vec![cluster_object(json!({})), kcp_object()];
    for x in ["a", "b", "c"] {
        objects.push(machine_named(&format!("test-cp-{x}"), &format!("cp-{x}")));
    }
    let up = members(&[("a", true), ("b", true), ("c", false)]);
    ::testkit::webhook::seeded(&objects, NS, "test", up)
}

/// The review path the HTTP handler takes, without HTTP: a decoded review gets a response
/// that echoes its uid and carries the verdict; a body that does not decode gets an error with
/// a message (HTTP 400).
fn review_path(endpoint: Endpoint, body: &[u8]) -> Result<(), TestCaseError> {
    let d = match review::decode(endpoint, body) {
        Ok(d) => d,
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            return Ok(());
        }
    };
    let w = webhook();
    let o = w.judge(&d);
    let v: Value = serde_json::to_value(o.response(&d.uid)).expect("serializes");
    prop_assert_eq!(&v["apiVersion"], "admission.k8s.io/v1");
    prop_assert_eq!(&v["response"]["uid"], d.uid.as_str());
    prop_assert_eq!(&v["response"]["allowed"], o.allowed);
    if !o.allowed {
        prop_assert_eq!(&v["response"]["status"]["code"], 403);
        prop_assert!(!o.message.is_empty());
    }
    Ok(())
}

/// A structurally valid review: Machine DELETE with oldObject only, KCP UPDATE, or scale.
fn structured_review() -> impl Strategy<Value = (Endpoint, Value)> {
    let machine = (
        prop::sample::select(vec!["a", "b", "c", "zz"]),
        any::<bool>(),
        prop::sample::select(vec!["jane@example.com", DEFAULT_KCP_CONTROLLER, TEARDOWN]),
        prop::option::of(prop::sample::select(vec!["", "why", " "])),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(x, node, user, bg, deleting, dry)| {
            let mut r = fixture("machine-delete-by-user.json");
            let mut m = machine_named(&format!("test-cp-{x}"), &format!("cp-{x}"));
            if !node {
                m["status"]["nodeRef"] = Value::Null;
            }
            if let Some(bg) = bg {
                m["metadata"]["annotations"][ANNOTATION_BREAK_GLASS] = json!(bg);
            }
            if deleting {
                m["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            r["request"]["name"] = m["metadata"]["name"].clone();
            r["request"]["oldObject"] = m;
            r["request"]["userInfo"]["username"] = json!(user);
            r["request"]["dryRun"] = json!(dry);
            (Endpoint::Machines, r)
        });
    let kcp = (0i64..=9, 0i64..=9, any::<bool>(), any::<bool>()).prop_map(
        |(from, to, scale, rollout)| {
            if scale {
                let mut r = fixture("kcp-scale-subresource-3-to-5.json");
                r["request"]["oldObject"]["spec"]["replicas"] = json!(from);
                r["request"]["object"]["spec"]["replicas"] = json!(to);
                (Endpoint::KubeadmControlPlanes, r)
            } else {
                let mut r = fixture("kcp-update-version.json");
                r["request"]["oldObject"]["spec"]["replicas"] = json!(from);
                r["request"]["object"]["spec"]["replicas"] = json!(to);
                if !rollout {
                    r["request"]["object"]["spec"]["version"] =
                        r["request"]["oldObject"]["spec"]["version"].clone();
                }
                (Endpoint::KubeadmControlPlanes, r)
            }
        },
    );
    prop_oneof![machine, kcp]
}

const FIXTURES: [&str; 6] = [
    "kcp-scale-subresource-3-to-5.json",
    "kcp-update-replicas-5-to-3.json",
    "kcp-update-version.json",
    "machine-delete-by-kcp-controller.json",
    "machine-delete-by-user.json",
    "machine-delete-dry-run.json",
];

/// Odd values to put where a field was: other types, huge and negative numbers, unicode.
fn odd_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,40}".prop_map(Value::from),
        Just(json!("\u{202e}\u{0000}ü🦀")),
        Just(json!([])),
        Just(json!({})),
        Just(json!([1, "x", null])),
    ]
}

/// Every path (object keys and array indices) in a value.
fn paths(v: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                prefix.push(k.clone());
                out.push(prefix.clone());
                paths(x, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                prefix.push(i.to_string());
                out.push(prefix.clone());
                paths(x, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

/// Applies one mutation at `path`: remove the field, or replace it with `odd`.
fn mutate(v: &mut Value, path: &[String], remove: bool, odd: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = v;
    for p in parents {
        cur = match cur {
            Value::Object(m) => match m.get_mut(p) {
                Some(x) => x,
                None => return,
            },
            Value::Array(a) => match p.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                Some(x) => x,
                None => return,
            },
            _ => return,
        };
    }
    match cur {
        Value::Object(m) if remove => {
            m.remove(last);
        }
        Value::Object(m) => {
            m.insert(last.clone(), odd);
        }
        Value::Array(a) => {
            if let Some(i) = last.parse::<usize>().ok().filter(|i| *i < a.len()) {
                if remove {
                    a.remove(i);
                } else {
                    a[i] = odd;
                }
            }
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(config(500))]

    /// Structurally generated reviews are answered well formed at their endpoint and at the
    /// other one.
    #[test]
    fn structured_reviews_are_answered((endpoint, r) in structured_review()) {
        let _busy = ::testkit::etcd::busy();
        let body = serde_json::to_vec(&r).expect("json");
        review_path(endpoint, &body)?;
        let other = match endpoint {
            Endpoint::Machines => Endpoint::KubeadmControlPlanes,
            Endpoint::KubeadmControlPlanes => Endpoint::Machines,
        };
        review_path(other, &body)?;
    }

    /// The real fixtures with up to 4 fields dropped or replaced by odd values never panic
    /// and are answered well formed or refused with a message.
    #[test]
    fn mutated_fixtures_are_answered_or_refused(
        file in prop::sample::select(FIXTURES.to_vec()),
        picks in prop::collection::vec((any::<prop::sample::Index>(), any::<bool>(), odd_value()), 1..=4),
    ) {
        let _busy = ::testkit::etcd::busy();
        let mut r = fixture(file);
        for (pick, remove, odd) in picks {
            let mut all = Vec::new();
            paths(&r, &mut Vec::new(), &mut all);
            if all.is_empty() {
                break;
            }
            let path = all[pick.index(all.len())].clone();
            mutate(&mut r, &path, remove, odd);
        }
        let body = serde_json::to_vec(&r).expect("json");
        review_path(Endpoint::Machines, &body)?;
        review_path(Endpoint::KubeadmControlPlanes, &body)?;
    }

    /// Arbitrary bytes, and fixtures cut short, are refused with a message.
    #[test]
    fn garbage_bodies_are_refused(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        file in prop::sample::select(FIXTURES.to_vec()),
        cut in any::<prop::sample::Index>(),
    ) {
        let _busy = ::testkit::etcd::busy();
        review_path(Endpoint::Machines, &bytes)?;
        let body = serde_json::to_vec(&fixture(file)).expect("json");
        let cut = &body[..cut.index(body.len())];
        review_path(Endpoint::Machines, cut)?;
        review_path(Endpoint::KubeadmControlPlanes, cut)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Random dumps for `quorumguard check`.

fn read_fixture(rel: &str) -> String {
    let path = format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A member list as etcdctl prints it, with random IDs (numbers or hex strings), names and
/// URLs, learners and unstarted members.
fn member_list_json() -> impl Strategy<Value = (String, Vec<String>)> {
    prop::collection::vec(
        (
            any::<u64>(),
            any::<bool>(),
            prop::sample::select(vec![
                "cp-node-1",
                "cp-node-2",
                "cp-node-3",
                "",
                "other",
                "ü",
            ]),
            any::<bool>(),
            0u16..4,
        ),
        0..=6,
    )
    .prop_map(|ms| {
        let mut urls = Vec::new();
        let members: Vec<Value> = ms
            .iter()
            .map(|(id, hex, name, learner, port)| {
                let url = format!("https://127.0.0.1:{}", 30040 + port);
                urls.push(url.clone());
                let mut m = json!({
                    "ID": if *hex { json!(format!("{id:x}")) } else { json!(id) },
                    "peerURLs": [format!("https://127.0.0.1:{}", 31040 + port)],
                });
                if !name.is_empty() {
                    m["name"] = json!(name);
                    m["clientURLs"] = json!([url]);
                }
                if *learner {
                    m["isLearner"] = json!(true);
                }
                m
            })
            .collect();
        (
            json!({"header": {"cluster_id": 1}, "members": members}).to_string(),
            urls,
        )
    })
}

fn endpoint_status_json(urls: Vec<String>) -> impl Strategy<Value = String> {
    let n = urls.len();
    prop::collection::vec(
        (
            prop::sample::select(if urls.is_empty() {
                vec!["x".to_string()]
            } else {
                urls
            }),
            prop::option::of(any::<u64>()),
            prop::option::of(any::<u64>()),
            prop::sample::select(vec![
                vec![],
                vec!["etcdserver: no leader".to_string()],
                vec!["memberID:1 alarm:NOSPACE ".to_string()],
                vec!["memberID:zz alarm:".to_string()],
            ]),
            any::<bool>(),
        ),
        0..=n + 1,
    )
    .prop_map(|es| {
        let v: Vec<Value> = es
            .into_iter()
            .map(|(ep, member, leader, errors, learner)| {
                json!({"Endpoint": ep, "Status": {
                    "header": {"member_id": member}, "leader": leader, "version": "3.4.23",
                    "dbSize": 20480, "raftIndex": 9, "raftTerm": 2, "isLearner": learner,
                    "errors": errors}})
            })
            .collect();
        Value::from(v).to_string()
    })
}

fn endpoint_health_json(urls: Vec<String>) -> impl Strategy<Value = String> {
    let n = urls.len();
    prop::collection::vec(
        (
            prop::sample::select(if urls.is_empty() { vec!["x".to_string()] } else { urls }),
            any::<bool>(),
        ),
        0..=n + 1,
    )
    .prop_map(|es| {
        let v: Vec<Value> = es
            .into_iter()
            .map(|(ep, health)| {
                json!({"endpoint": ep, "health": health, "took": "1ms",
                       "error": if health { Value::Null } else { json!("context deadline exceeded") }})
            })
            .collect();
        Value::from(v).to_string()
    })
}

/// The five dumps of a check: objects (a fixture, maybe with a line dropped or changed),
/// member list, endpoint status, endpoint health and alarms.
fn dumps_strategy() -> impl Strategy<Value = [String; 5]> {
    let objects = (
        prop::sample::select(vec![
            "objects/healthy.yaml",
            "objects/healthy-v1beta1.yaml",
            "objects/rollout.yaml",
            "objects/rollout-multidoc.yaml",
        ]),
        any::<prop::sample::Index>(),
        prop::sample::select(vec![
            None,
            Some(""),
            Some("  replicas: 99999999999"),
            Some("  x: ["),
        ]),
    )
        .prop_map(|(file, line, replace)| {
            let text = read_fixture(file);
            let mut lines: Vec<&str> = text.lines().collect();
            if let Some(r) = replace {
                let i = line.index(lines.len());
                lines[i] = r;
            }
            lines.join("\n")
        });
    (objects, member_list_json()).prop_flat_map(|(objects, (ml, urls))| {
        (
            Just(objects),
            Just(ml),
            endpoint_status_json(urls.clone()),
            endpoint_health_json(urls),
            prop::sample::select(vec![
                String::new(),
                "memberID:1 alarm:NOSPACE\n".to_string(),
                "memberID:18446744073709551615 alarm:CORRUPT\n".to_string(),
                "nonsense\n".to_string(),
            ]),
        )
            .prop_map(|(o, ml, st, he, al)| [o, ml, st, he, al])
    })
}

/// `check`'s parsing and analysis of the dumps: every what-if (delete each Machine, scale to
/// 0..=R+2) as a human and as the controller, rendered as text and JSON. Errors are fine.
fn check_dumps(d: &[String; 5], with_optional: [bool; 3]) -> Result<(), TestCaseError> {
    let opt = |i: usize, name: &'static str| with_optional[i - 2].then(|| (name, d[i].as_str()));
    let texts = DumpTexts {
        objects: ("objects.yaml", &d[0]),
        member_list: ("member-list.json", &d[1]),
        endpoint_status: opt(2, "endpoint-status.json"),
        endpoint_health: opt(3, "endpoint-health.json"),
        alarms: opt(4, "alarms.txt"),
        kcp: None,
    };
    let loaded = match dumps::assemble(&texts) {
        Ok(l) => l,
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            return Ok(());
        }
    };
    let whats = WhatIf::all_for(&loaded.control_plane);
    for who in ["kubernetes-admin", DEFAULT_KCP_CONTROLLER] {
        let report = check::analyse(loaded.clone(), &whats, &Requester::new(who), NOW);
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                prop_assert!(
                    false,
                    "a what-if of the dump's own objects is refused: {e:#}"
                );
                return Ok(());
            }
        };
        prop_assert_eq!(report.verdicts.len(), whats.len());
        prop_assert!(!check::render_text(&report).is_empty());
        prop_assert!(serde_json::to_string(&report).is_ok());
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(500))]

    /// Random etcdctl outputs and mangled object dumps never make `check` panic.
    #[test]
    fn random_dumps_never_panic(d in dumps_strategy(), optional in any::<[bool; 3]>()) {
        let _busy = ::testkit::etcd::busy();
        check_dumps(&d, optional)?;
    }

    /// Arbitrary text given to each parser is parsed or refused, never a panic.
    #[test]
    fn arbitrary_text_is_parsed_or_refused(text in "\\PC{0,120}", alarm in "(memberID:[0-9a-fx]{0,20} alarm:[A-Z]{0,8}\n){0,3}") {
        let _busy = ::testkit::etcd::busy();
        let _ = etcdctl::parse_member_list(&text);
        let _ = etcdctl::parse_endpoint_status(&text);
        let _ = etcdctl::parse_endpoint_health(&text);
        let _ = etcdctl::parse_alarm_list(&text);
        let _ = etcdctl::parse_alarm_list(&alarm);
        let _ = dumps::parse_objects(&text, "x.yaml");
    }
}
