//! The delegator actor: each sub-agent is a tool of its parent.
//!
//! A parent's run sees one tool per sub-agent, named after it, taking
//! `{"task": "..."}`. Calling it starts the sub-agent's own run (its own
//! provider, tools and instructions) with the task as the user's message;
//! the sub-agent's parts reach the parent's host tagged with the
//! sub-agent's name, and its final answer comes back as the tool result.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, Span};
use wma_agent::{
    AgentStreamPart, ApprovalAnswer, ApprovalRequest, Approver, CallContext, CallRecordRequest,
    ChatMessage, FinishReason, PageContext, SubAgentInfo, ToolDefinition, ToolError, ToolErrorCode,
    ToolHost,
};

use crate::agent::{AgentHandle, RUN_PART_BUFFER, RunApprovals};
use crate::bridge::ToolBridgeHandle;
use crate::cluster;
use crate::error::RuntimeError;
use crate::part::{TaggedPart, is_sub_run, sub_run_within};
use crate::slot::Slot;
use crate::supervisor::Timeouts;

/// How deep delegation may nest unless
/// [`RuntimeBuilder::max_delegation_depth`](crate::RuntimeBuilder::max_delegation_depth)
/// says otherwise: a run a host started is at depth 0, its sub-agents' runs
/// at 1, theirs at 2. A run at the limit is not offered its sub-agents.
/// Two levels let a parent hand work to a specialist that has helpers of its
/// own; deeper chains of small models mostly lose the task on the way.
pub const DEFAULT_MAX_DELEGATION_DEPTH: u32 = 2;

/// The tool a parent calls to delegate to `agent`.
///
/// A run lists it with `untrusted_content` set when the sub-agent's answer
/// may carry untrusted content, by a static rule: the sub-agent runs on
/// another node (whose tools this node cannot see, and whose answer comes
/// from another process), or a tool it can see brings untrusted content,
/// or one of its own sub-agents is such an agent.
pub fn delegation_tool(agent: &SubAgentInfo) -> ToolDefinition {
    let description = if agent.description.trim().is_empty() {
        format!(
            "Hand a task to the {} agent; its answer comes back.",
            agent.name
        )
    } else {
        agent.description.clone()
    };
    ToolDefinition::new(
        agent.name.clone(),
        description,
        json!({
            "type": "object",
            "properties": {"task": {
                "type": "string",
                "description": "What the agent should do, in a sentence."
            }},
            "required": ["task"]
        }),
    )
}

/// One delegation: which agent asks which for what, and where the
/// sub-agent's parts go.
#[derive(Clone)]
pub(crate) struct Job {
    /// The parent agent.
    pub(crate) from: String,
    /// The sub-agent.
    pub(crate) to: String,
    /// The task, which becomes the sub-agent's user message.
    pub(crate) task: String,
    /// The sub-agent run's depth.
    pub(crate) depth: u32,
    /// Which of the parent run's delegations this is (1, 2, 3…): the
    /// sub-agent run's parts and its approver's calls carry it
    /// ([`TaggedPart::sub_run`]), since two runs of one sub-agent number
    /// their calls alike.
    pub(crate) ordinal: u64,
    /// The parent's call token: cancelling it stops the sub-agent's run.
    pub(crate) cancel: CancellationToken,
    /// Where the sub-agent's parts and then its answer go: to the task that
    /// forwards the parent's parts, which keeps them in order.
    pub(crate) sink: mpsc::Sender<Relay>,
    /// The parent run's tracker, so it ends after this job.
    pub(crate) children: TaskTracker,
    /// The parent's `execute_tool` span, the parent of the sub-agent's `invoke_agent`.
    pub(crate) span: Span,
    /// The parent run's approvals: a sub-agent's calls are asked about
    /// where the parent's are.
    pub(crate) approvals: RunApprovals,
}

/// What the delegating tool call waits for.
pub(crate) type Answer = oneshot::Receiver<Result<String, ToolError>>;

