//! The OpenAI chat completions API of `wma serve`, over its own runs: a
//! client written for that API (the `openai` Python package, a chat front
//! end) talks to a hosted agent as if the agent were a model.
//!
//! | method and path | what it does |
//! |---|---|
//! | `GET /v1/models` | the agents this host runs, as models |
//! | `GET /v1/models/{agent}` | one of them |
//! | `POST /v1/chat/completions` | a run of the agent `model` names; its answer as a completion |
//!
//! A completion is not a second way to run an agent: the request becomes
//! the body of `POST /v1/agents/{agent}/runs` (or, with `X-Session-Id`, of
//! `POST /v1/sessions/{session}/runs`) and goes through that endpoint, so
//! the token, the run caps, the store, the session and the approval policy
//! are those of every other run. This module only translates: the request
//! in, and the run's event stream out, read part by part, into a
//! `chat.completion` or a stream of `chat.completion.chunk`s. The agent's
//! calls, their results and its sub-agents' parts stay inside the run (and
//! its log): only the answer reaches the client.
//!
//! `docs/http-api.md` ("The OpenAI chat completions API") says which
//! request fields are taken, refused or ignored, and how a run that did not
//! answer is told apart from one that did.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::response::sse::Event;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use wma_agent::{AgentStreamPart, ChatMessage, FinishReason};
use wma_runtime::TaggedPart;

use crate::api::Api;
use crate::body::{ContinueBody, RunBody};
use crate::reply::{RUN_ID_HEADER, SESSION_ID_HEADER, event_stream, json_response};
use crate::runs::start_run;
use crate::sessions::continue_session;
use crate::state::Server;

/// The response header that names the request fields this server read and
/// did not apply (`temperature, max_tokens`), so that ignoring one is
/// never silent.
pub(crate) const IGNORED_HEADER: &str = "x-ignored-options";

/// `owned_by` of every model: the agents are this host's.
const OWNED_BY: &str = "webmcp-agents";

/// A field of the request that asks for something a run cannot give, the
/// test for the values of it that ask nothing (what client libraries send
/// when the caller sets nothing), and why it is refused.
type Refused = (&'static str, fn(&Value) -> bool, &'static str);

/// Fields that change what the answer is. A run answers with the agent's
/// own tools, one answer of prose, sampled as its provider is configured:
/// a request that asks otherwise would get something else than it asked
/// for, so it is refused (400) rather than answered differently.
const REFUSED: &[Refused] = &[
    (
        "tools",
        nothing,
        "the agent calls its own tools, from its config; a completion never asks the client to run one",
    ),
    (
        "functions",
        nothing,
        "the agent calls its own tools, from its config; a completion never asks the client to run one",
    ),
    (
        "tool_choice",
        no_choice,
        "the agent chooses among its own tools; only `none` or `auto` are taken",
    ),
    (
        "function_call",
        no_choice,
        "the agent chooses among its own tools; only `none` or `auto` are taken",
    ),
    ("n", one, "a run gives one answer"),
    (
        "stop",
        nothing,
        "an agent's answer is not cut at stop sequences",
    ),
    (
        "response_format",
        text_format,
        "the answer is the agent's prose; it cannot be held to JSON",
    ),
    (
        "logprobs",
        not_true,
        "a run does not report token probabilities",
    ),
    (
        "top_logprobs",
        nothing_or_zero,
        "a run does not report token probabilities",
    ),
    (
        "logit_bias",
        nothing,
        "how the model samples is its provider's config",
    ),
    ("modalities", text_only, "the answer is text"),
    ("audio", absent, "the answer is text"),
    // Even `{}` asks for a search, with OpenAI's defaults.
    (
        "web_search_options",
        absent,
        "the agent searches only with its own tools",
    ),
];

/// Fields read and not applied: how the model samples and how long it
/// writes are its provider's and the loop's config, the same for every
/// run of the agent; the rest is bookkeeping of the OpenAI service. None of
/// them changes what the answer means. Each one a request sets is named in
/// [`IGNORED_HEADER`].
const IGNORED: &[&str] = &[
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "stream_options",
    "reasoning_effort",
    "prediction",
    "safety_identifier",
    "prompt_cache_key",
    "verbosity",
];

