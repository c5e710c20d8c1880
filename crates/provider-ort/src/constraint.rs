//! Constrained decoding: a [`Constraint`] from the loop becomes an llguidance
//! grammar, and the grammar becomes a mask over the vocabulary at every token.
//!
//! # The grammar
//! Calls are written the way the model is taught ([`CallFormat`]):
//!
//! ```text
//! start: text | calls                      (TextOrCalls; CallsOnly has no text)
//! text:  TEXT                              prose that does not start a call
//! calls: call (SEP call){0,n-1} SEP?       up to `max_calls`, a line apart
//! call:  tool_0 | tool_1 | …
//! tool_0: %json { {"name": const, "arguments": <its input schema>} }
//! ```
//!
//! Each tool is a separate alternative with the name as a `const`, so the
//! arguments always follow the schema of the tool that was named. How a
//! reply is shaped comes from the request's [`Decoding`]:
//!
//! - `max_calls` bounds the calls of one reply (`None`: no bound beyond
//!   `max_new_tokens`);
//! - `one_tool_per_reply` makes every call of a reply name the same tool
//!   (`calls: calls_0 | calls_1 | …`, each `calls_i` repeating `tool_i`): a
//!   tiny model allowed to mix tools tends to call every listed tool in turn,
//!   with invented arguments, before it has seen any result;
//! - tools in `single_call` are called at most once per reply. When tools
//!   may be mixed, a reply holds at most one call to any of them (the others
//!   around it): a grammar that counted each such tool separately would grow
//!   with every ordering of them;
//! - `max_string_chars` and `max_array_items` bound strings and arrays the
//!   schema leaves unbounded (see [`tighten`]).
//!
//! Prose may not contain `{` at all: a JSON object in prose would be read as
//! a call by the loop's parser without having been checked by the grammar.
//! For Hermes models each call is wrapped in `<tool_call>` … `</tool_call>`,
//! and prose may not start with `<`.
//!
//! # Repeats
//! A tiny model that has written a call often writes it again, word for
//! word, and again. [`ConstraintMatcher::repeated_a_call`] notices the first
//! copy (the same name and arguments, key order aside); the generation then
//! ends and the reply is cut to the calls before it.
//!
//! # Prose or a call
//! Under "text or calls" the first token decides: prose cannot start with
//! `{` (nor `<` for Hermes), a call must. A tiny model puts most of its
//! weight on prose even when a shown tool does exactly what was asked, so
//! the request's `call_threshold` ([`Decoding::call_threshold`], or
//! [`ConstraintMatcher::with_call_threshold`]) settles the branch: when the
//! model gives the call tokens at least that probability at the first token,
//! prose is masked out.
//!
//! The JSON's whitespace is left to the model (a tiny model picks worse
//! values when forced into compact JSON), but each run of it is bounded so
//! that it cannot pad forever; `max_new_tokens` still caps the whole reply.
//!
//! # Schemas llguidance cannot compile
//! A tool schema is tried as it is, then with llguidance's lenient mode
//! (keywords it does not implement ignored: `uniqueItems`, `not`,
//! `if`/`then`/`else`, unknown formats…), then as an object with the
//! schema's property names and no value constraints (a schema that is
//! unsatisfiable, such as an `enum` of strings on an integer, ends here),
//! then as any object. Each step down is a warning naming what the grammar
//! leaves unchecked, once per schema, and [`ConstraintEngine::enforcement`]
//! reports it; the loop still validates every call against the real schema
//! and repairs it. Whatever compiles fully, the grammar and the schema agree:
//! every call the grammar admits validates (`tests/schema_validity.rs`).
//!
//! # The vocabulary
//! The token trie is built from the model's own `tokenizer.json` (the bytes
//! of every token) and the crate's `tokenizers` object (to tokenize forced
//! text), so no second tokenizer library is needed. The end-of-sequence set
//! is the model's own stop tokens: a chat model ends its turn with
//! `<|im_end|>`, not the tokenizer's `<|endoftext|>`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tokenizers::Tokenizer;
use wma_agent::{CallFormat, Constraint, Decoding, Steered, ToolDefinition};

use crate::copy::{AvoidNames, CopyBias, Position, mask_unless_all, value_position};
use crate::encode::PromptEncoder;
use crate::error::OrtError;

/// The longest run of whitespace the grammar allows between two JSON tokens
/// (enough for a newline and the indentation of a pretty-printed call).
pub const MAX_JSON_WHITESPACE: usize = 12;

/// Whitespace the model may write between JSON tokens.
fn json_whitespace() -> String {
    format!("[\\x20\\x0A\\x0D\\x09]{{1,{MAX_JSON_WHITESPACE}}}")
}

/// Schemas whose compiled form is remembered; beyond this the memory is
/// cleared (tool lists are small, but a long-running host sees many pages).
const SCHEMA_CACHE_LIMIT: usize = 512;

/// Builds grammars for one tokenizer and turns them into [`ConstraintMatcher`]s.
///
/// Made once per model (building the token trie takes tens of milliseconds);
/// each generation then compiles its own grammar (milliseconds).
pub struct ConstraintEngine {
    /// Compiles grammars against the token trie.
    factory: ParserFactory,
    /// Whether `<tool_call>` is a special token (then the grammar names the
    /// token instead of spelling the text).
    tool_call_token: bool,
    /// Tokens whose first byte is `{` (Json) / `<` (Hermes): where text or
    /// calls are allowed, exactly the tokens that start a call.
    call_starts: [Arc<Vec<u32>>; 2],
    /// Tokens whose first byte is `"`: what may close a string value.
    quote_tokens: Arc<Vec<u32>>,
    /// The tokenizer's added tokens, one bit each: the copy bias never
    /// lifts them.
    control: Arc<Vec<u32>>,
    /// How far each token goes towards closing an open call, from outside
    /// and from inside a string ([`closing_score`]).
    closing: Arc<[Vec<i16>; 2]>,
    /// Tool schema (as JSON text) and the limits it was tightened with →
    /// the schema the grammar uses for it, so a schema is only probed once.
    schemas: Mutex<HashMap<(String, Limits), ArgumentsSchema>>,
}

/// The parts of a [`Decoding`] that change a tool's schema in the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Limits {
    max_string_chars: Option<u32>,
    max_array_items: Option<u32>,
}

impl Limits {
    fn of(decoding: &Decoding) -> Self {
        Self {
            max_string_chars: decoding.max_string_chars,
            max_array_items: decoding.max_array_items,
        }
    }
}

/// What the grammar uses for one tool's arguments.
#[derive(Debug, Clone)]
struct ArgumentsSchema {
    /// The schema.
    schema: Value,
    /// Whether llguidance must ignore keywords it does not implement.
    lenient: bool,
    /// How much of the tool's schema the grammar checks.
    enforcement: Enforcement,
}

