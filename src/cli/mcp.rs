//! `wma mcp`: the config's agents served as MCP tools.
//!
//! Each top-level agent of the config is one tool, named after the agent,
//! that takes `{"request": "..."}` and answers with the agent's answer as
//! text. A run that ends without an answer (its step limit, a loop given
//! up, the token limit, an error, a stop) is a result with `isError` that
//! says how it ended, never an answer.
//!
//! Over stdio (the default) stdout carries only the protocol: every line
//! for a person (model loading, warnings, each call's end) goes to stderr.
//! No token is asked for there, since the process that started `wma mcp`
//! owns the pipe. Over streamable HTTP (`--listen ADDR`, at `/mcp`) every
//! request must carry the host's bearer token, the one `wma serve` takes
//! (`[server] token_env` / `token_file`, else the cache folder's
//! `http-token`).
//!
//! Calls follow the config's approval rules and the `--ask`/`--deny`
//! flags. A call that needs a person's approval is denied by default:
//! there is no person at `wma mcp` to ask (on stdio, stdin is the
//! protocol), so the denial goes to the agent's model, and the tool's
//! result names the calls that were denied. `--approve all` lets them run;
//! `--approve ask` (stdio only) asks the client's person with a form (MCP
//! elicitation), and denies when the client offers none. See docs/mcp.md.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use clap::Args;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, Implementation, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, RequestParamsMeta, ServerCapabilities, ServerConfig,
    Tool, ToolAnnotations,
};
use rmcp::service::{ElicitationMode, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use webmcp_agents::agent::{
    AgentStreamPart, ApprovalAnswer, ApprovalRequest, ApprovalRule, Approver, ChatMessage,
    FixedApprover,
};
use webmcp_agents::config::{Config, Hosted};
use webmcp_agents::runtime::{AgentHandle, RunApprovals, RunOutcome};
use webmcp_agents::serve::{Token, load_token};

use super::approve::{ApprovalArgs, ApproveMode};

/// The path the streamable HTTP endpoint answers on.
const MCP_PATH: &str = "/mcp";

/// The field of the approval form: whether the call may run.
const APPROVE_FIELD: &str = "approve";

/// How often an HTTP call's open response is pinged while its run works.
const SSE_PING: Duration = Duration::from_secs(2);

/// Who answered the questions `wma mcp` cannot ask, in the decision's part.
const UNATTENDED: &str = "wma mcp";

/// What the agent's model reads when a call needed a person's approval.
const NO_ONE_TO_ASK: &str = "it needs a person's approval, and `wma mcp` has no one to ask (its caller is a program); the operator can pre-approve with `wma mcp --approve all` or an `auto` rule in the config, or let the client's person answer with `--approve ask` on stdio";

/// The same when `--approve ask` met a client that offers no form to ask
/// its person with.
const CLIENT_CANNOT_ASK: &str = "it needs a person's approval, and the MCP client offers no way to ask one (it declared no form elicitation)";

/// `wma mcp`.
#[derive(Args)]
// The approval flags are shared with `wma run`, whose `ask` is the
// terminal's; here it is the client's person.
#[command(
    after_help = "Approvals here: a call that needs a person is denied by default (no one to ask); \
                  --approve all pre-approves; --approve ask (stdio only) asks the MCP client's \
                  person with a form (elicitation). See docs/mcp.md."
)]
pub(crate) struct McpArgs {
    /// The config to host (default: the demo shop's agent on the default
    /// model, as `wma run` asks it).
    #[arg(long, short)]
    pub(crate) config: Option<PathBuf>,
    /// Serve streamable HTTP on this address, at `/mcp`, instead of stdio
    /// (every request needs the host's bearer token, as `wma serve`'s do).
    #[arg(long, visible_alias = "http", value_name = "ADDR")]
    pub(crate) listen: Option<SocketAddr>,
    #[command(flatten)]
    pub(crate) approval: ApprovalArgs,
}

