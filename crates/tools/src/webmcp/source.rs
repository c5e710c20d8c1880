//! A page that opens itself, and opens itself again when it died.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use wma_agent::{PageContext, ToolDefinition, ToolError, ToolErrorCode, ToolHost};

use crate::error::ToolsError;
use crate::health::{
    DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_WINDOW, Monitored, RestartBudget, SourceState,
    SourceStatus,
};
use crate::webmcp::browser::{Browser, BrowserOptions};
use crate::webmcp::page::{PageOptions, WebMcpPage};

/// A WebMCP page as a tool source that looks after its browser: it starts
/// Chromium and opens `url` on first use, and does both again when the
/// browser crashed, was killed or the tab closed. The call that was running
/// when the page died answers `unavailable`; the next one finds a fresh
/// page (at `url`, so a page's own state, such as where it had navigated
/// to, starts over). Reopening is bounded by a restart budget
/// ([`DEFAULT_MAX_RESTARTS`] per [`DEFAULT_RESTART_WINDOW`], or
/// [`WebMcpSource::restart_budget`]): a page that keeps killing its browser
/// is left down until the window has passed, and [`Monitored::status`]
/// says so.
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
    budget: RestartBudget,
    /// Why the page last died or failed to open, for health reports.
    last_error: Mutex<Option<String>>,
    /// A first page was opened once; opening another is a restart.
    opened: AtomicBool,
    /// A browser is being started and the page opened.
    opening: AtomicBool,
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
            budget: RestartBudget::new(DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_WINDOW),
            last_error: Mutex::new(None),
            opened: AtomicBool::new(false),
            opening: AtomicBool::new(false),
        }
    }

    /// Allows `max` reopenings within `window` instead of the default.
    pub fn restart_budget(mut self, max: u32, window: Duration) -> Self {
        self.budget = RestartBudget::new(max, window);
        self
    }

    fn note_error(&self, reason: &str) {
        *self.last_error.lock() = Some(reason.to_string());
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
        if current.take().is_some() {
            self.note_error("the page is gone (its tab closed or its browser stopped)");
        }
        // A page that opened once and is gone now (or failed to open
        // again) takes from the budget; the first opening does not.
        let reopening = self.opened.load(Ordering::SeqCst);
        if reopening {
            if let Err(refusal) = self.budget.take(&format!("the page {}", self.url)) {
                self.note_error(&refusal);
                return Err(ToolsError::GaveUp { reason: refusal });
            }
            tracing::warn!(url = %self.url, "the page is gone; opening it again");
        }
        self.opening.store(true, Ordering::SeqCst);
        let opened = async {
            let browser = Browser::launch(self.browser_options.clone()).await?;
            let page = browser
                .open_with(&self.url, self.page_options.clone())
                .await?;
            Ok::<_, ToolsError>((browser, page))
        }
        .await;
        self.opening.store(false, Ordering::SeqCst);
        let (browser, page) = opened.inspect_err(|error| self.note_error(&error.to_string()))?;
        if reopening {
            self.reopened.fetch_add(1, Ordering::SeqCst);
        }
        self.opened.store(true, Ordering::SeqCst);
        *current = Some((browser, page.clone()));
        Ok(page)
    }

    /// The browser of the current page, if one is open.
    pub async fn browser(&self) -> Option<Browser> {
        self.current.lock().await.as_ref().map(|(b, _)| b.clone())
    }
}

impl Monitored for WebMcpSource {
    fn status(&self) -> SourceStatus {
        let last_error = || self.last_error.lock().clone();
        let state = match self.current.try_lock() {
            // Held while a page opens, and for a moment by every use (of a
            // page that was there a moment ago).
            Err(_) if self.opening.load(Ordering::SeqCst) => SourceState::Starting,
            Err(_) => SourceState::Ready,
            Ok(current) => match current.as_ref() {
                Some((_, page)) if !page.is_gone() => SourceState::Ready,
                Some(_) => SourceState::Down {
                    reason: "the page is gone (its tab closed or its browser stopped)".to_string(),
                },
                None => match last_error() {
                    None => SourceState::Starting,
                    Some(reason) if self.budget.spent() => SourceState::GaveUp { reason },
                    Some(reason) => SourceState::Down { reason },
                },
            },
        };
        SourceStatus {
            state,
            restarts: self.reopened(),
        }
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
