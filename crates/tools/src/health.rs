//! How a tool source is doing: whether it serves, how often it was started
//! again, and the budget that bounds those restarts.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use serde::Serialize;

/// Restarts allowed within [`DEFAULT_RESTART_WINDOW`] before a source is
/// given up on (until the window has passed).
pub const DEFAULT_MAX_RESTARTS: u32 = 5;

/// The window [`DEFAULT_MAX_RESTARTS`] counts in.
pub const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Whether a source serves right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SourceState {
    /// Not started yet (sources start on first use), or being started.
    Starting,
    /// Serving.
    Ready,
    /// Stopped or failed to start; the next listing or call starts it again.
    Down {
        /// Why, as far as is known.
        reason: String,
    },
    /// Stopped more often than its restart budget allows; it is not started
    /// again until the budget's window has passed.
    GaveUp {
        /// The last failure.
        reason: String,
    },
}

/// What a source that looks after its own process (an MCP server, a
/// browser) says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    /// Whether it serves.
    #[serde(flatten)]
    pub state: SourceState,
    /// Times it was started again after it stopped.
    pub restarts: u32,
}

/// A tool source that can say how it is doing, for health reports.
/// [`ToolSet::add_monitored`](crate::ToolSet::add_monitored) and
/// [`ToolSet::add_built`](crate::ToolSet::add_built) read it.
pub trait Monitored: Send + Sync {
    /// The source's state and restart count right now. Never waits: a
    /// source busy starting answers [`SourceState::Starting`].
    fn status(&self) -> SourceStatus;
}

/// A shared source reports as itself, so a caller can keep a handle on a
/// source it also hands to a set.
impl<M: Monitored + ?Sized> Monitored for std::sync::Arc<M> {
    fn status(&self) -> SourceStatus {
        (**self).status()
    }
}

/// One source of a [`ToolSet`](crate::ToolSet), as
/// [`ToolSet::health`](crate::ToolSet::health) reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceHealth {
    /// The source's name in the set.
    pub source: String,
    /// Whether it serves.
    #[serde(flatten)]
    pub state: SourceState,
    /// Times it was started again: by itself (a server process, a browser)
    /// and by the set (made afresh after a panic).
    pub restarts: u32,
    /// Times it panicked while listing or calling.
    pub panics: u32,
}

/// How often something may be started again: at most `max_restarts`
/// restarts within any `window`, and the restarts it took.
///
/// The one budget of the workspace: a [`ToolSet`](crate::ToolSet) holds one
/// per source (a source made afresh after a panic), an
/// [`McpServer`](crate::McpServer) and a [`WebMcpSource`](crate::WebMcpSource)
/// one for their own process or browser, and the runtime's supervisor one
/// per actor. Each keeps its own count: [`RestartBudget::fresh`] gives a
/// budget of the same size with nothing taken.
#[derive(Debug)]
pub struct RestartBudget {
    max_restarts: u32,
    window: Duration,
    /// When the restarts within the window were taken. Behind a lock so a
    /// budget shared by concurrent calls needs no `&mut`.
    recent: Mutex<VecDeque<Instant>>,
}

impl Default for RestartBudget {
    /// [`DEFAULT_MAX_RESTARTS`] per [`DEFAULT_RESTART_WINDOW`].
    fn default() -> Self {
        Self::new(DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_WINDOW)
    }
}

impl RestartBudget {
    /// At most `max_restarts` restarts within any `window`.
    pub fn new(max_restarts: u32, window: Duration) -> Self {
        Self {
            max_restarts,
            window,
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// A budget of the same size with no restart taken, for one more thing
    /// to restart under the same policy.
    pub fn fresh(&self) -> Self {
        Self::new(self.max_restarts, self.window)
    }

    /// Restarts allowed within [`RestartBudget::window`].
    pub fn max_restarts(&self) -> u32 {
        self.max_restarts
    }

    /// The window [`RestartBudget::max_restarts`] counts in.
    pub fn window(&self) -> Duration {
        self.window
    }

    fn trimmed(&self) -> MutexGuard<'_, VecDeque<Instant>> {
        let mut recent = self.recent.lock();
        let now = Instant::now();
        while recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            recent.pop_front();
        }
        recent
    }

    /// Takes one restart of `what`, or says why none is left (a sentence
    /// that names `what` and the budget, for logs and error messages).
    pub fn take(&self, what: &str) -> Result<(), String> {
        let mut recent = self.trimmed();
        if recent.len() >= self.max_restarts as usize {
            return Err(format!(
                "{what} failed {} times within {} s, more than its restart budget allows; \
                 it is not started again for now",
                recent.len() + 1,
                self.window.as_secs()
            ));
        }
        recent.push_back(Instant::now());
        Ok(())
    }

    /// Whether the budget is spent right now.
    pub fn spent(&self) -> bool {
        self.trimmed().len() >= self.max_restarts as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_refuses_once_spent_and_says_why() {
        let budget = RestartBudget::new(2, Duration::from_secs(60));
        assert!(budget.take("the page").is_ok());
        assert!(!budget.spent());
        assert!(budget.take("the page").is_ok());
        assert!(budget.spent());
        let refused = budget.take("the page").unwrap_err();
        assert!(refused.contains("failed 3 times within 60 s"), "{refused}");
    }

    #[test]
    fn restarts_older_than_the_window_do_not_count() {
        let budget = RestartBudget::new(1, Duration::ZERO);
        assert!(budget.take("x").is_ok());
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            budget.take("x").is_ok(),
            "the first restart left the window"
        );
    }

    #[test]
    fn health_serializes_flat_for_a_health_endpoint() {
        let down = SourceHealth {
            source: "shop".into(),
            state: SourceState::Down {
                reason: "the page is gone".into(),
            },
            restarts: 1,
            panics: 0,
        };
        assert_eq!(
            serde_json::to_value(&down).unwrap(),
            serde_json::json!({"source": "shop", "state": "down",
                "reason": "the page is gone", "restarts": 1, "panics": 0})
        );
        let ready = SourceStatus {
            state: SourceState::Ready,
            restarts: 0,
        };
        assert_eq!(
            serde_json::to_value(&ready).unwrap(),
            serde_json::json!({"state": "ready", "restarts": 0})
        );
    }
}
