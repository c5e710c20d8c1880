//! The agent actor: runs `run_local_agent` against the provider and tool
//! bridge handles, with bounded admission and Stop.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures::{FutureExt, Stream, StreamExt};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span};
use wma_agent::{
    AgentProfile, AgentRunRequest, AgentStreamPart, ChatMessage, InSession, LocalLoopOptions,
    SubAgentInfo, run_local_agent,
};

use crate::bridge::ToolBridgeHandle;
use crate::delegation::{Delegate, DelegationScope, Relay, RunApprovals, RunTools};
use crate::error::{RuntimeError, panic_message};
use crate::part::{RUN_PART_BUFFER, TaggedPart};
use crate::provider::ProviderHandle;
use crate::slot::Slot;
use crate::timeouts::Timeouts;

/// Concurrent runs one agent accepts unless [`AgentConfig::max_concurrent_runs`]
/// says otherwise. One more is refused at once with [`RuntimeError::Busy`];
/// nothing queues, because a queued request to an on-device model can wait
/// for minutes without the person knowing why.
pub const DEFAULT_MAX_CONCURRENT_RUNS: usize = 4;

/// One agent the runtime hosts.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The name callers look it up by; also the profile's name in traces
    /// (`invoke_agent {name}`) unless the profile names it, and the name of
    /// the tool a parent delegates to it with.
    pub name: String,
    /// What the agent is good at, in a sentence a parent's model reads in
    /// its delegation note. Default empty.
    pub description: String,
    /// The provider it runs on, by the name it was registered with
    /// ([`RuntimeBuilder::provider`](crate::RuntimeBuilder::provider)).
    /// Default `None`: the first provider registered.
    pub provider: Option<String>,
    /// The tool sources it sees, by name. Default `None`: every source
    /// registered with the runtime. A sub-agent given its own list sees only
    /// those tools (and its own sub-agents), nothing of its parent's.
    pub tool_sources: Option<Vec<String>>,
    /// Instructions, step limit and sub-agents; wins over `options`. A
    /// sub-agent listed with an empty description gets the sub-agent's own
    /// [`AgentConfig::description`] when the runtime starts.
    pub profile: AgentProfile,
    /// The loop's limits.
    pub options: LocalLoopOptions,
    /// Admission limit. Default [`DEFAULT_MAX_CONCURRENT_RUNS`].
    pub max_concurrent_runs: usize,
    /// Take `options.tools_inline` from the provider serving when each run
    /// starts, so a swap to a model with chat-template tools changes it.
    /// Default true.
    pub follow_provider_tools_inline: bool,
}

impl AgentConfig {
    /// An agent with default options.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            profile: AgentProfile {
                name: Some(name.clone()),
                ..AgentProfile::default()
            },
            name,
            description: String::new(),
            provider: None,
            tool_sources: None,
            options: LocalLoopOptions::default(),
            max_concurrent_runs: DEFAULT_MAX_CONCURRENT_RUNS,
            follow_provider_tools_inline: true,
        }
    }

    /// Sets what the agent is good at (for parents' delegation notes).
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Runs the agent on the provider registered under this name.
    pub fn with_provider(mut self, provider: impl Into<String>) -> Self {
        self.provider = Some(provider.into());
        self
    }

    /// Limits the agent to these tool sources (by name).
    pub fn with_tool_sources<I, S>(mut self, sources: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tool_sources = Some(sources.into_iter().map(Into::into).collect());
        self
    }

    /// Lets the agent delegate to these agents (by name); each becomes a
    /// tool that takes a task and returns the sub-agent's answer. Their
    /// descriptions come from their own configs.
    pub fn with_sub_agents<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.profile.sub_agents = names
            .into_iter()
            .map(|name| SubAgentInfo {
                name: name.into(),
                description: String::new(),
            })
            .collect();
        self
    }

    /// Sets the loop options.
    pub fn with_options(mut self, options: LocalLoopOptions) -> Self {
        self.options = options;
        self
    }

    /// Sets the profile (its name defaults to the agent's).
    pub fn with_profile(mut self, mut profile: AgentProfile) -> Self {
        if profile.name.is_none() {
            profile.name = Some(self.name.clone());
        }
        self.profile = profile;
        self
    }

    /// Sets the admission limit (at least 1).
    pub fn with_max_concurrent_runs(mut self, limit: usize) -> Self {
        self.max_concurrent_runs = limit.max(1);
        self
    }

    /// Uses `options.tools_inline` as given instead of following the provider.
    pub fn with_fixed_tools_inline(mut self) -> Self {
        self.follow_provider_tools_inline = false;
        self
    }
}