fn nothing(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(fields) => fields.is_empty(),
        Value::String(text) => text.is_empty(),
        _ => false,
    }
}

fn absent(value: &Value) -> bool {
    value.is_null()
}

fn no_choice(value: &Value) -> bool {
    value.is_null() || value == "none" || value == "auto"
}

fn one(value: &Value) -> bool {
    value.is_null() || value.as_u64() == Some(1)
}

fn text_format(value: &Value) -> bool {
    value.is_null() || *value == json!({"type": "text"})
}

fn not_true(value: &Value) -> bool {
    value.is_null() || *value == Value::Bool(false)
}

fn nothing_or_zero(value: &Value) -> bool {
    value.is_null() || value.as_u64() == Some(0)
}

fn text_only(value: &Value) -> bool {
    value.is_null() || *value == json!(["text"])
}

/// What is wrong with a request, and the field it is about (`param` of
/// the OpenAI error).
#[derive(Debug, PartialEq)]
struct Problem {
    message: String,
    param: Option<String>,
}

impl Problem {
    fn new(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            param: Some(param.into()),
        }
    }
}

/// A `POST /v1/chat/completions` body, checked.
#[derive(Debug)]
struct ChatRequest {
    /// The agent.
    model: String,
    /// The conversation, ending with the person's request.
    messages: Vec<ChatMessage>,
    stream: bool,
    /// The fields of [`IGNORED`] the request set, in its order.
    ignored: Vec<String>,
}

impl ChatRequest {
    /// Checks a body's fields: every one must be taken, harmless, or
    /// known and ignored; an unknown one is refused as the rest of the API
    /// refuses them (a misspelt option is not silently dropped).
    fn from_fields(fields: &Map<String, Value>) -> Result<Self, Problem> {
        let mut ignored = Vec::new();
        for (key, value) in fields {
            if matches!(key.as_str(), "model" | "messages" | "stream") {
                continue;
            }
            if let Some((_, harmless, why)) = REFUSED.iter().find(|(name, _, _)| name == key) {
                if !harmless(value) {
                    return Err(Problem::new(
                        key,
                        format!("`{key}` is not taken here: {why}"),
                    ));
                }
            } else if IGNORED.contains(&key.as_str()) {
                if !value.is_null() {
                    ignored.push(key.clone());
                }
            } else {
                return Err(Problem::new(
                    key,
                    format!("`{key}` is not a field of the chat completions API this server takes"),
                ));
            }
        }
        let model = match fields.get("model") {
            Some(Value::String(model)) if !model.is_empty() => model.clone(),
            _ => {
                return Err(Problem::new(
                    "model",
                    "`model` must name an agent of this host (see GET /v1/models)",
                ));
            }
        };
        let stream = match fields.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(stream)) => *stream,
            Some(_) => return Err(Problem::new("stream", "`stream` must be true or false")),
        };
        let messages = match fields.get("messages") {
            Some(Value::Array(messages)) if !messages.is_empty() => messages
                .iter()
                .enumerate()
                .map(|(i, m)| message(i, m))
                .collect::<Result<Vec<_>, _>>()?,
            _ => {
                return Err(Problem::new(
                    "messages",
                    "`messages` must be the conversation, ending with the person's request",
                ));
            }
        };
        if !messages.last().is_some_and(ChatMessage::is_user) {
            return Err(Problem::new(
                format!("messages[{}]", messages.len() - 1),
                "the last message must be the person's (`user`): it is the request the agent answers",
            ));
        }
        Ok(Self {
            model,
            messages,
            stream,
            ignored,
        })
    }

    /// The person's request: the last message.
    fn request(&self) -> String {
        match self.messages.last() {
            Some(ChatMessage::User { content }) => content.clone(),
            _ => String::new(),
        }
    }
}

