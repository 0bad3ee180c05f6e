//! NCCL transfer of one prompt's latent KV at the full DeepSeek-V3 shape (61 layers x 576 values
//! x 2 bytes per token) from GPU 0 to GPU 1: each rank on its own thread with its own CUDA
//! backend and communicator, the blocks sent straight from cache to cache in one group call, to
//! differently numbered blocks; checked byte for byte and timed against one contiguous send of
//! the same size (the raw NCCL bandwidth).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use cleave_engine::backend::cuda::transfer::{KvHub, KvLink};
use cleave_engine::backend::cuda::CudaBackend;
use cleave_engine::backend::{Backend, KvLayout};
use cleave_engine::kv_port::KvPort;
use cleave_kernels::nccl::{NcclComm, NcclId, P2p};

const LAYERS: usize = 61;
const WIDTH: usize = 576;
const BS: usize = 64;
const REPS: usize = 10;

struct RankOut {
    init_s: f64,
    raw: Vec<f64>,
    blocks: Vec<f64>,
    /// The same transfer between runs of consecutive blocks on both sides (one send).
    runs: Vec<f64>,
    checksum: u64,
    /// Through the KvLink protocol: (request, checksum of its blocks on this side) per delivered
    /// transfer, the timed sends, and the outcome of the deliberately abandoned one.
    link: Vec<(u64, u64)>,
    link_times: Vec<f64>,
    link_timeout: String,
    /// Rank 0 alone on a fresh id: the init must give up at its deadline.
    lone_init: String,
}

fn checksum(v: &[u16]) -> u64 {
    v.iter().fold(0xcbf29ce484222325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100000001b3))
}

fn rank(r: usize, id: NcclId, nb: usize, barrier: Arc<Barrier>, seed: u64) -> Result<RankOut> {
    let be = CudaBackend::new(r)?;
    let t = Instant::now();
    let mut comm = NcclComm::init(be.gpu(), id, r, 2, Instant::now() + Duration::from_secs(60))?;
    let init_s = t.elapsed().as_secs_f64();
    let layout = KvLayout { layers: LAYERS, num_blocks: 2 * nb + 8, block_size: BS, width: WIDTH };
    let mut cache = be.alloc_kv_cache(layout)?;
    // The sender's blocks are every other block; the receiver's a reversed run elsewhere.
    let src: Vec<u32> = (0..nb as u32).map(|i| 2 * i).collect();
    let dst: Vec<u32> = (0..nb as u32).rev().map(|i| i + 5).collect();
    if r == 0 {
        be.fill_kv_random(&mut cache, seed)?;
    }
    let bytes = nb * layout.block_values() * 2;
    let raw = be.gpu().alloc::<u8>(bytes)?;
    let raw_p = cleave_kernels::ptr(&raw);
    be.sync()?;
    let timeout = Duration::from_secs(30);
    let mut time = |f: &mut dyn FnMut(&mut NcclComm) -> Result<()>| -> Result<Vec<f64>> {
        let mut ts = Vec::new();
        for i in 0..REPS + 2 {
            barrier.wait();
            let t = Instant::now();
            f(&mut comm)?;
            comm.wait(be.gpu(), timeout)?;
            if i >= 2 {
                ts.push(t.elapsed().as_secs_f64());
            }
        }
        Ok(ts)
    };
    let raw_t = time(&mut |c: &mut NcclComm| {
        let p = [P2p { ptr: raw_p, bytes, peer: 1 - r }];
        let (sends, recvs): (&[P2p], &[P2p]) = if r == 0 { (&p, &[]) } else { (&[], &p) };
        // SAFETY: `raw` (at raw_p) holds `bytes` on this GPU and outlives the transfer, which
        // `time` waits for before the next one.
        unsafe { c.transfer(be.gpu(), sends, recvs) }.map_err(|e| anyhow!("{e}"))
    })?;
    let blocks_t = time(&mut |c: &mut NcclComm| {
        if r == 0 { be.kv_send(c, &cache, &src, &dst, 1) } else { be.kv_recv(c, &mut cache, &dst, &src, 0) }
            .map_err(|e| anyhow!("{e}"))
    })?;
    let mine = if r == 0 { &src } else { &dst };
    let checksum = checksum(&be.kv_raw(&cache, mine)?);
    let (run_src, run_dst): (Vec<u32>, Vec<u32>) = ((0..nb as u32).collect(), (nb as u32..2 * nb as u32).collect());
    let runs_t = time(&mut |c: &mut NcclComm| {
        if r == 0 {
            be.kv_send(c, &cache, &run_src, &run_dst, 1)
        } else {
            be.kv_recv(c, &mut cache, &run_dst, &run_src, 0)
        }
        .map_err(|e| anyhow!("{e}"))
    })?;
    if r == 1 {
        let (raw, blk) = (median(raw_t.clone()), median(blocks_t.clone()));
        println!(
            "  [rank 1, as measured] raw {:.3} ms ({:.0} GB/s), cache-to-cache {:.3} ms ({:.0} GB/s), init {init_s:.2} s, checksum {checksum:016x}",
            raw * 1e3,
            bytes as f64 / raw / 1e9,
            blk * 1e3,
            bytes as f64 / blk / 1e9
        );
    } else {
        println!("  [rank 0] init {init_s:.2} s, sent blocks checksum {checksum:016x}");
    }
    drop(comm);
    let (link, link_times, link_timeout) = link_test(r, &be, &mut cache, nb, seed, &barrier)?;
    let mut lone_init = String::new();
    if r == 0 {
        let t = Instant::now();
        let lone = NcclComm::init(be.gpu(), NcclComm::unique_id()?, 0, 2, t + Duration::from_millis(300));
        lone_init = match lone {
            Err(e) => format!("gave up after {:.0} ms as expected ({e})", t.elapsed().as_secs_f64() * 1e3),
            Ok(_) => "NOT given up: a communicator of 2 came up with 1 rank".into(),
        };
    }
    Ok(RankOut {
        init_s,
        raw: raw_t,
        blocks: blocks_t,
        runs: runs_t,
        checksum,
        link,
        link_times,
        link_timeout,
        lone_init,
    })
}

