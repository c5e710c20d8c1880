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
//! The protocol is JSON in ractor calls: `start` a run (task, depth and the
//! W3C trace context), `next` (a long poll that returns the parts ready, at
//! most [`NEXT_BATCH`] at a time, waiting up to [`NEXT_WAIT`] for the
//! first), `stop`. Polling keeps the reader in charge of the pace, as the
//! local part channel's backpressure does.
//!
//! # Guards
//!
//! A peer is not trusted before it proved the cookie, and not much after:
//!
//! - ractor_cluster has no handshake timeout and one frame limit for the
//!   whole session, so this node accepts and dials the TCP connections
//!   itself and hands them to the node server as external streams that
//!   watch the handshake: a connection that has not authenticated within
//!   [`ClusterGuards::handshake_timeout`] is closed, and so is one that
//!   announces a frame over [`ClusterGuards::pre_auth_max_frame`] before
//!   it authenticated. At most [`ClusterGuards::max_pending`] connections
//!   may be in their handshake at once. After the handshake, frames are
//!   limited to [`ClusterGuards::max_frame`] (ractor_cluster's own limit).
//!   ractor_cluster also opens a listener of its own, which nothing can
//!   turn off; it binds a free loopback port, and every session it accepts
//!   is ended as it opens, so only the guarded listener serves.
//! - A cookie must be strong: [`cookie_problems`] lists what is wrong with
//!   one, and [`ClusterNode::start`] refuses a cookie with problems.
//! - Two nodes with the same name cannot be told apart by ractor_cluster,
//!   which drops their connection as a connection to itself;
//!   [`ClusterNode::connect`] says so instead.
//! - A peer's parts are re-tagged: its run's own parts carry the sub-agent's
//!   name, and depths are capped, so a peer cannot pass parts off as the
//!   parent's own.
//! - A peer's `start` names the depth its run is at, and this node does not
//!   take it at its word either: a depth beyond this node's
//!   [`max_delegation_depth`](crate::RuntimeBuilder::max_delegation_depth)
//!   is refused with an error the peer's parent sees, and a depth of 0 (a
//!   host's own run, with the whole delegation budget) is taken as 1, the
//!   least a delegated run is at.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{
    BoxRead, BoxWrite, ClusterBidiStream, NodeEventSubscription, NodeServer, NodeServerMessage,
};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use wma_agent::{ChatMessage, FixedApprover, ToolErrorCode};

use crate::agent::{AgentHandle, RunStream};
use crate::delegation::{RunApprovals, refused};
use crate::error::RuntimeError;
use crate::part::TaggedPart;
use crate::remote::{
    CLUSTER_SCOPE, EndpointMsg, NEXT_BATCH, NEXT_WAIT, Reply, Request, find_agent, group_of,
    parse_traceparent,
};
use crate::supervisor::Runtime;

/// Where a node listens unless told otherwise: loopback, on a free port.
pub const DEFAULT_CLUSTER_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// The node name a node has unless told otherwise. Two nodes that both keep
/// it on one host cannot connect (see [`ClusterNode::connect`]).
pub const DEFAULT_NODE_NAME: &str = "wma";

/// A remote run that nobody polled for this long is stopped: its parent's
/// node went away without saying so.
pub const REMOTE_RUN_IDLE: Duration = Duration::from_secs(120);

/// How long a connection may take to prove the cookie. A handshake is three
/// round trips of a few hundred bytes: well under a second even between
/// continents; the rest is room for a loaded host.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest frame a peer may announce before it authenticated. The
/// handshake's frames carry a node name, a challenge and a digest: a few
/// hundred bytes. The limit leaves room for long node names and for the
/// first process-group frames that may arrive just as the handshake ends,
/// and it keeps an unauthenticated peer from making this node allocate
/// ractor_cluster's 16 MiB.
pub const DEFAULT_PRE_AUTH_MAX_FRAME: u64 = 64 * 1024;

/// The largest frame an authenticated peer may send: ractor_cluster's
/// default. A `next` answer carries up to [`NEXT_BATCH`] parts, tool results
/// among them, so the limit is generous.
pub const DEFAULT_MAX_FRAME: u64 = ractor_cluster::DEFAULT_MAX_INBOUND_FRAME_SIZE;

/// How many connections may be in their handshake at once; more are closed
/// as they arrive. Each holds a socket and a session actor until it
/// authenticates or times out.
pub const DEFAULT_MAX_PENDING_HANDSHAKES: usize = 64;

