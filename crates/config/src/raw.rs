//! The file as written: every table and key a config may have, parsed
//! strictly (an unknown key or a wrong type is an error), with the
//! positions that validation needs to point at a mistake.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;
use wma_telemetry::TelemetryConfig;

/// A name as written, with where it was written.
pub(crate) type Name = Spanned<String>;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    /// `mcp_servers`: a Claude-Desktop-style `mcpServers` JSON file whose
    /// servers become tool sources (read by `mcp_json`).
    pub(crate) mcp_servers: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) providers: BTreeMap<Name, RawProvider>,
    #[serde(default)]
    pub(crate) tools: BTreeMap<Name, RawToolSource>,
    #[serde(default)]
    pub(crate) agents: BTreeMap<Name, RawAgent>,
    #[serde(default)]
    pub(crate) delegation: RawDelegation,
    #[serde(default)]
    pub(crate) telemetry: TelemetryConfig,
    #[serde(default)]
    pub(crate) server: RawServer,
    #[serde(default)]
    pub(crate) store: RawStore,
    pub(crate) cluster: Option<Spanned<RawCluster>>,
}

/// `kind` of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ProviderKind {
    Onnx,
    Scripted,
    Openai,
}

/// `[providers.NAME]`. One flat table for every kind, so that a mistake in
/// any key is reported at that key; validation refuses keys of the other kind.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProvider {
    pub(crate) kind: Spanned<ProviderKind>,
    // Every kind.
    pub(crate) model: Option<Spanned<String>>,
    // openai (a served model).
    pub(crate) url: Option<Spanned<String>>,
    pub(crate) api_key_env: Option<Spanned<String>>,
    pub(crate) connect_timeout_secs: Option<Spanned<u64>>,
    pub(crate) request_timeout_secs: Option<Spanned<u64>>,
    pub(crate) dialect: Option<Spanned<wma_provider_openai::Dialect>>,
    // onnx (also openai: temperature, seed, max_new_tokens, context_length).
    pub(crate) variant: Option<Spanned<String>>,
    pub(crate) cache_dir: Option<Spanned<String>>,
    pub(crate) hub_endpoint: Option<Spanned<String>>,
    pub(crate) threads: Option<Spanned<usize>>,
    pub(crate) inter_threads: Option<Spanned<usize>>,
    pub(crate) temperature: Option<Spanned<f32>>,
    pub(crate) top_k: Option<Spanned<usize>>,
    pub(crate) top_p: Option<Spanned<f32>>,
    pub(crate) seed: Option<Spanned<u64>>,
    pub(crate) repetition_penalty: Option<Spanned<f32>>,
    pub(crate) max_new_tokens: Option<Spanned<u32>>,
    pub(crate) stop: Option<Spanned<Vec<String>>>,
    pub(crate) context_length: Option<Spanned<u32>>,
    pub(crate) context_reserve: Option<Spanned<u32>>,
    pub(crate) shared_kv_buffer: Option<Spanned<bool>>,
    pub(crate) reuse_prefix: Option<Spanned<bool>>,
    pub(crate) kv_sessions: Option<Spanned<u32>>,
    pub(crate) kv_cache_mib: Option<Spanned<u64>>,
    pub(crate) fast_forward: Option<Spanned<bool>>,
    pub(crate) prompt_lookup: Option<Spanned<bool>>,
    // scripted (also openai: tools_inline).
    pub(crate) replies: Option<Spanned<Vec<String>>>,
    pub(crate) delay_ms: Option<Spanned<u64>>,
    pub(crate) tools_inline: Option<Spanned<bool>>,
}

/// `kind` of a tool source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ToolKind {
    DemoShop,
    Native,
    McpStdio,
    McpHttp,
    Webmcp,
}

