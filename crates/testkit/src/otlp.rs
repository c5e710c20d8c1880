//! An in-process OTLP receiver: a real OTLP endpoint on loopback (HTTP and
//! gRPC on one port) that decodes what an exporter sends, so tests can
//! assert on exported spans.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::{CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use parking_lot::Mutex;
use prost::Message;

use crate::serve::LoopbackServer;

/// An attribute value as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    /// A string.
    String(String),
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Double(f64),
    /// Anything else (arrays, maps, bytes), in debug form.
    Other(String),
}

impl AttrValue {
    fn from_proto(value: Option<AnyValue>) -> Self {
        match value.and_then(|v| v.value) {
            Some(any_value::Value::StringValue(s)) => Self::String(s),
            Some(any_value::Value::BoolValue(b)) => Self::Bool(b),
            Some(any_value::Value::IntValue(i)) => Self::Int(i),
            Some(any_value::Value::DoubleValue(d)) => Self::Double(d),
            Some(other) => Self::Other(format!("{other:?}")),
            None => Self::Other(String::new()),
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Self::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The number, if this is an integer or a double.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Int(i) => Some(*i as f64),
            Self::Double(d) => Some(*d),
            _ => None,
        }
    }
}

fn attributes(pairs: Vec<KeyValue>) -> BTreeMap<String, AttrValue> {
    pairs
        .into_iter()
        .map(|kv| (kv.key, AttrValue::from_proto(kv.value)))
        .collect()
}

/// A span's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanStatus {
    /// Not set.
    Unset,
    /// Ok.
    Ok,
    /// Error, with its description.
    Error(String),
}

/// An event recorded on a span (a `tracing` event inside it).
#[derive(Debug, Clone, PartialEq)]
pub struct CapturedEvent {
    /// The event's name.
    pub name: String,
    /// Its attributes (the event's fields).
    pub attributes: BTreeMap<String, AttrValue>,
}

/// One exported span, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct CapturedSpan {
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// Hex id of the parent span; `None` for a root.
    pub parent_span_id: Option<String>,
    /// The span's name.
    pub name: String,
    /// `internal`, `server`, `client`, `producer`, `consumer` or `unspecified`.
    pub kind: &'static str,
    /// The attributes.
    pub attributes: BTreeMap<String, AttrValue>,
    /// Events, in order.
    pub events: Vec<CapturedEvent>,
    /// The status.
    pub status: SpanStatus,
    /// `service.name` of the resource that sent it.
    pub service_name: Option<String>,
    /// Start, in nanoseconds since the Unix epoch.
    pub start_unix_nano: u64,
    /// End, in nanoseconds since the Unix epoch.
    pub end_unix_nano: u64,
}

impl CapturedSpan {
    /// An attribute.
    pub fn attr(&self, key: &str) -> Option<&AttrValue> {
        self.attributes.get(key)
    }

    /// A string attribute.
    pub fn str_attr(&self, key: &str) -> Option<&str> {
        self.attr(key).and_then(AttrValue::as_str)
    }

    /// An integer attribute.
    pub fn int_attr(&self, key: &str) -> Option<i64> {
        self.attr(key).and_then(AttrValue::as_i64)
    }

    /// Whether `other` is this span's parent.
    pub fn is_child_of(&self, other: &CapturedSpan) -> bool {
        self.trace_id == other.trace_id
            && self.parent_span_id.as_deref() == Some(other.span_id.as_str())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn kind_name(kind: i32) -> &'static str {
    match kind {
        1 => "internal",
        2 => "server",
        3 => "client",
        4 => "producer",
        5 => "consumer",
        _ => "unspecified",
    }
}

fn decode(request: ExportTraceServiceRequest) -> Vec<CapturedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let service_name = resource_spans.resource.and_then(|r| {
            r.attributes
                .into_iter()
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| AttrValue::from_proto(kv.value).as_str().map(str::to_string))
        });
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                let status = match span.status {
                    Some(s) if s.code == 2 => SpanStatus::Error(s.message),
                    Some(s) if s.code == 1 => SpanStatus::Ok,
                    _ => SpanStatus::Unset,
                };
                out.push(CapturedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: (!span.parent_span_id.is_empty())
                        .then(|| hex(&span.parent_span_id)),
                    name: span.name,
                    kind: kind_name(span.kind),
                    attributes: attributes(span.attributes),
                    events: span
                        .events
                        .into_iter()
                        .map(|e| CapturedEvent {
                            name: e.name,
                            attributes: attributes(e.attributes),
                        })
                        .collect(),
                    status,
                    service_name: service_name.clone(),
                    start_unix_nano: span.start_time_unix_nano,
                    end_unix_nano: span.end_time_unix_nano,
                });
            }
        }
    }
    out
}

#[derive(Default)]
struct Store {
    spans: Vec<CapturedSpan>,
    requests: usize,
}

