//! The unit tests of [`crate::dumps::etcdctl`]: each output, IDs, and the snapshot they make.

use super::*;

fn fixture(scenario: &str, file: &str) -> String {
    fixture_of("etcd", scenario, file)
}

/// A file of tests/fixtures/`etcd`/`scenario`/ (`etcd`: "etcd" for 3.4.23, "etcd-3.5.1").
fn fixture_of(etcd: &str, scenario: &str, file: &str) -> String {
    let path = format!(
        "{}/../../tests/fixtures/{etcd}/{scenario}/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).expect("fixture readable")
}

/// The hex IDs `etcdctl member list -w simple` printed, by member name.
fn simple_ids(scenario: &str) -> Vec<(String, u64)> {
    fixture(scenario, "member-list.txt")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(", ").collect();
            (f[2].to_string(), parse_hex_id(f[0]).expect("hex id"))
        })
        .collect()
}

fn load(scenario: &str, alarms: &[AlarmEntry]) -> (EtcdSnapshot, Vec<String>) {
    let members = parse_member_list(&fixture(scenario, "member-list.json")).unwrap();
    let status = parse_endpoint_status(&fixture(scenario, "endpoint-status.json")).unwrap();
    let health = parse_endpoint_health(&fixture(scenario, "endpoint-health.json")).unwrap();
    snapshot(members, Some(&status), Some(&health), alarms)
}

fn by_name<'a>(s: &'a EtcdSnapshot, name: &str) -> &'a Member {
    s.members.iter().find(|m| m.name == name).expect("member")
}

#[test]
fn big_ids_are_exact() {
    for scenario in [
        "healthy",
        "one-stopped",
        "quorum-lost",
        "learner-unstarted",
        "learner",
        "one-removed",
        "nospace",
    ] {
        let members = parse_member_list(&fixture(scenario, "member-list.json")).unwrap();
        let ids = simple_ids(scenario);
        assert_eq!(members.len(), ids.len(), "{scenario}");
        for (name, id) in ids {
            let m = members
                .iter()
                .find(|m| m.name == name)
                .unwrap_or_else(|| panic!("{scenario}: {name:?} missing"));
            assert_eq!(m.id, MemberId(id), "{scenario} {name}");
        }
    }
    // The fixtures' IDs are beyond 2^53: an f64 detour would have changed them.
    let members = parse_member_list(&fixture("healthy", "member-list.json")).unwrap();
    assert!(members.iter().all(|m| m.id.0 > 1 << 53));
    assert!(members.iter().any(|m| (m.id.0 as f64) as u64 != m.id.0));
}

