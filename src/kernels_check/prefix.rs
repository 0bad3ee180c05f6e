//! Prefix caching on the CUDA kernels: prompts sharing a long prefix, run one after another so
//! that each finds the prefix cached, give the outputs of the same engine with caching off (and
//! of the CPU backend), at float32 and bf16. The cached run computes only the tails: chunks that
//! start mid-sequence over blocks another request wrote. In bf16 a tail computed apart from its
//! prefix rounds differently (other GEMM shapes), so two tokens closer than 0.05 count as a tie
//! there and logprobs agree within 0.05 (on the random golden weights bf16 alone moves logprobs
//! by up to 0.18; see the golden check's note).

use std::path::Path;

use anyhow::{ensure, Result};
use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::backend::cuda::{CudaBackend, Precision};
use cleave_engine::backend::Backend;
use cleave_engine::{Engine, EngineConfig, Request, SamplingParams};

use super::parallel::{verdict, verdict_within, Outputs};

fn cfg(caching: bool) -> EngineConfig {
    EngineConfig { enable_prefix_caching: caching, ..super::parallel::cfg() }
}

/// Each prompt in turn to completion; returns the outputs and the prompt tokens found cached.
fn one_by_one<B: Backend>(mut e: Engine<B>, prompts: &[Vec<u32>]) -> Result<(Outputs, u64)> {
    let mut out = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(16) };
        e.add_request(Request { id: i as u64, prompt: p.clone(), params, prefill_only: false })?;
        let mut got = Vec::new();
        while e.has_work() {
            got.extend(e.step()?.into_iter().map(|t| (t.token, t.logprob)));
        }
        out.push(got);
    }
    ensure!(e.stats().used_blocks == 0, "blocks leaked");
    Ok((out, e.stats().prefix.hit_tokens))
}

/// Returns the number of failed checks.
pub fn run(dir: &Path, device: usize) -> Result<usize> {
    println!("\nprefix caching on GPU {device}, {}", dir.display());
    let prefix: Vec<u32> = (0..150).map(|i| ((i * 37 + 11) % 300 + 5) as u32).collect();
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|s| prefix.iter().copied().chain((0..(9 + 13 * s)).map(|i| ((i * 29 + s * 5) % 300 + 5) as u32)).collect())
        .collect();
    let (cpu, _) = one_by_one(Engine::load(CpuBackend, dir, cfg(false))?, &prompts)?;
    let mut failed = 0;
    for precision in [Precision::F32, Precision::Bf16] {
        let open = || CudaBackend::with_precision(device, precision);
        let (plain, _) = one_by_one(Engine::load(open()?, dir, cfg(false))?, &prompts)?;
        let (cached, hits) = one_by_one(Engine::load(open()?, dir, cfg(true))?, &prompts)?;
        println!("  {precision:?}: {hits} prompt tokens read from the cache");
        failed += usize::from(hits != 3 * 144);
        let what = format!("{precision:?} cached against uncached");
        if precision == Precision::F32 {
            failed += usize::from(!verdict(&what, &plain, &cached));
            failed += usize::from(!verdict("F32 cached against the CPU backend", &cpu, &cached));
        } else {
            failed += usize::from(!verdict_within(&what, &plain, &cached, 5e-2, 5e-2));
        }
    }
    Ok(failed)
}
