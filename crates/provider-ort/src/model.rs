//! The decoder: one ONNX Runtime session, its KV cache, and token-level
//! generation with prefix reuse.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use half::f16;
use ort::memory::{Allocator, MemoryInfo};
use ort::session::{IoBinding, RunOptions, Session, SessionInputValue};
use ort::value::{DynValue, PrimitiveTensorElementType, Tensor};
use tokio_util::sync::CancellationToken;

use crate::config::{ModelConfig, ModelFiles};
use crate::constraint::ConstraintMatcher;
use crate::error::OrtError;
use crate::options::OrtProviderOptions;
use crate::paths;
use crate::runtime::{self, FloatType, GraphIo};
use crate::sampling::{Sampler, SamplingOptions};

/// Why a token-level generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// A stop token was generated, or the caller's check said stop.
    Stop,
    /// The token limit (or the end of the context window) was reached.
    Length,
}

impl StopReason {
    /// The name used in `Generation::finish_reason` and traces.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// Settings of one token-level generation.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateParams {
    /// Upper bound on new tokens.
    pub max_new_tokens: usize,
    /// How tokens are chosen.
    pub sampling: SamplingOptions,
    /// Tokens that end the generation (usually the model's eos ids).
    pub stop_ids: Vec<u32>,
    /// Under a constraint, choose a tool call's tokens greedily once the
    /// call has begun, even when sampling: whether to call stays sampled,
    /// the name and arguments do not (the request's
    /// `Decoding::greedy_calls`). Sampled at 0.7, the default model searched
    /// for `"<query>"` or `"C5.1.1.0.100"` where greedy decoding writes the
    /// person's words.
    pub greedy_calls: bool,
    /// Under a constraint, when the token limit falls inside the reply's
    /// first call (later ones are cut back to the calls before them), up to
    /// this many more tokens finish it greedily along a short way the
    /// grammar allows ([`ConstraintMatcher::close_out`]); 0 cuts the reply
    /// back as without it (the request's `Decoding::finish_cut_calls`).
    pub finish_cut_calls: usize,
}

impl GenerateParams {
    /// Greedy decoding of at most `max_new_tokens`, stopping at `stop_ids`.
    pub fn greedy(max_new_tokens: usize, stop_ids: impl Into<Vec<u32>>) -> Self {
        Self {
            max_new_tokens,
            sampling: SamplingOptions::greedy(),
            stop_ids: stop_ids.into(),
            greedy_calls: false,
            finish_cut_calls: 0,
        }
    }
}

/// Timings and counts of one generation, for traces and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GenerationStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV came from the cache instead of being computed.
    pub cached_tokens: usize,
    /// Prompt tokens computed in the prefill (`prompt_tokens - cached_tokens`).
    pub prefill_tokens: usize,
    /// Time of the prefill run (including trimming the cache).
    pub prefill_time: Duration,
    /// Forward passes after the prefill. Without forced tokens or drafts
    /// each feeds one token, so there is one fewer than the tokens
    /// generated (the first comes from the prefill, the last is never fed
    /// back); a pass that feeds forced tokens or a draft counts once.
    pub decode_steps: usize,
    /// Time of the decode runs and the sampling between them.
    pub decode_time: Duration,
    /// Time until the first new token was chosen.
    pub time_to_first_token: Duration,
    /// Time of the whole generation.
    pub total_time: Duration,
    /// Time spent on the decoding constraint: computing each token's mask
    /// and advancing the grammar (part of `decode_time`, and of the prefill's
    /// first token).
    pub constraint_time: Duration,
    /// Tokens chosen under a constraint mask.
    pub constrained_tokens: usize,
    /// Tokens generated, including any a constrained reply was cut back by.
    pub generated_tokens: usize,
    /// Generated tokens the grammar forced (the only continuation it
    /// allowed), taken without a choice; part of `generated_tokens`.
    pub forced_tokens: usize,
    /// Forward passes that fed forced tokens together instead of one
    /// decode step each (counted in `decode_steps` too).
    pub forced_runs: usize,
    /// Forward passes that fed a draft from prompt lookup after the last
    /// token (counted in `decode_steps` too; see
    /// [`OrtProviderOptions::prompt_lookup`]).
    pub draft_runs: usize,
    /// Tokens those drafts proposed.
    pub drafted_tokens: usize,
    /// Drafted tokens that were the model's own choice and joined the reply
    /// without a pass of their own; part of `generated_tokens`.
    pub accepted_tokens: usize,
}

impl GenerationStats {
    /// Prompt tokens computed per second in the prefill.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        per_second(self.prefill_tokens, self.prefill_time)
    }

    /// Tokens per second of the decode loop.
    pub fn decode_tokens_per_second(&self) -> f64 {
        per_second(self.decode_steps, self.decode_time)
    }

    /// New tokens per second of the reply after the prefill: what a person
    /// waiting for it sees (forced tokens fed together count each).
    pub fn reply_tokens_per_second(&self) -> f64 {
        per_second(
            self.generated_tokens.saturating_sub(1),
            self.total_time.saturating_sub(self.time_to_first_token),
        )
    }
}

fn per_second(n: usize, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

/// The result of [`OrtModel::generate_ids`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdGeneration {
    /// The new tokens, including the stop token when one ended the generation.
    pub ids: Vec<u32>,
    /// Why it ended.
    pub reason: StopReason,
    /// Counts and timings.
    pub stats: GenerationStats,
}

/// The KV cache: the tokens whose keys and values the model holds.
///
/// Invariant: the store holds keys and values for exactly `ids`. A token is
/// in `ids` only once it has been fed to the model: the last token of a
/// generation never is (it was chosen, not computed), so it is not here.
struct KvCache {
    /// Tokens fed so far, in order.
    ids: Vec<u32>,
    /// Where the keys and values are.
    store: KvStore,
    /// What the cached tokens spell, as far as it is known (see
    /// [`TextMark`]); empty for caches fed ids alone.
    text: CachedText,
}

/// A point where the cached tokens and a text line up: the first `tokens`
/// cached ids are a tokenization of the first `bytes` bytes of the cache's
/// text. The provider records one at the end of each prompt and after each
/// token the model generated, so that the next prompt, whose text repeats
/// them, can take the cached ids for that text instead of tokenizing it
/// again (the model's own tokenization of its reply is often not the one
/// the tokenizer would choose, and a prefix match on ids breaks there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TextMark {
    /// Cached tokens up to the mark.
    pub tokens: usize,
    /// Bytes of the cache's text up to the mark.
    pub bytes: usize,
}

/// The text of a cache and where its tokens line up with it.
///
/// Invariant: marks ascend in both fields, each `tokens` is at most the
/// cache's length, and `text` ends at the last mark.
#[derive(Debug, Clone, Default)]
struct CachedText {
    text: String,
    marks: Vec<TextMark>,
}

impl CachedText {
    /// Keeps the marks within the first `tokens` cached ids.
    fn truncate(&mut self, tokens: usize) {
        self.marks.retain(|m| m.tokens <= tokens);
        self.text.truncate(self.marks.last().map_or(0, |m| m.bytes));
    }

