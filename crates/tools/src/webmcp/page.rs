//! One browser tab whose WebMCP tools are offered as a [`ToolHost`].

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use wma_agent::{PageContext, ToolAnnotations, ToolDefinition, ToolError, ToolErrorCode, ToolHost};

use crate::error::ToolsError;
use crate::webmcp::browser::BrowserInner;
use crate::webmcp::cdp::{CdpError, CdpEvent};

/// How long listing, calling and reading the page context wait for a
/// navigation in progress, unless [`PageOptions::settle_timeout`] says otherwise.
pub const DEFAULT_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long listing waits for a page's tool set to stay unchanged after a
/// load, a change of its tools or a call, unless
/// [`PageOptions::tools_quiet`] says otherwise.
pub const DEFAULT_TOOLS_QUIET: Duration = Duration::from_millis(500);

/// The longest one listing waits for the tool set to stop changing: a page
/// whose tools never stay still is listed as it is after this.
const TOOLS_QUIET_LIMIT: Duration = Duration::from_secs(3);

/// How long a form tool without autosubmit is given to refuse its input
/// (Chromium answers a bad input in the same moment) before the call
/// answers that the form waits for the person.
const FORM_FILL_WAIT: Duration = Duration::from_millis(250);

/// How long a cancelled call waits for the page to confirm.
const CANCEL_CONFIRM_WAIT: Duration = Duration::from_secs(2);

/// The older `navigator.modelContext` API, mapped onto `document.modelContext`.
const LEGACY_API: &str = include_str!("legacy.js");

/// Answers that came before their call was registered, kept this many at
/// most (Chromium may also send a second answer for one invocation).
const EARLY_ANSWERS: usize = 32;

/// How a page is driven.
#[derive(Debug, Clone)]
pub struct PageOptions {
    /// How long to wait for a navigation in progress before listing or
    /// calling anyway. Default: [`DEFAULT_SETTLE_TIMEOUT`].
    pub settle_timeout: Duration,
    /// Offer the older API, `navigator.modelContext` (`provideContext`,
    /// `registerTool`, `unregisterTool`, `clearContext`), to every document
    /// the tab loads, mapped onto Chromium's `document.modelContext`, so
    /// pages written for it get their tools too. Default: true.
    pub legacy_api: bool,
    /// How long the page's tool set must stay unchanged after a load, a
    /// change of its tools or a call before a listing reads it (at most
    /// 3 s in all), so that tools a page registers just after its load (a
    /// form's tool, a script that registers late) are in the first step.
    /// Zero lists at once. Default: [`DEFAULT_TOOLS_QUIET`].
    pub tools_quiet: Duration,
    /// Offer tools the page marked `debugging` (meant for developers and
    /// their tooling, not for agents). Default: false.
    pub debugging_tools: bool,
}

impl Default for PageOptions {
    fn default() -> Self {
        Self {
            settle_timeout: DEFAULT_SETTLE_TIMEOUT,
            legacy_api: true,
            tools_quiet: DEFAULT_TOOLS_QUIET,
            debugging_tools: false,
        }
    }
}

/// A tool the page registered, as the host sees it: its definition, where
/// it lives and how it is called.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PageTool {
    /// What the model is shown: the name, the description, the input
    /// schema (closed: keys it does not list are refused, as Chromium
    /// refuses them) and the annotations.
    pub definition: ToolDefinition,
    /// The frame that registered it.
    pub frame_id: String,
    /// The address of that frame's document; `None` for the main frame.
    pub frame_url: Option<String>,
    /// A declarative tool: an HTML form with a `toolname`, whose fields are
    /// its arguments.
    pub declarative: bool,
    /// A declarative tool whose form submits itself once filled
    /// (`toolautosubmit`); without it the form waits for the person.
    pub autosubmit: bool,
    /// Marked for debugging: meant for developers, not offered to agents
    /// unless [`PageOptions::debugging_tools`].
    pub debugging: bool,
    /// Whether listing offers it (see [`WebMcpPage::page_tools`]).
    pub offered: bool,
    /// The form's node, for a declarative tool.
    form_node: Option<i64>,
}

/// A frame of the tab.
#[derive(Debug, Clone, Default)]
struct Frame {
    url: String,
    /// Its document's origin (`http://127.0.0.1:8080`).
    origin: String,
}

/// A tab whose WebMCP tools are followed through the CDP `WebMCP` domain.
///
/// The tool list is kept from the domain's `toolsAdded` / `toolsRemoved`
/// events and dropped whenever the tab loads another document (Chromium
/// sends no `toolsRemoved` for a document that goes away), so the list is
/// always that of the document on screen. Listing and calling first wait for
/// a navigation in progress to finish: a tool that navigates (opening a
/// product page, say) is followed by the tools of the page it opened.
///
/// Tools of embedded frames are not offered: a third-party iframe must not
/// add tools to the page's agent.
///
/// Cheap to clone; the tab is closed when the last clone is dropped (unless
/// it was [attached](crate::Browser::attach) to).
#[derive(Clone)]
pub struct WebMcpPage {
    inner: Arc<PageInner>,
}

struct PageInner {
    /// Keeps the browser (and its connection) alive while the page is used.
    browser: Arc<BrowserInner>,
    session: String,
    target_id: String,
    options: PageOptions,
    shared: Arc<Shared>,
    /// Whether dropping the page closes the tab (it was opened by us).
    close_on_drop: bool,
    events: tokio::task::JoinHandle<()>,
}

impl Drop for PageInner {
    fn drop(&mut self) {
        self.events.abort();
        if self.close_on_drop {
            self.browser.cdp.fire(
                None,
                "Target.closeTarget",
                json!({"targetId": self.target_id}),
            );
        }
    }
}

/// What the event task and the callers share.
struct Shared {
    state: Mutex<PageState>,
    /// Bumped on every change of the tool list or of the loading state.
    changes: watch::Sender<u64>,
    /// Cancelled when the tab is closed, crashed or the browser is gone.
    gone: CancellationToken,
    /// The main frame's id (the target id, for a tab).
    main_frame: String,
}

/// A `WebMCP.toolResponded` event.
#[derive(Debug, Clone, PartialEq)]
struct Responded {
    status: String,
    output: Option<Value>,
    error_text: Option<String>,
    exception: Option<Value>,
}

struct PageState {
    /// Every frame's tools, in registration order; [`PageState::offered`]
    /// says which the model is shown.
    tools: Vec<PageTool>,
    /// The frames whose documents are known, by id (the main frame's too).
    frames: HashMap<String, Frame>,
    /// When the page last loaded, changed its tools or answered a call:
    /// listing waits for [`PageOptions::tools_quiet`] after it.
    active_at: Instant,
    /// Form tools filled for the person to submit, by invocation id.
    with_person: HashMap<String, String>,
    /// A cross-document navigation of the main frame is under way.
    loading: bool,
    /// Calls waiting for their `toolResponded`, by invocation id.
    invocations: HashMap<String, oneshot::Sender<Responded>>,
    /// Answers that arrived before their call registered.
    early: VecDeque<(String, Responded)>,
    /// The main frame's address.
    url: String,
    /// Why the page is unusable, once it is.
    gone: Option<String>,
}

