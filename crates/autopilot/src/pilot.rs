//! The autopilot's turn for one control plane, after a sweep published its next action and a
//! probe was taken just for this turn: re-prove the step in flight (if any) on that probe, ask
//! the engine ([`decide`]), and carry out what it proves safe ([`crate::execute()`]), one
//! action per cluster at a time and at most [`Pilot::max_acting`] clusters acting at once
//! across the fleet.
//!
//! The [`Pilot`] keeps each cluster's [`Book`] in memory: only the Lease holder runs turns, and
//! a new holder starts with empty books. That is safe because every decision rests on the probe
//! of the turn, not on the book: an empty book only forgets the interval and the back-off
//! (the next action is tried once more, no sooner than the new holder's first sweep) and a
//! `FreeSpace` plan's progress (its steps are each proven again on the probe: a compaction or a
//! defragmentation done twice changes nothing).
//!
//! What a turn did comes back as a [`Report`]: the caller records its Events, counts it in the
//! metrics and publishes a dry run's words in the NextAction condition.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

use quorumguard_engine::autopilot::{
    Book, Decision, Kind, Mode, Outcome, Proof, Settings, Situation, Step, Why, decide,
};
use quorumguard_engine::{ControlPlane, EtcdBasis, NextAction, Policy};
use tokio::sync::Semaphore;

use crate::etcd::EtcdActor;
use crate::execute::{Done, execute};
use crate::machines::MachineRef;

/// Everything a turn reads, gathered by the caller for one control plane.
#[derive(Clone, Copy, Debug)]
pub struct Turn<'a> {
    /// The KCP's `quorumguard.io/autopilot` annotation, when it has one.
    pub annotation: Option<&'a str>,
    /// The next action the sweep published.
    pub published: &'a NextAction,
    /// The control plane with etcd as the probe taken for this turn shows it.
    pub fresh: &'a ControlPlane,
    /// Where `fresh`'s etcd comes from (the engine acts on nothing but a fresh probe).
    pub basis: EtcdBasis,
    /// The cached Machine the #2651 step would delete (its UID and resourceVersion).
    pub machine: Option<&'a MachineRef>,
    pub now_unix: i64,
}

/// What the turn did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Did {
    /// The step was carried out: its result (how many etcd calls, or the deletion), or why it
    /// failed.
    Acted {
        step: Step,
        proof: Proof,
        message: String,
        result: Result<Done, String>,
    },
    /// `dry-run`: what it would do, and when.
    DryRun {
        step: Step,
        at_unix: i64,
        message: String,
    },
    /// The engine refused (its reason and words).
    Refused {
        why: Why,
        message: String,
        until_unix: Option<i64>,
    },
    /// Proven safe, but [`Pilot::max_acting`] clusters are acting already: the next sweep
    /// decides again.
    FleetBusy { step: Step, message: String },
    /// Proven safe, but this replica stopped holding the Lease before acting: the new holder
    /// decides on its own probe.
    NotLeading { step: Step },
}

/// A turn's outcome: the step in flight re-proven (or not), then what was done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub settled: Option<Outcome>,
    pub did: Did,
}

/// The autopilot action the book last saw published (`PromoteLearner` for m4, say), when the
/// published next action is now another one: what the autopilot will no longer do.
fn withdrawn(book: &Book, published: &NextAction) -> Option<String> {
    let seen = book.seen.as_ref()?;
    Kind::of(seen.code)?;
    let same = seen.code == published.code && seen.target == published.target;
    (!same).then(|| match &seen.target {
        Some(t) => format!("{} ({t})", seen.code),
        None => seen.code.to_string(),
    })
}