/// The first pause before a lost or unreachable peer is dialled again; it
/// doubles up to [`RECONNECT_MAX`].
pub const RECONNECT_FIRST: Duration = Duration::from_millis(250);

/// The longest pause between two attempts to reach a peer.
pub const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// The fewest characters a cookie may have: 32 hex digits are 128 bits.
pub const MIN_COOKIE_CHARS: usize = 32;

/// The fewest bits of entropy a cookie's characters may carry, estimated
/// from its length and the classes of characters it uses.
pub const MIN_COOKIE_BITS: f64 = 128.0;

/// Fewer distinct characters than this is a pattern, not a random string
/// (a random 32-digit hex string has about 14).
const MIN_DISTINCT_CHARS: usize = 8;

/// Cookies that appear in examples and documentation, and words people try
/// first: each is refused whatever its length.
const KNOWN_COOKIES: &[&str] = &[
    "change-me",
    "changeme",
    "change_me",
    "secret",
    "cookie",
    "password",
    "wma",
    "webmcp-agents",
    "default",
    "example",
    "test",
];

/// What is wrong with `cookie` as a cluster's shared secret; empty when
/// nothing is. The rules: at least [`MIN_COOKIE_CHARS`] characters, an
/// estimated [`MIN_COOKIE_BITS`] bits of entropy (length times the bits of
/// the character classes it uses: lower case, upper case, digits, others),
/// at least 8 distinct characters, and none of the placeholders
/// that examples use (`change-me`, `secret`, ...). A good cookie:
/// `openssl rand -hex 32`.
///
/// ```
/// use wma_runtime::cookie_problems;
/// assert!(!cookie_problems("change-me").is_empty());
/// assert!(cookie_problems("3f9c1e0b7a6d4c2f8e5b9a1d0c7e6f3a2b4d8c9e1f0a7b6c").is_empty());
/// ```
pub fn cookie_problems(cookie: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if cookie.is_empty() {
        problems.push("the cookie is empty".to_string());
        return problems;
    }
    let chars: Vec<char> = cookie.chars().collect();
    let squeeze = |s: &str| s.to_lowercase().replace(['-', '_', ' '], "");
    let normalized = squeeze(cookie.trim());
    if normalized.contains("changeme") || KNOWN_COOKIES.iter().any(|k| squeeze(k) == normalized) {
        problems.push(format!(
            "`{}` is a placeholder from examples, which anyone can guess",
            cookie.trim()
        ));
    }
    if chars.len() < MIN_COOKIE_CHARS {
        problems.push(format!(
            "it has {} characters; it needs at least {MIN_COOKIE_CHARS}",
            chars.len()
        ));
    }
    let mut distinct = chars.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < MIN_DISTINCT_CHARS {
        problems.push(format!(
            "it uses {} distinct characters; a random one uses many more",
            distinct.len()
        ));
    }
    let alphabet: u32 = [
        (chars.iter().any(char::is_ascii_lowercase), 26),
        (chars.iter().any(char::is_ascii_uppercase), 26),
        (chars.iter().any(char::is_ascii_digit), 10),
        (chars.iter().any(|c| !c.is_ascii_alphanumeric()), 33),
    ]
    .iter()
    .filter(|(used, _)| *used)
    .map(|(_, size)| size)
    .sum();
    let bits = chars.len() as f64 * f64::from(alphabet).log2();
    if chars.len() >= MIN_COOKIE_CHARS && bits < MIN_COOKIE_BITS {
        problems.push(format!(
            "its characters carry at most {bits:.0} bits; it needs {MIN_COOKIE_BITS:.0} \
             (use more characters, or more kinds of them)"
        ));
    }
    problems
}

/// A warning when a node listening at `addr` can be reached from beyond
/// this machine: the transport is not encrypted, and anyone who can reach
/// the port can try cookies. `None` on loopback.
pub fn listen_warning(addr: SocketAddr) -> Option<String> {
    (!addr.ip().is_loopback()).then(|| {
        format!(
            "the cluster node listens on {addr}, beyond loopback: its traffic is not encrypted \
             and anyone who reaches the port can try cookies; keep it on a private network or a tunnel"
        )
    })
}

