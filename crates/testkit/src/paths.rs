//! Where things are for a test or a bench that uses this crate: what Cargo tells an integration
//! test at compile time (`CARGO_MANIFEST_DIR` of the root package, `CARGO_BIN_EXE_quorumguard`,
//! `CARGO_TARGET_TMPDIR`) is not given to a library, so it is found here once.

use std::path::{Path, PathBuf};

/// The repository's root (the root package's directory): `tests/fixtures/`, `manifests/`.
pub fn repo_root() -> &'static Path {
    // crates/testkit -> crates -> the root.
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .and_then(Path::parent)
        .expect("crates/testkit sits two levels below the repository's root")
}

/// The profile directory of the running test or bench (`target/debug`, `target/release`): Cargo
/// runs them from its `deps/` directory.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the running test's path");
    exe.parent()
        .filter(|deps| deps.ends_with("deps"))
        .and_then(Path::parent)
        .unwrap_or_else(|| {
            panic!(
                "{} is not in a Cargo target's deps/ directory",
                exe.display()
            )
        })
        .to_path_buf()
}

/// The `quorumguard` binary Cargo built for this test or bench run (it builds a package's
/// binaries before running its integration tests and benches).
pub fn quorumguard_bin() -> PathBuf {
    let bin = profile_dir().join(format!("quorumguard{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: run the tests through cargo (cargo test / cargo bench)",
        bin.display()
    );
    bin
}

/// A scratch directory under the target directory (what `CARGO_TARGET_TMPDIR` names for an
/// integration test), created when missing.
pub fn target_tmp() -> PathBuf {
    let tmp = profile_dir()
        .parent()
        .map(|target| target.join("tmp"))
        .expect("the target directory");
    std::fs::create_dir_all(&tmp).expect("create the target's tmp directory");
    tmp
}
