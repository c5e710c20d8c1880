//! The grammar and the schema agree: every call written under a constraint
//! validates against its tool's schema (with `wma_agent::validate_args`, as
//! the loop checks it).
//!
//! Calls are written by a seeded random walk through the grammar on the
//! default model's real vocabulary (JSON calls) and on Qwen2 vocabularies
//! (`<tool_call>` calls): at each token one of the tokens the mask
//! allows is drawn, closing tokens (`"`, `}`, `]`) a little more often so
//! that values end. No model runs, so the walk reaches every corner the
//! grammar allows, where a model would stay on its favourite paths. The
//! schemas are hand-written hard ones (nesting, enums of every type, `const`,
//! formats, `anyOf`/`oneOf`, bounds, `$ref`) and, when the set-up has
//! fetched BFCL, the tool schemas of its data, converted by the code
//! `wma eval bfcl` converts them with.

mod common;
#[path = "common/qwen2.rs"]
mod qwen2;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::{Map, Value, json};
use tokenizers::Tokenizer;
use wma_agent::{
    CallFormat, CompiledSchema, Constraint, Decoding, ToolDefinition, parse_tool_calls,
};
use wma_provider_ort::{
    ConstraintEngine, ConstraintMatcher, Enforcement, cache_dir, default_model_dir,
};

/// Tokens one walk may take before it counts as unfinished.
const MAX_TOKENS: usize = 300;

/// The default model's `tokenizer.json`.
fn tokenizer_json() -> Value {
    let file = default_model_dir(&cache_dir().expect("no cache folder: set WMA_CACHE_DIR"))
        .join("tokenizer.json");
    assert!(
        file.is_file(),
        "the default model's tokenizer is missing at {}: run scripts/setup.sh",
        file.display()
    );
    serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap()
}

/// The vocabulary a walk runs on, with `<|im_end|>` as its end, and the
/// call format its model writes.
struct Vocab {
    engine: ConstraintEngine,
    tokenizer: Tokenizer,
    end: u32,
    format: CallFormat,
    /// How the walk weighs each token.
    kinds: Vec<Kind>,
}

impl Vocab {
    fn new(json: &Value, format: CallFormat) -> Self {
        let text = json.to_string();
        let tokenizer = Tokenizer::from_str(&text).unwrap();
        let end = tokenizer.token_to_id("<|im_end|>").unwrap();
        let engine = ConstraintEngine::new(&text, tokenizer.clone(), &[end], None).unwrap();
        let kinds = token_kinds(&tokenizer, engine.vocab_size());
        Self {
            engine,
            tokenizer,
            end,
            format,
            kinds,
        }
    }

    /// The default model's whole vocabulary.
    fn full() -> Self {
        Self::new(&tokenizer_json(), CallFormat::Json)
    }

    /// A Qwen2 vocabulary (`<tool_call>` an added token, bytes as
    /// characters), with calls in Qwen's `<tool_call>` tags.
    fn qwen2(tokenizer: &Path) -> Self {
        let json = serde_json::from_str(&std::fs::read_to_string(tokenizer).unwrap()).unwrap();
        Self::new(&json, CallFormat::Hermes)
    }

