//! The model folder: which files it has, and what its JSON files say.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::OrtError;

/// Graph files tried, in order, when no variant is named. The 4-bit export
/// comes first: on a CPU it is the fastest and smallest of the common exports.
pub const GRAPH_CANDIDATES: [&str; 3] = ["onnx/model_q4.onnx", "onnx/model.onnx", "model.onnx"];

/// The files of a Hugging Face-style ONNX model folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// The folder.
    pub dir: PathBuf,
    /// The ONNX graph.
    pub graph: PathBuf,
    /// `tokenizer.json`.
    pub tokenizer: PathBuf,
}

impl ModelFiles {
    /// Finds the files in `dir`. `variant` names the graph: a path relative to
    /// the folder (`onnx/model_fp16.onnx`), or a short name that becomes
    /// `onnx/model_{variant}.onnx` (`q4`, `fp16`, `int8`).
    pub fn locate(dir: &Path, variant: Option<&str>) -> Result<Self, OrtError> {
        if !dir.is_dir() {
            return Err(OrtError::ModelMissing {
                what: "model folder".into(),
                path: dir.to_path_buf(),
            });
        }
        let graph = match variant {
            Some(v) => {
                let candidates = variant_candidates(v);
                candidates
                    .iter()
                    .map(|c| dir.join(c))
                    .find(|p| p.is_file())
                    .ok_or_else(|| OrtError::ModelMissing {
                        what: format!("graph variant `{v}`"),
                        path: dir.join(&candidates[0]),
                    })?
            }
            None => GRAPH_CANDIDATES
                .iter()
                .map(|c| dir.join(c))
                .find(|p| p.is_file())
                .ok_or_else(|| OrtError::ModelMissing {
                    what: format!("ONNX graph (tried {})", GRAPH_CANDIDATES.join(", ")),
                    path: dir.to_path_buf(),
                })?,
        };
        let tokenizer = dir.join("tokenizer.json");
        if !tokenizer.is_file() {
            return Err(OrtError::ModelMissing {
                what: "tokenizer.json".into(),
                path: tokenizer,
            });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            graph,
            tokenizer,
        })
    }
}

/// The file names a variant may mean, most specific first.
pub(crate) fn variant_candidates(variant: &str) -> Vec<String> {
    if variant.ends_with(".onnx") {
        if variant.contains('/') {
            vec![variant.to_string()]
        } else {
            vec![format!("onnx/{variant}"), variant.to_string()]
        }
    } else {
        vec![
            format!("onnx/model_{variant}.onnx"),
            format!("model_{variant}.onnx"),
        ]
    }
}

/// What `config.json` and `generation_config.json` say about the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConfig {
    /// `model_type` (`llama`, `qwen2`...), when given.
    pub model_type: Option<String>,
    /// Decoder layers: one key and one value cache each.
    pub num_hidden_layers: usize,
    /// Attention heads of the queries.
    pub num_attention_heads: usize,
    /// Heads of the key/value cache (fewer than the query heads with GQA).
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Context window in tokens.
    pub max_position_embeddings: usize,
    /// Vocabulary size, when given.
    pub vocab_size: Option<usize>,
    /// The model's size in parameters, estimated from its shape (embeddings,
    /// attention with its key/value heads, the MLP, an untied LM head) when
    /// `config.json` gives the widths; the loop picks its default policy by
    /// it.
    pub parameters: Option<u64>,
    /// Token ids that end a generation (config and generation config merged).
    pub eos_token_ids: Vec<u32>,
    /// The begin-of-sequence id, when given.
    pub bos_token_id: Option<u32>,
}

impl ModelConfig {
    /// Reads `config.json` and, when present, `generation_config.json`.
    pub fn load(dir: &Path) -> Result<Self, OrtError> {
        let config = read_json(&dir.join("config.json"))?;
        let generation = read_json_opt(&dir.join("generation_config.json"))?;
        Self::from_json(&config, generation.as_ref())
    }

    /// Builds the config from parsed JSON (`config.json`, `generation_config.json`).
    pub fn from_json(config: &Value, generation: Option<&Value>) -> Result<Self, OrtError> {
        // Multimodal configs nest the language model's numbers.
        let text = config.get("text_config").unwrap_or(config);
        let num = |key: &str| text.get(key).and_then(Value::as_u64).map(|v| v as usize);
        let required = |key: &str| {
            num(key).ok_or_else(|| OrtError::invalid("config.json", format!("no `{key}`")))
        };
        let num_hidden_layers = required("num_hidden_layers")?;
        let num_attention_heads = required("num_attention_heads")?;
        let num_key_value_heads = num("num_key_value_heads").unwrap_or(num_attention_heads);
        let head_dim = match num("head_dim") {
            Some(d) => d,
            None => required("hidden_size")? / num_attention_heads.max(1),
        };
        let max_position_embeddings = num("max_position_embeddings")
            .or_else(|| num("n_positions"))
            .unwrap_or(2048);
        let mut eos_token_ids = Vec::new();
        for source in [generation, Some(text), Some(config)].into_iter().flatten() {
            for id in token_ids(source.get("eos_token_id")) {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }
        let bos_token_id = [generation, Some(text), Some(config)]
            .into_iter()
            .flatten()
            .find_map(|v| token_ids(v.get("bos_token_id")).into_iter().next());
        let parameters = (|| {
            let hidden = num("hidden_size")? as u64;
            let inter = num("intermediate_size")? as u64;
            let vocab = num("vocab_size")? as u64;
            let layers = num_hidden_layers as u64;
            let kv = (num_key_value_heads * head_dim) as u64;
            let q = (num_attention_heads * head_dim) as u64;
            let attention = hidden * q * 2 + hidden * kv * 2;
            let mlp = 3 * hidden * inter;
            let tied = text
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let heads = if tied { 1 } else { 2 };
            Some(layers * (attention + mlp) + heads * vocab * hidden)
        })();
        Ok(Self {
            model_type: text
                .get("model_type")
                .and_then(Value::as_str)
                .map(str::to_string),
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings,
            vocab_size: num("vocab_size"),
            parameters,
            eos_token_ids,
            bos_token_id,
        })
    }
}

/// What `tokenizer_config.json` (and its neighbours) say about chat.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenizerConfig {
    /// The chat template's source, when the model has one.
    pub chat_template: Option<String>,
    /// Text of the begin-of-sequence token.
    pub bos_token: Option<String>,
    /// Text of the end-of-sequence token.
    pub eos_token: Option<String>,
}

