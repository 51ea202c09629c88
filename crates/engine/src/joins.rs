//! How a new control-plane node's etcd member joins: as a learner (which does not vote until
//! etcd promotes it, in sync) or as a voting member (which counts from `member add`, before it
//! is healthy). The rules that count a member about to join follow this: a learner join never
//! raises the quorum, so it can never be the reason a removal loses it.
//!
//! kubeadm decides, by its `EtcdLearnerMode` feature gate (kubernetes `cmd/kubeadm/app/features`,
//! and its release notes):
//! - before v1.27 the gate does not exist: `kubeadm join` adds a voting member;
//! - v1.27 and v1.28 (alpha, default off): a learner only when the gate is set to true;
//! - v1.29 to v1.31 (beta, default on): a learner unless the gate is set to false;
//! - v1.32 (GA, locked to on; kubernetes#126374) and later (the gate is gone from v1.33): a
//!   learner, always.
//!
//! KCP creates every new Machine with `spec.version` and passes
//! `kubeadmConfigSpec.clusterConfiguration.featureGates` to kubeadm, so the KCP's spec decides
//! for the joins to come. Where the version cannot be read, what etcd shows decides: a learner
//! listed now was added by a learner join. Without either, joins are taken as voting: that
//! counts a join as raising the quorum, the stricter reading.

use std::fmt;

use super::model::ControlPlane;

/// Whether a join adds a learner or a voting member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JoinStyle {
    /// `member add --learner`, promoted by kubeadm once etcd finds it in sync: it never votes
    /// before it is healthy.
    Learner,
    /// `member add`: the new member votes from then on, unhealthy until it has started.
    Voting,
}

/// What the join style was read from, for the words that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinBasis {
    /// The KCP's `spec.version`, with the `EtcdLearnerMode` gate where it is set.
    Kubeadm { version: String, gate: Option<bool> },
    /// No readable version; etcd lists a learner.
    LearnerListed,
    /// No readable version and no learner listed: voting assumed.
    Assumed,
}

/// The join style of one control plane and what it rests on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Joins {
    pub style: JoinStyle,
    pub basis: JoinBasis,
}

impl Joins {
    pub fn learner(&self) -> bool {
        self.style == JoinStyle::Learner
    }
}

impl fmt::Display for JoinStyle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JoinStyle::Learner => "learner",
            JoinStyle::Voting => "voting",
        })
    }
}

/// "learner (kubeadm v1.32)", "voting (kubeadm v1.28, EtcdLearnerMode off by default)".
impl fmt::Display for Joins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (", self.style)?;
        match &self.basis {
            JoinBasis::Kubeadm { version, gate } => {
                write!(f, "kubeadm {version}")?;
                match gate {
                    Some(g) => write!(f, ", EtcdLearnerMode={g}")?,
                    None => {
                        if let Some(minor) = minor_of(version)
                            && (27..29).contains(&minor)
                        {
                            f.write_str(", EtcdLearnerMode off by default before v1.29")?;
                        }
                    }
                }
            }
            JoinBasis::LearnerListed => f.write_str("etcd lists a learner; KCP version unknown")?,
            JoinBasis::Assumed => f.write_str("assumed: KCP version unknown")?,
        }
        f.write_str(")")
    }
}

/// The minor version of a Kubernetes version ("v1.32.3" -> 32), when it is a 1.x version.
pub fn minor_of(version: &str) -> Option<u32> {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split('.');
    if parts.next()? != "1" {
        return None;
    }
    let minor = parts.next()?;
    let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// kubeadm's join style for a Kubernetes minor version and the gate as set (see the module
/// doc). A gate set where it does not exist (before v1.27) or is locked (v1.32 on) is ignored,
/// as kubeadm's validation refuses the former and the latter cannot change anything.
pub fn kubeadm_style(minor: u32, gate: Option<bool>) -> JoinStyle {
    let learner = match minor {
        0..=26 => false,
        27 | 28 => gate == Some(true),
        29..=31 => gate != Some(false),
        _ => true,
    };
    if learner {
        JoinStyle::Learner
    } else {
        JoinStyle::Voting
    }
}

impl ControlPlane {
    /// [`ControlPlane::joins`]'s style alone, without the words (what every decision reads).
    pub fn join_style(&self) -> JoinStyle {
        if let Some(minor) = self.kcp.version.as_deref().and_then(minor_of) {
            return kubeadm_style(minor, self.kcp.etcd_learner_mode);
        }
        if self.members().iter().any(|m| m.is_learner) {
            JoinStyle::Learner
        } else {
            JoinStyle::Voting
        }
    }

    /// How the next member of this control plane joins (see the module doc).
    pub fn joins(&self) -> Joins {
        let style = self.join_style();
        let basis = match self.kcp.version.as_deref() {
            Some(version) if minor_of(version).is_some() => JoinBasis::Kubeadm {
                version: version.to_string(),
                gate: self.kcp.etcd_learner_mode,
            },
            _ if style == JoinStyle::Learner => JoinBasis::LearnerListed,
            _ => JoinBasis::Assumed,
        };
        Joins { style, basis }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{cp, healthy};

    #[test]
    fn kubeadm_versions_decide_the_join_style() {
        use JoinStyle::*;
        for (minor, gate, want) in [
            (26, None, Voting),
            (26, Some(true), Voting),
            (27, None, Voting),
            (28, Some(true), Learner),
            (29, None, Learner),
            (31, Some(false), Voting),
            (31, Some(true), Learner),
            (32, Some(false), Learner),
            (32, None, Learner),
            (35, None, Learner),
        ] {
            assert_eq!(kubeadm_style(minor, gate), want, "v1.{minor} gate {gate:?}");
        }
    }

    #[test]
    fn versions_parse_with_or_without_v_and_patch() {
        assert_eq!(minor_of("v1.32.3"), Some(32));
        assert_eq!(minor_of("1.28"), Some(28));
        assert_eq!(minor_of("v1.30.0-rc.1"), Some(30));
        assert_eq!(minor_of("v2.0.0"), None);
        assert_eq!(minor_of("latest"), None);
    }

    #[test]
    fn the_kcp_spec_decides_and_etcd_only_without_a_version() {
        let mut c = cp(3, &[("a", healthy()), ("b", healthy()), ("c", healthy())]);
        c.kcp.version = Some("v1.32.0".into());
        let j = c.joins();
        assert!(j.learner());
        assert_eq!(j.to_string(), "learner (kubeadm v1.32.0)");
        c.kcp.version = Some("v1.28.4".into());
        assert_eq!(
            c.joins().to_string(),
            "voting (kubeadm v1.28.4, EtcdLearnerMode off by default before v1.29)"
        );
        c.kcp.etcd_learner_mode = Some(true);
        assert_eq!(
            c.joins().to_string(),
            "learner (kubeadm v1.28.4, EtcdLearnerMode=true)"
        );
        c.kcp.version = None;
        assert_eq!(c.joins().style, JoinStyle::Voting);
        assert_eq!(c.joins().basis, JoinBasis::Assumed);
        crate::testkit::add_member(&mut c, 9, "d", healthy(), true);
        assert_eq!(c.joins().basis, JoinBasis::LearnerListed);
        assert!(c.joins().learner());
    }
}
