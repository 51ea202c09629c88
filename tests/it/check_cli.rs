//! `quorumguard check` end to end: the built binary on dumps from a real etcd 3.4 cluster
//! (tests/fixtures/etcd, made by tests/fixtures/make-fixtures.sh) and hand-written kubectl dumps
//! (tests/fixtures/objects) whose Node names are the etcd member names.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_quorumguard");
const KCP: &str = "demo-control-plane";
/// Machine -> Node (= etcd member) in the object fixtures.
const M1: &str = "demo-control-plane-x7k2p"; // cp-node-1, the oldest
const M2: &str = "demo-control-plane-m4q8z"; // cp-node-2, SIGSTOPped in one-stopped
const M3: &str = "demo-control-plane-t9w3n"; // cp-node-3
const M4: &str = "demo-control-plane-r2d5v"; // cp-node-4, the rollout's new Machine
const ENV: [&str; 7] = [
    "QUORUMGUARD_OBJECTS",
    "QUORUMGUARD_MEMBER_LIST",
    "QUORUMGUARD_ENDPOINT_STATUS",
    "QUORUMGUARD_ENDPOINT_HEALTH",
    "QUORUMGUARD_ALARMS",
    "QUORUMGUARD_KCP",
    "QUORUMGUARD_OUTPUT",
];
const SCENARIOS: [&str; 7] = [
    "healthy",
    "one-stopped",
    "quorum-lost",
    "learner-unstarted",
    "learner",
    "one-removed",
    "nospace",
];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn objects(name: &str) -> String {
    fixtures().join("objects").join(name).display().to_string()
}

fn etcd(scenario: &str, file: &str) -> String {
    fixtures()
        .join("etcd")
        .join(scenario)
        .join(file)
        .display()
        .to_string()
}

/// `--member-list`, `--endpoint-status`, `--endpoint-health` of one real-etcd scenario.
fn etcd_args(scenario: &str) -> Vec<String> {
    vec![
        "--member-list".into(),
        etcd(scenario, "member-list.json"),
        "--endpoint-status".into(),
        etcd(scenario, "endpoint-status.json"),
        "--endpoint-health".into(),
        etcd(scenario, "endpoint-health.json"),
    ]
}

/// A scratch directory of its own for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("check_cli")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

fn check<S: AsRef<str>>(args: &[S]) -> Run {
    quorumguard("check", args)
}

/// `quorumguard <command> args`, with none of the dump flags' environment variables and no
/// kubeconfig: only what the arguments name is read.
fn quorumguard<S: AsRef<str>>(command: &str, args: &[S]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.arg(command);
    for a in args {
        cmd.arg(a.as_ref());
    }
    for v in ENV {
        cmd.env_remove(v);
    }
    cmd.env_remove("KUBECONFIG")
        .env("HOME", Path::new(env!("CARGO_TARGET_TMPDIR")));
    let out = cmd.output().expect("quorumguard runs");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// check with objects + a scenario + extra args.
fn check_with(objects_file: &str, scenario: &str, extra: &[&str]) -> Run {
    let mut args = vec!["--objects".to_string(), objects(objects_file)];
    args.extend(etcd_args(scenario));
    args.extend(extra.iter().map(|s| s.to_string()));
    check(&args)
}

fn delete(machine: &str) -> String {
    format!("delete machine/{machine}")
}

fn member<'a>(report: &'a Value, name: &str) -> &'a Value {
    named(report, "members", name)
}

/// The entry of list `list` (`members`, `machines`) of the report whose `name` is `name`.
fn named<'a>(report: &'a Value, list: &str, name: &str) -> &'a Value {
    report[list]
        .as_array()
        .unwrap_or_else(|| panic!("no {list}: {report:#}"))
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("{list}: {name} missing: {report:#}"))
}

