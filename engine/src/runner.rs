//! A model runner: one rank's weight shard, KV cache, backend and communicators, on the thread
//! that created them. It executes the step its group's core planned and, on the ranks that sample,
//! returns the sampled tokens and the logits rows the core samples on the host.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::{Backend, KvLayout, SampleRow};
use crate::error::{EngineError, Result};
use crate::graphs::{CaptureReport, DecodeGraphs};
use crate::kv_port::KvPort;
use crate::model::{LoadOptions, Model, StepInput};
use crate::parallel::{Collectives, RankCoord};
use crate::structured::MaskBoard;

/// One DP rank's share of a step.
#[derive(Debug, Clone, Default)]
pub struct RankBatch {
    pub input: StepInput,
    /// Rows sampled where the logits are.
    pub device: Vec<SampleRow>,
    /// `device` rows under a structured-output constraint: (row index, sequence id) whose mask
    /// comes from the plan's board.
    pub masked: Vec<(usize, u64)>,
    /// Rows whose logits go to the host (repetition penalty, top logprobs, suppressed tokens).
    pub host: Vec<u32>,
}

/// A step of a whole group: one batch per DP rank (a DP rank without work has an empty one).
#[derive(Debug, Clone)]
pub struct StepPlan {
    pub ranks: Vec<RankBatch>,
    /// The masks of the constrained rows, published while the forward pass runs.
    pub masks: Arc<MaskBoard>,
}

impl Default for StepPlan {
    fn default() -> Self {
        StepPlan { ranks: Vec::new(), masks: Arc::new(MaskBoard::ready(Default::default())) }
    }
}

/// What a sampling rank returns for its DP rank.
#[derive(Debug, Clone, Default)]
pub struct RankOutput {
    /// Token and logprob of each `RankBatch::device` row, in order.
    pub device: Vec<(u32, f32)>,
    /// The `RankBatch::host` rows' logits, `[rows, vocab]`.
    pub host: Vec<f32>,
}

/// The paged latent cache's size on each rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSize {
    pub block_size: usize,
    pub num_blocks: usize,
}

fn no_port(coord: RankCoord) -> EngineError {
    EngineError::Config(format!("group rank {} has no KV port (its pool is not disaggregated)", coord.rank()))
}

/// One rank's model, cache and communicators.
pub struct ModelRunner<B: Backend> {
    be: B,
    model: Model<B>,
    cache: B::KvCache,
    num_blocks: usize,
    block_size: usize,
    comm: Option<Box<dyn Collectives<B>>>,
    /// This rank's end of the KV links between groups (disaggregated serving).
    port: Option<Box<dyn KvPort<B>>>,
    /// Captured decode steps, when captured ([`ModelRunner::capture_graphs`]).
    graphs: Option<DecodeGraphs<B>>,
}

impl<B: Backend> ModelRunner<B> {
    /// Allocates the cache for a loaded model part.
    pub fn new(be: B, model: Model<B>, size: CacheSize, comm: Option<Box<dyn Collectives<B>>>) -> Result<Self> {
        if model.coord().par.world() > 1 && comm.is_none() {
            return Err(EngineError::Config("a rank of a parallel group needs its communicators".into()));
        }
        let mc = model.config();
        let layout = KvLayout {
            layers: mc.num_hidden_layers,
            num_blocks: size.num_blocks,
            block_size: size.block_size,
            width: mc.latent_dim(),
        };
        let cache = be.alloc_kv_cache(layout)?;
        Ok(ModelRunner {
            be,
            model,
            cache,
            num_blocks: size.num_blocks,
            block_size: size.block_size,
            comm,
            port: None,
            graphs: None,
        })
    }

    /// Loads rank `coord`'s part of the checkpoint in `dir` and allocates its cache.
    pub fn load(
        be: B,
        dir: &Path,
        opts: LoadOptions,
        size: CacheSize,
        coord: RankCoord,
        comm: Option<Box<dyn Collectives<B>>>,
    ) -> Result<Self> {
        let model = Model::load_shard(&be, dir, opts, coord)?;
        Self::new(be, model, size, comm)
    }

