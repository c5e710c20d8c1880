//! Stream parts tagged with the agent they belong to.

use serde::{Deserialize, Serialize};
use wma_agent::AgentStreamPart;

/// One part of a run as the host receives it: the loop's own part, and which
/// agent's run produced it. A parent's stream carries its sub-agents' parts
/// too, so a host can show who said what; the parts of one agent's run keep
/// the loop's rules (exactly one finish or error, last).
///
/// In JSON the part's own fields sit beside `agent` and `depth`:
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
            part,
        }
    }

    /// The terminal part of the run the host started (not of a sub-agent's).
    pub fn ends_the_run(&self) -> bool {
        self.depth == 0 && self.part.is_terminal()
    }

    /// The same part, one level further down: what a parent's stream
    /// carries of a sub-agent's part.
    pub(crate) fn nested(mut self) -> Self {
        self.depth += 1;
        self
    }
}
