//! The second pass: the raw file checked as a whole and turned into [`Config`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;
use wma_agent::{
    ApprovalMode, ApprovalPolicy, ApprovalRule, ConstraintMode, LocalLoopOptions, policy::Policy,
    policy::PolicyName,
};
use wma_provider_openai::OpenAiOptions;
use wma_provider_ort::{OrtProviderOptions, SamplingOptions};
use wma_runtime::{
    DEFAULT_CLUSTER_LISTEN, DEFAULT_MAX_CONCURRENT_RUNS, DEFAULT_MAX_DELEGATION_DEPTH,
};
use wma_tools::SourceOptions;

use crate::builtin::BUILTINS;
use crate::error::{ConfigError, Source};
use crate::mcp_json::{self, McpServers};
use crate::raw::{
    Name, ProviderKind, RawAgent, RawApproval, RawCluster, RawConfig, RawConstraints, RawMode,
    RawProvider, RawServer, RawStore, RawToolSource, ToolKind,
};
use crate::server::{ServerOptions, TokenSource};
use crate::spec::{
    AgentSpec, ClusterSpec, Config, DEFAULT_AGENT, DEFAULT_SERVER_LISTEN, ProviderConfig,
    ProviderSpec, RemoteAgentSpec, ScriptedSpec, StoreSpec, ToolSourceConfig, ToolSourceSpec,
};

type Result<T> = std::result::Result<T, ConfigError>;

/// The `[providers]` tables alone, checked as [`validate`] checks them
/// (a file may hold nothing else; other tables are read but not checked).
pub(crate) fn validate_providers(
    source: &Source<'_>,
    raw: &RawConfig,
) -> Result<Vec<ProviderConfig>> {
    let mut providers = Vec::new();
    for (name, provider) in &raw.providers {
        check_name(source, "providers", name)?;
        providers.push(ProviderConfig {
            name: name.get_ref().clone(),
            spec: provider_spec(source, name.get_ref(), provider)?,
        });
    }
    if providers.is_empty() {
        return Err(source.invalid(
            0..0,
            "providers",
            "the file has no providers: add a [providers.NAME] table",
        ));
    }
    Ok(providers)
}

