//! The answers every endpoint shares: a JSON body, the API's error shape
//! (`{"error": "…"}`), a runtime or store error as the status that fits
//! it, and a run's parts as server-sent events.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::{Value, json};
use wma_runtime::RuntimeError;
use wma_store::StoreError;

/// The header that carries a new run's id (it is also the first event).
pub const RUN_ID_HEADER: &str = "x-run-id";

/// The header that carries the session a run belongs to.
pub const SESSION_ID_HEADER: &str = "x-session-id";

/// How long an event stream may stay silent before it sends a comment
/// line. A run that waits (for a model's first token, for a person's
/// approval) sends nothing for minutes, and a proxy in front, or a
/// client's read timeout, would take the silence for a dead connection.
/// SSE readers skip comments.
pub(crate) const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response {
    let mut response = Response::new(Body::from(value.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    json_response(status, &json!({"error": message.into()}))
}

/// A runtime error as the HTTP status that fits it.
pub(crate) fn runtime_error(failure: &RuntimeError) -> Response {
    let status = match failure {
        RuntimeError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
        RuntimeError::UnknownAgent(_) => StatusCode::NOT_FOUND,
        RuntimeError::SwapInProgress => StatusCode::CONFLICT,
        RuntimeError::SwapFailed(_) => StatusCode::UNPROCESSABLE_ENTITY,
        RuntimeError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        RuntimeError::EmptyRequest => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, failure.to_string())
}

/// A store error as the HTTP status that fits it.
pub(crate) fn store_error(e: &StoreError) -> Response {
    let status = match e {
        StoreError::SessionNotFound(_)
        | StoreError::RunNotFound(_)
        | StoreError::ApprovalNotFound(_) => StatusCode::NOT_FOUND,
        StoreError::RunEnded { .. }
        | StoreError::AlreadyDecided { .. }
        | StoreError::SessionLive { .. } => StatusCode::CONFLICT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.to_string())
}

const NO_STORE: &str = "this server keeps no sessions (it was started without a store)";

/// The answer of an endpoint that needs the store, on a server without one.
pub(crate) fn no_store() -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, NO_STORE)
}

/// The message of [`no_store`], for callers that build their own answer.
pub(crate) fn no_store_message() -> &'static str {
    NO_STORE
}

/// A named event whose data is `data` (`event: run`, then one `data:`
/// line: JSON has no raw newlines).
pub(crate) fn named_event(event: &str, data: &Value) -> Event {
    Event::default().event(event).data(data.to_string())
}

/// A run's part as an event whose id is its sequence number in the run's
/// log (`id: 3`, `event: part`, `data: …`), which a client sends back as
/// `Last-Event-ID` to pick up after it.
pub(crate) fn part_event(seq: u64, data: &Value) -> Event {
    Event::default()
        .id(seq.to_string())
        .event("part")
        .data(data.to_string())
}

/// An event stream answer (`text/event-stream`, `Cache-Control:
/// no-cache`) with a comment after each [`KEEP_ALIVE_INTERVAL`] of
/// silence, carrying the run's and the session's ids as headers when
/// given.
pub(crate) fn event_stream(
    events: impl Stream<Item = Event> + Send + 'static,
    run: Option<&str>,
    session: Option<&str>,
) -> Response {
    let events = events.map(Ok::<_, Infallible>);
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE_INTERVAL))
        .into_response();
    let headers = response.headers_mut();
    for (name, value) in [(RUN_ID_HEADER, run), (SESSION_ID_HEADER, session)] {
        if let Some(value) = value.and_then(|v| HeaderValue::from_str(v).ok()) {
            headers.insert(name, value);
        }
    }
    response
}
