//! Accepting connections and keeping each one within its limits: the
//! connection caps (all together and per client address), accept errors
//! retried, and the header and idle timeouts.
//!
//! A full server makes room rather than making newcomers queue. Every
//! accepted connection is admitted (or refused) in a task of its own, so
//! the accept loop never waits for a slot and new connections never sit in
//! the kernel's backlog behind a flood. When the cap is reached, the
//! connection that has waited longest with no request in progress (silent,
//! dribbling its head, or kept alive between requests), of the client
//! holding the most connections, is closed to make room: closing such a
//! connection loses no request, and a client that floods the server with
//! silent connections thereby closes its own oldest ones, not the ones
//! that are working. Only when every slot carries a request in progress
//! does a newcomer wait (briefly), then get a `503` at once.
//!
//! Each admitted connection is served by hyper's HTTP/1.1 connection with
//! the API's axum router as its service ([`dispatch`]), rather than by
//! `axum::serve`: the caps, the choice of which connection to close, and
//! the header and idle timeouts need the socket and each request's start
//! and end, which `axum::serve` keeps to itself.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use hyper::body::{Frame, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::routes::dispatch;
use crate::state::Server;

/// First pause after an accept error that is not about one connection
/// (out of file descriptors, out of memory). The pause doubles with each
/// error in a row, up to [`ACCEPT_BACKOFF_MAX`]: retrying at once would
/// spin on an error that only time (connections closing) clears.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(20);

/// Longest pause between accept retries.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The shortest interval at which a connection's timeouts are checked.
const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(10);

/// Accepts connections until `shutdown` is cancelled (then, on a server
/// with a store, waits for the open ones to finish; see [`closed`]). No
/// accept error ends it: each is logged and retried after a pause. It
/// never waits for a free slot: each connection is admitted by its own
/// task ([`connection`]).
pub(crate) async fn accept_loop(
    listener: TcpListener,
    server: Arc<Server>,
    router: Router,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let slots = Arc::new(Slots::new(
        server.options.max_connections,
        server.options.max_connections_per_client,
    ));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                backoff = ACCEPT_BACKOFF_MIN;
                accepted
            }
            // The peer gave up on a connection that was still queued: only
            // that connection is lost, and the next one may be fine.
            Err(error) if about_one_connection(&error) => {
                tracing::debug!(%error, "a queued connection went away before it was accepted");
                continue;
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    retry_in_ms = backoff.as_millis() as u64,
                    "accepting a connection failed; the server keeps listening and retries"
                );
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        tokio::spawn(connection(
            stream,
            peer,
            (server.clone(), router.clone()),
            slots.clone(),
            shutdown.clone(),
        ));
    }
    // Nothing more is accepted: new connections are refused at once.
    drop(listener);
    closed(&slots, &server).await;
    Ok(())
}

/// Once the server stops accepting: a server with a store lets its open
/// connections finish what they stream (a run's events go on until the
/// host ends the run), for at most its grace period and a little more;
/// without one they were dropped at once, and their runs with them.
async fn closed(slots: &Slots, server: &Server) {
    if server.api.store.is_none() {
        return;
    }
    let wait = server.options.shutdown_grace + CLOSE_WAIT;
    let _ = tokio::time::timeout(wait, slots.all_closed()).await;
}

/// How long after the grace period the server waits for its connections
/// to close: the host needs a moment to end the runs it gave up on.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a refused connection gets to take its `503` before it is
/// closed (see [`refuse`]).
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// What a connection the server has no slot for is told.
const FULL_MESSAGE: &str = "the server is serving as many connections as it takes; try again";

