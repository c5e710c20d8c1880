//! The telemetry crate's one error type.

/// What can go wrong while setting up tracing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// A setting (from the config or an `OTEL_*` variable) has a value this
    /// crate does not accept.
    #[error("telemetry setting `{setting}` has the value `{value}`, which is not supported: {why}")]
    Invalid {
        /// The setting or environment variable.
        setting: String,
        /// Its value.
        value: String,
        /// What is accepted instead.
        why: String,
    },
    /// gRPC export was asked for, but this build has no gRPC client.
    #[error(
        "OTLP over gRPC was asked for, but this build lacks the `grpc` feature of wma-telemetry; use http/protobuf (port 4318) or rebuild with the feature"
    )]
    GrpcNotBuilt,
    /// The OTLP exporter could not be built.
    #[error("could not build the OTLP exporter: {0}")]
    Exporter(String),
    /// Spans could not be sent (the collector is down or refused them).
    #[error("could not export spans: {0}")]
    Export(String),
    /// The trace file cannot be opened for appending.
    #[error("cannot write the trace file {}: {why}", path.display())]
    TraceFile {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said.
        why: String,
    },
    /// A trace file cannot be read, or a line of it is not an OTLP JSON
    /// export request.
    #[error("cannot read the trace file {}: {why}", path.display())]
    ReadTraceFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong, with the line number where one line is at fault.
        why: String,
    },
    /// A log or trace filter does not parse.
    #[error("the filter `{filter}` does not parse: {why}")]
    Filter {
        /// The filter text.
        filter: String,
        /// The parser's complaint.
        why: String,
    },
    /// Another global subscriber was installed first.
    #[error("a global tracing subscriber is installed already")]
    AlreadyInstalled,
}
