//! `quorumguard playground`: quorumguard's main job on one machine, with no Kubernetes cluster.
//! A real 3-member etcd cluster with TLS, the API-server stand-in holding a Cluster API control
//! plane, and `quorumguard serve` (webhook, prober, status publisher), all on 127.0.0.1, replaying
//! a story (`--scenario`) or left running for kubectl (`--keep`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::sync::broadcast::error::RecvError;

use crate::kcp::{KcpController, Step, Style};
use crate::realapi::{Assets, CRD_FILES, CRDS_VAR, crd_files};
use crate::scenarios::{self, DEFAULT_SCENARIO, SCENARIOS};
use crate::telemetry::{self, LogFormat};
use crate::timeline::{Sink, Timeline};
use crate::world::{CLUSTER, KCP, NAMESPACE, RealApiPlan, World, WorldOptions};

#[derive(Debug, Args)]
#[command(after_help = "\
Needs etcd and etcdctl on PATH (Debian: etcd-server, etcd-client) and openssl; scripts/try.sh
installs them. Everything listens on 127.0.0.1 only and is stopped on exit, also on Ctrl-C.

With --real-apiserver (or --kube-apiserver PATH) the same stories run on a real kube-apiserver
started for the run (KUBEBUILDER_ASSETS: a directory with kube-apiserver and etcd, as
setup-envtest lays it out) with the Cluster API CRDs of --capi-crds installed; see
docs/playground.md, section On a real kube-apiserver.

Exit status: 0 when every expectation of the scenario held (or, with --keep, on Ctrl-C),
1 when one did not, 2 when the playground could not start (the error says why).")]
pub struct PlaygroundArgs {
    /// The story to replay (see --list; default: upgrade-stuck).
    #[arg(long, value_name = "NAME")]
    pub scenario: Option<String>,
    /// List the scenarios and exit.
    #[arg(long)]
    pub list: bool,
    /// Keep everything running and write a kubeconfig for kubectl, until Ctrl-C. Runs the
    /// scenario first only when --scenario is given.
    #[arg(long)]
    pub keep: bool,
    /// Where certificates, the kubeconfig and etcd's data and logs go (default: a new
    /// directory in the system temp dir, removed on exit unless something failed).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// quorumguard's probe interval.
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = quorumguard_cli::duration)]
    pub probe_interval: Duration,
    /// Run on a real kube-apiserver instead of the embedded stand-in: kube-apiserver and its
    /// etcd from KUBEBUILDER_ASSETS (setup-envtest's directory; the etcd from
    /// QUORUMGUARD_ETCD_BIN_DIR when that is set), started on loopback for the run. Needs
    /// --capi-crds.
    #[arg(long)]
    pub real_apiserver: bool,
    /// The kube-apiserver binary to run on (implies --real-apiserver); its storage etcd comes
    /// from QUORUMGUARD_ETCD_BIN_DIR, else KUBEBUILDER_ASSETS, else PATH.
    #[arg(long, value_name = "PATH")]
    pub kube_apiserver: Option<PathBuf>,
    /// The Cluster API CRDs to install on the real kube-apiserver: a directory with
    /// cluster-api v1.14's Cluster, Machine and KubeadmControlPlane CRD files (default: the
    /// directory in QUORUMGUARD_CAPI_CRDS).
    #[arg(long, value_name = "DIR")]
    pub capi_crds: Option<PathBuf>,
    /// quorumguard's logs on stderr (tracing EnvFilter syntax, e.g. "info"); off by default so
    /// the timeline stays readable.
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
}

