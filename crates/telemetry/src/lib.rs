//! Tracing for webmcp-agents: a `tracing` subscriber that prints to stderr
//! and, when asked, exports spans over OpenTelemetry OTLP (gRPC or
//! http/protobuf) to a collector such as Jaeger or Phoenix, writes them to
//! a trace file as OTLP JSON lines, or both. [`read_trace_file`] reads such
//! a file back, and a [`Trace`] prints as an indented tree.
//!
//! Libraries of this workspace depend on `tracing` only and never install a
//! subscriber; binaries, examples and tests call [`init`] (or [`build`]) here.
//! Export is off by default and then costs nothing: no OpenTelemetry layer
//! is built. It is switched on by [`TelemetryConfig::enabled`] or by the
//! standard `OTEL_*` variables ([`TelemetryConfig::resolve`] lists them),
//! and the file by [`TelemetryConfig::file`].
//!
//! The spans themselves come from the loop and follow the OpenTelemetry
//! GenAI conventions: `invoke_agent {agent}` per run, `step {n}` per loop
//! step, `chat {model}` per generation (token usage, time to first token,
//! finish reasons) and `execute_tool {tool}` per call; a span with
//! `error.type` is exported with an error status. `docs/tracing.md` shows
//! how to look at a run in Jaeger.
//!
//! ```
//! use wma_telemetry::{TelemetryConfig, build};
//! // Off unless configured: no exporter, nothing to flush.
//! let settings = TelemetryConfig::default().resolve(|_| None).unwrap();
//! let (dispatch, guard) = build(&settings).unwrap();
//! assert!(!guard.is_exporting());
//! tracing::dispatcher::with_default(&dispatch, || tracing::info!("not exported"));
//! ```

mod config;
mod error;
mod file;
mod setup;
mod tree;

pub use config::{
    DEFAULT_LOG_FILTER, DEFAULT_SERVICE_NAME, DEFAULT_TRACE_FILTER, OtlpExport, OtlpProtocol,
    Settings, TRACE_ID_PLACEHOLDER, TelemetryConfig,
};
pub use error::TelemetryError;
pub use setup::{PROJECT_NAME_ATTRIBUTE, TelemetryGuard, build, init, trace_id};
pub use tree::{RecordedEvent, RecordedSpan, Trace, parse_traces, read_trace_file};
