//! The decoding constraint on the default model's real vocabulary: what the
//! grammar admits and rejects, token by token, without running the model.
//! Needs only `tokenizer.json` of the default model (`scripts/setup.sh`).

use std::path::PathBuf;

use serde_json::json;
use tokenizers::Tokenizer;
use wma_agent::{CallFormat, Constraint, Decoding, ToolDefinition};
use wma_provider_ort::{ConstraintEngine, MAX_JSON_WHITESPACE, cache_dir, default_model_dir};

/// SmolLM2's `<|im_end|>`, the token its chat turns end with.
const IM_END: u32 = 2;
/// SmolLM2's `<|endoftext|>`, which is not how a chat turn ends.
const END_OF_TEXT: u32 = 0;

fn tokenizer_file() -> PathBuf {
    let file = default_model_dir(&cache_dir().expect("no cache folder: set WMA_CACHE_DIR"))
        .join("tokenizer.json");
    assert!(
        file.is_file(),
        "the default model's tokenizer is missing at {}: run scripts/setup.sh",
        file.display()
    );
    file
}

/// The most calls per reply in [`small_model`].
const MAX_CALLS: usize = 4;

/// What the small-model policy asks of the grammar: bounded values, a few
/// calls per reply, all to one tool.
fn small_model() -> Decoding {
    Decoding {
        max_string_chars: Some(100),
        max_array_items: Some(16),
        max_calls: Some(MAX_CALLS as u32),
        one_tool_per_reply: true,
        ..Decoding::default()
    }
}

struct Fixture {
    engine: ConstraintEngine,
    tokenizer: Tokenizer,
}

fn fixture() -> Fixture {
    let file = tokenizer_file();
    let text = std::fs::read_to_string(&file).unwrap();
    let tokenizer = Tokenizer::from_file(&file).unwrap();
    let engine = ConstraintEngine::new(&text, tokenizer.clone(), &[IM_END], Some(49152)).unwrap();
    Fixture { engine, tokenizer }
}

fn tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition::new(
            "search",
            "Search the catalogue.",
            json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        ),
        ToolDefinition::new(
            "add_to_cart",
            "Add a product to the cart.",
            json!({"type": "object", "properties": {
                "product_id": {"type": "string"},
                "quantity": {"type": "integer", "minimum": 1}
            }, "required": ["product_id"]}),
        ),
    ]
}

impl Fixture {
    /// Whether the whole text is admitted and may end there (the stop token
    /// is allowed after it).
    fn admits(&self, constraint: &Constraint, format: CallFormat, text: &str) -> bool {
        self.admits_with(constraint, format, &small_model(), text)
    }

    /// [`admits`](Self::admits) under `decoding`.
    fn admits_with(
        &self,
        constraint: &Constraint,
        format: CallFormat,
        decoding: &Decoding,
        text: &str,
    ) -> bool {
        let ids = self.ids(text);
        let mut m = self.engine.matcher(constraint, format, decoding).unwrap();
        m.feed(&ids).unwrap() == ids.len() && m.allows(IM_END).unwrap()
    }

    /// Whether the text is admitted as a prefix (possibly unfinished).
    fn admits_prefix(&self, constraint: &Constraint, text: &str) -> bool {
        self.admits_prefix_with(constraint, &small_model(), text)
    }

    /// [`admits_prefix`](Self::admits_prefix) under `decoding`.
    fn admits_prefix_with(&self, constraint: &Constraint, decoding: &Decoding, text: &str) -> bool {
        let ids = self.ids(text);
        let mut m = self
            .engine
            .matcher(constraint, CallFormat::Json, decoding)
            .unwrap();
        m.feed(&ids).unwrap() == ids.len()
    }

    fn ids(&self, text: &str) -> Vec<u32> {
        self.tokenizer
            .encode(text, false)
            .unwrap()
            .get_ids()
            .to_vec()
    }

    fn text(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, false).unwrap()
    }

    /// A matcher for calls only to [`tools`], in the JSON call format.
    fn calls_only(&self) -> wma_provider_ort::ConstraintMatcher {
        self.engine
            .matcher(
                &Constraint::CallsOnly { tools: tools() },
                CallFormat::Json,
                &small_model(),
            )
            .unwrap()
    }

    /// Feeds `piece`, which the grammar must admit whole.
    fn feed(&self, m: &mut wma_provider_ort::ConstraintMatcher, piece: &str) {
        let ids = self.ids(piece);
        assert_eq!(m.feed(&ids).unwrap(), ids.len(), "{piece:?} is admitted");
    }
}

