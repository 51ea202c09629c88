//! Everything the process logs while a test captures it, as JSON lines at TRACE for every crate:
//! one global subscriber, because the server's tasks run on the runtime's worker threads, which a
//! thread-local subscriber would not see.
//!
//! The tests of one binary run at once, so the capture is on while any test holds a
//! [`Capturing`] and off otherwise (then an event costs the other tests one atomic load). While
//! it is on it holds what every running test logs: a test looks for lines only it can have
//! caused (its own paths, names, keys), and a "never logged" check covers them all.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

/// How many tests capture now.
static CAPTURING: AtomicUsize = AtomicUsize::new(0);

/// The capture buffer; the first call installs the subscriber.
fn buffer() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let layer = fmt::layer()
            .json()
            .with_writer(move || Capture(sink.clone()))
            .with_filter(filter_fn(|_| CAPTURING.load(Ordering::Relaxed) > 0));
        let _ = tracing_subscriber::registry().with(layer).try_init();
        buffer
    })
    .clone()
}

/// The capture is on while this lives (see the module's doc).
#[must_use = "the capture stops when this is dropped"]
pub struct Capturing(());

impl Drop for Capturing {
    fn drop(&mut self) {
        CAPTURING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Starts capturing everything logged, until the returned value is dropped.
pub fn capture() -> Capturing {
    let _ = buffer();
    CAPTURING.fetch_add(1, Ordering::Relaxed);
    Capturing(())
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything captured so far.
pub fn logged() -> String {
    String::from_utf8_lossy(&buffer().lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}
