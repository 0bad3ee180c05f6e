//! Parallel groups: one copy of the model over `tensor_parallel_size x data_parallel_size` ranks
//! (vLLM's semantics, REFERENCE.md section 7).
//!
//! - TP: attention heads, the dense MLP and the shared experts are split over the TP ranks of a DP
//!   rank; each TP rank holds the whole latent KV (MLA's cache is per token, not per head), and the
//!   partial outputs of `o_proj` and `down_proj` are summed by an all-reduce.
//! - DP: each DP rank runs its own sequences with its own cache; in the MoE layers the tokens of
//!   every DP rank are gathered, every rank computes its share of the experts for all of them, and
//!   an all-reduce over the group sums the shares (vLLM's all-gather/reduce-scatter exchange).
//! - Routed experts are split over the whole group: whole experts per rank with
//!   `enable_expert_parallel`, else each expert's intermediate size; shared experts are split by
//!   intermediate size over the whole group too, so one all-reduce per MoE layer covers both.
//! - Embedding and lm_head are replicated (the embedding on every rank, the lm_head on the ranks
//!   that sample: TP rank 0 of each DP rank), so sampling needs no vocabulary gather.

mod comm;

use std::ops::Range;

pub use comm::{Axis, Collectives, InProcGroup};

use crate::error::{EngineError, Result};
use crate::model::{ModelConfig, Quantization};

/// How one copy of the model is spread over ranks (vLLM's flag names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelConfig {
    pub tensor_parallel_size: usize,
    pub data_parallel_size: usize,
    pub enable_expert_parallel: bool,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig { tensor_parallel_size: 1, data_parallel_size: 1, enable_expert_parallel: false }
    }
}

fn split(n: usize, parts: usize, i: usize) -> Range<usize> {
    let per = n / parts;
    i * per..(i + 1) * per
}

impl ParallelConfig {
    /// Ranks holding one copy of the model.
    pub fn world(&self) -> usize {
        self.tensor_parallel_size * self.data_parallel_size
    }

    /// Rank `r` of the group: DP-major, so the TP ranks of one DP rank are consecutive.
    pub fn coord(&self, r: usize) -> RankCoord {
        let tp = self.tensor_parallel_size;
        RankCoord { par: *self, tp: r % tp, dp: r / tp }
    }

    /// Whether a CUDA graph can hold a decode step of this layout: not with data parallelism,
    /// whose MoE exchange depends on every DP rank's rows that step.
    pub fn graphs_capture_steps(&self) -> bool {
        self.data_parallel_size == 1
    }

    /// Checks the sizes themselves (each at least 1).
    pub fn check(&self) -> Result<()> {
        for (name, v) in
            [("tensor_parallel_size", self.tensor_parallel_size), ("data_parallel_size", self.data_parallel_size)]
        {
            if v == 0 {
                return Err(EngineError::Config(format!("{name} must be at least 1")));
            }
        }
        Ok(())
    }

    /// Checks that `cfg` splits evenly over this layout; the message names the flag and the size.
    pub fn validate(&self, cfg: &ModelConfig) -> Result<()> {
        self.check()?;
        let (tp, w) = (self.tensor_parallel_size, self.world());
        let bad = |m: String| Err(EngineError::Config(m));
        let heads = cfg.num_attention_heads;
        if !heads.is_multiple_of(tp) {
            return bad(format!("tensor_parallel_size {tp} does not divide the model's {heads} attention heads"));
        }
        let dense = cfg.intermediate_size;
        let has_dense = (0..cfg.num_hidden_layers).any(|l| !cfg.is_moe_layer(l));
        if has_dense && !dense.is_multiple_of(tp) {
            return bad(format!("tensor_parallel_size {tp} does not divide the dense MLP's intermediate_size {dense}"));
        }
        if cfg.n_routed_experts == 0 || w == 1 {
            return Ok(());
        }
        let (experts, inter) = (cfg.n_routed_experts, cfg.moe_intermediate_size);
        let what = format!("tensor_parallel_size x data_parallel_size = {w}");
        if self.enable_expert_parallel {
            if experts % w != 0 {
                return bad(format!(
                    "with enable_expert_parallel, {what} ranks must divide the {experts} routed experts"
                ));
            }
        } else if inter % w != 0 {
            return bad(format!(
                "{what} does not divide moe_intermediate_size {inter} (each routed expert is split over the group); \
                 set enable_expert_parallel to place whole experts per rank"
            ));
        }
        let shared = inter * cfg.n_shared_experts;
        if !shared.is_multiple_of(w) {
            return bad(format!("{what} does not divide the shared experts' intermediate size {shared}"));
        }
        if let Some(Quantization::Awq(a)) = &cfg.quantization {
            let g = a.group_size;
            let slices = [(dense / tp, "the dense MLP's intermediate_size"), (shared / w, "the shared experts")];
            let routed = (!self.enable_expert_parallel).then_some((inter / w, "moe_intermediate_size"));
            for (n, name) in slices.into_iter().chain(routed) {
                if n % g != 0 {
                    return bad(format!(
                        "{name} split over {} ranks gives {n} input features per rank, not a multiple of the AWQ group size {g}",
                        if name.starts_with("the dense") { tp } else { w }
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A rank's place in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankCoord {
    pub par: ParallelConfig,
    pub tp: usize,
    pub dp: usize,
}

/// Which part of the routed experts a rank holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpertShard {
    /// These whole experts (expert parallelism).
    Experts(Range<usize>),
    /// This slice of every expert's intermediate size.
    Inter(Range<usize>),
}

impl RankCoord {
    /// The only rank of a group of one.
    pub fn single() -> Self {
        ParallelConfig::default().coord(0)
    }

    /// Rank within the group (`dp * tp_size + tp`).
    pub fn rank(&self) -> usize {
        self.dp * self.par.tensor_parallel_size + self.tp
    }

    /// Whether this rank samples for its DP rank (and so holds the lm_head).
    pub fn samples(&self) -> bool {
        self.tp == 0
    }

    /// The attention heads of this rank.
    pub fn heads(&self, heads: usize) -> Range<usize> {
        split(heads, self.par.tensor_parallel_size, self.tp)
    }

    /// This rank's slice of a TP-split size (dense MLP intermediate).
    pub fn tp_slice(&self, n: usize) -> Range<usize> {
        split(n, self.par.tensor_parallel_size, self.tp)
    }

    /// This rank's slice of a size split over the whole group (shared experts).
    pub fn world_slice(&self, n: usize) -> Range<usize> {
        split(n, self.par.world(), self.rank())
    }

    /// This rank's part of `experts` routed experts of intermediate size `inter`.
    pub fn experts(&self, experts: usize, inter: usize) -> ExpertShard {
        if self.par.enable_expert_parallel {
            ExpertShard::Experts(self.world_slice(experts))
        } else {
            ExpertShard::Inter(self.world_slice(inter))
        }
    }
}
