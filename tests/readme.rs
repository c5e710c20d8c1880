//! Every command README.md shows, run as written: a README command that
//! does not work fails this test, naming its line.
//!
//! The rules the README keeps, and how each command is run:
//!
//! - **Where commands are.** A command to type is a line of a ```` ```sh ````
//!   block: one command per line, a line ending in `\` goes on on the
//!   next, lines starting with `#` are comments. A fence of another shell
//!   (`bash`, `shell`, `console`, `zsh`) or without a language is an
//!   error, so a command cannot be added where this test does not see it.
//!   Commands in the prose or in the table of commands (which shows their
//!   syntax, with placeholders) are not run.
//! - **As written.** Each line runs with `sh -c`, unchanged, in the
//!   reader's environment (the cache folder the set-up filled, its token),
//!   with a folder first on `PATH` whose `wma` is the binary under test,
//!   and without the variables cargo and nextest set for a test
//!   (`CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`, ...), which no reader's shell
//!   has.
//!   It must exit with status 0. Placeholders have no place in a block:
//!   the README writes real names (`runs.jsonl`, `configs/mcp-files.toml`).
//! - **Where.** The blocks run in order, each in a fresh folder that holds
//!   a link to every entry of the checkout's root (`configs`, `examples`,
//!   `scripts`, `tools`, ...): the paths read as from the root, as the
//!   README says to type them, and what a command writes (a trace file)
//!   stays in that folder. A line that starts with `cargo` or with a script
//!   of `scripts/` runs in the checkout itself: cargo keys its build cache
//!   by the checkout's path, so from a copy it would build everything
//!   again. The cargo lines are run as written, `cargo run --release`
//!   included: they share the checkout's release build, so they take
//!   seconds when it is up to date, and the first of them builds it when
//!   it is not (a clean checkout, changed sources), which takes minutes.
//! - **`cargo install`** runs as written with `CARGO_INSTALL_ROOT` set to a
//!   scratch folder, so it leaves the reader's `~/.cargo/bin` alone; the
//!   `wma` it installed must answer `--version`.
//! - **The test command**, `scripts/test.sh`, is not run: it runs this
//!   test. The test checks that the README shows it, and the set-up
//!   command, as written, and that `.ci/run` runs it.
//! - **Commands that serve** keep running for the rest of their block (the
//!   lines after them talk to them, as from a second terminal), then are
//!   stopped with SIGTERM (each runs as `sh -c 'exec LINE'`, so the signal
//!   and the exit status are the server's own). `wma serve` must print where it listens and
//!   answer `GET /v1/health` and `GET /` there; `wma mcp --listen ADDR` must
//!   answer an MCP `initialize` and `tools/list` at `/mcp` with the host's
//!   token; both must then exit with 0. `python3 -m http.server PORT` must
//!   answer `GET /`. `wma mcp` on stdio gets an `initialize` and a
//!   `tools/list` on its stdin, must answer both, and must exit with 0 when
//!   its stdin closes.
//! - **`wma chat`** types the lines the README shows after `you> ` in the
//!   ```` ```text ```` block right after the chat's block, then ends its
//!   input: it must print a reply to each and exit with 0.
//! - Nothing is downloaded at test time: the models are the set-up's.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// The checkout's root.
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The README's test command, which this test does not run (it would run
/// itself) but requires, as written.
const TEST_COMMAND: &str = "scripts/test.sh";

/// The README's set-up command: the set-up, then a real agent run.
const SETUP_COMMAND: &str = "scripts/setup.sh && cargo run --release -- run";

/// How long a cargo line may take: the first builds the release binary
/// when a clean checkout has none.
const CARGO_LIMIT: Duration = Duration::from_secs(30 * 60);

/// How long any other line may take (a real model run takes seconds).
const LIMIT: Duration = Duration::from_secs(5 * 60);

/// How long a serving command may take to answer (it loads a model first).
const SERVE_LIMIT: Duration = Duration::from_secs(120);

/// One command of the README.
#[derive(Debug, Clone)]
struct Line {
    /// Its line number in README.md (the first, for a continued one).
    number: usize,
    /// The command as written, continuation lines joined.
    text: String,
}

/// A fenced block of the README.
#[derive(Debug)]
struct Block {
    /// The fence's language (`sh`, `text`, `toml`, ...).
    language: String,
    /// The line of its opening fence.
    number: usize,
    /// Its lines, with their numbers.
    lines: Vec<(usize, String)>,
}

