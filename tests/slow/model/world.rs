//! The model's state: the truth (API objects, etcd), the KCP controller's memory, the guard's
//! lagging view (its watch cache and its record of the latest probe) and its reservations, what
//! is left of each bound, and the ghost variables the properties read. Plus the views the guard
//! builds from it for the real engine: [`State::enricher_view`] and [`State::webhook_view`].

use std::collections::BTreeMap;
use std::time::Duration;

use quorumguard::admission::reservations::ReplicaReservation;
use quorumguard::engine::autopilot::Book;
use quorumguard::engine::etcd_version::{AddMemberRule, member_add_refusal};
use quorumguard::engine::kcp::{KcpMachine, MemberFit};
use quorumguard::engine::{
    ANNOTATION_REMEDIATE, Belief, Cluster, ControlPlane, EtcdSnapshot, EtcdState, EtcdTopology,
    Health, HealthCheck, HealthChecks, Kcp, Machine, Member, failed_view,
};

/// The present, as Unix seconds, for every engine call. The model has no clock: a Machine is
/// young (created within `--join-grace`) until [`crate::model::steps::Action::GraceExpires`].
pub const NOW: i64 = 1_800_000_000;
const YOUNG: i64 = NOW - 60;
const OLD: i64 = NOW - 86_400;

/// Which KCP to imitate, as the playground's simulated controller does (crates/playground/src/kcp.rs).
/// Either way a refused remediation ends KCP's reconcile (Cluster API v1.14's order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Style {
    /// KCP v0.3: a new member joins voting (counted before it has started); scale-down removes
    /// the member first, then deletes the Machine (cluster-api #2651 between the two).
    V03,
    /// Current KCP: a learner joins and is promoted; scale-down deletes the Machine and the
    /// pre-terminate hook removes the member.
    Current,
}

/// The KCP's `spec.version` the guard reads for a style, so that the engine's join style
/// (`ControlPlane::join_style`, crates/engine/src/joins.rs) is the one the model's kubeadm
/// follows: kubeadm v1.28 joins voting (`EtcdLearnerMode` off by default before v1.29), v1.32
/// joins a learner (the gate GA, locked on). A rollout changes the patch version.
pub fn kcp_version(style: Style, version: u8) -> String {
    match style {
        Style::V03 => format!("v1.28.{version}"),
        Style::Current => format!("v1.32.{version}"),
    }
}

/// A control-plane Machine as the API server holds it (and the guard's cache, lagging).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mach {
    /// Its name is `m{slot}`, and so are its node's and its member's. Never reused.
    pub slot: u8,
    /// The KCP version it was made from (outdated when below the KCP's).
    pub version: u8,
    /// `status.nodeRef` is set (once its member has joined).
    pub node: bool,
    /// Created within `--join-grace` (and so within `--learner-grace`, which is longer).
    pub young: bool,
    /// Its `kubeadm join` stopped for good (cluster-api #13221, #13667): wherever it was, no
    /// member is added, started or promoted for it any more.
    pub stalled: bool,
    /// Its join has added its member: kubeadm adds it once, and a join whose member was
    /// removed does not add another (it fails waiting for it).
    pub member_added: bool,
    pub deleting: bool,
    /// Annotated `cluster.x-k8s.io/remediate-machine`.
    pub remediate: bool,
}

/// An etcd member as it truly is. Its ID is `slot + 1`, its name `m{slot}` once started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mem {
    pub slot: u8,
    pub learner: bool,
    /// Added but not started: it votes already (unless a learner), and has no name yet.
    pub started: bool,
    /// Its process runs (false: failed, frozen, its machine gone).
    pub up: bool,
}

/// What the guard's record of the latest probe says of a member's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Seen {
    Healthy,
    Unhealthy,
    /// Seen for the worse by one probe, not believed yet (the rules count it unknown).
    Unconfirmed,
    Unknown,
}

/// One member of the guard's record of the latest probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ViewMem {
    pub slot: u8,
    pub named: bool,
    pub learner: bool,
    pub seen: Seen,
}

/// An allowed deletion the cache may not show yet (crates/admission/src/reservations.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reserved {
    pub machine: Mach,
    pub seen_in_cache: bool,
}

