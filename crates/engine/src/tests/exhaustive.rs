//! The exhaustive search: every control plane of 1 to 7 voting members and 0 to 2 learners,
//! every health assignment, every single Machine deletion by a human and by the KCP controller,
//! every replica change and the next action, checked against an oracle that enumerates removal
//! subsets directly instead of reasoning about worst orders.
//!
//! Members with the same health and the same kind of Machine are interchangeable under every
//! rule, so health assignments are enumerated as multisets of (health, machine) classes: every
//! assignment up to renaming is visited once.

use std::collections::BTreeMap;

use crate::judge::{Ask, Words, judge};
use crate::quorum::quorum;
use crate::testkit::*;
use crate::*;

use super::oracle::*;

#[derive(Default)]
struct Stats {
    states: u64,
    deletions: u64,
    replica_changes: u64,
    allowed: u64,
    denied: u64,
    quorate_unconverged: u64,
    progress_by_deletion: u64,
    progress_by_addition: u64,
    progress_by_pending: u64,
    progress_by_orphan: u64,
    next_actions: BTreeMap<&'static str, u64>,
}

impl Stats {
    fn merge(&mut self, o: Stats) {
        self.states += o.states;
        self.deletions += o.deletions;
        self.replica_changes += o.replica_changes;
        self.allowed += o.allowed;
        self.denied += o.denied;
        self.quorate_unconverged += o.quorate_unconverged;
        self.progress_by_deletion += o.progress_by_deletion;
        self.progress_by_addition += o.progress_by_addition;
        self.progress_by_pending += o.progress_by_pending;
        self.progress_by_orphan += o.progress_by_orphan;
        for (k, v) in o.next_actions {
            *self.next_actions.entry(k).or_default() += v;
        }
    }
}