/// How this node joins the cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// This node's name, as peers see it. Default [`DEFAULT_NODE_NAME`].
    /// Every node of a cluster needs its own.
    pub node_name: String,
    /// The shared secret every node of the cluster is started with. A peer
    /// with another cookie fails the handshake and is disconnected. Required,
    /// and it must be strong (see [`cookie_problems`]).
    pub cookie: String,
    /// Where to listen. Default [`DEFAULT_CLUSTER_LISTEN`] (loopback, a free
    /// port); the transport is not encrypted, so keep it on loopback or a
    /// private network (a node warns when it listens beyond loopback).
    pub listen: SocketAddr,
    /// The local agents other nodes may delegate to. Default none.
    pub export: Vec<String>,
}

impl ClusterOptions {
    /// Options with this cookie and the defaults.
    pub fn new(cookie: impl Into<String>) -> Self {
        Self {
            node_name: DEFAULT_NODE_NAME.to_string(),
            cookie: cookie.into(),
            listen: DEFAULT_CLUSTER_LISTEN,
            export: Vec::new(),
        }
    }
}

/// The limits a node puts on its peers' connections (see the module's
/// docs); [`ClusterGuards::default`] is what [`ClusterNode::start`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterGuards {
    /// A connection that has not authenticated within this time is closed.
    /// Default [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub handshake_timeout: Duration,
    /// The largest frame a connection may announce before it authenticated.
    /// Default [`DEFAULT_PRE_AUTH_MAX_FRAME`].
    pub pre_auth_max_frame: u64,
    /// The largest frame an authenticated peer may send. Default
    /// [`DEFAULT_MAX_FRAME`].
    pub max_frame: u64,
    /// How many connections may be in their handshake at once. Default
    /// [`DEFAULT_MAX_PENDING_HANDSHAKES`].
    pub max_pending: usize,
}

impl Default for ClusterGuards {
    fn default() -> Self {
        Self {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            pre_auth_max_frame: DEFAULT_PRE_AUTH_MAX_FRAME,
            max_frame: DEFAULT_MAX_FRAME,
            max_pending: DEFAULT_MAX_PENDING_HANDSHAKES,
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

/// What happened to one connection, by its label.
#[derive(Debug, Clone)]
enum SessionEvent {
    Authenticated { label: String, peer: String },
    Disconnected { label: String, peer: Option<String> },
}

/// What the node server's event callbacks and this node's tasks share.
struct Shared {
    /// This node's name as ractor_cluster announces it (`name@host`).
    name: String,
    counts: watch::Sender<SessionCounts>,
    events: broadcast::Sender<SessionEvent>,
    /// The connections still in their handshake: set to true when one
    /// authenticates, which lifts its guard.
    pending: Mutex<HashMap<String, Arc<AtomicBool>>>,
    /// The authenticated sessions: label to the peer's name.
    peers: watch::Sender<HashMap<String, String>>,
    /// Numbers connection labels, so that each is unique.
    next_label: AtomicU64,
    guards: ClusterGuards,
}

impl Shared {
    /// Wraps a fresh connection in its handshake guard, or refuses it when
    /// too many are in their handshake already.
    fn guard(self: &Arc<Self>, stream: TcpStream, remote: SocketAddr) -> Option<Guarded> {
        let n = self.next_label.fetch_add(1, Ordering::Relaxed);
        let label = format!("{remote}#{n}");
        let authenticated = Arc::new(AtomicBool::new(false));
        {
            let mut pending = self.pending.lock();
            if pending.len() >= self.guards.max_pending {
                tracing::warn!(
                    peer = %remote,
                    "closing a cluster connection: {} others are still in their handshake",
                    pending.len()
                );
                return None;
            }
            pending.insert(label.clone(), authenticated.clone());
        }
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        Some(Guarded {
            read: GuardedRead {
                inner: read,
                authenticated,
                deadline: Some(Box::pin(tokio::time::sleep(self.guards.handshake_timeout))),
                max_frame: self.guards.pre_auth_max_frame,
                header: [0; 8],
                header_len: 0,
                payload_left: 0,
                label: label.clone(),
                shared: Arc::downgrade(self),
            },
            write: Box::new(write),
            label,
        })
    }
}

struct Sessions(Arc<Shared>);

/// Whether a session came through this node's own guarded listener or
/// dial. ractor_cluster names a session by its stream's peer: a guarded
/// stream's label (`ADDR#N`, see [`Shared::guard`]), or, for a connection
/// its own listener accepted, the bare socket address.
fn is_guarded(ses: &NodeServerSessionInformation) -> bool {
    ses.peer_addr.parse::<SocketAddr>().is_err()
}

impl NodeEventSubscription for Sessions {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        if !is_guarded(&ses) {
            // ractor_cluster's own listener (it always opens one, on a
            // loopback port nobody is told of) has none of the guards:
            // no handshake timeout, no frame cap before the handshake, no
            // cap on connections. Its sessions are ended as they open,
            // before their first frame is read, so that it serves nothing.
            tracing::warn!(
                peer = %ses.peer_addr,
                "closing a cluster connection that did not come through the node's listener"
            );
            ses.actor.kill();
            return;
        }
        self.0.counts.send_modify(|c| c.opened += 1);
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        if !is_guarded(&ses) {
            return;
        }
        let shared = &self.0;
        shared.counts.send_modify(|c| c.disconnected += 1);
        shared.pending.lock().remove(&ses.peer_addr);
        shared
            .peers
            .send_if_modified(|peers| peers.remove(&ses.peer_addr).is_some());
        let peer = ses.peer_name.map(|n| n.name);
        if peer.as_deref() == Some(shared.name.as_str()) {
            // ractor_cluster takes a peer with this node's name for this
            // node itself and drops it with a warning nobody connects to
            // two nodes that were left on the same name.
            tracing::error!(
                node = %shared.name,
                connection = %ses.peer_addr,
                "a cluster peer has this node's name, so neither can connect to the other; \
                 give every node of the cluster its own `node_name`"
            );
        }
        let _ = shared.events.send(SessionEvent::Disconnected {
            label: ses.peer_addr,
            peer,
        });
    }

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        let shared = &self.0;
        shared.counts.send_modify(|c| c.authenticated += 1);
        if let Some(flag) = shared.pending.lock().remove(&ses.peer_addr) {
            flag.store(true, Ordering::Release);
        }
        let peer = ses.peer_name.map(|n| n.name).unwrap_or_default();
        shared.peers.send_modify(|peers| {
            peers.insert(ses.peer_addr.clone(), peer.clone());
        });
        let _ = shared.events.send(SessionEvent::Authenticated {
            label: ses.peer_addr,
            peer,
        });
    }
}

/// A TCP connection as the node server gets it: the read half guarded until
/// the session authenticates.
struct Guarded {
    read: GuardedRead,
    write: BoxWrite,
    label: String,
}

impl ClusterBidiStream for Guarded {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        (Box::new(self.read), self.write)
    }

