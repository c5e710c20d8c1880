//! Finding (or making) the Qwen2 models the tests run on. Included with
//! `#[path = "common/qwen2.rs"] mod qwen2;` next to `mod common;`.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use crate::common::{cache, repo_root, require_runtime, venv_python};

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
    // Tests in one binary run in parallel; only one of them makes the model.
    static MAKING: Mutex<()> = Mutex::new(());
    let _guard = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    require_runtime();
    let dir = cache().join(TINY_QWEN2_MODEL);
    if TINY_FILES.iter().all(|f| dir.join(f).is_file()) {
        return dir;
    }
    let python = venv_python();
    let script = repo_root().join("scripts/make_tiny_model.py");
    assert!(
        python.is_file() && script.is_file(),
        "the tiny Qwen2 test model is missing at {} and cannot be made: {} or {} does not exist (run scripts/setup.sh --tiny-only)",
        dir.display(),
        python.display(),
        script.display()
    );
    // Written beside the target and renamed, so an interrupted run leaves no
    // half-written folder that looks complete.
    let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let status = Command::new(&python)
        .arg(&script)
        .arg(&tmp)
        .args(["--arch", "qwen2"])
        .status()
        .expect("could not run the tiny model script");
    assert!(
        status.success(),
        "scripts/make_tiny_model.py --arch qwen2 failed"
    );
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).expect("could not move the tiny Qwen2 model into place");
    dir
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
