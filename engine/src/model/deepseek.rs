//! DeepSeek-V3 weights and forward pass: MLA attention over the paged latent cache, dense MLP
//! for the first layers, MoE with shared experts after.

use super::config::ModelConfig;
use crate::backend::{AddNorm, AttnBatch, Backend, MlaDims, Rotary, Router, RouterParams};
use crate::error::{EngineError, Result};
use crate::parallel::{Axis, Collectives, RankCoord};
use crate::weights::LoadFormat;

/// The two projections of an attention layer's input: q's (`q_a_proj` under q LoRA, else
/// `q_proj`) and `kv_a_proj_with_mqa`'s, apart or stacked into one weight
/// ([`Backend::stacks_projections`]).
pub(super) enum InputProj<B: Backend> {
    Apart {
        q: B::Weight,
        kv_a: B::Weight,
    },
    /// `[q; kv_a]` along the output: q's are the first `q_out` columns.
    Stacked {
        w: B::Weight,
        q_out: usize,
    },
}

pub(super) struct Attention<B: Backend> {
    pub input: InputProj<B>,
    /// q LoRA's `q_a_layernorm` and `q_b_proj`; none where q is projected at once (`q_proj`).
    pub q_lora: Option<(B::Tensor, B::Weight)>,
    pub kv_a_norm: B::Tensor,
    pub kv_b: B::Weight,
    pub o: B::Weight,
}

pub(super) struct Dense<B: Backend> {
    pub gate_up: B::Weight,
    pub down: B::Weight,
}

/// A MoE layer's shared experts.
pub(super) enum SharedExperts<B: Backend> {
    None,
    /// A dense MLP of `n_shared_experts * moe_intermediate_size` (this rank's slice of it).
    Dense(Dense<B>),
    /// Cut into this many experts at the end of the routed experts' stack, routed to every token
    /// ([`Backend::folds_shared_experts`]).
    Folded(usize),
}

pub(super) enum Mlp<B: Backend> {
    Dense(Dense<B>),
    Moe { gate: B::Weight, bias: B::Tensor, experts: B::Experts, shared: SharedExperts<B> },
}

pub(super) struct Layer<B: Backend> {
    pub input_norm: B::Tensor,
    pub attn: Attention<B>,
    pub post_norm: B::Tensor,
    pub mlp: Mlp<B>,
}

/// One rank's part of a loaded model (the whole model on a group of one).
pub struct Model<B: Backend> {
    pub(super) cfg: ModelConfig,
    pub(super) coord: RankCoord,
    pub(super) embed: B::Tensor,
    pub(super) layers: Vec<Layer<B>>,
    pub(super) norm: B::Tensor,
    /// On the ranks that sample (TP rank 0 of each DP rank).
    pub(super) lm_head: Option<B::Weight>,
    pub(super) cos_sin: B::Tensor,
    pub(super) max_len: usize,
    /// This rank's heads.
    pub(super) dims: MlaDims,
    pub(super) router: RouterParams,
}

/// How a model is loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The longest sequence served (the RoPE table's size); `None`: the model's
    /// `max_position_embeddings`.
    pub max_len: Option<usize>,
    pub format: LoadFormat,
}

/// The tokens of one forward step on one rank, flattened over its sequences.
#[derive(Debug, Clone, Default)]
pub struct StepInput {
    pub ids: Vec<u32>,
    pub positions: Vec<u32>,
    /// Cache slot (block * block_size + offset) of each token.
    pub slots: Vec<u32>,
    pub attn: AttnBatch,
    /// Rows whose logits are wanted (the last token of each sequence that samples).
    pub sample_rows: Vec<u32>,
    /// Tokens of every DP rank of the group this step (their MoE layers exchange them); empty
    /// without data parallelism.
    pub dp_rows: Vec<usize>,
}

impl<B: Backend> Model<B> {
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// This rank's place in its group.
    pub fn coord(&self) -> RankCoord {
        self.coord
    }