/// Serves the config's agents as MCP tools, until the client goes (stdio)
/// or Ctrl-C / SIGTERM.
pub(crate) async fn serve(args: McpArgs, config: &Config) -> Result<()> {
    // Flag mistakes and a token that cannot be read are said before a
    // model loads.
    let approvals = Approvals::from_flags(&args.approval, args.listen.is_some())?;
    let transport = match args.listen {
        Some(listen) => {
            let (token, origin) = load_token(&config.server_options.token)
                .context("could not read the http token (see [server] in docs/configuration.md)")?;
            eprintln!("{}", origin.notice(&token));
            Transport::Http { listen, token }
        }
        None => Transport::Stdio,
    };
    let names: Vec<String> = config
        .top_level_agents()
        .iter()
        .map(|a| a.name.clone())
        .collect();
    if names.is_empty() {
        bail!("{} has no agent to serve", config.file.display());
    }
    // On stdio, stdout is the protocol's: the cluster's address goes to stderr.
    let hosted = super::start_announcing(config, super::Announce::Stderr).await?;
    let server = match AgentTools::new(config, &hosted, &names, approvals).await {
        Ok(server) => server,
        Err(error) => {
            hosted.shutdown().await;
            return Err(error);
        }
    };
    eprintln!(
        "serving {} as MCP tools ({})",
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", "),
        match transport {
            Transport::Http { .. } => "streamable HTTP",
            Transport::Stdio => "stdio",
        }
    );
    let result = match transport {
        Transport::Http { listen, token } => serve_http(server, listen, token, config).await,
        Transport::Stdio => serve_stdio(server).await,
    };
    hosted.shutdown().await;
    result
}

/// Where the protocol goes.
enum Transport {
    /// stdin and stdout, for the process that started `wma mcp`.
    Stdio,
    /// Streamable HTTP on `listen`, behind `token`.
    Http {
        /// The address to listen on.
        listen: SocketAddr,
        /// The host's bearer token.
        token: Token,
    },
}

/// How the calls of every run are approved: the config's rules, with the
/// `--ask` and `--deny` flags on top, and who answers a call that needs a
/// person.
#[derive(Clone)]
struct Approvals {
    /// Who answers.
    answering: Answering,
    /// The runs' own rules, from `--ask` and `--deny`.
    rules: Vec<ApprovalRule>,
}

/// Who answers a call that needs a person's approval.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Answering {
    /// No one: it is denied, and the model reads why (the default).
    Deny,
    /// `--approve all`: the operator approved every such call beforehand.
    ApproveAll,
    /// `--approve ask`, on stdio: the client's person, through a form the
    /// client shows (MCP elicitation); denied when the client offers none.
    Client,
}

impl Approvals {
    /// From the approval flags; `http` says whether the transport is HTTP,
    /// where no question can be sent.
    fn from_flags(args: &ApprovalArgs, http: bool) -> Result<Self> {
        let answering = match args.approve {
            Some(ApproveMode::All) => Answering::ApproveAll,
            // Without sessions an HTTP call has no way back for the
            // client's answer: the question would wait out its time.
            Some(ApproveMode::Ask) if http => bail!(
                "`wma mcp --listen` cannot ask about a call: over HTTP it keeps no session for the client's answer. Ask on stdio, pre-approve with --approve all, or set the tools to `auto` in the config's [agents.NAME.approval]"
            ),
            Some(ApproveMode::Ask) => Answering::Client,
            Some(ApproveMode::None) | None => Answering::Deny,
        };
        Ok(Self {
            answering,
            rules: args.rules()?,
        })
    }

    /// A run's approvals for a call that came from `peer`.
    fn for_call(&self, peer: &Peer<RoleServer>) -> RunApprovals {
        let approver: Arc<dyn Approver> = match self.answering {
            Answering::Deny => Arc::new(FixedApprover::deny_all(UNATTENDED, NO_ONE_TO_ASK)),
            Answering::ApproveAll => Arc::new(FixedApprover::approve_all("--approve all")),
            Answering::Client => Arc::new(ClientApprover { peer: peer.clone() }),
        };
        RunApprovals::asking(approver).with_rules(self.rules.clone())
    }
}

/// Asks the MCP client's person about a call, with a form of one yes/no
/// field (form elicitation). The run's approval policy bounds the wait,
/// and a stopped run stops waiting.
struct ClientApprover {
    /// The client that made the tool call.
    peer: Peer<RoleServer>,
}

