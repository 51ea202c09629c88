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
    use quorumguard_engine::testkit::{
        NOW, add_machine, add_member, cp, down, healthy, members_mut,
    };
    use quorumguard_engine::{ActionCode, next_action};

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

    /// Control planes with different next actions, their members' raft indexes `scale` times
    /// 1,000 (a learner's 950 or 500 times `scale`: caught up or behind) and their DB sizes
    /// `scale` MiB: what moves on every probe.
    fn states(scale: u64) -> Vec<(&'static str, ControlPlane, Option<&'static str>)> {
        let three = || {
            let mut c = cp(
                3,
                &[("m1", healthy()), ("m2", healthy()), ("m3", healthy())],
            );
            c.kcp.version = Some("v1.32.0".into());
            members_mut(&mut c)[0].is_leader = true;
            c
        };
        let with_learner = |created: i64, index: u64| {
            let mut c = three();
            let i = add_machine(&mut c, "m4");
            c.machines[i].created_unix = Some(created);
            add_member(&mut c, 4, "m4", healthy(), true);
            members_mut(&mut c)[3].raft_index = Some(index * scale);
            c
        };
        let mut one_down = three();
        members_mut(&mut one_down)[2].health = down();
        let mut joining = three();
        let i = add_machine(&mut joining, "m4");
        joining.machines[i].created_unix = Some(NOW - 30);
        let mut unknown = three();
        unknown.etcd = EtcdState::Unknown {
            reason: "connection refused".into(),
        };
        let mut out = vec![
            ("healthy", three(), None),
            ("a member down", one_down, None),
            ("a learner catching up", with_learner(NOW - 30, 500), None),
            (
                "a stalled learner caught up",
                with_learner(NOW - 3600, 950),
                None,
            ),
            (
                "a stalled learner behind",
                with_learner(NOW - 3600, 500),
                None,
            ),
            ("a Machine joining", joining, None),
            ("the probe failed", unknown, Some("connection refused")),
        ];
        for (_, c, _) in &mut out {
            if let EtcdState::Observed(s) = &mut c.etcd {
                for m in &mut s.members {
                    m.raft_index = m.raft_index.or(Some(1000 * scale));
                    m.db_size = Some(scale << 20);
                }
            }
        }
        out
    }

    /// Each state's fingerprint, as one cycle's snapshot works it out at `now`.
    fn prints(scale: u64, now: i64) -> Vec<(&'static str, NextAction, u64)> {
        let p = Policy::default();
        states(scale)
            .into_iter()
            .map(|(what, c, error)| {
                let next = next_action(&c, &p, now);
                let print = fingerprint(&c, &next, &p, Some(1), error, now);
                (what, next, print)
            })
            .collect()
    }

    /// The same state in a later cycle (a minute on, within every grace period; raft indexes
    /// and DB sizes grown, every learner as far behind as before) publishes the same
    /// conditions but their transition times and the figures the fingerprint leaves out: the
    /// fingerprint is the same, so nothing is re-written every cycle.
    #[test]
    fn the_same_state_in_a_later_cycle_has_the_same_fingerprint() {
        let before = prints(1, NOW);
        assert_eq!(prints(1, NOW), before, "the same state twice");
        assert_eq!(prints(2, NOW + 60), before, "a minute and a probe later");
    }

    /// Whenever the published NextAction condition differs (its reason or its words), the
    /// fingerprint does: between any two states, and for one state given another next action.
    #[test]
    fn a_changed_next_action_changes_the_fingerprint() {
        let all = prints(1, NOW);
        for (i, (what, next, print)) in all.iter().enumerate() {
            for (other, other_next, other_print) in &all[i + 1..] {
                assert_ne!(
                    (next.code, &next.message),
                    (other_next.code, &other_next.message),
                    "{what} and {other} should differ in their next action"
                );
                assert_ne!(print, other_print, "{what} and {other}");
            }
        }
        // Each state has the next action it is named for. A learner past --learner-grace is
        // promoted when it has caught up and its Machine replaced when it has not: that is read
        // from the raft indexes, which the member table the fingerprint hashes leaves out.
        let codes: Vec<_> = all.iter().map(|(_, n, _)| n.code).collect();
        assert_eq!(
            codes,
            [
                ActionCode::None,
                ActionCode::RemediateMachine,
                ActionCode::WaitForLearner,
                ActionCode::PromoteLearner,
                ActionCode::RemediateMachine,
                ActionCode::WaitForJoin,
                ActionCode::CheckEtcdHealth,
            ]
        );
        // The words alone, and the code alone.
        let (c, p) = (&states(1)[0].1, Policy::default());
        let next = next_action(c, &p, NOW);
        let base = fingerprint(c, &next, &p, Some(1), None, NOW);
        let mut reworded = next.clone();
        reworded.message.push_str(" Reworded.");
        assert_ne!(fingerprint(c, &reworded, &p, Some(1), None, NOW), base);
        let mut recoded = next.clone();
        recoded.code = ActionCode::CheckEtcdHealth;
        assert_ne!(fingerprint(c, &recoded, &p, Some(1), None, NOW), base);
    }
}
