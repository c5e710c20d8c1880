//! The served-model provider against a real llama.cpp server (llama.cpp's
//! own server code, in process, from the pinned `xllamacpp` wheel that
//! `scripts/install-peers.sh` installs; `scripts/serve_llamacpp.py`)
//! serving the default model's GGUF (`scripts/setup.sh`): a tool call
//! through the loop, Stop in the middle of a generation, a server that
//! dies, and hot swaps between the ONNX Runtime provider and the served
//! one while runs are in flight.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, Constraint, ConstraintMode, FinishReason,
    GenerateRequest, LocalLoopOptions, PromptMessage, PromptRole, Provider, ToolDefinition,
    run_local_agent,
};
use webmcp_agents::config::{Config, StartOptions, provider_source};
use wma_provider_openai::{OpenAiOptions, OpenAiProvider, PROVIDER_NAME};
use wma_testkit::{InMemoryToolHost, LlamaServer};

/// How long a test waits for something that must happen before it calls
/// it a hang. Not a measure of speed: the checks pass as soon as it happens.
const HANG: Duration = Duration::from_secs(120);

/// The context the test servers get.
const CTX: u32 = 2048;

fn server() -> LlamaServer {
    LlamaServer::start_default(CTX)
        .unwrap_or_else(|e| panic!("a llama.cpp server for the served-provider tests: {e}"))
}

async fn prepared(options: OpenAiOptions) -> OpenAiProvider {
    let provider = OpenAiProvider::new(options).expect("valid options");
    provider
        .prepare(Arc::new(|_| {}), CancellationToken::new())
        .await
        .expect("the served model is there");
    provider
}

fn weather_tool() -> ToolDefinition {
    ToolDefinition::new(
        "get_weather",
        "Get the current weather of a city.",
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    )
}

/// Whether the server's one slot is generating (llama.cpp's `/slots`).
async fn busy(url: &str) -> bool {
    let Ok(response) = reqwest::get(format!("{url}/slots")).await else {
        return false;
    };
    let Ok(slots) = response.text().await else {
        return false;
    };
    serde_json::from_str::<Value>(&slots)
        .ok()
        .and_then(|s| s.as_array().cloned())
        .is_some_and(|s| s.iter().any(|slot| slot["is_processing"] == true))
}

