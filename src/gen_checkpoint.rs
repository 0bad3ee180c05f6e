//! `cleave gen-checkpoint`: random-weight DeepSeek-V3-architecture checkpoints at real shapes
//! (HF layout: config.json + model.safetensors, or 5 GB shards and their index) for performance
//! work: bf16, fp8 e4m3 with 128x128 `weight_scale_inv` blocks, or AutoAWQ "gemm" int4 with
//! groups of 64. The values are [`cleave_engine::weights::random`]'s, the same as
//! `--load-format dummy` makes from the written config.json; `--config-only` writes the config
//! and tokenizer alone, for dummy loading.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cleave_engine::model::ModelConfig;
use cleave_engine::weights::random::{self, TensorSpec};
use cleave_engine::weights::DUMMY_SEED;
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
    /// Seed of the weights (the default is the one `--load-format dummy` uses).
    #[arg(long, default_value_t = DUMMY_SEED)]
    seed: u64,
    /// Write config.json and the tokenizer only (for `--load-format dummy`).
    #[arg(long)]
    config_only: bool,
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
    let cfg = write_config(dir, shape, dims, dtype)?;
    let specs = random::specs(&cfg);
    // Consecutive tensors per shard.
    let mut shards: Vec<std::ops::Range<usize>> = Vec::new();
    let mut size = 0;
    for (t, s) in specs.iter().enumerate() {
        match shards.last_mut() {
            Some(r) if size + s.bytes() <= shard_bytes => r.end = t + 1,
            _ => {
                shards.push(t..t + 1);
                size = 0;
            }
        }
        size += s.bytes();
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
    let total: usize = specs.iter().map(TensorSpec::bytes).sum();
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

/// `config.json` and a tokenizer of the model's vocabulary in `dir`; the config as parsed.
fn write_config(dir: &Path, shape: Shape, dims: Dims, dtype: WeightDtype) -> anyhow::Result<ModelConfig> {
    let cfg = config(shape, dims, dtype);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&cfg)?)?;
    let parsed = ModelConfig::from_json_str(&cfg.to_string(), &path)?;
    crate::gen_tokenizer::write(dir, parsed.vocab_size, parsed.max_position_embeddings)?;
    Ok(parsed)
}

