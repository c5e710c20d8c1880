//! The provider actor: one model, served to every agent, swappable while
//! the host runs.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use async_trait::async_trait;
use futures::FutureExt;
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};
use wma_agent::{
    CallFormat, GenerateRequest, Generation, Progress, ProgressFn, Provider, ProviderError,
    ProviderInfo,
};

use crate::error::{RuntimeError, panic_message};
use crate::slot::Slot;
use crate::timeouts::Timeouts;

type BuildProvider = dyn Fn() -> Result<Arc<dyn Provider>, ProviderError> + Send + Sync;

/// How to make a provider. The runtime prepares what it makes; after a
/// crash the supervisor makes a fresh one from the same source (the model
/// the actor had), and [`ProviderHandle::swap`] takes a new source.
#[derive(Clone)]
pub struct ProviderSource {
    build: Arc<BuildProvider>,
}

impl ProviderSource {
    /// A source that makes a new provider each time, so a restart starts
    /// from clean state (a fresh session, an empty cache).
    pub fn new<P, F>(build: F) -> Self
    where
        P: Provider + 'static,
        F: Fn() -> P + Send + Sync + 'static,
    {
        Self {
            build: Arc::new(move || Ok(Arc::new(build()) as Arc<dyn Provider>)),
        }
    }

    /// Like [`ProviderSource::new`] for constructors that can fail (a model
    /// folder that is not there); the failure is a load error, reported
    /// like a `prepare` that failed.
    pub fn try_new<P, E, F>(build: F) -> Self
    where
        P: Provider + 'static,
        E: std::fmt::Display,
        F: Fn() -> Result<P, E> + Send + Sync + 'static,
    {
        Self {
            build: Arc::new(move || match build() {
                Ok(provider) => Ok(Arc::new(provider) as Arc<dyn Provider>),
                Err(error) => Err(ProviderError::Load(error.to_string())),
            }),
        }
    }

    /// A source that hands out this very instance each time; a restart
    /// prepares it again.
    pub fn shared<P: Provider + 'static>(provider: Arc<P>) -> Self {
        Self {
            build: Arc::new(move || Ok(provider.clone() as Arc<dyn Provider>)),
        }
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderError> {
        (self.build)()
    }
}

impl std::fmt::Debug for ProviderSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderSource").finish_non_exhaustive()
    }
}

/// What the loop asks of a provider without waiting: the trait's
/// synchronous methods are answered from this copy, which the actor
/// replaces when it switches providers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Facts {
    info: ProviderInfo,
    call_format: CallFormat,
    tools_inline: bool,
    supports_constraints: bool,
    parameters: Option<u64>,
}

impl Facts {
    fn of(provider: &dyn Provider) -> Self {
        Self {
            info: provider.info(),
            call_format: provider.call_format(),
            tools_inline: provider.tools_inline(),
            supports_constraints: provider.supports_constraints(),
            parameters: provider.parameters(),
        }
    }
}

/// What outlives one instance of the actor: the model to restart with, the
/// facts handles read, and counters for the host.
pub(crate) struct ProviderShared {
    /// The source of the provider now serving; a successful swap replaces it,
    /// so a restart after a swap loads the new model, not the first one.
    source: Mutex<ProviderSource>,
    facts: watch::Sender<Facts>,
    /// Generations and fits running now, across all instances.
    in_flight: AtomicUsize,
    /// Times the supervisor restarted the actor.
    pub(crate) restarts: AtomicU32,
}

impl ProviderShared {
    pub(crate) fn new(source: ProviderSource, first: &dyn Provider) -> Arc<Self> {
        let (facts, _) = watch::channel(Facts::of(first));
        Arc::new(Self {
            source: Mutex::new(source),
            facts,
            in_flight: AtomicUsize::new(0),
            restarts: AtomicU32::new(0),
        })
    }

    pub(crate) fn source(&self) -> ProviderSource {
        self.source.lock().clone()
    }

    fn publish(&self, source: Option<ProviderSource>, provider: &dyn Provider) {
        if let Some(source) = source {
            *self.source.lock() = source;
        }
        self.facts.send_replace(Facts::of(provider));
    }
}

/// Counts a generation or fits as running until dropped, even by a panic.
struct InFlight(Arc<ProviderShared>);

