//! Progress bars for long work (downloading and loading models), on stderr.
//! indicatif hides them when stderr is not a terminal, so logs and tests
//! see none of their redrawing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use webmcp_agents::agent::Progress;

/// One bar per named task (a provider being prepared).
#[derive(Clone, Default)]
pub(crate) struct Bars {
    multi: MultiProgress,
    bars: Arc<Mutex<HashMap<String, ProgressBar>>>,
}

impl Bars {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The callback that feeds the bars.
    pub(crate) fn callback(&self) -> webmcp_agents::config::ProgressCallback {
        let bars = self.clone();
        Arc::new(move |name: &str, progress: Progress| bars.update(name, &progress))
    }

    /// A callback for one task.
    pub(crate) fn single(&self, name: &str) -> impl Fn(Progress) + Send + Sync + 'static {
        let bars = self.clone();
        let name = name.to_string();
        move |progress| bars.update(&name, &progress)
    }

    /// Removes every bar (the work is done, or failed).
    pub(crate) fn finish(&self) {
        for bar in self.bars.lock().values() {
            bar.finish_and_clear();
        }
    }

    fn update(&self, name: &str, progress: &Progress) {
        let mut bars = self.bars.lock();
        let bar = bars.entry(name.to_string()).or_insert_with(|| {
            let bar = self.multi.add(ProgressBar::new_spinner());
            bar.set_prefix(name.to_string());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        match progress.total {
            Some(total) if total > 1 => {
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix:.bold} {msg} [{bar:30}] {human_pos}/{human_len} ({eta})",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                bar.set_length(total);
                bar.set_position(progress.done.min(total));
            }
            _ => bar.set_style(
                ProgressStyle::with_template("{prefix:.bold} {spinner} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            ),
        }
        bar.set_message(progress.stage.clone());
    }
}
