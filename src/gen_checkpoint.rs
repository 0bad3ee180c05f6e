//! `cleave gen-checkpoint`: random-weight DeepSeek-V3-architecture checkpoints at real shapes
//! (HF layout: config.json + model.safetensors, or 5 GB shards and their index) for performance
//! work. Weights are uniform in +-sqrt(3 / fan_in) (unit-variance outputs), norms are 1, routing
//! biases 0; bf16, fp8 e4m3 with 128x128 `weight_scale_inv` blocks, or AutoAWQ "gemm" int4 with
//! groups of 64 (4-bit values and zero points spread over their range, f16 scales that give the
//! same output variance) for every linear layer but the router and lm_head.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use rayon::prelude::*;
use serde_json::{json, Value};

#[derive(Clone, Copy, clap::ValueEnum, PartialEq, Eq, Debug)]
pub enum Shape {
    /// DeepSeek-V2-Lite dimensions (27 layers, 64 routed + 2 shared experts, no q_lora).
    V2Lite,
    /// DeepSeek-V3 dimensions; use --layers for a few layers.
    V3Layers,
    /// A small model for quick end-to-end checks.
    Tiny,
}

#[derive(Clone, Copy, clap::ValueEnum, PartialEq, Eq, Debug)]
pub enum WeightDtype {
    Bf16,
    Fp8,
    Awq,
}

/// Input channels per AWQ scale and zero point in generated checkpoints.
pub const AWQ_GROUP: usize = 64;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum)]
    shape: Shape,
    /// Number of layers (default: the shape's; 4 for v3-layers).
    #[arg(long)]
    layers: Option<usize>,
    /// Routed experts per MoE layer (default: the shape's), e.g. 64 of V3's 256: what one GPU of
    /// a 4-way expert-parallel group holds.
    #[arg(long)]
    routed_experts: Option<usize>,
    #[arg(long)]
    out: PathBuf,
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: WeightDtype,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Changes to a shape's dimensions.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dims {
    pub layers: Option<usize>,
    pub routed_experts: Option<usize>,
}

/// The config.json of a shape.
pub fn config(shape: Shape, dims: Dims, dtype: WeightDtype) -> Value {
    let mut c = match shape {
        Shape::V2Lite => json!({
            "hidden_size": 2048, "num_hidden_layers": 27, "first_k_dense_replace": 1, "intermediate_size": 10944,
            "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
            "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": false,
            "num_attention_heads": 16, "num_key_value_heads": 16, "q_lora_rank": null, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400,
            "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                             "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
        }),
        Shape::V3Layers => json!({
            "hidden_size": 7168, "num_hidden_layers": 4, "first_k_dense_replace": 3, "intermediate_size": 18432,
            "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
            "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
            "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
            "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                             "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        }),
        Shape::Tiny => json!({
            "hidden_size": 256, "num_hidden_layers": 4, "first_k_dense_replace": 1, "intermediate_size": 512,
            "moe_intermediate_size": 128, "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
            "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
            "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 128, "kv_lora_rank": 128,
            "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "vocab_size": 4096,
            "rope_scaling": null,
        }),
    };
    let o = c.as_object_mut().expect("object");
    for (k, v) in [
        ("architectures", json!(["DeepseekV3ForCausalLM"])),
        ("model_type", json!("deepseek_v3")),
        ("hidden_act", json!("silu")),
        ("max_position_embeddings", json!(163840)),
        ("rms_norm_eps", json!(1e-6)),
        ("rope_theta", json!(10000.0)),
        ("rope_interleave", json!(true)),
        ("scoring_func", json!("sigmoid")),
        ("topk_method", json!("noaux_tc")),
        ("moe_layer_freq", json!(1)),
        ("bos_token_id", json!(0)),
        ("eos_token_id", json!(1)),
        ("tie_word_embeddings", json!(false)),
        ("attention_bias", json!(false)),
        ("torch_dtype", json!("bfloat16")),
    ] {
        o.insert(k.into(), v);
    }
    if let Some(n) = dims.routed_experts {
        o.insert("n_routed_experts".into(), json!(n));
    }
    if let Some(n) = dims.layers {
        o.insert("num_hidden_layers".into(), json!(n));
        let dense = o["first_k_dense_replace"].as_u64().unwrap_or(0) as usize;
        o.insert("first_k_dense_replace".into(), json!(dense.min(n.saturating_sub(1))));
    }
    match dtype {
        WeightDtype::Bf16 => {}
        WeightDtype::Fp8 => {
            o.insert("quantization_config".into(), json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}));
        }
        WeightDtype::Awq => {
            o.insert("quantization_config".into(), json!({"quant_method": "awq", "bits": 4, "group_size": AWQ_GROUP, "version": "gemm", "zero_point": true, "modules_to_not_convert": null}));
        }
    }
    c
}

