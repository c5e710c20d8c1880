//! The store's behaviour, each test body run on SQLite and on a real
//! PostgreSQL server (wma-testkit's `PostgresServer`, which needs Debian's
//! `postgresql` package: `scripts/install-peers.sh` installs it).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::Row;
use wma_agent::{
    AgentStreamPart, ApprovalAnswer, ApprovalRequest, ChatMessage, FinishReason, ToolCall,
};
use wma_store::{CallStatus, RunLog, RunStatus, SCHEMA_VERSION, Store, StoreError, StoreOptions};
use wma_testkit::PostgresServer;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Sqlite,
    Postgres,
}

/// A fresh database of one kind, kept alive as long as this is.
struct Db {
    options: StoreOptions,
    _dir: tempfile::TempDir,
    _server: Option<Arc<PostgresServer>>,
}

impl Db {
    fn new(kind: Kind) -> Self {
        let dir = tempfile::tempdir().unwrap();
        match kind {
            Kind::Sqlite => Self {
                options: StoreOptions::in_data_dir(dir.path().join("data")),
                _dir: dir,
                _server: None,
            },
            Kind::Postgres => {
                let server = PostgresServer::shared().unwrap_or_else(|e| panic!("{e}"));
                let url = server.create_database().unwrap_or_else(|e| panic!("{e}"));
                Self {
                    options: StoreOptions::in_data_dir(dir.path()).with_database_url(url),
                    _dir: dir,
                    _server: Some(server),
                }
            }
        }
    }

    fn options(&self, host: &str) -> StoreOptions {
        self.options.clone().with_host(host)
    }

    async fn open(&self) -> Store {
        Store::open(self.options.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The database's URL, for the test's own queries.
    fn url(&self) -> String {
        match &self.options.database_url {
            Some(url) => url.clone(),
            None => format!(
                "sqlite://{}",
                self.options
                    .data_dir
                    .join(wma_store::DEFAULT_DB_FILE)
                    .display()
            ),
        }
    }
}

/// One test body, two backends: `name::sqlite` and `name::postgres`.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(super::Kind::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(super::Kind::Postgres).await
            }
        }
    )*};
}

on_both!(
    sessions_crud,
    concurrent_runs_keep_their_order,
    read_after_n_returns_exactly_the_missed_parts,
    terminal_parts_end_the_run,
    reopen_after_a_drop_marks_runs_interrupted_and_keeps_approvals,
    a_writer_killed_mid_write_leaves_a_whole_log,
    migrations_run_once_and_a_newer_schema_is_refused,
    a_run_log_commits_in_the_background_in_order,
    a_call_its_run_gave_up_on_is_in_doubt_at_once,
    a_run_started_in_its_log_is_written_with_its_parts,
    a_run_start_the_store_refuses_fails_the_log,
    a_log_killed_mid_run_keeps_every_flushed_part,
    a_host_name_is_held_by_one_live_store_at_a_time,
    sub_agent_runs_are_kept_apart_in_parts_and_call_records,
    a_session_live_on_another_host_cannot_be_deleted,
);

/// A host cannot delete a session whose run is in progress on another host
/// of the store while that host lives (running, or waiting for an
/// answer); once the other host is gone (closed, or killed: its name is
/// no longer held), it can.
async fn a_session_live_on_another_host_cannot_be_deleted(kind: Kind) {
    let db = Db::new(kind);
    let first = Store::open(db.options("first")).await.unwrap();
    let second = Store::open(db.options("second")).await.unwrap();
    let session = first.create_session("shopper", "").await.unwrap();
    let run = first.start_run(&session.id, "shopper", None).await.unwrap();
    let error = second.delete_session(&session.id).await.unwrap_err();
    assert!(
        matches!(&error, StoreError::SessionLive { host, .. } if host == "first"),
        "{error}"
    );
    assert!(first.session(&session.id).await.unwrap().is_some());
    first
        .set_run_status(&run.id, RunStatus::WaitingForApproval)
        .await
        .unwrap();
    assert!(matches!(
        second.delete_session(&session.id).await,
        Err(StoreError::SessionLive { .. })
    ));
    // A session of the second host's own, and one whose runs ended, go.
    let other = second.create_session("shopper", "").await.unwrap();
    assert!(second.delete_session(&other.id).await.unwrap());
    // The first host goes away with its run still `waiting-for-approval`.
    first.close().await;
    drop(first);
    assert!(second.delete_session(&session.id).await.unwrap());
    second.close().await;
}

/// A second live store under a host name in use is refused before it
/// recovers anything (it would interrupt the first one's runs); another
/// name is not, and the name is free again once its store is closed or
/// gone.
async fn a_host_name_is_held_by_one_live_store_at_a_time(kind: Kind) {
    let db = Db::new(kind);
    let first = Store::open(db.options("host-a")).await.unwrap();
    let session = first.create_session("shopper", "").await.unwrap();
    let running = first.start_run(&session.id, "shopper", None).await.unwrap();

    let refused = Store::open(db.options("host-a")).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::HostInUse { host, .. } if host == "host-a"),
        "{refused:?}"
    );
    let message = refused.to_string();
    assert!(
        message.contains("as host `host-a`") && message.contains("[store] host"),
        "{message}"
    );
    // The first store's run was left running.
    assert_eq!(
        first.run(&running.id).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    let other = Store::open(db.options("host-b")).await.unwrap();
    assert!(other.recovery().interrupted_runs.is_empty());
    other.close().await;

    // Closed: the name is free, and the next store recovers its runs.
    first.close().await;
    let second = Store::open(db.options("host-a")).await.unwrap();
    assert_eq!(
        second.recovery().interrupted_runs,
        std::slice::from_ref(&running.id)
    );
    // Gone without closing (as a killed process): free as well.
    drop(second);
    let third = Store::open(db.options("host-a")).await.unwrap();
    third.close().await;
}

