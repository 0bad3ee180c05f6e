//! Captured decode steps (CUDA graphs), the generic half: which padded batch sizes are captured,
//! which steps replay one, and how a step is padded to its graph. The backend's half (graph
//! mode, fixed input buffers, the graphs' workspace) is `backend::cuda::graph`.
//!
//! A step replays a graph when every sequence decodes one token and its inputs are ones the
//! eager forward pass would accept; any other step runs eagerly, so a bad input still gets the
//! eager path's precise error. A rank of a group captures its collectives with the step (NCCL's
//! kernels are graph nodes): every TP rank gets the same input, so all replay the same graph.
//! Groups with data parallelism run eagerly: a DP step's MoE exchange depends on every DP rank's
//! rows. Padding rows read one key of block 0
//! and write no KV ([`NO_SLOT`]); their outputs are never sampled.

use std::time::Instant;

use crate::backend::{AttnBatch, AttnSeq, Backend, GraphLimits, StepIndices, NO_SLOT};
use crate::error::{EngineError, Result};
use crate::model::{Model, StepInput};
use crate::parallel::Collectives;

/// The largest batch captured by default (vLLM's default bound).
pub const MAX_CAPTURE_ROWS: usize = 512;

/// The padded batch sizes captured for up to `max_num_seqs` sequences: 1, 2, 4, then every
/// multiple of 8 (as vLLM and SGLang capture), and `max_num_seqs` itself; at most
/// [`MAX_CAPTURE_ROWS`].
pub fn capture_sizes(max_num_seqs: usize) -> Vec<usize> {
    let top = max_num_seqs.min(MAX_CAPTURE_ROWS);
    let mut sizes: Vec<usize> = [1, 2, 4].into_iter().chain((8..=top).step_by(8)).filter(|&s| s <= top).collect();
    if top > 0 && sizes.last() != Some(&top) {
        sizes.push(top);
    }
    sizes
}

/// One captured step: its rows, the graph, and the logits buffer every replay writes (none on a
/// rank of a group that does not sample).
struct Captured<B: Backend> {
    rows: usize,
    graph: B::Graph,
    logits: Option<B::Tensor>,
}

/// What capturing cost.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureReport {
    pub sizes: Vec<usize>,
    pub seconds: f64,
}

/// The captured decode steps of one rank, smallest first.
pub struct DecodeGraphs<B: Backend> {
    graphs: Vec<Captured<B>>,
    check: ReplayCheck,
    /// Steps replayed so far.
    replays: std::cell::Cell<u64>,
}

/// Which steps a captured graph can run: a decode step whose inputs the eager forward pass would
/// accept, within the graphs' limits.
#[derive(Debug, Clone, Copy)]
struct ReplayCheck {
    limits: GraphLimits,
    vocab: usize,
    block_size: usize,
    num_blocks: usize,
}

impl ReplayCheck {
    fn accepts(&self, input: &StepInput) -> bool {
        let n = input.ids.len();
        let (l, seqs) = (self.limits, &input.attn.seqs);
        let slots = self.num_blocks * self.block_size;
        let decode = n > 0
            && n <= l.max_rows
            && input.dp_rows.is_empty()
            && seqs.len() == n
            && input.positions.len() == n
            && input.slots.len() == n
            && input.sample_rows.len() <= n;
        decode
            && input.ids.iter().all(|&t| (t as usize) < self.vocab)
            && input.positions.iter().all(|&p| (p as usize) < l.max_ctx)
            && input.slots.iter().all(|&s| (s as usize) < slots)
            && input.sample_rows.iter().all(|&r| (r as usize) < n)
            && seqs.iter().enumerate().all(|(i, s)| {
                s.q_start == i
                    && s.q_len == 1
                    && (1..=l.max_ctx).contains(&s.ctx_len)
                    && s.block_table.len() <= l.max_blocks
                    && s.block_table.len() * self.block_size >= s.ctx_len
                    && s.block_table.iter().all(|&b| (b as usize) < self.num_blocks)
            })
    }
}

