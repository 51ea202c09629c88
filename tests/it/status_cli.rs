//! `quorumguard status`, the binary, against a real 3-member etcd cluster (3.4 or 3.5) with TLS on
//! loopback, with the API-server stand-in as the management cluster. The stand-in holds Cluster
//! `test` (annotations: the etcd client URLs, `quorumguard.io/etcd-transport: direct`), KCP
//! `test-controlplane`, one control-plane Machine per member and Secret `test-etcd` with the
//! test CA, as Cluster API would. The binary reads them through a kubeconfig file, probes etcd
//! and prints; nothing here calls quorumguard's library for the answer.
//!
//! Every child process runs under a bound (killed and reported past it), every etcd process is
//! killed on drop.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::apiserver::ApiServer;
use testkit::etcd::EtcdCluster;
use testkit::reviews::{NS, cluster_object};
use testkit::seed;

const BIN: &str = env!("CARGO_BIN_EXE_quorumguard");
/// The longest any one run of the binary may take before it is killed and the test fails.
const RUN_BOUND: Duration = Duration::from_secs(60);
/// A second namespace, for `-A`.
const OTHER_NS: &str = "capi-other";

/// A scratch directory of its own for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("status_cli")
        .join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    fn both(&self) -> String {
        format!(
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `program args` with `env` (KUBECONFIG removed unless given, HOME set to `home` so no
/// ~/.kube/config of the machine is read), killing it after [`RUN_BOUND`]. Blocking: call it
/// through [`run`].
fn run_blocking(
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, OsString)>,
    home: PathBuf,
) -> Run {
    let mut cmd = Command::new(&program);
    cmd.args(&args)
        .env_remove("KUBECONFIG")
        .env("HOME", &home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in &env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("stdout piped")));
    let err = reader(Box::new(child.stderr.take().expect("stderr piped")));
    let mut status = None;
    for _ in 0..(RUN_BOUND.as_millis() / 20) {
        if let Some(s) = child.try_wait().expect("wait for the child") {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = started.elapsed();
    let killed = status.is_none();
    if killed {
        let _ = child.kill();
        let _ = child.wait();
    }
    let run = Run {
        code: status.and_then(|s| s.code()).unwrap_or(-1),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        took,
    };
    assert!(
        !killed,
        "{} {args:?} did not end within {RUN_BOUND:?}:\n{}",
        program.display(),
        run.both()
    );
    run
}

/// Runs a program off the async runtime, so the stand-in keeps answering meanwhile.
async fn run(program: &Path, args: &[&str], env: &[(&str, OsString)], home: &Path) -> Run {
    let program = program.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let env: Vec<(String, OsString)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let home = home.to_path_buf();
    tokio::task::spawn_blocking(move || run_blocking(program, args, env, home))
        .await
        .expect("the run thread")
}

/// `quorumguard status ARGS --kubeconfig KUBECONFIG`.
async fn status(kubeconfig: &Path, args: &[&str]) -> Run {
    let kc = kubeconfig.display().to_string();
    let mut all = vec!["status", "--kubeconfig", kc.as_str()];
    all.extend_from_slice(args);
    let home = kubeconfig.parent().expect("the kubeconfig's directory");
    run(Path::new(BIN), &all, &[], home).await
}

/// A real etcd, the stand-in seeded with cluster `test` in [`NS`], and a kubeconfig file for it
/// in a scratch directory.
async fn live(test: &str) -> (EtcdCluster, ApiServer, PathBuf, Vec<String>) {
    let etcd = EtcdCluster::start(3);
    let api = ApiServer::start().await.expect("stand-in");
    let members: Vec<String> = (0..3).map(|i| etcd.name(i).to_string()).collect();
    // KCP v1.32: learner joins, as kubeadm joins by default since v1.29, so a rollout of this
    // healthy control plane is READY (with voting joins it passes fault tolerance 0 at each
    // join: UNSAFE, the engine's rollout tests).
    seed::cluster(
        &api,
        NS,
        "test",
        seed::direct_to(&etcd),
        &members,
        Some(&etcd.pki),
        |k| k["spec"]["version"] = json!("v1.32.0"),
    );
    let kubeconfig = scratch(test).join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    (etcd, api, kubeconfig, members)
}

/// The member table's row of member `name` (rows start with the member name).
fn row<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no member row {name:?} in:\n{out}"))
}

/// `{member name: hex ID}` as etcd itself lists them.
fn ids(etcd: &mut EtcdCluster) -> Vec<(String, String)> {
    etcd.member_list()
        .into_iter()
        .map(|(id, name, _)| (name, format!("{id:x}")))
        .collect()
}

fn member<'a>(cp: &'a Value, name: &str) -> &'a Value {
    cp["members"]
        .as_array()
        .expect("members")
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no member {name} in {cp:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_cluster_shows_three_members_quorum_two_of_three_and_no_action() {
    let (mut etcd, _api, kubeconfig, members) = live("healthy").await;
    let ids = ids(&mut etcd);

    // Text. The namespace comes from the kubeconfig context, as kubectl takes it.
    let in_ns = kubeconfig.with_file_name("kubeconfig-capi-test");
    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    assert!(text.contains("namespace: default"), "{text}");
    std::fs::write(
        &in_ns,
        text.replace("namespace: default", &format!("namespace: {NS}")),
    )
    .expect("write kubeconfig");
    let r = status(&in_ns, &["test"]).await;
    assert_eq!(r.code, 0, "{}", r.both());
    println!("{}", r.stdout);
    let out = &r.stdout;
    assert!(
        out.starts_with(
            "KubeadmControlPlane capi-test/test-controlplane (Cluster test): replicas 3"
        ),
        "{out}"
    );
    assert!(out.contains("etcd probe: member list read"), "{out}");
    assert!(out.contains("(transport direct)"), "{out}");
    assert!(out.contains("etcd condition: True (Healthy)"), "{out}");
    let version = testkit::etcd::version().to_string();
    let mut leaders = 0;
    for m in &members {
        let line = row(out, m);
        let id = &ids.iter().find(|(n, _)| n == m).expect("etcd lists it").1;
        assert!(line.contains(id.as_str()), "{m} shows its ID {id}: {line}");
        assert!(line.contains(" voting "), "{line}");
        assert!(line.contains(" healthy "), "{line}");
        assert!(!line.contains("unhealthy"), "{line}");
        assert!(
            line.contains(&format!(" {version} ")),
            "etcd version: {line}"
        );
        assert!(
            line.contains("KiB") || line.contains("MiB"),
            "DB size: {line}"
        );
        assert!(line.ends_with(&format!("test-{m}")), "its Machine: {line}");
        leaders += usize::from(line.contains(" leader "));
    }
    assert_eq!(leaders, 1, "exactly one leader:\n{out}");
    for needle in [
        "NAME",
        "RAFT INDEX",
        "Machines without an etcd member: none",
        "Quorum: members 3, voting 3, healthy 3, quorum 2, fault tolerance 1 (unhealthy 0, unknown 0, learners 0)",
        "Next action: None",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    // etcd's rule for adding a member, by the version the members report.
    let rule = quorumguard::engine::etcd_version::EtcdVersion::parse(&version)
        .expect("etcd's version")
        .add_member_rule();
    let member_add = format!(
        "Member add: etcd {version} adds a member only while {} ({})\n",
        rule.condition(),
        rule.source()
    );
    assert!(
        out.contains(&member_add),
        "missing {member_add:?} in:\n{out}"
    );

    // JSON: the same figures, `check`'s schema per control plane.
    let r = status(&kubeconfig, &["test", "-n", NS, "-o", "json"]).await;
    assert_eq!(r.code, 0, "{}", r.both());
    let v = r.json();
    assert_eq!(v["schema"], "quorumguard.io/status/v1");
    assert_eq!(v["warnings"], json!([]));
    let cps = v["controlPlanes"].as_array().expect("controlPlanes");
    assert_eq!(cps.len(), 1, "{v:#}");
    let cp = &cps[0];
    assert_eq!(cp["schema"], "quorumguard.io/check/v1");
    assert_eq!(cp["controlPlane"]["kcp"], "capi-test/test-controlplane");
    assert_eq!(cp["controlPlane"]["cluster"], "test");
    assert_eq!(cp["members"].as_array().expect("members").len(), 3);
    for (name, id) in &ids {
        let m = member(cp, name);
        assert_eq!(m["id"], id.as_str());
        assert_eq!(m["health"], "Healthy");
        assert_eq!(m["error"], Value::Null);
        assert_eq!(m["voting"], true);
        assert_eq!(m["machine"], format!("test-{name}"));
        assert!(m["raftIndex"].as_u64().is_some_and(|i| i > 0), "{m:#}");
        assert_eq!(m["version"], version.as_str(), "{m:#}");
    }
    assert_eq!(
        cp["memberAdd"],
        member_add.trim_start_matches("Member add: ").trim_end()
    );
    let leaders = cp["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter(|m| m["leader"] == true)
        .count();
    assert_eq!(leaders, 1);
    assert_eq!(
        cp["quorum"],
        json!({"members": 3, "voting": 3, "learners": 0, "healthy": 3, "unhealthy": 0,
               "unknown": 0, "quorum": 2, "faultTolerance": 1, "hasQuorum": true})
    );
    assert_eq!(cp["machinesWithoutMember"], json!([]));
    // The seeded MachineHealthCheck covers every Machine; it has not counted yet (no status).
    assert_eq!(cp["controlPlane"]["paused"], false);
    assert_eq!(cp["controlPlane"]["clusterPaused"], false);
    let mut machines: Vec<String> = members.iter().map(|m| format!("test-{m}")).collect();
    machines.sort();
    let hcs = &cp["machineHealthChecks"];
    assert_eq!(hcs["known"], true, "{hcs:#}");
    assert_eq!(hcs["unknown"], Value::Null);
    assert_eq!(hcs["gap"], Value::Null);
    let checks = hcs["checks"].as_array().expect("checks");
    assert_eq!(checks.len(), 1, "{hcs:#}");
    let mut targets: Vec<String> = checks[0]["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter_map(|t| t.as_str().map(str::to_string))
        .collect();
    targets.sort();
    assert_eq!(targets, machines);
    assert_eq!(checks[0]["name"], "test-cp-mhc");
    assert_eq!(checks[0]["paused"], false);
    assert_eq!(checks[0]["trigger"], "unhealthyLessThanOrEqualTo 100%");
    assert_eq!(checks[0]["lastCounted"], Value::Null);
    assert_eq!(checks[0]["shortCircuited"], Value::Null);
    assert!(
        hcs["summary"]
            .as_str()
            .is_some_and(|s| s
                .starts_with("MachineHealthCheck capi-test/test-cp-mhc covers 3 of the Machines")),
        "{hcs:#}"
    );
    for m in cp["machines"].as_array().expect("machines") {
        assert_eq!(
            m["remediation"],
            json!({"coveredBy": ["test-cp-mhc"], "reachesKcp": true, "held": null,
                   "heldBy": null, "wouldCount": null, "countedUnhealthy": false}),
            "{m:#}"
        );
    }
    assert_eq!(cp["verdicts"], json!([]));
    assert_eq!(cp["nextAction"]["code"], "None");
    assert_eq!(cp["probe"]["result"], "Observed");
    assert_eq!(cp["probe"]["error"], Value::Null);
    assert_eq!(cp["probe"]["transport"], "direct");
    let conds = cp["conditions"].as_array().expect("conditions");
    assert_eq!(conds.len(), 2);
    assert_eq!(conds[0]["type"], "quorumguard.io/EtcdQuorum");
    assert_eq!(conds[0]["status"], "True");
    assert_eq!(conds[0]["reason"], "Healthy");
    assert_eq!(conds[1]["type"], "quorumguard.io/NextAction");
    assert_eq!(conds[1]["reason"], "None");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_a_frozen_member_is_unhealthy_with_its_error_and_named_by_the_next_action() {
    let (mut etcd, _api, kubeconfig, _members) = live("frozen").await;
    // Freeze a follower: freezing the leader would add an election to what is measured.
    let before = status(&kubeconfig, &["test", "-n", NS, "-o", "json"]).await;
    assert_eq!(before.code, 0, "{}", before.both());
    let v = before.json();
    let frozen = v["controlPlanes"][0]["members"]
        .as_array()
        .expect("members")
        .iter()
        .find(|m| m["leader"] == false)
        .and_then(|m| m["name"].as_str())
        .expect("a follower")
        .to_string();
    etcd.freeze(etcd.index_of(&frozen));

    let timeout = Duration::from_secs(1);
    let r = status(&kubeconfig, &["test", "-n", NS, "--probe-timeout", "1s"]).await;
    assert_eq!(r.code, 1, "an action is needed: {}", r.both());
    println!("took {:?}:\n{}", r.took, r.stdout);
    // The probe reads the CA Secret, then etcd, each within the timeout; the rest is starting
    // a process and two API round trips. Generous: this bounds a hang, it times nothing.
    assert!(
        r.took < timeout * 2 + Duration::from_secs(10),
        "took {:?} with --probe-timeout {timeout:?}",
        r.took
    );
    let out = &r.stdout;
    let line = row(out, &frozen);
    let error = line
        .split("unhealthy: ")
        .nth(1)
        .unwrap_or_else(|| panic!("{frozen} is not unhealthy: {line}\n{out}"));
    assert!(error.len() > 10, "the error text is shown: {line}");
    for needle in [
        "etcd condition: False (MembersUnhealthy)",
        "Quorum: members 3, voting 3, healthy 2, quorum 2, fault tolerance 0",
        "Next action: RemediateMachine",
        &format!("test-{frozen}"),
        "cluster.x-k8s.io/remediate-machine",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    let action = out
        .split("Next action: ")
        .nth(1)
        .expect("a next action section");
    assert!(
        action.contains(&format!("test-{frozen}")),
        "it names the Machine: {action}"
    );

    let r = status(
        &kubeconfig,
        &["test", "-n", NS, "--probe-timeout", "1s", "-o", "json"],
    )
    .await;
    assert_eq!(r.code, 1, "{}", r.both());
    let cp = &r.json()["controlPlanes"][0];
    let m = member(cp, &frozen);
    assert_eq!(m["health"], "Unhealthy");
    assert!(m["error"].as_str().is_some_and(|e| !e.is_empty()), "{m:#}");
    assert_eq!(cp["quorum"]["healthy"], 2);
    assert_eq!(cp["quorum"]["faultTolerance"], 0);
    assert_eq!(cp["quorum"]["hasQuorum"], true);
    assert_eq!(cp["nextAction"]["code"], "RemediateMachine");
    assert_eq!(cp["nextAction"]["target"], format!("test-{frozen}"));
    assert!(
        cp["nextAction"]["command"].as_str().is_some_and(
            |c| c.contains(&format!("test-{frozen}")) && c.contains("remediate-machine")
        ),
        "{:#}",
        cp["nextAction"]
    );
    etcd.thaw(etcd.index_of(&frozen));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_bad_input_exits_2_and_says_what_exists() {
    // No etcd: every case here ends before a probe.
    let api = ApiServer::start().await.expect("stand-in");
    seed::cluster(
        &api,
        NS,
        "test",
        json!({}),
        &["m1".to_string()],
        None,
        |_| {},
    );
    let mut bare = cluster_object(json!({}));
    bare["metadata"]["name"] = json!("bare");
    bare["spec"] = json!({});
    api.insert(bare).expect("cluster without a control plane");
    let dir = scratch("bad-input");
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");

    let r = status(&kubeconfig, &["nope", "-n", NS]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stdout.is_empty(), "{}", r.both());
    for needle in [
        "no Cluster \"nope\" in namespace capi-test",
        "Clusters in namespace capi-test: bare, test",
        "-A",
    ] {
        assert!(
            r.stderr.contains(needle),
            "missing {needle:?}: {}",
            r.both()
        );
    }

    // The namespace is empty: the Clusters elsewhere are named.
    let r = status(&kubeconfig, &["test", "-n", "empty"]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr
            .contains("there are no Clusters in namespace empty"),
        "{}",
        r.both()
    );
    assert!(
        r.stderr
            .contains("Clusters in other namespaces: capi-test/bare, capi-test/test"),
        "{}",
        r.both()
    );

    let r = status(&kubeconfig, &["bare", "-n", NS]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr
            .contains("Cluster capi-test/bare has no KubeadmControlPlane"),
        "{}",
        r.both()
    );

    // By name across namespaces: refused like kubectl does, by the argument parser.
    let r = status(&kubeconfig, &["test", "-A"]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("cannot be used with"), "{}", r.both());

    // Issue 40: a selection of no control plane is an error (a gate with a typo in its namespace
    // must not pass), for status and preflight alike.
    for command in ["status", "preflight"] {
        let kc = kubeconfig.display().to_string();
        let home = kubeconfig.parent().expect("the kubeconfig's directory");
        let args = [command, "--kubeconfig", kc.as_str(), "-n", "nosuchns"];
        let r = run(Path::new(BIN), &args, &[], home).await;
        assert_eq!(r.code, 2, "{command}: {}", r.both());
        assert!(r.stdout.is_empty(), "{command}: {}", r.both());
        assert!(
            r.stderr.contains(
                "no KubeadmControlPlane matched: there is none in namespace nosuchns. Choose the \
                 namespace with -n NAMESPACE, or every namespace with -A"
            ),
            "{command}: {}",
            r.both()
        );
    }

    // One way to name a control plane: --kcp, as check and preflight take it; the Cluster
    // argument still works, and both at once is refused.
    let r = status(&kubeconfig, &["--kcp", "nope", "-n", NS]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains(
            "no KubeadmControlPlane \"nope\" in namespace capi-test; there are: capi-test/test-controlplane"
        ),
        "{}",
        r.both()
    );
    let r = status(&kubeconfig, &["--kcp", "capi-test/test-controlplane"]).await;
    // Selected; its etcd cannot be probed here (no Secret): exit 1 with the report.
    assert_eq!(r.code, 1, "{}", r.both());
    assert!(
        r.stdout
            .starts_with("KubeadmControlPlane capi-test/test-controlplane (Cluster test)"),
        "{}",
        r.both()
    );
    let r = status(
        &kubeconfig,
        &["test", "--kcp", "test-controlplane", "-n", NS],
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("not both"), "{}", r.both());
    let r = status(&kubeconfig, &["--kcp", "other/test-controlplane", "-n", NS]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr
            .contains("--kcp other/test-controlplane names namespace other, -n says capi-test"),
        "{}",
        r.both()
    );

    // No API server behind the kubeconfig.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let gone = dir.join("kubeconfig-gone");
    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    let url = api.url();
    std::fs::write(
        &gone,
        text.replace(&url, &format!("http://127.0.0.1:{closed}")),
    )
    .expect("write");
    let r = status(&gone, &["test", "-n", NS]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains(&format!(
            "cannot use the API server at http://127.0.0.1:{closed}"
        )),
        "{}",
        r.both()
    );

    // A kubeconfig that is not there.
    let r = status(&dir.join("missing"), &["test"]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stderr.contains("reading kubeconfig"), "{}", r.both());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_all_namespaces_lists_every_control_plane_and_explains_a_missing_secret() {
    let (etcd, api, kubeconfig, members) = live("all-namespaces").await;
    // A second cluster whose etcd CA Secret is missing: shown as not probed, with why.
    seed::cluster(
        &api,
        OTHER_NS,
        "other",
        seed::direct_to(&etcd),
        &members,
        None,
        |_| {},
    );

    let r = status(&kubeconfig, &["-A"]).await;
    assert_eq!(
        r.code,
        1,
        "one control plane could not be probed: {}",
        r.both()
    );
    println!("{}", r.stdout);
    let out = &r.stdout;
    let header = out.lines().next().expect("a summary");
    for col in [
        "NAMESPACE",
        "CLUSTER",
        "KUBEADMCONTROLPLANE",
        "MEMBERS",
        "HEALTHY",
        "QUORUM",
        "TOLERANCE",
        "NEXT ACTION",
    ] {
        assert!(header.contains(col), "{header}");
    }
    let summary_row = |ns: &str| -> Vec<&str> {
        out.lines()
            .find(|l| l.starts_with(ns))
            .unwrap_or_else(|| panic!("no summary row for {ns}:\n{out}"))
            .split_whitespace()
            .collect()
    };
    assert_eq!(
        summary_row(NS),
        [
            "capi-test",
            "test",
            "test-controlplane",
            "observed",
            "3",
            "3",
            "2",
            "1",
            "None"
        ],
        "{out}"
    );
    let other = summary_row(OTHER_NS);
    assert_eq!(
        &other[..8],
        [
            "capi-other",
            "other",
            "other-controlplane",
            "FAILED",
            "?",
            "?",
            "?",
            "?"
        ],
        "{out}"
    );
    assert_ne!(other[8], "None", "{out}");
    for needle in [
        "KubeadmControlPlane capi-other/other-controlplane (Cluster other)",
        "etcd probe: FAILED (transport direct): Secret capi-other/other-etcd not found: the etcd prober needs the cluster's etcd CA",
        "Machines (etcd member unknown):",
        "Quorum: unknown",
        "KubeadmControlPlane capi-test/test-controlplane (Cluster test)",
        "Quorum: members 3, voting 3, healthy 3, quorum 2, fault tolerance 1",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }

    let r = status(&kubeconfig, &["-A", "-o", "json"]).await;
    assert_eq!(r.code, 1, "{}", r.both());
    let v = r.json();
    let cps = v["controlPlanes"].as_array().expect("controlPlanes");
    let kcps: Vec<&str> = cps
        .iter()
        .filter_map(|c| c["controlPlane"]["kcp"].as_str())
        .collect();
    assert_eq!(
        kcps,
        [
            "capi-other/other-controlplane",
            "capi-test/test-controlplane"
        ]
    );
    assert_eq!(cps[0]["probe"]["result"], "Failed");
    assert!(
        cps[0]["probe"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("Secret capi-other/other-etcd not found")),
        "{:#}",
        cps[0]["probe"]
    );
    assert_eq!(cps[0]["quorum"], Value::Null);
    assert_eq!(cps[0]["members"], json!([]));
    assert_eq!(cps[0]["machines"].as_array().expect("machines").len(), 3);
    assert_eq!(cps[0]["conditions"][0]["reason"], "ProbeFailed");
    assert_eq!(cps[1]["probe"]["result"], "Observed");
    assert_eq!(cps[1]["quorum"]["healthy"], 3);

    // One namespace: only its control plane, without the summary.
    let r = status(&kubeconfig, &["-n", NS]).await;
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout
            .starts_with("KubeadmControlPlane capi-test/test-controlplane"),
        "{}",
        r.both()
    );
    assert!(!r.stdout.contains("capi-other"), "{}", r.both());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e_kubectl_runs_it_as_a_plugin() {
    let kubectl = Path::new("/usr/bin/kubectl");
    if !kubectl.exists() {
        println!("note: skipping the kubectl plugin test: /usr/bin/kubectl is not installed");
        return;
    }
    let (_etcd, _api, kubeconfig, members) = live("kubectl-plugin").await;
    let dir = kubeconfig.parent().expect("scratch").join("bin");
    std::fs::create_dir_all(&dir).expect("bin dir");
    std::os::unix::fs::symlink(BIN, dir.join("kubectl-quorumguard")).expect("symlink");
    let path = std::env::join_paths(std::iter::once(dir.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    let home = kubeconfig.parent().expect("scratch");
    let env = [
        ("PATH", path),
        // As kubectl users do: the plugin reads the same KUBECONFIG kubectl does.
        ("KUBECONFIG", kubeconfig.clone().into_os_string()),
    ];

    let r = run(
        kubectl,
        &["quorumguard", "status", "test", "-n", NS],
        &env,
        home,
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.both());
    for m in &members {
        assert!(row(&r.stdout, m).contains(" healthy "), "{}", r.both());
    }
    assert!(r.stdout.contains("Next action: None"), "{}", r.both());

    // preflight, the same way.
    let r = run(kubectl, &["quorumguard", "preflight", "-n", NS], &env, home).await;
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout.starts_with("capi-test/test-controlplane  READY: "),
        "{}",
        r.both()
    );
    let r = run(kubectl, &["quorumguard", "preflight", "--help"], &env, home).await;
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout
            .contains("Usage: kubectl quorumguard preflight [OPTIONS]"),
        "{}",
        r.both()
    );

    let r = run(kubectl, &["quorumguard", "status", "--help"], &env, home).await;
    assert_eq!(r.code, 0, "{}", r.both());
    assert!(
        r.stdout
            .contains("Usage: kubectl quorumguard status [OPTIONS] [CLUSTER]"),
        "{}",
        r.both()
    );

    // kubectl hands the plugin's exit status through.
    let r = run(
        kubectl,
        &["quorumguard", "status", "nope", "-n", NS],
        &env,
        home,
    )
    .await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("Clusters in namespace capi-test: test"),
        "{}",
        r.both()
    );
    let r = run(kubectl, &["quorumguard", "status", "--bogus"], &env, home).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("Usage: kubectl quorumguard status"),
        "{}",
        r.both()
    );
}

/// `quorumguard preflight ARGS --kubeconfig KUBECONFIG`.
async fn preflight(kubeconfig: &Path, args: &[&str]) -> Run {
    let kc = kubeconfig.display().to_string();
    let mut all = vec!["preflight", "--kubeconfig", kc.as_str()];
    all.extend_from_slice(args);
    let home = kubeconfig.parent().expect("the kubeconfig's directory");
    run(Path::new(BIN), &all, &[], home).await
}

/// `preflight` online reads what `status` reads and probes the same way (it shares that code),
/// so one test covers what is its own: the prediction from a live probe, the step table of one
/// control plane, JSON, and the exit status for a healthy, a frozen and an unprobeable cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f_preflight_predicts_ready_then_would_stick_on_a_frozen_member() {
    let (mut etcd, api, kubeconfig, members) = live("preflight").await;

    // The kubeconfig context's namespace by default, as status and kubectl: the stand-in's is
    // "default", which has none (issue 40: preflight looked in every namespace, status in the
    // context's).
    let r = preflight(&kubeconfig, &[]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr
            .contains("no KubeadmControlPlane matched: there is none in namespace default"),
        "{}",
        r.both()
    );
    // Every namespace with -A: one healthy control plane, READY.
    let r = preflight(&kubeconfig, &["-A"]).await;
    assert_eq!(r.code, 0, "{}", r.both());
    println!("{}", r.stdout);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.both());
    assert!(
        lines[0].starts_with("capi-test/test-controlplane  READY: 15 steps"),
        "{}",
        r.both()
    );
    assert!(
        lines[1].starts_with("  next: Nothing holds the rollout"),
        "{}",
        r.both()
    );
    // Piped: no progress line.
    assert!(!r.stderr.contains("probing"), "{}", r.both());

    let r = preflight(
        &kubeconfig,
        &["--steps", "--kcp", "test-controlplane", "-A"],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.both());
    println!("{}", r.stdout);
    assert!(
        r.stdout.contains("0   (before the rollout)"),
        "{}",
        r.both()
    );
    assert!(
        r.stdout.contains("4   KCP deletes Machine test-"),
        "{}",
        r.both()
    );

    let r = preflight(&kubeconfig, &["-n", NS, "-o", "json"]).await;
    assert_eq!(r.code, 0, "{}", r.both());
    let v = r.json();
    assert_eq!(v["schema"], "quorumguard.io/preflight/v1");
    let c = &v["controlPlanes"][0];
    assert_eq!(c["kcp"], "capi-test/test-controlplane");
    assert_eq!(c["readiness"], "Ready");
    assert_eq!(c["steps"].as_array().expect("steps").len(), 15);
    assert_eq!(c["probe"]["result"], "Observed");
    assert_eq!(c["probe"]["transport"], "direct");

    // A frozen follower (freezing the leader would add an election): KCP's preflight would hold
    // the rollout at its first step.
    let s = status(&kubeconfig, &["test", "-n", NS, "-o", "json"]).await;
    assert_eq!(s.code, 0, "{}", s.both());
    let frozen = s.json()["controlPlanes"][0]["members"]
        .as_array()
        .expect("members")
        .iter()
        .find(|m| m["leader"] == false)
        .and_then(|m| m["name"].as_str())
        .expect("a follower")
        .to_string();
    etcd.freeze(etcd.index_of(&frozen));
    let r = preflight(&kubeconfig, &["--probe-timeout", "1s", "-A"]).await;
    assert_eq!(r.code, 1, "{}", r.both());
    println!("{}", r.stdout);
    assert!(
        r.stdout.starts_with(&format!(
            "capi-test/test-controlplane  WOULD STICK at step 1/15: etcd member {frozen} ("
        )),
        "{}",
        r.both()
    );
    assert!(
        r.stdout.contains("remediate-machine") && r.stdout.contains(&format!("test-{frozen}")),
        "{}",
        r.both()
    );
    etcd.thaw(etcd.index_of(&frozen));

    // A second control plane whose etcd CA Secret is missing: it cannot be judged (exit 2), and
    // --steps then needs --kcp.
    seed::cluster(
        &api,
        OTHER_NS,
        "other",
        seed::direct_to(&etcd),
        &members,
        None,
        |_| {},
    );
    let r = preflight(&kubeconfig, &["-A"]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    println!("{}", r.stdout);
    assert!(
        r.stdout.contains("capi-other/other-controlplane  CANNOT JUDGE: etcd's member list is unknown (Secret capi-other/other-etcd not found"),
        "{}",
        r.both()
    );
    let r = preflight(&kubeconfig, &["--steps", "-A"]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(r.stdout.is_empty(), "{}", r.both());
    assert!(
        r.stderr.contains("--steps shows the steps of one KubeadmControlPlane, and 2 are selected (capi-other/other-controlplane, capi-test/test-controlplane)"),
        "{}",
        r.both()
    );
    let r = preflight(&kubeconfig, &["--kcp", "nope", "-A"]).await;
    assert_eq!(r.code, 2, "{}", r.both());
    assert!(
        r.stderr.contains("no KubeadmControlPlane \"nope\" in any namespace; there are: capi-other/other-controlplane, capi-test/test-controlplane"),
        "{}",
        r.both()
    );
}
