//! A run's log written off the run's path: [`RunLog::append`] numbers a
//! part and queues it at once; a writer task commits what queued up in one
//! transaction (group commit), so a run pays a channel send per part and
//! the database a commit per burst of parts instead of one per part.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use wma_agent::AgentStreamPart;

use crate::store::now_ms;
use crate::{Run, RunStatus, Store, StoreError};

/// How many parts go into one INSERT statement (SQLite allows 32766
/// parameters a statement; six a part).
const ROWS_PER_INSERT: usize = 200;
/// How often a batch is tried before the log gives up (a database that
/// went away for a moment), and the wait between tries.
const WRITE_TRIES: usize = 3;
const RETRY_WAIT: Duration = Duration::from_millis(200);

enum Msg {
    Part(Queued),
    Flush(oneshot::Sender<Result<(), StoreError>>),
}

struct Queued {
    seq: u64,
    agent: String,
    depth: u32,
    part: AgentStreamPart,
}

/// The durable log of one open run, written in the background. Cheap to
/// clone; clones share the numbering and the writer. The writer ends when
/// the last clone is dropped, after writing what was queued.
///
/// One writer per run: a `RunLog` numbers the run's parts itself (from the
/// run's last part when it was made), so a run is appended to either
/// through its `RunLog` or through [`Store::append_part`], not both.
#[derive(Clone)]
pub struct RunLog {
    run_id: Arc<str>,
    next: Arc<AtomicU64>,
    tx: mpsc::UnboundedSender<Msg>,
}

impl std::fmt::Debug for RunLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLog")
            .field("run_id", &self.run_id)
            .field("next", &self.next.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl RunLog {
    /// The log of an open run (running or waiting for approval); its next
    /// part follows the run's last stored one. Starts the writer task, so
    /// it is called within a Tokio runtime.
    pub async fn open(store: &Store, run_id: &str) -> Result<Self, StoreError> {
        let run = store
            .run(run_id)
            .await?
            .ok_or_else(|| StoreError::RunNotFound(run_id.to_string()))?;
        if run.status.is_ended() {
            return Err(StoreError::RunEnded {
                run_id: run_id.to_string(),
                status: run.status.to_string(),
            });
        }
        Ok(Self::for_run(store, &run))
    }

    /// The log of a run the caller just started or read (no query: the
    /// numbering goes on from `run.last_seq`). Starts the writer task, so
    /// it is called within a Tokio runtime.
    pub fn for_run(store: &Store, run: &Run) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let run_id: Arc<str> = Arc::from(run.id.as_str());
        tokio::spawn(writer(store.clone(), run_id.clone(), rx));
        Self {
            run_id,
            next: Arc::new(AtomicU64::new(run.last_seq + 1)),
            tx,
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Numbers the part and queues it for the writer; returns its sequence
    /// number (the SSE event id) without waiting for the database. It is
    /// durable after the next [`RunLog::flush`] returns `Ok`. The run's
    /// own terminal part (depth 0 `finish` or `error`) ends the run when
    /// it is written.
    pub fn append(&self, agent: &str, depth: u32, part: AgentStreamPart) -> u64 {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        // A send fails only once the writer has stopped, which happens
        // only after a write failed: the next flush reports that.
        let _ = self.tx.send(Msg::Part(Queued {
            seq,
            agent: agent.to_string(),
            depth,
            part,
        }));
        seq
    }

    /// Waits until every part appended before this call is committed. An
    /// error says the log could not be written (the database stayed away
    /// longer than the writer's retries); the parts from the failed batch
    /// on are not stored, and the log takes no more.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Msg::Flush(done)).is_err() {
            return Err(self.stopped());
        }
        wait.await.unwrap_or_else(|_| Err(self.stopped()))
    }

    fn stopped(&self) -> StoreError {
        StoreError::LogFailed {
            run_id: self.run_id.to_string(),
            reason: "its writer stopped after a failed write".to_string(),
        }
    }
}