/// The README's fenced blocks, in order; an unclosed fence is an error.
fn blocks(readme: &str) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in readme.lines().enumerate() {
        let number = i + 1;
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                open = Some(Block {
                    language: info.split([',', ' ']).next().unwrap_or("").to_string(),
                    number,
                    lines: Vec::new(),
                })
            }
            (Some(_), Some(_)) => blocks.extend(open.take()),
            (Some(block), None) => block.lines.push((number, line.to_string())),
            (None, None) => {}
        }
    }
    match open {
        Some(block) => Err(format!(
            "README.md line {}: a fence that is never closed",
            block.number
        )),
        None => Ok(blocks),
    }
}

/// The commands of an `sh` block: comments and blank lines left out, a
/// line ending in `\` joined with the next.
fn commands(block: &Block) -> Vec<Line> {
    let mut commands: Vec<Line> = Vec::new();
    let mut continued = false;
    for (number, line) in &block.lines {
        let trimmed = line.trim();
        if !continued && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        let (part, goes_on) = match trimmed.strip_suffix('\\') {
            Some(part) => (part.trim_end(), true),
            None => (trimmed, false),
        };
        match commands.last_mut() {
            Some(last) if continued => {
                last.text.push(' ');
                last.text.push_str(part);
            }
            _ => commands.push(Line {
                number: *number,
                text: part.to_string(),
            }),
        }
        continued = goes_on;
    }
    commands
}

/// What a line is, as far as running it goes.
#[derive(Debug, PartialEq)]
enum Kind {
    /// Runs to its end.
    Plain,
    /// `wma serve`: an HTTP API and page, wherever it says it listens.
    WmaServe,
    /// `wma mcp --listen ADDR`.
    McpHttp,
    /// `wma mcp` on stdio.
    McpStdio,
    /// `wma chat`: the lines to type come from the README.
    Chat,
    /// `python3 -m http.server PORT`, on this address.
    HttpServer(String),
    /// `cargo install`.
    CargoInstall,
}

/// The words of a line (split on white space; the serving commands the
/// README shows quote nothing).
fn words(text: &str) -> Vec<&str> {
    text.split_whitespace().collect()
}

fn kind(line: &Line) -> Kind {
    let words = words(&line.text);
    match words.as_slice() {
        ["wma", rest @ ..] => {
            // The flags of every command may come before its name.
            let mut rest = rest;
            loop {
                match rest {
                    ["--otlp", tail @ ..] => rest = tail,
                    ["--trace-file", _, tail @ ..] => rest = tail,
                    _ => break,
                }
            }
            match rest {
                ["serve", ..] => Kind::WmaServe,
                ["mcp", flags @ ..] if flags.iter().any(|f| f.starts_with("--listen")) => {
                    Kind::McpHttp
                }
                ["mcp", ..] => Kind::McpStdio,
                ["chat", flags @ ..] if !flags.contains(&"--sessions") => Kind::Chat,
                _ => Kind::Plain,
            }
        }
        ["python3", "-m", "http.server", port, flags @ ..] => {
            let host = flags
                .iter()
                .position(|f| *f == "--bind")
                .and_then(|i| flags.get(i + 1))
                .copied()
                .unwrap_or("127.0.0.1");
            Kind::HttpServer(format!("{host}:{port}"))
        }
        ["cargo", "install", ..] => Kind::CargoInstall,
        _ => Kind::Plain,
    }
}

/// Whether the line runs in the checkout itself rather than in the
/// block's folder.
fn in_checkout(line: &Line) -> bool {
    line.text.starts_with("cargo ") || line.text.starts_with("scripts/")
}

/// A scratch folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("wma-readme-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A folder that holds a link to every entry of the checkout's root but
/// `.git` and `target`.
fn mirror(name: &str) -> Scratch {
    let scratch = Scratch::new(name);
    for entry in std::fs::read_dir(ROOT).unwrap() {
        let entry = entry.unwrap();
        let file = entry.file_name();
        if file == ".git" || file == "target" {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), scratch.0.join(&file)).unwrap();
    }
    scratch
}

/// Whether `name` is a variable cargo or nextest set for this test's
/// process rather than one of the reader's shell (`CARGO_PKG_NAME`,
/// `CARGO_MANIFEST_DIR`, `NEXTEST_RUN_ID`, ...). A command runs without
/// them: build scripts that read such a variable make cargo build again
/// whenever its value changes, so a cargo line run with this package's
/// values would rebuild the release binary it shares with the reader.
fn set_for_tests(name: &str) -> bool {
    const PREFIXES: [&str; 6] = [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
        "NEXTEST",
        "__NEXTEST",
    ];
    const NAMES: [&str; 5] = [
        "CARGO",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name)
}

