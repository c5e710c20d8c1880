//! Tests of the tool sources against real peers: the demo shop in headless
//! Chromium, the MCP reference server over stdio and streamable HTTP, and
//! the official MCP conformance suite. `scripts/install-peers.sh` installs
//! them; a test whose peer is missing fails and says how to install it.

mod support;

mod cdp_properties;
mod conformance;
mod mcp_everything;
mod tool_path;
mod tool_set;
mod webmcp_conformance;
mod webmcp_shop;
