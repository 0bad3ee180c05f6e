//! The compute seam: the small set of operations the DeepSeek-V3 forward pass needs. The model is
//! written once over [`Backend`]; the CPU backend (f32) is the reference, the CUDA backend the fast
//! path. Tensors are 2-D `[rows, cols]`, one row per token.

pub mod cpu;
pub mod cuda;

use crate::error::Result;
use crate::weights::LinearSource;

/// One sequence's slice of an attention batch.
#[derive(Debug, Clone)]
pub struct AttnSeq {
    /// First row of this sequence's queries in the batch.
    pub q_start: usize,
    /// Number of new tokens (1 for decode, the chunk length for prefill).
    pub q_len: usize,
    /// Tokens in the cache after this step's tokens are written (the new ones included).
    pub ctx_len: usize,
    /// Physical block ids covering positions `0..ctx_len`.
    pub block_table: Vec<u32>,
}

/// A cache slot that [`Backend::write_kv`] skips: the padding rows of a captured decode step.
pub const NO_SLOT: u32 = u32::MAX;

/// Attention metadata for one forward step.
#[derive(Debug, Clone, Default)]
pub struct AttnBatch {
    pub seqs: Vec<AttnSeq>,
}

/// Static MLA shape handed to the attention op.
#[derive(Debug, Clone, Copy)]
pub struct MlaDims {
    pub heads: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub kv_lora: usize,
    pub scale: f32,
}

/// The rotary angles of one step: the `[max_pos, rope]` table (`rope/2` cosines then `rope/2`
/// sines per position), each row's position, and whether rotated pairs are interleaved.
pub struct Rotary<'a, T> {
    pub cos_sin: &'a T,
    pub positions: &'a [u32],
    pub interleaved: bool,
}

// By hand: a derive would ask `T: Copy`.
impl<T> Clone for Rotary<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Rotary<'_, T> {}

/// The shape check of [`Backend::linear_split`], one for every backend: a cut inside the
/// weight's `out` columns, an input of its `inp` columns.
pub fn check_split(first: usize, out: usize, x_cols: usize, inp: usize) -> Result<()> {
    if !(1..out).contains(&first) || x_cols != inp {
        return Err(crate::error::EngineError::Backend(format!(
            "linear_split: a cut after column {first} of {out} outputs, an input of {x_cols} columns for {inp}"
        )));
    }
    Ok(())
}

/// MLA's step between the projections and attention, as separate ops: what
/// [`Backend::mla_prologue`] does unless a backend fuses it.
#[allow(clippy::too_many_arguments)]
pub fn mla_prologue_ops<B: Backend + ?Sized>(
    be: &B,
    q: &mut B::Tensor,
    kv: &B::Tensor,
    norm: &B::Tensor,
    eps: f32,
    rot: Rotary<'_, B::Tensor>,
    cache: &mut B::KvCache,
    layer: usize,
    slots: &[u32],
    d: MlaDims,
) -> Result<()> {
    let (cs, pos, il) = (rot.cos_sin, rot.positions, rot.interleaved);
    be.rope(q, cs, pos, d.heads, d.nope, d.nope + d.rope, d.rope, il)?;
    let mut latent = be.rms_norm(kv, norm, eps)?;
    be.rope(&mut latent, cs, pos, 1, d.kv_lora, 0, d.rope, il)?;
    be.write_kv(cache, layer, &latent, slots)
}

/// Static router parameters for `noaux_tc` group-limited routing.
#[derive(Debug, Clone, Copy)]
pub struct RouterParams {
    pub n_experts: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub scaling: f32,
    /// Shared experts folded into the routed ones (see [`Backend::folds_shared_experts`]): each
    /// token's routing lists them after its `top_k` experts, as experts `n_experts..n_experts +
    /// shared` of weight 1. 0 when the shared experts run as a dense MLP.
    pub shared: usize,
}

/// How a layer's output `y` joins the residual stream: `residual += y`, then the RMSNorm of the
/// residual by `w` is the next input ([`Backend::add_rms_norm`]).
pub struct AddNorm<'a, T> {
    pub residual: &'a mut T,
    pub w: &'a T,
    pub eps: f32,
}

