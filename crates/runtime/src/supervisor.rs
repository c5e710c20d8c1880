//! The supervisor and the runtime it hosts.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use wma_agent::{Progress, ProgressFn, ProviderInfo};

use crate::agent::{AgentActor, AgentArgs, AgentConfig, AgentHandle, AgentMsg, AgentShared};
use crate::bridge::{
    BridgeActor, BridgeShared, DEFAULT_TOOL_TIMEOUT, ToolBridgeHandle, ToolSource,
};
use crate::error::RuntimeError;
use crate::provider::{
    DEFAULT_SWAP_TIMEOUT, ProviderActor, ProviderArgs, ProviderHandle, ProviderShared,
    ProviderSource, prepare,
};
use crate::slot::Slot;

/// Restarts of one child the supervisor allows within [`DEFAULT_RESTART_WINDOW`].
/// One more failure in that window and the child stays down: its handles
/// then fail with [`RuntimeError::Unavailable`] instead of hanging, and the
/// other children keep serving.
pub const DEFAULT_MAX_RESTARTS: u32 = 5;

/// The window [`DEFAULT_MAX_RESTARTS`] counts in.
pub const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(60);

/// How often a child may be restarted before the supervisor gives up on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartBudget {
    /// Restarts allowed within `window`. Default [`DEFAULT_MAX_RESTARTS`].
    pub max_restarts: u32,
    /// Default [`DEFAULT_RESTART_WINDOW`].
    pub window: Duration,
}

impl Default for RestartBudget {
    fn default() -> Self {
        Self {
            max_restarts: DEFAULT_MAX_RESTARTS,
            window: DEFAULT_RESTART_WINDOW,
        }
    }
}

/// How long handles wait on the actors. Every call has a limit, so a
/// stuck actor shows up as an error, never as a hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Quick requests (start a run, stop, facts). Default 5 s.
    pub control: Duration,
    /// One generation. Default 10 min; the loop's `step_timeout` (60 s by
    /// default) normally ends a generation long before.
    pub generate: Duration,
    /// Preparing the model a swap loads. Default 15 min.
    pub swap: Duration,
    /// How long a call waits for a crashed actor to be restarted (which, for
    /// the provider, includes loading its model again). Default 60 s.
    pub restart_wait: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            control: Duration::from_secs(5),
            generate: Duration::from_secs(10 * 60),
            swap: DEFAULT_SWAP_TIMEOUT,
            restart_wait: Duration::from_secs(60),
        }
    }
}

/// Sets up a [`Runtime`].
pub struct RuntimeBuilder {
    provider: ProviderSource,
    progress: ProgressFn,
    sources: Vec<ToolSource>,
    agents: Vec<AgentConfig>,
    budget: RestartBudget,
    timeouts: Timeouts,
    tool_timeout: Duration,
}

impl RuntimeBuilder {
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

    /// Sets the restart budget of every child.
    pub fn restart_budget(mut self, budget: RestartBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Sets how long handles wait on the actors.
    pub fn timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Sets the time limit of one tool call. Default [`DEFAULT_TOOL_TIMEOUT`].
    pub fn tool_timeout(mut self, timeout: Duration) -> Self {
        self.tool_timeout = timeout;
        self
    }

    /// Receives the first model's loading progress.
    pub fn on_progress(mut self, progress: impl Fn(Progress) + Send + Sync + 'static) -> Self {
        self.progress = Arc::new(progress);
        self
    }

    /// Loads the model, then starts the supervisor and its children. A
    /// model that does not load stops the start with [`RuntimeError::Load`].
    pub async fn start(self) -> Result<Runtime, RuntimeError> {
        let mut names: Vec<&str> = self.agents.iter().map(|a| a.name.as_str()).collect();
        names.sort_unstable();
        if let Some(pair) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(RuntimeError::Config(format!(
                "two agents are named `{}`",
                pair[0]
            )));
        }
        let first = prepare(self.provider.clone(), self.progress)
            .await
            .map_err(RuntimeError::Load)?;
        let provider = ProviderHandle {
            slot: Slot::new("provider"),
            shared: ProviderShared::new(self.provider, first.as_ref()),
            timeouts: self.timeouts,
        };
        let tools = ToolBridgeHandle {
            slot: Slot::new("tool bridge"),
            shared: BridgeShared::new(self.sources, self.tool_timeout),
            timeouts: self.timeouts,
        };
        let agents: Vec<AgentHandle> = self
            .agents
            .into_iter()
            .map(|config| AgentHandle {
                slot: Slot::new(format!("agent `{}`", config.name)),
                shared: AgentShared::new(config),
                timeouts: self.timeouts,
            })
            .collect();
        let children = Children {
            provider: provider.clone(),
            tools: tools.clone(),
            agents: agents.clone(),
        };
        let (supervisor, _) = Actor::spawn(
            None,
            Supervisor,
            SupervisorArgs {
                children,
                first: Some(first),
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
            provider,
            tools,
            agents,
            timeouts: self.timeouts,
        })
    }
}

/// The hosted agents, their provider and their tools, each a supervised
/// actor. Cheap handles reach them; see the crate docs for the semantics.
pub struct Runtime {
    supervisor: ActorRef<SupervisorMsg>,
    provider: ProviderHandle,
    tools: ToolBridgeHandle,
    agents: Vec<AgentHandle>,
    timeouts: Timeouts,
}

