//! The engine's one error type. Each variant is a class of failure that the layers above map to
//! a user-facing answer (HTTP status, CLI message) without inspecting strings.

use std::path::PathBuf;

/// Errors raised while loading or running a model on one rank.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint or config file is malformed; the message names the file and the field or tensor.
    #[error("{path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
    /// A tensor the model needs is absent from every shard.
    #[error("{dir}: tensor `{name}` is missing from the checkpoint")]
    MissingTensor { dir: PathBuf, name: String },
    /// A tensor has a shape other than the config implies.
    #[error("{path}: tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    TensorShape { path: PathBuf, name: String, expected: Vec<usize>, actual: Vec<usize> },
    /// A tensor is stored in a dtype cleave cannot read.
    #[error("{path}: tensor `{name}` has unsupported dtype {dtype}")]
    TensorDtype { path: PathBuf, name: String, dtype: String },
    /// Tokenizer or chat template failure.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The request itself is invalid for this model (e.g. too long, bad token id).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// An engine setting is unusable (raised at construction, never for a request).
    #[error("engine config: {0}")]
    Config(String),
    /// Not enough KV cache to ever hold this request.
    #[error("KV cache too small: {0}")]
    CacheCapacity(String),
    /// A failure inside the compute backend.
    #[error("backend: {0}")]
    Backend(String),
    /// A collective or KV transfer did not complete by its deadline.
    #[error("timed out: {0}")]
    Timeout(String),
}

/// Result alias for the engine.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    pub(crate) fn checkpoint(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        EngineError::Checkpoint { path: path.into(), message: message.into() }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EngineError::Io { path: path.into(), source }
    }
}
