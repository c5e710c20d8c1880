//! Supervised actors that host webmcp-agents, built on [`ractor`].
//!
//! A [`Runtime`] is a supervisor with these children, each reached through a
//! cheap, cloneable handle whose calls all have time limits:
//!
//! - the **provider actor** ([`ProviderHandle`]) owns one model and serves
//!   generate, fits and info. [`ProviderHandle::swap`] prepares another model
//!   while the current one keeps serving, then switches in one step:
//!   generations already running finish on the old model, every later
//!   request goes to the new one, and a model that fails to load leaves the
//!   old one serving. Inference never runs inside a handler; it runs on a
//!   task that the caller's cancellation token ends.
//! - the **tool bridge** ([`ToolBridgeHandle`]) owns the tool sources, merges
//!   their tools through `wma-tools`' rules for what may be offered
//!   ([`admit_tools`](wma_tools::admit_tools): identifier names, size caps;
//!   the source registered first wins a name clash) in one
//!   [`ToolSet`](wma_tools::ToolSet), the one path of every call: allow
//!   and deny, arguments validated against the tool's schema before
//!   dispatch, a time limit per call
//!   ([`DEFAULT_CALL_TIMEOUT`](wma_tools::DEFAULT_CALL_TIMEOUT) unless
//!   the source or [`RuntimeBuilder::tool_timeout`] says otherwise), and a
//!   panic guard. The actor itself only moves each request onto a task and
//!   relays the answer.
//! - one **agent actor** per [`AgentConfig`] ([`AgentHandle`]) takes Run and
//!   Stop, and runs the very [`run_local_agent`](wma_agent::run_local_agent)
//!   of `wma-agent` against the two handles above, which implement the
//!   loop's [`Provider`](wma_agent::Provider) and
//!   [`ToolHost`](wma_agent::ToolHost) traits. Each agent admits at most
//!   [`DEFAULT_MAX_CONCURRENT_RUNS`] runs at once; one more is refused with
//!   [`RuntimeError::Busy`] (ractor's mailboxes are unbounded, so the limit is
//!   enforced here).
//!
//! Agents **delegate**: an agent whose profile names sub-agents sees each
//! of them as a tool (named after it, taking `{"task": "..."}`), served by
//! the **delegator actor**. Calling it runs the sub-agent with its own
//! provider, tools and instructions, and its final answer comes back as the
//! tool result. The parent's [`RunStream`] carries the sub-agent's parts as
//! [`TaggedPart`]s (agent name and depth), the sub-agent's `invoke_agent`
//! span nests under the parent's `execute_tool` span, Stop on the parent
//! stops the sub-agent's run, and nesting is limited to
//! [`DEFAULT_MAX_DELEGATION_DEPTH`] levels. An agent may name several
//! providers and tool sources ([`RuntimeBuilder::provider`],
//! [`AgentConfig::tool_sources`]); a sub-agent sees only its own tools.
//! With a [`ClusterNode`], a sub-agent may live in another process
//! (`ractor_cluster`).
//!
//! The supervisor restarts a child that crashed, within a
//! [`RestartBudget`] ([`DEFAULT_MAX_RESTARTS`] restarts per
//! [`DEFAULT_RESTART_WINDOW`]). A model that panics mid-generation ends the
//! affected run with the loop's provider-failure error, and the provider
//! actor comes back with the same model; a tool source that panics fails
//! that call with `unavailable`, and the bridge's set makes that source
//! afresh, within a budget of the same size (the one [`RestartBudget`] type
//! of `wma-tools`). Handles find the restarted actor by themselves.
//!
//! Every message that starts work carries the caller's tracing span, so the
//! loop's `chat` and `execute_tool` spans stay the parents of whatever the
//! provider or the tool source traces, across the hop through the actors.
//! `docs/runtime.md` has the details.
//!
//! ```
//! use std::sync::Arc;
//! use wma_agent::{AgentStreamPart, ChatMessage};
//! use wma_runtime::{AgentConfig, ProviderSource, Runtime, ToolSource};
//! use wma_testkit::{InMemoryToolHost, ScriptedProvider};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), wma_runtime::RuntimeError> {
//! let model = ScriptedProvider::new(["Paris."]);
//! let runtime = Runtime::builder(ProviderSource::new(move || model.clone()))
//!     .tool_source(ToolSource::shared("page", Arc::new(InMemoryToolHost::new())))
//!     .agent(AgentConfig::new("helper"))
//!     .start()
//!     .await?;
//! let run = runtime.agent("helper")?.run(vec![ChatMessage::user("Capital of France?")]).await?;
//! let parts = run.collect_parts().await;
//! assert_eq!(parts[1], AgentStreamPart::Text { text: "Paris.".into() });
//! runtime.shutdown().await;
//! # Ok(()) }
//! ```

mod agent;
mod bridge;
mod cluster;
mod delegation;
mod delegator;
mod error;
mod outcome;
mod part;
mod provider;
mod remote;
mod slot;
mod supervisor;
mod timeouts;

pub use agent::{
    AgentConfig, AgentHandle, DEFAULT_MAX_CONCURRENT_RUNS, RunId, RunStream, TaggedStream,
    check_request,
};
pub use bridge::{ToolBridgeHandle, ToolSource};
pub use cluster::{
    ClusterGuards, ClusterNode, ClusterOptions, DEFAULT_CLUSTER_LISTEN, DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_FRAME, DEFAULT_MAX_PENDING_HANDSHAKES, DEFAULT_NODE_NAME,
    DEFAULT_PRE_AUTH_MAX_FRAME, MIN_COOKIE_BITS, MIN_COOKIE_CHARS, RECONNECT_FIRST, RECONNECT_MAX,
    REMOTE_RUN_IDLE, SessionCounts, cookie_problems, listen_warning,
};
pub use delegation::{RunApprovals, delegation_tool};
pub use delegator::DEFAULT_MAX_DELEGATION_DEPTH;
pub use error::RuntimeError;
pub use outcome::RunOutcome;
pub use part::{RUN_PART_BUFFER, TaggedPart};
pub use provider::{ProviderHandle, ProviderSource};
pub use remote::{CLUSTER_SCOPE, NEXT_BATCH, NEXT_WAIT};
pub use supervisor::{DEFAULT_PROVIDER, Runtime, RuntimeBuilder};
pub use timeouts::{DEFAULT_SWAP_TIMEOUT, Timeouts};
pub use wma_tools::{DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_WINDOW, RestartBudget};
