//! `wma mcp`: the config's agents as MCP tools, listed and called by the
//! MCP Python SDK's own client (tests/support/mcp_client.py) over stdio and
//! streamable HTTP. The agents run on scripted providers, so the answers
//! are exact. Also: a run that did not answer is an error result, its
//! steps and calls come as progress notifications, the HTTP endpoint wants
//! the host's token, a call that needs a person's approval is denied and
//! said so (unless pre-approved, or approved by the client's person
//! through a form), and a cancelled or abandoned call stops its run.
//!
//! The client runs in the venv that `scripts/install-peers.sh` makes from
//! tools/python/servers.txt (the MCP SDK 1.x); without it the tests fail
//! with that hint.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

const INSTALL_HINT: &str = "run scripts/install-peers.sh (it makes the venv of tools/python/servers.txt with the MCP Python SDK)";

/// How long a test waits for something that must happen before it calls
/// it a hang. Not a measure of speed: the checks pass as soon as it happens.
const HANG: Duration = Duration::from_secs(60);

/// The variable the HTTP tests' configs name for the token.
const TOKEN_VAR: &str = "WMA_MCP_TEST_TOKEN";

/// A token strong enough for the host (random, in hex).
const TOKEN: &str = "9f3c5a1e7b2d4f6081a3c5e7092b4d6f8a1c3e5079b2d4f6";

/// Three agents: one that answers, one that reaches its step limit on
/// the demo shop's tools, one that takes ten minutes per reply.
const CONFIG: &str = r#"
[providers.greet]
kind = "scripted"
replies = ["Hello there.", "Hello again."]

[providers.walk]
kind = "scripted"
replies = ['{"name": "view_cart", "arguments": {}}', '{"name": "view_cart", "arguments": {}}']

[providers.slow]
kind = "scripted"
replies = ["Too late.", "Too late."]
delay_ms = 600000

[tools.shop]
kind = "demo-shop"

[agents.greeter]
description = "Says hello."
provider = "greet"

[agents.walker]
instructions = "Look at the cart."
provider = "walk"
tools = ["shop"]
max_steps = 1

[agents.sleeper]
description = "Takes its time."
provider = "slow"

[server]
token_env = "WMA_MCP_TEST_TOKEN"
"#;

/// An agent whose cart call asks a person first.
const CLERK: &str = r#"
[providers.p]
kind = "scripted"
replies = ['{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}', "I could not add it: the call was denied."]

[tools.cart]
kind = "demo-shop"
allow = ["add_to_cart", "view_cart"]

[agents.clerk]
provider = "p"
tools = ["cart"]
approval = { tools = { add_to_cart = "ask" } }
"#;

/// The Python of the venv with the MCP SDK.
fn client_python() -> PathBuf {
    let python = wma_provider_ort::cache_dir()
        .unwrap_or_else(|e| panic!("no cache folder ({e}): {INSTALL_HINT}"))
        .join(webmcp_agents::eval::tasks::PYTHON_PEERS)
        .join("servers/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: {INSTALL_HINT}",
        python.display()
    );
    python
}

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mcp_client.py")
}

/// `text` written as `wma.toml` in a fresh folder of its own.
fn config_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wma-mcp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("wma.toml");
    std::fs::write(&file, text).unwrap();
    file
}

/// What the client saw, and its stderr (which, over stdio, holds the
/// server's too).
struct Report {
    json: Value,
    stderr: String,
}

