//! Sessions and runs that survive a restart, for webmcp-agents hosts.
//!
//! One [`Store`] keeps, in one database:
//! - **sessions**: conversations with an id, their agent, a title and
//!   their messages in order (the history the loop sees);
//! - **runs as a durable log**: each part a run streams is appended with
//!   its sequence number (1, 2, 3… per run), which SSE sends as the event
//!   id, so a client that reconnects with `Last-Event-ID: n` reads
//!   [`Store::parts_after`]`(run, n)`: exactly what it missed. A streaming
//!   host appends through a [`RunLog`], which numbers and queues a part at
//!   once and commits bursts of parts in the background ([`RunLog::start`]
//!   starts the run the same way: its row is committed with its first
//!   parts, and the run waits for no commit at all);
//! - **consequential calls**, recorded before they are sent (with an
//!   idempotency key) and when they answered; one that was in flight when
//!   the host went away is `in-doubt` after it comes back, never resent.
//!   A host records a run's calls through a [`CallRecorder`];
//! - **pending approvals**, which a restart keeps decidable.
//!
//! The database is an SQLite file in the data folder by default (WAL mode),
//! or PostgreSQL when a URL is given: the same schema and the same queries
//! on both, through sqlx's Any driver. [`Store::open`] migrates the schema
//! (refusing a newer one) and marks this host's unfinished runs
//! `interrupted`. `docs/sessions.md` describes the whole design.
//!
//! ```
//! use wma_agent::{AgentStreamPart, ChatMessage};
//! use wma_store::{RunStatus, Store, StoreOptions};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), wma_store::StoreError> {
//! # let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(StoreOptions::in_data_dir(dir.path())).await?;
//! let session = store.create_session("shopper", "").await?;
//! store.append_messages(&session.id, &[ChatMessage::user("Find a tent")]).await?;
//! let run = store.start_run(&session.id, "shopper", None).await?;
//! store.append_part(&run.id, "shopper", 0, &AgentStreamPart::MessageStart { step: 1 }).await?;
//! let seq = store.append_part(&run.id, "shopper", 0, &AgentStreamPart::Text { text: "Here.".into() }).await?;
//! assert_eq!(seq, 2);
//! // A client that saw part 1 reconnects and gets the rest.
//! let missed = store.parts_after(&run.id, 1).await?;
//! assert_eq!(missed.len(), 1);
//! assert_eq!(store.run(&run.id).await?.unwrap().status, RunStatus::Running);
//! # Ok(()) }
//! ```

mod calls;
mod error;
mod files;
mod host;
mod log;
mod schema;
mod store;
mod types;

pub use calls::{CallRecordProblem, CallRecorder, EndedCalls, RunCallId};
pub use error::StoreError;
pub use log::RunLog;
pub use schema::SCHEMA_VERSION;
pub use store::{
    Backend, DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_DB_FILE, DEFAULT_HOST, DEFAULT_MAX_CONNECTIONS,
    Store, StoreOptions, TITLE_CHARS, new_id, redact_url,
};
pub use types::{
    Approval, CallRecord, CallStatus, LoggedPart, Recovery, Run, RunStatus, Session,
    SessionWithMessages, UnixMillis,
};