/// What a job sends the task that forwards its parent's parts.
///
/// The sub-agent's parts and its answer travel on one channel, so that the
/// answer reaches the parent's loop only after every part before it
/// reached the host: the parent's tool result can never overtake the
/// sub-agent's last parts, nor its tool call the sub-agent's first.
pub(crate) enum Relay {
    /// A sub-agent's part, already tagged one level down.
    Part(TaggedPart),
    /// The job's answer, for the tool call waiting on `reply`.
    Answer {
        reply: oneshot::Sender<Result<String, ToolError>>,
        result: Result<String, ToolError>,
    },
}

/// Messages of the delegator.
pub(crate) enum DelegatorMsg {
    /// Start a job; replies at once with where its answer will arrive, or
    /// with the reason it cannot start.
    Delegate {
        job: Job,
        reply: RpcReplyPort<Result<Answer, ToolError>>,
    },
}

impl ractor::Message for DelegatorMsg {}

/// What outlives one instance of the delegator.
pub(crate) struct DelegatorShared {
    /// Local agents by name.
    local: HashMap<String, AgentHandle>,
    /// Agents hosted by other nodes of the cluster, found there at each call.
    remote: Vec<String>,
    max_depth: u32,
    timeouts: Timeouts,
    /// Times the supervisor restarted the delegator.
    pub(crate) restarts: AtomicU32,
    /// Each local agent's tools, to tell whether its answer may carry
    /// untrusted content; given once, when the runtime starts.
    tools: OnceLock<HashMap<String, ToolBridgeHandle>>,
}

impl DelegatorShared {
    pub(crate) fn new(
        local: &[AgentHandle],
        remote: Vec<String>,
        max_depth: u32,
        timeouts: Timeouts,
    ) -> Arc<Self> {
        Arc::new(Self {
            local: local
                .iter()
                .map(|a| (a.name().to_string(), a.clone()))
                .collect(),
            remote,
            max_depth,
            timeouts,
            restarts: AtomicU32::new(0),
            tools: OnceLock::new(),
        })
    }

    /// Gives the delegator each local agent's tools (by agent name), so
    /// that a delegation tool is marked when its sub-agent sees a tool that
    /// brings untrusted content. Only the first call counts.
    // The supervisor calls it when it builds the delegator; without it (in
    // some tests) local sub-agents count by their own sub-agents alone.
    pub(crate) fn know_tools(&self, tools: HashMap<String, ToolBridgeHandle>) {
        let _ = self.tools.set(tools);
    }

    /// Whether `agent`'s answer may carry untrusted content (the rule of
    /// [`delegation_tool`]). A local agent whose tools were not given
    /// counts by its sub-agents alone.
    pub(crate) async fn brings_untrusted(&self, agent: &str) -> bool {
        let mut pending = vec![agent.to_string()];
        let mut seen = HashSet::new();
        while let Some(name) = pending.pop() {
            if !seen.insert(name.clone()) {
                continue;
            }
            let Some(local) = self.local.get(&name) else {
                if self.remote.contains(&name) {
                    return true;
                }
                continue;
            };
            if let Some(bridge) = self.tools.get().and_then(|tools| tools.get(&name))
                && bridge
                    .list_tools()
                    .await
                    .iter()
                    .any(|tool| tool.annotations.untrusted_content)
            {
                return true;
            }
            pending.extend(
                local
                    .shared
                    .config
                    .profile
                    .sub_agents
                    .iter()
                    .map(|sub| sub.name.clone()),
            );
        }
        false
    }

