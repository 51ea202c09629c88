//! The autopilot's decision, case by case: every refusal it owes, every action with its proof,
//! and the `FreeSpace` plan walked to its end and stopped on the way.

use super::*;
use crate::model::*;
use crate::testkit::*;

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

/// `three()` with a NOSPACE alarm on every member and databases of `size` bytes.
fn nospace(size: u64) -> ControlPlane {
    let mut c = three();
    for m in members_mut(&mut c).iter_mut() {
        m.alarms.push(Alarm::NoSpace);
        m.db_size = Some(size);
    }
    c
}

#[test]
fn free_space_walks_its_plan_one_step_at_a_time() {
    let mut ask = Ask::on();
    ask.settings.quota_backend_bytes = 1000;
    let mut c = nospace(500);
    let mut steps = Vec::new();
    for _ in 0..8 {
        let d = ask.decide(&c, &c);
        let Decision::Act(a) = d else {
            break;
        };
        ask.book.started(&a, ask.now);
        // etcd after the step, as the next probe shows it.
        match &a.step {
            Step::MoveLeader { from, to } => {
                assert_ne!(from, to);
                for m in members_mut(&mut c).iter_mut() {
                    m.is_leader = m.id == *to;
                }
            }
            Step::Disarm => {
                for m in members_mut(&mut c).iter_mut() {
                    m.alarms.clear();
                }
            }
            _ => {}
        }
        let out = ask.book.settle(&c, ask.settings.interval, ask.now + 5);
        assert!(matches!(out, Some(Outcome::Succeeded(_))), "{out:?}");
        steps.push(a.step.to_string());
        ask.now += 10;
    }
    assert_eq!(
        steps,
        [
            "compact etcd's history",
            "defragment etcd member m2 (id 2)",
            "defragment etcd member m3 (id 3)",
            "move etcd's leadership from 1 to 2",
            "defragment etcd member m1 (id 1)",
            "disarm the NOSPACE alarm",
        ]
    );
    assert_eq!(
        next_action(&c, &Policy::default(), ask.now).code,
        ActionCode::None
    );
}

#[test]
fn free_space_stops_at_a_failed_health_check_and_never_runs_on_corrupt() {
    let mut ask = Ask::on();
    let c = nospace(500);
    let a = acted(ask.decide(&c, &c));
    ask.book.started(&a, NOW);
    ask.book.settle(&c, ask.settings.interval, NOW + 5);
    // m3 down before the first defragmentation: the health check fails.
    let mut sick = c.clone();
    members_mut(&mut sick)[2].health = down();
    let r = refused(ask.decide(&sick, &sick), Why::NotProven);
    assert!(
        r.message.contains("health check before the next step")
            && r.message.contains("not healthy: m3 (id 3)")
            && r.message.contains("compacted, defragmented: none"),
        "{}",
        r.message
    );
    // A failed defragmentation stops the plan where it is.
    let a = acted(ask.decide(&c, &c));
    ask.book.started(&a, NOW + 20);
    ask.book.call_failed("context deadline exceeded", NOW + 20);
    ask.now = NOW + 20 + 600;
    let r = refused(ask.decide(&c, &c), Why::NotProven);
    assert!(
        r.message
            .contains("freeing space stopped: at \"defragment etcd member m2 (id 2)\""),
        "{}",
        r.message
    );
    // CORRUPT: never.
    let mut corrupt = nospace(500);
    members_mut(&mut corrupt)[1].alarms.push(Alarm::Corrupt);
    let published = NextAction {
        code: ActionCode::FreeSpace,
        message: "Free space".into(),
        command: None,
        target: Some("1".into()),
    };
    let book = Book::default();
    let d = decide(&Situation {
        mode: Mode::On,
        settings: &Settings::default(),
        policy: &Policy::default(),
        published: &published,
        fresh: &corrupt,
        basis: EtcdBasis::FreshProbe,
        book: &book,
        now_unix: NOW,
    });
    words(&d);
    // CORRUPT: refused, never a step.
    assert!(
        matches!(
            d,
            Decision::Refuse(Refusal {
                why: Why::Corrupt | Why::Disagrees,
                ..
            })
        ),
        "{d:#?}"
    );
}

