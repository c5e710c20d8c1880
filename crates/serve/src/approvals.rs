//! Pending approvals of the runs `wma serve` started: the questions the
//! loop asked and nobody answered yet, listed and answered over HTTP.
//!
//! They are kept behind [`PendingApprovals`], a small trait, so that a host
//! with a durable store can keep them across a restart; [`InMemoryApprovals`]
//! is the one this server uses now. The waiting itself is the run's: the
//! loop races the answer against Stop and the policy's time limit, and a
//! question whose run stopped waiting is taken off the list.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::{oneshot, watch};
use wma_agent::{ApprovalAnswer, ApprovalRequest, Approver, CallRecordRequest};
use wma_store::CallRecorder;

/// One question waiting for its answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingApproval {
    /// The run the host started (its public id), which the question belongs
    /// to; the asking agent may be one of its sub-agents.
    pub run_id: String,
    /// The agent the run was started on.
    pub run_agent: String,
    /// The question: the asking agent, the call, the tool, its full
    /// arguments and why it asks.
    #[serde(flatten)]
    pub request: ApprovalRequest,
    /// When it was asked, in seconds since the Unix epoch.
    pub asked_at: u64,
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnswerRefused {
    /// No question with that id waits in that run: it was answered, its
    /// run stopped waiting (Stop, the time limit), or it never existed.
    NotPending,
}

/// Where pending questions are kept.
pub trait PendingApprovals: Send + Sync {
    /// Keeps a question; the answer arrives on the receiver.
    fn insert(&self, pending: PendingApproval) -> oneshot::Receiver<ApprovalAnswer>;
    /// Forgets a question nobody waits for any more.
    fn remove(&self, approval_id: &str);
    /// The questions waiting, oldest first.
    fn list(&self) -> Vec<PendingApproval>;
    /// Answers the question `approval_id` of run `run_id`.
    fn answer(
        &self,
        run_id: &str,
        approval_id: &str,
        answer: ApprovalAnswer,
    ) -> Result<PendingApproval, AnswerRefused>;
}

/// The pending questions in this process's memory.
#[derive(Default)]
pub struct InMemoryApprovals {
    pending: Mutex<HashMap<String, (PendingApproval, oneshot::Sender<ApprovalAnswer>)>>,
}

impl PendingApprovals for InMemoryApprovals {
    fn insert(&self, pending: PendingApproval) -> oneshot::Receiver<ApprovalAnswer> {
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .insert(pending.request.approval_id.clone(), (pending, tx));
        rx
    }

    fn remove(&self, approval_id: &str) {
        self.pending.lock().remove(approval_id);
    }

    fn list(&self) -> Vec<PendingApproval> {
        let mut list: Vec<PendingApproval> = self
            .pending
            .lock()
            .values()
            .filter(|(_, tx)| !tx.is_closed())
            .map(|(p, _)| p.clone())
            .collect();
        list.sort_by(|a, b| {
            (a.asked_at, &a.request.approval_id).cmp(&(b.asked_at, &b.request.approval_id))
        });
        list
    }

    fn answer(
        &self,
        run_id: &str,
        approval_id: &str,
        answer: ApprovalAnswer,
    ) -> Result<PendingApproval, AnswerRefused> {
        let mut pending = self.pending.lock();
        match pending.get(approval_id) {
            Some((p, _)) if p.run_id == run_id => {}
            _ => return Err(AnswerRefused::NotPending),
        }
        let Some((p, tx)) = pending.remove(approval_id) else {
            return Err(AnswerRefused::NotPending);
        };
        // A closed receiver: the run stopped waiting a moment ago.
        tx.send(answer).map_err(|_| AnswerRefused::NotPending)?;
        Ok(p)
    }
}

