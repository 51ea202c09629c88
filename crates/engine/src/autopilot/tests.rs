//! The autopilot's decision, case by case: every refusal it owes, every action with its proof,
//! and (in `free_space`) the `FreeSpace` plan walked to its end and stopped on the way.

use super::*;
use crate::model::*;
use crate::testkit::*;

mod free_space;

/// Three healthy voting members m1 (leader) .. m3 on Machines, 3 replicas, probed just now,
/// raft indexes at 1000.
fn three() -> ControlPlane {
    let mut c = cp(
        3,
        &[("m1", healthy()), ("m2", healthy()), ("m3", healthy())],
    );
    if let EtcdState::Observed(s) = &mut c.etcd {
        s.age = Some(Duration::ZERO);
    }
    for (i, m) in members_mut(&mut c).iter_mut().enumerate() {
        m.is_leader = i == 0;
        m.raft_term = Some(2);
        m.raft_index = Some(1000);
        m.raft_applied_index = Some(1000);
    }
    c
}

/// `three()` plus learner l (id 4) on Machine l, past --learner-grace, `behind` entries behind.
fn stalled_learner(behind: u64) -> ControlPlane {
    let mut c = three();
    c.kcp.replicas = 4;
    add_machine(&mut c, "l");
    add_member(&mut c, 4, "l", healthy(), true);
    let l = members_mut(&mut c).last_mut().expect("learner");
    l.raft_term = Some(2);
    l.raft_index = Some(1000 - behind);
    c
}

struct Ask {
    mode: Mode,
    settings: Settings,
    policy: Policy,
    book: Book,
    now: i64,
    basis: EtcdBasis,
}

impl Ask {
    fn on() -> Ask {
        Ask {
            mode: Mode::On,
            settings: Settings::default(),
            policy: Policy::default(),
            book: Book::default(),
            now: NOW,
            basis: EtcdBasis::FreshProbe,
        }
    }

    /// Decides with the next action published on `record`, on `fresh`.
    fn decide(&mut self, record: &ControlPlane, fresh: &ControlPlane) -> Decision {
        let published = next_action(record, &self.policy, self.now);
        self.book.note_published(&published, self.now);
        let d = decide(&Situation {
            mode: self.mode,
            settings: &self.settings,
            policy: &self.policy,
            published: &published,
            fresh,
            basis: self.basis,
            book: &self.book,
            now_unix: self.now,
        });
        words(&d);
        d
    }
}

/// Every word the autopilot says names the cluster, and says what comes next.
fn words(d: &Decision) {
    let m = match d {
        Decision::Act(a) => &a.message,
        Decision::DryRun { message, .. } => message,
        Decision::Refuse(r) => &r.message,
    };
    assert!(
        m.contains("KubeadmControlPlane ns/kcp") && m.contains("Next"),
        "{m}"
    );
}

fn acted(d: Decision) -> Act {
    match d {
        Decision::Act(a) => a,
        d => panic!("expected an action, got {d:#?}"),
    }
}

fn refused(d: Decision, why: Why) -> Refusal {
    match d {
        Decision::Refuse(r) if r.why == why => r,
        d => panic!("expected a refusal {why:?}, got {d:#?}"),
    }
}

#[test]
fn the_more_restrictive_mode_wins_and_a_typo_is_off() {
    assert_eq!(Mode::effective(Mode::On, None), Mode::On);
    assert_eq!(Mode::effective(Mode::On, Some("dry-run")), Mode::DryRun);
    assert_eq!(Mode::effective(Mode::Off, Some("on")), Mode::Off);
    assert_eq!(Mode::effective(Mode::DryRun, Some("on")), Mode::DryRun);
    assert_eq!(Mode::effective(Mode::On, Some("yes")), Mode::Off);
    assert_eq!(Kind::parse("free-space"), Some(Kind::FreeSpace));
    assert_eq!(Kind::of(ActionCode::RemediateMachine), None);
}