pub(crate) fn validate(
    source: &Source<'_>,
    raw: RawConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config> {
    let mut providers = Vec::new();
    for (name, provider) in &raw.providers {
        check_name(source, "providers", name)?;
        providers.push(ProviderConfig {
            name: name.get_ref().clone(),
            spec: provider_spec(source, name.get_ref(), provider)?,
        });
    }
    let mcp = match &raw.mcp_servers {
        Some(path) => Some(mcp_json::read(source, path)?),
        None => None,
    };
    let mut tools = Vec::new();
    for (name, tool) in &raw.tools {
        check_name(source, "tools", name)?;
        tools.push(tool_source(source, name.get_ref(), tool)?);
    }
    if let Some(mcp) = &mcp {
        for server in &mcp.sources {
            if let Some(clash) = raw.tools.keys().find(|t| *t.get_ref() == server.name) {
                return Err(source.invalid(
                    clash.span(),
                    format!("tools.{}", server.name),
                    format!(
                        "`{name}` is also a server of {file} (`mcpServers.{name}`), and a tool source needs a name of its own: rename one of them",
                        name = server.name,
                        file = mcp.file.display()
                    ),
                ));
            }
        }
        tools.extend(mcp.sources.iter().cloned());
    }
    if raw.agents.is_empty() && tools.is_empty() {
        return Err(source.invalid(
            0..0,
            "agents",
            format!(
                "the config has no agents: add an [agents.NAME] table (a config with tool sources and no agents gets one agent, `{DEFAULT_AGENT}`, that sees them all)"
            ),
        ));
    }
    let cluster = match &raw.cluster {
        Some(cluster) => Some(cluster_spec(source, cluster, env)?),
        None => None,
    };
    let mut agents = Vec::new();
    let mut remote_agents = Vec::new();
    for (name, agent) in &raw.agents {
        check_name(source, "agents", name)?;
        let key = format!("agents.{}", name.get_ref());
        if agent.remote.as_ref().is_some_and(|r| *r.get_ref()) {
            remote_only(source, &key, agent)?;
            if cluster.is_none() {
                return Err(source.invalid(
                    name.span(),
                    key,
                    "a remote agent is reached through the cluster: add a [cluster] table with the peers that host it",
                ));
            }
            remote_agents.push(RemoteAgentSpec {
                name: name.get_ref().clone(),
                description: agent.description.clone(),
            });
            continue;
        }
        agents.push(agent_spec(
            source,
            &key,
            name,
            agent,
            &raw,
            &tools,
            mcp.as_ref(),
        )?);
    }
    if raw.agents.is_empty() {
        agents.push(default_agent(source, &raw, &tools)?);
    }
    check_cycles(source, &raw.agents)?;
    if let Some(cluster) = &cluster {
        let raw_cluster = raw.cluster.as_ref().map(Spanned::get_ref);
        for export in raw_cluster.map(|c| &c.export).into_iter().flatten() {
            if !agents.iter().any(|a| &a.name == export.get_ref()) {
                return Err(source.invalid(
                    export.span(),
                    "cluster.export",
                    format!(
                        "`{}` is not an agent hosted here, so this node cannot offer it",
                        export.get_ref()
                    ),
                ));
            }
        }
        debug_assert_eq!(
            cluster.export.len(),
            raw_cluster.map_or(0, |c| c.export.len())
        );
    }
    let server_listen = match &raw.server.listen {
        Some(listen) => socket_addr(source, listen, "server.listen")?,
        None => DEFAULT_SERVER_LISTEN
            .parse()
            .expect("the default listen address parses"),
    };
    let server_options = server_options(source, &raw.server)?;
    let store = store_spec(source, &raw.store)?;
    Ok(Config {
        file: source.file.clone(),
        providers,
        tools,
        agents,
        remote_agents,
        max_delegation_depth: raw
            .delegation
            .max_depth
            .unwrap_or(DEFAULT_MAX_DELEGATION_DEPTH),
        telemetry: raw.telemetry,
        server_listen,
        server_options,
        cluster,
        store,
        notes: mcp
            .iter()
            .flat_map(|mcp| {
                mcp.disabled.iter().map(|name| {
                    format!(
                        "{}: `mcpServers.{name}` is marked \"disabled\": true, so it is not started",
                        mcp.file.display()
                    )
                })
            })
            .collect(),
    })
}

/// The agent of a config that has tool sources and no `[agents]`: it sees
/// every source, on the only provider, with every other setting at its
/// default, so a provider and an `mcpServers` file are a whole config.
fn default_agent(
    source: &Source<'_>,
    raw: &RawConfig,
    tools: &[ToolSourceConfig],
) -> Result<AgentSpec> {
    let provider = match raw.providers.keys().collect::<Vec<_>>()[..] {
        [only] => only.get_ref().clone(),
        [] => {
            return Err(source.invalid(
                0..0,
                "providers",
                format!(
                    "the config has no agents, so it gets one, `{DEFAULT_AGENT}`, that sees every tool source; it needs a provider: add a [providers.NAME] table"
                ),
            ));
        }
        _ => {
            return Err(source.invalid(
                0..0,
                "agents",
                format!(
                    "the config has no agents, so it gets one, `{DEFAULT_AGENT}`, that sees every tool source; with several providers{} it cannot tell which model to run: add an [agents.NAME] table that names one with `provider`",
                    known(raw.providers.keys())
                ),
            ));
        }
    };
    let defaults = LocalLoopOptions::default();
    Ok(AgentSpec {
        name: DEFAULT_AGENT.to_string(),
        description: String::new(),
        provider,
        instructions: None,
        max_steps: defaults.max_steps,
        step_timeout: defaults.step_timeout,
        max_tools: defaults.max_tools,
        constraints: ConstraintMode::Auto,
        policy: None,
        max_concurrent_runs: DEFAULT_MAX_CONCURRENT_RUNS,
        tools: tools.iter().map(|t| t.name.clone()).collect(),
        sub_agents: Vec::new(),
        approval: ApprovalPolicy::default(),
    })
}

/// `[store]`: a folder relative to the config's, a URL the store checks
/// when it opens (its own messages name the URL), a host name.
fn store_spec(source: &Source<'_>, raw: &RawStore) -> Result<StoreSpec> {
    let non_empty = |value: &Option<Spanned<String>>, key: &str| -> Result<Option<String>> {
        match value {
            Some(v) if v.get_ref().trim().is_empty() => Err(source.invalid(
                v.span(),
                format!("store.{key}"),
                format!("`{key}` is empty; leave it out for the default"),
            )),
            Some(v) => Ok(Some(v.get_ref().clone())),
            None => Ok(None),
        }
    };
    let base = source.file.parent().unwrap_or(std::path::Path::new(""));
    let database_url = non_empty(&raw.database_url, "database_url")?;
    if let (Some(url), Some(value)) = (&database_url, &raw.database_url)
        && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
    {
        return Err(source.invalid(
            value.span(),
            "store.database_url",
            "`database_url` names a PostgreSQL database (postgres://user@host:5432/wma); leave it out for the SQLite file in `data_dir`",
        ));
    }
    Ok(StoreSpec {
        data_dir: non_empty(&raw.data_dir, "data_dir")?.map(|d| base.join(d)),
        database_url,
        host: non_empty(&raw.host, "host")?,
    })
}

/// `[server]`'s token and limits, as [`ServerOptions`].
fn server_options(source: &Source<'_>, raw: &RawServer) -> Result<ServerOptions> {
    let defaults = ServerOptions::default();
    let token = match (&raw.token_env, &raw.token_file) {
        (Some(_), Some(file)) => {
            return Err(source.invalid(
                file.span(),
                "server.token_file",
                "give the token either by `token_env` or by `token_file`, not both",
            ));
        }
        (Some(name), None) => {
            if name.get_ref().trim().is_empty() {
                return Err(source.invalid(
                    name.span(),
                    "server.token_env",
                    "the name of an environment variable is empty",
                ));
            }
            TokenSource::Env(name.get_ref().clone())
        }
        (None, Some(file)) => {
            // Relative to the config's folder, as a person reading the
            // config would read it.
            let base = source.file.parent().unwrap_or(std::path::Path::new(""));
            TokenSource::File(base.join(file.get_ref()))
        }
        (None, None) => TokenSource::CacheFile,
    };
    let secs = |v: &Option<Spanned<u64>>, key: &str, default: Duration| -> Result<Duration> {
        match at_least_one(source, "server", key, v)? {
            Some(n) => Ok(Duration::from_secs(n)),
            None => Ok(default),
        }
    };
    let count = |v: &Option<Spanned<u64>>, key: &str, default: usize| -> Result<usize> {
        Ok(at_least_one(source, "server", key, v)?.map_or(default, |n| n as usize))
    };
    Ok(ServerOptions {
        token,
        allowed_origins: raw.allowed_origins.clone(),
        allowed_hosts: raw.allowed_hosts.clone(),
        header_timeout: secs(
            &raw.header_timeout_secs,
            "header_timeout_secs",
            defaults.header_timeout,
        )?,
        body_timeout: secs(
            &raw.body_timeout_secs,
            "body_timeout_secs",
            defaults.body_timeout,
        )?,
        idle_timeout: secs(
            &raw.idle_timeout_secs,
            "idle_timeout_secs",
            defaults.idle_timeout,
        )?,
        max_body_bytes: count(
            &raw.max_body_bytes,
            "max_body_bytes",
            defaults.max_body_bytes,
        )?,
        max_connections: count(
            &raw.max_connections,
            "max_connections",
            defaults.max_connections,
        )?,
        max_connections_per_client: count(
            &raw.max_connections_per_client,
            "max_connections_per_client",
            defaults.max_connections_per_client,
        )?,
        connection_wait: match &raw.connection_wait_ms {
            Some(ms) => Duration::from_millis(*ms.get_ref()),
            None => defaults.connection_wait,
        },
        max_runs_per_client: count(
            &raw.max_runs_per_client,
            "max_runs_per_client",
            defaults.max_runs_per_client,
        )?,
        // 0 is a choice too: give up on every run at once.
        shutdown_grace: raw
            .shutdown_grace_secs
            .as_ref()
            .map_or(defaults.shutdown_grace, |s| {
                Duration::from_secs(*s.get_ref())
            }),
    })
}

/// Names become tool names (a sub-agent's) and URL segments, so they keep
/// to the characters both take.
fn check_name(source: &Source<'_>, table: &str, name: &Name) -> Result<()> {
    let ok = !name.get_ref().is_empty()
        && name
            .get_ref()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(source.invalid(
            name.span(),
            format!("{table}.{}", name.get_ref()),
            "a name may use only letters, digits, `_` and `-`",
        ))
    }
}

