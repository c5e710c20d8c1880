//! The models installed in the cache folder (`CACHE/models`): what each is,
//! where it came from, what it takes on disk, and installing or removing
//! one. `wma models` prints what these find; it owns no rule of its own.
//!
//! A model is a folder of the ONNX layout, or a link to a snapshot of the
//! Hugging Face cache (`wma models pull` makes those, so that the files stay
//! the hub cache's and removing the model removes only the link).

use std::path::{Path, PathBuf};

/// What went wrong with an installed model, or with a model id.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Said as it is: the request cannot be met (an unknown name, a model
    /// the set-up converts rather than downloads, an id of no kind).
    #[error("{0}")]
    Refused(String),
    /// A file operation on the cache failed.
    #[error("{what}")]
    Io {
        /// What was being done (`could not remove PATH`).
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

impl ModelError {
    fn io(what: String) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io { what, source }
    }
}

/// A model the set-up converts from GGUF rather than downloads in the ONNX
/// layout: `wma models pull` names its set-up command instead.
#[derive(Debug)]
pub struct KnownModel {
    /// Its folder in `CACHE/models`.
    pub name: &'static str,
    /// `scripts/setup.sh --model KEY`.
    pub key: &'static str,
    /// What the project uses it for.
    pub role: &'static str,
}

/// The models `scripts/setup.sh --model` knows (its `case` on MODEL_KEY).
pub const KNOWN_MODELS: [KnownModel; 2] = [
    KnownModel {
        name: wma_provider_ort::DEFAULT_MODEL_NAME,
        key: "smollm2-135m",
        role: "default model",
    },
    KnownModel {
        name: "Qwen2.5-Coder-0.5B-Instruct",
        key: "qwen2.5-coder-0.5b",
        role: "evaluation model",
    },
];

/// Where an installed model came from, read from what is on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelOrigin {
    /// A link into the Hugging Face cache, made by `wma models pull`.
    Hub {
        /// `org/name`.
        repo: String,
        /// The branch or tag that resolves to `commit` in the cache, when
        /// one does and it is not `main`.
        revision: Option<String>,
        /// The snapshot's commit.
        commit: String,
        /// The snapshot folder the link points at.
        snapshot: PathBuf,
    },
    /// Converted by `scripts/setup.sh` (its step markers are there).
    SetUp {
        /// From GGUF (`.wma-setup-VARIANT`), or a test model it made.
        converted: bool,
    },
    /// Anything else: a folder put there by hand.
    Folder,
}

impl ModelOrigin {
    /// Reads where the model at `dir` came from.
    pub fn of(dir: &Path) -> Self {
        if let Ok(target) = std::fs::read_link(dir) {
            let snapshot = if target.is_absolute() {
                target
            } else {
                dir.parent().unwrap_or(Path::new(".")).join(target)
            };
            if let Some(origin) = Self::hub_snapshot(snapshot) {
                return origin;
            }
            return Self::Folder;
        }
        let markers: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|f| f.starts_with(".wma-setup"))
            .collect();
        if markers.is_empty() {
            Self::Folder
        } else {
            Self::SetUp {
                converted: markers.iter().any(|m| m.starts_with(".wma-setup-")),
            }
        }
    }

    /// Reads `.../models--org--name/snapshots/COMMIT`, the Hugging Face
    /// cache's layout (a repository's name never holds `--`).
    fn hub_snapshot(snapshot: PathBuf) -> Option<Self> {
        let commit = snapshot.file_name()?.to_str()?.to_string();
        let snapshots = snapshot.parent()?;
        if snapshots.file_name()? != "snapshots" {
            return None;
        }
        let repo_dir = snapshots.parent()?;
        let repo = repo_dir
            .file_name()?
            .to_str()?
            .strip_prefix("models--")?
            .replacen("--", "/", 1);
        let revision = std::fs::read_dir(repo_dir.join("refs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|c| c.trim() == commit))
            .filter_map(|e| e.file_name().into_string().ok())
            .min_by_key(|r| r != "main")
            .filter(|r| r != "main");
        Some(Self::Hub {
            repo,
            revision,
            commit,
            snapshot,
        })
    }
}

impl std::fmt::Display for ModelOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hub {
                repo,
                revision,
                commit,
                ..
            } => {
                let short = commit.get(..7).unwrap_or(commit);
                match revision {
                    Some(revision) => write!(f, "hub {repo}@{revision} ({short})"),
                    None => write!(f, "hub {repo} ({short})"),
                }
            }
            Self::SetUp { converted: true } => write!(f, "set-up, converted from GGUF"),
            Self::SetUp { converted: false } => write!(f, "set-up, test model"),
            Self::Folder => write!(f, "folder"),
        }
    }
}

/// The bytes of every file under `dir`, links followed (a download's
/// files are links to the hub cache's blobs: their size is the blobs').
pub fn disk_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let path = e.path();
            match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => disk_size(&path),
                Ok(m) => m.len(),
                Err(_) => 0,
            }
        })
        .sum()
}

