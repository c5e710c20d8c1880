//! The on-device agent loop and its vocabulary.
//!
//! [`run_local_agent`] takes a [`Provider`] (the engine that generates text),
//! an [`AgentRunRequest`] (the conversation, a [`ToolHost`], a cancellation
//! token and an optional [`AgentProfile`]) and [`LocalLoopOptions`], and
//! returns a stream of [`AgentStreamPart`]s that ends with exactly one finish
//! or error. Each step ranks the host's tools against the request, fits the
//! prompt to the model, generates, reads the reply whole (parse, validate),
//! corrects or repairs what a small model gets wrong, and runs the calls one
//! at a time. `docs/loop.md` explains every step.
//!
//! This crate knows nothing of ONNX Runtime or actors: the runtime runs this
//! very function against actor handles that implement the two traits.
//!
//! # What this crate exports, and why
//!
//! The root holds what a host needs to run the loop; every name there has a
//! user in another crate of the workspace. Everything else stays inside the
//! crate, so the loop's internals can change without breaking a caller.
//!
//! - The loop: [`run_local_agent`], its [`LocalLoopOptions`] and
//!   [`ConstraintMode`]; what it reads and writes: [`AgentRunRequest`],
//!   [`ChatMessage`], [`ToolCall`], [`AgentStreamPart`], [`FinishReason`].
//! - Tools, which the tools crate, the runtime and the server implement or
//!   describe: [`ToolHost`], [`CallContext`], [`ToolDefinition`],
//!   [`ToolAnnotations`], [`PageContext`], [`AgentProfile`], [`SubAgentInfo`],
//!   [`is_identifier_key`] (the runtime's delegation), [`ToolError`],
//!   [`ToolErrorCode`]; checking arguments against a tool's schema:
//!   [`validate_args`], [`CompiledSchema`], [`ArgsError`].
//! - Engines, which the ONNX Runtime and OpenAI-compatible providers and the
//!   runtime's actors implement: [`Provider`], [`ProviderInfo`],
//!   [`ProviderError`], [`GenerateRequest`], [`Generation`], [`PromptMessage`],
//!   [`PromptRole`], [`CallFormat`], [`Constraint`], [`Decoding`], [`Steered`],
//!   [`Progress`], [`ProgressFn`], [`InSession`] (the runtime's sessions),
//!   [`SpacedFormatter`] (chat templates that print JSON as Python does),
//!   and [`parse_tool_calls`] (the OpenAI-compatible provider and the
//!   evaluation read replies as the loop does).
//! - Approvals, which the server, the runtime and the `wma` command answer:
//!   [`Approver`], [`ApprovalRequest`], [`ApprovalAnswer`], [`ApprovalPolicy`],
//!   [`ApprovalMode`], [`ApprovalRule`], [`CallRecordRequest`],
//!   [`FixedApprover`].
//!
//! Five modules group what fewer callers need:
//!
//! - [`policy`]: the loop's rule sets ([`policy::Policy`],
//!   [`policy::PolicyName`]), which config files and the evaluation choose.
//! - [`scripted`]: a provider that replays written replies
//!   ([`scripted::ScriptedProvider`]), for the `scripted` provider of config
//!   files, the evaluation and tests.
//! - [`adapter`]: the chat-host adapter ([`adapter::AgentAdapter`]), the
//!   original's `createLocalAdapter` around the loop.
//! - [`prompt`]: the pieces the loop builds its prompt from
//!   ([`prompt::system_prompt`], [`prompt::tool_line`],
//!   [`prompt::delimit_untrusted`], [`prompt::rank_tools`], ...), so that
//!   providers' tests and benchmarks can show a model exactly what the loop
//!   shows it, and the terminal display cuts text as the prompt does.
//! - [`messages`]: the sentences the loop itself writes to the person, so
//!   that hosts and tests can recognise them.

pub mod adapter;
mod approval;
mod error;
mod ground;
mod host;
mod lexicon;
mod message;
pub mod messages;
mod parse;
mod part;
pub mod policy;
pub mod prompt;
mod provider;
mod rank;
mod run;
pub mod scripted;
mod steered;
mod tool;
mod validate;

#[cfg(test)]
mod properties;

pub use approval::{
    ApprovalAnswer, ApprovalMode, ApprovalPolicy, ApprovalRequest, ApprovalRule, Approver,
    CallRecordRequest, FixedApprover,
};
pub use error::{ProviderError, ToolError, ToolErrorCode};
pub use host::{AgentRunRequest, CallContext, ToolHost};
pub use message::{ChatMessage, ToolCall};
pub use parse::parse_tool_calls;
pub use part::{AgentStreamPart, FinishReason};
pub use provider::{
    CallFormat, Constraint, Decoding, GenerateRequest, Generation, InSession, Progress, ProgressFn,
    PromptMessage, PromptRole, Provider, ProviderInfo, SpacedFormatter, Steered,
};
pub use run::{ConstraintMode, LocalLoopOptions, run_local_agent};
pub use tool::{
    AgentProfile, PageContext, SubAgentInfo, ToolAnnotations, ToolDefinition, is_identifier_key,
};
pub use validate::{ArgsError, CompiledSchema, validate_args};
