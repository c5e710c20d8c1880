//! The tool bridge actor: every tool source behind one [`ToolHost`].

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};
use wma_agent::{
    ArgsError, CallContext, PageContext, ToolDefinition, ToolError, ToolErrorCode, ToolHost,
    validate_args,
};

use crate::error::panic_message;
use crate::slot::Slot;
use crate::timeouts::Timeouts;

/// Time limit of one tool call of a source that has no limit of its own
/// ([`ToolSource::with_call_timeout`]), and of one source's listing, unless
/// [`RuntimeBuilder::tool_timeout`](crate::RuntimeBuilder::tool_timeout) says otherwise.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);

type BuildHost = dyn Fn() -> Arc<dyn ToolHost> + Send + Sync;

/// How long a call that ran out of time (or was cancelled) is given to hear
/// its cancellation and clean up before the caller gets its answer.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// A named source of tools and how to make it. When a source crashes, the
/// supervisor restarts the bridge, which makes every source afresh.
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
    /// A source that makes a new host each time the bridge starts.
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

/// What outlives one instance of the bridge.
pub(crate) struct BridgeShared {
    pub(crate) sources: Vec<ToolSource>,
    /// The runtime's default per-call limit, and the listing limit.
    pub(crate) call_timeout: Duration,
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

    pub(crate) fn new(sources: Vec<ToolSource>, call_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            sources,
            call_timeout,
            restarts: AtomicU32::new(0),
        })
    }
}

/// Which source answers for a tool name, with the definition to validate against.
#[derive(Clone)]
pub(crate) struct Route {
    source: usize,
    definition: ToolDefinition,
}

/// Messages of the tool bridge.
pub(crate) enum BridgeMsg {
    /// The merged tool list. `span` is the caller's (the loop's step).
    List {
        span: Span,
        reply: RpcReplyPort<Vec<ToolDefinition>>,
    },
    /// A listing finished (sent by the listing task): keep its routes, answer.
    Listed {
        tools: Vec<ToolDefinition>,
        routes: HashMap<String, Route>,
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
    /// A source panicked (sent by the calling task).
    Crashed { source: String, reason: String },
}

impl ractor::Message for BridgeMsg {}

pub(crate) struct BridgeActor;

pub(crate) struct BridgeState {
    shared: Arc<BridgeShared>,
    hosts: Arc<Vec<Arc<dyn ToolHost>>>,
    /// From the newest listing; a call to a name not in it lists again.
    routes: HashMap<String, Route>,
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
        let hosts = shared.sources.iter().map(|s| (s.build)()).collect();
        Ok(BridgeState {
            shared,
            hosts: Arc::new(hosts),
            routes: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            BridgeMsg::List { span, reply } => {
                let hosts = state.hosts.clone();
                let shared = state.shared.clone();
                tokio::spawn(
                    async move {
                        let (tools, routes) = merged(&myself, &shared, &hosts).await;
                        let _ = myself.send_message(BridgeMsg::Listed {
                            tools,
                            routes,
                            reply,
                        });
                    }
                    .instrument(span),
                );
            }
            BridgeMsg::Listed {
                tools,
                routes,
                reply,
            } => {
                state.routes = routes;
                let _ = reply.send(tools);
            }
            BridgeMsg::Call {
                name,
                arguments,
                context,
                cancel,
                span,
                reply,
            } => {
                let route = state.routes.get(&name).cloned();
                let hosts = state.hosts.clone();
                let shared = state.shared.clone();
                tokio::spawn(
                    async move {
                        let request = CallRequest {
                            name: &name,
                            arguments,
                            context: &context,
                            cancel,
                        };
                        let result = call(&myself, &shared, &hosts, route, request).await;
                        let _ = reply.send(result);
                    }
                    .instrument(span),
                );
            }
            BridgeMsg::Page { span, reply } => {
                let hosts = state.hosts.clone();
                let timeout = state.shared.call_timeout;
                tokio::spawn(
                    async move {
                        for host in hosts.iter() {
                            let page = AssertUnwindSafe(host.page_context()).catch_unwind();
                            if let Ok(Ok(Some(page))) = tokio::time::timeout(timeout, page).await {
                                let _ = reply.send(Some(page));
                                return;
                            }
                        }
                        let _ = reply.send(None);
                    }
                    .instrument(span),
                );
            }
            BridgeMsg::Crashed { source, reason } => {
                // A source that panicked may hold broken state (a half-read
                // pipe, a dead browser tab): start every source afresh.
                return Err(format!("the tool source `{source}` crashed: {reason}").into());
            }
        }
        Ok(())
    }
}

/// Lists every source (concurrently, each within the call timeout) and
/// merges the lists. Each listing goes through the rules every offered tool
/// follows ([`wma_tools::admit_tools`]: identifier names, caps on
/// descriptions, schemas and tool count), as a `ToolSet`'s do, since a
/// source may be any [`ToolHost`]; a refused tool is a warning naming its
/// source, and is neither listed nor routed (a call to it is an unknown
/// tool). Name clashes go to the source registered first, so the answer
/// does not depend on which source answered faster.
async fn merged(
    myself: &ActorRef<BridgeMsg>,
    shared: &BridgeShared,
    hosts: &[Arc<dyn ToolHost>],
) -> (Vec<ToolDefinition>, HashMap<String, Route>) {
    let listings = futures::future::join_all(hosts.iter().enumerate().map(|(i, host)| {
        let name = shared.sources[i].name.clone();
        async move {
            let listing = AssertUnwindSafe(host.list_tools()).catch_unwind();
            match tokio::time::timeout(shared.call_timeout, listing).await {
                Ok(Ok(tools)) => wma_tools::admit_tools(&name, tools),
                Ok(Err(panic)) => {
                    let reason = panic_message(panic.as_ref());
                    tracing::error!(source = %name, %reason, "a tool source panicked while listing its tools");
                    let _ = myself.send_message(BridgeMsg::Crashed {
                        source: name,
                        reason,
                    });
                    Vec::new()
                }
                Err(_) => {
                    tracing::warn!(source = %name, "a tool source did not list its tools in time");
                    Vec::new()
                }
            }
        }
    }))
    .await;
    let mut tools = Vec::new();
    let mut routes: HashMap<String, Route> = HashMap::new();
    for (source, listing) in listings.into_iter().enumerate() {
        for definition in listing {
            if let Some(existing) = routes.get(&definition.name) {
                tracing::debug!(
                    tool = %definition.name,
                    kept = %shared.sources[existing.source].name,
                    dropped = %shared.sources[source].name,
                    "two tool sources offer the same name; the first registered wins"
                );
                continue;
            }
            routes.insert(
                definition.name.clone(),
                Route {
                    source,
                    definition: definition.clone(),
                },
            );
            tools.push(definition);
        }
    }
    (tools, routes)
}

/// One call as the bridge got it.
struct CallRequest<'a> {
    name: &'a str,
    arguments: Value,
    context: &'a CallContext,
    cancel: CancellationToken,
}