/// The `503` for a connection the server has no slot for. Written as
/// bytes, without hyper: the connection gets no slot, so it must cost next
/// to nothing. `Retry-After` tells a well-behaved client when to come back.
fn full_response() -> Vec<u8> {
    let body = serde_json::json!({ "error": FULL_MESSAGE }).to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The connections being served: the cap on all of them and on each
/// client address, and the choice of which one to close to make room.
pub(crate) struct Slots {
    max: usize,
    per_client: usize,
    table: Mutex<Table>,
    /// Notified when a connection closes or one of its requests ends, so
    /// that a connection waiting for a slot looks again.
    changed: Arc<Notify>,
    /// Connections waiting for a slot or taking their `503`: they hold a
    /// socket without a slot, so they are capped too.
    unslotted: AtomicUsize,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    open: HashMap<u64, Open>,
}

/// One admitted connection.
struct Open {
    peer: IpAddr,
    activity: Arc<Activity>,
    /// Cancelled to close the connection, to make room for a new one.
    shed: CancellationToken,
}

/// A connection's place among the [`Slots`]; dropping it frees the place.
struct Slot {
    id: u64,
    slots: Arc<Slots>,
    shed: CancellationToken,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // A shed connection's place was already given to another.
        self.slots.table.lock().open.remove(&self.id);
        self.slots.changed.notify_waiters();
    }
}

impl Slots {
    fn new(max: usize, per_client: usize) -> Self {
        let max = max.max(1);
        Self {
            max,
            per_client: per_client.clamp(1, max),
            table: Mutex::new(Table::default()),
            changed: Arc::new(Notify::new()),
            unslotted: AtomicUsize::new(0),
        }
    }

    /// A slot for a new connection of `peer`, making room when the caps
    /// are reached, or `None` when every connection that could make room
    /// has a request in progress.
    ///
    /// At the per-client cap, `peer`'s own connection that has waited
    /// longest without a request is closed; at the overall cap, that of
    /// the client with the most connections. A connection's wait counts
    /// from when it opened, the first byte of the head it is sending, or
    /// its last response, so the newest connections are kept.
    fn admit(self: &Arc<Self>, peer: IpAddr, activity: &Arc<Activity>) -> Option<Slot> {
        let mut table = self.table.lock();
        let mut held: HashMap<IpAddr, usize> = HashMap::new();
        for open in table.open.values() {
            *held.entry(open.peer).or_default() += 1;
        }
        let victim = if held.get(&peer).copied().unwrap_or(0) >= self.per_client {
            Some(table.idlest(|open| open.peer == peer, &held)?)
        } else if table.open.len() >= self.max {
            Some(table.idlest(|_| true, &held)?)
        } else {
            None
        };
        if let Some(victim) = victim.and_then(|id| table.open.remove(&id)) {
            tracing::debug!(
                peer = %victim.peer,
                "the connection cap is reached; closing the connection that waited longest without a request"
            );
            victim.shed.cancel();
        }
        let id = table.next_id;
        table.next_id += 1;
        let shed = CancellationToken::new();
        table.open.insert(
            id,
            Open {
                peer,
                activity: activity.clone(),
                shed: shed.clone(),
            },
        );
        Some(Slot {
            id,
            slots: self.clone(),
            shed,
        })
    }

    /// [`admit`](Self::admit), waiting up to `wait` for a request to end
    /// or a connection to close when none can make room now.
    async fn admit_within(
        self: &Arc<Self>,
        peer: IpAddr,
        activity: &Arc<Activity>,
        wait: Duration,
        shutdown: &CancellationToken,
    ) -> Option<Slot> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Registered before looking, so a change in between is seen.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(slot) = self.admit(peer, activity) {
                return Some(slot);
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep_until(deadline) => return None,
                _ = shutdown.cancelled() => return None,
            }
        }
    }

    /// Waits until every admitted connection has closed.
    async fn all_closed(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.table.lock().open.is_empty() {
                return;
            }
            changed.await;
        }
    }
}

