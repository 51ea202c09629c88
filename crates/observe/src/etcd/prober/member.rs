//! One member's endpoint: what is asked of it (its status and, for a voting member, a
//! linearizable read, under the probe's deadline) and how its answer is judged into the engine's
//! [`Member`].

use etcd_client::StatusResponse;
use futures::future::{Either, select};
use tokio::time::Instant;

use super::Prober;
use super::alarms::parse_alarm;
use super::clients::call;
use quorumguard_engine::model::{Health, Member, MemberId};

/// A member's status, reduced to what is judged.
pub(super) struct Status {
    answered_by: u64,
    pub(super) leader: u64,
    version: String,
    db_size: i64,
    raft_term: u64,
    raft_index: u64,
    raft_applied_index: u64,
    is_learner: bool,
    pub(super) errors: Vec<String>,
}

impl From<StatusResponse> for Status {
    fn from(s: StatusResponse) -> Self {
        Status {
            answered_by: s.header().map(|h| h.member_id()).unwrap_or(0),
            leader: s.leader(),
            version: s.version().to_string(),
            db_size: s.db_size(),
            raft_term: s.raft_term(),
            raft_index: s.raft_index(),
            raft_applied_index: s.raft_applied_index(),
            is_learner: s.is_learner(),
            errors: s.errors().to_vec(),
        }
    }
}

/// What one member's endpoint answered. `health` is `None` when the read was not made (a
/// learner) or not waited for (the status already showed the member unhealthy).
pub(super) struct Report {
    pub(super) status: Result<Status, String>,
    pub(super) health: Option<Result<(), String>>,
}

impl Prober {
    /// Status and (for voting members) a linearizable read of one member, both by `end`.
    /// Failures are explained by the transport when it knows more (see [`Prober::explain`]).
    pub(super) async fn probe_member(
        &self,
        url: &str,
        learner: bool,
        start: Instant,
        end: Instant,
        timeout_text: &str,
    ) -> Report {
        let mut report = self.ask_member(url, learner, end, timeout_text).await;
        if report.status.is_err() || matches!(report.health, Some(Err(_))) {
            self.evict(url);
            report.status = report.status.map_err(|e| self.explain(url, start, e));
            report.health = report
                .health
                .map(|h| h.map_err(|e| self.explain(url, start, e)));
        }
        report
    }

    async fn ask_member(
        &self,
        url: &str,
        learner: bool,
        end: Instant,
        timeout_text: &str,
    ) -> Report {
        let client = match self.client(url, end, timeout_text).await {
            Ok(c) => c,
            Err(e) => {
                return Report {
                    status: Err(e),
                    health: None,
                };
            }
        };
        let mut status_client = client.clone();
        let status = async move {
            call(end, timeout_text, status_client.status())
                .await
                .map(Status::from)
        };
        if learner {
            Report {
                status: status.await,
                health: None,
            }
        } else {
            let mut read_client = client;
            let health = async move {
                match call(end, timeout_text, read_client.get("health", None)).await {
                    // As etcdctl: a read refused by etcd auth still went through consensus.
                    Err(e) if e.contains("permission denied") => Ok(()),
                    other => other.map(|_| ()),
                }
            };
            let (status, health) = (Box::pin(status), Box::pin(health));
            match select(status, health).await {
                Either::Left((status, health)) => {
                    // A member whose status already shows it unhealthy need not wait for its
                    // read (after quorum loss the read would hang until the deadline).
                    let done = match &status {
                        Err(_) => true,
                        Ok(s) => judge_status(s).is_some(),
                    };
                    let health = if done { None } else { Some(health.await) };
                    Report { status, health }
                }
                Either::Right((health, status)) => Report {
                    status: status.await,
                    health: Some(health),
                },
            }
        }
    }
}

/// Why a status shows the member unhealthy, if it does: its own errors (other than alarms,
/// which belong to the member they name), or no leader.
fn judge_status(s: &Status) -> Option<String> {
    let errors: Vec<&str> = s
        .errors
        .iter()
        .map(String::as_str)
        .filter(|e| parse_alarm(e).is_none())
        .collect();
    if !errors.is_empty() {
        return Some(errors.join("; "));
    }
    if s.leader == 0 {
        return Some("etcdserver: no leader".to_string());
    }
    None
}

