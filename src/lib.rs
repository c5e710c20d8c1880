//! webmcp-agents: host on-device LLM agents that operate tools.
//!
//! This crate re-exports the workspace's crates under one name and adds what
//! the `wma` command and the examples share.
//!
//! - [`agent`]: the loop (`run_local_agent`) and its vocabulary.

pub use wma_agent as agent;

pub mod demo_shop;
pub mod display;

pub use wma_tools as tools;
pub mod usage;
