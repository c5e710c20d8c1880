//! A small Chrome DevTools Protocol client over one websocket.
//!
//! The `WebMCP` domain is new and experimental, and no CDP crate has types
//! for it, so this speaks the protocol directly: JSON commands with ids,
//! answers matched by id, and events routed to the session (page) they
//! belong to. One connection carries every page of a browser ("flattened"
//! sessions), so commands and events of all pages share one ordered stream.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use crate::error::ToolsError;

/// How long one command may take before the caller gives up on it. Commands
/// are answered in milliseconds; a navigation's answer waits for the
/// server's response headers, hence the margin.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// An event of one session.
#[derive(Debug, Clone)]
pub(crate) struct CdpEvent {
    /// `Domain.event`.
    pub(crate) method: String,
    /// The event's parameters.
    pub(crate) params: Value,
}

/// Why a command failed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CdpError {
    /// The browser answered with an error.
    Remote { code: i64, message: String },
    /// The connection closed before the answer came.
    Closed,
    /// No answer within [`COMMAND_TIMEOUT`].
    Timeout,
}

impl CdpError {
    pub(crate) fn into_tools_error(self, method: &str) -> ToolsError {
        match self {
            Self::Remote { message, .. } => ToolsError::Cdp {
                method: method.to_string(),
                message,
            },
            Self::Closed => ToolsError::BrowserClosed,
            Self::Timeout => ToolsError::BrowserTimeout {
                what: method.to_string(),
                seconds: COMMAND_TIMEOUT.as_secs_f32(),
            },
        }
    }
}

type Reply = oneshot::Sender<Result<Value, CdpError>>;

#[derive(Default)]
struct Routes {
    /// Commands waiting for their answer, by id.
    pending: HashMap<u64, Reply>,
    /// Where each session's events go. Dropping a sender tells the page
    /// that its target is gone.
    sessions: HashMap<String, mpsc::UnboundedSender<CdpEvent>>,
}

/// One DevTools connection. Cheap to share behind an `Arc`; the reader and
/// writer tasks end when the socket closes or the last `Arc` is dropped.
pub(crate) struct Cdp {
    /// Frames to the writer task; unbounded so that a command can be sent
    /// from `Drop` (closing a tab) without awaiting.
    out: mpsc::UnboundedSender<String>,
    routes: Arc<Mutex<Routes>>,
    next_id: AtomicU64,
    /// Cancelled when the socket closes, so waiters can stop at once.
    closed: CancellationToken,
    /// Stops both tasks when the connection is dropped.
    stop: CancellationToken,
}

impl Drop for Cdp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Cdp {
    /// Connects to a `ws://` DevTools endpoint.
    pub(crate) async fn connect(endpoint: &str) -> Result<Arc<Self>, ToolsError> {
        // The default frame limit (16 MiB) is below what a page can return
        // from a tool; the browser is the trusted side of this socket.
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(256 << 20))
            .max_frame_size(Some(256 << 20));
        let (socket, _) =
            tokio_tungstenite::connect_async_with_config(endpoint, Some(config), true)
                .await
                .map_err(|e| ToolsError::Connect {
                    endpoint: endpoint.to_string(),
                    reason: e.to_string(),
                })?;
        let (mut sink, mut stream) = socket.split();
        let (out, mut outgoing) = mpsc::unbounded_channel::<String>();
        let routes = Arc::new(Mutex::new(Routes::default()));
        let closed = CancellationToken::new();
        let stop = CancellationToken::new();

