//! What the durable run log costs a run: a scripted agent run (the
//! scripted provider and `run_local_agent`, three tool calls and an answer,
//! 12 parts) without persistence, and with the run started in the store
//! and every part persisted as it streams, on SQLite (a file in a temporary
//! data folder, WAL, synchronous=NORMAL) and on a real PostgreSQL server
//! (started here, with PostgreSQL's default settings, fsync on; the
//! store's connections commit with synchronous_commit off). Each backend
//! five ways: `Store::append_part` awaited per part; a `RunLog` (queued
//! per part, group commit) after an awaited `Store::start_run`, flushed
//! before the run counts as done, and the same timed to the run's last
//! part (the log's cost on the run's path); and both again with the run
//! started by `RunLog::start` (its row queued ahead of its parts and
//! committed with the first of them).
//!
//! Two kinds of run: the scripted provider answering at once (so the run is
//! only the loop's machinery, under a millisecond: the harshest baseline),
//! and the same run with each reply taking `GENERATION` (a stand-in for a
//! model's generation, which on an on-device model takes far longer).
//!
//! Run with `cargo bench -p wma-store --bench log_cost` (PostgreSQL's
//! server binaries come from `scripts/install-peers.sh`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use wma_agent::{
    AgentRunRequest, AgentStreamPart, ChatMessage, LocalLoopOptions, ToolDefinition,
    run_local_agent,
};
use wma_store::{RunLog, Store, StoreOptions};
use wma_testkit::{InMemoryToolHost, PostgresServer, ScriptedProvider, ScriptedReply};

/// Runs measured per variant with instant replies.
const RUNS: usize = 300;
/// Runs measured per variant with delayed replies (enough for the
/// timer's millisecond steps to even out in the medians).
const DELAYED_RUNS: usize = 100;
/// The delayed replies' wait: a fast generation (a small on-device model
/// takes longer than this for a tool call of a dozen tokens).
const GENERATION: Duration = Duration::from_millis(20);

