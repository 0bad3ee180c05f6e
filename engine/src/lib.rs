//! One rank of cleave: a DeepSeek-V3/R1-architecture model loaded from an unmodified Hugging
//! Face checkpoint, its paged latent KV cache, a continuous-batching scheduler and a sampler,
//! computing over a [`backend::Backend`].

pub mod backend;
mod engine;
pub mod error;
pub mod graphs;
pub mod group;
pub mod kv_cache;
pub mod kv_port;
pub mod model;
pub mod parallel;
pub mod request_check;
pub mod runner;
pub mod sampler;
pub mod scheduler;
mod stop;
pub mod structured;
pub mod tokenizer;
pub mod weights;

pub use engine::{Engine, EngineConfig, EngineStats, FinishReason, Request, TokenOutput};
pub use error::{EngineError, Result};
pub use parallel::ParallelConfig;
pub use request_check::{RequestError, RequestLimits};
pub use sampler::SamplingParams;
pub use stop::StopMatcher;