/// One tensor to write: name, shape, how it is filled.
struct Spec {
    name: String,
    shape: Vec<usize>,
    kind: Kind,
}

#[derive(Clone, Copy)]
enum Kind {
    /// bf16 uniform +-sqrt(3/fan_in).
    Linear,
    /// fp8 e4m3 weight (+ its scale tensor, listed separately).
    Fp8,
    /// f32 scales of an fp8 weight with this fan_in.
    Scale(usize),
    /// AWQ packed 4-bit values (any nibble).
    AwqQ,
    /// AWQ packed zero points (nibbles 5..=10).
    AwqZ,
    /// f16 AWQ scales of a weight with this fan_in.
    AwqS(usize),
    /// bf16 ones.
    Ones,
    /// f32 zeros.
    Zeros,
}

fn specs(c: &Value, dtype: WeightDtype) -> Vec<Spec> {
    let g = |k: &str| c[k].as_u64().unwrap_or(0) as usize;
    let (h, heads, nope, rope, v, kvl) = (
        g("hidden_size"),
        g("num_attention_heads"),
        g("qk_nope_head_dim"),
        g("qk_rope_head_dim"),
        g("v_head_dim"),
        g("kv_lora_rank"),
    );
    let (e, inter, mi, shared) =
        (g("n_routed_experts"), g("intermediate_size"), g("moe_intermediate_size"), g("n_shared_experts"));
    let mut s = Vec::new();
    let mut lin = |s: &mut Vec<Spec>, name: String, out: usize, inp: usize, quant: bool| {
        if quant && dtype == WeightDtype::Awq {
            let g = inp / AWQ_GROUP;
            s.push(Spec { name: format!("{name}.qweight"), shape: vec![inp, out / 8], kind: Kind::AwqQ });
            s.push(Spec { name: format!("{name}.qzeros"), shape: vec![g, out / 8], kind: Kind::AwqZ });
            s.push(Spec { name: format!("{name}.scales"), shape: vec![g, out], kind: Kind::AwqS(inp) });
        } else if quant && dtype == WeightDtype::Fp8 {
            s.push(Spec { name: format!("{name}.weight"), shape: vec![out, inp], kind: Kind::Fp8 });
            s.push(Spec {
                name: format!("{name}.weight_scale_inv"),
                shape: vec![out.div_ceil(128), inp.div_ceil(128)],
                kind: Kind::Scale(inp),
            });
        } else {
            s.push(Spec { name: format!("{name}.weight"), shape: vec![out, inp], kind: Kind::Linear });
        }
    };
    let norm = |s: &mut Vec<Spec>, name: String, n: usize| s.push(Spec { name, shape: vec![n], kind: Kind::Ones });
    s.push(Spec { name: "model.embed_tokens.weight".into(), shape: vec![g("vocab_size"), h], kind: Kind::Linear });
    for l in 0..g("num_hidden_layers") {
        let p = format!("model.layers.{l}");
        norm(&mut s, format!("{p}.input_layernorm.weight"), h);
        norm(&mut s, format!("{p}.post_attention_layernorm.weight"), h);
        let a = format!("{p}.self_attn");
        match c["q_lora_rank"].as_u64() {
            Some(r) => {
                lin(&mut s, format!("{a}.q_a_proj"), r as usize, h, true);
                norm(&mut s, format!("{a}.q_a_layernorm.weight"), r as usize);
                lin(&mut s, format!("{a}.q_b_proj"), heads * (nope + rope), r as usize, true);
            }
            None => lin(&mut s, format!("{a}.q_proj"), heads * (nope + rope), h, true),
        }
        lin(&mut s, format!("{a}.kv_a_proj_with_mqa"), kvl + rope, h, true);
        norm(&mut s, format!("{a}.kv_a_layernorm.weight"), kvl);
        lin(&mut s, format!("{a}.kv_b_proj"), heads * (nope + v), kvl, true);
        lin(&mut s, format!("{a}.o_proj"), h, heads * v, true);
        let m = format!("{p}.mlp");
        let mlp = |s: &mut Vec<Spec>,
                   lin: &mut dyn FnMut(&mut Vec<Spec>, String, usize, usize, bool),
                   pre: String,
                   i: usize| {
            lin(s, format!("{pre}.gate_proj"), i, h, true);
            lin(s, format!("{pre}.up_proj"), i, h, true);
            lin(s, format!("{pre}.down_proj"), h, i, true);
        };
        if l < g("first_k_dense_replace") {
            mlp(&mut s, &mut lin, m, inter);
        } else {
            lin(&mut s, format!("{m}.gate"), e, h, false);
            s.push(Spec { name: format!("{m}.gate.e_score_correction_bias"), shape: vec![e], kind: Kind::Zeros });
            for x in 0..e {
                mlp(&mut s, &mut lin, format!("{m}.experts.{x}"), mi);
            }
            if shared > 0 {
                mlp(&mut s, &mut lin, format!("{m}.shared_experts"), mi * shared);
            }
        }
    }
    norm(&mut s, "model.norm.weight".into(), h);
    lin(&mut s, "lm_head".into(), g("vocab_size"), h, false);
    s
}

