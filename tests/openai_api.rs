//! `wma serve`'s OpenAI chat completions API, end to end through the real
//! binary: the agents listed as models, a completion streamed and not whose
//! content is the agent's answer (scripted providers stand in for models,
//! so the answer is known to the letter), a session kept across two
//! completions, a call that waits for a person's approval through the
//! approvals endpoints, a run that did not answer told apart from one that
//! did, and the errors (unknown model, no token, refused bodies) in the
//! shape OpenAI's clients read; then the same endpoint answered by the
//! `openai` Python package itself (tools/python/clients.txt).

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};
use webmcp_agents::serve::RUN_ID_HEADER;

/// How long a test waits for something that must happen before it calls
/// it a hang. Not a measure of speed: the checks pass as soon as it happens.
const HANG: Duration = Duration::from_secs(30);

const INSTALL_HINT: &str = "run scripts/install-peers.sh (it makes the venv of tools/python/clients.txt with the `openai` package)";

/// The clerk answers two requests, then starts its replies over; the
/// greeter has no answer, so each of its runs fails (the script has no
/// more replies).
const CONFIG: &str = r#"
[providers.clerk]
kind = "scripted"
replies = ["Hello! What can I find for you?", "The Summit 30L is our waterproof backpack."]

[providers.greeter]
kind = "scripted"
replies = []

[agents.clerk]
description = "Helps a person shop."
provider = "clerk"

[agents.greeter]
provider = "greeter"
"#;

fn scratch(name: &str) -> PathBuf {
    crate::support::scratch("openai", name)
}

fn client(token: &str) -> Client {
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    Client::builder()
        .default_headers(headers)
        .timeout(HANG)
        .build()
        .unwrap()
}

async fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

/// A `wma serve` process of the test's own, with its store and token in
/// its scratch folder.
struct Host {
    child: tokio::process::Child,
    dir: PathBuf,
    /// `http://host:port/v1`.
    base: String,
    token: String,
    /// Sends the token.
    client: Client,
}

impl Host {
    async fn start(name: &str, config: &str) -> Self {
        let dir = scratch(name);
        let (child, base, token) = crate::support::serve_config(&dir, config, HANG).await;
        Self {
            child,
            dir,
            base,
            client: client(&token),
            token,
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        json_of(
            self.client
                .get(format!("{}{path}", self.base))
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// `POST /v1/chat/completions` with `body`, and `X-Session-Id` when
    /// given.
    async fn complete(&self, body: &Value, session: Option<&str>) -> Response {
        let mut request = self
            .client
            .post(format!("{}/chat/completions", self.base))
            .json(body);
        if let Some(session) = session {
            request = request.header("x-session-id", session);
        }
        request.send().await.unwrap()
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
        std::fs::remove_dir_all(&self.dir).unwrap();
    }
}

fn header(response: &Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
}

/// The `data:` payloads of a streamed completion, to its end.
async fn data_events(response: Response) -> Vec<String> {
    assert_eq!(
        header(&response, "content-type").as_deref(),
        Some("text/event-stream")
    );
    let text = tokio::time::timeout(HANG, response.text())
        .await
        .expect("the stream ends in time")
        .unwrap();
    let events: Vec<String> = text
        .split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("every event is one `data:` line: {event:?}"))
                .to_string()
        })
        .collect();
    assert!(text.ends_with("\n\n"), "{text:?}");
    events
}

/// The chunks of a streamed completion, after checking that `[DONE]` ends
/// it and nothing else is one.
fn chunks_of(events: &[String]) -> Vec<Value> {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|_| panic!("a chunk is JSON: {e}")))
        .collect()
}

