//! Many tool sources behind one [`ToolHost`], with the host's policies.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use wma_agent::{
    ArgsError, PageContext, ToolDefinition, ToolError, ToolErrorCode, ToolHost, validate_args,
};

/// Time limit of one call unless [`SourceOptions::call_timeout`] says otherwise.
pub const DEFAULT_SOURCE_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest result, in characters, unless [`SourceOptions::max_result_chars`]
/// says otherwise. A small model's whole context is a few thousand tokens;
/// a result far past that is a tool gone wrong, not an answer.
pub const DEFAULT_MAX_RESULT_CHARS: usize = 32_000;

/// Time limit of one source's listing: a source that hangs must not take
/// the other sources' tools with it.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(15);

/// What happens when two sources offer a tool with the same name.
///
/// Either way the outcome depends only on the order the sources were added
/// in, never on which source answered first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameClash {
    /// The source added first keeps the name; the later tool is not offered.
    #[default]
    FirstWins,
    /// The source added first keeps the name; the later tool is offered as
    /// `<source>_<tool>`, which is called under its original name.
    Qualify,
}

/// A source's policy in a [`ToolSet`].
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// When set, only tools matching one of these patterns are offered.
    /// A pattern is a name, or a name with `*` for any run of characters
    /// (`get_*`, `*_file`). Default: every tool.
    pub allow: Option<Vec<String>>,
    /// Tools matching one of these patterns are never offered or called;
    /// deny wins over allow. Default: none.
    pub deny: Vec<String>,
    /// Limit of one call. Default: [`DEFAULT_SOURCE_CALL_TIMEOUT`].
    pub call_timeout: Duration,
    /// Largest result in characters; a longer one is refused with
    /// `denied`. Default: [`DEFAULT_MAX_RESULT_CHARS`].
    pub max_result_chars: usize,
    /// Marks every tool of the source as returning untrusted content, so
    /// the prompt tells the model its results are data, whatever the
    /// source's own annotations say. Default: false (the source's own
    /// annotations decide).
    pub untrusted: bool,
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            allow: None,
            deny: Vec::new(),
            call_timeout: DEFAULT_SOURCE_CALL_TIMEOUT,
            max_result_chars: DEFAULT_MAX_RESULT_CHARS,
            untrusted: false,
        }
    }
}

impl SourceOptions {
    /// Offers only the tools matching these patterns.
    pub fn allow<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allow = Some(patterns.into_iter().map(Into::into).collect());
        self
    }

    /// Never offers or calls the tools matching these patterns.
    pub fn deny<I, S>(mut self, patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.deny = patterns.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the per-call time limit.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets the largest result, in characters.
    pub fn max_result_chars(mut self, chars: usize) -> Self {
        self.max_result_chars = chars;
        self
    }

    /// Marks every tool of the source as returning untrusted content.
    pub fn untrusted(mut self, untrusted: bool) -> Self {
        self.untrusted = untrusted;
        self
    }

    /// Whether the policy lets `tool` through.
    pub fn permits(&self, tool: &str) -> bool {
        let allowed = self
            .allow
            .as_ref()
            .is_none_or(|patterns| patterns.iter().any(|p| matches_pattern(p, tool)));
        allowed && !self.deny.iter().any(|p| matches_pattern(p, tool))
    }
}

