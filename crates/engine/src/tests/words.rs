//! The words a 3 a.m. reader meets, over a broad enumeration of control planes (issue 40 item
//! 4): every denial's first line is short and the detail follows on the next lines, no figure
//! reads as a negative fault tolerance, every next action is an action or says plainly that none
//! is needed, and a change to an even replica count with stacked etcd says that KCP's own
//! webhook refuses it.
//!
//! The states: 1 to 4 voting members of every health and kind of Machine (the exhaustive
//! search's classes), 0 or 1 learner, the extra Machines without a member, 1 to 5 replicas (even
//! ones included), both join styles, and one twist each that the exhaustive search does not
//! visit (a young Machine, an unstarted member, a NOSPACE alarm, a remediation request, stale
//! health, an unknown member list, a teardown, external etcd). Every deletion by a person and by
//! KCP, every replica change from 0 to 6, and the next action are read.

use crate::testkit::*;
use crate::*;

use super::oracle::*;

/// Under ~200 characters: kubectl prefixes its own `admission webhook "..." denied the
/// request: ` and a terminal shows the rest on the following lines.
const FIRST_LINE_MAX: usize = 200;

/// How a next action may begin: an imperative verb, or the plain statement that none is
/// needed (code `None` only).
const VERBS: [&str; 11] = [
    "Wait", "Let", "Check", "Restore", "Free", "Delete", "Promote", "Remove", "Ask", "Bring",
    "Take",
];
const NONE_NEEDED: &str = "No action needed";

/// The reason of a replica count KCP's own webhook refuses.
const REFUSED: &str = "KcpRefusesReplicas";

#[derive(Clone, Copy, Debug)]
enum Twist {
    None,
    YoungMachine,
    Unstarted,
    NoSpace,
    Remediating,
    Stale,
    UnknownEtcd,
    Teardown,
    External,
}

const TWISTS: [Twist; 9] = [
    Twist::None,
    Twist::YoungMachine,
    Twist::Unstarted,
    Twist::NoSpace,
    Twist::Remediating,
    Twist::Stale,
    Twist::UnknownEtcd,
    Twist::Teardown,
    Twist::External,
];

fn twisted(mut c: ControlPlane, t: Twist) -> ControlPlane {
    match t {
        Twist::None => {}
        Twist::YoungMachine => {
            let i = add_machine(&mut c, "y-young");
            c.machines[i].created_unix = Some(NOW - 30);
        }
        Twist::Unstarted => add_member(&mut c, 99, "", Health::Unknown, false),
        Twist::NoSpace => {
            if let Some(m) = members_mut(&mut c).first_mut() {
                m.alarms.push(Alarm::NoSpace);
            }
        }
        Twist::Remediating => {
            if let Some(m) = c.machines.iter_mut().find(|m| !m.deleting) {
                m.annotations
                    .insert(ANNOTATION_REMEDIATE.to_string(), String::new());
            }
        }
        Twist::Stale => {
            if let EtcdState::Observed(s) = &mut c.etcd {
                s.age = Some(std::time::Duration::from_secs(3600));
            }
        }
        Twist::UnknownEtcd => {
            c.etcd = EtcdState::Unknown {
                reason: "no etcd endpoint answered the member list".into(),
            }
        }
        Twist::Teardown => c.cluster.deleting = true,
        Twist::External => c.kcp.etcd = EtcdTopology::External,
    }
    c
}

