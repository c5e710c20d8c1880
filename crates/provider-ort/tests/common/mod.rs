//! Finding (or making) the models the tests run on.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;

use parking_lot::Mutex;
use wma_agent::Decoding;
use wma_provider_ort::{OrtProviderOptions, cache_dir, default_model_dir, dylib_path};

/// Folder of the tiny random-weight model inside the cache.
pub const TINY_MODEL: &str = "models/tiny-random-llama";

/// The repository root (the scripts live there).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn cache() -> PathBuf {
    cache_dir().expect("no cache folder: set WMA_CACHE_DIR")
}

/// The Python of the set-up's virtual environment.
pub fn venv_python() -> PathBuf {
    let bin = if cfg!(windows) {
        "Scripts/python.exe"
    } else {
        "bin/python"
    };
    cache().join("venv").join(bin)
}

/// Fails with a clear message when ONNX Runtime is not installed.
pub fn require_runtime() {
    let lib = dylib_path(&cache());
    assert!(
        lib.is_file(),
        "ONNX Runtime library not found at {} (set ORT_DYLIB_PATH, or run scripts/setup.sh)",
        lib.display()
    );
}

/// The tiny model, made with `scripts/make_tiny_model.py` when missing.
pub fn tiny_model() -> PathBuf {
    made_tiny_model(TINY_MODEL, &["onnx/model.onnx", "tokenizer.json"], &[])
}

/// The tiny model in the cache folder `name`, made by
/// `scripts/make_tiny_model.py ARGS` when one of `files` is missing.
pub fn made_tiny_model(name: &str, files: &[&str], args: &[&str]) -> PathBuf {
    // Tests in one binary run in parallel; only one of them makes the model.
    static MAKING: Mutex<()> = Mutex::new(());
    let _guard = MAKING.lock();
    require_runtime();
    let dir = cache().join(name);
    if files.iter().all(|f| dir.join(f).is_file()) {
        return dir;
    }
    let python = venv_python();
    let script = repo_root().join("scripts/make_tiny_model.py");
    assert!(
        python.is_file() && script.is_file(),
        "the tiny test model is missing at {} and cannot be made: {} or {} does not exist (run scripts/setup.sh)",
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
        .args(args)
        .status()
        .expect("could not run the tiny model script");
    assert!(
        status.success(),
        "scripts/make_tiny_model.py {} failed",
        args.join(" ")
    );
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).expect("could not move the tiny model into place");
    dir
}

/// The default model; fails naming the set-up when it is not installed.
pub fn default_model() -> PathBuf {
    require_runtime();
    let dir = default_model_dir(&cache());
    assert!(
        dir.is_dir(),
        "the default model is not installed at {}: run scripts/setup.sh",
        dir.display()
    );
    dir
}

/// Options for the default model's fp32 variant (`onnx/model.onnx`, made by
/// `scripts/setup.sh --fp32`, which the test command runs); fails naming
/// that set-up when the file is missing.
pub fn default_model_fp32() -> OrtProviderOptions {
    let dir = default_model();
    let graph = dir.join("onnx").join("model.onnx");
    assert!(
        graph.is_file(),
        "the default model's fp32 variant is not at {}: run scripts/setup.sh --fp32",
        graph.display()
    );
    options(&dir).with_variant("onnx/model.onnx")
}

/// Options for a model folder, on two threads (the size of CI's machine).
pub fn options(dir: &Path) -> OrtProviderOptions {
    OrtProviderOptions::default()
        .with_model(dir.to_string_lossy())
        .with_threads(2)
}

/// The decoding the loop's small-model policy asks for (docs/providers.md
/// lists these values): bounded values, up to four calls per reply to one
/// tool, a call threshold of 0.5%, a copy bias of 3 and greedy calls.
pub fn small_model_decoding() -> Decoding {
    Decoding {
        avoid_in_values: Vec::new(),
        max_string_chars: Some(100),
        max_array_items: Some(16),
        max_calls: Some(4),
        one_tool_per_reply: true,
        single_call: Vec::new(),
        call_threshold: Some(0.005),
        call_baseline: true,
        copy_bias: 3.0,
        greedy_calls: true,
        finish_cut_calls: Some(64),
        copy_shapes: Vec::new(),
    }
}

/// The largest absolute difference of two logit vectors.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
