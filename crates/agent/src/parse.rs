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
//!    including an unterminated last block, and [`xml`] elements in place
//!    of the JSON inside one;
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
//! A string literal is data, not syntax: a person may search for
//! `"<tool_call>"`, a message a model sends may quote markup or a whole call
//! (`send_message(body="<b>hi</b> see <tool_call> docs")`), and a page's
//! text quoted in an argument may hold anything. Before the families run,
//! [`Shield`] finds the values in the reply (JSON values and Python-style
//! calls) whose strings hold a character some family reads as syntax (`<`,
//! `[`, `{`, a backtick, a line break) and, where the value reads whole,
//! rewrites those characters as the escapes that mean the same (`<` as
//! `\u003c`). The families then see no tag, marker, fence, value or line
//! inside a string, so no string content becomes a call or ends one early,
//! and the readers still read the text as written. Spans are mapped back to
//! the reply as it was.
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
mod xml;

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
    let found = match Shield::new(reply) {
        None => scan_families(reply),
        Some(shield) => {
            let mut found = scan_families(&shield.text);
            for item in &mut found {
                item.span =
                    shield.original(item.span.start, false)..shield.original(item.span.end, true);
            }
            found
        }
    };

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

/// Runs every family over `reply`, each on what the earlier ones left.
/// Gives what they claimed, sorted by start.
fn scan_families(reply: &str) -> Vec<Found> {
    let mut found: Vec<Found> = Vec::new();
    for family in FAMILIES {
        let mut new = Vec::new();
        for gap in gaps(reply.len(), &found) {
            family.scan(reply, gap, &mut new);
        }
        found.extend(new);
        found.sort_by_key(|f| f.span.start);
    }
    found
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
    // Where in `out` pieces were joined across a cut, in order.
    let mut joins = Vec::new();
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
            joins.push(out.len());
            out.push(if between.contains('\n') { '\n' } else { ' ' });
        }
        out.push_str(trimmed);
        last_end = start + trimmed.len();
    }
    without_empty_fences(out, joins)
}

/// The text without Markdown fences that held only the calls cut from them:
/// a fence and its closing fence with nothing between but a join where
/// calls were cut (`joins`, offsets in `out`, ascending). Fences that were
/// written with nothing between them, in prose or inside a string the
/// prose quotes, are the reply's own text and stay.
fn without_empty_fences(mut out: String, mut joins: Vec<usize>) -> String {
    let mut from = 0;
    while let Some(offset) = out[from..].find("```") {
        let open = from + offset;
        let label_end = open
            + 3
            + out[open + 3..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || "_+-".contains(c)))
                .unwrap_or(out.len() - open - 3);
        let gap = out[label_end..].len() - out[label_end..].trim_start().len();
        let close = label_end + gap;
        let first_join = joins.partition_point(|&join| join < label_end);
        let around_a_cut = joins.get(first_join).is_some_and(|&join| join < close);
        if around_a_cut && out[close..].starts_with("```") {
            let end = close + 3;
            out.replace_range(open..end, "");
            joins.retain(|&join| join < open || join >= end);
            for join in &mut joins {
                if *join >= end {
                    *join -= end - open;
                }
            }
            from = open;
        } else {
            from = open + 3;
        }
    }
    out.trim().to_string()
}

/// The reply with the syntax inside its string literals escaped away, so
/// that no family takes a string's content for a tag, a fence, a line or a
/// value of its own (see the module docs), and the way back to the reply's
/// own offsets.
///
/// One pass finds the values of the reply: JSON values, and Python-style
/// calls (`name(key="value", …)`, alone or in a list). It tracks strings
/// the way the readers do: double or single quotes, with backslash escapes,
/// starting only where a value may start (after `{`, `[`, `,` or `:`, and in
/// a call after `(` or `=`). A value whose strings hold anything a family
/// reads as syntax is read once with the reader of its kind, over its own
/// bytes only; when it reads whole, those characters are rewritten as
/// escapes that read back the same. A stretch that looked like a Python call
/// but did not read as one is scanned again as JSON alone, so its
/// parentheses and quotes cannot hide a JSON value inside it. Every byte is
/// scanned at most twice.
struct Shield {
    /// The reply, rewritten.
    text: String,
    /// The rewrites, in order.
    edits: Vec<Edit>,
}