/// How much of a tool's schema the grammar checks. Where it checks less
/// than all, the loop's validation (and its repair) is what catches a call
/// that breaks the rest; the provider says so in a warning when it first
/// compiles the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enforcement {
    /// All of it: every call the grammar lets through validates.
    Full,
    /// All but these keywords, which llguidance does not implement
    /// (`uniqueItems`, `not`, `if`/`then`/`else`, `contains`…) or formats
    /// it does not know.
    IgnoresKeywords(Vec<String>),
    /// The schema cannot be compiled (it is unsatisfiable or malformed):
    /// only the property names and `required` are checked.
    NamesOnly,
    /// Nothing can be compiled: any object.
    AnyObject,
}

impl std::fmt::Debug for ConstraintEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintEngine")
            .field(
                "vocab_size",
                &self.factory.tok_env().tok_trie().vocab_size(),
            )
            .field("eos", &self.factory.tok_env().tok_trie().eos_tokens())
            .finish_non_exhaustive()
    }
}

impl ConstraintEngine {
    /// An engine for a tokenizer: `tokenizer_json` is the text of its
    /// `tokenizer.json`, `tokenizer` the same file loaded, `stop_ids` the
    /// tokens that end the model's turn (the grammar's end-of-sequence), and
    /// `vocab_size` the width of the model's logits when known (a padded
    /// vocabulary gets placeholder tokens that are never allowed).
    pub fn new(
        tokenizer_json: &str,
        tokenizer: Tokenizer,
        stop_ids: &[u32],
        vocab_size: Option<usize>,
    ) -> Result<Self, OrtError> {
        let invalid = |reason: String| OrtError::invalid("tokenizer.json", reason);
        let json: Value =
            serde_json::from_str(tokenizer_json).map_err(|e| invalid(e.to_string()))?;
        let mut token_bytes = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| invalid(format!("cannot read the vocabulary for constraints: {e}")))?;
        let size = token_bytes
            .len()
            .max(tokenizer.get_vocab_size(true))
            .max(vocab_size.unwrap_or(0));
        // Ids with no bytes (gaps, padding up to the logits' width) become
        // special placeholders, which a grammar never allows.
        token_bytes.resize(size, Vec::new());
        for (id, bytes) in token_bytes.iter_mut().enumerate() {
            if bytes.is_empty() {
                let mut name = format!(".<[{id}]>").into_bytes();
                name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
                *bytes = name;
            }
        }
        let eos: Vec<TokenId> = stop_ids
            .iter()
            .copied()
            .filter(|&id| (id as usize) < size)
            .collect();
        let Some(&first_eos) = eos.first() else {
            return Err(invalid(
                "the model has no end-of-sequence token in its vocabulary".into(),
            ));
        };
        let info = TokRxInfo::new(size as u32, first_eos);
        let trie = TokTrie::from(&info, &token_bytes).with_eos_tokens(&eos);
        let hermes_opening = CallFormat::Hermes.opening();
        let tool_call_token = trie.get_special_token(hermes_opening).is_some();
        let starting_with = |format: CallFormat| {
            let byte = first_byte(format);
            let mut bits = vec![0u32; size.div_ceil(32)];
            for id in 0..size as u32 {
                if trie.token(id).first() == Some(&byte) {
                    bits[id as usize / 32] |= 1 << (id % 32);
                }
            }
            Arc::new(bits)
        };
        // Where `<tool_call>` is a special token, it is how the model opens
        // a Hermes call (the grammar names that token), and it belongs with
        // the call's first tokens: its bytes carry the special-token marker,
        // not `<`.
        let mut hermes_starts = starting_with(CallFormat::Hermes);
        if let Some(id) = trie.get_special_token(hermes_opening) {
            Arc::make_mut(&mut hermes_starts)[id as usize / 32] |= 1 << (id % 32);
        }
        let call_starts = [starting_with(CallFormat::Json), hermes_starts];
        let quote_tokens = Arc::new(
            (0..size as u32)
                .filter(|&id| trie.token(id).first() == Some(&b'"'))
                .collect(),
        );
        let closing = Arc::new([false, true].map(|in_string| {
            (0..size as u32)
                .map(|id| closing_score(trie.token(id), in_string))
                .collect()
        }));
        let mut control = vec![0u32; size.div_ceil(32)];
        for id in tokenizer.get_added_tokens_decoder().into_keys() {
            if let Some(word) = control.get_mut(id as usize / 32) {
                *word |= 1 << (id % 32);
            }
        }
        // Text the grammar forces (a tool's name, a schema's `const`) comes
        // from tools and pages: it is tokenized as plain text, so that it
        // can never be a control token.
        let env: TokEnv = Arc::new(VocabEnv {
            trie,
            encoder: PromptEncoder::new(tokenizer),
        });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| invalid(format!("cannot prepare constraints: {e}")))?;
        // Grammar warnings go to `tracing`, not stderr.
        factory.quiet();
        Ok(Self {
            factory,
            tool_call_token,
            call_starts,
            quote_tokens,
            control: Arc::new(control),
            closing,
            schemas: Mutex::new(HashMap::new()),
        })
    }

    /// The vocabulary size the masks cover.
    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// The ids llguidance is given for text a grammar forces (a tool's name,
    /// a `const`): plain text, never one of the tokenizer's added tokens.
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        self.factory.tok_env().tokenize(text)
    }

    /// The tokens that end a constrained generation.
    pub fn eos_tokens(&self) -> Vec<u32> {
        self.factory.tok_env().tok_trie().eos_tokens().to_vec()
    }

    /// The Lark grammar for a constraint, with calls in `format`, shaped by
    /// `decoding` (see the module docs). A JSON-schema constraint is the
    /// schema as given; a Lark grammar is used as written.
    pub fn grammar(
        &self,
        constraint: &Constraint,
        format: CallFormat,
        decoding: &Decoding,
    ) -> String {
        match constraint {
            Constraint::TextOrCalls { tools } => self.calls_grammar(tools, format, true, decoding),
            Constraint::CallsOnly { tools } => self.calls_grammar(tools, format, false, decoding),
            Constraint::JsonSchema { schema } => {
                format!("start: %json {}", json_text(&self.usable_schema(schema)))
            }
            Constraint::Grammar { lark } => lark.clone(),
        }
    }

    /// A matcher for one generation under `constraint`, shaped by
    /// `decoding`: its grammar is [`grammar`](Self::grammar)'s, and its call
    /// threshold is `decoding.call_threshold`. The copy bias needs the
    /// request's phrases: see [`ConstraintMatcher::with_copy_bias`].
    pub fn matcher(
        &self,
        constraint: &Constraint,
        format: CallFormat,
        decoding: &Decoding,
    ) -> Result<ConstraintMatcher, OrtError> {
        let lark = self.grammar(constraint, format, decoding);
        let started = Instant::now();
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(lark))
            .map_err(|e| OrtError::Constraint(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        for warning in matcher.grammar_warnings() {
            tracing::debug!(%warning, "constraint grammar");
        }
        if let Some(e) = matcher.get_error() {
            return Err(OrtError::Constraint(e));
        }
        // Only "text or calls" has a branch to settle.
        let call_start = match constraint {
            Constraint::TextOrCalls { tools } if !tools.is_empty() => Some(Arc::clone(
                &self.call_starts[usize::from(format == CallFormat::Hermes)],
            )),
            _ => None,
        };
        let calls = match constraint {
            Constraint::TextOrCalls { tools } | Constraint::CallsOnly { tools }
                if !tools.is_empty() =>
            {
                Some(format)
            }
            _ => None,
        };
        Ok(ConstraintMatcher {
            matcher,
            compile_time: started.elapsed(),
            mask_time: Duration::ZERO,
            masks: 0,
            call_start,
            call_threshold: decoding.call_threshold,
            call_probability: None,
            env: self.factory.tok_env().clone(),
            calls,
            output: Vec::new(),
            tokens: 0,
            unread: 0,
            written: Vec::new(),
            distinct_tokens: 0,
            repeated: false,
            copy: None,
            avoid: AvoidNames::new(&decoding.avoid_in_values),
            quote_tokens: Arc::clone(&self.quote_tokens),
            control: Arc::clone(&self.control),
            closing: Arc::clone(&self.closing),
            steered: Steered::default(),
        })
    }

    fn calls_grammar(
        &self,
        tools: &[ToolDefinition],
        format: CallFormat,
        text: bool,
        decoding: &Decoding,
    ) -> String {
        let mut out = String::new();
        if text && !tools.is_empty() {
            out.push_str("start: text | calls\n");
        } else if tools.is_empty() {
            // Nothing to call: only prose is possible.
            out.push_str("start: text\n");
        } else {
            out.push_str("start: calls\n");
        }
        if text || tools.is_empty() {
            out.push_str("text: TEXT\n");
            // Prose never holds `{` (the parser would read JSON in it as a
            // call), and never starts with whitespace or, for Hermes, `<`.
            match format {
                CallFormat::Json => out.push_str("TEXT: /[^{\\s][^{]*/\n"),
                CallFormat::Hermes => out.push_str("TEXT: /[^{<\\s][^{]*/\n"),
            }
        }
        if tools.is_empty() {
            return out;
        }
        // Calls a line apart; a last newline lets the model end after a call
        // without being pushed into another one.
        out.push_str("SEP: /[ \\t]*\\n[ \\t\\n]{0,3}/\n");
        out.push_str(&calls_rules(tools, decoding));
        for i in 0..tools.len() {
            match format {
                CallFormat::Json => out.push_str(&format!("call_{i}: tool_{i}\n")),
                CallFormat::Hermes => {
                    let (open, close) = if self.tool_call_token {
                        ("<tool_call>", "</tool_call>")
                    } else {
                        ("\"<tool_call>\"", "\"</tool_call>\"")
                    };
                    out.push_str(&format!("call_{i}: {open} HWS? tool_{i} HWS? {close}\n"));
                }
            }
        }
        if format == CallFormat::Hermes {
            out.push_str("HWS: /[ \\t\\n]{1,3}/\n");
        }
        for (i, tool) in tools.iter().enumerate() {
            let args = self.arguments_schema(tool, Limits::of(decoding));
            let mut arguments = args.schema;
            let mut call = Map::new();
            call.insert("type".into(), "object".into());
            // `$ref`s point into the arguments schema's own root; embedded
            // under "arguments" they resolve against the call's root, so the
            // definitions move there.
            if let Value::Object(map) = &mut arguments {
                for key in ["$defs", "definitions"] {
                    if let Some(defs) = map.remove(key) {
                        call.insert(key.into(), defs);
                    }
                }
            }
            call.insert(
                "properties".into(),
                json!({"name": {"const": tool.name}, "arguments": arguments}),
            );
            call.insert("required".into(), json!(["name", "arguments"]));
            call.insert("additionalProperties".into(), Value::Bool(false));
            call.insert("x-guidance".into(), guidance_options(args.lenient));
            out.push_str(&format!(
                "tool_{i}: %json {}\n",
                json_text(&Value::Object(call))
            ));
        }
        out
    }

    /// The schema the grammar uses for a tool's arguments: the tool's own
    /// when llguidance can compile it, else a looser one (logged).
    fn arguments_schema(&self, tool: &ToolDefinition, limits: Limits) -> ArgumentsSchema {
        let key = (json_text(&tool.input_schema), limits);
        if let Some(found) = self.schemas.lock().get(&key) {
            return found.clone();
        }
        let strict = tighten_with(&tool.input_schema, limits);
        let usable = if self.compiles(&strict, false) {
            ArgumentsSchema {
                schema: strict,
                lenient: false,
                enforcement: Enforcement::Full,
            }
        } else if self.compiles(&strict, true) {
            let mut ignored = Vec::new();
            unimplemented_keywords(&tool.input_schema, &mut ignored);
            tracing::warn!(
                tool = %tool.name,
                ignored = %ignored.join(", "),
                "constraint: the grammar cannot express part of the schema and ignores it; calls are still validated against all of it (and repaired) by the loop"
            );
            ArgumentsSchema {
                schema: strict,
                lenient: true,
                enforcement: Enforcement::IgnoresKeywords(ignored),
            }
        } else {
            let loose = loose_schema(&tool.input_schema);
            let (schema, enforcement) = if self.compiles(&loose, false) {
                tracing::warn!(
                    tool = %tool.name,
                    "constraint: the schema cannot be compiled (unsatisfiable or malformed); the grammar only checks its property names, the loop validates the rest"
                );
                (loose, Enforcement::NamesOnly)
            } else {
                tracing::warn!(
                    tool = %tool.name,
                    "constraint: the schema cannot be compiled; the grammar allows any object, the loop validates it"
                );
                (json!({"type": "object"}), Enforcement::AnyObject)
            };
            ArgumentsSchema {
                schema,
                lenient: false,
                enforcement,
            }
        };
        let mut cache = self.schemas.lock();
        if cache.len() >= SCHEMA_CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(key, usable.clone());
        usable
    }

    /// How much of a tool's schema the grammar checks under `decoding` (see
    /// [`Enforcement`]); compiles it when it was not yet.
    pub fn enforcement(&self, tool: &ToolDefinition, decoding: &Decoding) -> Enforcement {
        self.arguments_schema(tool, Limits::of(decoding))
            .enforcement
    }

    /// A whole-output schema (JSON-schema constraints): the schema when it
    /// compiles, else lenient, else any JSON value.
    fn usable_schema(&self, schema: &Value) -> Value {
        let mut with_options = schema.clone();
        if let Value::Object(map) = &mut with_options {
            map.entry("x-guidance")
                .or_insert_with(|| guidance_options(false));
        }
        if self.compiles(&with_options, false) {
            return with_options;
        }
        if let Value::Object(map) = &mut with_options {
            map.insert("x-guidance".into(), guidance_options(true));
        }
        if self.compiles(&with_options, false) {
            tracing::warn!("constraint: schema keywords llguidance does not implement are ignored");
            return with_options;
        }
        tracing::warn!("constraint: schema cannot be compiled; any JSON value is allowed");
        json!({"x-guidance": guidance_options(false)})
    }

    /// Whether llguidance compiles `schema` (as a tool's arguments).
    fn compiles(&self, schema: &Value, lenient: bool) -> bool {
        let mut probe = schema.clone();
        if let Value::Object(map) = &mut probe {
            map.insert("x-guidance".into(), guidance_options(lenient));
        }
        let grammar = TopLevelGrammar::from_lark(format!("start: %json {}", json_text(&probe)));
        match self.factory.create_parser(grammar) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(error = %e, "constraint: schema does not compile");
                false
            }
        }
    }
}

