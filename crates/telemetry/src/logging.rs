//! Logs: the process-wide subscriber writing to stderr, as text or JSON ([`init_logging`]).
//!
//! Lines are formatted on the thread that logs and written by a thread of their own
//! (tracing-appender's non-blocking writer), through a buffer flushed whenever no line is
//! waiting: a webhook answering thousands of reviews a second writes its per-review lines in a
//! few large writes instead of one `write(2)` each on the request's thread. Nothing is dropped:
//! when [`LINES_WAITING`] lines are waiting (stderr blocked), logging waits, as a direct write
//! would.

use std::io::{BufWriter, IsTerminal};

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

/// How many formatted lines may wait for the writer thread. The queue is a ring allocated whole
/// (tracing-appender's default of 128,000 lines is 4 MiB, all of it resident once that many
/// lines have passed); 8,192 lines are about half a second of a webhook under full load.
pub const LINES_WAITING: usize = 8_192;

/// Keeps the log writer running: dropping it writes out every line logged so far. Hold it until
/// the program ends.
#[derive(Debug)]
#[must_use = "dropping the guard stops the log writer; hold it until the program ends"]
pub struct LogGuard {
    _worker: tracing_appender::non_blocking::WorkerGuard,
}

/// Installs the process-wide log subscriber, writing to stderr (stdout stays free for command
/// output such as `quorumguard check`'s report). `filter` uses `EnvFilter` syntax, for example
/// `info` or `info,quorumguard=debug`; call this once, early in `main`, and hold the guard.
pub fn init_logging(format: LogFormat, filter: &str) -> Result<LogGuard, TelemetryError> {
    let ansi = std::io::stderr().is_terminal();
    install(format, filter, std::io::stderr(), ansi)
}

/// [`init_logging`] writing to `out` instead of stderr (benchmarks write to `/dev/null`, with
/// the same writer thread and buffer); text without colours.
pub fn init_logging_to<W: std::io::Write + Send + 'static>(
    format: LogFormat,
    filter: &str,
    out: W,
) -> Result<LogGuard, TelemetryError> {
    install(format, filter, out, false)
}

/// The subscriber, writing to `out` through the writer thread; `ansi`: colour text lines.
fn install<W: std::io::Write + Send + 'static>(
    format: LogFormat,
    filter: &str,
    out: W,
    ansi: bool,
) -> Result<LogGuard, TelemetryError> {
    let env_filter = tracing_subscriber::EnvFilter::try_new(filter).map_err(|source| {
        TelemetryError::InvalidFilter {
            filter: filter.to_owned(),
            source,
        }
    })?;
    // The writer thread flushes the buffer each time it has written every waiting line.
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(LINES_WAITING)
        .thread_name("quorumguard-log")
        .finish(BufWriter::with_capacity(64 * 1024, out));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(writer);
    let installed = match format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    installed.map_err(TelemetryError::AlreadyInitialized)?;
    Ok(LogGuard { _worker: guard })
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
