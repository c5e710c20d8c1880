//! The served-model provider against a real llama.cpp server (llama.cpp's
//! own server code, in process, from the pinned `xllamacpp` wheel that
//! `scripts/install-peers.sh` installs; `scripts/serve_llamacpp.py`)
//! serving the default model's GGUF (`scripts/setup.sh`): a tool call
//! through the loop, the "text or calls" grammar a first attempt sends,
//! Stop in the middle of a generation, a server that dies, and hot swaps
//! between the ONNX Runtime provider and the served one while runs are in
//! flight.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, Constraint, ConstraintMode, FinishReason,
    GenerateRequest, LocalLoopOptions, PromptMessage, PromptRole, Provider, ToolDefinition,
    parse_tool_calls, run_local_agent, validate_args,
};
use webmcp_agents::config::{Config, StartOptions, provider_source};
use wma_provider_openai::{Dialect, OpenAiOptions, OpenAiProvider, PROVIDER_NAME};
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

/// One chat completion that went through a [`Recorder`]: the request's
/// body and the answer's bytes (HTTP head and body, as the server wrote
/// them).
#[derive(Debug, Clone)]
struct Exchange {
    request: Value,
    answer: Arc<Mutex<Vec<u8>>>,
}

impl Exchange {
    /// The reply's text, put back together from the streamed events.
    fn reply_text(&self) -> String {
        let answer = self.answer.lock().clone();
        let body_at = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an HTTP answer")
            + 4;
        let head = String::from_utf8_lossy(&answer[..body_at]).to_ascii_lowercase();
        let body = if head.contains("transfer-encoding: chunked") {
            dechunk(&answer[body_at..])
        } else {
            answer[body_at..].to_vec()
        };
        String::from_utf8_lossy(&body)
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .filter_map(|event| {
                event
                    .pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect()
    }
}

/// The body of a chunked HTTP answer.
fn dechunk(mut bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = bytes.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&bytes[..end]).unwrap_or("0");
        let size =
            usize::from_str_radix(size.split(';').next().unwrap_or("0").trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let data = end + 2;
        out.extend_from_slice(&bytes[data..(data + size).min(bytes.len())]);
        bytes = &bytes[(data + size + 2).min(bytes.len())..];
    }
    out
}

/// A proxy in front of a server that keeps every chat completion that
/// passes: what the provider sent is asserted on as the server got it.
/// Each connection carries one request (the provider opens one per
/// request), and is piped through once its request is read.
struct Recorder {
    url: String,
    exchanges: Arc<Mutex<Vec<Exchange>>>,
}

impl Recorder {
    fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_start_matches("http://").to_string();
        let exchanges: Arc<Mutex<Vec<Exchange>>> = Arc::default();
        let kept = exchanges.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let upstream = upstream.clone();
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let _ = relay(client, &upstream, &kept);
                });
            }
        });
        Self { url, exchanges }
    }

    fn chat_completions(&self) -> Vec<Exchange> {
        self.exchanges.lock().clone()
    }
}

/// Reads one request from `client`, keeps it when it is a chat
/// completion, and pipes both ways to the server at `upstream`.
fn relay(client: TcpStream, upstream: &str, kept: &Mutex<Vec<Exchange>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let mut server = TcpStream::connect(upstream)?;
    server.write_all(head.as_bytes())?;
    server.write_all(&body)?;
    let answer: Arc<Mutex<Vec<u8>>> = Arc::default();
    if head.starts_with("POST /v1/chat/completions ") {
        kept.lock().push(Exchange {
            request: serde_json::from_slice(&body).unwrap_or(Value::Null),
            answer: answer.clone(),
        });
    }
    // The client's side: whatever else it sends (nothing, then its close).
    let mut upload = server.try_clone()?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut reader, &mut upload);
        let _ = upload.shutdown(std::net::Shutdown::Write);
    });
    let mut client = client;
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let n = server.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        answer.lock().extend_from_slice(&buffer[..n]);
        client.write_all(&buffer[..n])?;
    }
    let _ = client.shutdown(std::net::Shutdown::Write);
    Ok(())
}

fn cart_tool() -> ToolDefinition {
    ToolDefinition::new(
        "add_to_cart",
        "Add a product to the shopping cart.",
        json!({
            "type": "object",
            "properties": {
                "product_id": {"type": "integer"},
                "quantity": {"type": "integer"},
            },
            "required": ["product_id"],
        }),
    )
}