/// Identifies one run of one agent.
pub type RunId = u64;

/// What outlives one instance of the agent actor, so that a restart
/// neither forgets running runs (Stop must still reach them) nor resets
/// the admission count.
pub(crate) struct AgentShared {
    pub(crate) config: AgentConfig,
    permits: Arc<Semaphore>,
    runs: Mutex<HashMap<RunId, CancellationToken>>,
    next_id: AtomicU64,
    /// Times the supervisor restarted the actor.
    pub(crate) restarts: AtomicU32,
}

impl AgentShared {
    pub(crate) fn new(config: AgentConfig) -> Arc<Self> {
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(config.max_concurrent_runs.max(1))),
            config,
            runs: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            restarts: AtomicU32::new(0),
        })
    }

    /// Stops every run without going through the actor (the runtime is going away).
    pub(crate) fn cancel_all(&self) {
        self.runs
            .lock()
            .values()
            .for_each(CancellationToken::cancel);
    }
}

/// Messages of the agent actor.
pub(crate) enum AgentMsg {
    /// Start a run that sends its parts to `parts`. `span` is the caller's,
    /// the parent of the run's `invoke_agent` span; `depth` is how deep in
    /// a delegation the run is (0 for a run a host started).
    Run {
        messages: Vec<ChatMessage>,
        cancel: CancellationToken,
        depth: u32,
        approvals: RunApprovals,
        parts: mpsc::Sender<TaggedPart>,
        span: Span,
        reply: RpcReplyPort<Result<RunId, RuntimeError>>,
    },
    /// Stop one run, or all of them; replies with how many were stopped.
    Stop {
        run: Option<RunId>,
        reply: RpcReplyPort<usize>,
    },
}

impl ractor::Message for AgentMsg {}

pub(crate) struct AgentActor;

pub(crate) struct AgentArgs {
    pub(crate) shared: Arc<AgentShared>,
    pub(crate) provider: ProviderHandle,
    pub(crate) tools: ToolBridgeHandle,
    /// Runs this agent's sub-agents: the delegator's handle, which sits
    /// above this actor (it starts agents' runs).
    pub(crate) delegator: Arc<dyn Delegate>,
}

impl Actor for AgentActor {
    type Msg = AgentMsg;
    type State = AgentArgs;
    type Arguments = AgentArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: AgentArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            AgentMsg::Run {
                messages,
                cancel,
                depth,
                approvals,
                parts,
                span,
                reply,
            } => {
                let result = match state.shared.permits.clone().try_acquire_owned() {
                    Err(_) => Err(RuntimeError::Busy {
                        agent: state.shared.config.name.clone(),
                        limit: state.shared.config.max_concurrent_runs,
                    }),
                    Ok(permit) => {
                        Ok(state.start(messages, cancel, depth, approvals, parts, span, permit))
                    }
                };
                let _ = reply.send(result);
            }
            AgentMsg::Stop { run, reply } => {
                let runs = state.shared.runs.lock();
                let stopped = match run {
                    Some(id) => runs.get(&id).map(|t| t.cancel()).map_or(0, |()| 1),
                    None => {
                        runs.values().for_each(CancellationToken::cancel);
                        runs.len()
                    }
                };
                let _ = reply.send(stopped);
            }
        }
        Ok(())
    }
}

