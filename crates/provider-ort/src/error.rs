//! The crate's one error type, and how it maps onto the loop's [`ProviderError`].

use std::path::PathBuf;

use wma_agent::ProviderError;

/// What can go wrong while finding, loading or running a model.
///
/// Messages carry text rather than the source errors because `ort`'s session
/// builder errors are neither `Send` nor `Sync`, and a provider error has to
/// cross threads and actors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OrtError {
    /// The ONNX Runtime shared library is not where it was looked for.
    #[error(
        "ONNX Runtime library not found at {path} (set ORT_DYLIB_PATH, or run scripts/setup.sh to install it)"
    )]
    LibraryMissing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The model folder, or a file the model needs, is missing.
    #[error(
        "{what} not found at {path} (point the provider at a model folder, or run scripts/setup.sh to install the default model)"
    )]
    ModelMissing {
        /// Which file or folder.
        what: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// No cache folder could be chosen (no home folder, no variables set).
    #[error("no cache folder: set WMA_CACHE_DIR")]
    NoCacheDir,
    /// A model file exists but could not be read or understood.
    #[error("invalid {file}: {reason}")]
    InvalidModel {
        /// The file.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The graph's inputs or outputs are not those of a decoder with a KV cache.
    #[error("unsupported graph: {0}")]
    UnsupportedGraph(String),
    /// ONNX Runtime reported an error.
    #[error("onnxruntime: {0}")]
    Runtime(String),
    /// Tokenizing or detokenizing failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be compiled or rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// Downloading from the hub failed.
    #[error("download of {url} failed: {reason}")]
    Download {
        /// What was fetched.
        url: String,
        /// Why it failed.
        reason: String,
    },
    /// A file operation failed.
    #[error("{path}: {reason}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error.
        reason: String,
    },
    /// The prompt does not fit the context window.
    #[error("the prompt has {tokens} tokens but the model takes at most {limit}")]
    TooLong {
        /// Prompt tokens plus room kept for the answer.
        tokens: usize,
        /// The context window.
        limit: usize,
    },
    /// An option has a value that cannot work.
    #[error("invalid option {name}: {reason}")]
    InvalidOption {
        /// The option.
        name: &'static str,
        /// Why.
        reason: String,
    },
    /// The provider was used before [`prepare`](wma_agent::Provider::prepare) succeeded.
    #[error("the model is not loaded yet; call prepare() first")]
    NotPrepared,
    /// The work was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// A decoding constraint could not be compiled or followed.
    #[error("constraint: {0}")]
    Constraint(String),
}

impl OrtError {
    pub(crate) fn runtime(e: impl std::fmt::Display) -> Self {
        Self::Runtime(e.to_string())
    }

    pub(crate) fn io(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> Self {
        Self::Io {
            path: path.into(),
            reason: e.to_string(),
        }
    }

    pub(crate) fn invalid(file: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Self::InvalidModel {
            file: file.into(),
            reason: reason.to_string(),
        }
    }
}

impl From<OrtError> for ProviderError {
    fn from(e: OrtError) -> Self {
        match e {
            OrtError::Cancelled => ProviderError::Cancelled,
            OrtError::NotPrepared => ProviderError::NotReady(e.to_string()),
            OrtError::TooLong { tokens, limit } => ProviderError::TooLong { tokens, limit },
            OrtError::Runtime(_)
            | OrtError::Tokenizer(_)
            | OrtError::Template(_)
            | OrtError::Constraint(_) => ProviderError::Generation(e.to_string()),
            other => ProviderError::Load(other.to_string()),
        }
    }
}
