//! The HTTP API of `wma serve`: a config's agents behind a small JSON API,
//! with each run's parts as server-sent events.
//!
//! | method and path | what it does |
//! |---|---|
//! | `GET /v1/health` | whether the host serves; each actor's state with the token |
//! | `GET /v1/agents` | the agents (top-level first), their providers, models and sub-agents; the config's providers |
//! | `POST /v1/agents/{agent}/runs` | starts a run; the answer is an SSE stream of its parts |
//! | `POST /v1/agents/{agent}/runs/{run}/stop` | stops a run (and its sub-agents' runs) |
//! | `PUT /v1/agents/{agent}/provider` | swaps the model of the agent's provider |
//! | `GET /v1/approvals` | the calls of every run that wait for approval |
//! | `GET /v1/agents/{agent}/runs/{run}/approvals` | the calls of one run that wait |
//! | `POST /v1/agents/{agent}/runs/{run}/approvals/{approval}` | approves or denies one |
//! | `POST /v1/sessions`, `GET /v1/sessions` | starts a session, lists them (with a store) |
//! | `GET /v1/sessions/{session}`, `DELETE /v1/sessions/{session}` | reads one with its messages and runs, deletes it |
//! | `POST /v1/sessions/{session}/runs` | continues it: a run whose history is the session's |
//! | `GET /v1/runs/{run}/events` | a run's parts after `Last-Event-ID`, then the live rest |
//! | `GET /v1/models`, `GET /v1/models/{agent}` | the agents as OpenAI models |
//! | `POST /v1/chat/completions` | a run answered as an OpenAI chat completion |
//!
//! Only the operator gets in: every request but a bare health check needs
//! the bearer token, pages of other origins and requests for other host
//! names are refused, and bodies must be JSON. Each connection is bounded
//! in time and their number is capped; see [`ServerOptions`] and
//! `docs/security.md`. `docs/http-api.md` describes the bodies, events and
//! errors. The server is plain hyper (already in the build for the tests'
//! OTLP receiver), so `wma` brings no web framework along.
//!
//! The crate stands on `wma-config`: a validated [`Config`] is what it
//! serves, and [`ServerOptions`] (the `[server]` table) is defined there, so
//! the config never imports the server. [`mend`] (a turn cut short, mended
//! in the store, and [`turn_messages`], what a run adds to its conversation)
//! lives here because the server and `wma chat` share it; the evaluation
//! does not need it.

mod approvals;
mod conn;
mod guard;
mod health;
pub mod mend;
mod openai;
mod sessions;
mod token;
pub mod ui;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Body as _, Bytes, Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use wma_agent::{ApprovalAnswer, ApprovalMode, ApprovalRule, ChatMessage, Provider};
use wma_config::{Config, Hosted, ProviderSpec, provider_source};
use wma_runtime::{
    AgentHandle, ProviderHandle, RunApprovals, RunId, Runtime, RuntimeError, TaggedPart,
    ToolBridgeHandle,
};

pub use approvals::{AnswerRefused, InMemoryApprovals, PendingApproval, PendingApprovals};
pub use conn::{ACCEPT_BACKOFF_MAX, ACCEPT_BACKOFF_MIN};
pub use health::HEALTH_PROBE_TIMEOUT;
pub use mend::turn_messages;
pub use sessions::{ContinueBody, SESSION_ID_HEADER, SESSIONS_LISTED, SessionBody};
pub use token::{Token, TokenOrigin, load_token};
pub use wma_config::server::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_CONNECTION_WAIT, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    DEFAULT_MAX_RUNS_PER_CLIENT, DEFAULT_SHUTDOWN_GRACE, MIN_TOKEN_CHARS, ServerOptions,
    TOKEN_FILE_NAME, TokenSource,
};

/// The header that carries a new run's id (it is also the first event).
pub const RUN_ID_HEADER: &str = "x-run-id";

/// Random bytes in a run id (128 bits): a page or a client that knows one
/// run's id learns nothing about any other's, so it cannot stop them.
const RUN_ID_BYTES: usize = 16;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// One agent as the API reaches it.
#[derive(Clone)]
struct Agent {
    handle: AgentHandle,
    /// Its provider's name in the config, and the provider actor.
    provider: (String, ProviderHandle),
    /// The tool bridge its runs use (for the health check).
    tools: Option<ToolBridgeHandle>,
}

