//! Downloading a model folder from a Hugging Face-style hub, through the
//! `hf-hub` crate (its tokio API).
//!
//! Files land in the standard Hugging Face cache that other tools share
//! (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`:
//! `models--org--name/blobs` and `snapshots/COMMIT/`), at a pinned
//! revision (a branch, tag or commit; `main` when none is given). A file
//! is fetched in ranged chunks into a `.sync.part` file that records how
//! far it got, so an interrupted download resumes where it stopped, and a
//! file is only moved into the snapshot when complete. `$HF_TOKEN` (else
//! the cache's `token` file) is sent for gated models; `$HF_ENDPOINT`
//! names another hub. Only the files the provider reads are fetched.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hf_hub::api::tokio::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, CacheRepo, Repo, RepoType};
use tokio_util::sync::CancellationToken;
use wma_agent::{Progress, ProgressFn};

use crate::config::{GRAPH_CANDIDATES, variant_candidates};
use crate::error::OrtError;
use crate::paths;

/// The hub used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The revision fetched when none is pinned.
const DEFAULT_REVISION: &str = "main";

/// The bytes fetched per ranged request: also how much an interrupted
/// download can lose.
const DEFAULT_CHUNK_BYTES: usize = 10_000_000;

/// Written into `CACHE/hub/org--name/` when every file is there; holds the
/// revision, the variant and the snapshot folder.
const COMPLETE_MARKER: &str = ".download-complete";

/// Files every model needs.
const REQUIRED: [&str; 3] = ["config.json", "tokenizer.json", "tokenizer_config.json"];
/// Files read when present.
const OPTIONAL: [&str; 4] = [
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// Where and how [`download_with`] fetches.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HubOptions {
    /// The hub (`https://huggingface.co`).
    endpoint: String,
    /// The revision: a branch, a tag or a commit.
    revision: String,
    /// The Hugging Face cache folder (the one holding `models--*`).
    hub_cache: PathBuf,
    /// The bearer token, for gated models.
    token: Option<String>,
    /// Bytes per ranged request ([`DEFAULT_CHUNK_BYTES`]).
    chunk_bytes: usize,
}

impl HubOptions {
    /// The options the ecosystem's variables give: `endpoint`, else
    /// `$HF_ENDPOINT`, else [`DEFAULT_ENDPOINT`]; the cache of
    /// [`hub_cache_dir`]; `$HF_TOKEN`, else the cache's token file.
    fn from_env(endpoint: Option<&str>, revision: Option<&str>) -> Self {
        let hub_cache = hub_cache_dir();
        let token = non_empty_var("HF_TOKEN").or_else(|| Cache::new(hub_cache.clone()).token());
        Self {
            endpoint: endpoint
                .map(str::to_string)
                .filter(|s| !s.is_empty())
                .or_else(|| non_empty_var("HF_ENDPOINT"))
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            revision: revision.unwrap_or(DEFAULT_REVISION).to_string(),
            hub_cache,
            token,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
        }
    }
}

/// The standard Hugging Face cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`,
/// else `~/.cache/huggingface/hub`.
fn hub_cache_dir() -> PathBuf {
    if let Some(dir) = non_empty_var("HF_HUB_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(home) = non_empty_var("HF_HOME") {
        return PathBuf::from(home).join("hub");
    }
    let home = non_empty_var("HOME")
        .or_else(|| non_empty_var("USERPROFILE"))
        .unwrap_or_default();
    PathBuf::from(home)
        .join(".cache")
        .join("huggingface")
        .join("hub")
}

fn non_empty_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Downloads `repo` (`org/name`) at `revision` (`main` when `None`) into
/// the Hugging Face cache and returns its snapshot folder. The graph is
/// `variant` when given, else the first of [`GRAPH_CANDIDATES`] the hub
/// has. The hub is `endpoint`, else `$HF_ENDPOINT`, else
/// [`DEFAULT_ENDPOINT`]; `$HF_TOKEN` is sent for gated models. `cache` (the
/// runtime's own cache folder) keeps a note of finished downloads, so a
/// model once complete starts offline.
pub fn download(
    repo: &str,
    revision: Option<&str>,
    variant: Option<&str>,
    cache: &Path,
    endpoint: Option<&str>,
    progress: &ProgressFn,
    cancel: &CancellationToken,
) -> Result<PathBuf, OrtError> {
    let options = HubOptions::from_env(endpoint, revision);
    download_with(repo, variant, cache, &options, progress, cancel)
}