#[async_trait]
impl Approver for ClientApprover {
    async fn ask(&self, request: ApprovalRequest) -> ApprovalAnswer {
        let deny = |note: String| ApprovalAnswer::deny().by(UNATTENDED).with_note(note);
        if !self
            .peer
            .supported_elicitation_modes()
            .contains(&ElicitationMode::Form)
        {
            return deny(CLIENT_CANNOT_ASK.to_string());
        }
        let schema = match ElicitationSchema::builder()
            .required_bool_with(APPROVE_FIELD, |b| {
                b.title("Approve").description("Let the call run")
            })
            .build()
        {
            Ok(schema) => schema,
            Err(e) => return deny(format!("the question could not be made: {e}")),
        };
        let message = format!(
            "The agent `{}` wants to call `{}` with {}\n(it asks because {})\nApprove it?",
            request.agent, request.tool, request.arguments, request.reason
        );
        let asked = self
            .peer
            .create_elicitation(ElicitRequestParams::FormElicitationParams {
                meta: None,
                message,
                requested_schema: schema,
            })
            .await;
        match asked {
            Ok(result) => {
                let yes = result.action == ElicitationAction::Accept
                    && result
                        .content
                        .as_ref()
                        .and_then(|c| c.get(APPROVE_FIELD))
                        .and_then(Value::as_bool)
                        == Some(true);
                match result.action {
                    _ if yes => ApprovalAnswer::approve(),
                    ElicitationAction::Accept => {
                        ApprovalAnswer::deny().with_note("the person said no")
                    }
                    ElicitationAction::Decline => {
                        ApprovalAnswer::deny().with_note("the person declined to approve it")
                    }
                    // Cancel, and whatever a later revision adds: no yes.
                    _ => ApprovalAnswer::deny()
                        .with_note("the person dismissed the question without approving it"),
                }
            }
            Err(e) => deny(format!("the MCP client could not be asked: {e}")),
        }
    }
}

/// The MCP server: one tool per top-level agent. Cheap to clone (the HTTP
/// transport makes one per request).
#[derive(Clone)]
struct AgentTools {
    /// The tools, in the order of the config's agents (by name).
    tools: Arc<Vec<Tool>>,
    /// Each tool's agent, by tool name.
    agents: Arc<HashMap<String, AgentHandle>>,
    /// How every run's calls are approved.
    approvals: Approvals,
}

impl AgentTools {
    /// The tools of the agents `names`, each with its sources started: a
    /// source that cannot start fails here, as it does for `wma run`,
    /// rather than letting a tool answer without the tools it needs.
    async fn new(
        config: &Config,
        hosted: &Hosted,
        names: &[String],
        approvals: Approvals,
    ) -> Result<Self> {
        let mut tools = Vec::new();
        let mut agents = HashMap::new();
        for name in names {
            super::ensure_sources(config, hosted, name).await?;
            let spec = config
                .agent(name)
                .with_context(|| format!("the config has no agent `{name}`"))?;
            let description = if !spec.description.trim().is_empty() {
                spec.description.clone()
            } else if let Some(instructions) = spec.instructions.as_ref().filter(|i| !i.is_empty())
            {
                instructions.clone()
            } else {
                format!("The agent `{name}`: give it a request in plain words.")
            };
            let mut tool = Tool::new(tool_name(name)?, description, input_schema());
            // Claimed only when true: a client may run a read-only tool
            // without asking its person, so an agent with one tool that
            // changes things gets no hint at all.
            if read_only(config, hosted, name).await {
                tool = tool.with_annotations(ToolAnnotations::new().read_only(true));
            }
            agents.insert(tool.name.to_string(), hosted.runtime.agent(name)?);
            tools.push(tool);
        }
        Ok(Self {
            tools: Arc::new(tools),
            agents: Arc::new(agents),
            approvals,
        })
    }

    /// Runs the agent of `tool` on `request` until it ends, or until
    /// `cancel` (the client's cancellation, or its going away) stops it.
    /// With `progress`, each step and call is told to the client as it
    /// starts: a run on a small CPU model can outlast a client's request
    /// timeout, which progress lets it extend.
    async fn ask(
        &self,
        tool: &str,
        agent: &AgentHandle,
        request: String,
        cancel: CancellationToken,
        approvals: RunApprovals,
        progress: Option<Progress>,
    ) -> CallToolResult {
        let started = Instant::now();
        let run = agent
            .run_with(vec![ChatMessage::user(request)], cancel, approvals)
            .await;
        let mut run = match run {
            Ok(run) => run,
            Err(error) => {
                eprintln!("mcp: `{tool}` could not start a run: {error}");
                return CallToolResult::error(vec![ContentBlock::text(format!(
                    "The agent `{tool}` could not take the request: {error}"
                ))]);
            }
        };
        let mut outcome = RunOutcome::default();
        let mut told = 0.0;
        while let Some(part) = run.next_tagged().await {
            if let Some(progress) = &progress
                && let Some(message) = progress_message(part.depth, &part.agent, &part.part)
            {
                told += 1.0;
                progress.tell(told, message).await;
            }
            outcome.observe(part.depth, &part.agent, &part.part);
        }
        eprintln!(
            "mcp: `{tool}` {} in {:.1} s",
            outcome.summary(),
            started.elapsed().as_secs_f64()
        );
        call_result(&outcome, tool)
    }
}

