//! The guard's steps: the probe judged by the real `Belief::judge`, and every review decided
//! by the real engine (`admit_deletion`, `admit`) on the view the webhook would have, exactly as
//! `crates/guard/src/admission/mod.rs` calls them; and a person following the real
//! `next_action` of the enricher's view.

use std::time::Duration;

use quorumguard::engine::{
    ActionCode, DEFAULT_KCP_CONTROLLER, Health, Judgement, Member, Operation, Policy, Reason,
    Requester, admit, admit_deletion, next_action,
};

use crate::steps::{Config, Say};
use crate::world::*;

/// The time between two probes (the sweep re-probes one election timeout later while anything
/// awaits confirmation), and the fixed instant every probe is judged at after rebasing.
const PROBE_EVERY: Duration = Duration::from_secs(1);
const JUDGED_AT: Duration = Duration::from_secs(6);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    Person,
    Kcp,
}

impl Who {
    fn requester(self) -> Requester {
        match self {
            Who::Person => Requester::new("alice"),
            Who::Kcp => Requester::new(DEFAULT_KCP_CONTROLLER),
        }
    }
}

impl Config {
    /// The guard takes the probe it would record now: the real `Belief::judge`, one probe
    /// interval after the last.
    pub(crate) fn probe(&self, n: &mut State, explore: bool, say: &mut Say) -> Option<()> {
        self.clock(n, explore)?;
        n.unprobed = 0;
        n.probes_since_lost = if n.has_quorum() {
            // Past the longest election, the count no longer matters.
            n.probes_since_lost
                .saturating_add(1)
                .min(self.bounds.election_probes + 1)
        } else {
            0
        };
        if !n.members.iter().any(|m| m.started && m.up && !m.learner) {
            n.probe_failed = true;
            say.line(|| "the guard's probe fails: no member answers".into());
            return Some(());
        }
        let probe: Vec<Member> = n
            .members
            .iter()
            .map(|m| {
                let mut x = Member::new(
                    u64::from(m.slot) + 1,
                    if m.started {
                        name(m.slot)
                    } else {
                        String::new()
                    },
                );
                x.is_learner = m.learner;
                x.health = if !m.started {
                    Health::Unhealthy("not started".into())
                } else if !m.up {
                    Health::Unhealthy("no answer within 2s".into())
                } else if n.leader.is_some() {
                    x.raft_term = Some(2);
                    x.is_leader = n.leader == Some(m.slot);
                    Health::Healthy
                } else {
                    x.raft_term = Some(2);
                    Health::Unhealthy("etcdserver: no leader".into())
                };
                x
            })
            .collect();
        let judged = n.belief.judge(probe, JUDGED_AT, &self.confirmation);
        let recorded = judged.members.is_some();
        if let Some(members) = judged.members {
            n.view = Some(State::record(&members));
            n.probe_failed = false;
        }
        say.line(|| {
            format!(
                "the guard probes etcd{}",
                if recorded {
                    ""
                } else {
                    " (a changed member list: the record stands until a second probe)"
                }
            )
        });
        Some(())
    }

    /// Time passes by one probe interval: an election under way takes at most
    /// `election_probes` of them.
    pub(crate) fn clock(&self, n: &mut State, explore: bool) -> Option<()> {
        if n.leader.is_none() && n.has_quorum() {
            if explore && n.election_probes >= self.bounds.election_probes {
                return None;
            }
            n.election_probes = n.election_probes.saturating_add(1);
        }
        n.belief.rebase(PROBE_EVERY);
        Some(())
    }

    /// A Machine deletion through the webhook. `None` when refused and nothing changed.
    pub(crate) fn delete(&self, n: &mut State, slot: u8, who: Who, say: &mut Say) -> Option<()> {
        self.review_deletion(n, slot, who, true, say).map(|_| ())
    }