/// What every line runs with.
struct Setting {
    /// The folder whose `wma` is the binary under test, first on `PATH`.
    bin: Scratch,
    /// Where `cargo install` installs.
    install_root: Scratch,
}

impl Setting {
    fn new() -> Self {
        let bin = Scratch::new("bin");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_wma"), bin.0.join("wma")).unwrap();
        Setting {
            bin,
            install_root: Scratch::new("install"),
        }
    }

    /// `sh -c LINE` in `dir`, in a process group of its own (so all it
    /// started can be stopped together), its output piped.
    fn command(&self, line: &Line, dir: &Path) -> Command {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.bin.0.clone()];
        paths.extend(std::env::split_paths(&path));
        let mut command = Command::new("sh");
        for (name, _) in std::env::vars_os() {
            if set_for_tests(&name.to_string_lossy()) {
                command.env_remove(name);
            }
        }
        command
            .arg("-c")
            .arg(&line.text)
            .current_dir(dir)
            .env("PATH", std::env::join_paths(paths).unwrap())
            .env("CARGO_INSTALL_ROOT", &self.install_root.0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        command
    }
}

/// A command started and not yet ended: its process group is killed when
/// it is dropped.
struct Running {
    line: Line,
    child: Child,
    /// Its stderr (and for a server, its stdout after the line read),
    /// collected in the background.
    stderr: tokio::task::JoinHandle<String>,
}

impl Running {
    /// Starts a serving line as `sh -c 'exec LINE'`: the same command, with
    /// the server in the shell's place, so that the SIGTERM that stops it
    /// is the server's to handle, and its exit status is the server's.
    fn start(setting: &Setting, line: &Line, dir: &Path) -> Self {
        let exec = Line {
            number: line.number,
            text: format!("exec {}", line.text),
        };
        let mut child = setting
            .command(&exec, dir)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: sh does not start: {e}", at(line)));
        let mut stderr = child.stderr.take().unwrap();
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let mut bytes = Vec::new();
            let _ = stderr.read_to_end(&mut bytes).await;
            text.push_str(&String::from_utf8_lossy(&bytes));
            text
        });
        Running {
            line: line.clone(),
            child,
            stderr,
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), signal);
        }
    }

    /// Waits for the end, up to `limit`; gives the status, stdout and
    /// stderr.
    async fn finish(mut self, limit: Duration) -> (ExitStatus, String, String) {
        // A server's stdout was read up to where it listens, then drained.
        let stdout = self.child.stdout.take();
        let read = tokio::spawn(async move {
            let mut bytes = Vec::new();
            if let Some(mut stdout) = stdout {
                let _ = stdout.read_to_end(&mut bytes).await;
            }
            String::from_utf8_lossy(&bytes).to_string()
        });
        let status = match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                self.signal(nix::sys::signal::Signal::SIGKILL);
                let stderr = excerpt(&(&mut self.stderr).await.unwrap_or_default());
                panic!(
                    "{}: still running after {} s\n--- stderr ---\n{stderr}",
                    at(&self.line),
                    limit.as_secs()
                );
            }
        };
        let stdout = read.await.unwrap_or_default();
        let stderr = (&mut self.stderr).await.unwrap_or_default();
        (status, stdout, stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
    }
}

/// "README.md line N: `COMMAND`", for messages.
fn at(line: &Line) -> String {
    format!("README.md line {}: `{}`", line.number, line.text)
}

/// A command's output, shortened to its first and last lines: enough to
/// see why it failed (an error's message leads, a backtrace follows it).
fn excerpt(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= 40 {
        return lines.join("\n");
    }
    format!(
        "{}\n[… {} lines …]\n{}",
        lines[..15].join("\n"),
        lines.len() - 40,
        lines[lines.len() - 25..].join("\n")
    )
}

/// Fails, naming the line, unless the command exited with 0.
fn assert_success(line: &Line, (status, stdout, stderr): &(ExitStatus, String, String)) {
    assert!(
        status.success(),
        "{}: {status}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        at(line),
        excerpt(stdout),
        excerpt(stderr)
    );
}