/// A sub-agent run's parts and calls keep which run of the sub-agent
/// they are from; the same call of another run of it is not the one in
/// doubt.
async fn sub_agent_runs_are_kept_apart_in_parts_and_call_records(kind: Kind) {
    let db = Db::new(kind);
    let store = Store::open(db.options("host-a")).await.unwrap();
    let session = store.create_session("lead", "").await.unwrap();
    let run = store.start_run(&session.id, "lead", None).await.unwrap();
    let log = RunLog::for_run(&store, &run);
    log.append("lead", 0, text("first"));
    log.append_in("buyer", 1, "1", text("one"));
    log.append_in("buyer", 1, "2", text("two"));
    log.flush().await.unwrap();
    let parts = store.parts_after(&run.id, 0).await.unwrap();
    let kept: Vec<&str> = parts.iter().map(|p| p.sub_run.as_str()).collect();
    assert_eq!(kept, ["", "1", "2"]);
    assert!(parts[0].event_data().get("sub_run").is_none());
    assert_eq!(parts[2].event_data()["sub_run"], "2");

    let args = serde_json::json!({"item": "tent"});
    let first = store
        .begin_call_in(&run.id, "buyer", "1", "call_1_1", "place_order", &args)
        .await
        .unwrap();
    assert!(store.abandon_call(&first.idempotency_key).await.unwrap());
    // The same call of the same sub-agent run is the one in doubt…
    let again = store
        .begin_call_in(&run.id, "buyer", "1", "call_1_1", "place_order", &args)
        .await
        .unwrap_err();
    assert!(matches!(again, StoreError::CallInDoubt { .. }), "{again:?}");
    // …another run of the sub-agent made its own.
    let second = store
        .begin_call_in(&run.id, "buyer", "2", "call_1_1", "place_order", &args)
        .await
        .unwrap();
    let calls = store.calls_of_run(&run.id).await.unwrap();
    let sub_runs: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c.sub_run.as_str(), c.idempotency_key.as_str()))
        .collect();
    assert_eq!(
        sub_runs,
        [
            ("1", first.idempotency_key.as_str()),
            ("2", second.idempotency_key.as_str())
        ]
    );
    assert_eq!(
        serde_json::to_value(&calls[1]).unwrap()["sub_run"],
        serde_json::json!("2")
    );
    store.close().await;
}

/// A host whose run stopped while a call was in flight marks the call in
/// doubt then, not at its next start; an answered call keeps its answer.
async fn a_call_its_run_gave_up_on_is_in_doubt_at_once(kind: Kind) {
    let db = Db::new(kind);
    let store = db.open().await;
    let session = store.create_session("shopper", "").await.unwrap();
    let run = store.start_run(&session.id, "shopper", None).await.unwrap();
    let answered = store
        .begin_call(
            &run.id,
            "shopper",
            "call_1_1",
            "place_order",
            &json!({"n": 1}),
        )
        .await
        .unwrap();
    store
        .finish_call(&answered.idempotency_key, "placed", false)
        .await
        .unwrap();
    let cut = store
        .begin_call(
            &run.id,
            "shopper",
            "call_2_1",
            "place_order",
            &json!({"n": 2}),
        )
        .await
        .unwrap();
    assert!(store.abandon_call(&cut.idempotency_key).await.unwrap());
    assert!(!store.abandon_call(&answered.idempotency_key).await.unwrap());
    assert!(!store.abandon_call("no-such-key").await.unwrap());
    let calls = store.calls_of_run(&run.id).await.unwrap();
    let statuses: Vec<CallStatus> = calls.iter().map(|c| c.status).collect();
    assert_eq!(statuses, [CallStatus::Answered, CallStatus::InDoubt]);
    assert_eq!(calls[0].output.as_deref(), Some("placed"));
    // In doubt, it is answered by nobody and not sent again.
    assert!(matches!(
        store.finish_call(&cut.idempotency_key, "late", false).await,
        Err(StoreError::CallNotInFlight { .. })
    ));
    assert!(matches!(
        store
            .begin_call(
                &run.id,
                "shopper",
                "call_2_1",
                "place_order",
                &json!({"n": 2})
            )
            .await,
        Err(StoreError::CallInDoubt { .. })
    ));
    store.close().await;
}

fn text(t: &str) -> AgentStreamPart {
    AgentStreamPart::Text {
        text: t.to_string(),
    }
}

fn question(agent: &str, call_id: &str) -> ApprovalRequest {
    ApprovalRequest {
        approval_id: "approval-1".to_string(),
        agent: agent.to_string(),
        call_id: call_id.to_string(),
        tool: "place_order".to_string(),
        arguments: json!({"cart": "c-1", "total": 129.5}),
        reason: "place_order is consequential".to_string(),
    }
}

