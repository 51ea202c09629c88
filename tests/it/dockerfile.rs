//! The Dockerfile builds, as far as a machine without a Docker engine can tell: its build stage's
//! COPY set is a workspace cargo accepts and checks (`--locked`, the production feature set), its
//! apt packages cover what `scripts/deps.sh` installs for building, and the image it ships is
//! the binary without the playground, run as non-root.
//!
//! Needs `cargo` on PATH (it is, wherever these tests are built) and the registry cache the
//! test build itself filled (`--offline`: no network).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Dockerfile's instructions, one per logical line (continuations joined, comments dropped).
fn instructions() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).expect("Dockerfile readable");
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// The instructions of each stage, in order (split at every `FROM`).
fn stages() -> Vec<Vec<String>> {
    let mut stages: Vec<Vec<String>> = Vec::new();
    for i in instructions() {
        if i.to_ascii_uppercase().starts_with("FROM ") {
            stages.push(Vec::new());
        }
        if let Some(stage) = stages.last_mut() {
            stage.push(i);
        }
    }
    assert!(
        stages.len() >= 2,
        "the Dockerfile has a build stage and a runtime stage: {stages:?}"
    );
    stages
}

fn build_stage() -> Vec<String> {
    stages().remove(0)
}

/// `(instruction keyword, the rest)`.
fn split(i: &str) -> (String, &str) {
    let (kw, rest) = i.split_once(' ').unwrap_or((i, ""));
    (kw.to_ascii_uppercase(), rest.trim())
}

/// The packages every `apt-get install` of the build stage names.
fn apt_packages(stage: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for i in stage {
        let (kw, rest) = split(i);
        if kw != "RUN" {
            continue;
        }
        for command in rest.split("&&") {
            let words: Vec<&str> = command.split_whitespace().collect();
            if let Some(at) = words.windows(2).position(|w| w == ["apt-get", "install"]) {
                out.extend(
                    words[at + 2..]
                        .iter()
                        .filter(|w| !w.starts_with('-'))
                        .map(|w| w.to_string()),
                );
            }
        }
    }
    out
}

/// The packages `scripts/deps.sh` declares the build needs (`QG_BUILD_PACKAGES=(...)`).
fn build_packages_of_deps_sh() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("scripts/deps.sh")).expect("deps.sh");
    let line = text
        .lines()
        .find(|l| l.starts_with("QG_BUILD_PACKAGES=("))
        .expect("scripts/deps.sh declares QG_BUILD_PACKAGES=(...)");
    let inner = line
        .trim_start_matches("QG_BUILD_PACKAGES=(")
        .trim_end_matches(')');
    let packages: Vec<String> = inner.split_whitespace().map(str::to_string).collect();
    assert!(!packages.is_empty(), "QG_BUILD_PACKAGES is empty");
    // The list is what deps.sh really installs: each package is one its installer adds.
    for p in &packages {
        assert!(
            text.contains(&format!("missing+=({p})")),
            "scripts/deps.sh lists {p} in QG_BUILD_PACKAGES but never installs it"
        );
    }
    packages
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("dir entry");
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

/// Recreates the build stage's context: every `COPY <src>... <dest>` (relative to `WORKDIR`)
/// of the repository into `dir`. Panics on a COPY this test cannot follow.
fn recreate_copy_set(dir: &Path) {
    for (sources, dest) in copies(&build_stage()) {
        for src in &sources {
            let from = root().join(src);
            assert!(
                from.exists(),
                "the Dockerfile copies {src}, which does not exist"
            );
            let to = if dest.ends_with('/') && !from.is_dir() {
                dir.join(&dest).join(src)
            } else {
                dir.join(&dest)
            };
            copy_tree(&from, &to);
        }
    }
}

/// Every `COPY <src>... <dest>` of `stage`: its sources and its destination. Panics on a COPY
/// this test cannot follow (flags, no destination).
fn copies(stage: &[String]) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    for i in stage {
        let (kw, rest) = split(i);
        if kw != "COPY" {
            continue;
        }
        assert!(
            !rest.starts_with("--"),
            "COPY flags are not followed by this test: {i}"
        );
        let words: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
        let (dest, sources) = words.split_last().expect("COPY has a destination");
        out.push((sources.to_vec(), dest.clone()));
    }
    out
}