impl ServerHandler for AgentTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("wma", env!("CARGO_PKG_VERSION"))
                    .with_title("webmcp-agents"),
            )
            .with_instructions(
                "Each tool is an agent: call it with {\"request\": \"...\"} in plain words, and it answers in text. A result with isError did not answer the request, and says how it ended.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(agent) = self.agents.get(request.name.as_ref()) else {
            return Err(ErrorData::invalid_params(
                format!("there is no tool named `{}`", request.name),
                None,
            ));
        };
        let text = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("request"))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty());
        // A mistake in the arguments is a result the calling model reads
        // and can mend, not a protocol error its host hides.
        let Some(text) = text else {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "The call needs `request`: what to ask the agent, as a non-empty string.",
            )])
            .into());
        };
        let approvals = self.approvals.for_call(&context.peer);
        let progress = request
            .progress_token()
            .or_else(|| context.meta.get_progress_token())
            .map(|token| Progress {
                peer: context.peer.clone(),
                token,
            });
        Ok(self
            .ask(
                &request.name,
                agent,
                text.to_string(),
                context.ct.clone(),
                approvals,
                progress,
            )
            .await
            .into())
    }
}

/// Where a call's progress goes: the client that asked for it, under the
/// token it gave.
struct Progress {
    /// The client.
    peer: Peer<RoleServer>,
    /// The call's `progressToken`.
    token: ProgressToken,
}

impl Progress {
    /// Tells the client the run got to `count` with `message`. A client
    /// that is gone is no reason to stop the run here: its going away
    /// cancels the call.
    async fn tell(&self, count: f64, message: String) {
        let mut param = ProgressNotificationParam::new(self.token.clone(), count);
        param.message = Some(message);
        let _ = self.peer.notify_progress(param).await;
    }
}

/// The progress line of a part: a step of the agent, or a call of any
/// agent of the run (a sub-agent's included); `None` for the others.
fn progress_message(depth: u32, agent: &str, part: &AgentStreamPart) -> Option<String> {
    match part {
        AgentStreamPart::MessageStart { step } if depth == 0 => Some(format!("step {step}")),
        AgentStreamPart::ToolCall { name, .. } => Some(format!("`{agent}` calls `{name}`")),
        AgentStreamPart::ApprovalRequested { name, .. } => {
            Some(format!("`{agent}` asks about a call of `{name}`"))
        }
        _ => None,
    }
}

/// The tool name of an agent. Config names already keep to letters,
/// digits, `_` and `-`, which MCP tool names take; only their length can
/// be too much.
fn tool_name(agent: &str) -> Result<String> {
    if agent.is_empty() || agent.len() > 128 {
        bail!("the agent name `{agent}` cannot be an MCP tool name (1 to 128 characters)");
    }
    Ok(agent.to_string())
}

/// Every tool's input: the request, in plain words.
fn input_schema() -> Arc<serde_json::Map<String, Value>> {
    let schema = json!({
        "type": "object",
        "properties": {
            "request": {
                "type": "string",
                "description": "What to ask the agent, in plain words, as a person would."
            }
        },
        "required": ["request"]
    });
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("the schema is an object"),
    }
}

/// Whether every tool the agent `name` can call, its sub-agents' tools
/// included, says it is read-only. An agent that delegates to another
/// node cannot tell, and is not.
async fn read_only(config: &Config, hosted: &Hosted, name: &str) -> bool {
    let (sources, all_here) = config.tool_sources_of(name);
    all_here && hosted.all_read_only(&sources).await
}