async fn sessions_crud(kind: Kind) {
    let db = Db::new(kind);
    let store = db.open().await;
    let first = store.create_session("shopper", "").await.unwrap();
    let second = store
        .create_session("planner", "Trip to Oslo")
        .await
        .unwrap();
    assert_eq!(first.id.len(), 32);
    assert_ne!(first.id, second.id);

    let history = vec![
        ChatMessage::user("Find a waterproof backpack\nunder 100 euros"),
        ChatMessage::assistant_calls(
            "",
            vec![ToolCall::new(
                "call_1_1",
                "search_products",
                json!({"query": "backpack"}),
            )],
        ),
        ChatMessage::tool_result("call_1_1", "search_products", r#"[{"id":"p-17"}]"#),
        ChatMessage::assistant("The Summit 30L (p-17) is waterproof."),
    ];
    assert_eq!(
        store
            .append_messages(&first.id, &history[..2])
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        store
            .append_messages(&first.id, &history[2..])
            .await
            .unwrap(),
        4
    );
    let read = store
        .session_with_messages(&first.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        read.messages, history,
        "messages come back whole and in order"
    );
    assert_eq!(read.session.message_count, 4);
    assert_eq!(read.session.agent, "shopper");
    assert_eq!(
        read.session.title, "Find a waterproof backpack",
        "an untitled session is named by its first request"
    );
    // A later user message does not rename it, nor one with a title.
    store
        .append_messages(&second.id, &[ChatMessage::user("Book a hotel")])
        .await
        .unwrap();
    assert_eq!(
        store.session(&second.id).await.unwrap().unwrap().title,
        "Trip to Oslo"
    );

    let listed = store.list_sessions(10).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0].id, second.id, "the most recently updated first");
    assert_eq!(store.list_sessions(1).await.unwrap().len(), 1);

    let run = store.start_run(&first.id, "shopper", None).await.unwrap();
    store
        .append_part(&run.id, "shopper", 0, &text("hello"))
        .await
        .unwrap();
    let key = store
        .begin_call(&run.id, "shopper", "call_1_1", "place_order", &json!({}))
        .await
        .unwrap()
        .idempotency_key;
    store
        .request_approval(&run.id, &question("shopper", "call_1_2"))
        .await
        .unwrap();

    assert!(matches!(
        store.append_messages("no-such-session", &history).await,
        Err(StoreError::SessionNotFound(_))
    ));
    assert!(matches!(
        store.start_run("no-such-session", "shopper", None).await,
        Err(StoreError::SessionNotFound(_))
    ));

    assert!(store.delete_session(&first.id).await.unwrap());
    assert!(store.session(&first.id).await.unwrap().is_none());
    assert!(store.messages(&first.id).await.unwrap().is_empty());
    assert!(
        store.run(&run.id).await.unwrap().is_none(),
        "its runs go with it"
    );
    assert!(matches!(
        store.parts_after(&run.id, 0).await,
        Err(StoreError::RunNotFound(_))
    ));
    assert!(store.call(&key).await.unwrap().is_none());
    assert!(store.pending_approvals(None).await.unwrap().is_empty());
    assert!(!store.delete_session(&first.id).await.unwrap());
    assert_eq!(store.list_sessions(10).await.unwrap().len(), 1);
}

async fn concurrent_runs_keep_their_order(kind: Kind) {
    const RUNS: usize = 4;
    const PARTS: u64 = 40;
    let db = Db::new(kind);
    // Two stores on one database, as two host processes would be, each
    // with two runs appending at once.
    let stores = [
        Store::open(db.options("host-a")).await.unwrap(),
        Store::open(db.options("host-b")).await.unwrap(),
    ];
    let session = stores[0].create_session("shopper", "").await.unwrap();
    let mut runs = Vec::new();
    for i in 0..RUNS {
        let store = &stores[i % 2];
        runs.push(
            store
                .start_run(&session.id, "shopper", None)
                .await
                .unwrap()
                .id,
        );
    }
    let mut writers = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let store = stores[i % 2].clone();
        let run = run.clone();
        writers.push(tokio::spawn(async move {
            for n in 1..=PARTS {
                let seq = store
                    .append_part(&run, "shopper", 0, &text(&format!("{run}:{n}")))
                    .await
                    .unwrap_or_else(|e| panic!("append {n} to {run}: {e}"));
                assert_eq!(seq, n, "each run numbers its own parts 1, 2, 3…");
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    for run in &runs {
        let parts = stores[0].parts_after(run, 0).await.unwrap();
        let seqs: Vec<u64> = parts.iter().map(|p| p.seq).collect();
        assert_eq!(seqs, (1..=PARTS).collect::<Vec<_>>());
        for part in &parts {
            assert_eq!(
                part.part,
                text(&format!("{run}:{}", part.seq)),
                "no part of another run"
            );
        }
        assert_eq!(stores[1].run(run).await.unwrap().unwrap().last_seq, PARTS);
    }
}

async fn read_after_n_returns_exactly_the_missed_parts(kind: Kind) {
    let db = Db::new(kind);
    let store = db.open().await;
    let session = store.create_session("shopper", "").await.unwrap();
    let run = store
        .start_run(&session.id, "shopper", Some("run-1"))
        .await
        .unwrap();
    assert_eq!(run.id, "run-1", "the host's own run id is kept");
    let parts = vec![
        AgentStreamPart::MessageStart { step: 1 },
        AgentStreamPart::ToolCall {
            call_id: "call_1_1".into(),
            name: "catalog_agent".into(),
            arguments: json!({"task": "find a backpack"}),
        },
        AgentStreamPart::MessageStart { step: 1 },
        AgentStreamPart::ToolCall {
            call_id: "call_1_1".into(),
            name: "search_products".into(),
            arguments: json!({"query": "backpack"}),
        },
        AgentStreamPart::ToolResult {
            call_id: "call_1_1".into(),
            name: "search_products".into(),
            output: "[]".into(),
        },
        text("Nothing found."),
        AgentStreamPart::Finish {
            reason: FinishReason::Stop,
        },
        AgentStreamPart::ToolResult {
            call_id: "call_1_1".into(),
            name: "catalog_agent".into(),
            output: "Nothing found.".into(),
        },
        text("The catalog has no backpack."),
    ];
    let depth = |i: usize| if (2..=6).contains(&i) { 1 } else { 0 };
    for (i, part) in parts.iter().enumerate() {
        let agent = if depth(i) == 1 {
            "catalog_agent"
        } else {
            "shopper"
        };
        let seq = store
            .append_part("run-1", agent, depth(i), part)
            .await
            .unwrap();
        assert_eq!(seq, i as u64 + 1);
    }
    // A sub-agent's finish (depth 1) does not end the run.
    assert_eq!(
        store.run("run-1").await.unwrap().unwrap().status,
        RunStatus::Running
    );

    let all = store.parts_after("run-1", 0).await.unwrap();
    assert_eq!(
        all.iter().map(|p| p.part.clone()).collect::<Vec<_>>(),
        parts
    );
    assert_eq!(all[3].agent, "catalog_agent");
    assert_eq!(all[3].depth, 1);
    assert_eq!(all[7].depth, 0);

    // Replayed as the live stream sent it.
    assert_eq!(
        all[3].event_data(),
        json!({"agent": "catalog_agent", "depth": 1, "type": "tool-call", "call_id": "call_1_1",
               "name": "search_products", "arguments": {"query": "backpack"}})
    );

    let missed = store.parts_after("run-1", 6).await.unwrap();
    assert_eq!(
        missed.iter().map(|p| p.seq).collect::<Vec<_>>(),
        vec![7, 8, 9]
    );
    assert_eq!(
        missed.iter().map(|p| p.part.clone()).collect::<Vec<_>>(),
        parts[6..]
    );
    assert!(store.parts_after("run-1", 9).await.unwrap().is_empty());
    assert!(store.parts_after("run-1", 1000).await.unwrap().is_empty());
    assert!(matches!(
        store.parts_after("no-such-run", 0).await,
        Err(StoreError::RunNotFound(_))
    ));
    assert!(matches!(
        store
            .append_part("no-such-run", "shopper", 0, &text("x"))
            .await,
        Err(StoreError::RunNotFound(_))
    ));
    assert!(matches!(
        store.start_run(&session.id, "shopper", Some("run-1")).await,
        Err(StoreError::RunExists(_))
    ));
}

async fn terminal_parts_end_the_run(kind: Kind) {
    let db = Db::new(kind);
    let store = db.open().await;
    let session = store.create_session("shopper", "").await.unwrap();
    let finished = store
        .start_run(&session.id, "shopper", None)
        .await
        .unwrap()
        .id;
    store
        .append_part(&finished, "shopper", 0, &text("Done."))
        .await
        .unwrap();
    let finish = AgentStreamPart::Finish {
        reason: FinishReason::Stop,
    };
    assert_eq!(
        store
            .append_part(&finished, "shopper", 0, &finish)
            .await
            .unwrap(),
        2
    );
    let run = store.run(&finished).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Finished);
    assert_eq!(run.last_seq, 2);
    let after = store
        .append_part(&finished, "shopper", 0, &text("late"))
        .await;
    assert!(
        matches!(&after, Err(StoreError::RunEnded { status, .. }) if status == "finished"),
        "{after:?}"
    );
    assert_eq!(store.parts_after(&finished, 0).await.unwrap().len(), 2);

    let failed = store
        .start_run(&session.id, "shopper", None)
        .await
        .unwrap()
        .id;
    let error = AgentStreamPart::Error {
        message: "The on-device model failed".into(),
    };
    store
        .append_part(&failed, "shopper", 0, &error)
        .await
        .unwrap();
    let run = store.run(&failed).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error.as_deref(), Some("The on-device model failed"));
    assert!(matches!(
        store
            .begin_call(&failed, "shopper", "call_2_1", "place_order", &json!({}))
            .await,
        Err(StoreError::RunEnded { .. })
    ));

    let stopped = store
        .start_run(&session.id, "shopper", None)
        .await
        .unwrap()
        .id;
    let run = store
        .set_run_status(&stopped, RunStatus::Interrupted)
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Interrupted);
    assert!(matches!(
        store.set_run_status(&stopped, RunStatus::Running).await,
        Err(StoreError::RunEnded { .. })
    ));
    let runs = store.runs_of_session(&session.id).await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![
            RunStatus::Finished,
            RunStatus::Failed,
            RunStatus::Interrupted
        ]
    );
}

