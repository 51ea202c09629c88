//! `admit` (the webhook's decision) against `decide`: the same answer, message and warnings,
//! with the next action worked out only where a denial's message ends with it; and the
//! engine's own word on when that answer needs a fresh etcd probe ([`Answer`]).

use crate::testkit::*;
use crate::*;

/// Every health assignment of 1 to 5 members, fresh and stale, with one Machine of each
/// state being deleted or not, for every replica count around it.
fn states() -> Vec<ControlPlane> {
    let healths = [healthy(), down(), Health::Unknown];
    let mut out = Vec::new();
    for n in 1..=5u32 {
        for code in 0..3usize.pow(n) {
            let members: Vec<(String, Health)> = (0..n)
                .map(|i| {
                    let h = healths[code / 3usize.pow(i) % 3].clone();
                    (format!("m{i}"), h)
                })
                .collect();
            let named: Vec<(&str, Health)> = members
                .iter()
                .map(|(m, h)| (m.as_str(), h.clone()))
                .collect();
            for replicas in [n.saturating_sub(1).max(1), n, n + 1] {
                for deleting in [None, Some(0)] {
                    for age in [None, Some(120)] {
                        let mut c = cp(replicas, &named);
                        if let Some(i) = deleting {
                            c.machines[i].deleting = true;
                        }
                        if let EtcdState::Observed(s) = &mut c.etcd {
                            s.age = age.map(std::time::Duration::from_secs);
                        }
                        out.push(c);
                    }
                }
            }
        }
    }
    out
}

#[test]
fn admit_answers_as_decide_does() {
    let lenient = Policy {
        unknown_health_humans: OnUnknownHealth::Allow,
        ..Policy::default()
    };
    let (mut allowed, mut denied) = (0, 0);
    for c in states() {
        for policy in [&Policy::default(), &lenient] {
            for op in &operations(&c) {
                for who in [&human(), &kcp_controller()] {
                    let v = decide(&c, op, who, policy, NOW);
                    let fresh = admit(&c, op, who, policy, NOW, EtcdBasis::FreshProbe);
                    let record = admit(&c, op, who, policy, NOW, EtcdBasis::Record);
                    // On a fresh probe every answer is final; on the record, the same judgement.
                    let Answer::Final(a) = fresh else {
                        panic!("not final on a fresh probe: {fresh:?}")
                    };
                    assert_eq!(record.judgement(), &a, "{op:?} on {c:#?}");
                    let expected = Judgement {
                        allowed: v.allowed,
                        reason: v.reason,
                        message: v.message.clone(),
                        warnings: v.warnings.clone(),
                        figures: v.figures,
                    };
                    assert_eq!(a, expected, "{op:?} by {} on {c:#?}", who.username);
                    if let Operation::DeleteMachine(m) = op {
                        for etcd in [EtcdBasis::Record, EtcdBasis::FreshProbe] {
                            let d = admit_deletion(&c, m, who, policy, NOW, etcd);
                            assert_eq!(d.into_judgement(), expected);
                        }
                    }
                    if v.allowed {
                        allowed += 1;
                    } else {
                        assert!(
                            a.message.ends_with(&v.next_action.message),
                            "a denial names the next safe action: {}",
                            a.message
                        );
                        denied += 1;
                    }
                }
            }
        }
    }
    // Both kinds of answer were compared, many times.
    assert!(
        allowed > 1000 && denied > 1000,
        "{allowed} allowed, {denied} denied"
    );
}

/// The engine says which answers need a fresh probe: an allow that rests on etcd's health or
/// member list is confirmed on a fresh probe; an allow whatever etcd says is final; a denial on
/// etcd's health is final and asks for a background probe; a denial whatever etcd says is
/// final. On a fresh probe, every answer is final.
#[test]
fn the_engine_says_when_an_answer_needs_a_fresh_probe() {
    // KCP deletes (a person's deletion below spec.replicas is `BelowDesiredReplicas`); a
    // person changes replicas.
    fn ask(c: &ControlPlane, op: &Operation, etcd: EtcdBasis) -> Answer {
        let who = match op {
            Operation::DeleteMachine(_) => kcp_controller(),
            Operation::UpdateKcp { .. } => human(),
        };
        admit(c, op, &who, &Policy::default(), NOW, etcd)
    }
    fn deletion(c: &ControlPlane, name: &str) -> Operation {
        let m = c.machines.iter().find(|m| m.name == name).expect("machine");
        Operation::DeleteMachine(m.clone())
    }
    let to = |replicas_to| Operation::UpdateKcp {
        replicas_from: 3,
        replicas_to,
        starts_rollout: false,
    };
    let three = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
    let one_down = cp(3, &[("a", healthy()), ("b", healthy()), ("c", down())]);
    let mut memberless = three.clone();
    add_machine(&mut memberless, "d");
    let mut tearing_down = one_down.clone();
    tearing_down.cluster.deleting = true;
    let cases: [(&str, &ControlPlane, Operation, Reason, &str); 9] = [
        (
            "quorum kept",
            &three,
            deletion(&three, "a"),
            Reason::QuorumSafe,
            "confirm",
        ),
        (
            "no member in the record",
            &memberless,
            deletion(&memberless, "d"),
            Reason::MemberAbsent,
            "confirm",
        ),
        (
            "scale-down",
            &three,
            to(1),
            Reason::ScaleDownSafe,
            "confirm",
        ),
        ("scale-up", &three, to(5), Reason::ScaleUpSafe, "confirm"),
        (
            "teardown",
            &tearing_down,
            deletion(&tearing_down, "a"),
            Reason::ClusterDeleting,
            "final",
        ),
        (
            "same replicas",
            &one_down,
            to(3),
            Reason::NoReplicaChange,
            "final",
        ),
        (
            "a member down",
            &one_down,
            deletion(&one_down, "a"),
            Reason::WouldLoseQuorum,
            "refresh",
        ),
        (
            "scale-up with a member down",
            &one_down,
            to(5),
            Reason::ScaleUpWouldLoseQuorum,
            "refresh",
        ),
        (
            "a replica count KCP refuses",
            &three,
            to(4),
            Reason::KcpRefusesReplicas,
            "final",
        ),
    ];
    for (what, c, op, reason, expected) in cases {
        let answer = ask(c, &op, EtcdBasis::Record);
        assert_eq!(answer.judgement().reason, reason, "{what}: {answer:?}");
        let said = match &answer {
            Answer::Final(_) => "final",
            Answer::ConfirmOnFreshProbe(j) => {
                assert!(j.allowed, "{what}: only an allow is confirmed");
                "confirm"
            }
            Answer::DeniedRefreshInBackground(j) => {
                assert!(!j.allowed, "{what}: only a denial is refreshed");
                "refresh"
            }
        };
        assert_eq!(said, expected, "{what}: {answer:?}");
        let fresh = ask(c, &op, EtcdBasis::FreshProbe);
        assert!(
            matches!(fresh, Answer::Final(_)),
            "{what} on a fresh probe: {fresh:?}"
        );
    }
}