/// The loop's first attempt under "text or calls" reaches llama.cpp as a
/// GBNF grammar of prose or calls to the offered tools (the default
/// model's template takes no tools, so they are in the prompt and the
/// calls come back as text), and the reply keeps to it: prose without a
/// call in it, or calls that name offered tools with arguments that
/// validate. A conversation that leads to a call gets one that does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_attempt_sends_the_text_or_calls_grammar_and_the_reply_keeps_to_it() {
    let server = server();
    let recorder = Recorder::start(server.url());
    let mut options = OpenAiOptions::new(&recorder.url, "smollm2");
    options.max_new_tokens = 64;
    options.temperature = Some(0.0);
    let provider = Arc::new(prepared(options).await);
    // Found from `/props`; the tools go inline for this template.
    assert_eq!(provider.dialect(), Dialect::LlamaCpp);
    assert!(provider.tools_inline());

    let tools = [weather_tool(), cart_tool()];
    let host = Arc::new(InMemoryToolHost::new());
    host.add(weather_tool(), |args| {
        Ok(json!({"city": args["city"], "sky": "sunny"}).to_string())
    });
    host.add(cart_tool(), |_| Ok(json!({"ok": true}).to_string()));
    let loop_options = LocalLoopOptions {
        tools_inline: provider.tools_inline(),
        constraints: ConstraintMode::Auto,
        max_steps: 1,
        step_timeout: Duration::from_secs(600),
        ..LocalLoopOptions::default()
    };
    for question in [
        "What is the weather in Paris?",
        "Who wrote the novel Moby Dick?",
    ] {
        let before = recorder.chat_completions().len();
        let request = AgentRunRequest::new(vec![ChatMessage::user(question)], host.clone());
        let parts: Vec<AgentStreamPart> =
            run_local_agent(provider.clone(), request, loop_options.clone())
                .collect()
                .await;
        assert!(
            matches!(terminal(&parts), AgentStreamPart::Finish { .. }),
            "{parts:?}"
        );
        let exchanges = recorder.chat_completions();
        let first = exchanges.get(before).expect("the run asked the server");

        let reply = keeps_to_the_grammar(first, &tools);
        eprintln!("{question} -> {reply}");
    }

    // A conversation that leads to a call: the call the reply holds names
    // an offered tool, and its arguments validate.
    let before = recorder.chat_completions().len();
    let call = r#"{"name": "get_weather", "arguments": {"city": "Rome"}}"#;
    let request = GenerateRequest {
        messages: vec![
            PromptMessage::new(
                PromptRole::System,
                format!(
                    "You can call tools. get_weather(city): the weather of a city. \
                     add_to_cart(product_id, quantity): adds a product to the cart. \
                     To call one, reply with {call}."
                ),
            ),
            PromptMessage::new(PromptRole::User, "What is the weather in Rome?"),
            PromptMessage::new(PromptRole::Assistant, call),
            PromptMessage::new(PromptRole::User, r#"Tool result: {"sky": "sunny"}"#),
            PromptMessage::new(PromptRole::Assistant, "It is sunny in Rome."),
            PromptMessage::new(PromptRole::User, "What is the weather in Paris?"),
        ],
        constraint: Some(Constraint::TextOrCalls {
            tools: tools.to_vec(),
        }),
        ..GenerateRequest::default()
    };
    let generation = provider
        .generate(request, CancellationToken::new())
        .await
        .unwrap();
    let exchanges = recorder.chat_completions();
    let sent = exchanges
        .get(before)
        .expect("the provider asked the server");
    let reply = keeps_to_the_grammar(sent, &tools);
    assert_eq!(reply, generation.text);
    let parsed = parse_tool_calls(&reply);
    assert_eq!(parsed.calls.len(), 1, "a call: {reply}");
    assert_eq!(parsed.calls[0].name, "get_weather", "{reply}");
    // The branch between prose and a call is weighed from the first
    // token's alternatives, which the request asked for.
    assert_eq!(sent.request["top_logprobs"], 20, "{}", sent.request);
    assert!(
        generation.call_probability.is_some_and(|p| p > 0.0),
        "{:?}",
        generation.call_probability
    );
}

/// Checks that `exchange` sent the "text or calls" grammar of `tools` and
/// that its reply keeps to it; returns the reply.
fn keeps_to_the_grammar(exchange: &Exchange, tools: &[ToolDefinition]) -> String {
    // What was sent: the grammar, naming the offered tools, and no `tools`
    // beside it.
    let grammar = exchange.request["grammar"]
        .as_str()
        .unwrap_or_else(|| panic!("a grammar in {}", exchange.request));
    assert!(grammar.starts_with("root ::= text | calls\n"), "{grammar}");
    for tool in tools {
        assert!(
            grammar.contains(&format!("\"\\\"{}\\\"\"", tool.name)),
            "{} in {grammar}",
            tool.name
        );
    }
    assert!(
        exchange.request.get("tools").is_none(),
        "{}",
        exchange.request
    );
    assert!(exchange.request.get("json_schema").is_none());

    // What came back keeps to it: prose without a call in it, or calls
    // that name offered tools with arguments that validate.
    let reply = exchange.reply_text();
    let parsed = parse_tool_calls(&reply);
    assert!(parsed.malformed.is_none(), "{reply}");
    if parsed.calls.is_empty() {
        assert!(
            !reply.is_empty() && !reply.contains('{'),
            "prose holds no call: {reply}"
        );
    }
    for call in &parsed.calls {
        let tool = tools
            .iter()
            .find(|t| t.name == call.name)
            .unwrap_or_else(|| panic!("an offered tool: {reply}"));
        validate_args(&tool.input_schema, &call.arguments)
            .unwrap_or_else(|e| panic!("{e:?}: {reply}"));
    }
    reply
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
