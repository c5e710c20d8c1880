//! Properties of the DevTools client under a hostile browser.
//!
//! The CDP client trusts the browser to speak CDP, but a page controls much
//! of what the browser says (tool names, schemas, results, thrown values),
//! and a browser that crashes cuts frames short. A fake browser here speaks
//! just enough of the websocket protocol and of CDP to attach a
//! [`WebMcpPage`], then sends generated frames: arbitrary JSON, CDP shapes
//! with wrong types, events for other sessions and frames, truncated and
//! huge frames, binary and ping frames. The client must not panic, must
//! keep answering commands by id, must keep its tool list to what the main
//! frame registered, and must fail fast (never hang) when the socket dies.
//!
//! `PROPTEST_CASES` raises the number of cases (`scripts/fuzz.sh` does);
//! without it each property runs few, so the suite stays fast.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::{Number, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use wma_agent::ToolHost;
use wma_tools::{Browser, WebMcpPage};

/// A hang detector's limit: far above what any case needs, and far below
/// the client's own 30 s command timeout, so a lost answer shows as a
/// failure here rather than as a slow pass.
const HANG_LIMIT: Duration = Duration::from_secs(10);

/// The fake tab's target id, which is also its main frame's id.
const TARGET: &str = "T";

/// The session the fake hands out for the tab.
const SESSION: &str = "S";

/// `default` cases, or `PROPTEST_CASES` divided by `cost` when that is set
/// (a case that sends megabytes runs less often); no failure files.
fn config(default: u32, cost: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    config.cases = match std::env::var_os("PROPTEST_CASES") {
        Some(_) => (config.cases / cost).max(1),
        None => default,
    };
    config
}

// ---------------------------------------------------------------------------
// Just enough of RFC 6455 for a server: the handshake's SHA-1 and base64,
// and frames.
// ---------------------------------------------------------------------------

fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut message = data.to_vec();
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend_from_slice(&(data.len() as u64).wrapping_mul(8).to_be_bytes());
    for block in message.chunks(64) {
        let mut w = [0u32; 80];
        for (slot, word) in w.iter_mut().zip(block.chunks(4)) {
            *slot = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, word) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let next = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*word);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = next;
        }
        for (state, add) in h.iter_mut().zip([a, b, c, d, e]) {
            *state = state.wrapping_add(add);
        }
    }
    let mut out = [0u8; 20];
    for (chunk, word) in out.chunks_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The `Sec-WebSocket-Accept` answer to a client's key.
fn accept_key(key: &str) -> String {
    base64(&sha1(
        format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
    ))
}

/// One server frame (servers do not mask).
fn encode(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

/// Reads one client frame: its opcode and unmasked payload; `None` when
/// the client closed.
async fn read_frame(stream: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await.ok()?;
    let mut len = u64::from(head[1] & 0x7f);
    if len == 126 {
        let mut ext = [0u8; 2];
        stream.read_exact(&mut ext).await.ok()?;
        len = u64::from(u16::from_be_bytes(ext));
    } else if len == 127 {
        let mut ext = [0u8; 8];
        stream.read_exact(&mut ext).await.ok()?;
        len = u64::from_be_bytes(ext);
    }
    let mut mask = [0u8; 4];
    if head[1] & 0x80 != 0 {
        stream.read_exact(&mut mask).await.ok()?;
    }
    let mut payload = vec![0u8; usize::try_from(len).ok()?];
    stream.read_exact(&mut payload).await.ok()?;
    for (i, byte) in payload.iter_mut().enumerate() {
        *byte ^= mask[i % 4];
    }
    Some((head[0] & 0x0f, payload))
}

/// Answers the client's HTTP upgrade.
async fn handshake(stream: &mut TcpStream) -> Option<()> {
    let mut request = Vec::new();
    let mut byte = [0u8; 1];
    while !request.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.ok()?;
        request.push(byte[0]);
    }
    let request = String::from_utf8_lossy(&request);
    let key = request.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("sec-websocket-key")
            .then(|| value.trim().to_string())
    })?;
    let response = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
        accept_key(&key)
    );
    stream.write_all(response.as_bytes()).await.ok()
}

// ---------------------------------------------------------------------------
// The fake browser.
// ---------------------------------------------------------------------------

/// Something the fake sends that the client did not ask for.
#[derive(Debug, Clone)]
enum Frame {
    /// A text frame.
    Text(String),
    /// A binary frame (CDP never sends one).
    Binary(Vec<u8>),
    /// A ping, which the client must answer and otherwise ignore.
    Ping(Vec<u8>),
}