/// What the handlers share.
pub struct Api {
    config: Config,
    agents: Vec<Agent>,
    /// Every provider actor of the runtime, by name (for the health check).
    providers: Vec<(String, ProviderHandle)>,
    /// Each config tool source's set, by name, for its state and restarts
    /// in the health check.
    tool_sets: Vec<(String, Arc<wma_tools::ToolSet>)>,
    started: Instant,
    /// Where sessions, runs' logs and pending approvals are kept; without
    /// one, runs stream from memory only and `/v1/sessions` answers 503.
    store: Option<wma_store::Store>,
    /// The config provider each provider actor serves since a swap, by the
    /// actor's name; an actor not here serves its own. `GET /v1/agents`
    /// shows it, so that a page can tell which one to offer as current.
    loaded: Mutex<HashMap<String, String>>,
}

impl Api {
    /// The API over a started config's runtime. It keeps handles, not the
    /// runtime, so the caller shuts the runtime down when the server ends.
    pub fn new(config: Config, runtime: &Runtime) -> Result<Arc<Self>, RuntimeError> {
        let mut agents = Vec::new();
        for handle in runtime.agents() {
            agents.push(Agent {
                provider: runtime.provider_of(handle.name())?,
                tools: runtime.tools_of(handle.name()).ok(),
                handle: handle.clone(),
            });
        }
        let mut providers = Vec::new();
        for name in runtime.provider_names() {
            providers.push((name.clone(), runtime.provider_named(&name)?));
        }
        Ok(Arc::new(Self {
            config,
            agents,
            providers,
            tool_sets: Vec::new(),
            started: Instant::now(),
            store: None,
            loaded: Mutex::default(),
        }))
    }

    /// The same API keeping its sessions, runs and pending approvals in
    /// `store` (call it before the server starts, while the API is not
    /// shared yet; a shared one is returned unchanged).
    pub fn with_store(mut api: Arc<Self>, store: wma_store::Store) -> Arc<Self> {
        if let Some(inner) = Arc::get_mut(&mut api) {
            inner.store = Some(store);
        }
        api
    }

    /// The store, when the API has one.
    pub fn store(&self) -> Option<&wma_store::Store> {
        self.store.as_ref()
    }

    /// The API over a started config, its tool sources' health included.
    pub fn hosted(config: Config, hosted: &Hosted) -> Result<Arc<Self>, RuntimeError> {
        let mut api = Self::new(config, &hosted.runtime)?;
        if let Some(api) = Arc::get_mut(&mut api) {
            api.tool_sets = hosted.tool_sets.clone();
        }
        Ok(api)
    }

    fn agent(&self, name: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.handle.name() == name)
    }

    /// The config provider whose model the provider actor `actor` serves.
    fn loaded_in(&self, actor: &str) -> String {
        // The map holds plain names; a panic elsewhere leaves it usable.
        let loaded = self.loaded.lock();
        loaded
            .get(actor)
            .cloned()
            .unwrap_or_else(|| actor.to_string())
    }
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("agents", &self.agents.len())
            .finish_non_exhaustive()
    }
}

/// A server that was started: where it listens, the task serving it, and
/// the token requests must carry.
#[derive(Debug)]
pub struct Started {
    /// The bound address.
    pub addr: SocketAddr,
    /// The serving task; it ends (with `Ok`) when `shutdown` is cancelled.
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// The token every request but a bare health check must carry.
    pub token: Token,
    /// Where the token came from.
    pub token_origin: TokenOrigin,
    /// The runs it drives with a durable log, for a graceful shutdown.
    pub runs: RunsInFlight,
}

/// The runs a server drives with a durable log (a server with a store):
/// what a host waits for when it shuts down.
#[derive(Clone)]
pub struct RunsInFlight {
    live: Arc<sessions::LiveRuns>,
}

impl std::fmt::Debug for RunsInFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunsInFlight")
            .field("runs", &self.ids().len())
            .finish()
    }
}