fn host() -> Arc<InMemoryToolHost> {
    let host = Arc::new(InMemoryToolHost::new());
    let object = |props: serde_json::Value| json!({"type": "object", "properties": props});
    host.add(
        ToolDefinition::new(
            "search_products",
            "Searches the catalog.",
            object(json!({"query": {"type": "string"}})),
        ),
        |_| Ok(r#"[{"id": "p-17", "name": "Summit 30L", "price": 89}]"#.to_string()),
    );
    host.add(
        ToolDefinition::new(
            "add_to_cart",
            "Adds a product to the cart.",
            object(json!({"id": {"type": "string"}, "quantity": {"type": "integer"}})),
        ),
        |_| Ok(r#"{"ok": true}"#.to_string()),
    );
    host.add(
        ToolDefinition::new("view_cart", "Shows the cart.", object(json!({}))),
        |_| Ok(r#"{"items": [{"id": "p-17", "quantity": 1}], "total": 89}"#.to_string()),
    );
    host
}

fn script(delay: Option<Duration>) -> Vec<ScriptedReply> {
    let replies = [
        json!({"name": "search_products", "arguments": {"query": "waterproof backpack"}})
            .to_string(),
        json!({"name": "add_to_cart", "arguments": {"id": "p-17", "quantity": 1}}).to_string(),
        json!({"name": "view_cart", "arguments": {}}).to_string(),
        "The Summit 30L (p-17) is in your cart; the total is 89.".to_string(),
    ];
    replies
        .into_iter()
        .map(|text| {
            let reply = ScriptedReply::text(text);
            match delay {
                Some(delay) => reply.delayed(delay),
                None => reply,
            }
        })
        .collect()
}

/// How a run's parts are persisted.
#[derive(Clone)]
enum Persist {
    /// Not at all.
    Nothing,
    /// `Store::append_part` for each part, awaited before the next is
    /// read (durable before it is forwarded).
    EachPart(Store, String),
    /// `RunLog::append` for each part (queued at once, committed by the
    /// writer in bursts), and a flush at the run's end: the whole log is
    /// durable when the run is counted done.
    RunLog(Store, String),
    /// The same, the run timed up to its last part: what the log costs on
    /// the run's own path (the flush follows, untimed, so that one run's
    /// writes do not spill into the next).
    RunLogUntilLastPart(Store, String),
    /// `RunLog::start`: the run's row queued ahead of its parts (no commit
    /// of its own, none awaited to start), the log flushed at the end.
    Queued(Store, String),
    /// The same, timed to the run's last part.
    QueuedUntilLastPart(Store, String),
}

/// One run, persisted as `persist` says; returns its time and number of
/// parts.
async fn one_run(
    host: &Arc<InMemoryToolHost>,
    delay: Option<Duration>,
    persist: &Persist,
) -> (Duration, usize, Duration) {
    let options = LocalLoopOptions {
        tools_inline: true,
        ..LocalLoopOptions::default()
    };
    let messages = vec![ChatMessage::user(
        "Find a waterproof backpack and add it to my cart.",
    )];
    let start = Instant::now();
    let provider = ScriptedProvider::new(script(delay));
    let request = AgentRunRequest::new(messages, host.clone());
    let mut stream = run_local_agent(provider, request, options);
    let mut parts = 0;
    let started = Instant::now();
    let (run, log) = match persist {
        Persist::Nothing => (None, None),
        Persist::EachPart(store, session) => {
            let run = store
                .start_run(session, "shopper", None)
                .await
                .expect("start run");
            (Some(run.id), None)
        }
        Persist::RunLog(store, session) | Persist::RunLogUntilLastPart(store, session) => {
            let run = store
                .start_run(session, "shopper", None)
                .await
                .expect("start run");
            let log = RunLog::for_run(store, &run);
            (None, Some(log))
        }
        Persist::Queued(store, session) | Persist::QueuedUntilLastPart(store, session) => {
            let (_, log) = RunLog::start(store, session, "shopper", None);
            (None, Some(log))
        }
    };
    let start_cost = started.elapsed();
    while let Some(part) = stream.next().await {
        parts += 1;
        if matches!(part, AgentStreamPart::Error { .. }) {
            panic!("the scripted run failed: {part:?}");
        }
        match (persist, &run, &log) {
            (Persist::EachPart(store, _), Some(run), _) => {
                store
                    .append_part(run, "shopper", 0, &part)
                    .await
                    .expect("append");
            }
            (_, _, Some(log)) => {
                std::hint::black_box(log.append("shopper", 0, part));
            }
            _ => {
                std::hint::black_box(&part);
            }
        }
    }
    let mut elapsed = start.elapsed();
    if let Some(log) = log {
        log.flush().await.expect("flush");
        if matches!(persist, Persist::RunLog(..) | Persist::Queued(..)) {
            elapsed = start.elapsed();
        }
    }
    (elapsed, parts, start_cost)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

struct Row {
    name: &'static str,
    median: Duration,
    /// Starting the run in the store (and opening its log).
    start: Duration,
}

/// Measures the variants interleaved (one run of each in turn), so that
/// a slower stretch of the machine hits all of them alike.
async fn measure(
    host: &Arc<InMemoryToolHost>,
    delay: Option<Duration>,
    runs: usize,
    variants: &[(&'static str, Persist)],
) -> (Vec<Row>, usize) {
    let mut times = vec![Vec::with_capacity(runs); variants.len()];
    let mut starts = vec![Vec::with_capacity(runs); variants.len()];
    let mut parts = 0;
    // Warm-up: connections open, statements prepared, caches filled.
    for (_, persist) in variants {
        for _ in 0..3 {
            one_run(host, delay, persist).await;
        }
    }
    for _ in 0..runs {
        for (i, (_, persist)) in variants.iter().enumerate() {
            let (time, n, start) = one_run(host, delay, persist).await;
            times[i].push(time);
            starts[i].push(start);
            parts = n;
        }
    }
    let rows = variants
        .iter()
        .zip(times.into_iter().zip(starts))
        .map(|((name, _), (times, starts))| Row {
            name,
            median: median(times),
            start: median(starts),
        })
        .collect();
    (rows, parts)
}

/// The table: each variant's median run, what starting the run in the
/// store took of it, the rest of the difference to the run without
/// persistence spread over the parts, and the whole difference in % of
/// that run.
fn print(title: &str, rows: &[Row], parts: usize) {
    println!("\n{title} ({parts} parts a run; medians)");
    println!(
        "{:<42} {:>12} {:>12} {:>14} {:>11}",
        "variant", "run", "run start", "cost per part", "overhead"
    );
    let base = rows[0].median.as_secs_f64();
    for (i, row) in rows.iter().enumerate() {
        let micros = |d: f64| format!("{:.1} µs", d * 1e6);
        let (start, per_part, overhead) = if i == 0 {
            ("-".to_string(), "-".to_string(), "-".to_string())
        } else {
            let extra = row.median.as_secs_f64() - base;
            let start = row.start.as_secs_f64();
            (
                micros(start),
                micros((extra - start) / parts as f64),
                format!("{:+.2} %", extra / base * 100.0),
            )
        };
        println!(
            "{:<42} {:>12} {:>12} {:>14} {:>11}",
            row.name,
            micros(row.median.as_secs_f64()),
            start,
            per_part,
            overhead
        );
    }
}

/// Runs per variant when `cargo test --all-targets` runs this bench: it
/// passes no `--bench` (`cargo bench` does), and a test run wants to see
/// every variant work, not the numbers.
const SMOKE_RUNS: usize = 3;

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let (runs, delayed_runs) = if smoke {
        (SMOKE_RUNS, SMOKE_RUNS)
    } else {
        (RUNS, DELAYED_RUNS)
    };
    if smoke {
        println!("a smoke run, {SMOKE_RUNS} runs a variant: `cargo bench` gives the numbers");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temporary folder");
    let postgres = PostgresServer::start_with(&[]).unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        let host = host();
        let sqlite = Store::open(StoreOptions::in_data_dir(dir.path()))
            .await
            .expect("open SQLite");
        let pg =
            Store::open(StoreOptions::in_data_dir(dir.path()).with_database_url(postgres.url()))
                .await
                .expect("open PostgreSQL");
        let sqlite_session = sqlite.create_session("shopper", "bench").await.unwrap().id;
        let pg_session = pg.create_session("shopper", "bench").await.unwrap().id;
        let variants = [
            ("no persistence", Persist::Nothing),
            (
                "SQLite, append_part each part",
                Persist::EachPart(sqlite.clone(), sqlite_session.clone()),
            ),
            (
                "SQLite, RunLog + flush at the end",
                Persist::RunLog(sqlite.clone(), sqlite_session.clone()),
            ),
            (
                "SQLite, RunLog, to the last part",
                Persist::RunLogUntilLastPart(sqlite.clone(), sqlite_session.clone()),
            ),
            (
                "SQLite, RunLog::start + flush at end",
                Persist::Queued(sqlite.clone(), sqlite_session.clone()),
            ),
            (
                "SQLite, RunLog::start, to the last part",
                Persist::QueuedUntilLastPart(sqlite.clone(), sqlite_session),
            ),
            (
                "PostgreSQL, append_part each part",
                Persist::EachPart(pg.clone(), pg_session.clone()),
            ),
            (
                "PostgreSQL, RunLog + flush at end",
                Persist::RunLog(pg.clone(), pg_session.clone()),
            ),
            (
                "PostgreSQL, RunLog, to the last part",
                Persist::RunLogUntilLastPart(pg.clone(), pg_session.clone()),
            ),
            (
                "PostgreSQL, RunLog::start + flush at end",
                Persist::Queued(pg.clone(), pg_session.clone()),
            ),
            (
                "PostgreSQL, RunLog::start, to last part",
                Persist::QueuedUntilLastPart(pg.clone(), pg_session),
            ),
        ];
        let (rows, parts) = measure(&host, None, runs, &variants).await;
        print(
            &format!("scripted run, replies at once, {runs} runs each"),
            &rows,
            parts,
        );
        let (rows, parts) = measure(&host, Some(GENERATION), delayed_runs, &variants).await;
        print(
            &format!(
                "scripted run, each reply after {} ms, {delayed_runs} runs each",
                GENERATION.as_millis()
            ),
            &rows,
            parts,
        );
        sqlite.close().await;
        pg.close().await;
    });
}