#[test]
fn text_or_calls_admits_each_shown_tool_and_prose() {
    let f = fixture();
    let c = Constraint::TextOrCalls { tools: tools() };
    for text in [
        r#"{"name": "search", "arguments": {"query": "red shoes"}}"#,
        r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17", "quantity": 2}}"#,
        r#"{"name":"add_to_cart","arguments":{"product_id":"p-17"}}"#,
        "{\n  \"name\": \"add_to_cart\",\n  \"arguments\": {\n    \"product_id\": \"p-17\",\n    \"quantity\": 2\n  }\n}",
        "I found three red shoes for you.",
        "{\"name\": \"search\", \"arguments\": {\"query\": \"a\"}}\n{\"name\": \"search\", \"arguments\": {\"query\": \"b\"}}",
        "{\"name\": \"search\", \"arguments\": {\"query\": \"a\"}}\n",
    ] {
        assert!(
            f.admits(&c, CallFormat::Json, text),
            "should admit {text:?}"
        );
    }
}

#[test]
fn calls_that_break_the_schema_or_name_an_unshown_tool_are_rejected() {
    let f = fixture();
    let c = Constraint::TextOrCalls { tools: tools() };
    for text in [
        // A tool that was not shown.
        r#"{"name": "checkout", "arguments": {}}"#,
        // A string where an integer is wanted.
        r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17", "quantity": "two"}}"#,
        // Below the minimum.
        r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17", "quantity": 0}}"#,
        // An argument the tool does not have.
        r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17", "colour": "red"}}"#,
        // The arguments of another tool.
        r#"{"name": "search", "arguments": {"product_id": "p-17"}}"#,
        // Prose with JSON in it: the parser would read it as a call.
        r#"Sure: {"name": "search", "arguments": {"query": "x"}}"#,
        // Prose that starts with whitespace.
        " hello",
    ] {
        assert!(
            !f.admits_prefix(&c, text),
            "should reject {text:?} before its end"
        );
    }
    // A required argument missing: every token is admitted up to the close,
    // but the object cannot end there.
    assert!(!f.admits(
        &c,
        CallFormat::Json,
        r#"{"name": "add_to_cart", "arguments": {}}"#
    ));
    // Half a call cannot end the reply.
    assert!(!f.admits(
        &c,
        CallFormat::Json,
        r#"{"name": "search", "arguments": {"query": "x""#
    ));
}

#[test]
fn one_reply_calls_one_tool_at_most_max_calls_times() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let search = r#"{"name": "search", "arguments": {"query": "a"}}"#;
    let add = r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}"#;
    assert!(f.admits(&c, CallFormat::Json, &[search; MAX_CALLS].join("\n")));
    assert!(!f.admits_prefix(&c, &[search; MAX_CALLS + 1].join("\n")));
    assert!(!f.admits_prefix(&c, &format!("{search}\n{add}")));
}

#[test]
fn calls_to_different_tools_and_their_number_follow_the_request() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let search = r#"{"name": "search", "arguments": {"query": "a"}}"#;
    let add = r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}"#;
    let mixed = Decoding {
        max_calls: Some(3),
        ..Decoding::default()
    };
    let json = CallFormat::Json;
    assert!(f.admits_with(&c, json, &mixed, &format!("{search}\n{add}\n{search}")));
    assert!(!f.admits_prefix_with(&c, &mixed, &[search, add, search, add].join("\n")));
    // No bound at all: as many calls as the tokens allow.
    let free = Decoding::default();
    assert!(f.admits_with(&c, json, &free, &[search, add].repeat(6).join("\n")));
    assert!(f.admits_with(&c, json, &free, &[search; 12].join("\n")));
    // One tool per reply, without a bound on how many calls.
    let one = Decoding {
        one_tool_per_reply: true,
        ..Decoding::default()
    };
    assert!(f.admits_with(&c, json, &one, &[add; 9].join("\n")));
    assert!(!f.admits_prefix_with(&c, &one, &format!("{add}\n{search}")));
}

