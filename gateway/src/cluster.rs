//! The production backend: the control plane's [`Cluster`], with its errors classified for HTTP.

use std::sync::Arc;

use cleave_actors::config::DeployConfig;
use cleave_actors::{ActorError, Cluster, RankStatus, Role, StreamEvent};
use cleave_engine::tokenizer::Tokenizer;
use cleave_engine::SamplingParams;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};

use crate::backend::{Backend, BackendLoad, ModelInfo, TokenEvents};
use crate::defaults::{DefaultsError, SamplingDefaults};
use crate::errors::ApiError;
use crate::GatewayConfig;

/// Classifies a control-plane error for HTTP: invalid requests are 400, overload and shutdown
/// 503 with `Retry-After`, every failure of a rank, a transfer or the server itself 500.
pub fn api_error(e: ActorError) -> ApiError {
    match e {
        ActorError::Invalid(m) => ApiError::InvalidRequest(m),
        ActorError::Overloaded(m) => ApiError::Overloaded(m),
        // The gateway fills in its Retry-After (generate::submit_all).
        ActorError::AtCapacity { limit } => ApiError::TooManyRequests { limit, retry_after_s: 1 },
        ActorError::ShuttingDown => ApiError::Overloaded("the server is shutting down".into()),
        other => ApiError::Internal(other.to_string()),
    }
}

impl Backend for Cluster {
    fn tokenizer(&self) -> Option<Arc<Tokenizer>> {
        Some(Cluster::tokenizer(self))
    }

    fn model_info(&self) -> ModelInfo {
        let m = Cluster::model_info(self);
        ModelInfo {
            served_model_name: m.served_model_name,
            max_model_len: m.max_model_len,
            vocab_size: m.vocab_size,
            think_end_id: m.think_end_id,
        }
    }

    fn submit(&self, prompt: Vec<u32>, params: SamplingParams) -> BoxFuture<'static, Result<TokenEvents, ApiError>> {
        let cluster = self.clone();
        async move {
            let stream = cluster.submit(prompt, params).await.map_err(api_error)?;
            let events = stream.map(|ev| match ev {
                StreamEvent::Token(t) => Ok(t),
                StreamEvent::Error(e) => Err(api_error(e)),
            });
            Ok(events.boxed())
        }
        .boxed()
    }

    fn metrics_text(&self) -> String {
        Cluster::metrics_text(self)
    }

    fn load(&self) -> BackendLoad {
        let s = self.stats();
        BackendLoad { running: s.in_flight, kv_blocks_in_use: s.blocks_in_use() }
    }

    fn inject_fault(&self, rank: usize, fault: cleave_actors::Fault) -> bool {
        Cluster::inject_fault(self, rank, fault)
    }

    /// Healthy while at least one decode rank is up.
    fn healthy(&self) -> bool {
        self.stats().ranks.iter().any(|r| r.role == Role::Decode && r.status == RankStatus::Up)
    }
}

impl GatewayConfig {
    /// The gateway settings of a deployment: its `server` section, and sampling defaults from
    /// the model directory's `generation_config.json`.
    pub fn from_deploy(cfg: &DeployConfig) -> Result<GatewayConfig, DefaultsError> {
        Ok(GatewayConfig {
            max_concurrent_requests: cfg.server.max_concurrent_requests,
            allowed_origins: cfg.server.allowed_origins.clone(),
            max_connections: cfg.server.max_connections,
            header_timeout: std::time::Duration::from_millis(cfg.server.header_timeout_ms),
            body_timeout: std::time::Duration::from_millis(cfg.server.body_timeout_ms),
            defaults: SamplingDefaults::from_model_dir(&cfg.model)?,
            model_root: cfg.model.canonicalize().unwrap_or_else(|_| cfg.model.clone()).display().to_string(),
            ..GatewayConfig::default()
        })
    }
}
