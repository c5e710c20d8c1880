//! The `wma` commands that host a config: `run --config`, `chat`, `serve`, `check`.

pub(crate) mod approve;
pub(crate) mod mcp;
pub(crate) mod progress;
pub(crate) mod trace;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{AgentStreamPart, ChatMessage};
use webmcp_agents::config::{Config, Hosted, StartOptions};
use webmcp_agents::display::{render_part, terminal_safe};
use webmcp_agents::runtime::{AgentHandle, RunApprovals, RunId, TaggedPart};
use webmcp_agents::store::{RunLog, RunStatus, Store};
use webmcp_agents::{mend, serve};

use approve::{ApprovalArgs, Input, Lines, RecordingApprover};
use progress::Bars;

/// How long a command waits for the nodes that host its remote sub-agents.
const REMOTE_WAIT: Duration = Duration::from_secs(30);

/// `wma chat`.
#[derive(Args)]
pub(crate) struct ChatArgs {
    /// The config to host (default: the demo shop's agent on the default
    /// model, as `wma run` asks it).
    #[arg(long, short)]
    pub(crate) config: Option<PathBuf>,
    /// The agent to talk to (default: the config's only top-level agent).
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// Print the parts as JSON lines instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also print what the loop's policy did at each step (the rule
    /// lines); without it a reply shows the calls, results, approvals and
    /// the answer.
    #[arg(long, short)]
    pub(crate) verbose: bool,
    #[command(flatten)]
    pub(crate) approval: ApprovalArgs,
    /// Continue this session of the store (`[store]`): its messages are
    /// the history, and each turn is added to it.
    #[arg(long, conflicts_with_all = ["new_session", "sessions"])]
    pub(crate) session: Option<String>,
    /// Start a new session in the store and keep the conversation there
    /// (its id is printed, for `--session` later).
    #[arg(long, conflicts_with = "sessions")]
    pub(crate) new_session: bool,
    /// List the store's sessions and exit.
    #[arg(long)]
    pub(crate) sessions: bool,
}

/// `wma serve`.
#[derive(Args)]
pub(crate) struct ServeArgs {
    /// The config to host (default: the demo shop's agent on the default
    /// model, as `wma run` asks it).
    #[arg(long, short)]
    pub(crate) config: Option<PathBuf>,
    /// Where the HTTP API listens (default: the config's `[server] listen`,
    /// else 127.0.0.1:8080).
    #[arg(long)]
    pub(crate) listen: Option<std::net::SocketAddr>,
    /// Host the agents for the cluster only, without the HTTP API.
    #[arg(long)]
    pub(crate) no_http: bool,
}

/// `wma check`.
#[derive(Args)]
pub(crate) struct CheckArgs {
    /// The config to check.
    pub(crate) config: PathBuf,
    /// Also open the page of every `webmcp` source and list the tools it
    /// registers, with their frame, form and annotations.
    #[arg(long)]
    pub(crate) pages: bool,
    /// Also start every tool source as a run would (MCP servers, pages,
    /// built-ins; no model is loaded) and list its tools; the command
    /// fails when one cannot start.
    #[arg(long)]
    pub(crate) probe: bool,
}

/// A tagged part as a line for a person: a sub-agent's parts are indented
/// and carry its name.
pub(crate) fn render_tagged(part: &TaggedPart) -> String {
    let line = render_part(&part.part);
    if part.depth == 0 {
        line
    } else {
        format!(
            "{}[{}] {line}",
            "  ".repeat(part.depth as usize),
            terminal_safe(&part.agent)
        )
    }
}

/// How a command prints a run's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// Every part as a JSON line.
    Json,
    /// Lines for a person: the calls, results, approvals and the answer;
    /// with `verbose` (`-v`) also what the loop's policy did.
    Text {
        /// Show the policy's rule lines (`· ground-strings: …`) too.
        verbose: bool,
    },
}