/// The writer: takes everything queued, commits it as one batch, answers
/// the flushes that were queued with it.
async fn writer(store: Store, run_id: Arc<str>, mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut failed: Option<String> = None;
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::new();
        let mut flushes = Vec::new();
        let mut take = |msg| match msg {
            Msg::Part(part) => batch.push(part),
            Msg::Flush(done) => flushes.push(done),
        };
        take(first);
        while let Ok(msg) = rx.try_recv() {
            take(msg);
        }
        if failed.is_none() && !batch.is_empty() {
            let mut tries = 0;
            loop {
                tries += 1;
                match write_batch(&store, &run_id, &batch).await {
                    Ok(()) => break,
                    Err(e) if e.is_unavailable() && tries < WRITE_TRIES => {
                        tokio::time::sleep(RETRY_WAIT).await;
                    }
                    Err(e) => {
                        tracing::warn!(run_id = %run_id, error = %e, "the run's log could not be written");
                        failed = Some(e.to_string());
                        break;
                    }
                }
            }
        }
        for done in flushes {
            let _ = done.send(match &failed {
                None => Ok(()),
                Some(reason) => Err(StoreError::LogFailed {
                    run_id: run_id.to_string(),
                    reason: reason.clone(),
                }),
            });
        }
    }
}

/// A batch in as few statements as a batch can be: a batch without the
/// run's terminal part is one multi-row INSERT (one statement commits by
/// itself: one round trip to the database); with it, one transaction that
/// gives the run its final status first (which takes SQLite's write lock
/// at once) and then inserts the parts. Batches over [`ROWS_PER_INSERT`]
/// parts are one transaction too.
async fn write_batch(store: &Store, run_id: &str, batch: &[Queued]) -> Result<(), StoreError> {
    let db = |e| StoreError::from_sqlx(store.location(), e);
    let ending = batch.iter().find_map(|q| match &q.part {
        AgentStreamPart::Finish { .. } if q.depth == 0 => Some((RunStatus::Finished, None)),
        AgentStreamPart::Error { message } if q.depth == 0 => {
            Some((RunStatus::Failed, Some(message.clone())))
        }
        _ => None,
    });
    let mut bodies = Vec::with_capacity(batch.len());
    for q in batch {
        bodies.push(
            serde_json::to_string(&q.part).map_err(|e| StoreError::Corrupt {
                what: format!("part {} of run `{run_id}`", q.seq),
                reason: e.to_string(),
            })?,
        );
    }
    let now = now_ms();
    if ending.is_none() && batch.len() <= ROWS_PER_INSERT {
        let sql = insert_sql(batch.len());
        return bind_parts(sqlx::query(&sql), batch, &bodies, run_id, now)
            .execute(store.pool())
            .await
            .map(|_| ())
            .map_err(db);
    }
    let mut tx = store.pool().begin().await.map_err(db)?;
    if let Some((status, error)) = &ending {
        let ended = sqlx::query(
            "UPDATE runs SET status = $2, error = $3, updated_at = $4
             WHERE id = $1 AND status IN ('running', 'waiting-for-approval')",
        )
        .bind(run_id)
        .bind(status.as_str())
        .bind(error.clone())
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        if ended.rows_affected() == 0 {
            drop(tx);
            return Err(match store.run(run_id).await? {
                Some(run) => StoreError::RunEnded {
                    run_id: run_id.to_string(),
                    status: run.status.to_string(),
                },
                None => StoreError::RunNotFound(run_id.to_string()),
            });
        }
    }
    for (chunk, bodies) in batch
        .chunks(ROWS_PER_INSERT)
        .zip(bodies.chunks(ROWS_PER_INSERT))
    {
        let sql = insert_sql(chunk.len());
        bind_parts(sqlx::query(&sql), chunk, bodies, run_id, now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    Ok(())
}

/// An INSERT of `rows` parts: `$1` the run, then five values a part.
fn insert_sql(rows: usize) -> String {
    let mut sql =
        String::from("INSERT INTO parts (run_id, seq, agent, depth, body, created_at) VALUES ");
    for i in 0..rows {
        let p = i * 5;
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "($1, ${}, ${}, ${}, ${}, ${})",
            p + 2,
            p + 3,
            p + 4,
            p + 5,
            p + 6
        ));
    }
    sql
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

fn bind_parts<'q>(
    query: AnyQuery<'q>,
    chunk: &'q [Queued],
    bodies: &'q [String],
    run_id: &'q str,
    now: i64,
) -> AnyQuery<'q> {
    let mut query = query.bind(run_id);
    for (q, body) in chunk.iter().zip(bodies) {
        query = query
            .bind(i64::try_from(q.seq).unwrap_or(i64::MAX))
            .bind(q.agent.as_str())
            .bind(i64::from(q.depth))
            .bind(body.as_str())
            .bind(now);
    }
    query
}
