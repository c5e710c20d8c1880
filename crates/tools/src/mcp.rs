//! MCP servers as a tool source, through the `rmcp` client: a child process
//! over stdio, or a server over streamable HTTP.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ClientRequest, CustomResult,
    ErrorCode, Implementation, ListToolsRequest, MetaObject, PaginatedRequestParams,
    ProtocolVersion, RequestMetaObject, ServerResult,
};
use rmcp::service::{MaybeSendFuture, NotificationContext, RunningService};
use rmcp::transport::common::client_side_sse::ExponentialBackoff;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use wma_agent::{CallContext, ToolAnnotations, ToolDefinition, ToolError, ToolErrorCode, ToolHost};

use crate::error::ToolsError;
use crate::health::{
    DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_WINDOW, Monitored, RestartBudget, SourceState,
    SourceStatus,
};

/// How long starting and initializing a server may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Times a broken HTTP response stream is resumed before the request fails.
/// rmcp's default retries forever, which turns a dead server into a call
/// that never answers.
const HTTP_STREAM_RETRIES: usize = 3;

/// Lines of a server's stderr kept to explain why it stopped.
const LAST_WORDS: usize = 5;

/// How to reach an MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum McpTransport {
    /// A child process speaking MCP on its stdin and stdout.
    Stdio {
        /// The program.
        program: PathBuf,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment variables.
        env: Vec<(String, String)>,
        /// Its working directory (default: this process's).
        current_dir: Option<PathBuf>,
    },
    /// A streamable-HTTP endpoint (`http://127.0.0.1:3001/mcp`).
    Http {
        /// The endpoint.
        url: String,
    },
}

/// An MCP server's configuration.
#[derive(Debug, Clone)]
pub struct McpServerOptions {
    /// A name for messages and logs.
    pub name: String,
    /// How to reach it.
    pub transport: McpTransport,
    /// Restarts allowed per [`Self::restart_window`]. Default: [`DEFAULT_MAX_RESTARTS`].
    pub max_restarts: u32,
    /// Default: [`DEFAULT_RESTART_WINDOW`].
    pub restart_window: Duration,
    /// Limit for starting and initializing. Default: [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
}

impl McpServerOptions {
    /// A server started as `program args…`, spoken to over stdio.
    pub fn stdio<I, S>(name: impl Into<String>, program: impl Into<PathBuf>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_transport(
            name,
            McpTransport::Stdio {
                program: program.into(),
                args: args.into_iter().map(Into::into).collect(),
                env: Vec::new(),
                current_dir: None,
            },
        )
    }

    /// A server at a streamable-HTTP endpoint.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self::with_transport(name, McpTransport::Http { url: url.into() })
    }

    fn with_transport(name: impl Into<String>, transport: McpTransport) -> Self {
        Self {
            name: name.into(),
            transport,
            max_restarts: DEFAULT_MAX_RESTARTS,
            restart_window: DEFAULT_RESTART_WINDOW,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Adds an environment variable for a stdio server.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let McpTransport::Stdio { env, .. } = &mut self.transport {
            env.push((key.into(), value.into()));
        }
        self
    }

    /// Sets a stdio server's working directory.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        if let McpTransport::Stdio { current_dir, .. } = &mut self.transport {
            *current_dir = Some(dir.into());
        }
        self
    }
}

/// What the notification handler and the source share.
struct Flags {
    /// The cached tool list is out of date.
    stale: AtomicBool,
    /// `notifications/tools/list_changed` received, over all connections.
    list_changed: AtomicU64,
    /// Bumped on every list change and restart.
    changes: watch::Sender<u64>,
}

/// The client side of the protocol: notes list changes.
#[derive(Clone)]
struct Handler {
    flags: Arc<Flags>,
    config: ClientConfig,
}

impl ClientHandler for Handler {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.flags.stale.store(true, Ordering::SeqCst);
        self.flags.list_changed.fetch_add(1, Ordering::SeqCst);
        self.flags.changes.send_modify(|g| *g += 1);
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }
}

/// One running connection (one server process, for stdio).
struct Connection {
    service: RunningService<RoleClient, Handler>,
    pid: Option<u32>,
    tools: Mutex<Option<Vec<ToolDefinition>>>,
    /// A request failed because the transport broke. An HTTP transport
    /// stays open after its server went away (and a restarted server does
    /// not know the old session), so this, not the transport, says the
    /// connection must be replaced.
    broken: AtomicBool,
}