/// One generation's grammar state: which tokens may come next, and whether
/// the output could end here.
pub struct ConstraintMatcher {
    /// llguidance's matcher.
    matcher: Matcher,
    /// Time to compile the grammar.
    compile_time: Duration,
    /// Time spent computing masks so far.
    mask_time: Duration,
    /// Masks computed so far.
    masks: usize,
    /// The tokens that start a call, where the first token chooses between
    /// prose and a call.
    call_start: Option<Arc<Vec<u32>>>,
    /// Call when the model gives calls at least this probability at the
    /// first token.
    call_threshold: Option<f32>,
    /// The probability the model gave calls at the first token.
    call_probability: Option<f32>,
    /// The vocabulary, to follow the text the tokens spell.
    env: TokEnv,
    /// The call format, for constraints that allow calls.
    calls: Option<CallFormat>,
    /// The bytes generated so far.
    output: Vec<u8>,
    /// Tokens consumed so far.
    tokens: usize,
    /// Where the calls not yet read start in `output`.
    unread: usize,
    /// The calls written so far, each once.
    written: Vec<Value>,
    /// Tokens up to the end of the last call that was not a repeat.
    distinct_tokens: usize,
    /// The reply repeated a call it had already written.
    repeated: bool,
    /// The bonus for copying the person's phrases into string arguments.
    copy: Option<CopyBias>,
    /// Names a string value may not begin with (`Decoding::avoid_in_values`).
    avoid: Option<AvoidNames>,
    /// Tokens whose first byte is `"`.
    quote_tokens: Arc<Vec<u32>>,
    /// The tokenizer's added tokens, one bit each.
    control: Arc<Vec<u32>>,
    /// How far each token goes towards closing an open call.
    closing: Arc<[Vec<i16>; 2]>,
    /// Where the pulls changed the model's own choice so far.
    steered: Steered,
}

