//! What quorumguard publishes in a KubeadmControlPlane's `status.conditions`: the etcd member
//! table KCP's own status lacks, and the single next safe action.
//!
//! [`conditions`](mod@conditions) is pure: the status writer passes the control plane, the latest probe error and
//! the time in, and writes only when [`merge`] says something changed. [`publish`] is the
//! writer: the loop that sweeps etcd (through `quorumguard-observe`) and writes the conditions,
//! while this replica holds the [`lease`]; [`metrics`] are its Prometheus series.
//!
//! It may depend on `quorumguard-engine`, `quorumguard-observe` and `quorumguard-telemetry`;
//! only the command line (`quorumguard-cli`) depends on it (tests/it/architecture.rs).

pub mod conditions;
pub mod lease;
pub mod metrics;
pub mod publish;

pub use conditions::{
    CONDITION_ETCD_QUORUM, CONDITION_NEXT_ACTION, MAX_CONDITIONS, MAX_MESSAGE_LEN, QuorumReason,
    conditions, conditions_given, lacks_room, merge,
};
