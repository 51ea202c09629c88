//! Operation -> Verdict: whether a Machine deletion or a KCP change keeps etcd quorum and the
//! KCP's desired replicas, and what to tell the person who asked.

use std::fmt;

use super::model::*;
use super::next_action::{NextAction, next_action};
use super::quorum::{self, Safety, Tally, quorum};

/// What someone asks to do to a control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Delete this Machine. The value is the Machine as the request carries it; it stands in for
    /// the cached one of the same name (the cache may lag behind).
    DeleteMachine(Machine),
    /// Change the KCP: `spec.replicas` from -> to (equal when unchanged), and whether the change
    /// starts a rollout (version, kubeadmConfigSpec or machineTemplate changed).
    UpdateKcp {
        replicas_from: u32,
        replicas_to: u32,
        starts_rollout: bool,
    },
}

/// Stable reason codes. Their string form is part of the API (audit annotations, JSON output,
/// metrics labels): never rename one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    // Always allowed.
    NotControlPlane,
    AlreadyDeleting,
    ClusterDeleting,
    ControlPlaneDeleting,
    ClusterctlMove,
    TeardownRequester,
    BreakGlass,
    ExternalEtcd,
    // Allowed because the rules hold.
    MemberAbsent,
    LearnerMember,
    QuorumSafe,
    NoReplicaChange,
    ScaleDownSafe,
    ScaleUpSafe,
    SingleMemberScaleUp,
    RolloutAllowed,
    // Denied (or allowed with a warning, for HealthUnknown under a permissive policy).
    WouldLoseQuorum,
    LastMember,
    PendingDeletions,
    PendingJoin,
    QuorumLost,
    HealthUnknown,
    BelowDesiredReplicas,
    ScaleDownWouldLoseQuorum,
    ScaleUpWouldLoseQuorum,
}

impl Reason {
    /// Every reason, for documentation and exhaustive tests.
    pub const ALL: [Reason; 25] = [
        Reason::NotControlPlane,
        Reason::AlreadyDeleting,
        Reason::ClusterDeleting,
        Reason::ControlPlaneDeleting,
        Reason::ClusterctlMove,
        Reason::TeardownRequester,
        Reason::BreakGlass,
        Reason::ExternalEtcd,
        Reason::MemberAbsent,
        Reason::LearnerMember,
        Reason::QuorumSafe,
        Reason::NoReplicaChange,
        Reason::ScaleDownSafe,
        Reason::ScaleUpSafe,
        Reason::SingleMemberScaleUp,
        Reason::RolloutAllowed,
        Reason::WouldLoseQuorum,
        Reason::LastMember,
        Reason::PendingDeletions,
        Reason::PendingJoin,
        Reason::QuorumLost,
        Reason::HealthUnknown,
        Reason::BelowDesiredReplicas,
        Reason::ScaleDownWouldLoseQuorum,
        Reason::ScaleUpWouldLoseQuorum,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotControlPlane => "NotControlPlane",
            Reason::AlreadyDeleting => "AlreadyDeleting",
            Reason::ClusterDeleting => "ClusterDeleting",
            Reason::ControlPlaneDeleting => "ControlPlaneDeleting",
            Reason::ClusterctlMove => "ClusterctlMove",
            Reason::TeardownRequester => "TeardownRequester",
            Reason::BreakGlass => "BreakGlass",
            Reason::ExternalEtcd => "ExternalEtcd",
            Reason::MemberAbsent => "MemberAbsent",
            Reason::LearnerMember => "LearnerMember",
            Reason::QuorumSafe => "QuorumSafe",
            Reason::NoReplicaChange => "NoReplicaChange",
            Reason::ScaleDownSafe => "ScaleDownSafe",
            Reason::ScaleUpSafe => "ScaleUpSafe",
            Reason::SingleMemberScaleUp => "SingleMemberScaleUp",
            Reason::RolloutAllowed => "RolloutAllowed",
            Reason::WouldLoseQuorum => "WouldLoseQuorum",
            Reason::LastMember => "LastMember",
            Reason::PendingDeletions => "PendingDeletions",
            Reason::PendingJoin => "PendingJoin",
            Reason::QuorumLost => "QuorumLost",
            Reason::HealthUnknown => "HealthUnknown",
            Reason::BelowDesiredReplicas => "BelowDesiredReplicas",
            Reason::ScaleDownWouldLoseQuorum => "ScaleDownWouldLoseQuorum",
            Reason::ScaleUpWouldLoseQuorum => "ScaleUpWouldLoseQuorum",
        }
    }

    /// Reasons that allow without looking at quorum at all (teardown, moves, break-glass...).
    pub fn is_unconditional(self) -> bool {
        matches!(
            self,
            Reason::NotControlPlane
                | Reason::AlreadyDeleting
                | Reason::ClusterDeleting
                | Reason::ControlPlaneDeleting
                | Reason::ClusterctlMove
                | Reason::TeardownRequester
                | Reason::BreakGlass
                | Reason::ExternalEtcd
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The quorum figures before and after an operation. `healthy` counts only members known to be
/// healthy; `unknown` those whose health is unknown or stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Figures {
    pub voting: usize,
    pub healthy: usize,
    pub unknown: usize,
    pub quorum: usize,
    pub tolerance: i64,
    pub voting_after: usize,
    pub healthy_after: usize,
    pub quorum_after: usize,
    pub tolerance_after: i64,
}

impl Figures {
    fn new(before: Tally, after: Tally) -> Figures {
        Figures {
            voting: before.voting(),
            healthy: before.healthy,
            unknown: before.unknown,
            quorum: quorum(before.voting()),
            tolerance: quorum::tolerance(before.voting(), before.healthy),
            voting_after: after.voting(),
            healthy_after: after.healthy,
            quorum_after: quorum(after.voting()),
            tolerance_after: quorum::tolerance(after.voting(), after.healthy),
        }
    }

    /// "now voting 3, healthy 2, quorum 2, fault tolerance 0; after: voting 2, healthy 1, quorum 2, fault tolerance -1"
    pub fn sentence(&self) -> String {
        self.shown().to_string()
    }

    /// [`Figures::sentence`], written straight into the message that quotes it.
    pub fn shown(&self) -> impl fmt::Display + '_ {
        Sentence(self)
    }
}

