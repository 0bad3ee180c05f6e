//! CPU decode throughput: `batch` sequences decoding together after their prompts are prefilled.
//!
//! `cargo run --release -p cleave-engine --example decode_speed -- MODEL_DIR [BATCH,...] [PROMPT_LEN] [NEW_TOKENS]`

use std::path::PathBuf;
use std::time::Instant;

use cleave_engine::backend::cpu::CpuBackend;
use cleave_engine::{Engine, EngineConfig, Request, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).map(String::as_str).unwrap_or("models/tiny-r1"));
    let batches: Vec<usize> =
        args.get(2).map_or("1,8".into(), |s| s.clone()).split(',').map(|b| b.parse()).collect::<Result<_, _>>()?;
    let prompt_len: usize = args.get(3).map_or(Ok(32), |s| s.parse())?;
    let new_tokens: usize = args.get(4).map_or(Ok(128), |s| s.parse())?;
    println!(
        "model {} | prompt {prompt_len} tokens | {new_tokens} new tokens | {} rayon threads",
        dir.display(),
        rayon::current_num_threads()
    );
    println!("{:>6} {:>12} {:>14} {:>12}", "batch", "step ms", "tokens/s", "per-seq tok/s");
    for &batch in &batches {
        let cfg = EngineConfig {
            max_num_seqs: batch,
            num_blocks: 64 * batch.max(1) + 64,
            max_model_len: Some(4096),
            ..EngineConfig::default()
        };
        let mut engine = Engine::load(CpuBackend, &dir, cfg)?;
        let vocab = engine.model_config().vocab_size as u32;
        for i in 0..batch {
            let prompt = (0..prompt_len).map(|t| 2 + ((t as u32 * 31 + i as u32 * 17) % (vocab - 2))).collect();
            let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(new_tokens) };
            engine.add_request(Request { id: i as u64, prompt, params, prefill_only: false })?;
        }
        // Prefill (and the first token) of every sequence, then time the pure decode steps.
        let mut first = 0;
        while first < batch {
            first += engine.step()?.len();
        }
        let (mut steps, mut tokens) = (0usize, 0usize);
        let t0 = Instant::now();
        while engine.has_work() {
            tokens += engine.step()?.len();
            steps += 1;
        }
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{batch:>6} {:>12.2} {:>14.1} {:>12.1}",
            secs * 1e3 / steps as f64,
            tokens as f64 / secs,
            tokens as f64 / secs / batch as f64
        );
    }
    Ok(())
}
