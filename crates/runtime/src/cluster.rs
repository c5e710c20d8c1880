//! Sub-agents on other nodes, over `ractor_cluster`, ractor's own
//! distributed transport.
//!
//! A [`ClusterNode`] runs ractor_cluster's node server next to a
//! [`Runtime`]. Nodes authenticate each other with a shared secret (the
//! "magic cookie" of ractor_cluster's handshake: each side proves it knows
//! the cookie without sending it). A node *exports* some of its agents: an
//! endpoint actor joins one process group per exported agent, and
//! ractor_cluster mirrors process groups to every connected node. A parent
//! on another node that names the agent as a sub-agent (declared there with
//! [`RuntimeBuilder::remote_agent`](crate::RuntimeBuilder::remote_agent))
//! finds the endpoint in that group and delegates to it.
//!
//! The protocol is JSON in ractor calls: `start` a run (task and depth),
//! `next` (a long poll that returns the parts ready, at most
//! [`NEXT_BATCH`] at a time, waiting up to [`NEXT_WAIT`] for the first),
//! `stop`. Polling keeps the reader in charge of the pace, as the local
//! part channel's backpressure does.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{NodeEventSubscription, NodeServer, NodeServerMessage};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wma_agent::{ChatMessage, ToolError, ToolErrorCode};

use crate::agent::{AgentHandle, RunStream};
use crate::delegator::{FinalAnswer, Job, Relay, refused};
use crate::error::RuntimeError;
use crate::part::TaggedPart;
use crate::supervisor::{Runtime, Timeouts};

/// The process-group scope every exported agent's endpoint joins.
pub const CLUSTER_SCOPE: &str = "wma";

/// Where a node listens unless told otherwise: loopback, on a free port.
pub const DEFAULT_CLUSTER_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// How long a `next` poll waits for the first part before answering with none.
pub const NEXT_WAIT: Duration = Duration::from_millis(500);

/// Most parts one `next` answer carries.
pub const NEXT_BATCH: usize = 64;

/// A remote run that nobody polled for this long is stopped: its parent's
/// node went away without saying so.
pub const REMOTE_RUN_IDLE: Duration = Duration::from_secs(120);

/// The process group of an exported agent.
fn group_of(agent: &str) -> String {
    format!("agent:{agent}")
}

/// How this node joins the cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// This node's name, as peers see it. Default `wma`.
    pub node_name: String,
    /// The shared secret every node of the cluster is started with. A peer
    /// with another cookie fails the handshake and is disconnected. Required.
    pub cookie: String,
    /// Where to listen. Default [`DEFAULT_CLUSTER_LISTEN`] (loopback, a free
    /// port); the transport is not encrypted, so keep it on loopback or a
    /// private network.
    pub listen: SocketAddr,
    /// The local agents other nodes may delegate to. Default none.
    pub export: Vec<String>,
}

impl ClusterOptions {
    /// Options with this cookie and the defaults.
    pub fn new(cookie: impl Into<String>) -> Self {
        Self {
            node_name: "wma".to_string(),
            cookie: cookie.into(),
            listen: DEFAULT_CLUSTER_LISTEN,
            export: Vec::new(),
        }
    }
}

/// Counts of node sessions, as the node server reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionCounts {
    /// Connections opened (either way).
    pub opened: u64,
    /// Connections whose handshake proved the same cookie.
    pub authenticated: u64,
    /// Connections closed (a failed handshake closes one).
    pub disconnected: u64,
}

struct Sessions(watch::Sender<SessionCounts>);

impl NodeEventSubscription for Sessions {
    fn node_session_opened(&self, _ses: NodeServerSessionInformation) {
        self.0.send_modify(|c| c.opened += 1);
    }
    fn node_session_disconnected(&self, _ses: NodeServerSessionInformation) {
        self.0.send_modify(|c| c.disconnected += 1);
    }
    fn node_session_authenticated(&self, _ses: NodeServerSessionInformation) {
        self.0.send_modify(|c| c.authenticated += 1);
    }
}

/// This process as a node of a ractor cluster: it hosts exported agents for
/// other nodes and reaches the agents they export. Cheap to clone.
#[derive(Clone)]
pub struct ClusterNode {
    server: ActorRef<NodeServerMessage>,
    endpoint: Option<ActorRef<EndpointMsg>>,
    addr: SocketAddr,
    sessions: watch::Receiver<SessionCounts>,
}