struct Sentence<'a>(&'a Figures);

impl fmt::Display for Sentence<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        write!(f, "now voting {}, healthy {}", s.voting, s.healthy)?;
        if s.unknown > 0 {
            write!(f, ", health unknown {}", s.unknown)?;
        }
        write!(
            f,
            ", quorum {}, fault tolerance {}; after: voting {}, healthy {}, quorum {}, fault tolerance {}",
            s.quorum,
            s.tolerance,
            s.voting_after,
            s.healthy_after,
            s.quorum_after,
            s.tolerance_after
        )
    }
}

/// The answer to one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub reason: Reason,
    /// Names the objects and the numbers, and for a denial the safe next step.
    pub message: String,
    pub warnings: Vec<String>,
    /// Absent when quorum did not enter the decision (unconditional allows, unknown etcd).
    pub figures: Option<Figures>,
    pub next_action: NextAction,
}

/// A verdict without the next action: what the webhook answers with ([`admit`]), and what
/// `next_action` itself evaluates with. A denial's message still ends with the next safe action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judgement {
    pub allowed: bool,
    pub reason: Reason,
    pub message: String,
    pub warnings: Vec<String>,
    pub figures: Option<Figures>,
}

impl Judgement {
    fn allow(reason: Reason, message: String) -> Judgement {
        Judgement {
            allowed: true,
            reason,
            message,
            warnings: Vec::new(),
            figures: None,
        }
    }

    fn deny(reason: Reason, message: String) -> Judgement {
        Judgement {
            allowed: false,
            reason,
            message,
            warnings: Vec::new(),
            figures: None,
        }
    }

    fn with_figures(mut self, f: Figures) -> Judgement {
        self.figures = Some(f);
        self
    }
}

/// Decides one operation. `now_unix` is the present as Unix seconds (for the next action's
/// join grace); the snapshot's own age decides whether its health is stale.
pub fn decide(
    cp: &ControlPlane,
    op: &Operation,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
) -> Verdict {
    let mut j = judge(cp, op, requester, policy, now_unix);
    let next = next_action(cp, policy, now_unix);
    if !j.allowed {
        append_next_action(&mut j.message, &next);
    }
    Verdict {
        allowed: j.allowed,
        reason: j.reason,
        message: j.message,
        warnings: j.warnings,
        figures: j.figures,
        next_action: next,
    }
}

/// [`decide`] for the webhook: the same allowed, reason, message, warnings and figures, but the
/// next action is worked out only for a denial, whose message ends with it. An admission
/// response carries no next action, and most reviews are allowed: working it out for every
/// one of them was a third of a decision's time (`cargo bench --bench core -- decision`).
pub fn admit(
    cp: &ControlPlane,
    op: &Operation,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
) -> Judgement {
    let j = match op {
        Operation::DeleteMachine(m) => return admit_deletion(cp, m, requester, policy, now_unix),
        Operation::UpdateKcp { .. } => judge(cp, op, requester, policy, now_unix),
    };
    with_next_action_if_denied(j, cp, policy, now_unix)
}

/// [`admit`] of deleting `m`, a Machine the caller holds by reference: the webhook's decoded
/// review owns it, and an [`Operation`] would own a clone of it (its annotations too).
pub fn admit_deletion(
    cp: &ControlPlane,
    m: &Machine,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
) -> Judgement {
    let j = with_tolerance_warning(
        cp,
        judge_delete(cp, m, requester, policy, now_unix, Words::All),
    );
    with_next_action_if_denied(j, cp, policy, now_unix)
}

fn with_next_action_if_denied(
    mut j: Judgement,
    cp: &ControlPlane,
    policy: &Policy,
    now_unix: i64,
) -> Judgement {
    if !j.allowed {
        append_next_action(&mut j.message, &next_action(cp, policy, now_unix));
    }
    j
}

fn append_next_action(message: &mut String, next: &NextAction) {
    message.push_str(" Next safe action: ");
    message.push_str(&next.message);
}

/// Which messages a judgement needs. `next_action` asks only whether a deletion would be
/// allowed, and a quorum verdict that the desired-replicas rule then overrules is never shown:
/// an allowed judgement's message and warnings are not written for either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Words {
    All,
    DenialsOnly,
}