/// The approver of one run the server started (and of its sub-agents'
/// runs): its questions go on the list, and the run waits for an answer
/// over HTTP. An answer "for the session" holds for the rest of the run,
/// a sub-agent's later runs within it included.
pub(crate) struct HttpApprover {
    pub(crate) run_id: String,
    pub(crate) run_agent: String,
    pub(crate) registry: Arc<dyn PendingApprovals>,
    /// Answers for the rest of the run, by (asking agent, tool).
    pub(crate) remembered: Mutex<HashMap<(String, String), ApprovalAnswer>>,
    /// The host's store, when it has one: each question is persisted (the
    /// run `waiting-for-approval`, which a restart keeps) and its answer
    /// recorded.
    pub(crate) store: Option<wma_store::Store>,
    /// The calls of this run recorded before they were sent, which the
    /// run's driver hands their answers and ends; with the store.
    pub(crate) calls: Option<Arc<CallRecorder>>,
    /// Set when the host gives up on its runs at shutdown: a question
    /// whose wait ends then stays pending in the store, for the next start.
    pub(crate) stopping: Arc<std::sync::atomic::AtomicBool>,
    /// The sub-agent runs the run held before this loop started (a run
    /// resumed after a restart): the loop's own are recorded numbered
    /// after them, as its driver logs their parts.
    pub(crate) sub_runs_before: u64,
    /// The questions whose `approval-requested` part the run's driver has
    /// committed to the run's log; a question is persisted (the run
    /// `waiting-for-approval`) only after its part, when set.
    pub(crate) logged: Option<LoggedQuestions>,
}

/// The questions of one run whose `approval-requested` part its driver
/// has logged: committed to the run's log, or never to be (the host gave
/// up on the run, or the driver ended). Shared by the run's
/// [`HttpApprover`], which waits for its question here before it marks
/// the run `waiting-for-approval`, and the run's driver.
///
/// The loop emits a question's part before it asks, but the part reaches
/// the log through the driver and the log's writer, both off the loop's
/// path: without this wait the run could be marked waiting (what a
/// restart goes on from) while parts a client was already sent (the
/// question, the call, the step's start) were still queued, and a host
/// killed then would lose them; its next start would number the
/// decision after the last part stored, under event ids the client had
/// already seen.
#[derive(Clone)]
pub(crate) struct LoggedQuestions(Arc<watch::Sender<Logged>>);

#[derive(Default)]
pub(crate) struct Logged {
    /// Questions logged that their approver has not taken yet.
    ids: HashSet<String>,
    /// The driver ended: nothing more will be logged.
    ended: bool,
}

impl Default for LoggedQuestions {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(Logged::default())))
    }
}

impl LoggedQuestions {
    /// The driver has committed the question's part (or will never log
    /// it).
    pub(crate) fn logged(&self, approval_id: String) {
        self.0.send_modify(|l| {
            l.ids.insert(approval_id);
        });
    }

    /// Ends the wait of every question, logged or not, once the driver
    /// is gone (however it ends) when dropped.
    pub(crate) fn end_on_drop(&self) -> EndQuestions {
        EndQuestions(self.clone())
    }

