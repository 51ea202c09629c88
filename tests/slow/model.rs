//! Model check of the guard with KCP, etcd, people and failures, in every interleaving
//! (issue 20), with stateright.
//!
//! The state, the actors and their steps: `tests/slow/model/world.rs` and `tests/slow/model/steps.rs`;
//! the properties and the liveness continuation: `tests/slow/model/check.rs`. The guard's decisions
//! are the real engine's, on the guard's lagging view. What is checked, under which bounds, and
//! what each bound leaves out: docs/rules.md, "Model-checked".
//!
//! `cargo test --test slow model:: -- --nocapture` prints the figures; a larger run:
//! `QG_MODEL=big cargo test --test slow model::big_bounds -- --ignored --nocapture`; any bounds:
//! `QG_MODEL_BOUNDS=person=2 cargo test --workspace --test slow -- qg_model_bounds --ignored --nocapture`.

mod autopilot;
mod bounds;
mod check;
mod guard;
mod joins;
mod predicts;
mod steps;
mod summary;
mod world;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use quorumguard::engine::Confirmation;
use stateright::{Checker, HasDiscoveries, Model};

use check::{
    ADVICE, Checked, NO_FALSE_ALARM, NO_IDLE_WAIT, ONE_AT_A_TIME, PREDICTS, PROPERTIES, RECOVERS,
    SAFE, WITHOUT_A_PERSON,
};
use quorumguard::engine::etcd_version::AddMemberRule;
use steps::{Bounds, Bugs, Config};
use world::Style;

/// The bounds CI checks within a few minutes.
fn ci() -> Bounds {
    Bounds {
        sizes: vec![3],
        styles: vec![Style::V03, Style::Current],
        etcds: vec![AddMemberRule::EveryVotingMemberConnected],
        max_surges: vec![1],
        max_replicas: 5,
        failures: 1,
        probe_failures: 1,
        crashes: 1,
        person: 1,
        rollouts: 1,
        new_machines: 2,
        cache_lag: 1,
        probe_lag: 1,
        election_probes: 2,
        leftovers: 0,
        health_check: vec![true],
        autopilot: false,
        mhc_checks_etcd_member: true,
    }
}

/// No MachineHealthCheck at the start: the next action asks for one before any remediation,
/// and the person following it creates it. Current KCP, one member failure, no probe failures,
/// crashes or rollouts (the CI bounds with a MachineHealthCheck have those).
fn without_health_check() -> Bounds {
    Bounds {
        styles: vec![Style::Current],
        probe_failures: 0,
        crashes: 0,
        rollouts: 0,
        health_check: vec![false],
        ..ci()
    }
}

/// Members left behind (a join that stops, a Machine that goes without its member) and what
/// the next action makes of them: the CI bounds without member failures, probe failures and
/// KCP crashes (the run above has those), one leftover; maxSurge 1 and 0.
fn leftovers() -> Bounds {
    Bounds {
        failures: 0,
        probe_failures: 0,
        crashes: 0,
        leftovers: 1,
        max_surges: vec![1, 0],
        ..ci()
    }
}

/// A rollout that deletes first (maxSurge 0) beside a member failure, current KCP only: the CI
/// bounds without probe failures and KCP crashes (the CI bounds with maxSurge 0 as well take
/// longer than CI can afford: `QG_MODEL_BOUNDS=max_surges=0/1`).
fn surge_zero() -> Bounds {
    Bounds {
        styles: vec![Style::Current],
        max_surges: vec![0],
        probe_failures: 0,
        crashes: 0,
        ..ci()
    }
}

/// Two people's requests on five members: where deletions and scale-ups race.
fn races() -> Bounds {
    Bounds {
        sizes: vec![5],
        styles: vec![Style::Current],
        person: 2,
        probe_failures: 0,
        crashes: 0,
        rollouts: 0,
        new_machines: 1,
        ..ci()
    }
}