/// Every state whose voting members are `voting`.
fn check_voting(voting: &[V], st: &mut Stats) {
    let policy = Policy::default();
    let (hum, ctl) = (human(), kcp_controller());
    for nl in 0..=2 {
        for lm in multisets(OWNERS.len(), nl) {
            let learners: Vec<Owner> = lm
                .iter()
                .zip(OWNERS)
                .flat_map(|(k, o)| std::iter::repeat_n(o, *k))
                .collect();
            for extra in [Extra::None, Extra::NodeNoMember, Extra::NeverJoined] {
                for replicas in [1, 3, 5, 7] {
                    // Both join styles: voting joins (kubeadm v1.28) and learner joins (v1.32).
                    for learner_joins in [false, true] {
                        check_state(
                            voting,
                            &learners,
                            extra,
                            replicas,
                            learner_joins,
                            &policy,
                            &hum,
                            &ctl,
                            st,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn every_control_plane_up_to_seven_members() {
    let all_voting: Vec<Vec<V>> = (1..=7).flat_map(voting_sets).collect();
    // Two threads: the machines this runs on have two cores.
    let mut st = Stats::default();
    let parts: Vec<Stats> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let work = &all_voting;
                scope.spawn(move || {
                    let mut st = Stats::default();
                    for voting in work.iter().skip(t).step_by(2) {
                        check_voting(voting, &mut st);
                    }
                    st
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a search thread panicked"))
            .collect()
    });
    for p in parts {
        st.merge(p);
    }
    println!(
        "exhaustive: {} control planes, {} machine deletions, {} replica changes ({} allowed, {} denied); {} quorate unconverged states, progress by deletion {}, by addition {}, by a pending deletion {}, by orphan removal {}; next actions {:?}",
        st.states,
        st.deletions,
        st.replica_changes,
        st.allowed,
        st.denied,
        st.quorate_unconverged,
        st.progress_by_deletion,
        st.progress_by_addition,
        st.progress_by_pending,
        st.progress_by_orphan,
        st.next_actions
    );
    assert_eq!(st.states, 2 * 1_372_680, "the search space changed");
}

#[allow(clippy::too_many_arguments)]
fn check_state(
    voting: &[V],
    learners: &[Owner],
    extra: Extra,
    replicas: u32,
    learner_joins: bool,
    policy: &Policy,
    hum: &Requester,
    ctl: &Requester,
    st: &mut Stats,
) {
    let (mut c, by_machine) = build(voting, learners, extra, replicas);
    if learner_joins {
        c.kcp.version = Some("v1.32.0".into());
    }
    assert_eq!(c.join_style() == JoinStyle::Learner, learner_joins);
    st.states += 1;
    let all = counts(voting.iter());
    let pending = counts(voting.iter().filter(|v| v.owner == Owner::Deleting));
    let v_count = voting.len();
    let quorate = all[0] >= quorum(v_count);
    let ctx = || {
        format!(
            "state voting={voting:?} learners={learners:?} extra={extra:?} replicas={replicas} learner_joins={learner_joins}"
        )
    };

    // Every single deletion, by a human and by the controller.
    let mut controller_can_delete = false;
    for m in &c.machines {
        for who in [hum, ctl] {
            let j = judge(
                &Ask::new(&c, who, policy, NOW, Words::All),
                &Operation::DeleteMachine(m.clone()),
            );
            st.deletions += 1;
            let member = by_machine[&m.name];
            if j.allowed {
                st.allowed += 1;
                if std::ptr::eq(who, ctl) && !m.deleting {
                    controller_can_delete = true;
                }
            } else {
                st.denied += 1;
            }
            let me = member
                .map(|v| counts(std::iter::once(&v)))
                .unwrap_or([0; 3]);
            advice_keeps_tolerance(&j.message, all, v_count, replicas, &ctx);
            // KCP adds a member when the other Machines are fewer than spec.replicas (no Machine
            // here is young); a learner is a join under way already. Only a voting join raises
            // the quorum, and KCP's own deletion is never overtaken by the replacement it makes
            // after it (it creates no Machine while one is being deleted): only a person's
            // deletion counts it.
            let others = c
                .machines
                .iter()
                .filter(|o| !o.deleting && o.name != m.name)
                .count();
            let join = !learner_joins
                && std::ptr::eq(who, hum)
                && learners.is_empty()
                && others < replicas as usize;
            let p = pending_without(pending, m, member);
            match (j.allowed, j.reason) {
                (true, Reason::AlreadyDeleting) => assert!(m.deleting, "{}", ctx()),
                (true, Reason::MemberAbsent | Reason::LearnerMember) => {
                    assert!(member.is_none(), "{} {}: {}", ctx(), m.name, j.message)
                }
                (true, Reason::QuorumSafe) => assert!(
                    !risk_cases(all, p, me, join).0,
                    "allowed an unsafe deletion of {}: {} {}",
                    m.name,
                    ctx(),
                    j.message
                ),
                (true, Reason::HealthUnknown) => {
                    assert!(std::ptr::eq(who, ctl), "{}", ctx());
                    assert!(risk_cases(all, p, me, join).1, "{} {}", ctx(), j.message);
                }
                (true, other) => panic!("unexpected allow {other}: {}", ctx()),
                (false, Reason::WouldLoseQuorum | Reason::LastMember) => {
                    assert!(
                        !removal_ok(all, me, true),
                        "over-denied {}: {} {}",
                        m.name,
                        ctx(),
                        j.message
                    )
                }
                (false, Reason::QuorumLost) => {
                    assert!(all[0] + all[2] < quorum(v_count), "{}", ctx())
                }
                (false, Reason::PendingDeletions) => {
                    assert!(!risk_cases(all, p, me, false).1, "{} {}", ctx(), j.message);
                    assert!(p.iter().sum::<usize>() > 0, "{}", ctx());
                }
                (false, Reason::PendingJoin) => {
                    // Risky in every world with the newcomer, not in every world without it.
                    assert!(join, "{} {}", ctx(), j.message);
                    assert!(!risk_cases(all, p, me, true).1, "{} {}", ctx(), j.message);
                    assert!(risk_cases(all, p, me, false).1, "{} {}", ctx(), j.message);
                }
                (false, Reason::HealthUnknown) => {
                    // Only humans are denied on unknown health by default, and only when the
                    // answer truly depends on the unknown members.
                    assert!(std::ptr::eq(who, hum), "{}", ctx());
                    let (some_risk, some_safe) = risk_cases(all, p, me, join);
                    assert!(some_risk && some_safe, "{} {}", ctx(), j.message);
                }
                (false, Reason::BelowDesiredReplicas) => {
                    assert!(std::ptr::eq(who, hum), "{}", ctx());
                    // x-old has a node but no member: it does not count.
                    let left = c
                        .machines
                        .iter()
                        .filter(|o| !o.deleting && o.name != m.name && o.name != "x-old")
                        .count();
                    assert!(left < replicas as usize, "{}", ctx());
                }
                (false, other) => panic!("unexpected denial {other}: {}", ctx()),
            }
        }
    }

    // Every replica change.
    let active: Vec<&str> = c
        .machines
        .iter()
        .filter(|m| !m.deleting)
        .map(|m| m.name.as_str())
        .collect();
    // A scale-up must also hold once the healthy and unknown members of the Machines being
    // deleted have left (the worst order); from a single member left it may still grow.
    let worst = [all[0] - pending[0], all[1], all[2] - pending[2]];
    let worst_v = v_count - pending[0] - pending[2];
    let leaving_single = worst_v == 1 && worst[0] == 1;
    for to in [1u32, 3, 5, 7] {
        if to == replicas {
            continue;
        }
        let op = Operation::UpdateKcp {
            replicas_from: replicas,
            replicas_to: to,
            starts_rollout: false,
        };
        let j = judge(&Ask::new(&c, hum, policy, NOW, Words::All), &op);
        advice_keeps_tolerance(&j.message, all, v_count, replicas, &ctx);
        st.replica_changes += 1;
        if j.allowed {
            st.allowed += 1;
        } else {
            st.denied += 1;
        }
        match (j.allowed, j.reason) {
            (true, Reason::ScaleDownSafe) => {
                // Whichever k active Machines KCP picks, with the pending deletions, in any
                // order: quorum holds, and the healthy left form a quorum of `to`.
                let k = active.len().saturating_sub(to as usize);
                let with_member: Vec<V> = active.iter().filter_map(|n| by_machine[*n]).collect();
                let avail = counts(with_member.iter());
                for pick in subsets(avail) {
                    let picked: usize = pick.iter().sum();
                    let others = active.len() - with_member.len();
                    if picked > k || picked + others < k {
                        continue;
                    }
                    let r = add(pick, pending);
                    assert!(
                        removal_ok(all, r, false),
                        "scale {replicas}->{to}: {} {}",
                        ctx(),
                        j.message
                    );
                    assert!(
                        all[0] - r[0] >= quorum(to as usize),
                        "scale {replicas}->{to}: {}",
                        ctx()
                    );
                }
            }
            (true, Reason::ScaleUpSafe) if learner_joins => {
                // A learner never votes before it is in sync: only a lost quorum refuses.
                assert!(all[0] + all[2] >= quorum(v_count), "{}", ctx());
            }
            (true, Reason::ScaleUpSafe) => {
                assert!(all[0] >= quorum(v_count + 1), "{}", ctx());
                assert!(
                    leaving_single || worst[0] >= quorum(worst_v + 1),
                    "once the pending deletions' members left: {}",
                    ctx()
                );
            }
            (true, Reason::SingleMemberScaleUp) => {
                assert!(!learner_joins && v_count == 1 && all[0] == 1, "{}", ctx())
            }
            (true, other) => panic!("unexpected allow {other} for scale: {}", ctx()),
            (false, Reason::ScaleUpWouldLoseQuorum) => {
                assert!(!learner_joins, "{} {}", ctx(), j.message);
                assert!(
                    all[0] + all[2] < quorum(v_count + 1)
                        || (!leaving_single && worst[0] + worst[2] < quorum(worst_v + 1)),
                    "{} {}",
                    ctx(),
                    j.message
                )
            }
            (false, Reason::QuorumLost) => assert!(all[0] + all[2] < quorum(v_count), "{}", ctx()),
            (false, Reason::ScaleDownWouldLoseQuorum | Reason::HealthUnknown) => {}
            (false, other) => panic!("unexpected denial {other} for scale: {}", ctx()),
        }
    }

    // The next action never names what the rules deny.
    let a = next_action(&c, policy, NOW);
    *st.next_actions.entry(a.code.as_str()).or_default() += 1;
    let target = a.target.as_deref();
    match a.code {
        ActionCode::DeleteMachine => {
            let m = c.machine(target.expect("target")).expect("machine").clone();
            assert!(
                judge(
                    &Ask::new(&c, hum, policy, NOW, Words::All),
                    &Operation::DeleteMachine(m)
                )
                .allowed,
                "{}",
                ctx()
            );
        }
        ActionCode::RemediateMachine => {
            let m = c.machine(target.expect("target")).expect("machine").clone();
            assert!(
                judge(
                    &Ask::new(&c, ctl, policy, NOW, Words::All),
                    &Operation::DeleteMachine(m)
                )
                .allowed,
                "{}",
                ctx()
            );
        }
        ActionCode::RemoveOrphanMember => {
            let id: u64 = u64::from_str_radix(target.expect("target"), 16).expect("hex id");
            let idx = id as usize - 1;
            if idx < voting.len() {
                let orphan = counts(std::iter::once(&voting[idx]));
                assert!(removal_ok(all, orphan, false), "{}", ctx());
                // Advice never takes fault tolerance away (below what etcd has, at most 1, and
                // what spec.replicas asks for).
                let left = all[0] - orphan[0];
                assert!(
                    tolerance(v_count - 1, left) >= kept(all, v_count, replicas),
                    "removing orphan {id} leaves fault tolerance {}: {}",
                    tolerance(v_count - 1, left),
                    ctx()
                );
            }
        }
        ActionCode::RestoreQuorum => assert!(all[0] + all[2] < quorum(v_count), "{}", ctx()),
        // Promoting a healthy learner adds a healthy voter: quorum of the grown membership
        // with the unknown members down.
        ActionCode::PromoteLearner => {
            assert!(all[0] + 1 >= quorum(v_count + 1), "{}", ctx());
            assert!(!learners.is_empty(), "{}", ctx());
        }
        // No wait without an end: every Machine here is past --join-grace and --learner-grace,
        // so nothing joins or catches up by itself.
        ActionCode::WaitForJoin | ActionCode::WaitForLearner => {
            panic!("{} past every grace: {}", a.code, ctx())
        }
        ActionCode::None => assert!(
            converged(voting, learners, extra, replicas),
            "None for {}",
            ctx()
        ),
        _ => {}
    }
    if all[0] + all[2] < quorum(v_count) {
        assert_eq!(a.code, ActionCode::RestoreQuorum, "{}", ctx());
    }

    // The guard never deadlocks the control plane: with quorum and not converged, KCP can
    // always do something.
    if quorate && !converged(voting, learners, extra, replicas) {
        st.quorate_unconverged += 1;
        let addition = (v_count == 1 && all[0] == 1) || all[0] >= quorum(v_count + 1);
        let pending_done = voting
            .iter()
            .filter(|v| v.owner == Owner::Deleting)
            .any(|v| removal_ok(all, counts(std::iter::once(v)), false));
        let orphan_done = voting
            .iter()
            .filter(|v| v.owner == Owner::Orphan)
            .any(|v| removal_ok(all, counts(std::iter::once(v)), false))
            || learners.contains(&Owner::Orphan);
        if controller_can_delete {
            st.progress_by_deletion += 1;
        } else if addition {
            st.progress_by_addition += 1;
        } else if pending_done {
            st.progress_by_pending += 1;
        } else if orphan_done {
            st.progress_by_orphan += 1;
        } else {
            panic!("deadlock: KCP can make no progress in {}", ctx());
        }
    }
}

/// Fault tolerance of `voting` members with `healthy` of them healthy.
fn tolerance(voting: usize, healthy: usize) -> i64 {
    healthy as i64 - quorum(voting) as i64
}

/// The fault tolerance advice must keep: what etcd has now (known healthy members), at most 1,
/// and no more than `replicas` members would have.
fn kept(all: Counts, v_count: usize, replicas: u32) -> i64 {
    tolerance(v_count, all[0])
        .min(1)
        .min(tolerance(replicas as usize, replicas as usize))
}

/// Every `--replicas=N` a message suggests keeps fault tolerance (see [`kept`]); for 3 replicas
/// none is suggested at all (remediation is the only advice).
fn advice_keeps_tolerance(
    message: &str,
    all: Counts,
    v_count: usize,
    replicas: u32,
    ctx: &dyn Fn() -> String,
) {
    for suggestion in message.split("--replicas=").skip(1) {
        let n: usize = suggestion
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse().ok())
            .unwrap_or_else(|| panic!("unparseable advice in {message:?}: {}", ctx()));
        assert!(
            replicas != 3,
            "a 3-replica control plane is advised to scale to {n}: {message} {}",
            ctx()
        );
        assert!(
            tolerance(n, n) >= kept(all, v_count, replicas),
            "advice to scale to {n} takes fault tolerance away: {message} {}",
            ctx()
        );
    }
}

fn pending_without(pending: Counts, m: &Machine, member: Option<V>) -> Counts {
    // The target itself is counted once, as `me`.
    match member {
        Some(v) if m.deleting => {
            let mut p = pending;
            p[v.h as usize] -= 1;
            p
        }
        _ => pending,
    }
}

fn converged(voting: &[V], learners: &[Owner], extra: Extra, replicas: u32) -> bool {
    learners.is_empty()
        && matches!(extra, Extra::None)
        && voting
            .iter()
            .all(|v| v.h == H::Up && v.owner == Owner::Active)
        && voting.len() == replicas as usize
}