/// Waits until the server's slot is as `wanted` (busy or idle).
async fn until_busy(url: &str, wanted: bool) {
    tokio::time::timeout(HANG, async {
        while busy(url).await != wanted {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the server's slot never became busy = {wanted}"));
}

fn terminal(parts: &[AgentStreamPart]) -> &AgentStreamPart {
    parts.last().expect("a run has parts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_model_calls_a_tool_through_the_loop_and_reports_usage() {
    let server = server();
    let mut options = OpenAiOptions::new(server.url(), "smollm2");
    options.max_new_tokens = 48;
    options.temperature = Some(0.0);
    let provider = prepared(options).await;
    // The context size is the server's own.
    assert_eq!(provider.info().context_length, Some(CTX));
    assert_eq!(provider.info().provider, PROVIDER_NAME);

    // One generation under "calls only": the server's own tool call comes
    // back as the call text the loop reads, with usage and timings.
    let request = GenerateRequest {
        messages: vec![
            PromptMessage::new(PromptRole::System, "You are a helpful assistant."),
            PromptMessage::new(PromptRole::User, "What is the weather in Paris?"),
        ],
        tools: vec![weather_tool()],
        constraint: Some(Constraint::CallsOnly {
            tools: vec![weather_tool()],
        }),
        ..GenerateRequest::default()
    };
    assert!(provider.fits(&request).await.unwrap());
    let generation = provider
        .generate(request, CancellationToken::new())
        .await
        .unwrap();
    let parsed = webmcp_agents::agent::parse_tool_calls(&generation.text);
    assert_eq!(parsed.calls.len(), 1, "{}", generation.text);
    assert_eq!(parsed.calls[0].name, "get_weather");
    assert!(generation.input_tokens.is_some_and(|n| n > 10));
    assert!(generation.output_tokens.is_some_and(|n| n > 0));
    assert!(generation.time_to_first_token.is_some());

    // A prompt longer than the context does not fit.
    let long = GenerateRequest {
        messages: vec![PromptMessage::new(PromptRole::User, "word ".repeat(3000))],
        ..GenerateRequest::default()
    };
    assert!(!provider.fits(&long).await.unwrap());

    // A whole run: the loop validates the call and runs the tool.
    let host = Arc::new(InMemoryToolHost::new());
    host.add(weather_tool(), |args| {
        Ok(json!({"city": args["city"], "sky": "sunny", "celsius": 21}).to_string())
    });
    let loop_options = LocalLoopOptions {
        tools_inline: provider.tools_inline(),
        constraints: ConstraintMode::CallsOnly,
        max_steps: 1,
        // The prompt with the tools in it is long for a CPU shared by a
        // whole test suite.
        step_timeout: Duration::from_secs(600),
        ..LocalLoopOptions::default()
    };
    let request = AgentRunRequest::new(
        vec![ChatMessage::user("What is the weather in Paris?")],
        host.clone(),
    );
    let parts: Vec<AgentStreamPart> = run_local_agent(Arc::new(provider), request, loop_options)
        .collect()
        .await;
    let calls = host.calls();
    assert_eq!(calls.len(), 1, "{parts:?}");
    assert_eq!(calls[0].name, "get_weather");
    assert!(calls[0].arguments["city"].is_string(), "{:?}", calls[0]);
    assert!(
        parts.iter().any(
            |p| matches!(p, AgentStreamPart::ToolResult { name, .. } if name == "get_weather")
        ),
        "{parts:?}"
    );
    assert!(
        matches!(terminal(&parts), AgentStreamPart::Finish { .. }),
        "{parts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_ends_a_served_generation_and_the_server_serves_on() {
    let server = server();
    let mut options = OpenAiOptions::new(server.url(), "smollm2");
    // Far more than the test waits for: the run is cut while generating.
    options.max_new_tokens = 1500;
    let provider = Arc::new(prepared(options).await);
    let host = Arc::new(InMemoryToolHost::new());
    let request = AgentRunRequest::new(
        vec![ChatMessage::user(
            "Write a very long story about a dragon who learns to cook.",
        )],
        host,
    );
    let stop = request.cancel.clone();
    let loop_options = LocalLoopOptions {
        constraints: ConstraintMode::Off,
        step_timeout: Duration::from_secs(600),
        max_steps: 1,
        ..LocalLoopOptions::default()
    };
    let run =
        tokio::spawn(run_local_agent(provider.clone(), request, loop_options).collect::<Vec<_>>());
    until_busy(server.url(), true).await;
    stop.cancel();
    let parts = tokio::time::timeout(HANG, run)
        .await
        .expect("Stop ends the run")
        .unwrap();
    assert_eq!(
        terminal(&parts),
        &AgentStreamPart::Finish {
            reason: FinishReason::Aborted
        }
    );
    // The request was dropped, and the server dropped its generation: the
    // slot goes idle long before 1500 tokens, and the next request is
    // answered.
    until_busy(server.url(), false).await;
    let request = GenerateRequest {
        messages: vec![PromptMessage::new(PromptRole::User, "Say hi.")],
        max_new_tokens: Some(4),
        ..GenerateRequest::default()
    };
    let generation =
        tokio::time::timeout(HANG, provider.generate(request, CancellationToken::new()))
            .await
            .expect("the server answers after a Stop")
            .unwrap();
    assert!(generation.output_tokens.is_some_and(|n| n <= 4));
}

/// A config with a served provider at `url` (`max_new_tokens` a reply)
/// and a scripted one.
fn config(url: &str, max_new_tokens: u32, extra: &str) -> Config {
    let text = format!(
        r#"
[providers.served]
kind = "openai"
url = "{url}"
model = "smollm2"
max_new_tokens = {max_new_tokens}
request_timeout_secs = 600

[providers.backup]
kind = "scripted"
model = "backup-model"
replies = ["Still here.", "Still here.", "Still here."]

[agents.teller]
provider = "served"
constraints = "off"
max_steps = 1
step_timeout_secs = 600

[agents.keeper]
provider = "backup"
max_steps = 1
{extra}
"#
    );
    Config::parse(&text, "served.toml").expect("the config is valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_model_that_dies_is_a_clear_error_and_the_host_serves_on() {
    let mut server = server();
    let config = config(server.url(), 1500, "");
    let hosted = config.start(StartOptions::default()).await.unwrap();
    let teller = hosted.runtime.agent("teller").unwrap();
    let run = teller
        .run(vec![ChatMessage::user(
            "Write a very long story about a dragon who learns to cook.",
        )])
        .await
        .unwrap();
    let run = tokio::spawn(run.collect::<Vec<_>>());
    until_busy(server.url(), true).await;
    // The server dies in the middle of the answer.
    server.kill();
    let parts = tokio::time::timeout(HANG, run)
        .await
        .expect("the run ends when its server dies")
        .unwrap();
    let AgentStreamPart::Error { message } = terminal(&parts) else {
        panic!("a dead server is an error: {parts:?}");
    };
    assert!(
        message.contains("closed the connection") || message.contains("cannot reach"),
        "{message}"
    );

    // The next run on the dead server says it cannot be reached.
    let parts: Vec<_> = teller
        .run(vec![ChatMessage::user("Hello?")])
        .await
        .unwrap()
        .collect()
        .await;
    let AgentStreamPart::Error { message } = terminal(&parts) else {
        panic!("a dead server is an error: {parts:?}");
    };
    assert!(message.contains("cannot reach"), "{message}");

    // The host serves on: another agent's run, and this agent's on another
    // provider, work.
    let parts: Vec<_> = hosted
        .runtime
        .agent("keeper")
        .unwrap()
        .run(vec![ChatMessage::user("Are you there?")])
        .await
        .unwrap()
        .collect()
        .await;
    assert!(
        parts.contains(&AgentStreamPart::Text {
            text: "Still here.".into()
        }),
        "{parts:?}"
    );
    let (_, handle) = hosted.runtime.provider_of("teller").unwrap();
    let backup = &config.provider("backup").unwrap().spec;
    let info = handle.swap(provider_source(backup), |_| {}).await.unwrap();
    assert_eq!(info.model, "backup-model");
    let parts: Vec<_> = teller
        .run(vec![ChatMessage::user("Are you there?")])
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(
        terminal(&parts),
        &AgentStreamPart::Finish {
            reason: FinishReason::Stop
        },
        "{parts:?}"
    );
    hosted.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_swaps_between_onnx_and_served_while_runs_are_in_flight() {
    let server = server();
    // The default model's ONNX folder (scripts/setup.sh) on one side, its
    // GGUF served by llama.cpp on the other.
    let config = config(
        server.url(),
        64,
        r#"
[providers.local]
kind = "onnx"
max_new_tokens = 48
threads = 1

[agents.swapper]
provider = "local"
constraints = "off"
max_steps = 1
step_timeout_secs = 600
"#,
    );
    let hosted = config.start(StartOptions::default()).await.unwrap();
    let agent = hosted.runtime.agent("swapper").unwrap();
    let (_, handle) = hosted.runtime.provider_of("swapper").unwrap();
    let spec = |name: &str| provider_source(&config.provider(name).unwrap().spec);
    let ask = || vec![ChatMessage::user("Tell me about the sea in two sentences.")];
    let until_generating = || async {
        tokio::time::timeout(HANG, async {
            while handle.in_flight() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the run reaches its generation");
    };
    assert_eq!(handle.current_info().await.unwrap().provider, "onnxruntime");

    // onnx -> served while a run generates on onnx.
    let first = tokio::spawn(agent.run(ask()).await.unwrap().collect::<Vec<_>>());
    until_generating().await;
    let info = handle.swap(spec("served"), |_| {}).await.unwrap();
    assert_eq!(info.provider, PROVIDER_NAME);

    // served -> onnx while a run generates on the served model.
    let second = tokio::spawn(agent.run(ask()).await.unwrap().collect::<Vec<_>>());
    until_busy(server.url(), true).await;
    let info = handle.swap(spec("local"), |_| {}).await.unwrap();
    assert_eq!(info.provider, "onnxruntime");

    // A run after both swaps, on onnx again.
    let third = agent.run(ask()).await.unwrap().collect::<Vec<_>>().await;
    for (name, parts) in [
        (
            "first",
            tokio::time::timeout(HANG, first).await.unwrap().unwrap(),
        ),
        (
            "second",
            tokio::time::timeout(HANG, second).await.unwrap().unwrap(),
        ),
        ("third", third),
    ] {
        assert!(
            matches!(terminal(&parts), AgentStreamPart::Finish { .. }),
            "the {name} run ends normally: {parts:?}"
        );
        assert!(
            parts
                .iter()
                .any(|p| matches!(p, AgentStreamPart::Text { text } if !text.trim().is_empty())),
            "the {name} run answered: {parts:?}"
        );
    }
    assert_eq!(handle.current_info().await.unwrap().provider, "onnxruntime");
    hosted.shutdown().await;
}

/// The baseline of `wma eval tasks --direct`: a task of the suite run on the
/// served model's own tool calling, no loop, its end state checked as the
/// loop's runs are; a task whose agent delegates is not run, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_direct_baseline_runs_a_suite_task_on_the_servers_own_tool_calls() {
    use webmcp_agents::eval::tasks::{load_file, run_task_direct};
    use webmcp_agents::usage::UsageMeter;

    let server = server();
    let served = prepared(OpenAiOptions::new(server.url(), "SmolLM2-135M-Instruct")).await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/tasks");
    let todo = load_file(&root.join("todo.toml")).unwrap();
    let task = todo.iter().find(|t| t.name == "add-dentist").unwrap();
    // The runtime the task starts needs a provider for its agents; the
    // direct run never asks it.
    let meter = Arc::new(UsageMeter::new(Arc::new(
        OpenAiProvider::new(OpenAiOptions::new(server.url(), "unused")).unwrap(),
    )));
    let run = tokio::time::timeout(HANG, run_task_direct(task, &served, &meter))
        .await
        .expect("the direct run ends");
    assert_eq!(run.error, None, "{run:?}");
    assert!(run.steps >= 1, "{run:?}");
    assert!(
        run.end == "stop" || run.end == "max-steps",
        "ended {}: {run:?}",
        run.end
    );
    // What the server counted, taken from its answers.
    assert!(run.usage.input_tokens > 0, "{run:?}");
    assert!(run.usage.output_tokens > 0, "{run:?}");
    eprintln!("direct run: {run:?}");

    let team = load_file(&root.join("team.toml")).unwrap();
    let run = run_task_direct(&team[0], &served, &meter).await;
    let why = run.error.expect("a delegating agent is not run");
    assert!(why.contains("no delegation"), "{why}");
    assert!(!run.solved);
}
