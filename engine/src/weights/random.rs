//! Random weights at a model's real shapes and formats, named as in its Hugging Face checkpoint:
//! what `gen-checkpoint` writes to files and what `load_format: dummy` (vLLM's
//! `--load-format dummy`) generates in memory instead of reading files. A tensor's values depend
//! only on its name and the seed, so both give the same model.
//!
//! Linear weights are uniform in +-sqrt(3 / fan_in) (unit-variance outputs), norms are 1, routing
//! biases 0. In FP8 (e4m3 with `weight_scale_inv` blocks) and AWQ int4 ("gemm" packing; 4-bit
//! values over their range, zero points 5..=10, f16 scales giving the same output variance)
//! checkpoints every linear layer is quantized but the router, lm_head and the AWQ modules
//! listed in `modules_to_not_convert`.

use rayon::prelude::*;
use safetensors::tensor::Dtype;

use crate::model::{ModelConfig, Quantization};

/// One tensor: name, shape and how it is filled.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: Fill,
}

/// How a tensor's values are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// bf16 uniform +-sqrt(3 / fan_in), this fan-in.
    Linear(usize),
    /// fp8 e4m3 values of either sign up to 448 (its scales are a separate tensor).
    Fp8,
    /// f32 `weight_scale_inv` of an fp8 weight with this fan-in.
    Fp8Scale(usize),
    /// AWQ packed 4-bit values (any nibble).
    AwqQ,
    /// AWQ packed zero points (nibbles 5..=10).
    AwqZeros,
    /// f16 AWQ scales of a weight with this fan-in.
    AwqScales(usize),
    /// bf16 ones.
    Ones,
    /// f32 zeros.
    Zeros,
}

impl Fill {
    /// The stored dtype and its bytes per element.
    pub fn dtype(self) -> (Dtype, usize) {
        match self {
            Fill::Linear(_) | Fill::Ones => (Dtype::BF16, 2),
            Fill::Fp8 => (Dtype::F8_E4M3, 1),
            Fill::Fp8Scale(_) | Fill::Zeros => (Dtype::F32, 4),
            Fill::AwqQ | Fill::AwqZeros => (Dtype::I32, 4),
            Fill::AwqScales(_) => (Dtype::F16, 2),
        }
    }
}

impl TensorSpec {
    /// Bytes of the stored tensor.
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.kind.dtype().1
    }

    /// Elements `first..first + buf.len() / element size` of the tensor, into `buf`.
    pub fn fill(&self, buf: &mut [u8], seed: u64, first: usize) {
        fill(buf, self.kind, tensor_seed(&self.name, seed), first);
    }

    /// The whole tensor.
    pub fn generate(&self, seed: u64) -> Vec<u8> {
        let mut buf = vec![0u8; self.bytes()];
        self.fill(&mut buf, seed, 0);
        buf
    }
}

