//! What `etcdctl` prints -> engine members.
//!
//! Shaped after real etcd 3.4.23 output (tests/fixtures/make-fixtures.sh), not after guesses:
//! - `member list -w json`: `{"header":{...},"members":[{"ID":<u64>,"name",...}]}`; IDs are u64
//!   numbers beyond 2^53 (read exactly, never through f64) or, with etcdctl 3.5 `--hex`, hex
//!   strings. An unstarted member has no `name` and no `clientURLs`; `isLearner` only when true.
//! - `endpoint status -w json`: `[{"Endpoint","Status":{"header":{"member_id"},"leader",...}}]`.
//!   An endpoint that does not answer is left out (etcdctl prints the failure on stderr only);
//!   `leader` is left out when there is none; `errors` lists the cluster's alarms
//!   (`memberID:<id> alarm:NOSPACE `) on every member, and that member's own problems
//!   (`etcdserver: no leader`).
//! - `endpoint health -w json`: `[{"endpoint","health","took","error"}]`. A learner always
//!   fails it ("rpc not supported for learner" shows as "context deadline exceeded").
//! - `alarm list`: plain text lines `memberID:<decimal id> alarm:<TYPE>`; with `-w json`,
//!   `{"header":{...},"alarms":[{"memberID":<u64>,"alarm":1}]}` (the alarm as etcd's enum
//!   number: 1 NOSPACE, 2 CORRUPT; `alarms` left out when there are none).

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use thiserror::Error;

use quorumguard_engine::{Alarm, EtcdSnapshot, Health, Member, MemberId};

mod alarms;

pub use alarms::{ALARM_LIST, parse_alarm, parse_alarm_list, parse_alarm_list_of_cluster};

/// Problems with one etcdctl output; the caller adds the file name.
#[derive(Debug, Error)]
pub enum EtcdctlError {
    #[error("not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("not the output of `{command}`: {source}")]
    Shape {
        command: &'static str,
        source: serde_json::Error,
    },
    #[error("the member list has no members")]
    NoMembers,
    #[error(
        "line {line}: {problem} (expected `memberID:<id> alarm:<TYPE>` as `etcdctl alarm list` prints)"
    )]
    AlarmLine { line: usize, problem: String },
}

/// The command whose output each parser expects, for messages.
pub const MEMBER_LIST: &str = "etcdctl member list -w json";
pub const ENDPOINT_STATUS: &str = "etcdctl endpoint status --cluster -w json";
pub const ENDPOINT_HEALTH: &str = "etcdctl endpoint health --cluster -w json";

/// One entry of `endpoint status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    pub endpoint: String,
    /// The etcd cluster the answering member belongs to (`header.cluster_id`).
    pub cluster_id: Option<u64>,
    pub member_id: Option<MemberId>,
    /// `None` when the member knows no leader.
    pub leader: Option<MemberId>,
    pub version: Option<String>,
    pub db_size: Option<u64>,
    pub raft_term: Option<u64>,
    pub raft_index: Option<u64>,
    pub is_learner: bool,
    pub errors: Vec<String>,
}

/// One entry of `endpoint health`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointHealth {
    pub endpoint: String,
    pub healthy: bool,
    pub took: Option<String>,
    pub error: Option<String>,
}

/// One alarm, from `alarm list` or from the `errors` of `endpoint status`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AlarmEntry {
    pub member_id: MemberId,
    pub alarm: Alarm,
}

#[derive(Deserialize)]
struct MemberListJson {
    #[serde(default)]
    header: Option<HeaderJson>,
    members: Vec<MemberJson>,
}

#[derive(Deserialize)]
struct MemberJson {
    #[serde(rename = "ID", alias = "id", deserialize_with = "de_id")]
    id: u64,
    #[serde(default)]
    name: String,
    #[serde(default, rename = "peerURLs", alias = "peer_urls")]
    peer_urls: Vec<String>,
    #[serde(default, rename = "clientURLs", alias = "client_urls")]
    client_urls: Vec<String>,
    #[serde(default, rename = "isLearner", alias = "is_learner")]
    is_learner: bool,
}

#[derive(Deserialize)]
struct StatusEntryJson {
    #[serde(rename = "Endpoint", alias = "endpoint")]
    endpoint: String,
    #[serde(rename = "Status", alias = "status")]
    status: StatusJson,
}