/// Whether `output` begins a call (after any whitespace: the model may
/// start its reply on a new line) rather than prose.
fn starts_a_call(output: &[u8], format: CallFormat) -> bool {
    output
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == first_byte(format))
}

/// The byte every call of `format` begins with, as text
/// ([`CallFormat::opening`]).
fn first_byte(format: CallFormat) -> u8 {
    format.opening().as_bytes()[0]
}

impl std::fmt::Debug for ConstraintMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintMatcher")
            .field("stopped", &self.matcher.is_stopped())
            .field("masks", &self.masks)
            .finish_non_exhaustive()
    }
}

impl ConstraintMatcher {
    /// A copy in the same state, going on independently: one compiled
    /// grammar for many continuations (tests, search over replies).
    pub fn fork(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            compile_time: self.compile_time,
            mask_time: self.mask_time,
            masks: self.masks,
            call_start: self.call_start.clone(),
            call_threshold: self.call_threshold,
            call_probability: self.call_probability,
            env: self.env.clone(),
            calls: self.calls,
            output: self.output.clone(),
            tokens: self.tokens,
            unread: self.unread,
            written: self.written.clone(),
            distinct_tokens: self.distinct_tokens,
            repeated: self.repeated,
            copy: self.copy.clone(),
            avoid: self.avoid.clone(),
            quote_tokens: Arc::clone(&self.quote_tokens),
            control: Arc::clone(&self.control),
            closing: Arc::clone(&self.closing),
            steered: self.steered,
        }
    }

    /// Sets the logits of every token the grammar does not allow next to
    /// negative infinity. Logits past the vocabulary are disallowed too.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), OrtError> {
        let started = Instant::now();
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| OrtError::Constraint(e.to_string()))?;
        apply_bits(mask.as_slice(), logits);
        if self.masks == 0
            && let Some(starts) = self.call_start.take()
        {
            let p = call_probability(logits, &starts);
            self.call_probability = Some(p);
            if self.call_threshold.is_some_and(|t| p >= t) {
                let own = first_choice(logits);
                apply_bits(&starts, logits);
                self.steered.call_threshold = own != first_choice(logits);
            }
        }
        // Where the reply stands (in a value or not) is read once per token,
        // for the number bound, the copy bias and the avoided names.
        if self.calls.is_some()
            && let Some(position) = value_position(&self.output)
        {
            if let Position::InsideNumber(start) = position {
                bound_number_digits(&self.output[start..], logits, &self.env);
            }
            // Each pull is counted where it changed the token the model
            // ranked first, so that the loop can say which of them acted.
            let mut own = None;
            if let Some(copy) = self.copy.as_ref() {
                let before = first_choice(logits);
                copy.apply(
                    &self.output,
                    position,
                    logits,
                    &self.env,
                    &self.quote_tokens,
                    &self.control,
                );
                let after = first_choice(logits);
                if after != before {
                    self.steered.copy_bias += 1;
                }
                own = Some(after);
            }
            if let Some(avoid) = self.avoid.as_ref() {
                let before = own.unwrap_or_else(|| first_choice(logits));
                avoid.apply(&self.output, position, logits, &self.env);
                if first_choice(logits) != before {
                    self.steered.avoided_names += 1;
                }
            }
        }
        self.mask_time += started.elapsed();
        self.masks += 1;
        Ok(())
    }

    /// Keeps, of the tokens `logits` still allows (call it after
    /// [`mask_logits`](Self::mask_logits)), only those that go furthest
    /// towards closing the call being written: a quote that ends the open
    /// string, a `}` or `]` that ends an object or array, the least new
    /// content where the grammar requires some (a missing required key, a
    /// value after a colon). Taking the model's best of them step after
    /// step finishes the call along a short way the grammar allows, so a
    /// call the token limit cut short becomes a whole one that validates.
    /// Leaves the logits alone right after a backslash in a string, where
    /// any escape the grammar allows will do.
    pub fn close_out(&mut self, logits: &mut [f32]) {
        self.steered.finished_cut_call += 1;
        let scores = match string_state(&self.output) {
            StringState::Outside => &self.closing[0],
            StringState::Inside => &self.closing[1],
            StringState::Escaped => return,
        };
        let score = |id: usize| scores.get(id).copied().unwrap_or(i16::MIN);
        let Some(best) = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(id, _)| score(id))
            .max()
        else {
            return;
        };
        for (id, logit) in logits.iter_mut().enumerate() {
            if logit.is_finite() && score(id) < best {
                *logit = f32::NEG_INFINITY;
            }
        }
    }

    /// Settles "text or calls" for a call when the model gives the call
    /// tokens at least `threshold` probability at the first token (`None`:
    /// the model's own choice). No effect on other constraints.
    pub fn with_call_threshold(mut self, threshold: Option<f32>) -> Self {
        self.call_threshold = threshold;
        self
    }

    /// Gives phrases of the person's messages a bonus inside the string
    /// arguments of calls (see [`crate::copy`]). No effect on constraints
    /// without calls.
    pub fn with_copy_bias(mut self, copy: Option<CopyBias>) -> Self {
        self.copy = copy;
        self
    }

    /// The call probability the model gives at the first token of another
    /// prompt, whose last token's `logits` are given, under this matcher's
    /// grammar; `None` where there is no branch between prose and a call
    /// to settle, or once this matcher has begun. For the neutral baseline
    /// of [`Decoding::call_baseline`].
    pub fn call_probability_of(&self, mut logits: Vec<f32>) -> Result<Option<f32>, OrtError> {
        if self.masks > 0 || self.call_start.is_none() {
            return Ok(None);
        }
        let mut probe = self.fork().with_call_threshold(None);
        probe.copy = None;
        probe.avoid = None;
        probe.mask_logits(&mut logits)?;
        Ok(probe.call_probability)
    }

    /// Raises the call threshold to at least `floor` (a threshold that was
    /// off stays off: the baseline only holds a push back).
    pub fn raise_call_threshold(&mut self, floor: f32) {
        if let Some(threshold) = &mut self.call_threshold {
            *threshold = threshold.max(floor);
        }
    }

    /// The call threshold this matcher settles the first token by.
    pub fn call_threshold(&self) -> Option<f32> {
        self.call_threshold
    }

    /// Where the pulls changed the model's own choice so far (see
    /// [`Steered`]).
    pub fn steered(&self) -> Steered {
        self.steered
    }

    /// The probability the model gave a call at the first token, once
    /// known (text-or-calls constraints only).
    pub fn call_probability(&self) -> Option<f32> {
        self.call_probability
    }

    /// The tokens the grammar forces next: where it allows exactly one
    /// continuation (a key the schema fixes, the rest of a tool's name once
    /// its first letters settle it), that text as the tokenizer writes it,
    /// short of a last token a free choice could still extend. Empty where
    /// the next token is a choice (JSON whitespace is one), and before the
    /// first token of "text or calls" (the branch between prose and a call
    /// is the model's to take, under the call threshold). The tokens must
    /// then be [`consume`](Self::consume)d: the grammar has moved past
    /// their text.
    pub fn forced_tokens(&mut self) -> Vec<u32> {
        if self.call_start.is_some() {
            return Vec::new();
        }
        self.matcher.compute_ff_tokens()
    }

    /// Whether the grammar allows `token` next (computes the mask).
    pub fn allows(&mut self, token: u32) -> Result<bool, OrtError> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| OrtError::Constraint(e.to_string()))?;
        Ok(mask.is_allowed(token))
    }

    /// How many of `tokens`, one after another, the grammar allows from
    /// here, without advancing: a guess at the next tokens (a prompt
    /// lookup draft) is cut where the grammar would refuse it, so the
    /// model is not run over tokens that can never be chosen.
    pub fn allowed_prefix(&mut self, tokens: &[u32]) -> usize {
        // An id past the grammar's vocabulary would stop the matcher.
        let vocab = self.env.tok_trie().vocab_size();
        let known = tokens.iter().take_while(|&&t| (t as usize) < vocab).count();
        self.matcher.validate_tokens(&tokens[..known]).unwrap_or(0)
    }

    /// A guess at the next tokens, at most `max`, that the grammar allows
    /// one after another, without advancing: where the grammar forces a
    /// continuation (a key the schema fixes, the rest of a tool's name),
    /// those tokens; elsewhere what `lookup` proposes after the guess so
    /// far, as far as the grammar takes it; and so on, so that a lookup cut
    /// short by the grammar goes on with what the grammar forces next. The
    /// matcher walks the guess and is rolled back over it.
    pub fn draft(
        &mut self,
        max: usize,
        mut lookup: impl FnMut(&[u32], usize) -> Vec<u32>,
    ) -> Vec<u32> {
        let mut draft: Vec<u32> = Vec::new();
        while draft.len() < max {
            let mut next = self.forced_tokens();
            if next.is_empty() {
                next = lookup(&draft, max - draft.len());
            }
            next.truncate(max - draft.len());
            let taken = self.allowed_prefix(&next);
            if taken == 0 || self.matcher.consume_tokens(&next[..taken]).is_err() {
                break;
            }
            draft.extend_from_slice(&next[..taken]);
            if taken < next.len() || self.matcher.is_stopped() {
                break;
            }
        }
        if !draft.is_empty() && self.matcher.rollback(draft.len()).is_err() {
            // The matcher cannot be trusted past a failed rollback; an
            // error state makes the next mask fail loudly.
            tracing::warn!("constraint: could not roll the draft back");
        }
        draft
    }

    /// Advances past `token`; fails when the grammar does not allow it.
    pub fn consume(&mut self, token: u32) -> Result<(), OrtError> {
        self.matcher
            .consume_token(token)
            .map_err(|e| OrtError::Constraint(e.to_string()))?;
        self.tokens += 1;
        if self.calls.is_some() {
            // A special token (`<tool_call>`) is written as its text, without
            // the trie's marker byte, so the reply reads as the model wrote it.
            let bytes = self.env.tok_trie().token(token);
            let bytes = bytes
                .strip_prefix(&[TokTrie::SPECIAL_TOKEN_MARKER])
                .unwrap_or(bytes);
            self.output.extend_from_slice(bytes);
            self.read_calls();
        }
        Ok(())
    }

    /// Reads the calls completed by the last token, and notes a repeat.
    fn read_calls(&mut self) {
        let Some(format) = self.calls else {
            return;
        };
        // Prose, or a call still open: nothing to read yet.
        if !starts_a_call(&self.output, format) || !self.is_accepting() {
            return;
        }
        let unread = String::from_utf8_lossy(&self.output[self.unread..])
            .replace("</tool_call>", " ")
            .replace("<tool_call>", " ");
        if unread.trim().is_empty() {
            return;
        }
        // The grammar only completes whole calls, a line apart: the unread
        // text is one or more JSON values.
        for value in serde_json::Deserializer::from_str(&unread).into_iter::<Value>() {
            let Ok(call) = value else {
                break;
            };
            if self.written.contains(&call) {
                self.repeated = true;
            } else {
                self.written.push(call);
            }
        }
        self.unread = self.output.len();
        if !self.repeated {
            self.distinct_tokens = self.tokens;
        }
    }

    /// Whether the reply has written a call it had already written (key
    /// order aside). A tiny model that starts copying its own call tends to
    /// go on until the token limit; the generation should end instead, with
    /// the reply cut to [`distinct_tokens`](Self::distinct_tokens).
    pub fn repeated_a_call(&self) -> bool {
        self.repeated
    }

    /// Whether the reply so far has started a tool call (constraints that
    /// allow calls only; prose never starts with a call's opening).
    pub fn writing_call(&self) -> bool {
        self.calls
            .is_some_and(|format| starts_a_call(&self.output, format))
    }

    /// Tokens up to the end of the last call that was not a repeat.
    pub fn distinct_tokens(&self) -> usize {
        self.distinct_tokens
    }

    /// Whether the output so far is complete (the grammar allows ending here).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether nothing but the end may follow (the generation is complete).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Feeds `tokens` one by one; returns how many were allowed (stopping at
    /// the first that was not). For tests and diagnostics.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<usize, OrtError> {
        for (i, &t) in tokens.iter().enumerate() {
            if !self.allows(t)? {
                return Ok(i);
            }
            self.consume(t)?;
        }
        Ok(tokens.len())
    }

    /// Time to compile the grammar.
    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// Time spent computing masks, and how many were computed.
    pub fn mask_stats(&self) -> (Duration, usize) {
        (self.mask_time, self.masks)
    }
}