/// Runs a line to its end with `input` on its stdin.
async fn run_to_end(
    setting: &Setting,
    line: &Line,
    dir: &Path,
    input: Option<String>,
    limit: Duration,
) -> (ExitStatus, String, String) {
    let mut command = setting.command(line, dir);
    if input.is_some() {
        command.stdin(Stdio::piped());
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("{}: sh does not start: {e}", at(line)));
    if let Some(input) = input {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).await.unwrap();
    }
    let mut stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes).await;
        String::from_utf8_lossy(&bytes).to_string()
    });
    Running {
        line: line.clone(),
        child,
        stderr,
    }
    .finish(limit)
    .await
}

/// A serving command started: it answered, and runs until the end of its
/// block.
struct Server {
    running: Running,
    /// Whether it must exit with 0 on SIGTERM (wma's servers do).
    clean_stop: bool,
}

impl Server {
    async fn stop(self) {
        self.running.signal(nix::sys::signal::Signal::SIGTERM);
        let line = self.running.line.clone();
        let (status, stdout, stderr) = self.running.finish(Duration::from_secs(60)).await;
        if self.clean_stop {
            assert!(
                status.success(),
                "{}: after SIGTERM, {status}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                at(&line),
                excerpt(&stdout),
                excerpt(&stderr)
            );
        }
    }
}

/// Reads `running`'s stdout until a line starts with `prefix`, and gives
/// the rest of that line; fails, naming the README line, when the command
/// ends first or says nothing in time.
async fn wait_for_line(running: &mut Running, prefix: &str) -> String {
    let stdout = running.child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(SERVE_LIMIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix(prefix) {
                return Some(rest.to_string());
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(rest)) => {
            // The rest of stdout is drained, so the server never blocks on it.
            tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
            rest
        }
        Ok(None) => {
            let status = running.child.wait().await.unwrap();
            let stderr = (&mut running.stderr).await.unwrap_or_default();
            panic!(
                "{}: ended ({status}) before it printed `{prefix}…`\n--- stderr ---\n{}",
                at(&running.line),
                excerpt(&stderr)
            )
        }
        Err(_) => panic!(
            "{}: did not print `{prefix}…` within {} s",
            at(&running.line),
            SERVE_LIMIT.as_secs()
        ),
    }
}

/// The host's bearer token, where `wma serve` and `wma mcp --listen` keep
/// it when the config names none.
fn host_token() -> String {
    let cache = wma_provider_ort::cache_dir().expect("a cache folder");
    std::fs::read_to_string(cache.join("http-token"))
        .expect("the host's token is in the cache folder")
        .trim()
        .to_string()
}

/// GET `url`, retried until it answers 200 or `limit` passes; its body.
async fn get_ok(line: &Line, url: &str, token: Option<&str>) -> String {
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + SERVE_LIMIT;
    loop {
        let mut request = client.get(url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => {
                return response.text().await.unwrap_or_default();
            }
            other if tokio::time::Instant::now() > deadline => panic!(
                "{}: GET {url} did not answer 200: {:?}",
                at(line),
                other.map(|r| r.status())
            ),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// The JSON-RPC messages of an MCP answer, sent as JSON or as events.
fn mcp_messages(body: &str) -> Vec<Value> {
    match serde_json::from_str::<Value>(body) {
        Ok(value) => vec![value],
        Err(_) => body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect(),
    }
}

/// An MCP client's first request.
fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "readme-test", "version": "1"}
    }})
}

/// Fails unless `answers` hold an `initialize` result and a `tools/list`
/// result with a tool.
fn assert_mcp_answers(line: &Line, answers: &[Value]) {
    let result = |id: i64| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .map(|a| a["result"].clone())
            .unwrap_or(Value::Null)
    };
    assert!(
        result(1)["serverInfo"].is_object(),
        "{}: no initialize result: {answers:?}",
        at(line)
    );
    let tools = result(2)["tools"].as_array().cloned().unwrap_or_default();
    assert!(
        !tools.is_empty(),
        "{}: tools/list gave no tool: {answers:?}",
        at(line)
    );
}

