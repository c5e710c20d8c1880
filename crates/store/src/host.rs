//! One live process per host name on a store.
//!
//! Opening a store recovers what its host left unfinished: the host's
//! `running` runs become `interrupted`, its calls in flight in doubt. A
//! second live process opening the store under the same name would do that
//! to the first one's runs while they run. So a store holds its host name
//! while it is open, and a second opening under the name is refused
//! ([`StoreError::HostInUse`]). What holds the name goes when its process
//! does, however it ends (`kill -9` included), so a restart is never kept
//! out by the process it replaces:
//!
//! - **SQLite**: an exclusive transaction, never committed, on a small
//!   SQLite file of its own beside the database (`wma.db.host-<hash>.lock`),
//!   held by a connection kept out of the pool: SQLite's own file lock,
//!   which the operating system releases with the process, and which
//!   SQLite also keeps between connections of one process.
//! - **PostgreSQL**: a session-level advisory lock
//!   (`pg_try_advisory_lock`) on a connection of its own, kept out of the
//!   pool, which the server releases when the session ends. The server
//!   notices a killed host's session when its socket closes, which may take
//!   a moment after the kill: an opening waits up to [`HOST_WAIT`] for the
//!   name. A connection lost while the store is open (the server restarted)
//!   loses the lock with it; the name is then unguarded until the store is
//!   opened again.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sqlx::{AnyConnection, Connection, Row};
use tokio::sync::Mutex;

use crate::StoreError;

/// How long an opening waits for a host name another session holds, so
/// that a host restarted right after a crash gets its name once the server
/// has noticed the old session ended.
pub(crate) const HOST_WAIT: Duration = Duration::from_secs(3);

/// What holds a store's host name while it is open; dropping it lets go.
pub(crate) enum HostGuard {
    /// The connection holding the lock: the lock file's exclusive
    /// transaction (SQLite), or the session holding the advisory lock
    /// (PostgreSQL). Taken out when the store is closed.
    Held(Mutex<Option<AnyConnection>>),
    /// Nothing could hold it (a lock file that cannot be made, an
    /// in-memory database): the name is not guarded.
    None,
}

impl HostGuard {
    /// Holds `host` on the SQLite database `file`, or says who has it.
    pub(crate) async fn sqlite(
        file: &Path,
        host: &str,
        location: &str,
    ) -> Result<Self, StoreError> {
        let path = lock_path(file, host);
        let url = crate::store::sqlite_url(&path);
        // Private like the database beside it (see `files`); should it
        // fail, SQLite's own attempt below says why.
        let _ = crate::files::create_private_file(&path);
        let unguarded = |e: sqlx::Error| {
            tracing::warn!(path = %path.display(), error = %e, "the host name is not guarded: its lock file cannot be used");
            Self::None
        };
        let mut conn = match AnyConnection::connect(&url).await {
            Ok(conn) => conn,
            Err(e) => return Ok(unguarded(e)),
        };
        // At once: a lock another process holds is held for its life.
        for statement in ["PRAGMA busy_timeout = 0", "BEGIN EXCLUSIVE"] {
            match sqlx::query(statement).execute(&mut conn).await {
                Ok(_) => {}
                Err(e) if crate::store::is_busy(&e) => {
                    let _ = conn.close().await;
                    return Err(in_use(host, location));
                }
                Err(e) => {
                    let _ = conn.close().await;
                    return Ok(unguarded(e));
                }
            }
        }
        Ok(Self::Held(Mutex::new(Some(conn))))
    }