/// The rules from `calls` down to the `call_i` of each tool: how many calls
/// a reply holds, and to which tools (see the module docs).
fn calls_rules(tools: &[ToolDefinition], decoding: &Decoding) -> String {
    // At least one call: `Some(0)` under "calls only" would leave nothing
    // the model may write.
    let max = decoding.max_calls.map(|n| n.max(1) as usize);
    // `(SEP x)` up to `more` times more: `{0,k}` is left out where k is 0,
    // and `*` is used where there is no bound.
    let repeat = |x: &str, more: Option<usize>| match more {
        Some(0) => String::new(),
        Some(k) => format!(" (SEP {x}){{0,{k}}}"),
        None => format!(" (SEP {x})*"),
    };
    let once = |i: usize| decoding.single_call.contains(&tools[i].name);
    let mut out = String::new();
    if decoding.one_tool_per_reply {
        let runs: Vec<String> = (0..tools.len()).map(|i| format!("calls_{i}")).collect();
        out.push_str(&format!("calls: {}\n", runs.join(" | ")));
        for i in 0..tools.len() {
            let more = if once(i) { Some(0) } else { max.map(|n| n - 1) };
            let call = format!("call_{i}");
            out.push_str(&format!("calls_{i}: {call}{} SEP?\n", repeat(&call, more)));
        }
        return out;
    }
    let (singles, free): (Vec<usize>, Vec<usize>) = (0..tools.len()).partition(|&i| once(i));
    let alternatives = |ids: &[usize]| {
        ids.iter()
            .map(|i| format!("call_{i}"))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    if !free.is_empty() {
        out.push_str(&format!("free_call: {}\n", alternatives(&free)));
    }
    if !singles.is_empty() {
        out.push_str(&format!("single_call: {}\n", alternatives(&singles)));
    }
    // Each reply has exactly one parse: calls to free tools only, or those
    // with one single call among them (after `a` free ones).
    let mut shapes = Vec::new();
    if !free.is_empty() {
        shapes.push(format!(
            "free_call{}",
            repeat("free_call", max.map(|n| n - 1))
        ));
    }
    if !singles.is_empty() {
        if free.is_empty() {
            shapes.push("single_call".to_string());
        } else {
            match max {
                None => shapes.push(format!(
                    "(free_call SEP)* single_call{}",
                    repeat("free_call", None)
                )),
                Some(n) => {
                    for before in 0..n {
                        let lead = if before == 0 {
                            String::new()
                        } else {
                            format!("(free_call SEP){{{before}}} ")
                        };
                        shapes.push(format!(
                            "{lead}single_call{}",
                            repeat("free_call", Some(n - 1 - before))
                        ));
                    }
                }
            }
        }
    }
    let shapes: Vec<String> = shapes.into_iter().map(|s| format!("({s})")).collect();
    out.push_str(&format!("calls: ({}) SEP?\n", shapes.join(" | ")));
    out
}

/// Where the end of `output` stands with respect to JSON strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StringState {
    /// Between JSON tokens (or in prose, which holds no quotes a call reads).
    Outside,
    /// Inside a string.
    Inside,
    /// Inside a string, right after a backslash.
    Escaped,
}