    /// The default model's tokens of one or two bytes (2,060 of 49,152),
    /// `<|im_end|>` and the merges between them: every text can still be
    /// written, and two-byte tokens such as `"}` and `",` still cross JSON
    /// lexemes, but a mask costs a twentieth. For sweeping thousands of
    /// schemas.
    fn short_tokens() -> Self {
        let mut json = tokenizer_json();
        let vocab = json["model"]["vocab"].as_object().unwrap();
        let mut kept: Vec<(&String, u64)> = vocab
            .iter()
            .filter(|(k, _)| k.chars().count() <= 2)
            .map(|(k, v)| (k, v.as_u64().unwrap()))
            .collect();
        kept.sort_by_key(|(_, id)| *id);
        let new_vocab: Map<String, Value> = kept
            .iter()
            .enumerate()
            .map(|(i, (k, _))| ((*k).clone(), Value::from(i)))
            .collect();
        let merges: Vec<Value> = json["model"]["merges"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| {
                let (a, b) = m.as_str().unwrap().split_once(' ').unwrap();
                [a, b, &format!("{a}{b}")]
                    .iter()
                    .all(|t| new_vocab.contains_key(*t))
            })
            .cloned()
            .collect();
        let end = new_vocab.len();
        json["added_tokens"] = json!([{"id": end, "content": "<|im_end|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}]);
        json["model"]["vocab"] = Value::Object(new_vocab);
        json["model"]["merges"] = Value::Array(merges);
        Self::new(&json, CallFormat::Json)
    }
}

/// xorshift64*: a fixed stream per seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What one walk wrote.
enum Walk {
    /// The grammar ended the reply: its text.
    Done(String),
    /// Still going at the token limit.
    Unfinished,
}

/// One random walk through a fresh copy of `start`, the grammar of "calls
/// only" for one tool.
fn walk(vocab: &Vocab, start: &ConstraintMatcher, seed: u64) -> Walk {
    walk_cut(vocab, start, seed, None)
}

/// [`walk`], cut after `cut` tokens: from there on, only the tokens
/// [`ConstraintMatcher::close_out`] keeps are drawn, as the provider
/// finishes a call the token limit cut.
fn walk_cut(vocab: &Vocab, start: &ConstraintMatcher, seed: u64, cut: Option<usize>) -> Walk {
    let Vocab {
        tokenizer,
        end,
        kinds,
        ..
    } = vocab;
    let mut m = start.fork();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut ids = Vec::new();
    let mut logits = vec![0.0f32; vocab.engine.vocab_size()];
    while ids.len() < MAX_TOKENS {
        logits.fill(0.0);
        m.mask_logits(&mut logits).unwrap();
        if cut.is_some_and(|cut| ids.len() >= cut) {
            m.close_out(&mut logits);
        }
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&t| logits[t as usize].is_finite())
            .collect();
        assert!(
            !allowed.is_empty(),
            "the grammar allows nothing after {ids:?}"
        );
        // End as soon as the grammar allows it: one call is enough.
        if allowed.contains(end) {
            return Walk::Done(tokenizer.decode(&ids, false).unwrap());
        }
        let of_kind = |kind: Kind| -> Vec<u32> {
            allowed
                .iter()
                .copied()
                .filter(|&t| kinds[t as usize] == kind)
                .collect()
        };
        let (closers, spaces, others) = (
            of_kind(Kind::Closing),
            of_kind(Kind::Space),
            of_kind(Kind::Other),
        );
        // Mostly values and keys; a value ends a third of the time it can;
        // whitespace now and then (the grammar bounds it, the walk need not
        // spend its tokens there).
        let pool = match rng.below(12) {
            0..=3 if !closers.is_empty() => &closers,
            4 if !spaces.is_empty() => &spaces,
            _ if !others.is_empty() => &others,
            _ if !closers.is_empty() => &closers,
            _ => &allowed,
        };
        let token = pool[rng.below(pool.len())];
        m.consume(token).unwrap();
        ids.push(token);
        if m.is_finished() {
            return Walk::Done(tokenizer.decode(&ids, false).unwrap());
        }
    }
    Walk::Unfinished
}

/// How the walk weighs a token.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Starts by closing a string, an object or an array.
    Closing,
    /// Only whitespace.
    Space,
    /// Anything else.
    Other,
}

fn token_kinds(tokenizer: &Tokenizer, vocab_size: usize) -> Vec<Kind> {
    (0..vocab_size as u32)
        .map(|id| {
            let text = tokenizer.decode(&[id], false).unwrap_or_default();
            if text.starts_with(['"', '}', ']']) {
                Kind::Closing
            } else if !text.is_empty() && text.trim().is_empty() {
                Kind::Space
            } else {
                Kind::Other
            }
        })
        .collect()
}

/// Hand-written schemas that tools send and grammars get wrong.
fn hard_schemas() -> Vec<(String, Value)> {
    let schemas = [
        (
            "nested objects, required inside",
            json!({"type": "object", "properties": {
                "order": {"type": "object", "properties": {
                    "id": {"type": "string"},
                    "shipping": {"type": "object", "properties": {
                        "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
                    }, "required": ["city", "zip"]}
                }, "required": ["id", "shipping"]}
            }, "required": ["order"]}),
        ),
        (
            "arrays of objects",
            json!({"type": "object", "properties": {
                "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
                    "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}
                }, "required": ["sku", "qty"]}}
            }, "required": ["items"]}),
        ),
        (
            "enums of every type",
            json!({"type": "object", "properties": {
                "n": {"enum": [1, 2, 3.5]},
                "b": {"enum": [true, false]},
                "z": {"enum": [null, "none"]},
                "mixed": {"enum": ["a", 1, false, null, {"k": 1}, [1, 2]]},
                "typed": {"type": "string", "enum": ["red", "green"]}
            }, "required": ["n", "b", "z", "mixed", "typed"]}),
        ),
        (
            "const",
            json!({"type": "object", "properties": {
                "version": {"const": 2}, "kind": {"const": "order"}, "flag": {"const": true}
            }, "required": ["version", "kind", "flag"]}),
        ),
        (
            "formats",
            json!({"type": "object", "properties": {
                "day": {"type": "string", "format": "date"},
                "at": {"type": "string", "format": "date-time"},
                "time": {"type": "string", "format": "time"},
                "mail": {"type": "string", "format": "email"},
                "link": {"type": "string", "format": "uri"},
                "id": {"type": "string", "format": "uuid"},
                "ip": {"type": "string", "format": "ipv4"}
            }, "required": ["day", "at", "time", "mail", "link", "id", "ip"]}),
        ),
        (
            "anyOf and oneOf",
            json!({"type": "object", "properties": {
                "target": {"anyOf": [
                    {"type": "string", "minLength": 2},
                    {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
                ]},
                "size": {"oneOf": [
                    {"type": "integer", "minimum": 10},
                    {"type": "string", "enum": ["S", "M", "L"]}
                ]},
                "maybe": {"type": ["string", "null"]}
            }, "required": ["target", "size", "maybe"]}),
        ),
        (
            "defaults",
            json!({"type": "object", "properties": {
                "limit": {"type": "integer", "default": 10, "minimum": 1, "maximum": 50},
                "sort": {"type": "string", "enum": ["asc", "desc"], "default": "asc"},
                "tags": {"type": "array", "items": {"type": "string"}, "default": []}
            }}),
        ),
        (
            "number bounds",
            json!({"type": "object", "properties": {
                "ratio": {"type": "number", "minimum": 0, "maximum": 1},
                "above": {"type": "number", "exclusiveMinimum": 0},
                "below": {"type": "integer", "exclusiveMaximum": 100, "minimum": -5},
                "step": {"type": "number", "multipleOf": 0.5},
                "count": {"type": "integer"},
                "price": {"type": "number"}
            }, "required": ["ratio", "above", "below", "step", "count", "price"]}),
        ),
        (
            "additionalProperties",
            json!({"type": "object", "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "scores": {"type": "object", "additionalProperties": {"type": "number"}, "minProperties": 1},
                "free": {"type": "object"},
                "closed": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": false}
            }, "required": ["labels", "scores", "free", "closed"]}),
        ),
        (
            "$ref and $defs",
            json!({"type": "object",
                "properties": {
                    "from": {"$ref": "#/$defs/place"},
                    "to": {"$ref": "#/$defs/place"},
                    "stops": {"type": "array", "items": {"$ref": "#/$defs/place"}, "maxItems": 2}
                },
                "required": ["from", "to"],
                "$defs": {"place": {"type": "object", "properties": {
                    "name": {"type": "string"}, "kind": {"enum": ["city", "airport"]}
                }, "required": ["name", "kind"]}}}),
        ),
        (
            "string lengths and patterns",
            json!({"type": "object", "properties": {
                "code": {"type": "string", "minLength": 3, "maxLength": 3},
                "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                "note": {"type": "string", "minLength": 1}
            }, "required": ["code", "sku", "note"]}),
        ),
        (
            "arrays: bounds, unique items, tuples",
            json!({"type": "object", "properties": {
                "pair": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "string"}], "items": false, "minItems": 2},
                "ids": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4, "uniqueItems": true},
                "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
            }, "required": ["pair", "ids", "matrix"]}),
        ),
        (
            "integer vs number",
            json!({"type": "object", "properties": {
                "whole": {"type": "integer", "minimum": 0},
                "any_number": {"type": "number"},
                "either": {"type": ["integer", "boolean"]}
            }, "required": ["whole", "any_number", "either"]}),
        ),
        ("no arguments", json!({"type": "object", "properties": {}})),
        ("anything", json!({})),
    ];
    schemas
        .into_iter()
        .map(|(name, schema)| (name.to_string(), schema))
        .collect()
}

