//! quorumguard-observe's integration tests in one binary, one module per subject: the etcd prober
//! and the port-forward transport on real etcd. `cargo test -p quorumguard-observe` runs them (and
//! the crate's unit tests); one subject: `cargo test -p quorumguard-observe --test it
//! etcd_prober::`. Shared fixtures come from the dev-only `quorumguard-testkit` crate
//! (`crates/testkit/`, here as `testkit`); the tests of the binary and of the repository stay in
//! the root package's `tests/it/` (docs/development.md, "Where the tests are").

mod etcd_portforward;
mod etcd_prober;
