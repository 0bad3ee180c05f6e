//! NCCL collectives for the ranks of a group on GPUs: one communicator per axis (the rank's TP
//! line, its DP line, the whole group), each created on the rank's own thread and kept there. The
//! collectives are queued on the backend's stream; [`Collectives::settle`] bounds the wait for
//! them at the end of each step and aborts the communicators of a group whose peer stopped.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cleave_kernels::nccl::{NcclComm, NcclId, P2p};

use super::peer::{peer_bytes_from_env, PeerBoard, PeerLine};
use super::{kerr, CudaBackend, CudaTensor, Precision};
use crate::backend::Backend;
use crate::engine::{Engine, EngineConfig};
use crate::error::{EngineError, Result};
use crate::group::RunnerFactory;
use crate::model::Model;
use crate::parallel::{Axis, Collectives, ParallelConfig, RankCoord};
use crate::runner::ModelRunner;

/// How long a rank waits for its peers to create the communicators.
const JOIN_DEADLINE: Duration = Duration::from_secs(300);
/// How long a step's collectives may take to complete.
const STEP_DEADLINE: Duration = Duration::from_secs(60);

fn nerr(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Backend(format!("{what}: {e}"))
}

/// One communicator line's meeting points: its NCCL id and its peer all-reduce board.
#[derive(Clone)]
struct Line {
    id: NcclId,
    board: Arc<PeerBoard>,
}

/// The rendezvous of a group's communicators, made once before its rank threads start.
#[derive(Clone)]
pub struct GroupIds {
    par: ParallelConfig,
    world: Line,
    /// One per TP line (by DP rank) and per DP line (by TP rank).
    tp: Vec<Line>,
    dp: Vec<Line>,
    /// Bytes up to which all-reduces take the peer kernel (0: never; `CLEAVE_ALLREDUCE`).
    peer_bytes: usize,
}

impl GroupIds {
    pub fn new(par: ParallelConfig) -> Result<Self> {
        let line = |n: usize| -> Result<Line> {
            let id = NcclComm::unique_id().map_err(|e| nerr("a parallel group on GPUs needs NCCL", e))?;
            Ok(Line { id, board: PeerBoard::new(n) })
        };
        let (tp, dp) = (par.tensor_parallel_size, par.data_parallel_size);
        Ok(GroupIds {
            par,
            world: line(par.world())?,
            tp: (0..dp).map(|_| line(tp)).collect::<Result<_>>()?,
            dp: (0..tp).map(|_| line(dp)).collect::<Result<_>>()?,
            peer_bytes: peer_bytes_from_env()?,
        })
    }
}

/// One axis of a rank: its NCCL communicator and, for small sums, the peer all-reduce.
struct AxisComm {
    nccl: RefCell<NcclComm>,
    peer: Option<PeerLine>,
}

/// One rank's communicators (none for an axis of one rank).
pub struct NcclCollectives {
    coord: RankCoord,
    world: Option<AxisComm>,
    tp: Option<AxisComm>,
    dp: Option<AxisComm>,
}

impl NcclCollectives {
    /// Joins rank `coord`'s communicators on `be`'s GPU, every rank in the same order (world,
    /// TP line, DP line), so that no two ranks wait on each other's different communicators.
    pub fn join(be: &CudaBackend, ids: &GroupIds, coord: RankCoord) -> Result<Self> {
        let deadline = Instant::now() + JOIN_DEADLINE;
        let par = ids.par;
        let join = |line: &Line, rank: usize, n: usize, what: &str, sums: bool| -> Result<Option<AxisComm>> {
            if n == 1 {
                return Ok(None);
            }
            let c = NcclComm::init(be.gpu(), line.id, rank, n, deadline)
                .map_err(|e| nerr(&format!("rank {}: the {what} communicator", coord.rank()), e))?;
            let peer = match ids.peer_bytes {
                bytes if bytes > 0 && sums => PeerLine::join(be.gpu(), &line.board, rank, bytes, deadline)?,
                _ => None,
            };
            Ok(Some(AxisComm { nccl: RefCell::new(c), peer }))
        };
        Ok(NcclCollectives {
            coord,
            // The model sums over TP (attention, dense MLPs) and the group (MoE); DP lines only
            // gather rows, so they get no peer region (their sums, if any, take NCCL).
            world: join(&ids.world, coord.rank(), par.world(), "group", true)?,
            tp: join(&ids.tp[coord.dp], coord.tp, par.tensor_parallel_size, "TP", true)?,
            dp: join(&ids.dp[coord.tp], coord.dp, par.data_parallel_size, "DP", false)?,
        })
    }

