//! The sentences of a prediction: why KCP's preflight holds, why a step is unsafe, what one
//! more failure leads to.

use super::play::{End, Sim};
use super::report::{Counts, ReadyReason};
use crate::kcp::{Hold, MemberFit};
use crate::model::*;

impl Sim<'_> {
    /// Why KCP's preflight holds, in words.
    pub(super) fn hold_words(&self, hold: Hold) -> (ReadyReason, String) {
        (ReadyReason::from(hold), self.hold_sentence(hold))
    }

    /// [`Sim::hold_words`]'s sentence.
    pub(super) fn hold_sentence(&self, hold: Hold) -> String {
        let ns = &self.cp.kcp.namespace;
        let name = |key: u32| {
            self.cp
                .machines
                .get(key as usize)
                .map_or_else(String::new, |m| m.name.clone())
        };
        match hold {
            Hold::Deleting(k) => format!(
                "Machine {ns}/{} is being deleted and its deletion cannot finish; KCP waits for it",
                name(k)
            ),
            Hold::NoNode(k) => format!(
                "Machine {ns}/{} has no node; KCP's preflight waits for it",
                name(k)
            ),
            Hold::Member(k, fit) => {
                let m = &self.cp.machines[k as usize];
                let shown = self
                    .member_index(m)
                    .map(|i| {
                        let x = &self.members()[i];
                        match x.effective_health_ref() {
                            HealthRef::Unhealthy(why) => format!("{} ({why})", x.shown_name()),
                            _ => format!("{}", x.shown_name()),
                        }
                    })
                    .unwrap_or_default();
                match fit {
                    MemberFit::Learner => format!(
                        "the etcd member of Machine {ns}/{} is a learner; KCP's preflight waits for its promotion",
                        m.name
                    ),
                    MemberFit::Missing => format!(
                        "Machine {ns}/{} has no etcd member; KCP's preflight holds every scale operation",
                        m.name
                    ),
                    _ => format!(
                        "etcd member {shown} of Machine {ns}/{} is not healthy; KCP's preflight holds every scale operation until it is",
                        m.name
                    ),
                }
            }
            Hold::OrphanMembers(_) => {
                let orphans: Vec<String> = self
                    .members()
                    .iter()
                    .filter(|x| x.is_unstarted() || self.cp.machine_of(x).is_none())
                    .map(|x| {
                        format!(
                            "{} ({}{})",
                            x.shown_name(),
                            x.id,
                            if x.is_learner { ", a learner" } else { "" }
                        )
                    })
                    .collect();
                format!(
                    "etcd lists member(s) no Machine claims: {}; KCP's etcd check fails while they are listed, and etcd takes one learner at a time",
                    orphans.join(", ")
                )
            }
        }
    }
}

/// Why etcd's figures `c` after a step leave no margin: quorum lost, a voting member not
/// healthy, or a fault tolerance of 0.
pub(super) fn margin(c: &Counts) -> String {
    let not_healthy = c.voting - c.healthy;
    if c.fault_tolerance < 0 {
        format!(
            "quorum lost: {} healthy of {} voting members, {} needed; etcd takes no writes until {} more {} healthy",
            c.healthy,
            c.voting,
            c.quorum,
            -c.fault_tolerance,
            if c.fault_tolerance == -1 { "is" } else { "are" }
        )
    } else if c.healthy < c.voting {
        format!(
            "{} of {} voting members healthy (quorum {}): {not_healthy} {} not (down, or added and not started yet), and one more failure {}",
            c.healthy,
            c.voting,
            c.quorum,
            if not_healthy == 1 { "is" } else { "are" },
            if c.fault_tolerance < 1 {
                "loses quorum"
            } else {
                "leaves no margin"
            }
        )
    } else {
        format!(
            "fault tolerance 0 ({} healthy of {} voting members, quorum {}): one more member failure loses quorum",
            c.healthy, c.voting, c.quorum
        )
    }
}

/// What member `victim`'s failure leads to: `c` are etcd's figures with it down,
/// `restored_by` the Machine whose voting member's start gives the quorum back, `end` how the
/// rollout played on ends, at step `stuck_at` when it sticks.
pub(super) fn one_failure_sentence(
    victim: &str,
    c: &Counts,
    restored_by: Option<&str>,
    end: &End,
    stuck_at: usize,
) -> String {
    let quorum_kept = c.healthy >= c.quorum;
    let then = match end {
        End::Finished => "the rollout still finishes".to_string(),
        End::Stuck { why, .. } => format!("the rollout sticks at step {stuck_at}: {why}"),
    };
    match (quorum_kept, restored_by) {
        (true, _) => format!(
            "{victim} fails: quorum kept ({} of {} voting healthy, quorum {}); {then}",
            c.healthy, c.voting, c.quorum
        ),
        (false, Some(machine)) => format!(
            "{victim} fails: QUORUM LOST ({} of {} voting healthy, quorum {}): etcd refuses writes until the voting member added for Machine {machine} starts or {victim} is back; then {then}",
            c.healthy, c.voting, c.quorum
        ),
        (false, None) => format!(
            "{victim} fails: QUORUM LOST ({} of {} voting healthy, quorum {}): etcd refuses writes until {victim} is back, and the rollout stops",
            c.healthy, c.voting, c.quorum
        ),
    }
}
