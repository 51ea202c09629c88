//! The root package's integration tests in one binary, one module per subject: cargo links and
//! starts it once, and its tests overlap while they wait (on etcd, on timeouts). Shared fixtures
//! come from the dev-only `quorumguard-testkit` crate (`crates/testkit/`, here as `testkit`): a
//! real etcd cluster runs one at a time per process there (its slot), a real kube-apiserver too.
//! One subject: `cargo test --test it <module>::`, e.g. `cargo test --test it etcd_prober::`.
//! The slow real-process tests (the playground's stories, the real kube-apiserver, the model
//! check) are in `tests/slow/`.

mod apiserver_standin;
mod architecture;
mod bad_input;
mod certs_cli;
mod check_cli;
mod client_auth;
mod crash_safety;
mod dockerfile;
mod docs;
mod etcd_portforward;
mod etcd_prober;
mod events;
mod faults;
mod leader_changes;
mod live_health;
mod manifests;
mod monitoring;
mod playground_webhooks;
mod properties;
mod races;
mod readiness;
mod scale;
mod security;
mod serve_cli;
mod status_cli;
mod status_publish;
mod tls_reload;
mod webhook;
mod webhook_load;
