//! The tool bridge actor: every tool source behind one [`ToolHost`].
//!
//! The sources sit in one [`ToolSet`], the one path of a tool call
//! (allow and deny, validation, time limit and panic guard, sources made
//! afresh within the restart budget). The actor adds nothing to that path:
//! it hops each request onto a task of its own, relays the answer, and is
//! restarted by the supervisor when the actor itself fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};
use wma_agent::{CallContext, PageContext, ToolDefinition, ToolError, ToolErrorCode, ToolHost};
use wma_tools::{CANCEL_GRACE, LIST_TIMEOUT, RestartBudget, SourceHealth, SourceOptions, ToolSet};

use crate::slot::Slot;
use crate::timeouts::Timeouts;

type BuildHost = dyn Fn() -> Arc<dyn ToolHost> + Send + Sync;

/// A named source of tools and how to make it. The bridge's [`ToolSet`]
/// makes it when the runtime starts, and again after it panicked, within
/// the runtime's [`RestartBudget`](crate::RuntimeBuilder::restart_budget).
///
/// Each call of the source is limited by its own
/// [`call_timeout`](ToolSource::with_call_timeout), or else by the runtime's
/// [`tool_timeout`](crate::RuntimeBuilder::tool_timeout); nothing else cuts
/// it shorter.
#[derive(Clone)]
pub struct ToolSource {
    name: String,
    build: Arc<BuildHost>,
    call_timeout: Option<Duration>,
}

impl ToolSource {
    /// A source that makes a new host each time it is made afresh.
    pub fn new<H, F>(name: impl Into<String>, build: F) -> Self
    where
        H: ToolHost + 'static,
        F: Fn() -> H + Send + Sync + 'static,
    {
        Self {
            name: name.into(),
            build: Arc::new(move || Arc::new(build()) as Arc<dyn ToolHost>),
            call_timeout: None,
        }
    }

    /// A source that is this very host, kept across restarts.
    pub fn shared<H: ToolHost + 'static>(name: impl Into<String>, host: Arc<H>) -> Self {
        Self {
            name: name.into(),
            build: Arc::new(move || host.clone() as Arc<dyn ToolHost>),
            call_timeout: None,
        }
    }

    /// Limits each call of this source to `timeout`, longer or shorter than
    /// the runtime's default: a config's `call_timeout_secs`.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// The source's name, used in logs and in crash messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The source's own per-call limit, when it has one.
    pub fn call_timeout(&self) -> Option<Duration> {
        self.call_timeout
    }
}

impl std::fmt::Debug for ToolSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSource")
            .field("name", &self.name)
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

/// What outlives one instance of the bridge: the sources, in their set.
pub(crate) struct BridgeShared {
    pub(crate) sources: Vec<ToolSource>,
    /// The runtime's default per-call limit.
    pub(crate) call_timeout: Duration,
    /// Every source under its limit; the one path of each call.
    set: ToolSet,
    /// Times the supervisor restarted the bridge.
    pub(crate) restarts: AtomicU32,
}

impl BridgeShared {
    /// The per-call limit of the source at `index`.
    fn call_timeout_of(&self, index: usize) -> Duration {
        self.sources[index]
            .call_timeout
            .unwrap_or(self.call_timeout)
    }

    /// The longest wait any call may need.
    fn longest_call(&self) -> Duration {
        (0..self.sources.len())
            .map(|i| self.call_timeout_of(i))
            .fold(self.call_timeout, Duration::max)
    }

    /// Makes every source (their builders must not block) into one set.
    pub(crate) fn new(
        sources: Vec<ToolSource>,
        call_timeout: Duration,
        budget: &RestartBudget,
    ) -> Arc<Self> {
        let mut set = ToolSet::new().with_restart_budget(budget.fresh());
        for source in &sources {
            let build = source.build.clone();
            let limit = source.call_timeout.unwrap_or(call_timeout);
            // A source here is any host: its tools are held to the same
            // rules, limits and guards as a config's.
            set.add_built_shared(
                source.name.clone(),
                move || build(),
                SourceOptions::default().call_timeout(limit),
            );
        }
        Arc::new(Self {
            sources,
            call_timeout,
            set,
            restarts: AtomicU32::new(0),
        })
    }
}

/// Messages of the tool bridge. Each carries the caller's span, so the
/// work on the bridge's task nests under the loop's step or call.
pub(crate) enum BridgeMsg {
    /// The merged tool list.
    List {
        span: Span,
        reply: RpcReplyPort<Vec<ToolDefinition>>,
    },
    /// Run one tool. `span` is the loop's `execute_tool` span; `context`
    /// goes to the source with the call (its idempotency key).
    Call {
        name: String,
        arguments: Value,
        context: CallContext,
        cancel: CancellationToken,
        span: Span,
        reply: RpcReplyPort<Result<String, ToolError>>,
    },
    /// The first page context a source offers.
    Page {
        span: Span,
        reply: RpcReplyPort<Option<PageContext>>,
    },
}

