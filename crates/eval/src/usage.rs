//! Counting what a run cost the model: a provider wrapper that adds up the
//! token counts and timings of every generation, for the `wma` summary line.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use wma_agent::{
    CallFormat, Constraint, GenerateRequest, Generation, ProgressFn, Provider, ProviderError,
    ProviderInfo,
};

/// Totals over the generations of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Generations made.
    pub generations: u32,
    /// Prompt tokens, summed over generations.
    pub input_tokens: u64,
    /// Of those, tokens served from the provider's cache.
    pub cached_tokens: u64,
    /// Tokens generated.
    pub output_tokens: u64,
    /// Time spent generating.
    pub time: Duration,
    /// Prompt tokens of the generations after the first: a step after the
    /// first repeats its run's prompt so far, which a cache can serve.
    pub later_input_tokens: u64,
    /// Of those, tokens served from the provider's cache.
    pub later_cached_tokens: u64,
}

impl Usage {
    /// The totals of these generations.
    pub fn of<'a>(generations: impl IntoIterator<Item = &'a Generation>) -> Self {
        let mut usage = Self::default();
        for (i, g) in generations.into_iter().enumerate() {
            if i > 0 {
                usage.later_input_tokens += u64::from(g.input_tokens.unwrap_or(0));
                usage.later_cached_tokens += u64::from(g.cached_tokens.unwrap_or(0));
            }
            usage.generations += 1;
            usage.input_tokens += u64::from(g.input_tokens.unwrap_or(0));
            usage.cached_tokens += u64::from(g.cached_tokens.unwrap_or(0));
            usage.output_tokens += u64::from(g.output_tokens.unwrap_or(0));
            usage.time += g.total_time.unwrap_or_default();
        }
        usage
    }

    /// The share of the prompt tokens after the first generation that the
    /// cache served (0 to 1), when there were any.
    pub fn later_cached_share(&self) -> Option<f64> {
        (self.later_input_tokens > 0)
            .then(|| self.later_cached_tokens as f64 / self.later_input_tokens as f64)
    }

    /// Generated tokens per second of generation time.
    pub fn tokens_per_second(&self) -> f64 {
        let secs = self.time.as_secs_f64();
        if secs > 0.0 {
            self.output_tokens as f64 / secs
        } else {
            0.0
        }
    }
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} generations, {} prompt tokens ({} from cache",
            self.generations, self.input_tokens, self.cached_tokens,
        )?;
        if let Some(share) = self.later_cached_share() {
            write!(f, "; {:.0}% after the first generation", share * 100.0)?;
        }
        write!(
            f,
            "), {} new tokens, {:.1} s in the model",
            self.output_tokens,
            self.time.as_secs_f64()
        )
    }
}

/// How a generation's request constrained it: what tells the calls a
/// grammar shaped from calls a model spelled out in prose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shaping {
    /// No constraint: whatever the model wrote.
    Free,
    /// Prose, or calls the grammar shapes (the model's first token picks).
    TextOrCalls,
    /// Calls only, all of them shaped by the grammar.
    CallsOnly,
    /// A JSON schema or a grammar of the caller's own.
    Other,
}

impl Shaping {
    /// How `request` is constrained.
    pub fn of(request: &GenerateRequest) -> Self {
        match &request.constraint {
            None => Self::Free,
            Some(Constraint::TextOrCalls { .. }) => Self::TextOrCalls,
            Some(Constraint::CallsOnly { .. }) => Self::CallsOnly,
            Some(_) => Self::Other,
        }
    }

    /// Whether the calls of `reply`, a reply to a request so constrained,
    /// are the grammar's: every call of a calls-only reply; under "text or
    /// calls", a reply that opens with a call (its first token took the
    /// call branch, which prose cannot begin as). A call written after
    /// prose, or inside it (a fenced block), was spelled by the model on
    /// the prose branch, which no schema shapes.
    pub fn shaped(self, reply: &str, format: CallFormat) -> bool {
        match self {
            Self::CallsOnly => true,
            Self::TextOrCalls => reply.trim_start().starts_with(format.opening()),
            Self::Free | Self::Other => false,
        }
    }
}

/// A provider that passes everything to `inner` and keeps what each
/// generation reported, to add up its usage.
pub struct UsageMeter<P: ?Sized> {
    log: Mutex<Vec<(Shaping, Generation)>>,
    inner: Arc<P>,
}

