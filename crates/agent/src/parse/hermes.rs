//! Hermes-style tagged calls: `<tool_call>{"name": …, "arguments": …}</tool_call>`.
//!
//! Qwen, Hermes and SmolLM2 are trained on this format (SmolLM2 puts a JSON
//! list inside the tag). Small models often stop before the closing tag, or
//! open a second block without closing the first, so a block also ends at the
//! next opening tag or at the end of the reply. Everything inside a block is
//! meant as a call, so a block that cannot be read is malformed, never prose.
//! A closing tag with no opening one is noise and is cut from the prose.

use std::ops::Range;

use super::{Family, Found, NOT_A_CALL, Outcome, read_block};

/// The Hermes family.
pub(super) struct Hermes;

/// Opening and closing tags. `<function_call>` is what some fine-tunes of
/// the same models write instead.
const TAGS: &[(&str, &str)] = &[
    ("<tool_call>", "</tool_call>"),
    ("<function_call>", "</function_call>"),
];

/// A tag found in the reply.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tag {
    /// Byte offset of its `<`.
    at: usize,
    /// Its length in bytes.
    len: usize,
    /// Whether it opens a block.
    opens: bool,
    /// Which pair of [`TAGS`] it belongs to.
    pair: usize,
}

/// The first tag in `reply[from..end]`.
fn next_tag(reply: &str, from: usize, end: usize) -> Option<Tag> {
    let mut pos = from;
    while pos < end {
        let at = pos + reply[pos..end].find('<')?;
        let rest = &reply[at..end];
        for (pair, (open, close)) in TAGS.iter().enumerate() {
            for (tag, opens) in [(open, true), (close, false)] {
                if rest.starts_with(tag) {
                    return Some(Tag {
                        at,
                        len: tag.len(),
                        opens,
                        pair,
                    });
                }
            }
        }
        pos = at + 1;
    }
    None
}

impl Family for Hermes {
    fn scan(&self, reply: &str, gap: Range<usize>, found: &mut Vec<Found>) {
        let mut pos = gap.start;
        while let Some(tag) = next_tag(reply, pos, gap.end) {
            let after = tag.at + tag.len;
            if !tag.opens {
                found.push(Found {
                    span: tag.at..after,
                    outcome: Outcome::Calls(Vec::new()),
                });
                pos = after;
                continue;
            }
            let (body_end, span_end) = match next_tag(reply, after, gap.end) {
                Some(close) if !close.opens && close.pair == tag.pair => {
                    (close.at, close.at + close.len)
                }
                // Another opening tag (or a mismatched closer): this block
                // was never closed, so it ends where the next one starts.
                Some(other) => (other.at, other.at),
                None => (gap.end, gap.end),
            };
            // With `insist`, `read_block` always answers; the fallback only
            // keeps this total.
            let outcome = read_block(reply, after..body_end, true)
                .unwrap_or_else(|| Outcome::Malformed(NOT_A_CALL.to_string()));
            found.push(Found {
                span: tag.at..span_end,
                outcome,
            });
            pos = span_end;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{ParsedCall, parse_tool_calls};

    fn call(name: &str, arguments: serde_json::Value) -> ParsedCall {
        ParsedCall {
            name: name.to_string(),
            arguments,
        }
    }

    #[test]
    fn reads_tagged_calls() {
        let cases: Vec<(&str, Vec<ParsedCall>, &str, Option<&str>)> = vec![
            (
                "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"tents\"}}\n</tool_call>",
                vec![call("search", json!({"query": "tents"}))],
                "",
                None,
            ),
            (
                "Let me check.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {\"n\": 1}}</tool_call>",
                vec![call("a", json!({})), call("b", json!({"n": 1}))],
                "Let me check.",
                None,
            ),
            (
                "<tool_call>[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {}}]</tool_call>",
                vec![call("a", json!({})), call("b", json!({}))],
                "",
                None,
            ),
            (
                "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"tents\"}}",
                vec![call("search", json!({"query": "tents"}))],
                "",
                None,
            ),
            (
                "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"tents\"}</tool_call>",
                vec![call("search", json!({"query": "tents"}))],
                "",
                None,
            ),
            (
                "<tool_call>{\"name\": \"a\"}\n<tool_call>{\"name\": \"b\"}",
                vec![call("a", json!({})), call("b", json!({}))],
                "",
                None,
            ),
            (
                "<tool_call>\n```json\n{\"name\": \"a\", \"arguments\": {}}\n```\n</tool_call>",
                vec![call("a", json!({}))],
                "",
                None,
            ),
            (
                "<tool_call>\n{\"name\": \"a\"}\n{\"name\": \"b\"}\n</tool_call>",
                vec![call("a", json!({})), call("b", json!({}))],
                "",
                None,
            ),
            (
                "<tool_call>search(query=\"tents\")</tool_call>",
                vec![call("search", json!({"query": "tents"}))],
                "",
                None,
            ),
            (
                "<tool_call>[search(query=\"tents\"), get_cart()]</tool_call>",
                vec![
                    call("search", json!({"query": "tents"})),
                    call("get_cart", json!({})),
                ],
                "",
                None,
            ),
            (
                "<function_call>{\"name\": \"a\", \"arguments\": {}}</function_call> ok",
                vec![call("a", json!({}))],
                "ok",
                None,
            ),
            (
                "{\"name\": \"a\", \"arguments\": {}}</tool_call>",
                vec![call("a", json!({}))],
                "",
                None,
            ),
            ("Done.</tool_call>", vec![], "Done.", None),
            (
                "<tool_call>",
                vec![],
                "",
                Some("the tool call must be a JSON object"),
            ),
            (
                "<tool_call>{\"answer\": 42}</tool_call>",
                vec![],
                "",
                Some("the tool call must be a JSON object"),
            ),
            (
                "<tool_call>{\"name\": \"a\", \"arguments\": {\"q\": }}</tool_call>",
                vec![],
                "",
                Some("the call is not valid JSON: expected a value for \"q\", got \"}\""),
            ),
        ];
        for (reply, calls, text, malformed) in cases {
            let parsed = parse_tool_calls(reply);
            assert_eq!(parsed.calls, calls, "{reply:?}");
            assert_eq!(parsed.text, text, "{reply:?}");
            match malformed {
                None => assert_eq!(parsed.malformed, None, "{reply:?}"),
                Some(start) => {
                    let got = parsed.malformed.unwrap_or_default();
                    assert!(got.starts_with(start), "{reply:?}: {got}");
                }
            }
        }
    }
}
