//! Mending a conversation whose turn was cut short, the one behaviour
//! `wma chat` and `wma serve` share.
//!
//! A turn is cut when its run ends without its answer being kept: the
//! person stopped it in the middle of a call, or its host went away (a
//! crash, `kill -9`, a shutdown that gave up on it). The session then holds
//! a request, and maybe calls, that nobody answered, and the next turn's
//! model would read a history that never says what became of them. Mending
//! adds what the run's log and call records hold of the turn, with each call
//! that never answered followed by a `cancelled` error saying so; a call
//! recorded before it was sent may have happened, and its error says it is
//! in doubt and not to call it again before the person checked. The host
//! never resends such a call itself.

use std::collections::HashMap;

use wma_agent::{AgentStreamPart, ChatMessage, ToolCall, ToolError, ToolErrorCode};
use wma_store::{CallRecord, CallStatus, RunStatus, Store, StoreError};

/// Why a cut turn's calls never answered, as their errors say it.
pub const HOST_WENT_AWAY: &str = "the host went away";

/// What mending one session added.
#[derive(Debug, Clone, PartialEq)]
pub struct Mended {
    /// The session.
    pub session_id: String,
    /// The interrupted run whose turn was mended.
    pub run_id: String,
    /// The messages added to the session, in order.
    pub added: Vec<ChatMessage>,
    /// The turn's calls that were recorded before they were sent and never
    /// answered: each may or may not have happened, for a person to check.
    pub in_doubt: Vec<CallRecord>,
}

/// Mends `session` when its last run was interrupted before the session
/// kept all of its answer: the messages of the run's own (depth 0) parts,
/// each call it made that never answered followed by its error (in doubt
/// for a call recorded before it was sent), that the session does not hold
/// yet after its last request are appended to it. `messages` are the
/// session's messages as the caller read them. `None` when nothing was
/// cut (the last run ended, runs, waits for approval, or its answer is
/// kept already), so mending twice adds nothing the second time.
pub async fn mend_cut_turn(
    store: &Store,
    session: &str,
    messages: &[ChatMessage],
) -> Result<Option<Mended>, StoreError> {
    // The turn's answer so far: what follows the session's last request.
    let Some(request) = messages
        .iter()
        .rposition(|m| matches!(m, ChatMessage::User { .. }))
    else {
        return Ok(None);
    };
    let kept = &messages[request + 1..];
    let Some(run) = store.runs_of_session(session).await?.pop() else {
        return Ok(None);
    };
    if run.status != RunStatus::Interrupted {
        return Ok(None);
    }
    let mut own: Vec<AgentStreamPart> = store
        .parts_after(&run.id, 0)
        .await?
        .into_iter()
        .filter(|p| p.depth == 0)
        .map(|p| p.part)
        .collect();
    let calls = store.calls_of_run(&run.id).await?;
    let mut in_doubt = HashMap::new();
    // The run's own calls: a sub-agent's are answered inside its run.
    for call in calls
        .iter()
        .filter(|c| c.agent == run.agent && c.sub_run.is_empty())
    {
        // A call recorded before it was sent whose part the log did not
        // keep (the log commits in bursts) is still one the model made.
        let logged = own.iter().any(
            |p| matches!(p, AgentStreamPart::ToolCall { call_id, .. } if *call_id == call.call_id),
        );
        if !logged {
            let part = AgentStreamPart::ToolCall {
                call_id: call.call_id.clone(),
                name: call.tool.clone(),
                arguments: call.arguments.clone(),
            };
            // Before its answer when the log has that (a resumed run's
            // approved call), so the turn reads as the session kept it.
            let answered_at = own.iter().position(|p| answers(p, &call.call_id));
            match answered_at {
                Some(at) => own.insert(at, part),
                None => own.push(part),
            }
        }
        if matches!(call.status, CallStatus::InDoubt | CallStatus::InFlight) {
            in_doubt.insert(call.call_id.clone(), call.clone());
        }
    }
    let keys = in_doubt
        .iter()
        .map(|(id, c)| (id.clone(), c.idempotency_key.clone()))
        .collect();
    let cut = answer_cut_calls(&mut own, &keys, HOST_WENT_AWAY);
    let turn = turn_messages(&own);
    // What the session kept of the turn must be where the turn starts (a
    // resumed run's first step, or nothing); anything else is not this
    // run's answer, and is left alone.
    if turn.len() <= kept.len() || turn[..kept.len()] != *kept {
        return Ok(None);
    }
    let added = turn[kept.len()..].to_vec();
    store.append_messages(session, &added).await?;
    let in_doubt = cut
        .iter()
        .filter_map(|(call_id, _)| in_doubt.remove(call_id))
        .collect();
    Ok(Some(Mended {
        session_id: session.to_string(),
        run_id: run.id,
        added,
        in_doubt,
    }))
}

