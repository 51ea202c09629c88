//! The workspace's crates are the architecture, and their dependencies run one way
//! (docs/architecture.md draws it):
//!
//! ```text
//! engine ← pki, telemetry ← observe ← admission, status, autopilot ← cli ← playground ← quorumguard
//! ```
//!
//! The engine needs no runtime, no Kubernetes and no network (anyone can embed the rules, and its
//! tests build in seconds); pki and telemetry know no other quorumguard crate; what the guard
//! knows of the world (observe) never reaches up to the webhook (admission) or the status writer
//! (status), which never reach each other; the autopilot's acting (autopilot) stands on observe
//! beside them, and `serve` (cli) wires the three together; the production command line (cli) never depends on
//! the playground, and nothing but the binary (its default `playground` feature) does.
//!
//! Each check compares the whole set of quorumguard crates in a crate's normal dependency tree
//! with the set the layering allows, so it fails on an edge that should not be there and on one
//! that is missing (a crate that lost its place in the layering).

use std::collections::BTreeSet;
use std::process::Command;

/// Every crate of the workspace but the binary, bottom up.
const CRATES: [&str; 9] = [
    "quorumguard-engine",
    "quorumguard-pki",
    "quorumguard-telemetry",
    "quorumguard-observe",
    "quorumguard-admission",
    "quorumguard-status",
    "quorumguard-cli",
    "quorumguard-playground",
    "quorumguard-autopilot",
];

/// The crates `package`'s normal (non-dev) dependency tree holds, one name per line, with
/// `extra` arguments to `cargo tree` (features).
fn tree_with(package: &str, extra: &[&str]) -> Vec<String> {
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
        .args(extra)
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

fn tree(package: &str) -> Vec<String> {
    tree_with(package, &[])
}

/// The quorumguard crates (other than `package` itself) in a dependency tree.
fn ours(package: &str, crates: &[String]) -> BTreeSet<String> {
    crates
        .iter()
        .filter(|c| c.starts_with("quorumguard") && c.as_str() != package)
        .cloned()
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| format!("quorumguard-{n}")).collect()
}

/// Which quorumguard crates `package` may (and does) depend on, transitively: the layering.
fn allowed(package: &str) -> BTreeSet<String> {
    let below_admission = ["engine", "pki", "telemetry", "observe"];
    let below_cli = [
        "engine",
        "pki",
        "telemetry",
        "observe",
        "admission",
        "status",
        "autopilot",
    ];
    let below_playground = [
        "engine",
        "pki",
        "telemetry",
        "observe",
        "admission",
        "status",
        "autopilot",
        "cli",
    ];
    match package {
        "quorumguard-engine" | "quorumguard-pki" | "quorumguard-telemetry" => set(&[]),
        "quorumguard-observe" => set(&["engine", "pki", "telemetry"]),
        "quorumguard-admission" | "quorumguard-status" | "quorumguard-autopilot" => {
            set(&below_admission)
        }
        "quorumguard-cli" => set(&below_cli),
        "quorumguard-playground" => set(&below_playground),
        other => panic!("{other} is not a crate of the layering"),
    }
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
    ] {
        assert!(
            !crates.iter().any(|c| c == forbidden),
            "quorumguard-engine depends on {forbidden}: {crates:?}"
        );
    }
    // And this check can tell: the crates above the engine do have them.
    let observe = tree("quorumguard-observe");
    for present in ["tokio", "kube", "etcd-client", "rustls", "serde_json"] {
        assert!(observe.iter().any(|c| c == present), "{observe:?}");
    }
}

#[test]
fn every_crate_depends_on_exactly_the_crates_below_it() {
    for package in CRATES {
        let crates = tree(package);
        assert!(
            crates.iter().any(|c| c == package),
            "cargo tree -p {package} does not list it: {crates:?}"
        );
        let found = ours(package, &crates);
        let expected = allowed(package);
        let extra: Vec<&String> = found.difference(&expected).collect();
        let missing: Vec<&String> = expected.difference(&found).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "{package} depends on {found:?}; the layering allows exactly {expected:?} \
             (against the layering: {extra:?}; lost: {missing:?})"
        );
    }
}

#[test]
fn nothing_but_the_binary_depends_on_the_playground() {
    for package in CRATES {
        if package == "quorumguard-playground" {
            continue;
        }
        assert!(
            !tree(package).iter().any(|c| c == "quorumguard-playground"),
            "{package} depends on the playground"
        );
    }
    // The binary only through its default `playground` feature (the production image turns it
    // off), and with it on, the playground is there: the check can tell.
    assert!(
        !tree_with("quorumguard", &["--no-default-features"])
            .iter()
            .any(|c| c == "quorumguard-playground"),
        "quorumguard --no-default-features depends on the playground"
    );
    assert!(
        tree("quorumguard")
            .iter()
            .any(|c| c == "quorumguard-playground")
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
