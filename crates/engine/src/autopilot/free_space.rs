//! Freeing space after NOSPACE, as a plan of steps the autopilot takes one per decision:
//! compact; defragment the followers one at a time (a member answers nothing while it is
//! defragmented); move the leadership to a member already defragmented; defragment the former
//! leader (by then a follower, so the same rule takes it); disarm the alarm once every member's
//! database is under the quota. Before every step every voting member must be healthy on the
//! fresh probe (the health check between steps), and a defragmentation must keep quorum with
//! its member counted down. Never on CORRUPT. The plan stops at the first failed step and says
//! where ([`Progress::stopped`]).
//!
//! A member is defragmented only once it has applied the compaction. The compaction returns
//! when the member asked (the leader) has applied it; every other member compacts its own
//! database when it applies the same raft entry, and a member defragmented before that frees
//! nothing. So the probe after the compaction notes a raft index at or past the compaction's
//! entry ([`Progress::compaction_index`]), and a member is defragmented once its applied index
//! (etcd's `raftAppliedIndex`) reaches it; before, the plan waits
//! ([`Why::CompactionNotApplied`]).

use super::proof::act;
use super::{Act, Count, Situation, Step, Why};
use crate::model::{Alarm, HealthRef, Member, MemberId};

/// How far the plan has come (kept in the [`super::Book`] between decisions).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Progress {
    pub compacted: bool,
    /// A raft index at or past the compaction's entry, from the probe after the compaction
    /// (the highest committed index it showed): a member whose applied index has reached it
    /// has compacted its database.
    pub compaction_index: Option<u64>,
    /// Members defragmented, in order.
    pub defragmented: Vec<MemberId>,
    /// Their databases' sizes just before their defragmentation, where the probe knew them.
    pub size_before: Vec<(MemberId, u64)>,
    /// The leader the plan moved leadership away from.
    pub moved_from: Option<MemberId>,
    /// Where the plan stopped, and why: it goes no further without a person.
    pub stopped: Option<String>,
}

impl Progress {
    pub fn under_way(&self) -> bool {
        self.compacted
    }

    /// Notes a step done.
    pub fn done(&mut self, step: &Step) {
        match step {
            Step::Compact => self.compacted = true,
            Step::Defragment {
                member, db_size, ..
            } => {
                self.defragmented.push(*member);
                if let Some(b) = db_size {
                    self.size_before.push((*member, *b));
                }
            }
            Step::MoveLeader { from, .. } => self.moved_from = Some(*from),
            _ => {}
        }
    }
}

type Refused = (Why, String);

/// The next step of the plan, proven on the fresh probe (`now`: its voting members).
pub(super) fn next_step(s: &Situation<'_>, members: &[Member], now: Count) -> Result<Act, Refused> {
    let progress = &s.book.free_space;
    if let Some(m) = members.iter().find(|m| m.alarms.contains(&Alarm::Corrupt)) {
        return Err((
            Why::Corrupt,
            format!(
                "etcd member {} (id {}) has a CORRUPT alarm: its data is wrong, and no space is freed beside it. Next, by hand: replace its Machine (annotate it {}).",
                m.display_name(),
                m.id,
                crate::model::ANNOTATION_REMEDIATE
            ),
        ));
    }
    if let Some(at) = &progress.stopped {
        return Err((
            Why::NotProven,
            format!(
                "freeing space stopped: {at}. Next, by hand: finish it (`{}`), then the published action changes.",
                crate::next_action::FREE_SPACE_COMMAND
            ),
        ));
    }
    let unfit: Vec<String> = members
        .iter()
        .filter(|m| !m.is_unstarted() && !m.effective_health_ref().is_healthy())
        .map(|m| format!("{} (id {})", m.display_name(), m.id))
        .collect();
    if now.healthy < now.voting || !unfit.is_empty() {
        return Err((
            Why::NotProven,
            format!(
                "the health check before the next step of freeing space fails: {now}{}{}. Next: bring them back; the plan goes on from where it is ({}).",
                if unfit.is_empty() {
                    ""
                } else {
                    "; not healthy: "
                },
                unfit.join(", "),
                where_it_is(progress)
            ),
        ));
    }
    if !progress.compacted {
        let message = format!(
            "Autopilot frees space in etcd of KubeadmControlPlane {} after NOSPACE, step 1: compacts the history up to the current revision ({now}, before and after). Next: defragment the followers one at a time.",
            s.fresh.kcp_shown()
        );
        return Ok(act(Step::Compact, now, now, message));
    }
    let todo = members
        .iter()
        .filter(|m| !m.is_unstarted() && !progress.defragmented.contains(&m.id));
    if let Some(f) = todo.clone().find(|m| !m.is_leader) {
        return defragment(s, f, now);
    }
    let Some(l) = todo.clone().find(|m| m.is_leader) else {
        return disarm(s, members, now);
    };
    let to = members.iter().find(|m| {
        !m.is_learner
            && !m.is_leader
            && progress.defragmented.contains(&m.id)
            && matches!(m.effective_health_ref(), HealthRef::Healthy)
    });
    let Some(to) = to else {
        return Err((
            Why::NotProven,
            format!(
                "etcd member {} (id {}) is the only voting member: defragmenting it pauses all of etcd, and there is no member to hand the leadership to. Next, by hand: `etcdctl defrag` on it in a quiet moment, then `etcdctl alarm disarm`.",
                l.display_name(),
                l.id
            ),
        ));
    };
    let message = format!(
        "Autopilot frees space in etcd of KubeadmControlPlane {}: every follower is defragmented; moves the leadership from {} (id {}) to {} (id {}) so that the former leader can be defragmented as a follower ({now}, before and after). Next: defragment {}.",
        s.fresh.kcp_shown(),
        l.display_name(),
        l.id,
        to.display_name(),
        to.id,
        l.display_name()
    );
    Ok(act(
        Step::MoveLeader {
            from: l.id,
            to: to.id,
        },
        now,
        now,
        message,
    ))
}

