//! The play's join step: a Machine without a node joins as the control plane's kubeadm joins
//! ([`crate::joins`]), when etcd adds its member ([`crate::etcd_version`]).

use super::play::{Played, Sim, Stuck};
use super::report::{Counts, ReadyReason, StepKind};
use crate::etcd_version::{AddRefusal, add_member_rule, member_add_refusal};
use crate::joins::JoinStyle;
use crate::model::*;

impl Sim<'_> {
    /// A Machine without a node joins one step, if it can.
    pub(super) fn join(&mut self) -> Played {
        let Some(pos) = self
            .cp
            .machines
            .iter()
            .position(|m| m.node_name.is_none() && !m.deleting)
        else {
            return Ok(None);
        };
        let m = self.cp.machines[pos].clone();
        if let Some(&(_, id)) = self.starting.iter().find(|(n, _)| *n == m.name) {
            return self.start_voting(pos, id);
        }
        match self.member_index(&m) {
            None => self.add_member(&m),
            Some(i) => self.promote(pos, &m, i),
        }
    }

    /// `kubeadm join` adds the member of Machine `m`, which has none yet, if etcd takes it.
    fn add_member(&mut self, m: &Machine) -> Played {
        let ns = self.cp.kcp.namespace.clone();
        let learner_join = self.cp.join_style() == JoinStyle::Learner;
        if !self.is_new(m) && self.age_past(m, self.policy.join_grace) {
            return Err((
                ReadyReason::JoinStuck,
                format!(
                    "Machine {ns}/{} has no node and no etcd member past --join-grace {}s: its join stopped, and KCP's preflight waits for every Machine's node",
                    m.name,
                    self.policy.join_grace.as_secs()
                ),
            ));
        }
        if let Some(l) = self.members().iter().find(|x| x.is_learner && learner_join) {
            return Err((
                ReadyReason::LeftoverMember,
                format!(
                    "the join of Machine {ns}/{} cannot add its member: etcd takes one learner at a time, and learner {} ({}) is listed (cluster-api #13221)",
                    m.name,
                    l.shown_name(),
                    l.id
                ),
            ));
        }
        self.add_refused(m, learner_join)?;
        let id = self.members().iter().map(|x| x.id.0).max().unwrap_or(0) + 1;
        if !learner_join {
            // kubeadm without learner mode (cmd/kubeadm/app/phases/etcd/local.go,
            // CreateStackedEtcdStaticPodManifestFile: `AddMember`, not
            // `AddMemberAsLearner`): the member votes from `member add`, and etcd lists
            // it without a name until its process starts: the quorum counts it at once.
            let mut added = Member::new(id, "");
            added.health = Health::Unhealthy("added, not started".to_string());
            self.members_mut().push(added);
            self.starting.push((m.name.clone(), MemberId(id)));
            let action = format!(
                "the node of Machine {} joins etcd as a voting member (added, not started yet)",
                m.name
            );
            return Ok(Some((StepKind::Join, m.name.clone(), action, None)));
        }
        let mut learner = Member::new(id, m.name.clone());
        learner.is_learner = true;
        learner.health = Health::Healthy;
        self.members_mut().push(learner);
        let action = format!("the node of Machine {} joins etcd as a learner", m.name);
        Ok(Some((StepKind::Join, m.name.clone(), action, None)))
    }

    /// etcd's strict reconfiguration check (on by default) adds a member, learners too, only
    /// while enough voting members are connected to the member asked: every one of them
    /// before etcd PR #21641, a quorum of them and the new one since (3.5.30, 3.6.11, 3.7):
    /// the version rule of [`crate::etcd_version`]. A healthy voting member stands for a
    /// connected one. `Err` when it refuses the member of Machine `m`.
    fn add_refused(&self, m: &Machine, learner_join: bool) -> Result<(), Stuck> {
        let ns = &self.cp.kcp.namespace;
        let rule = add_member_rule(self.members());
        let c = Counts::of(self.members());
        let started = self
            .members()
            .iter()
            .filter(|x| !x.is_learner && !x.is_unstarted())
            .count();
        let refusal = member_add_refusal(rule.rule, c.voting, started, c.healthy, learner_join);
        if let Some(AddRefusal::NotEnoughStarted { started, needed }) = refusal {
            return Err((
                ReadyReason::MemberUnhealthy,
                format!(
                    "the join of Machine {ns}/{} cannot add its member as a voting member: etcd's strict reconfiguration check needs {needed} started voting members once it is in, and {started} of {} have started",
                    m.name, c.voting
                ),
            ));
        }
        if let Some(AddRefusal::NotConnected { needed, .. }) = refusal {
            let down: Vec<String> = self
                .members()
                .iter()
                .filter(|x| !x.is_learner && !x.effective_health_ref().is_healthy())
                .map(|x| format!("{} ({})", x.shown_name(), x.id))
                .collect();
            return Err((
                ReadyReason::MemberUnhealthy,
                format!(
                    "the join of Machine {ns}/{} cannot add its member: {}, and {} {} not healthy ({} healthy of {} voting, {needed} needed)",
                    m.name,
                    rule.describe(),
                    down.join(", "),
                    if down.len() == 1 { "is" } else { "are" },
                    c.healthy,
                    c.voting
                ),
            ));
        }
        Ok(())
    }

    /// The member of Machine `m` (at `pos`, its member at `i`) is promoted if it is a learner
    /// that can be, and the Machine has its node.
    fn promote(&mut self, pos: usize, m: &Machine, i: usize) -> Played {
        let ns = self.cp.kcp.namespace.clone();
        let x = self.members()[i].clone();
        if x.is_learner {
            if !self.is_new(m) && self.age_past(m, self.policy.learner_grace) {
                return Err((
                    ReadyReason::LearnerNotPromoted,
                    format!(
                        "etcd member {} of Machine {ns}/{} is still a learner past --learner-grace {}s: nobody will promote it, and KCP's preflight waits for it",
                        x.name,
                        m.name,
                        self.policy.learner_grace.as_secs()
                    ),
                ));
            }
            if !x.effective_health_ref().is_healthy() || !self.has_quorum() {
                return Err((
                    ReadyReason::MemberUnhealthy,
                    format!(
                        "learner {} of Machine {ns}/{} cannot be promoted: it is not healthy or etcd has no quorum",
                        x.name, m.name
                    ),
                ));
            }
            self.members_mut()[i].is_learner = false;
        }
        self.cp.machines[pos].node_name = Some(x.name.clone());
        let action = format!(
            "learner {} is promoted to a voting member; Machine {} has its node",
            x.name, m.name
        );
        Ok(Some((StepKind::Promote, m.name.clone(), action, None)))
    }

    /// The voting member a Machine's join added starts: it needs etcd's quorum to catch up and
    /// publish its name, then the Machine has its node.
    pub(super) fn start_voting(&mut self, pos: usize, id: MemberId) -> Played {
        let ns = self.cp.kcp.namespace.clone();
        let name = self.cp.machines[pos].name.clone();
        // It catches up from a leader, which needs a quorum of voters up, itself included
        // (etcd's one-member case: the second member restores the quorum the add took away).
        let c = Counts::of(self.members());
        if c.healthy + 1 < c.quorum {
            return Err((
                ReadyReason::MemberUnhealthy,
                format!(
                    "the voting member added for Machine {ns}/{name} cannot start: with it, {} of {} voting members are healthy, {} needed for a leader to catch it up",
                    c.healthy + 1,
                    c.voting,
                    c.quorum
                ),
            ));
        }
        let Some(i) = self.members().iter().position(|x| x.id == id) else {
            // The member was removed under the join (not a step the play takes): the join
            // stays stopped.
            return Err((
                ReadyReason::JoinStuck,
                format!("the member added for Machine {ns}/{name} is gone: its join stopped"),
            ));
        };
        let member = &mut self.members_mut()[i];
        member.name = name.clone();
        member.health = Health::Healthy;
        self.cp.machines[pos].node_name = Some(name.clone());
        self.starting.retain(|(n, _)| *n != name);
        let action =
            format!("voting member {name} starts and catches up; Machine {name} has its node");
        Ok(Some((StepKind::Start, name, action, None)))
    }
}