impl RunsInFlight {
    /// The public ids of the runs still going.
    pub fn ids(&self) -> Vec<String> {
        self.live.ids()
    }

    /// Gives up on the runs still going: from now on what they stream (the
    /// stop that follows) is not logged, and their questions stay pending
    /// in the store. The host then marks them (`interrupted`, or leaves
    /// those waiting for approval to the next start) and stops them.
    pub fn give_up(&self) {
        self.live
            .stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until no run is going, or `within` passed; true when none is.
    pub async fn drained(&self, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.live.ids().is_empty() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            // A run's end is rare next to this wait: polling keeps the
            // run's driver free of shutdown bookkeeping.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

impl Started {
    /// The line to tell the operator about the token (see
    /// [`TokenOrigin::notice`]).
    pub fn token_notice(&self) -> String {
        self.token_origin.notice(&self.token)
    }
}

/// Binds `addr` and serves the API there with `options`, until `shutdown`
/// is cancelled. The token is loaded (or generated) before anything
/// listens, so a token problem is an error here, not a refused request
/// later. Runs whose streams are open when it ends are stopped as their
/// connections close.
pub async fn start_with(
    addr: SocketAddr,
    api: Arc<Api>,
    options: ServerOptions,
    shutdown: CancellationToken,
) -> std::io::Result<Started> {
    let (token, token_origin) = load_token(&options.token)?;
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let server = Arc::new(Server::new(api, token.clone(), bound, options));
    let runs = RunsInFlight {
        live: server.live.clone(),
    };
    Ok(Started {
        runs,
        addr: bound,
        task: tokio::spawn(conn::accept_loop(listener, server, shutdown)),
        token,
        token_origin,
    })
}

/// [`start_with`] the default [`ServerOptions`] (the token in the cache
/// folder), telling the operator about the token on stderr. Returns the
/// bound address and the serving task.
pub async fn start(
    addr: SocketAddr,
    api: Arc<Api>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let started = start_with(addr, api, ServerOptions::default(), shutdown).await?;
    eprintln!("{}", started.token_notice());
    eprintln!("{}", ui::page_notice(&started));
    Ok((started.addr, started.task))
}

/// One server: the API, its options and request checks, and its runs.
pub(crate) struct Server {
    api: Arc<Api>,
    options: ServerOptions,
    guard: guard::Guard,
    /// How often a refused request is a warning in the log.
    refusals: guard::RefusalLog,
    runs: Arc<RunBook>,
    /// The questions of its runs that wait for a person.
    approvals: Arc<dyn PendingApprovals>,
    /// The runs with a durable log this process drives.
    live: Arc<sessions::LiveRuns>,
}

impl Server {
    fn new(api: Arc<Api>, token: Token, listen: SocketAddr, options: ServerOptions) -> Self {
        Self {
            guard: guard::Guard::new(token, listen, &options),
            refusals: guard::RefusalLog::default(),
            runs: Arc::new(RunBook::default()),
            approvals: Arc::new(InMemoryApprovals::default()),
            live: Arc::new(sessions::LiveRuns::default()),
            api,
            options,
        }
    }
}

/// The runs this server started: their public ids, and how many each
/// client has streaming.
#[derive(Default)]
struct RunBook {
    /// Public id → the agent and the runtime's id of the run.
    ids: Mutex<HashMap<String, (String, RunId)>>,
    /// Runs streaming per client address.
    per_client: Mutex<HashMap<IpAddr, usize>>,
}

impl RunBook {
    /// A slot for one more run of `client`, unless it has `limit` already.
    fn admit(self: &Arc<Self>, client: IpAddr, limit: usize) -> Option<RunTicket> {
        let mut counts = self.per_client.lock();
        let count = counts.entry(client).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(RunTicket {
            book: self.clone(),
            client,
            id: None,
        })
    }
}

/// A client's slot for one run, and the run's public id once it started.
/// The event stream owns it: when the stream ends or the client goes away,
/// the slot frees and the id is forgotten.
struct RunTicket {
    book: Arc<RunBook>,
    client: IpAddr,
    id: Option<String>,
}

impl RunTicket {
    /// Files the started run under its public id.
    fn register(&mut self, id: &str, agent: &str, run: RunId) {
        self.book
            .ids
            .lock()
            .insert(id.to_string(), (agent.to_string(), run));
        self.id = Some(id.to_string());
    }
}

impl Drop for RunTicket {
    fn drop(&mut self) {
        if let Some(id) = &self.id {
            self.book.ids.lock().remove(id);
        }
        let mut counts = self.book.per_client.lock();
        if let Some(count) = counts.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

/// Every request comes here: the checks, then the endpoint.
async fn handle(server: &Server, peer: SocketAddr, request: Request<Incoming>) -> Response<Body> {
    let (parts, body) = request.into_parts();
    if let Err(refusal) = server.guard.check_host(&parts) {
        return refused(&server.refusals, refusal);
    }
    let cors = match server.guard.check_origin(&parts) {
        Ok(cors) => cors,
        Err(refusal) => return refused(&server.refusals, refusal),
    };
    let preflight = cors.is_some() && guard::is_preflight(&parts);
    let mut response = if preflight {
        let mut response = Response::new(empty());
        *response.status_mut() = StatusCode::NO_CONTENT;
        response
    } else {
        checked(server, peer, Request::from_parts(parts, body)).await
    };
    if let Some(origin) = cors {
        guard::add_cors(response.headers_mut(), origin, preflight);
    }
    response
}

/// A request from an accepted host and origin: the token, the media type,
/// then the endpoint.
async fn checked(server: &Server, peer: SocketAddr, request: Request<Incoming>) -> Response<Body> {
    // The web page (`/`, `/ui/…`) holds no secret: it is served without
    // the token, and sends the token with each API call it makes.
    if let Some(response) = ui::respond(request.method(), request.uri().path()) {
        return response;
    }
    let is_health =
        request.method() == Method::GET && request.uri().path().trim_matches('/') == "v1/health";
    match server.guard.authorize(request.headers()) {
        guard::Auth::Valid => {}
        // A bare health check (a load balancer, a supervisor) learns only
        // whether the host serves.
        guard::Auth::Missing if is_health => {
            let (status, body) = health::report(&server.api, false).await;
            return json_response(status, &body);
        }
        guard::Auth::Missing => {
            return unauthorized("this API needs `Authorization: Bearer <token>`");
        }
        guard::Auth::Wrong => return unauthorized("the token is not this server's"),
    }
    if !request.body().is_end_stream() && !guard::is_json(request.headers()) {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "a request body must be JSON, with `Content-Type: application/json`",
        );
    }
    route(server, peer, request).await
}

/// The answer to a refused request, and a warning about it, as often as
/// `log` allows (a page can send refused requests in a loop).
fn refused(log: &guard::RefusalLog, refusal: guard::Refusal) -> Response<Body> {
    let unlogged = log.admit(&refusal, std::time::Instant::now());
    match refusal {
        guard::Refusal::NoHost => error(StatusCode::BAD_REQUEST, "the request has no Host header"),
        guard::Refusal::Repeated(name) => {
            if let Some(unlogged) = unlogged {
                tracing::warn!(
                    header = name,
                    unlogged,
                    "refused a request with more than one header of a name that must be single"
                );
            }
            error(
                StatusCode::BAD_REQUEST,
                format!("the request has more than one `{name}` header"),
            )
        }
        guard::Refusal::Host(host) => {
            if let Some(unlogged) = unlogged {
                tracing::warn!(%host, unlogged, "refused a request for another host name (DNS rebinding?)");
            }
            error(
                StatusCode::FORBIDDEN,
                format!("this server is not reached as `{host}`"),
            )
        }
        guard::Refusal::Origin(origin) => {
            if let Some(unlogged) = unlogged {
                tracing::warn!(%origin, unlogged, "refused a request from a page of another origin");
            }
            error(
                StatusCode::FORBIDDEN,
                format!("pages of `{origin}` may not call this API"),
            )
        }
    }
}

fn unauthorized(message: &str) -> Response<Body> {
    let mut response = error(StatusCode::UNAUTHORIZED, message);
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed_unsync()
}

async fn route(server: &Server, peer: SocketAddr, request: Request<Incoming>) -> Response<Body> {
    let api = &server.api;
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["v1", "health"]) => {
            let (status, body) = health::report(api, true).await;
            json_response(status, &body)
        }
        (&Method::GET, ["v1", "agents"]) => list_agents(api),
        (&Method::POST, ["v1", "agents", agent, "runs"]) => {
            let agent = agent.to_string();
            match read_json::<RunBody>(&server.options, request).await {
                Ok(body) => start_run(server, peer.ip(), &agent, body).await,
                Err(response) => response,
            }
        }
        (&Method::POST, ["v1", "agents", agent, "runs", run, "stop"]) => {
            stop_run(server, agent, run).await
        }
        (&Method::GET, ["v1", "approvals"]) => list_approvals(server, None).await,
        (&Method::GET, ["v1", "agents", agent, "runs", run, "approvals"]) => {
            match find_run(server, agent, run) {
                Ok(run) => list_approvals(server, Some(&run)).await,
                // A run of the last process that waits for an answer.
                Err((StatusCode::NOT_FOUND, _)) if stored_run_of(server, agent, run).await => {
                    list_approvals(server, Some(&run.to_ascii_lowercase())).await
                }
                Err((status, message)) => error(status, message),
            }
        }
        (&Method::POST, ["v1", "agents", agent, "runs", run, "approvals", approval]) => {
            let (agent, approval) = (agent.to_string(), approval.to_string());
            let found = find_run(server, &agent, run);
            let stored = matches!(&found, Err((StatusCode::NOT_FOUND, _)))
                && stored_run_of(server, &agent, run).await;
            let run = match found {
                Ok(run) => run,
                Err(_) if stored => run.to_ascii_lowercase(),
                Err((status, message)) => return error(status, message),
            };
            let body = match read_json::<DecisionBody>(&server.options, request).await {
                Ok(body) => body,
                Err(response) => return response,
            };
            if stored {
                let answer = body.answer();
                return match sessions::decide_stored(
                    server,
                    peer.ip(),
                    &agent,
                    &run,
                    &approval,
                    &answer,
                )
                .await
                {
                    Some(response) => response,
                    None => error(
                        StatusCode::NOT_FOUND,
                        format!(
                            "no call of run `{run}` waits for approval `{approval}` (answered already, stopped, or timed out)"
                        ),
                    ),
                };
            }
            decide(server, &run, &approval, body)
        }
        (&Method::POST, ["v1", "sessions"]) => {
            match read_json::<SessionBody>(&server.options, request).await {
                Ok(body) => sessions::create(server, body).await,
                Err(response) => response,
            }
        }
        (&Method::GET, ["v1", "sessions"]) => sessions::list(server).await,
        (&Method::GET, ["v1", "sessions", id]) => sessions::read(server, id).await,
        (&Method::DELETE, ["v1", "sessions", id]) => sessions::delete(server, id).await,
        (&Method::POST, ["v1", "sessions", id, "runs"]) => {
            let id = id.to_string();
            match read_json::<ContinueBody>(&server.options, request).await {
                Ok(body) => sessions::continue_session(server, peer.ip(), &id, body).await,
                Err(response) => response,
            }
        }
        (&Method::GET, ["v1", "runs", run, "events"]) => {
            let last = request
                .headers()
                .get("last-event-id")
                .and_then(|v| v.to_str().ok());
            sessions::events(server, run, last).await
        }
        (&Method::GET, ["v1", "models"]) => openai::models(api),
        (&Method::GET, ["v1", "models", model]) => openai::model(api, model),
        (&Method::POST, ["v1", "chat", "completions"]) => {
            openai::chat_completions(server, peer.ip(), request).await
        }
        (&Method::PUT, ["v1", "agents", agent, "provider"]) => {
            let agent = agent.to_string();
            match read_json::<SwapBody>(&server.options, request).await {
                Ok(body) => swap(api, &agent, body).await,
                Err(response) => response,
            }
        }
        (_, ["v1", "health" | "agents"])
        | (_, ["v1", "agents", _, "runs" | "provider"])
        | (_, ["v1", "agents", _, "runs", _, "stop"])
        | (_, ["v1", "approvals"])
        | (_, ["v1", "agents", _, "runs", _, "approvals"])
        | (_, ["v1", "agents", _, "runs", _, "approvals", _])
        | (_, ["v1", "sessions"])
        | (_, ["v1", "sessions", _])
        | (_, ["v1", "sessions", _, "runs"])
        | (_, ["v1", "runs", _, "events"])
        | (_, ["v1", "models"])
        | (_, ["v1", "models", _])
        | (_, ["v1", "chat", "completions"]) => error(
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
        RuntimeError::EmptyRequest => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, failure.to_string())
}

/// Reads a JSON body within the size cap and the body timeout.
async fn read_json<T: for<'de> Deserialize<'de>>(
    options: &ServerOptions,
    request: Request<Incoming>,
) -> Result<T, Response<Body>> {
    let limit = options.max_body_bytes;
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than the {limit} bytes this server reads"),
        )
    };
    // A declared length over the cap is refused before a byte is read.
    if request
        .body()
        .size_hint()
        .exact()
        .is_some_and(|n| n > limit as u64)
    {
        return Err(too_large());
    }
    let limited = http_body_util::Limited::new(request.into_body(), limit);
    let collected = tokio::time::timeout(options.body_timeout, limited.collect())
        .await
        .map_err(|_| {
            error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {:.1} s",
                    options.body_timeout.as_secs_f64()
                ),
            )
        })?;
    let bytes = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(e) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("could not read the body: {e}"),
            ));
        }
    };
    parse_body(&bytes).map_err(|e| error(StatusCode::BAD_REQUEST, e))
}