#[test]
fn a_stalled_learner_in_sync_is_promoted_with_its_proof() {
    let c = stalled_learner(10);
    let a = acted(Ask::on().decide(&c, &c));
    assert!(
        a.message.contains("(KubeadmControlPlane ns/kcp)"),
        "{}",
        a.message
    );
    assert_eq!(
        a.step,
        Step::Promote {
            member: MemberId(4),
            name: "l".into()
        }
    );
    assert_eq!(
        a.proof.before,
        Count {
            voting: 3,
            healthy: 3
        }
    );
    assert_eq!(
        a.proof.after,
        Count {
            voting: 4,
            healthy: 4
        }
    );
    assert!(
        a.message.contains("learner l (id 4) of Machine ns/l")
            && a.message.contains("raft index 990 of the leader's 1000, 10 behind")
            && a.message.contains("before 3 healthy of 3 voting members, quorum 2; after 4 healthy of 4 voting members, quorum 3")
            && a.message.contains("Next: the next probe must show it a healthy voting member"),
        "{}",
        a.message
    );
}

#[test]
fn a_learner_too_far_behind_is_not_promoted_though_etcd_would() {
    // 90 % of 1000 is 900: etcd promotes 100 behind. With the autopilot's bound at 50 it waits.
    let c = stalled_learner(100);
    let mut ask = Ask::on();
    ask.settings.max_learner_lag = 50;
    let r = refused(ask.decide(&c, &c), Why::NotProven);
    assert!(r.message.contains("100 entries behind"), "{}", r.message);
    // Within the bound: promoted.
    ask.settings.max_learner_lag = 100;
    acted(ask.decide(&c, &c));
}

#[test]
fn acting_on_the_record_is_refused() {
    let c = stalled_learner(0);
    let mut ask = Ask::on();
    ask.basis = EtcdBasis::Record;
    let r = refused(ask.decide(&c, &c), Why::NotFresh);
    assert!(
        r.message.contains("KubeadmControlPlane ns/kcp"),
        "{}",
        r.message
    );
}

#[test]
fn the_fresh_probe_overrules_the_published_action() {
    // Published on the record: promote l. Just now l does not answer: on the fresh probe the
    // next action is another one, and the autopilot does not act.
    let record = stalled_learner(0);
    let mut fresh = record.clone();
    members_mut(&mut fresh)[3].health = Health::Unhealthy("did not answer just now".into());
    let r = refused(Ask::on().decide(&record, &fresh), Why::Disagrees);
    assert!(
        r.message
            .contains("the published next action is PromoteLearner 4"),
        "{}",
        r.message
    );
}

#[test]
fn nothing_without_quorum_during_an_election_or_with_health_unknown() {
    let record = stalled_learner(0);
    let mut lost = record.clone();
    for m in members_mut(&mut lost).iter_mut().skip(1).take(2) {
        m.health = down();
    }
    let r = refused(Ask::on().decide(&record, &lost), Why::QuorumLost);
    assert!(
        r.message
            .contains("1 healthy of 3 voting members, quorum 2"),
        "{}",
        r.message
    );

    let mut election = record.clone();
    for m in members_mut(&mut election).iter_mut() {
        m.is_leader = false;
    }
    refused(Ask::on().decide(&record, &election), Why::LeaderElection);

    let mut unknown = record.clone();
    members_mut(&mut unknown)[2].health = Health::Unconfirmed("too few answered".into());
    refused(Ask::on().decide(&record, &unknown), Why::HealthUnknown);

    let mut gone = record.clone();
    gone.etcd = EtcdState::Unknown {
        reason: "the probe failed".into(),
    };
    refused(Ask::on().decide(&record, &gone), Why::HealthUnknown);
}

