//! What the endpoints serve: the config's agents, their providers and
//! tool sources, and the store, as handles onto a started runtime.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use wma_config::{Config, Hosted};
use wma_runtime::{AgentHandle, ProviderHandle, Runtime, RuntimeError, ToolBridgeHandle};

/// One agent as the API reaches it.
#[derive(Clone)]
pub(crate) struct Agent {
    pub(crate) handle: AgentHandle,
    /// Its provider's name in the config, and the provider actor.
    pub(crate) provider: (String, ProviderHandle),
    /// The tool bridge its runs use (for the health check).
    pub(crate) tools: Option<ToolBridgeHandle>,
}

/// What the handlers share.
pub struct Api {
    pub(crate) config: Config,
    pub(crate) agents: Vec<Agent>,
    /// Every provider actor of the runtime, by name (for the health check).
    pub(crate) providers: Vec<(String, ProviderHandle)>,
    /// Each config tool source's set, by name, for its state and restarts
    /// in the health check.
    pub(crate) tool_sets: Vec<(String, Arc<wma_tools::ToolSet>)>,
    pub(crate) started: Instant,
    /// Where sessions, runs' logs and pending approvals are kept; without
    /// one, runs stream from memory only and `/v1/sessions` answers 503.
    pub(crate) store: Option<wma_store::Store>,
    /// The config provider each provider actor serves since a swap, by the
    /// actor's name; an actor not here serves its own. `GET /v1/agents`
    /// shows it, so that a page can tell which one to offer as current.
    pub(crate) loaded: Mutex<HashMap<String, String>>,
}

impl Api {
    /// The API over a started config's runtime. It keeps handles, not the
    /// runtime, so the caller shuts the runtime down when the server ends.
    pub fn new(config: Config, runtime: &Runtime) -> Result<Arc<Self>, RuntimeError> {
        let mut agents = Vec::new();
        for handle in runtime.agents() {
            agents.push(Agent {
                provider: runtime.provider_of(handle.name())?,
                tools: runtime.tools_of(handle.name()).ok(),
                handle: handle.clone(),
            });
        }
        let mut providers = Vec::new();
        for name in runtime.provider_names() {
            providers.push((name.clone(), runtime.provider_named(&name)?));
        }
        Ok(Arc::new(Self {
            config,
            agents,
            providers,
            tool_sets: Vec::new(),
            started: Instant::now(),
            store: None,
            loaded: Mutex::default(),
        }))
    }

    /// The same API keeping its sessions, runs and pending approvals in
    /// `store` (call it before the server starts, while the API is not
    /// shared yet; a shared one is returned unchanged).
    pub fn with_store(mut api: Arc<Self>, store: wma_store::Store) -> Arc<Self> {
        if let Some(inner) = Arc::get_mut(&mut api) {
            inner.store = Some(store);
        }
        api
    }

    /// The store, when the API has one.
    pub fn store(&self) -> Option<&wma_store::Store> {
        self.store.as_ref()
    }

    /// The API over a started config, its tool sources' health included.
    pub fn hosted(config: Config, hosted: &Hosted) -> Result<Arc<Self>, RuntimeError> {
        let mut api = Self::new(config, &hosted.runtime)?;
        if let Some(api) = Arc::get_mut(&mut api) {
            api.tool_sets = hosted.tool_sets.clone();
        }
        Ok(api)
    }

    pub(crate) fn agent(&self, name: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.handle.name() == name)
    }

    /// The config provider whose model the provider actor `actor` serves.
    pub(crate) fn loaded_in(&self, actor: &str) -> String {
        // The map holds plain names; a panic elsewhere leaves it usable.
        let loaded = self.loaded.lock();
        loaded
            .get(actor)
            .cloned()
            .unwrap_or_else(|| actor.to_string())
    }
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("agents", &self.agents.len())
            .finish_non_exhaustive()
    }
}
