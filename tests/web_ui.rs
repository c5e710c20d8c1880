//! The web page of `wma serve`, in real headless Chromium against a real
//! `wma serve` process with scripted models: a conversation whose parts
//! and sub-agent's parts stream in; a consequential call of a real MCP
//! server (the reference filesystem server's `write_file`) approved and
//! denied from the page, its arguments shown; a reload in the middle of a
//! run that reconnects to it and shows each part once; a past conversation
//! reopened and continued; the token prompt, and a wrong token; markup in a
//! model's text shown as text. And, over plain HTTP, what the page's files
//! are served with, and that the guard lets the page's own origin through
//! while other sites stay refused.
//!
//! Chromium and Node (for the MCP server) come from
//! `scripts/install-peers.sh`; a test fails with that hint when they are
//! missing, as the WebMCP tests do.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::node_and_filesystem_server;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;
use webmcp_agents::config::{Config, StartOptions};
use webmcp_agents::serve::{self, ServerOptions, TokenSource};
use webmcp_agents::tools::{Browser, BrowserOptions, PageOptions, WebMcpPage, find_chromium};

/// How long a test waits for what must happen before it calls it a hang.
/// Not a measure of speed: each check passes as soon as it holds.
const HANG: Duration = Duration::from_secs(30);

const INSTALL_HINT: &str = "run scripts/install-peers.sh (it installs Chromium and the npm peers)";

