//! What etcd's version changes in the rules: which check etcd's strict reconfiguration check
//! (`--strict-reconfig-check`, on by default) makes before it adds a member.
//!
//! etcd-io/etcd `server/etcdserver/server.go` `mayAddMember` (3.4: `etcdserver/server.go`), run
//! on the member that receives the `MemberAdd` request, with that member's own peer transport:
//! 1. a **voting** add only: `IsReadyToAddVotingMember`: the started voting members must reach
//!    the quorum of the voting members plus the new one (a 1-member cluster may always grow);
//!    a learner add skips this;
//! 2. every add, learners too: the receiving member must have been connected to its voting
//!    peers for `HealthInterval` (5 s):
//!    - **every** voting member (`isConnectedFullySince`): 3.4 (all of it, up to 3.4.45),
//!      3.5.0 to 3.5.29, 3.6.0 to 3.6.10, 3.7.0-alpha.0;
//!    - **a quorum of the voting members plus the new one**, the new one counted as not
//!      connected (`isConnectedToQuorumAfterAddingNewMemberSince`; a 1-member cluster may always
//!      grow): etcd PR #21641 (merged 2026-04-26 on main, first in v3.7.0-beta.0), backported by
//!      #21669 to release-3.5 (first in v3.5.30, 2026-05-01) and by #21667 to release-3.6 (first
//!      in v3.6.11, 2026-05-01); CHANGELOG-3.5.md and CHANGELOG-3.6.md list it under those
//!      releases.
//!
//! So #21641 changes nothing for 3 voting members with one down (2 connected < quorum(4) = 3):
//! it lets a member in with one of 4 or of 5 down, not 2 of 5 (its e2e test
//! `TestCtlV3MemberAddAsLearnerWithOneMemberDown`, tests/e2e/ctl_v3_member_test.go).
//!
//! Either way etcd answers "etcdserver: unhealthy cluster" (`ErrUnhealthy`) or "etcdserver:
//! re-configuration failed due to not enough started members" (`ErrNotEnoughStartedMembers`).
//! Promotion (`mayPromoteMember`) needs the learner in sync (≥ 90 % of the leader's match) and
//! the started voting members, the learner counted as one, to reach the quorum of the voting
//! members plus one; removal (`mayRemoveMember`) needs nothing for a learner, and for a voting
//! member the started members left to keep their quorum and, unless the removed member is down,
//! the connected members less it to keep the quorum of the members left. Neither changed with
//! #21641.
//!
//! Which version decides: the receiving member's, and kubeadm's etcd client sends its
//! `MemberAdd` to any endpoint it is given (all of the control plane's). So the cluster follows
//! the relaxed rule only when every voting member whose version is known runs a version that
//! carries #21641; a cluster with no known version follows the strict one (the rule before
//! #21641, which etcd 3.4.23 and 3.5.1, the versions tested here, both follow).

use std::fmt;

use super::model::Member;
use super::quorum::quorum;

/// An etcd release as `Status` reports it (`3.4.23`, `3.5.1`, `3.6.0`, `3.7.0-rc.0`; a leading
/// `v` is accepted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// The pre-release after `-` (`alpha.0`, `rc.1`), empty for a release.
    pub pre: String,
}

impl EtcdVersion {
    /// `None` when the text is not `MAJOR.MINOR.PATCH[-PRE]`.
    pub fn parse(text: &str) -> Option<EtcdVersion> {
        let text = text.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let (core, pre) = match text.split_once('-') {
            Some((core, pre)) if !pre.is_empty() => (core, pre),
            Some(_) => return None,
            None => (text, ""),
        };
        let mut parts = core.split('.');
        let mut number = || -> Option<u32> {
            let p = parts.next()?;
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            p.parse().ok()
        };
        let (major, minor, patch) = (number()?, number()?, number()?);
        if parts.next().is_some() {
            return None;
        }
        Some(EtcdVersion {
            major,
            minor,
            patch,
            pre: pre.to_string(),
        })
    }

    /// Whether this release carries etcd PR #21641 (see the module's list). Releases of a
    /// major other than 3 are not known here and count as not carrying it.
    pub fn relaxes_member_add(&self) -> bool {
        if self.major != 3 {
            return false;
        }
        let released = self.pre.is_empty();
        match self.minor {
            0..=4 => false,
            5 => self.patch >= 30 && (released || self.patch > 30),
            6 => self.patch >= 11 && (released || self.patch > 11),
            // 3.7.0-alpha.0 was cut before #21641 merged; beta.0 and rc.0 carry it.
            7 if self.patch == 0 && !released => !self.pre.starts_with("alpha"),
            _ => true,
        }
    }

