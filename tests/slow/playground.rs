//! The playground end to end: each scenario on a real etcd cluster (TLS, 127.0.0.1), the
//! API-server stand-in calling the real HTTPS webhook from the ValidatingWebhookConfiguration in
//! `manifests/`, and `quorumguard serve` probing and publishing. The scenario checks its own
//! expectations; these tests require every one to hold and then look again for themselves: the
//! webhook's recorded verdicts, the conditions in the KCP, and etcd's member list.
//!
//! Then `quorumguard playground --keep` as a person uses it: the binary, kubectl against its
//! kubeconfig (a delete denied, describe showing the conditions), and Ctrl-C stopping every
//! process it started.

mod autopilot;
mod prediction;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quorumguard::playground::scenarios;
use quorumguard::playground::timeline::{Sink, Timeline};
use quorumguard::playground::world::{KCP, NEW_VERSION, World, WorldOptions, kcp_controller};
use testkit::https::TempDir;

/// Runs scenario `name` in a fresh world, seeded as the scenario starts; returns it (still
/// running) and the timeline.
async fn play(name: &str, dir: &Path) -> (Arc<World>, Timeline) {
    let scenario = scenarios::find(name).expect("a scenario of that name");
    let world = Arc::new(
        World::start(
            scenario.options(WorldOptions::new(dir.to_path_buf())),
            |_| {},
        )
        .await
        .expect("the playground starts"),
    );
    let tl = Timeline::new(Sink::Memory);
    let started = Instant::now();
    scenarios::run(Arc::clone(&world), &tl, name)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}\n{}", tl.text()));
    println!("{}", tl.text());
    println!("{name} took {:.1}s", started.elapsed().as_secs_f64());
    let failed: Vec<_> = tl.checks().into_iter().filter(|c| !c.ok).collect();
    assert!(
        failed.is_empty() && tl.all_held(),
        "{name}: expectations failed: {failed:#?}"
    );
    (world, tl)
}

/// The members etcd lists now, sorted, and whether any is a learner.
async fn members(world: &World) -> (Vec<String>, bool) {
    world
        .etcd(|e| {
            let listed = e.member_list().expect("member list");
            let learner = listed.iter().any(|m| m.learner);
            let mut names: Vec<String> = listed.into_iter().map(|m| m.name).collect();
            names.sort();
            (names, learner)
        })
        .await
        .expect("etcd")
}

fn machine_names(world: &World) -> Vec<String> {
    let mut names: Vec<String> = world.machines().into_iter().map(|m| m.name).collect();
    names.sort();
    names
}

#[test]
fn upgrade_stuck_is_resolved_by_following_the_next_action() {
    let _slot = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new("pg-upgrade");
        let (world, tl) = play("upgrade-stuck", dir.path()).await;
        let calls = world.webhooks.calls();
        // The verdicts, as the webhook gave them.
        let kcp_update = calls
            .iter()
            .find(|c| c.resource == "kubeadmcontrolplanes")
            .expect("the version change reached the KCP webhook");
        assert!(kcp_update.allowed, "{kcp_update:?}");
        let human_denied = calls
            .iter()
            .filter(|c| c.user != kcp_controller() && c.resource == "machines")
            .collect::<Vec<_>>();
        assert_eq!(human_denied.len(), 1, "one manual delete: {human_denied:?}");
        assert!(!human_denied[0].allowed, "{:?}", human_denied[0]);
        let controller: Vec<_> = calls
            .iter()
            .filter(|c| c.user == kcp_controller())
            .collect();
        assert_eq!(
            controller.len(),
            3,
            "the controller deleted the three old Machines, each once: {controller:?}"
        );
        assert!(controller.iter().all(|c| c.allowed), "{controller:?}");
        // The stuck state was published with the way out.
        let text = tl.text();
        assert!(
            text.contains("NextAction DeleteMachine"),
            "the timeline shows the DeleteMachine action:\n{text}"
        );
        // The end state: three new Machines, etcd members exactly their nodes.
        let c = world.conditions();
        assert_eq!((c.quorum_reason(), c.action()), ("Healthy", "None"));
        let machines = world.machines();
        assert_eq!(machines.len(), 3);
        assert!(machines.iter().all(|m| m.version == NEW_VERSION));
        let (names, learner) = members(&world).await;
        assert_eq!(names, machine_names(&world));
        assert!(!learner);
        world.shutdown().await;
    });
}

