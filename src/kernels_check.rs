//! `cleave kernels-check`: the CUDA backend against the CPU backend, op by op (relative errors,
//! median CUDA-event times, ratio to the H200 ceilings), end to end on the golden checkpoints
//! (`--golden`), the decode/prefill step benchmark (`--bench-model`), the NCCL KV transfer and
//! the collectives against raw NCCL (`--nccl`). Without a GPU it says so and succeeds: that is
//! what CI runs.

mod bench;
mod collectives;
mod experts;
mod fp8;
mod golden;
mod group_bench;
mod linear;
mod moe_tune;
mod nccl;
mod ops;
mod parallel;
mod prefill;
mod prefix;
mod prologue;
mod qdecode;
mod qgemm_tune;
mod quant;
mod routing;
mod sample;

use std::path::PathBuf;

use anyhow::bail;
use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::backend::cuda::{CudaBackend, MlaDecode, Precision};
use cleave_engine::weights::LoadFormat;

/// The HBM ceiling of the GPU named `gpu_name` in bytes/s (device copy, read + write): an
/// H100's as measured on the lent H100s (KINDS.md, about 3.0 TB/s), else the H200's (4.3 TB/s,
/// GPU.md).
pub fn hbm_ceiling(gpu_name: &str) -> f64 {
    if gpu_name.contains("H100") {
        3.0e12
    } else {
        4.3e12
    }
}
pub const TC_FLOPS: f64 = 790e12;
/// Measured FP8 tensor-core ceiling (cuBLASLt, per-tensor scales, 8192^3, H200).
pub const FP8_TC_FLOPS: f64 = 1450e12;

#[derive(clap::Args, Default)]
pub struct Args {
    /// Small sizes only (a quick compile-and-correctness pass).
    #[arg(long)]
    quick: bool,
    /// Skip the per-op checks.
    #[arg(long)]
    no_ops: bool,
    /// Run only these per-op stages (elementwise, linear, quant, expand, fp8_prefill, qdecode, attention, router, experts,
    /// prefill, sample; the shape sweeps moe_tune (bf16 grouped GEMM) and qgemm_tune (compressed decode GEMM) run
    /// only when named).
    #[arg(long, value_delimiter = ',')]
    stages: Vec<String>,
    /// Check and time the default kernel variants only, not the alternatives beside them.
    #[arg(long)]
    default_variants: bool,
    /// Directory of golden checkpoints: generate on CPU and CUDA and compare.
    #[arg(long)]
    golden: Option<PathBuf>,
    /// Other checkpoints (e.g. models/tiny-r1) to generate from on CPU and CUDA and compare.
    #[arg(long)]
    compare_model: Vec<PathBuf>,
    /// Checkpoint to run in parallel layouts on this GPU against one rank (e.g. a golden one).
    #[arg(long)]
    parallel_model: Option<PathBuf>,
    /// Checkpoints to run with prefix caching on and off (e.g. a golden one, tiny-r1).
    #[arg(long)]
    prefix_cache_model: Vec<PathBuf>,
    /// Checkpoint to benchmark (decode steps and one long prefill), e.g. from gen-checkpoint.
    #[arg(long)]
    bench_model: Option<PathBuf>,
    /// How --bench-model's weights are loaded: auto (its files) or dummy (random weights of its
    /// config.json's shapes and format; no weight files needed).
    #[arg(long, default_value = "auto")]
    load_format: LoadFormat,
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    batches: Vec<usize>,
    /// Context length of every sequence in the decode benchmark.
    #[arg(long, default_value_t = 1024)]
    ctx: usize,
    /// Prompt length of the prefill benchmark (0: skip).
    #[arg(long, default_value_t = 4096)]
    prefill: usize,
    // With --bench-model above one rank: the benchmark over a group on GPUs 0..tp*dp.
    #[command(flatten)]
    parallel: crate::parallel_args::ParallelArgs,
    /// NCCL KV-block transfer between GPU 0 and GPU 1 at the full V3 shape, then the engine's
    /// collectives against raw NCCL at decode and prefill sizes.
    #[arg(long)]
    nccl: bool,
    /// Tokens of the transferred prompt.
    #[arg(long, default_value_t = 4096)]
    nccl_tokens: usize,
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Timed repetitions per op.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ceiling {
    /// Memory-bound: bytes/s over the GPU's HBM ceiling ([`hbm_ceiling`]).
    Mem,
    /// Tensor-core bound: FLOP/s over 790 TFLOP/s.
    Tc,
    /// FP8 tensor-core bound: FLOP/s over 1,450 TFLOP/s (cuBLASLt's per-tensor FP8 GEMM at
    /// 8192^3 on an H200, ../shared/GPU.md).
    Fp8Tc,
    None,
}

/// One line of the results table.
pub struct Row {
    pub op: String,
    pub shape: String,
    pub err: f64,
    pub tol: f64,
    pub us: f64,
    pub bytes: f64,
    pub flops: f64,
    pub ceiling: Ceiling,
}

impl Row {
    pub fn ok(&self) -> bool {
        self.err.is_finite() && self.err <= self.tol
    }
    /// The row's share of its ceiling, memory-bound rows against `hbm` bytes/s.
    fn ratio(&self, hbm: f64) -> String {
        if !self.us.is_finite() {
            return "-".into();
        }
        let s = self.us * 1e-6;
        match self.ceiling {
            Ceiling::Mem => format!("{:5.1}% HBM", 100.0 * self.bytes / s / hbm),
            Ceiling::Tc => format!("{:5.1}% TC", 100.0 * self.flops / s / TC_FLOPS),
            Ceiling::Fp8Tc => format!("{:5.1}% FP8 TC", 100.0 * self.flops / s / FP8_TC_FLOPS),
            Ceiling::None => "-".into(),
        }
    }
}

/// ||a - b|| / ||b|| in f64; NaN or a length mismatch is infinite.
/// How many distinct experts `ids` route to.
pub fn experts_touched(ids: &[u32]) -> usize {
    let mut u = ids.to_vec();
    u.sort_unstable();
    u.dedup();
    u.len()
}

pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = x as f64 - y as f64;
        num += d * d;
        den += (y as f64) * (y as f64);
    }
    if num.is_nan() {
        return f64::INFINITY;
    }
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (num / den).sqrt()
}