    /// The check this release makes before it adds a member.
    pub fn add_member_rule(&self) -> AddMemberRule {
        if self.relaxes_member_add() {
            AddMemberRule::ConnectedQuorum
        } else {
            AddMemberRule::EveryVotingMemberConnected
        }
    }
}

/// Releases in order; a pre-release comes before its release (`3.7.0-rc.0` < `3.7.0`), and
/// pre-releases of one release compare as text.
impl Ord for EtcdVersion {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Greater,
                (false, true) => std::cmp::Ordering::Less,
                (false, false) => self.pre.cmp(&other.pre),
            })
    }
}

impl PartialOrd for EtcdVersion {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if !self.pre.is_empty() {
            write!(f, "-{}", self.pre)?;
        }
        Ok(())
    }
}

/// What etcd's strict reconfiguration check asks of the voting members before it adds a member
/// (a learner or a voting one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddMemberRule {
    /// Before etcd PR #21641 (3.4, 3.5.0–3.5.29, 3.6.0–3.6.10), and whenever the version is
    /// unknown: every voting member connected to the member asked.
    EveryVotingMemberConnected,
    /// With #21641 (3.5.30+, 3.6.11+, 3.7): a quorum of the voting members plus the new one
    /// connected, the new one not counted.
    ConnectedQuorum,
}

impl AddMemberRule {
    /// Whether etcd's connection check lets a member in: `voting` voting members, `connected`
    /// of them connected (the member asked included).
    pub fn admits(self, voting: usize, connected: usize) -> bool {
        match self {
            AddMemberRule::EveryVotingMemberConnected => connected >= voting,
            AddMemberRule::ConnectedQuorum => voting <= 1 || connected >= quorum(voting + 1),
        }
    }

    /// How many connected voting members the check needs.
    pub fn needs(self, voting: usize) -> usize {
        match self {
            AddMemberRule::EveryVotingMemberConnected => voting,
            AddMemberRule::ConnectedQuorum if voting <= 1 => voting,
            AddMemberRule::ConnectedQuorum => quorum(voting + 1),
        }
    }

    /// What the rule needs, in words: "every voting member is connected".
    pub fn condition(self) -> &'static str {
        match self {
            AddMemberRule::EveryVotingMemberConnected => "every voting member is connected",
            AddMemberRule::ConnectedQuorum => {
                "a quorum of the voting members and the new one is connected"
            }
        }
    }

    /// Where the rule comes from, with the versions it holds for.
    pub fn source(self) -> &'static str {
        match self {
            AddMemberRule::EveryVotingMemberConnected => {
                "its strict reconfiguration check before etcd 3.5.30 and 3.6.11"
            }
            AddMemberRule::ConnectedQuorum => {
                "its strict reconfiguration check since etcd 3.5.30, 3.6.11 and 3.7, etcd PR #21641"
            }
        }
    }
}

/// The versions of a cluster's voting members and the rule they make etcd follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterAddRule {
    pub rule: AddMemberRule,
    /// The oldest version among the voting members that report one (`None`: none does).
    pub oldest: Option<String>,
    /// A reported version that is not `MAJOR.MINOR.PATCH` (then the rule is the strict one).
    pub unreadable: Option<String>,
}

impl ClusterAddRule {
    /// Which etcd, as messages name it: "etcd 3.4.23", "etcd (version unknown, taken as before
    /// 3.5.30)".
    pub fn etcd(&self) -> String {
        match (&self.unreadable, &self.oldest) {
            (Some(v), _) => {
                format!("etcd (version {v:?} not understood, taken as before 3.5.30)")
            }
            (None, Some(v)) => format!("etcd {v}"),
            (None, None) => "etcd (version unknown, taken as before 3.5.30)".to_string(),
        }
    }

    /// "etcd 3.4.23 adds a member only while every voting member is connected (its strict
    /// reconfiguration check before etcd 3.5.30 and 3.6.11)", for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} adds a member only while {} ({})",
            self.etcd(),
            self.rule.condition(),
            self.rule.source()
        )
    }
}

