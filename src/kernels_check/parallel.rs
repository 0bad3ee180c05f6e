//! Parallel groups on one GPU. NCCL refuses two ranks of one communicator on one device, so the
//! layouts run as rank threads that each open GPU 0 with in-process collectives (staged through
//! the host): sharded loading, head and expert slices, the MoE exchange and empty DP ranks on the
//! CUDA kernels, against one rank at float32; a prompt's KV handed from a TP group to a DP group
//! over in-process ports (the engine path of transfers between GPU groups, host copies instead of
//! NCCL). Then a one-rank NCCL communicator's all-reduce.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use cleave_engine::backend::cuda::{CudaBackend, Precision};
use cleave_engine::backend::Backend;
use cleave_engine::{Engine, EngineConfig, ParallelConfig, Request, SamplingParams};
use cleave_kernels::nccl::NcclComm;

pub(super) type Outputs = Vec<Vec<(u32, f32)>>;

pub(super) fn cfg() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 96,
        block_size: 16,
        num_blocks: 128,
        max_model_len: Some(512),
        ..EngineConfig::default()
    }
}

fn generate<B: Backend>(mut e: Engine<B>, prompts: &[Vec<u32>]) -> Result<Outputs> {
    let out = e.generate_greedy(prompts, &vec![24; prompts.len()])?;
    ensure!(e.stats().used_blocks == 0, "blocks leaked");
    Ok(out.iter().map(|o| o.iter().map(|t| (t.token, t.logprob)).collect()).collect())
}

/// Returns the number of failed checks.
pub fn run(dir: &Path, device: usize) -> Result<usize> {
    println!("\nparallel groups on GPU {device} (rank threads, in-process collectives), {}", dir.display());
    let prompts: Vec<Vec<u32>> =
        (0..5).map(|s| (0..(7 + 23 * s)).map(|i| ((i * 31 + s * 7) % 300 + 5) as u32).collect()).collect();
    let open = move |_| CudaBackend::with_precision(device, Precision::F32);
    let one = generate(Engine::load(open(0)?, dir, cfg())?, &prompts)?;
    let cpu = generate(Engine::load(cleave_engine::backend::cpu::CpuBackend, dir, cfg())?, &prompts)?;
    let mut failed = usize::from(!verdict("one rank against the CPU backend", &cpu, &one));
    let layouts = [(2, 1, false), (2, 1, true), (1, 2, true), (2, 2, true), (1, 2, false)];
    for (tp, dp, ep) in layouts {
        let par = ParallelConfig { tensor_parallel_size: tp, data_parallel_size: dp, enable_expert_parallel: ep };
        let what = format!("tp {tp} dp {dp} ep {ep:5}");
        let engine = match Engine::load_parallel(par, dir, cfg(), open) {
            Err(cleave_engine::EngineError::Config(why)) => {
                println!("  {what}: not a layout of this model ({why})");
                continue;
            }
            r => r?,
        };
        let got = generate(engine, &prompts)?;
        failed += usize::from(!verdict(&format!("{what} against one rank"), &one, &got));
    }
    let tp2 = ParallelConfig { tensor_parallel_size: 2, data_parallel_size: 1, enable_expert_parallel: false };
    let dp2 = ParallelConfig { tensor_parallel_size: 1, data_parallel_size: 2, enable_expert_parallel: true };
    let got = handoff(
        Engine::load_parallel(tp2, dir, cfg(), open)?,
        Engine::load_parallel(dp2, dir, cfg(), open)?,
        &prompts,
    )?;
    failed += usize::from(!verdict("prefill on tp 2, KV over ports into dp 2 + ep, decode there", &one, &got));
    failed += usize::from(!nccl_world_of_one(device)?);
    Ok(failed)
}

/// Disaggregation between groups as a KV transfer between pools runs it (`Engine::move_prefilled`
/// over in-process ports, since NCCL cannot link two ranks on one GPU): each prompt prefilled by
/// `prefill` (its first token sampled there), its latent KV sent by the sampling rank of the DP
/// rank holding it to every TP rank of the DP rank of `decode` that reserved blocks, decoded there.
fn handoff<B: Backend>(mut prefill: Engine<B>, mut decode: Engine<B>, prompts: &[Vec<u32>]) -> Result<Outputs> {
    let hub = cleave_engine::kv_port::MemHub::new();
    prefill.link_in_process(&hub, 0)?;
    decode.link_in_process(&hub, 100)?;
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(24) };
    let mut out: Outputs = vec![Vec::new(); prompts.len()];
    for (i, p) in prompts.iter().enumerate() {
        let req = |prefill_only| Request { id: i as u64, prompt: p.clone(), params: params.clone(), prefill_only };
        prefill.add_request(req(true))?;
    }
    while prefill.has_work() {
        for o in prefill.step()? {
            ensure!(o.prefilled, "a prefill-only request produced a token after its first");
            let id = o.id;
            let r = Request { id, prompt: prompts[id as usize].clone(), params: params.clone(), prefill_only: false };
            prefill.move_prefilled(&mut decode, r, o.token)?;
            out[id as usize].push((o.token, o.logprob));
        }
    }
    while decode.has_work() {
        for o in decode.step()? {
            out[o.id as usize].push((o.token, o.logprob));
        }
    }
    ensure!(prefill.stats().used_blocks == 0 && decode.stats().used_blocks == 0, "blocks leaked");
    Ok(out)
}

