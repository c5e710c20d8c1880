//! The provider's settings, each with its documented default.

use std::path::PathBuf;

use crate::sampling::SamplingOptions;

/// Default upper bound on new tokens per generation.
pub const DEFAULT_MAX_NEW_TOKENS: u32 = 256;

/// Default number of KV sessions kept (see [`OrtProviderOptions::kv_sessions`]).
pub const DEFAULT_KV_SESSIONS: usize = 6;

/// Default bytes the kept KV sessions may take: 1 GiB (see
/// [`OrtProviderOptions::kv_cache_bytes`]).
pub const DEFAULT_KV_CACHE_BYTES: u64 = 1 << 30;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExecutionProvider {
    /// ONNX Runtime's CPU kernels (the default; works everywhere).
    #[default]
    Cpu,
    /// DirectML on Windows (GPU or NPU through DirectX 12). Needs the
    /// `directml` cargo feature and a DirectML build of ONNX Runtime.
    DirectMl {
        /// The adapter index (0 is the default adapter).
        device_id: i32,
    },
    /// CoreML on macOS (Apple Neural Engine / GPU). Needs the `coreml` cargo
    /// feature.
    CoreMl,
}

/// Settings of an [`OrtProvider`](crate::OrtProvider).
///
/// Build one with [`OrtProviderOptions::default`] and the `with_*` methods,
/// or set the public fields:
///
/// ```
/// use wma_provider_ort::{OrtProviderOptions, SamplingOptions};
///
/// let options = OrtProviderOptions::default()
///     .with_model("HuggingFaceTB/SmolLM2-135M-Instruct")
///     .with_threads(2)
///     .with_sampling(SamplingOptions::seeded(0.7, 42));
/// assert!(options.reuse_prefix);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct OrtProviderOptions {
    /// A model folder, the name of a model installed in `CACHE/models`
    /// (see [`ModelSource::folder`](crate::ModelSource::folder)), or a hub
    /// id (`org/name`). Default: `$WMA_MODEL` when set, else
    /// `CACHE/models/SmolLM2-135M-Instruct`.
    pub model: Option<String>,
    /// Which graph file to load: a path inside the folder
    /// (`onnx/model_fp16.onnx`) or a short name (`q4` means
    /// `onnx/model_q4.onnx`). Default: the first of `onnx/model_q4.onnx`,
    /// `onnx/model.onnx`, `model.onnx` that exists.
    pub variant: Option<String>,
    /// The cache folder (downloads, the default model, the runtime library).
    /// Default: `$WMA_CACHE_DIR`, else `$XDG_CACHE_HOME/webmcp-agents`, else
    /// the platform's cache folder.
    pub cache_dir: Option<PathBuf>,
    /// The hub that `org/name` models are downloaded from. Default:
    /// `$HF_ENDPOINT`, else `https://huggingface.co`.
    pub hub_endpoint: Option<String>,
    /// The ONNX Runtime shared library. Default: `$ORT_DYLIB_PATH`, else
    /// `CACHE/onnxruntime/libonnxruntime.so` (`.dylib`, `.dll`).
    pub dylib_path: Option<PathBuf>,
    /// Threads used inside one operator. Default: `None`, ONNX Runtime's
    /// choice (one per physical core).
    pub intra_threads: Option<usize>,
    /// Threads used to run independent operators at once. Default: `None`,
    /// ONNX Runtime's choice (a decoder's graph is sequential anyway).
    pub inter_threads: Option<usize>,
    /// Where the model runs. Default: CPU.
    pub execution_provider: ExecutionProvider,
    /// How tokens are chosen. Default: greedy.
    pub sampling: SamplingOptions,
    /// Upper bound on new tokens; a request's own `max_new_tokens` wins.
    /// Default: 256.
    pub max_new_tokens: u32,
    /// Strings that end a generation (not included in the text). Default:
    /// empty, meaning the text of the model's end-of-sequence tokens.
    pub stop: Vec<String>,
    /// Keep the KV cache in buffers that the graph updates in place, when
    /// the graph can (GroupQueryAttention exports; checked when loading).
    /// Default: true. Saves copying the whole cache for every token.
    pub shared_kv_buffer: bool,
    /// Keep the KV cache between generations and reuse the longest common
    /// token prefix of the next prompt. Default: true. Turn it off to measure
    /// a full re-prefill.
    pub reuse_prefix: bool,
    /// Tokens kept free for the answer when [`fits`](wma_agent::Provider::fits)
    /// judges a prompt. Default: `None`, meaning `max_new_tokens`.
    pub context_reserve: Option<u32>,
    /// The context window. Default: `None`, meaning the model's
    /// `max_position_embeddings`. Lower it to bound memory.
    pub context_length: Option<u32>,
    /// KV sessions kept: one per agent run while it is live, and what
    /// finished runs computed, so that a sub-agent does not evict its
    /// parent's prefix and an agent's next run finds its system prompt
    /// computed. Least recently used sessions go first. Default: 6; 1 is
    /// one cache shared by everybody.
    pub kv_sessions: usize,
    /// Bytes the kept KV sessions may take (keys and values, buffers
    /// counted whole; the session in use is never evicted). Default: 1 GiB.
    /// The default model needs 46 KiB per position.
    pub kv_cache_bytes: u64,
    /// Under a constraint, where the grammar allows exactly one
    /// continuation (a key the schema fixes, the rest of a settled tool
    /// name), feed its tokens in one forward pass instead of one decode
    /// step each; the tokens are the tokenizer's own for that text.
    /// Default: false. On the 4-bit default model, logits of tokens fed
    /// together differ from those fed one by one (up to 0.7: the graph
    /// quantizes activations to 8 bits, which turns GroupQueryAttention's
    /// last-bit difference between its batched and one-token paths into
    /// whole quantization steps), and a later free choice can come out
    /// differently ("add two of p-17" gained a `"quantity": 1`), so it
    /// stays opt-in. fp32 activations make the paths agree but decode
    /// several times slower, and on the default model the forced runs are
    /// too short for one pass to beat their steps one by one
    /// (docs/providers.md has the numbers).
    pub fast_forward: bool,
    /// Prompt lookup: while decoding greedily, look the reply's last three
    /// (else two) tokens up in the prompt and the reply so far, and where
    /// they occur, feed the up to eight tokens that followed them there
    /// after the last token in one forward pass. The model's choice at
    /// each position, made exactly as one pass per token makes it (the
    /// constraint's mask, the copy bias and the repetition penalty
    /// included, the grammar advanced by chosen tokens only), takes the
    /// drafted tokens for as long as they agree and one more; the cache
    /// drops the rest. Tool-call arguments mostly copy the prompt (ids,
    /// names, phrases), so a run of them costs one pass instead of one
    /// each. Sampled tokens are never drafted for (a draft would rarely
    /// be drawn). Needs a graph that gives logits for every fed position
    /// (one that gives the last only turns it off at the first draft).
    /// Set it when loading: a graph that keeps only the last position's
    /// logits (this project's converted ones) is then loaded with that
    /// position as an input (see `logit_positions`).
    ///
    /// Default: false. It was never slower on `ort_bench` (two threads,
    /// a busy machine, reply tokens/s after the first token, off against
    /// on in the same run): on the default 4-bit model, constrained calls
    /// 25.9 against 38.1 (1.47x) and 16.1 against 31.4 (1.95x) in two
    /// runs, the workload's steps 1.22x and 1.75x; on the fp32 variant
    /// 8.7 against 16.4 (1.88x) and 1.60x. But on the 4-bit graph a pass
    /// over several tokens gives logits that differ from one-token passes
    /// (activations are quantized to 8 bits, as
    /// [`fast_forward`](Self::fast_forward) explains), and one or two
    /// workload steps of four came out differently (the calls did not),
    /// so replies are not the same token for token there. On the fp32
    /// variant every reply measured and tested was the same; turn it on
    /// there.
    pub prompt_lookup: bool,
    /// Honour decoding constraints (grammars) from the loop. Default: true.
    /// When the tokenizer's vocabulary cannot be read for them, the provider
    /// says it does not support constraints and ignores them. How a
    /// constrained reply is shaped comes with each request
    /// ([`wma_agent::Decoding`]), not from these options.
    pub constraints: bool,
}