/// Every tensor the model of `cfg` reads, in checkpoint order (embedding, layers, norm, lm_head);
/// multi-token-prediction layers are not included (cleave does not read them).
pub fn specs(cfg: &ModelConfig) -> Vec<TensorSpec> {
    let c = cfg;
    let h = c.hidden_size;
    let heads = c.num_attention_heads;
    let mut s = Vec::new();
    let lin = |s: &mut Vec<TensorSpec>, name: String, out: usize, inp: usize, quantized: bool| {
        let spec = |name: String, shape: Vec<usize>, kind| TensorSpec { name, shape, kind };
        match &c.quantization {
            Some(Quantization::Awq(a)) if quantized && !a.skips(&name) => {
                let groups = inp / a.group_size.max(1);
                s.push(spec(format!("{name}.qweight"), vec![inp, out / 8], Fill::AwqQ));
                s.push(spec(format!("{name}.qzeros"), vec![groups, out / 8], Fill::AwqZeros));
                s.push(spec(format!("{name}.scales"), vec![groups, out], Fill::AwqScales(inp)));
            }
            Some(Quantization::Fp8 { block: [b0, b1] }) if quantized => {
                s.push(spec(format!("{name}.weight"), vec![out, inp], Fill::Fp8));
                let blocks = vec![out.div_ceil(*b0), inp.div_ceil(*b1)];
                s.push(spec(format!("{name}.weight_scale_inv"), blocks, Fill::Fp8Scale(inp)));
            }
            _ => s.push(spec(format!("{name}.weight"), vec![out, inp], Fill::Linear(inp))),
        }
    };
    let norm =
        |s: &mut Vec<TensorSpec>, name: String, n: usize| s.push(TensorSpec { name, shape: vec![n], kind: Fill::Ones });
    let mlp = |s: &mut Vec<TensorSpec>, prefix: &str, inter: usize| {
        lin(s, format!("{prefix}.gate_proj"), inter, h, true);
        lin(s, format!("{prefix}.up_proj"), inter, h, true);
        lin(s, format!("{prefix}.down_proj"), h, inter, true);
    };
    s.push(TensorSpec {
        name: "model.embed_tokens.weight".into(),
        shape: vec![c.vocab_size, h],
        kind: Fill::Linear(h),
    });
    for l in 0..c.num_hidden_layers {
        let p = format!("model.layers.{l}");
        norm(&mut s, format!("{p}.input_layernorm.weight"), h);
        norm(&mut s, format!("{p}.post_attention_layernorm.weight"), h);
        let a = format!("{p}.self_attn");
        match c.q_lora_rank {
            Some(r) => {
                lin(&mut s, format!("{a}.q_a_proj"), r, h, true);
                norm(&mut s, format!("{a}.q_a_layernorm.weight"), r);
                lin(&mut s, format!("{a}.q_b_proj"), heads * c.qk_head_dim(), r, true);
            }
            None => lin(&mut s, format!("{a}.q_proj"), heads * c.qk_head_dim(), h, true),
        }
        lin(&mut s, format!("{a}.kv_a_proj_with_mqa"), c.latent_dim(), h, true);
        norm(&mut s, format!("{a}.kv_a_layernorm.weight"), c.kv_lora_rank);
        lin(&mut s, format!("{a}.kv_b_proj"), heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, true);
        lin(&mut s, format!("{a}.o_proj"), h, heads * c.v_head_dim, true);
        let m = format!("{p}.mlp");
        if !c.is_moe_layer(l) {
            mlp(&mut s, &m, c.intermediate_size);
            continue;
        }
        let e = c.n_routed_experts;
        lin(&mut s, format!("{m}.gate"), e, h, false);
        s.push(TensorSpec { name: format!("{m}.gate.e_score_correction_bias"), shape: vec![e], kind: Fill::Zeros });
        for x in 0..e {
            mlp(&mut s, &format!("{m}.experts.{x}"), c.moe_intermediate_size);
        }
        if c.n_shared_experts > 0 {
            mlp(&mut s, &format!("{m}.shared_experts"), c.moe_intermediate_size * c.n_shared_experts);
        }
    }
    norm(&mut s, "model.norm.weight".into(), h);
    lin(&mut s, "lm_head".into(), c.vocab_size, h, false);
    s
}

/// The decoder layer a tensor belongs to (`model.layers.N.`), if any.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A tensor's stream: FNV-1a of its name, mixed with the model's seed.
fn tensor_seed(name: &str, seed: u64) -> u64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    splitmix(h ^ splitmix(seed))
}

/// The bound `a` of uniform +-a weights with unit-variance outputs over `fan_in` inputs.
fn amplitude(fan_in: usize) -> f32 {
    (3.0 / fan_in.max(1) as f64).sqrt() as f32
}

