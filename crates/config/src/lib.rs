//! Config files: providers, tool sources, agents and their sub-agents,
//! delegation, telemetry, the HTTP server and the cluster, in TOML.
//!
//! This crate sits below the HTTP server (`wma-serve`), the evaluation
//! harness (`wma-eval`) and the `wma` command, which all read a config and
//! start what it describes; it imports none of them. For that, it holds three
//! things besides the config itself:
//!
//! - [`server`]: the data of `[server]` (what the server lets in and how
//!   long it waits, [`ServerOptions`](server::ServerOptions), and where its
//!   token comes from). The config fills it and `wma-serve` obeys it; each
//!   option and its default is defined once, here, so the config need not
//!   import the server.
//! - [`demo_shop`]: the outdoor shop behind `kind = "demo-shop"` tool
//!   sources, which the `wma` command and the evaluation also run.
//! - [`models`]: the models installed in the cache folder, which an `onnx`
//!   provider's `model` names: listing, pulling and removing them
//!   (`wma models` prints what it finds).
//!
//! A file is read in two passes, as the rest of the project reads settings:
//! first into a raw form that mirrors the file, strictly (an unknown key or
//! a wrong type is an error naming the file, line and key), then validated
//! as a whole into [`Config`] before anything starts: every name an agent
//! refers to exists, delegation has no cycle, each setting belongs to the
//! kind of thing it is set on. `docs/configuration.md` lists every setting
//! with its default.
//!
//! A config may also take its MCP servers from the `mcpServers` JSON file
//! other MCP clients write (`mcp_servers = "mcp.json"`): each server becomes
//! a tool source of that name, checked as strictly as a `[tools.NAME]`
//! table, and a config with tool sources and no agents gets one agent,
//! [`DEFAULT_AGENT`], that sees them all.
//!
//! ```
//! use wma_config::Config;
//! let config = Config::parse(
//!     r#"
//!     [providers.script]
//!     kind = "scripted"
//!     replies = ["Paris."]
//!
//!     [agents.helper]
//!     provider = "script"
//!     "#,
//!     "inline.toml",
//! )
//! .unwrap();
//! assert_eq!(config.agents[0].name, "helper");
//!
//! let err = Config::parse("[agents.helper]\nmax_stepz = 3\n", "bad.toml").unwrap_err();
//! assert_eq!(err.to_string().lines().next().unwrap(),
//!     "bad.toml:2:1: `agents.helper.max_stepz`: unknown field `max_stepz`, expected one of `description`, `remote`, `provider`, `instructions`, `max_steps`, `step_timeout_secs`, `max_tools`, `constraints`, `policy`, `rules`, `max_concurrent_runs`, `tools`, `sub_agents`, `approval`");
//! ```

mod builtin;
pub mod demo_shop;
mod error;
mod host;
mod mcp_json;
pub mod models;
mod raw;
pub mod server;
mod spec;
mod validate;

use std::path::Path;

pub use builtin::{BUILTINS, builtin_tools};
pub use error::{ConfigError, Location};
pub use host::{Hosted, ProgressCallback, StartOptions, page_tool_line, provider_source};
pub use spec::{
    AgentSpec, ClusterSpec, Config, DEFAULT_AGENT, DEFAULT_SERVER_LISTEN, ProviderConfig,
    ProviderSpec, RemoteAgentSpec, ScriptedSpec, StoreSpec, ToolSourceConfig, ToolSourceSpec,
};

/// What is wrong with a tool name pattern of the approval rules (`cart_*`),
/// or `None` when it is one: the characters of tool names and the
/// wildcards `*` and `?`.
pub fn tool_pattern_problem(pattern: &str) -> Option<String> {
    validate::pattern_problem(pattern)
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Validates config text; `file` names it in errors, and its folder is
    /// where relative paths start (the `mcp_servers` file, read here).
    pub fn parse(text: &str, file: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::parse_with_env(text, file, |name| std::env::var(name).ok())
    }

    /// Like [`Config::parse`], reading environment variables (`cookie_env`)
    /// through `env`.
    pub fn parse_with_env(
        text: &str,
        file: impl AsRef<Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let source = error::Source {
            file: file.as_ref().to_path_buf(),
            text,
        };
        let raw: raw::RawConfig = toml::from_str(text).map_err(|e| source.parse_error(e))?;
        validate::validate(&source, raw, &env)
    }

    /// Reads and validates only the `[providers]` tables of a file: a
    /// file of providers alone (for `wma eval --provider-config`), or a
    /// whole config whose providers are wanted.
    pub fn load_providers(path: impl AsRef<Path>) -> Result<Vec<ProviderConfig>, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        let source = error::Source {
            file: path.to_path_buf(),
            text: &text,
        };
        let raw: raw::RawConfig = toml::from_str(&text).map_err(|e| source.parse_error(e))?;
        validate::validate_providers(&source, &raw)
    }
}