impl Frame {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Frame::Text(text) => encode(0x1, text.as_bytes()),
            Frame::Binary(data) => encode(0x2, data),
            Frame::Ping(data) => encode(0x9, data),
        }
    }

    /// The command id a text frame answers, if it is one.
    fn answers(&self) -> Option<u64> {
        match self {
            Frame::Text(text) => serde_json::from_str::<Value>(text).ok()?["id"].as_u64(),
            _ => None,
        }
    }
}

/// What the fake does when a command comes.
#[derive(Debug, Clone, Default)]
struct Script {
    /// Sent right after the tab is attached (before `Page.enable` is
    /// answered).
    on_attach: Vec<Frame>,
    /// Sent before each `Runtime.evaluate` is answered.
    before_probe: Vec<Frame>,
    /// Sent after `WebMCP.invokeTool` is answered, before the real answer.
    on_invoke: Vec<Frame>,
    /// The `toolResponded` parameters the invocation finally gets.
    responded: Option<Value>,
    /// Where the fake stops: after answering this many commands it writes
    /// `cut` (the start of a frame) and closes the socket.
    cut_after: Option<(usize, Vec<u8>)>,
}

/// Serves one client with `script`; returns when the client goes.
async fn serve(mut stream: TcpStream, script: Arc<Script>) {
    if handshake(&mut stream).await.is_none() {
        return;
    }
    let mut answered = 0;
    while let Some((opcode, payload)) = read_frame(&mut stream).await {
        match opcode {
            0x8 => return,
            0x1 => {}
            _ => continue,
        }
        let Ok(command) = serde_json::from_slice::<Value>(&payload) else {
            continue;
        };
        let id = command["id"].as_u64().unwrap_or(0);
        let method = command["method"].as_str().unwrap_or_default();
        let mut out: Vec<u8> = Vec::new();
        let send = |frames: &[Frame], out: &mut Vec<u8>| {
            for frame in frames {
                // A frame that answers the pending command would be taken
                // as its answer, rightly; keep the answer the fake's own.
                if frame.answers() != Some(id) {
                    out.extend(frame.bytes());
                }
            }
        };
        let result = match method {
            "Target.attachToTarget" => json!({"sessionId": SESSION}),
            "Target.getTargetInfo" => json!({"targetInfo": {"url": "http://fake.test/"}}),
            "Page.enable" => {
                send(&script.on_attach, &mut out);
                json!({})
            }
            "Runtime.evaluate" => {
                send(&script.before_probe, &mut out);
                // Whatever came before, the tab has finished loading.
                out.extend(event("Page.frameStoppedLoading", json!({"frameId": TARGET})).bytes());
                json!({"result": {"value": command["params"]["expression"]}})
            }
            "WebMCP.invokeTool" => json!({"invocationId": "I"}),
            _ => json!({}),
        };
        out.extend(Frame::Text(json!({"id": id, "result": result}).to_string()).bytes());
        if method == "WebMCP.invokeTool" {
            send(&script.on_invoke, &mut out);
            if let Some(params) = &script.responded {
                out.extend(event("WebMCP.toolResponded", params.clone()).bytes());
            }
        }
        answered += 1;
        if let Some((after, cut)) = &script.cut_after
            && answered >= *after
        {
            out.extend_from_slice(cut);
            let _ = stream.write_all(&out).await;
            return;
        }
        if stream.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// An event of the tab's session.
fn event(method: &str, params: Value) -> Frame {
    Frame::Text(json!({"method": method, "params": params, "sessionId": SESSION}).to_string())
}

/// A fake browser on a loopback port, serving every connection with `script`.
async fn fake_browser(script: Script) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("an address");
    let script = Arc::new(script);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, script.clone()));
        }
    });
    format!("ws://{address}/devtools/browser/fake")
}

/// Runs `case` on a fresh runtime, failing when it takes longer than
/// [`HANG_LIMIT`].
fn within_limit<F>(case: impl FnOnce() -> F) -> Result<(), TestCaseError>
where
    F: std::future::Future<Output = Result<(), TestCaseError>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime starts");
    runtime.block_on(async move {
        match tokio::time::timeout(HANG_LIMIT, case()).await {
            Ok(result) => result,
            Err(_) => Err(TestCaseError::fail(format!(
                "the client did not finish within {HANG_LIMIT:?}"
            ))),
        }
    })
}

