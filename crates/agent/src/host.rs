//! The tool host trait and the request a run is started with.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::approval::{ApprovalRule, Approver};
use crate::error::ToolError;
use crate::message::ChatMessage;
use crate::tool::{AgentProfile, PageContext, ToolDefinition};

/// Where tools come from: a web page, MCP servers, Rust functions, or all of
/// them behind a bridge. The loop lists tools fresh at every step, because a
/// page's tools change as it navigates.
#[async_trait]
pub trait ToolHost: Send + Sync {
    /// The tools offered right now.
    async fn list_tools(&self) -> Vec<ToolDefinition>;

    /// Runs one tool. The arguments were validated against its schema
    /// already, by the loop or by the tool set the call went through.
    /// Returns the output text, or a coded error.
    async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<String, ToolError>;

    /// Runs one tool with what the host knows of the call besides its
    /// arguments: the idempotency key it was recorded under before it was
    /// sent, for sources that accept one. The loop calls this; the default
    /// is [`call_tool`](Self::call_tool), for hosts whose sources take no
    /// key. A host that passes calls on to other hosts passes the context
    /// on with them.
    async fn call_tool_with(
        &self,
        name: &str,
        arguments: Value,
        context: &CallContext,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let _ = context;
        self.call_tool(name, arguments, cancel).await
    }

    /// The page the person is on, when the tools belong to a page.
    async fn page_context(&self) -> Option<PageContext> {
        None
    }

    /// Whether this host runs every call through the one tool path itself
    /// (allow and deny, argument validation, a time limit, a panic guard:
    /// a `wma_tools::ToolSet` does). A host that holds it as a source then
    /// passes calls straight on instead of checking and timing each call a
    /// second time. Default: false, the host is a plain source.
    fn guards_calls(&self) -> bool {
        false
    }
}

#[async_trait]
impl<H: ToolHost + ?Sized> ToolHost for Arc<H> {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        (**self).list_tools().await
    }
    async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        (**self).call_tool(name, arguments, cancel).await
    }
    async fn call_tool_with(
        &self,
        name: &str,
        arguments: Value,
        context: &CallContext,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        (**self)
            .call_tool_with(name, arguments, context, cancel)
            .await
    }
    async fn page_context(&self) -> Option<PageContext> {
        (**self).page_context().await
    }
    fn guards_calls(&self) -> bool {
        (**self).guards_calls()
    }
}

/// What goes with one call to its source besides the tool's name and
/// arguments.
///
/// Made with [`CallContext::new`] and the `with_` methods (more may come,
/// so it cannot be written as a literal outside this crate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallContext {
    /// The key the host recorded the call under before sending it
    /// ([`Approver::before_call`]): a source that accepts one can tell a
    /// call sent twice from two calls. `None` for calls nobody recorded
    /// (read-only and other tools that need no record, hosts that keep
    /// none).
    pub idempotency_key: Option<String>,
    /// Set by the loop, which validates every call's arguments against the
    /// schema the model was shown before it sends the call (it needs the
    /// validation error for its repair message). A tool set that gets a
    /// call so marked does not validate it again.
    arguments_checked: bool,
}

impl CallContext {
    /// A context with nothing in it.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same context carrying the call's idempotency key.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// The call's idempotency key, when the host recorded it.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.idempotency_key.as_deref()
    }

    /// The same context, marking the call's arguments as validated against
    /// the tool's schema already. Only the loop, which validated them,
    /// should mark a call; any other caller leaves the validation to the
    /// tool set.
    pub fn with_arguments_checked(mut self) -> Self {
        self.arguments_checked = true;
        self
    }

    /// Whether the call's arguments were validated already (see
    /// [`CallContext::with_arguments_checked`]).
    pub fn arguments_checked(&self) -> bool {
        self.arguments_checked
    }
}

/// What a host hands the loop to start a run.
#[derive(Clone)]
pub struct AgentRunRequest {
    /// The conversation so far; normally it ends with the person's message.
    pub messages: Vec<ChatMessage>,
    /// Where the tools come from.
    pub tools: Arc<dyn ToolHost>,
    /// Stop: cancelling it ends the run with finish `aborted`.
    pub cancel: CancellationToken,
    /// The agent the page or host describes; wins for max steps and instructions.
    pub agent: Option<AgentProfile>,
    /// Where calls that need approval are asked about. `None`: nobody is
    /// asked and calls the policy would ask about run (the loop as it was
    /// before approvals; a `deny` still denies).
    pub approver: Option<Arc<dyn Approver>>,
    /// This run's own approval rules (a request's, a command line's):
    /// they can only make the agent's policy stricter, never looser.
    pub approval_rules: Vec<ApprovalRule>,
}

impl AgentRunRequest {
    /// A request with the given messages and tools, a fresh cancellation token and no profile.
    pub fn new(messages: Vec<ChatMessage>, tools: Arc<dyn ToolHost>) -> Self {
        Self {
            messages,
            tools,
            cancel: CancellationToken::new(),
            agent: None,
            approver: None,
            approval_rules: Vec::new(),
        }
    }

    /// The same request, asking `approver` about calls that need approval.
    pub fn with_approver(mut self, approver: Arc<dyn Approver>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// The same request with rules of its own that tighten the policy.
    pub fn with_approval_rules(mut self, rules: impl IntoIterator<Item = ApprovalRule>) -> Self {
        self.approval_rules.extend(rules);
        self
    }
}

impl std::fmt::Debug for AgentRunRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRunRequest")
            .field("messages", &self.messages)
            .field("cancel", &self.cancel.is_cancelled())
            .field("agent", &self.agent)
            .field("approver", &self.approver.is_some())
            .field("approval_rules", &self.approval_rules)
            .finish_non_exhaustive()
    }
}
