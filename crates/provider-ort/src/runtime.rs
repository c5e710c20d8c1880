//! ONNX Runtime itself: loading the shared library once per process,
//! creating sessions, and reading a decoder graph's inputs and outputs.

use std::path::{Path, PathBuf};

use ort::environment::Environment;
use ort::session::Session;
use ort::value::{TensorElementType, ValueType};
use parking_lot::Mutex;

use crate::config::ModelConfig;
use crate::error::OrtError;
use crate::logit_positions;
use crate::options::{ExecutionProvider, OrtProviderOptions};

/// The process's one ONNX Runtime environment and the library it came from.
/// ONNX Runtime allows one environment per process, and a loaded library
/// cannot be swapped, so every provider shares this one.
static ENVIRONMENT: Mutex<Option<(PathBuf, Environment)>> = Mutex::new(None);

/// Loads the library at `dylib` (first call only) and returns the environment.
pub(crate) fn environment(dylib: &Path) -> Result<Environment, OrtError> {
    let mut slot = ENVIRONMENT.lock();
    if let Some((loaded, env)) = slot.as_ref() {
        if loaded != dylib {
            tracing::warn!(
                loaded = %loaded.display(),
                requested = %dylib.display(),
                "ONNX Runtime is already loaded from another file; keeping it"
            );
        }
        return Ok(env.clone());
    }
    if !dylib.is_file() {
        return Err(OrtError::LibraryMissing {
            path: dylib.to_path_buf(),
        });
    }
    let env = ort::init_from(dylib)
        .map_err(|e| OrtError::Runtime(e.to_string()))?
        .with_name("webmcp-agents")
        // On-device means the prompts stay on the device; Microsoft's
        // Windows builds otherwise send usage events.
        .with_telemetry(false)
        .build()
        .map_err(OrtError::runtime)?;
    // ONNX Runtime formats every message at or above this level before
    // `tracing` filters it; verbose session-creation chatter is not wanted.
    env.set_log_level(ort::logging::LogLevel::Warning);
    tracing::debug!(path = %dylib.display(), "loaded ONNX Runtime");
    *slot = Some((dylib.to_path_buf(), env.clone()));
    Ok(env)
}

/// Creates a session for `graph` with the options' threads and execution provider.
pub(crate) fn create_session(
    env: &Environment,
    graph: &Path,
    options: &OrtProviderOptions,
) -> Result<Session, OrtError> {
    // The builder's errors carry the builder, which is neither Send nor
    // Sync; they are turned into text right away.
    let mut builder = Session::builder(env).map_err(OrtError::runtime)?;
    if let Some(n) = options.intra_threads {
        builder = builder.with_intra_threads(n).map_err(OrtError::runtime)?;
    }
    if let Some(n) = options.inter_threads {
        builder = builder.with_inter_threads(n).map_err(OrtError::runtime)?;
    }
    builder = register_execution_provider(builder, options.execution_provider)?;
    // Prompt lookup needs the logits after each drafted token; a graph that
    // keeps only the last position's is loaded with that position made an
    // input (see `logit_positions`). Read whole, as ONNX Runtime would.
    if options.prompt_lookup
        && let Ok(bytes) = std::fs::read(graph)
        && let Some(patched) = logit_positions::expose_positions(&bytes)
    {
        drop(bytes);
        match builder.commit_from_memory(&patched) {
            Ok(session) => {
                tracing::debug!(
                    graph = %graph.display(),
                    "the last position's gather reads `{}`", logit_positions::POSITIONS_INPUT
                );
                return Ok(session);
            }
            Err(e) => tracing::warn!(
                graph = %graph.display(),
                error = %e,
                "could not load the graph with chosen logit positions; prompt lookup will be off"
            ),
        }
    }
    builder
        .commit_from_file(graph)
        .map_err(|e| OrtError::Runtime(format!("could not load {}: {e}", graph.display())))
}

fn register_execution_provider(
    builder: ort::session::builder::SessionBuilder,
    ep: ExecutionProvider,
) -> Result<ort::session::builder::SessionBuilder, OrtError> {
    match ep {
        ExecutionProvider::Cpu => Ok(builder),
        #[cfg(feature = "directml")]
        ExecutionProvider::DirectMl { device_id } => builder
            // DirectML cannot run with memory patterns or parallel execution.
            .with_memory_pattern(false)
            .and_then(|b| b.with_parallel_execution(false))
            .and_then(|b| {
                b.with_execution_providers([ort::ep::DirectML::default()
                    .with_device_id(device_id)
                    .build()
                    .error_on_failure()])
            })
            .map_err(OrtError::runtime),
        #[cfg(feature = "coreml")]
        ExecutionProvider::CoreMl => builder
            .with_execution_providers([ort::ep::CoreML::default().build().error_on_failure()])
            .map_err(OrtError::runtime),
        #[allow(unreachable_patterns)]
        other => Err(OrtError::InvalidOption {
            name: "execution_provider",
            reason: format!(
                "{other:?} needs this crate's `{}` cargo feature",
                match other {
                    ExecutionProvider::DirectMl { .. } => "directml",
                    _ => "coreml",
                }
            ),
        }),
    }
}

