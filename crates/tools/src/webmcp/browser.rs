//! Starting Chromium with WebMCP on, or connecting to one that runs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, ChildStdin, Command};

use crate::error::ToolsError;
use crate::webmcp::cdp::Cdp;
use crate::webmcp::page::{PageOptions, WebMcpPage};

/// The environment variable that names the browser executable.
pub const CHROMIUM_ENV: &str = "WMA_CHROMIUM";

/// Where a browser is looked for when neither the options nor
/// [`CHROMIUM_ENV`] name one. Debian's real binary comes first: its
/// `/usr/bin/chromium` wrapper script only adds a shell warning.
const CANDIDATES: &[&str] = &[
    "/usr/lib/chromium/chromium",
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome",
    "/usr/bin/google-chrome-stable",
];

/// How long a starting browser may take to offer its DevTools endpoint.
pub const DEFAULT_LAUNCH_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a browser.
#[derive(Debug, Clone)]
pub struct BrowserOptions {
    /// The executable. Default: [`CHROMIUM_ENV`], else the first of Debian's
    /// and Google's usual paths that exists.
    pub executable: Option<PathBuf>,
    /// Run without a window. Default: true.
    pub headless: bool,
    /// More command-line switches, after the ones this crate sets.
    pub extra_args: Vec<String>,
    /// Limit for the browser to start. Default: [`DEFAULT_LAUNCH_TIMEOUT`].
    pub launch_timeout: Duration,
}

impl Default for BrowserOptions {
    fn default() -> Self {
        Self {
            executable: None,
            headless: true,
            extra_args: Vec::new(),
            launch_timeout: DEFAULT_LAUNCH_TIMEOUT,
        }
    }
}

/// A page target the browser has open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageTarget {
    /// The target's id, for [`Browser::attach`].
    pub target_id: String,
    /// Its address.
    pub url: String,
    /// Its title.
    pub title: String,
}

/// A Chromium browser with the WebMCP feature on, driven over CDP.
///
/// Cheap to clone. A launched browser is stopped, and its temporary profile
/// removed, when the last clone and the last of its pages are dropped (or at
/// [`Browser::close`]); a browser that was connected to keeps running.
#[derive(Clone)]
pub struct Browser {
    inner: Arc<BrowserInner>,
}

pub(crate) struct BrowserInner {
    pub(crate) cdp: Arc<Cdp>,
    /// The process, when this crate started it.
    process: Mutex<Option<Process>>,
    /// The throwaway profile of a launched browser.
    profile: Option<PathBuf>,
    /// The DevTools endpoint, for messages and [`Browser::endpoint`].
    endpoint: String,
}

/// A launched browser.
///
/// On Unix the browser runs under a small shell that holds the read end of
/// a pipe whose write end only this process holds (`lifeline`). When the
/// pipe closes, because the browser is dropped or because this process
/// ended in any way, signals included, the shell kills the browser. A
/// `kill_on_drop` child would be left running when the process is killed,
/// since no destructor runs then.
struct Process {
    /// The shell (on Unix) or the browser itself.
    child: Child,
    /// Closing it stops the browser.
    lifeline: Option<ChildStdin>,
    /// The browser's own process id.
    pid: Option<u32>,
}

impl Process {
    /// Stops the browser without waiting.
    fn stop(&mut self) {
        if self.lifeline.take().is_none() {
            let _ = self.child.start_kill();
        }
    }
}

/// The shell that runs the browser (`$0 "$@"`), prints its pid, and, when
/// its standard input closes, kills it and removes its throwaway profile
/// (`WMA_PROFILE_DIR`). The shell outlives this process, so the profile is
/// removed even when this process ends first.
#[cfg(unix)]
const WATCHDOG: &str = r#""$0" "$@" </dev/null >/dev/null &
pid=$!
echo "$pid"
while read -r _; do :; done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
for _ in 1 2 3 4 5; do
  rm -rf "$WMA_PROFILE_DIR" 2>/dev/null
  [ -e "$WMA_PROFILE_DIR" ] || break
  sleep 1
done
"#;

impl Drop for BrowserInner {
    fn drop(&mut self) {
        let process = self.process.get_mut();
        if let Some(process) = process.as_mut() {
            // Chromium's helper processes exit on their own once the
            // browser process is gone (their IPC channels close).
            process.stop();
        }
        // On Unix the watchdog removes the profile once the browser is gone.
        #[cfg(not(unix))]
        if let Some(profile) = self.profile.clone() {
            // The browser may write for a moment more before the kill lands.
            std::thread::spawn(move || {
                for _ in 0..50 {
                    if std::fs::remove_dir_all(&profile).is_ok() || !profile.exists() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    }
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("endpoint", &self.inner.endpoint)
            .finish_non_exhaustive()
    }
}

/// Finds a Chromium executable: `explicit`, else [`CHROMIUM_ENV`], else the
/// usual install paths.
pub fn find_chromium(explicit: Option<&Path>) -> Result<PathBuf, ToolsError> {
    let mut searched = Vec::new();
    if let Some(path) = explicit {
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        searched.push(path.display().to_string());
    }
    if let Some(path) = std::env::var_os(CHROMIUM_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        searched.push(format!("{CHROMIUM_ENV}={}", path.display()));
    }
    for candidate in CANDIDATES {
        let path = Path::new(candidate);
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        searched.push((*candidate).to_string());
    }
    Err(ToolsError::BrowserNotFound {
        searched: searched.join(", "),
    })
}

fn running_as_root() -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }
    #[cfg(not(unix))]
    {
        false
    }
}

fn fresh_profile_dir() -> Result<PathBuf, ToolsError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "wma-chromium-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| ToolsError::io(format!("could not create {}", dir.display()), e))?;
    Ok(dir)
}