/// Fails at the first setting that is present but belongs to another kind.
fn refuse(
    source: &Source<'_>,
    key: &str,
    kind: &str,
    present: &[(&str, Option<Range<usize>>)],
) -> Result<()> {
    for (setting, span) in present {
        if let Some(span) = span {
            return Err(source.invalid(
                span.clone(),
                format!("{key}.{setting}"),
                format!("`{setting}` is not a setting of a {kind}"),
            ));
        }
    }
    Ok(())
}

fn value<T: Clone>(value: &Option<Spanned<T>>) -> Option<T> {
    value.as_ref().map(|v| v.get_ref().clone())
}

fn span_of<T>(value: &Option<Spanned<T>>) -> Option<Range<usize>> {
    value.as_ref().map(Spanned::span)
}

fn provider_spec(source: &Source<'_>, name: &str, raw: &RawProvider) -> Result<ProviderSpec> {
    let key = format!("providers.{name}");
    match raw.kind.get_ref() {
        ProviderKind::Onnx => {
            refuse(
                source,
                &key,
                "onnx provider (it belongs to other kinds)",
                &[
                    ("replies", span_of(&raw.replies)),
                    ("delay_ms", span_of(&raw.delay_ms)),
                    ("tools_inline", span_of(&raw.tools_inline)),
                    ("url", span_of(&raw.url)),
                    ("api_key_env", span_of(&raw.api_key_env)),
                    ("connect_timeout_secs", span_of(&raw.connect_timeout_secs)),
                    ("request_timeout_secs", span_of(&raw.request_timeout_secs)),
                    ("dialect", span_of(&raw.dialect)),
                ],
            )?;
            let defaults = OrtProviderOptions::default();
            let sampling = SamplingOptions::default();
            Ok(ProviderSpec::Onnx(OrtProviderOptions {
                model: value(&raw.model),
                variant: value(&raw.variant),
                cache_dir: value(&raw.cache_dir).map(PathBuf::from),
                hub_endpoint: value(&raw.hub_endpoint),
                intra_threads: value(&raw.threads),
                inter_threads: value(&raw.inter_threads),
                sampling: SamplingOptions {
                    temperature: value(&raw.temperature).unwrap_or(sampling.temperature),
                    top_k: value(&raw.top_k).unwrap_or(sampling.top_k),
                    top_p: value(&raw.top_p).unwrap_or(sampling.top_p),
                    seed: value(&raw.seed),
                    repetition_penalty: value(&raw.repetition_penalty)
                        .unwrap_or(sampling.repetition_penalty),
                },
                max_new_tokens: value(&raw.max_new_tokens).unwrap_or(defaults.max_new_tokens),
                stop: value(&raw.stop).unwrap_or_default(),
                context_length: value(&raw.context_length),
                context_reserve: value(&raw.context_reserve),
                shared_kv_buffer: value(&raw.shared_kv_buffer).unwrap_or(defaults.shared_kv_buffer),
                reuse_prefix: value(&raw.reuse_prefix).unwrap_or(defaults.reuse_prefix),
                kv_sessions: at_least_one(source, &key, "kv_sessions", &raw.kv_sessions)?
                    .map_or(defaults.kv_sessions, |n| n as usize),
                kv_cache_bytes: at_least_one(source, &key, "kv_cache_mib", &raw.kv_cache_mib)?
                    .map_or(defaults.kv_cache_bytes, |mib| mib.saturating_mul(1 << 20)),
                fast_forward: value(&raw.fast_forward).unwrap_or(defaults.fast_forward),
                prompt_lookup: value(&raw.prompt_lookup).unwrap_or(defaults.prompt_lookup),
                ..defaults
            }))
        }
        ProviderKind::Scripted => {
            refuse(
                source,
                &key,
                "scripted provider (it belongs to other kinds)",
                &[
                    ("url", span_of(&raw.url)),
                    ("api_key_env", span_of(&raw.api_key_env)),
                    ("connect_timeout_secs", span_of(&raw.connect_timeout_secs)),
                    ("request_timeout_secs", span_of(&raw.request_timeout_secs)),
                    ("dialect", span_of(&raw.dialect)),
                    ("variant", span_of(&raw.variant)),
                    ("cache_dir", span_of(&raw.cache_dir)),
                    ("hub_endpoint", span_of(&raw.hub_endpoint)),
                    ("threads", span_of(&raw.threads)),
                    ("inter_threads", span_of(&raw.inter_threads)),
                    ("temperature", span_of(&raw.temperature)),
                    ("top_k", span_of(&raw.top_k)),
                    ("top_p", span_of(&raw.top_p)),
                    ("seed", span_of(&raw.seed)),
                    ("repetition_penalty", span_of(&raw.repetition_penalty)),
                    ("max_new_tokens", span_of(&raw.max_new_tokens)),
                    ("stop", span_of(&raw.stop)),
                    ("context_length", span_of(&raw.context_length)),
                    ("context_reserve", span_of(&raw.context_reserve)),
                    ("shared_kv_buffer", span_of(&raw.shared_kv_buffer)),
                    ("reuse_prefix", span_of(&raw.reuse_prefix)),
                    ("kv_sessions", span_of(&raw.kv_sessions)),
                    ("kv_cache_mib", span_of(&raw.kv_cache_mib)),
                    ("fast_forward", span_of(&raw.fast_forward)),
                    ("prompt_lookup", span_of(&raw.prompt_lookup)),
                ],
            )?;
            let Some(replies) = &raw.replies else {
                return Err(source.invalid(
                    raw.kind.span(),
                    key,
                    "a scripted provider needs `replies`, the answers it gives in order",
                ));
            };
            Ok(ProviderSpec::Scripted(ScriptedSpec {
                model: raw
                    .model
                    .as_ref()
                    .map(|m| m.get_ref().clone())
                    .unwrap_or_else(|| "scripted-model".to_string()),
                replies: replies.get_ref().clone(),
                delay: Duration::from_millis(raw.delay_ms.as_ref().map_or(0, |d| *d.get_ref())),
                tools_inline: raw.tools_inline.as_ref().is_none_or(|t| *t.get_ref()),
            }))
        }
        ProviderKind::Openai => openai_spec(source, &key, raw),
    }
}