/// xorshift64*: fast, seeded, never all zeros.
pub struct XRng(u64);

impl XRng {
    pub fn new(seed: u64) -> Self {
        XRng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| (self.unit() * 2.0 - 1.0) * scale).collect()
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }

    /// Random MoE routing: `top_k` distinct experts of `experts` for each of `tokens` tokens.
    pub fn routes(&mut self, tokens: usize, experts: usize, top_k: usize) -> Vec<u32> {
        let mut ids = Vec::with_capacity(tokens * top_k);
        for _ in 0..tokens {
            let mut all: Vec<u32> = (0..experts as u32).collect();
            self.shuffle(&mut all);
            ids.extend_from_slice(&all[..top_k]);
        }
        ids
    }
}

fn print_table(rows: &[Row], hbm: f64) {
    println!("\nmemory-bound rows against {:.1} TB/s of HBM", hbm / 1e12);
    println!(
        "{:<24} {:<66} {:>9} {:>6} {:>10} {:>10} {:>9} {:>12}",
        "op", "shape", "rel err", "tol", "median us", "GB/s", "TFLOP/s", "of ceiling"
    );
    for r in rows {
        let s = r.us * 1e-6;
        let gbs = if r.us.is_finite() && r.bytes > 0.0 { format!("{:.0}", r.bytes / s / 1e9) } else { "-".into() };
        let tf = if r.us.is_finite() && r.flops > 0.0 { format!("{:.1}", r.flops / s / 1e12) } else { "-".into() };
        let us = if r.us.is_finite() { format!("{:.1}", r.us) } else { "-".into() };
        let flag = if r.ok() { "" } else { "  <-- FAIL" };
        println!(
            "{:<24} {:<66} {:>9.2e} {:>6.0e} {:>10} {:>10} {:>9} {:>12}{flag}",
            r.op,
            r.shape,
            r.err,
            r.tol,
            us,
            gbs,
            tf,
            r.ratio(hbm)
        );
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let n = match cleave_kernels::probe() {
        Ok(n) => n,
        Err(why) => {
            println!("kernels-check: skipped, no GPU here ({why})");
            return Ok(());
        }
    };
    if a.nccl {
        if n < 2 {
            bail!("--nccl needs two GPUs, found {n}");
        }
        nccl::run(a.nccl_tokens, a.seed)?;
        collectives::run()?;
    }
    let t0 = std::time::Instant::now();
    let cu = CudaBackend::new(a.device)?;
    let g = cu.gpu();
    println!(
        "device {}: {} ({}, {} SMs), kernels ready in {:.2} s",
        a.device,
        g.name,
        g.arch,
        g.sm_count,
        t0.elapsed().as_secs_f64()
    );
    for m in &g.modules {
        let replaced = match &m.replaced {
            Some((dir, files)) => format!(" ({} from {})", files.join(", "), dir.display()),
            None => String::new(),
        };
        let how = if m.cached { "from cache" } else { "compiled" };
        println!("  module {:<12} {how} in {:.3} s{replaced}", m.name, m.seconds);
    }
    let mla = cleave_kernels::ops::MlaLaunch {
        rows: 1,
        heads: 16,
        kv_lora: 512,
        rope: 64,
        nope: 128,
        layers: 1,
        layer: 0,
        block_size: 64,
        scale: 1.0,
        max_ctx: 1,
    };
    let v3 = MlaDecode::V3_HEADS.map(|h| MlaDecode::V3(Some(h)));
    let v4 = g.has_wgmma().then_some(MlaDecode::V4);
    for which in std::iter::once(MlaDecode::V2).chain(v3).chain(v4) {
        let k = mla.kernel(which, g.has_wgmma());
        let per_sm = g.mla_decode_blocks_per_sm(&k)?;
        println!("  {}: {per_sm} blocks per SM with {} bytes of shared memory (DeepSeek shape)", k.name, k.smem);
    }
    let mut failed = 0;
    if !a.no_ops {
        cu.set_poison(true);
        let mut ctx = ops::Ctx {
            cu: &cu,
            cpu: CpuBackend,
            rng: XRng::new(a.seed),
            quick: a.quick,
            rows: Vec::new(),
            iters: a.iters,
            precise: false,
            defaults_only: a.default_variants,
            tag: String::new(),
        };
        let stages = [
            "elementwise",
            "linear",
            "quant",
            "expand",
            "fp8_prefill",
            "qdecode",
            "attention",
            "prefill",
            "router",
            "experts",
            "sample",
            "moe_tune",
            "qgemm_tune",
        ];
        let sweep = |s: &str| s.ends_with("_tune");
        let wanted = |s: &&str| if a.stages.is_empty() { !sweep(s) } else { a.stages.iter().any(|x| x == s) };
        for name in stages.into_iter().filter(wanted) {
            let r = match name {
                "elementwise" => ctx.elementwise(),
                "linear" => ctx.linear(),
                "quant" => ctx.quant(),
                "expand" => ctx.quant_expand(),
                "fp8_prefill" => ctx.fp8_prefill(),
                "attention" => ctx.attention(),
                "prefill" => ctx.prefill(),
                "router" => ctx.router().and_then(|_| ctx.align()).and_then(|_| ctx.route_align()),
                "sample" => ctx.sample(),
                "qdecode" => ctx.qdecode(),
                "moe_tune" => ctx.moe_tune(),
                "qgemm_tune" => ctx.qgemm_tune(),
                _ => ctx.experts(),
            };
            if let Err(e) = r {
                println!("stage {name} failed: {e:#}");
                failed += 1;
            }
        }
        // The reference-precision backend's own kernels (f32 attention and experts), small sizes.
        let precise = CudaBackend::with_precision(a.device, Precision::F32)?;
        precise.set_poison(true);
        let mut rows = std::mem::take(&mut ctx.rows);
        let mut pctx = ops::Ctx {
            cu: &precise,
            cpu: CpuBackend,
            rng: XRng::new(a.seed + 1),
            quick: true,
            rows: Vec::new(),
            iters: 3,
            precise: true,
            defaults_only: true,
            tag: String::new(),
        };
        for (name, r) in [("linear", pctx.linear()), ("attention", pctx.attention()), ("experts", pctx.experts())] {
            if let Err(e) = r {
                println!("stage {name} [f32] failed: {e:#}");
                failed += 1;
            }
        }
        rows.append(&mut pctx.rows);
        cu.set_poison(false);
        print_table(&rows, hbm_ceiling(&g.name));
        failed += rows.iter().filter(|r| !r.ok()).count();
    }
    if a.golden.is_some() || !a.compare_model.is_empty() {
        failed += golden::run(&cu, a.device, a.golden.as_deref(), &a.compare_model)?;
    }
    if let Some(dir) = &a.parallel_model {
        failed += parallel::run(dir, a.device)?;
    }
    for dir in &a.prefix_cache_model {
        failed += prefix::run(dir, a.device)?;
    }
    if let Some(dir) = &a.bench_model {
        let par = a.parallel.config();
        if par.world() > 1 {
            group_bench::run(dir, a.load_format, par, &a.batches, a.ctx, a.prefill, a.seed)?;
        } else {
            bench::run(&cu, dir, a.load_format, &a.batches, a.ctx, a.prefill, a.seed)?;
        }
    }
    if failed > 0 {
        bail!("kernels-check: {failed} check(s) over tolerance or failed");
    }
    println!("kernels-check: all checks within tolerance");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_the_check_says_so_and_succeeds() {
        if cleave_kernels::probe().is_ok() {
            eprintln!("a GPU is present: the no-GPU path is not exercised here");
            return;
        }
        run(Args { quick: true, ..Args::default() }).unwrap();
        run(Args { nccl: true, golden: Some(PathBuf::from("models/golden")), ..Args::default() }).unwrap();
    }

    #[test]
    fn relative_error_catches_nan_and_shape() {
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!(rel_err(&[f32::NAN, 2.0], &[1.0, 2.0]).is_infinite());
        assert!(rel_err(&[1.0], &[1.0, 2.0]).is_infinite());
        assert!((rel_err(&[1.1], &[1.0]) - 0.1).abs() < 1e-6);
    }
}
