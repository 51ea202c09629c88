//! What an exploration may spend (`Bounds`) and the bugs a run may plant (`Bugs`).

use quorumguard::engine::etcd_version::AddMemberRule;

use crate::model::world::Style;

/// What the exploration may spend, and how far the guard's view may lag.
#[derive(Clone, Debug)]
pub struct Bounds {
    /// Initial control planes: this many healthy members, Machines and replicas.
    pub sizes: Vec<u8>,
    pub styles: Vec<Style>,
    /// etcd's member-add rule, by version: before PR #21641 (3.4.23) or with it (3.5.30).
    pub etcds: Vec<AddMemberRule>,
    /// The KCP's maxSurge values to start from (1: add before delete in a rollout; 0: delete
    /// first).
    pub max_surges: Vec<u8>,
    /// spec.replicas a person may ask for: 1, 3, 5, up to this.
    pub max_replicas: u8,
    /// Members that fail (go down; each may come back).
    pub failures: u8,
    pub probe_failures: u8,
    /// Times KCP loses leadership with a step half done (v0.3: member removed, Machine not).
    pub crashes: u8,
    /// Machine deletions and replica changes a person asks for (following the next action is
    /// not counted).
    pub person: u8,
    pub rollouts: u8,
    /// Machines KCP may create.
    pub new_machines: u8,
    /// Objects (Machines, the KCP) the guard's cache may show out of date at once.
    pub cache_lag: usize,
    /// etcd changes the guard's latest probe may miss.
    pub probe_lag: u8,
    /// Probes a leader election may last (each probe is one election timeout after the last).
    pub election_probes: u8,
    /// Members left behind the way kubeadm and KCP leave them: a join that stops (before
    /// `member add`, after it before the member starts, or before its promotion), or a
    /// Machine that goes without its member being removed (older KCP).
    pub leftovers: u8,
    /// Whether a MachineHealthCheck covers the control plane's Machines at the start (one run
    /// per value): without one a remediate-machine annotation does nothing, and the next
    /// action says to create one (a person following it does).
    pub health_check: Vec<bool>,
    /// Whether quorumguard's autopilot acts (issue 38): an actor that takes the published next
    /// action on its own fresh probe.
    pub autopilot: bool,
    /// Whether the MachineHealthCheck also checks the Machine's `EtcdMemberHealthy` condition
    /// (`checks.unhealthyMachineConditions`, Cluster API v1.11 and later). Read only by the
    /// liveness continuation without a person, where nothing else moves: there it marks a
    /// Machine whose node is up and whose etcd member is gone (the #2651 Machine once there
    /// are no more Machines than replicas), which none of the autopilot's four actions moves
    /// and the Node checks alone never mark (docs/rules.md, "Model-checked").
    pub mhc_checks_etcd_member: bool,
}

/// Planted bugs: each makes the guard (or a person) wrong in one known way, to show that the
/// properties catch it.
#[derive(Clone, Debug, Default)]
pub struct Bugs {
    /// The webhook keeps no reservations: an allowed deletion or scale-up is invisible to the
    /// next review until the cache shows it (the race before commit 4841864).
    pub no_reservations: bool,
    /// The engine never sees the other pending deletions (the PendingDeletions rule bypassed:
    /// each deletion judged as if it were the only one).
    pub blind_to_pending: bool,
    /// The guard denies deleting a Machine that has no etcd member (the MemberAbsent rule
    /// replaced by a denial).
    pub deny_memberless: bool,
    /// Nobody follows the published next action.
    pub ignore_next_action: bool,
    /// The webhook decides on its cached record only, as before the fresh probe (issue 27):
    /// an allow rests on the last sweep's probe, however old.
    pub no_fresh_probe: bool,
    /// Not the guard's: KCP scales up without its health preflight, as the guard's rules
    /// assume a controller may (a join in any order with the admitted deletions).
    pub kcp_skips_preflight: bool,
    /// The published next action waits for a join without `--join-grace`'s end: every
    /// Machine counts as young for ever.
    pub wait_without_grace: bool,
    /// The `PendingJoin` rule as it was before issue 36, for KCP's own deletions: the
    /// replacement KCP will create after this deletion counts as a member about to join (fewer
    /// Machines than spec.replicas), though KCP creates no Machine while one is being deleted.
    /// Planted in the model's guard, not the engine: KCP's deletion is judged again as a
    /// person's, and when that is denied `PendingJoin`, so is KCP's (the person's
    /// desired-replicas rule, which the engine exempts controllers from, is not taken over).
    /// With voting joins and v1.14's order (a refused remediation ends KCP's reconcile), a
    /// healthy Machine marked for remediation while there are fewer Machines than replicas
    /// holds KCP for ever.
    pub pending_join_for_kcp: bool,
    /// The autopilot decides on the guard's record of the last probe, not on a probe of its
    /// own, and takes it for fresh.
    pub ap_stale_view: bool,
    /// The autopilot does not look at the step it has in flight before it takes another.
    pub ap_ignores_in_flight: bool,
    /// The autopilot does nothing (its mode off): to show that liveness without a person rests
    /// on it.
    pub ap_off: bool,
}
