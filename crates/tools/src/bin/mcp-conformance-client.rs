//! An MCP client for the official conformance suite
//! (`@modelcontextprotocol/conformance client --command …`): it connects to
//! the URL it is given over streamable HTTP with [`McpServer`], lists the
//! tools and, for the `tools_call` scenario, calls each one with arguments
//! made from its schema. The suite judges what the server saw.
//!
//! Usage: `mcp-conformance-client <server-url>`; the scenario's name comes
//! in `MCP_CONFORMANCE_SCENARIO`.

use std::process::ExitCode;

use tokio_util::sync::CancellationToken;
use wma_agent::{ToolHost, prompt::example_arguments};
use wma_tools::{McpServer, McpServerOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: mcp-conformance-client <server-url>");
        return ExitCode::from(2);
    };
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    let server = match McpServer::connect(McpServerOptions::http("conformance", &url)).await {
        Ok(server) => server,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let tools = server.list_tools().await;
    println!(
        "{} tools: {:?}",
        tools.len(),
        tools.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    let mut failed = false;
    if scenario == "tools_call" {
        for tool in &tools {
            let arguments = example_arguments(&tool.input_schema);
            match server
                .call_tool(&tool.name, arguments, CancellationToken::new())
                .await
            {
                Ok(output) => println!("{}: {output}", tool.name),
                Err(error) => {
                    eprintln!("{}: {error}", tool.name);
                    failed = true;
                }
            }
        }
    }
    server.close().await;
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
