//! [`OrtProvider`]: the [`Provider`] the agent loop talks to.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use tokenizers::Tokenizer;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use wma_agent::{
    CallFormat, GenerateRequest, Generation, Progress, ProgressFn, PromptRole, Provider,
    ProviderError, ProviderInfo,
};

use crate::config::{ModelConfig, ModelFiles, TokenizerConfig};
use crate::constraint::{ConstraintEngine, ConstraintMatcher};
use crate::copy::CopyBias;
use crate::encode::{PromptEncoder, prompt_from};
use crate::error::OrtError;
use crate::hub;
use crate::model::{
    GenerateParams, IdGeneration, OrtModel, StopReason, TextMark, common_bytes, common_prefix,
};
use crate::options::OrtProviderOptions;
use crate::paths::{self, ModelSource};
use crate::template::{ChatTemplate, RenderedPrompt};

/// The `gen_ai.provider.name` of this provider.
pub const PROVIDER_NAME: &str = "onnxruntime";

/// Runs a local model with ONNX Runtime.
///
/// Create it with [`OrtProvider::new`] (cheap: it only resolves paths), then
/// call [`Provider::prepare`] (downloads a hub model when needed, loads the
/// runtime, the session and the tokenizer). Inference runs on a blocking
/// thread; the KV cache is kept between generations so that an agent's next
/// step only computes the tokens its prompt added.
pub struct OrtProvider {
    /// The settings it was made with.
    options: OrtProviderOptions,
    /// Where the model comes from.
    source: ModelSource,
    /// The cache folder (downloads, the runtime library).
    cache: PathBuf,
    /// Everything `prepare` loads; empty until it succeeds.
    loaded: OnceCell<Arc<Loaded>>,
    /// Call format and tools-inline, known before `prepare` when the folder
    /// is local (the loop may ask before loading).
    traits: OnceLock<TemplateTraits>,
    /// The model's size in parameters, read from its `config.json` when the
    /// folder is already there (see [`ModelConfig::parameters`]).
    parameters: Option<u64>,
    /// A seed that replaces the options' one (see [`OrtProvider::reseed`]).
    seed: Mutex<Option<u64>>,
}

#[derive(Debug, Clone, Copy)]
struct TemplateTraits {
    call_format: CallFormat,
    tools_inline: bool,
}

impl TemplateTraits {
    fn of(template: &ChatTemplate) -> Self {
        Self {
            call_format: template.call_format(),
            tools_inline: template.tools_inline(),
        }
    }
}

/// What `prepare` loads.
struct Loaded {
    /// The session and its KV cache; one generation at a time. A panic
    /// inside a generation leaves it usable (the lock does not poison): its
    /// cache is only replaced after a successful run.
    model: Mutex<OrtModel>,
    /// Turns text into ids and back, with control tokens read only from
    /// the template's own text.
    encoder: PromptEncoder,
    /// The model's chat template.
    template: ChatTemplate,
    /// Token ids that end a generation.
    stop_ids: Vec<u32>,
    /// Strings that end a generation (cut from the text).
    stop_strings: Vec<String>,
    /// The folder the model was loaded from.
    dir: PathBuf,
    /// The context window.
    context_length: usize,
    /// Builds decoding constraints; `None` when turned off or when the
    /// vocabulary could not be read for them (constraints are then ignored).
    constraints: Option<ConstraintEngine>,
    /// What constrained generations cost so far.
    constraint_totals: Mutex<ConstraintTotals>,
}

