//! A page that opens itself, and opens itself again when it died.

use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use wma_agent::{PageContext, ToolDefinition, ToolError, ToolErrorCode, ToolHost};

use crate::error::ToolsError;
use crate::webmcp::browser::{Browser, BrowserOptions};
use crate::webmcp::page::{PageOptions, WebMcpPage};

/// A WebMCP page as a tool source that looks after its browser: it starts
/// Chromium and opens `url` on first use, and does both again when the
/// browser crashed, was killed or the tab closed. The call that was running
/// when the page died answers `unavailable`; the next one finds a fresh
/// page (at `url`, so a page's own state, such as where it had navigated
/// to, starts over).
///
/// Its constructor does no work, so it fits the runtime's synchronous
/// `ToolSource::new(|| …)` builders.
pub struct WebMcpSource {
    url: String,
    browser_options: BrowserOptions,
    page_options: PageOptions,
    current: tokio::sync::Mutex<Option<(Browser, WebMcpPage)>>,
    /// Pages opened after the first one.
    reopened: AtomicU32,
}

impl std::fmt::Debug for WebMcpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebMcpSource")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl WebMcpSource {
    /// A source for the page at `url`, in a browser started with `options`.
    pub fn new(url: impl Into<String>, options: BrowserOptions) -> Self {
        Self::with_page_options(url, options, PageOptions::default())
    }

    /// The same, with page options.
    pub fn with_page_options(
        url: impl Into<String>,
        browser_options: BrowserOptions,
        page_options: PageOptions,
    ) -> Self {
        Self {
            url: url.into(),
            browser_options,
            page_options,
            current: tokio::sync::Mutex::new(None),
            reopened: AtomicU32::new(0),
        }
    }

    /// Times the page was opened again after it died.
    pub fn reopened(&self) -> u32 {
        self.reopened.load(Ordering::SeqCst)
    }

    /// The page, opening it (and the browser) when there is none or it died.
    pub async fn page(&self) -> Result<WebMcpPage, ToolsError> {
        let mut current = self.current.lock().await;
        if let Some((_, page)) = current.as_ref()
            && !page.is_gone()
        {
            return Ok(page.clone());
        }
        let had_one = current.take().is_some();
        if had_one {
            tracing::warn!(url = %self.url, "the page is gone; opening it again");
        }
        let browser = Browser::launch(self.browser_options.clone()).await?;
        let page = browser
            .open_with(&self.url, self.page_options.clone())
            .await?;
        if had_one {
            self.reopened.fetch_add(1, Ordering::SeqCst);
        }
        *current = Some((browser, page.clone()));
        Ok(page)
    }

    /// The browser of the current page, if one is open.
    pub async fn browser(&self) -> Option<Browser> {
        self.current.lock().await.as_ref().map(|(b, _)| b.clone())
    }
}

#[async_trait]
impl ToolHost for WebMcpSource {
    async fn list_tools(&self) -> Vec<ToolDefinition> {
        match self.page().await {
            Ok(page) => page.list_tools().await,
            Err(error) => {
                tracing::warn!(url = %self.url, %error, "no tools from the page");
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
        let page = self
            .page()
            .await
            .map_err(|e| ToolError::new(ToolErrorCode::Unavailable, e.to_string()))?;
        page.call_tool(name, arguments, cancel).await
    }

    async fn page_context(&self) -> Option<PageContext> {
        self.page().await.ok()?.page_context().await
    }
}