impl Connection {
    fn is_closed(&self) -> bool {
        self.broken.load(Ordering::SeqCst) || self.service.peer().is_transport_closed()
    }
}

struct Inner {
    options: McpServerOptions,
    flags: Arc<Flags>,
    /// The current connection; replaced when the server is restarted.
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    restarts: AtomicU32,
    /// Calls sent and not yet answered.
    in_flight: AtomicUsize,
    /// Bounds the restarts.
    budget: RestartBudget,
    /// Why the server last stopped or failed to start, for health reports.
    last_error: Mutex<Option<String>>,
    /// A start (process and `initialize`) is in progress.
    starting: AtomicBool,
    /// The last lines the server wrote to stderr, to explain a crash.
    last_words: Arc<Mutex<VecDeque<String>>>,
    /// A session was opened once; opening another is a restart.
    started: AtomicBool,
}

/// An MCP server as a [`ToolHost`].
///
/// The tool list is cached and fetched again after the server sends
/// `notifications/tools/list_changed`. Results with `isError` become
/// `tool_failed` errors carrying the server's text. A server that stops (a
/// crashed or killed process, a closed HTTP session) fails the call that
/// was running with an `unavailable` error that says so, and is started
/// again at once, within a restart budget, so the next call finds it ready.
///
/// Tools take their annotations from the server's hints with MCP's
/// defaults: `openWorldHint` (default true) marks the output untrusted,
/// `destructiveHint` (default true) on a tool that is not read-only marks it
/// consequential.
///
/// Cheap to clone; the process is stopped when the last clone is dropped.
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.inner.options.name)
            .field("transport", &self.inner.options.transport)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// Starts (or connects to) the server and initializes the session.
    pub async fn connect(options: McpServerOptions) -> Result<Self, ToolsError> {
        let server = Self::lazy(options);
        let connection = server.start().await?;
        server.inner.started.store(true, Ordering::SeqCst);
        *server.inner.connection.lock().await = Some(connection);
        Ok(server)
    }

    /// A server that is started (or connected to) on its first use, for
    /// builders that cannot wait, such as the runtime's
    /// `ToolSource::new(|| …)`. Until it starts, it lists no tools and its
    /// calls answer `unavailable` with the reason.
    pub fn lazy(options: McpServerOptions) -> Self {
        let budget = RestartBudget::new(options.max_restarts, options.restart_window);
        Self {
            inner: Arc::new(Inner {
                options,
                flags: Arc::new(Flags {
                    stale: AtomicBool::new(true),
                    list_changed: AtomicU64::new(0),
                    changes: watch::Sender::new(0),
                }),
                connection: tokio::sync::Mutex::new(None),
                restarts: AtomicU32::new(0),
                in_flight: AtomicUsize::new(0),
                budget,
                last_error: Mutex::new(None),
                starting: AtomicBool::new(false),
                last_words: Arc::new(Mutex::new(VecDeque::new())),
                started: AtomicBool::new(false),
            }),
        }
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.inner.options.name
    }

    /// The process id of a stdio server's current process.
    pub async fn process_id(&self) -> Option<u32> {
        self.inner
            .connection
            .lock()
            .await
            .as_ref()
            .and_then(|c| c.pid)
    }

    /// Times the server was restarted after it stopped.
    pub fn restarts(&self) -> u32 {
        self.inner.restarts.load(Ordering::SeqCst)
    }

    /// Calls sent to the server that have not answered yet.
    pub fn calls_in_flight(&self) -> usize {
        self.inner.in_flight.load(Ordering::SeqCst)
    }

    /// `notifications/tools/list_changed` received so far.
    pub fn tool_list_changes(&self) -> u64 {
        self.inner.flags.list_changed.load(Ordering::SeqCst)
    }

    /// A receiver that changes when the server's tool list may have changed
    /// (a list-changed notification or a restart).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.flags.changes.subscribe()
    }

    /// The server's name and version, as it reported them.
    pub async fn server_info(&self) -> Option<(String, String)> {
        let connection = self.inner.connection.lock().await.clone()?;
        let info = connection.service.peer().peer_info()?;
        let info = serde_json::to_value(info.as_ref()).ok()?;
        Some((
            info["serverInfo"]["name"].as_str()?.to_string(),
            info["serverInfo"]["version"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ))
    }

    /// Ends the session (and stops a stdio server's process).
    pub async fn close(&self) {
        let connection = self.inner.connection.lock().await.take();
        if let Some(connection) = connection
            && let Ok(mut connection) = Arc::try_unwrap(connection)
        {
            let _ = connection
                .service
                .close_with_timeout(Duration::from_secs(5))
                .await;
        }
    }

    fn connect_error(&self, reason: impl Into<String>) -> ToolsError {
        ToolsError::McpConnect {
            server: self.inner.options.name.clone(),
            reason: reason.into(),
        }
    }

    /// Starts a process (or opens an HTTP session) and initializes.
    async fn start(&self) -> Result<Arc<Connection>, ToolsError> {
        self.inner.starting.store(true, Ordering::SeqCst);
        let started = self.start_session().await;
        self.inner.starting.store(false, Ordering::SeqCst);
        started
    }

    async fn start_session(&self) -> Result<Arc<Connection>, ToolsError> {
        let options = &self.inner.options;
        let mut config = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("webmcp-agents", env!("CARGO_PKG_VERSION")),
        );
        // The `initialize` handshake offers the newest version that has one;
        // the servers in use today (and the conformance suite) speak it.
        config.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
        let handler = Handler {
            flags: self.inner.flags.clone(),
            config,
        };
        // A new session's list is fetched afresh.
        self.inner.flags.stale.store(true, Ordering::SeqCst);
        let (service, pid) = match &options.transport {
            McpTransport::Stdio {
                program,
                args,
                env,
                current_dir,
            } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).envs(env.iter().cloned());
                if let Some(dir) = current_dir {
                    command.current_dir(dir);
                }
                let (process, stderr) = TokioChildProcess::builder(command)
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| {
                        self.connect_error(format!("could not run {}: {e}", program.display()))
                    })?;
                let pid = process.id();
                if let Some(stderr) = stderr {
                    let last_words = self.inner.last_words.clone();
                    let name = options.name.clone();
                    tokio::spawn(async move {
                        let mut lines = BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            tracing::debug!(server = %name, "{line}");
                            let mut last = last_words.lock();
                            if last.len() == LAST_WORDS {
                                last.pop_front();
                            }
                            last.push_back(line);
                        }
                    });
                }
                let service = tokio::time::timeout(options.connect_timeout, handler.serve(process))
                    .await
                    .map_err(|_| self.connect_error("it did not initialize in time"))?
                    .map_err(|e| self.connect_error(format!("{e}{}", self.said())))?;
                (service, pid)
            }
            McpTransport::Http { url } => {
                let mut retry = ExponentialBackoff::default();
                retry.max_times = Some(HTTP_STREAM_RETRIES);
                retry.base_duration = Duration::from_millis(250);
                retry.max_delay = Some(Duration::from_secs(2));
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.retry_config = Arc::new(retry);
                let transport = StreamableHttpClientTransport::from_config(config);
                let service =
                    tokio::time::timeout(options.connect_timeout, handler.serve(transport))
                        .await
                        .map_err(|_| self.connect_error("it did not initialize in time"))?
                        .map_err(|e| self.connect_error(e.to_string()))?;
                (service, None)
            }
        };
        tracing::debug!(server = %options.name, ?pid, "MCP session initialized");
        Ok(Arc::new(Connection {
            service,
            pid,
            tools: Mutex::new(None),
            broken: AtomicBool::new(false),
        }))
    }

    /// Keeps why the server last stopped, for [`Monitored::status`].
    fn note_error(&self, reason: &str) {
        *self.inner.last_error.lock() = Some(reason.to_string());
    }

    /// What the server last wrote to stderr, for messages.
    fn said(&self) -> String {
        let last = self.inner.last_words.lock();
        if last.is_empty() {
            String::new()
        } else {
            format!(
                " (it said: {})",
                last.iter().cloned().collect::<Vec<_>>().join(" | ")
            )
        }
    }

    /// The live connection, restarting the server if it stopped.
    async fn connection(&self) -> Result<Arc<Connection>, ToolError> {
        let mut slot = self.inner.connection.lock().await;
        if let Some(connection) = slot.as_ref()
            && !connection.is_closed()
        {
            return Ok(connection.clone());
        }
        if !self.inner.started.load(Ordering::SeqCst) {
            let connection = self.start().await.map_err(|e| {
                self.note_error(&e.to_string());
                ToolError::new(ToolErrorCode::Unavailable, e.to_string())
            })?;
            self.inner.started.store(true, Ordering::SeqCst);
            *slot = Some(connection.clone());
            return Ok(connection);
        }
        let name = &self.inner.options.name;
        if let Err(refusal) = self.inner.budget.take(&format!("the MCP server `{name}`")) {
            self.note_error(&refusal);
            return Err(ToolError::new(ToolErrorCode::Unavailable, refusal));
        }
        *slot = None;
        self.inner.last_words.lock().clear();
        tracing::warn!(server = %name, "the MCP server stopped; starting it again");
        let connection = self.start().await.map_err(|e| {
            self.note_error(&e.to_string());
            ToolError::new(ToolErrorCode::Unavailable, e.to_string())
        })?;
        self.inner.restarts.fetch_add(1, Ordering::SeqCst);
        self.inner.flags.changes.send_modify(|g| *g += 1);
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// Starts the server again in the background after it stopped, so that
    /// the next call does not wait for it.
    fn restart_soon(&self) {
        let server = self.clone();
        tokio::spawn(async move {
            if let Err(error) = server.connection().await {
                tracing::warn!(server = %server.name(), %error, "could not restart the MCP server");
            }
        });
    }

    async fn fetch_tools(
        &self,
        connection: &Connection,
    ) -> Result<Vec<ToolDefinition>, ServiceError> {
        // Cleared before asking, so a change announced during the request
        // makes the next listing ask again.
        self.inner.flags.stale.store(false, Ordering::SeqCst);
        // Each page is read as JSON, tool by tool: rmcp reads a page whole
        // into its types, so that one tool it cannot read (an
        // `inputSchema` that is a string) would hide every tool of the
        // server. A tool that cannot be used is left out alone, named in a
        // warning.
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_TOOL_PAGES {
            let request = ClientRequest::ListToolsRequest(ListToolsRequest {
                method: Default::default(),
                params: cursor
                    .take()
                    .map(|c| PaginatedRequestParams::default().with_cursor(Some(c))),
                extensions: Default::default(),
            });
            let page = match connection.service.peer().send_request(request).await? {
                ServerResult::ListToolsResult(result) => {
                    serde_json::to_value(result).unwrap_or_default()
                }
                ServerResult::CustomResult(CustomResult(page)) => page,
                _ => return Err(ServiceError::UnexpectedResponse),
            };
            for tool in page["tools"].as_array().into_iter().flatten() {
                match tool_definition(tool) {
                    Ok(definition) => tools.push(definition),
                    Err(problem) => tracing::warn!(
                        server = %self.name(),
                        tool = %tool["name"].as_str().unwrap_or("(no name)"),
                        %problem,
                        "an MCP tool is left out: it cannot be called as it describes itself; \
                         the server's other tools stay"
                    ),
                }
            }
            match page["nextCursor"].as_str() {
                Some(next) if !next.is_empty() => cursor = Some(next.to_string()),
                _ => break,
            }
        }
        Ok(tools)
    }
}