/// Where `output` ends: in a string or not, read from its first byte
/// (prose before a call is never written: a reply is prose or calls).
fn string_state(output: &[u8]) -> StringState {
    let mut state = StringState::Outside;
    for &b in output {
        state = match (state, b) {
            (StringState::Outside, b'"') => StringState::Inside,
            (StringState::Outside, _) => StringState::Outside,
            (StringState::Inside, b'"') => StringState::Outside,
            (StringState::Inside, b'\\') => StringState::Escaped,
            (StringState::Inside | StringState::Escaped, _) => StringState::Inside,
        };
    }
    state
}

/// How far a token's bytes go towards closing an open call, starting
/// inside a string or not: a quote that ends a string or a `}` / `]` earns
/// 2, every byte of new content (an opened string, its letters, digits,
/// whitespace) costs 1 and an opened object or array 2; commas and colons
/// are neutral (they lead to the next required key). Control tokens are
/// neutral too: where one is allowed (`</tool_call>`) it closes a call.
fn closing_score(bytes: &[u8], in_string: bool) -> i16 {
    if bytes.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
        return 0;
    }
    let mut state = if in_string {
        StringState::Inside
    } else {
        StringState::Outside
    };
    let mut score: i16 = 0;
    for &b in bytes {
        let (next, gain) = match (state, b) {
            (StringState::Inside, b'"') => (StringState::Outside, 2),
            (StringState::Inside, b'\\') => (StringState::Escaped, -1),
            (StringState::Inside | StringState::Escaped, _) => (StringState::Inside, -1),
            (StringState::Outside, b'"') => (StringState::Inside, -1),
            (StringState::Outside, b'}' | b']') => (StringState::Outside, 2),
            (StringState::Outside, b'{' | b'[') => (StringState::Outside, -2),
            (StringState::Outside, b',' | b':') => (StringState::Outside, 0),
            (StringState::Outside, _) => (StringState::Outside, -1),
        };
        state = next;
        score = score.saturating_add(gain);
    }
    score
}

