//! The quorum rule for deleting a control-plane Machine: the removal of its voting member,
//! alone and with the pending deletions and a member about to join, judged by the risk it
//! adds.

use std::fmt;
use std::ops::ControlFlow::{self, Break, Continue};

use super::delete::{Joining, minus, pending_join, replicas_shortfall};
use super::*;

/// The quorum rule for deleting `m`: whether etcd keeps its quorum once its member is gone.
pub(super) fn judge_delete_quorum(ask: &Ask<'_>, m: &Machine) -> Judgement {
    let member = match voting_member(ask, m) {
        Continue(member) => member,
        Break(j) => return j,
    };
    let r = Removal::of(ask, m, member);
    match r.denial() {
        Some(denial) => denial,
        None => r.allow(),
    }
}

/// An allowed verdict's message, when `words` wants one.
fn say(words: Words, message: impl FnOnce() -> String) -> String {
    match words {
        Words::All => message(),
        Words::DenialsOnly => String::new(),
    }
}

/// The voting member whose removal deleting `m` judges, or the judgement when there is none to
/// judge (`Break`): external etcd, an unknown member list, no member, a learner.
fn voting_member<'a>(ask: &Ask<'a>, m: &Machine) -> ControlFlow<Judgement, &'a Member> {
    let cp = ask.cp;
    if cp.kcp.etcd == EtcdTopology::External {
        return Break(Judgement::allow(
            Reason::ExternalEtcd,
            format!(
                "KubeadmControlPlane {} uses external etcd: no stacked member to protect",
                cp.kcp_shown()
            ),
        ));
    }
    if let EtcdState::Unknown { .. } = cp.etcd {
        let what = Named("deleting Machine", &cp.kcp.namespace, &m.name);
        return Break(unknown_health(ask, &what, &unknown_etcd_detail(cp), None));
    }
    let Some(member) = cp.member_of(m) else {
        return Break(Judgement::allow(
            Reason::MemberAbsent,
            say(ask.words, || {
                format!(
                    "Machine {}/{} has no etcd member (removed already, or never joined): quorum of KubeadmControlPlane {} is unaffected",
                    cp.kcp.namespace,
                    m.name,
                    cp.kcp_shown()
                )
            }),
        ));
    };
    if member.is_learner {
        return Break(Judgement::allow(
            Reason::LearnerMember,
            say(ask.words, || {
                format!(
                    "the etcd member of Machine {}/{} is a learner, which does not vote: quorum is unaffected",
                    cp.kcp.namespace, m.name
                )
            }),
        ));
    }
    Continue(member)
}

/// The removal of a voting member that deleting Machine `m` makes, with the figures the quorum
/// rule reads: before, after it alone, after it and the pending deletions, and a member about
/// to join.
struct Removal<'a> {
    ask: Ask<'a>,
    m: &'a Machine,
    member: &'a Member,
    stale: bool,
    before: Tally,
    alone: Tally,
    after_alone: Tally,
    figures: Figures,
    /// The voting members of the other Machines already being deleted: on their way out too.
    pending: Vec<&'a Member>,
    with_pending: Tally,
    alone_safety: Safety,
    pending_safety: Safety,
    joining: Option<Joining>,
    /// The risk this deletion adds, with the pending removals and a member about to join.
    risk: Safety,
    risk_without_join: Safety,
    /// A member that votes though its data is wrong (CORRUPT): its removal alone is the way
    /// out when raft keeps its quorum (see `quorum::unfit_voter_removal_safe`).
    unfit_way_out: bool,
}

impl<'a> Removal<'a> {
    fn of(ask: &Ask<'a>, m: &'a Machine, member: &'a Member) -> Self {
        let cp = ask.cp;
        let stale = is_stale(cp, ask.policy);
        let members = cp.members();
        let before = Tally::of(members, stale);
        let mut alone = Tally::default();
        alone.count(quorum::effective_ref(member, stale));
        let after_alone = minus(before, alone);
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
        // A deletion is judged by the risk it adds: the pending removals that are already
        // unsafe on their own (health changed after they were admitted) are not made safer by
        // refusing it, and removing an unhealthy member is then the way out. A member about to
        // join counts as well: it votes before it is healthy, in any order with the removals.
        let me_health = quorum::effective_ref(member, stale);
        let joining = pending_join(ask, m);
        let risk = quorum::added_risk(before, pending_tally, me_health, joining.is_some());
        let risk_without_join = match joining {
            Some(_) => quorum::added_risk(before, pending_tally, me_health, false),
            None => risk,
        };
        let unfit_way_out =
            pending.is_empty() && quorum::unfit_voter_removal_safe(members, member, stale);
        Removal {
            ask: *ask,
            m,
            member,
            stale,
            before,
            alone,
            after_alone,
            figures: Figures::new(before, after_alone),
            alone_safety: quorum::removal(before, alone),
            pending_safety: quorum::removal(before, with_pending),
            pending,
            with_pending,
            joining,
            risk,
            risk_without_join,
            unfit_way_out,
        }
    }

