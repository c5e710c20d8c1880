//! The validated config's data: what a file describes once it has been
//! checked as a whole (see [`Config`]).
//!
//! The types live here, not at the crate's root, so that the modules that
//! fill them (validation, the `mcpServers` file) and the one that starts
//! what they describe (the host) import them from one place below all of
//! them: none of those imports the root, and the root imports them, so the
//! crate's modules form no circle.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use wma_agent::{ApprovalPolicy, ConstraintMode, policy::Policy};
use wma_provider_openai::OpenAiOptions;
use wma_provider_ort::OrtProviderOptions;
use wma_telemetry::TelemetryConfig;

use crate::error::ConfigError;
use crate::server::ServerOptions;

/// Where `wma serve` listens unless `[server] listen` says otherwise:
/// loopback only, so nothing outside this machine reaches the agents.
pub const DEFAULT_SERVER_LISTEN: &str = "127.0.0.1:8080";

/// The name of the one agent a config with tool sources and no `[agents]`
/// gets (it sees every tool source, on the only provider).
pub const DEFAULT_AGENT: &str = "assistant";

/// A validated config: what the host starts.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (for messages).
    pub file: PathBuf,
    /// `[providers.NAME]`, by name.
    pub providers: Vec<ProviderConfig>,
    /// `[tools.NAME]`, by name, then the servers of the `mcp_servers`
    /// file, in its order.
    pub tools: Vec<ToolSourceConfig>,
    /// `[agents.NAME]` hosted here, by name; with no `[agents]` and some
    /// tool source, the one agent [`DEFAULT_AGENT`].
    pub agents: Vec<AgentSpec>,
    /// `[agents.NAME]` with `remote = true`: hosted by another node.
    pub remote_agents: Vec<RemoteAgentSpec>,
    /// `[delegation] max_depth`. Default
    /// [`DEFAULT_MAX_DELEGATION_DEPTH`](wma_runtime::DEFAULT_MAX_DELEGATION_DEPTH).
    pub max_delegation_depth: u32,
    /// `[telemetry]`; see `docs/tracing.md`. Default: export off.
    pub telemetry: TelemetryConfig,
    /// `[server] listen`. Default [`DEFAULT_SERVER_LISTEN`].
    pub server_listen: SocketAddr,
    /// `[server]`'s token and limits (`token_env`, `token_file`,
    /// `allowed_origins`, `allowed_hosts`, the timeouts and caps; see
    /// `docs/configuration.md`).
    pub server_options: ServerOptions,
    /// `[cluster]`, when this process is a node of a cluster.
    pub cluster: Option<ClusterSpec>,
    /// `[store]`: where `wma serve` and `wma chat --session` keep sessions
    /// and runs (see `docs/sessions.md`).
    pub store: StoreSpec,
    /// What the config leaves out on purpose that a person should hear of,
    /// one sentence each: the `mcpServers` entries marked disabled. Not
    /// errors, so validation cannot refuse them; [`Config::start`] logs
    /// them as warnings.
    pub notes: Vec<String>,
}

/// `[store]`: where sessions, runs, consequential calls and pending
/// approvals are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreSpec {
    /// `data_dir`, relative to the config's folder; `None`: the cache
    /// folder (`$WMA_CACHE_DIR`, default `~/.cache/webmcp-agents`).
    pub data_dir: Option<PathBuf>,
    /// `database_url`: a PostgreSQL database instead of the SQLite file.
    pub database_url: Option<String>,
    /// `host`: this host's name on the runs it starts; `None`: `local`.
    pub host: Option<String>,
}

impl StoreSpec {
    /// The store's options: the data folder (the cache folder unless the
    /// config names one), the database URL and the host name.
    pub fn options(&self) -> Result<wma_store::StoreOptions, ConfigError> {
        let data_dir = match &self.data_dir {
            Some(dir) => dir.clone(),
            None => wma_provider_ort::cache_dir().map_err(|e| ConfigError::Store(e.to_string()))?,
        };
        let mut options = wma_store::StoreOptions::in_data_dir(data_dir);
        if let Some(url) = &self.database_url {
            options = options.with_database_url(url.clone());
        }
        if let Some(host) = &self.host {
            options = options.with_host(host.clone());
        }
        Ok(options)
    }
}

/// One provider.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// Its name in the file.
    pub name: String,
    /// What it is.
    pub spec: ProviderSpec,
}

