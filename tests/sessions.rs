//! Sessions and runs that survive a restart, through `wma serve`'s HTTP
//! API on the host's store: a session created, continued twice (the loop
//! sees the first run's request and answer in the second's history), read
//! and deleted, on SQLite and on a real PostgreSQL server; reconnecting to
//! a run's events with `Last-Event-ID`; and a real `wma serve` process
//! killed with SIGKILL mid-conversation and started again on the same
//! store; and `wma chat` keeping its session there, recording its
//! consequential calls before it sends them (an MCP server of the test's
//! own gets the key), stopped with Ctrl-C and killed in the middle of a
//! call. Scripted providers stand in for models.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{
    LocalLoopOptions, PromptRole, scripted::ScriptedProvider, scripted::ScriptedReply,
};
use webmcp_agents::config::Config;
use webmcp_agents::runtime::{AgentConfig, ProviderSource, Runtime};
use webmcp_agents::serve::{self, ServerOptions, TokenSource};
use webmcp_agents::store::{Store, StoreOptions};

const TOKEN: &str = "sessions-token-0123456789abcdef0123456789abcdef";
/// How long a test waits for what must happen before it calls it a hang.
const HANG: Duration = Duration::from_secs(30);

fn scratch(name: &str) -> PathBuf {
    crate::support::scratch("sessions", name)
}

fn client(token: &str) -> Client {
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    Client::builder().default_headers(headers).build().unwrap()
}

async fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

/// One server-sent event: its id (a part's sequence number), name, data.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    id: Option<u64>,
    name: String,
    data: Value,
}

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

    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let raw: String = self.buffer.drain(..end + 2).collect();
                let mut event = Event {
                    id: None,
                    name: String::new(),
                    data: Value::Null,
                };
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        event.id = Some(v.parse().expect("an event id is a number"));
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        event.name = v.to_string();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        event.data = serde_json::from_str(v).expect("event data is JSON");
                    }
                }
                return Some(event);
            }
            let chunk = tokio::time::timeout(HANG, self.response.chunk())
                .await
                .expect("an event in time")
                .expect("the stream reads")?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    async fn rest(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }

    /// Events up to the first part of this type (included).
    async fn until(&mut self, kind: &str) -> Vec<Event> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await.expect("the run goes on");
            let found = event.data["type"] == kind;
            events.push(event);
            if found {
                return events;
            }
        }
    }
}

/// A client of one server.
struct Api {
    base: String,
    client: Client,
}

