//! The autopilot as an actor (issue 38): it takes the published next action on its own fresh
//! probe, through the real engine decision (`autopilot::decide`), and re-proves the step it
//! has in flight (`Book::settle`) before it takes another.
//!
//! Time is coarse here, as for the rest of the model: by the autopilot's next step its
//! interval, any back-off and KCP's chance to remove an unclaimed member have passed (the
//! engine's tests hold those clocks; the model's KCP leaves the removal of unclaimed members
//! to the next action, docs/kcp-model.md). What it keeps between steps is the step in flight.

use quorumguard::engine::autopilot::{
    self, Book, Decision, Mode, Outcome, Settings, Situation, Step,
};
use quorumguard::engine::{
    ControlPlane, EtcdBasis, EtcdState, Health, Policy, failed_view, fresh_view, next_action,
};

use crate::model::guard::{Fresh, Who, take_probe};
use crate::model::steps::{Config, Say};
use crate::model::world::*;

impl Config {
    /// One sweep of the autopilot on this cluster: re-prove the step in flight, or decide and
    /// act. `None` when nothing changes.
    pub(crate) fn autopilot(&self, n: &mut State, explore: bool, say: &mut Say) -> Option<()> {
        let mut book = n.autopilot.clone()?;
        let policy = Policy::default();
        let settings = Settings::default();
        let record = n.enricher_view();
        let published = next_action(&record, &policy, NOW);
        // Its own probe of etcd, taken just before it decides; the planted bug decides on the
        // guard's record instead, and calls it fresh.
        let fresh = if self.bugs.ap_stale_view {
            as_last_probed(&record)
        } else {
            fresh_control_plane(n, &record)
        };
        if self.bugs.ap_ignores_in_flight {
            book.in_flight = None;
        } else if let Some(f) = book.in_flight.clone() {
            // The API server as a GET shows it (the Machines), etcd as the probe shows it.
            let mut now = fresh.clone();
            now.machines = n.machines.iter().map(engine_machine).collect();
            let later = f.started_unix + secs(settings.interval);
            let out = book.settle(&now, settings.interval, later)?;
            let (done, words) = match out {
                Outcome::UnderWay(_) => return None,
                Outcome::Succeeded(w) => ("re-proven", w),
                Outcome::Failed(w) => ("failed", w),
            };
            say.line(|| format!("the autopilot's step {done}: {words}"));
            n.autopilot = Some(kept(book));
            return Some(());
        }
        book.note_published(&published, NOW - 86_400);
        let decision = autopilot::decide(&Situation {
            mode: if self.bugs.ap_off {
                Mode::Off
            } else {
                Mode::On
            },
            settings: &settings,
            policy: &policy,
            published: &published,
            fresh: &fresh,
            basis: EtcdBasis::FreshProbe,
            book: &book,
            now_unix: NOW,
        });
        let Decision::Act(act) = decision else {
            return None;
        };
        let on = if self.bugs.ap_stale_view {
            "the guard's record"
        } else {
            "its own probe"
        };
        say.line(|| {
            format!(
                "the autopilot, on {on}: {} ({} -> {})",
                act.step, act.proof.before, act.proof.after
            )
        });
        let present: Vec<u8> = n.machines.iter().map(|m| m.slot).collect();
        n.ap_deleting.retain(|slot| present.contains(slot));
        if let (Some(&slot), None) = (n.ap_deleting.first(), &n.ap_overlap) {
            n.ap_overlap = Some(format!(
                "{} while its deletion of Machine {} is under way",
                act.step,
                name(slot)
            ));
        }
        book.started(&act, NOW);
        if let Err(e) = self.carry_out(n, &act.step, explore, say) {
            say.line(|| format!("  it fails: {e}"));
            book.call_failed(&e, NOW);
        }
        n.autopilot = Some(kept(book));
        Some(())
    }

    /// The step on the model's etcd, or through the webhook.
    fn carry_out(
        &self,
        n: &mut State,
        step: &Step,
        explore: bool,
        say: &mut Say,
    ) -> Result<(), String> {
        let slot_of = |id: u64| u8::try_from(id.saturating_sub(1)).unwrap_or(u8::MAX);
        match step {
            // etcd's `mayPromoteMember` (server/etcdserver/server.go): the learner in sync by the
            // leader's progress of it (`isLearnerReady`), which a learner that stopped a moment
            // ago still is, and the started voting members, it included, a quorum of the grown
            // membership. It does not ask whether the learner runs.
            Step::Promote { member, .. } => {
                let slot = slot_of(member.0);
                let ok = n.member(slot).is_some_and(|m| m.learner && m.started) && n.has_quorum();
                let started = n.members.iter().filter(|m| !m.learner && m.started).count();
                if !ok || started + 1 < quorum(n.voting() + 1) {
                    return Err("etcd refuses the promotion".into());
                }
                if let Some(m) = n.member_mut(slot) {
                    m.learner = false;
                }
                if let Some(m) = n.machine_mut(slot) {
                    m.node = true;
                }
                Ok(())
            }
            Step::RemoveMember { member, .. } => {
                let slot = slot_of(member.0);
                if n.member(slot).is_none() || !n.has_quorum() {
                    return Err("etcd refuses the removal".into());
                }
                n.members.retain(|m| m.slot != slot);
                Ok(())
            }
            Step::DeleteMachine { machine } => {
                let slot: u8 = machine
                    .strip_prefix('m')
                    .and_then(|s| s.parse().ok())
                    .ok_or("no such Machine")?;
                match self.review_deletion(
                    n,
                    slot,
                    Who::Autopilot,
                    true,
                    Fresh::Probe { explore },
                    say,
                ) {
                    Some(true) => {
                        if !n.ap_deleting.contains(&slot) {
                            n.ap_deleting.push(slot);
                        }
                        Ok(())
                    }
                    _ => Err("the webhook refuses the deletion".into()),
                }
            }
            other => Err(format!("{other}: the model has no NOSPACE")),
        }
    }
}

/// The control plane the autopilot decides on: the watch cache's objects (as the enricher's)
/// and etcd from a probe taken now, read by the real `fresh_view` against the record (the
/// real `failed_view` when no member answers), with raft indexes (the model's learner is in
/// sync whenever it runs).
fn fresh_control_plane(n: &State, record: &ControlPlane) -> ControlPlane {
    let recorded = n.record_members();
    let members = match take_probe(n) {
        Some(mut probe) => {
            for m in probe.iter_mut().filter(|m| m.raft_term.is_some()) {
                m.raft_index = Some(100);
            }
            fresh_view(probe, &recorded)
        }
        None => failed_view(&recorded),
    };
    let mut cp = record.clone();
    cp.etcd = observed(members);
    cp
}

/// The planted bug's view: the guard's record as the last probe answered (serve's record keeps
/// each member's leader flag and raft index; the model's record keeps only their health).
fn as_last_probed(record: &ControlPlane) -> ControlPlane {
    let mut cp = record.clone();
    if let EtcdState::Observed(s) = &mut cp.etcd {
        let mut led = false;
        for m in s.members.iter_mut().filter(|m| !m.is_unstarted()) {
            m.raft_term = Some(2);
            m.raft_index = Some(100);
            if !led && !m.is_learner && m.health == Health::Healthy {
                m.is_leader = true;
                led = true;
            }
        }
    }
    cp
}

/// What the model keeps of the bookkeeping between steps: the step in flight (time is
/// coarse: the clocks have always run out by the next step).
fn kept(book: Book) -> Book {
    Book {
        in_flight: book.in_flight,
        ..Book::default()
    }
}

fn secs(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}