/// The decision without the next action (which itself asks this function). `now_unix` tells a
/// Machine still joining from one that never will.
pub(crate) fn judge(
    cp: &ControlPlane,
    op: &Operation,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
) -> Judgement {
    match op {
        Operation::DeleteMachine(m) => with_tolerance_warning(
            cp,
            judge_delete(cp, m, requester, policy, now_unix, Words::All),
        ),
        Operation::UpdateKcp {
            replicas_from,
            replicas_to,
            starts_rollout,
        } => with_tolerance_warning(
            cp,
            judge_update(
                cp,
                *replicas_from,
                *replicas_to,
                *starts_rollout,
                requester,
                policy,
            ),
        ),
    }
}

/// An allowed change that leaves etcd without fault tolerance says so.
fn with_tolerance_warning(cp: &ControlPlane, mut j: Judgement) -> Judgement {
    if j.allowed
        && !j.reason.is_unconditional()
        && let Some(f) = j.figures
        && f.tolerance_after == 0
        && f.voting_after > 0
    {
        j.warnings.push(format!(
            "after this, etcd of KubeadmControlPlane {} has no fault tolerance (voting {}, healthy {}, quorum {}): one more member failure loses quorum",
            cp.kcp_shown(),
            f.voting_after,
            f.healthy_after,
            f.quorum_after
        ));
    }
    j
}

fn is_stale(cp: &ControlPlane, policy: &Policy) -> bool {
    match &cp.etcd {
        EtcdState::Observed(s) => s.age.is_some_and(|a| a > policy.max_health_age),
        EtcdState::Unknown { .. } => true,
    }
}

/// "name (id 3, learner, unhealthy: ...)": a member as messages name it.
fn describe_member(m: &Member, stale: bool) -> MemberDesc<'_> {
    MemberDesc { m, stale }
}

/// [`describe_member`], written straight into the message.
struct MemberDesc<'a> {
    m: &'a Member,
    stale: bool,
}

impl fmt::Display for MemberDesc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (m, stale) = (self.m, self.stale);
        write!(f, "{} (id {}", m.shown_name(), m.id)?;
        if m.is_learner {
            f.write_str(", learner")?;
        }
        match quorum::effective_ref(m, stale) {
            HealthRef::Healthy => f.write_str(", healthy)"),
            HealthRef::Unhealthy(e) => write!(f, ", unhealthy: {e})"),
            HealthRef::Unknown(_) if stale && !m.health.eq(&Health::Unknown) => {
                f.write_str(", health stale)")
            }
            HealthRef::Unknown(Some(why)) => write!(f, ", health unknown: {why})"),
            HealthRef::Unknown(None) => f.write_str(", health unknown)"),
        }
    }
}

/// " Not healthy: a (id 1, ...), b (...)." naming the voting members that are not known to be
/// healthy, or nothing when all are; written where a message shows it.
fn not_healthy_list(cp: &ControlPlane, stale: bool) -> NotHealthy<'_> {
    NotHealthy { cp, stale }
}

struct NotHealthy<'a> {
    cp: &'a ControlPlane,
    stale: bool,
}

impl fmt::Display for NotHealthy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stale = self.stale;
        let mut names = self
            .cp
            .members()
            .iter()
            .filter(|m| !m.is_learner && !quorum::effective_ref(m, stale).is_healthy());
        let Some(first) = names.next() else {
            return Ok(());
        };
        write!(f, " Not healthy: {}", describe_member(first, stale))?;
        for m in names {
            write!(f, ", {}", describe_member(m, stale))?;
        }
        f.write_str(".")
    }
}

/// The outcome when safety cannot be proven: deny, or allow with a warning, per policy.
fn unknown_health(
    what: &dyn fmt::Display,
    detail: &dyn fmt::Display,
    requester: &Requester,
    policy: &Policy,
    figures: Option<Figures>,
) -> Judgement {
    let msg = format!(
        "cannot prove that {what} is safe: {detail} Wait for a fresh etcd probe, or check etcd with `etcdctl endpoint health --cluster`."
    );
    let mut j = match policy.on_unknown_health(requester) {
        OnUnknownHealth::Deny => Judgement::deny(Reason::HealthUnknown, msg),
        OnUnknownHealth::Allow => {
            let mut j = Judgement::allow(Reason::HealthUnknown, msg.clone());
            j.warnings.push(format!(
                "allowed without proof of safety (policy for {}): {msg}",
                requester.username
            ));
            j
        }
    };
    j.figures = figures;
    j
}

fn unknown_etcd_detail(cp: &ControlPlane) -> String {
    match &cp.etcd {
        EtcdState::Unknown { reason } => format!(
            "the etcd member list of KubeadmControlPlane {} is unknown ({reason}).",
            cp.kcp_shown()
        ),
        EtcdState::Observed(s) => format!(
            "the etcd health of KubeadmControlPlane {} is {}.",
            cp.kcp_shown(),
            match s.age {
                Some(a) => format!("{}s old", a.as_secs()),
                None => "not known".into(),
            }
        ),
    }
}

/// "Machine ns/name", "deleting Machine ns/name": an object as messages name it, written where
/// it is shown.
struct Named<'a>(&'static str, &'a str, &'a str);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)?;
        f.write_str(" ")?;
        NsName(self.1, self.2).fmt(f)
    }
}