/// **The version rule**: which check etcd makes before it adds a member to this cluster.
///
/// etcd runs the check on the member that receives the request, and kubeadm may send it to any,
/// so every voting member whose version is known must carry #21641 for the relaxed rule; a
/// cluster whose voting members report no version, or one etcd version this module cannot read,
/// gets the strict rule ([`AddMemberRule::EveryVotingMemberConnected`]).
pub fn add_member_rule(members: &[Member]) -> ClusterAddRule {
    let mut oldest: Option<(EtcdVersion, String)> = None;
    let mut unreadable = None;
    for v in members
        .iter()
        .filter(|m| !m.is_learner)
        .filter_map(|m| m.version.as_deref())
    {
        match EtcdVersion::parse(v) {
            Some(parsed) => {
                if oldest.as_ref().is_none_or(|(o, _)| parsed < *o) {
                    oldest = Some((parsed, v.to_string()));
                }
            }
            None => unreadable = Some(v.to_string()),
        }
    }
    let rule = match (&unreadable, &oldest) {
        (None, Some((o, _))) => {
            let all = members
                .iter()
                .filter(|m| !m.is_learner)
                .filter_map(|m| m.version.as_deref())
                .filter_map(EtcdVersion::parse)
                .all(|v| v.relaxes_member_add());
            if all && o.relaxes_member_add() {
                AddMemberRule::ConnectedQuorum
            } else {
                AddMemberRule::EveryVotingMemberConnected
            }
        }
        _ => AddMemberRule::EveryVotingMemberConnected,
    };
    ClusterAddRule {
        rule,
        oldest: oldest.map(|(_, text)| text),
        unreadable,
    }
}

/// Why etcd's strict reconfiguration check refuses to add a member, if it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddRefusal {
    /// A voting add with fewer started voting members than the quorum after it
    /// (`IsReadyToAddVotingMember`, "not enough started members").
    NotEnoughStarted { started: usize, needed: usize },
    /// Too few voting members connected for the rule ("etcdserver: unhealthy cluster").
    NotConnected {
        rule: AddMemberRule,
        connected: usize,
        needed: usize,
    },
}

