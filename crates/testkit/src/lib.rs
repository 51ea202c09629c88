//! quorumguard's shared test fixtures: a dev-only crate (never published) that the root
//! package's integration tests (`tests/it/`, `tests/real/`), its benches (`benches/`) and their
//! smoke tests build on, so that each fixture exists once. It reaches the product through the
//! root package's facade (`quorumguard::...`).
//!
//! What is here, one module per fixture:
//!
//! - [`budgets`]: the budgets CI holds (allocations, copies of cached objects, etcd and API
//!   requests per review, probe and sweep), counted, never timed, and the counting allocator;
//! - [`etcd`]: real etcd clusters on 127.0.0.1 with TLS, at most one per test process and two
//!   on the machine at a time (slots: the machines are 2-core and etcd's election timeout must
//!   not be starved), failing
//!   the test on every error and printing the members' logs when it panics;
//! - [`envtest`]: a real kube-apiserver (envtest's assets) with the Cluster API CRDs, one per test
//!   process at a time (its own slot, always taken before the etcd slot), and `quorumguard serve`
//!   as a child process against it;
//! - [`guard`]: the guard running in-process as `serve` runs it (its configuration, a stand-in
//!   seeded with the fixture control plane, reviews sent over h2);
//! - [`webhook`]: a [`quorumguard::admission::Webhook`] over a hand-seeded state, no server and no
//!   API server: for the property tests and the core benchmark;
//! - [`reviews`]: the AdmissionReview fixtures kube-apiserver sent (`tests/fixtures/`) and the
//!   Cluster API objects in them;
//! - [`seed`]: a workload cluster's objects in the API-server stand-in, as Cluster API stores them;
//! - [`kit`]: `kube::Api` short forms and object builders for tests against the stand-in;
//! - [`https`]: a test PKI, temporary directories and an HTTPS (h2 and HTTP/1.1) client;
//! - [`logs`]: everything the process logs, captured as JSON lines;
//! - [`manifests`]: `manifests/` rendered (`kubectl kustomize`, or the raw files);
//! - [`load`]: the webhook load generator and its floor server (`benches/webhook_load.rs` and its
//!   smoke test);
//! - [`scale`]: the 1,000-cluster scale run (`benches/scale.rs` and its smoke test);
//! - [`paths`]: where the repository, the `quorumguard` binary and the target's scratch
//!   directory are;
//! - [`wan`]: a delaying TCP relay on loopback, a WAN's round trip between quorumguard and a
//!   workload API server without root or netem (`benches/fresh_probe.rs`).

pub mod budgets;
pub mod envtest;
pub mod etcd;
pub mod fuzz;
pub mod guard;
pub mod https;
pub mod kit;
pub mod load;
pub mod logs;
pub mod manifests;
pub mod paths;
pub mod reviews;
pub mod scale;
pub mod seed;
pub mod wan;
pub mod webhook;

/// The API-server stand-in lives in the library (the playground serves it).
pub use quorumguard::playground::apiserver;
