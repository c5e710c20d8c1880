//! Many tool sources behind one [`ToolHost`], with the host's policies.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use parking_lot::Mutex;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use wma_agent::{
    ArgsError, CallContext, PageContext, ToolDefinition, ToolError, ToolErrorCode, ToolHost,
    validate_args,
};

use crate::health::{Monitored, RestartBudget, SourceHealth, SourceState};

/// Time limit of one tool call unless [`SourceOptions::call_timeout`] says
/// otherwise: the one default of the workspace (the runtime's tool bridge,
/// a config's sources and a WebMCP page's own limit all start from it), so
/// that a tool's limit does not depend on which way it was hosted.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest result, in characters, unless [`SourceOptions::max_result_chars`]
/// says otherwise. A small model's whole context is a few thousand tokens;
/// a result far past that is a tool gone wrong, not an answer.
pub const DEFAULT_MAX_RESULT_CHARS: usize = 32_000;

/// Time limit of one source's listing: a source that hangs must not take
/// the other sources' tools with it.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a call that ran out of time (or was cancelled) is given to
/// hear its cancellation, so a page can cancel the invocation and a server
/// be told, before the caller gets its answer. A caller that waits on a
/// set from elsewhere (the runtime's handle on its tool bridge) waits this
/// much past the call's limit, so the set's precise error wins.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// Longest tool name, in characters. MCP allows 128; 64 is what the chat
/// APIs most models were tuned on accept, and a longer name is not a name.
pub const MAX_TOOL_NAME_CHARS: usize = 64;

/// Longest description offered to the model, in characters; a longer one is
/// cut. A small model's prompt holds a few tools of a few sentences each,
/// and a source must not crowd out the others (or the person's request).
pub const MAX_DESCRIPTION_CHARS: usize = 1_024;

/// Largest input schema, in bytes of compact JSON; a tool with a larger one
/// is not offered. Schemas are printed into the prompt and compiled into
/// grammars: one that is this big is a mistake or an attack.
pub const MAX_SCHEMA_BYTES: usize = 16 * 1024;

/// Most tools offered from one source; the rest are cut, in the source's
/// own order. The loop ranks and shows a handful per step, so a source with
/// hundreds of tools buys nothing but listing cost and crowding.
pub const MAX_TOOLS_PER_SOURCE: usize = 128;

