//! Traces a person can read without a trace backend, and one read back from
//! a real backend: a parent that delegates to a helper (scripted models, so
//! the run is known step by step) is run by the `wma` binary with
//! `--trace-file`, and `wma trace` prints the file as a tree with the
//! helper's run nested under the parent's call; then the same team is
//! exported over OTLP to Arize Phoenix (`phoenix serve` from the venv that
//! scripts/install-peers.sh makes of tools/python/phoenix.txt), and the span
//! tree Phoenix's REST API gives back links the helper's run to the
//! parent's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::run_wma;

/// How long a step may take before the test calls it a hang; the checks
/// pass as soon as what they wait for happens.
const HANG: Duration = Duration::from_secs(60);

const INSTALL_HINT: &str =
    "run scripts/install-peers.sh (it makes the venv of tools/python/phoenix.txt)";

/// `lead` hands the sum to `helper`, which uses the calculator and answers;
/// then `lead` answers with what it was told.
const TEAM: &str = r#"
[providers.lead]
kind = "scripted"
model = "lead-model"
replies = ['{"name": "helper", "arguments": {"task": "Add 2 and 3."}}', "The helper says 2 and 3 make 5."]

[providers.aide]
kind = "scripted"
model = "helper-model"
replies = ['{"name": "calculator", "arguments": {"a": 2, "b": 3, "op": "add"}}', "Two and three make 5."]

[tools.math]
kind = "native"
builtins = ["calculator"]

# The scripted models stand in for small on-device ones; an unmeasured
# model would get the reference loop, whose runs have no rule events.
[agents.lead]
description = "Answers a person."
provider = "lead"
sub_agents = ["helper"]
policy = "small-model"

[agents.helper]
description = "Adds numbers."
provider = "aide"
tools = ["math"]
policy = "small-model"
"#;

/// The spans of the team's run, as (depth, name), parent before child and
/// siblings by start time: the loop's own spans only.
const TEAM_TREE: [(usize, &str); 12] = [
    (0, "invoke_agent lead"),
    (1, "step 1"),
    (2, "chat lead-model"),
    (2, "execute_tool helper"),
    (3, "invoke_agent helper"),
    (4, "step 1"),
    (5, "chat helper-model"),
    (5, "execute_tool calculator"),
    (4, "step 2"),
    (5, "chat helper-model"),
    (1, "step 2"),
    (2, "chat lead-model"),
];

/// A folder of the test's own, removed when dropped (declare it first, so
/// that what runs in it, Phoenix, is stopped before it goes).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("wma-traces-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes the team's config into `dir` and gives its path.
fn team_config(dir: &Path) -> String {
    let config = dir.join("team.toml");
    std::fs::write(&config, TEAM).unwrap();
    config.display().to_string()
}

/// The lines of a printed tree as (depth, span name), events left out:
/// each level of the tree is three characters of drawing (`├─ `, `│  `,
/// `└─ `, or spaces), and the name ends where the columns start (two
/// spaces).
fn outline(printed: &str) -> Vec<(usize, String)> {
    printed
        .lines()
        .skip(1)
        .filter_map(|line| {
            let drawing = line
                .chars()
                .take_while(|c| matches!(c, '│' | '├' | '└' | '─' | ' '))
                .count();
            let rest: String = line.chars().skip(drawing).collect();
            if rest.starts_with('·') {
                return None;
            }
            assert_eq!(drawing % 3, 0, "a tree line of whole levels: {line:?}");
            // A span whose parent is not in the file says so after its name.
            let name = rest.split("  ").next().unwrap();
            let name = name.split(" (parent ").next().unwrap().to_string();
            Some((drawing / 3, name))
        })
        .collect()
}