impl Report {
    /// The listed tool `name`.
    fn tool(&self, name: &str) -> &Value {
        self.json["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no tool {name}: {}", self.json))
    }

    fn tool_names(&self) -> Vec<&str> {
        self.json["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect()
    }

    /// The `i`th call's entry.
    fn call(&self, i: usize) -> &Value {
        &self.json["calls"][i]
    }

    /// The `i`th call's texts, joined.
    fn text(&self, i: usize) -> String {
        self.call(i)["texts"]
            .as_array()
            .unwrap_or_else(|| panic!("call {i} has no texts: {}", self.json))
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs the client on `plan` (see tests/support/mcp_client.py).
async fn client(plan: Value) -> Report {
    let out = tokio::time::timeout(
        HANG,
        tokio::process::Command::new(client_python())
            .arg(client_script())
            .arg(plan.to_string())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the MCP client ends in time")
    .expect("the MCP client starts");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "the MCP client failed:\n{stdout}\n{stderr}"
    );
    let json = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the client's report is not JSON ({e}):\n{stdout}\n{stderr}"));
    Report { json, stderr }
}

/// A plan that starts `wma mcp ARGS` over stdio.
fn over_stdio(args: &[&str], calls: Value) -> Value {
    let mut all = vec!["mcp"];
    all.extend_from_slice(args);
    json!({
        "stdio": {"command": env!("CARGO_BIN_EXE_wma"), "args": all},
        "calls": calls,
    })
}

/// A `wma mcp --listen` process that said where it listens.
struct Http {
    child: tokio::process::Child,
    url: String,
    stderr: tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
}

impl Http {
    async fn start(config: &Path) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wma"))
            .args(["mcp", "--config"])
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .env(TOKEN_VAR, TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("`wma mcp` starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = tokio::time::timeout(HANG, async {
            while let Some(line) = stdout.next_line().await.unwrap() {
                if let Some(url) = line.strip_prefix("mcp listening on ") {
                    return url.to_string();
                }
            }
            let mut stderr = String::new();
            let _ = child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut stderr)
                .await;
            panic!("`wma mcp` ended before it listened:\n{stderr}");
        })
        .await
        .expect("`wma mcp` listens in time");
        let stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        Self { child, url, stderr }
    }

    fn plan(&self, token: Option<&str>, calls: Value) -> Value {
        json!({"http": {"url": self.url, "token": token}, "calls": calls})
    }

    /// Reads the server's stderr until a line has `wanted`.
    async fn said(&mut self, wanted: &str) {
        let mut seen = Vec::new();
        let found = tokio::time::timeout(HANG, async {
            while let Some(line) = self.stderr.next_line().await.unwrap() {
                if line.contains(wanted) {
                    return true;
                }
                seen.push(line);
            }
            false
        })
        .await;
        assert!(
            found == Ok(true),
            "`wma mcp` never said {wanted:?}; it said:\n{}",
            seen.join("\n")
        );
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// The answers and the listing the agents' tools must have, whatever the
/// transport: `greeter`'s answer as it is, `walker`'s step limit as an
/// error result that says so.
fn assert_listed_and_answered(report: &Report) {
    assert_eq!(
        report.tool_names(),
        ["greeter", "sleeper", "walker"],
        "{}",
        report.json
    );
    let greeter = report.tool("greeter");
    assert_eq!(greeter["description"], "Says hello.");
    assert_eq!(
        greeter["inputSchema"]["required"],
        json!(["request"]),
        "{greeter}"
    );
    assert_eq!(
        greeter["inputSchema"]["properties"]["request"]["type"],
        "string"
    );
    // It calls no tool at all: read-only. `walker` sees a shop that can
    // fill a cart, so it claims nothing.
    assert_eq!(greeter["annotations"]["readOnlyHint"], true, "{greeter}");
    let walker = report.tool("walker");
    assert_eq!(walker["description"], "Look at the cart.");
    assert!(
        walker
            .get("annotations")
            .is_none_or(|a| a["readOnlyHint"] != true),
        "{walker}"
    );

    assert_eq!(report.call(0)["isError"], false, "{}", report.json);
    assert_eq!(report.text(0), "Hello there.");
    assert_eq!(report.call(1)["isError"], true, "{}", report.json);
    assert!(
        report.text(1).contains("did not answer") && report.text(1).contains("step limit"),
        "{}",
        report.text(1)
    );
    // Each step and call was told as progress while the run went on.
    assert_eq!(
        report.call(1)["progress"],
        json!(["step 1", "`walker` calls `view_cart`"]),
        "{}",
        report.json
    );
    // A call without its request is an error result the model can mend.
    assert_eq!(report.call(2)["isError"], true, "{}", report.json);
    assert!(report.text(2).contains("`request`"), "{}", report.text(2));
}

fn the_three_calls() -> Value {
    json!([
        {"tool": "greeter", "arguments": {"request": "Say hello"}},
        {"tool": "walker", "arguments": {"request": "What is in my cart?"}},
        {"tool": "greeter", "arguments": {}},
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_lists_and_calls_the_agents_over_stdio() {
    let config = config_file("stdio", CONFIG);
    let report = client(over_stdio(
        &["--config", &config.display().to_string()],
        the_three_calls(),
    ))
    .await;
    assert_listed_and_answered(&report);
    assert_eq!(report.json["server"]["name"], "wma");
    // The server's lines for a person went to stderr, past the protocol.
    assert!(
        report.stderr.contains("agent(s) ready"),
        "{}",
        report.stderr
    );
    assert!(
        report.stderr.contains("mcp: `walker` ended max-steps"),
        "{}",
        report.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_stdio_stdout_carries_only_json_rpc() {
    let config = config_file("stdout", CONFIG);
    let config = config.display().to_string();
    let messages = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "greeter", "arguments": {"request": "Say hello"}}}),
    ];
    let stdin: String = messages.iter().map(|m| format!("{m}\n")).collect();
    // With tracing on, whose line is for a person too. Nothing listens
    // where the spans go; that is said on stderr as well.
    let (ok, stdout, stderr) = crate::support::run_wma(
        &["--otlp", "mcp", "--config", &config],
        &stdin,
        [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")],
        HANG,
    )
    .await;
    assert!(ok, "{stdout}\n{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("stdout has a line that is not JSON ({e}): {line:?}"))
        })
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(lines.iter().all(|m| m["jsonrpc"] == "2.0"), "{stdout}");
    // The requests are served side by side: each answer by its id.
    let answer = |id: u64| {
        lines
            .iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no answer to request {id}: {stdout}"))
    };
    assert_eq!(answer(2)["result"]["tools"][0]["name"], "greeter");
    assert_eq!(
        answer(3)["result"]["content"][0]["text"],
        "Hello there.",
        "{stdout}"
    );
    assert!(stderr.contains("tracing to"), "{stderr}");
    assert!(stderr.contains("agent(s) ready"), "{stderr}");
    assert!(stderr.contains("mcp: `greeter` ended stop"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_lists_and_calls_the_agents_over_http_with_the_token() {
    let config = config_file("http", CONFIG);
    let mut server = Http::start(&config).await;
    let report = client(server.plan(Some(TOKEN), the_three_calls())).await;
    assert_listed_and_answered(&report);
    server.said("mcp: `greeter` ended stop").await;

    // Without the token, or with another, nothing gets in.
    let http = reqwest::Client::new();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    for auth in [
        None,
        Some(format!("Bearer {TOKEN}0")),
        Some(TOKEN.to_string()),
    ] {
        let mut request = http
            .post(&server.url)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(auth) = &auth {
            request = request.header("authorization", auth);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "with {auth:?}");
        assert_eq!(
            response.headers()["www-authenticate"],
            "Bearer",
            "with {auth:?}"
        );
    }
    // The same request with it is served.
    let response = http
        .post(&server.url)
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(&initialize)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_needs_approval_is_denied_and_said_so_unless_pre_approved() {
    let config = config_file("approval", CLERK);
    let config = config.display().to_string();
    let call = json!([{"tool": "clerk", "arguments": {"request": "Put p-17 in my cart"}}]);

    let denied = client(over_stdio(&["--config", &config], call.clone())).await;
    assert_eq!(denied.call(0)["isError"], false, "{}", denied.json);
    assert_eq!(
        denied.call(0)["texts"].as_array().unwrap().len(),
        2,
        "{}",
        denied.json
    );
    let text = denied.text(0);
    assert!(
        text.starts_with("I could not add it: the call was denied."),
        "{text}"
    );
    assert!(
        text.contains("add_to_cart (of `clerk`)")
            && text.contains("no one to ask")
            && text.contains("--approve all"),
        "{text}"
    );
    // The tool that fills a cart is not read-only, and is not said to be.
    assert!(
        denied.tool("clerk").get("annotations").is_none(),
        "{}",
        denied.json
    );

    let approved = client(over_stdio(
        &["--config", &config, "--approve", "all"],
        call.clone(),
    ))
    .await;
    assert_eq!(approved.call(0)["isError"], false, "{}", approved.json);
    // The call ran: the answer is all there is, with no calls not run.
    assert_eq!(
        approved.call(0)["texts"].as_array().unwrap().len(),
        1,
        "{}",
        approved.json
    );

    // A `--deny` flag denies even what the config lets run.
    let flagged = client(over_stdio(
        &["--config", &config, "--approve", "all", "--deny", "add_*"],
        call,
    ))
    .await;
    assert!(
        flagged.text(0).contains("add_to_cart (of `clerk`)"),
        "{}",
        flagged.text(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_approve_ask_the_clients_person_answers_through_a_form() {
    let config = config_file("elicit", CLERK);
    let config = config.display().to_string();
    let call = json!([{"tool": "clerk", "arguments": {"request": "Put p-17 in my cart"}}]);
    let plan = |elicit: Option<bool>| {
        let mut plan = over_stdio(&["--config", &config, "--approve", "ask"], call.clone());
        if let Some(approve) = elicit {
            plan["elicit"] = json!({"approve": approve});
        }
        plan
    };

    let yes = client(plan(Some(true))).await;
    let asked = yes.json["elicited"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "{}", yes.json);
    let message = asked[0]["message"].as_str().unwrap();
    assert!(
        message.contains("`clerk`")
            && message.contains("`add_to_cart`")
            && message.contains("p-17"),
        "{message}"
    );
    assert_eq!(
        asked[0]["schema"]["properties"]["approve"]["type"],
        "boolean"
    );
    // Approved: the call ran, nothing was denied.
    assert_eq!(
        yes.call(0)["texts"].as_array().unwrap().len(),
        1,
        "{}",
        yes.json
    );

    let no = client(plan(Some(false))).await;
    assert!(
        no.text(0).contains("add_to_cart (of `clerk`)") && no.text(0).contains("said no"),
        "{}",
        no.text(0)
    );

    // A client that offers no form cannot be asked: denied, and said why.
    let formless = client(plan(None)).await;
    assert!(formless.json["elicited"].as_array().unwrap().is_empty());
    assert!(
        formless.text(0).contains("add_to_cart (of `clerk`)")
            && formless.text(0).contains("no way to ask"),
        "{}",
        formless.text(0)
    );

    // Over HTTP there is no way back for an answer: refused at the start.
    let (ok, _, stderr) = crate::support::run_wma(
        &[
            "mcp",
            "--config",
            &config,
            "--listen",
            "127.0.0.1:0",
            "--approve",
            "ask",
        ],
        "",
        std::iter::empty::<(&str, &str)>(),
        HANG,
    )
    .await;
    assert!(!ok);
    assert!(stderr.contains("cannot ask about a call"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_stops_its_run_over_stdio() {
    let config = config_file("cancel", CONFIG);
    let report = client(over_stdio(
        &["--config", &config.display().to_string()],
        json!([{"tool": "sleeper", "arguments": {"request": "Wait"}, "cancel_after": 1.0}]),
    ))
    .await;
    assert_eq!(report.call(0)["cancelled"], true, "{}", report.json);
    // The reply takes ten minutes: the run ended because it was stopped.
    assert!(
        report.stderr.contains("mcp: `sleeper` ended aborted"),
        "{}",
        report.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_stops_its_run_over_http() {
    let config = config_file("drop", CONFIG);
    let mut server = Http::start(&config).await;
    let report = client(server.plan(
        Some(TOKEN),
        json!([{"tool": "sleeper", "arguments": {"request": "Wait"}, "drop_after": 1.0}]),
    ))
    .await;
    assert_eq!(report.call(0)["dropped"], true, "{}", report.json);
    server.said("mcp: `sleeper` ended aborted").await;
    server.stop().await;
}
