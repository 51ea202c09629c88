//! The autopilot's decision (issue 38): whether quorumguard carries out the next safe action it
//! publishes, by itself, now. Pure like the rest of the engine: the present, the fresh etcd
//! probe and the autopilot's own bookkeeping come in as values; the acting (etcd maintenance
//! calls, the Machine deletion through the webhook, Events) is an adapter's.
//!
//! The autopilot does exactly the published next action of a cluster, nothing else, and only
//! these four ([`Kind`]): `PromoteLearner`, `RemoveOrphanMember`, `FreeSpace` (a plan of steps,
//! one per decision: [`free_space`]) and the `DeleteMachine` of cluster-api #2651. Before every
//! step it asks the engine again on a probe taken just before acting ([`EtcdBasis::FreshProbe`]):
//! the next action worked out on that probe must be the published one, and the step must be
//! proven safe on it (`proof.rs`). After the step, the next probe must show what the proof
//! predicted ([`Book::settle`]).
//!
//! Which mode wins, the `serve --autopilot` flag or a KCP's `quorumguard.io/autopilot`
//! annotation: the more restrictive ([`Mode::effective`]). The flag is what the operator who
//! runs quorumguard granted (its RBAC, its etcd credentials); an annotation, which anyone who
//! may edit that one KCP can set, can only lower it for that cluster, never raise it. So the
//! flag `off` is the kill switch: it stops every action at the next sweep, whatever the
//! annotations say.

mod book;
pub mod free_space;
mod proof;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

pub use book::{Book, InFlight, Outcome, Seen};
pub use free_space::Progress;

use crate::decide::EtcdBasis;
use crate::model::{ControlPlane, MemberId, Policy};
use crate::next_action::{ActionCode, NextAction, next_action, rfc3339};
use crate::quorum;

/// The annotation on a KubeadmControlPlane that sets the autopilot's mode for its cluster.
pub const ANNOTATION_AUTOPILOT: &str = "quorumguard.io/autopilot";

/// How much the autopilot does, from the least to the most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Nothing.
    Off,
    /// Says what it would do and when, and does nothing.
    DryRun,
    /// Carries the action out.
    On,
}

impl Mode {
    /// `off`, `dry-run` or `on`.
    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim() {
            "off" => Some(Mode::Off),
            "dry-run" => Some(Mode::DryRun),
            "on" => Some(Mode::On),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::DryRun => "dry-run",
            Mode::On => "on",
        }
    }

    /// The mode for one cluster: the more restrictive of the `--autopilot` flag and the KCP's
    /// annotation (absent: the flag's). An annotation that does not read as a mode counts as
    /// `off`: a typo never turns the autopilot on.
    pub fn effective(flag: Mode, annotation: Option<&str>) -> Mode {
        match annotation {
            None => flag,
            Some(a) => flag.min(Mode::parse(a).unwrap_or(Mode::Off)),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The actions the autopilot may take: each is one published next action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    PromoteLearner,
    RemoveMember,
    FreeSpace,
    DeleteMachine,
}

impl Kind {
    pub const ALL: [Kind; 4] = [
        Kind::PromoteLearner,
        Kind::RemoveMember,
        Kind::FreeSpace,
        Kind::DeleteMachine,
    ];

    /// The autopilot action that carries out a next action, if any.
    pub fn of(code: ActionCode) -> Option<Kind> {
        match code {
            ActionCode::PromoteLearner => Some(Kind::PromoteLearner),
            ActionCode::RemoveOrphanMember => Some(Kind::RemoveMember),
            ActionCode::FreeSpace => Some(Kind::FreeSpace),
            ActionCode::DeleteMachine => Some(Kind::DeleteMachine),
            _ => None,
        }
    }

    /// The name `--autopilot-actions` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::PromoteLearner => "promote-learner",
            Kind::RemoveMember => "remove-member",
            Kind::FreeSpace => "free-space",
            Kind::DeleteMachine => "delete-machine",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s.trim())
    }
}

