//! Sessions of `wma serve`, on the host's [`Store`]: the `/v1/sessions`
//! endpoints, reconnecting to a run's events with `Last-Event-ID`, and
//! pending approvals that a restart keeps (listed and answered here; the
//! run that goes on is started in `runs.rs`).

use std::net::IpAddr;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use wma_agent::{ApprovalAnswer, ChatMessage};
use wma_store::{Approval, RunStatus, Store, StoreError};

use crate::approvals::PendingApproval;
use crate::body::{ContinueBody, RunBody, SessionBody};
use crate::book::is_id;
use crate::reply::{
    error, event_stream, json_response, no_store, no_store_message, part_event, runtime_error,
    store_error,
};
use crate::runs::{resume, start_durable};
use crate::state::Server;

/// Most sessions `GET /v1/sessions` lists (the newest).
pub const SESSIONS_LISTED: u32 = 200;

/// The store and the session id of a `/v1/sessions/{session}` request, or
/// the status and message that refuse it: no store, or an id that is not one.
fn store_and_session<'a>(
    server: &'a Server,
    id: &str,
) -> Result<(&'a Store, String), (StatusCode, String)> {
    let Some(store) = &server.api.store else {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            no_store_message().to_string(),
        ));
    };
    if !is_id(id) {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("`{id}` is not a session id"),
        ));
    }
    Ok((store, id.to_ascii_lowercase()))
}

/// `POST /v1/sessions`.
pub(crate) async fn create(server: &Server, body: SessionBody) -> Response {
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
pub(crate) async fn list(server: &Server) -> Response {
    let Some(store) = &server.api.store else {
        return no_store();
    };
    match store.list_sessions(SESSIONS_LISTED).await {
        Ok(sessions) => json_response(StatusCode::OK, &json!({"sessions": sessions})),
        Err(e) => store_error(&e),
    }
}

/// `GET /v1/sessions/{session}`: the session, its messages and its runs.
pub(crate) async fn read(server: &Server, id: &str) -> Response {
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
pub(crate) async fn delete(server: &Server, id: &str) -> Response {
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
) -> Response {
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
        return runtime_error(&e);
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

/// `GET /v1/runs/{run}/events`: the parts numbered above `Last-Event-ID`
/// (all without it), then the live rest while the run runs here.
pub(crate) async fn events(server: &Server, run: &str, last_event_id: Option<&str>) -> Response {
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
        let events = live.feed.follow(after);
        return event_stream(events, Some(&run), Some(&stored.session_id));
    }
    let parts = match store.parts_after(&run, after).await {
        Ok(parts) => parts,
        Err(e) => return store_error(&e),
    };
    let events: Vec<_> = parts
        .iter()
        .map(|p| part_event(p.seq, &p.event_data()))
        .collect();
    event_stream(
        futures::stream::iter(events),
        Some(&run),
        Some(&stored.session_id),
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
        let mut value = serde_json::to_value(PendingApproval {
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
) -> Option<Response> {
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