/// A MoE layer's router: the gate's `logits` `[n, experts]` (f32), the selection bias and the
/// static parameters.
pub struct Router<'a, T> {
    pub logits: &'a T,
    pub bias: &'a T,
    pub params: RouterParams,
}

/// One routed expert's three projections.
pub struct ExpertSource<'a> {
    pub gate: LinearSource<'a>,
    pub up: LinearSource<'a>,
    pub down: LinearSource<'a>,
}

pub use crate::sampler::SampleRow;

/// Shape of the paged latent cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub layers: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    /// Values per token per layer (`kv_lora_rank + qk_rope_head_dim`).
    pub width: usize,
}

impl KvLayout {
    /// Values held by one block across all layers.
    pub fn block_values(&self) -> usize {
        self.layers * self.block_size * self.width
    }
}

/// What the fixed input buffers of captured decode steps hold (see [`Backend::capture_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphLimits {
    /// Rows of the largest captured step.
    pub max_rows: usize,
    /// Longest context a row may have: attention is split for it.
    pub max_ctx: usize,
    /// Cache blocks a row's block table may list.
    pub max_blocks: usize,
}

/// The per-step index inputs of a decode step, as a captured step reads them: everything of a
/// [`crate::model::StepInput`] that the forward pass uploads.
#[derive(Debug, Clone, Copy)]
pub struct StepIndices<'a> {
    pub ids: &'a [u32],
    pub positions: &'a [u32],
    pub slots: &'a [u32],
    pub attn: &'a AttnBatch,
    pub sample_rows: &'a [u32],
}

/// The graph type of a backend that captures nothing (it has no values).
pub enum NoGraph {}

/// The operations of the DeepSeek-V3 forward pass on one device.
pub trait Backend {
    /// Activations `[rows, cols]`; also used for norm weights and tables.
    type Tensor;
    /// A linear layer's weight `[out, in]` in whatever format this backend keeps.
    type Weight;
    /// A MoE layer's routed experts.
    type Experts;
    /// Per-token expert choice and weights.
    type Routing;
    /// The paged latent KV cache of every layer.
    type KvCache;
    /// A captured step, replayed with new inputs ([`NoGraph`] where the backend captures none).
    type Graph;

    /// Short name for logs (`cpu`, `cuda:0`).
    fn name(&self) -> String;

    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor>;
    fn download(&self, t: &Self::Tensor) -> Result<Vec<f32>>;
    /// `(rows, cols)` of a tensor.
    fn dims(&self, t: &Self::Tensor) -> (usize, usize);

