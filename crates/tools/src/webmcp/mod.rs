//! WebMCP pages in Chromium, driven over the CDP `WebMCP` domain.
//!
//! [`Browser`] starts Chromium with the `WebMCP` feature on (or connects to
//! one that runs), [`Browser::open`] loads a page in a new tab, and the
//! [`WebMcpPage`] it returns is a [`ToolHost`](wma_agent::ToolHost): its
//! tools are the ones the page registered with
//! `document.modelContext.registerTool`, followed as the page changes.
//! [`WebMcpSource`] is a page that starts its own browser, and starts it
//! again when it died.

mod browser;
mod cdp;
mod page;
mod source;

pub use browser::{
    Browser, BrowserOptions, CHROMIUM_ENV, DEFAULT_LAUNCH_TIMEOUT, PageTarget, find_chromium,
};
pub use page::{DEFAULT_SETTLE_TIMEOUT, DEFAULT_TOOLS_QUIET, PageOptions, PageTool, WebMcpPage};
pub use source::WebMcpSource;
