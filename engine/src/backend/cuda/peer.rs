//! The one-shot peer all-reduce of a group's communicator line (kernels' `peer` module) as the
//! ranks' threads set it up: each publishes its GPU and its region on the line's board, every
//! rank decides from the same facts whether all pairs of GPUs can read each other (so that all
//! take the same path), enables peer access and connects; at teardown each waits for the others
//! before freeing its region, which their kernels may still read.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cleave_kernels::peer::{PeerAllReduce, PEER_MAX_RANKS};
use cleave_kernels::Gpu;

use super::kerr;
use crate::error::{EngineError, Result};

/// Default bytes up to which an all-reduce takes the peer kernel (`CLEAVE_ALLREDUCE`). On four
/// H100s (run 110, 61 V3 layers, TP4+EP, graphs) the step at batch 1 went 14.74 -> 13.85 ms and
/// at 64 rows of V3's hidden state (1.8 MB, two-shot) 31.76 -> 31.49 ms, while 256 rows (7.3 MB)
/// went 83.03 -> 84.03 ms: NCCL keeps those.
pub const DEFAULT_PEER_BYTES: usize = 4 << 20;
/// Bytes up to which the peer kernel runs one-shot (every rank reads every peer's whole buffer);
/// above, on more than two ranks, two-shot (a chunk each, then gathered), which reads
/// 2 (R - 1) / R of the bytes over the links instead of R - 1 times them, for one more wait.
/// One-shot measured even with NCCL at 1.8 MB on four ranks (run 109).
pub const ONE_SHOT_MAX_BYTES: usize = 512 << 10;
/// How long a rank waits for its peers at teardown before freeing its region anyway.
const TEARDOWN_WAIT: Duration = Duration::from_secs(5);

/// `CLEAVE_ALLREDUCE=nccl|peer[:BYTES]`: all-reduces up to BYTES (default [`DEFAULT_PEER_BYTES`])
/// on the peer kernel where every GPU pair of the line can read each other, the rest on NCCL.
pub fn peer_bytes_from_env() -> Result<usize> {
    let v = std::env::var("CLEAVE_ALLREDUCE").unwrap_or_default();
    parse_peer_bytes(&v)
}

fn parse_peer_bytes(v: &str) -> Result<usize> {
    let bad = || EngineError::Config(format!("CLEAVE_ALLREDUCE: `{v}` is not nccl, peer or peer:BYTES (16 or more)"));
    match v {
        "" | "peer" => Ok(DEFAULT_PEER_BYTES),
        "nccl" => Ok(0),
        _ => match v.strip_prefix("peer:").map(str::parse::<usize>) {
            Some(Ok(b)) if b >= 16 => Ok(b),
            _ => Err(bad()),
        },
    }
}

/// The meeting point of one communicator line's ranks (made once, before the rank threads).
pub struct PeerBoard {
    n: usize,
    state: Mutex<BoardState>,
    cv: Condvar,
}

struct BoardState {
    /// Each rank's GPU ordinal and region.
    slots: Vec<Option<(usize, u64)>>,
    /// Why a rank could not publish (its peers stop waiting).
    failed: Option<String>,
    /// Ranks that reached teardown.
    leaving: usize,
}

impl PeerBoard {
    pub fn new(n: usize) -> Arc<Self> {
        let state = BoardState { slots: vec![None; n], failed: None, leaving: 0 };
        Arc::new(PeerBoard { n, state: Mutex::new(state), cv: Condvar::new() })
    }

