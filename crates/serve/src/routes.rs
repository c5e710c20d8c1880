//! The router of the API: each endpoint's method and path, its handler,
//! and the answers for a path the API does not have (`404`) and a method
//! a path does not take (`405`, with `Allow`), all in the API's error
//! shape. The request checks wrap it as middleware ([`crate::layers`]).
//!
//! A connection hands each request to [`dispatch`], which notes the
//! client's address and tolerates slashes around the path (`/v1/agents/`
//! is `/v1/agents`) before the router matches it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, FromRequestParts, OriginalUri, Path, State};
use axum::http::request::Parts;
use axum::http::uri::PathAndQuery;
use axum::http::{HeaderMap, Method, Request, StatusCode, Uri};
use axum::middleware;
use axum::response::Response;
use axum::routing::{get, post, put};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tower::Service;
use wma_agent::Provider;
use wma_config::{ProviderSpec, provider_source};

use crate::api::Api;
use crate::approvals::AnswerRefused;
use crate::body::{ContinueBody, DecisionBody, JsonBody, RunBody, SessionBody, SwapBody};
use crate::book::is_id;
use crate::reply::{error, json_response, runtime_error};
use crate::state::Server;
use crate::{health, layers, openai, runs, sessions};

/// The API's router over `server`, its checks around it.
pub(crate) fn router(server: Arc<Server>) -> Router {
    Router::new()
        .route("/v1/health", get(health_report))
        .route("/v1/agents", get(list_agents))
        .route("/v1/agents/{agent}/runs", post(start_run))
        .route("/v1/agents/{agent}/runs/{run}/stop", post(stop_run))
        .route("/v1/agents/{agent}/provider", put(swap))
        .route("/v1/approvals", get(all_approvals))
        .route(
            "/v1/agents/{agent}/runs/{run}/approvals",
            get(run_approvals),
        )
        .route(
            "/v1/agents/{agent}/runs/{run}/approvals/{approval}",
            post(decide),
        )
        .route("/v1/sessions", post(create_session).get(list_sessions))
        .route(
            "/v1/sessions/{session}",
            get(read_session).delete(delete_session),
        )
        .route("/v1/sessions/{session}/runs", post(continue_session))
        .route("/v1/runs/{run}/events", get(run_events))
        .route("/v1/models", get(models))
        .route("/v1/models/{model}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .fallback(not_found)
        // Set after the routes: it applies to those added so far.
        .method_not_allowed_fallback(method_not_allowed)
        // The last layer added is the first a request meets.
        .layer(middleware::from_fn(layers::json_only))
        .layer(middleware::from_fn_with_state(
            server.clone(),
            layers::authorize,
        ))
        .layer(middleware::from_fn(layers::page))
        .layer(middleware::from_fn_with_state(
            server.clone(),
            layers::host_and_origin,
        ))
        .with_state(server)
}

/// Serves one request of a connection from `peer` through `router`: the
/// peer's address for the handlers (per-client run caps), the path as
/// sent for the page and the error messages, and the path without
/// repeated or trailing slashes for the router.
pub(crate) async fn dispatch<B>(
    mut router: Router,
    peer: SocketAddr,
    request: Request<B>,
) -> Response
where
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(ConnectInfo(peer));
    parts.extensions.insert(OriginalUri(parts.uri.clone()));
    if let Some(uri) = trimmed(&parts.uri) {
        parts.uri = uri;
    }
    match router.call(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// `uri` with the slashes around its path trimmed to one in front, when
/// that changes it: the API's paths were always matched so.
fn trimmed(uri: &Uri) -> Option<Uri> {
    let path = uri.path();
    let inner = path.trim_matches('/');
    if path.len() == inner.len() + 1 || path == "/" {
        return None;
    }
    let mut parts = uri.clone().into_parts();
    let trimmed = match uri.query() {
        Some(query) => format!("/{inner}?{query}"),
        None => format!("/{inner}"),
    };
    parts.path_and_query = Some(PathAndQuery::try_from(trimmed).ok()?);
    Uri::from_parts(parts).ok()
}

/// A path's parameters (an agent's name, a run's id), refused in the
/// API's error shape when they do not decode.
struct Params<T>(T);

impl<T: DeserializeOwned + Send> FromRequestParts<Arc<Server>> for Params<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, server: &Arc<Server>) -> Result<Self, Response> {
        match Path::<T>::from_request_parts(parts, server).await {
            Ok(Path(params)) => Ok(Self(params)),
            Err(rejection) => Err(error(StatusCode::BAD_REQUEST, rejection.body_text())),
        }
    }
}

