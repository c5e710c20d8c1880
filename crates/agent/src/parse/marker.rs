//! Calls announced by a special token: Mistral's `[TOOL_CALLS]` and Llama's
//! `<|python_tag|>`.
//!
//! When a tokenizer keeps these tokens in the decoded text, what follows them
//! is meant as a call: a JSON list or object (`[TOOL_CALLS][{"name": …}]`),
//! Mistral's newer `[TOOL_CALLS]name[ARGS]{…}`, or a Python-style call after
//! `<|python_tag|>`. Something unreadable after a marker is malformed. The
//! call ends where its JSON ends, so prose after it stays prose.

use std::ops::Range;

use super::bare::balanced_end;
use super::json::{is_ident_byte, read_value};
use super::pythonic::read_calls;
use super::shape::{Shape, interpret};
use super::{Family, Found, NOT_A_CALL, Outcome, ParsedCall};

/// The special-token family.
pub(super) struct Marker;

const MARKERS: [&str; 2] = ["[TOOL_CALLS]", "<|python_tag|>"];

/// Mistral's separator between a tool's name and its arguments.
const ARGS: &str = "[ARGS]";

/// Finds markers left to right, remembering where each kind occurs next, so
/// that a kind absent from the rest of the reply is searched for once, not
/// once per marker (which would be quadratic).
struct Markers<'a> {
    /// The reply.
    reply: &'a str,
    /// The end of the gap being scanned.
    end: usize,
    /// Per kind: its next occurrence as last found; `None` once none is left.
    next: [Option<usize>; MARKERS.len()],
}

impl<'a> Markers<'a> {
    fn new(reply: &'a str, gap: &Range<usize>) -> Self {
        let find = |marker: &str| {
            reply[gap.start..gap.end]
                .find(marker)
                .map(|i| gap.start + i)
        };
        Self {
            reply,
            end: gap.end,
            next: MARKERS.map(find),
        }
    }

    /// The first marker at or after `from`, with its length.
    fn first_from(&mut self, from: usize) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (next, marker) in self.next.iter_mut().zip(MARKERS) {
            if let Some(at) = *next
                && at < from
            {
                *next = self.reply[from..self.end].find(marker).map(|i| from + i);
            }
            if let Some(at) = *next
                && best.is_none_or(|(b, _)| at < b)
            {
                best = Some((at, marker.len()));
            }
        }
        best
    }
}

impl Family for Marker {
    fn scan(&self, reply: &str, gap: Range<usize>, found: &mut Vec<Found>) {
        let mut markers = Markers::new(reply, &gap);
        let mut pos = gap.start;
        while let Some((at, len)) = markers.first_from(pos) {
            let after = at + len;
            // The call cannot run into the next marker.
            let region_end = markers.first_from(after).map_or(gap.end, |(next, _)| next);
            let (end, outcome) = read_after_marker(reply, after, region_end, gap.end);
            found.push(Found {
                span: at..end,
                outcome,
            });
            pos = end.max(after);
        }
    }
}

/// Reads what follows a marker, up to `end`. Gives where the call ends and
/// what it was.
fn read_after_marker(reply: &str, from: usize, end: usize, gap_end: usize) -> (usize, Outcome) {
    let bytes = reply.as_bytes();
    let start = from + (reply[from..end].len() - reply[from..end].trim_start().len());
    let open_at_end = end == gap_end && reply[gap_end..].trim().is_empty();
    if start >= end {
        return (end, Outcome::Malformed(NOT_A_CALL.to_string()));
    }
    // Mistral v11: `name[ARGS]{…}`.
    let name_end = (start..end)
        .find(|&i| !is_ident_byte(bytes[i]) && bytes[i] != b'.')
        .unwrap_or(end);
    if name_end > start && reply[name_end..end].starts_with(ARGS) {
        let name = reply[start..name_end].to_string();
        let args_start = name_end + ARGS.len();
        let args_start =
            args_start + (reply[args_start..end].len() - reply[args_start..end].trim_start().len());
        return match read_value(reply, args_start, end, open_at_end) {
            Ok(read) => match read.value {
                serde_json::Value::Object(_) => (
                    read.end,
                    Outcome::Calls(vec![ParsedCall {
                        name,
                        arguments: read.value,
                    }]),
                ),
                other => (
                    read.end,
                    Outcome::Malformed(format!(
                        "the arguments must be a JSON object of named values, got {}",
                        super::json::quote_snippet(&other.to_string())
                    )),
                ),
            },
            Err(failure) => (
                balanced_end(reply, args_start, end).max(failure.at),
                Outcome::Malformed(format!("the call is not valid JSON: {}", failure.reason)),
            ),
        };
    }
    // Python style, alone or in a list: `<|python_tag|>search(q="x")`.
    if let Some((calls, next)) = read_calls(reply, start, end) {
        return (next, Outcome::Calls(calls));
    }
    if !matches!(bytes[start], b'{' | b'[') {
        return (end, Outcome::Malformed(NOT_A_CALL.to_string()));
    }
    match read_value(reply, start, end, open_at_end) {
        Ok(read) => match interpret(read.value) {
            Shape::Calls(calls) => (read.end, Outcome::Calls(calls)),
            Shape::Broken(reason) => (read.end, Outcome::Malformed(reason)),
            Shape::NotACall => (read.end, Outcome::Malformed(NOT_A_CALL.to_string())),
        },
        Err(failure) => (
            balanced_end(reply, start, end).max(failure.at),
            Outcome::Malformed(format!("the call is not valid JSON: {}", failure.reason)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::parse_tool_calls;
    use super::*;

    #[test]
    fn reads_marked_calls() {
        let cases: Vec<(&str, Vec<ParsedCall>, &str, Option<&str>)> = vec![
            (
                "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": 1}}]",
                vec![ParsedCall {
                    name: "a".into(),
                    arguments: json!({"q": 1}),
                }],
                "",
                None,
            ),
            (
                "[TOOL_CALLS]a[ARGS]{\"q\": 1}[TOOL_CALLS]b[ARGS]{}",
                vec![
                    ParsedCall {
                        name: "a".into(),
                        arguments: json!({"q": 1}),
                    },
                    ParsedCall {
                        name: "b".into(),
                        arguments: json!({}),
                    },
                ],
                "",
                None,
            ),
            (
                "<|python_tag|>search(query=\"tents\") then I will answer",
                vec![ParsedCall {
                    name: "search".into(),
                    arguments: json!({"query": "tents"}),
                }],
                "then I will answer",
                None,
            ),
            (
                "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": 1}",
                vec![ParsedCall {
                    name: "a".into(),
                    arguments: json!({"q": 1}),
                }],
                "",
                None,
            ),
            ("[TOOL_CALLS]", vec![], "", Some(NOT_A_CALL)),
            ("[TOOL_CALLS] sorry", vec![], "", Some(NOT_A_CALL)),
            ("[TOOL_CALLS][1, 2]", vec![], "", Some(NOT_A_CALL)),
            (
                "[TOOL_CALLS]a[ARGS]\"q\"",
                vec![],
                "",
                Some("the arguments must be a JSON object"),
            ),
            (
                "[TOOL_CALLS][{\"name\": \"a\" \"x\"}] ok",
                vec![],
                "ok",
                Some("the call is not valid JSON: expected ',' or '}' after \"a\""),
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
