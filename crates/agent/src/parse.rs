//! Reading tool calls out of what a small model wrote.
//!
//! A 135M-parameter model rarely writes a call exactly as it was shown. It
//! wraps the JSON in a code fence, adds a sentence before it, uses the key
//! names of whatever format it was trained on, forgets the last `}`, or
//! writes Python. [`parse_tool_calls`] reads all of these, and when a reply
//! clearly tries to call but cannot be read, it says why in words the model
//! can act on ([`ParsedReply::malformed`]).
//!
//! Each format family lives in its own module and implements [`Family`]. The
//! families are tried in this order, each only on the parts of the reply that
//! earlier ones did not claim:
//!
//! 1. [`hermes`]: `<tool_call>…</tool_call>` blocks (Hermes, Qwen, SmolLM2),
//!    including an unterminated last block;
//! 2. [`marker`]: calls announced by a special token, Mistral's
//!    `[TOOL_CALLS]` and Llama's `<|python_tag|>`;
//! 3. [`fenced`]: Markdown code fences holding a call;
//! 4. [`pythonic`]: a line that is nothing but `name(key="value", …)`, or a
//!    list of such calls;
//! 5. [`bare`]: JSON objects and lists anywhere in the prose.
//!
//! Tagged formats go first because their delimiters are unambiguous; bare
//! JSON goes last because any `{` in prose is a candidate. Whatever the
//! family, the JSON is read by the forgiving reader in [`json`] and its keys
//! are interpreted by [`shape`], so every family accepts the same spellings.
//!
//! Everything a family claims, call or unreadable attempt, is cut from the
//! prose; [`ParsedReply::text`] is what is left. The work is linear in the
//! length of the reply apart from pathological nesting, and no input panics.

mod bare;
mod fenced;
mod hermes;
mod json;
mod marker;
mod pythonic;
mod shape;

use std::ops::Range;

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
///
/// Calls come back in the order they appear, whatever their format. JSON that
/// is not a call (`{"answer": 42}`) stays in the text. When an attempted call
/// cannot be read it is left out of `calls`, cut from `text`, and the first
/// such problem is described in `malformed`; calls that could be read are
/// still returned beside it.
pub fn parse_tool_calls(reply: &str) -> ParsedReply {
    let mut found: Vec<Found> = Vec::new();
    for family in FAMILIES {
        let mut new = Vec::new();
        for gap in gaps(reply.len(), &found) {
            family.scan(reply, gap, &mut new);
        }
        found.extend(new);
        found.sort_by_key(|f| f.span.start);
    }

    let mut parsed = ParsedReply {
        text: prose(reply, &found),
        ..ParsedReply::default()
    };
    for item in found {
        match item.outcome {
            Outcome::Calls(calls) => parsed.calls.extend(calls),
            Outcome::Malformed(reason) => {
                parsed.malformed.get_or_insert(reason);
            }
        }
    }
    parsed
}

/// The families, in the order they are tried (see the module docs for why).
const FAMILIES: &[&dyn Family] = &[
    &hermes::Hermes,
    &marker::Marker,
    &fenced::Fenced,
    &pythonic::Pythonic,
    &bare::Bare,
];

/// One way of writing calls.
trait Family {
    /// Finds this family's calls in `reply[gap]`, a part of the reply no
    /// earlier family claimed, and pushes them to `found` in order, without
    /// overlaps. Spans stay inside `gap` and on char boundaries.
    fn scan(&self, reply: &str, gap: Range<usize>, found: &mut Vec<Found>);
}

/// A part of the reply that a family claimed.
#[derive(Debug, PartialEq)]
struct Found {
    /// Byte range in the reply; it is cut from the prose.
    span: Range<usize>,
    /// What the span held.
    outcome: Outcome,
}

/// What a claimed span held.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Calls, in order; empty for leftover syntax such as a stray
    /// `</tool_call>` that is only noise.
    Calls(Vec<ParsedCall>),
    /// An attempted call that could not be read, and why.
    Malformed(String),
}