/// `[tools.NAME]`, flat like a provider.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawToolSource {
    pub(crate) kind: Spanned<ToolKind>,
    // Every kind: the source's policy.
    pub(crate) allow: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) deny: Vec<String>,
    pub(crate) untrusted: Option<bool>,
    pub(crate) call_timeout_secs: Option<Spanned<u64>>,
    // native.
    pub(crate) builtins: Option<Vec<Spanned<String>>>,
    // mcp-stdio.
    pub(crate) command: Option<Spanned<String>>,
    pub(crate) args: Option<Spanned<Vec<String>>>,
    pub(crate) env: Option<Spanned<BTreeMap<String, String>>>,
    pub(crate) cwd: Option<Spanned<String>>,
    // mcp-http, webmcp.
    pub(crate) url: Option<Spanned<String>>,
    // webmcp.
    pub(crate) headless: Option<Spanned<bool>>,
    pub(crate) debugging_tools: Option<Spanned<bool>>,
    pub(crate) browser: Option<Spanned<String>>,
}

/// `constraints` of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RawConstraints {
    Off,
    Auto,
    CallsOnly,
}

/// `[agents.NAME]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgent {
    #[serde(default)]
    pub(crate) description: String,
    #[serde(default)]
    pub(crate) remote: Option<Spanned<bool>>,
    pub(crate) provider: Option<Name>,
    pub(crate) instructions: Option<Spanned<String>>,
    pub(crate) max_steps: Option<Spanned<u32>>,
    pub(crate) step_timeout_secs: Option<Spanned<u64>>,
    pub(crate) max_tools: Option<Spanned<usize>>,
    pub(crate) constraints: Option<Spanned<RawConstraints>>,
    pub(crate) policy: Option<Spanned<String>>,
    pub(crate) rules: Option<Spanned<toml::Table>>,
    pub(crate) max_concurrent_runs: Option<Spanned<usize>>,
    pub(crate) tools: Option<Spanned<Vec<Name>>>,
    pub(crate) sub_agents: Option<Spanned<Vec<Name>>>,
    pub(crate) approval: Option<Spanned<RawApproval>>,
}

/// An approval mode as written (`auto`, `ask`, `deny`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RawMode {
    Auto,
    Ask,
    Deny,
}

/// `[agents.NAME.approval]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApproval {
    pub(crate) read_only: Option<RawMode>,
    pub(crate) consequential: Option<RawMode>,
    pub(crate) other: Option<RawMode>,
    pub(crate) timeout_secs: Option<Spanned<u64>>,
    #[serde(default)]
    pub(crate) tools: BTreeMap<Name, RawMode>,
}

/// `[delegation]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDelegation {
    pub(crate) max_depth: Option<u32>,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub(crate) listen: Option<Spanned<String>>,
    pub(crate) token_env: Option<Spanned<String>>,
    pub(crate) token_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) allowed_origins: Vec<String>,
    #[serde(default)]
    pub(crate) allowed_hosts: Vec<String>,
    pub(crate) header_timeout_secs: Option<Spanned<u64>>,
    pub(crate) body_timeout_secs: Option<Spanned<u64>>,
    pub(crate) idle_timeout_secs: Option<Spanned<u64>>,
    pub(crate) max_body_bytes: Option<Spanned<u64>>,
    pub(crate) max_connections: Option<Spanned<u64>>,
    pub(crate) max_connections_per_client: Option<Spanned<u64>>,
    pub(crate) connection_wait_ms: Option<Spanned<u64>>,
    pub(crate) max_runs_per_client: Option<Spanned<u64>>,
    pub(crate) shutdown_grace_secs: Option<Spanned<u64>>,
}

/// `[store]`: where sessions and runs are kept.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    pub(crate) data_dir: Option<Spanned<String>>,
    pub(crate) database_url: Option<Spanned<String>>,
    pub(crate) host: Option<Spanned<String>>,
}

/// `[cluster]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub(crate) node_name: Option<String>,
    pub(crate) cookie: Option<Spanned<String>>,
    pub(crate) cookie_env: Option<Spanned<String>>,
    pub(crate) listen: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) peers: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) export: Vec<Name>,
}
