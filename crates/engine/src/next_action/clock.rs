//! Machines' ages against `--join-grace` and `--learner-grace`, and the times messages name.

use crate::model::{Machine, Policy};

fn secs(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// Unix seconds as RFC 3339 (UTC). Absolute times, not ages: a published message that said
/// "4m ago" would be false a minute later, or rewritten every minute.
pub(crate) fn at(unix: i64) -> String {
    let t = u64::try_from(unix).unwrap_or(0);
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t))
        .to_string()
}

/// The clock of the next action: Machines' ages against the two grace periods.
pub(super) struct Clock<'a> {
    pub(super) policy: &'a Policy,
    pub(super) now_unix: i64,
}

impl Clock<'_> {
    fn within(&self, m: &Machine, grace: std::time::Duration) -> bool {
        m.created_unix
            .is_some_and(|c| self.now_unix.saturating_sub(c) < secs(grace))
    }

    /// Created within `--join-grace`: may still get its member.
    pub(super) fn joining(&self, m: &Machine) -> bool {
        self.within(m, self.policy.join_grace)
    }

    /// Created within `--learner-grace`: its learner may still be promoted by kubeadm.
    pub(super) fn learning(&self, m: &Machine) -> bool {
        self.within(m, self.policy.learner_grace)
    }

    /// "created at T0; at T1, after --join-grace 10m," for a Machine: what bounds a wait.
    pub(super) fn bound(&self, m: &Machine, grace: std::time::Duration, flag: &str) -> String {
        match m.created_unix {
            Some(c) => format!(
                "created at {}; at {}, after {flag} {},",
                at(c),
                at(c.saturating_add(secs(grace))),
                humantime::format_duration(grace)
            ),
            None => format!(
                "creation time unknown; after {flag} {},",
                humantime::format_duration(grace)
            ),
        }
    }

    /// "created at T0", or that it is not known.
    pub(super) fn created(&self, m: &Machine) -> String {
        m.created_unix
            .map_or("of unknown creation time".into(), |c| {
                format!("created at {}", at(c))
            })
    }
}