/// The tool's result of a run: the answer, or an error result that says
/// how the run ended without one. Denied calls are named after either.
fn call_result(outcome: &RunOutcome, tool: &str) -> CallToolResult {
    let (is_error, text) = match outcome.answer(tool) {
        Ok(answer) => (false, answer),
        Err(why) => (true, why),
    };
    let mut content = vec![ContentBlock::text(text)];
    if !outcome.denied().is_empty() {
        content.push(ContentBlock::text(format!(
            "Calls that were not run (denied): {}",
            outcome.denied().join("; ")
        )));
    }
    if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

/// Serves on stdin and stdout until the client closes them, or Ctrl-C /
/// SIGTERM. Closing them stops the calls in flight.
async fn serve_stdio(server: AgentTools) -> Result<()> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client did not complete the handshake on stdio")?;
    let stop = running.cancellation_token();
    let waiting = running.waiting();
    tokio::pin!(waiting);
    tokio::select! {
        ended = &mut waiting => { ended?; }
        _ = super::wait_for_stop() => {
            stop.cancel();
            waiting.await?;
        }
    }
    Ok(())
}

/// The response body of the HTTP endpoint (rmcp's).
type Body = BoxBody<Bytes, Infallible>;

/// Serves streamable HTTP at `listen` until Ctrl-C or SIGTERM. Every
/// request needs the bearer token; rmcp checks the `Host` (loopback names,
/// the listen address and `[server] allowed_hosts`) and refuses an
/// `Origin` that `[server] allowed_origins` does not name, as `wma serve`
/// does, and bounds the body by `[server] max_body_bytes`.
async fn serve_http(
    server: AgentTools,
    listen: SocketAddr,
    token: Token,
    config: &Config,
) -> Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("could not listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let options = &config.server_options;
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    if !addr.ip().is_unspecified() {
        hosts.push(addr.ip().to_string());
    }
    hosts.extend(options.allowed_hosts.iter().cloned());
    let shutdown = CancellationToken::new();
    let mut http = StreamableHttpServerConfig::default()
        // No sessions (as the protocol's 2026-07-28 revision has none): a
        // call's response is its own stream, and a client that drops it
        // stops the call's run. A notification sent on another request
        // finds no run to stop, so over HTTP closing is how to cancel.
        .with_legacy_session_mode(false)
        // A dropped stream is noticed at the next write: a ping every few
        // seconds bounds how long a run outlives its caller.
        .with_sse_keep_alive(Some(SSE_PING))
        .with_allowed_hosts(hosts)
        .with_allowed_origins(options.allowed_origins.clone())
        .with_max_request_body_bytes(options.max_body_bytes)
        .with_cancellation_token(shutdown.child_token());
    if options.allowed_origins.is_empty() {
        http = http.enforce_origin_validation();
    }
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        http,
    );
    // On stdout, so that a program (or a test) that started it reads where.
    println!("mcp listening on http://{addr}{MCP_PATH}");
    if !addr.ip().is_loopback() {
        eprintln!("warning: wma mcp listens beyond this machine ({addr}); see docs/security.md");
    }
    let token = Arc::new(token);
    let header_timeout = options.header_timeout;
    let stop = super::wait_for_stop();
    tokio::pin!(stop);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: a pause, not the end.
                    eprintln!("warning: could not accept a connection: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let service = service.clone();
        let token = token.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let handler = hyper::service::service_fn(move |request: Request<Incoming>| {
                let service = service.clone();
                let token = token.clone();
                async move { Ok::<_, Infallible>(route(&service, &token, request).await) }
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // A client that dribbles its request head holds the connection
            // no longer than `wma serve` lets it ([server]
            // header_timeout_secs). hyper's timeout also closes a
            // kept-alive connection that waits that long for its next
            // request, which costs a client only a reconnect.
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), handler);
            tokio::select! {
                _ = connection => {}
                _ = shutdown.cancelled() => {}
            }
        });
    }
    eprintln!("stopping");
    shutdown.cancel();
    Ok(())
}