/// What etcd does with a member add, from counts: `voting` voting members, `started` of them
/// started (named), `connected` of them connected to the member asked (itself included), the new
/// member a learner or not. `None`: the check lets it in.
pub fn member_add_refusal(
    rule: AddMemberRule,
    voting: usize,
    started: usize,
    connected: usize,
    learner: bool,
) -> Option<AddRefusal> {
    if !learner {
        let needed = quorum(voting + 1);
        let one_member = started == 1 && voting == 1;
        if !one_member && started < needed {
            return Some(AddRefusal::NotEnoughStarted { started, needed });
        }
    }
    if !rule.admits(voting, connected) {
        return Some(AddRefusal::NotConnected {
            rule,
            connected,
            needed: rule.needs(voting),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Health;

    fn v(text: &str) -> EtcdVersion {
        EtcdVersion::parse(text).unwrap_or_else(|| panic!("{text} does not parse"))
    }

    #[test]
    fn versions_parse_as_status_reports_them() {
        assert_eq!(
            v("3.4.23"),
            EtcdVersion {
                major: 3,
                minor: 4,
                patch: 23,
                pre: String::new()
            }
        );
        assert_eq!(v("v3.5.1").to_string(), "3.5.1");
        assert_eq!(v("3.7.0-rc.0").pre, "rc.0");
        for bad in [
            "", "3.5", "3.5.x", "3.5.1.2", "3.5.1-", "three", "3..1", "-3.5.1",
        ] {
            assert_eq!(EtcdVersion::parse(bad), None, "{bad:?}");
        }
        assert!(v("3.5.9") < v("3.5.10"));
        assert!(v("3.7.0-rc.0") < v("3.7.0"));
    }

    #[test]
    fn the_releases_that_carry_21641() {
        for strict in [
            "3.3.27",
            "3.4.0",
            "3.4.23",
            "3.4.45",
            "3.5.0",
            "3.5.1",
            "3.5.29",
            "3.5.30-rc.0",
            "3.6.0",
            "3.6.10",
            "3.6.11-alpha.0",
            "3.7.0-alpha.0",
            "2.3.8",
            "4.0.0",
        ] {
            assert_eq!(
                v(strict).add_member_rule(),
                AddMemberRule::EveryVotingMemberConnected,
                "{strict}"
            );
        }
        for relaxed in [
            "3.5.30",
            "3.5.33",
            "3.6.11",
            "3.6.14",
            "3.7.0-beta.0",
            "3.7.0-rc.0",
            "3.7.0",
            "3.7.1",
            "3.8.0",
        ] {
            assert_eq!(
                v(relaxed).add_member_rule(),
                AddMemberRule::ConnectedQuorum,
                "{relaxed}"
            );
        }
    }

    #[test]
    fn what_each_rule_admits() {
        let strict = AddMemberRule::EveryVotingMemberConnected;
        let relaxed = AddMemberRule::ConnectedQuorum;
        // 3 voting, 1 down: etcd 3.4.23 and 3.5.1 refuse (seen), and so does #21641: 2 connected
        // < quorum(4) = 3 (its e2e test TestCtlV3MemberAddAsLearnerWithOneMemberDown, "1 out of
        // 3 members is down, reject adding member").
        assert!(!strict.admits(3, 2));
        assert!(!relaxed.admits(3, 2));
        // 5 voting, 1 down: only the relaxed rule admits (4 >= quorum(6) = 4).
        assert!(!strict.admits(5, 4));
        assert!(relaxed.admits(5, 4));
        assert!(!relaxed.admits(5, 3));
        // 4 voting (KCP mid-rollout with maxSurge 1), 1 down: 3 >= quorum(5) = 3.
        assert!(relaxed.admits(4, 3));
        assert!(!strict.admits(4, 3));
        // A one-member cluster may always grow under #21641.
        assert!(relaxed.admits(1, 1));
        assert!(strict.admits(1, 1));
        assert!(strict.admits(3, 3) && relaxed.admits(3, 3));
        assert_eq!(strict.needs(5), 5);
        assert_eq!(relaxed.needs(5), 4);
        assert_eq!(relaxed.needs(3), 3);
    }

    #[test]
    fn a_voting_add_needs_started_members_a_learner_add_does_not() {
        let relaxed = AddMemberRule::ConnectedQuorum;
        // 3 voting, one added but never started: a voting add needs 3 started of quorum(4).
        assert_eq!(
            member_add_refusal(relaxed, 3, 2, 3, false),
            Some(AddRefusal::NotEnoughStarted {
                started: 2,
                needed: 3
            })
        );
        assert_eq!(member_add_refusal(relaxed, 3, 2, 3, true), None);
        // etcd's one-member restore case: 1 voting, 1 started.
        assert_eq!(member_add_refusal(relaxed, 1, 1, 1, false), None);
        assert_eq!(
            member_add_refusal(AddMemberRule::EveryVotingMemberConnected, 3, 3, 2, true),
            Some(AddRefusal::NotConnected {
                rule: AddMemberRule::EveryVotingMemberConnected,
                connected: 2,
                needed: 3
            })
        );
    }

    fn member(id: u64, version: Option<&str>, learner: bool) -> Member {
        let mut m = Member::new(id, format!("m{id}"));
        m.version = version.map(str::to_string);
        m.is_learner = learner;
        m.health = Health::Healthy;
        m
    }

    #[test]
    fn the_cluster_follows_its_oldest_voting_member_and_unknown_is_strict() {
        let relaxed = [
            member(1, Some("3.6.11"), false),
            member(2, Some("3.5.30"), false),
        ];
        let r = add_member_rule(&relaxed);
        assert_eq!(r.rule, AddMemberRule::ConnectedQuorum);
        assert_eq!(r.oldest.as_deref(), Some("3.5.30"));
        assert_eq!(
            r.describe(),
            "etcd 3.5.30 adds a member only while a quorum of the voting members and the new one \
             is connected (its strict reconfiguration check since etcd 3.5.30, 3.6.11 and 3.7, \
             etcd PR #21641)"
        );

        // Mid-upgrade: one member still before #21641 may be the one kubeadm asks.
        let mixed = [
            member(1, Some("3.6.11"), false),
            member(2, Some("3.6.10"), false),
        ];
        assert_eq!(
            add_member_rule(&mixed).rule,
            AddMemberRule::EveryVotingMemberConnected
        );
        // A down member reports no version: the others decide.
        let one_down = [member(1, Some("3.6.11"), false), member(2, None, false)];
        assert_eq!(
            add_member_rule(&one_down).rule,
            AddMemberRule::ConnectedQuorum
        );
        // A learner refuses MemberAdd: its version does not count.
        let learner_old = [
            member(1, Some("3.6.11"), false),
            member(2, Some("3.4.23"), true),
        ];
        assert_eq!(
            add_member_rule(&learner_old).rule,
            AddMemberRule::ConnectedQuorum
        );
        let unknown = [member(1, None, false), member(2, None, false)];
        let r = add_member_rule(&unknown);
        assert_eq!(r.rule, AddMemberRule::EveryVotingMemberConnected);
        assert_eq!(
            r.describe(),
            "etcd (version unknown, taken as before 3.5.30) adds a member only while every \
             voting member is connected (its strict reconfiguration check before etcd 3.5.30 \
             and 3.6.11)"
        );
        let garbled = [
            member(1, Some("3.6.11"), false),
            member(2, Some("next"), false),
        ];
        let r = add_member_rule(&garbled);
        assert_eq!(r.rule, AddMemberRule::EveryVotingMemberConnected);
        assert!(
            r.describe().contains("\"next\" not understood"),
            "{}",
            r.describe()
        );
        assert_eq!(
            add_member_rule(&[]).rule,
            AddMemberRule::EveryVotingMemberConnected
        );
    }
}
