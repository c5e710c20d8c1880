//! The consequential calls of one run as a host records them: each begun
//! (committed `in-flight`) before it is sent, its answer recorded as it
//! streams by, and each that never answered marked in doubt when the run
//! ends. `wma chat` (a turn of a kept chat is a run) and `wma serve` keep
//! their runs' calls through the one [`CallRecorder`], so that both
//! answer a stop in the middle of a call alike.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::{Store, StoreError};

/// A call within a run: (calling agent, the sub-agent run it is in — `""`
/// for the run's own, as the run's parts carry it — and call id). Two runs
/// of one sub-agent in a run number their calls alike, so the call id
/// alone would take the answer of the one for the other's.
pub type RunCallId = (String, String, String);

/// A write of the call record that failed. The host goes on (the call was
/// made, or not, either way); the record says less than what happened.
#[derive(Debug, thiserror::Error)]
pub enum CallRecordProblem {
    /// A call's answer was not recorded: the call stays `in-flight`, and
    /// the next start of the host marks it in doubt.
    #[error("the answer of call {key} was not recorded: {error}")]
    AnswerNotRecorded {
        /// The call's idempotency key.
        key: String,
        /// The store's reason.
        error: StoreError,
    },
    /// A call that never answered was not marked in doubt: it stays
    /// `in-flight` until the next start of the host marks it.
    #[error("call {key}, cut short, was not marked in doubt: {error}")]
    NotMarkedInDoubt {
        /// The call's idempotency key.
        key: String,
        /// The store's reason.
        error: StoreError,
    },
}

/// What [`CallRecorder::end`] found of the run's calls.
#[derive(Debug, Default)]
pub struct EndedCalls {
    /// The calls that never answered (the run was stopped while they
    /// ran), by call: their idempotency keys.
    pub unanswered: HashMap<RunCallId, String>,
    /// The keys of those that this end marked in doubt; one the store had
    /// answered or marked already is not among them.
    pub in_doubt: HashSet<String>,
    /// The writes that failed, answers' and marks' alike.
    pub problems: Vec<CallRecordProblem>,
}

/// The calls of one run recorded before they were sent and not answered
/// yet. The run's approver [`begin`](Self::begin)s each call that needs a
/// record; whoever reads the run's parts hands it each call's answer
/// ([`answer`](Self::answer)); the run's end ([`end`](Self::end)) marks
/// the calls that never answered in doubt: they may or may not have
/// happened, as after a crash.
pub struct CallRecorder {
    store: Store,
    run_id: String,
    /// The idempotency keys of the calls begun and not answered yet.
    in_flight: Mutex<HashMap<RunCallId, String>>,
    /// The answers being recorded, off the path of the run's parts; the
    /// run's end waits for them.
    answers: Mutex<Vec<JoinHandle<Option<CallRecordProblem>>>>,
}

impl CallRecorder {
    /// Records the calls of the run `run_id` in `store`.
    pub fn new(store: Store, run_id: impl Into<String>) -> Self {
        Self {
            store,
            run_id: run_id.into(),
            in_flight: Mutex::new(HashMap::new()),
            answers: Mutex::new(Vec::new()),
        }
    }

    /// Records a call of `agent` in the sub-agent run `sub_run` `in-flight`
    /// ([`Store::begin_call_in`]), committed before this returns, and
    /// returns its idempotency key, which goes with the call to its
    /// source. An error means the call must not be sent: nothing would
    /// say it happened.
    pub async fn begin(
        &self,
        agent: &str,
        sub_run: &str,
        call_id: &str,
        tool: &str,
        arguments: &Value,
    ) -> Result<String, StoreError> {
        let record = self
            .store
            .begin_call_in(&self.run_id, agent, sub_run, call_id, tool, arguments)
            .await?;
        self.in_flight.lock().insert(
            (agent.to_string(), sub_run.to_string(), call_id.to_string()),
            record.idempotency_key.clone(),
        );
        Ok(record.idempotency_key)
    }

    /// The idempotency key of `call`, when it was begun and has not
    /// answered yet.
    pub fn in_flight(&self, call: &RunCallId) -> Option<String> {
        self.in_flight.lock().get(call).cloned()
    }