/// Mends the session of each run in `runs` (the runs a host found
/// interrupted when it opened the store, or gave up on at shutdown) whose
/// turn was cut ([`mend_cut_turn`]). A session is mended once however many
/// of its runs are named; a run whose session has a later run is not the
/// session's last turn and is left alone. Each session's outcome, in the
/// order first named.
pub async fn mend_sessions_of(
    store: &Store,
    runs: &[String],
) -> Vec<(String, Result<Option<Mended>, StoreError>)> {
    let mut sessions: Vec<String> = Vec::new();
    let mut outcomes = Vec::new();
    for run in runs {
        let session = match store.run(run).await {
            Ok(Some(run)) => run.session_id,
            Ok(None) => continue,
            Err(e) => {
                outcomes.push((format!("of run {run}"), Err(e)));
                continue;
            }
        };
        if sessions.contains(&session) {
            continue;
        }
        sessions.push(session.clone());
        let mended = match store.messages(&session).await {
            Ok(messages) => mend_cut_turn(store, &session, &messages).await,
            Err(e) => Err(e),
        };
        outcomes.push((session, mended));
    }
    outcomes
}

/// Whether `part` answers the call `id`.
fn answers(part: &AgentStreamPart, id: &str) -> bool {
    matches!(part, AgentStreamPart::ToolResult { call_id, .. }
        | AgentStreamPart::ToolError { call_id, .. } if call_id == id)
}

/// Gives each call among a turn's own parts that never answered (the turn
/// was stopped or its host went away in the middle) a `cancelled` error
/// saying `why`, so that the history the model reads answers every call it
/// made. A call recorded before it was sent (its key in `in_doubt`, by
/// call id) may have happened: its error says so, and not to call it
/// again before the person checked. The errors go before the turn's
/// terminal part, in the step the calls were made in. Returns the calls
/// answered so, as (call id, tool).
pub fn answer_cut_calls(
    own: &mut Vec<AgentStreamPart>,
    in_doubt: &HashMap<String, String>,
    why: &str,
) -> Vec<(String, String)> {
    let cut: Vec<(String, String)> = own
        .iter()
        .filter_map(|p| match p {
            AgentStreamPart::ToolCall { call_id, name, .. }
                if !own.iter().any(|q| answers(q, call_id)) =>
            {
                Some((call_id.clone(), name.clone()))
            }
            _ => None,
        })
        .collect();
    let at = match own.last() {
        Some(last) if last.is_terminal() => own.len() - 1,
        _ => own.len(),
    };
    let errors = cut.iter().map(|(call_id, name)| {
        let message = match in_doubt.get(call_id) {
            Some(key) => format!(
                "{why} while this call was in flight: it may or may not have happened (in doubt, key {key}); do not call it again before the person checked"
            ),
            None => format!("{why} before this call answered"),
        };
        AgentStreamPart::ToolError {
            call_id: call_id.clone(),
            name: name.clone(),
            error: ToolError::new(ToolErrorCode::Cancelled, message),
        }
    });
    own.splice(at..at, errors.collect::<Vec<_>>());
    cut
}

