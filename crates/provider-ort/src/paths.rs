//! Where things live: the cache folder, the ONNX Runtime library, the default
//! model, and whether a model name is a local folder or a hub id.

use std::env;
use std::path::{Component, Path, PathBuf};

use crate::error::OrtError;

/// Folder name of the default model inside `$CACHE/models/`.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// The cache folder: `$WMA_CACHE_DIR`, else `$XDG_CACHE_HOME/webmcp-agents`,
/// else the platform's cache folder (`~/.cache/webmcp-agents` on Linux,
/// `~/Library/Caches/webmcp-agents` on macOS, `%LOCALAPPDATA%\webmcp-agents`
/// on Windows).
pub fn cache_dir() -> Result<PathBuf, OrtError> {
    if let Some(dir) = non_empty_var("WMA_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = non_empty_var("XDG_CACHE_HOME") {
        return Ok(Path::new(&dir).join("webmcp-agents"));
    }
    if cfg!(windows)
        && let Some(dir) = non_empty_var("LOCALAPPDATA")
    {
        return Ok(Path::new(&dir).join("webmcp-agents"));
    }
    let home = non_empty_var("HOME")
        .or_else(|| non_empty_var("USERPROFILE"))
        .ok_or(OrtError::NoCacheDir)?;
    let home = PathBuf::from(home);
    Ok(if cfg!(target_os = "macos") {
        home.join("Library/Caches/webmcp-agents")
    } else {
        home.join(".cache/webmcp-agents")
    })
}

/// The ONNX Runtime library: `$ORT_DYLIB_PATH` when set, else
/// `CACHE/onnxruntime/libonnxruntime.so` (`.dylib` on macOS,
/// `onnxruntime.dll` on Windows).
pub fn dylib_path(cache: &Path) -> PathBuf {
    if let Some(path) = non_empty_var("ORT_DYLIB_PATH") {
        return PathBuf::from(path);
    }
    cache.join("onnxruntime").join(format!(
        "{}onnxruntime{}",
        env::consts::DLL_PREFIX,
        env::consts::DLL_SUFFIX
    ))
}

/// The default model folder: `CACHE/models/SmolLM2-135M-Instruct`.
pub fn default_model_dir(cache: &Path) -> PathBuf {
    cache.join("models").join(DEFAULT_MODEL_NAME)
}

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A folder on disk.
    Local(PathBuf),
    /// A hub repository (`org/name`, or `org/name@revision` to pin a branch,
    /// tag or commit), downloaded into the Hugging Face cache.
    Hub {
        /// The `org/name` id.
        repo: String,
        /// The pinned revision; `None` means the hub's `main`.
        revision: Option<String>,
    },
}

impl ModelSource {
    /// Reads a model name: an existing path is a folder; `org/name` or
    /// `org/name@revision` that is not a path on disk is a hub id; anything
    /// else is taken as a folder (and reported missing when it is loaded).
    pub fn parse(name: &str) -> Self {
        let path = Path::new(name);
        if path.exists() {
            return Self::Local(path.to_path_buf());
        }
        Self::hub(name).unwrap_or_else(|| Self::Local(path.to_path_buf()))
    }

    /// Reads `org/name` or `org/name@revision` as a hub id whatever is on
    /// disk (for `wma models pull`, which never takes a folder); `None`
    /// for anything else.
    pub fn hub(name: &str) -> Option<Self> {
        let (repo, revision) = match name.split_once('@') {
            Some((repo, revision)) => (repo, Some(revision)),
            None => (name, None),
        };
        // A revision is a branch, tag or commit: `refs/pr/1` has slashes,
        // but nothing in one is blank or another `@`.
        let revision_ok = revision
            .is_none_or(|r| !r.is_empty() && !r.contains('@') && !r.contains(char::is_whitespace));
        (looks_like_hub_id(repo) && revision_ok).then(|| Self::Hub {
            repo: repo.to_string(),
            revision: revision.map(str::to_string),
        })
    }