/// The client's address, which the per-client run cap counts by.
type Peer = ConnectInfo<SocketAddr>;

async fn not_found(OriginalUri(uri): OriginalUri) -> Response {
    error(StatusCode::NOT_FOUND, format!("nothing at {}", uri.path()))
}

async fn method_not_allowed(method: Method, OriginalUri(uri): OriginalUri) -> Response {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

/// `GET /v1/health` with the token: each actor's state.
async fn health_report(State(server): State<Arc<Server>>) -> Response {
    let (status, body) = health::report(&server.api, true).await;
    json_response(status, &body)
}

/// `POST /v1/agents/{agent}/runs`.
async fn start_run(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): Peer,
    Params(agent): Params<String>,
    JsonBody(body): JsonBody<RunBody>,
) -> Response {
    runs::start_run(&server, peer.ip(), &agent, body).await
}

/// `GET /v1/approvals`.
async fn all_approvals(State(server): State<Arc<Server>>) -> Response {
    list_approvals(&server, None).await
}

/// `GET /v1/agents/{agent}/runs/{run}/approvals`.
async fn run_approvals(
    State(server): State<Arc<Server>>,
    Params((agent, run)): Params<(String, String)>,
) -> Response {
    match find_run(&server, &agent, &run) {
        Ok(run) => list_approvals(&server, Some(&run)).await,
        // A run of the last process that waits for an answer.
        Err((StatusCode::NOT_FOUND, _)) if stored_run_of(&server, &agent, &run).await => {
            list_approvals(&server, Some(&run.to_ascii_lowercase())).await
        }
        Err((status, message)) => error(status, message),
    }
}

/// `POST /v1/agents/{agent}/runs/{run}/approvals/{approval}`. The run is
/// looked up before the body counts: an answer for a run that is not
/// there is a `404` whatever its body.
async fn decide(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): Peer,
    Params((agent, run, approval)): Params<(String, String, String)>,
    body: Result<JsonBody<DecisionBody>, Response>,
) -> Response {
    let found = find_run(&server, &agent, &run);
    let stored = matches!(&found, Err((StatusCode::NOT_FOUND, _)))
        && stored_run_of(&server, &agent, &run).await;
    let run = match found {
        Ok(run) => run,
        Err(_) if stored => run.to_ascii_lowercase(),
        Err((status, message)) => return error(status, message),
    };
    let body = match body {
        Ok(JsonBody(body)) => body,
        Err(response) => return response,
    };
    if stored {
        let answer = body.answer();
        return match sessions::decide_stored(&server, peer.ip(), &agent, &run, &approval, &answer)
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
    answer_live(&server, &run, &approval, body)
}

/// `POST /v1/sessions`.
async fn create_session(
    State(server): State<Arc<Server>>,
    JsonBody(body): JsonBody<SessionBody>,
) -> Response {
    sessions::create(&server, body).await
}

/// `GET /v1/sessions`.
async fn list_sessions(State(server): State<Arc<Server>>) -> Response {
    sessions::list(&server).await
}

/// `GET /v1/sessions/{session}`.
async fn read_session(State(server): State<Arc<Server>>, Params(id): Params<String>) -> Response {
    sessions::read(&server, &id).await
}

/// `DELETE /v1/sessions/{session}`.
async fn delete_session(State(server): State<Arc<Server>>, Params(id): Params<String>) -> Response {
    sessions::delete(&server, &id).await
}

/// `POST /v1/sessions/{session}/runs`.
async fn continue_session(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): Peer,
    Params(id): Params<String>,
    JsonBody(body): JsonBody<ContinueBody>,
) -> Response {
    sessions::continue_session(&server, peer.ip(), &id, body).await
}

/// `GET /v1/runs/{run}/events`, after the `Last-Event-ID` a client sends.
async fn run_events(
    State(server): State<Arc<Server>>,
    Params(run): Params<String>,
    headers: HeaderMap,
) -> Response {
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    sessions::events(&server, &run, last).await
}

