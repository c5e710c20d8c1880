//! The store's one error type.

use std::path::PathBuf;

/// What went wrong in the store. Every variant's message says what the
/// person or the host can do about it; none of them is a reason for the
/// host to stop serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database URL is not one the store takes.
    #[error(
        "the database URL `{url}` is not one the store takes: {reason} \
         (it takes postgres://user@host:port/database or sqlite:///path/to/file)"
    )]
    BadUrl {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The data folder for the SQLite file could not be made.
    #[error("could not create the data folder {}: {source}", path.display())]
    DataDir {
        /// The folder.
        path: PathBuf,
        /// The file system's reason.
        #[source]
        source: std::io::Error,
    },
    /// Another live process has the store open under this host's name: two
    /// would interrupt each other's runs (each recovers the name's runs
    /// when it opens the store).
    #[error(
        "another process has the store at {location} open as host `{host}`; two hosts \
         of one name would interrupt each other's runs: stop that one, or give this one \
         its own `[store] host` (or `data_dir`)"
    )]
    HostInUse {
        /// The host name.
        host: String,
        /// Where the database is (a file, or the URL without its password).
        location: String,
    },
    /// The database's schema is newer than this build knows.
    #[error(
        "the database at {location} has schema version {found}, newer than this build of \
         wma knows ({known}): it was written by a newer wma; run that one, or point this \
         one at another database"
    )]
    SchemaTooNew {
        /// Where the database is (a file, or the URL without its password).
        location: String,
        /// The version the database has.
        found: i64,
        /// The newest version this build knows.
        known: i64,
    },
    /// The database cannot be reached now (refused, gone away, timed out).
    /// The pool reconnects on the next request; the host keeps serving.
    #[error("the store's database at {location} cannot be reached: {source}")]
    Unavailable {
        /// Where the database is.
        location: String,
        /// The driver's reason.
        #[source]
        source: sqlx::Error,
    },
    /// The database answered with an error.
    #[error("the store's database at {location} failed: {source}")]
    Database {
        /// Where the database is.
        location: String,
        /// The driver's reason.
        #[source]
        source: sqlx::Error,
    },
    /// No session has this id.
    #[error("no session `{0}`")]
    SessionNotFound(String),
    /// No run has this id.
    #[error("no run `{0}`")]
    RunNotFound(String),
    /// The run has ended, so nothing more is appended to it.
    #[error("run `{run_id}` has already ended ({status}); nothing more can be appended to it")]
    RunEnded {
        /// The run.
        run_id: String,
        /// Its status (`finished`, `failed`, `interrupted`).
        status: String,
    },
    /// A run with this id exists already.
    #[error("a run `{0}` exists already")]
    RunExists(String),
    /// No consequential call has this idempotency key.
    #[error("no consequential call `{0}` was recorded")]
    CallNotFound(String),
    /// The call is not in flight, so it cannot be answered now.
    #[error(
        "call `{idempotency_key}` is {status}, not in flight: its answer cannot be recorded now"
    )]
    CallNotInFlight {
        /// The call's key.
        idempotency_key: String,
        /// Its status (`answered`, `in-doubt`).
        status: String,
    },
    /// The same call is in doubt: it may have happened, so it is not sent
    /// again.
    #[error(
        "the same {tool} call of this run is in doubt (`{idempotency_key}`): it was in flight \
         when the host went away and may have happened, so it is not sent again; a person \
         checks it"
    )]
    CallInDoubt {
        /// The call in doubt.
        idempotency_key: String,
        /// Its tool.
        tool: String,
    },
    /// A run of the session is in progress on another host that is alive;
    /// deleting the session would pull its history from under it.
    #[error("a run of session `{session}` is in progress on host `{host}`; stop it there first")]
    SessionLive {
        /// The session.
        session: String,
        /// The host running it.
        host: String,
    },
    /// No approval has this id.
    #[error("no approval `{0}`")]
    ApprovalNotFound(String),
    /// The approval was answered before; an answer is final.
    #[error("approval `{id}` was already answered: {decision}")]
    AlreadyDecided {
        /// The approval.
        id: String,
        /// Its answer (`approved` or `denied`).
        decision: String,
    },
    /// A run's background log could not be written.
    #[error("the log of run `{run_id}` could not be written: {reason}")]
    LogFailed {
        /// The run.
        run_id: String,
        /// The first failure.
        reason: String,
    },
    /// Something stored could not be read back.
    #[error("the stored {what} could not be read: {reason}")]
    Corrupt {
        /// What was read (`part 4 of run …`, `message 2 of session …`).
        what: String,
        /// Why.
        reason: String,
    },
}

impl StoreError {
    /// True when the database could not be reached: the request may
    /// succeed later, once it is back.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Classifies a driver error: the connection's failures are
    /// [`StoreError::Unavailable`], the rest [`StoreError::Database`].
    pub(crate) fn from_sqlx(location: &str, source: sqlx::Error) -> Self {
        let location = location.to_string();
        if is_connection_error(&source) {
            Self::Unavailable { location, source }
        } else {
            Self::Database { location, source }
        }
    }
}

/// Connection failures: I/O, TLS, a pool that timed out or closed, a
/// SQLite worker that died, and PostgreSQL's connection-exception (08)
/// and operator-intervention (57, a server shutting down) classes.
fn is_connection_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57")),
        _ => false,
    }
}

/// True for a unique-key violation (a row that exists already).
pub(crate) fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.is_unique_violation())
}