impl AgentArgs {
    /// Starts the run on its own task: the loop waits on the model for
    /// seconds at a time, and the actor must keep taking Run and Stop.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        messages: Vec<ChatMessage>,
        cancel: CancellationToken,
        depth: u32,
        approvals: RunApprovals,
        parts: mpsc::Sender<TaggedPart>,
        span: Span,
        permit: OwnedSemaphorePermit,
    ) -> RunId {
        let shared = self.shared.clone();
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        shared.runs.lock().insert(id, cancel.clone());
        let mut options = shared.config.options.clone();
        if shared.config.follow_provider_tools_inline {
            options.tools_inline = wma_agent::Provider::tools_inline(&self.provider);
        }
        let mut profile = shared.config.profile.clone();
        profile.delegated = depth > 0;
        // Sub-agents' runs end before their parent's terminal part is sent,
        // so a host never sees a part of this run after its end.
        let children = TaskTracker::new();
        let (relay, mut relayed) = mpsc::channel(RUN_PART_BUFFER);
        let (announce, announced) = tokio::sync::watch::channel(0u64);
        let delegates: Vec<String> = profile.sub_agents.iter().map(|s| s.name.clone()).collect();
        let delegation = if profile.sub_agents.is_empty() || depth >= self.delegator.max_depth() {
            // At the depth limit the sub-agents are neither offered as tools
            // nor named in the prompt: a small model would only waste steps
            // calling tools that must refuse.
            profile.sub_agents.clear();
            None
        } else {
            Some(DelegationScope {
                delegator: self.delegator.clone(),
                agent: shared.config.name.clone(),
                sub_agents: profile.sub_agents.clone(),
                depth,
                sink: relay,
                children: children.clone(),
                announced,
                made: AtomicU64::new(0),
                approvals: approvals.clone(),
            })
        };
        let request = AgentRunRequest {
            messages,
            tools: Arc::new(RunTools::new(self.tools.clone(), delegation)),
            cancel: cancel.clone(),
            agent: Some(profile),
            approver: approvals.approver,
            approval_rules: approvals.rules,
        };
        // Each run has its own KV-cache session in a provider that keeps
        // several: a sub-agent's steps do not evict this run's prefix, and
        // the next run of this agent starts from what this one computed.
        let provider = InSession::new(
            self.provider.clone(),
            format!("{}#{id}", shared.config.name),
        );
        let name = shared.config.name.clone();
        tokio::spawn(
            async move {
                let _permit = permit;
                let mut ended = false;
                // This task is the one writer of the run's parts: the loop's
                // own, in the loop's order, and its sub-agents', which are
                // taken only while the loop has nothing ready (so the call
                // that started a sub-agent is out first), with a sub-agent's
                // answer released to the loop only after its parts.
                let drive = async {
                    let mut stream = run_local_agent(provider, request, options);
                    loop {
                        tokio::select! {
                            biased;
                            part = stream.next() => {
                                let Some(part) = part else { break };
                                if part.is_terminal() {
                                    ended = true;
                                    settle(&children, &mut relayed, &parts, &cancel).await;
                                }
                                let delegation = matches!(
                                    &part,
                                    AgentStreamPart::ToolCall { name, .. } if delegates.contains(name)
                                );
                                if parts.send(TaggedPart::new(&name, 0, part)).await.is_err() {
                                    // Nobody reads any more: stop, and let the loop end
                                    // its run properly (it finishes "aborted" at once).
                                    cancel.cancel();
                                }
                                if delegation {
                                    announce.send_modify(|count| *count += 1);
                                }
                            }
                            Some(message) = relayed.recv() => {
                                pass_on(message, &parts, &cancel).await;
                            }
                        }
                    }
                };
                if let Err(panic) = AssertUnwindSafe(drive).catch_unwind().await {
                    // Every run ends with exactly one finish or error, even
                    // when the loop itself fails.
                    let reason = panic_message(panic.as_ref());
                    tracing::error!(%reason, "a run panicked");
                    if !ended {
                        cancel.cancel();
                        settle(&children, &mut relayed, &parts, &cancel).await;
                        let _ = parts
                            .send(TaggedPart::new(
                                &name,
                                0,
                                AgentStreamPart::Error {
                                    message: format!("The agent crashed: {reason}"),
                                },
                            ))
                            .await;
                    }
                }
                shared.runs.lock().remove(&id);
            }
            .instrument(span),
        );
        id
    }
}

/// Waits for the run's sub-agent jobs to end, passing their parts on meanwhile.
async fn settle(
    children: &TaskTracker,
    relayed: &mut mpsc::Receiver<Relay>,
    parts: &mpsc::Sender<TaggedPart>,
    cancel: &CancellationToken,
) {
    children.close();
    loop {
        tokio::select! {
            biased;
            Some(message) = relayed.recv() => pass_on(message, parts, cancel).await,
            _ = children.wait() => break,
        }
    }
    // What the jobs sent just before they ended.
    while let Ok(message) = relayed.try_recv() {
        pass_on(message, parts, cancel).await;
    }
}