/// The engine's transfer protocol ([`KvLink`]): transfers of several sizes, timed full-prompt
/// transfers, one abandoned by the receiver (the sender must time out) and one after it (the
/// pair must recover with a new communicator).
#[allow(clippy::type_complexity)]
fn link_test(
    r: usize,
    be: &CudaBackend,
    cache: &mut cleave_engine::backend::cuda::CudaKvCache,
    nb: usize,
    seed: u64,
    barrier: &Barrier,
) -> Result<(Vec<(u64, u64)>, Vec<f64>, String)> {
    static HUB: std::sync::OnceLock<KvHub> = std::sync::OnceLock::new();
    let hub = HUB.get_or_init(KvHub::default).clone();
    let mut link = KvLink::new(hub, r);
    if r == 0 {
        be.fill_kv_random(cache, seed ^ 0x55)?;
    }
    be.sync()?;
    barrier.wait();
    // (request, blocks): distinct block ids on each side.
    let plan: Vec<(u64, usize)> =
        vec![(1, nb), (2, 3), (3, 17), (10, nb), (11, nb), (12, nb), (13, nb), (14, nb), (99, 2), (100, 5)];
    // The timed ones (10..15) move consecutive blocks to consecutive blocks, as a fresh allocator
    // hands them out; the others scatter on both sides.
    let timed = |req: u64| (10..15).contains(&req);
    let src_of = move |n: usize, req: u64| -> Vec<u32> {
        match timed(req) {
            true => (0..n as u32).collect(),
            false => (0..n as u32).map(|i| (i * 2 + req as u32) % (2 * nb as u32)).collect(),
        }
    };
    let dst_of = move |n: usize, req: u64| -> Vec<u32> {
        match timed(req) {
            true => (nb as u32..(nb + n) as u32).collect(),
            false => (0..n as u32).rev().map(|i| i + 5 + (req as u32 % 3)).collect(),
        }
    };
    let (mut done, mut times, mut timeout) = (Vec::new(), Vec::new(), String::new());
    for &(req, n) in &plan {
        // Both sides start each transfer together, so that a timed send measures the protocol and
        // the copy, not the other side's checksum of the previous transfer.
        barrier.wait();
        if r == 0 {
            let long = req != 99;
            let deadline = Instant::now() + if long { Duration::from_secs(20) } else { Duration::from_millis(300) };
            let t = Instant::now();
            let res = link.send(be, cache, &src_of(n, req), &dst_of(n, req), 1, req, deadline);
            let dt = t.elapsed().as_secs_f64();
            match (req, res) {
                (99, Err(e)) => timeout = format!("timed out as expected after {:.0} ms ({e})", dt * 1e3),
                (99, Ok(_)) => timeout = "NOT timed out: the abandoned transfer completed".into(),
                (_, Err(e)) => return Err(anyhow!("link send {req}: {e}")),
                (_, Ok(_)) => {
                    if timed(req) {
                        times.push(dt);
                    }
                    done.push((req, checksum(&be.kv_raw(cache, &src_of(n, req))?)));
                }
            }
        } else {
            if req == 99 {
                continue; // abandoned: never polled
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            let blocks = dst_of(n, req);
            loop {
                match link.poll_recv(be, cache, &blocks, 0, req, deadline) {
                    Ok(Some(_)) => break,
                    Ok(None) => std::thread::sleep(Duration::from_micros(20)),
                    Err(e) => return Err(anyhow!("link recv {req}: {e}")),
                }
            }
            done.push((req, checksum(&be.kv_raw(cache, &blocks)?)));
        }
    }
    Ok((done, times, timeout))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(tokens: usize, seed: u64) -> Result<()> {
    let nb = tokens.div_ceil(BS);
    let bytes = nb * BS * LAYERS * WIDTH * 2;
    let id = NcclComm::unique_id()?;
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|r| {
            let b = barrier.clone();
            std::thread::spawn(move || rank(r, id, nb, b, seed))
        })
        .collect();
    // Join both ranks before reporting either's error, so that every measurement printed so far
    // stays meaningful and both failures are visible.
    let joined: Vec<Result<RankOut>> =
        handles.into_iter().map(|h| h.join().map_err(|_| anyhow!("a rank thread panicked")).and_then(|r| r)).collect();
    for (r, j) in joined.iter().enumerate() {
        if let Err(e) = j {
            println!("  rank {r} failed: {e:#}");
        }
    }
    let outs: Vec<RankOut> = joined.into_iter().collect::<Result<_>>()?;
    let (s, d) = (&outs[0], &outs[1]);
    let raw = median(d.raw.clone());
    let blk = median(d.blocks.clone());
    let runs = median(d.runs.clone());
    println!("\nNCCL KV transfer GPU0 -> GPU1: {tokens} tokens = {nb} blocks of {BS} x {LAYERS} layers x {WIDTH} x bf16 = {:.1} MB", bytes as f64 / 1e6);
    println!("  communicator init: {:.2} s / {:.2} s (rank 0 / 1)", s.init_s, d.init_s);
    println!(
        "  raw NCCL, one {:.1} MB send:        {:.3} ms  {:.0} GB/s (median of {REPS})",
        bytes as f64 / 1e6,
        raw * 1e3,
        bytes as f64 / raw / 1e9
    );
    println!(
        "  KV blocks, cache to cache, scattered ({nb} sends): {:.3} ms  {:.0} GB/s  = {:.0}% of raw",
        blk * 1e3,
        bytes as f64 / blk / 1e9,
        100.0 * raw / blk
    );
    println!(
        "  KV blocks, cache to cache, consecutive (1 send): {:.3} ms  {:.0} GB/s  = {:.0}% of raw",
        runs * 1e3,
        bytes as f64 / runs / 1e9,
        100.0 * raw / runs
    );
    let ok = s.checksum == d.checksum;
    println!("  received blocks equal the sent ones: {}", if ok { "yes" } else { "NO" });
    anyhow::ensure!(ok, "NCCL transfer corrupted the KV blocks");
    let lt = median(s.link_times.clone());
    let link_ok = s.link.len() == d.link.len() && s.link.iter().zip(&d.link).all(|(a, b)| a == b);
    println!(
        "  engine KvLink protocol (announce, transfer stream, deadline): {} transfers delivered {}; {nb} consecutive blocks {:.3} ms median ({:.0} GB/s)",
        d.link.len(),
        if link_ok { "intact" } else { "CORRUPTED" },
        lt * 1e3,
        bytes as f64 / lt / 1e9
    );
    println!("  abandoned transfer: {}; the next transfer re-created the communicator and arrived", s.link_timeout);
    anyhow::ensure!(link_ok && s.link_timeout.starts_with("timed out"), "KvLink protocol check failed");
    println!("  communicator init whose peer never joins: {}", s.lone_init);
    anyhow::ensure!(s.lone_init.starts_with("gave up"), "NCCL init without its peer did not time out");
    Ok(())
}
