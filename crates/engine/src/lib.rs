//! The product's knowledge, pure and synchronous: quorum arithmetic, the model of a control
//! plane, the decisions and the next safe action. Nothing here performs I/O or reads a clock, so
//! every rule can be tested exhaustively and every entry point (webhook, prober, `check`) agrees.

pub mod autopilot;
pub mod confirm;
pub mod decide;
pub mod etcd_version;
pub mod fresh;
pub mod joins;
pub mod judge;
pub mod kcp;
pub mod model;
pub mod next_action;
pub mod quorum;
pub mod remediation;
pub mod rollout;

pub use confirm::{Belief, Confirmation, Judged};
pub use decide::{
    Answer, EtcdBasis, Figures, Judgement, Operation, Reason, Verdict, admit, admit_deletion,
    decide,
};
pub use fresh::{failed_view, fresh_view};
pub use joins::{JoinBasis, JoinStyle, Joins};
pub use model::*;
pub use next_action::{ActionCode, NextAction, next_action};
pub use remediation::{Coverage, Held, coverage};

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
#[cfg(test)]
mod tests;