        let writer_stop = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = writer_stop.cancelled() => break,
                    frame = outgoing.recv() => match frame {
                        Some(text) => {
                            if sink.send(Message::text(text)).await.is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                }
            }
            let _ = sink.close().await;
        });

        let reader_routes = routes.clone();
        let reader_closed = closed.clone();
        let reader_stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = reader_stop.cancelled() => break,
                    message = stream.next() => message,
                };
                match message {
                    Some(Ok(Message::Text(text))) => dispatch(&reader_routes, text.as_str()),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                }
            }
            reader_closed.cancel();
            // Dropping the senders wakes every waiter with "closed".
            let mut routes = reader_routes.lock();
            routes.pending.clear();
            routes.sessions.clear();
        });

        Ok(Arc::new(Self {
            out,
            routes,
            next_id: AtomicU64::new(1),
            closed,
            stop,
        }))
    }

    /// Sends a command and waits for its answer.
    pub(crate) async fn call(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, CdpError> {
        let (reply, answer) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut routes = self.routes.lock();
            if self.closed.is_cancelled() {
                return Err(CdpError::Closed);
            }
            routes.pending.insert(id, reply);
        }
        if self.out.send(frame(id, session, method, params)).is_err() {
            self.routes.lock().pending.remove(&id);
            return Err(CdpError::Closed);
        }
        match tokio::time::timeout(COMMAND_TIMEOUT, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(CdpError::Closed),
            Err(_) => {
                self.routes.lock().pending.remove(&id);
                Err(CdpError::Timeout)
            }
        }
    }

    /// Sends a command without waiting for the answer (for `Drop`).
    pub(crate) fn fire(&self, session: Option<&str>, method: &str, params: Value) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let _ = self.out.send(frame(id, session, method, params));
    }

    /// Routes the events of `session` to a new channel. The channel closes
    /// when the session detaches or the connection closes.
    pub(crate) fn subscribe(&self, session: &str) -> mpsc::UnboundedReceiver<CdpEvent> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut routes = self.routes.lock();
        if !self.closed.is_cancelled() {
            routes.sessions.insert(session.to_string(), sender);
        }
        receiver
    }

    /// Whether the socket is closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Cancelled when the socket closes.
    pub(crate) fn closed(&self) -> CancellationToken {
        self.closed.clone()
    }
}

fn frame(id: u64, session: Option<&str>, method: &str, params: Value) -> String {
    let mut frame = json!({"id": id, "method": method, "params": params});
    if let Some(session) = session {
        frame["sessionId"] = Value::String(session.to_string());
    }
    frame.to_string()
}

fn dispatch(routes: &Mutex<Routes>, text: &str) {
    let Ok(mut message) = serde_json::from_str::<Value>(text) else {
        tracing::warn!("the browser sent a frame that is not JSON");
        return;
    };
    if let Some(id) = message.get("id").and_then(Value::as_u64) {
        let reply = routes.lock().pending.remove(&id);
        if let Some(reply) = reply {
            let result = match message.get_mut("error") {
                Some(error) => Err(CdpError::Remote {
                    code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                    message: error
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown error")
                        .to_string(),
                }),
                None => Ok(message
                    .get_mut("result")
                    .map(Value::take)
                    .unwrap_or(Value::Null)),
            };
            let _ = reply.send(result);
        }
        return;
    }
    let Some(method) = message.get("method").and_then(Value::as_str) else {
        return;
    };
    let method = method.to_string();
    let params = message
        .get_mut("params")
        .map(Value::take)
        .unwrap_or(Value::Null);
    match message.get("sessionId").and_then(Value::as_str) {
        Some(session) => {
            let mut routes = routes.lock();
            if let Some(sender) = routes.sessions.get(session)
                && sender.send(CdpEvent { method, params }).is_err()
            {
                // The page was dropped; stop routing to it.
                routes.sessions.remove(session);
            }
        }
        None if method == "Target.detachedFromTarget" => {
            if let Some(session) = params.get("sessionId").and_then(Value::as_str) {
                routes.lock().sessions.remove(session);
            }
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_events_are_routed() {
        let routes = Mutex::new(Routes::default());
        let (reply, mut answer) = oneshot::channel();
        routes.lock().pending.insert(7, reply);
        let (sender, mut events) = mpsc::unbounded_channel();
        routes.lock().sessions.insert("S".into(), sender);

        dispatch(&routes, r#"{"id":7,"result":{"ok":true}}"#);
        assert_eq!(answer.try_recv().unwrap(), Ok(json!({"ok": true})));

        dispatch(
            &routes,
            r#"{"method":"WebMCP.toolsAdded","params":{"tools":[]},"sessionId":"S"}"#,
        );
        let event = events.try_recv().unwrap();
        assert_eq!(event.method, "WebMCP.toolsAdded");

        dispatch(
            &routes,
            r#"{"method":"Target.detachedFromTarget","params":{"sessionId":"S"}}"#,
        );
        assert!(events.try_recv().is_err());
        assert!(routes.lock().sessions.is_empty());
    }

    #[test]
    fn remote_errors_keep_code_and_message() {
        let routes = Mutex::new(Routes::default());
        let (reply, mut answer) = oneshot::channel();
        routes.lock().pending.insert(1, reply);
        dispatch(
            &routes,
            r#"{"id":1,"error":{"code":-32602,"message":"Tool not found"}}"#,
        );
        assert_eq!(
            answer.try_recv().unwrap(),
            Err(CdpError::Remote {
                code: -32602,
                message: "Tool not found".into()
            })
        );
    }
}