/// One HTTP request: the token first, then the path, then rmcp.
async fn route(
    service: &StreamableHttpService<AgentTools, LocalSessionManager>,
    token: &Token,
    request: Request<Incoming>,
) -> Response<Body> {
    if !authorized(token, request.headers().get(AUTHORIZATION)) {
        let mut response = plain(
            StatusCode::UNAUTHORIZED,
            "this endpoint needs the host's bearer token (Authorization: Bearer TOKEN); see docs/mcp.md",
        );
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    if request.uri().path() != MCP_PATH {
        return plain(StatusCode::NOT_FOUND, "the MCP endpoint is /mcp");
    }
    service.handle(request).await
}

/// Whether `header` is `Bearer TOKEN` with the host's token, compared in
/// constant time as `wma serve` compares it.
fn authorized(token: &Token, header: Option<&HeaderValue>) -> bool {
    let Some(value) = header else {
        return false;
    };
    let value = value.as_bytes();
    let scheme = b"bearer ";
    if value.len() <= scheme.len() || !value[..scheme.len()].eq_ignore_ascii_case(scheme) {
        return false;
    }
    let presented = value[scheme.len()..].trim_ascii();
    token.as_str().as_bytes().ct_eq(presented).into()
}

fn plain(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{message}\n"))).boxed());
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use webmcp_agents::agent::{FinishReason, ToolError, ToolErrorCode};

    fn finished(reason: FinishReason, texts: &[&str]) -> RunOutcome {
        let mut outcome = RunOutcome::default();
        outcome.observe(0, "a", &AgentStreamPart::MessageStart { step: 1 });
        for text in texts {
            outcome.observe(
                0,
                "a",
                &AgentStreamPart::Text {
                    text: text.to_string(),
                },
            );
        }
        outcome.observe(0, "a", &AgentStreamPart::Finish { reason });
        outcome
    }

    fn text_of(result: &CallToolResult) -> String {
        result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn only_a_run_that_answered_is_a_plain_result() {
        let answered = call_result(&finished(FinishReason::Stop, &["Hello."]), "a");
        assert_eq!(answered.is_error, Some(false));
        assert_eq!(text_of(&answered), "Hello.");
        for (reason, says) in [
            (FinishReason::MaxSteps, "step limit"),
            (FinishReason::Loop, "repeating"),
            (FinishReason::Length, "token limit"),
            (FinishReason::Unrepaired, "valid call"),
            (FinishReason::Aborted, "stopped"),
        ] {
            let result = call_result(&finished(reason, &["Some words."]), "a");
            assert_eq!(result.is_error, Some(true), "{reason:?}");
            assert!(text_of(&result).contains(says), "{reason:?}: {result:?}");
        }
        let silent = call_result(&finished(FinishReason::Stop, &[]), "a");
        assert_eq!(silent.is_error, Some(true));
    }

    #[test]
    fn the_answer_is_the_last_step_of_the_agent_itself() {
        let mut outcome = RunOutcome::default();
        outcome.observe(0, "a", &AgentStreamPart::MessageStart { step: 1 });
        outcome.observe(
            0,
            "a",
            &AgentStreamPart::Text {
                text: "Let me look.".into(),
            },
        );
        outcome.observe(
            1,
            "helper",
            &AgentStreamPart::Text {
                text: "A helper's words.".into(),
            },
        );
        outcome.observe(
            1,
            "helper",
            &AgentStreamPart::ToolError {
                call_id: "c1".into(),
                name: "place_order".into(),
                error: ToolError::new(ToolErrorCode::Denied, "no one to ask"),
            },
        );
        outcome.observe(0, "a", &AgentStreamPart::MessageStart { step: 2 });
        outcome.observe(
            0,
            "a",
            &AgentStreamPart::Text {
                text: "Done.".into(),
            },
        );
        outcome.observe(
            0,
            "a",
            &AgentStreamPart::Finish {
                reason: FinishReason::Stop,
            },
        );
        let result = call_result(&outcome, "a");
        assert_eq!(result.is_error, Some(false));
        let text = text_of(&result);
        assert!(text.starts_with("Done.\n"), "{text}");
        assert!(
            text.contains("place_order (of `helper`): no one to ask"),
            "{text}"
        );
    }

    #[test]
    fn only_the_hosts_token_is_authorized() {
        let token = Token::generate().unwrap();
        let header = |s: String| HeaderValue::from_str(&s).unwrap();
        assert!(authorized(
            &token,
            Some(&header(format!("Bearer {}", token.as_str())))
        ));
        assert!(authorized(
            &token,
            Some(&header(format!("bearer  {} ", token.as_str())))
        ));
        assert!(!authorized(&token, None));
        assert!(!authorized(
            &token,
            Some(&header(format!("Basic {}", token.as_str())))
        ));
        assert!(!authorized(
            &token,
            Some(&header(format!("Bearer {}x", token.as_str())))
        ));
        assert!(!authorized(&token, Some(&header("Bearer ".into()))));
    }
}