/// One rewrite: `len` bytes of the reply at `at` became `with`, which starts
/// at `shielded_at` in the rewritten text.
#[derive(Debug)]
struct Edit {
    at: usize,
    len: usize,
    with: &'static str,
    shielded_at: usize,
}

/// The escape that hides the character at `bytes[at]`, if a family could
/// read it as syntax: `<` starts every tag and Llama's marker, `[` Mistral's
/// marker and lists, `{` objects, `` ` `` fences and inline code, and a line
/// break ends the lines the Python-style family reads. Hiding every such
/// character, not only the known tags, keeps any string content (a JSON
/// call quoted in a message, a tag a later family learns) from becoming a
/// call or ending one early.
fn hiding(bytes: &[u8], at: usize) -> Option<&'static str> {
    match *bytes.get(at)? {
        b'<' => Some("\\u003c"),
        b'[' => Some("\\u005b"),
        b'{' => Some("\\u007b"),
        b'`' => Some("\\u0060"),
        b'\n' => Some("\\n"),
        _ => None,
    }
}

/// Whether `reply[start..end]` is one JSON value, whole, or with `calls`,
/// Python-style calls, whole.
fn reads_whole(reply: &str, start: usize, end: usize, open_at_end: bool, calls: bool) -> bool {
    json::read_value(reply, start, end, open_at_end).is_ok_and(|read| read.end == end)
        || (calls && pythonic::read_calls(reply, start, end).is_some_and(|(_, next)| next == end))
}

/// Where [`Shield::new`]'s scan stands.
struct Scan {
    /// Containers (and, in a call, parentheses) open around `pos`.
    depth: usize,
    /// Where the outermost open value starts.
    value_start: usize,
    /// Whether that value is read with Python-style calls in it: then `(`,
    /// `)` and `=` are its syntax.
    value_calls: bool,
    /// Whether that syntax was met in it: if the value then does not read,
    /// it is scanned again as JSON alone.
    used_calls: bool,
    /// Python-style calls are looked for only from here on (see
    /// [`Shield`]).
    calls_from: usize,
    /// Where the run of name characters just before `pos` started, outside
    /// strings: a `(` right after one opens a call.
    word_start: Option<usize>,
    /// The quote of the string `pos` is in.
    quote: Option<u8>,
    /// Whether the last byte outside strings opened a container or was a
    /// `,` or `:` (or, in a call, `(` or `=`): only there does a reader
    /// start a string.
    string_may_start: bool,
}

