//! A scripted provider answers every run of `wma serve`, not only the
//! first: each run gets its own pass over the replies (the real binary,
//! over HTTP). The shipped `configs/scripted-team.toml`, whose parent and
//! sub-agents each have a provider of their own, answers two requests in
//! a row the same way; a parent and helper that share one provider do too;
//! a run that needs more replies than the script holds still fails, and
//! the next run answers again.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};

/// How long a test waits for something that must happen before it calls
/// it a hang. Not a measure of speed: the checks pass as soon as it happens.
const HANG: Duration = Duration::from_secs(30);

/// The config the docs suggest for trying `wma serve`.
const SCRIPTED_TEAM: &str = include_str!("../configs/scripted-team.toml");

/// `lead` and `helper` share one provider: its replies are written in the
/// order the team asks for them within one request.
const SHARED: &str = r#"
[providers.team]
kind = "scripted"
replies = [
    '{"name": "helper", "arguments": {"task": "Say hello"}}',
    "Hello there.",
    "The helper says: Hello there.",
]

[providers.short]
kind = "scripted"
replies = ['{"name": "view_cart", "arguments": {}}']

[tools.shop]
kind = "demo-shop"
allow = ["view_cart"]

[agents.lead]
provider = "team"
sub_agents = ["helper"]

[agents.helper]
description = "Says hello."
provider = "team"

[agents.short]
provider = "short"
tools = ["shop"]
"#;

/// A `wma serve` process of the test's own, its token and store in a
/// scratch folder that goes when the test ends.
struct Host {
    /// The `wma serve` process (killed when dropped).
    _child: tokio::process::Child,
    dir: PathBuf,
    base: String,
    token: String,
    client: Client,
}

impl Host {
    async fn start(name: &str, config: &str) -> Self {
        let dir = crate::support::scratch("scripted", name);
        let (child, base, token) = crate::support::serve_config(&dir, config, HANG).await;
        Self {
            base,
            _child: child,
            dir,
            token,
            client: Client::builder().timeout(HANG).build().unwrap(),
        }
    }

    /// Runs `agent` on `input` to its end: its parts, in order.
    async fn run(&self, agent: &str, input: &str) -> Vec<Value> {
        let response = self
            .client
            .post(format!("{}/agents/{agent}/runs", self.base))
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .header(CONTENT_TYPE, "application/json")
            .body(json!({"input": input}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let text = response.text().await.unwrap();
        // Each event: `id:` (with a store), `event:` and one `data:` line.
        text.split("\n\n")
            .filter(|event| event.lines().any(|l| l == "event: part"))
            .map(|event| {
                let data = event
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap_or_else(|| panic!("an event without data: {event:?}"));
                serde_json::from_str(data).unwrap()
            })
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The texts of a run's parts at `depth`, with the agent that wrote each.
fn texts(parts: &[Value], depth: u64) -> Vec<(String, String)> {
    parts
        .iter()
        .filter(|p| p["type"] == "text" && p["depth"] == depth)
        .map(|p| {
            (
                p["agent"].as_str().unwrap().to_string(),
                p["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// How the run ended: its own last part.
fn end(parts: &[Value]) -> &Value {
    parts
        .iter()
        .rfind(|p| p["depth"] == 0)
        .expect("the run has parts of its own")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripted_team_answers_two_runs_in_a_row() {
    let host = Host::start("team", SCRIPTED_TEAM).await;
    for request in [
        "Find a backpack and add it to my cart.",
        "Once more, please.",
    ] {
        let parts = host.run("shopper", request).await;
        assert_eq!(
            texts(&parts, 0),
            [(
                "shopper".to_string(),
                "The Summit 30L Waterproof Backpack (p-17) is in your cart.".to_string()
            )],
            "{parts:#?}"
        );
        assert_eq!(end(&parts)["type"], "finish", "{parts:#?}");
        // Each sub-agent ran its own script to its answer (the words of
        // which the loop's policy may add to).
        let sub_runs: Vec<(&str, &str)> = parts
            .iter()
            .filter(|p| p["depth"] == 1 && p["type"] == "finish")
            .map(|p| (p["agent"].as_str().unwrap(), p["reason"].as_str().unwrap()))
            .collect();
        assert_eq!(
            sub_runs,
            [("catalog_agent", "stop"), ("cart_agent", "stop")],
            "{parts:#?}"
        );
        let tools: Vec<&str> = parts
            .iter()
            .filter(|p| p["depth"] == 1 && p["type"] == "tool-result")
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(tools, ["search_products", "add_to_cart"], "{parts:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_and_helper_on_one_provider_answer_two_runs_in_a_row() {
    let host = Host::start("shared", SHARED).await;
    for _ in 0..2 {
        let parts = host.run("lead", "Greet me through the helper.").await;
        assert_eq!(
            texts(&parts, 1),
            [("helper".to_string(), "Hello there.".to_string())],
            "{parts:#?}"
        );
        assert_eq!(
            texts(&parts, 0),
            [(
                "lead".to_string(),
                "The helper says: Hello there.".to_string()
            )],
            "{parts:#?}"
        );
        assert_eq!(end(&parts)["type"], "finish", "{parts:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_needs_more_replies_than_the_script_holds_fails_and_the_next_runs() {
    let host = Host::start("short", SHARED).await;
    for _ in 0..2 {
        let parts = host.run("short", "What is in my cart?").await;
        let calls: Vec<&Value> = parts
            .iter()
            .filter(|p| p["type"] == "tool-result")
            .collect();
        assert_eq!(calls.len(), 1, "each run calls the tool once: {parts:#?}");
        let end = end(&parts);
        assert_eq!(end["type"], "error", "{parts:#?}");
        assert!(
            end["message"]
                .as_str()
                .unwrap()
                .contains("the script has no more replies"),
            "{end}"
        );
    }
}