impl Monitored for McpServer {
    fn status(&self) -> SourceStatus {
        let last_error = || self.inner.last_error.lock().clone();
        let state = match self.inner.connection.try_lock() {
            // Held across a start, and for a moment by every call.
            Err(_) if self.inner.starting.load(Ordering::SeqCst) => SourceState::Starting,
            Err(_) => SourceState::Ready,
            Ok(slot) => match slot.as_ref() {
                Some(connection) if !connection.is_closed() => SourceState::Ready,
                _ if !self.inner.started.load(Ordering::SeqCst) => match last_error() {
                    Some(reason) => SourceState::Down { reason },
                    None => SourceState::Starting,
                },
                _ => {
                    let reason = last_error().unwrap_or_else(|| "the server stopped".to_string());
                    if self.inner.budget.spent() {
                        SourceState::GaveUp { reason }
                    } else {
                        SourceState::Down { reason }
                    }
                }
            },
        };
        SourceStatus {
            state,
            restarts: self.restarts(),
        }
    }
}

/// Counts a call while it runs, however it ends.
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The key of a `tools/call` request's `_meta` under which an MCP server
/// gets the call's idempotency key (when the host recorded the call before
/// sending it): a server that keeps the keys it has seen can answer a call
/// sent twice once. Namespaced with a reverse domain name, as MCP asks of
/// `_meta` keys that are not the protocol's own.
pub const IDEMPOTENCY_KEY_META: &str = "io.webmcp-agents/idempotency-key";

