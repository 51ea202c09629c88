//! The engine's picture of one control plane: what the webhook, the prober and `check` all build,
//! so that every entry point is judged by the same rules.
//!
//! Values here are plain data: no I/O, no clocks. Ages and "now" are passed in by the adapters.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Annotation that asks KCP to remediate (replace) a Machine: the safe manual path.
pub const ANNOTATION_REMEDIATE: &str = "cluster.x-k8s.io/remediate-machine";
/// Annotation that makes KCP prefer a Machine when scaling down.
pub const ANNOTATION_DELETE_MACHINE: &str = "cluster.x-k8s.io/delete-machine";
/// Annotation that pauses the reconcilers of an object (Cluster API `clusterv1.PausedAnnotation`).
pub const ANNOTATION_PAUSED: &str = "cluster.x-k8s.io/paused";
/// Annotation clusterctl sets on objects it is moving to another management cluster.
pub const ANNOTATION_DELETE_FOR_MOVE: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
/// quorumguard's break-glass annotation; its value must say why.
pub const ANNOTATION_BREAK_GLASS: &str = "quorumguard.io/allow-unsafe-delete";
/// Label every control-plane Machine carries.
pub const LABEL_CONTROL_PLANE: &str = "cluster.x-k8s.io/control-plane";
/// Label naming the Cluster a Machine belongs to.
pub const LABEL_CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";
/// Label naming the KubeadmControlPlane a Machine belongs to.
pub const LABEL_CONTROL_PLANE_NAME: &str = "cluster.x-k8s.io/control-plane-name";

/// etcd's member ID. Shown in hex, as `etcdctl member list` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemberId(pub u64);

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// What a probe (or a dump) says of one member's health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// The error text the probe saw, so a human can act on it.
    Unhealthy(String),
    /// Not probed, or the probe is too old to trust.
    Unknown,
    /// The latest probe saw this member worse than the probe before it, and a change for the
    /// worse is not believed until a second probe confirms it (see [`super::confirm`]): counted as
    /// unknown. The text says what the probe saw and why it is not believed yet (e.g. "leader
    /// election in progress").
    Unconfirmed(String),
}

impl Health {
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

/// [`Health`] borrowed from the member it describes. Every decision counts every member's
/// health (and the webhook decides on every review): reading it this way costs no allocation,
/// where cloning each error text, or formatting each alarm, just to count it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthRef<'a> {
    Healthy,
    Unhealthy(Unfit<'a>),
    /// Unknown, with the reason when there is one ([`Health::Unconfirmed`]).
    Unknown(Option<&'a str>),
}

/// Why a member is unhealthy, as [`Health::Unhealthy`] words it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unfit<'a> {
    /// Added to the member list but never started.
    NotStarted,
    /// A CORRUPT alarm.
    Alarm(&'a Alarm),
    /// The error text the probe saw.
    Error(&'a str),
}

impl fmt::Display for Unfit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unfit::NotStarted => f.write_str("member added but not started"),
            Unfit::Alarm(a) => write!(f, "alarm {a}"),
            Unfit::Error(e) => f.write_str(e),
        }
    }
}

impl HealthRef<'_> {
    pub fn is_healthy(self) -> bool {
        matches!(self, HealthRef::Healthy)
    }

    pub fn to_health(self) -> Health {
        match self {
            HealthRef::Healthy => Health::Healthy,
            HealthRef::Unhealthy(why) => Health::Unhealthy(why.to_string()),
            HealthRef::Unknown(None) => Health::Unknown,
            HealthRef::Unknown(Some(why)) => Health::Unconfirmed(why.to_string()),
        }
    }
}

impl<'a> From<&'a Health> for HealthRef<'a> {
    fn from(h: &'a Health) -> Self {
        match h {
            Health::Healthy => HealthRef::Healthy,
            Health::Unhealthy(e) => HealthRef::Unhealthy(Unfit::Error(e)),
            Health::Unknown => HealthRef::Unknown(None),
            Health::Unconfirmed(why) => HealthRef::Unknown(Some(why)),
        }
    }
}