async fn reopen_after_a_drop_marks_runs_interrupted_and_keeps_approvals(kind: Kind) {
    let db = Db::new(kind);
    let store = db.open().await;
    let session = store.create_session("shopper", "").await.unwrap();
    let running = store
        .start_run(&session.id, "shopper", None)
        .await
        .unwrap()
        .id;
    let waiting = store
        .start_run(&session.id, "shopper", None)
        .await
        .unwrap()
        .id;
    store
        .append_part(&running, "shopper", 0, &text("working"))
        .await
        .unwrap();
    let answered = store
        .begin_call(
            &running,
            "shopper",
            "call_1_1",
            "add_to_cart",
            &json!({"id": "p-17"}),
        )
        .await
        .unwrap();
    store
        .finish_call(&answered.idempotency_key, "added", false)
        .await
        .unwrap();
    let in_flight = store
        .begin_call(
            &running,
            "cart_agent",
            "call_1_1",
            "place_order",
            &json!({"cart": "c-1"}),
        )
        .await
        .unwrap();
    assert_ne!(in_flight.idempotency_key, answered.idempotency_key);
    let approval = store
        .request_approval(&waiting, &question("shopper", "call_1_1"))
        .await
        .unwrap();
    // The waiting run also has a call in flight (one of two parallel calls).
    let parallel = store
        .begin_call(
            &waiting,
            "shopper",
            "call_1_2",
            "send_email",
            &json!({"to": "a@b.c"}),
        )
        .await
        .unwrap();
    assert_eq!(
        store.run(&waiting).await.unwrap().unwrap().status,
        RunStatus::WaitingForApproval
    );
    // Another host's run on the same database is not this host's to
    // interrupt.
    let other = Store::open(db.options("other-host")).await.unwrap();
    let elsewhere = other
        .start_run(&session.id, "shopper", None)
        .await
        .unwrap()
        .id;

    // The host goes away without closing anything.
    drop(store);

    let store = db.open().await;
    let recovery = store.recovery();
    assert_eq!(recovery.interrupted_runs, vec![running.clone()]);
    assert_eq!(recovery.waiting_runs, vec![waiting.clone()]);
    assert_eq!(recovery.in_doubt_calls.len(), 2);
    let in_doubt: Vec<&str> = recovery
        .in_doubt_calls
        .iter()
        .map(|c| c.idempotency_key.as_str())
        .collect();
    assert!(in_doubt.contains(&in_flight.idempotency_key.as_str()));
    assert!(in_doubt.contains(&parallel.idempotency_key.as_str()));

    assert_eq!(
        store.run(&running).await.unwrap().unwrap().status,
        RunStatus::Interrupted
    );
    assert_eq!(
        store.run(&elsewhere).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    let calls = store.calls_of_run(&running).await.unwrap();
    assert_eq!(
        calls.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![CallStatus::Answered, CallStatus::InDoubt]
    );
    assert_eq!(calls[0].output.as_deref(), Some("added"));
    assert_eq!(store.in_doubt_calls().await.unwrap().len(), 2);
    // In doubt stays in doubt: no late answer, and the interrupted run
    // sends nothing more.
    assert!(matches!(
        store
            .finish_call(&in_flight.idempotency_key, "ordered", false)
            .await,
        Err(StoreError::CallNotInFlight { .. })
    ));
    assert!(matches!(
        store
            .begin_call(
                &running,
                "cart_agent",
                "call_1_1",
                "place_order",
                &json!({})
            )
            .await,
        Err(StoreError::RunEnded { .. })
    ));

    // The pending approval survived and is decided now; the run goes on.
    let pending = store.pending_approvals(Some(&session.id)).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, approval.id);
    assert_eq!(pending[0].request, question("shopper", "call_1_1"));
    let decided = store
        .decide_approval(&approval.id, &ApprovalAnswer::approve().remembered())
        .await
        .unwrap();
    assert_eq!(decided.answer, Some(ApprovalAnswer::approve().remembered()));
    assert!(decided.decided_at.is_some());
    assert_eq!(
        store.run(&waiting).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    assert!(store.pending_approvals(None).await.unwrap().is_empty());
    assert!(matches!(
        store.decide_approval(&approval.id, &ApprovalAnswer::deny()).await,
        Err(StoreError::AlreadyDecided { decision, .. }) if decision == "approved"
    ));
    assert!(matches!(
        store
            .decide_approval("no-such-approval", &ApprovalAnswer::deny())
            .await,
        Err(StoreError::ApprovalNotFound(_))
    ));
    // The run goes on, and the call in doubt is not sent again; another
    // call is.
    let resent = store
        .begin_call(
            &waiting,
            "shopper",
            "call_1_2",
            "send_email",
            &json!({"to": "a@b.c"}),
        )
        .await;
    assert!(
        matches!(&resent, Err(StoreError::CallInDoubt { idempotency_key, .. })
            if *idempotency_key == parallel.idempotency_key),
        "{resent:?}"
    );
    store
        .begin_call(
            &waiting,
            "shopper",
            "call_2_1",
            "send_email",
            &json!({"to": "d@e.f"}),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .append_part(&waiting, "shopper", 0, &text("ordered"))
            .await
            .unwrap(),
        1
    );
    store.close().await;
}

/// Set in the child process of [`a_writer_killed_mid_write_leaves_a_whole_log`]:
/// the database it writes to.
const CHILD_URL: &str = "WMA_STORE_TEST_CHILD_URL";

/// In the child process: sets up a run waiting for approval and a run with
/// a consequential call in flight, then appends parts to the second until
/// it is killed, printing each durable sequence number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_writer() {
    let Some(url) = std::env::var_os(CHILD_URL) else {
        return; // only the child does anything
    };
    let options = StoreOptions::in_data_dir(".").with_database_url(url.to_string_lossy());
    let store = Store::open(options).await.unwrap();
    let session = store.create_session("shopper", "").await.unwrap();
    let waiting = store
        .start_run(&session.id, "shopper", None)
        .await
        .unwrap()
        .id;
    let approval = store
        .request_approval(&waiting, &question("shopper", "call_1_1"))
        .await
        .unwrap();
    let running = store
        .start_run(&session.id, "shopper", None)
        .await
        .unwrap()
        .id;
    let call = store
        .begin_call(
            &running,
            "shopper",
            "call_1_1",
            "place_order",
            &json!({"cart": "c-1"}),
        )
        .await
        .unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "READY {waiting} {running} {} {}",
        approval.id, call.idempotency_key
    )
    .unwrap();
    out.flush().unwrap();
    let long = "x".repeat(4096);
    for n in 1.. {
        let seq = store
            .append_part(&running, "shopper", 0, &text(&format!("{n} {long}")))
            .await
            .unwrap();
        writeln!(out, "DURABLE {seq}").unwrap();
        out.flush().unwrap();
    }
}

