//! Tool definitions, the page context and the agent profile a page or host gives.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Hints about a tool, as WebMCP and MCP annotate them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ToolAnnotations {
    /// The tool only reads; calling it twice changes nothing.
    pub read_only: bool,
    /// The tool's output comes from a source the host does not trust (a web
    /// page, a third-party server). The prompt tells the model it is data.
    pub untrusted_content: bool,
    /// The tool has effects the person would want to know about (an order, a payment).
    pub consequential: bool,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolDefinition {
    /// Unique name; what the model writes in a call.
    pub name: String,
    /// What the tool does, for the model and for ranking.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments object.
    #[serde(default = "empty_object_schema")]
    pub input_schema: Value,
    /// Hints such as read-only.
    #[serde(default)]
    pub annotations: ToolAnnotations,
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

impl ToolDefinition {
    /// A tool with a name, a description and an input schema.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            input_schema,
            annotations: ToolAnnotations::default(),
        }
    }

    /// The same tool with the given annotations.
    pub fn with_annotations(mut self, annotations: ToolAnnotations) -> Self {
        self.annotations = annotations;
        self
    }
}

/// Where the person is, when the tools belong to a web page.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageContext {
    /// The page's path (`/products/p-17`).
    pub path: String,
    /// The document title.
    pub title: String,
    /// The text of the page's main `h1`, when it has one.
    pub h1: Option<String>,
}

/// A sub-agent the parent may delegate to, as its profile names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubAgentInfo {
    /// The sub-agent's name; it is also the name of the tool that delegates to it.
    pub name: String,
    /// What it is good at, shown to the parent model.
    pub description: String,
}

/// The agent a page or host describes: limits and instructions that win over
/// the loop's options, and the sub-agents it may delegate to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentProfile {
    /// A name for traces and tagged parts.
    pub name: Option<String>,
    /// Model steps per user message; wins over [`crate::LocalLoopOptions::max_steps`].
    pub max_steps: Option<u32>,
    /// What the site is and how its tools fit together; wins over the loop's instructions.
    pub instructions: Option<String>,
    /// Sub-agents reachable as tools.
    #[serde(default)]
    pub sub_agents: Vec<SubAgentInfo>,
    /// The run was handed its task by a parent agent (a delegation), not by
    /// a person.
    #[serde(default)]
    pub delegated: bool,
}

/// Whether an argument or result key names an identifier: `id`, `ID`,
/// `…_id`, `…Id`, `…-id`, and the plural forms (`ids`, `…_ids`, `…Ids`).
pub fn is_identifier_key(key: &str) -> bool {
    let stem = key
        .strip_suffix('s')
        .filter(|s| s.ends_with("id") || s.ends_with("Id") || s.ends_with("ID"))
        .unwrap_or(key);
    if stem.eq_ignore_ascii_case("id") {
        return true;
    }
    let lower = stem.to_ascii_lowercase();
    if lower.ends_with("_id") || lower.ends_with("-id") {
        return true;
    }
    // camelCase: `productId`, `userID`, but not `paid` or `valid`.
    (stem.ends_with("Id") || stem.ends_with("ID"))
        && stem.len() > 2
        && stem[..stem.len() - 2]
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}