    fn peer_label(&self) -> Option<String> {
        // ractor_cluster reports it as the session's peer address: that is
        // how the session's events find this connection's guard.
        Some(self.label.clone())
    }
}

/// The read half of a connection in its handshake. It follows
/// ractor_cluster's framing (a big-endian u64 length, then the payload)
/// and fails the read, which ends the session, when a frame is announced
/// over the limit or the deadline passes; once the session authenticated
/// it only passes bytes on.
struct GuardedRead {
    inner: OwnedReadHalf,
    authenticated: Arc<AtomicBool>,
    /// While the handshake goes on; `None` once it is over.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    max_frame: u64,
    header: [u8; 8],
    header_len: usize,
    payload_left: u64,
    label: String,
    shared: std::sync::Weak<Shared>,
}

impl GuardedRead {
    /// Follows the frames in `bytes`, failing at a length over the limit.
    fn scan(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let take = usize::try_from(self.payload_left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                self.payload_left -= take as u64;
                bytes = &bytes[take..];
                continue;
            }
            let take = (8 - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + take].copy_from_slice(&bytes[..take]);
            self.header_len += take;
            bytes = &bytes[take..];
            if self.header_len == 8 {
                self.header_len = 0;
                let length = u64::from_be_bytes(self.header);
                if length > self.max_frame {
                    tracing::warn!(
                        connection = %self.label,
                        "closing a cluster connection that announced a {length}-byte frame \
                         before it authenticated (the limit is {})",
                        self.max_frame
                    );
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "a frame of {length} bytes before authentication (the limit is {})",
                            self.max_frame
                        ),
                    ));
                }
                self.payload_left = length;
            }
        }
        Ok(())
    }
}

impl AsyncRead for GuardedRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.deadline.is_some() && this.authenticated.load(Ordering::Acquire) {
            this.deadline = None;
        }
        if let Some(deadline) = this.deadline.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            tracing::warn!(
                connection = %this.label,
                "closing a cluster connection that did not authenticate in time"
            );
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the peer did not authenticate in time",
            )));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        if this.deadline.is_some() {
            let fresh = buf.filled()[before..].to_vec();
            this.scan(&fresh)?;
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for GuardedRead {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.pending.lock().remove(&self.label);
        }
    }
}