impl ProviderConfig {
    /// The provider named `name` among `providers` (read from `file`, which
    /// the message names), or the only one when no name is given: what
    /// `wma eval --provider-config FILE --provider NAME` runs.
    pub fn pick<'a>(
        providers: &'a [ProviderConfig],
        name: Option<&str>,
        file: &Path,
    ) -> Result<&'a ProviderConfig, String> {
        match name {
            Some(name) => providers.iter().find(|p| p.name == name).ok_or_else(|| {
                format!(
                    "{} has no provider named `{name}` (it has: {})",
                    file.display(),
                    providers
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }),
            None => match providers {
                [only] => Ok(only),
                _ => Err(format!(
                    "{} has {} providers; name one with --provider",
                    file.display(),
                    providers.len()
                )),
            },
        }
    }
}

/// The kinds of provider. Exhaustive on purpose: `GET /v1/agents` of
/// `wma-serve` names each kind, so a new kind must be taught there.
#[derive(Debug, Clone)]
pub enum ProviderSpec {
    /// `kind = "onnx"`: a model run by ONNX Runtime.
    Onnx(OrtProviderOptions),
    /// `kind = "scripted"`: replies given in the file, in order (tests, demos).
    Scripted(ScriptedSpec),
    /// `kind = "openai"`: a model served by an OpenAI-compatible
    /// chat-completion server (llama.cpp's server, Ollama, vLLM).
    Openai(OpenAiOptions),
}

/// A scripted provider's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedSpec {
    /// `model`: the name it reports. Default `scripted-model`.
    pub model: String,
    /// `replies`: what it answers, one per generation. Required.
    pub replies: Vec<String>,
    /// `delay_ms`: wait before each reply. Default 0.
    pub delay: Duration,
    /// `tools_inline`: list tools in the prompt text. Default true.
    pub tools_inline: bool,
}

/// One tool source.
#[derive(Debug, Clone)]
pub struct ToolSourceConfig {
    /// Its name in the file.
    pub name: String,
    /// What it is.
    pub spec: ToolSourceSpec,
    /// The policy every kind takes: `allow`, `deny`, `untrusted`, `call_timeout_secs`.
    pub policy: wma_tools::SourceOptions,
}

/// The kinds of tool source.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolSourceSpec {
    /// `kind = "demo-shop"`: the outdoor shop of [`crate::demo_shop`], with a cart of its own.
    DemoShop,
    /// `kind = "native"`: tools built into `wma` (see [`BUILTINS`](crate::BUILTINS)).
    Native {
        /// `builtins`: which. Default all.
        builtins: Vec<String>,
    },
    /// `kind = "mcp-stdio"`: an MCP server started as a child process.
    McpStdio {
        /// `command`. Required.
        command: String,
        /// `args`. Default none.
        args: Vec<String>,
        /// `env`: extra environment variables. Default none.
        env: Vec<(String, String)>,
        /// `cwd`: its working directory. Default this process's.
        cwd: Option<PathBuf>,
    },
    /// `kind = "mcp-http"`: an MCP server at a streamable-HTTP endpoint.
    McpHttp {
        /// `url`. Required.
        url: String,
    },
    /// `kind = "webmcp"`: a web page's WebMCP tools, in Chromium.
    WebMcp {
        /// `url` of the page. Required.
        url: String,
        /// `headless`. Default true.
        headless: bool,
        /// `debugging_tools`: offer the tools the page marks `debugging`
        /// (meant for developers, not for agents). Default false.
        debugging_tools: bool,
        /// `browser`: the Chromium executable. Default: found as `wma_tools::find_chromium` does.
        browser: Option<PathBuf>,
    },
}

/// One agent hosted here.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// Its name (also the tool name its parents delegate with).
    pub name: String,
    /// `description`: what it is good at, for its parents' models. Default empty.
    pub description: String,
    /// `provider`. Default: the only provider, when there is one.
    pub provider: String,
    /// `instructions`. Default none.
    pub instructions: Option<String>,
    /// `max_steps`. Default 6.
    pub max_steps: u32,
    /// `step_timeout_secs`. Default 60.
    pub step_timeout: Duration,
    /// `max_tools`. Default 8.
    pub max_tools: usize,
    /// `constraints`: `off`, `auto` or `calls-only`. Default `auto`.
    pub constraints: ConstraintMode,
    /// `policy` (`reference` or `small-model`) and its `[agents.NAME.rules]`
    /// (see `docs/loop.md`). Default `None`: the loop picks by the model's
    /// size.
    pub policy: Option<Policy>,
    /// `max_concurrent_runs`. Default
    /// [`DEFAULT_MAX_CONCURRENT_RUNS`](wma_runtime::DEFAULT_MAX_CONCURRENT_RUNS).
    pub max_concurrent_runs: usize,
    /// `tools`: the tool sources it sees. Default none.
    pub tools: Vec<String>,
    /// `sub_agents`: the agents it may delegate to. Default none.
    pub sub_agents: Vec<String>,
    /// `[agents.NAME.approval]`: which calls a person approves first.
    /// Default [`ApprovalPolicy::default`] (consequential tools ask; see
    /// `docs/approvals.md`).
    pub approval: ApprovalPolicy,
}

