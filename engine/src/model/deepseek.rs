//! DeepSeek-V3 weights and forward pass: MLA attention over the paged latent cache, dense MLP
//! for the first layers, MoE with shared experts after.

use std::path::Path;

use super::config::ModelConfig;
use super::rope::cos_sin_table;
use crate::backend::{AttnBatch, Backend, ExpertSource, MlaDims, RouterParams};
use crate::error::{EngineError, Result};
use crate::weights::{Checkpoint, LinearSource};

enum QProj<B: Backend> {
    Lora { a: B::Weight, norm: B::Tensor, b: B::Weight },
    Plain(B::Weight),
}

struct Attention<B: Backend> {
    q: QProj<B>,
    kv_a: B::Weight,
    kv_a_norm: B::Tensor,
    kv_b: B::Weight,
    o: B::Weight,
}

struct Dense<B: Backend> {
    gate_up: B::Weight,
    down: B::Weight,
}

enum Mlp<B: Backend> {
    Dense(Dense<B>),
    Moe { gate: B::Weight, bias: B::Tensor, experts: B::Experts, shared: Option<Dense<B>> },
}

struct Layer<B: Backend> {
    input_norm: B::Tensor,
    attn: Attention<B>,
    post_norm: B::Tensor,
    mlp: Mlp<B>,
}

/// A loaded model on one backend.
pub struct Model<B: Backend> {
    cfg: ModelConfig,
    embed: B::Tensor,
    layers: Vec<Layer<B>>,
    norm: B::Tensor,
    lm_head: B::Weight,
    cos_sin: B::Tensor,
    max_len: usize,
    dims: MlaDims,
    router: RouterParams,
}

/// The tokens of one forward step, flattened over its sequences.
#[derive(Debug, Clone, Default)]
pub struct StepInput {
    pub ids: Vec<u32>,
    pub positions: Vec<u32>,
    /// Cache slot (block * block_size + offset) of each token.
    pub slots: Vec<u32>,
    pub attn: AttnBatch,
    /// Rows whose logits are wanted (the last token of each sequence that samples).
    pub sample_rows: Vec<u32>,
}

struct Loader<'a, B: Backend> {
    be: &'a B,
    ck: &'a Checkpoint,
    cfg: &'a ModelConfig,
}