/// A sub-agent's part goes to the host; its answer to the waiting tool call.
async fn pass_on(message: Relay, parts: &mpsc::Sender<TaggedPart>, cancel: &CancellationToken) {
    match message {
        Relay::Part(part) => {
            if parts.send(part).await.is_err() {
                cancel.cancel();
            }
        }
        Relay::Answer { reply, result } => {
            // The call may have been dropped (the run was stopped).
            let _ = reply.send(result);
        }
    }
}

/// A handle to one agent.
#[derive(Clone)]
pub struct AgentHandle {
    pub(crate) slot: Arc<Slot<AgentMsg>>,
    pub(crate) shared: Arc<AgentShared>,
    pub(crate) timeouts: Timeouts,
}

/// Refuses a run that has nothing to do: no messages, or a conversation
/// whose last message is the person's and holds only white space. Every
/// run checks this when it starts (a host's, a parent's delegation, a
/// peer's); a host that keeps records calls it first, so that an empty
/// request leaves none. A conversation that ends with a call's result
/// (a run going on after an approval) has its request further up.
pub fn check_request(messages: &[ChatMessage]) -> Result<(), RuntimeError> {
    match messages.last() {
        None => Err(RuntimeError::EmptyRequest),
        Some(ChatMessage::User { content }) if content.trim().is_empty() => {
            Err(RuntimeError::EmptyRequest)
        }
        Some(_) => Ok(()),
    }
}

impl AgentHandle {
    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.shared.config.name
    }

    /// The agent's configuration (with sub-agent descriptions filled in).
    pub fn config(&self) -> &AgentConfig {
        &self.shared.config
    }

    /// Starts a run and streams its parts. Fails at once with
    /// [`RuntimeError::Busy`] when the agent runs its limit already. The
    /// current tracing span becomes the parent of the run's `invoke_agent`.
    pub async fn run(&self, messages: Vec<ChatMessage>) -> Result<RunStream, RuntimeError> {
        self.run_with_cancel(messages, CancellationToken::new())
            .await
    }

    /// Like [`AgentHandle::run`], cancelled also when `parent` is (a parent
    /// agent's run, a request that went away).
    pub async fn run_with_cancel(
        &self,
        messages: Vec<ChatMessage>,
        parent: CancellationToken,
    ) -> Result<RunStream, RuntimeError> {
        self.start(messages, parent, 0).await
    }

    /// Like [`AgentHandle::run_with_cancel`], asking `approvals`' approver
    /// about the calls that need approval (its sub-agents' calls too).
    pub async fn run_with(
        &self,
        messages: Vec<ChatMessage>,
        parent: CancellationToken,
        approvals: RunApprovals,
    ) -> Result<RunStream, RuntimeError> {
        self.start_with(messages, parent, 0, approvals).await
    }

    /// Starts a run `depth` levels down a delegation (a sub-agent's run
    /// for a parent, here or on another node).
    pub(crate) async fn start(
        &self,
        messages: Vec<ChatMessage>,
        parent: CancellationToken,
        depth: u32,
    ) -> Result<RunStream, RuntimeError> {
        self.start_with(messages, parent, depth, RunApprovals::default())
            .await
    }

    /// [`AgentHandle::start`] with the run's approvals.
    pub(crate) async fn start_with(
        &self,
        messages: Vec<ChatMessage>,
        parent: CancellationToken,
        depth: u32,
        approvals: RunApprovals,
    ) -> Result<RunStream, RuntimeError> {
        check_request(&messages)?;
        let cancel = parent.child_token();
        let (tx, rx) = mpsc::channel(RUN_PART_BUFFER);
        let span = Span::current();
        let id = self
            .slot
            .call(
                |reply| AgentMsg::Run {
                    messages: messages.clone(),
                    cancel: cancel.clone(),
                    depth,
                    approvals: approvals.clone(),
                    parts: tx.clone(),
                    span: span.clone(),
                    reply,
                },
                self.timeouts.control,
                self.timeouts.restart_wait,
            )
            .await??;
        Ok(RunStream {
            id,
            rx,
            cancel,
            ended: false,
        })
    }

    /// Stops one run (through the actor); returns whether it was running.
    pub async fn stop(&self, run: RunId) -> Result<bool, RuntimeError> {
        self.stop_inner(Some(run)).await.map(|n| n > 0)
    }

    /// Stops every run of this agent; returns how many were running.
    pub async fn stop_all(&self) -> Result<usize, RuntimeError> {
        self.stop_inner(None).await
    }

    async fn stop_inner(&self, run: Option<RunId>) -> Result<usize, RuntimeError> {
        self.slot
            .call(
                |reply| AgentMsg::Stop { run, reply },
                self.timeouts.control,
                self.timeouts.restart_wait,
            )
            .await
    }

    /// Runs in progress (their tasks still alive).
    pub fn active_runs(&self) -> usize {
        self.shared.runs.lock().len()
    }

    /// Times the supervisor restarted this agent's actor.
    pub fn restarts(&self) -> u32 {
        self.shared.restarts.load(Ordering::SeqCst)
    }
}