/// Every control plane of the enumeration, with a description for failure messages.
fn states() -> Vec<(ControlPlane, String)> {
    let mut out = Vec::new();
    for n in 1..=4 {
        for voting in voting_sets(n) {
            for learners in [vec![], vec![Owner::Active], vec![Owner::Orphan]] {
                for extra in [Extra::None, Extra::NodeNoMember, Extra::NeverJoined] {
                    for replicas in 1..=5 {
                        for learner_joins in [false, true] {
                            let (mut c, _) = build(&voting, &learners, extra, replicas);
                            if learner_joins {
                                c.kcp.version = Some("v1.32.0".into());
                            }
                            for t in TWISTS {
                                out.push((
                                    twisted(c.clone(), t),
                                    format!(
                                        "voting={voting:?} learners={learners:?} extra={extra:?} replicas={replicas} learner_joins={learner_joins} twist={t:?}"
                                    ),
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Runs `check` on every state, two threads (the machines this runs on have two cores).
fn for_every_state(check: impl Fn(&ControlPlane, &str) + Sync) -> usize {
    let all = states();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let (all, check) = (&all, &check);
                scope.spawn(move || {
                    for (c, ctx) in all.iter().skip(t).step_by(2) {
                        check(c, ctx);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a words thread panicked");
        }
    });
    all.len()
}

/// Every verdict a state gives: each deletion by a person and by KCP, each replica change from
/// 0 to 6.
fn verdicts(c: &ControlPlane) -> Vec<(String, Verdict)> {
    let policy = Policy::default();
    let mut out = Vec::new();
    for m in &c.machines {
        for who in [human(), kcp_controller()] {
            let op = Operation::DeleteMachine(m.clone());
            out.push((
                format!("delete {} as {}", m.name, who.username),
                decide(c, &op, &who, &policy, NOW),
            ));
        }
    }
    for to in 0..=6 {
        let op = Operation::UpdateKcp {
            replicas_from: c.kcp.replicas,
            replicas_to: to,
            starts_rollout: false,
        };
        out.push((
            format!("scale to {to}"),
            decide(c, &op, &human(), &policy, NOW),
        ));
    }
    out
}

#[test]
fn every_denial_opens_with_a_short_line_and_the_detail_follows() {
    let n = for_every_state(|c, ctx| {
        for (what, v) in verdicts(c) {
            if v.allowed {
                continue;
            }
            let first = v.message.lines().next().unwrap_or("");
            assert!(
                first.chars().count() < FIRST_LINE_MAX,
                "{what}: the first line has {} characters: {first:?}\n{ctx}",
                first.chars().count()
            );
            assert!(
                v.message.contains("\nNext safe action: "),
                "{what}: the next action is not on a line of its own: {:?}\n{ctx}",
                v.message
            );
            assert!(
                v.message.lines().count() >= 2,
                "{what}: no detail after the first line: {:?}\n{ctx}",
                v.message
            );
        }
    });
    assert!(n > 100_000, "only {n} states");
}

/// "KCP removes Machines a, b" names two or more; one is "Machine a".
#[test]
fn a_list_of_machines_agrees_with_its_count() {
    for_every_state(|c, ctx| {
        for (what, v) in verdicts(c) {
            for (i, _) in v.message.match_indices("Machines ") {
                let rest = &v.message[i + "Machines ".len()..];
                let name = rest.split_whitespace().next().unwrap_or("");
                let bare = name.trim_end_matches([';', ')', '.', ':']);
                // "Machines a, b": the first name ends with a comma. Anything else after
                // "Machines " is a sentence ("Machines being deleted", "4 Machines for 3").
                let is_machine = c.machines.iter().any(|m| m.name == bare);
                assert!(
                    !is_machine || name.ends_with(','),
                    "{what}: one Machine named as many: {:?}\n{ctx}",
                    v.message
                );
            }
        }
    });
}

#[test]
fn no_negative_fault_tolerance_anywhere() {
    for_every_state(|c, ctx| {
        let a = next(c);
        let mut texts = vec![("next action".to_string(), a.message)];
        for (what, v) in verdicts(c) {
            for w in v.warnings {
                texts.push((format!("{what}: warning"), w));
            }
            texts.push((what, v.message));
        }
        for (what, t) in texts {
            assert!(
                !t.contains("tolerance -") && !t.contains("tolerance is -"),
                "{what}: {t:?}\n{ctx}"
            );
        }
    });
}

#[test]
fn every_next_action_is_an_action_or_says_none_is_needed() {
    for_every_state(|c, ctx| {
        let a = next(c);
        let m = &a.message;
        if a.code == ActionCode::None {
            assert!(m.starts_with(NONE_NEEDED), "{}: {m:?}\n{ctx}", a.code);
        } else {
            let first = m.split([' ', ':', ',']).next().unwrap_or("");
            assert!(
                VERBS.contains(&first),
                "{} does not begin with an action: {m:?}\n{ctx}",
                a.code
            );
        }
    });
}

/// Cluster API v1.14 `controlplane/kubeadm/internal/webhooks/kubeadm_control_plane.go`
/// `validateKubeadmControlPlaneSpec` (called by `ValidateCreate` and `ValidateUpdate`):
/// `spec.replicas` "cannot be less than or equal to 0", and "cannot be an even number when etcd
/// is stacked" (no `clusterConfiguration.etcd.external`).
#[test]
fn a_replica_count_kcp_refuses_is_called_what_kcp_does() {
    for_every_state(|c, ctx| {
        for (what, v) in verdicts(c) {
            let Some(to) = what
                .strip_prefix("scale to ")
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let refused = to == 0 || (to % 2 == 0 && c.kcp.etcd == EtcdTopology::Stacked);
            let unchanged = to == c.kcp.replicas;
            let gone = c.cluster.deleting || c.kcp.deleting;
            if !refused || unchanged || gone {
                assert_ne!(v.reason.as_str(), REFUSED, "{what}\n{ctx}");
                continue;
            }
            assert_eq!(
                (v.allowed, v.reason.as_str()),
                (false, REFUSED),
                "{what}: {}\n{ctx}",
                v.message
            );
            assert!(
                v.message.contains("KCP's own webhook refuses"),
                "{what}: {}\n{ctx}",
                v.message
            );
            assert!(!v.message.contains("safe;"), "{what}: {}\n{ctx}", v.message);
        }
    });
}

/// A next action that waits on the deletion of a Machine whose etcd member is already gone
/// does not say KCP "removes the etcd member": there is none left to remove.
#[test]
fn a_deletion_without_a_member_is_not_said_to_remove_one() {
    let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
    add_machine(&mut c, "gone");
    machine_mut(&mut c, "gone").deleting = true;
    let a = next(&c);
    assert_eq!(a.code, ActionCode::WaitForDeletion, "{a:?}");
    assert_eq!(a.target.as_deref(), Some("gone"), "{a:?}");
    assert!(
        !a.message.contains("removes the etcd member") && a.message.contains("already gone"),
        "{:?}",
        a.message
    );
}

/// One replica is "1 replica".
#[test]
fn one_replica_is_singular() {
    let n = for_every_state(|c, ctx| {
        if c.kcp.replicas != 1 {
            return;
        }
        let p = crate::rollout::preflight(c, &Policy::default(), NOW);
        let a = next(c);
        for text in [p.next_action.message.as_str(), a.message.as_str()] {
            assert!(!text.contains(" 1 replicas"), "{text:?}\n{ctx}");
        }
    });
    assert!(n > 100_000, "only {n} states");
}
