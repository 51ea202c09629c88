//! One probe of a workload cluster's etcd: the member list, the alarms, and every member's own
//! status and health, turned into the engine's [`Member`]s. Read-only: nothing is written.
//!
//! Why it is shaped this way (see also `/work/shared/domain.md`):
//! - **Everything under one deadline.** Over TLS, etcd-client's own timeouts do not end a call to
//!   a SIGSTOPped member: it hangs. So connecting and every call are wrapped in
//!   [`tokio::time::timeout_at`], and members are asked in parallel, never one after another: a
//!   probe ends within its deadline plus scheduling noise even with frozen members.
//! - **One client per endpoint.** A client given several endpoints load-balances among them, so
//!   a per-member status could come from another member. Clients are kept between probes (the
//!   status enricher sweeps every few seconds) and dropped after any failed call, so the next
//!   probe reconnects. Each runs on a lean channel of its own, one HTTP/2 connection sharing
//!   the cluster's TLS configuration ([`super::channel`]): the enricher keeps three per workload
//!   cluster, so what a kept client costs is most of the guard's memory. A kept client whose
//!   connection the member closed (a restart) is replaced before it is used.
//! - **Member list once, from any member that answers.** Endpoints are asked in turn; a slow one
//!   gets a head start of a fraction of the deadline before the next is asked too, so one frozen
//!   endpoint cannot eat the whole budget. A learner refuses the member list ("rpc not supported
//!   for learner"): the next endpoint answers. etcd-client asks with `linearizable: false`
//!   (etcd-client 0.21 `ClusterClient::member_list`), which the member asked answers from its
//!   own view, without a leader: seen on etcd 3.4.23 and 3.5.1 with 2 of 3 members killed
//!   (crates/observe/tests/it/etcd_prober.rs). `etcdctl member list` of 3.5 and later asks for a
//!   linearizable list and fails then; that is the dumps' concern (`crate::dumps::etcdctl`). When no endpoint
//!   answers, the probe fails naming every endpoint and its error.
//! - **Health like `etcdctl endpoint health`:** a linearizable `get("health")` (it needs a
//!   leader and a quorum), plus the member's status: its leader, its raft term and index, and its
//!   `errors` ("etcdserver: no leader" after quorum loss: a live member without quorum is not
//!   healthy). Learners refuse linearizable reads, so their status alone decides.
//! - **Alarms** (NOSPACE, CORRUPT) attach to the member they name, from the alarm list and from
//!   the `memberID:<id> alarm:<TYPE>` entries every member repeats in its status `errors`; those
//!   entries do not make the *reporting* member unhealthy.
//! - **The transport decides where to dial** ([`Transport`]): the URLs as given (direct), or a
//!   loopback listener per etcd pod that port-forwards through the workload API server. When the
//!   transport knows why a connection failed (the API server refused the port-forward: "404 pods
//!   \"etcd-x\" not found"), that is the error reported, not etcd-client's "connection closed".
//!
//! The parts, one file each under `prober/` (the cluster's TLS material and the rustls
//! configuration built from it, [`ClientTls`] and [`ClientTlsError`], are `quorumguard-pki`'s):
//! - `clients`: the client kept per endpoint, dialled under the deadline, and what a failed call
//!   says;
//! - `member`: one member's status and linearizable read, judged into its [`Member`];
//! - `alarms`: etcd's alarms, attached to the member they name;
//! - here: [`Prober`] and [`probe`]: the member list, then every member in parallel, put together
//!   into a [`Probe`].

mod alarms;
mod clients;
mod member;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{AlarmAction, AlarmResponse, AlarmType, Client};
use futures::future::{Either, join_all, select};
use futures::stream::{FuturesUnordered, StreamExt};
use thiserror::Error;
use tokio::time::{Instant, sleep_until};

use super::endpoints::Transport;
use alarms::{alarm_of, attach_alarms, parse_alarm};
use clients::{Kept, call, with_hint};
use member::{Report, apply};
use quorumguard_engine::model::{Alarm, Member};

/// The cluster's TLS material and its rustls configuration live with every other certificate, in
/// `quorumguard-pki`.
pub use quorumguard_pki::etcd::{ClientTls, ClientTlsError};

/// The share of the deadline the member list may take, at most: the rest is left to the
/// members' status and health, which run in parallel.
const MEMBER_LIST_SHARE: u32 = 2;
/// How long an endpoint asked for the member list has alone before the next one is asked too:
/// this fraction of the deadline (a failure moves on at once).
const HEDGE_SHARE: u32 = 8;
/// The shortest head start, so that short deadlines do not ask every endpoint at once.
const MIN_HEDGE: Duration = Duration::from_millis(50);