impl InFlight {
    fn start(shared: &Arc<ProviderShared>) -> Self {
        shared.in_flight.fetch_add(1, Ordering::SeqCst);
        Self(shared.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Messages of the provider actor.
pub(crate) enum ProviderMsg {
    /// Generate one reply. `span` is the caller's (the loop's `chat` span),
    /// so whatever the provider traces nests under it.
    Generate {
        request: GenerateRequest,
        /// The KV-cache session it belongs to, when the caller named one.
        session: Option<String>,
        cancel: CancellationToken,
        span: Span,
        reply: RpcReplyPort<Result<Generation, ProviderError>>,
    },
    /// Whether a prompt fits the context.
    Fits {
        request: GenerateRequest,
        span: Span,
        reply: RpcReplyPort<Result<bool, ProviderError>>,
    },
    /// Facts about the provider serving now.
    Info { reply: RpcReplyPort<ProviderInfo> },
    /// Prepare a new provider, then switch to it.
    Swap {
        source: ProviderSource,
        progress: ProgressFn,
        span: Span,
        reply: RpcReplyPort<Result<ProviderInfo, RuntimeError>>,
    },
    /// A swap's preparation ended (sent by the preparing task).
    Prepared {
        source: ProviderSource,
        result: Result<Arc<dyn Provider>, ProviderError>,
        reply: RpcReplyPort<Result<ProviderInfo, RuntimeError>>,
    },
    /// A restarted instance finished loading its model.
    Loaded {
        result: Result<Arc<dyn Provider>, ProviderError>,
    },
    /// A provider panicked while serving (sent by the serving task).
    Crashed { instance: u64, reason: String },
}

impl ractor::Message for ProviderMsg {}

/// Work that arrived while a restarted instance was still loading.
enum Deferred {
    Generate {
        request: GenerateRequest,
        /// The KV-cache session it belongs to, when the caller named one.
        session: Option<String>,
        cancel: CancellationToken,
        span: Span,
        reply: RpcReplyPort<Result<Generation, ProviderError>>,
    },
    Fits {
        request: GenerateRequest,
        span: Span,
        reply: RpcReplyPort<Result<bool, ProviderError>>,
    },
}

/// The actor: configuration only, see [`ProviderState`].
pub(crate) struct ProviderActor;

/// Startup arguments.
pub(crate) struct ProviderArgs {
    pub(crate) shared: Arc<ProviderShared>,
    /// A provider prepared already (the runtime's first start); `None` makes
    /// the actor load one from the shared source in the background.
    pub(crate) prepared: Option<Arc<dyn Provider>>,
}

pub(crate) struct ProviderState {
    shared: Arc<ProviderShared>,
    /// The provider serving; `None` while a restarted instance loads.
    current: Option<Arc<dyn Provider>>,
    /// Numbers the providers this instance served, so a crash of one that
    /// was swapped out already does not take the new one down.
    instance: u64,
    /// Work held until the model is loaded.
    waiting: Vec<Deferred>,
    /// A swap is preparing its provider.
    swapping: bool,
}

impl Actor for ProviderActor {
    type Msg = ProviderMsg;
    type State = ProviderState;
    type Arguments = ProviderArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ProviderArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let current = match args.prepared {
            Some(provider) => Some(provider),
            None => {
                // Loading can take seconds; the supervisor that spawns us
                // must not wait for it, so it happens in a task and calls
                // wait in `waiting` meanwhile.
                let source = args.shared.source();
                tokio::spawn(async move {
                    let result = prepare(source, Arc::new(|_| {})).await;
                    let _ = myself.send_message(ProviderMsg::Loaded { result });
                });
                None
            }
        };
        Ok(ProviderState {
            shared: args.shared,
            current,
            instance: 0,
            waiting: Vec::new(),
            swapping: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ProviderMsg::Generate {
                request,
                session,
                cancel,
                span,
                reply,
            } => state.serve(
                &myself,
                Deferred::Generate {
                    request,
                    session,
                    cancel,
                    span,
                    reply,
                },
            ),
            ProviderMsg::Fits {
                request,
                span,
                reply,
            } => state.serve(
                &myself,
                Deferred::Fits {
                    request,
                    span,
                    reply,
                },
            ),
            ProviderMsg::Info { reply } => {
                let _ = reply.send(state.shared.facts.borrow().info.clone());
            }
            ProviderMsg::Swap {
                source,
                progress,
                span,
                reply,
            } => {
                if state.swapping {
                    let _ = reply.send(Err(RuntimeError::SwapInProgress));
                    return Ok(());
                }
                state.swapping = true;
                tracing::info!(parent: &span, "preparing the new model while the current one serves");
                tokio::spawn(
                    async move {
                        let result = prepare(source.clone(), progress).await;
                        let _ = myself.send_message(ProviderMsg::Prepared {
                            source,
                            result,
                            reply,
                        });
                    }
                    .instrument(span),
                );
            }
            ProviderMsg::Prepared {
                source,
                result,
                reply,
            } => {
                state.swapping = false;
                match result {
                    Ok(provider) => {
                        // The switch: handlers run one at a time, so every
                        // request handled before this line went to the old
                        // provider (and finishes there, holding its own
                        // reference) and every one after goes to the new.
                        state.shared.publish(Some(source), provider.as_ref());
                        let info = provider.info();
                        tracing::info!(model = %info.model, provider = %info.provider, "switched to the new model");
                        state.current = Some(provider);
                        state.instance += 1;
                        let _ = reply.send(Ok(info));
                    }
                    Err(error) => {
                        tracing::warn!(%error, "the new model did not load; keeping the current one");
                        let _ = reply.send(Err(RuntimeError::SwapFailed(error)));
                    }
                }
            }
            ProviderMsg::Loaded { result } => match result {
                Ok(provider) => {
                    state.shared.publish(None, provider.as_ref());
                    state.current = Some(provider);
                    for work in std::mem::take(&mut state.waiting) {
                        state.serve(&myself, work);
                    }
                }
                Err(error) => {
                    let message = format!("the model could not be loaded again: {error}");
                    for work in std::mem::take(&mut state.waiting) {
                        work.fail(ProviderError::Load(message.clone()));
                    }
                    // Failing hands the decision to the supervisor's budget.
                    return Err(message.into());
                }
            },
            ProviderMsg::Crashed { instance, reason } => {
                if instance == state.instance {
                    // The provider's state may be broken now; only a fresh
                    // one from the same source can be trusted.
                    return Err(format!("the model crashed: {reason}").into());
                }
                tracing::warn!(%reason, "a swapped-out model crashed while finishing a request");
            }
        }
        Ok(())
    }
}

impl ProviderState {
    /// Starts the work on a task (or holds it until the model is loaded).
    /// Inference never runs in the handler: ractor cannot interrupt a
    /// handler, and the actor must keep taking Swap and other requests.
    fn serve(&mut self, myself: &ActorRef<ProviderMsg>, work: Deferred) {
        let Some(provider) = self.current.clone() else {
            self.waiting.push(work);
            return;
        };
        let guard = InFlight::start(&self.shared);
        let instance = self.instance;
        let myself = myself.clone();
        match work {
            Deferred::Generate {
                request,
                session,
                cancel,
                span,
                reply,
            } => {
                tokio::spawn(
                    async move {
                        let _guard = guard;
                        let run = async {
                            // The provider is polled first so that one that
                            // watches the token ends its own way (at the next
                            // token); one that ignores it is dropped here, so
                            // its caller is let go at once either way.
                            tokio::select! {
                                biased;
                                result = async {
                                    match &session {
                                        Some(session) => provider.generate_in_session(session, request, cancel.clone()).await,
                                        None => provider.generate(request, cancel.clone()).await,
                                    }
                                } => result,
                                _ = cancel.cancelled() => Err(ProviderError::Cancelled),
                            }
                        };
                        let result = match AssertUnwindSafe(run).catch_unwind().await {
                            Ok(result) => result,
                            Err(panic) => Err(crashed(&myself, instance, panic)),
                        };
                        let _ = reply.send(result);
                    }
                    .instrument(span),
                );
            }
            Deferred::Fits {
                request,
                span,
                reply,
            } => {
                tokio::spawn(
                    async move {
                        let _guard = guard;
                        let result = match AssertUnwindSafe(provider.fits(&request))
                            .catch_unwind()
                            .await
                        {
                            Ok(result) => result,
                            Err(panic) => Err(crashed(&myself, instance, panic)),
                        };
                        let _ = reply.send(result);
                    }
                    .instrument(span),
                );
            }
        }
    }
}

impl Deferred {
    fn fail(self, error: ProviderError) {
        match self {
            Self::Generate { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Self::Fits { reply, .. } => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// Tells the actor its provider crashed and returns the error for the caller.
fn crashed(
    myself: &ActorRef<ProviderMsg>,
    instance: u64,
    panic: Box<dyn std::any::Any + Send>,
) -> ProviderError {
    let reason = panic_message(panic.as_ref());
    tracing::error!(%reason, "the model panicked");
    let _ = myself.send_message(ProviderMsg::Crashed {
        instance,
        reason: reason.clone(),
    });
    ProviderError::Generation(format!(
        "the model crashed ({reason}); it is being restarted"
    ))
}

/// Makes a provider from its source and prepares it, turning a panic in
/// either into a load error.
pub(crate) async fn prepare(
    source: ProviderSource,
    progress: ProgressFn,
) -> Result<Arc<dyn Provider>, ProviderError> {
    let work = async move {
        let provider = source.build()?;
        provider
            .prepare(progress, CancellationToken::new())
            .await
            .map(|()| provider)
    };
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(ProviderError::Load(format!(
            "the provider panicked while loading: {}",
            panic_message(panic.as_ref())
        ))),
    }
}

/// A handle to the provider actor. It implements [`Provider`], so the loop
/// runs against it exactly as against a provider of its own; each request
/// goes to whichever model the actor serves at that moment.
#[derive(Clone)]
pub struct ProviderHandle {
    pub(crate) slot: Arc<Slot<ProviderMsg>>,
    pub(crate) shared: Arc<ProviderShared>,
    pub(crate) timeouts: Timeouts,
}

impl ProviderHandle {
    /// Prepares `source` while the current provider keeps serving, then
    /// switches to it. Generations already running finish on the old
    /// provider; every later request (the next step of a running agent too)
    /// goes to the new one. If preparing fails, the old provider stays and
    /// the error says why. Waits at most the runtime's swap timeout.
    pub async fn swap(
        &self,
        source: ProviderSource,
        progress: impl Fn(Progress) + Send + Sync + 'static,
    ) -> Result<ProviderInfo, RuntimeError> {
        let progress: ProgressFn = Arc::new(progress);
        let span = Span::current();
        self.slot
            .call(
                |reply| ProviderMsg::Swap {
                    source: source.clone(),
                    progress: progress.clone(),
                    span: span.clone(),
                    reply,
                },
                self.timeouts.swap,
                self.timeouts.restart_wait,
            )
            .await?
    }

    /// Facts about the provider serving now, asked of the actor.
    pub async fn current_info(&self) -> Result<ProviderInfo, RuntimeError> {
        self.slot
            .call(
                |reply| ProviderMsg::Info { reply },
                self.timeouts.control,
                self.timeouts.restart_wait,
            )
            .await
    }

    /// Generations and fits checks running right now.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// Times the supervisor restarted the provider actor.
    pub fn restarts(&self) -> u32 {
        self.shared.restarts.load(Ordering::SeqCst)
    }

    /// Sends one generation to the actor, in `session`'s KV cache when named.
    async fn generate_for(
        &self,
        session: Option<String>,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        let span = Span::current();
        let result = self
            .slot
            .call(
                |reply| ProviderMsg::Generate {
                    request: request.clone(),
                    session: session.clone(),
                    cancel: cancel.clone(),
                    span: span.clone(),
                    reply,
                },
                self.timeouts.generate,
                self.timeouts.restart_wait,
            )
            .await;
        match result {
            Ok(result) => result,
            Err(_) if cancel.is_cancelled() => Err(ProviderError::Cancelled),
            Err(error) => Err(self.to_provider_error(error)),
        }
    }

    fn to_provider_error(&self, error: RuntimeError) -> ProviderError {
        ProviderError::Generation(error.to_string())
    }
}

impl std::fmt::Debug for ProviderHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderHandle")
            .field("actor", &self.slot.label())
            .field("model", &self.shared.facts.borrow().info.model)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Provider for ProviderHandle {
    fn info(&self) -> ProviderInfo {
        self.shared.facts.borrow().info.clone()
    }

    /// The actor prepares every provider before it serves, so there is
    /// nothing left to do here; use [`ProviderHandle::swap`] to load another.
    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        progress(Progress {
            stage: "ready".to_string(),
            done: 1,
            total: Some(1),
        });
        Ok(())
    }

    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.generate_for(None, request, cancel).await
    }

    async fn generate_in_session(
        &self,
        session: &str,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.generate_for(Some(session.to_string()), request, cancel)
            .await
    }

    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError> {
        let span = Span::current();
        self.slot
            .call(
                |reply| ProviderMsg::Fits {
                    request: request.clone(),
                    span: span.clone(),
                    reply,
                },
                // Held while a restarted actor reloads its model, so it may
                // wait as long as a restart does.
                self.timeouts.restart_wait,
                self.timeouts.restart_wait,
            )
            .await
            .map_err(|e| self.to_provider_error(e))?
    }

    fn call_format(&self) -> CallFormat {
        self.shared.facts.borrow().call_format
    }

    fn tools_inline(&self) -> bool {
        self.shared.facts.borrow().tools_inline
    }

    fn supports_constraints(&self) -> bool {
        self.shared.facts.borrow().supports_constraints
    }
    fn parameters(&self) -> Option<u64> {
        self.shared.facts.borrow().parameters
    }
}