/// What is left of each bound the exploration spends (`Default`: nothing left).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Left {
    pub failures: u8,
    pub probe_failures: u8,
    pub crashes: u8,
    pub person: u8,
    pub rollouts: u8,
    pub new_machines: u8,
    /// Members left behind: a join that stops, or a Machine that goes without its member.
    pub leftovers: u8,
}

/// One state of the whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub style: Style,
    /// What etcd's strict reconfiguration check asks before a member add: the rule of the
    /// etcd version the run plays (3.4.23 before PR #21641, 3.5.30 with it).
    pub etcd_add: AddMemberRule,
    // The API server: Machines (by slot) and the KCP's spec.replicas and version.
    pub machines: Vec<Mach>,
    pub replicas: u8,
    pub version: u8,
    /// spec.rollout.strategy.rollingUpdate.maxSurge: 1 adds a Machine before it deletes one in
    /// a rollout, 0 deletes first. Fixed for a run (the cache always shows it).
    pub max_surge: u8,
    // etcd.
    pub members: Vec<Mem>,
    /// The leader; `None` while electing (quorum holds) or without quorum.
    pub leader: Option<u8>,
    /// Probes taken during the current election.
    pub election_probes: u8,
    // The KCP controller.
    pub kcp_crashed: bool,
    /// KCP deletes this Machine next (lost in a crash): v0.3 has removed its member already;
    /// current KCP has picked it for a scale-down.
    pub kcp_deletes_next: Option<u8>,
    // The guard: its watch cache (lagging), its record of the latest probe and its belief.
    pub cache_machines: Vec<Mach>,
    pub cache_replicas: u8,
    pub cache_version: u8,
    /// `None` before the first probe that recorded members.
    pub view: Option<Vec<ViewMem>>,
    /// The latest probe failed: the record's health is unknown until one succeeds.
    pub probe_failed: bool,
    pub belief: Belief,
    /// The webhook's reservation of spec.replicas (`Reservations`' own rule).
    pub reserved_replicas: Option<ReplicaReservation>,
    pub reserved: Vec<Reserved>,
    // Bounds.
    pub left: Left,
    /// etcd changes since the latest probe.
    pub unprobed: u8,
    pub next_slot: u8,
    // Ghosts, read by the properties only.
    /// Deleting Machines whose deletion was allowed without proof: by the unknown-health
    /// policy (the fresh probe could not tell), or a member failed since the answer.
    pub unproven: Vec<u8>,
    /// Healthy voting members removed (by proven deletions) since the latest failure.
    pub removed_since_failure: u8,
    /// Probes since one found etcd truly without quorum (saturating).
    pub probes_since_lost: u8,
    /// The step that lost quorum although no failure excuses it.
    pub lost_by: Option<String>,
    /// A MachineHealthCheck covers the control plane's Machines (its selector takes every
    /// control-plane Machine, so new ones too; it never short-circuits). Without one KCP
    /// remediates nothing (Cluster API v1.14: only what a MachineHealthCheck marked). The guard
    /// sees it at once (its watch's lag is not modelled).
    pub health_check: bool,
    /// The autopilot's bookkeeping (`None`: the run has no autopilot).
    pub autopilot: Option<Book>,
    /// Ghost: Machines the autopilot deleted that are still there (its steps under way).
    pub ap_deleting: Vec<u8>,
    /// Ghost: an autopilot step taken while another of its steps was under way.
    pub ap_overlap: Option<String>,
}

pub fn name(slot: u8) -> String {
    format!("m{slot}")
}

/// quorum(V) = V/2 + 1.
pub fn quorum(voting: usize) -> usize {
    voting / 2 + 1
}

