//! The supervisor and the runtime it hosts.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use wma_agent::{Progress, ProviderInfo, SubAgentInfo};

use crate::agent::{AgentActor, AgentArgs, AgentConfig, AgentHandle, AgentMsg, AgentShared};
use wma_tools::{DEFAULT_CALL_TIMEOUT, RestartBudget};

use crate::bridge::{BridgeActor, BridgeShared, ToolBridgeHandle, ToolSource};
use crate::delegator::{
    DEFAULT_MAX_DELEGATION_DEPTH, DelegatorActor, DelegatorHandle, DelegatorShared,
};
use crate::error::RuntimeError;
use crate::provider::{
    ProviderActor, ProviderArgs, ProviderHandle, ProviderShared, ProviderSource, prepare,
};
use crate::slot::Slot;
use crate::timeouts::Timeouts;

/// The name [`Runtime::builder`] registers its provider under.
pub const DEFAULT_PROVIDER: &str = "default";

type NamedProgress = Arc<dyn Fn(&str, Progress) + Send + Sync>;

/// Sets up a [`Runtime`].
pub struct RuntimeBuilder {
    providers: Vec<(String, ProviderSource)>,
    progress: NamedProgress,
    sources: Vec<ToolSource>,
    agents: Vec<AgentConfig>,
    remote_agents: Vec<SubAgentInfo>,
    budget: RestartBudget,
    timeouts: Timeouts,
    tool_timeout: Duration,
    max_depth: u32,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RuntimeBuilder {
    /// A builder with no provider yet; add them with [`RuntimeBuilder::provider`].
    pub fn new() -> Self {
        Self {
            providers: Vec::new(),
            progress: Arc::new(|_, _| {}),
            sources: Vec::new(),
            agents: Vec::new(),
            remote_agents: Vec::new(),
            budget: RestartBudget::default(),
            timeouts: Timeouts::default(),
            tool_timeout: DEFAULT_CALL_TIMEOUT,
            max_depth: DEFAULT_MAX_DELEGATION_DEPTH,
        }
    }

    /// Adds a provider under a name agents refer to
    /// ([`AgentConfig::provider`]). Each provider is an actor of its own
    /// with its own hot swap; agents that name the same provider share its
    /// model.
    pub fn provider(mut self, name: impl Into<String>, source: ProviderSource) -> Self {
        self.providers.push((name.into(), source));
        self
    }

    /// Adds a tool source. Sources registered earlier win name clashes.
    pub fn tool_source(mut self, source: ToolSource) -> Self {
        self.sources.push(source);
        self
    }

    /// Adds an agent.
    pub fn agent(mut self, agent: AgentConfig) -> Self {
        self.agents.push(agent);
        self
    }

    /// Declares an agent that another node of the cluster hosts, so local
    /// agents may name it as a sub-agent. It is looked up among the
    /// connected nodes at each delegation (see [`ClusterNode`](crate::ClusterNode)).
    pub fn remote_agent(mut self, name: impl Into<String>, description: impl Into<String>) -> Self {
        self.remote_agents.push(SubAgentInfo {
            name: name.into(),
            description: description.into(),
        });
        self
    }

    /// Sets how deep delegation may nest. Default [`DEFAULT_MAX_DELEGATION_DEPTH`];
    /// 0 turns delegation off.
    pub fn max_delegation_depth(mut self, depth: u32) -> Self {
        self.max_depth = depth;
        self
    }

    /// Sets the restart budget of every child, and of every tool source
    /// (made afresh by its bridge after it panicked): each gets a budget of
    /// this size of its own. One more failure within the window and a child
    /// stays down (its handles then fail with [`RuntimeError::Unavailable`]
    /// instead of hanging, and the other children keep serving), a tool
    /// source is reported given up. Default: [`RestartBudget::default`]
    /// ([`DEFAULT_MAX_RESTARTS`](wma_tools::DEFAULT_MAX_RESTARTS) per
    /// [`DEFAULT_RESTART_WINDOW`](wma_tools::DEFAULT_RESTART_WINDOW)).
    pub fn restart_budget(mut self, budget: RestartBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Sets how long handles wait on the actors.
    pub fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Sets the time limit of one call of a tool source that has no limit
    /// of its own ([`ToolSource::with_call_timeout`]). Default
    /// [`DEFAULT_CALL_TIMEOUT`], the one default of every tool call.
    pub fn tool_timeout(mut self, timeout: Duration) -> Self {
        self.tool_timeout = timeout;
        self
    }

    /// Receives the models' loading progress when the runtime starts.
    pub fn on_progress(mut self, progress: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        self.progress = Arc::new(move |_, p| progress(p));
        self
    }

    /// Like [`RuntimeBuilder::on_progress`], with the provider's name.
    pub fn on_provider_progress(
        mut self,
        progress: impl Fn(&str, Progress) + Send + Sync + 'static,
    ) -> Self {
        self.progress = Arc::new(progress);
        self
    }

    /// Checks that the names fit together: every agent's provider, tool
    /// sources and sub-agents exist, and no two things share a name.
    fn check(&self) -> Result<(), RuntimeError> {
        fn unique<'a>(
            what: &str,
            names: impl Iterator<Item = &'a str>,
        ) -> Result<(), RuntimeError> {
            let mut names: Vec<&str> = names.collect();
            names.sort_unstable();
            match names.windows(2).find(|w| w[0] == w[1]) {
                Some(pair) => Err(RuntimeError::Config(format!(
                    "two {what} are named `{}`",
                    pair[0]
                ))),
                None => Ok(()),
            }
        }
        if self.providers.is_empty() {
            return Err(RuntimeError::Config("there is no provider".to_string()));
        }
        unique(
            "agents",
            self.agents
                .iter()
                .map(|a| a.name.as_str())
                .chain(self.remote_agents.iter().map(|a| a.name.as_str())),
        )?;
        unique("providers", self.providers.iter().map(|p| p.0.as_str()))?;
        unique("tool sources", self.sources.iter().map(|s| s.name()))?;
        for agent in &self.agents {
            if let Some(provider) = &agent.provider
                && !self.providers.iter().any(|p| &p.0 == provider)
            {
                return Err(RuntimeError::Config(format!(
                    "the agent `{}` runs on the provider `{provider}`, which does not exist",
                    agent.name
                )));
            }
            for source in agent.tool_sources.iter().flatten() {
                if !self.sources.iter().any(|s| s.name() == source) {
                    return Err(RuntimeError::Config(format!(
                        "the agent `{}` uses the tool source `{source}`, which does not exist",
                        agent.name
                    )));
                }
            }
            for sub in &agent.profile.sub_agents {
                let known = self.agents.iter().any(|a| a.name == sub.name)
                    || self.remote_agents.iter().any(|a| a.name == sub.name);
                if !known {
                    return Err(RuntimeError::Config(format!(
                        "the agent `{}` delegates to `{}`, which does not exist",
                        agent.name, sub.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Loads the models, then starts the supervisor and its children. A
    /// model that does not load stops the start with [`RuntimeError::Load`].
    pub async fn start(mut self) -> Result<Runtime, RuntimeError> {
        self.check()?;
        // Sub-agents listed by name get the description their own config gives.
        let descriptions: HashMap<String, String> = self
            .agents
            .iter()
            .map(|a| (a.name.clone(), a.description.clone()))
            .chain(
                self.remote_agents
                    .iter()
                    .map(|a| (a.name.clone(), a.description.clone())),
            )
            .collect();
        for agent in &mut self.agents {
            for sub in &mut agent.profile.sub_agents {
                if sub.description.trim().is_empty() {
                    sub.description = descriptions.get(&sub.name).cloned().unwrap_or_default();
                }
            }
        }
        let mut prepared = Vec::new();
        let mut providers = Vec::new();
        for (name, source) in self.providers {
            // One at a time: loading two models at once doubles the peak memory.
            let progress = self.progress.clone();
            let label = name.clone();
            let first = prepare(source.clone(), Arc::new(move |p| progress(&label, p)))
                .await
                .map_err(RuntimeError::Load)?;
            let label = if name == DEFAULT_PROVIDER {
                "provider".to_string()
            } else {
                format!("provider `{name}`")
            };
            providers.push((
                name,
                ProviderHandle {
                    slot: Slot::new(label),
                    shared: ProviderShared::new(source, first.as_ref()),
                    timeouts: self.timeouts,
                },
            ));
            prepared.push(Some(first));
        }
        // One bridge per distinct set of sources; the first has them all.
        let all: Vec<usize> = (0..self.sources.len()).collect();
        let mut bridge_keys: Vec<Vec<usize>> = vec![all];
        let mut links = Vec::new();
        for agent in &self.agents {
            let key: Vec<usize> = match &agent.tool_sources {
                None => (0..self.sources.len()).collect(),
                Some(names) => {
                    let mut key: Vec<usize> = (0..self.sources.len())
                        .filter(|&i| names.iter().any(|n| n == self.sources[i].name()))
                        .collect();
                    key.dedup();
                    key
                }
            };
            let bridge = match bridge_keys.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    bridge_keys.push(key);
                    bridge_keys.len() - 1
                }
            };
            let provider = match &agent.provider {
                Some(name) => providers.iter().position(|p| &p.0 == name).unwrap_or(0),
                None => 0,
            };
            links.push(Link { provider, bridge });
        }
        let bridges: Vec<ToolBridgeHandle> = bridge_keys
            .iter()
            .enumerate()
            .map(|(i, key)| ToolBridgeHandle {
                slot: Slot::new(if i == 0 {
                    "tool bridge".to_string()
                } else {
                    format!("tool bridge {i}")
                }),
                shared: BridgeShared::new(
                    key.iter().map(|&s| self.sources[s].clone()).collect(),
                    self.tool_timeout,
                    &self.budget,
                ),
                timeouts: self.timeouts,
            })
            .collect();
        let agents: Vec<AgentHandle> = self
            .agents
            .into_iter()
            .map(|config| AgentHandle {
                slot: Slot::new(format!("agent `{}`", config.name)),
                shared: AgentShared::new(config),
                timeouts: self.timeouts,
            })
            .collect();
        let delegator = DelegatorHandle {
            slot: Slot::new("delegator"),
            shared: DelegatorShared::new(
                &agents,
                self.remote_agents.iter().map(|a| a.name.clone()).collect(),
                self.max_depth,
                self.timeouts,
            ),
        };
        // The delegator marks a sub-agent's answer untrusted when a tool it
        // can see brings untrusted content.
        delegator.shared.know_tools(
            agents
                .iter()
                .zip(&links)
                .map(|(agent, link)| (agent.name().to_string(), bridges[link.bridge].clone()))
                .collect(),
        );
        let children = Children {
            providers: providers.iter().map(|p| p.1.clone()).collect(),
            bridges: bridges.clone(),
            agents: agents.clone(),
            links: links.clone(),
            delegator: delegator.clone(),
        };
        let (supervisor, _) = Actor::spawn(
            None,
            Supervisor,
            SupervisorArgs {
                children,
                first: prepared,
                budget: self.budget,
            },
        )
        .await
        .map_err(|e| RuntimeError::Spawn {
            actor: "supervisor".to_string(),
            reason: e.to_string(),
        })?;
        Ok(Runtime {
            supervisor,
            providers,
            bridges,
            agents,
            links,
            remote_agents: self.remote_agents,
            max_depth: self.max_depth,
            timeouts: self.timeouts,
        })
    }
}

/// Which provider and bridge an agent uses, by index.
#[derive(Debug, Clone, Copy)]
struct Link {
    provider: usize,
    bridge: usize,
}

/// The hosted agents, their providers and their tools, each a supervised
/// actor. Cheap handles reach them; see the crate docs for the semantics.
pub struct Runtime {
    supervisor: ActorRef<SupervisorMsg>,
    providers: Vec<(String, ProviderHandle)>,
    bridges: Vec<ToolBridgeHandle>,
    agents: Vec<AgentHandle>,
    links: Vec<Link>,
    remote_agents: Vec<SubAgentInfo>,
    max_depth: u32,
    timeouts: Timeouts,
}

impl Runtime {
    /// Starts configuring a runtime around this provider, registered as
    /// [`DEFAULT_PROVIDER`]; [`RuntimeBuilder::provider`] adds more.
    pub fn builder(provider: ProviderSource) -> RuntimeBuilder {
        RuntimeBuilder::new().provider(DEFAULT_PROVIDER, provider)
    }

    /// The first provider's handle (swap, facts, and the [`Provider`](wma_agent::Provider) trait).
    pub fn provider(&self) -> ProviderHandle {
        self.providers[0].1.clone()
    }

    /// The provider registered under `name`.
    pub fn provider_named(&self, name: &str) -> Result<ProviderHandle, RuntimeError> {
        self.providers
            .iter()
            .find(|p| p.0 == name)
            .map(|p| p.1.clone())
            .ok_or_else(|| RuntimeError::Config(format!("there is no provider named `{name}`")))
    }

    /// The providers' names, in the order they were registered.
    pub fn provider_names(&self) -> Vec<String> {
        self.providers.iter().map(|p| p.0.clone()).collect()
    }

    /// The name and handle of the provider an agent runs on.
    pub fn provider_of(&self, agent: &str) -> Result<(String, ProviderHandle), RuntimeError> {
        let i = self.index_of(agent)?;
        let (name, handle) = &self.providers[self.links[i].provider];
        Ok((name.clone(), handle.clone()))
    }

    /// The tool bridge over every registered source (a [`ToolHost`](wma_agent::ToolHost)).
    pub fn tools(&self) -> ToolBridgeHandle {
        self.bridges[0].clone()
    }

    /// The tool bridge an agent's runs list and call tools through.
    pub fn tools_of(&self, agent: &str) -> Result<ToolBridgeHandle, RuntimeError> {
        let i = self.index_of(agent)?;
        Ok(self.bridges[self.links[i].bridge].clone())
    }

    /// The agent with this name.
    pub fn agent(&self, name: &str) -> Result<AgentHandle, RuntimeError> {
        self.index_of(name).map(|i| self.agents[i].clone())
    }

    /// Every local agent, in the order they were added.
    pub fn agents(&self) -> &[AgentHandle] {
        &self.agents
    }

    /// The agents other nodes host that local agents may delegate to.
    pub fn remote_agents(&self) -> &[SubAgentInfo] {
        &self.remote_agents
    }

    /// How deep delegation may nest here (see
    /// [`RuntimeBuilder::max_delegation_depth`]); it also bounds the depth
    /// of a run another node starts here.
    pub fn max_delegation_depth(&self) -> u32 {
        self.max_depth
    }

    fn index_of(&self, name: &str) -> Result<usize, RuntimeError> {
        self.agents
            .iter()
            .position(|a| a.name() == name)
            .ok_or_else(|| RuntimeError::UnknownAgent(name.to_string()))
    }

    /// Facts about the first provider's model.
    pub fn model(&self) -> ProviderInfo {
        wma_agent::Provider::info(&self.providers[0].1)
    }

    /// Stops every actor and waits for them (runs in flight are stopped).
    pub async fn shutdown(self) {
        for agent in &self.agents {
            let _ = agent.stop_all().await;
        }
        let _ = self
            .supervisor
            .call(
                |reply| SupervisorMsg::Shutdown { reply },
                Some(self.timeouts.control),
            )
            .await;
        let _ = self
            .supervisor
            .stop_and_wait(None, Some(self.timeouts.control))
            .await;
    }
}

impl Drop for Runtime {
    /// A runtime dropped without [`Runtime::shutdown`] still stops: its runs
    /// are cancelled and its actors stopped (without waiting for them).
    fn drop(&mut self) {
        for agent in &self.agents {
            agent.shared.cancel_all();
        }
        self.supervisor
            .stop(Some("the runtime was dropped".to_string()));
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("providers", &self.providers)
            .field("agents", &self.agents)
            .finish_non_exhaustive()
    }
}

/// Every child's handle; the supervisor restarts children from these.
#[derive(Clone)]
struct Children {
    providers: Vec<ProviderHandle>,
    bridges: Vec<ToolBridgeHandle>,
    agents: Vec<AgentHandle>,
    links: Vec<Link>,
    delegator: DelegatorHandle,
}

/// Which child an actor id belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Child {
    Provider(usize),
    Tools(usize),
    Agent(usize),
    Delegator,
}

pub(crate) enum SupervisorMsg {
    /// Stop restarting children and stop them.
    Shutdown { reply: RpcReplyPort<()> },
}

impl ractor::Message for SupervisorMsg {}

struct Supervisor;

struct SupervisorArgs {
    children: Children,
    /// The providers, prepared by [`RuntimeBuilder::start`].
    first: Vec<Option<Arc<dyn wma_agent::Provider>>>,
    budget: RestartBudget,
}

struct SupervisorState {
    children: Children,
    budget: RestartBudget,
    running: HashMap<ActorId, Child>,
    /// Each child's own budget, a fresh copy of `budget` once it first fails.
    restarts: HashMap<Child, RestartBudget>,
    shutting_down: bool,
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SupervisorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = SupervisorState {
            children: args.children,
            budget: args.budget,
            running: HashMap::new(),
            restarts: HashMap::new(),
            shutting_down: false,
        };
        for (i, first) in args.first.into_iter().enumerate() {
            state
                .spawn(myself.get_cell(), Child::Provider(i), first)
                .await?;
        }
        for i in 0..state.children.bridges.len() {
            state
                .spawn(myself.get_cell(), Child::Tools(i), None)
                .await?;
        }
        state
            .spawn(myself.get_cell(), Child::Delegator, None)
            .await?;
        for i in 0..state.children.agents.len() {
            state
                .spawn(myself.get_cell(), Child::Agent(i), None)
                .await?;
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Shutdown { reply } => {
                state.shutting_down = true;
                myself
                    .stop_children_and_wait(Some("shutdown".to_string()), None)
                    .await;
                state.mark_all_gone("the runtime was shut down");
                let _ = reply.send(());
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Handles outlive the runtime; tell them at once instead of letting
        // them wait for a restart that will not come.
        state.shutting_down = true;
        state.mark_all_gone("the runtime was shut down");
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, error.to_string()),
            // No child stops on its own while the runtime runs: one that
            // did (killed from outside) is restarted like a failed one.
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.unwrap_or_else(|| "it stopped".to_string()))
            }
            _ => return Ok(()),
        };
        let Some(child) = state.running.remove(&cell.get_id()) else {
            return Ok(());
        };
        if state.shutting_down {
            return Ok(());
        }
        tracing::warn!(child = ?child, reason = %why, "a runtime actor went down");
        if let Err(reason) = state.charge(child) {
            let reason = format!("{reason}; last failure: {why}");
            tracing::error!(child = ?child, %reason, "giving up on a runtime actor");
            state.set_down(child, Down::Gone(reason));
            return Ok(());
        }
        state.set_down(child, Down::Restarting);
        match state.spawn(myself.get_cell(), child, None).await {
            Ok(()) => state.count_restart(child),
            Err(error) => {
                tracing::error!(child = ?child, %error, "a runtime actor did not restart");
                state.set_down(
                    child,
                    Down::Gone(format!(
                        "it crashed ({why}) and could not be restarted: {error}"
                    )),
                );
            }
        }
        Ok(())
    }
}

impl SupervisorState {
    /// Starts one child linked to the supervisor and publishes it.
    async fn spawn(
        &mut self,
        supervisor: ActorCell,
        child: Child,
        first: Option<Arc<dyn wma_agent::Provider>>,
    ) -> Result<(), ActorProcessingErr> {
        let id = match child {
            Child::Provider(i) => {
                let handle = &self.children.providers[i];
                let args = ProviderArgs {
                    shared: handle.shared.clone(),
                    prepared: first,
                };
                let (actor, _) = Actor::spawn_linked(None, ProviderActor, args, supervisor).await?;
                handle.slot.set_live(actor.clone());
                actor.get_id()
            }
            Child::Tools(i) => {
                let handle = &self.children.bridges[i];
                let (actor, _) =
                    Actor::spawn_linked(None, BridgeActor, handle.shared.clone(), supervisor)
                        .await?;
                handle.slot.set_live(actor.clone());
                actor.get_id()
            }
            Child::Delegator => {
                let handle = &self.children.delegator;
                let (actor, _) =
                    Actor::spawn_linked(None, DelegatorActor, handle.shared.clone(), supervisor)
                        .await?;
                handle.slot.set_live(actor.clone());
                actor.get_id()
            }
            Child::Agent(i) => {
                let handle = &self.children.agents[i];
                let link = self.children.links[i];
                let args = AgentArgs {
                    shared: handle.shared.clone(),
                    provider: self.children.providers[link.provider].clone(),
                    tools: self.children.bridges[link.bridge].clone(),
                    delegator: Arc::new(self.children.delegator.clone()),
                };
                let (actor, _): (ActorRef<AgentMsg>, _) =
                    Actor::spawn_linked(None, AgentActor, args, supervisor).await?;
                handle.slot.set_live(actor.clone());
                actor.get_id()
            }
        };
        self.running.insert(id, child);
        Ok(())
    }

    /// Records a restart against the child's budget; `Err` when it is spent.
    fn charge(&mut self, child: Child) -> Result<(), String> {
        let budget = &self.budget;
        self.restarts
            .entry(child)
            .or_insert_with(|| budget.fresh())
            .take("it")
    }

    fn count_restart(&self, child: Child) {
        let counter = match child {
            Child::Provider(i) => &self.children.providers[i].shared.restarts,
            Child::Tools(i) => &self.children.bridges[i].shared.restarts,
            Child::Agent(i) => &self.children.agents[i].shared.restarts,
            Child::Delegator => &self.children.delegator.shared.restarts,
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }

    fn set_down(&self, child: Child, down: Down) {
        match down {
            Down::Restarting => match child {
                Child::Provider(i) => self.children.providers[i].slot.set_starting(),
                Child::Tools(i) => self.children.bridges[i].slot.set_starting(),
                Child::Agent(i) => self.children.agents[i].slot.set_starting(),
                Child::Delegator => self.children.delegator.slot.set_starting(),
            },
            Down::Gone(reason) => match child {
                Child::Provider(i) => self.children.providers[i].slot.set_gone(reason),
                Child::Tools(i) => self.children.bridges[i].slot.set_gone(reason),
                Child::Agent(i) => self.children.agents[i].slot.set_gone(reason),
                Child::Delegator => self.children.delegator.slot.set_gone(reason),
            },
        }
    }

    fn mark_all_gone(&self, reason: &str) {
        let gone = || Down::Gone(reason.to_string());
        for i in 0..self.children.providers.len() {
            self.set_down(Child::Provider(i), gone());
        }
        for i in 0..self.children.bridges.len() {
            self.set_down(Child::Tools(i), gone());
        }
        self.set_down(Child::Delegator, gone());
        for i in 0..self.children.agents.len() {
            self.set_down(Child::Agent(i), gone());
        }
    }
}

/// A child that is not serving.
enum Down {
    /// Calls wait for its successor.
    Restarting,
    /// Calls fail with this reason.
    Gone(String),
}