/// An etcd alarm raised on a member. CORRUPT makes a member unhealthy; NOSPACE stops writes
/// but not raft (see [`Member::effective_health`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Alarm {
    NoSpace,
    Corrupt,
    Other(String),
}

impl fmt::Display for Alarm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Alarm::NoSpace => f.write_str("NOSPACE"),
            Alarm::Corrupt => f.write_str("CORRUPT"),
            Alarm::Other(s) => f.write_str(s),
        }
    }
}

/// One etcd member as the member list and per-endpoint status report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: MemberId,
    /// Empty while the member has been added but has not started: it votes already.
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
    pub health: Health,
    pub is_leader: bool,
    pub version: Option<String>,
    pub db_size: Option<u64>,
    pub raft_term: Option<u64>,
    /// The raft index this member's committed index stood at (etcd's `raftIndex`).
    pub raft_index: Option<u64>,
    /// The last raft entry this member has applied to its database (etcd's `raftAppliedIndex`,
    /// reported since etcd 3.4): a write is in its database once this reaches the write's entry.
    pub raft_applied_index: Option<u64>,
    pub alarms: Vec<Alarm>,
}

impl Member {
    /// A member with only its identity known; health unknown until a probe says otherwise.
    pub fn new(id: u64, name: impl Into<String>) -> Self {
        Member {
            id: MemberId(id),
            name: name.into(),
            peer_urls: Vec::new(),
            client_urls: Vec::new(),
            is_learner: false,
            health: Health::Unknown,
            is_leader: false,
            version: None,
            db_size: None,
            raft_term: None,
            raft_index: None,
            raft_applied_index: None,
            alarms: Vec::new(),
        }
    }

    /// Whether the member has been added but never started (etcd reports no name for it).
    pub fn is_unstarted(&self) -> bool {
        self.name.is_empty()
    }

    /// Health as the quorum rules must see it: an unstarted member cannot be healthy, and a
    /// CORRUPT alarm makes a member unfit whatever its endpoint answers (its data is wrong). A
    /// NOSPACE alarm does not: it stops every member's writes, but raft keeps its quorum, and
    /// members, learners and leadership still change (docs/rules.md, what NOSPACE does); the
    /// next action frees the space ([`crate::next_action()`]'s `FreeSpace`).
    pub fn effective_health(&self) -> Health {
        self.effective_health_ref().to_health()
    }

    /// [`Member::effective_health`] without copying the error text.
    pub fn effective_health_ref(&self) -> HealthRef<'_> {
        if self.is_unstarted() {
            return HealthRef::Unhealthy(Unfit::NotStarted);
        }
        if let Some(alarm) = self.alarms.iter().find(|a| matches!(a, Alarm::Corrupt)) {
            return HealthRef::Unhealthy(Unfit::Alarm(alarm));
        }
        HealthRef::from(&self.health)
    }

    /// The name used in messages: unstarted members have none, so use the ID.
    pub fn display_name(&self) -> String {
        self.shown_name().to_string()
    }

    /// [`Member::display_name`], written straight into the message that shows it.
    pub fn shown_name(&self) -> impl fmt::Display + '_ {
        ShownName(self)
    }
}

struct ShownName<'a>(&'a Member);

impl fmt::Display for ShownName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_unstarted() {
            write!(f, "(unstarted {})", self.0.id)
        } else {
            f.write_str(&self.0.name)
        }
    }
}

/// Where the KCP's etcd lives. Only stacked members are ours to protect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EtcdTopology {
    Stacked,
    External,
}

/// The KubeadmControlPlane, reduced to what the rules read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kcp {
    pub name: String,
    pub namespace: String,
    /// `spec.replicas`: what KCP converges to.
    pub replicas: u32,
    pub etcd: EtcdTopology,
    /// `spec.rollout.strategy.rollingUpdate.maxSurge`: 1 adds before deleting, 0 deletes first.
    pub max_surge: u32,
    pub deleting: bool,
    /// `spec.version`: the Kubernetes (and kubeadm) version of the Machines KCP creates.
    pub version: Option<String>,
    /// Annotated `cluster.x-k8s.io/paused`: KCP reconciles nothing of it (Cluster API v1.14
    /// `util/paused/paused.go` `EnsurePausedCondition`, by `annotations.HasPaused`).
    pub paused: bool,
    /// kubeadm's `EtcdLearnerMode` feature gate where
    /// `kubeadmConfigSpec.clusterConfiguration.featureGates` sets it: with the version, it
    /// decides whether a join adds a learner or a voting member ([`crate::joins`]).
    pub etcd_learner_mode: Option<bool>,
}