impl Output {
    /// From the `--json` and `-v` flags.
    pub(crate) fn new(json: bool, verbose: bool) -> Self {
        if json {
            Self::Json
        } else {
            Self::Text { verbose }
        }
    }

    /// Whether the output is for a person.
    pub(crate) fn is_text(self) -> bool {
        matches!(self, Self::Text { .. })
    }

    /// Whether `part` is printed: a rule line only when verbose (JSON
    /// carries every part, for programs).
    pub(crate) fn shows(self, part: &AgentStreamPart) -> bool {
        match self {
            Self::Json | Self::Text { verbose: true } => true,
            Self::Text { verbose: false } => !matches!(part, AgentStreamPart::Rule { .. }),
        }
    }
}

fn print_part(part: &TaggedPart, output: Output) -> Result<()> {
    if !output.shows(&part.part) {
        return Ok(());
    }
    match output {
        Output::Json => println!("{}", webmcp_agents::display::json_line(part)?),
        Output::Text { .. } => println!("{}", render_tagged(part)),
    }
    std::io::stdout().flush()?;
    Ok(())
}

/// Where [`start_announcing`] says which address the cluster node listens on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    /// On stdout, so a script (or a test) that started this node reads
    /// where it is.
    Stdout,
    /// On stderr, where stdout carries a protocol (`wma mcp` on stdio).
    Stderr,
}

/// Loads the config's models (with progress bars) and starts its runtime
/// and cluster node; waits for the nodes that host its remote sub-agents.
/// The node's address is said where `announce` says.
pub(crate) async fn start_announcing(config: &Config, announce: Announce) -> Result<Hosted> {
    let bars = Bars::new();
    let started = Instant::now();
    let hosted = config
        .start(StartOptions {
            progress: Some(bars.callback()),
            cluster: true,
        })
        .await;
    bars.finish();
    let hosted = hosted.with_context(|| format!("could not start {}", config.file.display()))?;
    eprintln!(
        "{} agent(s) ready in {:.1} s",
        config.agents.len(),
        started.elapsed().as_secs_f64()
    );
    if let Some(node) = &hosted.cluster {
        match announce {
            Announce::Stdout => println!("cluster listening on {}", node.addr()),
            Announce::Stderr => eprintln!("cluster listening on {}", node.addr()),
        }
        for remote in &config.remote_agents {
            if let Err(error) = node.wait_for_agent(&remote.name, REMOTE_WAIT).await {
                eprintln!(
                    "warning: no node offers `{}` yet ({error}); delegating to it fails until one does",
                    remote.name
                );
            }
        }
    }
    Ok(hosted)
}

/// [`start_announcing`] with the node's address on stdout.
pub(crate) async fn start(config: &Config) -> Result<Hosted> {
    start_announcing(config, Announce::Stdout).await
}

/// Starts every tool source the agent `name` uses, its sub-agents' too,
/// and fails with the reason when one cannot start: a run that needs a
/// source that is down would answer without its tools and look like
/// success.
pub(crate) async fn ensure_sources(config: &Config, hosted: &Hosted, name: &str) -> Result<()> {
    let (sources, _) = config.tool_sources_of(name);
    if let Some((source, reason)) = hosted.first_down(&sources).await {
        bail!("the tool source `{source}` that `{name}` needs could not start: {reason}");
    }
    Ok(())
}

/// The agent a request goes to: the one named, or the only top-level one.
pub(crate) fn pick_agent(config: &Config, named: Option<&str>) -> Result<String> {
    config.pick_agent(named).map_err(anyhow::Error::msg)
}

/// Stops the run in flight on Ctrl-C; with none in flight, ends the command.
#[derive(Clone, Default)]
struct Interrupt {
    running: Arc<Mutex<Option<(AgentHandle, RunId)>>>,
    quit: CancellationToken,
}

