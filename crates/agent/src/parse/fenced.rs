//! Calls inside Markdown code fences: ```` ```json … ``` ````.
//!
//! Chat-tuned small models wrap JSON in a fence out of habit. A fence is a
//! call when its language is one a call could be written in (none, `json`,
//! `python`, `tool_call`, `tool_code`, …) and its body reads as calls; then
//! the whole fence is cut from the prose. A fence of JSON that is not a call,
//! or of real code, stays prose. Fences labelled as calls (`tool_call`,
//! `tool_code`, `function_call`) are meant as calls, so an unreadable body
//! there is malformed. An unterminated last fence runs to the end.

use std::ops::Range;

use super::{Family, Found, read_block};

/// The code-fence family.
pub(super) struct Fenced;

/// Fence languages a call may be written in.
const CALL_LANGUAGES: &[&str] = &[
    "",
    "json",
    "json5",
    "jsonc",
    "js",
    "javascript",
    "python",
    "py",
    "tool_call",
    "tool_calls",
    "tool_code",
    "function_call",
];

/// Fence languages that say the body is a call.
const CALL_LABELS: &[&str] = &["tool_call", "tool_calls", "tool_code", "function_call"];

const FENCE: &str = "```";

/// Where the label line after an opening fence ends: at a newline, or at a
/// closing fence on the same line (then `true`). Stopping at the first of
/// either keeps a run of fences on one line linear to scan.
fn label_end(reply: &str, from: usize, end: usize) -> (usize, bool) {
    let bytes = reply.as_bytes();
    let mut pos = from;
    while pos < end {
        match bytes[pos] {
            b'\n' => return (pos, false),
            b'`' if reply[pos..end].starts_with(FENCE) => return (pos, true),
            _ => pos += 1,
        }
    }
    (end, false)
}

impl Family for Fenced {
    fn scan(&self, reply: &str, gap: Range<usize>, found: &mut Vec<Found>) {
        let mut pos = gap.start;
        while let Some(offset) = reply[pos..gap.end].find(FENCE) {
            let at = pos + offset;
            let after = at + FENCE.len();
            let (label_end, inline) = label_end(reply, after, gap.end);
            let label_line = &reply[after..label_end];
            let (language, body, span_end) = if inline {
                // All on one line: ```{"name": "a"}```.
                ("", after..label_end, label_end + FENCE.len())
            } else {
                let body_start = (label_end + 1).min(gap.end);
                match reply[body_start..gap.end].find(FENCE) {
                    Some(close) => (
                        label_line.trim(),
                        body_start..body_start + close,
                        body_start + close + FENCE.len(),
                    ),
                    None => (label_line.trim(), body_start..gap.end, gap.end),
                }
            };
            let language = language.to_ascii_lowercase();
            // A label that is really the start of the body: ```{"name": …}
            let (language, body) = if language.starts_with(['{', '[']) {
                (String::new(), after..body.end)
            } else {
                (language, body)
            };
            if CALL_LANGUAGES.contains(&language.as_str()) {
                let insist = CALL_LABELS.contains(&language.as_str());
                if let Some(outcome) = read_block(reply, body, insist) {
                    found.push(Found {
                        span: at..span_end,
                        outcome,
                    });
                }
            }
            pos = span_end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_tool_calls;

    #[test]
    fn reads_fenced_calls() {
        let cases: Vec<(&str, Vec<&str>, &str, Option<&str>)> = vec![
            (
                "```json\n{\"name\": \"a\", \"arguments\": {}}\n```",
                vec!["a"],
                "",
                None,
            ),
            (
                "Here:\n```\n{\"name\": \"a\"}\n```\nDone.",
                vec!["a"],
                "Here:\nDone.",
                None,
            ),
            (
                "```JSON\n[{\"name\": \"a\"}, {\"name\": \"b\"}]\n```",
                vec!["a", "b"],
                "",
                None,
            ),
            ("```{\"name\": \"a\"}```", vec!["a"], "", None),
            (
                "```json\n{\"name\": \"a\", \"arguments\": {\"q\": 1}",
                vec!["a"],
                "",
                None,
            ),
            (
                "```tool_code\nsearch(query=\"tents\")\n```",
                vec!["search"],
                "",
                None,
            ),
            (
                "```python\nsearch(query=\"tents\")\nget_cart()\n```",
                vec!["search", "get_cart"],
                "",
                None,
            ),
            (
                "```json\n{\"answer\": 42}\n```",
                vec![],
                "```json\n{\"answer\": 42}\n```",
                None,
            ),
            (
                "```python\nimport os\nprint(os.getcwd())\n```",
                vec![],
                "```python\nimport os\nprint(os.getcwd())\n```",
                None,
            ),
            (
                "```json\n{\"name\": \"a\", \"arguments\": {\"q\" 1}}\n```\nok",
                vec![],
                "ok",
                Some("the call is not valid JSON: expected ':' after \"q\""),
            ),
            (
                "```tool_call\nplease search\n```",
                vec![],
                "",
                Some("the tool call must be a JSON object"),
            ),
            ("```", vec![], "```", None),
            (
                // A fence that is not only calls stays prose; the call in it
                // is still found, as bare JSON.
                "```json\n{\"name\": \"a\"}\nThis calls a.\n```",
                vec!["a"],
                "```json\nThis calls a.\n```",
                None,
            ),
        ];
        for (reply, names, text, malformed) in cases {
            let parsed = parse_tool_calls(reply);
            let got: Vec<&str> = parsed.calls.iter().map(|c| c.name.as_str()).collect();
            assert_eq!(got, names, "{reply:?}");
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