    fn axis(&self, axis: Axis) -> Option<&AxisComm> {
        match axis {
            Axis::Tp => self.tp.as_ref(),
            Axis::Dp => self.dp.as_ref(),
            Axis::World => self.world.as_ref(),
        }
    }

    fn comm(&self, axis: Axis) -> Option<&RefCell<NcclComm>> {
        self.axis(axis).map(|a| &a.nccl)
    }

    fn all(&self) -> impl Iterator<Item = &AxisComm> {
        [&self.world, &self.tp, &self.dp].into_iter().flatten()
    }
}

impl Collectives<CudaBackend> for NcclCollectives {
    fn size(&self, axis: Axis) -> usize {
        self.comm(axis).map_or(1, |c| c.borrow().world())
    }

    fn all_reduce(&self, be: &CudaBackend, axis: Axis, x: &mut CudaTensor) -> Result<()> {
        let Some(a) = self.axis(axis) else { return Ok(()) };
        let n = x.len();
        let p = x.ptr_mut();
        // SAFETY (both): `p` addresses the tensor's `n` f32 values on this backend's GPU; the
        // tensor outlives the step, whose end synchronizes the stream; the peers' regions live
        // until every rank of the line reached teardown.
        match a.peer.as_ref().and_then(|l| l.takes(n)) {
            Some((peer, two_shot)) => unsafe { peer.all_reduce_f32(be.gpu(), p, n, two_shot) },
            None => unsafe { a.nccl.borrow().all_reduce_sum_f32(be.gpu(), p, n) },
        }
        .map_err(kerr)
    }

    fn all_gather_rows(&self, be: &CudaBackend, axis: Axis, x: &CudaTensor, rows: &[usize]) -> Result<CudaTensor> {
        let (own, cols) = be.dims(x);
        let me = match axis {
            Axis::Tp => self.coord.tp,
            Axis::Dp => self.coord.dp,
            Axis::World => self.coord.rank(),
        };
        if rows.get(me) != Some(&own) || rows.len() != self.size(axis) {
            return Err(EngineError::Backend(format!("all_gather_rows: counts {rows:?} for rank {me} of {own} rows")));
        }
        let total: usize = rows.iter().sum();
        let out = be.tensor(total, cols)?;
        let row_bytes = cols * 4;
        let offset = |r: usize| rows[..r].iter().sum::<usize>() * row_bytes;
        // SAFETY: source and destination are distinct live allocations of this GPU of at least the
        // bytes copied.
        unsafe { be.gpu().dtod(out.ptr() + offset(me) as u64, x.ptr(), own * row_bytes) }.map_err(kerr)?;
        let Some(c) = self.comm(axis) else { return Ok(out) };
        // Rows differ per rank: every rank sends its rows to each peer and receives each peer's
        // rows at their offset, in one group.
        let peers = (0..rows.len()).filter(|&r| r != me);
        let sends: Vec<P2p> = peers.clone().map(|peer| P2p { ptr: x.ptr(), bytes: own * row_bytes, peer }).collect();
        let recvs: Vec<P2p> = peers
            .map(|peer| P2p { ptr: out.ptr() + offset(peer) as u64, bytes: rows[peer] * row_bytes, peer })
            .collect();
        // SAFETY: every send and receive names a live buffer of this GPU of its byte count, kept
        // until the transfer completes (the caller waits on it before reusing them).
        unsafe { c.borrow().transfer(be.gpu(), &sends, &recvs) }.map_err(kerr)?;
        Ok(out)
    }