    /// What `agent`'s own tools say about a delegation to it: whether it
    /// only reads (every tool it sees is read-only), and whether it acts
    /// on ids (every tool it sees that changes things requires an
    /// identifier argument, and it has one). `None` when its tools are not
    /// known (a remote agent, or tools not given).
    pub(crate) async fn shape_of(&self, agent: &str) -> Option<DelegateShape> {
        let bridge = self.tools.get()?.get(agent)?;
        let tools = bridge.list_tools().await;
        if tools.is_empty() {
            return None;
        }
        let actions: Vec<&ToolDefinition> =
            tools.iter().filter(|t| !t.annotations.read_only).collect();
        let requires_id = |tool: &ToolDefinition| {
            tool.input_schema
                .get("required")
                .and_then(Value::as_array)
                .is_some_and(|r| {
                    r.iter()
                        .filter_map(Value::as_str)
                        .any(wma_agent::is_identifier_key)
                })
        };
        Some(DelegateShape {
            read_only: actions.is_empty(),
            needs_id: !actions.is_empty() && actions.iter().all(|t| requires_id(t)),
        })
    }
}

/// What a sub-agent's tools say about delegating to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DelegateShape {
    /// Every tool it sees only reads: the delegation is a lookup.
    pub(crate) read_only: bool,
    /// Every tool it sees that changes things needs an identifier.
    pub(crate) needs_id: bool,
}

/// The delegation tool for an agent of this shape: one that only reads is
/// marked read-only; one that acts on ids takes the `id` with the task
/// (optional in the schema, since a task may name it; the small-model
/// policy's `ground_delegation` holds the delegation back until an id was
/// shown and then has it name one), so "add it to the cart" can say what
/// "it" is.
fn shaped(mut tool: ToolDefinition, shape: DelegateShape) -> ToolDefinition {
    tool.annotations.read_only = shape.read_only;
    if shape.needs_id
        && let Some(props) = tool
            .input_schema
            .get_mut("properties")
            .and_then(Value::as_object_mut)
    {
        props.insert(
            DELEGATION_ID.to_string(),
            json!({
                "type": "string",
                "description": "The id of what the task is about."
            }),
        );
    }
    tool
}

/// The argument that carries the identifier a delegation is about.
const DELEGATION_ID: &str = "id";

pub(crate) struct DelegatorActor;

impl Actor for DelegatorActor {
    type Msg = DelegatorMsg;
    type State = Arc<DelegatorShared>;
    type Arguments = Arc<DelegatorShared>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        shared: Arc<DelegatorShared>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(shared)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        shared: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            DelegatorMsg::Delegate { job, reply } => {
                let _ = reply.send(begin(shared, job));
            }
        }
        Ok(())
    }
}

/// Checks the job, then runs it on a task the parent's run tracks: a
/// sub-agent's run takes as long as its model does, and the delegator must
/// keep taking jobs meanwhile.
fn begin(shared: &Arc<DelegatorShared>, job: Job) -> Result<Answer, ToolError> {
    if job.depth > shared.max_depth {
        return Err(ToolError::new(
            ToolErrorCode::Denied,
            format!(
                "`{}` cannot hand work to `{}`: delegation nests at most {} levels deep here",
                job.from, job.to, shared.max_depth
            ),
        ));
    }
    let target = if let Some(agent) = shared.local.get(&job.to) {
        Target::Local(agent.clone())
    } else if shared.remote.contains(&job.to) {
        Target::Remote(cluster::find_agent(&job.to).ok_or_else(|| {
            ToolError::new(
                ToolErrorCode::Unavailable,
                format!(
                    "the agent `{}` runs on another node, and no connected node offers it right now",
                    job.to
                ),
            )
        })?)
    } else {
        return Err(ToolError::new(
            ToolErrorCode::UnknownTool,
            format!("there is no agent named `{}` to hand work to", job.to),
        ));
    };
    let (reply, answer) = oneshot::channel();
    let span = job.span.clone();
    let children = job.children.clone();
    let timeouts = shared.timeouts;
    let max_depth = shared.max_depth;
    let mut job = job;
    job.sink = in_sub_run(job.sink.clone(), job.ordinal, &children);
    children.spawn(
        async move {
            let sink = job.sink.clone();
            let result = match target {
                Target::Local(agent) => run_local(agent, job).await,
                Target::Remote(endpoint) => {
                    cluster::run_remote(endpoint, job, timeouts, max_depth).await
                }
            };
            // A closed channel: the parent's run is over, nobody waits.
            let _ = sink.send(Relay::Answer { reply, result }).await;
        }
        .instrument(span),
    );
    Ok(answer)
}