/// A step of `rows` rows that reads one key of block 0 and writes nothing: what is captured.
fn placeholder(rows: usize) -> StepInput {
    let seq = |i: usize| AttnSeq { q_start: i, q_len: 1, ctx_len: 1, block_table: vec![0] };
    StepInput {
        ids: vec![0; rows],
        positions: vec![0; rows],
        slots: vec![NO_SLOT; rows],
        attn: AttnBatch { seqs: (0..rows).map(seq).collect() },
        sample_rows: (0..rows as u32).collect(),
        dp_rows: Vec::new(),
    }
}

impl<B: Backend> DecodeGraphs<B> {
    /// Captures a decode step of each of `sizes` rows (largest first, so that smaller ones reuse
    /// its buffers), with the rank's collectives `comm` (every rank of the group must capture
    /// the same sizes at the same time: the warm-up steps run the collectives).
    pub fn capture(
        be: &B,
        model: &Model<B>,
        cache: &mut B::KvCache,
        comm: Option<&dyn Collectives<B>>,
        sizes: &[usize],
        (block_size, num_blocks): (usize, usize),
    ) -> Result<(Self, CaptureReport)> {
        if !model.coord().par.graphs_capture_steps() {
            return Err(EngineError::Config("CUDA graphs are not captured on groups with data parallelism".into()));
        }
        if model.coord().par.world() > 1 && !comm.is_some_and(|c| c.capturable()) {
            return Err(EngineError::Config("this group's collectives cannot be captured in a CUDA graph".into()));
        }
        let t0 = Instant::now();
        let mut sizes: Vec<usize> = sizes.iter().copied().filter(|&s| s > 0).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let max_ctx = model.max_len();
        let limits = GraphLimits {
            max_rows: sizes.last().copied().unwrap_or(0),
            max_ctx,
            max_blocks: max_ctx.div_ceil(block_size.max(1)),
        };
        let mut graphs = Vec::with_capacity(sizes.len());
        for &rows in sizes.iter().rev() {
            let input = placeholder(rows);
            let (graph, logits) = be.capture_step(limits, &mut || model.forward(be, cache, comm, &input))?;
            if logits.is_none() == model.coord().samples() {
                return Err(EngineError::Backend("a captured step's logits disagree with the rank's sampling".into()));
            }
            graphs.push(Captured { rows, graph, logits });
        }
        graphs.reverse();
        let check = ReplayCheck { limits, vocab: model.config().vocab_size, block_size, num_blocks };
        let report = CaptureReport { sizes, seconds: t0.elapsed().as_secs_f64() };
        Ok((DecodeGraphs { graphs, check, replays: Default::default() }, report))
    }

    /// The smallest graph that `input` can replay, if any (see the module docs).
    fn pick(&self, input: &StepInput) -> Option<&Captured<B>> {
        let n = input.ids.len();
        self.check.accepts(input).then(|| self.graphs.iter().find(|g| g.rows >= n)).flatten()
    }

    /// Replays the graph for `input` when it has one (see the module docs): `Some` with the logits
    /// of `input.sample_rows` in the graph's buffer (padding rows after them) where this rank
    /// samples; `None` when the step must run eagerly.
    pub fn run(&self, be: &B, input: &StepInput) -> Result<Option<Option<&B::Tensor>>> {
        let Some(g) = self.pick(input) else {
            return Ok(None);
        };
        let pad = |v: &[u32], fill: u32| {
            let mut p = Vec::with_capacity(g.rows);
            p.extend_from_slice(v);
            p.resize(g.rows, fill);
            p
        };
        let (ids, positions, slots) = (pad(&input.ids, 0), pad(&input.positions, 0), pad(&input.slots, NO_SLOT));
        let sample_rows = pad(&input.sample_rows, 0);
        // Padding rows are in no sequence: they see no keys.
        be.stage_step(&StepIndices {
            ids: &ids,
            positions: &positions,
            slots: &slots,
            attn: &input.attn,
            sample_rows: &sample_rows,
        })?;
        be.replay(&g.graph)?;
        self.replays.set(self.replays.get() + 1);
        Ok(Some(g.logits.as_ref()))
    }

    /// Steps replayed so far.
    pub fn replays(&self) -> u64 {
        self.replays.get()
    }