/// What constrained decoding has cost since the model was loaded: the mask
/// per token against the model's own time per token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConstraintTotals {
    /// Generations made under a constraint.
    pub generations: usize,
    /// Time compiling their grammars.
    pub compile_time: Duration,
    /// Tokens chosen under a mask.
    pub tokens: usize,
    /// Time computing masks and advancing grammars.
    pub constraint_time: Duration,
    /// Decode steps (one forward pass each) of those generations.
    pub decode_steps: usize,
    /// Time of those steps, the constraint's share included.
    pub decode_time: Duration,
    /// Tokens those generations produced.
    pub generated_tokens: usize,
    /// Of those, tokens the grammar forced (fed together when
    /// [`OrtProviderOptions::fast_forward`] is on).
    pub forced_tokens: usize,
    /// Tokens prompt lookup drafted in those generations
    /// ([`OrtProviderOptions::prompt_lookup`]).
    pub drafted_tokens: usize,
    /// Of those, tokens the model chose too, which joined the reply
    /// without a forward pass of their own.
    pub accepted_tokens: usize,
}

impl ConstraintTotals {
    /// Mean constraint time per masked token.
    pub fn per_token(&self) -> Duration {
        self.constraint_time
            .checked_div(self.tokens as u32)
            .unwrap_or_default()
    }

    /// Mean time per decode step, without the constraint's share.
    pub fn model_per_token(&self) -> Duration {
        self.decode_time
            .saturating_sub(self.constraint_time)
            .checked_div(self.decode_steps as u32)
            .unwrap_or_default()
    }

    /// The constraint's cost as a share of the model's time per token.
    pub fn overhead(&self) -> f64 {
        let model = self.model_per_token().as_secs_f64();
        if model > 0.0 {
            self.per_token().as_secs_f64() / model
        } else {
            0.0
        }
    }
}

impl std::fmt::Debug for OrtProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtProvider")
            .field("source", &self.source)
            .field("prepared", &self.loaded.initialized())
            .finish_non_exhaustive()
    }
}

impl OrtProvider {
    /// A provider for `options.model`, else `$WMA_MODEL`, else the default
    /// model in the cache. Reads no model file yet (except the chat template
    /// of a local folder, to answer [`Provider::call_format`] early).
    pub fn new(options: OrtProviderOptions) -> Result<Self, OrtError> {
        let cache = match &options.cache_dir {
            Some(dir) => dir.clone(),
            None => paths::cache_dir()?,
        };
        let source = match options
            .model
            .clone()
            .or_else(|| std::env::var("WMA_MODEL").ok().filter(|s| !s.is_empty()))
        {
            Some(name) => ModelSource::parse(&name),
            None => ModelSource::Local(paths::default_model_dir(&cache)),
        };
        let mut provider = Self {
            options,
            source,
            cache,
            loaded: OnceCell::new(),
            traits: OnceLock::new(),
            parameters: None,
            seed: Mutex::new(None),
        };
        let dir = provider.source.folder(&provider.cache);
        provider.parameters = ModelConfig::load(&dir).ok().and_then(|c| c.parameters);
        if let Ok(Some(template)) = read_template(&dir) {
            let _ = provider.traits.set(TemplateTraits::of(&template));
        }
        Ok(provider)
    }

    /// [`OrtProvider::new`] and a blocking [`prepare`](Provider::prepare), for
    /// programs and benchmarks without an async runtime.
    pub fn load(options: OrtProviderOptions) -> Result<Self, OrtError> {
        let provider = Self::new(options)?;
        let noop: ProgressFn = Arc::new(|_| {});
        let loaded = load(
            &provider.options,
            &provider.source,
            &provider.cache,
            &noop,
            &CancellationToken::new(),
        )?;
        let _ = provider.traits.set(TemplateTraits::of(&loaded.template));
        provider
            .loaded
            .set(Arc::new(loaded))
            .map_err(|_| OrtError::NotPrepared)?;
        Ok(provider)
    }

    /// Seeds the sampling of the generations that follow (`None`: the
    /// seed of the options). Lets a benchmark run the same request several
    /// times with different, reproducible draws.
    pub fn reseed(&self, seed: Option<u64>) {
        *self.seed.lock() = seed;
    }

