//! Test doubles for webmcp-agents.
//!
//! - [`ScriptedProvider`]: a [`Provider`](wma_agent::Provider) that answers with replies given in
//!   order, each with an optional delay or failure, and records every request
//!   it receives so a test can assert on the prompt.
//! - [`InMemoryToolHost`]: a [`ToolHost`](wma_agent::ToolHost) whose tools are Rust closures, with
//!   a page context and a log of the calls made.
//! - [`OtlpReceiver`]: a real OTLP/HTTP traces endpoint on loopback that
//!   decodes what an exporter sends, for tests of the exported span tree.
//! - [`McpTestServer`]: an MCP server over streamable HTTP on loopback that
//!   keeps each call it gets with the request's `_meta` (and echoes it),
//!   with a tool that answers only when the test lets it.
//! - [`PostgresServer`]: a real, throwaway PostgreSQL server (initdb into a
//!   temporary folder), stopped on drop, for tests of the store.
//! - [`FakeHub`]: a model hub on loopback serving a folder as one
//!   repository, with a log of what it was asked, a gated mode and a
//!   connection that breaks once, for tests of model downloads.
//!
//! ```
//! use std::sync::Arc;
//! use wma_agent::{ChatMessage, AgentRunRequest, LocalLoopOptions, run_local_agent};
//! use wma_testkit::{InMemoryToolHost, ScriptedProvider};
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use futures::StreamExt;
//! let provider = ScriptedProvider::new(["Paris."]);
//! let tools = Arc::new(InMemoryToolHost::new());
//! let request = AgentRunRequest::new(vec![ChatMessage::user("Capital of France?")], tools);
//! let parts: Vec<_> = run_local_agent(provider, request, LocalLoopOptions::default()).collect().await;
//! assert_eq!(parts.len(), 3); // message-start, text, finish
//! # }
//! ```

mod host;
mod hub;
mod llamacpp;
mod logs;
mod mcp;
mod otlp;
pub mod postgres;
mod serve;

pub use host::{InMemoryToolHost, RecordedCall, ToolFn};
pub use hub::{FakeHub, HUB_REVISIONS, HubRequest};
pub use llamacpp::{LlamaServer, cache_dir, default_gguf};
pub use logs::{CapturedLogs, capture_logs};
pub use mcp::{McpTestServer, ReceivedCall};
pub use otlp::{AttrValue, CapturedEvent, CapturedSpan, OtlpReceiver, SpanStatus};
pub use postgres::PostgresServer;
// The scripted provider is part of the product (configs name it); tests
// reach it here as before.
pub use wma_agent::{scripted::ScriptedProvider, scripted::ScriptedReply};
