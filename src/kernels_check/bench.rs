//! Decode-step and prefill benchmark of a checkpoint on one GPU, driving `Model::forward` with
//! synthetic batches over a randomly filled latent cache: step time, tokens/s, achieved HBM
//! bandwidth (weights and KV bytes read per step over step time) and tensor-core FLOP/s. After
//! the warm-up step of each batch, the timed steps must make no device allocation (the backend's
//! workspace serves them); the command fails otherwise.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use cleave_engine::backend::cuda::{CudaBackend, PersistentGemm, Variants, DEFAULT_PERSISTENT};
use cleave_engine::backend::{AttnBatch, AttnSeq, Backend, KvLayout, SampleRow};
use cleave_engine::graphs::DecodeGraphs;
use cleave_engine::model::{LoadOptions, Model, ModelConfig, Quantization, StepInput};
use cleave_engine::weights::LoadFormat;

use super::{hbm_ceiling, XRng, TC_FLOPS};

/// Parameters of the per-token dense path of one layer, its routed-expert size, and the rest,
/// with the bytes per parameter the GPU reads for each.
pub(super) struct Counts {
    /// Per layer: attention projections (kv_b included) and dense MLP or router + shared experts.
    layer_dense: Vec<f64>,
    /// Per layer: the bytes of `layer_dense` as kept on the GPU.
    layer_bytes: Vec<f64>,
    /// One routed expert's parameters (gate, up, down) and their bytes.
    expert: f64,
    expert_bytes: f64,
    lm_head: f64,
}

/// Bytes per linear-layer parameter as the GPU keeps a checkpoint's quantized layers: bf16, FP8
/// with an f32 scale per column and group of input channels, AWQ int4 with an f16 scale and a
/// 4-bit zero point per group.
fn bytes_per_param(c: &ModelConfig) -> f64 {
    match &c.quantization {
        None => 2.0,
        Some(Quantization::Fp8 { block }) => 1.0 + 4.0 / block[1] as f64,
        Some(Quantization::Awq(a)) => 0.5 + 2.5 / a.group_size as f64,
    }
}

pub(super) fn counts(c: &ModelConfig) -> Counts {
    let (h, heads) = (c.hidden_size as f64, c.num_attention_heads as f64);
    let (nope, rope, v, l) =
        (c.qk_nope_head_dim as f64, c.qk_rope_head_dim as f64, c.v_head_dim as f64, c.kv_lora_rank as f64);
    let q = match c.q_lora_rank {
        Some(r) => h * r as f64 + r as f64 * heads * (nope + rope),
        None => h * heads * (nope + rope),
    };
    let bpp = bytes_per_param(c);
    // kv_b_proj is expanded to bf16 at load; the router gate is f32.
    let kv_b = l * heads * (nope + v);
    let attn = q + h * (l + rope) + heads * v * h;
    let mi = c.moe_intermediate_size as f64;
    let (mut layer_dense, mut layer_bytes) = (Vec::new(), Vec::new());
    for i in 0..c.num_hidden_layers {
        let (mlp, gate) = if c.is_moe_layer(i) {
            (3.0 * h * mi * c.n_shared_experts as f64, h * c.n_routed_experts as f64)
        } else {
            (3.0 * h * c.intermediate_size as f64, 0.0)
        };
        layer_dense.push(attn + kv_b + mlp + gate);
        layer_bytes.push((attn + mlp) * bpp + kv_b * 2.0 + gate * 4.0);
    }
    Counts {
        layer_dense,
        layer_bytes,
        expert: 3.0 * h * mi,
        expert_bytes: 3.0 * h * mi * bpp,
        lm_head: c.vocab_size as f64 * h,
    }
}

impl Counts {
    /// Bytes one copy of the model reads in a decode step of `b` sequences at context `ctx`
    /// touching `experts` routed experts over all MoE layers: weights, KV, and the lm_head when
    /// the step samples.
    pub(super) fn decode_bytes(&self, c: &ModelConfig, b: usize, ctx: usize, experts: usize, lm_head: bool) -> f64 {
        let weights: f64 = self.layer_bytes.iter().sum::<f64>() + self.expert_bytes * experts as f64;
        let kv = (b * ctx * c.latent_dim() * 2 * c.num_hidden_layers) as f64;
        weights + kv + if lm_head { self.lm_head * 2.0 } else { 0.0 }
    }

