//! Starting what a config describes: the runtime with its providers, tool
//! sources and agents, and the cluster node.

use std::sync::Arc;

use wma_agent::{LocalLoopOptions, Progress, ToolHost};
use wma_agent::{scripted::ScriptedProvider, scripted::ScriptedReply};
use wma_provider_openai::OpenAiProvider;
use wma_provider_ort::OrtProvider;
use wma_runtime::{
    AgentConfig, ClusterNode, ClusterOptions, ProviderSource, Runtime, RuntimeBuilder,
    RuntimeError, ToolSource,
};
use wma_tools::{
    BrowserOptions, McpServer, McpServerOptions, PageOptions, PageTool, ToolSet, WebMcpSource,
};

use crate::builtin::builtin_tools;
use crate::demo_shop::Shop;
use crate::spec::{Config, ProviderSpec, ToolSourceConfig, ToolSourceSpec};

/// Each tool source's set, by source name.
type ToolSets = Vec<(String, Arc<ToolSet>)>;

/// Receives a provider's loading progress, with the provider's name.
pub type ProgressCallback = Arc<dyn Fn(&str, Progress) + Send + Sync>;

/// How to start a config.
#[derive(Clone, Default)]
pub struct StartOptions {
    /// Receives each provider's loading progress.
    pub progress: Option<ProgressCallback>,
    /// Start the `[cluster]` node too (when the config has one). Default false.
    pub cluster: bool,
}

/// What a started config is made of.
pub struct Hosted {
    /// The runtime with the config's agents.
    pub runtime: Runtime,
    /// The cluster node, when asked for and configured.
    pub cluster: Option<ClusterNode>,
    /// Each `demo-shop` source's shop, by source name, to read its cart.
    pub shops: Vec<(String, Shop)>,
    /// Each tool source's set, by source name, for its health
    /// ([`ToolSet::health`]: state and restarts).
    pub tool_sets: Vec<(String, Arc<ToolSet>)>,
}

impl Hosted {
    /// Stops the cluster node and the runtime.
    pub async fn shutdown(self) {
        if let Some(cluster) = &self.cluster {
            cluster.shutdown().await;
        }
        self.runtime.shutdown().await;
    }

    /// The first of `sources` (in the order they are hosted) that could not
    /// start, with the reason. Listing a source's tools starts it, so a
    /// source not yet started is tried here: a run that needs a source that
    /// is down would answer without its tools and look like success.
    pub async fn first_down(&self, sources: &[String]) -> Option<(String, String)> {
        for (source, set) in &self.tool_sets {
            if !sources.contains(source) {
                continue;
            }
            set.list_tools().await;
            for health in set.health() {
                if let wma_tools::SourceState::Down { reason }
                | wma_tools::SourceState::GaveUp { reason } = health.state
                {
                    return Some((source.clone(), reason));
                }
            }
        }
        None
    }

    /// Whether every tool of `sources` says it is read-only. A source not
    /// hosted here cannot tell, and is not.
    pub async fn all_read_only(&self, sources: &[String]) -> bool {
        for source in sources {
            let Some((_, set)) = self.tool_sets.iter().find(|(s, _)| s == source) else {
                return false;
            };
            if !set
                .list_tools()
                .await
                .iter()
                .all(|t| t.annotations.read_only)
            {
                return false;
            }
        }
        true
    }
}

impl std::fmt::Debug for Hosted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hosted")
            .field("runtime", &self.runtime)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

/// A runtime source for a provider of the config.
pub fn provider_source(spec: &ProviderSpec) -> ProviderSource {
    match spec {
        ProviderSpec::Onnx(options) => {
            let options = options.clone();
            ProviderSource::try_new(move || OrtProvider::new(options.clone()))
        }
        ProviderSpec::Scripted(script) => {
            // One provider for the actor's whole life, so that a restart
            // of the actor does not replay the replies of the runs going
            // on; each run gets its own pass over them, so that a host
            // answers every run, not only its first.
            let replies = script.replies.iter().map(|r| {
                let reply = ScriptedReply::text(r.clone());
                if script.delay.is_zero() {
                    reply
                } else {
                    reply.delayed(script.delay)
                }
            });
            let provider = ScriptedProvider::new(replies)
                .with_model(script.model.clone())
                .with_tools_inline(script.tools_inline)
                .pass_per_run();
            ProviderSource::shared(Arc::new(provider))
        }
        ProviderSpec::Openai(options) => {
            // A fresh client each time: a restart after the server died
            // asks the server again what it serves.
            let options = options.clone();
            ProviderSource::try_new(move || OpenAiProvider::new(options.clone()))
        }
    }
}