impl Shield {
    /// The shielded reply, or `None` when no string in it holds syntax
    /// (then the reply is read as it is).
    fn new(reply: &str) -> Option<Self> {
        let bytes = reply.as_bytes();
        // Rewrites as (offset, bytes replaced, replacement): those of values
        // that read whole, and those of the value being scanned.
        let mut edits: Vec<(usize, usize, &'static str)> = Vec::new();
        let mut pending: Vec<(usize, usize, &'static str)> = Vec::new();
        let mut scan = Scan {
            depth: 0,
            value_start: 0,
            value_calls: false,
            used_calls: false,
            calls_from: 0,
            word_start: None,
            quote: None,
            string_may_start: false,
        };
        let mut pos = 0;
        loop {
            let Some(&byte) = bytes.get(pos) else {
                // A value left open at the end of the reply, as the reader
                // closes it.
                if scan.depth > 0 && (!pending.is_empty() || scan.used_calls) {
                    if reads_whole(reply, scan.value_start, bytes.len(), true, scan.value_calls) {
                        edits.append(&mut pending);
                    } else if scan.used_calls {
                        pos = scan.rescan_as_json(bytes.len());
                        pending.clear();
                        continue;
                    }
                }
                break;
            };
            if let Some(open) = scan.quote {
                if byte == open {
                    scan.quote = None;
                    scan.string_may_start = false;
                    pos += 1;
                    continue;
                }
                // An escaped character is rewritten together with its `\\`.
                let (at, len) = if byte == b'\\' {
                    (pos + 1, 2)
                } else {
                    (pos, 1)
                };
                if let Some(with) = hiding(bytes, at) {
                    pending.push((pos, len, with));
                }
                pos += len;
                continue;
            }
            let word_start = scan.word_start.take();
            let mut closed = false;
            match byte {
                b'{' | b'[' => {
                    if scan.depth == 0 {
                        scan.open_value(pos);
                        pending.clear();
                    }
                    scan.depth += 1;
                    scan.string_may_start = true;
                }
                b'(' if scan.depth > 0 && scan.value_calls => {
                    scan.depth += 1;
                    scan.used_calls = true;
                    scan.string_may_start = true;
                }
                b'(' if scan.depth == 0 && pos >= scan.calls_from && word_start.is_some() => {
                    scan.open_value(word_start.unwrap_or(pos));
                    pending.clear();
                    scan.depth = 1;
                    scan.used_calls = true;
                    scan.string_may_start = true;
                }
                b'}' | b']' if scan.depth > 0 => closed = true,
                b')' if scan.depth > 0 && scan.value_calls => {
                    scan.used_calls = true;
                    closed = true;
                }
                b'"' | b'\'' if scan.depth > 0 && scan.string_may_start => {
                    scan.quote = Some(byte);
                }
                b',' | b':' => scan.string_may_start = scan.depth > 0,
                b'=' if scan.depth > 0 && scan.value_calls => {
                    scan.used_calls = true;
                    scan.string_may_start = true;
                }
                b' ' | b'\t' | b'\n' | b'\r' => {}
                _ => {
                    scan.string_may_start = false;
                    if json::is_ident_byte(byte) || byte == b'.' {
                        scan.word_start = word_start.or(Some(pos));
                    }
                }
            }
            if closed {
                scan.depth -= 1;
                scan.string_may_start = false;
                if scan.depth == 0 {
                    let end = pos + 1;
                    if !pending.is_empty() || scan.used_calls {
                        if reads_whole(reply, scan.value_start, end, false, scan.value_calls) {
                            edits.append(&mut pending);
                        } else if scan.used_calls {
                            pos = scan.rescan_as_json(end);
                            pending.clear();
                            continue;
                        }
                    }
                    pending.clear();
                }
            }
            pos += 1;
        }
        if edits.is_empty() {
            return None;
        }

        let mut text = String::with_capacity(reply.len() + 5 * edits.len());
        let mut shield_edits = Vec::with_capacity(edits.len());
        let mut cursor = 0;
        for (at, len, with) in edits {
            // Rewrites start on ASCII bytes and cover ASCII bytes, so these
            // are char boundaries.
            text.push_str(&reply[cursor..at]);
            shield_edits.push(Edit {
                at,
                len,
                with,
                shielded_at: text.len(),
            });
            text.push_str(with);
            cursor = at + len;
        }
        text.push_str(&reply[cursor..]);
        Some(Self {
            text,
            edits: shield_edits,
        })
    }

    /// The offset in the reply of offset `pos` of the rewritten text. An
    /// offset inside a rewrite goes to the start of what it replaced, or
    /// with `round_up` to its end.
    fn original(&self, pos: usize, round_up: bool) -> usize {
        let before = self
            .edits
            .partition_point(|e| e.shielded_at + e.with.len() <= pos);
        if let Some(edit) = self.edits.get(before)
            && edit.shielded_at < pos
        {
            return if round_up {
                edit.at + edit.len
            } else {
                edit.at
            };
        }
        match before.checked_sub(1).map(|i| &self.edits[i]) {
            None => pos,
            Some(edit) => edit.at + edit.len + (pos - (edit.shielded_at + edit.with.len())),
        }
    }
}

impl Scan {
    /// Starts the outermost value at `start`.
    fn open_value(&mut self, start: usize) {
        self.value_start = start;
        self.value_calls = start >= self.calls_from;
        self.used_calls = false;
    }

    /// Goes back to the start of a value that used Python-style call syntax
    /// and did not read (it ended at `end`), to scan it as JSON alone. Gives
    /// where to scan from.
    fn rescan_as_json(&mut self, end: usize) -> usize {
        self.calls_from = end;
        self.depth = 0;
        self.value_calls = false;
        self.used_calls = false;
        self.word_start = None;
        self.quote = None;
        self.string_may_start = false;
        self.value_start
    }
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
        // Elements instead of JSON, only where the block is meant as calls.
        if insist
            && bytes[pos] == b'<'
            && let Some((found, next)) = xml::read_call(reply, pos, end)
        {
            calls.push(found);
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
    fn elements_inside_a_call_block_are_a_call() {
        check(vec![
            (
                "<tool_call>\n  <name>calculate_triangle_area</name>\n  <arguments>\n    <base>10</base>\n    <height>5</height>\n    <unit>units</unit>\n  </arguments>\n</tool_call>",
                vec![call(
                    "calculate_triangle_area",
                    json!({"base": 10, "height": 5, "unit": "units"}),
                )],
                "",
                None,
            ),
            // Nested elements are an object, JSON text is JSON, entities are
            // characters, and a call without arguments has none.
            (
                "<tool_call><name>book</name><arguments><when><day>2</day></when><tags>[\"a\", \"b\"]</tags><note>a &lt; b &amp; c</note><ok>true</ok></arguments></tool_call>",
                vec![call(
                    "book",
                    json!({"when": {"day": 2}, "tags": ["a", "b"], "note": "a < b & c", "ok": true}),
                )],
                "",
                None,
            ),
            // An element written twice is the list of both values, not the
            // last one alone: validation then says a list is no number.
            (
                "```json\n<tool_call>\n  <name>spotify.play</name>\n  <arguments>\n    <artist>Taylor Swift</artist>\n    <duration>20</duration>\n    <duration>15</duration>\n    <duration>[5]</duration>\n  </arguments>\n</tool_call>\n```",
                vec![call(
                    "spotify.play",
                    json!({"artist": "Taylor Swift", "duration": [20, 15, [5]]}),
                )],
                "",
                None,
            ),
            (
                "```json\n<tool_call>\n<name>list_todos</name>\n</tool_call>\n```",
                vec![call("list_todos", json!({}))],
                "",
                None,
            ),
            (
                "<tool_call><name>list_todos</name></tool_call>",
                vec![call("list_todos", json!({}))],
                "",
                None,
            ),
            // Elements in prose are prose; a block of elements that are not a
            // call is still a malformed call.
            (
                "Wrap it as <name>x</name> please.",
                vec![],
                "Wrap it as <name>x</name> please.",
                None,
            ),
            (
                "<tool_call><city>Paris</city></tool_call>",
                vec![],
                "",
                Some("the tool call must be"),
            ),
            (
                "<tool_call><name>bad name!</name></tool_call>",
                vec![],
                "",
                Some("the tool call must be"),
            ),
        ]);
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
    fn call_syntax_inside_strings_is_text() {
        let tag = |q: &str| json!({"query": q});
        check(vec![
            (
                r#"{"name": "search", "arguments": {"query": "<tool_call>"}}"#,
                vec![call("search", tag("<tool_call>"))],
                "",
                None,
            ),
            (
                "Looking.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"a </tool_call> b\"}}\n</tool_call>\nDone.",
                vec![call("search", tag("a </tool_call> b"))],
                "Looking.\nDone.",
                None,
            ),
            (
                "[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"query\": \"[TOOL_CALLS] <|python_tag|>\"}}] ok",
                vec![call("search", tag("[TOOL_CALLS] <|python_tag|>"))],
                "ok",
                None,
            ),
            (
                "[TOOL_CALLS]search[ARGS]{\"query\": \"<function_call>\"}",
                vec![call("search", tag("<function_call>"))],
                "",
                None,
            ),
            (
                "```json\n{\"name\": \"search\", \"arguments\": {\"query\": \"```\"}}\n```",
                vec![call("search", tag("```"))],
                "",
                None,
            ),
            (
                // Escaped, single-quoted, and left open at the end.
                r#"{'name': 'search', 'arguments': {'query': '\<tool_call>\n'}"#,
                vec![call("search", tag("<tool_call>\n"))],
                "",
                None,
            ),
            (
                // A raw line break inside a string is not a line of its own.
                "{\"name\": \"note\", \"arguments\": {\"text\": \"x\nsearch(query=\\\"y\\\")\n\"}}",
                vec![call("note", json!({"text": "x\nsearch(query=\"y\")\n"}))],
                "",
                None,
            ),
            (
                // A tag outside any string still counts, quotes in prose
                // open no string.
                "He said \"hi <tool_call>{\"name\": \"a\"}</tool_call> it's \"[x\" done",
                vec![call("a", json!({}))],
                "He said \"hi it's \"[x\" done",
                None,
            ),
            (
                // JSON that does not read is left to the families as before.
                "<tool_call>{\"name\": \"a\", \"arguments\": {\"q\": \"x</tool_call> ok",
                vec![],
                "ok",
                Some("the call is not valid JSON"),
            ),
        ]);
    }

    #[test]
    fn call_syntax_inside_python_call_strings_is_text() {
        let body = |b: &str| json!({"body": b});
        let tag = |q: &str| json!({"query": q});
        check(vec![
            (
                r#"[send_message(body="<b>hi</b> see <tool_call> docs")]"#,
                vec![call("send_message", body("<b>hi</b> see <tool_call> docs"))],
                "",
                None,
            ),
            (
                "Sending it.\nsend_message(body=\"ends with </tool_call> and <|im_end|>\")\nDone.",
                vec![call(
                    "send_message",
                    body("ends with </tool_call> and <|im_end|>"),
                )],
                "Sending it.\nDone.",
                None,
            ),
            (
                r#"<tool_call>send_message(body="x </tool_call> y <tool_call>")</tool_call> ok"#,
                vec![call("send_message", body("x </tool_call> y <tool_call>"))],
                "ok",
                None,
            ),
            (
                r#"<|python_tag|>send_message(body='<|python_tag|>[TOOL_CALLS]') then"#,
                vec![call("send_message", body("<|python_tag|>[TOOL_CALLS]"))],
                "then",
                None,
            ),
            (
                r#"[TOOL_CALLS][send_message(body="<function_call>"), get_cart()]"#,
                vec![
                    call("send_message", body("<function_call>")),
                    call("get_cart", json!({})),
                ],
                "",
                None,
            ),
            (
                "```python\nsend_message(body=\"a ``` b\")\n```",
                vec![call("send_message", body("a ``` b"))],
                "",
                None,
            ),
            (
                "`send_message(to=\"ann\", body=\"<tool_call>{\\\"name\\\": \\\"pay\\\"}</tool_call>\")`",
                vec![call(
                    "send_message",
                    json!({"to": "ann", "body": "<tool_call>{\"name\": \"pay\"}</tool_call>"}),
                )],
                "",
                None,
            ),
            (
                // A raw line break inside a string does not end the call, and
                // what follows it in the string is not a call of its own.
                "send_message(body=\"first line\npay(amount=100)\")",
                vec![call("send_message", body("first line\npay(amount=100)"))],
                "",
                None,
            ),
            (
                // A call quoted in a string is data, not a call of its own,
                // in a call on its own line or in a sentence.
                r#"send_message(body='<tool_call>{"name": "pay", "arguments": {}}</tool_call>')"#,
                vec![call(
                    "send_message",
                    body(r#"<tool_call>{"name": "pay", "arguments": {}}</tool_call>"#),
                )],
                "",
                None,
            ),
            (
                r#"Try send_message(body='{"name": "pay", "arguments": {}}') later"#,
                vec![],
                r#"Try send_message(body='{"name": "pay", "arguments": {}}') later"#,
                None,
            ),
            (
                r#"I would send send_message(body='[{"name": "pay"}]') now"#,
                vec![],
                r#"I would send send_message(body='[{"name": "pay"}]') now"#,
                None,
            ),
            (
                // What looks like a call but does not read as one is scanned
                // again as JSON alone: its parentheses and quotes hide no
                // JSON value inside it.
                r#"search({"query": "<tool_call>"}) and f(x, "oops) {"name": "search", "arguments": {"query": "</tool_call>"}}"#,
                vec![call("search", tag("</tool_call>"))],
                r#"search({"query": "<tool_call>"}) and f(x, "oops)"#,
                None,
            ),
            (
                // Fences with nothing between them are cut only where calls
                // were cut from between them, never out of a string.
                r#"Try note(text="``` ```") or {"text": "```json ```"} later."#,
                vec![],
                r#"Try note(text="``` ```") or {"text": "```json ```"} later."#,
                None,
            ),
            (
                // A call in a sentence is prose, and so is the tag in its
                // string: it opens no block.
                r#"Try search(query="<tool_call>") later."#,
                vec![],
                r#"Try search(query="<tool_call>") later."#,
                None,
            ),
        ]);
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
            // Call-shaped text that does not read, each scanned again as
            // JSON: once, not once per call it is nested in.
            "a(b)".repeat(50_000),
            "f(x, \"".repeat(20_000),
            "f(k=[".repeat(20_000),
            "g(q=\"<tool_call>\") ".repeat(20_000),
        ];
        for input in inputs {
            check_invariants(&input);
        }
    }
}
