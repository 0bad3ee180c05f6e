//! [`Cluster`]: the handle the gateway holds. It starts the actix System thread (router, pools,
//! KV-transfer actor) and one OS thread per rank, validates and submits requests, and exposes
//! stats and metrics.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use cleave_engine::model::ModelConfig;
use cleave_engine::tokenizer::Tokenizer;
use cleave_engine::{EngineConfig, EngineError, ParallelConfig, RequestLimits, SamplingParams};

use crate::command::{Fault, RankCmd};
use crate::config::{ConfigError, DeployConfig, Device};
use crate::error::ActorError;
use crate::pool::Pool;
use crate::rank::{spawner, CpuRankFactory, CudaRankFactory, RankFactory, RankInfo};
use crate::request::{ReqCtx, TokenStream};
use crate::router::{RouteRequest, Router};
use crate::table::{RankStats, RankStatus, RankTable, Role};
use crate::transfer::KvTransfer;

/// What the gateway needs to know about the served model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub served_model_name: String,
    pub model_dir: PathBuf,
    /// Longest prompt + output.
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// Ids that end a sequence unless `ignore_eos` (config.json's and the tokenizer's EOS).
    pub eos_token_ids: Vec<u32>,
    /// The `</think>` token, where the reasoning section ends.
    pub think_end_id: Option<u32>,
}

/// A snapshot of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStats {
    /// Prefill ranks first, then decode ranks, in configuration order.
    pub ranks: Vec<RankStats>,
    /// Requests that some rank, actor or channel still holds.
    pub in_flight: usize,
}

impl ClusterStats {
    /// KV blocks allocated over every rank.
    pub fn blocks_in_use(&self) -> usize {
        self.ranks.iter().map(|r| r.blocks_in_use).sum()
    }

    /// Nothing in flight and no block allocated anywhere.
    pub fn is_idle(&self) -> bool {
        self.in_flight == 0
            && self.ranks.iter().all(|r| r.blocks_in_use == 0 && r.running == 0 && r.waiting == 0 && r.held == 0)
    }
}

struct Inner {
    cfg: DeployConfig,
    table: Arc<RankTable>,
    router: Addr<Router>,
    system: actix::System,
    tokenizer: Arc<Tokenizer>,
    info: ModelInfo,
    next_id: AtomicU64,
    stopped: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.stopped.swap(true, Ordering::SeqCst) {
            self.table.shutdown();
            self.system.stop();
        }
    }
}

/// The serving cluster: cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

// The gateway shares the cluster between handlers and moves streams into tasks.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Cluster>();
    send::<TokenStream>();
};

fn load_err(e: impl std::fmt::Display) -> ActorError {
    ActorError::Load(e.to_string())
}

/// Reads the model's config and tokenizer once for the whole cluster.
fn model_info(cfg: &DeployConfig) -> Result<(Arc<Tokenizer>, ModelInfo), ActorError> {
    let mc = ModelConfig::from_dir(&cfg.model).map_err(load_err)?;
    let pools =
        [("prefill", &cfg.prefill.ranks, cfg.prefill.parallel()), ("decode", &cfg.decode.ranks, cfg.decode.parallel())];
    for (pool, ranks, par) in pools {
        if ranks.is_empty() {
            continue;
        }
        if let Err(e) = par.validate(&mc) {
            let message = match e {
                EngineError::Config(m) => m,
                other => other.to_string(),
            };
            return Err(ConfigError { file: None, field: Some(pool.into()), line: None, message }.into());
        }
    }
    if !cfg.model.join("tokenizer.json").is_file() {
        return Err(ActorError::Load(format!("{}: no tokenizer.json", cfg.model.display())));
    }
    let mut tokenizer = Tokenizer::from_dir(&cfg.model).map_err(load_err)?;
    if let Some(t) = &cfg.chat_template {
        let field_err =
            |message: String| ConfigError { file: None, field: Some("chat_template".into()), line: None, message };
        // vLLM's rule: a path to a file, else the template itself (which then holds Jinja).
        let (source, origin) = match std::fs::read_to_string(t) {
            Ok(text) => (text, t.clone()),
            Err(_) if t.contains("{{") || t.contains("{%") => (t.clone(), "given inline".to_string()),
            Err(e) => return Err(field_err(format!("cannot read {t}: {e}")).into()),
        };
        tokenizer.set_chat_template(source, &origin).map_err(|e| field_err(e.to_string()))?;
    }
    let tokenizer = Arc::new(tokenizer);
    let max_model_len = cfg.max_model_len.unwrap_or(mc.max_position_embeddings);
    if max_model_len > mc.max_position_embeddings {
        return Err(ConfigError {
            file: None,
            field: Some("max_model_len".into()),
            line: None,
            message: format!(
                "{max_model_len} exceeds the model's max_position_embeddings {}",
                mc.max_position_embeddings
            ),
        }
        .into());
    }
    let mut eos_token_ids = mc.eos_token_ids.clone();
    if let Some(id) = tokenizer.eos_token().and_then(|e| tokenizer.token_to_id(e)) {
        if !eos_token_ids.contains(&id) {
            eos_token_ids.push(id);
        }
    }
    let info = ModelInfo {
        served_model_name: cfg.served_model_name(),
        model_dir: cfg.model.clone(),
        max_model_len,
        vocab_size: mc.vocab_size,
        eos_token_ids,
        think_end_id: tokenizer.think_end_id(),
    };
    Ok((tokenizer, info))
}