fn config(bounds: Bounds, bugs: Bugs) -> Config {
    Config {
        bounds,
        bugs,
        confirmation: Confirmation::default(),
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Checks every property over every reachable state and fails with the counterexample of any
/// that does not hold.
fn check_all(name: &str, cfg: Config) {
    let _busy = testkit::etcd::busy();
    let started = Instant::now();
    // QG_MODEL_NO_CROSS_CHECK leaves the cross-check of preflight out (to time it).
    let model = if std::env::var_os("QG_MODEL_NO_CROSS_CHECK").is_some() {
        Checked::new(cfg)
    } else {
        Checked::cross_checked(cfg)
    };
    let checker = model.checker().threads(threads()).spawn_bfs();
    let mut report = started + Duration::from_secs(30);
    while !checker.is_done() {
        std::thread::sleep(Duration::from_millis(200));
        if Instant::now() >= report {
            report += Duration::from_secs(30);
            println!(
                "  {name}: {} states, depth {}, {:.0} s",
                checker.unique_state_count(),
                checker.max_depth(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let checker = checker.join();
    let took = started.elapsed();
    println!(
        "model check {name}: {} states ({} generated), depth {}, {:.1} s on {} threads",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        took.as_secs_f64(),
        threads()
    );
    let mut failed = Vec::new();
    for p in PROPERTIES {
        if let Some(path) = checker.discovery(p) {
            failed.push(format!(
                "{p}: counterexample\n{}",
                checker.model().explain(&path)
            ));
        }
    }
    if let Some(x) = &checker.model().cross_check {
        let f = x.figures();
        println!(
            "  {name}: preflight cross-checked on {} settled states (left out: {} CANNOT JUDGE, {} with a join preflight cannot judge, {} where the guard refuses the rollout), {} mismatches, {:.1} s (threads added up)",
            f.compared,
            f.cannot_judge,
            f.join_unknowable,
            f.rollout_refused,
            f.mismatches.len(),
            f.spent.as_secs_f64()
        );
        for m in &f.mismatches {
            println!("{m}");
        }
        for which in [predicts::HOOK_LEARNER, predicts::HOOK_QUORUM] {
            let open: Vec<&String> = f
                .open
                .iter()
                .filter(|(w, _)| *w == which)
                .map(|(_, m)| m)
                .collect();
            if open.is_empty() {
                continue;
            }
            println!("  {name}: open difference, {} states: {which}", open.len());
            for m in open {
                println!("{m}");
            }
        }
        if !f.mismatches.is_empty() {
            failed.push(format!(
                "{PREDICTS}: {} mismatches (printed above)",
                f.mismatches.len()
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(checker.is_done());
}

/// Runs until `property` fails, and returns the printed counterexample.
fn find(property: &'static str, cfg: Config) -> String {
    let _busy = testkit::etcd::busy();
    let started = Instant::now();
    let model = Checked::new(cfg);
    let checker = model
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .timeout(Duration::from_secs(600))
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("no counterexample to {property:?} found"));
    let printed = checker.model().explain(&path);
    println!(
        "{property}: counterexample after {} states, {:.1} s:\n{printed}",
        checker.unique_state_count(),
        started.elapsed().as_secs_f64()
    );
    printed
}

#[test]
fn the_guard_keeps_every_property_within_the_ci_bounds() {
    check_all("ci", config(ci(), Bugs::default()));
}

#[test]
fn every_member_left_behind_is_led_out_within_the_ci_bounds() {
    check_all("leftovers", config(leftovers(), Bugs::default()));
}

#[test]
fn a_rollout_that_deletes_first_keeps_every_property() {
    check_all("max surge 0", config(surge_zero(), Bugs::default()));
}

/// etcd with PR #21641 (3.5.30, 3.6.11, 3.7): a member add needs a connected quorum of the
/// voting members and the new one, not every one of them. The CI bounds on that etcd, without
/// probe failures and KCP crashes (the first run has those), both join styles.
fn relaxed_etcd() -> Bounds {
    Bounds {
        etcds: vec![AddMemberRule::ConnectedQuorum],
        probe_failures: 0,
        crashes: 0,
        ..ci()
    }
}

#[test]
fn etcd_with_pr_21641_keeps_every_property() {
    // The model's etcd follows the version: four voting members with one down take a member
    // on 3.5.30 (3 connected >= quorum(5)) and not on 3.4.23.
    let left = world::Left::default();
    for (rule, admits) in [
        (AddMemberRule::EveryVotingMemberConnected, false),
        (AddMemberRule::ConnectedQuorum, true),
    ] {
        let mut s = world::State::converged(Style::Current, rule, 4, 1, left);
        s.members[3].up = false;
        assert_eq!(s.may_add_member(), admits, "{rule:?}");
    }
    check_all("etcd 3.5.30", config(relaxed_etcd(), Bugs::default()));
}

#[test]
fn without_a_machine_health_check_the_advice_asks_for_one() {
    check_all(
        "no MachineHealthCheck",
        config(without_health_check(), Bugs::default()),
    );
}

/// The larger run: 1, 3 or 5 members.
fn big() -> Bounds {
    Bounds {
        sizes: vec![1, 3, 5],
        ..ci()
    }
}

/// `QG_MODEL=big cargo test --test slow model::big_bounds -- --ignored --nocapture`.
#[test]
#[ignore]
fn the_guard_keeps_every_property_within_the_big_bounds() {
    if std::env::var("QG_MODEL").as_deref() != Ok("big") {
        println!("set QG_MODEL=big to run the larger model check");
        return;
    }
    check_all("big", config(big(), Bugs::default()));
}

/// Bounds from `QG_MODEL_BOUNDS` (`key=value,...` over [`ci`]), for trying others.
fn bounds_from_env() -> Bounds {
    let mut b = ci();
    let spec = std::env::var("QG_MODEL_BOUNDS").unwrap_or_default();
    for kv in spec.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').expect("key=value");
        let n = || v.parse::<u8>().expect("a number");
        match k {
            "sizes" => b.sizes = v.split('/').map(|x| x.parse().expect("size")).collect(),
            "styles" => {
                b.styles = v
                    .split('/')
                    .map(|x| {
                        if x == "v03" {
                            Style::V03
                        } else {
                            Style::Current
                        }
                    })
                    .collect()
            }
            "etcds" => {
                b.etcds = v
                    .split('/')
                    .map(|x| match x {
                        "3.4" => AddMemberRule::EveryVotingMemberConnected,
                        "3.5.30" => AddMemberRule::ConnectedQuorum,
                        _ => panic!("etcds: 3.4 or 3.5.30, not {x}"),
                    })
                    .collect()
            }
            "max_surges" => {
                b.max_surges = v.split('/').map(|x| x.parse().expect("0 or 1")).collect()
            }
            "max_replicas" => b.max_replicas = n(),
            "failures" => b.failures = n(),
            "probe_failures" => b.probe_failures = n(),
            "crashes" => b.crashes = n(),
            "person" => b.person = n(),
            "rollouts" => b.rollouts = n(),
            "new_machines" => b.new_machines = n(),
            "cache_lag" => b.cache_lag = usize::from(n()),
            "probe_lag" => b.probe_lag = n(),
            "election_probes" => b.election_probes = n(),
            "leftovers" => b.leftovers = n(),
            "autopilot" => b.autopilot = v.parse().expect("true or false"),
            "mhc_checks_etcd_member" => {
                b.mhc_checks_etcd_member = v.parse().expect("true or false")
            }
            "health_check" => {
                b.health_check = v
                    .split('/')
                    .map(|x| x.parse().expect("true or false"))
                    .collect()
            }
            _ => panic!("unknown bound {k}"),
        }
    }
    b
}

#[test]
#[ignore]
fn the_guard_keeps_every_property_within_the_bounds_in_qg_model_bounds() {
    // With QG_MODEL_NO_PREFLIGHT set, KCP adds members without its health preflight: a known
    // limit of the rules shows (docs/rules.md, "Model-checked").
    let bugs = Bugs {
        kcp_skips_preflight: std::env::var_os("QG_MODEL_NO_PREFLIGHT").is_some(),
        ..Bugs::default()
    };
    check_all("env", config(bounds_from_env(), bugs));
}

/// An engine rule bypassed: the PendingDeletions rule never sees the other deletions.
#[test]
fn planted_blindness_to_pending_deletions_loses_quorum() {
    let bugs = Bugs {
        blind_to_pending: true,
        ..Bugs::default()
    };
    find(SAFE, config(races(), bugs));
}

/// An engine rule bypassed: the MemberAbsent allow becomes a denial, so the #2651 leftover
/// the next action names cannot be deleted.
#[test]
fn planted_denial_of_memberless_machines_contradicts_the_advice_and_deadlocks() {
    let bugs = Bugs {
        deny_memberless: true,
        ..Bugs::default()
    };
    find(ADVICE, config(ci(), bugs.clone()));
    find(RECOVERS, config(ci(), bugs));
}

/// cluster-api #2651 without quorumguard's advice: nobody deletes the Machine whose member KCP
/// v0.3 removed before it lost leadership, and KCP stays stuck.
///
/// Two requests: KCP's scale-down preflight leaves its victim out (v1.14), so a restarted KCP
/// that picks the same Machine again finishes the scale-down by itself; it stays stuck when a
/// second request changes what it does next (back to 3 replicas: nothing to scale, and the
/// Machine without a member stays). The other bounds keep out other ways to be stuck, which
/// the search may meet first: no member failures (with the next action ignored, nobody
/// annotates a failed member's Machine for remediation), no Machine created in the exploration
/// (a person's deletion of a joining Machine leaves an orphan member nobody removes), at most 3
/// replicas (3 -> 5 -> 1 before the cache shows 5 leaves the guard's reservation of 5 replicas,
/// which never expires in the model, denying KCP's scale-down `PendingJoin`: docs/rules.md,
/// "Model-checked").
#[test]
fn planted_ignored_next_action_leaves_2651_stuck() {
    let bugs = Bugs {
        ignore_next_action: true,
        ..Bugs::default()
    };
    let bounds = Bounds {
        failures: 0,
        person: 2,
        max_replicas: 3,
        new_machines: 0,
        ..ci()
    };
    let printed = find(RECOVERS, config(bounds, bugs));
    assert!(printed.contains("loses leader election"), "{printed}");
}

/// The `PendingJoin` rule as it was for KCP's own deletions before issue 36: the replacement
/// KCP creates only after this deletion counted as a member about to join. With voting joins
/// (KCP v0.3's style; kubeadm before v1.29) and KCP v1.14's order (a refused remediation ends
/// its reconcile and is retried), a healthy Machine marked for remediation while there are
/// fewer Machines than replicas holds KCP for ever: the guard denies the remediation, KCP
/// never scales up, and the published `WaitForRollout` waits for nothing. The bounds: the CI
/// bounds with voting joins only (with learner joins the engine's other rule, a learner join
/// never counts, keeps the deletion allowed), a rollout that deletes first (maxSurge 0), no
/// probe failures and no KCP crash; without the planted bug every property holds there.
#[test]
fn planted_pending_join_for_kcp_remediation_deadlocks() {
    let bugs = Bugs {
        pending_join_for_kcp: true,
        ..Bugs::default()
    };
    let bounds = Bounds {
        styles: vec![Style::V03],
        ..surge_zero()
    };
    let printed = find(NO_IDLE_WAIT, config(bounds, bugs));
    let stuck = printed
        .split_once("KCP's reconcile there:")
        .map(|(_, s)| s)
        .unwrap_or_default();
    assert!(
        stuck.contains("KCP remediates") && stuck.contains("(PendingJoin)"),
        "{printed}"
    );
}

/// `WaitForJoin` without `--join-grace`'s end: a join that stopped is waited for for ever.
#[test]
fn planted_wait_without_grace_waits_for_nothing() {
    let bugs = Bugs {
        wait_without_grace: true,
        ..Bugs::default()
    };
    // The counterexample ends on a join that will not complete (it stopped, or its member was
    // removed) while every Machine still counts as young.
    let printed = find(NO_IDLE_WAIT, config(leftovers(), bugs));
    assert!(printed.contains("joining"), "{printed}");
}

/// The false-alarms rule off (`--etcd-election-timeout 0s`): a leader election is published
/// as quorum lost.
#[test]
fn planted_believing_every_probe_publishes_a_false_quorum_loss() {
    let mut cfg = config(ci(), Bugs::default());
    cfg.confirmation = Confirmation {
        election_timeout: Duration::ZERO,
    };
    find(NO_FALSE_ALARM, cfg);
}

/// The bound the false-alarms rule rests on: an election longer than the confirmation window
/// (5 election timeouts) is published as quorum lost.
#[test]
fn an_election_longer_than_the_window_is_published_as_quorum_lost() {
    let mut b = ci();
    b.election_probes = 6;
    find(NO_FALSE_ALARM, config(b, Bugs::default()));
}

/// Skipping the fresh probe (deciding on the cached record, as before issue 27) is caught: a
/// member fails after the last probe, and a deletion allowed on the record loses quorum.
#[test]
fn planted_deciding_on_the_cached_record_loses_quorum() {
    let bugs = Bugs {
        no_fresh_probe: true,
        ..Bugs::default()
    };
    let printed = find(SAFE, config(ci(), bugs));
    assert!(printed.contains("fails"), "{printed}");
}

/// What the known limit of the record lagging the member list was: with five members, one
/// down, and two requests, a deletion judged while a changed member list awaits confirmation.
/// The record now holds both lists (a removed member never healthy) and the webhook decides on
/// a fresh probe: every property holds, with no excuse for a record behind etcd.
#[test]
fn a_removed_member_no_longer_counts_while_its_removal_awaits_confirmation() {
    check_all("races", config(races(), Bugs::default()));
}

/// What the reservations close is not reached here (docs/rules.md, "Model-checked"): without
/// them, every property still holds within the CI bounds (about 1.2 million states, 23 s).
#[test]
#[ignore]
fn without_reservations_no_counterexample_within_the_ci_bounds() {
    let bugs = Bugs {
        no_reservations: true,
        ..Bugs::default()
    };
    check_all("ci, no reservations", config(bounds_from_env(), bugs));
}

/// The autopilot (issue 38): the CI bounds with it acting, without probe failures and rollouts
/// (the first run has those), one new Machine. The CI bounds in full with the autopilot:
/// `QG_MODEL_BOUNDS=autopilot=true` (docs/rules.md, "Model-checked").
fn with_autopilot() -> Bounds {
    Bounds {
        autopilot: true,
        probe_failures: 0,
        rollouts: 0,
        new_machines: 1,
        ..ci()
    }
}

#[test]
fn the_autopilot_keeps_every_property_and_needs_no_person() {
    check_all("autopilot", config(with_autopilot(), Bugs::default()));
}

/// The autopilot acting on the guard's record instead of a probe of its own: a learner that
/// failed after the last probe is promoted (etcd promotes a learner its leader still counts in
/// sync), and one member growing to two loses quorum. One member, a person's scale-up to 3.
#[test]
fn planted_autopilot_on_the_record_loses_quorum() {
    let bugs = Bugs {
        ap_stale_view: true,
        ..Bugs::default()
    };
    let bounds = Bounds {
        sizes: vec![1],
        styles: vec![Style::Current],
        max_replicas: 3,
        new_machines: 1,
        crashes: 0,
        // The failure and the promotion: two etcd changes the guard's record has not seen.
        probe_lag: 2,
        ..with_autopilot()
    };
    let printed = find(SAFE, config(bounds, bugs));
    assert!(
        printed.contains("quorum lost by: the autopilot, on the guard's record: promote learner"),
        "{printed}"
    );
}

/// The autopilot off (and no person): the #2651 Machine stays, and so does every member left
/// behind, so liveness without a person rests on the autopilot.
#[test]
fn planted_autopilot_off_leaves_a_stuck_state_for_a_person() {
    let bugs = Bugs {
        ap_off: true,
        ..Bugs::default()
    };
    let printed = find(WITHOUT_A_PERSON, config(with_autopilot(), bugs));
    assert!(
        printed.contains("without a person, failures stopped,"),
        "{printed}"
    );
}

/// KCP v0.3 with the autopilot, no member failures, two requests (3 -> 1 replicas, then back
/// to 3: the #2651 Machine left behind with no more Machines than replicas), 3 replicas at
/// most, no Machine created in the exploration.
fn left_to_the_mhc() -> Bounds {
    Bounds {
        styles: vec![Style::V03],
        failures: 0,
        person: 2,
        max_replicas: 3,
        new_machines: 0,
        ..with_autopilot()
    }
}

/// The one class liveness without a person leaves to a MachineHealthCheck that checks the
/// Machine's `EtcdMemberHealthy` condition (`Checked::recovers_alone`): with an MHC that checks
/// only Nodes (the one Cluster API's book gives for KCP), the #2651 Machine stays once there
/// are no more Machines than replicas (here a person sets the replicas back up after KCP's
/// crash); the next action names its remediation, for a person. With the check, every property
/// holds in the same bounds: the check is reached, and what it starts converges.
#[test]
fn an_mhc_checking_only_nodes_leaves_the_2651_machine_to_a_person() {
    let bounds = left_to_the_mhc();
    let nodes_only = Bounds {
        mhc_checks_etcd_member: false,
        ..bounds.clone()
    };
    let printed = find(WITHOUT_A_PERSON, config(nodes_only, Bugs::default()));
    let stuck = printed
        .split_once("without a person, failures stopped, it stops at:")
        .map(|(_, s)| s)
        .unwrap_or_default();
    assert!(stuck.contains("next action RemediateMachine"), "{printed}");
    check_all(
        "2651 Machine left to the MHC",
        config(bounds, Bugs::default()),
    );
}

/// The autopilot not looking at its step in flight: it deletes the #2651 Machine, and while
/// the watch has not shown the deletion yet, deletes it again.
#[test]
fn planted_autopilot_ignoring_its_step_in_flight_is_caught() {
    let bugs = Bugs {
        ap_ignores_in_flight: true,
        ..Bugs::default()
    };
    let bounds = Bounds {
        styles: vec![Style::V03],
        failures: 0,
        ..with_autopilot()
    };
    let printed = find(ONE_AT_A_TIME, config(bounds, bugs));
    assert!(
        printed.contains("while its deletion of Machine"),
        "{printed}"
    );
}