/// BFCL's schema dialect as JSON Schema: the evaluation's own conversion
/// (`wma eval bfcl` runs this file), read by path because this crate cannot
/// depend on `wma-eval`, which depends on it. Its items are public there;
/// here, in a test, nothing outside reaches them.
#[allow(unreachable_pub)]
#[path = "../../eval/src/bfcl/schema.rs"]
mod bfcl_schema;

/// Every distinct tool schema of the BFCL data in the cache (none when the
/// set-up has not fetched it), converted as the evaluation converts them;
/// any that are still not valid JSON Schema once converted are left out,
/// since no call could validate against them.
fn bfcl_schemas() -> Vec<(String, Value)> {
    let dir: PathBuf = cache_dir().unwrap().join("eval/bfcl");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines() {
            let Ok(record) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            for function in record["function"].as_array().into_iter().flatten() {
                let schema = bfcl_schema::to_json_schema(&function["parameters"]);
                let key = schema.to_string();
                if CompiledSchema::new(&schema).is_err() || !seen.insert(key) {
                    continue;
                }
                let name = function["name"].as_str().unwrap_or("?");
                out.push((name.to_string(), schema));
            }
        }
    }
    out
}

/// The tool a schema is tested as (names are what the grammar writes, so a
/// plain one).
fn tool(schema: &Value) -> ToolDefinition {
    ToolDefinition::new("f", "A tool.", schema.clone())
}

