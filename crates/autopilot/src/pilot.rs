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
    Book, Decision, Mode, Outcome, Proof, Settings, Situation, Step, Why, decide,
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