/// The decision on deleting `m`, a Machine the caller holds by reference (no [`Operation`] to
/// build, so no Machine to clone). With [`Words::DenialsOnly`], only `allowed` may be read of
/// an allowed judgement.
pub(crate) fn judge_delete(
    cp: &ControlPlane,
    m: &Machine,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
    words: Words,
) -> Judgement {
    let what = Named("Machine", &cp.kcp.namespace, &m.name);
    if !m.control_plane {
        return Judgement::allow(
            Reason::NotControlPlane,
            format!("{what} is not a control-plane Machine"),
        );
    }
    if m.deleting {
        return Judgement::allow(
            Reason::AlreadyDeleting,
            format!("{what} is already being deleted"),
        );
    }
    if cp.cluster.deleting {
        return Judgement::allow(
            Reason::ClusterDeleting,
            format!("Cluster {} is being deleted", cp.cluster.name),
        );
    }
    if cp.kcp.deleting {
        return Judgement::allow(
            Reason::ControlPlaneDeleting,
            format!("KubeadmControlPlane {} is being deleted", cp.kcp_shown()),
        );
    }
    if m.annotation(ANNOTATION_DELETE_FOR_MOVE).is_some() {
        return Judgement::allow(
            Reason::ClusterctlMove,
            format!("{what} is being moved by clusterctl ({ANNOTATION_DELETE_FOR_MOVE})"),
        );
    }
    if policy.is_teardown(requester) {
        return Judgement::allow(
            Reason::TeardownRequester,
            format!(
                "{} is a teardown identity; deletion of {what} is not blocked",
                requester.username
            ),
        );
    }
    let j = judge_delete_rules(cp, m, requester, policy, now_unix, words);
    let break_glass = m.annotation(ANNOTATION_BREAK_GLASS).map(str::trim);
    match break_glass {
        Some(why) if !j.allowed && !why.is_empty() => {
            let mut out = Judgement::allow(
                Reason::BreakGlass,
                format!(
                    "{what}: break-glass annotation {ANNOTATION_BREAK_GLASS} ({why:?}) overrides the guard"
                ),
            );
            out.warnings.push(format!(
                "break-glass used on {what} ({why:?}); without it this would be denied ({}): {}",
                j.reason, j.message
            ));
            out.figures = j.figures;
            out
        }
        Some("") if !j.allowed => {
            let mut j = j;
            j.message.push_str(&format!(
                " The annotation {ANNOTATION_BREAK_GLASS} is present but empty: it needs a reason as its value to take effect."
            ));
            j
        }
        _ => j,
    }
}

/// The quorum rule, then the desired-replicas rule.
fn judge_delete_rules(
    cp: &ControlPlane,
    m: &Machine,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
    words: Words,
) -> Judgement {
    // The desired-replicas rule has its say only when quorum allows. Its numbers come first, so
    // that a quorum verdict it overrules is not worded for nothing.
    let shortfall = if policy.is_controller(requester) {
        None
    } else {
        replicas_shortfall(cp, m)
    };
    let quorum_words = if shortfall.is_some() {
        Words::DenialsOnly
    } else {
        words
    };
    let quorum_j = judge_delete_quorum(cp, m, requester, policy, now_unix, quorum_words);
    match shortfall {
        Some(s) if quorum_j.allowed => s.denial(cp, m).with_figures_opt(quorum_j.figures),
        _ => quorum_j,
    }
}

impl Judgement {
    fn with_figures_opt(mut self, f: Option<Figures>) -> Judgement {
        self.figures = f;
        self
    }
}

/// Deleting a Machine would leave fewer working control-plane Machines than spec.replicas.
struct Shortfall {
    remaining: usize,
    desired: usize,
}

fn replicas_shortfall(cp: &ControlPlane, m: &Machine) -> Option<Shortfall> {
    // A Machine whose node is up but whose member is gone (cluster-api #2651) is not a control
    // plane KCP can count on: it does not make up for the one being deleted.
    let observed = matches!(cp.etcd, EtcdState::Observed(_));
    let remaining = cp
        .machines
        .iter()
        .filter(|o| o.control_plane && !o.deleting && o.name != m.name)
        .filter(|o| !(observed && o.node_name.is_some() && cp.member_of(o).is_none()))
        .count();
    let desired = cp.kcp.replicas as usize;
    if remaining >= desired {
        return None;
    }
    let never_joined = m.node_name.is_none()
        && matches!(cp.etcd, EtcdState::Observed(_))
        && cp.member_of(m).is_none();
    if never_joined {
        return None;
    }
    Some(Shortfall { remaining, desired })
}

impl Shortfall {
    fn denial(&self, cp: &ControlPlane, m: &Machine) -> Judgement {
        let Shortfall { remaining, desired } = *self;
        let ns = &cp.kcp.namespace;
        let mut message = format!(
            "deleting Machine {ns}/{} would leave {remaining} working control-plane Machines (with an etcd member, or still joining) of KubeadmControlPlane {}, fewer than its spec.replicas {desired}; KCP would have to create a replacement while this deletion is still pending. To replace this Machine safely, annotate it and let KCP do it: `kubectl annotate machine -n {ns} {} {ANNOTATION_REMEDIATE}=\"\"`",
            m.name,
            cp.kcp_shown(),
            m.name,
        );
        if let Some(to) = shrink_target(desired) {
            let tolerance = quorum::tolerance(to, to);
            message.push_str(&format!(
                "; to shrink the control plane, lower spec.replicas instead (KCP removes one Machine at a time; {to} members still tolerate {tolerance} failure{}): `kubectl scale kcp -n {ns} {} --replicas={to}`",
                if tolerance == 1 { "" } else { "s" },
                cp.kcp.name,
            ));
        }
        message.push('.');
        Judgement::deny(Reason::BelowDesiredReplicas, message)
    }
}

