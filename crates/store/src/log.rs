//! A run's log written off the run's path: [`RunLog::append`] numbers a
//! part and queues it at once; a writer task commits what queued up in one
//! statement where it can (group commit), so a run pays a channel send per
//! part and the database a commit per burst of parts instead of one per
//! part. [`RunLog::start`] queues the run's own row the same way: it is
//! committed with the run's first parts, in their statement or
//! transaction, instead of in a commit of its own that the run waits for.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, Connection, Row};
use tokio::sync::{mpsc, oneshot};
use wma_agent::AgentStreamPart;

use crate::error::is_unique_violation;
use crate::store::{Backend, now_ms};
use crate::{Run, RunStatus, Store, StoreError, new_id};

/// How many parts go into one INSERT statement (SQLite allows 32766
/// parameters a statement; six a part).
const ROWS_PER_INSERT: usize = 200;
/// How often a batch is tried before the log gives up (a database that
/// went away for a moment), and the wait between tries.
const WRITE_TRIES: usize = 3;
const RETRY_WAIT: Duration = Duration::from_millis(200);

pub(crate) enum Msg {
    /// The run's row, queued by [`RunLog::start`]: always the first.
    Start(RunStart),
    Part(Queued),
    Flush(oneshot::Sender<Result<(), StoreError>>),
}

/// A run's row that waits for the writer.
pub(crate) struct RunStart {
    session_id: String,
    agent: String,
    host: String,
    at: i64,
}

/// A run whose row is queued and not yet written, as the store keeps it:
/// a query about the run first flushes its log, so that a run started by
/// [`RunLog::start`] reads like one started by [`Store::start_run`].
pub(crate) struct Starting {
    pub(crate) session_id: String,
    pub(crate) tx: mpsc::UnboundedSender<Msg>,
    /// Tells this log's entry from a later one under the same run id (a
    /// start that will fail with `RunExists`).
    pub(crate) token: u64,
}

/// Waits until the writer behind `tx` has committed what was queued
/// before; a writer that stopped or failed answers at once (the query that
/// follows reports what the database holds).
pub(crate) async fn settle(tx: &mpsc::UnboundedSender<Msg>) {
    let (done, wait) = oneshot::channel();
    if tx.send(Msg::Flush(done)).is_ok() {
        let _ = wait.await;
    }
}

