//! The etcd calls an autopilot action is made of, each on one member of one workload cluster.
//!
//! Why it is shaped this way:
//! - **One call, one member, one deadline.** Over TLS a call to a SIGSTOPped member hangs (the
//!   prober's module doc says more), so dialling and the call are bounded together by
//!   [`tokio::time::timeout_at`]. A call that runs out of time may or may not have been applied
//!   by etcd, and its error says so: the caller probes again before doing anything else.
//! - **A connection per call, closed when it ends.** Actions are rare (at most one per cluster
//!   per autopilot interval): the prober's kept clients stay read-only, and nothing an action
//!   opened outlives it.
//! - **Which member each call goes to** follows etcd: membership changes (promote, remove),
//!   compaction and alarm changes are cluster-wide and any voting member forwards them to the
//!   leader; a defragmentation is the member's own (etcd defragments the backend of the member
//!   it is sent to, and blocks that member's reads and writes while it runs); MoveLeader is
//!   refused by a member that is not the leader; a status is the member's own view.
//! - **The same transport as the prober** ([`Transport::member_endpoint`]): direct to the
//!   member's first client URL, or through the workload API server to pod `etcd-<name>`.

use std::future::Future;
use std::time::Duration;

use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions};
use quorumguard_engine::model::{Member, MemberId};
use quorumguard_observe::etcd::channel::{Channel, chain};
use quorumguard_observe::etcd::{ClientTls, Transport};
use thiserror::Error;
use tokio::time::{Instant, timeout_at};
use tower::util::BoxCloneSyncService;

/// The etcd calls an action is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Promote,
    Remove,
    Compact,
    Defragment,
    MoveLeader,
    DisarmNospace,
    Status,
}

impl Call {
    /// As etcdctl names the call.
    pub fn as_str(self) -> &'static str {
        match self {
            Call::Promote => "member promote",
            Call::Remove => "member remove",
            Call::Compact => "compaction",
            Call::Defragment => "defrag",
            Call::MoveLeader => "move-leader",
            Call::DisarmNospace => "alarm disarm (NOSPACE)",
            Call::Status => "endpoint status",
        }
    }

    /// Whether the call changes the cluster (a status does not).
    pub fn changes_something(self) -> bool {
        self != Call::Status
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a call did not succeed. Each message names the call, the member and its endpoint, and
/// whether etcd may have applied it.
#[derive(Debug, Error)]
pub enum ActError {
    #[error(
        "{call} via member {member}: the {transport} transport cannot reach it: {why}; nothing \
         was sent to etcd"
    )]
    Unreachable {
        call: Call,
        member: String,
        transport: &'static str,
        why: String,
    },
    #[error(
        "{call} via member {member} ({endpoint}): could not connect: {error}; nothing was sent \
         to etcd"
    )]
    Connect {
        call: Call,
        member: String,
        endpoint: String,
        error: String,
    },
    #[error(
        "{call} via member {member} ({endpoint}): no answer within {deadline:?}; {applied} \
         probe again before anything else"
    )]
    Timeout {
        call: Call,
        member: String,
        endpoint: String,
        deadline: Duration,
        applied: &'static str,
    },
    #[error("{call} via member {member} ({endpoint}): etcd refused it: {error}")]
    Refused {
        call: Call,
        member: String,
        endpoint: String,
        error: String,
    },
    #[error(
        "{call} via member {member} ({endpoint}): the connection failed during the call: \
         {error}; {applied} probe again before anything else"
    )]
    Broken {
        call: Call,
        member: String,
        endpoint: String,
        error: String,
        applied: &'static str,
    },
}

/// What an error after the request was sent says of it.
fn maybe_applied(call: Call) -> &'static str {
    if call.changes_something() {
        "etcd may or may not have applied it:"
    } else {
        "nothing was changed:"
    }
}

/// One member's own status, as an action reads it between its steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberState {
    /// The member that answered (from the response header).
    pub id: MemberId,
    /// The leader it follows; 0 while it knows none.
    pub leader: u64,
    /// The size of its backend database file, bytes: what etcd's quota counts.
    pub db_size: u64,
    /// The part of it in use (the rest is freed pages a defragmentation gives back).
    pub db_size_in_use: u64,
    /// The store's revision it has applied.
    pub revision: i64,
    pub raft_index: u64,
    pub is_learner: bool,
    /// Its status errors (e.g. `memberID:<id> alarm:NOSPACE`, "etcdserver: no leader").
    pub errors: Vec<String>,
}

/// The etcd calls of one workload cluster, over its transport and its client TLS.
pub struct EtcdActor {
    tls: ClientTls,
    transport: Transport,
    deadline: Duration,
}

impl EtcdActor {
    /// `deadline` bounds each call, dialling included. A defragmentation of a large database
    /// takes seconds: give it the time etcdctl's `--command-timeout` would.
    pub fn new(tls: ClientTls, transport: Transport, deadline: Duration) -> Self {
        EtcdActor {
            tls,
            transport,
            deadline,
        }
    }

    /// `member`'s own status.
    pub async fn status(&self, member: &Member) -> Result<MemberState, ActError> {
        let status = self
            .run(
                Call::Status,
                member,
                |mut c| async move { c.status().await },
            )
            .await?;
        let header = status.header();
        Ok(MemberState {
            id: MemberId(header.map(|h| h.member_id()).unwrap_or(0)),
            leader: status.leader(),
            db_size: u64::try_from(status.db_size()).unwrap_or(0),
            db_size_in_use: u64::try_from(status.raft_used_db_size()).unwrap_or(0),
            revision: header.map(|h| h.revision()).unwrap_or(0),
            raft_index: status.raft_index(),
            is_learner: status.is_learner(),
            errors: status.errors().to_vec(),
        })
    }