/// The smaller control plane a message may suggest instead of deleting a Machine of one with
/// `desired` replicas: two fewer (KCP's own webhook refuses even replica counts for stacked
/// etcd), and only while that keeps fault tolerance (3 members or more). Advice must never take
/// fault tolerance away: for 3 replicas (or 1) none is suggested, and remediation is the way.
pub(crate) fn shrink_target(desired: usize) -> Option<usize> {
    (desired >= 5).then(|| desired - 2)
}

fn judge_delete_quorum(
    cp: &ControlPlane,
    m: &Machine,
    requester: &Requester,
    policy: &Policy,
    now_unix: i64,
    words: Words,
) -> Judgement {
    let what = Named("deleting Machine", &cp.kcp.namespace, &m.name);
    // An allowed verdict's message, when one is wanted.
    let say = |message: &dyn Fn() -> String| match words {
        Words::All => message(),
        Words::DenialsOnly => String::new(),
    };
    if cp.kcp.etcd == EtcdTopology::External {
        return Judgement::allow(
            Reason::ExternalEtcd,
            format!(
                "KubeadmControlPlane {} uses external etcd: no stacked member to protect",
                cp.kcp_shown()
            ),
        );
    }
    if let EtcdState::Unknown { .. } = cp.etcd {
        return unknown_health(&what, &unknown_etcd_detail(cp), requester, policy, None);
    }
    let stale = is_stale(cp, policy);
    let Some(member) = cp.member_of(m) else {
        return Judgement::allow(
            Reason::MemberAbsent,
            say(&|| {
                format!(
                    "Machine {}/{} has no etcd member (removed already, or never joined): quorum of KubeadmControlPlane {} is unaffected",
                    cp.kcp.namespace,
                    m.name,
                    cp.kcp_shown()
                )
            }),
        );
    };
    if member.is_learner {
        return Judgement::allow(
            Reason::LearnerMember,
            say(&|| {
                format!(
                    "the etcd member of Machine {}/{} is a learner, which does not vote: quorum is unaffected",
                    cp.kcp.namespace, m.name
                )
            }),
        );
    }
    let members = cp.members();
    let before = Tally::of(members, stale);
    let mut alone = Tally::default();
    alone.count(quorum::effective_ref(member, stale));
    let after_alone = minus(before, alone);
    let figures = Figures::new(before, after_alone);
    let problems = not_healthy_list(cp, stale);
    if before.quorum_lost() {
        return Judgement::deny(
            Reason::QuorumLost,
            format!(
                "etcd of KubeadmControlPlane {} has lost quorum ({}).{problems} {what} would throw away a surviving member's data, which recovery needs. Restore quorum first: restore etcd from a snapshot (https://etcd.io/docs/v3.4/op-guide/recovery/), or, if you accept the risk, set the annotation {ANNOTATION_BREAK_GLASS}=<reason> on the Machine.",
                cp.kcp_shown(),
                figures.shown()
            ),
        )
        .with_figures(figures);
    }
    let member_desc = describe_member(member, stale);
    if after_alone.voting() == 0 {
        return Judgement::deny(
            Reason::LastMember,
            format!(
                "{what} would remove {member_desc}, the last etcd member of KubeadmControlPlane {}: etcd and its data would be gone ({}).",
                cp.kcp_shown(),
                figures.shown()
            ),
        )
        .with_figures(figures);
    }
    // Members of Machines already being deleted are on their way out too.
    let pending: Vec<&Member> = cp
        .machines
        .iter()
        .filter(|o| o.deleting && o.name != m.name)
        .filter_map(|o| cp.member_of(o))
        .filter(|p| !p.is_learner && p.id != member.id)
        .collect();
    let pending_tally = Tally::of(pending.iter().copied(), stale);
    let with_pending = Tally {
        healthy: pending_tally.healthy + alone.healthy,
        unhealthy: pending_tally.unhealthy + alone.unhealthy,
        unknown: pending_tally.unknown + alone.unknown,
    };
    let alone_safety = quorum::removal(before, alone);
    let pending_safety = quorum::removal(before, with_pending);
    // A deletion is judged by the risk it adds: the pending removals that are already unsafe
    // on their own (health changed after they were admitted) are not made safer by refusing it,
    // and removing an unhealthy member is then the way out. A member about to join counts as
    // well: it votes before it is healthy, in any order with the removals.
    let me_health = quorum::effective_ref(member, stale);
    let joining = pending_join(cp, m, policy, now_unix);
    let risk = quorum::added_risk(before, pending_tally, me_health, joining.is_some());
    let risk_without_join = match joining {
        Some(_) => quorum::added_risk(before, pending_tally, me_health, false),
        None => risk,
    };
    let pending_names = PendingNames {
        cp,
        pending: &pending,
        stale,
    };
    if alone_safety == Safety::Unsafe {
        return Judgement::deny(
            Reason::WouldLoseQuorum,
            format!(
                "{what} would lose etcd quorum of KubeadmControlPlane {}: it removes {member_desc}; {}.{problems}",
                cp.kcp_shown(),
                figures.shown()
            ),
        )
        .with_figures(figures);
    }
    if risk == Safety::Unsafe && risk_without_join != Safety::Unsafe {
        let join = joining.as_ref().map(|j| j.to_string()).unwrap_or_default();
        let left = minus(before, alone);
        return Judgement::deny(
            Reason::PendingJoin,
            format!(
                "{what} is not safe while a new etcd member is about to join: {join}. A new member votes before it is healthy, so once it is in and {member_desc} has gone: voting {}, healthy {}, quorum {} ({}).{problems} Wait for {}the new member to join and be healthy, then try again.",
                left.voting() + 1,
                left.healthy,
                quorum(left.voting() + 1),
                figures.shown(),
                if pending.is_empty() {
                    String::new()
                } else {
                    format!("the pending deletions ({pending_names}) to finish, ")
                }
            ),
        )
        .with_figures(figures);
    }
    if risk == Safety::Unsafe {
        let all = minus(before, with_pending);
        return Judgement::deny(
            Reason::PendingDeletions,
            format!(
                "{what} is not safe while other deletions are pending: {} still being deleted; if those members leave first, quorum of KubeadmControlPlane {} could be lost (after all of them: voting {}, healthy {}; {}).{problems} Wait for {} to finish, then try again.",
                pending_names,
                cp.kcp_shown(),
                all.voting(),
                all.healthy,
                figures.shown(),
                if pending.len() == 1 {
                    "that deletion"
                } else {
                    "those deletions"
                }
            ),
        )
        .with_figures(figures);
    }
    if risk == Safety::Unknown {
        let mut pending_note = if pending.is_empty() {
            String::new()
        } else {
            format!(" Deletions still pending: {pending_names}.")
        };
        if let Some(j) = &joining {
            pending_note.push_str(&format!(" A new member is about to join: {j}."));
        }
        return unknown_health(
            &what,
            &format!(
                "{}; it removes {member_desc}.{problems}{pending_note}",
                figures.shown()
            ),
            requester,
            policy,
            Some(figures),
        );
    }
    let mut j = Judgement::allow(
        Reason::QuorumSafe,
        say(&|| {
            format!(
                "{what} keeps etcd quorum of KubeadmControlPlane {}: it removes {member_desc}; {}",
                cp.kcp_shown(),
                figures.shown()
            )
        }),
    )
    .with_figures(figures);
    if pending_safety != Safety::Safe && words == Words::All {
        j.warnings.push(format!(
            "the pending deletions ({}) cannot all complete safely while members are unhealthy; removing the unhealthy member of Machine {}/{} first is the way out",
            pending_names,
            cp.kcp.namespace,
            m.name
        ));
    }
    j
}

