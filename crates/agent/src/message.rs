//! Chat messages as the host hands them to the loop, with their tool calls and results.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Identifier that ties the call to its result (`call_<step>_<n>` when the loop makes it).
    pub id: String,
    /// Name of the tool, as the tool host lists it.
    pub name: String,
    /// Arguments as a JSON object.
    pub arguments: Value,
}

impl ToolCall {
    /// A call with the given id, name and arguments.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments,
        }
    }
}

/// A message of the conversation. The loop reads these to build the prompt,
/// and a host appends what the stream parts tell it to keep the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum ChatMessage {
    /// What the person said.
    User {
        /// The person's text.
        content: String,
    },
    /// What the agent said, with the calls it made in that turn.
    Assistant {
        /// Prose shown to the person (may be empty when the turn only called tools).
        #[serde(default)]
        content: String,
        /// Calls made in this turn, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The outcome of one tool call.
    Tool {
        /// The id of the call this answers.
        call_id: String,
        /// The tool's name, so the history can be written back without the call.
        name: String,
        /// The tool's output, or `Error [code]: message` when it failed.
        content: String,
        /// Whether the call failed.
        #[serde(default)]
        is_error: bool,
    },
}

impl ChatMessage {
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::User {
            content: content.into(),
        }
    }

    /// An assistant message with prose only.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::Assistant {
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    /// An assistant message that made calls.
    pub fn assistant_calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self::Assistant {
            content: content.into(),
            tool_calls,
        }
    }

    /// A successful tool result.
    pub fn tool_result(
        call_id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
    ) -> Self {
        Self::Tool {
            call_id: call_id.into(),
            name: name.into(),
            content: content.into(),
            is_error: false,
        }
    }

    /// A failed tool result; `content` is the `Error [code]: message` text.
    pub fn tool_error(
        call_id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
    ) -> Self {
        Self::Tool {
            call_id: call_id.into(),
            name: name.into(),
            content: content.into(),
            is_error: true,
        }
    }

    /// True for a user message.
    pub fn is_user(&self) -> bool {
        matches!(self, Self::User { .. })
    }
}