    /// FLOPs of a `p`-token prefill: (linear layers with top-k experts per token and the
    /// lm_head for one row, causal attention over the latent).
    pub(super) fn prefill_flops(&self, c: &ModelConfig, p: usize) -> (f64, f64) {
        let top_k = c.num_experts_per_tok as f64;
        let moe_layers = (0..c.num_hidden_layers).filter(|&i| c.is_moe_layer(i)).count() as f64;
        let linear = 2.0 * p as f64 * (self.layer_dense.iter().sum::<f64>() + moe_layers * top_k * self.expert)
            + 2.0 * self.lm_head;
        let heads = c.num_attention_heads as f64;
        let attn = (p * (p + 1) / 2) as f64
            * heads
            * (c.latent_dim() + c.kv_lora_rank) as f64
            * 2.0
            * c.num_hidden_layers as f64;
        (linear, attn)
    }
}

/// One step with every kernel timed by events: where the time goes.
fn profile(cu: &CudaBackend, label: &str, mut f: impl FnMut() -> cleave_engine::Result<()>) -> anyhow::Result<()> {
    cu.gpu().profile_start();
    f()?;
    let rows = cu.gpu().profile_stop()?;
    let total: f64 = rows.iter().map(|r| r.1).sum();
    // Every kernel, longest first; `CLEAVE_PDL=off` makes each time the kernel's own (with PDL a
    // kernel's time includes its wait for the one before).
    let list: Vec<String> = rows.iter().map(|(n, t, c)| format!("{n} {t:.2}ms/{c}")).collect();
    println!("  profile {label}: kernels {total:.2} ms: {}", list.join(", "));
    Ok(())
}

/// A decode step replayed from a CUDA graph.
struct GraphStep {
    /// Median step (replay and sampling) in seconds.
    step: f64,
    capture: f64,
    /// Largest logit difference from the eager step.
    diff: f64,
    /// Device allocations over the replays after the first.
    allocs: u64,
}

/// Captures `input`'s step as a graph (the engine's decode path), checks its logits against the
/// eager forward pass and times replay + sampling.
fn graph_step(
    cu: &CudaBackend,
    model: &Model<CudaBackend>,
    cache: &mut <CudaBackend as Backend>::KvCache,
    input: &StepInput,
    greedy: &[SampleRow],
    (block_size, num_blocks): (usize, usize),
) -> anyhow::Result<GraphStep> {
    let t = Instant::now();
    let b = input.ids.len();
    let (graphs, _) = DecodeGraphs::capture(cu, model, cache, None, &[b], (block_size, num_blocks))?;
    cu.sync()?;
    let capture = t.elapsed().as_secs_f64();
    let eager = cu.download(&model.forward(cu, cache, None, input)?.context("no logits")?)?;
    let replayed =
        cu.download(graphs.run(cu, input)?.flatten().context("the decode step did not replay its graph")?)?;
    let diff = eager.iter().zip(&replayed).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    let (mut ts, allocs0, n) = (Vec::new(), cu.device_allocs(), 12);
    for i in 0..n {
        let t = Instant::now();
        let logits = graphs.run(cu, input)?.flatten().context("no replay")?;
        cu.sample(logits, greedy, &[])?;
        if i >= 2 {
            ts.push(t.elapsed().as_secs_f64());
        }
    }
    let allocs = cu.device_allocs() - allocs0;
    Ok(GraphStep { step: median(ts), capture, diff, allocs })
}

/// A decode step of `n` sequences at context `ctx`, each in its own blocks (sequence `s` in blocks
/// `s * per_seq..`), with random tokens; every row sampled.
pub(super) fn decode_input(n: usize, ctx: usize, bs: usize, vocab: usize, rng: &mut XRng) -> StepInput {
    let per_seq = ctx.div_ceil(bs) + 1;
    let mut input = StepInput::default();
    for s in 0..n {
        let table: Vec<u32> = (0..per_seq as u32).map(|j| (s * per_seq) as u32 + j).collect();
        let pos = ctx - 1;
        input.ids.push(rng.below(vocab) as u32);
        input.positions.push(pos as u32);
        input.slots.push(table[pos / bs] * bs as u32 + (pos % bs) as u32);
        input.attn.seqs.push(AttnSeq { q_start: s, q_len: 1, ctx_len: ctx, block_table: table });
        input.sample_rows.push(s as u32);
    }
    input
}