#[test]
fn one_action_at_a_time_and_one_per_interval() {
    let c = stalled_learner(0);
    let mut ask = Ask::on();
    let a = acted(ask.decide(&c, &c));
    ask.book.started(&a, NOW);
    let r = refused(ask.decide(&c, &c), Why::InFlight);
    assert!(r.message.contains("not re-proven yet"), "{}", r.message);
    // The next probe shows l promoted: re-proven.
    let mut after = c.clone();
    members_mut(&mut after)[3].is_learner = false;
    let out = ask.book.settle(&after, ask.settings.interval, NOW + 10);
    assert!(matches!(out, Some(Outcome::Succeeded(_))), "{out:?}");
    // Another learner now: held by the interval, dry-run says when.
    let mut next = after.clone();
    next.kcp.replicas = 5;
    add_machine(&mut next, "k");
    add_member(&mut next, 5, "k", healthy(), true);
    members_mut(&mut next)[4].raft_index = Some(1000);
    ask.now = NOW + 60;
    let r = refused(ask.decide(&next, &next), Why::Interval);
    assert_eq!(r.until_unix, Some(NOW + 300));
    ask.mode = Mode::DryRun;
    match ask.decide(&next, &next) {
        Decision::DryRun {
            at_unix, message, ..
        } => {
            assert_eq!(at_unix, NOW + 300);
            assert!(
                message.starts_with("Autopilot (dry-run) would promote learner k (id 5) on KubeadmControlPlane ns/kcp at 2027-01-15T08:05:00Z"),
                "{message}"
            );
        }
        d => panic!("{d:#?}"),
    }
    ask.mode = Mode::On;
    ask.now = NOW + 300;
    acted(ask.decide(&next, &next));
}

#[test]
fn a_failure_backs_off_and_three_give_up() {
    let c = stalled_learner(0);
    let mut ask = Ask::on();
    for n in 1..=3u32 {
        let a = acted(ask.decide(&c, &c));
        ask.book.started(&a, ask.now);
        assert!(matches!(
            ask.book.call_failed(
                "etcdserver: can only promote a learner member which is in sync with leader",
                ask.now
            ),
            Outcome::Failed(_)
        ));
        let r = refused(
            ask.decide(&c, &c),
            if n < 3 { Why::BackOff } else { Why::GaveUp },
        );
        if n < 3 {
            let back = 600 * i64::from(1u32 << (n - 1));
            assert_eq!(r.until_unix, Some(ask.now + back), "{}", r.message);
            ask.now += back;
        } else {
            assert!(
                r.message.contains("failed 3 times in a row"),
                "{}",
                r.message
            );
        }
    }
}

#[test]
fn an_unclaimed_member_waits_for_kcp_then_goes() {
    // A member no Machine claims, healthy: 4 voting, removing it keeps 3 of 3.
    let mut c = three();
    add_member(&mut c, 9, "stray", healthy(), false);
    members_mut(&mut c)[3].raft_term = Some(2);
    let mut ask = Ask::on();
    let r = refused(ask.decide(&c, &c), Why::KcpChance);
    assert_eq!(r.until_unix, Some(NOW + 180));
    assert!(r.message.contains("reconcileEtcdMembers"), "{}", r.message);
    ask.now = NOW + 180;
    let a = acted(ask.decide(&c, &c));
    assert_eq!(
        a.proof.after,
        Count {
            voting: 3,
            healthy: 3
        }
    );
    assert!(
        a.message.contains(
            "stray (id 9) of KubeadmControlPlane ns/kcp, healthy, but no Machine claims it"
        ),
        "{}",
        a.message
    );
}

#[test]
fn the_2651_machine_is_deleted_but_never_one_that_holds_a_member() {
    // Machine m4 has a node, its member is gone, 4 Machines for 3 replicas.
    let mut c = three();
    add_machine(&mut c, "m4");
    let a = acted(Ask::on().decide(&c, &c));
    assert_eq!(
        a.step,
        Step::DeleteMachine {
            machine: "m4".into()
        }
    );
    assert_eq!(a.proof.before, a.proof.after);
    // Published on a record where m4 had no member; just now its member is back (its node
    // joined again): on the fresh probe the next action differs.
    let mut fresh = c.clone();
    add_member(&mut fresh, 4, "m4", healthy(), false);
    refused(Ask::on().decide(&c, &fresh), Why::Disagrees);
}

