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

mod adapter;
mod approval;
mod error;
mod ground;
mod host;
pub mod lexicon;
mod message;
pub mod messages;
mod parse;
mod part;
mod policy;
mod prompt;
mod provider;
mod rank;
mod run;
mod scripted;
mod tool;
mod validate;

pub use adapter::{AgentAdapter, LocalAdapter, LocalAdapterOptions, create_local_adapter};
pub use approval::{
    ApprovalAnswer, ApprovalMode, ApprovalPolicy, ApprovalRequest, ApprovalRule, Approver,
    CallRecordRequest, FixedApprover, decide,
};
pub use error::{ProviderError, ToolError, ToolErrorCode};
pub use ground::{Identifiers, MAX_COPY_PHRASES, copy_phrases};
pub use host::{AgentRunRequest, CallContext, ToolHost};
pub use message::{ChatMessage, ToolCall};
pub use parse::parse_tool_calls;
pub use part::{AgentStreamPart, FinishReason};
pub use policy::{Policy, PolicyName, Rule};
pub use prompt::{
    HISTORY_TURNS, PAGE_PATH_CHARS, PAGE_TEXT_CHARS, RESULT_CHARS, SystemPromptInput,
    delimit_untrusted, example_arguments, gist, plain_line, system_prompt, tool_line,
    truncate_chars,
};
pub use provider::{
    CallFormat, Constraint, Decoding, GenerateRequest, Generation, InSession, Progress, ProgressFn,
    PromptMessage, PromptRole, Provider, ProviderInfo, SpacedFormatter,
};
pub use rank::rank_tools;
pub use run::{ConstraintMode, LocalLoopOptions, MAX_REQUEST_BYTES, run_local_agent};
pub use scripted::{ScriptedProvider, ScriptedReply};
pub use tool::{
    AgentProfile, PageContext, SubAgentInfo, ToolAnnotations, ToolDefinition, is_identifier_key,
};
pub use validate::{ArgsError, CompiledSchema, MAX_ERRORS, validate_args};
