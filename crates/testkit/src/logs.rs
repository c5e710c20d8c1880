//! What code under test logs, captured as text for assertions on its
//! warnings' wording.

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::{DefaultGuard, Interest};
use tracing::{Dispatch, Event, Metadata, Subscriber};

/// The log lines written while a [`capture_logs`] guard is held on this
/// thread, formatted as `tracing_subscriber::fmt` writes them (no colours).
#[derive(Clone, Default)]
pub struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    /// Everything logged so far.
    pub fn text(&self) -> String {
        let bytes = self.0.lock();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures this thread's logs until the guard is dropped. Tasks see it only
/// when they run on this thread: use a `current_thread` test runtime.
pub fn capture_logs() -> (CapturedLogs, DefaultGuard) {
    // Registered, once per process, before the first capture's own.
    keep_interest_per_thread();
    let logs = CapturedLogs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

/// Makes every callsite ask the current thread's subscriber each time.
///
/// `tracing` caches whether a span or event is wanted per callsite, for
/// the whole process, when the callsite is first hit. While a single
/// subscriber is registered (a test's capture, with no global default, as
/// in a test binary), that cache is filled from the default of whichever
/// thread hits the callsite first: another test running on a thread
/// without a capture has none, the callsite is cached "never", and the
/// capturing test's spans there are disabled from then on (an event with
/// `parent: span` is logged without the span). A second subscriber,
/// registered for the life of the process and answering "sometimes" for
/// every callsite, keeps `tracing` off that shortcut and caches nothing
/// as "always" or "never": each span or event asks the subscriber of the
/// thread it is on.
fn keep_interest_per_thread() {
    static KEEPER: OnceLock<Dispatch> = OnceLock::new();
    KEEPER.get_or_init(|| Dispatch::new(PerThread));
}

/// The subscriber [`keep_interest_per_thread`] registers: no thread has it
/// as its default, so it never records anything.
struct PerThread;

impl Subscriber for PerThread {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        false
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::OFF)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::capture_logs;

    fn call_span() -> tracing::Span {
        tracing::info_span!("execute_tool")
    }

    #[test]
    fn a_span_first_hit_on_a_thread_without_a_capture_is_still_captured_here() {
        let (logs, _capturing) = capture_logs();
        // Another test's thread, logging nowhere, reaches the callsite first.
        std::thread::spawn(|| drop(call_span())).join().unwrap();
        let span = call_span();
        assert!(!span.is_disabled());
        tracing::info!(parent: &span, "call-recorded");
        let text = logs.text();
        assert!(
            text.contains("execute_tool") && text.contains("call-recorded"),
            "{text}"
        );
    }
}