/// Starts a serving command and checks that it answers.
async fn serve(setting: &Setting, line: &Line, dir: &Path, kind: &Kind) -> Server {
    let mut running = Running::start(setting, line, dir);
    match kind {
        Kind::WmaServe => {
            let addr = wait_for_line(&mut running, "http listening on http://").await;
            let health = get_ok(line, &format!("http://{addr}/v1/health"), None).await;
            assert!(health.contains("status"), "{}: {health}", at(line));
            let page = get_ok(line, &format!("http://{addr}/"), None).await;
            assert!(page.contains("<html"), "{}: `GET /` is no page", at(line));
        }
        Kind::McpHttp => {
            let url = wait_for_line(&mut running, "mcp listening on ").await;
            let token = host_token();
            let client = reqwest::Client::new();
            let mut answers = Vec::new();
            for request in [
                initialize(),
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            ] {
                let response = client
                    .post(&url)
                    .bearer_auth(&token)
                    .header("accept", "application/json, text/event-stream")
                    .header("content-type", "application/json")
                    .body(request.to_string())
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("{}: POST {url}: {e}", at(line)));
                let status = response.status();
                let body = response.text().await.unwrap_or_default();
                assert!(status.is_success(), "{}: {status} {body}", at(line));
                answers.extend(mcp_messages(&body));
            }
            assert_mcp_answers(line, &answers);
        }
        Kind::HttpServer(addr) => {
            get_ok(line, &format!("http://{addr}/"), None).await;
        }
        other => unreachable!("{other:?} does not serve"),
    }
    Server {
        running,
        clean_stop: !matches!(kind, Kind::HttpServer(_)),
    }
}

/// `wma mcp` on stdio: an `initialize` and a `tools/list`, then its stdin
/// closes.
async fn mcp_stdio(setting: &Setting, line: &Line, dir: &Path) {
    let mut command = setting.command(line, dir);
    command.stdin(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut answers = Vec::new();
    let talk = async {
        for request in [
            initialize(),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        ] {
            stdin
                .write_all(format!("{request}\n").as_bytes())
                .await
                .unwrap();
        }
        while let Ok(Some(out)) = lines.next_line().await {
            let answer: Value = serde_json::from_str(&out).unwrap_or_else(|e| {
                panic!("{}: stdout carries `{out}`, not JSON-RPC: {e}", at(line))
            });
            let done = answer["id"] == 2;
            answers.push(answer);
            if done {
                break;
            }
        }
    };
    tokio::time::timeout(SERVE_LIMIT, talk)
        .await
        .unwrap_or_else(|_| panic!("{}: no answer to tools/list in time", at(line)));
    assert_mcp_answers(line, &answers);
    drop(stdin);
    let stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut bytes = Vec::new();
        let mut stderr = stderr;
        let _ = stderr.read_to_end(&mut bytes).await;
        String::from_utf8_lossy(&bytes).to_string()
    });
    let running = Running {
        line: line.clone(),
        child,
        stderr,
    };
    let ended = running.finish(LIMIT).await;
    assert_success(line, &ended);
}