/// A config source as the runtime hosts it: one [`ToolSet`] holding the
/// source under its policy (allow, deny, untrusted, call limit), shared by
/// the bridge across its restarts. The set rebuilds the source after a
/// panic, and MCP servers and WebMCP pages reopen their process or browser
/// after it died, each within a restart budget that [`ToolSet::health`]
/// reports; the set also times each call by the source's own
/// `call_timeout_secs` (the bridge only relays).
fn tool_source(
    config: &ToolSourceConfig,
    shops: &mut Vec<(String, Shop)>,
) -> (ToolSource, Arc<ToolSet>) {
    let name = config.name.clone();
    let policy = config.policy.clone();
    let mut set = ToolSet::new();
    match &config.spec {
        ToolSourceSpec::DemoShop => {
            let shop = Shop::new();
            shops.push((name.clone(), shop.clone()));
            set.add_built(&name, move || shop.tools(), policy.clone());
        }
        ToolSourceSpec::Native { builtins } => {
            let builtins = builtins.clone();
            set.add_built(&name, move || builtin_tools(&builtins), policy.clone());
        }
        ToolSourceSpec::McpStdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut options = McpServerOptions::stdio(name.clone(), command.clone(), args.clone());
            for (key, value) in env {
                options = options.env(key.clone(), value.clone());
            }
            if let Some(cwd) = cwd {
                options = options.current_dir(cwd.clone());
            }
            set.add_built(
                &name,
                move || McpServer::lazy(options.clone()),
                policy.clone(),
            );
        }
        ToolSourceSpec::McpHttp { url } => {
            let options = McpServerOptions::http(name.clone(), url.clone());
            set.add_built(
                &name,
                move || McpServer::lazy(options.clone()),
                policy.clone(),
            );
        }
        ToolSourceSpec::WebMcp { .. } => {
            let spec = config.spec.clone();
            set.add_built(
                &name,
                move || webmcp_source(&spec).expect("the spec is a webmcp source"),
                policy.clone(),
            );
        }
    }
    let set = Arc::new(set);
    let source = ToolSource::shared(name, set.clone()).with_call_timeout(policy.call_timeout);
    (source, set)
}

/// A `webmcp` source's page as the host opens it: one place for serving and
/// for `wma check --pages`. Its calls are timed by the set that holds it.
fn webmcp_source(spec: &ToolSourceSpec) -> Option<WebMcpSource> {
    let ToolSourceSpec::WebMcp {
        url,
        headless,
        browser,
        debugging_tools,
    } = spec
    else {
        return None;
    };
    let browser_options = BrowserOptions {
        executable: browser.clone(),
        headless: *headless,
        ..BrowserOptions::default()
    };
    let page_options = PageOptions {
        debugging_tools: *debugging_tools,
        ..PageOptions::default()
    };
    Some(WebMcpSource::with_page_options(
        url.clone(),
        browser_options,
        page_options,
    ))
}

/// A page's tool in a line, as `wma check --pages` lists the tools
/// [`Config::page_tools`] finds: its name, what kind of tool it is, its
/// annotations, and why it is not offered when it is not.
pub fn page_tool_line(tool: &PageTool) -> String {
    let mut notes: Vec<String> = Vec::new();
    if tool.declarative {
        notes.push(if tool.autosubmit {
            "form, autosubmit".to_string()
        } else {
            "form, waits for the person's submit".to_string()
        });
    }
    if let Some(frame) = &tool.frame_url {
        notes.push(format!("in frame {frame}"));
    }
    let annotations = &tool.definition.annotations;
    for (on, name) in [
        (annotations.read_only, "read-only"),
        (annotations.consequential, "consequential"),
        (annotations.untrusted_content, "untrusted content"),
        (tool.debugging, "debugging"),
    ] {
        if on {
            notes.push(name.to_string());
        }
    }
    if !tool.offered {
        notes.push("not offered".to_string());
    }
    if notes.is_empty() {
        tool.definition.name.clone()
    } else {
        format!("{} ({})", tool.definition.name, notes.join("; "))
    }
}

impl Config {
    /// Opens the page of every `webmcp` source as the host would, waits for
    /// its tools, and returns them as the page registered them (frame,
    /// form, autosubmit, debugging, offered), by source name; a page that
    /// cannot be opened gives the reason. The browsers are closed before it
    /// returns.
    pub async fn page_tools(&self) -> Vec<(String, Result<Vec<PageTool>, String>)> {
        let mut pages = Vec::new();
        for source in &self.tools {
            let Some(page) = webmcp_source(&source.spec) else {
                continue;
            };
            let tools = match page.page().await {
                Ok(opened) => {
                    // Listing waits for the tool set to settle, as a step does.
                    opened.list_tools().await;
                    Ok(opened.page_tools())
                }
                Err(error) => Err(error.to_string()),
            };
            if let Some(browser) = page.browser().await {
                drop(page);
                browser.close().await;
            }
            pages.push((source.name.clone(), tools));
        }
        pages
    }

