//! The store: opening (migrations, recovery) and every query. Each query
//! is one text for both backends (`$1` placeholders, which SQLite takes
//! too), run through sqlx's Any driver.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use serde_json::Value;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Executor, Row};
use wma_agent::{AgentStreamPart, ApprovalAnswer, ApprovalRequest, ChatMessage};

use crate::error::is_unique_violation;
use crate::host::{self, HostGuard};
use crate::log::{Msg, Starting, settle};
use crate::schema;
use crate::types::{
    Approval, CallRecord, CallStatus, LoggedPart, Recovery, Run, RunStatus, Session,
    SessionWithMessages, UnixMillis,
};
use crate::{RunLog, StoreError};

/// The SQLite file's name in the data folder.
pub const DEFAULT_DB_FILE: &str = "wma.db";
/// The host name a store records on its runs unless told another.
pub const DEFAULT_HOST: &str = "local";
/// Connections the pool keeps at most: enough for several runs appending
/// at once and a reader or two; SQLite serializes the writes anyway.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;
/// How long a request waits for a connection before it fails with
/// [`StoreError::Unavailable`]: a database that went away is reported in
/// seconds, not after sqlx's default of 30.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most characters of the first request kept as a session's title.
pub const TITLE_CHARS: usize = 80;
/// How often an append retries when a concurrent writer of the same run
/// took its sequence number (PostgreSQL, two hosts on one run).
const APPEND_RETRIES: usize = 8;

/// A connection idle this long is tested before it is used again (one
/// used more recently was tested when it went back to the pool).
const IDLE_TEST_AFTER: Duration = Duration::from_secs(1);

/// How long opening waits for another host's switch of a new SQLite file
/// to WAL.
const WAL_SWITCH_WAIT: Duration = Duration::from_secs(5);

/// SQLite's "database is locked" (`SQLITE_BUSY`, 5, and its extended codes).
pub(crate) fn is_busy(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e)
        if e.code().is_some_and(|c| c.parse::<i64>().is_ok_and(|c| c & 0xff == 5)))
}

/// Where the store keeps its data and how it names this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// A database URL (`postgres://…`, or `sqlite:///path`); `None`, the
    /// default, keeps an SQLite file [`DEFAULT_DB_FILE`] in `data_dir`.
    pub database_url: Option<String>,
    /// The data folder for the SQLite file (made when missing).
    pub data_dir: PathBuf,
    /// This host's name, recorded on each run it starts. On open the store
    /// marks only this host's unfinished runs interrupted, so hosts that
    /// share a PostgreSQL database need distinct names. Default
    /// [`DEFAULT_HOST`].
    pub host: String,
    /// Default [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: u32,
    /// Default [`DEFAULT_ACQUIRE_TIMEOUT`].
    pub acquire_timeout: Duration,
}

impl StoreOptions {
    /// SQLite in `data_dir`, this host named [`DEFAULT_HOST`].
    pub fn in_data_dir(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            database_url: None,
            data_dir: data_dir.into(),
            host: DEFAULT_HOST.to_string(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
        }
    }

    /// The database at `url` instead of the data folder's file.
    pub fn with_database_url(mut self, url: impl Into<String>) -> Self {
        self.database_url = Some(url.into());
        self
    }

    /// Names this host.
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.host = host.into();
        self
    }
}

/// The backend a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// An SQLite file, in WAL mode.
    Sqlite,
    /// A PostgreSQL server.
    Postgres,
}

/// Sessions, runs and their logs, consequential calls and approvals, in
/// one database. Cheap to clone: clones share the connection pool. Every
/// method may be called from many tasks at once.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    pool: AnyPool,
    backend: Backend,
    /// The file or the URL without its password, for messages.
    location: String,
    host: String,
    /// The SQLite database's file (`None` on PostgreSQL).
    sqlite_file: Option<PathBuf>,
    /// Holds the host name while the store is open, so that a second live
    /// process of the same name cannot open it and interrupt this one's
    /// runs.
    host_guard: HostGuard,
    recovery: Recovery,
    /// Runs started by [`RunLog::start`] whose row is not written yet, by
    /// id: a query about one flushes its log first.
    starting: Mutex<HashMap<String, Starting>>,
    /// Numbers the entries of `starting`.
    start_tokens: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.inner.backend)
            .field("location", &self.inner.location)
            .field("host", &self.inner.host)
            .finish_non_exhaustive()
    }
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> UnixMillis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// 32 random hex digits (128 bits from the OS).
pub fn new_id() -> String {
    let mut bytes = [0u8; 16];
    // The OS's generator does not fail on the platforms the host runs on;
    // if it ever did, the clock keeps ids unique (not unguessable).
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = nanos.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The URL with its password replaced, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// The SQLite URL of a file (`?`, `#` and `%` escaped, as sqlx decodes them).
pub(crate) fn sqlite_url(path: &Path) -> String {
    let mut escaped = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => escaped.push_str("%25"),
            '?' => escaped.push_str("%3F"),
            '#' => escaped.push_str("%23"),
            c => escaped.push(c),
        }
    }
    format!("sqlite://{escaped}?mode=rwc")
}

fn install_drivers() {
    static DRIVERS: Once = Once::new();
    DRIVERS.call_once(sqlx::any::install_default_drivers);
}