    /// Promotes `learner` to a voting member, asking `via` (a voting member). etcd refuses a
    /// learner not yet in sync with the leader ("can only promote a learner member which is in
    /// sync with leader").
    pub async fn promote(&self, via: &Member, learner: MemberId) -> Result<(), ActError> {
        self.run(Call::Promote, via, |mut c| async move {
            c.member_promote(learner.0).await
        })
        .await
        .map(drop)
    }

    /// Removes member `id`, asking `via` (a voting member).
    pub async fn remove(&self, via: &Member, id: MemberId) -> Result<(), ActError> {
        self.run(Call::Remove, via, |mut c| async move {
            c.member_remove(id.0).await
        })
        .await
        .map(drop)
    }

    /// Compacts the history up to the revision `via` has applied (physically: the call returns
    /// when the members have removed it from their backends), and returns that revision.
    pub async fn compact(&self, via: &Member) -> Result<i64, ActError> {
        let revision = self.status(via).await?.revision;
        self.run(Call::Compact, via, |mut c| async move {
            c.compact(revision, Some(CompactionOptions::new().with_physical()))
                .await
        })
        .await?;
        Ok(revision)
    }

    /// Defragments `member`'s backend (its own, no other member's).
    pub async fn defragment(&self, member: &Member) -> Result<(), ActError> {
        self.run(Call::Defragment, member, |mut c| async move {
            c.defragment().await
        })
        .await
        .map(drop)
    }

    /// Moves the leadership from `leader` (the call must reach the leader) to `to`.
    pub async fn move_leader(&self, leader: &Member, to: MemberId) -> Result<(), ActError> {
        self.run(Call::MoveLeader, leader, |mut c| async move {
            c.move_leader(to.0).await
        })
        .await
        .map(drop)
    }

    /// Disarms the NOSPACE alarm of member `alarmed`, asking `via`. Writes resume only when no
    /// member has one left.
    pub async fn disarm_nospace(&self, via: &Member, alarmed: MemberId) -> Result<(), ActError> {
        self.run(Call::DisarmNospace, via, |mut c| async move {
            let mut options = AlarmOptions::new();
            options.with_member(alarmed.0);
            c.alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(options))
                .await
        })
        .await
        .map(drop)
    }

    /// Dials `member` and makes `call` with `f`, both before the deadline.
    async fn run<T, F, Fut>(&self, call: Call, member: &Member, f: F) -> Result<T, ActError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        // As the engine's words name a member: its name and id, or "(unstarted <id>)".
        let name = if member.is_unstarted() {
            member.display_name()
        } else {
            format!("{} ({})", member.name, member.id)
        };
        let endpoint = match self.transport.member_endpoint(member) {
            Ok(Some(endpoint)) => endpoint,
            Ok(None) => {
                return Err(ActError::Unreachable {
                    call,
                    member: name,
                    transport: self.transport.kind().as_str(),
                    why: "it has no client URL and no name yet (added, never started)".into(),
                });
            }
            Err(e) => {
                return Err(ActError::Unreachable {
                    call,
                    member: name,
                    transport: self.transport.kind().as_str(),
                    why: e.to_string(),
                });
            }
        };
        let started = Instant::now();
        let until = started + self.deadline;
        // The transport's own failure, when it knows one (the API server refused the
        // port-forward: "pods \"etcd-x\" not found"), says more than what the client saw.
        let connect = |error: String| ActError::Connect {
            call,
            member: name.clone(),
            endpoint: endpoint.clone(),
            error: self
                .transport
                .forward_error(&endpoint, started.into_std())
                .unwrap_or(error),
        };
        let timeout = |sent: bool| ActError::Timeout {
            call,
            member: name.clone(),
            endpoint: endpoint.clone(),
            deadline: self.deadline,
            applied: if sent {
                maybe_applied(call)
            } else {
                "nothing was changed:"
            },
        };
        let dial = Channel::connect(&endpoint, self.tls.config(), self.transport.tls_name());
        let channel = match timeout_at(until, dial).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => return Err(connect(chain(&e))),
            Err(_) => return Err(timeout(false)),
        };
        let raw = etcd_client::Channel::Custom(BoxCloneSyncService::new(channel));
        let client = match timeout_at(until, Client::from_channel(raw, None)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(connect(e.to_string())),
            Err(_) => return Err(timeout(false)),
        };
        match timeout_at(until, f(client)).await {
            Ok(Ok(answer)) => Ok(answer),
            // etcd's own answer (a gRPC status), unless the transport knows the connection
            // broke (a port-forward the API server ended): then the status is the relay's.
            Ok(Err(etcd_client::Error::GRpcStatus(status)))
                if self
                    .transport
                    .forward_error(&endpoint, started.into_std())
                    .is_none() =>
            {
                Err(ActError::Refused {
                    call,
                    member: name,
                    endpoint,
                    error: status.message().to_string(),
                })
            }
            Ok(Err(e)) => Err(ActError::Broken {
                call,
                member: name,
                error: self
                    .transport
                    .forward_error(&endpoint, started.into_std())
                    .unwrap_or_else(|| e.to_string()),
                endpoint,
                applied: maybe_applied(call),
            }),
            Err(_) => Err(timeout(true)),
        }
    }
}
