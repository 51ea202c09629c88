//! The autopilot in `serve` (issue 38; docs/autopilot.md): its flags ([`AutopilotArgs`]) and,
//! after each sweep on the replica that writes status (the Lease holder), one turn per control
//! plane whose published next action is one the autopilot carries out ([`Autopilot`], run by the
//! status enricher between the snapshots and their publication).
//!
//! A turn's order: the cheap checks on the snapshot (the mode of that cluster, whether its next
//! action is one of the autopilot's, or a step of it is in flight); a fresh probe of its etcd
//! (the webhook's single-flight [`FreshProbes`], so a turn and a review of one cluster share
//! it); the engine's decision and the action ([`Pilot::turn`]); then its Events on the KCP, its
//! metrics, and in `dry-run` its words appended to the NextAction condition. Turns of different
//! clusters run at once; the publication waits for them, so what is published after a sweep
//! says what the autopilot did in it.
//!
//! The kill switch is read live: the Lease's annotation `quorumguard.io/autopilot` (read by the
//! elector at every renewal) lowers `--autopilot` for the whole fleet, as a KCP's annotation
//! lowers it for one cluster ([`Mode::effective`]). Without a Lease (`--no-leader-election`)
//! only the flag and the KCPs' annotations count.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use kube::Client;

use quorumguard_admission::events::{EventSink, Notice};
use quorumguard_autopilot::{AutopilotMetrics, Did, EtcdActor, MachineRef, Pilot, Report, Turn};
use quorumguard_engine::autopilot::{Kind, Mode, Settings};
use quorumguard_engine::{EtcdBasis, EtcdSnapshot, EtcdState, Policy, fresh_view};
use quorumguard_observe::etcd::fresh::{Fresh, FreshProbes};
use quorumguard_observe::etcd::sweep::Probers;
use quorumguard_observe::state::{ClusterState, KcpForAutopilot};
use quorumguard_status::lease::Leadership;
use quorumguard_status::publish::{BeforePublish, Snapshot};
use quorumguard_telemetry::Metrics;

/// `--autopilot`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum AutopilotMode {
    #[default]
    Off,
    DryRun,
    On,
}

impl From<AutopilotMode> for Mode {
    fn from(m: AutopilotMode) -> Mode {
        match m {
            AutopilotMode::Off => Mode::Off,
            AutopilotMode::DryRun => Mode::DryRun,
            AutopilotMode::On => Mode::On,
        }
    }
}

/// The autopilot's flags.
#[derive(Clone, Debug, Args)]
pub struct AutopilotArgs {
    /// Whether quorumguard carries out the published next action itself when it is proven safe
    /// on a fresh probe: off, dry-run (says what it would do and when, in the NextAction
    /// condition and an Event) or on. A KubeadmControlPlane's annotation
    /// quorumguard.io/autopilot, and the same annotation on the leader-election Lease (the
    /// fleet-wide kill switch, read live), can only lower it. Needs etcd probing and status
    /// publishing.
    #[arg(long, env = "QUORUMGUARD_AUTOPILOT", value_enum, default_value_t = AutopilotMode::Off)]
    pub autopilot: AutopilotMode,
    /// The actions the autopilot may take, comma-separated: promote-learner, remove-member,
    /// free-space, delete-machine.
    #[arg(
        long,
        env = "QUORUMGUARD_AUTOPILOT_ACTIONS",
        value_delimiter = ',',
        default_value = "promote-learner,remove-member,free-space,delete-machine",
        value_parser = action
    )]
    pub autopilot_actions: Vec<Kind>,
    /// At most one action per cluster per this interval (the steps of one free-space plan are
    /// one action).
    #[arg(long, env = "QUORUMGUARD_AUTOPILOT_INTERVAL", default_value = "5m", value_parser = crate::duration)]
    pub autopilot_interval: Duration,
    /// At most this many clusters acting at once across the fleet.
    #[arg(long, env = "QUORUMGUARD_AUTOPILOT_MAX_ACTING", default_value_t = 1)]
    pub autopilot_max_acting: usize,
    /// Deadline of one etcd call of an action (a defragmentation of a large database takes
    /// seconds to minutes; the member answers nothing meanwhile).
    #[arg(long, env = "QUORUMGUARD_AUTOPILOT_CALL_TIMEOUT", default_value = "60s", value_parser = crate::duration)]
    pub autopilot_call_timeout: Duration,
    /// etcd's --quota-backend-bytes in the workload clusters (kubeadm keeps etcd's default,
    /// 2 GiB): the autopilot disarms NOSPACE only when every member's database is under it.
    #[arg(long, env = "QUORUMGUARD_ETCD_QUOTA_BACKEND_BYTES", default_value_t = 2 * 1024 * 1024 * 1024)]
    pub etcd_quota_backend_bytes: u64,
}