/// A sink for one delegation's relay that passes everything on to `sink`
/// in order, each part marked as the `ordinal`-th delegation's (its
/// [`TaggedPart::sub_run`] gets the ordinal in front), whether the
/// sub-agent runs here or on another node. A peer's sub-run id that is not
/// one this runtime writes is dropped: the part then reads as the remote
/// sub-agent run's own.
fn in_sub_run(
    sink: mpsc::Sender<Relay>,
    ordinal: u64,
    children: &TaskTracker,
) -> mpsc::Sender<Relay> {
    let (relay, mut relayed) = mpsc::channel(RUN_PART_BUFFER);
    children.spawn(async move {
        while let Some(item) = relayed.recv().await {
            let item = match item {
                Relay::Part(mut part) => {
                    if !part.sub_run.is_empty() && !is_sub_run(&part.sub_run) {
                        part.sub_run.clear();
                    }
                    Relay::Part(part.in_sub_run(ordinal))
                }
                answer @ Relay::Answer { .. } => answer,
            };
            // A closed channel: the parent's run is over; dropping
            // `relayed` tells the sub-agent's relay so.
            if sink.send(item).await.is_err() {
                break;
            }
        }
    });
    relay
}

tokio::task_local! {
    /// The sub-run id of the sub-agent run whose approver call is under
    /// way, relative to the delegations wrapped so far (see
    /// [`SubRunApprover`]).
    static SUB_RUN: String;
}

/// The sub-run id ([`TaggedPart::sub_run`]) of the run whose call to its
/// approver is under way: `""` for the run the host started, and outside
/// such a call.
pub(crate) fn current_sub_run() -> String {
    SUB_RUN.try_with(Clone::clone).unwrap_or_default()
}

/// The approver of a sub-agent run that a parent's `ordinal`-th delegation
/// started: the parent's own, asked with the sub-run's id in scope, so
/// that the host's approver tells two runs of one sub-agent apart
/// ([`TaggedPart::current_sub_run`]). Each level of delegation wraps the
/// one above; the deepest is called first, and each puts its ordinal in
/// front of what the levels below set, as the relay does with parts.
struct SubRunApprover {
    inner: Arc<dyn Approver>,
    ordinal: u64,
}

impl SubRunApprover {
    fn sub_run(&self) -> String {
        sub_run_within(self.ordinal, &current_sub_run())
    }
}

#[async_trait]
impl Approver for SubRunApprover {
    async fn ask(&self, request: ApprovalRequest) -> ApprovalAnswer {
        SUB_RUN.scope(self.sub_run(), self.inner.ask(request)).await
    }

    fn remembered(&self, agent: &str, tool: &str) -> Option<ApprovalAnswer> {
        SUB_RUN.sync_scope(self.sub_run(), || self.inner.remembered(agent, tool))
    }

    async fn before_call(&self, call: &CallRecordRequest) -> Result<Option<String>, String> {
        SUB_RUN
            .scope(self.sub_run(), self.inner.before_call(call))
            .await
    }
}

/// A delegation's approvals: the parent's rules, and its approver asked
/// as the sub-agent run's ([`SubRunApprover`]).
fn sub_run_approvals(parent: &RunApprovals, ordinal: u64) -> RunApprovals {
    RunApprovals {
        approver: parent
            .approver
            .clone()
            .map(|inner| Arc::new(SubRunApprover { inner, ordinal }) as Arc<dyn Approver>),
        rules: parent.rules.clone(),
    }
}

/// Where a sub-agent runs.
enum Target {
    Local(AgentHandle),
    Remote(ActorRef<cluster::EndpointMsg>),
}