    /// The answer of `call` (its result's text, or its error's): recorded
    /// when the call was begun here, off the caller's path (the run's
    /// parts go on streaming meanwhile; [`end`](Self::end) waits for it).
    /// Returns whether it was; the answer of a call no record waits for
    /// (one that needed none) is ignored. Called within a Tokio runtime,
    /// which records it.
    pub fn answer(&self, call: &RunCallId, output: String, is_error: bool) -> bool {
        let Some(key) = self.in_flight.lock().remove(call) else {
            return false;
        };
        let store = self.store.clone();
        let recording = tokio::spawn(async move {
            let error = store.finish_call(&key, &output, is_error).await.err()?;
            Some(CallRecordProblem::AnswerNotRecorded { key, error })
        });
        self.answers.lock().push(recording);
        true
    }

    /// Waits for the answers handed over so far to be recorded; returns
    /// the writes that failed.
    pub async fn answers_recorded(&self) -> Vec<CallRecordProblem> {
        let answers = std::mem::take(&mut *self.answers.lock());
        let mut problems = Vec::new();
        for recording in answers {
            if let Ok(Some(problem)) = recording.await {
                problems.push(problem);
            }
        }
        problems
    }

    /// The run ended: its answers are recorded, and each call that never
    /// answered (the run was stopped while it ran) is marked in doubt now,
    /// as a restart would mark it, for a person to check; none is sent
    /// again.
    pub async fn end(&self) -> EndedCalls {
        let mut problems = self.answers_recorded().await;
        let unanswered = std::mem::take(&mut *self.in_flight.lock());
        let mut in_doubt = HashSet::new();
        for key in unanswered.values() {
            match self.store.abandon_call(key).await {
                Ok(true) => {
                    in_doubt.insert(key.clone());
                }
                Ok(false) => {}
                Err(error) => problems.push(CallRecordProblem::NotMarkedInDoubt {
                    key: key.clone(),
                    error,
                }),
            }
        }
        EndedCalls {
            unanswered,
            in_doubt,
            problems,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CallStatus, RunStatus, StoreOptions};
    use serde_json::json;

    fn call(agent: &str, sub_run: &str, call_id: &str) -> RunCallId {
        (agent.into(), sub_run.into(), call_id.into())
    }

    /// A store in a folder of its own, with a run going on.
    async fn running() -> (Store, String, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreOptions::in_data_dir(dir.path()))
            .await
            .unwrap();
        let session = store.create_session("main", "").await.unwrap();
        let run = store.start_run(&session.id, "main", None).await.unwrap();
        (store, run.id, dir)
    }

    #[tokio::test]
    async fn a_begun_call_is_in_flight_and_its_answer_is_recorded() {
        let (store, run, _dir) = running().await;
        let calls = CallRecorder::new(store.clone(), run.clone());
        let key = calls
            .begin(
                "main",
                "",
                "call_1_1",
                "place_order",
                &json!({"item": "tent"}),
            )
            .await
            .unwrap();
        let recorded = store.call(&key).await.unwrap().unwrap();
        assert_eq!(recorded.status, CallStatus::InFlight);
        assert_eq!(recorded.run_id, run);
        assert_eq!(
            calls.in_flight(&call("main", "", "call_1_1")),
            Some(key.clone())
        );

        assert!(calls.answer(&call("main", "", "call_1_1"), "placed".into(), false));
        assert_eq!(calls.in_flight(&call("main", "", "call_1_1")), None);
        let ended = calls.end().await;
        assert!(ended.unanswered.is_empty());
        assert!(ended.in_doubt.is_empty());
        assert!(ended.problems.is_empty());
        let recorded = store.call(&key).await.unwrap().unwrap();
        assert_eq!(recorded.status, CallStatus::Answered);
        assert_eq!(recorded.output.as_deref(), Some("placed"));
        assert!(!recorded.is_error);
        store.close().await;
    }