/// One message of the request as the loop's message: the person's and the
/// agent's earlier turns are taken; what would make the client a part of
/// the run (instructions, tool calls and results) is refused.
fn message(index: usize, value: &Value) -> Result<ChatMessage, Problem> {
    let at = format!("messages[{index}]");
    let Some(fields) = value.as_object() else {
        return Err(Problem::new(
            &at,
            format!("`{at}` must be an object with `role` and `content`"),
        ));
    };
    let role = fields.get("role").and_then(Value::as_str).unwrap_or("");
    // Fields that only say something when they are set; unset (null,
    // empty) they are what client libraries send along.
    let allowed: &[&str] = match role {
        "user" => &["role", "content", "name"],
        "assistant" => &[
            "role",
            "content",
            "name",
            "tool_calls",
            "function_call",
            "refusal",
            "audio",
        ],
        "system" | "developer" => {
            return Err(Problem::new(
                format!("{at}.role"),
                format!(
                    "`{at}` is a `{role}` message: an agent's instructions are its config's, and a request cannot replace them"
                ),
            ));
        }
        "tool" | "function" => {
            return Err(Problem::new(
                format!("{at}.role"),
                format!(
                    "`{at}` is a `{role}` result: the agent runs its own tools, and a client has no call of it to answer"
                ),
            ));
        }
        other => {
            return Err(Problem::new(
                format!("{at}.role"),
                format!("`{at}`: `{other}` is not a role this server takes (`user`, `assistant`)"),
            ));
        }
    };
    for (key, value) in fields {
        if !allowed.contains(&key.as_str()) {
            return Err(Problem::new(
                format!("{at}.{key}"),
                format!("`{at}.{key}` is not a field of a `{role}` message this server takes"),
            ));
        }
        if matches!(
            key.as_str(),
            "tool_calls" | "function_call" | "refusal" | "audio"
        ) && !nothing(value)
        {
            return Err(Problem::new(
                format!("{at}.{key}"),
                format!(
                    "`{at}.{key}` is not taken: the agent's calls are its own, and its earlier answers are their text"
                ),
            ));
        }
    }
    let content = match fields.get("content") {
        Some(Value::String(text)) => text.clone(),
        None | Some(Value::Null) if role == "assistant" => String::new(),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::new();
            for (n, part) in parts.iter().enumerate() {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(text)) => texts.push(text),
                    _ => {
                        return Err(Problem::new(
                            format!("{at}.content[{n}]"),
                            format!(
                                "`{at}.content[{n}]`: only text parts (`{{\"type\": \"text\", \"text\": …}}`) are taken"
                            ),
                        ));
                    }
                }
            }
            texts.join("\n")
        }
        _ => {
            return Err(Problem::new(
                format!("{at}.content"),
                format!("`{at}.content` must be text"),
            ));
        }
    };
    Ok(if role == "user" {
        ChatMessage::user(content)
    } else {
        ChatMessage::assistant(content)
    })
}