fn defragment(s: &Situation<'_>, f: &Member, now: Count) -> Result<Act, Refused> {
    let compaction = s.book.free_space.compaction_index;
    match (compaction, f.raft_applied_index) {
        (Some(c), Some(a)) if a >= c => {}
        (Some(c), Some(a)) => {
            return Err((
                Why::CompactionNotApplied,
                format!(
                    "etcd member {} (id {}) has applied raft entries up to {a}, and the compaction is at or below entry {c}: defragmenting it before it applies the compaction would free nothing. Next: the plan waits for it to catch up (each probe looks again); a member that stays behind its leader needs a look at its logs.",
                    f.display_name(),
                    f.id
                ),
            ));
        }
        (c, _) => {
            let missing = if c.is_none() {
                "the probe after the compaction showed no raft index".to_string()
            } else {
                format!(
                    "etcd member {} (id {}) does not report its applied index (etcd before 3.4)",
                    f.display_name(),
                    f.id
                )
            };
            return Err((
                Why::NotProven,
                format!(
                    "whether etcd member {} (id {}) has applied the compaction is unknown: {missing}. Next, by hand: `etcdctl --endpoints={} get / --rev=1 --consistency=s` answers \"required revision has been compacted\" once it has; then `etcdctl --endpoints={} defrag`.",
                    f.display_name(),
                    f.id,
                    endpoint(f),
                    endpoint(f)
                ),
            ));
        }
    }
    let during = Count {
        voting: now.voting,
        healthy: now.healthy - usize::from(!f.is_learner),
    };
    if !during.keeps_quorum() {
        return Err((
            Why::NotProven,
            format!(
                "defragmenting etcd member {} (id {}) would leave {during} while it runs. Next, by hand: defragment it once more members are healthy.",
                f.display_name(),
                f.id
            ),
        ));
    }
    let message = format!(
        "Autopilot frees space in etcd of KubeadmControlPlane {}: defragments etcd member {} (id {}{}), which answers nothing meanwhile: before {now}; during {during}. Next: a health check, then the next member.",
        s.fresh.kcp_shown(),
        f.display_name(),
        f.id,
        f.db_size
            .map_or(String::new(), |b| format!(", database {b} bytes"))
    );
    Ok(act(
        Step::Defragment {
            member: f.id,
            name: f.display_name(),
            db_size: f.db_size,
        },
        now,
        during,
        message,
    ))
}

fn disarm(s: &Situation<'_>, members: &[Member], now: Count) -> Result<Act, Refused> {
    let quota = s.settings.quota_backend_bytes;
    let before = |id: MemberId| {
        s.book
            .free_space
            .size_before
            .iter()
            .find(|(m, _)| *m == id)
            .map(|(_, b)| *b)
    };
    let over: Vec<String> = members
        .iter()
        .filter(|m| !m.is_unstarted())
        .filter(|m| m.db_size.is_none_or(|b| b >= quota))
        .map(|m| match (m.db_size, before(m.id)) {
            (Some(b), Some(was)) if b >= was => format!(
                "{} ({b} bytes, {was} before its defragmentation: it freed nothing)",
                m.display_name()
            ),
            (Some(b), Some(was)) => format!(
                "{} ({b} bytes, {was} before its defragmentation)",
                m.display_name()
            ),
            (Some(b), None) => format!("{} ({b} bytes)", m.display_name()),
            (None, _) => format!("{} (size unknown)", m.display_name()),
        })
        .collect();
    if !over.is_empty() {
        return Err((
            Why::NotProven,
            format!(
                "every member applied the compaction before its defragmentation, but not every database is under the quota of {quota} bytes: {}. What a member still holds after both is live data (the keys themselves, or the revisions kept since the compaction). Next, by hand: delete data or raise --quota-backend-bytes on every member (kubeadm: etcd.local.extraArgs), then `etcdctl alarm disarm`.",
                over.join(", ")
            ),
        ));
    }
    let message = format!(
        "Autopilot frees space in etcd of KubeadmControlPlane {}, last step: every member is defragmented and under the quota of {quota} bytes; disarms the NOSPACE alarm ({now}, before and after). Next: the next probe must show no alarm, and writes work again.",
        s.fresh.kcp_shown()
    );
    Ok(act(Step::Disarm, now, now, message))
}

/// A raft index at or past the compaction's entry, read on the probe after it: the highest
/// committed index any member shows. The compaction was proposed to the leader and returned once
/// that member had applied it, so its entry was committed before this probe; the member that
/// committed it shows an index at least as high, while it answers. A member whose applied index
/// has reached it has compacted its database.
pub fn compaction_bound(members: &[Member]) -> Option<u64> {
    members.iter().filter_map(|m| m.raft_index).max()
}

/// The member's client URL, for a command a person runs.
fn endpoint(m: &Member) -> &str {
    m.client_urls
        .first()
        .map_or("<its client URL>", String::as_str)
}

/// Where the plan is, for a refusal.
fn where_it_is(p: &Progress) -> String {
    if !p.compacted {
        return "not started".into();
    }
    let ids: Vec<String> = p.defragmented.iter().map(|m| m.to_string()).collect();
    format!(
        "compacted, defragmented: {}",
        if ids.is_empty() {
            "none".into()
        } else {
            ids.join(", ")
        }
    )
}
