//! Helpers shared by the runtime's tests: a check-until-true wait, a model
//! that generates token by token, and tool hosts.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wma_agent::{
    AgentStreamPart, CallFormat, GenerateRequest, Generation, Progress, ProgressFn, Provider,
    ProviderError, ProviderInfo, ToolDefinition,
};
use wma_testkit::InMemoryToolHost;

/// Polls `condition` until it holds; panics (naming `what`) if it does not
/// within a generous bound, so a broken runtime fails instead of hanging.
pub(crate) async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The terminal part, checked to be the only one and the last.
pub(crate) fn end(parts: &[AgentStreamPart]) -> &AgentStreamPart {
    assert_eq!(
        parts.iter().filter(|p| p.is_terminal()).count(),
        1,
        "exactly one terminal part: {parts:#?}"
    );
    let last = parts.last().expect("a run yields parts");
    assert!(
        last.is_terminal(),
        "the terminal part comes last: {parts:#?}"
    );
    last
}

/// A JSON tool call as the scripted models write it.
pub(crate) fn call(name: &str, arguments: serde_json::Value) -> String {
    json!({"name": name, "arguments": arguments}).to_string()
}

/// The shop's one tool: add a product to the cart.
pub(crate) fn add_to_cart() -> ToolDefinition {
    ToolDefinition::new(
        "add_to_cart",
        "Add a product to the cart.",
        json!({"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}),
    )
}

/// A shop whose add_to_cart works.
pub(crate) fn shop() -> InMemoryToolHost {
    let host = InMemoryToolHost::new();
    host.add(add_to_cart(), |args| {
        Ok(format!(
            "added {} to the cart",
            args["id"].as_str().unwrap_or("?")
        ))
    });
    host
}

#[derive(Default)]
struct Counters {
    /// Generations started (before the gate).
    started: AtomicUsize,
    /// Generations that took a reply from the script.
    served: AtomicUsize,
    /// Generations running now.
    active: AtomicUsize,
    /// Tokens emitted, over all generations.
    tokens: AtomicUsize,
    /// A generation stopped early because its token was cancelled.
    saw_cancel: AtomicBool,
}

/// A model that writes its reply one word-token at a time and checks the
/// cancellation token before every token, as the ONNX provider does.
#[derive(Clone)]
pub(crate) struct TokenModel {
    model: String,
    replies: Arc<Mutex<VecDeque<String>>>,
    tick: Duration,
    panic_at: Option<usize>,
    gate: Option<Arc<Semaphore>>,
    load_error: Option<String>,
    counters: Arc<Counters>,
}

/// Counts a generation as active until dropped (even by cancellation).
struct Active(Arc<Counters>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl TokenModel {
    /// A model named `model` that gives these replies in order.
    pub(crate) fn new<I: IntoIterator<Item = S>, S: Into<String>>(model: &str, replies: I) -> Self {
        Self {
            model: model.to_string(),
            replies: Arc::new(Mutex::new(replies.into_iter().map(Into::into).collect())),
            tick: Duration::ZERO,
            panic_at: None,
            gate: None,
            load_error: None,
            counters: Arc::default(),
        }
    }

    /// Waits this long per token.
    pub(crate) fn with_tick(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Panics when it reaches this token of a generation.
    pub(crate) fn panicking_at_token(mut self, token: usize) -> Self {
        self.panic_at = Some(token);
        self
    }

    /// Each generation waits for [`TokenModel::release`] before it starts.
    pub(crate) fn gated(mut self) -> Self {
        self.gate = Some(Arc::new(Semaphore::new(0)));
        self
    }

    /// prepare() fails with this message.
    pub(crate) fn failing_to_load(mut self, message: &str) -> Self {
        self.load_error = Some(message.to_string());
        self
    }

    /// Lets `n` gated generations go.
    pub(crate) fn release(&self, n: usize) {
        if let Some(gate) = &self.gate {
            gate.add_permits(n);
        }
    }

    /// Generations started.
    pub(crate) fn started(&self) -> usize {
        self.counters.started.load(Ordering::SeqCst)
    }

    /// Generations that took a reply.
    pub(crate) fn served(&self) -> usize {
        self.counters.served.load(Ordering::SeqCst)
    }

    /// Generations running now.
    pub(crate) fn active(&self) -> usize {
        self.counters.active.load(Ordering::SeqCst)
    }

    /// Tokens emitted.
    pub(crate) fn tokens(&self) -> usize {
        self.counters.tokens.load(Ordering::SeqCst)
    }

    /// Whether a generation stopped because it saw its token cancelled.
    pub(crate) fn saw_cancel(&self) -> bool {
        self.counters.saw_cancel.load(Ordering::SeqCst)
    }

    fn cancelled<T>(&self) -> Result<T, ProviderError> {
        self.counters.saw_cancel.store(true, Ordering::SeqCst);
        Err(ProviderError::Cancelled)
    }

    async fn decode(
        &self,
        reply: &str,
        cancel: &CancellationToken,
        started: Instant,
    ) -> Result<(String, u32, Option<Duration>), ProviderError> {
        let mut first = None;
        let mut text = String::new();
        let mut count = 0u32;
        for (i, token) in reply.split_inclusive(' ').enumerate() {
            if cancel.is_cancelled() {
                return self.cancelled();
            }
            if self.panic_at == Some(i) {
                panic!("the test model fell over at token {i}");
            }
            if self.tick.is_zero() {
                tokio::task::yield_now().await;
            } else {
                tokio::select! {
                    _ = cancel.cancelled() => return self.cancelled(),
                    _ = tokio::time::sleep(self.tick) => {}
                }
            }
            text.push_str(token);
            count += 1;
            first.get_or_insert(started.elapsed());
            self.counters.tokens.fetch_add(1, Ordering::SeqCst);
        }
        Ok((text, count, first))
    }
}

#[async_trait]
impl Provider for TokenModel {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            provider: "token-test".to_string(),
            model: self.model.clone(),
            context_length: Some(4096),
        }
    }

    async fn prepare(
        &self,
        progress: ProgressFn,
        _cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        for done in 1..=3 {
            progress(Progress {
                stage: format!("load {}", self.model),
                done,
                total: Some(3),
            });
        }
        match &self.load_error {
            Some(message) => Err(ProviderError::Load(message.clone())),
            None => Ok(()),
        }
    }

    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.counters.active.fetch_add(1, Ordering::SeqCst);
        let _active = Active(self.counters.clone());
        self.counters.started.fetch_add(1, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            tokio::select! {
                _ = cancel.cancelled() => return self.cancelled(),
                permit = gate.acquire() => permit.expect("the gate stays open").forget(),
            }
        }
        let reply = self
            .replies
            .lock()
            .pop_front()
            .ok_or_else(|| ProviderError::Generation("no more replies".to_string()))?;
        self.counters.served.fetch_add(1, Ordering::SeqCst);
        // The model's own span: the hop through the provider actor must keep
        // it under the loop's `chat` span.
        let span = tracing::info_span!("decode", wma.tokens = tracing::field::Empty);
        let started = Instant::now();
        let (text, count, first) = self
            .decode(&reply, &cancel, started)
            .instrument(span.clone())
            .await?;
        span.record("wma.tokens", count);
        Ok(Generation {
            text,
            input_tokens: Some(request.messages.len() as u32 * 10),
            output_tokens: Some(count),
            cached_tokens: None,
            time_to_first_token: first,
            total_time: Some(started.elapsed()),
            finish_reason: Some("stop".to_string()),
            call_probability: None,
            call_baseline: None,
            steered: Default::default(),
        })
    }

    async fn fits(&self, _request: &GenerateRequest) -> Result<bool, ProviderError> {
        Ok(true)
    }

    fn call_format(&self) -> CallFormat {
        CallFormat::Json
    }

    fn tools_inline(&self) -> bool {
        true
    }
}