/// One call: route, validate, run with the time limit, contain a panic.
async fn call(
    myself: &ActorRef<BridgeMsg>,
    shared: &BridgeShared,
    hosts: &[Arc<dyn ToolHost>],
    route: Option<Route>,
    request: CallRequest<'_>,
) -> Result<String, ToolError> {
    let CallRequest {
        name,
        arguments,
        context,
        cancel,
    } = request;
    let route = match route {
        Some(route) => route,
        // Called without a fresh listing (or the tool just appeared).
        None => merged(myself, shared, hosts)
            .await
            .1
            .remove(name)
            .ok_or_else(|| {
                ToolError::new(
                    ToolErrorCode::UnknownTool,
                    format!("no tool named \"{name}\""),
                )
            })?,
    };
    // Sources are not trusted to check their own arguments (WebMCP pages
    // and most servers do not).
    match validate_args(&route.definition.input_schema, &arguments) {
        Ok(()) => {}
        Err(ArgsError::Invalid(message)) => {
            return Err(ToolError::new(ToolErrorCode::InvalidArguments, message));
        }
        Err(error) => {
            return Err(ToolError::new(
                ToolErrorCode::Unavailable,
                format!("{name}: {error}"),
            ));
        }
    }
    let source = &shared.sources[route.source].name;
    let host = &hosts[route.source];
    let limit = shared.call_timeout_of(route.source);
    // The source gets a child token, so that a call over its limit is
    // cancelled in the source too (a page cancels the invocation, a tool
    // set inside passes it on) instead of running on unseen.
    let source_cancel = cancel.child_token();
    let run =
        AssertUnwindSafe(host.call_tool_with(name, arguments, context, source_cancel.clone()))
            .catch_unwind();
    tokio::pin!(run);
    let outcome = tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        outcome = tokio::time::timeout(limit, &mut run) => outcome.ok(),
    };
    let Some(outcome) = outcome else {
        // Bounded: a source that ignores its token is not waited for.
        source_cancel.cancel();
        let _ = tokio::time::timeout(CANCEL_GRACE, &mut run).await;
        return Err(if cancel.is_cancelled() {
            ToolError::new(ToolErrorCode::Cancelled, "the call was cancelled")
        } else {
            ToolError::new(
                ToolErrorCode::Timeout,
                format!("{name} did not answer within {} s", limit.as_secs_f32()),
            )
        });
    };
    match outcome {
        Err(panic) => {
            let reason = panic_message(panic.as_ref());
            tracing::error!(source = %source, tool = name, %reason, "a tool source panicked");
            let _ = myself.send_message(BridgeMsg::Crashed {
                source: source.clone(),
                reason: reason.clone(),
            });
            Err(ToolError::new(
                ToolErrorCode::Unavailable,
                format!(
                    "the tool source `{source}` crashed while running {name} ({reason}); it is being restarted"
                ),
            ))
        }
        Ok(result) => result,
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
    /// Times the supervisor restarted the bridge.
    pub fn restarts(&self) -> u32 {
        self.shared.restarts.load(Ordering::SeqCst)
    }

    /// The bridge enforces each source's call limit itself; the handle
    /// waits a little longer than the longest of them (and the clean-up
    /// after it), so that the bridge's precise error wins the race and no
    /// source is cut short.
    fn call_wait(&self) -> Duration {
        self.shared.longest_call() + CANCEL_GRACE + self.timeouts.control
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
                self.call_wait(),
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
                self.call_wait(),
                self.timeouts.restart_wait,
            )
            .await
            .ok()
            .flatten()
    }
}
