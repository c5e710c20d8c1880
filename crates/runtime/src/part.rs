//! Stream parts tagged with the agent they belong to, and the sub-run ids
//! that tell two runs of one sub-agent apart.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use wma_agent::{AgentStreamPart, ApprovalAnswer, ApprovalRequest, Approver, CallRecordRequest};

/// Parts a run may get ahead of its reader. A reader that falls further
/// behind slows the run down (backpressure) instead of growing memory.
pub const RUN_PART_BUFFER: usize = 64;

/// One part of a run as the host receives it: the loop's own part, and which
/// agent's run produced it. A parent's stream carries its sub-agents' parts
/// too, so a host can show who said what; the parts of one agent's run keep
/// the loop's rules (exactly one finish or error, last).
///
/// Two runs of one sub-agent inside one run number their calls alike (each
/// starts at `call_1_1`); [`sub_run`](Self::sub_run) tells them apart.
///
/// In JSON the part's own fields sit beside `agent` and `depth` (and
/// `sub_run`, for a sub-agent's part):
///
/// ```
/// use wma_agent::AgentStreamPart;
/// use wma_runtime::TaggedPart;
/// let part = TaggedPart::new("researcher", 1, AgentStreamPart::Text { text: "Found it.".into() });
/// assert_eq!(
///     serde_json::to_string(&part).unwrap(),
///     r#"{"agent":"researcher","depth":1,"type":"text","text":"Found it."}"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaggedPart {
    /// The agent whose run produced the part.
    pub agent: String,
    /// How far below the run the host started: 0 for that run's own parts,
    /// 1 for its sub-agents', 2 for theirs.
    pub depth: u32,
    /// Which sub-agent run inside the run the host started the part is
    /// from, as the delegations that started it, each numbered in its
    /// parent run: `""` for the run's own parts, `"2"` for the run its
    /// second delegation started, `"2.1"` for the run that one's first
    /// delegation started. Absent from the JSON when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_run: String,
    /// The part itself.
    #[serde(flatten)]
    pub part: AgentStreamPart,
}

impl TaggedPart {
    /// A part of `agent`'s run at `depth`.
    pub fn new(agent: impl Into<String>, depth: u32, part: AgentStreamPart) -> Self {
        Self {
            agent: agent.into(),
            depth,
            sub_run: String::new(),
            part,
        }
    }

    /// For a call's result or error: the call by (calling agent, sub-agent
    /// run, call id), as a host that records calls keys them, with the
    /// answer's text and whether it is an error. `None` for other parts.
    pub fn call_answer(&self) -> Option<((String, String, String), String, bool)> {
        let (call_id, output, is_error) = match &self.part {
            AgentStreamPart::ToolResult {
                call_id, output, ..
            } => (call_id, output.clone(), false),
            AgentStreamPart::ToolError { call_id, error, .. } => (call_id, error.to_string(), true),
            _ => return None,
        };
        let call = (self.agent.clone(), self.sub_run.clone(), call_id.clone());
        Some((call, output, is_error))
    }

    /// The terminal part of the run the host started (not of a sub-agent's).
    pub fn ends_the_run(&self) -> bool {
        self.depth == 0 && self.part.is_terminal()
    }

    /// Inside a call to the run's approver ([`wma_agent::Approver`]'s
    /// `ask`, `remembered`, `before_call`): the
    /// [`sub_run`](Self::sub_run) of the run that calls, as its parts carry
    /// it, so that a host keeping calls of sub-agent runs tells two runs of
    /// one sub-agent apart. `""` for the run the host started, and outside
    /// such a call (a task the call spawns does not see it: read it in the
    /// call itself).
    pub fn current_sub_run() -> String {
        current_sub_run()
    }

    /// The same part, one level further down: what a parent's stream
    /// carries of a sub-agent's part.
    pub(crate) fn nested(mut self) -> Self {
        self.depth += 1;
        self
    }

    /// The same part as the parent's stream carries it when the sub-agent
    /// run it is from (or one below it) was started by the parent's
    /// `ordinal`-th delegation: its [`sub_run`](Self::sub_run) gets the
    /// ordinal in front.
    pub(crate) fn in_sub_run(mut self, ordinal: u64) -> Self {
        self.sub_run = sub_run_within(ordinal, &self.sub_run);
        self
    }
}

/// The sub-run id of a run `below` (relative to the sub-agent run started
/// by a parent's `ordinal`-th delegation; `""` for that run itself), as the
/// parent sees it.
pub(crate) fn sub_run_within(ordinal: u64, below: &str) -> String {
    if below.is_empty() {
        ordinal.to_string()
    } else {
        format!("{ordinal}.{below}")
    }
}

/// Whether `id` is a sub-run id as this runtime writes them (ordinals
/// joined by dots, not too long): what a peer sends is checked with it.
pub(crate) fn is_sub_run(id: &str) -> bool {
    id.len() <= 64
        && id
            .split('.')
            .all(|n| !n.is_empty() && n.len() <= 10 && n.bytes().all(|b| b.is_ascii_digit()))
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
fn current_sub_run() -> String {
    SUB_RUN.try_with(Clone::clone).unwrap_or_default()
}

/// The approver of a sub-agent run that a parent's `ordinal`-th delegation
/// started: the parent's own, asked with the sub-run's id in scope, so
/// that the host's approver tells two runs of one sub-agent apart
/// ([`TaggedPart::current_sub_run`]). Each level of delegation wraps the
/// one above; the deepest is called first, and each puts its ordinal in
/// front of what the levels below set, as the relay does with parts.
pub(crate) struct SubRunApprover {
    inner: Arc<dyn Approver>,
    ordinal: u64,
}

impl SubRunApprover {
    /// `inner`, asked as the run the parent's `ordinal`-th delegation started.
    pub(crate) fn new(inner: Arc<dyn Approver>, ordinal: u64) -> Self {
        Self { inner, ordinal }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_run_id_names_each_delegation_on_the_way_down() {
        let text = AgentStreamPart::Text { text: "Hi".into() };
        let own = TaggedPart::new("buyer", 0, text);
        let relayed = own.nested().in_sub_run(2);
        assert_eq!(relayed.sub_run, "2");
        let up = relayed.nested().in_sub_run(1);
        assert_eq!((up.depth, up.sub_run.as_str()), (2, "1.2"));
        assert_eq!(
            serde_json::to_value(&up).unwrap()["sub_run"],
            serde_json::json!("1.2")
        );
        // A part without one reads back as the run's own.
        let back: TaggedPart =
            serde_json::from_str(r#"{"agent":"a","depth":0,"type":"text","text":"x"}"#).unwrap();
        assert!(back.sub_run.is_empty());
        assert!(is_sub_run("1.20.3") && is_sub_run("7"));
        for bad in ["", "1.", ".1", "a", "1..2", "-1", &"1.".repeat(40)] {
            assert!(!is_sub_run(bad), "{bad}");
        }
    }
}