pub(crate) struct Queued {
    seq: u64,
    agent: String,
    depth: u32,
    sub_run: String,
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
        tokio::spawn(writer(store.clone(), run_id.clone(), rx, None));
        Self {
            run_id,
            next: Arc::new(AtomicU64::new(run.last_seq + 1)),
            tx,
        }
    }

    /// Starts a run of `agent` in the session, `running`, on this host,
    /// and returns it with its log, without waiting for the database: the
    /// run's row is queued ahead of its parts and committed with the
    /// first of them (one statement on PostgreSQL, one transaction on
    /// SQLite), so a run pays no commit to start. `id` is the host's run
    /// id; `None` makes one. Starts the writer task, so it is called
    /// within a Tokio runtime.
    ///
    /// What [`Store::start_run`] reports at once is reported by the next
    /// [`RunLog::flush`] here, as [`StoreError::LogFailed`] (no such
    /// session, a run with this id exists already), and the log takes
    /// nothing more. Until the row is committed this store answers every
    /// query about the run (reading it, its parts, its calls and
    /// approvals, recording a call or an approval, setting its status)
    /// after flushing the log first, so those see the run as if it had
    /// been started by [`Store::start_run`]; other processes see it from
    /// its first commit. A host that dies before that commit leaves no
    /// trace of the run: no part of it was durable yet either.
    pub fn start(store: &Store, session_id: &str, agent: &str, id: Option<&str>) -> (Run, Self) {
        let now = now_ms();
        let run = Run {
            id: id.map_or_else(new_id, str::to_string),
            session_id: session_id.to_string(),
            agent: agent.to_string(),
            host: store.host().to_string(),
            status: RunStatus::Running,
            last_seq: 0,
            error: None,
            created_at: now,
            updated_at: now,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let run_id: Arc<str> = Arc::from(run.id.as_str());
        // The channel is empty and its receiver alive: this send succeeds.
        let _ = tx.send(Msg::Start(RunStart {
            session_id: run.session_id.clone(),
            agent: run.agent.clone(),
            host: run.host.clone(),
            at: now,
        }));
        // Filed before the writer runs, which removes the entry once the
        // row is written.
        let token = store.starting(&run.id, &run.session_id, tx.clone());
        tokio::spawn(writer(store.clone(), run_id.clone(), rx, Some(token)));
        let log = Self {
            run_id,
            next: Arc::new(AtomicU64::new(1)),
            tx,
        };
        (run, log)
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
        self.append_in(agent, depth, "", part)
    }

    /// [`RunLog::append`] for a part of the sub-agent run `sub_run`
    /// (`wma_runtime::TaggedPart::sub_run`: `"2"` for the run the second
    /// delegation started, `""` for the run's own parts), which
    /// [`LoggedPart::sub_run`](crate::LoggedPart::sub_run) gives back.
    pub fn append_in(&self, agent: &str, depth: u32, sub_run: &str, part: AgentStreamPart) -> u64 {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        // A send fails only once the writer has stopped, which happens
        // only after a write failed: the next flush reports that.
        let _ = self.tx.send(Msg::Part(Queued {
            seq,
            agent: agent.to_string(),
            depth,
            sub_run: sub_run.to_string(),
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

/// What the writer took from its queue for one batch.
#[derive(Default)]
struct Gathered {
    start: Option<RunStart>,
    parts: Vec<Queued>,
    flushes: Vec<oneshot::Sender<Result<(), StoreError>>>,
}

impl Gathered {
    fn take(&mut self, msg: Msg) {
        match msg {
            Msg::Start(row) => self.start = Some(row),
            Msg::Part(part) => self.parts.push(part),
            Msg::Flush(done) => self.flushes.push(done),
        }
    }
}

/// The writer: takes everything queued, commits it as one batch, answers
/// the flushes that were queued with it. `starting`: the token of the
/// store's entry for a run whose row is queued, removed once the row's
/// batch is written (or failed).
async fn writer(
    store: Store,
    run_id: Arc<str>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    mut starting: Option<u64>,
) {
    let mut failed: Option<String> = None;
    // Held from one batch to the next while more is queued: a connection
    // taken from the pool and put back costs a ping each time.
    let mut conn: Option<PoolConnection<Any>> = None;
    while let Some(first) = rx.recv().await {
        let mut got = Gathered::default();
        got.take(first);
        while let Ok(msg) = rx.try_recv() {
            got.take(msg);
        }
        let Gathered {
            start,
            parts: batch,
            flushes,
        } = got;
        if failed.is_none() && (start.is_some() || !batch.is_empty()) {
            let mut tries = 0;
            loop {
                tries += 1;
                let written = match &mut conn {
                    Some(conn) => write_batch(&store, conn, &run_id, start.as_ref(), &batch).await,
                    None => match store.pool().acquire().await {
                        Ok(taken) => {
                            let conn = conn.insert(taken);
                            write_batch(&store, conn, &run_id, start.as_ref(), &batch).await
                        }
                        Err(e) => Err(StoreError::from_sqlx(store.location(), e)),
                    },
                };
                if written.is_err() {
                    // Back to the pool, which tests it on the way.
                    conn = None;
                }
                match written {
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
        if start.is_some()
            && let Some(token) = starting.take()
        {
            store.started(&run_id, token);
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
        if rx.is_empty() {
            conn = None;
        }
    }
    // Every sender is gone; an entry left (a start never taken, which
    // cannot happen as it is sent first) would keep nothing alive.
    if let Some(token) = starting {
        store.started(&run_id, token);
    }
}

/// The run's row: `$1` id, `$2` agent, `$3` host, `$4` created, `$5`
/// session, `$6` status, `$7` error, `$8` updated; only in a session that
/// exists, numbered after the session's other runs.
const INSERT_RUN: &str = "INSERT INTO runs (id, session_id, agent, host, status, error, ordinal,
                                           created_at, updated_at)
     SELECT $1, id, $2, $3, $6, $7,
            COALESCE((SELECT MAX(r.ordinal) FROM runs r WHERE r.session_id = $5), 0) + 1, $4, $8
     FROM sessions WHERE id = $5";

/// The run's final status, only while it is open: `$1` run, `$2` status,
/// `$3` error, `$4` updated.
const END_RUN: &str = "UPDATE runs SET status = $2, error = $3, updated_at = $4
     WHERE id = $1 AND status IN ('running', 'waiting-for-approval')";

/// A batch in as few statements and round trips as it can be:
/// - parts only: one multi-row INSERT (one statement commits by itself);
/// - with the run's row or its terminal part, on PostgreSQL: one
///   statement too, the row's INSERT (or the run's final status) in a
///   data-modifying WITH whose row the parts' INSERT takes its run id
///   from, so the parts are stored only with it;
/// - the same on SQLite (which has no data-modifying WITH), and batches
///   over [`ROWS_PER_INSERT`] parts: one transaction, the run's row or
///   status first (which takes SQLite's write lock at once), then the
///   parts.
///
/// A run that starts and ends in one batch is inserted with its final
/// status.
async fn write_batch(
    store: &Store,
    conn: &mut AnyConnection,
    run_id: &str,
    start: Option<&RunStart>,
    batch: &[Queued],
) -> Result<(), StoreError> {
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
    let (status, error) = ending.clone().unwrap_or((RunStatus::Running, None));
    let ended = End {
        run_id,
        status: status.as_str(),
        error: error.as_deref(),
        now,
    };
    // What a statement that wrote nothing means.
    let no_session = |start: &RunStart| StoreError::SessionNotFound(start.session_id.clone());
    let run_exists = |e: sqlx::Error| {
        if is_unique_violation(&e) {
            StoreError::RunExists(run_id.to_string())
        } else {
            db(e)
        }
    };
    if start.is_none() && ending.is_none() && batch.len() <= ROWS_PER_INSERT {
        let sql = format!(
            "INSERT INTO parts (run_id, seq, agent, depth, body, created_at, sub_run) VALUES {}",
            part_rows(2, batch.len(), "$1, ")
        );
        return bind_parts(sqlx::query(&sql).bind(run_id), batch, &bodies, now)
            .execute(&mut *conn)
            .await
            .map(|_| ())
            .map_err(db);
    }
    if let Some(start) = start
        && batch.is_empty()
    {
        let done = ended
            .bind_start(sqlx::query(INSERT_RUN), start)
            .execute(&mut *conn)
            .await
            .map_err(run_exists)?;
        return if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(no_session(start))
        };
    }
    if store.backend() == Backend::Postgres && batch.len() <= ROWS_PER_INSERT {
        let (with, first) = match start {
            Some(_) => (format!("{INSERT_RUN} RETURNING id"), 9),
            None => (format!("{END_RUN} RETURNING id"), 5),
        };
        let sql = format!(
            "WITH run AS ({with})
             INSERT INTO parts (run_id, seq, agent, depth, body, created_at, sub_run)
             SELECT run.id, v.seq, v.agent, v.depth, v.body, v.created_at, v.sub_run
             FROM run, (VALUES {}) AS v (seq, agent, depth, body, created_at, sub_run)",
            part_rows(first, batch.len(), "")
        );
        let query = match start {
            Some(start) => ended.bind_start(sqlx::query(&sql), start),
            None => ended.bind_end(sqlx::query(&sql)),
        };
        let done = bind_parts(query, batch, &bodies, now)
            .execute(&mut *conn)
            .await
            .map_err(run_exists)?;
        if done.rows_affected() > 0 {
            return Ok(());
        }
        return Err(match start {
            Some(start) => no_session(start),
            None => ended_error(store, conn, run_id).await,
        });
    }
    let mut tx = conn.begin().await.map_err(db)?;
    if let Some(start) = start {
        let done = ended
            .bind_start(sqlx::query(INSERT_RUN), start)
            .execute(&mut *tx)
            .await
            .map_err(run_exists)?;
        if done.rows_affected() == 0 {
            drop(tx);
            return Err(no_session(start));
        }
    } else if ending.is_some() {
        let done = ended
            .bind_end(sqlx::query(END_RUN))
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        if done.rows_affected() == 0 {
            drop(tx);
            return Err(ended_error(store, conn, run_id).await);
        }
    }
    for (chunk, bodies) in batch
        .chunks(ROWS_PER_INSERT)
        .zip(bodies.chunks(ROWS_PER_INSERT))
    {
        let sql = format!(
            "INSERT INTO parts (run_id, seq, agent, depth, body, created_at, sub_run) VALUES {}",
            part_rows(2, chunk.len(), "$1, ")
        );
        bind_parts(sqlx::query(&sql).bind(run_id), chunk, bodies, now)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
    }
    tx.commit().await.map_err(db)?;
    Ok(())
}

/// The run's status after a batch (`running` unless the batch ends it),
/// bound into [`INSERT_RUN`] and [`END_RUN`].
struct End<'a> {
    run_id: &'a str,
    status: &'static str,
    error: Option<&'a str>,
    now: i64,
}

impl<'a> End<'a> {
    fn bind_start<'q>(&self, query: AnyQuery<'q>, start: &'q RunStart) -> AnyQuery<'q>
    where
        'a: 'q,
    {
        query
            .bind(self.run_id)
            .bind(start.agent.as_str())
            .bind(start.host.as_str())
            .bind(start.at)
            .bind(start.session_id.as_str())
            .bind(self.status)
            .bind(self.error)
            .bind(self.now)
    }

    fn bind_end<'q>(&self, query: AnyQuery<'q>) -> AnyQuery<'q>
    where
        'a: 'q,
    {
        query
            .bind(self.run_id)
            .bind(self.status)
            .bind(self.error)
            .bind(self.now)
    }
}

/// Why a run could not be given its final status: it ended already, or
/// there is none. Read on the writer's own connection, which a pool of one
/// would otherwise wait for.
async fn ended_error(store: &Store, conn: &mut AnyConnection, run_id: &str) -> StoreError {
    let status = sqlx::query("SELECT status FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_optional(&mut *conn)
        .await
        .and_then(|row| row.map(|r| r.try_get::<String, _>(0)).transpose());
    match status {
        Ok(Some(status)) => StoreError::RunEnded {
            run_id: run_id.to_string(),
            status,
        },
        Ok(None) => StoreError::RunNotFound(run_id.to_string()),
        Err(e) => StoreError::from_sqlx(store.location(), e),
    }
}

/// `rows` value lists of five parameters each (a part's seq, agent,
/// depth, body, time), numbered from `$first`, each after `prefix`.
fn part_rows(first: usize, rows: usize, prefix: &str) -> String {
    let mut sql = String::new();
    for i in 0..rows {
        let p = first + i * PART_VALUES;
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "({prefix}${}, ${}, ${}, ${}, ${}, ${})",
            p,
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            p + 5
        ));
    }
    sql
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// The values of one part's row besides its run: seq, agent, depth, body,
/// created_at, sub_run.
const PART_VALUES: usize = 6;

/// Binds each part's six values, after whatever the query has bound.
fn bind_parts<'q>(
    mut query: AnyQuery<'q>,
    chunk: &'q [Queued],
    bodies: &'q [String],
    now: i64,
) -> AnyQuery<'q> {
    for (q, body) in chunk.iter().zip(bodies) {
        query = query
            .bind(i64::try_from(q.seq).unwrap_or(i64::MAX))
            .bind(q.agent.as_str())
            .bind(i64::from(q.depth))
            .bind(body.as_str())
            .bind(now)
            .bind(q.sub_run.as_str());
    }
    query
}

#[cfg(test)]
mod tests {
    use super::part_rows;

    #[test]
    fn part_rows_number_six_parameters_a_part() {
        assert_eq!(
            part_rows(2, 2, "$1, "),
            "($1, $2, $3, $4, $5, $6, $7), ($1, $8, $9, $10, $11, $12, $13)"
        );
        assert_eq!(part_rows(9, 1, ""), "($9, $10, $11, $12, $13, $14)");
    }
}
