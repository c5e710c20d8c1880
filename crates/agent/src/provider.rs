//! The provider trait: the engine that turns a prompt into text.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::ProviderError;
use crate::message::ToolCall;
use crate::tool::ToolDefinition;

/// The role of one prompt turn, as chat templates know them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptRole {
    /// The system prompt.
    System,
    /// A user turn (also the loop's own restatements and corrections).
    User,
    /// A model turn, with earlier calls written in the provider's call format.
    Assistant,
    /// A tool result.
    Tool,
}

impl PromptRole {
    /// The role's name as chat templates expect it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// One turn of the prompt the loop builds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptMessage {
    /// Who speaks.
    pub role: PromptRole,
    /// The text of the turn.
    pub content: String,
}

impl PromptMessage {
    /// A turn with the given role and content.
    pub fn new(role: PromptRole, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }
}

/// How a provider writes tool calls, both in what it shows the model and in
/// how the loop writes earlier calls back into the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallFormat {
    /// One JSON object per call: `{"name": "...", "arguments": {...}}`.
    #[default]
    Json,
    /// Hermes/Qwen style: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.
    Hermes,
}

impl CallFormat {
    /// The text every call in this format begins with: what a reply that
    /// takes a "text or calls" constraint's call branch opens with.
    pub fn opening(self) -> &'static str {
        match self {
            Self::Json => "{",
            Self::Hermes => "<tool_call>",
        }
    }

    /// Writes one call the way the model is taught to write it: JSON with
    /// a space after each `:` and `,` (`{"name": "search", "arguments":
    /// {"query": "tent"}}`), the form a constrained reply takes (the
    /// grammar writes `{"name": "` itself) and small models write on their
    /// own. The loop writes earlier calls back into the history this way,
    /// so the prompt of the next step repeats the model's reply token for
    /// token and its cached prefix runs on through it.
    pub fn write(self, call: &ToolCall) -> String {
        let body =
            spaced_json(&serde_json::json!({"name": call.name, "arguments": call.arguments}));
        match self {
            Self::Json => body.to_string(),
            Self::Hermes => format!("{}\n{body}\n</tool_call>", self.opening()),
        }
    }

    /// Writes several calls, one per line.
    pub fn write_all(self, calls: &[ToolCall]) -> String {
        calls
            .iter()
            .map(|c| self.write(c))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A `serde_json` formatter that writes `", "` and `": "` between the parts
/// of a value, on one line: the separators of Python's `json.dumps`, which
/// chat templates' `tojson` follows, and the form a constrained call takes.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpacedFormatter;

impl serde_json::ser::Formatter for SpacedFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// `value` as JSON with `": "` and `", "` between its parts, on one line.
fn spaced_json(value: &Value) -> String {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, SpacedFormatter);
    // Writing a Value into memory cannot fail, and JSON is UTF-8.
    serde::Serialize::serialize(value, &mut serializer).expect("a JSON value serializes");
    String::from_utf8(out).expect("JSON is UTF-8")
}

/// A limit on what a generation may produce, for providers that can decode
/// under a grammar. Providers that cannot ignore it (see
/// [`Provider::supports_constraints`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Constraint {
    /// Prose, or calls to the given tools with arguments that follow their schemas.
    TextOrCalls {
        /// The tools shown this step.
        tools: Vec<ToolDefinition>,
    },
    /// Only calls to the given tools, with arguments that follow their schemas.
    CallsOnly {
        /// The tools shown this step.
        tools: Vec<ToolDefinition>,
    },
    /// Output that is one JSON value following this schema.
    JsonSchema {
        /// The schema.
        schema: Value,
    },
    /// Output that follows this Lark grammar (llguidance's dialect).
    Grammar {
        /// The grammar text.
        lark: String,
    },
}

/// What the loop asks the provider to generate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateRequest {
    /// The prompt turns, system prompt first.
    pub messages: Vec<PromptMessage>,
    /// Tools for chat templates that take them; empty when tools are inline.
    pub tools: Vec<ToolDefinition>,
    /// An optional decoding constraint.
    pub constraint: Option<Constraint>,
    /// Upper bound on new tokens; `None` lets the provider choose.
    pub max_new_tokens: Option<u32>,
    /// Phrases of what the person wrote (see [`copy_phrases`](crate::prompt::copy_phrases)).
    /// A provider that decodes calls under a constraint may favour copying
    /// them into string arguments; others ignore them.
    pub copy_phrases: Vec<String>,
    /// How a constrained reply is shaped: grammar limits and the pulls on
    /// the model's choices. The loop's policy sets them; providers without
    /// constraints ignore them.
    pub decoding: Decoding,
}

