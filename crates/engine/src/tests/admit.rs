//! `admit` (the webhook's decision) against `decide`: the same answer, message and warnings,
//! with the next action worked out only where a denial's message ends with it.

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
            for op in &ops {
                for who in [&human(), &kcp_controller()] {
                    let v = decide(&c, op, who, policy, NOW);
                    let a = admit(&c, op, who, policy, NOW);
                    let expected = Judgement {
                        allowed: v.allowed,
                        reason: v.reason,
                        message: v.message.clone(),
                        warnings: v.warnings.clone(),
                        figures: v.figures,
                    };
                    assert_eq!(a, expected, "{op:?} by {} on {c:#?}", who.username);
                    if let Operation::DeleteMachine(m) = op {
                        assert_eq!(admit_deletion(&c, m, who, policy, NOW), expected);
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