    fn clear(&mut self) {
        self.text.clear();
        self.marks.clear();
    }
}

/// How the keys and values are kept between runs.
enum KvStore {
    /// Each run's `present` outputs (past and new positions, freshly
    /// allocated by the graph) become the next run's `past` inputs. Works
    /// with every graph. `[2 * layer]` keys, `[2 * layer + 1]` values.
    Copy(Vec<DynValue>),
    /// `past` inputs and `present` outputs are bound to the same
    /// preallocated buffers, which GroupQueryAttention graphs update in
    /// place: no per-token copy of the whole cache, and cutting the cache
    /// back is free (positions past the mask's length are ignored).
    Shared(Box<SharedKv>),
}

/// Preallocated cache buffers bound as both inputs and outputs.
struct SharedKv {
    /// The binding of the cache buffers and the logits output; the token
    /// inputs are bound anew before each run.
    binding: IoBinding,
    /// Where the logits are written (CPU memory).
    cpu: MemoryInfo<'static>,
    /// `[1, kv_heads, capacity, head_dim]` each, keys and values per layer.
    buffers: Vec<DynValue>,
    /// Positions each buffer has room for.
    capacity: usize,
}

/// First capacity of shared buffers; doubled as prompts grow.
const SHARED_INITIAL_CAPACITY: usize = 256;

/// The session of generations that name none.
const DEFAULT_SESSION: &str = "";

/// A KV cache that is not the one in use, kept for the session it belongs to.
struct Parked {
    /// The session's key.
    key: String,
    /// Its cache.
    cache: KvCache,
    /// When it was last used (the model's clock), for least-recently-used
    /// eviction.
    used: u64,
}

/// How many KV sessions a model keeps, and how much memory they may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionLimits {
    /// The most sessions kept, the one in use included (at least 1).
    pub max_sessions: usize,
    /// The most bytes their keys and values may take (allocated buffers
    /// counted whole); the session in use is never evicted.
    pub max_bytes: u64,
}

/// A decoder-only language model in ONNX Runtime, with the KV cache it keeps
/// between calls.
///
/// This is the level below [`OrtProvider`](crate::OrtProvider): token ids in,
/// token ids and timings out. It is what benchmarks use.
pub struct OrtModel {
    /// The ONNX Runtime session.
    session: Session,
    /// Names and types of the graph's inputs and outputs.
    io: GraphIo,
    /// What config.json says.
    config: ModelConfig,
    /// The cached keys and values of the session in use, and the tokens
    /// they belong to.
    cache: KvCache,
    /// The key of the session in use.
    session_key: String,
    /// When the session in use was chosen (the model's clock).
    session_used: u64,
    /// The other sessions' caches.
    parked: Vec<Parked>,
    /// Counts session choices, for least-recently-used eviction.
    clock: u64,
    /// How many sessions are kept, and in how many bytes.
    limits: SessionLimits,
    /// Whether caches live in shared buffers (decided by the load probe).
    shared: bool,
    /// Feed the tokens a grammar forces in one forward pass.
    fast_forward: bool,
    /// Draft the next tokens from the prompt and verify them in one pass
    /// (cleared for good when the graph turns out to give only the last
    /// position's logits).
    prompt_lookup: bool,
    /// Whether the next prompt may reuse the cache's common prefix.
    reuse_prefix: bool,
    /// The context window in tokens.
    context_length: usize,
    /// Lets another thread stop a running forward pass (see [`OrtModel::terminator`]).
    run_options: Arc<RunOptions>,
}

impl std::fmt::Debug for OrtModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrtModel")
            .field("io", &self.io)
            .field("cached_tokens", &self.cache.ids.len())
            .field("session", &self.session_key)
            .field("parked_sessions", &self.parked.len())
            .field("reuse_prefix", &self.reuse_prefix)
            .field("context_length", &self.context_length)
            .finish_non_exhaustive()
    }
}

/// Stops the forward pass running on an [`OrtModel`] from another thread;
/// the pass then fails with [`OrtError::Cancelled`].
#[derive(Clone)]
pub struct Terminator(Arc<RunOptions>);

impl Terminator {
    /// Asks ONNX Runtime to stop the running pass (and every later one of the
    /// same generation) as soon as it can.
    pub fn terminate(&self) {
        if let Err(e) = self.0.terminate() {
            tracing::warn!(error = %e, "could not terminate the ONNX Runtime run");
        }
    }
}

impl std::fmt::Debug for Terminator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Terminator")
    }
}

impl OrtModel {
    /// Loads the graph in `files` with `options`' library, threads and
    /// execution provider.
    pub fn load(
        files: &ModelFiles,
        config: ModelConfig,
        options: &OrtProviderOptions,
    ) -> Result<Self, OrtError> {
        let cache = match &options.cache_dir {
            Some(dir) => dir.clone(),
            None => paths::cache_dir()?,
        };
        let dylib = options
            .dylib_path
            .clone()
            .unwrap_or_else(|| paths::dylib_path(&cache));
        let env = runtime::environment(&dylib)?;
        let session = runtime::create_session(&env, &files.graph, options)?;
        let io = GraphIo::discover(&session, &config)?;
        let context_length = options
            .context_length
            .map(|n| n as usize)
            .unwrap_or(config.max_position_embeddings)
            .min(config.max_position_embeddings);
        tracing::debug!(
            graph = %files.graph.display(),
            layers = io.layers.len(),
            kv_type = ?io.kv_type,
            position_ids = io.position_ids.is_some(),
            "loaded model"
        );
        let mut model = Self {
            session,
            io,
            config,
            cache: KvCache {
                ids: Vec::new(),
                store: KvStore::Copy(Vec::new()),
                text: CachedText::default(),
            },
            session_key: DEFAULT_SESSION.to_string(),
            session_used: 0,
            parked: Vec::new(),
            clock: 0,
            limits: SessionLimits {
                max_sessions: options.kv_sessions.max(1),
                max_bytes: options.kv_cache_bytes,
            },
            shared: false,
            fast_forward: options.fast_forward,
            prompt_lookup: options.prompt_lookup,
            reuse_prefix: options.reuse_prefix,
            context_length,
            run_options: Arc::new(RunOptions::new().map_err(OrtError::runtime)?),
        };
        if options.shared_kv_buffer {
            model.try_shared_buffers();
        }
        Ok(model)
    }

