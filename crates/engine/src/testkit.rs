//! Test support, not product code: builders that keep the engine's tests, and the guard's tests
//! of what it publishes, short (a control plane from a line of members). Compiled only for the
//! engine's own tests and with the `testkit` feature, which only dev-dependencies turn on.

use crate::*;

pub const NOW: i64 = 1_800_000_000;

thread_local! {
    /// The control planes [`next_action`] was asked about on this thread, while a
    /// [`next_actions_asked`] records them.
    static ASKED: std::cell::RefCell<Option<Vec<ControlPlane>>> = const { std::cell::RefCell::new(None) };
}

/// Called by [`next_action`] (with this module compiled in): notes `cp` while recording.
pub(crate) fn asked_next_action(cp: &ControlPlane) {
    ASKED.with(|a| {
        if let Some(asked) = a.borrow_mut().as_mut() {
            asked.push(cp.clone());
        }
    });
}

/// Runs `f` and returns what it returned with every control plane [`next_action`] was asked
/// about on this thread meanwhile (the engine's own calls on simulated states included): a
/// test counts how often one control plane's next action is worked out.
pub fn next_actions_asked<T>(f: impl FnOnce() -> T) -> (T, Vec<ControlPlane>) {
    ASKED.with(|a| *a.borrow_mut() = Some(Vec::new()));
    let out = f();
    let asked = ASKED.with(|a| a.borrow_mut().take()).unwrap_or_default();
    (out, asked)
}

pub fn healthy() -> Health {
    Health::Healthy
}

pub fn down() -> Health {
    Health::Unhealthy("context deadline exceeded".into())
}

/// A member as one probe reports it: `answered` says whether its status came back (then it has a
/// raft term), `leader` whether it reports itself the leader.
pub fn probed(id: u64, health: Health, answered: bool, leader: bool) -> Member {
    let mut m = Member::new(id, format!("m{id}"));
    m.health = health;
    m.raft_term = answered.then_some(2);
    m.is_leader = leader;
    m
}

/// Answered, healthy.
pub fn up(id: u64, leader: bool) -> Member {
    probed(id, Health::Healthy, true, leader)
}

/// Answered its status, but its read failed: no leader to serve it.
pub fn leaderless(id: u64) -> Member {
    probed(
        id,
        Health::Unhealthy("etcdserver: no leader".into()),
        true,
        false,
    )
}

/// Did not answer at all (frozen, killed).
pub fn silent(id: u64) -> Member {
    probed(
        id,
        Health::Unhealthy("no answer within 2s".into()),
        false,
        false,
    )
}

/// A KCP named `kcp` in namespace `ns` with `replicas` desired and one Machine + voting member
/// per entry of `members`, named after the entry, with IDs 1, 2, ...
pub fn cp(replicas: u32, members: &[(&str, Health)]) -> ControlPlane {
    let mut c = ControlPlane {
        cluster: Cluster {
            name: "test".into(),
            deleting: false,
            paused: false,
        },
        kcp: Kcp {
            name: "kcp".into(),
            namespace: "ns".into(),
            replicas,
            etcd: EtcdTopology::Stacked,
            max_surge: 1,
            deleting: false,
            // Voting joins (kubeadm before v1.29 without EtcdLearnerMode): the stricter
            // reading, which most rule tests are about; tests of learner joins set v1.32.
            version: Some("v1.28.0".into()),
            etcd_learner_mode: None,
            paused: false,
        },
        machines: Vec::new(),
        etcd: EtcdState::Observed(EtcdSnapshot {
            members: Vec::new(),
            age: None,
        }),
        // A MachineHealthCheck that covers every Machine `add_machine` adds and never
        // short-circuits: remediation works, as the rules' tests assume.
        health_checks: HealthChecks::Known(vec![HealthCheck {
            name: "kcp-mhc".into(),
            targets: Vec::new(),
            paused: false,
            trigger: Trigger::default(),
            counts: None,
        }]),
    };
    for (i, (name, h)) in members.iter().enumerate() {
        add_machine(&mut c, name);
        add_member(&mut c, i as u64 + 1, name, h.clone(), false);
    }
    c
}

/// Adds a Machine; the first MachineHealthCheck (if any is known) covers it.
pub fn add_machine(c: &mut ControlPlane, name: &str) -> usize {
    if let HealthChecks::Known(checks) = &mut c.health_checks
        && let Some(hc) = checks.first_mut()
    {
        hc.targets.push(name.to_string());
    }
    let mut m = Machine::new(name);
    m.created_unix = Some(NOW - 3600 + c.machines.len() as i64);
    c.machines.push(m);
    c.machines.len() - 1
}

pub fn add_member(c: &mut ControlPlane, id: u64, name: &str, health: Health, learner: bool) {
    let mut m = Member::new(id, name);
    m.health = health;
    m.is_learner = learner;
    if let EtcdState::Observed(s) = &mut c.etcd {
        s.members.push(m);
    }
}

pub fn members_mut(c: &mut ControlPlane) -> &mut Vec<Member> {
    match &mut c.etcd {
        EtcdState::Observed(s) => &mut s.members,
        EtcdState::Unknown { .. } => panic!("etcd unknown"),
    }
}

pub fn machine_mut<'a>(c: &'a mut ControlPlane, name: &str) -> &'a mut Machine {
    c.machines
        .iter_mut()
        .find(|m| m.name == name)
        .expect("no such machine")
}

pub fn human() -> Requester {
    Requester::new("jane@example.com")
}

pub fn kcp_controller() -> Requester {
    Requester::new(DEFAULT_KCP_CONTROLLER)
}

pub fn delete(c: &ControlPlane, machine: &str, who: &Requester) -> Verdict {
    let m = c.machine(machine).expect("no such machine").clone();
    decide(
        c,
        &Operation::DeleteMachine(m),
        who,
        &Policy::default(),
        NOW,
    )
}

pub fn scale(c: &ControlPlane, to: u32) -> Verdict {
    decide(
        c,
        &Operation::UpdateKcp {
            replicas_from: c.kcp.replicas,
            replicas_to: to,
            starts_rollout: false,
        },
        &human(),
        &Policy::default(),
        NOW,
    )
}

pub fn next(c: &ControlPlane) -> NextAction {
    next_action(c, &Policy::default(), NOW)
}