/// This process as a node of a ractor cluster: it hosts exported agents for
/// other nodes and reaches the agents they export. Cheap to clone.
#[derive(Clone)]
pub struct ClusterNode {
    server: ActorRef<NodeServerMessage>,
    endpoint: Option<ActorRef<EndpointMsg>>,
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// The listener's task and the tasks that keep peers connected; aborted
    /// and awaited at shutdown, so the listening socket is closed (and its
    /// port free to bind again) once `shutdown` returns.
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl ClusterNode {
    /// Starts the node with [`ClusterGuards::default`] and exports
    /// `options.export` of `runtime`'s agents.
    ///
    /// Refuses a cookie that [`cookie_problems`] finds fault with, and warns
    /// (see [`listen_warning`]) when the node listens beyond loopback.
    pub async fn start(options: ClusterOptions, runtime: &Runtime) -> Result<Self, RuntimeError> {
        Self::start_with(options, ClusterGuards::default(), runtime).await
    }

    /// Like [`ClusterNode::start`], with these guards on peers' connections.
    pub async fn start_with(
        options: ClusterOptions,
        guards: ClusterGuards,
        runtime: &Runtime,
    ) -> Result<Self, RuntimeError> {
        let spawn_error = |actor: &str, e: &dyn std::fmt::Display| RuntimeError::Spawn {
            actor: actor.to_string(),
            reason: e.to_string(),
        };
        let problems = cookie_problems(&options.cookie);
        if !problems.is_empty() {
            return Err(RuntimeError::Config(format!(
                "the cluster's cookie is too weak: {}; make one with `openssl rand -hex 32`",
                problems.join("; ")
            )));
        }
        if options.node_name.trim().is_empty() {
            return Err(RuntimeError::Config(
                "a cluster node needs a name".to_string(),
            ));
        }
        let mut exported = HashMap::new();
        for name in &options.export {
            exported.insert(name.clone(), runtime.agent(name)?);
        }
        let listener = TcpListener::bind(options.listen)
            .await
            .map_err(|e| spawn_error(&format!("cluster listener on {}", options.listen), &e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| spawn_error("cluster listener", &e))?;
        if let Some(warning) = listen_warning(addr) {
            tracing::warn!("{warning}");
        }
        let hostname = addr.ip().to_string();
        // ractor_cluster always opens a listener of its own. It gets a free
        // port on loopback and is not announced: peers reach this node
        // through the guarded listener above, and a connection to it is
        // closed as it opens (see `Sessions::node_session_opened`).
        let server = NodeServer::new(
            0,
            options.cookie.clone(),
            options.node_name.clone(),
            hostname.clone(),
            None,
            None,
        )
        .with_listen_addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .with_max_inbound_frame_size(guards.max_frame);
        let (server, _) = Actor::spawn(None, server, ())
            .await
            .map_err(|e| spawn_error("cluster node server", &e))?;
        let (counts, _) = watch::channel(SessionCounts::default());
        let (peers, _) = watch::channel(HashMap::new());
        let shared = Arc::new(Shared {
            name: format!("{}@{hostname}", options.node_name),
            counts,
            events: broadcast::channel(256).0,
            pending: Mutex::default(),
            peers,
            next_label: AtomicU64::new(1),
            guards,
        });
        server
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "wma-sessions".to_string(),
                subscription: Box::new(Sessions(shared.clone())),
            })
            .map_err(|e| spawn_error("cluster node server", &e))?;
        let accept = tokio::spawn({
            let shared = shared.clone();
            let server = server.clone();
            async move {
                loop {
                    match listener.accept().await {
                        Ok((stream, remote)) => {
                            let Some(stream) = shared.guard(stream, remote) else {
                                continue;
                            };
                            let opened = server.cast(NodeServerMessage::ConnectionOpenedExternal {
                                stream: Box::new(stream),
                                is_server: true,
                            });
                            if opened.is_err() {
                                break;
                            }
                        }
                        Err(error) => {
                            // Out of file descriptors, most likely: pause
                            // rather than spin until some are closed.
                            tracing::warn!(%error, "the cluster listener could not accept");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
        });
        let endpoint = if exported.is_empty() {
            None
        } else {
            let names: Vec<String> = exported.keys().cloned().collect();
            let args = EndpointArgs {
                agents: exported,
                max_depth: runtime.max_delegation_depth(),
            };
            let (endpoint, _) = Actor::spawn(None, Endpoint, args)
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
            shared,
            tasks: Arc::new(Mutex::new(vec![accept])),
        })
    }

    /// Where this node listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This node's name as its peers see it (`node_name@host`).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Connects to another node (`host:port`) and waits for the handshake's
    /// outcome: `Ok` once the peer proved the cookie (or this node was
    /// connected to it already). Fails when the peer cannot be reached, has
    /// another cookie, has this node's name (ractor_cluster cannot tell two
    /// nodes of one name apart, so each node needs its own), or does not
    /// finish the handshake within the guards' handshake timeout.
    pub async fn connect(&self, peer: &str) -> Result<(), RuntimeError> {
        self.dial(peer).await.map(|_| ())
    }

    /// Connects to `peer` and keeps it connected: a peer that cannot be
    /// reached or goes away is dialled again, after a pause that starts at
    /// [`RECONNECT_FIRST`] and doubles up to [`RECONNECT_MAX`] (back to the
    /// first after each success). Returns at once; the node's
    /// [`ClusterNode::shutdown`] ends the attempts.
    pub fn keep_connected(&self, peer: impl Into<String>) {
        let node = self.clone();
        let peer = peer.into();
        let task = tokio::spawn(async move {
            let mut pause = RECONNECT_FIRST;
            loop {
                match node.dial(&peer).await {
                    Ok(name) => {
                        tracing::info!(%peer, node = %name, "connected to a cluster peer");
                        pause = RECONNECT_FIRST;
                        let mut peers = node.shared.peers.subscribe();
                        let _ = peers.wait_for(|p| !p.values().any(|n| *n == name)).await;
                        tracing::warn!(%peer, node = %name, "lost a cluster peer; dialling it again");
                    }
                    Err(error @ RuntimeError::Config(_)) => {
                        tracing::error!(%peer, %error, "cannot join a cluster peer");
                    }
                    Err(error) => {
                        tracing::info!(%peer, %error, "cluster peer not reachable yet");
                    }
                }
                // The pause between attempts, not a wait for a condition.
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RECONNECT_MAX);
            }
        });
        self.tasks.lock().push(task);
    }

    /// Dials `peer`; on success, the name of the node there.
    async fn dial(&self, peer: &str) -> Result<String, RuntimeError> {
        let unreachable = |reason: String| RuntimeError::Unavailable {
            actor: format!("cluster node at {peer}"),
            reason,
        };
        let timeout = self.shared.guards.handshake_timeout;
        // Subscribed before the connection opens, so its events are seen.
        let mut events = self.shared.events.subscribe();
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(peer)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return Err(unreachable(error.to_string())),
            Err(_) => {
                return Err(unreachable(
                    "the connection was not accepted in time".into(),
                ));
            }
        };
        let remote = stream.peer_addr().map_err(|e| unreachable(e.to_string()))?;
        let Some(stream) = self.shared.guard(stream, remote) else {
            return Err(unreachable(
                "too many connections of this node are in their handshake".to_string(),
            ));
        };
        let label = stream.label.clone();
        self.server
            .cast(NodeServerMessage::ConnectionOpenedExternal {
                stream: Box::new(stream),
                is_server: false,
            })
            .map_err(|e| unreachable(format!("this node's server is gone: {e}")))?;
        // The guard closes a stalled handshake at its deadline; this is
        // only a backstop.
        let outcome = tokio::time::timeout(timeout + Duration::from_secs(1), async {
            loop {
                match events.recv().await {
                    Ok(SessionEvent::Authenticated { label: l, peer }) if l == label => {
                        return Ok(peer);
                    }
                    Ok(SessionEvent::Disconnected { label: l, peer }) if l == label => {
                        return Err(peer);
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return Err(None),
                }
            }
        })
        .await;
        match outcome {
            Ok(Ok(name)) => Ok(name),
            Ok(Err(Some(name))) if name == self.shared.name => {
                Err(RuntimeError::Config(if remote == self.addr {
                    format!("{peer} is this node's own address")
                } else {
                    format!(
                        "the node at {peer} has this node's name (`{name}`): ractor_cluster takes \
                         it for this node itself and drops the connection; give every node of the \
                         cluster its own `node_name`"
                    )
                }))
            }
            Ok(Err(Some(name))) if self.shared.peers.borrow().values().any(|n| *n == name) => {
                // Both nodes dialled each other at once; ractor_cluster kept
                // the other connection.
                Ok(name)
            }
            Ok(Err(_)) => Err(unreachable(
                "the handshake failed: the node has another cookie, or it closed the connection \
                 (see its log)"
                    .to_string(),
            )),
            Err(_) => Err(RuntimeError::Timeout {
                actor: format!("cluster node at {peer} (its handshake)"),
                after: timeout,
            }),
        }
    }

    /// The names of the nodes this node is connected to now (each
    /// `node_name@host`), sorted.
    pub fn peers(&self) -> Vec<String> {
        let mut peers: Vec<String> = self.shared.peers.borrow().values().cloned().collect();
        peers.sort();
        peers.dedup();
        peers
    }

    /// Sessions opened, authenticated and closed so far.
    pub fn sessions(&self) -> SessionCounts {
        *self.shared.counts.borrow()
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

    /// Stops dialling peers, the listener, the endpoint and the node server
    /// (connections close).
    pub async fn shutdown(&self) {
        let tasks: Vec<JoinHandle<()>> = self.tasks.lock().drain(..).collect();
        for task in &tasks {
            task.abort();
        }
        // An aborted task drops its future (and the listener in it) only
        // when the runtime next polls it; waiting for that is what frees the
        // port for a node started right after this one.
        for task in tasks {
            let _ = task.await;
        }
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
            .field("name", &self.shared.name)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
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

/// What an endpoint serves: the exported agents, and this node's delegation
/// limit, which bounds the depth a peer's run may claim.
struct EndpointArgs {
    agents: HashMap<String, AgentHandle>,
    max_depth: u32,
}

struct EndpointState {
    agents: HashMap<String, AgentHandle>,
    /// This node's [`max_delegation_depth`](crate::RuntimeBuilder::max_delegation_depth).
    max_depth: u32,
    runs: Runs,
    ids: RunIds,
    reaper: tokio::task::JoinHandle<()>,
}

/// Numbers remote runs so that one peer cannot guess another's: every peer
/// with the cookie may call the endpoint, and `next` and `stop` name a run
/// by its id alone. A counter keeps ids distinct; a per-endpoint random
/// key scrambles them.
struct RunIds {
    count: AtomicU64,
    key: std::collections::hash_map::RandomState,
}

impl RunIds {
    fn new() -> Self {
        Self {
            count: AtomicU64::new(1),
            key: std::collections::hash_map::RandomState::new(),
        }
    }

    fn next(&self) -> u64 {
        use std::hash::BuildHasher;
        let n = self.count.fetch_add(1, Ordering::Relaxed);
        // SipHash under a random key: distinct inputs collide only by
        // chance (one in 2^64), and consecutive ids say nothing of each other.
        self.key.hash_one(n)
    }
}

impl Actor for Endpoint {
    type Msg = EndpointMsg;
    type State = EndpointState;
    type Arguments = EndpointArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        EndpointArgs { agents, max_depth }: EndpointArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let runs: Runs = Arc::default();
        let reaper = tokio::spawn({
            let runs = runs.clone();
            async move {
                let mut tick = tokio::time::interval(REMOTE_RUN_IDLE / 4);
                loop {
                    tick.tick().await;
                    runs.lock().retain(|_, run| {
                        let idle = run.last_poll.lock().elapsed();
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
            max_depth,
            runs,
            ids: RunIds::new(),
            reaper,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.reaper.abort();
        for run in state.runs.lock().values() {
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
            Request::Start {
                agent,
                task,
                depth,
                traceparent,
            } => {
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
                let depth = match admitted_depth(depth, state.max_depth) {
                    Ok(depth) => depth,
                    Err(message) => {
                        tracing::warn!(
                            agent = %agent,
                            depth,
                            max_depth = state.max_depth,
                            "refused a peer's run: it claims a depth beyond this node's delegation limit"
                        );
                        answer(
                            reply,
                            &Reply::Refused {
                                code: ToolErrorCode::Denied,
                                message,
                            },
                        );
                        return Ok(());
                    }
                };
                let runs = state.runs.clone();
                let id = state.ids.next();
                let span =
                    tracing::info_span!("remote_delegation", wma.agent = %agent, wma.depth = depth);
                if let Some(parent) = traceparent.as_deref().and_then(parse_traceparent) {
                    // Before the span is entered, while a parent can still be set.
                    let _ = span.set_parent(parent);
                }
                tokio::spawn(
                    async move {
                        // Nobody on this node can be asked, and the
                        // asking node's person cannot be reached from
                        // here: calls that would ask are denied
                        // (fail-closed), calls the policy lets run run.
                        let approvals =
                            RunApprovals::asking(Arc::new(FixedApprover::deny_all(
                                "node",
                                "it needs a person's approval, and this agent runs on another node where nobody can be asked",
                            )));
                        let started = handle
                            .start_with(
                                vec![ChatMessage::user(task)],
                                CancellationToken::new(),
                                depth,
                                approvals,
                            )
                            .await;
                        let message = match started {
                            Ok(stream) => {
                                runs.lock().insert(
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
                let Some(remote) = state.runs.lock().get(&run).cloned() else {
                    answer(reply, &Reply::Gone);
                    return Ok(());
                };
                let runs = state.runs.clone();
                tokio::spawn(async move {
                    *remote.last_poll.lock() = Instant::now();
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
                        runs.lock().remove(&run);
                    }
                    answer(reply, &Reply::Parts { parts, done });
                });
            }
            Request::Stop { run } => match state.runs.lock().get(&run) {
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

/// The depth a peer's `start` runs at on this node, given the `depth` it
/// claims and this node's `max_depth`.
///
/// A remote run is a sub-agent's run, so it is at depth 1 at least: a claim
/// of 0 is taken as 1 (a run at 0 would count as a host's own and get the
/// whole delegation budget). A depth beyond `max_depth` is refused, as this
/// node's delegator refuses a local job that deep: this node's limit holds
/// for the runs it hosts, whatever the peer's is. No arithmetic is done on
/// the peer's number, so none can overflow.
fn admitted_depth(depth: u32, max_depth: u32) -> Result<u32, String> {
    let depth = depth.max(1);
    if depth > max_depth {
        return Err(format!(
            "this node does not run a sub-agent at depth {depth}: delegation nests at most \
             {max_depth} levels deep here"
        ));
    }
    Ok(depth)
}

fn answer(reply: RpcReplyPort<Vec<u8>>, message: &Reply) {
    // Serializing these plain types cannot fail.
    let body = serde_json::to_vec(message).unwrap_or_default();
    let _ = reply.send(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_depth_is_floored_at_one_and_refused_beyond_the_limit() {
        assert_eq!(admitted_depth(0, 2), Ok(1));
        assert_eq!(admitted_depth(1, 2), Ok(1));
        assert_eq!(admitted_depth(2, 2), Ok(2));
        for forged in [3, u32::MAX - 1, u32::MAX] {
            let refusal = admitted_depth(forged, 2).unwrap_err();
            assert!(
                refusal.contains(&format!("depth {forged}")) && refusal.contains("at most 2"),
                "{refusal}"
            );
        }
        assert_eq!(admitted_depth(u32::MAX, u32::MAX), Ok(u32::MAX));
        // Delegation off on this node: no peer's run is hosted either.
        assert!(admitted_depth(1, 0).is_err());
    }

    #[test]
    fn run_ids_cannot_be_guessed_from_one_another() {
        let ids = RunIds::new();
        let first: Vec<u64> = (0..64).map(|_| ids.next()).collect();
        let mut distinct = first.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), first.len());
        assert!(first.windows(2).all(|w| w[1] != w[0].wrapping_add(1)));
        // Another endpoint numbers its runs differently.
        assert_ne!(RunIds::new().next(), first[0]);
    }

    #[test]
    fn weak_cookies_are_named() {
        assert!(!cookie_problems("").is_empty());
        assert!(!cookie_problems("change-me").is_empty());
        assert!(!cookie_problems("short-but-random-9f2c").is_empty());
        assert!(!cookie_problems(&"ab".repeat(20)).is_empty());
        // 40 digits carry about 133 bits; 33 carry 110.
        assert!(cookie_problems(&"1234567890".repeat(4)).is_empty());
        assert!(!cookie_problems("123456789012345678901234567890123").is_empty());
        assert!(cookie_problems("3f9c1e0b7a6d4c2f8e5b9a1d0c7e6f3a").is_empty());
        assert!(!cookie_problems("CHANGE-ME-please-3f9c1e0b7a6d4c2f8e5b9a").is_empty());
    }
}
