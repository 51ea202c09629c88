use std::process::ExitCode;

use clap::Parser;
use quorumguard::cli::{self, Cli, EXIT_BAD_INPUT};

fn main() -> ExitCode {
    let parsed = Cli::parse();
    match cli::run(parsed) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("quorumguard: error: {e:#}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}
