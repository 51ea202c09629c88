//! The root package's integration tests in one binary, one module per subject: the binary's (the
//! built `quorumguard` run as a user runs it) and the repository's (its layering, Dockerfile,
//! docs, manifests), the benchmarks' machinery at smoke size, and the properties that span the
//! engine, the webhook and `check`. Cargo links and starts it once, and its tests overlap while
//! they wait (on etcd, on timeouts). Shared fixtures come from the dev-only `quorumguard-testkit`
//! crate (`crates/testkit/`, here as `testkit`): a real etcd cluster runs one at a time per
//! process there (its slot), a real kube-apiserver too. One subject:
//! `cargo test --test it <module>::`, e.g. `cargo test --test it status_cli::`. Each crate's own
//! integration tests are beside it, in `crates/<name>/tests/it/` (`cargo test -p
//! quorumguard-<name>`). The slow real-process tests (the playground's stories, the real
//! kube-apiserver, the model check) are in `tests/slow/`.

mod architecture;
mod certs_cli;
mod check_cli;
mod crash_safety;
mod dockerfile;
mod docs;
mod manifests;
mod monitoring;
mod properties;
mod scale;
mod serve_cli;
mod status_cli;
mod webhook_load;