impl<'a, B: Backend> Loader<'a, B> {
    fn vector(&self, name: &str, n: usize) -> Result<B::Tensor> {
        self.be.upload(&self.ck.f32(name, &[n])?, 1, n)
    }
    fn linear(&self, prefix: &str, out: usize, inp: usize) -> Result<B::Weight> {
        self.be.load_linear(&[self.source(prefix, out, inp)?])
    }
    fn source(&self, prefix: &str, out: usize, inp: usize) -> Result<LinearSource<'a>> {
        self.ck.linear(prefix, out, inp, self.cfg.quantization.as_ref())
    }
    fn dense(&self, prefix: &str, inter: usize) -> Result<Dense<B>> {
        let h = self.cfg.hidden_size;
        let gate = self.source(&format!("{prefix}.gate_proj"), inter, h)?;
        let up = self.source(&format!("{prefix}.up_proj"), inter, h)?;
        Ok(Dense {
            gate_up: self.be.load_linear(&[gate, up])?,
            down: self.linear(&format!("{prefix}.down_proj"), h, inter)?,
        })
    }

    fn attention(&self, p: &str) -> Result<Attention<B>> {
        let c = self.cfg;
        let (h, heads, qk) = (c.hidden_size, c.num_attention_heads, c.qk_head_dim());
        let q = match c.q_lora_rank {
            Some(r) => QProj::Lora {
                a: self.linear(&format!("{p}.q_a_proj"), r, h)?,
                norm: self.vector(&format!("{p}.q_a_layernorm.weight"), r)?,
                b: self.linear(&format!("{p}.q_b_proj"), heads * qk, r)?,
            },
            None => QProj::Plain(self.linear(&format!("{p}.q_proj"), heads * qk, h)?),
        };
        Ok(Attention {
            q,
            kv_a: self.linear(&format!("{p}.kv_a_proj_with_mqa"), c.latent_dim(), h)?,
            kv_a_norm: self.vector(&format!("{p}.kv_a_layernorm.weight"), c.kv_lora_rank)?,
            kv_b: self.linear(
                &format!("{p}.kv_b_proj"),
                heads * (c.qk_nope_head_dim + c.v_head_dim),
                c.kv_lora_rank,
            )?,
            o: self.linear(&format!("{p}.o_proj"), h, heads * c.v_head_dim)?,
        })
    }

    fn mlp(&self, layer: usize) -> Result<Mlp<B>> {
        let c = self.cfg;
        let p = format!("model.layers.{layer}.mlp");
        if !c.is_moe_layer(layer) {
            return Ok(Mlp::Dense(self.dense(&p, c.intermediate_size)?));
        }
        let (h, e, i) = (c.hidden_size, c.n_routed_experts, c.moe_intermediate_size);
        let gate_src = self.source(&format!("{p}.gate"), e, h)?;
        let sources = (0..e)
            .map(|x| {
                let ep = format!("{p}.experts.{x}");
                Ok(ExpertSource {
                    gate: self.source(&format!("{ep}.gate_proj"), i, h)?,
                    up: self.source(&format!("{ep}.up_proj"), i, h)?,
                    down: self.source(&format!("{ep}.down_proj"), h, i)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let bias_name = format!("{p}.gate.e_score_correction_bias");
        let bias = if self.ck.contains(&bias_name) { self.ck.f32(&bias_name, &[e])? } else { vec![0.0; e] };
        Ok(Mlp::Moe {
            gate: self.be.load_linear(&[gate_src])?,
            bias: self.be.upload(&bias, 1, e)?,
            experts: self.be.load_experts(&sources)?,
            shared: if c.n_shared_experts > 0 {
                Some(self.dense(&format!("{p}.shared_experts"), i * c.n_shared_experts)?)
            } else {
                None
            },
        })
    }
}

impl<B: Backend> Model<B> {
    /// Loads the checkpoint in `dir` onto `be`. `max_len` caps the positions served
    /// (the RoPE table size); `None` means the model's `max_position_embeddings`.
    pub fn load(be: &B, dir: &Path, max_len: Option<usize>) -> Result<Self> {
        let cfg = ModelConfig::from_dir(dir)?;
        let ck = Checkpoint::open(dir)?;
        Self::from_checkpoint(be, cfg, &ck, max_len)
    }

    /// Builds the model from an opened checkpoint.
    pub fn from_checkpoint(be: &B, cfg: ModelConfig, ck: &Checkpoint, max_len: Option<usize>) -> Result<Self> {
        let l = Loader { be, ck, cfg: &cfg };
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed = be.upload(&ck.f32("model.embed_tokens.weight", &[v, h])?, v, h)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            layers.push(Layer {
                input_norm: l.vector(&format!("{p}.input_layernorm.weight"), h)?,
                attn: l.attention(&format!("{p}.self_attn"))?,
                post_norm: l.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                mlp: l.mlp(i)?,
            });
        }
        let lm_name = if ck.contains("lm_head.weight") { "lm_head" } else { "model.embed_tokens" };
        let lm_head = be.load_linear(&[l.source(lm_name, v, h)?])?;
        let norm = l.vector("model.norm.weight", h)?;
        let max_len = max_len.unwrap_or(cfg.max_position_embeddings);
        if max_len == 0 {
            return Err(EngineError::InvalidRequest("max_model_len must be positive".into()));
        }
        let mtp = format!("model.layers.{}.", cfg.num_hidden_layers);
        let unread: Vec<String> = ck.unread().into_iter().filter(|n| !n.starts_with(&mtp)).collect();
        if !unread.is_empty() {
            tracing::warn!(count = unread.len(), first = %unread[0], "checkpoint tensors not used by the model");
        }
        let cos_sin = be.upload(&cos_sin_table(&cfg, max_len), max_len, cfg.qk_rope_head_dim)?;
        let dims = MlaDims {
            heads: cfg.num_attention_heads,
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
        };
        Ok(Model { embed, layers, norm, lm_head, cos_sin, max_len, dims, router, cfg })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The longest sequence (prompt + output) this model instance serves.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Runs one step and returns the logits of `input.sample_rows`, `[sample rows, vocab]`, where
    /// the backend keeps them.
    pub fn forward(&self, be: &B, cache: &mut B::KvCache, input: &StepInput) -> Result<B::Tensor> {
        if let Some(&p) = input.positions.iter().find(|&&p| p as usize >= self.max_len) {
            return Err(EngineError::InvalidRequest(format!("position {p} is beyond max_model_len {}", self.max_len)));
        }
        let eps = self.cfg.rms_norm_eps;
        let mut h = be.embedding(&self.embed, &input.ids)?;
        let mut x = be.rms_norm(&h, &self.layers[0].input_norm, eps)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let a = self.attention(be, cache, i, &layer.attn, &x, input)?;
            x = be.add_rms_norm(&mut h, &a, &layer.post_norm, eps)?;
            let m = self.mlp(be, &layer.mlp, &x)?;
            let next = self.layers.get(i + 1).map_or(&self.norm, |l| &l.input_norm);
            x = be.add_rms_norm(&mut h, &m, next, eps)?;
        }
        let last = be.gather_rows(&x, &input.sample_rows)?;
        be.linear(&last, &self.lm_head)
    }

    fn attention(
        &self,
        be: &B,
        cache: &mut B::KvCache,
        layer: usize,
        a: &Attention<B>,
        x: &B::Tensor,
        input: &StepInput,
    ) -> Result<B::Tensor> {
        let c = &self.cfg;
        let d = self.dims;
        let mut q = match &a.q {
            QProj::Lora { a: qa, norm, b } => be.linear(&be.rms_norm(&be.linear(x, qa)?, norm, c.rms_norm_eps)?, b)?,
            QProj::Plain(w) => be.linear(x, w)?,
        };
        let qk = d.nope + d.rope;
        be.rope(&mut q, &self.cos_sin, &input.positions, d.heads, d.nope, qk, d.rope, c.rope_interleave)?;
        let mut latent = be.rms_norm(&be.linear(x, &a.kv_a)?, &a.kv_a_norm, c.rms_norm_eps)?;
        be.rope(&mut latent, &self.cos_sin, &input.positions, 1, d.kv_lora, 0, d.rope, c.rope_interleave)?;
        be.write_kv(cache, layer, &latent, &input.slots)?;
        let o = be.mla_attention(&q, cache, layer, &a.kv_b, &input.attn, d)?;
        be.linear(&o, &a.o)
    }

    fn mlp(&self, be: &B, mlp: &Mlp<B>, x: &B::Tensor) -> Result<B::Tensor> {
        let dense = |d: &Dense<B>| be.linear(&be.silu_mul(&be.linear(x, &d.gate_up)?)?, &d.down);
        match mlp {
            Mlp::Dense(d) => dense(d),
            Mlp::Moe { gate, bias, experts, shared } => {
                let routing = be.moe_route(&be.linear(x, gate)?, bias, self.router)?;
                let mut y = be.moe_experts(x, &routing, experts)?;
                if let Some(s) = shared {
                    be.add_assign(&mut y, &dense(s)?)?;
                }
                Ok(y)
            }
        }
    }
}