    /// Holds `host` on the PostgreSQL database behind `conn`, or says who
    /// has it (after waiting up to [`HOST_WAIT`]).
    pub(crate) async fn postgres(
        mut conn: AnyConnection,
        host: &str,
        location: &str,
    ) -> Result<Self, StoreError> {
        let key = advisory_key(host);
        let started = Instant::now();
        loop {
            let row = sqlx::query("SELECT pg_try_advisory_lock($1)")
                .bind(key)
                .fetch_one(&mut conn)
                .await
                .map_err(|e| StoreError::from_sqlx(location, e))?;
            let held: bool = row
                .try_get(0)
                .map_err(|e| StoreError::from_sqlx(location, e))?;
            if held {
                return Ok(Self::Held(Mutex::new(Some(conn))));
            }
            if started.elapsed() >= HOST_WAIT {
                let _ = conn.close().await;
                return Err(in_use(host, location));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Lets go of the name now (the store is being closed).
    pub(crate) async fn release(&self) {
        if let Self::Held(conn) = self
            && let Some(mut conn) = conn.lock().await.take()
        {
            if conn.backend_name() == "PostgreSQL" {
                // The server ends a closed session's locks a moment after
                // the socket closes; unlocking first means the name is
                // free when `close` returns, so a host probing it next
                // (deleting this host's sessions) finds it free.
                let _ = sqlx::query("SELECT pg_advisory_unlock_all()")
                    .execute(&mut conn)
                    .await;
            }
            // Closing the connection ends its transaction or its session,
            // and with it the lock.
            let _ = conn.close().await;
        }
    }
}

/// Whether a live process holds `host` on the store now: another
/// process's name is held exactly as long as that process lives, so this
/// tells a host that runs from one that was killed. `file` is the SQLite
/// database (`None` for PostgreSQL, asked on `pool`). A lock that cannot be
/// probed counts as held: the question is asked before something is
/// destroyed.
pub(crate) async fn is_held(file: Option<&Path>, pool: &sqlx::AnyPool, host: &str) -> bool {
    match file {
        Some(file) => {
            let path = lock_path(file, host);
            if !path.exists() {
                // The name never held this store.
                return false;
            }
            let Ok(mut conn) = AnyConnection::connect(&crate::store::sqlite_url(&path)).await
            else {
                return true;
            };
            let mut held = false;
            for statement in ["PRAGMA busy_timeout = 0", "BEGIN EXCLUSIVE", "ROLLBACK"] {
                if let Err(e) = sqlx::query(statement).execute(&mut conn).await {
                    held = crate::store::is_busy(&e) || statement != "ROLLBACK";
                    break;
                }
            }
            let _ = conn.close().await;
            held
        }
        None => {
            let key = advisory_key(host);
            let Ok(mut conn) = pool.acquire().await else {
                return true;
            };
            let taken = sqlx::query("SELECT pg_try_advisory_lock($1)")
                .bind(key)
                .fetch_one(&mut *conn)
                .await
                .and_then(|row| row.try_get::<bool, _>(0));
            match taken {
                Ok(true) => {
                    let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
                        .bind(key)
                        .execute(&mut *conn)
                        .await;
                    false
                }
                _ => true,
            }
        }
    }
}

fn in_use(host: &str, location: &str) -> StoreError {
    StoreError::HostInUse {
        host: host.to_string(),
        location: location.to_string(),
    }
}

/// The lock file of `host` beside the database `file`: named by a hash, so
/// that any host name makes a file name.
fn lock_path(file: &Path, host: &str) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "wma.db".to_string());
    file.with_file_name(format!("{name}.host-{:016x}.lock", fnv1a(host)))
}

/// The advisory lock's key for `host`: a hash in a namespace of the
/// store's own, so that other users of the database's advisory locks are
/// unlikely to meet it.
fn advisory_key(host: &str) -> i64 {
    i64::from_ne_bytes(fnv1a(&format!("wma-store host {host}")).to_ne_bytes())
}

/// FNV-1a, 64 bits: stable across builds and platforms (the standard
/// library's hasher is not), which the name of a file and a lock key must
/// be for two builds of wma to meet on them.
fn fnv1a(text: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The file of a `sqlite:` URL, for its lock; `None` for an in-memory
/// database (nothing to share with another process).
pub(crate) fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or_default();
    if path.is_empty() || path.contains(":memory:") {
        return None;
    }
    // What `sqlite_url` escapes.
    let path = path
        .replace("%3F", "?")
        .replace("%23", "#")
        .replace("%25", "%");
    Some(PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_keys_are_stable_and_differ_by_host() {
        // FNV-1a's published value for "a".
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(advisory_key("local"), advisory_key("host-b"));
        assert_eq!(
            lock_path(Path::new("/d/wma.db"), "a"),
            Path::new("/d/wma.db.host-af63dc4c8601ec8c.lock")
        );
        assert_eq!(
            sqlite_file("sqlite:///d/a%3Fb%23c%25d/wma.db?mode=rwc"),
            Some(PathBuf::from("/d/a?b#c%d/wma.db"))
        );
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://x/y"), None);
    }
}