impl Table {
    /// Among the connections `eligible` picks that have no request in
    /// progress: one of the client holding the most connections, the one
    /// that has waited longest.
    fn idlest(
        &self,
        eligible: impl Fn(&Open) -> bool,
        held: &HashMap<IpAddr, usize>,
    ) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, open)| eligible(open))
            .filter_map(|(id, open)| {
                let since = open.activity.waiting_since()?;
                let held = held.get(&open.peer).copied().unwrap_or(0);
                // Among equals, the one admitted first.
                Some((held, Reverse(since), Reverse(*id)))
            })
            .max()
            .map(|(_, _, Reverse(id))| id)
    }
}

/// Answers a connection the server has no slot for with a `503`, then
/// closes it. The request is read and dropped for a moment after the
/// answer: closing a socket with unread bytes would reset it, and the
/// client would see the reset rather than the answer.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        stream.write_all(&full_response()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, io::Error>(())
    })
    .await;
}

/// Counts a connection without a slot for as long as it lives.
struct Unslotted<'a>(&'a AtomicUsize);

impl Drop for Unslotted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn about_one_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// Admits one connection (see [`Slots::admit`]) and serves it, HTTP/1.1
/// only: one request at a time per connection, so the connection cap
/// bounds the requests in progress too (HTTP/2 would multiplex any number
/// of them on one connection).
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    (server, router): (Arc<Server>, Router),
    slots: Arc<Slots>,
    shutdown: CancellationToken,
) {
    let activity = Arc::new(Activity::new(slots.changed.clone()));
    let slot = match slots.admit(peer.ip(), &activity) {
        Some(slot) => slot,
        None => {
            // Every slot has a request in progress. Waiting and refusing
            // hold a socket each, so only as many as the cap may do it;
            // beyond that the connection is dropped at once.
            let unslotted = slots.unslotted.fetch_add(1, Ordering::Relaxed);
            let _unslotted = Unslotted(&slots.unslotted);
            if unslotted >= slots.max {
                tracing::warn!(%peer, "too many connections; closing a new one");
                return;
            }
            let wait = server.options.connection_wait;
            match slots
                .admit_within(peer.ip(), &activity, wait, &shutdown)
                .await
            {
                Some(slot) => slot,
                None => {
                    tracing::warn!(
                        %peer,
                        limit = server.options.max_connections,
                        per_client = server.options.max_connections_per_client,
                        "every connection has a request in progress; answering a new one 503"
                    );
                    refuse(stream).await;
                    return;
                }
            }
        }
    };
    serve_admitted(stream, peer, (server, router), activity, slot, shutdown).await;
}