    /// Switches to shared cache buffers when the graph computes the same
    /// logits with them as with copied ones (GroupQueryAttention graphs do;
    /// graphs that concatenate past and new keys cannot, and fail the probe).
    fn try_shared_buffers(&mut self) {
        let probe: Vec<u32> = (0..4).collect();
        let copied = (|| -> Result<(Vec<f32>, Vec<f32>), OrtError> {
            Ok((self.forward(&probe[..3])?, self.forward(&probe[3..])?))
        })();
        let Ok((copy_prefill, copy_step)) = copied else {
            // The copy path itself failed; leave it to report on real use.
            self.clear_cache();
            return;
        };
        // A graph that cannot share fails the probe with an error ONNX
        // Runtime would log; that failure is expected, so it stays quiet.
        let normal = Arc::clone(&self.run_options);
        if let Ok(mut quiet) = RunOptions::new() {
            let _ = quiet.set_log_level(ort::logging::LogLevel::Fatal);
            self.run_options = Arc::new(quiet);
        }
        let shared = (|| -> Result<(Vec<f32>, Vec<f32>), OrtError> {
            self.cache = KvCache {
                ids: Vec::new(),
                store: KvStore::Shared(Box::new(SharedKv::new(
                    &self.session,
                    &self.io,
                    SHARED_INITIAL_CAPACITY.min(self.context_length),
                )?)),
                text: CachedText::default(),
            };
            Ok((self.forward(&probe[..3])?, self.forward(&probe[3..])?))
        })();
        self.run_options = normal;
        let agrees = |a: &[f32], b: &[f32]| {
            let scale = a.iter().fold(1.0f32, |m, x| m.max(x.abs()));
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-3 * scale)
        };
        match shared {
            Ok((prefill, step)) if agrees(&copy_prefill, &prefill) && agrees(&copy_step, &step) => {
                tracing::debug!("KV cache: shared buffers updated in place");
                self.shared = true;
                self.clear_cache();
            }
            other => {
                if let Err(e) = other {
                    tracing::debug!(reason = %e, "KV cache: graph cannot share buffers; copying");
                } else {
                    tracing::debug!("KV cache: shared buffers disagree with copies; copying");
                }
                self.cache = KvCache {
                    ids: Vec::new(),
                    store: KvStore::Copy(Vec::new()),
                    text: CachedText::default(),
                };
            }
        }
    }

    /// Whether the cache lives in shared buffers updated in place (true) or
    /// is copied from each run's outputs (false).
    pub fn shares_kv_buffers(&self) -> bool {
        matches!(self.cache.store, KvStore::Shared(_))
    }

    /// Loads the model folder `dir` (graph chosen by `options.variant`).
    pub fn open(dir: &Path, options: &OrtProviderOptions) -> Result<Self, OrtError> {
        let files = ModelFiles::locate(dir, options.variant.as_deref())?;
        let config = ModelConfig::load(dir)?;
        Self::load(&files, config, options)
    }

    /// What config.json says.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The graph's inputs and outputs.
    pub fn graph_io(&self) -> &GraphIo {
        &self.io
    }

    /// The context window in tokens.
    pub fn context_length(&self) -> usize {
        self.context_length
    }

    /// The tokens whose keys and values are cached.
    pub fn cached_ids(&self) -> &[u32] {
        &self.cache.ids
    }

    /// Whether the next prompt may reuse the cache's common prefix.
    pub fn reuse_prefix(&self) -> bool {
        self.reuse_prefix
    }

    /// The text the cached tokens spell, as far as the provider recorded it,
    /// and the points where tokens and text line up (ascending).
    pub(crate) fn cached_text(&self) -> (&str, &[TextMark]) {
        (&self.cache.text.text, &self.cache.text.marks)
    }

    /// Records that the cached ids line up with `text` at each of `marks`
    /// (see [`TextMark`]); the caller vouches that they spell it. Marks
    /// recorded before stay where `text` repeats the text they were
    /// recorded with, and go where it does not. Marks past the cache or
    /// past `text`, or out of order, are not recorded.
    pub(crate) fn mark_text(&mut self, text: &str, marks: &[TextMark]) {
        let cached = self.cache.ids.len();
        let valid = marks
            .windows(2)
            .all(|w| w[0].tokens <= w[1].tokens && w[0].bytes <= w[1].bytes)
            && marks.iter().all(|m| {
                m.tokens <= cached && m.bytes <= text.len() && text.is_char_boundary(m.bytes)
            });
        let Some(first) = marks.first().filter(|_| valid) else {
            return;
        };
        let old = &mut self.cache.text;
        let shared = common_bytes(&old.text, text);
        old.marks
            .retain(|m| m.bytes <= shared && m.tokens <= first.tokens && m.bytes <= first.bytes);
        for &mark in marks {
            if old.marks.last() != Some(&mark) {
                old.marks.push(mark);
            }
        }
        let end = old.marks.last().map_or(0, |m| m.bytes);
        old.text.clear();
        old.text.push_str(&text[..end]);
    }

    /// Forgets the cache.
    pub fn clear_cache(&mut self) {
        self.cache.ids.clear();
        self.cache.text.clear();
        if let KvStore::Copy(values) = &mut self.cache.store {
            values.clear();
        }
    }

    /// Turns prefix reuse on or off (off clears the cache before each prompt).
    pub fn set_reuse_prefix(&mut self, reuse: bool) {
        self.reuse_prefix = reuse;
        if !reuse {
            self.clear_cache();
        }
    }

    /// Feeds (true) or decodes one by one (false) the tokens a grammar
    /// forces; see [`OrtProviderOptions::fast_forward`].
    pub fn set_fast_forward(&mut self, on: bool) {
        self.fast_forward = on;
    }

    /// Whether forced tokens are fed in one forward pass.
    pub fn fast_forward(&self) -> bool {
        self.fast_forward
    }

    /// Drafts tokens from the prompt and verifies them in one pass (true)
    /// or decodes one token per pass (false); see
    /// [`OrtProviderOptions::prompt_lookup`].
    pub fn set_prompt_lookup(&mut self, on: bool) {
        self.prompt_lookup = on;
    }

    /// Whether tokens are drafted from the prompt.
    pub fn prompt_lookup(&self) -> bool {
        self.prompt_lookup
    }

    /// The key of the KV session in use (`""` for generations that name none).
    pub fn session_key(&self) -> &str {
        &self.session_key
    }

    /// Every KV session kept, the one in use first, each with the tokens it
    /// holds, then least recently used last.
    pub fn sessions(&self) -> Vec<(String, usize)> {
        let mut parked: Vec<&Parked> = self.parked.iter().collect();
        parked.sort_by_key(|p| std::cmp::Reverse(p.used));
        std::iter::once((self.session_key.clone(), self.cache.ids.len()))
            .chain(
                parked
                    .into_iter()
                    .map(|p| (p.key.clone(), p.cache.ids.len())),
            )
            .collect()
    }

    /// Bytes the keys and values of every session take (allocated buffers
    /// counted whole).
    pub fn kv_bytes(&self) -> u64 {
        self.cache_bytes(&self.cache)
            + self
                .parked
                .iter()
                .map(|p| self.cache_bytes(&p.cache))
                .sum::<u64>()
    }

    /// Drops every session but the one in use, and empties that one.
    pub fn clear_sessions(&mut self) {
        self.parked.clear();
        self.clear_cache();
    }

    /// Makes `key`'s KV session the one in use (`None`: the session of
    /// generations that name none), keeping the one in use for later.
    ///
    /// A session seen for the first time starts from a copy of the longest
    /// prefix of `prompt` any kept session holds: an agent's next run finds
    /// its system prompt computed by its last one, and a sub-agent's run
    /// takes what it shares with its parent without touching the parent's
    /// cache. Copying keys and values costs far less than computing them.
    /// Then sessions are evicted, least recently used first, down to the
    /// limits ([`OrtProviderOptions::kv_sessions`],
    /// [`OrtProviderOptions::kv_cache_bytes`]).
    pub fn use_session(&mut self, key: Option<&str>, prompt: &[u32]) -> Result<(), OrtError> {
        let key = key.unwrap_or(DEFAULT_SESSION);
        self.clock += 1;
        if key != self.session_key {
            let next = match self.parked.iter().position(|p| p.key == key) {
                Some(i) => self.parked.swap_remove(i).cache,
                None => self.seeded_cache(prompt)?,
            };
            let old = std::mem::replace(&mut self.cache, next);
            let old_key = std::mem::replace(&mut self.session_key, key.to_string());
            self.parked.push(Parked {
                key: old_key,
                cache: old,
                used: self.session_used,
            });
        }
        self.session_used = self.clock;
        self.evict();
        Ok(())
    }

    /// A cache for a new session: a copy of the longest prefix of `prompt`
    /// that a kept session holds, or an empty one.
    fn seeded_cache(&self, prompt: &[u32]) -> Result<KvCache, OrtError> {
        let limit = prompt.len().saturating_sub(1);
        let best = std::iter::once(&self.cache)
            .chain(self.parked.iter().map(|p| &p.cache))
            .map(|c| (common_prefix(&c.ids, prompt).min(limit), c))
            .max_by_key(|(n, _)| *n);
        match best {
            Some((keep, source)) if keep > 0 && self.reuse_prefix => {
                tracing::debug!(tokens = keep, "KV cache: new session from a kept prefix");
                self.copy_prefix(source, keep)
            }
            _ => self.empty_cache(),
        }
    }

    /// An empty cache of the kind this graph uses.
    fn empty_cache(&self) -> Result<KvCache, OrtError> {
        let store = if self.shared {
            KvStore::Shared(Box::new(SharedKv::new(
                &self.session,
                &self.io,
                SHARED_INITIAL_CAPACITY.min(self.context_length),
            )?))
        } else {
            KvStore::Copy(Vec::new())
        };
        Ok(KvCache {
            ids: Vec::new(),
            store,
            text: CachedText::default(),
        })
    }

    /// A new cache holding the first `keep` positions of `source`.
    fn copy_prefix(&self, source: &KvCache, keep: usize) -> Result<KvCache, OrtError> {
        let keep = keep.min(source.ids.len());
        let store = match &source.store {
            KvStore::Copy(values) => KvStore::Copy(
                values
                    .iter()
                    .map(|v| match self.io.kv_type {
                        FloatType::F32 => slice_sequence::<f32>(v, keep),
                        FloatType::F16 => slice_sequence::<f16>(v, keep),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            KvStore::Shared(kv) => {
                // Room for this step's new tokens before the first doubling.
                let capacity = (keep + keep / 2)
                    .max(SHARED_INITIAL_CAPACITY)
                    .min(self.context_length);
                let mut copy = SharedKv::empty(&self.session)?;
                copy.fill(&self.io, capacity, &kv.buffers, keep)?;
                KvStore::Shared(Box::new(copy))
            }
        };
        let mut text = source.text.clone();
        text.truncate(keep);
        Ok(KvCache {
            ids: source.ids[..keep].to_vec(),
            store,
            text,
        })
    }

    /// Bytes one cache's keys and values take.
    fn cache_bytes(&self, cache: &KvCache) -> u64 {
        let width = match self.io.kv_type {
            FloatType::F32 => 4,
            FloatType::F16 => 2,
        };
        let per_position =
            (2 * self.io.layers.len() * self.io.kv_heads * self.io.head_dim * width) as u64;
        let positions = match &cache.store {
            KvStore::Copy(values) if values.is_empty() => 0,
            KvStore::Copy(_) => cache.ids.len(),
            KvStore::Shared(kv) => kv.capacity,
        };
        per_position * positions as u64
    }

    /// Drops the least recently used kept sessions until the count and the
    /// bytes are within the limits (the session in use always stays).
    fn evict(&mut self) {
        loop {
            let count = 1 + self.parked.len();
            let bytes = self.kv_bytes();
            if (count <= self.limits.max_sessions && bytes <= self.limits.max_bytes)
                || self.parked.is_empty()
            {
                return;
            }
            let Some(oldest) = self
                .parked
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.used)
                .map(|(i, _)| i)
            else {
                return;
            };
            let gone = self.parked.swap_remove(oldest);
            tracing::debug!(
                session = %gone.key,
                tokens = gone.cache.ids.len(),
                sessions = count,
                bytes,
                "KV cache: evicted the least recently used session"
            );
        }
    }

    /// A handle that stops the running forward pass from another thread.
    /// Each [`generate_ids`](Self::generate_ids) starts with a fresh one, so
    /// take it right before the generation it should stop.
    pub fn terminator(&self) -> Terminator {
        Terminator(Arc::clone(&self.run_options))
    }

    /// Prepares a fresh terminator for the next generation (a terminated
    /// run options object stays terminated).
    pub fn reset_terminator(&mut self) -> Result<Terminator, OrtError> {
        self.run_options = Arc::new(RunOptions::new().map_err(OrtError::runtime)?);
        Ok(self.terminator())
    }

    /// Feeds `ids` after the cached tokens and returns the logits of the last
    /// one. The cache then holds the old tokens plus `ids`.
    pub fn forward(&mut self, ids: &[u32]) -> Result<Vec<f32>, OrtError> {
        let mut rows = self.forward_rows(ids, 1)?;
        Ok(rows.pop().expect("a run gives at least one row"))
    }

    /// As [`forward`](Self::forward), returning the logits of the last
    /// `rows` fed tokens, in order (each predicts the token after it).
    /// Fewer come back when the graph gives fewer positions than that
    /// (exports that keep only the last one).
    fn forward_rows(&mut self, ids: &[u32], rows: usize) -> Result<Vec<Vec<f32>>, OrtError> {
        if ids.is_empty() {
            return Err(OrtError::InvalidOption {
                name: "ids",
                reason: "forward needs at least one token".into(),
            });
        }
        let past_len = self.cache.ids.len();
        let total = past_len + ids.len();
        if total > self.context_length {
            return Err(OrtError::TooLong {
                tokens: total,
                limit: self.context_length,
            });
        }
        let token_inputs = token_inputs(&self.io, ids, past_len, rows)?;
        let terminated = |e: ort::Error| {
            if e.to_string().contains("terminate") {
                OrtError::Cancelled
            } else {
                OrtError::runtime(e)
            }
        };
        let mut grew = false;
        let logits = match &mut self.cache.store {
            KvStore::Copy(past) => {
                let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = token_inputs
                    .into_iter()
                    .map(|(name, value)| (Cow::Borrowed(name), value.into()))
                    .collect();
                for (i, layer) in self.io.layers.iter().enumerate() {
                    for (slot, name) in [(2 * i, &layer.past_key), (2 * i + 1, &layer.past_value)] {
                        let value: SessionInputValue<'_> = match past.get(slot) {
                            Some(v) => v.into(),
                            None => empty_kv(self.io.kv_type, self.io.kv_heads, self.io.head_dim)?
                                .into(),
                        };
                        inputs.push((Cow::Borrowed(name.as_str()), value));
                    }
                }
                let mut outputs = self
                    .session
                    .run_with_options(inputs, &*self.run_options)
                    .map_err(terminated)?;
                let logits = outputs
                    .get(&self.io.logits)
                    .ok_or_else(|| OrtError::Runtime("no logits in the outputs".into()))?;
                let logits = last_rows(logits, self.io.logits_type, rows)?;
                let mut values = Vec::with_capacity(2 * self.io.layers.len());
                for layer in &self.io.layers {
                    for name in [&layer.present_key, &layer.present_value] {
                        values.push(outputs.remove(name).ok_or_else(|| {
                            OrtError::Runtime(format!("no `{name}` in the outputs"))
                        })?);
                    }
                }
                drop(outputs);
                *past = values;
                logits
            }
            KvStore::Shared(kv) => {
                if total > kv.capacity {
                    let capacity = (kv.capacity * 2).max(total).min(self.context_length);
                    kv.grow(&self.io, capacity, past_len)?;
                    grew = true;
                }
                for (name, value) in token_inputs {
                    kv.binding
                        .bind_input(name, &value)
                        .map_err(OrtError::runtime)?;
                }
                // A bound-to-device output keeps the first run's shape;
                // binding it again lets the logits take this run's length.
                kv.binding
                    .bind_output_to_device(self.io.logits.as_str(), &kv.cpu)
                    .map_err(OrtError::runtime)?;
                let outputs = self
                    .session
                    .run_binding_with_options(&kv.binding, &self.run_options)
                    .map_err(terminated)?;
                let logits = outputs
                    .get(&self.io.logits)
                    .ok_or_else(|| OrtError::Runtime("no logits in the outputs".into()))?;
                last_rows(logits, self.io.logits_type, rows)?
            }
        };
        self.cache.ids.extend_from_slice(ids);
        if grew {
            // A grown session may push the kept ones past the byte limit.
            self.evict();
        }
        Ok(logits)
    }

    /// Makes the cache a prefix of `prompt` and returns how many of its tokens
    /// it still holds. At least one prompt token is always left to compute,
    /// because the next token's logits come from computing the last one.
    pub fn reuse_prefix_of(&mut self, prompt: &[u32]) -> Result<usize, OrtError> {
        let keep = if self.reuse_prefix {
            common_prefix(&self.cache.ids, prompt).min(prompt.len().saturating_sub(1))
        } else {
            0
        };
        self.truncate_cache(keep)?;
        Ok(keep)
    }

    /// Runs `prompt` through the model, reusing the cached prefix when
    /// allowed, and returns the logits of its last token.
    pub fn logits_for(&mut self, prompt: &[u32]) -> Result<Vec<f32>, OrtError> {
        let cached = self.reuse_prefix_of(prompt)?;
        self.forward(&prompt[cached..])
    }

    /// Generates up to `params.max_new_tokens` tokens after `prompt`.
    ///
    /// `cancel` is checked before every token; `should_stop` sees the tokens
    /// generated so far after each one and ends the generation (as
    /// [`StopReason::Stop`]) by returning true, which is how stop strings
    /// are found. On cancellation the cache keeps what was computed.
    pub fn generate_ids(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        cancel: &CancellationToken,
        should_stop: impl FnMut(&[u32]) -> bool,
    ) -> Result<IdGeneration, OrtError> {
        self.generate_ids_constrained(prompt, params, None, cancel, should_stop)
    }

    /// [`generate_ids`](Self::generate_ids) under a grammar: before each
    /// token the logits of every token `constraint` does not allow are
    /// masked out, and the chosen token advances it.
    ///
    /// The generation ends when the grammar is complete and allows nothing
    /// more, when the model picks a stop token the grammar allows (the
    /// grammar's end-of-sequence is the model's stop tokens), or when it
    /// writes a call it has already written (the copy is cut off). When the token
    /// limit falls inside a call and `params.finish_cut_calls` allows, the
    /// call is finished along a short way the grammar allows, within
    /// that many more tokens (and the context). Otherwise, when the limit
    /// cuts a reply short of a complete output, the reply is cut back to
    /// the last point where the grammar was complete (a whole call rather
    /// than half of the next one); `stats` still counts every token generated.
    pub fn generate_ids_constrained(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        mut constraint: Option<&mut ConstraintMatcher>,
        cancel: &CancellationToken,
        mut should_stop: impl FnMut(&[u32]) -> bool,
    ) -> Result<IdGeneration, OrtError> {
        let start = Instant::now();
        if prompt.is_empty() {
            return Err(OrtError::InvalidOption {
                name: "prompt",
                reason: "the prompt has no tokens".into(),
            });
        }
        if prompt.len() >= self.context_length {
            return Err(OrtError::TooLong {
                tokens: prompt.len() + 1,
                limit: self.context_length,
            });
        }
        if cancel.is_cancelled() {
            return Err(OrtError::Cancelled);
        }
        // New tokens are fed back one by one, and the last one never is, so
        // the context bounds the count at `context - prompt + 1`.
        let room = self.context_length - prompt.len() + 1;
        let mut limits = ReplyLimits {
            max_new: params.max_new_tokens.min(room),
            room,
            closing: false,
            complete_at: 0,
        };
        let mut stats = GenerationStats {
            prompt_tokens: prompt.len(),
            ..GenerationStats::default()
        };
        let result = self.reuse_prefix_of(prompt).and_then(|cached| {
            stats.cached_tokens = cached;
            stats.prefill_tokens = prompt.len() - cached;
            self.forward(&prompt[cached..])
        });
        let mut logits = match result {
            Ok(l) => l,
            Err(e) => return Err(self.after_error(e, cancel)),
        };
        stats.prefill_time = start.elapsed();

        let mut sampler = Sampler::new(&params.sampling, prompt);
        let mut ids = Vec::new();
        // The draft being verified, whose rows give the next logits while
        // the model keeps choosing its tokens.
        let mut round: Option<DraftRound> = None;
        let decode_start = Instant::now();
        let reason = 'generation: loop {
            if cancel.is_cancelled() {
                return Err(OrtError::Cancelled);
            }
            // Where the grammar allows one continuation only, its tokens are
            // taken as they are and fed together: a small prefill instead of
            // one decode step each. The logits in hand (for the first of
            // them) are not needed.
            if self.fast_forward
                && let Some(c) = constraint.as_deref_mut()
            {
                let started = Instant::now();
                let mut forced = c.forced_tokens();
                stats.constraint_time += started.elapsed();
                forced.truncate(limits.max_new - ids.len());
                if !forced.is_empty() {
                    // They are fed after the reply so far: the rest of a
                    // draft goes.
                    if let Some(r) = round.take() {
                        self.truncate_cache(r.reply_end())?;
                    }
                    for &id in &forced {
                        if ids.is_empty() {
                            stats.time_to_first_token = start.elapsed();
                        }
                        ids.push(id);
                        sampler.remember(id);
                        stats.forced_tokens += 1;
                        // The tokens after an end are not fed (nor the last
                        // one, as always).
                        if let Some(reason) = after_token(
                            &mut ids,
                            Some(&mut *c),
                            params,
                            &mut limits,
                            &mut stats,
                            &mut should_stop,
                        )? {
                            break 'generation reason;
                        }
                    }
                    if cancel.is_cancelled() {
                        return Err(OrtError::Cancelled);
                    }
                    logits = match self.forward(&forced) {
                        Ok(l) => l,
                        Err(e) => return Err(self.after_error(e, cancel)),
                    };
                    stats.decode_steps += 1;
                    stats.forced_runs += 1;
                    continue;
                }
            }
            // The choice is made the same way whether the logits come from a
            // pass of their own or from a draft's row: that is what keeps
            // the reply the one decoding token by token writes.
            if let Some(c) = constraint.as_deref_mut() {
                let started = Instant::now();
                c.mask_logits(&mut logits)?;
                if limits.closing {
                    c.close_out(&mut logits);
                }
                stats.constraint_time += started.elapsed();
                stats.constrained_tokens += 1;
            }
            let greedy = params.sampling.is_greedy()
                || limits.closing
                || (params.greedy_calls && constraint.as_deref().is_some_and(|c| c.writing_call()));
            let id = sampler.sample_as(&mut logits, greedy);
            if ids.is_empty() {
                stats.time_to_first_token = start.elapsed();
            }
            ids.push(id);
            if let Some(reason) = after_token(
                &mut ids,
                constraint.as_deref_mut(),
                params,
                &mut limits,
                &mut stats,
                &mut should_stop,
            )? {
                // The last token is not fed: where a draft put it (and more)
                // in the cache, they go.
                if let Some(r) = round.take() {
                    self.truncate_cache(r.reply_end())?;
                }
                break reason;
            }
            // The draft guessed this token: its row holds the next logits.
            if let Some(r) = round.as_mut()
                && let Some(next) = r.accept(id)
            {
                logits = next;
                stats.accepted_tokens += 1;
                continue;
            }
            if let Some(r) = round.take() {
                self.truncate_cache(r.reply_end())?;
            }
            // Checked again so that a cancellation during sampling or the
            // stop check does not pay for one more forward pass.
            if cancel.is_cancelled() {
                return Err(OrtError::Cancelled);
            }
            // Drafts only where the next choice is greedy: a sampled row
            // would stay exact (the same generator draws for the same
            // rows), but a draft would rarely be drawn, so the pass would
            // be wasted.
            let draft = if self.prompt_lookup && greedy {
                // A pass over the draft feeds `id` too and must fit the
                // context; drafted tokens past the token limit could never
                // join the reply.
                let room = (self.context_length.saturating_sub(self.cache.ids.len() + 1))
                    .min(limits.max_new.saturating_sub(ids.len() + 1))
                    .min(MAX_DRAFT);
                match constraint.as_deref_mut() {
                    Some(c) => {
                        let started = Instant::now();
                        let draft = c.draft(room, |guess, max| {
                            let mut seq = ids.clone();
                            seq.extend_from_slice(guess);
                            lookup_draft(prompt, &seq, max)
                        });
                        stats.constraint_time += started.elapsed();
                        draft
                    }
                    None => lookup_draft(prompt, &ids, room),
                }
            } else {
                Vec::new()
            };
            if draft.is_empty() {
                logits = match self.forward(&[id]) {
                    Ok(l) => l,
                    Err(e) => return Err(self.after_error(e, cancel)),
                };
                stats.decode_steps += 1;
                continue;
            }
            let base = self.cache.ids.len();
            let mut fed = Vec::with_capacity(1 + draft.len());
            fed.push(id);
            fed.extend_from_slice(&draft);
            let mut rows = match self.forward_rows(&fed, fed.len()) {
                Ok(rows) => rows,
                Err(e) => return Err(self.after_error(e, cancel)),
            };
            stats.decode_steps += 1;
            if rows.len() < fed.len() {
                // The graph gives the last position's logits only: drafts
                // cannot be checked. Back to one token per pass, for good.
                tracing::debug!("prompt lookup: the graph gives only the last logits; off");
                self.prompt_lookup = false;
                self.truncate_cache(base)?;
                logits = match self.forward(&[id]) {
                    Ok(l) => l,
                    Err(e) => return Err(self.after_error(e, cancel)),
                };
                stats.decode_steps += 1;
                continue;
            }
            stats.draft_runs += 1;
            stats.drafted_tokens += draft.len();
            rows.reverse();
            logits = rows.pop().expect("one row per fed token");
            round = Some(DraftRound {
                base,
                draft,
                rows,
                accepted: 0,
            });
        };
        stats.decode_time = decode_start.elapsed();
        stats.total_time = start.elapsed();
        Ok(IdGeneration { ids, reason, stats })
    }

    /// After a failed run the cache is as it was before the run (it is only
    /// replaced on success), so it stays usable; the error is reported as a
    /// cancellation when that is what stopped the run.
    fn after_error(&self, e: OrtError, cancel: &CancellationToken) -> OrtError {
        if cancel.is_cancelled() {
            OrtError::Cancelled
        } else {
            e
        }
    }

    /// Keeps the first `len` cached positions.
    fn truncate_cache(&mut self, len: usize) -> Result<(), OrtError> {
        if len >= self.cache.ids.len() {
            return Ok(());
        }
        if len == 0 {
            self.clear_cache();
            return Ok(());
        }
        if let KvStore::Copy(values) = &mut self.cache.store {
            let cut = values
                .iter()
                .map(|v| match self.io.kv_type {
                    FloatType::F32 => slice_sequence::<f32>(v, len),
                    FloatType::F16 => slice_sequence::<f16>(v, len),
                })
                .collect::<Result<Vec<_>, _>>()?;
            *values = cut;
        }
        // Shared buffers need no cut: the next run's mask says how many
        // positions count, and it overwrites the rest.
        self.cache.ids.truncate(len);
        self.cache.text.truncate(len);
        Ok(())
    }
}