/// The switches every launch gets. The networking ones keep a headless
/// browser from calling home (which, on a machine without internet, means
/// a stream of refused connections and slow starts).
fn launch_args(options: &BrowserOptions, profile: &Path) -> Vec<String> {
    let mut args = vec![
        "--enable-features=WebMCP".to_string(),
        "--remote-debugging-port=0".to_string(),
        format!("--user-data-dir={}", profile.display()),
        "--no-first-run".to_string(),
        "--no-default-browser-check".to_string(),
        "--disable-background-networking".to_string(),
        "--disable-component-update".to_string(),
        "--disable-sync".to_string(),
        "--disable-quic".to_string(),
        "--disable-extensions".to_string(),
        // No crash-reporter helper processes, which outlive the browser.
        "--disable-breakpad".to_string(),
        "--disable-crash-reporter".to_string(),
    ];
    if options.headless {
        args.push("--headless".to_string());
        args.push("--disable-gpu".to_string());
    }
    if running_as_root() {
        // Chromium refuses to start its sandbox as root.
        args.push("--no-sandbox".to_string());
    }
    args.extend(options.extra_args.iter().cloned());
    args.push("about:blank".to_string());
    args
}

/// Starts the browser; returns it and its stderr.
async fn spawn_browser(
    executable: &Path,
    args: Vec<String>,
    profile: &Path,
    limit: Duration,
) -> std::io::Result<(Process, ChildStderr)> {
    #[cfg(unix)]
    {
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg(executable)
            .args(args)
            .env("WMA_PROFILE_DIR", profile)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let lifeline = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let mut first = String::new();
        let read = tokio::time::timeout(limit, BufReader::new(stdout).read_line(&mut first)).await;
        let pid = match read {
            Ok(Ok(_)) => first.trim().parse().ok(),
            _ => None,
        };
        if pid.is_none() {
            let _ = child.start_kill();
            return Err(std::io::Error::other("the browser did not start"));
        }
        Ok((
            Process {
                child,
                lifeline,
                pid,
            },
            stderr,
        ))
    }
    #[cfg(not(unix))]
    {
        let _ = (limit, profile);
        let mut child = Command::new(executable)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let pid = child.id();
        Ok((
            Process {
                child,
                lifeline: None,
                pid,
            },
            stderr,
        ))
    }
}