/// The Unix time the server started: what `created` says of every agent.
fn started_at(api: &Api) -> u64 {
    SystemTime::now()
        .checked_sub(api.started.elapsed())
        .unwrap_or(UNIX_EPOCH)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn model_object(name: &str, created: u64) -> Value {
    json!({"id": name, "object": "model", "created": created, "owned_by": OWNED_BY})
}

/// `GET /v1/models`: the agents this host runs, in the order
/// `GET /v1/agents` lists them (the agents `POST /v1/agents/{agent}/runs`
/// takes, sub-agents included; remote agents are another node's to answer).
pub(crate) fn models(api: &Api) -> Response {
    let created = started_at(api);
    let data: Vec<Value> = api
        .agents
        .iter()
        .map(|agent| model_object(agent.handle.name(), created))
        .collect();
    json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{agent}`.
pub(crate) fn model(api: &Api, name: &str) -> Response {
    match api.agent(name) {
        Some(_) => json_response(StatusCode::OK, &model_object(name, started_at(api))),
        None => model_not_found(name),
    }
}

fn model_not_found(name: &str) -> Response {
    openai_error(
        StatusCode::NOT_FOUND,
        format!("there is no agent named `{name}` on this host (see GET /v1/models)"),
        Some("model"),
        Some("model_not_found"),
    )
}

/// An error as the OpenAI API writes one, which its clients read into
/// their exceptions.
fn openai_error(
    status: StatusCode,
    message: impl Into<String>,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    let kind = match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500.. => "server_error",
        _ => "invalid_request_error",
    };
    json_response(
        status,
        &json!({"error": {"message": message.into(), "type": kind, "param": param, "code": code}}),
    )
}

/// An error answer of the runs API (`{"error": "…"}`) in the OpenAI shape,
/// with its status and headers (`Retry-After`) kept.
async fn reshaped(response: Response) -> Response {
    let (parts, body) = response.into_parts();
    // An error answer is a small JSON body already in memory.
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let mut reshaped = openai_error(parts.status, message, None, None);
    for (name, value) in &parts.headers {
        if name != CONTENT_TYPE && name != CONTENT_LENGTH {
            reshaped.headers_mut().append(name.clone(), value.clone());
        }
    }
    reshaped
}

/// `POST /v1/chat/completions`: a run of the agent `model` names, through
/// the runs API, answered as a completion.
pub(crate) async fn chat_completions(
    server: &Server,
    client: IpAddr,
    request_headers: &HeaderMap,
    body: Result<Map<String, Value>, Response>,
) -> Response {
    let session = match request_headers.get(SESSION_ID_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(id)) => Some(id.trim().to_ascii_lowercase()),
        Some(Err(_)) => {
            return openai_error(
                StatusCode::BAD_REQUEST,
                "`X-Session-Id` is not a session id",
                None,
                None,
            );
        }
    };
    let fields = match body {
        Ok(fields) => fields,
        Err(response) => return reshaped(response).await,
    };
    let chat = match ChatRequest::from_fields(&fields) {
        Ok(chat) => chat,
        Err(problem) => {
            return openai_error(
                StatusCode::BAD_REQUEST,
                problem.message,
                problem.param.as_deref(),
                None,
            );
        }
    };
    if server.api.agent(&chat.model).is_none() {
        return model_not_found(&chat.model);
    }
    let started = match &session {
        Some(id) => {
            // The session's runs are its agent's: a completion for another
            // model would answer as one agent in another's conversation.
            if let Some(store) = &server.api.store
                && let Ok(Some(kept)) = store.session(id).await
                && kept.agent != chat.model
            {
                return openai_error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "session `{id}` is a conversation with `{}`, not with `{}`",
                        kept.agent, chat.model
                    ),
                    Some("model"),
                    None,
                );
            }
            // The session holds the conversation: only the request joins it.
            let body = ContinueBody {
                input: chat.request(),
                approval: None,
            };
            continue_session(server, client, id, body).await
        }
        None => {
            let body = RunBody {
                input: None,
                messages: Some(chat.messages.clone()),
                approval: None,
            };
            start_run(server, client, &chat.model, body).await
        }
    };
    if !started.status().is_success() {
        return reshaped(started).await;
    }
    let (parts, body) = started.into_parts();
    let run_id = parts
        .headers
        .get(RUN_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let reply = Reply {
        id: format!("chatcmpl-{run_id}"),
        created: now(),
        model: chat.model.clone(),
    };
    let mut headers = HeaderMap::new();
    for name in [RUN_ID_HEADER, SESSION_ID_HEADER] {
        if let Some(value) = parts.headers.get(name) {
            headers.insert(name, value.clone());
        }
    }
    if !chat.ignored.is_empty()
        && let Ok(value) = HeaderValue::from_str(&chat.ignored.join(", "))
    {
        headers.insert(IGNORED_HEADER, value);
    }
    let mut response = if chat.stream {
        streamed(body, reply)
    } else {
        whole(body, reply).await
    };
    response.headers_mut().extend(headers);
    response
}

/// What every object of one completion shares.
struct Reply {
    /// `chatcmpl-` and the run's id.
    id: String,
    created: u64,
    /// The agent.
    model: String,
}

impl Reply {
    fn completion(&self, answer: &Answer) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": answer.content(), "refusal": null},
                "logprobs": null,
                "finish_reason": answer.finish_reason(),
            }],
        })
    }

    /// One `data:` event of a streamed completion.
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Event {
        let chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
        });
        Event::default().data(chunk.to_string())
    }
}

/// The non-streamed answer: the run read to its end.
async fn whole(body: Body, reply: Reply) -> Response {
    let mut events = PartEvents::default();
    let mut answer = Answer::default();
    // The run's stream cannot fail: its events are made in this process.
    let mut data = body.into_data_stream();
    while let Some(Ok(bytes)) = data.next().await {
        for part in events.push(&bytes) {
            answer.observe(&part);
        }
    }
    json_response(StatusCode::OK, &reply.completion(&answer))
}

/// The streamed answer: the role at once, then, when the run ends, its
/// answer and the finish reason, then `[DONE]`.
///
/// The answer comes in one chunk. The loop shows a step's text only once
/// the reply was read whole, and a step's text is the answer only when no
/// call follows it in that step: text sent sooner could turn out to be a
/// remark before a call, which is not the agent's answer.
fn streamed(body: Body, reply: Reply) -> Response {
    struct Streaming {
        data: axum::body::BodyDataStream,
        events: PartEvents,
        answer: Answer,
        reply: Reply,
        ready: VecDeque<Event>,
        done: bool,
    }
    let mut ready = VecDeque::new();
    ready.push_back(reply.chunk(json!({"role": "assistant", "content": ""}), None));
    let state = Streaming {
        data: body.into_data_stream(),
        events: PartEvents::default(),
        answer: Answer::default(),
        reply,
        ready,
        done: false,
    };
    let chunks = futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.ready.pop_front() {
                return Some((event, s));
            }
            if s.done {
                return None;
            }
            // Read to the run's stream's end, not only to its terminal
            // part: on a server with a store the stream ends once the
            // answer has joined the session, so a client that goes on
            // with the session as soon as it has `[DONE]` finds it there.
            if let Some(Ok(bytes)) = s.data.next().await {
                for part in s.events.push(&bytes) {
                    s.answer.observe(&part);
                }
                continue;
            }
            s.done = true;
            let content = s.answer.content();
            if !content.is_empty() {
                let chunk = s.reply.chunk(json!({"content": content}), None);
                s.ready.push_back(chunk);
            }
            let last = s.reply.chunk(json!({}), Some(s.answer.finish_reason()));
            s.ready.push_back(last);
            s.ready.push_back(Event::default().data("[DONE]"));
        }
    });
    event_stream(chunks, None, None)
}

/// The parts of a run's event stream (the runs API's `event: part`
/// events), from its bytes as they arrive.
#[derive(Default)]
struct PartEvents {
    buffer: Vec<u8>,
}

impl PartEvents {
    /// The parts of the events that `bytes` completes.
    fn push(&mut self, bytes: &[u8]) -> Vec<TaggedPart> {
        self.buffer.extend_from_slice(bytes);
        let mut parts = Vec::new();
        while let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
            let event = String::from_utf8_lossy(&event);
            let mut name = "";
            let mut data = String::new();
            for line in event.lines() {
                if let Some(value) = line.strip_prefix("event: ") {
                    name = value;
                } else if let Some(value) = line.strip_prefix("data: ") {
                    data.push_str(value);
                }
            }
            if name != "part" {
                continue;
            }
            match serde_json::from_str::<TaggedPart>(&data) {
                Ok(part) => parts.push(part),
                Err(e) => tracing::warn!(error = %e, "a run's part did not parse"),
            }
        }
        parts
    }
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq)]
enum End {
    Finished(FinishReason),
    Failed(String),
}

/// The answer of the run, from its own (depth 0) parts: the text of its
/// last step, and how it ended. Sub-agents' parts are the run's inside.
#[derive(Debug, Default)]
struct Answer {
    texts: Vec<String>,
    end: Option<End>,
}

impl Answer {
    fn observe(&mut self, part: &TaggedPart) {
        if part.depth != 0 {
            return;
        }
        match &part.part {
            AgentStreamPart::MessageStart { .. } => self.texts.clear(),
            AgentStreamPart::Text { text } => self.texts.push(text.clone()),
            AgentStreamPart::Finish { reason } => self.end = Some(End::Finished(*reason)),
            AgentStreamPart::Error { message } => self.end = Some(End::Failed(message.clone())),
            _ => {}
        }
    }

    /// What `content` says: the answer; for a run that did not answer,
    /// what it said instead (why it stopped, or its error), which its
    /// finish reason tells apart from an answer.
    fn content(&self) -> String {
        match &self.end {
            Some(End::Failed(message)) => message.clone(),
            _ => self.texts.join("\n"),
        }
    }

    /// OpenAI's reason where it means the same (`stop`, `length`); the
    /// run's own otherwise, so that no run that did not answer reads as
    /// one that did.
    fn finish_reason(&self) -> &'static str {
        match &self.end {
            Some(End::Finished(reason)) => match reason {
                FinishReason::Stop => "stop",
                FinishReason::Length => "length",
                FinishReason::MaxSteps => "max_steps",
                FinishReason::Loop => "loop",
                FinishReason::Unrepaired => "unrepaired",
                FinishReason::Aborted => "aborted",
            },
            Some(End::Failed(_)) => "error",
            // The stream ended without the run's terminal part: the host
            // gave up on the run (it is shutting down).
            None => "interrupted",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: Value) -> Map<String, Value> {
        body.as_object().cloned().unwrap()
    }

    fn problem(body: Value) -> Problem {
        ChatRequest::from_fields(&fields(body)).unwrap_err()
    }

    #[test]
    fn a_conversation_becomes_the_runs_messages() {
        let chat = ChatRequest::from_fields(&fields(json!({
            "model": "clerk",
            "messages": [
                {"role": "user", "content": "Find a tent."},
                {"role": "assistant", "content": null, "tool_calls": []},
                {"role": "user", "content": [{"type": "text", "text": "A small"}, {"type": "text", "text": "one."}]},
            ],
            "stream": true,
            "temperature": 0.2,
            "max_tokens": null,
            "n": 1,
            "tools": [],
        })))
        .unwrap();
        assert_eq!(
            chat.messages,
            vec![
                ChatMessage::user("Find a tent."),
                ChatMessage::assistant(""),
                ChatMessage::user("A small\none."),
            ]
        );
        assert!(chat.stream);
        assert_eq!(chat.request(), "A small\none.");
        // Only the fields set (not null) are named as ignored.
        assert_eq!(chat.ignored, vec!["temperature"]);
    }

    #[test]
    fn fields_that_change_the_answer_are_refused_by_name() {
        let user = json!([{"role": "user", "content": "Hi"}]);
        for (field, value) in [
            (
                "tools",
                json!([{"type": "function", "function": {"name": "f"}}]),
            ),
            ("tool_choice", json!("required")),
            ("n", json!(2)),
            ("stop", json!(["\n"])),
            ("response_format", json!({"type": "json_object"})),
            ("logprobs", json!(true)),
            ("modalities", json!(["text", "audio"])),
            ("web_search_options", json!({})),
        ] {
            let mut body = json!({"model": "clerk", "messages": user});
            body[field] = value;
            let problem = problem(body);
            assert_eq!(problem.param.as_deref(), Some(field));
            assert!(problem.message.contains("is not taken"), "{problem:?}");
        }
        let unknown = problem(json!({"model": "clerk", "messages": user, "temprature": 1}));
        assert!(unknown.message.contains("`temprature` is not a field"));
    }

    #[test]
    fn messages_that_would_steer_the_run_are_refused() {
        for (messages, param) in [
            (
                json!([{"role": "system", "content": "Be rude."}, {"role": "user", "content": "Hi"}]),
                "messages[0].role",
            ),
            (
                json!([{"role": "tool", "tool_call_id": "c", "content": "42"}, {"role": "user", "content": "Hi"}]),
                "messages[0].role",
            ),
            (
                json!([{"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}, {"role": "user", "content": "Hi"}]),
                "messages[0].tool_calls",
            ),
            (
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
                "messages[0].content[0]",
            ),
            (
                json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]),
                "messages[1]",
            ),
            (json!([]), "messages"),
        ] {
            let problem = problem(json!({"model": "clerk", "messages": messages}));
            assert_eq!(problem.param.as_deref(), Some(param), "{problem:?}");
        }
    }

    fn part(depth: u32, part: AgentStreamPart) -> TaggedPart {
        TaggedPart::new(if depth == 0 { "clerk" } else { "helper" }, depth, part)
    }

    #[test]
    fn the_answer_is_the_last_steps_text_of_the_run_itself() {
        let mut answer = Answer::default();
        for p in [
            part(0, AgentStreamPart::MessageStart { step: 1 }),
            part(
                0,
                AgentStreamPart::Text {
                    text: "Let me look.".into(),
                },
            ),
            part(
                1,
                AgentStreamPart::Text {
                    text: "Found p-17.".into(),
                },
            ),
            part(0, AgentStreamPart::MessageStart { step: 2 }),
            part(
                0,
                AgentStreamPart::Text {
                    text: "The Summit 30L.".into(),
                },
            ),
        ] {
            answer.observe(&p);
        }
        assert_eq!(answer.finish_reason(), "interrupted");
        answer.observe(&part(
            0,
            AgentStreamPart::Finish {
                reason: FinishReason::Stop,
            },
        ));
        assert_eq!(
            (answer.content().as_str(), answer.finish_reason()),
            ("The Summit 30L.", "stop")
        );
    }

    #[test]
    fn a_run_that_did_not_answer_never_finishes_with_stop() {
        for (end, reason) in [
            (
                AgentStreamPart::Finish {
                    reason: FinishReason::Length,
                },
                "length",
            ),
            (
                AgentStreamPart::Finish {
                    reason: FinishReason::MaxSteps,
                },
                "max_steps",
            ),
            (
                AgentStreamPart::Finish {
                    reason: FinishReason::Loop,
                },
                "loop",
            ),
            (
                AgentStreamPart::Finish {
                    reason: FinishReason::Unrepaired,
                },
                "unrepaired",
            ),
            (
                AgentStreamPart::Finish {
                    reason: FinishReason::Aborted,
                },
                "aborted",
            ),
            (
                AgentStreamPart::Error {
                    message: "the model failed".into(),
                },
                "error",
            ),
        ] {
            let mut answer = Answer::default();
            answer.observe(&part(0, end));
            assert_eq!(answer.finish_reason(), reason);
        }
    }

    #[test]
    fn parts_are_read_across_chunk_boundaries_and_other_events_skipped() {
        let stream = concat!(
            "event: run\ndata: {\"agent\":\"clerk\",\"run_id\":\"ab\"}\n\n",
            "id: 1\nevent: part\ndata: {\"agent\":\"clerk\",\"depth\":0,\"type\":\"text\",\"text\":\"Hé\"}\n\n",
            "id: 2\nevent: part\ndata: {\"agent\":\"clerk\",\"depth\":0,\"type\":\"finish\",\"reason\":\"stop\"}\n\n",
        )
        .as_bytes();
        let mut events = PartEvents::default();
        let mut parts = Vec::new();
        // Cut inside the `é`, too.
        for piece in stream.chunks(7) {
            parts.extend(events.push(piece));
        }
        assert_eq!(
            parts.iter().map(|p| p.part.clone()).collect::<Vec<_>>(),
            vec![
                AgentStreamPart::Text { text: "Hé".into() },
                AgentStreamPart::Finish {
                    reason: FinishReason::Stop
                },
            ]
        );
    }
}