impl SharedKv {
    fn new(session: &Session, io: &GraphIo, capacity: usize) -> Result<Self, OrtError> {
        let mut kv = Self::empty(session)?;
        kv.fill(io, capacity, &[], 0)?;
        Ok(kv)
    }

    /// A binding without buffers yet (see [`SharedKv::fill`]).
    fn empty(session: &Session) -> Result<Self, OrtError> {
        Ok(Self {
            binding: session.create_binding().map_err(OrtError::runtime)?,
            cpu: MemoryInfo::default(),
            buffers: Vec::new(),
            capacity: 0,
        })
    }

    /// Replaces the buffers with ones of `capacity` positions, keeping the
    /// first `keep`, and binds them.
    fn grow(&mut self, io: &GraphIo, capacity: usize, keep: usize) -> Result<(), OrtError> {
        let old = std::mem::take(&mut self.buffers);
        self.fill(io, capacity, &old, keep)
    }

    /// Binds new buffers of `capacity` positions holding the first `keep`
    /// positions of `source` (another session's buffers, or this one's old
    /// ones).
    fn fill(
        &mut self,
        io: &GraphIo,
        capacity: usize,
        source: &[DynValue],
        keep: usize,
    ) -> Result<(), OrtError> {
        let allocator = Allocator::default();
        let shape = [1usize, io.kv_heads, capacity, io.head_dim];
        let mut buffers = Vec::with_capacity(2 * io.layers.len());
        for slot in 0..2 * io.layers.len() {
            let old = source.get(slot);
            let buffer = match io.kv_type {
                FloatType::F32 => grown::<f32>(&allocator, shape, old, keep)?,
                FloatType::F16 => grown::<f16>(&allocator, shape, old, keep)?,
            };
            buffers.push(buffer);
        }
        for (i, layer) in io.layers.iter().enumerate() {
            for (slot, input, output) in [
                (2 * i, &layer.past_key, &layer.present_key),
                (2 * i + 1, &layer.past_value, &layer.present_value),
            ] {
                self.binding
                    .bind_input(input.as_str(), &buffers[slot])
                    .map_err(OrtError::runtime)?;
                self.binding
                    .bind_output(output.as_str(), &mut buffers[slot])
                    .map_err(OrtError::runtime)?;
            }
        }
        self.buffers = buffers;
        self.capacity = capacity;
        tracing::debug!(capacity, "KV cache buffers allocated");
        Ok(())
    }
}