/// `kind = "openai"`: a model behind an OpenAI-compatible server.
fn openai_spec(source: &Source<'_>, key: &str, raw: &RawProvider) -> Result<ProviderSpec> {
    refuse(
        source,
        key,
        "openai provider (it belongs to other kinds; the server samples and counts)",
        &[
            ("replies", span_of(&raw.replies)),
            ("delay_ms", span_of(&raw.delay_ms)),
            ("variant", span_of(&raw.variant)),
            ("cache_dir", span_of(&raw.cache_dir)),
            ("hub_endpoint", span_of(&raw.hub_endpoint)),
            ("threads", span_of(&raw.threads)),
            ("inter_threads", span_of(&raw.inter_threads)),
            ("top_k", span_of(&raw.top_k)),
            ("top_p", span_of(&raw.top_p)),
            ("repetition_penalty", span_of(&raw.repetition_penalty)),
            ("stop", span_of(&raw.stop)),
            ("context_reserve", span_of(&raw.context_reserve)),
            ("shared_kv_buffer", span_of(&raw.shared_kv_buffer)),
            ("reuse_prefix", span_of(&raw.reuse_prefix)),
            ("kv_sessions", span_of(&raw.kv_sessions)),
            ("kv_cache_mib", span_of(&raw.kv_cache_mib)),
            ("fast_forward", span_of(&raw.fast_forward)),
            ("prompt_lookup", span_of(&raw.prompt_lookup)),
        ],
    )?;
    let Some(url) = &raw.url else {
        return Err(source.invalid(
            raw.kind.span(),
            key,
            "an openai provider needs `url`, the server's address (http://127.0.0.1:8080)",
        ));
    };
    let text = url.get_ref().trim();
    if !(text.starts_with("http://") || text.starts_with("https://")) {
        return Err(source.invalid(
            url.span(),
            format!("{key}.url"),
            format!("`{text}` is not an http:// or https:// address"),
        ));
    }
    let Some(model) = &raw.model else {
        return Err(source.invalid(
            raw.kind.span(),
            key,
            "an openai provider needs `model`, the name the server serves it under",
        ));
    };
    if let Some(name) = &raw.api_key_env
        && name.get_ref().trim().is_empty()
    {
        return Err(source.invalid(
            name.span(),
            format!("{key}.api_key_env"),
            "`api_key_env` names an environment variable; it is empty",
        ));
    }
    for (setting, value) in [
        ("connect_timeout_secs", &raw.connect_timeout_secs),
        ("request_timeout_secs", &raw.request_timeout_secs),
    ] {
        if let Some(v) = value.as_ref().filter(|v| *v.get_ref() == 0) {
            return Err(source.invalid(
                v.span(),
                format!("{key}.{setting}"),
                format!("`{setting}` must be at least 1"),
            ));
        }
    }
    let mut options = OpenAiOptions::new(text, model.get_ref().clone());
    options.api_key_env = value(&raw.api_key_env);
    options.context_length = value(&raw.context_length);
    options.max_new_tokens = value(&raw.max_new_tokens).unwrap_or(options.max_new_tokens);
    options.temperature = value(&raw.temperature);
    options.seed = value(&raw.seed);
    options.tools_inline = value(&raw.tools_inline);
    options.dialect = value(&raw.dialect);
    if let Some(secs) = value(&raw.connect_timeout_secs) {
        options.connect_timeout = Duration::from_secs(secs);
    }
    if let Some(secs) = value(&raw.request_timeout_secs) {
        options.request_timeout = Duration::from_secs(secs);
    }
    Ok(ProviderSpec::Openai(options))
}