#[test]
fn off_and_left_out_actions_do_nothing_and_say_so() {
    let c = stalled_learner(0);
    let mut ask = Ask::on();
    ask.mode = Mode::Off;
    refused(ask.decide(&c, &c), Why::Off);
    ask.mode = Mode::On;
    ask.settings.actions.remove(&Kind::PromoteLearner);
    let r = refused(ask.decide(&c, &c), Why::ActionNotAllowed);
    assert!(
        r.message.contains("etcdctl member promote 4"),
        "{}",
        r.message
    );
    // A remediation is never the autopilot's.
    let mut sick = three();
    members_mut(&mut sick)[2].health = down();
    refused(Ask::on().decide(&sick, &sick), Why::NotAnAutopilotAction);
}

#[test]
fn a_member_that_never_started_goes_and_costs_no_healthy_member() {
    // 3 healthy + 1 added and never started (voting): 4 voting, 3 healthy, quorum 3. Removing it
    // leaves 3 of 3, quorum 2. No Machine is joining (all are old).
    let mut c = three();
    add_member(&mut c, 7, "", Health::Unknown, false);
    let mut ask = Ask::on();
    ask.now = NOW;
    refused(ask.decide(&c, &c), Why::KcpChance);
    ask.now = NOW + 180;
    let a = acted(ask.decide(&c, &c));
    assert_eq!(
        a.proof.before,
        Count {
            voting: 4,
            healthy: 3
        }
    );
    assert_eq!(
        a.proof.after,
        Count {
            voting: 3,
            healthy: 3
        }
    );
    assert!(
        a.message
            .contains("(unstarted 7) (id 7) of KubeadmControlPlane ns/kcp, never started"),
        "{}",
        a.message
    );
}

#[test]
fn nothing_on_a_paused_cluster() {
    // `clusterctl move` pauses the Cluster while it moves it: the autopilot stays out.
    let mut c = stalled_learner(0);
    c.cluster.paused = true;
    let r = refused(Ask::on().decide(&c, &c), Why::Paused);
    assert!(r.message.contains("clusterctl move"), "{}", r.message);
}

#[test]
fn the_probe_after_a_step_re_proves_it() {
    let c = stalled_learner(0);
    let mut ask = Ask::on();
    let a = acted(ask.decide(&c, &c));
    ask.book.started(&a, NOW);
    // Promoted, but down on the probe after: under way within the interval, then a failure.
    let mut after = c.clone();
    members_mut(&mut after)[3].is_learner = false;
    members_mut(&mut after)[3].health = down();
    let interval = ask.settings.interval;
    let out = ask.book.settle(&after, interval, NOW + 10);
    assert!(matches!(out, Some(Outcome::UnderWay(_))), "{out:?}");
    let out = ask.book.settle(&after, interval, NOW + 300);
    assert!(
        matches!(&out, Some(Outcome::Failed(w)) if w.contains("predicted 4 healthy of 4 voting members")),
        "{out:?}"
    );
    assert_eq!((ask.book.failures, ask.book.in_flight.is_none()), (1, true));

    // The #2651 Machine gone, and meanwhile KCP removed another member: the deletion is
    // re-proven (etcd keeps its quorum; the other member's going is not the step's).
    let mut c = three();
    add_machine(&mut c, "m4");
    let mut ask = Ask::on();
    let a = acted(ask.decide(&c, &c));
    ask.book.started(&a, NOW);
    let mut gone = c.clone();
    gone.machines.retain(|m| m.name != "m4");
    members_mut(&mut gone).remove(2);
    let out = ask.book.settle(&gone, interval, NOW + 10);
    assert!(matches!(out, Some(Outcome::Succeeded(_))), "{out:?}");
}