    /// The constraint engine, once prepared (none when constraints are off
    /// or the vocabulary could not be read for them).
    pub fn constraint_engine(&self) -> Result<Option<&ConstraintEngine>, OrtError> {
        Ok(self.loaded()?.constraints.as_ref())
    }

    /// What constrained decoding has cost since the model was loaded.
    pub fn constraint_totals(&self) -> ConstraintTotals {
        self.loaded
            .get()
            .map(|l| *l.constraint_totals.lock())
            .unwrap_or_default()
    }

    /// The settings.
    pub fn options(&self) -> &OrtProviderOptions {
        &self.options
    }

    /// Where the model comes from.
    pub fn source(&self) -> &ModelSource {
        &self.source
    }

    /// The folder the model is (or will be) loaded from.
    pub fn model_dir(&self) -> PathBuf {
        match self.loaded.get() {
            Some(l) => l.dir.clone(),
            None => self.source.folder(&self.cache),
        }
    }

    fn loaded(&self) -> Result<&Arc<Loaded>, OrtError> {
        self.loaded.get().ok_or(OrtError::NotPrepared)
    }

    /// The chat template, once prepared.
    pub fn chat_template(&self) -> Result<&ChatTemplate, OrtError> {
        Ok(&self.loaded()?.template)
    }

    /// Renders a request's prompt with the model's template.
    pub fn render_prompt(&self, request: &GenerateRequest) -> Result<String, OrtError> {
        Ok(self.loaded()?.render(request)?.text)
    }

    /// The token ids the model is given for a request: the rendered prompt,
    /// with control tokens only where the template wrote them (see
    /// [`PromptEncoder`]).
    pub fn encode_prompt(&self, request: &GenerateRequest) -> Result<Vec<u32>, OrtError> {
        let loaded = self.loaded()?;
        loaded.encoder.encode_prompt(&loaded.render(request)?)
    }

    /// Tokenizes text the way a template's own text is tokenized (special
    /// tokens are read from the text, none are added): for hand-written
    /// prompts and benchmarks, never for text from people, tools or pages.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, OrtError> {
        self.loaded()?.encoder.encode_text(text)
    }

    /// The prompt encoder, once prepared.
    pub fn prompt_encoder(&self) -> Result<&PromptEncoder, OrtError> {
        Ok(&self.loaded()?.encoder)
    }

    /// Turns ids back into text (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String, OrtError> {
        self.loaded()?.decode(ids)
    }

    /// The token ids that end a generation.
    pub fn stop_ids(&self) -> Result<Vec<u32>, OrtError> {
        Ok(self.loaded()?.stop_ids.clone())
    }

    /// Runs `f` with the model (and its KV cache), on the calling thread;
    /// waits for a running generation to end first.
    pub fn with_model<R>(&self, f: impl FnOnce(&mut OrtModel) -> R) -> Result<R, OrtError> {
        Ok(f(&mut self.loaded()?.model.lock()))
    }

    /// Token-level generation on the calling thread, with the provider's KV
    /// cache: what benchmarks measure.
    pub fn generate_ids_blocking(
        &self,
        prompt: &[u32],
        params: &GenerateParams,
        cancel: &CancellationToken,
    ) -> Result<IdGeneration, OrtError> {
        self.loaded()?
            .model
            .lock()
            .generate_ids(prompt, params, cancel, |_| false)
    }

    fn params(&self, request: &GenerateRequest, stop_ids: &[u32]) -> GenerateParams {
        let mut sampling = self.options.sampling.clone();
        if let Some(seed) = *self.seed.lock() {
            sampling.seed = Some(seed);
        }
        GenerateParams {
            max_new_tokens: request
                .max_new_tokens
                .unwrap_or(self.options.max_new_tokens) as usize,
            sampling,
            stop_ids: stop_ids.to_vec(),
            greedy_calls: request.decoding.greedy_calls,
            finish_cut_calls: request.decoding.finish_cut_calls.unwrap_or(0) as usize,
        }
    }

    /// Renders and generates on a blocking thread, in `session`'s KV cache
    /// (`None`: the cache of generations that name no session).
    async fn generate_session(
        &self,
        session: Option<String>,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        let loaded = Arc::clone(self.loaded()?);
        let params = self.params(&request, &loaded.stop_ids);
        // When the loop drops this future (a step timeout), the guard stops
        // the blocking work at its next token instead of letting it run on.
        let work_cancel = cancel.child_token();
        let _stop_work = work_cancel.clone().drop_guard();
        let task = tokio::task::spawn_blocking(move || {
            loaded.generate(session.as_deref(), &request, &params, &work_cancel)
        });
        tokio::select! {
            result = task => result.map_err(join_error)?.map_err(ProviderError::from),
            _ = cancel.cancelled() => Err(ProviderError::Cancelled),
        }
    }

    fn reserve(&self, request: &GenerateRequest) -> usize {
        self.options
            .context_reserve
            .or(request.max_new_tokens)
            .unwrap_or(self.options.max_new_tokens) as usize
    }
}

