//! The decode-step and prefill benchmark of [`super::bench`] over a parallel group on GPUs
//! `0..world`: each rank loads its shard on a thread of its own with its NCCL communicators (the
//! engine's [`nccl_runners`]) and runs the same step plans as the engine's core would send it.
//! Ranks start each step together (the engine's group answers every step before the next); a
//! step takes as long as its slowest rank. The HBM share counts the bytes one copy of the model
//! reads (what one GPU would read) over the whole group's bandwidth; the collectives' share is
//! what a profiled step spent in NCCL calls on each rank, waiting for peers included.

use std::path::Path;
use std::sync::mpsc::channel;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cleave_engine::backend::cuda::collectives::nccl_runners;
use cleave_engine::backend::cuda::{CudaBackend, Precision};
use cleave_engine::model::{ModelConfig, StepInput};
use cleave_engine::parallel::RankCoord;
use cleave_engine::runner::{ModelRunner, RankBatch, StepPlan};
use cleave_engine::weights::LoadFormat;
use cleave_engine::{EngineConfig, ParallelConfig};

use super::bench::{counts, decode_input, greedy_rows, median, prefill_input};
use super::{hbm_ceiling, XRng, TC_FLOPS};

/// How long a rank waits for its peers at a step boundary before the benchmark gives up.
const STEP_WAIT: Duration = Duration::from_secs(600);
const TIMED_STEPS: usize = 10;

/// Every rank starts a step together; a rank that failed releases the others with its error.
struct StepBarrier {
    n: usize,
    state: Mutex<(usize, u64, Option<String>)>,
    cv: Condvar,
}

impl StepBarrier {
    fn new(n: usize) -> Self {
        StepBarrier { n, state: Mutex::new((0, 0, None)), cv: Condvar::new() }
    }

    fn wait(&self) -> anyhow::Result<()> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let generation = g.1;
        g.0 += 1;
        if g.0 == self.n {
            g.0 = 0;
            g.1 += 1;
            self.cv.notify_all();
        }
        let end = Instant::now() + STEP_WAIT;
        while g.1 == generation && g.2.is_none() {
            if Instant::now() >= end {
                bail!("a peer rank did not reach the step within {} s", STEP_WAIT.as_secs());
            }
            g = self.cv.wait_timeout(g, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
        }
        match &g.2 {
            Some(why) => bail!("a peer rank failed: {why}"),
            None => Ok(()),
        }
    }

    fn fail(&self, why: String) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.2.get_or_insert(why);
        self.cv.notify_all();
    }
}

/// A step the group runs: its plan, the tokens it processes, whether it decodes, and whether
/// it replays a CUDA graph captured for it.
struct Scenario {
    label: String,
    plan: StepPlan,
    batch: usize,
    decode: bool,
    graph: bool,
}

/// What one rank measured in one scenario.
#[derive(Default)]
struct RankRun {
    times: Vec<f64>,
    /// Routed experts this rank ran, summed over the MoE layers (warm-up step).
    experts: usize,
    /// (kernel, ms, launches) of a profiled step.
    profile: Vec<(String, f64, usize)>,
}

struct RankReport {
    rank: usize,
    loaded_s: f64,
    mem_gib: f64,
    gpu: String,
    /// The scenarios run, in order, up to the first that failed.
    runs: Vec<RankRun>,
    error: Option<String>,
}

/// Splits `n` sequences over `dp` ranks as evenly as the engine's scheduler would fill them.
fn share(n: usize, dp: usize) -> Vec<usize> {
    (0..dp).map(|d| n / dp + usize::from(d < n % dp)).collect()
}

/// The plan of a decode step of `b` sequences at context `ctx`, spread over the DP ranks, each
/// sequence in its own blocks of its DP rank's cache.
fn decode_plan(par: ParallelConfig, b: usize, ctx: usize, bs: usize, vocab: usize, rng: &mut XRng) -> StepPlan {
    let rows = share(b, par.data_parallel_size);
    let dp_rows = if par.data_parallel_size > 1 { rows.clone() } else { Vec::new() };
    let ranks = rows
        .iter()
        .map(|&n| {
            let input = StepInput { dp_rows: dp_rows.clone(), ..decode_input(n, ctx, bs, vocab, rng) };
            RankBatch { input, device: greedy_rows(n), ..RankBatch::default() }
        })
        .collect();
    StepPlan { ranks, ..StepPlan::default() }
}