/// Two tokens whose logprobs differ by less than this are a tie: which one greedy picks depends
/// on the order of the sums (a TP all-reduce changes it), so the outputs may part there.
const TIE: f32 = 1e-5;

/// Whether the greedy ids agree, and the largest logprob difference over the positions compared.
/// A prompt is compared up to its first tie (vLLM's `check_logprobs_close` stops at a divergence
/// the same way); a different id anywhere else is a failure.
fn compare(a: &Outputs, b: &Outputs, tie: f32) -> (bool, f32) {
    let (mut same, mut diff) = (true, 0f32);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        for (k, (s, t)) in x.iter().zip(y).enumerate() {
            if s.0 != t.0 {
                let tie = (s.1 - t.1).abs() < tie;
                println!(
                    "    prompt {i}: output {k} is {:?} against {:?}: {}",
                    s,
                    t,
                    if tie { "a tie, compared up to here" } else { "DIFFERENT" }
                );
                same &= tie;
                break;
            }
            diff = diff.max((s.1 - t.1).abs());
        }
    }
    (same, diff)
}

/// Prints one comparison's line; true when within tolerance (float32: ties within 1e-5,
/// logprobs within 1e-4).
pub(super) fn verdict(what: &str, want: &Outputs, got: &Outputs) -> bool {
    verdict_within(what, want, got, TIE, 1e-4)
}

/// [`verdict`] with ties closer than `tie` and a logprob tolerance `tol`.
pub(super) fn verdict_within(what: &str, want: &Outputs, got: &Outputs, tie: f32, tol: f32) -> bool {
    let (same_ids, diff) = compare(want, got, tie);
    let ok = same_ids && diff < tol;
    println!(
        "  {what}: ids {}, max |logprob diff| {diff:.2e} {}",
        if same_ids { "equal (up to ties)" } else { "DIFFER" },
        if ok { "ok" } else { "FAIL" }
    );
    ok
}

/// A one-rank NCCL communicator: its in-place all-reduce leaves the values.
fn nccl_world_of_one(device: usize) -> Result<bool> {
    let be = CudaBackend::with_precision(device, Precision::F32)?;
    let id = NcclComm::unique_id().context("NCCL")?;
    let comm = NcclComm::init(be.gpu(), id, 0, 1, Instant::now() + Duration::from_secs(30))?;
    let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let mut t = be.upload(&x, 10, 100)?;
    let p = t.ptr_mut();
    // SAFETY: `t` holds 1000 f32 values on this GPU and outlives the synchronization below.
    unsafe { comm.all_reduce_sum_f32(be.gpu(), p, 1000)? };
    be.sync()?;
    let ok = be.download(&t)? == x;
    println!("  NCCL world of one: all-reduce {}", if ok { "ok" } else { "FAIL (values changed)" });
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use cleave_engine::backend::cpu::CpuBackend;

    use super::*;

    #[test]
    fn the_handoff_between_groups_matches_one_rank_on_the_cpu() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/golden/bf16-qlora");
        let prompts: Vec<Vec<u32>> =
            (0..3).map(|s| (0..(9 + 40 * s)).map(|i| (i * 7 + s) as u32 % 300 + 5).collect()).collect();
        let one = generate(Engine::load(CpuBackend, &dir, cfg()).unwrap(), &prompts).unwrap();
        let open = |_| Ok(CpuBackend);
        let tp2 = ParallelConfig { tensor_parallel_size: 2, data_parallel_size: 1, enable_expert_parallel: false };
        let dp2 = ParallelConfig { tensor_parallel_size: 1, data_parallel_size: 2, enable_expert_parallel: true };
        let p = Engine::load_parallel(tp2, &dir, cfg(), open).unwrap();
        let d = Engine::load_parallel(dp2, &dir, cfg(), open).unwrap();
        let got = handoff(p, d, &prompts).unwrap();
        assert!(got.iter().all(|o| o.len() == 24));
        assert!(verdict("cpu handoff", &one, &got));
    }
}