impl Loaded {
    fn render(&self, request: &GenerateRequest) -> Result<RenderedPrompt, OrtError> {
        self.template.render_prompt(
            &request.messages,
            &request.tools,
            true,
            self.encoder.control_texts(),
        )
    }

    fn encode(&self, prompt: &RenderedPrompt) -> Result<Vec<u32>, OrtError> {
        // The template already wrote the special tokens (bos included), as
        // Hugging Face's apply_chat_template(tokenize=True) does; none are
        // added, and none are read from the strings it was given.
        self.encoder.encode_prompt(prompt)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, OrtError> {
        self.encoder.decode(ids)
    }

    /// A matcher for the request's constraint, when there is one and the
    /// model can follow it. A grammar that does not compile is logged and
    /// the generation goes on without it: a constraint helps, it is never
    /// a reason to fail the run.
    fn constraint_matcher(&self, request: &GenerateRequest) -> Option<ConstraintMatcher> {
        let constraint = request.constraint.as_ref()?;
        let engine = self.constraints.as_ref()?;
        let decoding = &request.decoding;
        match engine.matcher(constraint, self.template.call_format(), decoding) {
            Ok(m) => Some(
                m.with_copy_bias(
                    CopyBias::new(&request.copy_phrases, decoding.copy_bias)
                        .map(|c| c.with_shapes(&decoding.copy_shapes)),
                ),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "the constraint could not be compiled; generating without it");
                None
            }
        }
    }

    /// The ids to feed for a prompt: where its text goes on from text the
    /// cache holds (an earlier prompt and the reply the model wrote to it,
    /// as it decoded), the cached ids for that text and the tokenization of
    /// the rest; else its own tokenization (`canonical`).
    ///
    /// Why: the loop writes a reply into the history as text, and the
    /// prompt is tokenized again from text. Under a constraint the model
    /// often writes a tokenization of its reply that the tokenizer would
    /// not choose (the same text in other pieces), so matching the prompt's
    /// own ids against the cache breaks inside the reply and everything
    /// after it is computed again. The ids chosen here always spell the
    /// prompt with its added tokens where `canonical` has them
    /// ([`PromptEncoder::same_text`]); where they would not, the prompt's
    /// own ids are fed.
    fn prompt_for_cache(
        &self,
        model: &OrtModel,
        rendered: &RenderedPrompt,
        canonical: Vec<u32>,
    ) -> Result<Vec<u32>, OrtError> {
        /// The marks tried, latest first, before giving up on the text: a
        /// mark that fails the check usually has an earlier one that holds
        /// (the end of the reply's prompt).
        const TRIES: usize = 3;
        if !model.reuse_prefix() {
            return Ok(canonical);
        }
        let cached = model.cached_ids();
        let (text, marks) = model.cached_text();
        let by_ids = common_prefix(cached, &canonical);
        let shared = common_bytes(text, &rendered.text);
        let candidates = marks
            .iter()
            .rev()
            .filter(|m| m.bytes <= shared)
            .take_while(|m| m.tokens > by_ids)
            .take(TRIES);
        for mark in candidates {
            let mut ids = cached[..mark.tokens].to_vec();
            ids.extend(self.encode(&prompt_from(rendered, mark.bytes))?);
            if self.encoder.same_text(&ids, &canonical)? {
                tracing::debug!(
                    from_text = mark.tokens,
                    from_ids = by_ids,
                    "KV cache: the prompt's text goes on from the cached text"
                );
                return Ok(ids);
            }
        }
        Ok(canonical)
    }