/// What one probe saw.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Every member of the member list, in etcd's order, with health from its own endpoint.
    pub members: Vec<Member>,
    /// How long the probe took.
    pub took: Duration,
    /// How long the member list took (from the start, the head starts of slow endpoints
    /// included).
    pub member_list_took: Duration,
    /// The member whose status and health took longest (asked in parallel, after the member
    /// list), and how long: where the rest of `took` went (a frozen member takes the deadline).
    pub slowest_member: Option<(String, Duration)>,
    /// Things a human may want to know that did not stop the probe (an endpoint that did not
    /// answer the member list, a failed alarm list, an alarm naming an unknown member).
    pub warnings: Vec<String>,
    /// The endpoint that answered the member list.
    pub member_list_from: String,
}

/// One endpoint and what went wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointError {
    pub endpoint: String,
    pub error: String,
}

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.endpoint, self.error)
    }
}

/// Why a probe has no member list. Without one, nothing is known of the cluster's etcd.
#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("no etcd endpoints to ask (no annotation and no Machine InternalIPs)")]
    NoEndpoints,
    #[error(
        "no etcd endpoint answered the member list (etcd 3.4 and 3.5 answer it without a \
         leader, so each endpoint asked was down, unreachable, a learner or refused the \
         connection): {}",
        list(.attempts)
    )]
    MemberList { attempts: Vec<EndpointError> },
}

fn list(attempts: &[EndpointError]) -> String {
    attempts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Probes etcd with a [`Prober`] made for this call only (no clients kept).
pub async fn probe(
    endpoints: &[String],
    tls: &ClientTls,
    deadline: Duration,
) -> Result<Probe, ProbeError> {
    Prober::new(tls.clone()).probe(endpoints, deadline).await
}

/// Probes one workload cluster's etcd, keeping one client per endpoint between probes.
///
/// One `Prober` per workload cluster: its clients carry that cluster's TLS material. When the
/// CA or the client certificate changes, make a new one.
pub struct Prober {
    tls: ClientTls,
    transport: Transport,
    /// Boxed: an etcd-client `Client` is several KiB inline (one channel handle per gRPC
    /// service), and a map keeps spare slots.
    clients: Mutex<HashMap<String, Box<Kept>>>,
}

impl fmt::Debug for Prober {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prober")
            .field("transport", &self.transport)
            .field("cached_endpoints", &self.cached_endpoints())
            .finish_non_exhaustive()
    }
}

impl Prober {
    /// A prober dialing members directly ([`Transport::Direct`]).
    pub fn new(tls: ClientTls) -> Self {
        Self::with_transport(tls, Transport::Direct)
    }

