//! The playground: quorumguard against a real etcd cluster, on loopback, without Kubernetes.
//!
//! It is never used by `quorumguard serve`: no crate of the guard depends on it, and the
//! production image is built without the binary's `playground` feature, so it ships none of it.
//! Tests and benches reuse its stand-in and its etcd helpers through `quorumguard::playground`.
//!
//! `quorumguard playground` ([`cli`]) puts these together: a real 3-member etcd
//! cluster with TLS, the API-server stand-in holding a Cluster, its KubeadmControlPlane and three
//! control-plane Machines whose nodes match the etcd member names, and `quorumguard serve`
//! pointed at them ([`world`]); a simulated KCP controller ([`kcp`]); the stories it replays
//! ([`scenarios`]) and the timeline they print ([`timeline`]).
//!
//! - [`apiserver`]: an in-memory **stand-in** for kube-apiserver speaking the Kubernetes REST
//!   protocol over plain HTTP on 127.0.0.1, enough for a real `kube::Client`, `kubectl` and
//!   quorumguard's own watches, status writes, Leases and port-forwards. It is not Kubernetes:
//!   no authentication or authorization, no TLS, no CRD schemas, no server-side apply, no
//!   garbage collector, one in-process admission hook (which [`webhooks`] can fill). Its module
//!   documentation lists exactly what it does and what it does not do; nothing it shows proves
//!   what a real cluster would do.
//! - [`etcd`]: real `etcd` processes (from PATH) on 127.0.0.1 with client and peer TLS, under a
//!   CA shaped like Cluster API's `<cluster>-etcd` Secret, and the faults the playground and
//!   the tests need: freeze (SIGSTOP), thaw, kill, remove a member, add and start a member or
//!   a learner, promote it.
//! - [`realapi`]: a real kube-apiserver and its etcd on loopback (envtest's binaries) with the
//!   Cluster API CRDs installed, for `quorumguard playground --real-apiserver` and the tests.
//! - [`child`]: child processes that die with this process even when it is SIGKILLed.
//! - [`prediction`]: `preflight`'s prediction set against the rollout the simulated KCP carries
//!   out on the playground.
//! - [`truth`]: every status quorumguard publishes during a story, checked against what etcd
//!   itself (etcdctl, not quorumguard's prober) said around that moment.
//! - [`webhooks`]: kube-apiserver's validating-webhook dispatch for the stand-in, driven by the
//!   repo's ValidatingWebhookConfiguration: matching writes are sent over real HTTPS to
//!   `quorumguard serve` and its verdicts answered as kube-apiserver answers them
//!   (matchConditions are not evaluated; its module documentation says what else it skips).
//!
//! The integration tests (`tests/`) use the stand-in and etcd through the testkit crate (`crates/testkit`), and the
//! whole playground in `tests/slow/playground.rs`.

pub mod apiserver;
pub mod child;
pub mod cli;
pub mod etcd;
pub mod kcp;
pub mod prediction;
pub mod realapi;
pub mod scenarios;
pub mod timeline;
pub mod truth;
pub mod webhooks;
pub mod world;

// The guard's crates and modules under the names the playground's code has always used (`crate::etcd`,
// `crate::server`, ...): the playground drives the real guard, never a copy of it.
use quorumguard_cli::server;
use quorumguard_engine as engine;
use quorumguard_observe::unix_now;
use quorumguard_pki::{certs, tls};
use quorumguard_status as status;
use quorumguard_telemetry as telemetry;