    /// Records in the cache what text its tokens spell after a generation:
    /// the prompt, and the reply after each token the model was fed (see
    /// [`Loaded::prompt_for_cache`]).
    fn mark_generation(
        &self,
        model: &mut OrtModel,
        prompt_text: &str,
        prompt: &[u32],
        ids: &[u32],
    ) -> Result<(), OrtError> {
        let cached = model.cached_ids();
        if !model.reuse_prefix() || !cached.starts_with(prompt) {
            return Ok(());
        }
        // The last token chosen is never fed, and a reply cut back (a
        // repeated call) was fed further than it reaches.
        let fed = common_prefix(&cached[prompt.len()..], ids);
        let reply = self.decode(&ids[..fed])?;
        let mut marks = Vec::with_capacity(fed + 1);
        marks.push(TextMark {
            tokens: prompt.len(),
            bytes: prompt_text.len(),
        });
        for k in 1..=fed {
            let part = if k == fed {
                Cow::Borrowed(reply.as_str())
            } else {
                Cow::Owned(self.decode(&ids[..k])?)
            };
            // A token that ends inside a character decodes to a
            // replacement character, and is no place to cut the text.
            if reply.starts_with(part.as_ref()) {
                marks.push(TextMark {
                    tokens: prompt.len() + k,
                    bytes: prompt_text.len() + part.len(),
                });
            }
        }
        model.mark_text(&format!("{prompt_text}{reply}"), &marks);
        Ok(())
    }

    /// Where the earliest stop string starts in `text`.
    fn stop_at(&self, text: &str) -> Option<usize> {
        self.stop_strings
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min()
    }

    /// The ids of `request`'s prompt with the person's turn emptied, for
    /// the neutral baseline of [`Decoding::call_baseline`](wma_agent::Decoding::call_baseline),
    /// where that turn is the newest: after it, the prompt holds what the
    /// run did, which an empty turn would not explain, and the baseline
    /// would cost all of it computed twice.
    fn baseline_prompt(&self, request: &GenerateRequest) -> Result<Option<Vec<u32>>, OrtError> {
        let Some(at) = request
            .messages
            .iter()
            .rposition(|m| m.role == PromptRole::User)
        else {
            return Ok(None);
        };
        // Only the loop's own notes may follow it, not replies or results.
        if request.messages[at].content.is_empty()
            || request.messages[at + 1..]
                .iter()
                .any(|m| m.role != PromptRole::System)
        {
            return Ok(None);
        }
        let mut neutral = request.clone();
        neutral.messages[at].content.clear();
        let rendered = self.render(&neutral)?;
        Ok(Some(self.encode(&rendered)?))
    }

