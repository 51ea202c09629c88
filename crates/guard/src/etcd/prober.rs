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
//!   for learner"): the next endpoint answers. etcd 3.4 serves the member list without quorum
//!   (3.5 may not); when no endpoint answers, the probe fails naming every endpoint and its error.
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

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use etcd_client::{AlarmAction, AlarmType, Client, StatusResponse};
use futures::future::{Either, join_all, select};
use futures::stream::{FuturesUnordered, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use thiserror::Error;
use tokio::time::{Instant, sleep_until, timeout_at};
use tower::util::BoxCloneSyncService;

use super::certs::{self, CertError};
use super::channel::{Channel, append_causes, chain};
use super::endpoints::Transport;
use crate::engine::model::{Alarm, Health, Member, MemberId};

/// The share of the deadline the member list may take, at most: the rest is left to the
/// members' status and health, which run in parallel.
const MEMBER_LIST_SHARE: u32 = 2;
/// How long an endpoint asked for the member list has alone before the next one is asked too:
/// this fraction of the deadline (a failure moves on at once).
const HEDGE_SHARE: u32 = 8;
/// The shortest head start, so that short deadlines do not ask every endpoint at once.
const MIN_HEDGE: Duration = Duration::from_millis(50);

/// How many TLS sessions a cluster's client configuration remembers for resumption: enough for
/// its members (a redial after a restart), far fewer than rustls' default of 256, whose cache
/// alone is 14 KiB per configuration.
const TLS_SESSIONS: usize = 8;

/// TLS material for etcd's client port: the CA that signed the serving certificates, and a
/// client certificate that CA accepts (etcd runs with `--client-cert-auth`).
///
/// Holds the rustls configuration built from it, once: every connection of the cluster (and
/// every clone) shares it, instead of parsing the PEM and building a configuration per member.
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: String,
    cert_pem: String,
    config: Arc<ClientConfig>,
}

impl fmt::Debug for ClientTls {
    /// Leaves the key out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

/// Why TLS material is unusable. Checked before any connection, so a bad Secret is reported as
/// such and not as a connection failure.
#[derive(Debug, Error)]
pub enum TlsError {
    #[error("{what}: {problem}")]
    Pem { what: &'static str, problem: String },
    #[error(transparent)]
    Sign(#[from] CertError),
    #[error("etcd TLS material: {0} (does the client key belong to the client certificate?)")]
    Config(rustls::Error),
}

impl ClientTls {
    /// From PEM: the CA certificate(s) to verify etcd's serving certificate with, and the client
    /// certificate and its key.
    pub fn new(
        ca_pem: impl Into<String>,
        cert_pem: impl Into<String>,
        key_pem: impl Into<String>,
    ) -> Result<Self, TlsError> {
        let (ca_pem, cert_pem, key_pem) = (ca_pem.into(), cert_pem.into(), key_pem.into());
        let pem = |what: &'static str| {
            move |e: rustls::pki_types::pem::Error| TlsError::Pem {
                what,
                problem: match e {
                    rustls::pki_types::pem::Error::NoItemsFound => "no PEM block".to_string(),
                    other => format!("bad PEM: {other:?}"),
                },
            }
        };
        let cas = CertificateDer::pem_slice_iter(ca_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem("etcd CA certificate"))?;
        if cas.is_empty() {
            return Err(pem("etcd CA certificate")(
                rustls::pki_types::pem::Error::NoItemsFound,
            ));
        }
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem("etcd client certificate"))?;
        if certs.is_empty() {
            return Err(pem("etcd client certificate")(
                rustls::pki_types::pem::Error::NoItemsFound,
            ));
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(pem("etcd client key"))?;
        let mut roots = RootCertStore::empty();
        let (_, unusable) = roots.add_parsable_certificates(cas);
        if roots.is_empty() {
            return Err(TlsError::Pem {
                what: "etcd CA certificate",
                problem: format!("none of its {unusable} certificate(s) can be used as a CA"),
            });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(TlsError::Config)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.resumption = rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS);
        Ok(ClientTls {
            ca_pem,
            cert_pem,
            config: Arc::new(config),
        })
    }

    /// From the etcd CA (Secret `<cluster>-etcd`): a new client certificate signed with it (see
    /// [`certs::sign_client_cert`]), trusting the same CA for the serving certificates.
    pub fn from_etcd_ca(
        ca_cert_pem: &str,
        ca_key_pem: &str,
        now: SystemTime,
    ) -> Result<Self, TlsError> {
        let cert =
            certs::sign_client_cert(ca_cert_pem, ca_key_pem, certs::CLIENT_COMMON_NAME, now)?;
        Self::new(ca_cert_pem, cert.cert_pem, cert.key_pem)
    }

    /// The CA certificate(s), PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The client certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The rustls configuration every connection with this material uses.
    fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }
}

/// What one probe saw.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Every member of the member list, in etcd's order, with health from its own endpoint.
    pub members: Vec<Member>,
    /// How long the probe took.
    pub took: Duration,
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
        "no etcd endpoint answered the member list (all members down, quorum lost, or TLS \
         refused): {}",
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

/// A kept client and the one connection under it (see [`super::channel`]).
struct Kept {
    client: Client,
    channel: Channel,
}

impl fmt::Debug for Prober {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prober")
            .field("transport", &self.transport)
            .field("cached_endpoints", &self.cached_endpoints())
            .finish_non_exhaustive()
    }
}

