//! Building the subscriber: a stderr log layer, and the OpenTelemetry layer
//! with its OTLP exporter when export is on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, SdkTracerProvider, Span, SpanData, SpanProcessor,
};
use tracing::Dispatch;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, Registry};

use crate::config::{OtlpExport, OtlpProtocol, Settings, TelemetryConfig};
use crate::error::TelemetryError;
use crate::file::FileExporter;

/// Keeps the exporter alive. Dropping it flushes what is buffered and shuts
/// the exporter down, so keep it until the program ends.
#[must_use = "dropping the guard shuts the exporter down"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
    /// gRPC's client needs a Tokio runtime of its own: the SDK exports from
    /// its own thread, whatever runtime (if any) the program uses.
    #[cfg(feature = "grpc")]
    runtime: Option<tokio::runtime::Runtime>,
    export: Option<OtlpExport>,
    file: Option<PathBuf>,
}

impl TelemetryGuard {
    /// Where spans go over OTLP, or `None` when export to a collector is off.
    pub fn export(&self) -> Option<&OtlpExport> {
        self.export.as_ref()
    }

    /// The trace file spans are written to, or `None`.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Whether spans go anywhere: to a collector, a trace file or both.
    pub fn is_exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Sends every finished span now, blocking until the exporter answered.
    /// Call it from a blocking context (not on a single-threaded runtime
    /// whose thread the receiving end needs).
    pub fn flush(&self) -> Result<(), TelemetryError> {
        match &self.provider {
            Some(provider) => provider
                .force_flush()
                .map_err(|e| TelemetryError::Export(e.to_string())),
            None => Ok(()),
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // Shutdown flushes; a collector that is down must not hold the
            // program's exit for long.
            let _ = provider.shutdown_with_timeout(Duration::from_secs(5));
        }
        #[cfg(feature = "grpc")]
        if let Some(runtime) = self.runtime.take() {
            // Dropping a runtime blocks, which panics inside async code.
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for TelemetryGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryGuard")
            .field("export", &self.export)
            .field("file", &self.file)
            .finish_non_exhaustive()
    }
}

/// Resolves `config` against the process environment, builds the
/// subscriber and installs it as the global default. Binaries and
/// examples call this once, early, and keep the guard.
pub fn init(config: &TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    let settings = config.resolve_from_env()?;
    let (dispatch, guard) = build(&settings)?;
    tracing::dispatcher::set_global_default(dispatch)
        .map_err(|_| TelemetryError::AlreadyInstalled)?;
    Ok(guard)
}

/// Builds the subscriber for `settings` without installing it (tests and
/// benchmarks scope it with `tracing::dispatcher::with_default`).
///
/// With neither a collector nor a trace file there is no OpenTelemetry
/// layer at all, and spans below the log filter's level are disabled where
/// they are declared: tracing off costs one cached interest check per span.
/// A trace file that cannot be opened for appending is an error here, before
/// any work is traced.
pub fn build(settings: &Settings) -> Result<(Dispatch, TelemetryGuard), TelemetryError> {
    let log_filter = parse_filter(&settings.log_filter)?;
    if !settings.is_tracing() {
        // One global filter: what it rejects is disabled where it is declared,
        // so an info span costs one cached check and is never built.
        let log = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        let dispatch = Dispatch::new(Registry::default().with(log_filter).with(log));
        return Ok((
            dispatch,
            TelemetryGuard {
                provider: None,
                #[cfg(feature = "grpc")]
                runtime: None,
                export: None,
                file: None,
            },
        ));
    }
    // Two filters, one per layer: the log keeps its own level while the
    // exporter gets the info-level GenAI spans.
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(log_filter);
    let trace_filter = parse_filter(&settings.trace_filter)?;
    let mut provider = SdkTracerProvider::builder().with_resource(resource(settings));
    // The file first: it is the one setting that can fail on a person's
    // typo, and nothing else has started yet.
    if let Some(path) = &settings.file {
        let exporter = WarnOnce {
            inner: FileExporter::open(path)?,
            failure: format!("traces could not be written to {}", path.display()),
            hint: "",
            warned: std::sync::atomic::AtomicBool::new(false),
        };
        provider = provider.with_span_processor(GenAiConventions(
            BatchSpanProcessor::builder(exporter).build(),
        ));
    }
    #[cfg(feature = "grpc")]
    let mut runtime = None;
    if let Some(export) = &settings.export {
        let exporter = match export.protocol {
            OtlpProtocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(export.endpoint.clone())
                .build()
                .map_err(|e| TelemetryError::Exporter(e.to_string()))?,
            #[cfg(feature = "grpc")]
            OtlpProtocol::Grpc => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("otlp-grpc")
                    .enable_all()
                    .build()
                    .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
                let exporter = {
                    let _entered = rt.enter();
                    opentelemetry_otlp::SpanExporter::builder()
                        .with_tonic()
                        .with_endpoint(export.endpoint.clone())
                        .build()
                        .map_err(|e| TelemetryError::Exporter(e.to_string()))?
                };
                runtime = Some(rt);
                exporter
            }
            #[cfg(not(feature = "grpc"))]
            OtlpProtocol::Grpc => return Err(TelemetryError::GrpcNotBuilt),
        };
        let exporter = WarnOnce {
            inner: exporter,
            failure: format!("traces could not be sent to {}", export.endpoint),
            hint: "is the collector running? ",
            warned: std::sync::atomic::AtomicBool::new(false),
        };
        // A processor (and its thread) per destination: a collector that
        // is slow to answer does not hold the file's lines back.
        provider = provider.with_span_processor(GenAiConventions(
            BatchSpanProcessor::builder(exporter).build(),
        ));
    }
    let provider = provider.build();
    let tracer = provider.tracer("webmcp-agents");
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_filter(trace_filter);
    let dispatch = Dispatch::new(Registry::default().with(log).with(otel));
    Ok((
        dispatch,
        TelemetryGuard {
            provider: Some(provider),
            #[cfg(feature = "grpc")]
            runtime,
            export: settings.export.clone(),
            file: settings.file.clone(),
        },
    ))
}

