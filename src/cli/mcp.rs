//! `wma mcp`: the config's agents served as MCP tools.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use webmcp_agents::config::Config;

/// `wma mcp`.
#[derive(Args)]
pub(crate) struct McpArgs {
    /// The config to host (default: the demo shop's agent on the default
    /// model, as `wma run` asks it).
    #[arg(long, short)]
    pub(crate) config: Option<PathBuf>,
}

/// Serves the config's agents as MCP tools.
pub(crate) async fn serve(_args: McpArgs, _config: &Config) -> Result<()> {
    bail!("wma mcp is not built yet")
}