/// Parses a request body as the server does: a JSON object with the
/// endpoint's fields and no other. serde alone would also take a struct's
/// sequence form (`["fresh"]` for `{"provider": "fresh"}`); every body of
/// this API is an object, so anything else is refused before serde sees it.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    const PREFIX: &str = "the body is not what this endpoint takes";
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(format!("{PREFIX}: it must be a JSON object"));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("{PREFIX}: {e}"))
}

/// `GET /v1/agents`: the agents where requests start (no hosted agent
/// delegates to them) first, then those only other agents call, then the
/// agents of other nodes; each group in the runtime's order (by name).
/// With them, the config's providers, the choices of
/// `PUT /v1/agents/{agent}/provider`.
fn list_agents(api: &Api) -> Response<Body> {
    let called: Vec<&str> = api
        .agents
        .iter()
        .flat_map(|a| a.handle.config().profile.sub_agents.iter())
        .map(|s| s.name.as_str())
        .collect();
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
                "top_level": !called.contains(&agent.handle.name()),
                "provider": provider,
                "loaded": api.loaded_in(provider),
                "model": info.model,
                "provider_kind": info.provider,
                "tool_sources": config.tool_sources.clone().unwrap_or_default(),
                "sub_agents": config.profile.sub_agents.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
                "active_runs": agent.handle.active_runs(),
                "approval": approval_json(&config.options.approval),
            })
        })
        .collect();
    // A stable sort: each group keeps the runtime's order.
    agents.sort_by_key(|a| a["top_level"] != true);
    agents.extend(api.config.remote_agents.iter().map(|remote| {
        json!({"name": remote.name, "description": remote.description, "remote": true, "top_level": false})
    }));
    let providers: Vec<Value> = api
        .config
        .providers
        .iter()
        .map(|p| {
            let (kind, model) = match &p.spec {
                ProviderSpec::Onnx(options) => ("onnx", options.model.clone()),
                ProviderSpec::Scripted(script) => ("scripted", Some(script.model.clone())),
                ProviderSpec::Openai(options) => ("openai", Some(options.model.clone())),
            };
            json!({"name": p.name, "kind": kind, "model": model})
        })
        .collect();
    json_response(
        StatusCode::OK,
        &json!({"agents": agents, "providers": providers}),
    )
}