/// The owning Cluster, reduced to what the rules read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    pub deleting: bool,
    /// `spec.paused`: the controllers of every object of the Cluster (KCP, its
    /// MachineHealthChecks, the Machine controller) reconcile nothing (v1.14
    /// `util/annotations/helpers.go` `IsPaused`). `clusterctl move` sets it on purpose while it
    /// moves the Cluster (`cmd/clusterctl/client/cluster/mover.go` `setClusterPause`).
    pub paused: bool,
}

/// A control-plane Machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub name: String,
    /// `status.nodeRef.name`: by kubeadm convention also the etcd member name.
    pub node_name: Option<String>,
    pub deleting: bool,
    /// Carries the `cluster.x-k8s.io/control-plane` label.
    pub control_plane: bool,
    pub annotations: BTreeMap<String, String>,
    /// Creation time as Unix seconds.
    pub created_unix: Option<i64>,
    /// A MachineHealthCheck counted it unhealthy at its last reconcile: its condition
    /// `HealthCheckSucceeded` (v1beta2 `MachineHealthCheckSucceededCondition`) or
    /// `OwnerRemediated` is False. v1.14 `needsRemediation` sets `HealthCheckSucceeded` False on
    /// every target it counts unhealthy, `healthCheckTargets` sets it True only on those it counts
    /// healthy, and `patchUnhealthyTargets` sets `OwnerRemediated` False on those it passes on.
    pub health_check_failed: bool,
}

impl Machine {
    /// A control-plane Machine with a node of the same name, not deleting, no annotations.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Machine {
            node_name: Some(name.clone()),
            name,
            deleting: false,
            control_plane: true,
            annotations: BTreeMap::new(),
            created_unix: None,
            health_check_failed: false,
        }
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// A member list with per-member health, as one probe sweep or one set of dumps saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdSnapshot {
    pub members: Vec<Member>,
    /// How old the probe is. `None` for offline dumps, which are taken as the present.
    pub age: Option<Duration>,
}

/// What is known of the workload cluster's etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcdState {
    /// No member list: never probed, or the probe failed. The reason says which.
    Unknown {
        reason: String,
    },
    Observed(EtcdSnapshot),
}

/// One control plane: the objects of one KCP and its etcd, as every entry point builds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPlane {
    pub cluster: Cluster,
    pub kcp: Kcp,
    pub machines: Vec<Machine>,
    pub etcd: EtcdState,
    /// The MachineHealthChecks that may pass a remediation on to KCP ([`crate::remediation`]).
    pub health_checks: HealthChecks,
}

/// What is known of the MachineHealthChecks of a control plane's Cluster. In Cluster API KCP
/// replaces only a Machine that a MachineHealthCheck marked (`OwnerRemediated`), and the
/// `cluster.x-k8s.io/remediate-machine` annotation is read by the MachineHealthCheck reconciler
/// only (v1.14 `core/reconcilers/machinehealthcheck/machinehealthcheck_targets.go`,
/// `needsRemediation`): without one that covers a Machine, the annotation does nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthChecks {
    /// Not read (e.g. the guard may not list them, or a dump has none of that kind and says
    /// nothing of them): whether remediation can happen is not known. The reason says which.
    Unknown { reason: String },
    /// Read: the MachineHealthChecks of the Cluster that target at least one Machine of this
    /// control plane (empty: none does).
    Known(Vec<HealthCheck>),
}

