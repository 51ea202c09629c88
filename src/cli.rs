//! The `quorumguard` command line: the production commands of `quorumguard-cli`
//! ([`quorumguard_cli`]) and, with the default `playground` feature, `playground` from
//! `quorumguard-playground`. Argument parsing and dispatch only; `main` maps errors.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub use quorumguard_cli::*;

/// quorumguard keeps etcd quorum safe on Cluster API KubeadmControlPlane clusters.
#[derive(Debug, Parser)]
#[command(name = "quorumguard", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    #[command(flatten)]
    Guard(quorumguard_cli::Command),
    /// Replay a story on a local playground (real etcd, the webhook, the status publisher, an
    /// API-server stand-in; no Kubernetes cluster needed), or keep it running for kubectl.
    #[cfg(feature = "playground")]
    #[command(display_order = 5)]
    Playground(quorumguard_playground::cli::PlaygroundArgs),
}

/// Parses the process's arguments (exits on usage errors and `--help`, as clap does), with the
/// command name from [`bin_name`].
pub fn parse() -> Cli {
    let mut command = Cli::command();
    if let Some(name) = bin_name(std::env::args_os().next().as_deref()) {
        command = command.bin_name(name);
    }
    let matches = command.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Runs the parsed command. Errors are bad input (exit 2); the caller prints them.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Guard(command) => quorumguard_cli::run(command),
        #[cfg(feature = "playground")]
        Command::Playground(args) => quorumguard_playground::cli::run(&args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
