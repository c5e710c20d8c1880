//! The crate's error type.
//!
//! Tool calls never fail with this type: they answer with a coded
//! [`ToolError`](wma_agent::ToolError) that the model can read. These are the
//! errors of setting a source up: a browser that will not start, a page that
//! will not load, an MCP server that does not initialize.

use std::path::PathBuf;

/// Why a tool source could not be set up or driven.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolsError {
    /// No Chromium executable was found.
    #[error(
        "Chromium was not found (looked for {searched}); install Debian's `chromium` package \
         (scripts/install-peers.sh does) or set WMA_CHROMIUM to the browser's executable"
    )]
    BrowserNotFound {
        /// The places that were tried, for the message.
        searched: String,
    },
    /// The browser started but did not offer a DevTools endpoint, or exited.
    #[error("Chromium at {executable} did not start: {reason}")]
    BrowserLaunch {
        /// The executable that was started.
        executable: PathBuf,
        /// What went wrong, with the browser's last words when it printed any.
        reason: String,
    },
    /// A DevTools endpoint could not be reached.
    #[error("could not connect to the browser's DevTools endpoint {endpoint}: {reason}")]
    Connect {
        /// The endpoint that was tried.
        endpoint: String,
        /// Why it failed.
        reason: String,
    },
    /// A CDP command failed.
    #[error("the browser refused {method}: {message}")]
    Cdp {
        /// The CDP method.
        method: String,
        /// The browser's error message.
        message: String,
    },
    /// The DevTools connection or the page's target is gone.
    #[error("the browser connection is closed")]
    BrowserClosed,
    /// The browser did not answer in time.
    #[error("the browser did not answer {what} within {seconds} s")]
    BrowserTimeout {
        /// What was waited for.
        what: String,
        /// How long.
        seconds: f32,
    },
    /// A page could not be loaded.
    #[error("could not load {url}: {reason}")]
    Navigation {
        /// The page's address.
        url: String,
        /// The browser's reason.
        reason: String,
    },
    /// An MCP server could not be started or did not initialize.
    #[error("could not start the MCP server `{server}`: {reason}")]
    McpConnect {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
    /// A source stopped more often than its restart budget allows and is
    /// not started again for now.
    #[error("{reason}")]
    GaveUp {
        /// How often, within what window.
        reason: String,
    },
    /// A file or socket operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl ToolsError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}