impl ClusterNode {
    /// Starts the node server and exports `options.export` of `runtime`'s agents.
    pub async fn start(options: ClusterOptions, runtime: &Runtime) -> Result<Self, RuntimeError> {
        let spawn_error = |actor: &str, e: &dyn std::fmt::Display| RuntimeError::Spawn {
            actor: actor.to_string(),
            reason: e.to_string(),
        };
        if options.cookie.is_empty() {
            return Err(RuntimeError::Config(
                "a cluster node needs a cookie (the shared secret of its cluster)".to_string(),
            ));
        }
        let mut exported = HashMap::new();
        for name in &options.export {
            exported.insert(name.clone(), runtime.agent(name)?);
        }
        let mut addr = options.listen;
        if addr.port() == 0 {
            // The node server does not tell which port the system picked, so
            // pick one here; peers need to know it.
            let probe = std::net::TcpListener::bind(addr)
                .map_err(|e| spawn_error("cluster listener", &e))?;
            addr = probe
                .local_addr()
                .map_err(|e| spawn_error("cluster listener", &e))?;
        }
        let server = NodeServer::new(
            addr.port(),
            options.cookie.clone(),
            options.node_name.clone(),
            addr.ip().to_string(),
            None,
            None,
        )
        .with_listen_addr(addr.ip());
        let (server, _) = Actor::spawn(None, server, ())
            .await
            .map_err(|e| spawn_error("cluster node server", &e))?;
        let (counts, sessions) = watch::channel(SessionCounts::default());
        let _ = server.cast(NodeServerMessage::SubscribeToEvents {
            id: "wma-sessions".to_string(),
            subscription: Box::new(Sessions(counts)),
        });
        let endpoint = if exported.is_empty() {
            None
        } else {
            let names: Vec<String> = exported.keys().cloned().collect();
            let (endpoint, _) = Actor::spawn(None, Endpoint, exported)
                .await
                .map_err(|e| spawn_error("cluster endpoint", &e))?;
            for name in names {
                ractor::pg::join_scoped(
                    CLUSTER_SCOPE.to_string(),
                    group_of(&name),
                    vec![endpoint.get_cell()],
                );
            }
            Some(endpoint)
        };
        Ok(Self {
            server,
            endpoint,
            addr,
            sessions,
        })
    }

    /// Where this node listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connects to another node (`host:port`). The handshake goes on in
    /// the background; [`ClusterNode::wait_for_agent`] waits for its result.
    pub async fn connect(&self, peer: &str) -> Result<(), RuntimeError> {
        ractor_cluster::client_connect(&self.server, peer)
            .await
            .map_err(|e| RuntimeError::Unavailable {
                actor: format!("cluster node at {peer}"),
                reason: e.to_string(),
            })
    }

    /// Sessions opened, authenticated and closed so far.
    pub fn sessions(&self) -> SessionCounts {
        *self.sessions.borrow()
    }

    /// Whether a node of the cluster (this one included) offers `agent` now.
    pub fn offers(&self, agent: &str) -> bool {
        find_agent(agent).is_some()
    }