    /// The captured sizes, smallest first.
    pub fn sizes(&self) -> Vec<usize> {
        self.graphs.iter().map(|g| g.rows).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_vllm_and_end_at_the_batch_limit() {
        assert_eq!(capture_sizes(1), vec![1]);
        assert_eq!(capture_sizes(6), vec![1, 2, 4, 6]);
        assert_eq!(capture_sizes(8), vec![1, 2, 4, 8]);
        assert_eq!(capture_sizes(20), vec![1, 2, 4, 8, 16, 20]);
        let s = capture_sizes(256);
        assert_eq!((s.len(), s[3], s[4], *s.last().unwrap()), (35, 8, 16, 256));
        assert_eq!(*capture_sizes(4096).last().unwrap(), MAX_CAPTURE_ROWS);
        assert!(capture_sizes(0).is_empty());
    }

    fn check() -> ReplayCheck {
        let limits = GraphLimits { max_rows: 8, max_ctx: 256, max_blocks: 4 };
        ReplayCheck { limits, vocab: 100, block_size: 64, num_blocks: 10 }
    }

    fn decode(ctx: &[usize]) -> StepInput {
        let n = ctx.len();
        let seq = |i: usize| AttnSeq { q_start: i, q_len: 1, ctx_len: ctx[i], block_table: vec![1, 2, 3, 4] };
        StepInput {
            ids: vec![7; n],
            positions: ctx.iter().map(|&c| c as u32 - 1).collect(),
            slots: (0..n as u32).collect(),
            attn: AttnBatch { seqs: (0..n).map(seq).collect() },
            sample_rows: (0..n as u32).collect(),
            dp_rows: Vec::new(),
        }
    }

    #[test]
    fn only_valid_decode_steps_within_the_limits_replay() {
        let c = check();
        assert!(c.accepts(&decode(&[1, 100, 256])));
        assert!(!c.accepts(&decode(&[5; 9])), "more rows than the largest graph");
        assert!(!c.accepts(&decode(&[])));
        let mut prefill = decode(&[10, 20]);
        prefill.attn.seqs[1].q_len = 2;
        assert!(!c.accepts(&prefill), "a sequence with two new tokens");
        let mut v = decode(&[10, 20]);
        v.ids[1] = 100;
        assert!(!c.accepts(&v), "a token outside the vocabulary runs eagerly (and fails there)");
        let mut v = decode(&[10, 20]);
        v.positions[0] = 256;
        assert!(!c.accepts(&v), "a position past max_model_len");
        let mut v = decode(&[10, 20]);
        v.slots[0] = 640;
        assert!(!c.accepts(&v), "a slot outside the cache");
        let mut v = decode(&[10, 20]);
        v.attn.seqs[0].block_table[0] = 10;
        assert!(!c.accepts(&v), "a block outside the cache");
        let mut v = decode(&[10, 20]);
        v.attn.seqs[0].block_table.truncate(0);
        assert!(!c.accepts(&v), "a table that does not cover the context");
        let mut v = decode(&[10, 20]);
        v.dp_rows = vec![2, 2];
        assert!(!c.accepts(&v), "data-parallel steps exchange tokens");
    }

    /// What is captured must run eagerly too, read only block 0 and write no KV: the CPU backend
    /// runs the placeholder over a golden model and the cache is unchanged.
    #[test]
    fn the_placeholder_step_runs_and_writes_no_kv() {
        use crate::backend::{cpu::CpuBackend, KvLayout};
        use crate::model::LoadOptions;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/golden/bf16-qlora");
        let be = CpuBackend;
        let model =
            Model::load(&be, &dir, LoadOptions { max_len: Some(128), ..Default::default() }).expect("golden model");
        let c = model.config();
        let layout = KvLayout { layers: c.num_hidden_layers, num_blocks: 2, block_size: 64, width: c.latent_dim() };
        let mut cache = be.alloc_kv_cache(layout).unwrap();
        let data: Vec<f32> = (0..2 * layout.block_values()).map(|i| (i % 7) as f32 * 0.01).collect();
        be.import_blocks(&mut cache, &[0, 1], &data).unwrap();
        let logits = model.forward(&be, &mut cache, None, &placeholder(3)).unwrap().expect("logits");
        assert_eq!(be.dims(&logits), (3, c.vocab_size));
        assert!(be.download(&logits).unwrap().iter().all(|v| v.is_finite()));
        assert_eq!(be.export_blocks(&cache, &[0, 1]).unwrap(), data, "a padding row wrote KV");
        let c = check();
        assert!(!c.accepts(&placeholder(3)), "real steps never carry NO_SLOT");
    }
}