impl ractor::Message for BridgeMsg {}

pub(crate) struct BridgeActor;

pub(crate) struct BridgeState {
    shared: Arc<BridgeShared>,
}

impl Actor for BridgeActor {
    type Msg = BridgeMsg;
    type State = BridgeState;
    type Arguments = Arc<BridgeShared>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        shared: Arc<BridgeShared>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(BridgeState { shared })
    }

    /// Each request runs on a task of its own, so a slow source never holds
    /// up the mailbox; the set answers it.
    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let shared = state.shared.clone();
        match message {
            BridgeMsg::List { span, reply } => {
                tokio::spawn(
                    async move {
                        let _ = reply.send(shared.set.list_tools().await);
                    }
                    .instrument(span),
                );
            }
            BridgeMsg::Call {
                name,
                arguments,
                context,
                cancel,
                span,
                reply,
            } => {
                tokio::spawn(
                    async move {
                        let result = shared
                            .set
                            .call_tool_with(&name, arguments, &context, cancel)
                            .await;
                        let _ = reply.send(result);
                    }
                    .instrument(span),
                );
            }
            BridgeMsg::Page { span, reply } => {
                tokio::spawn(
                    async move {
                        let _ = reply.send(shared.set.page_context().await);
                    }
                    .instrument(span),
                );
            }
        }
        Ok(())
    }
}

/// A handle to the tool bridge. It implements [`ToolHost`]; the loop lists
/// and calls through it as through any host.
#[derive(Clone)]
pub struct ToolBridgeHandle {
    pub(crate) slot: Arc<Slot<BridgeMsg>>,
    pub(crate) shared: Arc<BridgeShared>,
    pub(crate) timeouts: Timeouts,
}

impl ToolBridgeHandle {
    /// Times the bridge's tools were made afresh: the bridge restarted by
    /// the supervisor, and a source made afresh by the bridge's set after
    /// it panicked.
    pub fn restarts(&self) -> u32 {
        let rebuilt: u32 = self.shared.set.health().iter().map(|h| h.restarts).sum();
        self.shared.restarts.load(Ordering::SeqCst) + rebuilt
    }

    /// Each source's state, restarts and panics, as the bridge's set sees
    /// them ([`ToolSet::health`]).
    pub fn health(&self) -> Vec<SourceHealth> {
        self.shared.set.health()
    }

    /// The set enforces each source's call limit itself; the handle waits a
    /// little longer than the longest of them (and the clean-up after it),
    /// so that the set's precise error wins the race and no source is cut
    /// short.
    fn call_wait(&self) -> Duration {
        self.shared.longest_call() + CANCEL_GRACE + self.timeouts.control
    }

    /// Like [`ToolBridgeHandle::call_wait`], for a listing or the page
    /// context, which the set limits per source to [`LIST_TIMEOUT`].
    fn list_wait(&self) -> Duration {
        self.shared.longest_call().max(LIST_TIMEOUT) + CANCEL_GRACE + self.timeouts.control
    }
}

impl std::fmt::Debug for ToolBridgeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolBridgeHandle")
            .field("sources", &self.shared.sources)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ToolHost for ToolBridgeHandle {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        let span = Span::current();
        match self
            .slot
            .call(
                |reply| BridgeMsg::List {
                    span: span.clone(),
                    reply,
                },
                self.list_wait(),
                self.timeouts.restart_wait,
            )
            .await
        {
            Ok(tools) => tools,
            Err(error) => {
                tracing::warn!(%error, "no tools this step");
                Vec::new()
            }
        }
    }

    async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        self.call_tool_with(name, arguments, &CallContext::new(), cancel)
            .await
    }

    /// The context goes to the source that answers for the tool (an MCP
    /// server sends the idempotency key in the request's `_meta`).
    async fn call_tool_with(
        &self,
        name: &str,
        arguments: Value,
        context: &CallContext,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let span = Span::current();
        self.slot
            .call(
                |reply| BridgeMsg::Call {
                    name: name.to_string(),
                    arguments: arguments.clone(),
                    context: context.clone(),
                    cancel: cancel.clone(),
                    span: span.clone(),
                    reply,
                },
                self.call_wait(),
                self.timeouts.restart_wait,
            )
            .await
            .unwrap_or_else(|error| {
                Err(ToolError::new(
                    ToolErrorCode::Unavailable,
                    error.to_string(),
                ))
            })
    }

    async fn page_context(&self) -> Option<PageContext> {
        let span = Span::current();
        self.slot
            .call(
                |reply| BridgeMsg::Page {
                    span: span.clone(),
                    reply,
                },
                self.list_wait(),
                self.timeouts.restart_wait,
            )
            .await
            .ok()
            .flatten()
    }

    /// Every call goes through the bridge's set.
    fn guards_calls(&self) -> bool {
        true
    }
}
