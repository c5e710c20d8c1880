//! `GET /v1/agents` as the web page reads it, over HTTP against a hosted
//! config: the top-level agents (those no agent delegates to) first, each
//! agent with its provider, the provider's model and whether it is
//! top-level; the config's providers beside them, the unused one included;
//! then a swap through `PUT /v1/agents/{agent}/provider` (what the page's
//! "Load" sends) shown in the next listing, for every agent on that
//! provider, and used by the next run.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use webmcp_agents::config::{Config, StartOptions};
use webmcp_agents::serve::{self, ServerOptions, TokenSource};

const TOKEN: &str = "listing-token-0123456789abcdef0123456789abcdef";

/// How long a test waits for something that must happen before it calls
/// it a hang. Not a measure of speed: the checks pass as soon as it happens.
const HANG: Duration = Duration::from_secs(30);

/// By name the sub-agent comes first and the top-level agents after it;
/// `zeta_lead` and `mid` share the `lead` provider; `fresh` is no agent's.
const CONFIG: &str = r#"
[providers.lead]
kind = "scripted"
model = "lead-model"
replies = ["From the lead model."]

[providers.helper]
kind = "scripted"
model = "helper-model"
replies = ["From the helper model."]

[providers.fresh]
kind = "scripted"
model = "fresh-model"
replies = ["From the fresh model."]

[agents.alpha_helper]
description = "Helps."
provider = "helper"

[agents.zeta_lead]
description = "Talks to the person."
provider = "lead"
sub_agents = ["alpha_helper"]

[agents.mid]
provider = "lead"
"#;

/// A hosted config behind the API, and a client with its token.
struct Host {
    base: String,
    client: Client,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    hosted: webmcp_agents::config::Hosted,
}

impl Host {
    async fn start() -> Self {
        let config = Config::parse(CONFIG, "listing-test.toml").unwrap();
        let hosted = config.start(StartOptions::default()).await.unwrap();
        let api = serve::Api::hosted(config, &hosted).unwrap();
        let stop = CancellationToken::new();
        let options = ServerOptions {
            token: TokenSource::Given(TOKEN.to_string()),
            ..ServerOptions::default()
        };
        let started = serve::start_with("127.0.0.1:0".parse().unwrap(), api, options, stop.clone())
            .await
            .unwrap();
        Self {
            base: format!("http://{}/v1", started.addr),
            client: Client::builder().timeout(HANG).build().unwrap(),
            stop,
            task: started.task,
            hosted,
        }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, String) {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header(AUTHORIZATION, format!("Bearer {TOKEN}"));
        if let Some(body) = body {
            request = request
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    }

    async fn listing(&self) -> Value {
        let (status, text) = self.send(reqwest::Method::GET, "/agents", None).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        serde_json::from_str(&text).unwrap()
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
        self.hosted.shutdown().await;
    }
}

/// Each agent as (name, top-level, provider, loaded, model), in the
/// listing's order.
fn agents(listing: &Value) -> Vec<(String, bool, String, String, String)> {
    listing["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let field = |key: &str| {
                a[key]
                    .as_str()
                    .unwrap_or_else(|| panic!("no `{key}` in {a}"))
                    .to_string()
            };
            (
                field("name"),
                a["top_level"].as_bool().unwrap(),
                field("provider"),
                field("loaded"),
                field("model"),
            )
        })
        .collect()
}

fn row(
    name: &str,
    top: bool,
    provider: &str,
    loaded: &str,
    model: &str,
) -> (String, bool, String, String, String) {
    (
        name.to_string(),
        top,
        provider.to_string(),
        loaded.to_string(),
        model.to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_level_agents_come_first_with_their_models_and_a_swap_shows_in_the_listing() {
    let host = Host::start().await;

    let listing = host.listing().await;
    assert_eq!(
        agents(&listing),
        [
            row("mid", true, "lead", "lead", "lead-model"),
            row("zeta_lead", true, "lead", "lead", "lead-model"),
            row("alpha_helper", false, "helper", "helper", "helper-model"),
        ],
        "{listing:#}"
    );
    assert_eq!(
        listing["providers"],
        json!([
            {"name": "fresh", "kind": "scripted", "model": "fresh-model"},
            {"name": "helper", "kind": "scripted", "model": "helper-model"},
            {"name": "lead", "kind": "scripted", "model": "lead-model"},
        ]),
        "{listing:#}"
    );

    // The page's "Load": the agent's provider now serves `fresh`'s model,
    // for every agent on it.
    let (status, swapped) = host
        .send(
            reqwest::Method::PUT,
            "/agents/zeta_lead/provider",
            Some(json!({"provider": "fresh"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{swapped}");
    let swapped: Value = serde_json::from_str(&swapped).unwrap();
    assert_eq!(swapped["loaded"], "fresh");
    assert_eq!(swapped["model"], "fresh-model");
    assert_eq!(swapped["agents"], json!(["mid", "zeta_lead"]));
    let listing = host.listing().await;
    assert_eq!(
        agents(&listing),
        [
            row("mid", true, "lead", "fresh", "fresh-model"),
            row("zeta_lead", true, "lead", "fresh", "fresh-model"),
            row("alpha_helper", false, "helper", "helper", "helper-model"),
        ],
        "{listing:#}"
    );
    let (status, events) = host
        .send(
            reqwest::Method::POST,
            "/agents/mid/runs",
            Some(json!({"input": "Hello"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{events}");
    assert!(events.contains("From the fresh model."), "{events}");

    // A provider the config does not have is refused, and nothing changes.
    let (status, refused) = host
        .send(
            reqwest::Method::PUT,
            "/agents/alpha_helper/provider",
            Some(json!({"provider": "nowhere"})),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{refused}");
    let listing = host.listing().await;
    assert_eq!(
        agents(&listing)[2],
        row("alpha_helper", false, "helper", "helper", "helper-model")
    );

    host.stop().await;
}
