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
//! errors. The endpoints are an axum router; the checks are middleware
//! around it, and the connections are accepted and kept within their caps
//! by the server's own accept loop, which hands each request to the router.
//!
//! The modules stand in layers, each importing only modules of the layers
//! below it, so that none reaches back into one that uses it: the answers'
//! shapes (`reply`), the token, the agents (`api`), pending approvals,
//! mending and the books of runs (`book`) at the bottom; then the request
//! checks (`guard`), the health check and the server's shared state
//! (`state`); the request bodies (`body`); starting and driving runs
//! (`runs`, the one place a run starts); the sessions and the OpenAI
//! endpoints over it; the page, the middleware (`layers`) and the router
//! (`routes`); the accept loop (`conn`); and this file, which wires them
//! together and re-exports the public items.
//!
//! The crate stands on `wma-config`: a validated
//! [`Config`](wma_config::Config) is what it serves, and [`ServerOptions`]
//! (the `[server]` table) is defined there, so the config never imports
//! the server. [`mend`] (a turn cut short, mended
//! in the store, and [`turn_messages`], what a run adds to its conversation)
//! lives here because the server and `wma chat` share it; the evaluation
//! does not need it.

mod api;
mod approvals;
mod body;
mod book;
mod conn;
mod guard;
mod health;
mod layers;
pub mod mend;
mod openai;
mod reply;
mod routes;
mod runs;
mod sessions;
mod state;
mod token;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use api::Api;
pub use approvals::{AnswerRefused, InMemoryApprovals, PendingApproval, PendingApprovals};
pub use body::{ContinueBody, DecisionBody, RunBody, SessionBody, SwapBody, parse_body};
pub use conn::{ACCEPT_BACKOFF_MAX, ACCEPT_BACKOFF_MIN};
pub use health::HEALTH_PROBE_TIMEOUT;
pub use mend::turn_messages;
pub use reply::{RUN_ID_HEADER, SESSION_ID_HEADER};
pub use sessions::SESSIONS_LISTED;
pub use state::{RunsInFlight, Started};
pub use token::{Token, TokenOrigin, load_token};
pub use wma_config::server::{
    DEFAULT_BODY_TIMEOUT, DEFAULT_CONNECTION_WAIT, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    DEFAULT_MAX_RUNS_PER_CLIENT, DEFAULT_SHUTDOWN_GRACE, MIN_TOKEN_CHARS, ServerOptions,
    TOKEN_FILE_NAME, TokenSource,
};

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
    let server = Arc::new(state::Server::new(api, token.clone(), bound, options));
    let runs = RunsInFlight {
        live: server.live.clone(),
    };
    let router = routes::router(server.clone());
    Ok(Started {
        runs,
        addr: bound,
        task: tokio::spawn(conn::accept_loop(listener, server, router, shutdown)),
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