/// The `cargo build` of the build stage, as words.
fn cargo_build(stage: &[String]) -> Vec<String> {
    for i in stage {
        let (kw, rest) = split(i);
        if kw != "RUN" {
            continue;
        }
        for command in rest.split("&&") {
            let words: Vec<String> = command.split_whitespace().map(str::to_string).collect();
            if words.first().map(String::as_str) == Some("cargo")
                && words.get(1).map(String::as_str) == Some("build")
            {
                return words;
            }
        }
    }
    panic!("the build stage runs no `cargo build`: {stage:?}");
}

/// This machine's target triple (`rustc -vV`).
fn host() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let (ok, text) = run({
        let mut c = Command::new(rustc);
        c.arg("-vV");
        c
    });
    assert!(ok, "rustc -vV fails: {text}");
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// `cargo` without what cargo set in this test's environment for the test itself
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...). A build script that tracks one of them (ring's
/// tracks `CARGO_MANIFEST_DIR`) would otherwise be fingerprinted with this test's value, and
/// every later `cargo test` or `cargo build` in the tree would run it and rebuild what depends
/// on it (ring, rustls and every crate above them) for nothing.
fn cargo_as_from_a_shell() -> Command {
    let mut c = Command::new(env!("CARGO"));
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let set_for_the_test = ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_BIN_EXE_"]
            .iter()
            .any(|p| key.starts_with(p))
            || matches!(
                key,
                "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR"
            );
        if set_for_the_test {
            c.env_remove(key);
        }
    }
    c
}

fn run(mut command: Command) -> (bool, String) {
    let out = command.output().expect("cargo runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_build_stage_copies_a_workspace_that_cargo_accepts_and_checks() {
    let _busy = testkit::etcd::busy();
    let dir = std::env::temp_dir().join(format!("qg-dockerfile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    recreate_copy_set(&dir);

    // The whole dependency graph, resolved against Cargo.lock for this machine's platform
    // (`--filter-platform`: other platforms' crates were never downloaded, and `--offline`).
    let mut metadata = Command::new(env!("CARGO"));
    metadata
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .args(["--filter-platform", &host()])
        .current_dir(&dir);
    let (ok, text) = run(metadata);
    assert!(
        ok,
        "cargo metadata --locked fails on the build stage's COPY set:\n{text}"
    );

    let _ = std::fs::remove_dir_all(&dir);

    // The production feature set, checked (not built: same type checking, a fraction of the
    // time) in this tree and its target dir, where the test build and clippy left the
    // dependencies (a copy of its own cost a cold check of every dependency, minutes on CI's 2
    // cores). That the COPY set holds every file the check read is then shown from rustc's
    // dep-info of each workspace crate: a file outside it (an `include_str!` of `manifests/`)
    // would be missing from the image's build.
    let build = cargo_build(&build_stage());
    let mut check = cargo_as_from_a_shell();
    check
        .arg("check")
        .args(build.iter().skip(2).filter(|w| {
            !matches!(w.as_str(), "--release") // a check of the same code, in the dev profile
        }))
        .args(["--offline", "--message-format=json"])
        .current_dir(root());
    let out = check.output().expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo check of the build stage's command ({}) fails:\n{}{}",
        build.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let read = files_the_workspace_crates_read(&String::from_utf8_lossy(&out.stdout));
    assert!(
        read.iter().any(|f| f.ends_with("src/main.rs")),
        "the check's dep-info names the binary's own source: {read:?}"
    );
    let sources: Vec<PathBuf> = copies(&build_stage())
        .into_iter()
        .flat_map(|(sources, _)| sources.into_iter().map(PathBuf::from))
        .collect();
    let mut outside: Vec<_> = read
        .iter()
        // rustc names the workspace's files relative to its root, others absolute; an
        // `include_str!("../x")` keeps its `..` (`src/../x`).
        .map(|f| lexically_normal(&root().join(f)))
        .filter_map(|f| f.strip_prefix(root()).ok().map(Path::to_path_buf))
        .filter(|rel| !rel.starts_with("target"))
        .filter(|rel| !sources.iter().any(|s| rel.starts_with(s)))
        .collect();
    outside.sort();
    outside.dedup();
    assert!(
        outside.is_empty(),
        "the build stage's check reads files its COPY set ({sources:?}) does not copy: {outside:?}"
    );
}

/// `path` with every `.` and `..` resolved without the file system (`a/b/../c` is `a/c`).
fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Every file rustc read for the workspace's own crates, from `cargo check
/// --message-format=json`'s artifacts: each path package's dep-info (`<crate>-<hash>.d` beside
/// its `lib<crate>-<hash>.rmeta`). Panics on a workspace build script, which this test does not
/// follow.
fn files_the_workspace_crates_read(json_lines: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for line in json_lines.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let local = msg["package_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("path+file://"));
        if !local {
            continue;
        }
        assert_ne!(
            msg["reason"], "build-script-executed",
            "a workspace crate has a build script, whose reads this test does not follow: {line}"
        );
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        for rmeta in msg["filenames"].as_array().into_iter().flatten() {
            let Some(rmeta) = rmeta.as_str().map(Path::new) else {
                continue;
            };
            let Some(stem) = rmeta
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".rmeta"))
                .map(|n| n.strip_prefix("lib").unwrap_or(n))
            else {
                continue;
            };
            let dep_info = rmeta.with_file_name(format!("{stem}.d"));
            let text = std::fs::read_to_string(&dep_info)
                .unwrap_or_else(|e| panic!("dep-info {}: {e}", dep_info.display()));
            files.extend(dep_info_files(&text));
        }
    }
    assert!(!files.is_empty(), "no workspace crate was checked");
    files
}

/// The files of a Makefile-style dep-info (`target: dep dep...`, spaces escaped as `\ `).
fn dep_info_files(text: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    // `# env-dep:NAME=value` lines name environment variables, not files.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((_, deps)) = line.split_once(": ") else {
            continue;
        };
        let mut current = String::new();
        let mut chars = deps.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => {
                    current.push(' ');
                    chars.next();
                }
                ' ' => {
                    if !current.is_empty() {
                        out.push(PathBuf::from(std::mem::take(&mut current)));
                    }
                }
                _ => current.push(c),
            }
        }
        if !current.is_empty() {
            out.push(PathBuf::from(current));
        }
    }
    out
}