/// Connects to a fake browser with `script` and attaches to its tab.
async fn attach(script: Script) -> Result<(Browser, WebMcpPage), TestCaseError> {
    let endpoint = fake_browser(script).await;
    let browser = Browser::connect(&endpoint)
        .await
        .map_err(|e| TestCaseError::fail(format!("connect: {e}")))?;
    let page = browser
        .attach(TARGET)
        .await
        .map_err(|e| TestCaseError::fail(format!("attach: {e}")))?;
    Ok((browser, page))
}

// ---------------------------------------------------------------------------
// Generators.
// ---------------------------------------------------------------------------

const PIECES: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "\\",
    "\\u",
    "\\ud800",
    "null",
    "1e999",
    "-1",
    "\"id\"",
    "\"method\"",
    "\"params\"",
    "\"sessionId\"",
    "\"S\"",
    "\"result\"",
    "\"error\"",
    "WebMCP.toolsAdded",
    "é",
    "🦀",
    "\u{0}",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        prop::collection::vec(prop::sample::select(PIECES), 0..24).prop_map(|p| p.concat()),
        Just(TARGET.to_string()),
        Just(SESSION.to_string()),
        Just("I".to_string()),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((text(), inner), 0..5)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// A value that is usually of the type CDP gives, and sometimes not.
fn usually(typical: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Value> {
    prop_oneof![3 => typical, 1 => json_value()].boxed()
}

/// A tool as `WebMCP.toolsAdded` lists it, of the main frame or another.
fn tool_entry() -> impl Strategy<Value = Value> {
    (
        usually(
            prop::sample::select(&["search", "add_to_cart", "", "a b"][..]).prop_map(Value::from),
        ),
        usually(text().prop_map(Value::String)),
        usually(prop::sample::select(&[TARGET, "IFRAME", ""][..]).prop_map(Value::from)),
        usually(Just(
            json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        )),
        usually(Just(json!({"readOnly": true, "untrustedContent": true}))),
    )
        .prop_map(|(name, description, frame, schema, annotations)| {
            json!({
                "name": name,
                "description": description,
                "frameId": frame,
                "inputSchema": schema,
                "annotations": annotations,
            })
        })
}

/// The events a page's session gets, with parameters of the right shape
/// or not.
fn cdp_event() -> impl Strategy<Value = Value> {
    let methods = prop::sample::select(
        &[
            "WebMCP.toolsAdded",
            "WebMCP.toolsRemoved",
            "WebMCP.toolResponded",
            "Page.frameNavigated",
            "Page.navigatedWithinDocument",
            "Page.frameRequestedNavigation",
            "Page.frameStartedLoading",
            "Page.frameStartedNavigating",
            "Page.frameStoppedLoading",
            "Inspector.targetCrashed",
            "Target.detachedFromTarget",
            "Runtime.consoleAPICalled",
        ][..],
    );
    let params = prop_oneof![
        prop::collection::vec(tool_entry(), 0..4).prop_map(|tools| json!({"tools": tools})),
        usually(Just(json!(TARGET))).prop_map(|frame| json!({"frameId": frame, "frame": {"id": frame, "url": "http://fake.test/next"}})),
        (usually(Just(json!("I"))), json_value(), json_value()).prop_map(|(id, status, output)| {
            json!({"invocationId": id, "status": status, "output": output})
        }),
        json_value(),
    ];
    (
        methods,
        params,
        usually(prop::sample::select(&[SESSION, "OTHER"][..]).prop_map(Value::from)),
        any::<bool>(),
    )
        .prop_map(|(method, params, session, with_session)| {
            let mut event = json!({"method": method, "params": params});
            if with_session {
                event["sessionId"] = session;
            }
            event
        })
}

/// Answers to commands nobody sent, and errors of every shape.
fn stray_answer() -> impl Strategy<Value = Value> {
    (
        usually((1_000u64..u64::MAX).prop_map(Value::from)),
        prop_oneof![
            json_value().prop_map(|v| json!({"result": v})),
            json_value().prop_map(|v| json!({"error": v})),
            (json_value(), json_value()).prop_map(|(code, message)| {
                json!({"error": {"code": code, "message": message}})
            }),
        ],
    )
        .prop_map(|(id, mut body)| {
            body["id"] = id;
            body
        })
}

/// Frames of every kind the client may be sent.
fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        4 => cdp_event().prop_map(|e| Frame::Text(e.to_string())),
        2 => stray_answer().prop_map(|a| Frame::Text(a.to_string())),
        1 => json_value().prop_map(|v| Frame::Text(v.to_string())),
        1 => text().prop_map(Frame::Text),
        // A frame cut short: JSON that ends in the middle.
        1 => (cdp_event(), any::<prop::sample::Index>()).prop_map(|(e, cut)| {
            let text = e.to_string();
            let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
            Frame::Text(text[..bounds[cut.index(bounds.len())]].to_string())
        }),
        // Nesting deeper than the JSON reader takes.
        1 => (1usize..20_000).prop_map(|depth| Frame::Text("[".repeat(depth) + &"]".repeat(depth))),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Frame::Binary),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Frame::Ping),
    ]
}

