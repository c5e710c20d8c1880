//! A loopback soak of `wma serve`: the real HTTP server, started in this
//! process on `127.0.0.1` with a random port and a token, hosting a config
//! of scripted providers (so it runs anywhere, without a model), driven
//! through its HTTP API by concurrent clients while adversarial load runs
//! beside them.
//!
//! Each phase runs the same steady workload (workers that each start runs
//! of an agent of their own, `lead-{i}`, which delegates to `helper-{i}`,
//! and read each run's event stream to the end) for a fixed time, with one
//! kind of adversary beside it:
//!
//! | phase | adversary |
//! |---|---|
//! | `reference` | none: the baseline the other rows are compared with |
//! | `disconnects` | clients that drop their run's stream mid-way |
//! | `stop-storm` | stops of running runs, of ended ones, of unknown, malformed and other agents' ids |
//! | `swaps` | `PUT /v1/agents/{agent}/provider` from two clients, one swap each 25 ms (409s expected), and unknown providers |
//! | `conn-flood` | idle and slowloris TCP connections from one address (`127.0.0.1`), three times the connection cap, plus a probe from an address of its own that opens a fresh connection for each health check |
//! | `body-flood` | oversized bodies (declared and chunked), slow bodies, wrong media types, bad JSON |
//! | `reference-after` | none again: the baseline once everything else has happened |
//!
//! It prints, per phase, runs/s, the time from sending a run's request to
//! its terminal event (p50, p90, p99), errors, refusals and what the
//! adversary saw, side by side with the reference phase; then checks, and
//! exits non-zero when one fails:
//!
//! - every stream read to its end has exactly one depth-0 terminal event
//!   (`finish` or `error`), and it is the last event;
//! - after each phase, and at the end, `GET /v1/health` reports no active
//!   run and no generation in flight;
//! - every client address whose runs were cut off can run as many runs at
//!   once as the per-client cap allows (its slots were freed);
//! - resident memory (`VmRSS`), open file descriptors and threads of this
//!   process (server and clients) after the last phase are near what they
//!   were after the first.
//!
//! Nothing here asserts on a duration: timings are printed, and the only
//! time bounds are the phase lengths and a generous hang guard.
//!
//! The server runs with its connection caps at their defaults, so in
//! `conn-flood` the flooding address meets `max_connections_per_client`
//! first and its new connections close its own oldest idle ones, while the
//! workers and the probe each come from an address of their own. What that
//! cap is for, a client whose connections all have a request in progress,
//! is measured apart, against the same flood with the cap lifted:
//! `cargo run --example conn_flood` (about 25 s) prints both
//! rows beside a no-flood reference.
//!
//! Every steady run does the same work (two steps of its lead, one of its
//! helper, each a scripted reply after `--delay-ms`), so the latencies of
//! the phases compare. The `vs ref` columns divide a phase's runs/s and
//! p50 by the reference phase's.
//!
//! Run it with `cargo bench --bench serve_soak` (about a minute); options
//! go after `--`, for example `cargo bench --bench serve_soak -- --seconds
//! 20 --workers 4`, and `-- --help` lists them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use parking_lot::Mutex;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use webmcp_agents::config::{Config, StartOptions};
use webmcp_agents::serve::{self, ServerOptions, TokenSource};

/// How long one request or stream may take before it is called a hang.
/// Not a measure of speed: a healthy run ends in milliseconds, and a run
/// that reaches this is reported as an error, not waited on forever.
const HANG: Duration = Duration::from_secs(30);

/// How long the end-of-phase check waits for the server's active runs to
/// drain to zero before it calls them leaked.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// The server's header and body timeouts in this bench. The defaults (10 s
/// and 30 s) would let one flooded connection or one slow body outlast a
/// phase; shorter ones make the server's cut-offs happen, and be counted,
/// within it. Every other limit is the server's default.
const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// See [`HEADER_TIMEOUT`].
const BODY_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs a client starts on its agent before it gives the agent fresh
/// scripts (see [`Bench::fresh_script`]); a script holds replies for a few
/// more than this.
const RUNS_PER_SCRIPT: u64 = 100;

/// What a worker asks its lead agent to do.
const RUN_BODY: &str = r#"{"input": "Say hello"}"#;

/// The loopback soak of `wma serve`; see the module documentation.
#[derive(Debug, Parser)]
#[command(name = "serve_soak", about = "Loopback soak benchmark of `wma serve`")]
struct Args {
    /// Seconds for all phases together, shared equally.
    #[arg(long, default_value_t = 56.0)]
    seconds: f64,
    /// Steady workers (each runs one run at a time, from its own address).
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Runs one phase may start at most, all clients together; a phase
    /// that reaches it ends early.
    #[arg(long, default_value_t = 20000)]
    max_runs: usize,
    /// Milliseconds each scripted reply takes (a stand-in for generation).
    #[arg(long, default_value_t = 5)]
    delay_ms: u64,
    /// Idle connections the flood holds open (default: three times the
    /// server's connection cap).
    #[arg(long)]
    flood: Option<usize>,
    /// The phases to run, in order, by name (repeats allowed), e.g.
    /// `reference,disconnects,disconnects`; default all seven. The first
    /// one's end is the "before" of the memory, descriptor and thread checks.
    #[arg(long, value_delimiter = ',', value_parser = parse_kind)]
    phases: Vec<Kind>,
    /// Seed of the adversaries' choices, so a run can be repeated.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// The phases, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reference,
    Disconnects,
    StopStorm,
    Swaps,
    ConnFlood,
    BodyFlood,
    ReferenceAfter,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Reference,
        Kind::Disconnects,
        Kind::StopStorm,
        Kind::Swaps,
        Kind::ConnFlood,
        Kind::BodyFlood,
        Kind::ReferenceAfter,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Reference => "reference",
            Kind::Disconnects => "disconnects",
            Kind::StopStorm => "stop-storm",
            Kind::Swaps => "swaps",
            Kind::ConnFlood => "conn-flood",
            Kind::BodyFlood => "body-flood",
            Kind::ReferenceAfter => "reference-after",
        }
    }
}

fn parse_kind(name: &str) -> Result<Kind, String> {
    Kind::ALL
        .into_iter()
        .find(|k| k.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
            format!("no phase `{name}`; the phases: {}", names.join(", "))
        })
}

/// A small, seeded generator (SplitMix64): the adversaries' choices only
/// need to vary and to repeat for a seed, not to be unpredictable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn hex_id(&mut self) -> String {
        format!("{:016x}{:016x}", self.next(), self.next())
    }
}