impl State {
    /// `n` healthy members on `n` Machines, `n` replicas, the guard synced and probed.
    pub fn converged(
        style: Style,
        etcd_add: AddMemberRule,
        n: u8,
        max_surge: u8,
        left: Left,
    ) -> State {
        let machines: Vec<Mach> = (0..n)
            .map(|slot| Mach {
                slot,
                version: 0,
                node: true,
                young: false,
                stalled: false,
                member_added: true,
                deleting: false,
                remediate: false,
            })
            .collect();
        let members: Vec<Mem> = (0..n)
            .map(|slot| Mem {
                slot,
                learner: false,
                started: true,
                up: true,
            })
            .collect();
        State {
            style,
            etcd_add,
            cache_machines: machines.clone(),
            machines,
            replicas: n,
            version: 0,
            max_surge,
            view: Some(
                members
                    .iter()
                    .map(|m| ViewMem {
                        slot: m.slot,
                        named: true,
                        learner: false,
                        seen: Seen::Healthy,
                    })
                    .collect(),
            ),
            members,
            leader: Some(0),
            election_probes: 0,
            kcp_crashed: false,
            kcp_deletes_next: None,
            cache_replicas: n,
            cache_version: 0,
            probe_failed: false,
            belief: Belief::default(),
            reserved_replicas: None,
            reserved: Vec::new(),
            left,
            unprobed: 0,
            next_slot: n,
            unproven: Vec::new(),
            removed_since_failure: 0,
            probes_since_lost: u8::MAX,
            lost_by: None,
            health_check: true,
            autopilot: None,
            ap_deleting: Vec::new(),
            ap_overlap: None,
        }
    }

    pub fn machine(&self, slot: u8) -> Option<&Mach> {
        self.machines.iter().find(|m| m.slot == slot)
    }

    pub fn machine_mut(&mut self, slot: u8) -> Option<&mut Mach> {
        self.machines.iter_mut().find(|m| m.slot == slot)
    }

    /// The slots of the Machines being deleted.
    pub fn deleting(&self) -> Vec<u8> {
        self.machines
            .iter()
            .filter(|m| m.deleting)
            .map(|m| m.slot)
            .collect()
    }

    pub fn member(&self, slot: u8) -> Option<&Mem> {
        self.members.iter().find(|m| m.slot == slot)
    }

    pub fn member_mut(&mut self, slot: u8) -> Option<&mut Mem> {
        self.members.iter_mut().find(|m| m.slot == slot)
    }

    pub fn voting(&self) -> usize {
        self.members.iter().filter(|m| !m.learner).count()
    }

    pub fn healthy(&self) -> usize {
        self.members
            .iter()
            .filter(|m| !m.learner && m.started && m.up)
            .count()
    }

    /// Whether etcd truly has quorum: enough voting members started and up.
    pub fn has_quorum(&self) -> bool {
        self.voting() > 0 && self.healthy() >= quorum(self.voting())
    }

    /// Whether etcd adds a member now: with quorum, and as its strict reconfiguration check
    /// (on by default) of the run's etcd version allows, with the engine's own rule
    /// ([`member_add_refusal`]): before PR #21641 only while every voting member is connected
    /// (none down or never started), with it while a quorum of the voting members and the new
    /// one is; a voting add (kubeadm without learner mode) also needs a quorum of started
    /// members once it is in.
    pub fn may_add_member(&self) -> bool {
        let voting = self.members.iter().filter(|m| !m.learner);
        let started = voting.clone().filter(|m| m.started).count();
        let connected = voting.clone().filter(|m| m.started && m.up).count();
        self.has_quorum()
            && member_add_refusal(
                self.etcd_add,
                voting.count(),
                started,
                connected,
                self.style == Style::Current,
            )
            .is_none()
    }