/// `GET /v1/models`.
async fn models(State(server): State<Arc<Server>>) -> Response {
    openai::models(&server.api)
}

/// `GET /v1/models/{model}`.
async fn model(State(server): State<Arc<Server>>, Params(name): Params<String>) -> Response {
    openai::model(&server.api, &name)
}

/// `POST /v1/chat/completions`: its body's problems are answered in the
/// OpenAI error shape, so the handler takes them as they come.
async fn chat_completions(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    body: Result<JsonBody<Map<String, Value>>, Response>,
) -> Response {
    let body = body.map(|JsonBody(fields)| fields);
    openai::chat_completions(&server, peer.ip(), &headers, body).await
}

/// `POST /v1/agents/{agent}/runs/{run}/stop`.
async fn stop_run(
    State(server): State<Arc<Server>>,
    Params((agent, run)): Params<(String, String)>,
) -> Response {
    stop(&server, &agent, &run).await
}

/// `PUT /v1/agents/{agent}/provider`.
async fn swap(
    State(server): State<Arc<Server>>,
    Params(agent): Params<String>,
    JsonBody(body): JsonBody<SwapBody>,
) -> Response {
    swap_provider(&server.api, &agent, body).await
}

/// `GET /v1/agents`: the agents where requests start (no hosted agent
/// delegates to them) first, then those only other agents call, then the
/// agents of other nodes; each group in the runtime's order (by name).
/// With them, the config's providers, the choices of
/// `PUT /v1/agents/{agent}/provider`.
async fn list_agents(State(server): State<Arc<Server>>) -> Response {
    let api = &server.api;
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

/// The public id of a run of agent `name` this server has streaming, or
/// the status and message that say why there is none.
fn find_run(server: &Server, name: &str, run: &str) -> Result<String, (StatusCode, String)> {
    if server.api.agent(name).is_none() {
        return Err((
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        ));
    }
    if !is_id(run) {
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
async fn list_approvals(server: &Server, run: Option<&str>) -> Response {
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

/// Answers a question of a run this process drives.
fn answer_live(server: &Server, run: &str, approval: &str, body: DecisionBody) -> Response {
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

async fn stop(server: &Server, name: &str, run: &str) -> Response {
    let Some(agent) = server.api.agent(name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        );
    };
    if !is_id(run) {
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

async fn swap_provider(api: &Api, name: &str, body: SwapBody) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::header::{ALLOW, AUTHORIZATION, CONTENT_TYPE, HOST};
    use wma_config::server::{ServerOptions, TokenSource};
    use wma_config::{Config, StartOptions};

    const TOKEN: &str = "7c1f0e9a3b5d2c8e4f6a0b1c9d8e7f6a5b4c3d2e";

    const CONFIG: &str = r#"
[providers.main]
kind = "scripted"
model = "main-model"
replies = ["Hello."]

[agents.main]
description = "Talks to the person."
provider = "main"
"#;

    /// The router over a scripted agent, and a request sender that passes
    /// the Host check and, with `token`, the token check.
    async fn router() -> (Router, wma_config::Hosted) {
        let config = Config::parse(CONFIG, "router-test.toml").unwrap();
        let hosted = config.start(StartOptions::default()).await.unwrap();
        let api = Api::hosted(config, &hosted).unwrap();
        let options = ServerOptions {
            token: TokenSource::Given(TOKEN.to_string()),
            ..ServerOptions::default()
        };
        let token = crate::token::Token::parse(TOKEN).unwrap();
        let listen = "127.0.0.1:8080".parse().unwrap();
        let server = Arc::new(Server::new(api, token, listen, options));
        (super::router(server), hosted)
    }

    async fn send(
        router: &Router,
        method: Method,
        path: &str,
        token: bool,
        body: Option<(&str, &str)>,
    ) -> (StatusCode, HeaderMap, Value) {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, "127.0.0.1:8080");
        if token {
            request = request.header(AUTHORIZATION, format!("Bearer {TOKEN}"));
        }
        let body = match body {
            Some((media, text)) => {
                request = request.header(CONTENT_TYPE, media);
                Body::from(text.to_string())
            }
            None => Body::empty(),
        };
        let peer = "127.0.0.1:50000".parse().unwrap();
        let response = dispatch(router.clone(), peer, request.body(body).unwrap()).await;
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (parts.status, parts.headers, value)
    }

    #[tokio::test]
    async fn wrong_methods_and_unknown_paths_are_answered_in_the_error_shape_behind_the_guards() {
        let (router, hosted) = router().await;
        let (status, headers, body) = send(&router, Method::DELETE, "/v1/agents", true, None).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(body["error"], "DELETE is not allowed on /v1/agents");
        assert!(headers[ALLOW].to_str().unwrap().contains("GET"));
        // Without the token, a wrong method learns nothing about the path.
        let (status, _, _) = send(&router, Method::DELETE, "/v1/agents", false, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, _, body) = send(&router, Method::GET, "/v1/nothing/", true, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"], "nothing at /v1/nothing/");
        // Slashes around a path are tolerated, as they always were.
        let (status, _, body) = send(&router, Method::GET, "/v1/agents/", true, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["agents"][0]["name"], "main");
        // Segments are percent-decoded; a GET path answers HEAD, bodiless.
        let (status, _, body) = send(&router, Method::GET, "/v1/models/ma%69n", true, None).await;
        assert_eq!((status, &body["id"]), (StatusCode::OK, &json!("main")));
        let (status, _, body) = send(&router, Method::HEAD, "/v1/agents", true, None).await;
        assert_eq!((status, body), (StatusCode::OK, Value::Null));
        // A body that is not JSON is refused before the route is looked at.
        let text = Some(("text/plain", "{}"));
        let (status, _, _) = send(&router, Method::POST, "/v1/nothing", true, text).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let json = Some(("application/json", "[]"));
        let (status, _, body) =
            send(&router, Method::POST, "/v1/agents/main/runs", true, json).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("must be a JSON object")
        );
        // The page needs no token; a bare health check says only the status.
        let (status, _, _) = send(&router, Method::GET, "/", false, None).await;
        assert_eq!(status, StatusCode::OK);
        let (status, _, body) = send(&router, Method::GET, "/v1/health", false, None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body, json!({"status": "ok"}));
        hosted.shutdown().await;
    }

    #[tokio::test]
    async fn a_runs_events_are_written_as_before_one_data_line_each() {
        let (router, hosted) = router().await;
        let request = Request::post("/v1/agents/main/runs")
            .header(HOST, "127.0.0.1:8080")
            .header(AUTHORIZATION, format!("Bearer {TOKEN}"))
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"input": "Hi"}"#))
            .unwrap();
        let peer = "127.0.0.1:50000".parse().unwrap();
        let response = dispatch(router, peer, request).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        assert_eq!(response.headers()["cache-control"], "no-cache");
        let id = response.headers()[crate::reply::RUN_ID_HEADER]
            .to_str()
            .unwrap()
            .to_string();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let first = format!("event: run\ndata: {{\"agent\":\"main\",\"run_id\":\"{id}\"}}\n\n");
        assert!(text.starts_with(&first), "{text}");
        let events: Vec<&str> = text.trim_end().split("\n\n").collect();
        for event in &events[1..] {
            let lines: Vec<&str> = event.lines().collect();
            assert_eq!(lines.len(), 2, "{event}");
            assert_eq!(lines[0], "event: part");
            assert!(lines[1].starts_with("data: {"), "{event}");
        }
        assert!(
            events.last().unwrap().contains(r#""type":"finish""#),
            "{text}"
        );
        hosted.shutdown().await;
    }

    #[test]
    fn slashes_around_a_path_are_trimmed_and_the_rest_is_kept() {
        let trim = |uri: &str| trimmed(&uri.parse().unwrap()).map(|u| u.to_string());
        assert_eq!(trim("/v1/agents"), None);
        assert_eq!(trim("/"), None);
        assert_eq!(trim("/v1/agents/"), Some("/v1/agents".to_string()));
        assert_eq!(
            trim("//v1/health//?full=1"),
            Some("/v1/health?full=1".to_string())
        );
        // An absolute request target keeps its authority for the Host check.
        assert_eq!(
            trim("http://127.0.0.1:8080/v1/agents/"),
            Some("http://127.0.0.1:8080/v1/agents".to_string())
        );
    }
}
