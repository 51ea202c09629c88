//! The record while a changed member list awaits confirmation: both lists together.

use std::collections::BTreeSet;
use std::time::Duration;

use super::{Belief, CONFIRMED_UNHEALTHY};
use crate::model::{Health, Member, MemberId};

impl Belief {
    /// The record while a changed member list awaits confirmation: `probe`'s members, each new
    /// one not healthy, each one that stays judged as usual without updating the belief, and
    /// the members of `record` that `probe` no longer lists, never healthy.
    pub(super) fn both_lists(
        &self,
        probe: Vec<Member>,
        record: &[Member],
        believed: &BTreeSet<MemberId>,
        et: Duration,
    ) -> Vec<Member> {
        let et = humantime::format_duration(et);
        let listed: BTreeSet<MemberId> = probe.iter().map(|m| m.id).collect();
        let mut out: Vec<Member> = probe
            .into_iter()
            .map(|mut m| {
                let why = match &m.health {
                    _ if !believed.contains(&m.id) => Some(format!(
                        "new in etcd's member list: not counted healthy until a probe at least {et} later lists it too"
                    )),
                    Health::Healthy => None,
                    Health::Unhealthy(_) | Health::Unknown | Health::Unconfirmed(_)
                        if self.unhealthy.contains(&m.id) =>
                    {
                        m.health = Health::Unhealthy(CONFIRMED_UNHEALTHY.into());
                        None
                    }
                    Health::Unhealthy(e) => Some(format!(
                        "{e} (seen by one probe: believed when a probe at least {et} later sees it too)"
                    )),
                    Health::Unknown | Health::Unconfirmed(_) => None,
                };
                if let Some(why) = why {
                    m.health = Health::Unconfirmed(why);
                }
                m
            })
            .collect();
        // A missing member is unknown, never unhealthy, whatever the record held: counted
        // unhealthy it would raise the quorum of both lists together past what either list
        // has, and the record would claim a quorum loss that neither list shows (a removed
        // member known down, and a new member not started yet). A missing member that never
        // started counts unhealthy by its empty name alone, so it is left out: it held no
        // data and matches no Machine.
        let missing = |r: &&Member| !listed.contains(&r.id) && !r.is_unstarted();
        out.extend(record.iter().filter(missing).map(|r| {
            let mut m = r.clone();
            m.is_leader = false;
            m.health = Health::Unconfirmed(format!(
                "missing from etcd's latest member list: its removal is believed when a probe at least {et} later lists the same members"
            ));
            m
        }));
        out
    }
}