/// The trace id a run prints on stderr (`... (trace ID)` or `trace ID ...`).
fn printed_trace_id(stderr: &str) -> String {
    stderr
        .split(|c: char| !c.is_ascii_hexdigit())
        .find(|word| word.len() == 32)
        .unwrap_or_else(|| panic!("a trace id on stderr:\n{stderr}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_run_written_to_a_trace_file_prints_as_a_tree_with_the_helper_under_the_call() {
    let dir = Scratch::new("file");
    let config = team_config(&dir);
    let file = dir.join("runs.jsonl");
    let file_arg = file.display().to_string();
    let cache = dir.display().to_string();
    let (ok, stdout, stderr) = run_wma(
        &[
            "--trace-file",
            &file_arg,
            "run",
            "--config",
            &config,
            "What are 2 and 3?",
        ],
        "",
        [("WMA_CACHE_DIR", cache.as_str())],
        HANG,
    )
    .await;
    assert!(ok, "the run answers:\n{stdout}\n{stderr}");
    assert!(stdout.contains("2 and 3 make 5"), "{stdout}");
    let id = printed_trace_id(&stderr);
    assert!(
        stderr.contains(&format!("trace {id} written to {file_arg}")),
        "{stderr}"
    );

    // A second run appends a second trace to the same file.
    let (ok, _, stderr) = run_wma(
        &[
            "--trace-file",
            &file_arg,
            "run",
            "--config",
            &config,
            "And 2 and 3?",
        ],
        "",
        [("WMA_CACHE_DIR", cache.as_str())],
        HANG,
    )
    .await;
    assert!(ok, "{stderr}");
    let second = printed_trace_id(&stderr);
    assert_ne!(id, second);

    let (ok, printed, stderr) = run_wma(
        &["trace", &file_arg, "--trace", &id[..12]],
        "",
        [("WMA_CACHE_DIR", cache.as_str())],
        HANG,
    )
    .await;
    assert!(ok, "{stderr}");
    assert!(
        printed.starts_with(&format!("trace {id}  webmcp-agents  ")),
        "{printed}"
    );
    // Only the trace asked for.
    assert!(!printed.contains(&second), "{printed}");
    let outline = outline(&printed);
    // The run hangs under the command's own span, `wma`, when that span
    // ended in time to be written (see docs/tracing.md); depths count from
    // the parent's run.
    let run = outline
        .iter()
        .position(|(_, name)| name == "invoke_agent lead")
        .unwrap_or_else(|| panic!("the parent's run in\n{printed}"));
    let base = outline[run].0;
    assert!(
        outline[..run].is_empty() || outline[..run] == [(0, "wma".to_string())],
        "{printed}"
    );
    let loop_spans: Vec<(usize, &str)> = outline[run..]
        .iter()
        .filter(|(_, name)| {
            ["invoke_agent ", "step ", "chat ", "execute_tool "]
                .iter()
                .any(|p| name.starts_with(p))
        })
        .map(|(depth, name)| (depth - base, name.as_str()))
        .collect();
    assert_eq!(loop_spans, TEAM_TREE, "\n{printed}");
    // What matters is on the lines: the calculator's tokens and the finish.
    let line = |name: &str| {
        printed
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} in\n{printed}"))
            .to_string()
    };
    assert!(
        line("invoke_agent lead").contains("steps=2 finish=stop"),
        "{printed}"
    );
    assert!(
        line("invoke_agent helper").contains("model=helper-model"),
        "{printed}"
    );
    assert!(line("chat lead-model").contains(" in="), "{printed}");
    // And what the loop's policy did, as events between the spans.
    assert!(printed.contains("· "), "{printed}");

    // Without --trace, both runs, oldest first.
    let (ok, both, _) = run_wma(
        &["trace", &file_arg],
        "",
        [("WMA_CACHE_DIR", cache.as_str())],
        HANG,
    )
    .await;
    assert!(ok);
    let first_at = both.find(&format!("trace {id}")).unwrap();
    let second_at = both.find(&format!("trace {second}")).unwrap();
    assert!(first_at < second_at, "{both}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_file_that_cannot_be_written_stops_the_run_before_it_starts() {
    let dir = Scratch::new("unwritable");
    let config = team_config(&dir);
    let file = dir.join("no-such-folder").join("runs.jsonl");
    let file_arg = file.display().to_string();
    let cache = dir.display().to_string();
    let (ok, stdout, stderr) = run_wma(
        &["--trace-file", &file_arg, "run", "--config", &config, "Hi"],
        "",
        [("WMA_CACHE_DIR", cache.as_str())],
        HANG,
    )
    .await;
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("cannot write the trace file") && stderr.contains(&file_arg),
        "{stderr}"
    );
    // Nothing ran.
    assert!(!stdout.contains("2 and 3"), "{stdout}");
}

/// A `phoenix serve` in a folder of its own, on free ports; killed when
/// dropped.
struct Phoenix {
    child: Child,
    /// Its HTTP port: the UI, the REST API and OTLP over HTTP (`/v1/traces`).
    base: String,
    log: PathBuf,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Phoenix {
    /// Starts Phoenix from the peers' venv and waits until it answers.
    async fn start(dir: &Path) -> Phoenix {
        let phoenix = wma_provider_ort::cache_dir()
            .unwrap_or_else(|e| panic!("no cache folder ({e}): {INSTALL_HINT}"))
            .join(webmcp_agents::eval::tasks::PYTHON_PEERS)
            .join("phoenix/bin/phoenix");
        assert!(
            phoenix.is_file(),
            "{} is missing: {INSTALL_HINT}",
            phoenix.display()
        );
        let (http, grpc) = (free_port(), free_port());
        let log = dir.join("phoenix.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&phoenix)
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", dir.join("phoenix"))
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", http.to_string())
            .env("PHOENIX_GRPC_PORT", grpc.to_string())
            // Nothing leaves the machine.
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .expect("phoenix starts");
        let mut server = Phoenix {
            child,
            base: format!("http://127.0.0.1:{http}"),
            log,
        };
        let client = reqwest::Client::new();
        let started = Instant::now();
        loop {
            if let Ok(response) = client.get(format!("{}/healthz", server.base)).send().await
                && response.status().is_success()
            {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("phoenix ended ({status}):\n{}", server.log_text());
            }
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "phoenix did not answer in time:\n{}",
                server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The spans of trace `id` in `project`, through the REST API.
    async fn spans(&self, project: &str, id: &str) -> Vec<Value> {
        let response = reqwest::Client::new()
            .get(format!(
                "{}/v1/projects/{project}/spans?trace_id={id}&limit=1000",
                self.base
            ))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        if !status.is_success() {
            // The project appears with its first span.
            return Vec::new();
        }
        let body: Value = serde_json::from_str(&body).unwrap();
        body["data"].as_array().cloned().unwrap_or_default()
    }
}

/// The spans under `span` (itself first) as (depth, name), children by
/// start time, from the parent ids Phoenix gives.
fn walk<'a>(spans: &'a [Value], span: &'a Value, depth: usize, out: &mut Vec<(usize, &'a str)>) {
    out.push((depth, span["name"].as_str().unwrap()));
    let id = &span["context"]["span_id"];
    let mut children: Vec<&Value> = spans.iter().filter(|s| &s["parent_id"] == id).collect();
    children.sort_by_key(|s| sortable(s["start_time"].as_str().unwrap()));
    for child in children {
        walk(spans, child, depth + 1, out);
    }
}

/// An ISO time of Phoenix's (all in UTC, six digits of fraction, none at
/// all on a whole second) as text that sorts in time order.
fn sortable(iso: &str) -> String {
    let seconds_end = iso.find('T').expect("an ISO time") + 9;
    if iso[seconds_end..].starts_with('.') {
        iso.to_string()
    } else {
        format!("{}.000000{}", &iso[..seconds_end], &iso[seconds_end..])
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_run_exported_to_phoenix_reads_back_with_the_helper_under_the_parent() {
    let dir = Scratch::new("phoenix");
    let phoenix = Phoenix::start(&dir).await;
    // Where Phoenix shows a trace: every run then prints its link.
    let config = dir.join("team-linked.toml");
    std::fs::write(
        &config,
        format!(
            "{TEAM}\n[telemetry]\ntrace_url = \"{}/redirects/traces/{{trace_id}}\"\n",
            phoenix.base
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let cache = dir.display().to_string();
    let (ok, stdout, stderr) = run_wma(
        &["--otlp", "run", "--config", &config, "What are 2 and 3?"],
        "",
        [
            ("WMA_CACHE_DIR", cache.as_str()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.base.as_str()),
        ],
        HANG,
    )
    .await;
    assert!(ok, "the run answers:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("tracing to {}/v1/traces", phoenix.base)),
        "{stderr}"
    );
    assert!(
        !stderr.contains("could not be sent"),
        "phoenix took the spans:\n{stderr}\n{}",
        phoenix.log_text()
    );
    let id = printed_trace_id(&stderr);
    let link = format!("{}/redirects/traces/{id}", phoenix.base);
    assert!(
        stderr.contains(&format!("see the trace at {link}\n")),
        "{stderr}"
    );

    // Phoenix files spans in the background: wait for the whole run. The
    // project is named by the service (`openinference.project.name`).
    let started = Instant::now();
    let spans = loop {
        let spans = phoenix.spans("webmcp-agents", &id).await;
        let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
        if ["invoke_agent lead", "invoke_agent helper", "step 2"]
            .iter()
            .all(|n| names.contains(n))
            && names.len() >= TEAM_TREE.len()
        {
            break spans;
        }
        assert!(
            started.elapsed() < HANG,
            "phoenix has the run's spans (has {names:?}):\n{}",
            phoenix.log_text()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let by_id: HashMap<&str, &Value> = spans
        .iter()
        .map(|s| (s["context"]["span_id"].as_str().unwrap(), s))
        .collect();
    for span in &spans {
        assert_eq!(span["context"]["trace_id"], id.as_str());
    }
    let named = |name: &str| {
        let found: Vec<&&Value> = by_id.values().filter(|s| s["name"] == name).collect();
        assert_eq!(found.len(), 1, "one {name} in {spans:#?}");
        *found[0]
    };
    // The helper's run, up to the parent's run, through the parents Phoenix
    // keeps (above it, the command's own `wma` span when it ended in time).
    let mut chain = Vec::new();
    let mut span = named("invoke_agent helper");
    while span["name"] != "invoke_agent lead" {
        let parent = span["parent_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{} has a parent: {spans:#?}", span["name"]));
        span = by_id
            .get(parent)
            .unwrap_or_else(|| panic!("the parent {parent} is in phoenix: {spans:#?}"));
        chain.push(span["name"].as_str().unwrap());
    }
    assert_eq!(
        chain,
        ["execute_tool helper", "step 1", "invoke_agent lead"]
    );
    // The whole tree under the parent's run is the one the file shows.
    let mut tree = Vec::new();
    walk(&spans, named("invoke_agent lead"), 0, &mut tree);
    assert_eq!(tree, TEAM_TREE, "{spans:#?}");
    // And what the spans carry arrives too: the helper's model and steps.
    let helper = named("invoke_agent helper");
    assert_eq!(
        helper["attributes"]["gen_ai.request.model"], "helper-model",
        "{helper:#}"
    );
    assert_eq!(helper["attributes"]["wma.steps"], 2, "{helper:#}");
    drop(phoenix);
}