/// Serves an admitted connection until it ends, times out, is shed to make
/// room for another, or the server shuts down.
async fn serve_admitted(
    stream: TcpStream,
    peer: SocketAddr,
    (server, router): (Arc<Server>, Router),
    activity: Arc<Activity>,
    slot: Slot,
    shutdown: CancellationToken,
) {
    // Each event of a run's stream is a small write of its own. With
    // Nagle's algorithm on, a write made while the previous one is not yet
    // acknowledged waits for the client's delayed ACK (40 ms on Linux), so
    // a run's events would arrive in bursts 40 ms apart.
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%peer, %error, "could not turn off Nagle's algorithm");
    }
    let server_has_store = server.api.store.is_some();
    let header_timeout = server.options.header_timeout;
    let idle_timeout = server.options.idle_timeout;
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |request| {
            let router = router.clone();
            let busy = activity.begin_request();
            async move {
                let response = dispatch(router, peer, request).await;
                // The request counts as in progress until its response body
                // is done, however long a run's events take.
                Ok::<_, Infallible>(response.map(|body| Tracked { body, _busy: busy }))
            }
        })
    };
    let mut builder = http1::Builder::new();
    // The timer is what hyper's own timeouts need; the header timeout is
    // kept here instead (see `Activity`), because hyper's also runs while a
    // kept-alive connection waits for its next request, which would make
    // the idle timeout no longer than the header timeout.
    builder.timer(TokioTimer::new()).header_read_timeout(None);
    let connection = builder.serve_connection(io, service);
    tokio::pin!(connection);
    let every = (header_timeout.min(idle_timeout) / 4).max(MIN_CHECK_INTERVAL);
    let mut check = tokio::time::interval(every);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let graceful = server_has_store;
    let mut closing = false;
    let shed = slot.shed.clone();
    let mut shedding = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%peer, %error, "an HTTP connection ended with an error");
                }
                return;
            }
            _ = check.tick() => {
                if let Some(why) = activity.expired(header_timeout, idle_timeout) {
                    tracing::debug!(%peer, why, "closing a connection");
                    // Nothing is in progress on it, so dropping it loses nothing.
                    return;
                }
            }
            // Without a store, dropping the connection drops its open
            // event streams, which stops their runs. With one, the runs
            // go on without their connections: the response in progress
            // is finished, then the connection closes.
            _ = shutdown.cancelled(), if !closing => {
                if !graceful {
                    return;
                }
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            // Another connection took this one's place. It was chosen with
            // no request in progress. One waiting for (or reading) a head
            // has nothing to lose and is dropped; one between requests may
            // still be flushing its last response, and one that began a
            // request since it was chosen must finish it, so those close
            // through hyper, which closes an idle connection once its
            // writes are out.
            _ = shed.cancelled(), if !shedding => {
                tracing::debug!(%peer, "closing a connection to make room for a new one");
                if activity.in_flight.load(Ordering::Relaxed) == 0
                    && activity.head_started.load(Ordering::Relaxed) != NEVER
                {
                    return;
                }
                connection.as_mut().graceful_shutdown();
                shedding = true;
            }
        }
    }
}

/// "Never", in an [`Activity`] time field.
const NEVER: u64 = u64::MAX;

/// What a connection is doing, to time its heads and its idle spells.
///
/// The connection and its watchdog run in one task, which alone writes the
/// fields; they are atomics so that a new connection's admission can read
/// them from its own task ([`Slots::admit`]). A stale read there only
/// means a slightly different choice of connection to close.
struct Activity {
    opened: Instant,
    /// Told when a request ends, for connections waiting for a slot.
    ended: Arc<Notify>,
    /// Requests whose response is not finished.
    in_flight: AtomicUsize,
    /// When the first byte of the next request's head arrived (ms since
    /// `opened`), or [`NEVER`] while none has.
    head_started: AtomicU64,
    /// When the connection last had nothing in progress (ms since `opened`).
    free_since: AtomicU64,
}

impl Activity {
    fn new(ended: Arc<Notify>) -> Self {
        Self {
            opened: Instant::now(),
            ended,
            in_flight: AtomicUsize::new(0),
            // A new connection exists to send a request: its head is timed
            // from the start, so a client that connects and stays silent is
            // cut at the header timeout, not the longer idle one.
            head_started: AtomicU64::new(0),
            free_since: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    fn read_bytes(&self) {
        // Bytes while a request is in progress are its body (or a
        // pipelined request, timed by the idle rule once this one ends).
        if self.in_flight.load(Ordering::Relaxed) == 0
            && self.head_started.load(Ordering::Relaxed) == NEVER
        {
            self.head_started.store(self.now(), Ordering::Relaxed);
        }
    }

    fn begin_request(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_started.store(NEVER, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// Since when the connection has been waiting for its client (its
    /// head's first byte, or the end of its last response, or its start),
    /// or `None` while a request is in progress.
    fn waiting_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let head_started = self.head_started.load(Ordering::Relaxed);
        let since = if head_started != NEVER {
            head_started
        } else {
            self.free_since.load(Ordering::Relaxed)
        };
        Some(self.opened + Duration::from_millis(since))
    }

    /// Why the connection should be closed now, if it should.
    fn expired(&self, header_timeout: Duration, idle_timeout: Duration) -> Option<&'static str> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let now = self.now();
        let head_started = self.head_started.load(Ordering::Relaxed);
        if head_started != NEVER {
            let waited = now.saturating_sub(head_started);
            (waited >= header_timeout.as_millis() as u64)
                .then_some("the client did not finish its request head within the header timeout")
        } else {
            let idle = now.saturating_sub(self.free_since.load(Ordering::Relaxed));
            (idle >= idle_timeout.as_millis() as u64)
                .then_some("the connection was idle for the idle timeout")
        }
    }
}

/// A request in progress; dropping it (its response is done) frees the
/// connection.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.0;
        if activity.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            activity.free_since.store(activity.now(), Ordering::Relaxed);
            activity.head_started.store(NEVER, Ordering::Relaxed);
            // This connection can now make room for a waiting one.
            activity.ended.notify_waiters();
        }
    }
}