/// Why a new voting member is about to join, which a deletion must be safe with.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Joining {
    /// This Machine is new (within the join grace) and has no member yet.
    Machine(String),
    /// Without the Machine being deleted, fewer Machines than spec.replicas: KCP adds one.
    Replicas { machines: usize, replicas: u32 },
}

impl fmt::Display for Joining {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Joining::Machine(name) => {
                write!(f, "Machine {name} is new and has no etcd member yet")
            }
            Joining::Replicas { machines, replicas } => write!(
                f,
                "the other Machines number {machines}, fewer than spec.replicas {replicas}, so KCP adds one"
            ),
        }
    }
}

/// A voting member about to join the etcd of `cp` while `m` is deleted: a young Machine without
/// a member (within `--join-grace`), or fewer Machines than spec.replicas without `m` (a
/// scale-up admitted, or a replacement for `m`). A join already under way is in the member list
/// (an unstarted member, a learner) and counted there; KCP adds one member at a time.
fn pending_join(cp: &ControlPlane, m: &Machine, policy: &Policy, now_unix: i64) -> Option<Joining> {
    if cp
        .members()
        .iter()
        .any(|x| x.is_unstarted() || x.is_learner)
    {
        return None;
    }
    let others: Vec<&Machine> = cp
        .machines
        .iter()
        .filter(|o| o.control_plane && !o.deleting && o.name != m.name)
        .collect();
    let grace = i64::try_from(policy.join_grace.as_secs()).unwrap_or(i64::MAX);
    if let Some(o) = others.iter().find(|o| {
        cp.member_of(o).is_none()
            && o.created_unix
                .is_some_and(|c| now_unix.saturating_sub(c) < grace)
    }) {
        return Some(Joining::Machine(o.name.clone()));
    }
    (others.len() < cp.kcp.replicas as usize).then_some(Joining::Replicas {
        machines: others.len(),
        replicas: cp.kcp.replicas,
    })
}

/// "Machine a (member a (id 1, healthy)), Machine b (...)": the deletions still pending.
struct PendingNames<'a> {
    cp: &'a ControlPlane,
    pending: &'a [&'a Member],
    stale: bool,
}

impl fmt::Display for PendingNames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.pending.iter().enumerate() {
            let machine = self.cp.machine_of(p).map_or("?", |x| x.name.as_str());
            let sep = if i == 0 { "" } else { ", " };
            write!(
                f,
                "{sep}Machine {machine} (member {})",
                describe_member(p, self.stale)
            )?;
        }
        Ok(())
    }
}

/// The voting members of Machines being deleted, tallied.
fn leaving_tally(cp: &ControlPlane, stale: bool) -> Tally {
    Tally::of(
        cp.machines
            .iter()
            .filter(|m| m.deleting)
            .filter_map(|m| cp.member_of(m))
            .filter(|x| !x.is_learner),
        stale,
    )
}

/// The membership left after removing `removed` (worst case: the pessimistic view).
fn minus(before: Tally, removed: Tally) -> Tally {
    Tally {
        healthy: before.healthy.saturating_sub(removed.healthy),
        unhealthy: before.unhealthy.saturating_sub(removed.unhealthy),
        unknown: before.unknown.saturating_sub(removed.unknown),
    }
}