/// An agent another node hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteAgentSpec {
    /// Its name.
    pub name: String,
    /// `description`, for its parents' models.
    pub description: String,
}

/// `[cluster]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSpec {
    /// `node_name`. Default `wma`.
    pub node_name: String,
    /// `cookie`, or the variable named by `cookie_env`. Required.
    pub cookie: String,
    /// The cookie was written in the config itself (`cookie`), where anyone
    /// who reads the file learns it, rather than named by `cookie_env`.
    pub cookie_inline: bool,
    /// `listen`. Default
    /// [`DEFAULT_CLUSTER_LISTEN`](wma_runtime::DEFAULT_CLUSTER_LISTEN)
    /// (loopback, a free port).
    pub listen: SocketAddr,
    /// `peers`: nodes to connect to (`host:port`). Default none.
    pub peers: Vec<String>,
    /// `export`: local agents other nodes may delegate to. Default none.
    pub export: Vec<String>,
}

impl ClusterSpec {
    /// What a person should hear of these settings before the node starts,
    /// one line each (`cluster.cookie: ...`): a cookie the node will refuse
    /// as weak, a cookie written in the config itself, a listen address
    /// beyond this machine.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        // A node refuses a weak cookie when it starts; say so before then.
        for problem in wma_runtime::cookie_problems(&self.cookie) {
            warnings.push(format!(
                "cluster.cookie: {problem} (the node will refuse it)"
            ));
        }
        if self.cookie_inline {
            warnings.push(
                "cluster.cookie is written in the config; name an environment variable with cookie_env instead"
                    .to_string(),
            );
        }
        if let Some(warning) = wma_runtime::listen_warning(self.listen) {
            warnings.push(format!("cluster.listen: {warning}"));
        }
        warnings
    }
}

impl Config {
    /// The agent hosted here with this name.
    pub fn agent(&self, name: &str) -> Option<&AgentSpec> {
        self.agents.iter().find(|a| a.name == name)
    }

    /// The provider with this name.
    pub fn provider(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.iter().find(|p| p.name == name)
    }

    /// The tool sources the agent `name` and its sub-agents (theirs too)
    /// use, each once, in the order met; and whether every one of those
    /// agents is hosted here (one another node hosts has tools this config
    /// cannot see).
    pub fn tool_sources_of(&self, name: &str) -> (Vec<String>, bool) {
        let mut agents = vec![name.to_string()];
        let mut seen: Vec<String> = Vec::new();
        let mut sources: Vec<String> = Vec::new();
        let mut all_here = true;
        while let Some(agent) = agents.pop() {
            if seen.contains(&agent) {
                continue;
            }
            seen.push(agent.clone());
            let Some(spec) = self.agent(&agent) else {
                all_here = false;
                continue;
            };
            for source in &spec.tools {
                if !sources.contains(source) {
                    sources.push(source.clone());
                }
            }
            agents.extend(spec.sub_agents.iter().cloned());
        }
        (sources, all_here)
    }

    /// The agent a request goes to: the one named, or the only top-level
    /// one. The error says which agents there are.
    pub fn pick_agent(&self, named: Option<&str>) -> Result<String, String> {
        if let Some(name) = named {
            if self.agent(name).is_none() {
                return Err(format!(
                    "{} has no agent named `{name}` (it has {})",
                    self.file.display(),
                    self.agent_names()
                ));
            }
            return Ok(name.to_string());
        }
        match self.top_level_agents()[..] {
            [only] => Ok(only.name.clone()),
            _ => Err(format!(
                "{} has several agents; pick one with --agent ({})",
                self.file.display(),
                self.agent_names()
            )),
        }
    }

    /// The local agents' names, quoted, for messages.
    fn agent_names(&self) -> String {
        self.agents
            .iter()
            .map(|a| format!("`{}`", a.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The agents no other local agent delegates to: where requests start.
    pub fn top_level_agents(&self) -> Vec<&AgentSpec> {
        self.agents
            .iter()
            .filter(|a| !self.agents.iter().any(|p| p.sub_agents.contains(&a.name)))
            .collect()
    }
}