/// The shape of a constrained reply, chosen by the loop's policy (see
/// `docs/loop.md`): the limits the grammar puts on what the model may write
/// and the pulls on its choices. The default is the reference loop's: no
/// limit beyond the tool's own schema and no pull, so a capable model writes
/// what it would write unconstrained, only well-formed.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Decoding {
    /// A free string value of a constrained call (one the schema does not
    /// fix by `enum`, `const` or `pattern`) may not begin with any of
    /// these; empty is no limit.
    pub avoid_in_values: Vec<String>,
    /// The longest string the grammar lets a call hold where the schema sets
    /// no `maxLength`; `None` leaves strings as the schema bounds them.
    pub max_string_chars: Option<u32>,
    /// The most items an array argument may hold where the schema sets no
    /// `maxItems`; `None` leaves arrays as the schema bounds them.
    pub max_array_items: Option<u32>,
    /// The most calls one constrained reply may hold; `None` is no limit.
    pub max_calls: Option<u32>,
    /// Every call of one reply names the same tool.
    pub one_tool_per_reply: bool,
    /// Tools a constrained reply may call only once (the others up to
    /// `max_calls`).
    pub single_call: Vec<String>,
    /// Where prose and a call are both allowed, call as soon as the model
    /// gives a call at least this probability at the first token (the
    /// branch between prose and a call); `None` leaves the choice to the
    /// model.
    pub call_threshold: Option<f32>,
    /// Measure the call threshold against a neutral baseline: where the
    /// newest user turn (the person's request, or the loop's restatement
    /// of it) is followed by nothing but system notes, the provider also
    /// reads the call probability the model gives the same prompt with
    /// that turn's words removed, and a call is pushed only where the
    /// words make it more likely than that (and at least
    /// `call_threshold`). A model that leans to calling whatever is asked
    /// is then left to choose; a request that calls for a tool still gets
    /// its push. Costs one short extra pass over that turn (the prompt
    /// before it is cached).
    pub call_baseline: bool,
    /// Inside a string or number argument of a constrained call, the logit
    /// bonus for tokens that copy one of the request's
    /// [`copy_phrases`](GenerateRequest::copy_phrases); 0 is none.
    pub copy_bias: f32,
    /// Argument names whose values the schema shows by two examples or
    /// more, each with the characters every example holds (of `/ _ @ :
    /// .`): at a value of such an argument the copy bias favours only the
    /// phrases that hold them too. "Tokyo" is no value for a `timezone`
    /// shown as `'America/New_York', 'Europe/London'`, though the person
    /// wrote it; the model's own `Asia/Tokyo` should not have to beat a
    /// bonus for it.
    pub copy_shapes: Vec<(String, String)>,
    /// Once a constrained reply has begun a call, decode its name and
    /// arguments greedily even when sampling (whether to call stays
    /// sampled).
    pub greedy_calls: bool,
    /// When the token limit falls inside a constrained call, up to this
    /// many more tokens finish it along a short way the grammar allows
    /// (strings, arrays and objects closed as soon as they may be), so the
    /// reply holds a whole call that validates instead of a cut one; the
    /// reply still ends as `length`. `None` leaves a cut call as it was
    /// written.
    pub finish_cut_calls: Option<u32>,
}

/// What a generation produced, with the counts and timings the provider knows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Generation {
    /// The generated text, without the stop token.
    pub text: String,
    /// Tokens in the prompt, when known.
    pub input_tokens: Option<u32>,
    /// Tokens generated, when known.
    pub output_tokens: Option<u32>,
    /// Prompt tokens served from a cache instead of being computed again.
    pub cached_tokens: Option<u32>,
    /// Time until the first new token.
    pub time_to_first_token: Option<Duration>,
    /// Time for the whole generation.
    pub total_time: Option<Duration>,
    /// Why generation stopped (`stop`, `length`, ...).
    pub finish_reason: Option<String>,
    /// Under a constraint that allowed prose or a call: the probability the
    /// model gave a call at its first token, when the provider knows it.
    pub call_probability: Option<f32>,
    /// Under [`Decoding::call_baseline`]: the probability the model gave a
    /// call for the same prompt with the newest user turn's words removed,
    /// when the provider measured it.
    pub call_baseline: Option<f32>,
    /// Where the decoding's pulls changed the model's own choice, as far
    /// as the provider can tell; all zero where it cannot.
    pub steered: Steered,
}

/// Where a constrained generation's pulls ([`Decoding`]) changed what the
/// model itself ranked first: the loop reports each as the rule that asked
/// for it, so a pull that acted is seen in the trace and counted in the
/// ledger like any other rule. "The model's own choice" is its most likely
/// token among those the grammar allows, before the pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Steered {
    /// The call threshold settled the first token for a call where the
    /// model ranked prose first.
    pub call_threshold: bool,
    /// Tokens of call arguments where the copy bias changed the model's
    /// first choice.
    pub copy_bias: u32,
    /// Tokens of call arguments where the names a value may not begin
    /// with ([`Decoding::avoid_in_values`]) took the model's first choice
    /// away.
    pub avoided_names: u32,
    /// Tokens written to finish a call the token limit cut
    /// ([`Decoding::finish_cut_calls`]).
    pub finished_cut_call: u32,
}