    /// Renders, tokenizes and generates; runs on a blocking thread.
    fn generate(
        &self,
        session: Option<&str>,
        request: &GenerateRequest,
        params: &GenerateParams,
        cancel: &CancellationToken,
    ) -> Result<Generation, OrtError> {
        let start = Instant::now();
        let rendered = self.render(request)?;
        let canonical = self.encode(&rendered)?;
        // The grammar and the copy phrases are compiled before the model is
        // locked: that work grows with the request, and another agent's
        // generation should not wait for it.
        let mut matcher = self.constraint_matcher(request);
        let baseline = match &matcher {
            Some(m) if request.decoding.call_baseline && m.call_threshold().is_some() => {
                self.baseline_prompt(request)?
            }
            _ => None,
        };
        let mut model = self.model.lock();
        model.use_session(session, &canonical)?;
        let prompt = self.prompt_for_cache(&model, &rendered, canonical)?;
        let mut call_baseline = None;
        if let (Some(ids), Some(m)) = (baseline, matcher.as_mut()) {
            let logits = model.logits_for(&ids)?;
            if let Some(neutral) = m.call_probability_of(logits)? {
                call_baseline = Some(neutral);
                tracing::debug!(
                    baseline = neutral,
                    threshold = m.call_threshold(),
                    "call probability of the prompt without the person's turn"
                );
                m.raise_call_threshold(neutral);
            }
        }
        let terminator = model.reset_terminator()?;
        // A forward pass over a long prompt takes seconds; cancelling must not
        // wait for it to end, so a watcher tells ONNX Runtime to stop.
        let finished = CancellationToken::new();
        let _finish_watcher = finished.clone().drop_guard();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let cancel = cancel.clone();
            handle.spawn(async move {
                // The caller cancels its token when it returns, just after
                // the generation finished: a watcher woken by both must see
                // the finish, or it terminates the next pass on this model.
                tokio::select! {
                    biased;
                    _ = finished.cancelled() => {}
                    _ = cancel.cancelled() => terminator.terminate(),
                }
            });
        }
        let setup = start.elapsed();
        let generated =
            model.generate_ids_constrained(&prompt, params, matcher.as_mut(), cancel, |ids| {
                // Stop strings may span tokens: look at the whole decoded answer.
                self.decode(ids)
                    .is_ok_and(|text| self.stop_at(&text).is_some())
            })?;
        self.mark_generation(&mut model, &rendered.text, &prompt, &generated.ids)?;
        drop(model);
        let IdGeneration { ids, reason, stats } = generated;
        if let Some(m) = &matcher {
            let mut totals = self.constraint_totals.lock();
            totals.generations += 1;
            totals.compile_time += m.compile_time();
            totals.tokens += stats.constrained_tokens;
            totals.constraint_time += stats.constraint_time;
            totals.decode_steps += stats.decode_steps;
            totals.decode_time += stats.decode_time;
            totals.generated_tokens += stats.generated_tokens;
            totals.forced_tokens += stats.forced_tokens;
            totals.drafted_tokens += stats.drafted_tokens;
            totals.accepted_tokens += stats.accepted_tokens;
            tracing::debug!(
                call_probability = m.call_probability(),
                compile_us = m.compile_time().as_micros() as u64,
                masked_tokens = stats.constrained_tokens,
                forced_tokens = stats.forced_tokens,
                forced_runs = stats.forced_runs,
                drafted_tokens = stats.drafted_tokens,
                accepted_tokens = stats.accepted_tokens,
                constraint_us_per_token = stats
                    .constraint_time
                    .checked_div(stats.constrained_tokens.max(1) as u32)
                    .unwrap_or_default()
                    .as_micros() as u64,
                "constrained generation"
            );
        }
        let text_ids = match ids.last() {
            Some(last) if reason == StopReason::Stop && params.stop_ids.contains(last) => {
                &ids[..ids.len() - 1]
            }
            _ => &ids[..],
        };
        let mut text = self.decode(text_ids)?;
        if let Some(at) = self.stop_at(&text) {
            text.truncate(at);
        }
        tracing::debug!(
            input_tokens = prompt.len(),
            cached_tokens = stats.cached_tokens,
            output_tokens = stats.generated_tokens,
            prefill_ms = stats.prefill_time.as_millis() as u64,
            decode_tok_s = stats.decode_tokens_per_second(),
            "generated"
        );
        tracing::trace!(prompt = %rendered.text, reply = %text, "generated text");
        Ok(Generation {
            text,
            input_tokens: Some(prompt.len() as u32),
            output_tokens: Some(stats.generated_tokens as u32),
            cached_tokens: Some(stats.cached_tokens as u32),
            // Rendering, tokenizing and waiting for the model count too: the
            // caller waited for them.
            time_to_first_token: Some(setup + stats.time_to_first_token),
            total_time: Some(start.elapsed()),
            finish_reason: Some(reason.as_str().to_string()),
            call_probability: matcher.as_ref().and_then(|m| m.call_probability()),
            call_baseline,
            steered: matcher.as_ref().map(|m| m.steered()).unwrap_or_default(),
        })
    }
}