    /// The folder the model's files are (or will be) in: for a hub model,
    /// the snapshot of a finished download of its revision, else the folder
    /// the runtime keeps its download note in. A bare name that is no
    /// folder here but an installed model (`CACHE/models/NAME`, a folder
    /// the set-up made or a link `wma models pull` made to a download's
    /// snapshot; see [`installed_models`]) is that model.
    pub fn folder(&self, cache: &Path) -> PathBuf {
        match self {
            Self::Local(path) => {
                let bare = path.components().count() == 1
                    && matches!(path.components().next(), Some(Component::Normal(_)));
                let installed = cache.join("models").join(path);
                if bare && !path.exists() && installed.is_dir() {
                    installed
                } else {
                    path.clone()
                }
            }
            Self::Hub { repo, revision } => {
                crate::hub::finished_snapshot(cache, repo, revision.as_deref())
                    .unwrap_or_else(|| hub_dir(cache, repo))
            }
        }
    }

    /// A short name for traces (`gen_ai.request.model`).
    pub fn display_name(&self) -> String {
        match self {
            Self::Local(path) => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
            Self::Hub {
                repo,
                revision: Some(revision),
            } => format!("{repo}@{revision}"),
            Self::Hub { repo, .. } => repo.clone(),
        }
    }
}

/// The names of the models installed in `CACHE/models` (each a folder, or
/// a link to one, with a `config.json`), sorted: what a bare `--model
/// NAME` may name.
pub fn installed_models(cache: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(cache.join("models"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The folder a hub repository is downloaded into.
pub fn hub_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join("hub").join(repo.replace('/', "--"))
}

fn looks_like_hub_id(name: &str) -> bool {
    let mut parts = name.split('/');
    let (Some(org), Some(model), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    ok(org) && ok(model)
}

fn non_empty_var(name: &str) -> Option<String> {
    env::var(name).ok().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_are_told_from_paths() {
        assert_eq!(
            ModelSource::parse("HuggingFaceTB/SmolLM2-135M-Instruct"),
            ModelSource::Hub {
                repo: "HuggingFaceTB/SmolLM2-135M-Instruct".into(),
                revision: None
            }
        );
        // A pinned revision: a commit, or a ref with slashes.
        for (name, revision) in [
            ("org/name@4a2c9e1", "4a2c9e1"),
            ("org/name@refs/pr/1", "refs/pr/1"),
        ] {
            assert_eq!(
                ModelSource::parse(name),
                ModelSource::Hub {
                    repo: "org/name".into(),
                    revision: Some(revision.into())
                },
                "{name}"
            );
        }
        assert_eq!(
            ModelSource::parse("org/name@v1").display_name(),
            "org/name@v1"
        );
        for local in [
            "./models/x",
            "/abs/path",
            "a/b/c",
            "plain",
            "../x",
            "org/name@",
            "org/name@a@b",
            "org@x/name",
        ] {
            assert!(
                matches!(ModelSource::parse(local), ModelSource::Local(_)),
                "{local}"
            );
        }
    }

    /// `--model Qwen2.5-Coder-0.5B-Instruct` names the installed model;
    /// a folder of that name where the command runs comes first, and a
    /// name that is installed nowhere stays the folder it names.
    #[test]
    fn a_bare_name_is_an_installed_model() {
        let cache = std::env::temp_dir().join(format!("wma-paths-{}", std::process::id()));
        let model = cache.join("models").join("Some-Model-0.5B");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join("config.json"), "{}").unwrap();
        std::fs::create_dir_all(cache.join("models").join("no-config")).unwrap();
        assert_eq!(ModelSource::parse("Some-Model-0.5B").folder(&cache), model);
        assert_eq!(
            ModelSource::parse("Other-Model").folder(&cache),
            Path::new("Other-Model")
        );
        assert_eq!(
            ModelSource::parse("./Some-Model-0.5B").folder(&cache),
            Path::new("./Some-Model-0.5B"),
            "only a bare name is looked up"
        );
        assert_eq!(installed_models(&cache), ["Some-Model-0.5B"]);
        std::fs::remove_dir_all(&cache).unwrap();
    }

    #[test]
    fn hub_folder_replaces_the_slash() {
        let dir = hub_dir(Path::new("/c"), "org/name");
        assert_eq!(dir, Path::new("/c/hub/org--name"));
    }
}