/// What the rule is for: an answer the engine calls final on the record holds whatever etcd
/// says now. An allow it does not ask to confirm stays an allow with every member down, with
/// etcd's health unknown, and with a member joined since for each Machine the record shows
/// without one; a denial it asks no refresh for stays a denial with every member healthy.
#[test]
fn a_final_answer_on_the_record_holds_whatever_etcd_says_now() {
    let lenient = Policy {
        unknown_health_humans: OnUnknownHealth::Allow,
        ..Policy::default()
    };
    let mut checked = (0, 0);
    let mut with_a_memberless_machine: Vec<ControlPlane> = states()
        .into_iter()
        .filter(|c| c.machines.len() <= 3)
        .map(|mut c| {
            add_machine(&mut c, "new");
            c
        })
        .collect();
    with_a_memberless_machine.extend(states());
    for c in &with_a_memberless_machine {
        let now: [ControlPlane; 4] = [
            with_health(c, down()),
            with_health(c, Health::Unknown),
            joined_since(c),
            with_health(c, healthy()),
        ];
        for policy in [&Policy::default(), &lenient] {
            for op in operations(c) {
                for who in [&human(), &kcp_controller()] {
                    let Answer::Final(j) = admit(c, &op, who, policy, NOW, EtcdBasis::Record)
                    else {
                        continue;
                    };
                    let (compared, expect) = if j.allowed {
                        checked.0 += 1;
                        (&now[..3], true)
                    } else {
                        checked.1 += 1;
                        (&now[3..], false)
                    };
                    for n in compared {
                        let a = admit(n, &op, who, policy, NOW, EtcdBasis::FreshProbe);
                        assert_eq!(
                            a.judgement().allowed,
                            expect,
                            "{:?} on the record, {a:?} now, {op:?} by {} on {c:#?}, now {n:#?}",
                            j.reason,
                            who.username
                        );
                    }
                }
            }
        }
    }
    assert!(
        checked.0 > 1000 && checked.1 > 100,
        "final allows, denials checked: {checked:?}"
    );
}

/// Every Machine deletion and replica change (1 to 6) of `c`.
fn operations(c: &ControlPlane) -> Vec<Operation> {
    let mut ops: Vec<Operation> = c
        .machines
        .iter()
        .map(|m| Operation::DeleteMachine(m.clone()))
        .collect();
    for to in 1..=6 {
        ops.push(Operation::UpdateKcp {
            replicas_from: c.kcp.replicas,
            replicas_to: to,
            starts_rollout: to % 2 == 0,
        });
    }
    ops
}

/// `c` with every member's health `h`, probed just now.
fn with_health(c: &ControlPlane, h: Health) -> ControlPlane {
    let mut c = c.clone();
    if let EtcdState::Observed(s) = &mut c.etcd {
        s.age = None;
        for m in &mut s.members {
            m.health = h.clone();
        }
    }
    c
}

/// `c` with a healthy voting member joined since the record for each Machine it shows
/// without one.
fn joined_since(c: &ControlPlane) -> ControlPlane {
    let mut c = c.clone();
    let names: Vec<String> = c.machines.iter().map(|m| m.name.clone()).collect();
    for (i, name) in names.iter().enumerate() {
        let has = match &c.etcd {
            EtcdState::Observed(s) => s.members.iter().any(|m| &m.name == name),
            EtcdState::Unknown { .. } => true,
        };
        if !has {
            add_member(&mut c, 100 + i as u64, name, healthy(), false);
        }
    }
    c
}