impl Default for OrtProviderOptions {
    fn default() -> Self {
        Self {
            model: None,
            variant: None,
            cache_dir: None,
            hub_endpoint: None,
            dylib_path: None,
            intra_threads: None,
            inter_threads: None,
            execution_provider: ExecutionProvider::Cpu,
            sampling: SamplingOptions::default(),
            max_new_tokens: DEFAULT_MAX_NEW_TOKENS,
            stop: Vec::new(),
            shared_kv_buffer: true,
            reuse_prefix: true,
            context_reserve: None,
            context_length: None,
            kv_sessions: DEFAULT_KV_SESSIONS,
            kv_cache_bytes: DEFAULT_KV_CACHE_BYTES,
            fast_forward: false,
            prompt_lookup: false,
            constraints: true,
        }
    }
}

impl OrtProviderOptions {
    /// Loads this model folder or hub id.
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Loads this graph file or variant.
    pub fn with_variant(mut self, variant: impl Into<String>) -> Self {
        self.variant = Some(variant.into());
        self
    }

    /// Uses this cache folder.
    pub fn with_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Downloads hub models from this endpoint.
    pub fn with_hub_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.hub_endpoint = Some(endpoint.into());
        self
    }

    /// Loads ONNX Runtime from this file.
    pub fn with_dylib_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.dylib_path = Some(path.into());
        self
    }

    /// Runs operators on `n` threads (and one operator at a time).
    pub fn with_threads(mut self, n: usize) -> Self {
        self.intra_threads = Some(n);
        self.inter_threads = Some(1);
        self
    }

    /// Runs on this execution provider.
    pub fn with_execution_provider(mut self, ep: ExecutionProvider) -> Self {
        self.execution_provider = ep;
        self
    }

    /// Chooses tokens this way.
    pub fn with_sampling(mut self, sampling: SamplingOptions) -> Self {
        self.sampling = sampling;
        self
    }

    /// Generates at most `n` new tokens unless a request says otherwise.
    pub fn with_max_new_tokens(mut self, n: u32) -> Self {
        self.max_new_tokens = n;
        self
    }

    /// Ends generations at these strings instead of the end-of-sequence text.
    pub fn with_stop(mut self, stop: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.stop = stop.into_iter().map(Into::into).collect();
        self
    }

    /// Keeps (true) or drops (false) the KV cache between generations.
    pub fn with_reuse_prefix(mut self, reuse: bool) -> Self {
        self.reuse_prefix = reuse;
        self
    }

    /// Uses (true) or never uses (false) cache buffers updated in place.
    pub fn with_shared_kv_buffer(mut self, shared: bool) -> Self {
        self.shared_kv_buffer = shared;
        self
    }

    /// Keeps at most `n` KV sessions (at least 1).
    pub fn with_kv_sessions(mut self, n: usize) -> Self {
        self.kv_sessions = n.max(1);
        self
    }

    /// Lets the kept KV sessions take at most `bytes`.
    pub fn with_kv_cache_bytes(mut self, bytes: u64) -> Self {
        self.kv_cache_bytes = bytes;
        self
    }

    /// Feeds (true) or decodes one by one (false) the tokens a grammar forces.
    pub fn with_fast_forward(mut self, on: bool) -> Self {
        self.fast_forward = on;
        self
    }

    /// Drafts tokens from the prompt and verifies them in one pass (true),
    /// or decodes one token per pass (false).
    pub fn with_prompt_lookup(mut self, on: bool) -> Self {
        self.prompt_lookup = on;
        self
    }

    /// Keeps `n` tokens free for the answer in `fits()`.
    pub fn with_context_reserve(mut self, n: u32) -> Self {
        self.context_reserve = Some(n);
        self
    }

    /// Limits the context window to `n` tokens.
    pub fn with_context_length(mut self, n: u32) -> Self {
        self.context_length = Some(n);
        self
    }
}
