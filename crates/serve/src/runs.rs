//! Starting runs and driving them: a run streamed from memory (a server
//! without a store), and a durable run (with one), which a task of its own
//! drives, appending its parts to the store's log as they stream (the
//! part's sequence number is the SSE event's `id:`), so that a client
//! that goes away does not stop it (Stop does) and reconnecting gets what
//! it missed and then the live rest. A run the last process left waiting
//! for approval goes on here once it is answered ([`resume`]).
//!
//! Every way to start a run comes through here: `POST
//! /v1/agents/{agent}/runs`, `POST /v1/sessions/{session}/runs` and the
//! chat completions, which answer from the same event stream.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use axum::response::sse::Event;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use wma_agent::{AgentStreamPart, ApprovalAnswer, ChatMessage};
use wma_runtime::{RunApprovals, TaggedPart};
use wma_store::{Approval, CallRecordProblem, CallRecorder, RunLog, RunStatus, Store};

use crate::api::Agent;
use crate::approvals;
use crate::body::RunBody;
use crate::book::{Feed, LiveRun, LiveRuns, RUN_ID_BYTES, RunTicket};
use crate::mend::{answer_cut_calls, turn_messages};
use crate::reply::{
    error, event_stream, named_event, no_store, part_event, runtime_error, store_error,
};
use crate::state::Server;
use crate::token;

/// A slot among the client's runs (held as long as the run) and a fresh
/// run id, or the answer that refuses the run.
fn admit(server: &Server, client: IpAddr) -> Result<(RunTicket, String), Box<Response>> {
    let limit = server.options.max_runs_per_client;
    let Some(ticket) = server.runs.admit(client, limit) else {
        return Err(Box::new(error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "this client already has {limit} runs streaming (the server's limit); try again when one finishes"
            ),
        )));
    };
    match token::random_hex(RUN_ID_BYTES) {
        Ok(id) => Ok((ticket, id)),
        Err(e) => Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            e.to_string(),
        ))),
    }
}

/// Starts a run of agent `name` for `client` and answers with its event
/// stream: `POST /v1/agents/{agent}/runs`, and the chat completions
/// without a session. With a store, the run gets a session of its own.
pub(crate) async fn start_run(
    server: &Server,
    client: IpAddr,
    name: &str,
    body: RunBody,
) -> Response {
    let Some(agent) = server.api.agent(name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        );
    };
    let rules = match body.approval_rules() {
        Ok(rules) => rules,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let messages = match (body.input, body.messages) {
        (Some(input), None) => vec![ChatMessage::user(input)],
        (None, Some(messages)) if !messages.is_empty() => messages,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give either `input` (a request) or `messages` (a conversation)",
            );
        }
    };
    // Before the store keeps a session and a run for it.
    if let Err(e) = wma_runtime::check_request(&messages) {
        return runtime_error(&e);
    }
    if server.api.store.is_some() {
        return start_in_new_session(server, client, name, messages, rules).await;
    }
    let (mut ticket, id) = match admit(server, client) {
        Ok(admitted) => admitted,
        Err(refused) => return *refused,
    };
    // The run's questions go on the server's list under its public id.
    let approver =
        approvals::HttpApprover::new(id.clone(), name.to_string(), server.approvals.clone());
    let approvals = RunApprovals::asking(Arc::new(approver)).with_rules(rules);
    let run = match agent
        .handle
        .run_with(messages, CancellationToken::new(), approvals)
        .await
    {
        Ok(run) => run,
        Err(e) => return runtime_error(&e),
    };
    ticket.register(&id, name, run.id());
    let first = named_event("run", &json!({"agent": name, "run_id": id}));
    // The stream ends after the run's terminal part; dropping it (the
    // client went away) stops the run, frees the client's slot and
    // forgets the id.
    let parts = run.tagged().map(move |part: TaggedPart| {
        let _ticket = &ticket;
        named_event("part", &serde_json::to_value(&part).unwrap_or(Value::Null))
    });
    let events = futures::stream::once(async move { first }).chain(parts);
    event_stream(events, Some(&id), None)
}

/// `POST /v1/agents/{agent}/runs` on a server with a store: the run gets a
/// session of its own holding the conversation it was given.
async fn start_in_new_session(
    server: &Server,
    client: IpAddr,
    agent: &str,
    messages: Vec<ChatMessage>,
    rules: Vec<wma_agent::ApprovalRule>,
) -> Response {
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
pub(crate) async fn start_durable(
    server: &Server,
    client: IpAddr,
    name: &str,
    session_id: &str,
    history: Vec<ChatMessage>,
    new: Vec<ChatMessage>,
    rules: Vec<wma_agent::ApprovalRule>,
) -> Response {
    let Some(store) = server.api.store.clone() else {
        return no_store();
    };
    let Some(agent) = server.api.agent(name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("there is no agent named `{name}`"),
        );
    };
    let (mut ticket, id) = match admit(server, client) {
        Ok(admitted) => admitted,
        Err(refused) => return *refused,
    };
    // The run's row is queued ahead of its parts and written with the first
    // of them, so the run waits for no commit to start; the callers checked
    // that the session exists.
    let (_run, log) = RunLog::start(&store, session_id, name, Some(&id));
    let calls = Arc::new(CallRecorder::new(store.clone(), id.clone()));
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
    let first = named_event(
        "run",
        &json!({"agent": name, "run_id": id, "session_id": session_id}),
    );
    let events = futures::stream::once(async move { first }).chain(feed.follow(0));
    event_stream(events, Some(&id), Some(session_id))
}

