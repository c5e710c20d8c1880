//! What a run, the delegator and the cluster exchange to delegate.
//!
//! A run sees each of its sub-agents as a tool ([`RunTools`]); calling one
//! makes a [`Job`] for the delegator, which runs the sub-agent here or on
//! another node and sends its parts, then its answer, back as [`Relay`]s.
//! The agent actor sits below the delegator (the delegator starts agents'
//! runs), so a run reaches the delegator through the [`Delegate`] trait,
//! not through its handle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Span;
use wma_agent::{
    AgentStreamPart, ApprovalRule, Approver, CallContext, FinishReason, PageContext, SubAgentInfo,
    ToolDefinition, ToolError, ToolErrorCode, ToolHost,
};

use crate::bridge::ToolBridgeHandle;
use crate::error::RuntimeError;
use crate::part::TaggedPart;

/// How one run asks for approvals: the host's approver and the run's own
/// rules, which only tighten the agent's policy
/// ([`LocalLoopOptions::approval`](wma_agent::LocalLoopOptions::approval)).
/// Sub-agents' runs started by the run ask the same approver under the
/// same rules. The default asks nobody: calls that would ask run (a
/// `deny` still denies).
#[derive(Clone, Default)]
pub struct RunApprovals {
    /// Where calls that need approval are asked about.
    pub approver: Option<Arc<dyn Approver>>,
    /// The run's own rules.
    pub rules: Vec<ApprovalRule>,
}

impl RunApprovals {
    /// Asks `approver`, under the agent's policy alone.
    pub fn asking(approver: Arc<dyn Approver>) -> Self {
        Self {
            approver: Some(approver),
            rules: Vec::new(),
        }
    }

    /// The same, with these rules of the run's own.
    pub fn with_rules(mut self, rules: impl IntoIterator<Item = ApprovalRule>) -> Self {
        self.rules.extend(rules);
        self
    }
}

impl std::fmt::Debug for RunApprovals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunApprovals")
            .field("approver", &self.approver.is_some())
            .field("rules", &self.rules)
            .finish()
    }
}

/// What a run needs of the delegator. The delegator's handle implements
/// it; a run holds it as this trait because the delegator, which starts
/// agents' runs, sits above the agent actor.
#[async_trait]
pub(crate) trait Delegate: Send + Sync {
    /// How deep delegation may nest: a run at this depth is not offered
    /// its sub-agents.
    fn max_depth(&self) -> u32;

    /// Hands `job` to the delegator: where its answer will arrive, or why
    /// it cannot start.
    async fn begin(&self, job: Job) -> Result<Answer, ToolError>;

    /// What `agent`'s own tools say about a delegation to it; `None` when
    /// its tools are not known (a remote agent, or tools not given).
    async fn shape_of(&self, agent: &str) -> Option<DelegateShape>;

    /// Whether `agent`'s answer may carry untrusted content (the rule of
    /// [`delegation_tool`]).
    async fn brings_untrusted(&self, agent: &str) -> bool;
}

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
                reason: why @ (FinishReason::MaxSteps | FinishReason::Loop),
            }) => Err(ToolError::new(
                ToolErrorCode::ToolFailed,
                format!(
                    "the agent `{agent}` did not finish its task: {}",
                    match why {
                        FinishReason::MaxSteps => "it ran out of steps",
                        _ => "it kept repeating the same call",
                    }
                ),
            )),
            // An unrepaired run's last words say what went wrong (the call
            // that failed and its error, or that no valid call came): the
            // error hands them on as the reason, never as an answer.
            Some(AgentStreamPart::Finish {
                reason: FinishReason::Unrepaired,
            }) => Err(ToolError::new(
                ToolErrorCode::ToolFailed,
                format!(
                    "the agent `{agent}` did not finish its task: {}",
                    self.texts
                        .last()
                        .map_or("it could not make a valid tool call", |t| t.as_str())
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

/// What one run may delegate: its sub-agents, and where their parts go.
pub(crate) struct DelegationScope {
    /// Where the run's jobs go.
    pub(crate) delegator: Arc<dyn Delegate>,
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
                if let Some(shape) = scope.delegator.shape_of(&sub.name).await {
                    tool = shaped(tool, shape);
                }
                // Marked, the sub-agent's answer is delimited in the
                // parent's prompt as data, like any untrusted result.
                tool.annotations.untrusted_content =
                    scope.delegator.brings_untrusted(&sub.name).await;
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