fn action(s: &str) -> Result<Kind, String> {
    Kind::parse(s).ok_or_else(|| {
        let all: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        format!("unknown autopilot action {s:?}: one of {}", all.join(", "))
    })
}

impl AutopilotArgs {
    /// `None` when off.
    pub fn config(&self) -> Option<AutopilotConfig> {
        if self.autopilot == AutopilotMode::Off {
            return None;
        }
        Some(AutopilotConfig {
            mode: self.autopilot.into(),
            settings: Settings {
                actions: self.autopilot_actions.iter().copied().collect(),
                interval: self.autopilot_interval,
                quota_backend_bytes: self.etcd_quota_backend_bytes,
                ..Settings::default()
            },
            max_acting: self.autopilot_max_acting,
            call_timeout: self.autopilot_call_timeout,
        })
    }

    /// Rejects settings that cannot work.
    pub fn check(&self, no_probe: bool, no_status: bool) -> anyhow::Result<()> {
        if self.autopilot == AutopilotMode::Off {
            return Ok(());
        }
        if no_probe || no_status {
            anyhow::bail!(
                "--autopilot {}: the autopilot acts on fresh etcd probes and on the next action it publishes; remove --no-probe and --no-status, or set --autopilot off",
                self.autopilot
                    .to_possible_value()
                    .map_or("?".into(), |v| v.get_name().to_string())
            );
        }
        if self.autopilot_max_acting == 0 {
            anyhow::bail!(
                "--autopilot-max-acting 0 lets no cluster act: set at least 1, or --autopilot off"
            );
        }
        if self.autopilot_interval < Duration::from_secs(60) {
            anyhow::bail!(
                "--autopilot-interval {} is under a minute: after each action KCP, kubeadm and the Machine controller reconcile (KCP every few seconds to 3 minutes) and a sweep must re-prove it; set 1m or more",
                humantime::format_duration(self.autopilot_interval)
            );
        }
        let distinct: BTreeSet<Kind> = self.autopilot_actions.iter().copied().collect();
        if distinct.is_empty() {
            anyhow::bail!(
                "--autopilot-actions is empty: name at least one action, or set --autopilot off"
            );
        }
        Ok(())
    }
}

/// The autopilot's settings in [`crate::server::ServeConfig`] (absent: off).
#[derive(Clone, Debug)]
pub struct AutopilotConfig {
    /// `--autopilot` (dry-run or on).
    pub mode: Mode,
    pub settings: Settings,
    pub max_acting: usize,
    /// Deadline of one etcd call.
    pub call_timeout: Duration,
}

/// Who the autopilot's Events name as the requester (for the Event publisher's limits).
const REQUESTER: &str = "quorumguard-autopilot";

/// The autopilot of one `serve` replica, run by the enricher before each publication.
pub struct Autopilot {
    flag: Mode,
    pilot: Arc<Pilot>,
    fresh: Arc<FreshProbes>,
    probers: Arc<Probers>,
    client: Client,
    leadership: Leadership,
    events: Option<EventSink>,
    metrics: Arc<AutopilotMetrics>,
    call_timeout: Duration,
}

/// What a turn needs, gathered without I/O from one snapshot.
struct Prepared {
    index: usize,
    kcp: KcpForAutopilot,
    target: quorumguard_observe::state::ProbeTarget,
    machine: Option<MachineRef>,
    actor: EtcdActor,
}