async fn a_writer_killed_mid_write_leaves_a_whole_log(kind: Kind) {
    let db = Db::new(kind);
    // The schema first, so that the child only writes.
    db.open().await.close().await;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_writer", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_URL, db.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut ready = None;
    let mut durable = 0u64;
    for line in lines.by_ref() {
        let line = line.unwrap();
        // libtest's own "test child_writer ... " may start the line.
        if let Some((_, rest)) = line.split_once("READY ") {
            ready = Some(rest.split(' ').map(str::to_string).collect::<Vec<_>>());
        } else if let Some(seq) = line.strip_prefix("DURABLE ") {
            durable = seq.parse().unwrap();
            if durable >= 30 {
                break;
            }
        }
    }
    let ready = ready.expect("the child never got ready");
    let (waiting, running, approval, call) = (&ready[0], &ready[1], &ready[2], &ready[3]);
    // SIGKILL while it keeps appending: no chance to finish or close.
    child.kill().unwrap();
    child.wait().unwrap();
    drop(lines);

    let store = db.open().await;
    assert_eq!(store.recovery().interrupted_runs, vec![running.clone()]);
    assert_eq!(store.recovery().waiting_runs, vec![waiting.clone()]);
    assert_eq!(
        store.run(running).await.unwrap().unwrap().status,
        RunStatus::Interrupted
    );
    let parts = store.parts_after(running, 0).await.unwrap();
    assert!(
        parts.len() as u64 >= durable,
        "the child was told {durable} parts were durable, the log has {}",
        parts.len()
    );
    for (i, part) in parts.iter().enumerate() {
        assert_eq!(part.seq, i as u64 + 1, "no gap and no torn part");
        let AgentStreamPart::Text { text } = &part.part else {
            panic!("part {} is not the text written: {:?}", part.seq, part.part);
        };
        assert!(text.starts_with(&format!("{} ", part.seq)) && text.len() > 4096);
    }
    let in_doubt = store.call(call).await.unwrap().unwrap();
    assert_eq!(in_doubt.status, CallStatus::InDoubt);
    assert_eq!(in_doubt.arguments, json!({"cart": "c-1"}));
    let decided = store
        .decide_approval(approval, &ApprovalAnswer::deny().with_note("not today"))
        .await
        .unwrap();
    assert_eq!(decided.answer.unwrap().note.as_deref(), Some("not today"));
    assert_eq!(
        store.run(waiting).await.unwrap().unwrap().status,
        RunStatus::Running
    );
}