/// What the whole bench shares: where the server is and how to reach it.
struct Bench {
    addr: SocketAddr,
    base: String,
    token: String,
    options: ServerOptions,
    args: Args,
    /// Hands out client addresses (127.1.0.1 and up); see [`Bench::next_ip`].
    next_ip: AtomicU32,
    /// Addresses whose runs were cut off (dropped or stopped), to check at
    /// the end that their per-client slots were freed.
    cut_ips: Mutex<Vec<IpAddr>>,
    /// Seeds of the tasks, drawn in order from `--seed`.
    seeds: Mutex<Rng>,
    /// A client for health checks and swaps between phases.
    control: Client,
    /// Agents `lead-{i}` (each delegating to `helper-{i}`), one per client
    /// task that starts runs, and one more for the slot check.
    agents: usize,
}

impl Bench {
    /// A fresh loopback address for one client task. The server caps runs
    /// per client address, so each task gets its own (all of 127/8 is
    /// loopback on Linux), and the cap is then only reached where one
    /// address has more runs than it allows: a freed slot that was not.
    fn next_ip(&self) -> IpAddr {
        let n = self.next_ip.fetch_add(1, Ordering::Relaxed);
        IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 1, 0, 1)) + n))
    }

    /// Takes one run from the phase's budget, unless it is spent; every
    /// [`RUNS_PER_SCRIPT`] runs of `agent`, between two of them, first
    /// gives it fresh scripts.
    async fn take_run(&self, phase: &Phase, client: &Client, agent: usize, runs: &mut u64) -> bool {
        if phase.over() || phase.budget.fetch_sub(1, Ordering::Relaxed) <= 0 {
            return false;
        }
        *runs += 1;
        if (*runs).is_multiple_of(RUNS_PER_SCRIPT) {
            self.fresh_script(client, agent).await;
        }
        true
    }

    fn rng(&self) -> Rng {
        Rng(self.seeds.lock().next())
    }

    /// An HTTP client from `ip` that sends the token with every request.
    fn client(&self, ip: IpAddr) -> Client {
        client(&self.token, ip, true)
    }

    /// A client on a new address whose runs will be cut off (dropped or
    /// stopped): the address is kept, to check at the end that its
    /// per-client slots were freed.
    fn cut_client(&self) -> Client {
        let ip = self.next_ip();
        self.cut_ips.lock().push(ip);
        self.client(ip)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `GET /v1/health` with the token: active runs summed over the agents
    /// and generations in flight summed over the providers, and the status.
    async fn health(&self) -> Result<(u64, u64, String), String> {
        // Tried again on a failure: the connection flood may have the
        // server's connections taken for a moment after it ends.
        let mut last = String::new();
        for _ in 0..3 {
            match self.control.get(self.url("/health")).send().await {
                Ok(response) => {
                    let value: Value = response.json_value().await?;
                    let sum = |list: &str, field: &str| {
                        value["actors"][list]
                            .as_array()
                            .map_or(0, |a| a.iter().filter_map(|e| e[field].as_u64()).sum())
                    };
                    let status = value["status"].as_str().unwrap_or("?").to_string();
                    return Ok((
                        sum("agents", "active_runs"),
                        sum("providers", "in_flight"),
                        status,
                    ));
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }

    /// Waits (at most [`DRAIN_WAIT`]) for no run to be active and no
    /// generation in flight; returns what was left and how long it took.
    async fn drain(&self) -> (u64, u64, Duration) {
        let start = Instant::now();
        loop {
            let (runs, in_flight) = match self.health().await {
                Ok((runs, in_flight, _)) => (runs, in_flight),
                Err(_) => (u64::MAX, u64::MAX),
            };
            if (runs == 0 && in_flight == 0) || start.elapsed() >= DRAIN_WAIT {
                return (runs, in_flight, start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Swaps `agent`'s provider to the config's `provider`; the status.
    async fn swap(&self, client: &Client, agent: &str, provider: &str) -> Result<u16, String> {
        client
            .put(self.url(&format!("/agents/{agent}/provider")))
            .header(CONTENT_TYPE, "application/json")
            .body(json!({ "provider": provider }).to_string())
            .send()
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| described(&e))
    }

    /// Gives `lead-{i}` and `helper-{i}` fresh scripts. A scripted provider
    /// keeps every request it served (for tests to inspect): without this
    /// its log would grow with the runs, and the heap's high-water mark
    /// with it, which would read as the server's memory. A swap (to the
    /// provider the agent has already) drops the old provider, log and
    /// all, and refills the replies.
    async fn fresh_script(&self, client: &Client, i: usize) {
        for agent in [lead(i), helper(i)] {
            let provider = agent.as_str();
            let agent = agent.as_str();
            let mut tries = 0;
            loop {
                match self.swap(client, agent, provider).await {
                    Ok(200) => break,
                    // The swap phase's own swap is loading: try again.
                    Ok(409) if tries < 100 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    other => {
                        eprintln!("warning: a fresh script for {agent}: {other:?}");
                        break;
                    }
                }
            }
        }
    }

    /// Fresh scripts for every agent (between phases).
    async fn fresh_scripts(&self) {
        for i in 0..self.agents {
            self.fresh_script(&self.control, i).await;
        }
    }
}

/// The name of the `i`th lead agent, and of its provider.
fn lead(i: usize) -> String {
    format!("lead-{i}")
}

/// The name of the `i`th lead's sub-agent, and of its provider.
fn helper(i: usize) -> String {
    format!("helper-{i}")
}

/// A client error, marked as a hang when it reached the [`HANG`] guard.
fn described(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        format!("hang: no answer within {HANG:?}")
    } else {
        error.to_string()
    }
}

fn client(token: &str, ip: IpAddr, pool: bool) -> Client {
    let mut headers = HeaderMap::new();
    headers.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).expect("a token fits in a header"),
    );
    // One request at a time per client here, so one kept-alive connection
    // suffices; a second one (opened when the last one was not back in the
    // pool yet) is closed instead of kept.
    Client::builder()
        .local_address(ip)
        .default_headers(headers)
        .timeout(HANG)
        .pool_max_idle_per_host(usize::from(pool))
        .build()
        .expect("an HTTP client")
}

/// A body read as JSON (reqwest is built without its `json` feature here).
trait JsonValue {
    async fn json_value(self) -> Result<Value, String>;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Result<Value, String> {
        let bytes = self.bytes().await.map_err(|e| e.to_string())?;
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    }
}

/// What one phase counted.
#[derive(Default)]
struct Tally {
    /// Steady workers' runs read to their end, and each one's time from
    /// request to terminal event.
    latencies: Vec<Duration>,
    /// Every stream read to its end (any client), and those that broke
    /// the one-terminal-event rule, with the first few described.
    streams: u64,
    violations: u64,
    violation_examples: Vec<String>,
    /// Unexpected outcomes, by kind, with one example each.
    errors: BTreeMap<String, (u64, String)>,
    /// Run requests answered 429 (the per-client or per-agent cap).
    refused: u64,
    /// What the adversaries saw, by name.
    counters: BTreeMap<&'static str, u64>,
    /// Latencies of the flood phase's fresh-connection probes.
    probes: Vec<Duration>,
    /// Requests and streams that reached the hang guard ([`HANG`]).
    hangs: u64,
}

/// One phase in progress.
struct Phase {
    kind: Kind,
    deadline: Instant,
    /// Runs this phase may still start.
    budget: AtomicI64,
    tally: Mutex<Tally>,
    /// Ends the adversaries (they loop until the steady workers are done).
    stop: CancellationToken,
}

impl Phase {
    fn over(&self) -> bool {
        Instant::now() >= self.deadline || self.stop.is_cancelled()
    }

    fn count(&self, name: &'static str) {
        *self.tally.lock().counters.entry(name).or_insert(0) += 1;
    }

    fn error(&self, kind: impl Into<String>, example: impl Into<String>) {
        let example = example.into();
        let mut tally = self.tally.lock();
        if example.contains("hang:") {
            tally.hangs += 1;
        }
        let entry = tally
            .errors
            .entry(kind.into())
            .or_insert_with(|| (0, example));
        entry.0 += 1;
    }

    /// Checks a stream that was read to its end.
    fn checked(&self, what: &str, stream: &StreamState) {
        let mut tally = self.tally.lock();
        tally.streams += 1;
        if let Some(problem) = stream.violation() {
            tally.violations += 1;
            if tally.violation_examples.len() < 5 {
                tally.violation_examples.push(format!(
                    "{what} run {}: {problem}",
                    stream.run_id.as_deref().unwrap_or("?")
                ));
            }
        }
        if let Some(message) = &stream.error_message {
            // A run that ended with an error part is an error of the run
            // (the script ran out, the loop refused), not of the stream.
            drop(tally);
            self.error(format!("{what}: the run ended with an error"), message);
        }
    }
}

/// What a run's event stream carried, as far as it was read.
#[derive(Default)]
struct StreamState {
    run_id: Option<String>,
    events: u64,
    /// Depth-0 `finish`/`error` parts, and whether the last event read was one.
    terminals: u64,
    last_was_terminal: bool,
    /// The depth-0 finish reason (`stop`, `max-steps`, `aborted`) or `error`.
    reason: Option<String>,
    error_message: Option<String>,
    /// Depth-0 calls of the sub-agent, and depth-1 terminal parts: each
    /// delegation that started ends with one.
    delegations: u64,
    sub_terminals: u64,
    /// When the depth-0 terminal event arrived.
    terminal_at: Option<Instant>,
    /// Whether the stream was read to its end.
    ended: bool,
}

impl StreamState {
    fn feed(&mut self, event: &str, data: &Value) {
        self.events += 1;
        self.last_was_terminal = false;
        if event == "run" {
            if self.events == 1 {
                self.run_id = data["run_id"].as_str().map(str::to_string);
            }
            return;
        }
        let kind = data["type"].as_str().unwrap_or("");
        let terminal = kind == "finish" || kind == "error";
        match data["depth"].as_u64() {
            Some(0) => {
                if kind == "tool-call"
                    && data["name"]
                        .as_str()
                        .is_some_and(|n| n.starts_with("helper-"))
                {
                    self.delegations += 1;
                }
                if terminal {
                    self.terminals += 1;
                    self.last_was_terminal = true;
                    self.terminal_at.get_or_insert_with(Instant::now);
                    if kind == "finish" {
                        self.reason = data["reason"].as_str().map(str::to_string);
                    } else {
                        self.reason = Some("error".to_string());
                        self.error_message = data["message"].as_str().map(str::to_string);
                    }
                }
            }
            _ if terminal => self.sub_terminals += 1,
            _ => {}
        }
    }

    fn seen_terminal(&self) -> bool {
        self.terminals > 0
    }

    /// What is wrong with a stream read to its end, if anything.
    fn violation(&self) -> Option<String> {
        if self.run_id.is_none() {
            Some("the first event does not name the run".to_string())
        } else if self.terminals != 1 {
            Some(format!("{} depth-0 terminal events", self.terminals))
        } else if !self.last_was_terminal {
            Some("events after the depth-0 terminal event".to_string())
        } else if self.sub_terminals > self.delegations {
            Some(format!(
                "{} sub-agent terminal events for {} delegations",
                self.sub_terminals, self.delegations
            ))
        } else {
            None
        }
    }
}

/// Reads server-sent events off a streaming response.
struct Sse {
    response: reqwest::Response,
    buffer: Vec<u8>,
    state: StreamState,
}

impl Sse {
    /// Reads the next event into the state; false when the stream ended.
    async fn step(&mut self) -> Result<bool, String> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8(raw).map_err(|_| "an event is not UTF-8")?;
                let mut name = "";
                let mut data = String::new();
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        name = v;
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                // A comment alone (`:`), which the server sends when a
                // stream has been silent a while, is no event.
                if name.is_empty() && data.is_empty() {
                    continue;
                }
                let value: Value =
                    serde_json::from_str(&data).map_err(|e| format!("event data: {e}"))?;
                self.state.feed(name, &value);
                return Ok(true);
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                Ok(None) if self.buffer.iter().all(u8::is_ascii_whitespace) => {
                    self.state.ended = true;
                    return Ok(false);
                }
                Ok(None) => return Err("the stream ended inside an event".to_string()),
                Err(e) if e.is_timeout() => {
                    return Err(format!("hang: the stream did not end within {HANG:?}"));
                }
                Err(e) => return Err(format!("the stream broke: {e}")),
            }
        }
    }

    /// Reads to the end of the stream.
    async fn finish(&mut self) -> Result<(), String> {
        while self.step().await? {}
        Ok(())
    }
}

