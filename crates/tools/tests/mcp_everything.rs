//! `@modelcontextprotocol/server-everything`, the MCP reference server, over
//! stdio and over streamable HTTP.
//!
//! Over HTTP, the reference server's only `notifications/tools/list_changed`
//! goes out right after initialize, before any client can have opened its
//! GET stream, and the server drops it (its log shows the GET arriving
//! after). So list changes over HTTP are tested against
//! `tools/node/changing-tools-server.mjs`, a small server on the same SDK
//! that changes its tools when asked and announces it on the request's own
//! stream.

use std::net::TcpListener;
use std::time::Duration;

use serde_json::json;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use wma_agent::{ToolErrorCode, ToolHost};
use wma_tools::{McpServer, McpServerOptions};

use crate::support::{eventually, everything_server, node, node_dir};

const LIMIT: Duration = Duration::from_secs(30);

async fn stdio_server() -> McpServer {
    let options = McpServerOptions::stdio(
        "everything",
        node(),
        [everything_server().display().to_string(), "stdio".into()],
    );
    McpServer::connect(options)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A free loopback port (the OS picks; the listener is closed again).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The reference server in streamable-HTTP mode on `port`, once it accepts.
async fn http_server_process(port: u16) -> Child {
    node_http_server(&[everything_server(), "streamableHttp".into()], port).await
}

/// A node HTTP server started with `args` on `port`, once it accepts.
async fn node_http_server(args: &[std::path::PathBuf], port: u16) -> Child {
    let child = Command::new(node())
        .args(args)
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    eventually(
        "the HTTP server to accept connections",
        LIMIT,
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        },
    )
    .await;
    child
}