/// The content a streamed completion's chunks add up to, and the finish
/// reasons they gave.
fn streamed_answer(chunks: &[Value]) -> (String, Vec<String>) {
    let mut content = String::new();
    let mut reasons = Vec::new();
    for chunk in chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk", "{chunk}");
        let choice = &chunk["choices"][0];
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        if let Some(reason) = choice["finish_reason"].as_str() {
            reasons.push(reason.to_string());
        }
    }
    (content, reasons)
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_answer_is_a_chat_completion_streamed_or_not() {
    let host = Host::start("answers", CONFIG).await;

    // The token guards these paths as every other.
    let stranger = Client::new()
        .get(format!("{}/models", host.base))
        .send()
        .await
        .unwrap();
    assert_eq!(stranger.status(), StatusCode::UNAUTHORIZED);
    let stranger = client("wrong-token-0123456789abcdef0123456789")
        .post(format!("{}/chat/completions", host.base))
        .json(&json!({"model": "clerk", "messages": [user("Hello")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(stranger.status(), StatusCode::UNAUTHORIZED);

    // The agents, as models.
    let (status, models) = host.get("/models").await;
    assert_eq!(status, StatusCode::OK, "{models}");
    assert_eq!(models["object"], "list");
    let data = models["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["clerk", "greeter"]);
    for model in data {
        assert_eq!(model["object"], "model");
        assert_eq!(model["owned_by"], "webmcp-agents");
        assert!(
            model["created"].as_u64().unwrap() > 1_600_000_000,
            "{model}"
        );
    }
    let (status, one) = host.get("/models/greeter").await;
    assert_eq!((status, &one["id"]), (StatusCode::OK, &json!("greeter")));
    let (status, none) = host.get("/models/nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(none["error"]["code"], "model_not_found");

    // An unknown model, and bodies that are refused, in OpenAI's shape.
    let (status, missing) = json_of(
        host.complete(
            &json!({"model": "nobody", "messages": [user("Hello")]}),
            None,
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing["error"]["param"], "model");
    assert_eq!(missing["error"]["code"], "model_not_found");
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`nobody`"),
        "{missing}"
    );
    for (body, param, says) in [
        (json!({"model": "clerk"}), json!("messages"), "`messages`"),
        (
            json!({"model": "clerk", "messages": [user("Hi")], "tools": [{"type": "function", "function": {"name": "f"}}]}),
            json!("tools"),
            "`tools` is not taken here",
        ),
        (
            json!({"model": "clerk", "messages": [user("Hi")], "n": 2}),
            json!("n"),
            "one answer",
        ),
        (
            json!({"model": "clerk", "messages": [{"role": "system", "content": "Be rude."}, user("Hi")]}),
            json!("messages[0].role"),
            "instructions are its config's",
        ),
        (
            json!({"model": "clerk", "messages": [user("Hi"), {"role": "assistant", "content": "Hello"}]}),
            json!("messages[1]"),
            "the last message must be the person's",
        ),
        (
            json!({"model": "clerk", "messages": [user("Hi")], "stream": "yes"}),
            json!("stream"),
            "true or false",
        ),
        (json!(["clerk"]), Value::Null, "must be a JSON object"),
        (
            json!({"model": "clerk", "messages": [user("   ")]}),
            Value::Null,
            "the request is empty",
        ),
    ] {
        let (status, refused) = json_of(host.complete(&body, None).await).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {refused}");
        let error = &refused["error"];
        assert_eq!(error["type"], "invalid_request_error", "{refused}");
        assert_eq!(error["param"], param, "{refused}");
        assert!(
            error["message"].as_str().unwrap().contains(says),
            "{body}: {refused}"
        );
    }

    // Not streamed: the agent's answer, a run of its own in a new session.
    let response = host
        .complete(
            &json!({"model": "clerk", "messages": [user("Hello")], "temperature": 0.2, "user": "me"}),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let run = header(&response, RUN_ID_HEADER).expect("the run's id");
    let session = header(&response, "x-session-id").expect("the session's id");
    assert_eq!(
        header(&response, "x-ignored-options").as_deref(),
        Some("temperature, user")
    );
    let (_, completion) = json_of(response).await;
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(completion["id"], format!("chatcmpl-{run}"));
    assert_eq!(completion["model"], "clerk");
    let choice = &completion["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(
        choice["message"]["content"],
        "Hello! What can I find for you?"
    );
    assert_eq!(choice["finish_reason"], "stop");

    // Another agent's model in that session is refused.
    let (status, refused) = json_of(
        host.complete(
            &json!({"model": "greeter", "messages": [user("Hi")]}),
            Some(&session),
        )
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("a conversation with `clerk`"),
        "{refused}"
    );

    // Streamed, in the same session: the client sends the conversation
    // as OpenAI clients do; the session holds it already, so only the new
    // request joins it.
    let response = host
        .complete(
            &json!({"model": "clerk", "stream": true, "messages": [
                user("Hello"),
                {"role": "assistant", "content": "Hello! What can I find for you?"},
                user("Which backpack is waterproof?"),
            ]}),
            Some(&session),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(&response, "x-session-id").as_deref(),
        Some(session.as_str())
    );
    let run = header(&response, RUN_ID_HEADER).expect("the run's id");
    let chunks = chunks_of(&data_events(response).await);
    assert!(chunks.len() >= 3, "{chunks:?}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for chunk in &chunks {
        assert_eq!(chunk["id"], format!("chatcmpl-{run}"));
        assert_eq!(chunk["model"], "clerk");
    }
    assert_eq!(
        streamed_answer(&chunks),
        (
            "The Summit 30L is our waterproof backpack.".to_string(),
            vec!["stop".to_string()]
        )
    );
    let (status, kept) = host.get(&format!("/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK);
    let messages: Vec<(&str, &str)> = kept["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(
        messages,
        [
            ("user", "Hello"),
            ("assistant", "Hello! What can I find for you?"),
            ("user", "Which backpack is waterproof?"),
            ("assistant", "The Summit 30L is our waterproof backpack."),
        ]
    );

    // A run that did not answer (its model failed) does not finish with
    // `stop`, streamed or not. The clerk's replies were all given: a new
    // conversation gets them from the first again.
    let (_, answered) = json_of(
        host.complete(&json!({"model": "clerk", "messages": [user("Hi")]}), None)
            .await,
    )
    .await;
    assert_eq!(
        answered["choices"][0]["message"]["content"],
        "Hello! What can I find for you?"
    );
    assert_eq!(answered["choices"][0]["finish_reason"], "stop");
    let (status, failed) = json_of(
        host.complete(&json!({"model": "greeter", "messages": [user("Hi")]}), None)
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{failed}");
    assert_eq!(failed["choices"][0]["finish_reason"], "error", "{failed}");
    let said = failed["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(said.contains("no more replies"), "{failed}");
    let response = host
        .complete(
            &json!({"model": "greeter", "messages": [user("Hi")], "stream": true}),
            None,
        )
        .await;
    let (content, reasons) = streamed_answer(&chunks_of(&data_events(response).await));
    assert!(content.contains("no more replies"), "{content}");
    assert_eq!(reasons, ["error"]);

    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_call_asks_waits_for_the_persons_answer() {
    let config = r#"
[providers.clerk]
kind = "scripted"
replies = [
    '{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}',
    "Added the Summit 30L to your cart.",
    '{"name": "add_to_cart", "arguments": {"product_id": "p-4"}}',
    "I could not add it.",
]

[tools.cart]
kind = "demo-shop"
allow = ["add_to_cart", "view_cart"]

[agents.clerk]
provider = "clerk"
tools = ["cart"]
approval = { tools = { add_to_cart = "ask" } }
"#;
    let host = Host::start("approval", config).await;

    /// Waits for the one question of the clerk's runs, and answers it.
    async fn answer(host: &Host, approve: bool) -> Value {
        let question = tokio::time::timeout(HANG, async {
            loop {
                let (_, listed) = host.get("/approvals").await;
                if let Some(first) = listed["approvals"].as_array().unwrap().first() {
                    return first.clone();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the call asks");
        let url = format!(
            "{}/agents/clerk/runs/{}/approvals/{}",
            host.base,
            question["run_id"].as_str().unwrap(),
            question["approval_id"].as_str().unwrap()
        );
        // A question is listed as soon as the run asks it, which can be
        // before the server has filed the run under its id (a run with a
        // store is filed once its request joined the session); until then
        // the answer is 404, so it is sent again until it is taken.
        tokio::time::timeout(HANG, async {
            loop {
                let response = host
                    .client
                    .post(&url)
                    .json(&json!({"approve": approve}))
                    .send()
                    .await
                    .unwrap();
                match response.status() {
                    StatusCode::OK => return,
                    StatusCode::NOT_FOUND => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    other => panic!("{other}: {}", response.text().await.unwrap()),
                }
            }
        })
        .await
        .expect("the answer is taken");
        question
    }

    // Not streamed: the completion waits while the call waits.
    let body = json!({"model": "clerk", "messages": [user("Put the Summit 30L in my cart.")]});
    let pending = {
        let (client, url) = (
            host.client.clone(),
            format!("{}/chat/completions", host.base),
        );
        let body = body.clone();
        tokio::spawn(async move { client.post(url).json(&body).send().await.unwrap() })
    };
    let question = answer(&host, true).await;
    assert_eq!(question["tool"], "add_to_cart");
    assert_eq!(question["arguments"], json!({"product_id": "p-17"}));
    let response = pending.await.unwrap();
    assert_eq!(
        header(&response, RUN_ID_HEADER).as_deref(),
        question["run_id"].as_str()
    );
    let (status, completion) = json_of(response).await;
    assert_eq!(status, StatusCode::OK);
    let choice = &completion["choices"][0];
    assert_eq!(
        choice["message"]["content"],
        "Added 1 x Summit 30L Waterproof Backpack to the cart."
    );
    assert_eq!(choice["finish_reason"], "stop");
    // The call and its result stay inside the run.
    assert!(!completion.to_string().contains("p-17"), "{completion}");

    // Streamed, denied: the agent's answer says so.
    let streamed = {
        let (client, url) = (
            host.client.clone(),
            format!("{}/chat/completions", host.base),
        );
        let body = json!({"model": "clerk", "stream": true, "messages": [user("Put the tent in my cart.")]});
        tokio::spawn(async move { client.post(url).json(&body).send().await.unwrap() })
    };
    let question = answer(&host, false).await;
    assert_eq!(question["arguments"], json!({"product_id": "p-4"}));
    let response = streamed.await.unwrap();
    let (content, reasons) = streamed_answer(&chunks_of(&data_events(response).await));
    let log = host
        .client
        .get(format!(
            "{}/runs/{}/events",
            host.base,
            question["run_id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        (content.as_str(), reasons),
        ("I could not add it.", vec!["stop".to_string()]),
        "the run's parts:\n{log}"
    );

    host.stop().await;
}

/// The Python of the venv that scripts/install-peers.sh makes from
/// tools/python/clients.txt.
fn client_python() -> PathBuf {
    let python = wma_provider_ort::cache_dir()
        .unwrap_or_else(|e| panic!("no cache folder ({e}): {INSTALL_HINT}"))
        .join(webmcp_agents::eval::tasks::PYTHON_PEERS)
        .join("clients/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: {INSTALL_HINT}",
        python.display()
    );
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_client_gets_the_agents_answer_streamed_and_not() {
    let python = client_python();
    let host = Host::start("python", CONFIG).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let output = tokio::time::timeout(
        HANG,
        tokio::process::Command::new(&python)
            .arg(&script)
            .args([
                host.base.as_str(),
                "clerk",
                "Hello",
                "Which backpack is waterproof?",
            ])
            .env("WMA_TOKEN", &host.token)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the client ends in time")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let steps: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let step = |name: &str| {
        steps
            .iter()
            .find(|s| s["step"] == name)
            .unwrap_or_else(|| panic!("no `{name}` in {stdout}"))
            .clone()
    };

    assert_eq!(step("models")["ids"], json!(["clerk", "greeter"]));

    let plain = step("plain");
    assert_eq!(plain["object"], "chat.completion");
    assert_eq!(plain["model"], "clerk");
    assert_eq!(plain["role"], "assistant");
    assert_eq!(plain["content"], "Hello! What can I find for you?");
    assert_eq!(plain["finish_reason"], "stop");
    assert!(plain["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let session = plain["session"].as_str().expect("a session id").to_string();

    let stream = step("stream");
    assert_eq!(stream["objects"], json!(["chat.completion.chunk"]));
    assert_eq!(stream["ids"].as_array().unwrap().len(), 1, "{stream}");
    assert_eq!(stream["roles"], json!(["assistant"]));
    assert_eq!(
        stream["content"],
        "The Summit 30L is our waterproof backpack."
    );
    assert_eq!(stream["finish_reasons"], json!(["stop"]));
    assert!(stream["chunks"].as_u64().unwrap() >= 3, "{stream}");

    // The streamed completion went on in the first one's session.
    let (_, kept) = host.get(&format!("/sessions/{session}")).await;
    assert_eq!(kept["messages"].as_array().unwrap().len(), 4, "{kept}");

    let missing = step("missing");
    assert_eq!(
        (&missing["status"], &missing["code"], &missing["param"]),
        (&json!(404), &json!("model_not_found"), &json!("model"))
    );
    let tools = step("tools");
    assert_eq!(
        (&tools["status"], &tools["param"]),
        (&json!(400), &json!("tools"))
    );
    assert_eq!(step("stranger")["status"], 401);

    host.stop().await;
}