impl Autopilot {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: &AutopilotConfig,
        policy: Policy,
        fresh: Arc<FreshProbes>,
        probers: Arc<Probers>,
        client: Client,
        leadership: Leadership,
        events: Option<EventSink>,
        metrics: &Metrics,
    ) -> Self {
        let l = leadership.clone();
        let pilot = Pilot::new(
            config.mode,
            config.settings.clone(),
            policy,
            config.max_acting,
        )
        .with_leading(move || l.is_leader());
        Autopilot {
            flag: config.mode,
            pilot: Arc::new(pilot),
            fresh,
            probers,
            client,
            leadership,
            events,
            metrics: Arc::new(AutopilotMetrics::register(metrics)),
            call_timeout: config.call_timeout,
        }
    }

    /// The fleet-wide mode now: `--autopilot`, lowered by the Lease's annotation.
    fn fleet_mode(&self) -> Mode {
        Mode::effective(self.flag, self.leadership.autopilot_annotation().as_deref())
    }

    /// Whether snapshot `s` gets a turn, and what it needs: no probe is taken for a cluster
    /// whose mode is off or whose next action is none the autopilot takes, unless a step of
    /// it is in flight (the turn settles it).
    fn prepare(&self, state: &ClusterState, index: usize, s: &Snapshot) -> Option<Prepared> {
        let (ns, name) = (&s.key.0, &s.key.1);
        let kcp = state.kcp_for_autopilot(ns, name)?;
        let key = s.cp.kcp_shown().to_string();
        if !self
            .pilot
            .wants_turn(&key, kcp.annotation.as_deref(), &s.next)
        {
            return None;
        }
        let target = state.probe_target(ns, name)?;
        let prober = self
            .probers
            .prober(&(target.namespace.clone(), target.cluster.clone()))?;
        let actor = EtcdActor::new(
            prober.tls().clone(),
            prober.transport().clone(),
            self.call_timeout,
        );
        let machine = match (s.next.code, &s.next.target) {
            (quorumguard_engine::ActionCode::DeleteMachine, Some(m)) => {
                let id = state.machine_identity(ns, m)?;
                Some(MachineRef {
                    namespace: ns.clone(),
                    name: m.clone(),
                    uid: id.uid?,
                    resource_version: id.resource_version?,
                })
            }
            _ => None,
        };
        Some(Prepared {
            index,
            kcp,
            target,
            machine,
            actor,
        })
    }

    /// One turn: a fresh probe, then the pilot's decision and action.
    async fn turn(&self, p: &Prepared, s: &Snapshot) -> Report {
        let record: &[quorumguard_engine::Member] = match &s.cp.etcd {
            EtcdState::Observed(o) => &o.members,
            EtcdState::Unknown { .. } => &[],
        };
        let mut fresh = s.cp.clone();
        fresh.etcd = match self.fresh.probe(p.target.clone(), Instant::now()).await {
            Fresh::Members(members) => EtcdState::Observed(EtcdSnapshot {
                members: fresh_view(members, record),
                age: Some(Duration::ZERO),
            }),
            Fresh::Failed(e) => EtcdState::Unknown {
                reason: format!("the autopilot's fresh etcd probe failed: {e}"),
            },
            Fresh::TimedOut(t) => EtcdState::Unknown {
                reason: format!(
                    "the autopilot's fresh etcd probe got no answer within {}",
                    humantime::format_duration(t)
                ),
            },
        };
        let now_unix = quorumguard_observe::unix_now();
        self.pilot
            .turn(
                Turn {
                    annotation: p.kcp.annotation.as_deref(),
                    published: &s.next,
                    fresh: &fresh,
                    basis: EtcdBasis::FreshProbe,
                    machine: p.machine.as_ref(),
                    now_unix,
                },
                &p.actor,
                &self.client,
            )
            .await
    }

    /// Tells what a turn did: Events on the KCP, metrics, logs.
    fn tell(&self, p: &Prepared, s: &Snapshot, report: &Report) {
        self.metrics
            .observe(report, quorumguard_observe::unix_now());
        match &report.did {
            Did::Acted {
                step,
                result: Ok(done),
                ..
            } => tracing::info!(kcp = %s.cp.kcp_shown(), %step, ?done, "autopilot acted"),
            Did::Acted {
                step,
                result: Err(e),
                ..
            } => {
                tracing::warn!(kcp = %s.cp.kcp_shown(), %step, error = %e, "autopilot action failed")
            }
            _ => {}
        }
        let Some(sink) = &self.events else {
            return;
        };
        for e in report.events() {
            let audit = e.is_record();
            sink.send(Notice {
                kind: "KubeadmControlPlane".into(),
                api_version: p.kcp.api_version.clone(),
                namespace: s.key.0.clone(),
                name: s.key.1.clone(),
                uid: p.kcp.uid.clone(),
                warning: e.warning,
                reason: e.reason.into(),
                action: "Autopilot".into(),
                note: e.note,
                requester: REQUESTER.into(),
                audit,
            });
        }
    }
}

impl BeforePublish for Autopilot {
    async fn before_publish(&mut self, state: &ClusterState, snapshots: &mut [Snapshot]) {
        self.pilot.set_flag(self.fleet_mode());
        let prepared: Vec<Prepared> = snapshots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.prepare(state, i, s))
            .collect();
        if prepared.is_empty() {
            return;
        }
        let this = &*self;
        let shared: &[Snapshot] = snapshots;
        let reports = futures::future::join_all(
            prepared
                .iter()
                .map(|p| async move { this.turn(p, &shared[p.index]).await }),
        )
        .await;
        for (p, report) in prepared.iter().zip(reports) {
            self.tell(p, &snapshots[p.index], &report);
            if let Did::DryRun { message, .. } = &report.did {
                let next = &mut snapshots[p.index].next;
                next.message = format!("{} {message}", next.message);
            }
        }
    }
}
