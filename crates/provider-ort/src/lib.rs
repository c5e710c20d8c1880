//! The ONNX Runtime provider: runs a local language model for the agent loop.
//!
//! [`OrtProvider`] implements [`wma_agent::Provider`]. It loads any Hugging
//! Face-style ONNX folder (what onnx-community exports and what
//! `scripts/setup.sh` builds for the default model):
//!
//! ```text
//! config.json              layers, KV heads, head size, context, eos/bos ids
//! generation_config.json   more eos ids (optional)
//! tokenizer.json           the tokenizer
//! tokenizer_config.json    chat_template, bos_token, eos_token
//! onnx/model_q4.onnx       the graph (else onnx/model.onnx, else model.onnx,
//!                          or the file named by `variant`)
//! ```
//!
//! # Finding things
//! - Cache folder: `$WMA_CACHE_DIR`, else `$XDG_CACHE_HOME/webmcp-agents`,
//!   else `~/.cache/webmcp-agents` (`~/Library/Caches/webmcp-agents` on macOS).
//! - ONNX Runtime: loaded at run time (`ort`'s `load-dynamic`) from
//!   `$ORT_DYLIB_PATH`, else `CACHE/onnxruntime/libonnxruntime.so`
//!   (`libonnxruntime.dylib` on macOS, `onnxruntime.dll` on Windows).
//! - Model: [`OrtProviderOptions::model`], else `$WMA_MODEL`, else
//!   `CACHE/models/SmolLM2-135M-Instruct`. A hub id (`org/name`) is
//!   downloaded into `CACHE/hub/org--name/` during `prepare`, with progress.
//!
//! `scripts/setup.sh` installs the library and the default model; the errors
//! for a missing library or model say so.
//!
//! # Prompts
//! The chat template is the model's own, rendered with minijinja as Hugging
//! Face renders it (see [`ChatTemplate`]). A template that mentions `tools`
//! gets them through the template ([`Provider::tools_inline`](wma_agent::Provider::tools_inline) is false);
//! otherwise the loop writes them into the prompt. A template that mentions
//! `<tool_call>` makes the call format Hermes; otherwise it is plain JSON.
//!
//! # Content is never control
//! Only the chat template's own text may produce the tokenizer's added
//! tokens (`<|im_start|>`, `<|im_end|>`, `<tool_call>`…). Message content,
//! tool names, descriptions and schemas are tokenized as plain text, so a
//! tool result or a page title that spells `<|im_end|>\n<|im_start|>system`
//! stays text ([`ChatTemplate::render_prompt`], [`PromptEncoder`]). The
//! text a grammar forces and the copy bias's phrases never become added
//! tokens either.
//!
//! # The KV cache
//! An agent sends, step after step, prompts that extend the previous one.
//! The provider keeps the keys and values of the tokens it has computed and
//! the ids they belong to; the next prompt reuses the longest common prefix
//! (the tensors are cut to it) and only the new tokens are computed. The last
//! token of a generation was chosen but never fed to the model, so it is not
//! counted as cached. [`OrtProviderOptions::reuse_prefix`] turns this off.
//!
//! Graphs built on GroupQueryAttention (the default model, most
//! onnx-community exports) can update the cache in place: the provider then
//! binds preallocated buffers as both the `past` inputs and the `present`
//! outputs, which saves copying the whole cache for every token and makes
//! cutting it back free. Whether a graph can is checked when it is loaded
//! (a short probe compared against the copying path); graphs that
//! concatenate past and new keys keep the copying path.
//!
//! # Constrained decoding
//! A request's [`Constraint`](wma_agent::Constraint) becomes an llguidance
//! grammar (see [`ConstraintEngine`]): "text or calls" and "calls only" over
//! the tools shown, in the model's call format, each call's arguments
//! following its tool's schema. Before every token the grammar's mask sets
//! the logits of the tokens it does not allow to minus infinity; the end of
//! the grammar is the model's own stop tokens. A reply that repeats a call
//! word for word ends there; a reply cut by the token limit is cut back to
//! its last complete call. The mask costs well under 1% of a token's time
//! on the default model (`cargo run --release -p wma-provider-ort --example
//! constraint_bench`). [`OrtProviderOptions::constraints`] turns it off.
//! Everything else about a constrained reply comes with the request
//! ([`wma_agent::Decoding`], which the loop's policy fills): the grammar's
//! limits (string length, array items, calls per reply, one tool or many,
//! tools called once), the call threshold that decides prose or call where
//! both are allowed, the logit bonus for copying the person's own phrases
//! into arguments ([`copy`]), and whether a begun call is decoded greedily.
//!
//! # Cancellation
//! Inference runs on a blocking thread. The cancellation token is checked
//! before every token, and a running forward pass (a long prefill) is told to
//! stop through ONNX Runtime's terminate flag, so `generate` returns
//! [`ProviderError::Cancelled`](wma_agent::ProviderError::Cancelled) promptly.
//!
//! # Execution providers
//! CPU by default ([`OrtProviderOptions::intra_threads`] sets its threads).
//! Two cargo features register accelerators:
//! - `directml` (Windows): build with
//!   `cargo build -p wma-provider-ort --features directml`, point
//!   `ORT_DYLIB_PATH` at the `onnxruntime.dll` of a DirectML build (the
//!   `onnxruntime-directml` wheel ships one, with `DirectML.dll` beside it),
//!   and choose [`ExecutionProvider::DirectMl`].
//! - `coreml` (macOS): build with `--features coreml`, use the
//!   `libonnxruntime.dylib` of the macOS `onnxruntime` wheel (it includes
//!   CoreML), and choose [`ExecutionProvider::CoreMl`].
//!
//! # Lower level
//! [`OrtModel`] is the decoder without text: token ids in, ids and
//! [`GenerationStats`] (prefill and decode timings) out. Benchmarks use it,
//! or [`OrtProvider::generate_ids_blocking`] with the provider's own cache.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tokio_util::sync::CancellationToken;
//! use wma_agent::{GenerateRequest, PromptMessage, PromptRole, Provider};
//! use wma_provider_ort::{OrtProvider, OrtProviderOptions};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let provider = OrtProvider::new(OrtProviderOptions::default().with_threads(2))?;
//! provider
//!     .prepare(Arc::new(|p| eprintln!("{} {}/{:?}", p.stage, p.done, p.total)), CancellationToken::new())
//!     .await?;
//! let request = GenerateRequest {
//!     messages: vec![PromptMessage::new(PromptRole::User, "What is the capital of France?")],
//!     ..GenerateRequest::default()
//! };
//! let reply = provider.generate(request, CancellationToken::new()).await?;
//! println!("{} ({:?} tokens)", reply.text, reply.output_tokens);
//! # Ok(())
//! # }
//! ```