impl<P: Provider + ?Sized> UsageMeter<P> {
    /// Wraps a provider.
    pub fn new(inner: Arc<P>) -> Self {
        Self {
            log: Mutex::new(Vec::new()),
            inner,
        }
    }

    /// The totals so far.
    pub fn usage(&self) -> Usage {
        Usage::of(self.log.lock().iter().map(|(_, g)| g))
    }

    /// Takes the generations recorded so far, leaving the log empty.
    pub fn take(&self) -> Vec<Generation> {
        self.take_shaped().into_iter().map(|(_, g)| g).collect()
    }

    /// Takes the generations recorded so far, each with how its request
    /// was constrained, leaving the log empty.
    pub fn take_shaped(&self) -> Vec<(Shaping, Generation)> {
        std::mem::take(&mut *self.log.lock())
    }
}

#[async_trait]
impl<P: Provider + ?Sized> Provider for UsageMeter<P> {
    fn info(&self) -> ProviderInfo {
        self.inner.info()
    }

    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        self.inner.prepare(progress, cancel).await
    }

    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        let shaping = Shaping::of(&request);
        let generation = self.inner.generate(request, cancel).await?;
        self.log.lock().push((shaping, generation.clone()));
        Ok(generation)
    }

    async fn generate_in_session(
        &self,
        session: &str,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        let shaping = Shaping::of(&request);
        let generation = self
            .inner
            .generate_in_session(session, request, cancel)
            .await?;
        self.log.lock().push((shaping, generation.clone()));
        Ok(generation)
    }

    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError> {
        self.inner.fits(request).await
    }

    fn call_format(&self) -> CallFormat {
        self.inner.call_format()
    }

    fn tools_inline(&self) -> bool {
        self.inner.tools_inline()
    }

    fn supports_constraints(&self) -> bool {
        self.inner.supports_constraints()
    }
    fn parameters(&self) -> Option<u64> {
        self.inner.parameters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generation(input: u32, cached: u32) -> Generation {
        Generation {
            input_tokens: Some(input),
            cached_tokens: Some(cached),
            output_tokens: Some(10),
            total_time: Some(Duration::from_millis(500)),
            ..Generation::default()
        }
    }

    #[test]
    fn only_calls_the_grammar_opened_count_as_shaped() {
        use CallFormat::{Hermes, Json};
        let call = "{\"name\": \"f\", \"arguments\": {}}";
        for (shaping, reply, format, shaped) in [
            (
                Shaping::CallsOnly,
                "anything at all".to_string(),
                Json,
                true,
            ),
            (Shaping::TextOrCalls, format!("  {call}"), Json, true),
            (Shaping::TextOrCalls, format!("Sure: {call}"), Json, false),
            (
                Shaping::TextOrCalls,
                format!("<tool_call>\n{call}\n</tool_call>"),
                Hermes,
                true,
            ),
            (
                Shaping::TextOrCalls,
                format!("```xml\n<tool_call>\n{call}\n</tool_call>\n```"),
                Hermes,
                false,
            ),
            (Shaping::Free, call.to_string(), Json, false),
            (Shaping::Other, call.to_string(), Json, false),
        ] {
            assert_eq!(
                shaping.shaped(&reply, format),
                shaped,
                "{shaping:?} {reply:?}"
            );
        }
    }

    #[test]
    fn the_line_says_what_the_cache_served_after_the_first_generation() {
        let usage = Usage::of(&[
            generation(600, 0),
            generation(800, 700),
            generation(900, 800),
        ]);
        assert_eq!(usage.cached_tokens, 1500);
        assert_eq!(
            (usage.later_input_tokens, usage.later_cached_tokens),
            (1700, 1500)
        );
        assert_eq!(
            usage.to_string(),
            "3 generations, 2300 prompt tokens (1500 from cache; 88% after the first generation), 30 new tokens, 1.5 s in the model"
        );
        let one = Usage::of(&[generation(600, 0)]);
        assert_eq!(one.later_cached_share(), None);
        assert_eq!(
            one.to_string(),
            "1 generations, 600 prompt tokens (0 from cache), 10 new tokens, 0.5 s in the model"
        );
    }
}