impl Cluster {
    /// Starts the deployment `cfg` (resolving a relative `model` against the current directory)
    /// and returns once every rank has loaded its model. `device: cpu` ranks are
    /// [`CpuRankFactory`] threads; `device: cuda` ranks are [`CudaRankFactory`] GPUs (an error
    /// naming `device` at once when no GPU, driver or NCCL is usable).
    pub fn start(mut cfg: DeployConfig) -> Result<Cluster, ActorError> {
        cfg.check()?;
        if !cfg.model.join("config.json").is_file() {
            cfg.resolve_model(None)?;
        }
        match cfg.device {
            Device::Cpu => Self::start_with(cfg, CpuRankFactory::new()),
            // Fails at once, naming `device`, without a usable GPU, driver or NCCL.
            Device::Cuda => {
                let factory = CudaRankFactory::new(&cfg)?;
                Self::start_with(cfg, factory)
            }
        }
    }

    /// Starts the deployment with ranks built by `factory` (the seam for GPU backends).
    pub fn start_with<F: RankFactory>(cfg: DeployConfig, factory: F) -> Result<Cluster, ActorError> {
        cfg.check()?;
        let (tokenizer, info) = model_info(&cfg)?;
        // One slot per group, named by its first rank.
        let pools = [
            (Role::Prefill, &cfg.prefill.ranks, cfg.prefill.parallel()),
            (Role::Decode, &cfg.decode.ranks, cfg.decode.parallel()),
        ];
        let mut groups: Vec<(Role, Vec<usize>, ParallelConfig)> = Vec::new();
        for (role, pool_ranks, par) in pools {
            groups.extend(pool_ranks.chunks(par.world()).map(|g| (role, g.to_vec(), par)));
        }
        let ranks: Vec<(usize, Role)> = groups.iter().map(|(role, g, _)| (g[0], *role)).collect();
        let num_blocks = match cfg.device {
            Device::Cpu => cfg.cpu_num_blocks(),
            Device::Cuda => cfg.kv_cache.num_blocks.unwrap_or(0),
        };
        let engine = |role: Role| {
            let (seqs, tokens) = match role {
                Role::Prefill => (cfg.prefill.max_num_seqs, cfg.prefill.max_num_batched_tokens),
                Role::Decode => (cfg.decode.max_num_seqs, cfg.decode.max_num_batched_tokens),
            };
            EngineConfig {
                max_num_seqs: seqs,
                max_num_batched_tokens: tokens,
                block_size: cfg.kv_cache.block_size,
                num_blocks,
                max_model_len: Some(info.max_model_len),
                enable_prefix_caching: cfg.enable_prefix_caching,
                enforce_eager: cfg.enforce_eager,
                load_format: cfg.load_format,
            }
        };
        let infos: Vec<RankInfo> = groups
            .iter()
            .map(|(role, group, par)| RankInfo {
                rank: group[0],
                role: *role,
                group: group.clone(),
                parallel: *par,
                num_ranks: cfg.prefill.ranks.len() + cfg.decode.ranks.len(),
                device: cfg.device,
                dtype: cfg.dtype,
                model_dir: cfg.model.clone(),
                engine: engine(*role),
                gpu_memory_utilization: cfg.kv_cache.gpu_memory_utilization,
                tokenizer: tokenizer.clone(),
            })
            .collect();
        let metrics = Arc::new(crate::metrics::Metrics::new(&cfg.served_model_name()));
        let table = Arc::new(RankTable::new(&ranks, metrics, cfg.kv_transfer.failure_policy, cfg.kv_cache.block_size));
        let spawn = spawner(factory, infos);

        let (tx, rx) = std::sync::mpsc::channel();
        let (t, router_cfg) = (table.clone(), cfg.router.clone());
        let timeout = Duration::from_millis(cfg.kv_transfer.timeout_ms);
        let sup = cfg.supervisor.clone();
        let has_prefill = !cfg.prefill.ranks.is_empty();
        let caching = cfg.enable_prefix_caching;
        std::thread::Builder::new()
            .name("cleave-actors".into())
            .spawn(move || {
                let sys = actix::System::new();
                let addrs = sys.block_on(async move {
                    let transfer = KvTransfer::new(t.clone(), timeout).start();
                    if has_prefill {
                        Pool::new(Role::Prefill, t.clone(), spawn.clone(), transfer.clone(), &sup).start();
                    }
                    Pool::new(Role::Decode, t.clone(), spawn, transfer, &sup).start();
                    (Router::new(t, router_cfg, caching).start(), actix::System::current())
                });
                let _ = tx.send(addrs);
                if let Err(e) = sys.run() {
                    tracing::error!(error = %e, "actor system ended with an error");
                }
            })
            .map_err(|e| ActorError::Internal(format!("cannot start the actor thread: {e}")))?;
        let (router, system) = rx.recv().map_err(|_| ActorError::Internal("the actor system did not start".into()))?;
        let inner = Inner {
            cfg,
            table,
            router,
            system,
            tokenizer,
            info,
            next_id: AtomicU64::new(1),
            stopped: AtomicBool::new(false),
        };
        let cluster = Cluster { inner: Arc::new(inner) };
        if let Err(m) = cluster.inner.table.wait_all_up() {
            cluster.shutdown();
            return Err(ActorError::Load(m));
        }
        tracing::info!(
            prefill = ?cluster.inner.cfg.prefill.ranks,
            decode = ?cluster.inner.cfg.decode.ranks,
            model = %cluster.inner.info.served_model_name,
            "cluster up"
        );
        Ok(cluster)
    }