/// `*` matches any run of characters; everything else matches itself.
fn matches_pattern(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*` at all: the whole name must match.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

struct Source {
    name: String,
    host: Arc<dyn ToolHost>,
    options: SourceOptions,
}

/// Where a name offered to the model leads.
#[derive(Clone)]
struct Route {
    source: usize,
    /// The name the source knows the tool by.
    tool: String,
    /// The definition as offered (for validation).
    definition: ToolDefinition,
}

/// A merged listing.
#[derive(Default)]
struct Merged {
    /// What the model is offered.
    offered: Vec<ToolDefinition>,
    routes: HashMap<String, Route>,
    /// Tools a source has but its policy hides, with that source's index:
    /// calling one is a policy refusal, not a mistyped name.
    hidden: HashMap<String, usize>,
}

/// Tool sources merged into one [`ToolHost`]: WebMCP pages, MCP servers and
/// Rust functions side by side, under the host's policies.
///
/// - **Name clashes** are settled by the order sources were added
///   ([`NameClash`]), never by timing.
/// - **Allow and deny lists** per source ([`SourceOptions::allow`],
///   [`SourceOptions::deny`]): a tool that is not permitted is not offered,
///   and calling it anyway answers `denied`.
/// - **Arguments are validated** against the tool's schema before the call
///   reaches its source (WebMCP pages and most servers do not validate).
/// - **Per-call timeouts** per source; cancellation is passed on.
/// - **Result size limits** per source: a longer result answers `denied`.
/// - **Untrusted content**: a source marked untrusted has all its tools
///   annotated so, and the loop's prompt then tells the model that their
///   results are data, not instructions.
/// - **Panics** of a source are contained: the call answers `unavailable`.
///
/// The page context comes from the first source that has one.
pub struct ToolSet {
    sources: Vec<Source>,
    clash: NameClash,
    /// The newest listing; a call to a name not in it lists again.
    listing: Mutex<Merged>,
}

impl Default for ToolSet {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSet")
            .field(
                "sources",
                &self.sources.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .field("clash", &self.clash)
            .finish_non_exhaustive()
    }
}

impl ToolSet {
    /// An empty set; name clashes go to the source added first.
    pub fn new() -> Self {
        Self {
            sources: Vec::new(),
            clash: NameClash::default(),
            listing: Mutex::new(Merged::default()),
        }
    }

    /// Sets how name clashes are settled.
    pub fn with_name_clash(mut self, clash: NameClash) -> Self {
        self.clash = clash;
        self
    }

    /// Adds a source with the default policy.
    pub fn add<H: ToolHost + 'static>(&mut self, name: impl Into<String>, host: H) -> &mut Self {
        self.add_with(name, host, SourceOptions::default())
    }

    /// Adds a source with its policy. Sources added earlier win name clashes.
    pub fn add_with<H: ToolHost + 'static>(
        &mut self,
        name: impl Into<String>,
        host: H,
        options: SourceOptions,
    ) -> &mut Self {
        self.add_shared(name, Arc::new(host), options)
    }

    /// Adds a source that is shared with other owners.
    pub fn add_shared(
        &mut self,
        name: impl Into<String>,
        host: Arc<dyn ToolHost>,
        options: SourceOptions,
    ) -> &mut Self {
        self.sources.push(Source {
            name: name.into(),
            host,
            options,
        });
        self
    }

    /// The number of sources.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Whether there are no sources.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The source that offers `tool` (as of the newest listing).
    pub fn source_of(&self, tool: &str) -> Option<&str> {
        let listing = self.listing.lock().unwrap_or_else(|e| e.into_inner());
        listing
            .routes
            .get(tool)
            .map(|route| self.sources[route.source].name.as_str())
    }

    /// Lists every source (at once, each within [`LIST_TIMEOUT`]) and merges.
    async fn merged(&self) -> Merged {
        let listings = futures::future::join_all(self.sources.iter().map(|source| async move {
            let listing = AssertUnwindSafe(source.host.list_tools()).catch_unwind();
            match tokio::time::timeout(LIST_TIMEOUT, listing).await {
                Ok(Ok(tools)) => tools,
                Ok(Err(_)) => {
                    tracing::error!(source = %source.name, "a tool source panicked while listing its tools");
                    Vec::new()
                }
                Err(_) => {
                    tracing::warn!(source = %source.name, "a tool source did not list its tools in time");
                    Vec::new()
                }
            }
        }))
        .await;
        let mut offered = Vec::new();
        let mut routes: HashMap<String, Route> = HashMap::new();
        let mut hidden = HashMap::new();
        // Names of the later sources' tools clash only with earlier
        // sources' own names, so qualified names are decided in a second
        // pass, after every source's plain names are known.
        let mut clashing = Vec::new();
        for (index, (source, listing)) in self.sources.iter().zip(listings).enumerate() {
            for mut definition in listing {
                if !source.options.permits(&definition.name) {
                    hidden.entry(definition.name).or_insert(index);
                    continue;
                }
                if source.options.untrusted {
                    definition.annotations.untrusted_content = true;
                }
                if let Some(existing) = routes.get(&definition.name) {
                    if existing.source != index {
                        tracing::debug!(
                            tool = %definition.name,
                            kept = %self.sources[existing.source].name,
                            other = %source.name,
                            "two tool sources offer the same name; the one added first keeps it"
                        );
                        clashing.push((index, definition));
                    }
                    continue;
                }
                routes.insert(
                    definition.name.clone(),
                    Route {
                        source: index,
                        tool: definition.name.clone(),
                        definition: definition.clone(),
                    },
                );
                offered.push(definition);
            }
        }
        if self.clash == NameClash::Qualify {
            for (index, mut definition) in clashing {
                let qualified = format!("{}_{}", self.sources[index].name, definition.name);
                if routes.contains_key(&qualified) {
                    continue;
                }
                let tool = std::mem::replace(&mut definition.name, qualified.clone());
                routes.insert(
                    qualified,
                    Route {
                        source: index,
                        tool,
                        definition: definition.clone(),
                    },
                );
                offered.push(definition);
            }
        }
        Merged {
            offered,
            routes,
            hidden,
        }
    }
}

#[async_trait]
impl ToolHost for ToolSet {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        let merged = self.merged().await;
        let tools = merged.offered.clone();
        *self.listing.lock().unwrap_or_else(|e| e.into_inner()) = merged;
        tools
    }

    async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let known = self
            .listing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .routes
            .get(name)
            .cloned();
        let route = match known {
            Some(route) => route,
            None => {
                // Not in the newest listing: the tool may have just appeared
                // (a page navigated), or the caller did not list first.
                let mut merged = self.merged().await;
                match merged.routes.remove(name) {
                    Some(route) => route,
                    None => {
                        if let Some(&source) = merged.hidden.get(name) {
                            return Err(ToolError::new(
                                ToolErrorCode::Denied,
                                format!(
                                    "the host does not allow the tool \"{name}\" of {}",
                                    self.sources[source].name
                                ),
                            ));
                        }
                        return Err(ToolError::new(
                            ToolErrorCode::UnknownTool,
                            format!("no tool named \"{name}\""),
                        ));
                    }
                }
            }
        };
        let source = &self.sources[route.source];
        match validate_args(&route.definition.input_schema, &arguments) {
            Ok(()) => {}
            Err(ArgsError::Invalid(message)) => {
                return Err(ToolError::new(ToolErrorCode::InvalidArguments, message));
            }
            Err(error) => {
                return Err(ToolError::new(
                    ToolErrorCode::Unavailable,
                    format!("{name}: {error}"),
                ));
            }
        }
        let timeout = source.options.call_timeout;
        let run = AssertUnwindSafe(
            source
                .host
                .call_tool(&route.tool, arguments, cancel.clone()),
        )
        .catch_unwind();
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(ToolError::new(ToolErrorCode::Cancelled, "the call was cancelled")),
            outcome = tokio::time::timeout(timeout, run) => match outcome {
                Err(_) => Err(ToolError::new(
                    ToolErrorCode::Timeout,
                    format!("{name} did not answer within {} s", timeout.as_secs_f32()),
                )),
                Ok(Err(_)) => {
                    tracing::error!(source = %source.name, tool = name, "a tool source panicked");
                    Err(ToolError::new(
                        ToolErrorCode::Unavailable,
                        format!("the tool source {} crashed while running {name}", source.name),
                    ))
                }
                Ok(Ok(result)) => result,
            },
        };
        let text = result?;
        let chars = text.chars().count();
        if chars > source.options.max_result_chars {
            return Err(ToolError::new(
                ToolErrorCode::Denied,
                format!(
                    "the result of {name} has {chars} characters, more than the {} this host accepts",
                    source.options.max_result_chars
                ),
            ));
        }
        Ok(text)
    }

    async fn page_context(&self) -> Option<PageContext> {
        for source in &self.sources {
            let context = AssertUnwindSafe(source.host.page_context()).catch_unwind();
            if let Ok(Ok(Some(context))) = tokio::time::timeout(LIST_TIMEOUT, context).await {
                return Some(context);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_names_and_stars() {
        assert!(matches_pattern("echo", "echo"));
        assert!(!matches_pattern("echo", "echoes"));
        assert!(matches_pattern("get_*", "get_sum"));
        assert!(!matches_pattern("get_*", "set_sum"));
        assert!(matches_pattern("*_file", "read_file"));
        assert!(matches_pattern("*", "anything"));
        assert!(matches_pattern("a*b*c", "aXXbYYc"));
        assert!(!matches_pattern("a*b*c", "aXXcYYb"));
        assert!(!matches_pattern("ab*ba", "aba"));
    }

    #[test]
    fn deny_wins_over_allow() {
        let options = SourceOptions::default()
            .allow(["get_*", "echo"])
            .deny(["get_env"]);
        assert!(options.permits("get_sum"));
        assert!(options.permits("echo"));
        assert!(!options.permits("get_env"));
        assert!(!options.permits("write_file"));
    }
}
