//! The delegator actor: each sub-agent is a tool of its parent.
//!
//! A parent's run sees one tool per sub-agent, named after it, taking
//! `{"task": "..."}`. Calling it starts the sub-agent's own run (its own
//! provider, tools and instructions) with the task as the user's message;
//! the sub-agent's parts reach the parent's host tagged with the
//! sub-agent's name, and its final answer comes back as the tool result.
//!
//! The tool, the jobs and what they send back are the `delegation`
//! module's, which the agent actor and the cluster share; this module is
//! the actor that takes the jobs and runs them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use wma_agent::{Approver, ChatMessage, ToolDefinition, ToolError, ToolErrorCode, ToolHost};

use crate::agent::AgentHandle;
use crate::bridge::ToolBridgeHandle;
use crate::delegation::{
    Answer, Delegate, DelegateShape, FinalAnswer, Job, Relay, RunApprovals, refused,
};
use crate::part::{RUN_PART_BUFFER, SubRunApprover, is_sub_run};
use crate::remote::{self, EndpointMsg};
use crate::slot::Slot;
use crate::timeouts::Timeouts;

/// How deep delegation may nest unless
/// [`RuntimeBuilder::max_delegation_depth`](crate::RuntimeBuilder::max_delegation_depth)
/// says otherwise: a run a host started is at depth 0, its sub-agents' runs
/// at 1, theirs at 2. A run at the limit is not offered its sub-agents.
/// Two levels let a parent hand work to a specialist that has helpers of its
/// own; deeper chains of small models mostly lose the task on the way.
pub const DEFAULT_MAX_DELEGATION_DEPTH: u32 = 2;

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
    /// [`delegation_tool`](crate::delegation_tool)). A local agent whose tools were not given
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
        Target::Remote(remote::find_agent(&job.to).ok_or_else(|| {
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
                    remote::run_remote(endpoint, job, timeouts, max_depth).await
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
/// [`TaggedPart::sub_run`](crate::TaggedPart::sub_run) gets the ordinal in front), whether the
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

/// A delegation's approvals: the parent's rules, and its approver asked
/// as the sub-agent run's ([`SubRunApprover`]).
fn sub_run_approvals(parent: &RunApprovals, ordinal: u64) -> RunApprovals {
    RunApprovals {
        approver: parent
            .approver
            .clone()
            .map(|inner| Arc::new(SubRunApprover::new(inner, ordinal)) as Arc<dyn Approver>),
        rules: parent.rules.clone(),
    }
}

/// Where a sub-agent runs.
enum Target {
    Local(AgentHandle),
    Remote(ActorRef<EndpointMsg>),
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

/// A handle to the delegator.
#[derive(Clone)]
pub(crate) struct DelegatorHandle {
    pub(crate) slot: Arc<Slot<DelegatorMsg>>,
    pub(crate) shared: Arc<DelegatorShared>,
}

impl DelegatorHandle {
    #[allow(dead_code)]
    pub(crate) fn restarts(&self) -> u32 {
        self.shared.restarts.load(Ordering::SeqCst)
    }
}

/// A run's jobs go through the delegator actor; what a run asks about its
/// sub-agents is answered from the shared state, without a message.
#[async_trait]
impl Delegate for DelegatorHandle {
    fn max_depth(&self) -> u32 {
        self.shared.max_depth
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

    async fn shape_of(&self, agent: &str) -> Option<DelegateShape> {
        self.shared.shape_of(agent).await
    }

    async fn brings_untrusted(&self, agent: &str) -> bool {
        self.shared.brings_untrusted(agent).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AgentConfig, ProviderSource, RuntimeBuilder, ToolSource};
    use serde_json::json;
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
