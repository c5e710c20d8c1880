//! webmcp-agents: host on-device LLM agents that operate tools.
//!
//! This crate re-exports the workspace's crates under one name.

pub use wma_agent as agent;