fn dtype_and_size(k: Kind) -> (&'static str, usize) {
    match k {
        Kind::Linear | Kind::Ones => ("BF16", 2),
        Kind::Fp8 => ("F8_E4M3", 1),
        Kind::Scale(_) | Kind::Zeros => ("F32", 4),
        Kind::AwqQ | Kind::AwqZ => ("I32", 4),
        Kind::AwqS(_) => ("F16", 2),
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D049BB133111EB);
    x ^ (x >> 31)
}

/// Fills `buf` (the bytes of elements `first..`) for one tensor, in parallel.
fn fill(buf: &mut [u8], kind: Kind, fan_in: usize, seed: u64, first: usize) {
    let a = (3.0 / fan_in.max(1) as f64).sqrt() as f32;
    match kind {
        Kind::Linear => buf.par_chunks_mut(1 << 16).enumerate().for_each(|(c, ch)| {
            let base = first + c * (1 << 15);
            for (i, v) in ch.chunks_exact_mut(2).enumerate() {
                let r = splitmix(seed ^ (base + i) as u64);
                let u = (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                let bits = (u * a).to_bits();
                let b = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
                v.copy_from_slice(&b.to_le_bytes());
            }
        }),
        Kind::Fp8 => buf.par_chunks_mut(1 << 16).enumerate().for_each(|(c, ch)| {
            let base = first + c * (1 << 16);
            for (i, v) in ch.iter_mut().enumerate() {
                // Magnitudes up to 448 (exponent <= 14), never the NaN pattern.
                let b = splitmix(seed ^ (base + i) as u64) as u8;
                *v = if b & 0x78 == 0x78 { b & 0xf7 } else { b };
            }
        }),
        // Dequantized weights then span about +-448 * scale: aim at +-a.
        Kind::Scale(fan) => {
            let s = (3.0 / fan.max(1) as f64).sqrt() as f32 / 240.0;
            buf.chunks_exact_mut(4).for_each(|v| v.copy_from_slice(&s.to_le_bytes()));
        }
        Kind::AwqQ => buf.par_chunks_mut(1 << 16).enumerate().for_each(|(c, ch)| {
            let base = first + c * (1 << 14);
            for (i, v) in ch.chunks_exact_mut(4).enumerate() {
                v.copy_from_slice(&(splitmix(seed ^ (base + i) as u64) as u32).to_le_bytes());
            }
        }),
        Kind::AwqZ => buf.chunks_exact_mut(4).enumerate().for_each(|(i, v)| {
            let r = splitmix(seed ^ (first + i) as u64);
            let w = (0..8).fold(0u32, |acc, j| acc | ((5 + ((r >> (8 * j)) % 6) as u32) << (4 * j)));
            v.copy_from_slice(&w.to_le_bytes());
        }),
        // (q - z) spans about +-10 around 0 with q uniform in 0..16: aim at +-a.
        Kind::AwqS(fan) => {
            let s = half::f16::from_f32((3.0 / fan.max(1) as f64).sqrt() as f32 / 8.0);
            buf.chunks_exact_mut(2).for_each(|v| v.copy_from_slice(&s.to_bits().to_le_bytes()));
        }
        Kind::Ones => buf.chunks_exact_mut(2).for_each(|v| v.copy_from_slice(&0x3f80u16.to_le_bytes())),
        Kind::Zeros => buf.fill(0),
    }
}

/// Largest shard file, as transformers' `save_pretrained` cuts checkpoints (its default 5 GB):
/// a model above it is written as numbered shards with `model.safetensors.index.json`.
const SHARD_BYTES: usize = 5_000_000_000;

/// Writes `config.json`, a tokenizer of the model's vocabulary and the weights into `dir`:
/// `model.safetensors`, or shards of at most [`SHARD_BYTES`] written in parallel and their index;
/// returns the bytes of weights written.
pub fn write(dir: &Path, shape: Shape, dims: Dims, dtype: WeightDtype, seed: u64) -> anyhow::Result<u64> {
    write_sharded(dir, shape, dims, dtype, seed, SHARD_BYTES)
}

fn write_sharded(
    dir: &Path,
    shape: Shape,
    dims: Dims,
    dtype: WeightDtype,
    seed: u64,
    shard_bytes: usize,
) -> anyhow::Result<u64> {
    let cfg = config(shape, dims, dtype);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg)?)?;
    let dim = |k: &str| cfg[k].as_u64().unwrap_or(0) as usize;
    crate::gen_tokenizer::write(dir, dim("vocab_size"), dim("max_position_embeddings"))?;
    let specs = specs(&cfg, dtype);
    let bytes = |s: &Spec| s.shape.iter().product::<usize>() * dtype_and_size(s.kind).1;
    // Consecutive tensors per shard (a tensor's seed is its index in `specs`, whatever the shard).
    let mut shards: Vec<std::ops::Range<usize>> = Vec::new();
    let mut size = 0;
    for (t, s) in specs.iter().enumerate() {
        match shards.last_mut() {
            Some(r) if size + bytes(s) <= shard_bytes => r.end = t + 1,
            _ => {
                shards.push(t..t + 1);
                size = 0;
            }
        }
        size += bytes(s);
    }
    let n = shards.len();
    let name = |i: usize| {
        if n == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{n:05}.safetensors", i + 1)
        }
    };
    shards.par_iter().enumerate().try_for_each(|(i, r)| write_shard(&dir.join(name(i)), &specs, r.clone(), seed))?;
    let total: usize = specs.iter().map(bytes).sum();
    if n > 1 {
        let mut map = serde_json::Map::new();
        for (i, r) in shards.iter().enumerate() {
            specs[r.clone()].iter().for_each(|s| drop(map.insert(s.name.clone(), json!(name(i)))));
        }
        let index = json!({"metadata": {"total_size": total}, "weight_map": map});
        std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index)?)?;
    }
    Ok(total as u64)
}

