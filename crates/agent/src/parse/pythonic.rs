//! Python-style calls: `search(query="tents", limit=5)`.
//!
//! Llama 3.2's small models and Gemma's `tool_code` write calls this way, and
//! other small models drift into it. Prose is full of parentheses, so only
//! the unambiguous form is read: keyword arguments only, values that are
//! literals (strings, numbers, `True`/`False`/`None`, lists, dicts), and, as
//! a family on its own, only a line that holds nothing else (a call, or a
//! list of calls `[a(x=1), b()]`, optionally in backticks). Lines inside code
//! fences that were not calls are code, and are left alone.

use std::ops::Range;

use serde_json::{Map, Value};

use super::json::{is_ident_byte, is_ident_start, read_value};
use super::shape::looks_like_tool_name;
use super::{Family, Found, Outcome, ParsedCall};

/// The Python-style family.
pub(super) struct Pythonic;

impl Family for Pythonic {
    fn scan(&self, reply: &str, gap: Range<usize>, found: &mut Vec<Found>) {
        let mut in_fence = false;
        let mut line_start = gap.start;
        while line_start < gap.end {
            let line_end = reply[line_start..gap.end]
                .find('\n')
                .map_or(gap.end, |i| line_start + i);
            let line = &reply[line_start..line_end];
            let trimmed = line.trim();
            if trimmed.starts_with("```") {
                in_fence = !in_fence;
            } else if !in_fence && !trimmed.is_empty() {
                let start = line_start + (line.len() - line.trim_start().len());
                let end = start + trimmed.len();
                if let Some(calls) = read_line(reply, start, end) {
                    found.push(Found {
                        span: start..end,
                        outcome: Outcome::Calls(calls),
                    });
                }
            }
            line_start = line_end + 1;
        }
    }
}

/// Reads a line that is nothing but calls, optionally in backticks.
fn read_line(reply: &str, start: usize, end: usize) -> Option<Vec<ParsedCall>> {
    let bytes = reply.as_bytes();
    let (start, end) = if end - start >= 2 && bytes[start] == b'`' && bytes[end - 1] == b'`' {
        (start + 1, end - 1)
    } else {
        (start, end)
    };
    let (calls, next) = read_calls(reply, start, end)?;
    let rest = reply[next..end].trim_end_matches([' ', '\t', '\r', ';']);
    rest.is_empty().then_some(calls)
}

/// Reads one call, or a list of calls in brackets, at `pos`. Gives the calls
/// and the offset just past them.
pub(super) fn read_calls(reply: &str, pos: usize, end: usize) -> Option<(Vec<ParsedCall>, usize)> {
    let bytes = reply.as_bytes();
    if bytes.get(pos) != Some(&b'[') {
        let (call, next) = read_call(reply, pos, end)?;
        return Some((vec![call], next));
    }
    let mut calls = Vec::new();
    let mut pos = skip_ws(bytes, pos + 1, end);
    loop {
        let (call, next) = read_call(reply, pos, end)?;
        calls.push(call);
        pos = skip_ws(bytes, next, end);
        match bytes.get(pos).filter(|_| pos < end) {
            Some(b',') => pos = skip_ws(bytes, pos + 1, end),
            Some(b']') => return Some((calls, pos + 1)),
            _ => return None,
        }
    }
}

/// Reads `name(key=value, …)` at `pos`. Gives the call and the offset just
/// past its `)`.
pub(super) fn read_call(reply: &str, pos: usize, end: usize) -> Option<(ParsedCall, usize)> {
    let bytes = reply.as_bytes();
    let end = end.min(reply.len());
    let name_end = ident_end(bytes, pos, end, true)?;
    let name = &reply[pos..name_end];
    // OpenAI-trained models sometimes namespace the call: `functions.search(…)`.
    let name = name.strip_prefix("functions.").unwrap_or(name);
    if !looks_like_tool_name(name) || bytes.get(name_end) != Some(&b'(') || name_end >= end {
        return None;
    }
    let mut arguments = Map::new();
    let mut pos = skip_ws(bytes, name_end + 1, end);
    if bytes.get(pos) == Some(&b')') && pos < end {
        // `hello()` could be prose; a call with no arguments needs a name
        // that looks like code: lowercase, or with an underscore.
        let code_like = name.contains('_') || !name.bytes().any(|b| b.is_ascii_uppercase());
        return code_like.then(|| (call(name, arguments), pos + 1));
    }
    loop {
        let key_end = ident_end(bytes, pos, end, false)?;
        let key = reply[pos..key_end].to_string();
        pos = skip_ws(bytes, key_end, end);
        if bytes.get(pos) != Some(&b'=') || pos >= end {
            return None;
        }
        pos = skip_ws(bytes, pos + 1, end);
        let read = read_value(reply, pos, end, false).ok()?;
        arguments.insert(key, read.value);
        pos = skip_ws(bytes, read.end, end);
        if pos >= end {
            return None;
        }
        match bytes[pos] {
            b',' => {
                pos = skip_ws(bytes, pos + 1, end);
                // A trailing comma before `)`.
                if bytes.get(pos) == Some(&b')') && pos < end {
                    return Some((call(name, arguments), pos + 1));
                }
            }
            b')' => return Some((call(name, arguments), pos + 1)),
            _ => return None,
        }
    }
}

