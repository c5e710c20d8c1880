//! A hub model id is downloaded into the cache with progress, then loaded.
//! The hub is a small HTTP server on the loopback address that serves the
//! tiny model's folder, so nothing leaves the machine.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{cache, tiny_model};
use tokio_util::sync::CancellationToken;
use wma_agent::{GenerateRequest, Progress, PromptMessage, PromptRole, Provider};
use wma_provider_ort::{OrtProvider, OrtProviderOptions, dylib_path};

/// Serves `root` as `/{repo}/resolve/main/{file}` until the process ends;
/// returns the endpoint and the list of requested paths.
fn serve(root: PathBuf, repo: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let requested = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&requested);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            // Skip the headers.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .to_string();
            log.lock().unwrap().push(path.clone());
            let prefix = format!("/{repo}/resolve/main/");
            let file = path.strip_prefix(&prefix).map(|f| root.join(f));
            match file.filter(|f| f.is_file()) {
                Some(f) => {
                    let body = std::fs::read(f).unwrap();
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(&body);
                }
                None => {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                }
            }
        }
    });
    (endpoint, requested)
}

fn temp_cache() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wma-hub-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = walk(dir)
        .into_iter()
        .map(|p| {
            p.strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();
    names.sort();
    names
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_id_is_downloaded_with_progress_then_loaded() {
    let source = tiny_model();
    let (endpoint, requested) = serve(source, "test-org/tiny-llama");
    let cache_dir = temp_cache();
    let options = OrtProviderOptions::default()
        .with_model("test-org/tiny-llama")
        .with_cache_dir(&cache_dir)
        .with_dylib_path(dylib_path(&cache()))
        .with_hub_endpoint(&endpoint)
        .with_threads(2);
    let provider = OrtProvider::new(options.clone()).unwrap();
    assert_eq!(provider.info().model, "test-org/tiny-llama");

    let seen = Arc::new(Mutex::new(Vec::<Progress>::new()));
    let progress = {
        let seen = Arc::clone(&seen);
        Arc::new(move |p: Progress| seen.lock().unwrap().push(p))
    };
    provider
        .prepare(progress, CancellationToken::new())
        .await
        .unwrap();

    let folder = cache_dir.join("hub/test-org--tiny-llama");
    assert_eq!(provider.model_dir(), folder);
    let files = file_names(&folder);
    for wanted in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "onnx/model.onnx",
    ] {
        assert!(
            files.contains(&wanted.to_string()),
            "{wanted} missing from {files:?}"
        );
    }
    assert!(!files.iter().any(|f| f.ends_with(".part")), "{files:?}");
    // The 4-bit graph is asked for first; the tiny model has none.
    let paths = requested.lock().unwrap().clone();
    assert!(paths.iter().any(|p| p.ends_with("onnx/model_q4.onnx")));
    let progress = seen.lock().unwrap().clone();
    let graph = progress
        .iter()
        .rfind(|p| p.stage == "download onnx/model.onnx")
        .expect("progress for the graph");
    assert!(graph.done > 0 && graph.total == Some(graph.done));

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

    // A second provider uses the finished download without asking the hub.
    let before = requested.lock().unwrap().len();
    let again = OrtProvider::new(options).unwrap();
    again
        .prepare(Arc::new(|_| {}), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(requested.lock().unwrap().len(), before);
    let _ = std::fs::remove_dir_all(&cache_dir);
}
