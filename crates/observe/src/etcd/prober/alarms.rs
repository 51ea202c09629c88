//! etcd's alarms (NOSPACE, CORRUPT): read from the alarm list and from the entries every
//! member repeats in its status `errors`, and attached to the member they name.

use etcd_client::AlarmType;

use quorumguard_engine::model::{Alarm, Member, MemberId};

/// The engine's alarm for etcd's, or `None` for "no alarm".
pub(super) fn alarm_of(t: AlarmType) -> Option<Alarm> {
    match t {
        AlarmType::None => None,
        AlarmType::Nospace => Some(Alarm::NoSpace),
        AlarmType::Corrupt => Some(Alarm::Corrupt),
    }
}

/// A status `errors` entry naming an alarm: `memberID:<decimal id> alarm:<TYPE> `.
pub(super) fn parse_alarm(entry: &str) -> Option<(u64, Alarm)> {
    let rest = entry.trim().strip_prefix("memberID:")?;
    let (id, kind) = rest.split_once(" alarm:")?;
    let id = id.trim().parse().ok()?;
    let alarm = match kind.trim() {
        "NOSPACE" => Alarm::NoSpace,
        "CORRUPT" => Alarm::Corrupt,
        "NONE" | "" => return None,
        other => Alarm::Other(other.to_string()),
    };
    Some((id, alarm))
}

/// Attaches each alarm to the member it names (once); an alarm naming a member not in the list
/// becomes a warning.
pub(super) fn attach_alarms(
    members: &mut [Member],
    alarms: impl IntoIterator<Item = (u64, Alarm)>,
    warnings: &mut Vec<String>,
) {
    for (id, alarm) in alarms {
        match members.iter_mut().find(|m| m.id.0 == id) {
            Some(m) if !m.alarms.contains(&alarm) => m.alarms.push(alarm),
            Some(_) => {}
            None => {
                let w = format!(
                    "alarm {alarm} names member {}, not in the member list",
                    MemberId(id)
                );
                if !warnings.contains(&w) {
                    warnings.push(w);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarm_entries_parse_as_etcd_writes_them() {
        assert_eq!(
            parse_alarm("memberID:1616332077818005593 alarm:NOSPACE "),
            Some((1616332077818005593, Alarm::NoSpace))
        );
        assert_eq!(
            parse_alarm("memberID:12 alarm:CORRUPT"),
            Some((12, Alarm::Corrupt))
        );
        assert_eq!(parse_alarm("etcdserver: no leader"), None);
        assert_eq!(parse_alarm("memberID:x alarm:NOSPACE"), None);
    }

    #[test]
    fn alarms_attach_once_to_the_member_they_name() {
        let mut members = vec![Member::new(5, "m1"), Member::new(7, "m2")];
        let mut warnings = Vec::new();
        attach_alarms(
            &mut members,
            [
                (7, Alarm::NoSpace),
                (7, Alarm::NoSpace),
                (9, Alarm::Corrupt),
                (9, Alarm::Corrupt),
            ],
            &mut warnings,
        );
        assert!(members[0].alarms.is_empty());
        assert_eq!(members[1].alarms, [Alarm::NoSpace]);
        assert_eq!(
            warnings,
            ["alarm CORRUPT names member 9, not in the member list"]
        );
    }
}