    /// The etcd version the run plays, as a probe reports it.
    pub fn etcd_version(&self) -> &'static str {
        match self.etcd_add {
            AddMemberRule::EveryVotingMemberConnected => "3.4.23",
            AddMemberRule::ConnectedQuorum => "3.5.30",
        }
    }

    /// Objects the cache shows differently from the API server.
    pub fn cache_lag(&self) -> usize {
        let mut slots: Vec<u8> = self.machines.iter().map(|m| m.slot).collect();
        slots.extend(self.cache_machines.iter().map(|m| m.slot));
        slots.sort_unstable();
        slots.dedup();
        let machines = slots
            .iter()
            .filter(|s| self.machine(**s) != self.cached(**s))
            .count();
        machines + usize::from((self.replicas, self.version) != self.kcp_cached())
    }

    pub fn cached(&self, slot: u8) -> Option<&Mach> {
        self.cache_machines.iter().find(|m| m.slot == slot)
    }

    pub fn kcp_cached(&self) -> (u8, u8) {
        (self.cache_replicas, self.cache_version)
    }

    /// A member the guard's record shows healthy is down in truth: a failure it has not seen.
    pub fn unseen_failure(&self) -> bool {
        !self.probe_failed
            && self
                .view
                .iter()
                .flatten()
                .any(|v| v.seen == Seen::Healthy && self.member(v.slot).is_some_and(|m| !m.up))
    }

    /// The guard's record lists other members than etcd has: a member removed or added since
    /// the latest probe, or a changed member list not confirmed yet (the record holds both
    /// lists until a second probe).
    pub fn unconfirmed_membership(&self) -> bool {
        let recorded: Vec<u8> = self.view.iter().flatten().map(|v| v.slot).collect();
        let truth: Vec<u8> = self.members.iter().map(|m| m.slot).collect();
        self.view.is_some() && recorded != truth
    }

    /// The Machines as KCP's reconcile reads them (`kcp::reconcile`), oldest first (slots are
    /// never reused), each with the fit of its true etcd member (KCP reads the truth, not the
    /// guard's record), and how many members no Machine claims.
    ///
    /// Without quorum every member reads as unhealthy: KCP's etcd health check
    /// (v1.14 `workload_cluster_conditions.go`, `getCurrentEtcdMembersAndAlarms`) reads the
    /// member list and the alarms through one member, and the alarm list needs quorum; when it
    /// fails, every Machine's `EtcdMemberHealthy` is False or Unknown. (Reading each member
    /// alone, as if its own health were known, let the scale-down preflight, which leaves its
    /// victim out, pass on a live member of a cluster without quorum: KCP then picked the
    /// victim, the guard refused it, and KCP picked it again, for ever.)
    pub fn kcp_machines(&self) -> (Vec<KcpMachine>, u32) {
        let quorum = self.has_quorum();
        let machines = self
            .machines
            .iter()
            .map(|m| KcpMachine {
                key: u32::from(m.slot),
                outdated: m.version < self.version,
                node: m.node,
                deleting: m.deleting,
                remediate: m.remediate && self.health_check,
                delete_first: false,
                member: match self.member(m.slot) {
                    _ if !quorum => MemberFit::Unhealthy,
                    None => MemberFit::Missing,
                    Some(x) if !x.started || !x.up => MemberFit::Unhealthy,
                    Some(x) if x.learner => MemberFit::Learner,
                    Some(_) => MemberFit::Healthy,
                },
            })
            .collect();
        let orphans = self
            .members
            .iter()
            .filter(|x| self.machine(x.slot).is_none())
            .count();
        (machines, u32::try_from(orphans).unwrap_or(u32::MAX))
    }

    /// The control plane as the status enricher sees it: the cache and the latest probe.
    pub fn enricher_view(&self) -> ControlPlane {
        let mut cp = control_plane(
            self.style,
            self.cache_machines.iter().map(engine_machine).collect(),
            self.cache_replicas,
            self.cache_version,
            self.max_surge,
            self.etcd_view(),
        );
        cp.health_checks = HealthChecks::Known(if self.health_check {
            vec![HealthCheck::covering("kcp-mhc", &cp.machines)]
        } else {
            Vec::new()
        });
        cp
    }

    /// The control plane as the webhook judges a review on it: the enricher's view with the
    /// reservations applied (as `Reservations::apply` does), and the reservations left after
    /// dropping those the cache now shows or has seen completed.
    pub fn webhook_view(
        &self,
        reservations: bool,
    ) -> (ControlPlane, Option<ReplicaReservation>, Vec<Reserved>) {
        let mut cp = self.enricher_view();
        if !reservations {
            return (cp, None, Vec::new());
        }
        let held = self
            .reserved_replicas
            .and_then(|r| Some((r, r.holds(u32::from(self.cache_replicas))?)));
        if let Some((_, to)) = held {
            cp.kcp.replicas = cp.kcp.replicas.max(to);
        }
        let replicas = held.map(|(r, _)| r);
        let kept: Vec<Reserved> = self
            .reserved
            .iter()
            .filter(|r| match self.cached(r.machine.slot) {
                Some(m) => !m.deleting,
                None => !r.seen_in_cache,
            })
            .copied()
            .collect();
        for r in &kept {
            let n = name(r.machine.slot);
            match cp.machines.iter_mut().find(|m| m.name == n) {
                Some(m) => m.deleting = true,
                None => {
                    let mut m = engine_machine(&r.machine);
                    m.deleting = true;
                    cp.machines.push(m);
                }
            }
        }
        (cp, replicas, kept)
    }

    fn etcd_view(&self) -> EtcdState {
        if self.view.is_none() {
            return EtcdState::Unknown {
                reason: "no etcd probe of this cluster yet".into(),
            };
        }
        let members = self.record_members();
        // As serve's record does after a failed probe (crates/observe/src/state/probes.rs): the
        // member list stays, health seen healthy is unknown, bad news stays.
        observed(if self.probe_failed {
            failed_view(&members)
        } else {
            members
        })
    }

    /// The members of the guard's record as the engine holds them, each with the health the
    /// record gives it (the latest probe's failure aside): what the guard passes to
    /// `Belief::judge_against`, `fresh_view` and `failed_view`. Empty before the first probe.
    pub fn record_members(&self) -> Vec<Member> {
        self.view
            .iter()
            .flatten()
            .map(|v| {
                let mut m = Member::new(
                    u64::from(v.slot) + 1,
                    if v.named { name(v.slot) } else { String::new() },
                );
                m.is_learner = v.learner;
                m.version = v.named.then(|| self.etcd_version().to_string());
                m.health = match v.seen {
                    Seen::Unknown => Health::Unknown,
                    Seen::Healthy => Health::Healthy,
                    Seen::Unhealthy => Health::Unhealthy("seen unhealthy".into()),
                    Seen::Unconfirmed => Health::Unconfirmed("seen once".into()),
                };
                m
            })
            .collect()
    }

    /// A member of the record, back from the engine's words.
    pub fn record(members: &[Member]) -> Vec<ViewMem> {
        let mut v: Vec<ViewMem> = members
            .iter()
            .map(|m| ViewMem {
                slot: u8::try_from(m.id.0 - 1).expect("model member IDs are small"),
                named: !m.name.is_empty(),
                learner: m.is_learner,
                seen: match m.health {
                    Health::Healthy => Seen::Healthy,
                    Health::Unhealthy(_) => Seen::Unhealthy,
                    Health::Unconfirmed(_) => Seen::Unconfirmed,
                    Health::Unknown => Seen::Unknown,
                },
            })
            .collect();
        v.sort_by_key(|m| m.slot);
        v
    }
}