impl Store {
    /// Opens (or creates) the store: connects, migrates the schema, and
    /// recovers what this host left unfinished: its running runs become
    /// `interrupted` and its in-flight consequential calls `in-doubt`,
    /// while runs waiting for approval stay as they are (see
    /// [`Store::recovery`]).
    pub async fn open(options: StoreOptions) -> Result<Self, StoreError> {
        install_drivers();
        let (url, backend, location) = match &options.database_url {
            Some(url) => {
                let redacted = redact_url(url);
                let backend = if url.starts_with("postgres://") || url.starts_with("postgresql://")
                {
                    Backend::Postgres
                } else if url.starts_with("sqlite:") {
                    Backend::Sqlite
                } else {
                    return Err(StoreError::BadUrl {
                        url: redacted,
                        reason: "its scheme is neither postgres nor sqlite".to_string(),
                    });
                };
                (url.clone(), backend, redacted)
            }
            None => {
                crate::files::create_private_dir(&options.data_dir).map_err(|source| {
                    StoreError::DataDir {
                        path: options.data_dir.clone(),
                        source,
                    }
                })?;
                let file = options.data_dir.join(DEFAULT_DB_FILE);
                (
                    sqlite_url(&file),
                    Backend::Sqlite,
                    file.display().to_string(),
                )
            }
        };
        // The SQLite file, made private before SQLite creates it (its
        // `-wal` and `-shm` files take its mode): only where the URL lets
        // SQLite create it, so that a URL naming a file that is not there
        // is still refused. Should this fail (a folder that is not there),
        // SQLite's own attempt says why.
        let sqlite_file = match backend {
            Backend::Sqlite => host::sqlite_file(&url),
            Backend::Postgres => None,
        };
        if let Some(file) = &sqlite_file
            && url.contains("mode=rwc")
        {
            let _ = crate::files::create_private_file(file);
        }
        let pool = AnyPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            // sqlx pings a connection both when it goes back to the pool
            // and when it is taken again: a round trip (PostgreSQL) or a
            // hop to the connection's thread (SQLite) before every
            // statement, as long as the statement itself. The ping on
            // release stays; the one on taking is kept only for a
            // connection that sat idle long enough for its server to have
            // gone away since that ping.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= IDLE_TEST_AFTER {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // WAL's normal sync: a commit survives the process
                        // being killed (the WAL is written before commit
                        // returns); only a power loss can take the last
                        // commits, at a fraction of FULL's fsync per commit.
                        conn.execute("PRAGMA synchronous = NORMAL").await?;
                    } else {
                        // The same promise on PostgreSQL: a commit returns
                        // once the server has it (a crash of this host loses
                        // nothing), without waiting for its fsync (only a
                        // crash of the server can take the last commits, up
                        // to three WAL-writer delays). Consequential calls
                        // and approvals wait for it all the same
                        // (`Store::strict`).
                        conn.execute("SET synchronous_commit = off").await?;
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await
            .map_err(|e| match e {
                sqlx::Error::Configuration(reason) => StoreError::BadUrl {
                    url: location.clone(),
                    reason: reason.to_string(),
                },
                e => StoreError::from_sqlx(&location, e),
            })?;
        if backend == Backend::Sqlite {
            // WAL lets readers go on while a run appends, and is a property
            // of the file: set once, it holds for every later connection.
            // Switching a new file to WAL takes a lock that SQLite's busy
            // timeout does not wait for: hosts opening one new file at once
            // try again for a while.
            let mut waited = Duration::ZERO;
            loop {
                match sqlx::query("PRAGMA journal_mode = WAL")
                    .fetch_optional(&pool)
                    .await
                {
                    Ok(_) => break,
                    Err(e) if is_busy(&e) && waited < WAL_SWITCH_WAIT => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        waited += Duration::from_millis(20);
                    }
                    Err(e) => return Err(StoreError::from_sqlx(&location, e)),
                }
            }
        }
        schema::migrate(&pool, &location).await?;
        // Before recovering: a second process of this name would interrupt
        // the runs the first one is running.
        let host_guard = match backend {
            Backend::Sqlite => match host::sqlite_file(&url) {
                Some(file) => HostGuard::sqlite(&file, &options.host, &location).await?,
                None => HostGuard::None,
            },
            Backend::Postgres => {
                let conn = pool
                    .acquire()
                    .await
                    .map_err(|e| StoreError::from_sqlx(&location, e))?
                    .detach();
                HostGuard::postgres(conn, &options.host, &location).await?
            }
        };
        let mut store = Self {
            inner: Arc::new(Inner {
                pool,
                backend,
                location,
                host: options.host,
                sqlite_file: sqlite_file.clone(),
                host_guard,
                recovery: Recovery::default(),
                starting: Mutex::new(HashMap::new()),
                start_tokens: AtomicU64::new(0),
            }),
        };
        if let Some(file) = &sqlite_file {
            let mut paths = Vec::new();
            if options.database_url.is_none() {
                paths.push(options.data_dir.clone());
            }
            paths.extend(crate::files::store_files(file));
            crate::files::warn_if_readable(&paths);
        }
        let recovery = store.recover().await?;
        if !recovery.interrupted_runs.is_empty() || !recovery.in_doubt_calls.is_empty() {
            tracing::warn!(
                interrupted_runs = recovery.interrupted_runs.len(),
                in_doubt_calls = recovery.in_doubt_calls.len(),
                waiting_runs = recovery.waiting_runs.len(),
                "the store found work the last process left unfinished"
            );
        }
        if let Some(inner) = Arc::get_mut(&mut store.inner) {
            inner.recovery = recovery;
        }
        Ok(store)
    }

    /// What opening found unfinished.
    pub fn recovery(&self) -> &Recovery {
        &self.inner.recovery
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    /// The SQLite file, or the URL without its password.
    pub fn location(&self) -> &str {
        &self.inner.location
    }

    /// This host's name.
    pub fn host(&self) -> &str {
        &self.inner.host
    }

    /// Closes the pool, waiting for connections in use to be returned, and
    /// lets go of the host name (another process may open the store under
    /// it now).
    pub async fn close(&self) {
        self.inner.pool.close().await;
        self.inner.host_guard.release().await;
    }

    fn db(&self) -> impl Fn(sqlx::Error) -> StoreError + '_ {
        |e| StoreError::from_sqlx(&self.inner.location, e)
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.inner.pool
    }

    /// Files a run whose row `tx`'s writer is about to write; returns the
    /// entry's token for [`Store::started`].
    pub(crate) fn starting(
        &self,
        run_id: &str,
        session_id: &str,
        tx: tokio::sync::mpsc::UnboundedSender<Msg>,
    ) -> u64 {
        let token = self.inner.start_tokens.fetch_add(1, Ordering::Relaxed);
        self.inner.starting.lock().insert(
            run_id.to_string(),
            Starting {
                session_id: session_id.to_string(),
                tx,
                token,
            },
        );
        token
    }

    /// The run's row is written (or will never be): its entry goes, if it
    /// is still the one `token` names.
    pub(crate) fn started(&self, run_id: &str, token: u64) {
        let mut starting = self.inner.starting.lock();
        if starting.get(run_id).is_some_and(|s| s.token == token) {
            starting.remove(run_id);
        }
    }

    /// Waits until the run's row is written, when [`RunLog::start`] queued
    /// it and its writer has not committed it yet.
    async fn settle_run(&self, run_id: &str) {
        let tx = self.inner.starting.lock().get(run_id).map(|s| s.tx.clone());
        if let Some(tx) = tx {
            settle(&tx).await;
        }
    }

    /// The same for every such run of the session.
    async fn settle_session(&self, session_id: &str) {
        let txs: Vec<_> = self
            .inner
            .starting
            .lock()
            .values()
            .filter(|s| s.session_id == session_id)
            .map(|s| s.tx.clone())
            .collect();
        for tx in txs {
            settle(&tx).await;
        }
    }

    /// Makes the transaction's commit wait until it is on disk, on
    /// PostgreSQL (whose connections default to not waiting): for the
    /// records a person relies on after any crash, consequential calls and
    /// approvals. SQLite's setting is per connection, and stays NORMAL.
    async fn strict(&self, tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<(), StoreError> {
        if self.inner.backend == Backend::Postgres {
            sqlx::query("SET LOCAL synchronous_commit = on")
                .execute(&mut **tx)
                .await
                .map_err(self.db())?;
        }
        Ok(())
    }

    async fn recover(&self) -> Result<Recovery, StoreError> {
        let db = self.db();
        let now = now_ms();
        let mut tx = self.pool().begin().await.map_err(&db)?;
        let interrupted = sqlx::query(
            "UPDATE runs SET status = 'interrupted', updated_at = $2
             WHERE host = $1 AND status = 'running' RETURNING id",
        )
        .bind(&self.inner.host)
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(&db)?;
        let in_doubt = sqlx::query(&format!(
            "UPDATE calls SET status = 'in-doubt'
             WHERE status = 'in-flight' AND run_id IN (SELECT id FROM runs WHERE host = $1)
             RETURNING {CALL_COLUMNS}"
        ))
        .bind(&self.inner.host)
        .fetch_all(&mut *tx)
        .await
        .map_err(&db)?;
        let waiting =
            sqlx::query("SELECT id FROM runs WHERE host = $1 AND status = 'waiting-for-approval'")
                .bind(&self.inner.host)
                .fetch_all(&mut *tx)
                .await
                .map_err(&db)?;
        tx.commit().await.map_err(&db)?;
        let ids = |rows: Vec<AnyRow>| -> Result<Vec<String>, StoreError> {
            let mut ids: Vec<String> = rows
                .iter()
                .map(|r| r.try_get::<String, _>(0))
                .collect::<Result<_, _>>()
                .map_err(&db)?;
            ids.sort();
            Ok(ids)
        };
        let mut in_doubt_calls = in_doubt
            .iter()
            .map(|r| {
                Ok((
                    r.try_get::<i64, _>(11).map_err(&db)?,
                    self.call_from_row(r)?,
                ))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        in_doubt_calls.sort_by(|(a_ord, a), (b_ord, b)| {
            (a.started_at, &a.run_id, a_ord).cmp(&(b.started_at, &b.run_id, b_ord))
        });
        let in_doubt_calls = in_doubt_calls.into_iter().map(|(_, c)| c).collect();
        Ok(Recovery {
            interrupted_runs: ids(interrupted)?,
            in_doubt_calls,
            waiting_runs: ids(waiting)?,
        })
    }

    // ---- sessions -------------------------------------------------------

    /// Starts a conversation with `agent`. An empty `title` is filled in
    /// from the first user message appended.
    pub async fn create_session(&self, agent: &str, title: &str) -> Result<Session, StoreError> {
        let now = now_ms();
        let session = Session {
            id: new_id(),
            agent: agent.to_string(),
            title: title_of(title),
            created_at: now,
            updated_at: now,
            message_count: 0,
        };
        sqlx::query(
            "INSERT INTO sessions (id, agent, title, created_at, updated_at, activity)
             SELECT $1, $2, $3, $4, $4, COALESCE((SELECT MAX(activity) FROM sessions), 0) + 1",
        )
        .bind(&session.id)
        .bind(&session.agent)
        .bind(&session.title)
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(self.db())?;
        Ok(session)
    }

    /// Every session, the most recently updated first, at most `limit`.
    pub async fn list_sessions(&self, limit: u32) -> Result<Vec<Session>, StoreError> {
        let rows = sqlx::query(&format!(
            "{SESSION_SELECT} ORDER BY s.activity DESC, s.id LIMIT $1"
        ))
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .map_err(self.db())?;
        rows.iter().map(|r| self.session_from_row(r)).collect()
    }

    /// The session, without its messages; `None` when there is none.
    pub async fn session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let row = sqlx::query(&format!("{SESSION_SELECT} WHERE s.id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(self.db())?;
        row.map(|r| self.session_from_row(&r)).transpose()
    }

    /// The session with its messages in order; `None` when there is none.
    pub async fn session_with_messages(
        &self,
        id: &str,
    ) -> Result<Option<SessionWithMessages>, StoreError> {
        let Some(session) = self.session(id).await? else {
            return Ok(None);
        };
        let messages = self.messages(id).await?;
        Ok(Some(SessionWithMessages { session, messages }))
    }

    /// The session's messages, oldest first (the history the loop sees).
    pub async fn messages(&self, session_id: &str) -> Result<Vec<ChatMessage>, StoreError> {
        let rows = sqlx::query("SELECT seq, body FROM messages WHERE session_id = $1 ORDER BY seq")
            .bind(session_id)
            .fetch_all(self.pool())
            .await
            .map_err(self.db())?;
        rows.iter()
            .map(|row| {
                let seq: i64 = row.try_get(0).map_err(self.db())?;
                let body: String = row.try_get(1).map_err(self.db())?;
                serde_json::from_str(&body).map_err(|e| StoreError::Corrupt {
                    what: format!("message {seq} of session `{session_id}`"),
                    reason: e.to_string(),
                })
            })
            .collect()
    }

    /// Appends messages to the session, in order, in one transaction;
    /// returns how many it holds now. The first user message names a
    /// session that has no title.
    pub async fn append_messages(
        &self,
        session_id: &str,
        messages: &[ChatMessage],
    ) -> Result<u64, StoreError> {
        let db = self.db();
        let now = now_ms();
        let title = messages
            .iter()
            .find_map(|m| match m {
                ChatMessage::User { content } => Some(title_of(content)),
                _ => None,
            })
            .unwrap_or_default();
        let mut tx = self.pool().begin().await.map_err(&db)?;
        // A write first, so that SQLite takes its write lock at once (a
        // transaction that read first could not wait for it).
        let touched = sqlx::query(
            "UPDATE sessions SET updated_at = $2,
                 activity = (SELECT MAX(s.activity) FROM sessions s) + 1,
                 title = CASE WHEN title = '' THEN $3 ELSE title END
             WHERE id = $1",
        )
        .bind(session_id)
        .bind(now)
        .bind(&title)
        .execute(&mut *tx)
        .await
        .map_err(&db)?;
        if touched.rows_affected() == 0 {
            return Err(StoreError::SessionNotFound(session_id.to_string()));
        }
        let last: i64 =
            sqlx::query("SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id = $1")
                .bind(session_id)
                .fetch_one(&mut *tx)
                .await
                .map_err(&db)?
                .try_get(0)
                .map_err(&db)?;
        let mut seq = last;
        for message in messages {
            seq += 1;
            let body = serde_json::to_string(message).map_err(|e| StoreError::Corrupt {
                what: format!("message for session `{session_id}`"),
                reason: e.to_string(),
            })?;
            sqlx::query(
                "INSERT INTO messages (session_id, seq, body, created_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(session_id)
            .bind(seq)
            .bind(body)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(&db)?;
        }
        tx.commit().await.map_err(&db)?;
        Ok(u64::try_from(seq).unwrap_or(0))
    }

    /// Deletes the session with its messages, runs, their parts, calls and
    /// approvals; `false` when there was none.
    pub async fn delete_session(&self, id: &str) -> Result<bool, StoreError> {
        // A run start still queued is written first, so that it goes too.
        self.settle_session(id).await;
        if let Some(host) = self.live_elsewhere(id).await? {
            return Err(StoreError::SessionLive {
                session: id.to_string(),
                host,
            });
        }
        let db = self.db();
        let mut tx = self.pool().begin().await.map_err(&db)?;
        // Children first, explicitly: the schema's ON DELETE CASCADE would
        // do it too, but SQLite enforces it only with foreign keys on, and
        // a database opened by another tool may have them off.
        let deleted = sqlx::query("DELETE FROM sessions WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(&db)?;
        for statement in [
            "DELETE FROM parts WHERE run_id IN (SELECT id FROM runs WHERE session_id = $1)",
            "DELETE FROM calls WHERE run_id IN (SELECT id FROM runs WHERE session_id = $1)",
            "DELETE FROM approvals WHERE run_id IN (SELECT id FROM runs WHERE session_id = $1)",
            "DELETE FROM runs WHERE session_id = $1",
            "DELETE FROM messages WHERE session_id = $1",
        ] {
            sqlx::query(statement)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(&db)?;
        }
        tx.commit().await.map_err(&db)?;
        Ok(deleted.rows_affected() > 0)
    }

    /// Another host whose run of session `id` is in progress (running,
    /// or waiting for an answer) and that is alive: its process holds its
    /// name on the store. A host that was killed holds nothing, and its
    /// runs are its restart's to recover. This host's own runs are its
    /// caller's to know about.
    async fn live_elsewhere(&self, id: &str) -> Result<Option<String>, StoreError> {
        let db = self.db();
        let rows = sqlx::query(
            "SELECT DISTINCT host FROM runs
             WHERE session_id = $1 AND host <> $2 AND status IN ($3, $4)",
        )
        .bind(id)
        .bind(&self.inner.host)
        .bind(RunStatus::Running.as_str())
        .bind(RunStatus::WaitingForApproval.as_str())
        .fetch_all(self.pool())
        .await
        .map_err(&db)?;
        for row in rows {
            let host: String = row.try_get(0).map_err(&db)?;
            if host::is_held(self.inner.sqlite_file.as_deref(), self.pool(), &host).await {
                return Ok(Some(host));
            }
        }
        Ok(None)
    }

    fn session_from_row(&self, row: &AnyRow) -> Result<Session, StoreError> {
        let db = self.db();
        Ok(Session {
            id: row.try_get(0).map_err(&db)?,
            agent: row.try_get(1).map_err(&db)?,
            title: row.try_get(2).map_err(&db)?,
            created_at: row.try_get(3).map_err(&db)?,
            updated_at: row.try_get(4).map_err(&db)?,
            message_count: to_u64(row.try_get(5).map_err(&db)?),
        })
    }

    // ---- runs -----------------------------------------------------------

    /// Starts a run of `agent` in the session, `running`, on this host (one
    /// commit; the session's `updated_at` moves with its messages).
    /// `id` is the host's run id (the one it streams); `None` makes one.
    pub async fn start_run(
        &self,
        session_id: &str,
        agent: &str,
        id: Option<&str>,
    ) -> Result<Run, StoreError> {
        let now = now_ms();
        let id = id.map_or_else(new_id, str::to_string);
        // One statement (one commit): the run, only in a session that exists.
        let inserted = sqlx::query(
            "INSERT INTO runs (id, session_id, agent, host, status, error, ordinal, created_at,
                               updated_at)
             SELECT $1, id, $2, $3, 'running', NULL,
                    COALESCE((SELECT MAX(r.ordinal) FROM runs r WHERE r.session_id = $5), 0) + 1,
                    $4, $4
             FROM sessions WHERE id = $5",
        )
        .bind(&id)
        .bind(agent)
        .bind(&self.inner.host)
        .bind(now)
        .bind(session_id)
        .execute(self.pool())
        .await;
        match inserted {
            Ok(done) if done.rows_affected() == 1 => {}
            Ok(_) => return Err(StoreError::SessionNotFound(session_id.to_string())),
            Err(e) if is_unique_violation(&e) => return Err(StoreError::RunExists(id)),
            Err(e) => return Err(self.db()(e)),
        }
        Ok(Run {
            id,
            session_id: session_id.to_string(),
            agent: agent.to_string(),
            host: self.inner.host.clone(),
            status: RunStatus::Running,
            last_seq: 0,
            error: None,
            created_at: now,
            updated_at: now,
        })
    }

    /// The run's log, written in the background with group commit: what a
    /// host streaming a run uses (see [`RunLog`]).
    pub async fn run_log(&self, run_id: &str) -> Result<RunLog, StoreError> {
        RunLog::open(self, run_id).await
    }

    /// The run; `None` when there is none.
    pub async fn run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        self.settle_run(id).await;
        self.read_run(id).await
    }

    /// The run as the database has it.
    async fn read_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        let row = sqlx::query(&format!("{RUN_SELECT} WHERE r.id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(self.db())?;
        row.map(|r| self.run_from_row(&r)).transpose()
    }

    /// The session's runs, oldest first.
    pub async fn runs_of_session(&self, session_id: &str) -> Result<Vec<Run>, StoreError> {
        self.settle_session(session_id).await;
        let rows = sqlx::query(&format!(
            "{RUN_SELECT} WHERE r.session_id = $1 ORDER BY r.ordinal, r.id"
        ))
        .bind(session_id)
        .fetch_all(self.pool())
        .await
        .map_err(self.db())?;
        rows.iter().map(|r| self.run_from_row(r)).collect()
    }

    /// Sets a run's status: `interrupted` when the host gives up on it
    /// (shutdown past its grace period), `running` when a run that waited
    /// goes on. A run that has ended keeps its status.
    pub async fn set_run_status(&self, run_id: &str, status: RunStatus) -> Result<Run, StoreError> {
        self.settle_run(run_id).await;
        let done = sqlx::query(
            "UPDATE runs SET status = $2, updated_at = $3
             WHERE id = $1 AND status IN ('running', 'waiting-for-approval')",
        )
        .bind(run_id)
        .bind(status.as_str())
        .bind(now_ms())
        .execute(self.pool())
        .await
        .map_err(self.db())?;
        let run = self.existing_run(run_id).await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::RunEnded {
                run_id: run_id.to_string(),
                status: run.status.to_string(),
            });
        }
        Ok(run)
    }

    /// Appends a part to the run's log and returns its sequence number
    /// (1, 2, 3… without gaps), which is durable when this returns. The
    /// run's own terminal part (depth 0 `finish` or `error`) ends the run,
    /// `finished` or `failed`, in the same transaction.
    pub async fn append_part(
        &self,
        run_id: &str,
        agent: &str,
        depth: u32,
        part: &AgentStreamPart,
    ) -> Result<u64, StoreError> {
        self.settle_run(run_id).await;
        let db = self.db();
        let body = serde_json::to_string(part).map_err(|e| StoreError::Corrupt {
            what: format!("part for run `{run_id}`"),
            reason: e.to_string(),
        })?;
        let ending = match part {
            AgentStreamPart::Finish { .. } if depth == 0 => Some((RunStatus::Finished, None)),
            AgentStreamPart::Error { message } if depth == 0 => {
                Some((RunStatus::Failed, Some(message.clone())))
            }
            _ => None,
        };
        for _ in 0..APPEND_RETRIES {
            let now = now_ms();
            let result = match &ending {
                None => {
                    sqlx::query(APPEND_PART)
                        .bind(run_id)
                        .bind(agent)
                        .bind(i64::from(depth))
                        .bind(&body)
                        .bind(now)
                        .fetch_optional(self.pool())
                        .await
                }
                Some((status, error)) => {
                    let mut tx = self.pool().begin().await.map_err(&db)?;
                    // The status first: it takes SQLite's write lock at once.
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
                    .map_err(&db)?;
                    if ended.rows_affected() == 0 {
                        Ok(None)
                    } else {
                        // The run has its final status now, which the
                        // insert checks instead of an open one.
                        let row = sqlx::query(APPEND_FINAL_PART)
                            .bind(run_id)
                            .bind(agent)
                            .bind(i64::from(depth))
                            .bind(&body)
                            .bind(now)
                            .bind(status.as_str())
                            .fetch_optional(&mut *tx)
                            .await;
                        match row {
                            Ok(row) => {
                                tx.commit().await.map_err(&db)?;
                                Ok(row)
                            }
                            Err(e) => Err(e),
                        }
                    }
                }
            };
            match result {
                Ok(Some(row)) => return Ok(to_u64(row.try_get(0).map_err(&db)?)),
                Ok(None) => {
                    let run = self.existing_run(run_id).await?;
                    return Err(StoreError::RunEnded {
                        run_id: run_id.to_string(),
                        status: run.status.to_string(),
                    });
                }
                Err(e) if is_unique_violation(&e) => continue,
                Err(e) => return Err(db(e)),
            }
        }
        Err(StoreError::Database {
            location: self.inner.location.clone(),
            source: sqlx::Error::Protocol(format!(
                "{APPEND_RETRIES} concurrent writers took the next sequence number of run \
                 `{run_id}` in turn"
            )),
        })
    }

    /// The run's parts after sequence number `after` (0 for all), in order:
    /// what a client that reconnects with `Last-Event-ID: after` missed.
    pub async fn parts_after(
        &self,
        run_id: &str,
        after: u64,
    ) -> Result<Vec<LoggedPart>, StoreError> {
        self.settle_run(run_id).await;
        let db = self.db();
        let rows = sqlx::query(
            "SELECT seq, agent, depth, body, created_at, sub_run FROM parts
             WHERE run_id = $1 AND seq > $2 ORDER BY seq",
        )
        .bind(run_id)
        .bind(i64::try_from(after).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await
        .map_err(&db)?;
        if rows.is_empty() {
            // Tell "no such run" from "nothing new".
            self.existing_run(run_id).await?;
        }
        rows.iter()
            .map(|row| {
                let seq = to_u64(row.try_get(0).map_err(&db)?);
                let body: String = row.try_get(3).map_err(&db)?;
                let part = serde_json::from_str(&body).map_err(|e| StoreError::Corrupt {
                    what: format!("part {seq} of run `{run_id}`"),
                    reason: e.to_string(),
                })?;
                Ok(LoggedPart {
                    seq,
                    agent: row.try_get(1).map_err(&db)?,
                    depth: u32::try_from(row.try_get::<i64, _>(2).map_err(&db)?).unwrap_or(0),
                    sub_run: row.try_get(5).map_err(&db)?,
                    part,
                    at: row.try_get(4).map_err(&db)?,
                })
            })
            .collect()
    }

    async fn existing_run(&self, run_id: &str) -> Result<Run, StoreError> {
        self.run(run_id)
            .await?
            .ok_or_else(|| StoreError::RunNotFound(run_id.to_string()))
    }

    fn run_from_row(&self, row: &AnyRow) -> Result<Run, StoreError> {
        let db = self.db();
        let id: String = row.try_get(0).map_err(&db)?;
        let status: String = row.try_get(4).map_err(&db)?;
        let status = RunStatus::parse(&status).ok_or_else(|| StoreError::Corrupt {
            what: format!("status of run `{id}`"),
            reason: format!("`{status}` is not a run status"),
        })?;
        Ok(Run {
            session_id: row.try_get(1).map_err(&db)?,
            agent: row.try_get(2).map_err(&db)?,
            host: row.try_get(3).map_err(&db)?,
            status,
            error: row.try_get(5).map_err(&db)?,
            created_at: row.try_get(6).map_err(&db)?,
            updated_at: row.try_get(7).map_err(&db)?,
            last_seq: to_u64(row.try_get(8).map_err(&db)?),
            id,
        })
    }

    // ---- consequential calls --------------------------------------------

    /// Records a consequential call before it is sent, `in-flight`, with a
    /// fresh idempotency key (the record's key) to pass to sources that
    /// accept one. Durable when this returns: send the call only then.
    ///
    /// The same call (agent, call id, tool and arguments) of the same run
    /// that is in doubt is refused with [`StoreError::CallInDoubt`]: a run
    /// that goes on after a restart does not resend it. For a call of a
    /// sub-agent run, [`Store::begin_call_in`].
    pub async fn begin_call(
        &self,
        run_id: &str,
        agent: &str,
        call_id: &str,
        tool: &str,
        arguments: &Value,
    ) -> Result<CallRecord, StoreError> {
        self.begin_call_in(run_id, agent, "", call_id, tool, arguments)
            .await
    }

    /// [`Store::begin_call`] for a call of the sub-agent run `sub_run`
    /// inside the run (`wma_runtime::TaggedPart::sub_run`; `""` for the
    /// run's own agent): two runs of one sub-agent number their calls
    /// alike, and the record says which run made it. The call in doubt
    /// that is refused is the same sub-agent run's.
    pub async fn begin_call_in(
        &self,
        run_id: &str,
        agent: &str,
        sub_run: &str,
        call_id: &str,
        tool: &str,
        arguments: &Value,
    ) -> Result<CallRecord, StoreError> {
        self.settle_run(run_id).await;
        let record = CallRecord {
            idempotency_key: new_id(),
            run_id: run_id.to_string(),
            agent: agent.to_string(),
            sub_run: sub_run.to_string(),
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            arguments: arguments.clone(),
            status: CallStatus::InFlight,
            output: None,
            is_error: false,
            started_at: now_ms(),
            answered_at: None,
        };
        // Only for an open run: a call of a run that ended (or was
        // interrupted by a restart) is not to be sent at all.
        let mut tx = self.pool().begin().await.map_err(self.db())?;
        self.strict(&mut tx).await?;
        let inserted = sqlx::query(
            "INSERT INTO calls (idempotency_key, run_id, agent, call_id, tool, arguments, status,
                                output, is_error, started_at, answered_at, ordinal, sub_run)
             SELECT $1, $2, $3, $4, $5, $6, 'in-flight', NULL, 0, $7, NULL,
                    COALESCE((SELECT MAX(c.ordinal) FROM calls c WHERE c.run_id = $2), 0) + 1, $8
             FROM runs WHERE id = $2 AND status IN ('running', 'waiting-for-approval')
               AND NOT EXISTS (SELECT 1 FROM calls d
                               WHERE d.run_id = $2 AND d.status = 'in-doubt' AND d.agent = $3
                                 AND d.call_id = $4 AND d.tool = $5 AND d.arguments = $6
                                 AND d.sub_run = $8)",
        )
        .bind(&record.idempotency_key)
        .bind(run_id)
        .bind(agent)
        .bind(call_id)
        .bind(tool)
        .bind(arguments.to_string())
        .bind(record.started_at)
        .bind(sub_run)
        .execute(&mut *tx)
        .await
        .map_err(self.db())?;
        if inserted.rows_affected() == 0 {
            drop(tx);
            let run = self.existing_run(run_id).await?;
            if run.status.is_ended() {
                return Err(StoreError::RunEnded {
                    run_id: run_id.to_string(),
                    status: run.status.to_string(),
                });
            }
            let in_doubt = self.calls_of_run(run_id).await?.into_iter().find(|c| {
                c.status == CallStatus::InDoubt
                    && c.agent == agent
                    && c.sub_run == sub_run
                    && c.call_id == call_id
                    && c.tool == tool
                    && &c.arguments == arguments
            });
            return Err(StoreError::CallInDoubt {
                idempotency_key: in_doubt.map(|c| c.idempotency_key).unwrap_or_default(),
                tool: tool.to_string(),
            });
        }
        tx.commit().await.map_err(self.db())?;
        Ok(record)
    }

    /// Records a consequential call's answer (its output, or the
    /// `Error [code]: message` text with `is_error`). Only an in-flight
    /// call answers: one in doubt stays in doubt.
    pub async fn finish_call(
        &self,
        idempotency_key: &str,
        output: &str,
        is_error: bool,
    ) -> Result<CallRecord, StoreError> {
        let mut tx = self.pool().begin().await.map_err(self.db())?;
        self.strict(&mut tx).await?;
        let row = sqlx::query(&format!(
            "UPDATE calls SET status = 'answered', output = $2, is_error = $3, answered_at = $4
             WHERE idempotency_key = $1 AND status = 'in-flight'
             RETURNING {CALL_COLUMNS}"
        ))
        .bind(idempotency_key)
        .bind(output)
        .bind(i64::from(is_error))
        .bind(now_ms())
        .fetch_optional(&mut *tx)
        .await
        .map_err(self.db())?;
        tx.commit().await.map_err(self.db())?;
        match row {
            Some(row) => self.call_from_row(&row),
            None => match self.call(idempotency_key).await? {
                Some(call) => Err(StoreError::CallNotInFlight {
                    idempotency_key: idempotency_key.to_string(),
                    status: call.status.to_string(),
                }),
                None => Err(StoreError::CallNotFound(idempotency_key.to_string())),
            },
        }
    }

    /// Marks a call still in flight `in-doubt` without waiting for a
    /// restart: its run ended (Stop while it ran) before the call answered,
    /// so whether it happened is for a person to check, as after a crash.
    /// A call that answered meanwhile keeps its answer; `false` when the
    /// call was not in flight.
    pub async fn abandon_call(&self, idempotency_key: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await.map_err(self.db())?;
        self.strict(&mut tx).await?;
        let updated = sqlx::query(
            "UPDATE calls SET status = 'in-doubt'
             WHERE idempotency_key = $1 AND status = 'in-flight'",
        )
        .bind(idempotency_key)
        .execute(&mut *tx)
        .await
        .map_err(self.db())?;
        tx.commit().await.map_err(self.db())?;
        Ok(updated.rows_affected() == 1)
    }

    /// The consequential call; `None` when there is none with this key.
    pub async fn call(&self, idempotency_key: &str) -> Result<Option<CallRecord>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {CALL_COLUMNS} FROM calls WHERE idempotency_key = $1"
        ))
        .bind(idempotency_key)
        .fetch_optional(self.pool())
        .await
        .map_err(self.db())?;
        row.map(|r| self.call_from_row(&r)).transpose()
    }

    /// The run's consequential calls, in the order they were recorded: a
    /// host resuming a run checks these, and sends none that is in doubt.
    pub async fn calls_of_run(&self, run_id: &str) -> Result<Vec<CallRecord>, StoreError> {
        self.settle_run(run_id).await;
        let rows = sqlx::query(&format!(
            "SELECT {CALL_COLUMNS} FROM calls WHERE run_id = $1 ORDER BY ordinal"
        ))
        .bind(run_id)
        .fetch_all(self.pool())
        .await
        .map_err(self.db())?;
        rows.iter().map(|r| self.call_from_row(r)).collect()
    }

    /// Every call in doubt, of every host, oldest first: for a person to
    /// check whether it happened.
    pub async fn in_doubt_calls(&self) -> Result<Vec<CallRecord>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {CALL_COLUMNS} FROM calls WHERE status = 'in-doubt'
             ORDER BY started_at, run_id, ordinal"
        ))
        .fetch_all(self.pool())
        .await
        .map_err(self.db())?;
        rows.iter().map(|r| self.call_from_row(r)).collect()
    }

    fn call_from_row(&self, row: &AnyRow) -> Result<CallRecord, StoreError> {
        let db = self.db();
        let key: String = row.try_get(0).map_err(&db)?;
        let corrupt = |reason: String| StoreError::Corrupt {
            what: format!("call `{key}`"),
            reason,
        };
        let arguments: String = row.try_get(5).map_err(&db)?;
        let arguments = serde_json::from_str(&arguments).map_err(|e| corrupt(e.to_string()))?;
        let status: String = row.try_get(6).map_err(&db)?;
        let status = CallStatus::parse(&status)
            .ok_or_else(|| corrupt(format!("`{status}` is not a call status")))?;
        Ok(CallRecord {
            run_id: row.try_get(1).map_err(&db)?,
            agent: row.try_get(2).map_err(&db)?,
            sub_run: row.try_get(12).map_err(&db)?,
            call_id: row.try_get(3).map_err(&db)?,
            tool: row.try_get(4).map_err(&db)?,
            arguments,
            status,
            output: row.try_get(7).map_err(&db)?,
            is_error: row.try_get::<i64, _>(8).map_err(&db)? != 0,
            started_at: row.try_get(9).map_err(&db)?,
            answered_at: row.try_get(10).map_err(&db)?,
            idempotency_key: key,
        })
    }

    // ---- approvals ------------------------------------------------------

    /// Persists the loop's question as a pending approval and sets its run
    /// `waiting-for-approval` (a status a restart keeps), in one
    /// transaction. The returned [`Approval::id`] is what a decision names.
    pub async fn request_approval(
        &self,
        run_id: &str,
        request: &ApprovalRequest,
    ) -> Result<Approval, StoreError> {
        self.settle_run(run_id).await;
        let db = self.db();
        let now = now_ms();
        let id = new_id();
        let mut tx = self.pool().begin().await.map_err(&db)?;
        self.strict(&mut tx).await?;
        let waiting = sqlx::query(
            "UPDATE runs SET status = 'waiting-for-approval', updated_at = $2
             WHERE id = $1 AND status IN ('running', 'waiting-for-approval')",
        )
        .bind(run_id)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(&db)?;
        if waiting.rows_affected() == 0 {
            drop(tx);
            let run = self.existing_run(run_id).await?;
            return Err(StoreError::RunEnded {
                run_id: run_id.to_string(),
                status: run.status.to_string(),
            });
        }
        sqlx::query(
            "INSERT INTO approvals (id, run_id, loop_approval_id, agent, call_id, tool, arguments,
                                    reason, requested_at, approved, remember, decided_by, note,
                                    decided_at, ordinal)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, 0, NULL, NULL, NULL,
                    COALESCE((SELECT MAX(a.ordinal) FROM approvals a WHERE a.run_id = $2), 0) + 1",
        )
        .bind(&id)
        .bind(run_id)
        .bind(&request.approval_id)
        .bind(&request.agent)
        .bind(&request.call_id)
        .bind(&request.tool)
        .bind(request.arguments.to_string())
        .bind(&request.reason)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(&db)?;
        tx.commit().await.map_err(&db)?;
        Ok(Approval {
            id,
            run_id: run_id.to_string(),
            request: request.clone(),
            requested_at: now,
            answer: None,
            decided_at: None,
        })
    }

    /// Records the answer to an approval (final: a second one is refused
    /// with [`StoreError::AlreadyDecided`]). When its run has no other
    /// pending approval it is `running` again, for its host to go on with.
    pub async fn decide_approval(
        &self,
        id: &str,
        answer: &ApprovalAnswer,
    ) -> Result<Approval, StoreError> {
        let db = self.db();
        let now = now_ms();
        let mut tx = self.pool().begin().await.map_err(&db)?;
        self.strict(&mut tx).await?;
        let row = sqlx::query(&format!(
            "UPDATE approvals SET approved = $2, remember = $3, decided_by = $4, note = $5,
                                  decided_at = $6
             WHERE id = $1 AND approved IS NULL
             RETURNING {APPROVAL_COLUMNS}"
        ))
        .bind(id)
        .bind(i64::from(answer.approved))
        .bind(i64::from(answer.remember))
        .bind(&answer.by)
        .bind(answer.note.clone())
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(&db)?;
        let Some(row) = row else {
            drop(tx);
            return Err(match self.approval(id).await? {
                Some(Approval {
                    answer: Some(answer),
                    ..
                }) => StoreError::AlreadyDecided {
                    id: id.to_string(),
                    decision: if answer.approved {
                        "approved"
                    } else {
                        "denied"
                    }
                    .to_string(),
                },
                _ => StoreError::ApprovalNotFound(id.to_string()),
            });
        };
        let approval = self.approval_from_row(&row)?;
        sqlx::query(
            "UPDATE runs SET status = 'running', updated_at = $2
             WHERE id = $1 AND status = 'waiting-for-approval'
               AND NOT EXISTS (SELECT 1 FROM approvals a
                               WHERE a.run_id = $1 AND a.approved IS NULL)",
        )
        .bind(&approval.run_id)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(&db)?;
        tx.commit().await.map_err(&db)?;
        Ok(approval)
    }

    /// The approval, pending or decided; `None` when there is none.
    pub async fn approval(&self, id: &str) -> Result<Option<Approval>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(self.db())?;
        row.map(|r| self.approval_from_row(&r)).transpose()
    }

    /// The run's approvals, pending and decided, in the order asked.
    pub async fn approvals_of_run(&self, run_id: &str) -> Result<Vec<Approval>, StoreError> {
        self.settle_run(run_id).await;
        let rows = sqlx::query(&format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE run_id = $1 ORDER BY ordinal"
        ))
        .bind(run_id)
        .fetch_all(self.pool())
        .await
        .map_err(self.db())?;
        rows.iter().map(|r| self.approval_from_row(r)).collect()
    }

    /// Approvals that wait for an answer, oldest first; of one session,
    /// or of all.
    pub async fn pending_approvals(
        &self,
        session_id: Option<&str>,
    ) -> Result<Vec<Approval>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals
             WHERE approved IS NULL
               AND ($1 = '' OR run_id IN (SELECT id FROM runs WHERE session_id = $1))
             ORDER BY requested_at, run_id, ordinal"
        ))
        .bind(session_id.unwrap_or(""))
        .fetch_all(self.pool())
        .await
        .map_err(self.db())?;
        rows.iter().map(|r| self.approval_from_row(r)).collect()
    }

    fn approval_from_row(&self, row: &AnyRow) -> Result<Approval, StoreError> {
        let db = self.db();
        let id: String = row.try_get(0).map_err(&db)?;
        let arguments: String = row.try_get(6).map_err(&db)?;
        let arguments = serde_json::from_str(&arguments).map_err(|e| StoreError::Corrupt {
            what: format!("approval `{id}`"),
            reason: e.to_string(),
        })?;
        let approved: Option<i64> = row.try_get(9).map_err(&db)?;
        let answer = match approved {
            None => None,
            Some(approved) => Some(ApprovalAnswer {
                approved: approved != 0,
                remember: row.try_get::<i64, _>(10).map_err(&db)? != 0,
                by: row
                    .try_get::<Option<String>, _>(11)
                    .map_err(&db)?
                    .unwrap_or_default(),
                note: row.try_get(12).map_err(&db)?,
            }),
        };
        Ok(Approval {
            run_id: row.try_get(1).map_err(&db)?,
            request: ApprovalRequest {
                approval_id: row.try_get(2).map_err(&db)?,
                agent: row.try_get(3).map_err(&db)?,
                call_id: row.try_get(4).map_err(&db)?,
                tool: row.try_get(5).map_err(&db)?,
                arguments,
                reason: row.try_get(7).map_err(&db)?,
            },
            requested_at: row.try_get(8).map_err(&db)?,
            answer,
            decided_at: row.try_get(13).map_err(&db)?,
            id,
        })
    }
}

