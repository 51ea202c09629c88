//! Everything a test binary logs, captured as JSON lines at TRACE for every crate: one global
//! subscriber, because the server's tasks run on the runtime's worker threads, which a
//! thread-local subscriber would not see.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

/// The capture buffer; the first call installs the subscriber.
pub fn logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let _ = tracing_subscriber::fmt()
            .json()
            .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
            .with_writer(move || Capture(sink.clone()))
            .try_init();
        buffer
    })
    .clone()
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

/// Everything logged so far.
pub fn logged() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}