/// One safetensors file holding `specs[range]`.
fn write_shard(path: &Path, specs: &[TensorSpec], range: std::ops::Range<usize>, seed: u64) -> anyhow::Result<()> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for s in &specs[range.clone()] {
        let dtype = format!("{:?}", s.kind.dtype().0);
        header
            .insert(s.name.clone(), json!({"dtype": dtype, "shape": s.shape, "data_offsets": [off, off + s.bytes()]}));
        off += s.bytes();
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
    for s in &specs[range] {
        let es = s.kind.dtype().1;
        let n: usize = s.shape.iter().product();
        let mut first = 0;
        while first < n {
            let m = chunk_elems.min(n - first);
            buf.resize(m * es, 0);
            s.fill(&mut buf, seed, first);
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
    if a.config_only {
        write_config(&a.out, a.shape, dims, a.dtype)?;
        println!("wrote {} (config.json and tokenizer; load it with --load-format dummy)", a.out.display());
        return Ok(());
    }
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
    use cleave_engine::model::{LoadOptions, Model, ModelConfig};
    use cleave_engine::weights::{Checkpoint, LoadFormat, Weights};
    use cleave_engine::{Engine, EngineConfig, ParallelConfig};

    #[test]
    fn tiny_checkpoints_load_in_both_formats() {
        for dtype in [WeightDtype::Bf16, WeightDtype::Fp8, WeightDtype::Awq] {
            let dir = std::env::temp_dir().join(format!("cleave-gen-{dtype:?}-{}", std::process::id()));
            write(&dir, Shape::Tiny, Dims { layers: Some(2), routed_experts: Some(8) }, dtype, 7).unwrap();
            let cfg = ModelConfig::from_dir(&dir).unwrap();
            assert_eq!((cfg.num_hidden_layers, cfg.n_routed_experts), (2, 8));
            assert_eq!(cfg.fp8_block().is_some(), dtype == WeightDtype::Fp8);
            assert_eq!(cfg.awq().is_some(), dtype == WeightDtype::Awq);
            Model::load(&CpuBackend, &dir, LoadOptions { max_len: Some(64), ..Default::default() }).unwrap();
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
        let files = EngineConfig { max_model_len: Some(64), ..Default::default() };
        assert_eq!(greedy(&one, files, None), greedy(&many, files, None));
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Greedy tokens and logprob bits of one prompt, on one rank or a CPU group.
    fn greedy(dir: &Path, cfg: EngineConfig, par: Option<ParallelConfig>) -> Vec<(u32, u32)> {
        let mut e = match par {
            None => Engine::load(CpuBackend, dir, cfg).unwrap(),
            Some(par) => Engine::load_parallel(par, dir, cfg, |_| Ok(CpuBackend)).unwrap(),
        };
        let out = e.generate_greedy(&[vec![5, 9, 13, 17]], &[8]).unwrap();
        out[0].iter().map(|t| (t.token, t.logprob.to_bits())).collect()
    }

    /// `--load-format dummy` over a `--config-only` directory is the checkpoint `gen-checkpoint`
    /// writes: every tensor's bytes, and the tokens of one rank and of a TP2+EP group.
    #[test]
    fn dummy_weights_are_the_generated_checkpoint() {
        let dims = Dims { layers: Some(2), routed_experts: Some(8) };
        let base = std::env::temp_dir().join(format!("cleave-gen-dummy-{}", std::process::id()));
        for dtype in [WeightDtype::Bf16, WeightDtype::Fp8, WeightDtype::Awq] {
            let (files, bare) = (base.join(format!("{dtype:?}")), base.join(format!("{dtype:?}-bare")));
            write(&files, Shape::Tiny, dims, dtype, DUMMY_SEED).unwrap();
            write_config(&bare, Shape::Tiny, dims, dtype).unwrap();
            assert!(Checkpoint::open(&bare).is_err(), "a config-only directory holds no weights");
            let stored = Checkpoint::open(&files).unwrap();
            let cfg = ModelConfig::from_dir(&bare).unwrap();
            let dummy = Weights::open(&bare, &cfg, LoadFormat::Dummy).unwrap();
            let mut seen = 0;
            for part in std::iter::once(None).chain((0..cfg.num_hidden_layers).map(Some)) {
                let part = dummy.part(part);
                for name in part.names() {
                    let (a, b) = (stored.raw(name).unwrap(), part.raw(name).unwrap());
                    assert_eq!((a.dtype, a.shape, a.bytes), (b.dtype, b.shape, b.bytes), "{name}");
                    seen += 1;
                }
            }
            assert_eq!(seen, stored.names().len(), "{dtype:?}: the dummy weights are every stored tensor");
            let files_cfg = EngineConfig { max_model_len: Some(64), ..Default::default() };
            let dummy_cfg = EngineConfig { load_format: LoadFormat::Dummy, ..files_cfg };
            let want = greedy(&files, files_cfg, None);
            assert_eq!(greedy(&bare, dummy_cfg, None), want, "{dtype:?}");
            if dtype == WeightDtype::Fp8 {
                continue; // the tiny shape's 128-wide FP8 blocks do not split over two ranks
            }
            let tp2 = ParallelConfig { tensor_parallel_size: 2, enable_expert_parallel: true, ..Default::default() };
            let group = greedy(&bare, dummy_cfg, Some(tp2));
            assert_eq!(group.iter().map(|t| t.0).collect::<Vec<_>>(), want.iter().map(|t| t.0).collect::<Vec<_>>());
        }
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