/// A fresh folder (its real path: the filesystem server resolves links).
fn scratch(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir =
        std::env::temp_dir().join(format!("wma-web-ui-{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

fn toml_str(s: &str) -> String {
    // A JSON string is a TOML basic string.
    serde_json::to_string(s).unwrap()
}

fn replies(replies: &[String]) -> String {
    let quoted: Vec<String> = replies.iter().map(|r| toml_str(r)).collect();
    format!("[{}]", quoted.join(", "))
}

/// The reference filesystem server on `dir`, as a config's tool source.
fn files_source(dir: &Path) -> String {
    let (node, server) = node_and_filesystem_server();
    format!(
        "[tools.files]\nkind = \"mcp-stdio\"\ncommand = {}\nargs = [{}, {}]\n",
        toml_str(&node.display().to_string()),
        toml_str(&server.display().to_string()),
        toml_str(&dir.display().to_string()),
    )
}

fn write_call(dir: &Path, file: &str, content: &str) -> String {
    json!({"name": "write_file", "arguments": {
        "path": dir.join(file).display().to_string(), "content": content}})
    .to_string()
}

// ---------------------------------------------------------------------------
// A real `wma serve`

/// `wma serve` as a process of its own, on a store in its folder.
struct Serve {
    child: tokio::process::Child,
    /// `http://127.0.0.1:PORT`.
    base: String,
    token: String,
    dir: PathBuf,
    client: reqwest::Client,
}

impl Serve {
    /// Starts `wma serve` on `agents` (providers, tools and agents of a
    /// config), in `dir`, with its token in a file there.
    async fn start(dir: &Path, agents: &str) -> Self {
        let config = dir.join("wma.toml");
        let text = format!(
            "{agents}\n[server]\ntoken_file = \"token\"\n\n[store]\ndata_dir = {}\n",
            toml_str(&dir.join("data").display().to_string())
        );
        std::fs::write(&config, text).unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_wma"))
            .args(["serve", "--config"])
            .arg(&config)
            .args(["--listen", "127.0.0.1:0"])
            .env("WMA_CACHE_DIR", dir)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = tokio::time::timeout(HANG, async {
            while let Some(line) = stdout.next_line().await.unwrap() {
                if let Some(addr) = line.strip_prefix("http listening on http://") {
                    return addr.to_string();
                }
            }
            panic!("`wma serve` ended before it listened");
        })
        .await
        .expect("`wma serve` starts");
        // Keep both pipes drained: a full pipe would block the server.
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
        let token = std::fs::read_to_string(dir.join("token"))
            .unwrap()
            .trim()
            .to_string();
        Self {
            child,
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            token,
            dir: dir.to_path_buf(),
        }
    }

    /// The page's address with the token in its fragment.
    fn page_url(&self) -> String {
        format!("{}/#token={}", self.base, self.token)
    }

    /// A run's parts as the server logged them: (sequence number, type).
    async fn logged_parts(&self, run: &str) -> Vec<(u64, String)> {
        let text = self
            .client
            .get(format!("{}/v1/runs/{run}/events", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let mut parts = Vec::new();
        for event in text.split("\n\n") {
            let id = event.lines().find_map(|l| l.strip_prefix("id: "));
            let data = event.lines().find_map(|l| l.strip_prefix("data: "));
            if let (Some(id), Some(data)) = (id, data) {
                let data: Value = serde_json::from_str(data).unwrap();
                parts.push((
                    id.parse().unwrap(),
                    data["type"].as_str().unwrap().to_string(),
                ));
            }
        }
        parts
    }

    /// The body of the run's events after part `after`.
    async fn events_after(&self, run: &str, after: u64) -> String {
        self.client
            .get(format!("{}/v1/runs/{run}/events", self.base))
            .bearer_auth(&self.token)
            .header("last-event-id", after.to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn get_json(&self, path: &str) -> Value {
        self.client
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------
// The browser

/// Headless Chromium; fails with the install hint when it is missing.
async fn browser() -> Browser {
    if let Err(error) = find_chromium(None) {
        panic!("{error}: {INSTALL_HINT}");
    }
    Browser::launch(BrowserOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A tab with nothing injected: the page as a person's browser runs it.
async fn open(browser: &Browser, url: &str) -> WebMcpPage {
    let options = PageOptions {
        legacy_api: false,
        ..PageOptions::default()
    };
    browser
        .open_with(url, options)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// What the page shows, for a failure's message.
async fn shown(page: &WebMcpPage) -> String {
    page.evaluate("document.body ? document.body.innerText : ''")
        .await
        .map(|v| v.as_str().unwrap_or_default().to_string())
        .unwrap_or_else(|e| format!("(the page did not answer: {e})"))
}

/// Evaluates `expression` until it gives something other than
/// `false`/`null`, and returns that; fails after [`HANG`] naming `what`.
async fn until(page: &WebMcpPage, what: &str, expression: &str) -> Value {
    let deadline = Instant::now() + HANG;
    loop {
        // A page that is loading does not answer yet: that is not a "no".
        if let Ok(value) = page.evaluate(expression).await
            && !value.is_null()
            && value != Value::Bool(false)
        {
            return value;
        }
        if Instant::now() > deadline {
            panic!(
                "{what} did not happen within {HANG:?}; the page shows:\n{}",
                shown(page).await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn eval(page: &WebMcpPage, expression: &str) -> Value {
    page.evaluate(expression)
        .await
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
}

/// Waits until the page is signed in and lists `agent`, then picks it.
async fn pick_agent(page: &WebMcpPage, agent: &str) {
    until(
        page,
        &format!("agent `{agent}` listed"),
        &format!(
            "!document.getElementById('app').hidden && \
             Array.from(document.getElementById('agent').options).some(o => o.value === {agent:?})"
        ),
    )
    .await;
    eval(
        page,
        &format!(
            "(() => {{ const s = document.getElementById('agent'); \
             if (s.value !== {agent:?}) {{ s.value = {agent:?}; s.dispatchEvent(new Event('change')); }} \
             return true; }})()"
        ),
    )
    .await;
}

/// Types `text` into the request box and sends it, as a person does.
async fn say(page: &WebMcpPage, text: &str) {
    until(
        page,
        "the send button enabled",
        "!document.getElementById('send').disabled",
    )
    .await;
    eval(
        page,
        &format!(
            "(() => {{ const i = document.getElementById('input'); i.focus(); i.value = {text:?}; \
             i.dispatchEvent(new KeyboardEvent('keydown', {{key: 'Enter', bubbles: true}})); return true; }})()"
        ),
    )
    .await;
}

/// The parts the transcript shows, in order; a part's text without the
/// name of the sub-agent it came from (that is `agent`).
async fn parts(page: &WebMcpPage) -> Vec<Part> {
    let value = eval(
        page,
        "Array.from(document.querySelectorAll('#transcript .part')).map(p => ({\
           seq: p.dataset.seq ? Number(p.dataset.seq) : null, type: p.dataset.type, \
           agent: p.dataset.agent || null, depth: Number(p.dataset.depth), \
           text: Array.from(p.childNodes).filter(c => !c.classList.contains('agent')).map(c => c.textContent).join('')}))",
    )
    .await;
    serde_json::from_value(value).unwrap()
}

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
struct Part {
    seq: Option<u64>,
    #[serde(rename = "type")]
    kind: String,
    agent: Option<String>,
    depth: u32,
    text: String,
}

/// Waits until the run on screen has ended (its agent's own `finish` or
/// `error` is shown and the page is ready for the next request).
async fn until_ended(page: &WebMcpPage) {
    until(
        page,
        "the run's end",
        "document.querySelector('#transcript .part.finish[data-depth=\"0\"], #transcript .part.error[data-depth=\"0\"]') !== null \
         && !document.getElementById('send').disabled",
    )
    .await;
}

/// The waiting calls the page lists: (tool, arguments as shown).
async fn listed_approvals(page: &WebMcpPage) -> Vec<(String, Value)> {
    let value = eval(
        page,
        "Array.from(document.querySelectorAll('#approvals li.approval')).map(li => \
           [li.dataset.tool, li.querySelector('pre.args').textContent])",
    )
    .await;
    let listed: Vec<(String, String)> = serde_json::from_value(value).unwrap();
    listed
        .into_iter()
        .map(|(tool, args)| {
            (
                tool,
                serde_json::from_str(&args).expect("arguments as JSON"),
            )
        })
        .collect()
}

/// Clicks the approve or deny button of the call the run on screen asks
/// about (once the list shows it), with a note when given, and "the same
/// for the rest of the run" ticked when `for_session`.
async fn answer(page: &WebMcpPage, approve: bool, note: Option<&str>, for_session: bool) {
    let button = if approve { "approve" } else { "deny" };
    let note = note.unwrap_or_default();
    until(
        page,
        "the run's question listed as waiting",
        &format!(
            "(() => {{ \
               const asked = Array.from(document.querySelectorAll('#transcript .part.approval-requested')).pop(); \
               if (!asked) return false; \
               const li = Array.from(document.querySelectorAll('#approvals li.approval')) \
                 .find(li => li.dataset.approvalId === asked.dataset.approvalId); \
               if (!li) return false; \
               li.querySelector('input.note').value = {note:?}; \
               li.querySelector('input.for-session').checked = {for_session}; \
               li.querySelector('button.{button}').click(); \
               return true; }})()"
        ),
    )
    .await;
}

/// Every address the page fetched.
async fn fetched(page: &WebMcpPage) -> Vec<String> {
    serde_json::from_value(
        eval(
            page,
            "performance.getEntriesByType('resource').map(e => e.name)",
        )
        .await,
    )
    .unwrap()
}

// ---------------------------------------------------------------------------
// In the browser

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_streams_the_agents_and_its_sub_agents_parts() {
    let dir = scratch("talk");
    let lead = replies(&[
        json!({"name": "helper", "arguments": {"task": "Look at the cart"}}).to_string(),
        "Your cart holds one Summit 30L backpack.".into(),
    ]);
    let helper = replies(&[
        json!({"name": "view_cart", "arguments": {}}).to_string(),
        "One <b>Summit</b> 30L <img src=x onerror=\"document.title='pwned'\">.".into(),
    ]);
    let server = Serve::start(
        &dir,
        &format!(
            r#"
[providers.lead]
kind = "scripted"
model = "lead-model"
replies = {lead}

[providers.helper]
kind = "scripted"
model = "helper-model"
replies = {helper}

[tools.shop]
kind = "demo-shop"
allow = ["view_cart"]

[agents.lead]
description = "Talks to the person."
provider = "lead"
sub_agents = ["helper"]

[agents.helper]
description = "Looks things up."
provider = "helper"
tools = ["shop"]
"#
        ),
    )
    .await;
    let _chromium = crate::support::CHROMIUM.read().await;
    let browser = browser().await;
    let page = open(&browser, &server.page_url()).await;
    // The agent where requests start is listed first and picked, though
    // its sub-agent comes first by name; each is shown with its model.
    until(
        &page,
        "the agents listed",
        "!document.getElementById('app').hidden && document.getElementById('agent').options.length === 2",
    )
    .await;
    assert_eq!(
        eval(
            &page,
            "Array.from(document.getElementById('agent').options).map(o => [o.value, o.textContent])"
        )
        .await,
        json!([["lead", "lead · lead-model"], ["helper", "helper · helper-model"]])
    );
    assert_eq!(
        eval(&page, "document.getElementById('agent').value").await,
        "lead"
    );
    assert_eq!(
        eval(&page, "document.getElementById('agent-model').textContent").await,
        "Model: lead-model (provider lead, scripted)"
    );
    pick_agent(&page, "lead").await;
    // The token left the address bar once the page kept it.
    assert_eq!(eval(&page, "location.hash").await, "");

    say(&page, "What is in my cart?").await;
    until_ended(&page).await;

    let shown_parts = parts(&page).await;
    let own = |p: &Part| p.depth == 0 && p.agent.as_deref() == Some("lead");
    let sub = |p: &Part| p.depth == 1 && p.agent.as_deref() == Some("helper");
    // The person's request, then the parent's call of its sub-agent, the
    // sub-agent's call and result, and the parent's answer, in order.
    assert_eq!(
        eval(
            &page,
            "document.querySelector('#transcript .msg.user .text').textContent"
        )
        .await,
        "What is in my cart?"
    );
    let find = |pred: &dyn Fn(&Part) -> bool| {
        shown_parts
            .iter()
            .position(pred)
            .unwrap_or_else(|| panic!("not shown: {shown_parts:#?}"))
    };
    let delegated = find(&|p| own(p) && p.kind == "tool-call" && p.text.contains("helper"));
    let looked = find(&|p| sub(p) && p.kind == "tool-call" && p.text.contains("view_cart"));
    let found = find(&|p| sub(p) && p.kind == "tool-result" && p.text.contains("\"total\""));
    let answered = find(&|p| {
        own(p) && p.kind == "text" && p.text == "Your cart holds one Summit 30L backpack."
    });
    assert!(
        delegated < looked && looked < found && found < answered,
        "{shown_parts:#?}"
    );
    assert!(shown_parts[delegated].text.contains("Look at the cart"));
    assert!(
        shown_parts.iter().any(|p| sub(p)
            && p.kind == "text"
            && p.text == "One <b>Summit</b> 30L <img src=x onerror=\"document.title='pwned'\">."),
        "{shown_parts:#?}"
    );
    // What the model wrote is shown as text, never run as markup.
    assert_eq!(
        eval(
            &page,
            "document.querySelectorAll('#transcript b, #transcript img').length"
        )
        .await,
        0
    );
    assert_ne!(eval(&page, "document.title").await, "pwned");
    // Each part once, numbered as the server's log numbers them.
    let seqs: Vec<u64> = shown_parts.iter().filter_map(|p| p.seq).collect();
    assert_eq!(seqs, (1..=shown_parts.len() as u64).collect::<Vec<_>>());
    assert_eq!(shown_parts.last().unwrap().kind, "finish");
    // The conversation is listed with the others.
    until(
        &page,
        "the conversation listed",
        "Array.from(document.querySelectorAll('#sessions li')).some(li => li.textContent.includes('What is in my cart?'))",
    )
    .await;

    drop(page);
    browser.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_loads_another_model_into_the_agents_provider() {
    let dir = scratch("swap");
    let server = Serve::start(
        &dir,
        r#"
[providers.lead]
kind = "scripted"
model = "lead-model"
replies = ["From the lead model."]

[providers.fresh]
kind = "scripted"
model = "fresh-model"
replies = ["From the fresh model."]

[agents.lead]
provider = "lead"
"#,
    )
    .await;
    let _chromium = crate::support::CHROMIUM.read().await;
    let browser = browser().await;
    let page = open(&browser, &server.page_url()).await;
    pick_agent(&page, "lead").await;
    // The config's providers are offered, the loaded one chosen; loading
    // it again is nothing to do.
    assert_eq!(
        eval(
            &page,
            "Array.from(document.getElementById('provider').options).map(o => o.value)"
        )
        .await,
        json!(["fresh", "lead"])
    );
    assert_eq!(
        eval(&page, "document.getElementById('provider').value").await,
        "lead"
    );
    assert_eq!(
        eval(&page, "document.getElementById('swap').disabled").await,
        true
    );

    eval(
        &page,
        "(() => { const s = document.getElementById('provider'); s.value = 'fresh'; \
         s.dispatchEvent(new Event('change')); document.getElementById('swap').click(); return true; })()",
    )
    .await;
    until(
        &page,
        "the new model shown",
        "document.getElementById('agent-model').textContent === 'Model: fresh-model (provider lead, scripted)'",
    )
    .await;
    assert_eq!(
        eval(
            &page,
            "document.getElementById('agent').selectedOptions[0].textContent"
        )
        .await,
        "lead · fresh-model"
    );
    assert_eq!(
        eval(&page, "document.getElementById('swap').disabled").await,
        true
    );
    let listed = server.get_json("/v1/agents").await;
    assert_eq!(listed["agents"][0]["loaded"], "fresh", "{listed}");

    // The next run is answered by the model loaded.
    say(&page, "Hello").await;
    until_ended(&page).await;
    let shown_parts = parts(&page).await;
    assert!(
        shown_parts
            .iter()
            .any(|p| p.kind == "text" && p.text == "From the fresh model."),
        "{shown_parts:#?}"
    );

    drop(page);
    browser.close().await;
    server.stop().await;
}

/// A config with the filesystem server and three agents that write with
/// it: `writer`, `denier`, and `twice` (two writes in one run). `write_file` says it is destructive, so it asks
/// in `wma serve` by default.
fn files_config(dir: &Path) -> String {
    format!(
        r#"
[providers.writer]
kind = "scripted"
replies = {writer}

[providers.denier]
kind = "scripted"
replies = {denier}

{files}

[agents.writer]
provider = "writer"
tools = ["files"]

[agents.denier]
provider = "denier"
tools = ["files"]

[providers.twice]
kind = "scripted"
replies = {twice}

[agents.twice]
provider = "twice"
tools = ["files"]
"#,
        writer = replies(&[write_call(dir, "approved.txt", "yes"), "Written.".into()]),
        denier = replies(&[
            write_call(dir, "denied.txt", "no"),
            "I could not write it.".into()
        ]),
        twice = replies(&[
            write_call(dir, "one.txt", "1"),
            write_call(dir, "two.txt", "2"),
            "Both written.".into()
        ]),
        files = files_source(dir),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consequential_call_waits_with_its_arguments_and_runs_only_once_approved() {
    let dir = scratch("approve");
    let server = Serve::start(&dir, &files_config(&dir)).await;
    let _chromium = crate::support::CHROMIUM.read().await;
    let browser = browser().await;
    let page = open(&browser, &server.page_url()).await;

    // Approved: the call's full arguments are shown, then it runs.
    pick_agent(&page, "writer").await;
    say(&page, "Write yes into approved.txt").await;
    until(
        &page,
        "the question listed",
        "document.querySelector('#approvals li.approval') !== null",
    )
    .await;
    let expected =
        json!({"path": dir.join("approved.txt").display().to_string(), "content": "yes"});
    assert_eq!(
        listed_approvals(&page).await,
        [("write_file".to_string(), expected.clone())]
    );
    let asked = parts(&page).await;
    let question = asked.last().unwrap();
    assert_eq!(question.kind, "approval-requested", "{asked:#?}");
    assert!(question.text.contains("write_file") && question.text.contains("consequences"));
    assert!(
        !dir.join("approved.txt").exists(),
        "nothing runs before the answer"
    );
    answer(&page, true, None, false).await;
    until_ended(&page).await;
    let done = parts(&page).await;
    let kinds: Vec<&str> = done.iter().map(|p| p.kind.as_str()).collect();
    let decided = kinds.iter().position(|k| *k == "approval-decided").unwrap();
    assert_eq!(kinds[decided + 1], "tool-result", "{done:#?}");
    assert!(done[decided].text.contains("approved"), "{done:#?}");
    assert!(
        done.iter()
            .any(|p| p.kind == "text" && p.text == "Written.")
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("approved.txt")).unwrap(),
        "yes"
    );
    until(
        &page,
        "the answered question gone",
        "document.querySelector('#approvals li.approval') === null",
    )
    .await;

    // Denied, with a note: the model reads `Error [denied]` and the note.
    eval(
        &page,
        "document.getElementById('new-session').click(), true",
    )
    .await;
    pick_agent(&page, "denier").await;
    say(&page, "Write no into denied.txt").await;
    answer(&page, false, Some("not that file"), false).await;
    until_ended(&page).await;
    let done = parts(&page).await;
    let error = done
        .iter()
        .find(|p| p.kind == "tool-error")
        .unwrap_or_else(|| panic!("no error shown: {done:#?}"));
    assert!(error.text.contains("write_file"), "{error:?}");
    assert!(
        error.text.contains("Error [denied]") && error.text.contains("not that file"),
        "{error:?}"
    );
    assert!(
        done.iter()
            .any(|p| p.kind == "approval-decided" && p.text.contains("denied"))
    );
    assert!(!dir.join("denied.txt").exists());
    // The second conversation is one of its own.
    let sessions = server.get_json("/v1/sessions").await;
    assert_eq!(
        sessions["sessions"].as_array().unwrap().len(),
        2,
        "{sessions}"
    );

    // Approved for the rest of the run: the second write asks nobody.
    eval(
        &page,
        "document.getElementById('new-session').click(), true",
    )
    .await;
    pick_agent(&page, "twice").await;
    say(&page, "Write 1 and 2").await;
    answer(&page, true, None, true).await;
    until_ended(&page).await;
    let done = parts(&page).await;
    let asked = done
        .iter()
        .filter(|p| p.kind == "approval-requested")
        .count();
    assert_eq!(asked, 1, "{done:#?}");
    let decided: Vec<&Part> = done
        .iter()
        .filter(|p| p.kind == "approval-decided")
        .collect();
    assert_eq!(decided.len(), 2, "{done:#?}");
    assert!(
        decided[0].text.contains("for the rest of the run"),
        "{decided:?}"
    );
    assert!(
        decided[1].text.contains("approved by session"),
        "{decided:?}"
    );
    assert_eq!(std::fs::read_to_string(dir.join("one.txt")).unwrap(), "1");
    assert_eq!(std::fs::read_to_string(dir.join("two.txt")).unwrap(), "2");

    drop(page);
    browser.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_a_run_reconnects_and_shows_each_part_once() {
    let dir = scratch("reload");
    // `slow` takes 1.5 s per step: its parts keep coming while the page
    // reloads.
    let slow = replies(&[
        json!({"name": "view_cart", "arguments": {}}).to_string(),
        "Your cart is empty.".into(),
    ]);
    let config = format!(
        "{}\n[providers.slow]\nkind = \"scripted\"\ndelay_ms = 1500\nreplies = {slow}\n\n\
         [tools.shop]\nkind = \"demo-shop\"\nallow = [\"view_cart\"]\n\n\
         [agents.slow]\nprovider = \"slow\"\ntools = [\"shop\"]\n",
        files_config(&dir)
    );
    let server = Serve::start(&dir, &config).await;
    let _chromium = crate::support::CHROMIUM.read().await;
    let browser = browser().await;
    let page = open(&browser, &server.page_url()).await;
    pick_agent(&page, "writer").await;
    say(&page, "Write yes into approved.txt").await;
    // The run waits for a person: it is running when the page reloads.
    until(
        &page,
        "the question shown",
        "document.querySelector('#transcript .part.approval-requested') !== null",
    )
    .await;
    let before = parts(&page).await;
    let run = eval(
        &page,
        "JSON.parse(sessionStorage.getItem('wma.view')).run.id",
    )
    .await;
    let run = run.as_str().unwrap().to_string();

    // A reload of the page's address (the token is no longer in it).
    page.navigate(&format!("{}/", server.base)).await.unwrap();
    until(
        &page,
        "the question shown again",
        "document.querySelector('#transcript .part.approval-requested') !== null \
         && document.querySelector('#approvals li.approval') !== null",
    )
    .await;
    assert_eq!(parts(&page).await, before, "the same parts, once each");
    assert_eq!(
        eval(&page, "document.getElementById('stop').disabled").await,
        false,
        "the page knows the run still goes"
    );

    answer(&page, true, None, false).await;
    until_ended(&page).await;
    let after = parts(&page).await;
    let shown: Vec<(u64, String)> = after
        .iter()
        .map(|p| (p.seq.expect("a part of the run"), p.kind.clone()))
        .collect();
    // Exactly the run's log: none twice, none missing, in order.
    assert_eq!(shown, server.logged_parts(&run).await);
    assert_eq!(after[..before.len()], before[..]);
    assert!(after.iter().any(|p| p.kind == "tool-result"));
    // It read the run again from where it was (`Last-Event-ID`), not from
    // the start: its reconnection carried exactly the parts after those.
    let seen = before.last().unwrap().seq.unwrap();
    let read_again = until(
        &page,
        "the reconnection's entry",
        &format!(
            "(performance.getEntriesByType('resource').find(e => e.name.endsWith('/v1/runs/{run}/events')) || {{}}).encodedBodySize"
        ),
    )
    .await;
    assert_eq!(
        read_again.as_u64().unwrap(),
        server.events_after(&run, seen).await.len() as u64
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("approved.txt")).unwrap(),
        "yes"
    );

    // A run that is generating: reloaded between its steps, the page shows
    // what came while it was away, and what comes after, each once.
    eval(
        &page,
        "document.getElementById('new-session').click(), true",
    )
    .await;
    pick_agent(&page, "slow").await;
    say(&page, "What is in my cart?").await;
    until(
        &page,
        "the first call shown",
        "document.querySelector('#transcript .part.tool-call') !== null",
    )
    .await;
    let before = parts(&page).await;
    let run = eval(
        &page,
        "JSON.parse(sessionStorage.getItem('wma.view')).run.id",
    )
    .await;
    let run = run.as_str().unwrap().to_string();
    page.navigate(&format!("{}/", server.base)).await.unwrap();
    until_ended(&page).await;
    let after = parts(&page).await;
    assert_eq!(after[..before.len()], before[..]);
    let shown: Vec<(u64, String)> = after
        .iter()
        .map(|p| (p.seq.expect("a part of the run"), p.kind.clone()))
        .collect();
    assert_eq!(shown, server.logged_parts(&run).await);
    assert!(
        after
            .iter()
            .any(|p| p.kind == "text" && p.text == "Your cart is empty."),
        "{after:#?}"
    );

    drop(page);
    browser.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_past_conversation_reopens_with_its_history_and_continues() {
    let dir = scratch("reopen");
    let clerk = replies(&[
        "Hello! What can I find for you?".into(),
        "A tent, then.".into(),
    ]);
    let server = Serve::start(
        &dir,
        &format!(
            "[providers.clerk]\nkind = \"scripted\"\nreplies = {clerk}\n\n[agents.clerk]\nprovider = \"clerk\"\n"
        ),
    )
    .await;
    let _chromium = crate::support::CHROMIUM.read().await;
    let browser = browser().await;
    let page = open(&browser, &server.page_url()).await;
    pick_agent(&page, "clerk").await;
    say(&page, "Hi").await;
    until_ended(&page).await;

    // Away from it, then back from the list.
    eval(
        &page,
        "document.getElementById('new-session').click(), true",
    )
    .await;
    assert_eq!(parts(&page).await, []);
    until(
        &page,
        "the conversation listed",
        "document.querySelector('#sessions li button.session') !== null",
    )
    .await;
    eval(
        &page,
        "document.querySelector('#sessions li button.session').click(), true",
    )
    .await;
    until(
        &page,
        "the history shown",
        "document.querySelectorAll('#transcript .msg.user').length === 1 \
         && document.querySelector('#transcript .part.text') !== null",
    )
    .await;
    assert_eq!(
        eval(
            &page,
            "document.querySelector('#transcript .part.text').textContent"
        )
        .await,
        "Hello! What can I find for you?"
    );
    say(&page, "A tent, please").await;
    until_ended(&page).await;
    assert!(
        parts(&page)
            .await
            .iter()
            .any(|p| p.kind == "text" && p.text == "A tent, then.")
    );
    // It went on in the same session, which now holds both exchanges.
    let sessions = server.get_json("/v1/sessions").await;
    let sessions = sessions["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let id = sessions[0]["id"].as_str().unwrap();
    let read = server.get_json(&format!("/v1/sessions/{id}")).await;
    let messages: Vec<&str> = read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            "Hi",
            "Hello! What can I find for you?",
            "A tent, please",
            "A tent, then."
        ]
    );

    drop(page);
    browser.close().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_the_page_asks_for_it_and_a_wrong_one_is_refused() {
    let dir = scratch("token");
    let server = Serve::start(
        &dir,
        "[providers.p]\nkind = \"scripted\"\nreplies = [\"-\"]\n\n[agents.clerk]\nprovider = \"p\"\n",
    )
    .await;
    let _chromium = crate::support::CHROMIUM.read().await;
    let browser = browser().await;

    // No token: the prompt, and no call of the API.
    let page = open(&browser, &format!("{}/", server.base)).await;
    until(
        &page,
        "the token prompt",
        "!document.getElementById('token-panel').hidden && document.getElementById('app').hidden",
    )
    .await;
    until(
        &page,
        "the page's own files loaded",
        "document.readyState === 'complete'",
    )
    .await;
    // A call would have been started as the script ran; give one a moment
    // to answer before reading what was fetched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: Vec<String> = fetched(&page).await;
    assert!(
        before.iter().any(|u| u.ends_with("/ui/app.js")),
        "{before:?}"
    );
    assert!(!before.iter().any(|u| u.contains("/v1/")), "{before:?}");
    // The token typed in opens the page (and that call is seen).
    eval(
        &page,
        &format!(
            "document.getElementById('token-input').value = {:?}; \
             document.getElementById('token-form').requestSubmit(); true",
            server.token
        ),
    )
    .await;
    pick_agent(&page, "clerk").await;
    assert!(
        fetched(&page)
            .await
            .iter()
            .any(|u| u.ends_with("/v1/agents"))
    );
    drop(page);

    // A wrong token in the fragment: the server's refusal, and the prompt.
    let wrong = open(
        &browser,
        &format!(
            "{}/#token=not-the-token-0123456789abcdef0123456789",
            server.base
        ),
    )
    .await;
    let error = until(
        &wrong,
        "the refusal shown",
        "!document.getElementById('token-panel').hidden && document.getElementById('token-error').textContent",
    )
    .await;
    assert_eq!(error, "the token is not this server's");
    assert_eq!(
        eval(&wrong, "document.getElementById('app').hidden").await,
        true
    );
    assert_eq!(
        eval(&wrong, "sessionStorage.getItem('wma.token')").await,
        Value::Null,
        "a refused token is not kept"
    );

    drop(wrong);
    browser.close().await;
    server.stop().await;
}

// ---------------------------------------------------------------------------
// Over plain HTTP

/// An in-process server with one scripted agent, and its address.
async fn in_process(
    options: ServerOptions,
) -> (
    serve::Started,
    CancellationToken,
    webmcp_agents::config::Hosted,
) {
    let config = Config::parse(
        "[providers.p]\nkind = \"scripted\"\nreplies = [\"Hi.\"]\n\n[agents.clerk]\nprovider = \"p\"\n",
        "web-ui-test.toml",
    )
    .unwrap();
    let hosted = config.start(StartOptions::default()).await.unwrap();
    let api = serve::Api::hosted(config, &hosted).unwrap();
    let stop = CancellationToken::new();
    let started = serve::start_with("127.0.0.1:0".parse().unwrap(), api, options, stop.clone())
        .await
        .unwrap();
    (started, stop, hosted)
}

const TOKEN: &str = "web-ui-token-0123456789abcdef0123456789abcdef";

fn given_token() -> ServerOptions {
    ServerOptions {
        token: TokenSource::Given(TOKEN.to_string()),
        ..ServerOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_without_the_token_under_its_policy_and_unknown_files_are_not_found() {
    let (started, stop, hosted) = in_process(given_token()).await;
    let base = format!("http://{}", started.addr);
    let client = reqwest::Client::new();

    let page = client.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let headers = page.headers().clone();
    assert_eq!(
        headers["content-security-policy"],
        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    assert_eq!(headers["cache-control"], "no-store");
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = page.text().await.unwrap();
    assert!(
        html.contains(r#"<script src="/ui/app.js" defer></script>"#),
        "{html}"
    );
    assert!(!html.contains(TOKEN));

    for (path, media) in [
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let file = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(file.status(), StatusCode::OK, "{path}");
        assert!(
            file.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with(media),
            "{path}"
        );
        assert!(file.headers().contains_key("content-security-policy"));
    }
    for path in ["/ui/nothing.js", "/ui/", "/ui/app.js/x"] {
        let missing = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let posted = client.post(format!("{base}/")).send().await.unwrap();
    assert_eq!(posted.status(), StatusCode::METHOD_NOT_ALLOWED);
    // The API itself still wants the token.
    let api = client
        .get(format!("{base}/v1/agents"))
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), StatusCode::UNAUTHORIZED);

    stop.cancel();
    started.task.await.unwrap().unwrap();
    hosted.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_own_origin_may_call_the_api_and_other_sites_may_not() {
    let (started, stop, hosted) = in_process(given_token()).await;
    let base = format!("http://{}", started.addr);
    let client = reqwest::Client::new();
    let post = |origin: String| {
        client
            .post(format!("{base}/v1/sessions"))
            .bearer_auth(TOKEN)
            .header("origin", origin)
            .header("content-type", "application/json")
            .body(r#"{"agent": "clerk"}"#)
            .send()
    };
    // The page's own origin gets past the guard (to the endpoint, which
    // answers 503 here: this server keeps no sessions), with no CORS
    // headers, since the page needs none.
    let own = post(base.clone()).await.unwrap();
    assert_eq!(own.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!own.headers().contains_key("access-control-allow-origin"));
    // The same through the other loopback name it is reached as.
    let port = started.addr.port();
    let by_name = client
        .get(format!("http://localhost:{port}/v1/agents"))
        .bearer_auth(TOKEN)
        .header("origin", format!("http://localhost:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(by_name.status(), StatusCode::OK);
    // Another site's page, or this machine on another port: refused
    // before the token is even looked at.
    for origin in [
        "http://evil.example".to_string(),
        format!("http://127.0.0.1:{}", port.wrapping_add(1)),
        format!("http://localhost:{port}"),
        "null".to_string(),
    ] {
        let refused = post(origin.clone()).await.unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{origin}");
    }

    stop.cancel();
    started.task.await.unwrap().unwrap();
    hosted.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_notice_carries_a_new_token_in_the_fragment_only() {
    let dir = scratch("notice");
    let file = dir.join("http-token");
    let options = ServerOptions {
        token: TokenSource::File(file.clone()),
        ..ServerOptions::default()
    };
    // First start: the token is generated now, and the link carries it.
    let (started, stop, hosted) = in_process(options.clone()).await;
    let token = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        serve::ui::page_notice(&started),
        format!("web page: http://{}/#token={}", started.addr, token.trim())
    );
    stop.cancel();
    started.task.await.unwrap().unwrap();
    hosted.shutdown().await;
    // Later starts: the address alone, and where the token is.
    let (started, stop, hosted) = in_process(options).await;
    let notice = serve::ui::page_notice(&started);
    assert!(!notice.contains(token.trim()), "{notice}");
    assert!(
        notice.starts_with(&format!("web page: http://{}/ ", started.addr)),
        "{notice}"
    );
    assert!(notice.contains(&file.display().to_string()), "{notice}");
    stop.cancel();
    started.task.await.unwrap().unwrap();
    hosted.shutdown().await;
    std::fs::remove_dir_all(dir).unwrap();
}
