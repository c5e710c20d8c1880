//! What code under test logs, captured as text for assertions on its
//! warnings' wording.

use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// The log lines written while a [`capture_logs`] guard is held on this
/// thread, formatted as `tracing_subscriber::fmt` writes them (no colours).
#[derive(Clone, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this thread's logs until the guard is dropped. Tasks see it only
/// when they run on this thread: use a `current_thread` test runtime.
pub fn capture_logs() -> (CapturedLogs, DefaultGuard) {
    let logs = CapturedLogs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}
