//! The provider on the real default model (SmolLM2-135M-Instruct, 4-bit),
//! as `scripts/setup.sh` installs it. These tests fail, naming the set-up,
//! when the model is not installed.

mod common;

use std::process::Command;

use common::{default_model, options, venv_python};
use tokio_util::sync::CancellationToken;
use wma_agent::{GenerateRequest, PromptMessage, PromptRole, Provider};
use wma_provider_ort::{GenerateParams, OrtProvider};

/// A question whose greedy answer names Paris on every CPU tried. The bare
/// "What is the capital of France?" is a near tie at the first token ("The"
/// leads "L" by 0.08 logits in float32), and on an AVX2-only CPU the 4-bit
/// kernels start "L'Étoile, la Cité…" instead.
const PARIS: &str = "What is the capital of France? Answer in one sentence.";

fn user(text: &str) -> GenerateRequest {
    GenerateRequest {
        messages: vec![PromptMessage::new(PromptRole::User, text)],
        max_new_tokens: Some(40),
        ..GenerateRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_answer_to_the_capital_of_france_names_paris() {
    let provider = OrtProvider::new(options(&default_model())).unwrap();
    provider
        .prepare(std::sync::Arc::new(|_| {}), CancellationToken::new())
        .await
        .unwrap();
    assert!(provider.tools_inline(), "SmolLM2's template has no tools");
    assert_eq!(provider.call_format(), wma_agent::CallFormat::Json);
    let g = provider
        .generate(user(PARIS), CancellationToken::new())
        .await
        .unwrap();
    assert!(g.text.contains("Paris"), "{:?}", g.text);
    assert_eq!(g.finish_reason.as_deref(), Some("stop"));
    assert!(!g.text.contains("<|im_end|>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_stops_a_long_prefill_promptly() {
    let provider = std::sync::Arc::new(OrtProvider::load(options(&default_model())).unwrap());
    // About 1500 tokens: a prefill of seconds on two cores.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(150);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let provider = std::sync::Arc::clone(&provider);
        let cancel = cancel.clone();
        async move { provider.generate(user(&long), cancel).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    cancel.cancel();
    let cancelled_at = std::time::Instant::now();
    let result = task.await.unwrap();
    assert_eq!(result.unwrap_err(), wma_agent::ProviderError::Cancelled);
    assert!(cancelled_at.elapsed() < std::time::Duration::from_millis(500));
    // The model thread stops too: ONNX Runtime was told to terminate, so the
    // model is free long before the prefill (seconds) could have ended.
    let free = tokio::task::spawn_blocking({
        let provider = std::sync::Arc::clone(&provider);
        move || provider.with_model(|_| cancelled_at.elapsed()).unwrap()
    })
    .await
    .unwrap();
    assert!(
        free < std::time::Duration::from_millis(1500),
        "model busy for {free:?}"
    );
    // The next generation works from a consistent cache.
    let started = std::time::Instant::now();
    let g = provider
        .generate(user(PARIS), CancellationToken::new())
        .await
        .unwrap();
    assert!(g.text.contains("Paris"), "{:?}", g.text);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the terminated prefill did not hold the model"
    );
}

/// Greedy ids of `scripts/ort_greedy.py`, an independent loop in Python.
fn python_greedy(dir: &std::path::Path, prompt: &[u32], max_new: usize) -> Vec<u32> {
    let python = venv_python();
    assert!(
        python.is_file(),
        "{} not found: run scripts/setup.sh",
        python.display()
    );
    let ids = prompt
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let out = Command::new(&python)
        .arg(common::repo_root().join("scripts/ort_greedy.py"))
        .arg(dir)
        .args(["--prompt-ids", &ids, "--max-new", &max_new.to_string()])
        .args(["--threads", "2"])
        .output()
        .expect("run scripts/ort_greedy.py");
    assert!(
        out.status.success(),
        "ort_greedy.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ort_greedy.py prints a JSON list of ids")
}

#[test]
fn tokenizing_matches_the_python_tokenizers_package() {
    let dir = default_model();
    let provider = OrtProvider::load(options(&dir)).unwrap();
    let texts = [
        "<|im_start|>user\nWhat is 12345 + 678?<|im_end|>\n<|im_start|>assistant\n",
        "{\"name\": \"add_to_cart\", \"arguments\": {\"product_id\": \"p-17\", \"quantity\": 2}}",
        "Ünïcödé, 日本語のテキスト, emoji 🎒 and   spaces\ttabs\n\nnewlines",
        "def f(x):\n    return x ** 2  # comment",
    ];
    let script = "import json, sys\nfrom tokenizers import Tokenizer\n\
        t = Tokenizer.from_file(sys.argv[1])\n\
        print(json.dumps([t.encode(s, add_special_tokens=False).ids for s in json.load(sys.stdin)]))";
    let python = venv_python();
    assert!(
        python.is_file(),
        "{} not found: run scripts/setup.sh",
        python.display()
    );
    let mut child = Command::new(&python)
        .args(["-c", script])
        .arg(dir.join("tokenizer.json"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&texts).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python tokenizers failed");
    let expected: Vec<Vec<u32>> = serde_json::from_slice(&out.stdout).unwrap();
    for (text, want) in texts.iter().zip(expected) {
        assert_eq!(provider.encode(text).unwrap(), want, "{text:?}");
        assert_eq!(
            provider.decode(&want).unwrap(),
            *text,
            "round trip of {text:?}"
        );
    }
}

#[test]
fn greedy_tokens_equal_the_python_reference_loop() {
    let dir = default_model();
    let provider = OrtProvider::load(options(&dir)).unwrap();
    assert!(
        provider.with_model(|m| m.shares_kv_buffers()).unwrap(),
        "the default model's GroupQueryAttention graph updates the cache in place"
    );
    let stop = provider.stop_ids().unwrap();
    let prompts = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three fruits, separated by commas.",
    ];
    for text in prompts {
        let prompt = provider
            .encode(&provider.render_prompt(&user(text)).unwrap())
            .unwrap();
        // Each prompt from a fresh cache, as the Python loop runs: with 4-bit
        // kernels, reused and recomputed prefixes may differ in the last bits.
        provider.with_model(|m| m.clear_cache()).unwrap();
        let rust = provider
            .generate_ids_blocking(
                &prompt,
                &GenerateParams::greedy(20, stop.clone()),
                &CancellationToken::new(),
            )
            .unwrap()
            .ids;
        let python = python_greedy(&dir, &prompt, 20);
        assert_eq!(rust, python, "prompt {text:?}");
    }
}