fn tool_source(source: &Source<'_>, name: &str, raw: &RawToolSource) -> Result<ToolSourceConfig> {
    let key = format!("tools.{name}");
    let builtins_span = raw
        .builtins
        .as_ref()
        .and_then(|b| b.first().map(Spanned::span))
        .or_else(|| raw.builtins.as_ref().map(|_| raw.kind.span()));
    let all = [
        ("builtins", builtins_span),
        ("command", span_of(&raw.command)),
        ("args", span_of(&raw.args)),
        ("env", span_of(&raw.env)),
        ("cwd", span_of(&raw.cwd)),
        ("url", span_of(&raw.url)),
        ("headless", span_of(&raw.headless)),
        ("debugging_tools", span_of(&raw.debugging_tools)),
        ("browser", span_of(&raw.browser)),
    ];
    let (kind, allowed): (&str, &[&str]) = match raw.kind.get_ref() {
        ToolKind::DemoShop => ("demo-shop source", &[]),
        ToolKind::Native => ("native source", &["builtins"]),
        ToolKind::McpStdio => ("mcp-stdio source", &["command", "args", "env", "cwd"]),
        ToolKind::McpHttp => ("mcp-http source", &["url"]),
        ToolKind::Webmcp => (
            "webmcp source",
            &["url", "headless", "browser", "debugging_tools"],
        ),
    };
    let others: Vec<_> = all
        .iter()
        .filter(|(setting, _)| !allowed.contains(setting))
        .cloned()
        .collect();
    refuse(source, &key, kind, &others)?;
    let required = |value: &Option<Spanned<String>>, setting: &str| -> Result<String> {
        value
            .as_ref()
            .map(|v| v.get_ref().clone())
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| {
                source.invalid(
                    raw.kind.span(),
                    key.clone(),
                    format!("a {kind} needs `{setting}`"),
                )
            })
    };
    let spec = match raw.kind.get_ref() {
        ToolKind::DemoShop => ToolSourceSpec::DemoShop,
        ToolKind::Native => {
            let mut builtins = Vec::new();
            for builtin in raw.builtins.iter().flatten() {
                if !BUILTINS.contains(&builtin.get_ref().as_str()) {
                    return Err(source.invalid(
                        builtin.span(),
                        format!("{key}.builtins"),
                        format!(
                            "there is no built-in tool `{}`; the built-ins are {}",
                            builtin.get_ref(),
                            BUILTINS.join(", ")
                        ),
                    ));
                }
                builtins.push(builtin.get_ref().clone());
            }
            if raw.builtins.is_none() {
                builtins = BUILTINS.iter().map(|b| b.to_string()).collect();
            }
            ToolSourceSpec::Native { builtins }
        }
        ToolKind::McpStdio => ToolSourceSpec::McpStdio {
            command: required(&raw.command, "command")?,
            args: raw
                .args
                .as_ref()
                .map(|a| a.get_ref().clone())
                .unwrap_or_default(),
            env: raw
                .env
                .as_ref()
                .map(|e| e.get_ref().clone().into_iter().collect())
                .unwrap_or_default(),
            cwd: raw.cwd.as_ref().map(|c| PathBuf::from(c.get_ref())),
        },
        ToolKind::McpHttp => ToolSourceSpec::McpHttp {
            url: required(&raw.url, "url")?,
        },
        ToolKind::Webmcp => ToolSourceSpec::WebMcp {
            url: required(&raw.url, "url")?,
            headless: raw.headless.as_ref().is_none_or(|h| *h.get_ref()),
            debugging_tools: raw.debugging_tools.as_ref().is_some_and(|d| *d.get_ref()),
            browser: raw.browser.as_ref().map(|b| PathBuf::from(b.get_ref())),
        },
    };
    let mut policy = SourceOptions::default().deny(raw.deny.clone());
    if let Some(allow) = &raw.allow {
        policy = policy.allow(allow.clone());
    }
    if let Some(untrusted) = raw.untrusted {
        policy = policy.untrusted(untrusted);
    } else if matches!(raw.kind.get_ref(), ToolKind::Webmcp) {
        // A web page is written by whoever wrote the site, not by the host.
        policy = policy.untrusted(true);
    }
    if let Some(secs) = &raw.call_timeout_secs {
        if *secs.get_ref() == 0 {
            return Err(source.invalid(
                secs.span(),
                format!("{key}.call_timeout_secs"),
                "a call needs at least 1 second",
            ));
        }
        policy = policy.call_timeout(Duration::from_secs(*secs.get_ref()));
    }
    Ok(ToolSourceConfig {
        name: name.to_string(),
        spec,
        policy,
    })
}

