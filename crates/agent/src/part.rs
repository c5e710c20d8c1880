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
    /// The run stopped because the model repeated a call that gave the same
    /// answer after it was warned: it was going in circles.
    Loop,
    /// The answer was cut at the token limit: it may be incomplete.
    Length,
    /// The model's reply could not be made into a valid call or answer,
    /// even after a repair: the run ended with an apology.
    Unrepaired,
    /// The host cancelled the run.
    Aborted,
}

impl FinishReason {
    /// The wire name (`stop`, `max-steps`, `loop`, `length`, `unrepaired`,
    /// `aborted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::MaxSteps => "max-steps",
            Self::Loop => "loop",
            Self::Length => "length",
            Self::Unrepaired => "unrepaired",
            Self::Aborted => "aborted",
        }
    }

    /// Whether the run ended with the answer it was asked for. Every other
    /// reason is a run that did not finish its request, and says so.
    pub fn answered(self) -> bool {
        self == Self::Stop
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
    /// A validated call that is about to run, or to be asked about first
    /// (an [`AgentStreamPart::ApprovalRequested`] follows), or to be
    /// denied by the approval policy (a `denied` tool error follows).
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
    /// A call waits for a person's approval (see `docs/approvals.md`).
    /// The run goes on when the host's approver answers, Stop ends it, and
    /// no answer within the policy's time limit denies the call.
    ApprovalRequested {
        /// Names the question; the answer refers to it.
        approval_id: String,
        /// The call, as its tool-call part named it.
        call_id: String,
        /// Tool name.
        name: String,
        /// The call's full arguments.
        arguments: Value,
        /// Why it asks, in a sentence.
        reason: String,
    },
    /// The answer to an [`AgentStreamPart::ApprovalRequested`]: the call
    /// runs next (a tool result or error follows), or it was denied (a
    /// tool error with code `denied` follows).
    ApprovalDecided {
        /// The question answered.
        approval_id: String,
        /// The call.
        call_id: String,
        /// Tool name.
        name: String,
        /// The call may run.
        approved: bool,
        /// Who or what answered: `person`, `session` (an answer given
        /// earlier for the rest of the session), `timeout`, or a host's
        /// own word for an unattended answer.
        by: String,
        /// The answer holds for the rest of the session.
        remember: bool,
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