impl Interrupt {
    fn install(&self) {
        let this = self.clone();
        // The handler is registered here, before the task first runs: the
        // line editor passes Ctrl-C on as SIGINT, and one raised before a
        // lazily registered handler existed would end the process (seen on
        // a loaded machine).
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut interrupts = match signal(SignalKind::interrupt()) {
                Ok(signals) => signals,
                Err(e) => {
                    eprintln!("warning: Ctrl-C cannot be caught ({e}); it ends wma");
                    return;
                }
            };
            tokio::spawn(async move {
                while interrupts.recv().await.is_some() {
                    this.interrupted().await;
                }
            });
        }
        #[cfg(not(unix))]
        tokio::spawn(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                this.interrupted().await;
            }
        });
    }

    /// One Ctrl-C: stops the run in flight, or ends the command.
    async fn interrupted(&self) {
        let running = self.running.lock().clone();
        match running {
            Some((agent, run)) => {
                let _ = agent.stop(run).await;
            }
            None => self.quit.cancel(),
        }
    }

    fn set(&self, run: Option<(AgentHandle, RunId)>) {
        *self.running.lock() = run;
    }
}

/// One request against an agent; prints the parts as they come and
/// returns the run's own parts. A kept chat's parts go into the run's
/// `log`, and each to the `recorder`, which records the answers of the
/// calls it recorded before they were sent.
async fn ask(
    agent: &AgentHandle,
    messages: Vec<ChatMessage>,
    output: Output,
    interrupt: &Interrupt,
    approvals: &RunApprovals,
    log: Option<&RunLog>,
    recorder: Option<&RecordingApprover>,
) -> Result<Vec<AgentStreamPart>> {
    let mut run = agent
        .run_with(messages, CancellationToken::new(), approvals.clone())
        .await?;
    interrupt.set(Some((agent.clone(), run.id())));
    let mut own = Vec::new();
    while let Some(part) = run.next_tagged().await {
        if let Some(log) = log {
            log.append_in(&part.agent, part.depth, &part.sub_run, part.part.clone());
        }
        if let Some(recorder) = recorder {
            recorder.record_answer(&part);
        }
        print_part(&part, output)?;
        if part.depth == 0 {
            own.push(part.part);
        }
    }
    interrupt.set(None);
    Ok(own)
}

fn print_carts(hosted: &Hosted) {
    for (source, shop) in &hosted.shops {
        let cart = shop.cart_line();
        if !cart.is_empty() {
            eprintln!("cart of `{source}`: {}", terminal_safe(&cart));
        }
    }
}

/// `wma run --config`.
pub(crate) async fn run(
    config: &Config,
    agent: Option<&str>,
    request: &str,
    output: Output,
    approval: &ApprovalArgs,
) -> Result<()> {
    let name = pick_agent(config, agent)?;
    let approvals = RunApprovals::asking(approve::approver(approval.mode(false), None))
        .with_rules(approval.rules()?);
    let hosted = start(config).await?;
    if let Err(error) = ensure_sources(config, &hosted, &name).await {
        hosted.shutdown().await;
        return Err(error);
    }
    let interrupt = Interrupt::default();
    interrupt.install();
    if output.is_text() {
        println!("you → {name}: {request}");
    }
    let started = Instant::now();
    let result = ask(
        &hosted.runtime.agent(&name)?,
        vec![ChatMessage::user(request)],
        output,
        &interrupt,
        &approvals,
        None,
        None,
    )
    .await;
    eprintln!("\n{:.1} s in all", started.elapsed().as_secs_f64());
    print_carts(&hosted);
    hosted.shutdown().await;
    crate::outcome(result?.last())
}

