//! Sessions and durable runs of `wma serve`, on the host's [`Store`]:
//! the `/v1/sessions` endpoints, runs whose parts are appended to the
//! store's log as they stream (the part's sequence number is the SSE
//! event's `id:`), reconnecting to a run's events with `Last-Event-ID`,
//! and pending approvals that a restart keeps.
//!
//! A run started with a store is driven by a task of its own, not by the
//! client's connection: a client that goes away does not stop it (Stop
//! does), and reconnecting gets what it missed and then the live rest.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use wma_agent::{AgentStreamPart, ApprovalAnswer, ChatMessage};
use wma_runtime::{RunApprovals, TaggedPart};
use wma_store::{Approval, RunLog, RunStatus, Store, StoreError};

use crate::mend::turn_messages;

use super::{
    Body, RUN_ID_BYTES, RUN_ID_HEADER, RunBody, RunTicket, Server, approvals, error, json_response,
    runtime_error, token,
};

/// The header that carries the session a run belongs to.
pub const SESSION_ID_HEADER: &str = "x-session-id";

/// Most sessions `GET /v1/sessions` lists (the newest).
pub const SESSIONS_LISTED: u32 = 200;

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
    events: Vec<(u64, Bytes)>,
    done: bool,
}

impl Feed {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(FeedState::default()),
            signal: watch::channel(0).0,
        })
    }

    fn push(&self, seq: u64, event: Bytes) {
        self.state.lock().events.push((seq, event));
        self.signal.send_modify(|n| *n += 1);
    }

    fn finish(&self) {
        self.state.lock().done = true;
        self.signal.send_modify(|n| *n += 1);
    }

    /// The events numbered above `after`, then each new one until the run
    /// ends.
    fn follow(self: &Arc<Self>, after: u64) -> impl futures::Stream<Item = Bytes> + use<> {
        // Subscribed before the first read: nothing pushed in between is
        // missed.
        let signal = self.signal.subscribe();
        let feed = self.clone();
        futures::stream::unfold(
            (feed, signal, after, Vec::<Bytes>::new()),
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
    runs: Mutex<HashMap<String, LiveRun>>,
    /// Set when the host gives up on the runs still going at shutdown:
    /// what they stream from then on (their stop) is neither logged nor
    /// sent, so that a run waiting for approval stays so in the store for
    /// the next start, and a client reconnects to it there.
    pub(crate) stopping: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Clone)]
struct LiveRun {
    session_id: String,
    feed: Arc<Feed>,
}

impl LiveRuns {
    fn get(&self, run: &str) -> Option<LiveRun> {
        self.runs.lock().get(run).cloned()
    }

    fn in_session(&self, session: &str) -> bool {
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

fn store_error(e: &StoreError) -> Response<Body> {
    let status = match e {
        StoreError::SessionNotFound(_)
        | StoreError::RunNotFound(_)
        | StoreError::ApprovalNotFound(_) => StatusCode::NOT_FOUND,
        StoreError::RunEnded { .. }
        | StoreError::AlreadyDecided { .. }
        | StoreError::SessionLive { .. } => StatusCode::CONFLICT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(status, e.to_string())
}

const NO_STORE: &str = "this server keeps no sessions (it was started without a store)";

fn no_store() -> Response<Body> {
    error(StatusCode::SERVICE_UNAVAILABLE, NO_STORE)
}

fn is_id(id: &str) -> bool {
    id.len() == 2 * RUN_ID_BYTES && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The store and the session id of a `/v1/sessions/{session}` request, or
/// the status and message that refuse it: no store, or an id that is not one.
fn store_and_session<'a>(
    server: &'a Server,
    id: &str,
) -> Result<(&'a Store, String), (StatusCode, String)> {
    let Some(store) = &server.api.store else {
        return Err((StatusCode::SERVICE_UNAVAILABLE, NO_STORE.to_string()));
    };
    if !is_id(id) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("`{id}` is not a session id"),
        ));
    }
    Ok((store, id.to_ascii_lowercase()))
}