/// The parts of `0..len` not covered by `found` (sorted by start).
fn gaps(len: usize, found: &[Found]) -> Vec<Range<usize>> {
    let mut gaps = Vec::with_capacity(found.len() + 1);
    let mut cursor = 0;
    for item in found {
        if item.span.start > cursor {
            gaps.push(cursor..item.span.start);
        }
        cursor = cursor.max(item.span.end);
    }
    if cursor < len {
        gaps.push(cursor..len);
    }
    gaps
}

/// The reply without the claimed spans. Pieces are trimmed where a span was
/// cut and joined with a newline when the cut crossed a line, else a space.
fn prose(reply: &str, found: &[Found]) -> String {
    let mut out = String::new();
    let mut cursor = 0;
    let mut last_end = 0;
    let cuts = found
        .iter()
        .map(|f| f.span.clone())
        .chain(std::iter::once(reply.len()..reply.len()));
    for cut in cuts {
        let piece_start = cursor;
        let piece = &reply[piece_start..cut.start.max(piece_start)];
        cursor = cursor.max(cut.end);
        let trimmed = piece.trim();
        if trimmed.is_empty() {
            continue;
        }
        let start = piece_start + piece.len() - piece.trim_start().len();
        if !out.is_empty() {
            let between = &reply[last_end..start];
            out.push(if between.contains('\n') { '\n' } else { ' ' });
        }
        out.push_str(trimmed);
        last_end = start + trimmed.len();
    }
    out
}

/// Reads the calls inside a delimited block (a `<tool_call>` body, a fence
/// body), from `range` of the reply. The block may hold one JSON value, a
/// list, several values one after another, or Python-style calls.
///
/// With `insist`, the block is known to be meant as calls, so anything
/// unreadable is malformed; without it, a block that holds no call gives
/// `None` and stays prose.
fn read_block(reply: &str, range: Range<usize>, insist: bool) -> Option<Outcome> {
    let bytes = reply.as_bytes();
    let end = range.end.min(reply.len());
    let mut pos = range.start;
    let mut calls = Vec::new();
    loop {
        while pos < end && matches!(bytes[pos], b' ' | b'\t' | b'\n' | b'\r' | b',' | b';') {
            pos += 1;
        }
        if pos >= end {
            break;
        }
        // Python style first: `[search(q="x")]` would fail as JSON.
        if let Some((found, next)) = pythonic::read_calls(reply, pos, end) {
            calls.extend(found);
            pos = next;
            continue;
        }
        match bytes[pos] {
            b'{' | b'[' => match json::read_value(reply, pos, end, true) {
                Ok(read) => {
                    match shape::interpret(read.value) {
                        shape::Shape::Calls(found) => calls.extend(found),
                        shape::Shape::Broken(reason) => return Some(Outcome::Malformed(reason)),
                        shape::Shape::NotACall if insist => {
                            return Some(Outcome::Malformed(NOT_A_CALL.to_string()));
                        }
                        shape::Shape::NotACall => return None,
                    }
                    pos = read.end;
                }
                Err(failure) if insist || failure.looked_like_call => {
                    return Some(Outcome::Malformed(format!(
                        "the call is not valid JSON: {}",
                        failure.reason
                    )));
                }
                Err(_) => return None,
            },
            // Prose inside a block meant as calls (a fence label, "Sure:")
            // is skipped up to the next JSON value.
            _ if insist => match reply[pos..end].find(['{', '[']) {
                Some(offset) => pos += offset,
                None => break,
            },
            _ => return None,
        }
    }
    match (calls.is_empty(), insist) {
        (false, _) => Some(Outcome::Calls(calls)),
        (true, true) => Some(Outcome::Malformed(NOT_A_CALL.to_string())),
        (true, false) => None,
    }
}

