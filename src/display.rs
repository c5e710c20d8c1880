//! Printing stream parts the way a person wants to read them.
//!
//! Everything a part carries comes from a model, a tool, a page or a
//! sub-agent, and is data: [`terminal_safe`] makes its control characters
//! visible before a terminal sees them, so that no result can move the
//! cursor, erase lines, set the clipboard (`OSC 52`), hide text or reorder
//! it (bidi overrides), and a content's own lines are marked as the
//! continuation of the part they belong to. A line that starts at the left
//! edge (`✓ approved`, a question) is always the host's own.

use std::fmt::Write as _;

use wma_agent::AgentStreamPart;

/// What starts each line of a part's content after its first: content can
/// break lines, but a line it breaks cannot pass for one of the host's.
pub const CONTINUATION: &str = "  ┆ ";

/// Whether `c` is shown as an escape instead of itself: the C0 controls
/// (but tab), DEL, the C1 controls (an 8-bit `CSI` is `U+009B`), the
/// Unicode line and paragraph separators, and the bidirectional formatting
/// characters (which make text read in an order other than its own).
fn is_hidden_control(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{a}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}'
        | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` as a terminal may show it: each control or bidi character
/// written out as an escape (`\x1b`, `\u{202e}`), each line break as a
/// line break followed by [`CONTINUATION`].
pub fn terminal_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => {
                out.push('\n');
                out.push_str(CONTINUATION);
            }
            c if is_hidden_control(c) => {
                let code = u32::from(c);
                if code < 0x100 {
                    let _ = write!(out, "\\x{code:02x}");
                } else {
                    let _ = write!(out, "\\u{{{code:x}}}");
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// `value` as one JSON line that is as safe on a terminal as
/// [`terminal_safe`] text: serde escapes the C0 controls, and the C1
/// controls and the bidi and line-separator characters, which JSON allows
/// as they are, are written as `\uXXXX` escapes too. Those characters can
/// only stand inside JSON strings, where the escape means the same
/// character: a program reading the line gets the same value.
pub fn json_line<T: serde::Serialize>(value: &T) -> serde_json::Result<String> {
    let text = serde_json::to_string(value)?;
    if !text.chars().any(is_hidden_control) {
        return Ok(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_hidden_control(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// One part as a line (or a few) of text for a terminal. Message starts become
/// step headers, calls show their arguments, results are cut to a readable
/// length. What the part carries goes through [`terminal_safe`].
pub fn render_part(part: &AgentStreamPart) -> String {
    const RESULT_CHARS: usize = 400;
    let safe = terminal_safe;
    match part {
        AgentStreamPart::MessageStart { step } => format!("── step {step} ──"),
        AgentStreamPart::Text { text } => format!("assistant: {}", safe(text)),
        AgentStreamPart::ToolCall {
            name, arguments, ..
        } => format!("→ {} {}", safe(name), safe(&arguments.to_string())),
        AgentStreamPart::ToolResult { name, output, .. } => format!(
            "← {}: {}",
            safe(name),
            safe(&wma_agent::prompt::truncate_chars(output, RESULT_CHARS))
        ),
        AgentStreamPart::ToolError { name, error, .. } => {
            format!("✗ {}: {}", safe(name), safe(&error.to_string()))
        }
        AgentStreamPart::ApprovalRequested {
            name,
            arguments,
            reason,
            ..
        } => format!(
            "? {} {} waits for approval: {}",
            safe(name),
            safe(&arguments.to_string()),
            safe(reason)
        ),
        AgentStreamPart::ApprovalDecided {
            name, approved, by, ..
        } => format!(
            "{} {} ({})",
            if *approved {
                "✓ approved"
            } else {
                "✗ denied"
            },
            safe(name),
            safe(by)
        ),
        AgentStreamPart::Rule { rule, detail } => format!("· {}: {}", safe(rule), safe(detail)),
        AgentStreamPart::Finish { reason } => format!("[finished: {}]", reason.as_str()),
        AgentStreamPart::Error { message } => format!("[error] {}", safe(message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_escapes_and_bidi_overrides_are_made_visible() {
        let hostile =
            "ok\u{1b}[2K\u{1b}[1A\r✓ approved\u{1b}]52;c;aGk=\u{7}\u{1b}[8m\u{9b}2J\u{202e}cba";
        let shown = terminal_safe(hostile);
        assert_eq!(
            shown,
            "ok\\x1b[2K\\x1b[1A\\x0d✓ approved\\x1b]52;c;aGk=\\x07\\x1b[8m\\x9b2J\\u{202e}cba"
        );
        assert!(!shown.chars().any(is_hidden_control), "{shown:?}");
        // A line the content breaks is marked as its own.
        assert_eq!(
            terminal_safe("done\n✓ approved delete_everything (person)"),
            "done\n  ┆ ✓ approved delete_everything (person)"
        );
        assert_eq!(terminal_safe("tab\tand ünïcode"), "tab\tand ünïcode");
    }

    #[test]
    fn json_lines_escape_what_a_terminal_would_obey_and_keep_the_value() {
        let part = AgentStreamPart::Text {
            text: "a\u{9b}2J\u{202e}b\u{2028}c\u{1b}[2K é".into(),
        };
        let line = json_line(&part).unwrap();
        assert!(!line.chars().any(is_hidden_control), "{line}");
        assert!(
            line.contains("\\u009b") && line.contains("\\u202e"),
            "{line}"
        );
        let back: AgentStreamPart = serde_json::from_str(&line).unwrap();
        assert_eq!(back, part);
    }

    #[test]
    fn every_field_a_part_shows_goes_through_it() {
        let evil = "\u{1b}]52;c;cm0gLXJmIH4=\u{7}\u{1b}[2K\u{202e}";
        let parts = [
            AgentStreamPart::Text { text: evil.into() },
            AgentStreamPart::ToolResult {
                call_id: "c".into(),
                name: evil.into(),
                output: evil.into(),
            },
            AgentStreamPart::ToolCall {
                call_id: "c".into(),
                name: evil.into(),
                arguments: serde_json::json!({ "k": evil }),
            },
            AgentStreamPart::ApprovalRequested {
                approval_id: "a".into(),
                call_id: "c".into(),
                name: evil.into(),
                arguments: serde_json::json!({ "k": evil }),
                reason: evil.into(),
            },
            AgentStreamPart::Rule {
                rule: evil.into(),
                detail: evil.into(),
            },
            AgentStreamPart::Error {
                message: evil.into(),
            },
        ];
        for part in &parts {
            let line = render_part(part);
            assert!(!line.chars().any(is_hidden_control), "{line:?}");
        }
    }
}
