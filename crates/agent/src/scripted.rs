//! A provider that replays a script: the `scripted` provider of configs,
//! for hosts, examples and tests that run without a model.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{
    CallFormat, Constraint, GenerateRequest, Generation, Progress, ProgressFn, Provider,
    ProviderError, ProviderInfo,
};
use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedReply {
    /// The text to return.
    pub text: String,
    /// Wait this long first (cancellation ends the wait).
    pub delay: Option<Duration>,
    /// Fail with this message instead of answering.
    pub fail: Option<String>,
}

impl ScriptedReply {
    /// A reply with this text.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            delay: None,
            fail: None,
        }
    }

    /// A failure with this message.
    pub fn failure(message: impl Into<String>) -> Self {
        Self {
            text: String::new(),
            delay: None,
            fail: Some(message.into()),
        }
    }

    /// The same reply after a delay.
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }
}

impl From<&str> for ScriptedReply {
    fn from(text: &str) -> Self {
        Self::text(text)
    }
}

impl From<String> for ScriptedReply {
    fn from(text: String) -> Self {
        Self::text(text)
    }
}

/// How many of the latest requests a scripted provider keeps: enough for
/// any test to read back, bounded so that a host serving one (a soak, a
/// config that names a scripted provider) does not grow without end.
pub const SCRIPTED_REQUEST_LOG: usize = 1024;

struct Inner {
    replies: VecDeque<ScriptedReply>,
    requests: VecDeque<GenerateRequest>,
    prepared: bool,
}

/// A [`Provider`] that answers from a script. Cheap to clone; clones share
/// the script and the request log.
#[derive(Clone)]
pub struct ScriptedProvider {
    inner: Arc<Mutex<Inner>>,
    model: String,
    call_format: CallFormat,
    tools_inline: bool,
    constraints: bool,
    /// Prompts longer than this many characters do not fit.
    max_prompt_chars: Option<usize>,
    /// The call probability reported for generations under a text-or-calls
    /// constraint.
    call_probability: Option<f32>,
    /// The neutral baseline's call probability reported where the request
    /// asks for one ([`crate::Decoding::call_baseline`]).
    call_baseline: Option<f32>,
}

