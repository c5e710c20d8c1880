//! Accepting connections and keeping each one within its limits: the
//! connection cap, accept errors retried, and the header and idle timeouts.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{Body, Server};

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
/// accept error ends it: each is logged and retried after a pause.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    server: Arc<Server>,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(server.options.max_connections.max(1)));
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
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                let waited = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    waited = tokio::time::timeout(
                        server.options.connection_wait,
                        slots.clone().acquire_owned(),
                    ) => waited,
                };
                match waited {
                    Ok(Ok(slot)) => slot,
                    _ => {
                        tracing::warn!(
                            %peer,
                            limit = server.options.max_connections,
                            "too many connections; closing a new one"
                        );
                        continue;
                    }
                }
            }
        };
        tokio::spawn(connection(
            stream,
            peer,
            server.clone(),
            slot,
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
async fn closed(slots: &Arc<Semaphore>, server: &Server) {
    if server.api.store.is_none() {
        return;
    }
    let all = u32::try_from(server.options.max_connections.max(1)).unwrap_or(u32::MAX);
    let wait = server.options.shutdown_grace + CLOSE_WAIT;
    let _ = tokio::time::timeout(wait, slots.acquire_many(all)).await;
}

/// How long after the grace period the server waits for its connections
/// to close: the host needs a moment to end the runs it gave up on.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn about_one_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// Serves one connection, HTTP/1.1 only: one request at a time per
/// connection, so the connection cap bounds the requests in progress too
/// (HTTP/2 would multiplex any number of them on one connection).
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    server: Arc<Server>,
    _slot: OwnedSemaphorePermit,
    shutdown: CancellationToken,
) {
    // Each event of a run's stream is a small write of its own. With
    // Nagle's algorithm on, a write made while the previous one is not yet
    // acknowledged waits for the client's delayed ACK (40 ms on Linux), so
    // a run's events would arrive in bursts 40 ms apart.
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%peer, %error, "could not turn off Nagle's algorithm");
    }
    let activity = Arc::new(Activity::new());
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
            let server = server.clone();
            let busy = activity.begin_request();
            async move {
                let response = super::handle(&server, peer, request).await;
                // The request counts as in progress until its response body
                // is done, however long a run's events take.
                Ok::<_, Infallible>(
                    response.map(|body| Tracked { body, _busy: busy }.boxed_unsync()),
                )
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
        }
    }
}

/// "Never", in an [`Activity`] time field.
const NEVER: u64 = u64::MAX;

/// What a connection is doing, to time its heads and its idle spells.
///
/// The connection and its watchdog run in one task, so the fields never
/// race; they are atomics only so that the task is `Send`.
struct Activity {
    opened: Instant,
    /// Requests whose response is not finished.
    in_flight: AtomicUsize,
    /// When the first byte of the next request's head arrived (ms since
    /// `opened`), or [`NEVER`] while none has.
    head_started: AtomicU64,
    /// When the connection last had nothing in progress (ms since `opened`).
    free_since: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
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
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
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
        let activity = Arc::new(Activity::new());
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
}