/// Appends a part to an open run in one statement: the next number comes
/// from the run's own rows (the primary key's index). SQLite runs it under
/// its one write lock; on PostgreSQL two writers of one run could pick the
/// same number, and the loser retries ([`APPEND_RETRIES`]).
const APPEND_PART: &str = "INSERT INTO parts (run_id, seq, agent, depth, body, created_at)
     SELECT $1, COALESCE((SELECT MAX(p.seq) FROM parts p WHERE p.run_id = $1), 0) + 1,
            $2, $3, $4, $5
     FROM runs r WHERE r.id = $1 AND r.status IN ('running', 'waiting-for-approval')
     RETURNING seq";

/// The same for the run's terminal part, inside the transaction that just
/// gave the run its final status (`$6`).
const APPEND_FINAL_PART: &str = "INSERT INTO parts (run_id, seq, agent, depth, body, created_at)
     SELECT $1, COALESCE((SELECT MAX(p.seq) FROM parts p WHERE p.run_id = $1), 0) + 1,
            $2, $3, $4, $5
     FROM runs r WHERE r.id = $1 AND r.status = $6
     RETURNING seq";

const SESSION_SELECT: &str = "SELECT s.id, s.agent, s.title, s.created_at, s.updated_at,
        (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id)
     FROM sessions s";