    /// The configuration the cluster runs.
    pub fn config(&self) -> &DeployConfig {
        &self.inner.cfg
    }

    pub fn tokenizer(&self) -> Arc<Tokenizer> {
        self.inner.tokenizer.clone()
    }

    pub fn model_info(&self) -> ModelInfo {
        self.inner.info.clone()
    }

    /// Checks a request against the model before it is queued (the rules of
    /// [`cleave_engine::RequestLimits`], which the gateway reports per field).
    pub fn validate(&self, prompt: &[u32], params: &SamplingParams) -> Result<(), ActorError> {
        let info = &self.inner.info;
        let limits = RequestLimits { vocab_size: info.vocab_size, max_model_len: info.max_model_len };
        limits.check(prompt, params, "prompt").map_err(|e| ActorError::Invalid(e.to_string()))
    }

    /// Submits a tokenized request; its tokens arrive on the returned stream. Dropping the
    /// stream aborts the request wherever it is and frees its blocks on every rank.
    pub async fn submit(&self, prompt: Vec<u32>, params: SamplingParams) -> Result<TokenStream, ActorError> {
        self.validate(&prompt, &params)?;
        let inner = &self.inner;
        if inner.stopped.load(Ordering::SeqCst) {
            return Err(ActorError::ShuttingDown);
        }
        let limit = inner.cfg.server.max_concurrent_requests;
        if inner.table.in_flight.load(Ordering::SeqCst) >= limit {
            return Err(ActorError::AtCapacity { limit });
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let n = prompt.len() as u64;
        let (ctx, mut stream) = ReqCtx::new(id, prompt, params, inner.table.clone());
        tracing::debug!(request_id = id, prompt_tokens = n, "submitted");
        match inner.router.send(RouteRequest(ctx)).await {
            Ok(Ok(_)) => {
                inner.table.metrics.prompt_tokens.inc_by(n);
                Ok(stream)
            }
            Ok(Err(e)) => {
                stream.disarm();
                Err(e)
            }
            Err(_) => {
                stream.disarm();
                Err(ActorError::ShuttingDown)
            }
        }
    }

    /// Prometheus text exposition (names prefixed `cleave_`).
    pub fn metrics_text(&self) -> String {
        let t = &self.inner.table;
        let m = &t.metrics;
        let mut queued = [0i64; 2];
        for (slot, r) in t.stats().into_iter().enumerate() {
            let (rank, pool) = (r.rank.to_string(), r.role.as_str());
            let labels = [rank.as_str(), pool];
            let sh = t.shared(slot);
            m.preemptions.with_label_values(&labels).inc_by(sh.preemptions.take_new());
            m.prefix_queries.with_label_values(&labels).inc_by(sh.prefix_queries.take_new());
            m.prefix_hits.with_label_values(&labels).inc_by(sh.prefix_hits.take_new());
            m.prefix_evictions.with_label_values(&labels).inc_by(sh.prefix_evictions.take_new());
            let (q, h) = (sh.prefix_queries.get(), sh.prefix_hits.get());
            m.prefix_hit_rate.with_label_values(&labels).set(if q == 0 { 0.0 } else { h as f64 / q as f64 });
            m.prefix_cached_blocks.with_label_values(&labels).set(sh.cached_blocks.load(Ordering::Relaxed) as i64);
            m.running.with_label_values(&labels).set(r.running as i64);
            m.waiting.with_label_values(&labels).set(r.waiting as i64);
            m.kv_blocks_in_use.with_label_values(&labels).set(r.blocks_in_use as i64);
            m.kv_blocks_total.with_label_values(&labels).set(r.blocks_total as i64);
            let usage = if r.blocks_total == 0 { 0.0 } else { r.blocks_in_use as f64 / r.blocks_total as f64 };
            m.kv_usage.with_label_values(&labels).set(usage);
            match r.role {
                Role::Prefill => queued[0] += r.queued as i64,
                Role::Decode => queued[1] += (r.waiting + r.queued) as i64,
            }
        }
        m.queue_depth.with_label_values(&["prefill"]).set(queued[0]);
        m.queue_depth.with_label_values(&["decode"]).set(queued[1]);
        m.in_flight.set(t.in_flight.load(Ordering::SeqCst) as i64);
        m.render()
    }

    /// Per-rank state and the requests in flight.
    pub fn stats(&self) -> ClusterStats {
        let t = &self.inner.table;
        ClusterStats { ranks: t.stats(), in_flight: t.in_flight.load(Ordering::SeqCst) }
    }

    /// Waits until nothing is in flight and no rank holds a block, or `timeout` passes; returns
    /// the last stats either way (tests assert on them).
    pub fn wait_idle(&self, timeout: Duration) -> ClusterStats {
        let end = std::time::Instant::now() + timeout;
        loop {
            let s = self.stats();
            if s.is_idle() || std::time::Instant::now() >= end {
                return s;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Ends every request with [`ActorError::ShuttingDown`], stops the ranks and the actors.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        if inner.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::info!("cluster shutting down");
        inner.table.shutdown();
        inner.system.stop();
    }

    /// Test hook: injects a one-shot fault into the rank with configured id `rank`.
    #[doc(hidden)]
    pub fn inject_fault(&self, rank: usize, fault: Fault) -> bool {
        let t = &self.inner.table;
        let Some(slot) = t.slots.iter().position(|s| s.rank == rank) else { return false };
        *t.shared(slot).fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
        t.send(slot, RankCmd::Wake)
    }

    /// Status of the rank with configured id `rank`.
    pub fn rank_status(&self, rank: usize) -> Option<RankStatus> {
        let t = &self.inner.table;
        t.slots.iter().position(|s| s.rank == rank).map(|i| t.status(i))
    }
}
