//! The `FreeSpace` plan walked to its end and stopped on the way: its order, its health check
//! between steps, CORRUPT, the wait for each member to apply the compaction, and the disarm only
//! under the quota.

use super::*;

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