    /// Loads a linear weight; several sources are stacked along the output dimension.
    fn load_linear(&self, parts: &[LinearSource<'_>]) -> Result<Self::Weight>;
    /// Loads routed experts; `experts[0]` is expert `first` of the layer (a rank of an
    /// expert-parallel group holds a range), and tokens routed to other experts are skipped. The
    /// last `shared` of them are shared experts folded in (routed to every token).
    fn load_experts(&self, experts: &[ExpertSource<'_>], first: usize, shared: usize) -> Result<Self::Experts>;
    /// Whether the model should fold the shared experts into the routed ones (the shared MLP cut
    /// into `n_shared_experts` experts of `moe_intermediate_size`, chosen for every token), so
    /// that one grouped GEMM computes both. The CPU reference keeps them apart unless asked.
    fn folds_shared_experts(&self) -> bool {
        false
    }
    /// Whether two projections of one input, stored as `a` and `b` (MLA's q or q_a and kv_a),
    /// run faster stacked into one weight ([`Backend::linear_split`]) than apart
    /// ([`Backend::linear_pair`]). Stacking never changes a result: each output column is the same
    /// product either way.
    fn stacks_projections(&self, a: &LinearSource<'_>, b: &LinearSource<'_>) -> bool {
        let _ = (a, b);
        false
    }

    fn alloc_kv_cache(&self, layout: KvLayout) -> Result<Self::KvCache>;

    /// Rows of `table` picked by token id.
    fn embedding(&self, table: &Self::Tensor, ids: &[u32]) -> Result<Self::Tensor>;
    /// RMSNorm of each row over its first `w.cols` columns; later columns pass through unchanged.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;
    /// `residual += x`, then returns `rms_norm(residual)` (fused).
    fn add_rms_norm(
        &self,
        residual: &mut Self::Tensor,
        x: &Self::Tensor,
        w: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor>;
    /// `x @ W^T`.
    fn linear(&self, x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor>;
    /// `(linear(x, a), linear(x, b))`: two projections of one input (MLA's q and kv_a), which a
    /// backend may compute in one pass.
    fn linear_pair(
        &self,
        x: &Self::Tensor,
        a: &Self::Weight,
        b: &Self::Weight,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        Ok((self.linear(x, a)?, self.linear(x, b)?))
    }

    /// `(y[:, ..first], y[:, first..])` of `y = linear(x, w)`: the projections of a weight loaded
    /// stacked from two sources ([`Backend::stacks_projections`]).
    fn linear_split(&self, x: &Self::Tensor, w: &Self::Weight, first: usize) -> Result<(Self::Tensor, Self::Tensor)>;

    /// `[n, 2i] -> [n, i]`: `silu(x[:, :i]) * x[:, i:]`.
    fn silu_mul(&self, x: &Self::Tensor) -> Result<Self::Tensor>;
    /// `a += b`.
    fn add_assign(&self, a: &mut Self::Tensor, b: &Self::Tensor) -> Result<()>;
    /// The listed rows of `x`.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[u32]) -> Result<Self::Tensor>;

    /// Rotates, in every row, `heads` slices of `rope` columns that start at
    /// `offset + h * stride`, by the angle of that row's position. `cos_sin` is
    /// `[max_pos, rope]`: `rope/2` cosines then `rope/2` sines per position.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut Self::Tensor,
        cos_sin: &Self::Tensor,
        positions: &[u32],
        heads: usize,
        offset: usize,
        stride: usize,
        rope: usize,
        interleaved: bool,
    ) -> Result<()>;

    /// Writes each row of `latent` `[n, width]` into cache slot `slots[i]` (block * block_size +
    /// offset) of `layer`; rows whose slot is [`NO_SLOT`] are not written.
    fn write_kv(&self, cache: &mut Self::KvCache, layer: usize, latent: &Self::Tensor, slots: &[u32]) -> Result<()>;
    /// MLA's step between the projections and attention: RoPE on the rope columns of each of
    /// `q`'s heads (`[n, heads * (nope + rope)]`), and `kv` (kv_a's output, `[n, kv_lora +
    /// rope]`) RMS-normalized by `norm` over its first `kv_lora` columns, its rope key rotated,
    /// written into `layer` of the cache at `slots` ([`Backend::write_kv`]'s rules).
    #[allow(clippy::too_many_arguments)]
    fn mla_prologue(
        &self,
        q: &mut Self::Tensor,
        kv: &Self::Tensor,
        norm: &Self::Tensor,
        eps: f32,
        rot: Rotary<'_, Self::Tensor>,
        cache: &mut Self::KvCache,
        layer: usize,
        slots: &[u32],
        dims: MlaDims,
    ) -> Result<()> {
        mla_prologue_ops(self, q, kv, norm, eps, rot, cache, layer, slots, dims)
    }

    /// Causal MLA attention of `q` `[n, heads * (nope + rope)]` over the cached latents of `layer`,
    /// with `kv_b` `[heads * (nope + v), kv_lora]` expanding latents to keys and values.
    /// Returns `[n, heads * v]`.
    fn mla_attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::KvCache,
        layer: usize,
        kv_b: &Self::Weight,
        batch: &AttnBatch,
        dims: MlaDims,
    ) -> Result<Self::Tensor>;

    /// Router: `logits` `[n, experts]` (f32) and the selection bias -> per-token experts and weights.
    fn moe_route(&self, logits: &Self::Tensor, bias: &Self::Tensor, params: RouterParams) -> Result<Self::Routing>;
    /// Weighted sum of each token's routed experts' outputs.
    fn moe_experts(&self, x: &Self::Tensor, routing: &Self::Routing, experts: &Self::Experts) -> Result<Self::Tensor>;
    /// A MoE layer's routed experts: [`Backend::moe_route`], then [`Backend::moe_experts`]; with
    /// `end`, their sum is added to the residual and the next input returned
    /// ([`Backend::add_rms_norm`]). A backend may fuse the steps.
    fn moe(
        &self,
        x: &Self::Tensor,
        router: Router<'_, Self::Tensor>,
        experts: &Self::Experts,
        end: Option<AddNorm<'_, Self::Tensor>>,
    ) -> Result<Self::Tensor> {
        let routing = self.moe_route(router.logits, router.bias, router.params)?;
        let y = self.moe_experts(x, &routing, experts)?;
        match end {
            Some(e) => self.add_rms_norm(e.residual, &y, e.w, e.eps),
            None => Ok(y),
        }
    }

    /// Picks a token for each listed row of `logits` `[rows, vocab]`, where the logits are (the
    /// GPU samples there; nothing but the choices comes back). A row with a mask picks among the
    /// tokens it allows: `masks` holds `vocab.div_ceil(32)` words per mask, in the order of
    /// [`SampleRow::mask`]. Returns each row's token and its logprob under the unmodified
    /// distribution. [`crate::sampler::pick`] is the reference.
    fn sample(&self, logits: &Self::Tensor, rows: &[SampleRow], masks: &[u32]) -> Result<Vec<(u32, f32)>>;

    /// Copies whole blocks (all layers) out of the cache, in block order.
    fn export_blocks(&self, cache: &Self::KvCache, blocks: &[u32]) -> Result<Vec<f32>>;
    /// Writes blocks exported by [`Backend::export_blocks`] into `blocks`.
    fn import_blocks(&self, cache: &mut Self::KvCache, blocks: &[u32], data: &[f32]) -> Result<()>;

    /// Whether [`Backend::capture_step`] can work here.
    fn can_capture(&self) -> bool {
        false
    }

    /// Captures the step `f` enqueues as a graph: `f` runs twice in graph mode, once to set up
    /// every buffer it needs and once under capture, and must run the same step both times. In
    /// graph mode the step's index inputs come from fixed buffers sized by `limits` (rewritten
    /// by [`Backend::stage_step`] before each replay) and attention is split for
    /// `limits.max_ctx`. Returns the graph and what the captured run returned, whose buffers each
    /// replay writes again.
    fn capture_step<T>(&self, limits: GraphLimits, f: &mut dyn FnMut() -> Result<T>) -> Result<(Self::Graph, T)> {
        let _ = (limits, f);
        Err(crate::error::EngineError::Backend(format!("{}: this backend captures no graphs", self.name())))
    }

    /// Writes a step's index inputs where captured steps read them. The caller has validated them
    /// (a replay checks nothing on the device).
    fn stage_step(&self, s: &StepIndices<'_>) -> Result<()> {
        let _ = s;
        Err(crate::error::EngineError::Backend(format!("{}: this backend captures no graphs", self.name())))
    }

    /// Frees what captured steps held (their workspace); called once no graph is left.
    fn release_graphs(&self) {}

    /// Enqueues one replay of `g` (after [`Backend::stage_step`]).
    fn replay(&self, g: &Self::Graph) -> Result<()> {
        let _ = g;
        Err(crate::error::EngineError::Backend(format!("{}: this backend captures no graphs", self.name())))
    }
}

#[cfg(test)]
mod tests {
    use super::cpu::{CpuBackend, CpuWeight};
    use super::*;

    #[test]
    fn linear_split_cuts_inside_the_weight_only() {
        let be = CpuBackend;
        let w = CpuWeight { out: 3, inp: 2, data: vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0] };
        let x = be.upload(&[2.0, 3.0], 1, 2).unwrap();
        let (a, b) = be.linear_split(&x, &w, 2).unwrap();
        assert_eq!((a.data, b.data), (vec![2.0, 3.0], vec![5.0]));
        for bad in [0, 3] {
            assert!(be.linear_split(&x, &w, bad).is_err(), "a cut after column {bad} of 3");
        }
        assert!(be.linear_split(&be.upload(&[1.0; 3], 1, 3).unwrap(), &w, 1).is_err(), "input width");
    }
}