/// The autopilot's knobs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `--autopilot-actions`: the actions it may take (default: all four).
    pub actions: BTreeSet<Kind>,
    /// `--autopilot-interval` (default 5m): at most one action per cluster per interval.
    /// Minutes, not seconds: each action is followed by KCP's, kubeadm's and the Machine
    /// controller's own reconciles (KCP's run every few seconds to 3 minutes), and by at least
    /// one probe sweep that re-proves it. The steps of one `FreeSpace` plan are one action: they
    /// follow each other at each sweep, after their health check.
    pub interval: Duration,
    /// The wait after a failed action (default 10m), doubled for each further failure in a
    /// row, at most [`Settings::max_back_off`].
    pub back_off: Duration,
    pub max_back_off: Duration,
    /// Failures in a row of the same action after which the autopilot stops repeating it
    /// (default 3) until the published action changes or a person resets it.
    pub give_up_after: u32,
    /// How long a `RemoveOrphanMember` must have stood before the autopilot removes the
    /// member (default 3m): KCP's own clean-up goes first. KCP versions with cluster-api
    /// #13685 remove members no Machine claims, unnamed ones included, in
    /// `reconcileEtcdMembers` (controlplane/kubeadm/reconcilers/kubeadmcontrolplane/
    /// kubeadmcontrolplane_controller.go: once no Machine is provisioning, one member per
    /// reconcile, requeued after 1 s); 3 minutes is KCP's reconcile deadline, so a KCP that
    /// does it has done it by then.
    pub kcp_chance: Duration,
    /// The most raft entries a learner may be behind its leader to be promoted (default 5000),
    /// beside etcd's own 90 % rule: for a leader at index 10,000,000, 90 % lets a learner
    /// 1,000,000 entries behind through. 5000 is etcd's `--snapshot-catchup-entries` default:
    /// what the leader keeps in its log for a slow follower, so a learner within it catches up
    /// from the log, without a snapshot transfer.
    pub max_learner_lag: u64,
    /// `--quota-backend-bytes` of the members (kubeadm keeps etcd's default, 2 GiB): NOSPACE is
    /// disarmed only when every member's database is under it.
    pub quota_backend_bytes: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            actions: Kind::ALL.into_iter().collect(),
            interval: Duration::from_secs(300),
            back_off: Duration::from_secs(600),
            max_back_off: Duration::from_secs(4 * 3600),
            give_up_after: 3,
            kcp_chance: Duration::from_secs(180),
            max_learner_lag: 5000,
            quota_backend_bytes: 2 * 1024 * 1024 * 1024,
        }
    }
}

/// What one decision reads.
#[derive(Clone, Copy, Debug)]
pub struct Situation<'a> {
    /// The cluster's mode ([`Mode::effective`]).
    pub mode: Mode,
    pub settings: &'a Settings,
    pub policy: &'a Policy,
    /// The next action published for the cluster (on the record of the latest sweep).
    pub published: &'a NextAction,
    /// The control plane with etcd as a probe taken just now shows it (read with
    /// [`crate::fresh_view`], or [`crate::failed_view`] when that probe failed).
    pub fresh: &'a ControlPlane,
    /// Where `fresh`'s etcd comes from: anything but a fresh probe is refused.
    pub basis: EtcdBasis,
    pub book: &'a Book,
    pub now_unix: i64,
}

/// One step the autopilot carries out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// `etcdctl member promote ID`.
    Promote { member: MemberId, name: String },
    /// `etcdctl member remove ID`.
    RemoveMember { member: MemberId, name: String },
    /// `kubectl delete machine`, through the webhook as the autopilot's own identity.
    DeleteMachine { machine: String },
    /// Compact the history up to the current revision.
    Compact,
    /// Defragment one member (it answers nothing meanwhile); `db_size`: its database's size on
    /// the probe that proved the step, to tell afterwards whether it freed anything.
    Defragment {
        member: MemberId,
        name: String,
        db_size: Option<u64>,
    },
    /// Hand leadership to `to`, a member already defragmented.
    MoveLeader { from: MemberId, to: MemberId },
    /// `etcdctl alarm disarm`.
    Disarm,
}

impl Step {
    pub fn kind(&self) -> Kind {
        match self {
            Step::Promote { .. } => Kind::PromoteLearner,
            Step::RemoveMember { .. } => Kind::RemoveMember,
            Step::DeleteMachine { .. } => Kind::DeleteMachine,
            Step::Compact | Step::Defragment { .. } | Step::MoveLeader { .. } | Step::Disarm => {
                Kind::FreeSpace
            }
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Promote { member, name } => write!(f, "promote learner {name} (id {member})"),
            Step::RemoveMember { member, name } => {
                write!(f, "remove etcd member {name} (id {member})")
            }
            Step::DeleteMachine { machine } => write!(f, "delete Machine {machine}"),
            Step::Compact => f.write_str("compact etcd's history"),
            Step::Defragment { member, name, .. } => {
                write!(f, "defragment etcd member {name} (id {member})")
            }
            Step::MoveLeader { from, to } => {
                write!(f, "move etcd's leadership from {from} to {to}")
            }
            Step::Disarm => f.write_str("disarm the NOSPACE alarm"),
        }
    }
}

/// Voting members, healthy ones and the quorum, as a proof states them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Count {
    pub voting: usize,
    pub healthy: usize,
}

impl Count {
    pub fn quorum(self) -> usize {
        quorum::quorum(self.voting)
    }

    pub fn keeps_quorum(self) -> bool {
        self.voting > 0 && self.healthy >= self.quorum()
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} healthy of {} voting members, quorum {}",
            self.healthy,
            self.voting,
            self.quorum()
        )
    }
}

/// What the fresh probe shows before the step, and what it will show after it (for a
/// defragmentation: while it runs, the member counted down).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Proof {
    pub before: Count,
    pub after: Count,
}

/// A step proven safe, with the words of its Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Act {
    pub step: Step,
    pub proof: Proof,
    pub message: String,
}

