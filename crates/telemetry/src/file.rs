//! The trace file: spans appended as OTLP JSON lines, one
//! `ExportTraceServiceRequest` per exported batch, in the OTLP/JSON
//! encoding (hex ids, times as decimal strings, `resourceSpans` →
//! `scopeSpans` → `spans`). That is what the OpenTelemetry collector's file
//! exporter writes, so the collector, `wma trace` and other tools read it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use parking_lot::Mutex;

use crate::error::TelemetryError;

/// Writes each batch of spans as one line of the trace file.
///
/// The file is opened once, at start, for appending: an unwritable path is
/// an error before any work runs rather than spans lost at the end. Each
/// line goes out in one `write` on a file opened with `O_APPEND`, so runs
/// of several processes that share a file do not cut into each other's
/// lines.
#[derive(Debug)]
pub(crate) struct FileExporter {
    /// For messages.
    path: PathBuf,
    /// Unbuffered: a line is on disk once `export` returns, so a process
    /// that dies later loses nothing already exported.
    file: Mutex<File>,
    /// The provider's resource (`service.name` and the rest), given through
    /// `set_resource` when the provider is built.
    resource: ResourceAttributesWithSchema,
}

impl FileExporter {
    /// Opens (creating it if needed) `path` for appending.
    pub(crate) fn open(path: &Path) -> Result<Self, TelemetryError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| TelemetryError::TraceFile {
                path: path.to_path_buf(),
                why: e.to_string(),
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            resource: ResourceAttributesWithSchema::default(),
        })
    }

    /// One batch as a line of OTLP JSON, newline included.
    fn line(&self, batch: Vec<SpanData>) -> Result<Vec<u8>, serde_json::Error> {
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(batch, &self.resource),
        };
        let mut line = serde_json::to_vec(&request)?;
        line.push(b'\n');
        Ok(line)
    }
}

impl SpanExporter for FileExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if batch.is_empty() {
            return Ok(());
        }
        let line = self
            .line(batch)
            .map_err(|e| OTelSdkError::InternalFailure(e.to_string()))?;
        self.file
            .lock()
            .write_all(&line)
            .map_err(|e| OTelSdkError::InternalFailure(format!("{}: {e}", self.path.display())))
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::KeyValue;
    use opentelemetry::trace::{
        SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use std::time::{Duration, UNIX_EPOCH};

    fn span(name: &str, id: u64, parent: u64) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736),
                SpanId::from(id),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::from(parent),
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: name.to_string().into(),
            start_time: UNIX_EPOCH + Duration::from_nanos(1_700_000_000_000_000_001),
            end_time: UNIX_EPOCH + Duration::from_nanos(1_700_000_000_250_000_000),
            attributes: vec![KeyValue::new("gen_ai.usage.input_tokens", 12_i64)],
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: Status::error("tool_failed"),
            instrumentation_scope: opentelemetry::InstrumentationScope::builder("webmcp-agents")
                .build(),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wma-telemetry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        path
    }

    #[test]
    fn each_batch_is_one_line_of_otlp_json_and_lines_are_appended() {
        let path = scratch("append.jsonl");
        std::fs::write(&path, "{\"resourceSpans\":[]}\n").unwrap();
        let mut exporter = FileExporter::open(&path).unwrap();
        exporter.set_resource(&Resource::builder_empty().with_service_name("svc").build());
        poll_once(exporter.export(vec![span("root", 1, 0), span("child", 2, 1)])).unwrap();
        poll_once(exporter.export(vec![])).unwrap();
        poll_once(exporter.export(vec![span("later", 3, 1)])).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let first: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        let resource = &first["resourceSpans"][0]["resource"]["attributes"][0];
        assert_eq!(resource["key"], "service.name");
        assert_eq!(resource["value"]["stringValue"], "svc");
        let spans = &first["resourceSpans"][0]["scopeSpans"][0]["spans"];
        assert_eq!(spans[0]["name"], "root");
        assert_eq!(spans[0]["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(spans[0]["spanId"], "0000000000000001");
        assert_eq!(spans[0]["parentSpanId"], "");
        assert_eq!(spans[1]["parentSpanId"], "0000000000000001");
        // 64-bit numbers are strings in OTLP/JSON, so no reader loses digits.
        assert_eq!(spans[0]["startTimeUnixNano"], "1700000000000000001");
        assert_eq!(spans[0]["endTimeUnixNano"], "1700000000250000000");
        assert_eq!(spans[0]["attributes"][0]["value"]["intValue"], "12");
        assert_eq!(spans[0]["status"]["code"], 2);
        assert_eq!(spans[0]["status"]["message"], "tool_failed");
        // And it reads back as the request it was.
        let back: ExportTraceServiceRequest = serde_json::from_str(lines[2]).unwrap();
        assert_eq!(back.resource_spans[0].scope_spans[0].spans[0].name, "later");
    }

    #[test]
    fn a_file_that_cannot_be_opened_is_an_error_naming_it() {
        let path = scratch("no-such-folder").join("trace.jsonl");
        let error = FileExporter::open(&path).unwrap_err();
        let message = error.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("No such file"), "{message}");
    }

    /// The exporter's futures never wait on anything; polling once is enough.
    fn poll_once<F: std::future::Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(output) => output,
            std::task::Poll::Pending => panic!("the file exporter waited"),
        }
    }
}