/// Whether the autopilot should take a turn for a control plane whose published next action is
/// `published`, with its mode and allowed actions: a step in flight is settled, a published
/// autopilot action is decided, and an autopilot action that stopped being published is said
/// once to be dropped. Cheap: no probe is taken for the others.
fn wants(book: Option<&Book>, mode: Mode, settings: &Settings, published: &NextAction) -> bool {
    let in_flight = book.is_some_and(|b| b.in_flight.is_some());
    let on = mode != Mode::Off;
    let published_kind = Kind::of(published.code).is_some_and(|k| settings.actions.contains(&k));
    let dropped = book.is_some_and(|b| withdrawn(b, published).is_some());
    in_flight || (on && (published_kind || dropped))
}

/// The autopilot of one `serve` process.
pub struct Pilot {
    /// `--autopilot` as a number (see [`mode_code`]), changeable while running: the kill switch.
    flag: AtomicU8,
    settings: Settings,
    policy: Policy,
    books: Mutex<HashMap<String, Book>>,
    acting: Semaphore,
    max_acting: usize,
    /// Asked right before every action: whether this replica still holds the Lease.
    leading: Box<dyn Fn() -> bool + Send + Sync>,
}

fn mode_code(mode: Mode) -> u8 {
    match mode {
        Mode::Off => 0,
        Mode::DryRun => 1,
        Mode::On => 2,
    }
}

fn mode_of(code: u8) -> Mode {
    match code {
        2 => Mode::On,
        1 => Mode::DryRun,
        _ => Mode::Off,
    }
}

impl Pilot {
    /// `flag` is `--autopilot`; `max_acting` (at least 1) bounds the clusters acting at once.
    pub fn new(flag: Mode, settings: Settings, policy: Policy, max_acting: usize) -> Self {
        let max_acting = max_acting.max(1);
        Pilot {
            flag: AtomicU8::new(mode_code(flag)),
            settings,
            policy,
            books: Mutex::new(HashMap::new()),
            acting: Semaphore::new(max_acting),
            max_acting,
            leading: Box::new(|| true),
        }
    }

    /// Acts only while `leading` says this replica holds the Lease (asked right before each
    /// action; by default, always).
    pub fn with_leading(mut self, leading: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        self.leading = Box::new(leading);
        self
    }

    pub fn max_acting(&self) -> usize {
        self.max_acting
    }

    /// The fleet-wide mode now.
    pub fn flag(&self) -> Mode {
        mode_of(self.flag.load(Ordering::SeqCst))
    }

    /// Changes the fleet-wide mode: `off` stops every action from the next turn on (a step
    /// already sent to etcd is not recalled; its outcome is still settled and reported).
    pub fn set_flag(&self, mode: Mode) {
        self.flag.store(mode_code(mode), Ordering::SeqCst);
    }

    /// A copy of the book of the control plane `key` (`namespace/name`), for status and tests.
    pub fn book(&self, key: &str) -> Option<Book> {
        self.lock().get(key).cloned()
    }

    /// Whether control plane `key` (`namespace/name`), with its annotation and the next action
    /// published for it, gets a turn: a step in flight is settled, a published autopilot action
    /// (one `--autopilot-actions` allows) is decided, and one that stopped being published is
    /// said once to be dropped; the others get none (and no probe).
    pub fn wants_turn(&self, key: &str, annotation: Option<&str>, published: &NextAction) -> bool {
        let mode = Mode::effective(self.flag(), annotation);
        wants(self.lock().get(key), mode, &self.settings, published)
    }