    /// Blocks of this rank's cache.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    pub fn coord(&self) -> RankCoord {
        self.model.coord()
    }
    pub fn model(&self) -> &Model<B> {
        &self.model
    }
    pub fn backend(&self) -> &B {
        &self.be
    }
    pub fn kv_cache(&self) -> &B::KvCache {
        &self.cache
    }
    /// The backend with the cache it may write (benchmarks fill it with synthetic context).
    pub fn backend_and_cache(&mut self) -> (&B, &mut B::KvCache) {
        (&self.be, &mut self.cache)
    }
    /// Gives this rank its end of the KV links between groups.
    pub fn set_port(&mut self, port: Box<dyn KvPort<B>>) {
        self.port = Some(port);
    }
    /// The configured id of this rank's KV port, if it has one.
    pub fn port_rank(&self) -> Option<usize> {
        self.port.as_ref().map(|p| p.rank())
    }

    /// Sends `blocks` of this rank's cache to each of `dsts`, into the blocks `dst_blocks` they
    /// reserved; the bytes sent to one of them.
    pub fn send_kv(
        &mut self,
        blocks: &[u32],
        dst_blocks: &[u32],
        dsts: &[usize],
        req: u64,
        deadline: Instant,
    ) -> Result<u64> {
        let coord = self.coord();
        let port = self.port.as_mut().ok_or_else(|| no_port(coord))?;
        let mut bytes = 0;
        for &dst in dsts {
            bytes = port.send(&self.be, &self.cache, blocks, dst_blocks, dst, req, deadline)?;
        }
        Ok(bytes)
    }

    /// Receives request `req`'s KV from rank `src` into `blocks` (see [`KvPort::poll_recv`]).
    pub fn poll_kv(&mut self, blocks: &[u32], src: usize, req: u64, deadline: Instant) -> Result<Option<u64>> {
        let coord = self.coord();
        let port = self.port.as_mut().ok_or_else(|| no_port(coord))?;
        port.poll_recv(&self.be, &mut self.cache, blocks, src, req, deadline)
    }

    /// Forgets an abandoned receive.
    pub fn cancel_kv(&mut self, src: usize, req: u64) {
        if let Some(p) = self.port.as_mut() {
            p.cancel(src, req);
        }
    }

    /// Runs this rank's part of `plan`; the sampling ranks return their DP rank's samples.
    pub fn execute(&mut self, plan: &StepPlan) -> Result<Option<RankOutput>> {
        let b = plan
            .ranks
            .get(self.coord().dp)
            .ok_or_else(|| EngineError::Backend(format!("a step plan without DP rank {}", self.coord().dp)))?;
        let comm = self.comm.as_deref();
        let replayed = match &self.graphs {
            Some(g) => g.run(&self.be, &b.input)?,
            None => None,
        };
        let eager;
        let logits = match replayed {
            Some(l) => l,
            None => {
                eager = self.model.forward(&self.be, &mut self.cache, comm, &b.input)?;
                eager.as_ref()
            }
        };
        if let Some(c) = comm {
            c.settle(&self.be)?;
        }
        let Some(logits) = logits else {
            // A rank that does not sample, or a sampling rank whose DP rank had no tokens.
            return Ok(self.coord().samples().then(RankOutput::default));
        };
        let device = if b.masked.is_empty() {
            self.be.sample(logits, &b.device, &[])?
        } else {
            // The GPU runs the forward pass meanwhile: wait for the masks only now.
            let board = plan.masks.wait();
            let words = self.model.config().vocab_size.div_ceil(32);
            let (mut rows, mut bits) = (b.device.clone(), Vec::with_capacity(b.masked.len() * words));
            for &(i, id) in &b.masked {
                // A sequence without a mask is ended by the core after this step.
                if let (Some(Ok(m)), Some(row)) = (board.get(&id), rows.get_mut(i)) {
                    if m.len() >= words {
                        row.mask = (bits.len() / words) as u32;
                        bits.extend_from_slice(&m[..words]);
                    }
                }
            }
            self.be.sample(logits, &rows, &bits)?
        };
        let host =
            if b.host.is_empty() { Vec::new() } else { self.be.download(&self.be.gather_rows(logits, &b.host)?)? };
        Ok(Some(RankOutput { device, host }))
    }

    /// Captures decode steps of `sizes` rows (see [`crate::graphs`]); later decode steps of at most
    /// the largest size replay them. Replaces graphs captured before. In a group, every rank
    /// captures the same sizes at the same time ([`crate::group::RankGroup::capture_graphs`]).
    /// On failure no graph is kept and their workspace is freed.
    pub fn capture_graphs(&mut self, sizes: &[usize]) -> Result<CaptureReport> {
        self.drop_graphs();
        let (comm, shape) = (self.comm.as_deref(), (self.block_size, self.num_blocks));
        let captured = DecodeGraphs::capture(&self.be, &self.model, &mut self.cache, comm, sizes, shape);
        let (g, report) = captured.inspect_err(|_| self.be.release_graphs())?;
        self.graphs = Some(g);
        Ok(report)
    }

    /// Whether this rank can capture decode steps: its backend captures graphs, its group has no
    /// data parallelism and its collectives (if any) are device work a graph can hold.
    pub fn can_capture(&self) -> bool {
        self.be.can_capture()
            && self.coord().par.graphs_capture_steps()
            && self.comm.as_deref().is_none_or(|c| c.capturable())
    }

    /// Drops the captured steps and frees their workspace: every step runs eagerly.
    pub fn drop_graphs(&mut self) {
        if self.graphs.take().is_some() {
            self.be.release_graphs();
        }
    }

    /// Decode steps that replayed a captured graph so far.
    pub fn graph_replays(&self) -> u64 {
        self.graphs.as_ref().map_or(0, DecodeGraphs::replays)
    }

    /// The captured batch sizes (empty without graphs).
    pub fn graph_sizes(&self) -> Vec<usize> {
        self.graphs.as_ref().map(DecodeGraphs::sizes).unwrap_or_default()
    }

    /// Makes the group's pending and future collectives fail at once (this rank failed).
    pub fn abandon(&self, why: &str) {
        if let Some(c) = &self.comm {
            c.abandon(why);
        }
    }
}