impl Runtime {
    /// Starts configuring a runtime around this provider.
    pub fn builder(provider: ProviderSource) -> RuntimeBuilder {
        RuntimeBuilder {
            provider,
            progress: Arc::new(|_| {}),
            sources: Vec::new(),
            agents: Vec::new(),
            budget: RestartBudget::default(),
            timeouts: Timeouts::default(),
            tool_timeout: DEFAULT_TOOL_TIMEOUT,
        }
    }

    /// The provider actor's handle (swap, facts, and the [`Provider`](wma_agent::Provider) trait).
    pub fn provider(&self) -> ProviderHandle {
        self.provider.clone()
    }

    /// The tool bridge's handle (a [`ToolHost`](wma_agent::ToolHost)).
    pub fn tools(&self) -> ToolBridgeHandle {
        self.tools.clone()
    }

    /// The agent with this name.
    pub fn agent(&self, name: &str) -> Result<AgentHandle, RuntimeError> {
        self.agents
            .iter()
            .find(|a| a.name() == name)
            .cloned()
            .ok_or_else(|| RuntimeError::UnknownAgent(name.to_string()))
    }

    /// Facts about the model serving now.
    pub fn model(&self) -> ProviderInfo {
        wma_agent::Provider::info(&self.provider)
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
            .field("provider", &self.provider)
            .field("tools", &self.tools)
            .field("agents", &self.agents)
            .finish_non_exhaustive()
    }
}

/// Every child's handle; the supervisor restarts children from these.
#[derive(Clone)]
struct Children {
    provider: ProviderHandle,
    tools: ToolBridgeHandle,
    agents: Vec<AgentHandle>,
}

/// Which child an actor id belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Child {
    Provider,
    Tools,
    Agent(usize),
}

pub(crate) enum SupervisorMsg {
    /// Stop restarting children and stop them.
    Shutdown { reply: RpcReplyPort<()> },
}

struct Supervisor;

struct SupervisorArgs {
    children: Children,
    /// The first provider, prepared by [`RuntimeBuilder::start`].
    first: Option<Arc<dyn wma_agent::Provider>>,
    budget: RestartBudget,
}

struct SupervisorState {
    children: Children,
    budget: RestartBudget,
    running: HashMap<ActorId, Child>,
    /// Recent restart times per child, for the budget.
    restarts: HashMap<Child, VecDeque<Instant>>,
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
        state
            .spawn(myself.get_cell(), Child::Provider, args.first)
            .await?;
        state.spawn(myself.get_cell(), Child::Tools, None).await?;
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
            Child::Provider => {
                let handle = &self.children.provider;
                let args = ProviderArgs {
                    shared: handle.shared.clone(),
                    prepared: first,
                };
                let (actor, _) = Actor::spawn_linked(None, ProviderActor, args, supervisor).await?;
                handle.slot.set_live(actor.clone());
                actor.get_id()
            }
            Child::Tools => {
                let handle = &self.children.tools;
                let (actor, _) =
                    Actor::spawn_linked(None, BridgeActor, handle.shared.clone(), supervisor)
                        .await?;
                handle.slot.set_live(actor.clone());
                actor.get_id()
            }
            Child::Agent(i) => {
                let handle = &self.children.agents[i];
                let args = AgentArgs {
                    shared: handle.shared.clone(),
                    provider: self.children.provider.clone(),
                    tools: self.children.tools.clone(),
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

    /// Records a restart against the budget; `Err` when it is spent.
    fn charge(&mut self, child: Child) -> Result<(), String> {
        let now = Instant::now();
        let window = self.budget.window;
        let recent = self.restarts.entry(child).or_default();
        while recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            recent.pop_front();
        }
        if recent.len() >= self.budget.max_restarts as usize {
            return Err(format!(
                "it failed {} times within {} s, more than its restart budget allows",
                recent.len() + 1,
                window.as_secs()
            ));
        }
        recent.push_back(now);
        Ok(())
    }

    fn count_restart(&self, child: Child) {
        let counter = match child {
            Child::Provider => &self.children.provider.shared.restarts,
            Child::Tools => &self.children.tools.shared.restarts,
            Child::Agent(i) => &self.children.agents[i].shared.restarts,
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }

    fn set_down(&self, child: Child, down: Down) {
        match down {
            Down::Restarting => match child {
                Child::Provider => self.children.provider.slot.set_starting(),
                Child::Tools => self.children.tools.slot.set_starting(),
                Child::Agent(i) => self.children.agents[i].slot.set_starting(),
            },
            Down::Gone(reason) => match child {
                Child::Provider => self.children.provider.slot.set_gone(reason),
                Child::Tools => self.children.tools.slot.set_gone(reason),
                Child::Agent(i) => self.children.agents[i].slot.set_gone(reason),
            },
        }
    }

    fn mark_all_gone(&self, reason: &str) {
        self.set_down(Child::Provider, Down::Gone(reason.to_string()));
        self.set_down(Child::Tools, Down::Gone(reason.to_string()));
        for i in 0..self.children.agents.len() {
            self.set_down(Child::Agent(i), Down::Gone(reason.to_string()));
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