    /// The longest sequence (prompt + output) this model instance serves.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Runs one step and returns the logits of `input.sample_rows`, `[sample rows, vocab]`, where
    /// the backend keeps them (`None` on ranks that do not sample). `comm` is required in groups
    /// larger than one.
    pub fn forward(
        &self,
        be: &B,
        cache: &mut B::KvCache,
        comm: Option<&dyn Collectives<B>>,
        input: &StepInput,
    ) -> Result<Option<B::Tensor>> {
        if let Some(&p) = input.positions.iter().find(|&&p| p as usize >= self.max_len) {
            return Err(EngineError::InvalidRequest(format!("position {p} is beyond max_model_len {}", self.max_len)));
        }
        let par = self.coord.par;
        let comm = match comm {
            Some(c) => Some(c),
            None if par.world() == 1 => None,
            None => {
                return Err(EngineError::Backend("a rank of a parallel group runs without its communicators".into()))
            }
        };
        let step = Step { comm, input };
        if input.ids.is_empty() {
            // A DP rank without tokens this step still joins its group's MoE exchanges.
            let x = be.upload(&[], 0, self.cfg.hidden_size)?;
            for layer in &self.layers {
                if let Mlp::Moe { .. } = layer.mlp {
                    self.mlp(be, &step, &layer.mlp, &x, None)?;
                }
            }
            return Ok(None);
        }
        let eps = self.cfg.rms_norm_eps;
        let mut h = be.embedding(&self.embed, &input.ids)?;
        let mut x = be.rms_norm(&h, &self.layers[0].input_norm, eps)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let a = self.attention(be, &step, cache, i, &layer.attn, &x)?;
            x = be.add_rms_norm(&mut h, &a, &layer.post_norm, eps)?;
            let next = self.layers.get(i + 1).map_or(&self.norm, |l| &l.input_norm);
            x = self.mlp(be, &step, &layer.mlp, &x, Some(AddNorm { residual: &mut h, w: next, eps }))?;
        }
        match &self.lm_head {
            Some(w) => Ok(Some(be.linear(&be.gather_rows(&x, &input.sample_rows)?, w)?)),
            None => Ok(None),
        }
    }

    fn attention(
        &self,
        be: &B,
        step: &Step<'_, B>,
        cache: &mut B::KvCache,
        layer: usize,
        a: &Attention<B>,
        x: &B::Tensor,
    ) -> Result<B::Tensor> {
        let (c, input) = (&self.cfg, step.input);
        let d = self.dims;
        let (q_in, kv) = match &a.input {
            InputProj::Apart { q, kv_a } => be.linear_pair(x, q, kv_a)?,
            InputProj::Stacked { w, q_out } => be.linear_split(x, w, *q_out)?,
        };
        let mut q = match &a.q_lora {
            Some((norm, b)) => be.linear(&be.rms_norm(&q_in, norm, c.rms_norm_eps)?, b)?,
            None => q_in,
        };
        let rot = Rotary { cos_sin: &self.cos_sin, positions: &input.positions, interleaved: c.rope_interleave };
        be.mla_prologue(&mut q, &kv, &a.kv_a_norm, c.rms_norm_eps, rot, cache, layer, &input.slots, d)?;
        let o = be.mla_attention(&q, cache, layer, &a.kv_b, &input.attn, d)?;
        let mut y = be.linear(&o, &a.o)?;
        step.reduce(be, Axis::Tp, &mut y)?;
        Ok(y)
    }

    /// The MLP's output, or with `end` the next input ([`AddNorm`]).
    fn mlp(
        &self,
        be: &B,
        step: &Step<'_, B>,
        mlp: &Mlp<B>,
        x: &B::Tensor,
        end: Option<AddNorm<'_, B::Tensor>>,
    ) -> Result<B::Tensor> {
        let dense = |d: &Dense<B>, x: &B::Tensor| be.linear(&be.silu_mul(&be.linear(x, &d.gate_up)?)?, &d.down);
        let y = match mlp {
            Mlp::Dense(d) => {
                let mut y = dense(d, x)?;
                step.reduce(be, Axis::Tp, &mut y)?;
                y
            }
            Mlp::Moe { gate, bias, experts, shared } => {
                let dp = self.coord.par.data_parallel_size;
                let gathered;
                let xs = match step.comm {
                    Some(c) if dp > 1 => {
                        gathered = c.all_gather_rows(be, Axis::Dp, x, &step.input.dp_rows)?;
                        &gathered
                    }
                    _ => x,
                };
                let folded = match shared {
                    SharedExperts::Folded(n) => *n,
                    _ => 0,
                };
                let logits = be.linear(xs, gate)?;
                let router = Router { logits: &logits, bias, params: RouterParams { shared: folded, ..self.router } };
                // Alone, with no dense shared MLP to add, the experts' sum joins the residual in
                // the backend's MoE op (which may fuse the two).
                if self.coord.par.world() == 1 && !matches!(shared, SharedExperts::Dense(_)) {
                    return be.moe(xs, router, experts, end);
                }
                let mut y = be.moe(xs, router, experts, None)?;
                if let SharedExperts::Dense(s) = shared {
                    be.add_assign(&mut y, &dense(s, xs)?)?;
                }
                step.reduce(be, Axis::World, &mut y)?;
                if dp == 1 {
                    y
                } else {
                    let before: usize = step.input.dp_rows[..self.coord.dp].iter().sum();
                    let own: Vec<u32> = (before..before + step.input.ids.len()).map(|r| r as u32).collect();
                    be.gather_rows(&y, &own)?
                }
            }
        };
        match end {
            Some(e) => be.add_rms_norm(e.residual, &y, e.w, e.eps),
            None => Ok(y),
        }
    }
}

/// What one forward step's layers share.
struct Step<'a, B: Backend> {
    comm: Option<&'a dyn Collectives<B>>,
    input: &'a StepInput,
}

impl<B: Backend> Step<'_, B> {
    /// Sums partial results over `axis` (nothing to do in a group of one).
    fn reduce(&self, be: &B, axis: Axis, y: &mut B::Tensor) -> Result<()> {
        match self.comm {
            Some(c) if c.size(axis) > 1 => c.all_reduce(be, axis, y),
            _ => Ok(()),
        }
    }
}
