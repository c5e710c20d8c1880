//! Finding (or making) the Qwen2 models the tests run on. Included with
//! `#[path = "common/qwen2.rs"] mod qwen2;` next to `mod common;`.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

use crate::common::{cache, made_tiny_model, require_runtime};

/// Folder of the tiny random-weight Qwen2 model inside the cache.
pub const TINY_QWEN2_MODEL: &str = "models/tiny-random-qwen2";

/// Folder of the Qwen2.5-Coder-0.5B evaluation model inside the cache.
pub const QWEN2_MODEL: &str = "models/Qwen2.5-Coder-0.5B-Instruct";

/// The command that makes [`QWEN2_MODEL`].
pub const QWEN2_SETUP: &str = "scripts/setup.sh --model qwen2.5-coder-0.5b";

/// The files the tiny Qwen2 folder must hold to be complete.
const TINY_FILES: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "onnx/model.onnx",
    "onnx/model_q4.onnx",
    "onnx/model_plain.onnx",
    "onnx/model_q4_ref.onnx",
];

/// The tiny Qwen2 model, made with `scripts/make_tiny_model.py --arch qwen2`
/// (a tiny GGUF through the converter) when missing.
pub fn tiny_qwen2_model() -> PathBuf {
    made_tiny_model(TINY_QWEN2_MODEL, &TINY_FILES, &["--arch", "qwen2"])
}

/// The Qwen2.5-Coder-0.5B folder when it is set up; `None` (after printing
/// which command makes it) when it is not. Tests on it are opt-in.
pub fn qwen2_model() -> Option<PathBuf> {
    let dir = cache().join(QWEN2_MODEL);
    let ready = dir.join("onnx/model_q4.onnx").is_file() && dir.join("tokenizer.json").is_file();
    if !ready {
        eprintln!(
            "skipped: the Qwen2.5-Coder-0.5B evaluation model is not set up at {} (make it with `{QWEN2_SETUP}`)",
            dir.display()
        );
        return None;
    }
    require_runtime();
    Some(dir)
}