#[test]
fn unsafe_manual_delete_is_denied_and_remediation_converges() {
    let _slot = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new("pg-unsafe");
        let (world, tl) = play("unsafe-manual-delete", dir.path()).await;
        // Each Machine KCP creates is told once (the controller printed it, and so did the
        // loop that prints every action).
        let text = tl.text();
        let creates: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("KCP scales up: created Machine"))
            .collect();
        assert_eq!(creates.len(), 1, "{text}");
        let calls = world.webhooks.calls();
        let human: Vec<_> = calls
            .iter()
            .filter(|c| c.user != kcp_controller())
            .collect();
        assert_eq!(human.len(), 1, "{human:?}");
        assert!(!human[0].allowed);
        assert_eq!(human[0].reason.as_deref(), Some("WouldLoseQuorum"));
        let remediation: Vec<_> = calls
            .iter()
            .filter(|c| c.user == kcp_controller())
            .collect();
        assert_eq!(remediation.len(), 1, "{remediation:?}");
        assert!(remediation[0].allowed, "{:?}", remediation[0]);
        // The frozen Machine was the one replaced; the one a person tried to delete stayed.
        assert_ne!(remediation[0].name, human[0].name);
        let names = machine_names(&world);
        assert!(!names.contains(&remediation[0].name));
        assert!(names.contains(&human[0].name));
        let c = world.conditions();
        assert_eq!((c.quorum_reason(), c.action()), ("Healthy", "None"));
        let (members, learner) = members(&world).await;
        assert_eq!(members, names);
        assert_eq!(members.len(), 3);
        assert!(!learner);
        world.shutdown().await;
    });
}

/// No MachineHealthCheck: the next action asks for one (`EnableRemediation`), the annotation
/// alone makes KCP delete nothing, and once the MachineHealthCheck exists KCP remediates the
/// frozen Machine, its deletion allowed.
#[test]
fn without_a_machine_health_check_the_annotation_does_nothing_until_one_exists() {
    let _slot = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new("pg-no-mhc");
        let (world, tl) = play("remediate-without-mhc", dir.path()).await;
        let text = tl.text();
        assert!(
            text.contains("NextAction EnableRemediation"),
            "the timeline shows the EnableRemediation action:\n{text}"
        );
        let calls = world.webhooks.calls();
        let deletions: Vec<_> = calls.iter().filter(|c| c.resource == "machines").collect();
        // One deletion only, KCP's, after the MachineHealthCheck was created; allowed.
        assert_eq!(deletions.len(), 1, "{deletions:?}");
        assert_eq!(deletions[0].user, kcp_controller());
        assert!(deletions[0].allowed, "{:?}", deletions[0]);
        assert_eq!(world.health_checks().len(), 1);
        let names = machine_names(&world);
        assert!(!names.contains(&deletions[0].name));
        let c = world.conditions();
        assert_eq!((c.quorum_reason(), c.action()), ("Healthy", "None"));
        let (members, learner) = members(&world).await;
        assert_eq!(members, names);
        assert_eq!(members.len(), 3);
        assert!(!learner);
        world.shutdown().await;
    });
}

#[test]
fn scaling_with_a_member_down_waits_for_it() {
    let _slot = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new("pg-scale");
        let (world, _tl) = play("scale-with-member-down", dir.path()).await;
        let scale: Vec<_> = world
            .webhooks
            .calls()
            .into_iter()
            .filter(|c| c.resource == "kubeadmcontrolplanes")
            .collect();
        // The KCP is v1.31 (learner joins): the scale-up is allowed while the member is down,
        // and KCP adds no Machine until it is back (the story's expectations hold that).
        assert!(!scale.is_empty(), "{scale:?}");
        assert_eq!(scale[0].sub_resource.as_deref(), Some("scale"));
        assert!(
            scale.iter().all(|c| c.allowed),
            "allowed with a member down (joins add learners): {scale:?}"
        );
        assert_eq!(world.kcp_spec().0, 5);
        let (members, learner) = members(&world).await;
        assert_eq!(members.len(), 5);
        assert_eq!(members, machine_names(&world));
        assert!(!learner);
        let c = world.conditions();
        assert_eq!((c.quorum_reason(), c.action()), ("Healthy", "None"));
        world.shutdown().await;
    });
}

