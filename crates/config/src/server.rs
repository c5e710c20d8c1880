//! What the server lets in and how long it waits: [`ServerOptions`] and the
//! defaults it starts from, all in this one place. The config fills them
//! from `[server]`; `wma-serve` obeys them and re-exports them under its own
//! name.

use std::path::PathBuf;
use std::time::Duration;

/// Largest request body read by default (1 MiB). A conversation sent to
/// start a run fits many times over; a client cannot make the server
/// buffer more than this per request.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

/// How long a client has, by default, to send a request's head (request
/// line and headers): from the moment the connection opens for its first
/// request, from its first byte for later ones. A client that dribbles a
/// head byte by byte (slowloris) holds a connection no longer than this.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request body may take to arrive, by default, once its head
/// was read.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a kept-alive connection may sit without a request and without a
/// byte from the client, by default, before it is closed. A response that
/// is still streaming (a run's events) does not count as idle.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Connections served at once, by default. One person's browser tab or
/// script needs a handful; the cap keeps a flood from taking every file
/// descriptor of the process. A new connection beyond it takes the place
/// of the connection that has waited longest without a request in
/// progress (silent, sending its head, or kept alive between requests), of
/// the client address holding the most connections; closing that one loses
/// no request, so a flood of connections that send nothing cannot keep a
/// new client out.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;

/// Connections one client (one IP address) may have at once, by default:
/// half the connection cap, so that when one client's connections all
/// have requests in progress (slow bodies, long event streams), another
/// client still finds free slots. A new connection beyond it takes the
/// place of that client's own connection that has waited longest without
/// a request. Behind a reverse proxy every connection comes from the
/// proxy's address; raise it to `max_connections` there.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 32;

/// How long, by default, a new connection waits for a slot when no
/// connection can make room (each has a request in progress) before it is
/// answered `503` and closed: long enough for a short request to end,
/// short enough that a flood does not pile up open sockets. The wait is
/// the connection's own; the server goes on accepting others meanwhile.
pub const DEFAULT_CONNECTION_WAIT: Duration = Duration::from_millis(500);

/// Runs one client (one IP address) may have streaming at once, by default.
/// Each agent has its own limit as well (`max_concurrent_runs`); this one
/// keeps a single client from taking every agent's slots.
pub const DEFAULT_MAX_RUNS_PER_CLIENT: usize = 4;

/// How long `wma serve`, by default, lets its runs finish after SIGTERM or
/// Ctrl-C before it gives up on the rest (they are marked interrupted).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Name of the file in the cache folder that holds the generated token.
pub const TOKEN_FILE_NAME: &str = "http-token";

/// Shortest token accepted from a file, a variable or a program: 32
/// characters, as many as 128 random bits written in hex.
pub const MIN_TOKEN_CHARS: usize = 32;

/// Where the bearer token that every request (but the minimal health check)
/// must carry comes from.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum TokenSource {
    /// [`TOKEN_FILE_NAME`] in the cache folder (`$WMA_CACHE_DIR`, default
    /// `~/.cache/webmcp-agents`), generated with owner-only permissions on
    /// first start.
    #[default]
    CacheFile,
    /// This file, generated like the cache file when it does not exist.
    File(PathBuf),
    /// The environment variable with this name. The operator chooses the
    /// name; the server reads no variable of its own accord.
    Env(String),
    /// This token, chosen by the program that embeds the server.
    Given(String),
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::CacheFile => f.write_str("CacheFile"),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
            Self::Env(name) => f.debug_tuple("Env").field(name).finish(),
            // The token itself never goes into a log.
            Self::Given(_) => f.write_str("Given(..)"),
        }
    }
}

/// Everything the server decides about who gets in and for how long.
/// [`Default`] gives the values of the `DEFAULT_*` constants, the cache
/// file token, no extra host names and no allowed origins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerOptions {
    /// Where the bearer token comes from. Default [`TokenSource::CacheFile`].
    pub token: TokenSource,
    /// Origins (`scheme://host[:port]`, as browsers send them) whose pages
    /// may call the API; they get CORS headers. Every other request that
    /// carries an `Origin` is refused with 403. Default: none.
    pub allowed_origins: Vec<String>,
    /// `Host` values accepted besides the listen address and the loopback
    /// names (`localhost`, `127.0.0.1`, `[::1]`, with the port), exactly as
    /// clients send them (`agents.example.com`, `10.0.0.5:8080`): the names
    /// a reverse proxy or the network reaches the server by. Default: none.
    pub allowed_hosts: Vec<String>,
    /// See [`DEFAULT_HEADER_TIMEOUT`].
    pub header_timeout: Duration,
    /// See [`DEFAULT_BODY_TIMEOUT`].
    pub body_timeout: Duration,
    /// See [`DEFAULT_IDLE_TIMEOUT`].
    pub idle_timeout: Duration,
    /// See [`DEFAULT_MAX_BODY_BYTES`]; a larger body is answered with 413.
    pub max_body_bytes: usize,
    /// See [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// See [`DEFAULT_MAX_CONNECTIONS_PER_CLIENT`]; more than
    /// `max_connections` counts as `max_connections`.
    pub max_connections_per_client: usize,
    /// See [`DEFAULT_CONNECTION_WAIT`].
    pub connection_wait: Duration,
    /// See [`DEFAULT_MAX_RUNS_PER_CLIENT`]; one more is answered with 429.
    pub max_runs_per_client: usize,
    /// See [`DEFAULT_SHUTDOWN_GRACE`].
    pub shutdown_grace: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            token: TokenSource::default(),
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            connection_wait: DEFAULT_CONNECTION_WAIT,
            max_runs_per_client: DEFAULT_MAX_RUNS_PER_CLIENT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        }
    }
}
