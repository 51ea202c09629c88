use super::*;

fn notice(name: &str, note: &str) -> Notice {
    Notice {
        kind: "Machine".into(),
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        namespace: "ns".into(),
        name: name.into(),
        uid: Some("u-1".into()),
        warning: true,
        reason: "WouldLoseQuorum".into(),
        action: "Delete".into(),
        note: note.into(),
        requester: "jane".into(),
        audit: false,
    }
}

/// Notices from `requester` about Machine `name`, admitted at `now`: how many of `n` pass.
fn admitted(limits: &mut Limits, requester: &str, name: &str, n: usize, now: Instant) -> usize {
    (0..n)
        .filter(|_| {
            let mut notice = notice(name, "denied");
            notice.requester = requester.into();
            limits.admit(&notice, now).is_ok()
        })
        .count()
}

#[test]
fn events_are_limited_per_requester_and_per_object() {
    let t = Instant::now();
    let mut limits = Limits::new();
    // One object: its burst, then nothing until a token comes back.
    assert_eq!(admitted(&mut limits, "jane", "m", 100, t), 10);
    assert_eq!(limits.admit(&notice("m", "x"), t), Err("object_limit"));
    assert_eq!(
        admitted(&mut limits, "jane", "m", 100, t + PER_OBJECT_EVERY),
        1
    );
    // One requester across many objects: its burst, less the 11 spent on `m`, plus what
    // came back in the meantime.
    let spread = (0..100)
        .filter(|i| {
            let mut n = notice(&format!("o{i}"), "x");
            n.requester = "jane".into();
            limits.admit(&n, t + PER_OBJECT_EVERY).is_ok()
        })
        .count();
    let refilled = (PER_OBJECT_EVERY.as_secs() / PER_REQUESTER_EVERY.as_secs()) as u32;
    assert_eq!(spread as u32, PER_REQUESTER_BURST - 11 + refilled);
    let mut n = notice("other", "x");
    n.requester = "jane".into();
    assert_eq!(
        limits.admit(&n, t + PER_OBJECT_EVERY),
        Err("requester_limit")
    );
    // Another requester is not held back by jane's limit, only by the object's.
    assert_eq!(
        admitted(&mut limits, "bob", "fresh", 3, t + PER_OBJECT_EVERY),
        3
    );
    // A flood of made-up requesters on one object: the object's limit holds.
    let mut limits = Limits::new();
    let forged = (0..10_000)
        .filter(|i| {
            let mut n = notice("m", "x");
            n.requester = format!("user-{i}");
            limits.admit(&n, t).is_ok()
        })
        .count();
    assert_eq!(forged as u32, PER_OBJECT_BURST);
}

#[test]
fn records_of_what_the_autopilot_did_pass_every_limit() {
    let t = Instant::now();
    let mut limits = Limits::new();
    // The object's burst used up by notices that are not records.
    let used = admitted(&mut limits, "quorumguard-autopilot", "kcp", 40, t);
    assert_eq!(used as u32, PER_OBJECT_BURST);
    assert_eq!(limits.admit(&notice("kcp", "x"), t), Err("object_limit"));
    // A record of an action still goes out, and takes no token from the others.
    let mut record = notice("kcp", "Autopilot promotes learner m4");
    record.requester = "quorumguard-autopilot".into();
    record.audit = true;
    for _ in 0..PER_REQUESTER_BURST + PER_OBJECT_BURST {
        assert_eq!(limits.admit(&record, t), Ok(()));
    }
}

#[test]
fn the_limiter_remembers_a_bounded_number_of_keys() {
    let t = Instant::now();
    let mut limits = Limits::new();
    // Made-up requesters about made-up objects: each new, each admitted while there is
    // room; then only those whose limits are back to full are forgotten to make room.
    let passed = (0..2 * LIMITER_ENTRIES)
        .filter(|i| {
            let mut n = notice(&format!("o{i}"), "x");
            n.requester = format!("user-{i}");
            limits.admit(&n, t).is_ok()
        })
        .count();
    assert_eq!(passed, LIMITER_ENTRIES);
    assert!(limits.requesters.tokens.len() <= LIMITER_ENTRIES);
    assert!(limits.objects.tokens.len() <= LIMITER_ENTRIES);
    // Once their tokens are back, the old keys make room for new ones.
    let later = t + PER_OBJECT_EVERY * PER_OBJECT_BURST;
    let mut n = notice("new-object", "x");
    n.requester = "new-user".into();
    assert_eq!(limits.admit(&n, later), Ok(()));
    assert!(limits.objects.tokens.len() <= LIMITER_ENTRIES);
}

fn key(name: &str, note: &str) -> Key {
    Key::of(notice(name, note))
}