#[test]
fn paths_are_compared_with_their_dots_resolved() {
    assert_eq!(
        lexically_normal(Path::new("/r/src/./../README.md")),
        Path::new("/r/README.md")
    );
}

#[test]
fn dep_info_is_read_with_its_escaped_spaces() {
    let text = "/t/deps/x-1.d: /r/src/main.rs /r/my\\ dir/a.rs\n\n/r/src/main.rs:\n\n# env-dep:CARGO_PKG_DESCRIPTION=q: a b\n";
    assert_eq!(
        dep_info_files(text),
        [
            PathBuf::from("/r/src/main.rs"),
            PathBuf::from("/r/my dir/a.rs")
        ]
    );
}

#[test]
fn the_build_stage_installs_what_deps_sh_installs_for_building() {
    let installed = apt_packages(&build_stage());
    for p in build_packages_of_deps_sh() {
        assert!(
            installed.contains(&p),
            "scripts/deps.sh installs {p} for the build, the Dockerfile's build stage does not \
             (it installs {installed:?})"
        );
    }
}

#[test]
fn the_image_is_the_production_binary_run_as_non_root() {
    let build = cargo_build(&build_stage());
    for flag in ["--release", "--locked", "--no-default-features"] {
        assert!(
            build.iter().any(|w| w == flag),
            "the build stage's `{}` lacks {flag}",
            build.join(" ")
        );
    }
    assert!(
        !build
            .iter()
            .any(|w| w.starts_with("--features") || w == "--all-features" || w == "-F"),
        "the production image turns no feature on (the playground stays out): {}",
        build.join(" ")
    );
    let runtime = stages().pop().expect("a runtime stage");
    let user = runtime
        .iter()
        .filter_map(|i| match split(i) {
            (kw, rest) if kw == "USER" => Some(rest.to_string()),
            _ => None,
        })
        .next_back()
        .expect("the runtime stage sets USER");
    let uid = user.split(':').next().unwrap_or_default();
    assert!(
        !uid.is_empty() && uid != "0" && uid != "root",
        "the runtime stage runs as {user}, not as a non-root user"
    );
}

/// The production feature set has no playground in it; the default one does (so this test can
/// tell the two apart).
#[test]
fn the_production_feature_set_has_no_playground() {
    let tree = |default: bool| {
        let mut c = Command::new(env!("CARGO"));
        c.args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            "quorumguard",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(root());
        if !default {
            c.arg("--no-default-features");
        }
        let (ok, text) = run(c);
        assert!(ok, "cargo tree fails:\n{text}");
        text
    };
    assert!(
        !tree(false).contains("quorumguard-playground"),
        "quorumguard --no-default-features still depends on the playground"
    );
    assert!(
        tree(true).contains("quorumguard-playground"),
        "the default feature set lost the playground (`quorumguard playground` would be gone)"
    );
}
