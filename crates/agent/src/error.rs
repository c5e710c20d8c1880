//! Errors: the fixed set of tool error codes the model is taught, and the
//! errors a provider or the library itself can return.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The fixed set of tool error codes. A failed call reaches the model as
/// `Error [code]: message`, and the system prompt explains every code with
/// [`ToolErrorCode::meaning`], so that a small model can tell "fix your
/// arguments" from "the page is gone".
///
/// The set is closed on purpose: the prompt can only teach codes it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorCode {
    /// The model named a tool that is not offered.
    UnknownTool,
    /// The arguments do not match the tool's input schema, or could not be read.
    InvalidArguments,
    /// The tool ran and reported a failure of its own.
    ToolFailed,
    /// The tool did not answer in time.
    Timeout,
    /// The call was cancelled before it finished.
    Cancelled,
    /// The tool's source (a page, a server process) is not reachable right now.
    Unavailable,
    /// A host policy refused the call (allow/deny lists, a result over the
    /// size limit), or the call was not approved (the approval policy
    /// denies it, a person said no, or nobody answered in time).
    Denied,
}

impl ToolErrorCode {
    /// Every code, in the order the system prompt lists them.
    pub const ALL: [ToolErrorCode; 7] = [
        Self::UnknownTool,
        Self::InvalidArguments,
        Self::ToolFailed,
        Self::Timeout,
        Self::Cancelled,
        Self::Unavailable,
        Self::Denied,
    ];

    /// The code as the model sees it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownTool => "unknown_tool",
            Self::InvalidArguments => "invalid_arguments",
            Self::ToolFailed => "tool_failed",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Unavailable => "unavailable",
            Self::Denied => "denied",
        }
    }

    /// The sentence the system prompt uses to explain the code.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::UnknownTool => "no tool has that name here; call one of the listed tools",
            Self::InvalidArguments => {
                "the arguments are wrong; fix the argument the message names and call again"
            }
            Self::ToolFailed => {
                "the tool ran but could not do it; read its message and tell the user or try another way"
            }
            Self::Timeout => "the tool took too long; try once more or tell the user",
            Self::Cancelled => "the call was stopped; do not say it worked",
            Self::Unavailable => {
                "the tool cannot be reached right now (for example, it exists only on another page)"
            }
            Self::Denied => "the host does not allow this call; do not try it again",
        }
    }
}

impl fmt::Display for ToolErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed tool call: a code from the fixed set and the tool's own message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("Error [{code}]: {message}")]
pub struct ToolError {
    /// What kind of failure this is.
    pub code: ToolErrorCode,
    /// The message, kept as the tool or host wrote it.
    pub message: String,
}

impl ToolError {
    /// A tool error with the given code and message.
    pub fn new(code: ToolErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// A failure of the model provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The provider is not ready: prepare() was not called or failed.
    #[error("the model is not loaded: {0}")]
    NotReady(String),
    /// The model or one of its files could not be loaded.
    #[error("could not load the model: {0}")]
    Load(String),
    /// The prompt does not fit the model's context window.
    #[error("the prompt has {tokens} tokens but the model takes at most {limit}")]
    TooLong {
        /// Tokens in the prompt, including the room kept for the answer.
        tokens: usize,
        /// The most the model accepts.
        limit: usize,
    },
    /// The work was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// Generation failed.
    #[error("{0}")]
    Generation(String),
}

/// A tool's successful output that is framed as an error the way tool
/// servers commonly write one, as the tool error it is: text that opens
/// with `Error:` (or `Error executing …`, `error: …`), or a JSON object
/// whose only field is `error`. Many MCP servers answer a failure in plain
/// text without `isError` ("Error: Only SELECT queries are allowed"); read
/// as a success, the failure would count as a change made and the model
/// would be told nothing went wrong. Anything else is passed through.
pub(crate) fn error_framed_result(output: String) -> Result<String, ToolError> {
    let trimmed = output.trim_start();
    let head: String = trimmed.chars().take(16).collect::<String>().to_lowercase();
    let framed = head.starts_with("error:")
        || head.starts_with("error executing")
        || head.starts_with("error calling")
        || labelled_error(trimmed);
    if framed {
        return Err(ToolError::new(
            ToolErrorCode::ToolFailed,
            trimmed.trim_end(),
        ));
    }
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(trimmed)
        && map.len() == 1
        && let Some(error) = map.get("error").filter(|e| !e.is_null())
    {
        let message = match error {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        return Err(ToolError::new(ToolErrorCode::ToolFailed, message));
    }
    Ok(output)
}

/// Whether the text's first line opens with a short label naming an error
/// kind before a colon, the way servers and their languages write one:
/// "Database error: …", "Catalog Error: …", "ValueError: …",
/// "RuntimeException: …". The label is at most four words, and its last
/// word ends in "error" or "exception" ("Errors: none" is a heading).
fn labelled_error(text: &str) -> bool {
    let line = text.lines().next().unwrap_or_default();
    let Some((label, _)) = line.split_once(':') else {
        return false;
    };
    let words: Vec<&str> = label.split_whitespace().collect();
    let Some(last) = words.last().map(|w| w.to_lowercase()) else {
        return false;
    };
    words.len() <= 4
        && words.iter().all(|w| {
            w.chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
        })
        && (last.ends_with("error") || last.ends_with("exception"))
}

#[cfg(test)]
mod framing_tests {
    use super::*;

    #[test]
    fn results_framed_as_errors_are_tool_errors() {
        for (output, message) in [
            (
                "Error: Only SELECT queries are allowed",
                "Error: Only SELECT queries are allowed",
            ),
            (
                "  error: no such table: notes\n",
                "error: no such table: notes",
            ),
            (
                "Error executing tool read_query: syntax error",
                "Error executing tool read_query: syntax error",
            ),
            (
                r#"{"error": "repository not found"}"#,
                "repository not found",
            ),
            (
                "Database error: Catalog Error: Table with name orders does not exist!",
                "Database error: Catalog Error: Table with name orders does not exist!",
            ),
            (
                "ValueError: could not convert string to float: 'abc'",
                "ValueError: could not convert string to float: 'abc'",
            ),
        ] {
            let error = error_framed_result(output.to_string()).expect_err(output);
            assert_eq!(error.code, ToolErrorCode::ToolFailed);
            assert_eq!(error.message, message);
        }
        for fine in [
            "The error rate fell to 2%.",
            "Errors: none",
            "The report says: no error",
            "Total orders by error type: 3",
            r#"{"error": null, "rows": []}"#,
            r#"{"error": null}"#,
            "[]",
        ] {
            assert_eq!(error_framed_result(fine.to_string()).as_deref(), Ok(fine));
        }
    }
}