#[test]
fn hex_string_ids_and_bad_ids() {
    let m = parse_member_list(
        r#"{"members":[{"ID":"b9fcd8adcfb8a4f1","name":"a","clientURLs":["https://x:1"]}]}"#,
    )
    .unwrap();
    assert_eq!(m[0].id, MemberId(0xb9fc_d8ad_cfb8_a4f1));
    let e = parse_member_list(r#"{"members":[{"ID":1.5e19,"name":"a"}]}"#).unwrap_err();
    assert!(e.to_string().contains("not an exact"), "{e}");
    let e = parse_member_list(r#"{"members":[{"ID":"zz","name":"a"}]}"#).unwrap_err();
    assert!(e.to_string().contains("not a hex number"), "{e}");
    let e = parse_member_list(r#"{"members":[{"ID":-3,"name":"a"}]}"#).unwrap_err();
    assert!(e.to_string().contains("negative"), "{e}");
    assert!(matches!(
        parse_member_list(r#"{"members":[]}"#),
        Err(EtcdctlError::NoMembers)
    ));
    assert!(matches!(
        parse_member_list("{not json"),
        Err(EtcdctlError::Json(_))
    ));
    // An endpoint health output given as the member list.
    let e = parse_member_list(&fixture("healthy", "endpoint-health.json")).unwrap_err();
    assert!(e.to_string().contains(MEMBER_LIST), "{e}");
}

#[test]
fn healthy_cluster() {
    let (s, warnings) = load("healthy", &[]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(s.age, None);
    assert_eq!(s.members.len(), 3);
    assert!(s.members.iter().all(|m| m.health == Health::Healthy));
    assert_eq!(s.members.iter().filter(|m| m.is_leader).count(), 1);
    let m = by_name(&s, "cp-node-1");
    assert_eq!(m.version.as_deref(), Some("3.4.23"));
    assert!(m.db_size.is_some_and(|d| d > 0));
    assert!(m.raft_index.is_some_and(|i| i > 0));
}

#[test]
fn stopped_member_is_unhealthy_and_warned_about() {
    let (s, warnings) = load("one-stopped", &[]);
    assert_eq!(
        by_name(&s, "cp-node-2").health,
        Health::Unhealthy("context deadline exceeded".into())
    );
    assert!(by_name(&s, "cp-node-1").health.is_healthy());
    assert!(by_name(&s, "cp-node-3").health.is_healthy());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("cp-node-2"), "{warnings:?}");
}

#[test]
fn without_health_data_health_is_unknown() {
    let members = parse_member_list(&fixture("healthy", "member-list.json")).unwrap();
    let (s, warnings) = snapshot(members, None, None, &[]);
    assert!(warnings.is_empty());
    assert!(s.members.iter().all(|m| m.health == Health::Unknown));
}

#[test]
fn status_alone_gives_health() {
    let members = parse_member_list(&fixture("one-stopped", "member-list.json")).unwrap();
    let status = parse_endpoint_status(&fixture("one-stopped", "endpoint-status.json")).unwrap();
    let (s, _) = snapshot(members, Some(&status), None, &[]);
    assert!(by_name(&s, "cp-node-1").health.is_healthy());
    assert_eq!(by_name(&s, "cp-node-2").health, Health::Unknown);
}

#[test]
fn quorum_lost_survivor_has_no_leader() {
    let (s, _) = load("quorum-lost", &[]);
    assert!(s.members.iter().all(|m| !m.health.is_healthy()));
    assert_eq!(
        by_name(&s, "cp-node-1").health,
        Health::Unhealthy("context deadline exceeded; etcdserver: no leader".into())
    );
    assert!(s.members.iter().all(|m| !m.is_leader));
    let status = parse_endpoint_status(&fixture("quorum-lost", "endpoint-status.json")).unwrap();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].leader, None);
    assert_eq!(status[0].errors, vec!["etcdserver: no leader".to_string()]);
}

#[test]
fn unstarted_learner() {
    let (s, warnings) = load("learner-unstarted", &[]);
    assert!(warnings.is_empty(), "{warnings:?}");
    let u: Vec<&Member> = s.members.iter().filter(|m| m.is_unstarted()).collect();
    assert_eq!(u.len(), 1);
    assert!(u[0].is_learner);
    assert!(u[0].client_urls.is_empty());
    assert!(!u[0].peer_urls.is_empty());
    assert!(!u[0].effective_health().is_healthy());
}

#[test]
fn started_learner_is_judged_by_its_status() {
    let (s, warnings) = load("learner", &[]);
    assert!(warnings.is_empty(), "{warnings:?}");
    let l = by_name(&s, "cp-node-4");
    assert!(l.is_learner);
    assert_eq!(l.health, Health::Healthy);
    assert_eq!(s.members.iter().filter(|m| m.is_learner).count(), 1);
}

#[test]
fn nospace_alarm_is_attached_to_its_member_only() {
    let alarms = parse_alarm_list(&fixture("nospace", "alarm-list.txt")).unwrap();
    assert_eq!(alarms.len(), 1);
    assert_eq!(alarms[0].alarm, Alarm::NoSpace);
    let (s, warnings) = load("nospace", &alarms);
    assert!(warnings.is_empty(), "{warnings:?}");
    let with: Vec<&Member> = s.members.iter().filter(|m| !m.alarms.is_empty()).collect();
    assert_eq!(with.len(), 1);
    assert_eq!(with[0].id, alarms[0].member_id);
    assert_eq!(with[0].alarms, vec![Alarm::NoSpace]);
    // The status errors alone name the same alarm.
    let (s2, _) = load("nospace", &[]);
    assert_eq!(s2, s);
    assert!(s.members.iter().all(|m| m.health.is_healthy()));
    // NOSPACE stops writes, not raft: the member stays healthy for the quorum rules.
    assert!(with[0].effective_health().is_healthy());
}

#[test]
fn entries_for_unknown_endpoints_are_warned_and_ignored() {
    // Health and status taken before cp-node-1 was removed, member list after.
    let members = parse_member_list(&fixture("one-removed", "member-list.json")).unwrap();
    let health = parse_endpoint_health(&fixture("learner", "endpoint-health.json")).unwrap();
    let status = parse_endpoint_status(&fixture("learner", "endpoint-status.json")).unwrap();
    let (s, warnings) = snapshot(members, Some(&status), Some(&health), &[]);
    assert_eq!(s.members.len(), 3);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .all(|w| w.contains("not in the member list"))
    );
}

#[test]
fn status_is_matched_by_member_id_before_endpoint() {
    let members = parse_member_list(&fixture("healthy", "member-list.json")).unwrap();
    let mut status = parse_endpoint_status(&fixture("healthy", "endpoint-status.json")).unwrap();
    // A member re-added at the same URL reports a new ID: its status is not the old one's.
    status[0].member_id = Some(MemberId(42));
    let (s, warnings) = snapshot(members, Some(&status), None, &[]);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("(member 2a) is not in the member list")),
        "{warnings:?}"
    );
    assert_eq!(
        s.members
            .iter()
            .filter(|m| m.health == Health::Unknown)
            .count(),
        1
    );
}