/// The snapshot folder of a finished download of `repo` at `revision`
/// (any variant), from the note [`download`] leaves; `None` before one.
pub(crate) fn finished_snapshot(
    cache: &Path,
    repo: &str,
    revision: Option<&str>,
) -> Option<PathBuf> {
    let note = fs::read_to_string(paths::hub_dir(cache, repo).join(COMPLETE_MARKER)).ok()?;
    let mut lines = note.lines();
    if lines.next()? != revision.unwrap_or(DEFAULT_REVISION) {
        return None;
    }
    let snapshot = PathBuf::from(lines.nth(1)?);
    snapshot.join("config.json").is_file().then_some(snapshot)
}

/// [`download`] with every setting given.
fn download_with(
    repo: &str,
    variant: Option<&str>,
    cache: &Path,
    options: &HubOptions,
    progress: &ProgressFn,
    cancel: &CancellationToken,
) -> Result<PathBuf, OrtError> {
    let note_dir = paths::hub_dir(cache, repo);
    let marker = note_dir.join(COMPLETE_MARKER);
    let wanted = format!("{}\n{}\n", options.revision, variant.unwrap_or_default());
    // A finished download is used offline: the optional files it lacks
    // would otherwise be asked for again on every start.
    if let Ok(note) = fs::read_to_string(&marker)
        && let Some(snapshot) = note.strip_prefix(&wanted)
    {
        let snapshot = PathBuf::from(snapshot.trim_end());
        if snapshot.join("config.json").is_file() {
            return Ok(snapshot);
        }
    }
    let repo_id = repo.to_string();
    let variant = variant.map(str::to_string);
    let options = options.clone();
    let progress = progress.clone();
    let cancel = cancel.clone();
    // Its own thread and runtime: the caller may be a blocking thread of
    // another runtime, where a runtime cannot be started.
    let snapshot = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| OrtError::Download {
                        url: options.endpoint.clone(),
                        reason: format!("cannot start the download: {e}"),
                    })?;
                runtime.block_on(async {
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => Err(OrtError::Cancelled),
                        result = fetch_all(&repo_id, variant.as_deref(), &options, &progress) => result,
                    }
                })
            })
            .join()
            .unwrap_or_else(|_| {
                Err(OrtError::Download {
                    url: options.endpoint.clone(),
                    reason: "the download thread panicked".into(),
                })
            })
    })?;
    fs::create_dir_all(&note_dir).map_err(|e| OrtError::io(&note_dir, e))?;
    fs::write(&marker, format!("{wanted}{}", snapshot.display()))
        .map_err(|e| OrtError::io(&marker, e))?;
    Ok(snapshot)
}

/// Fetches the model's files; returns the snapshot folder.
async fn fetch_all(
    repo: &str,
    variant: Option<&str>,
    options: &HubOptions,
    progress: &ProgressFn,
) -> Result<PathBuf, OrtError> {
    let api = ApiBuilder::from_cache(Cache::new(options.hub_cache.clone()))
        .with_endpoint(options.endpoint.trim_end_matches('/').to_string())
        .with_token(options.token.clone())
        .with_chunk_size(Some(options.chunk_bytes.max(1)))
        // The progress bar is the caller's (the ProgressFn).
        .with_progress(false)
        .build()
        .map_err(|e| OrtError::Download {
            url: options.endpoint.clone(),
            reason: e.to_string(),
        })?;
    let pinned = Repo::with_revision(repo.to_string(), RepoType::Model, options.revision.clone());
    let hub = Hub {
        repo: api.repo(pinned.clone()),
        cached: Cache::new(options.hub_cache.clone()).repo(pinned),
        progress: progress.clone(),
        endpoint: options.endpoint.clone(),
        token: options.token.is_some(),
    };
    let mut snapshot = None;
    for file in REQUIRED {
        let path = hub.fetch(file).await?;
        snapshot.get_or_insert(snapshot_of(&path, file));
    }
    for file in OPTIONAL {
        hub.fetch_optional(file).await?;
    }
    let candidates: Vec<String> = match variant {
        Some(v) => variant_candidates(v),
        None => GRAPH_CANDIDATES.iter().map(|s| s.to_string()).collect(),
    };
    let mut graph = None;
    for candidate in &candidates {
        if hub.fetch_optional(candidate).await?.is_some() {
            graph = Some(candidate.clone());
            break;
        }
    }
    let graph = graph.ok_or_else(|| OrtError::Download {
        url: hub.repo.url(&candidates[0]),
        reason: format!("the repository has none of {}", candidates.join(", ")),
    })?;
    // Graphs over 2 GB keep their weights in a side file.
    for suffix in ["_data", ".data"] {
        hub.fetch_optional(&format!("{graph}{suffix}")).await?;
    }
    snapshot.ok_or_else(|| OrtError::Download {
        url: options.endpoint.clone(),
        reason: "no file was downloaded".into(),
    })
}