/// Cluster API's `TestReconcileUnhealthyMachinesSequences`, "Remediates the second CP machine
/// having problems to come up", with the guard on: KCP's deletion of the second Machine is
/// allowed, and KCP scales up with learner joins until 3 healthy voting members.
#[test]
fn remediating_the_second_machine_converges_with_learner_joins() {
    let _slot = testkit::etcd::slot();
    testkit::etcd::runtime().block_on(async {
        let dir = TempDir::new("pg-remediate");
        let started = Instant::now();
        let story = play("remediate-second", dir.path());
        let (world, tl) = tokio::time::timeout(Duration::from_secs(240), story)
            .await
            .expect("remediate-second ends within 240 s");
        let text = tl.text();
        let (_, version) = world.kcp_spec();
        assert_eq!(
            version, NEW_VERSION,
            "a v1.32 KCP: kubeadm joins with a learner"
        );
        // KCP's deletion of m2, as the webhook judged it: allowed, once.
        let calls = world.webhooks.calls();
        let kcp_deletes: Vec<_> = calls
            .iter()
            .filter(|c| c.resource == "machines" && c.user == kcp_controller())
            .collect();
        assert_eq!(kcp_deletes.len(), 1, "one deletion by KCP: {kcp_deletes:?}");
        let m2 = kcp_deletes[0].name.clone();
        assert!(kcp_deletes[0].allowed, "{:?}", kcp_deletes[0]);
        let reason = kcp_deletes[0].reason.as_deref().unwrap_or_default();
        assert!(
            !reason.is_empty() && reason != "PendingJoin",
            "the allow says why: {:?}",
            kcp_deletes[0]
        );
        // The joins: two learners added and promoted.
        assert_eq!(
            text.matches("joins etcd as a learner").count(),
            2,
            "two learner joins:\n{text}"
        );
        assert_eq!(text.matches("is promoted to a voting member").count(), 2);
        // The end: 3 Machines, m2 gone, etcd's members exactly their nodes, all voting.
        let names = machine_names(&world);
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(!names.contains(&m2), "{m2} is gone: {names:?}");
        let (members, learner) = members(&world).await;
        assert_eq!(members, names);
        assert!(!learner, "no learner left");
        let c = world.conditions();
        assert_eq!((c.quorum_reason(), c.action()), ("Healthy", "None"));
        assert!(
            c.quorum
                .as_ref()
                .is_some_and(|q| q.message.contains("3 voting, 3 healthy")),
            "{c:?}"
        );
        println!(
            "remediate-second with its checks: {:.1}s",
            started.elapsed().as_secs_f64()
        );
        world.shutdown().await;
    });
}

