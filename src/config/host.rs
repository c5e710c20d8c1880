//! Starting what a config describes: the runtime with its providers, tool
//! sources and agents, and the cluster node.

use std::sync::Arc;
use std::time::Duration;

use wma_agent::{LocalLoopOptions, Progress};
use wma_provider_ort::OrtProvider;
use wma_runtime::{
    AgentConfig, ClusterNode, ClusterOptions, ProviderSource, Runtime, RuntimeBuilder,
    RuntimeError, ToolSource,
};
use wma_testkit::{ScriptedProvider, ScriptedReply};
use wma_tools::{
    Browser, BrowserOptions, McpServer, McpServerOptions, SourceOptions, ToolSet, WebMcpPage,
};

use super::builtin::builtin_tools;
use super::lazy::Lazy;
use super::{Config, ProviderSpec, ToolSourceConfig, ToolSourceSpec};
use crate::demo_shop::Shop;

/// How long a node keeps trying to reach a peer that is not up yet, between tries.
const PEER_RETRY: Duration = Duration::from_secs(2);

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
}

impl Hosted {
    /// Stops the cluster node and the runtime.
    pub async fn shutdown(self) {
        if let Some(cluster) = &self.cluster {
            cluster.shutdown().await;
        }
        self.runtime.shutdown().await;
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
            // One script for the provider's whole life: a restart must not
            // replay replies already given.
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
                .with_tools_inline(script.tools_inline);
            ProviderSource::shared(Arc::new(provider))
        }
    }
}

/// The source's host with its policy (allow, deny, untrusted, call limit).
fn with_policy<H: wma_agent::ToolHost + 'static>(
    name: &str,
    host: H,
    policy: &SourceOptions,
) -> ToolSet {
    let mut set = ToolSet::new();
    set.add_with(name, host, policy.clone());
    set
}

fn tool_source(config: &ToolSourceConfig, shops: &mut Vec<(String, Shop)>) -> ToolSource {
    let name = config.name.clone();
    let policy = config.policy.clone();
    match &config.spec {
        ToolSourceSpec::DemoShop => {
            let shop = Shop::new();
            shops.push((name.clone(), shop.clone()));
            ToolSource::new(name.clone(), move || {
                with_policy(&name, shop.tools(), &policy)
            })
        }
        ToolSourceSpec::Native { builtins } => {
            let builtins = builtins.clone();
            ToolSource::new(name.clone(), move || {
                with_policy(&name, builtin_tools(&builtins), &policy)
            })
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
            mcp(name, options, policy)
        }
        ToolSourceSpec::McpHttp { url } => mcp(
            name.clone(),
            McpServerOptions::http(name, url.clone()),
            policy,
        ),
        ToolSourceSpec::WebMcp {
            url,
            headless,
            browser,
        } => {
            let options = BrowserOptions {
                executable: browser.clone(),
                headless: *headless,
                ..BrowserOptions::default()
            };
            let url = url.clone();
            ToolSource::new(name.clone(), move || {
                let options = options.clone();
                let url = url.clone();
                let page = Lazy::new(name.clone(), move || {
                    let options = options.clone();
                    let url = url.clone();
                    async move {
                        let browser = Browser::launch(options).await.map_err(|e| e.to_string())?;
                        // The page keeps its browser running.
                        let page: WebMcpPage =
                            browser.open(&url).await.map_err(|e| e.to_string())?;
                        Ok(page)
                    }
                });
                with_policy(&name, page, &policy)
            })
        }
    }
}

fn mcp(name: String, options: McpServerOptions, policy: SourceOptions) -> ToolSource {
    ToolSource::new(name.clone(), move || {
        let options = options.clone();
        let server = Lazy::new(name.clone(), move || {
            let options = options.clone();
            async move { McpServer::connect(options).await.map_err(|e| e.to_string()) }
        });
        with_policy(&name, server, &policy)
    })
}

impl Config {
    /// The runtime builder for this config, with the shops of its
    /// `demo-shop` sources. Only providers some agent uses are registered,
    /// so a config may list models to swap to without loading them.
    pub fn runtime_builder(&self) -> (RuntimeBuilder, Vec<(String, Shop)>) {
        let mut builder = RuntimeBuilder::new().max_delegation_depth(self.max_delegation_depth);
        for provider in &self.providers {
            if self.agents.iter().any(|a| a.provider == provider.name) {
                builder = builder.provider(provider.name.clone(), provider_source(&provider.spec));
            }
        }
        let mut shops = Vec::new();
        for source in &self.tools {
            builder = builder.tool_source(tool_source(source, &mut shops));
        }
        for agent in &self.agents {
            let options = LocalLoopOptions {
                max_steps: agent.max_steps,
                step_timeout: agent.step_timeout,
                max_tools: agent.max_tools,
                instructions: agent.instructions.clone(),
                constraints: agent.constraints,
                policy: agent.policy.clone(),
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
        (builder, shops)
    }

    /// Loads the models and starts the runtime (and the cluster node, when asked).
    pub async fn start(&self, options: StartOptions) -> Result<Hosted, RuntimeError> {
        let (mut builder, shops) = self.runtime_builder();
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
                    let node = node.clone();
                    // Peers may start later than this node: keep trying.
                    tokio::spawn(async move {
                        while let Err(error) = node.connect(&peer).await {
                            tracing::info!(%peer, %error, "cluster peer not reachable yet");
                            tokio::time::sleep(PEER_RETRY).await;
                        }
                    });
                }
                Some(node)
            }
            _ => None,
        };
        Ok(Hosted {
            runtime,
            cluster,
            shops,
        })
    }
}