#[test]
fn alarm_list_lines() {
    assert!(parse_alarm_list("").unwrap().is_empty());
    let a = parse_alarm_list("memberID:10 alarm:CORRUPT\n\nmemberID:0x0b alarm:FOO \n").unwrap();
    assert_eq!(
        a,
        vec![
            AlarmEntry {
                member_id: MemberId(10),
                alarm: Alarm::Corrupt
            },
            AlarmEntry {
                member_id: MemberId(11),
                alarm: Alarm::Other("FOO".into())
            }
        ]
    );
    let e = parse_alarm_list("memberID:10 alarm:NOSPACE\nhello").unwrap_err();
    assert!(e.to_string().starts_with("line 2:"), "{e}");
    let e = parse_alarm_list("memberID:x alarm:NOSPACE").unwrap_err();
    assert!(e.to_string().contains("not a number"), "{e}");
}

#[test]
fn endpoint_keys_ignore_scheme_and_slash() {
    assert_eq!(endpoint_key("https://127.0.0.1:2379/"), "127.0.0.1:2379");
    assert_eq!(endpoint_key("127.0.0.1:2379"), "127.0.0.1:2379");
}

fn fixture_35(file: &str) -> String {
    fixture_of("etcd-3.5.1", "quorum-lost", file)
}

#[test]
fn a_failed_member_list_is_told_from_a_bad_one() {
    // etcdctl 3.5.1 without a leader: nothing on stdout, its error on stderr (real output).
    assert_eq!(
        failed_member_list(&fixture_35("member-list.json")).as_deref(),
        Some("the dump is empty, etcdctl printed none")
    );
    assert_eq!(
        failed_member_list(&fixture_35("member-list.stderr")).as_deref(),
        Some("etcdctl failed: \"context deadline exceeded\"")
    );
    // A member list, or anything else, is not a failure: it is parsed (and may be wrong).
    assert_eq!(
        failed_member_list(&fixture("healthy", "member-list.json")),
        None
    );
    assert_eq!(failed_member_list("{not json"), None);
    assert_eq!(failed_member_list("members: none"), None);
}

#[test]
fn endpoints_seen_says_what_status_showed_and_nothing_more() {
    let status = parse_endpoint_status(&fixture_35("endpoint-status.json")).unwrap();
    assert_eq!(
        endpoints_seen(Some(&status)),
        "1 member answers its status (etcd 3.5.1), none has a leader, error \"etcdserver: no leader\""
    );
    let healthy = parse_endpoint_status(&fixture("healthy", "endpoint-status.json")).unwrap();
    let leader = healthy[0].leader.expect("a leader");
    assert_eq!(
        endpoints_seen(Some(&healthy)),
        format!("3 members answer their status (etcd 3.4.23), 3 of them with leader {leader}")
    );
    assert_eq!(endpoints_seen(Some(&[])), "no endpoint answered its status");
    assert_eq!(endpoints_seen(None), "no endpoint status dump to say more");
}