async fn migrations_run_once_and_a_newer_schema_is_refused(kind: Kind) {
    let db = Db::new(kind);
    // Hosts starting at once on a fresh database: each opens it, the
    // schema is made once.
    let opening: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|host| tokio::spawn(Store::open(db.options(host))))
        .collect();
    for open in opening {
        open.await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}"))
            .close()
            .await;
    }
    let store = db.open().await;
    let session = store.create_session("shopper", "Kept").await.unwrap();
    store.close().await;
    let store = db.open().await;
    assert_eq!(
        store.session(&session.id).await.unwrap().unwrap().title,
        "Kept"
    );
    store.close().await;

    sqlx::any::install_default_drivers();
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&db.url())
        .await
        .unwrap();
    let versions: Vec<i64> = sqlx::query("SELECT version FROM wma_schema ORDER BY version")
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        versions,
        (1..=SCHEMA_VERSION).collect::<Vec<_>>(),
        "each migration once"
    );

    sqlx::query("INSERT INTO wma_schema (version, applied_at) VALUES ($1, 0)")
        .bind(SCHEMA_VERSION + 1)
        .execute(&mut conn)
        .await
        .unwrap();
    let refused = Store::open(db.options.clone()).await.unwrap_err();
    assert!(
        matches!(refused, StoreError::SchemaTooNew { found, known, .. }
            if found == SCHEMA_VERSION + 1 && known == SCHEMA_VERSION),
        "{refused}"
    );
    assert!(
        refused
            .to_string()
            .contains("newer than this build of wma knows"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_url_of_another_database_is_refused_clearly() {
    let error = Store::open(
        StoreOptions::in_data_dir(".").with_database_url("mysql://wma:secret@db.example/wma"),
    )
    .await
    .unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, StoreError::BadUrl { .. }), "{message}");
    assert!(
        message.contains("mysql://wma:***@db.example/wma"),
        "{message}"
    );
    assert!(
        !message.contains("secret"),
        "the password is never shown: {message}"
    );
}