/// Why the autopilot does not act.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Why {
    /// The cluster's mode is `off`.
    Off,
    /// The published next action is none the autopilot carries out.
    NotAnAutopilotAction,
    /// `--autopilot-actions` leaves it out.
    ActionNotAllowed,
    /// The paused Cluster or KCP (`clusterctl move` pauses it while it moves the Cluster).
    Paused,
    /// Its etcd view is not a probe taken for this decision.
    NotFresh,
    /// The fresh probe has no member list, or a voting member's health is unknown.
    HealthUnknown,
    QuorumLost,
    LeaderElection,
    /// An earlier action on this cluster is not re-proven yet.
    InFlight,
    /// `--autopilot-interval` has not passed since the last action.
    Interval,
    /// A failure: the back-off has not passed.
    BackOff,
    /// The same action failed `give_up_after` times in a row.
    GaveUp,
    /// The next action on the fresh probe is not the published one.
    Disagrees,
    /// KCP's own clean-up goes first.
    KcpChance,
    /// The fresh probe does not prove the step safe, or its preconditions do not hold.
    NotProven,
    /// A CORRUPT alarm: no space is freed (that member's data is wrong; replace it).
    Corrupt,
    /// The member to defragment has not applied the plan's compaction yet: defragmenting it
    /// now would free nothing. A wait: the member applies it as it catches up.
    CompactionNotApplied,
}

/// A refusal, with the words of its Event; `until` when only time stands in the way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub why: Why,
    pub message: String,
    pub until_unix: Option<i64>,
}

/// The autopilot's answer for one cluster at one sweep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Act(Act),
    /// `dry-run`: the step it would take, and when (now, or when the interval, the back-off
    /// or KCP's chance runs out).
    DryRun {
        act: Act,
        at_unix: i64,
        message: String,
    },
    Refuse(Refusal),
}

/// Decides, for one cluster, whether the autopilot carries out its published next action now.
pub fn decide(s: &Situation<'_>) -> Decision {
    let kcp = s.fresh.kcp_shown();
    let refuse = |why: Why, message: String| {
        Decision::Refuse(Refusal {
            why,
            message,
            until_unix: None,
        })
    };
    if s.mode == Mode::Off {
        return refuse(
            Why::Off,
            format!(
                "Autopilot is off for KubeadmControlPlane {kcp}: it takes no action. Next: the published next action ({}) is for a person, or set --autopilot and annotation {ANNOTATION_AUTOPILOT} to dry-run or on.",
                s.published.code
            ),
        );
    }
    let Some(kind) = Kind::of(s.published.code) else {
        return refuse(
            Why::NotAnAutopilotAction,
            format!(
                "Autopilot leaves KubeadmControlPlane {kcp} alone: its next action, {}, is none it carries out (it promotes learners, removes members no Machine claims, frees space after NOSPACE and deletes the Machine of cluster-api #2651). Next: {}",
                s.published.code, s.published.message
            ),
        );
    };
    if !s.settings.actions.contains(&kind) {
        return refuse(
            Why::ActionNotAllowed,
            format!(
                "Autopilot does not {} on KubeadmControlPlane {kcp}: --autopilot-actions leaves {} out. Next, by hand: {}",
                s.published.code,
                kind.as_str(),
                s.published.message
            ),
        );
    }
    match proof::check(s, kind) {
        Ok(act) => timed(s, act),
        Err(r) => Decision::Refuse(r),
    }
}

/// The step proven safe, held to the bookkeeping's clocks (the interval, the back-off), and in
/// `dry-run` said instead of done.
fn timed(s: &Situation<'_>, act: Act) -> Decision {
    let wait = s.book.wait(s, &act.step);
    match (s.mode, wait) {
        (Mode::On, None) => Decision::Act(act),
        (Mode::On, Some(r)) => Decision::Refuse(r),
        (_, Some(r)) if r.until_unix.is_none() => Decision::Refuse(r),
        (_, wait) => {
            let at_unix = wait.and_then(|r| r.until_unix).unwrap_or(s.now_unix);
            let message = format!(
                "Autopilot (dry-run) would {} on KubeadmControlPlane {} at {}: {}",
                act.step,
                s.fresh.kcp_shown(),
                rfc3339(at_unix),
                act.message
            );
            Decision::DryRun {
                act,
                at_unix,
                message,
            }
        }
    }
}

/// The next action on the fresh probe, which must be the published one.
fn agrees(s: &Situation<'_>) -> Result<NextAction, Refusal> {
    let fresh = next_action(s.fresh, s.policy, s.now_unix);
    let same_target =
        s.published.code == ActionCode::FreeSpace || fresh.target == s.published.target;
    if fresh.code == s.published.code && same_target {
        return Ok(fresh);
    }
    Err(Refusal {
        why: Why::Disagrees,
        message: format!(
            "Autopilot does not act on KubeadmControlPlane {}: the published next action is {} {}, but on etcd probed just now it is {} {}. Next: the next sweep publishes the action for etcd as it is now, and the autopilot decides again: {}",
            s.fresh.kcp_shown(),
            s.published.code,
            s.published.target.as_deref().unwrap_or("-"),
            fresh.code,
            fresh.target.as_deref().unwrap_or("-"),
            fresh.message
        ),
        until_unix: None,
    })
}
