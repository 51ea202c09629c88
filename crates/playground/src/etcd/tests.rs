//! The cluster's unit tests.

use super::*;

#[test]
fn the_member_count_is_checked_first() {
    assert!(matches!(
        EtcdCluster::start(0),
        Err(EtcdError::MemberCount(0))
    ));
    assert!(matches!(
        EtcdCluster::start(MAX_MEMBERS + 1),
        Err(EtcdError::MemberCount(n)) if n == MAX_MEMBERS + 1
    ));
}

/// Needs `etcd` on PATH, like the integration tests; the member exits at once.
#[test]
fn a_member_that_cannot_start_is_named_with_its_port_and_log() {
    let err = match EtcdCluster::start_with_flags(1, &["--no-such-flag"]) {
        Err(e) => e,
        Ok(_) => panic!("etcd accepted --no-such-flag"),
    };
    let text = err.to_string();
    let EtcdError::Exited {
        member,
        client_port,
        log,
        tail,
    } = err
    else {
        panic!("expected Exited, got: {text}");
    };
    assert_eq!(member, "m1");
    assert!(
        text.contains(&format!("client port {client_port}")),
        "{text}"
    );
    assert!(text.contains(&log.display().to_string()), "{text}");
    assert!(tail.contains("--- m1 ("), "{tail}");
    // A failed start leaves its directory, with the log the error names.
    let logged = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        logged.contains("no-such-flag"),
        "{}: {logged}",
        log.display()
    );
    if let Some(dir) = log.parent() {
        let _ = fs::remove_dir_all(dir);
    }
}

/// A started member's status as etcdctl prints it: a leader, and no errors but the alarms every
/// member repeats (a NOSPACE cluster); "no leader" or no leader field means not joined yet.
#[test]
fn a_started_member_shows_a_leader_and_no_errors_but_alarms() {
    let status = |leader: u64, errors: &str| {
        format!(
            r#"[{{"Endpoint":"https://127.0.0.1:1","Status":{{"leader":{leader},"raftIndex":9,"errors":[{errors}]}}}}]"#
        )
    };
    let started = start::has_leader_and_only_alarms;
    assert!(started(&status(7, "")));
    assert!(started(&status(
        7,
        r#""memberID:13441858780612598714 alarm:NOSPACE ","memberID:7 alarm:NOSPACE ""#
    )));
    assert!(!started(&status(0, "")));
    assert!(!started(&status(7, r#""etcdserver: no leader""#)));
    assert!(!started(&status(
        7,
        r#""memberID:7 alarm:NOSPACE ","etcdserver: no leader""#
    )));
    assert!(!started(
        r#"[{"Endpoint":"https://127.0.0.1:1","Status":{"raftIndex":9}}]"#
    ));
    assert!(!started("Error: context deadline exceeded"));
}
