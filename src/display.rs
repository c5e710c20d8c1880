//! Printing stream parts the way a person wants to read them.

use wma_agent::AgentStreamPart;

/// One part as a line (or a few) of text for a terminal. Message starts become
/// step headers, calls show their arguments, results are cut to a readable
/// length.
pub fn render_part(part: &AgentStreamPart) -> String {
    const RESULT_CHARS: usize = 400;
    match part {
        AgentStreamPart::MessageStart { step } => format!("── step {step} ──"),
        AgentStreamPart::Text { text } => format!("assistant: {text}"),
        AgentStreamPart::ToolCall {
            name, arguments, ..
        } => format!("→ {name} {arguments}"),
        AgentStreamPart::ToolResult { name, output, .. } => format!(
            "← {name}: {}",
            wma_agent::truncate_chars(output, RESULT_CHARS)
        ),
        AgentStreamPart::ToolError { name, error, .. } => format!("✗ {name}: {error}"),
        AgentStreamPart::ApprovalRequested {
            name,
            arguments,
            reason,
            ..
        } => format!("? {name} {arguments} waits for approval: {reason}"),
        AgentStreamPart::ApprovalDecided {
            name, approved, by, ..
        } => format!(
            "{} {name} ({by})",
            if *approved {
                "✓ approved"
            } else {
                "✗ denied"
            }
        ),
        AgentStreamPart::Rule { rule, detail } => format!("· {rule}: {detail}"),
        AgentStreamPart::Finish { reason } => format!("[finished: {}]", reason.as_str()),
        AgentStreamPart::Error { message } => format!("[error] {message}"),
    }
}