/// The most pages of `tools/list` read from one server: a server whose
/// cursors never end cannot keep a listing going for ever.
const MAX_TOOL_PAGES: usize = 100;

/// A server's tool as the loop sees it, or why it cannot be used: no name,
/// or an `inputSchema` that is not a JSON Schema of an object (every call
/// of such a tool would fail its validation). A tool without an
/// `inputSchema` takes no arguments.
fn tool_definition(tool: &Value) -> Result<ToolDefinition, String> {
    let name = match tool["name"].as_str() {
        Some(name) if !name.trim().is_empty() => name,
        _ => return Err("it has no name".to_string()),
    };
    let hints = &tool["annotations"];
    let read_only = hints["readOnlyHint"].as_bool().unwrap_or(false);
    let description = tool["description"]
        .as_str()
        .or(tool["title"].as_str())
        .unwrap_or_default();
    let schema = match &tool["inputSchema"] {
        Value::Null => json!({"type": "object", "properties": {}}),
        schema @ Value::Object(fields) => {
            if let Some(kind) = fields.get("type")
                && kind != "object"
            {
                return Err(format!(
                    "its inputSchema is of type {kind}; a tool's arguments are an object"
                ));
            }
            wma_agent::CompiledSchema::new(schema)
                .map_err(|e| format!("its inputSchema is not a valid JSON Schema: {e}"))?;
            schema.clone()
        }
        other => {
            return Err(format!(
                "its inputSchema is {}, not a JSON Schema object",
                json_kind(other)
            ));
        }
    };
    Ok(
        ToolDefinition::new(name, description, schema).with_annotations(ToolAnnotations {
            read_only,
            untrusted_content: hints["openWorldHint"].as_bool().unwrap_or(true),
            consequential: !read_only && hints["destructiveHint"].as_bool().unwrap_or(true),
        }),
    )
}

