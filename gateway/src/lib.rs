//! cleave's OpenAI-compatible HTTP gateway (warp on tokio).
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (streaming and not),
//! `GET /v1/models`, `GET /health`, `GET /metrics`, `POST /tokenize`, `POST /detokenize`,
//! `GET /version`.
//!
//! A request is validated in one place ([`validate`]), sent to the [`Backend`] as one request
//! per choice (the backend is the one admission gate: 429 with `Retry-After` at its limit), and answered as SSE ([`sse`]) or one JSON body ([`collect`]). Chat output
//! of a reasoning model is split into `reasoning_content` and `content` on the `</think>` token
//! id ([`reasoning`]); with `tools`, DeepSeek's tool-call tokens in the answer become `tool_calls`
//! ([`tools`]). Errors are one enum ([`ApiError`]) mapped to HTTP at the edge.

pub mod backend;
pub mod choice;
pub mod cluster;
pub mod collect;
pub mod defaults;
pub mod errors;
mod generate;
pub mod messages;
pub mod metrics;
pub mod openai;
pub mod reasoning;
mod routes;
mod server;
pub mod sse;
pub mod structured;
pub mod tools;
pub mod validate;

use std::net::SocketAddr;
use std::sync::Arc;

use cleave_engine::tokenizer::Tokenizer;
use tokio::sync::Semaphore;

pub use backend::{Backend, BackendLoad, ModelInfo, TokenEvents};
pub use defaults::SamplingDefaults;
pub use errors::ApiError;
pub use metrics::GatewayMetrics;
pub use server::Server;

/// Largest `n` a request may ask for (also bounded by `max_concurrent_requests`).
pub const MAX_N: usize = 128;

/// Gateway settings.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// The backend's limit of requests (choices) in flight, which it enforces; here it bounds `n`.
    pub max_concurrent_requests: usize,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Seconds in the `Retry-After` of a 429.
    pub retry_after_s: u32,
    /// Sampling defaults (from the model's `generation_config.json`).
    pub defaults: SamplingDefaults,
    /// `root` of the model in `/v1/models` (the model directory).
    pub model_root: String,
    /// When set, every `/v1/*` request must carry `Authorization: Bearer <key>` (vLLM's
    /// `--api-key`); `/health`, `/version`, `/metrics` and `/tokenize` stay open, as in vLLM.
    pub api_key: Option<String>,
    /// Origins browsers may call the API from (vLLM's `--allowed-origins`; `*` for any). Empty:
    /// no CORS headers, so cross-site browser requests are refused.
    pub allowed_origins: Vec<String>,
    /// `POST /admin/fault` (fault drills on a running server); off unless asked for
    /// (`cleave serve` reads `CLEAVE_FAULT_INJECTION=1`). Behind the API key when one is set.
    pub fault_injection: bool,
    /// A connection that has not sent a whole request head this long after it opened or after
    /// its previous response is closed (slow and idle clients cannot hold sockets).
    pub header_timeout: std::time::Duration,
    /// A request body must arrive within this long (408 beyond).
    pub body_timeout: std::time::Duration,
    /// Open connections at most; more wait in the listen backlog.
    pub max_connections: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            max_concurrent_requests: 256,
            max_body_bytes: 32 << 20,
            retry_after_s: 1,
            defaults: SamplingDefaults::default(),
            model_root: String::new(),
            api_key: None,
            allowed_origins: Vec::new(),
            fault_injection: false,
            header_timeout: std::time::Duration::from_secs(30),
            body_timeout: std::time::Duration::from_secs(60),
            max_connections: 1024,
        }
    }
}

/// Failure to start the server.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid gateway configuration: {0}")]
    Config(String),
}

/// What every handler shares.
pub(crate) struct State {
    backend: Arc<dyn Backend>,
    cfg: GatewayConfig,
    info: ModelInfo,
    tokenizer: Option<Arc<Tokenizer>>,
    /// Bodies being parsed and tokenized at once (on blocking threads, never the runtime's).
    parsing: Arc<Semaphore>,
    metrics: GatewayMetrics,
    /// Unix seconds at start (`created` of the model in `/v1/models`).
    started: u64,
}

impl State {
    fn max_n(&self) -> usize {
        MAX_N.min(self.cfg.max_concurrent_requests)
    }
}