/// A response body that keeps its request counted as in progress.
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The connection's socket, noting when the client sends bytes.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.read_bytes();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_timed_from_its_first_byte_and_a_free_connection_by_its_idleness() {
        let activity = Arc::new(Activity::new(Arc::new(Notify::new())));
        let (header, idle) = (Duration::ZERO, Duration::from_secs(3600));
        // A new connection's head is timed from the start.
        assert!(activity.expired(header, idle).unwrap().contains("header"));
        let busy = activity.begin_request();
        assert_eq!(activity.expired(header, idle), None);
        activity.read_bytes();
        drop(busy);
        // Free again, no byte yet: only the idle rule applies.
        assert_eq!(activity.expired(header, idle), None);
        assert!(
            activity
                .expired(header, Duration::ZERO)
                .unwrap()
                .contains("idle")
        );
        activity.read_bytes();
        assert!(activity.expired(header, idle).unwrap().contains("header"));
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn new_activity(slots: &Slots) -> Arc<Activity> {
        Arc::new(Activity::new(slots.changed.clone()))
    }

    #[test]
    fn a_full_server_closes_the_idlest_connection_of_the_client_holding_most() {
        let slots = Arc::new(Slots::new(4, 3));
        let (a, b) = (ip(1), ip(2));
        // a holds three, b one: the server is full.
        let a_busy = new_activity(&slots);
        let first = slots.admit(a, &a_busy).unwrap();
        let _request = a_busy.begin_request();
        let a_idle = slots.admit(a, &new_activity(&slots)).unwrap();
        let a_newer = slots.admit(a, &new_activity(&slots)).unwrap();
        let b_idle = slots.admit(b, &new_activity(&slots)).unwrap();
        // A newcomer of b takes the place of a's idle connection that waited
        // longest; a's busy one, a's newer one and b's own stay.
        let _b_new = slots.admit(b, &new_activity(&slots)).unwrap();
        assert!(a_idle.shed.is_cancelled());
        assert!(!first.shed.is_cancelled() && !a_newer.shed.is_cancelled());
        assert!(!b_idle.shed.is_cancelled());
        // At its own cap, a closes its own idle one, even with free slots.
        drop((b_idle, _b_new));
        let a_third = slots.admit(a, &new_activity(&slots)).unwrap();
        let a_fourth = slots.admit(a, &new_activity(&slots)).unwrap();
        assert!(a_newer.shed.is_cancelled());
        assert!(!a_third.shed.is_cancelled() && !first.shed.is_cancelled());
        // Once a's connections all have requests in progress, a is refused,
        // and b still gets in.
        let _busy = (busy(&slots, &a_third), busy(&slots, &a_fourth));
        assert!(slots.admit(a, &new_activity(&slots)).is_none());
        assert!(slots.admit(b, &new_activity(&slots)).is_some());
    }

    /// Marks the connection of `slot` as having a request in progress.
    fn busy(slots: &Slots, slot: &Slot) -> Busy {
        let table = slots.table.lock();
        table.open[&slot.id].activity.begin_request()
    }
}