/// The ONNX graphs of a model's `onnx` folder with their variant name and
/// size on disk (a graph's external weights counted with it): `q4 (96
/// MB), fp32 (538 MB)`.
pub fn graph_files(onnx: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(onnx) else {
        return "none".to_string();
    };
    let files: Vec<(String, u64)> = entries
        .flatten()
        // Followed: a download's files are links to the hub cache's blobs.
        .filter_map(|e| {
            Some((
                e.file_name().into_string().ok()?,
                std::fs::metadata(e.path()).ok()?.len(),
            ))
        })
        .collect();
    let mut graphs: Vec<String> = files
        .iter()
        .filter_map(|(file, _)| file.strip_suffix(".onnx"))
        .map(|stem| {
            let bytes: u64 = files
                .iter()
                .filter(|(f, _)| {
                    f.strip_prefix(stem)
                        .is_some_and(|rest| rest.starts_with(".onnx"))
                })
                .map(|(_, len)| len)
                .sum();
            let variant =
                stem.strip_prefix("model_")
                    .unwrap_or(if stem == "model" { "fp32" } else { stem });
            if bytes < 1_000_000 {
                format!("{variant} (<1 MB)")
            } else {
                format!("{variant} ({} MB)", bytes / 1_000_000)
            }
        })
        .collect();
    graphs.sort();
    if graphs.is_empty() {
        "none".to_string()
    } else {
        graphs.join(", ")
    }
}

/// One installed model, as `wma models` lists it.
#[derive(Debug, Clone)]
pub struct Installed {
    /// Its name: what `--model NAME` takes.
    pub name: String,
    /// Its folder (or the link to it) in `CACHE/models`.
    pub dir: PathBuf,
    /// Its `model_type` (`llama`, `qwen2`), or `?`.
    pub family: String,
    /// Its size in parameters, when its config says.
    pub parameters: Option<u64>,
}

/// The models installed in `cache`, by name, with what their files say.
pub fn installed(cache: &Path) -> Vec<Installed> {
    let folder = cache.join("models");
    wma_provider_ort::installed_models(cache)
        .into_iter()
        .map(|name| {
            let dir = folder.join(&name);
            let config = wma_provider_ort::ModelConfig::load(&dir).ok();
            // Read on its own: a config too partial for the runtime's reading
            // (no layer counts) still names its family.
            let family = std::fs::read_to_string(dir.join("config.json"))
                .ok()
                .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
                .and_then(|c| c["model_type"].as_str().map(str::to_string))
                .unwrap_or_else(|| "?".to_string());
            let parameters = config.as_ref().and_then(|c| c.parameters);
            Installed {
                name,
                dir,
                family,
                parameters,
            }
        })
        .collect()
}

/// What [`remove`] took away.
#[derive(Debug)]
pub enum Removed {
    /// The link `wma models pull` made; the files it points at stay in the
    /// Hugging Face cache, which other tools (and `--model org/name`) share.
    Link {
        /// Where the link pointed.
        origin: ModelOrigin,
    },
    /// The model's own folder, with its files.
    Folder {
        /// The set-up's model of that name, when it was one.
        known: Option<&'static KnownModel>,
    },
}

/// Removes the installed model `name` from `cache`: its folder, or only the
/// link for a model `wma models pull` installed. Only a name that
/// [`installed`] lists is taken, never a path.
pub fn remove(cache: &Path, name: &str) -> Result<Removed, ModelError> {
    let installed = wma_provider_ort::installed_models(cache);
    let folder = cache.join("models").join(name);
    // A link whose download was deleted from the hub cache lists as
    // nothing, but is still removed by its name.
    let dangling = folder.is_symlink() && !folder.exists() && !name.contains(['/', '\\']);
    if !installed.iter().any(|n| n == name) && !dangling {
        return Err(ModelError::Refused(format!(
            "no installed model is named `{name}` (installed: {})",
            if installed.is_empty() {
                "none".to_string()
            } else {
                installed.join(", ")
            }
        )));
    }
    if folder.is_symlink() {
        let origin = ModelOrigin::of(&folder);
        // Only the link: the files it points at are the Hugging Face
        // cache's.
        std::fs::remove_file(&folder).map_err(ModelError::io(format!(
            "could not remove {}",
            folder.display()
        )))?;
        return Ok(Removed::Link { origin });
    }
    std::fs::remove_dir_all(&folder).map_err(ModelError::io(format!(
        "could not remove {}",
        folder.display()
    )))?;
    Ok(Removed::Folder {
        known: KNOWN_MODELS.iter().find(|k| k.name == name),
    })
}

