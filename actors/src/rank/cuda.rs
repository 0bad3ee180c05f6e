//! CUDA ranks: the configured rank id is the GPU ordinal. Each rank's thread opens its GPU
//! (context, streams, kernels), loads the model, sizes its KV cache from
//! `kv_cache.gpu_memory_utilization`, and gets its KV port: the engine's NCCL [`KvLink`]. When
//! every pool's groups are single GPUs, each (prefill, decode) pair's communicator is joined at
//! start-up; when a pool has larger groups, a pair's communicator is made at its first transfer
//! (the sender makes it, the receiver joins on its next poll), from the sampling GPU of the
//! prefill group's DP rank to every GPU of the decode group's DP rank. Nothing device-bound
//! leaves its thread: the factory holds only the pairs' NCCL ids (plain bytes) and the hub.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cleave_engine::backend::cuda::collectives::nccl_runners;
use cleave_engine::backend::cuda::transfer::{KvHub, KvLink};
use cleave_engine::backend::cuda::{CudaBackend, Precision};
use cleave_engine::group::with_ports;
use cleave_engine::kv_port::KvPort;
use cleave_engine::model::Model;
use cleave_engine::Engine;
use cleave_kernels::nccl::{NcclComm, NcclId};

use super::{RankFactory, RankInfo};
use crate::config::{ConfigError, DeployConfig, Dtype};
use crate::error::ActorError;

/// Fraction of GPU memory for weights plus KV cache when the config sets neither
/// `gpu_memory_utilization` nor `num_blocks`.
const DEFAULT_UTILIZATION: f64 = 0.9;
/// How long a rank waits for a peer to open its GPU before joining their communicator.
const PEER_WAIT: Duration = Duration::from_secs(300);

fn device_err(message: String) -> ActorError {
    ConfigError { file: None, field: Some("device".into()), line: None, message }.into()
}

/// Builds CUDA ranks that exchange KV over NCCL. One process drives every GPU, one rank thread
/// per GPU.
pub struct CudaRankFactory {
    links: Arc<Links>,
}

/// What the ranks' KV links share.
struct Links {
    hub: KvHub,
    /// One NCCL id per (prefill, decode) pair joined at start-up, sorted: every rank joins its
    /// pairs in this order. Empty when a pool has groups larger than one GPU.
    pairs: Vec<((usize, usize), NcclId)>,
    /// Whether each rank opened its GPU (a rank joins a communicator only after its peer did,
    /// so a peer that cannot open its GPU fails the start instead of hanging it).
    opened: Mutex<HashMap<usize, Result<(), String>>>,
    opened_cv: Condvar,
    /// Ranks that joined their start-up communicators (a second `create` is a restart).
    started: Mutex<HashSet<usize>>,
}

impl CudaRankFactory {
    /// Checks that the CUDA driver and libraries, a GPU for every rank and (when the deployment
    /// has prefill ranks) NCCL are present, and makes the start-up pairs' NCCL ids on this thread.
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
        let mut pairs = Vec::new();
        for &p in cfg.prefill.ranks.iter().filter(|_| !grouped) {
            for &d in &cfg.decode.ranks {
                let id = NcclComm::unique_id()
                    .map_err(|e| device_err(format!("the KV transfer between GPUs needs NCCL: {e}")))?;
                pairs.push(((p, d), id));
            }
        }
        pairs.sort_by_key(|(k, _)| *k);
        tracing::info!(gpus, start_up_pairs = pairs.len(), "cuda ranks: GPUs found, NCCL ids made");
        let links = Links {
            hub: KvHub::default(),
            pairs,
            opened: Mutex::new(HashMap::new()),
            opened_cv: Condvar::new(),
            started: Mutex::new(HashSet::new()),
        };
        Ok(CudaRankFactory { links: Arc::new(links) })
    }
}

impl Links {
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

    /// A new KV link for GPU `rank`, and whether it is the rank's first (on a restart, the
    /// previous incarnation's communicators are marked stale: peers re-create them).
    fn fresh_link(&self, rank: usize) -> (KvLink, bool) {
        let link = KvLink::new(self.hub.clone(), rank);
        let first = self.started.lock().unwrap_or_else(|e| e.into_inner()).insert(rank);
        if !first {
            link.invalidate_pairs();
            tracing::warn!(rank, "restarted rank: its peers re-create the NCCL communicators on the next transfer");
        }
        (link, first)
    }