#[test]
fn a_stuck_upgrade_2651_deleting_the_machine_whose_member_is_gone_is_allowed() {
    let what_if = delete(M1);
    let run = check_with(
        "rollout.yaml",
        "one-removed",
        &["--what-if", &what_if, "-o", "json"],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    assert_eq!(r["controlPlane"]["replicas"], 3);
    assert_eq!(r["machines"].as_array().unwrap().len(), 4);
    assert_eq!(r["members"].as_array().unwrap().len(), 3);
    assert_eq!(r["machinesWithoutMember"], serde_json::json!([M1]));
    let v = &r["verdicts"][0];
    assert_eq!(v["whatIf"], what_if);
    assert_eq!(v["allowed"], true);
    assert_eq!(v["reason"], "MemberAbsent");
    assert_eq!(r["nextAction"]["code"], "DeleteMachine");
    assert_eq!(r["nextAction"]["target"], M1);
    assert_eq!(
        r["nextAction"]["command"],
        format!("kubectl delete machine -n demo {M1}")
    );
}

#[test]
fn b_one_member_down_a_human_deleting_a_healthy_machine_is_denied() {
    let what_if = delete(M1);
    let run = check_with(
        "healthy.yaml",
        "one-stopped",
        &["--what-if", &what_if, "-o", "json"],
    );
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    assert_eq!(member(&r, "cp-node-2")["health"], "Unhealthy");
    assert_eq!(member(&r, "cp-node-1")["health"], "Healthy");
    let v = &r["verdicts"][0];
    assert_eq!(v["allowed"], false);
    assert_eq!(v["reason"], "WouldLoseQuorum");
    assert_eq!(v["as"], "kubernetes-admin");
    assert!(
        v["message"].as_str().unwrap().contains("cp-node-2"),
        "{v:#}"
    );
    assert_eq!(r["nextAction"]["code"], "RemediateMachine");
    assert_eq!(r["nextAction"]["target"], M2);
    assert_eq!(r["quorum"]["voting"], 3);
    assert_eq!(r["quorum"]["healthy"], 2);
    assert_eq!(r["quorum"]["quorum"], 2);
    assert_eq!(r["quorum"]["faultTolerance"], 0);
}

/// Named case (c), which follows kubeadm's join style (docs/rules.md, how members join): with
/// voting joins (a v1.28 KCP) the first new member votes before it is healthy, 2 healthy of 4:
/// denied. The fixture's v1.32 KCP joins learners, which cannot lose quorum: allowed, with the
/// warning that KCP's preflight and etcd hold the join until the member is back.
#[test]
fn c_scaling_3_to_5_with_one_member_down_follows_the_join_style() {
    let what_if = format!("scale kcp/{KCP} 5");
    let voting_objects = std::env::temp_dir().join(format!(
        "quorumguard-check-voting-{}.yaml",
        std::process::id()
    ));
    let fixture = std::fs::read_to_string(objects("healthy.yaml")).unwrap();
    assert!(fixture.contains("version: v1.32.0"), "{fixture}");
    std::fs::write(
        &voting_objects,
        fixture.replace("version: v1.32.0", "version: v1.28.0"),
    )
    .unwrap();
    let mut args = vec![
        "--objects".to_string(),
        voting_objects.display().to_string(),
    ];
    args.extend(etcd_args("one-stopped"));
    args.extend(["--what-if", &what_if, "-o", "json"].map(String::from));
    let run = check(&args);
    let _ = std::fs::remove_file(&voting_objects);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    assert_eq!(r["controlPlane"]["joins"], "Voting");
    let v = &r["verdicts"][0];
    assert_eq!(v["whatIf"], what_if);
    assert_eq!(v["allowed"], false);
    assert_eq!(v["reason"], "ScaleUpWouldLoseQuorum");

    let run = check_with(
        "healthy.yaml",
        "one-stopped",
        &["--what-if", &what_if, "-o", "json"],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    assert_eq!(r["controlPlane"]["joins"], "Learner");
    assert_eq!(
        r["controlPlane"]["joinsBecause"],
        "learner (kubeadm v1.32.0)"
    );
    let v = &r["verdicts"][0];
    assert_eq!(v["allowed"], true);
    assert_eq!(v["reason"], "ScaleUpSafe");
    assert!(
        v["warnings"].as_array().unwrap().iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("until every etcd member is healthy")),
        "{v:#}"
    );
}

#[test]
fn scaling_3_to_5_when_healthy_is_allowed() {
    let run = check_with(
        "healthy.yaml",
        "healthy",
        &["--what-if", &format!("scale kcp/{KCP} 5"), "-o", "json"],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.json()["verdicts"][0]["allowed"], true);
}

#[test]
fn any_denied_what_if_makes_exit_1() {
    let run = check_with(
        "healthy.yaml",
        "one-stopped",
        &[
            "--what-if",
            &delete(M2),
            "--what-if",
            &delete(M1),
            "-o",
            "json",
        ],
    );
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    // Each what-if is judged on its own against the dumped state.
    assert_eq!(r["verdicts"][0]["whatIf"], delete(M2));
    assert_eq!(r["verdicts"][1]["whatIf"], delete(M1));
    assert_eq!(r["verdicts"][1]["allowed"], false);
}

#[test]
fn json_output_shape() {
    let run = check_with("healthy.yaml", "healthy", &["-o", "json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    let r = run.json();
    assert_eq!(r["schema"], "quorumguard.io/check/v1");
    for key in ["kcp", "cluster", "replicas", "version", "etcd", "maxSurge"] {
        assert!(r["controlPlane"].get(key).is_some(), "controlPlane.{key}");
    }
    assert_eq!(r["controlPlane"]["kcp"], format!("demo/{KCP}"));
    assert_eq!(r["controlPlane"]["etcd"], "Stacked");
    let members = r["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    for m in members {
        for key in [
            "name",
            "id",
            "voting",
            "learner",
            "unstarted",
            "health",
            "error",
            "leader",
            "version",
            "dbSize",
            "raftTerm",
            "raftIndex",
            "alarms",
            "clientUrls",
            "machine",
        ] {
            assert!(m.get(key).is_some(), "members[].{key}: {m:#}");
        }
        assert_eq!(m["health"], "Healthy");
        assert_eq!(m["version"], "3.4.23");
        assert!(m["machine"].is_string());
    }
    assert_eq!(members.iter().filter(|m| m["leader"] == true).count(), 1);
    for key in [
        "voting",
        "learners",
        "healthy",
        "unhealthy",
        "unknown",
        "quorum",
        "faultTolerance",
        "hasQuorum",
    ] {
        assert!(r["quorum"].get(key).is_some(), "quorum.{key}");
    }
    assert_eq!(r["quorum"]["faultTolerance"], 1);
    assert_eq!(r["verdicts"], serde_json::json!([]));
    assert_eq!(r["nextAction"]["code"], "None");
    assert!(r["nextAction"]["message"].is_string());
    assert_eq!(r["warnings"], serde_json::json!([]));

    let run = check_with(
        "healthy.yaml",
        "healthy",
        &["--what-if", &delete(M3), "-o", "json"],
    );
    let v = &run.json()["verdicts"][0];
    for key in [
        "whatIf", "as", "allowed", "reason", "message", "warnings", "figures",
    ] {
        assert!(v.get(key).is_some(), "verdicts[].{key}: {v:#}");
    }
    assert_eq!(v["reason"], "BelowDesiredReplicas");
    assert_eq!(v["figures"]["votingAfter"], 2);
}

#[test]
fn text_output_tells_the_story() {
    let run = check_with("healthy.yaml", "one-stopped", &["--what-if", &delete(M1)]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let out = &run.stdout;
    for needle in [
        "KubeadmControlPlane demo/demo-control-plane (Cluster demo): replicas 3",
        "NAME",
        "RAFT INDEX",
        "unhealthy: context deadline exceeded",
        "leader",
        "Machines without an etcd member: none",
        "Quorum: voting 3, healthy 2, quorum 2, fault tolerance 0",
        "DENIED (WouldLoseQuorum)",
        "Next action: RemediateMachine",
        M2,
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    // The stopped member's status is missing: said on stderr, not fatal.
    assert!(
        run.stderr
            .contains("warning: endpoint status has no entry for member cp-node-2")
    );
    let hex = member_ids("one-stopped");
    let row = out.lines().find(|l| l.starts_with("cp-node-1 ")).unwrap();
    assert!(row.contains(&hex["cp-node-1"]), "{row}");
    assert!(row.contains(M1), "{row}");

    let run = check_with("rollout.yaml", "one-removed", &["--what-if", &delete(M1)]);
    assert_eq!(run.code, 0);
    assert!(
        run.stdout.contains(&format!("  {M1} (node cp-node-1)")),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("ALLOWED (MemberAbsent)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("Next action: DeleteMachine"),
        "{}",
        run.stdout
    );
}

/// name -> hex ID, as `etcdctl member list -w simple` printed it during the fixture run.
fn member_ids(scenario: &str) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(etcd(scenario, "member-list.txt"))
        .expect("member-list.txt")
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(", ").collect();
            (f[2].to_string(), f[0].to_string())
        })
        .collect()
}

#[test]
fn big_member_ids_are_exact() {
    let objects_for = |s: &str| match s {
        "healthy" | "one-stopped" | "quorum-lost" => "healthy.yaml",
        _ => "rollout.yaml",
    };
    for scenario in SCENARIOS {
        let run = check_with(objects_for(scenario), scenario, &["-o", "json"]);
        assert_ne!(run.code, 2, "{scenario}: {}", run.stderr);
        let r = run.json();
        let expected = member_ids(scenario);
        let members = r["members"].as_array().unwrap();
        assert_eq!(members.len(), expected.len(), "{scenario}");
        for m in members {
            let name = m["name"].as_str().unwrap();
            assert_eq!(
                m["id"].as_str(),
                Some(expected[name].as_str()),
                "{scenario} {name:?}"
            );
            // Beyond 2^53: a float detour would have changed the low digits.
            assert!(u64::from_str_radix(&expected[name], 16).unwrap() > 1 << 53);
        }
    }
}

#[test]
fn v1beta1_objects_are_judged_like_v1beta2() {
    let args = [
        "--what-if",
        &delete(M1),
        "--what-if",
        &format!("scale kcp/{KCP} 5"),
        "-o",
        "json",
    ];
    let v2 = check_with("healthy.yaml", "one-stopped", &args);
    let v1 = check_with("healthy-v1beta1.yaml", "one-stopped", &args);
    assert_eq!(v1.code, 1, "{}", v1.stderr);
    assert_eq!(v1.stdout, v2.stdout);
    assert_eq!(v1.json()["verdicts"][0]["reason"], "WouldLoseQuorum");
}

#[test]
fn multi_document_and_json_objects_are_read_like_a_list() {
    let args = ["--what-if", &delete(M1), "-o", "json"];
    let list = check_with("rollout.yaml", "one-removed", &args);
    let multi = check_with("rollout-multidoc.yaml", "one-removed", &args);
    assert_eq!(multi.code, 0, "{}", multi.stderr);
    assert_eq!(multi.stdout, list.stdout);

    let dir = scratch("json_objects");
    let yaml: Value =
        serde_yaml::from_str(&std::fs::read_to_string(objects("rollout.yaml")).unwrap()).unwrap();
    let path = dir.join("objects.json");
    std::fs::write(&path, serde_json::to_string_pretty(&yaml).unwrap()).unwrap();
    let mut a = vec!["--objects".to_string(), path.display().to_string()];
    a.extend(etcd_args("one-removed"));
    a.extend(args.iter().map(|s| s.to_string()));
    let json = check(&a);
    assert_eq!(json.code, 0, "{}", json.stderr);
    assert_eq!(json.stdout, list.stdout);
}

#[test]
fn learner_does_not_vote_and_is_waited_for() {
    // Three minutes after M4 was created: within --learner-grace (past it, a learner nobody
    // promotes is stalled: see the field cases in crates/cli/src/check/field_cases.rs).
    let run = check_with(
        "rollout.yaml",
        "learner",
        &[
            "--what-if",
            &delete(M4),
            "-o",
            "json",
            "--now",
            "2025-11-20T09:03:05Z",
        ],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    let l = member(&r, "cp-node-4");
    assert_eq!(l["learner"], true);
    assert_eq!(l["voting"], false);
    // etcdctl endpoint health always fails for a learner; its status answered.
    assert_eq!(l["health"], "Healthy");
    assert_eq!(l["machine"], M4);
    assert_eq!(r["quorum"]["voting"], 3);
    assert_eq!(r["quorum"]["learners"], 1);
    assert_eq!(r["verdicts"][0]["reason"], "LearnerMember");
    assert_eq!(r["nextAction"]["code"], "WaitForLearner");
}

#[test]
fn unstarted_learner_has_no_name_and_no_machine() {
    let run = check_with("rollout.yaml", "learner-unstarted", &["-o", "json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    let members = r["members"].as_array().unwrap();
    let u: Vec<&Value> = members.iter().filter(|m| m["unstarted"] == true).collect();
    assert_eq!(u.len(), 1, "{r:#}");
    assert_eq!(u[0]["name"], "");
    assert_eq!(u[0]["learner"], true);
    assert_eq!(u[0]["health"], "Unhealthy");
    assert_eq!(u[0]["machine"], Value::Null);
    assert_eq!(u[0]["clientUrls"], serde_json::json!([]));
    assert_eq!(r["quorum"]["voting"], 3);
    assert_eq!(r["quorum"]["healthy"], 3);
    let text = check_with("rollout.yaml", "learner-unstarted", &[]).stdout;
    assert!(text.contains("(unstarted)"), "{text}");
}

#[test]
fn quorum_lost_denies_and_asks_for_recovery() {
    let run = check_with(
        "healthy.yaml",
        "quorum-lost",
        &["--what-if", &delete(M3), "-o", "json"],
    );
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    assert_eq!(r["quorum"]["hasQuorum"], false);
    assert_eq!(r["quorum"]["healthy"], 0);
    assert_eq!(r["verdicts"][0]["reason"], "QuorumLost");
    assert_eq!(r["nextAction"]["code"], "RestoreQuorum");
    // The survivor's own status says why it is unhealthy although it runs.
    let survivor = member(&r, "cp-node-1");
    assert!(
        survivor["error"]
            .as_str()
            .unwrap()
            .contains("etcdserver: no leader")
    );
    assert_eq!(survivor["leader"], false);
}

/// A NOSPACE alarm stops writes, not raft (docs/rules.md, what NOSPACE does): the member stays
/// healthy for the quorum rules, its alarm is shown, and the next action frees space.
#[test]
fn nospace_alarm_is_shown_and_frees_space_without_making_its_member_unhealthy() {
    let alarms = etcd("nospace", "alarm-list.txt");
    let run = check_with(
        "rollout.yaml",
        "nospace",
        &["--alarms", &alarms, "-o", "json"],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    let alarmed: Vec<&Value> = r["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["alarms"] == serde_json::json!(["NOSPACE"]))
        .collect();
    assert_eq!(alarmed.len(), 1, "{r:#}");
    assert_eq!(alarmed[0]["health"], "Healthy");
    assert_eq!(r["quorum"]["healthy"], 3);
    assert_eq!(r["quorum"]["hasQuorum"], true);
    assert_eq!(r["nextAction"]["code"], "FreeSpace");
    // The alarm list names the member by decimal ID.
    let text = std::fs::read_to_string(&alarms).unwrap();
    let decimal: u64 = text
        .trim()
        .strip_prefix("memberID:")
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert_eq!(alarmed[0]["id"], format!("{decimal:x}"));
}

#[test]
fn without_health_data_health_is_unknown_and_humans_are_denied() {
    let run = check(&[
        "--objects",
        &objects("healthy.yaml"),
        "--member-list",
        &etcd("healthy", "member-list.json"),
        "--what-if",
        &delete(M1),
        "-o",
        "json",
    ]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    assert!(
        r["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["health"] == "Unknown")
    );
    assert_eq!(r["verdicts"][0]["reason"], "HealthUnknown");
}

#[test]
fn requester_is_taken_from_as() {
    let run = check_with(
        "healthy.yaml",
        "one-stopped",
        &[
            "--as",
            "system:serviceaccount:kube-system:generic-garbage-collector",
            "--what-if",
            &delete(M1),
            "-o",
            "json",
        ],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let v = &run.json()["verdicts"][0];
    assert_eq!(v["reason"], "TeardownRequester");
    assert_eq!(
        v["as"],
        "system:serviceaccount:kube-system:generic-garbage-collector"
    );
}

#[test]
fn endpoint_not_in_member_list_is_a_warning_not_an_error() {
    // Status and health taken while cp-node-1 was still a member, member list after removal.
    let run = check(&[
        "--objects",
        &objects("rollout.yaml"),
        "--member-list",
        &etcd("one-removed", "member-list.json"),
        "--endpoint-status",
        &etcd("learner", "endpoint-status.json"),
        "--endpoint-health",
        &etcd("learner", "endpoint-health.json"),
        "-o",
        "json",
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("endpoint health for https://127.0.0.1:")
            && run.stderr.contains("is not in the member list: ignored"),
        "{}",
        run.stderr
    );
    let r = run.json();
    let warnings = r["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert_eq!(r["members"].as_array().unwrap().len(), 3);
}

fn assert_bad_input(run: &Run, needles: &[&str]) {
    assert_eq!(
        run.code, 2,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    for n in needles {
        assert!(run.stderr.contains(n), "missing {n:?} in:\n{}", run.stderr);
    }
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

#[test]
fn missing_file_is_bad_input() {
    let missing = fixtures()
        .join("objects/no-such-file.yaml")
        .display()
        .to_string();
    let mut args = vec!["--objects".to_string(), missing.clone()];
    args.extend(etcd_args("healthy"));
    assert_bad_input(&check(&args), &[&missing, "cannot read"]);

    let missing = etcd("healthy", "no-such-member-list.json");
    let run = check(&[
        "--objects",
        &objects("healthy.yaml"),
        "--member-list",
        &missing,
    ]);
    assert_bad_input(&run, &[&missing, "cannot read"]);
}

#[test]
fn garbage_is_bad_input() {
    let dir = scratch("garbage");
    let yaml = dir.join("garbage.yaml");
    std::fs::write(&yaml, "apiVersion: v1\nitems: [\n  - {kind: Machine,\n").unwrap();
    let mut args = vec!["--objects".to_string(), yaml.display().to_string()];
    args.extend(etcd_args("healthy"));
    assert_bad_input(
        &check(&args),
        &[&yaml.display().to_string(), "not valid YAML"],
    );

    let json = dir.join("garbage.json");
    std::fs::write(&json, "{\"members\": [").unwrap();
    let run = check(&[
        "--objects",
        &objects("healthy.yaml"),
        "--member-list",
        &json.display().to_string(),
    ]);
    assert_bad_input(&run, &[&json.display().to_string(), "not valid JSON: EOF"]);
    // Issue 40: the cause once ("not valid JSON: EOF ...: not valid JSON: EOF ..." before).
    assert_eq!(run.stderr.matches("EOF").count(), 1, "{}", run.stderr);
    assert_said_once(&run);

    let alarms = dir.join("alarms.txt");
    std::fs::write(&alarms, "memberID:1 alarm:NOSPACE\nsomething else\n").unwrap();
    let mut args = vec!["--objects".to_string(), objects("healthy.yaml")];
    args.extend(etcd_args("healthy"));
    args.extend(["--alarms".to_string(), alarms.display().to_string()]);
    assert_bad_input(&check(&args), &[&alarms.display().to_string(), "line 2"]);
}

#[test]
fn wrong_kind_of_file_is_bad_input() {
    // The member list given as the objects.
    let mut args = vec!["--objects".to_string(), etcd("healthy", "member-list.json")];
    args.extend(etcd_args("healthy"));
    assert_bad_input(
        &check(&args),
        &["member-list.json", "not a Kubernetes object"],
    );

    // Objects without any KubeadmControlPlane.
    let dir = scratch("wrong_kind");
    let deploy = dir.join("deployment.yaml");
    std::fs::write(
        &deploy,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n  namespace: demo\n",
    )
    .unwrap();
    let mut args = vec!["--objects".to_string(), deploy.display().to_string()];
    args.extend(etcd_args("healthy"));
    assert_bad_input(
        &check(&args),
        &["no KubeadmControlPlane found", "Deployment demo/web"],
    );

    // The objects given as the member list; health given as status.
    let run = check(&[
        "--objects",
        &objects("healthy.yaml"),
        "--member-list",
        &objects("healthy.yaml"),
    ]);
    assert_bad_input(&run, &["healthy.yaml", "not valid JSON"]);
    let run = check(&[
        "--objects",
        &objects("healthy.yaml"),
        "--member-list",
        &etcd("healthy", "member-list.json"),
        "--endpoint-status",
        &etcd("healthy", "endpoint-health.json"),
    ]);
    assert_bad_input(
        &run,
        &[
            "endpoint-health.json",
            "not the output of `etcdctl endpoint status",
        ],
    );

    // A Machine without its namespace.
    let machine = dir.join("machine.yaml");
    std::fs::write(
        &machine,
        "apiVersion: cluster.x-k8s.io/v1beta2\nkind: Machine\nmetadata:\n  name: m\n",
    )
    .unwrap();
    let mut args = vec!["--objects".to_string(), machine.display().to_string()];
    args.extend(etcd_args("healthy"));
    assert_bad_input(
        &check(&args),
        &["Machine ?/m: field metadata.namespace is missing"],
    );
}

#[test]
fn bad_what_ifs_are_bad_input() {
    let run = check_with(
        "healthy.yaml",
        "healthy",
        &["--what-if", "delete machine/nope"],
    );
    assert_bad_input(&run, &["no Machine \"nope\"", M1]);
    let run = check_with(
        "healthy.yaml",
        "healthy",
        &["--what-if", "scale kcp/other 5"],
    );
    assert_bad_input(&run, &["not \"other\""]);
    let run = check_with(
        "healthy.yaml",
        "healthy",
        &["--what-if", "reboot machine/x"],
    );
    assert_bad_input(
        &run,
        &["expected 'delete machine/NAME' or 'scale kcp/NAME N'"],
    );
    let run = check_with("healthy.yaml", "healthy", &["-o", "yaml"]);
    assert_bad_input(&run, &["yaml"]);
}

#[test]
fn several_kcps_need_kcp() {
    let dir = scratch("several_kcps");
    let healthy = std::fs::read_to_string(objects("healthy.yaml")).unwrap();
    let path = dir.join("two.yaml");
    std::fs::write(
        &path,
        format!(
            "{healthy}\n---\n{}",
            healthy.replace("namespace: demo", "namespace: other")
        ),
    )
    .unwrap();
    let mut args = vec!["--objects".to_string(), path.display().to_string()];
    args.extend(etcd_args("healthy"));
    assert_bad_input(
        &check(&args),
        &[
            "2 KubeadmControlPlanes found",
            "demo/demo-control-plane, other/demo-control-plane",
            "--kcp",
        ],
    );
    args.extend(["--kcp".to_string(), "other/demo-control-plane".to_string()]);
    args.extend(["-o".to_string(), "json".to_string()]);
    let run = check(&args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.json()["controlPlane"]["kcp"],
        "other/demo-control-plane"
    );
    let mut bad = args.clone();
    bad.extend(["--kcp".to_string(), "nope".to_string()]);
    let run = check(&bad);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

#[test]
fn readme_example_stuck_upgrade() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stuck-upgrade");
    let f = |n: &str| dir.join(n).display().to_string();
    let run = check(&[
        "--objects",
        &f("objects.yaml"),
        "--member-list",
        &f("member-list.json"),
        "--endpoint-status",
        &f("endpoint-status.json"),
        "--endpoint-health",
        &f("endpoint-health.json"),
        "--what-if",
        &delete(M1),
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("ALLOWED (MemberAbsent)"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("Next action: DeleteMachine"),
        "{}",
        run.stdout
    );
}

/// No part of an error is said twice: each ": "-separated part of stderr longer than a few
/// words occurs once (issue 40: "not valid JSON: EOF ...: not valid JSON: EOF ...").
fn assert_said_once(run: &Run) {
    for part in run.stderr.trim().split(": ") {
        let part = part.trim();
        if part.len() >= 12 {
            assert_eq!(
                run.stderr.matches(part).count(),
                1,
                "{part:?} is said more than once in:\n{}",
                run.stderr
            );
        }
    }
}

/// The healthy scenario's member list with its members renamed, as the dumps of another
/// cluster (the playground's, say) hold them: written to `dir`.
fn member_list_of_another_cluster(dir: &Path) -> String {
    let text = std::fs::read_to_string(etcd("healthy", "member-list.json")).unwrap();
    let path = dir.join("other-member-list.json");
    std::fs::write(&path, text.replace("cp-node-", "pg-node-")).unwrap();
    path.display().to_string()
}

/// Issue 40: the objects of one cluster with the etcd dumps of another: not one member belongs
/// to a Machine of the KCP. It was judged (exit 0, `RemediateMachine` of a Machine "that has no
/// etcd member"); it is bad input, and the message says what did not match.
#[test]
fn dumps_of_another_cluster_are_bad_input() {
    let dir = scratch("another_cluster");
    let members = member_list_of_another_cluster(&dir);
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/stuck-upgrade");
    let run = check(&[
        "--objects",
        &example.join("objects.yaml").display().to_string(),
        "--member-list",
        &members,
    ]);
    assert_bad_input(
        &run,
        &[
            "no etcd member in",
            "other-member-list.json belongs to a Machine of KubeadmControlPlane demo/demo-control-plane in",
            "objects.yaml",
            "the members are pg-node-",
            &format!("{M1} (node cp-node-1)"),
        ],
    );
    assert_said_once(&run);
    // preflight offline reads the same dumps the same way.
    let run = quorumguard(
        "preflight",
        &[
            "--objects",
            &objects("healthy.yaml"),
            "--member-list",
            &members,
        ],
    );
    assert_bad_input(&run, &["no etcd member in", "the members are pg-node-"]);
    // One member of the Machines' is enough: a member list mid-rollout is not refused.
    let one_of_ours = dir.join("one-of-ours.json");
    let text = std::fs::read_to_string(etcd("healthy", "member-list.json")).unwrap();
    std::fs::write(
        &one_of_ours,
        text.replacen("cp-node-2", "pg-node-2", 1)
            .replacen("cp-node-3", "pg-node-3", 1),
    )
    .unwrap();
    let run = check(&[
        "--objects",
        &objects("healthy.yaml"),
        "--member-list",
        &one_of_ours.display().to_string(),
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
}

/// Issue 40: etcd dumps whose headers name different etcd clusters (`header.cluster_id`) are
/// bad input, naming both files and both clusters.
#[test]
fn etcd_dumps_of_different_etcd_clusters_are_bad_input() {
    let dir = scratch("other_etcd_cluster");
    // 2497353551676525385 = 0x22a861d2de3d4b49, the fixtures' cluster.
    let ours = "2497353551676525385";
    let status = std::fs::read_to_string(etcd("healthy", "endpoint-status.json")).unwrap();
    assert!(status.contains(ours), "{status}");
    let other_status = dir.join("endpoint-status.json");
    std::fs::write(&other_status, status.replace(ours, "17")).unwrap();
    let run = check(&[
        "--objects",
        &objects("healthy.yaml"),
        "--member-list",
        &etcd("healthy", "member-list.json"),
        "--endpoint-status",
        &other_status.display().to_string(),
    ]);
    assert_bad_input(
        &run,
        &[
            "endpoint-status.json comes from etcd cluster 11,",
            "member-list.json from etcd cluster 22a861d2de3d4b49",
            "different etcd clusters",
        ],
    );
    assert_said_once(&run);
    let alarms = dir.join("alarms.json");
    std::fs::write(&alarms, r#"{"header":{"cluster_id":17,"member_id":1}}"#).unwrap();
    let mut args = vec!["--objects".to_string(), objects("healthy.yaml")];
    args.extend(etcd_args("healthy"));
    args.extend(["--alarms".to_string(), alarms.display().to_string()]);
    assert_bad_input(&check(&args), &["alarms.json comes from etcd cluster 11,"]);
}

/// Issue 40: every dump given for every other dump's flag is bad input (exit 2, no report),
/// and its message names the file and says its cause once. `--alarms member-list.json` was
/// accepted as "no alarms".
#[test]
fn every_wrong_kind_of_file_for_each_flag_is_bad_input() {
    let dir = scratch("wrong_kind_matrix");
    let alarms_json = dir.join("alarm-list.json");
    std::fs::write(
        &alarms_json,
        r#"{"header":{"cluster_id":2497353551676525385,"member_id":1},"alarms":[{"memberID":1616332077818005593,"alarm":1}]}"#,
    )
    .unwrap();
    let kinds: [(&str, String); 6] = [
        ("--objects", objects("healthy.yaml")),
        ("--member-list", etcd("healthy", "member-list.json")),
        ("--endpoint-status", etcd("healthy", "endpoint-status.json")),
        ("--endpoint-health", etcd("healthy", "endpoint-health.json")),
        ("--alarms", etcd("nospace", "alarm-list.txt")),
        ("--alarms", alarms_json.display().to_string()),
    ];
    let mut checked = 0;
    for (flag, _) in &kinds[..5] {
        for (right_flag, file) in &kinds {
            if right_flag == flag {
                continue;
            }
            // The right file for every other flag, the wrong one for `flag`.
            let mut args = Vec::new();
            for (f, right) in &kinds[..5] {
                args.push(f.to_string());
                args.push(if f == flag {
                    file.clone()
                } else {
                    right.clone()
                });
            }
            // The alarm list is of the nospace scenario: its member is not in the healthy list,
            // which is a warning; without it the case is about `flag` alone.
            if *flag != "--alarms" {
                let i = args.iter().position(|a| a == "--alarms").unwrap();
                args.drain(i..i + 2);
            }
            let run = check(&args);
            let name = Path::new(file).file_name().unwrap().to_string_lossy();
            assert_eq!(
                run.code, 2,
                "{flag} {name}: stdout:\n{}\nstderr:\n{}",
                run.stdout, run.stderr
            );
            assert!(run.stdout.is_empty(), "{flag} {name}: {}", run.stdout);
            assert!(
                run.stderr.contains(name.as_ref()),
                "{flag} {name}: the file is not named: {}",
                run.stderr
            );
            assert_said_once(&run);
            checked += 1;
        }
    }
    assert_eq!(checked, 24);
}

/// `quorumguard preflight` offline: the same dumps, the same flags, a prediction of the rollout a
/// version change would start. Here rather than in a test binary of its own: it reuses this
/// file's fixtures and helpers, and every test binary costs CI a link.
mod preflight {
    use super::*;

    fn preflight<S: AsRef<str>>(args: &[S]) -> Run {
        quorumguard("preflight", args)
    }

    fn with(objects_file: &str, scenario: &str, extra: &[&str]) -> Run {
        let mut args = vec!["--objects".to_string(), objects(objects_file)];
        args.extend(etcd_args(scenario));
        args.extend(extra.iter().map(|s| s.to_string()));
        preflight(&args)
    }

    const LINE: &str = "demo/demo-control-plane  ";

    #[test]
    fn healthy_is_ready_and_exits_0() {
        let run = with("healthy.yaml", "healthy", &[]);
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        let lines: Vec<&str> = run.stdout.lines().collect();
        assert_eq!(lines.len(), 2, "{}", run.stdout);
        assert!(
            lines[0].starts_with(&format!(
                "{LINE}READY: 15 steps, each keeping a fault tolerance of at least 1"
            )),
            "{}",
            run.stdout
        );
        assert!(
            lines[1].starts_with(
                "  next: Nothing holds the rollout of KubeadmControlPlane demo/demo-control-plane"
            ),
            "{}",
            run.stdout
        );
    }

    #[test]
    fn a_member_down_would_stick_at_step_1_and_exits_1() {
        let run = with("healthy.yaml", "one-stopped", &[]);
        assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
        let out = &run.stdout;
        assert!(
            out.starts_with(&format!(
                "{LINE}WOULD STICK at step 1/15: etcd member cp-node-2"
            )),
            "{out}"
        );
        assert!(
            out.contains("KCP's preflight holds every scale operation"),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "  next: Ask KCP to replace Machine demo/{M2}, which has an unhealthy etcd member"
            )),
            "{out}"
        );
        assert!(out.contains("cluster.x-k8s.io/remediate-machine"), "{out}");
    }

    /// One replica: the dumps of the healthy cluster cut down to cp-node-1 and its Machine.
    fn one_replica(dir: &Path) -> Vec<String> {
        let text = std::fs::read_to_string(objects("healthy.yaml")).unwrap();
        let mut list: Value = serde_yaml::from_str(&text).unwrap();
        let items = list["items"].as_array_mut().unwrap();
        items.retain(|o| o["kind"] != "Machine" || o["metadata"]["name"] == M1);
        for o in items
            .iter_mut()
            .filter(|o| o["kind"] == "KubeadmControlPlane")
        {
            o["spec"]["replicas"] = 1.into();
        }
        let read = |f: &str| -> Value {
            serde_json::from_str(&std::fs::read_to_string(etcd("healthy", f)).unwrap()).unwrap()
        };
        let mut members = read("member-list.json");
        members["members"]
            .as_array_mut()
            .unwrap()
            .retain(|m| m["name"] == "cp-node-1");
        let url = members["members"][0]["clientURLs"][0].clone();
        let mut status = read("endpoint-status.json");
        status
            .as_array_mut()
            .unwrap()
            .retain(|e| e["Endpoint"] == url);
        let mut health = read("endpoint-health.json");
        health
            .as_array_mut()
            .unwrap()
            .retain(|e| e["endpoint"] == url);
        let mut args = Vec::new();
        for (flag, file, v) in [
            ("--objects", "objects.json", list),
            ("--member-list", "member-list.json", members),
            ("--endpoint-status", "endpoint-status.json", status),
            ("--endpoint-health", "endpoint-health.json", health),
        ] {
            let path = dir.join(file);
            std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
            args.extend([flag.to_string(), path.display().to_string()]);
        }
        args
    }

    #[test]
    fn one_replica_finishes_but_is_unsafe_from_the_start_and_exits_1() {
        let args = one_replica(&scratch("preflight-one-replica"));
        let run = preflight(&args);
        assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
        assert!(run.stderr.is_empty(), "{}", run.stderr);
        let out = &run.stdout;
        assert!(
            out.starts_with(&format!(
                "{LINE}UNSAFE at step 1/5: already before the first step: fault tolerance 0 (1 healthy of 1 voting members, quorum 1)"
            )),
            "{out}"
        );
        assert!(
            out.contains("kubectl scale kcp -n demo demo-control-plane --replicas=3"),
            "{out}"
        );
    }

    #[test]
    fn unknown_health_cannot_be_judged_and_exits_2() {
        let run = preflight(&[
            "--objects",
            &objects("healthy.yaml"),
            "--member-list",
            &etcd("healthy", "member-list.json"),
        ]);
        assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
        assert!(
            run.stdout.starts_with(&format!(
                "{LINE}CANNOT JUDGE: the health of etcd member cp-node-"
            )),
            "{}",
            run.stdout
        );
        assert!(
            run.stdout
                .contains("is unknown: probe again (offline: add the endpoint status and health dumps) before predicting"),
            "{}",
            run.stdout
        );
    }

    #[test]
    fn steps_prints_the_table_of_steps() {
        let run = with("healthy.yaml", "healthy", &["--steps"]);
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        let out = &run.stdout;
        println!("{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with(
                "KubeadmControlPlane demo/demo-control-plane (Cluster demo): READY: 15 steps"
            ),
            "{out}"
        );
        let header: Vec<&str> = lines[2]
            .split("  ")
            .filter(|c| !c.is_empty())
            .map(str::trim)
            .collect();
        assert_eq!(
            header,
            [
                "#",
                "ACTION",
                "V/H/L",
                "QUORUM",
                "FT",
                "WEBHOOK",
                "IF ONE MORE MEMBER FAILS HERE"
            ],
            "{out}"
        );
        let rows: Vec<&str> = lines[3..]
            .iter()
            .copied()
            .take_while(|l| !l.is_empty())
            .collect();
        assert_eq!(rows.len(), 16, "a start row and 15 steps:\n{out}");
        assert!(rows[0].starts_with("0   (before the rollout)"), "{out}");
        assert!(rows[0].contains("  3/3/0  2       1   -"), "{out}");
        assert!(
            rows[1].starts_with(
                "1   KCP scales up: creates Machine demo-control-plane-new1 of the new version"
            ),
            "{out}"
        );
        assert!(rows[2].contains("joins etcd as a learner"), "{out}");
        assert!(rows[2].contains("  3/3/1  "), "{out}");
        assert!(rows[3].contains("  4/4/0  3       1   "), "{out}");
        // The oldest outdated Machine goes first, and the guard allows KCP's deletion.
        assert!(
            rows[4].starts_with(&format!("4   KCP deletes Machine {M1}")),
            "{out}"
        );
        assert!(rows[4].contains("allowed ("), "{out}");
        assert!(
            rows[5].contains("pre-terminate hook removes the etcd member"),
            "{out}"
        );
        assert!(rows[5].contains("  3/3/0  2       1   "), "{out}");
        assert!(rows[15].starts_with("15  "), "{out}");
        for r in &rows[1..] {
            assert!(r.contains(" fails: quorum kept"), "{r}\n{out}");
        }
        assert!(out.contains("\nnext: Nothing holds the rollout"), "{out}");

        // A stuck rollout: the start row, then the step that cannot happen.
        let run = with("healthy.yaml", "one-stopped", &["--steps"]);
        assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
        assert!(
            run.stdout
                .contains("0  (before the rollout)             3/2/0  2       0"),
            "{}",
            run.stdout
        );
        assert!(
            run.stdout.contains("\n1  STICKS: MemberUnhealthy (above)"),
            "{}",
            run.stdout
        );
    }

    #[test]
    fn json_parses_with_every_field() {
        let run = with("healthy.yaml", "one-stopped", &["-o", "json"]);
        assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
        let v = run.json();
        assert_eq!(v["schema"], "quorumguard.io/preflight/v1");
        let cps = v["controlPlanes"].as_array().unwrap();
        assert_eq!(cps.len(), 1);
        let c = &cps[0];
        assert_eq!(c["kcp"], "demo/demo-control-plane");
        assert_eq!(c["cluster"], "demo");
        assert_eq!(c["readiness"], "WouldStick");
        assert_eq!(c["at"], 1);
        assert_eq!(c["of"], 15);
        assert_eq!(c["reason"], "MemberUnhealthy");
        assert!(
            c["summary"]
                .as_str()
                .unwrap()
                .starts_with("WOULD STICK at step 1/15: ")
        );
        assert_eq!(c["total"], 15);
        assert_eq!(
            c["start"],
            serde_json::json!({"voting": 3, "healthy": 2, "learners": 0, "quorum": 2, "faultTolerance": 0})
        );
        assert_eq!(c["steps"], serde_json::json!([]));
        assert_eq!(c["nextAction"]["code"], "RemediateMachine");
        assert_eq!(c["nextAction"]["target"], M2);
        assert_eq!(c["probe"], Value::Null);
        assert!(
            v["warnings"].as_array().unwrap()[0]
                .as_str()
                .unwrap()
                .contains("endpoint status has no entry for member cp-node-2")
        );

        let run = with("healthy.yaml", "healthy", &["-o", "json", "--steps"]);
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        let c = &run.json()["controlPlanes"][0];
        assert_eq!(c["readiness"], "Ready");
        assert_eq!(c["at"], Value::Null);
        let steps = c["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 15);
        let kinds: Vec<&str> = steps.iter().map(|s| s["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds[..5],
            ["create", "join", "promote", "delete", "removed"]
        );
        assert_eq!(steps[3]["machine"], M1);
        assert!(
            steps[3]["webhook"]
                .as_str()
                .unwrap()
                .starts_with("allowed (")
        );
        assert_eq!(steps[0]["webhook"], Value::Null);
        assert_eq!(steps[2]["counts"]["voting"], 4);
        let f = &steps[0]["oneFailure"];
        assert_eq!(f["quorumKept"], true);
        assert!(f["member"].is_string() && f["text"].is_string(), "{f:#}");
        assert!(f.get("sticksAt").is_some(), "{f:#}");
    }

    #[test]
    fn dump_flags_go_together_and_exclude_the_management_cluster() {
        let run = preflight(&["--objects", &objects("healthy.yaml")]);
        assert_bad_input(&run, &["--member-list"]);
        let run = preflight(&[
            "--endpoint-status",
            &etcd("healthy", "endpoint-status.json"),
        ]);
        assert_bad_input(&run, &["--objects"]);
        let run = with("healthy.yaml", "healthy", &["-n", "demo"]);
        assert_bad_input(&run, &["cannot be used with"]);
        let run = with("healthy.yaml", "healthy", &["--kubeconfig", "/nowhere"]);
        assert_bad_input(&run, &["cannot be used with"]);
        // --kcp picks one of several, as in check.
        let run = with("healthy.yaml", "healthy", &["--kcp", "nope"]);
        assert_bad_input(&run, &["no KubeadmControlPlane \"nope\""]);
        let run = with(
            "healthy.yaml",
            "healthy",
            &["--kcp", "demo/demo-control-plane"],
        );
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    }
}

/// etcd 3.5.1 with quorum lost (tests/fixtures/etcd-3.5.1/quorum-lost, real output): etcdctl
/// 3.5 fails the member list (it asks for a linearizable one), leaving an empty dump (or, with
/// `2>&1`, its error), while the survivor's status answers "etcdserver: no leader". `check`
/// judges on it instead of stopping at a parse error, and says what was seen: no member list,
/// why etcdctl 3.5 gives none, one member answering without a leader, etcd 3.5.1. It claims no
/// member count, no quorum figures and no quorum loss it did not see.
#[test]
fn etcd_3_5_quorum_lost_without_a_member_list_says_what_was_seen() {
    let dir = fixtures().join("etcd-3.5.1").join("quorum-lost");
    let file = |f: &str| dir.join(f).display().to_string();
    for dump in ["member-list.json", "member-list.stderr"] {
        let args = [
            "--objects".to_string(),
            objects("healthy.yaml"),
            "--member-list".into(),
            file(dump),
            "--endpoint-status".into(),
            file("endpoint-status.json"),
            "--endpoint-health".into(),
            file("endpoint-health.json"),
            "--what-if".into(),
            delete(M3),
        ];
        let mut json_args = args.to_vec();
        json_args.extend(["-o".to_string(), "json".to_string()]);
        let run = check(&json_args);
        assert_eq!(run.code, 1, "{dump}: {}{}", run.stdout, run.stderr);
        let r = run.json();
        assert_eq!(r["quorum"], Value::Null, "{dump}: {r:#}");
        assert_eq!(r["members"], serde_json::json!([]));
        let why = r["etcdUnknown"].as_str().expect("etcdUnknown");
        for said in [
            "no member list",
            "etcdctl 3.5 and later get the member list only from a leader with its quorum",
            "1 member answers its status (etcd 3.5.1), none has a leader, error \"etcdserver: no leader\"",
        ] {
            assert!(why.contains(said), "{dump}: {said:?} not in {why}");
        }
        let expected = if dump.ends_with(".json") {
            "the dump is empty".to_string()
        } else {
            "etcdctl failed: \"context deadline exceeded\"".to_string()
        };
        assert!(why.contains(&expected), "{dump}: {why}");
        assert_eq!(r["verdicts"][0]["allowed"], false, "{r:#}");
        assert_eq!(r["nextAction"]["code"], "CheckEtcdHealth", "{r:#}");
        let text = check(&args);
        assert!(
            text.stdout.contains("\netcd: no member list: "),
            "{}",
            text.stdout
        );
        for wrong in ["quorum lost", "QUORUM LOST", "RestoreQuorum", "snapshot"] {
            assert!(
                !text.stdout.contains(wrong) && !run.stdout.contains(wrong),
                "{dump}: {wrong:?} claimed:\n{}",
                text.stdout
            );
        }
    }
}

/// Each member's version is shown (the table's VERSION, the JSON's `version`), and so is the
/// check etcd makes before it adds a member, by that version: 3.4.23 (the fixtures) needs every
/// voting member connected.
#[test]
fn the_etcd_version_and_its_member_add_rule_are_shown() {
    let json = check_with("healthy.yaml", "healthy", &["-o", "json"]).json();
    for m in json["members"].as_array().expect("members") {
        assert_eq!(m["version"], "3.4.23", "{m:#}");
    }
    let rule = "etcd 3.4.23 adds a member only while every voting member is connected (its \
                strict reconfiguration check before etcd 3.5.30 and 3.6.11)";
    assert_eq!(json["memberAdd"], rule);
    let text = check_with("healthy.yaml", "healthy", &[]).stdout;
    assert!(text.contains(&format!("Member add: {rule}\n")), "{text}");
    assert!(text.contains("VERSION"), "{text}");
    assert!(text.contains("3.4.23"), "{text}");
}

/// healthy.yaml with a MachineHealthCheck over the control-plane Machines that allows one
/// unhealthy Machine and last counted M2 unhealthy (1 of 3; M2 carries `HealthCheckSucceeded`
/// False, as v1.14 `needsRemediation` sets it), written to a scratch file; `paused` sets the
/// Cluster's `spec.paused`.
fn objects_with_health_check(test: &str, paused: bool) -> String {
    let mut list: Value =
        serde_yaml::from_str(&std::fs::read_to_string(objects("healthy.yaml")).unwrap()).unwrap();
    let items = list["items"].as_array_mut().expect("a List");
    for item in items.iter_mut() {
        if item["kind"] == "Machine" && item["metadata"]["name"] == M2 {
            item["status"]["conditions"] = serde_json::json!([{
                "type": "HealthCheckSucceeded", "status": "False",
                "reason": "UnhealthyNode", "lastTransitionTime": "2025-06-01T11:00:00Z",
                "message": "Health check failed:\n  * Condition Ready on Node is reporting status Unknown for more than 5m0s"
            }]);
        }
        if item["kind"] == "Cluster" && paused {
            item["spec"]["paused"] = Value::Bool(true);
        }
    }
    items.push(serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck",
        "metadata": {"name": "demo-cp", "namespace": "demo"},
        "spec": {
            "clusterName": "demo",
            "selector": {"matchLabels": {"cluster.x-k8s.io/control-plane": ""}},
            "remediation": {"triggerIf": {"unhealthyLessThanOrEqualTo": 1}}
        },
        "status": {"expectedMachines": 3, "currentHealthy": 2}
    }));
    let path = scratch(test).join("objects.json");
    std::fs::write(&path, serde_json::to_string_pretty(&list).unwrap()).unwrap();
    path.display().to_string()
}

fn machine<'a>(report: &'a Value, name: &str) -> &'a Value {
    named(report, "machines", name)
}

/// The JSON says which MachineHealthChecks cover the Machines, their trigger and last count,
/// and whether each Machine's remediation reaches KCP now. M2, frozen, is the one the
/// MachineHealthCheck counted unhealthy: marking it adds nothing to its 1 of 3, which 1 allows,
/// so the advice is to remediate it (counted twice, 2 of 3 would be a short-circuit that does
/// not happen, and the advice "change triggerIf" false). Marking M1 as well would make 2 of 3.
#[test]
fn json_tells_machine_health_check_coverage() {
    let mut args = vec![
        "--objects".to_string(),
        objects_with_health_check("json_mhc", false),
    ];
    args.extend(etcd_args("one-stopped"));
    args.extend(["-o".to_string(), "json".to_string()]);
    let run = check(&args);
    assert_ne!(run.code, 2, "{}{}", run.stdout, run.stderr);
    let r = run.json();
    assert_eq!(r["controlPlane"]["paused"], false);
    assert_eq!(r["controlPlane"]["clusterPaused"], false);
    let hcs = &r["machineHealthChecks"];
    assert_eq!(hcs["known"], true, "{hcs:#}");
    assert_eq!(hcs["unknown"], Value::Null);
    // M1's and M3's remediation would short-circuit it (below): the summary tells of a gap.
    assert_eq!(hcs["gap"], hcs["summary"], "{hcs:#}");
    assert!(
        hcs["summary"]
            .as_str()
            .unwrap()
            .starts_with("MachineHealthCheck demo/demo-cp covers 3 of the Machines (unhealthyLessThanOrEqualTo 1), last counted 1 of 3 unhealthy"),
        "{hcs:#}"
    );
    let checks = hcs["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), 1);
    let c = &checks[0];
    assert_eq!(c["name"], "demo-cp");
    assert_eq!(c["paused"], false);
    assert_eq!(c["trigger"], "unhealthyLessThanOrEqualTo 1");
    let mut targets: Vec<&str> = c["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    targets.sort_unstable();
    let mut all = vec![M1, M2, M3];
    all.sort_unstable();
    assert_eq!(targets, all);
    assert_eq!(
        c["lastCounted"],
        serde_json::json!({"unhealthy": 1, "expected": 3})
    );
    assert_eq!(c["shortCircuited"], false);

    let m2 = &machine(&r, M2)["remediation"];
    assert_eq!(
        m2,
        &serde_json::json!({"coveredBy": ["demo-cp"], "reachesKcp": true, "held": null,
                            "heldBy": null, "wouldCount": null, "countedUnhealthy": true})
    );
    let m1 = &machine(&r, M1)["remediation"];
    assert_eq!(
        m1,
        &serde_json::json!({"coveredBy": ["demo-cp"], "reachesKcp": false,
                            "held": "ShortCircuit", "heldBy": "demo-cp",
                            "wouldCount": {"unhealthy": 2, "expected": 3},
                            "countedUnhealthy": false})
    );
    assert_eq!(
        r["nextAction"]["code"], "RemediateMachine",
        "{:#}",
        r["nextAction"]
    );
    assert_eq!(r["nextAction"]["target"], M2);

    // Without the dump's MachineHealthChecks: not known, never "none".
    let run = check_with("healthy.yaml", "one-stopped", &["-o", "json"]);
    let r = run.json();
    let hcs = &r["machineHealthChecks"];
    assert_eq!(hcs["known"], false);
    assert!(
        hcs["unknown"]
            .as_str()
            .unwrap()
            .contains("holds no MachineHealthCheck"),
        "{hcs:#}"
    );
    assert_eq!(hcs["checks"], serde_json::json!([]));
    let m2 = &machine(&r, M2)["remediation"];
    assert_eq!(m2["coveredBy"], Value::Null);
    assert_eq!(m2["reachesKcp"], Value::Null);
}

/// A paused Cluster (clusterctl move pauses it on purpose): the same dump's advice becomes
/// `Unpause`, naming the remediation as what follows; no remediation reaches KCP; the
/// verdicts stay what quorum says.
#[test]
fn a_paused_cluster_says_unpause_and_reaches_nothing() {
    let with = |paused: bool, test: &str| {
        let mut args = vec![
            "--objects".to_string(),
            objects_with_health_check(test, paused),
        ];
        args.extend(etcd_args("one-stopped"));
        args.extend(
            ["--what-if", &delete(M1), "-o", "json"]
                .iter()
                .map(|s| s.to_string()),
        );
        check(&args)
    };
    let before = with(false, "paused_before").json();
    let run = with(true, "paused_after");
    let r = run.json();
    assert_eq!(r["controlPlane"]["clusterPaused"], true);
    assert_eq!(r["nextAction"]["code"], "Unpause", "{:#}", r["nextAction"]);
    assert_eq!(r["nextAction"]["target"], M2);
    assert_eq!(
        r["nextAction"]["command"],
        r#"kubectl patch cluster -n demo demo --type merge -p '{"spec":{"paused":false}}'"#
    );
    let msg = r["nextAction"]["message"].as_str().unwrap();
    assert!(
        msg.contains("unpause only when no move is in progress")
            && msg.contains(&format!(
                "After that, RemediateMachine: {}",
                before["nextAction"]["message"].as_str().unwrap()
            )),
        "{msg}"
    );
    let m2 = &machine(&r, M2)["remediation"];
    assert_eq!(m2["reachesKcp"], false);
    assert_eq!(m2["held"], "ControlPlanePaused");
    assert!(
        r["machineHealthChecks"]["gap"]
            .as_str()
            .is_some_and(|g| g.contains("Cluster demo/demo is paused (spec.paused: true)")),
        "{:#}",
        r["machineHealthChecks"]
    );
    for key in ["allowed", "reason", "figures"] {
        assert_eq!(r["verdicts"][0][key], before["verdicts"][0][key], "{key}");
    }
    assert_eq!(r["verdicts"][0]["allowed"], false);

    // The text header says so.
    let mut args = vec![
        "--objects".to_string(),
        objects_with_health_check("paused_text", true),
    ];
    args.extend(etcd_args("one-stopped"));
    let text = check(&args);
    assert!(
        text.stdout.contains(", Cluster PAUSED\n"),
        "{}",
        text.stdout
    );
}