/// A member's status, reduced to what is judged.
struct Status {
    answered_by: u64,
    leader: u64,
    version: String,
    db_size: i64,
    raft_term: u64,
    raft_index: u64,
    is_learner: bool,
    errors: Vec<String>,
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
            is_learner: s.is_learner(),
            errors: s.errors().to_vec(),
        }
    }
}

/// What one member's endpoint answered. `health` is `None` when the read was not made (a
/// learner) or not waited for (the status already showed the member unhealthy).
struct Report {
    status: Result<Status, String>,
    health: Option<Result<(), String>>,
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
        for f in failures {
            warnings.push(format!("member list: {f}"));
        }

        let mut members: Vec<Member> = listed
            .iter()
            .map(|m| {
                let mut member = Member::new(m.id(), m.name());
                member.peer_urls = m.peer_urls().to_vec();
                member.client_urls = m.client_urls().to_vec();
                member.is_learner = m.is_learner();
                member
            })
            .collect();
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

        let timeout_text = timeout_text.as_str();
        let reports = join_all(members.iter().zip(&targets).map(|(m, target)| async move {
            match target {
                Some(url) => Some(
                    self.probe_member(url, m.is_learner, start, end, timeout_text)
                        .await,
                ),
                None => None,
            }
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
                    .flatten()
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

        let alarms: Vec<(u64, Alarm)> = match alarms {
            Ok(resp) => resp
                .alarms()
                .iter()
                .filter_map(|a| alarm_of(a.alarm()).map(|alarm| (a.member_id(), alarm)))
                .collect(),
            Err(e) => {
                self.evict(&from);
                warnings.push(format!(
                    "alarm list from {from}: {e} (alarms are taken from the members' status only)"
                ));
                Vec::new()
            }
        };

        let mut status_alarms = Vec::new();
        for (((member, target), report), error) in members
            .iter_mut()
            .zip(&targets)
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
        attach_alarms(
            &mut members,
            alarms.into_iter().chain(status_alarms),
            &mut warnings,
        );

        // Forget clients of endpoints this probe did not use (removed members, changed IPs).
        let used: HashSet<&str> = endpoints
            .iter()
            .map(String::as_str)
            .chain(targets.iter().flatten().map(String::as_str))
            .collect();
        self.lock().retain(|k, _| used.contains(k.as_str()));
        self.transport.retain(&used);

        Ok(Probe {
            members,
            took: start.elapsed(),
            warnings,
            member_list_from: from,
        })
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

    /// Status and (for voting members) a linearizable read of one member, both by `end`.
    /// Failures are explained by the transport when it knows more (see [`Prober::explain`]).
    async fn probe_member(
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

    /// What to report for a failed call to `url`: the transport's own failure since `since`
    /// when there is one (it is the cause: etcd-client only saw the connection close), else
    /// etcd-client's `error`.
    fn explain(&self, url: &str, since: Instant, error: String) -> String {
        self.transport
            .forward_error(url, since.into_std())
            .unwrap_or(error)
    }

    /// The kept client of `url`, or a new one (dialled by `until`). A kept client whose
    /// connection has ended (the member restarted, or closed it) is replaced before use, so the
    /// restart does not cost this probe a failed call.
    async fn client(
        &self,
        url: &str,
        until: Instant,
        timeout_text: &str,
    ) -> Result<Client, String> {
        {
            let mut clients = self.lock();
            match clients.get(url) {
                Some(kept) if !kept.channel.is_closed() => return Ok(kept.client.clone()),
                Some(_) => {
                    clients.remove(url);
                }
                None => {}
            }
        }
        let connect = Channel::connect(url, self.tls.config(), self.transport.tls_name());
        let channel = match timeout_at(until, connect).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => return Err(chain(&e)),
            Err(_) => return Err(timeout_text.to_string()),
        };
        let raw = etcd_client::Channel::Custom(BoxCloneSyncService::new(channel.clone()));
        let client = call(until, timeout_text, Client::from_channel(raw, None)).await?;
        let mut clients = self.lock();
        let kept = clients
            .entry(url.to_string())
            .or_insert_with(|| Box::new(Kept { client, channel }));
        Ok(kept.client.clone())
    }

    fn evict(&self, url: &str) {
        self.lock().remove(url);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Box<Kept>>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Awaits `fut` until `until`; errors become text.
async fn call<T>(
    until: Instant,
    timeout_text: &str,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match timeout_at(until, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err(timeout_text.to_string()),
    }
}

/// An etcd-client error as a human reads it: etcd's own message (e.g. "etcdserver: no
/// leader") or the transport's, followed by its causes (e.g. "Connection refused", the TLS
/// alert), without repeating what is already said.
fn describe(e: &etcd_client::Error) -> String {
    let mut text = match e {
        etcd_client::Error::GRpcStatus(s) if !s.message().is_empty() => s.message().to_string(),
        etcd_client::Error::GRpcStatus(s) => format!("gRPC status {:?}", s.code()),
        other => other.to_string(),
    };
    // etcd_client::Error does not expose its cause through `source()`: start from the inner
    // error, where tonic keeps the cause (e.g. the I/O error behind "tcp connect error").
    let source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
        etcd_client::Error::TransportError(t) => std::error::Error::source(t),
        etcd_client::Error::IoError(io) => std::error::Error::source(io),
        _ => None,
    };
    append_causes(&mut text, source);
    text
}

/// Says what an abrupt close on a new connection usually means. Over TLS 1.3 etcd checks the
/// client certificate after the client has finished its handshake, so a refused certificate
/// shows up as the alert ("BadCertificate") only when it wins the race with the first request;
/// otherwise the client sees only the connection closing.
fn with_hint(error: String) -> String {
    let abrupt = ["connection closed", "broken pipe", "connection reset"]
        .iter()
        .any(|s| error.contains(s));
    if abrupt {
        format!("{error} (etcd closed the connection: is the client certificate signed by its CA?)")
    } else {
        error
    }
}

/// The engine's alarm for etcd's, or `None` for "no alarm".
fn alarm_of(t: AlarmType) -> Option<Alarm> {
    match t {
        AlarmType::None => None,
        AlarmType::Nospace => Some(Alarm::NoSpace),
        AlarmType::Corrupt => Some(Alarm::Corrupt),
    }
}

/// A status `errors` entry naming an alarm: `memberID:<decimal id> alarm:<TYPE> `.
fn parse_alarm(entry: &str) -> Option<(u64, Alarm)> {
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
fn attach_alarms(
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
fn apply(member: &mut Member, url: &str, report: Report) {
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
    fn healthy_needs_a_leader_no_errors_and_a_read() {
        let m = applied(Report {
            status: Ok(status(7, &[])),
            health: Some(Ok(())),
        });
        assert_eq!(m.health, Health::Healthy);
        assert!(m.is_leader);
        assert_eq!(m.raft_index, Some(28));
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
            "no etcd endpoint answered the member list (all members down, quorum lost, or TLS \
             refused): https://a:2379: no answer within 1s; https://b:2379: not asked: no time left"
        );
    }

    #[test]
    fn tls_material_is_checked_before_connecting() {
        let err = ClientTls::new("", "x", "y").unwrap_err();
        assert_eq!(err.to_string(), "etcd CA certificate: no PEM block");
    }
}