/// `wma chat`: a conversation on the terminal, one request per line.
pub(crate) async fn chat(args: ChatArgs, config: &Config) -> Result<()> {
    let output = Output::new(args.json, args.verbose);
    if args.sessions {
        return list_sessions(config).await;
    }
    // The store and the session before the model loads: a wrong id is
    // said at once.
    let mut kept: Option<(Store, String)> = None;
    let mut history: Vec<ChatMessage> = Vec::new();
    let name = if let Some(id) = &args.session {
        let store = open_store(config).await?;
        let Some(session) = store.session_with_messages(id).await? else {
            bail!("the store has no session `{id}` (`wma chat --sessions` lists them)");
        };
        let agent = session.session.agent.clone();
        if let Some(named) = &args.agent
            && named != &agent
        {
            bail!("session `{id}` is with `{agent}`, not `{named}`");
        }
        pick_agent(config, Some(&agent))?;
        eprintln!(
            "continuing session {id} ({} messages)",
            session.messages.len()
        );
        history = session.messages;
        // Opening the store mended what it recovered; a turn cut before
        // an earlier start (whose mending failed) is mended here.
        match mend::mend_cut_turn(&store, id, &history).await {
            Ok(Some(mended)) => {
                report_mended(&mended);
                history.extend(mended.added);
            }
            Ok(None) => {}
            Err(e) => eprintln!("warning: the last turn of session {id} was not checked: {e}"),
        }
        kept = Some((store, id.clone()));
        agent
    } else {
        pick_agent(config, args.agent.as_deref())?
    };
    if args.new_session {
        let store = open_store(config).await?;
        let session = store.create_session(&name, "").await?;
        eprintln!(
            "session {} (continue it with --session {})",
            session.id, session.id
        );
        kept = Some((store, session.id));
    }
    // The person's requests and their answers to approval questions come
    // in on the same stdin, one per line: through a line editor for a
    // person at a terminal, plainly for a program (a pipe, or `--json`,
    // whose stdout must carry JSON lines only).
    let lines = if output.is_text() {
        Lines::terminal_or_stdin()
    } else {
        Lines::stdin()
    };
    let asking = approve::approver(args.approval.mode(true), Some(lines.clone()));
    // A kept chat records its calls that need it before they are sent, in
    // the turn's run, as `wma serve` does; a chat without a store keeps
    // nothing.
    let recorder = kept
        .as_ref()
        .map(|(store, _)| Arc::new(RecordingApprover::new(asking.clone(), store.clone())));
    let approver: Arc<dyn webmcp_agents::agent::Approver> = match &recorder {
        Some(recorder) => recorder.clone(),
        None => asking,
    };
    let approvals = RunApprovals::asking(approver).with_rules(args.approval.rules()?);
    let hosted = start(config).await?;
    if let Err(error) = ensure_sources(config, &hosted, &name).await {
        hosted.shutdown().await;
        return Err(error);
    }
    let agent = hosted.runtime.agent(&name)?;
    let interrupt = Interrupt::default();
    interrupt.install();
    eprintln!("talking to `{name}`; Ctrl-C stops a reply, Ctrl-D or /exit ends the chat");
    let prompt = if output.is_text() { "you> " } else { "" };
    loop {
        let input = if lines.edits() {
            // The editor holds the terminal in raw mode until it returns
            // (Ctrl-C reaches it as a key): the chat must not end under it.
            lines.request(prompt).await?
        } else {
            tokio::select! {
                _ = interrupt.quit.cancelled() => Input::Ended,
                input = lines.request(prompt) => input?,
            }
        };
        let Input::Line(line) = input else { break };
        if line == "/exit" || line == "/quit" {
            break;
        }
        if line.is_empty() {
            continue;
        }
        let request = ChatMessage::user(line);
        history.push(request.clone());
        let logged = match &kept {
            Some((store, session)) => {
                store
                    .append_messages(session, std::slice::from_ref(&request))
                    .await?;
                let run = store.start_run(session, &name, None).await?;
                if let Some(recorder) = &recorder {
                    recorder.begin_turn(&run.id);
                }
                Some((store, RunLog::for_run(store, &run)))
            }
            None => None,
        };
        let log = logged.as_ref().map(|(_, log)| log);
        let parts = ask(
            &agent,
            history.clone(),
            output,
            &interrupt,
            &approvals,
            log,
            recorder.as_deref(),
        )
        .await;
        // The turn's calls answered, or in doubt, before anything else
        // (an error of the terminal included) ends the chat.
        let in_doubt = match &recorder {
            Some(recorder) => Some(recorder.end_turn().await),
            None => None,
        };
        let mut parts = parts?;
        // A kept reply stopped in the middle of a call (Ctrl-C) leaves the
        // call without an answer: the session's history says what became
        // of it.
        if let Some(in_doubt) = in_doubt {
            let in_doubt: HashMap<String, String> = in_doubt
                .into_iter()
                .filter(|((agent, sub_run, _), _)| *agent == name && sub_run.is_empty())
                .map(|((_, _, call_id), key)| (call_id, key))
                .collect();
            mend::answer_cut_calls(&mut parts, &in_doubt, "the person stopped the reply");
        }
        let answer = serve::turn_messages(&parts);
        if let (Some((store, log)), Some((_, session))) = (&logged, &kept) {
            keep_turn(store, log, session, &answer).await;
        }
        history.extend(answer);
    }
    // The plain prompt's line is still open; the editor ended its own.
    if output.is_text() && !lines.edits() {
        println!();
    }
    print_carts(&hosted);
    hosted.shutdown().await;
    Ok(())
}