    #[tokio::test]
    async fn a_call_that_never_answered_is_in_doubt_when_the_run_ends() {
        let (store, run, _dir) = running().await;
        let calls = CallRecorder::new(store.clone(), run);
        let cut = calls
            .begin("main", "", "call_1_1", "place_order", &json!({}))
            .await
            .unwrap();
        let ended = calls.end().await;
        assert_eq!(
            ended.unanswered,
            HashMap::from([(call("main", "", "call_1_1"), cut.clone())])
        );
        assert_eq!(ended.in_doubt, HashSet::from([cut.clone()]));
        assert!(ended.problems.is_empty());
        let recorded = store.call(&cut).await.unwrap().unwrap();
        assert_eq!(recorded.status, CallStatus::InDoubt);
        // Nothing is left for a second end.
        assert!(calls.end().await.unanswered.is_empty());
        store.close().await;
    }

    #[tokio::test]
    async fn the_answer_of_a_call_not_begun_here_is_ignored() {
        let (store, run, _dir) = running().await;
        let calls = CallRecorder::new(store.clone(), run.clone());
        let key = calls
            .begin("main", "", "call_1_1", "place_order", &json!({}))
            .await
            .unwrap();
        // Another call id, and the same id of another agent.
        assert!(!calls.answer(&call("main", "", "call_9_9"), "x".into(), false));
        assert!(!calls.answer(&call("helper", "", "call_1_1"), "x".into(), true));
        assert_eq!(
            calls.in_flight(&call("main", "", "call_1_1")),
            Some(key.clone())
        );
        let ended = calls.end().await;
        assert!(ended.problems.is_empty());
        assert_eq!(store.calls_of_run(&run).await.unwrap().len(), 1);
        assert_eq!(
            store.call(&key).await.unwrap().unwrap().status,
            CallStatus::InDoubt
        );
        store.close().await;
    }

    #[tokio::test]
    async fn two_sub_agent_runs_calling_with_one_id_are_kept_apart() {
        let (store, run, _dir) = running().await;
        let calls = CallRecorder::new(store.clone(), run);
        let first = calls
            .begin("helper", "1", "call_1_1", "place_order", &json!({"n": 1}))
            .await
            .unwrap();
        let second = calls
            .begin("helper", "2", "call_1_1", "place_order", &json!({"n": 2}))
            .await
            .unwrap();
        assert_ne!(first, second);
        assert!(calls.answer(&call("helper", "2", "call_1_1"), "failed".into(), true));
        let ended = calls.end().await;
        assert_eq!(
            ended.unanswered,
            HashMap::from([(call("helper", "1", "call_1_1"), first.clone())])
        );
        let first = store.call(&first).await.unwrap().unwrap();
        assert_eq!(first.status, CallStatus::InDoubt);
        let second = store.call(&second).await.unwrap().unwrap();
        assert_eq!(second.status, CallStatus::Answered);
        assert!(second.is_error);
        assert_eq!(second.output.as_deref(), Some("failed"));
        store.close().await;
    }

    #[tokio::test]
    async fn writes_the_store_refuses_are_returned_at_the_end() {
        let (store, run, _dir) = running().await;
        let calls = CallRecorder::new(store.clone(), run);
        let answered = calls
            .begin("main", "", "call_1_1", "place_order", &json!({}))
            .await
            .unwrap();
        let cut = calls
            .begin("main", "", "call_2_1", "place_order", &json!({}))
            .await
            .unwrap();
        store.close().await;
        assert!(calls.answer(&call("main", "", "call_1_1"), "placed".into(), false));
        let ended = calls.end().await;
        assert_eq!(ended.unanswered.len(), 1);
        assert!(ended.in_doubt.is_empty());
        assert_eq!(ended.problems.len(), 2, "{:?}", ended.problems);
        assert!(matches!(
            &ended.problems[0],
            CallRecordProblem::AnswerNotRecorded { key, .. } if *key == answered
        ));
        assert!(matches!(
            &ended.problems[1],
            CallRecordProblem::NotMarkedInDoubt { key, .. } if *key == cut
        ));
    }

    #[tokio::test]
    async fn a_call_the_store_refuses_is_not_in_flight() {
        let (store, run, _dir) = running().await;
        let calls = CallRecorder::new(store.clone(), run.clone());
        store
            .set_run_status(&run, RunStatus::Finished)
            .await
            .unwrap();
        let refused = calls
            .begin("main", "", "call_1_1", "place_order", &json!({}))
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("finished"), "{refused}");
        assert_eq!(calls.in_flight(&call("main", "", "call_1_1")), None);
        assert!(calls.end().await.unanswered.is_empty());
        store.close().await;
    }
}
