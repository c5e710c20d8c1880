//! End-to-end tests, compiled as one binary.

mod support;

mod agent_listing;
#[cfg(unix)]
mod chat_terminal;
mod cluster;
mod config;
mod delegation;
mod eval_tasks;
mod grounding;
mod http_api;
mod kv_cache;
mod loop_behaviour;
mod mcp_server;
mod models;
mod openai_api;
mod properties;
mod readme;
mod real_model;
mod scripted_runs;
mod served;
mod sessions;
mod traces;
mod web_ui;