/// Checks one walk: the reply parses to one call of the tool, with valid
/// arguments. Returns the failure, if any.
fn check(text: &str, schema: &Value) -> Result<(), String> {
    let parsed = parse_tool_calls(text);
    if let Some(m) = parsed.malformed {
        return Err(format!("malformed ({m}): {text}"));
    }
    let [call] = parsed.calls.as_slice() else {
        return Err(format!("{} calls in {text}", parsed.calls.len()));
    };
    CompiledSchema::new(schema)
        .and_then(|c| c.check(&call.arguments))
        .map_err(|e| format!("{e}: {text}"))
}

/// Counts of one sweep.
#[derive(Debug, Default)]
struct Tally {
    valid: usize,
    invalid: usize,
    unfinished: usize,
    /// Schemas the grammar checks only in part (the loop validates the
    /// rest): their names and how.
    partial: Vec<(String, Enforcement)>,
    /// Walks under those, and how many of them validated anyway.
    partial_walks: usize,
    partial_valid: usize,
    /// What each invalid call was.
    failures: Vec<String>,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.valid as f64 / (self.valid + self.invalid).max(1) as f64
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} valid, {} invalid ({:.1}% valid), {} unfinished; {} schemas checked in part ({} of {} walks valid)",
            self.valid,
            self.invalid,
            self.rate() * 100.0,
            self.unfinished,
            self.partial.len(),
            self.partial_valid,
            self.partial_walks
        )
    }
}

/// Walks `runs` times per schema, each walk on one compiled grammar.
fn measure(vocab: &Vocab, schemas: &[(String, Value)], decoding: &Decoding, runs: u64) -> Tally {
    let mut tally = Tally::default();
    for (i, (name, schema)) in schemas.iter().enumerate() {
        let constraint = Constraint::CallsOnly {
            tools: vec![tool(schema)],
        };
        let start = vocab
            .engine
            .matcher(&constraint, vocab.format, decoding)
            .unwrap();
        let enforcement = vocab.engine.enforcement(&tool(schema), decoding);
        if enforcement != Enforcement::Full {
            for run in 0..runs {
                if let Walk::Done(text) = walk(vocab, &start, (i as u64) << 8 | run) {
                    tally.partial_walks += 1;
                    tally.partial_valid += usize::from(check(&text, schema).is_ok());
                }
            }
            tally.partial.push((name.clone(), enforcement));
            continue;
        }
        for run in 0..runs {
            match walk(vocab, &start, (i as u64) << 8 | run) {
                Walk::Done(text) => match check(&text, schema) {
                    Ok(()) => tally.valid += 1,
                    Err(e) => {
                        tally.invalid += 1;
                        tally.failures.push(format!("{name}: {e}"));
                    }
                },
                Walk::Unfinished => tally.unfinished += 1,
            }
        }
    }
    tally
}

