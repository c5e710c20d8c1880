//! A tool host whose tools are closures.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use wma_agent::{CallContext, PageContext, ToolDefinition, ToolError, ToolErrorCode, ToolHost};

/// A tool's body.
pub type ToolFn = Arc<dyn Fn(Value) -> Result<String, ToolError> + Send + Sync>;

/// One call the host received.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    /// The tool.
    pub name: String,
    /// Its arguments.
    pub arguments: Value,
    /// The idempotency key it came with ([`CallContext`]), if any.
    pub idempotency_key: Option<String>,
}

struct Tool {
    definition: ToolDefinition,
    body: ToolFn,
    delay: Option<Duration>,
}

#[derive(Default)]
struct Inner {
    tools: Vec<Tool>,
    calls: Vec<RecordedCall>,
    page: Option<PageContext>,
    list_count: usize,
}

/// A [`ToolHost`] backed by closures. Cheap to share behind an `Arc`.
#[derive(Default)]
pub struct InMemoryToolHost {
    inner: Mutex<Inner>,
}

impl InMemoryToolHost {
    /// An empty host.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool.
    pub fn add<F>(&self, definition: ToolDefinition, body: F) -> &Self
    where
        F: Fn(Value) -> Result<String, ToolError> + Send + Sync + 'static,
    {
        self.inner.lock().tools.push(Tool {
            definition,
            body: Arc::new(body),
            delay: None,
        });
        self
    }

    /// Adds a tool that takes `delay` before it answers (cancellation ends the wait).
    pub fn add_slow<F>(&self, definition: ToolDefinition, delay: Duration, body: F) -> &Self
    where
        F: Fn(Value) -> Result<String, ToolError> + Send + Sync + 'static,
    {
        self.inner.lock().tools.push(Tool {
            definition,
            body: Arc::new(body),
            delay: Some(delay),
        });
        self
    }

    /// Removes a tool by name.
    pub fn remove(&self, name: &str) {
        self.inner
            .lock()
            .tools
            .retain(|t| t.definition.name != name);
    }

    /// Sets the page context.
    pub fn set_page(&self, page: Option<PageContext>) {
        self.inner.lock().page = page;
    }

    /// Calls received, in order.
    pub fn calls(&self) -> Vec<RecordedCall> {
        self.inner.lock().calls.clone()
    }

    /// How many times the tools were listed.
    pub fn list_count(&self) -> usize {
        self.inner.lock().list_count
    }
}

#[async_trait]
impl ToolHost for InMemoryToolHost {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        let mut inner = self.inner.lock();
        inner.list_count += 1;
        inner.tools.iter().map(|t| t.definition.clone()).collect()
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

    async fn call_tool_with(
        &self,
        name: &str,
        arguments: Value,
        context: &CallContext,
        cancel: CancellationToken,
    ) -> Result<String, ToolError> {
        let (body, delay) = {
            let mut inner = self.inner.lock();
            inner.calls.push(RecordedCall {
                name: name.to_string(),
                arguments: arguments.clone(),
                idempotency_key: context.idempotency_key.clone(),
            });
            match inner.tools.iter().find(|t| t.definition.name == name) {
                Some(tool) => (tool.body.clone(), tool.delay),
                None => {
                    return Err(ToolError::new(
                        ToolErrorCode::UnknownTool,
                        format!("no tool named {name}"),
                    ));
                }
            }
        };
        if let Some(delay) = delay {
            tokio::select! {
                _ = cancel.cancelled() => {
                    return Err(ToolError::new(ToolErrorCode::Cancelled, "the call was cancelled"));
                }
                _ = tokio::time::sleep(delay) => {}
            }
        }
        body(arguments)
    }

    async fn page_context(&self) -> Option<PageContext> {
        self.inner.lock().page.clone()
    }
}
