//! CPU ranks: the reference backend, each rank in its own rayon pool (the machine's cores split
//! between ranks, so a prefill rank does not steal a decode rank's cores), KV moved between the
//! ranks' threads through host memory ([`MemHub`]), rank to rank as NCCL moves it on GPUs.

use std::sync::Arc;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::group::with_ports;
use cleave_engine::kv_port::{KvPort, MemHub};
use cleave_engine::model::Model;
use cleave_engine::Engine;

use super::{RankFactory, RankInfo};
use crate::error::ActorError;

/// Builds CPU ranks that exchange KV through one [`MemHub`].
pub struct CpuRankFactory {
    hub: MemHub,
    threads_per_rank: Option<usize>,
}

impl CpuRankFactory {
    /// A factory whose ranks split the machine's cores evenly.
    pub fn new() -> Self {
        CpuRankFactory { hub: MemHub::new(), threads_per_rank: None }
    }

    /// Fixes the rayon threads of each rank.
    pub fn with_threads_per_rank(mut self, n: usize) -> Self {
        self.threads_per_rank = Some(n.max(1));
        self
    }

    /// The hub the ranks' KV ports share (tests check it is empty afterwards).
    pub fn hub(&self) -> MemHub {
        self.hub.clone()
    }

    fn threads(&self, info: &RankInfo) -> usize {
        self.threads_per_rank.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            (cores / info.num_ranks.max(1)).max(1)
        })
    }
}

impl Default for CpuRankFactory {
    fn default() -> Self {
        Self::new()
    }
}

impl RankFactory for CpuRankFactory {
    type Backend = CpuBackend;

    fn create(&self, info: &RankInfo) -> Result<Engine<CpuBackend>, ActorError> {
        let load = |e: cleave_engine::EngineError| ActorError::Load(format!("{}: {e}", info.model_dir.display()));
        let tokenizer = Some(info.tokenizer.clone());
        if info.parallel.world() == 1 {
            let model = Model::load(&CpuBackend, &info.model_dir, info.engine.load_options()).map_err(load)?;
            let mut engine = Engine::new(CpuBackend, model, tokenizer, info.engine).map_err(load)?;
            engine.set_port(Box::new(self.hub.port(info.rank))).map_err(load)?;
            return Ok(engine);
        }
        // The group's other ranks are threads of their own (on the global rayon pool).
        let make = Engine::in_process_runners(info.parallel, &info.model_dir, info.engine, |_| Ok(CpuBackend));
        let (hub, ranks) = (self.hub.clone(), info.group.clone());
        let make = with_ports(
            make,
            Arc::new(move |coord, _: &CpuBackend| {
                Ok(Box::new(hub.port(ranks[coord.rank()])) as Box<dyn KvPort<CpuBackend>>)
            }),
        );
        Engine::start(info.parallel, make, tokenizer, info.engine).map_err(load)
    }

    fn run_thread(&self, info: &RankInfo, body: Box<dyn FnOnce() + Send + '_>) {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads(info))
            .thread_name({
                let (role, rank) = (info.role.as_str(), info.rank);
                move |i| format!("cleave-{role}-{rank}-w{i}")
            })
            .build();
        match pool {
            Ok(pool) => pool.install(body),
            Err(e) => {
                tracing::warn!(rank = info.rank, error = %e, "no rayon pool for this rank; using the global one");
                body()
            }
        }
    }
}
