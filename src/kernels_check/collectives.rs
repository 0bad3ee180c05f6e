//! The engine's collectives on two GPUs (four where the machine has them) against raw NCCL, at
//! decode and prefill sizes of the
//! DeepSeek-V3 hidden state (7168 f32 per token): the engine's all-reduce (TP's sum) and row
//! gather (DP+EP's token exchange, a group of sends and receives, since ranks hold different row
//! counts) beside `ncclAllReduce`, `ncclAllGather` and `ncclReduceScatter` on the same buffers.
//! Each rank runs on its own thread with its own backend and communicators; the results are
//! checked (sums and gathered rows) before anything is timed, and the sum again after. The
//! engine's all-reduce takes the peer kernel up to `CLEAVE_ALLREDUCE`'s bytes (4 MB by default:
//! up to the 64-row case here; one-shot on two ranks, two-shot above 512 KB on four), NCCL
//! above (`CLEAVE_ALLREDUCE=peer:8388608` takes the 256-row case too). Single calls are timed with a synchronization each
//! (latency as a host waits for it); "x50" rows time 50 calls queued back to back, as a step's
//! all-reduces run, per call.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Result};
use cleave_engine::backend::cuda::collectives::{GroupIds, NcclCollectives};
use cleave_engine::backend::cuda::CudaBackend;
use cleave_engine::backend::Backend;
use cleave_engine::parallel::{Axis, Collectives, RankCoord};
use cleave_engine::ParallelConfig;
use cleave_kernels::nccl::{NcclComm, NcclId};

const HIDDEN: usize = 7168;
const ROWS: [usize; 4] = [1, 64, 256, 4096];
const REPS: usize = 20;

/// Median milliseconds per (operation, rows), as rank 0 measured them.
type Times = Vec<(&'static str, usize, f64)>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rank(r: usize, ranks: usize, ids: GroupIds, raw_id: NcclId, barrier: Arc<Barrier>) -> Result<Times> {
    let be = CudaBackend::new(r)?;
    let par = ParallelConfig { tensor_parallel_size: ranks, ..ParallelConfig::default() };
    let engine = NcclCollectives::join(&be, &ids, RankCoord { par, tp: r, dp: 0 })?;
    let mut raw = NcclComm::init(be.gpu(), raw_id, r, ranks, Instant::now() + Duration::from_secs(60))?;
    // Every rank's value i is (i % 97) / 2 + rank: the sums are exact in any order.
    let sum_of = |i: usize| ((i % 97) as f32) * 0.5 * ranks as f32 + (ranks * (ranks - 1) / 2) as f32;
    let mut times = Times::new();
    for rows in ROWS {
        let n = rows * HIDDEN;
        let mine: Vec<f32> = (0..n).map(|i| ((i % 97) as f32) * 0.5 + r as f32).collect();
        let mut x = be.upload(&mine, rows, HIDDEN)?;
        // Correctness first: the sum of every rank's values, and every rank's rows in order.
        let counts = vec![rows; ranks];
        engine.all_reduce(&be, Axis::Tp, &mut x)?;
        engine.settle(&be)?;
        let sum = be.download(&x)?;
        ensure!(sum.iter().enumerate().all(|(i, &v)| v == sum_of(i)), "all-reduce sums differ");
        let x = be.upload(&mine, rows, HIDDEN)?;
        let gathered = be.download(&engine.all_gather_rows(&be, Axis::Tp, &x, &counts)?)?;
        ensure!(
            gathered.iter().enumerate().all(|(i, &v)| v == ((i % n % 97) as f32) * 0.5 + (i / n) as f32),
            "gathered rows differ"
        );
        let out = be.upload(&vec![0.0; ranks * n], ranks * rows, HIDDEN)?;
        let mut time_n = |what: &'static str, calls: usize, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
            let mut ts = Vec::with_capacity(REPS);
            for i in 0..REPS + 3 {
                barrier.wait();
                let t = Instant::now();
                for _ in 0..calls {
                    f()?;
                }
                be.sync()?;
                if i >= 3 {
                    ts.push(t.elapsed().as_secs_f64() * 1e3 / calls as f64);
                }
            }
            times.push((what, rows, median(ts)));
            Ok(())
        };
        let mut y = be.upload(&mine, rows, HIDDEN)?;
        time_n("engine all-reduce", 1, &mut || Ok(engine.all_reduce(&be, Axis::Tp, &mut y)?))?;
        // A step ends with one settle (polling the communicators, with a deadline) after all of
        // its collectives: its cost per step, here after a single all-reduce.
        time_n("engine all-reduce+settle", 1, &mut || {
            engine.all_reduce(&be, Axis::Tp, &mut y)?;
            Ok(engine.settle(&be)?)
        })?;
        let p = y.ptr_mut();
        // SAFETY: `p` addresses y's `n` f32 values on this rank's GPU; y outlives the
        // synchronization that ends each timed call.
        time_n("raw ncclAllReduce", 1, &mut || Ok(unsafe { raw.all_reduce_sum_f32(be.gpu(), p, n) }?))?;
        if rows <= 256 {
            // Sums of sums (y's values grow to infinity over these calls; only time is taken).
            time_n("engine all-reduce x50", 50, &mut || Ok(engine.all_reduce(&be, Axis::Tp, &mut y)?))?;
            // SAFETY: `p` addresses y's `n` f32 values on this rank's GPU, and y outlives the
            // synchronization after the 50 calls.
            time_n("raw ncclAllReduce x50", 50, &mut || Ok(unsafe { raw.all_reduce_sum_f32(be.gpu(), p, n) }?))?;
        }
        time_n("engine row gather", 1, &mut || Ok(engine.all_gather_rows(&be, Axis::Tp, &x, &counts).map(drop)?))?;
        // SAFETY: x holds `n` f32 values and `out` 2n (both ranks' parts) on this rank's GPU, alive
        // past the synchronization that ends each timed call.
        time_n("raw ncclAllGather", 1, &mut || Ok(unsafe { raw.all_gather_f32(be.gpu(), x.ptr(), out.ptr(), n) }?))?;
        let part = n / ranks;
        // SAFETY: x holds the `n` = ranks * part f32 values summed and `out` receives this rank's
        // part; both live past the synchronization that ends each timed call.
        time_n("raw ncclReduceScatter", 1, &mut || {
            Ok(unsafe { raw.reduce_scatter_sum_f32(be.gpu(), x.ptr(), out.ptr(), part) }?)
        })?;
        raw.wait(be.gpu(), Duration::from_secs(30))?;
        // The sum again, after the calls above left the peer kernel's buffers in use.
        let mut x = be.upload(&mine, rows, HIDDEN)?;
        engine.all_reduce(&be, Axis::Tp, &mut x)?;
        engine.settle(&be)?;
        ensure!(
            be.download(&x)?.iter().enumerate().all(|(i, &v)| v == sum_of(i)),
            "all-reduce sums differ after the timed calls"
        );
    }
    Ok(times)
}