/// Reads a local folder's chat template, if it has one.
fn read_template(dir: &Path) -> Result<Option<ChatTemplate>, OrtError> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let config = TokenizerConfig::load(dir)?;
    match config.chat_template {
        Some(source) => ChatTemplate::new(source, config.bos_token, config.eos_token).map(Some),
        None => Ok(None),
    }
}

/// Everything `prepare` does, on a blocking thread.
fn load(
    options: &OrtProviderOptions,
    source: &ModelSource,
    cache: &Path,
    progress: &ProgressFn,
    cancel: &CancellationToken,
) -> Result<Loaded, OrtError> {
    const STEPS: u64 = 4;
    let step = |done: u64, stage: &str| {
        progress(Progress {
            stage: stage.to_string(),
            done,
            total: Some(STEPS),
        })
    };
    let dir = match source {
        ModelSource::Local(_) => source.folder(cache),
        ModelSource::Hub { repo, revision } => hub::download(
            repo,
            revision.as_deref(),
            options.variant.as_deref(),
            cache,
            options.hub_endpoint.as_deref(),
            progress,
            cancel,
        )?,
    };
    let files = ModelFiles::locate(&dir, options.variant.as_deref()).map_err(|e| match e {
        // A mistyped name: say which names would do.
        OrtError::ModelMissing { what, path } if !dir.exists() => {
            let installed = crate::paths::installed_models(cache);
            let what = if installed.is_empty() {
                what
            } else {
                format!("{what} (installed models: {})", installed.join(", "))
            };
            OrtError::ModelMissing { what, path }
        }
        other => other,
    })?;
    step(0, "load tokenizer");
    let tokenizer = Tokenizer::from_file(&files.tokenizer)
        .map_err(|e| OrtError::invalid("tokenizer.json", e))?;
    if cancel.is_cancelled() {
        return Err(OrtError::Cancelled);
    }
    step(1, "load chat template");
    let config = ModelConfig::load(&dir)?;
    let template = match read_template(&dir)? {
        Some(t) => t,
        None => {
            tracing::warn!(dir = %dir.display(), "the model has no chat template; using ChatML");
            ChatTemplate::chatml()
        }
    };
    let tok_config = TokenizerConfig::load(&dir)?;
    let mut stop_ids = config.eos_token_ids.clone();
    if let Some(id) = tok_config
        .eos_token
        .as_deref()
        .and_then(|t| tokenizer.token_to_id(t))
        && !stop_ids.contains(&id)
    {
        stop_ids.push(id);
    }
    let stop_strings = if options.stop.is_empty() {
        let mut texts: Vec<String> = stop_ids
            .iter()
            .filter_map(|&id| tokenizer.id_to_token(id))
            .collect();
        texts.extend(tok_config.eos_token.clone());
        texts.sort();
        texts.dedup();
        texts
    } else {
        options.stop.clone()
    };
    if cancel.is_cancelled() {
        return Err(OrtError::Cancelled);
    }
    let constraints = if options.constraints {
        constraint_engine(&files, &tokenizer, &stop_ids, config.vocab_size)
    } else {
        None
    };
    step(2, "load onnxruntime session");
    let model = OrtModel::load(&files, config, options)?;
    step(STEPS, "ready");
    let context_length = model.context_length();
    Ok(Loaded {
        model: Mutex::new(model),
        encoder: PromptEncoder::new(tokenizer),
        template,
        stop_ids,
        stop_strings,
        dir,
        context_length,
        constraints,
        constraint_totals: Mutex::new(ConstraintTotals::default()),
    })
}

