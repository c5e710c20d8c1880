//! The adapter shape a chat host drives: id, label, prepare, run; and the
//! local adapter that wraps a provider and the loop.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::error::ProviderError;
use crate::host::AgentRunRequest;
use crate::provider::{ProgressFn, Provider};
use crate::run::{AgentStream, LocalLoopOptions, run_local_agent};

/// What a chat host drives: something with a name that can get ready and run.
#[async_trait]
pub trait AgentAdapter: Send + Sync {
    /// Stable identifier.
    fn id(&self) -> &str;
    /// Name shown to the person.
    fn label(&self) -> &str;
    /// Gets ready before the first run (loads or downloads the model).
    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError>;
    /// Runs one request.
    fn run(&self, request: AgentRunRequest) -> AgentStream;
}

/// Options of [`LocalAdapter`]. Like the original's, they carry the limits
/// and instructions; `max_tools` and `tools_inline` are set only on the loop
/// (the adapter takes `tools_inline` from its provider).
#[derive(Debug, Clone, PartialEq)]
pub struct LocalAdapterOptions {
    /// Stable identifier. Default `local`.
    pub id: String,
    /// Name shown to the person. Default `On-device model`.
    pub label: String,
    /// Model steps per user message. Default 6.
    pub max_steps: u32,
    /// Time limit per generation. Default 60 s.
    pub step_timeout: Duration,
    /// "About this site" instructions. Default none.
    pub instructions: Option<String>,
}

impl Default for LocalAdapterOptions {
    fn default() -> Self {
        let loop_defaults = LocalLoopOptions::default();
        Self {
            id: "local".to_string(),
            label: "On-device model".to_string(),
            max_steps: loop_defaults.max_steps,
            step_timeout: loop_defaults.step_timeout,
            instructions: None,
        }
    }
}

/// An adapter around a provider: `run` is [`run_local_agent`] with the
/// adapter's options and the provider's own `tools_inline`.
pub struct LocalAdapter<P: ?Sized> {
    provider: Arc<P>,
    options: LocalAdapterOptions,
}

impl<P: Provider + ?Sized + 'static> LocalAdapter<P> {
    /// The adapter, as the original's `createLocalAdapter`.
    pub fn new(provider: Arc<P>, options: LocalAdapterOptions) -> Self {
        Self { provider, options }
    }

    /// The loop options a run uses.
    pub fn loop_options(&self) -> LocalLoopOptions {
        LocalLoopOptions {
            max_steps: self.options.max_steps,
            step_timeout: self.options.step_timeout,
            instructions: self.options.instructions.clone(),
            tools_inline: self.provider.tools_inline(),
            ..LocalLoopOptions::default()
        }
    }
}

/// Builds a [`LocalAdapter`], as the original's `createLocalAdapter`.
pub fn create_local_adapter<P: Provider + ?Sized + 'static>(
    provider: Arc<P>,
    options: LocalAdapterOptions,
) -> LocalAdapter<P> {
    LocalAdapter::new(provider, options)
}

#[async_trait]
impl<P: Provider + ?Sized + 'static> AgentAdapter for LocalAdapter<P> {
    fn id(&self) -> &str {
        &self.options.id
    }

    fn label(&self) -> &str {
        &self.options.label
    }

    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        self.provider.prepare(progress, cancel).await
    }

    fn run(&self, request: AgentRunRequest) -> AgentStream {
        run_local_agent(self.provider.clone(), request, self.loop_options())
    }
}