    fn what(&self) -> Named<'a> {
        Named("deleting Machine", &self.ask.cp.kcp.namespace, &self.m.name)
    }

    fn pending_names(&self) -> PendingNames<'_> {
        PendingNames {
            cp: self.ask.cp,
            pending: &self.pending,
            stale: self.stale,
        }
    }

    /// The denial (or the unknown-health policy's answer) when the removal is not safe.
    fn denial(&self) -> Option<Judgement> {
        let cp = self.ask.cp;
        let (what, figures) = (self.what(), self.figures);
        let problems = not_healthy_list(cp, self.stale);
        if quorum::raft_quorum_lost(cp.members(), self.stale) {
            return Some(Judgement::deny(
                Reason::QuorumLost,
                format!(
                    "{what} is refused: etcd of KubeadmControlPlane {} has lost quorum.\n{}.{problems} Deleting the Machine would throw away a surviving member's data, which recovery needs. Restore quorum first: restore etcd from a snapshot (https://etcd.io/docs/v3.4/op-guide/recovery/), or, if you accept the risk, set the annotation {ANNOTATION_BREAK_GLASS}=<reason> on the Machine.",
                    cp.kcp_shown(),
                    figures.shown()
                ),
            )
            .with_figures(figures));
        }
        let member_desc = describe_member(self.member, self.stale);
        if self.after_alone.voting() == 0 {
            return Some(Judgement::deny(
                Reason::LastMember,
                format!(
                    "{what} would remove the last etcd member of KubeadmControlPlane {}.\nIt removes {member_desc}: etcd and its data would be gone ({}).",
                    cp.kcp_shown(),
                    figures.shown()
                ),
            )
            .with_figures(figures));
        }
        if self.alone_safety == Safety::Unsafe && !self.unfit_way_out {
            return Some(Judgement::deny(
                Reason::WouldLoseQuorum,
                format!(
                    "{what} would lose etcd quorum of KubeadmControlPlane {}.\nIt removes {member_desc}; {}.{problems}",
                    cp.kcp_shown(),
                    figures.shown()
                ),
            )
            .with_figures(figures));
        }
        self.risk_denial()
    }

    /// [`Removal::denial`] for the risk the pending deletions and a joining member add.
    fn risk_denial(&self) -> Option<Judgement> {
        let cp = self.ask.cp;
        let (what, figures) = (self.what(), self.figures);
        let problems = not_healthy_list(cp, self.stale);
        let member_desc = describe_member(self.member, self.stale);
        let pending_names = self.pending_names();
        let pending = &self.pending;
        if self.risk == Safety::Unsafe && self.risk_without_join != Safety::Unsafe {
            let join = self
                .joining
                .as_ref()
                .map(|j| j.to_string())
                .unwrap_or_default();
            let left = minus(self.before, self.alone);
            return Some(Judgement::deny(
                Reason::PendingJoin,
                format!(
                    "{what} is not safe while a new etcd member is about to join.\n{join}. Joins here are {}: a new member votes before it is healthy, so once it is in and {member_desc} has gone: voting {}, healthy {}, quorum {} ({}).{problems} Wait for {}the new member to join and be healthy, then try again.",
                    cp.joins(),
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
            .with_figures(figures));
        }
        if self.risk == Safety::Unsafe {
            let all = minus(self.before, self.with_pending);
            return Some(Judgement::deny(
                Reason::PendingDeletions,
                format!(
                    "{what} is not safe while other deletions of KubeadmControlPlane {} are pending.\n{} still being deleted; if those members leave first, quorum could be lost (after all of them: voting {}, healthy {}; {}).{problems} Wait for {} to finish, then try again.",
                    cp.kcp_shown(),
                    pending_names,
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
            .with_figures(figures));
        }
        if self.risk == Safety::Unknown {
            let mut pending_note = if pending.is_empty() {
                String::new()
            } else {
                format!(" Deletions still pending: {pending_names}.")
            };
            if let Some(j) = &self.joining {
                pending_note.push_str(&format!(" A new member is about to join: {j}."));
            }
            return Some(unknown_health(
                &self.ask,
                &what,
                &format!(
                    "{}; it removes {member_desc}.{problems}{pending_note}",
                    figures.shown()
                ),
                Some(figures),
            ));
        }
        None
    }

    /// The allow, with its warnings.
    fn allow(&self) -> Judgement {
        let Ask {
            cp,
            requester,
            policy,
            words,
            ..
        } = self.ask;
        let (what, figures, m) = (self.what(), self.figures, self.m);
        let member_desc = describe_member(self.member, self.stale);
        let mut j = Judgement::allow(
            Reason::QuorumSafe,
            say(words, || {
                format!(
                    "{what} keeps etcd quorum of KubeadmControlPlane {}: it removes {member_desc}; {}",
                    cp.kcp_shown(),
                    figures.shown()
                )
            }),
        )
        .with_figures(figures);
        // KCP's own deletion down to one voting member, with a replacement to come: the
        // replacement is not this deletion's risk (it comes after it), but with voting joins it
        // grows a single member, which needs both to be up: say so, as a scale-up from one does.
        if words == Words::All
            && policy.is_controller(requester)
            && self.after_alone.voting() == 1
            && self.pending.is_empty()
            && cp.join_style() == JoinStyle::Voting
            && replicas_shortfall(cp, m).is_some()
        {
            j.warnings.push(format!(
                "once this deletion has finished, KCP replaces Machine {}/{} by growing a single etcd member; joins here are {}, so etcd needs both members and is unavailable until the new one has started",
                cp.kcp.namespace,
                m.name,
                cp.joins()
            ));
        }
        if self.pending_safety != Safety::Safe && words == Words::All {
            j.warnings.push(format!(
                "the pending deletions ({}) cannot all complete safely while members are unhealthy; removing the unhealthy member of Machine {}/{} first is the way out",
                self.pending_names(),
                cp.kcp.namespace,
                m.name
            ));
        }
        j
    }
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