/// What to tell a model whose call block holds no call.
const NOT_A_CALL: &str =
    "the tool call must be a JSON object like {\"name\": \"tool_name\", \"arguments\": {...}}";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(name: &str, arguments: Value) -> ParsedCall {
        ParsedCall {
            name: name.to_string(),
            arguments,
        }
    }

    /// A reply, the calls expected, the text expected, and the start of the
    /// malformed reason expected.
    type Case = (
        &'static str,
        Vec<ParsedCall>,
        &'static str,
        Option<&'static str>,
    );

    fn check(cases: Vec<Case>) {
        for (reply, calls, text, malformed) in cases {
            let parsed = parse_tool_calls(reply);
            assert_eq!(parsed.calls, calls, "calls of {reply:?}");
            assert_eq!(parsed.text, text, "text of {reply:?}");
            match (&parsed.malformed, malformed) {
                (None, None) => {}
                (Some(got), Some(want)) => {
                    assert!(got.starts_with(want), "malformed of {reply:?}: {got}")
                }
                (got, want) => panic!("malformed of {reply:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn plain_prose_has_no_calls() {
        check(vec![
            ("  Hello there!  ", vec![], "Hello there!", None),
            ("", vec![], "", None),
            (
                "The answer is {\"answer\": 42}.",
                vec![],
                "The answer is {\"answer\": 42}.",
                None,
            ),
            (
                "Use [the search] tool {maybe}.",
                vec![],
                "Use [the search] tool {maybe}.",
                None,
            ),
            (
                "I have 3 items: [1, 2, 3]",
                vec![],
                "I have 3 items: [1, 2, 3]",
                None,
            ),
            (
                "```rust\nfn main() {}\n```",
                vec![],
                "```rust\nfn main() {}\n```",
                None,
            ),
        ]);
    }

    #[test]
    fn reads_the_inline_json_format() {
        check(vec![
            (
                r#"{"name": "search", "arguments": {"query": "tents"}}"#,
                vec![call("search", json!({"query": "tents"}))],
                "",
                None,
            ),
            (
                "I'll look that up.\n{\"name\": \"search\", \"arguments\": {\"query\": \"tents\"}}\nOne moment.",
                vec![call("search", json!({"query": "tents"}))],
                "I'll look that up.\nOne moment.",
                None,
            ),
            (
                r#"Sure, `{"name": "get_cart"}` should do it."#,
                vec![call("get_cart", json!({}))],
                "Sure, should do it.",
                None,
            ),
            (
                r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"n": 2}}]"#,
                vec![call("a", json!({})), call("b", json!({"n": 2}))],
                "",
                None,
            ),
            (
                "{\"name\": \"a\", \"arguments\": {}}\n{\"name\": \"b\", \"arguments\": {}}",
                vec![call("a", json!({})), call("b", json!({}))],
                "",
                None,
            ),
        ]);
    }

    #[test]
    fn repairs_common_slips() {
        check(vec![
            (
                r#"{"name": "search", "arguments": {"query": "tents",},}"#,
                vec![call("search", json!({"query": "tents"}))],
                "",
                None,
            ),
            (
                r#"{'name': 'search', 'arguments': {'query': 'tents'}}"#,
                vec![call("search", json!({"query": "tents"}))],
                "",
                None,
            ),
            (
                "Searching.\n{\"name\": \"search\", \"arguments\": {\"query\": \"tents\"}",
                vec![call("search", json!({"query": "tents"}))],
                "Searching.",
                None,
            ),
            (
                r#"{"name": "search", "arguments": "{\"query\": \"tents\"}"}"#,
                vec![call("search", json!({"query": "tents"}))],
                "",
                None,
            ),
        ]);
    }

    #[test]
    fn reports_attempts_that_cannot_be_read() {
        check(vec![
            (
                r#"{"name": "search", "arguments": {"query" "tents"}}"#,
                vec![],
                "",
                Some("the call is not valid JSON: expected ':' after \"query\""),
            ),
            (
                // Not at the end of the reply, so the missing brace is not repaired.
                "{\"name\": \"search\", \"arguments\": {\"query\": \"tents\"}\nThanks!",
                vec![],
                "",
                Some("the call is not valid JSON: expected ',' or '}' after \"tents\""),
            ),
            (
                "<tool_call>\nsearch for tents\n</tool_call>",
                vec![],
                "",
                Some(NOT_A_CALL),
            ),
            (
                r#"{"name": "search", "arguments": "tents"}"#,
                vec![],
                "",
                Some("the arguments must be a JSON object"),
            ),
            (
                r#"{"name": "search", "arguments": {"query": "ten"#,
                vec![],
                "",
                Some("the call is not valid JSON: the text \"ten\" has no closing quote"),
            ),
        ]);
    }

    #[test]
    fn keeps_good_calls_beside_a_bad_one() {
        let parsed = parse_tool_calls(
            "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {</tool_call>",
        );
        assert_eq!(parsed.calls, vec![call("a", json!({}))]);
        assert!(parsed.malformed.is_some());
        assert_eq!(parsed.text, "");
    }

    #[test]
    fn orders_calls_across_families() {
        check(vec![(
            "First:\n```json\n{\"name\": \"a\"}\n```\nthen {\"name\": \"b\"} and\n<tool_call>{\"name\": \"c\"}</tool_call>\nd_tool(x=1)",
            vec![
                call("a", json!({})),
                call("b", json!({})),
                call("c", json!({})),
                call("d_tool", json!({"x": 1})),
            ],
            "First:\nthen and",
            None,
        )]);
    }

    #[test]
    fn gaps_are_the_unclaimed_parts() {
        let found = |span: Range<usize>| Found {
            span,
            outcome: Outcome::Calls(vec![]),
        };
        assert_eq!(gaps(10, &[]), vec![0..10]);
        assert_eq!(gaps(10, &[found(0..3), found(5..10)]), vec![3..5]);
        assert_eq!(gaps(10, &[found(2..4)]), vec![0..2, 4..10]);
    }

    /// A small deterministic generator, so the garbage test needs no crate
    /// and fails the same way every time.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn check_invariants(reply: &str) {
        let parsed = parse_tool_calls(reply);
        assert_eq!(
            parsed.text,
            parsed.text.trim(),
            "untrimmed text for {reply:?}"
        );
        for call in &parsed.calls {
            assert!(call.arguments.is_object(), "{reply:?} gave {call:?}");
            assert!(!call.name.is_empty(), "{reply:?} gave {call:?}");
        }
    }

    #[test]
    fn never_panics_on_garbage_or_truncated_replies() {
        const PIECES: &[&str] = &[
            "{",
            "}",
            "[",
            "]",
            "\"",
            "'",
            ":",
            ",",
            " ",
            "\n",
            "\\",
            "\\u",
            "\\ud83e",
            "(",
            ")",
            "=",
            "`",
            "```",
            "```json\n",
            "<tool_call>",
            "</tool_call>",
            "[TOOL_CALLS]",
            "<|python_tag|>",
            "[ARGS]",
            "name",
            "\"name\"",
            "\"arguments\"",
            "search",
            "True",
            "None",
            "1",
            "-",
            "1e999",
            "é",
            "日本",
            "🦀",
            "\u{0}",
            "tool_calls",
            "function",
        ];
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        for _ in 0..20_000 {
            let len = rng.below(24);
            let reply: String = (0..len).map(|_| PIECES[rng.below(PIECES.len())]).collect();
            check_invariants(&reply);
        }

        let complete = [
            "Sure! <tool_call>\n{\"name\": \"add_to_cart\", \"arguments\": {\"product_id\": \"p-17\", \"note\": \"für 🦀 日本\"}}\n</tool_call> Done.",
            "```json\n[{\"tool\": \"a\", \"args\": {\"q\": \"é\"}}, {\"function\": {\"name\": \"b\", \"arguments\": \"{\\\"x\\\": \\\"\\u00e9\\\"}\"}}]\n```",
            "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}] <|python_tag|>b(x='日本', y=[1, {\"z\": None}])",
        ];
        for reply in complete {
            for (cut, _) in reply.char_indices() {
                check_invariants(&reply[..cut]);
                check_invariants(&reply[cut..]);
            }
        }
    }

    #[test]
    fn stays_fast_on_hostile_input() {
        // These finish in milliseconds when the scan is linear; a quadratic
        // scan would take minutes. No timing is asserted.
        let inputs = [
            "{".repeat(50_000),
            "[1,".repeat(50_000),
            "{\"name\": ".repeat(20_000),
            "<tool_call>".repeat(20_000),
            "a(".repeat(50_000),
            "```".repeat(20_000),
            "{\"a\": \"".repeat(20_000),
        ];
        for input in inputs {
            check_invariants(&input);
        }
    }
}