#[test]
fn a_single_call_tool_among_mixed_calls_comes_once() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let search = r#"{"name": "search", "arguments": {"query": "a"}}"#;
    let add = r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}"#;
    let json = CallFormat::Json;
    for max_calls in [None, Some(3)] {
        let d = Decoding {
            max_calls,
            single_call: vec!["add_to_cart".into()],
            ..Decoding::default()
        };
        for text in [
            add.to_string(),
            format!("{search}\n{add}"),
            format!("{add}\n{search}"),
            format!("{search}\n{add}\n{search}"),
            format!("{search}\n{search}\n{search}"),
        ] {
            assert!(f.admits_with(&c, json, &d, &text), "{max_calls:?}: {text}");
        }
        assert!(
            !f.admits_prefix_with(&c, &d, &format!("{add}\n{search}\n{add}")),
            "{max_calls:?}"
        );
    }
    let d = Decoding {
        max_calls: Some(3),
        single_call: vec!["add_to_cart".into()],
        ..Decoding::default()
    };
    assert!(!f.admits_prefix_with(&c, &d, &format!("{search}\n{search}\n{add}\n{search}")));
    // Every tool called once at most: one call in all.
    let d = Decoding {
        single_call: vec!["add_to_cart".into(), "search".into()],
        ..Decoding::default()
    };
    assert!(f.admits_with(&c, json, &d, search));
    assert!(!f.admits_prefix_with(&c, &d, &format!("{search}\n{search}")));
}

#[test]
fn string_and_array_limits_come_from_the_request() {
    let f = fixture();
    let tool = ToolDefinition::new(
        "note",
        "Write a note.",
        json!({"type": "object", "properties": {
            "text": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}}
        }, "required": ["text"]}),
    );
    let c = Constraint::CallsOnly { tools: vec![tool] };
    let call = |chars: usize, items: usize| {
        let tags = vec!["\"t\""; items].join(", ");
        format!(
            r#"{{"name": "note", "arguments": {{"text": "{}", "tags": [{tags}]}}}}"#,
            "a".repeat(chars)
        )
    };
    let limited = Decoding {
        max_string_chars: Some(10),
        max_array_items: Some(3),
        ..Decoding::default()
    };
    let json = CallFormat::Json;
    assert!(f.admits_with(&c, json, &limited, &call(10, 3)));
    assert!(!f.admits_prefix_with(&c, &limited, &call(11, 3)));
    assert!(!f.admits_prefix_with(&c, &limited, &call(10, 4)));
    // Unbounded: the schema says nothing, so neither does the grammar.
    let free = Decoding::default();
    assert!(f.admits_with(&c, json, &free, &call(400, 40)));
}

#[test]
fn calls_only_rejects_prose() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    assert!(!f.admits_prefix(&c, "I will"));
    assert!(f.admits(
        &c,
        CallFormat::Json,
        r#"{"name": "search", "arguments": {"query": "red shoes"}}"#
    ));
}

#[test]
fn the_end_is_the_models_own_stop_token() {
    let f = fixture();
    assert_eq!(f.engine.eos_tokens(), vec![IM_END]);
    let c = Constraint::CallsOnly { tools: tools() };
    let text = r#"{"name": "search", "arguments": {"query": "x"}}"#;
    let ids = f.tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    let mut m = f
        .engine
        .matcher(&c, CallFormat::Json, &small_model())
        .unwrap();
    // Not before the call is complete…
    assert!(!m.allows(IM_END).unwrap());
    assert_eq!(m.feed(&ids).unwrap(), ids.len());
    // …then `<|im_end|>`, never `<|endoftext|>`.
    assert!(m.is_accepting());
    assert!(m.allows(IM_END).unwrap());
    assert!(!m.allows(END_OF_TEXT).unwrap());
}

#[test]
fn json_whitespace_is_free_but_bounded() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let spaced = |n: usize| {
        format!(
            "{{\"name\": \"search\",{}\"arguments\": {{\"query\": \"x\"}}}}",
            " ".repeat(n)
        )
    };
    assert!(f.admits(&c, CallFormat::Json, &spaced(MAX_JSON_WHITESPACE)));
    assert!(!f.admits_prefix(&c, &spaced(MAX_JSON_WHITESPACE + 1)));
}

#[test]
fn hermes_calls_are_wrapped_in_tool_call_tags() {
    let f = fixture();
    let c = Constraint::TextOrCalls { tools: tools() };
    assert!(f.admits(
        &c,
        CallFormat::Hermes,
        "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}\n</tool_call>"
    ));
    assert!(!f.admits(
        &c,
        CallFormat::Hermes,
        r#"{"name": "search", "arguments": {"query": "x"}}"#
    ));
    assert!(f.admits(&c, CallFormat::Hermes, "No tool fits."));
}

