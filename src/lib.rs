//! webmcp-agents: host on-device LLM agents that operate tools.
//!
//! This crate re-exports the workspace's crates under one name and adds what
//! the `wma` command and the examples share.
//!
//! - [`agent`]: the loop (`run_local_agent`) and its vocabulary.
//! - [`runtime`]: the supervised actors that host agents (hot swap, restarts).
//! - [`telemetry`]: tracing with OpenTelemetry OTLP export.
//! - [`tools`]: tool sources.
//! - [`config`]: TOML config files, validated as a whole, and starting what they describe
//!   (`wma-config`, below the server and the evaluation); [`demo_shop`] is its demo shop.
//! - [`eval`]: the tool-calling evaluation behind `wma eval` (`wma-eval`); [`usage`] counts
//!   what a run cost the model.
//! - [`serve`]: the HTTP API of `wma serve` (`wma-serve`, runs as server-sent events);
//!   [`mend`] mends a conversation whose turn was cut short, for `chat` and `serve`.
//! - [`store`]: sessions and runs that survive a restart (SQLite or PostgreSQL).
//! - [`display`]: parts of a run written for a terminal or as JSON lines.

pub use wma_agent as agent;
pub use wma_config as config;
pub use wma_config::demo_shop;
pub use wma_eval as eval;
pub use wma_eval::usage;
pub use wma_runtime as runtime;
pub use wma_serve as serve;
pub use wma_serve::mend;
pub use wma_store as store;
pub use wma_telemetry as telemetry;

pub use wma_tools as tools;

pub mod display;