#[derive(Deserialize)]
struct StatusJson {
    #[serde(default)]
    header: Option<HeaderJson>,
    #[serde(default)]
    version: Option<String>,
    #[serde(default, rename = "dbSize", alias = "db_size")]
    db_size: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_id")]
    leader: Option<u64>,
    #[serde(default, rename = "raftIndex", alias = "raft_index")]
    raft_index: Option<u64>,
    #[serde(default, rename = "raftTerm", alias = "raft_term")]
    raft_term: Option<u64>,
    #[serde(default, rename = "isLearner", alias = "is_learner")]
    is_learner: bool,
    #[serde(default)]
    errors: Vec<String>,
}

#[derive(Deserialize)]
struct HeaderJson {
    #[serde(default, deserialize_with = "de_opt_id")]
    cluster_id: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_id")]
    member_id: Option<u64>,
}

#[derive(Deserialize)]
struct HealthEntryJson {
    endpoint: String,
    health: bool,
    #[serde(default)]
    took: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// A member ID as etcdctl prints it: a JSON integer (exact u64) or a hex string.
struct IdVisitor;

impl Visitor<'_> for IdVisitor {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member ID: an unsigned 64-bit integer or a hex string")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(format!("member ID {v} is negative")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        Err(E::custom(format!(
            "member ID {v} is not an exact unsigned 64-bit integer"
        )))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        parse_hex_id(v).ok_or_else(|| E::custom(format!("member ID {v:?} is not a hex number")))
    }
}

fn de_id<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    d.deserialize_any(IdVisitor)
}

fn de_opt_id<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Opt;
    impl<'de> Visitor<'de> for Opt {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a member ID or null")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            de_id(d).map(Some)
        }
    }
    d.deserialize_option(Opt)
}

/// A hex member ID as `etcdctl member list` (simple/table) and `--hex` print it.
pub fn parse_hex_id(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

fn shape(command: &'static str, e: serde_json::Error) -> EtcdctlError {
    if e.is_syntax() || e.is_eof() {
        EtcdctlError::Json(e)
    } else {
        EtcdctlError::Shape { command, source: e }
    }
}

/// Parses `etcdctl member list -w json`. Health is unknown until status or health says more.
pub fn parse_member_list(text: &str) -> Result<Vec<Member>, EtcdctlError> {
    parse_member_list_of_cluster(text).map(|(members, _)| members)
}

/// [`parse_member_list`], with the etcd cluster it lists (`header.cluster_id`, when present).
pub fn parse_member_list_of_cluster(
    text: &str,
) -> Result<(Vec<Member>, Option<u64>), EtcdctlError> {
    let list: MemberListJson = serde_json::from_str(text).map_err(|e| shape(MEMBER_LIST, e))?;
    if list.members.is_empty() {
        return Err(EtcdctlError::NoMembers);
    }
    let cluster_id = list.header.and_then(|h| h.cluster_id);
    let members = list
        .members
        .into_iter()
        .map(|m| {
            let mut member = Member::new(m.id, m.name);
            member.peer_urls = m.peer_urls;
            member.client_urls = m.client_urls;
            member.is_learner = m.is_learner;
            member
        })
        .collect();
    Ok((members, cluster_id))
}

/// What a member list dump holds when `etcdctl member list` failed: nothing (etcdctl prints its
/// error on stderr only) or its error text (`2>&1`: etcd-client's JSON log lines and an
/// `Error: ...` line). `None` when the text is something else (then it is parsed, and a wrong
/// shape is an input error).
///
/// etcdctl 3.5 and later ask for a linearizable member list (`MemberListRequest.Linearizable`,
/// clientv3 `cluster.MemberList`), which the member asked serves only through its leader: with
/// quorum lost or during an election it fails ("context deadline exceeded"). etcdctl 3.4 asked for
/// the member's own view, which etcd answers without a leader. Seen on etcd 3.5.1 with 2 of 3
/// members killed: etcdctl 3.5.1 fails, etcdctl 3.4.23 lists the three members.
pub fn failed_member_list(text: &str) -> Option<String> {
    let trimmed = text.trim_start_matches('\u{feff}').trim();
    if trimmed.is_empty() {
        return Some("the dump is empty, etcdctl printed none".to_string());
    }
    if trimmed.starts_with('{') && !trimmed.contains("\"level\"") {
        return None;
    }
    let error = trimmed
        .lines()
        .rev()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("Error:"))?;
    Some(format!("etcdctl failed: {:?}", error.trim()))
}