/// Runs the ranks (four GPUs where there are four, else two) and prints the table.
pub fn run() -> Result<()> {
    let ranks = if cleave_kernels::probe().map_err(|e| anyhow!(e))? >= 4 { 4 } else { 2 };
    let par = ParallelConfig { tensor_parallel_size: ranks, ..ParallelConfig::default() };
    let ids = GroupIds::new(par)?;
    let raw_id = NcclComm::unique_id()?;
    let barrier = Arc::new(Barrier::new(ranks));
    let handles: Vec<_> = (0..ranks)
        .map(|r| {
            let (ids, b) = (ids.clone(), barrier.clone());
            std::thread::spawn(move || rank(r, ranks, ids, raw_id, b))
        })
        .collect();
    let joined: Vec<Result<Times>> =
        handles.into_iter().map(|h| h.join().map_err(|_| anyhow!("a rank thread panicked")).and_then(|r| r)).collect();
    let mut outs = Vec::new();
    for (r, j) in joined.into_iter().enumerate() {
        outs.push(j.map_err(|e| anyhow!("rank {r}: {e:#}"))?);
    }
    println!(
        "\ncollectives on {ranks} GPUs, rows x {HIDDEN} f32 per rank (median of {REPS}, rank 0; results checked first)"
    );
    println!("{:<26} {:>6} {:>10} {:>10} {:>10}", "operation", "rows", "MB/rank", "ms", "GB/s");
    for &(what, rows, ms) in &outs[0] {
        let mb = (rows * HIDDEN * 4) as f64 / 1e6;
        // Bytes per rank over the call's time: its n values for all-reduce and the gathers, its
        // part of them for reduce-scatter (a rate for comparing rows, not link bandwidth).
        let moved = if what.contains("ReduceScatter") { mb / ranks as f64 } else { mb };
        println!("{what:<26} {rows:>6} {mb:>10.2} {ms:>10.3} {:>10.1}", moved / ms);
    }
    Ok(())
}
