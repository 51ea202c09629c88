//! The unit tests of `preflight`: the exit status, the text (one line per control plane, the
//! table of steps), the JSON's keys, and the selection messages.

use serde_json::Value;

use super::online::{select, steps_need_one};
use super::*;
use crate::status::mgmt::{Listed, Scope};
use quorumguard_engine::testkit::*;
use quorumguard_engine::{ControlPlane, EtcdState, Health, Policy};

/// Control planes that join learners, as KCP's kubeadm does by default since v1.29 (the
/// engine's own tests play voting joins too).
fn cp(replicas: u32, members: &[(&str, Health)]) -> ControlPlane {
    let mut c = quorumguard_engine::testkit::cp(replicas, members);
    c.kcp.version = Some("v1.32.0".into());
    c
}

fn three(m2: Health) -> ControlPlane {
    cp(3, &[("m1", healthy()), ("m2", m2), ("m3", healthy())])
}

fn predict(c: &ControlPlane) -> Preflight {
    rollout::preflight(c, &Policy::default(), NOW)
}

fn report(cps: &[&ControlPlane]) -> (PreflightReport, Vec<Preflight>) {
    let predictions: Vec<Preflight> = cps.iter().map(|c| predict(c)).collect();
    let out = cps
        .iter()
        .zip(&predictions)
        .map(|(c, p)| ControlPlanePreflight::new(c, p, None))
        .collect();
    (PreflightReport::new(out, Vec::new()), predictions)
}

fn unknown() -> ControlPlane {
    let mut c = three(healthy());
    c.etcd = EtcdState::Unknown {
        reason: "connection refused".into(),
    };
    c
}

#[test]
fn exit_status_is_0_when_all_ready_1_when_any_sticks_or_is_unsafe_2_when_any_cannot_be_judged() {
    let ready = predict(&three(healthy()));
    let stuck = predict(&three(down()));
    let unsafe_ = predict(&cp(1, &[("m1", healthy())]));
    let unknown = predict(&unknown());
    assert_eq!(ready.readiness, Readiness::Ready);
    assert!(matches!(stuck.readiness, Readiness::WouldStick { .. }));
    assert!(matches!(unsafe_.readiness, Readiness::Unsafe { .. }));
    assert_eq!(unknown.readiness, Readiness::CannotJudge);
    assert_eq!(exit_code([]), 0);
    assert_eq!(exit_code([&ready, &ready]), 0);
    assert_eq!(exit_code([&ready, &stuck]), 1);
    assert_eq!(exit_code([&unsafe_, &ready]), 1);
    assert_eq!(exit_code([&stuck, &unknown, &ready]), 2);
    assert_eq!(exit_code([&unknown]), 2);
}

#[test]
fn the_fleet_view_is_one_padded_line_per_control_plane_and_its_next_action() {
    let mut long = three(down());
    long.kcp.name = "a-much-longer-control-plane".into();
    let (r, _) = report(&[&three(healthy()), &long, &unknown()]);
    let text = render_fleet(&r);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    let width = "ns/a-much-longer-control-plane".len();
    assert!(lines[0].starts_with("ns/kcp"), "{text}");
    assert_eq!(&lines[0][width..width + 8], "  READY:", "{text}");
    assert!(
        lines[2].starts_with("ns/a-much-longer-control-plane  WOULD STICK at step 1/15: "),
        "{text}"
    );
    assert!(lines[2].contains("m2"), "{text}");
    assert!(lines[3].starts_with("  next: "), "{text}");
    assert!(lines[3].contains("remediate-machine"), "{text}");
    assert!(lines[4].contains("  CANNOT JUDGE: "), "{text}");
    assert!(lines[4].contains("connection refused"), "{text}");
    assert!(
        lines[1].starts_with("  next: Nothing holds the rollout"),
        "{text}"
    );
}

#[test]
fn the_steps_table_has_a_start_row_every_step_and_the_one_failure_column() {
    let (r, p) = report(&[&three(healthy())]);
    let text = render_steps(&r);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("KubeadmControlPlane ns/kcp (Cluster "),
        "{text}"
    );
    assert!(lines[0].contains("READY: 15 steps"), "{text}");
    let header = lines
        .iter()
        .position(|l| l.starts_with('#') && l.contains("  ACTION  "))
        .expect("a table header");
    for col in [
        "V/H/L",
        "QUORUM",
        "FT",
        "WEBHOOK",
        "IF ONE MORE MEMBER FAILS HERE",
    ] {
        assert!(lines[header].contains(col), "{text}");
    }
    let rows = &lines[header + 1..header + 2 + p[0].steps.len()];
    assert!(rows[0].starts_with("0  "), "{text}");
    assert!(rows[0].contains("(before the rollout)"), "{text}");
    assert!(rows[0].contains("3/3/0"), "{text}");
    // Step 2: the new member joined as a learner; step 4: KCP deletes m1, the guard allows.
    assert!(
        rows[2].contains("4/3/1") || rows[2].contains("3/3/1"),
        "{text}"
    );
    assert!(rows[4].starts_with("4   KCP deletes Machine m1"), "{text}");
    assert!(rows[4].contains("allowed ("), "{text}");
    assert!(rows[15].starts_with("15 "), "{text}");
    assert!(
        rows.iter()
            .skip(1)
            .all(|r| r.contains(" fails: quorum kept")),
        "{text}"
    );
    assert!(
        text.contains("\nV/H/L: voting, healthy voting and learner"),
        "{text}"
    );
    assert!(text.ends_with(&format!("\nnext: {}\n", p[0].next_action.message)));
}

