//! The playground's timeline: every step, what etcd says, each admission verdict and each
//! published condition, stamped with the time since the start, and the expectations checked
//! along the way.
//!
//! Lines are written whole (one lock per line) so that the status watcher and the scenario can
//! both print; a progress spinner (TTY only) is cleared before any line is printed.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where the timeline goes.
pub enum Sink {
    /// Standard output; a spinner shows progress when it is a terminal.
    Stdout,
    /// Kept in memory only (tests read [`Timeline::text`]).
    Memory,
}

/// One expectation and whether it held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub what: String,
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

struct Inner {
    sink: Sink,
    tty: bool,
    /// Everything printed, line by line.
    lines: Vec<String>,
    checks: Vec<Check>,
    /// The spinner's text while one runs.
    spinning: Option<String>,
    /// The last text [`Timeline::event_if_changed`] printed, per kind.
    last: Vec<(String, String)>,
}

/// A shared timeline.
#[derive(Clone)]
pub struct Timeline {
    start: Instant,
    inner: Arc<Mutex<Inner>>,
}

/// Width of the kind column (`etcd`, `admission`, `status`, ...).
const KIND_WIDTH: usize = 9;
/// Lines are wrapped at this many characters.
const WIDTH: usize = 110;

impl Timeline {
    pub fn new(sink: Sink) -> Self {
        let tty = matches!(sink, Sink::Stdout) && std::io::stdout().is_terminal();
        Timeline {
            start: Instant::now(),
            inner: Arc::new(Mutex::new(Inner {
                sink,
                tty,
                lines: Vec::new(),
                checks: Vec::new(),
                spinning: None,
                last: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Time since the timeline started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Prints raw lines (headers, summaries), no time stamp.
    pub fn plain(&self, text: &str) {
        let mut inner = self.lock();
        for line in text.lines() {
            emit(&mut inner, line.to_string());
        }
        if text.is_empty() {
            emit(&mut inner, String::new());
        }
    }

    /// One event: `[  12.3s] kind      text`, wrapped, continuation lines indented.
    pub fn event(&self, kind: &str, text: &str) {
        let stamp = format!(
            "[{:>6.1}s] {kind:<KIND_WIDTH$} ",
            self.elapsed().as_secs_f64()
        );
        let indent = " ".repeat(stamp.chars().count());
        let mut inner = self.lock();
        let mut first = true;
        for para in text.lines() {
            for piece in wrap(para, WIDTH.saturating_sub(indent.len()).max(40)) {
                let line = if first {
                    format!("{stamp}{piece}")
                } else {
                    format!("{indent}{piece}")
                };
                first = false;
                emit(&mut inner, line);
            }
        }
    }

    /// [`Timeline::event`], unless the last text printed this way for `kind` was the same: for
    /// several watchers of one thing, whichever sees a change first prints it, once.
    pub fn event_if_changed(&self, kind: &str, text: &str) {
        {
            let mut inner = self.lock();
            match inner.last.iter_mut().find(|(k, _)| k == kind) {
                Some((_, last)) if last == text => return,
                Some((_, last)) => *last = text.to_string(),
                None => inner.last.push((kind.to_string(), text.to_string())),
            }
        }
        self.event(kind, text);
    }

    /// Records an expectation and prints it (`✔` or `✘`).
    pub fn check(&self, what: impl Into<String>, ok: bool, detail: impl Into<String>) -> bool {
        let check = Check {
            what: what.into(),
            ok,
            detail: detail.into(),
        };
        let text = if check.ok {
            format!("✔ {}", check.what)
        } else {
            format!("✘ {} — saw: {}", check.what, check.detail)
        };
        self.event("expect", &text);
        self.lock().checks.push(check);
        ok
    }

    pub fn checks(&self) -> Vec<Check> {
        self.lock().checks.clone()
    }

    /// Whether every expectation so far held (and there was at least one).
    pub fn all_held(&self) -> bool {
        let inner = self.lock();
        !inner.checks.is_empty() && inner.checks.iter().all(|c| c.ok)
    }

    /// Everything printed so far.
    pub fn text(&self) -> String {
        let mut out = self.lock().lines.join("\n");
        out.push('\n');
        out
    }

    /// Shows `what` with a spinner and the time waited (on a terminal only) until the returned
    /// guard is dropped. Must be called within a tokio runtime.
    pub fn progress(&self, what: &str) -> Progress {
        let tty = self.lock().tty;
        if !tty {
            return Progress { task: None };
        }
        self.lock().spinning = Some(what.to_string());
        let me = self.clone();
        let what = what.to_string();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
            // Bounded: the guard aborts the task, and it gives up on its own after 10 minutes.
            for i in 0..6000usize {
                {
                    let inner = me.lock();
                    if inner.spinning.is_none() {
                        break;
                    }
                    let frame = FRAMES[i % FRAMES.len()];
                    let mut out = std::io::stdout().lock();
                    let _ = write!(
                        out,
                        "\r\x1b[2K{frame} {what} ({:.1}s)",
                        started.elapsed().as_secs_f64()
                    );
                    let _ = out.flush();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Progress {
            task: Some((task, self.clone())),
        }
    }
}

/// A running spinner; dropping it clears the line.
pub struct Progress {
    task: Option<(tokio::task::JoinHandle<()>, Timeline)>,
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some((task, timeline)) = self.task.take() {
            task.abort();
            let mut inner = timeline.lock();
            if inner.spinning.take().is_some() {
                let mut out = std::io::stdout().lock();
                let _ = write!(out, "\r\x1b[2K");
                let _ = out.flush();
            }
        }
    }
}

fn emit(inner: &mut Inner, line: String) {
    if let Sink::Stdout = inner.sink {
        let mut out = std::io::stdout().lock();
        if inner.spinning.is_some() {
            let _ = write!(out, "\r\x1b[2K");
        }
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
    inner.lines.push(line);
}

/// Splits `text` into pieces of at most `width` characters at spaces (a longer word stays
/// whole).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let len = line.chars().count();
        if len > 0 && len + 1 + word.chars().count() > width {
            out.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push(line);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_spaces_and_keeps_long_words() {
        assert_eq!(wrap("a bb ccc dddd", 6), vec!["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("abcdefghij xy", 4), vec!["abcdefghij", "xy"]);
        assert_eq!(wrap("", 10), vec![""]);
    }

    #[test]
    fn records_lines_and_checks() {
        let t = Timeline::new(Sink::Memory);
        assert!(!t.all_held(), "no expectation yet is not success");
        t.event("etcd", "3 members");
        assert!(t.check("three members", true, "3"));
        assert!(t.all_held());
        assert!(!t.check("a leader", false, "none"));
        assert!(!t.all_held());
        let text = t.text();
        assert!(text.contains("etcd      3 members"), "{text}");
        assert!(text.contains("✔ three members"), "{text}");
        assert!(text.contains("✘ a leader — saw: none"), "{text}");
        assert_eq!(t.checks().len(), 2);
        t.event_if_changed("status", "A");
        t.event_if_changed("status", "A");
        t.event_if_changed("other", "A");
        t.event_if_changed("status", "B");
        t.event_if_changed("status", "A");
        let shown: Vec<String> = t
            .text()
            .lines()
            .filter(|l| l.ends_with(" A") || l.ends_with(" B"))
            .map(str::to_string)
            .collect();
        assert_eq!(shown.len(), 4, "{shown:?}");
    }
}