/// A remote agent is only a name and a description here.
fn remote_only(source: &Source<'_>, key: &str, agent: &RawAgent) -> Result<()> {
    refuse(
        source,
        key,
        "remote agent (the node that hosts it sets it)",
        &[
            ("provider", span_of(&agent.provider)),
            ("instructions", span_of(&agent.instructions)),
            ("max_steps", span_of(&agent.max_steps)),
            ("step_timeout_secs", span_of(&agent.step_timeout_secs)),
            ("max_tools", span_of(&agent.max_tools)),
            ("constraints", span_of(&agent.constraints)),
            ("policy", span_of(&agent.policy)),
            ("rules", span_of(&agent.rules)),
            ("max_concurrent_runs", span_of(&agent.max_concurrent_runs)),
            ("tools", span_of(&agent.tools)),
            ("sub_agents", span_of(&agent.sub_agents)),
            ("approval", span_of(&agent.approval)),
        ],
    )
}

fn at_least_one<T: Copy + Into<u64>>(
    source: &Source<'_>,
    key: &str,
    setting: &str,
    value: &Option<Spanned<T>>,
) -> Result<Option<T>> {
    match value {
        Some(v) if (*v.get_ref()).into() == 0 => Err(source.invalid(
            v.span(),
            format!("{key}.{setting}"),
            format!("`{setting}` must be at least 1"),
        )),
        Some(v) => Ok(Some(*v.get_ref())),
        None => Ok(None),
    }
}