/// What kind of JSON value `value` is, for a message.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The text of a `tools/call` result: text blocks as they are, other
/// blocks named, structured content when there is no text.
pub(crate) fn result_text(result: &Value) -> String {
    let mut parts = Vec::new();
    for block in result["content"].as_array().into_iter().flatten() {
        let kind = block["type"].as_str().unwrap_or_default();
        match kind {
            "text" => parts.push(block["text"].as_str().unwrap_or_default().to_string()),
            "image" | "audio" => parts.push(format!(
                "[{kind}: {}]",
                block["mimeType"].as_str().unwrap_or("unknown type")
            )),
            "resource" => {
                let resource = &block["resource"];
                match resource["text"].as_str() {
                    Some(text) => parts.push(text.to_string()),
                    None => parts.push(format!(
                        "[resource: {}]",
                        resource["uri"].as_str().unwrap_or_default()
                    )),
                }
            }
            "resource_link" => parts.push(format!(
                "[resource link: {} {}]",
                block["uri"].as_str().unwrap_or_default(),
                block["name"].as_str().unwrap_or_default()
            )),
            other => parts.push(format!("[{other} content]")),
        }
    }
    let text = parts.join("\n");
    match result.get("structuredContent") {
        Some(structured) if text.trim().is_empty() && !structured.is_null() => {
            structured.to_string()
        }
        _ => text,
    }
}