/// etcd as a probe just taken shows it.
pub fn observed(members: Vec<Member>) -> EtcdState {
    EtcdState::Observed(EtcdSnapshot {
        members,
        age: Some(Duration::ZERO),
    })
}

/// The engine's Machine for a model Machine.
pub fn engine_machine(m: &Mach) -> Machine {
    let mut annotations = BTreeMap::new();
    if m.remediate {
        annotations.insert(ANNOTATION_REMEDIATE.to_string(), String::new());
    }
    let n = name(m.slot);
    Machine {
        node_name: m.node.then(|| n.clone()),
        name: n,
        deleting: m.deleting,
        control_plane: true,
        annotations,
        created_unix: Some(if m.young { YOUNG } else { OLD }),
        health_check_failed: false,
    }
}

pub fn control_plane(
    style: Style,
    machines: Vec<Machine>,
    replicas: u8,
    version: u8,
    max_surge: u8,
    etcd: EtcdState,
) -> ControlPlane {
    ControlPlane {
        cluster: Cluster {
            name: "c".into(),
            deleting: false,
            paused: false,
        },
        kcp: Kcp {
            name: "kcp".into(),
            namespace: "ns".into(),
            replicas: u32::from(replicas),
            etcd: EtcdTopology::Stacked,
            max_surge: u32::from(max_surge),
            deleting: false,
            version: Some(kcp_version(style, version)),
            etcd_learner_mode: None,
            paused: false,
        },
        machines,
        etcd,
        health_checks: HealthChecks::Known(Vec::new()),
    }
}