    /// Rank `me` cannot publish: the ranks waiting in [`PeerBoard::publish`] fail at once.
    fn fail(&self, me: usize, why: &str) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.failed.get_or_insert_with(|| format!("rank {me}: {why}"));
        self.cv.notify_all();
    }

    /// Publishes rank `me`'s slot and returns everyone's, waiting until `deadline`.
    fn publish(&self, me: usize, slot: (usize, u64), deadline: Instant) -> Result<Vec<(usize, u64)>> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.slots[me] = Some(slot);
        self.cv.notify_all();
        loop {
            if let Some(why) = &g.failed {
                return Err(EngineError::Backend(format!("the peer all-reduce's setup failed on {why}")));
            }
            if g.slots.iter().all(Option::is_some) {
                return Ok(g.slots.iter().map(|s| s.expect("checked")).collect());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(EngineError::Timeout(format!("rank {me}: the peer all-reduce's ranks did not all arrive")));
            }
            g = self.cv.wait_timeout(g, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Waits (at most [`TEARDOWN_WAIT`]) until every rank reached teardown.
    fn leave(&self) {
        let end = Instant::now() + TEARDOWN_WAIT;
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.leaving += 1;
        self.cv.notify_all();
        while g.leaving < self.n {
            let now = Instant::now();
            if now >= end {
                tracing::warn!("freeing a peer all-reduce region before every rank left");
                return;
            }
            g = self.cv.wait_timeout(g, end - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// One rank's peer all-reduce on a line, freed only after the line's ranks all reached teardown.
pub struct PeerLine {
    reduce: PeerAllReduce,
    board: Arc<PeerBoard>,
}

impl PeerLine {
    /// Joins the line of `board` as rank `me` on `gpu`, for sums of up to `bytes`. `None` where
    /// some pair of the line's GPUs cannot read each other's memory (all ranks decide alike).
    pub fn join(gpu: &Gpu, board: &Arc<PeerBoard>, me: usize, bytes: usize, deadline: Instant) -> Result<Option<Self>> {
        if board.n > PEER_MAX_RANKS {
            return Ok(None);
        }
        let region = match PeerAllReduce::region(gpu, (bytes / 16).max(1) * 4) {
            Ok(r) => r,
            Err(e) => {
                board.fail(me, &e.to_string());
                return Err(kerr(e));
            }
        };
        let slots = board.publish(me, (gpu.ctx.ordinal(), region.ptr()), deadline)?;
        let gpus: Vec<usize> = slots.iter().map(|s| s.0).collect();
        for &a in &gpus {
            for &b in &gpus {
                if a != b && !Gpu::can_access(a, b).map_err(kerr)? {
                    // Every rank returns here (same facts), so no region is ever mapped by a peer.
                    tracing::info!(?gpus, "no peer access between GPUs {a} and {b}: all-reduces stay on NCCL");
                    return Ok(None);
                }
            }
        }
        for &g in &gpus {
            gpu.enable_peer_access(g).map_err(kerr)?;
        }
        let bases: Vec<u64> = slots.iter().map(|s| s.1).collect();
        // SAFETY: `bases` are the ranks' regions, each made by `PeerAllReduce::region` for the
        // same size and exchanged through the board above.
        let reduce = unsafe { PeerAllReduce::connect(gpu, region, &bases, me) }.map_err(kerr)?;
        Ok(Some(PeerLine { reduce, board: board.clone() }))
    }

    /// The kernel and whether it runs two-shot, for a sum of `count` f32 values it takes.
    pub fn takes(&self, count: usize) -> Option<(&PeerAllReduce, bool)> {
        let r = &self.reduce;
        (count > 0 && count <= r.max_f32() && count.is_multiple_of(4))
            .then_some((r, self.board.n > 2 && count * 4 > ONE_SHOT_MAX_BYTES))
    }

    /// Whether an earlier call's wait for a peer timed out (synchronizes the stream).
    pub fn timed_out(&self, gpu: &Gpu) -> Result<bool> {
        self.reduce.timed_out(gpu).map_err(kerr)
    }
}

impl Drop for PeerLine {
    fn drop(&mut self) {
        self.board.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allreduce_setting_parses() {
        assert_eq!(parse_peer_bytes("").unwrap(), DEFAULT_PEER_BYTES);
        assert_eq!(parse_peer_bytes("peer").unwrap(), DEFAULT_PEER_BYTES);
        assert_eq!(parse_peer_bytes("nccl").unwrap(), 0);
        assert_eq!(parse_peer_bytes("peer:65536").unwrap(), 65536);
        for bad in ["ring", "peer:", "peer:8", "peer:x"] {
            let e = parse_peer_bytes(bad).unwrap_err().to_string();
            assert!(e.contains("CLEAVE_ALLREDUCE") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn a_board_hands_every_rank_all_slots_and_waits_at_teardown() {
        let board = PeerBoard::new(3);
        let deadline = Instant::now() + Duration::from_secs(10);
        let seen: Vec<Vec<(usize, u64)>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let b = board.clone();
                    s.spawn(move || {
                        let all = b.publish(r, (r, 100 + r as u64), deadline).unwrap();
                        b.leave();
                        all
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for all in seen {
            assert_eq!(all, vec![(0, 100), (1, 101), (2, 102)]);
        }
        let lonely = PeerBoard::new(2);
        let e = lonely.publish(0, (0, 1), Instant::now() + Duration::from_millis(20)).unwrap_err();
        assert!(e.to_string().contains("did not all arrive"), "{e}");
        // A rank that cannot publish releases the others at once, not at the deadline.
        let broken = PeerBoard::new(2);
        let t0 = Instant::now();
        let e = std::thread::scope(|s| {
            let b = broken.clone();
            let waiter = s.spawn(move || b.publish(0, (0, 1), Instant::now() + Duration::from_secs(60)));
            std::thread::sleep(Duration::from_millis(20));
            broken.fail(1, "out of memory");
            waiter.join().unwrap().unwrap_err()
        });
        assert!(e.to_string().contains("rank 1: out of memory"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
}
