//! The Events and metrics of each kind of turn.

use quorumguard_engine::MemberId;
use quorumguard_engine::autopilot::{Count, Outcome, Proof, Step, Why};
use quorumguard_telemetry::Metrics;

use super::{AutopilotMetrics, EventNote, NEWS, STEP_LABELS, refusal_is_news, step_label};
use crate::execute::Done;
use crate::pilot::{Did, Report};

fn promote() -> Step {
    Step::Promote {
        member: MemberId(4),
        name: "l1".into(),
    }
}

fn acted(result: Result<Done, String>) -> Did {
    Did::Acted {
        step: promote(),
        proof: Proof {
            before: Count {
                voting: 3,
                healthy: 3,
            },
            after: Count {
                voting: 4,
                healthy: 4,
            },
        },
        message: "Autopilot promotes l1: 3 healthy of 3 voting, after 4 of 4".into(),
        result,
    }
}

fn refused(why: Why) -> Did {
    Did::Refused {
        why,
        message: format!("refused: {why:?}"),
        until_unix: None,
    }
}

fn reasons(r: &Report) -> Vec<(bool, &'static str)> {
    r.events()
        .iter()
        .map(|e: &EventNote| (e.warning, e.reason))
        .collect()
}

#[test]
fn an_action_and_its_outcome_are_events_and_counted() {
    let ok = Report {
        settled: None,
        did: acted(Ok(Done::Etcd(1))),
    };
    assert_eq!(reasons(&ok), [(false, "AutopilotActed")]);
    assert!(ok.events()[0].note.contains("3 healthy of 3 voting"));
    assert_eq!(ok.counted(), [("promote", "done")]);

    let failed = Report {
        settled: None,
        did: acted(Err("etcd refused it: too many learners".into())),
    };
    assert_eq!(reasons(&failed), [(true, "AutopilotActionFailed")]);
    assert!(failed.events()[0].note.contains("too many learners"));
    assert_eq!(failed.counted(), [("promote", "failed")]);

    let settled = Report {
        settled: Some(Outcome::Succeeded("l1 votes now".into())),
        did: refused(Why::Interval),
    };
    assert_eq!(
        reasons(&settled),
        [
            (false, "AutopilotStepConfirmed"),
            (false, "AutopilotWaiting")
        ]
    );
    let not = Report {
        settled: Some(Outcome::Failed("l1 is still a learner".into())),
        did: refused(Why::BackOff),
    };
    assert_eq!(reasons(&not)[0], (true, "AutopilotStepNotConfirmed"));

    let m = Metrics::new();
    let am = AutopilotMetrics::register(&m);
    for r in [&ok, &failed, &settled, &not] {
        am.observe(r, 1_800_000_000);
    }
    let text = m.encode();
    for line in [
        "quorumguard_autopilot_actions_total{action=\"promote\",result=\"done\"} 1",
        "quorumguard_autopilot_actions_total{action=\"promote\",result=\"failed\"} 1",
        "quorumguard_autopilot_steps_settled_total{result=\"confirmed\"} 1",
        "quorumguard_autopilot_steps_settled_total{result=\"not_confirmed\"} 1",
        "quorumguard_autopilot_refusals_total{reason=\"Interval\"} 1",
        "quorumguard_autopilot_last_action_timestamp_seconds 1800000000",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
}

#[test]
fn the_operators_choices_are_no_events_and_refusals_that_need_a_look_are_warnings() {
    for why in [Why::Off, Why::NotAnAutopilotAction, Why::ActionNotAllowed] {
        let r = Report {
            settled: None,
            did: refused(why),
        };
        assert!(r.events().is_empty(), "{why:?}: {:?}", r.events());
        assert!(r.counted().is_empty());
    }
    for why in [
        Why::NotProven,
        Why::Disagrees,
        Why::GaveUp,
        Why::Corrupt,
        Why::QuorumLost,
        Why::HealthUnknown,
        Why::NotFresh,
    ] {
        let r = Report {
            settled: None,
            did: refused(why),
        };
        assert_eq!(reasons(&r), [(true, "AutopilotRefused")], "{why:?}");
    }
    let dry = Report {
        settled: None,
        did: Did::DryRun {
            step: promote(),
            at_unix: 1_800_000_000,
            message: "Autopilot (dry-run) would promote learner l1".into(),
        },
    };
    assert_eq!(reasons(&dry), [(false, "AutopilotDryRun")]);
    assert_eq!(dry.counted(), [("promote", "dry_run")]);
}

#[test]
fn the_label_lists_hold_every_value_the_code_can_give() {
    let steps = [
        promote(),
        Step::RemoveMember {
            member: MemberId(1),
            name: "m".into(),
        },
        Step::DeleteMachine {
            machine: "m".into(),
        },
        Step::Compact,
        Step::Defragment {
            member: MemberId(1),
            name: "m".into(),
            db_size: None,
        },
        Step::MoveLeader {
            from: MemberId(1),
            to: MemberId(2),
        },
        Step::Disarm,
    ];
    let labels: Vec<&str> = steps.iter().map(step_label).collect();
    assert_eq!(labels, STEP_LABELS);
    // Every refusal that is news is listed once, and no other.
    for why in NEWS {
        assert!(refusal_is_news(why), "{why:?}");
    }
    let unique: std::collections::BTreeSet<String> =
        NEWS.iter().map(|w| format!("{w:?}")).collect();
    assert_eq!(unique.len(), NEWS.len());
}