/// What `wma models pull ID` is to do, decided before anything downloads.
#[derive(Debug)]
pub enum Pull {
    /// The set-up's model, installed already (and not forced): nothing to do.
    SetUpInstalled(&'static KnownModel),
    /// That repository, at that revision, is installed already (and not
    /// forced): nothing to do.
    Installed {
        /// Where it is.
        target: PullTarget,
        /// Where it came from.
        origin: ModelOrigin,
    },
    /// Download `repo` at `revision` and install it at `target`.
    Download {
        /// Where it goes.
        target: PullTarget,
        /// `org/name`.
        repo: String,
        /// The revision the id pins or the caller asks for.
        revision: Option<String>,
    },
}

/// Where a pulled model is installed: its name (the repository's, without
/// the organisation) and its link in `CACHE/models`.
#[derive(Debug, Clone)]
pub struct PullTarget {
    /// What `--model NAME` takes.
    pub name: String,
    /// `CACHE/models/NAME`.
    pub link: PathBuf,
    /// Something stands at `link` already (it is replaced).
    pub present: bool,
}

/// Decides what pulling `id` (`org/name`, `org/name@REVISION`, or a model
/// the set-up converts) into `cache` takes: a model the set-up converts is
/// refused with its set-up command; one installed already is left alone
/// unless `force`.
pub fn plan_pull(
    cache: &Path,
    id: &str,
    revision: Option<String>,
    force: bool,
) -> Result<Pull, ModelError> {
    let models = cache.join("models");
    if let Some(known) = KNOWN_MODELS
        .iter()
        .find(|k| id.eq_ignore_ascii_case(k.name) || id.eq_ignore_ascii_case(k.key))
    {
        let installed = wma_provider_ort::installed_models(cache)
            .iter()
            .any(|n| n == known.name);
        if installed && !force {
            return Ok(Pull::SetUpInstalled(known));
        }
        return Err(ModelError::Refused(format!(
            "{} (the {}) is converted from GGUF by the set-up, not downloaded from a hub: run `scripts/setup.sh --model {}{}`",
            known.name,
            known.role,
            known.key,
            if installed { " --force" } else { "" }
        )));
    }
    let Some(wma_provider_ort::ModelSource::Hub {
        repo,
        revision: pinned,
    }) = wma_provider_ort::ModelSource::hub(id)
    else {
        return Err(ModelError::Refused(format!(
            "`{id}` is neither a hub repository id (`org/name`, or `org/name@REVISION`) nor a model the set-up converts ({})",
            KNOWN_MODELS
                .iter()
                .map(|k| format!("{} or {}", k.key, k.name))
                .collect::<Vec<_>>()
                .join("; ")
        )));
    };
    let revision = match (pinned, revision) {
        (Some(a), Some(b)) if a != b => {
            return Err(ModelError::Refused(format!(
                "`{id}` pins the revision {a} and --revision says {b}: give one"
            )));
        }
        (a, b) => a.or(b),
    };
    let name = repo.rsplit('/').next().unwrap_or(&repo).to_string();
    let link = models.join(&name);
    let present = link.symlink_metadata().is_ok();
    // A link whose download was deleted from the hub cache is no model:
    // it is replaced without --force.
    let broken = link.is_symlink() && !link.join("config.json").is_file();
    let target = PullTarget {
        name: name.clone(),
        link: link.clone(),
        present,
    };
    if present && !force && !broken {
        let origin = ModelOrigin::of(&link);
        if let ModelOrigin::Hub {
            repo: installed,
            revision: at,
            ..
        } = &origin
            && *installed == repo
            && (revision.is_none() || *at == revision.clone().filter(|r| r != "main"))
        {
            return Ok(Pull::Installed { target, origin });
        }
        return Err(ModelError::Refused(format!(
            "a model named {name} is installed already ({origin}, {}): remove it with `wma models rm {name}`, or pass --force to replace it",
            link.display()
        )));
    }
    Ok(Pull::Download {
        target,
        repo,
        revision,
    })
}

/// Makes room for a pulled model at `target.link`: creates `CACHE/models`
/// and takes away what stands there, returning where that came from.
pub fn make_room(target: &PullTarget) -> Result<Option<ModelOrigin>, ModelError> {
    if let Some(models) = target.link.parent() {
        std::fs::create_dir_all(models).map_err(ModelError::io(format!(
            "could not create {}",
            models.display()
        )))?;
    }
    if !target.present {
        return Ok(None);
    }
    let link = &target.link;
    let replaced = ModelOrigin::of(link);
    if link.is_symlink() {
        std::fs::remove_file(link)
    } else {
        std::fs::remove_dir_all(link)
    }
    .map_err(ModelError::io(format!(
        "could not replace {}",
        link.display()
    )))?;
    Ok(Some(replaced))
}

/// Installs the downloaded `snapshot` as the model at `link`: a link to it,
/// so that removing the model leaves the hub cache's files alone.
pub fn link_snapshot(snapshot: &Path, link: &Path) -> Result<(), ModelError> {
    #[cfg(unix)]
    std::os::unix::fs::symlink(snapshot, link).map_err(ModelError::io(format!(
        "could not link {} to {}",
        link.display(),
        snapshot.display()
    )))?;
    #[cfg(windows)]
    std::os::windows::fs::symlink_dir(snapshot, link).map_err(ModelError::io(format!(
        "could not link {} to {} (Windows allows links in Developer Mode)",
        link.display(),
        snapshot.display()
    )))?;
    Ok(())
}

/// Whether `snapshot` holds a graph the provider loads without `--variant`.
pub fn has_default_graph(snapshot: &Path) -> bool {
    wma_provider_ort::GRAPH_CANDIDATES
        .iter()
        .any(|g| snapshot.join(g).is_file())
}
