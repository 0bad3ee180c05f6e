//! Builds one rank's part of the model from a memory-mapped checkpoint ([`Model::load_shard`]):
//! only this rank's heads, intermediate slices and experts are read (see [`crate::parallel`] for
//! the placement).

use std::ops::Range;
use std::path::Path;

use super::config::ModelConfig;
use super::deepseek::{Attention, Dense, InputProj, Layer, LoadOptions, Mlp, Model, SharedExperts};
use super::rope::cos_sin_table;
use crate::backend::{Backend, ExpertSource, MlaDims, RouterParams};
use crate::error::{EngineError, Result};
use crate::parallel::{ExpertShard, RankCoord};
use crate::weights::{Checkpoint, LinearSource, OwnedLinear, Weights};

impl<B: Backend> Model<B> {
    /// Loads the model in `dir` onto `be`: a group of one.
    pub fn load(be: &B, dir: &Path, opts: LoadOptions) -> Result<Self> {
        Self::load_shard(be, dir, opts, RankCoord::single())
    }

    /// Loads rank `coord`'s part of the model in `dir` (reading only that part).
    pub fn load_shard(be: &B, dir: &Path, opts: LoadOptions, coord: RankCoord) -> Result<Self> {
        let cfg = ModelConfig::from_dir(dir)?;
        coord.par.validate(&cfg)?;
        let weights = Weights::open(dir, &cfg, opts.format)?;
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let outside = weights.part(None);
        let l = Loader { be, ck: &outside, cfg: &cfg, coord };
        let embed = be.upload(&outside.f32("model.embed_tokens.weight", &[v, h])?, v, h)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        let t0 = std::time::Instant::now();
        let mut last = t0;
        for i in 0..cfg.num_hidden_layers {
            let part = weights.part(Some(i));
            layers.push(Loader { be, ck: &part, cfg: &cfg, coord }.layer(i)?);
            // A progress line per rank every 10 s of a long load (R1 is 163 files).
            if last.elapsed().as_secs() >= 10 {
                last = std::time::Instant::now();
                let (layer, of, s) = (i + 1, cfg.num_hidden_layers, t0.elapsed().as_secs());
                tracing::info!(rank = coord.rank(), layer, of, s, "loading");
            }
        }
        let lm_name = if outside.contains("lm_head.weight") { "lm_head" } else { "model.embed_tokens" };
        let lm_head = if coord.samples() { Some(l.linear(lm_name, v, h)?) } else { None };
        let norm = l.vector("model.norm.weight", h)?;
        let max_len = opts.max_len.unwrap_or(cfg.max_position_embeddings);
        if max_len == 0 {
            return Err(EngineError::InvalidRequest("max_model_len must be positive".into()));
        }
        let mtp = format!("model.layers.{}.", cfg.num_hidden_layers);
        let unread: Vec<String> = weights.unread().into_iter().filter(|n| !n.starts_with(&mtp)).collect();
        // A rank of a larger group reads only its part.
        if !unread.is_empty() && coord.par.world() == 1 {
            tracing::warn!(count = unread.len(), first = %unread[0], "checkpoint tensors not used by the model");
        }
        let cos_sin = be.upload(&cos_sin_table(&cfg, max_len), max_len, cfg.qk_rope_head_dim)?;
        let dims = MlaDims {
            heads: coord.heads(cfg.num_attention_heads).len(),
            nope: cfg.qk_nope_head_dim,
            rope: cfg.qk_rope_head_dim,
            v: cfg.v_head_dim,
            kv_lora: cfg.kv_lora_rank,
            scale: cfg.softmax_scale(),
        };
        let router = RouterParams {
            n_experts: cfg.n_routed_experts,
            n_group: cfg.n_group,
            topk_group: cfg.topk_group,
            top_k: cfg.num_experts_per_tok,
            norm_topk_prob: cfg.norm_topk_prob,
            scaling: cfg.routed_scaling_factor,
            shared: 0,
        };
        Ok(Model { embed, layers, norm, lm_head, cos_sin, max_len, dims, router, cfg, coord })
    }
}

/// A linear weight's stored source and the rows (outputs) and columns (inputs) this rank keeps.
struct Part<'a> {
    src: LinearSource<'a>,
    out: Range<usize>,
    inp: Range<usize>,
}

impl<'a> Part<'a> {
    fn whole(src: LinearSource<'a>) -> Self {
        let (o, i) = src.dims();
        Part { src, out: 0..o, inp: 0..i }
    }
    fn is_whole(&self) -> bool {
        (self.out.len(), self.inp.len()) == self.src.dims()
    }
    fn owned(&self) -> Result<OwnedLinear> {
        self.src.shard(self.out.clone(), self.inp.clone())
    }
}