/// Runs a local sub-agent, passing its parts on to the parent's host.
async fn run_local(agent: AgentHandle, job: Job) -> Result<String, ToolError> {
    let mut run = agent
        .start_with(
            vec![ChatMessage::user(job.task.clone())],
            job.cancel.clone(),
            job.depth,
            sub_run_approvals(&job.approvals, job.ordinal),
        )
        .await
        .map_err(|e| refused(&job.to, &e))?;
    let mut answer = FinalAnswer::new(&job.to);
    while let Some(part) = run.next_tagged().await {
        answer.observe(&part);
        if job.sink.send(Relay::Part(part.nested())).await.is_err() {
            // The parent's run is gone: dropping this run stops it.
            break;
        }
    }
    answer.finish()
}

/// A sub-agent that could not start, as the tool error its parent reads.
pub(crate) fn refused(agent: &str, error: &RuntimeError) -> ToolError {
    ToolError::new(
        ToolErrorCode::Unavailable,
        format!("the agent `{agent}` could not take the task: {error}"),
    )
}

/// Reads a sub-agent's parts and makes its final answer: the text of its
/// last step, or the error its run ended with.
pub(crate) struct FinalAnswer {
    agent: String,
    texts: Vec<String>,
    end: Option<AgentStreamPart>,
}

impl FinalAnswer {
    pub(crate) fn new(agent: &str) -> Self {
        Self {
            agent: agent.to_string(),
            texts: Vec::new(),
            end: None,
        }
    }

    /// Takes one part of the sub-agent's stream (its own sub-agents' parts
    /// are not its answer).
    pub(crate) fn observe(&mut self, part: &TaggedPart) {
        if part.depth != 0 {
            return;
        }
        match &part.part {
            AgentStreamPart::MessageStart { .. } => self.texts.clear(),
            AgentStreamPart::Text { text } => self.texts.push(text.clone()),
            end @ (AgentStreamPart::Finish { .. } | AgentStreamPart::Error { .. }) => {
                self.end = Some(end.clone());
            }
            _ => {}
        }
    }

    pub(crate) fn finish(self) -> Result<String, ToolError> {
        let agent = self.agent;
        match self.end {
            Some(AgentStreamPart::Finish {
                reason: FinishReason::Aborted,
            }) => Err(ToolError::new(
                ToolErrorCode::Cancelled,
                format!("the agent `{agent}` was stopped before it answered"),
            )),
            Some(AgentStreamPart::Error { message }) => Err(ToolError::new(
                ToolErrorCode::ToolFailed,
                format!("the agent `{agent}` failed: {message}"),
            )),
            // A helper that did not finish has no answer to hand on: its
            // last words ("I stopped because I was going in circles") are
            // the loop's, not an answer, and a parent that passed them on
            // stored them as a fact.
            Some(AgentStreamPart::Finish {
                reason:
                    why @ (FinishReason::MaxSteps | FinishReason::Loop | FinishReason::Unrepaired),
            }) => Err(ToolError::new(
                ToolErrorCode::ToolFailed,
                format!(
                    "the agent `{agent}` did not finish its task: {}",
                    match why {
                        FinishReason::MaxSteps => "it ran out of steps",
                        FinishReason::Loop => "it kept repeating the same call",
                        _ => "it could not make a valid tool call",
                    }
                ),
            )),
            Some(_) if self.texts.is_empty() => Err(ToolError::new(
                ToolErrorCode::ToolFailed,
                format!("the agent `{agent}` finished without an answer"),
            )),
            Some(_) => Ok(self.texts.join("\n")),
            None => Err(ToolError::new(
                ToolErrorCode::Unavailable,
                format!("the run of the agent `{agent}` ended without a finish"),
            )),
        }
    }
}

/// A handle to the delegator.
#[derive(Clone)]
pub(crate) struct DelegatorHandle {
    pub(crate) slot: Arc<Slot<DelegatorMsg>>,
    pub(crate) shared: Arc<DelegatorShared>,
}

impl DelegatorHandle {
    pub(crate) fn max_depth(&self) -> u32 {
        self.shared.max_depth
    }

