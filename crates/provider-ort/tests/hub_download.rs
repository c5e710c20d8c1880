//! Hub downloads through `hf-hub`, against the testkit's [`FakeHub`] on
//! the loopback address, which serves the tiny model's folder in a hub's layout
//! (`/{repo}/resolve/{revision}/{file}`, ranged answers with the commit
//! and etag headers a hub sends), so nothing leaves the machine: the
//! standard Hugging Face cache layout at a pinned revision, the token,
//! 404s for optional files, progress, a download that resumes after the
//! connection broke, and a hub id loaded by the provider. The hub, the
//! cache and the token come from `HF_ENDPOINT`, `HF_HOME` and `HF_TOKEN`,
//! set as a user sets them: each test runs its downloads in a child
//! process (this test binary again, with the variables set) and checks
//! what the hub was asked.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::{cache, tiny_model};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use wma_agent::{GenerateRequest, Progress, ProgressFn, PromptMessage, PromptRole, Provider};
use wma_provider_ort::{ModelSource, OrtProvider, OrtProviderOptions, download, dylib_path};
use wma_testkit::{FakeHub, HUB_REVISIONS as REVISIONS};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wma-hub-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Set in a child process: the runtime's own cache folder for it.
const CHILD: &str = "WMA_HUB_TEST_CHILD_CACHE";
/// Set in a child process: the folder the test hub serves.
const SERVED: &str = "WMA_HUB_TEST_SERVED";

/// In a child process: its cache folder and the served folder.
fn child() -> Option<(PathBuf, PathBuf)> {
    Some((
        PathBuf::from(std::env::var_os(CHILD)?),
        PathBuf::from(std::env::var_os(SERVED)?),
    ))
}

/// Runs the test `name` again in a child process against the hub at
/// `endpoint`, with `home` as `HF_HOME`; fails with its output when it fails.
fn run_child(name: &str, endpoint: &str, home: &Path, served: &Path) {
    let wma_cache = home.join("wma-cache");
    let output = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, &wma_cache)
        .env(SERVED, served)
        .env("HF_HOME", home)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_TOKEN", "token-from-env")
        .env_remove("HF_HUB_CACHE")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the child run of {name} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn recorder() -> (ProgressFn, Arc<Mutex<Vec<Progress>>>) {
    let seen = Arc::new(Mutex::new(Vec::<Progress>::new()));
    let log = Arc::clone(&seen);
    (Arc::new(move |p: Progress| log.lock().push(p)), seen)
}

fn no_progress() -> ProgressFn {
    Arc::new(|_| {})
}

fn snapshot(home: &Path, commit: &str) -> PathBuf {
    home.join(format!(
        "hub/models--test-org--tiny-llama/snapshots/{commit}"
    ))
}

const PINNED_TEST: &str = "a_pinned_revision_lands_in_the_standard_cache_with_progress";

#[test]
fn a_pinned_revision_lands_in_the_standard_cache_with_progress() {
    if let Some((wma_cache, served)) = child() {
        let (progress, seen) = recorder();
        let dir = download(
            "test-org/tiny-llama",
            Some("v2"),
            None,
            &wma_cache,
            None,
            &progress,
            &CancellationToken::new(),
        )
        .unwrap();
        let home = PathBuf::from(std::env::var("HF_HOME").unwrap());
        // Hugging Face's own layout, at the commit the revision resolves to.
        assert_eq!(dir, snapshot(&home, REVISIONS[1].1));
        // The model name a config gives finds that snapshot before loading
        // (its parameter count is read from there), and only for its revision.
        assert_eq!(
            ModelSource::parse("test-org/tiny-llama@v2").folder(&wma_cache),
            dir
        );
        assert_ne!(
            ModelSource::parse("test-org/tiny-llama@v1").folder(&wma_cache),
            dir
        );
        for file in [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "onnx/model.onnx",
        ] {
            assert_eq!(
                std::fs::read(dir.join(file)).unwrap(),
                std::fs::read(served.join(file)).unwrap(),
                "{file}"
            );
        }
        let progress = seen.lock().clone();
        let graph = progress
            .iter()
            .rfind(|p| p.stage == "download onnx/model.onnx")
            .expect("progress for the graph");
        let size = std::fs::metadata(served.join("onnx/model.onnx"))
            .unwrap()
            .len();
        assert_eq!((graph.done, graph.total), (size, Some(size)));
        // Once complete, the same download is used as it is.
        let again = download(
            "test-org/tiny-llama",
            Some("v2"),
            None,
            &wma_cache,
            None,
            &no_progress(),
            &CancellationToken::new(),
        )
        .unwrap();
        assert_eq!(again, dir);
        return;
    }
    let source = tiny_model();
    let hub = FakeHub::serve(source.clone(), "test-org/tiny-llama");
    let home = temp("pinned");
    run_child(PINNED_TEST, hub.endpoint(), &home, &source);
    assert_eq!(
        std::fs::read_to_string(home.join("hub/models--test-org--tiny-llama/refs/v2")).unwrap(),
        REVISIONS[1].1
    );
    let seen = hub.requests();
    // Only the pinned revision is asked for, always with the token; the
    // 4-bit graph first (the tiny model has none: a 404, not an error).
    assert!(
        seen.iter().all(|s| s.path.contains("/resolve/v2/")),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .all(|s| s.auth.as_deref() == Some("Bearer token-from-env"))
    );
    assert!(seen.iter().any(|s| s.path.ends_with("onnx/model_q4.onnx")));
    // The second download asked the hub nothing: one probe per file.
    let probes = seen
        .iter()
        .filter(|s| s.path.ends_with("/config.json") && s.range.as_deref() == Some("bytes=0-0"))
        .count();
    assert_eq!(probes, 1, "{seen:?}");
    let _ = std::fs::remove_dir_all(&home);
}

