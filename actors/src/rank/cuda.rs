//! CUDA ranks: the configured rank id is the GPU ordinal. Each rank's thread opens its GPU
//! (context, streams, kernels), joins the NCCL communicator of every (prefill, decode) pair it
//! belongs to, loads the model, sizes its KV cache from `kv_cache.gpu_memory_utilization`, and
//! moves KV over NCCL with the engine's [`KvLink`] protocol. Nothing device-bound leaves the
//! thread: the factory holds only the pairs' NCCL ids (plain bytes) and the in-process hub.
//!
//! When either pool's groups span several GPUs, KV moves through the host instead (the group's
//! export reads the DP rank's sampling GPU, its import writes every TP rank of the DP rank that
//! reserved the blocks; one process holds every rank): docs/architecture.md says why.

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use cleave_engine::backend::cuda::collectives::nccl_runners;
use cleave_engine::backend::cuda::transfer::{KvHub, KvLink};
use cleave_engine::backend::cuda::{CudaBackend, Precision};
use cleave_engine::kv_cache::blocks_for;
use cleave_engine::model::Model;
use cleave_engine::Engine;
use cleave_kernels::nccl::{NcclComm, NcclId};

use super::{RankFactory, RankInfo};
use crate::config::{ConfigError, DeployConfig, Dtype};
use crate::error::ActorError;
use crate::transport::{MemcpyHub, TransferTicket, Transport, TransportError};

/// Fraction of GPU memory for weights plus KV cache when the config sets neither
/// `gpu_memory_utilization` nor `num_blocks`.
const DEFAULT_UTILIZATION: f64 = 0.9;
/// How long a rank waits for a peer to open its GPU before joining their communicator.
const PEER_WAIT: Duration = Duration::from_secs(300);

fn device_err(message: String) -> ActorError {
    ConfigError { file: None, field: Some("device".into()), line: None, message }.into()
}

/// Builds CUDA ranks that exchange KV over NCCL. One process drives every GPU, one rank thread
/// per GPU; each (prefill, decode) pair gets a 2-rank communicator at start-up.
pub struct CudaRankFactory {
    hub: KvHub,
    /// One NCCL id per (prefill, decode) pair, sorted: every rank joins its pairs in this order.
    pairs: Vec<((usize, usize), NcclId)>,
    /// Whether each rank opened its GPU (a rank joins a communicator only after its peer did,
    /// so a peer that cannot open its GPU fails the start instead of hanging it).
    opened: Mutex<HashMap<usize, Result<(), String>>>,
    opened_cv: Condvar,
    /// Ranks that joined their start-up communicators (a second `create` is a restart).
    started: Mutex<HashSet<usize>>,
    /// Host-staged transfers, for deployments with multi-GPU groups (no NCCL pairs then).
    staged: Option<MemcpyHub>,
}

impl CudaRankFactory {
    /// Checks that the CUDA driver and libraries, a GPU for every rank and (when the deployment
    /// has prefill ranks) NCCL are present, and makes the pairs' NCCL ids on this thread.
    pub fn new(cfg: &DeployConfig) -> Result<Self, ActorError> {
        let gpus = cleave_kernels::probe().map_err(|why| {
            device_err(format!("cuda ranks need an NVIDIA GPU and its driver, and none is usable here: {why}"))
        })?;
        let ranks = cfg.prefill.ranks.iter().chain(&cfg.decode.ranks);
        if let Some(r) = ranks.clone().find(|&&r| r >= gpus) {
            return Err(device_err(format!(
                "rank {r} is GPU {r}, but {gpus} GPU{} visible",
                if gpus == 1 { " is" } else { "s are" }
            )));
        }
        let grouped = cfg.prefill.parallel().world() > 1 || cfg.decode.parallel().world() > 1;
        let staged = (grouped && cfg.is_disaggregated()).then(MemcpyHub::new);
        let mut pairs = Vec::new();
        for &p in cfg.prefill.ranks.iter().filter(|_| staged.is_none()) {
            for &d in &cfg.decode.ranks {
                let id = NcclComm::unique_id()
                    .map_err(|e| device_err(format!("the KV transfer between GPUs needs NCCL: {e}")))?;
                pairs.push(((p, d), id));
            }
        }
        pairs.sort_by_key(|(k, _)| *k);
        tracing::info!(
            gpus,
            pairs = pairs.len(),
            host_staged = staged.is_some(),
            "cuda ranks: GPUs found, NCCL ids made"
        );
        Ok(CudaRankFactory {
            hub: KvHub::default(),
            pairs,
            opened: Mutex::new(HashMap::new()),
            opened_cv: Condvar::new(),
            started: Mutex::new(HashSet::new()),
            staged,
        })
    }