    #[allow(dead_code)]
    pub(crate) fn restarts(&self) -> u32 {
        self.shared.restarts.load(Ordering::SeqCst)
    }

    async fn begin(&self, job: Job) -> Result<Answer, ToolError> {
        let timeouts = self.shared.timeouts;
        self.slot
            .call(
                |reply| DelegatorMsg::Delegate {
                    job: job.clone(),
                    reply,
                },
                timeouts.control,
                timeouts.restart_wait,
            )
            .await
            .unwrap_or_else(|error| Err(refused(&job.to, &error)))
    }
}

/// What one run may delegate: its sub-agents, and where their parts go.
pub(crate) struct DelegationScope {
    pub(crate) delegator: DelegatorHandle,
    /// The delegating agent.
    pub(crate) agent: String,
    pub(crate) sub_agents: Vec<SubAgentInfo>,
    /// The delegating run's depth.
    pub(crate) depth: u32,
    pub(crate) sink: mpsc::Sender<Relay>,
    pub(crate) children: TaskTracker,
    /// How many of the run's calls to sub-agents have reached the host. A
    /// delegation starts only once its own call has: the loop announces a
    /// call before it makes it, and the sub-agent's first part must not
    /// overtake that announcement on its way to the host.
    pub(crate) announced: watch::Receiver<u64>,
    /// Calls to sub-agents made so far.
    pub(crate) made: AtomicU64,
    /// The run's approvals, which its sub-agents' runs ask too.
    pub(crate) approvals: RunApprovals,
}

/// The tools one run sees: its sub-agents first, then its tool sources'
/// tools (a source tool named like a sub-agent is hidden, so the name
/// always means the agent).
pub(crate) struct RunTools {
    bridge: ToolBridgeHandle,
    delegation: Option<DelegationScope>,
}

impl RunTools {
    pub(crate) fn new(bridge: ToolBridgeHandle, delegation: Option<DelegationScope>) -> Self {
        Self { bridge, delegation }
    }

    fn sub_agent(&self, name: &str) -> Option<&DelegationScope> {
        self.delegation
            .as_ref()
            .filter(|d| d.sub_agents.iter().any(|s| s.name == name))
    }
}

#[async_trait]
impl ToolHost for RunTools {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        let mut tools = Vec::new();
        if let Some(scope) = &self.delegation {
            for sub in &scope.sub_agents {
                let mut tool = delegation_tool(sub);
                if let Some(shape) = scope.delegator.shared.shape_of(&sub.name).await {
                    tool = shaped(tool, shape);
                }
                // Marked, the sub-agent's answer is delimited in the
                // parent's prompt as data, like any untrusted result.
                tool.annotations.untrusted_content =
                    scope.delegator.shared.brings_untrusted(&sub.name).await;
                tools.push(tool);
            }
        }
        let own = self.bridge.list_tools().await;
        tools.extend(
            own.into_iter()
                .filter(|t| self.sub_agent(&t.name).is_none()),
        );
        tools
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

