//! The `quorumguard` command line: argument parsing and dispatch. Each subcommand lives in its
//! own module and returns the process exit code, so `main` only maps errors.

pub mod certs;
pub mod check;
pub mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for bad input (unreadable or unparseable files, unknown names): the same code
/// clap uses for usage errors, so scripts see one "your input is wrong" code.
pub const EXIT_BAD_INPUT: u8 = 2;

/// quorumguard keeps etcd quorum safe on Cluster API KubeadmControlPlane clusters.
#[derive(Debug, Parser)]
#[command(name = "quorumguard", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Judge a control plane from kubectl and etcdctl dumps: members, quorum, the next safe
    /// action, and whether the given what-ifs would be allowed.
    Check(check::CheckArgs),
    /// Serve the validating admission webhook (HTTPS) and the admin endpoints.
    Serve(serve::ServeArgs),
    /// Generate a CA and a serving certificate for the webhook, for clusters without
    /// cert-manager, and print or patch the caBundle.
    Certs(certs::CertsArgs),
}

/// Runs the parsed command. Errors are bad input (exit 2); the caller prints them.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Check(args) => check::run(&args),
        Command::Serve(args) => serve::run(args),
        Command::Certs(args) => certs::run(&args),
    }
}
