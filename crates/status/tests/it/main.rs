//! quorumguard-status's integration tests in one binary, one module per subject: the status
//! enricher publishing the conditions into KCP status on real etcd. `cargo test -p
//! quorumguard-status` runs them (and the crate's unit tests); one subject: `cargo test -p
//! quorumguard-status --test it status_publish::`. Shared fixtures come from the dev-only
//! `quorumguard-testkit` crate (`crates/testkit/`, here as `testkit`); the tests of the binary and
//! of the repository stay in the root package's `tests/it/` (docs/development.md, "Where the tests
//! are").

mod status_publish;