/// Sets the logits of tokens whose bit is clear to negative infinity
/// (tokens past the bits are cleared too).
fn apply_bits(bits: &[u32], logits: &mut [f32]) {
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let word = bits.get(w).copied().unwrap_or(0);
        if word == u32::MAX {
            continue;
        }
        for (bit, logit) in chunk.iter_mut().enumerate() {
            if word & (1 << bit) == 0 {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
}

/// Digits a number's mantissa may hold (its integer and fraction parts
/// together).
const MAX_MANTISSA_DIGITS: usize = 40;
/// Digits a number's exponent may hold.
const MAX_EXPONENT_DIGITS: usize = 2;

/// Masks the tokens that would give the number written so far (`number`,
/// from its first byte) more digits than a call's arguments can be read
/// with. JSON bounds no number, and the grammar follows it, but arguments
/// are read as 64-bit floats, which end near 1.8e308: `66.7E8443` is JSON
/// and no argument. Forty digits and a two-digit exponent keep every
/// number readable and every number a tool plausibly takes writable.
fn bound_number_digits(number: &[u8], logits: &mut [f32], env: &TokEnv) {
    let (written, max) = match number.iter().position(|b| matches!(b, b'e' | b'E')) {
        Some(e) => (&number[e + 1..], MAX_EXPONENT_DIGITS),
        None => (number, MAX_MANTISSA_DIGITS),
    };
    let room = max.saturating_sub(written.iter().filter(|b| b.is_ascii_digit()).count());
    // Far from the bound, no token of this vocabulary can cross it.
    if room > 16 {
        return;
    }
    let trie = env.tok_trie();
    let too_long = |t: usize| {
        trie.token(t as u32)
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
            > room
    };
    let masked: Vec<usize> = (0..logits.len())
        .filter(|&t| logits[t].is_finite() && too_long(t))
        .collect();
    mask_unless_all(logits, &masked);
}

/// The token the logits rank first (the lowest id among equals), if any
/// is allowed.
fn first_choice(logits: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (id, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
            best = Some((id, l));
        }
    }
    best.map(|(id, _)| id)
}

/// The softmax mass of the tokens in `bits` among the finite logits.
fn call_probability(logits: &[f32], bits: &[u32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return 0.0;
    }
    let (mut all, mut calls) = (0.0f64, 0.0f64);
    for (id, &l) in logits.iter().enumerate() {
        if l.is_finite() {
            let p = f64::from(l - max).exp();
            all += p;
            if bits.get(id / 32).is_some_and(|w| w & (1 << (id % 32)) != 0) {
                calls += p;
            }
        }
    }
    (calls / all) as f32
}

/// The JSON options of every embedded schema: whitespace chosen by the model
/// but bounded, `oneOf` read as `anyOf` (llguidance cannot check "exactly
/// one"; the loop's validation still does), and optionally lenient.
fn guidance_options(lenient: bool) -> Value {
    json!({
        "whitespace_pattern": json_whitespace(),
        "coerce_one_of": true,
        "lenient": lenient,
    })
}

fn json_text(value: &Value) -> String {
    // Serializing a Value cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| "{}".into())
}

/// The largest integer (in size) the grammar lets the model write where the
/// schema sets no bound: fifteen digits. This is a safety limit, not a
/// policy: every such integer is exact as a JavaScript number (below 2^53),
/// which is what WebMCP tools receive, and a number cannot go on forever.
pub const MAX_INTEGER: i64 = 999_999_999_999_999;

/// A string, number, boolean or null: what a free-form object holds when
/// values are bounded.
fn plain_value(max_string_chars: Option<u32>) -> Value {
    let mut string = json!({"type": "string"});
    if let Some(n) = max_string_chars {
        string["maxLength"] = n.into();
    }
    let bound = MAX_INTEGER as f64;
    json!({"anyOf": [
        string,
        {"type": "number", "maximum": bound, "minimum": -bound},
        {"type": "boolean"},
        {"type": "null"}
    ]})
}

/// The schema as the grammar uses it, with the value limits of `decoding`:
/// an object schema; objects that list their properties take no others
/// unless they say so (a model should only write the arguments a tool
/// declares: the tool's own validation may be more forgiving, but an
/// invented argument is never what the person wants); integers stay within
/// [`MAX_INTEGER`]. Where `decoding` bounds values, strings the schema
/// leaves unbounded end within `max_string_chars`, arrays within
/// `max_array_items`, and free-form objects hold plain values (nested free
/// objects let a tiny model nest until the token limit); `None` leaves them
/// as the schema says.
pub fn tighten(schema: &Value, decoding: &Decoding) -> Value {
    tighten_with(schema, Limits::of(decoding))
}

fn tighten_with(schema: &Value, limits: Limits) -> Value {
    let mut out = match schema {
        Value::Object(map) if !map.is_empty() => schema.clone(),
        // `{}` or `true`: any arguments object.
        _ => return json!({"type": "object"}),
    };
    if let Value::Object(map) = &mut out
        && !map.contains_key("type")
        && !map.contains_key("$ref")
        && !map.contains_key("anyOf")
        && !map.contains_key("oneOf")
        && !map.contains_key("allOf")
    {
        map.insert("type".into(), "object".into());
    }
    close_objects(&mut out, limits);
    out
}

fn close_objects(schema: &mut Value, limits: Limits) {
    let Value::Object(map) = schema else {
        return;
    };
    let ty = map.get("type").and_then(Value::as_str).map(str::to_owned);
    let ty = ty.as_deref();
    let number = |key: &str| map.get(key).and_then(Value::as_f64);
    let has = |key: &str| map.contains_key(key);
    let add_max_length = limits.max_string_chars.filter(|&max| {
        ty == Some("string")
            && ["maxLength", "enum", "const", "pattern", "format"]
                .iter()
                .all(|k| !has(k))
            && number("minLength").is_none_or(|min| min <= f64::from(max))
    });
    let add_max_items = limits.max_array_items.filter(|&max| {
        ty == Some("array")
            && !has("maxItems")
            && number("minItems").is_none_or(|min| min <= f64::from(max))
    });
    // The safety bound on integers and numbers, only where it leaves the
    // schema's own range non-empty. For numbers it also keeps exponents
    // out: unbounded, a grammar lets `7e123456` through, which no JSON
    // parser reads as a number.
    let integer = matches!(ty, Some("integer" | "number"));
    let bound = MAX_INTEGER as f64;
    let add_maximum = integer
        && !has("maximum")
        && !has("exclusiveMaximum")
        && number("minimum").is_none_or(|v| v < bound)
        && number("exclusiveMinimum").is_none_or(|v| v < bound);
    let add_minimum = integer
        && !has("minimum")
        && !has("exclusiveMinimum")
        && number("maximum").is_none_or(|v| v > -bound)
        && number("exclusiveMaximum").is_none_or(|v| v > -bound);
    if let Some(max) = add_max_length {
        map.insert("maxLength".into(), max.into());
    }
    if let Some(max) = add_max_items {
        map.insert("maxItems".into(), max.into());
    }
    let (high, low): (Value, Value) = if ty == Some("number") {
        ((MAX_INTEGER as f64).into(), (-(MAX_INTEGER as f64)).into())
    } else {
        (MAX_INTEGER.into(), (-MAX_INTEGER).into())
    };
    if add_maximum {
        map.insert("maximum".into(), high);
    }
    if add_minimum {
        map.insert("minimum".into(), low);
    }
    // `"properties": {}` says "no arguments"; only an object that does not
    // list properties at all is free-form.
    let lists_properties = map.get("properties").is_some_and(Value::is_object);
    let open = !map.contains_key("additionalProperties") && !map.contains_key("patternProperties");
    let bounded = limits.max_string_chars.is_some() || limits.max_array_items.is_some();
    if lists_properties && open {
        map.insert("additionalProperties".into(), Value::Bool(false));
    } else if ty == Some("object") && open && bounded {
        map.insert(
            "additionalProperties".into(),
            plain_value(limits.max_string_chars),
        );
    }
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            children.values_mut().for_each(|c| close_objects(c, limits));
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(child) = map.get_mut(key) {
            close_objects(child, limits);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(children)) = map.get_mut(key) {
            children.iter_mut().for_each(|c| close_objects(c, limits));
        }
    }
}

