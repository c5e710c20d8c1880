//! The HTTP API of `wma serve`: a config's agents behind a small JSON API,
//! with each run's parts as server-sent events.
//!
//! | method and path | what it does |
//! |---|---|
//! | `GET /v1/health` | `{"status": "ok", ...}` while the runtime serves |
//! | `GET /v1/agents` | the agents, their providers, models and sub-agents |
//! | `POST /v1/agents/{agent}/runs` | starts a run; the answer is an SSE stream of its parts |
//! | `POST /v1/agents/{agent}/runs/{run}/stop` | stops a run (and its sub-agents' runs) |
//! | `PUT /v1/agents/{agent}/provider` | swaps the model of the agent's provider |
//!
//! `docs/http-api.md` describes the bodies, events and errors. The server
//! is plain hyper (already in the build for the tests' OTLP receiver), so
//! `wma` brings no web framework along.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use wma_agent::{ChatMessage, Provider};
use wma_runtime::{AgentHandle, ProviderHandle, Runtime, RuntimeError, TaggedPart};

use crate::config::{Config, provider_source};

/// Largest request body the API reads.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The header that carries a new run's id (it is also the first event).
pub const RUN_ID_HEADER: &str = "x-run-id";

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// One agent as the API reaches it.
#[derive(Clone)]
struct Agent {
    handle: AgentHandle,
    /// Its provider's name in the config, and the provider actor.
    provider: (String, ProviderHandle),
}

/// What the handlers share.
pub struct Api {
    config: Config,
    agents: Vec<Agent>,
    started: Instant,
}

impl Api {
    /// The API over a started config's runtime. It keeps handles, not the
    /// runtime, so the caller shuts the runtime down when the server ends.
    pub fn new(config: Config, runtime: &Runtime) -> Result<Arc<Self>, RuntimeError> {
        let mut agents = Vec::new();
        for handle in runtime.agents() {
            agents.push(Agent {
                provider: runtime.provider_of(handle.name())?,
                handle: handle.clone(),
            });
        }
        Ok(Arc::new(Self {
            config,
            agents,
            started: Instant::now(),
        }))
    }

    fn agent(&self, name: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.handle.name() == name)
    }
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("agents", &self.agents.len())
            .finish_non_exhaustive()
    }
}

/// Serves the API on `listener` until `shutdown` is cancelled. Runs whose
/// streams are open when it ends are stopped as their connections close.
pub async fn serve(
    listener: TcpListener,
    api: Arc<Api>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => accepted?,
        };
        let api = api.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let api = api.clone();
                async move { Ok::<_, Infallible>(route(&api, request).await) }
            });
            let connection = auto::Builder::new(TokioExecutor::new());
            let connection = connection.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                result = connection => {
                    if let Err(error) = result {
                        tracing::debug!(%peer, %error, "an HTTP connection ended with an error");
                    }
                }
                // Dropping the connection drops its open event streams,
                // which stops their runs.
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

/// Binds `addr` and serves the API there; returns the bound address and
/// the serving task.
pub async fn start(
    addr: SocketAddr,
    api: Arc<Api>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    Ok((bound, tokio::spawn(serve(listener, api, shutdown))))
}

async fn route(api: &Api, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["v1", "health"]) => health(api),
        (&Method::GET, ["v1", "agents"]) => list_agents(api),
        (&Method::POST, ["v1", "agents", agent, "runs"]) => {
            let agent = agent.to_string();
            match read_json::<RunBody>(request).await {
                Ok(body) => start_run(api, &agent, body).await,
                Err(response) => response,
            }
        }
        (&Method::POST, ["v1", "agents", agent, "runs", run, "stop"]) => {
            stop_run(api, agent, run).await
        }
        (&Method::PUT, ["v1", "agents", agent, "provider"]) => {
            let agent = agent.to_string();
            match read_json::<SwapBody>(request).await {
                Ok(body) => swap(api, &agent, body).await,
                Err(response) => response,
            }
        }
        (_, ["v1", "health" | "agents"])
        | (_, ["v1", "agents", _, "runs" | "provider"])
        | (_, ["v1", "agents", _, "runs", _, "stop"]) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed on {path}"),
        ),
        _ => error(StatusCode::NOT_FOUND, format!("nothing at {path}")),
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(value.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    json_response(status, &json!({"error": message.into()}))
}

/// A runtime error as the HTTP status that fits it.
fn runtime_error(failure: &RuntimeError) -> Response<Body> {
    let status = match failure {
        RuntimeError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
        RuntimeError::UnknownAgent(_) => StatusCode::NOT_FOUND,
        RuntimeError::SwapInProgress => StatusCode::CONFLICT,
        RuntimeError::SwapFailed(_) => StatusCode::UNPROCESSABLE_ENTITY,
        RuntimeError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, failure.to_string())
}

