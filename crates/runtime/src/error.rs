//! The runtime's one error type, and the text a caught panic leaves.

use std::time::Duration;

use wma_agent::ProviderError;

/// What can go wrong when starting the runtime or talking to its actors.
///
/// A run's own failures (a model that crashed, a tool that timed out) are not
/// here: they reach the caller as stream parts, like every run's errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The agent already runs as many requests as its admission limit allows.
    #[error(
        "the agent `{agent}` is already running {limit} requests (its limit); try again when one finishes"
    )]
    Busy {
        /// The agent.
        agent: String,
        /// Its limit of concurrent runs.
        limit: usize,
    },
    /// No agent has this name.
    #[error("there is no agent named `{0}`")]
    UnknownAgent(String),
    /// An actor did not answer in time.
    #[error("the {actor} did not answer within {:.1} s", after.as_secs_f64())]
    Timeout {
        /// Which actor ("provider", "tool bridge", "agent `x`").
        actor: String,
        /// How long the caller waited.
        after: Duration,
    },
    /// An actor is not running and is not coming back (restart budget spent,
    /// or the runtime was shut down).
    #[error("the {actor} is not available: {reason}")]
    Unavailable {
        /// Which actor.
        actor: String,
        /// Why it is gone.
        reason: String,
    },
    /// A swap was asked for while another one is still loading.
    #[error("a model swap is already in progress; wait for it to finish")]
    SwapInProgress,
    /// The new provider could not be prepared; the previous one keeps serving.
    #[error("the new model could not be loaded, so the current one keeps serving: {0}")]
    SwapFailed(ProviderError),
    /// The first provider could not be prepared, so the runtime did not start.
    #[error("the model could not be loaded, so the runtime did not start: {0}")]
    Load(ProviderError),
    /// The actor system refused to start an actor.
    #[error("could not start the {actor}: {reason}")]
    Spawn {
        /// Which actor.
        actor: String,
        /// What ractor said.
        reason: String,
    },
    /// The runtime was configured inconsistently.
    #[error("invalid runtime configuration: {0}")]
    Config(String),
    /// The request a run was asked to start with is empty (no message, or
    /// a last message of the person's with nothing but white space): no
    /// run starts, since a model given nothing to do does whatever its
    /// instructions and tools suggest.
    #[error("the request is empty: say what the agent should do")]
    EmptyRequest,
}

/// The message of a caught panic, for error parts and logs.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}