/// The lines a person types in the ```text block after block `index`:
/// those after `you> `.
fn typed_lines(blocks: &[&Block], index: usize, line: &Line) -> String {
    let typed: Vec<String> = blocks
        .get(index + 1)
        .filter(|b| b.language == "text")
        .map(|b| {
            b.lines
                .iter()
                .filter_map(|(_, l)| l.strip_prefix("you> "))
                .map(|l| format!("{l}\n"))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !typed.is_empty(),
        "{}: a chat needs a ```text block after its block that shows what to type after `you> `",
        at(line)
    );
    typed.concat()
}

/// The README's blocks of commands, checked for fences that would hide a
/// command.
fn readme_blocks() -> Vec<Block> {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let blocks = blocks(&readme).unwrap_or_else(|e| panic!("{e}"));
    for block in &blocks {
        assert!(
            !["", "bash", "shell", "console", "zsh", "shell-session"]
                .contains(&block.language.as_str()),
            "README.md line {}: a ```{} block: commands go in ```sh blocks (tests/readme.rs runs those), output in ```text",
            block.number,
            block.language
        );
    }
    blocks
}

#[test]
fn the_readme_keeps_its_rules_of_blocks() {
    let text = "a\n```sh\n# note\nwma run \\\n  \"Hi\"\n\nwma models\n```\n```text\nyou> Hi\n```\n";
    let found = blocks(text).unwrap();
    assert_eq!(found.len(), 2);
    let lines = commands(&found[0]);
    assert_eq!(lines.len(), 2);
    assert_eq!(
        (lines[0].number, lines[0].text.as_str()),
        (4, "wma run \"Hi\"")
    );
    assert_eq!((lines[1].number, lines[1].text.as_str()), (7, "wma models"));
    assert!(blocks("```sh\nwma run\n").is_err(), "an unclosed fence");
    let line = |text: &str| Line {
        number: 1,
        text: text.to_string(),
    };
    assert_eq!(kind(&line("wma serve")), Kind::WmaServe);
    assert_eq!(
        kind(&line("wma --otlp serve --config x.toml")),
        Kind::WmaServe
    );
    assert_eq!(
        kind(&line("wma mcp --listen 127.0.0.1:8765")),
        Kind::McpHttp
    );
    assert_eq!(kind(&line("wma mcp --config x.toml")), Kind::McpStdio);
    assert_eq!(kind(&line("wma chat --config x.toml")), Kind::Chat);
    assert_eq!(kind(&line("wma chat --sessions")), Kind::Plain);
    assert_eq!(
        kind(&line("wma --trace-file runs.jsonl run \"Hi\"")),
        Kind::Plain
    );
    assert_eq!(
        kind(&line(
            "python3 -m http.server 8000 --bind 127.0.0.1 --directory x"
        )),
        Kind::HttpServer("127.0.0.1:8000".to_string())
    );
    assert_eq!(
        kind(&line("cargo install --path . --locked")),
        Kind::CargoInstall
    );
    assert!(in_checkout(&line("cargo run --release -- run")));
    assert!(in_checkout(&line(
        "scripts/setup.sh && cargo run --release -- run"
    )));
    assert!(!in_checkout(&line("wma run")));
    assert!(set_for_tests("CARGO_PKG_NAME") && set_for_tests("CARGO"));
    assert!(!set_for_tests("CARGO_HOME") && !set_for_tests("CARGO_TARGET_DIR"));
}

#[test]
fn the_readme_shows_the_two_set_up_commands_and_ci_runs_its_test_command() {
    let shown: Vec<String> = readme_blocks()
        .iter()
        .filter(|b| b.language == "sh")
        .flat_map(commands)
        .map(|l| l.text)
        .collect();
    for command in [SETUP_COMMAND, TEST_COMMAND] {
        assert!(
            shown.iter().any(|c| c == command),
            "README.md shows `{command}` as a command of a ```sh block"
        );
    }
    let ci = std::fs::read_to_string(Path::new(ROOT).join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == TEST_COMMAND),
        ".ci/run runs the README's test command, `{TEST_COMMAND}`"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_of_the_readme_works_as_written() {
    // The WebMCP example runs Chromium.
    let _chromium = crate::support::CHROMIUM.read().await;
    let setting = Setting::new();
    let blocks = readme_blocks();
    let blocks: Vec<&Block> = blocks.iter().collect();
    let mut ran = 0;
    for (index, block) in blocks.iter().enumerate() {
        if block.language != "sh" {
            continue;
        }
        let folder = mirror(&format!("block{index}"));
        let mut servers: Vec<Server> = Vec::new();
        for line in commands(block) {
            if line.text == TEST_COMMAND {
                continue;
            }
            let dir = if in_checkout(&line) {
                Path::new(ROOT)
            } else {
                folder.0.as_path()
            };
            eprintln!("README.md line {}: {}", line.number, line.text);
            let started = std::time::Instant::now();
            match kind(&line) {
                Kind::Plain => {
                    let limit = if in_checkout(&line) {
                        CARGO_LIMIT
                    } else {
                        LIMIT
                    };
                    let ended = run_to_end(&setting, &line, dir, None, limit).await;
                    assert_success(&line, &ended);
                }
                Kind::CargoInstall => {
                    let ended = run_to_end(&setting, &line, dir, None, CARGO_LIMIT).await;
                    assert_success(&line, &ended);
                    let installed = setting.install_root.0.join("bin").join("wma");
                    let version = std::process::Command::new(&installed)
                        .arg("--version")
                        .output()
                        .unwrap_or_else(|e| {
                            panic!("{}: {} does not run: {e}", at(&line), installed.display())
                        });
                    assert!(
                        version.status.success(),
                        "{}: the installed wma does not answer --version",
                        at(&line)
                    );
                }
                Kind::Chat => {
                    let typed = typed_lines(&blocks, index, &line);
                    let ended = run_to_end(&setting, &line, dir, Some(typed), LIMIT).await;
                    assert_success(&line, &ended);
                    assert!(
                        ended.1.contains("assistant:"),
                        "{}: no reply\n--- stdout ---\n{}",
                        at(&line),
                        excerpt(&ended.1)
                    );
                }
                Kind::McpStdio => mcp_stdio(&setting, &line, dir).await,
                serving => servers.push(serve(&setting, &line, dir, &serving).await),
            }
            eprintln!("  ok in {:.1} s", started.elapsed().as_secs_f64());
            ran += 1;
        }
        for server in servers {
            server.stop().await;
        }
    }
    assert!(ran > 0, "README.md shows no command in a ```sh block");
}
