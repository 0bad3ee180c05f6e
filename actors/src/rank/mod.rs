//! Ranks: one OS thread each, owning its engine (weights, KV cache, scheduler) and its transport
//! endpoint, both created on that thread by a [`RankFactory`]. A rank takes [`RankCmd`]s from a
//! flume channel, runs its step loop, and sends each request's tokens on that request's own
//! channel. Panics and errors end the thread; its pool restarts it.

mod cpu;
mod cuda;
mod worker;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

use cleave_engine::backend::Backend;
use cleave_engine::tokenizer::Tokenizer;
use cleave_engine::{Engine, EngineConfig, ParallelConfig};

pub use cpu::CpuRankFactory;
pub use cuda::CudaRankFactory;

use crate::command::RankCmd;
use crate::config::{Device, Dtype};
use crate::error::ActorError;
use crate::events::{RankEvents, RankExited, RankReady};
use crate::table::{RankShared, Role};

/// Everything a factory needs to build one rank, computed by the cluster from the config.
#[derive(Clone)]
pub struct RankInfo {
    /// Configured rank id (a thread label on CPU, the device ordinal on CUDA); for a group, its
    /// first rank.
    pub rank: usize,
    pub role: Role,
    /// The group's ranks (`[rank]` for a group of one), in group order.
    pub group: Vec<usize>,
    /// How the group spreads the model.
    pub parallel: ParallelConfig,
    /// Ranks in the cluster (to size per-rank thread pools).
    pub num_ranks: usize,
    pub device: Device,
    pub dtype: Dtype,
    pub model_dir: PathBuf,
    /// Limits for this rank's engine. On CUDA with `gpu_memory_utilization`, `num_blocks` is 0
    /// and the factory sizes the cache.
    pub engine: EngineConfig,
    pub gpu_memory_utilization: Option<f64>,
    /// The cluster's tokenizer, shared by every rank.
    pub tokenizer: Arc<Tokenizer>,
}

/// Builds a rank's backend and engine, its ranks' KV ports attached. Both methods run on the
/// rank's own thread (a group's other ranks on threads of their own), so nothing device-bound
/// ever crosses threads.
pub trait RankFactory: Send + Sync + 'static {
    type Backend: Backend + 'static;

    /// Loads the model and returns the engine, every rank with its KV port.
    fn create(&self, info: &RankInfo) -> Result<Engine<Self::Backend>, ActorError>;

    /// Wraps the rank's whole life on its thread (a CPU rank runs inside its own rayon pool).
    fn run_thread(&self, info: &RankInfo, body: Box<dyn FnOnce() + Send + '_>) {
        let _ = info;
        body()
    }
}

/// One incarnation of a rank, ready to run.
pub(crate) struct Launch {
    pub slot: usize,
    pub shared: Arc<RankShared>,
    pub rx: flume::Receiver<RankCmd>,
    pub events: RankEvents,
}

/// Starts a rank thread for a launch.
pub(crate) type Spawner = Arc<dyn Fn(Launch) -> std::io::Result<()> + Send + Sync>;

/// A spawner over `factory`, with the per-slot infos.
pub(crate) fn spawner<F: RankFactory>(factory: F, infos: Vec<RankInfo>) -> Spawner {
    let factory = Arc::new(factory);
    Arc::new(move |l: Launch| {
        let info = infos[l.slot].clone();
        let f = factory.clone();
        std::thread::Builder::new()
            .name(format!("cleave-{}-{}", info.role.as_str(), info.rank))
            .spawn(move || run_rank(&*f, info, l))?;
        Ok(())
    })
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

fn run_rank<F: RankFactory>(factory: &F, info: RankInfo, l: Launch) {
    let Launch { slot, shared, rx, events } = l;
    let inc = shared.inc;
    let mut loaded = false;
    let mut outcome: Option<Result<(), String>> = None;
    {
        let (loaded, outcome, events) = (&mut loaded, &mut outcome, events.clone());
        let info2 = info.clone();
        factory.run_thread(
            &info,
            Box::new(move || {
                let r = catch_unwind(AssertUnwindSafe(|| -> Result<(), ActorError> {
                    let engine = factory.create(&info2)?;
                    *loaded = true;
                    let mut w = worker::Worker::new(slot, &info2, engine, shared, events.clone());
                    w.publish();
                    events.ready.do_send(RankReady { slot, inc });
                    tracing::info!(rank = info2.rank, pool = info2.role.as_str(), "rank up");
                    w.run(&rx)
                }));
                *outcome = Some(match r {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(p) => Err(format!("panicked: {}", panic_message(&*p))),
                });
            }),
        );
    }
    let error = match outcome {
        Some(Ok(())) => None,
        Some(Err(e)) => Some(e),
        None => Some("the rank's thread wrapper did not run it".into()),
    };
    if let Some(e) = &error {
        tracing::error!(rank = info.rank, pool = info.role.as_str(), error = %e, "rank failed");
    }
    events.exited.do_send(RankExited { slot, inc, loaded, error });
}