/// The constraint engine for a model's vocabulary, or `None` (logged) when
/// its tokenizer cannot be read for it: the provider then ignores constraints.
fn constraint_engine(
    files: &ModelFiles,
    tokenizer: &Tokenizer,
    stop_ids: &[u32],
    vocab_size: Option<usize>,
) -> Option<ConstraintEngine> {
    let built = std::fs::read_to_string(&files.tokenizer)
        .map_err(|e| OrtError::io(&files.tokenizer, e))
        .and_then(|json| ConstraintEngine::new(&json, tokenizer.clone(), stop_ids, vocab_size));
    match built {
        Ok(engine) => Some(engine),
        Err(e) => {
            tracing::warn!(error = %e, "constrained decoding is unavailable for this model");
            None
        }
    }
}

fn join_error(e: tokio::task::JoinError) -> ProviderError {
    ProviderError::Generation(format!("the model thread failed: {e}"))
}

#[async_trait]
impl Provider for OrtProvider {
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            provider: PROVIDER_NAME.to_string(),
            model: self.source.display_name(),
            context_length: self.loaded.get().map(|l| l.context_length as u32),
        }
    }

    async fn prepare(
        &self,
        progress: ProgressFn,
        cancel: CancellationToken,
    ) -> Result<(), ProviderError> {
        let loaded = self
            .loaded
            .get_or_try_init(|| async {
                let options = self.options.clone();
                let source = self.source.clone();
                let cache = self.cache.clone();
                let work_cancel = cancel.child_token();
                // Dropping prepare (or cancelling) stops the download between chunks.
                let _stop_work = work_cancel.clone().drop_guard();
                let task = tokio::task::spawn_blocking(move || {
                    load(&options, &source, &cache, &progress, &work_cancel)
                });
                tokio::select! {
                    result = task => result.map_err(join_error)?.map(Arc::new).map_err(ProviderError::from),
                    _ = cancel.cancelled() => Err(ProviderError::Cancelled),
                }
            })
            .await?;
        let _ = self.traits.set(TemplateTraits::of(&loaded.template));
        Ok(())
    }

    async fn generate(
        &self,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.generate_session(None, request, cancel).await
    }

    /// Generates in `session`'s KV cache (see
    /// [`OrtProviderOptions::kv_sessions`]).
    async fn generate_in_session(
        &self,
        session: &str,
        request: GenerateRequest,
        cancel: CancellationToken,
    ) -> Result<Generation, ProviderError> {
        self.generate_session(Some(session.to_string()), request, cancel)
            .await
    }

    async fn fits(&self, request: &GenerateRequest) -> Result<bool, ProviderError> {
        let loaded = Arc::clone(self.loaded()?);
        let reserve = self.reserve(request);
        let request = request.clone();
        let tokens = tokio::task::spawn_blocking(move || {
            loaded
                .render(&request)
                .and_then(|p| loaded.encode(&p))
                .map(|ids| ids.len())
        })
        .await
        .map_err(join_error)??;
        let limit = self.loaded()?.context_length;
        Ok(tokens + reserve <= limit)
    }

    fn call_format(&self) -> CallFormat {
        self.traits.get().map(|t| t.call_format).unwrap_or_default()
    }

    fn tools_inline(&self) -> bool {
        self.traits.get().map(|t| t.tools_inline).unwrap_or(true)
    }

    fn parameters(&self) -> Option<u64> {
        self.parameters
    }

    fn supports_constraints(&self) -> bool {
        match self.loaded.get() {
            Some(loaded) => loaded.constraints.is_some(),
            // Before loading, what the options ask for.
            None => self.options.constraints,
        }
    }
}