/// How starting a run went.
enum Start {
    Streaming(Box<Sse>),
    /// 429: the client or the agent runs as many as it may.
    Refused,
    Failed(String, String),
}

async fn start_run(bench: &Bench, client: &Client, agent: &str) -> Start {
    let sent = client
        .post(bench.url(&format!("/agents/{agent}/runs")))
        .header(CONTENT_TYPE, "application/json")
        .body(RUN_BODY)
        .send()
        .await;
    match sent {
        Ok(response) if response.status() == StatusCode::OK => Start::Streaming(Box::new(Sse {
            response,
            buffer: Vec::new(),
            state: StreamState::default(),
        })),
        Ok(response) if response.status() == StatusCode::TOO_MANY_REQUESTS => Start::Refused,
        Ok(response) => {
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            Start::Failed(format!("start a run: HTTP {status}"), body)
        }
        Err(e) => Start::Failed("start a run: request failed".to_string(), described(&e)),
    }
}

/// A steady worker's client, with its connection open: what the flood
/// phase does to clients that are already connected is measured apart from
/// what it does to new connections (the probe).
async fn connected_client(bench: Arc<Bench>) -> Client {
    let client = bench.client(bench.next_ip());
    if let Err(e) = client.get(bench.url("/health")).send().await {
        eprintln!("warning: a worker's first health check failed: {e}");
    }
    client
}