    /// GPU `rank`'s KV link: its start-up communicators joined (first start), or those of the
    /// previous incarnation marked stale (restart).
    fn link(&self, be: &CudaBackend, rank: usize) -> Result<KvLink, ActorError> {
        let (mut link, first) = self.fresh_link(rank);
        if !first {
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

    fn create(&self, info: &RankInfo) -> Result<Engine<CudaBackend>, ActorError> {
        let rank = info.rank;
        let t0 = Instant::now();
        let precision = if info.dtype == Dtype::Float32 { Precision::F32 } else { Precision::Bf16 };
        if info.parallel.world() > 1 {
            return self.create_group(info, precision);
        }
        let be = match CudaBackend::with_precision(rank, precision) {
            Ok(be) => {
                self.links.set_opened(rank, Ok(()));
                be
            }
            Err(e) => {
                let m = format!("GPU {rank}: {e}");
                self.links.set_opened(rank, Err(m.clone()));
                return Err(ActorError::Load(m));
            }
        };
        tracing::info!(rank, gpu = %be.gpu().name, ms = t0.elapsed().as_millis() as u64, "GPU open");
        let link = self.links.link(&be, rank)?;
        let load = |e: cleave_engine::EngineError| ActorError::Load(format!("{}: {e}", info.model_dir.display()));
        let model = Model::load(&be, &info.model_dir, info.engine.load_options()).map_err(load)?;
        let mut cfg = info.engine;
        if cfg.num_blocks == 0 {
            let mc = model.config();
            let fraction = info.gpu_memory_utilization.unwrap_or(DEFAULT_UTILIZATION);
            cfg.num_blocks = be
                .kv_blocks_for_memory(fraction, mc.num_hidden_layers, cfg.block_size, mc.latent_dim())
                .map_err(load)?;
            tracing::info!(rank, fraction, num_blocks = cfg.num_blocks, "KV cache sized from GPU memory");
        }
        let mut engine = Engine::new(be, model, Some(info.tokenizer.clone()), cfg).map_err(load)?;
        engine.set_port(Box::new(link)).map_err(load)?;
        let runner = engine.local_runner();
        let graphs = runner.graph_sizes().len();
        let graph_mib = runner.backend().graph_bytes() >> 20;
        tracing::info!(
            rank,
            pool = info.role.as_str(),
            graphs,
            graph_mib,
            ms = t0.elapsed().as_millis() as u64,
            "cuda rank loaded"
        );
        Ok(engine)
    }
}

impl CudaRankFactory {
    /// A group over GPUs `info.group`, one thread per GPU with NCCL collectives and a KV link
    /// whose communicators are made at the first transfer of each pair.
    fn create_group(&self, info: &RankInfo, precision: Precision) -> Result<Engine<CudaBackend>, ActorError> {
        let t0 = Instant::now();
        let load = |e: cleave_engine::EngineError| ActorError::Load(format!("{}: {e}", info.model_dir.display()));
        let fraction = info.gpu_memory_utilization.unwrap_or(DEFAULT_UTILIZATION);
        let gpus = info.group.clone();
        let make = nccl_runners(info.parallel, gpus.clone(), &info.model_dir, info.engine, precision, fraction)
            .map_err(load)?;
        let links = self.links.clone();
        let make = with_ports(
            make,
            Arc::new(move |coord, _: &CudaBackend| {
                Ok(Box::new(links.fresh_link(gpus[coord.rank()]).0) as Box<dyn KvPort<CudaBackend>>)
            }),
        );
        let engine = Engine::start(info.parallel, make, Some(info.tokenizer.clone()), info.engine).map_err(load)?;
        tracing::info!(
            gpus = ?info.group,
            pool = info.role.as_str(),
            num_blocks = engine.config().num_blocks,
            ms = t0.elapsed().as_millis() as u64,
            "cuda group loaded"
        );
        Ok(engine)
    }
}
