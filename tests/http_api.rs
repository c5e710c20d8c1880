//! The HTTP API of `wma serve`, end to end with a real HTTP client: start a
//! run and read its parts as server-sent events, stop a run, swap a model,
//! list agents, health, and the errors; and the guards that let only the
//! operator in: the token, the Host and Origin checks, JSON bodies, the
//! header timeout, the caps (a flood of idle connections cannot keep a new
//! client out), unguessable run ids, and accept errors.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{AgentStreamPart, FinishReason};
use webmcp_agents::config::{Config, StartOptions};
use webmcp_agents::runtime::TaggedPart;
use webmcp_agents::serve::{self, RUN_ID_HEADER, ServerOptions, TokenOrigin, TokenSource};

// Approvals over HTTP, through the runtime and the command line share this
// file's server helpers.
#[path = "approvals.rs"]
mod approvals;

/// The token the in-process servers are given.
const TOKEN: &str = "test-token-0123456789abcdef0123456789abcdef";

/// How long a test waits for something that must happen before it calls
/// it a hang. Not a measure of speed: the checks pass as soon as it happens.
const HANG: Duration = Duration::from_secs(30);

const CONFIG: &str = r#"
[providers.main]
kind = "scripted"
model = "main-model"
replies = ['{"name": "greeter", "arguments": {"task": "Say hello"}}', "It says: Hello there."]

[providers.greeter]
kind = "scripted"
model = "greeter-model"
replies = ["Hello there."]

[providers.slow]
kind = "scripted"
model = "slow-model"
replies = ["Too late.", "Too late.", "Too late."]
delay_ms = 600000

[providers.fresh]
kind = "scripted"
model = "fresh-model"
replies = ["Hello from the new model."]

[tools.shop]
kind = "demo-shop"

[agents.main]
description = "Talks to the person."
provider = "main"
sub_agents = ["greeter"]

[agents.greeter]
description = "Says hello."
provider = "greeter"

[agents.sleeper]
description = "Takes its time."
provider = "slow"
"#;

/// Reads server-sent events off a streaming response.
struct Events {
    response: Response,
    buffer: String,
}

impl Events {
    fn new(response: Response) -> Self {
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event's name and data, or `None` when the stream ended.
    async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let mut name = String::new();
                let mut data = String::new();
                for line in event.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        name = v.to_string();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                return Some((
                    name,
                    serde_json::from_str(&data).expect("event data is JSON"),
                ));
            }
            let chunk = self.response.chunk().await.expect("the stream reads")?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// The next part (every event after the first is one).
    async fn next_part(&mut self) -> Option<TaggedPart> {
        let (name, data) = self.next().await?;
        assert_eq!(name, "part");
        Some(serde_json::from_value(data).expect("a part parses as a tagged part"))
    }

    async fn rest(&mut self) -> Vec<TaggedPart> {
        let mut parts = Vec::new();
        while let Some(part) = self.next_part().await {
            parts.push(part);
        }
        parts
    }
}

struct Server {
    addr: std::net::SocketAddr,
    base: String,
    /// Sends the token with every request.
    client: Client,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    hosted: webmcp_agents::config::Hosted,
}

/// The options the tests' servers start from: the test token.
fn options() -> ServerOptions {
    ServerOptions {
        token: TokenSource::Given(TOKEN.to_string()),
        ..ServerOptions::default()
    }
}

/// A client that sends `token` with every request.
fn client_with(token: &str) -> Client {
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    Client::builder().default_headers(headers).build().unwrap()
}

impl Server {
    async fn start() -> Self {
        Self::start_with(options()).await
    }

    async fn start_with(options: ServerOptions) -> Self {
        let config = Config::parse(CONFIG, "http-test.toml").unwrap();
        let hosted = config.start(StartOptions::default()).await.unwrap();
        let api = serve::Api::hosted(config, &hosted).unwrap();
        let stop = CancellationToken::new();
        let started = serve::start_with("127.0.0.1:0".parse().unwrap(), api, options, stop.clone())
            .await
            .unwrap();
        let addr = started.addr;
        assert!(addr.ip().is_loopback());
        Self {
            addr,
            base: format!("http://{addr}/v1"),
            client: client_with(started.token.as_str()),
            stop,
            task: started.task,
            hosted,
        }
    }