    /// Forgets a control plane that is gone.
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Book>> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One turn for the control plane of `turn.fresh`. Turns of one control plane must not
    /// overlap (the caller runs one per control plane per sweep); turns of different ones may.
    pub async fn turn(&self, turn: Turn<'_>, actor: &EtcdActor, kube: &kube::Client) -> Report {
        let key = turn.fresh.kcp_shown().to_string();
        let mut book = self.lock().remove(&key).unwrap_or_default();
        let settled = book.settle(turn.fresh, self.settings.interval, turn.now_unix);
        let withdrawn = withdrawn(&book, turn.published);
        book.note_published(turn.published, turn.now_unix);
        let mode = Mode::effective(self.flag(), turn.annotation);
        let decision = decide(&Situation {
            mode,
            settings: &self.settings,
            policy: &self.policy,
            published: turn.published,
            fresh: turn.fresh,
            basis: turn.basis,
            book: &book,
            now_unix: turn.now_unix,
        });
        let did = match decision {
            // The action it was about to take is not the published one any more: said once,
            // with what is published now (a member that failed just before, say).
            Decision::Refuse(r) if r.why == Why::NotAnAutopilotAction && withdrawn.is_some() => {
                Did::Refused {
                    why: Why::Disagrees,
                    message: format!(
                        "{} {} on KubeadmControlPlane {key}: the next action is now {}. Next: {}",
                        if mode == Mode::DryRun {
                            "Autopilot (dry-run) would no longer take"
                        } else {
                            "Autopilot no longer takes"
                        },
                        withdrawn.unwrap_or_default(),
                        turn.published.code,
                        turn.published.message
                    ),
                    until_unix: None,
                }
            }
            Decision::Refuse(r) => Did::Refused {
                why: r.why,
                message: r.message,
                until_unix: r.until_unix,
            },
            Decision::DryRun {
                act,
                at_unix,
                message,
            } => Did::DryRun {
                step: act.step,
                at_unix,
                message,
            },
            Decision::Act(act) if !(self.leading)() => Did::NotLeading { step: act.step },
            Decision::Act(act) => match self.acting.try_acquire() {
                Err(_) => Did::FleetBusy {
                    message: format!(
                        "Autopilot would {} on KubeadmControlPlane {key} now, but {} clusters \
                         are acting already (the fleet's limit): the next sweep decides again",
                        act.step, self.max_acting
                    ),
                    step: act.step,
                },
                Ok(_permit) => {
                    book.started(&act, turn.now_unix);
                    let result = execute(&act.step, turn.fresh, actor, kube, turn.machine).await;
                    let result = match result {
                        Ok(done) => Ok(done),
                        Err(e) => {
                            let text = e.to_string();
                            book.call_failed(&text, turn.now_unix);
                            Err(text)
                        }
                    };
                    Did::Acted {
                        step: act.step,
                        proof: act.proof,
                        message: act.message,
                        result,
                    }
                }
            },
        };
        self.lock().insert(key, book);
        Report { settled, did }
    }
}

#[cfg(test)]
mod tests {
    use quorumguard_engine::autopilot::{Book, Mode, Settings};
    use quorumguard_engine::{ActionCode, NextAction};

    use super::{wants, withdrawn};

    fn published(code: ActionCode, target: Option<&str>) -> NextAction {
        NextAction {
            code,
            message: format!("{code}"),
            command: None,
            target: target.map(str::to_string),
        }
    }

    #[test]
    fn an_autopilot_action_that_stops_being_published_is_said_once() {
        let settings = Settings::default();
        let promote = published(ActionCode::PromoteLearner, Some("m4"));
        let remediate = published(ActionCode::RemediateMachine, Some("m4"));
        // No book: a turn only for a published autopilot action.
        assert!(wants(None, Mode::On, &settings, &promote));
        assert!(!wants(None, Mode::On, &settings, &remediate));
        assert!(!wants(None, Mode::Off, &settings, &promote));
        // The promotion seen, then another action published: one turn to say it is dropped.
        let mut book = Book::default();
        book.note_published(&promote, 100);
        assert_eq!(withdrawn(&book, &promote), None);
        assert_eq!(
            withdrawn(&book, &remediate).as_deref(),
            Some("PromoteLearner (m4)")
        );
        assert!(wants(Some(&book), Mode::On, &settings, &remediate));
        assert!(wants(Some(&book), Mode::DryRun, &settings, &remediate));
        assert!(!wants(Some(&book), Mode::Off, &settings, &remediate));
        // Once noted, the new action is what was seen: nothing more to say.
        book.note_published(&remediate, 110);
        assert_eq!(withdrawn(&book, &remediate), None);
        assert!(!wants(Some(&book), Mode::On, &settings, &remediate));
    }
}