/// A frame of megabytes: a tool with a huge description, or a huge stray
/// answer.
fn huge_frame() -> impl Strategy<Value = Frame> {
    (1usize << 20..4 << 20, any::<bool>()).prop_map(|(size, as_tool)| {
        let big = "x".repeat(size);
        let value = if as_tool {
            json!({"method": "WebMCP.toolsAdded", "sessionId": SESSION, "params": {"tools": [
                {"name": "big", "description": big, "frameId": TARGET}
            ]}})
        } else {
            json!({"id": 999_999, "result": {"value": big}})
        };
        Frame::Text(value.to_string())
    })
}

/// How many tools of the main frame the frames add, at most (one per
/// entry of a `toolsAdded` of the tab's session).
fn main_frame_entries(frames: &[Frame]) -> usize {
    frames
        .iter()
        .filter_map(|f| match f {
            Frame::Text(text) => serde_json::from_str::<Value>(text).ok(),
            _ => None,
        })
        .filter(|v| v["method"] == "WebMCP.toolsAdded" && v["sessionId"] == SESSION)
        .map(|v| {
            v["params"]["tools"].as_array().map_or(0, |tools| {
                tools.iter().filter(|t| t["frameId"] == TARGET).count()
            })
        })
        .sum()
}

// ---------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------

async fn survives(on_attach: Vec<Frame>, before_probe: Vec<Frame>) -> Result<(), TestCaseError> {
    let most_tools = main_frame_entries(&on_attach) + main_frame_entries(&before_probe);
    let (browser, page) = attach(Script {
        on_attach,
        before_probe,
        ..Script::default()
    })
    .await?;
    // The answer to a command still comes, by its id, after the frames.
    let probe = page
        .evaluate("probe-1")
        .await
        .map_err(|e| TestCaseError::fail(format!("evaluate: {e}")))?;
    prop_assert_eq!(probe, json!("probe-1"));
    let tools = page.list_tools().await;
    prop_assert!(
        tools.len() <= most_tools,
        "{} tools from {} main-frame entries",
        tools.len(),
        most_tools
    );
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    prop_assert_eq!(names.len(), tools.len(), "one tool per name");
    // And again, once the frames are behind.
    let probe = page
        .evaluate("probe-2")
        .await
        .map_err(|e| TestCaseError::fail(format!("evaluate: {e}")))?;
    prop_assert_eq!(probe, json!("probe-2"));
    prop_assert!(!browser.is_closed());
    Ok(())
}