/// One `p`-token prompt of random tokens in blocks `0..`, its last row sampled.
pub(super) fn prefill_input(p: usize, bs: usize, vocab: usize, rng: &mut XRng) -> StepInput {
    let table: Vec<u32> = (0..p.div_ceil(bs) as u32).collect();
    StepInput {
        ids: (0..p).map(|_| rng.below(vocab) as u32).collect(),
        positions: (0..p as u32).collect(),
        slots: (0..p as u32).collect(),
        attn: AttnBatch { seqs: vec![AttnSeq { q_start: 0, q_len: p, ctx_len: p, block_table: table }] },
        sample_rows: vec![p as u32 - 1],
        dp_rows: Vec::new(),
    }
}

/// Greedy sampling of rows `0..n`.
pub(super) fn greedy_rows(n: usize) -> Vec<SampleRow> {
    (0..n as u32)
        .map(|row| SampleRow {
            row,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            u: 0.0,
            mask: SampleRow::NO_MASK,
        })
        .collect()
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(
    cu: &CudaBackend,
    dir: &Path,
    format: LoadFormat,
    batches: &[usize],
    ctx: usize,
    prefill: usize,
    seed: u64,
) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let max_len = (ctx + 16).max(prefill + 16);
    let opts = LoadOptions { max_len: Some(max_len), format };
    let model = Model::load(cu, dir, opts).with_context(|| format!("loading {}", dir.display()))?;
    cu.sync()?;
    let c = model.config().clone();
    let (free, total) = cu.gpu().mem_info()?;
    println!(
        "\nbench: {} loaded in {:.1} s ({:.1} GiB of {:.1} GiB in use)",
        dir.display(),
        t0.elapsed().as_secs_f64(),
        (total - free) as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64
    );
    let bs = 64;
    let width = c.latent_dim();
    let per_seq = ctx.div_ceil(bs) + 1;
    let max_b = batches.iter().copied().max().unwrap_or(1);
    let need = (max_b * per_seq).max(prefill.div_ceil(bs) + 1);
    let fit = cu.kv_blocks_for_memory(0.9, c.num_hidden_layers, bs, width)?;
    let num_blocks = need.min(fit);
    anyhow::ensure!(num_blocks == need, "the KV cache needs {need} blocks, {fit} fit in 90% of the GPU");
    let layout = KvLayout { layers: c.num_hidden_layers, num_blocks, block_size: bs, width };
    let mut cache = cu.alloc_kv_cache(layout)?;
    cu.fill_kv_random(&mut cache, seed)?;
    println!("KV cache: {num_blocks} blocks of {bs} tokens ({:.2} GiB); kv_cache.gpu_memory_utilization 0.9 would allow {fit}", (num_blocks * layout.block_values() * 2) as f64 / (1u64 << 30) as f64);
    let k = counts(&c);
    let hbm = hbm_ceiling(&cu.gpu().name);
    let mut rng = XRng::new(seed);
    let vocab = c.vocab_size;
    println!(
        "\ndecode step (every sequence at context {ctx}; every row sampled greedily on the GPU, tokens to the host)"
    );
    println!(
        "{:>6} {:>10} {:>10} {:>11} {:>9} {:>10} {:>10} {:>11} {:>10} {:>11}",
        "batch", "step ms", "tok/s", "experts/L", "GB/step", "GB/s", "of HBM", "no lm_head", "of HBM", "v1 kernels"
    );
    let mut allocating = Vec::new();
    for &b in batches {
        let input = decode_input(b, ctx, bs, vocab, &mut rng);
        let greedy = greedy_rows(b);
        // What the engine does per step: the forward pass, then sampling where the logits are.
        let step = |inp: &StepInput, cache: &mut _| -> cleave_engine::Result<()> {
            let logits = model.forward(cu, cache, None, inp)?;
            if let (false, Some(logits)) = (inp.sample_rows.is_empty(), logits) {
                cu.sample(&logits, &greedy, &[])?;
            }
            Ok(())
        };
        // Experts actually hit per MoE layer at this batch (one synchronizing pass), which is also
        // this shape's warm-up step.
        cu.record_expert_stats(true);
        step(&input, &mut cache)?;
        let used = cu.take_expert_stats();
        cu.record_expert_stats(false);
        let used_total: usize = used.iter().sum();
        let time = |inp: &StepInput, cache: &mut _, n: usize| -> anyhow::Result<f64> {
            let mut ts = Vec::new();
            for i in 0..n + 2 {
                let t = Instant::now();
                step(inp, cache)?;
                cu.sync()?;
                if i >= 2 {
                    ts.push(t.elapsed().as_secs_f64());
                }
            }
            Ok(median(ts))
        };
        // The step above was this shape's warm-up: from here on the workspace serves every buffer.
        let allocs0 = cu.device_allocs();
        cu.take_workspace_misses();
        let timed = 10;
        let full = time(&input, &mut cache, timed)?;
        // `time` runs two untimed steps before the timed ones: all count.
        let (allocs, steps) = (cu.device_allocs() - allocs0, timed + 2);
        let misses = cu.take_workspace_misses();
        let bare_in = StepInput { sample_rows: Vec::new(), ..input.clone() };
        let bare = time(&bare_in, &mut cache, 10)?;
        // Host time to enqueue a forward pass (no sampling, so nothing in it waits for the GPU):
        // close to the step time means the step is launch-bound.
        let mut enq = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            model.forward(cu, &mut cache, None, &bare_in)?;
            enq.push(t.elapsed().as_secs_f64());
            cu.sync()?;
        }
        let enqueue = median(enq);
        // The same step on the first kernel versions (a fallback if the defaults regress).
        let def = cu.variants();
        cu.set_variants(Variants::FIRST);
        let v1 = time(&bare_in, &mut cache, 5)?;
        // The whole step without the persistent grouped GEMM, with its default, and under every
        // compiled configuration; then the 32-row tiles (taken from ROWS32_MIN_AVG rows per
        // expert): off and each shape. Only bf16 experts run those kernels.
        let (mut sweep, mut sweep32) = (Vec::new(), Vec::new());
        if c.quantization.is_none() {
            let rows16 = PersistentGemm::compiled().filter(|c| c.bm == 16).map(Some);
            for cfg in [None, Some(DEFAULT_PERSISTENT)].into_iter().chain(rows16) {
                cu.set_variants(Variants { moe_persistent: cfg, ..def });
                sweep.push((cfg, time(&input, &mut cache, 5)?));
            }
            let rows32 =
                PersistentGemm::compiled().filter(|c| c.bm == 32).map(|c| Some(PersistentGemm { prefetch: 0, ..c }));
            for cfg in [None].into_iter().chain(rows32) {
                cu.set_variants(Variants { moe_rows32: cfg, ..def });
                sweep32.push((cfg, time(&input, &mut cache, 5)?));
            }
        }
        cu.set_variants(def);
        if b == 1 || b == 64 || b == 256 {
            profile(cu, &format!("decode batch {b}"), || step(&input, &mut cache))?;
        }
        let bytes_full = k.decode_bytes(&c, b, ctx, used_total, true);
        let bytes_bare = k.decode_bytes(&c, b, ctx, used_total, false);
        let moe_layers = used.len().max(1);
        println!(
            "{b:>6} {:>10.3} {:>10.0} {:>11.1} {:>9.2} {:>10.0} {:>9.1}% {:>9.3}ms {:>9.1}% {:>9.3}ms",
            full * 1e3,
            b as f64 / full,
            used_total as f64 / moe_layers as f64,
            bytes_full / 1e9,
            bytes_full / full / 1e9,
            100.0 * bytes_full / full / hbm,
            bare * 1e3,
            100.0 * bytes_bare / bare / hbm,
            v1 * 1e3
        );
        let show = |cfg: Option<PersistentGemm>| cfg.map_or("gg16 v2".to_string(), |c| format!("ggp {c}"));
        if !sweep.is_empty() {
            let line: Vec<String> = sweep.iter().map(|(c, t)| format!("{} {:.3}", show(*c), t * 1e3)).collect();
            println!("{:>6} step ms by decode grouped GEMM: {}", "", line.join(", "));
            let line: Vec<String> = sweep32
                .iter()
                .map(|(c, t)| format!("{} {:.3}", c.map_or("off".into(), |c| c.to_string()), t * 1e3))
                .collect();
            println!("{:>6} step ms by 32-row expert tiles: {}", "", line.join(", "));
        }
        if let Some((c, t)) = sweep.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
            let pct = 100.0 * bytes_full / t / hbm;
            println!("{:>6} fastest: {} at {:.3} ms ({pct:.1}% of HBM)", "", show(*c), t * 1e3);
        }
        println!("{:>6} host time to enqueue the forward pass: {:.3} ms (of {:.3} ms)", "", enqueue * 1e3, bare * 1e3);
        let g = graph_step(cu, &model, &mut cache, &input, &greedy, (bs, num_blocks))?;
        println!(
            "{:>6} CUDA graph: step {:.3} ms ({:.1}% of HBM; eager {:.3} ms), capture {:.0} ms, logits max|d| vs eager {:.1e}, allocations in 12 replays {}",
            "",
            g.step * 1e3,
            100.0 * bytes_full / g.step / hbm,
            full * 1e3,
            g.capture * 1e3,
            g.diff,
            g.allocs
        );
        if g.allocs > 0 {
            allocating.push(b);
        }
        if matches!(c.quantization, Some(Quantization::Awq(_))) {
            // AWQ experts with the half tiles (16-row tiles' last rows on the 8-row kernel) off
            // and on at any stack size, where not the default; same run.
            let def = cu.variants();
            for (label, halves) in [("off", None), ("on at any size", Some(0))] {
                if def.qgemm_halves == halves {
                    continue;
                }
                cu.set_variants(Variants { qgemm_halves: halves, ..def });
                let alt = graph_step(cu, &model, &mut cache, &input, &greedy, (bs, num_blocks));
                cu.set_variants(def);
                let alt = alt?;
                println!(
                    "{:>6} CUDA graph with half tiles {label}: step {:.3} ms ({:.1}% of HBM), logits max|d| vs eager {:.1e}",
                    "",
                    alt.step * 1e3,
                    100.0 * bytes_full / alt.step / hbm,
                    alt.diff
                );
            }
        }
        if allocs == 0 {
            println!("{:>6} allocations per decode step: 0", "");
        } else {
            println!(
                "{:>6} allocations per decode step: {:.2} ({allocs} over {steps} steps)",
                "",
                allocs as f64 / steps as f64
            );
            misses.iter().for_each(|m| println!("{:>6}   workspace miss: {m}", ""));
            allocating.push(b);
        }
    }
    if prefill > 0 {
        let p = prefill;
        let input = prefill_input(p, bs, vocab, &mut rng);
        let mut run = |n: usize| -> anyhow::Result<f64> {
            let mut ts = Vec::new();
            for i in 0..n + 1 {
                let t = Instant::now();
                model.forward(cu, &mut cache, None, &input)?;
                cu.sync()?;
                if i >= 1 {
                    ts.push(t.elapsed().as_secs_f64());
                }
            }
            Ok(median(ts))
        };
        let s = run(3)?;
        let def = cu.variants();
        cu.set_variants(Variants::FIRST);
        let s1 = run(1)?;
        cu.set_variants(def);
        println!("\nprefill on the first kernel versions (absorbed attention, v1 grouped GEMM): {:.1} ms", s1 * 1e3);
        profile(cu, "prefill", || model.forward(cu, &mut cache, None, &input).map(drop))?;
        let (linear, attn_core) = k.prefill_flops(&c, p);
        let flops = linear + attn_core;
        println!("\nprefill of one {p}-token prompt (one step, no chunking)");
        println!(
            "  {:.1} ms, {:.0} tokens/s, {:.1} TFLOP (linear {:.1} + attention {:.1}), {:.0} TFLOP/s = {:.1}% of {:.0}",
            s * 1e3,
            p as f64 / s,
            flops / 1e12,
            linear / 1e12,
            attn_core / 1e12,
            flops / s / 1e12,
            100.0 * flops / s / TC_FLOPS,
            TC_FLOPS / 1e12
        );
    }
    anyhow::ensure!(
        allocating.is_empty(),
        "decode steps of batch {allocating:?} allocated device memory after their warm-up step"
    );
    Ok(())
}