/// Fills `buf` (the bytes of elements `first..`) for one tensor, in parallel.
fn fill(buf: &mut [u8], kind: Fill, seed: u64, first: usize) {
    let es = kind.dtype().1;
    // Element `i` of the tensor draws splitmix(seed ^ i), so any split of the tensor gives the
    // same values.
    let draw = |i: usize| splitmix(seed ^ i as u64);
    match kind {
        Fill::Linear(fan) => {
            let a = amplitude(fan);
            elements(buf, es, first, &|i, v| {
                let u = (draw(i) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                v.copy_from_slice(&half::bf16::from_f32(u * a).to_bits().to_le_bytes());
            })
        }
        // Magnitudes up to 448 (exponent <= 14), never the NaN pattern.
        Fill::Fp8 => elements(buf, es, first, &|i, v| {
            let b = draw(i) as u8;
            v[0] = if b & 0x78 == 0x78 { b & 0xf7 } else { b };
        }),
        // Dequantized weights then span about +-448 * scale: aim at +-a.
        Fill::Fp8Scale(fan) => {
            let s = amplitude(fan) / 240.0;
            buf.chunks_exact_mut(4).for_each(|v| v.copy_from_slice(&s.to_le_bytes()));
        }
        Fill::AwqQ => elements(buf, es, first, &|i, v| v.copy_from_slice(&(draw(i) as u32).to_le_bytes())),
        Fill::AwqZeros => elements(buf, es, first, &|i, v| {
            let r = draw(i);
            let w = (0..8).fold(0u32, |acc, j| acc | ((5 + ((r >> (8 * j)) % 6) as u32) << (4 * j)));
            v.copy_from_slice(&w.to_le_bytes());
        }),
        // (q - z) spans about +-10 around 0 with q uniform in 0..16: aim at +-a.
        Fill::AwqScales(fan) => {
            let s = half::f16::from_f32(amplitude(fan) / 8.0);
            buf.chunks_exact_mut(2).for_each(|v| v.copy_from_slice(&s.to_bits().to_le_bytes()));
        }
        Fill::Ones => buf.chunks_exact_mut(2).for_each(|v| v.copy_from_slice(&half::bf16::ONE.to_bits().to_le_bytes())),
        Fill::Zeros => buf.fill(0),
    }
}

/// `f(element index, its bytes)` for each `es`-byte element of `buf` (elements `first..`), in
/// parallel chunks.
fn elements<F: Fn(usize, &mut [u8]) + Sync>(buf: &mut [u8], es: usize, first: usize, f: &F) {
    const CHUNK: usize = 1 << 16;
    buf.par_chunks_mut(CHUNK).enumerate().for_each(|(c, ch)| {
        let base = first + c * (CHUNK / es);
        ch.chunks_exact_mut(es).enumerate().for_each(|(i, v)| f(base + i, v));
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_depend_on_the_element_not_the_split() {
        let spec = TensorSpec {
            name: "model.layers.3.mlp.experts.7.up_proj.qweight".into(),
            shape: vec![64, 40],
            kind: Fill::AwqQ,
        };
        let whole = spec.generate(9);
        let mut parts = vec![0u8; whole.len()];
        let (a, b) = parts.split_at_mut(4 * 1000);
        spec.fill(a, 9, 0);
        spec.fill(b, 9, 1000);
        assert_eq!(parts, whole);
        assert_ne!(spec.generate(10), whole);
        assert_eq!(layer_of(&spec.name), Some(3));
        assert_eq!(layer_of("model.norm.weight"), None);
    }

    #[test]
    fn linear_values_have_the_stated_range() {
        let spec = TensorSpec { name: "w".into(), shape: vec![256, 300], kind: Fill::Linear(300) };
        let bytes = spec.generate(1);
        let v: Vec<f32> =
            bytes.chunks_exact(2).map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect();
        let a = (3.0f32 / 300.0).sqrt();
        assert!(v.iter().all(|x| x.abs() <= a * 1.01));
        let var = v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32;
        assert!((var * 300.0 - 1.0).abs() < 0.05, "{var}");
    }
}