/// An agent's approval policy as `GET /v1/agents` shows it.
fn approval_json(policy: &wma_agent::ApprovalPolicy) -> Value {
    let tools: serde_json::Map<String, Value> = policy
        .rules
        .iter()
        .map(|r| (r.pattern.clone(), Value::from(r.mode.as_str())))
        .collect();
    json!({
        "read_only": policy.read_only.as_str(),
        "consequential": policy.consequential.as_str(),
        "other": policy.other.as_str(),
        "timeout_secs": policy.timeout.as_secs(),
        "tools": tools,
    })
}

/// The body of `POST /v1/agents/{agent}/runs`: one request, or a whole
/// conversation. Public so that the property tests parse bodies as the
/// server does ([`parse_body`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunBody {
    /// The person's request.
    pub input: Option<String>,
    /// The conversation so far, ending with the person's message.
    pub messages: Option<Vec<ChatMessage>>,
    /// Approval rules of this run's own, by tool name pattern: `ask` or
    /// `deny`. They only tighten the agent's policy, so `auto` is refused.
    pub approval: Option<BTreeMap<String, ApprovalMode>>,
}

impl RunBody {
    /// The run's own approval rules, or what is wrong with them.
    pub fn approval_rules(&self) -> Result<Vec<ApprovalRule>, String> {
        let mut rules = Vec::new();
        for (pattern, mode) in self.approval.iter().flatten() {
            if let Some(problem) = wma_config::tool_pattern_problem(pattern) {
                return Err(format!("`approval`: {problem}"));
            }
            if *mode == ApprovalMode::Auto {
                return Err(format!(
                    "`approval.{pattern}`: a run can only tighten the agent's approval policy (`ask`, `deny`), not loosen it (`auto`)"
                ));
            }
            rules.push(ApprovalRule::new(pattern.clone(), *mode));
        }
        Ok(rules)
    }
}

