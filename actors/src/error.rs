//! The control plane's one error type. Each variant is a class of failure; the gateway alone maps
//! a class to an HTTP status (or a final SSE error event) without inspecting the message.

use cleave_engine::EngineError;

use crate::config::ConfigError;

/// Why a request (or the cluster) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActorError {
    /// The request itself is invalid for this model (context length, token ids, parameters).
    /// HTTP 400.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// No rank can take work right now. HTTP 503.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// `limit` requests are in flight (alive on some rank): the one admission gate. HTTP 429.
    #[error("the server is at its limit of {limit} concurrent requests; retry later")]
    AtCapacity { limit: usize },
    /// The rank serving the request failed and `failure_policy: fail` ends the request.
    /// HTTP 500 (or a final SSE error event).
    #[error("rank failed: {0}")]
    RankFailed(String),
    /// Moving the prompt's KV from a prefill rank to a decode rank failed or timed out and
    /// `failure_policy: fail` ends the request. HTTP 500 / SSE error event.
    #[error("KV transfer failed: {0}")]
    TransferFailed(String),
    /// The deployment configuration is invalid (start-up only).
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// A rank could not load its model (start-up or restart).
    #[error("model load failed: {0}")]
    Load(String),
    /// The cluster is shutting down. HTTP 503.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A bug or an unexpected state. HTTP 500.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ActorError {
    /// Whether the client caused the error (HTTP 4xx) rather than the server.
    pub fn is_client_error(&self) -> bool {
        matches!(self, ActorError::Invalid(_))
    }

    /// Whether retrying later may succeed (HTTP 429/503).
    pub fn is_retryable(&self) -> bool {
        matches!(self, ActorError::Overloaded(_) | ActorError::AtCapacity { .. } | ActorError::ShuttingDown)
    }

    /// Classifies an engine error raised while serving a request.
    pub(crate) fn from_engine(e: EngineError) -> Self {
        match e {
            EngineError::InvalidRequest(m) => ActorError::Invalid(m),
            other => ActorError::Internal(other.to_string()),
        }
    }
}