/// One `p`-token prompt prefilled on DP rank 0 (the others join its MoE exchanges empty).
fn prefill_plan(par: ParallelConfig, p: usize, bs: usize, vocab: usize, rng: &mut XRng) -> StepPlan {
    let dp = par.data_parallel_size;
    let dp_rows = if dp > 1 { (0..dp).map(|d| if d == 0 { p } else { 0 }).collect() } else { Vec::new() };
    let mut ranks = vec![RankBatch::default(); dp];
    ranks[0] = RankBatch { input: prefill_input(p, bs, vocab, rng), device: greedy_rows(1), ..RankBatch::default() };
    ranks.iter_mut().for_each(|r| r.input.dp_rows = dp_rows.clone());
    StepPlan { ranks, ..StepPlan::default() }
}

/// One scenario on one rank: a warm-up step counting the experts it runs, a second warm-up, the
/// timed steps and a profiled step, each started with the other ranks.
fn run_scenario(
    runner: &mut ModelRunner<CudaBackend>,
    sc: &Scenario,
    barrier: &StepBarrier,
) -> anyhow::Result<RankRun> {
    let mut run = RankRun::default();
    if sc.graph {
        barrier.wait()?;
        runner.capture_graphs(&[sc.batch])?;
    }
    runner.backend().record_expert_stats(sc.decode);
    barrier.wait()?;
    runner.execute(&sc.plan)?;
    run.experts = runner.backend().take_expert_stats().iter().sum();
    runner.backend().record_expert_stats(false);
    barrier.wait()?;
    runner.execute(&sc.plan)?;
    for _ in 0..if sc.decode { TIMED_STEPS } else { 3 } {
        barrier.wait()?;
        let t = Instant::now();
        runner.execute(&sc.plan)?;
        runner.backend().sync()?;
        run.times.push(t.elapsed().as_secs_f64());
    }
    barrier.wait()?;
    runner.backend().gpu().profile_start();
    runner.execute(&sc.plan)?;
    run.profile = runner.backend().gpu().profile_stop()?;
    if sc.graph {
        anyhow::ensure!(runner.graph_replays() > 0, "{}: the steps did not replay the captured graph", sc.label);
        runner.drop_graphs();
    }
    Ok(run)
}

/// One rank's whole benchmark on its own thread: load, fill the cache, then every scenario until
/// one fails (its peers are then released, and its communicators aborted).
fn rank_main(
    runner: cleave_engine::Result<ModelRunner<CudaBackend>>,
    t0: Instant,
    scenarios: &[Scenario],
    barrier: &StepBarrier,
    seed: u64,
) -> anyhow::Result<RankReport> {
    let mut runner = runner?;
    let rank = runner.coord().rank();
    let (be, cache) = runner.backend_and_cache();
    be.fill_kv_random(cache, seed + rank as u64)?;
    be.sync()?;
    let loaded_s = t0.elapsed().as_secs_f64();
    let (free, total) = be.gpu().mem_info()?;
    let (mem_gib, gpu) = ((total - free) as f64 / (1u64 << 30) as f64, be.gpu().name.clone());
    let mut rep = RankReport { rank, loaded_s, mem_gib, gpu, runs: Vec::new(), error: None };
    for sc in scenarios {
        match run_scenario(&mut runner, sc, barrier) {
            Ok(run) => rep.runs.push(run),
            Err(e) => {
                let why = format!("rank {rank}, {}: {e:#}", sc.label);
                barrier.fail(why.clone());
                runner.abandon(&why);
                rep.error = Some(why);
                break;
            }
        }
    }
    Ok(rep)
}