const RUN_SELECT: &str = "SELECT r.id, r.session_id, r.agent, r.host, r.status, r.error,
        r.created_at, r.updated_at,
        COALESCE((SELECT MAX(p.seq) FROM parts p WHERE p.run_id = r.id), 0)
     FROM runs r";

/// A call's columns; `ordinal` read only to order recovered calls, and
/// `sub_run` after it (the column a later migration added).
const CALL_COLUMNS: &str = "idempotency_key, run_id, agent, call_id, tool, arguments, status, \
                            output, is_error, started_at, answered_at, ordinal, sub_run";

const APPROVAL_COLUMNS: &str = "id, run_id, loop_approval_id, agent, call_id, tool, arguments, \
                                reason, requested_at, approved, remember, decided_by, note, \
                                decided_at";

/// A title: the first line, at most [`TITLE_CHARS`] characters.
fn title_of(text: &str) -> String {
    let line = text.trim().lines().next().unwrap_or("").trim();
    match line.char_indices().nth(TITLE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_only_the_password() {
        assert_eq!(
            redact_url("postgres://wma:s3cret@db.internal:5432/wma?sslmode=require"),
            "postgres://wma:***@db.internal:5432/wma?sslmode=require"
        );
        assert_eq!(redact_url("postgres://wma@db/wma"), "postgres://wma@db/wma");
        assert_eq!(
            redact_url("sqlite:///var/lib/wma.db"),
            "sqlite:///var/lib/wma.db"
        );
    }

    #[test]
    fn titles_are_the_first_line_cut_short() {
        assert_eq!(title_of("  Find a tent\nfor two  "), "Find a tent");
        let long = "x".repeat(200);
        assert_eq!(title_of(&long).chars().count(), TITLE_CHARS + 1);
    }

    #[test]
    fn sqlite_urls_escape_what_sqlx_decodes() {
        assert_eq!(
            sqlite_url(Path::new("/d/a?b#c%d/wma.db")),
            "sqlite:///d/a%3Fb%23c%25d/wma.db?mode=rwc"
        );
    }
}