async fn start_run(server: &Server, client: IpAddr, name: &str, body: RunBody) -> Response<Body> {
    let Some(agent) = server.api.agent(name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        );
    };
    let rules = match body.approval_rules() {
        Ok(rules) => rules,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
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
    // Before the store keeps a session and a run for it.
    if let Err(e) = wma_runtime::check_request(&messages) {
        return runtime_error(&e);
    }
    if server.api.store.is_some() {
        return sessions::start_in_new_session(server, client, name, messages, rules).await;
    }
    let limit = server.options.max_runs_per_client;
    let Some(mut ticket) = server.runs.admit(client, limit) else {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "this client already has {limit} runs streaming (the server's limit); try again when one finishes"
            ),
        );
    };
    let id = match token::random_hex(RUN_ID_BYTES) {
        Ok(id) => id,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    // The run's questions go on the server's list under its public id.
    let approver =
        approvals::HttpApprover::new(id.clone(), name.to_string(), server.approvals.clone());
    let approvals = RunApprovals::asking(Arc::new(approver)).with_rules(rules);
    let run = match agent
        .handle
        .run_with(messages, CancellationToken::new(), approvals)
        .await
    {
        Ok(run) => run,
        Err(e) => return runtime_error(&e),
    };
    ticket.register(&id, name, run.id());
    let first = sse_event("run", &json!({"agent": name, "run_id": id}));
    // The stream ends after the run's terminal part; dropping it (the
    // client went away) stops the run, frees the client's slot and
    // forgets the id.
    let parts = run.tagged().map(move |part: TaggedPart| {
        let _ticket = &ticket;
        let event = sse_event("part", &serde_json::to_value(&part).unwrap_or(Value::Null));
        Ok::<_, Infallible>(Frame::data(event))
    });
    let events = futures::stream::once(async move { Ok(Frame::data(first)) }).chain(parts);
    let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(events)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(&id) {
        headers.insert(RUN_ID_HEADER, value);
    }
    response
}