proptest! {
    #![proptest_config(config(32, 4))]

    #[test]
    fn cdp_client_survives_hostile_frames(
        on_attach in prop::collection::vec(frame(), 0..8),
        before_probe in prop::collection::vec(frame(), 0..24),
    ) {
        within_limit(|| survives(on_attach, before_probe))?;
    }

    /// Whatever a page answers a call with, the call ends with a result or
    /// a coded error, and other answers in between change nothing.
    ///
    /// A crash or a detach among the strays ends the call too (as
    /// `unavailable`; `a_crash_as_a_call_starts_fails_the_call` pins that).
    #[test]
    fn tool_answers_of_any_shape_end_the_call(
        stray in prop::collection::vec(frame(), 0..12),
        status in usually(prop::sample::select(&["Completed", "Error", "Canceled", ""][..]).prop_map(Value::from)),
        output in prop_oneof![
            json_value(),
            json_value().prop_map(|text| json!({"content": [{"type": "text", "text": text}], "isError": text.is_string()})),
            json_value().prop_map(|v| Value::String(json!({"content": [v]}).to_string())),
        ],
        error_text in json_value(),
        exception in prop_oneof![
            json_value(),
            (text(), text()).prop_map(|(class, message)| {
                json!({"className": class, "description": format!("{class}: {message}\n    at x")})
            }),
        ],
    ) {
        let responded = json!({
            "invocationId": "I",
            "status": status,
            "output": output,
            "errorText": error_text,
            "exception": exception,
        });
        within_limit(|| async move {
            let (_browser, page) = attach(Script {
                on_attach: vec![event(
                    "WebMCP.toolsAdded",
                    json!({"tools": [{"name": "probe_tool", "frameId": TARGET}]}),
                )],
                on_invoke: stray,
                responded: Some(responded),
                ..Script::default()
            })
            .await?;
            // Ends with Ok or a coded error; a hang fails the limit.
            let _ = page
                .call_tool("probe_tool", json!({}), CancellationToken::new())
                .await;
            prop_assert_eq!(page.calls_in_flight(), 0);
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(config(2, 64))]

    #[test]
    fn cdp_client_takes_huge_frames(huge in prop::collection::vec(huge_frame(), 1..3)) {
        within_limit(|| survives(Vec::new(), huge))?;
    }
}

proptest! {
    #![proptest_config(config(16, 4))]

    /// A socket that dies in the middle of a frame fails the command in
    /// flight at once (the client's own timeout is 30 s) and leaves the
    /// page gone.
    #[test]
    fn a_socket_cut_mid_frame_fails_fast(
        frame in frame(),
        cut in any::<prop::sample::Index>(),
        after in 1usize..=6,
    ) {
        let bytes = frame.bytes();
        // Keep at least a byte and leave out at least one.
        let cut = bytes[..1 + cut.index(bytes.len() - 1)].to_vec();
        within_limit(|| async move {
            let endpoint = fake_browser(Script {
                cut_after: Some((after, cut)),
                ..Script::default()
            })
            .await;
            let browser = Browser::connect(&endpoint)
                .await
                .map_err(|e| TestCaseError::fail(format!("connect: {e}")))?;
            // Attaching takes six commands and the cut comes after one of
            // them: either attaching fails, or the next command does.
            if let Ok(page) = browser.attach(TARGET).await {
                let answer = page.evaluate("after the cut").await;
                prop_assert!(answer.is_err(), "answered after the cut: {:?}", answer);
                prop_assert!(page.list_tools().await.is_empty());
                prop_assert!(browser.is_closed());
            }
            Ok(())
        })?;
    }
}

/// A tab that crashes just after the browser accepted a call (the crash
/// event comes after the answer to `WebMCP.invokeTool`, possibly before the
/// call has registered its waiter) fails the call at once as `unavailable`,
/// not after the whole call timeout (30 s by default, above
/// [`HANG_LIMIT`]), and leaves no call in flight.
///
/// The same holds for a tab the browser detaches from (its session ends),
/// and for an answer that never comes because of either.
#[test]
fn a_crash_as_a_call_starts_fails_the_call() {
    let crash = event("Inspector.targetCrashed", json!({}));
    // A browser-level event: the tab's session is gone.
    let detach = Frame::Text(
        json!({"method": "Target.detachedFromTarget", "params": {"sessionId": SESSION, "targetId": TARGET}})
            .to_string(),
    );
    let answer = json!({"invocationId": "I", "status": "Completed", "output": "late"});
    for (ending, responded) in [
        (crash.clone(), None),
        (detach.clone(), None),
        // The answer after the crash is never read: the tab is gone.
        (crash, Some(answer.clone())),
        (detach, Some(answer)),
    ] {
        let what = format!("{ending:?} then {responded:?}");
        within_limit(|| async {
            let (_browser, page) = attach(Script {
                on_attach: vec![event(
                    "WebMCP.toolsAdded",
                    json!({"tools": [{"name": "probe_tool", "frameId": TARGET}]}),
                )],
                on_invoke: vec![ending],
                responded,
                ..Script::default()
            })
            .await?;
            let result = page
                .call_tool("probe_tool", json!({}), CancellationToken::new())
                .await;
            let code = result.as_ref().err().map(|e| e.code);
            prop_assert_eq!(
                code,
                Some(wma_agent::ToolErrorCode::Unavailable),
                "{:?}",
                result
            );
            prop_assert!(page.is_gone());
            prop_assert_eq!(page.calls_in_flight(), 0);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{what}: the call did not fail at once: {e}"));
    }
}

#[test]
fn the_fake_browser_answers_the_handshake_as_rfc_6455_says() {
    // The example of RFC 6455, section 1.3.
    assert_eq!(
        accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    assert_eq!(base64(b"ab"), "YWI=");
    assert_eq!(base64(b"abc"), "YWJj");
}
