//! What quorumguard publishes in a KubeadmControlPlane's `status.conditions`: the etcd member
//! table KCP's own status lacks, and the single next safe action.
//!
//! [`conditions`](mod@conditions) is pure: the status writer passes the control plane, the latest probe error and
//! the time in, and writes only when [`merge`] says something changed.

pub mod conditions;
pub mod metrics;
pub mod publish;

pub use conditions::{
    CONDITION_ETCD_QUORUM, CONDITION_NEXT_ACTION, MAX_CONDITIONS, MAX_MESSAGE_LEN, QuorumReason,
    conditions, lacks_room, merge,
};