impl Api {
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        json_of(
            self.client
                .get(format!("{}{path}", self.base))
                .timeout(HANG)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    async fn post(&self, path: &str, body: Value) -> Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        json_of(
            self.client
                .delete(format!("{}{path}", self.base))
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// `GET /v1/runs/{run}/events` with `Last-Event-ID: after`.
    async fn events_after(&self, run: &str, after: u64) -> Events {
        let response = self
            .client
            .get(format!("{}/v1/runs/{run}/events", self.base))
            .header("Last-Event-ID", after.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        Events::new(response)
    }

    async fn new_session(&self, agent: &str) -> String {
        let (status, session) =
            json_of(self.post("/v1/sessions", json!({"agent": agent})).await).await;
        assert_eq!(status, StatusCode::CREATED, "{session}");
        session["id"].as_str().unwrap().to_string()
    }

    /// Continues a session; returns the run's id and its events after the
    /// first (`run`) one.
    async fn continue_session(&self, session: &str, input: &str) -> (String, Events) {
        let response = self
            .post(
                &format!("/v1/sessions/{session}/runs"),
                json!({"input": input}),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[serve::SESSION_ID_HEADER], session);
        let mut events = Events::new(response);
        let first = events.next().await.unwrap();
        assert_eq!(first.name, "run");
        assert_eq!(first.data["session_id"], session);
        (first.data["run_id"].as_str().unwrap().to_string(), events)
    }

    /// The clerk's conversation up to a question: a session, one exchange,
    /// then "Add p-17 to my cart", read until its call asks for approval.
    async fn clerk_asks(&self) -> Asked {
        let chat = self.new_session("clerk").await;
        let (_, mut events) = self.continue_session(&chat, "Hi").await;
        events.rest().await;
        let (run, mut events) = self.continue_session(&chat, "Add p-17 to my cart").await;
        let seen = events.until("approval-requested").await;
        let question = seen.last().unwrap().data["approval_id"]
            .as_str()
            .unwrap()
            .to_string();
        Asked {
            chat,
            run,
            events,
            seen,
            question,
        }
    }
}

/// A conversation whose run waits for approval ([`Api::clerk_asks`]).
struct Asked {
    /// The session.
    chat: String,
    /// The asking run.
    run: String,
    /// Its events after the question.
    events: Events,
    /// Its events up to the question.
    seen: Vec<Event>,
    /// The approval's id.
    question: String,
}

/// An in-process server over a runtime of one agent, `clerk`, answering
/// from `model`, keeping its sessions in `store`.
struct InProcess {
    api: Api,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    runtime: Runtime,
}

impl InProcess {
    async fn start(model: &ScriptedProvider, store: Store) -> Self {
        Self::start_as("clerk", model, store).await
    }

    /// The same with the agent named `agent` (a session of another
    /// server's agent goes on here).
    async fn start_as(agent: &str, model: &ScriptedProvider, store: Store) -> Self {
        let script = model.clone();
        let runtime = Runtime::builder(ProviderSource::new(move || script.clone()))
            .agent(AgentConfig::new(agent).with_options(LocalLoopOptions {
                tools_inline: true,
                ..LocalLoopOptions::default()
            }))
            .start()
            .await
            .unwrap();
        let config = Config::parse(
            &format!(
                "[providers.p]\nkind = \"scripted\"\nreplies = [\"-\"]\n[agents.{agent}]\nprovider = \"p\"\n"
            ),
            "sessions-test.toml",
        )
        .unwrap();
        let api = serve::Api::with_store(serve::Api::new(config, &runtime).unwrap(), store);
        let stop = CancellationToken::new();
        let started = serve::start_with(
            "127.0.0.1:0".parse().unwrap(),
            api,
            ServerOptions {
                token: TokenSource::Given(TOKEN.to_string()),
                ..ServerOptions::default()
            },
            stop.clone(),
        )
        .await
        .unwrap();
        Self {
            api: Api {
                base: format!("http://{}", started.addr),
                client: client(TOKEN),
            },
            stop,
            task: started.task,
            runtime,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
        self.runtime.shutdown().await;
    }
}

fn part_types(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| e.data["type"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Create, continue twice, read, delete: the body both backends run.
async fn a_session_round_trip(store: Store) {
    let model = ScriptedProvider::new(["Tents are in aisle 3.", "The blue one costs $120."]);
    let server = InProcess::start(&model, store).await;
    let api = &server.api;
    let session = api.new_session("clerk").await;

    let (first_run, mut events) = api.continue_session(&session, "Where are the tents?").await;
    let first = events.rest().await;
    assert_eq!(part_types(&first), ["message-start", "text", "finish"]);
    // Each part's event id is its sequence number in the run's log.
    let ids: Vec<Option<u64>> = first.iter().map(|e| e.id).collect();
    assert_eq!(ids, [Some(1), Some(2), Some(3)]);

    let (second_run, mut events) = api
        .continue_session(&session, "How much is the blue one?")
        .await;
    let second = events.rest().await;
    assert_eq!(second.last().unwrap().data["type"], "finish");
    assert_ne!(first_run, second_run);

    // The loop's history for the second run: the first's request and
    // answer, then the new request.
    let history: Vec<(PromptRole, String)> = model.requests()[1]
        .messages
        .iter()
        .filter(|m| m.role != PromptRole::System)
        .map(|m| (m.role, m.content.clone()))
        .collect();
    let expected = [
        (PromptRole::User, "Where are the tents?"),
        (PromptRole::Assistant, "Tents are in aisle 3."),
        (PromptRole::User, "How much is the blue one?"),
    ];
    let mut at = 0;
    for (role, text) in expected {
        let found = history[at..]
            .iter()
            .position(|(r, c)| *r == role && c.contains(text))
            .unwrap_or_else(|| panic!("{role:?} `{text}` in order in {history:?}"));
        at += found + 1;
    }

    // Read: its messages in order and both runs, finished.
    let (status, read) = api.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK);
    let messages: Vec<&str> = read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            "Where are the tents?",
            "Tents are in aisle 3.",
            "How much is the blue one?",
            "The blue one costs $120."
        ]
    );
    assert_eq!(read["title"], "Where are the tents?");
    let runs: Vec<(&str, &str)> = read["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        runs,
        [
            (first_run.as_str(), "finished"),
            (second_run.as_str(), "finished")
        ]
    );
    let (_, listed) = api.get("/v1/sessions").await;
    assert!(
        listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == session.as_str() && s["message_count"] == 4),
        "{listed}"
    );

    // A mistake is named; an agent that is not hosted has no session.
    let (status, body) = json_of(api.post("/v1/sessions", json!({"agent": "nobody"})).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _) = api.get("/v1/sessions/not-an-id").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Delete: gone, with its runs' logs.
    let (status, _) = api.delete(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = api.delete(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let gone = api
        .client
        .get(format!("{}/v1/runs/{first_run}/events", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_http_on_sqlite() {
    let dir = scratch("sqlite");
    let store = Store::open(StoreOptions::in_data_dir(&dir)).await.unwrap();
    a_session_round_trip(store.clone()).await;
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_over_http_on_postgres() {
    let server = wma_testkit::PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
    let url = server.create_database().unwrap();
    let dir = scratch("postgres");
    let store = Store::open(StoreOptions::in_data_dir(&dir).with_database_url(url))
        .await
        .unwrap();
    assert_eq!(store.backend(), webmcp_agents::store::Backend::Postgres);
    a_session_round_trip(store.clone()).await;
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_with_last_event_id_gets_exactly_the_missed_parts() {
    let dir = scratch("reconnect");
    let store = Store::open(StoreOptions::in_data_dir(&dir)).await.unwrap();
    // The answer takes its time, so the client goes away mid-run.
    let model =
        ScriptedProvider::new([ScriptedReply::text("Done.").delayed(Duration::from_millis(500))]);
    let server = InProcess::start(&model, store.clone()).await;
    let api = &server.api;
    let session = api.new_session("clerk").await;
    let (run, mut events) = api.continue_session(&session, "Try it").await;
    let seen = events.until("message-start").await;
    let last_seen = seen.last().unwrap().id.unwrap();
    // The client goes away; the run goes on without it.
    drop(events);

    let mut again = api.events_after(&run, last_seen).await;
    let missed = again.rest().await;
    assert!(!missed.is_empty());
    assert_eq!(missed[0].id, Some(last_seen + 1), "{missed:?}");
    assert_eq!(missed.last().unwrap().data["type"], "finish");

    // What the first connection saw and what the second got is the whole
    // log, each part once, as the store replays it after the run.
    let mut whole = seen.clone();
    whole.extend(missed.iter().cloned());
    let replayed = api.events_after(&run, 0).await.rest().await;
    assert_eq!(replayed, whole);
    let ids: Vec<u64> = replayed.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(ids, (1..=replayed.len() as u64).collect::<Vec<_>>());

    // From the middle, after the run: exactly the parts after that one.
    let tail = api.events_after(&run, 1).await.rest().await;
    assert_eq!(tail, whole[1..]);
    let nothing = api
        .events_after(&run, whole.len() as u64)
        .await
        .rest()
        .await;
    assert!(nothing.is_empty());

    // A bad id is named.
    let bad = api
        .client
        .get(format!("{}/v1/runs/{run}/events", api.base))
        .header("Last-Event-ID", "soon")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    server.stop().await;
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sees_the_finish_finds_the_answer_in_the_session() {
    let dir = scratch("finish-then-read");
    let store = Store::open(StoreOptions::in_data_dir(&dir)).await.unwrap();
    let turns = 4;
    let model = ScriptedProvider::new(
        (0..turns).map(|turn| ScriptedReply::text(format!("Answer {turn}."))),
    );
    let server = InProcess::start(&model, store.clone()).await;
    let api = &server.api;
    let session = api.new_session("clerk").await;
    for turn in 0..turns {
        let (_, mut events) = api
            .continue_session(&session, &format!("Question {turn}"))
            .await;
        events.until("finish").await;
        // Read at once, as a page does when the stream says the run ended.
        let (_, read) = api.get(&format!("/v1/sessions/{session}")).await;
        let messages = read["messages"].as_array().unwrap();
        let last = messages.last().unwrap();
        assert_eq!(last["role"], "assistant", "turn {turn}: {read}");
        assert_eq!(last["content"], format!("Answer {turn}."), "{read}");
        assert_eq!(messages.len(), 2 * (turn + 1), "{read}");
    }
    server.stop().await;
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------------------
// A real `wma serve`, killed and started again

/// Writes a test host's config into `dir`: `body` (its providers, tools
/// and agents) and the server and store sections every such host shares
/// (a token file, the store in `dir/data`).
fn write_config(dir: &Path, body: &str) -> PathBuf {
    let text = format!(
        "{body}\n[server]\ntoken_file = \"token\"\n\n[store]\ndata_dir = {}\n",
        toml_str(&dir.join("data").display().to_string())
    );
    let file = dir.join("wma.toml");
    std::fs::write(&file, text).unwrap();
    file
}

/// `clerk` asks before `add_to_cart`; `slow` takes a minute to answer.
fn kill_config(dir: &Path) -> PathBuf {
    let text = r#"
[providers.clerk]
kind = "scripted"
replies = [
    "Hello! What can I find for you?",
    '{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}',
    "Added.",
    "Nothing else is in your cart.",
]

[providers.slow]
kind = "scripted"
delay_ms = 60000
replies = ["Too late."]

[tools.cart]
kind = "demo-shop"
allow = ["add_to_cart", "view_cart"]

[agents.clerk]
provider = "clerk"
tools = ["cart"]
approval = { tools = { add_to_cart = "ask" } }

[agents.slow]
provider = "slow"

"#;
    write_config(dir, text)
}

fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// `wma serve` as a process of its own.
struct Process {
    child: tokio::process::Child,
    api: Api,
    stderr: Vec<String>,
}

async fn serve_process(config: &Path, dir: &Path) -> Process {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_wma"));
    command
        .args(["serve", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .env("WMA_CACHE_DIR", dir)
        .env("RUST_LOG", "warn");
    let crate::support::Serving {
        child,
        addr,
        stderr,
        ..
    } = crate::support::serve_listening(command, HANG).await;
    // Everything it said on stderr before it listened.
    let mut stderr = tokio::io::BufReader::new(stderr).lines();
    let mut said = Vec::new();
    while let Ok(Ok(Some(line))) =
        tokio::time::timeout(Duration::from_millis(300), stderr.next_line()).await
    {
        said.push(line);
    }
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    Process {
        child,
        api: Api {
            base: format!("http://{addr}"),
            client: client(token.trim()),
        },
        stderr: said,
    }
}

/// Polls the session until its run `index` has `status`.
async fn wait_for_status(api: &Api, session: &str, index: usize, status: &str) {
    tokio::time::timeout(HANG, async {
        loop {
            let (_, read) = api.get(&format!("/v1/sessions/{session}")).await;
            if read["runs"][index]["status"] == status {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("run {index} of {session} never became {status}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_restarts_with_its_sessions_and_pending_approvals() {
    let dir = scratch("kill");
    let config = kill_config(&dir);
    let mut first = serve_process(&config, &dir).await;
    let api = &first.api;

    // A conversation: one exchange, then a request whose call waits for a
    // person.
    let Asked {
        chat,
        run: asking,
        events,
        seen,
        question,
    } = api.clerk_asks().await;
    wait_for_status(api, &chat, 1, "waiting-for-approval").await;
    // Another conversation whose run is in flight when the host dies.
    let other = api.new_session("slow").await;
    let (cut, mut slow_events) = api.continue_session(&other, "Take your time").await;
    slow_events.until("message-start").await;
    wait_for_status(api, &other, 0, "running").await;

    first.child.kill().await.unwrap();
    drop(events);
    drop(slow_events);

    let second = serve_process(&config, &dir).await;
    let api = &second.api;
    let said = second.stderr.join("\n");
    assert!(
        said.contains("recovered: 1 run(s)") && said.contains(&cut),
        "{said}"
    );
    assert!(said.contains(&asking), "{said}");

    // The conversation is there with its history.
    let (status, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    assert_eq!(status, StatusCode::OK);
    let messages: Vec<&str> = read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            "Hi",
            "Hello! What can I find for you?",
            "Add p-17 to my cart"
        ]
    );
    assert_eq!(read["runs"][1]["status"], "waiting-for-approval");
    // The run in flight reads as interrupted.
    let (_, read) = api.get(&format!("/v1/sessions/{other}")).await;
    assert_eq!(read["runs"][0]["id"], cut.as_str());
    assert_eq!(read["runs"][0]["status"], "interrupted");
    // The asking run's log is what its client saw, up to where the host
    // died (no part twice, none made up).
    let replayed = api.events_after(&asking, 0).await.rest().await;
    assert!(!replayed.is_empty());
    assert_eq!(replayed[..], seen[..replayed.len()]);

    // The question is listed, with its arguments, and can be answered once.
    let (_, listed) = api.get("/v1/approvals").await;
    let listed = listed["approvals"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["approval_id"], question.as_str());
    assert_eq!(listed[0]["run_id"], asking.as_str());
    assert_eq!(listed[0]["tool"], "add_to_cart");
    assert_eq!(listed[0]["arguments"], json!({"product_id": "p-17"}));
    assert_eq!(listed[0]["live"], false);
    let (_, of_run) = api
        .get(&format!("/v1/agents/clerk/runs/{asking}/approvals"))
        .await;
    assert_eq!(of_run["approvals"].as_array().unwrap().len(), 1);
    let path = format!("/v1/agents/clerk/runs/{asking}/approvals/{question}");
    let (status, answered) = json_of(api.post(&path, json!({"approve": true})).await).await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    assert_eq!(answered["approved"], true);
    // The run goes on here under its id: the call runs, and a new loop
    // answers from the session's history.
    assert_eq!(answered["resumed"], true, "{answered}");
    assert_eq!(answered["run_status"], "running");
    let (status, _) = json_of(api.post(&path, json!({"approve": false})).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, listed) = api.get("/v1/approvals").await;
    assert_eq!(listed["approvals"], json!([]));
    // A client reconnecting after what it saw before the crash gets the
    // rest, numbered on from there.
    let last_seen = seen.last().unwrap().id.unwrap();
    let rest = api.events_after(&asking, last_seen).await.rest().await;
    assert_eq!(rest[0].id, Some(last_seen + 1), "{rest:?}");
    assert_eq!(
        part_types(&rest)[..2],
        ["approval-decided", "tool-result"],
        "{rest:?}"
    );
    assert_eq!(rest[0].data["approved"], true);
    assert_eq!(rest[1].data["name"], "add_to_cart");
    assert_eq!(rest.last().unwrap().data["type"], "finish");
    let ids: Vec<u64> = rest.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(
        ids,
        (last_seen + 1..=last_seen + rest.len() as u64).collect::<Vec<_>>()
    );
    wait_for_status(api, &chat, 1, "finished").await;
    let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    let messages = read["messages"].as_array().unwrap();
    // The request, the call and its result, then the new loop's answer.
    assert_eq!(messages.len(), 6, "{read}");
    assert_eq!(messages[3]["tool_calls"][0]["name"], "add_to_cart");
    assert_eq!(messages[4]["role"], "tool");
    assert_eq!(messages[5]["content"], "Hello! What can I find for you?");
    // The call was recorded before it was sent, and answered.
    assert_eq!(read["runs"][1]["calls"][0]["status"], "answered", "{read}");

    let mut second = second;
    second.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn store_settings_are_checked_and_a_typo_is_named() {
    let agent =
        "[providers.p]\nkind = \"scripted\"\nreplies = [\"-\"]\n[agents.a]\nprovider = \"p\"\n";
    let dir = std::env::temp_dir().join("wma-sessions-config");
    let file = dir.join("wma.toml");
    let config = Config::parse(
        &format!("{agent}[store]\ndata_dir = \"data\"\nhost = \"host-a\"\n"),
        &file,
    )
    .unwrap();
    assert_eq!(config.store.data_dir, Some(dir.join("data")));
    let options = config.store.options().unwrap();
    assert_eq!(options.data_dir, dir.join("data"));
    assert_eq!(options.host, "host-a");
    assert_eq!(options.database_url, None);

    let typo =
        Config::parse(&format!("{agent}[store]\ndata_dirr = \"data\"\n"), &file).unwrap_err();
    assert!(typo.to_string().contains("data_dirr"), "{typo}");
    let other = Config::parse(
        &format!("{agent}[store]\ndatabase_url = \"mysql://db/wma\"\n"),
        &file,
    )
    .unwrap_err();
    assert_eq!(other.location().unwrap().key, "store.database_url");
    assert!(other.to_string().contains("PostgreSQL"), "{other}");
    let empty = Config::parse(&format!("{agent}[store]\nhost = \"\"\n"), &file).unwrap_err();
    assert_eq!(empty.location().unwrap().key, "store.host");
}

/// Runs `wma ARGS` with `stdin` piped in and `cache` as its cache folder;
/// returns (success, stdout, stderr).
async fn wma(args: &[&str], stdin: &str, cache: &Path) -> (bool, String, String) {
    crate::support::run_wma(args, stdin, [("WMA_CACHE_DIR", cache)], HANG).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wma_chat_keeps_a_session_and_continues_it_from_the_store() {
    let dir = scratch("chat");
    let config = kill_config(&dir).display().to_string();
    let (ok, _, said) = wma(
        &[
            "chat",
            "--config",
            &config,
            "--agent",
            "clerk",
            "--new-session",
        ],
        "Hi\n/exit\n",
        &dir,
    )
    .await;
    assert!(ok, "{said}");
    let id = said
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("the new session's id is printed: {said}"))
        .to_string();

    // Continued in a new process: its history comes from the store.
    let (ok, out, said) = wma(
        &["chat", "--config", &config, "--session", &id],
        "Again\n/exit\n",
        &dir,
    )
    .await;
    assert!(ok, "{said}");
    assert!(
        said.contains(&format!("continuing session {id} (2 messages)")),
        "{said}"
    );
    assert!(out.contains("Hello! What can I find for you?"), "{out}");

    let (ok, listed, said) = wma(&["chat", "--config", &config, "--sessions"], "", &dir).await;
    assert!(ok, "{said}");
    assert!(
        listed.contains(&format!("{id}  clerk  4 messages  Hi")),
        "{listed}"
    );

    let store = Store::open(StoreOptions::in_data_dir(dir.join("data")))
        .await
        .unwrap();
    let messages: Vec<String> = store
        .messages(&id)
        .await
        .unwrap()
        .iter()
        .map(|m| {
            serde_json::to_value(m).unwrap()["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        messages,
        [
            "Hi",
            "Hello! What can I find for you?",
            "Again",
            "Hello! What can I find for you?"
        ]
    );
    // Each turn is a run with its log, finished.
    let runs = store.runs_of_session(&id).await.unwrap();
    assert_eq!(runs.len(), 2);
    assert!(
        runs.iter()
            .all(|r| r.status == webmcp_agents::store::RunStatus::Finished && r.last_seq >= 3),
        "{runs:?}"
    );
    store.close().await;

    // An id the store does not have is named before any model loads.
    let (ok, _, said) = wma(
        &["chat", "--config", &config, "--session", "nope"],
        "",
        &dir,
    )
    .await;
    assert!(!ok);
    assert!(said.contains("no session `nope`"), "{said}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_runs_finish_within_the_grace_period_and_marks_the_rest_interrupted() {
    let dir = scratch("sigterm");
    let config = dir.join("wma.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[providers.brief]
kind = "scripted"
delay_ms = 700
replies = ["Just in time."]

[providers.slow]
kind = "scripted"
delay_ms = 60000
replies = ["Too late."]

[providers.clerk]
kind = "scripted"
replies = ['{{"name": "add_to_cart", "arguments": {{"product_id": "p-17"}}}}', "Added."]

[tools.cart]
kind = "demo-shop"
allow = ["add_to_cart"]

[agents.clerk]
provider = "clerk"
tools = ["cart"]
approval = {{ tools = {{ add_to_cart = "ask" }} }}

[agents.brief]
provider = "brief"

[agents.slow]
provider = "slow"

[server]
token_file = "token"
shutdown_grace_secs = 3

[store]
data_dir = {data}
"#,
            data = toml_str(&dir.join("data").display().to_string()),
        ),
    )
    .unwrap();
    let mut server = serve_process(&config, &dir).await;
    let api = &server.api;
    // A run that waits for a person when the host is told to stop.
    let asking_session = api.new_session("clerk").await;
    let (asking, mut asking_events) = api.continue_session(&asking_session, "Add p-17").await;
    asking_events.until("approval-requested").await;
    wait_for_status(api, &asking_session, 0, "waiting-for-approval").await;
    let quick = api.new_session("brief").await;
    let (finishing, mut quick_events) = api.continue_session(&quick, "Quick one").await;
    quick_events.until("message-start").await;
    let long = api.new_session("slow").await;
    let (cut, mut slow_events) = api.continue_session(&long, "Long one").await;
    slow_events.until("message-start").await;

    let pid = server.child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    // The quick run's client still gets its answer.
    let rest = quick_events.rest().await;
    assert_eq!(rest.last().unwrap().data["type"], "finish");
    let status = tokio::time::timeout(HANG, server.child.wait())
        .await
        .expect("wma serve ends after its grace period")
        .unwrap();
    assert!(status.success(), "{status}");
    drop(slow_events);
    drop(asking_events);

    let store = Store::open(StoreOptions::in_data_dir(dir.join("data")))
        .await
        .unwrap();
    // Nothing was left running for the next start to recover.
    assert!(
        store.recovery().interrupted_runs.is_empty(),
        "{:?}",
        store.recovery()
    );
    let finished = store.run(&finishing).await.unwrap().unwrap();
    assert_eq!(finished.status, webmcp_agents::store::RunStatus::Finished);
    let interrupted = store.run(&cut).await.unwrap().unwrap();
    assert_eq!(
        interrupted.status,
        webmcp_agents::store::RunStatus::Interrupted
    );
    let messages = store.messages(&quick).await.unwrap();
    assert_eq!(messages.len(), 2, "{messages:?}");
    // The run that waited still does, its question still pending, for the
    // next start to go on with.
    let waiting = store.run(&asking).await.unwrap().unwrap();
    assert_eq!(
        waiting.status,
        webmcp_agents::store::RunStatus::WaitingForApproval
    );
    let pending = store
        .pending_approvals(Some(&asking_session))
        .await
        .unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].request.tool, "add_to_cart");
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_is_recorded_before_it_is_sent_and_answered_after() {
    let dir = scratch("calls");
    let config = kill_config(&dir);
    let mut server = serve_process(&config, &dir).await;
    let api = &server.api;
    let Asked {
        chat,
        run,
        mut events,
        question,
        ..
    } = api.clerk_asks().await;
    // Not recorded while it waits: nothing was sent.
    let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    assert_eq!(read["runs"][1]["calls"], json!([]));
    let path = format!("/v1/agents/clerk/runs/{run}/approvals/{question}");
    let (status, _) = json_of(api.post(&path, json!({"approve": true})).await).await;
    assert_eq!(status, StatusCode::OK);
    let rest = events.rest().await;
    let result = rest
        .iter()
        .find(|e| e.data["type"] == "tool-result")
        .expect("the approved call ran");
    assert_eq!(rest.last().unwrap().data["type"], "finish");

    // Its answer is recorded off the run's path: wait for it.
    let call = tokio::time::timeout(HANG, async {
        loop {
            let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
            let call = read["runs"][1]["calls"][0].clone();
            if call["status"] == "answered" {
                return call;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the call's answer is recorded");
    assert_eq!(call["tool"], "add_to_cart");
    assert_eq!(call["agent"], "clerk");
    assert_eq!(call["arguments"], json!({"product_id": "p-17"}));
    assert_eq!(call["call_id"], result.data["call_id"]);
    assert_eq!(call["output"], result.data["output"]);
    assert_eq!(call["is_error"], false);
    let key = call["idempotency_key"].as_str().unwrap();
    assert!(
        key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    server.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// The buyer's replies in [`auto_config`]: a read-only call and a
/// consequential one, then, in a second run, a consequential call its MCP
/// server holds until the test lets it answer.
const BUYER: &[&str] = &[
    r#"{"name": "order_status", "arguments": {}}"#,
    r#"{"name": "place_order", "arguments": {"item": "tent"}}"#,
    "Ordered.",
    r#"{"name": "hold_order", "arguments": {"item": "stove"}}"#,
    "Ordered too.",
];

/// `buyer` answers with `replies` and calls consequential tools of the MCP
/// server at `mcp_url` without asking (`consequential = "auto"`).
fn auto_config(dir: &Path, mcp_url: &str, replies: &[&str]) -> PathBuf {
    let text = format!(
        r#"
[providers.buyer]
kind = "scripted"
replies = {replies}

[tools.orders]
kind = "mcp-http"
url = {url}

[agents.buyer]
provider = "buyer"
tools = ["orders"]
approval = {{ consequential = "auto" }}

"#,
        url = toml_str(mcp_url),
        replies = serde_json::to_string(replies).unwrap(),
    );
    write_config(dir, &text)
}

/// The session's run `index`'s recorded calls once `done` holds for them.
async fn calls_once(
    api: &Api,
    session: &str,
    index: usize,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    tokio::time::timeout(HANG, async {
        loop {
            let (_, read) = api.get(&format!("/v1/sessions/{session}")).await;
            let calls = read["runs"][index]["calls"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if done(&calls) {
                return calls;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the calls of run {index} of {session} never got there"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_consequential_call_is_recorded_before_it_is_sent_and_in_doubt_after_a_crash() {
    use webmcp_agents::tools::IDEMPOTENCY_KEY_META;
    let dir = scratch("auto-calls");
    let orders = wma_testkit::McpTestServer::start().unwrap();
    let config = auto_config(&dir, &orders.url(), BUYER);
    let mut first = serve_process(&config, &dir).await;
    let api = &first.api;
    let chat = api.new_session("buyer").await;

    // Run 1: neither call asks; the consequential one is recorded with the
    // key its server got in `_meta`, and answered; the read-only one is
    // not recorded and carries no key.
    let (_, mut events) = api.continue_session(&chat, "Buy a tent").await;
    let parts = events.rest().await;
    assert!(
        !part_types(&parts).contains(&"approval-requested".to_string()),
        "{parts:?}"
    );
    let calls = calls_once(api, &chat, 0, |c| {
        c.first().is_some_and(|c| c["status"] == "answered")
    })
    .await;
    assert_eq!(calls.len(), 1, "only the consequential call: {calls:?}");
    assert_eq!(calls[0]["tool"], "place_order");
    assert_eq!(calls[0]["call_id"], "call_2_1");
    assert_eq!(calls[0]["arguments"], json!({"item": "tent"}));
    let received = orders.calls();
    assert_eq!(received.len(), 2, "{received:?}");
    assert_eq!(received[0].tool, "order_status");
    assert!(
        received[0].meta.get(IDEMPOTENCY_KEY_META).is_none(),
        "{received:?}"
    );
    assert_eq!(received[1].tool, "place_order");
    let key = calls[0]["idempotency_key"].as_str().unwrap();
    assert_eq!(received[1].meta[IDEMPOTENCY_KEY_META], key, "{received:?}");
    // The answer recorded is what the server said (it echoes its `_meta`).
    let output = calls[0]["output"].as_str().unwrap();
    assert!(
        output.starts_with("placed tent") && output.contains(key),
        "{output}"
    );

    // Run 2: the call is recorded in flight before its source answers…
    let (held, mut events) = api.continue_session(&chat, "Buy a stove").await;
    events.until("tool-call").await;
    tokio::time::timeout(HANG, async {
        while orders.calls().len() < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the held call reaches its server");
    let calls = calls_once(api, &chat, 1, |c| !c.is_empty()).await;
    assert_eq!(calls[0]["status"], "in-flight", "{calls:?}");
    assert_eq!(calls[0]["tool"], "hold_order");
    let held_key = calls[0]["idempotency_key"].as_str().unwrap().to_string();
    assert_eq!(
        orders.calls()[2].meta[IDEMPOTENCY_KEY_META],
        held_key.as_str()
    );

    // …and the host dies before it answers.
    first.child.kill().await.unwrap();
    drop(events);
    let mut second = serve_process(&config, &dir).await;
    let said = second.stderr.join("\n");
    assert!(
        said.contains(&format!("recovered: call {held_key} of run {held}")),
        "{said}"
    );
    let api = &second.api;
    let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    assert_eq!(read["runs"][1]["status"], "interrupted", "{read}");
    let calls = read["runs"][1]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["status"], "in-doubt");
    assert_eq!(calls[0]["idempotency_key"], held_key.as_str());
    assert_eq!(calls[0]["arguments"], json!({"item": "stove"}));
    // Never sent again.
    assert_eq!(orders.calls().len(), 3);
    // The first run's call stays as it answered.
    assert_eq!(read["runs"][0]["calls"][0]["status"], "answered");
    // The cut turn was mended as the host started: reading the session
    // shows the call, answered by an error that says it is in doubt.
    assert!(
        said.contains(&format!(
            "the last turn of session {chat} (run {held}) was cut short: 2 message(s)"
        )),
        "{said}"
    );
    let messages = read["messages"].as_array().unwrap();
    let request = messages
        .iter()
        .position(|m| m["content"] == "Buy a stove")
        .expect("the cut turn's request");
    assert_eq!(messages.len(), request + 3, "{messages:?}");
    assert_eq!(messages[request + 1]["tool_calls"][0]["name"], "hold_order");
    assert_eq!(messages[request + 1]["tool_calls"][0]["id"], "call_1_1");
    assert_eq!(messages[request + 2]["call_id"], "call_1_1");
    let error = messages[request + 2]["content"].as_str().unwrap();
    assert!(
        error.starts_with("Error [cancelled]: the host went away while this call was in flight")
            && error.contains(&format!("in doubt, key {held_key}")),
        "{error}"
    );

    second.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turn_after_a_crash_reads_the_cut_call_as_in_doubt_and_never_sends_it() {
    use webmcp_agents::store::CallStatus;
    let dir = scratch("cut-turn");
    let orders = wma_testkit::McpTestServer::start().unwrap();
    let config = auto_config(&dir, &orders.url(), &[BUYER[3], "Ordered."]);
    let mut first = serve_process(&config, &dir).await;
    let chat = first.api.new_session("buyer").await;
    let (held, mut events) = first.api.continue_session(&chat, "Buy a stove").await;
    events.until("tool-call").await;
    server_got(&orders, 1).await;
    let calls = calls_once(&first.api, &chat, 0, |c| !c.is_empty()).await;
    let key = calls[0]["idempotency_key"].as_str().unwrap().to_string();

    // `kill -9` while the server holds the call.
    first.child.kill().await.unwrap();
    drop(events);

    // The host comes back (the store opened under its name recovers the
    // run and the call) with a model that only talks, and the person asks
    // over HTTP. This host has not mended the session at its start: going
    // on with it mends it first.
    let store = Store::open(StoreOptions::in_data_dir(dir.join("data")))
        .await
        .unwrap();
    assert_eq!(
        store.recovery().interrupted_runs,
        std::slice::from_ref(&held)
    );
    let model = ScriptedProvider::new(["It may have gone through; please check."]);
    let second = InProcess::start_as("buyer", &model, store.clone()).await;
    let (next, mut events) = second
        .api
        .continue_session(&chat, "Did it go through?")
        .await;
    let parts = events.rest().await;
    assert_eq!(parts.last().unwrap().data["type"], "finish", "{parts:?}");

    // The history the model read: the cut turn's request, its call, the
    // call's in-doubt error with its key, then the new request.
    let requests = model.requests();
    assert_eq!(requests.len(), 1, "one step");
    let history: Vec<(PromptRole, String)> = requests[0]
        .messages
        .iter()
        .filter(|m| m.role != PromptRole::System)
        .map(|m| (m.role, m.content.clone()))
        .collect();
    assert_eq!(history.len(), 4, "{history:#?}");
    assert_eq!(history[0], (PromptRole::User, "Buy a stove".to_string()));
    assert_eq!(history[1].0, PromptRole::Assistant);
    assert!(history[1].1.contains("hold_order"), "{history:#?}");
    assert_eq!(history[2].0, PromptRole::Tool);
    assert!(
        history[2]
            .1
            .contains("the host went away while this call was in flight")
            && history[2].1.contains(&format!("in doubt, key {key}"))
            && history[2].1.contains("do not call it again"),
        "{history:#?}"
    );
    assert_eq!(
        history[3],
        (PromptRole::User, "Did it go through?".to_string())
    );

    // The session keeps the mended turn, then the new one; the call stays
    // in doubt and its server never got it again.
    let (_, read) = second.api.get(&format!("/v1/sessions/{chat}")).await;
    let messages = read["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5, "{messages:?}");
    assert_eq!(messages[2]["call_id"], "call_1_1");
    assert_eq!(
        messages[4]["content"],
        "It may have gone through; please check."
    );
    assert_eq!(read["runs"][0]["id"], held.as_str());
    assert_eq!(read["runs"][0]["status"], "interrupted");
    assert_eq!(read["runs"][1]["id"], next.as_str());
    let calls = store.calls_of_run(&held).await.unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].status, CallStatus::InDoubt);
    assert_eq!(orders.calls().len(), 1, "never sent again");
    second.stop().await;
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_its_run_stopped_in_the_middle_of_is_in_doubt_at_once() {
    let dir = scratch("stopped-call");
    let orders = wma_testkit::McpTestServer::start().unwrap();
    let config = auto_config(
        &dir,
        &orders.url(),
        &[BUYER[3], "I stopped before it answered."],
    );
    let mut server = serve_process(&config, &dir).await;
    let api = &server.api;
    let chat = api.new_session("buyer").await;
    let (run, mut events) = api.continue_session(&chat, "Buy a stove").await;
    events.until("tool-call").await;
    let calls = calls_once(api, &chat, 0, |c| !c.is_empty()).await;
    assert_eq!(calls[0]["status"], "in-flight", "{calls:?}");
    tokio::time::timeout(HANG, async {
        while orders.calls().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the held call reaches its server");
    let stop = api
        .post(&format!("/v1/agents/buyer/runs/{run}/stop"), json!({}))
        .await;
    assert!(stop.status().is_success(), "{}", stop.status());
    let rest = events.rest().await;
    assert_eq!(rest.last().unwrap().data["reason"], "aborted", "{rest:?}");
    // It may have happened: in doubt now, without waiting for a restart.
    let calls = calls_once(api, &chat, 0, |c| c[0]["status"] != "in-flight").await;
    assert_eq!(calls[0]["status"], "in-doubt", "{calls:?}");
    assert_eq!(calls[0]["tool"], "hold_order");
    // The session's history answers the call: the next turn's model reads
    // that it may have happened, with its key.
    let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    let messages = read["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert_eq!(messages[1]["tool_calls"][0]["id"], "call_1_1");
    assert_eq!(messages[2]["call_id"], "call_1_1");
    let error = messages[2]["content"].as_str().unwrap();
    assert!(
        error.starts_with("Error [cancelled]: the run was stopped while this call was in flight")
            && error.contains(calls[0]["idempotency_key"].as_str().unwrap()),
        "{error}"
    );
    server.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// An agent `name` with the cart's tools that asks before `add_to_cart`,
/// its scripted model giving `replies` in order.
fn asking_cart_config(dir: &Path, name: &str, replies: &[&str]) -> PathBuf {
    let replies: Vec<String> = replies.iter().map(|r| format!("    {r},\n")).collect();
    let text = format!(
        "\n[providers.{name}]\nkind = \"scripted\"\nreplies = [\n{}]\n\n\
         [tools.cart]\nkind = \"demo-shop\"\nallow = [\"add_to_cart\", \"view_cart\"]\n\n\
         [agents.{name}]\nprovider = \"{name}\"\ntools = [\"cart\"]\n\
         approval = {{ tools = {{ add_to_cart = \"ask\" }} }}\n\n",
        replies.concat()
    );
    write_config(dir, &text)
}

/// `again` asks before `add_to_cart`; a new process's model starts its
/// replies afresh, so the run it resumes calls `add_to_cart` once more.
fn resume_config(dir: &Path) -> PathBuf {
    asking_cart_config(
        dir,
        "again",
        &[
            r#"'{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}'"#,
            r#"'{"name": "view_cart", "arguments": {}}'"#,
            r#""Your cart has p-17.""#,
        ],
    )
}

/// The question waiting in this process for `run`, once there is one.
async fn live_question(api: &Api, run: &str) -> Value {
    tokio::time::timeout(HANG, async {
        loop {
            let (_, listed) = api.get("/v1/approvals").await;
            let found = listed["approvals"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["run_id"] == run && a["live"] != false)
                .cloned();
            if let Some(found) = found {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("run {run} never asked"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumed_after_a_restart_numbers_its_calls_after_those_it_holds() {
    let dir = scratch("numbering");
    let config = resume_config(&dir);
    let mut first = serve_process(&config, &dir).await;
    let chat = first.api.new_session("again").await;
    let (run, mut events) = first.api.continue_session(&chat, "Add p-17").await;
    let asked = events.until("approval-requested").await;
    assert_eq!(asked.last().unwrap().data["call_id"], "call_1_1");
    let question = asked.last().unwrap().data["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for_status(&first.api, &chat, 0, "waiting-for-approval").await;
    first.child.kill().await.unwrap();
    drop(events);

    let mut second = serve_process(&config, &dir).await;
    let api = &second.api;
    let path = format!("/v1/agents/again/runs/{run}/approvals/{question}");
    let (status, answered) = json_of(api.post(&path, json!({"approve": true})).await).await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    assert_eq!(answered["resumed"], true, "{answered}");
    // The new loop's first call is numbered after the run's `call_1_1`.
    let again = live_question(api, &run).await;
    assert_eq!(again["call_id"], "call_2_1", "{again}");
    let path = format!(
        "/v1/agents/again/runs/{run}/approvals/{}",
        again["approval_id"].as_str().unwrap()
    );
    let (status, _) = json_of(api.post(&path, json!({"approve": false})).await).await;
    assert_eq!(status, StatusCode::OK);
    wait_for_status(api, &chat, 0, "finished").await;
    let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    let mut called = Vec::new();
    let mut answered = Vec::new();
    for message in read["messages"].as_array().unwrap() {
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            called.push(call["id"].as_str().unwrap().to_string());
        }
        if message["role"] == "tool" {
            answered.push(message["call_id"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(called, ["call_1_1", "call_2_1", "call_3_1"], "{read}");
    assert_eq!(answered, called, "each call answered once: {read}");
    // The approved call was recorded under its own id, once.
    let calls = read["runs"][0]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["call_id"], "call_1_1");
    assert_eq!(calls[0]["status"], "answered");

    second.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_request_is_refused_before_a_session_or_run_is_kept() {
    let dir = scratch("empty");
    let config = kill_config(&dir);
    let mut server = serve_process(&config, &dir).await;
    let api = &server.api;
    let (status, answer) = json_of(
        api.post("/v1/agents/clerk/runs", json!({"input": "  "}))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("the request is empty")
    );
    let chat = api.new_session("clerk").await;
    let (status, answer) = json_of(
        api.post(&format!("/v1/sessions/{chat}/runs"), json!({"input": ""}))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let (_, listed) = api.get("/v1/sessions").await;
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1, "{listed}");
    let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    assert_eq!(read["runs"].as_array().unwrap().len(), 0, "{read}");
    assert_eq!(read["messages"].as_array().unwrap().len(), 0, "{read}");
    server.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// `twice` asks before each of two `add_to_cart` calls.
fn twice_config(dir: &Path) -> PathBuf {
    asking_cart_config(
        dir,
        "twice",
        &[
            r#"'{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}'"#,
            r#"'{"name": "add_to_cart", "arguments": {"product_id": "p-18"}}'"#,
            r#""Both are in your cart.""#,
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_replayed_after_a_restart_cannot_approve_the_resumed_runs_next_question() {
    let dir = scratch("replay");
    let config = twice_config(&dir);
    let mut first = serve_process(&config, &dir).await;
    let chat = first.api.new_session("twice").await;
    let (run, mut events) = first.api.continue_session(&chat, "Add p-17 and p-18").await;
    let asked = events.until("approval-requested").await;
    let question = asked.last().unwrap().data["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for_status(&first.api, &chat, 0, "waiting-for-approval").await;
    // `kill -9`: the question waits in the store.
    first.child.kill().await.unwrap();
    drop(events);

    let mut second = serve_process(&config, &dir).await;
    let api = &second.api;
    let path = format!("/v1/agents/twice/runs/{run}/approvals/{question}");
    let (status, answered) = json_of(api.post(&path, json!({"approve": true})).await).await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    assert_eq!(answered["resumed"], true, "{answered}");
    // The resumed run asks about its next call.
    let next = live_question(api, &run).await;
    assert_eq!(next["call_id"], "call_2_1", "{next}");
    // The same answer again, as an attacker who saw the first one would
    // send it: nothing waits under that id any more (the new question has
    // an id of its own).
    let (status, replayed) = json_of(api.post(&path, json!({"approve": true})).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{replayed}");
    assert_ne!(next["approval_id"], question.as_str(), "{next}");
    // The resumed run's question still waits, unanswered.
    let still = live_question(api, &run).await;
    assert_eq!(still["approval_id"], next["approval_id"], "{still}");
    let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    let results: Vec<&Value> = read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results.len(), 1, "only the first call ran: {read}");
    let path = format!(
        "/v1/agents/twice/runs/{run}/approvals/{}",
        next["approval_id"].as_str().unwrap()
    );
    let (status, _) = json_of(api.post(&path, json!({"approve": false})).await).await;
    assert_eq!(status, StatusCode::OK);
    // The run ends (how, its script's business).
    tokio::time::timeout(HANG, async {
        loop {
            let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
            let status = read["runs"][0]["status"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if status != "running" && status != "waiting-for-approval" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the run ends");
    // Answered once; an answer to it again is a 404 as well.
    let (status, _) = json_of(api.post(&path, json!({"approve": true})).await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    second.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_be_opened_stops_wma_serve_before_it_listens() {
    let dir = scratch("unreachable");
    // A port nothing listens on: the store's database cannot be reached.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.join("wma.toml");
    std::fs::write(
        &config,
        format!(
            "[providers.p]\nkind = \"scripted\"\nreplies = [\"-\"]\n[agents.a]\nprovider = \"p\"\n\
             [server]\ntoken_file = \"token\"\n\
             [store]\ndatabase_url = \"postgres://wma:secret@127.0.0.1:{port}/wma\"\n"
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let (ok, out, said) = wma(
        &["serve", "--config", &config, "--listen", "127.0.0.1:0"],
        "",
        &dir,
    )
    .await;
    assert!(!ok);
    assert!(!out.contains("http listening"), "{out}");
    assert!(said.contains("could not open the session store"), "{said}");
    assert!(said.contains("cannot be reached"), "{said}");
    // The password is not repeated.
    assert!(!said.contains("secret"), "{said}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_denied_after_a_restart_reaches_the_model_as_denied() {
    let dir = scratch("deny");
    let config = kill_config(&dir);
    let mut first = serve_process(&config, &dir).await;
    let api = &first.api;
    let Asked {
        chat,
        run: asking,
        events,
        question,
        seen,
    } = api.clerk_asks().await;
    wait_for_status(api, &chat, 1, "waiting-for-approval").await;
    first.child.kill().await.unwrap();
    drop(events);

    let mut second = serve_process(&config, &dir).await;
    let api = &second.api;
    let path = format!("/v1/agents/clerk/runs/{asking}/approvals/{question}");
    let (status, answered) = json_of(
        api.post(&path, json!({"approve": false, "note": "not now"}))
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    assert_eq!(answered["resumed"], true, "{answered}");
    // The decision and the denial come first on the run's log, numbered
    // on from what the client saw; a new loop goes on after them.
    let mut follow = api
        .events_after(&asking, seen.last().unwrap().id.unwrap())
        .await;
    let decided = follow.next().await.unwrap();
    assert_eq!(decided.id, Some(seen.last().unwrap().id.unwrap() + 1));
    assert_eq!(decided.data["type"], "approval-decided");
    assert_eq!(decided.data["approved"], false);
    let denied = follow.next().await.unwrap();
    assert_eq!(denied.data["type"], "tool-error");
    assert_eq!(denied.data["error"]["code"], "denied");
    assert_eq!(
        denied.data["error"]["message"],
        "the call was not approved: not now"
    );
    let next = follow.next().await.unwrap();
    assert_eq!(next.data["type"], "message-start");
    // The denial is in the history as the call's error; nothing was sent.
    let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    assert_eq!(read["messages"][3]["tool_calls"][0]["name"], "add_to_cart");
    assert_eq!(read["messages"][4]["role"], "tool", "{read}");
    assert_eq!(read["messages"][4]["is_error"], true);
    assert_eq!(
        read["messages"][4]["content"],
        "Error [denied]: the call was not approved: not now"
    );
    assert_eq!(read["runs"][1]["calls"], json!([]));
    second.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

// `wma chat --session` records its calls before it sends them

/// `wma chat ARGS` as a process of its own, its stdin open for the test to
/// write to, its stderr lines collected as they come.
struct ChatProcess {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stderr: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
}

impl ChatProcess {
    fn start(args: &[&str], cache: &Path) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wma"))
            .args(args)
            .env("WMA_CACHE_DIR", cache)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stderr = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let said = stderr.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                said.lock().push(line);
            }
        });
        Self {
            child,
            stdin,
            stderr,
        }
    }

    async fn say(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// The first line of stderr that `find` accepts, once it came.
    async fn said<T>(&self, find: impl Fn(&str) -> Option<T>) -> T {
        tokio::time::timeout(HANG, async {
            loop {
                if let Some(found) = self.stderr.lock().iter().find_map(|l| find(l)) {
                    return found;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("`wma chat` never said it: {:?}", self.stderr.lock()))
    }
}

/// The id a `wma chat --new-session` prints for its session.
fn new_session_id(line: &str) -> Option<String> {
    let rest = line.strip_prefix("session ")?;
    Some(rest.split_whitespace().next()?.to_string())
}

/// Waits until the MCP server got `count` calls.
async fn server_got(orders: &wma_testkit::McpTestServer, count: usize) {
    tokio::time::timeout(HANG, async {
        while orders.calls().len() < count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the server got {:?}, not {count} calls", orders.calls()));
}

/// The store of `dir`, opened under another host's name: its recovery
/// leaves the chat's runs and calls as the chat left them.
async fn reader_store(dir: &Path) -> Store {
    Store::open(StoreOptions::in_data_dir(dir.join("data")).with_host("test-reader"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wma_chat_records_its_consequential_calls_with_the_key_their_server_got() {
    use webmcp_agents::store::CallStatus;
    use webmcp_agents::tools::IDEMPOTENCY_KEY_META;
    let dir = scratch("chat-calls");
    let orders = wma_testkit::McpTestServer::start().unwrap();
    let config = auto_config(&dir, &orders.url(), &BUYER[..3]);
    let config = config.display().to_string();
    let (ok, out, said) = wma(
        &["chat", "--config", &config, "--new-session"],
        "Buy a tent\n/exit\n",
        &dir,
    )
    .await;
    assert!(ok, "{said}");
    assert!(out.contains("Ordered."), "{out}");
    let id = said
        .lines()
        .find_map(new_session_id)
        .unwrap_or_else(|| panic!("the new session's id is printed: {said}"));

    let store = reader_store(&dir).await;
    let runs = store.runs_of_session(&id).await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    // Only the consequential call is recorded; the read-only one is not,
    // and its server got no key with it.
    let calls = store.calls_of_run(&runs[0].id).await.unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert_eq!(call.tool, "place_order");
    assert_eq!(call.agent, "buyer");
    assert_eq!(call.call_id, "call_2_1");
    assert_eq!(call.arguments, json!({"item": "tent"}));
    let received = orders.calls();
    assert_eq!(received.len(), 2, "{received:?}");
    assert_eq!(received[0].tool, "order_status");
    assert!(
        received[0].meta.get(IDEMPOTENCY_KEY_META).is_none(),
        "{received:?}"
    );
    assert_eq!(received[1].tool, "place_order");
    assert_eq!(
        received[1].meta[IDEMPOTENCY_KEY_META],
        call.idempotency_key.as_str(),
        "the server got the recorded key: {received:?}"
    );
    // Finished after with what the server answered (which echoes the key).
    assert_eq!(call.status, CallStatus::Answered, "{call:?}");
    assert!(!call.is_error);
    let output = call.output.as_deref().unwrap();
    assert!(
        output.starts_with("placed tent") && output.contains(&call.idempotency_key),
        "{output}"
    );
    assert!(call.answered_at.is_some_and(|t| t >= call.started_at));
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_ctrl_c_stops_in_wma_chat_is_in_doubt_at_once() {
    use webmcp_agents::store::CallStatus;
    let dir = scratch("chat-stopped");
    let orders = wma_testkit::McpTestServer::start().unwrap();
    let config = auto_config(&dir, &orders.url(), &[BUYER[3], "Nothing held."]);
    let config = config.display().to_string();
    let mut chat = ChatProcess::start(&["chat", "--config", &config, "--new-session"], &dir);
    let id = chat.said(new_session_id).await;
    chat.say("Buy a stove").await;
    server_got(&orders, 1).await;
    // Ctrl-C stops the reply in the middle of the call; the chat goes on.
    let pid = chat.child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    chat.said(|l| {
        l.contains("is in doubt; check whether it happened")
            .then_some(())
    })
    .await;
    let store = reader_store(&dir).await;
    let runs = store.runs_of_session(&id).await.unwrap();
    let calls = store.calls_of_run(&runs[0].id).await.unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].tool, "hold_order");
    assert_eq!(calls[0].status, CallStatus::InDoubt, "{calls:?}");
    // A late answer cannot change that; the chat goes on.
    orders.release();
    chat.say("Is it held?").await;
    chat.say("/exit").await;
    let status = tokio::time::timeout(HANG, chat.child.wait())
        .await
        .expect("the chat ends")
        .unwrap();
    assert!(status.success(), "{:?}", chat.stderr.lock());
    let calls = store.calls_of_run(&runs[0].id).await.unwrap();
    assert_eq!(calls[0].status, CallStatus::InDoubt, "{calls:?}");
    assert_eq!(orders.calls().len(), 1);
    // The history answers the stopped call: in doubt, with its key.
    let messages: Vec<Value> = store
        .messages(&id)
        .await
        .unwrap()
        .iter()
        .map(|m| serde_json::to_value(m).unwrap())
        .collect();
    assert_eq!(messages.len(), 5, "{messages:?}");
    assert_eq!(messages[1]["tool_calls"][0]["name"], "hold_order");
    assert_eq!(messages[2]["call_id"], messages[1]["tool_calls"][0]["id"]);
    let content = messages[2]["content"].as_str().unwrap();
    assert!(
        content.starts_with(
            "Error [cancelled]: the person stopped the reply while this call was in flight"
        ) && content.contains(&calls[0].idempotency_key),
        "{content}"
    );
    assert_eq!(messages[3]["content"], "Is it held?");
    assert_eq!(messages[4]["content"], "Nothing held.");
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_wma_chat_leaves_its_call_in_doubt_and_never_sends_it_again() {
    use webmcp_agents::store::{CallStatus, RunStatus};
    use webmcp_agents::tools::IDEMPOTENCY_KEY_META;
    let dir = scratch("chat-killed");
    let orders = wma_testkit::McpTestServer::start().unwrap();
    let config = auto_config(&dir, &orders.url(), &[BUYER[3], "Ordered."]);
    let config = config.display().to_string();
    let mut chat = ChatProcess::start(&["chat", "--config", &config, "--new-session"], &dir);
    let id = chat.said(new_session_id).await;
    chat.say("Buy a stove").await;
    server_got(&orders, 1).await;

    // Recorded in flight, with the key its server got, before it answered.
    let store = reader_store(&dir).await;
    let runs = store.runs_of_session(&id).await.unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = runs[0].id.clone();
    let calls = store.calls_of_run(&run).await.unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, CallStatus::InFlight);
    let key = calls[0].idempotency_key.clone();
    assert_eq!(orders.calls()[0].meta[IDEMPOTENCY_KEY_META], key.as_str());
    store.close().await;

    // The chat dies in the middle of the call.
    chat.child.kill().await.unwrap();

    // Continued with a model that now only talks: the chat says the call
    // is in doubt, the session holds it as such, and it is not sent again.
    let config = auto_config(&dir, &orders.url(), &["It may have gone through."]);
    let config = config.display().to_string();
    let (ok, out, said) = wma(
        &["chat", "--config", &config, "--session", &id],
        "Did it go through?\n/exit\n",
        &dir,
    )
    .await;
    assert!(ok, "{said}");
    assert!(out.contains("It may have gone through."), "{out}");
    assert!(
        said.contains(&format!("recovered: call {key} of run {run}")),
        "{said}"
    );
    assert!(
        said.contains(&format!("call call_1_1 of the last turn (hold_order {{\"item\":\"stove\"}}) is in doubt (key {key})")),
        "{said}"
    );
    assert_eq!(orders.calls().len(), 1, "never sent again");

    let store = reader_store(&dir).await;
    let stored = store.run(&run).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Interrupted);
    let calls = store.calls_of_run(&run).await.unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, CallStatus::InDoubt);
    assert_eq!(calls[0].idempotency_key, key);
    // The cut turn is in the history the model read: the call, and an
    // error saying it is in doubt; then the new turn.
    let messages: Vec<Value> = store
        .messages(&id)
        .await
        .unwrap()
        .iter()
        .map(|m| serde_json::to_value(m).unwrap())
        .collect();
    assert_eq!(messages.len(), 5, "{messages:?}");
    assert_eq!(messages[0]["content"], "Buy a stove");
    assert_eq!(messages[1]["tool_calls"][0]["name"], "hold_order");
    assert_eq!(messages[1]["tool_calls"][0]["id"], "call_1_1");
    assert_eq!(messages[2]["role"], "tool");
    assert_eq!(messages[2]["call_id"], "call_1_1");
    assert_eq!(messages[2]["is_error"], true);
    let content = messages[2]["content"].as_str().unwrap();
    assert!(
        content.starts_with("Error [cancelled]: ")
            && content.contains("in doubt")
            && content.contains(&key),
        "{content}"
    );
    assert_eq!(messages[3]["content"], "Did it go through?");
    assert_eq!(messages[4]["content"], "It may have gone through.");
    // The new turn is a run of its own, which made no call.
    let runs = store.runs_of_session(&id).await.unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].status, RunStatus::Finished);
    assert!(store.calls_of_run(&runs[1].id).await.unwrap().is_empty());
    store.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// `lead` hands `buyer` two tasks in one run; `buyer` places an order of
/// the MCP server at `mcp_url` for each (consequential, `auto`).
fn team_config(dir: &Path, mcp_url: &str) -> PathBuf {
    let text = format!(
        r#"
[providers.lead]
kind = "scripted"
replies = [
    '{{"name": "buyer", "arguments": {{"task": "Buy a tent"}}}}',
    '{{"name": "buyer", "arguments": {{"task": "Buy a tent for my brother too"}}}}',
    "Both are ordered.",
]

[providers.buyer]
kind = "scripted"
replies = [
    '{{"name": "place_order", "arguments": {{"item": "tent"}}}}',
    "Ordered.",
    '{{"name": "place_order", "arguments": {{"item": "tent"}}}}',
    "Ordered.",
]

[tools.orders]
kind = "mcp-http"
url = {url}

[agents.lead]
provider = "lead"
sub_agents = ["buyer"]

[agents.buyer]
provider = "buyer"
tools = ["orders"]
approval = {{ consequential = "auto" }}

"#,
        url = toml_str(mcp_url),
    );
    write_config(dir, &text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_of_one_sub_agent_in_a_run_are_told_apart_in_its_log_and_call_records() {
    let dir = scratch("sub-runs");
    let orders = wma_testkit::McpTestServer::start().unwrap();
    let config = team_config(&dir, &orders.url());
    let mut server = serve_process(&config, &dir).await;
    let api = &server.api;
    let chat = api.new_session("lead").await;
    let (run, mut events) = api.continue_session(&chat, "Buy two tents").await;
    let parts = events.rest().await;
    assert_eq!(parts.last().unwrap().data["type"], "finish", "{parts:?}");
    assert_eq!(orders.calls().len(), 2, "{:?}", orders.calls());

    // Both of the sub-agent's runs number their call `call_1_1`, with the
    // same tool and arguments; each part says which of the run's sub-agent
    // runs it is from: the first delegation's, then the second's.
    let calls_of = |parts: &[Event]| -> Vec<Value> {
        parts
            .iter()
            .filter(|e| e.data["type"] == "tool-call" && e.data["agent"] == "buyer")
            .map(|e| e.data.clone())
            .collect()
    };
    let sub_calls = calls_of(&parts);
    assert_eq!(sub_calls.len(), 2, "{parts:?}");
    assert_eq!(sub_calls[0]["call_id"], sub_calls[1]["call_id"]);
    assert_eq!(sub_calls[0]["sub_run"], "1", "{:?}", sub_calls[0]);
    assert_eq!(sub_calls[1]["sub_run"], "2", "{:?}", sub_calls[1]);
    // The run's own parts carry none: a run without sub-agents reads as
    // it always did.
    assert!(
        parts
            .iter()
            .filter(|e| e.data["depth"] == 0)
            .all(|e| e.data.get("sub_run").is_none()),
        "{parts:?}"
    );
    // The log read back says the same.
    let logged = api.events_after(&run, 0).await.rest().await;
    assert_eq!(calls_of(&logged), sub_calls);

    // Each call record names its sub-agent run and holds its own answer,
    // with the key its server got.
    let records = calls_once(api, &chat, 0, |c| {
        c.len() == 2 && c.iter().all(|c| c["status"] == "answered")
    })
    .await;
    let mut by_sub_run: Vec<(String, String)> = records
        .iter()
        .map(|c| {
            assert_eq!(c["agent"], "buyer");
            assert_eq!(c["call_id"], "call_1_1");
            (
                c["sub_run"].as_str().unwrap_or_default().to_string(),
                c["idempotency_key"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    by_sub_run.sort();
    assert_eq!(by_sub_run[0].0, "1", "{records:?}");
    assert_eq!(by_sub_run[1].0, "2", "{records:?}");
    let received = orders.calls();
    use webmcp_agents::tools::IDEMPOTENCY_KEY_META;
    assert_eq!(
        received[0].meta[IDEMPOTENCY_KEY_META],
        by_sub_run[0].1.as_str()
    );
    assert_eq!(
        received[1].meta[IDEMPOTENCY_KEY_META],
        by_sub_run[1].1.as_str()
    );
    for record in &records {
        let key = record["idempotency_key"].as_str().unwrap();
        assert!(
            record["output"].as_str().unwrap().contains(key),
            "each record holds its own call's answer: {records:?}"
        );
    }
    server.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// `boss` hands `buyer` a task, then asks before `add_to_cart`; a new
/// process's models start their replies afresh, so the run it resumes
/// hands `buyer` the task again.
fn resumed_team_config(dir: &Path, mcp_url: &str) -> PathBuf {
    let text = format!(
        r#"
[providers.boss]
kind = "scripted"
replies = [
    '{{"name": "buyer", "arguments": {{"task": "Buy a tent"}}}}',
    '{{"name": "add_to_cart", "arguments": {{"product_id": "p-17"}}}}',
    "Done.",
    "Done.",
    "Done.",
]

[providers.buyer]
kind = "scripted"
replies = [
    '{{"name": "place_order", "arguments": {{"item": "tent"}}}}',
    "Ordered.",
]

[tools.orders]
kind = "mcp-http"
url = {url}

[tools.cart]
kind = "demo-shop"
allow = ["add_to_cart"]

[agents.boss]
provider = "boss"
tools = ["cart"]
sub_agents = ["buyer"]
approval = {{ tools = {{ add_to_cart = "ask" }} }}

[agents.buyer]
provider = "buyer"
tools = ["orders"]
approval = {{ consequential = "auto" }}

"#,
        url = toml_str(mcp_url),
    );
    write_config(dir, &text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumed_after_a_restart_numbers_its_sub_agent_runs_after_those_it_holds() {
    let dir = scratch("sub-runs-resumed");
    let orders = wma_testkit::McpTestServer::start().unwrap();
    let config = resumed_team_config(&dir, &orders.url());
    let mut first = serve_process(&config, &dir).await;
    let chat = first.api.new_session("boss").await;
    let (run, mut events) = first.api.continue_session(&chat, "Buy a tent").await;
    let asked = events.until("approval-requested").await;
    let question = asked.last().unwrap().data["approval_id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_for_status(&first.api, &chat, 0, "waiting-for-approval").await;
    first.child.kill().await.unwrap();
    drop(events);

    let mut second = serve_process(&config, &dir).await;
    let api = &second.api;
    let path = format!("/v1/agents/boss/runs/{run}/approvals/{question}");
    let (status, answered) = json_of(api.post(&path, json!({"approve": true})).await).await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    assert_eq!(answered["resumed"], true, "{answered}");
    // The new loop hands `buyer` the task again (its model starts afresh),
    // then asks again: denied, and the run ends.
    let again = live_question(api, &run).await;
    let path = format!(
        "/v1/agents/boss/runs/{run}/approvals/{}",
        again["approval_id"].as_str().unwrap()
    );
    let (status, _) = json_of(api.post(&path, json!({"approve": false})).await).await;
    assert_eq!(status, StatusCode::OK);
    wait_for_status(api, &chat, 0, "finished").await;
    assert_eq!(orders.calls().len(), 2, "{:?}", orders.calls());

    // `buyer`'s run before the restart is the run's first; the resumed
    // loop's, though its first delegation, is the second.
    let logged = api.events_after(&run, 0).await.rest().await;
    let sub_runs: Vec<&Value> = logged
        .iter()
        .filter(|e| e.data["type"] == "tool-call" && e.data["agent"] == "buyer")
        .map(|e| &e.data["sub_run"])
        .collect();
    assert_eq!(sub_runs, [&json!("1"), &json!("2")], "{logged:?}");
    let records = calls_once(api, &chat, 0, |c| {
        c.iter()
            .filter(|c| c["agent"] == "buyer" && c["status"] == "answered")
            .count()
            == 2
    })
    .await;
    let mut buyer: Vec<(String, String)> = records
        .iter()
        .filter(|c| c["agent"] == "buyer")
        .map(|c| {
            (
                c["sub_run"].as_str().unwrap_or_default().to_string(),
                c["call_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    buyer.sort();
    assert_eq!(
        buyer,
        [
            ("1".to_string(), "call_1_1".to_string()),
            ("2".to_string(), "call_1_1".to_string())
        ],
        "{records:?}"
    );
    second.child.kill().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_host_of_the_same_name_is_refused_and_leaves_the_first_ones_runs_alone() {
    let dir = scratch("one-host");
    let config = kill_config(&dir);
    let mut server = serve_process(&config, &dir).await;
    let api = &server.api;
    let chat = api.new_session("slow").await;
    let (run, mut events) = api.continue_session(&chat, "Take your time").await;
    events.until("message-start").await;

    // A second process on the same store under the same name (`local`)
    // would mark the first one's run interrupted as it opened the store.
    let config = config.display().to_string();
    let (ok, _, said) = wma(&["chat", "--config", &config, "--sessions"], "", &dir).await;
    assert!(!ok, "{said}");
    assert!(
        said.contains("open as host `local`") && said.contains("[store] host"),
        "{said}"
    );
    let (_, read) = api.get(&format!("/v1/sessions/{chat}")).await;
    assert_eq!(read["runs"][0]["id"], run.as_str());
    assert_eq!(read["runs"][0]["status"], "running", "{read}");

    // Once the first is gone (killed), the name is free.
    server.child.kill().await.unwrap();
    drop(events);
    let (ok, listed, said) = wma(&["chat", "--config", &config, "--sessions"], "", &dir).await;
    assert!(ok, "{said}");
    assert!(listed.contains(&chat), "{listed}");
    assert!(
        said.contains(&format!(
            "recovered: 1 run(s) this host left running are now interrupted: {run}"
        )),
        "{said}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