async fn http_server(port: u16) -> McpServer {
    McpServer::connect(McpServerOptions::http(
        "everything-http",
        format!("http://127.0.0.1:{port}/mcp"),
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Listing, calling and an `isError` result, the same over both transports.
async fn lists_calls_and_reports_errors(server: &McpServer) {
    let tools = server.list_tools().await;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    for expected in ["echo", "get-sum", "trigger-long-running-operation"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let sum = tools.iter().find(|t| t.name == "get-sum").unwrap();
    assert_eq!(sum.input_schema["properties"]["a"]["type"], "number");
    assert!(sum.annotations.read_only && !sum.annotations.untrusted_content);

    let out = server
        .call_tool("get-sum", json!({"a": 2, "b": 3}), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out, "The sum of 2 and 3 is 5.");
    let echoed = server
        .call_tool(
            "echo",
            json!({"message": "hello"}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(echoed, "Echo: hello");

    // The server checks its arguments itself and answers with isError.
    let failed = server
        .call_tool("get-sum", json!({"a": "two"}), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(failed.code, ToolErrorCode::ToolFailed, "{failed:?}");
    assert!(
        failed.message.contains("get-sum") || failed.message.contains("nvalid"),
        "the server's own text: {}",
        failed.message
    );
}

/// The server registers more tools right after initialize and announces
/// them with `notifications/tools/list_changed`.
async fn follows_list_changed(server: &McpServer) {
    eventually("notifications/tools/list_changed", LIMIT, || async {
        server.tool_list_changes() >= 1
    })
    .await;
    let names: Vec<String> = server
        .list_tools()
        .await
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert!(
        names.iter().any(|n| n == "simulate-research-query"),
        "the tool announced after initialize is listed: {names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_lists_calls_and_reports_is_error_results() {
    let server = stdio_server().await;
    assert_eq!(
        server.server_info().await.map(|(name, _)| name),
        Some("mcp-servers/everything".to_string())
    );
    lists_calls_and_reports_errors(&server).await;
    server.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_server_starts_on_first_use() {
    let server = McpServer::lazy(McpServerOptions::stdio(
        "everything",
        node(),
        [everything_server().display().to_string(), "stdio".into()],
    ));
    assert_eq!(server.process_id().await, None, "nothing runs yet");
    let out = server
        .call_tool("get-sum", json!({"a": 4, "b": 5}), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out, "The sum of 4 and 5 is 9.");
    assert!(server.process_id().await.is_some());
    assert_eq!(server.restarts(), 0, "a first start is not a restart");

    let broken = McpServer::lazy(McpServerOptions::stdio(
        "missing",
        "/nonexistent/mcp-server",
        Vec::<String>::new(),
    ));
    assert!(broken.list_tools().await.is_empty());
    let error = broken
        .call_tool("anything", json!({}), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Unavailable);
    assert!(
        error
            .message
            .contains("could not run /nonexistent/mcp-server"),
        "{}",
        error.message
    );
    server.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_follows_tools_list_changed() {
    let server = stdio_server().await;
    follows_list_changed(&server).await;
    server.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_stdio_server_fails_the_running_call_clearly_and_is_restarted() {
    let server = stdio_server().await;
    let first_pid = server.process_id().await.expect("a stdio server has a pid");
    let running = server.clone();
    let call = tokio::spawn(async move {
        running
            .call_tool(
                "trigger-long-running-operation",
                json!({"duration": 60, "steps": 60}),
                CancellationToken::new(),
            )
            .await
    });
    eventually("the call to be sent", LIMIT, || async {
        server.calls_in_flight() == 1
    })
    .await;
    let killed = std::process::Command::new("kill")
        .args(["-9", &first_pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());

    let error = call.await.unwrap().unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Unavailable, "{error:?}");
    assert!(
        error.message.starts_with(
            "the MCP server `everything` stopped while running trigger-long-running-operation"
        ),
        "{}",
        error.message
    );
    eventually("the server to be restarted", LIMIT, || async {
        server.restarts() == 1
    })
    .await;
    let second_pid = server.process_id().await.expect("a new process");
    assert_ne!(first_pid, second_pid);
    let out = server
        .call_tool("get-sum", json!({"a": 1, "b": 1}), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(out, "The sum of 1 and 1 is 2.");
    server.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_lists_calls_and_reports_is_error_results() {
    let port = free_port();
    let _process = http_server_process(port).await;
    let server = http_server(port).await;
    lists_calls_and_reports_errors(&server).await;
    server.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_follows_tools_list_changed() {
    let port = free_port();
    let _process = node_http_server(&[node_dir().join("changing-tools-server.mjs")], port).await;
    let server = McpServer::connect(McpServerOptions::http(
        "changing",
        format!("http://127.0.0.1:{port}/mcp"),
    ))
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let names = |tools: Vec<wma_agent::ToolDefinition>| -> Vec<String> {
        tools.into_iter().map(|t| t.name).collect()
    };
    // The tool list is cached: only a list-changed notification makes a
    // later listing show what the calls below change.
    assert_eq!(
        names(server.list_tools().await),
        ["add_tool", "remove_tool"]
    );
    let added = server
        .call_tool(
            "add_tool",
            json!({"name": "greet"}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(added, "added greet");
    eventually("the listing to show the added tool", LIMIT, || async {
        names(server.list_tools().await) == ["add_tool", "remove_tool", "greet"]
    })
    .await;
    assert!(server.tool_list_changes() >= 1);
    let hello = server
        .call_tool("greet", json!({}), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(hello, "hello from greet");
    let before = server.tool_list_changes();
    server
        .call_tool(
            "remove_tool",
            json!({"name": "greet"}),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    eventually("the listing to lose the removed tool", LIMIT, || async {
        names(server.list_tools().await) == ["add_tool", "remove_tool"]
    })
    .await;
    assert!(server.tool_list_changes() > before);
    server.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_http_server_fails_the_running_call_clearly_and_the_session_is_renewed() {
    let port = free_port();
    let mut process = http_server_process(port).await;
    let server = http_server(port).await;
    let running = server.clone();
    let call = tokio::spawn(async move {
        running
            .call_tool(
                "trigger-long-running-operation",
                json!({"duration": 60, "steps": 60}),
                CancellationToken::new(),
            )
            .await
    });
    eventually("the call to be sent", LIMIT, || async {
        server.calls_in_flight() == 1
    })
    .await;
    process.kill().await.expect("the server process is killed");

    let error = call.await.unwrap().unwrap_err();
    assert_eq!(error.code, ToolErrorCode::Unavailable, "{error:?}");
    assert!(
        error
            .message
            .starts_with("the MCP server `everything-http` stopped while running"),
        "{}",
        error.message
    );

    // Whoever runs the server starts it again; the source opens a new
    // session on its next use.
    let _process = http_server_process(port).await;
    eventually("a call on a new session", LIMIT, || async {
        server
            .call_tool("get-sum", json!({"a": 1, "b": 1}), CancellationToken::new())
            .await
            .is_ok()
    })
    .await;
    assert!(server.restarts() >= 1);
    server.close().await;
}

/// A server that lists, beside its usable tools, one whose `inputSchema` is
/// a string (which rmcp cannot read: it used to hide the whole list), one
/// whose schema is not a valid JSON Schema and one whose arguments are not
/// an object: each is left out alone, with a warning naming it and why, and
/// the server's other tools are listed and called as ever.
#[tokio::test(flavor = "current_thread")]
async fn a_tool_with_an_unusable_schema_is_left_out_alone() {
    let peer = wma_testkit::McpTestServer::start_listing(vec![
        json!({"name": "schema_as_text", "description": "Its schema is a string.",
               "inputSchema": "{\"type\": \"object\"}"}),
        json!({"name": "broken_schema", "description": "Its schema does not compile.",
               "inputSchema": {"type": "object",
                               "properties": {"n": {"type": "integer", "minimum": "zero"}}}}),
        json!({"name": "takes_a_string", "description": "Its arguments are a string.",
               "inputSchema": {"type": "string"}}),
    ])
    .unwrap();
    let (logs, _guard) = wma_testkit::capture_logs();
    let server = McpServer::connect(McpServerOptions::http("shop", peer.url()))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> = server
        .list_tools()
        .await
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["place_order", "hold_order", "order_status"]);
    let text = logs.text();
    for (tool, why) in [
        ("schema_as_text", "a string"),
        ("broken_schema", "not a valid JSON Schema"),
        ("takes_a_string", "of type \"string\""),
    ] {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("tool={tool}")))
            .unwrap_or_else(|| panic!("no warning names {tool}: {text}"));
        assert!(line.contains("WARN") && line.contains(why), "{line}");
    }
    let answer = server
        .call_tool("order_status", json!({}), CancellationToken::new())
        .await
        .unwrap();
    assert!(answer.starts_with("no orders"), "{answer}");
    server.close().await;
}
