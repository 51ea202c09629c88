//! The fingerprint of what would be published for a KCP, without the figures that move on every
//! probe: the writer compares it to skip reads and writes in a steady state.

use crate::conditions::conditions_given;
use quorumguard_engine::{ControlPlane, EtcdState, NextAction, Policy};

/// What would be published at `now_unix` for `cp`, whose next action is `next`, minus the
/// figures that move on every probe (raft index, DB size) and the transition time. The time
/// counts: a Machine without a member is joining while it is younger than `--join-grace` and
/// broken after, and that alone changes the next action.
///
/// The NextAction condition hashed is the one published, made of `next` (worked out on the real
/// figures): whether a learner has caught up is read from the raft indexes dropped from the
/// member table, and tells a stalled learner (RemediateMachine) from one that can be promoted
/// (PromoteLearner); its words hold no raft index or DB size.
pub(super) fn fingerprint(
    cp: &ControlPlane,
    next: &NextAction,
    policy: &Policy,
    generation: Option<i64>,
    probe_error: Option<&str>,
    now_unix: i64,
) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut steady = cp.clone();
    if let EtcdState::Observed(s) = &mut steady.etcd {
        for m in &mut s.members {
            m.raft_index = None;
            m.db_size = None;
        }
    }
    let mut h = DefaultHasher::new();
    for c in conditions_given(&steady, next, policy, now_unix, generation, probe_error) {
        (
            c.type_,
            c.status,
            c.reason,
            c.message,
            c.observed_generation,
        )
            .hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorumguard_engine::next_action;
    use quorumguard_engine::testkit::{NOW, add_machine, cp, down, healthy, members_mut};

    /// The fingerprint of `c`, its next action worked out as the snapshot does.
    fn fingerprint_of(
        c: &ControlPlane,
        p: &Policy,
        generation: Option<i64>,
        probe_error: Option<&str>,
        now: i64,
    ) -> u64 {
        fingerprint(c, &next_action(c, p, now), p, generation, probe_error, now)
    }

    fn print(c: &ControlPlane) -> u64 {
        fingerprint_of(c, &Policy::default(), Some(1), None, NOW)
    }

    #[test]
    fn fingerprint_ignores_what_moves_on_every_probe() {
        let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
        let before = print(&c);
        for (i, m) in members_mut(&mut c).iter_mut().enumerate() {
            m.raft_index = Some(1000 + i as u64);
            m.db_size = Some(1 << 20);
        }
        assert_eq!(
            print(&c),
            before,
            "raft index and DB size alone publish nothing"
        );
        members_mut(&mut c)[2].health = down();
        assert_ne!(print(&c), before, "a member going down is published");
    }

    #[test]
    fn fingerprint_follows_generation_and_probe_errors() {
        let c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
        let p = Policy::default();
        let base = fingerprint_of(&c, &p, Some(1), None, NOW);
        assert_ne!(fingerprint_of(&c, &p, Some(2), None, NOW), base);
        assert_ne!(
            fingerprint_of(&c, &p, Some(1), Some("deadline exceeded"), NOW),
            base
        );
    }

    #[test]
    fn fingerprint_follows_a_machine_outgrowing_the_join_grace() {
        // A fourth Machine without a member: joining while young (WaitForJoin), broken once
        // older than the join grace (RemediateMachine). Nothing else changes, yet the next
        // action does: it must be published.
        let mut c = cp(4, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
        let i = add_machine(&mut c, "d");
        c.machines[i].created_unix = Some(NOW - 30);
        let p = Policy::default();
        let young = fingerprint_of(&c, &p, Some(1), None, NOW);
        assert_eq!(fingerprint_of(&c, &p, Some(1), None, NOW + 1), young);
        let grace = p.join_grace.as_secs() as i64;
        assert_ne!(
            fingerprint_of(&c, &p, Some(1), None, NOW + grace),
            young,
            "past the join grace the next action changes"
        );
    }
}