/// An OTLP traces receiver on `127.0.0.1` with a port of its own. It takes
/// http/protobuf (`POST /v1/traces`, `application/x-protobuf`) and gRPC
/// (`TraceService/Export` over HTTP/2 without TLS) on the same port, so one
/// receiver serves an exporter of either protocol. It runs on a thread of its own,
/// so an exporter can flush to it from any context, blocking or not.
/// Dropping it stops the server.
///
/// ```no_run
/// let receiver = wma_testkit::OtlpReceiver::start().unwrap();
/// // Point an exporter at it (http/protobuf):
/// let base = receiver.endpoint(); // "http://127.0.0.1:PORT"
/// # let _ = base;
/// // ...run something traced, flush the exporter, then:
/// let spans = receiver.spans();
/// # let _ = spans;
/// ```
pub struct OtlpReceiver {
    server: LoopbackServer,
    store: Arc<Mutex<Store>>,
}

impl OtlpReceiver {
    /// Binds a free loopback port and starts serving.
    pub fn start() -> std::io::Result<Self> {
        let store = Arc::new(Mutex::new(Store::default()));
        let served = store.clone();
        let server =
            LoopbackServer::start("otlp-receiver", move |req| handle(req, served.clone()))?;
        Ok(Self { server, store })
    }

    /// The base URL (`http://127.0.0.1:PORT`), as `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// takes it; gRPC exporters use it as is.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr())
    }

    /// The full traces URL (`.../v1/traces`).
    pub fn traces_url(&self) -> String {
        format!("{}/v1/traces", self.endpoint())
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<CapturedSpan> {
        self.store.lock().spans.clone()
    }

    /// Export requests received so far.
    pub fn requests(&self) -> usize {
        self.store.lock().requests
    }

    /// Forgets what was received.
    pub fn clear(&self) {
        let mut store = self.store.lock();
        store.spans.clear();
        store.requests = 0;
    }
}

impl std::fmt::Debug for OtlpReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpReceiver")
            .field("addr", &self.server.addr())
            .finish_non_exhaustive()
    }
}

/// The gRPC method an OTLP trace exporter calls.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// A response body: one data frame, then trailers (gRPC puts its status there).
struct Reply {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
    trailers: Option<HeaderMap>,
) -> Response<Reply> {
    let mut response = Response::new(Reply {
        data: Some(Bytes::from(body)),
        trailers,
    });
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn store_spans(store: &Mutex<Store>, request: ExportTraceServiceRequest) {
    let spans = decode(request);
    let mut store = store.lock();
    store.requests += 1;
    store.spans.extend(spans);
}

async fn handle(
    request: Request<Incoming>,
    store: Arc<Mutex<Store>>,
) -> Result<Response<Reply>, Infallible> {
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if request.method() == Method::POST
        && request.uri().path() == GRPC_EXPORT
        && content_type.starts_with("application/grpc")
    {
        return Ok(grpc(request, &store).await);
    }
    let http =
        |status: StatusCode, body: Vec<u8>| Ok(reply(status, "application/x-protobuf", body, None));
    if request.method() != Method::POST || request.uri().path() != "/v1/traces" {
        return http(StatusCode::NOT_FOUND, Vec::new());
    }
    let encoded = request
        .headers()
        .get(CONTENT_ENCODING)
        .is_some_and(|v| v != "identity");
    if !content_type.starts_with("application/x-protobuf") || encoded {
        // Only uncompressed http/protobuf is understood; saying so beats
        // silently dropping what a test expects to see.
        return http(StatusCode::UNSUPPORTED_MEDIA_TYPE, Vec::new());
    }
    let Ok(body) = request.into_body().collect().await else {
        return http(StatusCode::BAD_REQUEST, Vec::new());
    };
    let Ok(decoded) = ExportTraceServiceRequest::decode(body.to_bytes()) else {
        return http(StatusCode::BAD_REQUEST, Vec::new());
    };
    store_spans(&store, decoded);
    http(
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

/// One unary gRPC call: a length-prefixed message in, one out, and the
/// status in the trailers.
async fn grpc(request: Request<Incoming>, store: &Mutex<Store>) -> Response<Reply> {
    let answer = |code: &'static str, body: Vec<u8>| {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static(code));
        reply(StatusCode::OK, "application/grpc", body, Some(trailers))
    };
    // Status 3 is INVALID_ARGUMENT, 12 UNIMPLEMENTED (compression).
    let Ok(body) = request.into_body().collect().await else {
        return answer("3", Vec::new());
    };
    let body = body.to_bytes();
    if body.len() < 5 {
        return answer("3", Vec::new());
    }
    if body[0] != 0 {
        return answer("12", Vec::new());
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let Some(message) = body.get(5..5 + length) else {
        return answer("3", Vec::new());
    };
    let Ok(decoded) = ExportTraceServiceRequest::decode(message) else {
        return answer("3", Vec::new());
    };
    store_spans(store, decoded);
    let response = ExportTraceServiceResponse::default().encode_to_vec();
    let mut framed = Vec::with_capacity(5 + response.len());
    framed.push(0);
    framed.extend_from_slice(&(response.len() as u32).to_be_bytes());
    framed.extend_from_slice(&response);
    answer("0", framed)
}
