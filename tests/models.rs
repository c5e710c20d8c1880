//! `wma models pull`, `wma models` and `wma models rm` through the real
//! binary, against the testkit's hub on loopback serving the tiny model's
//! folder in a hub's layout: a pulled repository is listed with where it
//! came from, loads by its name, and is removed without touching the
//! Hugging Face cache; a repository without the files the provider needs,
//! a hub that cannot be reached and a gated repository are errors that say
//! so; the models the set-up converts are named with their set-up command.
//! Each command runs with its own runtime cache (`WMA_CACHE_DIR`) and
//! Hugging Face cache (`HF_HUB_CACHE`) in a temporary folder, and the hub
//! from `HF_ENDPOINT`: nothing is downloaded from anywhere else.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use wma_provider_ort::{cache_dir, dylib_path};
use wma_testkit::{FakeHub, HUB_REVISIONS};

/// The repository the hub serves.
const REPO: &str = "test-org/tiny-llama";

/// The tiny random-weight model the set-up makes: what the hub serves.
fn tiny_model() -> PathBuf {
    let dir = cache_dir()
        .expect("a cache folder")
        .join("models/tiny-random-llama");
    assert!(
        dir.join("onnx/model.onnx").is_file(),
        "the tiny test model is missing at {}: run scripts/setup.sh",
        dir.display()
    );
    dir
}

/// A folder of its own under the system's temporary folder, removed on
/// drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wma-models-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A runtime cache and a Hugging Face cache of their own, and the hub
/// they are pointed at.
struct Env {
    root: TempDir,
    endpoint: String,
    token: Option<String>,
}

impl Env {
    fn new(endpoint: &str) -> Self {
        Self {
            root: TempDir::new(),
            endpoint: endpoint.to_string(),
            token: None,
        }
    }

    fn cache(&self) -> PathBuf {
        self.root.path().join("wma-cache")
    }

    fn hub_cache(&self) -> PathBuf {
        self.root.path().join("hf-hub")
    }

    /// The snapshot folder of the repository at `commit`.
    fn snapshot(&self, commit: &str) -> PathBuf {
        self.hub_cache()
            .join("models--test-org--tiny-llama/snapshots")
            .join(commit)
    }

