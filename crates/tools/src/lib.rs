//! Tool sources for webmcp-agents.
//!
//! Each source is a [`ToolHost`](wma_agent::ToolHost), so the loop (or the
//! runtime's tool bridge) can use any of them alone, or all of them merged
//! by a [`ToolSet`]:
//!
//! - [`WebMcpPage`]: a page in Chromium whose tools it registered with
//!   `document.modelContext.registerTool` (or the older
//!   `navigator.modelContext`, mapped onto it), listed and invoked through the
//!   CDP `WebMCP` domain and followed as the page navigates; it also
//!   reports the page context (path, title, main heading). [`Browser`]
//!   starts Chromium with WebMCP on, or connects to one that runs;
//!   [`LoopbackSite`] serves a local page on `127.0.0.1`; [`WebMcpSource`]
//!   is a page that opens itself, and opens itself again after its browser
//!   died.
//! - [`McpServer`]: an MCP server through the `rmcp` client, as a child
//!   process over stdio or over streamable HTTP. It follows
//!   `notifications/tools/list_changed`, turns `isError` results into tool
//!   errors, and restarts a server that stopped. [`McpServer::lazy`] starts
//!   on first use, for builders that cannot wait.
//! - [`NativeTools`]: Rust functions, each with a JSON Schema, written by
//!   hand or derived from the argument type ([`NativeTools::add_typed`]).
//!
//! [`ToolSet`] adds the host's policies across sources, and is the one path
//! every call takes (the sources do not repeat it): tool names that must
//! be identifiers ([`is_tool_name`]) and caps on descriptions, schemas and
//! tool counts, deterministic name clashes, allow and deny lists, argument
//! validation before dispatch, per-call timeouts ([`DEFAULT_CALL_TIMEOUT`]),
//! panics contained and sources made afresh within a [`RestartBudget`],
//! result size limits, the untrusted-content mark that makes the prompt
//! tell the model a tool's output is data, and each source's health
//! ([`ToolSet::health`]: state, restarts and panics, for a health endpoint). [`admit_tools`] is the
//! naming and size rules alone, for anything else that merges sources.
//!
//! Every source answers a failed call with a coded
//! [`ToolError`](wma_agent::ToolError) that keeps the tool's own message.
//!
//! ```
//! use serde_json::json;
//! use wma_agent::{ToolDefinition, ToolHost};
//! use wma_tools::{NativeTools, SourceOptions, ToolSet};
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let mut math = NativeTools::new();
//! math.add_fn(
//!     ToolDefinition::new("add", "Add two numbers.", json!({
//!         "type": "object",
//!         "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
//!         "required": ["a", "b"]})),
//!     |args| Ok(json!(args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0)).to_string()),
//! );
//! let mut tools = ToolSet::new();
//! tools.add_with("math", math, SourceOptions::default().deny(["sub*"]));
//! assert_eq!(tools.list_tools().await.len(), 1);
//! let out = tools.call_tool("add", json!({"a": 2, "b": 3}), Default::default()).await;
//! assert_eq!(out.unwrap(), "5.0");
//! let bad = tools.call_tool("add", json!({"a": "two"}), Default::default()).await;
//! assert_eq!(bad.unwrap_err().code, wma_agent::ToolErrorCode::InvalidArguments);
//! # }
//! ```

mod error;
mod health;
mod mcp;
mod native;
mod set;
mod site;
mod webmcp;

pub use error::ToolsError;
pub use health::{
    DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_WINDOW, Monitored, RestartBudget, SourceHealth,
    SourceState, SourceStatus,
};
pub use mcp::{
    DEFAULT_CONNECT_TIMEOUT, IDEMPOTENCY_KEY_META, McpServer, McpServerOptions, McpTransport,
};
pub use native::{NativeTools, input_schema};
pub use set::{
    CANCEL_GRACE, DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_RESULT_CHARS, LIST_TIMEOUT,
    MAX_DESCRIPTION_CHARS, MAX_SCHEMA_BYTES, MAX_TOOL_NAME_CHARS, MAX_TOOLS_PER_SOURCE, NameClash,
    SourceOptions, ToolSet, admit_tools, is_tool_name,
};
pub use site::LoopbackSite;
pub use webmcp::{
    Browser, BrowserOptions, CHROMIUM_ENV, DEFAULT_LAUNCH_TIMEOUT, DEFAULT_SETTLE_TIMEOUT,
    DEFAULT_TOOLS_QUIET, PageOptions, PageTarget, PageTool, WebMcpPage, WebMcpSource,
    find_chromium,
};
