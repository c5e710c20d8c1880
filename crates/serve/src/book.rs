//! The server's books of its runs: the public id of each run it streams
//! and how many each client has ([`RunBook`]), and the runs with a durable
//! log it drives, each with the feed of its events ([`LiveRuns`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::response::sse::Event;
use parking_lot::Mutex;
use tokio::sync::watch;
use wma_runtime::RunId;

/// Random bytes in a run id (128 bits): a page or a client that knows one
/// run's id learns nothing about any other's, so it cannot stop them.
pub(crate) const RUN_ID_BYTES: usize = 16;

/// Whether `id` has the form of a run's or a session's id.
pub(crate) fn is_id(id: &str) -> bool {
    id.len() == 2 * RUN_ID_BYTES && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The runs this server started: their public ids, and how many each
/// client has streaming.
#[derive(Default)]
pub(crate) struct RunBook {
    /// Public id → the agent and the runtime's id of the run.
    pub(crate) ids: Mutex<HashMap<String, (String, RunId)>>,
    /// Runs streaming per client address.
    per_client: Mutex<HashMap<IpAddr, usize>>,
}

impl RunBook {
    /// A slot for one more run of `client`, unless it has `limit` already.
    pub(crate) fn admit(self: &Arc<Self>, client: IpAddr, limit: usize) -> Option<RunTicket> {
        let mut counts = self.per_client.lock();
        let count = counts.entry(client).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(RunTicket {
            book: self.clone(),
            client,
            id: None,
        })
    }
}

/// A client's slot for one run, and the run's public id once it started.
/// The event stream owns it: when the stream ends or the client goes away,
/// the slot frees and the id is forgotten.
pub(crate) struct RunTicket {
    book: Arc<RunBook>,
    client: IpAddr,
    id: Option<String>,
}

impl RunTicket {
    /// Files the started run under its public id.
    pub(crate) fn register(&mut self, id: &str, agent: &str, run: RunId) {
        self.book
            .ids
            .lock()
            .insert(id.to_string(), (agent.to_string(), run));
        self.id = Some(id.to_string());
    }
}

impl Drop for RunTicket {
    fn drop(&mut self) {
        if let Some(id) = &self.id {
            self.book.ids.lock().remove(id);
        }
        let mut counts = self.book.per_client.lock();
        if let Some(count) = counts.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

/// The events of one run this process drives: every event so far (the
/// live part of the log, for clients that join late) and a signal for
/// each new one.
pub(crate) struct Feed {
    state: Mutex<FeedState>,
    signal: watch::Sender<usize>,
}

#[derive(Default)]
struct FeedState {
    /// (sequence number, the SSE event) in order.
    events: Vec<(u64, Event)>,
    done: bool,
}

impl Feed {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(FeedState::default()),
            signal: watch::channel(0).0,
        })
    }

    pub(crate) fn push(&self, seq: u64, event: Event) {
        self.state.lock().events.push((seq, event));
        self.signal.send_modify(|n| *n += 1);
    }

    pub(crate) fn finish(&self) {
        self.state.lock().done = true;
        self.signal.send_modify(|n| *n += 1);
    }

    /// The events numbered above `after`, then each new one until the run
    /// ends.
    pub(crate) fn follow(
        self: &Arc<Self>,
        after: u64,
    ) -> impl futures::Stream<Item = Event> + use<> {
        // Subscribed before the first read: nothing pushed in between is
        // missed.
        let signal = self.signal.subscribe();
        let feed = self.clone();
        futures::stream::unfold(
            (feed, signal, after, Vec::<Event>::new()),
            |(feed, mut signal, mut after, mut ready)| async move {
                loop {
                    if !ready.is_empty() {
                        let event = ready.remove(0);
                        return Some((event, (feed, signal, after, ready)));
                    }
                    let done = {
                        let state = feed.state.lock();
                        let from = after;
                        for (seq, event) in state.events.iter().filter(|(s, _)| *s > from) {
                            ready.push(event.clone());
                            after = *seq;
                        }
                        state.done
                    };
                    if !ready.is_empty() {
                        continue;
                    }
                    if done || signal.changed().await.is_err() {
                        return None;
                    }
                }
            },
        )
    }
}

/// The runs this process drives, by public id.
#[derive(Default)]
pub(crate) struct LiveRuns {
    pub(crate) runs: Mutex<HashMap<String, LiveRun>>,
    /// Set when the host gives up on the runs still going at shutdown:
    /// what they stream from then on (their stop) is neither logged nor
    /// sent, so that a run waiting for approval stays so in the store for
    /// the next start, and a client reconnects to it there.
    pub(crate) stopping: Arc<AtomicBool>,
}

#[derive(Clone)]
pub(crate) struct LiveRun {
    pub(crate) session_id: String,
    pub(crate) feed: Arc<Feed>,
}

impl LiveRuns {
    pub(crate) fn get(&self, run: &str) -> Option<LiveRun> {
        self.runs.lock().get(run).cloned()
    }

    pub(crate) fn in_session(&self, session: &str) -> bool {
        self.runs.lock().values().any(|r| r.session_id == session)
    }

    /// Whether this process drives the run.
    pub(crate) fn is_live(&self, run: &str) -> bool {
        self.runs.lock().contains_key(run)
    }

    /// The runs this process drives.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.runs.lock().keys().cloned().collect()
    }
}
