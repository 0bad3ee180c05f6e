//! The seam between the gateway and whatever generates tokens: the control plane's `Cluster` in
//! production ([`crate::cluster`]), scripted streams in unit tests.

use std::sync::Arc;

use cleave_engine::tokenizer::Tokenizer;
use cleave_engine::{SamplingParams, TokenOutput};
use futures::future::BoxFuture;
use futures::stream::BoxStream;

use crate::errors::ApiError;

/// What the gateway needs to know about the served model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// The name clients use in `model`.
    pub served_model_name: String,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// Token ids at or above this are rejected.
    pub vocab_size: usize,
    /// The `</think>` token; `None` disables the reasoning split.
    pub think_end_id: Option<u32>,
}

/// One request's tokens, in order, ending with a token whose `finish` is set. An `Err` item is a
/// failure after the request started; nothing follows it. Dropping the stream aborts the
/// request and frees its KV blocks.
pub type TokenEvents = BoxStream<'static, Result<TokenOutput, ApiError>>;

/// How busy the backend is (for `/health` and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendLoad {
    /// Requests admitted and not finished (waiting, prefilling, transferring or decoding).
    pub running: usize,
    /// KV blocks held, summed over ranks.
    pub kv_blocks_in_use: usize,
}

/// A token generator the gateway serves from.
pub trait Backend: Send + Sync + 'static {
    /// The tokenizer and chat template; `None` for a model without `tokenizer.json` (the
    /// gateway then accepts token-id prompts only).
    fn tokenizer(&self) -> Option<Arc<Tokenizer>>;
    /// The served model.
    fn model_info(&self) -> ModelInfo;
    /// Starts one generation, or refuses it at the backend's limit of requests in flight (the
    /// one admission gate: `TooManyRequests`, 429). Other errors are classified already:
    /// `InvalidRequest` (400), `Overloaded` (503), `Internal` (500).
    fn submit(&self, prompt: Vec<u32>, params: SamplingParams) -> BoxFuture<'static, Result<TokenEvents, ApiError>>;
    /// The backend's metrics in Prometheus text format.
    fn metrics_text(&self) -> String {
        String::new()
    }
    /// Current load.
    fn load(&self) -> BackendLoad {
        BackendLoad::default()
    }
    /// Whether the backend can serve (all ranks alive).
    fn healthy(&self) -> bool {
        true
    }
    /// Fault drills (`POST /admin/fault`, on only with `CLEAVE_FAULT_INJECTION=1`): injects
    /// `fault` into the rank with configured id `rank`; false when there is no such rank.
    fn inject_fault(&self, rank: usize, fault: cleave_actors::Fault) -> bool {
        let _ = (rank, fault);
        false
    }
}
