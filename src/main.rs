//! The `quorumguard` binary: parses the command line ([`quorumguard::cli`]) and maps what the
//! command returns to an exit status. Nothing else lives here.

use std::process::ExitCode;

use quorumguard::cli::{self, EXIT_BAD_INPUT};

fn main() -> ExitCode {
    // `cli::parse` rather than `Cli::parse`: as `kubectl-quorumguard`, usage says `kubectl quorumguard`.
    let parsed = cli::parse();
    match cli::run(parsed) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("quorumguard: error: {}", cli::error_text(&e));
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}