    /// Runs `wma ARGS` in the temporary folder.
    fn wma(&self, args: &[&str]) -> Output {
        // The library is the set-up's; only the caches are the test's own.
        let library = dylib_path(&cache_dir().expect("a cache folder"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_wma"));
        command
            .args(args)
            .current_dir(self.root.path())
            .env("WMA_CACHE_DIR", self.cache())
            .env("HF_HUB_CACHE", self.hub_cache())
            .env("HF_ENDPOINT", &self.endpoint)
            .env("ORT_DYLIB_PATH", library)
            .env_remove("HF_HOME")
            .env_remove("HF_TOKEN")
            .env_remove("WMA_MODEL")
            .stdin(std::process::Stdio::null());
        if let Some(token) = &self.token {
            command.env("HF_TOKEN", token);
        }
        command.output().expect("wma runs")
    }
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The row of `wma models` for `name`, if listed.
fn row(listing: &Output, name: &str) -> Option<String> {
    stdout(listing)
        .lines()
        .find(|l| l.starts_with(&format!("| {name} |")))
        .map(str::to_string)
}

/// Every file under `dir`, links not followed.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            found.extend(files(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn a_pulled_repository_is_listed_loaded_by_its_name_and_removed_leaving_the_hub_cache() {
    let source = tiny_model();
    let hub = FakeHub::serve(&source, REPO);
    let env = Env::new(hub.endpoint());

    let pulled = env.wma(&["models", "pull", REPO]);
    assert!(pulled.status.success(), "{}", text(&pulled));
    assert!(
        stdout(&pulled).contains("run it with --model tiny-llama"),
        "{}",
        text(&pulled)
    );
    // Installed as a link to the snapshot of the commit `main` resolves to.
    let link = env.cache().join("models/tiny-llama");
    let snapshot = env.snapshot(HUB_REVISIONS[0].1);
    assert!(link.is_symlink(), "{}", link.display());
    assert_eq!(std::fs::read_link(&link).unwrap(), snapshot);
    assert_eq!(
        std::fs::read(link.join("onnx/model.onnx")).unwrap(),
        std::fs::read(source.join("onnx/model.onnx")).unwrap()
    );

    let listing = env.wma(&["models"]);
    assert!(listing.status.success(), "{}", text(&listing));
    let line = row(&listing, "tiny-llama").unwrap_or_else(|| panic!("{}", text(&listing)));
    assert!(
        line.contains("| llama |") && line.contains("| hub test-org/tiny-llama (1111111) |"),
        "{line}"
    );
    // The size on disk is the blobs' (the snapshot's files are links).
    assert!(line.ends_with("| <1 MB |"), "{line}");
    assert!(line.contains("fp32 (<1 MB)"), "{line}");

    // Pulled again: nothing to do, and the hub is not asked.
    let asked = hub.requests().len();
    let again = env.wma(&["models", "pull", REPO]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        stdout(&again).contains("installed already"),
        "{}",
        text(&again)
    );
    assert_eq!(hub.requests().len(), asked);

    // A config's `model = "NAME"` runs on it.
    std::fs::write(
        env.root.path().join("tiny.toml"),
        "[providers.tiny]\nkind = \"onnx\"\nmodel = \"tiny-llama\"\nthreads = 1\nmax_new_tokens = 4\n\n[agents.a]\nmax_steps = 1\n",
    )
    .unwrap();
    let run = env.wma(&["run", "--config", "tiny.toml", "hi"]);
    let out = stdout(&run);
    assert!(
        out.contains("── step 1 ──") && out.contains("assistant:"),
        "{}",
        text(&run)
    );
    // A random-weight model answers or runs out of tokens, nothing else.
    assert!(matches!(run.status.code(), Some(0 | 5)), "{}", text(&run));

    let blobs = files(&env.hub_cache());
    let removed = env.wma(&["models", "rm", "tiny-llama"]);
    assert!(removed.status.success(), "{}", text(&removed));
    assert!(
        stdout(&removed).contains("stay in the Hugging Face cache"),
        "{}",
        text(&removed)
    );
    assert!(!link.is_symlink() && !link.exists());
    // Every file of the Hugging Face cache is still there, and whole.
    assert_eq!(files(&env.hub_cache()), blobs);
    assert!(snapshot.join("onnx/model.onnx").is_file());
    let listing = env.wma(&["models"]);
    assert!(row(&listing, "tiny-llama").is_none(), "{}", text(&listing));
}

#[test]
fn a_name_taken_is_kept_unless_forced_and_a_pinned_revision_is_listed() {
    let hub = FakeHub::serve(tiny_model(), REPO);
    let env = Env::new(hub.endpoint());
    let pulled = env.wma(&["models", "pull", REPO]);
    assert!(pulled.status.success(), "{}", text(&pulled));

    // Another revision under the same name: refused, the link kept.
    let refused = env.wma(&["models", "pull", "test-org/tiny-llama@v2"]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    let said = text(&refused);
    assert!(
        said.contains("installed already") && said.contains("--force"),
        "{said}"
    );
    let link = env.cache().join("models/tiny-llama");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        env.snapshot(HUB_REVISIONS[0].1)
    );

    let forced = env.wma(&["models", "pull", REPO, "--revision", "v2", "--force"]);
    assert!(forced.status.success(), "{}", text(&forced));
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        env.snapshot(HUB_REVISIONS[1].1)
    );
    let listing = env.wma(&["models"]);
    let line = row(&listing, "tiny-llama").unwrap_or_else(|| panic!("{}", text(&listing)));
    assert!(
        line.contains("| hub test-org/tiny-llama@v2 (2222222) |"),
        "{line}"
    );
    // The first snapshot is still in the Hugging Face cache.
    assert!(
        env.snapshot(HUB_REVISIONS[0].1)
            .join("config.json")
            .is_file()
    );

    // The Hugging Face cache deleted under the link: no model is listed,
    // and a pull installs it again without --force.
    std::fs::remove_dir_all(env.hub_cache()).unwrap();
    let listing = env.wma(&["models"]);
    assert!(row(&listing, "tiny-llama").is_none(), "{}", text(&listing));
    let pulled = env.wma(&["models", "pull", "test-org/tiny-llama@v2"]);
    assert!(pulled.status.success(), "{}", text(&pulled));
    assert!(link.join("onnx/model.onnx").is_file());
}

#[test]
fn a_repository_without_the_files_the_provider_needs_is_not_installed() {
    // No tokenizer: not a model folder in the ONNX layout.
    let source = tiny_model();
    let partial = TempDir::new();
    std::fs::create_dir_all(partial.path().join("onnx")).unwrap();
    for file in ["config.json", "onnx/model.onnx"] {
        std::fs::copy(source.join(file), partial.path().join(file)).unwrap();
    }
    let hub = FakeHub::serve(partial.path(), REPO);
    let env = Env::new(hub.endpoint());
    let failed = env.wma(&["models", "pull", REPO]);
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
    let said = text(&failed);
    assert!(
        said.contains("tokenizer.json") && said.contains("ONNX layout"),
        "{said}"
    );
    assert!(!env.cache().join("models/tiny-llama").exists());

    // No graph of the variant asked for.
    let hub = FakeHub::serve(&source, REPO);
    let env = Env::new(hub.endpoint());
    let failed = env.wma(&["models", "pull", REPO, "--variant", "onnx/model_fp16.onnx"]);
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
    assert!(
        text(&failed).contains("model_fp16.onnx"),
        "{}",
        text(&failed)
    );
    assert!(!env.cache().join("models/tiny-llama").exists());
}

#[test]
fn a_hub_that_cannot_be_reached_is_named() {
    // A port nobody listens on any more.
    let endpoint = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let env = Env::new(&endpoint);
    let failed = env.wma(&["models", "pull", REPO]);
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
    let said = text(&failed);
    assert!(
        said.contains(&format!("cannot reach the hub at {endpoint}"))
            && said.contains("$HF_ENDPOINT"),
        "{said}"
    );
}

#[test]
fn a_gated_repository_asks_for_hf_token() {
    let hub = FakeHub::serve(tiny_model(), REPO);
    hub.require_token("hf-secret");
    let mut env = Env::new(hub.endpoint());
    let failed = env.wma(&["models", "pull", REPO]);
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
    assert!(text(&failed).contains("set $HF_TOKEN"), "{}", text(&failed));

    env.token = Some("another-token".into());
    let refused = env.wma(&["models", "pull", REPO]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains("refused the token"),
        "{}",
        text(&refused)
    );

    env.token = Some("hf-secret".into());
    let pulled = env.wma(&["models", "pull", REPO]);
    assert!(pulled.status.success(), "{}", text(&pulled));
    assert!(env.cache().join("models/tiny-llama/config.json").is_file());
}

#[test]
fn the_models_the_set_up_converts_are_named_with_its_command() {
    let hub = FakeHub::serve(tiny_model(), REPO);
    let env = Env::new(hub.endpoint());
    for name in ["qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct"] {
        let failed = env.wma(&["models", "pull", name]);
        assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
        assert!(
            text(&failed).contains("scripts/setup.sh --model qwen2.5-coder-0.5b`"),
            "{}",
            text(&failed)
        );
    }
    // Installed already: nothing to do.
    let default = env.cache().join("models/SmolLM2-135M-Instruct");
    std::fs::create_dir_all(&default).unwrap();
    std::fs::copy(
        tiny_model().join("config.json"),
        default.join("config.json"),
    )
    .unwrap();
    let installed = env.wma(&["models", "pull", "smollm2-135m"]);
    assert!(installed.status.success(), "{}", text(&installed));
    assert!(
        stdout(&installed).contains("installed already"),
        "{}",
        text(&installed)
    );
    // Not a hub id and not a known name.
    let failed = env.wma(&["models", "pull", "no-such-model"]);
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
    assert!(
        text(&failed).contains("neither a hub repository id"),
        "{}",
        text(&failed)
    );
    assert!(hub.requests().is_empty(), "{:?}", hub.requests());
}

#[test]
fn a_variant_outside_the_default_graphs_is_named_in_the_command_to_run_it() {
    let hub = FakeHub::serve(tiny_model(), REPO);
    let env = Env::new(hub.endpoint());
    let pulled = env.wma(&["models", "pull", REPO, "--variant", "onnx/model_gqa.onnx"]);
    assert!(pulled.status.success(), "{}", text(&pulled));
    // Only that graph was fetched: `--model tiny-llama` alone finds none.
    assert!(
        stdout(&pulled).contains("run it with --model tiny-llama --variant onnx/model_gqa.onnx"),
        "{}",
        text(&pulled)
    );
    let listing = env.wma(&["models"]);
    let line = row(&listing, "tiny-llama").unwrap_or_else(|| panic!("{}", text(&listing)));
    assert!(line.contains("| gqa (<1 MB) |"), "{line}");
}