/// After a turn of a kept conversation: the run's log flushed (a run that
/// ended without its terminal part marked interrupted) and its answer
/// added to the session. A store that fails here is reported and the
/// chat goes on: the conversation is still in memory.
async fn keep_turn(store: &Store, log: &RunLog, session: &str, answer: &[ChatMessage]) {
    if let Err(e) = log.flush().await {
        eprintln!("warning: the turn's parts were not all kept: {e}");
    }
    if let Ok(Some(run)) = store.run(log.run_id()).await
        && !run.status.is_ended()
    {
        let _ = store.set_run_status(&run.id, RunStatus::Interrupted).await;
    }
    if let Err(e) = store.append_messages(session, answer).await {
        eprintln!("warning: the answer was not added to session {session}: {e}");
    }
}

/// Says on stderr what mending a session's cut turn added
/// ([`mend::mend_cut_turn`]): each call in doubt, for the person to check,
/// and how many messages the session got.
fn report_mended(mended: &mend::Mended) {
    for call in &mended.in_doubt {
        eprintln!(
            "call {} of the last turn ({} {}) is in doubt (key {}): check whether it happened; it is not sent again (session {})",
            call.call_id, call.tool, call.arguments, call.idempotency_key, mended.session_id
        );
    }
    eprintln!(
        "the last turn of session {} (run {}) was cut short: {} message(s) of it are added to the session",
        mended.session_id,
        mended.run_id,
        mended.added.len()
    );
}

/// Mends the sessions of `runs` (interrupted: recovered at the store's
/// opening, or given up on at shutdown) whose turn they cut, and says so.
/// A session that cannot be mended now is mended when it is continued.
async fn mend_sessions(store: &Store, runs: &[String]) {
    for (session, outcome) in mend::mend_sessions_of(store, runs).await {
        match outcome {
            Ok(Some(mended)) => report_mended(&mended),
            Ok(None) => {}
            Err(e) => eprintln!(
                "warning: the cut turn of session {session} was not mended now (it is when the session goes on): {e}"
            ),
        }
    }
}

/// `wma chat --sessions`: the store's sessions, newest first.
async fn list_sessions(config: &Config) -> Result<()> {
    let store = open_store(config).await?;
    let sessions = store.list_sessions(serve::SESSIONS_LISTED).await?;
    if sessions.is_empty() {
        eprintln!("no sessions yet (`wma chat --new-session` starts one)");
    }
    for session in sessions {
        println!(
            "{}  {}  {} messages  {}",
            session.id, session.agent, session.message_count, session.title
        );
    }
    Ok(())
}