    /// A source's tool gets the call's context (its idempotency key); a
    /// sub-agent takes none: its run records its own calls.
    async fn call_tool_with(
        &self,
        name: &str,
        arguments: Value,
        context: &CallContext,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let Some(scope) = self.sub_agent(name) else {
            return self
                .bridge
                .call_tool_with(name, arguments, context, cancel)
                .await;
        };
        let Some(task) = arguments
            .get("task")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty())
        else {
            return Err(ToolError::new(
                ToolErrorCode::InvalidArguments,
                format!("{name} needs a task: {{\"task\": \"<what it should do>\"}}"),
            ));
        };
        // This is the n-th call to a sub-agent; its announcement is the n-th
        // one the host sees.
        let n = scope.made.fetch_add(1, Ordering::SeqCst) + 1;
        let mut announced = scope.announced.clone();
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                return Err(ToolError::new(
                    ToolErrorCode::Cancelled,
                    format!("the task for `{name}` was cancelled"),
                ));
            }
            seen = announced.wait_for(|count| *count >= n) => {
                if seen.is_err() {
                    return Err(ToolError::new(
                        ToolErrorCode::Cancelled,
                        format!("the run ended before the task for `{name}` started"),
                    ));
                }
            }
        }
        // The id the task is about goes with it, unless the task names it.
        let task = match arguments.get(DELEGATION_ID).and_then(Value::as_str) {
            Some(id) if !id.trim().is_empty() && !task.contains(id.trim()) => {
                format!("{task} ({})", id.trim())
            }
            _ => task.to_string(),
        };
        let job = Job {
            from: scope.agent.clone(),
            to: name.to_string(),
            task,
            depth: scope.depth + 1,
            ordinal: n,
            cancel: cancel.clone(),
            sink: scope.sink.clone(),
            children: scope.children.clone(),
            span: Span::current(),
            approvals: scope.approvals.clone(),
        };
        let answer = scope.delegator.begin(job).await?;
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(ToolError::new(
                ToolErrorCode::Cancelled,
                format!("the task for `{name}` was cancelled"),
            )),
            answer = answer => answer.unwrap_or_else(|_| Err(ToolError::new(
                ToolErrorCode::Unavailable,
                format!("the run of the agent `{name}` went away without an answer"),
            ))),
        }
    }

    async fn page_context(&self) -> Option<PageContext> {
        self.bridge.page_context().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AgentConfig, ProviderSource, RuntimeBuilder, ToolSource};
    use wma_agent::ToolAnnotations;
    use wma_testkit::{InMemoryToolHost, ScriptedProvider};

    /// A source with one tool, marked as bringing untrusted content or not.
    fn source(name: &'static str, untrusted: bool) -> ToolSource {
        ToolSource::new(name, move || {
            let host = InMemoryToolHost::new();
            host.add(
                ToolDefinition::new(format!("{name}_tool"), "A tool.", json!({"type": "object"}))
                    .with_annotations(ToolAnnotations {
                        untrusted_content: untrusted,
                        ..ToolAnnotations::default()
                    }),
                |_| Ok("done".to_string()),
            );
            host
        })
    }

    #[tokio::test]
    async fn a_sub_agent_that_sees_untrusted_content_brings_it() {
        let runtime = RuntimeBuilder::new()
            .provider(
                "small",
                ProviderSource::shared(Arc::new(ScriptedProvider::new(["Hi."]))),
            )
            .tool_source(source("web", true))
            .tool_source(source("math", false))
            .remote_agent("far", "Lives elsewhere.")
            .agent(AgentConfig::new("reader").with_tool_sources(["web"]))
            .agent(AgentConfig::new("calc").with_tool_sources(["math"]))
            .agent(
                AgentConfig::new("boss")
                    .with_tool_sources(["math"])
                    .with_sub_agents(["reader"]),
            )
            .agent(
                AgentConfig::new("envoy")
                    .with_tool_sources(["math"])
                    .with_sub_agents(["far"]),
            )
            .start()
            .await
            .unwrap();
        let shared = DelegatorShared::new(
            runtime.agents(),
            vec!["far".to_string()],
            DEFAULT_MAX_DELEGATION_DEPTH,
            Timeouts::default(),
        );
        // Without the local agents' tools, only remote agents count.
        assert!(!shared.brings_untrusted("reader").await);
        assert!(shared.brings_untrusted("far").await);
        assert!(shared.brings_untrusted("envoy").await);

        shared.know_tools(
            runtime
                .agents()
                .iter()
                .map(|a| (a.name().to_string(), runtime.tools_of(a.name()).unwrap()))
                .collect(),
        );
        assert!(shared.brings_untrusted("reader").await);
        assert!(!shared.brings_untrusted("calc").await);
        // Through its own sub-agent.
        assert!(shared.brings_untrusted("boss").await);
        runtime.shutdown().await;
    }
}