/// `--bench-model DIR` with `--tensor-parallel-size`/`--data-parallel-size` above one.
pub fn run(
    dir: &Path,
    load_format: LoadFormat,
    par: ParallelConfig,
    batches: &[usize],
    ctx: usize,
    prefill: usize,
    seed: u64,
) -> anyhow::Result<()> {
    let c = ModelConfig::from_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    par.validate(&c)?;
    let world = par.world();
    let gpus = cleave_kernels::probe().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(gpus >= world, "a group of {world} ranks needs {world} GPUs, {gpus} visible");
    let bs = 64;
    let per_seq = ctx.div_ceil(bs) + 1;
    let max_b = batches.iter().copied().max().unwrap_or(1);
    let per_dp = share(max_b, par.data_parallel_size)[0];
    let num_blocks = (per_dp * per_seq).max(prefill.div_ceil(bs) + 1);
    let cfg = EngineConfig {
        block_size: bs,
        num_blocks,
        max_model_len: Some((ctx + 16).max(prefill + 16)),
        max_num_seqs: max_b,
        load_format,
        ..EngineConfig::default()
    };
    let mut rng = XRng::new(seed);
    // Decode steps eagerly, then replayed from a graph where the group captures them (no DP).
    let graphs = par.graphs_capture_steps();
    let mut scenarios = Vec::new();
    for &b in batches {
        let plan = decode_plan(par, b, ctx, bs, c.vocab_size, &mut rng);
        for graph in [false, true].into_iter().filter(|&g| !g || graphs) {
            let label = format!("decode {b}{}", if graph { " graph" } else { "" });
            scenarios.push(Scenario { label, plan: plan.clone(), batch: b, decode: true, graph });
        }
    }
    if prefill > 0 {
        let plan = prefill_plan(par, prefill, bs, c.vocab_size, &mut rng);
        let label = format!("prefill {prefill}");
        scenarios.push(Scenario { label, plan, batch: prefill, decode: false, graph: false });
    }
    println!(
        "\ngroup bench: {} on GPUs 0..{world}: tensor_parallel_size {} data_parallel_size {} enable_expert_parallel {}; \
         {num_blocks} KV blocks of {bs} per rank, context {ctx}",
        dir.display(),
        par.tensor_parallel_size,
        par.data_parallel_size,
        par.enable_expert_parallel
    );
    let make = nccl_runners(par, (0..world).collect(), dir, cfg, Precision::Bf16, 0.9)?;
    let (scenarios, barrier) = (Arc::new(scenarios), Arc::new(StepBarrier::new(world)));
    let (tx, rx) = channel();
    let t0 = Instant::now();
    let threads: Vec<_> = (0..world)
        .map(|r| {
            let (make, scenarios, barrier, tx) = (make.clone(), scenarios.clone(), barrier.clone(), tx.clone());
            std::thread::spawn(move || {
                let coord: RankCoord = par.coord(r);
                let got = rank_main(make(coord), t0, &scenarios, &barrier, seed);
                if let Err(e) = &got {
                    barrier.fail(format!("rank {r}: {e:#}"));
                }
                let _ = tx.send((r, got));
            })
        })
        .collect();
    drop(tx);
    let mut reports: Vec<RankReport> = Vec::new();
    let mut errors = Vec::new();
    for (r, got) in rx {
        match got {
            Ok(rep) => reports.push(rep),
            Err(e) => errors.push(format!("rank {r}: {e:#}")),
        }
    }
    threads.into_iter().for_each(|t| drop(t.join()));
    if !errors.is_empty() {
        bail!("group bench failed: {}", errors.join("; "));
    }
    reports.sort_by_key(|r| r.rank);
    report(&c, par, &scenarios, &reports, ctx);
    let failed: Vec<&str> = reports.iter().filter_map(|r| r.error.as_deref()).collect();
    if !failed.is_empty() {
        bail!("group bench stopped: {}", failed.join("; "));
    }
    Ok(())
}