    /// Whether the webhook allows deleting Machine `m{slot}`: `Some(true)` allowed (and
    /// done), `Some(false)` refused but the review dropped reservations, `None` refused.
    /// `reservations` false judges on the enricher's view, as if the webhook held none.
    pub fn review_deletion(
        &self,
        n: &mut State,
        slot: u8,
        who: Who,
        reservations: bool,
        say: &mut Say,
    ) -> Option<bool> {
        let machine = *n.machine(slot)?;
        let reservations =
            reservations && !self.bugs.no_reservations && !self.bugs.blind_to_pending;
        let (mut cp, replicas, kept) = n.webhook_view(reservations);
        if self.bugs.blind_to_pending {
            let me = name(slot);
            cp.machines
                .iter_mut()
                .filter(|m| m.name != me)
                .for_each(|m| m.deleting = false);
        }
        let policy = Policy::default();
        let mut j = admit_deletion(
            &cp,
            &engine_machine(&machine),
            &who.requester(),
            &policy,
            NOW,
        );
        if self.bugs.deny_memberless && j.reason == Reason::MemberAbsent {
            j.allowed = false;
        }
        let changed = (n.reserved_replicas, &n.reserved) != (replicas, &kept);
        (n.reserved_replicas, n.reserved) = (replicas, kept);
        say.line(|| verdict(&j));
        if !j.allowed {
            return changed.then_some(false);
        }
        if reservations && (!j.reason.is_unconditional() || j.reason == Reason::BreakGlass) {
            let seen_in_cache = n.cached(slot).is_some();
            n.reserved.retain(|r| r.machine.slot != slot);
            n.reserved.push(Reserved {
                machine,
                seen_in_cache,
            });
        }
        let unconfirmed = self.excuse_unconfirmed_membership && n.unconfirmed_membership();
        if j.reason == Reason::HealthUnknown
            || n.unseen_failure()
            || n.unseen_recovery(slot)
            || unconfirmed
        {
            n.unproven.push(slot);
        }
        n.machine_mut(slot)?.deleting = true;
        Some(true)
    }

    /// A KCP update through the webhook: spec.replicas to `to` (the scale subresource), or a
    /// version change (the KCP itself).
    pub(crate) fn update(&self, n: &mut State, to: u8, rollout: bool, say: &mut Say) -> Option<()> {
        let reservations = !self.bugs.no_reservations;
        let (mut cp, replicas, kept) = n.webhook_view(reservations);
        if rollout {
            cp.kcp.replicas = u32::from(to);
            cp.kcp.version = Some(format!("v1.{}", n.version + 1));
        }
        let op = Operation::UpdateKcp {
            replicas_from: u32::from(n.replicas),
            replicas_to: u32::from(to),
            starts_rollout: rollout,
        };
        let j = admit(&cp, &op, &Who::Person.requester(), &Policy::default(), NOW);
        let changed = (n.reserved_replicas, &n.reserved) != (replicas, &kept);
        (n.reserved_replicas, n.reserved) = (replicas, kept);
        say.line(|| verdict(&j));
        if !j.allowed {
            return changed.then_some(());
        }
        if reservations && to > n.replicas && !j.reason.is_unconditional() {
            n.reserved_replicas = Some(n.reserved_replicas.map_or(to, |r| r.max(to)));
        }
        n.replicas = to;
        if rollout {
            n.version += 1;
        }
        Some(())
    }

    /// A person does what the published next action says: delete the Machine it names,
    /// annotate one for remediation, or remove an orphan member with etcdctl.
    pub(crate) fn follow(&self, n: &mut State, say: &mut Say) -> Option<()> {
        let action = next_action(&n.enricher_view(), &Policy::default(), NOW);
        let target = action.target.clone().unwrap_or_default();
        let slot_of_machine = || target.strip_prefix('m')?.parse::<u8>().ok();
        match action.code {
            ActionCode::DeleteMachine => {
                let slot = slot_of_machine()?;
                n.machine(slot).filter(|m| !m.deleting)?;
                say.line(|| format!("a person follows the next action: deletes Machine {target}"));
                self.delete(n, slot, Who::Person, say)
            }
            ActionCode::RemediateMachine => {
                let slot = slot_of_machine()?;
                let m = n
                    .machine_mut(slot)
                    .filter(|m| !m.deleting && !m.remediate)?;
                m.remediate = true;
                say.line(|| {
                    format!("a person follows the next action: annotates Machine {target} remediate-machine")
                });
                Some(())
            }
            ActionCode::RemoveOrphanMember => {
                let id = u64::from_str_radix(&target, 16).ok()?;
                let slot = u8::try_from(id.checked_sub(1)?).ok()?;
                n.member(slot)?;
                if !n.has_quorum() {
                    return None;
                }
                n.members.retain(|m| m.slot != slot);
                say.line(|| {
                    format!("a person follows the next action: etcdctl member remove {target}")
                });
                Some(())
            }
            _ => None,
        }
    }
}

pub(crate) fn verdict(j: &Judgement) -> String {
    format!(
        "  the guard {} it ({})",
        if j.allowed { "allows" } else { "denies" },
        j.reason
    )
}