impl Default for PageState {
    fn default() -> Self {
        Self {
            tools: Vec::new(),
            frames: HashMap::new(),
            active_at: Instant::now(),
            with_person: HashMap::new(),
            loading: false,
            invocations: HashMap::new(),
            early: VecDeque::new(),
            url: String::new(),
            gone: None,
        }
    }
}

impl PageState {
    /// Whether tools of `frame` may be offered: the main frame's, and
    /// those of frames showing a document of the main frame's origin. A
    /// third-party iframe (an ad, an embedded widget) must not add tools
    /// to the page's agent.
    fn frame_admitted(&self, frame: &str, main_frame: &str) -> bool {
        if frame == main_frame {
            return true;
        }
        let origin = |id: &str| {
            self.frames
                .get(id)
                .map(|f| f.origin.as_str())
                .filter(|o| !o.is_empty() && *o != "null")
        };
        matches!((origin(frame), origin(main_frame)), (Some(a), Some(b)) if a == b)
    }

    /// The tools the model is shown, each name once: the main frame's
    /// first, then its same-origin frames' (a name the main frame has is
    /// its), without the debugging ones unless `debugging_tools`.
    fn offered(&self, main_frame: &str, debugging_tools: bool) -> Vec<&PageTool> {
        let mut offered: Vec<&PageTool> = Vec::new();
        let main_first = self
            .tools
            .iter()
            .filter(|t| t.frame_id == main_frame)
            .chain(self.tools.iter().filter(|t| t.frame_id != main_frame));
        for tool in main_first {
            if (tool.debugging && !debugging_tools)
                || !self.frame_admitted(&tool.frame_id, main_frame)
                || offered
                    .iter()
                    .any(|t| t.definition.name == tool.definition.name)
            {
                continue;
            }
            offered.push(tool);
        }
        offered
    }

    /// Drops the tools of `frame` (its document went away).
    fn drop_frame_tools(&mut self, frame: &str) {
        self.tools.retain(|t| t.frame_id != frame);
    }
}

impl Shared {
    fn bump(&self) {
        self.changes.send_modify(|generation| *generation += 1);
    }

    fn mark_gone(&self, reason: &str) {
        {
            let mut state = self.state.lock();
            if state.gone.is_none() {
                state.gone = Some(reason.to_string());
            }
            state.tools.clear();
            state.loading = false;
            // Dropping the senders fails every waiting call.
            state.invocations.clear();
        }
        self.gone.cancel();
        self.bump();
    }