/// One safetensors file holding `specs[range]`.
fn write_shard(path: &Path, specs: &[Spec], range: std::ops::Range<usize>, seed: u64) -> anyhow::Result<()> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for s in &specs[range.clone()] {
        let (dt, es) = dtype_and_size(s.kind);
        let n = s.shape.iter().product::<usize>() * es;
        header.insert(s.name.clone(), json!({"dtype": dt, "shape": s.shape, "data_offsets": [off, off + n]}));
        off += n;
    }
    header.insert("__metadata__".into(), json!({"format": "pt", "generator": "cleave gen-checkpoint"}));
    let mut hbytes = serde_json::to_vec(&Value::Object(header))?;
    while hbytes.len() % 8 != 0 {
        hbytes.push(b' ');
    }
    let mut w = BufWriter::with_capacity(
        1 << 24,
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    w.write_all(&(hbytes.len() as u64).to_le_bytes())?;
    w.write_all(&hbytes)?;
    let chunk_elems = 1usize << 24;
    let mut buf = Vec::new();
    for t in range {
        let s = &specs[t];
        let (_, es) = dtype_and_size(s.kind);
        let n: usize = s.shape.iter().product();
        let fan_in = *s.shape.last().unwrap_or(&1);
        let tseed = splitmix(seed ^ (t as u64).wrapping_mul(0x1234_5678_9abc_def1));
        let mut first = 0;
        while first < n {
            let m = chunk_elems.min(n - first);
            buf.resize(m * es, 0);
            fill(&mut buf, s.kind, fan_in, tseed, first);
            w.write_all(&buf)?;
            first += m;
        }
    }
    w.flush()?;
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.layers == Some(0) {
        bail!("--layers must be at least 1");
    }
    let layers = a.layers.or((a.shape == Shape::V3Layers).then_some(4));
    let dims = Dims { layers, routed_experts: a.routed_experts };
    if let Some(n) = a.routed_experts {
        let c = config(a.shape, Dims { layers, routed_experts: None }, a.dtype);
        let (groups, top) =
            (c["n_group"].as_u64().unwrap_or(1) as usize, c["num_experts_per_tok"].as_u64().unwrap_or(1) as usize);
        if n < top || n % groups != 0 {
            bail!("--routed-experts must be a multiple of the shape's {groups} expert groups and at least its top-{top}, got {n}");
        }
    }
    let t0 = std::time::Instant::now();
    let bytes = write(&a.out, a.shape, dims, a.dtype, a.seed)?;
    println!(
        "wrote {} ({:.2} GB of weights) in {:.1} s",
        a.out.display(),
        bytes as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cleave_engine::backend::cpu::CpuBackend;
    use cleave_engine::model::{Model, ModelConfig};

    #[test]
    fn tiny_checkpoints_load_in_both_formats() {
        for dtype in [WeightDtype::Bf16, WeightDtype::Fp8, WeightDtype::Awq] {
            let dir = std::env::temp_dir().join(format!("cleave-gen-{dtype:?}-{}", std::process::id()));
            write(&dir, Shape::Tiny, Dims { layers: Some(2), routed_experts: Some(8) }, dtype, 7).unwrap();
            let cfg = ModelConfig::from_dir(&dir).unwrap();
            assert_eq!((cfg.num_hidden_layers, cfg.n_routed_experts), (2, 8));
            assert_eq!(cfg.fp8_block().is_some(), dtype == WeightDtype::Fp8);
            assert_eq!(cfg.awq().is_some(), dtype == WeightDtype::Awq);
            Model::load(&CpuBackend, &dir, Some(64)).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn sharded_checkpoints_hold_the_same_weights() {
        let dims = Dims { layers: Some(2), routed_experts: Some(8) };
        let base = std::env::temp_dir().join(format!("cleave-gen-shards-{}", std::process::id()));
        let (one, many) = (base.join("one"), base.join("many"));
        let total = write(&one, Shape::Tiny, dims, WeightDtype::Awq, 7).unwrap();
        assert_eq!(write_sharded(&many, Shape::Tiny, dims, WeightDtype::Awq, 7, 300_000).unwrap(), total);
        let index: Value =
            serde_json::from_str(&std::fs::read_to_string(many.join("model.safetensors.index.json")).unwrap()).unwrap();
        assert_eq!(index["metadata"]["total_size"].as_u64(), Some(total));
        let files: std::collections::BTreeSet<&str> =
            index["weight_map"].as_object().unwrap().values().filter_map(Value::as_str).collect();
        assert!(files.len() > 3, "{files:?}");
        assert!(!many.join("model.safetensors").exists());
        let greedy = |dir: &Path| {
            let cfg = cleave_engine::EngineConfig { max_model_len: Some(64), ..Default::default() };
            let mut e = cleave_engine::Engine::load(CpuBackend, dir, cfg).unwrap();
            let out = e.generate_greedy(&[vec![5, 9, 13, 17]], &[8]).unwrap();
            out[0].iter().map(|t| (t.token, t.logprob.to_bits())).collect::<Vec<_>>()
        };
        assert_eq!(greedy(&one), greedy(&many));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn real_shapes_parse() {
        for (shape, layers) in [(Shape::V2Lite, 27), (Shape::V3Layers, 4)] {
            let dims = Dims { layers: (shape == Shape::V3Layers).then_some(4), routed_experts: None };
            let c = config(shape, dims, WeightDtype::Awq);
            let cfg = ModelConfig::from_json_str(&c.to_string(), Path::new("config.json")).unwrap();
            assert_eq!(cfg.num_hidden_layers, layers);
            assert_eq!(cfg.kv_lora_rank, 512);
        }
    }
}
