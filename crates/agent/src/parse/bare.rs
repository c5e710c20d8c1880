//! JSON calls written straight into the prose, with no tag or fence.
//!
//! This is the reply format the prompt teaches when tools are listed inline,
//! and what most small models fall back to anyway. Every `{` or `[` in what
//! the other families left is a candidate: a value that reads as a call is
//! taken (with the backticks around it, if any); JSON that is not a call is
//! skipped whole and stays prose; text that fails to read is prose too,
//! unless a call key such as `"name"` was read before the failure, which
//! makes it a malformed call. Scanning resumes after whatever was read, so
//! each byte is looked at a bounded number of times.

use std::ops::Range;

use super::json::read_value;
use super::shape::{Shape, interpret};
use super::{Family, Found, Outcome};

/// The bare JSON family.
pub(super) struct Bare;

impl Family for Bare {
    fn scan(&self, reply: &str, gap: Range<usize>, found: &mut Vec<Found>) {
        let bytes = reply.as_bytes();
        let open_at_end = ends_reply(reply, gap.end);
        let mut pos = gap.start;
        while let Some(offset) = reply[pos..gap.end].find(['{', '[']) {
            let at = pos + offset;
            match read_value(reply, at, gap.end, open_at_end) {
                Ok(read) => {
                    pos = read.end;
                    let outcome = match interpret(read.value) {
                        Shape::Calls(calls) => Outcome::Calls(calls),
                        Shape::Broken(reason) => Outcome::Malformed(reason),
                        Shape::NotACall => continue,
                    };
                    // Inline code: `{"name": …}` loses its backticks too.
                    let quoted = at > gap.start
                        && read.end < gap.end
                        && bytes[at - 1] == b'`'
                        && bytes[read.end] == b'`';
                    let span = if quoted {
                        at - 1..read.end + 1
                    } else {
                        at..read.end
                    };
                    pos = span.end;
                    found.push(Found { span, outcome });
                }
                Err(failure) if failure.looked_like_call => {
                    let end = balanced_end(reply, at, gap.end).max(failure.at);
                    found.push(Found {
                        span: at..end,
                        outcome: Outcome::Malformed(format!(
                            "the call is not valid JSON: {}",
                            failure.reason
                        )),
                    });
                    pos = end;
                }
                Err(failure) => pos = failure.at.max(at + 1),
            }
        }
    }
}

/// Whether nothing but whitespace and closing tags follows `at`: only then
/// may a call left open at `at` be closed there.
fn ends_reply(reply: &str, at: usize) -> bool {
    let mut rest = reply[at..].trim();
    while let Some(stripped) = rest.strip_prefix("</tool_call>") {
        rest = stripped.trim_start();
    }
    rest.is_empty()
}

/// Where the brackets opened at `start` balance again (double-quoted strings
/// skipped), or `end`: how much of an unreadable call to cut from the prose.
pub(super) fn balanced_end(reply: &str, start: usize, end: usize) -> usize {
    let bytes = reply.as_bytes();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut pos = start;
    while pos < end {
        let byte = bytes[pos];
        if in_string {
            match byte {
                b'\\' => pos += 1,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return pos + 1;
                    }
                }
                _ => {}
            }
        }
        pos += 1;
    }
    // Skipping an escaped byte may step past `end`; never past it, and
    // never inside a char (the escaped byte may start a multi-byte char).
    let mut end = end.min(reply.len());
    while !reply.is_char_boundary(end) {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::parse_tool_calls;
    use super::*;

    #[test]
    fn finds_calls_in_prose() {
        let cases: Vec<(&str, Vec<&str>, &str, Option<&str>)> = vec![
            (
                "Sure! {\"name\": \"a\"} Then done.",
                vec!["a"],
                "Sure! Then done.",
                None,
            ),
            (
                "{\"answer\": 42} and {\"name\": \"a\"}",
                vec!["a"],
                "{\"answer\": 42} and",
                None,
            ),
            ("it's {\"name\": \"a\"}", vec!["a"], "it's", None),
            (
                "[see above] {\"tool\": \"a\", \"args\": {}}",
                vec!["a"],
                "[see above]",
                None,
            ),
            (
                "{\"name\": \"a\"} {\"name\": \"b\"}",
                vec!["a", "b"],
                "",
                None,
            ),
            (
                "{\"name\": \"a\", \"arguments\": {\"q\": 1 \"r\": 2}} Hope that helps",
                vec![],
                "Hope that helps",
                Some("the call is not valid JSON: expected ',' or '}' after \"1\""),
            ),
            (
                "{\"name\": \"a\", \"arguments\": {\"q\": 1}\nok",
                vec![],
                "",
                Some("the call is not valid JSON: expected ',' or '}' after \"1\""),
            ),
        ];
        for (reply, names, text, malformed) in cases {
            let parsed = parse_tool_calls(reply);
            let got: Vec<&str> = parsed.calls.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(got, names, "{reply:?}");
            assert_eq!(parsed.text, text, "{reply:?}");
            assert_eq!(parsed.malformed.as_deref(), malformed, "{reply:?}");
        }
    }

    #[test]
    fn closes_a_call_only_at_the_end_of_the_reply() {
        let parsed =
            parse_tool_calls("{\"name\": \"a\", \"arguments\": {\"q\": [1]}\n</tool_call>");
        assert_eq!(parsed.calls.len(), 1);
        assert_eq!(parsed.calls[0].arguments, json!({"q": [1]}));
        assert!(ends_reply("x  </tool_call>\n", 1));
        assert!(!ends_reply("x  </tool_call> y", 1));
    }

    #[test]
    fn balances_brackets_outside_strings() {
        let cases = [
            (r#"{"a": "}"} rest"#, 10),
            (r#"{"a": [1, {"b": 2}]} rest"#, 20),
            (r#"{"a": 1"#, 7),
            ("{\"a\": \"\\", 8),
            ("{\"a\": \"\\é", 10),
        ];
        for (text, expected) in cases {
            assert_eq!(balanced_end(text, 0, text.len()), expected, "{text}");
        }
    }
}