/// `wma serve`: the config's agents behind the HTTP API (and to the
/// cluster), until Ctrl-C or SIGTERM.
pub(crate) async fn serve(args: ServeArgs, config: &Config) -> Result<()> {
    // The store first: one that cannot be opened stops the host before
    // a model loads or anything listens.
    let store = if args.no_http {
        None
    } else {
        Some(open_store(config).await?)
    };
    let hosted = start(config).await?;
    let shutdown = CancellationToken::new();
    let server = if let Some(store) = store {
        let api = serve::Api::hosted(config.clone(), &hosted)?;
        let api = serve::Api::with_store(api, store);
        let listen = args.listen.unwrap_or(config.server_listen);
        let started = serve::start_with(
            listen,
            api.clone(),
            config.server_options.clone(),
            shutdown.clone(),
        )
        .await
        .with_context(|| format!("could not start the HTTP API on {listen}"))?;
        eprintln!("{}", started.token_notice());
        eprintln!("{}", serve::ui::page_notice(&started));
        println!("http listening on http://{}", started.addr);
        if !started.addr.ip().is_loopback() {
            eprintln!(
                "warning: the API listens beyond this machine ({}); see docs/security.md",
                started.addr
            );
        }
        Some((started, api))
    } else {
        None
    };
    std::io::stdout().flush()?;
    wait_for_stop().await;
    // Stop accepting; the runs going on get the grace period to finish.
    shutdown.cancel();
    if let Some((started, api)) = server {
        let grace = config.server_options.shutdown_grace;
        let going = started.runs.ids().len();
        if going > 0 {
            eprintln!(
                "stopping: waiting up to {:.0} s for {going} run(s) to finish",
                grace.as_secs_f64()
            );
        } else {
            eprintln!("stopping");
        }
        // The runs given up on and marked interrupted: their sessions are
        // mended once their logs are flushed.
        let mut given_up = Vec::new();
        if !started.runs.drained(grace).await
            && let Some(store) = api.store()
        {
            // Given up on before they are stopped: their stopped ends are
            // not theirs. A run that waits for a person stays waiting, for
            // the next start to go on with; the others are interrupted.
            use webmcp_agents::store::RunStatus;
            started.runs.give_up();
            let (mut cut, mut waiting) = (Vec::new(), Vec::new());
            for run in started.runs.ids() {
                match store.run(&run).await {
                    Ok(Some(r)) if r.status == RunStatus::WaitingForApproval => waiting.push(run),
                    _ => {
                        let _ = store.set_run_status(&run, RunStatus::Interrupted).await;
                        cut.push(run);
                    }
                }
            }
            if !cut.is_empty() {
                eprintln!(
                    "stopping: {} run(s) did not finish in time and are marked interrupted: {}",
                    cut.len(),
                    cut.join(", ")
                );
            }
            given_up = cut;
            if !waiting.is_empty() {
                eprintln!(
                    "stopping: {} run(s) wait for an approval and go on after the next start: {}",
                    waiting.len(),
                    waiting.join(", ")
                );
            }
        }
        hosted.shutdown().await;
        // Their drivers end once the runtime stopped them; the server's
        // task once their connections have sent the last events.
        started.runs.drained(Duration::from_secs(5)).await;
        let _ = started.task.await;
        if let Some(store) = api.store() {
            // A driver given up on keeps nothing in its session: it gets
            // what the log holds of the cut turn here, as after a crash.
            mend_sessions(store, &given_up).await;
            store.close().await;
        }
    } else {
        eprintln!("stopping");
        hosted.shutdown().await;
    }
    Ok(())
}