/// The snapshot folder a file of the repository was put in.
fn snapshot_of(path: &Path, file: &str) -> PathBuf {
    let mut dir = path.to_path_buf();
    for _ in Path::new(file).components() {
        dir.pop();
    }
    dir
}

struct Hub {
    repo: ApiRepo,
    cached: CacheRepo,
    progress: ProgressFn,
    /// The hub asked, named when it cannot be reached.
    endpoint: String,
    /// Whether a token was sent: a refusal then means something else.
    token: bool,
}

impl Hub {
    async fn fetch(&self, file: &str) -> Result<PathBuf, OrtError> {
        self.fetch_optional(file)
            .await?
            .ok_or_else(|| OrtError::Download {
                url: self.repo.url(file),
                reason: format!(
                    "not found: the repository does not exist at this revision, or it is not a model \
                     folder in the ONNX layout (the provider needs {}, and an ONNX graph)",
                    REQUIRED.join(", ")
                ),
            })
    }

    /// The file in the cache, downloaded first unless it is there; `None`
    /// when the hub does not have it.
    async fn fetch_optional(&self, file: &str) -> Result<Option<PathBuf>, OrtError> {
        let bar = Bar {
            progress: self.progress.clone(),
            stage: Arc::new(format!("download {file}")),
            done: Arc::new(AtomicU64::new(0)),
            reported: Arc::new(AtomicU64::new(0)),
            total: Arc::new(AtomicU64::new(0)),
        };
        // The cache first (a file of this revision already there), then
        // the hub.
        if let Some(path) = self.cached.get(file) {
            return Ok(Some(path));
        }
        match self.repo.download_with_progress(file, bar).await {
            Ok(path) => Ok(Some(path)),
            Err(ApiError::RequestError(e)) if e.status().is_some_and(|s| s.as_u16() == 404) => {
                Ok(None)
            }
            Err(e) => Err(OrtError::Download {
                url: self.repo.url(file),
                reason: failure(&e, &self.endpoint, self.token),
            }),
        }
    }
}

/// What a failed request means to whoever asked for the model: a hub that
/// cannot be reached names the hub and `$HF_ENDPOINT`, a refusal names
/// `$HF_TOKEN`; anything else is `hf-hub`'s own words.
fn failure(error: &ApiError, endpoint: &str, token: bool) -> String {
    let request = match error {
        ApiError::RequestError(e) => Some(e),
        ApiError::TooManyRetries(inner) => match inner.as_ref() {
            ApiError::RequestError(e) => Some(e),
            _ => None,
        },
        _ => None,
    };
    let Some(request) = request else {
        return error.to_string();
    };
    match request.status().map(|s| s.as_u16()) {
        Some(status @ (401 | 403)) if token => format!(
            "the hub refused the token (HTTP {status}): the repository is gated or private and \
             the token ($HF_TOKEN, else the cache's token file) has no access to it"
        ),
        Some(status @ (401 | 403)) => format!(
            "the hub asks for a token (HTTP {status}): the repository is gated or private, or \
             does not exist; set $HF_TOKEN to a token with access to it"
        ),
        Some(_) => error.to_string(),
        None if request.is_connect() || request.is_timeout() => format!(
            "cannot reach the hub at {endpoint} ({error}); check the network, or set \
             $HF_ENDPOINT to a hub that can be reached"
        ),
        None => error.to_string(),
    }
}

/// `hf-hub`'s progress calls as [`Progress`] reports, about one per
/// megabyte (chunks report from their own tasks, so the count is shared).
#[derive(Clone)]
struct Bar {
    progress: ProgressFn,
    stage: Arc<String>,
    done: Arc<AtomicU64>,
    reported: Arc<AtomicU64>,
    total: Arc<AtomicU64>,
}

impl Bar {
    fn report(&self, done: u64) {
        let total = self.total.load(Ordering::Relaxed);
        (self.progress)(Progress {
            stage: self.stage.to_string(),
            done,
            total: (total > 0).then_some(total),
        });
    }
}

impl hf_hub::api::tokio::Progress for Bar {
    async fn init(&mut self, size: usize, _filename: &str) {
        self.total.store(size as u64, Ordering::Relaxed);
        self.report(0);
    }

    async fn update(&mut self, size: usize) {
        let done = self.done.fetch_add(size as u64, Ordering::Relaxed) + size as u64;
        let reported = self.reported.load(Ordering::Relaxed);
        if done - reported.min(done) >= 1 << 20 {
            self.reported.store(done, Ordering::Relaxed);
            self.report(done);
        }
    }

    async fn finish(&mut self) {
        let total = self.total.load(Ordering::Relaxed);
        self.report(total.max(self.done.load(Ordering::Relaxed)));
    }
}