#[test]
fn a_schema_llguidance_cannot_compile_falls_back_to_its_property_names() {
    let f = fixture();
    let odd = ToolDefinition::new(
        "odd",
        "A tool with a schema llguidance does not know.",
        json!({"type": "object", "properties": {
            "when": {"type": "string", "format": "no-such-format"},
            "what": {"type": "mystery"}
        }, "required": ["what"]}),
    );
    let c = Constraint::CallsOnly { tools: vec![odd] };
    assert!(f.admits(
        &c,
        CallFormat::Json,
        r#"{"name": "odd", "arguments": {"when": "now", "what": [1, 2]}}"#
    ));
    assert!(!f.admits_prefix(&c, r#"{"name": "odd", "arguments": {"other": 1}}"#));
}

#[test]
fn a_closed_schema_only_takes_the_keys_it_lists() {
    let f = fixture();
    let tools = vec![
        // What a WebMCP page's form tool is offered as: closed at every
        // object that lists its keys.
        ToolDefinition::new(
            "set_door",
            "Choose the delivery door.",
            json!({"type": "object", "properties": {
                "door": {"type": "string"},
                "address": {"type": "object", "properties": {"street": {"type": "string"}},
                            "additionalProperties": false}
            }, "required": ["door"], "additionalProperties": false}),
        ),
        // Closed with no keys at all: only `{}`.
        ToolDefinition::new(
            "ring",
            "Ring the bell.",
            json!({"type": "object", "additionalProperties": false}),
        ),
        // Closed, and unsatisfiable as written (a required key it may not
        // have): the grammar falls back, and stays closed.
        ToolDefinition::new(
            "odd",
            "A tool whose schema cannot be met.",
            json!({"type": "object", "properties": {}, "required": ["ghost"],
                   "additionalProperties": false}),
        ),
    ];
    let c = Constraint::CallsOnly { tools };
    for text in [
        r#"{"name": "set_door", "arguments": {"door": "back"}}"#,
        r#"{"name": "set_door", "arguments": {"door": "back", "address": {"street": "Main"}}}"#,
        r#"{"name": "ring", "arguments": {}}"#,
        r#"{"name": "odd", "arguments": {}}"#,
    ] {
        assert!(
            f.admits(&c, CallFormat::Json, text),
            "should admit {text:?}"
        );
    }
    for text in [
        r#"{"name": "set_door", "arguments": {"door": "back", "door_name": "x"}}"#,
        r#"{"name": "set_door", "arguments": {"door_name": "x"}}"#,
        r#"{"name": "set_door", "arguments": {"door": "back", "address": {"floor": 2}}}"#,
        r#"{"name": "ring", "arguments": {"loud": true}}"#,
        r#"{"name": "odd", "arguments": {"ghost": 1}}"#,
    ] {
        assert!(!f.admits_prefix(&c, text), "should reject {text:?}");
    }
}

#[test]
fn definitions_of_a_schema_still_resolve_inside_the_call() {
    let f = fixture();
    let tool = ToolDefinition::new(
        "pick",
        "Pick a colour.",
        json!({"type": "object",
            "properties": {"colour": {"$ref": "#/$defs/colour"}},
            "required": ["colour"],
            "$defs": {"colour": {"enum": ["red", "blue"]}}}),
    );
    let c = Constraint::CallsOnly { tools: vec![tool] };
    assert!(f.admits(
        &c,
        CallFormat::Json,
        r#"{"name": "pick", "arguments": {"colour": "red"}}"#
    ));
    assert!(!f.admits_prefix(&c, r#"{"name": "pick", "arguments": {"colour": "green"}}"#));
}

#[test]
fn json_schema_and_grammar_constraints_work_too() {
    let f = fixture();
    let schema = Constraint::JsonSchema {
        schema: json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    };
    assert!(f.admits(&schema, CallFormat::Json, r#"{"n": 3}"#));
    assert!(!f.admits_prefix(&schema, r#"{"n": "3"}"#));
    let lark = Constraint::Grammar {
        lark: r#"start: "yes" | "no""#.into(),
    };
    assert!(f.admits(&lark, CallFormat::Json, "yes"));
    assert!(!f.admits_prefix(&lark, "maybe"));
}

#[test]
fn a_call_threshold_settles_prose_or_call_at_the_first_token() {
    let f = fixture();
    let c = Constraint::TextOrCalls { tools: tools() };
    let id = |t: &str| f.tokenizer.token_to_id(t).unwrap() as usize;
    let (brace, word) = (id("{"), id("I"));
    // The model is split evenly between starting a call and starting prose.
    let logits = || {
        let mut l = vec![-1e9f32; 49152];
        l[brace] = 0.0;
        l[word] = 0.0;
        l
    };
    for (threshold, forced) in [(None, false), (Some(0.6), false), (Some(0.4), true)] {
        let decoding = Decoding {
            call_threshold: threshold,
            ..small_model()
        };
        let mut m = f.engine.matcher(&c, CallFormat::Json, &decoding).unwrap();
        let mut l = logits();
        m.mask_logits(&mut l).unwrap();
        let p = m.call_probability().unwrap();
        assert!((p - 0.5).abs() < 1e-3, "{p}");
        assert!(l[brace].is_finite());
        assert_eq!(l[word].is_finite(), !forced, "threshold {threshold:?}");
    }
    // Calls-only has no branch to settle.
    let mut m = f
        .engine
        .matcher(
            &Constraint::CallsOnly { tools: tools() },
            CallFormat::Json,
            &small_model(),
        )
        .unwrap()
        .with_call_threshold(Some(0.1));
    let mut l = logits();
    m.mask_logits(&mut l).unwrap();
    assert_eq!(m.call_probability(), None);
    assert!(!l[word].is_finite());
}

/// The neutral baseline holds a push back: a prompt without the request's
/// words that the model already answers with a call at 70% raises the
/// threshold to 70%, so a request that leaves the call at 50% is left to
/// the model, while a threshold that was off stays off.
#[test]
fn a_call_baseline_raises_the_threshold_to_what_the_neutral_prompt_gives() {
    let f = fixture();
    let c = Constraint::TextOrCalls { tools: tools() };
    let id = |t: &str| f.tokenizer.token_to_id(t).unwrap() as usize;
    let (brace, word) = (id("{"), id("I"));
    let split = |call: f32| {
        let mut l = vec![-1e9f32; 49152];
        l[brace] = (call / (1.0 - call)).ln();
        l[word] = 0.0;
        l
    };
    let decoding = Decoding {
        call_threshold: Some(0.005),
        ..small_model()
    };
    let mut m = f.engine.matcher(&c, CallFormat::Json, &decoding).unwrap();
    let neutral = m.call_probability_of(split(0.7)).unwrap().unwrap();
    assert!((neutral - 0.7).abs() < 1e-3, "{neutral}");
    m.raise_call_threshold(neutral);
    let mut l = split(0.5);
    m.mask_logits(&mut l).unwrap();
    assert!(l[word].is_finite(), "50% is below the baseline: no push");
    assert_eq!(m.call_probability_of(split(0.9)).unwrap(), None, "begun");
    // Below the baseline's 30%, the request's 50% is pushed.
    let mut m = f.engine.matcher(&c, CallFormat::Json, &decoding).unwrap();
    m.raise_call_threshold(m.call_probability_of(split(0.3)).unwrap().unwrap());
    let mut l = split(0.5);
    m.mask_logits(&mut l).unwrap();
    assert!(!l[word].is_finite(), "50% is above the baseline: pushed");
    // No threshold: the baseline does not make one.
    let mut m = f
        .engine
        .matcher(&c, CallFormat::Json, &small_model())
        .unwrap()
        .with_call_threshold(None);
    m.raise_call_threshold(0.3);
    assert_eq!(m.call_threshold(), None);
}

#[test]
fn a_repeated_call_is_noticed_and_cut_off() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let a = "{\"name\": \"search\", \"arguments\": {\"query\": \"a\"}}";
    let b = "{\"name\":\"search\",\"arguments\":{\"query\":\"b\"}}";
    // Two different calls, then the first one again.
    let first = format!("{a}\n\n{b}");
    // Feeds `text` until the matcher notices a repeat: the tokens fed, the
    // tokens in all, and the text it keeps.
    let until_repeat = |text: &str| {
        let ids = f.tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let mut m = f
            .engine
            .matcher(&c, CallFormat::Json, &small_model())
            .unwrap();
        let mut fed = 0;
        for &t in &ids {
            m.consume(t).unwrap();
            fed += 1;
            if m.repeated_a_call() {
                break;
            }
        }
        let kept = f
            .tokenizer
            .decode(&ids[..m.distinct_tokens()], false)
            .unwrap();
        (fed, ids.len(), kept)
    };
    let (fed, all, kept) = until_repeat(&format!("{first}\n\n{a}"));
    assert_eq!(fed, all, "the copy is noticed when it closes");
    assert_eq!(kept.trim_end(), first);
    // A reply that starts on a new line, as sampled ones do.
    let (fed, all, kept) = until_repeat(&format!("\n{a}\n\n{a}"));
    assert_eq!(fed, all, "noticed after a leading new line too");
    assert_eq!(kept.trim(), a);
}

#[test]
fn a_single_call_tool_is_called_once_per_reply() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let add = r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17"}}"#;
    let search = r#"{"name": "search", "arguments": {"query": "a"}}"#;
    let single = Decoding {
        single_call: vec!["add_to_cart".to_string()],
        ..small_model()
    };
    let admits = |text: &str, whole: bool| {
        let ids = f.tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let mut m = f.engine.matcher(&c, CallFormat::Json, &single).unwrap();
        m.feed(&ids).unwrap() == ids.len() && (!whole || m.allows(IM_END).unwrap())
    };
    assert!(admits(add, true));
    assert!(admits(&format!("{add}\n"), true));
    assert!(!admits(&format!("{add}\n{add}"), false), "a second action");
    assert!(
        admits(&format!("{search}\n{search}"), true),
        "other tools may still be called several times"
    );
}

/// The logits after `prefix` under constraint `c` and `decoding`, with the
/// copy bias `copy`, every token starting even: what the constraint does is
/// what the model would see.
fn logits_after(
    f: &Fixture,
    c: &Constraint,
    decoding: &Decoding,
    copy: Option<wma_provider_ort::copy::CopyBias>,
    prefix: &str,
) -> Vec<f32> {
    let mut m = matcher_after(f, c, decoding, copy, prefix);
    let mut l = vec![0.0f32; 49152];
    m.mask_logits(&mut l).unwrap();
    l
}

/// A matcher under constraint `c` and `decoding`, with the copy bias
/// `copy`, that has read `prefix`.
fn matcher_after(
    f: &Fixture,
    c: &Constraint,
    decoding: &Decoding,
    copy: Option<wma_provider_ort::copy::CopyBias>,
    prefix: &str,
) -> wma_provider_ort::ConstraintMatcher {
    let ids = f
        .tokenizer
        .encode(prefix, false)
        .unwrap()
        .get_ids()
        .to_vec();
    let mut m = f
        .engine
        .matcher(c, CallFormat::Json, decoding)
        .unwrap()
        .with_copy_bias(copy);
    assert_eq!(m.feed(&ids).unwrap(), ids.len(), "{prefix}");
    m
}

/// The logits after `prefix` with a copy bias of 3 for `phrases`, held to
/// the arguments' `shapes` (`Decoding::copy_shapes`).
fn biased_logits(
    f: &Fixture,
    c: &Constraint,
    phrases: &[String],
    shapes: &[(String, String)],
    prefix: &str,
) -> Vec<f32> {
    let copy = wma_provider_ort::copy::CopyBias::new(phrases, 3.0).map(|c| c.with_shapes(shapes));
    logits_after(f, c, &small_model(), copy, prefix)
}

#[test]
fn the_copy_bias_lifts_the_persons_words_inside_string_arguments_only() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let id = |t: &str| f.tokenizer.token_to_id(t).unwrap() as usize;
    let phrases = ["waterproof backpack".to_string()];
    let logits_after = |prefix: &str| biased_logits(&f, &c, &phrases, &[], prefix);
    let inside = logits_after(r#"{"name": "search", "arguments": {"query": ""#);
    let water = id("water");
    let other = id("the");
    assert_eq!(inside[water], 3.0, "the phrase's first token");
    assert_eq!(inside[other], 0.0, "anything else is left alone");
    let next = logits_after(r#"{"name": "search", "arguments": {"query": "waterproof"#);
    assert_eq!(next[id("Ġbackpack")], 3.0, "the phrase goes on");
    let closing = logits_after(r#"{"name": "search", "arguments": {"query": "waterproof backpack"#);
    assert_eq!(closing[id("\"")], 3.0, "a whole phrase may end the string");
    let key = logits_after(r#"{"name": "search", "arguments": {""#);
    assert!(
        key.iter().all(|&l| l <= 0.0),
        "keys get no bonus (the grammar masks the rest)"
    );
    assert!(
        wma_provider_ort::copy::CopyBias::new(&phrases, 0.0).is_none(),
        "a bias of 0 is off"
    );
}

/// The copy bias is counted where it changed the token the model ranked
/// first, and only there: the loop reports it as the rule's event.
#[test]
fn the_copy_bias_counts_the_choices_it_changed() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let id = |t: &str| f.tokenizer.token_to_id(t).unwrap() as usize;
    let phrases = ["waterproof backpack".to_string()];
    let prefix = r#"{"name": "search", "arguments": {"query": ""#;
    for (own, changed) in [("the", 1), ("water", 0)] {
        let copy = wma_provider_ort::copy::CopyBias::new(&phrases, 3.0);
        let mut m = matcher_after(&f, &c, &small_model(), copy, prefix);
        let mut l = vec![0.0f32; 49152];
        l[id(own)] = 1.0;
        m.mask_logits(&mut l).unwrap();
        assert_eq!(
            m.steered().copy_bias,
            changed,
            "the model ranked {own:?} first"
        );
        assert_eq!(m.steered().avoided_names, 0);
    }
}

#[test]
fn a_shaped_argument_copies_only_phrases_of_its_shape() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let id = |t: &str| f.tokenizer.token_to_id(t).unwrap() as usize;
    let phrases = ["waterproof backpack".to_string(), "water/proof".to_string()];
    let shaped =
        |shapes: &[(String, String)], prefix: &str| biased_logits(&f, &c, &phrases, shapes, prefix);
    let query = r#"{"name": "search", "arguments": {"query": "water"#;
    let free = shaped(&[], query);
    assert_eq!(free[id("proof")], 3.0, "unshaped, both phrases are lifted");
    assert_eq!(free[id("/")], 3.0);
    let slash = [("query".to_string(), "/".to_string())];
    let held = shaped(&slash, query);
    assert_eq!(
        held[id("proof")],
        0.0,
        "a phrase without a slash is no such value"
    );
    assert_eq!(held[id("/")], 3.0, "a phrase of the shape still is");
    let before = shaped(&slash, r#"{"name": "search", "arguments": {"query": "#);
    assert!(
        before.iter().filter(|&&l| l > 0.0).count() >= 1,
        "the shaped phrase is lifted before the value too"
    );
    let other = [("path".to_string(), "/".to_string())];
    assert_eq!(
        shaped(&other, query)[id("proof")],
        3.0,
        "another argument's shape changes nothing here"
    );
}

#[test]
fn a_number_the_person_wrote_is_lifted_in_number_values_only() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let id = |t: &str| f.tokenizer.token_to_id(t).unwrap() as usize;
    let phrases = ["12".to_string(), "tent".to_string()];
    let logits_after = |prefix: &str| biased_logits(&f, &c, &phrases, &[], prefix);
    let add = r#"{"name": "add_to_cart", "arguments": {"product_id": "p-17", "quantity": "#;
    let before = logits_after(add);
    assert_eq!(before[id("1")], 3.0, "the number's first digit");
    assert_eq!(before[id("3")], 0.0, "other digits are left alone");
    let inside = logits_after(&format!("{add}1"));
    assert_eq!(inside[id("2")], 3.0, "the number goes on");
    assert_eq!(inside[id("1")], 0.0);
    let whole = logits_after(&format!("{add}12"));
    assert!(
        whole.iter().all(|&l| l <= 0.0),
        "a whole number: where it ends is the model's choice"
    );
    let string = logits_after(r#"{"name": "add_to_cart", "arguments": {"product_id": "#);
    assert_eq!(
        string[id("1")],
        f32::NEG_INFINITY,
        "a string value stays a string: the grammar masks the digit"
    );
}

/// The logits after `prefix` when string values may not begin with `avoid`.
fn avoiding_logits(f: &Fixture, c: &Constraint, avoid: &[&str], prefix: &str) -> Vec<f32> {
    let decoding = Decoding {
        avoid_in_values: avoid.iter().map(|s| s.to_string()).collect(),
        ..small_model()
    };
    logits_after(f, c, &decoding, None, prefix)
}

#[test]
fn a_value_cannot_begin_with_a_name_the_prompt_shows() {
    let f = fixture();
    let c = Constraint::CallsOnly { tools: tools() };
    let id = |t: &str| f.tokenizer.token_to_id(t).unwrap() as usize;
    let avoid = ["add_to_cart", "<query"];
    let after = |prefix: &str| avoiding_logits(&f, &c, &avoid, prefix);
    let open = r#"{"name": "search", "arguments": {"query": ""#;
    let inside = after(&format!("{open}add_to_"));
    assert_eq!(inside[id("cart")], f32::NEG_INFINITY, "completing the name");
    assert_eq!(
        inside[id("c")],
        0.0,
        "a token short of the end is not yet the name"
    );
    assert_eq!(inside[id("Ġthe")], 0.0, "leaving the name is free");
    let placeholder = after(&format!("{open}<"));
    assert_eq!(
        placeholder[id("query")],
        f32::NEG_INFINITY,
        "the placeholder"
    );
    assert_eq!(placeholder[id("div")], 0.0);
    let written = after(&format!("{open}add"));
    assert_eq!(written[id("Ġa")], 0.0, "a value may begin like a name");
    let free = avoiding_logits(&f, &c, &[], &format!("{open}add_to_"));
    assert_eq!(free[id("cart")], 0.0, "without names nothing is masked");
    let key = after(r#"{"name": ""#);
    assert!(
        key[id("add")].is_finite(),
        "the tool's own name is the grammar's to choose"
    );
}

/// JSON bounds no number, but a call's arguments are read as 64-bit
/// floats: a number in a value of any type (where the schema says nothing
/// the grammar could bound) stops taking digits at forty in its mantissa
/// and two in its exponent, so every number written can be read.
#[test]
fn a_number_stops_short_of_what_a_float_cannot_hold() {
    let f = fixture();
    let c = Constraint::CallsOnly {
        tools: vec![ToolDefinition::new(
            "scale",
            "Scale by a factor.",
            json!({"type": "object", "properties": {"factor": {}}, "required": ["factor"]}),
        )],
    };
    let id = |t: &str| f.tokenizer.token_to_id(t).unwrap() as usize;
    let after = |number: &str| {
        logits_after(
            &f,
            &c,
            &small_model(),
            None,
            &format!(r#"{{"name": "scale", "arguments": {{"factor": {number}"#),
        )
    };
    assert_eq!(after("2e9")[id("9")], 0.0, "a second exponent digit");
    let full = after("2e99");
    assert_eq!(full[id("9")], f32::NEG_INFINITY, "no third");
    assert_eq!(full[id("}")], 0.0, "the number may end");
    let long = "1".repeat(39);
    assert_eq!(after(&long)[id("1")], 0.0, "a fortieth digit");
    assert_eq!(
        after(&format!("{long}1"))[id("1")],
        f32::NEG_INFINITY,
        "no forty-first"
    );
    assert_eq!(
        after(&format!("{long}1"))[id("}")],
        0.0,
        "the number may end"
    );
}

/// What the grammar forces, the provider feeds without a choice (fast
/// forward): a key the schema fixes (`name` after `{"`), and the rest of a
/// tool's name once its first letters settle it; JSON whitespace is the
/// model's choice (bounded), so nothing is forced where whitespace may go,
/// nor at the first token of "text or calls" (prose or a call is the
/// model's choice). Forced tokens are ones the grammar takes, one after
/// another.
#[test]
fn the_grammar_forces_fixed_keys_and_a_settled_name() {
    let f = fixture();
    let mut m = f.calls_only();
    // Whitespace may follow `{`: nothing is forced yet.
    assert!(m.forced_tokens().is_empty());
    f.feed(&mut m, "{\"");
    let key = m.forced_tokens();
    assert_eq!(f.text(&key), "name");
    assert_eq!(
        m.feed(&key).unwrap(),
        key.len(),
        "forced tokens are admitted"
    );
    f.feed(&mut m, "\": \"");
    // Two tools: nothing is forced before the first letter.
    assert!(m.forced_tokens().is_empty());
    f.feed(&mut m, "add");
    let rest = m.forced_tokens();
    assert_eq!(f.text(&rest), "_to_cart");
    assert_eq!(m.feed(&rest).unwrap(), rest.len());
    f.feed(&mut m, "\", \"arguments\": {\"product_id\": \"p-17\"}}");
    assert!(m.allows(IM_END).unwrap(), "a whole call");

    let mut either = f
        .engine
        .matcher(
            &Constraint::TextOrCalls { tools: tools() },
            CallFormat::Json,
            &small_model(),
        )
        .unwrap();
    assert!(either.forced_tokens().is_empty());
}

/// A prompt-lookup draft under a constraint goes on with what the grammar
/// forces where the lookup has nothing, stops where the grammar refuses a
/// looked-up token, and leaves the matcher where it was: the model's own
/// choices still advance it from the same point.
#[test]
fn a_draft_takes_forced_tokens_stops_at_refused_ones_and_leaves_the_matcher() {
    let f = fixture();
    let mut m = f.calls_only();
    f.feed(&mut m, "{\"");
    // The lookup finds nothing: the draft is the forced key alone.
    let forced = m.draft(16, |_, _| Vec::new());
    assert_eq!(f.text(&forced), "name");
    // The lookup goes on after the forced key; the grammar cuts it where a
    // tool name no tool has begins.
    let mut asked = Vec::new();
    let draft = m.draft(16, |guess, _| {
        asked.push(f.text(guess));
        f.ids("\": \"add_to_basket\"")
    });
    assert_eq!(asked, ["name"], "the lookup is asked after the forced key");
    assert!(
        f.text(&draft).starts_with("name\": \"add"),
        "{:?}",
        f.text(&draft)
    );
    assert!(!f.text(&draft).contains("basket"), "{:?}", f.text(&draft));
    // At most `max` tokens.
    assert!(m.draft(1, |_, _| f.ids("\": \"add")).len() <= 1);
    // Nothing was consumed: the key is still to come, and is admitted.
    assert!(m.draft(16, |_, _| Vec::new()) == forced);
    f.feed(
        &mut m,
        "name\": \"add_to_cart\", \"arguments\": {\"product_id\": \"p-17\"}}",
    );
    assert!(m.allows(IM_END).unwrap(), "a whole call");
}
