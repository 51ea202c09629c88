//! quorumguard-cli's integration tests in one binary, one module per subject: `serve` assembled and
//! running in-process: faults, readiness, security. `cargo test -p quorumguard-cli` runs them (and
//! the crate's unit tests); one subject: `cargo test -p quorumguard-cli --test it readiness::`.
//! Shared fixtures come from the dev-only `quorumguard-testkit` crate (`crates/testkit/`, here as
//! `testkit`); the tests of the binary and of the repository stay in the root package's `tests/it/`
//! (docs/development.md, "Where the tests are").

mod faults;
mod readiness;
mod security;