fn sse_event(event: &str, data: &Value) -> Bytes {
    // JSON has no raw newlines, so one `data:` line carries it.
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// The public id of a run of agent `name` this server has streaming, or
/// the status and message that say why there is none.
fn find_run(server: &Server, name: &str, run: &str) -> Result<String, (StatusCode, String)> {
    if server.api.agent(name).is_none() {
        return Err((
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        ));
    }
    if run.len() != 2 * RUN_ID_BYTES || !run.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err((StatusCode::BAD_REQUEST, format!("`{run}` is not a run id")));
    }
    let run = run.to_ascii_lowercase();
    match server.runs.ids.lock().get(&run) {
        Some((owner, _)) if owner == name => Ok(run),
        _ => Err((
            StatusCode::NOT_FOUND,
            format!("agent `{name}` has no run `{run}` streaming"),
        )),
    }
}

/// Whether the store has a run `run` of agent `name` that this process
/// does not drive (one the last process left).
async fn stored_run_of(server: &Server, name: &str, run: &str) -> bool {
    let Some(store) = &server.api.store else {
        return false;
    };
    let run = run.to_ascii_lowercase();
    !server.live.is_live(&run)
        && matches!(store.run(&run).await, Ok(Some(stored)) if stored.agent == name)
}

/// `GET /v1/approvals`, or one run's: the questions of the runs this
/// process drives, then those the store kept of runs that waited when the
/// last process went away (`"live": false`).
async fn list_approvals(server: &Server, run: Option<&str>) -> Response<Body> {
    let mut list: Vec<Value> = server
        .approvals
        .list()
        .into_iter()
        .filter(|p| run.is_none_or(|r| p.run_id == r))
        .map(|p| serde_json::to_value(p).unwrap_or(Value::Null))
        .collect();
    list.extend(sessions::stored_pending(server, run).await);
    json_response(StatusCode::OK, &json!({"approvals": list}))
}