/// One MachineHealthCheck, reduced to what decides whether it passes a remediation on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// Its name (in the KubeadmControlPlane's namespace, as its `spec.clusterName` requires).
    pub name: String,
    /// The Machines of this control plane it targets: its `spec.selector` and
    /// `spec.clusterName` match them, and they carry neither `cluster.x-k8s.io/paused` nor
    /// `cluster.x-k8s.io/skip-remediation` (v1.14 `getTargetsFromMHC`, `shouldSkipRemediation`).
    pub targets: Vec<String>,
    /// Annotated `cluster.x-k8s.io/paused`: its reconciler does nothing.
    pub paused: bool,
    /// When it allows remediation at all (its short-circuit).
    pub trigger: Trigger,
    /// `status.expectedMachines` and `status.expectedMachines - status.currentHealthy` as it
    /// last reported them; `None` before it has reported (then the targets here and those
    /// annotated for remediation are counted instead).
    pub counts: Option<HealthCheckCounts>,
}

/// What a MachineHealthCheck counted at its last reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthCheckCounts {
    /// Every Machine it targets (workers too, when its selector takes them).
    pub expected: u32,
    /// Those not counted healthy: unhealthy, marked for remediation, or not started yet.
    pub unhealthy: u32,
}

/// A MachineHealthCheck's short-circuit (v1.14 `isAllowedRemediation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// v1beta2 `spec.remediation.triggerIf.unhealthyLessThanOrEqualTo` (v1beta1
    /// `spec.maxUnhealthy`), default 100%: remediation only while at most this many targets
    /// are unhealthy.
    AtMost(Limit),
    /// v1beta2 `spec.remediation.triggerIf.unhealthyInRange` (v1beta1 `spec.unhealthyRange`),
    /// `[min-max]`: remediation only while the unhealthy count is within.
    InRange { min: u32, max: u32 },
}

/// A number of Machines, or a percentage of the targets (rounded down, as
/// `intstr.GetScaledValueFromIntOrPercent(.., false)` does in `getMaxUnhealthy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Count(u32),
    Percent(u32),
}

impl HealthCheck {
    /// A MachineHealthCheck named `name` that targets every one of `machines` and never
    /// short-circuits (the default trigger, 100%), before its first count.
    pub fn covering<'a>(name: &str, machines: impl IntoIterator<Item = &'a Machine>) -> Self {
        HealthCheck {
            name: name.to_string(),
            targets: machines.into_iter().map(|m| m.name.clone()).collect(),
            paused: false,
            trigger: Trigger::default(),
            counts: None,
        }
    }
}

impl Default for Trigger {
    fn default() -> Self {
        Trigger::AtMost(Limit::Percent(100))
    }
}

/// Why KCP and the MachineHealthChecks of a control plane reconcile nothing now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Paused {
    /// The Cluster's `spec.paused` is true.
    Cluster,
    /// The KubeadmControlPlane carries annotation `cluster.x-k8s.io/paused`.
    Kcp,
    /// Both.
    Both,
}

impl ControlPlane {
    /// Whether KCP reconciles nothing now (v1.14 `EnsurePausedCondition(cluster, kcp)`: the
    /// Cluster's `spec.paused`, or the KCP's `cluster.x-k8s.io/paused` annotation). A paused
    /// Cluster pauses its MachineHealthChecks too.
    pub fn paused(&self) -> Option<Paused> {
        match (self.cluster.paused, self.kcp.paused) {
            (true, true) => Some(Paused::Both),
            (true, false) => Some(Paused::Cluster),
            (false, true) => Some(Paused::Kcp),
            (false, false) => None,
        }
    }

    pub fn machine(&self, name: &str) -> Option<&Machine> {
        self.machines.iter().find(|m| m.name == name)
    }

    /// The member that belongs to a Machine: member name == node name. A Machine whose nodeRef
    /// is not set yet may already have a member (kubeadm joins etcd before CAPI records the
    /// node); most providers name the node after the Machine, so fall back to the Machine name.
    pub fn member_of(&self, machine: &Machine) -> Option<&Member> {
        let name = machine.node_name.as_deref().unwrap_or(&machine.name);
        self.members()
            .iter()
            .find(|m| !m.is_unstarted() && m.name == name)
    }