/// Opens the config's store and says what it recovered of the last
/// process's work (runs it marked interrupted, calls in doubt, runs that
/// still wait for an answer).
pub(crate) async fn open_store(config: &Config) -> Result<Store> {
    let options = config.store.options()?;
    let store = Store::open(options)
        .await
        .context("could not open the session store (see [store] in docs/configuration.md)")?;
    eprintln!("sessions kept in {}", store.location());
    let recovery = store.recovery();
    if !recovery.interrupted_runs.is_empty() {
        eprintln!(
            "recovered: {} run(s) this host left running are now interrupted: {}",
            recovery.interrupted_runs.len(),
            recovery.interrupted_runs.join(", ")
        );
    }
    for call in &recovery.in_doubt_calls {
        eprintln!(
            "recovered: call {} of run {} ({} {}) was in flight and is in doubt: check whether it happened",
            call.idempotency_key, call.run_id, call.tool, call.arguments
        );
    }
    if !recovery.waiting_runs.is_empty() {
        eprintln!(
            "recovered: {} run(s) wait for an approval (GET /v1/approvals): {}",
            recovery.waiting_runs.len(),
            recovery.waiting_runs.join(", ")
        );
    }
    // Their sessions at once, so that reading one (the page, `GET
    // /v1/sessions/{id}`) shows what became of the cut turn.
    let interrupted = recovery.interrupted_runs.clone();
    mend_sessions(&store, &interrupted).await;
    Ok(store)
}

/// Ctrl-C, or SIGTERM on Unix: how `wma serve` and `wma mcp` are stopped.
pub(crate) async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// `wma check --pages`: every `webmcp` source's tools, one line each.
/// `wma check --probe`: starts each tool source and lists its tools; an
/// error names every source that could not start, so a script (or CI)
/// learns before a run does that a server is missing.
pub(crate) async fn check_probe(config: &Config) -> Result<()> {
    let mut down = Vec::new();
    for (source, result) in config.probe_sources().await {
        match result {
            Ok(tools) => println!(
                "  source {source}: started, {} tool(s): {}",
                tools.len(),
                tools.join(", ")
            ),
            Err(reason) => {
                println!("  source {source}: could not start: {reason}");
                down.push(source);
            }
        }
    }
    if !down.is_empty() {
        bail!("tool source(s) that could not start: {}", down.join(", "));
    }
    Ok(())
}

pub(crate) async fn check_pages(config: &Config) {
    for (source, tools) in config.page_tools().await {
        match tools {
            Ok(tools) => {
                println!("  page {source}: {} tool(s)", tools.len());
                for tool in &tools {
                    println!("    {}", webmcp_agents::config::page_tool_line(tool));
                }
            }
            Err(reason) => println!("  page {source}: could not be opened: {reason}"),
        }
    }
}

/// `wma check`: validates a config and says what it would start.
pub(crate) fn check(config: &Config) {
    println!("{}: ok", config.file.display());
    // What the config leaves out on purpose (disabled `mcpServers`
    // entries): a run only logs it, so a person checking the config sees
    // it here.
    for note in &config.notes {
        println!("  note: {note}");
    }
    for agent in &config.agents {
        let mut line = format!("  agent {} on {}", agent.name, agent.provider);
        if !agent.tools.is_empty() {
            line.push_str(&format!(", tools: {}", agent.tools.join(", ")));
        }
        if !agent.sub_agents.is_empty() {
            line.push_str(&format!(", delegates to: {}", agent.sub_agents.join(", ")));
        }
        println!("{line}");
        let policy = &agent.approval;
        let mut approval = format!(
            "    approval: read-only {}, consequential {}, other {}",
            policy.read_only, policy.consequential, policy.other
        );
        for rule in &policy.rules {
            approval.push_str(&format!(", {} {}", rule.pattern, rule.mode));
        }
        approval.push_str(&format!(
            "; a question waits {} s",
            policy.timeout.as_secs()
        ));
        println!("{approval}");
    }
    for remote in &config.remote_agents {
        println!("  agent {} on another node", remote.name);
    }
    if let Some(cluster) = &config.cluster {
        for warning in cluster.warnings() {
            println!("  warning: {warning}");
        }
    }
}
