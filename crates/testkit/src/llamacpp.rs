//! A real llama.cpp server for tests of the served-model provider:
//! `scripts/serve_llamacpp.py` (llama.cpp's own server code, in process,
//! from the pinned `xllamacpp` wheel that `scripts/install-peers.sh` puts
//! into the project's venv) serving a GGUF on a free loopback port.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a server may take to load its model before the test calls it
/// a failure (the default GGUF loads in about a second).
const READY_WAIT: Duration = Duration::from_secs(120);

/// The project's cache folder, found as the runtime finds it:
/// `$WMA_CACHE_DIR`, else `$XDG_CACHE_HOME/webmcp-agents`, else
/// `~/.cache/webmcp-agents`.
pub fn cache_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("WMA_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("webmcp-agents");
    }
    let home = var("HOME").map(PathBuf::from).unwrap_or_default();
    home.join(".cache").join("webmcp-agents")
}

/// The default model's GGUF, which `scripts/setup.sh` downloads.
pub fn default_gguf() -> PathBuf {
    cache_dir()
        .join("downloads")
        .join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// A llama.cpp server process; killed when dropped.
pub struct LlamaServer {
    child: Child,
    /// Held open: the launcher stops serving when its stdin closes, so a
    /// test that dies takes its server with it.
    _stdin: Option<ChildStdin>,
    url: String,
}

impl std::fmt::Debug for LlamaServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl LlamaServer {
    /// Starts the default GGUF with a context of `ctx` tokens and waits
    /// until it answers. The error says what to set up when something is
    /// missing.
    pub fn start_default(ctx: u32) -> Result<Self, String> {
        Self::start(&default_gguf(), ctx)
    }

    /// Starts `gguf` with a context of `ctx` tokens and waits until it
    /// answers.
    pub fn start(gguf: &Path, ctx: u32) -> Result<Self, String> {
        let python = cache_dir().join("venv").join("bin").join("python");
        if !python.is_file() {
            return Err(format!(
                "no Python venv at {}: run scripts/setup.sh",
                python.display()
            ));
        }
        if !gguf.is_file() {
            return Err(format!(
                "no GGUF at {}: run scripts/setup.sh",
                gguf.display()
            ));
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts/serve_llamacpp.py")
            .canonicalize()
            .map_err(|e| format!("scripts/serve_llamacpp.py: {e}"))?;
        let mut child = Command::new(&python)
            .arg(&script)
            .arg(gguf)
            .args(["--ctx", &ctx.to_string(), "--threads", "2"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", script.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = mpsc::channel::<Result<String, String>>();
        let err_tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("ready ") {
                    let _ = tx.send(Ok(url.trim().to_string()));
                }
            }
            let _ = tx.send(Err("the server exited before it was ready".into()));
        });
        // The server's log: kept for the error when it never gets ready,
        // drained after so that the pipe never fills.
        std::thread::spawn(move || {
            let mut tail: Vec<String> = Vec::new();
            let mut reported = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !reported {
                    tail.push(line.clone());
                    if tail.len() > 20 {
                        tail.remove(0);
                    }
                    if line.contains("No module named 'xllamacpp'") {
                        reported = true;
                        let _ = err_tx.send(Err(
                            "xllamacpp is not in the venv: run scripts/install-peers.sh".into(),
                        ));
                    }
                }
            }
            if !reported {
                let _ = err_tx.send(Err(format!(
                    "the server exited before it was ready:\n{}",
                    tail.join("\n")
                )));
            }
        });
        let outcome = rx
            .recv_timeout(READY_WAIT)
            .map_err(|_| format!("the server was not ready in {} s", READY_WAIT.as_secs()))
            .and_then(|r| r);
        match outcome {
            Ok(url) => Ok(Self {
                child,
                _stdin: stdin,
                url,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// The server's address (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Kills the server at once (SIGKILL), as a crash would, and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.kill();
    }
}