    /// Waits until the driver has logged the question, or ended.
    async fn wait(&self, approval_id: &str) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`: this ends by the condition only.
        let _ = rx
            .wait_for(|l| l.ended || l.ids.contains(approval_id))
            .await;
        self.0.send_if_modified(|l| {
            l.ids.remove(approval_id);
            false
        });
    }
}

/// Ends every wait of its [`LoggedQuestions`] when dropped.
pub(crate) struct EndQuestions(LoggedQuestions);

impl Drop for EndQuestions {
    fn drop(&mut self) {
        self.0.0.send_modify(|l| l.ended = true);
    }
}

impl HttpApprover {
    /// The approver of the run `run_id` of agent `run_agent`.
    pub(crate) fn new(
        run_id: String,
        run_agent: String,
        registry: Arc<dyn PendingApprovals>,
    ) -> Self {
        Self {
            run_id,
            run_agent,
            registry,
            remembered: Mutex::new(HashMap::new()),
            store: None,
            calls: None,
            stopping: Arc::default(),
            sub_runs_before: 0,
            logged: None,
        }
    }

    /// The same for a loop that goes on with a run holding
    /// `sub_runs_before` sub-agent runs already.
    pub(crate) fn with_sub_runs_after(mut self, sub_runs_before: u64) -> Self {
        self.sub_runs_before = sub_runs_before;
        self
    }

    /// The same, persisting each question only once the run's driver has
    /// logged its part ([`LoggedQuestions`]).
    pub(crate) fn with_logged_questions(mut self, logged: LoggedQuestions) -> Self {
        self.logged = Some(logged);
        self
    }

    /// The same, persisting its questions and answers in `store`, and
    /// recording each call that needs it there before it is sent, through
    /// `calls` (the run's driver records the answer).
    pub(crate) fn with_store(
        mut self,
        store: wma_store::Store,
        calls: Arc<CallRecorder>,
        stopping: Arc<std::sync::atomic::AtomicBool>,
    ) -> Self {
        self.store = Some(store);
        self.calls = Some(calls);
        self.stopping = stopping;
        self
    }
}

/// A persisted question whose wait ended without an answer (Stop, the
/// time limit, the run dropped): recorded as denied by the host, so that
/// the run does not stay `waiting-for-approval` in the store.
struct Unanswered {
    store: Option<(wma_store::Store, String)>,
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            // The host is going away: the question survives it.
            return;
        }
        if let Some((store, id)) = self.store.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let answer = ApprovalAnswer::deny()
                    .by("host")
                    .with_note("the run stopped waiting for an answer");
                let _ = store.decide_approval(&id, &answer).await;
            });
        }
    }
}

/// Takes a question off the list however its wait ends.
struct Forget<'a> {
    registry: &'a dyn PendingApprovals,
    approval_id: String,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.registry.remove(&self.approval_id);
    }
}

#[async_trait]
impl Approver for HttpApprover {
    async fn ask(&self, request: ApprovalRequest) -> ApprovalAnswer {
        let asked_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let approval_id = request.approval_id.clone();
        let asked = approval_id.clone();
        let key = (request.agent.clone(), request.tool.clone());
        // Before the first await: the question is listed before its part
        // reaches the client.
        let question = self.store.as_ref().map(|_| request.clone());
        let answer = self.registry.insert(PendingApproval {
            run_id: self.run_id.clone(),
            run_agent: self.run_agent.clone(),
            request,
            asked_at,
        });

        let _forget = Forget {
            registry: self.registry.as_ref(),
            approval_id,
        };
        // Persisted after it is listed (above, before any await): a person
        // who answers at once is answered from memory; the store learns
        // the answer below.
        let mut unanswered = Unanswered {
            store: None,
            stopping: self.stopping.clone(),
        };
        if let (Some(store), Some(question)) = (&self.store, &question) {
            // The run is marked waiting only once the parts its clients
            // were sent up to this question are in its log: a restart goes
            // on from both, numbering its parts after the question's.
            if let Some(logged) = &self.logged {
                logged.wait(&asked).await;
            }
            match store.request_approval(&self.run_id, question).await {
                Ok(stored) => unanswered.store = Some((store.clone(), stored.id)),
                Err(e) => {
                    tracing::warn!(run_id = %self.run_id, error = %e, "the question was not persisted; it is kept in memory only")
                }
            }
        }
        let answer = answer.await.unwrap_or_else(|_| {
            ApprovalAnswer::deny()
                .by("host")
                .with_note("the host dropped the question")
        });
        if let Some((store, id)) = unanswered.store.take()
            && let Err(e) = store.decide_approval(&id, &answer).await
        {
            tracing::warn!(run_id = %self.run_id, error = %e, "the answer was not recorded in the store");
        }
        // An approved call is recorded by `before_call`, which the loop
        // calls next, before it sends the call.
        if answer.remember {
            self.remembered.lock().insert(key, answer.clone());
        }
        answer
    }

    fn remembered(&self, agent: &str, tool: &str) -> Option<ApprovalAnswer> {
        self.remembered
            .lock()
            .get(&(agent.to_string(), tool.to_string()))
            .cloned()
    }

    /// Each call that needs a record (a consequential tool's, whatever let
    /// it run, and every approved one) is recorded `in-flight` with
    /// `begin_call`, committed before the loop sends it; its key goes with
    /// the call to the source, and `calls` keeps it for the run's driver
    /// to record the answer. Without a store nothing is recorded.
    async fn before_call(&self, call: &CallRecordRequest) -> Result<Option<String>, String> {
        let Some(calls) = &self.calls else {
            return Ok(None);
        };
        // Which of the run's sub-agent runs calls (the delegator says so
        // for the length of this call), as its parts carry it.
        let sub_run = sub_run_after(
            &wma_runtime::TaggedPart::current_sub_run(),
            self.sub_runs_before,
        );
        let key = calls
            .begin(
                &call.agent,
                &sub_run,
                &call.call_id,
                &call.tool,
                &call.arguments,
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(Some(key))
    }
}

/// The ordinal of the parent run's delegation a sub-run id starts with
/// (`3` for `"3.1"`); 0 for the run's own (`""`).
pub(crate) fn top_delegation(sub_run: &str) -> u64 {
    sub_run
        .split('.')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A sub-run id of a resumed run's new loop as the run's log keeps it:
/// its top delegation numbered after the `before` the run held already.
pub(crate) fn sub_run_after(sub_run: &str, before: u64) -> String {
    if sub_run.is_empty() || before == 0 {
        return sub_run.to_string();
    }
    match sub_run.split_once('.') {
        Some((top, rest)) => format!("{}.{rest}", top_delegation(top) + before),
        None => (top_delegation(sub_run) + before).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn question(id: &str, run: &str) -> PendingApproval {
        PendingApproval {
            run_id: run.into(),
            run_agent: "main".into(),
            request: ApprovalRequest {
                approval_id: id.into(),
                agent: "main".into(),
                call_id: "call_1_1".into(),
                tool: "write_file".into(),
                arguments: json!({"path": "a"}),
                reason: "why".into(),
            },
            asked_at: 1,
        }
    }

    #[tokio::test]
    async fn an_answer_reaches_only_its_own_runs_question_once() {
        let registry = InMemoryApprovals::default();
        let rx = registry.insert(question("a1", "run-1"));
        assert_eq!(registry.list().len(), 1);
        assert_eq!(
            registry.answer("run-2", "a1", ApprovalAnswer::approve()),
            Err(AnswerRefused::NotPending)
        );
        registry
            .answer("run-1", "a1", ApprovalAnswer::deny())
            .unwrap();
        assert!(!rx.await.unwrap().approved);
        assert!(registry.list().is_empty());
        assert_eq!(
            registry.answer("run-1", "a1", ApprovalAnswer::approve()),
            Err(AnswerRefused::NotPending)
        );
    }

    #[tokio::test]
    async fn an_answer_for_the_session_is_remembered_for_the_asking_agents_tool() {
        let registry: Arc<dyn PendingApprovals> = Arc::new(InMemoryApprovals::default());
        let approver = Arc::new(HttpApprover::new(
            "run-1".into(),
            "main".into(),
            registry.clone(),
        ));
        let asking = approver.clone();
        let asked = tokio::spawn(async move { asking.ask(question("a3", "run-1").request).await });
        while registry.list().is_empty() {
            tokio::task::yield_now().await;
        }
        registry
            .answer("run-1", "a3", ApprovalAnswer::approve().remembered())
            .unwrap();
        assert!(asked.await.unwrap().approved);
        assert!(registry.list().is_empty());
        assert!(approver.remembered("main", "write_file").unwrap().approved);
        assert!(approver.remembered("other", "write_file").is_none());
        assert!(approver.remembered("main", "read_file").is_none());
    }

    fn order(call_id: &str) -> CallRecordRequest {
        CallRecordRequest {
            agent: "main".into(),
            call_id: call_id.into(),
            tool: "place_order".into(),
            arguments: json!({"item": "tent"}),
            annotations: wma_agent::ToolAnnotations {
                consequential: true,
                ..Default::default()
            },
            asked: false,
        }
    }

    #[tokio::test]
    async fn a_call_is_recorded_before_it_is_sent_or_refused_when_it_cannot_be() {
        let dir = std::env::temp_dir().join(format!(
            "wma-before-call-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let store = wma_store::Store::open(wma_store::StoreOptions::in_data_dir(&dir))
            .await
            .unwrap();
        let session = store.create_session("main", "").await.unwrap();
        let run = store.start_run(&session.id, "main", None).await.unwrap();
        let calls = Arc::new(CallRecorder::new(store.clone(), run.id.clone()));
        let registry: Arc<dyn PendingApprovals> = Arc::new(InMemoryApprovals::default());
        let approver = HttpApprover::new(run.id.clone(), "main".into(), registry.clone())
            .with_store(store.clone(), calls.clone(), Arc::default());
        let key = approver
            .before_call(&order("call_1_1"))
            .await
            .unwrap()
            .expect("a key");
        let recorded = store.call(&key).await.unwrap().unwrap();
        assert_eq!(recorded.status, wma_store::CallStatus::InFlight);
        assert_eq!(recorded.call_id, "call_1_1");
        assert_eq!(recorded.arguments, json!({"item": "tent"}));
        assert_eq!(
            calls.in_flight(&("main".into(), String::new(), "call_1_1".into())),
            Some(key.clone())
        );
        // A store that refuses the record (the run ended): the call is not
        // to be sent, and nothing waits for its answer.
        store
            .set_run_status(&run.id, wma_store::RunStatus::Finished)
            .await
            .unwrap();
        let refused = approver.before_call(&order("call_2_1")).await.unwrap_err();
        assert!(refused.contains("finished"), "{refused}");
        assert!(
            calls
                .in_flight(&("main".into(), String::new(), "call_2_1".into()))
                .is_none()
        );
        assert_eq!(store.calls_of_run(&run.id).await.unwrap().len(), 1);
        // Without a store, nothing is recorded and nothing refused.
        let plain = HttpApprover::new(run.id.clone(), "main".into(), registry);
        assert_eq!(plain.before_call(&order("call_3_1")).await, Ok(None));
        store.close().await;
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn a_question_waits_for_its_part_to_be_logged_or_the_driver_to_end() {
        let logged = LoggedQuestions::default();
        // Logged before its approver waits (the driver was first).
        logged.logged("approval-1".into());
        logged.wait("approval-1").await;
        // Logged while it waits.
        let waiting = logged.clone();
        let waited = tokio::spawn(async move { waiting.wait("approval-2").await });
        tokio::task::yield_now().await;
        assert!(!waited.is_finished());
        logged.logged("approval-2".into());
        waited.await.unwrap();
        // Never logged: the driver's end lets it go on.
        let waiting = logged.clone();
        let waited = tokio::spawn(async move { waiting.wait("approval-3").await });
        drop(logged.end_on_drop());
        waited.await.unwrap();
        assert!(logged.0.borrow().ids.is_empty());
    }

    #[tokio::test]
    async fn a_question_nobody_waits_for_is_not_listed() {
        let registry = InMemoryApprovals::default();
        drop(registry.insert(question("a2", "run-1")));
        assert!(registry.list().is_empty());
        assert_eq!(
            registry.answer("run-1", "a2", ApprovalAnswer::approve()),
            Err(AnswerRefused::NotPending)
        );
    }
}