/// Element types the KV cache and logits may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FloatType {
    /// 32-bit floats.
    F32,
    /// 16-bit floats (`model_fp16.onnx` exports).
    F16,
}

impl FloatType {
    fn from_ort(ty: TensorElementType, what: &str) -> Result<Self, OrtError> {
        match ty {
            TensorElementType::Float32 => Ok(Self::F32),
            TensorElementType::Float16 => Ok(Self::F16),
            other => Err(OrtError::UnsupportedGraph(format!(
                "{what} has element type {other:?}; only float32 and float16 are supported"
            ))),
        }
    }
}

/// The names of one layer's cache inputs and outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerIo {
    /// Input with the cached keys (`past_key_values.N.key`).
    pub past_key: String,
    /// Input with the cached values (`past_key_values.N.value`).
    pub past_value: String,
    /// Output with keys for past and new tokens (`present.N.key`).
    pub present_key: String,
    /// Output with values for past and new tokens (`present.N.value`).
    pub present_value: String,
}

/// What a decoder graph takes and gives, read from the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphIo {
    /// The token ids input.
    pub input_ids: String,
    /// The attention mask input (past and new tokens), when the graph has one.
    pub attention_mask: Option<String>,
    /// The positions input, when the graph has one (GroupQueryAttention
    /// exports derive positions from the mask instead).
    pub position_ids: Option<String>,
    /// `use_cache_branch` of merged decoders, when present.
    pub use_cache_branch: Option<String>,
    /// Which positions' logits a run gives, when the graph was loaded with
    /// that input (graphs that keep only the last position, loaded for
    /// prompt lookup; see [`OrtProviderOptions::prompt_lookup`]).
    pub logits_positions: Option<String>,
    /// The cache inputs and outputs, one entry per layer in layer order.
    pub layers: Vec<LayerIo>,
    /// Element type of the cache tensors.
    pub kv_type: FloatType,
    /// Heads in the cache tensors (`[batch, heads, sequence, head_dim]`).
    pub kv_heads: usize,
    /// Width of one head in the cache tensors.
    pub head_dim: usize,
    /// The logits output.
    pub logits: String,
    /// Element type of the logits.
    pub logits_type: FloatType,
}