    /// The status line of a request written by hand (for headers that an
    /// HTTP client sets itself, like `Host`).
    async fn raw_status(&self, request: &str) -> String {
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut buffer = [0u8; 1024];
        while !answer.windows(2).any(|w| w == b"\r\n") {
            let n = tokio::time::timeout(HANG, stream.read(&mut buffer))
                .await
                .expect("the server answers")
                .unwrap();
            assert!(n > 0, "the server closed without answering");
            answer.extend_from_slice(&buffer[..n]);
        }
        let text = String::from_utf8_lossy(&answer);
        text.lines().next().unwrap().to_string()
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        json_of(response).await
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Value) -> Response {
        self.client
            .request(method, format!("{}{path}", self.base))
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }

    /// Starts a run; returns its id and its event stream, past the `run` event.
    async fn start_run(&self, agent: &str, input: &str) -> (String, Events) {
        let response = self
            .send(
                reqwest::Method::POST,
                &format!("/agents/{agent}/runs"),
                json!({"input": input}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[CONTENT_TYPE].to_str().unwrap(),
            "text/event-stream"
        );
        let id = response.headers()[RUN_ID_HEADER]
            .to_str()
            .unwrap()
            .to_string();
        let mut events = Events::new(response);
        let (name, data) = events.next().await.unwrap();
        assert_eq!(name, "run");
        assert_eq!(data, json!({"agent": agent, "run_id": id}));
        (id, events)
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
        self.hosted.shutdown().await;
    }
}

async fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn finish(reason: FinishReason) -> AgentStreamPart {
    AgentStreamPart::Finish { reason }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_stream_as_events_can_be_stopped_and_their_model_swapped() {
    let server = Server::start().await;

    let (status, health) = server.get("/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["status"], "ok");
    assert_eq!(health["agents"], 3);
    let actors = &health["actors"];
    assert_eq!(actors["agents"].as_array().unwrap().len(), 3);
    assert!(
        actors["agents"]
            .as_array()
            .unwrap()
            .iter()
            .chain(actors["providers"].as_array().unwrap())
            .all(|a| a["state"] == "serving"),
        "{health}"
    );
    assert!(
        actors["providers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "slow")
    );
    let sources = health["tool_sources"].as_array().unwrap();
    assert_eq!(sources.len(), 1, "{health}");
    assert_eq!(sources[0]["source"], "shop");
    assert_eq!(sources[0]["restarts"], 0);

    let (status, listing) = server.get("/agents").await;
    assert_eq!(status, StatusCode::OK);
    let agents = listing["agents"].as_array().unwrap();
    let main = agents.iter().find(|a| a["name"] == "main").unwrap();
    assert_eq!(main["sub_agents"], json!(["greeter"]));
    assert_eq!(main["model"], "main-model");
    assert_eq!(main["provider"], "main");
    assert_eq!(agents.len(), 3);

    // A run that delegates: the greeter's parts arrive tagged, in the same stream.
    let (_, mut events) = server.start_run("main", "Get a greeting").await;
    let parts = events.rest().await;
    assert_eq!(parts.last().unwrap().agent, "main");
    assert_eq!(parts.last().unwrap().part, finish(FinishReason::Stop));
    let greeter: Vec<&TaggedPart> = parts.iter().filter(|p| p.agent == "greeter").collect();
    assert!(!greeter.is_empty() && greeter.iter().all(|p| p.depth == 1));
    assert!(parts.iter().any(|p| p.agent == "main"
        && p.part
            == AgentStreamPart::ToolResult {
                call_id: "call_1_1".to_string(),
                name: "greeter".to_string(),
                output: "Hello there.".to_string(),
            }));
    assert!(parts.iter().any(|p| p.part
        == AgentStreamPart::Text {
            text: "It says: Hello there.".to_string()
        }));

    // Stop: the slow agent's run ends aborted, and its stream closes.
    let (id, mut events) = server.start_run("sleeper", "Take your time").await;
    let first = events.next_part().await.unwrap();
    assert_eq!(first.part, AgentStreamPart::MessageStart { step: 1 });
    let response = server
        .send(
            reqwest::Method::POST,
            &format!("/agents/sleeper/runs/{id}/stop"),
            json!({}),
        )
        .await;
    assert_eq!(
        json_of(response).await,
        (StatusCode::OK, json!({"stopped": true}))
    );
    let rest = events.rest().await;
    assert_eq!(rest.last().unwrap().part, finish(FinishReason::Aborted));
    // Stopping it again finds nothing running.
    let response = server
        .send(
            reqwest::Method::POST,
            &format!("/agents/sleeper/runs/{id}/stop"),
            json!({}),
        )
        .await;
    assert_eq!(
        json_of(response).await,
        (StatusCode::OK, json!({"stopped": false}))
    );

    // Swap: the sleeper's provider loads another model of the config.
    let response = server
        .send(
            reqwest::Method::PUT,
            "/agents/sleeper/provider",
            json!({"provider": "fresh"}),
        )
        .await;
    let (status, swapped) = json_of(response).await;
    assert_eq!(status, StatusCode::OK, "{swapped}");
    assert_eq!(swapped["model"], "fresh-model");
    assert_eq!(swapped["agents"], json!(["sleeper"]));
    let (_, listing) = server.get("/agents").await;
    let sleeper = listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "sleeper")
        .cloned()
        .unwrap();
    assert_eq!(sleeper["model"], "fresh-model");
    let (_, mut events) = server.start_run("sleeper", "Say something").await;
    let parts = events.rest().await;
    assert!(
        parts.iter().any(|p| p.part
            == AgentStreamPart::Text {
                text: "Hello from the new model.".to_string()
            }),
        "{parts:#?}"
    );
    assert_eq!(parts.last().unwrap().part, finish(FinishReason::Stop));

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistakes_get_the_status_that_says_what_went_wrong() {
    let server = Server::start().await;
    let post = reqwest::Method::POST;

    let response = server
        .send(post.clone(), "/agents/nobody/runs", json!({"input": "Hi"}))
        .await;
    let (status, body) = json_of(response).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "there is no agent named `nobody`");

    let response = server
        .send(post.clone(), "/agents/main/runs", json!({"text": "Hi"}))
        .await;
    let (status, body) = json_of(response).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `text`")
    );

    let response = server
        .send(post.clone(), "/agents/main/runs", json!({}))
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    // An empty request starts no run: a model given nothing to do does
    // whatever its tools suggest.
    for body in [
        json!({"input": ""}),
        json!({"input": " \n\t "}),
        json!({"messages": [{"role": "user", "content": ""}]}),
    ] {
        let response = server
            .send(post.clone(), "/agents/main/runs", body.clone())
            .await;
        let (status, answer) = json_of(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(
            answer["error"], "the request is empty: say what the agent should do",
            "{body}"
        );
    }

    let response = server
        .send(post.clone(), "/agents/main/runs/abc/stop", json!({}))
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    let response = server
        .send(
            reqwest::Method::PUT,
            "/agents/main/provider",
            json!({"provider": "gpt"}),
        )
        .await;
    let (status, body) = json_of(response).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"], "the config has no provider named `gpt`");

    let (status, _) = server.get("/nothing/here").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let response = server
        .send(reqwest::Method::DELETE, "/agents", json!({}))
        .await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);

    server.stop().await;
}

/// A request with a JSON body, sent without the test client's token.
async fn post_json(client: &Client, url: &str, body: &Value) -> Response {
    client
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_requests_with_the_token_get_in() {
    let server = Server::start().await;
    let runs = format!("{}/agents/main/runs", server.base);
    let body = json!({"input": "Get a greeting"});

    let response = post_json(&Client::new(), &runs, &body).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let response = post_json(&client_with(&TOKEN.replace('0', "1")), &runs, &body).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let response = Client::new()
        .get(format!("{}/agents", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        server.hosted.runtime.agent("main").unwrap().active_runs(),
        0
    );

    // A bare health check learns whether the host serves, and nothing more.
    let response = Client::new()
        .get(format!("{}/health", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_of(response).await,
        (StatusCode::OK, json!({"status": "ok"}))
    );
    // A wrong token is refused there too rather than read as none.
    let response = client_with(&TOKEN.replace('0', "1"))
        .get(format!("{}/health", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_of_other_origins_are_refused_and_allowed_ones_get_cors() {
    let allowed = "http://app.localhost:3000";
    let server = Server::start_with(ServerOptions {
        allowed_origins: vec![allowed.to_string()],
        ..options()
    })
    .await;
    let runs = format!("{}/agents/main/runs", server.base);

    // What a form or `fetch(..., {mode: "no-cors"})` on any site can send:
    // a text/plain POST. Refused for its origin, even with the token, and
    // no run starts.
    let response = server
        .client
        .post(&runs)
        .header("origin", "https://evil.example")
        .header(CONTENT_TYPE, "text/plain")
        .body(r#"{"input": "Get a greeting"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(
        !response
            .headers()
            .contains_key("access-control-allow-origin")
    );
    assert_eq!(
        server.hosted.runtime.agent("main").unwrap().active_runs(),
        0
    );
    let response = server
        .client
        .get(format!("{}/agents", server.base))
        .header("origin", "null")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);

    // An allowed origin's preflight and request get CORS headers.
    let response = server
        .client
        .request(reqwest::Method::OPTIONS, &runs)
        .header("origin", allowed)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(response.headers()["access-control-allow-origin"], allowed);
    let response = server
        .client
        .get(format!("{}/agents", server.base))
        .header("origin", allowed)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["access-control-allow-origin"], allowed);
    // Without an Origin (curl, scripts) no CORS headers are sent.
    let response = server
        .client
        .get(format!("{}/agents", server.base))
        .send()
        .await
        .unwrap();
    assert!(
        !response
            .headers()
            .contains_key("access-control-allow-origin")
    );

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebound_host_name_is_refused() {
    let server = Server::start().await;
    let port = server.addr.port();
    let request = |host: &str| {
        format!(
            "GET /v1/agents HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        )
    };
    // evil.example now resolves to 127.0.0.1: its page reaches the port,
    // and its requests say so in Host.
    let status = server
        .raw_status(&request(&format!("evil.example:{port}")))
        .await;
    assert!(status.starts_with("HTTP/1.1 403"), "{status}");
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let status = server.raw_status(&request(&host)).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{host}: {status}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_two_hosts_or_two_origins_is_refused() {
    let server = Server::start().await;
    let port = server.addr.port();
    let own = format!("127.0.0.1:{port}");
    let request = |extra: &str| {
        format!(
            "GET /v1/agents HTTP/1.1\r\n{extra}Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        )
    };
    // Either order: which one a reader takes must not matter.
    for extra in [
        format!("Host: {own}\r\nHost: evil.example\r\n"),
        format!("Host: evil.example\r\nHost: {own}\r\n"),
        format!("Host: {own}\r\nHost: {own}\r\n"),
        format!("Host: {own}\r\nOrigin: http://{own}\r\nOrigin: http://evil.example\r\n"),
    ] {
        let status = server.raw_status(&request(&extra)).await;
        assert!(status.starts_with("HTTP/1.1 400"), "{extra:?}: {status}");
    }
    let status = server
        .raw_status(&request(&format!(
            "Host: {own}\r\nOrigin: http://{own}\r\n"
        )))
        .await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_must_be_json_and_within_the_cap() {
    let server = Server::start_with(ServerOptions {
        max_body_bytes: 256,
        ..options()
    })
    .await;
    let runs = format!("{}/agents/main/runs", server.base);
    let response = server
        .client
        .post(&runs)
        .header(CONTENT_TYPE, "text/plain")
        .body(r#"{"input": "Get a greeting"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let response = server
        .client
        .post(&runs)
        .body(r#"{"input": "Get a greeting"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        server.hosted.runtime.agent("main").unwrap().active_runs(),
        0
    );

    let response = post_json(&server.client, &runs, &json!({"input": "x".repeat(300)})).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    let server = Server::start_with(ServerOptions {
        header_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(3600),
        ..options()
    })
    .await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    // A byte at a time, never the blank line that ends the head: each byte
    // is progress, but the head as a whole has its time limit.
    let dribble = tokio::spawn(async move {
        for byte in b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
            .iter()
            .cycle()
        {
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let mut buffer = [0u8; 256];
    let read = tokio::time::timeout(HANG, reader.read(&mut buffer))
        .await
        .expect("the server closes a connection whose head does not end");
    // Closed (EOF or reset), without an answer.
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    dribble.abort();

    // The server itself serves on.
    assert_eq!(server.get("/health").await.0, StatusCode::OK);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_ids_cannot_be_guessed_and_a_client_has_a_run_cap() {
    let server = Server::start_with(ServerOptions {
        max_runs_per_client: 2,
        ..options()
    })
    .await;
    let (first, mut first_events) = server.start_run("sleeper", "Take your time").await;
    let (second, _second_events) = server.start_run("sleeper", "Take yours too").await;
    for id in [&first, &second] {
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }
    let (a, b) = (
        u128::from_str_radix(&first, 16).unwrap(),
        u128::from_str_radix(&second, 16).unwrap(),
    );
    assert!(a.abs_diff(b) > 1_000_000, "{first} and {second} are close");

    // The ids a counter would give out stop nothing.
    for guess in 0..=3u128 {
        let response = server
            .send(
                reqwest::Method::POST,
                &format!("/agents/sleeper/runs/{guess:032x}/stop"),
                json!({}),
            )
            .await;
        assert_eq!(
            json_of(response).await,
            (StatusCode::OK, json!({"stopped": false}))
        );
    }
    assert_eq!(
        server
            .hosted
            .runtime
            .agent("sleeper")
            .unwrap()
            .active_runs(),
        2
    );

    // A third run of this client waits for one of its two to end.
    let response = server
        .send(
            reqwest::Method::POST,
            "/agents/sleeper/runs",
            json!({"input": "And one more"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);

    let response = server
        .send(
            reqwest::Method::POST,
            &format!("/agents/sleeper/runs/{first}/stop"),
            json!({}),
        )
        .await;
    assert_eq!(
        json_of(response).await,
        (StatusCode::OK, json!({"stopped": true}))
    );
    assert_eq!(
        first_events.rest().await.last().unwrap().part,
        finish(FinishReason::Aborted)
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed() {
    let server = Server::start_with(ServerOptions {
        idle_timeout: Duration::from_millis(300),
        ..options()
    })
    .await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        server.addr.port()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    // The answer comes, the connection stays open for a next request
    // (HTTP/1.1 keeps it alive), and then closes for want of one.
    let mut answer = Vec::new();
    tokio::time::timeout(HANG, stream.read_to_end(&mut answer))
        .await
        .expect("the server closes an idle connection")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_unavailable_once_the_actors_are_gone() {
    let server = Server::start().await;
    assert_eq!(server.get("/health").await.0, StatusCode::OK);
    let Server {
        base,
        client,
        stop,
        task,
        hosted,
        ..
    } = server;
    hosted.shutdown().await;
    let response = client.get(format!("{base}/health")).send().await.unwrap();
    let (status, health) = json_of(response).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{health}");
    assert_eq!(health["status"], "unavailable");
    let agents = health["actors"]["agents"].as_array().unwrap();
    assert!(agents.iter().all(|a| a["state"] == "given_up"), "{health}");
    // The bare check says the same.
    let response = Client::new()
        .get(format!("{base}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        json_of(response).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unavailable"})
        )
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// Opens `count` connections that hold a slot without a request in
/// progress, as a flood does: silent ones, ones that sent part of a head
/// and stop there (slowloris), and kept-alive ones that were answered once
/// and send nothing more. Gives a receiver that gets one message per
/// flooding connection the server closes.
async fn flood(
    addr: std::net::SocketAddr,
    count: usize,
) -> tokio::sync::mpsc::UnboundedReceiver<()> {
    let (closed, closes) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..count {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        match i % 3 {
            0 => {}
            1 => stream
                .write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                .await
                .unwrap(),
            _ => stream
                .write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .await
                .unwrap(),
        }
        let closed = closed.clone();
        tokio::spawn(async move {
            // Whatever it was answered, read until the server closes it.
            let mut buffer = [0u8; 1024];
            while let Ok(n) = stream.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
            }
            let _ = closed.send(());
            // Kept open on this side until the test ends.
            std::future::pending::<()>().await;
        });
    }
    closes
}

/// Waits (up to [`HANG`]) until `closes` has counted `count` closed
/// connections in all.
async fn closed_connections(
    closes: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
    seen: &mut usize,
    count: usize,
) {
    tokio::time::timeout(HANG, async {
        while *seen < count {
            closes.recv().await.expect("the flood's watchers run");
            *seen += 1;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{seen} of {count} flooding connections were closed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_cannot_keep_a_new_client_out() {
    const CAP: usize = 8;
    let server = Server::start_with(ServerOptions {
        max_connections: CAP,
        // No timeout cuts the flood short: only the cap's rule can help.
        header_timeout: Duration::from_secs(3600),
        idle_timeout: Duration::from_secs(3600),
        ..options()
    })
    .await;
    // Three times the cap, from this machine, as the new client is.
    let flooding = 3 * CAP;
    let mut closes = flood(server.addr, flooding).await;
    let mut seen = 0;
    // Every connection beyond the cap took the place of an older flooding
    // one: the server accepted them all and is full of the flood.
    closed_connections(&mut closes, &mut seen, flooding - CAP).await;

    // A new client (no pooled connection) is answered all the same.
    for _ in 0..3 {
        let response = Client::new()
            .get(format!("{}/health", server.base))
            .timeout(HANG)
            .send()
            .await
            .expect("a new client is answered under the flood");
        assert_eq!(
            json_of(response).await,
            (StatusCode::OK, json!({"status": "ok"}))
        );
    }
    // The first new client found the server full and closed one more
    // flooding connection (the one idle longest) to get in; the later ones
    // may have found the slot the one before freed when it left.
    closed_connections(&mut closes, &mut seen, flooding - CAP + 1).await;
    // And a client with a token gets the full answer too.
    assert_eq!(server.get("/health").await.0, StatusCode::OK);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_gets_503_when_every_slot_has_a_request_in_progress() {
    let server = Server::start_with(ServerOptions {
        max_connections: 1,
        connection_wait: Duration::from_millis(100),
        ..options()
    })
    .await;
    // The only slot streams a run's events: a request in progress, which
    // no new connection may take the place of.
    let (_, events) = server.start_run("sleeper", "Take your time").await;
    let refused = Client::new()
        .get(format!("{}/health", server.base))
        .timeout(HANG)
        .send()
        .await
        .expect("a refused connection is answered, not dropped");
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()["retry-after"], "1");
    let (_, body) = json_of(refused).await;
    assert!(
        body["error"].as_str().unwrap().contains("connections"),
        "{body}"
    );
    assert_eq!(
        server
            .hosted
            .runtime
            .agent("sleeper")
            .unwrap()
            .active_runs(),
        1,
        "the run in progress goes on"
    );

    // Once its stream closes, the slot serves the next client.
    drop(events);
    let served = tokio::time::timeout(HANG, async {
        loop {
            let response = Client::new()
                .get(format!("{}/health", server.base))
                .send()
                .await;
            match response.map(|r| r.status()) {
                Ok(StatusCode::OK) => return,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    assert!(served.is_ok(), "a freed slot is used again");
    server.stop().await;
}

/// One client whose connections all have requests in progress cannot take
/// every slot: past its own cap it is refused, and another client address
/// is still served. (Linux routes all of 127.0.0.0/8 to loopback, so a
/// client bound to 127.0.0.2 is another address on the same machine.)
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_cannot_take_every_slot() {
    let server = Server::start_with(ServerOptions {
        max_connections: 4,
        max_connections_per_client: 2,
        connection_wait: Duration::from_millis(100),
        ..options()
    })
    .await;
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
    );
    let greedy = Client::builder()
        .default_headers(headers)
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let greedy_server = Server {
        client: greedy.clone(),
        ..server
    };
    // Two streams: two connections of 127.0.0.2, each with a request in
    // progress.
    let held = [
        greedy_server.start_run("sleeper", "One").await,
        greedy_server.start_run("sleeper", "Two").await,
    ];
    let third = greedy
        .get(format!("{}/health", greedy_server.base))
        .timeout(HANG)
        .send()
        .await
        .expect("the third connection is answered");
    assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);

    // The other half of the slots is there for everyone else.
    for _ in 0..2 {
        let response = Client::new()
            .get(format!("{}/health", greedy_server.base))
            .timeout(HANG)
            .send()
            .await
            .expect("another client is served");
        assert_eq!(response.status(), StatusCode::OK);
    }
    drop(held);
    greedy_server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_generated_once_into_an_owner_only_file() {
    let dir = crate::support::scratch("http", "token");
    let file = dir.join(serve::TOKEN_FILE_NAME);
    let options = || ServerOptions {
        token: TokenSource::File(file.clone()),
        ..ServerOptions::default()
    };
    let config = Config::parse(CONFIG, "http-test.toml").unwrap();
    let hosted = config.start(StartOptions::default()).await.unwrap();
    let api = serve::Api::new(config, &hosted.runtime).unwrap();
    let stop = CancellationToken::new();
    let addr: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();

    let first = serve::start_with(addr, api.clone(), options(), stop.clone())
        .await
        .unwrap();
    assert_eq!(first.token_origin, TokenOrigin::Generated(file.clone()));
    assert!(first.token_notice().contains(first.token.as_str()));
    assert!(first.token.as_str().len() >= 32);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap().trim(),
        first.token.as_str()
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The next start reads it, and does not print it again.
    let second = serve::start_with(addr, api.clone(), options(), stop.clone())
        .await
        .unwrap();
    assert_eq!(second.token_origin, TokenOrigin::File(file.clone()));
    assert_eq!(second.token.as_str(), first.token.as_str());
    assert!(!second.token_notice().contains(first.token.as_str()));
    let (status, _) = json_of(
        client_with(first.token.as_str())
            .get(format!("http://{}/v1/agents", second.addr))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    // A file others can read is refused rather than trusted.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = serve::start_with(addr, api, options(), stop.clone()).await;
        assert!(refused.unwrap_err().to_string().contains("chmod 600"));
    }

    stop.cancel();
    first.task.await.unwrap().unwrap();
    second.task.await.unwrap().unwrap();
    hosted.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// `wma serve` with few file descriptors: opening more connections than
/// it can accept makes `accept` fail (EMFILE); once they close, it serves
/// again. The server runs as its own process because the descriptor limit
/// is the whole process's.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_survives_running_out_of_file_descriptors() {
    use tokio::io::AsyncBufReadExt;

    let dir = crate::support::scratch("http", "emfile");
    let config = dir.join("serve.toml");
    // The connection caps sit above the descriptor limit: under them the
    // server closes its own oldest silent connection to make room, and
    // whether it runs out of descriptors first would depend on how many
    // the process holds before the first connection (threads, files).
    std::fs::write(
        &config,
        format!("{CONFIG}\n[server]\nmax_connections = 512\nmax_connections_per_client = 512\n"),
    )
    .unwrap();
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(r#"ulimit -n 64 && exec "$0" serve --config "$1" --listen 127.0.0.1:0"#)
        .arg(env!("CARGO_BIN_EXE_wma"))
        .arg(&config)
        .env("WMA_CACHE_DIR", &dir)
        .env("RUST_LOG", "warn");
    let crate::support::Serving {
        mut child,
        addr,
        stdout: _stdout,
        stderr,
    } = crate::support::serve_listening(command, HANG).await;
    let token = std::fs::read_to_string(dir.join(serve::TOKEN_FILE_NAME)).unwrap();
    let mut stderr = tokio::io::BufReader::new(stderr).lines();

    // More connections than 64 descriptors hold; the kernel queues the
    // ones the server cannot accept.
    let mut held = Vec::new();
    for _ in 0..128 {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::timeout(HANG, async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("accepting a connection failed") {
                return;
            }
        }
        panic!("`wma serve` ended");
    })
    .await
    .expect("accepting fails once the descriptors are spent");
    drop(held);

    let response = client_with(token.trim())
        .get(format!("http://{addr}/v1/agents"))
        .timeout(HANG)
        .send()
        .await
        .expect("the server accepts again");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        child.try_wait().unwrap().is_none(),
        "`wma serve` is running"
    );
    child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}