#[test]
fn a_stuck_rollout_ends_its_table_with_the_step_that_cannot_happen() {
    let (r, _) = report(&[&three(down())]);
    let text = render_steps(&r);
    assert!(text.contains(": WOULD STICK at step 1/15: "), "{text}");
    let last = text
        .lines()
        .rfind(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .expect("rows");
    assert!(
        last.starts_with("1  STICKS: MemberUnhealthy (above)"),
        "{last}\n{text}"
    );
    // The start row shows the member already down.
    let start = text
        .lines()
        .find(|l| l.starts_with("0  (before the rollout)"))
        .expect("a start row");
    assert!(start.contains("  3/2/0  2       0   -"), "{text}");

    let (r, _) = report(&[&unknown()]);
    let text = render_steps(&r);
    assert!(text.contains(": CANNOT JUDGE: "), "{text}");
    assert!(
        text.contains("No steps: the rollout was not played."),
        "{text}"
    );
    assert!(!text.contains("V/H/L"), "{text}");
}

#[test]
fn json_has_every_field_in_camel_case() {
    let (r, _) = report(&[&cp(1, &[("m1", healthy())]), &unknown()]);
    let v: Value = serde_json::to_value(&r).expect("serializes");
    assert_eq!(v["schema"], "quorumguard.io/preflight/v1");
    assert_eq!(v["warnings"], serde_json::json!([]));
    let c = &v["controlPlanes"][0];
    for key in [
        "kcp",
        "cluster",
        "readiness",
        "at",
        "of",
        "reason",
        "why",
        "summary",
        "total",
        "start",
        "steps",
        "nextAction",
        "probe",
    ] {
        assert!(c.get(key).is_some(), "controlPlanes[].{key}: {c:#}");
    }
    assert_eq!(c["readiness"], "Unsafe");
    assert_eq!(c["reason"], "FaultToleranceZero");
    assert_eq!(c["at"], 1);
    assert_eq!(c["of"], 5);
    assert_eq!(c["start"]["faultTolerance"], 0);
    let step = &c["steps"][0];
    for key in [
        "index",
        "kind",
        "machine",
        "action",
        "counts",
        "webhook",
        "oneFailure",
    ] {
        assert!(step.get(key).is_some(), "steps[].{key}: {step:#}");
    }
    assert_eq!(step["kind"], "create");
    for key in ["member", "quorumKept", "sticksAt", "text"] {
        assert!(step["oneFailure"].get(key).is_some(), "oneFailure.{key}");
    }
    assert_eq!(step["oneFailure"]["quorumKept"], false);
    let delete = c["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["kind"] == "delete")
        .expect("a delete step");
    assert!(
        delete["webhook"]
            .as_str()
            .is_some_and(|w| w.starts_with("allowed"))
    );
    let u = &v["controlPlanes"][1];
    assert_eq!(u["readiness"], "CannotJudge");
    assert_eq!(u["reason"], "EtcdUnknown");
    assert_eq!(u["start"], Value::Null);
    assert_eq!(u["at"], Value::Null);
    assert_eq!(u["steps"], serde_json::json!([]));
}

fn listed(keys: &[(&str, &str)]) -> Listed {
    let kcps = keys
        .iter()
        .map(|(ns, name)| {
            quorumguard_observe::capi::parse_kcp(&serde_json::json!({
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
                "kind": "KubeadmControlPlane",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": 3, "version": "v1.33.0"},
            }))
            .expect("kcp")
        })
        .collect();
    Listed {
        kcps,
        ..Default::default()
    }
}

#[test]
fn kcps_are_selected_by_name_and_steps_need_exactly_one() {
    let l = listed(&[("b", "x"), ("a", "x"), ("a", "y")]);
    let key = |ns: &str, n: &str| (ns.to_string(), n.to_string());
    let all = select(&l, None, &Scope::All).expect("all");
    assert_eq!(all, [key("a", "x"), key("a", "y"), key("b", "x")]);
    let xs = select(&l, Some("x"), &Scope::All).expect("by name");
    assert_eq!(xs, [key("a", "x"), key("b", "x")]);
    let e = select(&l, Some("nope"), &Scope::All).expect_err("unknown");
    assert_eq!(
        e.to_string(),
        "no KubeadmControlPlane \"nope\" in any namespace; there are: a/x, a/y, b/x"
    );
    let e = select(&Listed::default(), Some("x"), &Scope::Namespace("n".into())).expect_err("none");
    assert!(
        e.to_string().ends_with("in namespace n; there are none"),
        "{e}"
    );
    let m = steps_need_one(&xs, &Scope::All);
    assert!(
        m.contains("2 are selected (a/x, b/x): choose one with --kcp NAME"),
        "{m}"
    );
    let m = steps_need_one(&[], &Scope::Namespace("n".into()));
    assert!(m.ends_with("there is none in namespace n"), "{m}");
}