/// The body of `POST /v1/agents/{agent}/runs/{run}/approvals/{approval}`.
/// Public so that the property tests parse bodies as the server does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// `true` runs the call, `false` denies it.
    pub approve: bool,
    /// The same answer for later calls of this tool in the rest of the
    /// run (its sub-agents' runs included). Default false.
    #[serde(default)]
    pub for_session: bool,
    /// Why, for the model when it is a denial.
    pub note: Option<String>,
}

impl DecisionBody {
    /// The answer this body gives.
    pub fn answer(&self) -> ApprovalAnswer {
        let mut answer = if self.approve {
            ApprovalAnswer::approve()
        } else {
            ApprovalAnswer::deny()
        };
        if self.for_session {
            answer = answer.remembered();
        }
        if let Some(note) = &self.note {
            answer = answer.with_note(note.clone());
        }
        answer
    }
}

fn decide(server: &Server, run: &str, approval: &str, body: DecisionBody) -> Response<Body> {
    let answer = body.answer();
    match server.approvals.answer(run, approval, answer) {
        Ok(pending) => json_response(
            StatusCode::OK,
            &json!({
                "approval_id": pending.request.approval_id,
                "tool": pending.request.tool,
                "approved": body.approve,
                "for_session": body.for_session,
            }),
        ),
        Err(AnswerRefused::NotPending) => error(
            StatusCode::NOT_FOUND,
            format!(
                "no call of run `{run}` waits for approval `{approval}` (answered already, stopped, or timed out)"
            ),
        ),
    }
}

async fn stop_run(server: &Server, name: &str, run: &str) -> Response<Body> {
    let Some(agent) = server.api.agent(name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        );
    };
    if run.len() != 2 * RUN_ID_BYTES || !run.bytes().all(|b| b.is_ascii_hexdigit()) {
        return error(StatusCode::BAD_REQUEST, format!("`{run}` is not a run id"));
    }
    let found = server
        .runs
        .ids
        .lock()
        .get(&run.to_ascii_lowercase())
        .cloned();
    // An id this server never gave out, one of another agent's runs, or
    // one of a run that ended: nothing of this agent's is running under it.
    let Some((_, run)) = found.filter(|(owner, _)| owner == name) else {
        return json_response(StatusCode::OK, &json!({"stopped": false}));
    };
    match agent.handle.stop(run).await {
        Ok(stopped) => json_response(StatusCode::OK, &json!({"stopped": stopped})),
        Err(e) => runtime_error(&e),
    }
}

/// The body of `PUT /v1/agents/{agent}/provider`. Public so that the
/// property tests parse bodies as the server does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwapBody {
    /// A provider of the config whose model the agent's provider loads.
    pub provider: String,
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
            api.loaded
                .lock()
                .insert(provider.clone(), body.provider.clone());
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
