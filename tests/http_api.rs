//! The HTTP API of `wma serve`, end to end with a real HTTP client: start a
//! run and read its parts as server-sent events, stop a run, swap a model,
//! list agents, health, and the errors.

use reqwest::header::CONTENT_TYPE;
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{AgentStreamPart, FinishReason};
use webmcp_agents::config::{Config, StartOptions};
use webmcp_agents::runtime::TaggedPart;
use webmcp_agents::serve::{self, RUN_ID_HEADER};

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
replies = ["Too late."]
delay_ms = 600000

[providers.fresh]
kind = "scripted"
model = "fresh-model"
replies = ["Hello from the new model."]

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
    base: String,
    client: Client,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    hosted: webmcp_agents::config::Hosted,
}

impl Server {
    async fn start() -> Self {
        let config = Config::parse(CONFIG, "http-test.toml").unwrap();
        let hosted = config.start(StartOptions::default()).await.unwrap();
        let api = serve::Api::new(config, &hosted.runtime).unwrap();
        let stop = CancellationToken::new();
        let (addr, task) = serve::start("127.0.0.1:0".parse().unwrap(), api, stop.clone())
            .await
            .unwrap();
        assert!(addr.ip().is_loopback());
        Self {
            base: format!("http://{addr}/v1"),
            client: Client::new(),
            stop,
            task,
            hosted,
        }
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
    async fn start_run(&self, agent: &str, input: &str) -> (u64, Events) {
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
        let id: u64 = response.headers()[RUN_ID_HEADER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
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