fn call(name: &str, arguments: Map<String, Value>) -> ParsedCall {
    ParsedCall {
        name: name.to_string(),
        arguments: Value::Object(arguments),
    }
}

/// The end of the identifier at `pos`; names may also hold `.` and `-`.
fn ident_end(bytes: &[u8], pos: usize, end: usize, is_name: bool) -> Option<usize> {
    if pos >= end || !is_ident_start(bytes[pos]) {
        return None;
    }
    let mut at = pos + 1;
    while at < end && (is_ident_byte(bytes[at]) || (is_name && bytes[at] == b'.')) {
        at += 1;
    }
    Some(at)
}

fn skip_ws(bytes: &[u8], mut pos: usize, end: usize) -> usize {
    while pos < end && matches!(bytes[pos], b' ' | b'\t' | b'\n' | b'\r') {
        pos += 1;
    }
    pos
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::parse_tool_calls;
    use super::*;

    #[test]
    fn reads_single_calls() {
        let cases: &[(&str, Option<(&str, Value)>)] = &[
            (
                r#"search(query="tents")"#,
                Some(("search", json!({"query": "tents"}))),
            ),
            (
                r#"search(query='tents', limit=5,)"#,
                Some(("search", json!({"query": "tents", "limit": 5}))),
            ),
            (
                r#"f_x(a=True, b=None, c=[1, 2], d={'k': 'v'})"#,
                Some((
                    "f_x",
                    json!({"a": true, "b": null, "c": [1, 2], "d": {"k": "v"}}),
                )),
            ),
            (
                r#"functions.search(q="x")"#,
                Some(("search", json!({"q": "x"}))),
            ),
            ("get_cart()", Some(("get_cart", json!({})))),
            ("refresh()", Some(("refresh", json!({})))),
            ("Hello()", None),
            (r#"search("tents")"#, None),
            ("search(query=tents)", None),
            ("search(query=\"tents\"", None),
            ("search (query=\"tents\")", None),
            ("print(x)", None),
        ];
        for (text, expected) in cases {
            let got = read_call(text, 0, text.len()).map(|(c, _)| (c.name, c.arguments));
            let expected = expected.as_ref().map(|(n, a)| (n.to_string(), a.clone()));
            assert_eq!(got, expected, "{text}");
        }
    }

    #[test]
    fn reads_whole_lines_only() {
        let cases: Vec<(&str, Vec<&str>, &str)> = vec![
            ("search(query=\"tents\")", vec!["search"], ""),
            (
                "Okay.\n`search(query=\"tents\")`\nWait.",
                vec!["search"],
                "Okay.\nWait.",
            ),
            (
                "[search(query=\"tents\"), get_cart()]",
                vec!["search", "get_cart"],
                "",
            ),
            ("  open_product(id=\"p-1\");  ", vec!["open_product"], ""),
            (
                "Call search(query=\"tents\") to find them.",
                vec![],
                "Call search(query=\"tents\") to find them.",
            ),
            (
                "```\nrun(x=1)\nprint(y)\n```",
                vec![],
                "```\nrun(x=1)\nprint(y)\n```",
            ),
            ("a(x=1) b(y=2)", vec![], "a(x=1) b(y=2)"),
        ];
        for (reply, names, text) in cases {
            let parsed = parse_tool_calls(reply);
            let got: Vec<&str> = parsed.calls.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(got, names, "{reply:?}");
            assert_eq!(parsed.text, text, "{reply:?}");
            assert_eq!(parsed.malformed, None, "{reply:?}");
        }
    }
}