#[async_trait]
impl ToolHost for McpServer {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(error) => {
                tracing::warn!(server = %self.name(), %error, "no tools from the MCP server");
                return Vec::new();
            }
        };
        if !self.inner.flags.stale.load(Ordering::SeqCst)
            && let Some(tools) = connection.tools.lock().clone()
        {
            return tools;
        }
        match self.fetch_tools(&connection).await {
            Ok(tools) => {
                *connection.tools.lock() = Some(tools.clone());
                tools
            }
            Err(error) => {
                self.inner.flags.stale.store(true, Ordering::SeqCst);
                tracing::warn!(server = %self.name(), %error, "could not list the MCP server's tools");
                if matches!(
                    error,
                    ServiceError::TransportClosed | ServiceError::TransportSend(_)
                ) {
                    connection.broken.store(true, Ordering::SeqCst);
                }
                if connection.is_closed() {
                    self.restart_soon();
                }
                Vec::new()
            }
        }
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

    /// The call's idempotency key goes in the request's `_meta`, under
    /// [`IDEMPOTENCY_KEY_META`].
    async fn call_tool_with(
        &self,
        name: &str,
        arguments: Value,
        context: &CallContext,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let arguments = match arguments {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => {
                return Err(ToolError::new(
                    ToolErrorCode::InvalidArguments,
                    format!("the arguments must be an object, got {other}"),
                ));
            }
        };
        let connection = self.connection().await?;
        let mut params = CallToolRequestParams::new(name.to_string()).with_arguments(arguments);
        if let Some(key) = context.idempotency_key() {
            let mut meta = Map::new();
            meta.insert(IDEMPOTENCY_KEY_META.to_string(), Value::from(key));
            params.meta = Some(RequestMetaObject(MetaObject(meta)));
        }
        let peer = connection.service.peer().clone();
        let _in_flight = InFlight::enter(&self.inner.in_flight);
        // Dropping the request on cancellation makes rmcp send
        // `notifications/cancelled` for it.
        let outcome = tokio::select! {
            outcome = peer.call_tool(params) => outcome,
            _ = cancel.cancelled() => {
                return Err(ToolError::new(ToolErrorCode::Cancelled, "the call was cancelled"));
            }
        };
        let server = self.name();
        match outcome {
            Ok(result) => {
                let result = serde_json::to_value(&result).unwrap_or(Value::Null);
                let text = result_text(&result);
                if result["isError"].as_bool() == Some(true) {
                    let message = if text.trim().is_empty() {
                        format!("{name} failed without a message")
                    } else {
                        text
                    };
                    Err(ToolError::new(ToolErrorCode::ToolFailed, message))
                } else {
                    Ok(text)
                }
            }
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                let said = self.said();
                self.note_error(&format!("it stopped while running {name}{said}"));
                connection.broken.store(true, Ordering::SeqCst);
                self.restart_soon();
                Err(ToolError::new(
                    ToolErrorCode::Unavailable,
                    format!(
                        "the MCP server `{server}` stopped while running {name}{said}; it is being restarted, so the call may be tried again"
                    ),
                ))
            }
            Err(ServiceError::McpError(error)) => {
                let code = if error.code == ErrorCode::INVALID_PARAMS {
                    ToolErrorCode::InvalidArguments
                } else if error.code == ErrorCode::METHOD_NOT_FOUND {
                    ToolErrorCode::UnknownTool
                } else {
                    ToolErrorCode::ToolFailed
                };
                Err(ToolError::new(code, error.message.to_string()))
            }
            Err(ServiceError::Timeout { timeout }) => Err(ToolError::new(
                ToolErrorCode::Timeout,
                format!("{name} did not answer within {} s", timeout.as_secs_f32()),
            )),
            Err(ServiceError::Cancelled { reason }) => Err(ToolError::new(
                ToolErrorCode::Cancelled,
                reason.unwrap_or_else(|| "the server cancelled the call".to_string()),
            )),
            Err(other) => Err(ToolError::new(ToolErrorCode::ToolFailed, other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_map_to_annotations_with_the_protocols_defaults() {
        let echo = tool_definition(&json!({"name": "echo", "description": "Echo.",
            "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}},
            "annotations": {"readOnlyHint": true, "openWorldHint": false}}))
        .unwrap();
        assert_eq!(echo.name, "echo");
        assert!(echo.annotations.read_only);
        assert!(!echo.annotations.untrusted_content);
        assert!(!echo.annotations.consequential);

        let unannotated =
            tool_definition(&json!({"name": "write", "title": "Write a file"})).unwrap();
        assert_eq!(unannotated.description, "Write a file");
        assert!(unannotated.annotations.untrusted_content);
        assert!(unannotated.annotations.consequential);
        assert_eq!(
            unannotated.input_schema,
            json!({"type": "object", "properties": {}})
        );
    }

    #[test]
    fn a_tool_whose_schema_cannot_be_used_is_refused_with_the_reason() {
        let refused = |tool: Value| tool_definition(&tool).unwrap_err();
        assert!(refused(json!({"name": "a", "inputSchema": "{}"})).contains("a string"));
        assert!(
            refused(json!({"name": "a", "inputSchema": {"type": "string"}}))
                .contains("of type \"string\"")
        );
        assert!(
            refused(json!({"name": "a", "inputSchema": {"type": "object",
                "properties": {"n": {"type": "integer", "minimum": "zero"}}}}))
            .contains("not a valid JSON Schema")
        );
        assert!(refused(json!({"inputSchema": {"type": "object"}})).contains("no name"));
    }

    #[test]
    fn result_text_keeps_text_and_names_other_blocks() {
        let result = json!({"content": [
            {"type": "text", "text": "The sum of 2 and 3 is 5."},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "demo://a", "text": "inside"}}]});
        assert_eq!(
            result_text(&result),
            "The sum of 2 and 3 is 5.\n[image: image/png]\ninside"
        );
        let structured = json!({"content": [], "structuredContent": {"temperature": 22.5}});
        assert_eq!(result_text(&structured), r#"{"temperature":22.5}"#);
    }
}