    /// Waits until a node offers `agent`, at most `timeout`.
    pub async fn wait_for_agent(&self, agent: &str, timeout: Duration) -> Result<(), RuntimeError> {
        let deadline = Instant::now() + timeout;
        while !self.offers(agent) {
            if Instant::now() >= deadline {
                return Err(RuntimeError::Timeout {
                    actor: format!("cluster (waiting for a node that offers `{agent}`)"),
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Stops the endpoint and the node server (connections close).
    pub async fn shutdown(&self) {
        if let Some(endpoint) = &self.endpoint {
            let _ = endpoint
                .stop_and_wait(None, Some(Duration::from_secs(5)))
                .await;
        }
        let _ = self
            .server
            .stop_and_wait(None, Some(Duration::from_secs(5)))
            .await;
    }
}

impl std::fmt::Debug for ClusterNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNode")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// The endpoint of a node that offers `agent`, if one is connected.
pub(crate) fn find_agent(agent: &str) -> Option<ActorRef<EndpointMsg>> {
    ractor::pg::get_scoped_members(&CLUSTER_SCOPE.to_string(), &group_of(agent))
        .into_iter()
        .next()
        .map(ActorRef::from)
}

/// What a parent's node asks an endpoint.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
enum Request {
    /// Start a run of `agent` with `task` as the user's message.
    Start {
        agent: String,
        task: String,
        depth: u32,
    },
    /// The parts of `run` that are ready (waiting up to `wait_ms` for one).
    Next { run: u64, wait_ms: u64 },
    /// Stop `run`.
    Stop { run: u64 },
}

/// What an endpoint answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case")]
enum Reply {
    Started {
        run: u64,
    },
    Parts {
        parts: Vec<TaggedPart>,
        done: bool,
    },
    Stopped,
    /// The run is not known (finished and read, or stopped for idleness).
    Gone,
    Refused {
        code: ToolErrorCode,
        message: String,
    },
}

/// The endpoint's one message: a JSON request whose reply is JSON too. Raw
/// bytes both ways, so ractor_cluster carries it as is.
pub(crate) enum EndpointMsg {
    Request {
        body: Vec<u8>,
        reply: RpcReplyPort<Vec<u8>>,
    },
}

impl ractor::Message for EndpointMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        let Self::Request { body, reply } = self;
        Ok(SerializedMessage::Call {
            variant: "request".to_string(),
            args: body,
            reply,
            metadata: None,
        })
    }

    fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match message {
            SerializedMessage::Call { args, reply, .. } => Ok(Self::Request { body: args, reply }),
            _ => Err(BoxedDowncastErr),
        }
    }
}

/// A run started for another node, until its last part is read.
struct RemoteRun {
    stream: tokio::sync::Mutex<RunStream>,
    stop: CancellationToken,
    last_poll: Mutex<Instant>,
}

type Runs = Arc<Mutex<HashMap<u64, Arc<RemoteRun>>>>;

struct Endpoint;

struct EndpointState {
    agents: HashMap<String, AgentHandle>,
    runs: Runs,
    next_id: Arc<AtomicU64>,
    reaper: tokio::task::JoinHandle<()>,
}

fn lock(runs: &Runs) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<RemoteRun>>> {
    runs.lock().unwrap_or_else(|e| e.into_inner())
}

impl Actor for Endpoint {
    type Msg = EndpointMsg;
    type State = EndpointState;
    type Arguments = HashMap<String, AgentHandle>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        agents: HashMap<String, AgentHandle>,
    ) -> Result<Self::State, ActorProcessingErr> {
        let runs: Runs = Arc::default();
        let reaper = tokio::spawn({
            let runs = runs.clone();
            async move {
                let mut tick = tokio::time::interval(REMOTE_RUN_IDLE / 4);
                loop {
                    tick.tick().await;
                    lock(&runs).retain(|_, run| {
                        let idle = run
                            .last_poll
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .elapsed();
                        let keep = idle < REMOTE_RUN_IDLE;
                        if !keep {
                            tracing::warn!(
                                "stopping a remote run nobody read for {} s",
                                idle.as_secs()
                            );
                            run.stop.cancel();
                        }
                        keep
                    });
                }
            }
        });
        Ok(EndpointState {
            agents,
            runs,
            next_id: Arc::new(AtomicU64::new(1)),
            reaper,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.reaper.abort();
        for run in lock(&state.runs).values() {
            run.stop.cancel();
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let EndpointMsg::Request { body, reply } = message;
        let request = match serde_json::from_slice::<Request>(&body) {
            Ok(request) => request,
            Err(error) => {
                answer(
                    reply,
                    &Reply::Refused {
                        code: ToolErrorCode::Unavailable,
                        message: format!("the node did not understand the request: {error}"),
                    },
                );
                return Ok(());
            }
        };
        // Each request is served on a task: starting a run waits on the
        // agent actor, and `next` waits for parts.
        match request {
            Request::Start { agent, task, depth } => {
                let Some(handle) = state.agents.get(&agent).cloned() else {
                    answer(
                        reply,
                        &Reply::Refused {
                            code: ToolErrorCode::UnknownTool,
                            message: format!("this node does not offer an agent named `{agent}`"),
                        },
                    );
                    return Ok(());
                };
                let runs = state.runs.clone();
                let id = state.next_id.fetch_add(1, Ordering::Relaxed);
                let span =
                    tracing::info_span!("remote_delegation", wma.agent = %agent, wma.depth = depth);
                tokio::spawn(
                    async move {
                        let started = handle
                            .start(
                                vec![ChatMessage::user(task)],
                                CancellationToken::new(),
                                depth,
                            )
                            .await;
                        let message = match started {
                            Ok(stream) => {
                                lock(&runs).insert(
                                    id,
                                    Arc::new(RemoteRun {
                                        stop: stream.stopper(),
                                        stream: tokio::sync::Mutex::new(stream),
                                        last_poll: Mutex::new(Instant::now()),
                                    }),
                                );
                                Reply::Started { run: id }
                            }
                            Err(error) => {
                                let error = refused(&agent, &error);
                                Reply::Refused {
                                    code: error.code,
                                    message: error.message,
                                }
                            }
                        };
                        answer(reply, &message);
                    }
                    .instrument(span),
                );
            }
            Request::Next { run, wait_ms } => {
                let Some(remote) = lock(&state.runs).get(&run).cloned() else {
                    answer(reply, &Reply::Gone);
                    return Ok(());
                };
                let runs = state.runs.clone();
                tokio::spawn(async move {
                    *remote.last_poll.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                    let mut stream = remote.stream.lock().await;
                    let wait = Duration::from_millis(wait_ms).min(NEXT_WAIT * 10);
                    let mut parts = Vec::new();
                    let mut done = false;
                    match tokio::time::timeout(wait, stream.next_tagged()).await {
                        Ok(Some(part)) => parts.push(part),
                        Ok(None) => done = true,
                        Err(_) => {}
                    }
                    while !done && parts.len() < NEXT_BATCH {
                        match stream.try_next_tagged() {
                            Some(part) => parts.push(part),
                            None => break,
                        }
                    }
                    done |= parts.iter().any(TaggedPart::ends_the_run);
                    if done {
                        lock(&runs).remove(&run);
                    }
                    answer(reply, &Reply::Parts { parts, done });
                });
            }
            Request::Stop { run } => match lock(&state.runs).get(&run) {
                Some(remote) => {
                    remote.stop.cancel();
                    answer(reply, &Reply::Stopped);
                }
                None => answer(reply, &Reply::Gone),
            },
        }
        Ok(())
    }
}

fn answer(reply: RpcReplyPort<Vec<u8>>, message: &Reply) {
    // Serializing these plain types cannot fail.
    let body = serde_json::to_vec(message).unwrap_or_default();
    let _ = reply.send(body);
}

/// One request to an endpoint, within `timeout`.
async fn call(
    endpoint: &ActorRef<EndpointMsg>,
    request: &Request,
    timeout: Duration,
) -> Result<Reply, String> {
    let body = serde_json::to_vec(request).map_err(|e| e.to_string())?;
    match endpoint
        .call(|reply| EndpointMsg::Request { body, reply }, Some(timeout))
        .await
    {
        Ok(CallResult::Success(bytes)) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("an answer that does not parse: {e}")),
        Ok(CallResult::Timeout) => Err(format!("no answer within {:.1} s", timeout.as_secs_f64())),
        Ok(CallResult::SenderError) => Err("the node dropped the request".to_string()),
        Err(error) => Err(format!("the node cannot be reached: {error}")),
    }
}

/// Runs a sub-agent on another node: start, poll its parts into the
/// parent's stream, stop it when the parent's call is cancelled.
pub(crate) async fn run_remote(
    endpoint: ActorRef<EndpointMsg>,
    job: Job,
    timeouts: Timeouts,
) -> Result<String, ToolError> {
    let lost = |why: String| {
        ToolError::new(
            ToolErrorCode::Unavailable,
            format!("lost the node that runs the agent `{}`: {why}", job.to),
        )
    };
    let start = Request::Start {
        agent: job.to.clone(),
        task: job.task.clone(),
        depth: job.depth,
    };
    let run = match call(&endpoint, &start, timeouts.control)
        .await
        .map_err(lost)?
    {
        Reply::Started { run } => run,
        Reply::Refused { code, message } => return Err(ToolError::new(code, message)),
        other => return Err(lost(format!("an unexpected answer {other:?}"))),
    };
    // Stop is a request of its own, so the poll in flight is not dropped
    // (its parts would be lost with it).
    let stopper = tokio::spawn({
        let endpoint = endpoint.clone();
        let cancel = job.cancel.clone();
        let timeout = timeouts.control;
        async move {
            cancel.cancelled().await;
            let _ = call(&endpoint, &Request::Stop { run }, timeout).await;
        }
    });
    let mut answer = FinalAnswer::new(&job.to);
    let poll = Request::Next {
        run,
        wait_ms: NEXT_WAIT.as_millis() as u64,
    };
    let result = loop {
        match call(&endpoint, &poll, NEXT_WAIT + timeouts.control).await {
            Ok(Reply::Parts { parts, done }) => {
                for part in parts {
                    answer.observe(&part);
                    if job.sink.send(Relay::Part(part.nested())).await.is_err() {
                        // The parent's host went away: stop the remote run,
                        // and read on to its end.
                        job.cancel.cancel();
                    }
                }
                if done {
                    break answer.finish();
                }
            }
            Ok(Reply::Gone) => break answer.finish(),
            Ok(other) => break Err(lost(format!("an unexpected answer {other:?}"))),
            Err(why) => break Err(lost(why)),
        }
    };
    stopper.abort();
    result
}