/// What `endpoint status` says when there is no member list: how many endpoints answered, with
/// which etcd versions, and whether any knows a leader, as a sentence that claims nothing the
/// entries do not show.
pub fn endpoints_seen(status: Option<&[EndpointStatus]>) -> String {
    let Some(status) = status else {
        return "no endpoint status dump to say more".to_string();
    };
    if status.is_empty() {
        return "no endpoint answered its status".to_string();
    }
    let mut versions: Vec<&str> = status.iter().filter_map(|s| s.version.as_deref()).collect();
    versions.sort_unstable();
    versions.dedup();
    let versions = if versions.is_empty() {
        String::new()
    } else {
        format!(" (etcd {})", versions.join(", "))
    };
    let answered = status.len();
    let members = if answered == 1 {
        "member answers its"
    } else {
        "members answer their"
    };
    let with_leader: Vec<&EndpointStatus> = status.iter().filter(|s| s.leader.is_some()).collect();
    let mut errors: Vec<&str> = status
        .iter()
        .flat_map(|s| s.errors.iter())
        .map(|e| e.trim())
        .filter(|e| !e.is_empty() && parse_alarm(e).is_none())
        .collect();
    errors.sort_unstable();
    errors.dedup();
    let errors = if errors.is_empty() {
        String::new()
    } else {
        format!(
            ", {} {}",
            if errors.len() == 1 { "error" } else { "errors" },
            errors
                .iter()
                .map(|e| format!("{e:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    if with_leader.is_empty() {
        format!("{answered} {members} status{versions}, none has a leader{errors}")
    } else {
        let mut leaders: Vec<String> = with_leader
            .iter()
            .filter_map(|s| s.leader.map(|l| l.to_string()))
            .collect();
        leaders.sort_unstable();
        leaders.dedup();
        format!(
            "{answered} {members} status{versions}, {} of them with leader {}{errors}",
            with_leader.len(),
            leaders.join(" or ")
        )
    }
}

/// Parses `etcdctl endpoint status -w json`.
pub fn parse_endpoint_status(text: &str) -> Result<Vec<EndpointStatus>, EtcdctlError> {
    let entries: Vec<StatusEntryJson> =
        serde_json::from_str(text).map_err(|e| shape(ENDPOINT_STATUS, e))?;
    Ok(entries
        .into_iter()
        .map(|e| EndpointStatus {
            endpoint: e.endpoint,
            cluster_id: e.status.header.as_ref().and_then(|h| h.cluster_id),
            member_id: e.status.header.and_then(|h| h.member_id).map(MemberId),
            leader: e.status.leader.filter(|l| *l != 0).map(MemberId),
            version: e.status.version.filter(|v| !v.is_empty()),
            db_size: e.status.db_size,
            raft_term: e.status.raft_term,
            raft_index: e.status.raft_index,
            is_learner: e.status.is_learner,
            errors: e.status.errors,
        })
        .collect())
}

/// Parses `etcdctl endpoint health -w json`.
pub fn parse_endpoint_health(text: &str) -> Result<Vec<EndpointHealth>, EtcdctlError> {
    let entries: Vec<HealthEntryJson> =
        serde_json::from_str(text).map_err(|e| shape(ENDPOINT_HEALTH, e))?;
    Ok(entries
        .into_iter()
        .map(|e| EndpointHealth {
            endpoint: e.endpoint,
            healthy: e.health,
            took: e.took,
            error: e.error.filter(|s| !s.is_empty()),
        })
        .collect())
}

/// host:port of an endpoint URL, the way member client URLs and endpoints are matched
/// (scheme and a trailing slash ignored: `--endpoints` may be given without scheme).
pub fn endpoint_key(url: &str) -> String {
    let s = url.trim().trim_end_matches('/');
    let s = s.split_once("://").map_or(s, |(_, rest)| rest);
    s.to_ascii_lowercase()
}

/// What was observed of one member, before the rules of [`snapshot`] combine it.
#[derive(Default)]
struct Observed<'a> {
    status: Option<&'a EndpointStatus>,
    health: Option<&'a EndpointHealth>,
}

/// Combines the member list with what status, health and alarms say of each member.
///
/// Health of a member, in order:
/// 1. `endpoint health` false -> unhealthy with its error, except for a learner whose status
///    answered without errors (a learner refuses the linearizable read the health check does);
/// 2. `endpoint status` with errors of its own (`etcdserver: no leader`) -> unhealthy;
/// 3. `endpoint health` true -> healthy;
/// 4. `endpoint status` answered, without errors and with a leader -> healthy (etcd's Status is
///    a per-member health probe);
/// 5. otherwise unknown.
///
/// Status entries are matched by the member ID they report (by endpoint when they report none),
/// health entries by endpoint. Alarms named in status `errors` or in the alarm list are attached to the member they name
/// (CORRUPT makes it unhealthy in the engine; NOSPACE does not: raft keeps its quorum). Entries for endpoints or IDs not in
/// the member list are ignored and reported in the returned warnings.
pub fn snapshot(
    mut members: Vec<Member>,
    status: Option<&[EndpointStatus]>,
    health: Option<&[EndpointHealth]>,
    alarms: &[AlarmEntry],
) -> (EtcdSnapshot, Vec<String>) {
    let mut warnings = Vec::new();
    let by_endpoint: BTreeMap<String, usize> = members
        .iter()
        .enumerate()
        .flat_map(|(i, m)| m.client_urls.iter().map(move |u| (endpoint_key(u), i)))
        .collect();
    let index_of_id = |id: MemberId, members: &[Member]| members.iter().position(|m| m.id == id);
    let mut observed: Vec<Observed> = members.iter().map(|_| Observed::default()).collect();
    let mut all_alarms: Vec<AlarmEntry> = alarms.to_vec();

    for s in status.unwrap_or_default() {
        // The member ID the endpoint reports is the stronger key: a member removed and added
        // again at the same URL has a new ID.
        let idx = match s.member_id {
            Some(id) => index_of_id(id, &members),
            None => by_endpoint.get(&endpoint_key(&s.endpoint)).copied(),
        };
        match idx {
            Some(i) => observed[i].status = Some(s),
            None => warnings.push(format!(
                "endpoint status for {}{} is not in the member list: ignored",
                s.endpoint,
                s.member_id
                    .map(|id| format!(" (member {id})"))
                    .unwrap_or_default()
            )),
        }
        for e in &s.errors {
            if let Some(Ok(a)) = parse_alarm(e) {
                all_alarms.push(a);
            }
        }
    }
    for h in health.unwrap_or_default() {
        match by_endpoint.get(&endpoint_key(&h.endpoint)) {
            Some(&i) => observed[i].health = Some(h),
            None => warnings.push(format!(
                "endpoint health for {} is not in the member list: ignored",
                h.endpoint
            )),
        }
    }
    all_alarms.sort();
    all_alarms.dedup();
    for a in &all_alarms {
        match index_of_id(a.member_id, &members) {
            Some(i) => members[i].alarms.push(a.alarm.clone()),
            None => warnings.push(format!(
                "alarm {} for member {} is not in the member list: ignored",
                a.alarm, a.member_id
            )),
        }
    }

    for (m, o) in members.iter_mut().zip(&observed) {
        if let Some(s) = o.status {
            m.is_leader = s.leader == Some(m.id) && s.member_id.is_none_or(|id| id == m.id);
            m.version = s.version.clone();
            m.db_size = s.db_size;
            m.raft_term = s.raft_term;
            m.raft_index = s.raft_index;
            m.is_learner |= s.is_learner;
        }
        m.health = member_health(m.is_learner, o);
    }
    if status.is_some() {
        for (m, o) in members.iter().zip(&observed) {
            if o.status.is_none() && !m.client_urls.is_empty() {
                warnings.push(format!(
                    "endpoint status has no entry for member {} ({}): its endpoint did not answer, or was not asked",
                    m.display_name(),
                    m.client_urls.join(",")
                ));
            }
        }
    }
    (EtcdSnapshot { members, age: None }, warnings)
}

fn member_health(is_learner: bool, o: &Observed) -> Health {
    let own_errors: Vec<&str> = o
        .status
        .map(|s| {
            s.errors
                .iter()
                .filter(|e| parse_alarm(e).is_none())
                .map(|e| e.trim())
                .filter(|e| !e.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let status_ok = o
        .status
        .is_some_and(|s| own_errors.is_empty() && s.leader.is_some());
    // A learner refuses the linearizable read of `endpoint health`: its status speaks for it.
    let learner_answered = is_learner && status_ok;
    if let Some(h) = o.health
        && !h.healthy
        && !learner_answered
    {
        let mut errors = vec![h.error.as_deref().unwrap_or("endpoint health: unhealthy")];
        errors.extend(own_errors);
        return Health::Unhealthy(errors.join("; "));
    }
    if !own_errors.is_empty() {
        return Health::Unhealthy(own_errors.join("; "));
    }
    if o.health.is_some_and(|h| h.healthy) || status_ok {
        return Health::Healthy;
    }
    Health::Unknown
}

#[cfg(test)]
mod tests;