impl Browser {
    /// Starts a browser with WebMCP on and a fresh, throwaway profile.
    pub async fn launch(options: BrowserOptions) -> Result<Self, ToolsError> {
        let executable = find_chromium(options.executable.as_deref())?;
        let profile = fresh_profile_dir()?;
        let (mut process, stderr) = spawn_browser(
            &executable,
            launch_args(&options, &profile),
            &profile,
            options.launch_timeout,
        )
        .await
        .map_err(|e| {
            let _ = std::fs::remove_dir_all(&profile);
            ToolsError::BrowserLaunch {
                executable: executable.clone(),
                reason: e.to_string(),
            }
        })?;
        let mut lines = BufReader::new(stderr).lines();
        let mut last_words: Vec<String> = Vec::new();
        let found = tokio::time::timeout(options.launch_timeout, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(endpoint) = line.strip_prefix("DevTools listening on ") {
                    return Some(endpoint.trim().to_string());
                }
                if last_words.len() == 8 {
                    last_words.remove(0);
                }
                last_words.push(line);
            }
            None
        })
        .await;
        let endpoint = match found {
            Ok(Some(endpoint)) => endpoint,
            outcome => {
                process.stop();
                let _ = process.child.wait().await;
                let _ = std::fs::remove_dir_all(&profile);
                let reason = match outcome {
                    Err(_) => format!(
                        "no DevTools endpoint within {} s",
                        options.launch_timeout.as_secs_f32()
                    ),
                    _ => "it exited before offering a DevTools endpoint".to_string(),
                };
                return Err(ToolsError::BrowserLaunch {
                    executable,
                    reason: format!("{reason}; it printed: {}", last_words.join(" | ")),
                });
            }
        };
        // Keep reading: a full stderr pipe would block the browser.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::trace!(target: "wma_tools::chromium", "{line}");
            }
        });
        let cdp = Cdp::connect(&endpoint).await?;
        tracing::debug!(%endpoint, executable = %executable.display(), "browser started");
        Ok(Self {
            inner: Arc::new(BrowserInner {
                cdp,
                process: Mutex::new(Some(process)),
                profile: Some(profile),
                endpoint,
            }),
        })
    }

    /// Connects to a browser that is already running with
    /// `--remote-debugging-port` (and WebMCP on). `endpoint` is its browser
    /// websocket (`ws://127.0.0.1:9222/devtools/browser/…`) or its HTTP
    /// address (`http://127.0.0.1:9222`), from which the websocket is read.
    pub async fn connect(endpoint: &str) -> Result<Self, ToolsError> {
        let websocket = if endpoint.starts_with("ws://") || endpoint.starts_with("wss://") {
            endpoint.to_string()
        } else {
            let version_url = format!("{}/json/version", endpoint.trim_end_matches('/'));
            let connect_error = |reason: String| ToolsError::Connect {
                endpoint: endpoint.to_string(),
                reason,
            };
            let body = reqwest::get(&version_url)
                .await
                .map_err(|e| connect_error(e.to_string()))?
                .text()
                .await
                .map_err(|e| connect_error(e.to_string()))?;
            let version: Value =
                serde_json::from_str(&body).map_err(|e| connect_error(e.to_string()))?;
            version["webSocketDebuggerUrl"]
                .as_str()
                .ok_or_else(|| connect_error(format!("{version_url} names no websocket")))?
                .to_string()
        };
        let cdp = Cdp::connect(&websocket).await?;
        Ok(Self {
            inner: Arc::new(BrowserInner {
                cdp,
                process: Mutex::new(None),
                profile: None,
                endpoint: websocket,
            }),
        })
    }

    /// The browser's DevTools websocket.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// The process id of a launched browser.
    pub fn process_id(&self) -> Option<u32> {
        self.inner.process.lock().as_ref().and_then(|p| p.pid)
    }

    /// Whether the DevTools connection is closed (the browser exited or
    /// crashed).
    pub fn is_closed(&self) -> bool {
        self.inner.cdp.is_closed()
    }

    /// Opens `url` in a new tab and waits for it to load.
    pub async fn open(&self, url: &str) -> Result<WebMcpPage, ToolsError> {
        self.open_with(url, PageOptions::default()).await
    }

    /// Opens `url` in a new tab with the given page options.
    pub async fn open_with(
        &self,
        url: &str,
        options: PageOptions,
    ) -> Result<WebMcpPage, ToolsError> {
        let created = self
            .inner
            .cdp
            .call(None, "Target.createTarget", json!({"url": "about:blank"}))
            .await
            .map_err(|e| e.into_tools_error("Target.createTarget"))?;
        let target_id = created["targetId"]
            .as_str()
            .ok_or(ToolsError::BrowserClosed)?
            .to_string();
        let page = WebMcpPage::attach(self.inner.clone(), &target_id, options, true).await?;
        page.navigate(url).await?;
        Ok(page)
    }

    /// The page targets the browser has open (for [`Browser::attach`]).
    pub async fn pages(&self) -> Result<Vec<PageTarget>, ToolsError> {
        let targets = self
            .inner
            .cdp
            .call(None, "Target.getTargets", json!({}))
            .await
            .map_err(|e| e.into_tools_error("Target.getTargets"))?;
        Ok(targets["targetInfos"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["type"] == "page")
            .map(|t| PageTarget {
                target_id: t["targetId"].as_str().unwrap_or_default().to_string(),
                url: t["url"].as_str().unwrap_or_default().to_string(),
                title: t["title"].as_str().unwrap_or_default().to_string(),
            })
            .collect())
    }

    /// Follows a tab that is already open, as it is (no navigation). The tab
    /// stays open when the returned page is dropped.
    pub async fn attach(&self, target_id: &str) -> Result<WebMcpPage, ToolsError> {
        WebMcpPage::attach(self.inner.clone(), target_id, PageOptions::default(), false).await
    }

    /// Stops a launched browser and waits for it to exit. A browser that
    /// was connected to is left running (only this connection ends, when
    /// the last clone and page are dropped). Pages of a stopped browser
    /// answer `unavailable`.
    pub async fn close(self) {
        let process = self.inner.process.lock().take();
        let Some(mut process) = process else {
            return;
        };
        // Asked to close, the browser ends the DevTools connection as it
        // exits; whatever is left after that is killed.
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.inner.cdp.call(None, "Browser.close", json!({})),
        )
        .await;
        let _ =
            tokio::time::timeout(Duration::from_secs(5), self.inner.cdp.closed().cancelled()).await;
        process.stop();
        if tokio::time::timeout(Duration::from_secs(5), process.child.wait())
            .await
            .is_err()
        {
            let _ = process.child.kill().await;
        }
        if let Some(profile) = &self.inner.profile {
            let _ = tokio::fs::remove_dir_all(profile).await;
        }
    }
}
