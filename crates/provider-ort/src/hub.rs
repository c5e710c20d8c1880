//! Downloading a model folder from a Hugging Face-style hub.
//!
//! Only the files the provider reads are fetched, each into a `.part` file
//! that is renamed when complete, so an interrupted download never leaves a
//! truncated file that looks finished. Files already present are kept.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;
use wma_agent::{Progress, ProgressFn};

use crate::config::{GRAPH_CANDIDATES, variant_candidates};
use crate::error::OrtError;
use crate::paths;

/// The hub used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Written into the folder when every file is there; holds the variant.
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

/// Downloads `repo` (`org/name`) into `CACHE/hub/org--name/` and returns the
/// folder. The graph is `variant` when given, else the first of
/// [`GRAPH_CANDIDATES`] the hub has. The hub is `endpoint`, else
/// `$HF_ENDPOINT`, else [`DEFAULT_ENDPOINT`]; `$HF_TOKEN` is sent for gated
/// models.
pub fn download(
    repo: &str,
    variant: Option<&str>,
    cache: &Path,
    endpoint: Option<&str>,
    progress: &ProgressFn,
    cancel: &CancellationToken,
) -> Result<PathBuf, OrtError> {
    let dir = paths::hub_dir(cache, repo);
    // A finished download is used offline: the optional files it lacks
    // would otherwise be asked for again on every start.
    let marker = dir.join(COMPLETE_MARKER);
    if marker.is_file() {
        let wanted = fs::read_to_string(&marker).unwrap_or_default();
        if wanted.trim() == variant.unwrap_or_default() {
            return Ok(dir);
        }
    }
    fs::create_dir_all(&dir).map_err(|e| OrtError::io(&dir, e))?;
    let endpoint = endpoint
        .map(str::to_string)
        .or_else(|| std::env::var("HF_ENDPOINT").ok())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
    let hub = Hub {
        endpoint: endpoint.trim_end_matches('/').to_string(),
        repo: repo.to_string(),
        token: std::env::var("HF_TOKEN").ok().filter(|s| !s.is_empty()),
    };
    for file in REQUIRED {
        hub.fetch(file, &dir, progress, cancel)?;
    }
    for file in OPTIONAL {
        hub.fetch_optional(file, &dir, progress, cancel)?;
    }
    let candidates: Vec<String> = match variant {
        Some(v) => variant_candidates(v),
        None => GRAPH_CANDIDATES.iter().map(|s| s.to_string()).collect(),
    };
    let mut graph = None;
    for candidate in &candidates {
        if hub.fetch_optional(candidate, &dir, progress, cancel)? {
            graph = Some(candidate.clone());
            break;
        }
    }
    let graph = graph.ok_or_else(|| OrtError::Download {
        url: hub.url(&candidates[0]),
        reason: format!("the repository has none of {}", candidates.join(", ")),
    })?;
    // Graphs over 2 GB keep their weights in a side file.
    for suffix in ["_data", ".data"] {
        hub.fetch_optional(&format!("{graph}{suffix}"), &dir, progress, cancel)?;
    }
    fs::write(&marker, variant.unwrap_or_default()).map_err(|e| OrtError::io(&marker, e))?;
    Ok(dir)
}

struct Hub {
    endpoint: String,
    repo: String,
    token: Option<String>,
}

impl Hub {
    fn url(&self, file: &str) -> String {
        format!("{}/{}/resolve/main/{file}", self.endpoint, self.repo)
    }

    fn fetch(
        &self,
        file: &str,
        dir: &Path,
        progress: &ProgressFn,
        cancel: &CancellationToken,
    ) -> Result<(), OrtError> {
        if self.fetch_optional(file, dir, progress, cancel)? {
            Ok(())
        } else {
            Err(OrtError::Download {
                url: self.url(file),
                reason: "not found".into(),
            })
        }
    }

    /// Downloads `file` unless it is already there; false when the hub does
    /// not have it.
    fn fetch_optional(
        &self,
        file: &str,
        dir: &Path,
        progress: &ProgressFn,
        cancel: &CancellationToken,
    ) -> Result<bool, OrtError> {
        let target = dir.join(file);
        if target.is_file() {
            return Ok(true);
        }
        if cancel.is_cancelled() {
            return Err(OrtError::Cancelled);
        }
        let url = self.url(file);
        let mut request = ureq::get(&url);
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let response = match request.call() {
            Ok(r) => r,
            Err(ureq::Error::StatusCode(404)) => return Ok(false),
            Err(e) => {
                return Err(OrtError::Download {
                    url,
                    reason: e.to_string(),
                });
            }
        };
        let total = response.body().content_length();
        let mut reader = response.into_body().into_reader();
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|e| OrtError::io(parent, e))?;
        }
        let part = target.with_file_name(format!(
            "{}.part",
            target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        let stage = format!("download {file}");
        let mut out = fs::File::create(&part).map_err(|e| OrtError::io(&part, e))?;
        let mut buf = vec![0u8; 1 << 16];
        let mut done = 0u64;
        let mut reported = 0u64;
        progress(Progress {
            stage: stage.clone(),
            done,
            total,
        });
        loop {
            if cancel.is_cancelled() {
                drop(out);
                let _ = fs::remove_file(&part);
                return Err(OrtError::Cancelled);
            }
            let n = reader.read(&mut buf).map_err(|e| OrtError::Download {
                url: url.clone(),
                reason: e.to_string(),
            })?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n])
                .map_err(|e| OrtError::io(&part, e))?;
            done += n as u64;
            // About one report per megabyte keeps a progress bar smooth
            // without flooding the callback.
            if done - reported >= 1 << 20 {
                reported = done;
                progress(Progress {
                    stage: stage.clone(),
                    done,
                    total,
                });
            }
        }
        out.flush().map_err(|e| OrtError::io(&part, e))?;
        drop(out);
        fs::rename(&part, &target).map_err(|e| OrtError::io(&target, e))?;
        progress(Progress {
            stage,
            done,
            total: Some(done),
        });
        Ok(true)
    }
}