fn judge_update(
    cp: &ControlPlane,
    from: u32,
    to: u32,
    starts_rollout: bool,
    requester: &Requester,
    policy: &Policy,
) -> Judgement {
    let kcp = cp.kcp_shown();
    if cp.cluster.deleting {
        return Judgement::allow(
            Reason::ClusterDeleting,
            format!("Cluster {} is being deleted", cp.cluster.name),
        );
    }
    if cp.kcp.deleting {
        return Judgement::allow(
            Reason::ControlPlaneDeleting,
            format!("KubeadmControlPlane {kcp} is being deleted"),
        );
    }
    if cp.kcp.etcd == EtcdTopology::External {
        return Judgement::allow(
            Reason::ExternalEtcd,
            format!("KubeadmControlPlane {kcp} uses external etcd: no stacked member to protect"),
        );
    }
    let mut j = if from == to {
        Judgement::allow(
            Reason::NoReplicaChange,
            format!("spec.replicas of KubeadmControlPlane {kcp} is unchanged ({to})"),
        )
    } else if let EtcdState::Unknown { .. } = cp.etcd {
        unknown_health(
            &format!("changing spec.replicas of KubeadmControlPlane {kcp} from {from} to {to}"),
            &unknown_etcd_detail(cp),
            requester,
            policy,
            None,
        )
    } else if to < from {
        judge_scale_down(cp, from, to, requester, policy)
    } else {
        judge_scale_up(cp, from, to, requester, policy)
    };
    if starts_rollout && j.allowed {
        if j.reason == Reason::NoReplicaChange {
            j.reason = Reason::RolloutAllowed;
            j.message = format!("the change to KubeadmControlPlane {kcp} starts a rollout");
        }
        if let Some(w) = rollout_warning(cp, policy) {
            j.warnings.push(w);
        }
    }
    j
}

/// A warning when the rollout's first step (add one with maxSurge 1, delete one with maxSurge
/// 0) would not be safe now: KCP will wait until it is.
fn rollout_warning(cp: &ControlPlane, policy: &Policy) -> Option<String> {
    let stale = is_stale(cp, policy);
    let before = Tally::of(cp.members(), stale);
    if matches!(cp.etcd, EtcdState::Unknown { .. }) {
        return Some(format!(
            "the rollout of KubeadmControlPlane {} starts while etcd health is unknown; quorumguard cannot say whether its first step is safe",
            cp.kcp_shown()
        ));
    }
    let (step, safety) = if cp.kcp.max_surge >= 1 {
        (
            "adding a new member (maxSurge 1)".to_string(),
            if before.voting() == 1 {
                Safety::Safe
            } else {
                quorum::addition(before)
            },
        )
    } else {
        let one_healthy = Tally {
            healthy: 1,
            ..Tally::default()
        };
        (
            "removing a member first (maxSurge 0)".to_string(),
            quorum::removal(before, one_healthy),
        )
    };
    (safety != Safety::Safe).then(|| {
        format!(
            "the rollout of KubeadmControlPlane {} starts with {step}, which is not safe right now (voting {}, healthy {}, quorum {}); KCP will not make progress until etcd is healthy.{}",
            cp.kcp_shown(),
            before.voting(),
            before.healthy,
            quorum(before.voting()),
            not_healthy_list(cp, stale)
        )
    })
}

/// How the health of a member is counted when picking the worst removal order.
fn worst_first_rank(h: HealthRef<'_>) -> u8 {
    match h {
        HealthRef::Healthy => 0,
        HealthRef::Unknown(_) => 1,
        HealthRef::Unhealthy(_) => 2,
    }
}