    fn set_opened(&self, rank: usize, r: Result<(), String>) {
        self.opened.lock().unwrap_or_else(|e| e.into_inner()).insert(rank, r);
        self.opened_cv.notify_all();
    }

    /// Waits until `peer` opened its GPU; its error if it could not.
    fn wait_opened(&self, me: usize, peer: usize) -> Result<(), ActorError> {
        let end = Instant::now() + PEER_WAIT;
        let mut g = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match g.get(&peer) {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => return Err(ActorError::Load(format!("rank {me}: peer rank {peer} failed: {e}"))),
                None if Instant::now() >= end => {
                    return Err(ActorError::Load(format!(
                        "rank {me}: peer rank {peer} did not open its GPU within {} s",
                        PEER_WAIT.as_secs()
                    )))
                }
                None => {
                    g = self.opened_cv.wait_timeout(g, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0
                }
            }
        }
    }

    /// Joins this rank's start-up communicators (first start) or marks the previous
    /// incarnation's stale (restart).
    fn link(&self, be: &CudaBackend, rank: usize) -> Result<KvLink, ActorError> {
        let mut link = KvLink::new(self.hub.clone(), rank);
        let first = self.started.lock().unwrap_or_else(|e| e.into_inner()).insert(rank);
        if !first {
            link.invalidate_pairs();
            tracing::warn!(rank, "restarted rank: its peers re-create the NCCL communicators on the next transfer");
            return Ok(link);
        }
        for &((src, dst), id) in self.pairs.iter().filter(|((s, d), _)| *s == rank || *d == rank) {
            self.wait_opened(rank, if src == rank { dst } else { src })?;
            link.connect(be.gpu(), src, dst, id, Instant::now() + PEER_WAIT)
                .map_err(|e| ActorError::Load(format!("NCCL communicator {src} -> {dst}: {e}")))?;
        }
        Ok(link)
    }
}

impl RankFactory for CudaRankFactory {
    type Backend = CudaBackend;

    fn create(&self, info: &RankInfo) -> Result<(Engine<CudaBackend>, Box<dyn Transport<CudaBackend>>), ActorError> {
        let rank = info.rank;
        let t0 = Instant::now();
        let precision = if info.dtype == Dtype::Float32 { Precision::F32 } else { Precision::Bf16 };
        if info.parallel.world() > 1 {
            return self.create_group(info, precision);
        }
        let be = match CudaBackend::with_precision(rank, precision) {
            Ok(be) => {
                self.set_opened(rank, Ok(()));
                be
            }
            Err(e) => {
                let m = format!("GPU {rank}: {e}");
                self.set_opened(rank, Err(m.clone()));
                return Err(ActorError::Load(m));
            }
        };
        tracing::info!(rank, gpu = %be.gpu().name, ms = t0.elapsed().as_millis() as u64, "GPU open");
        let transport: Box<dyn Transport<CudaBackend>> = match &self.staged {
            Some(hub) => Box::new(hub.endpoint()),
            None => Box::new(NcclTransport { link: self.link(&be, rank)? }),
        };
        let load = |e: cleave_engine::EngineError| ActorError::Load(format!("{}: {e}", info.model_dir.display()));
        let model = Model::load(&be, &info.model_dir, info.engine.max_model_len).map_err(load)?;
        let mut cfg = info.engine;
        if cfg.num_blocks == 0 {
            let mc = model.config();
            let fraction = info.gpu_memory_utilization.unwrap_or(DEFAULT_UTILIZATION);
            cfg.num_blocks = be
                .kv_blocks_for_memory(fraction, mc.num_hidden_layers, cfg.block_size, mc.latent_dim())
                .map_err(load)?;
            tracing::info!(rank, fraction, num_blocks = cfg.num_blocks, "KV cache sized from GPU memory");
        }
        let engine = Engine::new(be, model, Some(info.tokenizer.clone()), cfg).map_err(load)?;
        tracing::info!(rank, pool = info.role.as_str(), ms = t0.elapsed().as_millis() as u64, "cuda rank loaded");
        Ok((engine, transport))
    }
}