impl std::fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHandle")
            .field("name", &self.shared.config.name)
            .finish_non_exhaustive()
    }
}

/// The parts of one run, ending with exactly one finish or error part.
/// Dropping it stops the run.
///
/// As a [`Stream`] it yields the run's own parts. A run that delegates also
/// carries its sub-agents' parts; [`RunStream::next_tagged`] and
/// [`RunStream::tagged`] yield every part with the agent it belongs to.
#[derive(Debug)]
pub struct RunStream {
    id: RunId,
    rx: mpsc::Receiver<TaggedPart>,
    cancel: CancellationToken,
    /// The terminal part was read; dropping no longer needs to stop anything.
    ended: bool,
}

/// Every part of a run and of its sub-agents' runs, tagged; see [`RunStream::tagged`].
pub type TaggedStream = Pin<Box<dyn Stream<Item = TaggedPart> + Send>>;

impl RunStream {
    /// The run's id, for [`AgentHandle::stop`].
    pub fn id(&self) -> RunId {
        self.id
    }

    /// Stops this run; it ends with finish `aborted` (read on to see it).
    /// Its sub-agents' runs are stopped with it.
    pub fn stop(&self) {
        self.cancel.cancel();
    }

    /// The token that stops this run, for code that holds the stream elsewhere.
    pub(crate) fn stopper(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Reads the run's own parts to its end.
    pub async fn collect_parts(mut self) -> Vec<AgentStreamPart> {
        let mut parts = Vec::new();
        while let Some(part) = self.next().await {
            parts.push(part);
        }
        parts
    }

    /// Reads every part, the sub-agents' too, to the run's end.
    pub async fn collect_tagged(mut self) -> Vec<TaggedPart> {
        let mut parts = Vec::new();
        while let Some(part) = self.next_tagged().await {
            parts.push(part);
        }
        parts
    }

    /// The next part of the run or of one of its sub-agents' runs.
    pub async fn next_tagged(&mut self) -> Option<TaggedPart> {
        std::future::poll_fn(|cx| self.poll_tagged(cx)).await
    }

    /// A part that is ready now, without waiting.
    pub(crate) fn try_next_tagged(&mut self) -> Option<TaggedPart> {
        let part = self.rx.try_recv().ok()?;
        self.ended |= part.ends_the_run();
        Some(part)
    }

    /// Every part, tagged, as a stream.
    pub fn tagged(self) -> TaggedStream {
        Box::pin(futures::stream::unfold(self, |mut run| async move {
            run.next_tagged().await.map(|part| (part, run))
        }))
    }

    fn poll_tagged(&mut self, cx: &mut Context<'_>) -> Poll<Option<TaggedPart>> {
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(part)) = &polled
            && part.ends_the_run()
        {
            self.ended = true;
        }
        polled
    }
}

impl Stream for RunStream {
    type Item = AgentStreamPart;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.poll_tagged(cx) {
                Poll::Ready(Some(part)) if part.depth == 0 => return Poll::Ready(Some(part.part)),
                // A sub-agent's part: the plain stream shows the run's own.
                Poll::Ready(Some(_)) => continue,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for RunStream {
    fn drop(&mut self) {
        if !self.ended {
            self.cancel.cancel();
        }
    }
}