fn report(c: &ModelConfig, par: ParallelConfig, scenarios: &[Scenario], reports: &[RankReport], ctx: usize) {
    let world = par.world() as f64;
    for r in reports {
        println!("  rank {} ({}): ready in {:.1} s, {:.1} GiB in use", r.rank, r.gpu, r.loaded_s, r.mem_gib);
    }
    let hbm = hbm_ceiling(&reports[0].gpu);
    let k = counts(c);
    let moe_layers = (0..c.num_hidden_layers).filter(|&i| c.is_moe_layer(i)).count().max(1);
    println!(
        "{:>16} {:>10} {:>10} {:>10} {:>9} {:>16} {:>16} {:>10}",
        "step", "ms", "tok/s", "experts/L", "GB/step", "of group HBM", "of group TC", "coll. ms"
    );
    let done = reports.iter().map(|r| r.runs.len()).min().unwrap_or(0);
    for (i, sc) in scenarios.iter().enumerate().take(done) {
        // Per step, the slowest rank.
        let n = reports.iter().map(|r| r.runs[i].times.len()).min().unwrap_or(0);
        let steps: Vec<f64> = (0..n).map(|s| reports.iter().map(|r| r.runs[i].times[s]).fold(0.0, f64::max)).collect();
        let step = median(steps);
        // A replayed step counts no experts (the count is host code): the eager step of the same
        // batch routed the same tokens.
        let eager = |s: &Scenario| s.decode && !s.graph && s.batch == sc.batch;
        let at = if sc.graph { scenarios.iter().position(eager).unwrap_or(i) } else { i };
        let experts: usize = if par.enable_expert_parallel {
            reports.iter().map(|r| r.runs[at].experts).sum()
        } else {
            reports[0].runs[at].experts
        };
        // The collectives: NCCL's calls and the peer all-reduce kernel.
        let collective = |name: &str| name.starts_with("nccl") || name.starts_with("peer_all_reduce");
        let coll: Vec<f64> =
            reports.iter().map(|r| r.runs[i].profile.iter().filter(|p| collective(&p.0)).map(|p| p.1).sum()).collect();
        let kernels: f64 = reports[0].runs[i].profile.iter().map(|p| p.1).sum();
        // Inside a graph the collectives are nodes of one replay: not timed apart.
        let coll_list: Vec<String> =
            if sc.graph { vec!["in graph".into()] } else { coll.iter().map(|t| format!("{t:.2}")).collect() };
        if sc.decode {
            let bytes = k.decode_bytes(c, sc.batch, ctx, experts, true);
            println!(
                "{:>16} {:>10.3} {:>10.0} {:>10.1} {:>9.2} {:>15.1}% {:>16} {:>10}",
                sc.label,
                step * 1e3,
                sc.batch as f64 / step,
                experts as f64 / moe_layers as f64,
                bytes / 1e9,
                100.0 * bytes / step / (world * hbm),
                "-",
                coll_list.join("/")
            );
        } else {
            let (linear, attn) = k.prefill_flops(c, sc.batch);
            println!(
                "{:>16} {:>10.3} {:>10.0} {:>10} {:>9} {:>16} {:>15.1}% {:>10}",
                sc.label,
                step * 1e3,
                sc.batch as f64 / step,
                "-",
                "-",
                "-",
                100.0 * (linear + attn) / step / (world * TC_FLOPS),
                coll_list.join("/")
            );
        }
        let top: Vec<String> =
            reports[0].runs[i].profile.iter().take(8).map(|(n, t, c)| format!("{n} {t:.2}ms/{c}")).collect();
        println!(
            "{:>16} rank 0 profiled: kernels {kernels:.2} ms, collectives {:.1}% of them: {}",
            "",
            100.0 * coll[0] / kernels.max(1e-9),
            top.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_spread_over_dp_ranks_evenly() {
        assert_eq!(share(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(share(1, 4), vec![1, 0, 0, 0]);
        assert_eq!(share(256, 1), vec![256]);
    }

    #[test]
    fn the_step_barrier_releases_all_or_reports_a_failed_peer() {
        let b = Arc::new(StepBarrier::new(2));
        let peer = {
            let b = b.clone();
            std::thread::spawn(move || (0..3).try_for_each(|_| b.wait()))
        };
        (0..3).try_for_each(|_| b.wait()).unwrap();
        peer.join().unwrap().unwrap();
        let waiter = {
            let b = b.clone();
            std::thread::spawn(move || b.wait())
        };
        b.fail("rank 1 ran out of memory".into());
        let e = waiter.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("rank 1 ran out of memory"), "{e}");
        assert!(b.wait().is_err(), "a failed barrier stays failed");
    }
}
