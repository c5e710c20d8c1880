//! What the store keeps, as the host reads it back.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use wma_agent::{AgentStreamPart, ApprovalAnswer, ApprovalRequest, ChatMessage};

/// Milliseconds since the Unix epoch (UTC), as stored.
pub type UnixMillis = i64;

/// A conversation: what the loop sees as its history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// 32 random hex digits.
    pub id: String,
    /// The agent the conversation is with.
    pub agent: String,
    /// The title given at creation, else the start of the first request
    /// (empty until there is one).
    pub title: String,
    /// When it was created.
    pub created_at: UnixMillis,
    /// When a message or a run was last added.
    pub updated_at: UnixMillis,
    /// How many messages it holds.
    pub message_count: u64,
}

/// A session with its messages in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionWithMessages {
    /// The session.
    #[serde(flatten)]
    pub session: Session,
    /// Its messages, oldest first.
    pub messages: Vec<ChatMessage>,
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// The host is running it.
    Running,
    /// It waits for a person to decide an approval; survives a restart.
    WaitingForApproval,
    /// It ended with a `finish` part.
    Finished,
    /// It ended with an `error` part.
    Failed,
    /// The host went away while it ran (found so when the store was opened
    /// again), or the host gave up on it.
    Interrupted,
}

impl RunStatus {
    /// The stored name (`running`, `waiting-for-approval`, `finished`,
    /// `failed`, `interrupted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::WaitingForApproval => "waiting-for-approval",
            Self::Finished => "finished",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
        }
    }

    /// Reads a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "running" => Self::Running,
            "waiting-for-approval" => Self::WaitingForApproval,
            "finished" => Self::Finished,
            "failed" => Self::Failed,
            "interrupted" => Self::Interrupted,
            _ => return None,
        })
    }

    /// True once nothing more will be appended.
    pub fn is_ended(self) -> bool {
        matches!(self, Self::Finished | Self::Failed | Self::Interrupted)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One run of an agent in a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The run's id (the host's, or 32 random hex digits).
    pub id: String,
    /// The session it belongs to.
    pub session_id: String,
    /// The agent it runs.
    pub agent: String,
    /// The host that runs it (`StoreOptions::host`).
    pub host: String,
    /// Where it stands.
    pub status: RunStatus,
    /// The sequence number of its last part (0 before the first).
    pub last_seq: u64,
    /// The message of its `error` part, when it failed.
    pub error: Option<String>,
    /// When it started.
    pub created_at: UnixMillis,
    /// When its status last changed (its parts carry their own times).
    pub updated_at: UnixMillis,
}

/// One part of a run's log, with the sequence number SSE sends as the
/// event id (and a reconnecting client sends back as `Last-Event-ID`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedPart {
    /// 1, 2, 3… within the run, without gaps.
    pub seq: u64,
    /// Whose part it is: the run's agent or one of its sub-agents.
    pub agent: String,
    /// 0 for the run's agent, 1 for its sub-agents, 2 for theirs.
    pub depth: u32,
    /// Which sub-agent run inside the run it is from
    /// (`wma_runtime::TaggedPart::sub_run`); `""` for the run's own.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_run: String,
    /// The part.
    #[serde(flatten)]
    pub part: AgentStreamPart,
    /// When it was appended.
    pub at: UnixMillis,
}

impl LoggedPart {
    /// The SSE event's data for this part, as the live stream sends it:
    /// `{"agent": …, "depth": …, "type": …, …}`, with `"sub_run"` for a
    /// sub-agent run's part (the event's `id:` is [`LoggedPart::seq`]).
    pub fn event_data(&self) -> Value {
        let mut data = serde_json::Map::new();
        data.insert("agent".to_string(), Value::from(self.agent.as_str()));
        data.insert("depth".to_string(), Value::from(self.depth));
        if !self.sub_run.is_empty() {
            data.insert("sub_run".to_string(), Value::from(self.sub_run.as_str()));
        }
        if let Ok(Value::Object(fields)) = serde_json::to_value(&self.part) {
            data.extend(fields);
        }
        Value::Object(data)
    }
}

/// Where a consequential call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallStatus {
    /// Recorded and (about to be) sent; no answer yet.
    InFlight,
    /// Its answer was recorded.
    Answered,
    /// It was in flight when the host went away: it may or may not have
    /// happened. Shown to the person, never sent again by the store's host.
    InDoubt,
}

impl CallStatus {
    /// The stored name (`in-flight`, `answered`, `in-doubt`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in-flight",
            Self::Answered => "answered",
            Self::InDoubt => "in-doubt",
        }
    }

    /// Reads a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "in-flight" => Self::InFlight,
            "answered" => Self::Answered,
            "in-doubt" => Self::InDoubt,
            _ => return None,
        })
    }
}

impl std::fmt::Display for CallStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A consequential call as recorded before it was sent and when it answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// 32 random hex digits the store made: the record's key, and the
    /// idempotency key to pass to sources that accept one (so that a source
    /// can refuse a second delivery).
    pub idempotency_key: String,
    /// The run that made it.
    pub run_id: String,
    /// The agent that made it (the run's, or a sub-agent's).
    pub agent: String,
    /// Which sub-agent run inside the run made it
    /// (`wma_runtime::TaggedPart::sub_run`: `"2"` for the run the second
    /// delegation started); `""` for the run's own agent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sub_run: String,
    /// The loop's call id (unique within one agent's run, not across a
    /// run's sub-agents: with `agent` and `sub_run` it names the call's
    /// part in the run's log).
    pub call_id: String,
    /// The tool's name.
    pub tool: String,
    /// The arguments it was sent with.
    pub arguments: Value,
    /// Where it stands.
    pub status: CallStatus,
    /// The tool's output (or `Error [code]: message`), once answered.
    pub output: Option<String>,
    /// Whether the answer was an error.
    pub is_error: bool,
    /// When it was recorded, just before it was sent.
    pub started_at: UnixMillis,
    /// When its answer was recorded.
    pub answered_at: Option<UnixMillis>,
}

/// An approval, pending or decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// 32 random hex digits the store made: what a person's decision names
    /// (the loop's own `approval_id`, random as well, is what the API
    /// names).
    pub id: String,
    /// The run that waits.
    pub run_id: String,
    /// What the loop asked: agent, call, tool, full arguments, reason.
    pub request: ApprovalRequest,
    /// When it was asked.
    pub requested_at: UnixMillis,
    /// The answer, once given.
    pub answer: Option<ApprovalAnswer>,
    /// When it was answered.
    pub decided_at: Option<UnixMillis>,
}

impl Approval {
    /// True while no answer was given.
    pub fn is_pending(&self) -> bool {
        self.answer.is_none()
    }
}

/// What [`Store::open`](crate::Store::open) found of this host's work that
/// the last process left unfinished.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// Runs that were running: now `interrupted`.
    pub interrupted_runs: Vec<String>,
    /// Consequential calls that were in flight: now `in-doubt`.
    pub in_doubt_calls: Vec<CallRecord>,
    /// Runs that wait for approval: kept, decidable now.
    pub waiting_runs: Vec<String>,
}