pub fn run(args: &PlaygroundArgs) -> anyhow::Result<ExitCode> {
    if args.list {
        for s in SCENARIOS {
            let default = if s.name == DEFAULT_SCENARIO {
                " (default)"
            } else {
                ""
            };
            println!("{}{default}\n    {}", s.name, s.summary);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let name = args.scenario.as_deref().unwrap_or(DEFAULT_SCENARIO);
    let Some(scenario) = scenarios::find(name) else {
        let names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        anyhow::bail!(
            "no scenario named {name:?}: choose one of {} (see --list)",
            names.join(", ")
        );
    };
    let real_api = real_api_plan(args)?;
    let _logs = match &args.log {
        Some(filter) => {
            Some(telemetry::init_logging(LogFormat::Text, filter).context("setting up logging")?)
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let (dir, own_dir) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("quorumguard-playground-{}", std::process::id())),
            true,
        ),
    };
    let run_scenario = !args.keep || args.scenario.is_some();
    let result = runtime.block_on(async {
        let tl = Timeline::new(Sink::Stdout);
        if run_scenario {
            tl.plain(&format!(
                "quorumguard playground: {}\n  {}\n",
                scenario.name, scenario.summary
            ));
        } else {
            tl.plain("quorumguard playground: interactive (--keep)\n");
        }
        let options = scenario.options(WorldOptions {
            probe_interval: args.probe_interval,
            real_api,
            ..WorldOptions::new(dir.clone())
        });
        let world = tokio::select! {
            w = start(options, &tl) => Arc::new(w?),
            _ = quorumguard_cli::serve::terminated() => {
                tl.plain("interrupted while starting: stopping");
                return Ok(Outcome::Interrupted);
            }
        };
        // Set once the scenario (if any) is over: Ctrl-C then is how --keep ends.
        let keeping = AtomicBool::new(false);
        let outcome = tokio::select! {
            r = play(&world, &tl, scenario.name, run_scenario, args.keep, &keeping) => r,
            _ = quorumguard_cli::serve::terminated() => {
                if keeping.load(Ordering::SeqCst) {
                    tl.plain("\nstopping everything the playground started");
                    Ok(Outcome::Kept)
                } else {
                    tl.plain("\ninterrupted: stopping everything the playground started");
                    Ok(Outcome::Interrupted)
                }
            }
        };
        world.shutdown().await;
        outcome
    });
    // Blocking etcd work in flight (bounded) finishes before the runtime goes.
    runtime.shutdown_timeout(Duration::from_secs(25));
    let outcome = result?;
    let failed = matches!(outcome, Outcome::Failed);
    if own_dir && !failed {
        let _ = std::fs::remove_dir_all(&dir);
    } else if failed {
        println!("etcd logs and certificates are kept in {}", dir.display());
    }
    Ok(match outcome {
        Outcome::Held | Outcome::Kept => ExitCode::SUCCESS,
        Outcome::Failed => ExitCode::from(1),
        Outcome::Interrupted => ExitCode::from(130),
    })
}

enum Outcome {
    /// Every expectation held.
    Held,
    Failed,
    /// `--keep` ended by Ctrl-C.
    Kept,
    Interrupted,
}

/// The real kube-apiserver to run on, when asked for: its binaries and the CRDs must be there
/// (an error says what is missing and how to get it, never a fallback to the stand-in).
fn real_api_plan(args: &PlaygroundArgs) -> anyhow::Result<Option<RealApiPlan>> {
    if !args.real_apiserver && args.kube_apiserver.is_none() {
        return Ok(None);
    }
    let assets =
        Assets::find(args.kube_apiserver.as_deref()).context("--real-apiserver cannot start")?;
    let from_env = || std::env::var_os(CRDS_VAR).filter(|d| !d.is_empty());
    let Some(crds) = args
        .capi_crds
        .clone()
        .or_else(|| from_env().map(PathBuf::from))
    else {
        anyhow::bail!(
            "--real-apiserver needs the Cluster API CRDs: pass --capi-crds DIR or set \
             {CRDS_VAR} to a directory holding {CRD_FILES}"
        );
    };
    crd_files(&crds).context("--real-apiserver cannot start")?;
    Ok(Some(RealApiPlan { assets, crds }))
}

async fn start(options: WorldOptions, tl: &Timeline) -> anyhow::Result<World> {
    let machines = options.members;
    let replicas = options.replicas.unwrap_or(machines);
    let progress = std::sync::Mutex::new(None);
    let world = World::start(options, |what| {
        let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
        // Drop the previous spinner first: one at a time.
        *p = None;
        tl.event("setup", what);
        *p = Some(tl.progress(what));
    })
    .await;
    drop(progress);
    let world = world.context("starting the playground")?;
    let (webhook, admin) = world
        .server_addrs()
        .context("quorumguard stopped right after starting")?;
    let endpoints = world.etcd_says().await.unwrap_or_else(|e| e.to_string());
    if world.api.stand_in().is_none() {
        tl.event(
            "setup",
            &format!(
                "ready: etcd {endpoints}\nkube-apiserver {} (real, started for this run) holds Cluster {NAMESPACE}/{CLUSTER}, KubeadmControlPlane {KCP} ({replicas} replicas) and {machines} Machines\nquorumguard webhook https://{webhook} (registered from manifests/core/validatingwebhookconfiguration.yaml; kube-apiserver calls it through a recording relay), metrics http://{admin}/metrics",
                world.api.url()
            ),
        );
        return Ok(world);
    }
    tl.event(
        "setup",
        &format!(
            "ready: etcd {endpoints}\nAPI-server stand-in {} holds Cluster {NAMESPACE}/{CLUSTER}, KubeadmControlPlane {KCP} ({replicas} replicas) and {machines} Machines\nquorumguard webhook https://{webhook} (called by the stand-in from manifests/core/validatingwebhookconfiguration.yaml), metrics http://{admin}/metrics",
            world.api.url()
        ),
    );
    Ok(world)
}

async fn play(
    world: &Arc<World>,
    tl: &Timeline,
    scenario: &str,
    run_scenario: bool,
    keep: bool,
    keeping: &AtomicBool,
) -> anyhow::Result<Outcome> {
    if run_scenario {
        scenarios::run(Arc::clone(world), tl, scenario).await?;
        let checks = tl.checks();
        let held = checks.iter().filter(|c| c.ok).count();
        tl.plain("");
        tl.plain(&format!(
            "{scenario}: {held} of {} expectations held in {:.1}s",
            checks.len(),
            tl.elapsed().as_secs_f64()
        ));
        for c in checks.iter().filter(|c| !c.ok) {
            tl.plain(&format!("  ✘ {} — saw: {}", c.what, c.detail));
        }
        if !keep {
            return Ok(if tl.all_held() {
                Outcome::Held
            } else {
                Outcome::Failed
            });
        }
    }
    keeping.store(true, Ordering::SeqCst);
    keep_running(world, tl).await?;
    Ok(Outcome::Kept)
}

/// `--keep`: prints what to try, then runs the simulated KCP controller and prints every
/// admission call and status change until Ctrl-C.
async fn keep_running(world: &Arc<World>, tl: &Timeline) -> anyhow::Result<()> {
    let kubeconfig = world.kubeconfig_path();
    let pids = world
        .etcd(|e| {
            (0..e.len())
                .filter_map(|i| Some((e.name(i)?.to_string(), e.pid(i)?)))
                .collect::<Vec<_>>()
        })
        .await?;
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "quorumguard".into());
    let mut text = format!(
        "\nThe playground keeps running until Ctrl-C. In another terminal:\n\n  export KUBECONFIG={}\n  kubectl get kcp,machines\n  kubectl describe kcp {KCP}\n  kubectl get kcp {KCP} -o jsonpath='{{.status.conditions}}'\n  kubectl delete machine <name>                     # judged by the webhook\n  kubectl delete machine <name> --dry-run=server    # ask without deleting\n  kubectl annotate machine <name> cluster.x-k8s.io/remediate-machine=\"\"   # the safe path\n  kubectl scale kcp {KCP} --replicas 5\n  {exe} status {CLUSTER}\n\nFreeze and resume an etcd member (SIGSTOP / SIGCONT):\n",
        kubeconfig.display()
    );
    for (name, pid) in &pids {
        text.push_str(&format!(
            "  kill -STOP {pid}   # freeze {name}      kill -CONT {pid}   # resume it\n"
        ));
    }
    if world.api.stand_in().is_none() {
        text.push_str(&format!(
            "\nThis is a real kube-apiserver ({}): the kubeconfig acts as its admin (system:masters), and\nkubectl shows its own tables, Events (kubectl get events) and CEL.\n",
            world.api.url()
        ));
    }
    text.push_str(
        "\nA simulated KCP controller acts on what you do: it finishes Machine deletions (removing their etcd member), remediates annotated Machines and scales to spec.replicas, each deletion judged by the webhook.\n",
    );
    tl.plain(&text);

    let mut calls = world.webhooks.subscribe();
    let printer = {
        let tl = tl.clone();
        tokio::spawn(async move {
            loop {
                match calls.recv().await {
                    Ok(call) => scenarios::print_call(&tl, &call),
                    Err(RecvError::Lagged(n)) => {
                        tl.event(
                            "admission",
                            &format!("({n} calls not shown: output fell behind)"),
                        );
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        })
    };
    let watcher = scenarios::watch(Arc::clone(world), tl.clone());
    let mut kcp = KcpController::new(Arc::clone(world), tl.clone(), Style::Current);
    // The printer above shows every webhook call, the controller's too.
    kcp.print_calls = false;
    let mut last = String::new();
    // Until Ctrl-C (the caller's select ends this future); one step a second at most.
    loop {
        match kcp.step().await {
            Ok(Step::Acted(what)) => tl.event("kcp", &what),
            Ok(Step::Blocked(why)) if why != last => {
                tl.event("kcp", &format!("waiting: {why}"));
                last = why;
            }
            Ok(_) => {}
            Err(e) => tl.event("kcp", &format!("error: {e}")),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        if printer.is_finished() {
            watcher.abort();
            anyhow::bail!("the admission printer stopped");
        }
    }
}