/// Most tokens one draft proposes. Each fed position costs the layers and
/// the LM head once more, so a missed draft is not free; on the call
/// benchmark (`ort_bench`, default model) eight gave 1.57x where four gave
/// 1.49x, and a copied run (an id, a path, a phrase) is seldom longer.
const MAX_DRAFT: usize = 8;

/// The longest and shortest run of last tokens looked up. Three tokens
/// rarely match by chance; two still find an id whose first token the
/// model spelled differently from the prompt (`"p` against ` p`). One
/// token alone drafted more and was no faster on the call benchmark.
const LOOKUP_NGRAM: std::ops::RangeInclusive<usize> = 2..=3;

/// A draft fed after the last token in one pass, and the logits of its
/// positions not yet used.
struct DraftRound {
    /// Cached tokens before the pass.
    base: usize,
    /// The drafted tokens (fed after the reply's last token).
    draft: Vec<u32>,
    /// The logits after each drafted token, the last first (so `pop`
    /// gives the next one).
    rows: Vec<Vec<f32>>,
    /// Drafted tokens the model chose so far.
    accepted: usize,
}

impl DraftRound {
    /// When `id`, just chosen, is the next drafted token: the logits after
    /// it, which the pass computed already.
    fn accept(&mut self, id: u32) -> Option<Vec<f32>> {
        if self.draft.get(self.accepted) != Some(&id) {
            return None;
        }
        self.accepted += 1;
        self.rows.pop()
    }