    /// Applies one event; returns whether waiters should look again.
    fn apply(&self, event: &CdpEvent) -> bool {
        let params = &event.params;
        let is_main = |frame: &Value| frame.as_str() == Some(self.main_frame.as_str());
        let mut state = self.state.lock();
        match event.method.as_str() {
            "WebMCP.toolsAdded" => {
                for tool in params["tools"].as_array().into_iter().flatten() {
                    let Some(added) = page_tool(tool) else {
                        continue;
                    };
                    state.tools.retain(|t| {
                        t.frame_id != added.frame_id || t.definition.name != added.definition.name
                    });
                    state.tools.push(added);
                }
                state.active_at = Instant::now();
                true
            }
            "WebMCP.toolsRemoved" => {
                for tool in params["tools"].as_array().into_iter().flatten() {
                    let (Some(frame), Some(name)) =
                        (tool["frameId"].as_str(), tool["name"].as_str())
                    else {
                        continue;
                    };
                    state
                        .tools
                        .retain(|t| t.frame_id != frame || t.definition.name != name);
                }
                state.active_at = Instant::now();
                true
            }
            "WebMCP.toolInvoked" => {
                tracing::debug!(
                    tool = params["toolName"].as_str().unwrap_or_default(),
                    invocation = params["invocationId"].as_str().unwrap_or_default(),
                    "the page started a tool call"
                );
                false
            }
            "WebMCP.toolResponded" => {
                let Some(id) = params["invocationId"].as_str() else {
                    return false;
                };
                let responded = Responded {
                    status: params["status"].as_str().unwrap_or_default().to_string(),
                    output: params.get("output").cloned(),
                    error_text: params["errorText"].as_str().map(str::to_string),
                    exception: params.get("exception").cloned(),
                };
                if let Some(tool) = state.with_person.remove(id) {
                    // The call answered long ago; this is the person's
                    // own submit (or its cancellation) of the filled form.
                    tracing::info!(
                        tool = %tool,
                        status = %responded.status,
                        "the person submitted the form the agent filled"
                    );
                    return false;
                }
                match state.invocations.remove(id) {
                    Some(waiter) => {
                        let _ = waiter.send(responded);
                    }
                    None => {
                        if state.early.len() == EARLY_ANSWERS {
                            state.early.pop_front();
                        }
                        state.early.push_back((id.to_string(), responded));
                    }
                }
                false
            }
            "Page.frameNavigated" => {
                let frame = &params["frame"];
                let Some(id) = frame["id"].as_str() else {
                    return false;
                };
                let known = Frame {
                    url: frame["url"].as_str().unwrap_or_default().to_string(),
                    origin: frame["securityOrigin"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                };
                if is_main(&frame["id"]) {
                    // A new document: the old one's tools, and its frames,
                    // went with it (Chromium sends no `toolsRemoved`).
                    state.tools.clear();
                    state.frames.clear();
                    state.url = known.url.clone();
                } else {
                    state.drop_frame_tools(id);
                }
                state.frames.insert(id.to_string(), known);
                state.active_at = Instant::now();
                true
            }
            "Page.frameDetached" => {
                let Some(id) = params["frameId"].as_str() else {
                    return false;
                };
                if is_main(&params["frameId"]) {
                    return false;
                }
                state.drop_frame_tools(id);
                state.frames.remove(id);
                true
            }
            "Page.navigatedWithinDocument" if is_main(&params["frameId"]) => {
                state.url = params["url"].as_str().unwrap_or_default().to_string();
                // A requested navigation that stayed in the document.
                state.loading = false;
                true
            }
            "Page.frameRequestedNavigation" | "Page.frameStartedLoading"
                if is_main(&params["frameId"]) =>
            {
                state.loading = true;
                true
            }
            "Page.frameStartedNavigating" if is_main(&params["frameId"]) => {
                let kind = params["navigationType"].as_str().unwrap_or_default();
                if !kind.to_ascii_lowercase().contains("samedocument") {
                    state.loading = true;
                }
                true
            }
            "Page.frameStoppedLoading" if is_main(&params["frameId"]) => {
                state.loading = false;
                state.active_at = Instant::now();
                true
            }
            _ => false,
        }
    }
}

/// The frames of a `Page.getFrameTree` answer, for a tab attached to as
/// it is.
fn frames_of(tree: &Value, out: &mut HashMap<String, Frame>) {
    let frame = &tree["frame"];
    if let Some(id) = frame["id"].as_str() {
        out.insert(
            id.to_string(),
            Frame {
                url: frame["url"].as_str().unwrap_or_default().to_string(),
                origin: frame["securityOrigin"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            },
        );
    }
    for child in tree["childFrames"].as_array().into_iter().flatten() {
        frames_of(child, out);
    }
}

/// A tool of a `toolsAdded` event; `None` without a name or a frame.
fn page_tool(tool: &Value) -> Option<PageTool> {
    let frame_id = tool["frameId"].as_str()?.to_string();
    tool["name"].as_str()?;
    let flag = |name: &str| tool["annotations"][name].as_bool().unwrap_or(false);
    let form_node = tool["backendNodeId"].as_i64();
    Some(PageTool {
        definition: tool_definition(tool),
        frame_id,
        frame_url: None,
        declarative: form_node.is_some(),
        autosubmit: flag("autosubmit"),
        debugging: flag("debugging"),
        offered: false,
        form_node,
    })
}

/// Closes every object of a page tool's schema that lists its properties
/// (and the arguments object itself) to the keys it lists: Chromium refuses
/// a form tool's input with a key its form lacks, and a script's tool never
/// expects one, so a key the schema does not list is refused before the
/// call (naming it) and never produced by the constraint.
fn close_schema(schema: &mut Value, root: bool) {
    let Value::Object(map) = schema else {
        return;
    };
    let is_object = map.get("type").and_then(Value::as_str) == Some("object");
    if root && is_object && !map.contains_key("properties") {
        map.insert("properties".into(), json!({}));
    }
    let lists = map.get("properties").is_some_and(Value::is_object);
    if lists && !map.contains_key("additionalProperties") && !map.contains_key("patternProperties")
    {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for key in ["properties", "$defs", "definitions"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            children.values_mut().for_each(|c| close_schema(c, false));
        }
    }
    if let Some(items) = map.get_mut("items") {
        close_schema(items, false);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(children)) = map.get_mut(key) {
            children.iter_mut().for_each(|c| close_schema(c, false));
        }
    }
}

fn tool_definition(tool: &Value) -> ToolDefinition {
    let mut schema = match tool.get("inputSchema") {
        Some(schema) if schema.is_object() => schema.clone(),
        _ => json!({"type": "object", "properties": {}}),
    };
    close_schema(&mut schema, true);
    let flag = |name: &str| tool["annotations"][name].as_bool().unwrap_or(false);
    ToolDefinition::new(
        tool["name"].as_str().unwrap_or_default(),
        tool["description"].as_str().unwrap_or_default(),
        schema,
    )
    .with_annotations(ToolAnnotations {
        read_only: flag("readOnly"),
        untrusted_content: flag("untrustedContent"),
        consequential: flag("consequential"),
    })
}

/// The tool's own message from a `toolResponded` with status `Error`.
///
/// `exception` is the thrown value as a CDP RemoteObject: an `Error` has a
/// description (`TypeError: message\n    at …`), a thrown string a value.
fn error_message(responded: &Responded) -> String {
    if let Some(exception) = &responded.exception {
        if let Some(description) = exception["description"].as_str() {
            let first = description.lines().next().unwrap_or_default();
            let message = exception["className"]
                .as_str()
                .and_then(|class| first.strip_prefix(class))
                .and_then(|rest| rest.strip_prefix(": "))
                .unwrap_or(first);
            if !message.trim().is_empty() {
                return message.trim().to_string();
            }
        }
        match &exception["value"] {
            Value::Null => {}
            Value::String(text) if !text.trim().is_empty() => return text.trim().to_string(),
            Value::String(_) => {}
            other => return other.to_string(),
        }
    }
    match responded.error_text.as_deref().map(str::trim) {
        Some(text) if !text.is_empty() => text.to_string(),
        _ => "the tool failed without a message".to_string(),
    }
}

/// The model's text for a completed call: strings as they are, anything
/// else as JSON.
fn output_text(output: Option<&Value>) -> String {
    match output {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// A result in MCP's shape (`{content: [{type: "text", text}], isError?}`),
/// which tools written for MCP and for the older WebMCP API return. Only an
/// object made of MCP's result fields and a `content` list of typed blocks
/// counts, so a tool's own JSON that merely has a `content` key is kept.
fn mcp_result(output: &Value) -> Option<Value> {
    let parsed;
    let output = match output {
        Value::String(text) if text.trim_start().starts_with('{') => {
            parsed = serde_json::from_str::<Value>(text).ok()?;
            &parsed
        }
        other => other,
    };
    let fields = output.as_object()?;
    let blocks = fields.get("content")?.as_array()?;
    let known = fields.keys().all(|k| {
        matches!(
            k.as_str(),
            "content" | "isError" | "structuredContent" | "_meta"
        )
    });
    let typed = blocks.iter().all(|b| b["type"].is_string());
    (known && typed).then(|| output.clone())
}

fn responded_result(name: &str, responded: Responded) -> Result<String, ToolError> {
    match responded.status.as_str() {
        "Completed" => match responded.output.as_ref().and_then(mcp_result) {
            Some(result) => {
                let text = crate::mcp::result_text(&result);
                if result["isError"].as_bool() == Some(true) {
                    Err(ToolError::new(
                        ToolErrorCode::ToolFailed,
                        if text.trim().is_empty() {
                            format!("{name} failed without a message")
                        } else {
                            text
                        },
                    ))
                } else {
                    Ok(text)
                }
            }
            None => Ok(output_text(responded.output.as_ref())),
        },
        "Canceled" => Err(ToolError::new(
            ToolErrorCode::Cancelled,
            format!("the page cancelled the call to {name}"),
        )),
        _ => Err(ToolError::new(
            ToolErrorCode::ToolFailed,
            error_message(&responded),
        )),
    }
}

/// A form tool's answer: the browser refusing its input (an error that is
/// no exception of the page's) is the arguments' fault, so the model fixes
/// them; a submit that answered nothing says so, and where it led.
fn form_answer(
    name: &str,
    responded: Responded,
    url_before: &str,
    url_now: &str,
) -> Result<String, ToolError> {
    match responded.status.as_str() {
        "Error" if responded.exception.is_none() => Err(ToolError::new(
            ToolErrorCode::InvalidArguments,
            error_message(&responded),
        )),
        "Completed" if is_empty_output(responded.output.as_ref()) => Ok(if url_now != url_before {
            format!("The form of {name} was submitted; the page is now {url_now}.")
        } else {
            format!("The form of {name} was submitted.")
        }),
        _ => responded_result(name, responded),
    }
}

/// Whether a submit answered nothing: Chromium gives the JSON-LD of the
/// page a form led to, an empty list when it has none.
fn is_empty_output(output: Option<&Value>) -> bool {
    match output {
        None | Some(Value::Null) => true,
        Some(Value::Array(items)) => items.is_empty(),
        Some(Value::String(text)) => text.trim().is_empty(),
        Some(_) => false,
    }
}

/// Reads a form (`this`: the form, or a field of one) as
/// `{fields: {name: value}, missing: [name]}`.
const READ_FORM: &str = r#"function () {
  const form = this.elements ? this : (this.form || this);
  const fields = {};
  const missing = [];
  for (const el of Array.from(form.elements || [])) {
    if (!el.name || el.disabled) continue;
    const type = (el.type || "").toLowerCase();
    if (["submit", "button", "reset", "image", "file"].includes(type)) continue;
    if (el.validity && el.validity.valueMissing && !missing.includes(el.name)) missing.push(el.name);
    if ((type === "checkbox" || type === "radio") && !el.checked) continue;
    let value = el.value;
    if (type === "password") value = value ? "(hidden)" : "";
    else if (el.multiple && el.selectedOptions) value = Array.from(el.selectedOptions, (o) => o.value);
    if (value === "" || (Array.isArray(value) && value.length === 0)) continue;
    fields[el.name] = el.name in fields ? [].concat(fields[el.name], value) : value;
  }
  return { fields, missing };
}"#;

impl WebMcpPage {
    pub(crate) async fn attach(
        browser: Arc<BrowserInner>,
        target_id: &str,
        options: PageOptions,
        close_on_drop: bool,
    ) -> Result<Self, ToolsError> {
        let cdp = browser.cdp.clone();
        let attached = cdp
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target_id, "flatten": true}),
            )
            .await
            .map_err(|e| e.into_tools_error("Target.attachToTarget"))?;
        let session = attached["sessionId"]
            .as_str()
            .ok_or(ToolsError::BrowserClosed)?
            .to_string();
        let mut events = cdp.subscribe(&session);
        let shared = Arc::new(Shared {
            state: Mutex::new(PageState::default()),
            changes: watch::Sender::new(0),
            gone: CancellationToken::new(),
            main_frame: target_id.to_string(),
        });
        let task_shared = shared.clone();
        let browser_closed = cdp.closed();
        let events_task = tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    event = events.recv() => event,
                    _ = browser_closed.cancelled() => None,
                };
                let Some(event) = event else {
                    task_shared.mark_gone("the tab was closed or the browser exited");
                    return;
                };
                if event.method == "Inspector.targetCrashed" {
                    task_shared.mark_gone("the page crashed");
                    return;
                }
                if task_shared.apply(&event) {
                    task_shared.bump();
                }
            }
        });
        let page = Self {
            inner: Arc::new(PageInner {
                browser,
                session,
                target_id: target_id.to_string(),
                options,
                shared,
                close_on_drop,
                events: events_task,
            }),
        };
        page.command("Page.enable", json!({})).await?;
        // The frames a tab attached to as it is already has, so that its
        // frames' tools can be told apart before any of them navigates;
        // what events said meanwhile is newer and stays.
        let tree = page.command("Page.getFrameTree", json!({})).await?;
        {
            let mut known = HashMap::new();
            frames_of(&tree["frameTree"], &mut known);
            let mut state = page.inner.shared.state.lock();
            for (id, frame) in known {
                state.frames.entry(id).or_insert(frame);
            }
        }
        for method in ["Inspector.enable", "WebMCP.enable"] {
            page.command(method, json!({})).await?;
        }
        if page.inner.options.legacy_api {
            // Before the page's own scripts, in every document the tab loads.
            page.command(
                "Page.addScriptToEvaluateOnNewDocument",
                json!({"source": LEGACY_API}),
            )
            .await?;
        }
        // A tab that was attached to keeps its document: start from its
        // address (later navigations update it from events).
        let info = cdp
            .call(None, "Target.getTargetInfo", json!({"targetId": target_id}))
            .await
            .map_err(|e| e.into_tools_error("Target.getTargetInfo"))?;
        if let Some(url) = info["targetInfo"]["url"].as_str() {
            let mut state = page.inner.shared.state.lock();
            if state.url.is_empty() {
                state.url = url.to_string();
            }
        }
        Ok(page)
    }

    async fn command(&self, method: &str, params: Value) -> Result<Value, ToolsError> {
        self.inner
            .browser
            .cdp
            .call(Some(&self.inner.session), method, params)
            .await
            .map_err(|e| e.into_tools_error(method))
    }

    /// The tab's target id.
    pub fn target_id(&self) -> &str {
        &self.inner.target_id
    }

    /// The address of the document on screen.
    pub fn url(&self) -> String {
        self.inner.shared.state.lock().url.clone()
    }

    /// Whether the tab is closed or crashed, or the browser is gone.
    pub fn is_gone(&self) -> bool {
        self.inner.shared.gone.is_cancelled()
    }

    /// A receiver that changes whenever the tool list or the loading state
    /// changes, for hosts that want to react to a page's tools as they come
    /// and go (the loop needs none of it: it lists at every step).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.shared.changes.subscribe()
    }

    /// Calls that were sent to the page and have not answered yet.
    pub fn calls_in_flight(&self) -> usize {
        self.inner.shared.state.lock().invocations.len()
    }

    /// Forms the agent filled that wait for the person's submit.
    pub fn forms_with_person(&self) -> usize {
        self.inner.shared.state.lock().with_person.len()
    }

    /// Every tool the page's frames registered, as they are now (no
    /// waiting), with where each lives, whether it is a form and how it is
    /// annotated; [`PageTool::offered`] says which a listing offers. For
    /// `wma check --tools`, tests and hosts that show a page's tools.
    pub fn page_tools(&self) -> Vec<PageTool> {
        let main = self.inner.shared.main_frame.as_str();
        let state = self.inner.shared.state.lock();
        let offered: Vec<(String, String)> = state
            .offered(main, self.inner.options.debugging_tools)
            .into_iter()
            .map(|t| (t.frame_id.clone(), t.definition.name.clone()))
            .collect();
        state
            .tools
            .iter()
            .map(|tool| {
                let mut tool = tool.clone();
                tool.offered = offered
                    .iter()
                    .any(|(f, n)| *f == tool.frame_id && *n == tool.definition.name);
                if tool.frame_id != main {
                    tool.frame_url = Some(
                        state
                            .frames
                            .get(&tool.frame_id)
                            .map(|f| f.url.clone())
                            .unwrap_or_default(),
                    );
                }
                tool
            })
            .collect()
    }

    /// The offered tool named `name`, if there is one now.
    fn offered_tool(&self, name: &str) -> Option<PageTool> {
        let state = self.inner.shared.state.lock();
        state
            .offered(
                &self.inner.shared.main_frame,
                self.inner.options.debugging_tools,
            )
            .into_iter()
            .find(|t| t.definition.name == name)
            .cloned()
    }

    /// The offered tools' definitions.
    fn offered_definitions(&self) -> Vec<ToolDefinition> {
        let state = self.inner.shared.state.lock();
        state
            .offered(
                &self.inner.shared.main_frame,
                self.inner.options.debugging_tools,
            )
            .into_iter()
            .map(|t| t.definition.clone())
            .collect()
    }

    /// Waits until the tool set has stayed unchanged for
    /// [`PageOptions::tools_quiet`] since the page last loaded, changed its
    /// tools or answered a call, for [`TOOLS_QUIET_LIMIT`] at most. A page
    /// that settled long ago costs nothing.
    async fn tools_settled(&self) {
        let quiet = self.inner.options.tools_quiet;
        if quiet.is_zero() {
            return;
        }
        let shared = &self.inner.shared;
        let mut changes = shared.changes.subscribe();
        let limit = Instant::now() + TOOLS_QUIET_LIMIT;
        loop {
            let still_at = {
                let state = shared.state.lock();
                if state.gone.is_some() {
                    return;
                }
                state.active_at + quiet
            };
            let now = Instant::now();
            if still_at <= now || limit <= now {
                return;
            }
            // Woken by any change (which may move `active_at`) or at the
            // time the set would have been quiet long enough.
            let _ = tokio::time::timeout_at(still_at.min(limit), changes.changed()).await;
        }
    }

    /// Asks Chromium again for every registered tool (turning the `WebMCP`
    /// domain off and on makes it report them all), for a listing that
    /// would otherwise offer nothing: a page whose tools were reported in
    /// a way the events missed still gets them offered.
    async fn reread_tools(&self) {
        for method in ["WebMCP.disable", "WebMCP.enable"] {
            if let Err(error) = self.command(method, json!({})).await {
                tracing::debug!(%error, "could not read the page's tools again");
                return;
            }
        }
        self.inner.shared.state.lock().active_at = Instant::now();
        self.tools_settled().await;
    }

    /// What a form holds now: its named fields' values (a password shown
    /// as hidden) and the required fields still empty.
    async fn read_form(&self, node: i64) -> Result<Value, ToolsError> {
        let resolved = self
            .command("DOM.resolveNode", json!({"backendNodeId": node}))
            .await?;
        let object = resolved["object"]["objectId"]
            .as_str()
            .ok_or_else(|| ToolsError::Cdp {
                method: "DOM.resolveNode".to_string(),
                message: "the form has no object".to_string(),
            })?
            .to_string();
        let read = self
            .command(
                "Runtime.callFunctionOn",
                json!({
                    "objectId": object,
                    "functionDeclaration": READ_FORM,
                    "returnByValue": true,
                }),
            )
            .await;
        let _ = self
            .command("Runtime.releaseObject", json!({"objectId": object}))
            .await;
        Ok(read?["result"]["value"].clone())
    }

    /// The answer of a form tool without autosubmit whose form Chromium
    /// filled: what it holds now, and that it waits for the person.
    async fn filled_form(&self, tool: &PageTool, input: &Value) -> String {
        let read = match tool.form_node {
            Some(node) => self.read_form(node).await,
            None => Err(ToolsError::BrowserClosed),
        };
        let (fields, missing) = match read {
            Ok(form) if form["fields"].is_object() => {
                (form["fields"].clone(), form["missing"].clone())
            }
            Ok(_) | Err(_) => {
                tracing::debug!(tool = %tool.definition.name, "could not read the filled form back");
                (input.clone(), Value::Null)
            }
        };
        let mut text = format!(
            "The form of {} is filled in on the page and waits for the person to submit it; nothing was sent yet. Filled in: {fields}.",
            tool.definition.name
        );
        if let Some(missing) = missing.as_array().filter(|m| !m.is_empty()) {
            text.push_str(&format!(
                " Still empty and required: {}.",
                Value::Array(missing.clone())
            ));
        }
        text.push_str(" Tell the person to check the form and press its submit button.");
        text
    }

    /// Loads `url` in the tab and waits until it has loaded.
    pub async fn navigate(&self, url: &str) -> Result<(), ToolsError> {
        {
            self.inner.shared.state.lock().loading = true;
        }
        let navigated = self.command("Page.navigate", json!({"url": url})).await;
        let navigated = match navigated {
            Ok(navigated) => navigated,
            Err(error) => {
                self.inner.shared.state.lock().loading = false;
                return Err(error);
            }
        };
        if let Some(reason) = navigated["errorText"].as_str().filter(|e| !e.is_empty()) {
            self.inner.shared.state.lock().loading = false;
            return Err(ToolsError::Navigation {
                url: url.to_string(),
                reason: reason.to_string(),
            });
        }
        if navigated.get("loaderId").is_none() {
            // A fragment change: no new document is loaded.
            self.inner.shared.state.lock().loading = false;
        }
        if !self.settled().await {
            return Err(ToolsError::BrowserTimeout {
                what: format!("the page {url} to load"),
                seconds: self.inner.options.settle_timeout.as_secs_f32(),
            });
        }
        Ok(())
    }

    /// Runs a JavaScript expression in the page and returns its value (a
    /// promise is awaited). For reading what a page shows, in tests and
    /// examples.
    pub async fn evaluate(&self, expression: &str) -> Result<Value, ToolsError> {
        let evaluated = self
            .command(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await?;
        if let Some(details) = evaluated.get("exceptionDetails") {
            let message = details["exception"]["description"]
                .as_str()
                .or(details["text"].as_str())
                .unwrap_or("the expression threw");
            return Err(ToolsError::Cdp {
                method: "Runtime.evaluate".to_string(),
                message: message.to_string(),
            });
        }
        Ok(evaluated["result"]["value"].clone())
    }

    /// Closes the tab.
    pub async fn close(&self) {
        let _ = self
            .inner
            .browser
            .cdp
            .call(
                None,
                "Target.closeTarget",
                json!({"targetId": self.inner.target_id}),
            )
            .await;
    }

    /// Waits until no navigation is under way (or the page is gone).
    /// Returns false when the settle timeout ran out first.
    async fn settled(&self) -> bool {
        let shared = &self.inner.shared;
        let mut changes = shared.changes.subscribe();
        let deadline = tokio::time::Instant::now() + self.inner.options.settle_timeout;
        loop {
            {
                let state = shared.state.lock();
                if !state.loading || state.gone.is_some() {
                    return true;
                }
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return true,
                Err(_) => {
                    tracing::warn!(
                        url = %shared.state.lock().url,
                        "the page is still loading; going on with the tools it has"
                    );
                    return false;
                }
            }
        }
    }

    fn gone_error(&self) -> Option<ToolError> {
        self.inner.shared.state.lock().gone.as_ref().map(|reason| {
            ToolError::new(
                ToolErrorCode::Unavailable,
                format!("the page is not available: {reason}"),
            )
        })
    }

    /// Registers a waiter for an invocation's answer, or finds the answer
    /// if it already came.
    ///
    /// Fails when the page is already gone: the tab can crash or detach
    /// between the browser's answer to `invokeTool` and this registration,
    /// and [`Shared::mark_gone`] has then already failed the waiters it
    /// knew of; a waiter added afterwards would never be answered. Checking
    /// `gone` under the same lock `mark_gone` takes closes that gap.
    fn await_answer(&self, invocation: &str) -> Result<oneshot::Receiver<Responded>, ToolError> {
        let (sender, receiver) = oneshot::channel();
        let mut state = self.inner.shared.state.lock();
        match state.early.iter().position(|(id, _)| id == invocation) {
            Some(index) => {
                // An answer that came before the crash still stands.
                let (_, responded) = state.early.remove(index).expect("index is in range");
                let _ = sender.send(responded);
            }
            None => {
                if let Some(reason) = &state.gone {
                    return Err(ToolError::new(
                        ToolErrorCode::Unavailable,
                        format!("the page is not available: {reason}"),
                    ));
                }
                state.invocations.insert(invocation.to_string(), sender);
            }
        }
        Ok(receiver)
    }

    /// Asks the page to cancel an invocation; waits briefly for its answer.
    /// Returns whether the page confirmed.
    async fn cancel_invocation(
        &self,
        invocation: &str,
        answer: &mut oneshot::Receiver<Responded>,
    ) -> bool {
        let cancelled = self
            .command(
                "WebMCP.cancelInvocation",
                json!({"invocationId": invocation}),
            )
            .await;
        let confirmed = match cancelled {
            Ok(_) => matches!(
                tokio::time::timeout(CANCEL_CONFIRM_WAIT, answer).await,
                Ok(Ok(Responded { ref status, .. })) if status == "Canceled"
            ),
            Err(_) => false,
        };
        self.inner
            .shared
            .state
            .lock()
            .invocations
            .remove(invocation);
        confirmed
    }
}