/// A structural signature of a schema: its keywords, types, formats and
/// patterns, without names, descriptions or enum values (only their
/// types). Schemas with one signature exercise the grammar alike.
fn shape(schema: &Value) -> String {
    match schema {
        Value::Object(map) => {
            let required: BTreeSet<&str> = map
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut parts: Vec<String> = Vec::new();
            for (key, value) in map {
                match key.as_str() {
                    "description" | "title" | "required" => {}
                    "properties" => {
                        let mut props: Vec<String> = value
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(k, v)| format!("{}{}", required.contains(k.as_str()), shape(v)))
                            .collect();
                        props.sort();
                        parts.push(format!("properties[{}]", props.join(",")));
                    }
                    "enum" => {
                        let types: BTreeSet<&str> = value
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(json_type)
                            .collect();
                        parts.push(format!("enum{types:?}"));
                    }
                    "type" | "format" | "pattern" => parts.push(format!("{key}={value}")),
                    _ => parts.push(format!("{key}:{}", shape(value))),
                }
            }
            parts.sort();
            format!("{{{}}}", parts.join(";"))
        }
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(shape).collect::<Vec<_>>().join(",")
        ),
        other => json_type(other).to_string(),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// One BFCL schema per shape, then every `step`-th of those: a sample
/// that keeps the variety and stays fast.
fn sample(schemas: Vec<(String, Value)>, step: usize) -> Vec<(String, Value)> {
    let mut seen = BTreeSet::new();
    schemas
        .into_iter()
        .filter(|(_, s)| seen.insert(shape(s)))
        .step_by(step)
        .collect()
}

/// The decoding the small-model policy asks for, with one call per reply.
fn small_model() -> Decoding {
    Decoding {
        max_string_chars: Some(100),
        max_array_items: Some(16),
        max_calls: Some(1),
        one_tool_per_reply: true,
        ..Decoding::default()
    }
}

#[test]
fn calls_under_hard_schemas_validate() {
    // Every decoding on the short tokens, a few walks on the whole
    // vocabulary (whose long tokens cross more lexemes), and Qwen2's
    // byte-level vocabulary with its `<tool_call>` tags (the tiny model's:
    // its merges are few, so a walk spells values byte by byte).
    let short = Vocab::short_tokens();
    let full = Vocab::full();
    let qwen2 = Vocab::qwen2(&qwen2::tiny_qwen2_model().join("tokenizer.json"));
    hard_schemas_validate(&[
        (&short, "short tokens", small_model(), 6),
        (&short, "short tokens", Decoding::default(), 6),
        (&full, "whole vocabulary", small_model(), 1),
        (&qwen2, "tiny Qwen2 vocabulary", small_model(), 6),
        (&qwen2, "tiny Qwen2 vocabulary", Decoding::default(), 6),
    ]);
}

/// The hard schemas and a sample of BFCL's on Qwen2.5-Coder-0.5B's own
/// vocabulary (151,665 tokens, many of them crossing quotes, escapes and
/// digits), calls in its `<tool_call>` tags. Opt-in: the model is set up
/// by `scripts/setup.sh --model qwen2.5-coder-0.5b`.
#[test]
fn calls_validate_on_the_qwen_vocabulary() {
    let Some(dir) = qwen2::qwen2_model() else {
        return;
    };
    let qwen = Vocab::qwen2(&dir.join("tokenizer.json"));
    hard_schemas_validate(&[(&qwen, "Qwen2.5-Coder vocabulary", small_model(), 2)]);
    bfcl_sweep_on(&qwen, 8);
}

/// Walks every hard schema on each vocabulary and decoding, `runs` times.
fn hard_schemas_validate(cases: &[(&Vocab, &str, Decoding, u64)]) {
    let schemas = hard_schemas();
    for &(vocab, label, ref decoding, runs) in cases {
        let tally = measure(vocab, &schemas, decoding, runs);
        let limits = if *decoding == Decoding::default() {
            "no limits"
        } else {
            "small-model limits"
        };
        println!("hard schemas, {label}, {limits}: {tally}");
        // Only `uniqueItems` is beyond the grammar, and it says so.
        assert_eq!(
            tally.partial,
            vec![(
                "arrays: bounds, unique items, tuples".to_string(),
                Enforcement::IgnoresKeywords(vec!["uniqueItems".into()])
            )],
        );
        assert!(
            tally.failures.is_empty(),
            "{label}, {limits}: {} invalid calls:\n{}",
            tally.invalid,
            tally.failures[..tally.failures.len().min(20)].join("\n")
        );
        // Free-form values nest without end when nothing bounds them;
        // most walks must still end.
        assert!(
            tally.unfinished * 5 <= tally.valid,
            "too many walks did not end: {tally}"
        );
    }
}