    /// Cached positions that belong to the reply so far: the tokens before
    /// the pass, the token it fed first, and the accepted drafted ones. The
    /// rest of the draft is to be cut from the cache.
    fn reply_end(&self) -> usize {
        self.base + 1 + self.accepted
    }
}

/// Prompt lookup: the tokens that followed the latest earlier occurrence
/// of the sequence's last few tokens (three, else two; see
/// [`LOOKUP_NGRAM`]), at most `max` of them; empty when there is none.
/// The sequence is `prompt` followed by `reply`. Arguments of tool calls
/// mostly copy what the prompt holds, so those tokens are a likely guess
/// of what comes next.
pub(crate) fn lookup_draft(prompt: &[u32], reply: &[u32], max: usize) -> Vec<u32> {
    if max == 0 {
        return Vec::new();
    }
    let seq: Vec<u32> = prompt.iter().chain(reply).copied().collect();
    for n in LOOKUP_NGRAM.rev() {
        if seq.len() <= n {
            continue;
        }
        let tail = &seq[seq.len() - n..];
        // Every start that leaves at least one token after the match.
        if let Some(at) = (0..seq.len() - n).rev().find(|&i| &seq[i..i + n] == tail) {
            let from = at + n;
            return seq[from..(from + max).min(seq.len())].to_vec();
        }
    }
    Vec::new()
}