/// Phoenix files spans under the project its resource attribute
/// `openinference.project.name` names (else under `default`); other
/// backends ignore it.
pub const PROJECT_NAME_ATTRIBUTE: &str = "openinference.project.name";

/// The spans' resource: the SDK's own attributes and `OTEL_RESOURCE_ATTRIBUTES`,
/// then `service.name`, and the service name as the Phoenix project unless
/// the variable names one, so that a run lands in a project named like the
/// service rather than in Phoenix's `default`.
fn resource(settings: &Settings) -> Resource {
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .build();
    if resource
        .get(&opentelemetry::Key::from_static_str(PROJECT_NAME_ATTRIBUTE))
        .is_some()
    {
        return resource;
    }
    Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new(
            PROJECT_NAME_ATTRIBUTE,
            settings.service_name.clone(),
        ))
        .build()
}

/// An exporter that says once on stderr when its spans do not arrive (the
/// collector cannot be reached or refuses them, the trace file cannot be
/// written): a run exported to nowhere would otherwise look traced. Later
/// failures stay quiet (each batch would say the same).
#[derive(Debug)]
struct WarnOnce<E> {
    inner: E,
    /// What failed, as the warning says it: `traces could not be sent to URL`.
    failure: String,
    /// A question that points at the usual cause, or empty.
    hint: &'static str,
    warned: std::sync::atomic::AtomicBool,
}

impl<E: opentelemetry_sdk::trace::SpanExporter> opentelemetry_sdk::trace::SpanExporter
    for WarnOnce<E>
{
    async fn export(&self, batch: Vec<opentelemetry_sdk::trace::SpanData>) -> OTelSdkResult {
        let result = self.inner.export(batch).await;
        if let Err(error) = &result
            && !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            // Not through `tracing`: this runs on the exporter's thread,
            // and an event there would be exported in its turn.
            eprintln!(
                "warning: {}: {error} ({}later failures are not reported)",
                self.failure, self.hint
            );
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

fn parse_filter(filter: &str) -> Result<EnvFilter, TelemetryError> {
    EnvFilter::builder()
        .parse(filter)
        .map_err(|e| TelemetryError::Filter {
            filter: filter.to_string(),
            why: e.to_string(),
        })
}

/// Brings exported spans in line with the GenAI conventions, in one place
/// instead of at every span:
///
/// - a span with `error.type` gets an error status (the conventions ask for
///   both), so that Jaeger shows it red;
/// - counts are integers: tracing-opentelemetry writes `u32`/`u64` fields
///   (token usage, step numbers) as strings, which backends cannot sum or
///   compare, so the known count attributes are turned back into integers;
/// - a field recorded more than once (`wma.steps`, at every step) keeps its
///   last value only: the SDK appends one attribute per record, and
///   backends differ on which of them they show.
#[derive(Debug)]
struct GenAiConventions<P>(P);

/// Attributes that hold counts.
const COUNT_ATTRIBUTES: [&str; 6] = [
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.cached_tokens",
    "wma.step",
    "wma.steps",
    "wma.tools_shown",
];

impl<P: SpanProcessor> SpanProcessor for GenAiConventions<P> {
    fn on_start(&self, span: &mut Span, cx: &opentelemetry::Context) {
        self.0.on_start(span, cx);
    }

    fn on_end(&self, mut span: SpanData) {
        let mut seen = std::collections::HashSet::new();
        let mut last_first: Vec<opentelemetry::KeyValue> = std::mem::take(&mut span.attributes)
            .into_iter()
            .rev()
            .filter(|kv| seen.insert(kv.key.clone()))
            .collect();
        last_first.reverse();
        span.attributes = last_first;
        for kv in &mut span.attributes {
            if let opentelemetry::Value::String(text) = &kv.value
                && COUNT_ATTRIBUTES.contains(&kv.key.as_str())
                && let Ok(n) = text.as_str().parse::<i64>()
            {
                kv.value = opentelemetry::Value::I64(n);
            }
        }
        if matches!(span.status, opentelemetry::trace::Status::Unset)
            && let Some(kind) = span
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == "error.type")
        {
            span.status = opentelemetry::trace::Status::error(kind.value.to_string());
        }
        self.0.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

/// The OpenTelemetry trace id of a span (32 hex digits), to tell a person
/// which trace to open. `None` when export is off or the span is disabled.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}