#[tokio::test]
async fn a_server_that_is_not_there_is_unavailable_not_a_hang() {
    // Nothing listens on a port just taken and freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut options = StoreOptions::in_data_dir(".")
        .with_database_url(format!("postgres://postgres@127.0.0.1:{port}/wma"));
    options.acquire_timeout = Duration::from_secs(2);
    let error = tokio::time::timeout(Duration::from_secs(20), Store::open(options))
        .await
        .expect("opening an absent server must fail, not hang")
        .unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("cannot be reached"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_going_away_is_an_error_and_coming_back_serves_again() {
    let mut server = PostgresServer::start().unwrap_or_else(|e| panic!("{e}"));
    let mut options = StoreOptions::in_data_dir(".").with_database_url(server.url());
    options.acquire_timeout = Duration::from_secs(2);
    let store = Store::open(options).await.unwrap();
    let session = store.create_session("shopper", "").await.unwrap();
    let run = store
        .start_run(&session.id, "shopper", None)
        .await
        .unwrap()
        .id;
    store
        .append_part(&run, "shopper", 0, &text("before"))
        .await
        .unwrap();
    let log = store.run_log(&run).await.unwrap();

    server.stop().unwrap();
    let error = store
        .append_part(&run, "shopper", 0, &text("during"))
        .await
        .unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(
        store
            .session(&session.id)
            .await
            .unwrap_err()
            .is_unavailable()
    );

    // A background log reports it at its flush, after its retries, and
    // takes no more.
    let failed = log.append("shopper", 0, text("lost"));
    assert_eq!(failed, 2);
    let error = log.flush().await.unwrap_err();
    assert!(matches!(error, StoreError::LogFailed { .. }), "{error}");
    assert!(error.to_string().contains("cannot be reached"), "{error}");
    assert!(log.flush().await.is_err());

    server.restart().unwrap();
    // The pool reconnects by itself; the store was never reopened.
    assert_eq!(
        store
            .append_part(&run, "shopper", 0, &text("after"))
            .await
            .unwrap(),
        2
    );
    let parts = store.parts_after(&run, 0).await.unwrap();
    assert_eq!(
        parts.iter().map(|p| p.part.clone()).collect::<Vec<_>>(),
        vec![text("before"), text("after")]
    );
}

#[tokio::test]
async fn the_sqlite_file_is_in_wal_mode_in_the_data_folder() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("nested").join("data");
    let store = Store::open(StoreOptions::in_data_dir(&data)).await.unwrap();
    assert_eq!(store.backend(), wma_store::Backend::Sqlite);
    assert!(data.join(wma_store::DEFAULT_DB_FILE).is_file());
    store.close().await;
    sqlx::any::install_default_drivers();
    let url = format!(
        "sqlite://{}",
        data.join(wma_store::DEFAULT_DB_FILE).display()
    );
    let mut conn = <sqlx::AnyConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let mode: String = sqlx::query("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "wal");
}

async fn a_run_log_commits_in_the_background_in_order(kind: Kind) {
    const PARTS: u64 = 300;
    let db = Db::new(kind);
    let store = db.open().await;
    let session = store.create_session("shopper", "").await.unwrap();
    let mut logs = Vec::new();
    for _ in 0..3 {
        let run = store
            .start_run(&session.id, "shopper", None)
            .await
            .unwrap()
            .id;
        // One part through the store first: the log goes on after it.
        store
            .append_part(&run, "shopper", 0, &text("first"))
            .await
            .unwrap();
        logs.push(store.run_log(&run).await.unwrap());
    }
    let mut writers = Vec::new();
    for log in logs.clone() {
        writers.push(tokio::spawn(async move {
            for n in 2..=PARTS {
                assert_eq!(log.append("catalog_agent", 1, text(&n.to_string())), n);
                if n % 97 == 0 {
                    log.flush().await.unwrap();
                }
            }
            let finish = AgentStreamPart::Finish {
                reason: FinishReason::Stop,
            };
            assert_eq!(log.append("shopper", 0, finish), PARTS + 1);
            log.flush().await.unwrap();
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    for log in &logs {
        let parts = store.parts_after(log.run_id(), 0).await.unwrap();
        assert_eq!(
            parts.iter().map(|p| p.seq).collect::<Vec<_>>(),
            (1..=PARTS + 1).collect::<Vec<_>>()
        );
        assert_eq!(parts[0].part, text("first"));
        assert_eq!(parts[41].part, text("42"));
        assert_eq!(
            (parts[41].agent.as_str(), parts[41].depth),
            ("catalog_agent", 1)
        );
        let run = store.run(log.run_id()).await.unwrap().unwrap();
        assert_eq!(
            run.status,
            RunStatus::Finished,
            "the terminal part ended the run"
        );
        assert_eq!(run.last_seq, PARTS + 1);
    }
    // An ended run takes no log.
    assert!(matches!(
        store.run_log(logs[0].run_id()).await,
        Err(StoreError::RunEnded { .. })
    ));
}

fn finish() -> AgentStreamPart {
    AgentStreamPart::Finish {
        reason: FinishReason::Stop,
    }
}

/// `RunLog::start` queues the run's row with its parts: whatever this
/// store is asked about the run before the row is committed waits for it,
/// so the run reads as one `start_run` began; a run that starts and ends
/// in one batch is stored finished with all its parts.
async fn a_run_started_in_its_log_is_written_with_its_parts(kind: Kind) {
    let db = Db::new(kind);
    let store = db.open().await;
    let session = store.create_session("shopper", "").await.unwrap();
    let earlier = store.start_run(&session.id, "shopper", None).await.unwrap();

    let (run, log) = RunLog::start(&store, &session.id, "shopper", Some("run-queued-1"));
    assert_eq!(run.id, "run-queued-1");
    assert_eq!((run.status, run.last_seq), (RunStatus::Running, 0));
    assert_eq!(log.append("shopper", 0, text("one")), 1);
    // No flush: the store's own queries see the run and its parts.
    let read = store.run(&run.id).await.unwrap().expect("the queued run");
    assert_eq!(read.status, RunStatus::Running);
    assert_eq!(read.session_id, session.id);
    assert_eq!(read.host, store.host());
    assert_eq!(read.created_at, run.created_at);
    assert_eq!(read.last_seq, 1);
    assert_eq!(
        store
            .runs_of_session(&session.id)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id.as_str())
            .collect::<Vec<_>>(),
        vec![earlier.id.as_str(), run.id.as_str()],
        "numbered after the session's earlier run"
    );

    // A consequential call right after the start is recorded against it.
    let (calling, calling_log) = RunLog::start(&store, &session.id, "shopper", None);
    let call = store
        .begin_call(
            &calling.id,
            "shopper",
            "call_1_1",
            "place_order",
            &json!({}),
        )
        .await
        .unwrap();
    assert_eq!(store.calls_of_run(&calling.id).await.unwrap(), vec![call]);
    assert_eq!(calling_log.append("shopper", 0, text("ordered")), 1);
    calling_log.flush().await.unwrap();

    for n in 2..=40u64 {
        assert_eq!(log.append("catalog_agent", 1, text(&n.to_string())), n);
    }
    assert_eq!(log.append("shopper", 0, finish()), 41);
    log.flush().await.unwrap();
    let parts = store.parts_after(&run.id, 0).await.unwrap();
    assert_eq!(
        parts.iter().map(|p| p.seq).collect::<Vec<_>>(),
        (1..=41).collect::<Vec<_>>()
    );
    assert_eq!(parts[0].part, text("one"));
    assert_eq!(
        (parts[1].agent.as_str(), parts[1].depth),
        ("catalog_agent", 1)
    );
    assert_eq!(parts[40].part, finish());
    let ended = store.run(&run.id).await.unwrap().unwrap();
    assert_eq!((ended.status, ended.last_seq), (RunStatus::Finished, 41));

    // Started and ended before its writer ran: one batch, stored finished.
    let (quick, quick_log) = RunLog::start(&store, &session.id, "shopper", None);
    quick_log.append("shopper", 0, text("done at once"));
    quick_log.append(
        "shopper",
        0,
        AgentStreamPart::Error {
            message: "the model went away".to_string(),
        },
    );
    quick_log.flush().await.unwrap();
    let quick = store.run(&quick.id).await.unwrap().unwrap();
    assert_eq!(quick.status, RunStatus::Failed);
    assert_eq!(quick.error.as_deref(), Some("the model went away"));
    assert_eq!(store.parts_after(&quick.id, 0).await.unwrap().len(), 2);

    // Another process (another host on the database) sees the run as
    // committed.
    let other = Store::open(db.options("reader")).await.unwrap();
    assert_eq!(
        other.run(&run.id).await.unwrap().unwrap().status,
        RunStatus::Finished
    );
    other.close().await;
    store.close().await;
}

/// What `start_run` refuses at once, a queued start reports at the log's
/// flush; nothing of the run is stored, and the log takes no more. A
/// terminal part for a run that ended meanwhile is refused the same way.
/// A pool of one connection, which the log's writer holds while it works,
/// serves it all.
async fn a_run_start_the_store_refuses_fails_the_log(kind: Kind) {
    let db = Db::new(kind);
    let mut options = db.options(wma_store::DEFAULT_HOST);
    options.max_connections = 1;
    let store = Store::open(options).await.unwrap();
    let (run, log) = RunLog::start(&store, "no-such-session", "shopper", None);
    log.append("shopper", 0, text("lost"));
    let error = log.flush().await.unwrap_err();
    assert!(matches!(error, StoreError::LogFailed { .. }), "{error}");
    assert!(
        error.to_string().contains("no session `no-such-session`"),
        "{error}"
    );
    assert!(store.run(&run.id).await.unwrap().is_none());
    log.append("shopper", 0, text("after"));
    assert!(log.flush().await.is_err(), "the log takes no more");

    let session = store.create_session("shopper", "").await.unwrap();
    let taken = store.start_run(&session.id, "shopper", None).await.unwrap();
    let (_, twin) = RunLog::start(&store, &session.id, "shopper", Some(&taken.id));
    twin.append("shopper", 0, text("twin"));
    let error = twin.flush().await.unwrap_err();
    assert!(error.to_string().contains("exists already"), "{error}");
    assert!(store.parts_after(&taken.id, 0).await.unwrap().is_empty());

    let (stopped, stopped_log) = RunLog::start(&store, &session.id, "shopper", None);
    stopped_log.append("shopper", 0, text("working"));
    stopped_log.flush().await.unwrap();
    store
        .set_run_status(&stopped.id, RunStatus::Interrupted)
        .await
        .unwrap();
    stopped_log.append("shopper", 0, finish());
    let error = stopped_log.flush().await.unwrap_err();
    assert!(
        error.to_string().contains("already ended (interrupted)"),
        "{error}"
    );
    let kept = store.run(&stopped.id).await.unwrap().unwrap();
    assert_eq!((kept.status, kept.last_seq), (RunStatus::Interrupted, 1));
    store.close().await;
}

/// Set in the child process of [`a_log_killed_mid_run_keeps_every_flushed_part`].
const LOG_CHILD_URL: &str = "WMA_STORE_TEST_LOG_CHILD_URL";

/// In the child process: starts a run with `RunLog::start` and appends to
/// it until killed, printing the last sequence number after each flush
/// that returned `Ok` (what a host may report as durable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_log_writer() {
    let Some(url) = std::env::var_os(LOG_CHILD_URL) else {
        return; // only the child does anything
    };
    let options = StoreOptions::in_data_dir(".").with_database_url(url.to_string_lossy());
    let store = Store::open(options).await.unwrap();
    let session = store.create_session("shopper", "").await.unwrap();
    let (run, log) = RunLog::start(&store, &session.id, "shopper", None);
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY {}", run.id).unwrap();
    out.flush().unwrap();
    let long = "x".repeat(4096);
    for n in 1u64.. {
        let seq = log.append("shopper", 0, text(&format!("{n} {long}")));
        if n % 3 == 0 {
            log.flush().await.unwrap();
            writeln!(out, "DURABLE {seq}").unwrap();
            out.flush().unwrap();
        }
    }
}

async fn a_log_killed_mid_run_keeps_every_flushed_part(kind: Kind) {
    let db = Db::new(kind);
    db.open().await.close().await;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_log_writer",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(LOG_CHILD_URL, db.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut run = None;
    let mut durable = 0u64;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some((_, rest)) = line.split_once("READY ") {
            run = Some(rest.trim().to_string());
        } else if let Some(seq) = line.strip_prefix("DURABLE ") {
            durable = seq.parse().unwrap();
            if durable >= 60 {
                break;
            }
        }
    }
    let run = run.expect("the child never got ready");
    child.kill().unwrap();
    child.wait().unwrap();
    drop(lines);

    let store = db.open().await;
    assert_eq!(store.recovery().interrupted_runs, vec![run.clone()]);
    let parts = store.parts_after(&run, 0).await.unwrap();
    assert!(
        parts.len() as u64 >= durable,
        "the child was told {durable} parts were durable, the log has {}",
        parts.len()
    );
    for (i, part) in parts.iter().enumerate() {
        assert_eq!(part.seq, i as u64 + 1, "no gap and no torn part");
        let AgentStreamPart::Text { text } = &part.part else {
            panic!("part {} is not the text written: {:?}", part.seq, part.part);
        };
        assert!(text.starts_with(&format!("{} ", part.seq)) && text.len() > 4096);
    }
    store.close().await;
}

#[cfg(unix)]
fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Every file the SQLite store writes is its owner's alone, whatever the
/// process's umask lets others have: the data folder `0700`, the database,
/// its WAL and shared-memory files and the host's lock file `0600`.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_store_is_readable_by_its_owner_only() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("nested").join("data");
    let store = Store::open(StoreOptions::in_data_dir(&data)).await.unwrap();
    let session = store.create_session("shopper", "secret").await.unwrap();
    let run = store.start_run(&session.id, "shopper", None).await.unwrap();
    store
        .append_part(&run.id, "shopper", 0, &text("a tool's output"))
        .await
        .unwrap();
    assert_eq!(mode_of(&data), 0o700);
    assert_eq!(mode_of(&root.path().join("nested")), 0o700);
    let mut files: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    for expected in ["wma.db", "wma.db-shm", "wma.db-wal"] {
        assert!(files.iter().any(|f| f == expected), "{files:?}");
    }
    assert!(files.iter().any(|f| f.contains(".host-")), "{files:?}");
    for file in &files {
        assert_eq!(mode_of(&data.join(file)), 0o600, "{file}");
    }
    drop(store);
}

/// A store that others can read (made by hand, or by an older version)
/// opens with a warning naming each such path.
#[cfg(unix)]
#[tokio::test(flavor = "current_thread")]
async fn a_store_others_can_read_is_a_warning_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(data.join("wma.db"), b"").unwrap();
    std::fs::set_permissions(data.join("wma.db"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let (logs, _guard) = wma_testkit::capture_logs();
    let store = Store::open(StoreOptions::in_data_dir(&data)).await.unwrap();
    let text = logs.text();
    assert!(text.contains("can be read by other users"), "{text}");
    assert!(text.contains(&format!("path={}", data.display())), "{text}");
    assert!(
        text.contains(&format!("path={}", data.join("wma.db").display())),
        "{text}"
    );
    drop(store);
    // A private store opens without it.
    let private = root.path().join("private");
    let (logs, _guard) = wma_testkit::capture_logs();
    let store = Store::open(StoreOptions::in_data_dir(&private))
        .await
        .unwrap();
    assert!(
        !logs.text().contains("can be read by other users"),
        "{}",
        logs.text()
    );
    drop(store);
}