/// How far a reply may go: the token limit (raised once to finish a cut
/// call), the context's room, and the grammar's last complete point.
struct ReplyLimits {
    max_new: usize,
    room: usize,
    /// Whether the limit fell inside a call that is now being finished.
    closing: bool,
    /// Under a constraint: how many tokens made the last complete output.
    complete_at: usize,
}

/// What follows a token joining the reply (`ids`'s last), the same for a
/// token the model chose and one the grammar forced: the grammar advances,
/// and the reply ends at a stop token, a finished grammar, a repeated call
/// (cut off) or a stop string. At the token limit a cut call gets
/// `finish_cut_calls` more tokens to close, once; otherwise the reply goes
/// back to its last complete output and ends. `None` means go on.
fn after_token(
    ids: &mut Vec<u32>,
    mut constraint: Option<&mut ConstraintMatcher>,
    params: &GenerateParams,
    limits: &mut ReplyLimits,
    stats: &mut GenerationStats,
    should_stop: &mut impl FnMut(&[u32]) -> bool,
) -> Result<Option<StopReason>, OrtError> {
    stats.generated_tokens += 1;
    let id = *ids.last().expect("a token was just added");
    let stop_token = params.stop_ids.contains(&id);
    let mut grammar_done = false;
    if let Some(c) = constraint.as_deref_mut() {
        let started = Instant::now();
        // The mask only lets a stop token through where the grammar is
        // complete; there is nothing to advance.
        if !stop_token {
            c.consume(id)?;
            grammar_done = c.is_finished();
            if c.is_accepting() {
                limits.complete_at = ids.len();
            }
            if c.repeated_a_call() {
                ids.truncate(c.distinct_tokens());
                grammar_done = true;
            }
        }
        stats.constraint_time += started.elapsed();
    }
    if stop_token || grammar_done || should_stop(ids) {
        return Ok(Some(StopReason::Stop));
    }
    if limits.closing && limits.complete_at == ids.len() {
        return Ok(Some(StopReason::Length));
    }
    if ids.len() >= limits.max_new {
        // Asked only here: whether the reply is inside a call matters
        // only at the limit.
        if !limits.closing
            && limits.complete_at == 0
            && params.finish_cut_calls > 0
            && constraint.is_some_and(|c| c.writing_call())
        {
            limits.closing = true;
            limits.max_new = (limits.max_new + params.finish_cut_calls).min(limits.room);
        }
        if ids.len() >= limits.max_new {
            if limits.complete_at > 0 && limits.complete_at < ids.len() {
                ids.truncate(limits.complete_at);
            }
            return Ok(Some(StopReason::Length));
        }
    }
    Ok(None)
}