#[test]
fn disarm_waits_for_every_database_under_the_quota_and_says_which_kept_its_size() {
    let mut ask = Ask::on();
    ask.settings.quota_backend_bytes = 1000;
    let mut c = nospace(1500);
    members_mut(&mut c)[1].db_size = Some(1200);
    members_mut(&mut c)[2].db_size = Some(900);
    ask.book.free_space = Progress {
        compacted: true,
        compaction_index: Some(1000),
        defragmented: vec![MemberId(2), MemberId(3), MemberId(1)],
        size_before: vec![
            (MemberId(2), 1500),
            (MemberId(3), 1500),
            (MemberId(1), 1500),
        ],
        moved_from: Some(MemberId(1)),
        stopped: None,
    };
    let r = refused(ask.decide(&c, &c), Why::NotProven);
    assert!(
        r.message.contains(
            "not every database is under the quota of 1000 bytes: m1 (1500 bytes, 1500 before its defragmentation: it freed nothing), m2 (1200 bytes, 1500 before its defragmentation)."
        ) && r.message.contains("live data")
            && r.message.contains("delete data or raise --quota-backend-bytes"),
        "{}",
        r.message
    );
}

/// A compaction returns once the leader has applied it; a follower compacts when it applies the
/// same entry. Defragmented before that, it frees nothing: the plan waits for its applied index.
#[test]
fn free_space_defragments_a_member_only_once_it_has_applied_the_compaction() {
    let mut ask = Ask::on();
    ask.settings.quota_backend_bytes = 1000;
    let mut c = nospace(1500);
    let a = acted(ask.decide(&c, &c));
    assert_eq!(a.step, Step::Compact);
    ask.book.started(&a, ask.now);
    // The probe after the compaction: the leader has committed and applied up to 1010; m2 has
    // applied only to 1004, m3 to 1010.
    for (i, m) in members_mut(&mut c).iter_mut().enumerate() {
        m.raft_index = Some(1010);
        m.raft_applied_index = Some(if i == 1 { 1004 } else { 1010 });
    }
    let out = ask.book.settle(&c, ask.settings.interval, ask.now + 5);
    assert!(matches!(out, Some(Outcome::Succeeded(_))), "{out:?}");
    assert_eq!(ask.book.free_space.compaction_index, Some(1010));
    ask.now += 10;
    // m2 first (the first follower in order) would free nothing yet: a wait, naming it.
    let r = refused(ask.decide(&c, &c), Why::CompactionNotApplied);
    assert!(
        r.message.contains(
            "etcd member m2 (id 2) has applied raft entries up to 1004, and the compaction is at or below entry 1010"
        ),
        "{}",
        r.message
    );
    // Caught up: defragmented, its size before noted.
    members_mut(&mut c)[1].raft_applied_index = Some(1012);
    let a = acted(ask.decide(&c, &c));
    assert_eq!(
        a.step,
        Step::Defragment {
            member: MemberId(2),
            name: "m2".into(),
            db_size: Some(1500),
        }
    );
    ask.book.started(&a, ask.now);
    ask.book.settle(&c, ask.settings.interval, ask.now + 5);
    assert_eq!(ask.book.free_space.size_before, [(MemberId(2), 1500)]);
    // A member that does not say what it applied (etcd before 3.4) is for a person.
    members_mut(&mut c)[2].raft_applied_index = None;
    members_mut(&mut c)[2].client_urls = vec!["https://10.0.0.3:2379".into()];
    ask.now += 10;
    let r = refused(ask.decide(&c, &c), Why::NotProven);
    assert!(
        r.message.contains("does not report its applied index")
            && r.message
                .contains("`etcdctl --endpoints=https://10.0.0.3:2379 defrag`"),
        "{}",
        r.message
    );
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
