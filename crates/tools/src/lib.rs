//! Tool sources for webmcp-agents.
//!
//! [`NativeTools`] is a [`ToolHost`](wma_agent::ToolHost) whose tools are Rust
//! functions, each with a JSON Schema. Like every source, it does not trust the
//! caller: arguments are validated against the schema before the function
//! runs, every call has a time limit, cancellation is honoured, and a function
//! that panics becomes a `tool_failed` error instead of taking the host down.
//!
//! ```
//! use serde_json::json;
//! use wma_agent::{ToolDefinition, ToolHost};
//! use wma_tools::NativeTools;
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let mut tools = NativeTools::new();
//! tools.add_fn(
//!     ToolDefinition::new("add", "Add two numbers.", json!({
//!         "type": "object",
//!         "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
//!         "required": ["a", "b"]})),
//!     |args| Ok(json!(args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0)).to_string()),
//! );
//! let out = tools.call_tool("add", json!({"a": 2, "b": 3}), Default::default()).await;
//! assert_eq!(out.unwrap(), "5.0");
//! # }
//! ```

mod native;

pub use native::{DEFAULT_CALL_TIMEOUT, NativeTools};