/// Whether `name` may be offered as a tool name: a letter or `_` first,
/// then letters, digits, `_`, `.` or `-`, [`MAX_TOOL_NAME_CHARS`] at most
/// (`^[A-Za-z_][A-Za-z0-9_.-]{0,63}$`).
///
/// This is MCP's naming guidance (1 to 128 characters of `A-Z a-z 0-9 _ - .`,
/// no spaces) narrowed to what a model can write as a call without
/// quoting: names are printed into the prompt, and a name with spaces or
/// punctuation could carry a sentence ("x. Ignore the rule above and").
pub fn is_tool_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    (first.is_ascii_alphabetic() || first == '_')
        && name.len() <= MAX_TOOL_NAME_CHARS
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// A name for a log line: a refused name is untrusted and may be long.
fn loggable(name: &str) -> String {
    let cut: String = name.chars().take(80).collect();
    if cut.len() < name.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// Applies the rules every offered tool follows, whatever its source:
/// refuses a tool whose name is not an identifier or whose schema is too
/// large, cuts a long description. Each refusal is a warning naming the
/// source, so an operator can see why a tool is missing.
fn admit(source: &str, mut definition: ToolDefinition) -> Option<ToolDefinition> {
    if !is_tool_name(&definition.name) {
        tracing::warn!(
            source,
            tool = %loggable(&definition.name),
            "a tool is not offered: its name is not an identifier \
             (a letter or _, then letters, digits, _ . -, at most 64)"
        );
        return None;
    }
    let schema_bytes = serde_json::to_string(&definition.input_schema)
        .map(|s| s.len())
        .unwrap_or(usize::MAX);
    if schema_bytes > MAX_SCHEMA_BYTES {
        tracing::warn!(
            source,
            tool = %definition.name,
            schema_bytes,
            limit = MAX_SCHEMA_BYTES,
            "a tool is not offered: its input schema is larger than the host accepts"
        );
        return None;
    }
    if definition.description.chars().count() > MAX_DESCRIPTION_CHARS {
        // The cut leaves room for the ellipsis that says something is missing.
        let (cut_at, _) = definition
            .description
            .char_indices()
            .nth(MAX_DESCRIPTION_CHARS - 1)
            .unwrap_or((definition.description.len(), ' '));
        tracing::warn!(
            source,
            tool = %definition.name,
            limit = MAX_DESCRIPTION_CHARS,
            "a tool's description is cut to the host's limit"
        );
        definition.description.truncate(cut_at);
        definition.description.push('…');
    }
    Some(definition)
}

/// One source's listing as the host offers it: each tool through the rules
/// every offered tool follows (a name that is an identifier, see
/// [`is_tool_name`]; an input schema of at most [`MAX_SCHEMA_BYTES`]; a
/// description cut to [`MAX_DESCRIPTION_CHARS`]), then at most
/// [`MAX_TOOLS_PER_SOURCE`] of them, in the source's order. Each refusal
/// and cut is a warning that names `source`.
///
/// A [`ToolSet`] applies it to each of its sources; anything else that
/// merges raw [`ToolHost`]s for a model (the runtime's tool bridge) applies
/// it too, so a tool reaches a model only through these rules. They are
/// idempotent: a listing that went through them once passes unchanged.
pub fn admit_tools(source: &str, tools: Vec<ToolDefinition>) -> Vec<ToolDefinition> {
    let offered = tools.len();
    let mut admitted: Vec<ToolDefinition> = tools
        .into_iter()
        .filter_map(|definition| admit(source, definition))
        .collect();
    if admitted.len() > MAX_TOOLS_PER_SOURCE {
        tracing::warn!(
            source,
            offered,
            limit = MAX_TOOLS_PER_SOURCE,
            "a tool source offers more tools than the host accepts; the rest are cut"
        );
        admitted.truncate(MAX_TOOLS_PER_SOURCE);
    }
    admitted
}

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
    /// Limit of one call. Default: [`DEFAULT_CALL_TIMEOUT`].
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
            call_timeout: DEFAULT_CALL_TIMEOUT,
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

type Build = dyn Fn() -> Current + Send + Sync;

/// The host a source serves through right now, and what reports on it.
#[derive(Clone)]
struct Current {
    host: Arc<dyn ToolHost>,
    monitor: Option<Arc<dyn Monitored>>,
}

struct Source {
    name: String,
    current: Mutex<Current>,
    /// How to make the host afresh, for a source added with
    /// [`ToolSet::add_built`]: a panic may leave a host broken, so the set
    /// replaces it.
    build: Option<Arc<Build>>,
    budget: RestartBudget,
    /// Set when a panic found the restart budget spent: the source serves
    /// nothing until the budget allows a new host.
    gave_up: Mutex<Option<String>>,
    panics: AtomicU32,
    /// Hosts made afresh by the set.
    rebuilds: AtomicU32,
    /// Restarts the replaced hosts had reported, so a rebuild does not
    /// reset the count.
    earlier_restarts: AtomicU32,
    options: SourceOptions,
}

impl Source {
    fn current(&self) -> Current {
        self.current.lock().clone()
    }

    /// The host to use, or why there is none: a source given up on stays
    /// so until its budget allows another host.
    fn host(&self) -> Result<Arc<dyn ToolHost>, String> {
        let mut gave_up = self.gave_up.lock();
        if let Some(reason) = gave_up.clone() {
            if self.budget.spent() {
                return Err(reason);
            }
            // The window has passed: a fresh host, counted like any restart.
            *gave_up = None;
            drop(gave_up);
            if self
                .budget
                .take(&format!("the tool source `{}`", self.name))
                .is_ok()
            {
                self.rebuild();
            }
        }
        Ok(self.current().host)
    }

    /// Notes a panic and, for a source the set can make, replaces its host
    /// within the budget. Returns what became of the source, for the
    /// caller's error message.
    fn panicked(&self, while_doing: &str, reason: &str) -> &'static str {
        self.panics.fetch_add(1, Ordering::SeqCst);
        tracing::error!(source = %self.name, %reason, "a tool source panicked while {while_doing}");
        if self.build.is_none() {
            return "";
        }
        match self
            .budget
            .take(&format!("the tool source `{}`", self.name))
        {
            Ok(()) => {
                self.rebuild();
                "; it is being made afresh, so the call may be tried again"
            }
            Err(refusal) => {
                tracing::warn!(source = %self.name, "{refusal}");
                *self.gave_up.lock() = Some(format!("{refusal}; last failure: a panic ({reason})"));
                "; it crashed more often than its restart budget allows and is not used for now"
            }
        }
    }

    fn rebuild(&self) {
        let Some(build) = &self.build else {
            return;
        };
        let fresh = build();
        let old = std::mem::replace(&mut *self.current.lock(), fresh);
        if let Some(monitor) = old.monitor {
            self.earlier_restarts
                .fetch_add(monitor.status().restarts, Ordering::SeqCst);
        }
        self.rebuilds.fetch_add(1, Ordering::SeqCst);
        tracing::warn!(source = %self.name, "the tool source is made afresh");
    }

    fn health(&self) -> SourceHealth {
        let current = self.current();
        let status = current.monitor.as_ref().map(|m| m.status());
        let gave_up = self.gave_up.lock().clone();
        let state = match (gave_up, &status) {
            (Some(reason), _) => SourceState::GaveUp { reason },
            (None, Some(status)) => status.state.clone(),
            (None, None) => SourceState::Ready,
        };
        SourceHealth {
            source: self.name.clone(),
            state,
            restarts: self.rebuilds.load(Ordering::SeqCst)
                + self.earlier_restarts.load(Ordering::SeqCst)
                + status.map_or(0, |s| s.restarts),
            panics: self.panics.load(Ordering::SeqCst),
        }
    }
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
/// - **What may be offered**: a tool whose name is not an identifier
///   ([`is_tool_name`]) or whose schema is larger than [`MAX_SCHEMA_BYTES`]
///   is refused with a warning naming its source; a description longer than
///   [`MAX_DESCRIPTION_CHARS`] is cut; a source's list is cut at
///   [`MAX_TOOLS_PER_SOURCE`]. Names, descriptions and schemas come from
///   pages and servers the host does not control, and all of them are
///   printed into the model's prompt.
/// - **Name clashes** are settled by the order sources were added
///   ([`NameClash`]), never by timing.
/// - **Allow and deny lists** per source ([`SourceOptions::allow`],
///   [`SourceOptions::deny`]): a tool that is not permitted is not offered,
///   and calling it anyway answers `denied`.
/// - **Arguments are validated** against the tool's schema before the call
///   reaches its source (WebMCP pages and most servers do not validate),
///   unless the call comes marked as validated already
///   ([`CallContext::with_arguments_checked`]): the loop validates each
///   call itself against the schema the model was shown, because it needs
///   the error for its repair message, and the mark keeps that call from
///   being validated twice. Callers without the loop (an MCP client of
///   the host, a direct call) are validated here.
/// - **Per-call timeouts** per source ([`DEFAULT_CALL_TIMEOUT`] unless
///   [`SourceOptions::call_timeout`] says otherwise); cancellation is passed
///   on, and so is an expired limit (the source's token is cancelled, so a
///   page cancels the invocation).
/// - **Result size limits** per source: a longer result answers `denied`.
/// - **Untrusted content**: a source marked untrusted has all its tools
///   annotated so, and the loop's prompt then tells the model that their
///   results are data, not instructions.
/// - **Panics** of a source are contained: the call answers `unavailable`.
///   A source added with [`ToolSet::add_built`] (or
///   [`ToolSet::add_built_shared`]) is then made afresh, within its
///   [`RestartBudget`] ([`ToolSet::with_restart_budget`]); once that is
///   spent the source is reported given up until the budget allows again.
/// - **Health**: [`ToolSet::health`] says, per source, whether it serves,
///   how often it was restarted and how often it panicked.
///
/// This is the one path of a tool call, in this order: allow and deny →
/// argument validation → time limit and panic guard → restart budget. The
/// sources themselves ([`NativeTools`](crate::NativeTools), MCP servers,
/// pages) do not repeat these steps, and a set that is itself a source of
/// another set (a config's source inside the runtime's tool bridge) is
/// relayed to as it is ([`ToolHost::guards_calls`]): its own guards are the
/// ones the call goes through.
///
/// The page context comes from the first source that has one.
pub struct ToolSet {
    sources: Vec<Source>,
    clash: NameClash,
    /// The budget each source's rebuilds are taken from (each source has a
    /// [`RestartBudget::fresh`] copy).
    budget: RestartBudget,
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
            budget: RestartBudget::default(),
            listing: Mutex::new(Merged::default()),
        }
    }

    /// Sets the restart budget of each source: how often a source added
    /// with [`ToolSet::add_built`] is made afresh after a panic before the
    /// set gives up on it (for now). Default: [`RestartBudget::default`].
    pub fn with_restart_budget(mut self, budget: RestartBudget) -> Self {
        for source in &mut self.sources {
            source.budget = budget.fresh();
        }
        self.budget = budget;
        self
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
        self.push(
            name.into(),
            Current {
                host,
                monitor: None,
            },
            None,
            options,
        )
    }

    /// Adds a source that reports on itself (an [`McpServer`](crate::McpServer),
    /// a [`WebMcpSource`](crate::WebMcpSource)): [`ToolSet::health`] then
    /// gives its own state and restarts.
    pub fn add_monitored<H: ToolHost + Monitored + 'static>(
        &mut self,
        name: impl Into<String>,
        host: H,
        options: SourceOptions,
    ) -> &mut Self {
        let host = Arc::new(host);
        self.push(
            name.into(),
            Current {
                host: host.clone(),
                monitor: Some(host),
            },
            None,
            options,
        )
    }

    /// Adds a source that the set makes with `build`, now, and again after
    /// the source panicked (a panic may leave it broken), within the set's
    /// restart budget ([`ToolSet::with_restart_budget`]; by default
    /// [`DEFAULT_MAX_RESTARTS`](crate::DEFAULT_MAX_RESTARTS) per
    /// [`DEFAULT_RESTART_WINDOW`](crate::DEFAULT_RESTART_WINDOW)).
    /// The sources of this crate restart their own process or browser when
    /// it dies; this covers what they cannot see. `build` must not block:
    /// [`McpServer::lazy`](crate::McpServer::lazy) and
    /// [`WebMcpSource::new`](crate::WebMcpSource::new) do no work until used.
    pub fn add_built<H, F>(
        &mut self,
        name: impl Into<String>,
        build: F,
        options: SourceOptions,
    ) -> &mut Self
    where
        H: ToolHost + Monitored + 'static,
        F: Fn() -> H + Send + Sync + 'static,
    {
        let build: Arc<Build> = Arc::new(move || {
            let host = Arc::new(build());
            Current {
                host: host.clone(),
                monitor: Some(host),
            }
        });
        let current = build();
        self.push(name.into(), current, Some(build), options)
    }

    /// Like [`ToolSet::add_built`], for a `build` that makes any host (one
    /// that does not report on itself): the runtime's tool bridge adds its
    /// sources so.
    pub fn add_built_shared<F>(
        &mut self,
        name: impl Into<String>,
        build: F,
        options: SourceOptions,
    ) -> &mut Self
    where
        F: Fn() -> Arc<dyn ToolHost> + Send + Sync + 'static,
    {
        let build: Arc<Build> = Arc::new(move || Current {
            host: build(),
            monitor: None,
        });
        let current = build();
        self.push(name.into(), current, Some(build), options)
    }

    fn push(
        &mut self,
        name: String,
        current: Current,
        build: Option<Arc<Build>>,
        options: SourceOptions,
    ) -> &mut Self {
        self.sources.push(Source {
            name,
            current: Mutex::new(current),
            build,
            budget: self.budget.fresh(),
            gave_up: Mutex::new(None),
            panics: AtomicU32::new(0),
            rebuilds: AtomicU32::new(0),
            earlier_restarts: AtomicU32::new(0),
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
        let listing = self.listing.lock();
        listing
            .routes
            .get(tool)
            .map(|route| self.sources[route.source].name.as_str())
    }

    /// Each source's state, restarts and panics, in the order they were
    /// added; for a health endpoint. Never waits on a source.
    pub fn health(&self) -> Vec<SourceHealth> {
        self.sources.iter().map(Source::health).collect()
    }

    /// One source's tools, within [`LIST_TIMEOUT`], through the set's rules.
    async fn listing_of(&self, source: &Source) -> Vec<ToolDefinition> {
        let host = match source.host() {
            Ok(host) => host,
            Err(reason) => {
                tracing::warn!(source = %source.name, %reason, "a tool source offers no tools");
                return Vec::new();
            }
        };
        let listing = AssertUnwindSafe(host.list_tools()).catch_unwind();
        let tools = match tokio::time::timeout(LIST_TIMEOUT, listing).await {
            Ok(Ok(tools)) => tools,
            Ok(Err(panic)) => {
                let _ = source.panicked("listing its tools", &panic_message(panic.as_ref()));
                return Vec::new();
            }
            Err(_) => {
                tracing::warn!(source = %source.name, "a tool source did not list its tools in time");
                return Vec::new();
            }
        };
        admit_tools(&source.name, tools)
    }

    /// Lists every source (at once, each within [`LIST_TIMEOUT`]) and merges.
    async fn merged(&self) -> Merged {
        let listings =
            futures::future::join_all(self.sources.iter().map(|source| self.listing_of(source)))
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
                // The source's name is the operator's, but the joined name
                // must still be one a model can write.
                if routes.contains_key(&qualified) || !is_tool_name(&qualified) {
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

/// The one validation of a call that comes without the loop: the
/// arguments against the schema the tool was offered with.
fn validate(name: &str, definition: &ToolDefinition, arguments: &Value) -> Result<(), ToolError> {
    match validate_args(&definition.input_schema, arguments) {
        Ok(()) => Ok(()),
        Err(ArgsError::Invalid(message)) => {
            Err(ToolError::new(ToolErrorCode::InvalidArguments, message))
        }
        // A tool whose own schema is broken cannot be called correctly.
        Err(error) => Err(ToolError::new(
            ToolErrorCode::Unavailable,
            format!("{name}: {error}"),
        )),
    }
}

/// The message a panic carried, when it was a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[async_trait]
impl ToolHost for ToolSet {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        let merged = self.merged().await;
        let tools = merged.offered.clone();
        *self.listing.lock() = merged;
        tools
    }

    async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        self.call_tool_with(name, arguments, &CallContext::new(), cancel)
            .await
    }

    /// The context goes to the source that answers for the tool.
    async fn call_tool_with(
        &self,
        name: &str,
        arguments: Value,
        context: &CallContext,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let known = self.listing.lock().routes.get(name).cloned();
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
        // A source that is a set itself runs the same path on its own
        // source, with that source's policy: relay the call as it is.
        let relay = source.current().host.guards_calls();
        if !relay && !context.arguments_checked() {
            validate(name, &route.definition, &arguments)?;
        }
        let host = source.host().map_err(|reason| {
            ToolError::new(
                ToolErrorCode::Unavailable,
                format!(
                    "the tool source `{}` is not available: {reason}",
                    source.name
                ),
            )
        })?;
        if relay {
            return host
                .call_tool_with(&route.tool, arguments, context, cancel)
                .await;
        }
        let timeout = source.options.call_timeout;
        // The source gets a child token, so that a call over its limit is
        // cancelled in the source too (a page cancels the invocation)
        // instead of running on unseen.
        let source_cancel = cancel.child_token();
        let run = AssertUnwindSafe(host.call_tool_with(
            &route.tool,
            arguments,
            context,
            source_cancel.clone(),
        ))
        .catch_unwind();
        tokio::pin!(run);
        let outcome = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            outcome = tokio::time::timeout(timeout, &mut run) => outcome.ok(),
        };
        let outcome = match outcome {
            Some(outcome) => outcome,
            None => {
                // Let the source hear the cancellation and clean up (bounded:
                // a source that ignores its token is not waited for).
                source_cancel.cancel();
                let _ = tokio::time::timeout(CANCEL_GRACE, &mut run).await;
                return Err(if cancel.is_cancelled() {
                    ToolError::new(ToolErrorCode::Cancelled, "the call was cancelled")
                } else {
                    ToolError::new(
                        ToolErrorCode::Timeout,
                        format!("{name} did not answer within {} s", timeout.as_secs_f32()),
                    )
                });
            }
        };
        let result = match outcome {
            Err(panic) => {
                let reason = panic_message(panic.as_ref());
                let next = source.panicked(&format!("running {name}"), &reason);
                Err(ToolError::new(
                    ToolErrorCode::Unavailable,
                    format!(
                        "the tool source `{}` crashed while running {name} ({reason}){next}",
                        source.name
                    ),
                ))
            }
            Ok(result) => result,
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

    /// Every call goes through the set's guards (see [`ToolSet`]).
    fn guards_calls(&self) -> bool {
        true
    }

    /// Every source is asked at once, so a source that takes its time (a
    /// page still loading, a server that hangs until `LIST_TIMEOUT`) does
    /// not add its wait to the others'; the first source in the set's order
    /// that knows a page answers.
    async fn page_context(&self) -> Option<PageContext> {
        let asks = self.sources.iter().map(|source| async move {
            let host = source.host().ok()?;
            let context = AssertUnwindSafe(host.page_context()).catch_unwind();
            match tokio::time::timeout(LIST_TIMEOUT, context).await {
                Ok(Ok(context)) => context,
                _ => None,
            }
        });
        // In order, so the answer is the first source's that knows a page,
        // as soon as it and those before it have answered.
        let mut answers: futures::stream::FuturesOrdered<_> = asks.collect();
        while let Some(answer) = futures::StreamExt::next(&mut answers).await {
            if answer.is_some() {
                return answer;
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

#[cfg(test)]
mod admission_tests {
    use std::sync::atomic::AtomicUsize;

    use crate::health::DEFAULT_MAX_RESTARTS;

    use serde_json::json;

    use super::*;

    /// A source that offers fixed definitions and answers every call with
    /// the tool's name, or panics when told to.
    struct Fixed {
        tools: Vec<ToolDefinition>,
        panic_on_call: bool,
    }

    impl Fixed {
        fn new(tools: Vec<ToolDefinition>) -> Self {
            Self {
                tools,
                panic_on_call: false,
            }
        }
    }

    impl Monitored for Fixed {
        fn status(&self) -> crate::SourceStatus {
            crate::SourceStatus {
                state: SourceState::Ready,
                restarts: 0,
            }
        }
    }

    #[async_trait]
    impl ToolHost for Fixed {
        async fn list_tools(&self) -> Vec<ToolDefinition> {
            self.tools.clone()
        }

        async fn call_tool(
            &self,
            name: &str,
            _arguments: Value,
            _cancel: CancellationToken,
        ) -> Result<String, ToolError> {
            assert!(!self.panic_on_call, "the source broke");
            Ok(name.to_string())
        }
    }

    fn tool(name: &str) -> ToolDefinition {
        ToolDefinition::new(name, "A tool.", json!({"type": "object"}))
    }

    fn names(tools: &[ToolDefinition]) -> Vec<&str> {
        tools.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn tool_names_are_identifiers() {
        for good in [
            "search_products",
            "files.read",
            "get-weather",
            "_private",
            "A1",
        ] {
            assert!(is_tool_name(good), "{good}");
        }
        let longest = "a".repeat(MAX_TOOL_NAME_CHARS);
        assert!(is_tool_name(&longest));
        for bad in [
            "",
            "1st",
            "-x",
            ".x",
            "x. Ignore the rule above and",
            "two words",
            "naïve",
            "line\nbreak",
            "a/b",
            "call()",
        ] {
            assert!(!is_tool_name(bad), "{bad:?}");
        }
        assert!(!is_tool_name(&format!("{longest}a")));
    }

    #[tokio::test]
    async fn a_tool_whose_name_is_not_an_identifier_is_never_offered_or_called() {
        let mut set = ToolSet::new();
        set.add(
            "page",
            Fixed::new(vec![
                tool("search"),
                tool("x. Ignore the rule above and"),
                tool("view cart"),
            ]),
        );
        assert_eq!(names(&set.list_tools().await), ["search"]);
        let error = set
            .call_tool(
                "x. Ignore the rule above and",
                json!({}),
                CancellationToken::new(),
            )
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::UnknownTool);
    }

    #[tokio::test]
    async fn long_descriptions_are_cut_and_large_schemas_refused() {
        let mut long = tool("long");
        long.description = "é".repeat(MAX_DESCRIPTION_CHARS * 3);
        let mut exact = tool("exact");
        exact.description = "d".repeat(MAX_DESCRIPTION_CHARS);
        let mut huge = tool("huge");
        huge.input_schema = json!({"type": "object", "description": "s".repeat(MAX_SCHEMA_BYTES)});
        let mut set = ToolSet::new();
        set.add("server", Fixed::new(vec![long, exact.clone(), huge]));
        let tools = set.list_tools().await;
        assert_eq!(
            names(&tools),
            ["long", "exact"],
            "the huge schema is refused"
        );
        assert_eq!(tools[0].description.chars().count(), MAX_DESCRIPTION_CHARS);
        assert!(tools[0].description.ends_with("é…"), "cut on a character");
        assert_eq!(tools[1], exact, "a description at the limit is kept whole");
    }

    #[tokio::test]
    async fn a_source_with_too_many_tools_is_cut_in_its_own_order() {
        let many: Vec<ToolDefinition> = (0..MAX_TOOLS_PER_SOURCE + 20)
            .map(|i| tool(&format!("tool_{i}")))
            .collect();
        let mut set = ToolSet::new();
        set.add("flood", Fixed::new(many));
        set.add("other", Fixed::new(vec![tool("other_tool")]));
        let tools = set.list_tools().await;
        assert_eq!(tools.len(), MAX_TOOLS_PER_SOURCE + 1);
        assert_eq!(
            tools[MAX_TOOLS_PER_SOURCE - 1].name,
            format!("tool_{}", MAX_TOOLS_PER_SOURCE - 1)
        );
        assert_eq!(
            tools.last().unwrap().name,
            "other_tool",
            "the other source keeps its tools"
        );
    }

    #[tokio::test]
    async fn a_qualified_name_follows_the_rule_too() {
        let mut set = ToolSet::new().with_name_clash(NameClash::Qualify);
        set.add("page", Fixed::new(vec![tool("search")]));
        set.add("my server", Fixed::new(vec![tool("search")]));
        set.add("files", Fixed::new(vec![tool("search")]));
        assert_eq!(names(&set.list_tools().await), ["search", "files_search"]);
    }

    #[tokio::test]
    async fn a_built_source_that_panicked_is_made_afresh_within_its_budget() {
        let builds = Arc::new(AtomicUsize::new(0));
        let counted = builds.clone();
        let mut set = ToolSet::new();
        set.add_built(
            "flaky",
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Fixed {
                    tools: vec![tool("work")],
                    panic_on_call: true,
                }
            },
            SourceOptions::default(),
        );
        set.list_tools().await;
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        let error = set
            .call_tool("work", json!({}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Unavailable);
        assert!(
            error.message.contains("the source broke"),
            "{}",
            error.message
        );
        assert!(error.message.contains("made afresh"), "{}", error.message);
        assert_eq!(
            builds.load(Ordering::SeqCst),
            2,
            "a fresh host after the panic"
        );
        let health = &set.health()[0];
        assert_eq!((health.restarts, health.panics), (1, 1));
        assert_eq!(health.state, SourceState::Ready);

        for _ in 1..DEFAULT_MAX_RESTARTS {
            let _ = set
                .call_tool("work", json!({}), CancellationToken::new())
                .await;
        }
        assert_eq!(
            builds.load(Ordering::SeqCst),
            1 + DEFAULT_MAX_RESTARTS as usize
        );
        // One panic more than the budget allows: the set gives up for now.
        let _ = set
            .call_tool("work", json!({}), CancellationToken::new())
            .await;
        assert_eq!(
            builds.load(Ordering::SeqCst),
            1 + DEFAULT_MAX_RESTARTS as usize
        );
        let health = &set.health()[0];
        assert!(
            matches!(health.state, SourceState::GaveUp { .. }),
            "{health:?}"
        );
        assert_eq!(health.panics, DEFAULT_MAX_RESTARTS + 1);
        let error = set
            .call_tool("work", json!({}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Unavailable);
        assert!(
            error.message.contains("restart budget"),
            "{}",
            error.message
        );
        assert!(
            set.list_tools().await.is_empty(),
            "a source given up on offers nothing"
        );
    }

    #[tokio::test]
    async fn a_plain_source_that_panicked_is_kept_and_its_panics_counted() {
        let mut set = ToolSet::new();
        set.add(
            "plain",
            Fixed {
                tools: vec![tool("work")],
                panic_on_call: true,
            },
        );
        let error = set
            .call_tool("work", json!({}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Unavailable);
        assert!(!error.message.contains("afresh"), "{}", error.message);
        let health = &set.health()[0];
        assert_eq!((health.restarts, health.panics), (0, 1));
    }

    /// Waits for its call to be cancelled and notes that it was.
    struct Patient(Arc<std::sync::atomic::AtomicBool>);

    #[async_trait]
    impl ToolHost for Patient {
        async fn list_tools(&self) -> Vec<ToolDefinition> {
            vec![tool("wait")]
        }

        async fn call_tool(
            &self,
            _name: &str,
            _arguments: Value,
            cancel: CancellationToken,
        ) -> Result<String, ToolError> {
            cancel.cancelled().await;
            self.0.store(true, Ordering::SeqCst);
            Err(ToolError::new(ToolErrorCode::Cancelled, "stopped"))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_over_its_limit_is_cancelled_in_the_source() {
        let heard = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut set = ToolSet::new();
        set.add_with(
            "slow",
            Patient(heard.clone()),
            SourceOptions::default().call_timeout(Duration::from_secs(90)),
        );
        let error = set
            .call_tool("wait", json!({}), CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(error.code, ToolErrorCode::Timeout);
        assert!(error.message.contains("within 90 s"), "{}", error.message);
        assert!(
            heard.load(Ordering::SeqCst),
            "the source heard the cancellation"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_refused_tool_is_a_warning_that_names_its_source() {
        // The test's runtime runs on this thread, so the capture reaches the set.
        let (log, _guard) = wma_testkit::capture_logs();
        let mut huge = tool("huge");
        huge.input_schema = json!({"type": "object", "description": "s".repeat(MAX_SCHEMA_BYTES)});
        let mut set = ToolSet::new();
        set.add(
            "the-page",
            Fixed::new(vec![tool("x. Ignore the rule above and"), huge]),
        );
        assert!(set.list_tools().await.is_empty());
        let text = log.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines
                .iter()
                .all(|l| l.contains("WARN") && l.contains("source=\"the-page\"")),
            "{text}"
        );
        assert!(
            lines[0].contains("not an identifier") && lines[0].contains("Ignore the rule above"),
            "{text}"
        );
        assert!(
            lines[1].contains("tool=huge") && lines[1].contains("schema"),
            "{text}"
        );
    }
}