fn agent_spec(
    source: &Source<'_>,
    key: &str,
    name: &Name,
    agent: &RawAgent,
    raw: &RawConfig,
    sources: &[ToolSourceConfig],
    mcp: Option<&McpServers>,
) -> Result<AgentSpec> {
    let provider = match &agent.provider {
        Some(provider) => {
            if !raw
                .providers
                .keys()
                .any(|p| p.get_ref() == provider.get_ref())
            {
                return Err(source.invalid(
                    provider.span(),
                    format!("{key}.provider"),
                    format!(
                        "there is no provider named `{}`{}",
                        provider.get_ref(),
                        known(raw.providers.keys())
                    ),
                ));
            }
            provider.get_ref().clone()
        }
        None => match raw.providers.keys().collect::<Vec<_>>()[..] {
            [only] => only.get_ref().clone(),
            [] => {
                return Err(source.invalid(
                    name.span(),
                    key,
                    "the agent needs a provider, and the config has none: add a [providers.NAME] table",
                ));
            }
            _ => {
                return Err(source.invalid(
                    name.span(),
                    key,
                    format!(
                        "the config has several providers, so the agent must name one with `provider`{}",
                        known(raw.providers.keys())
                    ),
                ));
            }
        },
    };
    let mut tools = Vec::new();
    for tool in agent.tools.iter().flat_map(|t| t.get_ref()) {
        if !sources.iter().any(|t| t.name == *tool.get_ref()) {
            if let Some(mcp) = mcp.filter(|m| m.disabled.contains(tool.get_ref())) {
                return Err(source.invalid(
                    tool.span(),
                    format!("{key}.tools"),
                    format!(
                        "`{name}` is marked \"disabled\": true in {file}, so it is not started: take it out of `tools`, or enable it in the file",
                        name = tool.get_ref(),
                        file = mcp.file.display()
                    ),
                ));
            }
            return Err(source.invalid(
                tool.span(),
                format!("{key}.tools"),
                format!(
                    "there is no tool source named `{}`{}",
                    tool.get_ref(),
                    known_names(sources.iter().map(|t| t.name.as_str()))
                ),
            ));
        }
        tools.push(tool.get_ref().clone());
    }
    let mut sub_agents = Vec::new();
    for sub in agent.sub_agents.iter().flat_map(|s| s.get_ref()) {
        if !raw.agents.keys().any(|a| a.get_ref() == sub.get_ref()) {
            return Err(source.invalid(
                sub.span(),
                format!("{key}.sub_agents"),
                format!(
                    "there is no agent named `{}`{}",
                    sub.get_ref(),
                    known(raw.agents.keys())
                ),
            ));
        }
        sub_agents.push(sub.get_ref().clone());
    }
    let defaults = LocalLoopOptions::default();
    let max_steps = at_least_one(source, key, "max_steps", &agent.max_steps)?;
    let step_timeout = at_least_one(source, key, "step_timeout_secs", &agent.step_timeout_secs)?;
    let max_tools = at_least_one(
        source,
        key,
        "max_tools",
        &agent
            .max_tools
            .as_ref()
            .map(|s| Spanned::new(s.span(), *s.get_ref() as u64)),
    )?;
    let runs = at_least_one(
        source,
        key,
        "max_concurrent_runs",
        &agent
            .max_concurrent_runs
            .as_ref()
            .map(|s| Spanned::new(s.span(), *s.get_ref() as u64)),
    )?;
    Ok(AgentSpec {
        name: name.get_ref().clone(),
        description: agent.description.clone(),
        provider,
        instructions: agent.instructions.as_ref().map(|i| i.get_ref().clone()),
        max_steps: max_steps.unwrap_or(defaults.max_steps),
        step_timeout: step_timeout.map_or(defaults.step_timeout, Duration::from_secs),
        max_tools: max_tools.map_or(defaults.max_tools, |n| n as usize),
        constraints: match agent.constraints.as_ref().map(|c| *c.get_ref()) {
            None | Some(RawConstraints::Auto) => ConstraintMode::Auto,
            Some(RawConstraints::Off) => ConstraintMode::Off,
            Some(RawConstraints::CallsOnly) => ConstraintMode::CallsOnly,
        },
        policy: policy(source, key, agent)?,
        max_concurrent_runs: runs.map_or(DEFAULT_MAX_CONCURRENT_RUNS, |n| n as usize),
        tools,
        sub_agents,
        approval: match &agent.approval {
            Some(raw) => approval(source, key, raw)?,
            None => ApprovalPolicy::default(),
        },
    })
}

fn mode(raw: RawMode) -> ApprovalMode {
    match raw {
        RawMode::Auto => ApprovalMode::Auto,
        RawMode::Ask => ApprovalMode::Ask,
        RawMode::Deny => ApprovalMode::Deny,
    }
}

/// `[agents.NAME.approval]`: the defaults by annotation, the time limit
/// and the rules by tool name pattern.
fn approval(source: &Source<'_>, key: &str, raw: &Spanned<RawApproval>) -> Result<ApprovalPolicy> {
    let defaults = ApprovalPolicy::default();
    let table = raw.get_ref();
    let timeout = at_least_one(
        source,
        &format!("{key}.approval"),
        "timeout_secs",
        &table.timeout_secs,
    )?;
    let mut rules = Vec::new();
    for (pattern, m) in &table.tools {
        check_pattern(source, &format!("{key}.approval.tools"), pattern)?;
        rules.push(ApprovalRule::new(pattern.get_ref().clone(), mode(*m)));
    }
    Ok(ApprovalPolicy {
        read_only: table.read_only.map_or(defaults.read_only, mode),
        consequential: table.consequential.map_or(defaults.consequential, mode),
        other: table.other.map_or(defaults.other, mode),
        rules,
        timeout: timeout.map_or(defaults.timeout, Duration::from_secs),
    })
}

/// A tool name pattern: the characters of tool names, and `*` and `?`.
pub(crate) fn pattern_problem(pattern: &str) -> Option<String> {
    if pattern.is_empty() {
        return Some("a tool pattern may not be empty".to_string());
    }
    pattern
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*' | '?')))
        .map(|c| {
            format!(
                "`{pattern}` is not a tool pattern: `{c}` is neither a character of tool names (letters, digits, `_`, `-`, `.`) nor a wildcard (`*`, `?`)"
            )
        })
}

fn check_pattern(source: &Source<'_>, key: &str, pattern: &Name) -> Result<()> {
    match pattern_problem(pattern.get_ref()) {
        None => Ok(()),
        Some(problem) => Err(source.invalid(
            pattern.span(),
            format!("{key}.{}", pattern.get_ref()),
            problem,
        )),
    }
}

/// The agent's `policy` and `rules`: `None` when neither is set (the loop
/// picks a policy by the model's name); else the named policy (by
/// default `small-model`) with the rules the table sets.
fn policy(source: &Source<'_>, key: &str, agent: &RawAgent) -> Result<Option<Policy>> {
    if agent.policy.is_none() && agent.rules.is_none() {
        return Ok(None);
    }
    let base = match &agent.policy {
        None => PolicyName::SmallModel,
        Some(name) => PolicyName::parse(name.get_ref()).ok_or_else(|| {
            source.invalid(
                name.span(),
                format!("{key}.policy"),
                format!(
                    "unknown policy `{}`, expected `reference` or `small-model`",
                    name.get_ref()
                ),
            )
        })?,
    };
    let mut policy = Policy::named(base);
    if let Some(rules) = &agent.rules {
        if rules.get_ref().contains_key("base") {
            return Err(source.invalid(
                rules.span(),
                format!("{key}.rules.base"),
                "the base policy is `policy`, not a rule",
            ));
        }
        // A TOML table is plain data; as JSON it cannot fail.
        let table = serde_json::to_value(rules.get_ref()).unwrap_or_default();
        policy = policy
            .with_rules(&table)
            .map_err(|e| source.invalid(rules.span(), format!("{key}.rules"), e.to_string()))?;
    }
    Ok(Some(policy))
}