#[test]
fn each_note_is_its_own_event_and_a_repeat_is_counted() {
    let t = Instant::now();
    let mut s = Series::new(8, SERIES_WINDOW);
    let jane = key("m", "denied DELETE by jane: told A");
    let admin = key("m", "denied DELETE by admin: told B");
    assert_eq!(s.step(&jane, t), Step::Create);
    s.created(jane.clone(), "m.1".into(), t);
    assert_eq!(s.step(&admin, t), Step::Create, "another requester");
    s.created(admin.clone(), "m.2".into(), t);
    let told_c = key("m", "denied DELETE by jane: told C");
    assert_eq!(s.step(&told_c, t), Step::Create, "another message");
    let again = t + Duration::from_secs(30);
    let step = s.step(&jane, again);
    assert_eq!(
        step,
        Step::Count {
            event: "m.1".into(),
            count: 2
        }
    );
    s.counted(&jane, 2, again);
    assert_eq!(
        s.step(&jane, again),
        Step::Count {
            event: "m.1".into(),
            count: 3
        }
    );
    // The same note about another object is another Event.
    assert_eq!(
        s.step(&key("other", "denied DELETE by jane: told A"), t),
        Step::Create
    );
}

#[test]
fn a_series_ends_six_minutes_after_its_last_repeat() {
    let t = Instant::now();
    let mut s = Series::new(8, SERIES_WINDOW);
    let k = key("m", "denied DELETE by jane: told A");
    s.created(k.clone(), "m.1".into(), t);
    let later = t + Duration::from_secs(300);
    s.counted(&k, 2, later);
    assert!(matches!(
        s.step(&k, later + Duration::from_secs(359)),
        Step::Count { count: 3, .. }
    ));
    assert_eq!(s.step(&k, later + SERIES_WINDOW), Step::Create, "aged out");
}

#[test]
fn the_cache_is_bounded_forgetting_aged_then_least_recent_events() {
    let t = Instant::now();
    let mut s = Series::new(3, SERIES_WINDOW);
    for i in 0..3u64 {
        let k = key("m", &format!("note {i}"));
        s.created(k, format!("m.{i}"), t + Duration::from_secs(i));
    }
    // Full, nothing aged: the one observed longest ago goes.
    s.created(
        key("m", "note 3"),
        "m.3".into(),
        t + Duration::from_secs(10),
    );
    assert_eq!(s.len(), 3);
    assert_eq!(
        s.step(&key("m", "note 0"), t + Duration::from_secs(10)),
        Step::Create
    );
    assert!(matches!(
        s.step(&key("m", "note 1"), t + Duration::from_secs(10)),
        Step::Count { .. }
    ));
    // Later, everything has aged: room is made by dropping all of it.
    let late = t + SERIES_WINDOW + Duration::from_secs(60);
    s.created(key("m", "note 4"), "m.4".into(), late);
    assert_eq!(s.len(), 1);
    // Bounded however many distinct notes come.
    for i in 0..100u64 {
        s.created(key("m", &format!("storm {i}")), format!("s.{i}"), late);
    }
    assert_eq!(s.len(), 3);
}

#[test]
fn notes_are_cut_at_1_kb_and_the_cut_note_is_the_key() {
    let long = format!("denied DELETE by jane: {}", "é".repeat(800));
    let k = key("m", &long);
    assert!(k.note.len() <= MAX_NOTE, "{}", k.note.len());
    assert!(k.note.starts_with("denied DELETE by jane: ") && k.note.ends_with("..."));
    // Notes that differ only past the cut publish the same text: the same Event.
    assert_eq!(k, key("m", &format!("{long} and more")));
    assert_ne!(k, key("m", "denied DELETE by jane: short"));
}

#[test]
fn an_event_is_what_kube_apiserver_accepts() {
    let k = key("test-cp-a", "denied DELETE by jane: told A");
    let now = UNIX_EPOCH + Duration::from_nanos(0x18ed_efa8_82c9_cbdd);
    let e = new_event(&k, "quorumguard-0", now);
    let v = serde_json::to_value(&e).expect("json");
    assert_eq!(v["metadata"]["name"], "test-cp-a.18edefa882c9cbdd");
    assert_eq!(v["metadata"]["namespace"], "ns");
    assert_eq!(v["eventTime"], "2026-12-04T03:35:33.418503Z");
    assert_eq!(v["type"], "Warning");
    assert_eq!(v["reason"], "WouldLoseQuorum");
    assert_eq!(v["action"], "Delete");
    assert_eq!(v["note"], "denied DELETE by jane: told A");
    assert_eq!(v["reportingController"], "quorumguard");
    assert_eq!(v["reportingInstance"], "quorumguard-0");
    assert_eq!(
        v["regarding"],
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
               "namespace": "ns", "name": "test-cp-a", "uid": "u-1"})
    );
    assert!(v.get("series").is_none() && v.get("deprecatedCount").is_none());
    assert_eq!(
        series_patch(2, now),
        json!({"series": {"count": 2, "lastObservedTime": "2026-12-04T03:35:33.418503Z"}})
    );
}

#[test]
fn event_names_stay_valid_for_the_longest_object_names() {
    assert_eq!(event_name("m", 255), "m.ff");
    let long = format!("{}-{}", "a".repeat(230), "b".repeat(22));
    let name = event_name(&long, u128::from(u64::MAX));
    assert!(name.len() <= MAX_NAME, "{}", name.len());
    assert!(name.ends_with(".ffffffffffffffff"));
    let dashed = format!("{}-{}", "a".repeat(235), "b".repeat(17));
    let name = event_name(&dashed, u128::from(u64::MAX));
    assert!(!name.contains("-."), "{name}");
    assert_eq!(name, format!("{}.ffffffffffffffff", "a".repeat(235)));
}