/// Runs kubectl against the playground; (exit code, stdout, stderr).
fn kubectl(kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("timeout")
        .arg("30")
        .arg("kubectl")
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Processes whose command line mentions `needle` (pgrep -f).
fn processes_with(needle: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-a", "-f", needle])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.contains("pgrep"))
        .map(str::to_string)
        .collect()
}

/// The playground process, killed if the test fails before it stops it.
struct Playground(std::process::Child);

impl Drop for Playground {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn keep_mode_serves_kubectl_and_stops_everything_on_ctrl_c() {
    if !Path::new("/usr/bin/kubectl").exists() {
        println!("note: skipping the kubectl test: /usr/bin/kubectl is not installed");
        return;
    }
    let _slot = testkit::etcd::slot();
    let dir = TempDir::new("pg-keep");
    let mut child = Playground(
        Command::new(env!("CARGO_BIN_EXE_quorumguard"))
            .args(["playground", "--keep", "--dir"])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the playground"),
    );
    let child = &mut child.0;
    let pid = child.id();
    let stdout = child.stdout.take().expect("stdout");
    // Read its output on a thread so the test's waits stay bounded.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // The last line of what it prints once everything runs.
    while !seen
        .iter()
        .any(|l: &String| l.contains("A simulated KCP controller acts on what you do"))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("the playground did not get ready:\n{}", seen.join("\n")),
        }
    }
    let kubeconfig = dir.path().join("kubeconfig");
    assert!(
        seen.iter()
            .any(|l| l.contains(&format!("export KUBECONFIG={}", kubeconfig.display()))),
        "it tells where the kubeconfig is:\n{}",
        seen.join("\n")
    );
    assert!(
        seen.iter().any(|l| l.contains("kill -STOP")),
        "it tells how to freeze a member"
    );

    // Wait (bounded) for the Healthy publication: on a loaded machine the first one may come
    // before the first probe ("ProbeFailed: no etcd probe of this cluster yet").
    let mut describe = String::new();
    for _ in 0..80 {
        let (code, out, err) = kubectl(&kubeconfig, &["describe", "kcp", KCP]);
        assert_eq!(code, 0, "kubectl describe kcp: {err}");
        describe = out;
        if describe.contains("quorumguard.io/NextAction") && describe.contains("Healthy") {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        describe.contains("quorumguard.io/EtcdQuorum") && describe.contains("Healthy"),
        "describe shows the conditions:\n{describe}"
    );
    let (code, out, err) = kubectl(&kubeconfig, &["get", "kcp,machines"]);
    assert_eq!(code, 0, "kubectl get: {err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("/demo-control-plane"))
            .count(),
        4,
        "the KCP and 3 Machines:\n{out}"
    );
    let machine = out
        .lines()
        .find_map(|l| {
            l.split_whitespace()
                .next()
                .and_then(|n| n.strip_prefix("machine.cluster.x-k8s.io/"))
        })
        .expect("a Machine in kubectl's output")
        .to_string();

    // A person deleting a healthy Machine of a 3-replica KCP: denied, the message as
    // kube-apiserver words a webhook denial.
    let (code, _out, err) = kubectl(&kubeconfig, &["delete", "machine", &machine]);
    assert_eq!(code, 1, "kubectl delete must fail: {err}");
    assert!(
        err.contains("admission webhook \"machines.quorumguard.io\" denied the request"),
        "{err}"
    );
    let (code, out, _) = kubectl(&kubeconfig, &["get", "machine", &machine, "-o", "name"]);
    assert_eq!(
        (code, out.trim()),
        (0, format!("machine.cluster.x-k8s.io/{machine}").as_str())
    );

    // The safe path: annotated, the MachineHealthCheck marks it and the simulated KCP
    // remediates it, its deletion judged by the webhook and printed once (the controller
    // printed its own calls besides the printer of every call, so each showed twice).
    let (code, _out, err) = kubectl(
        &kubeconfig,
        &[
            "annotate",
            "machine",
            &machine,
            "cluster.x-k8s.io/remediate-machine=",
        ],
    );
    assert_eq!(code, 0, "kubectl annotate: {err}");
    let gone = format!("Machine default/{machine} deleted");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !seen.iter().any(|l| l.contains(&gone)) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("KCP did not remediate {machine}:\n{}", seen.join("\n")),
        }
    }
    let kcp_calls = seen
        .iter()
        .filter(|l| l.contains(&format!("admission DELETE machines default/{machine} by")))
        .filter(|l| !l.contains("kubernetes-admin"))
        .count();
    assert_eq!(
        kcp_calls,
        1,
        "KCP's deletion of {machine} printed once:\n{}",
        seen.join("\n")
    );

    // Ctrl-C: it stops, and every etcd process it started is gone.
    let etcd_dir = dir.path().display().to_string();
    assert!(
        !processes_with(&etcd_dir).is_empty(),
        "etcd runs under {etcd_dir} before Ctrl-C"
    );
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let stopped_by = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        assert!(
            Instant::now() < stopped_by,
            "the playground did not stop within 30s of SIGINT"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = reader.join();
    assert_eq!(code, Some(0), "--keep ends with 0 on Ctrl-C");
    assert_eq!(
        processes_with(&etcd_dir),
        Vec::<String>::new(),
        "no process of the playground is left"
    );
}