impl ScriptedProvider {
    /// A provider that gives these replies in order.
    pub fn new<I, R>(replies: I) -> Self
    where
        I: IntoIterator<Item = R>,
        R: Into<ScriptedReply>,
    {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                replies: replies.into_iter().map(Into::into).collect(),
                requests: VecDeque::new(),
                prepared: false,
            })),
            model: "scripted-model".to_string(),
            call_format: CallFormat::Json,
            tools_inline: true,
            constraints: false,
            max_prompt_chars: None,
            call_probability: None,
            call_baseline: None,
        }
    }

    /// Names the model (for traces).
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    /// Sets the call format the provider reports.
    pub fn with_call_format(mut self, format: CallFormat) -> Self {
        self.call_format = format;
        self
    }

    /// Sets whether the provider wants tools inline.
    pub fn with_tools_inline(mut self, inline: bool) -> Self {
        self.tools_inline = inline;
        self
    }

    /// Claims constraint support (the constraint is recorded, not applied).
    pub fn with_constraints(mut self, supported: bool) -> Self {
        self.constraints = supported;
        self
    }

    /// Reports `p` as the model's call probability for generations under a
    /// text-or-calls constraint, as a provider that decodes under one does.
    pub fn with_call_probability(mut self, p: f32) -> Self {
        self.call_probability = Some(p);
        self
    }

    /// Reports `p` as the call probability of the neutral baseline
    /// ([`crate::Decoding::call_baseline`]) for generations that ask for
    /// one under a text-or-calls constraint, as the ONNX provider does.
    pub fn with_call_baseline(mut self, p: f32) -> Self {
        self.call_baseline = Some(p);
        self
    }

    /// Makes prompts longer than `chars` (all messages and tool schemas together) not fit.
    pub fn with_max_prompt_chars(mut self, chars: usize) -> Self {
        self.max_prompt_chars = Some(chars);
        self
    }

    /// Adds replies to the end of the script.
    pub fn push<R: Into<ScriptedReply>>(&self, reply: R) {
        self.lock().replies.push_back(reply.into());
    }

    /// The requests received, in order: the latest [`SCRIPTED_REQUEST_LOG`] of them.
    pub fn requests(&self) -> Vec<GenerateRequest> {
        self.lock().requests.iter().cloned().collect()
    }

    /// Replies not yet used.
    pub fn remaining(&self) -> usize {
        self.lock().replies.len()
    }

    /// Whether prepare() ran.
    pub fn prepared(&self) -> bool {
        self.lock().prepared
    }

    /// The size of a prompt as [`Self::with_max_prompt_chars`] counts it.
    pub fn prompt_chars(request: &GenerateRequest) -> usize {
        request
            .messages
            .iter()
            .map(|m| m.content.chars().count())
            .sum::<usize>()
            + request
                .tools
                .iter()
                .map(|t| t.name.len() + t.description.len() + t.input_schema.to_string().len())
                .sum::<usize>()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A test that panicked while holding the lock already failed; keep
        // the data usable for its report.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Provider for ScriptedProvider {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            provider: "scripted".to_string(),
            model: self.model.clone(),
            context_length: None,
        }
    }

    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        progress(Progress {
            stage: "script".to_string(),
            done: 1,
            total: Some(1),
        });
        self.lock().prepared = true;
        Ok(())
    }

    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        let input_tokens = Self::prompt_chars(&request) as u32 / 4;
        let text_or_calls = matches!(request.constraint, Some(Constraint::TextOrCalls { .. }));
        let baseline = text_or_calls
            && request.decoding.call_baseline
            && request.decoding.call_threshold.is_some();
        let reply = {
            let mut inner = self.lock();
            if inner.requests.len() == SCRIPTED_REQUEST_LOG {
                inner.requests.pop_front();
            }
            inner.requests.push_back(request);
            inner.replies.pop_front()
        };
        let Some(reply) = reply else {
            return Err(ProviderError::Generation(
                "the script has no more replies".to_string(),
            ));
        };
        if let Some(delay) = reply.delay {
            tokio::select! {
                _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                _ = tokio::time::sleep(delay) => {}
            }
        }
        if let Some(message) = reply.fail {
            return Err(ProviderError::Generation(message));
        }
        Ok(Generation {
            output_tokens: Some(reply.text.split_whitespace().count() as u32),
            input_tokens: Some(input_tokens),
            text: reply.text,
            time_to_first_token: Some(Duration::from_millis(1)),
            total_time: Some(reply.delay.unwrap_or_default()),
            finish_reason: Some("stop".to_string()),
            cached_tokens: None,
            call_probability: self.call_probability.filter(|_| text_or_calls),
            call_baseline: self.call_baseline.filter(|_| baseline),
        })
    }

    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError> {
        Ok(self
            .max_prompt_chars
            .is_none_or(|max| Self::prompt_chars(request) <= max))
    }

    fn call_format(&self) -> CallFormat {
        self.call_format
    }

    fn tools_inline(&self) -> bool {
        self.tools_inline
    }

    fn supports_constraints(&self) -> bool {
        self.constraints
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_request_log_keeps_only_the_latest_requests() {
        let n = SCRIPTED_REQUEST_LOG + 2;
        let provider = ScriptedProvider::new((0..n).map(|i| i.to_string()));
        for i in 0..n {
            let request = GenerateRequest {
                max_new_tokens: Some(i as u32),
                ..GenerateRequest::default()
            };
            provider
                .generate(request, CancellationToken::new())
                .await
                .unwrap();
        }
        let kept = provider.requests();
        assert_eq!(kept.len(), SCRIPTED_REQUEST_LOG);
        assert_eq!(kept[0].max_new_tokens, Some(2), "the oldest two are gone");
        assert_eq!(kept.last().unwrap().max_new_tokens, Some(n as u32 - 1));
    }
}