/// A page cannot reopen itself ([`WebMcpSource`](crate::WebMcpSource)
/// can): once gone it stays down.
impl crate::health::Monitored for WebMcpPage {
    fn status(&self) -> crate::health::SourceStatus {
        let state = if self.is_gone() {
            crate::health::SourceState::Down {
                reason: "the page is gone (its tab closed or its browser stopped)".to_string(),
            }
        } else {
            crate::health::SourceState::Ready
        };
        crate::health::SourceStatus { state, restarts: 0 }
    }
}

impl std::fmt::Debug for WebMcpPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebMcpPage")
            .field("target_id", &self.inner.target_id)
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ToolHost for WebMcpPage {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        self.settled().await;
        self.tools_settled().await;
        let tools = self.offered_definitions();
        if !tools.is_empty() || self.is_gone() {
            return tools;
        }
        self.reread_tools().await;
        self.offered_definitions()
    }

    async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        self.settled().await;
        if let Some(error) = self.gone_error() {
            return Err(error);
        }
        let Some(tool) = self.offered_tool(name) else {
            let url = self.url();
            return Err(ToolError::new(
                ToolErrorCode::UnknownTool,
                format!("no tool named \"{name}\" on this page ({url})"),
            ));
        };
        let input = match arguments {
            Value::Object(_) => arguments,
            Value::Null => json!({}),
            other => {
                return Err(ToolError::new(
                    ToolErrorCode::InvalidArguments,
                    format!("the arguments must be an object, got {other}"),
                ));
            }
        };
        if cancel.is_cancelled() {
            return Err(ToolError::new(
                ToolErrorCode::Cancelled,
                "the call was cancelled",
            ));
        }
        // In the trace of the call (its `execute_tool` span): which kind of
        // page tool ran, and whether its form submits itself.
        tracing::info!(
            tool = %name,
            frame = %tool.frame_id,
            declarative = tool.declarative,
            autosubmit = tool.autosubmit,
            "calling a page tool"
        );
        let url_before = self.url();
        let invoked = self
            .inner
            .browser
            .cdp
            .call(
                Some(&self.inner.session),
                "WebMCP.invokeTool",
                json!({"frameId": tool.frame_id, "toolName": name, "input": input}),
            )
            .await;
        let invocation = match invoked {
            Ok(invoked) => invoked["invocationId"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            Err(CdpError::Remote { message, .. }) if message.contains("not found") => {
                // The tool went away between the listing and the call.
                return Err(ToolError::new(
                    ToolErrorCode::UnknownTool,
                    format!("no tool named \"{name}\" on this page ({})", self.url()),
                ));
            }
            Err(CdpError::Remote { message, .. }) => {
                return Err(ToolError::new(ToolErrorCode::Unavailable, message));
            }
            Err(CdpError::Closed) => {
                return Err(self.gone_error().unwrap_or_else(|| {
                    ToolError::new(ToolErrorCode::Unavailable, "the browser is gone")
                }));
            }
            Err(CdpError::Timeout) => {
                return Err(ToolError::new(
                    ToolErrorCode::Timeout,
                    format!("the browser did not start {name}"),
                ));
            }
        };
        let mut answer = self.await_answer(&invocation)?;
        let answered = |responded: Responded| {
            self.inner.shared.state.lock().active_at = Instant::now();
            if tool.declarative {
                form_answer(name, responded, &url_before, &self.url())
            } else {
                responded_result(name, responded)
            }
        };
        if tool.declarative && !tool.autosubmit {
            // Chromium fills the form and leaves its submit to the person:
            // no answer comes until they press it. A refused input answers
            // at once; otherwise the call answers with the filled form, and
            // the person's submit, when it comes, is only noted.
            tokio::select! {
                biased;
                responded = &mut answer => {
                    return match responded {
                        Ok(responded) => answered(responded),
                        Err(_) => Err(self.gone_error().unwrap_or_else(|| {
                            ToolError::new(ToolErrorCode::Unavailable, format!("the page went away before {name} answered"))
                        })),
                    };
                }
                _ = tokio::time::sleep(FORM_FILL_WAIT) => {}
            }
            {
                let mut state = self.inner.shared.state.lock();
                if state.invocations.remove(&invocation).is_some() {
                    state
                        .with_person
                        .insert(invocation.clone(), name.to_string());
                }
            }
            if let Ok(responded) = answer.try_recv() {
                // It answered in the moment between.
                return answered(responded);
            }
            let filled = self.filled_form(&tool, &input).await;
            self.inner.shared.state.lock().active_at = Instant::now();
            tracing::info!(tool = %name, "the form is filled and waits for the person's submit");
            return Ok(filled);
        }
        // No timer of its own: the `ToolSet` that holds the page times
        // every call (one default, overridden per source) and cancels the
        // token on expiry, which cancels the invocation in the page below.
        tokio::select! {
            // Biased so that an answer already there wins over a crash or
            // a cancellation noticed in the same poll.
            biased;
            responded = &mut answer => match responded {
                Ok(responded) => answered(responded),
                Err(_) => Err(self.gone_error().unwrap_or_else(|| {
                    ToolError::new(ToolErrorCode::Unavailable, format!("the page went away before {name} answered"))
                })),
            },
            _ = cancel.cancelled() => {
                let confirmed = self.cancel_invocation(&invocation, &mut answer).await;
                Err(ToolError::new(
                    ToolErrorCode::Cancelled,
                    if confirmed {
                        format!("the call to {name} was cancelled")
                    } else {
                        format!("the call to {name} was cancelled (the page did not confirm)")
                    },
                ))
            }
        }
    }

    async fn page_context(&self) -> Option<PageContext> {
        self.settled().await;
        let context = self
            .evaluate(
                "(() => { const h = document.querySelector('main h1') || document.querySelector('h1');
                  return {path: location.pathname, title: document.title,
                          h1: h ? h.textContent.replace(/\\s+/g, ' ').trim() : null}; })()",
            )
            .await;
        match context {
            Ok(context) => serde_json::from_value(context).ok(),
            Err(error) => {
                tracing::debug!(%error, "no page context");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        Shared {
            state: Mutex::new(PageState::default()),
            changes: watch::Sender::new(0),
            gone: CancellationToken::new(),
            main_frame: "MAIN".into(),
        }
    }

    fn event(method: &str, params: Value) -> CdpEvent {
        CdpEvent {
            method: method.into(),
            params,
        }
    }

    fn names(shared: &Shared) -> Vec<String> {
        shared
            .state
            .lock()
            .offered("MAIN", false)
            .iter()
            .map(|t| t.definition.name.clone())
            .collect()
    }

    #[test]
    fn tools_follow_the_document_of_the_main_frame() {
        let s = shared();
        s.apply(&event(
            "WebMCP.toolsAdded",
            json!({"tools": [
                {"name": "search", "description": "Search.", "frameId": "MAIN",
                 "annotations": {"readOnly": true, "untrustedContent": true}},
                {"name": "ad", "description": "From an iframe.", "frameId": "CHILD"}]}),
        ));
        assert_eq!(names(&s), ["search"]);
        let search = s.state.lock().tools[0].definition.clone();
        assert!(search.annotations.read_only && search.annotations.untrusted_content);
        assert_eq!(
            search.input_schema,
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );

        s.apply(&event(
            "Page.frameStartedNavigating",
            json!({"frameId": "MAIN", "navigationType": "differentDocument"}),
        ));
        assert!(s.state.lock().loading);
        s.apply(&event(
            "Page.frameNavigated",
            json!({"frame": {"id": "MAIN", "url": "http://127.0.0.1/products/p-17"}}),
        ));
        assert!(names(&s).is_empty(), "a new document starts without tools");
        s.apply(&event(
            "WebMCP.toolsAdded",
            json!({"tools": [{"name": "add_to_cart", "frameId": "MAIN"}]}),
        ));
        s.apply(&event(
            "Page.frameStoppedLoading",
            json!({"frameId": "MAIN"}),
        ));
        assert!(!s.state.lock().loading);
        assert_eq!(names(&s), ["add_to_cart"]);
        s.apply(&event(
            "WebMCP.toolsRemoved",
            json!({"tools": [{"name": "add_to_cart", "frameId": "MAIN"}]}),
        ));
        assert!(names(&s).is_empty());
    }

    fn navigated(s: &Shared, id: &str, parent: Option<&str>, url: &str, origin: &str) {
        let mut frame = json!({"id": id, "url": url, "securityOrigin": origin});
        if let Some(parent) = parent {
            frame["parentId"] = json!(parent);
        }
        s.apply(&event("Page.frameNavigated", json!({ "frame": frame })));
    }

    #[test]
    fn frames_of_the_same_origin_add_tools_and_others_do_not() {
        let s = shared();
        navigated(
            &s,
            "MAIN",
            None,
            "http://127.0.0.1:8080/",
            "http://127.0.0.1:8080",
        );
        navigated(
            &s,
            "WIDGET",
            Some("MAIN"),
            "http://127.0.0.1:8080/w.html",
            "http://127.0.0.1:8080",
        );
        navigated(
            &s,
            "AD",
            Some("MAIN"),
            "http://ads.test/",
            "http://ads.test",
        );
        s.apply(&event(
            "WebMCP.toolsAdded",
            json!({"tools": [
                {"name": "hours", "frameId": "WIDGET"},
                {"name": "buy_now", "frameId": "AD"},
                {"name": "search", "frameId": "MAIN"},
                {"name": "search", "frameId": "WIDGET"},
                {"name": "orphan", "frameId": "UNKNOWN"}]}),
        ));
        assert_eq!(names(&s), ["search", "hours"], "the main frame's name wins");
        let offered = s.state.lock().offered("MAIN", false)[1].frame_id.clone();
        assert_eq!(offered, "WIDGET");
        // The widget loads another document: its tools went with the old one.
        navigated(
            &s,
            "WIDGET",
            Some("MAIN"),
            "http://127.0.0.1:8080/x.html",
            "http://127.0.0.1:8080",
        );
        assert_eq!(names(&s), ["search"]);
        s.apply(&event(
            "WebMCP.toolsAdded",
            json!({"tools": [{"name": "hours", "frameId": "WIDGET"}]}),
        ));
        s.apply(&event("Page.frameDetached", json!({"frameId": "WIDGET"})));
        assert_eq!(names(&s), ["search"]);
    }

    #[test]
    fn debugging_tools_and_forms_are_read_from_their_annotations() {
        let s = shared();
        s.apply(&event(
            "WebMCP.toolsAdded",
            json!({"tools": [
                {"name": "dump", "frameId": "MAIN", "annotations": {"debugging": true}},
                {"name": "book", "frameId": "MAIN", "backendNodeId": 7,
                 "inputSchema": {"type": "object", "properties": {"guest": {"type": "string"}}}},
                {"name": "find", "frameId": "MAIN", "backendNodeId": 9,
                 "annotations": {"autosubmit": true, "consequential": true}}]}),
        ));
        assert_eq!(names(&s), ["book", "find"]);
        let state = s.state.lock();
        assert_eq!(state.offered("MAIN", true).len(), 3);
        let book = &state.tools[1];
        assert!(book.declarative && !book.autosubmit && book.form_node == Some(7));
        let find = &state.tools[2];
        assert!(find.autosubmit && find.definition.annotations.consequential);
    }

    #[test]
    fn page_schemas_are_closed_to_the_keys_they_list() {
        let mut schema = json!({"type": "object", "properties": {
            "door": {"type": "string"},
            "address": {"type": "object", "properties": {"street": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {}}}},
            "extra": {"type": "object", "additionalProperties": {"type": "string"}}
        }});
        close_schema(&mut schema, true);
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(
            schema["properties"]["address"]["additionalProperties"],
            false
        );
        assert_eq!(
            schema["properties"]["tags"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(
            schema["properties"]["extra"]["additionalProperties"],
            json!({"type": "string"}),
            "a schema that says what else it takes keeps it"
        );
        let mut bare = json!({"type": "object"});
        close_schema(&mut bare, true);
        assert_eq!(
            bare,
            json!({"type": "object", "properties": {}, "additionalProperties": false})
        );
        let refused = wma_agent::validate_args(&schema, &json!({"door": "back", "door_name": "x"}));
        assert!(
            matches!(&refused, Err(wma_agent::ArgsError::Invalid(m)) if m.contains("\"door_name\"")),
            "{refused:?}"
        );
    }

    #[test]
    fn a_form_that_refuses_its_input_is_the_arguments_fault() {
        let refused = Responded {
            status: "Error".into(),
            output: None,
            error_text: Some(
                "Input contains a parameter \"door_name\" but there is no such parameter for the tool".into(),
            ),
            exception: None,
        };
        let error = form_answer("book", refused, "http://h/", "http://h/").unwrap_err();
        assert_eq!(error.code, ToolErrorCode::InvalidArguments);
        assert!(error.message.contains("\"door_name\""), "{error:?}");
        assert_eq!(
            form_answer("book", completed(json!([])), "http://h/", "http://h/thanks").unwrap(),
            "The form of book was submitted; the page is now http://h/thanks."
        );
        let data = json!([{"@type": "Reservation", "reservationId": "R-1"}]);
        assert_eq!(
            form_answer(
                "book",
                completed(data.clone()),
                "http://h/",
                "http://h/done"
            )
            .unwrap(),
            data.to_string()
        );
    }

    #[test]
    fn a_same_document_navigation_keeps_the_tools() {
        let s = shared();
        s.apply(&event(
            "WebMCP.toolsAdded",
            json!({"tools": [{"name": "search", "frameId": "MAIN"}]}),
        ));
        s.apply(&event(
            "Page.frameStartedNavigating",
            json!({"frameId": "MAIN", "navigationType": "sameDocument"}),
        ));
        assert!(!s.state.lock().loading);
        s.apply(&event(
            "Page.frameRequestedNavigation",
            json!({"frameId": "MAIN"}),
        ));
        s.apply(&event(
            "Page.navigatedWithinDocument",
            json!({"frameId": "MAIN", "url": "http://127.0.0.1/#cart"}),
        ));
        assert!(!s.state.lock().loading);
        assert_eq!(names(&s), ["search"]);
    }

    #[test]
    fn an_answer_that_comes_first_is_kept_for_its_call() {
        let s = shared();
        s.apply(&event(
            "WebMCP.toolResponded",
            json!({"invocationId": "I1", "status": "Completed", "output": "ok"}),
        ));
        assert_eq!(s.state.lock().early.len(), 1);
        let (sender, mut receiver) = oneshot::channel();
        s.state.lock().invocations.insert("I2".into(), sender);
        s.apply(&event(
            "WebMCP.toolResponded",
            json!({"invocationId": "I2", "status": "Completed", "output": {"n": 1}}),
        ));
        let responded = receiver.try_recv().unwrap();
        assert_eq!(responded_result("t", responded).unwrap(), r#"{"n":1}"#);
    }

    #[test]
    fn a_thrown_error_keeps_the_tools_own_message() {
        let thrown = Responded {
            status: "Error".into(),
            output: None,
            error_text: Some(String::new()),
            exception: Some(
                json!({"type": "object", "subtype": "error", "className": "Error",
                "description": "Error: Ridge Hiking Boots are out of stock\n    at execute (http://127.0.0.1/shop.js:6:36)"}),
            ),
        };
        let error = responded_result("add_to_cart", thrown).unwrap_err();
        assert_eq!(error.code, ToolErrorCode::ToolFailed);
        assert_eq!(error.message, "Ridge Hiking Boots are out of stock");

        let string = Responded {
            status: "Error".into(),
            output: None,
            error_text: None,
            exception: Some(json!({"type": "string", "value": "plain words"})),
        };
        assert_eq!(error_message(&string), "plain words");
        let bare = Responded {
            status: "Error".into(),
            output: None,
            error_text: Some("Tool execution failed".into()),
            exception: None,
        };
        assert_eq!(error_message(&bare), "Tool execution failed");
        let cancelled = Responded {
            status: "Canceled".into(),
            output: None,
            error_text: None,
            exception: None,
        };
        assert_eq!(
            responded_result("t", cancelled).unwrap_err().code,
            ToolErrorCode::Cancelled
        );
    }

    fn completed(output: Value) -> Responded {
        Responded {
            status: "Completed".into(),
            output: Some(output),
            error_text: None,
            exception: None,
        }
    }

    #[test]
    fn mcp_style_results_reach_the_model_as_their_text() {
        let result = json!({"content": [
            {"type": "text", "text": "Hello, Ada."},
            {"type": "text", "text": "Welcome back."}]});
        assert_eq!(
            responded_result("greet", completed(result.clone())).unwrap(),
            "Hello, Ada.\nWelcome back."
        );
        // Chromium may hand the result over as the JSON text of the object.
        assert_eq!(
            responded_result("greet", completed(json!(result.to_string()))).unwrap(),
            "Hello, Ada.\nWelcome back."
        );
        let failed =
            json!({"content": [{"type": "text", "text": "No table tonight."}], "isError": true});
        let error = responded_result("reserve", completed(failed)).unwrap_err();
        assert_eq!(error.code, ToolErrorCode::ToolFailed);
        assert_eq!(error.message, "No table tonight.");
        let silent = json!({"content": [], "isError": true});
        assert_eq!(
            responded_result("reserve", completed(silent))
                .unwrap_err()
                .message,
            "reserve failed without a message"
        );
    }

    #[test]
    fn a_tools_own_json_with_a_content_key_is_kept_as_it_is() {
        for own in [
            json!({"content": "a blog post", "author": "Ada"}),
            json!({"content": [{"type": "text", "text": "x"}], "author": "Ada"}),
            json!({"content": [1, 2, 3]}),
        ] {
            assert_eq!(
                responded_result("read", completed(own.clone())).unwrap(),
                own.to_string()
            );
        }
        assert_eq!(
            responded_result("read", completed(json!("plain text"))).unwrap(),
            "plain text"
        );
    }
}