/// A call cut anywhere and finished by `close_out` is whole and validates,
/// within the tokens the small-model policy gives it (`finish_cut_calls`,
/// 64). The draws among the tokens `close_out` keeps are random here, where
/// a model would take its favourite: a formatted string (an e-mail, a
/// time) drawn at random may never become valid, so those may stay open;
/// the provider then cuts the reply back as before.
#[test]
fn calls_cut_anywhere_and_closed_out_validate() {
    let schemas = hard_schemas();
    let vocab = Vocab::full();
    let decoding = small_model();
    let (mut valid, mut open_formats, mut longest) = (0, 0, 0);
    let mut failures = Vec::new();
    for (i, (name, schema)) in schemas.iter().enumerate() {
        if vocab.engine.enforcement(&tool(schema), &decoding) != Enforcement::Full {
            continue;
        }
        let start = vocab
            .engine
            .matcher(
                &Constraint::CallsOnly {
                    tools: vec![tool(schema)],
                },
                CallFormat::Json,
                &decoding,
            )
            .unwrap();
        let formats = schema.to_string().contains("\"format\"");
        for cut in [1, 3, 6, 10, 15, 21, 28, 36] {
            let seed = (i as u64) << 8 | cut as u64;
            match walk_cut(&vocab, &start, seed, Some(cut)) {
                Walk::Done(text) => {
                    let ids = vocab.tokenizer.encode(text.as_str(), false).unwrap();
                    let took = ids.len().saturating_sub(cut);
                    match check(&text, schema) {
                        Ok(()) if formats && took > 64 => open_formats += 1,
                        Ok(()) if took <= 64 => {
                            valid += 1;
                            longest = longest.max(took);
                        }
                        Ok(()) => failures.push(format!("{name}, cut at {cut}: {took} tokens")),
                        Err(e) => failures.push(format!("{name}, cut at {cut}: {e}")),
                    }
                }
                Walk::Unfinished if formats => open_formats += 1,
                Walk::Unfinished => failures.push(format!("{name}, cut at {cut}: never closed")),
            }
        }
    }
    println!(
        "{valid} cut calls closed and valid, the longest close about {longest} tokens; \
         {open_formats} not closed within 64 inside a formatted string"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(valid >= 100, "too few walks ran: {valid}");
}

/// The BFCL schemas of the cache, one walk per shape sampled.
fn bfcl_sweep(step: usize) {
    bfcl_sweep_on(&Vocab::short_tokens(), step);
}

/// [`bfcl_sweep`] on `vocab`.
fn bfcl_sweep_on(vocab: &Vocab, step: usize) {
    let schemas = bfcl_schemas();
    assert!(
        !schemas.is_empty(),
        "no BFCL data in {}: run scripts/setup.sh",
        cache_dir().unwrap().join("eval/bfcl").display()
    );
    let all = schemas.len();
    let schemas = sample(schemas, step);
    let tally = measure(vocab, &schemas, &small_model(), 1);
    println!(
        "BFCL: {} of {all} distinct schemas (every {step}th shape): {tally}",
        schemas.len()
    );
    for (name, how) in &tally.partial {
        println!("  checked in part: {name}: {how:?}");
    }
    assert!(
        tally.failures.is_empty(),
        "{} invalid calls:\n{}",
        tally.invalid,
        tally.failures[..tally.failures.len().min(20)].join("\n")
    );
}

#[test]
fn calls_under_bfcl_schemas_validate() {
    bfcl_sweep(8);
}

/// Every shape of BFCL's schemas: minutes in a debug build
/// (`cargo test --release -p wma-provider-ort --test schema_validity -- --ignored`).
#[test]
#[ignore]
fn calls_under_every_bfcl_schema_shape_validate() {
    bfcl_sweep(1);
}
