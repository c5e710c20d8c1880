//! The state a running server shares between its connections and
//! handlers ([`Server`]), and what starting one hands back ([`Started`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use wma_config::server::ServerOptions;

use crate::api::Api;
use crate::approvals::{InMemoryApprovals, PendingApprovals};
use crate::book::{LiveRuns, RunBook};
use crate::guard::{Guard, RefusalLog};
use crate::token::{Token, TokenOrigin};

/// One server: the API, its options and request checks, and its runs.
pub(crate) struct Server {
    pub(crate) api: Arc<Api>,
    pub(crate) options: ServerOptions,
    pub(crate) guard: Guard,
    /// How often a refused request is a warning in the log.
    pub(crate) refusals: RefusalLog,
    pub(crate) runs: Arc<RunBook>,
    /// The questions of its runs that wait for a person.
    pub(crate) approvals: Arc<dyn PendingApprovals>,
    /// The runs with a durable log this process drives.
    pub(crate) live: Arc<LiveRuns>,
}

impl Server {
    pub(crate) fn new(
        api: Arc<Api>,
        token: Token,
        listen: SocketAddr,
        options: ServerOptions,
    ) -> Self {
        Self {
            guard: Guard::new(token, listen, &options),
            refusals: RefusalLog::default(),
            runs: Arc::new(RunBook::default()),
            approvals: Arc::new(InMemoryApprovals::default()),
            live: Arc::new(LiveRuns::default()),
            api,
            options,
        }
    }
}

/// A server that was started: where it listens, the task serving it, and
/// the token requests must carry.
#[derive(Debug)]
pub struct Started {
    /// The bound address.
    pub addr: SocketAddr,
    /// The serving task; it ends (with `Ok`) when `shutdown` is cancelled.
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// The token every request but a bare health check must carry.
    pub token: Token,
    /// Where the token came from.
    pub token_origin: TokenOrigin,
    /// The runs it drives with a durable log, for a graceful shutdown.
    pub runs: RunsInFlight,
}

impl Started {
    /// The line to tell the operator about the token (see
    /// [`TokenOrigin::notice`]).
    pub fn token_notice(&self) -> String {
        self.token_origin.notice(&self.token)
    }
}

/// The runs a server drives with a durable log (a server with a store):
/// what a host waits for when it shuts down.
#[derive(Clone)]
pub struct RunsInFlight {
    pub(crate) live: Arc<LiveRuns>,
}

impl std::fmt::Debug for RunsInFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunsInFlight")
            .field("runs", &self.ids().len())
            .finish()
    }
}

impl RunsInFlight {
    /// The public ids of the runs still going.
    pub fn ids(&self) -> Vec<String> {
        self.live.ids()
    }

    /// Gives up on the runs still going: from now on what they stream (the
    /// stop that follows) is not logged, and their questions stay pending
    /// in the store. The host then marks them (`interrupted`, or leaves
    /// those waiting for approval to the next start) and stops them.
    pub fn give_up(&self) {
        self.live.stopping.store(true, Ordering::SeqCst);
    }

    /// Waits until no run is going, or `within` passed; true when none is.
    pub async fn drained(&self, within: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.live.ids().is_empty() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            // A run's end is rare next to this wait: polling keeps the
            // run's driver free of shutdown bookkeeping.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
