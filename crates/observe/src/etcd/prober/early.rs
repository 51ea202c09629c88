//! Asking early: a probe asks the members the previous probe listed, and the alarm list, at once,
//! beside the member list, instead of after it.
//!
//! Why: on kept connections a probe is round trips, and asking members only once the member list
//! is in makes two of them (three with the alarm list asked after the list). Across a WAN
//! between quorumguard and a workload API server each is a WAN round trip (issue 39). Membership
//! rarely changes between two probes, so the members to ask are known before the list says so.
//!
//! What keeps it true:
//! - **Everything is asked now.** Only the *question* comes from the previous probe (which
//!   members, at which endpoint); every answer used was given after this probe started.
//! - **The new member list decides.** An early answer serves a member only when the new list
//!   holds it with the same ID, at the same endpoint, with the same learner flag (a promoted
//!   learner is asked again, as a voter, with its linearizable read). A member the list holds that
//!   was not asked early is asked once the list is in, as before; an early question to a member
//!   the list no longer holds is dropped unanswered (never waited for: a removed member may be
//!   down). As always, a status whose header names another member than the one listed makes
//!   that member unhealthy ([`super::member`]).
//! - **The alarm list** is asked early of the endpoint that answered the previous member list, and
//!   used when this member list came from that same endpoint; otherwise (that endpoint did not
//!   answer first: down, frozen, slow) or when the early question failed, it is asked of the
//!   endpoint that answered, as before.

use std::pin::Pin;
use std::time::Duration;

use etcd_client::{AlarmAction, AlarmResponse, AlarmType};
use futures::future::Future;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use super::Prober;
use super::clients::call;
use super::member::Report;
use quorumguard_engine::model::Member;

/// A member asked by a probe: its ID, whether it was listed as a learner, and its endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Asked {
    id: u64,
    learner: bool,
    url: String,
}

/// What the latest successful probe asked: its members, and the endpoint that answered its
/// member list.
#[derive(Clone, Debug, Default)]
pub(super) struct Last {
    members: Vec<Asked>,
    from: Option<String>,
}

/// A member's report and how long it took to get.
pub(super) type Timed = (Report, Duration);

type Pending<'a> = Pin<Box<dyn Future<Output = (usize, Timed)> + Send + 'a>>;
type AlarmFuture<'a> = Pin<Box<dyn Future<Output = Result<AlarmResponse, String>> + Send + 'a>>;

/// The questions asked early, while the member list is awaited.
pub(super) struct Early<'a> {
    last: Last,
    pending: FuturesUnordered<Pending<'a>>,
    done: Vec<Option<Timed>>,
    alarms: AlarmFuture<'a>,
    alarms_done: Option<Result<AlarmResponse, String>>,
}

impl Prober {
    /// What the latest successful probe asked.
    pub(super) fn last_asked(&self) -> Last {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records what a successful probe asked: each listed member with a target (as listed, before
    /// its status is judged) and the endpoint that answered the list.
    pub(super) fn remember(&self, members: &[Member], targets: &[Option<String>], from: &str) {
        let asked = members
            .iter()
            .zip(targets)
            .filter_map(|(m, target)| {
                target.as_ref().map(|url| Asked {
                    id: m.id.0,
                    learner: m.is_learner,
                    url: url.clone(),
                })
            })
            .collect();
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Last {
            members: asked,
            from: Some(from.to_string()),
        };
    }

    /// Starts asking what `last` asked (it goes on when [`Early::poll_until`] or
    /// [`Early::reports_for`] is awaited).
    pub(super) fn ask_early<'a>(
        &'a self,
        last: Last,
        start: Instant,
        end: Instant,
        timeout_text: &'a str,
    ) -> Early<'a> {
        let pending: FuturesUnordered<Pending<'a>> = last
            .members
            .iter()
            .cloned()
            .enumerate()
            .map(|(j, a)| {
                Box::pin(async move {
                    let asked = Instant::now();
                    let report = self
                        .probe_member(&a.url, a.learner, start, end, timeout_text)
                        .await;
                    (j, (report, asked.elapsed()))
                }) as Pending<'a>
            })
            .collect();
        let from = last.from.clone();
        let alarms: AlarmFuture<'a> = Box::pin(async move {
            let Some(url) = from else {
                return Err("no earlier member list".to_string());
            };
            let mut client = self.client(&url, end, timeout_text).await?;
            call(
                end,
                timeout_text,
                client.alarm(AlarmAction::Get, AlarmType::None, None),
            )
            .await
        });
        Early {
            done: (0..last.members.len()).map(|_| None).collect(),
            last,
            pending,
            alarms,
            alarms_done: None,
        }
    }
}

impl<'a> Early<'a> {
    /// Awaits `fut` while the early questions go on.
    pub(super) async fn poll_until<T>(&mut self, fut: impl Future<Output = T>) -> T {
        let mut fut = std::pin::pin!(fut);
        loop {
            tokio::select! {
                out = &mut fut => return out,
                Some((j, timed)) = self.pending.next(), if !self.pending.is_empty() => {
                    self.done[j] = Some(timed);
                }
                alarms = &mut self.alarms, if self.alarms_done.is_none() => {
                    self.alarms_done = Some(alarms);
                }
            }
        }
    }

    /// For each member of the new list (with its target), the early question that serves it, if
    /// one does: same ID, same endpoint, same learner flag.
    pub(super) fn matches(
        &self,
        members: &[Member],
        targets: &[Option<String>],
    ) -> Vec<Option<usize>> {
        members
            .iter()
            .zip(targets)
            .map(|(m, target)| {
                let url = target.as_ref()?;
                self.last
                    .members
                    .iter()
                    .position(|a| a.id == m.id.0 && a.learner == m.is_learner && &a.url == url)
            })
            .collect()
    }

    /// Whether the alarm list asked early serves this probe: the member list came from the
    /// endpoint it was asked of.
    fn alarms_serve(&self, from: &str) -> bool {
        self.last.from.as_deref() == Some(from)
    }

    /// Splits into the early reports of `wanted` (awaited until each is in; the other questions
    /// are dropped unanswered) and the alarm list asked early, when it serves a member list from
    /// `from` (else `None`, to be asked of `from`).
    pub(super) fn finish(
        self,
        wanted: Vec<usize>,
        from: &str,
    ) -> (
        impl Future<Output = Vec<Option<Timed>>> + Send + use<'a>,
        Option<AlarmFuture<'a>>,
    ) {
        let serve = self.alarms_serve(from);
        let Early {
            mut pending,
            mut done,
            alarms,
            alarms_done,
            ..
        } = self;
        let reports = async move {
            while wanted.iter().any(|&j| done[j].is_none()) {
                match pending.next().await {
                    Some((j, timed)) => done[j] = Some(timed),
                    None => break,
                }
            }
            done
        };
        let alarms: Option<AlarmFuture<'a>> = match (serve, alarms_done) {
            (false, _) | (true, Some(Err(_))) => None,
            (true, Some(Ok(answer))) => Some(Box::pin(async move { Ok(answer) })),
            (true, None) => Some(alarms),
        };
        (reports, alarms)
    }
}