impl GraphIo {
    /// Reads the session's inputs and outputs, taking sizes the graph leaves
    /// symbolic from `config`.
    pub fn discover(session: &Session, config: &ModelConfig) -> Result<Self, OrtError> {
        let input_names: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        let output_names: Vec<&str> = session.outputs().iter().map(|o| o.name()).collect();
        let describe = || {
            format!(
                "inputs [{}], outputs [{}]",
                input_names.join(", "),
                output_names.join(", ")
            )
        };

        let mut input_ids = None;
        let mut attention_mask = None;
        let mut position_ids = None;
        let mut use_cache_branch = None;
        let mut logits_positions = None;
        let mut past: Vec<(usize, bool, String, ValueType)> = Vec::new();
        for input in session.inputs() {
            let name = input.name();
            match name {
                "input_ids" => input_ids = Some(name.to_string()),
                "attention_mask" => attention_mask = Some(name.to_string()),
                "position_ids" => position_ids = Some(name.to_string()),
                "use_cache_branch" => use_cache_branch = Some(name.to_string()),
                logit_positions::POSITIONS_INPUT => logits_positions = Some(name.to_string()),
                _ => match cache_slot(name, "past") {
                    Some((layer, is_key)) => {
                        past.push((layer, is_key, name.to_string(), input.dtype().clone()))
                    }
                    None => {
                        return Err(OrtError::UnsupportedGraph(format!(
                            "unknown input `{name}` ({})",
                            describe()
                        )));
                    }
                },
            }
        }
        for (name, dtype) in [
            (&input_ids, "input_ids"),
            (&attention_mask, "attention_mask"),
            (&position_ids, "position_ids"),
        ]
        .iter()
        .filter_map(|(n, label)| n.as_ref().map(|n| (n, *label)))
        {
            let ty = session
                .inputs()
                .iter()
                .find(|i| i.name() == name.as_str())
                .and_then(|i| i.dtype().tensor_type());
            if ty != Some(TensorElementType::Int64) {
                return Err(OrtError::UnsupportedGraph(format!(
                    "{dtype} must be int64, the graph has {ty:?}"
                )));
            }
        }
        let input_ids = input_ids.ok_or_else(|| {
            OrtError::UnsupportedGraph(format!("no `input_ids` input ({})", describe()))
        })?;

        let mut presents: Vec<(usize, bool, String)> = Vec::new();
        let mut logits = None;
        for output in session.outputs() {
            let name = output.name();
            if name == "logits" {
                let ty = output
                    .dtype()
                    .tensor_type()
                    .ok_or_else(|| OrtError::UnsupportedGraph("`logits` is not a tensor".into()))?;
                logits = Some((name.to_string(), FloatType::from_ort(ty, "logits")?));
            } else if let Some((layer, is_key)) = cache_slot(name, "present") {
                presents.push((layer, is_key, name.to_string()));
            }
        }
        let (logits, logits_type) = logits.ok_or_else(|| {
            OrtError::UnsupportedGraph(format!("no `logits` output ({})", describe()))
        })?;

        let layer_count = past.iter().map(|p| p.0 + 1).max().unwrap_or(0);
        if layer_count == 0 {
            return Err(OrtError::UnsupportedGraph(format!(
                "no past_key_values inputs: the graph has no KV cache ({})",
                describe()
            )));
        }
        if layer_count != config.num_hidden_layers {
            tracing::warn!(
                graph = layer_count,
                config = config.num_hidden_layers,
                "the graph and config.json disagree on the number of layers; using the graph's"
            );
        }
        let find_past = |layer: usize, key: bool| {
            past.iter()
                .find(|p| p.0 == layer && p.1 == key)
                .ok_or_else(|| {
                    OrtError::UnsupportedGraph(format!(
                        "no past {} input for layer {layer}",
                        if key { "key" } else { "value" }
                    ))
                })
        };
        let find_present = |layer: usize, key: bool| {
            presents
                .iter()
                .find(|p| p.0 == layer && p.1 == key)
                .map(|p| p.2.clone())
                .ok_or_else(|| {
                    OrtError::UnsupportedGraph(format!(
                        "no present {} output for layer {layer}",
                        if key { "key" } else { "value" }
                    ))
                })
        };
        let mut layers = Vec::with_capacity(layer_count);
        for layer in 0..layer_count {
            layers.push(LayerIo {
                past_key: find_past(layer, true)?.2.clone(),
                past_value: find_past(layer, false)?.2.clone(),
                present_key: find_present(layer, true)?,
                present_value: find_present(layer, false)?,
            });
        }

        let first = &find_past(0, true)?.3;
        let kv_type = FloatType::from_ort(
            first.tensor_type().ok_or_else(|| {
                OrtError::UnsupportedGraph("past key input is not a tensor".into())
            })?,
            "the KV cache",
        )?;
        let shape = first.tensor_shape().map(|s| s.to_vec()).unwrap_or_default();
        if shape.len() != 4 {
            return Err(OrtError::UnsupportedGraph(format!(
                "past key input has shape {shape:?}; expected [batch, heads, sequence, head_dim]"
            )));
        }
        let fixed = |dim: i64, fallback: usize| usize::try_from(dim).unwrap_or(fallback);
        let kv_heads = fixed(shape[1], config.num_key_value_heads);
        let head_dim = fixed(shape[3], config.head_dim);

        Ok(Self {
            input_ids,
            attention_mask,
            position_ids,
            use_cache_branch,
            logits_positions,
            layers,
            kv_type,
            kv_heads,
            head_dim,
            logits,
            logits_type,
        })
    }
}

/// Reads `past_key_values.3.key` / `present.3.value` (and similar spellings:
/// `past.3.key`, `past_key_values.3.decoder.key`) as (layer, is_key).
fn cache_slot(name: &str, prefix: &str) -> Option<(usize, bool)> {
    if !name.starts_with(prefix) {
        return None;
    }
    let is_key = if name.ends_with("key") {
        true
    } else if name.ends_with("value") {
        false
    } else {
        return None;
    };
    let layer = name
        .split(['.', '_'])
        .find_map(|part| part.parse::<usize>().ok())?;
    Some((layer, is_key))
}

#[cfg(test)]
mod tests {
    use super::cache_slot;

    #[test]
    fn cache_names_are_read() {
        assert_eq!(
            cache_slot("past_key_values.12.key", "past"),
            Some((12, true))
        );
        assert_eq!(
            cache_slot("past_key_values.0.value", "past"),
            Some((0, false))
        );
        assert_eq!(cache_slot("present.3.value", "present"), Some((3, false)));
        assert_eq!(
            cache_slot("present_key_values.3.key", "present"),
            Some((3, true))
        );
        assert_eq!(cache_slot("logits", "present"), None);
        assert_eq!(cache_slot("past_key_values.key", "past"), None);
    }
}
