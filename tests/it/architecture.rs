//! The workspace's crates are the architecture, and their dependencies run one way: the engine
//! needs no runtime, no Kubernetes and no network (anyone can embed the rules, and its tests
//! build in seconds); the guard never depends on the playground.

use std::process::Command;

/// The crates `package`'s normal (non-dev) dependency tree holds, one name per line.
fn tree(package: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--locked",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
        ])
        .arg(package)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "cargo tree -p {package} fails: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_engine_is_pure() {
    let crates = tree("quorumguard-engine");
    assert!(
        crates.iter().any(|c| c == "quorumguard-engine"),
        "{crates:?}"
    );
    for forbidden in [
        "tokio",
        "kube",
        "k8s-openapi",
        "axum",
        "hyper",
        "etcd-client",
        "tonic",
        "rustls",
        "serde_json",
        "quorumguard-guard",
        "quorumguard-playground",
    ] {
        assert!(
            !crates.iter().any(|c| c == forbidden),
            "quorumguard-engine depends on {forbidden}: {crates:?}"
        );
    }
}

#[test]
fn the_guard_never_depends_on_the_playground() {
    let crates = tree("quorumguard-guard");
    assert!(
        crates.iter().any(|c| c == "quorumguard-engine"),
        "{crates:?}"
    );
    assert!(
        !crates.iter().any(|c| c == "quorumguard-playground"),
        "quorumguard-guard depends on the playground"
    );
    // And this check can tell: the playground does depend on the guard.
    assert!(
        tree("quorumguard-playground")
            .iter()
            .any(|c| c == "quorumguard-guard")
    );
}

/// The testkit (`crates/testkit/`) is for tests and benches only: the binary's tree, which holds
/// every product crate, never holds it.
#[test]
fn no_product_crate_depends_on_the_testkit() {
    let product = tree("quorumguard");
    assert!(
        product.iter().any(|c| c == "quorumguard-engine"),
        "{product:?}"
    );
    assert!(
        !product.iter().any(|c| c == "quorumguard-testkit"),
        "a product crate depends on the testkit: {product:?}"
    );
    // And this check can tell: the testkit's own tree holds it.
    assert!(
        tree("quorumguard-testkit")
            .iter()
            .any(|c| c == "quorumguard-testkit")
    );
}