    /// The Machine a member belongs to, if any (the inverse of [`ControlPlane::member_of`]).
    pub fn machine_of(&self, member: &Member) -> Option<&Machine> {
        if member.is_unstarted() {
            return None;
        }
        self.machines
            .iter()
            .find(|m| m.node_name.as_deref().unwrap_or(&m.name) == member.name)
    }

    /// The members, empty when etcd is unknown.
    pub fn members(&self) -> &[Member] {
        match &self.etcd {
            EtcdState::Observed(s) => &s.members,
            EtcdState::Unknown { .. } => &[],
        }
    }

    /// `namespace/name` of the KCP, for messages.
    pub fn kcp_ref(&self) -> String {
        self.kcp_shown().to_string()
    }

    /// [`ControlPlane::kcp_ref`], written straight into the message that names it: a message
    /// names the KCP up to three times, and each `kcp_ref` was a String of its own.
    pub fn kcp_shown(&self) -> impl fmt::Display + '_ {
        NsName(&self.kcp.namespace, &self.kcp.name)
    }
}

/// `namespace/name`, written where it is shown.
pub(crate) struct NsName<'a>(pub &'a str, pub &'a str);

impl fmt::Display for NsName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)?;
        f.write_str("/")?;
        f.write_str(self.1)
    }
}

/// Who asks for an operation (admission `userInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requester {
    pub username: String,
    pub groups: Vec<String>,
}

impl Requester {
    pub fn new(username: impl Into<String>) -> Self {
        Requester {
            username: username.into(),
            groups: Vec::new(),
        }
    }
}

/// What to do when the health needed to prove an operation safe is unknown or stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnUnknownHealth {
    Deny,
    /// Allow with a warning: for controllers that run their own checks before removing a member.
    Allow,
}

/// The default KCP controller service account.
pub const DEFAULT_KCP_CONTROLLER: &str =
    "system:serviceaccount:capi-kubeadm-control-plane-system:capi-kubeadm-control-plane-manager";

/// Identities that tear whole clusters down and must never be blocked (domain.md).
pub const DEFAULT_TEARDOWN: [&str; 3] = [
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:kube-controller-manager",
    "system:serviceaccount:kube-system:namespace-controller",
];

/// Knobs of the rules, with defaults an operator would expect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Control-plane controllers: exempt from the desired-replicas rule, never from quorum.
    pub controllers: Vec<String>,
    /// Teardown identities: always allowed.
    pub teardown: Vec<String>,
    pub unknown_health_humans: OnUnknownHealth,
    pub unknown_health_controllers: OnUnknownHealth,
    /// A probe older than this is treated as unknown health.
    pub max_health_age: Duration,
    /// How long a new Machine may have a node but no etcd member before it counts as broken.
    pub join_grace: Duration,
    /// How long after its Machine was created a learner may stay a learner (catching up, then
    /// promoted by kubeadm) before it counts as stalled: then it is promoted by hand or its
    /// Machine is replaced.
    pub learner_grace: Duration,
    /// The control plane was read from dumps (`check`, offline `preflight`), not from a live
    /// etcd: advice names new dumps, never a probe the guard cannot take.
    pub offline: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            controllers: vec![DEFAULT_KCP_CONTROLLER.to_string()],
            teardown: DEFAULT_TEARDOWN.iter().map(|s| s.to_string()).collect(),
            unknown_health_humans: OnUnknownHealth::Deny,
            unknown_health_controllers: OnUnknownHealth::Allow,
            max_health_age: Duration::from_secs(60),
            join_grace: Duration::from_secs(600),
            learner_grace: Duration::from_secs(900),
            offline: false,
        }
    }
}

impl Policy {
    pub fn is_controller(&self, r: &Requester) -> bool {
        self.controllers.contains(&r.username)
    }

    /// What unknown health means for this requester: controllers and humans have their own
    /// setting.
    pub fn on_unknown_health(&self, r: &Requester) -> OnUnknownHealth {
        if self.is_controller(r) {
            self.unknown_health_controllers
        } else {
            self.unknown_health_humans
        }
    }

    pub fn is_teardown(&self, r: &Requester) -> bool {
        self.teardown.contains(&r.username)
    }
}