fn judge_scale_down(
    cp: &ControlPlane,
    from: u32,
    to: u32,
    requester: &Requester,
    policy: &Policy,
) -> Judgement {
    let kcp = cp.kcp_shown();
    let what = format!("scaling KubeadmControlPlane {kcp} from {from} to {to} replicas");
    let stale = is_stale(cp, policy);
    let before = Tally::of(cp.members(), stale);
    let active: Vec<&Machine> = cp
        .machines
        .iter()
        .filter(|m| m.control_plane && !m.deleting)
        .collect();
    let k = active.len().saturating_sub(to as usize);
    // KCP removes machines annotated delete-machine first; assume the worst for the rest.
    let mut candidates: Vec<(bool, u8, &Machine, Option<&Member>)> = active
        .iter()
        .map(|m| {
            let member = cp.member_of(m).filter(|x| !x.is_learner);
            let rank = member.map_or(3, |x| worst_first_rank(quorum::effective_ref(x, stale)));
            (
                m.annotation(ANNOTATION_DELETE_MACHINE).is_none(),
                rank,
                *m,
                member,
            )
        })
        .collect();
    candidates.sort_by(|a, b| (a.0, a.1, &a.2.name).cmp(&(b.0, b.1, &b.2.name)));
    let mut removed = Tally::default();
    let mut removed_names = Vec::new();
    for (_, _, m, member) in candidates.iter().take(k) {
        if let Some(x) = member {
            removed.count(quorum::effective_ref(x, stale));
        }
        removed_names.push(m.name.clone());
    }
    // Members of Machines already being deleted leave as well.
    let leaving = leaving_tally(cp, stale);
    removed.healthy += leaving.healthy;
    removed.unhealthy += leaving.unhealthy;
    removed.unknown += leaving.unknown;
    let after = minus(before, removed);
    let figures = Figures::new(before, after);
    let problems = not_healthy_list(cp, stale);
    if before.quorum_lost() {
        return Judgement::deny(
            Reason::QuorumLost,
            format!(
                "{what}: etcd has lost quorum ({}).{problems} Restore quorum first (restore etcd from a snapshot).",
                figures.shown()
            ),
        )
        .with_figures(figures);
    }
    let quorum_of_target = quorum(to as usize);
    let safety = match quorum::removal(before, removed) {
        Safety::Safe if after.healthy >= quorum_of_target => Safety::Safe,
        Safety::Safe | Safety::Unknown if after.optimistic() >= quorum_of_target => Safety::Unknown,
        _ => Safety::Unsafe,
    };
    let which = if removed_names.is_empty() {
        "no Machine".to_string()
    } else {
        format!("Machines {}", removed_names.join(", "))
    };
    match safety {
        Safety::Safe => Judgement::allow(
            Reason::ScaleDownSafe,
            format!(
                "{what} keeps etcd quorum even in the worst case (KCP removes {which}); {}",
                figures.shown()
            ),
        )
        .with_figures(figures),
        Safety::Unsafe => Judgement::deny(
            Reason::ScaleDownWouldLoseQuorum,
            format!(
                "{what} could lose etcd quorum: in the worst case KCP removes {which}, leaving {} healthy of {} voting members, quorum {} (and {quorum_of_target} for {to} replicas); {}.{problems} Make the unhealthy members healthy or remediate them first, or annotate the Machines to remove with {ANNOTATION_DELETE_MACHINE}.",
                after.healthy,
                after.voting(),
                quorum(after.voting()),
                figures.shown()
            ),
        )
        .with_figures(figures),
        Safety::Unknown => unknown_health(
            &what,
            &format!("{}.{problems}", figures.shown()),
            requester,
            policy,
            Some(figures),
        ),
    }
}

fn judge_scale_up(
    cp: &ControlPlane,
    from: u32,
    to: u32,
    requester: &Requester,
    policy: &Policy,
) -> Judgement {
    let kcp = cp.kcp_shown();
    let what = format!("scaling KubeadmControlPlane {kcp} from {from} to {to} replicas");
    let stale = is_stale(cp, policy);
    let before = Tally::of(cp.members(), stale);
    let after = Tally {
        unhealthy: before.unhealthy + 1,
        ..before
    };
    let figures = Figures::new(before, after);
    let problems = not_healthy_list(cp, stale);
    if before.quorum_lost() {
        return Judgement::deny(
            Reason::QuorumLost,
            format!(
                "{what}: etcd has lost quorum ({}).{problems} A new member cannot join; restore quorum first (restore etcd from a snapshot).",
                figures.shown()
            ),
        )
        .with_figures(figures);
    }
    // Members of Machines already being deleted may leave before the new member joins (KCP
    // waits for deletions to finish before it scales): the addition must also be safe after
    // the healthy (or unknown) ones among them have gone, the worst order. Unhealthy ones
    // leaving only help, and a single member left may still grow, as below.
    let leaving = leaving_tally(cp, stale);
    let worst = minus(
        before,
        Tally {
            unhealthy: 0,
            ..leaving
        },
    );
    let after_leaving = quorum::addition(worst);
    if after_leaving != Safety::Safe
        && !(worst.voting() == 1 && worst.healthy == 1)
        && quorum::addition(before) == Safety::Safe
    {
        let figures = Figures::new(
            worst,
            Tally {
                unhealthy: worst.unhealthy + 1,
                ..worst
            },
        );
        let detail = format!(
            "{what} could lose etcd quorum while the first new member joins: once the members of the Machines being deleted ({} healthy, {} unknown) have left, {}.{problems}",
            leaving.healthy,
            leaving.unknown,
            figures.shown()
        );
        return match after_leaving {
            Safety::Unknown => unknown_health(&what, &detail, requester, policy, Some(figures)),
            _ => Judgement::deny(
                Reason::ScaleUpWouldLoseQuorum,
                format!("{detail} Wait for those deletions to finish, then scale."),
            )
            .with_figures(figures),
        };
    }
    if before.voting() == 1 && before.healthy == 1 {
        let mut j = Judgement::allow(
            Reason::SingleMemberScaleUp,
            format!(
                "{what}: a single-member etcd can only grow by adding a member; {}",
                figures.shown()
            ),
        )
        .with_figures(figures);
        j.warnings.push(format!(
            "while the second member of KubeadmControlPlane {kcp} joins, etcd needs both members: it is unavailable until the join completes"
        ));
        return j;
    }
    match quorum::addition(before) {
        Safety::Safe => Judgement::allow(
            Reason::ScaleUpSafe,
            format!(
                "{what}: the new member joins while quorum holds; {}",
                figures.shown()
            ),
        )
        .with_figures(figures),
        Safety::Unsafe => Judgement::deny(
            Reason::ScaleUpWouldLoseQuorum,
            format!(
                "{what} would lose etcd quorum while the first new member joins: it counts as a voting member before it is healthy; {}.{problems} Make every member healthy (or remediate the unhealthy one) first, then scale.",
                figures.shown()
            ),
        )
        .with_figures(figures),
        Safety::Unknown => unknown_health(
            &what,
            &format!("{}.{problems}", figures.shown()),
            requester,
            policy,
            Some(figures),
        ),
    }
}