/// Files a started run as live and spawns its driver; returns its feed.
/// Files a started run as live and spawns its driver; returns its feed.
/// `earlier`: the events of parts already in `log` that the feed starts
/// with (a resumed run's: those stored before the restart, then the
/// decision and its outcome).
fn launch(
    server: &Server,
    store: Store,
    (log, earlier): (RunLog, Vec<(u64, Event)>),
    (ticket, agent): (RunTicket, &str),
    session_id: &str,
    (calls, questions, sub_runs_before): (Arc<CallRecorder>, approvals::LoggedQuestions, u64),
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
    calls: Arc<CallRecorder>,
    /// Questions whose part is logged, which the run's approver waits for
    /// before it marks the run waiting.
    questions: approvals::LoggedQuestions,
    /// Sub-agent runs the run held before this loop (a resumed run's):
    /// this loop's are numbered after them ([`approvals::sub_run_after`]).
    sub_runs_before: u64,
}

/// Reads the run to its end: each part into the log and onto the feed;
/// the answer appended to the session before the run's terminal part is
/// logged; then the log flushed, a run that ended without its terminal
/// part marked interrupted.
async fn drive(run: DriveRun, mut parts: wma_runtime::TaggedStream) {
    // However the driver ends, no question waits for it any longer.
    let _questions = run.questions.end_on_drop();
    let mut own = Vec::new();
    let mut kept = false;
    let stopping = || run.live.stopping.load(std::sync::atomic::Ordering::SeqCst);
    while let Some(part) = parts.next().await {
        let mut part: TaggedPart = part;
        // The terminal part marks the run ended in the store and on the
        // feed: a client that reads the session once it sees the end must
        // find the answer there, so the session gets it first.
        if part.depth == 0 && part.part.is_terminal() && !kept && !stopping() {
            keep_turn(
                &run,
                [own.as_slice(), std::slice::from_ref(&part.part)].concat(),
            )
            .await;
            kept = true;
        }
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
        // The answer of a call recorded before it was sent (a
        // consequential or approved one).
        if let Some((call, output, is_error)) = part.call_answer() {
            run.calls.answer(&call, output, is_error);
        }
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
        if !kept {
            keep_turn(&run, own).await;
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
    } else {
        // The host's shutdown waits for no answer being recorded; one that
        // fails is still said.
        let (calls, run_id) = (run.calls.clone(), run.id.clone());
        tokio::spawn(async move { warn_of(&run_id, calls.answers_recorded().await) });
    }
    run.live.runs.lock().remove(&run.id);
    run.feed.finish();
    drop(run.ticket);
}

/// Appends the run's turn (`own`: its own agent's parts) to its session.
/// A call recorded before it was sent whose answer never came (the run
/// stopped while it ran) may or may not have happened: in doubt now, as
/// after a crash, and the session's history says so, as `wma chat`'s
/// does. At shutdown this is not called: such calls stay in flight, and
/// the next start marks them.
async fn keep_turn(run: &DriveRun, mut own: Vec<AgentStreamPart>) {
    let ended = run.calls.end().await;
    warn_of(&run.id, ended.problems);
    let in_doubt: HashMap<String, String> = ended
        .unanswered
        .into_iter()
        .filter(|((agent, sub_run, _), _)| *agent == run.agent && sub_run.is_empty())
        .map(|((_, _, call_id), key)| (call_id, key))
        .collect();
    answer_cut_calls(&mut own, &in_doubt, "the run was stopped");
    let answer = turn_messages(&own);
    if let Err(e) = run.store.append_messages(&run.session_id, &answer).await {
        tracing::warn!(run_id = %run.id, error = %e, "the run's answer was not added to its session");
    }
}

/// Logs the writes of the run's call records that failed, each in the
/// words the recorder gives it.
fn warn_of(run_id: &str, problems: Vec<CallRecordProblem>) {
    for problem in problems {
        tracing::warn!(run_id, "{problem}");
    }
}

/// Goes on with a run the last process left waiting for `approval`, now
/// decided: the decision and the call's outcome are appended to the run's
/// log (its numbering goes on), the interrupted step's messages to the
/// session, and a new loop of the run's agent starts from the session's
/// history under the run's id.
pub(crate) async fn resume(
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
    let mut earlier: Vec<(u64, Event)> = logged
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
    let calls = Arc::new(CallRecorder::new(store.clone(), stored.id.clone()));
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
    agent: &Agent,
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