impl TokenizerConfig {
    /// Reads `tokenizer_config.json`; the template may instead be in
    /// `chat_template.jinja` or `chat_template.json` (newer exports).
    pub fn load(dir: &Path) -> Result<Self, OrtError> {
        let json = read_json_opt(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let mut config = Self::from_json(&json);
        if config.chat_template.is_none() {
            let jinja = dir.join("chat_template.jinja");
            if jinja.is_file() {
                config.chat_template =
                    Some(fs::read_to_string(&jinja).map_err(|e| OrtError::io(&jinja, e))?);
            } else if let Some(v) = read_json_opt(&dir.join("chat_template.json"))? {
                config.chat_template = template_source(v.get("chat_template"));
            }
        }
        Ok(config)
    }

    /// Reads the parsed `tokenizer_config.json`.
    pub fn from_json(json: &Value) -> Self {
        Self {
            chat_template: template_source(json.get("chat_template")),
            bos_token: token_text(json.get("bos_token")),
            eos_token: token_text(json.get("eos_token")),
        }
    }
}

/// A template is a string, or a list of named templates (`default`, `tool_use`).
fn template_source(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
            };
            named("default")
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string)
        }
        _ => None,
    }
}

/// A special token is a string or `{"content": "..."}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// An id field is an integer or a list of integers.
fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_u64)
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

fn read_json(path: &Path) -> Result<Value, OrtError> {
    read_json_opt(path)?.ok_or_else(|| OrtError::ModelMissing {
        what: file_name(path),
        path: path.to_path_buf(),
    })
}

fn read_json_opt(path: &Path) -> Result<Option<Value>, OrtError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = fs::read_to_string(path).map_err(|e| OrtError::io(path, e))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| OrtError::invalid(file_name(path), e))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_size_is_estimated_from_the_shape() {
        // SmolLM2-135M-Instruct's config.json.
        let config = json!({"num_hidden_layers": 30, "num_attention_heads": 9, "hidden_size": 576,
            "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152,
            "tie_word_embeddings": true});
        let n = ModelConfig::from_json(&config, None)
            .unwrap()
            .parameters
            .unwrap();
        assert!((130_000_000..140_000_000).contains(&n), "{n}");
        let partial = json!({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64});
        assert_eq!(
            ModelConfig::from_json(&partial, None).unwrap().parameters,
            None
        );
    }

    #[test]
    fn eos_may_be_an_int_or_a_list_and_generation_config_adds_to_it() {
        let config = json!({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
            "num_key_value_heads": 2, "eos_token_id": 2, "bos_token_id": 1});
        let generation = json!({"eos_token_id": [2, 7]});
        let c = ModelConfig::from_json(&config, Some(&generation)).unwrap();
        assert_eq!(c.eos_token_ids, vec![2, 7]);
        assert_eq!(c.bos_token_id, Some(1));
        assert_eq!(
            c.head_dim, 16,
            "hidden_size / heads when head_dim is absent"
        );
        assert_eq!(c.max_position_embeddings, 2048);
    }

    #[test]
    fn missing_layers_is_an_error() {
        let err = ModelConfig::from_json(&json!({"num_attention_heads": 4}), None).unwrap_err();
        assert!(err.to_string().contains("num_hidden_layers"));
    }

    #[test]
    fn tokens_may_be_objects_and_templates_lists() {
        let c = TokenizerConfig::from_json(&json!({
            "bos_token": {"content": "<s>"}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
        }));
        assert_eq!(c.bos_token.as_deref(), Some("<s>"));
        assert_eq!(c.eos_token.as_deref(), Some("</s>"));
        assert_eq!(c.chat_template.as_deref(), Some("D"));
    }

    #[test]
    fn variants_name_files() {
        assert_eq!(variant_candidates("fp16")[0], "onnx/model_fp16.onnx");
        assert_eq!(variant_candidates("onnx/x.onnx"), vec!["onnx/x.onnx"]);
        assert_eq!(variant_candidates("x.onnx")[0], "onnx/x.onnx");
    }
}