/// The messages a run adds to its conversation, from its own (depth 0)
/// parts: each step's text and calls as an assistant message, followed by
/// the calls' results. Rules and approvals are about the run, not the
/// conversation (a denied call's error is).
pub fn turn_messages(parts: &[AgentStreamPart]) -> Vec<ChatMessage> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let mut flush =
        |text: &mut String, calls: &mut Vec<ToolCall>, results: &mut Vec<ChatMessage>| {
            if !text.is_empty() || !calls.is_empty() {
                out.push(ChatMessage::assistant_calls(
                    std::mem::take(text),
                    std::mem::take(calls),
                ));
                out.append(results);
            }
        };
    for part in parts {
        match part {
            AgentStreamPart::Rule { .. }
            | AgentStreamPart::ApprovalRequested { .. }
            | AgentStreamPart::ApprovalDecided { .. } => {}
            AgentStreamPart::MessageStart { .. }
            | AgentStreamPart::Finish { .. }
            | AgentStreamPart::Error { .. } => flush(&mut text, &mut calls, &mut results),
            AgentStreamPart::Text { text: t } => {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
            AgentStreamPart::ToolCall {
                call_id,
                name,
                arguments,
            } => calls.push(ToolCall::new(call_id, name, arguments.clone())),
            AgentStreamPart::ToolResult {
                call_id,
                name,
                output,
            } => results.push(ChatMessage::tool_result(call_id, name, output)),
            AgentStreamPart::ToolError {
                call_id,
                name,
                error,
            } => results.push(ChatMessage::tool_error(call_id, name, error.to_string())),
        }
    }
    flush(&mut text, &mut calls, &mut results);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wma_agent::FinishReason;

    fn call(id: &str, tool: &str) -> AgentStreamPart {
        AgentStreamPart::ToolCall {
            call_id: id.into(),
            name: tool.into(),
            arguments: json!({}),
        }
    }

    #[test]
    fn a_stopped_turns_calls_are_each_answered_in_its_history() {
        let mut own = vec![
            AgentStreamPart::MessageStart { step: 1 },
            call("call_1_1", "order_status"),
            call("call_1_2", "place_order"),
            call("call_1_3", "view_cart"),
            AgentStreamPart::ToolResult {
                call_id: "call_1_1".into(),
                name: "order_status".into(),
                output: "none".into(),
            },
            AgentStreamPart::Finish {
                reason: FinishReason::Aborted,
            },
        ];
        let in_doubt = HashMap::from([("call_1_2".to_string(), "k3y".to_string())]);
        let cut = answer_cut_calls(&mut own, &in_doubt, "the person stopped the reply");
        assert_eq!(
            cut,
            [
                ("call_1_2".to_string(), "place_order".to_string()),
                ("call_1_3".to_string(), "view_cart".to_string())
            ]
        );
        assert!(own.last().unwrap().is_terminal(), "{own:?}");
        let messages: Vec<serde_json::Value> = turn_messages(&own)
            .iter()
            .map(|m| serde_json::to_value(m).unwrap())
            .collect();
        assert_eq!(messages.len(), 4, "{messages:?}");
        assert_eq!(messages[0]["tool_calls"].as_array().unwrap().len(), 3);
        assert_eq!(messages[1]["content"], "none");
        assert_eq!(messages[2]["call_id"], "call_1_2");
        let doubt = messages[2]["content"].as_str().unwrap();
        assert!(
            doubt.starts_with(
                "Error [cancelled]: the person stopped the reply while this call was in flight"
            ) && doubt.contains("in doubt, key k3y"),
            "{doubt}"
        );
        assert_eq!(
            messages[3]["content"],
            "Error [cancelled]: the person stopped the reply before this call answered"
        );
        // A turn whose calls all answered is left as it was.
        let before = own.clone();
        assert!(answer_cut_calls(&mut own, &HashMap::new(), "-").is_empty());
        assert_eq!(own, before);
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!(
            "wma-mend-{name}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ))
    }

    /// A session whose run was cut in the middle of a recorded call: the
    /// store reopened under the same host marks the run interrupted and
    /// the call in doubt.
    async fn cut_session(dir: &std::path::Path) -> (Store, String, CallRecord) {
        use wma_store::StoreOptions;
        let store = Store::open(StoreOptions::in_data_dir(dir)).await.unwrap();
        let session = store.create_session("buyer", "").await.unwrap().id;
        let run = store.start_run(&session, "buyer", None).await.unwrap();
        store
            .append_messages(&session, &[ChatMessage::user("Buy a stove")])
            .await
            .unwrap();
        for part in [
            AgentStreamPart::MessageStart { step: 1 },
            AgentStreamPart::Text {
                text: "Ordering.".into(),
            },
        ] {
            store.append_part(&run.id, "buyer", 0, &part).await.unwrap();
        }
        // The call's part never reached the log; its record did.
        let record = store
            .begin_call(
                &run.id,
                "buyer",
                "call_1_1",
                "hold_order",
                &json!({"item": "stove"}),
            )
            .await
            .unwrap();
        // Gone without closing: the next open recovers it.
        drop(store);
        let store = Store::open(StoreOptions::in_data_dir(dir)).await.unwrap();
        assert_eq!(
            store.recovery().interrupted_runs,
            std::slice::from_ref(&run.id)
        );
        (store, session, record)
    }

    #[tokio::test]
    async fn a_cut_turn_is_mended_once_with_its_call_in_doubt() {
        let dir = scratch("once");
        let (store, session, record) = cut_session(&dir).await;
        let runs = store.recovery().interrupted_runs.clone();
        let outcomes = mend_sessions_of(&store, &[runs.clone(), runs.clone()].concat()).await;
        assert_eq!(outcomes.len(), 1, "one session, mended once: {outcomes:?}");
        let mended = outcomes[0].1.as_ref().unwrap().clone().expect("mended");
        assert_eq!(mended.run_id, runs[0]);
        assert_eq!(mended.in_doubt.len(), 1);
        assert_eq!(mended.in_doubt[0].idempotency_key, record.idempotency_key);
        let messages = store.messages(&session).await.unwrap();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert_eq!(messages[1..], mended.added[..]);
        let values: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| serde_json::to_value(m).unwrap())
            .collect();
        assert_eq!(values[1]["content"], "Ordering.");
        assert_eq!(values[1]["tool_calls"][0]["id"], "call_1_1");
        assert_eq!(
            values[1]["tool_calls"][0]["arguments"],
            json!({"item": "stove"})
        );
        let error = values[2]["content"].as_str().unwrap();
        assert!(
            error
                .starts_with("Error [cancelled]: the host went away while this call was in flight")
                && error.contains(&record.idempotency_key),
            "{error}"
        );
        // Mended already: nothing more, from either way in.
        assert_eq!(
            mend_cut_turn(&store, &session, &messages).await.unwrap(),
            None
        );
        let again = mend_sessions_of(&store, &runs).await;
        assert!(matches!(again[..], [(_, Ok(None))]), "{again:?}");
        assert_eq!(store.messages(&session).await.unwrap(), messages);
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn only_what_the_session_lacks_of_a_cut_turn_is_added() {
        let dir = scratch("tail");
        let (store, session, record) = cut_session(&dir).await;
        let run = store.recovery().interrupted_runs[0].clone();
        // The session kept the turn's first message already (as a run
        // resumed after an approval keeps its first step).
        let first = ChatMessage::assistant_calls(
            "Ordering.",
            vec![wma_agent::ToolCall::new(
                "call_1_1",
                "hold_order",
                json!({"item": "stove"}),
            )],
        );
        store
            .append_messages(&session, std::slice::from_ref(&first))
            .await
            .unwrap();
        let messages = store.messages(&session).await.unwrap();
        let mended = mend_cut_turn(&store, &session, &messages)
            .await
            .unwrap()
            .expect("mended");
        assert_eq!(mended.run_id, run);
        assert_eq!(mended.added.len(), 1, "only the call's error: {mended:?}");
        assert!(matches!(&mended.added[0], ChatMessage::Tool { .. }));
        assert_eq!(mended.in_doubt[0].idempotency_key, record.idempotency_key);
        // A session whose messages after the request are not the start of
        // the run's turn is not this run's to mend.
        let other = scratch("other");
        let (store2, session2, _) = cut_session(&other).await;
        store2
            .append_messages(&session2, &[ChatMessage::assistant("Something else.")])
            .await
            .unwrap();
        let messages = store2.messages(&session2).await.unwrap();
        assert_eq!(
            mend_cut_turn(&store2, &session2, &messages).await.unwrap(),
            None
        );
        assert_eq!(store2.messages(&session2).await.unwrap(), messages);
        store.close().await;
        store2.close().await;
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(other);
    }
}
