//! A turn of the pilot on real etcd: a learner nobody promotes (its join interrupted after
//! `member add`) is promoted when the autopilot is on, left alone in dry-run, and the step is
//! settled as done on the next probe.

use std::time::Duration;

use quorumguard_autopilot::{Did, Done, EtcdActor, Pilot, Turn};
use quorumguard_engine::autopilot::{Mode, Outcome, Settings, Step};
use quorumguard_engine::testkit::{NOW, add_machine, cp, members_mut};
use quorumguard_engine::{ActionCode, ControlPlane, EtcdBasis, Policy, next_action};
use quorumguard_observe::etcd::{Probe, Transport};
use testkit::etcd::EtcdCluster;

use crate::probe::probe_until;

const DEADLINE: Duration = Duration::from_secs(5);

/// The control plane as a probe taken now shows it: KCP v1.32 (learner joins) at `replicas`,
/// one Machine per member named after it (created an hour before [`NOW`]).
fn control_plane(p: &Probe, replicas: u32) -> ControlPlane {
    let mut c = cp(replicas, &[]);
    c.kcp.version = Some("v1.32.0".into());
    for m in &p.members {
        add_machine(&mut c, &m.name);
    }
    *members_mut(&mut c) = p.members.clone();
    c
}

fn is_learner(cluster: &mut EtcdCluster, name: &str) -> bool {
    cluster
        .member_list()
        .iter()
        .find(|(_, n, _)| n == name)
        .unwrap_or_else(|| panic!("{name} not listed"))
        .2
}

#[test]
fn a_learner_nobody_promotes_is_promoted_on_and_left_alone_in_dry_run() {
    let mut cluster = EtcdCluster::start(3);
    let l = cluster.add_learner("l1");
    cluster.start_member(l);
    let rt = testkit::etcd::runtime();
    let (_server, kube) = rt.block_on(testkit::kit::setup());
    let actor = EtcdActor::new(cluster.client_tls(), Transport::Direct, DEADLINE);
    let policy = Policy::default();
    // Healthy and caught up: within the engine's lag bound of its leader.
    let p = probe_until(&rt, &cluster, "the learner healthy and caught up", |p| {
        let leader = p
            .members
            .iter()
            .find(|m| m.is_leader)
            .and_then(|m| m.raft_index);
        p.members.iter().any(|m| {
            m.name == "l1"
                && m.is_learner
                && m.health.is_healthy()
                && m.raft_index.zip(leader).is_some_and(|(i, l)| i + 10 >= l)
        })
    });
    let fresh = control_plane(&p, 4);
    let published = next_action(&fresh, &policy, NOW);
    assert_eq!(
        published.code,
        ActionCode::PromoteLearner,
        "{}",
        published.message
    );
    let turn = Turn {
        annotation: None,
        published: &published,
        fresh: &fresh,
        basis: EtcdBasis::FreshProbe,
        machine: None,
        now_unix: NOW,
    };

    // dry-run: says what it would do, does nothing.
    let dry = Pilot::new(Mode::DryRun, Settings::default(), policy.clone(), 1);
    let report = rt.block_on(dry.turn(turn, &actor, &kube));
    match &report.did {
        Did::DryRun { step, message, .. } => {
            assert!(
                matches!(step, Step::Promote { name, .. } if name == "l1"),
                "{step}"
            );
            assert!(message.contains("would promote"), "{message}");
        }
        other => panic!("not a dry run: {other:?}"),
    }
    assert!(is_learner(&mut cluster, "l1"), "dry-run promoted it");

    // on: promoted.
    let pilot = Pilot::new(Mode::On, Settings::default(), policy.clone(), 1);
    let report = rt.block_on(pilot.turn(turn, &actor, &kube));
    match &report.did {
        Did::Acted { result, proof, .. } => {
            assert_eq!(result, &Ok(Done::Etcd(1)), "{report:?}");
            assert!(proof.after.voting == proof.before.voting + 1, "{proof:?}");
        }
        other => panic!("did not act: {other:?}"),
    }
    assert!(!is_learner(&mut cluster, "l1"), "still a learner");

    // The next turn, on the next probe, settles it as done and takes no further action.
    let p2 = probe_until(&rt, &cluster, "l1 voting", |p| {
        p.members.iter().any(|m| m.name == "l1" && !m.is_learner)
    });
    let fresh2 = control_plane(&p2, 4);
    let published2 = next_action(&fresh2, &policy, NOW + 60);
    let report2 = rt.block_on(pilot.turn(
        Turn {
            published: &published2,
            fresh: &fresh2,
            now_unix: NOW + 60,
            ..turn
        },
        &actor,
        &kube,
    ));
    assert!(
        matches!(report2.settled, Some(Outcome::Succeeded(_))),
        "{report2:?}"
    );
    assert!(
        matches!(report2.did, Did::Refused { .. }),
        "acted again: {report2:?}"
    );
}
