//! Logs: the process-wide subscriber writing to stderr, as text or JSON ([`init_logging`]).

use std::io::IsTerminal;

/// How logs are written: text for people at a terminal, JSON for log pipelines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured when stderr is a terminal).
    #[default]
    Text,
    /// One JSON object per line, event fields at the top level and the current span's fields
    /// (admission uid, kind, name, …) under `span`.
    Json,
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter does not parse (see `tracing_subscriber::EnvFilter` for the syntax).
    #[error("invalid log filter {filter:?}: {source}")]
    InvalidFilter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global tracing subscriber is already installed (logging initialised twice).
    #[error("cannot install the log subscriber: {0}")]
    AlreadyInitialized(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

/// Installs the process-wide log subscriber, writing to stderr (stdout stays free for command
/// output such as `quorumguard check`'s report). `filter` uses `EnvFilter` syntax, for example
/// `info` or `info,quorumguard=debug`; call this once, early in `main`.
pub fn init_logging(format: LogFormat, filter: &str) -> Result<(), TelemetryError> {
    let env_filter = tracing_subscriber::EnvFilter::try_new(filter).map_err(|source| {
        TelemetryError::InvalidFilter {
            filter: filter.to_owned(),
            source,
        }
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    installed.map_err(TelemetryError::AlreadyInitialized)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_log_filter_is_reported() {
        let err = init_logging(LogFormat::Json, "info,=[[").unwrap_err();
        assert!(matches!(err, TelemetryError::InvalidFilter { .. }), "{err}");
    }
}