/// Keywords llguidance implements or may ignore as annotations (its own
/// lists); anything else in a schema is ignored in lenient mode.
const KNOWN_KEYWORDS: [&str; 42] = [
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "const",
    "enum",
    "type",
    "items",
    "additionalItems",
    "prefixItems",
    "minItems",
    "maxItems",
    "properties",
    "additionalProperties",
    "patternProperties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "$anchor",
    "$defs",
    "definitions",
    "$schema",
    "$id",
    "id",
    "$comment",
    "title",
    "description",
    "default",
    "readOnly",
    "writeOnly",
    "examples",
    "contentMediaType",
    "contentEncoding",
];

/// Formats llguidance checks; others are ignored in lenient mode.
const KNOWN_FORMATS: [&str; 10] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
    "uri",
];

/// Adds to `out` the keywords (and `format: x` for unknown formats) of
/// `schema` that llguidance does not implement, for the warning.
fn unimplemented_keywords(schema: &Value, out: &mut Vec<String>) {
    let Value::Object(map) = schema else {
        return;
    };
    let mut note = |s: String| {
        if !out.contains(&s) {
            out.push(s);
        }
    };
    for (key, value) in map {
        if !KNOWN_KEYWORDS.contains(&key.as_str()) && !key.starts_with("x-") {
            note(key.clone());
        }
        if key == "format"
            && let Some(f) = value.as_str()
            && !KNOWN_FORMATS.contains(&f)
        {
            note(format!("format: {f}"));
        }
    }
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Value::Object(children)) = map.get(key) {
            children
                .values()
                .for_each(|c| unimplemented_keywords(c, out));
        }
    }
    for key in ["items", "additionalProperties", "not", "additionalItems"] {
        if let Some(child) = map.get(key) {
            unimplemented_keywords(child, out);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(children)) = map.get(key) {
            children.iter().for_each(|c| unimplemented_keywords(c, out));
        }
    }
}

/// An object with the schema's property names (any values) and its required
/// list: what the grammar checks when the real schema cannot be compiled.
/// A schema closed to the keys it lists (`additionalProperties: false`)
/// stays closed even when it lists none: only `{}` is written then, never a
/// key the tool would refuse.
pub fn loose_schema(schema: &Value) -> Value {
    let names: Vec<String> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    if names.is_empty() {
        return if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        } else {
            json!({"type": "object"})
        };
    }
    let properties: Map<String, Value> = names.iter().map(|n| (n.clone(), json!({}))).collect();
    let required: Vec<Value> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter(|n| n.as_str().is_some_and(|n| names.iter().any(|m| m == n)))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    })
}

/// llguidance's view of the vocabulary: the token trie, plus our tokenizer
/// for the text a grammar forces.
struct VocabEnv {
    /// Every token's bytes, with the model's stop tokens as end-of-sequence.
    trie: TokTrie,
    /// The model's tokenizer, reading no added tokens from text.
    encoder: PromptEncoder,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.encoder
                .encode_plain(text)
                // The trie's greedy tokenization is the fallback when the
                // tokenizer refuses the text.
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limits the small-model policy sets.
    fn bounded() -> Decoding {
        Decoding {
            max_string_chars: Some(100),
            max_array_items: Some(16),
            ..Decoding::default()
        }
    }

    #[test]
    fn tighten_closes_objects_that_list_properties() {
        let schema = json!({"properties": {
            "q": {"type": "string"},
            "opts": {"type": "object", "properties": {"n": {"type": "integer"}}},
            "free": {"type": "object"},
            "none": {"type": "object", "properties": {}},
            "open": {"type": "object", "properties": {"a": {}}, "additionalProperties": true},
        }});
        let t = tighten(&schema, &bounded());
        assert_eq!(t["type"], "object");
        assert_eq!(t["additionalProperties"], false);
        assert_eq!(t["properties"]["opts"]["additionalProperties"], false);
        assert_eq!(t["properties"]["open"]["additionalProperties"], true);
        assert_eq!(tighten(&json!({}), &bounded()), json!({"type": "object"}));
        assert_eq!(t["properties"]["q"]["maxLength"], 100);
        assert_eq!(
            t["properties"]["free"]["additionalProperties"],
            plain_value(Some(100))
        );
        let schema = json!({"type": "object", "properties": {
            "n": {"type": "integer", "minimum": 1},
            "big": {"type": "integer", "minimum": 1e16},
            "xs": {"type": "array", "items": {"type": "string"}},
            "free": {"type": "object"}
        }});
        let limited = tighten(&schema, &bounded());
        assert_eq!(limited["properties"]["n"]["minimum"], 1);
        assert_eq!(limited["properties"]["n"]["maximum"], MAX_INTEGER);
        assert!(
            limited["properties"]["big"].get("maximum").is_none(),
            "the safety bound never empties a range"
        );
        assert_eq!(limited["properties"]["xs"]["maxItems"], 16);
        assert_eq!(limited["properties"]["xs"]["items"]["maxLength"], 100);
        // Without limits, strings, arrays and free objects stay as the
        // schema says; only the integer safety bound remains.
        let number = tighten(
            &json!({"type": "object", "properties": {
                "x": {"type": "number"},
                "pos": {"type": "number", "exclusiveMinimum": 0}
            }}),
            &Decoding::default(),
        );
        assert_eq!(number["properties"]["x"]["maximum"], MAX_INTEGER as f64);
        assert_eq!(number["properties"]["x"]["minimum"], -(MAX_INTEGER as f64));
        assert_eq!(number["properties"]["pos"]["maximum"], MAX_INTEGER as f64);
        assert!(number["properties"]["pos"].get("minimum").is_none());
        let free = tighten(&schema, &Decoding::default());
        assert_eq!(free["properties"]["n"]["maximum"], MAX_INTEGER);
        assert!(free["properties"]["xs"].get("maxItems").is_none());
        assert!(free["properties"]["xs"]["items"].get("maxLength").is_none());
        assert!(
            free["properties"]["free"]
                .get("additionalProperties")
                .is_none()
        );
        assert_eq!(free["additionalProperties"], false);
    }

    #[test]
    fn a_closed_schema_stays_closed_when_loosened() {
        let closed = json!({"type": "object", "additionalProperties": false, "required": ["x"]});
        assert_eq!(
            loose_schema(&closed),
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
        assert_eq!(
            loose_schema(&json!({"type": "object"})),
            json!({"type": "object"})
        );
        // An explicitly closed object that lists nothing keeps its closure
        // through tightening too.
        let tight = tighten(&closed, &bounded());
        assert_eq!(tight["additionalProperties"], false);
    }

    #[test]
    fn loose_schema_keeps_names_and_required() {
        let schema = json!({"type": "object",
            "properties": {"a": {"type": "weird"}, "b": {"x-odd": 1}},
            "required": ["a", "zzz"]});
        assert_eq!(
            loose_schema(&schema),
            json!({"type": "object", "properties": {"a": {}, "b": {}},
                "required": ["a"], "additionalProperties": false})
        );
    }
}
