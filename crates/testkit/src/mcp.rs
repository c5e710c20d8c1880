//! A small MCP server over streamable HTTP, for tests of what a host sends
//! with a call: it echoes each call's `_meta` and keeps every call it got,
//! and one of its tools answers only when the test lets it.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::serve::LoopbackServer;

/// One `tools/call` the server received.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedCall {
    /// The tool.
    pub tool: String,
    /// Its arguments (`null` when the request had none).
    pub arguments: Value,
    /// The request's `_meta` (`null` when it had none).
    pub meta: Value,
}

#[derive(Default)]
struct State {
    calls: Vec<ReceivedCall>,
    /// Tools listed after the server's own, as they were given.
    listed_too: Vec<Value>,
}

/// An MCP server on a free loopback port, speaking the streamable-HTTP
/// transport without sessions (each POST is answered with one JSON
/// response). Its tools, all with `openWorldHint: false`:
///
/// - `place_order` (`{"item": string}`): consequential (not read-only,
///   destructive); answers `placed ITEM; _meta: {...}`, the request's
///   `_meta` as JSON;
/// - `hold_order` (`{"item": string}`): consequential; answers as
///   `place_order`, but only once [`McpTestServer::release`] was called
///   (a call in flight for as long as a test needs);
/// - `order_status` (`{}`): read-only; answers `no orders; _meta: {...}`.
///
/// It runs on a thread of its own, so it serves whatever the test's runtime
/// does; dropping it stops it.
pub struct McpTestServer {
    server: LoopbackServer,
    state: Arc<Mutex<State>>,
    release: watch::Sender<bool>,
}

impl McpTestServer {
    /// Binds a free loopback port and starts serving.
    pub fn start() -> std::io::Result<Self> {
        let state = Arc::new(Mutex::new(State::default()));
        let (release, released) = watch::channel(false);
        let served = state.clone();
        let server = LoopbackServer::start("mcp-test-server", move |req| {
            handle(req, served.clone(), released.clone())
        })?;
        Ok(Self {
            server,
            state,
            release,
        })
    }

    /// Binds a free loopback port and serves, listing `extra` (raw JSON
    /// tool entries, however malformed) after the server's own tools.
    /// Calls of them are refused as calls of unknown tools.
    pub fn start_listing(extra: Vec<Value>) -> std::io::Result<Self> {
        let server = Self::start()?;
        server.state.lock().listed_too = extra;
        Ok(server)
    }

    /// The endpoint (`http://127.0.0.1:PORT/mcp`).
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.server.addr())
    }

    /// Every call received so far, in arrival order (a held call is in it
    /// from the moment it arrived).
    pub fn calls(&self) -> Vec<ReceivedCall> {
        self.state.lock().calls.clone()
    }

    /// Lets every `hold_order` call answer, those waiting and those to come.
    pub fn release(&self) {
        self.release.send_replace(true);
    }
}

impl Drop for McpTestServer {
    fn drop(&mut self) {
        // A held call must not keep the server's thread from ending (it
        // stops when the server field drops, after this).
        self.release();
    }
}

type Reply = Response<Full<Bytes>>;

fn status(code: StatusCode) -> Reply {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = code;
    response
}

fn json_reply(body: &Value) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn tools() -> Value {
    let item = json!({"type": "object", "properties": {"item": {"type": "string"}},
                      "required": ["item"]});
    let consequential = json!({"readOnlyHint": false, "destructiveHint": true,
                               "openWorldHint": false});
    json!([
        {"name": "place_order", "description": "Place an order for an item.",
         "inputSchema": item, "annotations": consequential},
        {"name": "hold_order", "description": "Place an order for an item, slowly.",
         "inputSchema": item, "annotations": consequential},
        {"name": "order_status", "description": "Say which orders were placed.",
         "inputSchema": {"type": "object", "properties": {}},
         "annotations": {"readOnlyHint": true, "openWorldHint": false}},
    ])
}

async fn handle(
    request: Request<Incoming>,
    state: Arc<Mutex<State>>,
    mut released: watch::Receiver<bool>,
) -> Result<Reply, Infallible> {
    if request.method() != Method::POST {
        // No server-sent stream and no sessions to end.
        return Ok(status(StatusCode::METHOD_NOT_ALLOWED));
    }
    let Ok(body) = request.into_body().collect().await else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let Ok(message) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let Some(id) = message.get("id").cloned() else {
        // A notification or a response: nothing to answer.
        return Ok(status(StatusCode::ACCEPTED));
    };
    let params = &message["params"];
    let result = match message["method"].as_str().unwrap_or_default() {
        "initialize" => json!({
            "protocolVersion": params["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "wma-test-mcp", "version": "0.1.0"},
        }),
        "ping" => json!({}),
        "tools/list" => {
            let mut listed = tools();
            if let Some(listed) = listed.as_array_mut() {
                listed.extend(state.lock().listed_too.iter().cloned());
            }
            json!({"tools": listed})
        }
        "tools/call" => {
            let tool = params["name"].as_str().unwrap_or_default().to_string();
            let meta = params.get("_meta").cloned().unwrap_or(Value::Null);
            state.lock().calls.push(ReceivedCall {
                tool: tool.clone(),
                arguments: params.get("arguments").cloned().unwrap_or(Value::Null),
                meta: meta.clone(),
            });
            let item = params["arguments"]["item"].as_str().unwrap_or_default();
            let text = match tool.as_str() {
                "place_order" => format!("placed {item}; _meta: {meta}"),
                "hold_order" => {
                    // Ends when released, or when the server is dropped.
                    let _ = released.wait_for(|r| *r).await;
                    format!("placed {item}; _meta: {meta}")
                }
                "order_status" => format!("no orders; _meta: {meta}"),
                other => {
                    return Ok(json_reply(&json!({"jsonrpc": "2.0", "id": id, "error": {
                        "code": -32602, "message": format!("no tool named {other}")}})));
                }
            };
            json!({"content": [{"type": "text", "text": text}], "isError": false})
        }
        other => {
            return Ok(json_reply(&json!({"jsonrpc": "2.0", "id": id, "error": {
                "code": -32601, "message": format!("no method {other}")}})));
        }
    };
    Ok(json_reply(
        &json!({"jsonrpc": "2.0", "id": id, "result": result}),
    ))
}
