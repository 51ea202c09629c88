//! The slow real-process tests in one binary, one module per subject: the playground's stories on
//! real etcd ([`playground`]), the default story on a real kube-apiserver ([`playground_real`]),
//! the rendered manifests on a real kube-apiserver ([`real_apiserver`]) and the model check of
//! the guard with KCP, etcd, people and failures ([`model`]). Shared fixtures come from the
//! dev-only `quorumguard-testkit` crate (`crates/testkit/`, here as `testkit`). The rest of the
//! integration tests are in `tests/it/`. One subject: `cargo test --test slow <module>::`.

mod model;
mod playground;
mod playground_real;
mod real_apiserver;