/// ", the providers are `a`, `b`" (or nothing when there are none).
fn known<'a>(names: impl Iterator<Item = &'a Name>) -> String {
    known_names(names.map(|n| n.get_ref().as_str()))
}

/// [`known`] of plain names.
fn known_names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<String> = names.map(|n| format!("`{n}`")).collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" (there are {})", names.join(", "))
    }
}

/// Delegation must not come back to an agent already on the way: its
/// parent's run would wait for itself.
fn check_cycles(source: &Source<'_>, agents: &BTreeMap<Name, RawAgent>) -> Result<()> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    let edges: HashMap<&str, Vec<&Name>> = agents
        .iter()
        .map(|(name, agent)| {
            (
                name.get_ref().as_str(),
                agent.sub_agents.iter().flat_map(|s| s.get_ref()).collect(),
            )
        })
        .collect();
    fn visit<'a>(
        source: &Source<'_>,
        agent: &'a str,
        edges: &HashMap<&'a str, Vec<&'a Name>>,
        marks: &mut HashMap<&'a str, Mark>,
        path: &mut Vec<&'a str>,
    ) -> Result<()> {
        marks.insert(agent, Mark::Open);
        path.push(agent);
        for sub in edges.get(agent).into_iter().flatten() {
            let name = sub.get_ref().as_str();
            match marks.get(name) {
                Some(Mark::Open) => {
                    let from = path.iter().position(|a| *a == name).unwrap_or(0);
                    let mut cycle: Vec<&str> = path[from..].to_vec();
                    cycle.push(name);
                    return Err(source.invalid(
                        sub.span(),
                        format!("agents.{agent}.sub_agents"),
                        format!(
                            "delegation goes in a circle: {}; a sub-agent cannot delegate back to an agent that is waiting for it",
                            cycle.join(" → ")
                        ),
                    ));
                }
                Some(Mark::Done) => {}
                None => visit(source, name, edges, marks, path)?,
            }
        }
        path.pop();
        marks.insert(agent, Mark::Done);
        Ok(())
    }
    let mut marks = HashMap::new();
    for name in agents.keys() {
        if !marks.contains_key(name.get_ref().as_str()) {
            visit(source, name.get_ref(), &edges, &mut marks, &mut Vec::new())?;
        }
    }
    Ok(())
}

fn socket_addr(source: &Source<'_>, value: &Spanned<String>, key: &str) -> Result<SocketAddr> {
    value.get_ref().parse().map_err(|_| {
        source.invalid(
            value.span(),
            key,
            format!(
                "`{}` is not an address and port like 127.0.0.1:8080",
                value.get_ref()
            ),
        )
    })
}

fn cluster_spec(
    source: &Source<'_>,
    raw: &Spanned<RawCluster>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ClusterSpec> {
    let cluster = raw.get_ref();
    let cookie = match (&cluster.cookie, &cluster.cookie_env) {
        (Some(_), Some(var)) => {
            return Err(source.invalid(
                var.span(),
                "cluster.cookie_env",
                "give the cookie either in `cookie` or through `cookie_env`, not both",
            ));
        }
        (Some(cookie), None) => cookie.get_ref().clone(),
        (None, Some(var)) => env(var.get_ref())
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                source.invalid(
                    var.span(),
                    "cluster.cookie_env",
                    format!("the variable `{}` is not set", var.get_ref()),
                )
            })?,
        (None, None) => {
            return Err(source.invalid(
                raw.span(),
                "cluster",
                "a cluster needs a shared secret: set `cookie`, or `cookie_env` to the variable that holds it",
            ));
        }
    };
    if cookie.is_empty() {
        return Err(source.invalid(raw.span(), "cluster.cookie", "the cookie must not be empty"));
    }
    let listen = match &cluster.listen {
        Some(listen) => socket_addr(source, listen, "cluster.listen")?,
        None => DEFAULT_CLUSTER_LISTEN,
    };
    for peer in &cluster.peers {
        if !peer.get_ref().contains(':') {
            return Err(source.invalid(
                peer.span(),
                "cluster.peers",
                format!("`{}` needs a port, like 127.0.0.1:7701", peer.get_ref()),
            ));
        }
    }
    Ok(ClusterSpec {
        node_name: cluster
            .node_name
            .clone()
            .unwrap_or_else(|| "wma".to_string()),
        cookie,
        cookie_inline: cluster.cookie.is_some(),
        listen,
        peers: cluster.peers.iter().map(|p| p.get_ref().clone()).collect(),
        export: cluster.export.iter().map(|e| e.get_ref().clone()).collect(),
    })
}
