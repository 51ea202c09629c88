//! quorumguard's autopilot, the acting side (issue 38; docs/architecture.md): it carries out
//! the one next action quorumguard publishes for a control plane, when the engine has proven it
//! safe on a probe taken just before, one action at a time and only where the operator opted in.
//!
//! The decision that an action is safe now is the engine's (beside the next action it carries
//! out); this crate does the I/O an action is made of, on top of what the guard already knows
//! (`quorumguard-observe`): the webhook and the status writer stay as they are.
//!
//! What is here:
//! - [`etcd`]: [`EtcdActor`], the etcd calls the actions are made of (promote a learner,
//!   remove a member, compact, defragment one member, move the leadership, disarm NOSPACE, and
//!   one member's status between steps), each on one member under one deadline, over the
//!   transport the prober uses for that cluster (direct or port-forward).
//! - [`machines`]: the Machine deletion of the #2651 state, as the autopilot's own identity
//!   through the API server (and so through quorumguard's webhook), only of the object proven
//!   (UID and resourceVersion preconditions).
//!
//! - [`mod@execute`]: one step the engine proved safe, as those calls on the members of the fresh
//!   probe it was proven on ([`plan`], pure) and made ([`execute()`]).
//!
//! - [`pilot`]: one control plane's turn after a sweep: the step in flight re-proven, the
//!   engine asked on a probe taken for the turn, the proven step carried out, one cluster at a
//!   time per cluster and a bounded number across the fleet; a [`Report`] of it.
//! - [`report`]: what a turn tells: its Events on the KCP and its metrics.
//!
//! Not here yet: the wiring into `serve` (the Lease holder's turns after each sweep, the flags,
//! the Events, the metrics and the dry run's words in the NextAction condition).

pub mod etcd;
pub mod execute;
pub mod machines;
pub mod pilot;
pub mod report;

pub use etcd::{ActError, Call, EtcdActor, MemberState};
pub use execute::{Done, ExecError, Plan, Planned, execute, plan};
pub use machines::{DeleteError, Deleted, MachineRef, delete_machine};
pub use pilot::{Did, Pilot, Report, Turn};
pub use report::{AutopilotMetrics, EventNote};
