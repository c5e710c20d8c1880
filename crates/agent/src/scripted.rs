//! A provider that replays a script: the `scripted` provider of configs,
//! for hosts, examples and tests that run without a model.
//!
//! Built with [`ScriptedProvider::new`] it is a queue: each generation
//! takes the next reply, whatever run asks, until none is left. A config's
//! scripted provider is built [`ScriptedProvider::pass_per_run`] instead,
//! so that a host serving it answers every run, not only its first: a run
//! that starts once the replies were all given starts them over.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::{
    CallFormat, Constraint, GenerateRequest, Generation, Progress, ProgressFn, PromptRole,
    Provider, ProviderError, ProviderInfo, Steered,
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
    /// Where the reply says the decoding's pulls changed the model's
    /// choice (a constrained provider's report, for tests of the loop's).
    pub steered: Steered,
}

impl ScriptedReply {
    /// A reply with this text.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            delay: None,
            fail: None,
            steered: Steered::default(),
        }
    }

    /// A failure with this message.
    pub fn failure(message: impl Into<String>) -> Self {
        Self {
            text: String::new(),
            delay: None,
            fail: Some(message.into()),
            steered: Steered::default(),
        }
    }

    /// The same reply after a delay.
    pub fn delayed(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// The same reply, reported as steered by the decoding's pulls.
    pub fn steered(mut self, steered: Steered) -> Self {
        self.steered = steered;
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
pub(crate) const SCRIPTED_REQUEST_LOG: usize = 1024;

struct Inner {
    /// A queue: the replies not yet given. Pass per run: the whole script.
    replies: VecDeque<ScriptedReply>,
    requests: VecDeque<GenerateRequest>,
    prepared: bool,
    /// Set for a provider that gives each run its own pass over `replies`.
    passes: Option<Passes>,
}

/// The passes of a provider built [`ScriptedProvider::pass_per_run`]: which
/// run is in which pass, and how far each pass got.
#[derive(Default)]
struct Passes {
    /// Each pass's next reply (an index into the script), by pass id.
    next: HashMap<u64, usize>,
    /// The runs seen, by their cache session: the pass each takes its
    /// replies from.
    runs: HashMap<String, u64>,
    /// The runs' sessions, oldest first, so that `runs` stays bounded.
    order: VecDeque<String>,
    /// The pass that gave the latest reply.
    latest: Option<u64>,
    /// The id the next pass gets.
    next_id: u64,
}

/// The session that sessionless requests of a pass-per-run provider (a
/// loop driven without the runtime) belong to; see [`Passes::pass_of`].
const NO_SESSION: &str = "";

impl Passes {
    /// The pass that run `session` takes its next reply from. A new run
    /// goes on with the latest pass while that pass has replies left, and
    /// starts a new one at the first reply once it has none.
    fn pass_of(&mut self, session: &str, request: &GenerateRequest, script: usize) -> u64 {
        // Without a session there is no run to tell by: a prompt that holds
        // no answer yet is a run's first step.
        let new_run = !self.runs.contains_key(session)
            || session == NO_SESSION
                && !request
                    .messages
                    .iter()
                    .any(|m| m.role == PromptRole::Assistant);
        if !new_run {
            return self.runs[session];
        }
        let joined = self
            .latest
            .filter(|pass| self.next.get(pass).is_some_and(|&next| next < script));
        let pass = joined.unwrap_or_else(|| {
            let id = self.next_id;
            self.next_id += 1;
            self.next.insert(id, 0);
            id
        });
        let mut dropped = Vec::new();
        if let Some(old) = self.runs.remove(session) {
            self.order.retain(|s| s != session);
            dropped.push(old);
        }
        if self.order.len() == SCRIPTED_REQUEST_LOG
            && let Some(oldest) = self.order.pop_front()
            && let Some(old) = self.runs.remove(&oldest)
        {
            dropped.push(old);
        }
        self.order.push_back(session.to_string());
        self.runs.insert(session.to_string(), pass);
        // The latest pass changes once this run takes its reply.
        dropped.extend(self.latest.filter(|&latest| latest != pass));
        for old in dropped {
            self.forget_if_unused(old, pass);
        }
        pass
    }

    /// Forgets pass `pass` unless it is `keep` or a run still takes from it.
    fn forget_if_unused(&mut self, pass: u64, keep: u64) {
        if pass != keep && !self.runs.values().any(|&p| p == pass) {
            self.next.remove(&pass);
        }
    }

    /// The next reply of run `session`'s pass, as an index into a script of
    /// `script` replies, or `None` when the pass used them all.
    fn take(&mut self, session: &str, request: &GenerateRequest, script: usize) -> Option<usize> {
        let pass = self.pass_of(session, request, script);
        self.latest = Some(pass);
        let next = self.next.entry(pass).or_insert(0);
        if *next >= script {
            return None;
        }
        *next += 1;
        Some(*next - 1)
    }
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
                passes: None,
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

    /// Starts the replies over for a run that begins once they were all
    /// given, instead of failing it: how a config's scripted provider
    /// answers every run of a host that serves it, not only the first.
    ///
    /// The replies go in order, one per generation, in passes. A new run
    /// goes on with the latest pass while that pass has replies left, and
    /// starts a new pass at the first reply once it has none. So a script
    /// written for one run answers every run, and a script may also hold
    /// several runs' replies one after another (a conversation's turns,
    /// or requests meant to be answered differently), each run going on
    /// where the last stopped. A run keeps to its pass: one that needs
    /// more replies than its pass has left fails with "the script has no
    /// more replies", as a queue's would.
    ///
    /// A run is what the runtime gives its own cache session
    /// ([`Provider::generate_in_session`]): each run of an agent, each run
    /// of a sub-agent included. A sub-agent that shares its parent's
    /// provider goes on with the parent's pass (the script holds the
    /// team's replies in the order they are asked for); one with a
    /// provider of its own starts that provider's replies over on each of
    /// its runs that finds them used up. Without a session (a loop driven
    /// without the runtime), a prompt that holds no answer yet starts a
    /// run. [`Self::remaining`] counts the replies left in the latest pass.
    pub fn pass_per_run(self) -> Self {
        self.inner.lock().passes = Some(Passes::default());
        self
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

    /// Adds replies to the end of the script (of every pass, for a provider
    /// with a [pass per run](Self::pass_per_run)).
    pub fn push<R: Into<ScriptedReply>>(&self, reply: R) {
        self.inner.lock().replies.push_back(reply.into());
    }

    /// The requests received, in order: the latest 1024 of them.
    pub fn requests(&self) -> Vec<GenerateRequest> {
        self.inner.lock().requests.iter().cloned().collect()
    }

    /// Replies not yet used (of the latest pass, for a provider with a
    /// [pass per run](Self::pass_per_run)).
    pub fn remaining(&self) -> usize {
        let inner = self.inner.lock();
        let script = inner.replies.len();
        match &inner.passes {
            None => script,
            Some(passes) => passes
                .latest
                .and_then(|pass| passes.next.get(&pass))
                .map_or(script, |&next| script.saturating_sub(next)),
        }
    }

    /// Whether prepare() ran.
    pub fn prepared(&self) -> bool {
        self.inner.lock().prepared
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

    /// One generation of run `session` (see [`Self::pass_per_run`]).
    async fn answer(
        &self,
        session: &str,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        let input_tokens = Self::prompt_chars(&request) as u32 / 4;
        let text_or_calls = matches!(request.constraint, Some(Constraint::TextOrCalls { .. }));
        let baseline = text_or_calls
            && request.decoding.call_baseline
            && request.decoding.call_threshold.is_some();
        let reply = {
            let mut inner = self.inner.lock();
            if inner.requests.len() == SCRIPTED_REQUEST_LOG {
                inner.requests.pop_front();
            }
            let inner = &mut *inner;
            let reply = match inner.passes.as_mut() {
                None => inner.replies.pop_front(),
                Some(passes) => passes
                    .take(session, &request, inner.replies.len())
                    .map(|i| inner.replies[i].clone()),
            };
            inner.requests.push_back(request);
            reply
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
            steered: reply.steered,
        })
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
        self.inner.lock().prepared = true;
        Ok(())
    }

    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.answer(NO_SESSION, request, cancel).await
    }

    /// The session tells runs apart for a provider with a
    /// [pass per run](ScriptedProvider::pass_per_run); a queue ignores it.
    async fn generate_in_session(
        &self,
        session: &str,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.answer(session, request, cancel).await
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
    use crate::PromptMessage;

    const CALL: &str = r#"{"name": "helper", "arguments": {"task": "Say hello"}}"#;

    /// A run's first prompt: a system prompt and the person's request.
    fn first_step() -> GenerateRequest {
        GenerateRequest {
            messages: vec![
                PromptMessage::new(PromptRole::System, "You help."),
                PromptMessage::new(PromptRole::User, "Hello"),
            ],
            ..GenerateRequest::default()
        }
    }

    /// A later prompt of a run (or a conversation's next turn): it holds an
    /// earlier answer.
    fn later_step() -> GenerateRequest {
        let mut request = first_step();
        request
            .messages
            .push(PromptMessage::new(PromptRole::Assistant, "Hi."));
        request
            .messages
            .push(PromptMessage::new(PromptRole::User, "And now?"));
        request
    }

    /// What the provider answers run `session`'s `request` with.
    async fn answer(
        provider: &ScriptedProvider,
        session: &str,
        request: GenerateRequest,
    ) -> Result<String, String> {
        provider
            .generate_in_session(session, request, CancellationToken::new())
            .await
            .map(|g| g.text)
            .map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn a_queue_gives_each_reply_once_whatever_run_asks() {
        let provider = ScriptedProvider::new(["Hi."]);
        assert_eq!(answer(&provider, "a#0", first_step()).await.unwrap(), "Hi.");
        let second = answer(&provider, "a#1", first_step()).await.unwrap_err();
        assert!(
            second.contains("the script has no more replies"),
            "{second}"
        );
    }

    #[tokio::test]
    async fn a_run_that_finds_the_replies_used_up_starts_them_over() {
        let provider = ScriptedProvider::new([CALL, "Done."]).pass_per_run();
        for run in ["a#0", "a#1", "b#0"] {
            assert_eq!(answer(&provider, run, first_step()).await.unwrap(), CALL);
            assert_eq!(answer(&provider, run, later_step()).await.unwrap(), "Done.");
            assert_eq!(provider.remaining(), 0);
        }
    }

    #[tokio::test]
    async fn runs_go_on_where_the_last_stopped_while_replies_are_left() {
        // One reply per run: two runs answered differently, then again.
        let provider = ScriptedProvider::new(["One.", "Two."]).pass_per_run();
        for (run, reply) in [("a#0", "One."), ("a#1", "Two."), ("a#2", "One.")] {
            assert_eq!(answer(&provider, run, first_step()).await.unwrap(), reply);
        }
        // A conversation's turns, one run each.
        let provider = ScriptedProvider::new(["Hello!", "Added.", "Bye."]).pass_per_run();
        assert_eq!(
            answer(&provider, "a#0", first_step()).await.unwrap(),
            "Hello!"
        );
        assert_eq!(
            answer(&provider, "a#1", later_step()).await.unwrap(),
            "Added."
        );
        assert_eq!(provider.remaining(), 1);
        assert_eq!(
            answer(&provider, "a#2", later_step()).await.unwrap(),
            "Bye."
        );
        assert_eq!(
            answer(&provider, "a#3", first_step()).await.unwrap(),
            "Hello!"
        );
    }

    #[tokio::test]
    async fn a_run_that_runs_out_of_replies_still_fails() {
        let provider = ScriptedProvider::new([CALL]).pass_per_run();
        assert_eq!(answer(&provider, "a#0", first_step()).await.unwrap(), CALL);
        // The next run has a pass of its own; the first keeps to its pass,
        // which has no reply left.
        assert_eq!(answer(&provider, "a#1", first_step()).await.unwrap(), CALL);
        let out = answer(&provider, "a#0", later_step()).await.unwrap_err();
        assert!(out.contains("the script has no more replies"), "{out}");
        let out = answer(&provider, "a#1", later_step()).await.unwrap_err();
        assert!(out.contains("the script has no more replies"), "{out}");
    }

    #[tokio::test]
    async fn a_sub_agent_on_its_parents_provider_goes_on_with_the_parents_pass() {
        let shared = ScriptedProvider::new([CALL, "Hello there.", "It says hello."]).pass_per_run();
        for n in 0..2 {
            let (parent, helper) = (format!("lead#{n}"), format!("helper#{n}"));
            assert_eq!(answer(&shared, &parent, first_step()).await.unwrap(), CALL);
            assert_eq!(
                answer(&shared, &helper, first_step()).await.unwrap(),
                "Hello there."
            );
            assert_eq!(
                answer(&shared, &parent, later_step()).await.unwrap(),
                "It says hello."
            );
        }
        // A sub-agent with a provider of its own starts it over on each of
        // its runs, however many one parent run makes.
        let own = ScriptedProvider::new([CALL, "Hello there."]).pass_per_run();
        for run in ["helper#0", "helper#1"] {
            assert_eq!(answer(&own, run, first_step()).await.unwrap(), CALL);
            assert_eq!(
                answer(&own, run, later_step()).await.unwrap(),
                "Hello there."
            );
        }
    }

    #[tokio::test]
    async fn without_a_session_a_prompt_with_no_answer_yet_starts_a_run() {
        let provider = ScriptedProvider::new([CALL, "Done."]).pass_per_run();
        for _ in 0..2 {
            let first = provider.generate(first_step(), CancellationToken::new());
            assert_eq!(first.await.unwrap().text, CALL);
            let next = provider.generate(later_step(), CancellationToken::new());
            assert_eq!(next.await.unwrap().text, "Done.");
        }
        let out = provider.generate(later_step(), CancellationToken::new());
        let out = out.await.unwrap_err().to_string();
        assert!(out.contains("the script has no more replies"), "{out}");
    }

    #[tokio::test]
    async fn the_runs_kept_stay_bounded() {
        let provider = ScriptedProvider::new(["Hi."]).pass_per_run();
        for i in 0..SCRIPTED_REQUEST_LOG + 10 {
            let run = format!("a#{i}");
            assert_eq!(answer(&provider, &run, first_step()).await.unwrap(), "Hi.");
        }
        let inner = provider.inner.lock();
        let passes = inner.passes.as_ref().unwrap();
        assert_eq!(passes.runs.len(), SCRIPTED_REQUEST_LOG);
        assert_eq!(passes.order.len(), SCRIPTED_REQUEST_LOG);
        assert_eq!(
            passes.next.len(),
            SCRIPTED_REQUEST_LOG,
            "the runs' passes only"
        );
    }

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