    pub fn with_transport(tls: ClientTls, transport: Transport) -> Self {
        Prober {
            tls,
            transport,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// How this prober reaches members.
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// The client certificate and CA it presents and trusts.
    pub fn tls(&self) -> &ClientTls {
        &self.tls
    }

    /// The endpoints a client is kept for, sorted (for tests and debugging).
    pub fn cached_endpoints(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().keys().cloned().collect();
        v.sort();
        v
    }

    /// One probe: the member list from the first of `endpoints` that answers, then every
    /// member's status and health in parallel (and the alarm list alongside), all of it ending
    /// by `deadline` from now.
    pub async fn probe(
        &self,
        endpoints: &[String],
        deadline: Duration,
    ) -> Result<Probe, ProbeError> {
        let start = Instant::now();
        let end = start + deadline;
        if endpoints.is_empty() {
            return Err(ProbeError::NoEndpoints);
        }
        let timeout_text = format!("no answer within {}", humantime::format_duration(deadline));
        let mut warnings = Vec::new();

        let (from, list_client, listed, failures) =
            match self.member_list(endpoints, start, deadline).await {
                Ok(found) => found,
                Err(e) => {
                    // Keep the listeners of the endpoints asked, drop any others.
                    self.transport
                        .retain(&endpoints.iter().map(String::as_str).collect());
                    return Err(e);
                }
            };
        let member_list_took = start.elapsed();
        for f in failures {
            warnings.push(format!("member list: {f}"));
        }

        let mut members: Vec<Member> = listed.iter().map(listed_member).collect();
        let (targets, target_errors) = self.targets(&members);
        let (reports, member_took, alarms) = self
            .ask_members(&members, &targets, list_client, start, end, &timeout_text)
            .await;
        let slowest_member = slowest(&members, &targets, &member_took);
        let alarms = self.listed_alarms(alarms, &from, &mut warnings);
        let status_alarms = apply_reports(
            &mut members,
            &targets,
            reports,
            target_errors,
            &mut warnings,
        );
        attach_alarms(
            &mut members,
            alarms.into_iter().chain(status_alarms),
            &mut warnings,
        );
        self.forget_unused(endpoints, &targets);

        Ok(Probe {
            members,
            took: start.elapsed(),
            member_list_took,
            slowest_member,
            warnings,
            member_list_from: from,
        })
    }

    /// Where each member is asked (`None`: nowhere), and beside it the transport's error for a
    /// member it could not place (it goes into the probe's warnings).
    fn targets(&self, members: &[Member]) -> (Vec<Option<String>>, Vec<Option<String>>) {
        let mut target_errors: Vec<Option<String>> = vec![None; members.len()];
        let targets: Vec<Option<String>> = members
            .iter()
            .zip(&mut target_errors)
            .map(|(m, error)| {
                self.transport.member_endpoint(m).unwrap_or_else(|e| {
                    *error = Some(e.to_string());
                    None
                })
            })
            .collect();
        (targets, target_errors)
    }

    /// Every member with a target asked for its status and health in parallel, and the alarm
    /// list from `list_client` alongside, all by `end`: each member's report (`None`: no
    /// target) and how long it took, and the alarm list.
    async fn ask_members(
        &self,
        members: &[Member],
        targets: &[Option<String>],
        list_client: Client,
        start: Instant,
        end: Instant,
        timeout_text: &str,
    ) -> (
        Vec<Option<Report>>,
        Vec<Duration>,
        Result<AlarmResponse, String>,
    ) {
        let reports = join_all(members.iter().zip(targets).map(|(m, target)| async move {
            let asked = Instant::now();
            let report = match target {
                Some(url) => Some(
                    self.probe_member(url, m.is_learner, start, end, timeout_text)
                        .await,
                ),
                None => None,
            };
            (report, asked.elapsed())
        }));
        let alarms = async {
            let mut client = list_client;
            call(
                end,
                timeout_text,
                client.alarm(AlarmAction::Get, AlarmType::None, None),
            )
            .await
        };
        // The alarm list goes through raft: without a leader it hangs until the deadline. Once
        // every member has answered and none has a leader, it is not waited for.
        let (reports, alarms) = match select(Box::pin(reports), Box::pin(alarms)).await {
            Either::Left((reports, alarms)) => {
                let any_leader = reports
                    .iter()
                    .filter_map(|(r, _)| r.as_ref())
                    .any(|r| r.status.as_ref().is_ok_and(|s| s.leader != 0));
                let alarms = if any_leader {
                    alarms.await
                } else {
                    Err("not waited for, no member has a leader".to_string())
                };
                (reports, alarms)
            }
            Either::Right((alarms, reports)) => (reports.await, alarms),
        };
        let (reports, member_took): (Vec<_>, Vec<_>) = reports.into_iter().unzip();
        (reports, member_took, alarms)
    }

    /// The alarms of the alarm list; when it failed, none, the client it was asked of dropped,
    /// and a warning saying that the members' status alone tells the alarms.
    fn listed_alarms(
        &self,
        alarms: Result<AlarmResponse, String>,
        from: &str,
        warnings: &mut Vec<String>,
    ) -> Vec<(u64, Alarm)> {
        match alarms {
            Ok(resp) => resp
                .alarms()
                .iter()
                .filter_map(|a| alarm_of(a.alarm()).map(|alarm| (a.member_id(), alarm)))
                .collect(),
            Err(e) => {
                self.evict(from);
                warnings.push(format!(
                    "alarm list from {from}: {e} (alarms are taken from the members' status only)"
                ));
                Vec::new()
            }
        }
    }

    /// Forgets the clients (and the transport's listeners) of endpoints this probe did not use:
    /// removed members, changed IPs.
    fn forget_unused(&self, endpoints: &[String], targets: &[Option<String>]) {
        let used: HashSet<&str> = endpoints
            .iter()
            .map(String::as_str)
            .chain(targets.iter().flatten().map(String::as_str))
            .collect();
        self.lock().retain(|k, _| used.contains(k.as_str()));
        self.transport.retain(&used);
    }

    /// The member list from the first endpoint that answers. Endpoints are asked in turn; one
    /// that neither answers nor fails within its head start gets company from the next, and the
    /// whole search ends at `deadline / MEMBER_LIST_SHARE`.
    async fn member_list(
        &self,
        endpoints: &[String],
        start: Instant,
        deadline: Duration,
    ) -> Result<(String, Client, Vec<etcd_client::Member>, Vec<EndpointError>), ProbeError> {
        let budget = deadline / MEMBER_LIST_SHARE;
        let until = start + budget;
        let timeout_text = &format!("no answer within {}", humantime::format_duration(budget));
        let hedge = (deadline / HEDGE_SHARE).max(MIN_HEDGE);
        let mut errors: Vec<Option<String>> = vec![None; endpoints.len()];
        let mut pending = FuturesUnordered::new();
        let mut next = 0;
        let mut next_at = start;
        loop {
            let now = Instant::now();
            if next < endpoints.len() && now < until && (pending.is_empty() || now >= next_at) {
                let i = next;
                next += 1;
                next_at = now + hedge;
                pending.push(async move {
                    let endpoint = &endpoints[i];
                    let result = async {
                        let mut client = self.client(endpoint, until, timeout_text).await?;
                        let resp = call(until, timeout_text, client.member_list()).await?;
                        Ok::<_, String>((client, resp))
                    }
                    .await;
                    (i, result)
                });
                continue;
            }
            if pending.is_empty() {
                break;
            }
            let wait = if next < endpoints.len() {
                next_at.min(until)
            } else {
                until
            };
            tokio::select! {
                Some((i, result)) = pending.next() => match result {
                    Ok((client, resp)) => {
                        let failures = endpoints
                            .iter()
                            .zip(errors)
                            .filter_map(|(e, err)| err.map(|error| EndpointError {
                                endpoint: e.clone(),
                                error,
                            }))
                            .collect();
                        return Ok((endpoints[i].clone(), client, resp.members().to_vec(), failures));
                    }
                    Err(error) => {
                        self.evict(&endpoints[i]);
                        errors[i] = Some(self.explain(&endpoints[i], start, with_hint(error)));
                        // A failure moves on at once.
                        next_at = Instant::now();
                    }
                },
                _ = sleep_until(wait) => {}
            }
        }
        let attempts = endpoints
            .iter()
            .zip(errors)
            .map(|(endpoint, error)| EndpointError {
                endpoint: endpoint.clone(),
                error: error.unwrap_or_else(|| "not asked: no time left".to_string()),
            })
            .collect();
        Err(ProbeError::MemberList { attempts })
    }
}

/// A member of the member list as the engine's [`Member`], its health not known yet.
fn listed_member(m: &etcd_client::Member) -> Member {
    let mut member = Member::new(m.id(), m.name());
    member.peer_urls = m.peer_urls().to_vec();
    member.client_urls = m.client_urls().to_vec();
    member.is_learner = m.is_learner();
    member
}

/// The member asked (it had a target) whose status and health took longest, and how long.
fn slowest(
    members: &[Member],
    targets: &[Option<String>],
    member_took: &[Duration],
) -> Option<(String, Duration)> {
    members
        .iter()
        .zip(targets)
        .zip(member_took)
        .filter(|((_, target), _)| target.is_some())
        .max_by_key(|(_, took)| **took)
        .map(|((m, _), took)| (m.display_name(), *took))
}

/// Judges each member from its report, or warns that its health is unknown (no target: the
/// transport's error, or no client URL for a started member); returns the alarms the members'
/// status `errors` name.
fn apply_reports(
    members: &mut [Member],
    targets: &[Option<String>],
    reports: Vec<Option<Report>>,
    target_errors: Vec<Option<String>>,
    warnings: &mut Vec<String>,
) -> Vec<(u64, Alarm)> {
    let mut status_alarms = Vec::new();
    for (((member, target), report), error) in members
        .iter_mut()
        .zip(targets)
        .zip(reports)
        .zip(target_errors)
    {
        match (target, report) {
            (Some(url), Some(report)) => {
                if let Ok(status) = &report.status {
                    status_alarms.extend(status.errors.iter().filter_map(|e| parse_alarm(e)));
                }
                apply(member, url, report);
            }
            _ => {
                if let Some(error) = error {
                    warnings.push(format!(
                        "member {} ({}): {error}: its health is unknown",
                        member.name, member.id
                    ));
                } else if !member.is_unstarted() {
                    warnings.push(format!(
                        "member {} ({}) has no client URL: its health is unknown",
                        member.name, member.id
                    ));
                }
            }
        }
    }
    status_alarms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_every_endpoint() {
        let e = ProbeError::MemberList {
            attempts: vec![
                EndpointError {
                    endpoint: "https://a:2379".into(),
                    error: "no answer within 1s".into(),
                },
                EndpointError {
                    endpoint: "https://b:2379".into(),
                    error: "not asked: no time left".into(),
                },
            ],
        };
        assert_eq!(
            e.to_string(),
            "no etcd endpoint answered the member list (etcd 3.4 and 3.5 answer it without a \
             leader, so each endpoint asked was down, unreachable, a learner or refused the \
             connection): https://a:2379: no answer within 1s; https://b:2379: not asked: no \
             time left"
        );
    }
}
