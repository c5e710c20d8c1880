//! How long handles wait on the actors.
//!
//! Every handle takes these from the supervisor that made it, so they live
//! apart from every actor: a module any actor may import without importing
//! another.

use std::time::Duration;

/// How long handles wait on the actors. Every call has a limit, so a
/// stuck actor shows up as an error, never as a hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Quick requests (start a run, stop, facts). Default 5 s.
    pub control: Duration,
    /// One generation. Default 10 min; the loop's `step_timeout` (60 s by
    /// default) normally ends a generation long before.
    pub generate: Duration,
    /// Preparing the model a swap loads. Default 15 min.
    pub swap: Duration,
    /// How long a call waits for a crashed actor to be restarted (which, for
    /// the provider, includes loading its model again). Default 60 s.
    pub restart_wait: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            control: Duration::from_secs(5),
            generate: Duration::from_secs(10 * 60),
            swap: DEFAULT_SWAP_TIMEOUT,
            restart_wait: Duration::from_secs(60),
        }
    }
}

/// How long [`ProviderHandle::swap`](crate::ProviderHandle::swap) waits by
/// default: loading a model from disk, or downloading it, can take minutes.
pub const DEFAULT_SWAP_TIMEOUT: Duration = Duration::from_secs(15 * 60);