/// The body of `POST /v1/sessions`. Public so that the property tests
/// parse bodies as the server does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionBody {
    /// The agent the conversation is with (one hosted here).
    pub agent: String,
    /// A title; default: the start of the first request.
    pub title: Option<String>,
}

/// The body of `POST /v1/sessions/{session}/runs`: the next request; the
/// history is the session's. Public so that the property tests parse
/// bodies as the server does.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContinueBody {
    /// The person's next request.
    pub input: String,
    /// The run's own approval rules, as in a run's body.
    pub approval: Option<std::collections::BTreeMap<String, wma_agent::ApprovalMode>>,
}

/// `POST /v1/sessions`.
pub(crate) async fn create(server: &Server, body: SessionBody) -> Response<Body> {
    let Some(store) = &server.api.store else {
        return no_store();
    };
    if server.api.agent(&body.agent).is_none() {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{}`", body.agent),
        );
    }
    match store
        .create_session(&body.agent, body.title.as_deref().unwrap_or(""))
        .await
    {
        Ok(session) => json_response(
            StatusCode::CREATED,
            &serde_json::to_value(session).unwrap_or(Value::Null),
        ),
        Err(e) => store_error(&e),
    }
}

/// `GET /v1/sessions`.
pub(crate) async fn list(server: &Server) -> Response<Body> {
    let Some(store) = &server.api.store else {
        return no_store();
    };
    match store.list_sessions(SESSIONS_LISTED).await {
        Ok(sessions) => json_response(StatusCode::OK, &json!({"sessions": sessions})),
        Err(e) => store_error(&e),
    }
}

/// `GET /v1/sessions/{session}`: the session, its messages and its runs.
pub(crate) async fn read(server: &Server, id: &str) -> Response<Body> {
    let (store, id) = match store_and_session(server, id) {
        Ok(found) => found,
        Err((status, message)) => return error(status, message),
    };
    let session = match store.session_with_messages(&id).await {
        Ok(Some(session)) => session,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no session `{id}`")),
        Err(e) => return store_error(&e),
    };
    let runs = match store.runs_of_session(&id).await {
        Ok(runs) => runs,
        Err(e) => return store_error(&e),
    };
    let mut listed = Vec::new();
    for run in runs {
        // The consequential calls recorded before they were sent: a
        // person checks one `in-doubt` after a crash here.
        let calls = match store.calls_of_run(&run.id).await {
            Ok(calls) => calls,
            Err(e) => return store_error(&e),
        };
        let mut value = serde_json::to_value(run).unwrap_or(Value::Null);
        value["calls"] = serde_json::to_value(calls).unwrap_or(Value::Null);
        listed.push(value);
    }
    let mut body = serde_json::to_value(session).unwrap_or(Value::Null);
    body["runs"] = Value::Array(listed);
    json_response(StatusCode::OK, &body)
}

/// `DELETE /v1/sessions/{session}`: refused while one of its runs runs here.
pub(crate) async fn delete(server: &Server, id: &str) -> Response<Body> {
    let (store, id) = match store_and_session(server, id) {
        Ok(found) => found,
        Err((status, message)) => return error(status, message),
    };
    if server.live.in_session(&id) {
        return error(
            StatusCode::CONFLICT,
            format!("a run of session `{id}` is running; stop it first"),
        );
    }
    match store.delete_session(&id).await {
        Ok(true) => json_response(StatusCode::OK, &json!({"deleted": true})),
        Ok(false) => error(StatusCode::NOT_FOUND, format!("no session `{id}`")),
        Err(e) => store_error(&e),
    }
}

/// `POST /v1/sessions/{session}/runs`: a run of the session's agent whose
/// history is the session's messages and the new request.
pub(crate) async fn continue_session(
    server: &Server,
    client: IpAddr,
    id: &str,
    body: ContinueBody,
) -> Response<Body> {
    let (store, id) = match store_and_session(server, id) {
        Ok(found) => found,
        Err((status, message)) => return error(status, message),
    };
    let session = match store.session_with_messages(&id).await {
        Ok(Some(session)) => session,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no session `{id}`")),
        Err(e) => return store_error(&e),
    };
    let run_body = RunBody {
        input: None,
        messages: None,
        approval: body.approval,
    };
    let rules = match run_body.approval_rules() {
        Ok(rules) => rules,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let new = vec![ChatMessage::user(body.input)];
    // Before the store keeps a run for it.
    if let Err(e) = wma_runtime::check_request(&new) {
        return super::runtime_error(&e);
    }
    let mut history = session.messages;
    // A turn its host was cut from (a crash, a shutdown that gave up on
    // it) and that the start did not mend yet: its answer, as far as the
    // log and call records have it, joins the session before the next
    // request, so the model reads what became of its calls.
    match crate::mend::mend_cut_turn(store, &id, &history).await {
        Ok(Some(mended)) => history.extend(mended.added),
        Ok(None) => {}
        Err(e) => return store_error(&e),
    }
    history.extend(new.iter().cloned());
    let agent = session.session.agent;
    start_durable(server, client, &agent, &id, history, new, rules).await
}

/// `POST /v1/agents/{agent}/runs` on a server with a store: the run gets a
/// session of its own holding the conversation it was given.
pub(crate) async fn start_in_new_session(
    server: &Server,
    client: IpAddr,
    agent: &str,
    messages: Vec<ChatMessage>,
    rules: Vec<wma_agent::ApprovalRule>,
) -> Response<Body> {
    let Some(store) = &server.api.store else {
        return no_store();
    };
    let session = match store.create_session(agent, "").await {
        Ok(session) => session,
        Err(e) => return store_error(&e),
    };
    start_durable(
        server,
        client,
        agent,
        &session.id,
        messages.clone(),
        messages,
        rules,
    )
    .await
}

/// Starts a run in a session: `new` is appended to the session first,
/// `history` (the session's messages and `new`) is what the loop sees.
/// The run is driven by a task of its own; the response follows its feed.
async fn start_durable(
    server: &Server,
    client: IpAddr,
    name: &str,
    session_id: &str,
    history: Vec<ChatMessage>,
    new: Vec<ChatMessage>,
    rules: Vec<wma_agent::ApprovalRule>,
) -> Response<Body> {
    let Some(store) = server.api.store.clone() else {
        return no_store();
    };
    let Some(agent) = server.api.agent(name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        );
    };
    let limit = server.options.max_runs_per_client;
    let Some(mut ticket) = server.runs.admit(client, limit) else {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "this client already has {limit} runs streaming (the server's limit); try again when one finishes"
            ),
        );
    };
    let id = match token::random_hex(RUN_ID_BYTES) {
        Ok(id) => id,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    };
    // The run's row is queued ahead of its parts and written with the first
    // of them, so the run waits for no commit to start; the callers checked
    // that the session exists.
    let (_run, log) = RunLog::start(&store, session_id, name, Some(&id));
    let calls = approvals::CallKeys::default();
    let questions = approvals::LoggedQuestions::default();
    let approver =
        approvals::HttpApprover::new(id.clone(), name.to_string(), server.approvals.clone())
            .with_store(store.clone(), calls.clone(), server.live.stopping.clone())
            .with_logged_questions(questions.clone());
    let approvals = RunApprovals::asking(Arc::new(approver)).with_rules(rules);
    let run = match agent
        .handle
        .run_with(history, CancellationToken::new(), approvals)
        .await
    {
        Ok(run) => run,
        Err(e) => {
            // The run never started: its row says so.
            let _ = store.set_run_status(&id, RunStatus::Interrupted).await;
            return runtime_error(&e);
        }
    };
    // The request joins the session once the run has started (a refused
    // run leaves no request without an answer), before its answer can.
    if let Err(e) = store.append_messages(session_id, &new).await {
        run.stop();
        let _ = store.set_run_status(&id, RunStatus::Interrupted).await;
        return store_error(&e);
    }
    ticket.register(&id, name, run.id());
    let feed = launch(
        server,
        store,
        (log, Vec::new()),
        (ticket, name),
        session_id,
        (calls, questions, 0),
        run,
    );
    let first = super::sse_event(
        "run",
        &json!({"agent": name, "run_id": id, "session_id": session_id}),
    );
    let events = futures::stream::once(async move { first })
        .chain(feed.follow(0))
        .map(|event| Ok::<_, Infallible>(Frame::data(event)));
    event_stream(events, Some((&id, session_id)))
}

/// Files a started run as live and spawns its driver; returns its feed.
/// `earlier`: the events of parts already in `log` that the feed starts
/// with (a resumed run's: those stored before the restart, then the
/// decision and its outcome).
fn launch(
    server: &Server,
    store: Store,
    (log, earlier): (RunLog, Vec<(u64, Bytes)>),
    (ticket, agent): (RunTicket, &str),
    session_id: &str,
    (calls, questions, sub_runs_before): (approvals::CallKeys, approvals::LoggedQuestions, u64),
    run: wma_runtime::RunStream,
) -> Arc<Feed> {
    let id = log.run_id().to_string();
    let feed = Feed::new();
    // Parts appended before this loop started (a resumed run's parts
    // from before the restart, its decision and call): a client that joins
    // gets them too.
    for (seq, event) in earlier {
        feed.push(seq, event);
    }
    server.live.runs.lock().insert(
        id.clone(),
        LiveRun {
            session_id: session_id.to_string(),
            feed: feed.clone(),
        },
    );
    tokio::spawn(drive(
        DriveRun {
            store,
            log,
            feed: feed.clone(),
            live: server.live.clone(),
            ticket,
            id,
            agent: agent.to_string(),
            session_id: session_id.to_string(),
            calls,
            questions,
            sub_runs_before,
        },
        run.tagged(),
    ));
    feed
}

fn event_stream(
    events: impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static,
    ids: Option<(&str, &str)>,
) -> Response<Body> {
    let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(events)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Some((run, session)) = ids {
        if let Ok(value) = HeaderValue::from_str(run) {
            headers.insert(RUN_ID_HEADER, value);
        }
        if let Ok(value) = HeaderValue::from_str(session) {
            headers.insert(SESSION_ID_HEADER, value);
        }
    }
    response
}

/// A part as an SSE event whose id is its sequence number in the log.
fn part_event(seq: u64, data: &Value) -> Bytes {
    Bytes::from(format!("id: {seq}\nevent: part\ndata: {data}\n\n"))
}

struct DriveRun {
    store: Store,
    log: RunLog,
    feed: Arc<Feed>,
    live: Arc<LiveRuns>,
    ticket: RunTicket,
    id: String,
    /// The run's own agent, whose calls the session's history holds.
    agent: String,
    session_id: String,
    /// Calls recorded before they were sent, awaiting their answer.
    calls: approvals::CallKeys,
    /// Questions whose part is logged, which the run's approver waits for
    /// before it marks the run waiting.
    questions: approvals::LoggedQuestions,
    /// Sub-agent runs the run held before this loop (a resumed run's):
    /// this loop's are numbered after them ([`approvals::sub_run_after`]).
    sub_runs_before: u64,
}

/// Reads the run to its end: each part into the log and onto the feed;
/// then the log flushed, the answer appended to the session, a run that
/// ended without its terminal part marked interrupted.
async fn drive(run: DriveRun, mut parts: wma_runtime::TaggedStream) {
    // However the driver ends, no question waits for it any longer.
    let _questions = run.questions.end_on_drop();
    let mut own = Vec::new();
    let stopping = || run.live.stopping.load(std::sync::atomic::Ordering::SeqCst);
    while let Some(part) = parts.next().await {
        let mut part: TaggedPart = part;
        let question = match &part.part {
            AgentStreamPart::ApprovalRequested { approval_id, .. } => Some(approval_id.clone()),
            _ => None,
        };
        if stopping() {
            // The host's stop, not the run's own end; a question asked now
            // is not logged, and its approver waits for nothing.
            if let Some(id) = question {
                run.questions.logged(id);
            }
            continue;
        }
        part.sub_run = approvals::sub_run_after(&part.sub_run, run.sub_runs_before);
        let seq = run
            .log
            .append_in(&part.agent, part.depth, &part.sub_run, part.part.clone());
        let data = serde_json::to_value(&part).unwrap_or(Value::Null);
        run.feed.push(seq, part_event(seq, &data));
        if let Some(id) = question {
            // The question's approver marks the run waiting once this part,
            // and every one before it, is committed (see
            // `approvals::LoggedQuestions`); off the driver's path, which
            // goes on streaming the run's other parts meanwhile.
            let (log, questions, run_id) = (run.log.clone(), run.questions.clone(), run.id.clone());
            tokio::spawn(async move {
                if let Err(e) = log.flush().await {
                    tracing::warn!(run_id = %run_id, error = %e, "the run's log is incomplete");
                }
                questions.logged(id);
            });
        }
        record_answer(&run, &part);
        if part.depth == 0 {
            own.push(part.part);
        }
    }
    if let Err(e) = run.log.flush().await {
        tracing::warn!(run_id = %run.id, error = %e, "the run's log is incomplete");
    }
    // A run the host gave up on keeps what its log holds; the host marked
    // it (interrupted, or still waiting for approval: a next start goes on
    // with it from the log).
    if !stopping() {
        // A call recorded before it was sent whose answer never came (the
        // run stopped while it ran) may or may not have happened: in doubt
        // now, as after a crash. At shutdown they stay in flight, and the
        // next start marks them.
        let unanswered = std::mem::take(&mut *run.calls.lock());
        for key in unanswered.values() {
            if let Err(e) = run.store.abandon_call(key).await {
                tracing::warn!(run_id = %run.id, error = %e, "a call cut short was not marked in doubt");
            }
        }
        // A run stopped in the middle of a call leaves it without an
        // answer: the session's history says what became of it, as
        // `wma chat`'s does.
        let in_doubt: HashMap<String, String> = unanswered
            .into_iter()
            .filter(|((agent, sub_run, _), _)| *agent == run.agent && sub_run.is_empty())
            .map(|((_, _, call_id), key)| (call_id, key))
            .collect();
        crate::mend::answer_cut_calls(&mut own, &in_doubt, "the run was stopped");
        let answer = turn_messages(&own);
        if let Err(e) = run.store.append_messages(&run.session_id, &answer).await {
            tracing::warn!(run_id = %run.id, error = %e, "the run's answer was not added to its session");
        }
        match run.store.run(&run.id).await {
            Ok(Some(stored)) if !stored.status.is_ended() => {
                let _ = run
                    .store
                    .set_run_status(&run.id, RunStatus::Interrupted)
                    .await;
            }
            _ => {}
        }
    }
    run.live.runs.lock().remove(&run.id);
    run.feed.finish();
    drop(run.ticket);
}

/// The answer of a call that was recorded before it was sent (a
/// consequential or approved one), written off the run's path.
fn record_answer(run: &DriveRun, part: &TaggedPart) {
    let (call_id, output, is_error) = match &part.part {
        AgentStreamPart::ToolResult {
            call_id, output, ..
        } => (call_id, output.clone(), false),
        AgentStreamPart::ToolError { call_id, error, .. } => (call_id, error.to_string(), true),
        _ => return,
    };
    let key = run
        .calls
        .lock()
        .remove(&(part.agent.clone(), part.sub_run.clone(), call_id.clone()));
    if let Some(key) = key {
        let store = run.store.clone();
        let run_id = run.id.clone();
        tokio::spawn(async move {
            if let Err(e) = store.finish_call(&key, &output, is_error).await {
                tracing::warn!(run_id = %run_id, error = %e, "the call's answer was not recorded");
            }
        });
    }
}

/// `GET /v1/runs/{run}/events`: the parts numbered above `Last-Event-ID`
/// (all without it), then the live rest while the run runs here.
pub(crate) async fn events(
    server: &Server,
    run: &str,
    last_event_id: Option<&str>,
) -> Response<Body> {
    let Some(store) = &server.api.store else {
        return no_store();
    };
    if !is_id(run) {
        return error(StatusCode::BAD_REQUEST, format!("`{run}` is not a run id"));
    }
    let after = match last_event_id.map(str::trim) {
        None | Some("") => 0,
        Some(value) => match value.parse::<u64>() {
            Ok(n) => n,
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("`Last-Event-ID: {value}` is not a part's sequence number"),
                );
            }
        },
    };
    let run = run.to_ascii_lowercase();
    let stored = match store.run(&run).await {
        Ok(Some(stored)) => stored,
        Ok(None) => return error(StatusCode::NOT_FOUND, format!("no run `{run}`")),
        Err(e) => return store_error(&e),
    };
    if let Some(live) = server.live.get(&run) {
        let events = live
            .feed
            .follow(after)
            .map(|event| Ok::<_, Infallible>(Frame::data(event)));
        return event_stream(events, Some((&run, &stored.session_id)));
    }
    let parts = match store.parts_after(&run, after).await {
        Ok(parts) => parts,
        Err(e) => return store_error(&e),
    };
    let events: Vec<Result<Frame<Bytes>, Infallible>> = parts
        .iter()
        .map(|p| Ok(Frame::data(part_event(p.seq, &p.event_data()))))
        .collect();
    event_stream(
        futures::stream::iter(events),
        Some((&run, &stored.session_id)),
    )
}

/// The pending approvals the store keeps of runs this process does not
/// drive (a run that waited when the last process went away), as the
/// list shows them: `"live": false` and the run's stored status.
pub(crate) async fn stored_pending(server: &Server, run: Option<&str>) -> Vec<Value> {
    let Some(store) = &server.api.store else {
        return Vec::new();
    };
    let pending = match run {
        Some(run) => store.approvals_of_run(run).await.map(|all| {
            all.into_iter()
                .filter(Approval::is_pending)
                .collect::<Vec<_>>()
        }),
        None => store.pending_approvals(None).await,
    };
    let pending = match pending {
        Ok(pending) => pending,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the stored approvals");
            return Vec::new();
        }
    };
    let mut listed = Vec::new();
    for approval in pending {
        if server.live.is_live(&approval.run_id) {
            continue;
        }
        // A run that ended (stopped while it waited) asks nothing any more.
        let Ok(Some(stored)) = store.run(&approval.run_id).await else {
            continue;
        };
        if stored.status != RunStatus::WaitingForApproval {
            continue;
        }
        let mut value = serde_json::to_value(super::PendingApproval {
            run_id: approval.run_id.clone(),
            run_agent: stored.agent.clone(),
            request: approval.request.clone(),
            asked_at: u64::try_from(approval.requested_at / 1000).unwrap_or(0),
        })
        .unwrap_or(Value::Null);
        value["live"] = Value::Bool(false);
        value["run_status"] = Value::from(stored.status.as_str());
        value["session_id"] = Value::from(stored.session_id.as_str());
        listed.push(value);
    }
    listed
}

/// Answers a stored question of a run this process does not drive (one
/// that waited when the last process went away). The decision is
/// recorded; when the question was the run's own agent's and nothing else
/// of the run waits, the run goes on here under its id: the call runs (or
/// its denial is the model's `Error [denied]`), both appended to its log,
/// and a new loop continues from the session's history with them. A run
/// that cannot go on (a sub-agent's question, the agent gone, the
/// client's run cap) is `interrupted`, and the answer says why. `None`
/// when the store has no such pending question.
pub(crate) async fn decide_stored(
    server: &Server,
    client: IpAddr,
    agent: &str,
    run: &str,
    approval: &str,
    answer: &ApprovalAnswer,
) -> Option<Response<Body>> {
    let store = server.api.store.as_ref()?;
    let run = run.to_ascii_lowercase();
    let stored = store.run(&run).await.ok()??;
    if stored.agent != agent || server.live.is_live(&run) {
        return None;
    }
    let all = store.approvals_of_run(&run).await.ok()?;
    let found = all
        .into_iter()
        .find(|a| a.is_pending() && a.request.approval_id == approval)?;
    let decided = match store.decide_approval(&found.id, answer).await {
        Ok(decided) => decided,
        // Another answer got there first (two at once): the question no
        // longer waits, and a second answer is a 404 like any other.
        Err(StoreError::AlreadyDecided { .. }) => return None,
        Err(e) => return Some(store_error(&e)),
    };
    let again = store.run(&run).await.ok().flatten();
    let not_resumed = match again {
        Some(now) if now.status == RunStatus::Running && decided.request.agent == now.agent => {
            resume(server, client, &now, &decided, answer).await.err()
        }
        Some(now) if now.status == RunStatus::WaitingForApproval => {
            Some("another of its questions still waits".to_string())
        }
        Some(_) if decided.request.agent != agent => Some(format!(
            "the question was sub-agent `{}`'s, whose run went away with the last process",
            decided.request.agent
        )),
        _ => Some("the run ended".to_string()),
    };
    let mut body = json!({
        "approval_id": decided.request.approval_id,
        "tool": decided.request.tool,
        "approved": answer.approved,
        "for_session": answer.remember,
        "resumed": not_resumed.is_none(),
    });
    let status = match &not_resumed {
        None => RunStatus::Running,
        Some(reason) => {
            body["not_resumed"] = Value::from(reason.as_str());
            // Another question of it still waiting keeps it listed.
            match store.run(&run).await.ok().flatten() {
                Some(now) if now.status == RunStatus::WaitingForApproval => now.status,
                _ => match store.set_run_status(&run, RunStatus::Interrupted).await {
                    Ok(now) => now.status,
                    Err(_) => RunStatus::Interrupted,
                },
            }
        }
    };
    body["run_status"] = Value::from(status.as_str());
    Some(json_response(StatusCode::OK, &body))
}

/// Goes on with a run the last process left waiting for `approval`, now
/// decided: the decision and the call's outcome are appended to the run's
/// log (its numbering goes on), the interrupted step's messages to the
/// session, and a new loop of the run's agent starts from the session's
/// history under the run's id.
async fn resume(
    server: &Server,
    client: IpAddr,
    stored: &wma_store::Run,
    approval: &Approval,
    answer: &ApprovalAnswer,
) -> Result<(), String> {
    let store = server.api.store.clone().ok_or("no store")?;
    let agent = server
        .api
        .agent(&stored.agent)
        .ok_or_else(|| format!("agent `{}` is not hosted here", stored.agent))?;
    let limit = server.options.max_runs_per_client;
    let mut ticket = server
        .runs
        .admit(client, limit)
        .ok_or_else(|| format!("this client already has {limit} runs (the server's limit)"))?;
    let log = RunLog::open(&store, &stored.id)
        .await
        .map_err(|e| e.to_string())?;
    let q = &approval.request;
    let decided = AgentStreamPart::ApprovalDecided {
        approval_id: q.approval_id.clone(),
        call_id: q.call_id.clone(),
        name: q.tool.clone(),
        approved: answer.approved,
        by: answer.by.clone(),
        remember: answer.remember,
    };
    let outcome = if answer.approved {
        call_once(&store, &stored.id, agent, q).await
    } else {
        let message = match &answer.note {
            Some(note) => format!("the call was not approved: {note}"),
            None => "the person did not approve this call".to_string(),
        };
        AgentStreamPart::ToolError {
            call_id: q.call_id.clone(),
            name: q.tool.clone(),
            error: wma_agent::ToolError::new(wma_agent::ToolErrorCode::Denied, message),
        }
    };
    // The interrupted step as the session keeps it: what the run's agent
    // said and called before it waited (its call even if that part was
    // not stored yet), then the outcome.
    let logged = store
        .parts_after(&stored.id, 0)
        .await
        .map_err(|e| e.to_string())?;
    // The new loop numbers its delegations from 1 again; its sub-agent
    // runs are numbered after those the run already holds, so that none
    // shares an id with one before the restart.
    let recorded = store
        .calls_of_run(&stored.id)
        .await
        .map_err(|e| e.to_string())?;
    let sub_runs_before = logged
        .iter()
        .map(|p| p.sub_run.as_str())
        .chain(recorded.iter().map(|c| c.sub_run.as_str()))
        .map(approvals::top_delegation)
        .max()
        .unwrap_or(0);
    // The feed of the resumed run starts with every part stored before the
    // restart, as a new run's holds all of its own: a client reading the
    // run from its start while it is live gets them from the feed, which
    // is what serves a live run.
    let mut earlier: Vec<(u64, Bytes)> = logged
        .iter()
        .map(|p| (p.seq, part_event(p.seq, &p.event_data())))
        .collect();
    let mut own: Vec<AgentStreamPart> = logged
        .into_iter()
        .filter(|p| p.depth == 0)
        .map(|p| p.part)
        .collect();
    let has_call = own
        .iter()
        .any(|p| matches!(p, AgentStreamPart::ToolCall { call_id, .. } if *call_id == q.call_id));
    if !has_call {
        own.push(AgentStreamPart::ToolCall {
            call_id: q.call_id.clone(),
            name: q.tool.clone(),
            arguments: q.arguments.clone(),
        });
    }
    own.push(outcome.clone());
    for part in [decided, outcome] {
        let seq = log.append(&stored.agent, 0, part.clone());
        let tagged = TaggedPart::new(stored.agent.clone(), 0, part);
        let data = serde_json::to_value(&tagged).unwrap_or(Value::Null);
        earlier.push((seq, part_event(seq, &data)));
    }
    store
        .append_messages(&stored.session_id, &turn_messages(&own))
        .await
        .map_err(|e| e.to_string())?;
    let history = store
        .messages(&stored.session_id)
        .await
        .map_err(|e| e.to_string())?;
    let calls = approvals::CallKeys::default();
    let questions = approvals::LoggedQuestions::default();
    let approver = approvals::HttpApprover::new(
        stored.id.clone(),
        stored.agent.clone(),
        server.approvals.clone(),
    )
    .with_store(store.clone(), calls.clone(), server.live.stopping.clone())
    .with_sub_runs_after(sub_runs_before)
    .with_logged_questions(questions.clone());
    let approvals = RunApprovals::asking(Arc::new(approver));
    let run = agent
        .handle
        .run_with(history, CancellationToken::new(), approvals)
        .await
        .map_err(|e| e.to_string())?;
    ticket.register(&stored.id, &stored.agent, run.id());
    launch(
        server,
        store,
        (log, earlier),
        (ticket, &stored.agent),
        &stored.session_id,
        (calls, questions, sub_runs_before),
        run,
    );
    Ok(())
}

/// Runs an approved call of a resumed run once, recorded before it is
/// sent and when it answered, through the agent's tool bridge.
async fn call_once(
    store: &Store,
    run_id: &str,
    agent: &super::Agent,
    q: &wma_agent::ApprovalRequest,
) -> AgentStreamPart {
    use wma_agent::{CallContext, ToolError, ToolErrorCode, ToolHost};
    let failed = |code, message: String| AgentStreamPart::ToolError {
        call_id: q.call_id.clone(),
        name: q.tool.clone(),
        error: ToolError::new(code, message),
    };
    let Some(tools) = &agent.tools else {
        return failed(
            ToolErrorCode::Unavailable,
            "the agent has no tools on this host".to_string(),
        );
    };
    let record = match store
        .begin_call(run_id, &q.agent, &q.call_id, &q.tool, &q.arguments)
        .await
    {
        Ok(record) => record,
        Err(e) => {
            return failed(
                ToolErrorCode::Denied,
                format!("the host could not record the call before sending it: {e}"),
            );
        }
    };
    // The key goes with the call to sources that take one.
    let context = CallContext::new().with_idempotency_key(record.idempotency_key.clone());
    let (part, output, is_error) = match tools
        .call_tool_with(
            &q.tool,
            q.arguments.clone(),
            &context,
            CancellationToken::new(),
        )
        .await
    {
        Ok(output) => (
            AgentStreamPart::ToolResult {
                call_id: q.call_id.clone(),
                name: q.tool.clone(),
                output: output.clone(),
            },
            output,
            false,
        ),
        Err(error) => {
            let text = error.to_string();
            (failed(error.code, error.message.clone()), text, true)
        }
    };
    if let Err(e) = store
        .finish_call(&record.idempotency_key, &output, is_error)
        .await
    {
        tracing::warn!(run_id, error = %e, "the call's answer was not recorded");
    }
    part
}
