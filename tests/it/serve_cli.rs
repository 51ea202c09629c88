//! `quorumguard serve` as a process: flags, JSON logs with one line per review, and SIGTERM.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::apiserver::ApiServer;
use testkit::https::{STEP, TempDir, TestPki, post, try_get_plain};

/// Kills the child if the test fails before it exits, so no server outlives its test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

#[test]
fn help_documents_every_flag_with_its_env_twin() {
    let out = Command::new(env!("CARGO_BIN_EXE_quorumguard"))
        .args(["serve", "--help"])
        .output()
        .expect("run");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--admin-listen",
        "--tls-cert-file",
        "--tls-key-file",
        "--log-format",
        "--controller",
        "--teardown",
        "--unknown-health-humans",
        "--unknown-health-controllers",
        "--max-health-age",
        "--shutdown-grace",
        "--etcd-transport",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
    assert!(help.contains("QUORUMGUARD_LISTEN"), "env twins are shown");
    // Issue 40: the help says every flag but --help and --version has an environment twin; each
    // flag's block of the long help shows it (the Lease timings had none).
    assert!(
        help.contains("Every flag but --help and --version has an environment twin"),
        "{help}"
    );
    let options = help
        .split_once("Options:")
        .map(|(_, rest)| rest)
        .expect("an Options section");
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in options.lines() {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        // The after-help text, unindented, ends the options.
        if indent == 0 && !t.is_empty() {
            break;
        }
        if t.starts_with('-') && indent <= 6 {
            let flag = t.split([' ', ',', '=']).next().unwrap_or(t).to_string();
            blocks.push((flag, String::new()));
        } else if let Some((_, text)) = blocks.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    assert!(blocks.len() > 30, "{blocks:?}");
    let without: Vec<&str> = blocks
        .iter()
        .filter(|(flag, text)| !text.contains("[env: ") && flag != "-h" && flag != "-V")
        .map(|(flag, _)| flag.as_str())
        .collect();
    assert!(
        without.is_empty(),
        "flags without an environment twin: {without:?}"
    );
    // etcd is reached as KCP reaches it unless told otherwise.
    assert!(
        help.contains("[default: port-forward]"),
        "port-forward is the default transport: {help}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_logs_json_and_exits_on_sigterm() {
    let api = ApiServer::start().await.expect("stand-in");
    let dir = TempDir::new("serve-cli");
    let pki = TestPki::new(dir.path());
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let (listen, admin) = (free_addr(), free_addr());
    let mut child = Command::new(env!("CARGO_BIN_EXE_quorumguard"))
        .arg("serve")
        .arg(format!("--listen={listen}"))
        .arg(format!("--admin-listen={admin}"))
        .arg(format!("--tls-cert-file={}", pki.cert_file.display()))
        .arg(format!("--tls-key-file={}", pki.key_file.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args([
            "--log-format=json",
            "--shutdown-delay=100ms",
            "--shutdown-grace=2s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut child = KillOnDrop(child);
    let lines = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });

    let deadline = Instant::now() + STEP;
    loop {
        if let Ok((code, _)) = try_get_plain(admin, "/readyz").await
            && code.as_u16() == 200
        {
            break;
        }
        assert!(Instant::now() < deadline, "serve never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let review: Value = serde_json::from_str(
        &std::fs::read_to_string(format!(
            "{}/tests/fixtures/admission-reviews/machine-delete-by-user.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .expect("fixture"),
    )
    .expect("json");
    let (code, body) = post(
        listen,
        pki.client(&[b"h2"]),
        "/validate/machines",
        "application/json",
        serde_json::to_vec(&review).expect("json"),
    )
    .await;
    assert_eq!(code.as_u16(), 200);
    let v: Value = serde_json::from_slice(&body).expect("review");
    // No KCP in the stand-in: not guarded, allowed with a warning.
    assert_eq!(v["response"]["allowed"], json!(true), "{v}");

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + STEP;
    let exit = loop {
        if let Some(s) = child.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "exit status {exit}");
    let lines = lines.join().expect("stderr reader");
    let review_line = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["message"] == "admission review")
        .unwrap_or_else(|| panic!("no JSON review log line in {lines:#?}"));
    let f = &review_line;
    assert_eq!(f["uid"], review["request"]["uid"]);
    assert_eq!(f["operation"], "DELETE");
    assert_eq!(f["name"], "test-cp-a");
    assert_eq!(f["user"], "jane@example.com");
    assert_eq!(f["allowed"], true);
    assert!(f["duration_ms"].is_number(), "{review_line}");
    assert!(
        lines.iter().any(|l| l.contains("SIGTERM received")),
        "{lines:#?}"
    );
}

/// Issue 40: a missing client CA file is named as what it is, and its cause said once (it was
/// "loading the serving certificate: cannot read X: No such file ...: cannot read X: ...").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_client_ca_is_named_once() {
    let api = ApiServer::start().await.expect("stand-in");
    let dir = TempDir::new("serve-cli-client-ca");
    let pki = TestPki::new(dir.path());
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let missing = dir.path().join("no-such-ca.crt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_quorumguard"))
        .arg("serve")
        .arg(format!("--listen={}", free_addr()))
        .arg(format!("--admin-listen={}", free_addr()))
        .arg(format!("--tls-cert-file={}", pki.cert_file.display()))
        .arg(format!("--tls-key-file={}", pki.key_file.display()))
        .arg(format!("--client-ca-file={}", missing.display()))
        .arg("--client-name=kube-apiserver")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["--no-probe", "--no-status", "--no-events"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let deadline = Instant::now() + STEP;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve did not exit on a missing client CA within {STEP:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(2), "{stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("quorumguard: error:"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        error.starts_with(&format!(
            "quorumguard: error: loading the client CA: cannot read {}: ",
            missing.display()
        )),
        "{error}"
    );
    assert!(!error.contains("serving certificate"), "{error}");
    assert_eq!(error.matches("cannot read").count(), 1, "{error}");
    assert_eq!(error.matches("No such file").count(), 1, "{error}");
}