impl CudaRankFactory {
    /// A group over GPUs `info.group`, one thread per GPU with NCCL collectives; its KV moves
    /// through the host (or nowhere, serving colocated).
    fn create_group(
        &self,
        info: &RankInfo,
        precision: Precision,
    ) -> Result<(Engine<CudaBackend>, Box<dyn Transport<CudaBackend>>), ActorError> {
        let t0 = Instant::now();
        let load = |e: cleave_engine::EngineError| ActorError::Load(format!("{}: {e}", info.model_dir.display()));
        let fraction = info.gpu_memory_utilization.unwrap_or(DEFAULT_UTILIZATION);
        let make = nccl_runners(info.parallel, info.group.clone(), &info.model_dir, info.engine, precision, fraction)
            .map_err(load)?;
        let engine = Engine::start(info.parallel, make, Some(info.tokenizer.clone()), info.engine).map_err(load)?;
        tracing::info!(
            gpus = ?info.group,
            pool = info.role.as_str(),
            num_blocks = engine.config().num_blocks,
            ms = t0.elapsed().as_millis() as u64,
            "cuda group loaded"
        );
        let transport: Box<dyn Transport<CudaBackend>> = match &self.staged {
            Some(hub) => Box::new(hub.endpoint()),
            None => Box::new(NcclTransport { link: KvLink::new(self.hub.clone(), info.rank) }),
        };
        Ok((engine, transport))
    }
}

/// A rank's endpoint of the NCCL KV transport (the engine's [`KvLink`]).
struct NcclTransport {
    link: KvLink,
}

impl Transport<CudaBackend> for NcclTransport {
    fn send(&mut self, engine: &Engine<CudaBackend>, t: &TransferTicket) -> Result<u64, TransportError> {
        let src = t.src_rank;
        if Instant::now() >= t.deadline {
            return Err(TransportError::TimedOut(format!(
                "rank {src}: the transfer's deadline passed before the send"
            )));
        }
        let seq = engine
            .sequence(t.req)
            .ok_or_else(|| TransportError::Failed(format!("rank {src} holds no request {}", t.req)))?;
        if seq.prompt_len != t.prompt_len {
            return Err(TransportError::Failed(format!(
                "rank {src} holds {} prompt tokens, the ticket says {}",
                seq.prompt_len, t.prompt_len
            )));
        }
        let n = blocks_for(seq.prompt_len, engine.config().block_size);
        if n != t.blocks.len() || seq.blocks.len() < n || t.cached_blocks >= n {
            return Err(TransportError::Failed(format!(
                "rank {src} holds {} blocks for {n}, the receiver reserved {}",
                seq.blocks.len(),
                t.blocks.len()
            )));
        }
        let runner = engine.local_runner();
        let t0 = Instant::now();
        let bytes = self
            .link
            .send(
                runner.backend(),
                runner.kv_cache(),
                &seq.blocks[t.cached_blocks..n],
                t.moving(),
                t.dst_rank,
                t.req,
                t.deadline,
            )
            .map_err(|e| TransportError::from_engine(&format!("send from rank {src}"), e))?;
        tracing::debug!(
            request_id = t.req,
            src,
            dst = t.dst_rank,
            bytes,
            us = t0.elapsed().as_micros() as u64,
            "KV sent"
        );
        Ok(bytes)
    }

    fn poll_recv(
        &mut self,
        engine: &mut Engine<CudaBackend>,
        t: &TransferTicket,
    ) -> Result<Option<u64>, TransportError> {
        let (be, cache) = engine.local_runner_mut().backend_and_kv_cache_mut();
        self.link
            .poll_recv(be, cache, t.moving(), t.src_rank, t.req, t.deadline)
            .map_err(|e| TransportError::from_engine(&format!("receive on rank {}", t.dst_rank), e))
    }

    fn cancel(&mut self, t: &TransferTicket) {
        self.link.cancel(t.src_rank, t.req);
    }
}