    fn settle(&self, be: &CudaBackend) -> Result<()> {
        if self.world.is_none() && self.tp.is_none() && self.dp.is_none() {
            return Ok(());
        }
        let ev = be.gpu().record().map_err(kerr)?;
        let t0 = Instant::now();
        loop {
            let mut done = true;
            for a in self.all() {
                done &= a.nccl.borrow_mut().poll(&ev).map_err(kerr)?;
            }
            if done {
                return self.peers_arrived(be);
            }
            if t0.elapsed() > STEP_DEADLINE {
                self.abandon("a step's collectives timed out");
                return Err(EngineError::Timeout(format!(
                    "rank {}: the step's collectives did not complete within {} s",
                    self.coord.rank(),
                    STEP_DEADLINE.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn capturable(&self) -> bool {
        true
    }

    fn abandon(&self, why: &str) {
        tracing::warn!(rank = self.coord.rank(), why, "aborting the group's NCCL communicators");
        for a in self.all() {
            a.nccl.borrow_mut().abort();
        }
    }
}

impl NcclCollectives {
    /// After a step: an error if a peer all-reduce gave up waiting for a peer (its sums are
    /// wrong), which also abandons the group.
    fn peers_arrived(&self, be: &CudaBackend) -> Result<()> {
        for a in self.all() {
            if let Some(l) = &a.peer {
                if l.timed_out(be.gpu())? {
                    self.abandon("a peer all-reduce timed out");
                    return Err(EngineError::Timeout(format!(
                        "rank {}: a peer all-reduce waited for a peer that never came",
                        self.coord.rank()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Runners for a group on GPUs `gpus` (one per rank, in group order), each on its own thread with
/// its NCCL communicators (fresh ids per call, so a restarted group makes new ones). With
/// `cfg.num_blocks` 0 each rank sizes its cache to `memory_fraction` of its GPU after loading.
pub fn nccl_runners(
    par: ParallelConfig,
    gpus: Vec<usize>,
    dir: &Path,
    cfg: EngineConfig,
    precision: Precision,
    memory_fraction: f64,
) -> Result<Arc<RunnerFactory<CudaBackend>>> {
    if gpus.len() != par.world() {
        return Err(EngineError::Config(format!("a group of {} ranks on {} GPUs", par.world(), gpus.len())));
    }
    let ids = GroupIds::new(par)?;
    let path = dir.to_path_buf();
    Ok(Arc::new(move |coord: RankCoord| {
        let gpu = gpus[coord.rank()];
        let be = CudaBackend::with_precision(gpu, precision)?;
        let comm = NcclCollectives::join(&be, &ids, coord)?;
        let model = Model::load_shard(&be, &path, cfg.load_options(), coord)?;
        let mut size = cfg.cache_size();
        if size.num_blocks == 0 {
            let mc = model.config();
            size.num_blocks =
                be.kv_blocks_for_memory(memory_fraction, mc.num_hidden_layers, size.block_size, mc.latent_dim())?;
            tracing::info!(rank = coord.rank(), gpu, num_blocks = size.num_blocks, "KV cache sized from GPU memory");
        }
        ModelRunner::new(be, model, size, Some(Box::new(comm)))
    }))
}

/// Loads `dir` over a group of `par` ranks on GPUs `0..world` with NCCL collectives.
pub fn load_nccl_group(
    par: ParallelConfig,
    dir: &Path,
    cfg: EngineConfig,
    precision: Precision,
) -> Result<Engine<CudaBackend>> {
    let make = nccl_runners(par, (0..par.world()).collect(), dir, cfg, precision, 0.9)?;
    let tokenizer = crate::tokenizer::Tokenizer::from_dir_if_present(dir)?;
    Engine::start(par, make, tokenizer, cfg)
}