    /// Starts every tool source as a run would (MCP servers, built-ins and
    /// shops here; pages through [`Config::page_tools`]), lists its tools
    /// and returns their names by source name, or why the source could not
    /// start. Nothing else starts: no model is loaded. The sets are dropped
    /// before it returns, which ends their servers' sessions.
    pub async fn probe_sources(&self) -> Vec<(String, Result<Vec<String>, String>)> {
        let mut probed = Vec::new();
        let mut pages = self.page_tools().await.into_iter();
        for source in &self.tools {
            if matches!(source.spec, ToolSourceSpec::WebMcp { .. }) {
                let result = pages
                    .next()
                    .map(|(_, tools)| tools)
                    .unwrap_or_else(|| Err("the page was not opened".to_string()));
                probed.push((
                    source.name.clone(),
                    result.map(|tools| tools.into_iter().map(|t| t.definition.name).collect()),
                ));
                continue;
            }
            let (_, set) = tool_source(source, &mut Vec::new());
            let tools = set.list_tools().await;
            let down = set
                .health()
                .into_iter()
                .find_map(|health| match health.state {
                    wma_tools::SourceState::Down { reason }
                    | wma_tools::SourceState::GaveUp { reason } => Some(reason),
                    _ => None,
                });
            let result = match down {
                Some(reason) => Err(reason),
                None => Ok(tools.into_iter().map(|t| t.name).collect()),
            };
            probed.push((source.name.clone(), result));
        }
        probed
    }

    /// The runtime builder for this config, with the shops of its
    /// `demo-shop` sources. Only providers some agent uses are registered,
    /// so a config may list models to swap to without loading them.
    pub fn runtime_builder(&self) -> (RuntimeBuilder, Vec<(String, Shop)>) {
        let (builder, shops, _) = self.runtime_parts();
        (builder, shops)
    }

    /// The runtime builder, the shops, and each tool source's set (for its
    /// health).
    fn runtime_parts(&self) -> (RuntimeBuilder, Vec<(String, Shop)>, ToolSets) {
        let mut builder = RuntimeBuilder::new().max_delegation_depth(self.max_delegation_depth);
        for provider in &self.providers {
            if self.agents.iter().any(|a| a.provider == provider.name) {
                builder = builder.provider(provider.name.clone(), provider_source(&provider.spec));
            }
        }
        let mut shops = Vec::new();
        let mut sets = Vec::new();
        for source in &self.tools {
            let (tool_source, set) = tool_source(source, &mut shops);
            builder = builder.tool_source(tool_source);
            sets.push((source.name.clone(), set));
        }
        for agent in &self.agents {
            let options = LocalLoopOptions {
                max_steps: agent.max_steps,
                step_timeout: agent.step_timeout,
                max_tools: agent.max_tools,
                instructions: agent.instructions.clone(),
                constraints: agent.constraints,
                policy: agent.policy.clone(),
                approval: agent.approval.clone(),
                ..LocalLoopOptions::default()
            };
            builder = builder.agent(
                AgentConfig::new(agent.name.clone())
                    .with_description(agent.description.clone())
                    .with_provider(agent.provider.clone())
                    .with_tool_sources(agent.tools.clone())
                    .with_sub_agents(agent.sub_agents.clone())
                    .with_options(options)
                    .with_max_concurrent_runs(agent.max_concurrent_runs),
            );
        }
        for remote in &self.remote_agents {
            builder = builder.remote_agent(remote.name.clone(), remote.description.clone());
        }
        (builder, shops, sets)
    }

    /// Loads the models and starts the runtime (and the cluster node, when asked).
    pub async fn start(&self, options: StartOptions) -> Result<Hosted, RuntimeError> {
        // Said where every command that hosts the config passes, after the
        // log is set up (the config is read before it is).
        for note in &self.notes {
            tracing::warn!("{note}");
        }
        let (mut builder, shops, tool_sets) = self.runtime_parts();
        if let Some(progress) = options.progress.clone() {
            builder = builder.on_provider_progress(move |name, p| progress(name, p));
        }
        let runtime = builder.start().await?;
        let cluster = match (&self.cluster, options.cluster) {
            (Some(spec), true) => {
                let node = ClusterNode::start(
                    ClusterOptions {
                        node_name: spec.node_name.clone(),
                        cookie: spec.cookie.clone(),
                        listen: spec.listen,
                        export: spec.export.clone(),
                    },
                    &runtime,
                )
                .await?;
                for peer in spec.peers.clone() {
                    // Dialled again, with backoff, whenever it cannot be
                    // reached (it may start later) or goes away.
                    node.keep_connected(peer);
                }
                Some(node)
            }
            _ => None,
        };
        Ok(Hosted {
            runtime,
            cluster,
            shops,
            tool_sets,
        })
    }
}
