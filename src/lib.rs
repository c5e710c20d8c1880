//! webmcp-agents: host on-device LLM agents that operate tools.
//!
//! This crate re-exports the workspace's crates under one name and adds what
//! the `wma` command and the examples share.
//!
//! - [`agent`]: the loop (`run_local_agent`) and its vocabulary.
//! - [`runtime`]: the supervised actors that host agents (hot swap, restarts).
//! - [`telemetry`]: tracing with OpenTelemetry OTLP export.
//! - [`tools`]: tool sources.
//! - [`eval`]: the tool-calling evaluation behind `wma eval`.
//! - [`config`]: TOML config files, validated as a whole, and starting what they describe.
//! - [`mend`]: a conversation whose turn was cut short (Stop, a crash) mended, for `chat` and `serve`.
//! - [`serve`]: the HTTP API of `wma serve` (runs as server-sent events).
//! - [`store`]: sessions and runs that survive a restart (SQLite or PostgreSQL).

pub use wma_agent as agent;
pub use wma_runtime as runtime;
pub use wma_store as store;
pub use wma_telemetry as telemetry;

pub use wma_tools as tools;

pub mod config;
pub mod demo_shop;
pub mod display;
pub mod eval;
pub mod mend;
pub mod serve;
pub mod usage;
