//! Reading tool calls out of what a small model wrote.

use serde_json::Value;

/// One call read from a reply (it has no id yet; the loop assigns one).
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// The tool name the model wrote.
    pub name: String,
    /// The arguments; an object when the model wrote one.
    pub arguments: Value,
}

/// What a reply contained.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedReply {
    /// The calls, in the order written.
    pub calls: Vec<ParsedCall>,
    /// The prose left once the calls are taken out, trimmed.
    pub text: String,
    /// Set when the reply tried to call a tool but the call could not be read;
    /// says what was wrong, in words the model can act on.
    pub malformed: Option<String>,
}

/// Reads the tool calls out of a model reply. Never panics.
pub fn parse_tool_calls(reply: &str) -> ParsedReply {
    ParsedReply {
        calls: Vec::new(),
        text: reply.trim().to_string(),
        malformed: None,
    }
}
