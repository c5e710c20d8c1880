//! The parts a run streams to its host.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ToolError;

/// Why a run finished normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FinishReason {
    /// The model answered (or the loop answered for it) and the request is done.
    Stop,
    /// The step limit was reached before the model finished.
    MaxSteps,
    /// The host cancelled the run.
    Aborted,
}

impl FinishReason {
    /// The wire name (`stop`, `max-steps`, `aborted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::MaxSteps => "max-steps",
            Self::Aborted => "aborted",
        }
    }
}

/// One event of a run. Every run ends with exactly one [`AgentStreamPart::Finish`]
/// or one [`AgentStreamPart::Error`], and nothing follows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum AgentStreamPart {
    /// A new assistant message begins; one per loop step.
    MessageStart {
        /// 1-based step number.
        step: u32,
    },
    /// Prose for the person, shown only after the reply was read whole.
    Text {
        /// The text.
        text: String,
    },
    /// A validated call that is about to run.
    ToolCall {
        /// Call id, repeated on its result.
        call_id: String,
        /// Tool name.
        name: String,
        /// Arguments, already validated against the tool's schema.
        arguments: Value,
    },
    /// A call's output.
    ToolResult {
        /// The call this answers.
        call_id: String,
        /// Tool name.
        name: String,
        /// What the tool returned.
        output: String,
    },
    /// A call that failed.
    ToolError {
        /// The call this answers.
        call_id: String,
        /// Tool name.
        name: String,
        /// The failure, with its code.
        error: ToolError,
    },
    /// A rule of the loop's policy changed what the model was offered, how
    /// it was retried or how the run ended (see `docs/loop.md`, the policy).
    /// Informational: hosts may show it, count it or ignore it.
    Rule {
        /// The rule's name (`ground-identifiers`, `named-tool-retry`, …).
        rule: String,
        /// What it changed, in a few words.
        detail: String,
    },
    /// The run ended normally.
    Finish {
        /// Why it ended.
        reason: FinishReason,
    },
    /// The run ended with an error the person should read.
    Error {
        /// The message, in the reference's words.
        message: String,
    },
}

impl AgentStreamPart {
    /// True for the part that ends a run.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Finish { .. } | Self::Error { .. })
    }
}
