//! `etcdctl alarm list` dumps: each alarm a member raised (NOSPACE, CORRUPT), and which etcd
//! cluster the list came from.

use super::*;

/// Parses one `memberID:<id> alarm:<TYPE>` (decimal ID as etcdctl prints it; hex accepted with
/// 0x). `None` when the text has another shape.
pub fn parse_alarm(text: &str) -> Option<Result<AlarmEntry, String>> {
    let rest = text.trim().strip_prefix("memberID:")?;
    let (id, alarm) = rest.split_once(char::is_whitespace)?;
    let alarm = alarm.trim().strip_prefix("alarm:")?.trim();
    let id = if id.starts_with("0x") || id.starts_with("0X") {
        parse_hex_id(id)
    } else {
        id.parse::<u64>().ok()
    };
    let Some(id) = id else {
        return Some(Err(format!("member ID {:?} is not a number", text.trim())));
    };
    let alarm = match alarm {
        "NOSPACE" => Alarm::NoSpace,
        "CORRUPT" => Alarm::Corrupt,
        "" => return Some(Err("alarm type is empty".into())),
        other => Alarm::Other(other.to_string()),
    };
    Some(Ok(AlarmEntry {
        member_id: MemberId(id),
        alarm,
    }))
}

/// etcd's `AlarmResponse` as etcdctl prints it: a header, and `alarms` when there are any.
/// Nothing else: another etcdctl output (a member list has `members`) is not an alarm list.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AlarmListJson {
    header: HeaderJson,
    #[serde(default)]
    alarms: Vec<AlarmJson>,
}

#[derive(Deserialize)]
struct AlarmJson {
    #[serde(rename = "memberID", alias = "member_id", deserialize_with = "de_id")]
    member_id: u64,
    #[serde(default)]
    alarm: AlarmTypeJson,
}

/// etcd's `AlarmType`: a number as etcdctl's JSON prints it, or its name.
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum AlarmTypeJson {
    #[default]
    None,
    Number(u64),
    Name(String),
}

/// The command whose JSON [`parse_alarm_list`] also reads.
pub const ALARM_LIST: &str = "etcdctl alarm list -w json";

/// Parses `etcdctl alarm list`, plain or `-w json` (empty output: no alarms).
pub fn parse_alarm_list(text: &str) -> Result<Vec<AlarmEntry>, EtcdctlError> {
    parse_alarm_list_of_cluster(text).map(|(alarms, _)| alarms)
}

/// [`parse_alarm_list`], with the etcd cluster of the member that answered (`header.cluster_id`
/// of `-w json`; the plain text names none).
pub fn parse_alarm_list_of_cluster(
    text: &str,
) -> Result<(Vec<AlarmEntry>, Option<u64>), EtcdctlError> {
    if text.trim_start().starts_with('{') {
        let list: AlarmListJson = serde_json::from_str(text).map_err(|e| shape(ALARM_LIST, e))?;
        let cluster_id = list.header.cluster_id;
        let alarms = list
            .alarms
            .into_iter()
            .filter_map(|a| {
                let alarm = match a.alarm {
                    AlarmTypeJson::None | AlarmTypeJson::Number(0) => return None,
                    AlarmTypeJson::Number(1) => Alarm::NoSpace,
                    AlarmTypeJson::Number(2) => Alarm::Corrupt,
                    AlarmTypeJson::Number(n) => Alarm::Other(n.to_string()),
                    AlarmTypeJson::Name(n) => match n.as_str() {
                        "NONE" => return None,
                        "NOSPACE" => Alarm::NoSpace,
                        "CORRUPT" => Alarm::Corrupt,
                        _ => Alarm::Other(n),
                    },
                };
                Some(AlarmEntry {
                    member_id: MemberId(a.member_id),
                    alarm,
                })
            })
            .collect();
        return Ok((alarms, cluster_id));
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_alarm(line) {
            Some(Ok(a)) => out.push(a),
            Some(Err(problem)) => {
                return Err(EtcdctlError::AlarmLine {
                    line: i + 1,
                    problem,
                });
            }
            None => {
                return Err(EtcdctlError::AlarmLine {
                    line: i + 1,
                    problem: format!("unexpected text {:?}", line.trim()),
                });
            }
        }
    }
    Ok((out, None))
}