/// Fills in `member` from its endpoint's report.
pub(super) fn apply(member: &mut Member, url: &str, report: Report) {
    let status = match report.status {
        Ok(s) => s,
        Err(e) => {
            member.health = Health::Unhealthy(e);
            return;
        }
    };
    if status.answered_by != 0 && status.answered_by != member.id.0 {
        member.health = Health::Unhealthy(format!(
            "{url} is served by member {}, not by {}",
            MemberId(status.answered_by),
            member.id
        ));
        return;
    }
    member.is_leader = status.leader == member.id.0;
    member.version = Some(status.version.clone()).filter(|v| !v.is_empty());
    member.db_size = u64::try_from(status.db_size).ok();
    member.raft_term = Some(status.raft_term);
    member.raft_index = Some(status.raft_index);
    // etcd before 3.4 does not report it (0).
    member.raft_applied_index = Some(status.raft_applied_index).filter(|&i| i > 0);
    // The member list is the authority on learners; a status saying so too changes nothing.
    member.is_learner |= status.is_learner;
    member.health = if let Some(why) = judge_status(&status) {
        Health::Unhealthy(why)
    } else if member.is_learner {
        Health::Healthy
    } else {
        match report.health {
            Some(Ok(())) => Health::Healthy,
            Some(Err(e)) => Health::Unhealthy(format!("linearizable read failed: {e}")),
            None => Health::Unknown,
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(leader: u64, errors: &[&str]) -> Status {
        Status {
            answered_by: 7,
            leader,
            version: "3.4.23".into(),
            db_size: 24576,
            raft_term: 2,
            raft_index: 28,
            raft_applied_index: 27,
            is_learner: false,
            errors: errors.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn applied(report: Report) -> Member {
        let mut m = Member::new(7, "m1");
        apply(&mut m, "https://127.0.0.1:1", report);
        m
    }

    #[test]
    fn healthy_needs_a_leader_no_errors_and_a_read() {
        let m = applied(Report {
            status: Ok(status(7, &[])),
            health: Some(Ok(())),
        });
        assert_eq!(m.health, Health::Healthy);
        assert!(m.is_leader);
        assert_eq!(m.raft_index, Some(28));
        assert_eq!(m.raft_applied_index, Some(27));
        assert_eq!(m.version.as_deref(), Some("3.4.23"));

        let m = applied(Report {
            status: Ok(status(9, &[])),
            health: Some(Err("no answer within 1s".into())),
        });
        assert_eq!(
            m.health,
            Health::Unhealthy("linearizable read failed: no answer within 1s".into())
        );
        assert!(!m.is_leader);
    }

    #[test]
    fn status_errors_other_than_alarms_make_a_member_unhealthy() {
        let m = applied(Report {
            status: Ok(status(0, &["etcdserver: no leader"])),
            health: None,
        });
        assert_eq!(m.health, Health::Unhealthy("etcdserver: no leader".into()));
        let m = applied(Report {
            status: Ok(status(0, &[])),
            health: None,
        });
        assert_eq!(m.health, Health::Unhealthy("etcdserver: no leader".into()));
        // Another member's alarm, repeated in this member's status, is not this member's fault.
        let m = applied(Report {
            status: Ok(status(9, &["memberID:5 alarm:NOSPACE "])),
            health: Some(Ok(())),
        });
        assert_eq!(m.health, Health::Healthy);
    }

    #[test]
    fn learners_are_judged_by_status() {
        let mut m = Member::new(7, "m4");
        m.is_learner = true;
        apply(
            &mut m,
            "u",
            Report {
                status: Ok(status(9, &[])),
                health: None,
            },
        );
        assert_eq!(m.health, Health::Healthy);
    }

    #[test]
    fn an_endpoint_answered_by_another_member_is_not_that_member() {
        let mut s = status(9, &[]);
        s.answered_by = 8;
        let m = applied(Report {
            status: Ok(s),
            health: Some(Ok(())),
        });
        assert_eq!(
            m.health,
            Health::Unhealthy("https://127.0.0.1:1 is served by member 8, not by 7".into())
        );
    }
}