/// The steady workload: one run at a time, each read to its end.
async fn steady(bench: Arc<Bench>, phase: Arc<Phase>, client: Client, agent: usize) {
    let mut runs = 0;
    while bench.take_run(&phase, &client, agent, &mut runs).await {
        let sent = Instant::now();
        match start_run(&bench, &client, &lead(agent)).await {
            Start::Streaming(mut sse) => match sse.finish().await {
                Ok(()) => {
                    phase.checked("steady", &sse.state);
                    if let Some(at) = sse.state.terminal_at {
                        phase.tally.lock().latencies.push(at - sent);
                    }
                }
                Err(e) => phase.error("steady: stream", e),
            },
            Start::Refused => {
                phase.tally.lock().refused += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Start::Failed(kind, example) => {
                phase.error(format!("steady: {kind}"), example);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Starts runs and goes away mid-stream: before the first event, after a
/// few, or after a pause; the server must stop each run and free its slot.
async fn disconnecter(bench: Arc<Bench>, phase: Arc<Phase>, agent: usize) {
    let client = bench.cut_client();
    let mut rng = bench.rng();
    let mut runs = 0;
    while bench.take_run(&phase, &client, agent, &mut runs).await {
        match start_run(&bench, &client, &lead(agent)).await {
            Start::Streaming(mut sse) => {
                let events = rng.below(6);
                let mut failed = false;
                for _ in 0..events {
                    match sse.step().await {
                        Ok(true) if !sse.state.seen_terminal() => {}
                        Ok(_) => break,
                        Err(e) => {
                            phase.error("disconnecter: stream", e);
                            failed = true;
                            break;
                        }
                    }
                }
                if !failed && rng.below(4) == 0 {
                    // Some wait a little, so that the run is between parts
                    // (in a generation) when its client goes away.
                    tokio::time::sleep(Duration::from_millis(rng.below(15))).await;
                }
                if sse.state.seen_terminal() {
                    // It ended before we left: read the rest, as a client would.
                    match sse.finish().await {
                        Ok(()) => phase.checked("disconnecter", &sse.state),
                        Err(e) => phase.error("disconnecter: stream", e),
                    }
                    phase.count("runs that ended before their client left");
                } else if !failed {
                    phase.count("streams dropped mid-way");
                }
                // Dropping the response closes its connection.
                drop(sse);
            }
            Start::Refused => {
                // The server frees a slot when it notices the connection
                // closed, on its next write; until then this address has one
                // run fewer. Counted, and checked at the end.
                phase.count("429 right after a disconnect");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Start::Failed(kind, example) => {
                phase.error(format!("disconnecter: {kind}"), example);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Stop one run; `Ok(stopped)` or the unexpected status.
async fn stop(bench: &Bench, client: &Client, agent: &str, run: &str) -> Result<bool, String> {
    let response = client
        .post(bench.url(&format!("/agents/{agent}/runs/{run}/stop")))
        .send()
        .await
        .map_err(|e| format!("request failed: {}", described(&e)))?;
    let status = response.status();
    let value = response.json_value().await?;
    if status != StatusCode::OK {
        return Err(format!("HTTP {} {value}", status.as_u16()));
    }
    value["stopped"]
        .as_bool()
        .ok_or_else(|| format!("an answer without `stopped`: {value}"))
}

/// Starts runs and stops them: at once, after a few parts, or after their
/// end; and with each one, stops that must find nothing (an unknown id,
/// the id on the other agent) or be refused (a malformed id).
async fn stopper(bench: Arc<Bench>, phase: Arc<Phase>, agent: usize) {
    let client = bench.cut_client();
    let mut rng = bench.rng();
    let mut runs = 0;
    let (lead, helper) = (lead(agent), helper(agent));
    while bench.take_run(&phase, &client, agent, &mut runs).await {
        let mut sse = match start_run(&bench, &client, &lead).await {
            Start::Streaming(sse) => sse,
            Start::Refused => {
                phase.tally.lock().refused += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Start::Failed(kind, example) => {
                phase.error(format!("stopper: {kind}"), example);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let mode = rng.below(3);
        let read = match mode {
            0 => 1,
            1 => 1 + rng.below(4),
            _ => u64::MAX,
        };
        let mut broken = None;
        while sse.state.events < read && !sse.state.ended {
            if let Err(e) = sse.step().await {
                broken = Some(e);
                break;
            }
        }
        if let Some(e) = broken {
            phase.error("stopper: stream", e);
            continue;
        }
        let Some(id) = sse.state.run_id.clone() else {
            phase.error("stopper: stream", "no run id in the first event");
            continue;
        };
        let ended_before = sse.state.ended;
        match stop(&bench, &client, &lead, &id).await {
            Ok(true) if ended_before => phase.count("stops after the end that said stopped"),
            Ok(true) => phase.count("stops that stopped a run"),
            Ok(false) if ended_before => phase.count("stops after the end (not running)"),
            Ok(false) => phase.count("stops that came too late (run ended)"),
            Err(e) => phase.error("stopper: stop", e),
        }
        match sse.finish().await {
            Ok(()) => {
                phase.checked("stopped", &sse.state);
                if sse.state.reason.as_deref() == Some("aborted") {
                    phase.count("runs that finished aborted");
                }
            }
            Err(e) => phase.error("stopper: stream", e),
        }
        // Stops that must not stop anything.
        match stop(&bench, &client, &lead, &rng.hex_id()).await {
            Ok(false) => phase.count("unknown ids: not running"),
            other => phase.error("stopper: an unknown id", format!("{other:?}")),
        }
        match stop(&bench, &client, &helper, &id).await {
            Ok(false) => phase.count("another agent's id: not running"),
            other => phase.error("stopper: another agent's id", format!("{other:?}")),
        }
        match stop(&bench, &client, &lead, "not-a-run-id").await {
            Err(e) if e.starts_with("HTTP 400") => phase.count("malformed ids: 400"),
            other => phase.error("stopper: a malformed id", format!("{other:?}")),
        }
    }
}

/// Stops of unknown ids, back to back: the stop path under pressure while
/// real runs stream.
async fn storm(bench: Arc<Bench>, phase: Arc<Phase>) {
    let client = bench.client(bench.next_ip());
    let mut rng = bench.rng();
    while !phase.over() {
        match stop(&bench, &client, &lead(0), &rng.hex_id()).await {
            Ok(false) => phase.count("unknown ids: not running"),
            other => phase.error("storm: an unknown id", format!("{other:?}")),
        }
    }
}

/// Swaps the steady workers' agents' providers to other scripts and back
/// while they run: every later step of a run goes to the new script.
async fn swapper(bench: Arc<Bench>, phase: Arc<Phase>) {
    let client = bench.client(bench.next_ip());
    let mut rng = bench.rng();
    while !phase.over() {
        let i = rng.below(bench.args.workers as u64) as usize;
        let agent = if rng.below(2) == 0 {
            lead(i)
        } else {
            helper(i)
        };
        let (provider, expect_404) = match rng.below(10) {
            0 => ("no-such-provider".to_string(), true),
            n if n % 2 == 0 => (format!("{agent}-alt"), false),
            _ => (agent.clone(), false),
        };
        // Paced: a swap of a scripted provider copies its whole script,
        // and back-to-back swaps would measure that copy, not the server.
        tokio::time::sleep(Duration::from_millis(25)).await;
        match bench.swap(&client, &agent, &provider).await {
            Ok(200) if !expect_404 => phase.count("swaps: 200"),
            Ok(409) if !expect_404 => phase.count("swaps: 409 (one was loading)"),
            Ok(404) if expect_404 => phase.count("swaps to unknown providers: 404"),
            other => phase.error("swapper: swap", format!("{provider}: {other:?}")),
        }
    }
}

/// Holds connections open without finishing a request: silent ones, and
/// slowloris ones that send their head a byte at a time. The server keeps
/// at most its cap of them, cuts each at the header timeout, and closes
/// those beyond the cap after its short wait; each one cut is reopened.
async fn flooder(bench: Arc<Bench>, phase: Arc<Phase>, slowloris: bool) {
    let head = format!(
        "POST /v1/agents/lead-0/runs HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n",
        bench.addr, bench.token
    );
    while !phase.over() {
        let opened = Instant::now();
        let mut stream = match TcpStream::connect(bench.addr).await {
            Ok(stream) => stream,
            Err(e) => {
                phase.error("flood: connect", e.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        phase.count("flood connections opened");
        let mut sent = 0;
        let mut buffer = [0u8; 256];
        let closed = loop {
            tokio::select! {
                read = stream.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => break true,
                    Ok(_) => {
                        phase.error("flood: an answer", "the server answered an unfinished head");
                        break true;
                    }
                },
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if slowloris && sent < head.len() {
                        // A write to a connection the server closed fails;
                        // the read above sees the close.
                        let _ = stream.write_all(&head.as_bytes()[sent..sent + 1]).await;
                        sent += 1;
                    }
                }
                _ = phase.stop.cancelled() => break false,
            }
        };
        if closed {
            let held = opened.elapsed();
            if held >= HEADER_TIMEOUT {
                phase.count("flood: cut at the header timeout");
            } else {
                phase.count("flood: closed early (beyond the cap)");
            }
        }
    }
}

/// Health checks on a fresh connection each: what a new, legitimate
/// client gets while the flood holds the connections.
async fn prober(bench: Arc<Bench>, phase: Arc<Phase>) {
    let client = client(&bench.token, bench.next_ip(), false);
    while !phase.over() {
        let sent = Instant::now();
        match client.get(bench.url("/health")).send().await {
            Ok(response) if response.status() == StatusCode::OK => {
                phase.tally.lock().probes.push(sent.elapsed());
                phase.count("probes: answered");
            }
            Ok(response) => phase.error(
                "probe: health",
                format!("HTTP {}", response.status().as_u16()),
            ),
            // Refused connections are the flood's effect, counted, not an
            // error of the server.
            Err(_) => phase.count("probes: no answer (connection closed or refused)"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The status of a raw HTTP exchange, read off its status line.
async fn read_status(reader: &mut (impl AsyncReadExt + Unpin)) -> Result<u16, String> {
    let mut answer = Vec::new();
    let mut buffer = [0u8; 1024];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        let n = reader.read(&mut buffer).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("closed without an answer".to_string());
        }
        answer.extend_from_slice(&buffer[..n]);
    }
    let line = String::from_utf8_lossy(&answer);
    line.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not a status line: {line:?}"))
}

/// Bodies the server must refuse: too large (declared, or chunked with no
/// length), too slow, of another media type, or not JSON.
async fn body_flooder(bench: Arc<Bench>, phase: Arc<Phase>) {
    let mut rng = bench.rng();
    let head = |extra: &str| {
        format!(
            "POST /v1/agents/lead-0/runs HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n{extra}\r\n",
            bench.addr, bench.token
        )
    };
    let cap = bench.options.max_body_bytes;
    while !phase.over() {
        let (what, expect, request, body, pace): (_, u16, String, Vec<u8>, Option<Duration>) =
            match rng.below(5) {
                0 => (
                    "oversized (declared)",
                    413,
                    head(&format!(
                        "Content-Type: application/json\r\nContent-Length: {}\r\n",
                        2 * cap
                    )),
                    Vec::new(),
                    None,
                ),
                1 => {
                    // Chunks of 64 KiB past the cap, and no length to refuse
                    // it by: the server must stop reading at the cap.
                    let mut body = Vec::new();
                    let chunk = vec![b' '; 64 << 10];
                    for _ in 0..(cap / chunk.len() + 4) {
                        body.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                        body.extend_from_slice(&chunk);
                        body.extend_from_slice(b"\r\n");
                    }
                    body.extend_from_slice(b"0\r\n\r\n");
                    (
                        "oversized (chunked)",
                        413,
                        head("Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"),
                        body,
                        None,
                    )
                }
                2 => (
                    "slow",
                    408,
                    head("Content-Type: application/json\r\nContent-Length: 64\r\n"),
                    vec![b' '; 64],
                    Some(Duration::from_millis(250)),
                ),
                3 => (
                    "text/plain",
                    415,
                    head(&format!(
                        "Content-Type: text/plain\r\nContent-Length: {}\r\n",
                        RUN_BODY.len()
                    )),
                    RUN_BODY.as_bytes().to_vec(),
                    None,
                ),
                _ => (
                    "bad JSON",
                    400,
                    head("Content-Type: application/json\r\nContent-Length: 9\r\n"),
                    b"{\"input\":".to_vec(),
                    None,
                ),
            };
        let stream = match TcpStream::connect(bench.addr).await {
            Ok(stream) => stream,
            Err(e) => {
                phase.error("body flood: connect", e.to_string());
                continue;
            }
        };
        let (mut reader, mut writer) = stream.into_split();
        // The writer runs beside the reader: the server may answer (and
        // close) before the body is all sent, and that answer is the point.
        let writing = tokio::spawn(async move {
            writer.write_all(request.as_bytes()).await?;
            match pace {
                None => writer.write_all(&body).await?,
                Some(pace) => {
                    for byte in body {
                        writer.write_all(&[byte]).await?;
                        tokio::time::sleep(pace).await;
                    }
                }
            }
            writer.flush().await?;
            Ok::<_, std::io::Error>(writer)
        });
        let status = tokio::time::timeout(HANG, read_status(&mut reader)).await;
        writing.abort();
        match status {
            Ok(Ok(status)) if status == expect => phase.count(match expect {
                413 => "bodies: 413 too large",
                408 => "bodies: 408 too slow",
                415 => "bodies: 415 not JSON",
                _ => "bodies: 400 bad JSON",
            }),
            // A large body the server refused and closed on while it was
            // still being sent can reset the connection before its answer
            // is read; the server refused it either way.
            Ok(Err(_)) if expect == 413 => phase.count("bodies: reset while sending a large body"),
            Ok(other) => phase.error(
                format!("body flood: {what}"),
                format!("expected {expect}: {other:?}"),
            ),
            Err(_) => phase.error(
                format!("body flood: {what}"),
                format!("hang: no answer within {HANG:?}"),
            ),
        }
    }
}

/// One phase's numbers, once it is over.
struct Row {
    kind: Kind,
    elapsed: Duration,
    tally: Tally,
    /// Active runs and generations in flight left after the drain wait,
    /// and how long it took.
    left: (u64, u64),
    drained_in: Duration,
    budget_spent: bool,
    /// The process once the phase's clients are gone and its scripts were
    /// replaced (see [`Bench::fresh_scripts`]).
    usage: Usage,
}

/// Clients that start runs beside the steady workers, in the phases that
/// have them (disconnects, stops).
fn adversaries_per_phase(workers: usize) -> usize {
    (workers / 2).max(1)
}

async fn run_phase(bench: &Arc<Bench>, kind: Kind, length: Duration) -> Row {
    bench.fresh_scripts().await;
    let mut connecting = JoinSet::new();
    for _ in 0..bench.args.workers {
        connecting.spawn(connected_client(bench.clone()));
    }
    let clients = connecting.join_all().await;
    let started = Instant::now();
    let phase = Arc::new(Phase {
        kind,
        deadline: started + length,
        budget: AtomicI64::new(bench.args.max_runs as i64),
        tally: Mutex::new(Tally::default()),
        stop: CancellationToken::new(),
    });
    let mut workers = JoinSet::new();
    // Each task that starts runs has an agent of its own (see `Bench::agents`).
    for (i, client) in clients.into_iter().enumerate() {
        workers.spawn(steady(bench.clone(), phase.clone(), client, i));
    }
    let mut adversaries = JoinSet::new();
    let (workers_n, half) = (
        bench.args.workers,
        adversaries_per_phase(bench.args.workers),
    );
    match kind {
        Kind::Reference | Kind::ReferenceAfter => {}
        Kind::Disconnects => {
            for i in 0..half {
                adversaries.spawn(disconnecter(bench.clone(), phase.clone(), workers_n + i));
            }
        }
        Kind::StopStorm => {
            for i in 0..half {
                adversaries.spawn(stopper(bench.clone(), phase.clone(), workers_n + i));
            }
            adversaries.spawn(storm(bench.clone(), phase.clone()));
        }
        Kind::Swaps => {
            for _ in 0..2 {
                adversaries.spawn(swapper(bench.clone(), phase.clone()));
            }
        }
        Kind::ConnFlood => {
            let flood = bench
                .args
                .flood
                .unwrap_or(3 * bench.options.max_connections);
            for i in 0..flood {
                adversaries.spawn(flooder(bench.clone(), phase.clone(), i % 2 == 1));
            }
            adversaries.spawn(prober(bench.clone(), phase.clone()));
        }
        Kind::BodyFlood => {
            for _ in 0..half.max(4) {
                adversaries.spawn(body_flooder(bench.clone(), phase.clone()));
            }
        }
    }
    while workers.join_next().await.is_some() {}
    let elapsed = started.elapsed();
    phase.stop.cancel();
    while adversaries.join_next().await.is_some() {}
    let (runs, in_flight, drained_in) = bench.drain().await;
    let budget_spent = phase.budget.load(Ordering::Relaxed) <= 0;
    let tally = std::mem::take(&mut *phase.tally.lock());
    bench.fresh_scripts().await;
    Row {
        kind: phase.kind,
        elapsed,
        tally,
        left: (runs, in_flight),
        drained_in,
        budget_spent,
        usage: settled_usage().await,
    }
}

/// VmRSS (KiB), open file descriptors and threads of this process.
#[derive(Debug, Clone, Copy)]
struct Usage {
    rss_kib: u64,
    fds: usize,
    threads: u64,
}

fn usage() -> Usage {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Usage {
        rss_kib: field("VmRSS:"),
        fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
        threads: field("Threads:"),
    }
}

/// Usage once the server is quiet: the clients of the last phase are gone
/// and the server has seen their connections close.
async fn settled_usage() -> Usage {
    tokio::time::sleep(Duration::from_millis(500)).await;
    usage()
}

/// The nearest-rank percentile, in milliseconds.
fn percentile(sorted: &[Duration], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0)
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"))
}

/// Four concurrent runs (the per-client cap) from each address whose runs
/// were cut off: a slot the server failed to free shows up as a 429.
async fn check_slots(bench: &Arc<Bench>) -> (usize, Vec<String>) {
    let ips = bench.cut_ips.lock().clone();
    let per_client = bench.options.max_runs_per_client;
    let mut problems = Vec::new();
    // The agent no other task runs on.
    let spare = bench.agents - 1;
    for ip in &ips {
        bench.fresh_script(&bench.control, spare).await;
        let client = bench.client(*ip);
        let mut runs = JoinSet::new();
        for _ in 0..per_client {
            let (bench, client) = (bench.clone(), client.clone());
            runs.spawn(async move {
                match start_run(&bench, &client, &lead(spare)).await {
                    Start::Streaming(mut sse) => sse.finish().await.map(|()| sse.state),
                    Start::Refused => Err("429".to_string()),
                    Start::Failed(kind, example) => Err(format!("{kind}: {example}")),
                }
            });
        }
        while let Some(joined) = runs.join_next().await {
            match joined {
                Ok(Ok(state)) => {
                    if let Some(v) = state.violation() {
                        problems.push(format!("{ip}: {v}"));
                    }
                }
                Ok(Err(e)) => problems.push(format!("{ip}: {e}")),
                Err(e) => problems.push(format!("{ip}: {e}")),
            }
        }
    }
    (ips.len(), problems)
}

fn print_table(bench: &Bench, rows: &[Row]) {
    let reference = rows.iter().find(|r| r.kind == Kind::Reference);
    let rate = |row: &Row| row.tally.latencies.len() as f64 / row.elapsed.as_secs_f64();
    let ref_rate = reference.map(rate).unwrap_or(0.0);
    let ref_p50 = reference.and_then(|r| {
        let mut sorted = r.tally.latencies.clone();
        sorted.sort();
        percentile(&sorted, 50.0)
    });
    println!();
    println!(
        "{:<16} {:>6} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>6} {:>7} {:>8} {:>11} {:>7} {:>4}",
        "phase",
        "runs",
        "runs/s",
        "vs ref",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "vs ref",
        "errors",
        "refused",
        "streams",
        "active end",
        "rss MiB",
        "fds"
    );
    for row in rows {
        let mut sorted = row.tally.latencies.clone();
        sorted.sort();
        let p50 = percentile(&sorted, 50.0);
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.2}x", a / b)
            } else {
                "-".to_string()
            }
        };
        let errors: u64 = row.tally.errors.values().map(|(n, _)| n).sum();
        let active = if row.left == (0, 0) {
            format!("0 ({} ms)", row.drained_in.as_millis())
        } else {
            format!("{}+{} LEFT", row.left.0, row.left.1)
        };
        println!(
            "{:<16} {:>6} {:>8.1} {:>7} {:>7} {:>7} {:>7} {:>7} {:>6} {:>7} {:>8} {:>11} {:>7.1} {:>4}",
            format!(
                "{}{}",
                row.kind.name(),
                if row.budget_spent { "*" } else { "" }
            ),
            sorted.len(),
            rate(row),
            ratio(rate(row), ref_rate),
            ms(p50),
            ms(percentile(&sorted, 90.0)),
            ms(percentile(&sorted, 99.0)),
            match (p50, ref_p50) {
                (Some(a), Some(b)) => ratio(a, b),
                _ => "-".to_string(),
            },
            errors,
            row.tally.refused,
            row.tally.streams,
            active,
            row.usage.rss_kib as f64 / 1024.0,
            row.usage.fds,
        );
    }
    println!(
        "runs, runs/s and latencies are the {} steady workers' (time from request to terminal \
         event); streams counts every stream read to its end; active end: runs and generations \
         left after the phase, and how long they took to drain; rss and fds: this process \
         (server and clients) after the phase",
        bench.args.workers
    );
    if rows.iter().any(|r| r.budget_spent) {
        println!("* the phase spent its --max-runs budget before its time was up");
    }
    println!();
    println!("what the adversaries saw");
    for row in rows {
        if row.tally.counters.is_empty() && row.tally.errors.is_empty() {
            continue;
        }
        let mut line = format!("  {}:", row.kind.name());
        for (name, n) in &row.tally.counters {
            let _ = write!(line, " {name} {n};");
        }
        if !row.tally.probes.is_empty() {
            let mut sorted = row.tally.probes.clone();
            sorted.sort();
            let _ = write!(
                line,
                " probe latency p50 {} ms, max {} ms;",
                ms(percentile(&sorted, 50.0)),
                ms(percentile(&sorted, 100.0))
            );
        }
        println!("{}", line.trim_end_matches(';'));
        for (kind, (n, example)) in &row.tally.errors {
            println!("    error x{n}: {kind} (e.g. {example})");
        }
        if row.kind == Kind::ConnFlood {
            println!(
                "    the flood came from one address, so max_connections_per_client ({}) made \
                 its new connections close its own oldest idle ones; a flood whose connections \
                 all have a request in progress, with and without that cap, is measured by \
                 `cargo run --example conn_flood`",
                bench.options.max_connections_per_client
            );
        }
    }
}

/// One check's line; returns whether it passed.
fn check(ok: bool, what: String) -> bool {
    println!("  [{}] {what}", if ok { " ok " } else { "FAIL" });
    ok
}

/// The config: for each `i` below `agents`, `lead-{i}` delegating to
/// `helper-{i}`, each on a scripted provider of its own name, and an
/// `-alt` provider of each for the swaps to load.
fn config_text(agents: usize, delay_ms: u64) -> String {
    // One client runs one run at a time on its agent, so each run pops its
    // lead's replies in order: a call of the helper, then an answer after
    // the helper's. Every run does the same work (two lead steps, one
    // helper step), and the latencies compare. A run cut off pops fewer;
    // a script that ran out would show as runs that end with an error.
    let pairs = RUNS_PER_SCRIPT + 16;
    let mut text = String::new();
    for i in 0..agents {
        let (lead, helper) = (lead(i), helper(i));
        let call = format!(r#"'{{"name": "{helper}", "arguments": {{"task": "Say hello"}}}}'"#);
        let lead_replies =
            vec![format!("{call}, 'It says: Hello there.'"); pairs as usize].join(", ");
        let helper_replies = vec!["'Hello there.'"; pairs as usize].join(", ");
        for suffix in ["", "-alt"] {
            let _ = write!(
                text,
                r#"
[providers.{lead}{suffix}]
kind = "scripted"
model = "{lead}{suffix}-model"
delay_ms = {delay_ms}
replies = [{lead_replies}]

[providers.{helper}{suffix}]
kind = "scripted"
model = "{helper}{suffix}-model"
delay_ms = {delay_ms}
replies = [{helper_replies}]
"#
            );
        }
        let _ = write!(
            text,
            r#"
[agents.{lead}]
description = "Talks to the person."
provider = "{lead}"
sub_agents = ["{helper}"]
max_concurrent_runs = 16

[agents.{helper}]
description = "Says hello."
provider = "{helper}"
max_concurrent_runs = 16
"#
        );
    }
    text
}

async fn soak(args: Args) -> bool {
    // An agent per task that starts runs, and a spare for the slot check.
    let agents = args.workers + adversaries_per_phase(args.workers) + 1;
    let config = Config::parse(&config_text(agents, args.delay_ms), "serve-soak.toml")
        .expect("the soak config parses");
    let hosted = config
        .start(StartOptions::default())
        .await
        .expect("the scripted runtime starts");
    let api = serve::Api::hosted(config, &hosted).expect("the API over the runtime");
    let mut token_bytes = [0u8; 32];
    getrandom::fill(&mut token_bytes).expect("random bytes for the token");
    let token: String = token_bytes.iter().map(|b| format!("{b:02x}")).collect();
    // The server's defaults but for the token and the two timeouts that
    // would outlast a phase (see HEADER_TIMEOUT).
    let options = ServerOptions {
        token: TokenSource::Given(token.clone()),
        header_timeout: HEADER_TIMEOUT,
        body_timeout: BODY_TIMEOUT,
        ..ServerOptions::default()
    };
    let shutdown = CancellationToken::new();
    let started = serve::start_with(
        "127.0.0.1:0".parse().expect("an address"),
        api,
        options.clone(),
        shutdown.clone(),
    )
    .await
    .expect("the server starts");
    let addr = started.addr;
    let kinds = if args.phases.is_empty() {
        Kind::ALL.to_vec()
    } else {
        args.phases.clone()
    };
    let length = Duration::from_secs_f64(args.seconds.max(0.1) / kinds.len() as f64);
    println!(
        "serve_soak: wma serve on http://{addr}, in process; {} steady workers, {:.1} s per \
         phase, at most {} runs per phase, scripted replies after {} ms; server limits: {} \
         connections ({} per client address), {} runs per client, {} MiB bodies, header and \
         body timeouts {} s and {} s",
        args.workers,
        length.as_secs_f64(),
        args.max_runs,
        args.delay_ms,
        options.max_connections,
        options.max_connections_per_client,
        options.max_runs_per_client,
        options.max_body_bytes >> 20,
        HEADER_TIMEOUT.as_secs(),
        BODY_TIMEOUT.as_secs(),
    );
    let bench = Arc::new(Bench {
        addr,
        base: format!("http://{addr}/v1"),
        // Without a pool: a kept-alive control connection (or two, when a
        // request finds the last one not yet back in the pool) would count
        // among the descriptors measured between phases.
        control: client(&token, IpAddr::V4(Ipv4Addr::LOCALHOST), false),
        token,
        options,
        seeds: Mutex::new(Rng(args.seed)),
        args,
        next_ip: AtomicU32::new(0),
        agents,
        cut_ips: Mutex::new(Vec::new()),
    });

    let mut rows = Vec::new();
    let mut slots = (0, Vec::new());
    for (i, &kind) in kinds.iter().enumerate() {
        if i > 0 && i + 1 == kinds.len() {
            // Before the last phase, so that it runs after everything.
            slots = check_slots(&bench).await;
        }
        eprintln!("phase {} ...", kind.name());
        rows.push(run_phase(&bench, kind, length).await);
    }
    // "Before" is after the reference phase, not before it: by then the
    // allocator, the pools and the runtime's threads have grown to what the
    // steady load needs, and the last phase runs that same load.
    let before = rows[0].usage;
    let after = rows[rows.len() - 1].usage;
    let (final_runs, final_in_flight, status) = match bench.health().await {
        Ok(health) => health,
        Err(e) => (u64::MAX, u64::MAX, format!("no answer: {e}")),
    };
    print_table(&bench, &rows);

    println!();
    println!("checks");
    let mut ok = true;
    let streams: u64 = rows.iter().map(|r| r.tally.streams).sum();
    let violations: u64 = rows.iter().map(|r| r.tally.violations).sum();
    ok &= check(
        violations == 0,
        format!(
            "one terminal event per stream, last: {streams} streams read to the end, \
             {violations} broke the rule"
        ),
    );
    for row in &rows {
        for example in &row.tally.violation_examples {
            println!("         {}: {example}", row.kind.name());
        }
    }
    let leaked: Vec<String> = rows
        .iter()
        .filter(|r| r.left != (0, 0))
        .map(|r| format!("{} ({}+{})", r.kind.name(), r.left.0, r.left.1))
        .collect();
    ok &= check(
        leaked.is_empty(),
        format!(
            "active runs drained after every phase{}",
            if leaked.is_empty() {
                String::new()
            } else {
                format!(": not after {}", leaked.join(", "))
            }
        ),
    );
    ok &= check(
        final_runs == 0 && final_in_flight == 0 && status == "ok",
        format!(
            "at the end, /v1/health: status {status}, {final_runs} active runs, \
             {final_in_flight} generations in flight"
        ),
    );
    ok &= check(
        slots.1.is_empty(),
        format!(
            "per-client slots freed: {} runs at once from each of the {} addresses whose runs \
             were cut off{}",
            bench.options.max_runs_per_client,
            slots.0,
            if slots.1.is_empty() {
                String::new()
            } else {
                format!(": {}", slots.1.join("; "))
            }
        ),
    );
    // Memory grows a little with the high-water marks of buffers (the
    // flood's sockets; the body flood's bodies, up to the cap each); a leak
    // of a few hundred bytes per run or per connection, over the tens of
    // thousands of each, grows it by more than the allowance.
    let allowed_kib = (before.rss_kib / 4).max(8 << 10);
    let grown = after.rss_kib.saturating_sub(before.rss_kib);
    ok &= check(
        grown <= allowed_kib,
        format!(
            "memory (VmRSS): {:.1} MiB after the reference phase, {:.1} MiB at the end ({:+.1} \
             MiB; allowed {:.0} MiB)",
            before.rss_kib as f64 / 1024.0,
            after.rss_kib as f64 / 1024.0,
            (after.rss_kib as f64 - before.rss_kib as f64) / 1024.0,
            allowed_kib as f64 / 1024.0
        ),
    );
    ok &= check(
        after.fds <= before.fds + 2,
        format!(
            "open file descriptors: {} after the reference phase, {} at the end (allowed +2)",
            before.fds, after.fds
        ),
    );
    ok &= check(
        after.threads <= before.threads + 4,
        format!(
            "threads: {} after the reference phase, {} at the end (allowed +4)",
            before.threads, after.threads
        ),
    );
    let hangs: u64 = rows.iter().map(|r| r.tally.hangs).sum();
    ok &= check(
        hangs == 0,
        format!("no request or stream hung ({hangs} reached the {HANG:?} guard)"),
    );
    let errors: u64 = rows
        .iter()
        .flat_map(|r| r.tally.errors.values())
        .map(|(n, _)| n)
        .sum();
    println!("  errors in all phases: {errors} (listed above; not a check: see the table)");

    shutdown.cancel();
    let _ = started.task.await;
    hosted.shutdown().await;
    ok
}

/// Seconds for all phases when `cargo test --all-targets` runs this bench:
/// it passes no argument (`cargo bench` passes `--bench`), and a test run
/// wants the checks, briefly, not the minute of numbers.
const SMOKE_SECONDS: f64 = 7.0;

fn main() {
    let mut args = Args::parse();
    if std::env::args().len() == 1 {
        args.seconds = SMOKE_SECONDS;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let ok = runtime.block_on(soak(args));
    if !ok {
        eprintln!("serve_soak: a check failed");
        std::process::exit(1);
    }
}