mod config;
mod constraint;
pub mod copy;
mod encode;
mod error;
mod hub;
mod logit_positions;
mod model;
mod options;
mod paths;
mod provider;
mod runtime;
mod sampling;
mod template;

pub use config::{GRAPH_CANDIDATES, ModelConfig, ModelFiles, TokenizerConfig};
pub use constraint::{
    ConstraintEngine, ConstraintMatcher, Enforcement, MAX_INTEGER, MAX_JSON_WHITESPACE,
    loose_schema, tighten,
};
pub use encode::PromptEncoder;
pub use error::OrtError;
pub use hub::{DEFAULT_ENDPOINT, download};
pub use model::{
    GenerateParams, GenerationStats, IdGeneration, OrtModel, StopReason, Terminator, common_prefix,
};
pub use options::{
    DEFAULT_KV_CACHE_BYTES, DEFAULT_KV_SESSIONS, DEFAULT_MAX_NEW_TOKENS, ExecutionProvider,
    OrtProviderOptions,
};
pub use paths::{
    DEFAULT_MODEL_NAME, ModelSource, cache_dir, default_model_dir, dylib_path, hub_dir,
    installed_models,
};
pub use provider::{ConstraintTotals, OrtProvider, PROVIDER_NAME};
pub use runtime::{FloatType, GraphIo, LayerIo};
pub use sampling::{Sampler, SamplingOptions, argmax};
pub use template::{CHATML_TEMPLATE, ChatTemplate, RenderedPrompt};