impl Generation {
    /// A generation with only text.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }
}

/// Progress of long work (downloading, loading a model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// What is happening ("download model.onnx", "load session").
    pub stage: String,
    /// Units done.
    pub done: u64,
    /// Units in all, when known.
    pub total: Option<u64>,
}

/// Callback that receives progress.
pub type ProgressFn = Arc<dyn Fn(Progress) + Send + Sync>;

/// Facts about a provider, for traces and for the person.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProviderInfo {
    /// The provider's kind (`onnxruntime`, `scripted`); `gen_ai.provider.name`.
    pub provider: String,
    /// The model's name; `gen_ai.request.model`.
    pub model: String,
    /// Context window in tokens, when known.
    pub context_length: Option<u32>,
}

/// The engine that generates text, mirroring the original's LocalProvider.
///
/// The loop calls [`Provider::generate`] once per attempt and races it against
/// Stop and the step timeout; a provider should also watch `cancel` itself so
/// that abandoned work stops at the next token.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Names for traces.
    fn info(&self) -> ProviderInfo;

    /// Loads the model (downloading it if needed), reporting progress.
    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError>;

    /// Generates one reply.
    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError>;

    /// Generates one reply as part of the cache session `session`: a
    /// provider that keeps several KV caches (one per agent run, see
    /// [`InSession`]) serves the prompt's prefix from that session's cache,
    /// so that one agent's steps do not evict another's. The default
    /// ignores the session.
    async fn generate_in_session(
        &self,
        session: &str,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        let _ = session;
        self.generate(request, cancel).await
    }

    /// Whether the prompt fits the context, with room kept for the answer.
    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError>;

    /// How calls are written for this model.
    fn call_format(&self) -> CallFormat;

    /// Whether tools must be listed in the prompt text (no chat-template tools).
    fn tools_inline(&self) -> bool;

    /// Whether [`GenerateRequest::constraint`] is honoured.
    fn supports_constraints(&self) -> bool {
        false
    }

    /// How many parameters the model has, when known. Shown to people
    /// only: the loop's default policy goes by the model's measured name
    /// (`Policy::for_model`), never by its size.
    fn parameters(&self) -> Option<u64> {
        None
    }
}

#[async_trait]
impl<P: Provider + ?Sized> Provider for Arc<P> {
    fn info(&self) -> ProviderInfo {
        (**self).info()
    }
    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        (**self).prepare(progress, cancel).await
    }
    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        (**self).generate(request, cancel).await
    }
    async fn generate_in_session(
        &self,
        session: &str,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        (**self).generate_in_session(session, request, cancel).await
    }
    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError> {
        (**self).fits(request).await
    }
    fn call_format(&self) -> CallFormat {
        (**self).call_format()
    }
    fn tools_inline(&self) -> bool {
        (**self).tools_inline()
    }
    fn supports_constraints(&self) -> bool {
        (**self).supports_constraints()
    }
    fn parameters(&self) -> Option<u64> {
        (**self).parameters()
    }
}

/// A provider whose generations all belong to one cache session (see
/// [`Provider::generate_in_session`]): the runtime gives each agent run one,
/// keyed by the agent and the run, so a sub-agent's steps and another
/// agent's leave this run's KV cache alone.
#[derive(Debug, Clone)]
pub struct InSession<P> {
    provider: P,
    session: String,
}

impl<P: Provider> InSession<P> {
    /// `provider`, with every generation in `session`.
    pub fn new(provider: P, session: impl Into<String>) -> Self {
        Self {
            provider,
            session: session.into(),
        }
    }

    /// The session's key.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The provider underneath.
    pub fn inner(&self) -> &P {
        &self.provider
    }
}

#[async_trait]
impl<P: Provider> Provider for InSession<P> {
    fn info(&self) -> ProviderInfo {
        self.provider.info()
    }
    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        self.provider.prepare(progress, cancel).await
    }
    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.provider
            .generate_in_session(&self.session, request, cancel)
            .await
    }
    /// A session named by the caller wins over this one.
    async fn generate_in_session(
        &self,
        session: &str,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.provider
            .generate_in_session(session, request, cancel)
            .await
    }
    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError> {
        self.provider.fits(request).await
    }
    fn call_format(&self) -> CallFormat {
        self.provider.call_format()
    }
    fn tools_inline(&self) -> bool {
        self.provider.tools_inline()
    }
    fn supports_constraints(&self) -> bool {
        self.provider.supports_constraints()
    }
    fn parameters(&self) -> Option<u64> {
        self.provider.parameters()
    }
}