/// A zeroed `[1, heads, capacity, head_dim]` buffer with the first `keep`
/// positions of `old` copied in.
fn grown<T>(
    allocator: &Allocator,
    shape: [usize; 4],
    old: Option<&DynValue>,
    keep: usize,
) -> Result<DynValue, OrtError>
where
    T: PrimitiveTensorElementType + Copy + std::fmt::Debug + 'static,
{
    let mut buffer = Tensor::<T>::new(allocator, shape).map_err(OrtError::runtime)?;
    if let Some(old) = old.filter(|_| keep > 0) {
        let (old_shape, old_data) = old.try_extract_tensor::<T>().map_err(OrtError::runtime)?;
        let old_capacity = old_shape[2].max(0) as usize;
        let [_, heads, capacity, width] = shape;
        let (_, data) = buffer.extract_tensor_mut();
        for h in 0..heads {
            let from = h * old_capacity * width;
            let to = h * capacity * width;
            data[to..to + keep * width].copy_from_slice(&old_data[from..from + keep * width]);
        }
    }
    Ok(buffer.into_dyn())
}

/// Bytes two texts share at their start, at a character boundary.
pub(crate) fn common_bytes(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// Length of the common prefix of two token lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The inputs other than the cache: token ids, the mask over past and new
/// positions, positions, the merged decoders' branch flag, and the last
/// `rows` positions whose logits are wanted (where the graph takes that).
fn token_inputs<'a>(
    io: &'a GraphIo,
    ids: &[u32],
    past_len: usize,
    rows: usize,
) -> Result<Vec<(&'a str, DynValue)>, OrtError> {
    let n = ids.len();
    let rows = rows.clamp(1, n);
    let total = past_len + n;
    let mut inputs = Vec::with_capacity(4);
    inputs.push((
        io.input_ids.as_str(),
        tensor_i64(vec![1, n], ids.iter().map(|&id| i64::from(id)).collect())?,
    ));
    if let Some(name) = &io.attention_mask {
        inputs.push((name.as_str(), tensor_i64(vec![1, total], vec![1; total])?));
    }
    if let Some(name) = &io.position_ids {
        let positions = (past_len as i64..total as i64).collect();
        inputs.push((name.as_str(), tensor_i64(vec![1, n], positions)?));
    }
    if let Some(name) = &io.use_cache_branch {
        let flag =
            Tensor::from_array((vec![1usize], vec![past_len > 0])).map_err(OrtError::runtime)?;
        inputs.push((name.as_str(), flag.into_dyn()));
    }
    if let Some(name) = &io.logits_positions {
        let last = (-(rows as i64)..0).collect();
        inputs.push((name.as_str(), tensor_i64(vec![rows], last)?));
    }
    Ok(inputs)
}

fn tensor_i64(shape: Vec<usize>, data: Vec<i64>) -> Result<DynValue, OrtError> {
    Tensor::from_array((shape, data))
        .map(|t| t.into_dyn())
        .map_err(OrtError::runtime)
}

/// A cache tensor with no positions, for the first run.
fn empty_kv(ty: FloatType, heads: usize, head_dim: usize) -> Result<DynValue, OrtError> {
    let shape = vec![1usize, heads, 0, head_dim];
    match ty {
        FloatType::F32 => Tensor::from_array((shape, Vec::<f32>::new())).map(|t| t.into_dyn()),
        FloatType::F16 => Tensor::from_array((shape, Vec::<f16>::new())).map(|t| t.into_dyn()),
    }
    .map_err(OrtError::runtime)
}

/// The logits of the last `rows` positions of a `[batch, sequence, vocab]`
/// output, in order (fewer where the output holds fewer positions).
fn last_rows(value: &DynValue, ty: FloatType, rows: usize) -> Result<Vec<Vec<f32>>, OrtError> {
    fn split<T: Copy>(
        shape: &[i64],
        data: &[T],
        rows: usize,
        f: impl Fn(T) -> f32,
    ) -> Result<Vec<Vec<f32>>, OrtError> {
        let vocab = vocab_width(shape)?;
        let rows = rows.min(data.len() / vocab);
        let tail = &data[data.len() - rows * vocab..];
        Ok(tail
            .chunks_exact(vocab)
            .map(|row| row.iter().map(|&x| f(x)).collect())
            .collect())
    }
    match ty {
        FloatType::F32 => {
            let (shape, data) = value
                .try_extract_tensor::<f32>()
                .map_err(OrtError::runtime)?;
            split(shape, data, rows, |x| x)
        }
        FloatType::F16 => {
            let (shape, data) = value
                .try_extract_tensor::<f16>()
                .map_err(OrtError::runtime)?;
            split(shape, data, rows, f16::to_f32)
        }
    }
}

fn vocab_width(shape: &[i64]) -> Result<usize, OrtError> {
    shape
        .last()
        .and_then(|&v| usize::try_from(v).ok())
        .filter(|&v| v > 0)
        .ok_or_else(|| OrtError::Runtime(format!("logits have shape {shape:?}")))
}

/// The first `keep` positions of a `[batch, heads, sequence, head_dim]` tensor.
fn slice_sequence<T>(value: &DynValue, keep: usize) -> Result<DynValue, OrtError>
where
    T: PrimitiveTensorElementType + Copy + std::fmt::Debug + 'static,
{
    let (shape, data) = value.try_extract_tensor::<T>().map_err(OrtError::runtime)?;
    let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    let [b, h, s, d] = dims[..] else {
        return Err(OrtError::Runtime(format!(
            "cache tensor has shape {dims:?}"
        )));
    };
    let keep = keep.min(s);
    let mut out = Vec::with_capacity(b * h * keep * d);
    for row in 0..b * h {
        let start = row * s * d;
        out.extend_from_slice(&data[start..start + keep * d]);
    }
    Tensor::from_array((vec![b, h, keep, d], out))
        .map(|t| t.into_dyn())
        .map_err(OrtError::runtime)
}

#[cfg(test)]
mod tests {
    use super::{common_prefix, lookup_draft};

    #[test]
    fn lookup_takes_what_followed_the_latest_match_of_the_last_tokens() {
        // `7 8 9` ends the sequence; its latest earlier occurrence is
        // followed by `4 5`, then the reply's own tokens.
        let prompt = [7, 8, 9, 1, 1, 7, 8, 9, 4, 5, 6];
        assert_eq!(lookup_draft(&prompt, &[7, 8, 9], 3), vec![4, 5, 6]);
        assert_eq!(lookup_draft(&prompt, &[7, 8, 9], 8), vec![4, 5, 6, 7, 8, 9]);
        // Two tokens when three do not match.
        assert_eq!(lookup_draft(&[3, 4, 5], &[0, 3, 4], 8), vec![5, 0, 3, 4]);
        // One token alone is not looked up.
        assert_eq!(lookup_draft(&[3, 4, 5], &[0, 3], 8), Vec::<u32>::new());
        assert_eq!(lookup_draft(&prompt, &[7, 8, 9], 0), Vec::<u32>::new());
        assert_eq!(lookup_draft(&[], &[1, 2], 4), Vec::<u32>::new());
    }

    #[test]
    fn common_prefix_counts_equal_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
