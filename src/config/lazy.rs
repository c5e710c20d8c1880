//! Tool sources that must connect before they serve (an MCP server, a
//! browser page): connected on first use, and again after a failure.

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use wma_agent::{PageContext, ToolDefinition, ToolError, ToolErrorCode, ToolHost};

type Connect<H> =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<H, String>> + Send>> + Send + Sync>;

/// A host made by an async `connect`, the first time a run needs it. The
/// runtime builds tool sources synchronously (and again when it restarts
/// its tool bridge), so connecting waits for the first listing; a source
/// that cannot connect offers no tools and answers calls with
/// `unavailable`, and the next use tries again.
pub(crate) struct Lazy<H> {
    /// Names the source in messages.
    label: String,
    connect: Connect<H>,
    host: OnceCell<H>,
}

impl<H: ToolHost + 'static> Lazy<H> {
    pub(crate) fn new<F, Fut>(label: impl Into<String>, connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<H, String>> + Send + 'static,
    {
        Self {
            label: label.into(),
            connect: Box::new(move || Box::pin(connect())),
            host: OnceCell::new(),
        }
    }

    async fn host(&self) -> Result<&H, String> {
        self.host.get_or_try_init(|| (self.connect)()).await
    }
}

#[async_trait]
impl<H: ToolHost + 'static> ToolHost for Lazy<H> {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        match self.host().await {
            Ok(host) => host.list_tools().await,
            Err(error) => {
                tracing::warn!(source = %self.label, %error, "a tool source could not connect; it offers no tools this step");
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
        match self.host().await {
            Ok(host) => host.call_tool(name, arguments, cancel).await,
            Err(error) => Err(ToolError::new(
                ToolErrorCode::Unavailable,
                format!(
                    "the tool source `{}` could not connect: {error}",
                    self.label
                ),
            )),
        }
    }

    async fn page_context(&self) -> Option<PageContext> {
        match self.host.get() {
            Some(host) => host.page_context().await,
            None => None,
        }
    }
}