pub(super) struct Loader<'a, B: Backend> {
    pub be: &'a B,
    pub ck: &'a Checkpoint,
    pub cfg: &'a ModelConfig,
    pub coord: RankCoord,
}

impl<'a, B: Backend> Loader<'a, B> {
    pub fn vector(&self, name: &str, n: usize) -> Result<B::Tensor> {
        self.be.upload(&self.ck.f32(name, &[n])?, 1, n)
    }

    pub fn source(&self, prefix: &str, out: usize, inp: usize) -> Result<LinearSource<'a>> {
        self.ck.linear(prefix, out, inp, self.cfg.quantization.as_ref())
    }

    fn part(&self, prefix: &str, out: usize, inp: usize, rows: Range<usize>, cols: Range<usize>) -> Result<Part<'a>> {
        Ok(Part { src: self.source(prefix, out, inp)?, out: rows, inp: cols })
    }

    /// Loads parts stacked along the output; sliced parts are copied out one layer at a time.
    fn load(&self, parts: &[Part<'a>]) -> Result<B::Weight> {
        if parts.iter().all(Part::is_whole) {
            let srcs: Vec<LinearSource<'a>> = parts.iter().map(|p| p.src).collect();
            return self.be.load_linear(&srcs);
        }
        let owned = parts.iter().map(Part::owned).collect::<Result<Vec<_>>>()?;
        let views: Vec<LinearSource<'_>> = owned.iter().map(OwnedLinear::view).collect();
        self.be.load_linear(&views)
    }

    pub fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<B::Weight> {
        self.load(&[Part::whole(self.source(prefix, out, inp)?)])
    }

    /// A SiLU-gated MLP of intermediate size `inter`, keeping `slice` of it.
    fn dense(&self, prefix: &str, inter: usize, slice: Range<usize>) -> Result<Dense<B>> {
        let h = self.cfg.hidden_size;
        let gate = self.part(&format!("{prefix}.gate_proj"), inter, h, slice.clone(), 0..h)?;
        let up = self.part(&format!("{prefix}.up_proj"), inter, h, slice.clone(), 0..h)?;
        let down = self.part(&format!("{prefix}.down_proj"), h, inter, 0..h, slice)?;
        Ok(Dense { gate_up: self.load(&[gate, up])?, down: self.load(&[down])? })
    }

    pub fn attention(&self, p: &str) -> Result<Attention<B>> {
        let c = self.cfg;
        let (h, heads, qk) = (c.hidden_size, c.num_attention_heads, c.qk_head_dim());
        let mine = self.coord.heads(heads);
        let per = |w: usize| mine.start * w..mine.end * w;
        let (q, q_lora) = match c.q_lora_rank {
            Some(r) => {
                let norm = self.vector(&format!("{p}.q_a_layernorm.weight"), r)?;
                let b = self.load(&[self.part(&format!("{p}.q_b_proj"), heads * qk, r, per(qk), 0..r)?])?;
                (Part::whole(self.source(&format!("{p}.q_a_proj"), r, h)?), Some((norm, b)))
            }
            None => (self.part(&format!("{p}.q_proj"), heads * qk, h, per(qk), 0..h)?, None),
        };
        let kv_a = Part::whole(self.source(&format!("{p}.kv_a_proj_with_mqa"), c.latent_dim(), h)?);
        let input = if self.be.stacks_projections(&q.src, &kv_a.src) {
            let q_out = q.out.len();
            InputProj::Stacked { w: self.load(&[q, kv_a])?, q_out }
        } else {
            InputProj::Apart { q: self.load(&[q])?, kv_a: self.load(&[kv_a])? }
        };
        let (kv, lora, v) = (c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank, c.v_head_dim);
        Ok(Attention {
            input,
            q_lora,
            kv_a_norm: self.vector(&format!("{p}.kv_a_layernorm.weight"), lora)?,
            kv_b: self.load(&[self.part(&format!("{p}.kv_b_proj"), heads * kv, lora, per(kv), 0..lora)?])?,
            o: self.load(&[self.part(&format!("{p}.o_proj"), h, heads * v, 0..h, per(v))?])?,
        })
    }

    pub fn mlp(&self, layer: usize) -> Result<Mlp<B>> {
        let c = self.cfg;
        let p = format!("model.layers.{layer}.mlp");
        if !c.is_moe_layer(layer) {
            let inter = c.intermediate_size;
            return Ok(Mlp::Dense(self.dense(&p, inter, self.coord.tp_slice(inter))?));
        }
        let (h, e, i) = (c.hidden_size, c.n_routed_experts, c.moe_intermediate_size);
        let (ids, inter) = match self.coord.experts(e, i) {
            ExpertShard::Experts(ids) => (ids, 0..i),
            ExpertShard::Inter(inter) => (0..e, inter),
        };
        let first = ids.start;
        let mut parts = ids
            .map(|x| {
                let ep = format!("{p}.experts.{x}");
                Ok([
                    self.part(&format!("{ep}.gate_proj"), i, h, inter.clone(), 0..h)?,
                    self.part(&format!("{ep}.up_proj"), i, h, inter.clone(), 0..h)?,
                    self.part(&format!("{ep}.down_proj"), h, i, 0..h, inter.clone())?,
                ])
            })
            .collect::<Result<Vec<_>>>()?;
        let shared_prefix = format!("{p}.shared_experts");
        let folded = match parts.first() {
            Some(e0) => self.folded_shared(&shared_prefix, &e0[0].src)?,
            None => None,
        };
        let n_folded = folded.as_ref().map_or(0, Vec::len);
        parts.extend(folded.into_iter().flatten());
        // Whole experts are read straight from the mapping; slices are copied out (this layer only).
        let owned = parts
            .iter()
            .map(|e| match e.iter().all(Part::is_whole) {
                true => Ok(None),
                false => Ok(Some([e[0].owned()?, e[1].owned()?, e[2].owned()?])),
            })
            .collect::<Result<Vec<_>>>()?;
        let sources: Vec<ExpertSource<'_>> = parts
            .iter()
            .zip(&owned)
            .map(|(e, o)| match o {
                Some(o) => ExpertSource { gate: o[0].view(), up: o[1].view(), down: o[2].view() },
                None => ExpertSource { gate: e[0].src, up: e[1].src, down: e[2].src },
            })
            .collect();
        let gate = self.linear(&format!("{p}.gate"), e, h)?;
        let bias_name = format!("{p}.gate.e_score_correction_bias");
        let bias = if self.ck.contains(&bias_name) { self.ck.f32(&bias_name, &[e])? } else { vec![0.0; e] };
        let shared_inter = i * c.n_shared_experts;
        let shared = if n_folded > 0 {
            SharedExperts::Folded(n_folded)
        } else if c.n_shared_experts > 0 {
            let slice = self.coord.world_slice(shared_inter);
            SharedExperts::Dense(self.dense(&shared_prefix, shared_inter, slice)?)
        } else {
            SharedExperts::None
        };
        Ok(Mlp::Moe {
            gate,
            bias: self.be.upload(&bias, 1, e)?,
            experts: self.be.load_experts(&sources, first, n_folded)?,
            shared,
        })
    }

    /// The shared MLP at `prefix` cut into `n_shared_experts` experts of `moe_intermediate_size`,
    /// when the backend folds shared experts and this rank can: it holds the whole shared MLP (a
    /// group of one), the cuts fall on the format's blocks or groups, and the shared weights are
    /// stored like the routed expert `routed` (so they stack with the routed experts).
    fn folded_shared(&self, prefix: &str, routed: &LinearSource<'_>) -> Result<Option<Vec<[Part<'a>; 3]>>> {
        let c = self.cfg;
        let (h, i, n) = (c.hidden_size, c.moe_intermediate_size, c.n_shared_experts);
        if n == 0 || !self.be.folds_shared_experts() || self.coord.par.world() > 1 {
            return Ok(None);
        }
        let src = |name: &str, out, inp| self.source(&format!("{prefix}.{name}"), out, inp);
        let (gate, up, down) = (src("gate_proj", n * i, h)?, src("up_proj", n * i, h)?, src("down_proj", h, n * i)?);
        // Cuts inside the matrix (there are none for one shared expert) must fall on units.
        let on_units = |unit: usize| n == 1 || i.is_multiple_of(unit);
        let fits = [gate, up, down].iter().all(|s| s.grouping() == routed.grouping())
            && [gate, up].iter().all(|s| on_units(s.cut_units().0))
            && on_units(down.cut_units().1);
        if !fits {
            tracing::debug!(prefix, "shared experts run as a dense MLP: they do not cut into routed experts' shapes");
            return Ok(None);
        }
        let cut = |j: usize| j * i..(j + 1) * i;
        Ok(Some(
            (0..n)
                .map(|j| {
                    [
                        Part { src: gate, out: cut(j), inp: 0..h },
                        Part { src: up, out: cut(j), inp: 0..h },
                        Part { src: down, out: 0..h, inp: cut(j) },
                    ]
                })
                .collect(),
        ))
    }

    pub fn layer(&self, i: usize) -> Result<Layer<B>> {
        let h = self.cfg.hidden_size;
        let p = format!("model.layers.{i}");
        Ok(Layer {
            input_norm: self.vector(&format!("{p}.input_layernorm.weight"), h)?,
            attn: self.attention(&format!("{p}.self_attn"))?,
            post_norm: self.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
            mlp: self.mlp(i)?,
        })
    }
}
