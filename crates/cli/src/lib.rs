//! The production commands of `quorumguard` (`check`, `status`, `preflight`, `serve`, `certs`): their
//! arguments and dispatch. Each subcommand lives in its own module and returns the process exit
//! code. The binary (the `quorumguard` package's `src/cli.rs`) puts these beside `playground`,
//! which lives in the playground crate, and parses the command line.
//!
//! [`server`] is `serve` as a library: the HTTPS and admin listeners, the status writer and the
//! certificate reload, put together. This crate sits on top of every other crate of the guard
//! (engine, pki, telemetry, observe, admission, status); only the binary and the playground
//! depend on it, and it never depends on the playground (tests/it/architecture.rs).

pub mod certs;
pub mod check;
pub mod preflight;
pub mod serve;
pub mod server;
pub mod status;

use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;

/// Exit code for bad input (unreadable or unparseable files, unknown names): the same code
/// clap uses for usage errors, so scripts see one "your input is wrong" code.
pub const EXIT_BAD_INPUT: u8 = 2;

/// An error as the command line prints it: its message, then each cause whose text the message
/// does not already hold, joined with ": ". anyhow's `{:#}` prints every cause again, and an
/// error that says its cause in its own message and also returns it as its `source()` (thiserror's
/// `"...: {source}"`, as kube's errors and many of ours are written) would say it twice or three
/// times.
pub fn error_text(e: &anyhow::Error) -> String {
    quorumguard_observe::etcd::channel::chain(e.as_ref())
}

/// The present as Unix seconds, from the clock: what the rules judge grace periods against.
pub fn now_unix() -> anyhow::Result<i64> {
    use anyhow::Context;
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .context("the system clock is before 1970")
}

/// Runs `work` on a small runtime of its own, and does not wait for what it leaves behind when
/// done: etcd clients may keep background tasks on a frozen member's connection.
pub fn block_on<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    use anyhow::Context;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(work);
    runtime.shutdown_background();
    result
}

/// Prints a command's report as every command does: its input warnings on stderr as
/// `quorumguard: warning: ...`, then `text()` or the report as JSON on stdout. (A selection of no
/// control plane is an error before it comes to this.)
pub fn print_report(
    format: check::Format,
    warnings: &[String],
    text: impl FnOnce() -> String,
    report: &impl serde::Serialize,
) -> anyhow::Result<()> {
    use anyhow::Context;
    for w in warnings {
        eprintln!("quorumguard: warning: {w}");
    }
    match format {
        check::Format::Text => print!("{}", text()),
        check::Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(report).context("cannot render the report as JSON")?
        ),
    }
    Ok(())
}

/// Parses a duration flag (`500ms`, `2s`, `10m`) for every subcommand alike.
pub fn duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 2s, 10m)"))
}

/// How long the next action waits for a join and for a learner before it names what leads out
/// (`serve`, `status` and `check` alike, so that they advise alike).
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct GraceArgs {
    /// How long a new Machine may have no etcd member (and an added member may stay unstarted)
    /// before it counts as failed.
    #[arg(long, env = "QUORUMGUARD_JOIN_GRACE", default_value = "10m", value_parser = duration)]
    pub join_grace: std::time::Duration,
    /// How long after its Machine was created an etcd learner may stay a learner before it
    /// counts as stalled (then it is promoted by hand, or its Machine is replaced).
    #[arg(long, env = "QUORUMGUARD_LEARNER_GRACE", default_value = "15m", value_parser = duration)]
    pub learner_grace: std::time::Duration,
}

impl GraceArgs {
    /// The rules' default policy with these grace periods.
    pub fn policy(&self) -> quorumguard_engine::Policy {
        quorumguard_engine::Policy {
            join_grace: self.join_grace,
            learner_grace: self.learner_grace,
            ..quorumguard_engine::Policy::default()
        }
    }
}

/// The file name kubectl looks for to run `kubectl quorumguard ...` (its plugin convention:
/// `kubectl-<name>` on PATH).
pub const KUBECTL_PLUGIN_FILE: &str = "kubectl-quorumguard";

/// The production subcommands. `display_order` keeps `--help` listing them, with the binary's
/// `playground` (order 5), in the order the README teaches them.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Judge a control plane from kubectl and etcdctl dumps: members, quorum, the next safe
    /// action, and whether the given what-ifs would be allowed.
    #[command(display_order = 1)]
    Check(check::CheckArgs),
    /// Probe control planes live from the management cluster: etcd members, quorum and the
    /// next safe action (also `kubectl quorumguard status` as a kubectl plugin).
    #[command(display_order = 2)]
    Status(status::StatusArgs),
    /// Predict, before an upgrade wave, which control planes' rollouts would finish, which would
    /// stick (at which step, and why) and which would lose quorum on one more failure; live, or
    /// offline from `check`'s dumps (also `kubectl quorumguard preflight`).
    #[command(display_order = 3)]
    Preflight(Box<preflight::PreflightArgs>),
    /// Serve the validating admission webhook (HTTPS) and the admin endpoints.
    // Boxed: its many flags make it several times larger than the other variants.
    #[command(display_order = 4)]
    Serve(Box<serve::ServeArgs>),
    /// Generate a CA and a serving certificate for the webhook, for clusters without
    /// cert-manager, and print or patch the caBundle.
    #[command(display_order = 6)]
    Certs(certs::CertsArgs),
}

/// The command name usage and help show, from `argv[0]`: `kubectl quorumguard` when run as the
/// kubectl plugin (kubectl executes `kubectl-quorumguard` with that path as `argv[0]`), so the
/// usage a user reads is the one they typed; `None` otherwise (clap's default, the file name).
pub fn bin_name(argv0: Option<&OsStr>) -> Option<&'static str> {
    let stem = Path::new(argv0?).file_stem()?;
    (stem == KUBECTL_PLUGIN_FILE).then_some("kubectl quorumguard")
}

/// Runs a parsed production command. Errors are bad input (exit 2); the caller prints them.
pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Check(args) => check::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Preflight(args) => preflight::run(&args),
        Command::Serve(args) => serve::run(*args),
        Command::Certs(args) => certs::run(&args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_plugin_name_from_argv0() {
        for argv0 in [
            "kubectl-quorumguard",
            "/usr/local/bin/kubectl-quorumguard",
            "./kubectl-quorumguard.exe",
        ] {
            assert_eq!(
                bin_name(Some(OsStr::new(argv0))),
                Some("kubectl quorumguard"),
                "{argv0}"
            );
        }
        for argv0 in ["quorumguard", "/usr/bin/quorumguard", "kubectl", ""] {
            assert_eq!(bin_name(Some(OsStr::new(argv0))), None, "{argv0}");
        }
        assert_eq!(bin_name(None), None);
    }
}