async fn read_json<T: for<'de> Deserialize<'de>>(
    request: Request<Incoming>,
) -> Result<T, Response<Body>> {
    let limited = http_body_util::Limited::new(request.into_body(), MAX_BODY_BYTES);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| {
            error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("could not read the body: {e}"),
            )
        })?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body is not what this endpoint takes: {e}"),
        )
    })
}

fn health(api: &Api) -> Response<Body> {
    json_response(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "agents": api.agents.len(),
            "uptime_secs": api.started.elapsed().as_secs(),
        }),
    )
}

fn list_agents(api: &Api) -> Response<Body> {
    let mut agents: Vec<Value> = api
        .agents
        .iter()
        .map(|agent| {
            let config = agent.handle.config();
            let (provider, handle) = &agent.provider;
            let info = handle.info();
            json!({
                "name": agent.handle.name(),
                "description": config.description,
                "remote": false,
                "provider": provider,
                "model": info.model,
                "provider_kind": info.provider,
                "tool_sources": config.tool_sources.clone().unwrap_or_default(),
                "sub_agents": config.profile.sub_agents.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
                "active_runs": agent.handle.active_runs(),
            })
        })
        .collect();
    agents.extend(api.config.remote_agents.iter().map(
        |remote| json!({"name": remote.name, "description": remote.description, "remote": true}),
    ));
    json_response(StatusCode::OK, &json!({"agents": agents}))
}

/// The body of `POST /v1/agents/{agent}/runs`: one request, or a whole
/// conversation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    /// The person's request.
    input: Option<String>,
    /// The conversation so far, ending with the person's message.
    messages: Option<Vec<ChatMessage>>,
}

async fn start_run(api: &Api, name: &str, body: RunBody) -> Response<Body> {
    let Some(agent) = api.agent(name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        );
    };
    let messages = match (body.input, body.messages) {
        (Some(input), None) => vec![ChatMessage::user(input)],
        (None, Some(messages)) if !messages.is_empty() => messages,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give either `input` (a request) or `messages` (a conversation)",
            );
        }
    };
    let run = match agent.handle.run(messages).await {
        Ok(run) => run,
        Err(e) => return runtime_error(&e),
    };
    let id = run.id();
    let first = sse_event("run", &json!({"agent": name, "run_id": id}));
    // The stream ends after the run's terminal part; dropping it (the
    // client went away) stops the run.
    let parts = run.tagged().map(|part: TaggedPart| {
        let event = sse_event("part", &serde_json::to_value(&part).unwrap_or(Value::Null));
        Ok::<_, Infallible>(Frame::data(event))
    });
    let events = futures::stream::once(async move { Ok(Frame::data(first)) }).chain(parts);
    let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(events)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(&id.to_string()) {
        headers.insert(RUN_ID_HEADER, value);
    }
    response
}

fn sse_event(event: &str, data: &Value) -> Bytes {
    // JSON has no raw newlines, so one `data:` line carries it.
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

async fn stop_run(api: &Api, name: &str, run: &str) -> Response<Body> {
    let Some(agent) = api.agent(name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        );
    };
    let Ok(run) = run.parse() else {
        return error(StatusCode::BAD_REQUEST, format!("`{run}` is not a run id"));
    };
    match agent.handle.stop(run).await {
        Ok(stopped) => json_response(StatusCode::OK, &json!({"stopped": stopped})),
        Err(e) => runtime_error(&e),
    }
}

/// The body of `PUT /v1/agents/{agent}/provider`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SwapBody {
    /// A provider of the config whose model the agent's provider loads.
    provider: String,
}

async fn swap(api: &Api, name: &str, body: SwapBody) -> Response<Body> {
    let Some(agent) = api.agent(name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        );
    };
    let Some(target) = api.config.provider(&body.provider) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("the config has no provider named `{}`", body.provider),
        );
    };
    let (provider, handle) = &agent.provider;
    let label = body.provider.clone();
    let swapped = handle
        .swap(provider_source(&target.spec), move |p| {
            tracing::info!(provider = %label, stage = %p.stage, done = p.done, total = ?p.total, "loading");
        })
        .await;
    match swapped {
        Ok(info) => {
            let shared: Vec<&str> = api
                .agents
                .iter()
                .filter(|a| &a.provider.0 == provider)
                .map(|a| a.handle.name())
                .collect();
            json_response(
                StatusCode::OK,
                &json!({
                    "agent": name,
                    "provider": provider,
                    "loaded": body.provider,
                    "model": info.model,
                    "provider_kind": info.provider,
                    "agents": shared,
                }),
            )
        }
        Err(e) => runtime_error(&e),
    }
}
