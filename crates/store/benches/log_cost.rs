//! What the durable run log costs a run: a scripted agent run (the
//! scripted provider and `run_local_agent`, three tool calls and an answer,
//! 12 parts) without persistence, and with the run started in the store
//! and every part appended as it streams, on SQLite (a file in a temporary
//! data folder, WAL) and on a real PostgreSQL server (started here, with
//! PostgreSQL's default settings: fsync on).
//!
//! Two kinds of run: the scripted provider answering at once (so the run is
//! only the loop's machinery, tens of microseconds: the harshest baseline),
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
use wma_store::{Store, StoreOptions};
use wma_testkit::{InMemoryToolHost, PostgresServer, ScriptedProvider, ScriptedReply};

/// Runs measured per variant with instant replies.
const RUNS: usize = 300;
/// Runs measured per variant with delayed replies.
const DELAYED_RUNS: usize = 15;
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

/// One run; with a store, started in it and each part appended before the
/// next is read (as a host persists a part before it forwards it).
/// Returns the run's time and its number of parts.
async fn one_run(
    host: &Arc<InMemoryToolHost>,
    delay: Option<Duration>,
    store: Option<(&Store, &str)>,
) -> (Duration, usize) {
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
    let run = match store {
        Some((store, session)) => Some(
            store
                .start_run(session, "shopper", None)
                .await
                .expect("start run")
                .id,
        ),
        None => None,
    };
    while let Some(part) = stream.next().await {
        parts += 1;
        if let (Some((store, _)), Some(run)) = (store, &run) {
            store
                .append_part(run, "shopper", 0, &part)
                .await
                .expect("append");
        }
        std::hint::black_box(&part);
        if matches!(part, AgentStreamPart::Error { .. }) {
            panic!("the scripted run failed: {part:?}");
        }
    }
    (start.elapsed(), parts)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

struct Row {
    name: &'static str,
    median: Duration,
}

/// Measures the variants interleaved (one run of each in turn), so that
/// a slower stretch of the machine hits all of them alike.
async fn measure(
    host: &Arc<InMemoryToolHost>,
    delay: Option<Duration>,
    runs: usize,
    stores: &[(&'static str, Option<(Store, String)>)],
) -> (Vec<Row>, usize) {
    let mut times = vec![Vec::with_capacity(runs); stores.len()];
    let mut parts = 0;
    // Warm-up: connections open, statements prepared, caches filled.
    for (_, store) in stores {
        for _ in 0..3 {
            one_run(host, delay, store.as_ref().map(|(s, id)| (s, id.as_str()))).await;
        }
    }
    for _ in 0..runs {
        for (i, (_, store)) in stores.iter().enumerate() {
            let (time, n) =
                one_run(host, delay, store.as_ref().map(|(s, id)| (s, id.as_str()))).await;
            times[i].push(time);
            parts = n;
        }
    }
    let rows = stores
        .iter()
        .zip(times)
        .map(|((name, _), times)| Row {
            name,
            median: median(times),
        })
        .collect();
    (rows, parts)
}

fn print(title: &str, rows: &[Row], parts: usize) {
    println!("\n{title} ({parts} parts a run; medians)");
    println!(
        "{:<34} {:>12} {:>16} {:>12}",
        "variant", "run", "cost per part", "overhead"
    );
    let base = rows[0].median.as_secs_f64();
    for row in rows {
        let extra = row.median.as_secs_f64() - base;
        let (per_part, overhead) = if row.name == rows[0].name {
            ("-".to_string(), "-".to_string())
        } else {
            (
                format!("{:.1} µs", extra * 1e6 / parts as f64),
                format!("{:+.2} %", extra / base * 100.0),
            )
        };
        println!(
            "{:<34} {:>9.1} µs {:>16} {:>12}",
            row.name,
            row.median.as_secs_f64() * 1e6,
            per_part,
            overhead
        );
    }
}

fn main() {
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
        let stores = [
            ("no persistence", None),
            (
                "SQLite (WAL, synchronous=NORMAL)",
                Some((sqlite.clone(), sqlite_session)),
            ),
            (
                "PostgreSQL (defaults, fsync on)",
                Some((pg.clone(), pg_session)),
            ),
        ];
        let (rows, parts) = measure(&host, None, RUNS, &stores).await;
        print(
            &format!("scripted run, replies at once, {RUNS} runs each"),
            &rows,
            parts,
        );
        let (rows, parts) = measure(&host, Some(GENERATION), DELAYED_RUNS, &stores).await;
        print(
            &format!(
                "scripted run, each reply after {} ms, {DELAYED_RUNS} runs each",
                GENERATION.as_millis()
            ),
            &rows,
            parts,
        );
        sqlite.close().await;
        pg.close().await;
    });
}