/// The size of the graph of the resume test: three ranged chunks.
const BIG: usize = 25_000_000;
/// hf-hub's chunk.
const CHUNK: usize = 10_000_000;
const RESUME_TEST: &str = "a_broken_download_resumes_where_it_stopped";

#[test]
fn a_broken_download_resumes_where_it_stopped() {
    if let Some((wma_cache, served)) = child() {
        let first = download(
            "test-org/tiny-llama",
            None,
            None,
            &wma_cache,
            None,
            &no_progress(),
            &CancellationToken::new(),
        );
        assert!(first.is_err(), "the broken connection is an error");
        let dir = download(
            "test-org/tiny-llama",
            None,
            None,
            &wma_cache,
            None,
            &no_progress(),
            &CancellationToken::new(),
        )
        .unwrap();
        assert!(
            std::fs::read(dir.join("onnx/model.onnx")).unwrap()
                == std::fs::read(served.join("onnx/model.onnx")).unwrap(),
            "the resumed graph is whole"
        );
        return;
    }
    // A repository whose graph takes three chunks.
    let source = tiny_model();
    let repo = temp("resume-repo");
    std::fs::create_dir_all(repo.join("onnx")).unwrap();
    for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(source.join(file), repo.join(file)).unwrap();
    }
    let graph: Vec<u8> = (0..BIG)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(repo.join("onnx/model.onnx"), &graph).unwrap();
    let hub = FakeHub::serve(repo.clone(), "test-org/tiny-llama");
    // The graph's answers break at its second chunk.
    hub.break_once("onnx/model.onnx", CHUNK as u64);
    let home = temp("resume");
    run_child(RESUME_TEST, hub.endpoint(), &home, &repo);
    let ranges: Vec<String> = hub
        .requests()
        .iter()
        .filter(|s| s.path.ends_with("/onnx/model.onnx"))
        .filter_map(|s| s.range.clone())
        .filter(|r| r != "bytes=0-0")
        .collect();
    // First try: the first chunk, then the broken second. Second try: from
    // the second chunk on, the first not asked for again.
    let second = format!("bytes={CHUNK}-{}", 2 * CHUNK - 1);
    assert_eq!(
        ranges.iter().filter(|r| r.starts_with("bytes=0-")).count(),
        1,
        "{ranges:?}"
    );
    assert_eq!(
        ranges.iter().filter(|r| **r == second).count(),
        2,
        "{ranges:?}"
    );
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::remove_dir_all(&repo);
}

const NO_GRAPH_TEST: &str = "a_repository_without_the_graph_asked_for_is_a_clear_error";

#[test]
fn a_repository_without_the_graph_asked_for_is_a_clear_error() {
    if let Some((wma_cache, _)) = child() {
        let err = download(
            "test-org/tiny-llama",
            None,
            Some("onnx/model_fp16.onnx"),
            &wma_cache,
            None,
            &no_progress(),
            &CancellationToken::new(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("model_fp16.onnx"), "{err}");
        return;
    }
    let source = tiny_model();
    let hub = FakeHub::serve(source.clone(), "test-org/tiny-llama");
    let home = temp("nograph");
    run_child(NO_GRAPH_TEST, hub.endpoint(), &home, &source);
    let _ = std::fs::remove_dir_all(&home);
}

const PROVIDER_TEST: &str = "a_hub_id_is_loaded_by_the_provider";

#[test]
fn a_hub_id_is_loaded_by_the_provider() {
    if let Some((wma_cache, _)) = child() {
        return load_in_child(&wma_cache);
    }
    let source = tiny_model();
    let hub = FakeHub::serve(source.clone(), "test-org/tiny-llama");
    let home = temp("provider");
    run_child(PROVIDER_TEST, hub.endpoint(), &home, &source);
    assert!(
        snapshot(&home, REVISIONS[0].1)
            .join("onnx/model.onnx")
            .is_file()
    );
    let seen = hub.requests();
    // The second provider of the child used the finished download.
    let probes = seen
        .iter()
        .filter(|s| s.path.ends_with("/config.json") && s.range.as_deref() == Some("bytes=0-0"))
        .count();
    assert_eq!(probes, 1, "{seen:?}");
    let _ = std::fs::remove_dir_all(&home);
}

fn load_in_child(wma_cache: &Path) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = OrtProviderOptions::default()
            .with_model("test-org/tiny-llama")
            .with_cache_dir(wma_cache)
            .with_dylib_path(dylib_path(&cache()))
            .with_threads(2);
        let provider = OrtProvider::new(options.clone()).unwrap();
        assert_eq!(provider.info().model, "test-org/tiny-llama");
        provider
            .prepare(Arc::new(|_| {}), CancellationToken::new())
            .await
            .unwrap();
        assert!(
            provider
                .model_dir()
                .starts_with(std::env::var("HF_HOME").unwrap()),
            "{}",
            provider.model_dir().display()
        );
        let g = provider
            .generate(
                GenerateRequest {
                    messages: vec![PromptMessage::new(PromptRole::User, "Hi")],
                    max_new_tokens: Some(4),
                    ..GenerateRequest::default()
                },
                CancellationToken::new(),
            )
            .await
            .unwrap();
        assert!(g.output_tokens.unwrap() >= 1);
        let again = OrtProvider::new(options).unwrap();
        again
            .prepare(Arc::new(|_| {}), CancellationToken::new())
            .await
            .unwrap();
    });
}
