//! The schema, one migration a version, the same DDL for SQLite and
//! PostgreSQL: only `TEXT` and `BIGINT` columns, composite primary keys
//! instead of auto-increment ids (which the two spell differently), JSON
//! kept as text, times as Unix milliseconds. Orders that times cannot
//! give (two runs started in one millisecond) come from counters the
//! inserts compute: `ordinal` within the parent, `activity` across
//! sessions.

use sqlx::{AnyPool, Row};

use crate::StoreError;
use crate::store::now_ms;

/// One step of the schema.
struct Migration {
    version: i64,
    statements: &'static [&'static str],
}

/// Every migration, oldest first. A new one is appended here, never edited
/// in place: databases in use have the old ones applied.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        statements: &[
            "CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            agent TEXT NOT NULL,
            title TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL,
            activity BIGINT NOT NULL
        )",
            "CREATE INDEX sessions_by_activity ON sessions (activity)",
            "CREATE TABLE messages (
            session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            seq BIGINT NOT NULL,
            body TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            PRIMARY KEY (session_id, seq)
        )",
            "CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            agent TEXT NOT NULL,
            host TEXT NOT NULL,
            status TEXT NOT NULL,
            error TEXT,
            ordinal BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL
        )",
            "CREATE INDEX runs_by_session ON runs (session_id, ordinal)",
            "CREATE INDEX runs_by_host_status ON runs (host, status)",
            "CREATE TABLE parts (
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            seq BIGINT NOT NULL,
            agent TEXT NOT NULL,
            depth BIGINT NOT NULL,
            body TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            PRIMARY KEY (run_id, seq)
        )",
            "CREATE TABLE calls (
            idempotency_key TEXT PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            agent TEXT NOT NULL,
            call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            arguments TEXT NOT NULL,
            status TEXT NOT NULL,
            output TEXT,
            is_error BIGINT NOT NULL,
            started_at BIGINT NOT NULL,
            answered_at BIGINT,
            ordinal BIGINT NOT NULL
        )",
            "CREATE INDEX calls_by_run ON calls (run_id, ordinal)",
            "CREATE INDEX calls_by_status ON calls (status)",
            "CREATE TABLE approvals (
            id TEXT PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            loop_approval_id TEXT NOT NULL,
            agent TEXT NOT NULL,
            call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            arguments TEXT NOT NULL,
            reason TEXT NOT NULL,
            requested_at BIGINT NOT NULL,
            approved BIGINT,
            remember BIGINT NOT NULL,
            decided_by TEXT,
            note TEXT,
            decided_at BIGINT,
            ordinal BIGINT NOT NULL
        )",
            "CREATE INDEX approvals_by_run ON approvals (run_id, ordinal)",
        ],
    },
    Migration {
        // Two runs of one sub-agent inside a run number their calls alike:
        // which sub-agent run a part or a call is from (`""` for the run's own).
        version: 2,
        statements: &[
            "ALTER TABLE parts ADD COLUMN sub_run TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE calls ADD COLUMN sub_run TEXT NOT NULL DEFAULT ''",
        ],
    },
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = 2;

/// Brings the database up to [`SCHEMA_VERSION`], applying each missing
/// migration once, in its own transaction together with its row in
/// `wma_schema`; refuses a database that is newer than the code.
///
/// Hosts sharing a database may open it at once: each migration's
/// transaction first inserts its version row, so a second host waits on
/// that row's key, fails on it once the first commits, and reads the
/// version again.
pub(crate) async fn migrate(pool: &AnyPool, location: &str) -> Result<(), StoreError> {
    let db = |e| StoreError::from_sqlx(location, e);
    // Two PostgreSQL sessions creating the table at once can both pass
    // IF NOT EXISTS and one then fails on the catalog's unique key; the
    // table exists by then, so the next try is a no-op.
    let mut tries = 0;
    loop {
        tries += 1;
        let created = sqlx::query(
            "CREATE TABLE IF NOT EXISTS wma_schema (
                version BIGINT PRIMARY KEY,
                applied_at BIGINT NOT NULL
            )",
        )
        .execute(pool)
        .await;
        match created {
            Ok(_) => break,
            Err(sqlx::Error::Database(_)) if tries < 3 => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(db(e)),
        }
    }
    loop {
        let found: i64 = sqlx::query("SELECT COALESCE(MAX(version), 0) FROM wma_schema")
            .fetch_one(pool)
            .await
            .map_err(db)?
            .try_get(0)
            .map_err(db)?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::SchemaTooNew {
                location: location.to_string(),
                found,
                known: SCHEMA_VERSION,
            });
        }
        let Some(next) = MIGRATIONS.iter().find(|m| m.version > found) else {
            return Ok(());
        };
        let mut tx = pool.begin().await.map_err(db)?;
        let claimed = sqlx::query("INSERT INTO wma_schema (version, applied_at) VALUES ($1, $2)")
            .bind(next.version)
            .bind(now_ms())
            .execute(&mut *tx)
            .await;
        match claimed {
            Ok(_) => {}
            // Another host applied it meanwhile: read the version again.
            Err(e) if crate::error::is_unique_violation(&e) => continue,
            Err(e) => return Err(db(e)),
        }
        for statement in next.statements {
            sqlx::query(statement).execute(&mut *tx).await.map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        tracing::info!(version = next.version, location, "store schema migrated");
    }
}
